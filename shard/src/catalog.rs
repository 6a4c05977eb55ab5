//! A node's datasets. The default one lives in the data directory itself, as a node's one
//! dataset always has (a directory made before datasets had names is read as it is); each
//! named one in `datasets/<name>/`, a dataset directory of its own with its identity and
//! fence, and `dataset.json` saying when it was made (its id: the metadata store's revision
//! of its creation, so a dataset dropped while this node was away and made again under the
//! same name is told from the old one).
//!
//! Creating builds the directory under a temporary name and renames it into place; dropping
//! renames it aside and then removes it: a crash at any moment leaves a dataset whole or
//! absent, and the leftovers (names starting with a dot) are removed when the node starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};

use crate::fence::Coordination;
use crate::stage::Shard;
use zr_node::disk::Disk;
use zr_node::meta::{sync_dir, write_atomically, FieldSpec};
use zr_node::RuntimeOptions;
use zr_node::{CreateOptions, Store};
use zr_node::{Error, IoContext, Result};

/// The directory of the named datasets, inside a node's data directory.
pub const DATASETS_DIR: &str = "datasets";
/// The file in a named dataset's directory that says which dataset it is.
pub const DATASET_FILE: &str = "dataset.json";
/// The dataset a request that names none addresses.
pub const DEFAULT: &str = "default";

#[derive(Serialize, Deserialize)]
struct Kept {
    name: String,
    id: u64,
}

/// A named dataset a node holds.
struct Named {
    id: u64,
    shard: Arc<Shard>,
}

/// What a node holds of one dataset, for a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub name: String,
    /// 0 for the default dataset.
    pub id: u64,
    pub fields: Vec<FieldSpec>,
    pub len: u64,
    pub bytes: u64,
}

/// Every dataset of a node. See the module documentation.
pub struct Catalog {
    root: Arc<Shard>,
    dir: PathBuf,
    named: RwLock<BTreeMap<String, Named>>,
    /// Held by creates, drops and field additions: one at a time.
    changes: Mutex<()>,
    runtime: RuntimeOptions,
    /// Rebuilds by files: snapshots served to partners, and this node's own.
    pub ships: Arc<crate::ship::Ships>,
}

