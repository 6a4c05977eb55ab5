//! The audit log: who did what to the cluster, and when. One JSON line per admin action
//! (dataset created, dropped or grown by a field, scrub, node replaced, shards moved), per
//! commit, and per refused request — the last at most once a minute per identity and
//! dataset, so that a client hammering a door it may not open cannot fill the disk. The file
//! is the operator's choice (`[router] audit_log` in nodes.toml); it is appended to, and
//! rotated by size into `PATH.1` … `PATH.K` (oldest last). `zr cluster audit` reads it back.
//!
//! Lines are written as the actions end, in the order they ended, and not synced one by one:
//! a machine that loses power may lose the last lines, never reorder them.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Bytes a log file grows to before it is rotated, by default.
pub const MAX_BYTES_DEFAULT: u64 = 64 << 20;
/// Rotated files kept beside the live one, by default.
pub const KEEP_DEFAULT: u32 = 4;
/// How often one identity's refused requests are logged, at most.
pub const REFUSALS_EVERY: Duration = Duration::from_secs(60);

/// One line of the audit log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// When the action ended: RFC 3339, UTC.
    pub time: String,
    /// The server that logged it (`router`).
    pub server: String,
    /// Who asked: the certificate's name (`zr cluster issue --name`), or its role.
    pub who: String,
    /// The certificate's role (`none` without one).
    pub role: String,
    /// What was asked (`create-dataset`, `commit`, …).
    pub action: String,
    /// Of which dataset (`default` for the cluster's unnamed one).
    pub dataset: String,
    /// `ok`, `error` (carried out and failed) or `refused` (not allowed, or not understood).
    pub outcome: String,
    /// The error or refusal, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Entry {
    /// An entry made now by server `server` (`router`, `node`) of `peer`'s `action` on
    /// `dataset`.
    pub fn of(
        server: &str,
        peer: &zr_net::Peer,
        action: &str,
        dataset: &str,
        outcome: &str,
        detail: String,
    ) -> Entry {
        Entry {
            time: Entry::now(),
            server: server.into(),
            who: peer.who(),
            role: peer.role.map_or("none".into(), |r| r.name().to_string()),
            action: action.into(),
            dataset: dataset.into(),
            outcome: outcome.into(),
            detail,
        }
    }

    /// The time of an entry made now.
    pub fn now() -> String {
        OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .unwrap_or_else(|_| "unknown".into())
    }
}

/// What the audit log could not do.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot write the audit log {path}: {source}")]
    Write { path: String, source: io::Error },
    #[error("cannot read the audit log {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("audit log {path}, line {line}: not an audit entry ({reason})")]
    Malformed {
        path: String,
        line: usize,
        reason: String,
    },
}

/// An audit log open for appending.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: Mutex<(File, u64)>,
    /// When each identity's last refusal on each dataset was logged.
    refusals: Mutex<HashMap<(u64, String), Instant>>,
}

