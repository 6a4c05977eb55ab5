//! Which shard of which cluster a data directory holds, kept beside the store in
//! `identity.json`: the shard when the node first opens the directory, the cluster id and
//! map version when the first router request carrying them arrives; the map version changes
//! only when the node switches to the next map's data (see `stage`), or, holding nothing,
//! takes a newer map. A directory of another shard or another cluster is refused, never
//! served as if it were this one.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use zr_proto::wire::Target;

use zr_node::meta::sync_dir;
use zr_node::{Error, IoContext, Result};

/// The identity file inside a dataset directory.
pub const IDENTITY_FILE: &str = "identity.json";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Kept {
    shard: Option<u32>,
    /// Absent in directories claimed before replicas were kept: taken at the next claim.
    #[serde(default)]
    replica: Option<u32>,
    cluster: Option<String>,
    map_version: Option<u64>,
    /// The data keeps each slot as a unit of its own (see `zr_node::unit`). Directories
    /// written before kept a shard's records as one sequence, ranked by the map: see
    /// [`LEGACY_LAYOUT`].
    #[serde(default)]
    slotted: bool,
    /// Slots a shard move is building here, not served yet (see `stage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    staged: Option<StagedSlots>,
    /// Slots being dropped: dropped again if the node stopped before it was done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    dropping: Vec<u32>,
}

/// The slots a move to map `version` is building on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedSlots {
    pub version: u64,
    pub slots: Vec<u32>,
}

/// Why a directory written by an older build is not served as it is.
pub const LEGACY_LAYOUT: &str = "it was written by an older zrecord, which kept a shard's records as one sequence ranked by the cluster map; this build keeps each slot as files of its own. `zr-node` converts it when it starts with the cluster's nodes.toml (it reads the map from the metadata store; see `zr-node --help`)";

/// A data directory's identity (`Default`: kept in memory only, for a node without a
/// directory of its own).
#[derive(Debug, Default)]
pub struct Identity {
    path: Option<PathBuf>,
    kept: Mutex<Kept>,
}

