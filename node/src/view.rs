//! What readers see of a dataset: its mappings ([`Maps`]) and its [`View`] (the length N,
//! the committed length, the mappings, and the overlay of entry changes not yet committed in
//! place), behind a read-write lock in the store's [`Core`]. A gather holds the read side only
//! while it turns indices into spans; a writer changes what a reader can reach only under
//! the write side, so a reader never sees a torn entry.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ahash::AHashMap;

use crate::error::{Error, Result};
use crate::map::{Mapped, Region};
use crate::meta::FieldSpec;
use crate::offset::{Entry, ENTRY_BYTES};
use crate::runtime::Runtime;
use crate::unit::{chunk_seq, chunk_unit, split};

/// Name of the chunk folder inside a dataset directory.
pub const CHUNK_DIR: &str = "chunk";

/// Path of chunk `id` in dataset `dir`.
pub fn chunk_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(CHUNK_DIR).join(format!("{id}.zr"))
}

/// The mappings a view of the dataset reads through, shared by every batch made from it.
#[derive(Clone, Default)]
pub(crate) struct Maps {
    /// Per unit id, that unit's mappings; `None` for a unit the dataset lacks.
    pub(crate) units: Vec<Option<Arc<UnitMaps>>>,
}

/// One unit's mappings.
#[derive(Clone, Default)]
pub(crate) struct UnitMaps {
    /// Offset table of each field, by field position. `None` only for an empty file.
    pub(crate) offsets: Vec<Option<Arc<Mapped>>>,
    /// Chunk mappings by their number in the unit (`unit::chunk_seq`); `None` for numbers
    /// with no chunk or an empty one.
    pub(crate) chunks: Vec<Option<Arc<Mapped>>>,
}

impl Maps {
    #[inline]
    pub(crate) fn chunk(&self, id: u32) -> Option<&Mapped> {
        self.units
            .get(chunk_unit(id) as usize)?
            .as_deref()?
            .chunks
            .get(chunk_seq(id) as usize)?
            .as_deref()
    }

    /// Unit `unit`'s mappings, if the dataset has it.
    #[inline]
    pub(crate) fn unit(&self, unit: u32) -> Option<&UnitMaps> {
        self.units.get(unit as usize)?.as_deref()
    }

    /// The offset table of `field` in unit `unit`.
    #[inline]
    pub(crate) fn table(&self, unit: u32, field: usize) -> Option<&Mapped> {
        self.units
            .get(unit as usize)?
            .as_deref()?
            .offsets
            .get(field)?
            .as_deref()
    }

    /// Every chunk mapping.
    pub(crate) fn all_chunks(&self) -> impl Iterator<Item = &Arc<Mapped>> {
        self.units
            .iter()
            .flatten()
            .flat_map(|u| u.chunks.iter().flatten())
    }

    /// Unit `unit`'s mappings, to change (made if the dataset lacks it).
    pub(crate) fn unit_mut(&mut self, unit: u32) -> &mut UnitMaps {
        let slot = unit as usize;
        if self.units.len() <= slot {
            self.units.resize(slot + 1, None);
        }
        Arc::make_mut(self.units[slot].get_or_insert_with(Default::default))
    }
}

/// The maps as readers see them: [`Maps`], and the same mappings as dense arrays of
/// [`Region`]s, which a gather's loop reads per record. On a node, whose records lie in
/// hundreds of units, following a unit's `Arc`s to its offset table and chunk mappings was
/// most of a gather's time once other work had pushed those small objects out of the
/// caches (measured under `cluster_bench --only 'one hop'`: `resolve` took 5.5% of the
/// process's samples following the `Arc`s, 2.6% reading these arrays). Built whole each
/// time the maps change (a chunk made, grown or sealed; a unit added or dropped), which is
/// rare beside the reads; the only way to publish maps, so that the arrays always describe
/// the mappings held beside them.
pub(crate) struct Published {
    maps: Maps,
    /// Offset tables per unit: unit `u`'s table of field `f` is `tables[u * fields + f]`.
    fields: usize,
    tables: Vec<Region>,
    /// Per unit id, where its chunks lie in `chunks` (first, count); `None` for a unit the
    /// dataset lacks.
    units: Vec<Option<(usize, usize)>>,
    /// Every unit's chunks by number, back to back; an empty region for a number with no
    /// chunk.
    chunks: Vec<Region>,
}

impl Published {
    /// Publishes `maps`.
    pub(crate) fn new(maps: Maps) -> Arc<Published> {
        let fields = maps
            .units
            .iter()
            .flatten()
            .map(|u| u.offsets.len())
            .max()
            .unwrap_or(0);
        let region = |map: &Option<Arc<Mapped>>| map.as_deref().map(Mapped::region).cloned();
        let mut tables = Vec::with_capacity(maps.units.len() * fields);
        let mut units = Vec::with_capacity(maps.units.len());
        let mut chunks = Vec::new();
        for unit in &maps.units {
            let offsets = unit.as_ref().map_or(&[][..], |u| &u.offsets[..]);
            tables.extend((0..fields).map(|f| offsets.get(f).and_then(region).unwrap_or_default()));
            units.push(unit.as_ref().map(|u| {
                let first = chunks.len();
                chunks.extend(u.chunks.iter().map(|c| region(c).unwrap_or_default()));
                (first, u.chunks.len())
            }));
        }
        Arc::new(Published {
            maps,
            fields,
            tables,
            units,
            chunks,
        })
    }

    /// A copy of the maps, to change and publish anew.
    pub(crate) fn edit(&self) -> Maps {
        self.maps.clone()
    }

