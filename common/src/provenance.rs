//! What a run read at any step, computed from its description, not logged: a run's order is
//! a pure function of (lengths, seed, configuration), so global batch N — every rank's part
//! — can be listed after the fact, and the steps that read a record found.
//!
//! [`RunSpec`] is the description (`run.json`): versioned, what fixes the order (a sampler's
//! or a mixture's configuration), the datasets by name, and the blocklist.

use serde::{Deserialize, Serialize};

use crate::blocklist::Blocklist;
use crate::error::Error;
use crate::mixture::{Mixture, MixtureConfig};
use crate::sampler::{Sampler, SamplerConfig};
use crate::schedule::{BatchSchedule, RampSampler};

/// `format` of a run description.
pub const RUN_FORMAT: &str = "zrecord-run";
/// Version of the order functions and of the description: a description of another
/// version is refused (its steps would be computed by other rules).
pub const RUN_VERSION: u32 = 1;

/// What fixes a run's order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOrder {
    /// One dataset in a sampler's order (its `rank` is ignored: every rank is listed).
    Sampler(SamplerConfig),
    /// Several by a mixture (its `rank` is ignored).
    Mixture(MixtureConfig),
    /// Global batches whose size a schedule sets, over one dataset's shuffled order or a
    /// mixture's stream (of global batch 1).
    Ramp(RampConfig),
}

/// What fixes a ramped run's order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RampConfig {
    pub schedule: BatchSchedule,
    pub ranks: u64,
    /// The dataset's records and the seed of its shuffle (ignored over a mixture).
    #[serde(default)]
    pub len: u64,
    #[serde(default)]
    pub seed: u64,
    /// The mixture whose stream the steps read, if any.
    #[serde(default)]
    pub mixture: Option<MixtureConfig>,
}

/// A dataset of the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunDataset {
    pub name: String,
    /// Where it was read from (a directory, or a cluster dataset), if known.
    #[serde(default)]
    pub path: Option<String>,
    /// A token stream's documents packed into rows: its records are the rows.
    #[serde(default)]
    pub packing: Option<crate::packing::PackConfig>,
    /// A token stream read as windows or documents: its records are those.
    #[serde(default)]
    pub windows: Option<crate::windows::WindowMode>,
    /// Documents a packing does not read ([`crate::packing::PackPlan::block`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_documents: Vec<u64>,
}

/// A run's description (`run.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub format: String,
    pub version: u32,
    pub order: RunOrder,
    #[serde(default)]
    pub datasets: Vec<RunDataset>,
    /// `(dataset, record)` pairs not read.
    #[serde(default)]
    pub blocklist: Vec<(u32, u64)>,
}

/// One position of a global batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub rank: u64,
    /// Its place in the rank's batch.
    pub slot: u64,
    pub dataset: u32,
    pub record: u64,
    /// The record the order gave, where a blocklist replaced it.
    pub replaced: Option<u64>,
    /// The dataset's epoch this position reads in (in a mixture, that dataset's own).
    #[serde(default)]
    pub epoch: u64,
}

/// A run's order, ready to list steps.
pub enum Run {
    Sampler {
        ranks: Vec<Sampler>,
        plain: Vec<Sampler>,
    },
    Mixture {
        ranks: Vec<Mixture>,
        plain: Vec<Mixture>,
    },
    Ramp {
        ranks: Vec<RampSampler>,
    },
}

impl RunSpec {
    /// A description of `order` over `datasets`, not reading `blocklist`.
    pub fn new(order: RunOrder, datasets: Vec<RunDataset>, blocklist: Vec<(u32, u64)>) -> RunSpec {
        RunSpec {
            format: RUN_FORMAT.into(),
            version: RUN_VERSION,
            order,
            datasets,
            blocklist,
        }
    }

    /// Checks a description read from `run.json` (any serde format): its format and the
    /// version of the order functions.
    pub fn check(self) -> Result<RunSpec, Error> {
        let spec = self;
        if spec.format != RUN_FORMAT {
            return Err(Error::Sampler(format!(
                "not a run description: its format is '{}', not '{RUN_FORMAT}'",
                spec.format
            )));
        }
        if spec.version != RUN_VERSION {
            return Err(Error::Sampler(format!(
                "a run description of version {}, and this build computes version {RUN_VERSION}'s order",
                spec.version
            )));
        }
        Ok(spec)
    }

