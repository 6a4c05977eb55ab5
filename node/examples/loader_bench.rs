//! Sampler and loader benchmark, each next to its baseline measured in the same run.
//!
//! ```text
//! cargo run --release -p zr-node --example loader_bench -- [--perm-len 100000000] [--gib 1] [--seconds 3]
//! ```
//! 1. Shuffle indices: the Feistel permutation (O(1) memory) vs a precomputed permutation
//!    (Fisher–Yates into a table of `--perm-len` u64, then read in order), one core.
//! 2. Loading: batches of 1,024 shuffled 1 KiB records through the prefetching loader vs the
//!    same gathers (materialized) done directly on the calling thread.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use zr_common::{Loader, LoaderOptions, Order, Sampler, SamplerConfig, Tail};

#[path = "bench_util/mod.rs"]
mod bench_util;

use bench_util::{build_dataset, median, time_batches, warm, Rng};

#[derive(Parser)]
#[command(about = "Feistel shuffle vs a precomputed permutation; loader vs direct gathers")]
struct Args {
    /// Domain of the permutation benchmark.
    #[arg(long, default_value_t = 100_000_000)]
    perm_len: u64,
    /// Size of the 1 KiB-record dataset for the loader benchmark, in GiB.
    #[arg(long, default_value_t = 1.0)]
    gib: f64,
    /// Seconds per loader measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Indices per batch.
    #[arg(long, default_value_t = 1024)]
    batch: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    permutation(&args)?;
    loading(&args)
}

fn permutation(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let n = args.perm_len;
    let sampler = Sampler::new(SamplerConfig::shuffle(n, 1))?;
    let epoch = sampler.epoch(0);
    let started = Instant::now();
    let mut sum = 0u64;
    for p in 0..n {
        sum = sum.wrapping_add(epoch.index(p));
    }
    black_box(sum);
    let feistel_s = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut table: Vec<u64> = (0..n).collect();
    let mut rng = Rng(7);
    for i in (1..n as usize).rev() {
        let j = ((rng.next() as u128 * (i as u128 + 1)) >> 64) as usize;
        table.swap(i, j);
    }
    let build_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut sum = 0u64;
    for &x in &table {
        sum = sum.wrapping_add(x);
    }
    black_box(sum);
    let read_s = started.elapsed().as_secs_f64();

    let rate = |seconds: f64| n as f64 / seconds / 1e6;
    println!("shuffle of N = {n}, one core (M indices/s; memory)");
    println!(
        "  feistel permutation        {:>8.1} M/s   {} bytes",
        rate(feistel_s),
        std::mem::size_of_val(&epoch)
    );
    println!(
        "  precomputed, build + read  {:>8.1} M/s   {} MiB   (build {:.2} s per epoch)",
        rate(build_s + read_s),
        (n * 8) >> 20,
        build_s
    );
    println!("  precomputed, read only     {:>8.1} M/s", rate(read_s));
    println!(
        "  feistel vs build + read    {:>8.2}x",
        (build_s + read_s) / feistel_s
    );
    Ok(())
}

fn loading(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let size = 1024usize;
    let n = ((args.gib * (1u64 << 30) as f64) / size as f64).ceil() as u64;
    let tmp = tempfile::tempdir()?;
    let store = Arc::new(build_dataset(&tmp.path().join("dataset"), n, size, |_| {})?);
    let sampler = Sampler::new(SamplerConfig {
        len: n,
        order: Order::Shuffle,
        seed: 5,
        rank: 0,
        ranks: 1,
        batch: args.batch,
        tail: Tail::Drop,
    })?;
    // Warm the page cache and the mappings.
    let (mut data, mut offsets) = warm(&store)?;

    let per_epoch = sampler.batches_per_epoch();
    let mut indices = Vec::new();
    let direct = |data: &mut Vec<u8>, offsets: &mut Vec<u64>, indices: &mut Vec<u64>| {
        time_batches(args.seconds, |b| {
            let b = b as u64 % per_epoch;
            indices.clear();
            let end = ((b + 1) * args.batch).min(sampler.items_per_epoch());
            sampler.epoch(0).fill(b * args.batch, end, indices);
            let batch = store.gather(indices, &["data"]).expect("gather");
            batch
                .field("data")
                .expect("field")
                .write_contiguous(data, offsets);
            black_box(&data);
        })
    };
    let through_loader = |workers: usize, prefetch: usize| -> f64 {
        let options = LoaderOptions {
            fields: vec!["data".into()],
            prefetch,
            workers,
            end_epoch: None,
        };
        let mut loader = Loader::new(
            Arc::clone(&store),
            sampler.clone(),
            sampler.start(0),
            options,
        )
        .expect("loader");
        time_batches(args.seconds, |_| {
            let batch = loader.next().expect("unbounded").expect("gather");
            black_box(&batch.columns[0].data);
        })
    };

    println!(
        "loading batches of {} shuffled {size} B records ({n} records)",
        args.batch
    );
    println!(
        "  {:<34} {:>10} {:>8} {:>12}",
        "method", "batches/s", "GiB/s", "vs direct"
    );
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    let configs = [(1usize, 0usize), (1, 2), (1, 4), (2, 4)];
    let mut direct_rates = Vec::new();
    let mut loader_rates = vec![Vec::new(); configs.len()];
    for _ in 0..3 {
        direct_rates.push(direct(&mut data, &mut offsets, &mut indices));
        for (k, &(workers, prefetch)) in configs.iter().enumerate() {
            loader_rates[k].push(through_loader(workers, prefetch));
        }
    }
    let direct_rate = median(direct_rates);
    rows.push(("direct gather, calling thread".into(), vec![direct_rate]));
    for (k, &(workers, prefetch)) in configs.iter().enumerate() {
        rows.push((
            format!("loader, {workers} worker(s), prefetch {prefetch}"),
            vec![median(loader_rates[k].clone())],
        ));
    }
    for (name, rate) in rows {
        let rate = rate[0];
        let gib = rate * args.batch as f64 * size as f64 / (1u64 << 30) as f64;
        println!(
            "  {name:<34} {rate:>10.0} {gib:>8.2} {:>11.2}x",
            rate / direct_rate
        );
    }
    Ok(())
}
