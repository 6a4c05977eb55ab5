//! What the pair tests share: a seeded sequence of draws, the queue of what happens next on
//! virtual time, and the seeds a run takes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

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

/// What is to happen, by virtual time; at the same time, in the order it was queued.
pub struct Timeline<A: Ord> {
    queue: BinaryHeap<Reverse<(u64, u64, A)>>,
    queued: u64,
}

impl<A: Ord> Timeline<A> {
    pub fn new() -> Timeline<A> {
        Timeline {
            queue: BinaryHeap::new(),
            queued: 0,
        }
    }

    /// `action` happens at `when`.
    pub fn at(&mut self, when: u64, action: A) {
        self.queued += 1;
        self.queue.push(Reverse((when, self.queued, action)));
    }

    /// The next thing to happen, and when.
    pub fn next(&mut self) -> Option<(u64, A)> {
        self.queue
            .pop()
            .map(|Reverse((when, _, action))| (when, action))
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
