//! Cluster identities: one CA per cluster signs a certificate for each role — nodes,
//! routers, and clients that read, write or operate — and every connection is mutual TLS
//! against that CA.
//!
//! A role is the certificate's DNS name (`node.zrecord`, `router.zrecord`, `reader.zrecord`,
//! `writer.zrecord`, `operator.zrecord`; `client.zrecord` from clusters made before roles,
//! taken as a writer): a server proves its role by the name the connecting side asks for, a
//! connecting peer by the name its client certificate carries. Nodes accept routers, and
//! clients for reads only (gathers one hop, see `zr_router::direct`); routers accept the
//! client roles and let each ask for what its role allows. The name is a
//! role, not a host, so the same files serve any address. `zr cluster-init` makes one
//! directory per role, so that what a process is given holds nothing another role needs:
//!
//! ```text
//! ca/        ca.pem ca.key                  the CA: keep it off the cluster (it mints identities)
//! node/      ca.pem node.pem node.key       for zr-node
//! router/    ca.pem router.pem router.key   for zr-router
//! reader/    ca.pem reader.pem reader.key   for training jobs that read
//! writer/    ca.pem writer.pem writer.key   for jobs that write
//! operator/  ca.pem operator.pem …          for operators (moves, repair)
//! ```
//!
//! A process given the whole directory finds its role's subdirectory; one given a role's
//! directory uses it. `zr cluster issue --role R --name N` adds `R-N/` with a certificate of
//! its own (one per job, so each has its own connection allowance). A flat directory of an
//! older cluster (`ca.pem`, `node.pem`, `client.pem`, … side by side) still loads.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::CertificateParams;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use crate::error::Error;

mod issue;
pub use issue::*;

/// The cluster CA's certificate file in a certificate directory.
pub const CA_FILE: &str = "ca.pem";
/// The CA's private key (only `cluster-init` writes it; no process reads it).
pub const CA_KEY_FILE: &str = "ca.key";

/// What a certificate entitles its holder to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Serves a shard; accepts routers, and clients for reads only.
    Node,
    /// Serves clients and connects to nodes.
    Router,
    /// A client that reads: gather, info, status.
    Reader,
    /// A client that reads and writes: append, modify, delete, commit.
    Writer,
    /// A client that may do everything: moves, node replacement, scrub and repair.
    Operator,
    /// The one client role of clusters made before roles: accepted as a [`Role::Writer`].
    Client,
}

pub use zr_proto::wire::Access;

impl Role {
    /// Every role, in file order.
    pub const ALL: [Role; 6] = [
        Role::Node,
        Role::Router,
        Role::Reader,
        Role::Writer,
        Role::Operator,
        Role::Client,
    ];

    /// The roles `zr cluster-init` issues (a `client` certificate is only ever kept from an
    /// older cluster).
    pub const ISSUED: [Role; 5] = [
        Role::Node,
        Role::Router,
        Role::Reader,
        Role::Writer,
        Role::Operator,
    ];

    /// The client roles, least access first: the order in which `zr` picks one.
    pub const CLIENTS: [Role; 4] = [Role::Reader, Role::Writer, Role::Client, Role::Operator];

    /// The role's file stem: `node`, `router`, `reader`, `writer`, `operator`, `client`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Router => "router",
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Operator => "operator",
            Role::Client => "client",
        }
    }

    /// The DNS name its certificate carries.
    pub fn dns_name(self) -> &'static str {
        match self {
            Role::Node => "node.zrecord",
            Role::Router => "router.zrecord",
            Role::Reader => "reader.zrecord",
            Role::Writer => "writer.zrecord",
            Role::Operator => "operator.zrecord",
            Role::Client => "client.zrecord",
        }
    }

    /// "a node", "an operator", …: for messages.
    pub fn with_article(self) -> String {
        let article = if self == Role::Operator { "an" } else { "a" };
        format!("{article} {}", self.name())
    }

    /// What a client of this role may ask of a router (`None`: not a client role).
    pub fn access(self) -> Option<Access> {
        match self {
            Role::Reader => Some(Access::Read),
            Role::Writer | Role::Client => Some(Access::Write),
            Role::Operator => Some(Access::Operate),
            Role::Node | Role::Router => None,
        }
    }

    /// The roles a server of this role accepts as peers (empty: it serves nobody).
    pub fn accepts(self) -> &'static [Role] {
        match self {
            Role::Node => &[
                Role::Router,
                Role::Node,
                Role::Reader,
                Role::Writer,
                Role::Operator,
                Role::Client,
            ],
            Role::Router => &[Role::Reader, Role::Writer, Role::Operator, Role::Client],
            Role::Reader | Role::Writer | Role::Operator | Role::Client => &[],
        }
    }

    /// The role this one connects to (`None`: it connects to nobody).
    pub fn connects_to(self) -> Option<Role> {
        match self {
            Role::Node => None,
            Role::Router => Some(Role::Node),
            Role::Reader | Role::Writer | Role::Operator | Role::Client => Some(Role::Router),
        }
    }

    /// Whether this role may connect to a server of role `server`: routers to nodes, clients
    /// to routers and (for reads) to nodes, nodes to nodes (a rebuild copying a partner's
    /// files).
    pub fn may_connect_to(self, server: Role) -> bool {
        match self {
            Role::Node => server == Role::Node,
            Role::Router => server == Role::Node,
            Role::Reader | Role::Writer | Role::Operator | Role::Client => {
                matches!(server, Role::Router | Role::Node)
            }
        }
    }

    /// The role a certificate is for: the first of `among` its names are valid for.
    pub fn of_certificate(cert: &CertificateDer<'_>, among: &[Role]) -> Option<Role> {
        let cert = webpki::EndEntityCert::try_from(cert).ok()?;
        among.iter().copied().find(|role| {
            ServerName::try_from(role.dns_name())
                .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
        })
    }
}

