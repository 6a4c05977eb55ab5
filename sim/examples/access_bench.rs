//! What access control costs, in one run: random gathers by a reader whose certificate has a
//! name, with no grant in the cluster (the baseline) and with grants enforced (its grant
//! covering the dataset, beside others that do not), one hop and through the router, in
//! alternating turns so the machine's load weighs on both alike. Then the time from
//! `zr cluster revoke` (`Client::revoke`) to the first refused one-hop gather of the revoked
//! certificate, over several revocations. Last, on a cluster whose routers and nodes limit
//! each certificate's bytes per second: another reader's gather latency while one reader
//! holds 2,000 waiting gathers and floods gathers one hop and through the router, beside
//! the same reader's latency with the cluster idle.
//!
//! ```text
//! cargo run --release -p zr-sim --example access_bench -- [--seconds 8] [--rounds 8] [--revocations 10] [--flood-seconds 8]
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use zr_common::hash::mix2;
use zr_common::Record;
use zr_net::tls::Role;
use zr_router::{Client, ClientOptions, Grant};
use zr_sim::{SimCluster, SimOptions};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Gathers with and without grants enforced, and revocation latency.
#[derive(Parser)]
struct Args {
    /// Seconds of gathers per method and setting (split over the rounds).
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    /// Turns each setting takes.
    #[arg(long, default_value_t = 8)]
    rounds: u32,
    /// Records in the dataset.
    #[arg(long, default_value_t = 20_000)]
    records: u64,
    /// Bytes per record.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Records per gather.
    #[arg(long, default_value_t = 256)]
    batch: u64,
    /// Shards.
    #[arg(long, default_value_t = 2)]
    shards: u32,
    /// Revocations timed.
    #[arg(long, default_value_t = 10)]
    revocations: u32,
    /// Seconds of latency samples, idle and under the flood, each.
    #[arg(long, default_value_t = 8.0)]
    flood_seconds: f64,
    /// Waiting gathers the flooding reader holds.
    #[arg(long, default_value_t = 2_000)]
    waiters: usize,
    /// Gathers the flooding reader keeps in flight besides.
    #[arg(long, default_value_t = 16)]
    flooders: usize,
    /// `mib_per_second_per_identity` of the flood's cluster (routers and nodes).
    #[arg(long, default_value_t = 64)]
    mib_per_second: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    grants_and_revocations(&args)?;
    neighbours(&args)
}

