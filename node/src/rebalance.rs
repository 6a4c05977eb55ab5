//! `rebalance`: rewrite the live records into fresh chunks and switch atomically.
//!
//! Modify and delete leave dead payloads in their chunks. Rebalance copies the live records,
//! in index order, into a new dataset beside the old one (`.<name>.rebalance`), commits it,
//! then swaps the two directories with one `renameat2(RENAME_EXCHANGE)` — atomic, so a crash
//! at any moment leaves either the old dataset or the new one, whole, at the dataset's path —
//! and finally deletes the old one. A leftover from an interrupted run is removed first.
//! Only ever run by hand: it needs the dataset to itself and twice its live size on disk.

use std::fs;
use std::path::{Path, PathBuf};

use crate::disk::Disk;
use crate::error::{Error, IoContext, Result};
use crate::meta::{sync_dir, Meta};
use crate::runtime::RuntimeOptions;
use crate::store::Store;
use crate::unit::address;
use crate::verify::Utilization;
use zr_common::Record;

/// Records copied per step.
const STEP_RECORDS: u64 = 1024;

/// What a rebalance did.
#[derive(Clone, Copy, Debug)]
pub struct RebalanceReport {
    /// Before.
    pub before: Utilization,
    /// After.
    pub after: Utilization,
    /// Records copied.
    pub records: u64,
}

/// The scratch directory a rebalance of `dir` builds in.
pub fn scratch_dir(dir: &Path) -> Result<PathBuf> {
    let name = dir.file_name().ok_or_else(|| Error::InvalidInput {
        path: dir.to_path_buf(),
        reason: "a dataset path must end in a directory name".into(),
    })?;
    let mut scratch = std::ffi::OsString::from(".");
    scratch.push(name);
    scratch.push(".rebalance");
    Ok(dir.with_file_name(scratch))
}

/// Rebalances the dataset at `dir`; `progress` gets the records copied so far.
pub fn rebalance(dir: &Path, progress: impl FnMut(u64, u64)) -> Result<RebalanceReport> {
    rebalance_on(&Disk::real(), dir, progress)
}

/// [`rebalance`], its changes to the files going through `disk` (a test's power-cut
/// recorder, see [`crate::disk::PowerCut`]).
pub fn rebalance_on(
    disk: &Disk,
    dir: &Path,
    progress: impl FnMut(u64, u64),
) -> Result<RebalanceReport> {
    rewrite(disk, dir, |_, _| Ok(None), progress)
}

/// What a dictionary training did.
#[derive(Clone, Copy, Debug)]
pub struct DictReport {
    /// The rewrite.
    pub rewrite: RebalanceReport,
    /// The dictionary's id and size.
    pub id: u32,
    pub bytes: usize,
    /// Records it was trained on.
    pub samples: usize,
}

/// Trains a zstd dictionary of at most `max_bytes` for field `field` of the dataset at `dir`
/// on a sample of its records (spread over the whole dataset), and rewrites the dataset with
/// the field stored zstd (at `level`, or the field's own) with it, as [`rebalance`] does:
/// offline, atomic. `progress` gets the records copied so far.
pub fn train_dict(
    dir: &Path,
    field: &str,
    max_bytes: usize,
    level: Option<i32>,
    progress: impl FnMut(u64, u64),
) -> Result<DictReport> {
    let mut trained = None;
    let rewrite = rewrite(
        &Disk::real(),
        dir,
        |old, fields| {
            let spec =
                fields
                    .iter_mut()
                    .find(|f| f.name == field)
                    .ok_or_else(|| Error::UnknownField {
                        name: field.to_string(),
                        known: old
                            .fields()
                            .iter()
                            .map(|f| f.name.clone())
                            .collect::<Vec<_>>()
                            .join(", "),
                    })?;
            if spec.dtype.is_some() && spec.shape.is_some() {
                return Err(Error::InvalidSchema(format!(
                    "field '{field}' has records of one fixed size ({}): a dictionary is for varied records",
                    spec.describe_type()
                )));
            }
            let len = old.len();
            if len == 0 {
                return Err(Error::InvalidRecord(format!(
                    "the dataset is empty: there are no records of field '{field}' to train a dictionary on"
                )));
            }
            // Evenly spread records, up to SAMPLE_BYTES_MAX of them.
            let step = (len / 100_000).max(1);
            let indices: Vec<u64> = (0..len).step_by(step as usize).collect();
            let batch = old.gather_with(&indices, &[field], crate::GatherOptions::verified())?;
            let column = batch.field(field).ok_or_else(|| Error::UnknownField {
                name: field.to_string(),
                known: String::new(),
            })?;
            let samples = crate::dict::spread_samples(indices.len() as u64, |k| {
                column.get(k as usize).unwrap_or_default()
            });
            let dict = crate::dict::train(&samples, max_bytes)?;
            spec.compress = crate::meta::Compression::Zstd;
            spec.level = level.or(spec.level);
            trained = Some((
                crate::dict::id(&dict).unwrap_or_default(),
                dict.len(),
                samples.len(),
            ));
            Ok(Some((field.to_string(), dict)))
        },
        progress,
    )?;
    let (id, bytes, samples) = trained.unwrap_or_default();
    Ok(DictReport {
        rewrite,
        id,
        bytes,
        samples,
    })
}

