//! A node's part in a shard move (`zr cluster add-shard` / `drain-shard`).
//!
//! A new cluster map changes which slots some shards own, and so every local index of those
//! shards (placement ranks a shard's slots). Such a node builds its dataset for the next map
//! beside its own, in `.<name>.map-v<version>`: record after record in the new local order,
//! each either copied from its own current data or received from the shard that held it.
//! Meanwhile it serves its current data under the current map, untouched. When the router
//! switches the cluster to the next map, the node commits the built dataset and swaps the two
//! directories with one `renameat2(RENAME_EXCHANGE)` — a crash leaves either whole at the
//! data path, with the identity (map version) that goes with it — then serves the new one and
//! deletes the old. A node whose slots do not change only takes the new version.
//!
//! The directory being built survives a restart of the node (its committed records count;
//! the router asks how far it got and goes on from there); one for another version is the
//! leftover of an abandoned move and is removed when the next move begins.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::disk;
use crate::error::{Error, IoContext, Result};
use crate::fence::{Coordination, Fence};
use crate::identity::Identity;
use crate::meta::sync_dir;
use crate::runtime::RuntimeOptions;
use crate::store::{CreateOptions, GatherOptions, Store};
use zr_common::Record;

/// What a node serves now: its store and, kept in the store's directory, its identity and
/// fence.
pub struct Serving {
    pub store: Store,
    pub coordination: Coordination,
}

/// A node's data, switchable to the next map's (see the module documentation).
pub struct Shard {
    current: ArcSwap<Serving>,
    staged: Mutex<Option<Staged>>,
    runtime: RuntimeOptions,
}

struct Staged {
    version: u64,
    store: Store,
}

/// Where the dataset for map `version` of the dataset at `dir` is built.
pub fn staged_dir(dir: &Path, version: u64) -> Result<PathBuf> {
    Ok(dir.with_file_name(format!("{}{version}", staged_prefix(dir)?)))
}

fn staged_prefix(dir: &Path) -> Result<String> {
    let name = dir.file_name().ok_or_else(|| Error::InvalidInput {
        path: dir.to_path_buf(),
        reason: "a dataset path must end in a directory name".into(),
    })?;
    Ok(format!(".{}.map-v", name.to_string_lossy()))
}

impl Shard {
    /// Serves `store` with `coordination`; datasets built for a move are opened with
    /// `runtime`, as the store was.
    pub fn new(store: Store, coordination: Coordination, runtime: RuntimeOptions) -> Shard {
        Shard {
            current: ArcSwap::from_pointee(Serving {
                store,
                coordination,
            }),
            staged: Mutex::new(None),
            runtime,
        }
    }

    /// What the node serves now.
    pub fn serving(&self) -> Arc<Serving> {
        self.current.load_full()
    }

