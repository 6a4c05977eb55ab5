//! Node liveness leases: each node renews a record of its own (`node/K`, or `node/K/J` for a
//! shard's replica J > 0) every
//! [`RENEW_EVERY`]; one left unchanged for [`LEASE`] — by the observer's clock, as for the
//! writer lease — belongs to a node that is gone or cut off from the store. Routers read it
//! beside their own heartbeats (`zr cluster status` shows both), and take a lapsed lease as
//! a node down at once when its heartbeats fail too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{Error, MetaStore, Revision};

/// How often a node renews its lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);
/// A lease not renewed for this long has lapsed.
pub const LEASE: Duration = Duration::from_secs(3);

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

/// Renews the lease of shard `shard`'s replica `replica` for the node serving on `addr` every
/// [`RENEW_EVERY`], until
/// the future is dropped. A renewal that fails is logged (once per run of failures) and
/// tried again; the lease lapses meanwhile, which is what it is for.
pub async fn keep_alive(store: Arc<dyn MetaStore>, shard: u32, replica: u32, addr: String) {
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
        tokio::time::sleep(RENEW_EVERY).await;
    }
}

/// What one observer has seen of a node lease: the revision last read, and since when.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseWatch {
    seen: Option<(Revision, Instant)>,
}

/// A node lease as an observer judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseView {
    /// Not read yet, or no lease recorded.
    Unknown,
    /// Unchanged for at most this long (by the observer's clock).
    Renewed(Duration),
    /// Unchanged for this long, at least [`LEASE`].
    Lapsed(Duration),
}

impl LeaseWatch {
    /// The lease read at `now`: its revision, or `None` if there is none.
    pub fn observe(&mut self, revision: Option<Revision>, now: Instant) {
        match revision {
            None => self.seen = None,
            Some(revision) => {
                if self.seen.is_none_or(|(seen, _)| seen != revision) {
                    self.seen = Some((revision, now));
                }
            }
        }
    }

    /// The lease as of `now`.
    pub fn view(&self, now: Instant) -> LeaseView {
        match self.seen {
            None => LeaseView::Unknown,
            Some((_, since)) => {
                let unchanged = now.saturating_duration_since(since);
                if unchanged >= LEASE {
                    LeaseView::Lapsed(unchanged)
                } else {
                    LeaseView::Renewed(unchanged)
                }
            }
        }
    }
}

impl LeaseView {
    /// In words, for `zr cluster status`.
    pub fn describe(&self) -> String {
        match self {
            LeaseView::Unknown => "no liveness lease seen".into(),
            LeaseView::Renewed(d) => {
                format!("liveness lease renewed within {:.1} s", d.as_secs_f64())
            }
            LeaseView::Lapsed(d) => format!(
                "liveness lease lapsed: unrenewed for {:.1} s",
                d.as_secs_f64()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_lapses_when_left_unchanged_for_a_whole_lease() {
        let mut watch = LeaseWatch::default();
        let t0 = Instant::now();
        assert_eq!(watch.view(t0), LeaseView::Unknown);
        watch.observe(Some(4), t0);
        watch.observe(Some(4), t0 + LEASE / 2);
        assert_eq!(watch.view(t0 + LEASE / 2), LeaseView::Renewed(LEASE / 2));
        // Renewed: counted from when the new revision was first seen.
        watch.observe(Some(9), t0 + LEASE / 2);
        assert_eq!(watch.view(t0 + LEASE), LeaseView::Renewed(LEASE / 2));
        let late = t0 + LEASE / 2 + LEASE;
        watch.observe(Some(9), late);
        assert_eq!(watch.view(late), LeaseView::Lapsed(LEASE));
        assert!(watch.view(late).describe().contains("lapsed"));
        watch.observe(None, late);
        assert_eq!(watch.view(late), LeaseView::Unknown);
    }
}
