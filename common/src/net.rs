//! QUIC transport: endpoint setup and one request / one reply per bidirectional stream.
//!
//! All connection setup lives here. For now every server presents a self-signed certificate
//! generated at start-up and clients do not verify it: traffic is encrypted but peers are not
//! authenticated. Certificates from a cluster CA replace this in one place, here.
//!
//! Tuning for loopback and LANs, measured on a 2-core machine: 4 MiB UDP socket buffers
//! (default buffers drop packets under scatter/gather), GSO/GRO left on, MTU discovery up to
//! 6,500 bytes (10 GSO segments stay under 64 KiB), and flow-control windows large enough for
//! a 16 MiB gather reply in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quinn::crypto::rustls::QuicClientConfig;
use quinn::{
    ClientConfig, Connection, Endpoint, EndpointConfig, MtuDiscoveryConfig, ServerConfig,
    TransportConfig, VarInt,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::error::Error;
use crate::wire::MESSAGE_BYTES_MAX;

/// Server name every endpoint's certificate carries.
pub const SERVER_NAME: &str = "zrecord";
const SOCKET_BUFFER_BYTES: usize = 4 << 20;
const MTU_MAX: u16 = 6500;
/// Most concurrent requests (streams) one connection may have open.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 1024;

/// Transport settings; on loopback the first packets already use the large MTU (discovery
/// would get there anyway, a few round trips later).
fn transport(loopback: bool) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    if loopback {
        t.initial_mtu(MTU_MAX);
    }
    let mut mtu = MtuDiscoveryConfig::default();
    mtu.upper_bound(MTU_MAX);
    t.mtu_discovery_config(Some(mtu))
        .max_concurrent_bidi_streams(VarInt::from_u32(STREAMS_PER_CONNECTION_MAX))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(64 << 20))
        .receive_window(VarInt::from_u32(256 << 20))
        .send_window(256 << 20)
        .keep_alive_interval(Some(Duration::from_secs(5)))
        .max_idle_timeout(Some(VarInt::from_u32(60_000).into()));
    Arc::new(t)
}

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

/// A server endpoint on `addr` (which may also open client connections).
pub fn server_endpoint(addr: SocketAddr) -> Result<Endpoint, Error> {
    let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.into()])
        .map_err(|e| Error::Net(format!("cannot generate a certificate: {e}")))?;
    let cert = CertificateDer::from(certified.cert);
    let key = PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der());
    let mut server = ServerConfig::with_single_cert(vec![cert], key.into())
        .map_err(|e| Error::Net(format!("cannot configure TLS: {e}")))?;
    server.transport_config(transport(addr.ip().is_loopback()));
    let mut endpoint = Endpoint::new(
        EndpointConfig::default(),
        Some(server),
        udp_socket(addr)?,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(|e| Error::Net(format!("cannot start an endpoint on {addr}: {e}")))?;
    endpoint.set_default_client_config(client_config(false)?);
    Ok(endpoint)
}

