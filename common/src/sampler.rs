//! Index generators for training: which record each position of an epoch reads, as a pure
//! function of (seed, epoch, position), split across ranks with no communication.
//!
//! An epoch is a sequence of *units* — single indices, or whole windows for `Sliding` — and
//! rank `r` of `R` takes units `r, r+R, r+2R, …`. The tail that does not divide evenly is
//! dropped by default (every rank sees the same count); `Tail::Pad` instead wraps around to
//! the epoch's first units. A rank's epoch is `items_per_epoch()` indices, cut into batches
//! of `batch` (the last batch may be shorter). A checkpoint is a [`SamplerState`]: the
//! position in that sequence, from which [`Sampler::index`] recomputes everything.

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::feistel::Feistel;
use crate::hash::{mix2, reduce};

/// The order in which an epoch visits the index space `[0, len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Order {
    /// 0, 1, 2, …, len−1.
    Sequential,
    /// Windows of `window` consecutive indices whose starts advance by `stride`, around the
    /// index space as a circular queue: a window running past the end wraps to 0, and each
    /// epoch continues where the previous one stopped. The seed plays no part.
    Sliding { window: u64, stride: u64 },
    /// Uniform random indices with replacement; an epoch has `len` of them.
    Random,
    /// A seeded permutation of `[0, len)` (global random without replacement), new for
    /// every (seed, epoch).
    Shuffle,
}

/// What happens to the units that do not divide evenly among ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tail {
    /// Drop them: every rank sees `⌊units / ranks⌋` units (the default).
    #[default]
    Drop,
    /// Pad: every rank sees `⌈units / ranks⌉` units, the extra ones taken from the epoch's start.
    Pad,
}

/// Everything that fixes a sampler's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerConfig {
    /// Records in the dataset.
    pub len: u64,
    /// Visiting order.
    pub order: Order,
    /// Seed of the random orders.
    pub seed: u64,
    /// This rank, `0 ≤ rank < ranks`.
    pub rank: u64,
    /// Number of ranks sharing the epoch.
    pub ranks: u64,
    /// Indices per batch.
    pub batch: u64,
    /// Handling of the uneven tail.
    pub tail: Tail,
}

impl SamplerConfig {
    /// One rank reading `len` records in the shuffled order of `seed`, one a batch.
    pub fn shuffle(len: u64, seed: u64) -> SamplerConfig {
        SamplerConfig {
            len,
            order: Order::Shuffle,
            seed,
            rank: 0,
            ranks: 1,
            batch: 1,
            tail: Tail::Drop,
        }
    }
}

/// Where a run is in its stream of batches: enough to resume exactly. Every rank's batch k of
/// an epoch is its part of the epoch's global batch k, so the state is the same on every
/// rank, and resumes under other ranks with the same global batch (`batch × ranks`; see
/// [`Sampler::adopt`]). `len`, `ranks` and `batch` are kept to refuse a resume under a
/// configuration it does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Seed of the run.
    pub seed: u64,
    /// Current epoch.
    pub epoch: u64,
    /// Indices of this epoch already handed out to the caller.
    pub position: u64,
    /// Dataset length the state was taken with.
    pub len: u64,
    /// Rank the state belongs to.
    pub rank: u64,
    /// Ranks of the run.
    pub ranks: u64,
    /// Indices per rank per batch (0 in a state from before it was kept: such a state
    /// resumes only under its own ranks).
    #[serde(default)]
    pub batch: u64,
}

/// A configured sampler. Cheap to share; all methods are pure.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplerConfig,
    /// Indices per unit: `window` for sliding, else 1.
    unit: u64,
    /// Units in a whole epoch, before the split across ranks.
    epoch_units: u64,
    /// Units this rank sees per epoch.
    rank_units: u64,
    /// Records not read, each replaced where it would be (see [`crate::blocklist`]).
    blocklist: Option<std::sync::Arc<crate::blocklist::Blocklist>>,
}

