//! The writer lease and the record of a write in progress, as the metadata store keeps them
//! (`zr_meta::writer` reads and writes them, and says how the lease works), and
//! [`LeaseState`], the lease's state machine without I/O: told what the store answered and
//! when, it says what to do next. The router drives it.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::lease::Revision;

/// A write that changes the cluster's length, recorded before it starts so that the next
/// holder of the lease can tell, from the nodes' lengths alone, how far it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingWrite {
    /// Records `start..start + count` appended: a cluster holding more than `start` but
    /// fewer than `start + count` records holds part of it, which must be cut off.
    Append { start: u64, count: u64 },
    /// A swap-remove: record `len - 1` moves into `index`, then the cluster is cut to
    /// `len - 1` records. Each step can be redone: while the cluster still holds `len`
    /// records it is finished in full.
    Delete { index: u64, len: u64 },
    /// Record `index` replaced on every in-sync replica of its shard: if it stopped halfway
    /// they may differ, so one's copy is written to all.
    Modify { index: u64 },
    /// Records `start..start + count` had one field written on every in-sync replica of
    /// their shards: each record's copy on one replica is written to all.
    WriteField { start: u64, count: u64 },
}

/// The writer record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterRecord {
    /// The router holding the lease (its random name), if any.
    pub holder: Option<u64>,
    /// How long the lease runs after the record's last write.
    pub lease_ms: u64,
    /// A write perhaps left half done (see the module documentation).
    pub pending: Option<PendingWrite>,
}

/// The lease as its holder has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// The revision at which it was taken: the nodes' fence.
    pub token: u64,
    /// The record's revision now (every write of it by the holder moves it).
    pub revision: Revision,
    /// When it runs out here: `lease` after the last write of the record was asked for.
    pub until: Instant,
    /// The write recorded in the record now. While held, it is done unless the write that
    /// recorded it failed (then the lease is given back at once, unsettled).
    pub pending: Option<PendingWrite>,
}

/// What a router that wants the lease does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Write the record with this router as holder, `pending` kept, by compare-and-swap on
    /// `expected`; then report it with [`LeaseState::taken`]. `pending` must be settled
    /// before this router writes.
    Take {
        expected: Option<Revision>,
        pending: Option<PendingWrite>,
    },
    /// `holder` holds it, for at most `left` more (by this router's count): read again later.
    Wait { holder: u64, left: Duration },
}

/// One router's knowledge of the writer lease: whether it holds it, and since when the
/// record it last read has been unchanged.
#[derive(Debug)]
pub struct LeaseState {
    me: u64,
    lease: Duration,
    held: Option<Held>,
    /// The revision last read while another router held the lease, and when it was first
    /// seen.
    seen: Option<(Revision, Instant)>,
    /// When this router's last write under the lease finished.
    used: Option<Instant>,
}

impl LeaseState {
    /// For the router named `me`, whose leases run `lease`.
    pub fn new(me: u64, lease: Duration) -> LeaseState {
        LeaseState {
            me,
            lease,
            held: None,
            seen: None,
            used: None,
        }
    }

    /// This router's name.
    pub fn me(&self) -> u64 {
        self.me
    }

    /// How long a lease runs.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The lease, if this router holds it and it runs at least `margin` more at `now`.
    pub fn usable(&self, now: Instant, margin: Duration) -> Option<Held> {
        self.held
            .filter(|held| held.until.saturating_duration_since(now) >= margin)
    }

    /// The lease, if this router believes it holds it (whether or not it ran out).
    pub fn held(&self) -> Option<Held> {
        self.held
    }

    /// What to do with the record read at `now` (`None`: the store holds none).
    pub fn observe(&mut self, read: Option<(&WriterRecord, Revision)>, now: Instant) -> Step {
        let Some((record, revision)) = read else {
            self.seen = None;
            return Step::Take {
                expected: None,
                pending: None,
            };
        };
        let take = Step::Take {
            expected: Some(revision),
            pending: record.pending,
        };
        let holder = match record.holder {
            // Free, or this router's own (a write of it whose answer was lost).
            None => return take,
            Some(holder) if holder == self.me => return take,
            Some(holder) => holder,
        };
        let lease = Duration::from_millis(record.lease_ms);
        let since = match self.seen {
            Some((seen, since)) if seen == revision => since,
            _ => {
                self.seen = Some((revision, now));
                now
            }
        };
        let unchanged = now.saturating_duration_since(since);
        if unchanged >= lease {
            // Lapsed: its holder stopped renewing it at least a whole lease ago.
            take
        } else {
            Step::Wait {
                holder,
                left: lease - unchanged,
            }
        }
    }

