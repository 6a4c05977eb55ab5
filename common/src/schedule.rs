//! Global batch sizes that change during a run — a ramp as Megatron-LM gives it (start,
//! increment, samples to ramp over) or explicit stages — over a shuffled order of the
//! dataset, as a pure function of (samples consumed, configuration): step `k` takes the next
//! `global_batch(consumed)` indices of the run's order (epoch after epoch), rank `r` of `R`
//! the `r`-th of `R` equal slices.
//!
//! A checkpoint is what was consumed: steps and samples, and the batch size of every stretch
//! of steps taken ([`RampState::history`]). It resumes under any number of ranks that
//! divides the global batch in force then; a schedule changed for steps not taken yet is
//! accepted (and said, [`Resumed::changes_at`]); one that would have given a step already
//! taken another size is refused, naming the step.

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::mixture::Mixture;
use crate::sampler::{Sampler, SamplerConfig};

/// How the global batch size goes with the samples consumed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchSchedule {
    /// Megatron-LM's `--rampup-batch-size START INCREMENT SAMPLES` up to `global`: `start`,
    /// then `increment` more every `samples / ((global - start) / increment)` samples.
    Ramp {
        start: u64,
        increment: u64,
        samples: u64,
        global: u64,
    },
    /// `(from_sample, size)`: from `from_sample` samples consumed on, steps of `size`; the
    /// first stage from sample 0.
    Stages(Vec<(u64, u64)>),
}

impl BatchSchedule {
    /// Checks the numbers.
    pub fn check(&self) -> Result<(), Error> {
        let bad = |why: String| Err(Error::Sampler(why));
        match self {
            BatchSchedule::Ramp {
                start,
                increment,
                samples,
                global,
            } => {
                if *start == 0 || *increment == 0 || start > global {
                    return bad(format!(
                        "a ramp needs 1 <= start <= global and an increment of at least 1 (got start {start}, increment {increment}, global {global})"
                    ));
                }
                if (global - start) % increment != 0 {
                    return bad(format!(
                        "a ramp from {start} by {increment} does not reach the global batch {global}"
                    ));
                }
                let steps = (global - start) / increment;
                if steps > 0 && *samples < steps {
                    return bad(format!(
                        "a ramp of {steps} increments over {samples} samples: give at least one sample per increment"
                    ));
                }
                Ok(())
            }
            BatchSchedule::Stages(stages) => {
                if stages.first().is_none_or(|s| s.0 != 0) {
                    return bad("the first stage starts at sample 0".into());
                }
                for (k, pair) in stages.windows(2).enumerate() {
                    if pair[1].0 <= pair[0].0 {
                        return bad(format!(
                            "stage {} starts at sample {}, not after stage {k}'s {}",
                            k + 1,
                            pair[1].0,
                            pair[0].0
                        ));
                    }
                }
                if let Some(&(at, _)) = stages.iter().find(|s| s.1 == 0) {
                    return bad(format!("the stage from sample {at} has a batch of 0"));
                }
                Ok(())
            }
        }
    }

    /// A ramp's samples between increments (`None`: it starts at its global batch, or is
    /// stages).
    fn ramp_period(&self) -> Option<u64> {
        match self {
            BatchSchedule::Ramp {
                start,
                increment,
                samples,
                global,
            } => {
                let steps = (global - start) / increment;
                (steps > 0).then(|| (samples / steps).max(1))
            }
            BatchSchedule::Stages(_) => None,
        }
    }

    /// The global batch of the step that starts after `consumed` samples.
    pub fn global_batch(&self, consumed: u64) -> u64 {
        match self {
            BatchSchedule::Ramp {
                start,
                increment,
                global,
                ..
            } => match self.ramp_period() {
                None => *global,
                Some(per) => (start + consumed / per * increment).min(*global),
            },
            BatchSchedule::Stages(stages) => {
                let k = stages.partition_point(|s| s.0 <= consumed);
                stages[k.saturating_sub(1)].1
            }
        }
    }