    /// Every rank's sampler or mixture, with the blocklist and without it.
    pub fn run(&self) -> Result<Run, Error> {
        match &self.order {
            RunOrder::Sampler(config) => {
                let list = Blocklist::new(&self.blocklist, &[config.len], config.seed)?;
                let plain: Vec<Sampler> = (0..config.ranks)
                    .map(|rank| Sampler::new(SamplerConfig { rank, ..*config }))
                    .collect::<Result<_, _>>()?;
                let ranks = plain
                    .iter()
                    .map(|s| s.clone().with_blocklist(list.clone()))
                    .collect();
                Ok(Run::Sampler { ranks, plain })
            }
            RunOrder::Mixture(config) => {
                let list = Blocklist::new(&self.blocklist, &config.lengths, config.seed)?;
                let plain: Vec<Mixture> = (0..config.ranks)
                    .map(|rank| {
                        Mixture::new(MixtureConfig {
                            rank,
                            ..config.clone()
                        })
                    })
                    .collect::<Result<_, _>>()?;
                let ranks = plain
                    .iter()
                    .map(|m| m.clone().with_blocklist(list.clone()))
                    .collect();
                Ok(Run::Mixture { ranks, plain })
            }
            RunOrder::Ramp(config) => {
                if !self.blocklist.is_empty() {
                    return Err(Error::Sampler(
                        "a run under a batch-size ramp takes no blocklist".into(),
                    ));
                }
                let ranks = (0..config.ranks)
                    .map(|rank| match &config.mixture {
                        Some(mixture) => RampSampler::over_mixture(
                            Mixture::new(mixture.clone())?,
                            rank,
                            config.ranks,
                            config.schedule.clone(),
                        ),
                        None => RampSampler::new(
                            config.len,
                            config.seed,
                            rank,
                            config.ranks,
                            config.schedule.clone(),
                        ),
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Run::Ramp { ranks })
            }
        }
    }
}

impl Run {
    /// Global batches of an epoch (`None`: the stream has no epochs).
    pub fn steps_per_epoch(&self) -> Option<u64> {
        match self {
            Run::Sampler { ranks, .. } => Some(ranks[0].batches_per_epoch()),
            Run::Mixture { .. } | Run::Ramp { .. } => None,
        }
    }

    /// Ranks of the run.
    pub fn ranks(&self) -> u64 {
        match self {
            Run::Sampler { ranks, .. } => ranks.len() as u64,
            Run::Mixture { ranks, .. } => ranks.len() as u64,
            Run::Ramp { ranks } => ranks.len() as u64,
        }
    }

    /// Global batch `step`: every rank's part, in rank order.
    pub fn manifest(&self, step: u64) -> Vec<Entry> {
        let mut out = Vec::new();
        match self {
            Run::Sampler { ranks, plain } => {
                let per_epoch = ranks[0].batches_per_epoch().max(1);
                let (epoch, k) = (step / per_epoch, step % per_epoch);
                for (rank, (sampler, bare)) in ranks.iter().zip(plain).enumerate() {
                    let batch = sampler.config().batch;
                    let items = sampler.items_per_epoch();
                    let start = k * batch;
                    let end = (start + batch).min(items);
                    let (with, without) = (sampler.epoch(epoch), bare.epoch(epoch));
                    for (slot, p) in (start..end).enumerate() {
                        let (record, given) = (with.index(p), without.index(p));
                        out.push(Entry {
                            rank: rank as u64,
                            slot: slot as u64,
                            dataset: 0,
                            record,
                            replaced: (record != given).then_some(given),
                            epoch,
                        });
                    }
                }
            }
            Run::Mixture { ranks, plain } => {
                let (mut sources, mut records, mut given) = (Vec::new(), Vec::new(), Vec::new());
                for (rank, (mixture, bare)) in ranks.iter().zip(plain).enumerate() {
                    sources.clear();
                    records.clear();
                    given.clear();
                    mixture.fill(step, &mut sources, &mut records);
                    bare.fill(step, &mut Vec::new(), &mut given);
                    let first = step * bare.global_batch() + rank as u64 * bare.config().batch;
                    for (slot, ((&source, &record), &was)) in
                        sources.iter().zip(&records).zip(&given).enumerate()
                    {
                        let (i, k) = bare.draw(first + slot as u64);
                        out.push(Entry {
                            rank: rank as u64,
                            slot: slot as u64,
                            dataset: source,
                            record,
                            replaced: (record != was).then_some(was),
                            epoch: k / bare.config().lengths[i].max(1),
                        });
                    }
                }
            }
            Run::Ramp { ranks } => {
                for (rank, sampler) in ranks.iter().enumerate() {
                    let part = sampler.manifest_at(step);
                    for (slot, (dataset, record, epoch)) in part.into_iter().enumerate() {
                        out.push(Entry {
                            rank: rank as u64,
                            slot: slot as u64,
                            dataset,
                            record,
                            replaced: None,
                            epoch,
                        });
                    }
                }
            }
        }
        out
    }

