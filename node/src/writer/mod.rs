//! The write path's machinery: writer slots and the state they share. The public write API
//! (append, modify, delete, commit) is in `write`; slots encode and write frames (`slot`);
//! the shared state keeps the offset tables and runs the commit protocol (`commit`).
//!
//! Writers are *slots*, each owning at most one unfull chunk per unit (see `unit`: a chunk
//! holds one unit's records), its frame buffer and its compressor; appends on different slots encode and write their frames in parallel. Giving
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

mod commit;
mod slot;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ahash::AHashMap;
use flate2::Compress;

use crate::error::{IoContext, Result};
use crate::map::Mapped;
use crate::meta::{ChunkMeta, Meta};
use crate::offset::Entry;
use crate::unit::{chunk_seq, chunk_unit};
use crate::view::{chunk_path, Core, Maps, Published};

/// A file the writers write. Unit 0's stay open; the files of other units are open only
/// while used (see [`Handle::done`]): a node holding hundreds of slots, each a unit with its
/// tables and chunks, would otherwise hold thousands of descriptors.
pub(crate) struct Handle {
    pub(crate) path: PathBuf,
    file: Option<File>,
    keep_open: bool,
}

impl Handle {
    /// `file`, open at `path`, a file of unit `unit`.
    pub(crate) fn new(path: PathBuf, file: File, unit: u32) -> Handle {
        Handle {
            path,
            file: Some(file),
            keep_open: unit == 0,
        }
    }

    /// The file, opened again for reading and writing if it was closed.
    pub(crate) fn file(&mut self) -> Result<&File> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&self.path)
                .ctx("open", &self.path)?;
            self.file = Some(file);
        }
        match &self.file {
            Some(file) => Ok(file),
            None => unreachable!("opened above"),
        }
    }

    /// Done with it for now: closed unless it is unit 0's.
    pub(crate) fn done(&mut self) {
        if !self.keep_open {
            self.file = None;
        }
    }

    /// Syncs what was written (fdatasync), and is done with it.
    pub(crate) fn sync(&mut self, disk: &crate::disk::Disk) -> Result<()> {
        let path = self.path.clone();
        disk.sync(self.file()?, &path).ctx("fdatasync", &path)?;
        self.done();
        Ok(())
    }
}

/// The chunk a writer appends to.
pub(crate) struct OpenChunk {
    pub(crate) id: u32,
    pub(crate) file: Handle,
    /// Write position: bytes written so far.
    pub(crate) pos: u64,
    /// Records written into it, including ones still in the frame buffer.
    pub(crate) records: u32,
    /// File size (grown in `chunk_grow_bytes` steps).
    pub(crate) capacity: u64,
    /// Written since the last fdatasync.
    pub(crate) dirty: bool,
}

/// One writer: its unfull chunks (one per unit at most) and scratch state.
#[derive(Default)]
pub(crate) struct Slot {
    /// The unfull chunk being written.
    pub(crate) open: Option<OpenChunk>,
    /// This writer's unfull chunks of the other units, by unit.
    pub(crate) parked: AHashMap<u32, OpenChunk>,
    /// Sealed chunk files written since the last commit, awaiting fdatasync.
    pub(crate) unsynced: Vec<Handle>,
    /// Frames encoded but not yet written to the open chunk.
    pub(crate) frames: Vec<u8>,
    /// Reused Deflate state and output buffer for flate fields.
    pub(crate) compressor: Option<Compress>,
    pub(crate) compressed: Vec<u8>,
    /// Reused Zstandard contexts, per field (with the level each was made at).
    pub(crate) zstd: Vec<Option<(i32, zstd::bulk::Compressor<'static>)>>,
}

/// State every writer shares: the chunk list, the offset tables, the commit protocol.
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    /// Where the writers' changes to the files go (the store's).
    pub(crate) disk: crate::disk::Disk,
    /// The last committed metadata (fields and parameters are fixed).
    pub(crate) meta: Meta,
    /// Every chunk as it is now, committed or not, ordered by id.
    pub(crate) chunks: Vec<ChunkMeta>,
    /// A chunk file was created since the last commit: the chunk directory needs an fsync.
    pub(crate) new_chunk_files: bool,
    /// Per unit id, its offset tables; `None` for a unit the dataset lacks.
    pub(crate) units: Vec<Option<UnitFiles>>,
    /// Units made since the last commit: their directories need an fsync.
    pub(crate) new_units: Vec<u32>,
    /// Units moved in since the last commit (`Store::adopt_units`): `units/` needs an fsync.
    pub(crate) adopted_units: bool,
    /// Last generation used; never reused, even by a commit that failed.
    pub(crate) generation: u64,
    /// Set when a commit failed after its commit point: reopening is the way back.
    pub(crate) failed: Option<String>,
    /// The store's count of changes to existing records (`Core::rewrites`) as of the last
    /// commit: equal to it now, no change is waiting for a commit.
    pub(crate) committed_rewrites: u64,
}

