//! QUIC transport: endpoint setup and one request / one reply per bidirectional stream.
//!
//! All connection setup lives here. By default every connection is mutual TLS against the
//! cluster CA ([`Security::Tls`], see [`crate::tls`]): nodes accept only routers, routers
//! only clients, and each side checks the other's role. [`Security::InsecureDev`] (the
//! binaries' `--insecure-dev`) keeps encryption but authenticates nobody.
//!
//! Tuning for loopback and LANs, measured on a 2-core machine: 4 MiB UDP socket buffers
//! (default buffers drop packets under scatter/gather), GSO/GRO left on, MTU discovery up to
//! 6,500 bytes on a network (10 GSO segments stay under 64 KiB) and up to 32,000 on loopback
//! (2 segments; see `Link`), and flow-control windows large enough for a 16 MiB gather reply
//! in flight, and peers asked to acknowledge within 1 ms (a lost tail packet is otherwise
//! recovered only after QUIC's default 25 ms). What a connection holds unacknowledged is
//! bounded ([`SEND_WINDOW_BYTES`]), which bounds memory per connection and the number of
//! buffered pieces quinn scans for each packet it builds (a router forwards a 16 MiB reply as
//! ~2,600 received pieces). Measured: 4, 8 and 16 MiB windows gather as fast as 256 MiB.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{
    AsyncUdpSocket, ClientConfig, Connection, ConnectionError, Endpoint, EndpointConfig,
    MtuDiscoveryConfig, Runtime, SendStream, ServerConfig, TransportConfig, VarInt,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::chunks::Chunks;
use crate::error::Error;
use crate::tls::{Identity, Role, RoleVerifier};
use crate::wire::{self, MESSAGE_BYTES_MAX};

/// Server name of the throwaway certificates of `--insecure-dev` endpoints.
const INSECURE_SERVER_NAME: &str = "zrecord";
const SOCKET_BUFFER_BYTES: usize = 4 << 20;
/// Most concurrent requests (streams) one connection may have open.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 1024;
/// Stream reset code: the sender gave up on the message (timeout, shutdown); it is not whole.
pub const ABANDONED: u32 = 1;
/// Connection close code: the peer broke the protocol.
pub const PROTOCOL_VIOLATION: u32 = 2;

/// How an endpoint proves who it is and checks its peers.
#[derive(Clone, Debug)]
pub enum Security {
    /// Mutual TLS against the cluster CA, with this process's identity (the default).
    Tls(Arc<Identity>),
    /// Development only: a throwaway self-signed certificate; peers are neither checked nor
    /// checking. Traffic is encrypted, but anyone who can reach the port gets in.
    InsecureDev,
}

impl Security {
    /// `role`'s credentials from certificate directory `dir`.
    pub fn load(dir: &std::path::Path, role: Role) -> Result<Security, Error> {
        Ok(Security::Tls(Arc::new(Identity::load(dir, role)?)))
    }

    /// Logs the warning every `--insecure-dev` process gives, once at start.
    pub fn warn_if_insecure(&self, process: &str) {
        if matches!(self, Security::InsecureDev) {
            tracing::warn!(
                "{process} runs with --insecure-dev: connections are encrypted but NOT authenticated; anyone who can reach it can read and change the data"
            );
        }
    }