/// A client-only endpoint on an ephemeral port of `bind` (e.g. 127.0.0.1:0 or 0.0.0.0:0).
pub fn client_endpoint(bind: SocketAddr) -> Result<Endpoint, Error> {
    let mut endpoint = Endpoint::new(
        EndpointConfig::default(),
        None,
        udp_socket(bind)?,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(|e| Error::Net(format!("cannot start a client endpoint: {e}")))?;
    endpoint.set_default_client_config(client_config(false)?);
    Ok(endpoint)
}

fn client_config(loopback: bool) -> Result<ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Net(format!("cannot configure TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth();
    let quic = QuicClientConfig::try_from(tls)
        .map_err(|e| Error::Net(format!("cannot configure QUIC: {e}")))?;
    let mut config = ClientConfig::new(Arc::new(quic));
    config.transport_config(transport(loopback));
    Ok(config)
}

/// Accepts any server certificate (but still checks the handshake signatures): the
/// start-up-generated certificates cannot be known in advance. Replaced by a cluster CA.
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

/// Connects to `addr` within `timeout`.
pub async fn connect(
    endpoint: &Endpoint,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Connection, Error> {
    let connecting = endpoint
        .connect_with(client_config(addr.ip().is_loopback())?, addr, SERVER_NAME)
        .map_err(|e| Error::Net(format!("cannot connect to {addr}: {e}")))?;
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(Error::Net(format!("cannot connect to {addr}: {e}"))),
        Err(_) => Err(Error::Net(format!(
            "connecting to {addr} timed out after {} ms",
            timeout.as_millis()
        ))),
    }
}

/// Sends one request (`header` then the `body` pieces) on a new stream of `connection` and
/// returns the whole reply, all within `timeout`. On timeout the streams are reset, so a
/// reply cut off midway can never look complete.
pub async fn call(
    connection: &Connection,
    header: Vec<u8>,
    body: Vec<Bytes>,
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let peer = connection.remote_address();
    let exchange = async {
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(|e| Error::Net(format!("{peer}: cannot open a stream: {e}")))?;
        let mut pieces: Vec<Bytes> = std::iter::once(Bytes::from(header)).chain(body).collect();
        let sent = async {
            send.write_all_chunks(&mut pieces).await?;
            send.finish()?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        };
        if let Err(e) = sent.await {
            return Err(Error::Net(format!("{peer}: sending failed: {e}")));
        }
        let reply = recv.read_to_end(MESSAGE_BYTES_MAX).await;
        reply.map_err(|e| Error::Net(format!("{peer}: receiving failed: {e}")))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        // Dropping the exchange drops its streams, which resets them (quinn resets a send
        // stream dropped unfinished and stops a receive stream dropped early).
        Err(_) => Err(Error::Net(format!(
            "{peer}: no reply within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// Writes a reply (`header` then `body` pieces) to a request's stream and finishes it.
pub async fn respond(
    send: &mut quinn::SendStream,
    header: Vec<u8>,
    body: Vec<Bytes>,
) -> Result<(), Error> {
    let mut pieces: Vec<Bytes> = std::iter::once(Bytes::from(header)).chain(body).collect();
    send.write_all_chunks(&mut pieces)
        .await
        .map_err(|e| Error::Net(format!("sending a reply failed: {e}")))?;
    send.finish()
        .map_err(|e| Error::Net(format!("finishing a reply failed: {e}")))?;
    Ok(())
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

/// How long a shutdown waits for requests in flight.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves requests on `endpoint` until `shutdown` resolves: at most `connections_max`
/// connections (more are refused), each request a stream whose bytes go to `handler` and
/// whose reply is written back. On shutdown it stops accepting and lets requests in flight
/// finish (up to [`DRAIN_TIMEOUT`]). The one accept loop of nodes and routers.
pub async fn serve<H, F>(
    endpoint: &Endpoint,
    connections_max: usize,
    shutdown: impl std::future::Future<Output = ()>,
    handler: H,
) where
    H: Fn(Vec<u8>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = (Vec<u8>, Vec<Bytes>)> + Send + 'static,
{
    let connections = Arc::new(tokio::sync::Semaphore::new(connections_max));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    tracing::warn!("refusing a connection from {}: {connections_max} already open", incoming.remote_address());
                    incoming.refuse();
                    continue;
                };
                let handler = handler.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = connection(incoming, handler).await {
                        tracing::debug!("connection ended: {e}");
                    }
                });
            }
        }
    }
    endpoint.close(0u32.into(), b"shutting down");
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, endpoint.wait_idle()).await;
}

async fn connection<H, F>(
    incoming: quinn::Incoming,
    handler: H,
) -> Result<(), quinn::ConnectionError>
where
    H: Fn(Vec<u8>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = (Vec<u8>, Vec<Bytes>)> + Send + 'static,
{
    let connection = incoming.await?;
    loop {
        let (mut send, mut recv) = connection.accept_bi().await?;
        let handler = handler.clone();
        tokio::spawn(async move {
            let bytes = match recv.read_to_end(MESSAGE_BYTES_MAX).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::debug!("request not read: {e}");
                    return;
                }
            };
            let (header, body) = handler(bytes).await;
            if let Err(e) = respond(&mut send, header, body).await {
                tracing::debug!("{e}");
            }
        });
    }
}
