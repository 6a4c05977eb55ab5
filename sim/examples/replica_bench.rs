//! What replicas cost and buy, on loopback, each figure next to its baseline from the same
//! run: random gathers through the router with two replicas per shard vs one; appends with
//! two vs one; the rebuild of a wiped node vs a plain file copy of the same bytes, with the
//! cores each kept busy (this process's and the whole machine's, the kernel's writeback
//! included) and how fast the rebuild's work could go at best with every core on it; and the
//! longest pause a gather loop sees while a node stops (its connections close), is dropped
//! mid-flight, or stalls (connected, never answering, as a `kill -9` or a lost host looks to
//! its peers), against the router's timeout.
//!
//! ```text
//! cargo run --release -p zr-sim --example replica_bench -- [--records 100000] [--seconds 3]
//! ```
//! The two clusters take turns (`--rounds`), so a shared machine's load weighs on both alike.

use std::time::{Duration, Instant};

use clap::Parser;
use zr_common::hash::{mix2, reduce};
use zr_common::Record;
use zr_router::Client;
use zr_sim::{SimCluster, SimOptions};

/// Replicas' costs and gains on loopback, against same-run baselines.
#[derive(Parser)]
struct Args {
    /// Shards of each cluster.
    #[arg(long, default_value_t = 2)]
    shards: u32,
    /// Records loaded into each cluster.
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Bytes per record.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Records per gather.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Seconds of gathers per cluster (split over the rounds).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Turns each cluster takes.
    #[arg(long, default_value_t = 6)]
    rounds: u32,
    /// The router's timeout in the failure measurements, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Log level of the cluster's processes (their log shows each catch-up's start and end).
    #[arg(long, default_value = "error")]
    log: String,
}

mod bench_common;
use bench_common::{
    copy_files_seconds, cores, create_files_seconds, durable_copy, file_copy_seconds, held_bytes,
    payload, quinn_server, settle, Busy, Spent,
};

type Failed = Box<dyn std::error::Error + Send + Sync>;

fn cluster(args: &Args, replicas: u32, timeout_ms: u64) -> Result<SimCluster, Failed> {
    SimCluster::start(
        args.shards,
        SimOptions {
            replicas,
            timeout_ms,
            ..SimOptions::default()
        },
    )
}

