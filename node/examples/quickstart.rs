//! Quick start: create a dataset, append sample records, gather a random batch, and print
//! what it read and how fast.
//!
//! ```text
//! cargo run --release -p zr-node --example quickstart [-- DIR]
//! ```
//! Without DIR the dataset goes to a temporary directory that is removed at the end.

use std::time::Instant;

use zr_node::{CreateOptions, FieldSpec, GatherOptions, Record, Store};

const RECORDS: u64 = 200_000;
const BATCH: usize = 1024;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let dir = match std::env::args_os().nth(1) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => tmp.path().join("sample"),
    };

    // Two fields: a 1 KiB raw "image" and a Deflate-compressed text "caption".
    let fields = vec![
        FieldSpec::raw("image").typed("|u1", vec![32, 32]),
        FieldSpec::flate("caption"),
    ];
    let store = Store::create(&dir, fields, CreateOptions::default())?;
    let started = Instant::now();
    let mut images = vec![0u8; 1024 * 1000];
    for first in (0..RECORDS).step_by(1000) {
        let captions: Vec<String> = (first..first + 1000)
            .map(|i| {
                format!(
                    "sample {i}: a {} shape on a {} background",
                    ["red", "green", "blue"][i as usize % 3],
                    ["plain", "striped"][i as usize % 2]
                )
            })
            .collect();
        for (k, image) in images.chunks_mut(1024).enumerate() {
            let id = first + k as u64;
            image
                .iter_mut()
                .enumerate()
                .for_each(|(j, b)| *b = (id as usize * 7 + j) as u8);
        }
        let records: Vec<Record> = images
            .chunks(1024)
            .zip(&captions)
            .map(|(image, caption)| {
                Record::new()
                    .with("image", image)
                    .with("caption", caption.as_bytes())
            })
            .collect();
        store.append_many(&records)?;
    }
    store.commit()?;
    let written = started.elapsed();
    println!(
        "created {} with {} records (1 KiB image + compressed caption) in {:.2} s",
        dir.display(),
        store.len(),
        written.as_secs_f64()
    );

    // One random batch, checked, then shown.
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut random_batch = || -> Vec<u64> {
        (0..BATCH)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % RECORDS
            })
            .collect()
    };
    let indices = random_batch();
    let batch = store.gather_with(&indices, &[], GatherOptions::verified())?;
    let captions = batch.field("caption").ok_or("no caption field")?;
    let images = batch.field("image").ok_or("no image field")?;
    println!(
        "gathered {} random records (CRC-verified); the first three:",
        batch.len()
    );
    for ((index, image), caption) in indices
        .iter()
        .zip(images.iter())
        .zip(captions.iter())
        .take(3)
    {
        println!(
            "  record {index:>6}: image {} bytes, first bytes {:?}; caption {:?}",
            image.len(),
            &image[..4.min(image.len())],
            String::from_utf8_lossy(caption)
        );
    }

    // Throughput: zero-copy gathers of the image field, then gathers materialized contiguous.
    let batches: Vec<Vec<u64>> = (0..64).map(|_| random_batch()).collect();
    let (mut data, mut offsets) = (Vec::new(), Vec::new());
    let rounds = 2000;
    let started = Instant::now();
    for i in 0..rounds {
        let batch = store.gather(&batches[i % batches.len()], &["image"])?;
        std::hint::black_box(&batch);
    }
    let zero_copy = started.elapsed().as_secs_f64();
    let started = Instant::now();
    for i in 0..rounds {
        let batch = store.gather(&batches[i % batches.len()], &["image"])?;
        batch
            .field("image")
            .ok_or("no image field")?
            .write_contiguous(&mut data, &mut offsets);
        std::hint::black_box(&data);
    }
    let materialized = started.elapsed().as_secs_f64();
    let records = (rounds * BATCH) as f64;
    println!("random batches of {BATCH}, one thread:");
    println!(
        "  zero-copy gather:    {:>6.2} M records/s",
        records / zero_copy / 1e6
    );
    println!(
        "  materialized gather: {:>6.2} M records/s, {:.2} GiB/s",
        records / materialized / 1e6,
        records * 1024.0 / materialized / (1u64 << 30) as f64
    );
    println!(
        "(cargo run --release -p zr-node --example gather_bench compares against a plain mmap)"
    );
    Ok(())
}
