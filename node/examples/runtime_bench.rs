//! Runtime benchmark: gathers with 1, 2 and 4 reader threads and appends with 1 and 2
//! writers, each next to a plain baseline measured in the same run.
//!
//! ```text
//! cargo run --release -p zr-node --example runtime_bench -- [--gib 1] [--seconds 3]
//! ```
//! Gathers: batches of 1,024 random records, materialized into one buffer, for 1 KiB raw,
//! 16 KiB raw and 4 KiB flate records; baseline: the same rows copied out of one plain
//! memory-mapped file (one thread). Appends: 1 KiB raw and 4 KiB flate records in calls of
//! 1,024, committed at the end; baseline: writing the same bytes to one file and fdatasync.

use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use clap::Parser;
use zr_node::{Compression, CreateOptions, FieldSpec, Record, RuntimeOptions, Store};

#[path = "bench_util/mod.rs"]
mod bench_util;

use bench_util::{build_field, gather_data, median, time_batches, Rng};

#[derive(Parser)]
#[command(about = "Gather throughput by reader count, append throughput by writer count")]
struct Args {
    /// Logical data per dataset, in GiB.
    #[arg(long, default_value_t = 1.0)]
    gib: f64,
    /// Seconds per gather measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
}

const BATCH: usize = 1024;

