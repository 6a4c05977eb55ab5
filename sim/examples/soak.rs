//! Soak run: a 3-shard cluster of real processes (each shard on 2 nodes by default) takes
//! random gathers and appends at full rate for `--seconds`, while one node is restarted
//! every `--restart-every` seconds (in turn, alternately stopped with SIGTERM and killed
//! with SIGKILL). Every gathered record is checked byte for byte. At the end it reports the
//! operations, the errors, the wrong bytes (must be 0) and every process's resident memory
//! (its own, and the data files it maps) at the start and at the end; the router's at every
//! restart too.
//!
//! ```text
//! cargo build --release -p zr-shard -p zr-router -p zr-sim --bins --examples
//! target/release/examples/soak --seconds 600            # the 10-minute soak
//! ```
//! Uses the zr-node and zr-router binaries beside the example (debug or release alike), on
//! 127.0.0.1. Exits non-zero if any byte came back wrong, or (with `--replicas` ≥ 2, where a
//! restart costs no request) if any request failed.

mod bench_common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use zr_common::hash::mix2;
use zr_common::Record;
use zr_net::tls;

use bench_common::Result;

/// Random gathers and appends at full rate against a 3-shard cluster of processes while
/// its nodes are restarted one at a time; every byte checked.
#[derive(Parser)]
struct Args {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Restart one node every this many seconds.
    #[arg(long, default_value_t = 60)]
    restart_every: u64,
    /// Shards.
    #[arg(long, default_value_t = 3)]
    shards: u32,
    /// Nodes per shard (with 1, the requests a restarting node's shard gets fail until it
    /// is back, and are counted as errors).
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// Records per gather.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Records loaded before the run.
    #[arg(long, default_value_t = 20_000)]
    records: u64,
}

/// The bytes of record `i`: a function of its index, so any gather can be checked.
fn row(i: u64) -> Vec<u8> {
    let len = 64 + (mix2(i, 1) % 1024) as usize;
    (0..len).map(|k| mix2(i, k as u64 + 2) as u8).collect()
}

/// A process's resident memory in MiB (Linux), if it runs: its own (heap, stacks:
/// `RssAnon`) and the data files it maps that are in memory (`RssFile`; a node's grows
/// with the records it serves from its page cache, and is given back under pressure).
#[derive(Clone, Copy)]
struct Rss {
    anon: f64,
    file: f64,
}

fn rss(pid: u32) -> Option<Rss> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib / 1024.0)
    };
    Some(Rss {
        anon: field("RssAnon:")?,
        file: field("RssFile:")?,
    })
}

fn show(rss: Option<Rss>) -> String {
    rss.map_or("-".to_string(), |r| {
        format!("{:.1} + {:.1}", r.anon, r.file)
    })
}

/// A base port with `count` free UDP ports after it on 127.0.0.1.
fn free_ports(count: u16) -> Result<u16> {
    for attempt in 0..200u64 {
        let base = 20_000 + (mix2(std::process::id() as u64, attempt) % 30_000) as u16;
        let free = (0..count).all(|k| std::net::UdpSocket::bind(("127.0.0.1", base + k)).is_ok());
        if free {
            return Ok(base);
        }
    }
    Err("no free ports found on 127.0.0.1".into())
}

/// The cluster's processes: nodes by number (shard × replicas + replica), and the router.
struct Cluster {
    node_bin: PathBuf,
    config: PathBuf,
    replicas: u32,
    nodes: Vec<Child>,
    router: Option<Child>,
}

impl Cluster {
    fn spawn_node(&self, node: u32) -> Result<Child> {
        let (shard, replica) = (node / self.replicas, node % self.replicas);
        Ok(Command::new(&self.node_bin)
            .args([
                "--shard",
                &shard.to_string(),
                "--replica",
                &replica.to_string(),
            ])
            .arg("--nodes")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?)
    }

