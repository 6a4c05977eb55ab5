//! The one accept loop of nodes and routers: connection and request-byte caps, a deadline
//! on every read and write, and a drain on shutdown.

use std::sync::Arc;
use std::time::Duration;

use quinn::{ConnectionError, Endpoint, VarInt};
use zr_proto::wire::{self, MESSAGE_BYTES_MAX};

use crate::admission::{Pools, RequestBudget, Share};
use crate::rate::Rate;
use crate::refusal::describe;
use crate::rpc::{Body, Outgoing, PROTOCOL_VIOLATION};
use crate::security::Peer;
use crate::tls::Role;

/// Resolves on SIGINT or SIGTERM: the binaries' signal to shut down gracefully. The
/// handlers are installed when this is called (inside a runtime), not when the future is
/// first polled: a process signalled while it is still starting stops gracefully too,
/// instead of being killed by the signal's default action.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    async move {
        tokio::select! {
            _ = received(term.as_mut()) => {}
            _ = received(interrupt.as_mut()) => {}
        }
    }
}

/// Resolves when `signal` arrives (never, if it could not be installed).
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// What one serving endpoint allows.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once; more are refused (after idle ones are reclaimed).
    pub connections: usize,
    /// Connections open at once with one certificate (one identity, see [`Peer`]), so that
    /// one identity's leaks cannot take every slot.
    pub connections_per_identity: usize,
    /// Bytes of requests being read or handled at once, over all connections: a request
    /// that would exceed it waits (and QUIC flow control slows its sender) until others are
    /// answered (see the `admission` module).
    pub request_bytes: usize,
    /// Of those, most one identity holds at once, however many connections it opens. A
    /// single request larger than this (or than [`MESSAGE_BYTES_MAX`]) is refused.
    pub request_bytes_per_identity: usize,
    /// Of those, bytes that peers of the reader role never take, so that writers', operators'
    /// and routers' requests always find room.
    pub request_bytes_kept_from_readers: usize,
    /// Bound on reading a request (including waiting for budget) and on each reply write.
    pub timeout: Duration,
    /// Connections kept for peers of one role: `Some((role, n))` lets peers of other roles
    /// hold at most `connections - n` (a node keeps room for its routers however many
    /// clients read from it).
    pub reserved: Option<(Role, usize)>,
    /// Requests one identity has in flight at once, over all its connections (a waiting
    /// gather is one until its wait ends). Its next request is read only when one of them
    /// is answered, so one job's flood or pile of waiters holds up its own requests, not
    /// another's. Peers of the [`Limits::reserved`] role are not capped.
    pub requests_per_identity: usize,
    /// Bytes per second one identity's requests and replies may move through this server,
    /// over all its connections (`None`: no limit). A request of an identity over its rate
    /// waits before it is handled (see the `rate` module). Peers of the
    /// [`Limits::reserved`] role are not limited.
    pub bytes_per_second_per_identity: Option<u64>,
}

impl Limits {
    /// `connections` and `timeout`, half the connections per identity, and the default
    /// request budget (2 GiB, half of it to one identity, a quarter kept from readers).
    pub fn new(connections: usize, timeout: Duration) -> Limits {
        Limits {
            connections,
            connections_per_identity: connections.div_ceil(2),
            request_bytes: 2 * MESSAGE_BYTES_MAX,
            request_bytes_per_identity: MESSAGE_BYTES_MAX,
            request_bytes_kept_from_readers: MESSAGE_BYTES_MAX / 2,
            timeout,
            reserved: None,
            requests_per_identity: REQUESTS_PER_IDENTITY_DEFAULT,
            bytes_per_second_per_identity: None,
        }
    }
}

/// The default of [`Limits::requests_per_identity`]: more than any one job's loaders keep in
/// flight, few enough that no identity can hold a server's every task.
pub const REQUESTS_PER_IDENTITY_DEFAULT: usize = 4096;

/// A connection with no request in flight for this long may be closed to make room for
/// others once the server is near a cap (clients reconnect on their next call).
pub const IDLE_RECLAIM: Duration = Duration::from_millis(500);

/// The application close code of a connection closed because it was idle and its slot was
/// needed: nothing was in flight on it, so a client may simply reconnect.
pub const RECLAIMED: u32 = 0x5a52;

/// The application close code of a connection refused because its identity holds its whole
/// allowance of connections.
pub const TOO_MANY: u32 = 0x5a53;

/// The open connections of one server, for reclaiming idle ones.
#[derive(Default)]
struct Open {
    next: u64,
    connections: std::collections::HashMap<u64, Tracked>,
    /// Each identity with a connection open: the requests it may still have in flight
    /// (see [`Limits::requests_per_identity`]).
    requests: std::collections::HashMap<u64, Arc<tokio::sync::Semaphore>>,
    /// Each identity limited in bytes per second with a connection open or a debt unpaid
    /// (see [`Limits::bytes_per_second_per_identity`]): kept past its last connection, so
    /// that reconnecting does not forgive a debt.
    rates: std::collections::HashMap<u64, Arc<Rate>>,
}

/// One open connection: whose, how busy, since when idle, and its slot (given back the
/// moment it is reclaimed, not when its task notices).
struct Tracked {
    _slot: tokio::sync::OwnedSemaphorePermit,
    identity: u64,
    /// Its peer is of the role connections are reserved for (see [`Limits::reserved`]).
    privileged: bool,
    connection: quinn::Connection,
    /// Requests in flight on it.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// When its last request ended (or it opened).
    idle_since: Arc<std::sync::Mutex<std::time::Instant>>,
}

