//! `zr cluster audit`: a router's audit log read back, whole or since a time, and bad uses
//! refused by name.

use crate::common::zr;
use zr_service::audit::{AuditLog, Entry};

fn entry(time: &str, who: &str, action: &str, outcome: &str) -> Entry {
    Entry {
        time: time.into(),
        server: "router".into(),
        who: who.into(),
        role: "operator".into(),
        action: action.into(),
        dataset: "imgs".into(),
        outcome: outcome.into(),
        detail: String::new(),
    }
}

#[test]
fn zr_cluster_audit_reads_the_log_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let log = AuditLog::open(&path).unwrap();
    log.record(&entry("2020-01-01T00:00:00Z", "old-job", "scrub", "ok"));
    let now = Entry::now();
    log.record(&entry(&now, "ops-1", "create-dataset", "ok"));
    log.record(&entry(&now, "team-a", "drop-dataset", "refused"));
    let file = path.to_str().unwrap();

    let (ok, out, err) = zr(&["cluster", "audit", "--file", file]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].contains("old-job (operator)  scrub imgs  ok"),
        "{out}"
    );
    assert!(
        lines[2].contains("team-a") && lines[2].ends_with("refused"),
        "{out}"
    );

    // Since an hour ago: the old entry is left out; as JSON, each line an entry.
    let (ok, out, err) = zr(&[
        "cluster", "audit", "--file", file, "--since", "1h", "--json",
    ]);
    assert!(ok, "{err}");
    let read: Vec<Entry> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        read.iter().map(|e| e.who.as_str()).collect::<Vec<_>>(),
        ["ops-1", "team-a"]
    );

    let (ok, _, err) = zr(&["cluster", "audit", "--file", file, "--since", "yesterday"]);
    assert!(!ok && err.contains("--since \"yesterday\""), "{err}");
    let missing = dir.path().join("none.log");
    let (ok, _, err) = zr(&["cluster", "audit", "--file", missing.to_str().unwrap()]);
    assert!(!ok && err.contains("none.log"), "{err}");
}
