//! Gather benchmark: random batches from a zrecord dataset next to the same gathers from one
//! plain memory-mapped file of fixed-size rows, measured in the same run.
//!
//! ```text
//! cargo run --release -p zr-node --example gather_bench -- [--gib 1] [--seconds 3] [--sizes 1024,16384]
//! ```
//! For each record size it writes ≥ `--gib` GiB of random records into a dataset and the same
//! bytes into a row file, warms both, then times batches of `--batch` random indices (the same
//! indices for every method), single-threaded:
//! - baseline: copy each row out of the mapped row file into one reused buffer;
//! - zero-copy gather: `Store::gather` (spans into the mapped chunks, no payload copied);
//! - materialized gather: `Store::gather` then `write_contiguous` into one reused buffer.

use std::fs::File;
use std::hint::black_box;
use std::io::{BufWriter, Write};
use std::path::Path;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Random-batch gather throughput of zrecord vs a plain mmap'd row file")]
struct Args {
    /// Data per record size, in GiB.
    #[arg(long, default_value_t = 1.0)]
    gib: f64,
    /// Seconds of timing per method and size.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Record sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1024,16384")]
    sizes: Vec<usize>,
    /// Indices per batch.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Where to build the data (default: a temporary directory, removed afterwards).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

#[path = "bench_util/mod.rs"]
mod bench_util;

use bench_util::{build_dataset, gather_data, median, time_batches, warm, Rng, ROUNDS};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    let root = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    println!(
        "gather benchmark: batches of {} random indices, one thread, warm page cache",
        args.batch
    );
    println!(
        "{:>8} {:<22} {:>14} {:>10} {:>12}",
        "record", "method", "records/s", "GiB/s", "vs baseline"
    );
    for &size in &args.sizes {
        run_size(&args, &root.join(format!("size-{size}")), size)?;
    }
    Ok(())
}

fn run_size(args: &Args, dir: &Path, size: usize) -> Result<(), Box<dyn std::error::Error>> {
    let n = ((args.gib * (1u64 << 30) as f64) / size as f64).ceil() as u64;
    std::fs::create_dir_all(dir)?;
    let rows_path = dir.join("rows.bin");
    let mut rows = BufWriter::with_capacity(8 << 20, File::create(&rows_path)?);
    let mut row_error = None;
    let store = build_dataset(&dir.join("dataset"), n, size, |bytes| {
        if let Err(e) = rows.write_all(bytes) {
            row_error.get_or_insert(e);
        }
    })?;
    if let Some(e) = row_error {
        return Err(e.into());
    }
    rows.flush()?;
    drop(rows);
    let mut rng = Rng(!(size as u64));

    let rows_file = File::open(&rows_path)?;
    // SAFETY: the row file is private to this benchmark and not modified while mapped.
    let rows_map = unsafe { memmap2::Mmap::map(&rows_file)? };

    // The same random batches for every method.
    let batches: Vec<Vec<u64>> = (0..256)
        .map(|_| (0..args.batch).map(|_| rng.next() % n).collect())
        .collect();

    // Warm: touch every page of both through the code paths timed below.
    let (mut data, mut offsets) = warm(&store)?;
    let mut sum = 0u64;
    for page in rows_map.chunks(4096) {
        sum = sum.wrapping_add(page[0] as u64);
    }
    black_box(sum);

    // Methods take turns in short rounds so a noisy neighbour hurts all alike; each figure
    // is the median of its rounds.
    // The baseline copies into a page-aligned buffer: its rows are page-aligned too, and a
    // malloc'd buffer (16 bytes past a page start) would put every copy into 4K aliasing and
    // make the baseline look several times slower than it is.
    let mut out_buf = vec![0u8; args.batch * size + 4096];
    let skip = out_buf.as_ptr().align_offset(4096);
    let out = &mut out_buf[skip..skip + args.batch * size];
    let round_seconds = args.seconds / ROUNDS as f64;
    let mut rates = [[0f64; ROUNDS]; 3];
    for round in 0..ROUNDS {
        #![allow(clippy::needless_range_loop)] // one index fills three tables
        rates[0][round] = time_batches(round_seconds, |b| {
            let indices = &batches[b % batches.len()];
            for (slot, &i) in out.chunks_exact_mut(size).zip(indices) {
                let start = i as usize * size;
                slot.copy_from_slice(&rows_map[start..start + size]);
            }
            black_box(&*out);
        });
        rates[1][round] = time_batches(round_seconds, |b| {
            let batch = store
                .gather(&batches[b % batches.len()], &["data"])
                .expect("gather");
            black_box(&batch);
        });
        rates[2][round] = time_batches(round_seconds, |b| {
            gather_data(&store, &batches[b % batches.len()], &mut data, &mut offsets)
                .expect("gather");
        });
    }
    let [baseline, zero_copy, materialized] = rates.map(|r| median(r.to_vec()));

    let report = |method: &str, batches_per_s: f64| {
        let records = batches_per_s * args.batch as f64;
        let gib = records * size as f64 / (1u64 << 30) as f64;
        println!(
            "{:>8} {:<22} {:>14.0} {:>10.2} {:>11.2}x",
            size,
            method,
            records,
            gib,
            batches_per_s / baseline
        );
    };
    report("baseline mmap rows", baseline);
    report("zero-copy gather", zero_copy);
    report("materialized gather", materialized);
    drop(store);
    std::fs::remove_dir_all(dir)?;
    Ok(())
}
