//! Named datasets through the router, in one run: appends and gathers with 1 dataset and
//! with 8 side by side (the same records and bytes in all, the same clients), and the time
//! from a commit to a waiting consumer's gather returning.
//!
//! ```text
//! cargo run --release -p zr-sim --example datasets_bench -- [--records 64000] [--size 1024] [--seconds 3]
//! ```
//! The ratio of each 8-dataset figure to its 1-dataset one is what to read: the machine is
//! shared and noisy, and both run in turns within the same run.

use std::time::{Duration, Instant};

use clap::Parser;
use zr_common::hash::mix2;
use zr_common::Record;
use zr_net::tls::Role;
use zr_router::{Client, FieldInfo};
use zr_sim::{SimCluster, SimOptions};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Appends and gathers with 1 vs 8 datasets; commit-to-consumer latency.
#[derive(Parser)]
struct Args {
    /// Records in all (split evenly over the datasets).
    #[arg(long, default_value_t = 64_000)]
    records: u64,
    /// Record size in bytes.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Records per append and per gather.
    #[arg(long, default_value_t = 1000)]
    batch: u64,
    /// Seconds of gathers per layout (in rounds, taking turns).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Shards.
    #[arg(long, default_value_t = 2)]
    shards: u32,
    /// Commits the latency is measured over.
    #[arg(long, default_value_t = 200)]
    commits: u32,
}

const CLIENTS: usize = 8;
const ROUNDS: u32 = 6;

fn field() -> Vec<FieldInfo> {
    vec![FieldInfo::new("x", "raw")]
}

fn connect(cluster: &SimCluster, dataset: &str) -> Result<Client> {
    let client = Client::connect_with_timeout(
        cluster.router_addr(),
        cluster.security(Role::Operator)?,
        cluster.client_timeout(),
    )?;
    Ok(client.dataset(dataset)?)
}

/// Client k's dataset: all share one, or each has its own.
fn dataset_of(layout: usize, k: usize) -> String {
    if layout == 1 {
        "one".into()
    } else {
        format!("part-{k}")
    }
}

/// Appends `records` through CLIENTS clients at once; returns records per second.
fn append(cluster: &SimCluster, layout: usize, args: &Args) -> Result<f64> {
    let per_client = args.records / CLIENTS as u64;
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|k| {
                let client = connect(cluster, &dataset_of(layout, k));
                scope.spawn(move || -> Result<()> {
                    let client = client?;
                    let mut done = 0;
                    while done < per_client {
                        let n = args.batch.min(per_client - done);
                        let rows: Vec<Vec<u8>> = (0..n)
                            .map(|i| vec![mix2(k as u64, done + i) as u8; args.size])
                            .collect();
                        let records: Vec<Record> =
                            rows.iter().map(|r| Record::new().with("x", r)).collect();
                        client.append_many(&records)?;
                        done += n;
                    }
                    client.commit()?;
                    Ok(())
                })
            })
            .collect();
        for worker in workers {
            worker
                .join()
                .map_err(|_| "an appending client panicked")??;
        }
        Ok(())
    })?;
    Ok((per_client * CLIENTS as u64) as f64 / started.elapsed().as_secs_f64())
}

