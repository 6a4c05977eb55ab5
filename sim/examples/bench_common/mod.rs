//! What the cluster benchmarks and the soak share: batch timing with the process's CPU
//! time, the plain quinn and TCP servers and transfers every ratio is measured against,
//! gathers sent straight to the nodes, and the binaries beside the example. Each example
//! uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zr_net as net;
use zr_net::tls::Role;
use zr_proto::placement::Placement;
use zr_proto::wire::{self, NodeMessage, NodeRequest, Reply};
use zr_router::plan::plan_gather;
use zr_router::Client;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, BoxError>;

/// One batch of a method; its argument numbers the batch.
pub type Step<'a> = &'a mut dyn FnMut(usize) -> Result<()>;

/// One method's batch latencies, gathered over its turns.
#[derive(Default)]
pub struct Figures {
    seconds: f64,
    /// CPU time of the whole process (every thread) while this method ran.
    cpu_seconds: f64,
    /// The part of it the servers' threads spent (see [`server_cpu_since`]).
    server_cpu_seconds: f64,
    latencies: Vec<Duration>,
}

/// Names of the threads that serve: the simulated cluster's runtime (nodes and router) and
/// the benchmarks' plain servers. Every other thread of the process is a client's: the
/// client library's, a benchmark's own, the thread that calls them.
pub const SERVER_THREADS: [&str; 2] = ["zr-sim", "bench-servers"];

/// The CPU time each thread named in [`SERVER_THREADS`] has used so far, in nanoseconds,
/// by thread id, from each thread's `schedstat` (Linux; none elsewhere).
pub fn server_threads_cpu() -> std::collections::HashMap<u64, u64> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Default::default();
    };
    let mut threads = std::collections::HashMap::new();
    for task in tasks.flatten() {
        let path = task.path();
        let serves = std::fs::read_to_string(path.join("comm"))
            .is_ok_and(|name| SERVER_THREADS.contains(&name.trim_end()));
        let tid = task.file_name().to_str().and_then(|t| t.parse().ok());
        if let (true, Some(tid)) = (serves, tid) {
            // The first of schedstat's fields: nanoseconds on a core.
            let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
            let on_cpu = stat
                .split_whitespace()
                .next()
                .and_then(|ns| ns.parse().ok());
            threads.insert(tid, on_cpu.unwrap_or(0));
        }
    }
    threads
}

/// Seconds of CPU the servers' threads used since `before` (a [`server_threads_cpu`]): of
/// each one still running, what it used since then (all it used, if it started since). A
/// thread that ended meanwhile is not counted, so its time falls to the clients' side (a
/// runtime's idle blocking threads end after 10 s; its workers do not).
pub fn server_cpu_since(before: &std::collections::HashMap<u64, u64>) -> f64 {
    let used: u64 = server_threads_cpu()
        .into_iter()
        .map(|(tid, now)| now.saturating_sub(before.get(&tid).copied().unwrap_or(0)))
        .sum();
    used as f64 / 1e9
}

/// CPU time this process has used so far, all threads, user and system (Linux; 0 elsewhere).
pub fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which ends at the last ')'): utime and stime are the
    // 12th and 13th, in clock ticks of 1/100 s.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// A stretch of time being measured: how long it lasts and the cores kept busy meanwhile
/// (see [`Spent`]).
pub struct Busy {
    started: Instant,
    process: f64,
    machine: f64,
}

/// A stretch of time measured by [`Busy`]: its seconds, and the cores kept busy during it,
/// on average, by this process (every thread, user and system) and by the whole machine
/// (every process and the kernel's own threads: the page cache's writeback, a loop device's
/// worker). A move or a rebuild shares this machine's cores with everything else of the
/// cluster; these say how close to all of them it ran.
#[derive(Clone, Copy)]
pub struct Spent {
    pub seconds: f64,
    pub process: f64,
    pub machine: f64,
}

impl Busy {
    pub fn start() -> Busy {
        Busy {
            started: Instant::now(),
            process: process_cpu_seconds(),
            machine: machine_cpu_seconds(),
        }
    }

    /// The stretch from `start` to now.
    pub fn spent(&self) -> Spent {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
        Spent {
            seconds,
            process: (process_cpu_seconds() - self.process) / seconds,
            machine: (machine_cpu_seconds() - self.machine) / seconds,
        }
    }
}

impl Spent {
    /// Seconds the machine's CPU time of this stretch would take on every core at once,
    /// none idle: how fast the work done in it could go at best on this machine.
    pub fn at_best_seconds(&self) -> f64 {
        (self.machine * self.seconds / cores() as f64).max(1e-9)
    }
}

