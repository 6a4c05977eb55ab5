//! The write path: append, modify, delete, commit.
//!
//! One `Writer` (behind the store's writer mutex) owns the unfull chunk it appends to. Every
//! write goes the same way: frames are appended to the chunk with `pwrite`, entries are
//! written, and only then is the change made visible under the view's write lock. Entries
//! past the committed length go straight into the offset tables (a reopen ignores them);
//! entries below it wait in the view's overlay until `commit` makes them durable through the
//! redo log (see `redo`). A failed I/O call before the commit point leaves garbage past what
//! anything references, never a visible half-write.
//!
//! Commit order: chunk data (fdatasync) → offset tables (fdatasync) → redo log → meta.json
//! (the commit point) → redo applied in place.

use std::fs::{self, File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard};

use flate2::{Compress, FlushCompress, Status};

use crate::batch::Maps;
use crate::error::{Error, IoContext, Result};
use crate::frame::encode_frame;
use crate::map::Mapped;
use crate::meta::{sync_dir, ChunkMeta, Compression, Meta};
use crate::offset::{write_entries, Entry, ENTRY_BYTES};
use crate::redo;
use crate::store::{chunk_path, Inner, Record, Store, View, CHUNK_DIR};

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

pub(crate) struct Writer {
    dir: PathBuf,
    /// The last committed metadata (fields and parameters are fixed).
    meta: Meta,
    /// Every chunk as it is now, committed or not.
    chunks: Vec<ChunkMeta>,
    open: Option<OpenChunk>,
    /// Sealed chunk files written since the last commit, awaiting fdatasync.
    unsynced: Vec<(File, PathBuf)>,
    /// A chunk file was created since the last commit: the chunk directory needs an fsync.
    new_chunk_files: bool,
    offset_files: Vec<(File, PathBuf)>,
    offset_capacity: u64,
    offsets_dirty: bool,
    /// Last generation used; never reused, even by a commit that failed.
    generation: u64,
    /// Frames encoded but not yet written to the open chunk.
    frames: Vec<u8>,
    /// Reused Deflate state and output buffer for flate fields.
    compressor: Compress,
    compressed: Vec<u8>,
    /// Set when a commit failed after its commit point: reopening is the way back.
    failed: Option<String>,
}

impl Writer {
    pub(crate) fn new(
        dir: &Path,
        meta: &Meta,
        offset_files: Vec<(File, PathBuf)>,
        offset_capacity: u64,
        open_chunk: Option<(u32, File, PathBuf, u64)>,
    ) -> Result<Writer> {
        let open = open_chunk.and_then(|(id, file, path, file_bytes)| {
            let committed = meta.chunks.iter().find(|c| c.id == id)?;
            Some(OpenChunk {
                id,
                file,
                path,
                pos: committed.bytes,
                records: committed.records,
                capacity: file_bytes,
                dirty: false,
            })
        });
        Ok(Writer {
            dir: dir.to_path_buf(),
            meta: meta.clone(),
            chunks: meta.chunks.clone(),
            open,
            unsynced: Vec::new(),
            new_chunk_files: false,
            offset_files,
            offset_capacity,
            offsets_dirty: false,
            generation: meta.generation,
            frames: Vec::new(),
            compressor: Compress::new(flate2::Compression::default(), false),
            compressed: Vec::new(),
            failed: None,
        })
    }