    /// Samples consumed before step `step`: the schedule's sizes summed, a stretch of one
    /// size at a time (as many stretches as the schedule has sizes).
    pub fn samples_before(&self, step: u64) -> u64 {
        let (mut consumed, mut left) = (0u64, step);
        while left > 0 {
            let size = self.global_batch(consumed);
            // Where the size may change next (`None`: never again).
            let change = match self {
                BatchSchedule::Ramp { global, .. } => self
                    .ramp_period()
                    .filter(|_| size < *global)
                    .map(|per| (consumed / per + 1) * per),
                BatchSchedule::Stages(stages) => {
                    stages.iter().map(|s| s.0).find(|&from| from > consumed)
                }
            };
            let stretch = match change {
                Some(at) => (at - consumed).div_ceil(size).min(left),
                None => left,
            };
            consumed = consumed.saturating_add(stretch.saturating_mul(size));
            left -= stretch;
        }
        consumed
    }

    /// Every size the schedule ever gives.
    fn sizes(&self) -> Vec<u64> {
        match self {
            BatchSchedule::Ramp {
                start,
                increment,
                global,
                ..
            } => (*start..=*global).step_by(*increment as usize).collect(),
            BatchSchedule::Stages(stages) => stages.iter().map(|s| s.1).collect(),
        }
    }
}

/// Where a run is: steps and samples consumed, and the size of every stretch of steps taken
/// (`(first step, size)`, each stretch until the next).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RampState {
    pub seed: u64,
    pub len: u64,
    pub steps: u64,
    pub samples: u64,
    pub history: Vec<(u64, u64)>,
}

/// What a resume found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resumed {
    pub state: RampState,
    /// The first step the new schedule gives another size than the old one would have,
    /// if it differs only in steps not taken yet (`None`: the same schedule so far as it
    /// can tell).
    pub changes_at: Option<u64>,
}

/// A rank's batches under a [`BatchSchedule`].
#[derive(Clone, Debug)]
pub struct RampSampler {
    order: RunOrder,
    schedule: BatchSchedule,
    rank: u64,
    ranks: u64,
}

/// What the run's positions read: one dataset's shuffled order, or a mixture's stream (its
/// global batch 1: its stages start at positions).
#[derive(Clone, Debug)]
enum RunOrder {
    Dataset(Sampler),
    Mixture(Mixture),
}

impl RunOrder {
    /// (seed, records in all): what a checkpoint must match.
    fn identity(&self) -> (u64, u64) {
        match self {
            RunOrder::Dataset(s) => (s.config().seed, s.config().len),
            RunOrder::Mixture(m) => (m.config().seed, m.config().lengths.iter().sum()),
        }
    }
}

impl RampSampler {
    /// Rank `rank` of `ranks` over a dataset of `len` records in the order `seed`
    /// shuffles it into, epoch after epoch; refused if `ranks` divides not every size the
    /// schedule gives, naming the first.
    pub fn new(
        len: u64,
        seed: u64,
        rank: u64,
        ranks: u64,
        schedule: BatchSchedule,
    ) -> Result<RampSampler, Error> {
        schedule.check()?;
        if ranks == 0 || rank >= ranks {
            return Err(Error::Sampler(format!(
                "rank {rank} is not in 0..{ranks} ranks"
            )));
        }
        if let Some(size) = schedule.sizes().into_iter().find(|s| s % ranks != 0) {
            return Err(Error::Sampler(format!(
                "the schedule's global batch of {size} does not divide among {ranks} ranks"
            )));
        }
        let order = Sampler::new(SamplerConfig::shuffle(len, seed))?;
        Ok(RampSampler {
            order: RunOrder::Dataset(order),
            schedule,
            rank,
            ranks,
        })
    }