/// This machine's cores (those this process may run on).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// CPU time every core of the machine has spent busy so far, in seconds: user, system and
/// interrupt time of every process and kernel thread, from `/proc/stat` (not idle, not
/// waiting on the disk, not taken by a hypervisor); 0 where there is none.
pub fn machine_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(all) = stat.lines().find(|line| line.starts_with("cpu ")) else {
        return 0.0;
    };
    let ticks: Vec<f64> = all
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is within user).
    let at = |i: usize| ticks.get(i).copied().unwrap_or(0.0);
    (at(0) + at(1) + at(2) + at(5) + at(6)) / 100.0
}

impl Figures {
    /// Runs `step` (one batch) for `seconds` more and until it has made `batches` in all,
    /// adding its latencies.
    pub fn measure(&mut self, seconds: f64, batches: usize, step: Step) -> Result<()> {
        let started = Instant::now();
        let cpu = process_cpu_seconds();
        let served = server_threads_cpu();
        while started.elapsed().as_secs_f64() < seconds || self.latencies.len() < batches {
            let t = Instant::now();
            step(self.latencies.len())?;
            self.latencies.push(t.elapsed());
        }
        self.seconds += started.elapsed().as_secs_f64();
        self.cpu_seconds += process_cpu_seconds() - cpu;
        self.server_cpu_seconds += server_cpu_since(&served);
        Ok(())
    }

    pub fn batches_per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.seconds
    }

    /// The process's CPU time per batch, in milliseconds.
    pub fn cpu_ms(&self) -> f64 {
        self.cpu_seconds * 1e3 / self.latencies.len() as f64
    }

    /// The servers' part of [`Figures::cpu_ms`]: their threads' CPU time per batch.
    pub fn server_cpu_ms(&self) -> f64 {
        self.server_cpu_seconds * 1e3 / self.latencies.len() as f64
    }

    pub fn quantile_ms(&self, q: f64) -> f64 {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        sorted[((sorted.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3
    }

    /// The table's header, for [`Figures::row`].
    pub fn header(baseline: &str) -> String {
        format!(
            "{:>8} {:<30} {:>11} {:>8} {:>9} {:>9} {:>9} {:>7} {:>6}",
            "record",
            "method",
            "records/s",
            "GiB/s",
            "p50 ms",
            "p99 ms",
            baseline,
            "CPU ms",
            "cores"
        )
    }

    /// One line of the table: rates, latencies, the ratio against `baseline` (batches per
    /// second), process CPU time per batch and the cores busy on average.
    pub fn row(&self, size: usize, name: &str, batch: usize, baseline: f64) -> String {
        let rate = self.batches_per_second();
        format!(
            "{:>8} {:<30} {:>11.0} {:>8.3} {:>9.2} {:>9.2} {:>8.2}x {:>7.2} {:>6.2}",
            size,
            name,
            rate * batch as f64,
            rate * (batch * size) as f64 / (1u64 << 30) as f64,
            self.quantile_ms(0.5),
            self.quantile_ms(0.99),
            rate / baseline,
            self.cpu_ms(),
            self.cpu_seconds / self.seconds
        )
    }
}

/// Runs the methods `chosen` picks, taking turns for `rounds` rounds of `seconds / rounds`
/// each, so that the machine's changing load weighs on all alike; each makes at least
/// `min_batches` batches in all (its turns run longer until then).
pub fn take_turns(
    methods: &mut [(&str, Step, Figures)],
    seconds: f64,
    rounds: u32,
    min_batches: usize,
    chosen: impl Fn(&str) -> bool,
) -> Result<()> {
    let rounds = rounds.max(1) as usize;
    let turn = seconds / rounds as f64;
    for round in 1..=rounds {
        for (name, step, figures) in methods.iter_mut() {
            if chosen(name) {
                figures.measure(turn, min_batches * round / rounds, *step)?;
            }
        }
    }
    Ok(())
}

/// The first `wanted` bytes of `pool`, `wanted` read from a request of 8 bytes (little
/// endian); the whole pool for any other request.
fn reply_of(pool: &Bytes, request: &[u8]) -> Bytes {
    match <[u8; 8]>::try_from(request) {
        Ok(wanted) => pool.slice(..(u64::from_le_bytes(wanted) as usize).min(pool.len())),
        Err(_) => pool.clone(),
    }
}

/// A server endpoint bound to `addr` on `runtime`, and the address it got.
fn bound(
    runtime: &tokio::runtime::Runtime,
    addr: SocketAddr,
    security: &net::Security,
) -> Result<(quinn::Endpoint, SocketAddr)> {
    let endpoint = {
        let _guard = runtime.enter();
        net::server_endpoint(addr, security)?
    };
    let addr = endpoint.local_addr()?;
    Ok((endpoint, addr))
}

/// A plain quinn server on `addr`, on `runtime`: every stream it accepts is answered with
/// as many bytes of `pool` as the request asks (see [`transfer`]). Returns its address.
pub fn quinn_server(
    runtime: &tokio::runtime::Runtime,
    addr: SocketAddr,
    security: &net::Security,
    pool: Bytes,
) -> Result<SocketAddr> {
    let (server, addr) = bound(runtime, addr, security)?;
    runtime.spawn(async move {
        while let Some(incoming) = server.accept().await {
            let pool = pool.clone();
            tokio::spawn(async move {
                let Ok(connection) = incoming.await else {
                    return;
                };
                while let Ok((mut send, mut recv)) = connection.accept_bi().await {
                    let Ok(request) = recv.read_to_end(1024).await else {
                        continue;
                    };
                    let _ = send.write_chunk(reply_of(&pool, &request)).await;
                    let _ = send.finish();
                }
            });
        }
    });
    Ok(addr)
}

/// A server on `addr`, on `runtime`, through the nodes' own request loop
/// (`zr_net::serve_peers`, with a node's connection cap and `timeout`) whose handler answers every request
/// with `header` and `body`, ready-made: what the loop costs beyond plain quinn, without a
/// node's decoding and gathering. Returns its address.
pub fn loop_server(
    runtime: &tokio::runtime::Runtime,
    addr: SocketAddr,
    security: &net::Security,
    (header, body): (Vec<u8>, Bytes),
    timeout: Duration,
) -> Result<SocketAddr> {
    let (endpoint, addr) = bound(runtime, addr, security)?;
    let limits = net::Limits::new(zr_shard::server::CONNECTIONS_MAX, timeout);
    runtime.spawn(async move {
        let answer = move |_: &net::Peer, _: Vec<u8>| {
            let (header, body) = (header.clone(), body.clone());
            async move { (header, net::Body::Ready(vec![body])) }
        };
        net::serve_peers(&endpoint, limits, std::future::pending(), answer).await
    });
    Ok(addr)
}

/// A plain TCP server on `addr`, on `runtime`: each request of 8 bytes (a length) is
/// answered with that many bytes of `pool`. Returns its address.
pub fn tcp_server(
    runtime: &tokio::runtime::Runtime,
    addr: SocketAddr,
    pool: Bytes,
) -> Result<SocketAddr> {
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let _ = socket.set_nodelay(true);
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 8];
                    while socket.read_exact(&mut request).await.is_ok() {
                        if socket.write_all(&reply_of(&pool, &request)).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(addr)
    })
}

