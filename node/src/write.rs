//! The public write API: append, modify, delete, commit. See `writer` for how writes are
//! made durable and visible.

use std::ops::Range;
use std::sync::atomic::Ordering;

use rayon::prelude::*;
use zr_common::Record;

use std::path::Path;

use crate::error::{Error, IoContext, Result};
use crate::meta::Meta;
use crate::offset::Entry;
use crate::store::Store;
use crate::unit::{address, chunk_unit, split, UNIT_INDEX_LIMIT};
use crate::view::{Published, View};
use crate::writer::{no_entries, Writers};

/// What dropped units' files are moved into (`.dropped-<generation>`), inside the dataset
/// directory, until removed; an open removes any left.
pub(crate) const TRASH_PREFIX: &str = ".dropped-";

/// Removes the folder `trash` on a thread of its own (at the next open if this fails).
fn remove_in_background(disk: crate::disk::Disk, trash: std::path::PathBuf) {
    // Without a thread, left for the next open.
    let _ = std::thread::Builder::new()
        .name("zr-drop".into())
        .spawn(move || {
            if let Err(e) = disk.remove_tree_if_present(&trash) {
                tracing::warn!(
                    "removing {}: {e} (removed at the next open)",
                    trash.display()
                );
            }
        });
}

/// Puts the entries of `count` records just encoded for unit `unit` after its last record;
/// returns their indices in the unit.
fn put_run(
    inner: &crate::view::Core,
    shared: &mut crate::writer::Shared,
    unit: u32,
    count: usize,
    entries: &[Vec<Entry>],
) -> Result<Range<u64>> {
    // A unit dropped meanwhile is made again, empty.
    shared.ensure_unit(inner, unit)?;
    let start = inner.read_view().len_of(unit);
    let end = start + count as u64;
    if end > UNIT_INDEX_LIMIT {
        return Err(Error::InvalidRecord(format!(
            "unit {unit} would pass its {UNIT_INDEX_LIMIT} records"
        )));
    }
    shared.put_entries(inner, address(unit, start), entries, Some(end))?;
    Ok(start..end)
}

/// Appends of fewer records than this stay on one writer.
const PARALLEL_APPEND_MIN: usize = 64;

impl Store {
    pub(crate) fn writers(&self) -> Result<&Writers> {
        let Some(writers) = &self.inner.writers else {
            return Err(Error::ReadOnly {
                path: self.inner.dir.clone(),
            });
        };
        if let Some(why) = &writers.shared().failed {
            return Err(Error::Corrupt {
                path: self.inner.dir.clone(),
                reason: why.clone(),
            });
        }
        Ok(writers)
    }

