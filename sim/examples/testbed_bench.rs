//! Cluster benchmark across real links: the client, the router and every node run as
//! processes of their own, each in a Linux network namespace of its own, joined by the veth
//! links of `ops/netns/testbed.sh` and shaped there (rate always; delay and loss where the
//! kernel has netem). Measured in one run, taking turns: router gathers (client → router →
//! nodes), the client library's one-hop gathers (client → nodes), the same requests sent to
//! the nodes by hand, and plain quinn and plain TCP
//! transfers of the same bytes from a server in the first node's namespace — the baseline
//! of every ratio — over the same links.
//!
//! ```text
//! cargo build --release -p zr-shard -p zr-router -p zr-sim --bins --examples
//! sudo target/release/examples/testbed_bench [--rate 10gbit] [--delay-ms 0.05 --loss 0]
//! ```
//! Needs root (namespaces, tc) and the release binaries of zr-node and zr-router beside the
//! example (it says so otherwise). It removes every namespace and link it made when it ends.

mod bench_common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bench_common::{
    binaries_beside_me, connect_all, connect_router, direct_gather, quinn_server, take_turns,
    tcp_server, transfer, Figures, Result, Step, TcpLink,
};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use zr_common::hash::{mix2, reduce};
use zr_common::Record;
use zr_net as net;
use zr_net::tls::{self, Role};
use zr_service::config::ClusterConfig;

/// Router and direct gathers vs plain quinn and TCP, each process in a network namespace
/// of its own, over shaped veth links (needs root).
#[derive(Parser, Clone)]
struct Args {
    /// Shards (one node each, each in its own namespace).
    #[arg(long, default_value_t = 3)]
    shards: u32,
    /// Each link's rate, both ways (tc units: 10gbit, 1gbit, 500mbit).
    #[arg(long, default_value = "10gbit")]
    rate: String,
    /// One-way delay per link in milliseconds (a round trip crosses two links each way:
    /// RTT = 4 × this). Needs the kernel's netem qdisc.
    #[arg(long)]
    delay_ms: Option<f64>,
    /// Packet loss per link and direction, in percent. Needs the kernel's netem qdisc.
    #[arg(long)]
    loss: Option<f64>,
    /// Seconds of measurement per method and record size (split over the rounds).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Records per batch.
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Record sizes to measure, in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1024,16384")]
    sizes: Vec<usize>,
    /// MiB of records loaded per record size.
    #[arg(long, default_value_t = 64)]
    mib: u64,
    /// Turns each method takes, each of seconds / rounds.
    #[arg(long, default_value_t = 10)]
    rounds: u32,
    /// Fewest batches per method.
    #[arg(long, default_value_t = 100)]
    min_batches: usize,
    /// What this process is (the benchmark starts itself again inside the namespaces).
    #[arg(long, value_enum, default_value_t = Part::Orchestrator, hide = true)]
    part: Part,
    /// The run's directory (nodes.toml, certificates, data, logs).
    #[arg(long, hide = true)]
    dir: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    /// Makes the test bed and the cluster, runs the client, tears everything down.
    Orchestrator,
    /// The measuring client, in member 0.
    Client,
    /// The plain quinn and TCP servers, in the first node's member.
    Baseline,
}

/// The method every ratio is against.
const BASELINE: &str = "plain quinn, same bytes";

/// The test bed's members: the client, the router, then one per node.
const CLIENT: u32 = 0;
const ROUTER: u32 = 1;
const FIRST_NODE: u32 = 2;

/// The router's port; node K listens on `PORT + 1 + K`, the baseline servers on `PORT + 100`.
const PORT: u16 = 7400;
const BASELINE_PORT: u16 = PORT + 100;

/// The address of test bed member `member` (as `ops/netns/testbed.sh` gives them).
fn member_ip(member: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 77, 0, 10 + member as u8))
}

fn main() -> Result<()> {
    zr_common::alloc::tune();
    let args = Args::parse();
    match args.part {
        Part::Orchestrator => orchestrate(&args),
        Part::Client => client(&args),
        Part::Baseline => baseline(&args),
    }
}

/// The test bed `name`, removed when dropped (also when the run fails midway).
struct TestBed {
    script: PathBuf,
    name: String,
}

impl TestBed {
    fn up(args: &Args) -> Result<TestBed> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/netns/testbed.sh");
        let name = format!("zrb{}", std::process::id());
        let members = FIRST_NODE + args.shards;
        let mut command = Command::new(&script);
        command.args(["up", &name, &members.to_string(), "--rate", &args.rate]);
        if let Some(delay) = args.delay_ms {
            command.args(["--delay", &delay.to_string()]);
        }
        if let Some(loss) = args.loss {
            command.args(["--loss", &loss.to_string()]);
        }
        let out = command.output()?;
        if !out.status.success() {
            return Err(format!(
                "cannot make the test bed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        Ok(TestBed { script, name })
    }

    /// `program args` inside member `member`'s namespace, its output to `log` if given.
    fn spawn(
        &self,
        member: u32,
        program: &Path,
        args: &[&str],
        log: Option<&Path>,
    ) -> Result<Child> {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &format!("{}-{member}", self.name)])
            .arg(program)
            .args(args);
        if let Some(log) = log {
            let file = std::fs::File::create(log)?;
            command.stdout(file.try_clone()?).stderr(file);
        }
        Ok(command.spawn()?)
    }
}