/// A connection to each of `addrs`, each through an endpoint (UDP socket) of its own, as
/// the router links its nodes.
pub async fn connect_all(
    addrs: &[SocketAddr],
    security: &net::Security,
    timeout: Duration,
) -> Result<Vec<(quinn::Endpoint, quinn::Connection)>> {
    let mut links = Vec::new();
    for &addr in addrs {
        let endpoint = net::client_endpoint(addr)?;
        let connection = net::connect(&endpoint, security, addr, timeout).await?;
        links.push((endpoint, connection));
    }
    Ok(links)
}

/// One transfer from each of `links` at once, `bytes` from each, on `runtime` (a task per
/// link, as the router runs its calls).
pub fn transfer(
    runtime: &tokio::runtime::Runtime,
    links: &[(quinn::Endpoint, quinn::Connection)],
    bytes: usize,
    timeout: Duration,
) -> Result<()> {
    let request = (bytes as u64).to_le_bytes().to_vec();
    exchange(runtime, links, &request, bytes, timeout)
}

/// `request` sent to each of `links` at once, on `runtime` (a task per link); each reply
/// must be `bytes` long.
pub fn exchange(
    runtime: &tokio::runtime::Runtime,
    links: &[(quinn::Endpoint, quinn::Connection)],
    request: &[u8],
    bytes: usize,
    timeout: Duration,
) -> Result<()> {
    runtime.block_on(async {
        let calls: Vec<_> = links
            .iter()
            .map(|(_, connection)| {
                let connection = connection.clone();
                let request = request.to_vec();
                tokio::spawn(
                    async move { net::call(&connection, request, Vec::new(), timeout).await },
                )
            })
            .collect();
        let mut total = 0;
        for call in calls {
            total += call.await??.len();
        }
        if total != bytes * links.len() {
            return Err(format!("short transfer: {total} bytes of {}", bytes * links.len()).into());
        }
        Ok(())
    })
}