impl AuditLog {
    /// Opens `path` for appending (made if absent), rotated at [`MAX_BYTES_DEFAULT`] into
    /// [`KEEP_DEFAULT`] older files. A path that cannot be written is an error naming it: a
    /// server asked to keep an audit log does not start without one.
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        AuditLog::open_with(path, MAX_BYTES_DEFAULT, KEEP_DEFAULT)
    }

    /// [`AuditLog::open`], rotated at `max_bytes` into `keep` older files (at least 1).
    pub fn open_with(path: &Path, max_bytes: u64, keep: u32) -> Result<AuditLog, AuditError> {
        let file = append_to(path)?;
        let len = file
            .metadata()
            .map_err(|source| write_error(path, source))?
            .len();
        Ok(AuditLog {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(1),
            keep: keep.max(1),
            file: Mutex::new((file, len)),
            refusals: Mutex::new(HashMap::new()),
        })
    }

    /// Where it is written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `entry` as one line, rotating first if the file would outgrow its size. A
    /// failure to write is logged and counted (`zr_audit_write_errors_total`), never passed
    /// to the request it records: the action happened either way.
    pub fn record(&self, entry: &Entry) {
        if let Err(e) = self.write(entry) {
            metrics::counter!("zr_audit_write_errors_total").increment(1);
            tracing::error!("{e}; lost the audit entry {entry:?}");
        }
    }

    /// [`Self::record`]s `entry` of the peer of `identity`, but a refusal only if one is
    /// due ([`Self::refusal_due`]): a peer refused over and over leaves a line a minute, not
    /// one a request.
    pub fn note(&self, identity: u64, entry: &Entry) {
        let due = || self.refusal_due(identity, &entry.dataset, Instant::now());
        if entry.outcome != "refused" || due() {
            self.record(entry);
        }
    }

    fn write(&self, entry: &Entry) -> Result<(), AuditError> {
        let mut line = serde_json::to_vec(entry)
            .map_err(|e| write_error(&self.path, io::Error::new(io::ErrorKind::InvalidData, e)))?;
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if file.1 > 0 && file.1 + line.len() as u64 > self.max_bytes {
            self.rotate()?;
            *file = (append_to(&self.path)?, 0);
        }
        file.0
            .write_all(&line)
            .map_err(|source| write_error(&self.path, source))?;
        file.1 += line.len() as u64;
        Ok(())
    }

    /// `PATH.K-1` → `PATH.K`, …, `PATH` → `PATH.1` (the oldest dropped).
    fn rotate(&self) -> Result<(), AuditError> {
        for k in (1..self.keep).rev() {
            let from = rotated(&self.path, k);
            if from.exists() {
                std::fs::rename(&from, rotated(&self.path, k + 1))
                    .map_err(|source| write_error(&from, source))?;
            }
        }
        std::fs::rename(&self.path, rotated(&self.path, 1))
            .map_err(|source| write_error(&self.path, source))
    }

    /// Whether a refusal of `identity`'s on `dataset` at `now` is to be logged: the first,
    /// and then one per [`REFUSALS_EVERY`] (a refusal on another dataset is another fact,
    /// logged on its own).
    pub fn refusal_due(&self, identity: u64, dataset: &str, now: Instant) -> bool {
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        // Forgets identities quiet for a while, so the map stays as small as the refusers.
        if refusals.len() > 4096 {
            refusals.retain(|_, at| now.saturating_duration_since(*at) < REFUSALS_EVERY);
        }
        let key = (identity, dataset.to_string());
        match refusals.get(&key) {
            Some(at) if now.saturating_duration_since(*at) < REFUSALS_EVERY => false,
            _ => {
                refusals.insert(key, now);
                true
            }
        }
    }
}

fn append_to(path: &Path) -> Result<File, AuditError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| write_error(path, source))
}

fn write_error(path: &Path, source: io::Error) -> AuditError {
    AuditError::Write {
        path: path.display().to_string(),
        source,
    }
}

fn rotated(path: &Path, k: u32) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{k}"));
    PathBuf::from(name)
}

/// The entries of the audit log at `path`, its rotated files first (oldest first), those
/// at or after `since` only if given.
pub fn read(path: &Path, since: Option<OffsetDateTime>) -> Result<Vec<Entry>, AuditError> {
    let mut files: Vec<PathBuf> = (1..)
        .map(|k| rotated(path, k))
        .take_while(|p| p.exists())
        .collect();
    files.reverse();
    files.push(path.to_path_buf());
    let mut entries = Vec::new();
    for file in files {
        let read_error = |source| AuditError::Read {
            path: file.display().to_string(),
            source,
        };
        let reader = io::BufReader::new(File::open(&file).map_err(read_error)?);
        for (k, line) in reader.lines().enumerate() {
            let line = line.map_err(read_error)?;
            if line.trim().is_empty() {
                continue;
            }
            let malformed = |reason: String| AuditError::Malformed {
                path: file.display().to_string(),
                line: k + 1,
                reason,
            };
            let entry: Entry = serde_json::from_str(&line).map_err(|e| malformed(e.to_string()))?;
            if let Some(since) = since {
                let at = OffsetDateTime::parse(&entry.time, &Rfc3339)
                    .map_err(|e| malformed(format!("its time {:?}: {e}", entry.time)))?;
                if at < since {
                    continue;
                }
            }
            entries.push(entry);
        }
    }
    Ok(entries)
}

/// [`parse_since`] back from the present.
pub fn since(text: &str) -> Result<OffsetDateTime, String> {
    parse_since(text, OffsetDateTime::now_utc())
}

