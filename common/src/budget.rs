//! Token-budget batches: variable-length examples grouped into micro-batches of at most
//! `T` tokens, the same number of micro-batches for every rank in every step, as a pure
//! function of (lengths, seed, epoch, configuration) — nothing to coordinate between ranks.
//!
//! - Each epoch takes the examples in its own shuffled order, `lookahead` at a time, sorts
//!   each window by length and cuts it into micro-batches greedily: the longest first,
//!   each micro-batch as many as fit in `T` — counted as `count × longest` when micro-batches
//!   are padded to their longest ([`Cost::Padded`]), or as the sum of lengths when they are
//!   packed ([`Cost::Packed`]). Micro-batches of one window then have similar lengths, and
//!   the order of the windows' micro-batches is shuffled so that a step mixes them.
//! - A step is `ranks × accumulation` micro-batches: rank `r`'s `j`-th of step `s` is
//!   micro-batch `s·R·A + j·R + r` of the run.
//! - An epoch's micro-batches rarely divide into whole steps. [`Remainder::Carry`] runs the
//!   epochs together (a step may end one epoch and begin the next); [`Remainder::Pad`] ends
//!   the epoch's last step with empty micro-batches; [`Remainder::Drop`] leaves the last,
//!   partial step out.
//! - An example longer than `T` is refused by name ([`TooLong::Refuse`]) or left out and
//!   counted ([`TooLong::Skip`]).
//!
//! Where a run is, is where the next micro-batch of the run starts: (epoch, micro-batch of
//! that epoch), the same on every rank and under any number of ranks — a checkpoint resumes
//! under another number of ranks or micro-batches a step.

use crate::feistel::Feistel;
use crate::hash::mix2;

/// How a micro-batch's examples count against the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cost {
    /// Padded to the longest: `count × longest`.
    Padded,
    /// Packed end to end: the sum of their lengths.
    Packed,
}

/// What an epoch's micro-batches left over by its last whole step become.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Remainder {
    /// Epochs run together: the next epoch's micro-batches complete the step.
    Carry,
    /// The epoch's last step is completed with empty micro-batches.
    Pad,
    /// The epoch's last, partial step is left out.
    Drop,
}

/// What becomes of an example longer than the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TooLong {
    /// The plan is refused, naming the first such example.
    Refuse,
    /// It is left out of every epoch (and counted).
    Skip,
}

/// A token-budget schedule asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BudgetConfig {
    /// `T`: the most tokens a micro-batch costs.
    pub max_tokens: u64,
    pub cost: Cost,
    /// Examples sorted by length together (at least 1).
    pub lookahead: usize,
    /// Data-parallel ranks.
    pub ranks: u32,
    /// Micro-batches each rank takes in a step (gradient accumulation).
    pub accumulation: u32,
    pub remainder: Remainder,
    pub too_long: TooLong,
    pub seed: u64,
}

impl BudgetConfig {
    /// Micro-batches of a step over all ranks.
    pub fn per_step(&self) -> u64 {
        self.ranks as u64 * self.accumulation as u64
    }
}

/// A schedule that cannot be made as asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("token budget: {0}")]
pub struct BadBudget(pub String);

/// Where a run is: the next micro-batch is `micro` of epoch `epoch` (an epoch's micro-batches
/// counted as [`TokenBudget::epoch`] lists them, padding aside).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BudgetState {
    pub epoch: u64,
    pub micro: u64,
}

/// The micro-batches of every epoch of a dataset of examples of known lengths.
#[derive(Clone, Debug)]
pub struct TokenBudget {
    config: BudgetConfig,
    lengths: Vec<u64>,
    /// Examples left out for being longer than the budget.
    skipped: u64,
}

/// One epoch's micro-batches: the examples of micro-batch `m` are
/// `examples[ends[m - 1]..ends[m]]` (from 0 for the first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpochPlan {
    pub examples: Vec<u64>,
    pub ends: Vec<u64>,
}