/// Record bytes: random for raw fields, a 16-letter alphabet (compresses ~2×) for flate.
fn fill(rng: &mut Rng, out: &mut [u8], compress: Compression) {
    rng.fill(out);
    if compress == Compression::Flate {
        for b in out.iter_mut() {
            *b = b'a' + (*b & 15);
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    println!("gathers: batches of {BATCH} random records, materialized; baseline = plain mmap rows, 1 thread");
    println!(
        "{:>16} {:<22} {:>12} {:>8} {:>12}",
        "records", "method", "records/s", "GiB/s", "vs baseline"
    );
    for (size, compress) in [
        (1024, Compression::Raw),
        (16384, Compression::Raw),
        (4096, Compression::Flate),
    ] {
        gathers(&args, &tmp.path().join(format!("g{size}")), size, compress)?;
    }
    println!();
    println!("appends: calls of {BATCH} records, one commit; baseline = write + fdatasync of the same bytes");
    println!(
        "{:>16} {:<22} {:>12} {:>12}",
        "records", "method", "MiB/s", "vs baseline"
    );
    for (size, compress) in [(1024, Compression::Raw), (4096, Compression::Flate)] {
        appends(&args, &tmp.path().join(format!("a{size}")), size, compress)?;
    }
    Ok(())
}

fn label(size: usize, compress: Compression) -> String {
    format!(
        "{} KiB {}",
        size / 1024,
        if compress == Compression::Raw {
            "raw"
        } else {
            "flate"
        }
    )
}

fn gathers(
    args: &Args,
    dir: &Path,
    size: usize,
    compress: Compression,
) -> Result<(), Box<dyn std::error::Error>> {
    let n = ((args.gib * (1u64 << 30) as f64) / size as f64).ceil() as u64;
    std::fs::create_dir_all(dir)?;
    let rows_path = dir.join("rows.bin");
    let mut rows = std::io::BufWriter::new(File::create(&rows_path)?);
    let mut row_error = None;
    let spec = FieldSpec::new("data", compress);
    let fill = |rng: &mut Rng, bytes: &mut [u8]| fill(rng, bytes, compress);
    drop(build_field(
        &dir.join("ds"),
        n,
        size,
        spec,
        fill,
        |bytes| {
            if let Err(e) = rows.write_all(bytes) {
                row_error.get_or_insert(e);
            }
        },
    )?);
    if let Some(e) = row_error {
        return Err(e.into());
    }
    rows.flush()?;
    drop(rows);
    let rows_file = File::open(&rows_path)?;
    // SAFETY: the row file is private to this benchmark and not modified while mapped.
    let rows_map = unsafe { memmap2::Mmap::map(&rows_file)? };
    let mut rng = Rng(!(size as u64));
    let batches: Vec<Vec<u64>> = (0..128)
        .map(|_| (0..BATCH).map(|_| rng.next() % n).collect())
        .collect();
    let stores: Vec<(usize, Store)> = [1, 2, 4]
        .into_iter()
        .map(|readers| {
            let runtime = RuntimeOptions {
                readers,
                ..RuntimeOptions::default()
            };
            Store::open_read_only_with(dir.join("ds"), runtime).map(|s| (readers, s))
        })
        .collect::<Result<_, _>>()?;
    // Warm the page cache and every mapping.
    let (mut data, mut offsets) = (Vec::new(), Vec::new());
    let all: Vec<u64> = (0..n).collect();
    for (_, store) in &stores {
        for part in all.chunks(4096) {
            gather_data(store, part, &mut data, &mut offsets)?;
        }
    }
    black_box(rows_map.chunks(4096).map(|p| p[0] as u64).sum::<u64>());

    let mut out_buf = vec![0u8; BATCH * size + 4096];
    let skip = out_buf.as_ptr().align_offset(4096);
    let out = &mut out_buf[skip..skip + BATCH * size];
    let round_seconds = args.seconds / 3.0;
    let mut rates = vec![Vec::new(); 1 + stores.len()];
    for _ in 0..3 {
        rates[0].push(time_batches(round_seconds, |b| {
            for (slot, &i) in out.chunks_exact_mut(size).zip(&batches[b % batches.len()]) {
                let start = i as usize * size;
                slot.copy_from_slice(&rows_map[start..start + size]);
            }
            black_box(&*out);
        }));
        for (k, (_, store)) in stores.iter().enumerate() {
            rates[k + 1].push(time_batches(round_seconds, |b| {
                gather_data(store, &batches[b % batches.len()], &mut data, &mut offsets)
                    .expect("gather");
            }));
        }
    }
    let rates: Vec<f64> = rates.into_iter().map(median).collect();
    let names = std::iter::once("baseline mmap rows".to_string())
        .chain(stores.iter().map(|(r, _)| format!("gather, {r} reader(s)")));
    for (name, rate) in names.zip(&rates) {
        let records = rate * BATCH as f64;
        println!(
            "{:>16} {:<22} {:>12.0} {:>8.2} {:>11.2}x",
            label(size, compress),
            name,
            records,
            records * size as f64 / (1u64 << 30) as f64,
            rate / rates[0]
        );
    }
    drop(stores);
    std::fs::remove_dir_all(dir)?;
    Ok(())
}

fn appends(
    args: &Args,
    dir: &Path,
    size: usize,
    compress: Compression,
) -> Result<(), Box<dyn std::error::Error>> {
    let n = ((args.gib / 2.0 * (1u64 << 30) as f64) / size as f64).ceil() as u64;
    std::fs::create_dir_all(dir)?;
    let mut rng = Rng(size as u64 + 1);
    let mut data = vec![0u8; 64 * BATCH * size];
    fill(&mut rng, &mut data, compress);
    let total_bytes = n * size as u64;
    let slice = |i: u64| -> &[u8] {
        let at = (i as usize % (data.len() / size)) * size;
        &data[at..at + size]
    };

    let started = Instant::now();
    let mut file = std::io::BufWriter::with_capacity(8 << 20, File::create(dir.join("plain.bin"))?);
    let mut i = 0;
    while i < n {
        let count = BATCH.min((n - i) as usize) as u64;
        for k in i..i + count {
            file.write_all(slice(k))?;
        }
        i += count;
    }
    file.flush()?;
    file.get_ref().sync_data()?;
    let baseline = total_bytes as f64 / started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(dir.join("plain.bin"))?;
    println!(
        "{:>16} {:<22} {:>12.0} {:>11.2}x",
        label(size, compress),
        "baseline write+fsync",
        baseline / (1 << 20) as f64,
        1.0
    );
    for writers in [1, 2] {
        let path = dir.join(format!("w{writers}"));
        let runtime = RuntimeOptions {
            writers,
            ..RuntimeOptions::default()
        };
        let store = Store::create_with(
            &path,
            vec![FieldSpec::new("data", compress)],
            CreateOptions::default(),
            runtime,
        )?;
        let started = Instant::now();
        let mut i = 0;
        while i < n {
            let count = BATCH.min((n - i) as usize) as u64;
            let records: Vec<Record> = (i..i + count)
                .map(|k| Record::new().with("data", slice(k)))
                .collect();
            store.append_many(&records)?;
            i += count;
        }
        store.commit()?;
        let rate = total_bytes as f64 / started.elapsed().as_secs_f64();
        println!(
            "{:>16} {:<22} {:>12.0} {:>11.2}x",
            label(size, compress),
            format!("append, {writers} writer(s)"),
            rate / (1 << 20) as f64,
            rate / baseline
        );
        drop(store);
        std::fs::remove_dir_all(&path)?;
    }
    Ok(())
}
