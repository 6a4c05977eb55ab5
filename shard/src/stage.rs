//! A node's part in a shard move (`zr cluster add-shard` / `drain-shard`).
//!
//! A node keeps each slot it holds as a unit of its store (`zr_node::unit`), whose indices
//! no map changes: a move leaves the slots a node keeps as they are. The slots it gains are
//! built beside them as units of their own (`StageOpen`, then `Stage`), recorded in its
//! identity as staged: not served, not counted in its length, while it serves the current
//! map. When the router switches the cluster to the next map, the node checks every slot's
//! length, takes the version and drops the slots it gives (`Switch`). Each change is
//! recorded in the identity before it is made (the slots to drop first), so a node that
//! stops anywhere finishes it when it starts.
//!
//! Written before slots were kept apart, a move built the whole dataset for the next map in
//! `.<name>.map-v<version>` beside the data: such a leftover is removed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::fence::Coordination;
use crate::identity::StagedSlots;
use zr_common::Record;
use zr_node::disk::Disk;
use zr_node::meta::sync_dir;
use zr_node::RuntimeOptions;
use zr_node::Store;
use zr_node::{Error, IoContext, Result};
use zr_proto::placement::Run;

/// What a node serves now: its store and, kept in the store's directory, its identity and
/// fence.
pub struct Serving {
    pub store: Store,
    pub coordination: Coordination,
}

impl Serving {
    /// Refuses to `what` (e.g. "add the field") while a move builds slots on this node.
    fn refuse_while_staged(&self, what: &str) -> Result<()> {
        if self.coordination.identity.staged().is_none() {
            return Ok(());
        }
        Err(Error::InvalidInput {
            path: self.store.dir().to_path_buf(),
            reason: format!(
                "a shard move is building slots on this node: {what} once the move is done"
            ),
        })
    }
}

/// The records a node serves of `store`: every slot's but those a move is building.
pub fn served_len(store: &Store, coordination: &Coordination) -> u64 {
    let building: u64 = coordination
        .identity
        .staged()
        .iter()
        .flat_map(|s| &s.slots)
        .filter_map(|&slot| store.unit_len(slot))
        .sum();
    store.len() - building
}

/// A node's data, and the changes a move makes to which slots it holds (see the module
/// documentation).
pub struct Shard {
    current: ArcSwap<Serving>,
    /// Held by every change to which slots the node holds, and what depends on it.
    slots: Mutex<()>,
    runtime: RuntimeOptions,
}

/// The datasets for other maps beside the dataset at `dir`, whatever their version: what a
/// move of an older build left.
pub(crate) fn staged_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let name = dir.file_name().ok_or_else(|| Error::InvalidInput {
        path: dir.to_path_buf(),
        reason: "a dataset path must end in a directory name".into(),
    })?;
    let prefix = format!(".{}.map-v", name.to_string_lossy());
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

impl Shard {
    /// Serves `store` with `coordination`, finishing a change to its slots that a stop cut
    /// short.
    pub fn new(store: Store, coordination: Coordination, runtime: RuntimeOptions) -> Result<Shard> {
        let disk = &runtime.disk;
        let dropping = coordination.identity.dropping();
        if !dropping.is_empty() {
            tracing::info!(
                "dropping {} slots a switch or a move left to drop, from {}",
                dropping.len(),
                store.dir().display()
            );
            store.drop_units(&dropping)?;
            let identity = &coordination.identity;
            identity.change_slots(None, identity.staged(), Vec::new())?;
        }
        for leftover in staged_dirs(store.dir())? {
            tracing::info!("removing {} (an older build's move)", leftover.display());
            disk.remove_tree(&leftover)
                .ctx("remove an older build's move", &leftover)?;
        }
        Ok(Shard {
            current: ArcSwap::from_pointee(Serving {
                store,
                coordination,
            }),
            slots: Mutex::new(()),
            runtime,
        })
    }

