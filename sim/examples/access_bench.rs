//! What access control costs, in one run: random gathers by a reader whose certificate has a
//! name, with no grant in the cluster (the baseline) and with grants enforced (its grant
//! covering the dataset, beside others that do not), one hop and through the router, in
//! alternating turns so the machine's load weighs on both alike. Then the time from
//! `zr cluster revoke` (`Client::revoke`) to the first refused one-hop gather of the revoked
//! certificate, over several revocations.
//!
//! ```text
//! cargo run --release -p zr-sim --example access_bench -- [--seconds 8] [--rounds 8] [--revocations 10]
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
}

fn main() -> Result<()> {
    let args = Args::parse();
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
    let payload = |i: u64| -> Vec<u8> { (0..args.size as u64).map(|k| mix2(i, k) as u8).collect() };
    let mut start = 0;
    while start < args.records {
        let end = (start + 2048).min(args.records);
        let rows: Vec<Vec<u8>> = (start..end).map(payload).collect();
        let records: Vec<Record> = rows.iter().map(|r| Record::new().with("x", r)).collect();
        imgs.append_many(&records)?;
        start = end;
    }
    imgs.commit()?;
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
