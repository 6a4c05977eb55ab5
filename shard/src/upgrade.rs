//! Converting a data directory written before nodes kept each slot as a unit of its own
//! (see [`crate::identity::LEGACY_LAYOUT`]): such a node kept a shard's records as one
//! sequence, record k being the shard's local index k under the map it was laid out by.
//! `zr-node` converts it when it starts, given that map (from the metadata store): dataset by
//! dataset, each rebuilt beside its directory in `.<name>.slotted` — record k appended to
//! its slot, in order, so its index in the slot is the one placement gives — then swapped
//! in whole with its identity (marked converted), fence and name. A crash leaves every
//! dataset either as it was or converted, and starting again goes on from there; the
//! named datasets, which live inside the default one's directory, are carried along its
//! swap and put back at the next start if a crash cut it short (`catalog`).

use std::path::{Path, PathBuf};

use crate::fence::Coordination;
use crate::identity::Identity;
use zr_common::Record;
use zr_node::meta::{sync_dir, Meta, META_FILE};
use zr_node::{Error, IoContext, Result};
use zr_node::{GatherOptions, RuntimeOptions, Store};
use zr_proto::placement::Placement;

/// Records copied per step of a conversion.
const STEP_RECORDS: u64 = 8192;

/// True if the data directory `dir` (a node's default dataset, with its named ones inside)
/// holds records in the older layout.
pub fn needed(dir: &Path) -> Result<bool> {
    Ok(legacy_datasets(dir)?.into_iter().any(|(_, len)| len > 0))
}

/// The datasets of `dir` in the older layout, named ones first, with their lengths.
fn legacy_datasets(dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut found = Vec::new();
    let named = dir.join(crate::catalog::DATASETS_DIR);
    if named.is_dir() {
        for entry in std::fs::read_dir(&named).ctx("list", &named)? {
            let path = entry.ctx("list", &named)?.path();
            let hidden = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if !hidden && path.join(META_FILE).exists() {
                found.push(path);
            }
        }
    }
    found.sort();
    if dir.join(META_FILE).exists() {
        found.push(dir.to_path_buf());
    }
    let mut legacy = Vec::new();
    for path in found {
        // The older layout kept the node's identity, without `slotted`; a data directory
        // with records and none at all is no layout of ours, and claiming it refuses it
        // by name (see `identity`).
        if path == dir && !dir.join(crate::identity::IDENTITY_FILE).exists() {
            continue;
        }
        if !Identity::open(&path)?.slotted() {
            let len = Meta::load(&path)?.length;
            legacy.push((path, len));
        }
    }
    Ok(legacy)
}

/// Converts every dataset of the data directory `dir`, shard `shard`'s, laid out by map
/// `placement` (the identity's map version must be its version). Returns the records
/// converted.
pub fn convert(
    dir: &Path,
    shard: u32,
    placement: &Placement,
    runtime: RuntimeOptions,
) -> Result<u64> {
    let disk = &runtime.disk;
    let identity = Identity::open(dir)?;
    if let Some(version) = identity.map_version().filter(|&v| v != placement.version()) {
        return Err(Error::InvalidInput {
            path: dir.to_path_buf(),
            reason: format!(
                "its data is laid out by map version {version}, and the cluster's map is version {}: a move switched the cluster while this node was away. Finish that move with the older build (run it again there), then start this one",
                placement.version()
            ),
        });
    }
    if placement.slots(shard).is_empty() {
        return Err(Error::InvalidInput {
            path: dir.to_path_buf(),
            reason: format!("shard {shard} owns no slot in map version {}, yet its node holds records in the older layout", placement.version()),
        });
    }
    // Named datasets carried into the default one's conversion by a start cut short.
    let carried = scratch_of(dir)?.join(crate::catalog::DATASETS_DIR);
    let named = dir.join(crate::catalog::DATASETS_DIR);
    if carried.exists() && !named.exists() {
        disk.rename(&carried, &named)
            .ctx("put the named datasets back", &carried)?;
        sync_dir(disk, dir)?;
    }
    let mut converted = 0;
    for (path, len) in legacy_datasets(dir)? {
        tracing::info!(
            "converting {} ({len} records) to one unit per slot",
            path.display()
        );
        converted += convert_dataset(&path, shard, placement, runtime.clone())?;
    }
    Ok(converted)
}

