//! A catch-up's decisions apart from its I/O (`server/rebuild.rs` drives them): whether a
//! behind replica's dataset is first rebuilt from its partner's files, how that rebuild is
//! judged from the replica's reports, and where the last pass — the one that holds writes
//! off — may begin. Pure: the caller passes the time and the nodes' marks.

use std::time::Duration;

use std::time::Instant;
use zr_proto::wire::{DataMark, ShipStatus};

use crate::replicas::NodeId;

/// Fewest records a partner holds for a behind replica to be rebuilt from its files (fewer
/// are copied record by record at once).
pub const SHIP_RECORDS_MIN: u64 = 1024;

/// Whether a replica holding `len` records of a dataset of which its partner holds
/// `partner_len` is rebuilt from the partner's files: it lacks more than half of them (a
/// wiped, new or replacement disk), and they are enough for a copy of files to pay. A
/// replica that missed a few writes is caught up by comparing digests alone.
pub fn from_files(len: u64, partner_len: u64) -> bool {
    partner_len >= SHIP_RECORDS_MIN && len < partner_len / 2
}

/// A rebuild from files as the router follows it, report by report.
#[derive(Debug)]
pub struct ShipWatch {
    /// Bytes received at the last report that showed progress, and when it came.
    received: u64,
    since: Instant,
    /// Longest a rebuild may go without receiving a byte.
    stall: Duration,
}

/// What a report of a rebuild from files means for the router.
#[derive(Debug, PartialEq, Eq)]
pub enum ShipStep {
    /// Still copying: ask again.
    Wait,
    /// Installed: the replica holds the partner's snapshot, `len` records.
    Installed { len: u64 },
    /// Given up, why: the replica is caught up record by record instead.
    Failed(String),
}

impl ShipWatch {
    pub fn new(now: Instant, stall: Duration) -> ShipWatch {
        ShipWatch {
            received: 0,
            since: now,
            stall,
        }
    }

    /// The step `status`, reported at `now`, calls for.
    pub fn observe(&mut self, status: &ShipStatus, now: Instant) -> ShipStep {
        if status.done {
            return match &status.error {
                Some(error) => ShipStep::Failed(error.clone()),
                None => ShipStep::Installed { len: status.len },
            };
        }
        if status.bytes > self.received {
            self.received = status.bytes;
            self.since = now;
        } else if now.saturating_duration_since(self.since) > self.stall {
            return ShipStep::Failed(format!(
                "its rebuild from files received nothing for {} s (stuck at {} of {} bytes)",
                self.stall.as_secs(),
                status.bytes,
                status.total
            ));
        }
        ShipStep::Wait
    }

    /// Bytes received as of the last report.
    #[cfg(test)]
    fn received(&self) -> u64 {
        self.received
    }
}

/// What a rebuild from files installed on the replica: the partner copied from, its mark
/// when it took the snapshot (records below `len` were then the same in both), `len`.
#[derive(Clone, Copy, Debug)]
pub struct Shipped {
    pub partner: NodeId,
    pub mark: DataMark,
    pub len: u64,
}

/// Where the online pass over a dataset begins: past what a rebuild from files installed if
/// the partner is the one copied from and its mark has not changed since its snapshot (no
/// record below the snapshot's length changed there), else from the start.
pub fn online_from(shipped: Option<&Shipped>, partner: NodeId, partner_mark: DataMark) -> u64 {
    match shipped {
        Some(s) if s.partner == partner && s.mark == partner_mark => s.len,
        _ => 0,
    }
}

/// What an online pass over a dataset left: the partner it compared against and both
/// nodes' marks taken before it began, and where it ended (records `0..end` of the replica
/// were made the partner's).
#[derive(Clone, Copy, Debug)]
pub struct Resume {
    pub partner: NodeId,
    pub partner_mark: DataMark,
    pub node_mark: DataMark,
    pub end: u64,
}

