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
    for role in Role::ISSUED {
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
    for role in Role::ISSUED {
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

    let old_key = std::fs::read(dir.path().join("router/router.key")).unwrap();
    renew_certs(dir.path(), 365).unwrap();
    for role in Role::ISSUED {
        Identity::load(dir.path(), role).unwrap();
    }
    assert_ne!(
        std::fs::read(dir.path().join("router/router.key")).unwrap(),
        old_key
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("router/router.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    std::fs::remove_file(dir.path().join(CA_DIR).join(CA_KEY_FILE)).unwrap();
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
    for role in Role::ISSUED {
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
    std::fs::copy(
        two.path().join("node/node.pem"),
        one.path().join("node/node.pem"),
    )
    .unwrap();
    let e = Identity::load(one.path(), Role::Node)
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not verify against ca.pem"), "{e}");
}

#[test]
fn init_then_load_every_role_and_refuse_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    init_certs(dir.path(), CERT_VALID_DAYS).unwrap();
    for role in Role::ISSUED {
        let identity = Identity::load(dir.path(), role).unwrap();
        assert_eq!(identity.role, role);
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("reader/reader.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let again = init_certs(dir.path(), CERT_VALID_DAYS)
        .unwrap_err()
        .to_string();
    assert!(again.contains("already exists"), "{again}");
    std::fs::remove_file(dir.path().join("router/router.key")).unwrap();
    let missing = Identity::load(dir.path(), Role::Router)
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("router.key") && missing.contains("cluster-init"),
        "{missing}"
    );
}

mod role_tests {
    use super::*;

    /// `zr cluster-init`'s layout: a directory per role, none but ca/ holding the CA's key,
    /// none but node/ and router/ a server key; each loads from the whole directory and from
    /// its own; a certificate renamed as another role's is refused at load, naming both.
    #[test]
    fn each_role_has_a_directory_of_its_own_and_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        init_certs(dir.path(), CERT_VALID_DAYS).unwrap();
        for role in Role::ISSUED {
            let home = dir.path().join(role.name());
            let mut files: Vec<String> = std::fs::read_dir(&home)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            files.sort();
            let mut want = vec![
                CA_FILE.to_string(),
                format!("{}.key", role.name()),
                format!("{}.pem", role.name()),
            ];
            want.sort();
            assert_eq!(files, want, "{role}");
            assert_eq!(Identity::load(dir.path(), role).unwrap().role, role);
            assert_eq!(Identity::load(&home, role).unwrap().role, role);
        }
        assert!(dir.path().join(CA_DIR).join(CA_KEY_FILE).exists());
        assert!(!holds_role(&dir.path().join("reader"), Role::Writer));
        assert!(holds_role(dir.path(), Role::Operator));

        // A node given the router's certificate.
        let node = dir.path().join("node");
        for ext in ["pem", "key"] {
            std::fs::copy(
                dir.path().join(format!("router/router.{ext}")),
                node.join(format!("node.{ext}")),
            )
            .unwrap();
        }
        let e = Identity::load(&node, Role::Node).unwrap_err().to_string();
        assert!(
            e.contains("node.pem") && e.contains("is a router certificate, not a node certificate"),
            "{e}"
        );
    }

    /// `zr cluster issue`: a named certificate of a client role in a directory of its own,
    /// loadable, renewed with the rest; bad names, server roles and a second issue of one
    /// name are refused.
    #[test]
    fn named_certificates_are_issued_and_renewed() {
        let dir = tempfile::tempdir().unwrap();
        init_certs(dir.path(), CERT_VALID_DAYS).unwrap();
        let home = issue_cert(dir.path(), Role::Reader, "job-7", 30).unwrap();
        assert_eq!(home, dir.path().join("reader-job-7"));
        Identity::load(&home, Role::Reader).unwrap();
        let e = issue_cert(dir.path(), Role::Reader, "job-7", 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists"), "{e}");
        for bad in ["", "Job", "-x", &"x".repeat(65), "a/b"] {
            assert!(
                issue_cert(dir.path(), Role::Writer, bad, 30).is_err(),
                "{bad:?}"
            );
        }
        let e = issue_cert(dir.path(), Role::Node, "n1", 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster-init"), "{e}");
        let before = std::fs::read(home.join("reader.pem")).unwrap();
        renew_certs(dir.path(), 60).unwrap();
        assert_ne!(std::fs::read(home.join("reader.pem")).unwrap(), before);
        Identity::load(&home, Role::Reader).unwrap();
        assert!(
            issue_cert(&home, Role::Reader, "x", 30).is_err(),
            "no CA there"
        );
        // Serial numbers: one per certificate, read back as revocation by serial names them.
        let serial = |home: &Path, role: Role| {
            serial_of(&std::fs::read(home.join(format!("{}.pem", role.name()))).unwrap()).unwrap()
        };
        let other = issue_cert(dir.path(), Role::Writer, "job-8", 30).unwrap();
        let (first, second) = (serial(&home, Role::Reader), serial(&other, Role::Writer));
        assert_ne!(first, second);
        assert_eq!(normalized_serial(&first).unwrap(), first);
        let colons = first
            .as_bytes()
            .chunks(2)
            .map(|pair| std::str::from_utf8(pair).unwrap().to_ascii_uppercase())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(
            normalized_serial(&colons).unwrap(),
            first,
            "as openssl prints it"
        );
        assert_eq!(normalized_serial("serial=00A").unwrap(), "0a");
        for bad in ["", "xyz", &"f".repeat(43)] {
            assert!(normalized_serial(bad).is_err(), "{bad:?}");
        }
    }

    /// A flat certificate directory of a cluster made before roles loads as it did, its
    /// `client` certificate a client role, and renews in place; its CA issues the new roles.
    #[test]
    fn an_older_flat_directory_still_loads_and_renews() {
        let dir = tempfile::tempdir().unwrap();
        init_certs(dir.path(), CERT_VALID_DAYS).unwrap();
        let ca_dir = dir.path().join(CA_DIR);
        let ca = load_ca(dir.path()).unwrap();
        let flat = tempfile::tempdir().unwrap();
        std::fs::write(flat.path().join(CA_FILE), &ca.pem).unwrap();
        std::fs::copy(ca_dir.join(CA_KEY_FILE), flat.path().join(CA_KEY_FILE)).unwrap();
        for role in [Role::Node, Role::Router, Role::Client] {
            for (path, text, _) in issue_role(flat.path(), role, None, &ca, validity(30)).unwrap() {
                std::fs::write(path, text).unwrap();
            }
            assert_eq!(Identity::load(flat.path(), role).unwrap().role, role);
        }
        assert_eq!(Role::Client.access(), Some(Access::Write));
        let before = std::fs::read(flat.path().join("client.pem")).unwrap();
        renew_certs(flat.path(), 60).unwrap();
        assert_ne!(
            std::fs::read(flat.path().join("client.pem")).unwrap(),
            before
        );
        Identity::load(flat.path(), Role::Client).unwrap();
        // Its own CA issues it the new roles: an operator certificate for admin commands.
        let operator = issue_cert(flat.path(), Role::Operator, "admin", 30).unwrap();
        assert_eq!(operator, flat.path().join("operator-admin"));
        Identity::load(&operator, Role::Operator).unwrap();
    }
}
