//! The shared state's side of writing: offset table growth, entries, and the commit
//! protocol (chunk data → offset tables → redo log → meta.json, the commit point → redo
//! applied in place).

use std::fs;

use crate::lock::Locks;
use crate::map::Mapped;

use super::{publish, Handle, Shared, UnitFiles};
use crate::error::{Error, IoContext, Result};
use crate::meta::{sync_dir, ChunkMeta, UnitMeta};
use crate::offset::{write_entries, Entry, ENTRY_BYTES};
use crate::redo;
use crate::unit::{address, offset_path, split, unit_of_table, UNITS_DIR, UNITS_MAX};
use crate::view::{Core, Lengths, Published, View, CHUNK_DIR};

/// Entries a unit's offset tables start with, when it is made (see `ensure_unit`).
const UNIT_TABLE_START_ENTRIES: u64 = 4096;

impl Shared {
    /// Applies a redo log found at open (it is in `view.overlay`) to the offset tables, then
    /// removes the log so no later commit can mistake it for its own.
    pub(crate) fn settle_redo(&mut self, view: &mut View, locks: &Locks) -> Result<()> {
        let disk = self.disk.clone();
        if !view.overlay.is_empty() {
            let mut changes: Vec<_> = view.overlay.iter().map(|(&i, e)| (i, e.clone())).collect();
            changes.sort_unstable_by_key(|(i, _)| *i);
            // With readers elsewhere, the changes stay in the overlay and the log (see
            // `lock`); the next commit writes them again, and applies them once alone.
            match locks.alone(|| self.apply_in_place(&changes)) {
                Some(applied) => applied?,
                None => return Ok(()),
            }
            view.overlay.clear();
        }
        let path = self.dir.join(redo::REDO_FILE);
        match disk.remove(&path) {
            Ok(()) => sync_dir(&disk, &self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).ctx("remove", &path),
        }
    }

    /// Deletes chunk files meta.json does not commit: leftovers of writes that never committed.
    pub(crate) fn remove_uncommitted_chunks(&mut self) -> Result<()> {
        let disk = &self.disk;
        let chunk_dir = self.dir.join(CHUNK_DIR);
        let mut removed = false;
        for entry in fs::read_dir(&chunk_dir).ctx("read directory", &chunk_dir)? {
            let entry = entry.ctx("read directory", &chunk_dir)?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".zr"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if self
                .meta
                .chunks
                .binary_search_by_key(&id, |c| c.id)
                .is_err()
            {
                disk.remove(&entry.path())
                    .ctx("remove uncommitted chunk", &entry.path())?;
                removed = true;
            }
        }
        if removed {
            sync_dir(disk, &chunk_dir)?;
        }
        Ok(())
    }

    /// Removes dropped units' files left aside (see `Store::drop_units`) by a process that
    /// stopped before it removed them.
    pub(crate) fn remove_dropped(&mut self) -> Result<()> {
        let disk = &self.disk;
        for entry in fs::read_dir(&self.dir).ctx("read directory", &self.dir)? {
            let entry = entry.ctx("read directory", &self.dir)?;
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(crate::write::TRASH_PREFIX)
            {
                let path = entry.path();
                disk.remove_tree_if_present(&path)
                    .ctx("remove dropped units", &path)?;
            }
        }
        Ok(())
    }

