//! What readers see of a dataset: its mappings ([`Maps`]) and its [`View`] (the length N,
//! the committed length, the mappings, and the overlay of entry changes not yet committed in
//! place), behind a read-write lock in the store's [`Core`]. A gather holds the read side only
//! while it turns indices into spans; a writer changes what a reader can reach only under
//! the write side, so a reader never sees a torn entry.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ahash::AHashMap;

use crate::map::Mapped;
use crate::meta::FieldSpec;
use crate::offset::{Entry, ENTRY_BYTES};
use crate::runtime::Runtime;

/// Name of the chunk folder inside a dataset directory.
pub const CHUNK_DIR: &str = "chunk";

/// Path of chunk `id` in dataset `dir`.
pub fn chunk_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(CHUNK_DIR).join(format!("{id}.zr"))
}

/// The mappings a view of the dataset reads through, shared by every batch made from it.
#[derive(Clone)]
pub(crate) struct Maps {
    /// Offset table of each field, by field position. `None` only for an empty file.
    pub(crate) offsets: Vec<Option<Arc<Mapped>>>,
    /// Chunk mappings by chunk id; `None` for ids with no chunk or an empty one.
    pub(crate) chunks: Vec<Option<Arc<Mapped>>>,
}

impl Maps {
    #[inline]
    pub(crate) fn chunk(&self, id: u32) -> Option<&Mapped> {
        self.chunks.get(id as usize)?.as_deref()
    }
}

/// What readers see. See the module documentation.
pub(crate) struct View {
    pub(crate) len: u64,
    pub(crate) committed_len: u64,
    pub(crate) maps: Arc<Maps>,
    /// Entries changed below `committed_len` since the last commit: index → entry per field.
    pub(crate) overlay: AHashMap<u64, Box<[Entry]>>,
}

impl View {
    /// Entry of `field` for record `index` (which must be below the offset tables' end).
    #[inline]
    pub(crate) fn entry(&self, field: usize, index: u64) -> Option<Entry> {
        if !self.overlay.is_empty() && index < self.committed_len {
            if let Some(entries) = self.overlay.get(&index) {
                return entries.get(field).copied();
            }
        }
        let table = self.maps.offsets.get(field)?.as_deref()?;
        table
            .read16(index.checked_mul(ENTRY_BYTES)?)
            .map(Entry::decode)
    }
}

/// What a store's readers and writers share: its parameters, its reader view and its
/// thread pools.
pub(crate) struct Core {
    pub(crate) dir: PathBuf,
    pub(crate) fields: Vec<FieldSpec>,
    /// Per field, its zstd dictionary (see `dict`), if it has one.
    pub(crate) dicts: Vec<Option<std::sync::Arc<[u8]>>>,
    pub(crate) field_ids: AHashMap<String, usize>,
    pub(crate) chunk_records: u32,
    pub(crate) chunk_grow_bytes: u64,
    pub(crate) view: RwLock<View>,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) read_counters: ReadCounters,
    /// This open of the dataset, among the opens of this process (see [`crate::Store::mark`]).
    pub(crate) instance: u64,
    /// Changes to existing records (modifies, field writes, deletes) through this open.
    pub(crate) rewrites: std::sync::atomic::AtomicU64,
}

/// How gathers read their records; see `Store::read_stats`.
#[derive(Default)]
pub(crate) struct ReadCounters {
    pub(crate) mmap: std::sync::atomic::AtomicU64,
    pub(crate) direct: std::sync::atomic::AtomicU64,
    pub(crate) uring: std::sync::atomic::AtomicU64,
    /// Until when (`explicit::now_ns`) `Auto` reads through the mappings without checking
    /// residency again: the last check found a gather's pages in memory.
    pub(crate) warm_until_ns: std::sync::atomic::AtomicU64,
}

impl Core {
    pub(crate) fn read_view(&self) -> RwLockReadGuard<'_, View> {
        // A panic while holding the lock cannot leave the view half-changed: writers build a
        // change completely before taking the lock. So a poisoned lock is still consistent.
        self.view
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn write_view(&self) -> RwLockWriteGuard<'_, View> {
        self.view
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