impl std::str::FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| UnknownRole(s.to_string()))
    }
}

/// A role name that is none of the roles.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}: one of node, router, reader, writer, operator")]
pub struct UnknownRole(pub String);

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A process's credentials: the cluster CA and its own certificate chain and key.
pub struct Identity {
    /// The role the certificate is for.
    pub role: Role,
    /// Where the files came from (for messages).
    pub dir: PathBuf,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    warnings: Vec<String>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("role", &self.role)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn cert_error(path: &Path, reason: impl fmt::Display) -> Error {
    Error::Config {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Where `role`'s files are under `dir`: `dir` itself if it holds `<role>.pem` (a role's own
/// directory, or the flat directory of an older cluster), else `dir/<role>/` if that exists,
/// else `dir` (whose missing files the caller then names).
pub fn role_dir(dir: &Path, role: Role) -> PathBuf {
    let file = format!("{}.pem", role.name());
    if dir.join(&file).exists() {
        return dir.to_path_buf();
    }
    let sub = dir.join(role.name());
    if sub.join(&file).exists() {
        return sub;
    }
    dir.to_path_buf()
}

/// True if `dir` holds `role`'s certificate (see [`role_dir`]).
pub fn holds_role(dir: &Path, role: Role) -> bool {
    role_dir(dir, role)
        .join(format!("{}.pem", role.name()))
        .exists()
}

impl Identity {
    /// Loads `role`'s credentials from certificate directory `dir`; a missing or unreadable
    /// file is named in the error.
    pub fn load(dir: &Path, role: Role) -> Result<Identity, Error> {
        let hint = "(create the certificates with `zr cluster-init`)";
        let dir = &role_dir(dir, role);
        let ca_path = dir.join(CA_FILE);
        let ca = CertificateDer::pem_file_iter(&ca_path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| cert_error(&ca_path, format!("cannot read the cluster CA: {e} {hint}")))?;
        // Peers do not check the CA's own dates, but renewal needs a CA that is still valid.
        let ca_not_after = ca
            .first()
            .and_then(|der| CertificateParams::from_ca_cert_der(der).ok())
            .map(|params| params.not_after);
        let mut roots = RootCertStore::empty();
        for cert in ca {
            roots
                .add(cert)
                .map_err(|e| cert_error(&ca_path, format!("not a usable CA certificate: {e}")))?;
        }
        if roots.is_empty() {
            return Err(cert_error(&ca_path, "holds no certificate"));
        }
        let cert_path = dir.join(format!("{}.pem", role.name()));
        let chain = CertificateDer::pem_file_iter(&cert_path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                cert_error(
                    &cert_path,
                    format!("cannot read the {role} certificate: {e} {hint}"),
                )
            })?;
        if chain.is_empty() {
            return Err(cert_error(&cert_path, "holds no certificate"));
        }
        // A certificate of another role would be refused by every peer: say so at start.
        match Role::of_certificate(&chain[0], &Role::ALL) {
            Some(is) if is == role => {}
            Some(is) => {
                return Err(cert_error(
                    &cert_path,
                    format!("this is {} certificate, not {} certificate: give this process the {role} files (`zr cluster-init` puts them in {role}/)", is.with_article(), role.with_article()),
                ))
            }
            None => {
                return Err(cert_error(
                    &cert_path,
                    format!("this is not a zrecord {role} certificate (it is for no zrecord role)"),
                ))
            }
        }
        let key_path = dir.join(format!("{}.key", role.name()));
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| {
            cert_error(&key_path, format!("cannot read the {role} key: {e} {hint}"))
        })?;
        let mut identity = Identity {
            role,
            dir: dir.to_path_buf(),
            roots: Arc::new(roots),
            chain,
            key,
            warnings: Vec::new(),
        };
        // Peers would refuse a certificate that is expired or from another CA: say so here,
        // at start-up, rather than as a refused connection later.
        let now = UnixTime::now();
        let renew = format!("`zr cluster-renew --certs {}`", dir.display());
        identity.verify_own(now).map_err(|e| match e {
            webpki::Error::CertExpired { .. } => cert_error(
                &cert_path,
                format!("the {role} certificate has expired; issue new ones with {renew}"),
            ),
            webpki::Error::CertNotValidYet { .. } => cert_error(
                &cert_path,
                format!("the {role} certificate is not valid yet: is this machine's clock right?"),
            ),
            other => cert_error(
                &cert_path,
                format!("the {role} certificate does not verify against {CA_FILE}: {other:?}"),
            ),
        })?;
        let soon = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
            now.as_secs() + EXPIRY_WARNING_DAYS * 86_400,
        ));
        if identity.verify_own(soon).is_err() {
            identity.warnings.push(format!(
                "{}: the {role} certificate expires within {EXPIRY_WARNING_DAYS} days; issue new ones with {renew} and restart",
                cert_path.display()
            ));
        }
        if let Some(not_after) = ca_not_after {
            let left = not_after - time::OffsetDateTime::now_utc();
            if left < time::Duration::days(CA_EXPIRY_WARNING_DAYS) {
                let when = if left.is_negative() {
                    format!("expired on {}", not_after.date())
                } else {
                    format!("expires on {}", not_after.date())
                };
                identity.warnings.push(format!(
                    "{}: the cluster CA {when}; `zr cluster-renew` cannot issue certificates from an expired CA, so make a new CA with `zr cluster-init` and move every process to it (ops/README.md)",
                    ca_path.display()
                ));
            }
        }
        for warning in &identity.warnings {
            tracing::warn!("{warning}");
        }
        Ok(identity)
    }

    /// Checks this identity's certificate against its own CA at `time` (chain, lifetime and
    /// key usage; whether it is for the role is the peer's check, see [`RoleVerifier`]).
    fn verify_own(&self, time: UnixTime) -> Result<(), webpki::Error> {
        let cert = webpki::EndEntityCert::try_from(&self.chain[0])?;
        // Nodes serve; routers and clients connect (routers serve too: their certificate has
        // both usages).
        let usage = match self.role {
            Role::Node => webpki::KeyUsage::server_auth(),
            _ => webpki::KeyUsage::client_auth(),
        };
        cert.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &self.roots.roots,
            &self.chain[1..],
            time,
            usage,
            None,
            None,
        )
        .map(|_| ())
    }

    /// What loading found that will need attention soon (certificates near or past their
    /// expiry), as logged at load.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The CA roots peers are checked against.
    pub fn roots(&self) -> Arc<RootCertStore> {
        Arc::clone(&self.roots)
    }

    /// This process's certificate chain.
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.chain.clone()
    }

    /// This process's private key.
    pub fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }
}

