//! What growing a cluster online costs, on loopback, each figure next to its baseline from
//! the same run: the records `zr cluster add-shard` moves per second next to a file copy of
//! the same bytes (through the page cache, and made durable as a move's are); the bytes the
//! nodes' stores wrote, all files, next to the bytes moved; and random gathers through the
//! router while the move runs next to gathers before it. A move copies the slots it moves as
//! their files, node to node, at most `--max-rate` MiB/s per node gaining slots (0: as fast
//! as it can), then the records written since as records (those batches paced: it pauses
//! twice as long as each took).
//!
//! ```text
//! cargo run --release -p zr-sim --example move_bench -- [--shards 4] [--records 200000] [--max-rate 256]
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use zr_common::hash::{mix2, reduce};
use zr_common::Record;
use zr_router::{Client, MapChange};
use zr_sim::{SimCluster, SimOptions};

/// Add-shard's cost on loopback, against same-run baselines.
#[derive(Clone, Parser)]
struct Args {
    /// Shards before the add.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Records loaded before the add.
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    /// Bytes per record.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Records per gather.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Seconds of gathers before the move (the baseline).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Most MiB a second each node gaining slots copies their files at (0: as fast as it
    /// can), as `zr cluster add-shard --max-rate`.
    #[arg(long, default_value_t = zr_router::MOVE_RATE_DEFAULT >> 20)]
    max_rate: u64,
    /// Log level of the cluster's processes.
    #[arg(long, default_value = "error")]
    log: String,
}

mod bench_common;
use bench_common::{durable_copy_seconds, file_copy_seconds, payload, settle};

type Failed = Box<dyn std::error::Error + Send + Sync>;

/// Random gathers until `seconds` pass or `stop` is set, every 97th record checked; returns
/// (records, seconds).
fn gather(
    client: &Client,
    args: &Args,
    seconds: f64,
    stop: &AtomicBool,
    seed: u64,
) -> Result<(u64, f64), Failed> {
    let started = Instant::now();
    let mut records = 0u64;
    for n in 0u64.. {
        if started.elapsed().as_secs_f64() >= seconds || stop.load(Ordering::SeqCst) {
            break;
        }
        let indices: Vec<u64> = (0..args.batch as u64)
            .map(|k| reduce(mix2(seed ^ n, k), args.records))
            .collect();
        let columns = client.gather(&indices, &[])?;
        for (pos, &i) in indices.iter().enumerate().step_by(97) {
            if columns[0].get(pos) != Some(&payload(i, args.size)[..]) {
                return Err(format!("record {i} came back wrong").into());
            }
        }
        records += indices.len() as u64;
    }
    Ok((records, started.elapsed().as_secs_f64()))
}

fn main() -> Result<(), Failed> {
    zr_common::alloc::tune();
    let args = Args::parse();
    zr_service::logging::init_logging(&args.log, zr_service::logging::LogFormat::Text);
    let mib = |bytes: f64| bytes / (1 << 20) as f64;
    let mut cluster = SimCluster::start(args.shards, SimOptions::default())?;
    let client = cluster.client()?;
    let mut done = 0;
    while done < args.records {
        let n = 1024.min(args.records - done);
        let payloads: Vec<Vec<u8>> = (0..n).map(|k| payload(done + k, args.size)).collect();
        let records: Vec<Record> = payloads
            .iter()
            .map(|p| Record::new().with("data", p))
            .collect();
        client.append_many(&records)?;
        done += n;
    }
    client.commit()?;
    println!(
        "{} shards -> {}, {} records of {} B each, gathers of {}; every process on this machine",
        args.shards,
        args.shards + 1,
        args.records,
        args.size,
        args.batch
    );
    let idle = AtomicBool::new(false);
    let (before, before_s) = gather(&client, &args, args.seconds, &idle, 1)?;
    let before_rate = before as f64 / before_s;
    // The file copies the move is set against, of about what it moves, measured while the
    // cluster is quiet (after it, the disk is still busy with the move's own writes and the
    // givers' files being removed).
    let expected = args.records * args.size as u64 / u64::from(args.shards + 1);
    let copy_rate = expected as f64 / file_copy_seconds(expected)?;
    let durable_rate = expected as f64 / durable_copy_seconds(expected)?;

    cluster.add_shard_nodes()?;
    settle();
    let nodes = cluster.listed_nodes();
    let stop = Arc::new(AtomicBool::new(false));
    let during = {
        let (client, stop) = (cluster.client()?, Arc::clone(&stop));
        let args = args.clone();
        std::thread::spawn(move || gather(&client, &args, f64::INFINITY, &stop, 2))
    };
    let written_before = zr_node::disk::bytes_written();
    let started = Instant::now();
    client.move_shards_at(MapChange::AddShard, nodes, Some(args.max_rate << 20))?;
    let report = loop {
        std::thread::sleep(Duration::from_millis(20));
        let report = client.move_progress()?.ok_or("the router runs no move")?;
        if let Some(error) = report.error {
            return Err(format!("the move stopped: {error}").into());
        }
        if report.done {
            break report;
        }
    };
    let move_s = started.elapsed().as_secs_f64();
    let disk_written = zr_node::disk::bytes_written() - written_before;
    stop.store(true, Ordering::SeqCst);
    let (during, during_s) = during.join().map_err(|_| "the gather thread panicked")??;
    let during_rate = during as f64 / during_s;

    let moved_bytes = report.moved * args.size as u64;
    let move_rate = moved_bytes as f64 / move_s;
    let rate = match args.max_rate {
        0 => "files copied as fast as they can be".to_string(),
        mib => format!("files copied at most {mib} MiB/s per node gaining slots"),
    };
    println!(
        "add-shard   moved {} of {} records ({:.1}%) in {move_s:.2} s, start to switched ({rate})",
        report.moved,
        report.records,
        100.0 * report.moved as f64 / report.records as f64,
    );
    println!(
        "move rate   {:>10.0} records/s moved ({:.1} MiB/s)   file copy of {:.1} MiB (before the move) {:>7.1} MiB/s   move/copy {:.2}x",
        report.moved as f64 / move_s,
        mib(move_rate),
        mib(expected as f64),
        mib(copy_rate),
        move_rate / copy_rate
    );
    println!(
        "            durable file copy (copy + fsync) {:>7.1} MiB/s   move/durable copy {:.2}x",
        mib(durable_rate),
        move_rate / durable_rate
    );
    println!(
        "disk        {:.1} MiB written by the nodes' stores during the move   {:.2}x the bytes moved",
        mib(disk_written as f64),
        disk_written as f64 / moved_bytes.max(1) as f64
    );
    println!(
        "gathers     during the move {:>10.0} records/s   before it {:>10.0} records/s   during/before {:.2}x",
        during_rate,
        before_rate,
        during_rate / before_rate
    );
    Ok(())
}
