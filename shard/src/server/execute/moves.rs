//! A node's part in a shard move: slots staged beside the served ones, then switched to.

use super::*;

/// `NodeRequest::StageOpen`.
pub(crate) fn stage_open(ctx: &Ctx<'_>, version: u64, slots: Vec<u32>) -> Outcome {
    let slots = ctx
        .mover()?
        .open_stage(version, &slots)
        .map_err(Refusal::Store)?;
    Ok((Reply::Staged { slots }, Vec::new()))
}

/// `NodeRequest::Stage`.
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

/// `NodeRequest::Switch`.
pub(crate) fn switch(ctx: &Ctx<'_>, version: u64, slots: Vec<(u32, u64)>, token: u64) -> Outcome {
    let Ctx { coordination, .. } = *ctx;
    // Checked, not held: a switch is no write.
    fenced(coordination, Some(token), || Ok((Reply::Done, Vec::new())))?;
    ctx.mover()?
        .switch(version, &slots)
        .map_err(Refusal::Store)?;
    Ok((Reply::Done, Vec::new()))
}