/// One unit's offset tables, open for writing.
pub(crate) struct UnitFiles {
    pub(crate) offset_files: Vec<Handle>,
    /// Entries every table has room for.
    pub(crate) capacity: u64,
    /// Written since the last fdatasync.
    pub(crate) dirty: bool,
}

/// The writers of a store opened for writing.
pub(crate) struct Writers {
    pub(crate) slots: Vec<Mutex<Slot>>,
    pub(crate) shared: Mutex<Shared>,
}

impl Writers {
    /// The writers of the dataset `dir` as `meta` commits it, with each unit's offset
    /// tables.
    pub(crate) fn new(
        dir: &Path,
        meta: &Meta,
        unit_files: Vec<(u32, UnitFiles)>,
        writers: usize,
        disk: crate::disk::Disk,
    ) -> Result<Writers> {
        let mut chunks = meta.chunks.clone();
        let mut slots: Vec<Slot> = (0..writers).map(|_| Slot::default()).collect();
        // Hand each unit's unfull chunks to writers, one each; any beyond the writer count
        // are sealed as they are.
        let mut handed: AHashMap<u32, usize> = AHashMap::new();
        for chunk in chunks.iter_mut().filter(|c| !c.sealed) {
            let unit = chunk_unit(chunk.id);
            let next_slot = handed.entry(unit).or_default();
            if *next_slot == slots.len() {
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
            let mut file = Handle::new(path, file, unit);
            file.done();
            slots[*next_slot].parked.insert(
                unit,
                OpenChunk {
                    id: chunk.id,
                    file,
                    pos: chunk.bytes,
                    records: chunk.records,
                    capacity,
                    dirty: false,
                },
            );
            *next_slot += 1;
        }
        let mut units: Vec<Option<UnitFiles>> = Vec::new();
        for (unit, files) in unit_files {
            if units.len() <= unit as usize {
                units.resize_with(unit as usize + 1, || None);
            }
            units[unit as usize] = Some(files);
        }
        Ok(Writers {
            slots: slots.into_iter().map(Mutex::new).collect(),
            shared: Mutex::new(Shared {
                dir: dir.to_path_buf(),
                disk,
                meta: meta.clone(),
                chunks,
                new_chunk_files: false,
                units,
                new_units: Vec::new(),
                adopted_units: false,
                generation: meta.generation,
                failed: None,
                committed_rewrites: 0,
            }),
        })
    }

    pub(crate) fn shared(&self) -> MutexGuard<'_, Shared> {
        // Shared state is consistent at every `?`; a panic elsewhere does not half-change it.
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn slot(&self, i: usize) -> MutexGuard<'_, Slot> {
        self.slots[i]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The writer for a small write to unit `unit`: for unit 0 any free one (see
    /// [`Writers::any_slot`]); for every other unit always the same one, so that it has one
    /// unfull chunk, not one per writer.
    pub(crate) fn slot_for(&self, unit: u32) -> MutexGuard<'_, Slot> {
        match unit {
            0 => self.any_slot(),
            unit => self.slot(unit as usize % self.slots.len()),
        }
    }

    /// A free writer if there is one, else the one this thread waits for.
    pub(crate) fn any_slot(&self) -> MutexGuard<'_, Slot> {
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

pub(crate) fn publish(inner: &Core, edit: impl FnOnce(&mut Maps)) {
    let mut view = inner.write_view();
    let mut maps = view.maps.edit();
    edit(&mut maps);
    view.maps = Published::new(maps);
}

pub(crate) fn set_chunk_map(maps: &mut Maps, id: u32, map: Option<Arc<Mapped>>) {
    let chunks = &mut maps.unit_mut(chunk_unit(id)).chunks;
    let slot = chunk_seq(id) as usize;
    if chunks.len() <= slot {
        chunks.resize(slot + 1, None);
    }
    chunks[slot] = map;
}

/// Deflates `payload` into `out` (cleared first) with a reused compressor: a fresh one per
/// record would allocate and clear ~300 KiB of state each time.
/// Payloads up to this size are written as one stored Deflate block (RFC 1951 §3.2.4): a
/// valid stream any inflater reads, 5 bytes over the payload. Deflating them gains nothing:
/// measured on short text, 16 bytes deflate to 17.5 and 32 to 31, at 3-6 µs a record, most of
/// it resetting the compressor (which clears a 128 KiB hash table); a stored block takes
/// about 0.1 µs.
pub(crate) fn no_entries(fields: usize, capacity: usize) -> Vec<Vec<Entry>> {
    (0..fields).map(|_| Vec::with_capacity(capacity)).collect()
}
