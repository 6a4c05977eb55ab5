//! Cluster identities: one CA per cluster signs a certificate for each role — nodes, routers,
//! clients — and every connection is mutual TLS against that CA.
//!
//! A role is the certificate's DNS name (`node.zrecord`, `router.zrecord`,
//! `client.zrecord`): a server proves its role by the name the connecting side asks for, a
//! connecting peer by the name its client certificate carries. Nodes accept only routers;
//! routers accept only clients. The name is a role, not a host, so the same files serve any
//! address. A certificate directory (made by `zr cluster-init`) holds:
//!
//! ```text
//! ca.pem                          the cluster CA: every process needs it
//! ca.key                          the CA's key: keep it off the cluster (it mints identities)
//! node.pem node.key               for zr-node
//! router.pem router.key           for zr-router
//! client.pem client.key           for clients (zr --router, the client library)
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use crate::error::Error;

/// The cluster CA's certificate file in a certificate directory.
pub const CA_FILE: &str = "ca.pem";
/// The CA's private key (only `cluster-init` writes it; no process reads it).
pub const CA_KEY_FILE: &str = "ca.key";

/// What a certificate entitles its holder to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serves a shard; accepts only routers.
    Node,
    /// Serves clients and connects to nodes.
    Router,
    /// Connects to routers.
    Client,
}

impl Role {
    /// Every role, in file order.
    pub const ALL: [Role; 3] = [Role::Node, Role::Router, Role::Client];

    /// The role's file stem: `node`, `router`, `client`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Router => "router",
            Role::Client => "client",
        }
    }

    /// The DNS name its certificate carries.
    pub fn dns_name(self) -> &'static str {
        match self {
            Role::Node => "node.zrecord",
            Role::Router => "router.zrecord",
            Role::Client => "client.zrecord",
        }
    }

    /// The role a server of this role accepts as peers (`None`: it serves nobody).
    pub fn accepts(self) -> Option<Role> {
        match self {
            Role::Node => Some(Role::Router),
            Role::Router => Some(Role::Client),
            Role::Client => None,
        }
    }

    /// The role this one connects to (`None`: it connects to nobody).
    pub fn connects_to(self) -> Option<Role> {
        match self {
            Role::Node => None,
            Role::Router => Some(Role::Node),
            Role::Client => Some(Role::Router),
        }
    }
}

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

impl Identity {
    /// Loads `role`'s credentials from certificate directory `dir`; a missing or unreadable
    /// file is named in the error.
    pub fn load(dir: &Path, role: Role) -> Result<Identity, Error> {
        let hint = "(create the certificates with `zr cluster-init`)";
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
            Role::Router | Role::Client => webpki::KeyUsage::client_auth(),
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

/// How long a cluster CA is valid.
pub const CA_VALID_DAYS: u32 = 3650;
/// How long role certificates are valid unless told otherwise; `zr cluster-renew` issues new
/// ones from the same CA before then.
pub const CERT_VALID_DAYS: u32 = 365;
/// A process whose certificate expires within this many days warns when it loads it.
const EXPIRY_WARNING_DAYS: u64 = 30;
/// A process whose cluster CA expires within this many days warns when it loads it: moving a
/// cluster to a new CA takes longer than renewing.
const CA_EXPIRY_WARNING_DAYS: i64 = 90;

/// From an hour ago (a peer's clock may lag) to `days` from now.
fn validity(days: u32) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    (
        now - time::Duration::hours(1),
        now + time::Duration::days(days.into()),
    )
}

/// Creates a cluster CA in `dir` (valid [`CA_VALID_DAYS`]) and a certificate and key for
/// every role, signed by it and valid for `days`. Refuses to overwrite an existing CA (that
/// would orphan every certificate it signed). Key files are readable by their owner only.
pub fn init_certs(dir: &Path, days: u32) -> Result<(), Error> {
    create_cluster_certs(dir, validity(CA_VALID_DAYS), validity(days))
}

/// [`init_certs`] with the CA valid over `ca_validity` and the roles over `role_validity`
/// (cut to the CA's).
fn create_cluster_certs(
    dir: &Path,
    ca_validity: (time::OffsetDateTime, time::OffsetDateTime),
    (not_before, not_after): (time::OffsetDateTime, time::OffsetDateTime),
) -> Result<(), Error> {
    let io = |path: &Path, e: std::io::Error| cert_error(path, e);
    let gen = |what: &str, e: rcgen::Error| cert_error(dir, format!("cannot create {what}: {e}"));
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let ca_path = dir.join(CA_FILE);
    if ca_path.exists() {
        return Err(cert_error(
            &ca_path,
            "a cluster CA already exists here; choose another directory (replacing it would invalidate every certificate it signed)",
        ));
    }
    let ca_key = KeyPair::generate().map_err(|e| gen("the CA key", e))?;
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| gen("the CA", e))?;
    // A name of its own, so another cluster's certificates are told apart by issuer.
    let id = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        h.write_u32(std::process::id());
        h.finish()
    };
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("zrecord cluster CA {id:016x}"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (ca_params.not_before, ca_params.not_after) = ca_validity;
    let role_validity = (not_before, not_after.min(ca_validity.1));
    let ca = ca_params
        .self_signed(&ca_key)
        .map_err(|e| gen("the CA", e))?;
    let mut files = vec![
        (ca_path, ca.pem(), false),
        (dir.join(CA_KEY_FILE), ca_key.serialize_pem(), true),
    ];
    files.extend(issue_roles(dir, &ca, &ca_key, role_validity)?);
    for (path, text, secret) in files {
        write_file(&path, text.as_bytes(), secret).map_err(|e| io(&path, e))?;
    }
    Ok(())
}

