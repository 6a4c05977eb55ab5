//! What growing and shrinking a cluster online costs, on loopback, each figure next to its
//! baseline from the same run. Two moves:
//!
//! 1. `zr cluster add-shard` on a quiet cluster, files copied at `--idle-rate` (default: as
//!    fast as they can be, as in a maintenance window): the bytes it moves per second next to
//!    a file copy of the same bytes (through the page cache, and made durable as a move's
//!    are), next to a copy by hand of the files the move made (`cp -r`, `sync`: the same bytes
//!    in as many files, each with what this file system charges to make one), and the bytes
//!    the nodes' stores wrote, all files, next to the bytes moved. With the cores the move
//!    and the copy kept busy (this process's and the whole machine's), and how fast the
//!    move's work could go at best with every core of the machine on it.
//! 2. `zr cluster drain-shard` of that shard while random gathers run, files copied at
//!    `--max-rate` (default: the command's own): gathers during the move next to gathers
//!    before and after it, and the move's own speed under that load.
//!
//! A move copies the slots it moves as their files, node to node, at most the rate given per
//! node gaining slots (0: as fast as it can), then the records written since as records
//! (those batches paced: it pauses twice as long as each took).
//!
//! ```text
//! cargo run --release -p zr-sim --example move_bench -- [--shards 4] [--records 200000] [--max-rate 64] [--idle-rate 0]
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
    /// Seconds of gathers before the moves and after them (the baseline).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Most MiB a second each node gaining slots copies their files at in the move under
    /// gathers (0: as fast as it can), as `zr cluster drain-shard --max-rate`.
    #[arg(long, default_value_t = zr_router::MOVE_RATE_DEFAULT >> 20)]
    max_rate: u64,
    /// The same for the move on a quiet cluster.
    #[arg(long, default_value_t = 0)]
    idle_rate: u64,
    /// Log level of the cluster's processes.
    #[arg(long, default_value = "error")]
    log: String,
}

mod bench_common;
use bench_common::{
    copy_files_seconds, cores, durable_copy, file_copy_seconds, payload, settle, Busy, Spent,
};

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
    let durable = durable_copy(expected)?;
    let durable_rate = expected as f64 / durable.seconds;

    // 1. Add a shard on a quiet cluster: how fast a move goes.
    let added_shard = cluster.add_shard_nodes()?;
    settle();
    let written_before = zr_node::disk::bytes_written();
    let added = run_move(&client, MapChange::AddShard, &cluster, args.idle_rate)?;
    let disk_written = zr_node::disk::bytes_written() - written_before;
    let moved_bytes = added.moved * args.size as u64;
    let added_rate = moved_bytes as f64 / added.spent.seconds;
    println!(
        "add-shard   moved {} of {} records ({:.1}%) in {:.2} s, start to switched, the cluster quiet ({}; this process {:.2} cores busy, the machine {:.2} of {})",
        added.moved,
        added.records,
        100.0 * added.moved as f64 / added.records as f64,
        added.spent.seconds,
        rate_said(args.idle_rate),
        added.spent.process,
        added.spent.machine,
        cores(),
    );
    println!(
        "move rate   {:>10.0} records/s moved ({:.1} MiB/s)   file copy of {:.1} MiB (before the move) {:>7.1} MiB/s   move/copy {:.2}x",
        added.moved as f64 / added.spent.seconds,
        mib(added_rate),
        mib(expected as f64),
        mib(copy_rate),
        added_rate / copy_rate
    );
    println!(
        "            durable file copy (copy + fsync) {:>7.1} MiB/s (the machine {:.2} cores busy)   move/durable copy {:.2}x",
        mib(durable_rate),
        durable.machine,
        added_rate / durable_rate
    );
    let at_best_s = added.spent.at_best_seconds();
    println!(
        "            the move's work on every core at once: {at_best_s:.2} s, {:.2}x the durable copy at best",
        (moved_bytes as f64 / at_best_s) / durable_rate
    );
    println!(
        "disk        {:.1} MiB written by the nodes' stores during the move   {:.2}x the bytes moved",
        mib(disk_written as f64),
        disk_written as f64 / moved_bytes.max(1) as f64
    );
    // The same files copied by hand: the new shard's, as the move left them.
    let (same_s, same_bytes, same_files) =
        copy_files_seconds(&cluster.data_dir(cluster.node(added_shard, 0)))?;
    let same_rate = same_bytes as f64 / same_s;
    println!(
        "            copy of the same files ({same_files} files, {:.1} MiB; copy + sync) {:>7.1} MiB/s   move/same-files copy {:.2}x",
        mib(same_bytes as f64),
        mib(same_rate),
        added_rate / same_rate
    );

    // 2. Drain it again while gathers run: what a move costs the reads beside it.
    settle();
    let stop = Arc::new(AtomicBool::new(false));
    let during = {
        let (client, stop) = (cluster.client()?, Arc::clone(&stop));
        let args = args.clone();
        std::thread::spawn(move || gather(&client, &args, f64::INFINITY, &stop, 2))
    };
    let drained = run_move(
        &client,
        MapChange::DrainShard(args.shards),
        &cluster,
        args.max_rate,
    );
    stop.store(true, Ordering::SeqCst);
    let (during, during_s) = during.join().map_err(|_| "the gather thread panicked")??;
    let drained = drained?;
    let during_rate = during as f64 / during_s;
    let drained_rate = (drained.moved * args.size as u64) as f64 / drained.spent.seconds;
    println!(
        "drain-shard moved {} records in {:.2} s under gathers ({}; this process {:.2} cores busy): {:.1} MiB/s, {:.2}x the durable file copy",
        drained.moved,
        drained.spent.seconds,
        rate_said(args.max_rate),
        drained.spent.process,
        mib(drained_rate),
        drained_rate / durable_rate
    );
    // Gathers again once the move is done: the baseline is the mean of before and after,
    // so that the machine's own drift (a shared host, the disk writing back the move's
    // files) weighs on both sides alike.
    settle();
    let (after, after_s) = gather(&client, &args, args.seconds, &idle, 3)?;
    let after_rate = after as f64 / after_s;
    let baseline = (before_rate + after_rate) / 2.0;
    println!(
        "gathers     during the move {:>10.0} records/s   before it {:>10.0}, after it {:>10.0} records/s   during/(before+after)/2 {:.2}x",
        during_rate,
        before_rate,
        after_rate,
        during_rate / baseline
    );
    Ok(())
}

/// A finished move: its records moved, of how many, and how long it took with the cores
/// kept busy meanwhile.
struct Moved {
    moved: u64,
    records: u64,
    spent: Spent,
}

/// Runs `change` at `rate` MiB/s (0: unpaced) and waits for it to finish.
fn run_move(
    client: &Client,
    change: MapChange,
    cluster: &SimCluster,
    rate: u64,
) -> Result<Moved, Failed> {
    let busy = Busy::start();
    client.move_shards_at(change, cluster.listed_nodes(), Some(rate << 20))?;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let report = client.move_progress()?.ok_or("the router runs no move")?;
        if let Some(error) = report.error {
            return Err(format!("the move stopped: {error}").into());
        }
        if report.done {
            return Ok(Moved {
                moved: report.moved,
                records: report.records,
                spent: busy.spent(),
            });
        }
    }
}

fn rate_said(rate: u64) -> String {
    match rate {
        0 => "files copied as fast as they can be".to_string(),
        mib => format!("files copied at most {mib} MiB/s per node gaining slots"),
    }
}
