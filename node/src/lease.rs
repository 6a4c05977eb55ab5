//! The cluster's write lease, kept by shard 0's node: a router holds it around every write
//! that changes the cluster (append, modify, delete, start-up repair), so writes through
//! several routers are serialized as one router's own writes are by its lock. A write spans
//! several shards (a swap-remove moves the last record across them), so no shard alone can
//! keep two of them apart.
//!
//! Beside the holder it keeps the *pending write*: an append or a global delete is recorded
//! before it starts and cleared when its router releases the lease with the write done. If
//! it stops halfway (a shard failed, the router died), the next holder learns it with the
//! lease and settles it — cuts off the part of an append that landed, finishes a delete —
//! so a write is never left in part.
//!
//! Each grant of the lease comes with a token larger than every earlier one. Before it
//! writes, a holder raises every node's [`Fence`] to its token, and each of its writes
//! carries the token: a write from a router whose lease ran out and passed on — a request
//! that arrives, or is handled, after the next holder fenced the node — is refused instead of
//! landing on top of the next holder's writes.
//!
//! The lease runs out by itself, so a router that dies holding it stops the others for no
//! longer than that. The holder is in memory: a restarted node starts with no holder. The
//! pending write is kept on disk beside the store ([`PENDING_FILE`]), so it survives a
//! restart of shard 0's node. So is each node's fence ([`FENCE_FILE`]): a restarted node
//! still refuses a late write of a router whose lease passed on. Tokens come from the clock
//! (microseconds since 1970) but never fall to or below one granted before, across restarts
//! too: the node keeps a ceiling on disk ([`TOKEN_FILE`]) that every token stays under, and
//! a restarted node starts above it — so a clock stepped backwards jams nothing.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use zr_proto::wire::PendingWrite;

use crate::error::{Error, IoContext, Result};
use crate::meta::{sync_dir, write_atomically};

/// File in a node's store directory holding its fence, as text: the highest token seen.
pub const FENCE_FILE: &str = "cluster-fence";
/// File in shard 0's store directory holding the ceiling under which it grants tokens.
pub const TOKEN_FILE: &str = "cluster-token-ceiling";
/// Tokens reserved at a time: the ceiling is written once per this many microseconds of
/// the clock (about 17 minutes), not once per grant.
const TOKEN_RESERVE: u64 = 1 << 30;

/// File in shard 0's store directory holding the pending write, as text:
/// `append START COUNT` or `delete INDEX LEN`.
pub const PENDING_FILE: &str = "cluster-pending-write";

/// Who holds the lease and until when, and the write left pending.
#[derive(Debug, Default)]
pub struct WriteLease {
    state: Mutex<State>,
    /// Where the pending write is kept (`None`: in memory only).
    dir: Option<PathBuf>,
}

/// Why the lease refused a request.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum LeaseError {
    /// The asker does not hold the lease.
    #[error("{0}")]
    NotHolder(String),
    /// The pending write could not be kept on disk; nothing changed.
    #[error("{0}")]
    Storage(String),
}

#[derive(Debug, Default)]
struct State {
    holder: Option<(u64, Instant)>,
    pending: Option<PendingWrite>,
    /// The last token granted.
    token: u64,
    /// Every token granted stays below this; it is on disk before a token reaches it.
    ceiling: u64,
}

/// What a granted lease tells its holder.
#[derive(Debug, PartialEq, Eq)]
pub struct Grant {
    /// A write to settle first (see the module documentation).
    pub pending: Option<PendingWrite>,
    /// Larger than any earlier grant's.
    pub token: u64,
}

/// What a node keeps for the routers besides its store: the write lease (used on shard 0's
/// node) and its fence.
#[derive(Debug, Default)]
pub struct Coordination {
    pub lease: WriteLease,
    pub fence: Fence,
    /// Which cluster and map this node's data belongs to.
    pub identity: crate::identity::Identity,
}

impl Coordination {
    /// For the node whose store is in `dir`: no lease holder, the fence down, and the
    /// pending write `dir` keeps, if any.
    pub fn open(dir: &Path) -> Result<Coordination> {
        Ok(Coordination {
            lease: WriteLease::open(dir)?,
            fence: Fence::open(dir)?,
            identity: crate::identity::Identity::open(dir)?,
        })
    }
}

/// Longest lease a router may ask for.
pub const LEASE_MAX: Duration = Duration::from_secs(3600);

