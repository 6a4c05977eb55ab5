//! `Store`: one dataset directory, opened for reading and (optionally) writing.
//!
//! Readers see a `View` — the length N, the committed length, the mappings, and the overlay
//! of entry changes not yet committed in place (see `redo`) — behind a read-write lock that
//! is held only while a gather turns indices into spans. Writers (serialized by the writer
//! mutex, see `writer`) change an entry that a reader can reach only under the write side of
//! that lock, so a reader never sees a torn entry; everything else they write lies past what
//! any reader can reach. Chunks are append-only, so spans stay valid for as long as a batch
//! holds their mappings.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use ahash::AHashMap;

use crate::error::{Error, IoContext, Result};
use crate::io::IoBackend;
use crate::lock::Locks;
use crate::map::Mapped;
use crate::meta::{sync_dir, FieldSpec, Meta, FORMAT_NAME, FORMAT_VERSION, META_FILE};
use crate::offset::{offset_file_name, ENTRY_BYTES};
use crate::redo;
use crate::runtime::{Runtime, RuntimeOptions};
use crate::unit::{chunk_unit, offset_path};
pub use crate::view::{chunk_path, CHUNK_DIR};
use crate::view::{Core, Lengths, Maps, Published, View};
use crate::writer::{set_chunk_map, Handle, UnitFiles, Writers};

pub use crate::lock::{LOCK_FILE, WRITER_LOCK_FILE};

/// Parameters fixed when a dataset is created.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Records per chunk before it is sealed (default 65,536).
    pub chunk_records: u32,
    /// Chunk files grow by this many bytes at a time (default 1 GiB).
    pub chunk_grow_bytes: u64,
    /// Offset tables grow by this many entries at a time (default 1 Mi = 16 MiB).
    pub offset_grow_entries: u64,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            chunk_records: 65_536,
            chunk_grow_bytes: 1 << 30,
            offset_grow_entries: 1 << 20,
        }
    }
}

/// Options of one gather.
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherOptions {
    /// Check every gathered record's frame and CRC32 (off by default: it reads every byte).
    /// Reads from the disk (see [`ReadPath`]) are always checked.
    pub verify: bool,
    /// How records are read: from the mappings, or with explicit reads from the disk.
    pub read: ReadPath,
    /// Explicit reads bypass the page cache (`O_DIRECT`): a dataset far larger than memory
    /// then does not evict everything else on the host. Each read covers the 4 KiB pages
    /// around its frame. Off by default; ignored by reads from the mappings.
    pub uncached: bool,
    /// How explicit reads are issued.
    pub io: IoBackend,
}

impl GatherOptions {
    /// The default options, with every record's frame and CRC32 checked.
    pub fn verified() -> GatherOptions {
        GatherOptions {
            verify: true,
            ..GatherOptions::default()
        }
    }
}

/// How a gather reads its records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadPath {
    /// Through the memory mappings: zero-copy, at memory speed while the data is in the page
    /// cache; one page fault (a disk read, one at a time) per record that is not.
    Mmap,
    /// Explicit reads of exactly each record's frame, all issued at once at a deep queue
    /// (io_uring, or `preadv` threads), into buffers the batch owns; offset entries are read
    /// the same way first. For data that is not in memory.
    Direct,
    /// Per gather: the mappings while the pages the gather needs are in the page cache
    /// (checked with `mincore` on a sample of them), explicit reads otherwise (the default).
    #[default]
    Auto,
}

impl std::str::FromStr for ReadPath {
    type Err = UnknownReadPath;

    fn from_str(s: &str) -> std::result::Result<ReadPath, UnknownReadPath> {
        match s {
            "mmap" => Ok(ReadPath::Mmap),
            "direct" => Ok(ReadPath::Direct),
            "auto" => Ok(ReadPath::Auto),
            other => Err(UnknownReadPath(other.to_string())),
        }
    }
}

/// A read path that is not mmap, direct or auto.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown read path '{0}' (expected mmap, direct or auto)")]
pub struct UnknownReadPath(pub String);

/// How a store's gathers have read their records so far (see [`ReadPath`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Gathers served from the mappings.
    pub mmap_gathers: u64,
    /// Gathers served by explicit reads.
    pub direct_gathers: u64,
    /// Of those, gathers whose reads went through io_uring.
    pub uring_gathers: u64,
}

pub(crate) struct Inner {
    pub(crate) core: Core,
    pub(crate) writers: Option<Writers>,
    /// The dataset's locks (see `lock`).
    pub(crate) locks: Locks,
}

