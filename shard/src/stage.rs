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

use crate::fence::Coordination;
use zr_common::Record;
use zr_node::disk;
use zr_node::meta::sync_dir;
use zr_node::RuntimeOptions;
use zr_node::{CreateOptions, GatherOptions, Store};
use zr_node::{Error, IoContext, Result};

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

/// The datasets for other maps beside the dataset at `dir`, whatever their version.
pub(crate) fn staged_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let prefix = staged_prefix(dir)?;
    let parent = dir.parent().unwrap_or(Path::new("."));
    let mut found = Vec::new();
    for entry in std::fs::read_dir(parent).ctx("list", parent)? {
        let entry = entry.ctx("list", parent)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // The prefix, then only the version (a dataset named "a.map-v2" is not "a"'s).
        let version = name.strip_prefix(&prefix);
        if version.is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())) {
            found.push(entry.path());
        }
    }
    Ok(found)
}

fn staged_prefix(dir: &Path) -> Result<String> {
    let name = dir.file_name().ok_or_else(|| Error::InvalidInput {
        path: dir.to_path_buf(),
        reason: "a dataset path must end in a directory name".into(),
    })?;
    Ok(format!(".{}.map-v", name.to_string_lossy()))
}

/// Free space a dataset for the next map must leave beside it, at least.
const ROOM_SPARE_BYTES: u64 = 256 << 20;

/// Refuses to start a dataset beside `store` in `parent` unless the file system has room for
/// a copy of it (what the next map's dataset of a shard keeping or gaining about its share
/// needs, at most) and some to spare.
fn check_room(parent: &Path, store: &Store) -> Result<()> {
    let (_, needed) = store.chunk_stats();
    let free = free_bytes(parent).ctx("statvfs", parent)?;
    if free < needed + ROOM_SPARE_BYTES {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(Error::InvalidInput {
            path: parent.to_path_buf(),
            reason: format!(
                "a shard move builds this node's dataset for the next map beside its own: it needs about {:.2} GiB there, and the file system has {:.2} GiB free",
                gib(needed + ROOM_SPARE_BYTES),
                gib(free)
            ),
        });
    }
    Ok(())
}