/// Where the last pass over a dataset begins, given what the online pass left and the marks
/// read now (writes held off): where the online pass ended if neither node changed a record
/// it covered since it began — the same partner, the partner's mark unchanged (same process,
/// same open, no modify, field write or delete), the replica the same process and open (its
/// own changes are the catch-up's) — else from the start, comparing everything.
pub fn last_pass_from(
    resume: Option<&Resume>,
    partner: NodeId,
    partner_mark: DataMark,
    node_mark: DataMark,
) -> u64 {
    match resume {
        Some(r)
            if r.partner == partner
                && r.partner_mark == partner_mark
                && (r.node_mark.incarnation, r.node_mark.instance)
                    == (node_mark.incarnation, node_mark.instance) =>
        {
            r.end
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(bytes: u64, done: bool, error: Option<&str>) -> ShipStatus {
        ShipStatus {
            done,
            bytes,
            total: 100,
            len: 7,
            error: error.map(str::to_string),
            mark: None,
        }
    }

    #[test]
    fn only_a_replica_lacking_most_of_a_sizable_dataset_copies_files() {
        assert!(from_files(0, 1_024));
        assert!(from_files(511, 1_024));
        assert!(!from_files(512, 1_024), "half is caught up by digests");
        assert!(!from_files(0, 1_023), "too few records for files to pay");
        assert!(
            !from_files(5_000, 4_000),
            "more than the partner: digests cut it"
        );
    }

    #[test]
    fn progress_keeps_a_rebuild_going_and_silence_ends_it() {
        let start = Instant::now();
        let stall = Duration::from_secs(60);
        let mut watch = ShipWatch::new(start, stall);
        assert_eq!(
            watch.observe(&status(0, false, None), start),
            ShipStep::Wait
        );
        // Slow but moving: never given up.
        for k in 1..10u64 {
            let at = start + Duration::from_secs(50 * k);
            assert_eq!(watch.observe(&status(k, false, None), at), ShipStep::Wait);
        }
        assert_eq!(watch.received(), 9);
        // Nothing for longer than the bound.
        let late = start + Duration::from_secs(50 * 9 + 61);
        assert!(matches!(
            watch.observe(&status(9, false, None), late),
            ShipStep::Failed(why) if why.contains("received nothing for 60 s")
        ));
    }

    #[test]
    fn the_last_pass_resumes_only_where_nothing_changed_since_the_online_one() {
        let mark = |incarnation, instance, rewrites| DataMark {
            incarnation,
            instance,
            rewrites,
        };
        let resume = Resume {
            partner: 3,
            partner_mark: mark(1, 2, 10),
            node_mark: mark(5, 6, 0),
            end: 900,
        };
        let from = |partner, theirs, ours| last_pass_from(Some(&resume), partner, theirs, ours);
        // Unchanged; the replica's own count grew with the catch-up's writes.
        assert_eq!(from(3, mark(1, 2, 10), mark(5, 6, 40)), 900);
        // The partner changed a record, restarted, reopened the dataset, or is another one.
        assert_eq!(from(3, mark(1, 2, 11), mark(5, 6, 0)), 0);
        assert_eq!(from(3, mark(9, 2, 10), mark(5, 6, 0)), 0);
        assert_eq!(from(3, mark(1, 7, 10), mark(5, 6, 0)), 0);
        assert_eq!(from(4, mark(1, 2, 10), mark(5, 6, 0)), 0);
        // The replica restarted or reopened the dataset.
        assert_eq!(from(3, mark(1, 2, 10), mark(8, 6, 0)), 0);
        assert_eq!(from(3, mark(1, 2, 10), mark(5, 9, 0)), 0);
        // No online pass: everything.
        assert_eq!(last_pass_from(None, 3, mark(1, 2, 10), mark(5, 6, 0)), 0);
    }

    #[test]
    fn the_online_pass_skips_what_was_copied_only_while_the_partner_is_unchanged() {
        let mark = DataMark {
            incarnation: 1,
            instance: 2,
            rewrites: 3,
        };
        let shipped = Shipped {
            partner: 4,
            mark,
            len: 5_000,
        };
        assert_eq!(online_from(Some(&shipped), 4, mark), 5_000);
        let changed = DataMark {
            rewrites: 4,
            ..mark
        };
        assert_eq!(online_from(Some(&shipped), 4, changed), 0);
        assert_eq!(online_from(Some(&shipped), 5, mark), 0, "another partner");
        assert_eq!(online_from(None, 4, mark), 0, "nothing copied");
    }

    #[test]
    fn a_finished_rebuild_is_installed_or_failed_as_reported() {
        let now = Instant::now();
        let mut watch = ShipWatch::new(now, Duration::from_secs(1));
        assert_eq!(
            watch.observe(&status(100, true, None), now),
            ShipStep::Installed { len: 7 }
        );
        assert_eq!(
            watch.observe(
                &status(3, true, Some("refused")),
                now + Duration::from_secs(9)
            ),
            ShipStep::Failed("refused".into())
        );
    }
}
