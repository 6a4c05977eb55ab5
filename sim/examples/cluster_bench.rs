//! Cluster benchmark on loopback, all in one run: gathers through the router (two hops) vs
//! the client library's one-hop gathers (straight to the nodes, the default) vs the same
//! requests sent to the nodes by hand vs a plain single-stream quinn transfer of the same
//! bytes (the baseline of every ratio) vs plain TCP.
//!
//! ```text
//! cargo run --release -p zr-sim --example cluster_bench -- [--seconds 3] [--shards 4] [--sizes 1024,16384]
//! ```
//! All transfers use the cluster's mutual TLS. The methods take turns (`--rounds`), so the
//! load of a shared machine weighs on all of them alike, and each makes at least
//! `--min-batches` batches, so that its p99 rests on a few hundred. For reference it also measures plain
//! quinn from 4 servers a quarter each (what the transport alone costs a 4-way gather) and
//! with server and client on one runtime (fewer threads than separate processes have); the
//! baseline's server runs on a runtime of its own, as the nodes do. And what the nodes do
//! for a batch without the network (decode, gather, build the reply), on one thread; and the
//! nodes' request loop from 4 servers, answering requests of a gather's size with a
//! ready-made reply of a gather's shape (what serving costs beyond plain quinn, without
//! decoding or gathering). `--dataset-mib 4` keeps the records in the CPU's caches. Every
//! call runs as a task on its runtime, one per connection, as the router and the client
//! library run theirs. Each method also shows the process's CPU time per batch (all threads)
//! and the cores busy on average while it ran, then split by side: the servers' threads
//! (nodes and router, or plain servers) and the clients' (the client library's, the
//! bench's, the calling thread). A last line per size sets the one-hop client's CPU per
//! batch (client and nodes) against plain quinn's plus the nodes' own handling, from one
//! server and from four, and says on which side the rest lies.

mod bench_common;

use std::net::SocketAddr;
use std::time::Duration;

use bench_common::{
    connect_all, direct_gather, exchange, loop_server, quinn_server, take_turns, tcp_server,
    transfer, Figures, Result, Step, TcpLink,
};
use bytes::Bytes;
use clap::Parser;
use zr_common::hash::{mix2, reduce};
use zr_common::Record;
use zr_net::tls::Role;
use zr_proto::placement::{ClusterMap, Placement, EXTENT_RECORDS_DEFAULT};
use zr_proto::wire::{self, NodeMessage, NodeRequest};
use zr_sim::{SimCluster, SimOptions};

