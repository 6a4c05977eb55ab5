//! Which shard of which cluster a data directory holds, kept beside the store in
//! `identity.json`: the shard when the node first opens the directory, the cluster id and
//! map version when the first router request carrying them arrives; the map version changes
//! only when the node switches to the next map's data (see `stage`), or, holding nothing,
//! takes a newer map. A directory of another shard or another cluster is refused, never
//! served as if it were this one.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::meta::sync_dir;

/// The identity file inside a dataset directory.
pub const IDENTITY_FILE: &str = "identity.json";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Kept {
    shard: Option<u32>,
    cluster: Option<String>,
    map_version: Option<u64>,
}

/// A data directory's identity (`Default`: kept in memory only, for a node without a
/// directory of its own).
#[derive(Debug, Default)]
pub struct Identity {
    path: Option<PathBuf>,
    kept: Mutex<Kept>,
}

/// Why a request is refused by the identity check.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// The directory belongs to another cluster.
    #[error("this node's data belongs to cluster {ours}, not {theirs}: a data directory of another cluster?")]
    Cluster { ours: String, theirs: String },
    /// The sender placed the request by another map version.
    #[error("this node serves map version {ours}; the request was placed by version {theirs} (stale map)")]
    Map { ours: u64, theirs: u64 },
    /// The identity could not be kept.
    #[error("{0}")]
    Storage(String),
}

impl Identity {
    /// The identity of `dir` (empty if it has none yet).
    pub fn open(dir: &Path) -> Result<Identity> {
        let path = dir.join(IDENTITY_FILE);
        let kept = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Kept::default(),
            Err(e) => return Err(e).ctx("read", &path),
        };
        Ok(Identity {
            path: Some(path),
            kept: Mutex::new(kept),
        })
    }

    /// Claims `dir` for shard `shard`: kept if it has no shard yet, refused if it holds
    /// another shard's data.
    pub fn claim(dir: &Path, shard: u32) -> Result<()> {
        let identity = Identity::open(dir)?;
        let mut kept = identity.lock();
        match kept.shard {
            Some(ours) if ours != shard => Err(Error::InvalidInput {
                path: dir.to_path_buf(),
                reason: format!(
                    "this directory holds shard {ours}'s data, not shard {shard}'s (a wrong --data or [[shard]] data path?)"
                ),
            }),
            Some(_) => Ok(()),
            None => {
                kept.shard = Some(shard);
                identity.keep(&kept)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep(&self, kept: &Kept) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let bytes = serde_json::to_vec_pretty(kept).map_err(|e| Error::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let temporary = path.with_extension("json.tmp");
        std::fs::write(&temporary, bytes).ctx("write", &temporary)?;
        std::fs::File::open(&temporary)
            .and_then(|f| f.sync_all())
            .ctx("fsync", &temporary)?;
        std::fs::rename(&temporary, path).ctx("rename", path)?;
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
        Ok(())
    }

    /// The map version this directory's data is laid out by, once known.
    pub fn map_version(&self) -> Option<u64> {
        self.lock().map_version
    }

    /// Admits a request for cluster `cluster`, whatever map placed it (a switch to the next
    /// map is placed by that map).
    pub fn admit_cluster(&self, cluster: &str) -> std::result::Result<(), Mismatch> {
        let kept = self.lock();
        match &kept.cluster {
            Some(ours) if ours != cluster => Err(Mismatch::Cluster {
                ours: ours.clone(),
                theirs: cluster.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// From now on the data is laid out by map `version` (its slots did not change).
    pub fn adopt(&self, version: u64) -> Result<()> {
        let mut kept = self.lock();
        let mut next = kept.clone();
        next.map_version = Some(version);
        self.keep(&next)?;
        *kept = next;
        Ok(())
    }

    /// Keeps this identity, at map `version`, in the dataset directory `dir` (built for that
    /// map, and about to take this one's place).
    pub fn copy_to(&self, dir: &Path, version: u64) -> Result<()> {
        let mut kept = self.lock().clone();
        kept.map_version = Some(version);
        let copy = Identity {
            path: Some(dir.join(IDENTITY_FILE)),
            kept: Mutex::new(kept.clone()),
        };
        copy.keep(&kept)
    }

    /// Admits a request for cluster `cluster` placed by map `map_version`: the first one
    /// names the cluster and map this directory belongs to from then on.
    pub fn admit(&self, cluster: &str, map_version: u64) -> std::result::Result<(), Mismatch> {
        let mut kept = self.lock();
        match (&kept.cluster, kept.map_version) {
            (Some(ours), _) if ours != cluster => Err(Mismatch::Cluster {
                ours: ours.clone(),
                theirs: cluster.to_string(),
            }),
            (Some(_), Some(ours)) if ours != map_version => Err(Mismatch::Map {
                ours,
                theirs: map_version,
            }),
            (Some(_), Some(_)) => Ok(()),
            _ => {
                let mut next = kept.clone();
                next.cluster = Some(cluster.to_string());
                next.map_version = Some(map_version);
                self.keep(&next)
                    .map_err(|e| Mismatch::Storage(e.to_string()))?;
                *kept = next;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_keeps_its_shard_and_cluster() {
        let dir = tempfile::tempdir().expect("scratch");
        Identity::claim(dir.path(), 2).expect("claim");
        Identity::claim(dir.path(), 2).expect("the same shard again");
        let e = Identity::claim(dir.path(), 1).expect_err("another shard");
        assert!(
            e.to_string().contains("shard 2's data, not shard 1's"),
            "{e}"
        );

        let identity = Identity::open(dir.path()).expect("open");
        identity.admit("c1", 1).expect("first request");
        identity.admit("c1", 1).expect("same cluster");
        assert!(matches!(
            identity.admit("c2", 1),
            Err(Mismatch::Cluster { .. })
        ));
        assert!(matches!(
            identity.admit("c1", 2),
            Err(Mismatch::Map { ours: 1, theirs: 2 })
        ));
        // Kept across a restart.
        let again = Identity::open(dir.path()).expect("reopen");
        assert!(matches!(
            again.admit("c2", 1),
            Err(Mismatch::Cluster { .. })
        ));
        Identity::claim(dir.path(), 2).expect("the shard is still kept");
    }
}
