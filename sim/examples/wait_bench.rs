//! Consumers waiting for records a producer has not committed yet: the time from the
//! producer's commit call to each waiting gather's return, with 1 waiter and with many, for
//! a commit through the waiters' own router (it wakes them at once) and through another
//! router (its commits are read from the metadata store by one task per dataset). The
//! baseline is a plain gather of one committed record, measured in the same run.
//!
//! ```text
//! cargo run --release -p zr-sim --example wait_bench -- [--waiters 2000] [--rounds 5] [--single-rounds 100]
//! ```
//! A waiter holds no indices at the router while it waits (`WaitLen`, then its gather, one
//! hop), so many waiters cost the router a subscription each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use zr_common::Record;
use zr_net::tls::Role;
use zr_router::{AsyncClient, ClientOptions};
use zr_sim::{SimCluster, SimOptions};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Commit-to-waiting-gather latency with 1 and many waiters, through one or two routers.
#[derive(Parser)]
struct Args {
    /// Waiters at once in the many-waiter rows.
    #[arg(long, default_value_t = 2000)]
    waiters: usize,
    /// Commits measured with many waiters.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Commits measured with one waiter.
    #[arg(long, default_value_t = 100)]
    single_rounds: u32,
    /// Shards.
    #[arg(long, default_value_t = 2)]
    shards: u32,
}

/// Streams one connection may have open at once are capped: waiters are spread over
/// clients of at most this many each.
const WAITERS_PER_CLIENT: usize = 1000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let k = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(k).copied().unwrap_or_default()
}

async fn connect(cluster: &SimCluster, router: std::net::SocketAddr) -> Result<AsyncClient> {
    let options = ClientOptions::with_timeout(Duration::from_secs(60));
    Ok(AsyncClient::connect_with(router, cluster.security(Role::Writer)?, options).await?)
}

/// One commit of one record with `waiters` gathers waiting for it on `consumers`: each
/// waiter's time from the commit call to its gather's return.
async fn round(
    producer: &AsyncClient,
    consumers: &[Arc<AsyncClient>],
    waiters: usize,
    k: u64,
) -> Result<Vec<Duration>> {
    let next = producer.len().await?;
    let committed_at = Arc::new(std::sync::OnceLock::<Instant>::new());
    let waiting = (0..waiters).map(|w| {
        let consumer = Arc::clone(&consumers[w % consumers.len()]);
        async move {
            let columns = consumer
                .gather_waiting(&[next], &[], Duration::from_secs(60))
                .await?;
            let returned = Instant::now();
            if columns[0].get(0) != Some(&k.to_le_bytes()[..]) {
                return Err::<Instant, Box<dyn std::error::Error + Send + Sync>>(
                    format!("record {next} read back wrong").into(),
                );
            }
            Ok(returned)
        }
    });
    let produce = {
        let committed_at = Arc::clone(&committed_at);
        async move {
            // Every waiter's wait has reached its router.
            tokio::time::sleep(Duration::from_millis(50 + waiters as u64 / 4)).await;
            producer
                .append(&Record::new().with("x", &k.to_le_bytes()))
                .await?;
            let _ = committed_at.set(Instant::now());
            producer.commit().await?;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }
    };
    let (returned, produced) = tokio::join!(futures_all(waiting), produce);
    produced?;
    let at = *committed_at.get().ok_or("no commit made")?;
    returned
        .into_iter()
        .map(|r| r.map(|t| t.saturating_duration_since(at)))
        .collect()
}

/// Runs `futures` concurrently on this task; their outputs in order.
async fn futures_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    futures::future::join_all(futures).await
}

fn row(name: &str, mut waits: Vec<Duration>, baseline: Duration) {
    waits.sort();
    let (p50, p99) = (percentile(&waits, 0.5), percentile(&waits, 0.99));
    println!(
        "{name:<44} p50 {:>8.2} ms  p99 {:>8.2} ms  ({} returns; p50 {:.1}x a plain gather)",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        waits.len(),
        p50.as_secs_f64() / baseline.as_secs_f64().max(1e-9)
    );
}

fn main() -> Result<()> {
    let args = Args::parse();
    let options = SimOptions {
        fields: vec![("x".into(), "raw".into())],
        ..SimOptions::default()
    };
    let mut cluster = SimCluster::start(args.shards, options)?;
    let second = cluster.add_router()?;
    let first = cluster.router_addr();
    let clients_for = |n: usize| n.div_ceil(WAITERS_PER_CLIENT).max(1);
    let (producer, same, other) = cluster.run(async {
        let producer = connect(&cluster, first).await?;
        let mut same = Vec::new();
        let mut other = Vec::new();
        for _ in 0..clients_for(args.waiters) {
            same.push(Arc::new(connect(&cluster, first).await?));
            other.push(Arc::new(connect(&cluster, second).await?));
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((producer, same, other))
    })?;
    // The baseline: gathers of one committed record, as each waiter ends with.
    let baseline = cluster.run(async {
        producer.append(&Record::new().with("x", &[0u8; 8])).await?;
        producer.commit().await?;
        let mut took = Vec::new();
        for _ in 0..200 {
            let began = Instant::now();
            same[0].gather(&[0], &[]).await?;
            took.push(began.elapsed());
        }
        took.sort();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(percentile(&took, 0.5))
    })?;
    println!(
        "{} shards, two routers; a plain gather of one record: p50 {:.3} ms",
        args.shards,
        baseline.as_secs_f64() * 1e3
    );
    let mut k = 1u64;
    let mut measure = |consumers: &[Arc<AsyncClient>], waiters: usize, rounds: u32| {
        let mut waits = Vec::new();
        for _ in 0..rounds {
            waits.extend(cluster.run(round(&producer, consumers, waiters, k))?);
            k += 1;
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(waits)
    };
    let one_same = measure(&same[..1], 1, args.single_rounds)?;
    let many_same = measure(&same, args.waiters, args.rounds)?;
    let one_other = measure(&other[..1], 1, args.single_rounds)?;
    let many_other = measure(&other, args.waiters, args.rounds)?;
    row("1 waiter, commit through its router", one_same, baseline);
    row(
        &format!("{} waiters, commit through their router", args.waiters),
        many_same,
        baseline,
    );
    row(
        "1 waiter, commit through another router",
        one_other,
        baseline,
    );
    row(
        &format!("{} waiters, commit through another router", args.waiters),
        many_other,
        baseline,
    );
    Ok(())
}