impl Drop for TestBed {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .args(["down", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Processes killed when dropped.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The arguments to pass on to the benchmark's other parts.
fn pass_on(args: &Args, part: &str, dir: &Path) -> Vec<String> {
    let mut out = vec![
        format!("--part={part}"),
        format!("--dir={}", dir.display()),
        format!("--shards={}", args.shards),
        format!("--rate={}", args.rate),
        format!("--seconds={}", args.seconds),
        format!("--batch={}", args.batch),
        format!(
            "--sizes={}",
            args.sizes
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
        format!("--mib={}", args.mib),
        format!("--rounds={}", args.rounds),
        format!("--min-batches={}", args.min_batches),
    ];
    if let Some(delay) = args.delay_ms {
        out.push(format!("--delay-ms={delay}"));
    }
    if let Some(loss) = args.loss {
        out.push(format!("--loss={loss}"));
    }
    out
}

fn orchestrate(args: &Args) -> Result<()> {
    if args.shards == 0 || args.shards > 100 {
        return Err(format!("--shards must be 1..100, not {}", args.shards).into());
    }
    let me = std::env::current_exe()?;
    let [node, router] = <[PathBuf; 2]>::try_from(binaries_beside_me(&["zr-node", "zr-router"])?)
        .map_err(|_| "two binaries")?;
    let run = tempfile::tempdir()?;
    let dir = run.path();
    let certs = dir.join("certs");
    tls::init_certs(&certs, tls::CERT_VALID_DAYS)?;
    // The cluster's file, its addresses moved into the namespaces.
    let mut text = zr_service::config::cluster_toml(
        args.shards,
        1,
        PORT,
        dir,
        &certs,
        &[("data".to_string(), "raw".to_string())],
    );
    text = text.replace(
        &format!("\"127.0.0.1:{PORT}\""),
        &format!("\"{}:{PORT}\"", member_ip(ROUTER)),
    );
    for shard in 0..args.shards {
        let port = PORT + 1 + shard as u16;
        text = text.replace(
            &format!("\"127.0.0.1:{port}\""),
            &format!("\"{}:{port}\"", member_ip(FIRST_NODE + shard)),
        );
    }
    let config = dir.join("nodes.toml");
    std::fs::write(&config, text)?;
    let config_arg = config.display().to_string();

    let bed = TestBed::up(args)?;
    let mut processes = Processes(Vec::new());
    for shard in 0..args.shards {
        let log = dir.join(format!("node-{shard}.log"));
        processes.0.push(bed.spawn(
            FIRST_NODE + shard,
            &node,
            &["--shard", &shard.to_string(), "--nodes", &config_arg],
            Some(&log),
        )?);
    }
    processes.0.push(bed.spawn(
        ROUTER,
        &router,
        &["--nodes", &config_arg],
        Some(&dir.join("router.log")),
    )?);
    let baseline_args = pass_on(args, "baseline", dir);
    let baseline_args: Vec<&str> = baseline_args.iter().map(String::as_str).collect();
    processes.0.push(bed.spawn(
        FIRST_NODE,
        &me,
        &baseline_args,
        Some(&dir.join("baseline.log")),
    )?);
    let client_args = pass_on(args, "client", dir);
    let client_args: Vec<&str> = client_args.iter().map(String::as_str).collect();
    let status = bed.spawn(CLIENT, &me, &client_args, None)?.wait()?;
    drop(processes);
    drop(bed);
    if !status.success() {
        for log in ["router.log", "node-0.log", "baseline.log"] {
            if let Ok(text) = std::fs::read_to_string(dir.join(log)) {
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                eprintln!("{log} (last lines):");
                for line in tail.iter().rev() {
                    eprintln!("  {line}");
                }
            }
        }
        return Err(format!("the measuring client failed ({status})").into());
    }
    Ok(())
}

/// The plain quinn server (UDP) and the plain TCP server, on the same port, answering
/// with up to a batch of the largest records; serves until killed.
fn baseline(args: &Args) -> Result<()> {
    let dir = args.dir.as_deref().ok_or("--dir is missing")?;
    let as_node = net::Security::load(&dir.join("certs"), Role::Node)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let largest = args.sizes.iter().copied().max().unwrap_or(0) * args.batch;
    let pool = Bytes::from(vec![7u8; largest]);
    let addr = SocketAddr::new(member_ip(FIRST_NODE), BASELINE_PORT);
    quinn_server(&runtime, addr, &as_node, pool.clone())?;
    tcp_server(&runtime, addr, pool)?;
    runtime.block_on(std::future::pending::<()>());
    Ok(())
}

fn client(args: &Args) -> Result<()> {
    let dir = args.dir.as_deref().ok_or("--dir is missing")?;
    let certs = dir.join("certs");
    let config = ClusterConfig::load(&dir.join("nodes.toml"))?;
    let client = connect_router(config.router.listen, &certs, Duration::from_secs(30), false)?;
    let one_hop = connect_router(config.router.listen, &certs, Duration::from_secs(30), true)?;
    if !one_hop.reads_direct() {
        return Err("the client library could not reach the nodes: no one-hop row".into());
    }
    let as_router = net::Security::load(&certs, Role::Router)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()?;
    let timeout = Duration::from_secs(30);
    let baseline_addr = SocketAddr::new(member_ip(FIRST_NODE), BASELINE_PORT);
    let quinn = runtime.block_on(connect_all(&[baseline_addr], &as_router, timeout))?;
    let mut tcp_link = TcpLink::connect(&runtime, baseline_addr)?;
    let shard_addrs: Vec<SocketAddr> = config.shards.iter().map(|s| s.addr).collect();
    let nodes = runtime.block_on(connect_all(&shard_addrs, &as_router, timeout))?;
    let placement = config.placement()?;

    let shaping = match (args.delay_ms, args.loss) {
        (None, None) => String::new(),
        (delay, loss) => format!(
            ", {} ms one way, {}% loss per link",
            delay.unwrap_or(0.0),
            loss.unwrap_or(0.0)
        ),
    };
    // Load every size's records first, each size in an index range of its own.
    let mut ranges = Vec::new();
    for &size in &args.sizes {
        let count = (args.mib << 20) / size.max(1) as u64;
        let mut payload = vec![0u8; size * 1024];
        for (k, b) in payload.iter_mut().enumerate() {
            *b = mix2(size as u64, k as u64) as u8;
        }
        let start = client.len()?;
        let mut loaded = 0;
        let began = Instant::now();
        while loaded < count {
            let n = 1024.min(count - loaded) as usize;
            let batch: Vec<Record> = payload
                .chunks(size)
                .take(n)
                .map(|p| Record::new().with("data", p))
                .collect();
            client.append_many(&batch)?;
            loaded += n as u64;
        }
        client.commit()?;
        let seconds = began.elapsed().as_secs_f64();
        println!(
            "loaded {count} records of {size} bytes through the router in {seconds:.2} s ({:.0} MiB/s)",
            (count * size as u64) as f64 / seconds / (1 << 20) as f64
        );
        ranges.push((size, start, count));
    }
    let rtt = quinn[0].1.stats().path.rtt;
    println!(
        "\nnetwork namespaces: client, router and {} nodes each in its own, links of {}{shaping}; \
         QUIC RTT client → node {:.3} ms",
        args.shards,
        args.rate,
        rtt.as_secs_f64() * 1e3
    );
    println!(
        "batches of {} random records; ratios against plain quinn (client → first node)",
        args.batch
    );
    println!("{}", Figures::header("vs quinn"));
    for &(size, start, count) in &ranges {
        let batch_bytes = args.batch * size;
        let indices = |b: usize| -> Vec<u64> {
            (0..args.batch as u64)
                .map(|k| start + reduce(mix2(b as u64, k), count))
                .collect()
        };
        // A gather by `client`, its size checked.
        let gather = |client: &zr_router::Client, what: &str, b: usize| -> Result<()> {
            let got = client.gather(&indices(b), &[])?;
            let bytes: usize = got.iter().map(|c| c.data.len()).sum();
            if bytes != batch_bytes {
                return Err(format!("{what} gather: {bytes} bytes, not {batch_bytes}").into());
            }
            Ok(())
        };
        let mut router = |b: usize| gather(&client, "router", b);
        let mut client_one_hop = |b: usize| gather(&one_hop, "one-hop", b);
        let mut direct =
            |b: usize| direct_gather(&runtime, &placement, &nodes, &indices(b), timeout);
        let mut plain_quinn = |_: usize| transfer(&runtime, &quinn, batch_bytes, timeout);
        let mut tcp = |_: usize| tcp_link.transfer(&runtime, batch_bytes);
        let mut methods: [(&str, Step, Figures); 5] = [
            ("router gather (2 hops)", &mut router, Figures::default()),
            ("client one hop", &mut client_one_hop, Figures::default()),
            (
                "direct node gather (by hand)",
                &mut direct,
                Figures::default(),
            ),
            (BASELINE, &mut plain_quinn, Figures::default()),
            ("plain TCP, same bytes", &mut tcp, Figures::default()),
        ];
        take_turns(
            &mut methods,
            args.seconds,
            args.rounds,
            args.min_batches,
            |_| true,
        )?;
        let quinn_rate = methods[3].2.batches_per_second();
        for (name, _, figures) in &methods {
            println!("{}", figures.row(size, name, args.batch, quinn_rate));
        }
    }
    Ok(())
}