impl Sampler {
    /// Checks `config` and builds the sampler.
    pub fn new(config: SamplerConfig) -> Result<Sampler, Error> {
        let bad = |why: String| Err(Error::Sampler(why));
        if config.len == 0 {
            return bad("the dataset is empty: there is nothing to sample".into());
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
        let (unit, epoch_units) = match config.order {
            Order::Sliding { window, stride } => {
                if window == 0 || stride == 0 {
                    return bad(format!(
                        "sliding window {window} and stride {stride} must both be at least 1"
                    ));
                }
                (window, config.len.div_ceil(stride))
            }
            _ => (1, config.len),
        };
        let rank_units = match config.tail {
            Tail::Drop => epoch_units / config.ranks,
            Tail::Pad => epoch_units.div_ceil(config.ranks),
        };
        if rank_units == 0 {
            return bad(format!(
                "{epoch_units} units per epoch split over {} ranks leave none for each rank (use tail padding or fewer ranks)",
                config.ranks
            ));
        }
        if rank_units.checked_mul(unit).is_none() {
            return bad("window times units per epoch overflows".into());
        }
        Ok(Sampler {
            config,
            unit,
            epoch_units,
            rank_units,
            blocklist: None,
        })
    }

    /// The same sampler, reading no record `blocklist` names (dataset 0's): a position that
    /// would read one reads a replacement instead, chosen by the position; every other
    /// position keeps its record.
    pub fn with_blocklist(mut self, blocklist: crate::blocklist::Blocklist) -> Sampler {
        self.blocklist = (!blocklist.is_empty()).then(|| std::sync::Arc::new(blocklist));
        self
    }

    /// The records it does not read, if any.
    pub fn blocklist(&self) -> Option<&crate::blocklist::Blocklist> {
        self.blocklist.as_deref()
    }

    /// The same sampler as rank `rank` (of the same ranks).
    pub fn as_rank(&self, rank: u64) -> Result<Sampler, Error> {
        let mut other = Sampler::new(SamplerConfig {
            rank,
            ..self.config
        })?;
        other.blocklist = self.blocklist.clone();
        Ok(other)
    }

    /// The configuration.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Indices this rank reads per epoch.
    pub fn items_per_epoch(&self) -> u64 {
        self.rank_units * self.unit
    }

    /// Batches this rank reads per epoch (the last may be short).
    pub fn batches_per_epoch(&self) -> u64 {
        self.items_per_epoch().div_ceil(self.config.batch)
    }

    /// The sampler for one epoch, with its per-epoch keys prepared.
    pub fn epoch(&self, epoch: u64) -> EpochSampler<'_> {
        let key = mix2(self.config.seed, epoch);
        let permutation =
            matches!(self.config.order, Order::Shuffle).then(|| Feistel::new(self.config.len, key));
        EpochSampler {
            sampler: self,
            epoch,
            key,
            permutation,
        }
    }

    /// Index at `position` (< `items_per_epoch()`) of this rank's `epoch`.
    pub fn index(&self, epoch: u64, position: u64) -> u64 {
        self.epoch(epoch).index(position)
    }

    /// The state at the start of `epoch`.
    pub fn start(&self, epoch: u64) -> SamplerState {
        self.state_at(epoch, 0)
    }

    /// The state at `position` of `epoch`, normalized so the end of an epoch is the start of
    /// the next.
    pub fn state_at(&self, epoch: u64, position: u64) -> SamplerState {
        let (epoch, position) = if position >= self.items_per_epoch() {
            (epoch + 1, 0)
        } else {
            (epoch, position)
        };
        SamplerState {
            seed: self.config.seed,
            epoch,
            position,
            len: self.config.len,
            rank: self.config.rank,
            ranks: self.config.ranks,
            batch: self.config.batch,
        }
    }

    /// Checks that `state` fits this configuration (see [`Sampler::adopt`]).
    pub fn check_state(&self, state: &SamplerState) -> Result<(), Error> {
        self.adopt(state).map(|_| ())
    }

    /// `state` — taken on any rank of these ranks, or of other ranks with the same global
    /// batch (`batch × ranks`) — as this rank's: the same epoch, and the position of the same
    /// number of global batches. Every whole global batch from there on is the one the run
    /// the state was taken in would have read next (an epoch's last, partial one splits as
    /// evenly as the ranks allow). Refused, naming what differs, if it does not fit.
    pub fn adopt(&self, state: &SamplerState) -> Result<SamplerState, Error> {
        let c = &self.config;
        let mismatch = |what: &str, theirs: u64, ours: u64| {
            Err(Error::Sampler(format!(
                "the checkpoint was taken with {what} {theirs}, this sampler has {ours}"
            )))
        };
        if state.seed != c.seed {
            return mismatch("seed", state.seed, c.seed);
        }
        if state.len != c.len {
            return mismatch("dataset length", state.len, c.len);
        }
        let mut position = state.position;
        if state.ranks != c.ranks {
            if state.batch == 0 {
                return Err(Error::Sampler(format!(
                    "the checkpoint was taken with {} ranks and does not say its batch size, so it resumes only under {} ranks; this sampler has {}",
                    state.ranks, state.ranks, c.ranks
                )));
            }
            let (theirs, ours) = (state.batch * state.ranks, c.batch * c.ranks);
            if theirs != ours {
                return mismatch("a global batch (batch × ranks) of", theirs, ours);
            }
            position = state.position.div_ceil(state.batch) * c.batch;
        } else if state.position > self.items_per_epoch() {
            return mismatch("position", state.position, self.items_per_epoch());
        }
        Ok(self.state_at(state.epoch, position.min(self.items_per_epoch())))
    }
}

