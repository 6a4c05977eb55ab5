//! The zrecord demo: an in-process cluster of 4 shards behind a router, loaded with sample
//! data through the router, then random batch gathers — verified — with their throughput:
//! one hop (straight from the nodes, as clients read by default), then through the router.
//!
//! ```text
//! cargo run --release -p zr-sim [-- --records 200000 --seconds 5 --shards 4 --replicas 2]
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use zr_common::hash::{mix2, reduce};
use zr_common::Record;
use zr_sim::{SimCluster, SimOptions};

/// Start an in-process zrecord cluster, load sample records through its router, and measure
/// verified random batch gathers.
#[derive(Parser)]
#[command(name = "zr-sim", version)]
struct Args {
    /// Shards (nodes) in the cluster.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Nodes holding each shard (every record on this many nodes; reads spread over them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    replicas: u32,
    /// Sample records to load (1 KiB image + a short flate-compressed caption each).
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    /// Records per gather.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Seconds of gathers.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Keep the cluster's metadata in the etcd at this client URL (e.g. http://127.0.0.1:2379)
    /// instead of an embedded store.
    #[arg(long, value_name = "URL")]
    etcd: Option<String>,
}

const IMAGE_BYTES: usize = 1024;

/// Sample record `i`: an image whose bytes derive from `i`, and a caption naming `i`.
fn sample(i: u64, image: &mut [u8]) -> String {
    image[..8].copy_from_slice(&i.to_le_bytes());
    for (k, word) in image[8..].chunks_mut(8).enumerate() {
        word.copy_from_slice(&mix2(i, k as u64).to_le_bytes()[..word.len()]);
    }
    format!(
        "sample {i}: a {} shape",
        ["red", "green", "blue"][i as usize % 3]
    )
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    zr_common::alloc::tune();
    let args = Args::parse();
    // The etcd client's connections live on this runtime, beside the cluster's.
    let runtime = tokio::runtime::Runtime::new()?;
    let metadata = match &args.etcd {
        Some(url) => {
            // A prefix of this run's own: every run is a new cluster.
            let prefix = format!("/zr-sim/{}", zr_meta::cluster::new_cluster_id());
            let store = runtime.block_on(zr_meta::EtcdStore::connect(
                std::slice::from_ref(url),
                &prefix,
                Duration::from_secs(5),
            ))?;
            println!("metadata: etcd at {url}, keys under {prefix}");
            Some(std::sync::Arc::new(store) as std::sync::Arc<dyn zr_meta::MetaStore>)
        }
        None => None,
    };
    let options = SimOptions {
        fields: vec![
            ("image".into(), "raw".into()),
            ("caption".into(), "flate".into()),
        ],
        metadata,
        replicas: args.replicas,
        ..SimOptions::default()
    };
    let started = Instant::now();
    let cluster = SimCluster::start(args.shards, options)?;
    let client = cluster.client()?;
    let shape = if args.replicas == 1 {
        format!("{} shards", args.shards)
    } else {
        format!(
            "{} shards × {} replicas ({} nodes)",
            args.shards,
            args.replicas,
            args.shards * args.replicas
        )
    };
    println!(
        "cluster: {shape} and a router on {} (QUIC, mutual TLS from a generated cluster CA), started in {:.2} s",
        cluster.router_addr(),
        started.elapsed().as_secs_f64()
    );

    // Load through the router in batches of 1,024 records.
    let started = Instant::now();
    let mut images = vec![0u8; IMAGE_BYTES * 1024];
    let mut loaded = 0u64;
    while loaded < args.records {
        let count = 1024.min(args.records - loaded) as usize;
        let captions: Vec<String> = images
            .chunks_mut(IMAGE_BYTES)
            .take(count)
            .enumerate()
            .map(|(k, image)| sample(loaded + k as u64, image))
            .collect();
        let records: Vec<Record> = images
            .chunks(IMAGE_BYTES)
            .zip(&captions)
            .map(|(image, caption)| {
                Record::new()
                    .with("image", image)
                    .with("caption", caption.as_bytes())
            })
            .collect();
        client.append_many(&records)?;
        loaded += count as u64;
    }
    client.commit()?;
    let load_s = started.elapsed().as_secs_f64();
    println!(
        "loaded {} records ({:.1} MiB) through the router in {:.2} s ({:.1} MiB/s), committed on every node",
        loaded,
        (loaded as usize * IMAGE_BYTES) as f64 / (1 << 20) as f64,
        load_s,
        (loaded as usize * IMAGE_BYTES) as f64 / (1 << 20) as f64 / load_s
    );

    // Random batch gathers, every record checked: one hop (the client reads from the nodes
    // the router says hold each record, as every client does by default), then through the
    // router for comparison.
    let routed = cluster.client_via_router()?;
    let how = if client.reads_direct() {
        "one hop, straight from the nodes"
    } else {
        "through the router (the nodes could not be reached)"
    };
    let one_hop = measure(&client, &args, loaded, how)?;
    let two_hops = measure(&routed, &args, loaded, "through the router (two hops)")?;
    println!("  one hop / through the router: {:.2}x", one_hop / two_hops);
    Ok(())
}

/// Random batch gathers through `client` for `args.seconds`, every record checked; prints
/// the figures, said to be `how`; returns records/s.
fn measure(
    client: &zr_router::Client,
    args: &Args,
    loaded: u64,
    how: &str,
) -> Result<f64, Box<dyn std::error::Error + Send + Sync>> {
    let mut latencies = Vec::new();
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut expected = vec![0u8; IMAGE_BYTES];
    let budget = Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let mut batch_no = 0u64;
    while started.elapsed() < budget {
        let indices: Vec<u64> = (0..args.batch as u64)
            .map(|k| reduce(mix2(batch_no, k), loaded))
            .collect();
        let t = Instant::now();
        let columns = client.gather(&indices, &[])?;
        latencies.push(t.elapsed());
        for (pos, &i) in indices.iter().enumerate() {
            let caption = sample(i, &mut expected);
            let image = columns[0].get(pos).ok_or("short reply")?;
            if image != &expected[..] || columns[1].get(pos) != Some(caption.as_bytes()) {
                return Err(format!("record {i} came back wrong").into());
            }
        }
        records += indices.len() as u64;
        bytes += columns.iter().map(|c| c.data.len() as u64).sum::<u64>();
        batch_no += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pick =
        |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    println!(
        "gathered {batch_no} random batches of {} {how} in {elapsed:.1} s, every record verified:",
        args.batch
    );
    let rate = records as f64 / elapsed;
    println!(
        "  {:.0} records/s, {:.3} GiB/s, batch latency p50 {:.2} ms, p99 {:.2} ms",
        rate,
        bytes as f64 / elapsed / (1u64 << 30) as f64,
        pick(0.5),
        pick(0.99)
    );
    Ok(rate)
}