    fn server_config(&self, link: Link) -> Result<ServerConfig, Error> {
        let tls_error = |e: rustls::Error| Error::Net(format!("cannot configure TLS: {e}"));
        let mut server = match self {
            Security::Tls(identity) => {
                let accepts = identity.role.accepts().ok_or_else(|| {
                    Error::Net(format!(
                        "a {} certificate cannot serve connections",
                        identity.role
                    ))
                })?;
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let verifier = RoleVerifier::new(identity.roots(), Arc::clone(&provider), accepts)?;
                let tls = rustls::ServerConfig::builder_with_provider(provider)
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .map_err(tls_error)?
                    .with_client_cert_verifier(Arc::new(verifier))
                    .with_single_cert(identity.chain(), identity.key())
                    .map_err(|e| {
                        Error::Net(format!(
                            "{}: the {} certificate and key do not go together: {e}",
                            identity.dir.display(),
                            identity.role
                        ))
                    })?;
                let quic = QuicServerConfig::try_from(tls)
                    .map_err(|e| Error::Net(format!("cannot configure QUIC: {e}")))?;
                ServerConfig::with_crypto(Arc::new(quic))
            }
            Security::InsecureDev => {
                let certified =
                    rcgen::generate_simple_self_signed(vec![INSECURE_SERVER_NAME.into()])
                        .map_err(|e| Error::Net(format!("cannot generate a certificate: {e}")))?;
                let cert = CertificateDer::from(certified.cert);
                let key = PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der());
                ServerConfig::with_single_cert(vec![cert], key.into()).map_err(tls_error)?
            }
        };
        server.transport_config(transport(link));
        Ok(server)
    }

    /// The client configuration for connecting to a server, and the name to ask it for.
    fn client_config(&self, link: Link) -> Result<(ClientConfig, &'static str), Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| Error::Net(format!("cannot configure TLS: {e}")))?;
        let (tls, name) = match self {
            Security::Tls(identity) => {
                let target = identity.role.connects_to().ok_or_else(|| {
                    Error::Net(format!("a {} certificate cannot connect", identity.role))
                })?;
                let tls = builder
                    .with_root_certificates(identity.roots())
                    .with_client_auth_cert(identity.chain(), identity.key())
                    .map_err(|e| {
                        Error::Net(format!(
                            "{}: the {} certificate and key do not go together: {e}",
                            identity.dir.display(),
                            identity.role
                        ))
                    })?;
                (tls, target.dns_name())
            }
            Security::InsecureDev => (
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
                    .with_no_client_auth(),
                INSECURE_SERVER_NAME,
            ),
        };
        let quic = QuicClientConfig::try_from(tls)
            .map_err(|e| Error::Net(format!("cannot configure QUIC: {e}")))?;
        let mut config = ClientConfig::new(Arc::new(quic));
        config.transport_config(transport(link));
        Ok((config, name))
    }
}

/// Most bytes a connection holds written but not yet acknowledged; writers wait beyond it.
pub const SEND_WINDOW_BYTES: u64 = 8 << 20;

/// What lies between an endpoint and its peers, which decides how large its packets get.
/// An endpoint bound to a loopback address can reach only loopback peers; the endpoints of
/// one connection then agree on packet sizes, and one datagram may be as large as UDP allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    /// A network: MTU discovery up to [`Link::mtu_max`] (6,500 bytes, for jumbo-frame LANs;
    /// a 1,500-byte path is found by discovery).
    Network,
    /// Loopback (lo's MTU is 64 KiB). quinn's cost is per packet: at 16 KiB records, 32,000
    /// rather than 6,500 bytes took 25-35% less CPU per gathered byte on every path (router,
    /// direct and plain quinn alike) and 64,000 was no better.
    Loopback,
}

/// Most bytes one GSO send may carry: segments x MTU must fit one UDP datagram (64 KiB).
const GSO_BYTES_MAX: usize = 65_000;

impl Link {
    fn of(addr: SocketAddr) -> Link {
        if addr.ip().is_loopback() {
            Link::Loopback
        } else {
            Link::Network
        }
    }

    /// The largest UDP payload this endpoint sends, and accepts from its peers.
    fn mtu_max(self) -> u16 {
        match self {
            Link::Network => 6_500,
            Link::Loopback => 32_000,
        }
    }

    /// The first packets' size: on loopback already large (discovery climbs from there),
    /// but within QUIC's initial congestion window (14,720 bytes), or the handshake stalls.
    fn mtu_initial(self) -> Option<u16> {
        match self {
            Link::Network => None,
            Link::Loopback => Some(6_500),
        }
    }

    /// Most datagrams per GSO send at the largest MTU.
    fn gso_segments_max(self) -> usize {
        GSO_BYTES_MAX / self.mtu_max() as usize
    }
}

