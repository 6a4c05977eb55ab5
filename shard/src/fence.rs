//! What a node keeps for the routers besides its store: its identity (which cluster and map
//! its data belongs to) and its fence.
//!
//! The cluster's writer lease lives in the metadata store (`zr_meta::writer`); each grant of
//! it carries a token larger than every earlier one (the store's revision of the grant).
//! Before it writes, a holder raises every node's [`Fence`] to its token, and each of its
//! writes carries the token: a write from a router whose lease ran out and passed on — a
//! request that arrives, or is handled, after the next holder fenced the node — is refused
//! instead of landing on top of the next holder's writes. The fence is kept in the node's
//! directory ([`FENCE_FILE`]), so a restarted node still refuses such a late write.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use zr_node::disk::Disk;
use zr_node::{Error, IoContext, Result};

/// File in a node's store directory holding its fence, as text: the highest token seen.
pub const FENCE_FILE: &str = "writer-fence";

/// Files of an earlier layout, in which shard 0's node kept the writer lease with tokens from
/// its clock: removed when a node opens its directory (their tokens are of another kind, and
/// a fence from them would refuse every write).
const RETIRED_FILES: [&str; 3] = [
    "cluster-fence",
    "cluster-token-ceiling",
    "cluster-pending-write",
];

/// A node's identity and fence.
#[derive(Debug, Default)]
pub struct Coordination {
    pub fence: Fence,
    /// Which cluster and map this node's data belongs to.
    pub identity: crate::identity::Identity,
    /// Drawn when the node opened its store: a restarted node has another (see
    /// `Reply::Info`).
    pub incarnation: u64,
}

impl Coordination {
    /// For the node whose store is in `dir`: the fence and identity kept there, the fence's
    /// changes going through `disk` (the store's).
    pub fn open(disk: &Disk, dir: &Path) -> Result<Coordination> {
        for name in RETIRED_FILES {
            let path = dir.join(name);
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!("removed {} (an earlier layout's)", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).ctx("remove", &path),
            }
        }
        let incarnation = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            (std::process::id(), std::time::SystemTime::now()),
        );
        Coordination::open_as(disk, dir, incarnation)
    }

    /// The fence and identity kept in `dir`, for a node of incarnation `incarnation` (a
    /// store it serves anew, or another dataset of the same node).
    pub fn open_as(disk: &Disk, dir: &Path, incarnation: u64) -> Result<Coordination> {
        Ok(Coordination {
            fence: Fence::open(disk, dir)?,
            identity: crate::identity::Identity::open(dir)?,
            incarnation,
        })
    }
}

/// A node's fence: the largest lease token it has been fenced with. Writes are checked and
/// made under its lock, so a write admitted before the fence rises is finished before the
/// fence's holder reads the node's length. Kept in [`FENCE_FILE`] (`Default`: in memory):
/// each rise writes the new number to a file of its own, syncs it, renames it over the old
/// one and syncs the directory, all through its [`Disk`], before the rise returns — so
/// no write under the new token is acknowledged before the fence is durable, and no power
/// loss brings back an older fence (which would admit a late write of an older holder).
#[derive(Debug, Default)]
pub struct Fence {
    highest: Mutex<u64>,
    path: Option<PathBuf>,
    disk: Disk,
}