/// A `--since`: an RFC 3339 time (`2026-11-27T10:00:00Z`), or a span back from `now` —
/// a number and a unit, `s`, `m`, `h` or `d` (`90m`, `2d`).
pub fn parse_since(text: &str, now: OffsetDateTime) -> Result<OffsetDateTime, String> {
    if let Ok(at) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(at);
    }
    let bad = || {
        format!(
            "--since {text:?} is neither an RFC 3339 time (2026-11-27T10:00:00Z) nor a span back from now (90m, 2d)"
        )
    };
    let unit = text.chars().last().ok_or_else(bad)?;
    let count: u64 = text[..text.len() - unit.len_utf8()]
        .parse()
        .map_err(|_| bad())?;
    let seconds = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(bad()),
    };
    let span = count
        .checked_mul(seconds)
        .and_then(|s| i64::try_from(s).ok())
        .ok_or_else(bad)?;
    now.checked_sub(time::Duration::seconds(span))
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(action: &str, time: &str) -> Entry {
        Entry {
            time: time.into(),
            server: "router".into(),
            who: "team-a".into(),
            role: "operator".into(),
            action: action.into(),
            dataset: "imgs".into(),
            outcome: "ok".into(),
            detail: String::new(),
        }
    }

    #[test]
    fn entries_come_back_in_order_across_rotations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        // Room for about two lines a file, three files: the oldest lines are dropped.
        let log = AuditLog::open_with(&path, 300, 2).unwrap();
        let times: Vec<String> = (0..9).map(|k| format!("2026-11-27T10:00:0{k}Z")).collect();
        for (k, time) in times.iter().enumerate() {
            log.record(&entry(&format!("action-{k}"), time));
        }
        let read_back = read(&path, None).unwrap();
        let actions: Vec<&str> = read_back.iter().map(|e| e.action.as_str()).collect();
        assert!(
            actions.len() < 9,
            "rotation dropped the oldest: {actions:?}"
        );
        let expected: Vec<String> = (9 - actions.len()..9)
            .map(|k| format!("action-{k}"))
            .collect();
        assert_eq!(actions, expected);
        assert!(rotated(&path, 2).exists() && !rotated(&path, 3).exists());
        // Since a time: the lines at or after it.
        let since = OffsetDateTime::parse("2026-11-27T10:00:08Z", &Rfc3339).unwrap();
        let last = read(&path, Some(since)).unwrap();
        assert_eq!(last, vec![entry("action-8", &times[8])]);
        // Reopened, it appends.
        drop(log);
        let log = AuditLog::open_with(&path, 300, 2).unwrap();
        log.record(&entry("after", &times[8]));
        assert_eq!(read(&path, None).unwrap().last().unwrap().action, "after");
    }

    #[test]
    fn refusals_are_logged_once_a_minute_per_identity_and_dataset() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(&dir.path().join("audit.log")).unwrap();
        let t = Instant::now();
        assert!(log.refusal_due(1, "text", t));
        assert!(!log.refusal_due(1, "text", t + Duration::from_secs(59)));
        assert!(
            log.refusal_due(2, "text", t + Duration::from_secs(1)),
            "another identity"
        );
        assert!(
            log.refusal_due(1, "imgs", t + Duration::from_secs(2)),
            "another dataset"
        );
        assert!(log.refusal_due(1, "text", t + REFUSALS_EVERY));
    }

    #[test]
    fn a_noted_refusal_is_written_once_a_minute_and_the_rest_always() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(&path).unwrap();
        let refused = Entry {
            outcome: "refused".into(),
            ..entry("read", "2026-11-27T10:00:00Z")
        };
        for _ in 0..3 {
            log.note(1, &refused);
            log.note(1, &entry("commit", "2026-11-27T10:00:01Z"));
        }
        log.note(2, &refused);
        let actions: Vec<String> = read(&path, None)
            .unwrap()
            .into_iter()
            .map(|e| format!("{} {}", e.action, e.outcome))
            .collect();
        assert_eq!(
            actions,
            [
                "read refused",
                "commit ok",
                "commit ok",
                "commit ok",
                "read refused"
            ]
        );
    }

    #[test]
    fn bad_paths_and_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir").join("audit.log");
        let e = AuditLog::open(&missing).unwrap_err().to_string();
        assert!(e.contains("no-such-dir"), "{e}");
        let path = dir.path().join("audit.log");
        std::fs::write(&path, "{\"time\": 3}\n").unwrap();
        let e = read(&path, None).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("audit.log"), "{e}");
    }

    #[test]
    fn since_takes_a_time_or_a_span() {
        let now = OffsetDateTime::parse("2026-11-27T12:00:00Z", &Rfc3339).unwrap();
        let at = |s| parse_since(s, now).unwrap().format(&Rfc3339).unwrap();
        assert_eq!(at("90m"), "2026-11-27T10:30:00Z");
        assert_eq!(at("2d"), "2026-11-25T12:00:00Z");
        assert_eq!(at("2026-11-27T10:00:00Z"), "2026-11-27T10:00:00Z");
        for bad in ["", "m", "10x", "-5m", "yesterday"] {
            assert!(parse_since(bad, now).is_err(), "{bad}");
        }
    }
}