    /// Rank `rank` of `ranks` over `mixture`'s stream, its positions taken step by step as
    /// the schedule says. The mixture must have a global batch of 1 (`batch` 1, `ranks` 1),
    /// so that its stages (and a token mixture's budgets) start at positions.
    pub fn over_mixture(
        mixture: Mixture,
        rank: u64,
        ranks: u64,
        schedule: BatchSchedule,
    ) -> Result<RampSampler, Error> {
        if mixture.global_batch() != 1 {
            return Err(Error::Sampler(format!(
                "a ramp reads a mixture of global batch 1 (its stages then start at positions), not {}",
                mixture.global_batch()
            )));
        }
        let placeholder = RampSampler::new(1, 0, rank, ranks, schedule)?;
        Ok(RampSampler {
            order: RunOrder::Mixture(mixture),
            ..placeholder
        })
    }

    pub fn schedule(&self) -> &BatchSchedule {
        &self.schedule
    }

    /// This rank's part of step `step` — each position's (dataset, record, the dataset's
    /// epoch) — computed from the schedule alone.
    pub fn manifest_at(&self, step: u64) -> Vec<(u32, u64, u64)> {
        let before = self.schedule.samples_before(step);
        let share = self.schedule.global_batch(before) / self.ranks;
        let first = before + self.rank * share;
        (first..first + share)
            .map(|p| match &self.order {
                RunOrder::Dataset(order) => {
                    let n = order.items_per_epoch().max(1);
                    (0, order.index(p / n, p % n), p / n)
                }
                RunOrder::Mixture(mixture) => {
                    let (i, k) = mixture.draw(p);
                    let len = mixture.config().lengths[i].max(1);
                    (i as u32, mixture.record(i, k), k / len)
                }
            })
            .collect()
    }

    /// Datasets the run reads: 1, or a mixture's.
    pub fn datasets(&self) -> usize {
        match &self.order {
            RunOrder::Dataset(_) => 1,
            RunOrder::Mixture(m) => m.config().lengths.len(),
        }
    }

    /// Whether the run reads a mixture's stream.
    pub fn is_mixture(&self) -> bool {
        matches!(self.order, RunOrder::Mixture(_))
    }

    /// The state before the first step.
    pub fn start(&self) -> RampState {
        let (seed, len) = self.order.identity();
        RampState {
            seed,
            len,
            ..RampState::default()
        }
    }

    /// This rank's indices of the step `state` is at, and the state after it (over a
    /// mixture, the records of the draws: see [`Self::step_sources`]).
    pub fn step(&self, state: &RampState) -> (Vec<u64>, RampState) {
        let (_, records, next) = self.step_sources(state);
        (records, next)
    }

    /// This rank's part of the step `state` is at — each position's dataset (0 for a lone
    /// dataset) and record — and the state after it.
    pub fn step_sources(&self, state: &RampState) -> (Vec<u32>, Vec<u64>, RampState) {
        let global = self.schedule.global_batch(state.samples);
        let share = global / self.ranks;
        let first = state.samples + self.rank * share;
        let (sources, indices) = match &self.order {
            RunOrder::Dataset(order) => {
                let n = order.items_per_epoch();
                let records = (first..first + share)
                    .map(|p| order.index(p / n, p % n))
                    .collect();
                (vec![0; share as usize], records)
            }
            RunOrder::Mixture(mixture) => (first..first + share)
                .map(|p| {
                    let (i, k) = mixture.draw(p);
                    (i as u32, mixture.record(i, k))
                })
                .unzip(),
        };
        let mut next = state.clone();
        next.steps += 1;
        next.samples += global;
        if next.history.last().is_none_or(|&(_, size)| size != global) {
            next.history.push((state.steps, global));
        }
        (sources, indices, next)
    }

