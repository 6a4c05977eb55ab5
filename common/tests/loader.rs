//! Loader and sampler properties: exact resume with prefetch in flight, order, errors, and
//! the statistical quality of the shuffle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use zr_common::feistel::Feistel;
use zr_common::{
    BoxError, Contiguous, GatherSource, Loader, LoaderOptions, Order, Sampler, SamplerConfig, Tail,
};

/// A source whose record i is `salt + i` as 8 little-endian bytes, `i % 5 + 1` times over
/// if `varying` (else once); fails on `fail_at`.
struct Echo {
    salt: u64,
    varying: bool,
    fail_at: Option<u64>,
    gathers: AtomicU64,
}

impl Echo {
    fn new() -> Arc<Echo> {
        Arc::new(Echo::with(0, false, None))
    }

    /// Records `salt + i` of varying lengths.
    fn salted(salt: u64) -> Arc<Echo> {
        Arc::new(Echo::with(salt, true, None))
    }

    fn with(salt: u64, varying: bool, fail_at: Option<u64>) -> Echo {
        Echo {
            salt,
            varying,
            fail_at,
            gathers: AtomicU64::new(0),
        }
    }
}

impl GatherSource for Echo {
    fn gather_into(
        &self,
        indices: &[u64],
        _fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), BoxError> {
        self.gathers.fetch_add(1, Ordering::Relaxed);
        if let Some(bad) = self.fail_at {
            if indices.contains(&bad) {
                return Err(format!("record {bad} is unreadable").into());
            }
        }
        columns.resize_with(1, Contiguous::default);
        let column = &mut columns[0];
        column.data.clear();
        column.offsets.clear();
        column.offsets.push(0);
        for &i in indices {
            let copies = if self.varying { i % 5 + 1 } else { 1 };
            for _ in 0..copies {
                column
                    .data
                    .extend_from_slice(&(self.salt + i).to_le_bytes());
            }
            column.offsets.push(column.data.len() as u64);
        }
        Ok(())
    }
}

type Seen = Vec<(u64, u64, Vec<u64>)>;

fn collect(loader: &mut Loader, limit: usize) -> Seen {
    let mut out = Vec::new();
    for batch in loader.by_ref().take(limit) {
        let batch = batch.unwrap();
        // The column matches the indices: the batch is the one its header says.
        for (k, &i) in batch.indices.iter().enumerate() {
            assert_eq!(batch.columns[0].get(k).unwrap(), &i.to_le_bytes());
        }
        out.push((batch.epoch, batch.position, batch.indices.clone()));
    }
    out
}