/// When certificates issued by [`renew_certs`] expire.
#[derive(Clone, Copy, Debug)]
pub struct Renewal {
    pub until: time::OffsetDateTime,
    /// True if they end with the CA, before the days asked for.
    pub cut_to_ca: bool,
}

/// Issues every role a new key and certificate, valid for `days` but not past the CA's own
/// expiry, from the CA in `dir` (`ca.pem` and `ca.key`), replacing the old files one by one
/// (each replacement is atomic). Processes keep their old certificates until they restart;
/// old and new are both from the same CA, so a cluster can restart its processes one at a
/// time.
pub fn renew_certs(dir: &Path, days: u32) -> Result<Renewal, Error> {
    let asked = validity(days);
    let until = reissue_roles(dir, asked)?;
    Ok(Renewal {
        until,
        cut_to_ca: until < asked.1,
    })
}

/// [`renew_certs`] with the new certificates valid from `not_before` to `not_after` (cut to
/// the CA's expiry), which it returns.
fn reissue_roles(
    dir: &Path,
    (not_before, not_after): (time::OffsetDateTime, time::OffsetDateTime),
) -> Result<time::OffsetDateTime, Error> {
    let ca_path = dir.join(CA_FILE);
    let ca_key_path = dir.join(CA_KEY_FILE);
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|e| {
            cert_error(
                path,
                format!("cannot read it: {e} (renewing needs the CA's certificate and key, as `zr cluster-init` wrote them)"),
            )
        })
    };
    let ca_pem = read(&ca_path)?;
    let ca_key = KeyPair::from_pem(&read(&ca_key_path)?)
        .map_err(|e| cert_error(&ca_key_path, format!("not a usable key: {e}")))?;
    let ca_params = CertificateParams::from_ca_cert_pem(&ca_pem)
        .map_err(|e| cert_error(&ca_path, format!("not a usable CA certificate: {e}")))?;
    if ca_params.not_after <= time::OffsetDateTime::now_utc() {
        return Err(cert_error(
            &ca_path,
            "the cluster CA has expired: create a new cluster CA with `zr cluster-init` and give every process its files",
        ));
    }
    // A certificate that outlived its issuer would be refused by stricter peers.
    let not_after = not_after.min(ca_params.not_after);
    // The same name and key as the CA file: what it signs verifies against that file.
    let ca = ca_params
        .self_signed(&ca_key)
        .map_err(|e| cert_error(&ca_path, format!("cannot sign with this CA: {e}")))?;
    for (path, text, secret) in issue_roles(dir, &ca, &ca_key, (not_before, not_after))? {
        replace_file(&path, text.as_bytes(), secret).map_err(|e| cert_error(&path, e))?;
    }
    Ok(not_after)
}