    /// Takes up `state` (a checkpoint of this run, under any ranks): refused if it is of
    /// another dataset or seed, or if this schedule would have given a step it took another
    /// size, naming the step.
    pub fn resume(&self, state: &RampState) -> Result<Resumed, Error> {
        let (seed, len) = self.order.identity();
        if state.seed != seed || state.len != len {
            return Err(Error::Sampler(format!(
                "the checkpoint is of seed {} over {} records, and this run of seed {seed} over {len}",
                state.seed, state.len
            )));
        }
        // Replay the sizes of the steps taken by this schedule, stretch by stretch.
        let (mut step, mut samples) = (0u64, 0u64);
        for (k, &(from, size)) in state.history.iter().enumerate() {
            if from != step {
                return Err(Error::Sampler(format!(
                    "the checkpoint's history is broken at step {from}"
                )));
            }
            let until = state.history.get(k + 1).map_or(state.steps, |h| h.0);
            while step < until {
                let ours = self.schedule.global_batch(samples);
                if ours != size {
                    return Err(Error::Sampler(format!(
                        "step {step} was taken with a global batch of {size}, and this schedule gives it {ours}: it rewrites steps already taken"
                    )));
                }
                samples += size;
                step += 1;
            }
        }
        if samples != state.samples {
            return Err(Error::Sampler(format!(
                "the checkpoint's history sums to {samples} samples, and it says {}",
                state.samples
            )));
        }
        let next = self.schedule.global_batch(samples);
        if !next.is_multiple_of(self.ranks) {
            return Err(Error::Sampler(format!(
                "the global batch in force at step {step} is {next}, which {} ranks do not divide",
                self.ranks
            )));
        }
        let changes_at = match state.history.last() {
            Some(&(_, size)) if size != next => Some(step),
            _ => None,
        };
        Ok(Resumed {
            state: state.clone(),
            changes_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> BatchSchedule {
        BatchSchedule::Ramp {
            start: 8,
            increment: 8,
            samples: 240,
            global: 32,
        }
    }

    #[test]
    fn a_ramp_goes_as_megatrons() {
        let s = ramp();
        // Three increments over 240 samples: one every 80.
        assert_eq!(s.global_batch(0), 8);
        assert_eq!(s.global_batch(79), 8);
        assert_eq!(s.global_batch(80), 16);
        assert_eq!(s.global_batch(160), 24);
        assert_eq!(s.global_batch(240), 32);
        assert_eq!(s.global_batch(10_000), 32);
        let stages = BatchSchedule::Stages(vec![(0, 4), (100, 12)]);
        assert_eq!((stages.global_batch(99), stages.global_batch(100)), (4, 12));
    }

    /// The samples before a step, a stretch at a time, are the sizes summed step by step;
    /// and a step's manifest is what the rank reads there.
    #[test]
    fn a_step_is_found_without_taking_the_steps_before() {
        for schedule in [
            ramp(),
            BatchSchedule::Ramp {
                start: 3,
                increment: 3,
                samples: 100,
                global: 12,
            },
            BatchSchedule::Stages(vec![(0, 4), (10, 12), (100, 8)]),
        ] {
            let ranks = if matches!(schedule, BatchSchedule::Ramp { start: 3, .. }) {
                3
            } else {
                4
            };
            let samplers: Vec<RampSampler> = (0..ranks)
                .map(|r| RampSampler::new(50, 1, r, ranks, schedule.clone()).unwrap())
                .collect();
            let mut state = samplers[0].start();
            for step in 0..200 {
                assert_eq!(schedule.samples_before(step), state.samples, "step {step}");
                for sampler in &samplers {
                    let (_, records, _) = sampler.step_sources(&state);
                    let listed: Vec<u64> = sampler.manifest_at(step).iter().map(|e| e.1).collect();
                    assert_eq!(listed, records, "step {step}");
                }
                state = samplers[0].step(&state).1;
            }
        }
    }

    /// Ranks together read the run's order once, in order, whatever their number.
    #[test]
    fn ranks_split_each_step_and_resume_under_other_counts() {
        let whole = RampSampler::new(100, 3, 0, 1, ramp()).unwrap();
        let (mut state, mut run) = (whole.start(), Vec::new());
        for _ in 0..40 {
            let (indices, next) = whole.step(&state);
            run.extend(indices);
            state = next;
        }
        let ranked = |ranks: u64, from: &RampState, steps: usize| {
            let samplers: Vec<RampSampler> = (0..ranks)
                .map(|r| RampSampler::new(100, 3, r, ranks, ramp()).unwrap())
                .collect();
            let resumed = samplers[0].resume(from).unwrap().state;
            let (mut state, mut out) = (resumed, Vec::new());
            for _ in 0..steps {
                let mut next = state.clone();
                for s in &samplers {
                    let (indices, after) = s.step(&state);
                    out.extend(indices);
                    next = after;
                }
                state = next;
            }
            (out, state)
        };
        let (head, state) = ranked(2, &whole.start(), 12);
        assert_eq!(state.history, vec![(0, 8), (10, 16)]);
        let (tail, _) = ranked(8, &state, 28);
        let joined: Vec<u64> = head.into_iter().chain(tail).collect();
        assert_eq!(joined, run);
        // Every epoch a permutation of the records.
        let mut first: Vec<u64> = run[..100].to_vec();
        first.sort_unstable();
        assert_eq!(first, (0..100).collect::<Vec<_>>());
    }

    /// A ramp over a mixture reads the mixture's stream position by position: the steps,
    /// concatenated, are its draws in order, whatever the ranks.
    #[test]
    fn a_ramp_over_a_mixture_reads_its_stream_in_order() {
        use crate::mixture::{MixtureConfig, Stage};
        let config = MixtureConfig {
            lengths: vec![50, 80],
            stages: vec![
                Stage::new(0, vec![1.0, 1.0]),
                Stage::new(100, vec![1.0, 4.0]),
            ],
            seed: 3,
            rank: 0,
            ranks: 1,
            batch: 1,
        };
        let mixture = Mixture::new(config.clone()).unwrap();
        let want: Vec<(u32, u64)> = (0..400)
            .map(|p| {
                let (i, k) = mixture.draw(p);
                (i as u32, mixture.record(i, k))
            })
            .collect();
        let samplers: Vec<RampSampler> = (0..4)
            .map(|r| {
                RampSampler::over_mixture(Mixture::new(config.clone()).unwrap(), r, 4, ramp())
                    .unwrap()
            })
            .collect();
        let (mut state, mut got) = (samplers[0].start(), Vec::new());
        while got.len() < 400 {
            let mut next = state.clone();
            for s in &samplers {
                let (sources, records, after) = s.step_sources(&state);
                got.extend(sources.into_iter().zip(records));
                next = after;
            }
            state = next;
        }
        assert_eq!(&got[..400], &want[..]);
        let wide = Mixture::new(MixtureConfig { batch: 4, ..config }).unwrap();
        assert!(RampSampler::over_mixture(wide, 0, 1, ramp()).is_err());
    }

    #[test]
    fn a_changed_future_is_said_and_a_rewritten_past_refused() {
        let old = RampSampler::new(100, 3, 0, 1, ramp()).unwrap();
        let mut state = old.start();
        for _ in 0..12 {
            state = old.step(&state).1; // 10 steps of 8, 2 of 16: 112 samples
        }
        // From sample 112 on, 24: the future changes.
        let later = BatchSchedule::Stages(vec![(0, 8), (80, 16), (112, 24)]);
        let resumed = RampSampler::new(100, 3, 0, 1, later)
            .unwrap()
            .resume(&state)
            .unwrap();
        assert_eq!(resumed.changes_at, Some(12));
        // 16 from sample 64: step 8 would have been 16.
        let past = BatchSchedule::Stages(vec![(0, 8), (64, 16)]);
        let e = RampSampler::new(100, 3, 0, 1, past)
            .unwrap()
            .resume(&state)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("step 8 was taken with a global batch of 8"),
            "{e}"
        );
        // Ranks that do not divide a size of the schedule.
        let e = RampSampler::new(100, 3, 0, 3, ramp()).unwrap_err();
        assert!(
            e.to_string()
                .contains("global batch of 8 does not divide among 3"),
            "{e}"
        );
        assert!(BatchSchedule::Ramp {
            start: 8,
            increment: 5,
            samples: 10,
            global: 32
        }
        .check()
        .is_err());
        assert!(BatchSchedule::Stages(vec![(5, 8)]).check().is_err());
    }
}