/// What the readers and the writers share; see [`Core`].
impl std::ops::Deref for Inner {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

/// Opens of datasets in this process, numbering each (see [`Store::mark`]).
static OPENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// See [`Store::mark`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreMark {
    pub instance: u64,
    pub rewrites: u64,
}

/// A dataset, open for gathers and — unless opened read-only — for writes. Cheap to clone;
/// clones share everything but the options [`Store::gather`] uses (see
/// [`Store::with_gather_options`]). See the crate documentation for the guarantees.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
    /// What [`Store::gather`] (and the loader source) gathers with.
    pub(crate) defaults: GatherOptions,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir)
            .field("len", &self.len())
            .finish()
    }
}

impl Store {
    /// Creates a dataset with `fields` in `dir`, which must not exist or be empty.
    pub fn create(
        dir: impl AsRef<Path>,
        fields: Vec<FieldSpec>,
        options: CreateOptions,
    ) -> Result<Store> {
        Store::create_with(dir, fields, options, RuntimeOptions::default())
    }

    /// [`Store::create`] with thread-pool sizes.
    pub fn create_with(
        dir: impl AsRef<Path>,
        fields: Vec<FieldSpec>,
        options: CreateOptions,
        runtime: RuntimeOptions,
    ) -> Result<Store> {
        Store::create_with_dicts(dir, fields, options, runtime, &[])
    }

    /// [`Store::create_with`], with zstd dictionaries for some fields: (field, dictionary
    /// bytes, e.g. from [`crate::dict::train`]); each such field must be stored zstd.
    pub fn create_with_dicts(
        dir: impl AsRef<Path>,
        mut fields: Vec<FieldSpec>,
        options: CreateOptions,
        runtime: RuntimeOptions,
        dicts: &[(String, Vec<u8>)],
    ) -> Result<Store> {
        let dir = dir.as_ref();
        if let Some(spec) = fields
            .iter()
            .find(|f| f.dict.is_some() && !dicts.iter().any(|(name, _)| name == &f.name))
        {
            return Err(Error::InvalidSchema(format!(
                "field '{}' names dictionary {}, and its bytes were not given",
                spec.name,
                spec.dict.unwrap_or_default()
            )));
        }
        for (name, dict) in dicts {
            let spec = fields.iter_mut().find(|f| &f.name == name).ok_or_else(|| {
                Error::InvalidSchema(format!(
                    "a dictionary for field '{name}', which the dataset does not have"
                ))
            })?;
            spec.dict = Some(crate::dict::check(name, dict)?);
            spec.dict_crc = Some(crc32fast::hash(dict));
        }
        let meta = Meta {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            generation: 0,
            length: 0,
            chunk_records: options.chunk_records,
            chunk_grow_bytes: options.chunk_grow_bytes,
            offset_grow_entries: options.offset_grow_entries,
            fields,
            chunks: Vec::new(),
            units: Vec::new(),
        };
        meta.validate()?;
        let disk = &runtime.disk;
        match fs::read_dir(dir) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(Error::AlreadyExists {
                        path: dir.to_path_buf(),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                disk.create_dir_all(dir).ctx("create directory", dir)?;
            }
            Err(e) => return Err(e).ctx("read directory", dir),
        }
        let lock = Locks::writer(disk, dir)?;
        disk.create_dir_all(&dir.join(CHUNK_DIR))
            .ctx("create directory", &dir.join(CHUNK_DIR))?;
        for field in &meta.fields {
            let path = dir.join(offset_file_name(&field.name));
            let file = disk.create(&path).ctx("create", &path)?;
            disk.set_len(&file, &path, meta.offset_grow_entries * ENTRY_BYTES)
                .ctx("grow", &path)?;
            disk.sync(&file, &path).ctx("fsync", &path)?;
        }
        sync_dir(disk, &dir.join(CHUNK_DIR))?;
        for (name, dict) in dicts {
            crate::dict::write(disk, dir, name, dict)?;
        }
        // meta.json last: a directory without it is not a dataset yet.
        meta.store(disk, dir)?;
        // And the dataset's own entry in its parent, or a power cut could lose it whole.
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        sync_dir(disk, parent)?;
        Store::open_locked(dir, lock, false, runtime)
    }