/// A new key and certificate for every role, signed by `ca`: (path, PEM, secret) per file.
fn issue_roles(
    dir: &Path,
    ca: &rcgen::Certificate,
    ca_key: &KeyPair,
    (not_before, not_after): (time::OffsetDateTime, time::OffsetDateTime),
) -> Result<Vec<(PathBuf, String, bool)>, Error> {
    let gen = |what: &str, e: rcgen::Error| cert_error(dir, format!("cannot create {what}: {e}"));
    let mut files = Vec::new();
    for role in Role::ALL {
        let key = KeyPair::generate().map_err(|e| gen(role.name(), e))?;
        let mut params = CertificateParams::new(vec![role.dns_name().to_string()])
            .map_err(|e| gen(role.name(), e))?;
        params
            .distinguished_name
            .push(DnType::CommonName, role.dns_name());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match role {
            Role::Node => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Role::Router => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        (params.not_before, params.not_after) = (not_before, not_after);
        let cert = params
            .signed_by(&key, ca, ca_key)
            .map_err(|e| gen(role.name(), e))?;
        files.push((dir.join(format!("{}.pem", role.name())), cert.pem(), false));
        files.push((
            dir.join(format!("{}.key", role.name())),
            key.serialize_pem(),
            true,
        ));
    }
    Ok(files)
}

/// Writes `path` anew through a temporary file renamed over it: a reader sees the old file
/// or the new one, never a part.
fn replace_file(path: &Path, bytes: &[u8], secret: bool) -> std::io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".new");
    let temporary = PathBuf::from(temporary);
    match std::fs::remove_file(&temporary) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    write_file(&temporary, bytes, secret)?;
    std::fs::rename(&temporary, path)?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8], secret: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    if secret {
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Accepts a client certificate only if it chains to the cluster CA *and* is for `role`.
#[derive(Debug)]
pub(crate) struct RoleVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    role: Role,
}