/// Router gathers vs direct-to-node gathers vs plain quinn and TCP transfers on loopback.
#[derive(Parser)]
struct Args {
    /// Seconds of measurement per method and record size (split over the rounds).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Shards.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Records loaded, in MiB of payload: small enough to stay in the CPU's caches (4), the
    /// nodes' copies cost no memory reads.
    #[arg(long, default_value_t = 256)]
    dataset_mib: u64,
    /// Records per batch.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Record sizes to measure, in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1024,16384")]
    sizes: Vec<usize>,
    /// Turns each method takes, each of seconds / rounds.
    #[arg(long, default_value_t = 10)]
    rounds: u32,
    /// Fewest batches per method (its turns run longer until then): a p99 needs a few hundred.
    #[arg(long, default_value_t = 300)]
    min_batches: usize,
    /// Connections the one-hop client opens to each node (0: by the core count).
    #[arg(long, default_value_t = 0)]
    connections: usize,
    /// Measure only the methods whose names contain one of these words (plain quinn, the
    /// baseline, always runs), e.g. `--only direct` to profile one path.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

/// The method every ratio is against.
const BASELINE: &str = "plain quinn, same bytes";

fn main() -> Result<()> {
    zr_common::alloc::tune();
    let args = Args::parse();
    println!(
        "loopback, batches of {} random records, {} shards; ratios against plain quinn",
        args.batch, args.shards
    );
    println!("{}", Figures::header("vs quinn"));
    for &size in &args.sizes {
        run(&args, size)?;
    }
    Ok(())
}

fn run(args: &Args, size: usize) -> Result<()> {
    let records = ((args.dataset_mib << 20) / size as u64).max(1);
    let cluster = SimCluster::start(args.shards, SimOptions::default())?;
    let client = cluster.client()?;
    let mut payload = vec![0u8; size * 1024];
    for (k, b) in payload.iter_mut().enumerate() {
        *b = mix2(size as u64, k as u64) as u8;
    }
    // `records` records in appends of up to 1,024, through `append`.
    let load = |append: &mut dyn FnMut(&[Record]) -> Result<()>| -> Result<()> {
        let mut loaded = 0;
        while loaded < records {
            let count = 1024.min(records - loaded) as usize;
            let batch: Vec<Record> = payload
                .chunks(size)
                .take(count)
                .map(|p| Record::new().with("data", p))
                .collect();
            append(&batch)?;
            loaded += count as u64;
        }
        Ok(())
    };
    load(&mut |batch| Ok(client.append_many(batch).map(|_| ())?))?;
    client.commit()?;
    let routed = cluster.client_via_router()?;
    let client = cluster.client_with_options(zr_router::ClientOptions {
        connections_per_node: args.connections,
        ..zr_router::ClientOptions::default()
    })?;
    if !client.reads_direct() {
        return Err("the client library could not reach the nodes: no one-hop row".into());
    }
    // The same records in one local store kept as a node keeps them — a unit per slot, each
    // record at its node address — for the nodes' request handling alone.
    let local_dir = tempfile::tempdir()?;
    let local = zr_shard::server::open_shard_store(cluster.config(), local_dir.path(), 0, 0)?;
    let one_shard = Placement::new(ClusterMap::balanced(1, EXTENT_RECORDS_DEFAULT, 1)?)?;
    let mut next = 0u64;
    load(&mut |batch| {
        let mut from = 0;
        for run in one_shard.runs(0, next, batch.len() as u64) {
            local.append_to(run.slot, &batch[from..from + run.count as usize])?;
            from += run.count as usize;
        }
        next += batch.len() as u64;
        Ok(())
    })?;
    local.commit()?;
    let coordination = zr_shard::fence::Coordination::open(local.disk(), local_dir.path())?;
    let batch_bytes = args.batch * size;
    let indices = |b: usize| -> Vec<u64> {
        (0..args.batch as u64)
            .map(|k| reduce(mix2(b as u64, k), records))
            .collect()
    };

    // 1. Through the router (two QUIC hops).
    let mut router = |b: usize| -> Result<()> {
        routed.gather(&indices(b), &[])?;
        Ok(())
    };
    // 1b. The client library's one-hop gathers: the router's plan and replica choice, run
    // by the client against the nodes.
    let mut one_hop = |b: usize| -> Result<()> {
        client.gather(&indices(b), &[])?;
        Ok(())
    };

    // For reference: what the nodes do for a batch, without the network: decode the request,
    // gather, build the reply (copy small records, read a byte of each page of large ones);
    // on one thread, all shards' shares in one request.
    let mut handling = |b: usize| -> Result<()> {
        let addresses = indices(b)
            .into_iter()
            .map(|g| one_shard.locate_address(g).1)
            .collect();
        let request = wire::encode_request(&NodeMessage::unchecked(NodeRequest::Gather {
            indices: addresses,
            fields: Vec::new(),
            checked: false,
        }))?;
        let (header, body) = zr_shard::server::handle(&local, &coordination, &request);
        let sent: usize = body.iter().map(|piece| piece.len()).sum();
        if sent != batch_bytes {
            return Err(
                format!("local handling: {sent} bytes, not {batch_bytes}: {header:?}").into(),
            );
        }
        Ok(())
    };

    // 2. Straight to the nodes by hand: one request per shard, nothing else (one hop).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()?;
    let placement = cluster.config().placement()?;
    let timeout = Duration::from_secs(10);
    // Direct and plain-quinn transfers use the cluster's TLS, as the router does.
    let as_router = cluster.security(Role::Router)?;
    let as_node = cluster.security(Role::Node)?;
    let shard_addrs: Vec<SocketAddr> = cluster.config().shards.iter().map(|s| s.addr).collect();
    let connections = runtime.block_on(connect_all(&shard_addrs, &as_router, timeout))?;
    let mut direct =
        |b: usize| direct_gather(&runtime, &placement, &connections, &indices(b), timeout);

    // 3. Plain quinn: one stream per batch, the server answers with `batch_bytes`; then the
    // same from 4 servers, a quarter each: what the transport alone costs a 4-way gather.
    // The servers run on a runtime of their own, as the nodes do on the cluster's.
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-servers")
        .enable_all()
        .build()?;
    let loopback: SocketAddr = "127.0.0.1:0".parse()?;
    let pool = Bytes::from(vec![7u8; batch_bytes]);
    let one = [quinn_server(&servers, loopback, &as_node, pool.clone())?];
    let one = runtime.block_on(connect_all(&one, &as_router, timeout))?;
    let four = (0..4)
        .map(|_| quinn_server(&servers, loopback, &as_node, pool.clone()))
        .collect::<Result<Vec<_>>>()?;
    let four = runtime.block_on(connect_all(&four, &as_router, timeout))?;
    let mut plain_quinn = |_: usize| transfer(&runtime, &one, batch_bytes, timeout);
    // For reference: server and client sharing one runtime (fewer threads on the 2 cores).
    let shared = [quinn_server(&runtime, loopback, &as_node, pool.clone())?];
    let shared = runtime.block_on(connect_all(&shared, &as_router, timeout))?;
    let mut shared_quinn = |_: usize| transfer(&runtime, &shared, batch_bytes, timeout);
    let mut four_quinn = |_: usize| transfer(&runtime, &four, batch_bytes / 4, timeout);
    // The nodes' request loop from 4 servers: a gather request's size in, a gather reply's
    // shape out (a quarter of the batch each), ready-made.
    let quarter = args.batch / 4;
    let request = wire::encode_request(&NodeMessage::unchecked(NodeRequest::Gather {
        indices: (0..quarter as u64).collect(),
        fields: Vec::new(),
        checked: false,
    }))?;
    let header = wire::encode_reply(&wire::Reply::Gather {
        lengths: vec![vec![size as u32; quarter]],
    })?;
    let reply = (header.clone(), pool.slice(..quarter * size));
    let looped = (0..4)
        .map(|_| loop_server(&servers, loopback, &as_node, reply.clone(), timeout))
        .collect::<Result<Vec<_>>>()?;
    let looped = runtime.block_on(connect_all(&looped, &as_router, timeout))?;
    let reply_bytes = header.len() + quarter * size;
    let mut request_loop = |_: usize| exchange(&runtime, &looped, &request, reply_bytes, timeout);

    // 4. Plain TCP: request a batch, read `batch_bytes`.
    let tcp_addr = tcp_server(&runtime, loopback, pool)?;
    let mut tcp_link = TcpLink::connect(&runtime, tcp_addr)?;
    let mut tcp = |_: usize| tcp_link.transfer(&runtime, batch_bytes);

    // The methods take turns, so that the machine's changing load weighs on all alike.
    let mut methods: [(&str, Step, Figures); 9] = [
        ("router gather (2 hops)", &mut router, Figures::default()),
        ("client one hop", &mut one_hop, Figures::default()),
        (
            "direct node gather (by hand)",
            &mut direct,
            Figures::default(),
        ),
        (BASELINE, &mut plain_quinn, Figures::default()),
        (
            "plain quinn, 4 servers x 1/4",
            &mut four_quinn,
            Figures::default(),
        ),
        ("plain TCP, same bytes", &mut tcp, Figures::default()),
        (
            "plain quinn, one runtime",
            &mut shared_quinn,
            Figures::default(),
        ),
        (
            "node handling, no network",
            &mut handling,
            Figures::default(),
        ),
        (
            "zr request loop, 4 x 1/4",
            &mut request_loop,
            Figures::default(),
        ),
    ];
    let chosen = |name: &str| {
        name == BASELINE || args.only.is_empty() || args.only.iter().any(|w| name.contains(w))
    };
    take_turns(
        &mut methods,
        args.seconds,
        args.rounds,
        args.min_batches,
        chosen,
    )?;
    let quinn_rate = methods[3].2.batches_per_second();
    for (name, _, f) in methods.iter().filter(|(name, _, _)| chosen(name)) {
        println!("{}", f.row(size, name, args.batch, quinn_rate));
    }
    // Each row's CPU split by side: the servers' threads (nodes and router, or the plain
    // servers) and the clients' (the client library's or the bench's, and the calling
    // thread). Not for the rows whose server runs on the client's threads (TCP, one
    // runtime) or that have none (the local handling).
    let own_servers = [0, 1, 2, 3, 4, 8];
    for (k, (name, _, f)) in methods.iter().enumerate() {
        if own_servers.contains(&k) && chosen(name) {
            let servers = f.server_cpu_ms();
            println!(
                "{:>8} {:<30} CPU ms per batch: servers {:.2} + clients {:.2}",
                size,
                name,
                servers,
                f.cpu_ms() - servers
            );
        }
    }
    if chosen(methods[0].0) && chosen(methods[1].0) {
        println!(
            "{:>8} router p99 / one-hop p99 = {:.2}",
            size,
            methods[0].2.quantile_ms(0.99) / methods[1].2.quantile_ms(0.99)
        );
    }
    // The one-hop client's CPU (client and nodes, one process) against what the transport
    // and the nodes' own handling cost: plain quinn from one server, and from four.
    let [_, one_hop, _, quinn, four_quinn, _, _, handling, _] = &methods;
    if [one_hop, quinn, four_quinn, handling]
        .iter()
        .all(|(name, _, _)| chosen(name))
    {
        let cpu = one_hop.2.cpu_ms();
        let against = |plain: &Figures| cpu / (plain.cpu_ms() + handling.2.cpu_ms());
        println!(
            "{:>8} one-hop CPU per batch / (plain quinn + node handling) = {:.2} (from 4 servers: {:.2})",
            size,
            against(&quinn.2),
            against(&four_quinn.2)
        );
        // Where the one-hop client's CPU goes beyond plain quinn from four servers: on the
        // servers' side (the nodes, beyond their handling alone) and on the clients'.
        let (nodes, plain) = (one_hop.2.server_cpu_ms(), four_quinn.2.server_cpu_ms());
        let own = handling.2.cpu_ms();
        let (client, plain_client) = (cpu - nodes, four_quinn.2.cpu_ms() - plain);
        println!(
            "{:>8} one-hop servers {nodes:.2} = 4 servers' {plain:.2} + node handling {own:.2} {:+.2}; clients {client:.2} = 4 servers' {plain_client:.2} {:+.2}",
            size,
            nodes - plain - own,
            client - plain_client
        );
    }
    drop(methods);
    drop((one, four, shared, looped, connections));
    servers.shutdown_background();
    Ok(())
}