impl Tracked {
    fn idle_for(&self, now: std::time::Instant) -> Option<Duration> {
        if self.in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            return None;
        }
        let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        Some(now.saturating_duration_since(since))
    }
}

impl Open {
    /// The requests `identity` may have in flight, `most` at once.
    fn requests_of(&mut self, identity: u64, most: usize) -> Arc<tokio::sync::Semaphore> {
        let most = most.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Arc::clone(
            self.requests
                .entry(identity)
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(most))),
        )
    }

    /// The bytes per second `identity` may move, `bytes_per_second` (its bucket as it was if
    /// it reconnects in debt).
    fn rate_of(&mut self, identity: u64, bytes_per_second: u64) -> Arc<Rate> {
        Arc::clone(
            self.rates
                .entry(identity)
                .or_insert_with(|| Arc::new(Rate::new(bytes_per_second))),
        )
    }

    /// How many connections `identity` has open.
    fn count(&self, identity: u64) -> usize {
        self.connections
            .values()
            .filter(|t| t.identity == identity)
            .count()
    }

    /// How many connections peers not of the reserved role have open.
    fn unprivileged(&self) -> usize {
        self.connections.values().filter(|t| !t.privileged).count()
    }

    /// Closes connections (of `identity`, or of anyone) idle for [`IDLE_RECLAIM`] or more,
    /// longest idle first, until `want` are closed; returns how many were.
    fn reclaim(&mut self, identity: Option<u64>, want: usize) -> usize {
        self.reclaim_where(|t| identity.is_none_or(|i| t.identity == i), want)
    }

    /// [`Self::reclaim`] among the connections `which` picks.
    fn reclaim_where(&mut self, which: impl Fn(&Tracked) -> bool, want: usize) -> usize {
        let now = std::time::Instant::now();
        let mut idle: Vec<(Duration, u64)> = self
            .connections
            .iter()
            .filter(|(_, t)| which(t))
            .filter_map(|(&id, t)| t.idle_for(now).map(|d| (d, id)))
            .filter(|(d, _)| *d >= IDLE_RECLAIM)
            .collect();
        idle.sort_unstable_by(|a, b| b.cmp(a));
        let mut closed = 0;
        for (_, id) in idle.into_iter().take(want) {
            if let Some(t) = self.connections.remove(&id) {
                t.connection
                    .close(VarInt::from_u32(RECLAIMED), b"idle connection reclaimed");
                closed += 1;
            }
        }
        closed
    }
}

/// Why a request was not read whole.
#[derive(Debug, thiserror::Error)]
enum ReadFailed {
    #[error("{0}")]
    Read(#[from] quinn::ReadError),
    #[error("request exceeds the limit of {0} bytes")]
    TooLong(usize),
    #[error("the server is stopping")]
    Stopping,
}

/// Reads a whole request of at most `max` bytes, taking its size from `pools` as it
/// arrives.
async fn read_request(
    recv: &mut quinn::RecvStream,
    pools: &Pools,
    max: usize,
) -> Result<(Vec<u8>, Share), ReadFailed> {
    let mut bytes = Vec::new();
    let mut share = Share::default();
    while let Some(chunk) = recv.read_chunk(usize::MAX, true).await? {
        let need = bytes.len() + chunk.bytes.len();
        if need > max {
            return Err(ReadFailed::TooLong(max));
        }
        share.grow(pools, need).await.ok_or(ReadFailed::Stopping)?;
        bytes.extend_from_slice(&chunk.bytes);
    }
    Ok((bytes, share))
}

/// How long a shutdown waits for requests in flight.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves requests on `endpoint` until `shutdown` resolves: at most `connections_max`
/// connections (more are refused), each request a stream whose bytes go to `handler` and
/// whose reply is written back; reading a request, and each write of its reply, get
/// `timeout` (a peer that stalls midway is reset). A stream that is not a protocol message at all closes its
/// connection (other connections are unaffected); a malformed message gets the handler's
/// error reply. On shutdown it stops accepting connections and requests, lets requests in
/// flight finish (up to [`DRAIN_TIMEOUT`]; replies still unsent then are reset), and closes.
/// The one accept loop of nodes and routers.
pub async fn serve<H, F>(
    endpoint: &Endpoint,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
    handler: H,
) where
    H: Fn(Vec<u8>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = (Vec<u8>, Body)> + Send + 'static,
{
    serve_peers(endpoint, limits, shutdown, move |_: &Peer, bytes| {
        handler(bytes)
    })
    .await
}

/// [`serve`], the handler told who sent each request (see [`Peer`]). Connections are capped
/// in total and per identity; when either cap is near, connections idle for
/// [`IDLE_RECLAIM`] are closed first (longest idle first), so that clients that leave
/// connections open cannot lock others out.
pub async fn serve_peers<H, F>(
    endpoint: &Endpoint,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
    handler: H,
) where
    H: Fn(&Peer, Vec<u8>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = (Vec<u8>, Body)> + Send + 'static,
{
    let Limits {
        connections: connections_max,
        connections_per_identity,
        request_bytes,
        request_bytes_per_identity,
        request_bytes_kept_from_readers,
        timeout,
        reserved,
        requests_per_identity,
        bytes_per_second_per_identity,
    } = limits;
    let connections = Arc::new(tokio::sync::Semaphore::new(connections_max));
    let open = Arc::new(std::sync::Mutex::new(Open::default()));
    let budget = Arc::new(RequestBudget::new(
        request_bytes,
        request_bytes_per_identity,
        request_bytes_kept_from_readers,
    ));
    // No single request may need more than its identity's share.
    let request_max = MESSAGE_BYTES_MAX.min(budget.request_max());
    // Every request holds a read guard; draining takes the write guard.
    let in_flight = Arc::new(tokio::sync::RwLock::new(()));
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        // `biased`: polled in this order, not a random one, so that a simulation replays.
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            // Reap ended connections, so the set stays as large as what is open.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                // Near the cap, idle connections make room first.
                if connections.available_permits() <= connections_max / 4 {
                    let want = connections_max / 4 + 1 - connections.available_permits();
                    // Their slots come back at once; their tasks end as the closes land.
                    open.lock().unwrap_or_else(|e| e.into_inner()).reclaim(None, want);
                }
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    tracing::warn!("refusing a connection from {}: {connections_max} already open", incoming.remote_address());
                    incoming.refuse();
                    continue;
                };
                let handler = handler.clone();
                let in_flight = Arc::clone(&in_flight);
                let budget = Arc::clone(&budget);
                let open = Arc::clone(&open);
                tasks.spawn(async move {
                    let peer = incoming.remote_address();
                    let unprivileged_max = reserved.map(|(role, n)| (role, connections_max.saturating_sub(n)));
                    let serving = Serving { handler, in_flight, budget, request_max, timeout, open, per_identity: connections_per_identity, unprivileged_max, requests_per_identity, bytes_per_second_per_identity };
                    if let Err(e) = connection(incoming, permit, serving).await {
                        tracing::debug!("connection from {peer} ended: {}", describe(&e));
                    }
                });
            }
        }
    }
    // Refuse new connections; finish what is in flight; then close everything.
    endpoint.set_server_config(None);
    // Holding the write guard keeps requests that arrived meanwhile from starting.
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, in_flight.write()).await;
    if drained.is_err() {
        tracing::warn!(
            "requests still running after {} s; their replies are abandoned",
            DRAIN_TIMEOUT.as_secs()
        );
    }
    tasks.shutdown().await;
    drop(drained);
    endpoint.close(0u32.into(), b"shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
}

