//! The shared state's side of writing: offset table growth, entries, and the commit
//! protocol (chunk data → offset tables → redo log → meta.json, the commit point → redo
//! applied in place).

use std::fs;

use crate::disk;
use crate::lock::Locks;
use crate::map::Mapped;

use super::{publish, Shared};
use crate::error::{Error, IoContext, Result};
use crate::meta::{sync_dir, ChunkMeta};
use crate::offset::{write_entries, Entry, ENTRY_BYTES};
use crate::redo;
use crate::view::{Core, View, CHUNK_DIR};

impl Shared {
    /// Applies a redo log found at open (it is in `view.overlay`) to the offset tables, then
    /// removes the log so no later commit can mistake it for its own.
    pub(crate) fn settle_redo(&mut self, view: &mut View, locks: &Locks) -> Result<()> {
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
        match disk::remove(&path) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).ctx("remove", &path),
        }
    }

    /// Deletes chunk files meta.json does not commit: leftovers of writes that never committed.
    pub(crate) fn remove_uncommitted_chunks(&mut self) -> Result<()> {
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
                disk::remove(&entry.path()).ctx("remove uncommitted chunk", &entry.path())?;
                removed = true;
            }
        }
        if removed {
            sync_dir(&chunk_dir)?;
        }
        Ok(())
    }

    /// Makes the offset tables hold at least `entries` entries.
    pub(crate) fn ensure_offset_capacity(&mut self, inner: &Core, entries: u64) -> Result<()> {
        if entries <= self.offset_capacity {
            return Ok(());
        }
        let capacity = entries.next_multiple_of(self.meta.offset_grow_entries);
        let mut maps = Vec::with_capacity(self.offset_files.len());
        for (file, path) in &self.offset_files {
            disk::set_len(file, path, capacity * ENTRY_BYTES).ctx("grow offset table", path)?;
            maps.push(Mapped::new(file, path)?);
        }
        self.offset_capacity = capacity;
        self.offsets_dirty = true;
        publish(inner, |m| m.offsets = maps);
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

    /// Writes entries for records `first..first + n` (`entries[field][k]`): the part below
    /// the committed length into the overlay, the rest into the tables. Takes the view lock
    /// to publish; `len` becomes `new_len` if given.
    pub(crate) fn put_entries(
        &mut self,
        inner: &Core,
        first: u64,
        entries: &[Vec<Entry>],
        new_len: Option<u64>,
    ) -> Result<()> {
        let n = entries.first().map_or(0, Vec::len) as u64;
        self.ensure_offset_capacity(inner, first + n)?;
        let mut view = inner.write_view();
        // Entries past the committed length go to the tables; a reader can reach them only
        // if they lie below `len`, and the view lock excludes readers meanwhile.
        let direct = view.committed_len.clamp(first, first + n);
        let skip = (direct - first) as usize;
        if direct < first + n {
            for (field, (file, path)) in self.offset_files.iter().enumerate() {
                write_entries(file, path, direct, &entries[field][skip..])?;
            }
            self.offsets_dirty = true;
        }
        for (k, index) in (first..direct).enumerate() {
            view.overlay
                .insert(index, entries.iter().map(|e| e[k]).collect());
        }
        if let Some(len) = new_len {
            view.len = len;
        }
        Ok(())
    }

    /// Writes committed entry changes into the offset tables and syncs them.
    pub(crate) fn apply_in_place(&mut self, changes: &[(u64, Box<[Entry]>)]) -> Result<()> {
        for (index, entries) in changes {
            if *index >= self.offset_capacity {
                return Err(Error::Corrupt {
                    path: self.dir.join(redo::REDO_FILE),
                    reason: format!(
                        "change to entry {index} lies past the offset tables ({} entries)",
                        self.offset_capacity
                    ),
                });
            }
            for (field, (file, path)) in self.offset_files.iter().enumerate() {
                let entry = entries.get(field).copied().unwrap_or(Entry::ABSENT);
                write_entries(file, path, *index, &[entry])?;
            }
        }
        for (file, path) in &self.offset_files {
            disk::sync(file, path).ctx("fdatasync", path)?;
        }
        Ok(())
    }

    /// Steps 2–5 of the commit protocol (the caller has synced every chunk).
    pub(crate) fn commit(&mut self, inner: &Core, locks: &Locks) -> Result<()> {
        if self.new_chunk_files {
            sync_dir(&self.dir.join(CHUNK_DIR))?;
            self.new_chunk_files = false;
        }
        // 2. Offset tables (entries past the committed length, and their growth).
        if self.offsets_dirty {
            for (file, path) in &self.offset_files {
                disk::sync(file, path).ctx("fdatasync", path)?;
            }
            self.offsets_dirty = false;
        }
        // 3. Redo log of changes below the committed length.
        let (len, mut changes) = {
            let view = inner.read_view();
            let changes: Vec<(u64, Box<[Entry]>)> =
                view.overlay.iter().map(|(&i, e)| (i, e.clone())).collect();
            (view.len, changes)
        };
        changes.sort_unstable_by_key(|(i, _)| *i);
        self.generation += 1;
        let generation = self.generation;
        if !changes.is_empty() {
            let refs: Vec<(u64, &[Entry])> = changes.iter().map(|(i, e)| (*i, &e[..])).collect();
            redo::write(&self.dir, generation, self.meta.fields.len(), &refs)?;
        }
        // Every change to an existing record so far is in this commit (they are made while
        // the shared state is held, as it is here).
        let rewrites = inner.rewrites.load(std::sync::atomic::Ordering::SeqCst);
        // 4. meta.json: the commit point.
        let mut next = self.meta.clone();
        next.generation = generation;
        next.length = len;
        next.chunks = self.chunks.clone();
        next.store(&self.dir)?;
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
        view.committed_len = len;
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