/// A TCP connection to a [`tcp_server`], asking it for `bytes` at a time.
pub struct TcpLink {
    socket: tokio::net::TcpStream,
    buffer: Vec<u8>,
}

impl TcpLink {
    pub fn connect(runtime: &tokio::runtime::Runtime, addr: SocketAddr) -> Result<TcpLink> {
        let socket = runtime.block_on(tokio::net::TcpStream::connect(addr))?;
        socket.set_nodelay(true)?;
        Ok(TcpLink {
            socket,
            buffer: Vec::new(),
        })
    }

    pub fn transfer(&mut self, runtime: &tokio::runtime::Runtime, bytes: usize) -> Result<()> {
        self.buffer.resize(bytes, 0);
        runtime.block_on(async {
            self.socket.write_all(&(bytes as u64).to_le_bytes()).await?;
            self.socket.read_exact(&mut self.buffer).await?;
            Ok(())
        })
    }
}

/// One gather sent straight to the nodes, as the router would send it: a request per shard
/// over `connections` (one per shard), each a task on `runtime`.
pub fn direct_gather(
    runtime: &tokio::runtime::Runtime,
    placement: &Placement,
    connections: &[(quinn::Endpoint, quinn::Connection)],
    indices: &[u64],
    timeout: Duration,
) -> Result<()> {
    let parts = plan_gather(placement, indices);
    runtime.block_on(async {
        let calls: Vec<_> = parts
            .iter()
            .map(|part| {
                let request = NodeRequest::Gather {
                    indices: part.addresses.clone(),
                    fields: Vec::new(),
                    checked: false,
                };
                let connection = connections[part.shard as usize].1.clone();
                tokio::spawn(async move {
                    let header = wire::encode_request(&NodeMessage::unchecked(request))?;
                    let bytes = net::call(&connection, header, Vec::new(), timeout).await?;
                    match wire::decode_reply(&bytes)?.0 {
                        Reply::Gather { .. } => Ok::<(), BoxError>(()),
                        other => Err(format!("unexpected {other:?}").into()),
                    }
                })
            })
            .collect();
        for call in calls {
            call.await??;
        }
        Ok(())
    })
}