    /// What the node serves now.
    pub fn serving(&self) -> Arc<Serving> {
        self.current.load_full()
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, ()> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True if the node holds nothing, under any map: `serving` (what a request found the
    /// node serving) is what it serves still, its store is empty, and no move builds slots
    /// here.
    pub fn holds_nothing(&self, serving: &Coordination) -> bool {
        let _held = self.lock_slots();
        let current = self.serving();
        std::ptr::eq(&current.coordination, serving)
            && current.store.is_empty()
            && current.coordination.identity.staged().is_none()
    }

    /// Starts (or goes on with) building `slots`, the slots this node gains with map
    /// `version`; slots built for another move and not for this one are dropped. Returns
    /// the length of each.
    pub fn open_stage(&self, version: u64, slots: &[u32]) -> Result<Vec<(u32, u64)>> {
        let _held = self.lock_slots();
        let serving = self.serving();
        let identity = &serving.coordination.identity;
        let before = identity.staged();
        let building: &[u32] = before.as_ref().map_or(&[], |s| &s.slots);
        // A slot it holds records of is served (an empty one is what a new store has).
        if let Some(&slot) = slots.iter().find(|&&slot| {
            !building.contains(&slot) && serving.store.unit_len(slot).is_some_and(|n| n > 0)
        }) {
            return Err(Error::InvalidRecord(format!(
                "a move to map version {version} gives this node slot {slot}, which it holds already"
            )));
        }
        let abandoned: Vec<u32> = building
            .iter()
            .copied()
            .filter(|slot| !slots.contains(slot))
            .collect();
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let staged = StagedSlots {
            version,
            slots: sorted,
        };
        if before.as_ref() != Some(&staged) {
            identity.change_slots(None, Some(staged.clone()), abandoned.clone())?;
            if !abandoned.is_empty() {
                serving.store.drop_units(&abandoned)?;
                identity.change_slots(None, Some(staged.clone()), Vec::new())?;
            }
        }
        Ok(staged
            .slots
            .iter()
            .map(|&slot| (slot, serving.store.unit_len(slot).unwrap_or(0)))
            .collect())
    }

    /// Sets records of slots the move to map `version` builds here: per run, its slot's
    /// records from index `at` on to the run's share of `records`, in turn (what a slot held
    /// from there on is dropped first: a resumed move sends it again). With `commit`,
    /// everything built so far is made durable. Returns each run's slot's length.
    pub fn stage(
        &self,
        version: u64,
        runs: &[Run],
        records: &[Record<'_>],
        commit: bool,
    ) -> Result<Vec<(u32, u64)>> {
        let _held = self.lock_slots();
        let serving = self.serving();
        let staged = serving.coordination.identity.staged();
        let store = &serving.store;
        for run in runs {
            let slot = run.slot;
            if !staged
                .as_ref()
                .is_some_and(|s| s.version == version && s.slots.contains(&slot))
            {
                return Err(Error::InvalidRecord(format!(
                    "this node builds no slot {slot} for map version {version} (the move must open it first)"
                )));
            }
            let have = store.unit_len(slot).unwrap_or(0);
            if run.at > have {
                return Err(Error::InvalidRecord(format!(
                    "records of slot {slot} from {} on, but this node holds only {have} of them",
                    run.at
                )));
            }
        }
        let mut next = 0;
        let mut lens = Vec::with_capacity(runs.len());
        for run in runs {
            let end = next + run.count as usize;
            let part = records.get(next..end).ok_or_else(|| {
                Error::InvalidRecord("fewer records received than the runs hold".into())
            })?;
            store.truncate_unit(run.slot, run.at)?;
            store.append_to(run.slot, part)?;
            lens.push((run.slot, store.unit_len(run.slot).unwrap_or(0)));
            next = end;
        }
        if commit {
            // Kept: a node restarted mid-move goes on from here.
            store.commit()?;
        }
        Ok(lens)
    }

    /// Adds `field` to the dataset served (nothing if it has a field of that name and
    /// compression); refused while a move builds slots here.
    pub fn add_field(&self, field: zr_node::meta::FieldSpec) -> Result<()> {
        let _held = self.lock_slots();
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
        serving.refuse_while_staged("add the field")?;
        let store = serving.store.add_field(field)?;
        let dir = store.dir().to_path_buf();
        let coordination =
            Coordination::open_as(store.disk(), &dir, serving.coordination.incarnation)?;
        self.current.store(Arc::new(Serving {
            store,
            coordination,
        }));
        Ok(())
    }

    /// Serves map `version` from now on, holding the slots `slots` with these lengths: the
    /// ones built for it become served, every other slot is dropped. Refused, changing
    /// nothing, if a slot's length differs. Done already: only what is left to drop.
    pub fn switch(&self, version: u64, slots: &[(u32, u64)]) -> Result<()> {
        let _held = self.lock_slots();
        let serving = self.serving();
        let identity = &serving.coordination.identity;
        let store = &serving.store;
        if identity.map_version() != Some(version) {
            for &(slot, want) in slots {
                let have = store.unit_len(slot).unwrap_or(0);
                if have != want {
                    return Err(Error::InvalidRecord(format!(
                        "slot {slot} holds {have} records here, not the {want} the switch to map version {version} needs"
                    )));
                }
            }
            // What it builds, durable before it is served.
            store.commit()?;
        }
        let given: Vec<u32> = store
            .units()
            .into_iter()
            .map(|(unit, _)| unit)
            .filter(|unit| !slots.iter().any(|&(slot, _)| slot == *unit))
            .collect();
        if identity.map_version() == Some(version) && given.is_empty() {
            return Ok(());
        }
        identity.change_slots(Some(version), None, given.clone())?;
        store.drop_units(&given)?;
        identity.change_slots(None, None, Vec::new())?;
        tracing::info!(
            "serving map version {version}: {} slots, {} records, in {}",
            slots.len(),
            store.len(),
            store.dir().display()
        );
        Ok(())
    }

    /// Takes slots `slots`, which the move under way builds here, from `source`: a copy of
    /// another node's files of them (see `ship`); they must hold nothing here yet.
    pub fn adopt(&self, source: &Path, slots: &[u32]) -> Result<()> {
        let _held = self.lock_slots();
        let serving = self.serving();
        let staged = serving.coordination.identity.staged();
        if let Some(&slot) = slots
            .iter()
            .find(|s| !staged.as_ref().is_some_and(|b| b.slots.contains(s)))
        {
            return Err(Error::InvalidRecord(format!(
                "this node builds no slot {slot} (the move must open it first)"
            )));
        }
        serving.store.adopt_units(source, slots)
    }

    /// Serves the dataset in `path` — a rebuild's copy of a partner's files — instead of the
    /// current one, under the same map; refused while a move builds slots here.
    pub fn install(&self, path: &Path) -> Result<()> {
        let _held = self.lock_slots();
        let serving = self.serving();
        serving.refuse_while_staged("rebuild it")?;
        let version = serving.coordination.identity.map_version().ok_or_else(|| {
            Error::InvalidRecord("this node belongs to no cluster yet: nothing to rebuild".into())
        })?;
        self.swap_in(&serving, path, version)
    }

    /// Swaps the dataset in `path` in for `serving`'s, as the data of map `version`, and
    /// serves it; the one it replaces is removed.
    fn swap_in(&self, serving: &Serving, path: &Path, version: u64) -> Result<()> {
        let disk = &self.runtime.disk;
        let dir = serving.store.dir().to_path_buf();
        swap_dirs(disk, &dir, path, &serving.coordination, version)?;
        let store = Store::open_with(&dir, self.runtime.clone())?
            .with_gather_options(serving.store.gather_options());
        let coordination = Coordination::open_as(disk, &dir, serving.coordination.incarnation)?;
        self.current.store(Arc::new(Serving {
            store,
            coordination,
        }));
        disk.remove_tree(path)
            .ctx("remove the dataset swapped out", path)?;
        Ok(())
    }
}

/// Swaps the dataset built in `built` in for the one at `dir` (whose identity and fence are
/// `coordination`), as the data of map `version`: the identity, fence and name that go with
/// the data, the named datasets that live inside the default one's directory (each is
/// swapped on its own), then one directory exchange; the one swapped out is left in
/// `built`. A crash between carrying the named datasets and the exchange leaves them in
/// `built`, where the node finds them when it starts (`catalog::recover_named`, `upgrade`).
pub(crate) fn swap_dirs(
    disk: &Disk,
    dir: &Path,
    built: &Path,
    coordination: &Coordination,
    version: u64,
) -> Result<()> {
    coordination.identity.copy_to(built, version)?;
    coordination.fence.copy_to(built)?;
    let kept = dir.join(crate::catalog::DATASET_FILE);
    if kept.exists() {
        let bytes = std::fs::read(&kept).ctx("read", &kept)?;
        zr_node::meta::write_atomically(disk, built, crate::catalog::DATASET_FILE, &bytes)?;
    }
    let named = dir.join(crate::catalog::DATASETS_DIR);
    if named.exists() {
        let carried = built.join(crate::catalog::DATASETS_DIR);
        disk.rename(&named, &carried)
            .ctx("carry the named datasets along", &named)?;
        sync_dir(disk, dir)?;
        sync_dir(disk, built)?;
    }
    disk.exchange(built, dir)
        .ctx("swap in the dataset built", dir)?;
    if let Some(parent) = dir.parent() {
        sync_dir(disk, parent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zr_node::meta::{Compression, FieldSpec};
    use zr_node::unit::address;
    use zr_node::CreateOptions;

    /// A node holding `records` in each of `slots`.
    fn shard_with(dir: &Path, slots: &[(u32, &[&[u8]])]) -> Shard {
        let fields = vec![FieldSpec::new("x", Compression::Flate)];
        let store = Store::create(dir, fields, CreateOptions::default()).expect("create");
        for &(slot, records) in slots {
            let rows: Vec<Record> = records.iter().map(|r| Record::new().with("x", r)).collect();
            store.append_to(slot, &rows).expect("append");
        }
        store.commit().expect("commit");
        let coordination = Coordination::open(&Disk::real(), dir).expect("coordination");
        coordination.identity.admit("c", 1).expect("identity");
        Shard::new(store, coordination, RuntimeOptions::default()).expect("shard")
    }

    fn shard_with_existing(dir: &Path) -> Shard {
        let store = Store::open(dir).expect("open");
        let coordination = Coordination::open(&Disk::real(), dir).expect("coordination");
        Shard::new(store, coordination, RuntimeOptions::default()).expect("shard")
    }

    /// Slot `slot`'s records.
    fn rows(shard: &Shard, slot: u32) -> Vec<Vec<u8>> {
        let store = &shard.serving().store;
        let len = store.unit_len(slot).unwrap_or(0);
        let all: Vec<u64> = (0..len).map(|i| address(slot, i)).collect();
        crate::testkit::first_field(store, &all)
    }

    /// The records `shard` serves.
    fn served(shard: &Shard) -> u64 {
        let serving = shard.serving();
        served_len(&serving.store, &serving.coordination)
    }

    /// Stages `records` into slot `slot` from `at` on: one run.
    fn stage_one(
        shard: &Shard,
        version: u64,
        slot: u32,
        at: u64,
        records: &[Record<'_>],
        commit: bool,
    ) -> Result<u64> {
        let run = Run {
            slot,
            at,
            count: records.len() as u64,
        };
        let lens = shard.stage(version, &[run], records, commit)?;
        Ok(lens[0].1)
    }

    fn records<'a>(rows: &[&'a [u8]]) -> Vec<Record<'a>> {
        rows.iter().map(|r| Record::new().with("x", r)).collect()
    }

    #[test]
    fn a_node_builds_the_slots_it_gains_and_drops_those_it_gives() {
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("shard");
        let shard = shard_with(&dir, &[(3, &[b"a0", b"a1"]), (8, &[b"b0"])]);
        assert!(!shard.holds_nothing(&shard.serving().coordination));
        assert_eq!(shard.open_stage(2, &[5]).expect("open"), [(5, 0)]);
        let e = stage_one(&shard, 3, 5, 0, &[], false).unwrap_err();
        assert!(
            e.to_string().contains("builds no slot 5 for map version 3"),
            "{e}"
        );
        let e = stage_one(&shard, 2, 6, 0, &[], false).unwrap_err();
        assert!(e.to_string().contains("builds no slot 6"), "{e}");
        assert_eq!(
            stage_one(&shard, 2, 5, 0, &records(&[b"g0", b"g1"]), true).expect("stage"),
            2
        );
        let e = stage_one(&shard, 2, 5, 7, &[], false).unwrap_err();
        assert!(e.to_string().contains("holds only 2"), "{e}");
        // Built while the node serves its own slots, uncounted.
        assert_eq!(served(&shard), 3);
        assert_eq!(rows(&shard, 3), [b"a0".to_vec(), b"a1".into()]);
        let e = shard.open_stage(2, &[3]).unwrap_err();
        assert!(e.to_string().contains("holds already"), "{e}");

        let e = shard.switch(2, &[(3, 2), (5, 3)]).unwrap_err();
        assert!(
            e.to_string()
                .contains("slot 5 holds 2 records here, not the 3"),
            "{e}"
        );
        shard.switch(2, &[(3, 2), (5, 2)]).expect("switch");
        assert_eq!(shard.serving().store.units(), [(3, 2), (5, 2)]);
        assert_eq!(served(&shard), 4);
        assert_eq!(rows(&shard, 5), [b"g0".to_vec(), b"g1".into()]);
        assert_eq!(shard.serving().coordination.identity.map_version(), Some(2));
        shard.switch(2, &[(3, 2), (5, 2)]).expect("done already");

        // Kept across a restart: the slots, and the map they are served by.
        drop(shard);
        let shard = shard_with_existing(&dir);
        assert_eq!(shard.serving().store.units(), [(3, 2), (5, 2)]);
        assert_eq!(shard.serving().coordination.identity.map_version(), Some(2));
        assert_eq!(shard.serving().coordination.identity.staged(), None);
    }

    #[test]
    fn built_slots_survive_a_restart_and_an_abandoned_moves_go() {
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("shard");
        let shard = shard_with(&dir, &[(0, &[b"a", b"b"])]);
        shard.open_stage(2, &[4, 9]).expect("open");
        stage_one(&shard, 2, 4, 0, &records(&[b"x"]), true).expect("stage");
        // Not durable: lost with the process.
        stage_one(&shard, 2, 9, 0, &records(&[b"y"]), false).expect("stage");
        drop(shard);
        let shard = shard_with_existing(&dir);
        assert_eq!(
            shard.open_stage(2, &[4, 9]).expect("reopen"),
            [(4, 1), (9, 0)]
        );
        // A move to another map drops the slots it does not gain.
        assert_eq!(shard.open_stage(3, &[9]).expect("another move"), [(9, 0)]);
        assert_eq!(shard.serving().store.unit_len(4), None);
        shard.switch(3, &[(0, 2), (9, 0)]).expect("switch");
        assert_eq!(rows(&shard, 0), [b"a".to_vec(), b"b".into()]);
    }

    /// A switch cut short after it recorded what to drop is finished when the node starts.
    #[test]
    fn a_switch_cut_short_is_finished_at_start() {
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("shard");
        let shard = shard_with(&dir, &[(1, &[b"k"]), (2, &[b"gone"])]);
        shard
            .serving()
            .coordination
            .identity
            .change_slots(Some(2), None, vec![2])
            .expect("what a switch records first");
        drop(shard);
        let shard = shard_with_existing(&dir);
        // (A new store's unit 0, empty, stays.)
        assert_eq!(shard.serving().store.units(), [(0, 0), (1, 1)]);
        assert!(shard.serving().coordination.identity.dropping().is_empty());
    }

    /// The node addresses placement gives are the engine's: slot = unit.
    #[test]
    fn placement_addresses_are_the_engines() {
        use zr_proto::placement::{split_address, unit_address, UNIT_SHIFT};
        assert_eq!(UNIT_SHIFT, zr_node::unit::UNIT_SHIFT);
        for (slot, index) in [(0, 0), (3, 77), (1023, (1 << 40) + 5)] {
            assert_eq!(unit_address(slot, index), address(slot, index));
            assert_eq!(split_address(address(slot, index)), (slot, index));
        }
    }

    #[test]
    fn an_empty_node_holds_nothing_until_it_builds() {
        let scratch = tempfile::tempdir().expect("scratch");
        let dir = scratch.path().join("new");
        let shard = shard_with(&dir, &[]);
        let before = shard.serving();
        assert!(shard.holds_nothing(&before.coordination));
        // A new store's empty unit 0 does not stop it from gaining slot 0.
        shard.open_stage(2, &[0, 7]).expect("open");
        assert!(!shard.holds_nothing(&before.coordination));
        shard.switch(2, &[(0, 0), (7, 0)]).expect("switch");
        assert!(shard.holds_nothing(&shard.serving().coordination));
    }
}
