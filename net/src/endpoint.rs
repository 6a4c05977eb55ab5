//! Endpoints and connections: a UDP socket sized for its link, quinn on top of it, and
//! connecting within a deadline. Simulations may seed quinn's random numbers per thread.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{AsyncUdpSocket, Connection, Endpoint, EndpointConfig, Runtime, ServerConfig};

use crate::error::Error;
use crate::link::{Link, SegmentCap, Windows};
use crate::refusal::connection_error;
use crate::security::Security;

const SOCKET_BUFFER_BYTES: usize = 4 << 20;

fn udp_socket(addr: SocketAddr) -> Result<std::net::UdpSocket, Error> {
    let net = |what: &str, e: std::io::Error| Error::Endpoint {
        addr,
        reason: format!("{what}: {e}"),
    };
    let domain = if addr.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let socket = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))
        .map_err(|e| net("no socket", e))?;
    // Larger buffers are a request the kernel may cap; failing to get them is not fatal.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    socket.bind(&addr.into()).map_err(|e| net("bind", e))?;
    Ok(socket.into())
}

/// Endpoint settings: accept datagrams up to the MTU we aim for (quinn's default, 1,472
/// bytes, is also what it tells peers it accepts, which would cap every path at 1,472
/// whatever the transport's MTU settings say).
fn endpoint_config(link: Link) -> Result<EndpointConfig, Error> {
    let mut config = EndpointConfig::default();
    config.rng_seed(next_simulated_seed());
    config
        .max_udp_payload_size(link.mtu_max())
        .map_err(|e| Error::Setup(format!("cannot configure the endpoint: {e}")))?;
    Ok(config)
}

thread_local! {
    /// See [`seed_endpoints_on_this_thread`]: the seed, and endpoints seeded from it so far.
    static SIMULATION_SEED: std::cell::Cell<Option<(u64, u64)>> = const { std::cell::Cell::new(None) };
}

/// For simulations only: endpoints this thread makes from now on draw quinn's random numbers
/// (packet numbers skipped, and what derives from them) from `seed`, each endpoint from a
/// stream of its own, so that a simulated cluster running on this one thread replays its
/// seed exactly. `None` (the default) draws them from the system, as a real process must:
/// predictable packet-number skips would let a peer fake acknowledgements.
pub fn seed_endpoints_on_this_thread(seed: Option<u64>) {
    SIMULATION_SEED.with(|cell| cell.set(seed.map(|seed| (seed, 0))));
}

/// The next endpoint's seed, if this thread simulates.
fn next_simulated_seed() -> Option<[u8; 32]> {
    SIMULATION_SEED.with(|cell| {
        let (seed, made) = cell.get()?;
        cell.set(Some((seed, made + 1)));
        let endpoint = zr_common::hash::mix2(seed, made);
        let mut bytes = [0u8; 32];
        for (k, word) in bytes.chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&zr_common::hash::mix2(endpoint, k as u64).to_le_bytes());
        }
        Some(bytes)
    })
}

/// A server endpoint on `addr` (which may also open client connections).
pub fn server_endpoint(addr: SocketAddr, security: &Security) -> Result<Endpoint, Error> {
    server_endpoint_wrapped(addr, security, |socket| socket)
}

/// [`server_endpoint`] with its UDP socket passed through `wrap` first: the simulator's
/// network faults.
pub fn server_endpoint_wrapped(
    addr: SocketAddr,
    security: &Security,
    wrap: impl FnOnce(Arc<dyn AsyncUdpSocket>) -> Arc<dyn AsyncUdpSocket>,
) -> Result<Endpoint, Error> {
    let server = security.server_config(Link::of(addr))?;
    endpoint(addr, Some(server), wrap)
}

/// A client-only endpoint for connecting to `peer`: on an ephemeral port of loopback for a
/// loopback peer (so that both ends use loopback's packet sizes), else of the unspecified
/// address.
pub fn client_endpoint(peer: SocketAddr) -> Result<Endpoint, Error> {
    let ip: std::net::IpAddr = match (peer.ip().is_loopback(), peer.is_ipv4()) {
        (true, true) => std::net::Ipv4Addr::LOCALHOST.into(),
        (true, false) => std::net::Ipv6Addr::LOCALHOST.into(),
        (false, true) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        (false, false) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    endpoint(SocketAddr::new(ip, 0), None, |socket| socket)
}

/// An endpoint on `addr` (serving if `server` is given), its packet sizes those of the link
/// `addr` is on, its UDP socket capped to fit them and then passed through `wrap`.
fn endpoint(
    addr: SocketAddr,
    server: Option<ServerConfig>,
    wrap: impl FnOnce(Arc<dyn AsyncUdpSocket>) -> Arc<dyn AsyncUdpSocket>,
) -> Result<Endpoint, Error> {
    let link = Link::of(addr);
    let failed = |e: std::io::Error| Error::Endpoint {
        addr,
        reason: e.to_string(),
    };
    let inner = quinn::TokioRuntime
        .wrap_udp_socket(udp_socket(addr)?)
        .map_err(failed)?;
    let socket = Arc::new(SegmentCap {
        inner,
        segments: link.gso_segments_max(),
    });
    Endpoint::new_with_abstract_socket(
        endpoint_config(link)?,
        server,
        wrap(socket),
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(failed)
}

/// Connects to `addr` within `timeout`, as `security` says. The connecting side's role
/// decides whom it expects: a router expects a node, a client a router.
pub async fn connect(
    endpoint: &Endpoint,
    security: &Security,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Connection, Error> {
    connect_with_windows(endpoint, security, addr, timeout, Windows::DEFAULT).await
}

/// [`connect`], receiving with `windows` (see [`Windows`]).
pub async fn connect_with_windows(
    endpoint: &Endpoint,
    security: &Security,
    addr: SocketAddr,
    timeout: Duration,
    windows: Windows,
) -> Result<Connection, Error> {
    connect_to(endpoint, security, addr, timeout, windows, None).await
}

/// [`connect_with_windows`] to a server of role `server` (`None`: the one this side's role
/// connects to by default; a client reading from a node says `Some(Role::Node)`).
pub async fn connect_to(
    endpoint: &Endpoint,
    security: &Security,
    addr: SocketAddr,
    timeout: Duration,
    windows: Windows,
    server: Option<crate::tls::Role>,
) -> Result<Connection, Error> {
    // The endpoint's own address decides its packet sizes, as its socket's GSO cap does.
    let unusable = |reason: String| Error::Link {
        peer: addr,
        reason: format!("cannot connect: {reason}"),
    };
    let local = endpoint.local_addr().map_err(|e| unusable(e.to_string()))?;
    let (config, name) = security.client_config(Link::of(local), windows, server)?;
    let connecting = endpoint
        .connect_with(config, addr, name)
        .map_err(|e| unusable(e.to_string()))?;
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(connection_error(addr, &e)),
        Err(_) => Err(Error::NoAnswer {
            peer: addr,
            waited_ms: timeout.as_millis(),
        }),
    }
}