/// Where the dataset at `dir` is rebuilt.
fn scratch_of(dir: &Path) -> Result<PathBuf> {
    let name = dir.file_name().ok_or_else(|| Error::InvalidInput {
        path: dir.to_path_buf(),
        reason: "a dataset path must end in a directory name".into(),
    })?;
    Ok(dir.with_file_name(format!(".{}.slotted", name.to_string_lossy())))
}

/// Converts the dataset at `dir` (the default one carries the named ones inside it along).
fn convert_dataset(
    dir: &Path,
    shard: u32,
    placement: &Placement,
    runtime: RuntimeOptions,
) -> Result<u64> {
    let disk = runtime.disk.clone();
    let old = Store::open_with(dir, runtime.clone())?;
    let meta = Meta::load(dir)?;
    let scratch = scratch_of(dir)?;
    if scratch.exists() {
        disk.remove_tree(&scratch)
            .ctx("remove an unfinished conversion", &scratch)?;
    }
    let options = meta.create_options();
    let new = Store::create_with_dicts(
        &scratch,
        old.fields().to_vec(),
        options,
        runtime,
        &old.dicts(),
    )?;
    let len = old.len();
    let mut first = 0;
    while first < len {
        let last = (first + STEP_RECORDS).min(len);
        let indices: Vec<u64> = (first..last).collect();
        let batch = old.gather_with(&indices, &[], GatherOptions::verified())?;
        // Runs of one slot each, in local order, appended where placement puts them.
        let mut from = 0;
        for run in placement.runs(shard, first, last - first) {
            let records: Vec<Record> = (from..from + run.count as usize)
                .filter_map(|k| batch.record(k))
                .collect();
            from += run.count as usize;
            let range = new.append_to(run.slot, &records)?;
            if range.start != run.at {
                return Err(Error::Corrupt {
                    path: dir.to_path_buf(),
                    reason: format!(
                        "record {} of slot {} would be its record {}: the records are not as map version {} places them",
                        run.at,
                        run.slot,
                        range.start,
                        placement.version()
                    ),
                });
            }
        }
        first = last;
    }
    if !placement.slots(shard).contains(&0) {
        new.drop_unit(0)?;
    }
    new.commit()?;
    drop(new);
    // Swapped in with its identity (which says it is in this build's layout from then on),
    // fence and name, the default dataset carrying the named ones along.
    drop(old);
    let coordination = Coordination::open(&disk, dir)?;
    let version = coordination
        .identity
        .map_version()
        .unwrap_or(placement.version());
    crate::stage::swap_dirs(&disk, dir, &scratch, &coordination, version)?;
    disk.remove_tree(&scratch)
        .ctx("remove the dataset converted", &scratch)?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records in a directory with no identity at all are not taken for the older layout
    /// (that path converted them and then failed on an index out of range, leaving a
    /// scratch directory behind): nothing is converted, and claiming it refuses it by name.
    #[test]
    fn records_without_an_identity_are_not_an_older_layout() {
        let dir = tempfile::tempdir().expect("scratch");
        let store = Store::create(
            dir.path(),
            vec![zr_node::FieldSpec::raw("a")],
            zr_node::CreateOptions::default(),
        )
        .expect("create");
        for k in 0..100u32 {
            store
                .append(&Record::new().with("a", &k.to_le_bytes()))
                .expect("append");
        }
        store.commit().expect("commit");
        drop(store);
        assert!(!needed(dir.path()).expect("looked at"));
        let e = Identity::claim(dir.path(), 1, 0, 100).expect_err("no identity");
        assert!(e.to_string().contains("no identity.json"), "{e}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains("slotted"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