/// A client of the router at `addr` (client certificate from `certs`), gathering one hop if
/// `direct`, retried until the router answers or `wait` has passed (its processes may be
/// starting).
pub fn connect_router(
    addr: SocketAddr,
    certs: &Path,
    wait: Duration,
    direct: bool,
) -> Result<Client> {
    let deadline = Instant::now() + wait;
    let options = zr_router::ClientOptions {
        direct,
        ..zr_router::ClientOptions::default()
    };
    loop {
        let attempt =
            Client::connect_with(addr, net::Security::load(certs, Role::Writer)?, options)
                .and_then(|client| client.len().map(|_| client));
        match attempt {
            Ok(client) => return Ok(client),
            Err(e) if Instant::now() > deadline => {
                return Err(format!(
                    "the router at {addr} did not answer within {} s: {e}",
                    wait.as_secs()
                )
                .into())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The paths of `names`, the binaries built beside this example (in
/// `target/<profile>/`), or an error saying how to build them.
pub fn binaries_beside_me(names: &[&str]) -> Result<Vec<PathBuf>> {
    let me = std::env::current_exe()?;
    let bin = me
        .parent()
        .and_then(Path::parent)
        .ok_or("cannot tell the build directory from this program's path")?;
    names
        .iter()
        .map(|name| {
            let path = bin.join(name);
            if path.exists() {
                Ok(path)
            } else {
                let packages: Vec<String> = names.iter().map(|n| format!("-p {n}")).collect();
                Err(format!(
                    "{} is missing: build it first (cargo build [--release] {})",
                    path.display(),
                    packages.join(" ")
                )
                .into())
            }
        })
        .collect()
}

/// Writes every dirty page to the disk (`sync`), so that what is measured next does not
/// wait on the writeback of what came before (a copy measured after a move would).
pub fn settle() {
    let _ = std::process::Command::new("sync").status();
}

/// Seconds making `files` empty files in a new folder, and syncing it, takes here: the floor
/// under a copy of that many files, whatever their bytes.
#[allow(dead_code)]
pub fn create_files_seconds(files: usize) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    settle();
    let started = Instant::now();
    for k in 0..files {
        std::fs::File::create(dir.path().join(k.to_string()))?;
    }
    std::fs::File::open(dir.path())?.sync_all()?;
    Ok(started.elapsed().as_secs_f64())
}

/// A plain copy of the files of the dataset at `dir`, as an operator would make it by hand
/// (`cp -r`, then `sync`): each file's bytes as written (chunk files and offset tables grow
/// in reserved steps; the reserve is not copied, as a move does not ship it) into a new
/// folder beside the cluster's, in the kernel, then everything made durable. The best of
/// two copies, both kept until the end (removing the first would make the second's files
/// slower to create on a file system that skips inodes freed recently). Returns its
/// seconds, bytes and files: the baseline a move or rebuild of these files has beside the
/// copy of one file of as many bytes, with the per-file cost of this file system in it.
#[allow(dead_code)]
pub fn copy_files_seconds(dir: &Path) -> Result<(f64, u64, usize)> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                folders.push(entry.path());
            } else if kind.is_file() {
                let relative = entry.path().strip_prefix(dir)?.to_path_buf();
                files.push((relative, held_bytes(&entry.metadata()?)));
            }
        }
    }
    let bytes = files.iter().map(|(_, n)| n).sum();
    let parent = dir.parent().unwrap_or(dir);
    let mut copies = Vec::new();
    let mut best = f64::INFINITY;
    for _ in 0..2 {
        let to = tempfile::tempdir_in(parent)?;
        settle();
        let started = Instant::now();
        for (relative, len) in &files {
            let target = to.path().join(relative);
            if let Some(folder) = target.parent() {
                std::fs::create_dir_all(folder)?;
            }
            let mut from = std::io::Read::take(std::fs::File::open(dir.join(relative))?, *len);
            let mut out = std::fs::File::create(&target)?;
            std::io::copy(&mut from, &mut out)?;
        }
        settle();
        best = best.min(started.elapsed().as_secs_f64());
        copies.push(to);
    }
    Ok((best, bytes, files.len()))
}

/// Bytes the file of `meta` holds: chunk files and offset tables grow in reserved steps, so
/// its length, but no more than its blocks on the disk.
#[cfg(unix)]
pub fn held_bytes(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.len().min(meta.blocks() * 512)
}

#[cfg(not(unix))]
pub fn held_bytes(meta: &std::fs::Metadata) -> u64 {
    meta.len()
}

/// Record `i`'s payload of `size` bytes in the benchmarks that check what they read.
pub fn payload(i: u64, size: usize) -> Vec<u8> {
    (0..size.div_ceil(8))
        .flat_map(|k| zr_common::hash::mix2(i, k as u64).to_le_bytes())
        .take(size)
        .collect()
}

/// Seconds a plain file copy of `bytes` bytes takes (its source warm in the page cache, as
/// a cluster's copies find theirs): the baseline of rebuilds and moves.
pub fn file_copy_seconds(bytes: u64) -> Result<f64> {
    Ok(copy_seconds(bytes, false)?.seconds)
}

/// [`file_copy_seconds`] with the copy made durable (`fsync` at the end), as a rebuild's is.
pub fn durable_copy_seconds(bytes: u64) -> Result<f64> {
    Ok(durable_copy(bytes)?.seconds)
}

/// [`durable_copy_seconds`], with the cores busy during that copy.
pub fn durable_copy(bytes: u64) -> Result<Spent> {
    copy_seconds(bytes, true)
}

/// The best of three copies.
fn copy_seconds(bytes: u64, durable: bool) -> Result<Spent> {
    let dir = tempfile::tempdir()?;
    let (from, to) = (dir.path().join("a"), dir.path().join("b"));
    let data: Vec<u8> = (0..bytes)
        .map(|i| zr_common::hash::mix2(i, 7) as u8)
        .collect();
    std::fs::write(&from, &data)?;
    // The best of three: a shared machine's disk is noisy, and a baseline is its best.
    let mut best: Option<Spent> = None;
    for _ in 0..3 {
        let _ = std::fs::remove_file(&to);
        settle();
        let busy = Busy::start();
        std::fs::copy(&from, &to)?;
        if durable {
            std::fs::File::open(&to)?.sync_all()?;
        }
        let spent = busy.spent();
        if best.is_none_or(|best| spent.seconds < best.seconds) {
            best = Some(spent);
        }
    }
    best.ok_or_else(|| "no copy made".into())
}
