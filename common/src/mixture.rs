//! Mixtures and the global stream: datasets D₀…Dₘ₋₁ read by weight as one stream of global
//! batches, resumable at any batch under any number of ranks.
//!
//! ```text
//! mixed position p ──stage of p──▶ local position q ──split tree──▶ (dataset i, draw k)
//!                                                     draw k of Dᵢ ──▶ epoch k / |Dᵢ|,
//!                                                     Feistel(|Dᵢ|, seed, i, epoch)(k mod |Dᵢ|)
//! ```
//!
//! - **Global batches.** Global batch b is mixed positions `[b·G, (b+1)·G)`; rank r of R
//!   takes its `G/R` consecutive positions of it. A checkpoint is the number of global
//!   batches consumed — the same on every rank — so a run resumes under any R' dividing G.
//! - **Which dataset.** The datasets are the leaves of a balanced binary tree. A node whose
//!   two sides weigh a and b sends the first n positions it receives `⌊n·a/(a+b)⌋` to the
//!   left and the rest to the right: position q goes left when that count grows at q, and is
//!   the `⌊q·a/(a+b)⌋`-th of the left side. Counts are monotone in n and within one of the
//!   exact share per level, so every dataset's share of any prefix is within ⌈log₂ m⌉ + 1
//!   records of its weight; a position's dataset costs O(log m), and every dataset's draws
//!   before any position O(m) — no index array, whatever the lengths.
//! - **Within a dataset.** Dataset i's k-th draw is record `k mod |Dᵢ|` of its own shuffled
//!   epoch `k / |Dᵢ|`: without replacement within an epoch, and each epoch continues where
//!   the last stopped, across global batches and stages alike.
//! - **Stages.** Weights change at global-batch boundaries (`[(start batch, weights), …]`).
//!   Each stage starts from every dataset's draws so far, computed once when the mixture is
//!   built: no draw is repeated or skipped at a boundary.
//!
//! Weights are turned into integers (fractions of 2³², see [`Mixture::new`]) so that every
//! machine computes the same stream; the fingerprint of a state covers lengths, weights,
//! stage starts and the global batch.

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::feistel::Feistel;
use crate::hash::mix2;

/// Integer weight of a total weight of 1 (weights are kept as fractions of it).
const WEIGHT_ONE: f64 = 4_294_967_296.0;

/// A stage: from global batch `start` on, datasets are read with `weights`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub start: u64,
    pub weights: Vec<f64>,
}

impl Stage {
    /// From global batch `start` on, `weights`.
    pub fn new(start: u64, weights: Vec<f64>) -> Stage {
        Stage { start, weights }
    }
}

/// Everything that fixes a mixture's stream and this rank's part of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MixtureConfig {
    /// Records in each dataset (each at least 1).
    pub lengths: Vec<u64>,
    /// The stages, the first starting at global batch 0.
    pub stages: Vec<Stage>,
    pub seed: u64,
    pub rank: u64,
    pub ranks: u64,
    /// Positions per rank per global batch (the global batch is `batch × ranks`).
    pub batch: u64,
}

/// Where a run is in its stream: the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MixtureState {
    pub seed: u64,
    /// Global batches consumed.
    pub batches: u64,
    /// Positions per global batch.
    pub global_batch: u64,
    /// What fixes the stream (checked on resume): lengths, and per stage its start and its
    /// integer weights.
    pub lengths: Vec<u64>,
    pub stages: Vec<(u64, Vec<u64>)>,
}

/// A configured mixture. Cheap to share; all methods are pure.
#[derive(Clone, Debug)]
pub struct Mixture {
    config: MixtureConfig,
    global: u64,
    /// Per stage: start batch, integer weights, and every dataset's draws before it.
    stages: Vec<Compiled>,
    /// Datasets padded with ones of weight 0 to a power of two: the split tree is complete,
    /// `depth` levels of splits, node k's sides nodes 2k + 1 and 2k + 2 (a heap).
    width: usize,
    depth: u32,
    /// Records not read, each replaced where it would be (see [`crate::blocklist`]).
    blocklist: Option<std::sync::Arc<crate::blocklist::Blocklist>>,
}

