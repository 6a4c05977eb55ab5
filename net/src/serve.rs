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
    /// Requests an identity in debt does not wait with (`None`: every request waits): a
    /// node's liveness probes, whose answer a client needs within its heartbeat timeout
    /// however far over its rate it is — else its own node would look down to it. Asked only
    /// of a request that would wait.
    pub unpaced: Option<fn(&[u8]) -> bool>,
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
            unpaced: None,
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
        unpaced,
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
                    let serving = Serving { handler, in_flight, budget, request_max, timeout, open, per_identity: connections_per_identity, unprivileged_max, requests_per_identity, bytes_per_second_per_identity, unpaced };
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
    unpaced: Option<fn(&[u8]) -> bool>,
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

/// What a client is told when the connections left are kept for routers.
const KEPT_FOR_ROUTERS: &[u8] = b"too many connections from clients; the rest are kept for routers";
/// What a peer is told when its certificate holds all the connections it may.
const TOO_MANY_WITH_CERTIFICATE: &[u8] = b"too many connections with this certificate";

/// Closes a connection refused as too many, saying `why` in the log and `reason` to the peer.
fn refuse(connection: &quinn::Connection, why: &str, reason: &[u8]) -> Result<(), ConnectionError> {
    let peer = connection.remote_address();
    tracing::warn!("refusing a connection from {peer}: {why}");
    connection.close(VarInt::from_u32(TOO_MANY), reason);
    Ok(())
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
        unpaced,
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
                    let why = format!("{most} connections are open from peers other than {role}s, and the rest are kept for {role}s");
                    return refuse(&connection, &why, KEPT_FOR_ROUTERS);
                }
            }
        }
        if open_now.count(who.identity) >= per_identity {
            let over = open_now.count(who.identity) + 1 - per_identity;
            if open_now.reclaim(Some(who.identity), over) < over {
                drop(open_now);
                let why = format!("its certificate already holds {per_identity} connections");
                return refuse(&connection, &why, TOO_MANY_WITH_CERTIFICATE);
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
        // Finished requests reaped as the next one comes, so the set stays small on
        // long-lived connections; never awaited, so that no request's end wakes this task
        // (on a busy node, a thread woken per request).
        while requests.try_join_next().is_some() {}
        // `biased`: polled in this order, not a random one, so that a simulation replays.
        let (send, mut recv) = tokio::select! {
            biased;
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
            // An identity over its bytes per second waits for its debt to be paid (but for
            // what the server lets through unpaced).
            if let Some(rate) = &rate {
                let exempt = |bytes: &[u8]| unpaced.is_some_and(|unpaced| unpaced(bytes));
                if !rate.wait().is_zero() && !exempt(&bytes) && rate.ready().await {
                    metrics::counter!("zr_requests_paced_for_identity_total").increment(1);
                }
            }
            // Charged as they go: the request now, the reply's pieces as each is handed to
            // the transport, so the identity's next request (which may follow the moment the
            // last piece arrives) already finds them owed.
            let charge = |bytes: u64| {
                if let Some(rate) = &rate {
                    rate.charge(bytes);
                }
            };
            charge(bytes.len() as u64);
            // A request that arrives while draining waits here and is reset at shutdown.
            let _guard = in_flight.read().await;
            let (header, body) = handler(&who, bytes).await;
            // On error `reply` is dropped unfinished, which resets the stream.
            if let Err(e) = reply.send_body(header, body, Some(timeout), &charge).await {
                tracing::warn!("reply to {peer} not sent whole, reset: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests;