    fn pids(&self) -> Vec<(String, u32)> {
        let mut pids: Vec<(String, u32)> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(n, c)| {
                let n = n as u32;
                (
                    format!("node {}/{}", n / self.replicas, n % self.replicas),
                    c.id(),
                )
            })
            .collect();
        if let Some(router) = &self.router {
            pids.push(("router".into(), router.id()));
        }
        pids
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.router.iter_mut().chain(self.nodes.iter_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Stops `child` with SIGTERM (waiting up to 15 s) or SIGKILL.
fn stop(child: &mut Child, gently: bool) -> Result<()> {
    if gently {
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                child.kill()?;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        child.kill()?;
    }
    child.wait()?;
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.shards == 0 || args.replicas == 0 || args.batch == 0 {
        return Err("--shards, --replicas and --batch must be at least 1".into());
    }
    let [node_bin, router_bin] =
        <[PathBuf; 2]>::try_from(bench_common::binaries_beside_me(&["zr-node", "zr-router"])?)
            .map_err(|_| "two binaries")?;
    let run = tempfile::tempdir()?;
    let dir = run.path();
    let certs = dir.join("certs");
    tls::init_certs(&certs, tls::CERT_VALID_DAYS)?;
    let count = args.shards * args.replicas;
    let base = free_ports(1 + count as u16)?;
    let text = zr_service::config::cluster_toml(
        args.shards,
        args.replicas,
        base,
        dir,
        &certs,
        &[("x".to_string(), "raw".to_string())],
    );
    let config = dir.join("nodes.toml");
    std::fs::write(&config, text)?;
    let mut cluster = Cluster {
        node_bin,
        config: config.clone(),
        replicas: args.replicas,
        nodes: Vec::new(),
        router: None,
    };
    for node in 0..count {
        let child = cluster.spawn_node(node)?;
        cluster.nodes.push(child);
    }
    let addr: SocketAddr = format!("127.0.0.1:{base}").parse()?;
    // The router exits if the nodes are not up yet: start it until it answers.
    let client = loop {
        let router = Command::new(&router_bin)
            .arg("--nodes")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        cluster.router = Some(router);
        match bench_common::connect_router(addr, &certs, Duration::from_secs(60), true) {
            Ok(client) => break client,
            Err(e) => {
                if let Some(mut router) = cluster.router.take() {
                    if router.try_wait()?.is_none() {
                        return Err(e);
                    }
                }
            }
        }
    };

    // Load.
    let mut loaded = client.len()?;
    while loaded < args.records {
        let rows: Vec<Vec<u8>> = (loaded..(loaded + 1024).min(args.records))
            .map(row)
            .collect();
        let records: Vec<Record> = rows.iter().map(|r| Record::new().with("x", r)).collect();
        loaded = client.append_many(&records)?.end;
    }
    client.commit()?;
    let start_rss: Vec<(String, Option<Rss>)> = cluster
        .pids()
        .into_iter()
        .map(|(name, pid)| (name, rss(pid)))
        .collect();
    println!(
        "soak: {} shards × {} replicas, {} records loaded; {} s of random gathers of {} and appends, \
         a node restarted every {} s",
        args.shards, args.replicas, loaded, args.seconds, args.batch, args.restart_every
    );

    // Run.
    let started = Instant::now();
    let mut next_restart = Duration::from_secs(args.restart_every);
    let mut restarts = 0u32;
    let (mut gathers, mut appends, mut records_checked) = (0u64, 0u64, 0u64);
    let (mut errors, mut wrong) = (0u64, 0u64);
    let mut len = loaded;
    let mut step = 0u64;
    while started.elapsed() < Duration::from_secs(args.seconds) {
        if started.elapsed() >= next_restart {
            let node = restarts % count;
            let gently = restarts.is_multiple_of(2);
            stop(&mut cluster.nodes[node as usize], gently)?;
            cluster.nodes[node as usize] = cluster.spawn_node(node)?;
            let router = cluster.router.as_ref().and_then(|r| rss(r.id()));
            println!(
                "  {:>5.0} s: node {}/{} {} and restarted; router RSS {} MiB",
                started.elapsed().as_secs_f64(),
                node / args.replicas,
                node % args.replicas,
                if gently {
                    "stopped (SIGTERM)"
                } else {
                    "killed (SIGKILL)"
                },
                show(router)
            );
            restarts += 1;
            next_restart += Duration::from_secs(args.restart_every);
        }
        step += 1;
        if step.is_multiple_of(8) {
            let rows: Vec<Vec<u8>> = (len..len + 16).map(row).collect();
            let records: Vec<Record> = rows.iter().map(|r| Record::new().with("x", r)).collect();
            match client.append_many(&records) {
                Ok(range) if range.start == len => {
                    len = range.end;
                    appends += 1;
                }
                Ok(range) => return Err(format!("appended at {range:?}, expected at {len}").into()),
                Err(e) => {
                    errors += 1;
                    eprintln!("  append failed: {e}");
                    // What landed, if anything, is what the cluster says.
                    if let Ok(now) = client.len() {
                        len = now;
                    }
                }
            }
            continue;
        }
        let indices: Vec<u64> = (0..args.batch as u64)
            .map(|k| mix2(step, k) % len)
            .collect();
        match client.gather(&indices, &[]) {
            Ok(columns) => {
                gathers += 1;
                for (pos, &i) in indices.iter().enumerate() {
                    records_checked += 1;
                    if columns[0].get(pos) != Some(&row(i)[..]) {
                        wrong += 1;
                    }
                }
            }
            Err(e) => {
                errors += 1;
                eprintln!("  gather failed: {e}");
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "soak: {seconds:.0} s, {gathers} gathers ({:.0}/s, {records_checked} records checked), \
         {appends} appends of 16, {restarts} restarts; errors {errors}, wrong records {wrong}",
        gathers as f64 / seconds
    );
    println!(
        "RSS in MiB, own (heap, stacks) + mapped data files in memory \
         (a restarted node's end figure is its new process's)"
    );
    println!("{:<12} {:>16} {:>16}", "process", "start", "end");
    for ((name, before), (_, pid)) in start_rss.iter().zip(cluster.pids()) {
        println!("{name:<12} {:>16} {:>16}", show(*before), show(rss(pid)));
    }
    if wrong > 0 {
        return Err(format!("{wrong} records came back wrong").into());
    }
    if errors > 0 && args.replicas >= 2 {
        return Err(format!("{errors} requests failed with every shard replicated").into());
    }
    Ok(())
}