/// Gathers with grants beside gathers without them, and revocation latency.
fn grants_and_revocations(args: &Args) -> Result<()> {
    let options = SimOptions {
        fields: vec![("x".into(), "raw".into())],
        ..SimOptions::default()
    };
    let cluster = SimCluster::start(args.shards, options)?;
    let certs = cluster.certs_dir().ok_or("a secured cluster")?;
    let connect = |role: Role, name: &str, direct: bool| -> Result<Client> {
        let home = zr_net::tls::issue_cert(&certs, role, name, 1)?;
        let options = ClientOptions {
            direct,
            timeout: cluster.client_timeout(),
            ..ClientOptions::default()
        };
        let security = zr_net::Security::load(&home, role)?;
        Ok(Client::connect_with(
            cluster.router_addr(),
            security,
            options,
        )?)
    };
    let operator = connect(Role::Operator, "ops", true)?;
    let imgs = operator.create_dataset("imgs", vec![zr_router::FieldInfo::new("x", "raw")])?;
    operator.create_dataset("text", vec![zr_router::FieldInfo::new("x", "raw")])?;
    fill(&imgs, args)?;
    let payload = |i: u64| payload(i, args.size);
    let one_hop = connect(Role::Reader, "team-a", true)?.dataset("imgs")?;
    let via_router = {
        let home = certs.join("reader-team-a");
        let options = ClientOptions {
            direct: false,
            timeout: cluster.client_timeout(),
            ..ClientOptions::default()
        };
        Client::connect_with(
            cluster.router_addr(),
            zr_net::Security::load(&home, Role::Reader)?,
            options,
        )?
        .dataset("imgs")?
    };
    if !one_hop.reads_direct() {
        return Err("the one-hop client reads through the router".into());
    }

    // Grants to switch on and off: team-a's own, and others' that it does not match.
    let grants: Vec<Grant> = [("team-a", "imgs*"), ("team-b", "text"), ("team-c", "*")]
        .into_iter()
        .map(|(who, pattern)| Grant {
            who: who.into(),
            write: false,
            pattern: pattern.into(),
        })
        .collect();
    let set_grants = |on: bool| -> Result<()> {
        for g in &grants {
            operator.grant(g.clone(), !on, false)?;
        }
        // Every router and node reads the record at least once a second.
        std::thread::sleep(2 * zr_meta::access::WATCH_EVERY + Duration::from_millis(200));
        Ok(())
    };

    let per_turn = Duration::from_secs_f64(args.seconds / f64::from(args.rounds));
    // [method][setting]: (gathers, seconds).
    let mut totals = [[(0u64, 0f64); 2]; 2];
    let methods = [("one hop", &one_hop), ("through the router", &via_router)];
    let mut seed = 0u64;
    for round in 0..args.rounds {
        // Alternate which setting goes first.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for granted in order {
            set_grants(granted)?;
            for (m, (_, client)) in methods.iter().enumerate() {
                let started = Instant::now();
                let mut gathers = 0u64;
                while started.elapsed() < per_turn {
                    seed += 1;
                    let indices: Vec<u64> = (0..args.batch)
                        .map(|k| mix2(seed, k) % args.records)
                        .collect();
                    let columns = client.gather(&indices, &[])?;
                    if columns[0].get(0) != Some(&payload(indices[0])[..]) {
                        return Err(format!("record {} differs", indices[0]).into());
                    }
                    gathers += 1;
                }
                let total = &mut totals[m][usize::from(granted)];
                total.0 += gathers;
                total.1 += started.elapsed().as_secs_f64();
            }
        }
    }
    set_grants(false)?;
    println!(
        "{} shards, {} records of {} B, gathers of {}; {} turns of {:.1} s each",
        args.shards,
        args.records,
        args.size,
        args.batch,
        args.rounds,
        per_turn.as_secs_f64()
    );
    println!(
        "{:<20} {:>16} {:>16} {:>10}",
        "gathers", "no grants /s", "grants /s", "ratio"
    );
    for (m, (name, _)) in methods.iter().enumerate() {
        let rate = |(n, s): (u64, f64)| n as f64 / s;
        let (without, with) = (rate(totals[m][0]), rate(totals[m][1]));
        println!(
            "{name:<20} {without:>16.0} {with:>16.0} {:>9.3}x",
            with / without
        );
    }

    // Revocation: from the call's return to the first refused one-hop gather.
    let mut took = Vec::new();
    for _ in 0..args.revocations {
        operator.revoke("team-a", false)?;
        let revoked = Instant::now();
        loop {
            if one_hop.gather(&[0], &[]).is_err() {
                took.push(revoked.elapsed());
                break;
            }
            if revoked.elapsed() > Duration::from_secs(30) {
                return Err("team-a still served 30 s after its revocation".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        operator.revoke("team-a", true)?;
        let undone = Instant::now();
        while one_hop.gather(&[0], &[]).is_err() {
            if undone.elapsed() > Duration::from_secs(30) {
                return Err("team-a still refused 30 s after the undo".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "revocation to the first refused one-hop gather, {} times: median {:.0} ms, max {:.0} ms",
        took.len(),
        ms(took[took.len() / 2]),
        ms(took[took.len() - 1])
    );
    Ok(())
}

/// Another reader's gather latency (sampled every 10 ms, so that its own rate stays under
/// the limit) idle, then while one reader holds `--waiters` waiting gathers and keeps
/// `--flooders` gathers in flight, half one hop and half through the router.
fn neighbours(args: &Args) -> Result<()> {
    let options = SimOptions {
        fields: vec![("x".into(), "raw".into())],
        mib_per_second_per_identity: Some(args.mib_per_second),
        ..SimOptions::default()
    };
    let cluster = SimCluster::start(args.shards, options)?;
    let certs = cluster.certs_dir().ok_or("a secured cluster")?;
    let writer = cluster.client()?;
    fill(&writer, args)?;
    let options = |direct: bool| ClientOptions {
        direct,
        timeout: Duration::from_secs(120),
        ..ClientOptions::default()
    };
    let security = |name: &str| -> Result<zr_net::Security> {
        let home = zr_net::tls::issue_cert(&certs, Role::Reader, name, 1)?;
        Ok(zr_net::Security::load(&home, Role::Reader)?)
    };
    let team_b = Client::connect_with(cluster.router_addr(), security("team-b")?, options(true))?;
    let (records, batch) = (args.records, args.batch);
    let sample = |seconds: f64| -> Result<Vec<Duration>> {
        let mut took = Vec::new();
        let began = Instant::now();
        let mut seed = 1u64 << 40;
        while began.elapsed().as_secs_f64() < seconds {
            seed += 1;
            let indices: Vec<u64> = (0..batch).map(|k| mix2(seed, k) % records).collect();
            let started = Instant::now();
            team_b.gather(&indices, &[])?;
            took.push(started.elapsed());
            std::thread::sleep(Duration::from_millis(10));
        }
        took.sort();
        Ok(took)
    };
    let idle = sample(args.flood_seconds)?;

    // The flood, on a runtime of its own: one certificate, a client per path.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let flooder = security("team-x")?;
    let clients = runtime.block_on(async {
        let mut clients = Vec::new();
        for direct in [true, false] {
            let client = zr_router::AsyncClient::connect_with(
                cluster.router_addr(),
                flooder.clone(),
                options(direct),
            )
            .await?;
            clients.push(std::sync::Arc::new(client));
        }
        Ok::<_, zr_router::Error>(clients)
    })?;
    let past_end: std::sync::Arc<Vec<u64>> =
        std::sync::Arc::new((records..records + 1000).collect());
    let waiters: Vec<_> = (0..args.waiters)
        .map(|k| {
            let (client, indices) = (
                std::sync::Arc::clone(&clients[1]),
                std::sync::Arc::clone(&past_end),
            );
            runtime.spawn(async move {
                let _ = client
                    .gather_waiting(&indices, &[], Duration::from_secs(600))
                    .await;
                k
            })
        })
        .collect();
    let flooding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flooded = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let flood: Vec<_> = (0..args.flooders)
        .map(|k| {
            let client = std::sync::Arc::clone(&clients[k % 2]);
            let (flooding, flooded) = (
                std::sync::Arc::clone(&flooding),
                std::sync::Arc::clone(&flooded),
            );
            runtime.spawn(async move {
                let mut seed = k as u64;
                while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                    seed += 1 << 20; // apart from the other tasks' seeds
                    let indices: Vec<u64> = (0..batch).map(|i| mix2(seed, i) % records).collect();
                    if let Ok(columns) = client.gather(&indices, &[]).await {
                        flooded.fetch_add(
                            columns[0].data.len() as u64,
                            std::sync::atomic::Ordering::Relaxed,
                        );
                    }
                }
            })
        })
        .collect();
    // Every waiter's wait reaches the router, and the flood runs at its pace.
    std::thread::sleep(Duration::from_secs(3));
    let flood_began = (
        Instant::now(),
        flooded.load(std::sync::atomic::Ordering::Relaxed),
    );
    let loaded = sample(args.flood_seconds)?;
    let flood_rate = (flooded.load(std::sync::atomic::Ordering::Relaxed) - flood_began.1) as f64
        / flood_began.0.elapsed().as_secs_f64();
    let still_waiting = waiters.iter().filter(|w| !w.is_finished()).count();
    flooding.store(false, std::sync::atomic::Ordering::Relaxed);
    for task in waiters {
        task.abort();
    }
    runtime.block_on(async {
        for task in flood {
            let _ = task.await;
        }
    });
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q) as usize];
    println!(
        "neighbours, {} MiB/s per certificate per server: team-x holds {still_waiting} waiting gathers and {} gathers in flight ({:.0} MiB/s read); team-b gathers {batch} records every 10 ms",
        args.mib_per_second,
        args.flooders,
        flood_rate / f64::from(1 << 20),
    );
    println!(
        "{:<20} {:>12} {:>12} {:>10}",
        "team-b latency", "idle ms", "flood ms", "ratio"
    );
    for (name, q) in [("median", 0.5), ("p99", 0.99)] {
        let (i, l) = (ms(at(&idle, q)), ms(at(&loaded, q)));
        println!("{name:<20} {i:>12.2} {l:>12.2} {:>9.2}x", l / i);
    }
    Ok(())
}

/// Record `i`'s bytes.
fn payload(i: u64, size: usize) -> Vec<u8> {
    (0..size as u64).map(|k| mix2(i, k) as u8).collect()
}

/// Appends and commits `--records` records through `client`.
fn fill(client: &Client, args: &Args) -> Result<()> {
    let mut start = 0;
    while start < args.records {
        let end = (start + 2048).min(args.records);
        let rows: Vec<Vec<u8>> = (start..end).map(|i| payload(i, args.size)).collect();
        let records: Vec<Record> = rows.iter().map(|r| Record::new().with("x", r)).collect();
        client.append_many(&records)?;
        start = end;
    }
    client.commit()?;
    Ok(())
}