impl Fence {
    /// The fence kept in `dir` (down if none is kept), its rises written through `disk`.
    pub fn open(disk: &Disk, dir: &Path) -> Result<Fence> {
        let path = dir.join(FENCE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).ctx("read", &path),
        };
        let highest = match text.trim() {
            "" => 0,
            number => number.parse().map_err(|_| Error::Corrupt {
                path: path.clone(),
                reason: format!("not a number: {number:?}"),
            })?,
        };
        Ok(Fence {
            highest: Mutex::new(highest),
            path: Some(path),
            disk: disk.clone(),
        })
    }

    /// Raises the fence to `token` (never lowers it; durable first), then runs `read` once
    /// any write admitted before has finished. Refused if the fence cannot be kept.
    pub fn raise<T>(&self, token: u64, read: impl FnOnce() -> T) -> Result<T, FenceError> {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if token > *highest {
            if let Some(path) = &self.path {
                keep(&self.disk, path, token).map_err(|source| FenceError::Storage {
                    path: path.clone(),
                    source,
                })?;
            }
            *highest = token;
        }
        Ok(read())
    }

    /// Keeps this fence in the directory `dir` too (a dataset about to take this one's
    /// place), durably.
    pub fn copy_to(&self, dir: &Path) -> Result<()> {
        let highest = *self.highest.lock().unwrap_or_else(|e| e.into_inner());
        let path = dir.join(FENCE_FILE);
        keep(&self.disk, &path, highest).ctx("keep the fence in", &path)
    }

    /// Runs `write` if `token` is not below the fence; refused, saying why, otherwise.
    pub fn admit<T>(&self, token: u64, write: impl FnOnce() -> T) -> Result<T, FenceError> {
        let highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if token < *highest {
            return Err(FenceError::Below {
                token,
                fence: *highest,
            });
        }
        let done = write();
        drop(highest);
        Ok(done)
    }
}

/// Why the fence refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A write's lease token is below the fence: its router's lease has passed on.
    #[error("a write from a router whose write lease has since passed to another (its token {token} is below the node's fence {fence})")]
    Below { token: u64, fence: u64 },
    /// A raised fence could not be kept durably.
    #[error("cannot keep the fence in {}: {source}", path.display())]
    Storage {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes `token` to `path` durably: a new file, synced, renamed over the old one, its
/// directory synced. A reader finds the old number or the new one, never a part, and once
/// this returns, never the old one again.
fn keep(disk: &Disk, path: &Path, token: u64) -> std::io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".new");
    let temporary = PathBuf::from(temporary);
    let file = disk.create(&temporary)?;
    disk.write_at(&file, &temporary, format!("{token:020}\n").as_bytes(), 0)?;
    disk.sync(&file, &temporary)?;
    drop(file);
    disk.rename(&temporary, path)?;
    match path.parent() {
        Some(dir) => disk.sync_dir(dir),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_hold_back_older_tokens() {
        let fence = Fence::default();
        assert_eq!(fence.admit(5, || 1).ok(), Some(1));
        assert_eq!(fence.raise(9, || 2).ok(), Some(2));
        let refused = fence.admit(7, || 3).unwrap_err();
        assert!(
            matches!(refused, FenceError::Below { token: 7, fence: 9 }),
            "{refused}"
        );
        assert!(
            refused.to_string().contains("passed to another"),
            "{refused}"
        );
        assert_eq!(fence.admit(9, || 4).ok(), Some(4));
        // A late, lower fence does not lower it.
        fence.raise(5, || ()).unwrap();
        assert!(fence.admit(7, || 5).is_err());
    }

    /// A restarted node keeps its fence: a late write of an old holder is still refused.
    #[test]
    fn a_fence_survives_a_restart_and_retired_files_go() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cluster-fence"), "1700000000000000\n").unwrap();
        let coordination = Coordination::open(&zr_node::disk::Disk::real(), dir.path()).unwrap();
        assert!(!dir.path().join("cluster-fence").exists());
        coordination.fence.raise(12, || ()).unwrap();
        drop(coordination);

        let fence = Fence::open(&Disk::real(), dir.path()).unwrap();
        assert!(
            fence.admit(11, || ()).is_err(),
            "the old holder's late write"
        );
        assert!(fence.admit(12, || ()).is_ok());
        // As the previous version left it: a fixed-width number written in place, beside
        // nothing else. Read as before; the next rise replaces it whole.
        std::fs::write(dir.path().join(FENCE_FILE), format!("{:020}\n", 30)).unwrap();
        let fence = Fence::open(&Disk::real(), dir.path()).unwrap();
        assert!(fence.admit(29, || ()).is_err() && fence.admit(30, || ()).is_ok());
        fence.raise(31, || ()).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FENCE_FILE)).unwrap(),
            format!("{:020}\n", 31)
        );
        assert!(!dir.path().join(format!("{FENCE_FILE}.new")).exists());
        std::fs::write(dir.path().join(FENCE_FILE), "twelve").unwrap();
        let err = Fence::open(&Disk::real(), dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains(FENCE_FILE) && err.contains("twelve"), "{err}");
    }
}
