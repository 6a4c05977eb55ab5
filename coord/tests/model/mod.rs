//! What the pair tests share: a seeded sequence of draws, virtual time with the queue of
//! what happens next on it, and the seeds a run takes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// A seeded sequence, the same on every machine: the engine's hash of (seed, draw).
pub struct Rng {
    seed: u64,
    drawn: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { seed, drawn: 0 }
    }

    /// A draw below `n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.drawn += 1;
        zr_common::hash::mix2(self.seed, self.drawn) % n.max(1)
    }

    /// True once in `n` draws, on average.
    #[allow(dead_code)] // Not every pair test draws chances.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// Virtual time and what is to happen on it; at the same time, in the order it was queued.
pub struct Timeline<A: Ord> {
    /// Now, in `unit`s since the start: the time of the last thing taken by [`Self::next`].
    pub now: u64,
    start: Instant,
    unit: Duration,
    queue: BinaryHeap<Reverse<(u64, u64, A)>>,
    queued: u64,
}

impl<A: Ord> Timeline<A> {
    /// Nothing queued yet, time counted in `unit`s from now.
    pub fn new(unit: Duration) -> Timeline<A> {
        Timeline {
            now: 0,
            start: Instant::now(),
            unit,
            queue: BinaryHeap::new(),
            queued: 0,
        }
    }

    /// `action` happens at `when`.
    pub fn at(&mut self, when: u64, action: A) {
        self.queued += 1;
        self.queue.push(Reverse((when, self.queued, action)));
    }

    /// The next thing to happen, and when; time is then when it happens.
    pub fn next(&mut self) -> Option<(u64, A)> {
        let Reverse((when, _, action)) = self.queue.pop()?;
        self.now = when;
        Some((when, action))
    }

    /// Virtual time `when` as the clock the code under test takes.
    pub fn instant(&self, when: u64) -> Instant {
        let nanos = self.unit.as_nanos() as u64 * when;
        self.start + Duration::from_nanos(nanos)
    }
}

/// The seeds a test runs: the one `$VAR` names (a failure's, to replay it), or `count`
/// from 0 (`$VARS` sets how many).
pub fn seeds(var: &str, count: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var(var) {
        return vec![seed.parse().unwrap_or_else(|_| panic!("{var} is a number"))];
    }
    let count = std::env::var(format!("{var}S")).map_or(count, |n| {
        n.parse().unwrap_or_else(|_| panic!("{var}S is a number"))
    });
    (0..count).collect()
}