impl EpochPlan {
    /// Micro-batches.
    pub fn len(&self) -> u64 {
        self.ends.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Micro-batch `m`'s examples.
    pub fn micro(&self, m: u64) -> Option<&[u64]> {
        crate::run_of(&self.examples, &self.ends, m)
    }
}

impl TokenBudget {
    /// The schedule of examples of `lengths` tokens as `config` says.
    pub fn new(lengths: Vec<u64>, config: BudgetConfig) -> Result<TokenBudget, BadBudget> {
        if config.max_tokens == 0 {
            return Err(BadBudget("a budget of 0 tokens holds nothing".into()));
        }
        if config.lookahead == 0 {
            return Err(BadBudget(
                "a lookahead of 0 examples sorts none: give at least 1".into(),
            ));
        }
        if config.ranks == 0 || config.accumulation == 0 {
            return Err(BadBudget(format!(
                "{} ranks of {} micro-batches a step take nothing",
                config.ranks, config.accumulation
            )));
        }
        let mut skipped = 0;
        for (i, &len) in lengths.iter().enumerate() {
            if len > config.max_tokens {
                match config.too_long {
                    TooLong::Refuse => {
                        return Err(BadBudget(format!(
                            "example {i} has {len} tokens, more than the budget of {} (skip such examples, or raise the budget)",
                            config.max_tokens
                        )))
                    }
                    TooLong::Skip => skipped += 1,
                }
            }
        }
        Ok(TokenBudget {
            config,
            lengths,
            skipped,
        })
    }

    pub fn config(&self) -> &BudgetConfig {
        &self.config
    }

    /// Examples left out for being longer than the budget.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Epoch `epoch`'s micro-batches, in the order the run takes them.
    pub fn epoch(&self, epoch: u64) -> EpochPlan {
        let c = &self.config;
        let n = self.lengths.len() as u64;
        let order = Feistel::new(n.max(1), mix2(c.seed, epoch));
        let mut windows: Vec<Vec<Vec<u64>>> = Vec::new();
        let mut window: Vec<u64> = Vec::with_capacity(c.lookahead);
        for i in 0..n {
            let example = order.apply(i);
            if self.lengths[example as usize] > c.max_tokens {
                continue;
            }
            window.push(example);
            if window.len() == c.lookahead {
                windows.push(self.cut(&mut window));
            }
        }
        if !window.is_empty() {
            windows.push(self.cut(&mut window));
        }
        // A step mixes micro-batches of several windows: their order shuffled too.
        let micro: Vec<Vec<u64>> = windows.into_iter().flatten().collect();
        let mut plan = EpochPlan::default();
        if micro.is_empty() {
            return plan;
        }
        let shuffle = Feistel::new(micro.len() as u64, mix2(c.seed ^ 0x6d69_6372, epoch));
        for k in 0..micro.len() as u64 {
            let batch = &micro[shuffle.apply(k) as usize];
            plan.examples.extend_from_slice(batch);
            plan.ends.push(plan.examples.len() as u64);
        }
        plan
    }

    /// Sorts `window` by length, longest first, and cuts it into micro-batches (emptying it).
    fn cut(&self, window: &mut Vec<u64>) -> Vec<Vec<u64>> {
        let lengths = &self.lengths;
        window.sort_by(|&a, &b| {
            lengths[b as usize]
                .cmp(&lengths[a as usize])
                .then(a.cmp(&b))
        });
        let mut out: Vec<Vec<u64>> = Vec::new();
        let mut current: Vec<u64> = Vec::new();
        let (mut longest, mut sum) = (0u64, 0u64);
        for &example in window.iter() {
            let len = lengths[example as usize];
            let cost = match self.config.cost {
                Cost::Padded => (current.len() as u64 + 1) * longest.max(len),
                Cost::Packed => sum + len,
            };
            if !current.is_empty() && cost > self.config.max_tokens {
                out.push(std::mem::take(&mut current));
                longest = 0;
                sum = 0;
            }
            current.push(example);
            longest = longest.max(len);
            sum += len;
        }
        if !current.is_empty() {
            out.push(current);
        }
        window.clear();
        out
    }