    /// The record this router writes to take the lease (or renew it, or record a write):
    /// itself as holder, with `pending`.
    pub fn record(&self, pending: Option<PendingWrite>) -> WriterRecord {
        WriterRecord {
            holder: Some(self.me),
            lease_ms: self.lease.as_millis() as u64,
            pending,
        }
    }

    /// This router's write of the record asked for at `asked` took (or kept) the lease: the
    /// record is at `revision` now, with `pending`. A write that took it (not held before)
    /// makes `revision` the token.
    pub fn taken(&mut self, revision: Revision, asked: Instant, pending: Option<PendingWrite>) {
        let token = self.held.map_or(revision, |held| held.token);
        self.held = Some(Held {
            token,
            revision,
            until: asked + self.lease,
            pending,
        });
        self.seen = None;
    }

    /// This router's write of the record found another revision than it wrote last: another
    /// router took the lease (this one's had lapsed), or the answer to a write was lost. It
    /// holds no lease any more.
    pub fn lost(&mut self) {
        self.held = None;
    }

    /// True if the holder should renew the lease before a write at `now`: less than half
    /// of it is left.
    pub fn needs_renewal(&self, now: Instant) -> bool {
        self.held
            .is_some_and(|held| held.until.saturating_duration_since(now) < self.lease / 2)
    }

    /// This router's write under the lease finished at `now`.
    pub fn used(&mut self, now: Instant) {
        self.used = Some(now);
    }

    /// True if this router holds the lease but has written nothing under it for `linger`
    /// at `now`: it gives it back, so that other routers need not wait for it to lapse.
    pub fn idle(&self, now: Instant, linger: Duration) -> bool {
        self.held.is_some()
            && self
                .used
                .is_none_or(|used| now.saturating_duration_since(used) >= linger)
    }

    /// The record with which this router gives the lease back: nobody holds it, and the
    /// pending write is kept unless `settled`.
    pub fn released(&mut self, settled: bool) -> Option<(Revision, WriterRecord)> {
        let held = self.held.take()?;
        Some((
            held.revision,
            WriterRecord {
                holder: None,
                lease_ms: 0,
                pending: if settled { None } else { held.pending },
            },
        ))
    }
}

/// The first pause between two reads of a lease another router holds; each next is twice
/// as long, up to [`PAUSE_MOST`].
pub const PAUSE_FIRST: Duration = Duration::from_millis(1);
/// Longest pause between two reads of a lease another router holds.
pub const PAUSE_MOST: Duration = Duration::from_millis(20);

/// What a router taking the lease for a write does next (see [`Acquire`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Do {
    /// The lease is held: write. `taken`: it was just taken from whoever held it last, who
    /// may have changed the replica record meanwhile; `pending`: the write they left, to
    /// settle first.
    Write {
        taken: bool,
        pending: Option<PendingWrite>,
    },
    /// Write `record` by compare-and-swap on `expected` (`None`: there is none yet), then
    /// tell [`Acquire::stored`].
    Store {
        expected: Option<Revision>,
        record: WriterRecord,
    },
    /// Read the record, then tell [`Acquire::read`] what it held when the answer came.
    Read,
    /// Wait this long, then read.
    Pause(Duration),
    /// `holder` holds the lease (for `left` more at most) and did not give it up within
    /// the wait: the write is refused as busy.
    Busy { holder: u64, left: Duration },
}

/// One taking of the lease before a write, as steps: the lease held is kept, or renewed
/// once less than half of it is left; otherwise the record is read, and taken once free or
/// lapsed, read again after pauses of [`PAUSE_FIRST`] doubling to [`PAUSE_MOST`] while
/// another router holds it, for at most the router's timeout. A store's or read's failure
/// other than a conflict ends the taking (the driver returns it): the state is as if the
/// store had not been asked for, and a store that did land is found by the next read.
#[derive(Debug)]
pub struct Acquire {
    deadline: Instant,
    pause: Duration,
    /// The store asked for: when, with which pending write, and whether it renews a lease
    /// held.
    storing: Option<(Instant, Option<PendingWrite>, bool)>,
}

impl Acquire {
    /// Starts taking the lease at `now` for a router whose calls take at most `timeout`:
    /// it holds a lease that runs that long more, or waits that long at most for one.
    pub fn start(state: &LeaseState, timeout: Duration, now: Instant) -> (Acquire, Do) {
        let mut acquire = Acquire {
            deadline: now + timeout,
            pause: PAUSE_FIRST,
            storing: None,
        };
        if state.usable(now, timeout).is_some() && !state.needs_renewal(now) {
            let keep = Do::Write {
                taken: false,
                pending: None,
            };
            return (acquire, keep);
        }
        let first = match state.held() {
            // Renew it; if another router took it meanwhile (this one's lapsed), take it anew.
            Some(held) => acquire.store(state, Some(held.revision), held.pending, true, now),
            None => Do::Read,
        };
        (acquire, first)
    }

