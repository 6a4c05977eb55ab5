//! Loaders whose items can only be planned one after another — a batch-size ramp's steps
//! (each starts where the samples consumed so far end) and token-budget steps (each starts
//! at the micro-batch the last one ended on) — prefetched by the same workers as
//! [`Loader`](super::Loader)'s, resumable exactly from the checkpoint after the last item
//! handed out.
//!
//! The plan of each item is cheap (a few integers, or an epoch's micro-batches once per
//! epoch); the gathers are not. A [`Planner`] plans items in order under a lock, as far as
//! the item a worker asks for, and keeps those planned for other workers until they take
//! them: workers ask for items `w, w+W, …`, so it holds at most about W.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{check_sources, gather_rows, GatherSource, LoadedBatch, LoaderOptions, Pool, Workers};
use crate::budget::{BudgetState, EpochPlan, TokenBudget};
use crate::error::Error;
use crate::schedule::{RampSampler, RampState};

/// Items of a run planned in order from a state, handed out by sequence number.
struct Planner<S, I> {
    inner: Mutex<Planned<S, I>>,
}

struct Planned<S, I> {
    /// The next item to plan.
    next: u64,
    state: S,
    /// Planned, not yet taken.
    pending: BTreeMap<u64, I>,
}

impl<S, I> Planner<S, I> {
    fn new(state: S) -> Planner<S, I> {
        Planner {
            inner: Mutex::new(Planned {
                next: 0,
                state,
                pending: BTreeMap::new(),
            }),
        }
    }

    /// Item `seq`, planning it and every item before it not planned yet with `plan` (which
    /// gives `None` at the run's end, and then again). `None` past the end, or if another
    /// worker panicked while planning.
    fn take(&self, seq: u64, mut plan: impl FnMut(&mut S) -> Option<I>) -> Option<I> {
        let mut guard = self.inner.lock().ok()?;
        let planned = &mut *guard;
        while planned.next <= seq {
            let item = plan(&mut planned.state)?;
            planned.pending.insert(planned.next, item);
            planned.next += 1;
        }
        planned.pending.remove(&seq)
    }
}

/// A prefetching, resumable iterator over a [`RampSampler`]'s steps: this rank's part of
/// each global batch, whose size the schedule sets, gathered from the lone dataset's source
/// or, over a mixture, each row from its own dataset's (every dataset's rows in one
/// gather). A batch's `position` is its step; `epoch` is the lone dataset's epoch at the
/// step's first sample (0 over a mixture).
///
/// It ends before the step that would begin in `options.end_epoch` of a lone dataset, and
/// over a mixture when the mixture's stream does.
pub struct RampLoader {
    start: RampState,
    changes_at: Option<u64>,
    workers: Workers<LoadedBatch, RampState>,
}

impl RampLoader {
    /// A loader over `sources` (one for a lone dataset; dataset i's is `sources[i]` over a
    /// mixture) from `state` (`ramp.start()` or a checkpoint under any number of ranks).
    /// A checkpoint of another run, or one whose steps this schedule would have sized
    /// otherwise, is refused, naming the step.
    pub fn new(
        sources: Vec<Arc<dyn GatherSource>>,
        ramp: RampSampler,
        state: &RampState,
        options: LoaderOptions,
    ) -> Result<RampLoader, Error> {
        let resumed = ramp.resume(state)?;
        check_sources(ramp.datasets(), &sources)?;
        let start = resumed.state;
        let fields: Arc<[String]> = options.fields.clone().into();
        let (len, lone) = (start.len.max(1), ramp.datasets() == 1 && !ramp.is_mixture());
        let end_epoch = options.end_epoch.filter(|_| lone);
        let planner = Planner::new(start.clone());
        let produce = move |seq: u64, pool: &Arc<Pool>| {
            let (from, records, step, epoch, after) =
                planner.take(seq, |state: &mut RampState| {
                    let epoch = if lone { state.samples / len } else { 0 };
                    if end_epoch.is_some_and(|end| epoch >= end) {
                        return None;
                    }
                    let step = state.steps;
                    let (from, records, after) = ramp.step_sources(state);
                    *state = after.clone();
                    Some((from, records, step, epoch, after))
                })?;
            let gathered = gather_rows(&sources, &fields, &from, &records, pool.take());
            Some(match gathered {
                Ok(columns) => Ok((
                    LoadedBatch {
                        epoch,
                        position: step,
                        indices: records,
                        sources: if lone { Vec::new() } else { from },
                        columns,
                        pool: Some(Arc::clone(pool)),
                    },
                    after,
                )),
                Err((i, source)) => Err(Error::Gather {
                    epoch,
                    start: step,
                    end: step + 1,
                    source: format!("step {step}, dataset {i}: {source}").into(),
                }),
            })
        };
        let workers = Workers::start(&options, produce)?;
        Ok(RampLoader {
            start,
            changes_at: resumed.changes_at,
            workers,
        })
    }

