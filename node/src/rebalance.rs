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

use crate::disk;
use crate::error::{Error, IoContext, Result};
use crate::meta::{sync_dir, Meta};
use crate::runtime::RuntimeOptions;
use crate::store::{CreateOptions, Store};
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
pub fn rebalance(dir: &Path, mut progress: impl FnMut(u64, u64)) -> Result<RebalanceReport> {
    let dir = &fs::canonicalize(dir).ctx("resolve", dir)?;
    let old = Store::open(dir)?;
    let before = old.utilization()?;
    let meta = Meta::load(dir)?;
    let scratch = scratch_dir(dir)?;
    if scratch.exists() {
        disk::remove_tree(&scratch)
            .ctx("remove the leftover of an interrupted rebalance", &scratch)?;
    }
    let options = CreateOptions {
        chunk_records: meta.chunk_records,
        chunk_grow_bytes: meta.chunk_grow_bytes,
        offset_grow_entries: meta.offset_grow_entries,
    };
    // One writer: records land in index order, the layout `utilization` counts as live.
    let runtime = RuntimeOptions {
        writers: 1,
        ..RuntimeOptions::default()
    };
    let new = Store::create_with(&scratch, meta.fields.clone(), options, runtime)?;
    let names: Vec<&str> = meta.fields.iter().map(|f| f.name.as_str()).collect();
    let len = old.len();
    let mut first = 0;
    while first < len {
        let last = (first + STEP_RECORDS).min(len);
        let indices: Vec<u64> = (first..last).collect();
        let batch = old.gather_with(&indices, &[], crate::GatherOptions::verified())?;
        let columns: Vec<_> = batch.fields().collect();
        let records: Vec<Record> = (0..indices.len())
            .map(|k| {
                let mut record = Record::new();
                for (name, column) in names.iter().zip(&columns) {
                    record.set(name, column.get(k).unwrap_or_default());
                }
                record
            })
            .collect();
        new.append_many(&records)?;
        progress(last, len);
        first = last;
    }
    new.commit()?;
    let after = new.utilization()?;
    // The switch: both directories stay locked by this process until it is done.
    disk::exchange(&scratch, dir).ctx("swap in the rebalanced dataset", dir)?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    drop(old);
    drop(new);
    disk::remove_tree(&scratch).ctx("remove the old dataset", &scratch)?;
    Ok(RebalanceReport {
        before,
        after,
        records: len,
    })
}