/// Transport settings for connections over `link`.
fn transport(link: Link) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    if let Some(initial) = link.mtu_initial() {
        t.initial_mtu(initial);
    }
    let mut mtu = MtuDiscoveryConfig::default();
    mtu.upper_bound(link.mtu_max());
    t.mtu_discovery_config(Some(mtu))
        .max_concurrent_bidi_streams(VarInt::from_u32(STREAMS_PER_CONNECTION_MAX))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(64 << 20))
        .receive_window(VarInt::from_u32(256 << 20))
        .send_window(SEND_WINDOW_BYTES)
        .ack_frequency_config(Some(ack_frequency()))
        .keep_alive_interval(Some(Duration::from_secs(5)))
        .max_idle_timeout(Some(VarInt::from_u32(60_000).into()));
    Arc::new(t)
}

/// Asks peers to acknowledge within [`ACK_DELAY_MAX`] rather than QUIC's default 25 ms. The
/// probe timeout that recovers a lost tail packet waits for the peer's delayed ACK, so on a
/// fast link one drop at the end of a reply cost a whole 25 ms (measured: plain 16 MiB
/// transfers on loopback, p99 44-47 ms at a 14-16 ms median; with 1 ms, p99 24-26 ms).
fn ack_frequency() -> quinn::AckFrequencyConfig {
    let mut ack = quinn::AckFrequencyConfig::default();
    ack.max_ack_delay(Some(ACK_DELAY_MAX));
    ack
}

/// Longest a peer may delay an acknowledgement (see [`ack_frequency`]).
const ACK_DELAY_MAX: Duration = Duration::from_millis(1);

fn udp_socket(addr: SocketAddr) -> Result<std::net::UdpSocket, Error> {
    let net = |what: &str, e: std::io::Error| Error::Net(format!("{what} {addr}: {e}"));
    let domain = if addr.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let socket = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))
        .map_err(|e| net("socket for", e))?;
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
        .map_err(|e| Error::Net(format!("cannot configure the endpoint: {e}")))?;
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
        let endpoint = crate::hash::mix2(seed, made);
        let mut bytes = [0u8; 32];
        for (k, word) in bytes.chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&crate::hash::mix2(endpoint, k as u64).to_le_bytes());
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
    let failed = |e: std::io::Error| Error::Net(format!("cannot start an endpoint on {addr}: {e}"));
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

/// A UDP socket that asks quinn for at most `segments` datagrams per GSO send (quinn asks
/// the socket, which knows only the kernel's limit, not the MTU).
#[derive(Debug)]
struct SegmentCap {
    inner: Arc<dyn AsyncUdpSocket>,
    segments: usize,
}

