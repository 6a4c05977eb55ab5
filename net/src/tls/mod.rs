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

/// The directory of the CA in a certificate directory made by `zr cluster-init`.
pub const CA_DIR: &str = "ca";

/// Creates a cluster CA in `dir/ca/` (valid [`CA_VALID_DAYS`]) and, in a directory per role
/// (`dir/node/`, `dir/router/`, `dir/reader/`, `dir/writer/`, `dir/operator/`), that role's
/// certificate and key, signed by it and valid for `days`, with a copy of `ca.pem`. Refuses
/// to overwrite an existing CA (that would orphan every certificate it signed). Key files
/// are readable by their owner only.
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
    for existing in [dir.join(CA_DIR).join(CA_FILE), dir.join(CA_FILE)] {
        if existing.exists() {
            return Err(cert_error(
                &existing,
                "a cluster CA already exists here; choose another directory (replacing it would invalidate every certificate it signed)",
            ));
        }
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
    let cert = ca_params
        .self_signed(&ca_key)
        .map_err(|e| gen("the CA", e))?;
    let ca = Ca {
        pem: cert.pem(),
        cert,
        key: ca_key,
        not_after: ca_validity.1,
    };
    let ca_dir = dir.join(CA_DIR);
    let mut files = vec![
        (ca_dir.join(CA_FILE), ca.pem.clone(), false),
        (ca_dir.join(CA_KEY_FILE), ca.key.serialize_pem(), true),
    ];
    for role in Role::ISSUED {
        let home = dir.join(role.name());
        files.push((home.join(CA_FILE), ca.pem.clone(), false));
        files.extend(issue_role(&home, role, None, &ca, role_validity)?);
    }
    for (path, text, secret) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
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

/// Issues every certificate in `dir` (each role's directory, those `zr cluster issue` added,
/// or the flat files of an older cluster) a new key and certificate, valid for `days` but not
/// past the CA's own expiry, from the CA in `dir` (`ca/ca.pem` and `ca/ca.key`), replacing
/// the old files one by one (each replacement is atomic). Processes keep their old
/// certificates until they restart; old and new are both from the same CA, so a cluster can
/// restart its processes one at a time.
pub fn renew_certs(dir: &Path, days: u32) -> Result<Renewal, Error> {
    let asked = validity(days);
    let until = reissue_roles(dir, asked)?;
    Ok(Renewal {
        until,
        cut_to_ca: until < asked.1,
    })
}

/// A cluster CA able to sign.
struct Ca {
    /// Signs (the same name and key as the CA file, so what it signs verifies against it).
    cert: rcgen::Certificate,
    key: KeyPair,
    /// When it expires: what it issues ends by then.
    not_after: time::OffsetDateTime,
    /// Its certificate file's text, as role directories keep a copy of it.
    pem: String,
}

/// The CA of certificate directory `dir` (`dir/ca/`, or `dir` itself in an older flat one).
fn load_ca(dir: &Path) -> Result<Ca, Error> {
    let home = if dir.join(CA_DIR).join(CA_FILE).exists() {
        dir.join(CA_DIR)
    } else {
        dir.to_path_buf()
    };
    let ca_path = home.join(CA_FILE);
    let ca_key_path = home.join(CA_KEY_FILE);
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|e| {
            cert_error(
                path,
                format!("cannot read it: {e} (issuing certificates needs the CA's certificate and key, as `zr cluster-init` wrote them in {CA_DIR}/)"),
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
    let not_after = ca_params.not_after;
    let cert = ca_params
        .self_signed(&ca_key)
        .map_err(|e| cert_error(&ca_path, format!("cannot sign with this CA: {e}")))?;
    Ok(Ca {
        cert,
        key: ca_key,
        not_after,
        pem: ca_pem,
    })
}

/// Every certificate in certificate directory `dir`: (its directory, role, name) — the flat
/// files of `dir` itself, and those of its subdirectories `<role>/` and `<role>-<name>/`.
fn certificates_in(dir: &Path) -> Result<Vec<(PathBuf, Role, Option<String>)>, Error> {
    let mut found = Vec::new();
    for role in Role::ALL {
        if dir.join(format!("{}.pem", role.name())).exists() {
            found.push((dir.to_path_buf(), role, None));
        }
    }
    let entries = std::fs::read_dir(dir).map_err(|e| cert_error(dir, e))?;
    let mut subdirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    subdirs.sort();
    for sub in subdirs {
        let Some(base) = sub.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        let (stem, name) = match base.split_once('-') {
            Some((stem, name)) => (stem.to_string(), Some(name.to_string())),
            None => (base.clone(), None),
        };
        let Ok(role) = stem.parse::<Role>() else {
            continue;
        };
        if sub.join(format!("{}.pem", role.name())).exists() {
            found.push((sub, role, name));
        }
    }
    Ok(found)
}

/// [`renew_certs`] with the new certificates valid from `not_before` to `not_after` (cut to
/// the CA's expiry), which it returns.
fn reissue_roles(
    dir: &Path,
    (not_before, not_after): (time::OffsetDateTime, time::OffsetDateTime),
) -> Result<time::OffsetDateTime, Error> {
    let ca = load_ca(dir)?;
    // A certificate that outlived its issuer would be refused by stricter peers.
    let not_after = not_after.min(ca.not_after);
    for (home, role, name) in certificates_in(dir)? {
        let files = issue_role(&home, role, name.as_deref(), &ca, (not_before, not_after))?;
        for (path, text, secret) in files {
            replace_file(&path, text.as_bytes(), secret).map_err(|e| cert_error(&path, e))?;
        }
    }
    Ok(not_after)
}

/// A name given to `zr cluster issue --name` that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a usable name: a lower-case letter or digit, then up to 63 of those or '.', '_', '-'")]
pub struct BadName(pub String);

/// Checks a name given to `zr cluster issue --name`: `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn check_name(name: &str) -> Result<(), BadName> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-_".contains(c));
    if first_ok && rest_ok && name.len() <= 64 {
        Ok(())
    } else {
        Err(BadName(name.to_string()))
    }
}

/// A certificate serial number as revocation by serial names it: lower-case hex, without
/// the leading zero bytes DER may add.
pub fn serial_hex(raw: &[u8]) -> String {
    let start = raw
        .iter()
        .position(|&b| b != 0)
        .unwrap_or(raw.len().saturating_sub(1));
    raw[start..].iter().map(|b| format!("{b:02x}")).collect()
}

/// The serial number of the certificate in `pem` (the first one), as [`serial_hex`] gives it.
pub fn serial_of(pem: &[u8]) -> Result<String, String> {
    let (_, block) =
        x509_parser::pem::parse_x509_pem(pem).map_err(|e| format!("not a PEM certificate: {e}"))?;
    let cert = block
        .parse_x509()
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    Ok(serial_hex(cert.raw_serial()))
}

/// `serial` as [`serial_hex`] writes it (colons and case as `openssl x509 -serial` or a
/// browser shows them are accepted), or why it is not a serial number.
pub fn normalized_serial(serial: &str) -> Result<String, String> {
    let digits: String = serial
        .trim()
        .trim_start_matches("serial=")
        .chars()
        .filter(|&c| c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    if digits.is_empty() || digits.len() > 42 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "'{serial}' is not a certificate serial number (hex digits, at most 21 bytes; `zr cluster issue` prints it)"
        ));
    }
    let digits = digits.trim_start_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    // Whole bytes, as [`serial_hex`] writes them.
    Ok(if digits.len() % 2 == 1 {
        format!("0{digits}")
    } else {
        digits.to_string()
    })
}