fn order_strategy() -> impl Strategy<Value = Order> {
    prop_oneof![
        Just(Order::Sequential),
        Just(Order::Random),
        Just(Order::Shuffle),
        (1u64..6, 1u64..6).prop_map(|(window, stride)| Order::Sliding { window, stride }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Cut a run anywhere, resume from `state()`: the concatenation is the uninterrupted run.
    #[test]
    fn resume_is_exact(
        len in 1u64..300,
        order in order_strategy(),
        ranks in 1u64..4,
        rank_pick in 0u64..4,
        batch in 1u64..17,
        pad in any::<bool>(),
        seed in any::<u64>(),
        prefetch in 1usize..6,
        workers in 1usize..4,
        cut_a in 0usize..40,
        cut_b in 0usize..40,
    ) {
        let config = SamplerConfig {
            len, order, seed, rank: rank_pick % ranks, ranks, batch,
            tail: if pad { Tail::Pad } else { Tail::Drop },
        };
        let Ok(sampler) = Sampler::new(config) else { return Ok(()) };
        let options = LoaderOptions { prefetch, workers, end_epoch: Some(3), ..LoaderOptions::default() };
        let start = sampler.start(0);

        let mut whole = Loader::new(Echo::new(), sampler.clone(), start, options.clone()).unwrap();
        let expected = collect(&mut whole, usize::MAX);
        prop_assert_eq!(expected.len() as u64, 3 * sampler.batches_per_epoch());

        let mut got = Vec::new();
        let mut state = start;
        for cut in [cut_a, cut_b, usize::MAX] {
            let mut part = Loader::new(Echo::new(), sampler.clone(), state, options.clone()).unwrap();
            got.extend(collect(&mut part, cut));
            state = part.state();
            // `part` is dropped here with prefetched batches still queued.
        }
        prop_assert_eq!(got, expected);
    }
}

#[test]
fn batches_follow_the_sampler() {
    let sampler = Sampler::new(SamplerConfig {
        len: 10,
        order: Order::Sequential,
        seed: 0,
        rank: 1,
        ranks: 2,
        batch: 2,
        tail: Tail::Drop,
    })
    .unwrap();
    let options = LoaderOptions {
        end_epoch: Some(2),
        ..LoaderOptions::default()
    };
    let mut loader = Loader::new(Echo::new(), sampler.clone(), sampler.start(0), options).unwrap();
    let seen = collect(&mut loader, usize::MAX);
    let indices: Vec<Vec<u64>> = seen.iter().map(|s| s.2.clone()).collect();
    assert_eq!(
        indices,
        vec![
            vec![1, 3],
            vec![5, 7],
            vec![9],
            vec![1, 3],
            vec![5, 7],
            vec![9]
        ]
    );
    assert_eq!(loader.state(), sampler.start(2));
}

#[test]
fn a_failed_gather_ends_the_run_with_its_error() {
    let sampler = Sampler::new(SamplerConfig {
        len: 100,
        order: Order::Sequential,
        seed: 0,
        rank: 0,
        ranks: 1,
        batch: 10,
        tail: Tail::Drop,
    })
    .unwrap();
    let source = Arc::new(Echo::with(0, false, Some(35)));
    let mut loader = Loader::new(
        source,
        sampler.clone(),
        sampler.start(0),
        LoaderOptions::default(),
    )
    .unwrap();
    for _ in 0..3 {
        loader.next().unwrap().unwrap();
    }
    let err = loader.next().unwrap().unwrap_err();
    assert!(
        err.to_string().contains("positions 30..40") && err.to_string().contains("record 35"),
        "{err}"
    );
    assert!(loader.next().is_none());
    assert_eq!(
        loader.state(),
        sampler.state_at(0, 30),
        "the failed batch is not consumed"
    );
}

#[test]
fn dropping_stops_the_workers() {
    let sampler = Sampler::new(SamplerConfig {
        len: 1000,
        order: Order::Shuffle,
        seed: 1,
        rank: 0,
        ranks: 1,
        batch: 10,
        tail: Tail::Drop,
    })
    .unwrap();
    let source = Echo::new();
    let loader = Loader::new(
        Arc::clone(&source),
        sampler.clone(),
        sampler.start(0),
        LoaderOptions::default(),
    )
    .unwrap();
    drop(loader); // unbounded run: returns only if the workers stop
    let after = source.gathers.load(Ordering::Relaxed);
    assert!(
        after <= 2 * 4,
        "workers kept gathering ({after} gathers) past the queue bound"
    );
    assert_eq!(
        Arc::strong_count(&source),
        1,
        "a worker still holds the source"
    );
}

#[test]
fn resume_rejects_a_foreign_checkpoint() {
    let config = SamplerConfig {
        len: 50,
        order: Order::Shuffle,
        seed: 3,
        rank: 0,
        ranks: 2,
        batch: 4,
        tail: Tail::Drop,
    };
    let a = Sampler::new(config).unwrap();
    // Another rank's state is this rank's too (the same global batches consumed).
    let b = Sampler::new(SamplerConfig { rank: 1, ..config }).unwrap();
    let loader = Loader::new(Echo::new(), b, a.state_at(0, 8), LoaderOptions::default()).unwrap();
    assert_eq!((loader.state().position, loader.state().rank), (8, 1));
    // Another global batch, or another dataset, is refused by name.
    let c = Sampler::new(SamplerConfig {
        ranks: 3,
        rank: 2,
        ..config
    })
    .unwrap();
    let err = Loader::new(Echo::new(), c, a.state_at(0, 8), LoaderOptions::default())
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("global batch (batch × ranks) of 8, this sampler has 12"),
        "{err}"
    );
    let d = Sampler::new(SamplerConfig { len: 51, ..config }).unwrap();
    let err = Loader::new(Echo::new(), d, a.state_at(0, 8), LoaderOptions::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("dataset length 50"), "{err}");
}

#[test]
fn shuffle_is_a_bijection_at_scale() {
    // ~10^7: a large prime-free size, every index checked once.
    let n = 10_000_019u64;
    let p = Feistel::new(n, 42);
    let mut seen = vec![0u64; n.div_ceil(64) as usize];
    for x in 0..n {
        let y = p.apply(x);
        assert!(y < n);
        let (word, bit) = ((y / 64) as usize, y % 64);
        assert!(seen[word] & (1 << bit) == 0, "{y} hit twice");
        seen[word] |= 1 << bit;
    }
}

#[test]
fn shuffle_is_well_mixed() {
    let n = 100_000u64;
    for seed in [0u64, 1, 99] {
        for epoch in [0u64, 5] {
            let sampler = Sampler::new(SamplerConfig::shuffle(n, seed)).unwrap();
            let e = sampler.epoch(epoch);
            let perm: Vec<f64> = (0..n).map(|p| e.index(p) as f64).collect();
            // Mean displacement |π(i) − i| of a uniform permutation is n/3.
            let displacement: f64 = perm
                .iter()
                .enumerate()
                .map(|(i, &y)| (y - i as f64).abs())
                .sum::<f64>()
                / n as f64;
            assert!(
                (displacement / (n as f64 / 3.0) - 1.0).abs() < 0.02,
                "mean displacement {displacement}"
            );
            // Consecutive outputs are uncorrelated, and neither are outputs with their inputs.
            let corr = |xs: &[f64], ys: &[f64]| {
                let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
                let (mx, my) = (mean(xs), mean(ys));
                let cov: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
                let vx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
                let vy: f64 = ys.iter().map(|y| (y - my).powi(2)).sum();
                cov / (vx * vy).sqrt()
            };
            let adjacent = corr(&perm[..n as usize - 1], &perm[1..]);
            assert!(
                adjacent.abs() < 0.02,
                "adjacent-pair correlation {adjacent}"
            );
            let identity: Vec<f64> = (0..n).map(|i| i as f64).collect();
            let with_input = corr(&identity, &perm);
            assert!(
                with_input.abs() < 0.02,
                "input-output correlation {with_input}"
            );
            // Runs of consecutive values (π(i+1) = π(i) + 1) are as rare as chance makes them.
            let runs = perm.windows(2).filter(|w| w[1] == w[0] + 1.0).count();
            assert!(runs < 10, "{runs} consecutive pairs");
        }
    }
}

fn mixture(rank: u64, ranks: u64) -> zr_common::Mixture {
    zr_common::Mixture::new(zr_common::MixtureConfig {
        lengths: vec![300, 70, 20],
        stages: vec![
            zr_common::Stage::new(0, vec![0.6, 0.3, 0.1]),
            zr_common::Stage::new(8, vec![0.1, 0.1, 0.8]),
        ],
        seed: 5,
        rank,
        ranks,
        batch: 12 / ranks,
    })
    .unwrap()
}

fn sources() -> Vec<Arc<dyn GatherSource>> {
    vec![
        Echo::salted(0),
        Echo::salted(1_000_000),
        Echo::salted(2_000_000),
    ]
}

/// Each row as (source, its payload's first value, its length), checked against the record
/// the mixture says it is.
fn rows(batch: &zr_common::LoadedBatch) -> Vec<(u32, u64)> {
    let column = &batch.columns[0];
    (0..batch.indices.len())
        .map(|k| {
            let payload = column.get(k).unwrap();
            let (s, i) = (batch.sources[k], batch.indices[k]);
            assert_eq!(payload.len() as u64, 8 * (i % 5 + 1));
            let value = u64::from_le_bytes(payload[..8].try_into().unwrap());
            assert_eq!(value, s as u64 * 1_000_000 + i);
            (s, i)
        })
        .collect()
}

#[test]
fn a_mixture_loader_resumes_exactly_under_other_ranks_with_prefetch_in_flight() {
    let options = || LoaderOptions {
        prefetch: 4,
        workers: 2,
        ..LoaderOptions::default()
    };
    let one = mixture(0, 1);
    let start = one.state_at(0);
    let whole: Vec<Vec<(u32, u64)>> =
        zr_common::MixtureLoader::new(sources(), one, &start, options())
            .unwrap()
            .take(20)
            .map(|b| rows(&b.unwrap()))
            .collect();
    // 4 ranks for 5 global batches (prefetch running ahead), then 3 ranks, across the stage
    // boundary at 8: each rank's rows are its slice of the same global batch.
    let mut state = start;
    let mut chained: Vec<Vec<(u32, u64)>> = vec![Vec::new(); 20];
    for (ranks, count) in [(4u64, 5usize), (3, 15)] {
        let mut next = None;
        for rank in 0..ranks {
            let mut loader =
                zr_common::MixtureLoader::new(sources(), mixture(rank, ranks), &state, options())
                    .unwrap();
            for (k, batch) in loader.by_ref().take(count).enumerate() {
                let b = batch.unwrap();
                chained[b.position as usize].extend(rows(&b));
                assert_eq!(b.position, state.batches + k as u64);
            }
            next = Some(loader.state());
        }
        state = next.unwrap();
    }
    assert_eq!(chained, whole);
    let e =
        zr_common::MixtureLoader::new(sources()[..2].to_vec(), mixture(0, 1), &state, options())
            .err()
            .unwrap();
    assert!(
        e.to_string()
            .contains("3 datasets and the loader was given 2"),
        "{e}"
    );
}

fn ramp(rank: u64, ranks: u64) -> zr_common::RampSampler {
    let schedule = zr_common::BatchSchedule::Ramp {
        start: 8,
        increment: 8,
        samples: 96,
        global: 24,
    };
    zr_common::RampSampler::new(100, 3, rank, ranks, schedule).unwrap()
}

/// Runs `ranks` loaders of `make(rank, ranks)` from `state` for `steps` steps each; returns
/// the global batches they read (ranks' parts in rank order) and the checkpoint after.
fn ramp_run(
    make: &dyn Fn(u64, u64) -> zr_common::RampSampler,
    sources: &dyn Fn() -> Vec<Arc<dyn GatherSource>>,
    ranks: u64,
    state: &zr_common::RampState,
    steps: usize,
) -> (Vec<Vec<(u32, u64)>>, zr_common::RampState) {
    let options = LoaderOptions {
        prefetch: 5,
        workers: 3,
        ..LoaderOptions::default()
    };
    let mut global: Vec<Vec<(u32, u64)>> = vec![Vec::new(); steps];
    let mut after = None;
    for rank in 0..ranks {
        let mut loader =
            zr_common::RampLoader::new(sources(), make(rank, ranks), state, options.clone())
                .unwrap();
        for (k, batch) in loader.by_ref().take(steps).enumerate() {
            let b = batch.unwrap();
            assert_eq!(b.position, state.steps + k as u64, "steps in order");
            let column = &b.columns[0];
            for (j, &i) in b.indices.iter().enumerate() {
                let s = b.sources.get(j).copied().unwrap_or(0);
                let payload = column.get(j).unwrap();
                let value = u64::from_le_bytes(payload[..8].try_into().unwrap());
                assert_eq!(value, s as u64 * 1_000_000 + i, "the row is its record");
                global[k].push((s, i));
            }
        }
        let state = loader.state();
        assert!(
            after.as_ref().is_none_or(|a| *a == state),
            "one state on every rank"
        );
        after = Some(state);
    }
    (global, after.unwrap())
}

/// A ramped loader reads the ramp's steps, gathered; resumed from its checkpoint under
/// other numbers of ranks (with prefetch running ahead) it reads the same global stream.
#[test]
fn a_ramp_loader_resumes_exactly_under_other_ranks() {
    let lone = || -> Vec<Arc<dyn GatherSource>> { vec![Echo::salted(0)] };
    let start = ramp(0, 1).start();
    let (whole, _) = ramp_run(&ramp, &lone, 1, &start, 12);
    let sizes: Vec<usize> = whole.iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        [8, 8, 8, 8, 8, 8, 16, 16, 16, 24, 24, 24],
        "the ramp's sizes"
    );
    // Against the planner itself.
    let (mut state, sampler) = (start.clone(), ramp(0, 1));
    for batch in &whole {
        let (records, next) = sampler.step(&state);
        assert_eq!(batch.iter().map(|r| r.1).collect::<Vec<_>>(), records);
        state = next;
    }
    let (mut chained, mut state) = (Vec::new(), start);
    for (ranks, steps) in [(4u64, 3usize), (8, 5), (2, 4)] {
        let (part, next) = ramp_run(&ramp, &lone, ranks, &state, steps);
        chained.extend(part);
        state = next;
    }
    assert_eq!(chained, whole);
    // A schedule that would have sized the steps taken otherwise is refused, naming the step.
    let three =
        zr_common::RampSampler::new(100, 3, 0, 3, zr_common::BatchSchedule::Stages(vec![(0, 9)]))
            .unwrap();
    let e = zr_common::RampLoader::new(lone(), three, &state, LoaderOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("step 0"), "{e}");
}

