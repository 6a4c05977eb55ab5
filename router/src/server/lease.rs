//! The router's side of the cluster's writer lease, kept in the metadata store (the protocol,
//! and its state machine, are `zr_meta::writer`'s): taking it, renewing it, recording each
//! write in it, and giving it back.
//!
//! A router keeps the lease between writes that follow each other closely (a client loading
//! a dataset in appends), so that a write costs one store write (recording it), not three;
//! it gives the lease back once it has written nothing for [`LINGER`], and at once when a
//! write fails (so that whoever takes it next settles that write).

use std::time::Duration;

use zr_meta::writer::{self, Acquire, Do, Held, PendingWrite};

use super::Router;
use crate::error::Failure;

/// The lease lasts this many router timeouts.
pub(super) const LEASE_TIMEOUTS: u32 = 4;
/// A router gives the lease back after writing nothing for this long.
pub(super) const LINGER: Duration = Duration::from_millis(50);

/// The runtime's clock (virtual in a simulated cluster on virtual time), as the lease's
/// state machine reads it.
pub(super) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

fn metadata(e: zr_meta::Error) -> Failure {
    Failure::from(e)
}

impl Router {
    /// The lease this router holds, if it runs at least one more timeout (each call to a
    /// node takes at most that).
    pub(super) fn usable_lease(&self) -> Option<Held> {
        self.state().lease.usable(now(), self.cluster.timeout)
    }

    /// Takes the writer lease, waiting up to the router's timeout while another router holds
    /// it, or keeps the one this router holds (renewed when half run out): the steps are
    /// `zr_meta::writer::Acquire`'s, performed here. Returns the write an earlier holder left
    /// pending, to settle before writing (`None` when the lease was held already: this
    /// router's own writes are done).
    pub(super) async fn acquire_lease(&self) -> Result<Option<PendingWrite>, Failure> {
        let (mut acquire, mut next) =
            Acquire::start(&self.state().lease, self.cluster.timeout, now());
        loop {
            next = match next {
                Do::Write { taken, pending } => {
                    // Taken from whoever held it last, who may have changed which replicas
                    // are in sync, or where one is, meanwhile (a catch-up finished, a
                    // replacement recorded — both under every lease): the writes go by the
                    // record as it is now.
                    if taken && self.nodes().replicas() > 1 {
                        if let Err(e) = self.nodes().refresh_replicas().await {
                            self.release_lease(false).await;
                            return Err(e);
                        }
                    }
                    return Ok(pending);
                }
                Do::Store { expected, record } => {
                    match writer::store(&*self.cluster.meta, &self.writer_key, expected, &record)
                        .await
                    {
                        Ok(revision) => acquire.stored(&mut self.state().lease, Some(revision)),
                        // Another router wrote it first.
                        Err(zr_meta::Error::Conflict { .. }) => {
                            acquire.stored(&mut self.state().lease, None)
                        }
                        Err(e) => return Err(metadata(e)),
                    }
                }
                Do::Read => {
                    let read = writer::load(&*self.cluster.meta, &self.writer_key)
                        .await
                        .map_err(metadata)?;
                    let read = read.as_ref().map(|(r, revision)| (r, *revision));
                    acquire.read(&mut self.state().lease, read, now())
                }
                Do::Pause(pause) => {
                    tokio::time::sleep(pause).await;
                    Do::Read
                }
                Do::Busy { holder, left } => {
                    return Err(Failure::Busy {
                        waited_ms: self.cluster.timeout.as_millis(),
                        reason: format!(
                            "router {holder:016x} holds the write lease (for {} ms more at most)",
                            left.as_millis()
                        ),
                    })
                }
            };
        }
    }

    /// Writes the writer record with this router as holder and `pending`, by compare-and-swap
    /// on `expected` (the revision read or last written; `None`: there is no record yet),
    /// taking or renewing the lease; a conflict means another router wrote it first, and
    /// this one holds no lease.
    async fn write_record(
        &self,
        expected: Option<zr_meta::Revision>,
        pending: Option<PendingWrite>,
    ) -> Result<(), zr_meta::Error> {
        let asked = now();
        let record = self.state().lease.record(pending);
        match writer::store(&*self.cluster.meta, &self.writer_key, expected, &record).await {
            Ok(revision) => {
                self.state().lease.taken(revision, asked, pending);
                Ok(())
            }
            Err(e) => {
                if matches!(e, zr_meta::Error::Conflict { .. }) {
                    self.state().lease.lost();
                }
                Err(e)
            }
        }
    }

    /// Records `write`, about to start, as the pending write in the writer record (`None`:
    /// clears it, once settled). The caller holds the lease.
    pub(super) async fn intend(&self, write: Option<PendingWrite>) -> Result<(), Failure> {
        let Some(held) = self.usable_lease() else {
            return Err(Failure::LeaseLost(
                "the write lease ran out before the write could be recorded".into(),
            ));
        };
        self.write_record(Some(held.revision), write)
            .await
            .map_err(|e| match e {
                zr_meta::Error::Conflict { .. } => Failure::LeaseLost(format!(
                    "the write lease lapsed and another router took it ({e})"
                )),
                e => metadata(e),
            })
    }

    /// Notes that this router's write under the lease is done, for [`Self::release_if_idle`].
    pub(super) fn lease_used(&self) {
        self.state().lease.used(now());
    }

    /// Gives the writer lease back, `settled` if this router's writes are done (which clears
    /// the pending write); if that fails, the lease lapses by itself and the next holder
    /// settles the pending write.
    pub(super) async fn release_lease(&self, settled: bool) {
        let Some((expected, record)) = self.state().lease.released(settled) else {
            return;
        };
        if let Err(e) = writer::store(
            &*self.cluster.meta,
            &self.writer_key,
            Some(expected),
            &record,
        )
        .await
        {
            tracing::warn!("giving back the write lease: {e} (it lapses by itself)");
        }
    }

    /// Gives the lease back if this router holds it and has written nothing for [`LINGER`];
    /// does nothing while a write runs.
    pub(super) async fn release_if_idle(&self) {
        let Ok(_writes) = self.writes.try_lock() else {
            return;
        };
        let idle = self.state().lease.idle(now(), LINGER);
        if idle {
            self.release_lease(true).await;
        }
    }

    /// Gives the lease back once the writes in flight are done: for a router that stops.
    pub async fn give_back_lease(&self) {
        let _writes = self.writes.lock().await;
        self.release_lease(true).await;
    }
}