    /// Removes what units meta.json does not commit left: the directories of units made
    /// and never committed, or dropped (and unit 0's tables, if it was dropped).
    pub(crate) fn remove_uncommitted_units(&mut self) -> Result<()> {
        let disk = &self.disk;
        let units = self.meta.units();
        let held = |id: u32| units.binary_search_by_key(&id, |u| u.id).is_ok();
        if !held(0) {
            for field in &self.meta.fields {
                let path = offset_path(&self.dir, 0, &field.name);
                match disk.remove(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e).ctx("remove a dropped unit's table", &path),
                }
            }
        }
        let units_dir = self.dir.join(UNITS_DIR);
        let entries = match fs::read_dir(&units_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).ctx("read directory", &units_dir),
        };
        let mut removed = false;
        for entry in entries {
            let entry = entry.ctx("read directory", &units_dir)?;
            let id = entry.file_name().to_str().and_then(unit_of_table);
            if id.is_some_and(held) {
                continue;
            }
            let path = entry.path();
            let gone = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            gone.ctx("remove an uncommitted unit's table", &path)?;
            removed = true;
        }
        if removed {
            sync_dir(disk, &units_dir)?;
        }
        Ok(())
    }

    /// Makes unit `unit` if the dataset lacks it: its offset tables, all absent.
    pub(crate) fn ensure_unit(&mut self, inner: &Core, unit: u32) -> Result<()> {
        let disk = &self.disk;
        if self.units.get(unit as usize).is_some_and(Option::is_some) {
            return Ok(());
        }
        if unit >= UNITS_MAX {
            return Err(Error::InvalidRecord(format!(
                "unit {unit} is past the largest unit id ({})",
                UNITS_MAX - 1
            )));
        }
        if unit > 0 {
            let dir = self.dir.join(UNITS_DIR);
            disk.create_dir_all(&dir).ctx("create directory", &dir)?;
        }
        // Small at first, doubling up to the growth step (see `ensure_offset_capacity`).
        let capacity = self.meta.offset_grow_entries.min(UNIT_TABLE_START_ENTRIES);
        let mut files = Vec::with_capacity(self.meta.fields.len());
        let mut maps = Vec::with_capacity(self.meta.fields.len());
        for field in &self.meta.fields {
            let path = offset_path(&self.dir, unit, &field.name);
            let file = disk.create(&path).ctx("create offset table", &path)?;
            disk.set_len(&file, &path, capacity * ENTRY_BYTES)
                .ctx("grow offset table", &path)?;
            maps.push(Mapped::of_unit(&file, &path, unit)?);
            let mut handle = Handle::new(path, file, unit);
            handle.done();
            files.push(handle);
        }
        if self.units.len() <= unit as usize {
            self.units.resize_with(unit as usize + 1, || None);
        }
        self.units[unit as usize] = Some(UnitFiles {
            offset_files: files,
            capacity,
            dirty: true,
        });
        self.new_units.push(unit);
        let mut view = inner.write_view();
        let mut edited = view.maps.edit();
        edited.unit_mut(unit).offsets = maps;
        view.maps = Published::new(edited);
        *view.lengths_mut(unit) = Lengths::default();
        Ok(())
    }

    /// Takes unit `unit`'s offset tables, moved in from another dataset, durable already:
    /// committed with the next commit (the folders it was moved into synced then).
    pub(crate) fn adopt_unit(&mut self, unit: u32, files: UnitFiles) {
        if self.units.len() <= unit as usize {
            self.units.resize_with(unit as usize + 1, || None);
        }
        self.units[unit as usize] = Some(files);
        self.adopted_units = true;
    }

    /// Forgets unit `unit`'s offset tables (it is being dropped).
    pub(crate) fn forget_unit(&mut self, unit: u32) {
        if let Some(files) = self.units.get_mut(unit as usize) {
            *files = None;
        }
        self.new_units.retain(|&u| u != unit);
    }

    /// Unit `unit`'s offset tables.
    fn unit_files(&mut self, unit: u32) -> Result<&mut UnitFiles> {
        let dir = self.dir.clone();
        self.units
            .get_mut(unit as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Corrupt {
                path: dir,
                reason: format!("internal invariant broken: unit {unit} has no offset tables"),
            })
    }

    /// Makes unit `unit`'s offset tables hold at least `entries` entries.
    pub(crate) fn ensure_offset_capacity(
        &mut self,
        inner: &Core,
        unit: u32,
        entries: u64,
    ) -> Result<()> {
        let disk = self.disk.clone();
        let grow = self.meta.offset_grow_entries;
        let files = self.unit_files(unit)?;
        if entries <= files.capacity {
            return Ok(());
        }
        // By the growth step, or by doubling while the tables are smaller than one.
        let step = grow.min(files.capacity.max(UNIT_TABLE_START_ENTRIES));
        let capacity = entries.next_multiple_of(step);
        let mut maps = Vec::with_capacity(files.offset_files.len());
        for handle in &mut files.offset_files {
            let path = handle.path.clone();
            let file = handle.file()?;
            disk.set_len(file, &path, capacity * ENTRY_BYTES)
                .ctx("grow offset table", &path)?;
            maps.push(Mapped::of_unit(file, &path, unit)?);
            handle.done();
        }
        files.capacity = capacity;
        files.dirty = true;
        publish(inner, |m| m.unit_mut(unit).offsets = maps);
        Ok(())
    }

    pub(crate) fn update_chunk_meta(&mut self, id: u32, bytes: u64, records: u32, sealed: bool) {
        if let Ok(i) = self.chunks.binary_search_by_key(&id, |c| c.id) {
            self.chunks[i] = ChunkMeta {
                id,
                bytes,
                records,
                sealed,
            };
        }
    }

    /// Writes entries for records `first..first + n` of one unit (`first` an address;
    /// `entries[field][k]`): the part below the unit's committed length into the overlay,
    /// the rest into the tables. Takes the view lock to publish; the unit's length becomes
    /// `new_len` if given.
    pub(crate) fn put_entries(
        &mut self,
        inner: &Core,
        first: u64,
        entries: &[Vec<Entry>],
        new_len: Option<u64>,
    ) -> Result<()> {
        let disk = self.disk.clone();
        let (unit, start) = split(first);
        let n = entries.first().map_or(0, Vec::len) as u64;
        self.ensure_offset_capacity(inner, unit, start + n)?;
        let files = self.unit_files(unit)?;
        let mut view = inner.write_view();
        let committed = view.lengths(unit).map_or(0, |l| l.committed);
        // Entries past the committed length go to the tables; a reader can reach them only
        // if they lie below `len`, and the view lock excludes readers meanwhile.
        let direct = committed.clamp(start, start + n);
        let skip = (direct - start) as usize;
        if direct < start + n {
            for (field, handle) in files.offset_files.iter_mut().enumerate() {
                let path = handle.path.clone();
                write_entries(
                    &disk,
                    handle.file()?,
                    &path,
                    direct,
                    &entries[field][skip..],
                )?;
                handle.done();
            }
            files.dirty = true;
        }
        for (k, index) in (start..direct).enumerate() {
            view.overlay
                .insert(address(unit, index), entries.iter().map(|e| e[k]).collect());
        }
        if let Some(len) = new_len {
            view.lengths_mut(unit).len = len;
        }
        Ok(())
    }

    /// Writes committed entry changes (by address) into the offset tables and syncs them.
    pub(crate) fn apply_in_place(&mut self, changes: &[(u64, Box<[Entry]>)]) -> Result<()> {
        let disk = self.disk.clone();
        let redo_path = self.dir.join(redo::REDO_FILE);
        let mut touched = Vec::new();
        for (at, entries) in changes {
            let (unit, index) = split(*at);
            let files = self
                .units
                .get_mut(unit as usize)
                .and_then(Option::as_mut)
                .ok_or_else(|| Error::Corrupt {
                    path: redo_path.clone(),
                    reason: format!("a change to record {index} of unit {unit}, which the dataset does not have"),
                })?;
            if index >= files.capacity {
                return Err(Error::Corrupt {
                    path: redo_path.clone(),
                    reason: format!(
                        "change to entry {index} of unit {unit} lies past its offset tables ({} entries)",
                        files.capacity
                    ),
                });
            }
            for (field, handle) in files.offset_files.iter_mut().enumerate() {
                let entry = entries.get(field).copied().unwrap_or(Entry::ABSENT);
                let path = handle.path.clone();
                write_entries(&disk, handle.file()?, &path, index, &[entry])?;
            }
            if touched.last() != Some(&unit) {
                touched.push(unit);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for unit in touched {
            for handle in &mut self.unit_files(unit)?.offset_files {
                handle.sync(&disk)?;
            }
        }
        Ok(())
    }

    /// Steps 2–5 of the commit protocol (the caller has synced every chunk).
    pub(crate) fn commit(&mut self, inner: &Core, locks: &Locks) -> Result<()> {
        let disk = &self.disk;
        if self.new_chunk_files {
            sync_dir(disk, &self.dir.join(CHUNK_DIR))?;
            self.new_chunk_files = false;
        }
        // 2. Offset tables (entries past the committed length, and their growth), and the
        // names of new units' tables.
        for files in self.units.iter_mut().flatten().filter(|f| f.dirty) {
            for handle in &mut files.offset_files {
                handle.sync(disk)?;
            }
            files.dirty = false;
        }
        if !self.new_units.is_empty() || self.adopted_units {
            let units = self.dir.join(UNITS_DIR);
            if (self.adopted_units || self.new_units.iter().any(|&u| u > 0)) && units.exists() {
                sync_dir(disk, &units)?;
            }
            sync_dir(disk, &self.dir)?;
            self.new_units.clear();
            self.adopted_units = false;
        }
        // 3. Redo log of changes below the committed length.
        let (units, mut changes) = {
            let view = inner.read_view();
            let changes: Vec<(u64, Box<[Entry]>)> =
                view.overlay.iter().map(|(&i, e)| (i, e.clone())).collect();
            let units: Vec<UnitMeta> = view
                .units
                .iter()
                .enumerate()
                .filter_map(|(id, l)| {
                    l.map(|l| UnitMeta {
                        id: id as u32,
                        length: l.len,
                    })
                })
                .collect();
            (units, changes)
        };
        changes.sort_unstable_by_key(|(i, _)| *i);
        self.generation += 1;
        let generation = self.generation;
        if !changes.is_empty() {
            let refs: Vec<(u64, &[Entry])> = changes.iter().map(|(i, e)| (*i, &e[..])).collect();
            redo::write(disk, &self.dir, generation, self.meta.fields.len(), &refs)?;
        }
        // Every change to an existing record so far is in this commit (they are made while
        // the shared state is held, as it is here).
        let rewrites = inner.rewrites.load(std::sync::atomic::Ordering::SeqCst);
        // 4. meta.json: the commit point.
        let mut next = self.meta.clone();
        next.generation = generation;
        next.set_units(units.clone());
        next.chunks = self.chunks.clone();
        next.store(disk, &self.dir)?;
        self.meta = next;
        self.committed_rewrites = rewrites;
        // 5. The committed changes, in place, unless another process reads the dataset
        // (then they stay in the overlay and the log: see `lock`). Past the commit point a
        // failure cannot be undone here; the redo log holds the changes, and a reopen
        // applies them.
        let applied = if changes.is_empty() {
            Some(Ok(()))
        } else {
            locks.alone(|| self.apply_in_place(&changes))
        };
        if let Some(Err(e)) = &applied {
            self.failed = Some(format!(
                "applying commit {generation} in place failed ({e}); reopen the dataset"
            ));
        }
        let mut view = inner.write_view();
        for unit in &units {
            if let Some(Some(lengths)) = view.units.get_mut(unit.id as usize) {
                lengths.committed = unit.length;
            }
        }
        match applied {
            Some(Ok(())) => {
                view.overlay.clear();
                Ok(())
            }
            Some(Err(e)) => Err(e),
            None => Ok(()),
        }
    }
}
