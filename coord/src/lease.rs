//! Node liveness leases as an observer judges them: each node renews a record of its own in
//! the metadata store (`zr_meta::nodes`); one left unchanged for [`LEASE`], by the observer's
//! clock, belongs to a node that is gone or cut off from the store.

use std::time::{Duration, Instant};

/// A record's revision in the metadata store: it changes with every write.
pub type Revision = u64;

/// A lease not renewed for this long has lapsed.
pub const LEASE: Duration = Duration::from_secs(3);

/// How long a node serves clients' reads by itself after it last read, in the replica
/// record, that it is in sync (`zr_meta::nodes::ReadLease`). A router that sees a replica leave the
/// in-sync set acknowledges no write for [`READ_LEASE_WAIT`] from then, counting on the
/// node refusing them by then.
pub const READ_LEASE: Duration = Duration::from_secs(2);
/// [`READ_LEASE`] and a margin for clocks that run at slightly different rates.
pub const READ_LEASE_WAIT: Duration = Duration::from_millis(2_250);

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