    /// True if `store` (what the node serves) is empty and no dataset is being built here:
    /// the node holds nothing, under any map.
    pub fn holds_nothing(&self, store: &Store) -> bool {
        if !store.is_empty() || self.lock_staged().is_some() {
            return false;
        }
        let dir = store.dir();
        let (Ok(prefix), Some(parent)) = (staged_prefix(dir), dir.parent()) else {
            return false;
        };
        match std::fs::read_dir(parent) {
            Ok(entries) => !entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&prefix)),
            Err(_) => false,
        }
    }

    fn lock_staged(&self) -> std::sync::MutexGuard<'_, Option<Staged>> {
        self.staged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the dataset for map `version`, made empty if there is none yet (leftovers for
    /// other versions are removed). Returns how many records it holds.
    pub fn open_stage(&self, version: u64) -> Result<u64> {
        let mut staged = self.lock_staged();
        if let Some(open) = staged.as_ref().filter(|s| s.version == version) {
            return Ok(open.store.len());
        }
        *staged = None;
        let serving = self.serving();
        let dir = serving.store.dir().to_path_buf();
        let prefix = staged_prefix(&dir)?;
        let parent = dir.parent().unwrap_or(Path::new("."));
        let path = staged_dir(&dir, version)?;
        for entry in std::fs::read_dir(parent).ctx("list", parent)? {
            let entry = entry.ctx("list", parent)?;
            let other = entry.path();
            let is_leftover = entry.file_name().to_string_lossy().starts_with(&prefix);
            if is_leftover && other != path {
                tracing::info!("removing {} (an abandoned move's)", other.display());
                disk::remove_tree(&other).ctx("remove an abandoned move's dataset", &other)?;
            }
        }
        let store = if path.join(crate::meta::META_FILE).exists() {
            Store::open_with(&path, self.runtime)?
        } else {
            if path.exists() {
                // Made but not yet a dataset: nothing in it counts.
                disk::remove_tree(&path).ctx("remove an unfinished dataset", &path)?;
            }
            Store::create_with(
                &path,
                serving.store.fields().to_vec(),
                CreateOptions::default(),
                self.runtime,
            )?
        };
        let len = store.len();
        *staged = Some(Staged { version, store });
        Ok(len)
    }

    /// Sets the records of the dataset for map `version` from index `at` on: record k is
    /// this node's current record `sources[k]`, or for `None` the next of `received`.
    /// Records it held from `at` on are dropped first (a resumed move sends them again).
    /// With `commit`, everything staged so far is made durable. Returns its length.
    pub fn stage(
        &self,
        version: u64,
        at: u64,
        sources: &[Option<u64>],
        received: Vec<Record<'_>>,
        commit: bool,
    ) -> Result<u64> {
        let staged = self.lock_staged();
        let Some(open) = staged.as_ref().filter(|s| s.version == version) else {
            return Err(Error::InvalidRecord(format!(
                "no dataset for map version {version} is open on this node (the move must open it first)"
            )));
        };
        let store = &open.store;
        if at > store.len() {
            return Err(Error::InvalidRecord(format!(
                "records for map version {version} from {at} on, but this node holds only {} of them",
                store.len()
            )));
        }
        while store.len() > at {
            store.delete(store.len() - 1)?;
        }
        let serving = self.serving();
        let local: Vec<u64> = sources.iter().flatten().copied().collect();
        let gathered = serving
            .store
            .gather_with(&local, &[], GatherOptions::verified())?;
        let names: Vec<&str> = serving
            .store
            .fields()
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        let columns: Vec<_> = gathered.fields().collect();
        let mut received = received.into_iter();
        let mut next_local = 0;
        let mut records = Vec::with_capacity(sources.len());
        for source in sources {
            match source {
                Some(_) => {
                    let mut record = Record::new();
                    for (name, column) in names.iter().zip(&columns) {
                        record.set(name, column.get(next_local).unwrap_or_default());
                    }
                    next_local += 1;
                    records.push(record);
                }
                None => records.push(received.next().ok_or_else(|| {
                    Error::InvalidRecord("fewer records received than the sources name".into())
                })?),
            }
        }
        store.append_many(&records)?;
        if commit {
            // Kept: a node restarted mid-move goes on from here.
            store.commit()?;
        }
        Ok(store.len())
    }

    /// Serves map `version` from now on: with `staged`, the dataset built for it, which must
    /// hold `len` records; else the current data, unchanged. Done already: nothing to do.
    pub fn switch(&self, version: u64, staged: bool, len: u64) -> Result<()> {
        let mut open = self.lock_staged();
        let serving = self.serving();
        let identity = &serving.coordination.identity;
        if identity.map_version() == Some(version) {
            return Ok(());
        }
        if !staged {
            return identity.adopt(version);
        }
        if open.as_ref().is_none_or(|s| s.version != version) {
            drop(open);
            self.open_stage(version)?;
            open = self.lock_staged();
        }
        let Some(built) = open.take() else {
            return Err(Error::InvalidRecord(format!(
                "no dataset for map version {version} on this node"
            )));
        };
        if built.store.len() != len {
            let holds = built.store.len();
            *open = Some(built);
            return Err(Error::InvalidRecord(format!(
                "the dataset for map version {version} holds {holds} records, not the {len} the switch needs"
            )));
        }
        let dir = serving.store.dir().to_path_buf();
        let path = built.store.dir().to_path_buf();
        built.store.commit()?;
        drop(built);
        // The identity and fence that go with the data, then the swap.
        identity.copy_to(&path, version)?;
        serving.coordination.fence.copy_to(&path)?;
        disk::exchange(&path, &dir).ctx("swap in the dataset of the next map", &dir)?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        let store =
            Store::open_with(&dir, self.runtime)?.with_gather_options(serving.store.defaults);
        let coordination = Coordination {
            fence: Fence::open(&dir)?,
            identity: Identity::open(&dir)?,
            incarnation: serving.coordination.incarnation,
        };
        self.current.store(Arc::new(Serving {
            store,
            coordination,
        }));
        drop(serving);
        tracing::info!(
            "serving map version {version}: {len} records, from {}",
            dir.display()
        );
        disk::remove_tree(&path).ctx("remove the previous map's dataset", &path)?;
        Ok(())
    }
}
