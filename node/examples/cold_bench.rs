//! Cold gather benchmark: random batches from a dataset several times larger than the memory
//! the reading process may use, next to raw reads of the same records' bytes in the same run.
//!
//! ```text
//! sudo cargo run --release -p zr-node --example cold_bench -- [--memory-mib 512] [--factor 4] [--sizes 1024,16384] [--seconds 5] [--dir DIR]
//! ```
//! Needs root: it makes a memory cgroup (v1 `memory.limit_in_bytes`, or v2 `memory.max`) of
//! `--memory-mib`, which the page cache of this process is charged to, moves itself into it
//! for the measurements, and removes it afterwards. For each record size it writes a dataset
//! of `--factor` × that memory on the disk under `--dir`, drops its pages from the cache, and
//! times batches of `--batch` random records (the same indices for every method), each method
//! starting from a cold cache:
//! - raw io_uring: each record's frame read with one read, `--queue-depth` in flight, the
//!   ranges taken from the offset table beforehand (the device's limit);
//! - zrecord `auto` (the default read path) and `direct` with `--uncached` (O_DIRECT);
//! - zrecord `mmap` (through the mappings, advised random);
//! - a one-thread `pread` loop of the same ranges.
//!
//! It prints records/s, p50/p99 per batch, and the bytes read from the dataset's block device
//! per record (`/proc/diskstats`; the machine's other readers count too, so keep it quiet).

mod bench_util;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use zr_node::{GatherOptions, ReadPath, Store};

use bench_util::{build_dataset, uring_read, BoxResult, Cgroup, Rng};

#[derive(Parser)]
#[command(
    about = "Random gathers from a dataset larger than memory, next to raw io_uring and pread"
)]
struct Args {
    /// Memory the measuring process may use (its cgroup's limit), in MiB.
    #[arg(long, default_value_t = 512)]
    memory_mib: u64,
    /// Dataset size as a multiple of that memory.
    #[arg(long, default_value_t = 4.0)]
    factor: f64,
    /// Record sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1024,16384")]
    sizes: Vec<usize>,
    /// Seconds per method and size.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Indices per batch.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Reads in flight of the raw io_uring baseline.
    #[arg(long, default_value_t = 128)]
    queue_depth: u32,
    /// Where to build the datasets: a directory on the disk to measure (default: a temporary
    /// directory in the current one, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn main() -> BoxResult<()> {
    let args = Args::parse();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("cold_bench needs root: it makes a memory cgroup to hold the page cache to --memory-mib".into());
    }
    let scratch = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir_in(".")?,
    };
    let limit = args.memory_mib << 20;
    for &size in &args.sizes {
        let n = ((limit as f64 * args.factor) / size as f64).ceil() as u64;
        let dir = scratch.path().join(format!("ds-{size}"));
        let store = build_dataset(&dir, n, size, |_| {})?;
        let ranges = frame_ranges(&dir, n)?;
        drop(store);
        let store = Store::open_read_only(&dir)?;
        let files = DatasetFiles::of(&dir)?;
        let cgroup = Cgroup::create(limit)?;
        println!(
            "\n{size} B records: {n} records ({:.2} GiB), memory limit {} MiB ({}), batches of {}, {} s per method",
            (n * size as u64) as f64 / (1u64 << 30) as f64,
            args.memory_mib,
            cgroup.kind,
            args.batch,
            args.seconds
        );
        println!(
            "  {:<26} {:>10} {:>8} {:>8} {:>14} {:>12} {:>11}",
            "method",
            "records/s",
            "p50 ms",
            "p99 ms",
            "storage B/rec",
            "cached after",
            "vs io_uring"
        );
        let batches = Batches::new(n, args.batch, size as u64);
        let device = device_of(&dir)
            .ok()
            .filter(|&d| device_read_bytes(Some(d)) > 0);
        if device.is_none() {
            println!(
                "  (no block device statistics for {}: storage bytes show 0)",
                dir.display()
            );
        }
        let mut baseline = None;
        let mut auto_choices = None;
        let mut report = |name: &str, run: Run, cached: f64| {
            let rate = run.records as f64 / run.elapsed.as_secs_f64();
            let ratio = match baseline {
                None => {
                    baseline = Some(rate);
                    "1.00x".to_string()
                }
                Some(base) => format!("{:.2}x", rate / base),
            };
            println!(
                "  {:<26} {:>10.0} {:>8.2} {:>8.2} {:>14.0} {:>11.1}% {:>11}",
                name,
                rate,
                run.quantile(0.5),
                run.quantile(0.99),
                run.storage_bytes as f64 / run.records as f64,
                100.0 * cached,
                ratio
            );
        };
        files.evict()?;
        println!(
            "  (each method starts with the page cache dropped: {:.1}% of the chunks' pages in memory)",
            100.0 * files.resident()?
        );
        let run = timed(args.seconds, &batches, device, |indices| {
            raw_uring(&files, &ranges, indices, args.queue_depth)
        })?;
        report(
            &format!("raw io_uring (QD {})", args.queue_depth),
            run,
            files.resident()?,
        );
        for (name, options) in [
            ("zrecord auto", GatherOptions::default()),
            (
                "zrecord direct, O_DIRECT",
                GatherOptions {
                    read: ReadPath::Direct,
                    uncached: true,
                    ..GatherOptions::default()
                },
            ),
            (
                "zrecord mmap",
                GatherOptions {
                    read: ReadPath::Mmap,
                    ..GatherOptions::default()
                },
            ),
        ] {
            files.evict()?;
            let stats_before = store.read_stats();
            let (mut data, mut offsets) = (Vec::new(), Vec::new());
            let run = timed(args.seconds, &batches, device, |indices| {
                // Materialized, as a loader does: through the mappings, this is where the
                // pages are read.
                let batch = store.gather_with(indices, &[], options)?;
                for field in batch.fields() {
                    field.write_contiguous(&mut data, &mut offsets);
                }
                std::hint::black_box(&data);
                Ok(())
            })?;
            report(name, run, files.resident()?);
            let stats = store.read_stats();
            if options.read == ReadPath::Auto {
                auto_choices = Some((
                    stats.mmap_gathers - stats_before.mmap_gathers,
                    stats.direct_gathers - stats_before.direct_gathers,
                    stats.uring_gathers - stats_before.uring_gathers,
                ));
            }
        }
        files.evict()?;
        let run = timed(args.seconds, &batches, device, |indices| {
            pread_loop(&files, &ranges, indices)
        })?;
        report("pread loop, 1 thread", run, files.resident()?);
        if let Some((mmap, direct, uring)) = auto_choices {
            println!(
                "  zrecord auto read {mmap} batches through the mappings and {direct} by direct reads ({uring} through io_uring)"
            );
        }
        drop(cgroup);
        drop(store);
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}