    /// The checkpoint after the last step handed to the caller (the same on every rank).
    pub fn state(&self) -> RampState {
        self.workers
            .last
            .clone()
            .unwrap_or_else(|| self.start.clone())
    }

    /// At a resume under a changed schedule: the first step it sizes otherwise than the
    /// checkpoint's (a step not taken yet).
    pub fn changes_at(&self) -> Option<u64> {
        self.changes_at
    }
}

impl Iterator for RampLoader {
    type Item = Result<LoadedBatch, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.workers.next()
    }
}

/// One step of a token-budget run as this rank takes it: its `accumulation` micro-batches
/// in order, `None` for a padding micro-batch ([`Remainder::Pad`](crate::budget::Remainder)).
/// Each micro-batch's `indices` are its examples, its `epoch` the epoch the step began in
/// and its `position` the step.
#[derive(Debug)]
pub struct LoadedStep {
    pub step: u64,
    pub micro: Vec<Option<LoadedBatch>>,
}

/// A prefetching, resumable iterator over a [`TokenBudget`]'s steps for one rank, each
/// micro-batch's examples gathered from `source`. It ends before the step that would begin
/// in `options.end_epoch`, or when no example fits the budget.
pub struct BudgetLoader {
    start: BudgetState,
    workers: Workers<LoadedStep, BudgetState>,
}

impl BudgetLoader {
    /// Rank `rank` of the budget's ranks, from `state` (`BudgetState::default()` or a
    /// checkpoint taken under any number of ranks and accumulation).
    pub fn new(
        source: Arc<dyn GatherSource>,
        budget: TokenBudget,
        rank: u32,
        state: BudgetState,
        options: LoaderOptions,
    ) -> Result<BudgetLoader, Error> {
        let ranks = budget.config().ranks;
        if rank >= ranks {
            return Err(Error::Sampler(format!(
                "rank {rank} is not in 0..{ranks} ranks"
            )));
        }
        let fields: Arc<[String]> = options.fields.clone().into();
        let end_epoch = options.end_epoch;
        type Cursor = (BudgetState, u64, Option<(u64, EpochPlan)>);
        let planner: Planner<Cursor, _> = Planner::new((state, 0, None));
        let produce = move |seq: u64, pool: &Arc<Pool>| {
            let (mine, step, epoch, after) = planner.take(seq, |cursor: &mut Cursor| {
                let (at, step, plans) = cursor;
                if end_epoch.is_some_and(|end| at.epoch >= end) {
                    return None;
                }
                let (mine, after) = budget.step(*at, rank, plans);
                if mine.is_empty() {
                    return None; // no example fits the budget
                }
                let item = (mine, *step, at.epoch, after);
                (*at, *step) = (after, *step + 1);
                Some(item)
            })?;
            let mut micro = Vec::with_capacity(mine.len());
            for examples in mine {
                let Some(indices) = examples else {
                    micro.push(None);
                    continue;
                };
                let mut columns = pool.take();
                if let Err(source) = source.gather_into(&indices, &fields, &mut columns) {
                    return Some(Err(Error::Gather {
                        epoch,
                        start: step,
                        end: step + 1,
                        source: format!("step {step}: {source}").into(),
                    }));
                }
                micro.push(Some(LoadedBatch {
                    epoch,
                    position: step,
                    indices,
                    sources: Vec::new(),
                    columns,
                    pool: Some(Arc::clone(pool)),
                }));
            }
            Some(Ok((LoadedStep { step, micro }, after)))
        };
        let workers = Workers::start(&options, produce)?;
        Ok(BudgetLoader {
            start: state,
            workers,
        })
    }

    /// The checkpoint after the last step handed to the caller (the same on every rank).
    pub fn state(&self) -> BudgetState {
        self.workers.last.unwrap_or(self.start)
    }
}

impl Iterator for BudgetLoader {
    type Item = Result<LoadedStep, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.workers.next()
    }
}