/// Appends `count` records from index `from` on in batches of 1,024; returns the seconds.
fn append(client: &Client, from: u64, count: u64, size: usize) -> Result<f64, Failed> {
    let started = Instant::now();
    let mut done = 0;
    while done < count {
        let n = 1024.min(count - done);
        let payloads: Vec<Vec<u8>> = (0..n).map(|k| payload(from + done + k, size)).collect();
        let records: Vec<Record> = payloads
            .iter()
            .map(|p| Record::new().with("data", p))
            .collect();
        client.append_many(&records)?;
        done += n;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Random gathers for `seconds`, every record checked; returns (records, seconds, the
/// longest batch).
fn gather(
    client: &Client,
    len: u64,
    batch: usize,
    size: usize,
    seconds: f64,
    seed: u64,
) -> Result<(u64, f64, Duration), Failed> {
    let started = Instant::now();
    let (mut records, mut longest) = (0u64, Duration::ZERO);
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        let indices: Vec<u64> = (0..batch as u64)
            .map(|k| reduce(mix2(seed ^ n, k), len))
            .collect();
        let t = Instant::now();
        let columns = client.gather(&indices, &[])?;
        longest = longest.max(t.elapsed());
        for (pos, &i) in indices.iter().enumerate().step_by(97) {
            if columns[0].get(pos) != Some(&payload(i, size)[..]) {
                return Err(format!("record {i} came back wrong").into());
            }
        }
        records += indices.len() as u64;
        n += 1;
    }
    Ok((records, started.elapsed().as_secs_f64(), longest))
}

fn main() -> Result<(), Failed> {
    zr_common::alloc::tune();
    let args = Args::parse();
    zr_service::logging::init_logging(&args.log, zr_service::logging::LogFormat::Text);
    let mib = |bytes: f64| bytes / (1 << 20) as f64;
    let one = cluster(&args, 1, 5_000)?;
    let two = cluster(&args, 2, 5_000)?;
    let (c1, c2) = (one.client()?, two.client()?);
    println!(
        "{} shards, {} records of {} B each; R = 1 ({} nodes) vs R = 2 ({} nodes); every process on this machine",
        args.shards,
        args.records,
        args.size,
        args.shards,
        args.shards * 2
    );

    // Appends, taking turns.
    let (mut t1, mut t2) = (0.0, 0.0);
    let step = args.records / args.rounds as u64;
    for round in 0..args.rounds as u64 {
        t1 += append(&c1, round * step, step, args.size)?;
        t2 += append(&c2, round * step, step, args.size)?;
    }
    let loaded = step * args.rounds as u64;
    c1.commit()?;
    c2.commit()?;
    let bytes = (loaded as usize * args.size) as f64;
    println!(
        "append    R=1 {:>8.1} MiB/s   R=2 {:>8.1} MiB/s   R=2/R=1 {:.2}x",
        mib(bytes / t1),
        mib(bytes / t2),
        t1 / t2
    );

    // Gathers, taking turns.
    let (mut r1, mut s1, mut r2, mut s2) = (0, 0.0, 0, 0.0);
    let turn = args.seconds / args.rounds as f64;
    for round in 0..args.rounds as u64 {
        let (r, s, _) = gather(&c1, loaded, args.batch, args.size, turn, round)?;
        (r1, s1) = (r1 + r, s1 + s);
        let (r, s, _) = gather(&c2, loaded, args.batch, args.size, turn, round)?;
        (r2, s2) = (r2 + r, s2 + s);
    }
    let (g1, g2) = (r1 as f64 / s1, r2 as f64 / s2);
    println!(
        "gather    R=1 {g1:>8.0} rec/s   R=2 {g2:>8.0} rec/s   R=2/R=1 {:.2}x   (batches of {}, random, checked)",
        g2 / g1,
        args.batch
    );
    drop((c1, one));

    // Rebuild of a wiped node, then of a replacement on another address (`zr cluster
    // replace-node`), each vs a file copy of the same bytes.
    let mut two = two;
    let wiped = two.node(0, 1);
    two.crash_node(wiped);
    std::fs::remove_dir_all(two.data_dir(wiped))?;
    settle();
    let started = Instant::now();
    two.start_node(wiped)?;
    let rebuilt = until_in_sync(&c2, started)?;
    let shard_bytes = dir_bytes(&two.data_dir(two.node(0, 0)).join("chunk"))?;
    let files = dataset_files(&two.data_dir(two.node(0, 0)))?;
    print_rebuild(
        &two,
        "wiped node",
        &two.data_dir(wiped),
        (shard_bytes, files),
        rebuilt,
    )?;
    let replaced = two.node(1, 0);
    let new_addr = two.replace_node(replaced)?;
    settle();
    // Watched from another client while the command runs: the router may begin the rebuild
    // before `replace-node` has answered.
    let watching = two.client()?;
    let started = Instant::now();
    let watcher = std::thread::spawn(move || {
        while watching.status()?.nodes.iter().all(|n| n.in_sync) {
            std::thread::sleep(Duration::from_millis(1));
        }
        until_in_sync(&watching, started)
    });
    c2.replace_node(1, 0, new_addr)?;
    let rebuilt = watcher
        .join()
        .map_err(|_| "the watching thread panicked")??;
    let shard_bytes = dir_bytes(&two.data_dir(replaced).join("chunk"))?;
    let files = dataset_files(&two.data_dir(replaced))?;
    print_rebuild(
        &two,
        "replacement",
        &two.data_dir(replaced),
        (shard_bytes, files),
        rebuilt,
    )?;
    drop((c2, two));

    // The longest pause of a gather loop while a node is killed, then while one stalls.
    for what in ["stopped", "killed", "stalled"] {
        let mut cluster = cluster(&args, 2, args.timeout_ms)?;
        let client = cluster.client()?;
        append(&client, 0, 20_000, args.size)?;
        client.commit()?;
        let (_, _, before) = gather(&client, 20_000, args.batch, args.size, 1.0, 1)?;
        let loop_client = cluster.client()?;
        let size = args.size;
        let batch = args.batch;
        let worker = std::thread::spawn(move || gather(&loop_client, 20_000, batch, size, 4.0, 2));
        std::thread::sleep(Duration::from_millis(1_000));
        let victim = cluster.node(1, 0);
        match what {
            // Its connections closed (a process that exits).
            "stopped" => cluster.stop_node(victim)?,
            // Dropped mid-flight (the simulator's crash: its connections go with it).
            "killed" => cluster.crash_node(victim),
            // Still connected, never answering (as a process killed by -9 or a host lost
            // looks to its peers: nothing closes its connections).
            _ => cluster.stall_node(victim)?,
        }
        let (_, _, longest) = worker.join().map_err(|_| "the gather loop panicked")??;
        println!(
            "pause     node {what:<7}: longest batch {:>7.1} ms (before: {:.1} ms; router timeout {} ms, {:.2}x of it)",
            longest.as_secs_f64() * 1e3,
            before.as_secs_f64() * 1e3,
            args.timeout_ms,
            longest.as_secs_f64() * 1e3 / args.timeout_ms as f64
        );
    }
    Ok(())
}

/// Files of the dataset at `dir` (its chunks and the units' tables; those at its top too).
fn dataset_files(dir: &std::path::Path) -> Result<usize, Failed> {
    let mut files = 0;
    for folder in [dir.to_path_buf(), dir.join("chunk"), dir.join("units")] {
        if folder.is_dir() {
            for entry in std::fs::read_dir(folder)? {
                files += usize::from(entry?.file_type()?.is_file());
            }
        }
    }
    Ok(files)
}

/// Bytes the files under `dir` hold (their sizes as written, not as allocated).
fn dir_bytes(dir: &std::path::Path) -> Result<u64, Failed> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        // Chunk files grow in steps: count what they hold, not what they reserve.
        total += held_bytes(&entry.metadata()?);
    }
    Ok(total)
}

