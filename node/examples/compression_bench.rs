//! Compression benchmark: bytes on disk and random-gather records/s of the same records
//! stored raw, flate, zstd and zstd with a dictionary trained on them, in one run.
//!
//! ```text
//! cargo run --release -p zr-node --example compression_bench -- [--seconds 2]
//! ```
//! Two kinds of records, generated as real ones look (not random bytes): (a) short JSON
//! lines with a caption, 200–600 bytes, 200,000 of them; (b) 16 KiB of log-like text,
//! 8,000 of them. Gathers: batches of 1,024 random records, materialized into one buffer.

use std::time::Instant;

use clap::Parser;
use zr_node::{CreateOptions, FieldSpec, Record, Store};

#[path = "bench_util/mod.rs"]
mod bench_util;

use bench_util::Rng;

#[derive(Parser)]
#[command(about = "Bytes on disk and gather rates for raw, flate and zstd fields")]
struct Args {
    /// Seconds per gather measurement.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
}

const WORDS: &[&str] = &[
    "a", "the", "dog", "cat", "small", "large", "red", "blue", "running", "sitting", "on", "in",
    "beach", "street", "park", "with", "near", "old", "young", "man", "woman", "child", "photo",
    "of", "at", "sunset", "morning", "wooden", "table", "window", "car", "bicycle", "green",
    "tree", "mountain", "river", "city", "night", "two", "three", "holding", "ball",
];

fn sentence(rng: &mut Rng, words: usize) -> String {
    let mut s = String::new();
    for k in 0..words {
        if k > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
    }
    s
}

/// (a): a JSON line of 200–600 bytes.
fn caption(rng: &mut Rng, id: u64) -> Vec<u8> {
    let target = 200 + (rng.next() % 400) as usize;
    let mut line = format!(
        "{{\"id\": {id}, \"url\": \"https://images.example.org/{:08x}.jpg\", \"width\": {}, \"height\": {}, \"caption\": \"",
        rng.next() as u32,
        256 + rng.next() % 1792,
        256 + rng.next() % 1792
    );
    while line.len() < target - 30 {
        line.push_str(&sentence(rng, 6));
        line.push_str(". ");
    }
    line.push_str(&format!("\", \"score\": 0.{:04}}}", rng.next() % 10_000));
    line.into_bytes()
}

/// (b): 16 KiB of log lines.
fn log_page(rng: &mut Rng, id: u64) -> Vec<u8> {
    let mut page = String::with_capacity(16 << 10);
    let mut t = 1_700_000_000 + id * 600;
    while page.len() < (16 << 10) - 200 {
        t += rng.next() % 7;
        let level = ["INFO", "INFO", "INFO", "WARN", "DEBUG"][(rng.next() % 5) as usize];
        page.push_str(&format!(
            "{t} {level} worker-{} request {:x} took {} ms: {}\n",
            rng.next() % 16,
            rng.next() as u32,
            rng.next() % 900,
            sentence(rng, 5)
        ));
    }
    let mut bytes = page.into_bytes();
    bytes.resize(16 << 10, b'\n');
    bytes
}

fn gather_rate(store: &Store, n: u64, seconds: f64) -> f64 {
    let mut rng = Rng(7);
    let batches: Vec<Vec<u64>> = (0..64)
        .map(|_| (0..1024).map(|_| rng.next() % n).collect())
        .collect();
    let mut done = 0u64;
    let started = Instant::now();
    let mut k = 0;
    while started.elapsed().as_secs_f64() < seconds {
        let batch = store
            .gather(&batches[k % batches.len()], &[])
            .expect("gather");
        let column = batch.fields().next().expect("a field");
        std::hint::black_box(column.to_contiguous());
        done += 1024;
        k += 1;
    }
    done as f64 / started.elapsed().as_secs_f64()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    type Make = fn(&mut Rng, u64) -> Vec<u8>;
    let kinds: [(&str, u64, Make); 2] = [
        ("(a) JSON captions, 200-600 B", 200_000, caption),
        ("(b) 16 KiB log text", 8_000, log_page),
    ];
    for (label, n, make) in kinds {
        let mut rng = Rng(1);
        let records: Vec<Vec<u8>> = (0..n).map(|i| make(&mut rng, i)).collect();
        let given: u64 = records.iter().map(|r| r.len() as u64).sum();
        println!(
            "{label}: {n} records, {:.1} MiB given",
            given as f64 / (1 << 20) as f64
        );
        let mut flate = (0.0, 0u64);
        for label in ["raw", "flate", "zstd", "zstd:9", "zstd+dict"] {
            let storage = label.trim_end_matches("+dict");
            let dir = tmp.path().join(format!("{}-{label}", n));
            let store = Store::create(
                &dir,
                vec![FieldSpec::stored("v", storage)?],
                CreateOptions::default(),
            )?;
            let built = Instant::now();
            for part in records.chunks(4096) {
                let rows: Vec<Record> = part.iter().map(|r| Record::new().with("v", r)).collect();
                store.append_many(&rows)?;
            }
            store.commit()?;
            let store = if label.ends_with("+dict") {
                // Trained on the records, the dataset rewritten with it (zr dict train).
                drop(store);
                zr_node::rebalance::train_dict(
                    &dir,
                    "v",
                    zr_node::dict::DICT_BYTES_DEFAULT,
                    None,
                    |_, _| {},
                )?;
                Store::open_read_only(&dir)?
            } else {
                store
            };
            let write = given as f64 / built.elapsed().as_secs_f64() / (1 << 20) as f64;
            // Bytes the chunks hold (frames and padding), not their preallocated size.
            let bytes: u64 = zr_node::meta::Meta::load(&dir)?
                .chunks
                .iter()
                .map(|c| c.bytes)
                .sum();
            store.gather(&(0..n).collect::<Vec<_>>(), &[])?; // warm
            let rate = gather_rate(&store, n, args.seconds);
            let vs_flate = match label {
                "flate" => {
                    flate = (rate, bytes);
                    String::new()
                }
                "raw" => String::new(),
                _ => format!(
                    "   vs flate: {:.2}x smaller, gathers {:.2}x",
                    flate.1 as f64 / bytes as f64,
                    rate / flate.0
                ),
            };
            println!(
                "  {label:<9} {:>8.1} MiB on disk  {:>11.0} rec/s gathered  {:>6.0} MiB/s written{vs_flate}",
                bytes as f64 / (1 << 20) as f64,
                rate,
                write
            );
        }
    }
    Ok(())
}
