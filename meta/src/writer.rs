//! The cluster's writer lease and the record of a write in progress, kept under
//! [`WRITER_KEY`]: whoever changes the cluster (append, modify, delete, commit, repair) holds
//! it, so that writes through several routers are serialized as one router's own writes are
//! by its lock. A write spans several shards (a swap-remove moves the last record across
//! them), so no shard alone can keep two of them apart, and no shard is special.
//!
//! **Taking it.** A router reads the record and, if nobody holds it, writes itself in as
//! holder with a compare-and-swap on the revision it read. Every write of the record by its
//! holder renews the lease: the holder counts it as running for `lease_ms` from just before
//! it asked for the write. Any other router counts from when it first saw that revision, which
//! is later; a record left unchanged for `lease_ms` by the observer's own clock has lapsed,
//! and the observer may take it over — with a compare-and-swap on that same revision, so two
//! observers cannot both. Only the clocks' rates matter, never their readings.
//!
//! **Tokens.** The revision at which a router took the lease is its token: the store's
//! revisions only grow, across restarts and processes. The holder fences every node with it
//! and stamps it on every write, so a node refuses the late writes of a holder whose lease
//! lapsed and passed on (see `zr_shard::fence`).
//!
//! **The pending write.** An append or a delete is recorded in the record before it starts,
//! in place of the one before it (which is done). If its router stops halfway, whoever takes
//! the lease next learns it with the lease and settles it before writing — cuts off the part
//! of an append that landed, finishes a delete — so a write is never left in part. A holder
//! that gives the lease back with its writes done clears it.
//!
//! This module is the coordination's state machine, without I/O: [`LeaseState`] is told what
//! the store answered and when, and [`Acquire`] takes it for a write, step by step. The
//! router drives them.

pub use zr_coord::writer::{Acquire, Do, Held, LeaseState, PendingWrite, Step, WriterRecord};

use crate::{Error, MetaStore, Revision};

/// The key of the writer record.
pub const WRITER_KEY: &str = "writer";

/// The key of dataset `dataset`'s writer record (`None`: the default dataset's,
/// [`WRITER_KEY`], as it was before datasets had names).
pub fn key(dataset: Option<&str>) -> String {
    match dataset {
        None => WRITER_KEY.to_string(),
        Some(name) => format!("{WRITER_KEY}/{name}"),
    }
}

/// The writer record at `key` (see [`key`]) and its revision, or `None` if the store holds
/// none yet.
pub async fn load(
    store: &dyn MetaStore,
    key: &str,
) -> Result<Option<(WriterRecord, Revision)>, Error> {
    crate::load_json(store, key, "the writer record").await
}

/// Writes `record` at `key` if it is still at `expected` (`None`: if there is none).
pub async fn store(
    store: &dyn MetaStore,
    key: &str,
    expected: Option<Revision>,
    record: &WriterRecord,
) -> Result<Revision, Error> {
    crate::store_json(store, key, expected, record, "the writer record").await
}