/// Bytes an unprivileged writer may still use on the file system holding `path`.
fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains a NUL byte")
    })?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated path and `stat` points to writable memory of the
    // type statvfs fills; it is read only after the call reports success.
    let status = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if status != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised `stat`.
    let stat = unsafe { stat.assume_init() };
    // The fields' widths differ between platforms.
    #[allow(clippy::unnecessary_cast)]
    let free = stat.f_bavail as u64 * stat.f_frsize as u64;
    Ok(free)
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

    /// True if the node holds nothing, under any map: `serving` (what a request found the
    /// node serving) is what it serves still, its store is empty, and no dataset is being
    /// built here.
    pub fn holds_nothing(&self, serving: &Coordination) -> bool {
        // Held: a switch under way finishes first.
        let staged = self.lock_staged();
        let current = self.serving();
        if staged.is_some()
            || !std::ptr::eq(&current.coordination, serving)
            || !current.store.is_empty()
        {
            return false;
        }
        staged_dirs(current.store.dir()).is_ok_and(|dirs| dirs.is_empty())
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
        let parent = dir.parent().unwrap_or(Path::new("."));
        let path = staged_dir(&dir, version)?;
        for other in staged_dirs(&dir)? {
            if other != path {
                tracing::info!("removing {} (an abandoned move's)", other.display());
                disk::remove_tree(&other).ctx("remove an abandoned move's dataset", &other)?;
            }
        }
        let store = if path.join(zr_node::meta::META_FILE).exists() {
            Store::open_with(&path, self.runtime)?
        } else {
            if path.exists() {
                // Made but not yet a dataset: nothing in it counts.
                disk::remove_tree(&path).ctx("remove an unfinished dataset", &path)?;
            }
            check_room(parent, &serving.store)?;
            Store::create_with_dicts(
                &path,
                serving.store.fields().to_vec(),
                CreateOptions::default(),
                self.runtime,
                &serving.store.dicts(),
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

    /// Adds `field` to the dataset served (nothing if it has a field of that name and
    /// compression); refused while a move builds the next map's dataset.
    pub fn add_field(&self, field: zr_node::meta::FieldSpec) -> Result<()> {
        let staged = self.lock_staged();
        let serving = self.serving();
        if let Some(have) = serving.store.fields().iter().find(|f| f.name == field.name) {
            if have.compress == field.compress {
                return Ok(());
            }
            return Err(Error::InvalidSchema(format!(
                "the dataset has a field '{}' already, stored {:?}",
                field.name, have.compress
            )));
        }
        if staged.is_some() {
            return Err(Error::InvalidInput {
                path: serving.store.dir().to_path_buf(),
                reason: "a shard move is building this node's next dataset: add the field once it is done".into(),
            });
        }
        let store = serving.store.add_field(field)?;
        let dir = store.dir().to_path_buf();
        let coordination = Coordination::open_as(&dir, serving.coordination.incarnation)?;
        self.current.store(Arc::new(Serving {
            store,
            coordination,
        }));
        Ok(())
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
        let path = built.store.dir().to_path_buf();
        built.store.commit()?;
        drop(built);
        self.swap_in(&serving, &path, version)?;
        tracing::info!(
            "serving map version {version}: {len} records, from {}",
            serving.store.dir().display()
        );
        Ok(())
    }

    /// Serves the dataset in `path` — a rebuild's copy of a partner's files — instead of the
    /// current one, under the same map; refused while a move builds the next map's dataset.
    pub fn install(&self, path: &Path) -> Result<()> {
        let staged = self.lock_staged();
        let serving = self.serving();
        if staged.is_some() {
            return Err(Error::InvalidInput {
                path: serving.store.dir().to_path_buf(),
                reason: "a shard move is building this node's next dataset: rebuild it once the move is done".into(),
            });
        }
        let version = serving.coordination.identity.map_version().ok_or_else(|| {
            Error::InvalidRecord("this node belongs to no cluster yet: nothing to rebuild".into())
        })?;
        self.swap_in(&serving, path, version)
    }

    /// Swaps the dataset in `path` in for `serving`'s, as the data of map `version`, and
    /// serves it; the one it replaces is removed.
    fn swap_in(&self, serving: &Serving, path: &Path, version: u64) -> Result<()> {
        let dir = serving.store.dir().to_path_buf();
        let identity = &serving.coordination.identity;
        // The identity, fence and name that go with the data, the named datasets that live
        // inside the default one's directory (each switches on its own), then the swap. A
        // crash between the two renames leaves the named datasets in the built directory,
        // where the node finds them when it starts (`catalog::recover_named`).
        identity.copy_to(path, version)?;
        serving.coordination.fence.copy_to(path)?;
        let kept = dir.join(crate::catalog::DATASET_FILE);
        if kept.exists() {
            let bytes = std::fs::read(&kept).ctx("read", &kept)?;
            zr_node::meta::write_atomically(path, crate::catalog::DATASET_FILE, &bytes)?;
        }
        let named = dir.join(crate::catalog::DATASETS_DIR);
        if named.exists() {
            let carried = path.join(crate::catalog::DATASETS_DIR);
            disk::rename(&named, &carried).ctx("carry the named datasets along", &named)?;
            sync_dir(&dir)?;
            sync_dir(path)?;
        }
        disk::exchange(path, &dir).ctx("swap in the dataset of the next map", &dir)?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        let store = Store::open_with(&dir, self.runtime)?
            .with_gather_options(serving.store.gather_options());
        let coordination = Coordination::open_as(&dir, serving.coordination.incarnation)?;
        self.current.store(Arc::new(Serving {
            store,
            coordination,
        }));
        disk::remove_tree(path).ctx("remove the dataset swapped out", path)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zr_node::meta::{Compression, FieldSpec};

    fn shard_with(dir: &Path, records: &[&[u8]]) -> Shard {
        let fields = vec![FieldSpec::new("x", Compression::Flate)];
        let store = Store::create(dir, fields, CreateOptions::default()).expect("create");
        let rows: Vec<Record> = records.iter().map(|r| Record::new().with("x", r)).collect();
        store.append_many(&rows).expect("append");
        store.commit().expect("commit");
        let coordination = Coordination::open(dir).expect("coordination");
        coordination.identity.admit("c", 1).expect("identity");
        Shard::new(store, coordination, RuntimeOptions::default())
    }

    fn rows(shard: &Shard) -> Vec<Vec<u8>> {
        let store = &shard.serving().store;
        let all: Vec<u64> = (0..store.len()).collect();
        let batch = store.gather(&all, &[]).expect("gather");
        let column = batch.fields().next().expect("a field");
        (0..all.len())
            .map(|k| column.get(k).unwrap_or_default().to_vec())
            .collect()
    }

    #[test]
    fn a_node_builds_the_next_maps_dataset_and_swaps_it_in() {
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("shard");
        let shard = shard_with(&dir, &[b"r0", b"r1", b"r2", b"r3"]);
        assert!(!shard.holds_nothing(&shard.serving().coordination));
        assert_eq!(shard.open_stage(2).expect("open"), 0);
        let e = shard.stage(3, 0, &[], Vec::new(), false).unwrap_err();
        assert!(
            e.to_string().contains("no dataset for map version 3"),
            "{e}"
        );
        let gained = [Record::new().with("x", b"gained")];
        let len = shard
            .stage(2, 0, &[Some(3), None, Some(1)], gained.to_vec(), true)
            .expect("stage");
        assert_eq!(len, 3);
        let e = shard
            .stage(2, 5, &[Some(0)], Vec::new(), false)
            .unwrap_err();
        assert!(e.to_string().contains("holds only 3"), "{e}");

        // Built while the node serves its own data, untouched.
        assert_eq!(
            rows(&shard),
            [b"r0".to_vec(), b"r1".into(), b"r2".into(), b"r3".into()]
        );
        let e = shard.switch(2, true, 4).unwrap_err();
        assert!(e.to_string().contains("holds 3 records, not the 4"), "{e}");
        shard.switch(2, true, 3).expect("switch");
        assert_eq!(
            rows(&shard),
            [b"r3".to_vec(), b"gained".into(), b"r1".into()]
        );
        assert_eq!(shard.serving().coordination.identity.map_version(), Some(2));
        assert!(!staged_dir(&dir, 2).expect("path").exists());
        shard.switch(2, true, 3).expect("done already");

        // Kept across a restart: the data, and the map it is laid out by.
        drop(shard);
        let identity = crate::identity::Identity::open(&dir).expect("identity");
        assert_eq!(identity.map_version(), Some(2));
        let reopened = Store::open(&dir).expect("reopen");
        assert_eq!(reopened.len(), 3);
    }

    #[test]
    fn a_staged_dataset_survives_a_restart_and_leftovers_go() {
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("shard");
        let shard = shard_with(&dir, &[b"a", b"b"]);
        shard.open_stage(2).expect("open");
        shard
            .stage(2, 0, &[Some(1), Some(0)], Vec::new(), true)
            .expect("stage");
        // Not durable: lost with the process.
        shard
            .stage(2, 2, &[Some(1)], Vec::new(), false)
            .expect("stage");
        let store = shard.serving().store.clone();
        drop(shard);
        drop(store);
        let shard = shard_with_existing(&dir);
        assert_eq!(shard.open_stage(2).expect("reopen"), 2);
        // Another version's leftover is removed when a move to another begins.
        drop(shard);
        let shard = shard_with_existing(&dir);
        assert_eq!(shard.open_stage(3).expect("another move"), 0);
        assert!(!staged_dir(&dir, 2).expect("path").exists());
        // A node switched without a dataset of its own only takes the version.
        shard.switch(3, false, 0).expect("adopt");
        assert_eq!(shard.serving().coordination.identity.map_version(), Some(3));
        assert_eq!(rows(&shard), [b"a".to_vec(), b"b".into()]);
    }

    fn shard_with_existing(dir: &Path) -> Shard {
        let store = Store::open(dir).expect("open");
        let coordination = Coordination::open(dir).expect("coordination");
        Shard::new(store, coordination, RuntimeOptions::default())
    }

    #[test]
    fn an_empty_node_holds_nothing_until_it_builds() {
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("new");
        let shard = shard_with(&dir, &[]);
        let before = shard.serving();
        assert!(shard.holds_nothing(&before.coordination));
        shard.open_stage(2).expect("open");
        assert!(!shard.holds_nothing(&before.coordination));
        // A request that found the node serving what it served before a switch: not this.
        shard.switch(2, true, 0).expect("switch");
        assert!(!shard.holds_nothing(&before.coordination));
        assert!(shard.holds_nothing(&shard.serving().coordination));
    }
}