/// Where record i's frame lies: (chunk id, offset, length), from the offset table.
fn frame_ranges(dir: &Path, n: u64) -> BoxResult<Vec<(u32, u64, u32)>> {
    let table = std::fs::read(dir.join(zr_node::offset::offset_file_name("data")))?;
    (0..n as usize)
        .map(|i| {
            let entry = table
                .get(16 * i..16 * i + 16)
                .ok_or("the offset table is shorter than the dataset")?;
            let offset = u64::from_le_bytes(entry[0..8].try_into()?);
            let chunk = u32::from_le_bytes(entry[8..12].try_into()?);
            let len = u32::from_le_bytes(entry[12..16].try_into()?);
            Ok((chunk, offset, len + 16))
        })
        .collect()
}

/// The dataset's files: the chunks by id, for the baselines, and all of them, for evicting.
struct DatasetFiles {
    chunks: Vec<File>,
    all: Vec<PathBuf>,
}

impl DatasetFiles {
    fn of(dir: &Path) -> BoxResult<DatasetFiles> {
        let mut chunks = Vec::new();
        while zr_node::chunk_path(dir, chunks.len() as u32).exists() {
            chunks.push(File::open(zr_node::chunk_path(dir, chunks.len() as u32))?);
        }
        let mut all = Vec::new();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(d) = pending.pop() {
            for entry in std::fs::read_dir(&d)? {
                let path = entry?.path();
                if path.is_dir() {
                    pending.push(path);
                } else {
                    all.push(path);
                }
            }
        }
        Ok(DatasetFiles { chunks, all })
    }

