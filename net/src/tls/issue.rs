//! Making a cluster's certificates: its CA and a certificate per role (`zr cluster-init`),
//! renewing them from the same CA (`zr cluster-renew`), issuing one of a role under a name
//! (`zr cluster issue`), and reading an issued certificate's serial number.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use super::*;
use crate::error::Error;

/// How long a cluster CA is valid.
pub const CA_VALID_DAYS: u32 = 3650;
/// How long role certificates are valid unless told otherwise; `zr cluster-renew` issues new
/// ones from the same CA before then.
pub const CERT_VALID_DAYS: u32 = 365;

/// From an hour ago (a peer's clock may lag) to `days` from now.
pub(super) fn validity(days: u32) -> (time::OffsetDateTime, time::OffsetDateTime) {
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
pub(super) fn create_cluster_certs(
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
pub(super) struct Ca {
    /// Signs (the same name and key as the CA file, so what it signs verifies against it).
    cert: rcgen::Certificate,
    key: KeyPair,
    /// When it expires: what it issues ends by then.
    not_after: time::OffsetDateTime,
    /// Its certificate file's text, as role directories keep a copy of it.
    pub(super) pem: String,
}

/// The CA of certificate directory `dir` (`dir/ca/`, or `dir` itself in an older flat one).
pub(super) fn load_ca(dir: &Path) -> Result<Ca, Error> {
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
pub(super) fn certificates_in(dir: &Path) -> Result<Vec<(PathBuf, Role, Option<String>)>, Error> {
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
pub(super) fn reissue_roles(
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
pub(super) fn usages(role: Role) -> Vec<ExtendedKeyUsagePurpose> {
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
pub(super) fn issue_role(
    home: &Path,
    role: Role,
    name: Option<&str>,
    ca: &Ca,
    validity: (time::OffsetDateTime, time::OffsetDateTime),
) -> Result<Vec<(PathBuf, String, bool)>, Error> {
    issue_role_for(home, role, name, ca, validity, usages(role))
}

/// [`issue_role`], the certificate for `usages`.
pub(super) fn issue_role_for(
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
pub(super) fn replace_file(path: &Path, bytes: &[u8], secret: bool) -> std::io::Result<()> {
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

pub(super) fn write_file(path: &Path, bytes: &[u8], secret: bool) -> std::io::Result<()> {
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