/// Why a request is refused by the identity check.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Mismatch {
    /// The directory belongs to another cluster.
    #[error("this node's data belongs to cluster {ours}, not {theirs}: a data directory of another cluster?")]
    Cluster { ours: String, theirs: String },
    /// The sender placed the request by another map version.
    #[error("this node serves map version {ours}; the request was placed by version {theirs} (stale map)")]
    Map { ours: u64, theirs: u64 },
    /// The request was meant for another node: another shard, or another replica.
    #[error("this node serves {ours}; the request was meant for {theirs} (are two nodes' addresses swapped in the sender's nodes.toml?)")]
    Node { ours: Target, theirs: Target },
    /// A client's request reached a node that no router has placed in a cluster yet.
    #[error(
        "this node belongs to no cluster yet: a client reads only from nodes its router has placed"
    )]
    Unplaced,
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

    /// Claims `dir` for shard `shard`'s replica `replica`: kept if it has no shard yet,
    /// refused if it holds another shard's or replica's data. A directory that holds records
    /// (`records`) but no identity is refused too: which shard it is cannot be known, and
    /// taking it by its length alone would serve another shard's records as this one's.
    pub fn claim(dir: &Path, shard: u32, replica: u32, records: u64) -> Result<()> {
        let identity = Identity::open(dir)?;
        let mut kept = identity.lock();
        let path = || dir.to_path_buf();
        match (kept.shard, kept.replica) {
            (Some(ours), _) if ours != shard => Err(Error::InvalidInput {
                path: path(),
                reason: format!(
                    "this directory holds shard {ours}'s data, not shard {shard}'s (a wrong --data or [[shard]] data path?)"
                ),
            }),
            (Some(_), Some(ours)) if ours != replica => Err(Error::InvalidInput {
                path: path(),
                reason: format!(
                    "this directory holds shard {shard} replica {ours}'s data, not replica {replica}'s (a wrong --replica or data path?)"
                ),
            }),
            (Some(_), _) if !kept.slotted && records > 0 => Err(Error::InvalidInput {
                path: path(),
                reason: LEGACY_LAYOUT.to_string(),
            }),
            (Some(_), Some(_)) if kept.slotted => Ok(()),
            (Some(_), _) => {
                kept.replica = Some(replica);
                kept.slotted = true;
                identity.keep(&kept)
            }
            (None, _) if records > 0 => Err(Error::InvalidInput {
                path: path(),
                reason: format!(
                    "this directory holds {records} records but no {IDENTITY_FILE}, so which shard they belong to is unknown; it is not taken as shard {shard}'s. Restore its {IDENTITY_FILE}, or start on an empty directory and let the node be rebuilt (`zr cluster replace-node`)"
                ),
            }),
            (None, _) => {
                kept.shard = Some(shard);
                kept.replica = Some(replica);
                kept.slotted = true;
                identity.keep(&kept)
            }
        }
    }

    /// Admits a request meant for `target`: refused if this directory is another node's.
    /// A directory that knows no shard (a node without one) admits any.
    pub fn admit_target(&self, target: Target) -> std::result::Result<(), Mismatch> {
        let kept = self.lock();
        let Some(shard) = kept.shard else {
            return Ok(());
        };
        let ours = Target {
            shard,
            replica: kept.replica.unwrap_or(target.replica),
        };
        if ours == target {
            Ok(())
        } else {
            Err(Mismatch::Node {
                ours,
                theirs: target,
            })
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
            sync_dir(&zr_node::disk::Disk::real(), dir)?;
        }
        Ok(())
    }

    /// The shard and replica this directory's data is, once claimed.
    pub fn place(&self) -> Option<Target> {
        let kept = self.lock();
        Some(Target {
            shard: kept.shard?,
            replica: kept.replica?,
        })
    }

    /// The cluster this directory's data belongs to, once known.
    pub fn cluster(&self) -> Option<String> {
        self.lock().cluster.clone()
    }

    /// True if the data keeps each slot as a unit of its own (see [`LEGACY_LAYOUT`]).
    pub fn slotted(&self) -> bool {
        self.lock().slotted
    }

    /// The slots a move is building here, if any.
    pub fn staged(&self) -> Option<StagedSlots> {
        self.lock().staged.clone()
    }

    /// The slots being dropped (left to drop by a node that stopped meanwhile).
    pub fn dropping(&self) -> Vec<u32> {
        self.lock().dropping.clone()
    }

    /// Keeps a change to the slots held: the map version (unchanged if `None`), the slots
    /// being built and the slots to drop.
    pub fn change_slots(
        &self,
        map_version: Option<u64>,
        staged: Option<StagedSlots>,
        dropping: Vec<u32>,
    ) -> Result<()> {
        let mut kept = self.lock();
        let mut next = kept.clone();
        if map_version.is_some() {
            next.map_version = map_version;
        }
        next.staged = staged;
        next.dropping = dropping;
        self.keep(&next)?;
        *kept = next;
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

    /// Keeps this identity, at map `version`, in the dataset directory `dir` (built by this
    /// build for that map — so in its layout, one unit per slot — and about to take this
    /// one's place).
    pub fn copy_to(&self, dir: &Path, version: u64) -> Result<()> {
        let mut kept = self.lock().clone();
        kept.map_version = Some(version);
        kept.slotted = true;
        let copy = Identity {
            path: Some(dir.join(IDENTITY_FILE)),
            kept: Mutex::new(kept.clone()),
        };
        copy.keep(&kept)
    }

    /// Keeps this identity as it is in the directory `dir` (a dataset made beside this
    /// one, on the same node).
    pub fn copy_as_is(&self, dir: &Path) -> Result<()> {
        let kept = self.lock().clone();
        let copy = Identity {
            path: Some(dir.join(IDENTITY_FILE)),
            kept: Mutex::new(kept.clone()),
        };
        copy.keep(&kept)
    }

    /// Admits a client's request for cluster `cluster` placed by map `map_version`: only as
    /// this node's data is placed already (a client never names the cluster for a node).
    pub fn admit_placed(
        &self,
        cluster: &str,
        map_version: u64,
    ) -> std::result::Result<(), Mismatch> {
        placed(&self.lock(), cluster, map_version).unwrap_or(Err(Mismatch::Unplaced))
    }

    /// Admits a request for cluster `cluster` placed by map `map_version`: the first one
    /// names the cluster and map this directory belongs to from then on.
    pub fn admit(&self, cluster: &str, map_version: u64) -> std::result::Result<(), Mismatch> {
        let mut kept = self.lock();
        match placed(&kept, cluster, map_version) {
            Some(admitted) => admitted,
            None => {
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

/// Whether `kept` admits a request for `cluster` placed by map `map_version`; `None` while
/// it names no cluster and map yet.
fn placed(
    kept: &Kept,
    cluster: &str,
    map_version: u64,
) -> Option<std::result::Result<(), Mismatch>> {
    match (&kept.cluster, kept.map_version) {
        (Some(ours), _) if ours != cluster => Some(Err(Mismatch::Cluster {
            ours: ours.clone(),
            theirs: cluster.to_string(),
        })),
        (Some(_), Some(ours)) if ours != map_version => Some(Err(Mismatch::Map {
            ours,
            theirs: map_version,
        })),
        (Some(_), Some(_)) => Some(Ok(())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_keeps_its_shard_and_cluster() {
        let dir = tempfile::tempdir().expect("scratch");
        Identity::claim(dir.path(), 2, 1, 0).expect("claim");
        Identity::claim(dir.path(), 2, 1, 5).expect("the same shard again");
        let e = Identity::claim(dir.path(), 1, 1, 0).expect_err("another shard");
        assert!(
            e.to_string().contains("shard 2's data, not shard 1's"),
            "{e}"
        );
        let e = Identity::claim(dir.path(), 2, 0, 0).expect_err("another replica");
        assert!(e.to_string().contains("not replica 0's"), "{e}");

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
        Identity::claim(dir.path(), 2, 1, 0).expect("the shard is still kept");
        let meant = |shard, replica| Target { shard, replica };
        again.admit_target(meant(2, 1)).expect("meant for it");
        for other in [meant(1, 1), meant(2, 0)] {
            let e = again
                .admit_target(other)
                .expect_err("meant for another node");
            assert!(
                e.to_string().contains("serves shard 2 replica 1")
                    && e.to_string().contains(&other.to_string()),
                "{e}"
            );
        }
    }

    /// A directory with records and no identity is another node's data as far as anyone
    /// can tell: refused, naming the file; an empty one is claimed; one claimed before
    /// replicas were kept takes its replica.
    #[test]
    fn records_without_an_identity_are_refused_and_old_identities_upgrade() {
        let dir = tempfile::tempdir().expect("scratch");
        let e = Identity::claim(dir.path(), 2, 0, 10_368).expect_err("records, no identity");
        assert!(
            e.to_string().contains("10368 records but no identity.json"),
            "{e}"
        );
        assert!(!dir.path().join(IDENTITY_FILE).exists());
        Identity::claim(dir.path(), 2, 0, 0).expect("empty: claimed");

        let old = tempfile::tempdir().expect("scratch");
        std::fs::write(
            old.path().join(IDENTITY_FILE),
            r#"{"shard": 3, "cluster": "c", "map_version": 1}"#,
        )
        .expect("an older identity");
        // Written before slots were kept apart: refused while it holds records.
        let e = Identity::claim(old.path(), 3, 1, 50).expect_err("an older layout");
        assert!(e.to_string().contains("older zrecord"), "{e}");
        Identity::claim(old.path(), 3, 1, 0).expect("empty: taken, and upgraded");
        let e = Identity::claim(old.path(), 3, 0, 50).expect_err("replica now kept");
        assert!(e.to_string().contains("not replica 0's"), "{e}");
        Identity::claim(old.path(), 3, 1, 50).expect("slotted now");
    }
}