/// Rewrites the dataset at `dir` into fresh chunks, its fields as `change` leaves them
/// (given the open dataset and its fields; it may return a new dictionary for a field),
/// the other fields' dictionaries kept.
fn rewrite(
    disk: &Disk,
    dir: &Path,
    change: impl FnOnce(&Store, &mut Vec<crate::meta::FieldSpec>) -> Result<Option<(String, Vec<u8>)>>,
    mut progress: impl FnMut(u64, u64),
) -> Result<RebalanceReport> {
    let dir = &fs::canonicalize(dir).ctx("resolve", dir)?;
    let on_disk = RuntimeOptions {
        disk: disk.clone(),
        ..RuntimeOptions::default()
    };
    let old = Store::open_with(dir, on_disk.clone())?;
    let before = old.utilization()?;
    let meta = Meta::load(dir)?;
    let mut fields = meta.fields.clone();
    let added = change(&old, &mut fields)?;
    let mut dicts = Vec::new();
    for spec in &mut fields {
        if let Some((name, dict)) = added.as_ref().filter(|(name, _)| name == &spec.name) {
            dicts.push((name.clone(), dict.clone()));
        } else if let Some(dict) = crate::dict::load(dir, spec)? {
            dicts.push((spec.name.clone(), dict.to_vec()));
        }
    }
    let scratch = scratch_dir(dir)?;
    if scratch.exists() {
        disk.remove_tree(&scratch)
            .ctx("remove the leftover of an interrupted rebalance", &scratch)?;
    }
    let options = meta.create_options();
    // One writer: records land in index order, the layout `utilization` counts as live.
    let runtime = RuntimeOptions {
        writers: 1,
        ..on_disk
    };
    let new = Store::create_with_dicts(&scratch, fields.clone(), options, runtime, &dicts)?;
    let len = old.len();
    let mut done = 0;
    // Unit by unit (a dataset on one host has one): each keeps its indices.
    let steps: Vec<(u32, u64, u64)> = old
        .units()
        .into_iter()
        .flat_map(|(unit, len)| {
            let steps = (0..len)
                .step_by(STEP_RECORDS as usize)
                .map(move |first| (unit, first, (first + STEP_RECORDS).min(len)));
            // An empty unit is kept too.
            std::iter::once((unit, 0, 0)).chain(steps)
        })
        .collect();
    for (unit, first, last) in steps {
        let indices: Vec<u64> = (first..last).map(|i| address(unit, i)).collect();
        let batch = old.gather_with(&indices, &[], crate::GatherOptions::verified())?;
        let records: Vec<Record> = (0..indices.len()).filter_map(|k| batch.record(k)).collect();
        new.append_to(unit, &records)?;
        done += last - first;
        progress(done, len);
    }
    if old.unit_len(0).is_none() {
        new.drop_unit(0)?;
    }
    new.commit()?;
    let after = new.utilization()?;
    // The switch: both directories stay locked by this process until it is done.
    disk.exchange(&scratch, dir)
        .ctx("swap in the rebalanced dataset", dir)?;
    if let Some(parent) = dir.parent() {
        sync_dir(disk, parent)?;
    }
    drop(old);
    drop(new);
    disk.remove_tree(&scratch)
        .ctx("remove the old dataset", &scratch)?;
    Ok(RebalanceReport {
        before,
        after,
        records: len,
    })
}
