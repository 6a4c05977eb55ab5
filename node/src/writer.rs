//! The write path: append, modify, delete, commit.
//!
//! Writers are *slots*, each owning at most one unfull chunk, its frame buffer and its
//! compressor; appends on different slots encode and write their frames in parallel. Giving
//! records their indices is serial and short: under the shared state's lock the entries are
//! written and the length moves, so records are addressable in the order their appends were
//! acknowledged. A large `append_many` is cut into one part per writer, encoded on the
//! writer pool, and indexed in input order.
//!
//! Every write goes the same way: frames are appended to a chunk with `pwrite`, entries are
//! written, and only then is the change made visible under the view's write lock. Entries
//! past the committed length go straight into the offset tables (a reopen ignores them);
//! entries below it wait in the view's overlay until `commit` makes them durable through the
//! redo log (see `redo`). A failed I/O call before the commit point leaves garbage past what
//! anything references, never a visible half-write.
//!
//! Lock order: slots (in index order) → shared → view.
//!
//! Commit order: chunk data (fdatasync) → offset tables (fdatasync) → redo log → meta.json
//! (the commit point) → redo applied in place.

use std::fs::{self, File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use flate2::{Compress, FlushCompress, Status};
use rayon::prelude::*;

use crate::batch::Maps;
use crate::error::{Error, IoContext, Result};
use crate::frame::encode_frame;
use crate::map::Mapped;
use crate::meta::{sync_dir, ChunkMeta, Compression, FieldSpec, Meta};
use crate::offset::{write_entries, Entry, ENTRY_BYTES};
use crate::redo;
use crate::store::{chunk_path, Inner, Store, View, CHUNK_DIR};
use zr_common::Record;

/// Appends of fewer records than this stay on one writer.
const PARALLEL_APPEND_MIN: usize = 64;

/// The chunk a writer appends to.
struct OpenChunk {
    id: u32,
    file: File,
    path: PathBuf,
    /// Write position: bytes written so far.
    pos: u64,
    /// Records written into it, including ones still in the frame buffer.
    records: u32,
    /// File size (grown in `chunk_grow_bytes` steps).
    capacity: u64,
    /// Written since the last fdatasync.
    dirty: bool,
}

/// One writer: its unfull chunk and scratch state.
#[derive(Default)]
pub(crate) struct Slot {
    open: Option<OpenChunk>,
    /// Sealed chunk files written since the last commit, awaiting fdatasync.
    unsynced: Vec<(File, PathBuf)>,
    /// Frames encoded but not yet written to the open chunk.
    frames: Vec<u8>,
    /// Reused Deflate state and output buffer for flate fields.
    compressor: Option<Compress>,
    compressed: Vec<u8>,
}

/// State every writer shares: the chunk list, the offset tables, the commit protocol.
pub(crate) struct Shared {
    dir: PathBuf,
    /// The last committed metadata (fields and parameters are fixed).
    meta: Meta,
    /// Every chunk as it is now, committed or not, ordered by id.
    chunks: Vec<ChunkMeta>,
    /// A chunk file was created since the last commit: the chunk directory needs an fsync.
    new_chunk_files: bool,
    offset_files: Vec<(File, PathBuf)>,
    offset_capacity: u64,
    offsets_dirty: bool,
    /// Last generation used; never reused, even by a commit that failed.
    generation: u64,
    /// Set when a commit failed after its commit point: reopening is the way back.
    failed: Option<String>,
}

/// The writers of a store opened for writing.
pub(crate) struct Writers {
    slots: Vec<Mutex<Slot>>,
    shared: Mutex<Shared>,
}

impl Writers {
    pub(crate) fn new(
        dir: &Path,
        meta: &Meta,
        offset_files: Vec<(File, PathBuf)>,
        offset_capacity: u64,
        writers: usize,
    ) -> Result<Writers> {
        let mut chunks = meta.chunks.clone();
        let mut slots: Vec<Slot> = (0..writers).map(|_| Slot::default()).collect();
        // Hand the unfull chunks to writers; any beyond the writer count are sealed as they are.
        let mut next_slot = 0;
        for chunk in chunks.iter_mut().filter(|c| !c.sealed) {
            if next_slot == slots.len() {
                chunk.sealed = true;
                continue;
            }
            let path = chunk_path(dir, chunk.id);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .ctx("open chunk", &path)?;
            let capacity = file.metadata().ctx("stat", &path)?.len();
            slots[next_slot].open = Some(OpenChunk {
                id: chunk.id,
                file,
                path,
                pos: chunk.bytes,
                records: chunk.records,
                capacity,
                dirty: false,
            });
            next_slot += 1;
        }
        Ok(Writers {
            slots: slots.into_iter().map(Mutex::new).collect(),
            shared: Mutex::new(Shared {
                dir: dir.to_path_buf(),
                meta: meta.clone(),
                chunks,
                new_chunk_files: false,
                offset_files,
                offset_capacity,
                offsets_dirty: false,
                generation: meta.generation,
                failed: None,
            }),
        })
    }

    pub(crate) fn shared(&self) -> MutexGuard<'_, Shared> {
        // Shared state is consistent at every `?`; a panic elsewhere does not half-change it.
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn slot(&self, i: usize) -> MutexGuard<'_, Slot> {
        self.slots[i]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A free writer if there is one, else the one this thread waits for.
    fn any_slot(&self) -> MutexGuard<'_, Slot> {
        for slot in &self.slots {
            if let Ok(guard) = slot.try_lock() {
                return guard;
            }
        }
        let hint = std::thread::current().id();
        let i = (ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(hint)
            % self.slots.len() as u64) as usize;
        self.slot(i)
    }
}