    /// Micro-batches an epoch of `micro` micro-batches gives the run: `micro` when carried,
    /// rounded up to whole steps when padded, down when dropped.
    pub fn run_length(&self, micro: u64) -> u64 {
        let step = self.config.per_step();
        match self.config.remainder {
            Remainder::Carry => micro,
            Remainder::Pad => micro.div_ceil(step) * step,
            Remainder::Drop => micro / step * step,
        }
    }

    /// This rank's micro-batches of the step starting at `state` (at a step boundary of the
    /// run), and the state after the step: `None` for a padding micro-batch. Reads as many
    /// epochs as the step spans (`plans` caches the last one read).
    pub fn step(
        &self,
        state: BudgetState,
        rank: u32,
        plans: &mut Option<(u64, EpochPlan)>,
    ) -> (Vec<Option<Vec<u64>>>, BudgetState) {
        let c = &self.config;
        let per_step = c.per_step();
        let mut taken: Vec<Option<Vec<u64>>> = Vec::with_capacity(per_step as usize);
        let mut at = state;
        let mut empty_epochs = 0;
        while (taken.len() as u64) < per_step {
            if plans.as_ref().is_none_or(|(e, _)| *e != at.epoch) {
                *plans = Some((at.epoch, self.epoch(at.epoch)));
            }
            let Some((_, plan)) = plans.as_ref() else {
                break;
            };
            let run = self.run_length(plan.len());
            if at.micro >= run {
                if run == 0 {
                    empty_epochs += 1;
                    if empty_epochs > 1 {
                        break; // no example fits: every epoch is empty
                    }
                }
                at = BudgetState {
                    epoch: at.epoch + 1,
                    micro: 0,
                };
                continue;
            }
            taken.push(plan.micro(at.micro).map(<[u64]>::to_vec));
            at.micro += 1;
            if at.micro >= run && c.remainder != Remainder::Carry {
                // Padded and dropped epochs end with whole steps.
                debug_assert!((taken.len() as u64).is_multiple_of(per_step));
            }
        }
        let mine = (0..c.accumulation as u64)
            .filter_map(|j| {
                taken
                    .get((j * c.ranks as u64 + rank as u64) as usize)
                    .cloned()
            })
            .collect();
        (mine, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(n: u64) -> Vec<u64> {
        (0..n).map(|i| 1 + mix2(3, i) % 500).collect()
    }

    fn config(remainder: Remainder, cost: Cost) -> BudgetConfig {
        BudgetConfig {
            max_tokens: 2000,
            cost,
            lookahead: 64,
            ranks: 4,
            accumulation: 2,
            remainder,
            too_long: TooLong::Refuse,
            seed: 9,
        }
    }

    #[test]
    fn micro_batches_stay_within_the_budget_and_hold_every_example_once() {
        let lengths = lengths(3000);
        for cost in [Cost::Padded, Cost::Packed] {
            let budget = TokenBudget::new(lengths.clone(), config(Remainder::Carry, cost)).unwrap();
            for epoch in 0..2 {
                let plan = budget.epoch(epoch);
                let mut seen = vec![0u32; lengths.len()];
                for m in 0..plan.len() {
                    let micro = plan.micro(m).unwrap();
                    assert!(!micro.is_empty());
                    let longest = micro.iter().map(|&e| lengths[e as usize]).max().unwrap();
                    let sum: u64 = micro.iter().map(|&e| lengths[e as usize]).sum();
                    let spent = match cost {
                        Cost::Padded => longest * micro.len() as u64,
                        Cost::Packed => sum,
                    };
                    assert!(spent <= 2000, "{cost:?} micro-batch {m} costs {spent}");
                    for &e in micro {
                        seen[e as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "{cost:?} epoch {epoch}");
            }
            assert_ne!(budget.epoch(0), budget.epoch(1), "each epoch its own order");
        }
    }

    /// Every rank the same number of micro-batches in every step, whatever the remainder;
    /// and the run's micro-batches, step after step, are each epoch's in order.
    #[test]
    fn every_rank_gets_as_many_micro_batches_each_step() {
        let lengths = lengths(777);
        for remainder in [Remainder::Carry, Remainder::Pad, Remainder::Drop] {
            let c = config(remainder, Cost::Padded);
            let budget = TokenBudget::new(lengths.clone(), c).unwrap();
            let mut plans = None;
            let mut state = BudgetState::default();
            let mut pads = 0;
            while state.epoch < 3 {
                let mut after = None;
                for rank in 0..c.ranks {
                    let (mine, next) = budget.step(state, rank, &mut plans);
                    assert_eq!(
                        mine.len(),
                        c.accumulation as usize,
                        "{remainder:?} rank {rank}"
                    );
                    pads += mine.iter().filter(|m| m.is_none()).count();
                    assert!(after.is_none_or(|a| a == next));
                    after = Some(next);
                }
                state = after.unwrap();
            }
            match remainder {
                Remainder::Pad => assert!(pads > 0, "no padding with 777 examples"),
                _ => assert_eq!(pads, 0, "{remainder:?}"),
            }
        }
    }

    /// A run resumed at a step boundary under other ranks and accumulation reads on from the
    /// same micro-batch: the run's micro-batches, concatenated, are an uninterrupted run's.
    #[test]
    fn a_run_resumes_under_other_ranks() {
        let lengths = lengths(500);
        let run = |c: BudgetConfig, from: BudgetState, steps: usize| {
            let budget = TokenBudget::new(lengths.clone(), c).unwrap();
            let mut plans = None;
            let (mut state, mut out) = (from, Vec::new());
            for _ in 0..steps {
                let mut step: Vec<(u64, u64, Option<Vec<u64>>)> = Vec::new();
                let mut next = state;
                for rank in 0..c.ranks {
                    let (mine, after) = budget.step(state, rank, &mut plans);
                    for (j, m) in mine.into_iter().enumerate() {
                        step.push((j as u64, rank as u64, m));
                    }
                    next = after;
                }
                // Back in run order: micro-batch j·R + r of the step.
                step.sort_by_key(|&(j, r, _)| j * c.ranks as u64 + r);
                out.extend(step.into_iter().map(|(_, _, m)| m));
                state = next;
            }
            (out, state)
        };
        let c = config(Remainder::Carry, Cost::Packed);
        let (whole, _) = run(c, BudgetState::default(), 30);
        let (first, state) = run(c, BudgetState::default(), 5);
        let other = BudgetConfig {
            ranks: 3,
            accumulation: 1,
            ..c
        };
        let (rest, _) = run(other, state, (30 - 5) * 8 / 3 + 1);
        let joined: Vec<_> = first.into_iter().chain(rest).take(whole.len()).collect();
        assert_eq!(joined, whole);
    }

    #[test]
    fn examples_past_the_budget_are_refused_or_skipped() {
        let mut lengths = lengths(100);
        lengths[42] = 5000;
        let c = config(Remainder::Carry, Cost::Padded);
        let e = TokenBudget::new(lengths.clone(), c).unwrap_err();
        assert!(e.0.contains("example 42 has 5000 tokens"), "{e}");
        let skip = TokenBudget::new(
            lengths,
            BudgetConfig {
                too_long: TooLong::Skip,
                ..c
            },
        )
        .unwrap();
        assert_eq!(skip.skipped(), 1);
        let plan = skip.epoch(0);
        assert!(!plan.examples.contains(&42));
        assert_eq!(plan.examples.len(), 99);
        for bad in [
            BudgetConfig { max_tokens: 0, ..c },
            BudgetConfig { lookahead: 0, ..c },
            BudgetConfig { ranks: 0, ..c },
        ] {
            assert!(TokenBudget::new(vec![1], bad).is_err());
        }
    }
}