#[derive(Clone, Debug)]
struct Compiled {
    start: u64,
    weights: Vec<u64>,
    /// Prefix sums of the padded weights (width + 1 entries): a subtree's weight in O(1).
    prefix: Vec<u128>,
    drawn: Vec<u64>,
    /// Per split of the tree, in heap order: (weight of its left side, its weight).
    splits: Vec<(u64, u64)>,
}

/// Where a batch's fill is in one dataset's draws: its epoch, the draw's place in it, and
/// the epoch's permutation.
struct Cursor {
    len: u64,
    epoch: u64,
    offset: u64,
    permutation: Feistel,
}

impl Compiled {
    fn weight(&self, lo: usize, hi: usize) -> u128 {
        self.prefix[hi] - self.prefix[lo]
    }

    /// (dataset, draw of it within this stage) of local position `q`.
    fn locate(&self, mut q: u64) -> (usize, u64) {
        let (mut lo, mut hi) = (0, self.prefix.len() - 1);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            let (a, total) = (self.weight(lo, mid), self.weight(lo, hi));
            let left = |n: u64| (n as u128 * a / total) as u64;
            let before = left(q);
            if left(q + 1) > before {
                q = before;
                hi = mid;
            } else {
                q -= before;
                lo = mid;
            }
        }
        (lo, q)
    }

    /// Adds every dataset's draws among the first `n` local positions to `counts`.
    fn add_counts(&self, n: u64, counts: &mut [u64]) {
        let mut padded = vec![0u64; self.prefix.len() - 1];
        self.count(0, padded.len(), n, &mut padded);
        for (c, p) in counts.iter_mut().zip(padded) {
            *c += p;
        }
    }

    fn count(&self, lo: usize, hi: usize, n: u64, counts: &mut [u64]) {
        // A subtree of weight 0 receives nothing (and has no share to divide by).
        if n == 0 {
            return;
        }
        if hi - lo == 1 {
            counts[lo] += n;
            return;
        }
        let mid = (lo + hi) / 2;
        let total = self.weight(lo, hi);
        let left = (n as u128 * self.weight(lo, mid) / total) as u64;
        self.count(lo, mid, left, counts);
        self.count(mid, hi, n - left, counts);
    }
}

/// Integer weights of `weights` (fractions of 2³² of their sum), refused unless each is
/// finite and non-negative and some dataset has weight.
fn integer_weights(weights: &[f64], stage: usize) -> Result<Vec<u64>, Error> {
    let bad = |why: String| Err(Error::Sampler(format!("stage {stage}: {why}")));
    if let Some(w) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
        return bad(format!("weight {w} is not a finite number ≥ 0"));
    }
    let sum: f64 = weights.iter().sum();
    if sum <= 0.0 {
        return bad("every weight is 0: no dataset would be read".into());
    }
    Ok(weights
        .iter()
        .map(|w| (w / sum * WEIGHT_ONE).round() as u64)
        .collect())
}