impl Catalog {
    /// The default dataset `root` (served from the data directory) and the named datasets
    /// beside it, opened with `runtime` and read as the default one is.
    pub fn open(root: Shard, runtime: RuntimeOptions) -> Result<Catalog> {
        let disk = runtime.disk.clone();
        let dir = root.serving().store.dir().to_path_buf();
        let catalog = Catalog {
            root: Arc::new(root),
            named: RwLock::new(BTreeMap::new()),
            changes: Mutex::new(()),
            runtime,
            dir,
            ships: Arc::default(),
        };
        recover_named(&disk, &catalog.dir)?;
        // A rebuild or a move's copy cut short is started again from the beginning.
        crate::ship::remove_if_there(&crate::ship::ship_dir(&catalog.dir)?)?;
        let parent = catalog.dir.parent().unwrap_or(Path::new("."));
        let own = catalog
            .dir
            .file_name()
            .map(|n| format!(".{}.slots-", n.to_string_lossy()))
            .unwrap_or_default();
        for entry in std::fs::read_dir(parent).ctx("list", parent)? {
            let entry = entry.ctx("list", parent)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&own) && crate::ship::is_slots_dir(&name) {
                crate::ship::remove_if_there(&entry.path())?;
            }
        }
        let parent = catalog.datasets_dir();
        let entries = match std::fs::read_dir(&parent) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(catalog),
            Err(e) => return Err(e).ctx("list", &parent),
        };
        let mut named = BTreeMap::new();
        let mut hidden = Vec::new();
        for entry in entries {
            let path = entry.ctx("list", &parent)?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with('.') {
                hidden.push((name, path));
                continue;
            }
            let kept: Kept = read_kept(&path)?;
            if kept.name != name {
                return Err(Error::Corrupt {
                    path: path.join(DATASET_FILE),
                    reason: format!("names dataset '{}' but lies in '{name}'", kept.name),
                });
            }
            let shard = catalog.open_named(&path)?;
            named.insert(
                name,
                Named {
                    id: kept.id,
                    shard: Arc::new(shard),
                },
            );
        }
        // Leftovers of a create, drop, rebuild or copy cut short go.
        for (_, path) in hidden {
            if !path.exists() {
                continue; // an older build's move, removed as its dataset opened
            }
            tracing::info!(
                "removing {} (a create, drop, move or rebuild cut short)",
                path.display()
            );
            disk.remove_tree(&path).ctx("remove", &path)?;
        }
        *catalog.write() = named;
        Ok(catalog)
    }

    fn datasets_dir(&self) -> PathBuf {
        self.dir.join(DATASETS_DIR)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Named>> {
        self.named.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Named>> {
        self.named.write().unwrap_or_else(|e| e.into_inner())
    }

    fn open_named(&self, path: &Path) -> Result<Shard> {
        let reads = self.root.serving().store.gather_options();
        let store = Store::open_with(path, self.runtime.clone())?.with_gather_options(reads);
        let coordination = Coordination::open_as(
            &self.runtime.disk,
            path,
            self.root.serving().coordination.incarnation,
        )?;
        Shard::new(store, coordination, self.runtime.clone())
    }

    /// The default dataset.
    pub fn root(&self) -> &Arc<Shard> {
        &self.root
    }

    /// The dataset `name` (`None`: the default one), if this node holds it.
    pub fn get(&self, name: Option<&str>) -> Option<Arc<Shard>> {
        match name {
            None | Some(DEFAULT) => Some(Arc::clone(&self.root)),
            Some(name) => self.read().get(name).map(|n| Arc::clone(&n.shard)),
        }
    }

    /// Every dataset with its name, the default one first.
    pub fn named_all(&self) -> Vec<(String, Arc<Shard>)> {
        let mut all = vec![(DEFAULT.to_string(), Arc::clone(&self.root))];
        all.extend(
            self.read()
                .iter()
                .map(|(name, named)| (name.clone(), Arc::clone(&named.shard))),
        );
        all
    }

    /// Every dataset, the default one first.
    pub fn all(&self) -> Vec<Arc<Shard>> {
        let mut all = vec![Arc::clone(&self.root)];
        all.extend(self.read().values().map(|n| Arc::clone(&n.shard)));
        all
    }

    /// Every dataset this node holds, the default one first.
    pub fn list(&self) -> Vec<Held> {
        let held = |name: &str, id: u64, shard: &Shard| {
            let store = shard.serving().store.clone();
            Held {
                name: name.to_string(),
                id,
                fields: store.fields().to_vec(),
                len: store.len(),
                bytes: store.chunk_bytes_on_disk(),
            }
        };
        let mut all = vec![held(DEFAULT, 0, &self.root)];
        all.extend(
            self.read()
                .iter()
                .map(|(name, named)| held(name, named.id, &named.shard)),
        );
        all
    }

    /// Creates dataset `name`, made as `id`, with `fields`: done already if this node holds
    /// it; one of that name made earlier (dropped while this node was away) is replaced; one
    /// made later is left, and the create refused.
    /// `dicts`: zstd dictionaries of its fields, as [`Store::create_with_dicts`] takes them.
    pub fn create(
        &self,
        name: &str,
        id: u64,
        fields: Vec<FieldSpec>,
        dicts: &[(String, Vec<u8>)],
    ) -> Result<()> {
        let disk = &self.runtime.disk;
        let _one = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        let parent = self.datasets_dir();
        if name == DEFAULT {
            return Err(Error::InvalidInput {
                path: self.dir.clone(),
                reason: "the default dataset is the data directory itself: it is never created"
                    .into(),
            });
        }
        if let Some(held) = self.read().get(name).map(|n| n.id) {
            if held == id {
                return Ok(());
            }
            if held > id {
                return Err(Error::InvalidInput {
                    path: parent.join(name),
                    reason: format!(
                        "this node holds dataset '{name}' made as {held}, later than the one to create ({id})"
                    ),
                });
            }
            tracing::info!("dataset '{name}' was dropped and made again: replacing its data");
            self.remove(name)?;
        }
        disk.create_dir_all(&parent).ctx("create", &parent)?;
        let building = parent.join(format!(".{name}.creating"));
        if building.exists() {
            disk.remove_tree(&building).ctx("remove", &building)?;
        }
        drop(Store::create_with_dicts(
            &building,
            fields,
            CreateOptions::default(),
            self.runtime.clone(),
            dicts,
        )?);
        self.root
            .serving()
            .coordination
            .identity
            .copy_as_is(&building)?;
        let kept = serde_json::to_vec_pretty(&Kept {
            name: name.to_string(),
            id,
        })
        .map_err(|e| Error::InvalidRecord(e.to_string()))?;
        write_atomically(disk, &building, DATASET_FILE, &kept)?;
        let path = parent.join(name);
        disk.rename(&building, &path)
            .ctx("rename into place", &path)?;
        sync_dir(disk, &parent)?;
        let shard = self.open_named(&path)?;
        self.write().insert(
            name.to_string(),
            Named {
                id,
                shard: Arc::new(shard),
            },
        );
        tracing::info!("created dataset '{name}' (made as {id})");
        Ok(())
    }

    /// Drops dataset `name` if this node holds it as made at `id` or earlier: its records
    /// are gone. Requests that found it before still finish; later ones find no dataset.
    pub fn drop_dataset(&self, name: &str, id: u64) -> Result<()> {
        let _one = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        if name == DEFAULT {
            return Err(Error::InvalidInput {
                path: self.dir.clone(),
                reason: "the default dataset cannot be dropped".into(),
            });
        }
        match self.read().get(name).map(|n| n.id) {
            Some(held) if held <= id => {}
            _ => return Ok(()),
        }
        self.remove(name)?;
        tracing::info!("dropped dataset '{name}'");
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<()> {
        let disk = &self.runtime.disk;
        let parent = self.datasets_dir();
        let path = parent.join(name);
        let aside = parent.join(format!(".{name}.dropped"));
        if aside.exists() {
            disk.remove_tree(&aside).ctx("remove", &aside)?;
        }
        disk.rename(&path, &aside).ctx("rename aside", &path)?;
        sync_dir(disk, &parent)?;
        self.write().remove(name);
        disk.remove_tree(&aside).ctx("remove", &aside)?;
        // And what a move was building of it.
        for staged in crate::stage::staged_dirs(&path)? {
            disk.remove_tree(&staged).ctx("remove", &staged)?;
        }
        Ok(())
    }

    /// Adds `field` to dataset `name` (nothing if it has a field of that name and kind).
    pub fn add_field(&self, name: Option<&str>, field: FieldSpec) -> Result<()> {
        let _one = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        let shard = self.get(name).ok_or_else(|| Error::InvalidInput {
            path: self.datasets_dir(),
            reason: format!("no dataset '{}'", name.unwrap_or(DEFAULT)),
        })?;
        shard.add_field(field)
    }
}

/// Puts the named datasets back into the data directory `dir` if a switch of the default
/// dataset was cut short after carrying them into the directory built for the next map and
/// before swapping that one in (`Shard::switch`).
fn recover_named(disk: &Disk, dir: &Path) -> Result<()> {
    let named = dir.join(DATASETS_DIR);
    if named.exists() {
        return Ok(());
    }
    let mut beside = crate::stage::staged_dirs(dir)?;
    beside.push(crate::ship::ship_dir(dir)?);
    for staged in beside {
        let carried = staged.join(DATASETS_DIR);
        if carried.exists() {
            tracing::info!(
                "putting the named datasets back from {} (a switch or a rebuild cut short)",
                staged.display()
            );
            disk.rename(&carried, &named)
                .ctx("put the named datasets back", &carried)?;
            sync_dir(disk, &staged)?;
            sync_dir(disk, dir)?;
        }
    }
    Ok(())
}

fn read_kept(dir: &Path) -> Result<Kept> {
    let path = dir.join(DATASET_FILE);
    let bytes = std::fs::read(&path).ctx("read", &path)?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
        path,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zr_common::Record;
    use zr_node::meta::Compression;

    fn fields() -> Vec<FieldSpec> {
        vec![FieldSpec::new("x", Compression::Raw)]
    }

    fn append(shard: &Shard, rows: &[&[u8]]) {
        let store = &shard.serving().store;
        let records: Vec<Record> = rows.iter().map(|r| Record::new().with("x", r)).collect();
        store.append_many(&records).expect("append");
        store.commit().expect("commit");
    }

    fn rows(shard: &Shard) -> Vec<Vec<u8>> {
        let store = &shard.serving().store;
        let all: Vec<u64> = (0..store.len()).collect();
        crate::testkit::first_field(store, &all)
    }

    fn open(dir: &Path) -> Catalog {
        let store = if dir.exists() {
            Store::open(dir).expect("open")
        } else {
            Store::create(dir, fields(), CreateOptions::default()).expect("create")
        };
        let coordination =
            Coordination::open(&zr_node::disk::Disk::real(), dir).expect("coordination");
        if coordination.identity.map_version().is_none() {
            coordination.identity.admit("c", 1).expect("identity");
        }
        let root = Shard::new(store, coordination, RuntimeOptions::default()).expect("shard");
        Catalog::open(root, RuntimeOptions::default()).expect("catalog")
    }

    /// A dataset rebuilt from a snapshot's files is swapped in with this node's identity,
    /// the named datasets riding along with the default one; a rebuild cut short after the
    /// named datasets were carried into its directory gives them back at the next start,
    /// and its leftover is removed.
    #[test]
    fn a_rebuild_installs_a_snapshot_and_one_cut_short_is_undone() {
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("node");
        let catalog = open(&dir);
        catalog.create("a", 1, fields(), &[]).expect("create");
        append(&catalog.get(Some("a")).expect("a"), &[b"a0"]);
        // A partner's default dataset, as a snapshot's files.
        let partner = scratch.path().join("partner");
        let theirs = Store::create(&partner, fields(), CreateOptions::default()).expect("create");
        let records: Vec<Record> = [b"p0", b"p1", b"p2"]
            .iter()
            .map(|r| Record::new().with("x", *r))
            .collect();
        theirs.append_many(&records).expect("append");
        theirs.commit().expect("commit");
        let copy = |into: &Path| {
            for file in theirs.snapshot().expect("snapshot").files {
                let path = zr_node::ship::target_path(into, &file.name).expect("name");
                std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
                let bytes = file.read(0, file.len() as usize).expect("read");
                std::fs::write(path, bytes).expect("write");
            }
        };
        let building = crate::ship::ship_dir(&dir).expect("ship dir");
        copy(&building);
        catalog.root().install(&building).expect("install");
        assert_eq!(
            rows(catalog.root()),
            [b"p0".to_vec(), b"p1".into(), b"p2".into()]
        );
        assert_eq!(
            catalog.root().serving().coordination.identity.map_version(),
            Some(1)
        );
        assert!(!building.exists());
        drop(catalog);
        // Cut short: the named datasets carried into the rebuild's directory, no swap.
        copy(&building);
        std::fs::rename(dir.join(DATASETS_DIR), building.join(DATASETS_DIR)).expect("carry");
        let catalog = open(&dir);
        assert!(!building.exists(), "the leftover is removed");
        let a = catalog.get(Some("a")).expect("the named dataset is back");
        assert_eq!(rows(&a), [b"a0".to_vec()]);
        assert_eq!(
            rows(catalog.root()),
            [b"p0".to_vec(), b"p1".into(), b"p2".into()]
        );
    }

    #[test]
    fn each_dataset_switches_maps_on_its_own() {
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("node");
        let catalog = open(&dir);
        append(catalog.root(), &[b"d0", b"d1"]);
        catalog.create("a", 1, fields(), &[]).expect("create");
        let a = catalog.get(Some("a")).expect("a");
        append(&a, &[b"a0", b"a1", b"a2"]);

        // Both build slot 5 for map version 2, and switch one after the other.
        let root = Arc::clone(catalog.root());
        root.open_stage(2, &[5]).expect("open");
        let gained = [Record::new().with("x", b"r5")];
        let run = zr_proto::placement::Run {
            slot: 5,
            at: 0,
            count: 1,
        };
        root.stage(2, &[run], &gained, true).expect("stage");
        a.open_stage(2, &[5]).expect("open");
        // Built slots survive a restart.
        drop((root, a, catalog));
        let catalog = open(&dir);
        let a = catalog.get(Some("a")).expect("a");
        assert_eq!(a.open_stage(2, &[5]).expect("reopened"), [(5, 0)]);

        catalog.root().switch(2, &[(0, 2), (5, 1)]).expect("switch");
        assert_eq!(catalog.root().serving().store.units(), [(0, 2), (5, 1)]);
        // Untouched by the default dataset's switch, and found again after a restart.
        assert_eq!(rows(&a), [b"a0".to_vec(), b"a1".into(), b"a2".into()]);
        a.switch(2, &[(0, 3), (5, 0)]).expect("switch");
        drop((a, catalog));
        let catalog = open(&dir);
        let a = catalog.get(Some("a")).expect("a survives the switches");
        assert_eq!(rows(&a), [b"a0".to_vec(), b"a1".into(), b"a2".into()]);
        assert_eq!(a.serving().coordination.identity.map_version(), Some(2));
        assert_eq!(catalog.root().serving().store.units(), [(0, 2), (5, 1)]);
    }
}
