//! `zr bench`: random-batch gather throughput on the user's own dataset.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use zr_common::hash::{mix2, reduce};
use zr_node::{RuntimeOptions, Store};

use crate::cluster::{target_dir, RouterArgs};
use crate::dataset::ReadArgs;
use crate::CliResult;
use zr_net::tls::Access;

/// Measure random-batch gathers on a dataset: records/s, GiB/s, p50/p99 batch latency.
///
/// Each batch gathers uniformly random indices and materializes every selected field into
/// one contiguous buffer, as a training loader would. With --router, the batches are
/// gathered from a cluster through its router (each batch one request).
#[derive(Args)]
pub struct BenchArgs {
    /// Dataset directory.
    dir: Option<PathBuf>,
    #[command(flatten)]
    remote: RouterArgs,
    /// Indices per batch.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Fields to read (default: all).
    #[arg(long, value_delimiter = ',')]
    field: Vec<String>,
    /// Reader threads sharing each batch.
    #[arg(long, default_value_t = RuntimeOptions::default().readers)]
    readers: usize,
    #[command(flatten)]
    read: ReadArgs,
}

pub fn run(args: BenchArgs) -> CliResult {
    if args.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    let fields: Vec<&str> = args.field.iter().map(String::as_str).collect();
    let (mut data, mut offsets) = (Vec::new(), Vec::new());
    let source = match target_dir(&args.dir, &args.remote)? {
        Some(dir) => {
            let runtime = RuntimeOptions {
                readers: args.readers,
                ..RuntimeOptions::default()
            };
            Source::Local(
                Store::open_read_only_with(dir, runtime)?,
                dir.display().to_string(),
            )
        }
        None => {
            let client = args
                .remote
                .client(Access::Read)?
                .ok_or("--router is missing")?;
            let name = format!("the cluster at {}", client.router());
            Source::Cluster(Box::new(client), name)
        }
    };
    let (len, name) = match &source {
        Source::Local(store, name) => (store.len(), name),
        Source::Cluster(client, name) => (client.len()?, name),
    };
    if len == 0 {
        return Err(format!("{name} holds no records").into());
    }
    let mut indices = vec![0u64; args.batch];
    let mut latencies = Vec::new();
    let (mut records, mut bytes) = (0u64, 0u64);
    let budget = Duration::from_secs_f64(args.seconds.max(0.0));
    let options = args.read.options(false);
    let disk_before = disk_read_bytes();
    let started = Instant::now();
    let mut batch_no = 0u64;
    while started.elapsed() < budget || batch_no == 0 {
        for (k, index) in indices.iter_mut().enumerate() {
            *index = reduce(mix2(batch_no, k as u64), len);
        }
        let t = Instant::now();
        match &source {
            Source::Local(store, _) => {
                let batch = store.gather_with(&indices, &fields, options)?;
                for field in batch.fields() {
                    field.write_contiguous(&mut data, &mut offsets);
                    bytes += data.len() as u64;
                }
            }
            Source::Cluster(client, _) => {
                for column in client.gather(&indices, &fields)? {
                    bytes += column.data.len() as u64;
                }
            }
        }
        latencies.push(t.elapsed());
        records += indices.len() as u64;
        batch_no += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let disk_read = disk_read_bytes()
        .zip(disk_before)
        .map(|(after, before)| after - before);
    latencies.sort_unstable();
    let pick = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    match &source {
        Source::Local(..) => println!(
            "{} batches of {} random records from {} records, {} reader(s):",
            batch_no, args.batch, len, args.readers
        ),
        Source::Cluster(..) => println!(
            "{} batches of {} random records from {} records in {name}:",
            batch_no, args.batch, len
        ),
    }
    println!(
        "  {:.0} records/s, {:.2} GiB/s",
        records as f64 / elapsed,
        bytes as f64 / elapsed / (1u64 << 30) as f64
    );
    println!(
        "  batch latency p50 {:.3} ms, p99 {:.3} ms",
        pick(0.5).as_secs_f64() * 1e3,
        pick(0.99).as_secs_f64() * 1e3
    );
    if let Source::Local(store, _) = &source {
        let stats = store.read_stats();
        println!(
            "  batches read from memory (mmap) {}, by direct reads {} ({} through io_uring)",
            stats.mmap_gathers, stats.direct_gathers, stats.uring_gathers
        );
        if let Some(read) = disk_read {
            println!(
                "  storage read {:.1} bytes per record ({})",
                read as f64 / records as f64,
                crate::human_bytes(read)
            );
        }
    }
    Ok(())
}

/// Bytes this process has caused to be read from storage so far (`/proc/self/io`), if the
/// kernel tells.
fn disk_read_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|line| line.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// What the benchmark gathers from.
enum Source {
    Local(Store, String),
    Cluster(Box<zr_router::Client>, String),
}