impl WriteLease {
    /// A lease keeping its pending write in `dir`, starting with the one kept there.
    pub fn open(dir: &Path) -> Result<WriteLease> {
        let path = dir.join(PENDING_FILE);
        let pending = match std::fs::read_to_string(&path) {
            Ok(text) => Some(parse_pending(&text).ok_or_else(|| Error::Corrupt {
                path: path.clone(),
                reason: format!(
                    "not 'append START COUNT' or 'delete INDEX LEN': {:?}",
                    text.trim()
                ),
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).ctx("read", &path),
        };
        // Every token granted before a restart stayed under the ceiling kept then.
        let ceiling = read_number(&dir.join(TOKEN_FILE))?.unwrap_or(0);
        Ok(WriteLease {
            state: Mutex::new(State {
                pending,
                token: ceiling,
                ceiling,
                ..State::default()
            }),
            dir: Some(dir.to_path_buf()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the lease to `holder` until `now + lease` (renews it if `holder` has it), with a
    /// new token and the write left pending, if any. Refused, with the time left, while
    /// another holder's lease runs.
    pub fn acquire(&self, holder: u64, lease: Duration, now: Instant) -> Result<Grant, Duration> {
        let mut state = self.state();
        match state.holder {
            Some((other, until)) if other != holder && until > now => Err(until - now),
            _ => {
                let clock = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as u64);
                let token = clock.max(state.token + 1);
                if token >= state.ceiling {
                    let ceiling = token.saturating_add(TOKEN_RESERVE);
                    if let Some(dir) = &self.dir {
                        // Not granted unless kept: a restart must start above it.
                        if let Err(e) =
                            write_atomically(dir, TOKEN_FILE, format!("{ceiling}\n").as_bytes())
                        {
                            tracing::error!("cannot keep the token ceiling: {e}; no lease granted");
                            return Err(Duration::from_millis(100));
                        }
                    }
                    state.ceiling = ceiling;
                }
                state.holder = Some((holder, now + lease.min(LEASE_MAX)));
                state.token = token;
                Ok(Grant {
                    pending: state.pending,
                    token: state.token,
                })
            }
        }
    }

    /// Takes the lease back from `holder`; `settled` (its write is done) clears the pending
    /// write, on disk first. Refused if another router holds the lease now (`holder`'s ran
    /// out and was taken), or nobody does.
    pub fn release(&self, holder: u64, settled: bool) -> std::result::Result<(), LeaseError> {
        let mut state = self.state();
        match state.holder {
            Some((h, _)) if h == holder => {}
            Some(_) => {
                return Err(LeaseError::NotHolder(
                    "the write lease ran out and another router holds it now".into(),
                ))
            }
            None => return Err(LeaseError::NotHolder("the write lease is not held".into())),
        }
        if settled {
            self.keep(None)?;
            state.pending = None;
        }
        state.holder = None;
        Ok(())
    }

    /// Records `write` as the pending write (in place of any other; `None` clears it), for
    /// `holder` only while its lease runs; on disk first, if the lease keeps it there.
    pub fn intend(
        &self,
        holder: u64,
        write: Option<PendingWrite>,
        now: Instant,
    ) -> std::result::Result<(), LeaseError> {
        let mut state = self.state();
        let refused = match state.holder {
            Some((h, until)) if h == holder && until > now => None,
            Some((h, _)) if h == holder => Some("the write lease ran out"),
            Some(_) => Some("another router holds the write lease"),
            None => Some("the write lease is not held"),
        };
        if let Some(why) = refused {
            return Err(LeaseError::NotHolder(why.into()));
        }
        self.keep(write)?;
        state.pending = write;
        Ok(())
    }

    /// Writes (or, for `None`, removes) the pending-write file durably, if there is one.
    fn keep(&self, pending: Option<PendingWrite>) -> std::result::Result<(), LeaseError> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let kept = match pending {
            Some(write) => write_atomically(dir, PENDING_FILE, format_pending(write).as_bytes()),
            None => {
                let path = dir.join(PENDING_FILE);
                match std::fs::remove_file(&path) {
                    Ok(()) => sync_dir(dir),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(e).ctx("remove", &path),
                }
            }
        };
        kept.map_err(|e| LeaseError::Storage(e.to_string()))
    }
}

fn format_pending(write: PendingWrite) -> String {
    match write {
        PendingWrite::Append { start, count } => format!("append {start} {count}\n"),
        PendingWrite::Delete { index, len } => format!("delete {index} {len}\n"),
    }
}

/// What [`format_pending`] wrote; `None` if it is not that.
fn parse_pending(text: &str) -> Option<PendingWrite> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let [kind, a, b] = words[..] else {
        return None;
    };
    let (a, b) = (a.parse().ok()?, b.parse().ok()?);
    match kind {
        "append" => Some(PendingWrite::Append { start: a, count: b }),
        "delete" if a < b => Some(PendingWrite::Delete { index: a, len: b }),
        _ => None,
    }
}

/// A number kept as text in `path`, if the file exists.
fn read_number(path: &Path) -> Result<Option<u64>> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| Error::Corrupt {
            path: path.to_path_buf(),
            reason: format!("not a number: {:?}", text.trim()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).ctx("read", path),
    }
}

/// A node's fence: the largest lease token it has been fenced with. Writes are checked and
/// made under its lock, so a write admitted before the fence rises is finished before the
/// fence's holder reads the node's length. Kept in [`FENCE_FILE`] (`Default`: in memory),
/// overwritten in place with a fixed-width number before it rises, without an fsync (it
/// rises before every write): it survives a restart of the node's process, and a power loss
/// leaves the old or the new number, never a torn one.
#[derive(Debug, Default)]
pub struct Fence {
    highest: Mutex<u64>,
    file: Option<(std::fs::File, PathBuf)>,
}

impl Fence {
    /// The fence kept in `dir` (down if none is kept).
    pub fn open(dir: &Path) -> Result<Fence> {
        let path = dir.join(FENCE_FILE);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .ctx("open", &path)?;
        let text = std::fs::read_to_string(&path).ctx("read", &path)?;
        let highest = match text.trim() {
            "" => 0,
            number => number.parse().map_err(|_| Error::Corrupt {
                path: path.clone(),
                reason: format!("not a number: {number:?}"),
            })?,
        };
        Ok(Fence {
            highest: Mutex::new(highest),
            file: Some((file, path)),
        })
    }

    /// Raises the fence to `token` (never lowers it; kept first), then runs `read` once any
    /// write admitted before has finished. Refused if the fence cannot be kept.
    pub fn raise<T>(&self, token: u64, read: impl FnOnce() -> T) -> Result<T, String> {
        use std::os::unix::fs::FileExt;
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if token > *highest {
            if let Some((file, path)) = &self.file {
                file.write_all_at(format!("{token:020}\n").as_bytes(), 0)
                    .map_err(|e| format!("cannot keep the fence in {}: {e}", path.display()))?;
            }
            *highest = token;
        }
        Ok(read())
    }

    /// Runs `write` if `token` is not below the fence; refused, saying why, otherwise.
    pub fn admit<T>(&self, token: u64, write: impl FnOnce() -> T) -> Result<T, String> {
        let highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if token < *highest {
            return Err(format!(
                "a write from a router whose write lease has since passed to another (its token {token} is below the node's fence {})",
                *highest
            ));
        }
        let done = write();
        drop(highest);
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);
    const D41: PendingWrite = PendingWrite::Delete { index: 3, len: 41 };
    const A7: PendingWrite = PendingWrite::Append {
        start: 40,
        count: 7,
    };

    #[test]
    fn one_holder_at_a_time() {
        let lease = WriteLease::default();
        let t0 = Instant::now();
        assert_eq!(lease.acquire(1, LEASE, t0).map(|g| g.pending), Ok(None));
        // Held: others wait, the holder renews.
        let later = t0 + Duration::from_secs(4);
        assert_eq!(
            lease.acquire(2, LEASE, later).map(|g| g.pending),
            Err(Duration::from_secs(6))
        );
        lease.acquire(1, LEASE, later).unwrap();
        assert!(lease.release(2, true).is_err());
        lease.release(1, false).unwrap();
        assert!(lease.release(1, false).is_err());
        lease.acquire(2, LEASE, later).unwrap();
    }

    #[test]
    fn a_lease_runs_out_by_itself() {
        let lease = WriteLease::default();
        let t0 = Instant::now();
        lease.acquire(1, LEASE, t0).unwrap();
        // Holder 1 stops midway: holder 2 waits out its lease, then takes it.
        assert!(lease
            .acquire(2, LEASE, t0 + LEASE - Duration::from_millis(1))
            .is_err());
        lease.acquire(2, LEASE, t0 + LEASE).unwrap();
        // The late holder's release is refused and changes nothing.
        assert!(lease.release(1, false).is_err());
        assert!(lease.acquire(3, LEASE, t0 + LEASE).is_err());
        lease.release(2, false).unwrap();
        lease.acquire(3, LEASE, t0 + LEASE).unwrap();
    }

    #[test]
    fn a_pending_write_outlives_its_holder_until_settled() {
        let lease = WriteLease::default();
        let t0 = Instant::now();
        // Only the holder, while its lease runs, may record a write.
        assert!(lease.intend(1, Some(D41), t0).is_err());
        lease.acquire(1, LEASE, t0).unwrap();
        assert!(lease.intend(2, Some(D41), t0).is_err());
        assert!(lease.intend(1, Some(D41), t0 + LEASE).is_err());
        lease.intend(1, Some(D41), t0).unwrap();
        // Holder 1 gives the lease back unsettled (or dies): the next holders learn the
        // write until one of them releases the lease settled.
        lease.release(1, false).unwrap();
        assert_eq!(
            lease.acquire(2, LEASE, t0).map(|g| g.pending),
            Ok(Some(D41))
        );
        lease.release(2, false).unwrap();
        assert_eq!(
            lease.acquire(3, LEASE, t0).map(|g| g.pending),
            Ok(Some(D41))
        );
        lease.intend(3, Some(A7), t0).unwrap();
        lease.release(3, false).unwrap();
        assert_eq!(lease.acquire(1, LEASE, t0).map(|g| g.pending), Ok(Some(A7)));
        lease.release(1, true).unwrap();
        assert_eq!(lease.acquire(2, LEASE, t0).map(|g| g.pending), Ok(None));
        // A holder that settled a write left pending clears it before its own.
        lease.intend(2, Some(D41), t0).unwrap();
        lease.intend(2, None, t0).unwrap();
        lease.release(2, false).unwrap();
        assert_eq!(lease.acquire(3, LEASE, t0).map(|g| g.pending), Ok(None));
    }

    #[test]
    fn tokens_grow_and_fences_hold_back_older_ones() {
        let lease = WriteLease::default();
        let t0 = Instant::now();
        let first = lease.acquire(1, LEASE, t0).unwrap().token;
        let renewed = lease.acquire(1, LEASE, t0).unwrap().token;
        lease.release(1, false).unwrap();
        let next = lease.acquire(2, LEASE, t0).unwrap().token;
        assert!(
            first < renewed && renewed < next,
            "{first} {renewed} {next}"
        );

        let fence = Fence::default();
        assert_eq!(fence.admit(first, || 1), Ok(1));
        assert_eq!(fence.raise(next, || 2), Ok(2));
        let refused = fence.admit(renewed, || 3).unwrap_err();
        assert!(refused.contains("passed to another"), "{refused}");
        assert_eq!(fence.admit(next, || 4), Ok(4));
        // A late, lower fence does not lower it.
        fence.raise(first, || ()).unwrap();
        assert!(fence.admit(renewed, || 5).is_err());
    }

    /// A restarted node keeps its fence (a late write of an old holder is still refused)
    /// and grants tokens above every one granted before, whatever the clock says.
    #[test]
    fn fences_and_tokens_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let lease = WriteLease::open(dir.path()).unwrap();
        let old = lease.acquire(1, LEASE, t0).unwrap().token;
        let new = lease.acquire(2, LEASE, t0 + LEASE).unwrap().token;
        let fence = Fence::open(dir.path()).unwrap();
        fence.raise(new, || ()).unwrap();
        drop((lease, fence));

        let fence = Fence::open(dir.path()).unwrap();
        assert!(
            fence.admit(old, || ()).is_err(),
            "the old holder's late write"
        );
        assert!(fence.admit(new, || ()).is_ok());
        // A ceiling far past the clock (as after the clock stepped back): still above it.
        std::fs::write(dir.path().join(TOKEN_FILE), format!("{}\n", u64::MAX / 2)).unwrap();
        let lease = WriteLease::open(dir.path()).unwrap();
        let after = lease.acquire(3, LEASE, t0).unwrap().token;
        assert!(after > u64::MAX / 2 && after > new, "{after}");
    }

    #[test]
    fn a_kept_pending_write_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        for write in [D41, A7] {
            let lease = WriteLease::open(dir.path()).unwrap();
            lease.acquire(1, LEASE, t0).unwrap();
            lease.intend(1, Some(write), t0).unwrap();
            drop(lease);
            // The node restarts: no holder, the same pending write.
            let lease = WriteLease::open(dir.path()).unwrap();
            assert_eq!(lease.acquire(2, LEASE, t0).unwrap().pending, Some(write));
            lease.release(2, true).unwrap();
            assert!(!dir.path().join(PENDING_FILE).exists());
            let reopened = WriteLease::open(dir.path()).unwrap();
            assert_eq!(reopened.acquire(3, LEASE, t0).unwrap().pending, None);
        }
        // A damaged file is named, not read as none.
        std::fs::write(dir.path().join(PENDING_FILE), "delete 9 forty").unwrap();
        let err = WriteLease::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains(PENDING_FILE) && err.contains("forty"), "{err}");
    }
}