/// A [`Sampler`] fixed to one epoch. See [`Sampler::epoch`].
#[derive(Clone, Debug)]
pub struct EpochSampler<'a> {
    sampler: &'a Sampler,
    epoch: u64,
    key: u64,
    permutation: Option<Feistel>,
}

impl EpochSampler<'_> {
    /// Index at `position` (< `items_per_epoch()`) of this rank's epoch.
    #[inline]
    pub fn index(&self, position: u64) -> u64 {
        let s = self.sampler;
        let c = &s.config;
        let (unit, within) = if s.unit == 1 {
            (position, 0)
        } else {
            (position / s.unit, position % s.unit)
        };
        // This rank's unit → the epoch's unit; padding wraps past the end to the start.
        let mut global_unit = unit * c.ranks + c.rank;
        if global_unit >= s.epoch_units {
            global_unit %= s.epoch_units;
        }
        let global = global_unit * s.unit + within;
        let index = match c.order {
            Order::Sequential => global,
            Order::Random => reduce(mix2(self.key, global), c.len),
            Order::Shuffle => match &self.permutation {
                Some(p) => p.apply(global),
                None => global,
            },
            Order::Sliding { stride, .. } => {
                // Window number counted from the first epoch, so epochs continue round the circle.
                let window = self.epoch as u128 * s.epoch_units as u128 + global_unit as u128;
                ((window * stride as u128 + within as u128) % c.len as u128) as u64
            }
        };
        match &s.blocklist {
            None => index,
            // The position named the same on every rank: the epoch's, before the split.
            Some(list) => {
                let position = self.epoch.wrapping_mul(s.epoch_units * s.unit) ^ global;
                list.read(0, index, mix2(self.epoch, position), c.len)
            }
        }
    }

    /// Appends the indices at positions `[start, end)` to `out`.
    pub fn fill(&self, start: u64, end: u64, out: &mut Vec<u64>) {
        out.extend((start..end).map(|p| self.index(p)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(len: u64, order: Order) -> SamplerConfig {
        SamplerConfig {
            len,
            order,
            seed: 7,
            rank: 0,
            ranks: 1,
            batch: 4,
            tail: Tail::Drop,
        }
    }

    fn epoch_of(c: SamplerConfig, epoch: u64) -> Vec<u64> {
        let s = Sampler::new(c).unwrap();
        (0..s.items_per_epoch())
            .map(|p| s.index(epoch, p))
            .collect()
    }

    #[test]
    fn sequential_and_random() {
        assert_eq!(
            epoch_of(config(5, Order::Sequential), 3),
            vec![0, 1, 2, 3, 4]
        );
        let r = epoch_of(config(100, Order::Random), 0);
        assert_eq!(r.len(), 100);
        assert!(r.iter().all(|&i| i < 100));
        assert_ne!(r, epoch_of(config(100, Order::Random), 1));
        let distinct: std::collections::HashSet<_> = r.iter().collect();
        assert!(
            distinct.len() < 100,
            "with replacement, 100 draws of 100 repeat some"
        );
    }

    #[test]
    fn sliding_wraps_and_continues() {
        let c = config(
            10,
            Order::Sliding {
                window: 4,
                stride: 4,
            },
        );
        // 3 windows per epoch: starts 0, 4, 8 — the last wraps round to 0 and 1.
        assert_eq!(epoch_of(c, 0), vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]);
        // The next epoch continues the circle: starts 12, 16, 20 (mod 10).
        assert_eq!(epoch_of(c, 1), vec![2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3]);
        let overlapping = config(
            5,
            Order::Sliding {
                window: 3,
                stride: 1,
            },
        );
        assert_eq!(&epoch_of(overlapping, 0)[..6], &[0, 1, 2, 1, 2, 3]);
    }

    #[test]
    fn ranks_split_without_overlap() {
        for order in [
            Order::Sequential,
            Order::Shuffle,
            Order::Sliding {
                window: 3,
                stride: 3,
            },
        ] {
            for ranks in [1u64, 2, 3, 7] {
                let len = 103;
                let mut all = Vec::new();
                for rank in 0..ranks {
                    let s = Sampler::new(SamplerConfig {
                        rank,
                        ranks,
                        ..config(len, order)
                    })
                    .unwrap();
                    all.push(
                        (0..s.items_per_epoch())
                            .map(|p| s.index(2, p))
                            .collect::<Vec<_>>(),
                    );
                }
                assert!(
                    all.windows(2).all(|w| w[0].len() == w[1].len()),
                    "ranks see different counts"
                );
                let units = match order {
                    Order::Sliding { .. } => len.div_ceil(3),
                    _ => len,
                };
                let per_rank = units / ranks;
                assert_eq!(
                    all[0].len() as u64,
                    per_rank
                        * if matches!(order, Order::Sliding { .. }) {
                            3
                        } else {
                            1
                        }
                );
                if order == Order::Shuffle {
                    let mut union: Vec<u64> = all.concat();
                    union.sort_unstable();
                    union.dedup();
                    assert_eq!(union.len() as u64, per_rank * ranks, "ranks overlap");
                    // Exactly the dropped tail is missing: the whole epoch minus its last units.
                    let whole = epoch_of(config(len, order), 2);
                    let mut kept: Vec<u64> = whole[..(per_rank * ranks) as usize].to_vec();
                    kept.sort_unstable();
                    assert_eq!(union, kept);
                }
            }
        }
    }

    #[test]
    fn padding_gives_every_rank_the_ceiling() {
        let s = Sampler::new(SamplerConfig {
            rank: 2,
            ranks: 3,
            tail: Tail::Pad,
            ..config(10, Order::Sequential)
        })
        .unwrap();
        assert_eq!(s.items_per_epoch(), 4);
        assert_eq!(
            (0..4).map(|p| s.index(0, p)).collect::<Vec<_>>(),
            vec![2, 5, 8, 1]
        );
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(Sampler::new(config(0, Order::Sequential)).is_err());
        assert!(Sampler::new(SamplerConfig {
            rank: 3,
            ranks: 3,
            ..config(10, Order::Sequential)
        })
        .is_err());
        assert!(Sampler::new(SamplerConfig {
            ranks: 11,
            ..config(10, Order::Sequential)
        })
        .is_err());
        assert!(Sampler::new(SamplerConfig {
            batch: 0,
            ..config(10, Order::Sequential)
        })
        .is_err());
        assert!(Sampler::new(config(
            10,
            Order::Sliding {
                window: 0,
                stride: 1
            }
        ))
        .is_err());
    }

    #[test]
    fn states_resume_under_other_ranks_with_the_same_global_batch() {
        let on = |rank, ranks, batch| {
            Sampler::new(SamplerConfig {
                rank,
                ranks,
                batch,
                ..config(1200, Order::Shuffle)
            })
            .unwrap()
        };
        // Global batch j of an epoch: every rank's batch j together.
        let global = |ranks: u64, batch: u64, j: u64| {
            let mut rows: Vec<u64> = (0..ranks)
                .flat_map(|r| {
                    let s = on(r, ranks, batch);
                    (j * batch..(j + 1) * batch)
                        .map(|p| s.index(0, p))
                        .collect::<Vec<_>>()
                })
                .collect();
            rows.sort_unstable();
            rows
        };
        let taken = on(2, 4, 3).state_at(0, 30);
        let three = on(1, 3, 4);
        let adopted = three.adopt(&taken).unwrap();
        assert_eq!((adopted.epoch, adopted.position, adopted.rank), (0, 40, 1));
        for j in 10..20 {
            assert_eq!(global(3, 4, j), global(4, 3, j), "global batch {j}");
        }
        // Another rank of the same ranks: the same position.
        assert_eq!(on(0, 4, 3).adopt(&taken).unwrap().position, 30);
        let e = on(0, 2, 5).adopt(&taken).unwrap_err().to_string();
        assert!(
            e.contains("global batch (batch × ranks) of 12, this sampler has 10"),
            "{e}"
        );
        let old = SamplerState { batch: 0, ..taken };
        let e = three.adopt(&old).unwrap_err().to_string();
        assert!(e.contains("does not say its batch size"), "{e}");
    }

    #[test]
    fn states_normalize_and_check() {
        let s = Sampler::new(config(10, Order::Shuffle)).unwrap();
        assert_eq!(s.state_at(0, 10), s.start(1));
        let mut other = s.state_at(1, 3);
        s.check_state(&other).unwrap();
        other.len = 11;
        assert!(s
            .check_state(&other)
            .unwrap_err()
            .to_string()
            .contains("dataset length 11"));
    }
}
