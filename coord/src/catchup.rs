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

/// What one slice of a catch-up by records does to a replica holding `len` records of a
/// shard whose partner holds `partner_len`, for records `from..from + count`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePlan {
    /// Where the slice ends (the next begins there): the partner's end at the latest.
    pub end: u64,
    /// Records both hold: their digests are compared, and those that differ copied.
    pub compare: std::ops::Range<u64>,
    /// Records the replica lacks: read from the partner and appended in one request.
    pub append: std::ops::Range<u64>,
    /// The replica holds records past the partner's end (it missed a delete): cut to this.
    pub truncate_to: Option<u64>,
}

/// Plans the slice `from..from + count` (see [`SlicePlan`]). A replica holding fewer
/// records than `from`, which the slices before caught up, changed under the catch-up:
/// refused, naming its length.
pub fn plan_slice(from: u64, count: u64, len: u64, partner_len: u64) -> Result<SlicePlan, String> {
    let end = from.saturating_add(count).min(partner_len);
    let common = len.min(end);
    let compare = from..common.max(from);
    let append = if len < end {
        if from > len {
            return Err(format!(
                "it holds {len} records, fewer than the {from} already caught up"
            ));
        }
        len..end
    } else {
        end..end
    };
    let len_after = len.max(append.end);
    let truncate_to = (end == partner_len && len_after > partner_len).then_some(partner_len);
    Ok(SlicePlan {
        end,
        compare,
        append,
        truncate_to,
    })
}

/// The records of `range` whose copies differ, from the partner's CRCs and the replica's
/// (one a record, in order); `Err` with the first record the partner's copy of fails its
/// check (`corrupt`, ascending), which cannot be copied from.
pub fn differing(
    range: std::ops::Range<u64>,
    theirs: &[u32],
    corrupt: &[u64],
    ours: &[u32],
) -> Result<Vec<u64>, u64> {
    if let Some(&bad) = corrupt.first() {
        return Err(bad);
    }
    Ok(range
        .zip(theirs.iter().zip(ours))
        .filter(|(_, (a, b))| a != b)
        .map(|(index, _)| index)
        .collect())
}

/// A catch-up's progress, for `zr cluster status`.
#[derive(Clone, Debug)]
pub struct Progress {
    /// The partner copied from (its replica number).
    pub partner: u32,
    /// The pass running (the last holds writes off).
    pub pass: u32,
    pub last_pass: bool,
    /// Records compared (or copied) in this pass, of `total`.
    pub done: u64,
    pub total: u64,
    /// Records copied so far, over all passes, and their bytes.
    pub copied: u64,
    pub bytes: u64,
    pub started: Instant,
    /// Copying the partner's files, `bytes` of `files_total` so far (before the passes).
    pub files_total: Option<u64>,
}

impl Progress {
    /// A catch-up begun at `started`, nothing done yet.
    pub fn new(started: Instant) -> Progress {
        Progress {
            partner: 0,
            pass: 0,
            last_pass: false,
            done: 0,
            total: 0,
            copied: 0,
            bytes: 0,
            started,
            files_total: None,
        }
    }

