//! A dataset's files shipped node to node: snapshots opened, read and closed for a partner,
//! and a rebuild from a partner started.

use super::*;
use zr_proto::wire::ShipPiece;

/// Opens a snapshot of the dataset (of `slots` only, if any) for a partner to copy; refused
/// while a move builds slots here.
pub(crate) fn ship_open(ctx: &Ctx<'_>, slots: Vec<u32>) -> Outcome {
    let Ctx {
        store,
        coordination,
        ..
    } = *ctx;
    // Slots being built are not served: not copied from here either.
    let building = coordination.identity.staged();
    let refused = match &building {
        Some(_) if slots.is_empty() => true,
        Some(staged) => slots.iter().any(|s| staged.slots.contains(s)),
        None => false,
    };
    if refused {
        return Err(Refusal::Store(Error::InvalidRecord(
            "a shard move is building slots on this node: copy from it once the move is done"
                .into(),
        )));
    }
    let reply = ctx
        .node()?
        .ships
        .open(store, &slots, coordination.incarnation)?;
    Ok((reply, Vec::new()))
}

/// A piece of a snapshot's file, with its CRC32.
pub(crate) fn ship_read(ctx: &Ctx<'_>, ship: u64, file: u32, offset: u64, len: u32) -> Outcome {
    let (reply, bytes) = ctx.node()?.ships.read(ship, file, offset, len)?;
    Ok((reply, vec![bytes]))
}

/// Several pieces of a snapshot's files at once, each with its CRC32.
pub(crate) fn ship_read_many(ctx: &Ctx<'_>, ship: u64, pieces: Vec<ShipPiece>) -> Outcome {
    let (reply, bytes) = ctx.node()?.ships.read_many(ship, &pieces)?;
    Ok((reply, bytes))
}

/// Closes a snapshot: its files may go.
pub(crate) fn ship_close(ctx: &Ctx<'_>, ship: u64) -> Outcome {
    ctx.node()?.ships.close(ship);
    Ok((Reply::Done, Vec::new()))
}

/// Starts rebuilding the dataset addressed (or a move's `slots` of it) from a partner's files;
/// answers how the copy stands.
pub(crate) fn ship_from(
    ctx: &Ctx<'_>,
    addr: String,
    replica: u32,
    from_shard: Option<u32>,
    slots: Vec<u32>,
    rate: u64,
) -> Outcome {
    let Ctx {
        coordination,
        dataset,
        ..
    } = *ctx;
    let catalog = ctx.node()?;
    let shard = catalog.get(dataset).ok_or_else(|| {
        Refusal::Store(Error::InvalidRecord(format!(
            "this node holds no dataset '{}'",
            dataset.unwrap_or(crate::catalog::DEFAULT)
        )))
    })?;
    let place = coordination.identity.place().ok_or_else(|| {
        Refusal::Store(Error::InvalidRecord(
            "this node belongs to no cluster yet: nothing to rebuild".into(),
        ))
    })?;
    let partner = wire::Target {
        shard: from_shard.unwrap_or(place.shard),
        replica,
    };
    let dataset = dataset.map(str::to_string);
    let status = catalog
        .ships
        .start(shard, dataset, partner, &addr, slots, rate)?;
    Ok((Reply::Shipping(status), Vec::new()))
}