    /// The share of the chunks' pages in the page cache.
    fn resident(&self) -> BoxResult<f64> {
        let (mut resident, mut pages) = (0usize, 0usize);
        for file in &self.chunks {
            let (held, all) = zr_node::page_cache::resident_pages(file)?;
            resident += held;
            pages += all;
        }
        Ok(resident as f64 / pages.max(1) as f64)
    }

    /// Drops every file's pages from the page cache, so that the next method starts cold.
    fn evict(&self) -> BoxResult<()> {
        bench_util::evict(&self.all)
    }
}

/// The same random batches for every method.
struct Batches {
    n: u64,
    batch: usize,
    seed: u64,
}

impl Batches {
    fn new(n: u64, batch: usize, seed: u64) -> Batches {
        Batches { n, batch, seed }
    }

    fn get(&self, number: u64, out: &mut Vec<u64>) {
        // Each batch's generator starts from a hash of its number: generators started from
        // nearby states would repeat each other's indices shifted by one.
        let mut rng = Rng(Rng(self.seed.rotate_left(32) ^ number).next());
        out.clear();
        out.extend((0..self.batch).map(|_| rng.next() % self.n));
    }
}

/// One method's figures.
struct Run {
    records: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    storage_bytes: u64,
}

impl Run {
    /// The `q` quantile of batch latency, in ms.
    fn quantile(&self, q: f64) -> f64 {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let at = ((sorted.len() - 1) as f64 * q).round() as usize;
        sorted[at].as_secs_f64() * 1e3
    }
}

/// Runs `step` on batch after batch for about `seconds`.
fn timed(
    seconds: f64,
    batches: &Batches,
    device: Option<(u32, u32)>,
    mut step: impl FnMut(&[u64]) -> BoxResult<()>,
) -> BoxResult<Run> {
    let before = device_read_bytes(device);
    let budget = Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut indices = Vec::new();
    let mut number = 0u64;
    while started.elapsed() < budget || number == 0 {
        batches.get(number, &mut indices);
        let t = Instant::now();
        step(&indices)?;
        latencies.push(t.elapsed());
        number += 1;
    }
    let elapsed = started.elapsed();
    Ok(Run {
        records: number * batches.batch as u64,
        elapsed,
        latencies,
        storage_bytes: device_read_bytes(device).saturating_sub(before),
    })
}

/// The block device (major, minor) that holds `path`, as `/proc/diskstats` names it.
fn device_of(path: &Path) -> BoxResult<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)?.dev();
    Ok((libc::major(dev), libc::minor(dev)))
}

/// Bytes read from `device` so far, by every process (`/proc/diskstats`: sectors read × 512).
fn device_read_bytes(device: Option<(u32, u32)>) -> u64 {
    let Some((major, minor)) = device else {
        return 0;
    };
    std::fs::read_to_string("/proc/diskstats")
        .ok()
        .and_then(|stats| {
            stats.lines().find_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let ours = f.first()?.parse::<u32>().ok()? == major
                    && f.get(1)?.parse::<u32>().ok()? == minor;
                ours.then(|| f.get(5)?.parse::<u64>().ok().map(|s| s * 512))?
            })
        })
        .unwrap_or(0)
}

/// Each record's frame read with one read, `depth` in flight (see `bench_util::uring_read`).
fn raw_uring(
    files: &DatasetFiles,
    ranges: &[(u32, u64, u32)],
    indices: &[u64],
    depth: u32,
) -> BoxResult<()> {
    let reads: Vec<(std::os::fd::RawFd, u64, usize)> = indices
        .iter()
        .map(|&i| {
            let (chunk, offset, len) = ranges[i as usize];
            (
                files.chunks[chunk as usize].as_raw_fd(),
                offset,
                len as usize,
            )
        })
        .collect();
    uring_read(&reads, depth)
}

/// The simplest baseline: one `pread` per record, one after another.
fn pread_loop(files: &DatasetFiles, ranges: &[(u32, u64, u32)], indices: &[u64]) -> BoxResult<()> {
    let mut buffer = Vec::new();
    for &i in indices {
        let (chunk, offset, len) = ranges[i as usize];
        buffer.resize(len as usize, 0);
        files.chunks[chunk as usize].read_exact_at(&mut buffer, offset)?;
        std::hint::black_box(&buffer);
    }
    Ok(())
}