    fn store(
        &mut self,
        state: &LeaseState,
        expected: Option<Revision>,
        pending: Option<PendingWrite>,
        renews: bool,
        now: Instant,
    ) -> Do {
        self.storing = Some((now, pending, renews));
        Do::Store {
            expected,
            record: state.record(pending),
        }
    }

    /// The store asked for was done: the record is at `revision` now, or (`None`) another
    /// router wrote it first.
    pub fn stored(&mut self, state: &mut LeaseState, revision: Option<Revision>) -> Do {
        let Some((asked, pending, renews)) = self.storing.take() else {
            // Told of a store not asked for: read what there is.
            return Do::Read;
        };
        let Some(revision) = revision else {
            state.lost();
            return Do::Read;
        };
        state.taken(revision, asked, pending);
        match renews {
            // This router's own writes are done.
            true => Do::Write {
                taken: false,
                pending: None,
            },
            false => Do::Write {
                taken: true,
                pending,
            },
        }
    }

    /// The record read (`None`: the store holds none), as the answer that came at `now`
    /// gave it: a revision another router holds counts from when this router first saw
    /// it, and that is when an answer came, not when it was asked for (the holder may have
    /// renewed in between, counting from later than the asking).
    pub fn read(
        &mut self,
        state: &mut LeaseState,
        read: Option<(&WriterRecord, Revision)>,
        now: Instant,
    ) -> Do {
        match state.observe(read, now) {
            Step::Take { expected, pending } => self.store(state, expected, pending, false, now),
            Step::Wait { holder, left } => {
                if now + self.pause > self.deadline {
                    return Do::Busy { holder, left };
                }
                let pause = self.pause;
                self.pause = (pause * 2).min(PAUSE_MOST);
                Do::Pause(pause)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(40);
    const A7: PendingWrite = PendingWrite::Append {
        start: 40,
        count: 7,
    };

    fn held_by(holder: u64, pending: Option<PendingWrite>) -> WriterRecord {
        WriterRecord {
            holder: Some(holder),
            lease_ms: LEASE.as_millis() as u64,
            pending,
        }
    }

    #[test]
    fn a_held_lease_unused_for_the_linger_is_idle() {
        let linger = Duration::from_millis(50);
        let t0 = Instant::now();
        let mut state = LeaseState::new(1, LEASE);
        assert!(!state.idle(t0, linger), "not held: nothing to give back");
        state.taken(3, t0, None);
        assert!(state.idle(t0, linger), "held, never written under");
        state.used(t0 + linger);
        assert!(!state.idle(t0 + linger, linger));
        assert!(!state.idle(t0 + linger + linger / 2, linger));
        assert!(state.idle(t0 + linger * 2, linger));
        // A clock read before the write finished counts no time.
        assert!(!state.idle(t0, linger));
        state.released(true);
        assert!(!state.idle(t0 + linger * 9, linger), "given back");
    }

    #[test]
    fn a_free_or_missing_record_is_taken_with_its_pending_write() {
        let mut state = LeaseState::new(1, LEASE);
        let t0 = Instant::now();
        assert_eq!(
            state.observe(None, t0),
            Step::Take {
                expected: None,
                pending: None
            }
        );
        let free = WriterRecord {
            pending: Some(A7),
            ..WriterRecord::default()
        };
        assert_eq!(
            state.observe(Some((&free, 5)), t0),
            Step::Take {
                expected: Some(5),
                pending: Some(A7)
            }
        );
        state.taken(6, t0, Some(A7));
        let held = state.usable(t0, Duration::ZERO).unwrap();
        assert_eq!((held.token, held.revision, held.until), (6, 6, t0 + LEASE));
    }

    /// Another holder's record counts as held until it has stayed unchanged for a whole
    /// lease by the observer's clock; every change of it starts the count again.
    #[test]
    fn a_lease_lapses_only_after_a_whole_lease_unchanged() {
        let mut state = LeaseState::new(1, LEASE);
        let t0 = Instant::now();
        let other = held_by(2, Some(A7));
        assert_eq!(
            state.observe(Some((&other, 9)), t0),
            Step::Wait {
                holder: 2,
                left: LEASE
            }
        );
        let later = t0 + LEASE / 2;
        assert_eq!(
            state.observe(Some((&other, 9)), later),
            Step::Wait {
                holder: 2,
                left: LEASE / 2
            }
        );
        // Renewed by its holder: counted from now on.
        assert_eq!(
            state.observe(Some((&other, 10)), later),
            Step::Wait {
                holder: 2,
                left: LEASE
            }
        );
        assert!(matches!(
            state.observe(Some((&other, 10)), later + LEASE - Duration::from_millis(1)),
            Step::Wait { .. }
        ));
        assert_eq!(
            state.observe(Some((&other, 10)), later + LEASE),
            Step::Take {
                expected: Some(10),
                pending: Some(A7)
            }
        );
    }

    #[test]
    fn a_holder_renews_keeps_its_token_and_gives_back() {
        let mut state = LeaseState::new(1, LEASE);
        let t0 = Instant::now();
        state.taken(3, t0, None);
        assert!(!state.needs_renewal(t0 + LEASE / 2 - Duration::from_millis(1)));
        assert!(state.needs_renewal(t0 + LEASE / 2 + Duration::from_millis(1)));
        let t1 = t0 + LEASE / 2;
        state.taken(8, t1, Some(A7));
        let held = state.held().unwrap();
        assert_eq!((held.token, held.revision, held.pending), (3, 8, Some(A7)));
        assert_eq!(
            state.usable(t1 + LEASE, Duration::ZERO).map(|h| h.token),
            Some(3)
        );
        assert_eq!(state.usable(t1 + LEASE, Duration::from_millis(1)), None);
        // Given back unsettled: the pending write stays for the next holder.
        let (expected, record) = state.released(false).unwrap();
        assert_eq!(
            (expected, record.holder, record.pending),
            (8, None, Some(A7))
        );
        assert_eq!(state.held(), None);
        state.taken(9, t1, Some(A7));
        let (_, record) = state.released(true).unwrap();
        assert_eq!(record.pending, None);
        assert_eq!(state.released(true), None);
    }

    #[test]
    fn a_lost_lease_is_taken_anew_with_a_new_token() {
        let mut state = LeaseState::new(1, LEASE);
        let t0 = Instant::now();
        state.taken(3, t0, None);
        state.lost();
        assert_eq!(state.held(), None);
        // Its own record (an answer that was lost) is taken back at once.
        assert!(matches!(
            state.observe(Some((&held_by(1, None), 4)), t0),
            Step::Take { .. }
        ));
        state.taken(5, t0, None);
        assert_eq!(state.held().map(|h| h.token), Some(5));
    }

    /// A taking keeps a lease that runs long enough, renews one half run out (and takes it
    /// anew if another router wrote the record meanwhile), and otherwise reads: a free
    /// record is taken with its pending write, a held one read again after pauses that
    /// double, until the wait is over and the write is refused as busy.
    #[test]
    fn a_taking_keeps_renews_waits_or_refuses() {
        let timeout = Duration::from_secs(10);
        let mut state = LeaseState::new(1, LEASE);
        let t0 = Instant::now();
        let (mut acquire, first) = Acquire::start(&state, timeout, t0);
        assert_eq!(first, Do::Read);
        let free = WriterRecord {
            pending: Some(A7),
            ..WriterRecord::default()
        };
        let take = acquire.read(&mut state, Some((&free, 4)), t0);
        assert!(
            matches!(take, Do::Store { expected: Some(4), record } if record.holder == Some(1))
        );
        let taken = Do::Write {
            taken: true,
            pending: Some(A7),
        };
        assert_eq!(acquire.stored(&mut state, Some(5)), taken);
        // Held and fresh: kept, nothing to settle.
        let keep = Do::Write {
            taken: false,
            pending: None,
        };
        assert_eq!(Acquire::start(&state, timeout, t0).1, keep);
        // Half run out: renewed by compare-and-swap on the revision it wrote.
        let later = t0 + LEASE / 2 + Duration::from_millis(1);
        let (mut acquire, renew) = Acquire::start(&state, timeout, later);
        assert!(matches!(
            renew,
            Do::Store {
                expected: Some(5),
                ..
            }
        ));
        // Another router wrote it first: not held any more, read anew.
        assert_eq!(acquire.stored(&mut state, None), Do::Read);
        assert_eq!(state.held(), None);
        let other = held_by(2, None);
        let mut pauses = Vec::new();
        let mut now = later;
        loop {
            match acquire.read(&mut state, Some((&other, 9)), now) {
                Do::Pause(pause) => {
                    pauses.push(pause.as_millis());
                    now += pause;
                }
                Do::Busy { holder, left } => {
                    assert_eq!(holder, 2);
                    assert_eq!(left, LEASE - (now - later));
                    break;
                }
                step => panic!("{step:?} while another router holds the lease"),
            }
        }
        assert_eq!(pauses[..6], [1, 2, 4, 8, 16, 20]);
        assert!(pauses.iter().sum::<u128>() <= timeout.as_millis());
        assert!(
            now + PAUSE_MOST > later + timeout,
            "waited the whole timeout"
        );
    }
}
