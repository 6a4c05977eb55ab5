//! Helpers shared by the benchmark examples.
#![allow(dead_code)] // each example uses a subset

use std::path::Path;
use std::time::{Duration, Instant};

use zr_node::{CreateOptions, FieldSpec, Record, Store};

/// SplitMix64: fast, reproducible pseudo-random data for benchmarks.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// Creates a dataset of `n` random records of `size` bytes in one raw field "data", calling
/// `also` with every run of records' bytes (to build a baseline from the same bytes).
pub fn build_dataset(
    dir: &Path,
    n: u64,
    size: usize,
    mut also: impl FnMut(&[u8]),
) -> Result<Store, Box<dyn std::error::Error>> {
    let store = Store::create(dir, vec![FieldSpec::raw("data")], CreateOptions::default())?;
    let started = Instant::now();
    let mut rng = Rng(size as u64);
    let per_call = 1024usize;
    let mut buf = vec![0u8; per_call * size];
    let mut written = 0u64;
    while written < n {
        let count = per_call.min((n - written) as usize);
        let bytes = &mut buf[..count * size];
        rng.fill(bytes);
        also(bytes);
        let records: Vec<Record> = bytes
            .chunks(size)
            .map(|r| Record::new().with("data", r))
            .collect();
        store.append_many(&records)?;
        written += count as u64;
    }
    store.commit()?;
    eprintln!(
        "built {n} records of {size} B ({:.2} GiB) in {:.1} s",
        (n * size as u64) as f64 / (1u64 << 30) as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(store)
}

/// Runs `step` (one batch) repeatedly for about `seconds`; returns batches per second.
pub fn time_batches(seconds: f64, mut step: impl FnMut(usize)) -> f64 {
    let budget = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut batches = 0usize;
    while start.elapsed() < budget {
        for _ in 0..16 {
            step(batches);
            batches += 1;
        }
    }
    batches as f64 / start.elapsed().as_secs_f64()
}

/// Median of a few measurements.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
