//! How an endpoint proves who it is and checks its peers: mutual TLS against the cluster CA
//! ([`Security::Tls`], identities from [`crate::tls`]): nodes accept routers and (for reads)
//! clients, routers only the client roles, and each side checks the other's role; [`Peer`] is what a server
//! learnt of the peer of a connection. [`Security::InsecureDev`] (the
//! binaries' `--insecure-dev`) keeps encryption but authenticates nobody.

use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{ClientConfig, ServerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::error::Error;
use crate::link::{transport, Link, Windows};
use crate::tls::{Identity, Role, RoleVerifier};

/// Server name of the throwaway certificates of `--insecure-dev` endpoints.
const INSECURE_SERVER_NAME: &str = "zrecord";

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

    pub(crate) fn server_config(&self, link: Link) -> Result<ServerConfig, Error> {
        let tls_error = |e: rustls::Error| Error::Setup(format!("cannot configure TLS: {e}"));
        let mut server = match self {
            Security::Tls(identity) => {
                let accepts = identity.role.accepts();
                if accepts.is_empty() {
                    return Err(Error::Setup(format!(
                        "a {} certificate cannot serve connections",
                        identity.role
                    )));
                }
                let provider = Arc::new(provider());
                let verifier = RoleVerifier::new(identity.roots(), Arc::clone(&provider), accepts)?;
                let tls = rustls::ServerConfig::builder_with_provider(provider)
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .map_err(tls_error)?
                    .with_client_cert_verifier(Arc::new(verifier))
                    .with_single_cert(identity.chain(), identity.key())
                    .map_err(|e| {
                        Error::Setup(format!(
                            "{}: the {} certificate and key do not go together: {e}",
                            identity.dir.display(),
                            identity.role
                        ))
                    })?;
                let quic = QuicServerConfig::try_from(tls)
                    .map_err(|e| Error::Setup(format!("cannot configure QUIC: {e}")))?;
                ServerConfig::with_crypto(Arc::new(quic))
            }
            Security::InsecureDev => {
                let certified =
                    rcgen::generate_simple_self_signed(vec![INSECURE_SERVER_NAME.into()])
                        .map_err(|e| Error::Setup(format!("cannot generate a certificate: {e}")))?;
                let cert = CertificateDer::from(certified.cert);
                let key = PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der());
                ServerConfig::with_single_cert(vec![cert], key.into()).map_err(tls_error)?
            }
        };
        server.transport_config(transport(link, Windows::DEFAULT));
        Ok(server)
    }

    /// The client configuration for connecting to a server of role `server` (`None`: the
    /// one this role connects to by default), and the name to ask it for.
    pub(crate) fn client_config(
        &self,
        link: Link,
        windows: Windows,
        server: Option<Role>,
    ) -> Result<(ClientConfig, &'static str), Error> {
        let provider = Arc::new(provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| Error::Setup(format!("cannot configure TLS: {e}")))?;
        let (tls, name) = match self {
            Security::Tls(identity) => {
                let target = match server {
                    Some(server) if identity.role.may_connect_to(server) => server,
                    Some(server) => {
                        return Err(Error::Setup(format!(
                            "a {} certificate cannot connect to a {server}",
                            identity.role
                        )))
                    }
                    None => identity.role.connects_to().ok_or_else(|| {
                        Error::Setup(format!("a {} certificate cannot connect", identity.role))
                    })?,
                };
                let tls = builder
                    .with_root_certificates(identity.roots())
                    .with_client_auth_cert(identity.chain(), identity.key())
                    .map_err(|e| {
                        Error::Setup(format!(
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
            .map_err(|e| Error::Setup(format!("cannot configure QUIC: {e}")))?;
        let mut config = ClientConfig::new(Arc::new(quic));
        config.transport_config(transport(link, windows));
        Ok((config, name))
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

/// Who is at the other end of an accepted connection, as its certificate says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The peer's role; `None` on an `--insecure-dev` endpoint, where nobody is checked and
    /// every request is allowed.
    pub role: Option<Role>,
    /// Tells identities apart (a hash of the peer's certificate, or of its IP address where
    /// there is none): connection allowances are per identity.
    pub identity: u64,
    /// The name its certificate was issued under (`zr cluster issue --name`), or the role's
    /// own name for a role's shared certificate; `None` without a certificate.
    pub name: Option<String>,
    /// The serial number of a certificate `zr cluster issue` made, in lower-case hex (see
    /// [`crate::tls::serial_of`]); `None` for a role's shared certificate, which revocation
    /// by serial does not reach.
    pub serial: Option<String>,
}

impl Peer {
    /// The peer of `connection`, accepted by a server that takes `accepts`.
    pub fn of(connection: &quinn::Connection, accepts: &[Role]) -> Peer {
        use std::hash::{Hash, Hasher};
        let certificate = connection
            .peer_identity()
            .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
            .and_then(|chain| chain.into_iter().next());
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let (role, name, serial) = match &certificate {
            Some(cert) => {
                cert.as_ref().hash(&mut hasher);
                let role = Role::of_certificate(cert, accepts);
                let (name, serial) = role.map(|role| issued(cert, role)).unwrap_or_default();
                (role, name, serial)
            }
            None => {
                connection.remote_address().ip().hash(&mut hasher);
                (None, None, None)
            }
        };
        Peer {
            role,
            identity: hasher.finish(),
            name,
            serial,
        }
    }

    /// Who this is, for a log line: the certificate's name, else its role, else its address's
    /// hash.
    pub fn who(&self) -> String {
        match self.certified_name() {
            Some(name) => name.to_string(),
            None => format!("uncertified-{:016x}", self.identity),
        }
    }

    /// The name grants and revocations know it by: its certificate's name, else its role's
    /// (`None` without a certificate).
    pub fn certified_name(&self) -> Option<&str> {
        self.name
            .as_deref()
            .or_else(|| self.role.map(|role| role.name()))
    }

    /// What this peer may ask of a router (everything on an `--insecure-dev` endpoint).
    pub fn access(&self) -> Option<crate::tls::Access> {
        match self.role {
            None => Some(crate::tls::Access::Operate),
            Some(role) => role.access(),
        }
    }
}

/// The name `cert` (of role `role`) was issued under, and its serial if `zr cluster issue`
/// made it. Its common name is the role's DNS name, then a space and the name `zr cluster
/// issue --name` gave it; the role's own name if it has none (the role's shared
/// certificate, whose serial is not given).
fn issued(cert: &CertificateDer<'_>, role: Role) -> (Option<String>, Option<String>) {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return (None, None);
    };
    let common = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok());
    let Some(rest) = common.and_then(|c| c.strip_prefix(role.dns_name())) else {
        return (None, None);
    };
    match rest.strip_prefix(' ') {
        Some(name) if !name.is_empty() => (
            Some(name.to_string()),
            Some(crate::tls::serial_hex(parsed.raw_serial())),
        ),
        _ if rest.is_empty() => (Some(role.name().to_string()), None),
        _ => (None, None),
    }
}

/// The cryptography of every connection: ring's, with AES-128-GCM first rather than
/// AES-256-GCM (TLS 1.3's mandatory suite, which QUIC's first packets use anyway): four
/// fewer AES rounds on every byte sent and received, 2-5% less CPU per batch in
/// `cluster_bench`. Peers that prefer another suite still agree on one of the three.
fn provider() -> rustls::crypto::CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    provider
}

#[cfg(test)]
mod tests {
    #[test]
    fn aes_128_gcm_comes_first_and_no_suite_is_lost() {
        let ours = super::provider();
        let default = rustls::crypto::ring::default_provider();
        assert_eq!(
            ours.cipher_suites[0].suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        );
        let names = |p: &rustls::crypto::CryptoProvider| {
            let mut names: Vec<_> = p.cipher_suites.iter().map(|s| s.suite().as_str()).collect();
            names.sort();
            names
        };
        assert_eq!(names(&ours), names(&default));
    }
}