/// Issues one more certificate of `role` named `name` from the CA in `dir`, valid for
/// `days` (not past the CA), into a directory of its own, `dir/<role>-<name>/` (with a copy
/// of `ca.pem`), which it returns. Refuses a name already issued and the server roles'
/// second certificates (they are not told apart by name).
pub fn issue_cert(dir: &Path, role: Role, name: &str, days: u32) -> Result<PathBuf, Error> {
    check_name(name).map_err(|e| cert_error(dir, e.to_string()))?;
    if role.access().is_none() || role == Role::Client {
        return Err(cert_error(
            dir,
            format!("issue reader, writer or operator certificates; {role} certificates come with `zr cluster-init`"),
        ));
    }
    let home = dir.join(format!("{}-{name}", role.name()));
    if home.exists() {
        return Err(cert_error(
            &home,
            "already exists: a certificate of that name was issued (renew it with `zr cluster-renew`, or choose another name)",
        ));
    }
    let ca = load_ca(dir)?;
    let (not_before, not_after) = validity(days);
    let files = issue_role(
        &home,
        role,
        Some(name),
        &ca,
        (not_before, not_after.min(ca.not_after)),
    )?;
    std::fs::create_dir_all(&home).map_err(|e| cert_error(&home, e))?;
    let all = std::iter::once((home.join(CA_FILE), ca.pem, false)).chain(files);
    for (path, text, secret) in all {
        write_file(&path, text.as_bytes(), secret).map_err(|e| cert_error(&path, e))?;
    }
    Ok(home)
}

