//! Node liveness leases: each node renews a record of its own (`node/K`, or `node/K/J` for a
//! shard's replica J > 0) every
//! [`RENEW_EVERY`]; one left unchanged for [`LEASE`] — by the observer's clock, as for the
//! writer lease — belongs to a node that is gone or cut off from the store. Routers read it
//! beside their own heartbeats (`zr cluster status` shows both), and take a lapsed lease as
//! a node down at once when its heartbeats fail too.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, MetaStore, Revision};

/// How often a node renews its lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);
pub use zr_coord::lease::{LeaseView, LeaseWatch, LEASE};

/// The key of the lease of shard `shard`'s replica `replica`.
pub fn key(shard: u32, replica: u32) -> String {
    if replica == 0 {
        format!("node/{shard}")
    } else {
        format!("node/{shard}/{replica}")
    }
}

/// A node's liveness lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLease {
    /// The address it serves on.
    pub addr: String,
    /// Its process.
    pub pid: u32,
    /// Renewals since the process started: each write changes the record.
    pub renewals: u64,
}

/// The lease of shard `shard`'s replica `replica` and its revision, if one was ever written.
pub async fn load(
    store: &dyn MetaStore,
    shard: u32,
    replica: u32,
) -> Result<Option<(NodeLease, Revision)>, Error> {
    let what = format!("the lease of shard {shard} replica {replica}'s node");
    crate::load_json(store, &key(shard, replica), &what).await
}

pub use zr_coord::lease::{READ_LEASE, READ_LEASE_WAIT};

/// Whether a node may serve a client's read by itself: only while it knows it is in sync.
/// A replica marked behind has missed writes, and a router that sees it marked (or moved
/// away) waits [`READ_LEASE_WAIT`] from then before acknowledging any write; the node serves clients only
/// within [`READ_LEASE`] of starting a read of the replica record that found it in sync, so
/// no client reads a missed write's old value after the write was acknowledged. Routers'
/// reads do not need it: they know which replicas are behind.
#[derive(Debug)]
pub struct ReadLease {
    /// A shard's only replica is never behind: it always serves.
    always: bool,
    until: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// Reads of the record asked before this grant nothing (see [`START_HOLD`]).
    hold_until: tokio::time::Instant,
}

/// How long after its start a node with partners serves no client by itself: a node that
/// restarted may have lost writes not yet made durable, and a router marks it behind when it
/// first reconnects (within a heartbeat or two); the hold gives that mark time to land in
/// the replica record before the node reads it.
pub const START_HOLD: Duration = Duration::from_secs(3);

impl ReadLease {
    /// The lease of a replica among `replicas` of its shard: held from the first read of the
    /// replica record that finds it in sync, unless it is the only one.
    pub fn new(replicas: u32) -> ReadLease {
        ReadLease {
            always: replicas <= 1,
            until: std::sync::Mutex::new(None),
            hold_until: tokio::time::Instant::now() + START_HOLD,
        }
    }

    /// A lease always held: for a node with no partner.
    pub fn always() -> ReadLease {
        ReadLease::new(1)
    }

    /// Whether clients' reads may be served now.
    pub fn held(&self) -> bool {
        self.always
            || self
                .until
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|until| tokio::time::Instant::now() < until)
    }

    /// A read of the replica record started at `asked` found the node in sync (`true`) or
    /// behind.
    pub fn read(&self, asked: tokio::time::Instant, in_sync: bool) {
        let mut until = self.until.lock().unwrap_or_else(|e| e.into_inner());
        *until = (in_sync && asked >= self.hold_until).then_some(asked + READ_LEASE);
    }
}

/// Renews the lease of shard `shard`'s replica `replica` for the node serving on `addr` every
/// [`RENEW_EVERY`], until
/// the future is dropped. A renewal that fails is logged (once per run of failures) and
/// tried again; the lease lapses meanwhile, which is what it is for. Each renewal also reads
/// the replica record into `reads` (see [`ReadLease`]).
pub async fn keep_alive(
    store: Arc<dyn MetaStore>,
    shard: u32,
    replica: u32,
    addr: String,
    reads: Arc<ReadLease>,
) {
    let key = key(shard, replica);
    let mut lease = NodeLease {
        addr,
        pid: std::process::id(),
        renewals: 0,
    };
    let mut failing = false;
    loop {
        let renewed = async {
            let expected = store.get(&key).await?.map(|(_, revision)| revision);
            crate::store_json(&*store, &key, expected, &lease, "the node lease").await
        };
        match renewed.await {
            Ok(_) => {
                if failing {
                    tracing::info!("shard {shard}: liveness lease renewed again");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("shard {shard}: cannot renew the liveness lease: {e}");
                }
                failing = true;
            }
        }
        lease.renewals += 1;
        if !reads.always {
            let asked = tokio::time::Instant::now();
            match crate::replicas::load(&*store).await {
                Ok((record, _)) => reads.read(asked, record.in_sync((shard, replica))),
                Err(e) => tracing::debug!("shard {shard}: cannot read the replica record: {e}"),
            }
        }
        tokio::time::sleep(RENEW_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_read_lease_is_held_only_within_its_term_of_a_read_finding_the_node_in_sync() {
        let lease = ReadLease::new(2);
        assert!(!lease.held(), "not before the record was read");
        lease.read(tokio::time::Instant::now(), true);
        assert!(!lease.held(), "not from a read asked right after the start");
        tokio::time::advance(START_HOLD).await;
        let asked = tokio::time::Instant::now();
        lease.read(asked, true);
        assert!(lease.held());
        tokio::time::advance(READ_LEASE - Duration::from_millis(1)).await;
        assert!(lease.held());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!lease.held(), "counted from when the read was asked");
        lease.read(tokio::time::Instant::now(), true);
        assert!(lease.held());
        lease.read(tokio::time::Instant::now(), false);
        assert!(!lease.held(), "marked behind: given up at once");
        assert!(READ_LEASE_WAIT > READ_LEASE);
        assert!(ReadLease::always().held(), "a shard's only replica");
        assert!(ReadLease::new(1).held());
    }
}
