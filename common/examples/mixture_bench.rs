//! Mixed positions per second against a single dataset's shuffle, in one run:
//! `cargo run --release -p zr-common --example mixture_bench [-- --positions N]`.
//!
//! All fill batches of 1,024 indices: a shuffle of one dataset of 10⁸ records, a shuffle of
//! the mixture's largest member alone, and the mixture of three (7·10⁷, 2·10⁷, 10⁷) weighted
//! 0.7/0.2/0.1 — the same total — with a stage boundary halfway. A shuffle's cost per index
//! depends on its length (the Feistel permutation walks its cycle 2^⌈log₂ n⌉ / n times on
//! average: 1.34 for 10⁸, 1.92 for 7·10⁷), hence the second baseline.

use std::time::Instant;

use zr_common::{Mixture, MixtureConfig, Order, Sampler, SamplerConfig, Stage, Tail};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let positions: u64 = args
        .iter()
        .position(|a| a == "--positions")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000_000);
    let batch = 1024u64;
    let batches = positions / batch;
    let shuffle = Sampler::new(SamplerConfig {
        len: 100_000_000,
        order: Order::Shuffle,
        seed: 1,
        rank: 0,
        ranks: 1,
        batch,
        tail: Tail::Drop,
    })
    .expect("sampler");
    // The largest member alone: the same shuffle cost per draw as most of the mixture's
    // (a Feistel permutation walks its cycle 2^⌈log₂ n⌉ / n times per index on average).
    let largest = Sampler::new(SamplerConfig {
        len: 70_000_000,
        ..*shuffle.config()
    })
    .expect("sampler");
    let mixture = Mixture::new(MixtureConfig {
        lengths: vec![70_000_000, 20_000_000, 10_000_000],
        stages: vec![
            Stage::new(0, vec![0.7, 0.2, 0.1]),
            Stage::new(batches / 2, vec![0.5, 0.3, 0.2]),
        ],
        seed: 1,
        rank: 0,
        ranks: 1,
        batch,
    })
    .expect("mixture");
    let mut rates = (0.0, 0.0, 0.0);
    let mut sink = 0u64;
    let shuffled = |sampler: &Sampler, sink: &mut u64| {
        let started = Instant::now();
        let epoch = sampler.epoch(0);
        let mut out = Vec::with_capacity(batch as usize);
        for b in 0..batches {
            out.clear();
            epoch.fill(b * batch, (b + 1) * batch, &mut out);
            *sink ^= out[0];
        }
        positions as f64 / started.elapsed().as_secs_f64()
    };
    for _round in 0..3 {
        rates.0 += shuffled(&shuffle, &mut sink);
        rates.2 += shuffled(&largest, &mut sink);
        let started = Instant::now();
        let (mut sources, mut records) = (Vec::new(), Vec::new());
        for b in 0..batches {
            sources.clear();
            records.clear();
            mixture.fill(b, &mut sources, &mut records);
            sink ^= records[0];
        }
        rates.1 += positions as f64 / started.elapsed().as_secs_f64();
    }
    let (single, mixed, alone) = (rates.0 / 3.0, rates.1 / 3.0, rates.2 / 3.0);
    println!(
        "{positions} positions in batches of {batch} (checksum {}):\n  shuffle of one dataset of the same total (10^8)  {:>6.1} M/s\n  shuffle of the largest member alone (7*10^7)     {:>6.1} M/s\n  3-dataset mixture                                {:>6.1} M/s   mixture/same-total {:.2}x, mixture/largest {:.2}x",
        sink % 10,
        single / 1e6,
        alone / 1e6,
        mixed / 1e6,
        mixed / single,
        mixed / alone
    );
}