/// Over a mixture, each row comes from its own dataset, and a resume under other ranks
/// reads on exactly.
#[test]
fn a_ramp_loader_reads_a_mixture() {
    let make = |rank, ranks| {
        let schedule = zr_common::BatchSchedule::Stages(vec![(0, 4), (40, 12)]);
        let mut config = mixture(0, 1).config().clone();
        config.batch = 1;
        let mixture = zr_common::Mixture::new(config).unwrap();
        zr_common::RampSampler::over_mixture(mixture, rank, ranks, schedule).unwrap()
    };
    let start = make(0, 1).start();
    let (whole, _) = ramp_run(&make, &sources, 1, &start, 16);
    assert!(
        whole.iter().flatten().any(|r| r.0 == 2),
        "the third dataset is read"
    );
    let (mut chained, mut state) = (Vec::new(), start);
    for (ranks, steps) in [(2u64, 7usize), (4, 9)] {
        let (part, next) = ramp_run(&make, &sources, ranks, &state, steps);
        chained.extend(part);
        state = next;
    }
    assert_eq!(chained, whole);
    let e = zr_common::RampLoader::new(
        sources()[..1].to_vec(),
        make(0, 1),
        &state,
        LoaderOptions::default(),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("3 datasets"), "{e}");
}

/// A token-budget loader hands out the budget's steps with every micro-batch gathered, the
/// same count on every rank; resumed from its checkpoint under other ranks and
/// accumulation, the run's micro-batches go on as an uninterrupted run's.
#[test]
fn a_budget_loader_resumes_exactly_under_other_ranks() {
    use zr_common::budget::{Cost, Remainder, TooLong};
    let lengths: Vec<u64> = (0..300u64).map(|i| i % 5 + 1).collect();
    let config = |ranks, accumulation| zr_common::BudgetConfig {
        max_tokens: 12,
        cost: Cost::Packed,
        lookahead: 16,
        ranks,
        accumulation,
        remainder: Remainder::Carry,
        too_long: TooLong::Refuse,
        seed: 4,
    };
    let options = LoaderOptions {
        prefetch: 3,
        workers: 2,
        ..LoaderOptions::default()
    };
    // The run's micro-batches in order, from `ranks` loaders taking `steps` steps.
    let run = |ranks: u32, accumulation: u32, state: zr_common::BudgetState, steps: usize| {
        let mut step_micro: Vec<Vec<(u32, u32, Vec<u64>)>> = vec![Vec::new(); steps];
        let mut after = None;
        for rank in 0..ranks {
            let budget =
                zr_common::TokenBudget::new(lengths.clone(), config(ranks, accumulation)).unwrap();
            let mut loader =
                zr_common::BudgetLoader::new(Echo::salted(0), budget, rank, state, options.clone())
                    .unwrap();
            for (k, step) in loader.by_ref().take(steps).enumerate() {
                let step = step.unwrap();
                assert_eq!(step.micro.len(), accumulation as usize, "rank {rank}");
                for (j, micro) in step.micro.iter().enumerate() {
                    let micro = micro.as_ref().unwrap();
                    let column = &micro.columns[0];
                    let tokens: u64 = (0..micro.indices.len())
                        .map(|e| column.get(e).unwrap().len() as u64 / 8)
                        .sum();
                    assert!(tokens <= 12, "a micro-batch of {tokens} tokens");
                    step_micro[k].push((j as u32, rank, micro.indices.clone()));
                }
            }
            after = Some(loader.state());
        }
        let mut out = Vec::new();
        for mut step in step_micro {
            step.sort_by_key(|m| (m.0, m.1)); // run order: j·R + r
            out.extend(step.into_iter().map(|m| m.2));
        }
        (out, after.unwrap())
    };
    let (whole, _) = run(1, 1, zr_common::BudgetState::default(), 120);
    let (mut chained, mut state) = (Vec::new(), zr_common::BudgetState::default());
    for (ranks, accumulation, steps) in [(2, 3, 5), (3, 1, 10), (1, 2, 30)] {
        let (part, next) = run(ranks, accumulation, state, steps);
        chained.extend(part);
        state = next;
    }
    assert_eq!(chained[..], whole[..chained.len()]);
    assert!(chained.len() >= 100);
    let budget = zr_common::TokenBudget::new(lengths.clone(), config(2, 1)).unwrap();
    let e = zr_common::BudgetLoader::new(Echo::salted(0), budget, 2, state, options)
        .err()
        .unwrap();
    assert!(e.to_string().contains("rank 2"), "{e}");
}