impl AsyncUdpSocket for SegmentCap {
    fn create_io_poller(self: Arc<Self>) -> std::pin::Pin<Box<dyn quinn::UdpPoller>> {
        Arc::clone(&self.inner).create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit) -> std::io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut std::task::Context,
        bufs: &mut [std::io::IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments().min(self.segments).max(1)
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// Accepts any server certificate (but still checks the handshake signatures): the
/// `--insecure-dev` path, whose throwaway certificates cannot be known in advance.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);
impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Connects to `addr` within `timeout`, as `security` says. The connecting side's role
/// decides whom it expects: a router expects a node, a client a router.
pub async fn connect(
    endpoint: &Endpoint,
    security: &Security,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Connection, Error> {
    // The endpoint's own address decides its packet sizes, as its socket's GSO cap does.
    let local = endpoint
        .local_addr()
        .map_err(|e| Error::Net(format!("cannot connect to {addr}: {e}")))?;
    let (config, name) = security.client_config(Link::of(local))?;
    let connecting = endpoint
        .connect_with(config, addr, name)
        .map_err(|e| Error::Net(format!("cannot connect to {addr}: {e}")))?;
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(Error::Net(format!(
            "cannot connect to {addr}: {}",
            describe(&e)
        ))),
        Err(_) => Err(Error::Net(format!(
            "no answer from {addr} within {} ms (wrong address, or nothing listening there?)",
            timeout.as_millis()
        ))),
    }
}

/// A connection error in words a user can act on: TLS refusals say which side refused what.
pub fn describe(e: &ConnectionError) -> String {
    let (code, reason) = match e {
        ConnectionError::ConnectionClosed(close) => (u64::from(close.error_code), None),
        ConnectionError::TransportError(t) => (u64::from(t.code), Some(t.reason.clone())),
        ConnectionError::ApplicationClosed(close)
            if close.error_code == PROTOCOL_VIOLATION.into() =>
        {
            return "the peer closed the connection: this side broke the protocol".into()
        }
        other => return other.to_string(),
    };
    tls_refusal(code, reason).unwrap_or_else(|| e.to_string())
}

/// A TLS alert (QUIC transport code `code`: 0x100 + alert) in words a user can act on;
/// `None` if `code` is not an alert.
fn tls_refusal(code: u64, reason: Option<String>) -> Option<String> {
    let alert = code.checked_sub(0x100).filter(|&a| a < 0x100)?;
    Some(match (alert, reason) {
        (_, Some(reason)) if reason.to_lowercase().contains("expired") => format!(
            "the peer's certificate has expired ({reason}); issue new ones with `zr cluster-renew` and restart the peer (or is a clock wrong?)"
        ),
        (_, Some(reason))
            if reason.contains("UnknownIssuer") || reason.contains("BadSignature") =>
        {
            format!(
                "the peer's certificate is not from this cluster's CA ({reason}); a certificate directory of another cluster, or a peer running --insecure-dev?"
            )
        }
        (_, Some(reason)) if reason.contains("NotValidForName") => format!(
            "the peer's certificate is for another role ({reason}); is the address right?"
        ),
        (_, Some(reason)) if reason.contains("UnknownCA") || reason.contains("BadCertificate") => format!(
            "the peer refused the certificate this side presented ({reason})"
        ),
        (116, _) => "the peer requires a certificate and this side presented none (give it the cluster's certificates, or run both sides with --insecure-dev)".into(),
        (45, _) => "the peer refused the certificate this side presented: it has expired; issue new ones with `zr cluster-renew` and restart this process".into(),
        (42 | 48, _) => "the peer refused the certificate this side presented: it is from another cluster's CA, or for the wrong role".into(),
        (alert, reason) => format!(
            "TLS handshake failed (alert {alert}{})",
            reason.map(|r| format!(": {r}")).unwrap_or_default()
        ),
    })
}

/// A reply's body: pieces ready now, or batches of pieces a producer is still making (the
/// router's streamed gathers). A streamed body ends with `None`; a channel that closes
/// without it was abandoned, and the reply is reset.
pub enum Body {
    Ready(Vec<Bytes>),
    Streamed(tokio::sync::mpsc::Receiver<Option<Vec<Bytes>>>),
}

/// A send stream that is reset, not finished, if dropped before it is sent whole: a
/// message cut off midway (a timeout, a shutdown) can never look complete to the receiver.
/// (quinn finishes a dropped stream, which would make a truncated message look whole.)
struct Outgoing(Option<SendStream>);

impl Outgoing {
    async fn send(&mut self, header: Vec<u8>, body: Vec<Bytes>) -> Result<(), String> {
        self.send_body(header, Body::Ready(body), None).await
    }

    /// Sends `header` and `body`, then finishes. With `timeout`, each write must make
    /// progress within it (waiting for a streamed body's producer is not bounded here).
    async fn send_body(
        &mut self,
        header: Vec<u8>,
        body: Body,
        timeout: Option<Duration>,
    ) -> Result<(), String> {
        let Some(stream) = self.0.as_mut() else {
            return Err("stream already finished".into());
        };
        async fn write(
            stream: &mut SendStream,
            mut pieces: Vec<Bytes>,
            timeout: Option<Duration>,
        ) -> Result<(), String> {
            let written = stream.write_all_chunks(&mut pieces);
            match timeout {
                None => written.await.map_err(|e| e.to_string()),
                Some(t) => match tokio::time::timeout(t, written).await {
                    Ok(result) => result.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("the peer took nothing for {} ms", t.as_millis())),
                },
            }
        }
        match body {
            Body::Ready(body) => {
                let pieces = std::iter::once(Bytes::from(header)).chain(body).collect();
                write(stream, pieces, timeout).await?;
            }
            Body::Streamed(mut pieces) => {
                write(stream, vec![Bytes::from(header)], timeout).await?;
                loop {
                    match pieces.recv().await {
                        Some(Some(batch)) => write(stream, batch, timeout).await?,
                        Some(None) => break,
                        None => return Err("the reply's producer gave up".into()),
                    }
                }
            }
        }
        stream.finish().map_err(|e| e.to_string())?;
        self.0 = None;
        Ok(())
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        if let Some(mut stream) = self.0.take() {
            let _ = stream.reset(VarInt::from_u32(ABANDONED));
        }
    }
}

/// Sends one request (`header` then the `body` pieces) on a new stream of `connection` and
/// returns the whole reply, all within `timeout`. On timeout the request stream is reset and
/// the reply stream stopped, so neither side can take a cut-off message for a whole one.
pub async fn call(
    connection: &Connection,
    header: Vec<u8>,
    body: Vec<Bytes>,
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let chunks = call_chunks(connection, header, body, timeout).await?;
    Ok(Chunks::new(&chunks).to_vec())
}

/// [`call`], returning the reply as the chunks it arrived in (no copy: each is a piece of a
/// received packet), for replies that are forwarded rather than read.
pub async fn call_chunks(
    connection: &Connection,
    header: Vec<u8>,
    body: Vec<Bytes>,
    timeout: Duration,
) -> Result<Vec<Bytes>, Error> {
    let peer = connection.remote_address();
    let exchange = async {
        let mut recv = send_request(connection, header, body).await?;
        let mut chunks = Vec::new();
        let mut total = 0usize;
        while let Some(chunk) = read_chunk(connection, &mut recv).await? {
            total += chunk.len();
            if total > MESSAGE_BYTES_MAX {
                return Err(Error::Net(format!(
                    "{peer}: receiving failed: the reply exceeds {MESSAGE_BYTES_MAX} bytes"
                )));
            }
            chunks.push(chunk);
        }
        Ok(chunks)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(Error::Net(format!(
            "{peer}: no reply within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// Opens a stream on `connection` and sends one request on it (`header`, then the `body`
/// pieces); the reply is to be read from the stream returned. Not bounded in time: callers
/// put their deadline around the whole exchange.
pub async fn send_request(
    connection: &Connection,
    header: Vec<u8>,
    body: Vec<Bytes>,
) -> Result<quinn::RecvStream, Error> {
    let (send, recv) = connection
        .open_bi()
        .await
        .map_err(|e| lost(connection, "cannot open a stream", describe(&e)))?;
    Outgoing(Some(send))
        .send(header, body)
        .await
        .map_err(|e| lost(connection, "sending failed", e))?;
    Ok(recv)
}

/// The next piece of a reply arriving on `recv` (a piece of a received packet, not copied),
/// or `None` once it is whole. A reply its sender abandoned midway is an error saying so.
pub async fn read_chunk(
    connection: &Connection,
    recv: &mut quinn::RecvStream,
) -> Result<Option<Bytes>, Error> {
    match recv.read_chunk(usize::MAX, true).await {
        Ok(chunk) => Ok(chunk.map(|c| c.bytes)),
        Err(quinn::ReadError::Reset(code)) if code == VarInt::from_u32(ABANDONED) => Err(lost(
            connection,
            "receiving failed",
            "the peer abandoned the reply midway (its log says why)".into(),
        )),
        Err(e) => Err(lost(connection, "receiving failed", e.to_string())),
    }
}

/// An exchange with `connection`'s peer failed at `what`: a closed connection explains
/// itself better than the stream error `e`.
fn lost(connection: &Connection, what: &str, e: String) -> Error {
    let why = connection
        .close_reason()
        .map(|reason| describe(&reason))
        .unwrap_or(e);
    Error::Net(format!("{}: {what}: {why}", connection.remote_address()))
}

/// Resolves on SIGINT or SIGTERM: the binaries' signal to shut down gracefully.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        } => {}
    }
}

/// What one serving endpoint allows.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once; more are refused.
    pub connections: usize,
    /// Bytes of requests being read or handled at once, over all connections: a request
    /// that would exceed it waits (and QUIC flow control slows its sender) until others are
    /// answered. A single request larger than this (or than [`MESSAGE_BYTES_MAX`]) is
    /// refused.
    pub request_bytes: usize,
    /// Bound on reading a request (including waiting for budget) and on each reply write.
    pub timeout: Duration,
}

impl Limits {
    /// `connections` and `timeout` with the default request budget (2 GiB).
    pub fn new(connections: usize, timeout: Duration) -> Limits {
        Limits {
            connections,
            request_bytes: 2 * MESSAGE_BYTES_MAX,
            timeout,
        }
    }
}

/// Granularity of the request budget.
const BUDGET_UNIT: usize = 64 << 10;

/// Reads a whole request of at most `max` bytes, taking its size from `budget` as it
/// arrives.
async fn read_request(
    recv: &mut quinn::RecvStream,
    budget: &Arc<tokio::sync::Semaphore>,
    max: usize,
) -> Result<(Vec<u8>, Option<tokio::sync::OwnedSemaphorePermit>), String> {
    let mut bytes = Vec::new();
    let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
    let mut reserved = 0usize;
    while let Some(chunk) = recv
        .read_chunk(usize::MAX, true)
        .await
        .map_err(|e| e.to_string())?
    {
        let need = bytes.len() + chunk.bytes.len();
        if need > max {
            return Err(format!("request exceeds the limit of {max} bytes"));
        }
        if need > reserved {
            let more = (need - reserved).div_ceil(BUDGET_UNIT) as u32;
            match Arc::clone(budget).try_acquire_many_owned(more) {
                Ok(permit) => match held.as_mut() {
                    Some(held) => held.merge(permit),
                    None => held = Some(permit),
                },
                Err(_) => {
                    // Waiting while holding a share could deadlock with other half-read
                    // requests: give the share back, then wait for the whole amount.
                    drop(held.take());
                    let all = need.div_ceil(BUDGET_UNIT) as u32;
                    let permit = Arc::clone(budget)
                        .acquire_many_owned(all)
                        .await
                        .map_err(|e| e.to_string())?;
                    held = Some(permit);
                }
            }
            reserved = held.as_ref().map_or(0, |p| p.num_permits() * BUDGET_UNIT);
        }
        bytes.extend_from_slice(&chunk.bytes);
    }
    Ok((bytes, held))
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
    let Limits {
        connections: connections_max,
        request_bytes,
        timeout,
    } = limits;
    let connections = Arc::new(tokio::sync::Semaphore::new(connections_max));
    let units = request_bytes.div_ceil(BUDGET_UNIT).max(1);
    let budget = Arc::new(tokio::sync::Semaphore::new(units));
    // No single request may need more than the whole budget.
    let request_max = MESSAGE_BYTES_MAX.min(units * BUDGET_UNIT);
    // Every request holds a read guard; draining takes the write guard.
    let in_flight = Arc::new(tokio::sync::RwLock::new(()));
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        // `biased`: polled in this order, not a random one, so that a simulation replays.
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    tracing::warn!("refusing a connection from {}: {connections_max} already open", incoming.remote_address());
                    incoming.refuse();
                    continue;
                };
                let handler = handler.clone();
                let in_flight = Arc::clone(&in_flight);
                let budget = Arc::clone(&budget);
                tasks.spawn(async move {
                    let _permit = permit;
                    let peer = incoming.remote_address();
                    if let Err(e) = connection(incoming, handler, in_flight, budget, request_max, timeout).await {
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

async fn connection<H, F>(
    incoming: quinn::Incoming,
    handler: H,
    in_flight: Arc<tokio::sync::RwLock<()>>,
    budget: Arc<tokio::sync::Semaphore>,
    request_max: usize,
    timeout: Duration,
) -> Result<(), ConnectionError>
where
    H: Fn(Vec<u8>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = (Vec<u8>, Body)> + Send + 'static,
{
    let connection = incoming.await?;
    let peer = connection.remote_address();
    let mut requests = tokio::task::JoinSet::new();
    loop {
        // `biased`: polled in this order, not a random one, so that a simulation replays.
        let (send, mut recv) = tokio::select! {
            biased;
            // Reap finished requests so the set stays small on long-lived connections.
            Some(_) = requests.join_next(), if !requests.is_empty() => continue,
            stream = connection.accept_bi() => stream?,
        };
        let handler = handler.clone();
        let in_flight = Arc::clone(&in_flight);
        let budget = Arc::clone(&budget);
        let connection = connection.clone();
        requests.spawn(async move {
            let mut reply = Outgoing(Some(send));
            // The request's bytes hold their share of the budget until it is answered.
            let (bytes, _held) = match tokio::time::timeout(timeout, read_request(&mut recv, &budget, request_max)).await {
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
            // A request that arrives while draining waits here and is reset at shutdown.
            let _guard = in_flight.read().await;
            let (header, body) = handler(bytes).await;
            // On error `reply` is dropped unfinished, which resets the stream.
            if let Err(e) = reply.send_body(header, body, Some(timeout)).await {
                tracing::warn!("reply to {peer} not sent whole, reset: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// TLS refusals read as what to do: an expired certificate names `zr cluster-renew` on
    /// the side that found it and on the side whose certificate it was.
    #[test]
    fn expired_certificates_are_named_on_both_sides() {
        let alert = u64::from(quinn::TransportErrorCode::crypto(45));
        let reason = "invalid peer certificate: certificate expired: verification time 2, but certificate is not valid after 1";
        let found = tls_refusal(alert, Some(reason.into())).unwrap_or_default();
        let refused = describe(&ConnectionError::ConnectionClosed(quinn::ConnectionClose {
            error_code: quinn::TransportErrorCode::crypto(45),
            frame_type: None,
            reason: Bytes::new(),
        }));
        for (text, who) in [
            (found, "the peer's certificate"),
            (refused, "this side presented"),
        ] {
            assert!(text.contains(who) && text.contains("expired"), "{text}");
            assert!(text.contains("zr cluster-renew"), "{text}");
        }
    }

    /// Every link's GSO send fits one UDP datagram at its largest MTU.
    #[test]
    fn gso_sends_fit_one_datagram() {
        for link in [Link::Network, Link::Loopback] {
            assert!(link.gso_segments_max() >= 1);
            assert!(link.gso_segments_max() * link.mtu_max() as usize <= 65_507);
            assert!(link.mtu_initial().unwrap_or(1200) <= link.mtu_max());
        }
        assert_eq!(Link::of("127.0.0.1:9".parse().unwrap()), Link::Loopback);
        assert_eq!(Link::of("[::1]:9".parse().unwrap()), Link::Loopback);
        assert_eq!(Link::of("0.0.0.0:9".parse().unwrap()), Link::Network);
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
            let mtu = connection.stats().path.current_mtu;
            assert!(
                mtu > Link::Network.mtu_max() && mtu <= Link::Loopback.mtu_max(),
                "path MTU {mtu}"
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
        init_certs(&dir("old"), CERT_VALID_DAYS).unwrap();
        init_certs(&dir("new"), CERT_VALID_DAYS).unwrap();
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
                    super::call(&connection, message.clone(), Vec::new(), TIMEOUT).await
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
            let e = call(node, router).unwrap_err().to_string();
            assert!(e.contains("CA"), "node {node}, router {router}: {e}");
        }
    }

    /// Shutdown lets a request in flight finish, then refuses new connections.
    #[test]
    fn shutdown_drains_requests_in_flight() {
        runtime().block_on(async {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let slow_echo = |bytes: Vec<u8>| async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                (bytes, Body::Ready(Vec::new()))
            };
            let stopped = async {
                let _ = stopped.await;
            };
            let (addr, client, served) = start(Limits::new(4, TIMEOUT), stopped, slow_echo);
            let connection = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
            let message = b"ZRW1 echo".to_vec();
            let call = tokio::spawn({
                let message = message.clone();
                async move { super::call(&connection, message, Vec::new(), TIMEOUT).await }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = stop.send(());
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
            assert!(cut.unwrap_err().to_string().contains("no reply within"));
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

    /// Connections beyond the cap are refused; those within it keep working.
    #[test]
    fn connections_beyond_the_cap_are_refused() {
        runtime().block_on(async {
            let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
            let (addr, client, served) =
                start(Limits::new(2, TIMEOUT), std::future::pending(), echo);
            let message = b"ZRW1 hello".to_vec();
            let mut open = Vec::new();
            for _ in 0..2 {
                let c = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
                call(&c, message.clone(), Vec::new(), TIMEOUT)
                    .await
                    .unwrap();
                open.push(c);
            }
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
                connections: 4,
                request_bytes: 256 << 10,
                timeout: TIMEOUT,
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
}