    /// Checks `record` against the schema and orders its payloads by field position; a
    /// field it does not name is `None`.
    fn named_payloads<'r>(&self, record: &Record<'r>) -> Result<Vec<Option<&'r [u8]>>> {
        let mut out = vec![None; self.inner.fields.len()];
        for &(name, payload) in record.values() {
            let id = self.field_id(name)?;
            if out[id].is_some() {
                return Err(Error::InvalidRecord(format!(
                    "field '{name}' is given twice"
                )));
            }
            if payload.len() > u32::MAX as usize {
                return Err(Error::InvalidRecord(format!(
                    "field '{name}': {} bytes exceed the 4 GiB record limit",
                    payload.len()
                )));
            }
            let spec = &self.inner.fields[id];
            if let Some(expected) = spec.record_bytes() {
                if !payload.is_empty() && payload.len() as u64 != expected {
                    return Err(Error::InvalidRecord(format!(
                        "field '{name}' holds {expected} bytes per record ({}); got {}",
                        spec.describe_type(),
                        payload.len()
                    )));
                }
            }
            out[id] = Some(payload);
        }
        Ok(out)
    }

    /// A typed field of fixed, non-zero length is in every record: a record without it
    /// could not be told from a zeroed offset entry. Refuses an empty payload for one, and
    /// with `whole` (a record as appended, not a change to one) a missing one.
    fn check_typed(&self, payloads: &[Option<&[u8]>], whole: bool) -> Result<()> {
        for (spec, payload) in self.inner.fields.iter().zip(payloads) {
            if let Some(expected) = spec.record_bytes().filter(|&n| n > 0) {
                let lacking = match payload {
                    None => whole,
                    Some(p) => p.is_empty(),
                };
                if lacking {
                    return Err(Error::InvalidRecord(format!(
                        "field '{}' holds {expected} bytes per record ({}): every record needs it",
                        spec.name,
                        spec.describe_type()
                    )));
                }
            }
        }
        Ok(())
    }

    /// A record to append, checked: every field named or absent, typed ones present.
    fn payloads<'r>(&self, record: &Record<'r>) -> Result<Vec<Option<&'r [u8]>>> {
        let out = self.named_payloads(record)?;
        self.check_typed(&out, true)?;
        Ok(out)
    }

    /// Appends one record; returns its index.
    pub fn append(&self, record: &Record) -> Result<u64> {
        Ok(self.append_many(std::slice::from_ref(record))?.start)
    }

    /// Appends records in order; returns their index range. All are checked before any is
    /// written, so a bad record rejects the whole call. Large calls are encoded by several
    /// writers at once.
    pub fn append_many(&self, records: &[Record]) -> Result<Range<u64>> {
        self.append_to(0, records)
    }

    /// [`Store::append_many`] into unit `unit` (see [`crate::unit`]), made if the dataset
    /// lacks it; returns the records' indices inside the unit.
    pub fn append_to(&self, unit: u32, records: &[Record]) -> Result<Range<u64>> {
        let payloads: Vec<_> = records
            .iter()
            .map(|r| self.payloads(r))
            .collect::<Result<_>>()?;
        let inner = &*self.inner;
        let writers = self.writers()?;
        let fields = inner.fields.len();
        // A unit other than 0 stays on its one writer, so that it keeps one open chunk (a
        // node holds hundreds; [`Store::append_runs`] writes several at once instead).
        let parts = if records.len() >= PARALLEL_APPEND_MIN && unit == 0 {
            writers.slots.len()
        } else {
            1
        };
        writers.shared().ensure_unit(inner, unit)?;
        let mut entries = no_entries(fields, records.len());
        match inner.runtime.writers().filter(|_| parts > 1) {
            None => writers
                .slot_for(unit)
                .encode(inner, writers, unit, &payloads, &mut entries)?,
            Some(pool) => {
                let part_len = payloads.len().div_ceil(parts);
                let encoded: Vec<Vec<Vec<Entry>>> = pool.install(|| {
                    payloads
                        .par_chunks(part_len)
                        .enumerate()
                        .map(|(i, part)| {
                            let mut part_entries = no_entries(fields, part.len());
                            writers.slot(i).encode(
                                inner,
                                writers,
                                unit,
                                part,
                                &mut part_entries,
                            )?;
                            Ok(part_entries)
                        })
                        .collect::<Result<_>>()
                })?;
                for part in encoded {
                    for (all, mine) in entries.iter_mut().zip(part) {
                        all.extend(mine);
                    }
                }
            }
        }
        put_run(inner, &mut writers.shared(), unit, records.len(), &entries)
    }

    /// Appends each run's records to its unit (made if the dataset lacks it), in order: the
    /// runs of different units are encoded by several writers at once (each unit by the
    /// writer it stays on), which is how a cluster node takes an append of many slots. All
    /// records are checked before any is written; returns each run's first index.
    pub fn append_runs(&self, runs: &[(u32, &[Record])]) -> Result<Vec<u64>> {
        let payloads: Vec<Vec<_>> = runs
            .iter()
            .map(|(_, records)| records.iter().map(|r| self.payloads(r)).collect())
            .collect::<Result<_>>()?;
        let inner = &*self.inner;
        let writers = self.writers()?;
        let fields = inner.fields.len();
        {
            let mut shared = writers.shared();
            for &(unit, _) in runs {
                shared.ensure_unit(inner, unit)?;
            }
        }
        let total: usize = runs.iter().map(|(_, r)| r.len()).sum();
        let encode = |k: usize| -> Result<Vec<Vec<Entry>>> {
            let unit = runs[k].0;
            let mut entries = no_entries(fields, payloads[k].len());
            writers
                .slot_for(unit)
                .encode(inner, writers, unit, &payloads[k], &mut entries)?;
            Ok(entries)
        };
        let pool = inner
            .runtime
            .writers()
            .filter(|_| total >= PARALLEL_APPEND_MIN && writers.slots.len() > 1);
        let encoded: Vec<Vec<Vec<Entry>>> = match pool {
            None => (0..runs.len()).map(encode).collect::<Result<_>>()?,
            Some(pool) => {
                // One task per writer, taking its units' runs in order.
                let of_writer = |k: usize| match runs[k].0 {
                    0 => 0,
                    unit => unit as usize % writers.slots.len(),
                };
                let done: Vec<Vec<(usize, Vec<Vec<Entry>>)>> = pool.install(|| {
                    (0..writers.slots.len())
                        .into_par_iter()
                        .map(|w| {
                            (0..runs.len())
                                .filter(|&k| of_writer(k) == w)
                                .map(|k| Ok((k, encode(k)?)))
                                .collect::<Result<Vec<_>>>()
                        })
                        .collect::<Result<_>>()
                })?;
                let mut encoded: Vec<Vec<Vec<Entry>>> = vec![Vec::new(); runs.len()];
                for (k, entries) in done.into_iter().flatten() {
                    encoded[k] = entries;
                }
                encoded
            }
        };
        let mut shared = writers.shared();
        runs.iter()
            .zip(&encoded)
            .map(|(&(unit, records), entries)| {
                Ok(put_run(inner, &mut shared, unit, records.len(), entries)?.start)
            })
            .collect()
    }

    /// Replaces the fields `record` names of record `index`; its other fields keep their
    /// values (an empty payload makes a field absent). The new payloads are appended; the old
    /// ones stay in their chunk until a rebalance.
    pub fn modify(&self, index: u64, record: &Record) -> Result<()> {
        self.modify_many(&[index], std::slice::from_ref(record))
    }

    /// Writes field `field` of records `indices`: record `indices[k]` gets `values[k]`, its
    /// other fields unchanged (how a value computed later — a label, a reward — is added to
    /// records already stored). An empty value makes the field absent.
    pub fn write_field(&self, field: &str, indices: &[u64], values: &[&[u8]]) -> Result<()> {
        if indices.len() != values.len() {
            return Err(Error::InvalidRecord(format!(
                "{} indices but {} values",
                indices.len(),
                values.len()
            )));
        }
        let records: Vec<Record> = values
            .iter()
            .map(|&value| {
                let mut record = Record::new();
                record.set(field, value);
                record
            })
            .collect();
        self.modify_many(indices, &records)
    }

    /// [`Store::modify`] of several records: all are checked before any is written.
    pub fn modify_many(&self, indices: &[u64], records: &[Record]) -> Result<()> {
        let payloads: Vec<_> = records
            .iter()
            .map(|r| self.changed_payloads(r))
            .collect::<Result<_>>()?;
        let inner = &*self.inner;
        let writers = self.writers()?;
        let check = |view: &View| indices.iter().try_for_each(|&a| view.check(a));
        check(&inner.read_view())?;
        let mut entries = no_entries(inner.fields.len(), records.len());
        {
            // Each record's new payloads go to a chunk of its own unit.
            let mut at = 0;
            while at < indices.len() {
                let unit = split(indices[at]).0;
                let run = indices[at..]
                    .iter()
                    .take_while(|&&a| split(a).0 == unit)
                    .count();
                writers.slot_for(unit).encode(
                    inner,
                    writers,
                    unit,
                    &payloads[at..at + run],
                    &mut entries,
                )?;
                at += run;
            }
        }
        let mut shared = writers.shared();
        // A delete may have raced the encoding; check again where it counts, and take the
        // current entries of the fields a record does not name.
        let merged: Vec<Vec<Entry>> = {
            let view = inner.read_view();
            check(&view)?;
            indices
                .iter()
                .enumerate()
                .map(|(k, &index)| {
                    (0..inner.fields.len())
                        .map(|field| match payloads[k][field] {
                            Some(_) => Ok(entries[field][k]),
                            None => view.entry(field, index).ok_or_else(|| Error::Corrupt {
                                path: inner.dir.clone(),
                                reason: format!("offset table ends before entry {index}"),
                            }),
                        })
                        .collect::<Result<Vec<Entry>>>()
                })
                .collect::<Result<_>>()?
        };
        for (&index, record) in indices.iter().zip(merged) {
            let columns: Vec<Vec<Entry>> = record.into_iter().map(|e| vec![e]).collect();
            shared.put_entries(inner, index, &columns, None)?;
        }
        // Counted once visible (see `Store::mark`).
        inner.rewrites.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// A modify's payloads: as for an append, except that a field not named is `None` (it
    /// keeps its value).
    fn changed_payloads<'r>(&self, record: &Record<'r>) -> Result<Vec<Option<&'r [u8]>>> {
        let out = self.named_payloads(record)?;
        self.check_typed(&out, false)?;
        Ok(out)
    }

    /// Deletes record `index` by swap-remove: the last record takes its index and the length
    /// shrinks by one. (With units, `index` is an address, and the last record of its unit
    /// takes its place.)
    pub fn delete(&self, index: u64) -> Result<()> {
        let inner = &*self.inner;
        let writers = self.writers()?;
        let mut shared = writers.shared();
        let (unit, at) = split(index);
        let (len, moved) = {
            let view = inner.read_view();
            view.check(index)?;
            let len = view.len_of(unit);
            let last = address(unit, len - 1);
            let moved: Vec<Vec<Entry>> = (0..inner.fields.len())
                .map(|field| {
                    view.entry(field, last)
                        .map(|e| vec![e])
                        .ok_or_else(|| Error::Corrupt {
                            path: inner.dir.clone(),
                            reason: format!("offset table ends before entry {last}"),
                        })
                })
                .collect::<Result<_>>()?;
            (len, moved)
        };
        if at == len - 1 {
            inner.write_view().lengths_mut(unit).len = len - 1;
        } else {
            shared.put_entries(inner, index, &moved, Some(len - 1))?;
        }
        // Counted once visible (see `Store::mark`).
        inner.rewrites.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Drops unit `unit` and every record in it (see [`crate::unit`]): [`Store::drop_units`]
    /// of one.
    pub fn drop_unit(&self, unit: u32) -> Result<()> {
        self.drop_units(&[unit])
    }

    /// Drops units `units` and every record in them, with every other write so far made
    /// durable in the same commit; their files are removed after it. Units the dataset
    /// lacks are passed over (only the commit, if it lacks them all). Batches gathered from
    /// them before stay valid.
    pub fn drop_units(&self, units: &[u32]) -> Result<()> {
        let disk = self.inner.disk().clone();
        let inner = &*self.inner;
        let writers = self.writers()?;
        let mut slots: Vec<_> = (0..writers.slots.len()).map(|i| writers.slot(i)).collect();
        let mut shared = writers.shared();
        let units: Vec<u32> = {
            let view = inner.read_view();
            units
                .iter()
                .copied()
                .filter(|&u| view.lengths(u).is_some())
                .collect()
        };
        let gone: Vec<u32> = shared
            .chunks
            .iter()
            .map(|c| c.id)
            .filter(|&id| units.contains(&chunk_unit(id)))
            .collect();
        shared.chunks.retain(|c| !units.contains(&chunk_unit(c.id)));
        for &unit in &units {
            for slot in &mut slots {
                slot.forget_unit(unit);
            }
            shared.forget_unit(unit);
        }
        if !units.is_empty() {
            let mut view = inner.write_view();
            let mut maps = view.maps.edit();
            for &unit in &units {
                if let Some(lengths) = view.units.get_mut(unit as usize) {
                    *lengths = None;
                }
                if let Some(maps) = maps.units.get_mut(unit as usize) {
                    *maps = None;
                }
            }
            view.overlay.retain(|&a, _| !units.contains(&split(a).0));
            view.maps = Published::new(maps);
        }
        for slot in &mut slots {
            slot.sync(&mut shared)?;
        }
        shared.commit(inner, &inner.locks)?;
        if units.is_empty() {
            return Ok(());
        }
        // Past the commit point: what is left are files no commit names, which the next
        // open removes if this cannot. Moved aside at once (a unit made again under the same
        // id must not lose its new files), removed in the background: freeing a large
        // unit's blocks takes a while, and a switch of the cluster's map waits on this.
        let dir = inner.dir.clone();
        let trash = dir.join(format!("{TRASH_PREFIX}{}", shared.generation));
        disk.create_dir_all(&trash)
            .ctx("create directory", &trash)?;
        for id in gone {
            let path = crate::view::chunk_path(&dir, id);
            disk.rename(&path, &trash.join(format!("{id}.zr")))
                .ctx("move a dropped unit's chunk aside", &path)?;
        }
        for &unit in units.iter().filter(|&&u| u > 0) {
            for field in inner.fields.iter() {
                let path = crate::unit::offset_path(&dir, unit, &field.name);
                if path.exists() {
                    let aside = trash.join(format!("{unit}.{}", field.name));
                    disk.rename(&path, &aside)
                        .ctx("move a dropped unit's table aside", &path)?;
                }
            }
        }
        shared.remove_uncommitted_units()?;
        // The moves made durable before anything in them goes.
        for folder in [
            dir.join(crate::view::CHUNK_DIR),
            dir.join(crate::unit::UNITS_DIR),
            trash.clone(),
            dir.clone(),
        ] {
            if folder.exists() {
                crate::meta::sync_dir(&disk, &folder)?;
            }
        }
        drop(shared);
        drop(slots);
        remove_in_background(disk, trash);
        Ok(())
    }

    /// Takes units `units` from `source`, a directory holding another dataset's
    /// [`Store::snapshot_units`] of them (its `meta.json`, their offset tables and chunks),
    /// every file and folder in it durable already: their files are moved into this dataset
    /// (a unit's folder whole), which commits them, with every other write so far. The
    /// units must hold nothing here (they are dropped first). The other dataset must have
    /// this one's fields. A crash leaves the files moved in uncommitted, removed at the
    /// next open.
    pub fn adopt_units(&self, source: &Path, units: &[u32]) -> Result<()> {
        let disk = self.inner.disk();
        let theirs = Meta::load(source)?;
        let inner = &*self.inner;
        if theirs.fields != *inner.fields {
            return Err(Error::InvalidInput {
                path: source.to_path_buf(),
                reason: "its fields are not this dataset's".into(),
            });
        }
        for &unit in units {
            if self.unit_len(unit).is_some_and(|n| n > 0) {
                return Err(Error::InvalidInput {
                    path: inner.dir.clone(),
                    reason: format!("unit {unit} holds records here already"),
                });
            }
        }
        self.drop_units(units)?;
        let writers = self.writers()?;
        let mut slots: Vec<_> = (0..writers.slots.len()).map(|i| writers.slot(i)).collect();
        let mut shared = writers.shared();
        let their_units = theirs.units();
        let mut adopted = Vec::new();
        for &unit in units {
            let length = their_units
                .iter()
                .find(|u| u.id == unit)
                .map_or(0, |u| u.length);
            // The tables, then the chunks (every one sealed here: written no more).
            if unit > 0 {
                let parent = inner.dir.join(crate::unit::UNITS_DIR);
                disk.create_dir_all(&parent)
                    .ctx("create directory", &parent)?;
            }
            let mut offset_files = Vec::with_capacity(inner.fields.len());
            let mut tables = Vec::with_capacity(inner.fields.len());
            for field in inner.fields.iter() {
                let from = crate::unit::offset_path(source, unit, &field.name);
                let to = crate::unit::offset_path(&inner.dir, unit, &field.name);
                if from.exists() {
                    disk.rename(&from, &to)
                        .ctx("move a unit's table in", &from)?;
                } else {
                    // No records: an empty table.
                    disk.create(&to).ctx("create", &to)?;
                }
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&to)
                    .ctx("open offset table", &to)?;
                let bytes = file.metadata().ctx("stat", &to)?.len();
                if bytes < length * crate::offset::ENTRY_BYTES {
                    return Err(Error::Corrupt {
                        path: to,
                        reason: format!("offset table of {bytes} bytes for {length} records"),
                    });
                }
                tables.push(crate::map::Mapped::of_unit(&file, &to, unit)?);
                let mut handle = crate::writer::Handle::new(to, file, unit);
                handle.done();
                offset_files.push((handle, bytes / crate::offset::ENTRY_BYTES));
            }
            let capacity = offset_files.iter().map(|(_, c)| *c).min().unwrap_or(0);
            let mut chunk_maps = Vec::new();
            for chunk in theirs.chunks.iter().filter(|c| chunk_unit(c.id) == unit) {
                let from = crate::view::chunk_path(source, chunk.id);
                let to = crate::view::chunk_path(&inner.dir, chunk.id);
                disk.rename(&from, &to)
                    .ctx("move a unit's chunk in", &from)?;
                let file = std::fs::File::open(&to).ctx("open chunk", &to)?;
                if file.metadata().ctx("stat", &to)?.len() < chunk.bytes {
                    return Err(Error::Corrupt {
                        path: to,
                        reason: format!("chunk shorter than the {} bytes committed", chunk.bytes),
                    });
                }
                chunk_maps.push((chunk.id, crate::map::Mapped::of_unit(&file, &to, unit)?));
                let at = shared.chunks.partition_point(|c| c.id < chunk.id);
                shared.chunks.insert(
                    at,
                    crate::meta::ChunkMeta {
                        sealed: true,
                        ..*chunk
                    },
                );
            }
            shared.new_chunk_files = true;
            shared.adopt_unit(
                unit,
                crate::writer::UnitFiles {
                    offset_files: offset_files.into_iter().map(|(h, _)| h).collect(),
                    capacity,
                    dirty: false,
                },
            );
            adopted.push((unit, length, tables, chunk_maps));
        }
        {
            let mut view = inner.write_view();
            let mut maps = view.maps.edit();
            for (unit, length, tables, chunk_maps) in adopted {
                maps.unit_mut(unit).offsets = tables;
                for (id, map) in chunk_maps {
                    crate::writer::set_chunk_map(&mut maps, id, map);
                }
                *view.lengths_mut(unit) = crate::view::Lengths {
                    len: length,
                    committed: 0,
                };
            }
            view.maps = Published::new(maps);
        }
        for slot in &mut slots {
            slot.sync(&mut shared)?;
        }
        shared.commit(inner, &inner.locks)
    }

    /// Drops records from the end of unit `unit` until `len` remain (nothing if it holds
    /// no more, or the dataset lacks it).
    pub fn truncate_unit(&self, unit: u32, len: u64) -> Result<()> {
        while let Some(have) = self.unit_len(unit).filter(|&have| have > len) {
            self.delete(address(unit, have - 1))?;
        }
        Ok(())
    }

    /// Makes every write so far durable. Returns once it is on disk; a crash at any moment
    /// leaves either this commit or the previous one, whole.
    pub fn commit(&self) -> Result<()> {
        let writers = self.writers()?;
        let mut slots: Vec<_> = (0..writers.slots.len()).map(|i| writers.slot(i)).collect();
        let mut shared = writers.shared();
        // 1. Chunk data.
        for slot in &mut slots {
            slot.sync(&mut shared)?;
        }
        shared.commit(&self.inner, &self.inner.locks)
    }
}
