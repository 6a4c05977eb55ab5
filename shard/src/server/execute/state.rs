//! What the node is: its length and fields, its cluster identity, its fence, and a
//! digest of its records.

use super::*;

/// The node's length (slots being built aside), its fields and its incarnation.
pub(crate) fn info(ctx: &Ctx<'_>) -> Outcome {
    let fields = ctx.store.fields().iter().map(field_info).collect();
    Ok((
        Reply::Info {
            len: ctx.served_len(),
            fields,
            incarnation: ctx.coordination.incarnation,
        },
        Vec::new(),
    ))
}

/// The cluster and map version the node's data belongs to, and its length.
pub(crate) fn identity(ctx: &Ctx<'_>) -> Outcome {
    let Ctx { coordination, .. } = *ctx;
    Ok((
        Reply::Identity {
            cluster: coordination.identity.cluster(),
            map_version: coordination.identity.map_version(),
            len: ctx.served_len(),
        },
        Vec::new(),
    ))
}

/// Raises the node's fence to `token` (durably, before it answers): writes with a lower token
/// are refused from now on.
pub(crate) fn fence(ctx: &Ctx<'_>, token: u64) -> Outcome {
    let Ctx { coordination, .. } = *ctx;
    coordination
        .fence
        .raise(token, || info(ctx))
        .map_err(Refusal::FenceStorage)?
}

/// Per record of `runs`, a CRC32 of its fields, each read checked, and which failed the check;
/// with the store's mark taken before the reads.
pub(crate) fn digest_of(ctx: &Ctx<'_>, runs: Vec<Run>) -> Outcome {
    let Ctx {
        store,
        coordination,
        ..
    } = *ctx;
    // Before the records are read (see `Store::mark`).
    let of_store = store.mark();
    let mark = wire::DataMark {
        incarnation: coordination.incarnation,
        instance: of_store.instance,
        rewrites: of_store.rewrites,
    };
    let (crcs, corrupt) = digest(store, &runs).map_err(Refusal::Store)?;
    Ok((
        Reply::Digest {
            crcs,
            corrupt,
            mark,
        },
        Vec::new(),
    ))
}
