//! What the node is: its length and fields, its cluster identity, its fence, and a
//! digest of its records.

use super::*;

/// `NodeRequest::Info`.
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

/// `NodeRequest::Identity`.
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

/// `NodeRequest::Fence`.
pub(crate) fn fence(ctx: &Ctx<'_>, token: u64) -> Outcome {
    let Ctx { coordination, .. } = *ctx;
    coordination
        .fence
        .raise(token, || info(ctx))
        .map_err(Refusal::FenceStorage)?
}

/// `NodeRequest::Digest`.
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