    /// Applies a redo log found at open (it is in `view.overlay`) to the offset tables, then
    /// removes the log so no later commit can mistake it for its own.
    pub(crate) fn settle_redo(&mut self, dir: &Path, view: &mut View) -> Result<()> {
        if !view.overlay.is_empty() {
            let mut changes: Vec<_> = view.overlay.iter().map(|(&i, e)| (i, e.clone())).collect();
            changes.sort_unstable_by_key(|(i, _)| *i);
            self.apply_in_place(&changes)?;
            view.overlay.clear();
        }
        let path = dir.join(redo::REDO_FILE);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).ctx("remove", &path),
        }
    }

    /// Deletes chunk files meta.json does not commit: leftovers of writes that never committed.
    pub(crate) fn remove_uncommitted_chunks(&mut self, dir: &Path, meta: &Meta) -> Result<()> {
        let chunk_dir = dir.join(CHUNK_DIR);
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
            if meta.chunks.binary_search_by_key(&id, |c| c.id).is_err() {
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

    /// Starts a new chunk after the highest id.
    fn open_new_chunk(&mut self, inner: &Inner) -> Result<()> {
        let id = match self.chunks.last() {
            None => 0,
            Some(last) => last.id.checked_add(1).ok_or_else(|| Error::Corrupt {
                path: self.dir.clone(),
                reason: "chunk ids exhausted; run rebalance".into(),
            })?,
        };
        let path = chunk_path(&self.dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .ctx("create chunk", &path)?;
        let capacity = self.meta.chunk_grow_bytes;
        file.set_len(capacity).ctx("grow chunk", &path)?;
        let map = Mapped::new(&file, &path)?;
        publish(inner, |m| set_chunk_map(m, id, map));
        self.chunks.push(ChunkMeta {
            id,
            bytes: 0,
            records: 0,
            sealed: false,
        });
        self.new_chunk_files = true;
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

    /// Encodes one record's frames into the frame buffer and pushes one entry per field.
    fn encode_record(
        &mut self,
        inner: &Inner,
        payloads: &[Option<&[u8]>],
        entries: &mut [Vec<Entry>],
    ) -> Result<()> {
        if self.open.is_none() {
            self.open_new_chunk(inner)?;
        }
        let Some(open) = self.open.as_mut() else {
            return Err(internal(&self.dir, "no open chunk after opening one"));
        };
        let compressed = &mut self.compressed;
        for (field, payload) in payloads.iter().enumerate() {
            let entry = match payload {
                Some(payload) if !payload.is_empty() => {
                    let spec = &self.meta.fields[field];
                    let stored: &[u8] = match spec.compress {
                        Compression::Raw => payload,
                        Compression::Flate => {
                            deflate(&mut self.compressor, payload, compressed).map_err(|e| {
                                Error::InvalidRecord(format!(
                                    "field '{}': cannot deflate: {e}",
                                    spec.name
                                ))
                            })?;
                            compressed
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
        if open.records >= self.meta.chunk_records {
            self.flush_frames(inner)?;
            self.seal(inner)?;
        }
        Ok(())
    }

    /// Writes the frame buffer to the open chunk, growing the file if needed.
    fn flush_frames(&mut self, inner: &Inner) -> Result<()> {
        if self.frames.is_empty() {
            return Ok(());
        }
        let Some(open) = self.open.as_mut() else {
            return Err(internal(&self.dir, "frames buffered with no open chunk"));
        };
        let end = open.pos + self.frames.len() as u64;
        if end > open.capacity {
            let capacity = end.next_multiple_of(self.meta.chunk_grow_bytes);
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
    fn seal(&mut self, inner: &Inner) -> Result<()> {
        let Some(open) = self.open.as_ref() else {
            return Ok(());
        };
        open.file
            .set_len(open.pos)
            .ctx("trim sealed chunk", &open.path)?;
        let map = Mapped::new(&open.file, &open.path)?;
        let (id, pos, records) = (open.id, open.pos, open.records);
        publish(inner, |m| set_chunk_map(m, id, map));
        self.update_chunk_meta(id, pos, records, true);
        if let Some(open) = self.open.take() {
            self.unsynced.push((open.file, open.path));
        }
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

    /// Writes one record's entries at `index`: into the overlay below the committed length,
    /// into the tables above it. The caller holds the view's write lock (`view`).
    fn put_entries(&mut self, view: &mut View, index: u64, entries: Box<[Entry]>) -> Result<()> {
        if index < view.committed_len {
            view.overlay.insert(index, entries);
            return Ok(());
        }
        if index >= self.offset_capacity {
            return Err(internal(
                &self.dir,
                "entry write past the offset tables' capacity",
            ));
        }
        for (field, (file, path)) in self.offset_files.iter().enumerate() {
            write_entries(file, path, index, &entries[field..field + 1])?;
        }
        self.offsets_dirty = true;
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

    /// The commit protocol; see the module documentation.
    fn commit(&mut self, inner: &Inner) -> Result<()> {
        self.flush_frames(inner)?;
        // 1. Chunk data.
        if let Some(open) = self.open.as_mut() {
            if open.dirty {
                open.file.sync_data().ctx("fdatasync", &open.path)?;
                open.dirty = false;
            }
            let (id, pos, records) = (open.id, open.pos, open.records);
            self.update_chunk_meta(id, pos, records, false);
        }
        while let Some((file, path)) = self.unsynced.last() {
            file.sync_data().ctx("fdatasync", path)?;
            self.unsynced.pop();
        }
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
fn deflate(compressor: &mut Compress, payload: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
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

fn internal(dir: &Path, what: &str) -> Error {
    Error::Corrupt {
        path: dir.to_path_buf(),
        reason: format!("internal invariant broken: {what}"),
    }
}

impl Store {
    fn lock_writer(&self) -> Result<MutexGuard<'_, Writer>> {
        let Some(writer) = &self.inner.writer else {
            return Err(Error::ReadOnly {
                path: self.inner.dir.clone(),
            });
        };
        // Writer methods leave it consistent at every `?`, so a panic elsewhere does not
        // leave it half-changed.
        let writer = writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(why) = &writer.failed {
            return Err(Error::Corrupt {
                path: self.inner.dir.clone(),
                reason: why.clone(),
            });
        }
        Ok(writer)
    }

    /// Checks `record` against the schema and orders its payloads by field position.
    fn payloads<'r>(&self, record: &Record<'r>) -> Result<Vec<Option<&'r [u8]>>> {
        let mut out = vec![None; self.inner.fields.len()];
        for &(name, payload) in &record.values {
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
    /// written, so a bad record rejects the whole call.
    pub fn append_many(&self, records: &[Record]) -> Result<Range<u64>> {
        let payloads: Vec<_> = records
            .iter()
            .map(|r| self.payloads(r))
            .collect::<Result<_>>()?;
        let inner = &*self.inner;
        let mut writer = self.lock_writer()?;
        let (start, committed) = {
            let view = inner.read_view();
            (view.len, view.committed_len)
        };
        let end = start + records.len() as u64;
        writer.ensure_offset_capacity(inner, end)?;
        let fields = inner.fields.len();
        let mut entries: Vec<Vec<Entry>> = (0..fields)
            .map(|_| Vec::with_capacity(records.len()))
            .collect();
        for record in &payloads {
            writer.encode_record(inner, record, &mut entries)?;
        }
        writer.flush_frames(inner)?;
        // Entries at or past the committed length go straight to the tables: no reader can
        // reach them until `len` moves. Those below it (refilling deleted slots) wait in the overlay.
        let direct = committed.clamp(start, end);
        let skip = (direct - start) as usize;
        if direct < end {
            for (field, (file, path)) in writer.offset_files.iter().enumerate() {
                write_entries(file, path, direct, &entries[field][skip..])?;
            }
            writer.offsets_dirty = true;
        }
        let mut view = inner.write_view();
        for (k, index) in (start..direct).enumerate() {
            view.overlay
                .insert(index, entries.iter().map(|e| e[k]).collect());
        }
        view.len = end;
        Ok(start..end)
    }

    /// Replaces record `index` with `record` (fields it does not name become absent). The new
    /// payloads are appended; the old ones stay in their chunk until a rebalance.
    pub fn modify(&self, index: u64, record: &Record) -> Result<()> {
        let payloads = self.payloads(record)?;
        let inner = &*self.inner;
        let mut writer = self.lock_writer()?;
        let len = inner.read_view().len;
        if index >= len {
            return Err(Error::IndexOutOfRange { index, len });
        }
        let mut entries: Vec<Vec<Entry>> = (0..inner.fields.len())
            .map(|_| Vec::with_capacity(1))
            .collect();
        writer.encode_record(inner, &payloads, &mut entries)?;
        writer.flush_frames(inner)?;
        let new: Box<[Entry]> = entries.iter().map(|e| e[0]).collect();
        let mut view = inner.write_view();
        writer.put_entries(&mut view, index, new)
    }

    /// Deletes record `index` by swap-remove: the last record takes its index and the length
    /// shrinks by one.
    pub fn delete(&self, index: u64) -> Result<()> {
        let inner = &*self.inner;
        let mut writer = self.lock_writer()?;
        let mut view = inner.write_view();
        if index >= view.len {
            return Err(Error::IndexOutOfRange {
                index,
                len: view.len,
            });
        }
        let last = view.len - 1;
        if index != last {
            let moved: Box<[Entry]> = (0..inner.fields.len())
                .map(|field| {
                    view.entry(field, last).ok_or_else(|| Error::Corrupt {
                        path: inner.dir.clone(),
                        reason: format!("offset table ends before entry {last}"),
                    })
                })
                .collect::<Result<_>>()?;
            writer.put_entries(&mut view, index, moved)?;
        }
        view.len = last;
        Ok(())
    }

    /// Makes every write so far durable. Returns once it is on disk; a crash at any moment
    /// leaves either this commit or the previous one, whole.
    pub fn commit(&self) -> Result<()> {
        let mut writer = self.lock_writer()?;
        writer.commit(&self.inner)
    }
}