impl RoleVerifier {
    pub(crate) fn new(
        roots: Arc<RootCertStore>,
        provider: Arc<rustls::crypto::CryptoProvider>,
        role: Role,
    ) -> Result<RoleVerifier, Error> {
        let inner = WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| Error::Setup(format!("cannot configure client authentication: {e}")))?;
        Ok(RoleVerifier { inner, role })
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
        let name = ServerName::try_from(self.role.dns_name())
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        if cert.verify_is_valid_for_subject_name(&name).is_err() {
            tracing::warn!(
                "refused a peer whose certificate is not for the {} role",
                self.role
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
mod tests {
    use super::*;

    /// Replaces the role certificates in `dir` with ones valid from `from` to `to` days from
    /// now, signed by its CA.
    fn reissue(dir: &Path, from: i64, to: i64) {
        let now = time::OffsetDateTime::now_utc();
        let validity = (
            now + time::Duration::days(from),
            now + time::Duration::days(to),
        );
        reissue_roles(dir, validity).unwrap();
    }

    /// Expired or not-yet-valid certificates are refused at load, naming the cure; one that
    /// expires soon still loads. Renewal from the same CA makes them good again, with new
    /// files (keys too), and needs the CA's key.
    #[test]
    fn expired_certificates_are_refused_at_load_and_renewed_from_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        init_certs(dir.path(), 30).unwrap();
        reissue(dir.path(), -30, -1);
        for role in Role::ALL {
            let e = Identity::load(dir.path(), role).unwrap_err().to_string();
            assert!(
                e.contains("has expired") && e.contains("zr cluster-renew"),
                "{role}: {e}"
            );
        }
        reissue(dir.path(), 1, 30);
        let e = Identity::load(dir.path(), Role::Node)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid yet"), "{e}");
        reissue(dir.path(), -1, 10);
        for role in Role::ALL {
            // Expires soon: a warning, not an error.
            let identity = Identity::load(dir.path(), role).unwrap();
            let warnings = identity.warnings().join("\n");
            assert!(
                warnings.contains(&format!("{}.pem", role.name()))
                    && warnings.contains("expires within 30 days")
                    && warnings.contains("zr cluster-renew")
                    && !warnings.contains("cluster CA"),
                "{warnings}"
            );
        }

        let old_key = std::fs::read(dir.path().join("router.key")).unwrap();
        renew_certs(dir.path(), 365).unwrap();
        for role in Role::ALL {
            Identity::load(dir.path(), role).unwrap();
        }
        assert_ne!(
            std::fs::read(dir.path().join("router.key")).unwrap(),
            old_key
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("router.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        std::fs::remove_file(dir.path().join(CA_KEY_FILE)).unwrap();
        let e = renew_certs(dir.path(), 365).unwrap_err().to_string();
        assert!(e.contains(CA_KEY_FILE), "{e}");
    }

    /// A CA near its end is warned of, naming ca.pem and the cure; certificates issued from it
    /// end with it; once it has expired, renewal refuses and says what to do instead.
    #[test]
    fn a_ca_near_its_end_is_warned_of_and_limits_what_it_issues() {
        let dir = tempfile::tempdir().unwrap();
        let now = time::OffsetDateTime::now_utc();
        let ca_end = now + time::Duration::days(20);
        let ca_validity = (now - time::Duration::days(1), ca_end);
        create_cluster_certs(dir.path(), ca_validity, validity(365)).unwrap();
        for role in Role::ALL {
            let identity = Identity::load(dir.path(), role).unwrap();
            let warnings = identity.warnings().join("\n");
            assert!(
                warnings.contains(CA_FILE)
                    && warnings.contains(&format!("cluster CA expires on {}", ca_end.date()))
                    && warnings.contains("zr cluster-init"),
                "{warnings}"
            );
        }
        let renewal = renew_certs(dir.path(), 365).unwrap();
        assert!(
            renewal.cut_to_ca && renewal.until <= ca_end,
            "{renewal:?} {ca_end}"
        );
        assert!(renewal.until > now + time::Duration::days(19));
        assert!(!renew_certs(dir.path(), 10).unwrap().cut_to_ca);

        let fresh = tempfile::tempdir().unwrap();
        init_certs(fresh.path(), CERT_VALID_DAYS).unwrap();
        let identity = Identity::load(fresh.path(), Role::Router).unwrap();
        assert!(identity.warnings().is_empty(), "{:?}", identity.warnings());

        let ended = tempfile::tempdir().unwrap();
        let past = (
            now - time::Duration::days(10),
            now - time::Duration::days(1),
        );
        create_cluster_certs(ended.path(), past, past).unwrap();
        let e = renew_certs(ended.path(), 365).unwrap_err().to_string();
        assert!(
            e.contains(CA_FILE) && e.contains("has expired") && e.contains("zr cluster-init"),
            "{e}"
        );
    }

    /// A certificate from another cluster's CA is refused at load.
    #[test]
    fn a_certificate_from_another_ca_is_refused_at_load() {
        let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        init_certs(one.path(), 30).unwrap();
        init_certs(two.path(), 30).unwrap();
        std::fs::copy(two.path().join("node.pem"), one.path().join("node.pem")).unwrap();
        let e = Identity::load(one.path(), Role::Node)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not verify against ca.pem"), "{e}");
    }

    #[test]
    fn init_then_load_every_role_and_refuse_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        init_certs(dir.path(), CERT_VALID_DAYS).unwrap();
        for role in Role::ALL {
            let identity = Identity::load(dir.path(), role).unwrap();
            assert_eq!(identity.role, role);
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("client.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = init_certs(dir.path(), CERT_VALID_DAYS)
            .unwrap_err()
            .to_string();
        assert!(again.contains("already exists"), "{again}");
        std::fs::remove_file(dir.path().join("router.key")).unwrap();
        let missing = Identity::load(dir.path(), Role::Router)
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("router.key") && missing.contains("cluster-init"),
            "{missing}"
        );
    }
}
