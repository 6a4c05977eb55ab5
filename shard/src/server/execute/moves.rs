//! A node's part in a shard move: slots staged beside the served ones, then switched to.

use super::*;

/// Opens slots `slots` of map `version` for building beside the served ones.
pub(crate) fn stage_open(ctx: &Ctx<'_>, version: u64, slots: Vec<u32>) -> Outcome {
    let slots = ctx
        .mover()?
        .open_stage(version, &slots)
        .map_err(Refusal::Store)?;
    Ok((Reply::Staged { slots }, Vec::new()))
}

/// Writes the body's records into the slots being built, as `runs` place them.
pub(crate) fn stage(
    ctx: &Ctx<'_>,
    version: u64,
    runs: Vec<Run>,
    fields: Vec<String>,
    lengths: Vec<Vec<u32>>,
    commit: bool,
) -> Outcome {
    let Ctx { body, .. } = *ctx;
    let received = records_of(&fields, &lengths, body);
    let slots = ctx
        .mover()?
        .stage(version, &runs, &received, commit)
        .map_err(Refusal::Store)?;
    Ok((Reply::Staged { slots }, Vec::new()))
}

/// Serves the slots built for map `version` and drops those given, each slot's length checked;
/// the token checked against the fence.
pub(crate) fn switch(ctx: &Ctx<'_>, version: u64, slots: Vec<(u32, u64)>, token: u64) -> Outcome {
    // Checked, not held: a switch is no write.
    ctx.fenced(Some(token), || Ok((Reply::Done, Vec::new())))?;
    ctx.mover()?
        .switch(version, &slots)
        .map_err(Refusal::Store)?;
    Ok((Reply::Done, Vec::new()))
}