/// A process whose certificate expires within this many days warns when it loads it.
const EXPIRY_WARNING_DAYS: u64 = 30;
/// A process whose cluster CA expires within this many days warns when it loads it: moving a
/// cluster to a new CA takes longer than renewing.
const CA_EXPIRY_WARNING_DAYS: i64 = 90;

/// Accepts a client certificate only if it chains to the cluster CA *and* is for one of
/// `roles`.
#[derive(Debug)]
pub(crate) struct RoleVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    roles: &'static [Role],
}

impl RoleVerifier {
    pub(crate) fn new(
        roots: Arc<RootCertStore>,
        provider: Arc<rustls::crypto::CryptoProvider>,
        roles: &'static [Role],
    ) -> Result<RoleVerifier, Error> {
        let inner = WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| Error::Setup(format!("cannot configure client authentication: {e}")))?;
        Ok(RoleVerifier { inner, roles })
    }
}

impl ClientCertVerifier for RoleVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
            .inspect_err(|e| tracing::warn!("refused a peer's certificate: {e}"))?;
        if Role::of_certificate(end_entity, self.roles).is_none() {
            let names: Vec<&str> = self.roles.iter().map(|r| r.name()).collect();
            tracing::warn!(
                "refused a peer whose certificate is not for a role this server accepts ({})",
                names.join(", ")
            );
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests;