/// A rebuild as `until_in_sync` saw it.
struct Rebuilt {
    /// From `started` to every node in sync.
    seconds: f64,
    /// The copy phase: from the router first showing a replica catching up to every node
    /// in sync, with the cores busy meanwhile.
    copy_phase: Spent,
}

/// Waits until every node is up and in sync, and says how long that took.
fn until_in_sync(client: &Client, started: Instant) -> Result<Rebuilt, Failed> {
    let whole = Busy::start();
    let mut catching_up: Option<Busy> = None;
    loop {
        let status = client.status()?;
        if status.nodes.iter().all(|n| n.in_sync && n.state == "up") {
            break;
        }
        // The copy begins when the router starts catching the replica up (after the read
        // lease's wait that follows marking it behind).
        if catching_up.is_none() && status.nodes.iter().any(|n| n.rebuild.is_some()) {
            catching_up = Some(Busy::start());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(Rebuilt {
        seconds: started.elapsed().as_secs_f64(),
        // Caught up between two looks: the whole wait is the copy phase.
        copy_phase: catching_up.as_ref().unwrap_or(&whole).spent(),
    })
}

/// One rebuild's line: its copy rate next to a file copy's of the same bytes (in the page
/// cache, as `cp` leaves it, and made durable, as a rebuild's is) and a plain QUIC
/// transfer's of them between two endpoints of `cluster`, each measured now; then a copy
/// by hand of the files the rebuild made, at `rebuilt`.
fn print_rebuild(
    cluster: &SimCluster,
    what: &str,
    rebuilt: &std::path::Path,
    (bytes, files): (u64, usize),
    Rebuilt {
        seconds: rebuild_s,
        copy_phase,
    }: Rebuilt,
) -> Result<(), Failed> {
    let copy_s = file_copy_seconds(bytes)?;
    let durable = durable_copy(bytes)?;
    let (durable_s, copy_phase_s) = (durable.seconds, copy_phase.seconds);
    let quinn_s = quinn_copy_seconds(cluster, bytes)?;
    let create_s = create_files_seconds(files)?;
    let mib = |bytes: f64| bytes / (1 << 20) as f64;
    let at_best_s = copy_phase.at_best_seconds();
    println!(
        "rebuild   {what:<11} {:>6.1} MiB/s ({:.1} MiB in {copy_phase_s:.2} s catching up; {rebuild_s:.2} s from its start to in sync)   file copy {:>7.1} MiB/s (made durable {:>7.1})   plain quinn {:>6.1} MiB/s   rebuild/copy {:.2}x (durable {:.2}x)   rebuild/quinn {:.2}x",
        mib(bytes as f64 / copy_phase_s),
        mib(bytes as f64),
        mib(bytes as f64 / copy_s),
        mib(bytes as f64 / durable_s),
        mib(bytes as f64 / quinn_s),
        copy_s / copy_phase_s,
        durable_s / copy_phase_s,
        quinn_s / copy_phase_s
    );
    println!(
        "          {what:<11} cores busy catching up: this process {:.2}, the machine {:.2} of {}; during the durable file copy the machine {:.2}; the catching up's work on every core at once: {:.2} s, {:.2}x the durable copy at best",
        copy_phase.process,
        copy_phase.machine,
        cores(),
        durable.machine,
        at_best_s,
        durable_s / at_best_s
    );
    println!(
        "          {what:<11} its {files} files: making as many empty files here takes {create_s:.3} s ({:.0} us each), {:.0}% of its catching up",
        create_s * 1e6 / files.max(1) as f64,
        100.0 * create_s / copy_phase_s
    );
    let (same_s, same_bytes, same_files) = copy_files_seconds(rebuilt)?;
    println!(
        "          {what:<11} a copy of the same files ({same_files} files, {:.1} MiB; copy + sync) {:>7.1} MiB/s   rebuild/same-files copy {:.2}x",
        mib(same_bytes as f64),
        mib(same_bytes as f64 / same_s),
        (same_s / same_bytes as f64) / (copy_phase_s / bytes as f64)
    );
    Ok(())
}

/// Seconds a plain quinn transfer of `bytes` takes between two endpoints of this process,
/// with the cluster's node credentials: 4 MiB requests, 8 in flight, as a rebuild asks.
fn quinn_copy_seconds(cluster: &SimCluster, bytes: u64) -> Result<f64, Failed> {
    const PIECE: u64 = 4 << 20;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let security = cluster.security(zr_net::tls::Role::Node)?;
    let pool = bytes::Bytes::from(vec![7u8; PIECE as usize]);
    let loopback = "127.0.0.1:0".parse()?;
    let server = quinn_server(&runtime, loopback, &security, pool)?;
    let timeout = Duration::from_secs(30);
    let endpoint = {
        let _guard = runtime.enter();
        zr_net::client_endpoint(server)?
    };
    let connection = runtime.block_on(zr_net::endpoint::connect_to(
        &endpoint,
        &security,
        server,
        timeout,
        zr_net::Windows::DEFAULT,
        Some(zr_net::tls::Role::Node),
    ))?;
    let started = Instant::now();
    runtime.block_on(async {
        let mut pieces = (0..bytes).step_by(PIECE as usize);
        let mut arriving = futures::stream::FuturesUnordered::new();
        loop {
            while arriving.len() < 8 {
                let Some(offset) = pieces.next() else { break };
                let len = (bytes - offset).min(PIECE);
                let connection = connection.clone();
                arriving.push(async move {
                    let request = len.to_le_bytes().to_vec();
                    zr_net::call(&connection, request, Vec::new(), timeout).await
                });
            }
            match futures::StreamExt::next(&mut arriving).await {
                Some(reply) => {
                    reply?;
                }
                None => return Ok::<(), Failed>(()),
            }
        }
    })?;
    Ok(started.elapsed().as_secs_f64())
}