/// What each connection's task shares with the server.
struct Serving<H> {
    handler: H,
    in_flight: Arc<tokio::sync::RwLock<()>>,
    budget: Arc<RequestBudget>,
    request_max: usize,
    timeout: Duration,
    open: Arc<std::sync::Mutex<Open>>,
    per_identity: usize,
    /// The reserved role, and the most connections peers of other roles may hold.
    unprivileged_max: Option<(Role, usize)>,
    requests_per_identity: usize,
    bytes_per_second_per_identity: Option<u64>,
}

/// Takes a connection out of the open set when its task ends.
struct Registered {
    open: Arc<std::sync::Mutex<Open>>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gone) = open.connections.remove(&self.id) {
            // Requests of its still running hold their permits (an Arc of their own).
            if open.count(gone.identity) == 0 {
                open.requests.remove(&gone.identity);
                // Buckets of identities with no connection are forgotten once settled (none
                // exist without a bandwidth limit).
                if !open.rates.is_empty() {
                    let connected: std::collections::HashSet<u64> =
                        open.connections.values().map(|t| t.identity).collect();
                    open.rates
                        .retain(|identity, rate| connected.contains(identity) || !rate.settled());
                }
            }
        }
    }
}

/// Requests begun by this process's servers, and those not finished yet: what tells the
/// allocator's idle trim (`zr_common::alloc::trim_when_idle`) that a burst is over.
static REQUESTS_BEGUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static REQUESTS_OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Requests begun by this process's servers so far, and how many are not finished (their
/// replies still being sent).
pub fn requests() -> (u64, usize) {
    (
        REQUESTS_BEGUN.load(std::sync::atomic::Ordering::Relaxed),
        REQUESTS_OPEN.load(std::sync::atomic::Ordering::Relaxed),
    )
}

/// Counts a request in flight on its connection (and in the process) while it lives.
struct Busy {
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    idle_since: Arc<std::sync::Mutex<std::time::Instant>>,
}