impl Shared {
    /// Applies a redo log found at open (it is in `view.overlay`) to the offset tables, then
    /// removes the log so no later commit can mistake it for its own.
    pub(crate) fn settle_redo(&mut self, view: &mut View) -> Result<()> {
        if !view.overlay.is_empty() {
            let mut changes: Vec<_> = view.overlay.iter().map(|(&i, e)| (i, e.clone())).collect();
            changes.sort_unstable_by_key(|(i, _)| *i);
            self.apply_in_place(&changes)?;
            view.overlay.clear();
        }
        let path = self.dir.join(redo::REDO_FILE);
        match fs::remove_file(&path) {
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
                fs::remove_file(entry.path()).ctx("remove uncommitted chunk", &entry.path())?;
                removed = true;
            }
        }
        if removed {
            sync_dir(&chunk_dir)?;
        }
        Ok(())
    }

    /// Makes the offset tables hold at least `entries` entries.
    fn ensure_offset_capacity(&mut self, inner: &Inner, entries: u64) -> Result<()> {
        if entries <= self.offset_capacity {
            return Ok(());
        }
        let capacity = entries.next_multiple_of(self.meta.offset_grow_entries);
        let mut maps = Vec::with_capacity(self.offset_files.len());
        for (file, path) in &self.offset_files {
            file.set_len(capacity * ENTRY_BYTES)
                .ctx("grow offset table", path)?;
            maps.push(Mapped::new(file, path)?);
        }
        self.offset_capacity = capacity;
        self.offsets_dirty = true;
        publish(inner, |m| m.offsets = maps);
        Ok(())
    }

    fn update_chunk_meta(&mut self, id: u32, bytes: u64, records: u32, sealed: bool) {
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
    fn put_entries(
        &mut self,
        inner: &Inner,
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
    fn apply_in_place(&mut self, changes: &[(u64, Box<[Entry]>)]) -> Result<()> {
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
            file.sync_data().ctx("fdatasync", path)?;
        }
        Ok(())
    }

    /// Steps 2–5 of the commit protocol (the caller has synced every chunk).
    fn commit(&mut self, inner: &Inner) -> Result<()> {
        if self.new_chunk_files {
            sync_dir(&self.dir.join(CHUNK_DIR))?;
            self.new_chunk_files = false;
        }
        // 2. Offset tables (entries past the committed length, and their growth).
        if self.offsets_dirty {
            for (file, path) in &self.offset_files {
                file.sync_data().ctx("fdatasync", path)?;
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
        // 4. meta.json: the commit point.
        let mut next = self.meta.clone();
        next.generation = generation;
        next.length = len;
        next.chunks = self.chunks.clone();
        next.store(&self.dir)?;
        self.meta = next;
        // 5. The committed changes, in place. Past the commit point a failure cannot be undone
        // here; the redo log holds the changes, and a reopen applies them.
        let applied = self.apply_in_place(&changes);
        if let Err(e) = &applied {
            self.failed = Some(format!(
                "applying commit {generation} in place failed ({e}); reopen the dataset"
            ));
        }
        let mut view = inner.write_view();
        view.committed_len = len;
        if applied.is_ok() {
            view.overlay.clear();
        }
        applied
    }
}

impl Slot {
    /// Starts a new chunk after the highest id.
    fn open_new_chunk(&mut self, inner: &Inner, writers: &Writers) -> Result<()> {
        let mut shared = writers.shared();
        let id = match shared.chunks.last() {
            None => 0,
            Some(last) => last.id.checked_add(1).ok_or_else(|| Error::Corrupt {
                path: shared.dir.clone(),
                reason: "chunk ids exhausted; run rebalance".into(),
            })?,
        };
        let path = chunk_path(&shared.dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .ctx("create chunk", &path)?;
        let capacity = shared.meta.chunk_grow_bytes;
        file.set_len(capacity).ctx("grow chunk", &path)?;
        let map = Mapped::new(&file, &path)?;
        publish(inner, |m| set_chunk_map(m, id, map));
        shared.chunks.push(ChunkMeta {
            id,
            bytes: 0,
            records: 0,
            sealed: false,
        });
        shared.new_chunk_files = true;
        self.open = Some(OpenChunk {
            id,
            file,
            path,
            pos: 0,
            records: 0,
            capacity,
            dirty: true,
        });
        Ok(())
    }

    /// Encodes records into this writer's chunk(s); pushes one entry per field per record.
    fn encode(
        &mut self,
        inner: &Inner,
        writers: &Writers,
        records: &[Vec<Option<&[u8]>>],
        entries: &mut [Vec<Entry>],
    ) -> Result<()> {
        let fields = &inner.fields;
        let chunk_records = inner.chunk_records;
        let grow = inner.chunk_grow_bytes;
        for payloads in records {
            if self.open.is_none() {
                self.open_new_chunk(inner, writers)?;
            }
            self.encode_record(fields, payloads, entries)?;
            if self
                .open
                .as_ref()
                .is_some_and(|o| o.records >= chunk_records)
            {
                self.flush_frames(inner, grow)?;
                self.seal(inner, writers)?;
            }
        }
        self.flush_frames(inner, grow)
    }

    fn encode_record(
        &mut self,
        fields: &[FieldSpec],
        payloads: &[Option<&[u8]>],
        entries: &mut [Vec<Entry>],
    ) -> Result<()> {
        let Some(open) = self.open.as_mut() else {
            return Err(Error::Corrupt {
                path: PathBuf::new(),
                reason: "internal invariant broken: encoding with no open chunk".into(),
            });
        };
        for (field, payload) in payloads.iter().enumerate() {
            let entry = match payload {
                Some(payload) if !payload.is_empty() => {
                    let spec = &fields[field];
                    let stored: &[u8] = match spec.compress {
                        Compression::Raw => payload,
                        Compression::Flate => {
                            let compressor = self.compressor.get_or_insert_with(|| {
                                Compress::new(flate2::Compression::default(), false)
                            });
                            deflate(compressor, payload, &mut self.compressed).map_err(|e| {
                                Error::InvalidRecord(format!(
                                    "field '{}': cannot deflate: {e}",
                                    spec.name
                                ))
                            })?;
                            &self.compressed
                        }
                    };
                    let len = u32::try_from(stored.len()).map_err(|_| {
                        Error::InvalidRecord(format!(
                            "field '{}': {} stored bytes exceed the 4 GiB record limit",
                            spec.name,
                            stored.len()
                        ))
                    })?;
                    let offset =
                        encode_frame(&mut self.frames, open.pos, stored, payload.len() as u32);
                    Entry {
                        offset,
                        chunk_id: open.id,
                        len,
                    }
                }
                _ => Entry::ABSENT,
            };
            entries[field].push(entry);
        }
        open.records += 1;
        Ok(())
    }

    /// Writes the frame buffer to the open chunk, growing the file if needed.
    fn flush_frames(&mut self, inner: &Inner, grow: u64) -> Result<()> {
        if self.frames.is_empty() {
            return Ok(());
        }
        let Some(open) = self.open.as_mut() else {
            return Err(Error::Corrupt {
                path: PathBuf::new(),
                reason: "internal invariant broken: frames buffered with no open chunk".into(),
            });
        };
        let end = open.pos + self.frames.len() as u64;
        if end > open.capacity {
            let capacity = end.next_multiple_of(grow);
            open.file.set_len(capacity).ctx("grow chunk", &open.path)?;
            open.capacity = capacity;
            let map = Mapped::new(&open.file, &open.path)?;
            let id = open.id;
            publish(inner, |m| set_chunk_map(m, id, map));
        }
        open.file
            .write_all_at(&self.frames, open.pos)
            .ctx("write chunk", &open.path)?;
        open.pos = end;
        open.dirty = true;
        self.frames.clear();
        Ok(())
    }

    /// Seals the open chunk: trims the file to its data and records it as full.
    fn seal(&mut self, inner: &Inner, writers: &Writers) -> Result<()> {
        let Some(open) = self.open.as_ref() else {
            return Ok(());
        };
        open.file
            .set_len(open.pos)
            .ctx("trim sealed chunk", &open.path)?;
        let map = Mapped::new(&open.file, &open.path)?;
        let (id, pos, records) = (open.id, open.pos, open.records);
        publish(inner, |m| set_chunk_map(m, id, map));
        writers.shared().update_chunk_meta(id, pos, records, true);
        if let Some(open) = self.open.take() {
            self.unsynced.push((open.file, open.path));
        }
        Ok(())
    }

    /// Step 1 of a commit: this writer's chunk data on disk; reports the open chunk's state.
    fn sync(&mut self, shared: &mut Shared) -> Result<()> {
        if let Some(open) = self.open.as_mut() {
            if open.dirty {
                open.file.sync_data().ctx("fdatasync", &open.path)?;
                open.dirty = false;
            }
            shared.update_chunk_meta(open.id, open.pos, open.records, false);
        }
        while let Some((file, path)) = self.unsynced.last() {
            file.sync_data().ctx("fdatasync", path)?;
            self.unsynced.pop();
        }
        Ok(())
    }
}

/// Replaces the published mappings with an edited copy.
fn publish(inner: &Inner, edit: impl FnOnce(&mut Maps)) {
    let mut view = inner.write_view();
    let mut maps = (*view.maps).clone();
    edit(&mut maps);
    view.maps = Arc::new(maps);
}

fn set_chunk_map(maps: &mut Maps, id: u32, map: Option<Arc<Mapped>>) {
    let slot = id as usize;
    if maps.chunks.len() <= slot {
        maps.chunks.resize(slot + 1, None);
    }
    maps.chunks[slot] = map;
}

/// Deflates `payload` into `out` (cleared first) with a reused compressor: a fresh one per
/// record would allocate and clear ~300 KiB of state each time.
/// Payloads up to this size are written as one stored Deflate block (RFC 1951 §3.2.4): a
/// valid stream any inflater reads, 5 bytes over the payload. Deflating them gains nothing:
/// measured on short text, 16 bytes deflate to 17.5 and 32 to 31, at 3-6 µs a record, most of
/// it resetting the compressor (which clears a 128 KiB hash table); a stored block takes
/// about 0.1 µs.
const STORED_BYTES_MAX: usize = 32;

/// `payload` as a raw Deflate stream in `out`.
fn deflate(compressor: &mut Compress, payload: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    if payload.len() <= STORED_BYTES_MAX {
        let len = payload.len() as u16;
        out.clear();
        out.push(0b001); // the final block (bit 0), stored (bits 1-2: 00), padded to the byte
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(payload);
        return Ok(());
    }
    compressor.reset();
    out.clear();
    out.reserve(payload.len() + payload.len() / 16 + 64);
    loop {
        let consumed = compressor.total_in() as usize;
        let status = compressor
            .compress_vec(&payload[consumed..], out, FlushCompress::Finish)
            .map_err(|e| e.to_string())?;
        match status {
            Status::StreamEnd => return Ok(()),
            Status::Ok | Status::BufError => out.reserve(out.capacity().max(64)),
        }
    }
}

fn no_entries(fields: usize, capacity: usize) -> Vec<Vec<Entry>> {
    (0..fields).map(|_| Vec::with_capacity(capacity)).collect()
}

impl Store {
    fn writers(&self) -> Result<&Writers> {
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

    /// Checks `record` against the schema and orders its payloads by field position.
    fn payloads<'r>(&self, record: &Record<'r>) -> Result<Vec<Option<&'r [u8]>>> {
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
                        "field '{name}' holds {expected} bytes per record (dtype {}, shape {:?}); got {}",
                        spec.dtype.as_deref().unwrap_or("?"),
                        spec.shape.as_deref().unwrap_or_default(),
                        payload.len()
                    )));
                }
            }
            out[id] = Some(payload);
        }
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
        let payloads: Vec<_> = records
            .iter()
            .map(|r| self.payloads(r))
            .collect::<Result<_>>()?;
        let inner = &*self.inner;
        let writers = self.writers()?;
        let fields = inner.fields.len();
        let parts = if records.len() >= PARALLEL_APPEND_MIN {
            writers.slots.len()
        } else {
            1
        };
        let mut entries = no_entries(fields, records.len());
        match inner.runtime.writers().filter(|_| parts > 1) {
            None => writers
                .any_slot()
                .encode(inner, writers, &payloads, &mut entries)?,
            Some(pool) => {
                let part_len = payloads.len().div_ceil(parts);
                let encoded: Vec<Vec<Vec<Entry>>> = pool.install(|| {
                    payloads
                        .par_chunks(part_len)
                        .enumerate()
                        .map(|(i, part)| {
                            let mut part_entries = no_entries(fields, part.len());
                            writers
                                .slot(i)
                                .encode(inner, writers, part, &mut part_entries)?;
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
        let mut shared = writers.shared();
        let start = inner.read_view().len;
        let end = start + records.len() as u64;
        shared.put_entries(inner, start, &entries, Some(end))?;
        Ok(start..end)
    }

    /// Replaces record `index` with `record` (fields it does not name become absent). The new
    /// payloads are appended; the old ones stay in their chunk until a rebalance.
    pub fn modify(&self, index: u64, record: &Record) -> Result<()> {
        let payloads = self.payloads(record)?;
        let inner = &*self.inner;
        let writers = self.writers()?;
        let len = inner.read_view().len;
        if index >= len {
            return Err(Error::IndexOutOfRange { index, len });
        }
        let mut entries = no_entries(inner.fields.len(), 1);
        writers.any_slot().encode(
            inner,
            writers,
            std::slice::from_ref(&payloads),
            &mut entries,
        )?;
        let mut shared = writers.shared();
        // A delete may have raced the encoding; check again where it counts.
        let len = inner.read_view().len;
        if index >= len {
            return Err(Error::IndexOutOfRange { index, len });
        }
        shared.put_entries(inner, index, &entries, None)
    }

    /// Deletes record `index` by swap-remove: the last record takes its index and the length
    /// shrinks by one.
    pub fn delete(&self, index: u64) -> Result<()> {
        let inner = &*self.inner;
        let writers = self.writers()?;
        let mut shared = writers.shared();
        let (len, moved) = {
            let view = inner.read_view();
            if index >= view.len {
                return Err(Error::IndexOutOfRange {
                    index,
                    len: view.len,
                });
            }
            let last = view.len - 1;
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
            (view.len, moved)
        };
        if index == len - 1 {
            inner.write_view().len = len - 1;
            return Ok(());
        }
        shared.put_entries(inner, index, &moved, Some(len - 1))
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
        shared.commit(&self.inner)
    }
}

#[cfg(test)]
mod tests {
    use flate2::{Decompress, FlushDecompress};

    use super::*;

    fn inflate(stream: &[u8], len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 1);
        let status = Decompress::new(false)
            .decompress_vec(stream, &mut out, FlushDecompress::Finish)
            .unwrap();
        assert_eq!(status, Status::StreamEnd, "the stream is not whole");
        out
    }

    /// Small payloads are stored blocks and large ones deflated; both are whole raw Deflate
    /// streams that inflate to the payload, and one compressor serves both in turn.
    #[test]
    fn every_payload_deflates_to_a_stream_that_inflates_back() {
        let mut compressor = Compress::new(flate2::Compression::default(), false);
        let mut out = Vec::new();
        let text = b"a red shape beside a blue shape beside a green shape ".repeat(100);
        for len in [0, 1, 31, 32, 33, 64, 1000, 5000] {
            for payload in [
                &text[..len],
                &(0..len).map(|k| (k * 131 % 251) as u8).collect::<Vec<_>>()[..],
            ] {
                deflate(&mut compressor, payload, &mut out).unwrap();
                assert_eq!(inflate(&out, payload.len()), payload, "{len} bytes");
                if len <= STORED_BYTES_MAX {
                    assert_eq!(out.len(), len + 5, "{len} bytes are stored");
                }
            }
        }
        deflate(&mut compressor, &text, &mut out).unwrap();
        assert!(out.len() < text.len() / 10, "repetitive text is compressed");
    }
}