    /// Opens the dataset in `dir` for reading and writing. Fails if another process has it
    /// open (for reading or writing).
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(dir, RuntimeOptions::default())
    }

    /// [`Store::open`] with thread-pool sizes.
    pub fn open_with(dir: impl AsRef<Path>, runtime: RuntimeOptions) -> Result<Store> {
        let dir = dir.as_ref();
        Meta::load(dir)?; // a clear "not a dataset" before any lock file is created
        let lock = Locks::writer(&runtime.disk, dir)?;
        Store::open_locked(dir, lock, false, runtime)
    }

    /// Opens the dataset in `dir` for gathers only. Several processes may do so at once;
    /// none may while a process has it open for writing.
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Store> {
        Store::open_read_only_with(dir, RuntimeOptions::default())
    }

    /// [`Store::open_read_only`] with thread-pool sizes.
    pub fn open_read_only_with(dir: impl AsRef<Path>, runtime: RuntimeOptions) -> Result<Store> {
        let dir = dir.as_ref();
        Meta::load(dir)?;
        let lock = Locks::reader(&runtime.disk, dir)?;
        Store::open_locked(dir, lock, true, runtime)
    }

    fn open_locked(
        dir: &Path,
        lock: Locks,
        read_only: bool,
        runtime: RuntimeOptions,
    ) -> Result<Store> {
        let runtime = Runtime::new(runtime);
        let meta = Meta::load(dir)?;
        let corrupt = |path: &Path, reason: String| Error::Corrupt {
            path: path.to_path_buf(),
            reason,
        };

        // Offset tables: each must hold at least its unit's committed entries.
        let mut maps = Maps::default();
        let mut view = View {
            units: Vec::new(),
            maps: Published::new(Maps::default()),
            overlay: AHashMap::new(),
        };
        let mut unit_files = Vec::new();
        for unit in meta.units() {
            let tables = open_tables(dir, unit.id, &meta.fields, unit.length, read_only)?;
            maps.unit_mut(unit.id).offsets = tables.maps;
            let offset_files = tables
                .files
                .into_iter()
                .map(|(file, path)| {
                    let mut handle = Handle::new(path, file, unit.id);
                    handle.done();
                    handle
                })
                .collect();
            *view.lengths_mut(unit.id) = Lengths {
                len: unit.length,
                committed: unit.length,
            };
            unit_files.push((
                unit.id,
                UnitFiles {
                    offset_files,
                    capacity: tables.capacity,
                    dirty: false,
                },
            ));
        }

        // Chunks: each must hold at least the bytes meta.json commits.
        for chunk in &meta.chunks {
            let path = chunk_path(dir, chunk.id);
            let file = File::open(&path).ctx("open chunk", &path)?;
            let bytes = file.metadata().ctx("stat", &path)?.len();
            if bytes < chunk.bytes {
                return Err(corrupt(
                    &path,
                    format!(
                        "chunk file has {bytes} bytes but {META_FILE} commits {}",
                        chunk.bytes
                    ),
                ));
            }
            let map = Mapped::of_unit(&file, &path, chunk_unit(chunk.id))?;
            set_chunk_map(&mut maps, chunk.id, map);
        }
        view.maps = Published::new(maps);

        // A redo log of the last commit may not have been applied in place yet.
        if let Some(changes) = redo::read(dir, meta.generation, meta.fields.len())? {
            for (index, entries) in changes {
                view.overlay.insert(index, entries.into_boxed_slice());
            }
        }

        let writers = if read_only {
            None
        } else {
            let writers = Writers::new(
                dir,
                &meta,
                unit_files,
                runtime.options.writers,
                runtime.options.disk.clone(),
            )?;
            {
                let mut shared = writers.shared();
                shared.settle_redo(&mut view, &lock)?;
                shared.remove_uncommitted_chunks()?;
                shared.remove_uncommitted_units()?;
                shared.remove_dropped()?;
            }
            Some(writers)
        };

        let dicts = meta
            .fields
            .iter()
            .map(|spec| crate::dict::load(dir, spec))
            .collect::<Result<Vec<_>>>()?;
        let field_ids = meta
            .fields
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.clone(), i))
            .collect();
        Ok(Store {
            inner: Arc::new(Inner {
                core: Core {
                    dir: dir.to_path_buf(),
                    fields: meta.fields,
                    field_ids,
                    dicts,
                    chunk_records: meta.chunk_records,
                    chunk_grow_bytes: meta.chunk_grow_bytes,
                    view: RwLock::new(view),
                    runtime,
                    read_counters: Default::default(),
                    instance: OPENS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    rewrites: Default::default(),
                    disk_bytes: Default::default(),
                },
                writers,
                locks: lock,
            }),
            defaults: GatherOptions::default(),
        })
    }

    /// Adds field `spec` to the dataset: every record stored so far lacks it (an absent
    /// entry) until a write gives it one (`Store::write_field`, `Store::modify`). Commits
    /// first; returns the store with the new field, which replaces this handle: this one and
    /// its clones still read, but refuse writes from now on. A typed field of fixed length
    /// cannot be added (every record needs it, and the stored ones have none).
    pub fn add_field(&self, spec: FieldSpec) -> Result<Store> {
        let dir = self.inner.dir.clone();
        let invalid = |reason: String| Error::InvalidSchema(reason);
        if self.inner.field_ids.contains_key(&spec.name) {
            return Err(invalid(format!(
                "{}: the dataset has a field '{}' already",
                dir.display(),
                spec.name
            )));
        }
        if spec.record_bytes().is_some_and(|n| n > 0) {
            return Err(invalid(format!(
                "field '{}' ({}) is in every record, and the records stored so far have none: add it without a dtype",
                spec.name,
                spec.describe_type()
            )));
        }
        self.commit()?;
        let disk = self.inner.disk();
        let writers = self.writers()?;
        let _slots: Vec<_> = (0..writers.slots.len()).map(|i| writers.slot(i)).collect();
        let mut shared = writers.shared();
        {
            let view = self.inner.read_view();
            let pending = view.units.iter().flatten().any(|l| l.len != l.committed);
            if pending || !view.overlay.is_empty() {
                return Err(Error::InvalidRecord(
                    "writes arrived while the field was being added; add it again".into(),
                ));
            }
        }
        let mut meta = shared.meta.clone();
        meta.fields.push(spec.clone());
        meta.validate()?;
        // The new tables first (one per unit), all absent; meta.json, the commit point,
        // then names them.
        for unit in meta.units() {
            let capacity = shared
                .units
                .get(unit.id as usize)
                .and_then(Option::as_ref)
                .map_or(0, |u| u.capacity);
            let path = offset_path(&dir, unit.id, &spec.name);
            let file = disk.create(&path).ctx("create offset table", &path)?;
            disk.set_len(&file, &path, capacity.max(unit.length) * ENTRY_BYTES)
                .ctx("size offset table", &path)?;
            disk.sync(&file, &path).ctx("fsync", &path)?;
        }
        let units = dir.join(crate::unit::UNITS_DIR);
        if units.exists() {
            sync_dir(disk, &units)?;
        }
        sync_dir(disk, &dir)?;
        meta.store(disk, &dir)?;
        shared.failed = Some(format!(
            "the dataset gained field '{}': this handle was replaced by the one add_field returned",
            spec.name
        ));
        let lock = self.inner.locks.try_clone(&dir)?;
        drop(shared);
        let options = self.inner.runtime.options.clone();
        Ok(Store::open_locked(&dir, lock, false, options)?.with_gather_options(self.defaults))
    }

    /// Where this store's changes to its files go (see [`crate::disk`]).
    pub fn disk(&self) -> &crate::disk::Disk {
        self.inner.disk()
    }

    /// The options gathers use unless told otherwise (see [`Store::with_gather_options`]).
    pub fn gather_options(&self) -> GatherOptions {
        self.defaults
    }

    /// This handle, its [`Store::gather`] (and its gathers as a loader source) using
    /// `options`: how a server or a loader sets its read path once.
    pub fn with_gather_options(mut self, options: GatherOptions) -> Store {
        self.defaults = options;
        self
    }

    /// The dataset directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Number of records N (including appends not yet committed): with units, of all of
    /// them.
    pub fn len(&self) -> u64 {
        self.inner.read_view().total_len()
    }

    /// Every unit the dataset has and its length (see [`crate::unit`]), ordered by id: unit
    /// 0 alone for a dataset on one host.
    pub fn units(&self) -> Vec<(u32, u64)> {
        let view = self.inner.read_view();
        view.units
            .iter()
            .enumerate()
            .filter_map(|(id, l)| Some((id as u32, l.as_ref()?.len)))
            .collect()
    }

    /// The length of unit `unit`, if the dataset has it.
    pub fn unit_len(&self, unit: u32) -> Option<u64> {
        self.inner.read_view().lengths(unit).map(|l| l.len)
    }

    /// True if the dataset holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The schema.
    pub fn fields(&self) -> &[FieldSpec] {
        &self.inner.fields
    }

    /// Which open of the dataset this is and how many changes to existing records
    /// (modifies, field writes, deletes) it has made so far: while the mark stays the same,
    /// no record below the length seen has changed through it. The count is read before a
    /// read that depends on it (a change becomes visible before it is counted, so one counted
    /// later may already show, never the other way round).
    pub fn mark(&self) -> StoreMark {
        StoreMark {
            instance: self.inner.instance,
            rewrites: self
                .inner
                .rewrites
                .load(std::sync::atomic::Ordering::SeqCst),
        }
    }

    /// The zstd dictionaries of its fields that have one: (field, dictionary bytes), as
    /// [`Store::create_with_dicts`] takes them.
    pub fn dicts(&self) -> Vec<(String, Vec<u8>)> {
        self.inner
            .fields
            .iter()
            .zip(&self.inner.dicts)
            .filter_map(|(spec, dict)| Some((spec.name.clone(), dict.as_ref()?.to_vec())))
            .collect()
    }

    /// Position of field `name` in the schema.
    pub fn field_id(&self, name: &str) -> Result<usize> {
        self.inner
            .field_ids
            .get(name)
            .copied()
            .ok_or_else(|| Error::UnknownField {
                name: name.to_string(),
                known: self
                    .inner
                    .fields
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Chunk files the readers see, and the bytes they span (what the chunks hold on disk,
    /// growth included).
    pub fn chunk_stats(&self) -> (u64, u64) {
        let view = self.inner.read_view();
        view.maps
            .all_chunks()
            .fold((0, 0), |(chunks, bytes), chunk| {
                (chunks + 1, bytes + chunk.len())
            })
    }

    /// Bytes the chunk files occupy on disk: each file's allocated blocks, at most its
    /// length (a chunk's room reserved ahead for growth holds nothing until written).
    /// Asked again with nothing changed (the same length, rewrites and chunk files), the
    /// figure taken last is given without reading every file's metadata again: a node
    /// is asked for it every second, and holds many chunk files.
    pub fn chunk_bytes_on_disk(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        use std::os::unix::fs::MetadataExt;
        let view = self.inner.read_view();
        let fingerprint = {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            self.mark().rewrites.hash(&mut hasher);
            for lengths in &view.units {
                lengths.map(|l| l.len).hash(&mut hasher);
            }
            for chunk in view.maps.all_chunks() {
                (chunk.path(), chunk.len()).hash(&mut hasher);
            }
            hasher.finish()
        };
        let last = &self.inner.disk_bytes;
        let taken = *last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, bytes)) = taken.filter(|&(of, _)| of == fingerprint) {
            return bytes;
        }
        // The files' metadata is read without the view: a writer's commit need not wait
        // for it.
        let chunks: Vec<Arc<Mapped>> = view.maps.all_chunks().cloned().collect();
        drop(view);
        let bytes = chunks
            .iter()
            .filter_map(|chunk| std::fs::metadata(chunk.path()).ok())
            .map(|meta| meta.len().min(meta.blocks() * 512))
            .sum();
        *last.lock().unwrap_or_else(|e| e.into_inner()) = Some((fingerprint, bytes));
        bytes
    }

    /// How this store's gathers have read their records so far.
    pub fn read_stats(&self) -> ReadStats {
        let counters = &self.inner.read_counters;
        ReadStats {
            mmap_gathers: counters.mmap.load(std::sync::atomic::Ordering::Relaxed),
            direct_gathers: counters.direct.load(std::sync::atomic::Ordering::Relaxed),
            uring_gathers: counters.uring.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    pub(crate) fn bad(&self, field: usize, index: u64, reason: String) -> Error {
        Error::BadRecord {
            field: self.inner.fields[field].name.clone(),
            index,
            reason,
        }
    }
}

/// A unit's offset tables, opened.
pub(crate) struct Tables {
    pub(crate) files: Vec<(File, PathBuf)>,
    pub(crate) maps: Vec<Option<Arc<Mapped>>>,
    /// Entries every table has room for.
    pub(crate) capacity: u64,
}

/// Opens unit `unit`'s offset tables of `fields` in the dataset at `dir`; each must hold at
/// least the unit's `committed` entries.
pub(crate) fn open_tables(
    dir: &Path,
    unit: u32,
    fields: &[FieldSpec],
    committed: u64,
    read_only: bool,
) -> Result<Tables> {
    let mut tables = Tables {
        files: Vec::with_capacity(fields.len()),
        maps: Vec::with_capacity(fields.len()),
        capacity: u64::MAX,
    };
    for field in fields {
        let path = offset_path(dir, unit, &field.name);
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(&path)
            .ctx("open offset table", &path)?;
        let bytes = file.metadata().ctx("stat", &path)?.len();
        if bytes % ENTRY_BYTES != 0 || bytes / ENTRY_BYTES < committed {
            return Err(Error::Corrupt {
                path,
                reason: format!(
                    "offset table has {bytes} bytes; it must be a multiple of {ENTRY_BYTES} holding at least the {committed} committed entries"
                ),
            });
        }
        tables.capacity = tables.capacity.min(bytes / ENTRY_BYTES);
        tables.maps.push(Mapped::of_unit(&file, &path, unit)?);
        tables.files.push((file, path));
    }
    Ok(tables)
}