impl Busy {
    fn start(
        in_flight: &Arc<std::sync::atomic::AtomicUsize>,
        idle_since: &Arc<std::sync::Mutex<std::time::Instant>>,
    ) -> Busy {
        in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        REQUESTS_BEGUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        REQUESTS_OPEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Busy {
            in_flight: Arc::clone(in_flight),
            idle_since: Arc::clone(idle_since),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
        self.in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        REQUESTS_OPEN.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn connection<H, F>(
    incoming: quinn::Incoming,
    slot: tokio::sync::OwnedSemaphorePermit,
    serving: Serving<H>,
) -> Result<(), ConnectionError>
where
    H: Fn(&Peer, Vec<u8>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = (Vec<u8>, Body)> + Send + 'static,
{
    let Serving {
        handler,
        in_flight,
        budget,
        request_max,
        timeout,
        open,
        per_identity,
        unprivileged_max,
        requests_per_identity,
        bytes_per_second_per_identity,
    } = serving;
    let connection = incoming.await?;
    let peer = connection.remote_address();
    let who = Arc::new(Peer::of(&connection, &Role::ALL));
    let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let idle_since = Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
    // On an `--insecure-dev` endpoint nobody has a role: every peer counts as privileged.
    let privileged = unprivileged_max.is_none_or(|(role, _)| who.role.is_none_or(|r| r == role));
    let (_registered, allowed, rate) = {
        let mut open_now = open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((role, most)) = unprivileged_max.filter(|_| !privileged) {
            if open_now.unprivileged() >= most {
                let over = open_now.unprivileged() + 1 - most;
                if open_now.reclaim_where(|t| !t.privileged, over) < over {
                    drop(open_now);
                    tracing::warn!(
                        "refusing a connection from {peer}: {most} connections are open from peers other than {role}s, and the rest are kept for {role}s"
                    );
                    connection.close(
                        VarInt::from_u32(TOO_MANY),
                        b"too many connections from clients; the rest are kept for routers",
                    );
                    return Ok(());
                }
            }
        }
        if open_now.count(who.identity) >= per_identity {
            let over = open_now.count(who.identity) + 1 - per_identity;
            if open_now.reclaim(Some(who.identity), over) < over {
                drop(open_now);
                tracing::warn!(
                    "refusing a connection from {peer}: its certificate already holds {per_identity} connections"
                );
                connection.close(
                    VarInt::from_u32(TOO_MANY),
                    b"too many connections with this certificate",
                );
                return Ok(());
            }
        }
        let id = open_now.next;
        open_now.next += 1;
        open_now.connections.insert(
            id,
            Tracked {
                _slot: slot,
                identity: who.identity,
                privileged,
                connection: connection.clone(),
                in_flight: Arc::clone(&busy),
                idle_since: Arc::clone(&idle_since),
            },
        );
        // Peers of the reserved role (a node's routers, which carry every client's requests
        // under one certificate) are not capped.
        let exempt = unprivileged_max.is_some() && privileged;
        let most = if exempt {
            usize::MAX
        } else {
            requests_per_identity
        };
        let allowed = open_now.requests_of(who.identity, most);
        let rate = bytes_per_second_per_identity
            .filter(|_| !exempt)
            .map(|rate| open_now.rate_of(who.identity, rate));
        let registered = Registered {
            open: Arc::clone(&open),
            id,
        };
        (registered, allowed, rate)
    };
    let pools = budget.pools_of(&who);
    let mut requests = tokio::task::JoinSet::new();
    let mut stats = tokio::time::interval(crate::metrics::PEER_STATS_EVERY);
    stats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // `biased`: polled in this order, not a random one, so that a simulation replays.
        let (send, mut recv) = tokio::select! {
            biased;
            // Reap finished requests so the set stays small on long-lived connections.
            Some(_) = requests.join_next(), if !requests.is_empty() => continue,
            stream = connection.accept_bi() => stream?,
            _ = stats.tick() => {
                crate::metrics::record_peer_stats(&connection);
                continue;
            }
        };
        // The identity's share of requests in flight: at its cap, this connection reads its
        // next request once one of the identity's is answered.
        let permit = match Arc::clone(&allowed).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                metrics::counter!("zr_requests_held_for_identity_total").increment(1);
                tracing::debug!(
                    "{peer}'s certificate has {requests_per_identity} requests in flight; its next waits"
                );
                match Arc::clone(&allowed).acquire_owned().await {
                    Ok(permit) => permit,
                    // Never closed; were it, the request would go unserved, as at shutdown.
                    Err(_) => return Ok(()),
                }
            }
        };
        let handler = handler.clone();
        let in_flight = Arc::clone(&in_flight);
        let pools = pools.clone();
        let connection = connection.clone();
        let who = Arc::clone(&who);
        let rate = rate.clone();
        let counted = Busy::start(&busy, &idle_since);
        requests.spawn(async move {
            let (_counted, _permit) = (counted, permit);
            let mut reply = Outgoing(Some(send));
            // The request's bytes hold their share of the budget until it is answered.
            let (bytes, _held) = match tokio::time::timeout(timeout, read_request(&mut recv, &pools, request_max)).await {
                Ok(Ok(read)) => read,
                Ok(Err(e)) => {
                    tracing::debug!("request from {peer} not read: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!("request from {peer} not complete within {} ms; dropped", timeout.as_millis());
                    return;
                }
            };
            if !wire::is_message(&bytes) {
                tracing::warn!(
                    "closing the connection from {peer}: it sent {} bytes that are not a zrecord message",
                    bytes.len()
                );
                connection.close(
                    VarInt::from_u32(PROTOCOL_VIOLATION),
                    b"not a zrecord message",
                );
                return;
            }
            // An identity over its bytes per second waits for its debt to be paid.
            if let Some(rate) = &rate {
                if rate.ready().await {
                    metrics::counter!("zr_requests_paced_for_identity_total").increment(1);
                }
            }
            let request_bytes = bytes.len() as u64;
            // A request that arrives while draining waits here and is reset at shutdown.
            let _guard = in_flight.read().await;
            let (header, body) = handler(&who, bytes).await;
            // On error `reply` is dropped unfinished, which resets the stream.
            match reply.send_body(header, body, Some(timeout)).await {
                Ok(sent) => {
                    if let Some(rate) = &rate {
                        rate.charge(request_bytes + sent);
                    }
                }
                Err(e) => tracing::warn!("reply to {peer} not sent whole, reset: {e}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use bytes::Bytes;

    use super::*;
    use crate::endpoint::{client_endpoint, connect, server_endpoint};
    use crate::link::Link;
    use crate::rpc::call;
    use crate::security::Security;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::time::Instant;

    const SECURITY: Security = Security::InsecureDev;
    const TIMEOUT: Duration = Duration::from_secs(5);

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A loopback server running `handler` under `limits` until `shutdown`, and a client
    /// endpoint: (the server's address, the client endpoint, the server's task).
    fn start<H, F>(
        limits: Limits,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        handler: H,
    ) -> (SocketAddr, Endpoint, tokio::task::JoinHandle<()>)
    where
        H: Fn(Vec<u8>) -> F + Clone + Send + Sync + 'static,
        F: std::future::Future<Output = (Vec<u8>, Body)> + Send + 'static,
    {
        start_as(&SECURITY, limits, shutdown, handler)
    }

    /// [`start`], the server presenting `security`.
    fn start_as<H, F>(
        security: &Security,
        limits: Limits,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        handler: H,
    ) -> (SocketAddr, Endpoint, tokio::task::JoinHandle<()>)
    where
        H: Fn(Vec<u8>) -> F + Clone + Send + Sync + 'static,
        F: std::future::Future<Output = (Vec<u8>, Body)> + Send + 'static,
    {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = server_endpoint(loopback, security).unwrap();
        let addr = server.local_addr().unwrap();
        let served = tokio::spawn(async move { serve(&server, limits, shutdown, handler).await });
        (addr, client_endpoint(loopback).unwrap(), served)
    }

    /// On loopback, packets grow past a network's sizes (discovery climbs from the initial
    /// MTU, within what one GSO send may carry), and large messages cross whole both ways.
    #[test]
    fn loopback_connections_use_large_packets() {
        runtime().block_on(async {
            let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
            let (addr, client, _served) =
                start(Limits::new(4, TIMEOUT), std::future::pending(), echo);
            assert!(client.local_addr().unwrap().ip().is_loopback());
            let connection = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
            let mut message: Vec<u8> = (0..8u32 << 20).map(|k| (k * 7 + k / 4099) as u8).collect();
            message[..4].copy_from_slice(b"ZRW1"); // a zrecord message, or the server hangs up
            let (header, body) = message.split_at(4);
            for _ in 0..2 {
                let body = vec![Bytes::copy_from_slice(body)];
                let reply = call(&connection, header.to_vec(), body, TIMEOUT)
                    .await
                    .unwrap();
                assert!(reply == message, "the echoed message differs");
            }
            // Discovery reached the largest size in a few probes (each is mostly padding,
            // which the peer reads a byte at a time).
            let path = connection.stats().path;
            assert_eq!(path.current_mtu, Link::Loopback.mtu_max(), "path MTU");
            assert!(
                path.sent_plpmtud_probes <= 5,
                "{} MTU probes sent",
                path.sent_plpmtud_probes
            );
        });
    }

    /// Moving a cluster to a new CA, one process at a time (ops/README.md): first every
    /// process trusts both CAs (`ca.pem` holding the new CA, then the old), then each takes
    /// its new certificate. At every step, each pair of processes that the procedure lets
    /// meet connects; a process that still trusts only the old CA refuses the new
    /// certificates, which is why the first step must reach every process first.
    #[test]
    fn a_cluster_moves_to_a_new_ca_one_process_at_a_time() {
        use crate::tls::{init_certs, Role, CA_FILE, CERT_VALID_DAYS};
        let scratch = tempfile::tempdir().unwrap();
        let dir = |name: &str| scratch.path().join(name);
        init_certs(&dir("made-old"), CERT_VALID_DAYS).unwrap();
        init_certs(&dir("made-new"), CERT_VALID_DAYS).unwrap();
        // Each CA's node and router files side by side, as an operator copies them.
        for name in ["old", "new"] {
            std::fs::create_dir(dir(name)).unwrap();
            let made = dir(&format!("made-{name}"));
            std::fs::copy(made.join("ca").join(CA_FILE), dir(name).join(CA_FILE)).unwrap();
            for file in ["node.pem", "node.key", "router.pem", "router.key"] {
                let role = file.split('.').next().unwrap();
                std::fs::copy(made.join(role).join(file), dir(name).join(file)).unwrap();
            }
        }
        let both = [
            std::fs::read(dir("new").join(CA_FILE)).unwrap(),
            std::fs::read(dir("old").join(CA_FILE)).unwrap(),
        ]
        .concat();
        // Step 1: the old certificates, trusting both CAs; step 2: the new ones.
        for (step, certificates) in [("trusting", "old"), ("moved", "new")] {
            std::fs::create_dir(dir(step)).unwrap();
            std::fs::write(dir(step).join(CA_FILE), &both).unwrap();
            for entry in std::fs::read_dir(dir(certificates)).unwrap() {
                let path = entry.unwrap().path();
                if path.file_name().unwrap() != CA_FILE {
                    std::fs::copy(&path, dir(step).join(path.file_name().unwrap())).unwrap();
                }
            }
        }
        let call = |node: &str, router: &str| {
            runtime().block_on(async {
                let node = Security::load(&dir(node), Role::Node).unwrap();
                let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let stopped = async {
                    let _ = stopped.await;
                };
                let (addr, client, served) =
                    start_as(&node, Limits::new(4, TIMEOUT), stopped, echo);
                let router = Security::load(&dir(router), Role::Router).unwrap();
                let message = b"ZRW1 hello".to_vec();
                let reply = async {
                    let connection = connect(&client, &router, addr, TIMEOUT).await?;
                    call(&connection, message.clone(), Vec::new(), TIMEOUT).await
                }
                .await;
                let _ = stop.send(());
                served.await.unwrap();
                reply.map(|r| assert_eq!(r, message))
            })
        };
        for (node, router) in [
            ("old", "trusting"),
            ("trusting", "old"),
            ("trusting", "trusting"),
            ("trusting", "moved"),
            ("moved", "trusting"),
            ("moved", "moved"),
            ("new", "moved"),
        ] {
            call(node, router).unwrap_or_else(|e| panic!("node {node}, router {router}: {e}"));
        }
        for (node, router) in [("old", "moved"), ("moved", "old")] {
            let e = call(node, router).unwrap_err();
            assert!(
                matches!(e, crate::Error::NotAuthorised { .. }),
                "node {node}, router {router}: {e:?}"
            );
            assert!(
                e.to_string().contains("CA"),
                "node {node}, router {router}: {e}"
            );
        }
    }

    /// Nodes connect to nodes (a replica copying its partner's files) with the node
    /// certificate `zr cluster-init` makes now. A node certificate of an earlier version —
    /// for serving only — still serves a router, and is refused as a node's client by name,
    /// which is what sends the rebuild back to copying record by record.
    #[test]
    fn nodes_connect_to_nodes_and_older_node_certificates_still_serve() {
        use crate::endpoint::connect_to;
        use crate::link::Windows;
        use crate::tls::{init_certs, issue_node_as_before, Role, CERT_VALID_DAYS};
        let scratch = tempfile::tempdir().unwrap();
        let (now, before) = (scratch.path().join("now"), scratch.path().join("before"));
        init_certs(&now, CERT_VALID_DAYS).unwrap();
        std::fs::create_dir(&before).unwrap();
        for entry in walk(&now) {
            let to = before.join(entry.strip_prefix(&now).unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&entry, &to).unwrap();
        }
        issue_node_as_before(&before).unwrap();
        let node = |dir: &std::path::Path| Security::load(dir, Role::Node).unwrap();
        let router = Security::load(&now, Role::Router).unwrap();
        let exchange = |server: &Security, client: &Security, as_node: bool| {
            runtime().block_on(async {
                let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let stopped = async {
                    let _ = stopped.await;
                };
                let (addr, endpoint, served) =
                    start_as(server, Limits::new(4, TIMEOUT), stopped, echo);
                let message = b"ZRW1 files".to_vec();
                let target = as_node.then_some(Role::Node);
                let reply = async {
                    let connection =
                        connect_to(&endpoint, client, addr, TIMEOUT, Windows::DEFAULT, target)
                            .await?;
                    call(&connection, message.clone(), Vec::new(), TIMEOUT).await
                }
                .await;
                let _ = stop.send(());
                served.await.unwrap();
                reply.map(|r| assert_eq!(r, message))
            })
        };
        exchange(&node(&now), &node(&now), true).expect("node to node");
        exchange(&node(&before), &router, false).expect("an older node serves a router");
        let e = exchange(&node(&now), &node(&before), true).unwrap_err();
        assert!(matches!(e, crate::Error::NotAuthorised { .. }), "{e:?}");
        assert!(e.to_string().contains("zr cluster-renew"), "{e}");
    }

    /// Every file under `dir`.
    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(walk(&path));
            } else {
                files.push(path);
            }
        }
        files
    }

    /// Shutdown lets a request in flight finish, then refuses new connections.
    #[test]
    fn shutdown_drains_requests_in_flight() {
        runtime().block_on(async {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            // The handler says when it has the request, and answers when let go.
            let (began, release) = (
                Arc::new(tokio::sync::Notify::new()),
                Arc::new(tokio::sync::Notify::new()),
            );
            let slow_echo = {
                let (began, release) = (Arc::clone(&began), Arc::clone(&release));
                move |bytes: Vec<u8>| {
                    let (began, release) = (Arc::clone(&began), Arc::clone(&release));
                    async move {
                        began.notify_one();
                        release.notified().await;
                        (bytes, Body::Ready(Vec::new()))
                    }
                }
            };
            let stopped = async {
                let _ = stopped.await;
            };
            let (addr, client, served) = start(Limits::new(4, TIMEOUT), stopped, slow_echo);
            let connection = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
            let message = b"ZRW1 echo".to_vec();
            let call = tokio::spawn({
                let message = message.clone();
                async move { call(&connection, message, Vec::new(), TIMEOUT).await }
            });
            began.notified().await;
            let _ = stop.send(());
            // Shutdown has begun with the request in flight; now it may finish.
            tokio::task::yield_now().await;
            release.notify_one();
            // The request in flight is answered in full.
            assert_eq!(call.await.unwrap().unwrap(), message);
            served.await.unwrap();
            // The server is gone: new connections get no answer.
            let again = connect(&client, &SECURITY, addr, Duration::from_millis(300)).await;
            assert!(again.is_err());
        });
    }

    /// A request cut off by the caller's timeout is reset, never finished: the server never
    /// mistakes its first part for a whole message.
    #[test]
    fn a_request_cut_off_by_a_timeout_never_reaches_the_handler() {
        runtime().block_on(async {
            let seen = Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
            let record_len = {
                let seen = Arc::clone(&seen);
                move |bytes: Vec<u8>| {
                    seen.lock().unwrap().push(bytes.len());
                    async move { (Vec::new(), Body::Ready(Vec::new())) }
                }
            };
            let limits = Limits::new(4, TIMEOUT);
            let (addr, client, served) = start(limits, std::future::pending(), record_len);
            let connection = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
            // Larger than the stream's flow-control window: the send is cut off midway.
            let body = vec![Bytes::from(vec![7u8; 160 << 20])];
            let cut = call(
                &connection,
                b"ZRW1".to_vec(),
                body,
                Duration::from_millis(20),
            )
            .await;
            let cut = cut.unwrap_err();
            assert!(cut.is_timeout(), "{cut:?}");
            assert!(cut.to_string().contains("no reply within"), "{cut}");
            // A whole request afterwards still goes through on the same connection.
            call(&connection, b"ZRW1 small".to_vec(), Vec::new(), TIMEOUT)
                .await
                .unwrap();
            // Give a (wrongly) finished stream time to arrive: most of it was buffered.
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(
                *seen.lock().unwrap(),
                vec![10],
                "the handler saw a cut-off request"
            );
            served.abort();
        });
    }

    /// An echo server allowing `connections` in total and `per_identity` to one identity
    /// (every insecure client is one), the message to send it, and its client endpoint.
    fn echo_server(
        connections: usize,
        per_identity: usize,
    ) -> (SocketAddr, Endpoint, tokio::task::JoinHandle<()>, Vec<u8>) {
        let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
        let limits = Limits {
            connections_per_identity: per_identity,
            ..Limits::new(connections, TIMEOUT)
        };
        let (addr, client, served) = start(limits, std::future::pending(), echo);
        (addr, client, served, b"ZRW1 hello".to_vec())
    }

    /// `count` connections to `addr`, each answered once.
    async fn answered(
        client: &Endpoint,
        addr: SocketAddr,
        message: &[u8],
        count: usize,
    ) -> Vec<quinn::Connection> {
        let mut open = Vec::new();
        for _ in 0..count {
            let c = connect(client, &SECURITY, addr, TIMEOUT).await.unwrap();
            call(&c, message.to_vec(), Vec::new(), TIMEOUT)
                .await
                .unwrap();
            open.push(c);
        }
        open
    }

    /// Connections beyond the cap are refused; those within it keep working.
    #[test]
    fn connections_beyond_the_cap_are_refused() {
        runtime().block_on(async {
            let (addr, client, served, message) = echo_server(2, 2);
            let open = answered(&client, addr, &message, 2).await;
            let third = match connect(&client, &SECURITY, addr, TIMEOUT).await {
                Ok(c) => call(&c, message.clone(), Vec::new(), TIMEOUT).await.err(),
                Err(e) => Some(e),
            };
            assert!(third.is_some(), "a third connection was served");
            for c in &open {
                let reply = call(c, message.clone(), Vec::new(), TIMEOUT).await.unwrap();
                assert_eq!(reply, message);
            }
            served.abort();
        });
    }

    /// At the cap, a connection idle for [`IDLE_RECLAIM`] makes room for a new one (closed
    /// as reclaimed, so its client knows to reconnect); connections in use are kept.
    #[test]
    fn idle_connections_make_room_at_the_cap() {
        runtime().block_on(async {
            let (addr, client, served, message) = echo_server(2, 2);
            let idle = answered(&client, addr, &message, 1).await.remove(0);
            tokio::time::sleep(IDLE_RECLAIM + Duration::from_millis(200)).await;
            let busy = answered(&client, addr, &message, 1).await.remove(0);
            // Full: the idle one goes, the new one is served, the busy one kept.
            let third = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
            let reply = call(&third, message.clone(), Vec::new(), TIMEOUT).await.unwrap();
            assert_eq!(reply, message);
            let closed = idle.closed().await;
            assert!(
                matches!(&closed, quinn::ConnectionError::ApplicationClosed(c) if c.error_code == VarInt::from_u32(RECLAIMED)),
                "{closed:?}"
            );
            call(&busy, message.clone(), Vec::new(), TIMEOUT).await.unwrap();
            served.abort();
        });
    }

    /// One identity cannot hold more than its allowance: its connections beyond it are
    /// closed (`TOO_MANY`) while none of its own is idle, whatever room is left in total.
    #[test]
    fn one_identity_cannot_take_every_slot() {
        runtime().block_on(async {
            let (addr, client, served, message) = echo_server(16, 2);
            let open = answered(&client, addr, &message, 2).await;
            let third = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
            let refused = call(&third, message.clone(), Vec::new(), TIMEOUT).await;
            assert!(refused.is_err(), "a third connection of one identity was served");
            assert!(
                matches!(third.close_reason(), Some(quinn::ConnectionError::ApplicationClosed(c)) if c.error_code == VarInt::from_u32(TOO_MANY)),
                "{:?}",
                third.close_reason()
            );
            for c in &open {
                call(c, message.clone(), Vec::new(), TIMEOUT).await.unwrap();
            }
            served.abort();
        });
    }

    /// Requests share a byte budget: a request larger than the whole budget is refused
    /// (reset), requests that fit together all get through, and the endpoint keeps serving.
    #[test]
    fn requests_share_a_byte_budget() {
        runtime().block_on(async {
            let slow_len = |bytes: Vec<u8>| async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                (bytes.len().to_le_bytes().to_vec(), Body::Ready(Vec::new()))
            };
            let limits = Limits {
                request_bytes: 256 << 10,
                request_bytes_per_identity: 256 << 10,
                ..Limits::new(4, TIMEOUT)
            };
            let (addr, client, served) = start(limits, std::future::pending(), slow_len);
            let c = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
            let request = |len: usize| {
                let c = c.clone();
                async move {
                    let body = vec![Bytes::from(vec![1u8; len])];
                    call(&c, b"ZRW1".to_vec(), body, TIMEOUT).await
                }
            };
            // Too big for the whole budget: refused.
            assert!(request(300 << 10).await.is_err());
            // Four of 100 KiB, twice the budget together: they take turns, all answered.
            let tasks: Vec<_> = (0..4).map(|_| tokio::spawn(request(100 << 10))).collect();
            for task in tasks {
                let reply = task.await.unwrap().unwrap();
                assert_eq!(reply, (4 + (100usize << 10)).to_le_bytes().to_vec());
            }
            served.abort();
        });
    }

    /// One identity's requests in flight are capped over all its connections: with a cap
    /// of 3, eight requests over two connections run at most three at once (and three do:
    /// the cap is not a queue of one), and every one is answered.
    #[test]
    fn one_identity_has_at_most_its_requests_in_flight() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        runtime().block_on(async {
            let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let handler = {
                let (now, most) = (Arc::clone(&now), Arc::clone(&most));
                move |bytes: Vec<u8>| {
                    let (now, most) = (Arc::clone(&now), Arc::clone(&most));
                    async move {
                        let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(running, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        now.fetch_sub(1, Ordering::SeqCst);
                        (bytes, Body::Ready(Vec::new()))
                    }
                }
            };
            let limits = Limits {
                requests_per_identity: 3,
                ..Limits::new(8, TIMEOUT)
            };
            let (addr, client, served) = start(limits, std::future::pending(), handler);
            // On an `--insecure-dev` endpoint, one address is one identity.
            let first = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
            let second = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
            let calls: Vec<_> = (0..8)
                .map(|k| {
                    let c = if k % 2 == 0 {
                        first.clone()
                    } else {
                        second.clone()
                    };
                    tokio::spawn(
                        async move { call(&c, b"ZRW1".to_vec(), Vec::new(), TIMEOUT).await },
                    )
                })
                .collect();
            for task in calls {
                assert_eq!(task.await.unwrap().unwrap(), b"ZRW1".to_vec());
            }
            assert_eq!(most.load(Ordering::SeqCst), 3, "requests in flight at most");
            served.abort();
        });
    }
    /// One identity's bytes per second are capped over all its connections, and its debt is
    /// its own: with 1 MiB/s, a client echoing 64 KiB messages moves no more than the rate
    /// allows over the time it ran (plus a burst and what its requests in flight sent at
    /// once), and another certificate's request is answered while the first's next request
    /// still waits for its debt.
    #[test]
    fn one_identity_moves_at_most_its_bytes_per_second() {
        use crate::tls::{init_certs, Role, CERT_VALID_DAYS};
        const RATE: u64 = 1 << 20;
        const MESSAGE: usize = 64 << 10;
        const IN_FLIGHT: usize = 4;
        let scratch = tempfile::tempdir().unwrap();
        init_certs(scratch.path(), CERT_VALID_DAYS).unwrap();
        let load = |role: Role| Security::load(&scratch.path().join(role.name()), role).unwrap();
        runtime().block_on(async {
            let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
            let limits = Limits {
                bytes_per_second_per_identity: Some(RATE),
                ..Limits::new(8, TIMEOUT)
            };
            let (addr, client, served) =
                start_as(&load(Role::Router), limits, std::future::pending(), echo);
            let first = connect(&client, &load(Role::Reader), addr, TIMEOUT)
                .await
                .unwrap();
            let message = |len: usize| {
                let mut m = b"ZRW1".to_vec();
                m.resize(len, 7);
                m
            };
            let began = Instant::now();
            let moved = Arc::new(AtomicU64::new(0));
            let calls: Vec<_> = (0..IN_FLIGHT)
                .map(|_| {
                    let (c, moved) = (first.clone(), Arc::clone(&moved));
                    tokio::spawn(async move {
                        while began.elapsed() < Duration::from_millis(1500) {
                            let m = message(MESSAGE);
                            let reply = call(&c, m.clone(), Vec::new(), TIMEOUT).await.unwrap();
                            assert_eq!(reply, m);
                            moved.fetch_add(2 * MESSAGE as u64, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            for task in calls {
                task.await.unwrap();
            }
            let (moved, ran) = (moved.load(Ordering::SeqCst), began.elapsed());
            let allowed =
                RATE as f64 * (ran.as_secs_f64() + 0.25) + (IN_FLIGHT * 2 * MESSAGE) as f64;
            assert!(
                (moved as f64) <= allowed,
                "{moved} bytes in {ran:?}; at most {allowed} allowed"
            );
            assert!(moved >= 4 * MESSAGE as u64, "it moved {moved} bytes at all");
            // Two seconds of debt: its next request waits for them; another identity's
            // does not.
            call(&first, message(RATE as usize), Vec::new(), TIMEOUT)
                .await
                .unwrap();
            let waiting = tokio::spawn({
                let c = first.clone();
                async move { call(&c, b"ZRW1".to_vec(), Vec::new(), TIMEOUT).await }
            });
            let other = connect(&client, &load(Role::Writer), addr, TIMEOUT)
                .await
                .unwrap();
            call(&other, b"ZRW1 other".to_vec(), Vec::new(), TIMEOUT)
                .await
                .unwrap();
            assert!(
                !waiting.is_finished(),
                "the first identity's debt was forgiven"
            );
            assert_eq!(waiting.await.unwrap().unwrap(), b"ZRW1".to_vec());
            served.abort();
        });
    }
}