impl Mixture {
    /// Checks `config` and prepares every stage.
    pub fn new(config: MixtureConfig) -> Result<Mixture, Error> {
        let bad = |why: String| Err(Error::Sampler(why));
        let m = config.lengths.len();
        if m == 0 {
            return bad("a mixture needs at least one dataset".into());
        }
        if let Some(i) = config.lengths.iter().position(|&n| n == 0) {
            return bad(format!("dataset {i} is empty: there is nothing to draw"));
        }
        if config.ranks == 0 || config.rank >= config.ranks {
            return bad(format!(
                "rank {} is not in 0..{} ranks",
                config.rank, config.ranks
            ));
        }
        if config.batch == 0 {
            return bad("batch size must be at least 1".into());
        }
        let Some(global) = config.batch.checked_mul(config.ranks) else {
            return bad("batch × ranks overflows".into());
        };
        if config.stages.first().is_none_or(|s| s.start != 0) {
            return bad("the first stage must start at global batch 0".into());
        }
        let mut stages: Vec<Compiled> = Vec::with_capacity(config.stages.len());
        for (s, stage) in config.stages.iter().enumerate() {
            if stage.weights.len() != m {
                return bad(format!(
                    "stage {s} has {} weights for {m} datasets",
                    stage.weights.len()
                ));
            }
            let weights = integer_weights(&stage.weights, s)?;
            let width = m.next_power_of_two();
            let mut prefix = vec![0u128; width + 1];
            for i in 0..width {
                prefix[i + 1] = prefix[i] + weights.get(i).copied().unwrap_or(0) as u128;
            }
            let drawn = match stages.last() {
                None => vec![0; m],
                Some(previous) => {
                    if stage.start <= previous.start {
                        return bad(format!(
                            "stage {s} starts at global batch {}, not after stage {} ({})",
                            stage.start,
                            s - 1,
                            previous.start
                        ));
                    }
                    let positions = (stage.start - previous.start)
                        .checked_mul(global)
                        .ok_or_else(|| Error::Sampler("stage start × batch overflows".into()))?;
                    let mut drawn = previous.drawn.clone();
                    previous.add_counts(positions, &mut drawn);
                    drawn
                }
            };
            stages.push(Compiled {
                start: stage.start,
                weights,
                prefix,
                drawn,
                splits: Vec::new(),
            });
        }
        let width = m.next_power_of_two();
        let depth = width.trailing_zeros();
        for stage in &mut stages {
            stage.splits = (0..width - 1)
                .map(|k| {
                    // Node k: level ⌊log₂(k + 1)⌋, the (k + 1 − 2^level)-th of its level.
                    let level = usize::BITS - 1 - (k + 1).leading_zeros();
                    let size = width >> level;
                    let lo = (k + 1 - (1 << level)) * size;
                    let (mid, hi) = (lo + size / 2, lo + size);
                    // At most m × 2³²: fits.
                    (stage.weight(lo, mid) as u64, stage.weight(lo, hi) as u64)
                })
                .collect();
        }
        Ok(Mixture {
            config,
            global,
            stages,
            width,
            depth,
            blocklist: None,
        })
    }

    /// The same mixture, reading no record `blocklist` names: a draw that would read one
    /// reads a replacement of the same dataset instead, chosen by the draw; every other
    /// draw keeps its record.
    pub fn with_blocklist(mut self, blocklist: crate::blocklist::Blocklist) -> Mixture {
        self.blocklist = (!blocklist.is_empty()).then(|| std::sync::Arc::new(blocklist));
        self
    }

    /// The records it does not read, if any.
    pub fn blocklist(&self) -> Option<&crate::blocklist::Blocklist> {
        self.blocklist.as_deref()
    }

    /// The same mixture as rank `rank` (of the same ranks).
    pub fn as_rank(&self, rank: u64) -> Result<Mixture, Error> {
        let mut other = Mixture::new(MixtureConfig {
            rank,
            ..self.config.clone()
        })?;
        other.blocklist = self.blocklist.clone();
        Ok(other)
    }