/// Random gathers through CLIENTS clients at once for `seconds`; returns records per second.
fn gather(clients: &[Client], lens: &[u64], batch: u64, seconds: f64, seed: u64) -> Result<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let counts = std::thread::scope(|scope| -> Result<Vec<u64>> {
        let workers: Vec<_> = clients
            .iter()
            .zip(lens)
            .enumerate()
            .map(|(k, (client, &len))| {
                scope.spawn(move || -> Result<u64> {
                    let mut gathered = 0;
                    let mut round = 0;
                    while Instant::now() < deadline {
                        let indices: Vec<u64> = (0..batch)
                            .map(|i| mix2(seed ^ k as u64, round * batch + i) % len)
                            .collect();
                        client.gather(&indices, &[])?;
                        gathered += batch;
                        round += 1;
                    }
                    Ok(gathered)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| "a gathering client panicked")?)
            .collect()
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64())
}

/// Commits of one record each, a consumer waiting for every one: per commit, the time from
/// the producer's commit call to the consumer's gather returning.
fn latency(cluster: &SimCluster, commits: u32) -> Result<Vec<Duration>> {
    let admin = cluster.client()?;
    admin.create_dataset("stream", field())?;
    let producer = connect(cluster, "stream")?;
    let consumer = connect(cluster, "stream")?;
    let (sent, received) = std::sync::mpsc::channel::<Instant>();
    std::thread::scope(|scope| -> Result<Vec<Duration>> {
        let waiter = scope.spawn(move || -> Result<Vec<Instant>> {
            (0..commits as u64)
                .map(|i| {
                    consumer.gather_waiting(&[i], &[], Duration::from_secs(30))?;
                    Ok(Instant::now())
                })
                .collect()
        });
        for i in 0..commits {
            producer.append(&Record::new().with("x", &i.to_le_bytes()))?;
            std::thread::sleep(Duration::from_millis(5));
            sent.send(Instant::now())?;
            producer.commit()?;
        }
        let returned = waiter.join().map_err(|_| "the consumer panicked")??;
        drop(sent);
        let started: Vec<Instant> = received.iter().collect();
        Ok(started
            .iter()
            .zip(&returned)
            .map(|(s, r)| r.saturating_duration_since(*s))
            .collect())
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let k = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(k).copied().unwrap_or_default()
}

fn main() -> Result<()> {
    let args = Args::parse();
    let options = SimOptions {
        fields: vec![("x".into(), "raw".into())],
        ..SimOptions::default()
    };
    let cluster = SimCluster::start(args.shards, options)?;
    let admin = cluster.client()?;
    admin.create_dataset("one", field())?;
    for k in 0..CLIENTS {
        admin.create_dataset(&format!("part-{k}"), field())?;
    }
    println!(
        "{} shards, {} records of {} bytes in all, {CLIENTS} clients; 1 dataset vs {CLIENTS} side by side",
        args.shards, args.records, args.size
    );
    let mut appends = [0.0; 2];
    for (slot, layout) in [(0, 1), (1, CLIENTS)] {
        appends[slot] = append(&cluster, layout, &args)?;
    }
    let clients: Vec<Vec<Client>> = [1, CLIENTS]
        .iter()
        .map(|&layout| {
            (0..CLIENTS)
                .map(|k| connect(&cluster, &dataset_of(layout, k)))
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<_>>()?;
    let lens: Vec<Vec<u64>> = clients
        .iter()
        .map(|cs| {
            cs.iter()
                .map(|c| c.len())
                .collect::<std::result::Result<_, _>>()
        })
        .collect::<std::result::Result<_, _>>()?;
    let mut gathered = [(0.0, 0.0); 2];
    for round in 0..ROUNDS {
        for slot in 0..2 {
            let rate = gather(
                &clients[slot],
                &lens[slot],
                args.batch,
                args.seconds / ROUNDS as f64,
                round as u64,
            )?;
            gathered[slot].0 += rate;
            gathered[slot].1 += 1.0;
        }
    }
    let gathers = [gathered[0].0 / gathered[0].1, gathered[1].0 / gathered[1].1];
    println!(
        "appends   1 dataset {:>10.0} rec/s   {CLIENTS} datasets {:>10.0} rec/s   ratio {:.2}x",
        appends[0],
        appends[1],
        appends[1] / appends[0]
    );
    println!(
        "gathers   1 dataset {:>10.0} rec/s   {CLIENTS} datasets {:>10.0} rec/s   ratio {:.2}x",
        gathers[0],
        gathers[1],
        gathers[1] / gathers[0]
    );
    let mut waits = latency(&cluster, args.commits)?;
    waits.sort();
    println!(
        "commit -> waiting consumer's gather returns: p50 {:.2} ms, p99 {:.2} ms ({} commits)",
        percentile(&waits, 0.5).as_secs_f64() * 1e3,
        percentile(&waits, 0.99).as_secs_f64() * 1e3,
        waits.len()
    );
    Ok(())
}