    /// At `now`, e.g. "catching up from replica 0, pass 1: 40960 of 100000 records (41%), 12000
    /// records copied (11.7 MiB, 52.1 MiB/s), about 2 s left".
    pub fn describe(&self, now: Instant) -> String {
        let elapsed = now
            .saturating_duration_since(self.started)
            .as_secs_f64()
            .max(1e-3);
        let rate = self.bytes as f64 / elapsed;
        let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        if let Some(total) = self.files_total {
            return format!(
                "copying replica {}'s files: {:.1} of {:.1} MiB ({:.1} MiB/s)",
                self.partner,
                mib(self.bytes),
                mib(total),
                rate / (1 << 20) as f64
            );
        }
        let percent = if self.total == 0 {
            100.0
        } else {
            100.0 * self.done as f64 / self.total as f64
        };
        let pass = if self.last_pass {
            format!("last pass {} (writes wait)", self.pass)
        } else {
            format!("pass {}", self.pass)
        };
        let left = if self.done > 0 && self.done < self.total {
            let per_record = elapsed / self.done as f64;
            format!(
                ", about {:.0} s left in this pass",
                per_record * (self.total - self.done) as f64
            )
        } else {
            String::new()
        };
        format!(
            "catching up from replica {}, {pass}: {} of {} records ({percent:.0}%), {} records copied ({:.1} MiB, {:.1} MiB/s){left}",
            self.partner,
            self.done,
            self.total,
            self.copied,
            self.bytes as f64 / (1 << 20) as f64,
            rate / (1 << 20) as f64,
        )
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

    /// A slice of 100 from record 200 over each case a replica can be in.
    #[test]
    fn a_slice_compares_what_both_hold_appends_what_it_lacks_and_cuts_what_the_partner_dropped() {
        let plan = |len, partner_len| plan_slice(200, 100, len, partner_len);
        // Holds it all: compared only.
        assert_eq!(
            plan(1000, 1000).unwrap(),
            SlicePlan {
                end: 300,
                compare: 200..300,
                append: 300..300,
                truncate_to: None,
            }
        );
        // Holds part: compared up to its end, the rest appended.
        assert_eq!(
            plan(250, 1000).unwrap(),
            SlicePlan {
                end: 300,
                compare: 200..250,
                append: 250..300,
                truncate_to: None,
            }
        );
        // Holds exactly the slices before: appended only.
        let at_start = plan(200, 1000).unwrap();
        assert_eq!((at_start.compare, at_start.append), (200..200, 200..300));
        // The partner ends inside the slice, and the replica holds more: cut to the partner.
        assert_eq!(
            plan(400, 260).unwrap(),
            SlicePlan {
                end: 260,
                compare: 200..260,
                append: 260..260,
                truncate_to: Some(260),
            }
        );
        // The partner ends inside the slice and the replica short of it: appended, not cut.
        assert_eq!(plan(230, 260).unwrap().truncate_to, None);
        // Fewer records than the slices before caught up: refused.
        let e = plan(150, 1000).unwrap_err();
        assert!(e.contains("holds 150 records, fewer than the 200"), "{e}");
        // A slice past the partner's end (the catch-up is done) does nothing.
        let past = plan_slice(500, 100, 500, 500).unwrap();
        assert_eq!(
            (
                past.compare.is_empty(),
                past.append.is_empty(),
                past.truncate_to
            ),
            (true, true, None)
        );
    }

    #[test]
    fn differing_copies_are_found_and_a_corrupt_partner_refused() {
        assert_eq!(
            differing(10..14, &[1, 2, 3, 4], &[], &[1, 9, 3, 8]),
            Ok(vec![11, 13])
        );
        assert_eq!(
            differing(10..14, &[1, 2, 3, 4], &[12, 13], &[1, 2, 3, 4]),
            Err(12)
        );
    }

    #[test]
    fn a_catch_up_reads_as_its_files_its_pass_and_what_is_left() {
        let t0 = Instant::now();
        let mut progress = Progress::new(t0);
        progress.partner = 1;
        progress.files_total = Some(4 << 20);
        progress.bytes = 1 << 20;
        let at = |seconds| t0 + Duration::from_secs(seconds);
        let files = progress.describe(at(2));
        assert_eq!(
            files,
            "copying replica 1's files: 1.0 of 4.0 MiB (0.5 MiB/s)"
        );
        progress.files_total = None;
        progress.pass = 1;
        progress.total = 1000;
        progress.done = 250;
        progress.copied = 100;
        assert_eq!(
            progress.describe(at(2)),
            "catching up from replica 1, pass 1: 250 of 1000 records (25%), 100 records copied (1.0 MiB, 0.5 MiB/s), about 6 s left in this pass"
        );
        progress.last_pass = true;
        progress.pass = 3;
        progress.done = 1000;
        let done = progress.describe(at(4));
        assert!(
            done.starts_with("catching up from replica 1, last pass 3 (writes wait): 1000 of 1000 records (100%)")
                && !done.contains("left"),
            "{done}"
        );
        // A clock read before the start counts no time, and divides by none.
        assert!(progress
            .describe(t0 - Duration::from_millis(1))
            .contains("MiB/s"));
    }
}