    /// Unit `unit`'s offset table of `field` (see [`Published::table_region`]) and its
    /// chunks by number; `None` if the dataset lacks the unit.
    #[inline]
    pub(crate) fn regions(&self, unit: u32, field: usize) -> Option<(&Region, &[Region])> {
        let (first, count) = (*self.units.get(unit as usize)?)?;
        Some((
            self.table_region(unit, field),
            self.chunks.get(first..first + count)?,
        ))
    }

    /// Unit `unit`'s offset table of `field`: an empty region where there is none (no such
    /// unit, or no table of the field in it), which holds no entry.
    #[inline]
    pub(crate) fn table_region(&self, unit: u32, field: usize) -> &Region {
        if field >= self.fields {
            return &Region::NONE;
        }
        (unit as usize)
            .checked_mul(self.fields)
            .and_then(|first| self.tables.get(first + field))
            .unwrap_or(&Region::NONE)
    }
}

impl std::ops::Deref for Published {
    type Target = Maps;

    fn deref(&self) -> &Maps {
        &self.maps
    }
}

/// A unit's length, and how much of it is committed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lengths {
    pub(crate) len: u64,
    pub(crate) committed: u64,
}

/// What readers see. See the module documentation.
pub(crate) struct View {
    /// Per unit id, its lengths; `None` for a unit the dataset lacks.
    pub(crate) units: Vec<Option<Lengths>>,
    pub(crate) maps: Arc<Published>,
    /// Entries changed below their unit's committed length since the last commit: address
    /// → entry per field.
    pub(crate) overlay: AHashMap<u64, Box<[Entry]>>,
}

impl View {
    /// The lengths of unit `unit`, if the dataset has it.
    #[inline]
    pub(crate) fn lengths(&self, unit: u32) -> Option<Lengths> {
        self.units.get(unit as usize).copied().flatten()
    }

    /// The length of unit `unit` (0 for a unit the dataset lacks).
    #[inline]
    pub(crate) fn len_of(&self, unit: u32) -> u64 {
        self.lengths(unit).map_or(0, |l| l.len)
    }

    /// Records in every unit.
    pub(crate) fn total_len(&self) -> u64 {
        self.units.iter().flatten().map(|l| l.len).sum()
    }

    /// Lengths of unit `unit`, to change (the unit is made if the dataset lacks it).
    pub(crate) fn lengths_mut(&mut self, unit: u32) -> &mut Lengths {
        let slot = unit as usize;
        if self.units.len() <= slot {
            self.units.resize(slot + 1, None);
        }
        self.units[slot].get_or_insert_with(Lengths::default)
    }

    /// The error if `address` is not a record of the dataset, else `Ok`.
    #[inline]
    pub(crate) fn check(&self, address: u64) -> Result<()> {
        let (unit, index) = split(address);
        let len = self.len_of(unit);
        if index < len {
            Ok(())
        } else {
            Err(out_of_range(address, len))
        }
    }

    /// [`View::check`] of every address; quick for a dataset with unit 0 alone, where a
    /// bound on the plain index is the whole check.
    #[inline]
    pub(crate) fn check_all(&self, addresses: &[u64]) -> Result<()> {
        if let [Some(only)] = self.units[..] {
            return match addresses.iter().find(|&&a| a >= only.len) {
                Some(&a) => Err(out_of_range(a, self.len_of(split(a).0))),
                None => Ok(()),
            };
        }
        addresses.iter().try_for_each(|&a| self.check(a))
    }

    /// Entry of `field` for record `address` (`None`: the offset table ends before it).
    #[inline]
    pub(crate) fn entry(&self, field: usize, address: u64) -> Option<Entry> {
        let (unit, index) = split(address);
        if !self.overlay.is_empty() && self.lengths(unit).is_some_and(|l| index < l.committed) {
            if let Some(entries) = self.overlay.get(&address) {
                return entries.get(field).copied();
            }
        }
        self.maps
            .table_region(unit, field)
            .read16(index.checked_mul(ENTRY_BYTES)?)
            .map(Entry::decode)
    }
}

/// The error for `address`, past its unit's length `len`.
pub(crate) fn out_of_range(address: u64, len: u64) -> Error {
    match split(address) {
        (0, index) => Error::IndexOutOfRange { index, len },
        (unit, index) => Error::UnitIndexOutOfRange { unit, index, len },
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
    /// The last bytes-on-disk figure and what it was taken of (see
    /// `Store::chunk_bytes_on_disk`): (fingerprint, bytes).
    pub(crate) disk_bytes: std::sync::Mutex<Option<(u64, u64)>>,
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
    /// Where this store's changes to its files go.
    pub(crate) fn disk(&self) -> &crate::disk::Disk {
        &self.runtime.options.disk
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_table_is_an_empty_region_and_a_missing_unit_has_none() {
        // Unit 0 without any offset table (no field written yet), unit 1 absent, unit 2
        // with two fields' tables, both empty files.
        let mut maps = Maps::default();
        maps.unit_mut(0);
        maps.unit_mut(2).offsets = vec![None, None];
        maps.units[1] = None;
        let published = Published::new(maps);
        let (table, chunks) = published
            .regions(0, 0)
            .expect("a unit present without tables still has its regions");
        assert_eq!(table.len(), 0);
        assert!(table.read16(0).is_none(), "an empty table holds no entry");
        assert!(chunks.is_empty());
        assert!(published.regions(1, 0).is_none(), "unit 1 is absent");
        assert!(published.regions(2, 3).is_some());
        assert!(published.regions(3, 0).is_none(), "past the last unit");
        for (unit, field) in [
            (0, 0),
            (0, 1),
            (1, 0),
            (2, 1),
            (2, 7),
            (u32::MAX, usize::MAX),
        ] {
            assert_eq!(published.table_region(unit, field).len(), 0);
        }
    }
}