/// What a certificate of `role` is for: serving, connecting, or both.
fn usages(role: Role) -> Vec<ExtendedKeyUsagePurpose> {
    match role {
        // Nodes connect to nodes too, to rebuild from a partner's files.
        Role::Node | Role::Router => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        _ => vec![ExtendedKeyUsagePurpose::ClientAuth],
    }
}

/// Replaces the node certificate of certificate directory `dir` (same CA) by one as
/// versions before rebuilds from files issued it: for serving only.
#[cfg(test)]
pub(crate) fn issue_node_as_before(dir: &Path) -> Result<(), Error> {
    let ca = load_ca(dir)?;
    let home = role_dir(dir, Role::Node);
    let usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let files = issue_role_for(&home, Role::Node, None, &ca, validity(30), usages)?;
    for (path, text, secret) in files {
        replace_file(&path, text.as_bytes(), secret).map_err(|e| cert_error(&path, e))?;
    }
    Ok(())
}

/// A new key and certificate for `role` (named `name`, else after the role) in `home`,
/// signed by `ca`: (path, PEM, secret) per file.
fn issue_role(
    home: &Path,
    role: Role,
    name: Option<&str>,
    ca: &Ca,
    validity: (time::OffsetDateTime, time::OffsetDateTime),
) -> Result<Vec<(PathBuf, String, bool)>, Error> {
    issue_role_for(home, role, name, ca, validity, usages(role))
}

/// [`issue_role`], the certificate for `usages`.
fn issue_role_for(
    home: &Path,
    role: Role,
    name: Option<&str>,
    ca: &Ca,
    (not_before, not_after): (time::OffsetDateTime, time::OffsetDateTime),
    usages: Vec<ExtendedKeyUsagePurpose>,
) -> Result<Vec<(PathBuf, String, bool)>, Error> {
    let gen =
        |e: rcgen::Error| cert_error(home, format!("cannot create the {role} certificate: {e}"));
    let key = KeyPair::generate().map_err(gen)?;
    let mut params = CertificateParams::new(vec![role.dns_name().to_string()]).map_err(gen)?;
    let common_name = match name {
        Some(name) => format!("{} {name}", role.dns_name()),
        None => role.dns_name().to_string(),
    };
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usages;
    (params.not_before, params.not_after) = (not_before, not_after);
    let cert = params.signed_by(&key, &ca.cert, &ca.key).map_err(gen)?;
    Ok(vec![
        (home.join(format!("{}.pem", role.name())), cert.pem(), false),
        (
            home.join(format!("{}.key", role.name())),
            key.serialize_pem(),
            true,
        ),
    ])
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