    /// The steps in `steps` whose global batch reads `record` of `dataset`.
    pub fn grep(&self, dataset: u32, record: u64, steps: std::ops::Range<u64>) -> Vec<u64> {
        match self {
            // A sampler's epoch is scanned position by position, no batch built.
            Run::Sampler { ranks, .. } if dataset == 0 => {
                let per_epoch = ranks[0].batches_per_epoch().max(1);
                let mut found = Vec::new();
                for step in steps {
                    let (epoch, k) = (step / per_epoch, step % per_epoch);
                    let hit = ranks.iter().any(|s| {
                        let batch = s.config().batch;
                        let end = ((k + 1) * batch).min(s.items_per_epoch());
                        let e = s.epoch(epoch);
                        (k * batch..end).any(|p| e.index(p) == record)
                    });
                    if hit {
                        found.push(step);
                    }
                }
                found
            }
            Run::Sampler { .. } => Vec::new(),
            Run::Mixture { .. } | Run::Ramp { .. } => steps
                .filter(|&step| {
                    self.manifest(step)
                        .iter()
                        .any(|e| e.dataset == dataset && e.record == record)
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mixture::Stage;
    use crate::sampler::{Order, Tail};

    fn sampler_spec(blocklist: Vec<(u32, u64)>) -> RunSpec {
        RunSpec::new(
            RunOrder::Sampler(SamplerConfig {
                len: 1024,
                order: Order::Shuffle,
                seed: 5,
                rank: 0,
                ranks: 4,
                batch: 8,
                tail: Tail::Drop,
            }),
            vec![RunDataset {
                name: "train".into(),
                ..RunDataset::default()
            }],
            blocklist,
        )
    }

    /// The manifest is what every rank's sampler reads, rank after rank.
    #[test]
    fn a_step_lists_what_each_rank_reads() {
        let spec = sampler_spec(Vec::new());
        let run = spec.run().unwrap();
        let per_epoch = run.steps_per_epoch().unwrap();
        for step in [0, 7, per_epoch - 1, per_epoch, 3 * per_epoch + 2] {
            let manifest = run.manifest(step);
            assert_eq!(manifest.len(), 4 * 8);
            for rank in 0..4u64 {
                let s = Sampler::new(SamplerConfig {
                    rank,
                    ..match spec.order {
                        RunOrder::Sampler(c) => c,
                        _ => unreachable!(),
                    }
                })
                .unwrap();
                let (epoch, k) = (step / per_epoch, step % per_epoch);
                let mut want = Vec::new();
                s.epoch(epoch).fill(k * 8, k * 8 + 8, &mut want);
                let got: Vec<u64> = manifest
                    .iter()
                    .filter(|e| e.rank == rank)
                    .map(|e| e.record)
                    .collect();
                assert_eq!(got, want, "step {step} rank {rank}");
            }
        }
        // And back: the steps that read a record.
        let record = run.manifest(5)[3].record;
        let found = run.grep(0, record, 0..per_epoch);
        assert_eq!(found, vec![5]);
    }

    /// A blocklist changes exactly the positions that read a blocked record, over an epoch.
    #[test]
    fn a_blocklist_changes_only_the_positions_of_blocked_records() {
        let blocked = vec![(0, 3), (0, 500), (0, 1023)];
        let (plain, with) = (
            sampler_spec(Vec::new()).run().unwrap(),
            sampler_spec(blocked).run().unwrap(),
        );
        let per_epoch = plain.steps_per_epoch().unwrap();
        let mut changed = 0;
        for step in 0..per_epoch {
            let (a, b) = (plain.manifest(step), with.manifest(step));
            for (x, y) in a.iter().zip(&b) {
                if [3, 500, 1023].contains(&x.record) {
                    assert_ne!(y.record, x.record);
                    assert!(![3, 500, 1023].contains(&y.record));
                    assert_eq!(y.replaced, Some(x.record));
                    changed += 1;
                } else {
                    assert_eq!(
                        y.record, x.record,
                        "step {step}: a position that read no blocked record changed"
                    );
                    assert_eq!(y.replaced, None);
                }
            }
        }
        assert_eq!(changed, 3, "each blocked record read once in the epoch");
    }

    #[test]
    fn a_mixture_step_and_its_blocklist() {
        let config = MixtureConfig {
            lengths: vec![100, 50],
            stages: vec![
                Stage::new(0, vec![1.0, 1.0]),
                Stage::new(10, vec![1.0, 3.0]),
            ],
            seed: 2,
            rank: 0,
            ranks: 2,
            batch: 6,
        };
        let spec = RunSpec::new(RunOrder::Mixture(config.clone()), Vec::new(), vec![(1, 7)]);
        let text = serde_json::to_string(&spec).unwrap();
        let parsed: RunSpec = serde_json::from_str(&text).unwrap();
        let run = parsed.check().unwrap().run().unwrap();
        for step in [0, 9, 10, 40] {
            let manifest = run.manifest(step);
            assert_eq!(manifest.len(), 12);
            for rank in 0..2 {
                let m = Mixture::new(MixtureConfig {
                    rank,
                    ..config.clone()
                })
                .unwrap();
                let (mut sources, mut records) = (Vec::new(), Vec::new());
                m.fill(step, &mut sources, &mut records);
                for (e, (&s, &r)) in manifest
                    .iter()
                    .filter(|e| e.rank == rank)
                    .zip(sources.iter().zip(&records))
                {
                    assert_eq!(e.dataset, s);
                    if (s, r) == (1, 7) {
                        assert_eq!(e.replaced, Some(7));
                    } else {
                        assert_eq!(e.record, r);
                    }
                }
            }
        }
        let mut other = serde_json::to_value(&spec).unwrap();
        other["version"] = serde_json::json!(99);
        let other: RunSpec = serde_json::from_value(other).unwrap();
        let e = other.check().unwrap_err();
        assert!(e.to_string().contains("version 99"), "{e}");
        let e = RunSpec::new(RunOrder::Mixture(config), Vec::new(), vec![(1, 50)]).run();
        assert!(e.is_err());
    }

    /// Each position says its dataset's epoch: a dataset's draws, in run order, go through
    /// every record once an epoch.
    #[test]
    fn a_mixture_position_says_its_datasets_epoch() {
        let config = MixtureConfig {
            lengths: vec![30, 7],
            stages: vec![Stage::new(0, vec![1.0, 1.0])],
            seed: 3,
            rank: 0,
            ranks: 3,
            batch: 2,
        };
        let run = RunSpec::new(RunOrder::Mixture(config), Vec::new(), Vec::new())
            .run()
            .unwrap();
        let mut seen: Vec<Vec<Vec<u64>>> = vec![Vec::new(), Vec::new()];
        for step in 0..40 {
            for e in run.manifest(step) {
                let epochs = &mut seen[e.dataset as usize];
                if epochs.len() <= e.epoch as usize {
                    assert_eq!(epochs.len(), e.epoch as usize, "epochs in order");
                    epochs.push(Vec::new());
                }
                epochs[e.epoch as usize].push(e.record);
            }
        }
        for (i, len) in [(0usize, 30u64), (1, 7)] {
            let epochs = &seen[i];
            assert!(epochs.len() >= 3, "dataset {i} ran {} epochs", epochs.len());
            for records in &epochs[..epochs.len() - 1] {
                let mut sorted = records.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..len).collect::<Vec<_>>(), "dataset {i}");
            }
        }
    }

    /// A ramped run's step lists what each rank's ramp reads there, found without taking
    /// the steps before; it takes no blocklist.
    #[test]
    fn a_ramped_step_lists_what_each_rank_reads() {
        let config = RampConfig {
            schedule: BatchSchedule::Ramp {
                start: 4,
                increment: 4,
                samples: 64,
                global: 16,
            },
            ranks: 2,
            len: 90,
            seed: 8,
            mixture: None,
        };
        let spec = RunSpec::new(RunOrder::Ramp(config.clone()), Vec::new(), Vec::new());
        let text = serde_json::to_string(&spec).unwrap();
        let run = serde_json::from_str::<RunSpec>(&text)
            .unwrap()
            .check()
            .unwrap()
            .run()
            .unwrap();
        let ranks: Vec<RampSampler> = (0..2)
            .map(|r| RampSampler::new(90, 8, r, 2, config.schedule.clone()).unwrap())
            .collect();
        let mut state = ranks[0].start();
        for step in 0..30 {
            let manifest = run.manifest(step);
            let mut want = Vec::new();
            for sampler in &ranks {
                want.extend(sampler.step(&state).0);
            }
            let got: Vec<u64> = manifest.iter().map(|e| e.record).collect();
            assert_eq!(got, want, "step {step}");
            assert!(manifest
                .iter()
                .all(|e| e.epoch == state.samples / 90 || e.epoch == state.samples / 90 + 1));
            state = ranks[0].step(&state).1;
        }
        let e = RunSpec::new(RunOrder::Ramp(config), Vec::new(), vec![(0, 1)]).run();
        assert!(e.err().unwrap().to_string().contains("no blocklist"));
    }
}