    /// What draw `k` of dataset `i` reads, `record` unless blocked.
    #[inline]
    fn unblocked(&self, i: usize, k: u64, record: u64) -> u64 {
        match &self.blocklist {
            None => record,
            Some(list) => list.read(i, record, k, self.config.lengths[i]),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &MixtureConfig {
        &self.config
    }

    /// Positions per global batch (`batch × ranks`).
    pub fn global_batch(&self) -> u64 {
        self.global
    }

    fn stage_of(&self, batch: u64) -> &Compiled {
        let s = self.stages.partition_point(|s| s.start <= batch) - 1;
        &self.stages[s]
    }

    /// (dataset, draw of it) at mixed position `p`.
    pub fn draw(&self, p: u64) -> (usize, u64) {
        let stage = self.stage_of(p / self.global);
        let (i, k) = stage.locate(p - stage.start * self.global);
        (i, stage.drawn[i] + k)
    }

    /// Every dataset's draws before global batch `batch`.
    pub fn drawn_before(&self, batch: u64) -> Vec<u64> {
        let stage = self.stage_of(batch);
        let mut counts = stage.drawn.clone();
        stage.add_counts((batch - stage.start) * self.global, &mut counts);
        counts
    }

    /// The record dataset `i`'s draw `k` reads: its epoch `k / len`, shuffled.
    pub fn record(&self, i: usize, k: u64) -> u64 {
        let len = self.config.lengths[i];
        self.unblocked(i, k, self.permutation(i, k / len).apply(k % len))
    }

    fn permutation(&self, i: usize, epoch: u64) -> Feistel {
        Feistel::new(
            self.config.lengths[i],
            mix2(mix2(self.config.seed, i as u64), epoch),
        )
    }

    /// This rank's part of global batch `batch`: per position, (dataset, record), appended
    /// to `sources` and `records`.
    ///
    /// The positions are consecutive, and so are those each node of the split tree receives:
    /// each node's first local position (and `first × a mod (a + b)`) is computed once, then
    /// every position descends the tree by additions alone, as a line is drawn on a grid;
    /// each dataset's draws run on from its first one, epoch by epoch.
    pub fn fill(&self, batch: u64, sources: &mut Vec<u32>, records: &mut Vec<u64>) {
        let stage = self.stage_of(batch);
        let first = (batch - stage.start) * self.global + self.config.rank * self.config.batch;
        let splits = &stage.splits;
        let inner = self.width - 1;
        // Per node, leaves after the splits: the first local position it receives, and for
        // a split `position × left weight mod weight` as its positions go by.
        let mut next = vec![0u64; inner + self.width];
        let mut rem = vec![0u64; inner];
        next[0] = first;
        for k in 0..inner {
            let (a, total) = splits[k];
            let at = next[k];
            let (to_left, r) = if total == 0 {
                (0, 0)
            } else {
                let scaled = at as u128 * a as u128;
                (
                    (scaled / total as u128) as u64,
                    (scaled % total as u128) as u64,
                )
            };
            rem[k] = r;
            next[2 * k + 1] = to_left;
            next[2 * k + 2] = at - to_left;
        }
        // Each dataset's draws run on from its first in this batch: cursors made when a
        // dataset is first met, then advanced (apply, then step) record by record.
        let mut cursors: Vec<Option<Cursor>> =
            (0..self.config.lengths.len()).map(|_| None).collect();
        let count = self.config.batch as usize;
        let (from, to) = (sources.len(), records.len());
        sources.resize(from + count, 0);
        records.resize(to + count, 0);
        for (source, record) in sources[from..].iter_mut().zip(&mut records[to..]) {
            // Every descent takes `depth` steps, with no branch on the data.
            let mut k = 0;
            for _ in 0..self.depth {
                let (a, total) = splits[k];
                let r = rem[k] + a;
                let to_left = r >= total;
                rem[k] = r - if to_left { total } else { 0 };
                k = 2 * k + 2 - usize::from(to_left);
            }
            let i = k - inner;
            let cursor = match &mut cursors[i] {
                Some(cursor) => cursor,
                slot => {
                    let len = self.config.lengths[i];
                    let k = stage.drawn[i] + next[k];
                    slot.insert(Cursor {
                        len,
                        epoch: k / len,
                        offset: k % len,
                        permutation: self.permutation(i, k / len),
                    })
                }
            };
            *source = i as u32;
            *record = cursor.permutation.apply(cursor.offset);
            if self.blocklist.is_some() {
                let draw = cursor.epoch * cursor.len + cursor.offset;
                *record = self.unblocked(i, draw, *record);
            }
            cursor.offset += 1;
            if cursor.offset == cursor.len {
                cursor.epoch += 1;
                cursor.offset = 0;
                cursor.permutation = self.permutation(i, cursor.epoch);
            }
        }
    }

    /// The state after `batches` global batches.
    pub fn state_at(&self, batches: u64) -> MixtureState {
        MixtureState {
            seed: self.config.seed,
            batches,
            global_batch: self.global,
            lengths: self.config.lengths.clone(),
            stages: self
                .stages
                .iter()
                .map(|s| (s.start, s.weights.clone()))
                .collect(),
        }
    }

    /// Checks that `state` was taken on this stream (whatever its ranks), naming what
    /// differs.
    pub fn check_state(&self, state: &MixtureState) -> Result<(), Error> {
        let ours = self.state_at(state.batches);
        let differs = |what: &str, theirs: String, ours: String| {
            Err(Error::Sampler(format!(
                "the checkpoint was taken with {what} {theirs}, this mixture has {ours}"
            )))
        };
        if state.seed != ours.seed {
            return differs("seed", state.seed.to_string(), ours.seed.to_string());
        }
        if state.global_batch != ours.global_batch {
            return differs(
                "a global batch (batch × ranks) of",
                state.global_batch.to_string(),
                ours.global_batch.to_string(),
            );
        }
        if state.lengths != ours.lengths {
            return differs(
                "dataset lengths",
                format!("{:?}", state.lengths),
                format!("{:?}", ours.lengths),
            );
        }
        if state.stages != ours.stages {
            let starts = |s: &[(u64, Vec<u64>)]| s.iter().map(|(b, _)| *b).collect::<Vec<_>>();
            if starts(&state.stages) != starts(&ours.stages) {
                return differs(
                    "stages starting at global batches",
                    format!("{:?}", starts(&state.stages)),
                    format!("{:?}", starts(&ours.stages)),
                );
            }
            return differs("other weights", String::new(), "different ones".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mixture(lengths: &[u64], weights: &[f64], rank: u64, ranks: u64, batch: u64) -> Mixture {
        Mixture::new(MixtureConfig {
            lengths: lengths.to_vec(),
            stages: vec![Stage::new(0, weights.to_vec())],
            seed: 11,
            rank,
            ranks,
            batch,
        })
        .expect("mixture")
    }

    /// Global batches `from..to`, gathered from every rank of a run with `ranks`.
    fn global(m: &Mixture, ranks: u64, from: u64, to: u64) -> Vec<(u32, u64)> {
        let g = m.global_batch();
        let mut out = Vec::new();
        for b in from..to {
            for r in 0..ranks {
                let c = MixtureConfig {
                    rank: r,
                    ranks,
                    batch: g / ranks,
                    ..m.config().clone()
                };
                let (mut s, mut i) = (Vec::new(), Vec::new());
                Mixture::new(c).expect("rank").fill(b, &mut s, &mut i);
                out.extend(s.into_iter().zip(i));
            }
        }
        out
    }

    #[test]
    fn proportions_hold_and_epochs_repeat_only_when_exhausted() {
        let m = mixture(&[1000, 300, 50], &[0.7, 0.2, 0.1], 0, 1, 100);
        let drawn: Vec<(u32, u64)> = global(&m, 1, 0, 1000);
        let mut counts = [0u64; 3];
        for &(s, _) in &drawn {
            counts[s as usize] += 1;
        }
        for (i, w) in [0.7, 0.2, 0.1].iter().enumerate() {
            let share = counts[i] as f64 / drawn.len() as f64;
            assert!((share - w).abs() < 0.01 * w, "dataset {i}: {share} vs {w}");
        }
        assert_eq!(m.drawn_before(1000), counts.to_vec());
        // Each dataset: every epoch a permutation of its records.
        for (i, &len) in [1000u64, 300, 50].iter().enumerate() {
            let seq: Vec<u64> = drawn
                .iter()
                .filter(|(s, _)| *s as usize == i)
                .map(|&(_, r)| r)
                .collect();
            for epoch in seq.chunks(len as usize) {
                let mut sorted = epoch.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(
                    sorted.len(),
                    epoch.len(),
                    "dataset {i} repeats within an epoch"
                );
            }
        }
    }

    #[test]
    fn any_ranks_dividing_the_global_batch_read_the_same_stream() {
        let one = mixture(&[97, 1000, 13], &[1.0, 2.0, 0.5], 0, 1, 12);
        let whole = global(&one, 1, 0, 40);
        for ranks in [2, 3, 4, 6, 12] {
            assert_eq!(global(&one, ranks, 0, 40), whole, "{ranks} ranks");
        }
        // A resume chain: 4 ranks for 5 batches, then 2 for 7, then 3 for 9, then 1.
        let mut chained = global(&one, 4, 0, 5);
        chained.extend(global(&one, 2, 5, 12));
        chained.extend(global(&one, 3, 12, 21));
        chained.extend(global(&one, 1, 21, 40));
        assert_eq!(chained, whole);
        let state = one.state_at(21);
        let three = mixture(&[97, 1000, 13], &[1.0, 2.0, 0.5], 2, 3, 4);
        three
            .check_state(&state)
            .expect("another ranks, same global batch");
        let other = mixture(&[97, 1000, 13], &[1.0, 2.0, 0.5], 0, 5, 2);
        let e = other.check_state(&state).unwrap_err().to_string();
        assert!(
            e.contains("global batch (batch × ranks) of 12, this mixture has 10"),
            "{e}"
        );
        let lengths = mixture(&[97, 999, 13], &[1.0, 2.0, 0.5], 0, 1, 12);
        let e = lengths.check_state(&state).unwrap_err().to_string();
        assert!(e.contains("dataset lengths [97, 1000, 13]"), "{e}");
    }

    #[test]
    fn stages_change_weights_with_no_repeat_and_no_skip() {
        let staged = Mixture::new(MixtureConfig {
            lengths: vec![500, 500],
            stages: vec![
                Stage::new(0, vec![1.0, 0.0]),
                Stage::new(3, vec![0.5, 0.5]),
                Stage::new(7, vec![0.0, 1.0]),
            ],
            seed: 3,
            rank: 0,
            ranks: 1,
            batch: 40,
        })
        .expect("staged");
        let drawn = global(&staged, 1, 0, 12);
        assert!(drawn[..120].iter().all(|&(s, _)| s == 0));
        assert!(drawn[280..].iter().all(|&(s, _)| s == 1));
        // Dataset 0's draws run on across the boundary: 120 + 80 of them, all distinct.
        let zeros: Vec<u64> = drawn.iter().filter(|d| d.0 == 0).map(|d| d.1).collect();
        assert_eq!(zeros.len(), 200);
        let mut distinct = zeros.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 200);
        assert_eq!(staged.drawn_before(12), vec![200, 280]);
        let e = Mixture::new(MixtureConfig {
            stages: vec![Stage::new(0, vec![0.0, 0.0])],
            ..staged.config().clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("every weight is 0"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_position_maps_to_a_record_and_counts_agree(
            lengths in proptest::collection::vec(1u64..200, 1..6),
            weights in proptest::collection::vec(0u32..10, 6),
            per_rank in 1u64..8,
            ranks in 1u64..5,
            batches in 1u64..30,
        ) {
            let m = lengths.len();
            let mut w: Vec<f64> = weights[..m].iter().map(|&x| x as f64).collect();
            if w.iter().all(|&x| x == 0.0) {
                w[0] = 1.0;
            }
            let mix = mixture(&lengths, &w, 0, 1, per_rank * ranks);
            let drawn = global(&mix, 1, 0, batches);
            let mut counts = vec![0u64; m];
            for &(s, r) in &drawn {
                prop_assert!(r < lengths[s as usize]);
                prop_assert!(w[s as usize] > 0.0, "a dataset of weight 0 was read");
                counts[s as usize] += 1;
            }
            prop_assert_eq!(mix.drawn_before(batches), counts.clone());
            // The batch fill agrees with the position-by-position map.
            let one_by_one: Vec<(u32, u64)> = (0..drawn.len() as u64)
                .map(|p| {
                    let (i, k) = mix.draw(p);
                    (i as u32, mix.record(i, k))
                })
                .collect();
            prop_assert_eq!(&one_by_one, &drawn);
            // Each dataset's records repeat only once its epoch is exhausted.
            for (i, &len) in lengths.iter().enumerate() {
                let seq: Vec<u64> = drawn.iter().filter(|d| d.0 as usize == i).map(|d| d.1).collect();
                for epoch in seq.chunks(len as usize) {
                    let mut e = epoch.to_vec();
                    e.sort_unstable();
                    e.dedup();
                    prop_assert_eq!(e.len(), epoch.len());
                }
            }
            prop_assert_eq!(global(&mix, ranks, 0, batches), drawn);
        }
    }
}
