//! `Store`: one dataset directory, opened for reading and (optionally) writing.
//!
//! Readers see a `View` — the length N, the committed length, the mappings, and the overlay
//! of entry changes not yet committed in place (see `redo`) — behind a read-write lock that
//! is held only while a gather turns indices into spans. Writers (serialized by the writer
//! mutex, see `writer`) change an entry that a reader can reach only under the write side of
//! that lock, so a reader never sees a torn entry; everything else they write lies past what
//! any reader can reach. Chunks are append-only, so spans stay valid for as long as a batch
//! holds their mappings.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ahash::AHashMap;
use flate2::{Decompress, FlushDecompress, Status};

use crate::batch::{Batch, Column, ColumnData, Maps, Span};
use crate::error::{Error, IoContext, Result};
use crate::frame::{frame_crc, FrameHeader, FRAME_HEADER_BYTES};
use crate::map::Mapped;
use crate::meta::{sync_dir, Compression, FieldSpec, Meta, FORMAT_NAME, FORMAT_VERSION, META_FILE};
use crate::offset::{offset_file_name, Entry, ENTRY_BYTES};
use crate::redo;
use crate::runtime::{Runtime, RuntimeOptions};
use crate::writer::Writers;

/// Name of the lock file inside a dataset directory.
pub const LOCK_FILE: &str = "lock";
/// Name of the chunk folder inside a dataset directory.
pub const CHUNK_DIR: &str = "chunk";

/// Path of chunk `id` in dataset `dir`.
pub fn chunk_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(CHUNK_DIR).join(format!("{id}.zr"))
}

/// How many indices ahead of the one being resolved a gather prefetches offset entries.
const ENTRY_PREFETCH_AHEAD: usize = 16;

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
    pub verify: bool,
}

/// One record to append or to write over an existing one: field name → payload. Fields the
/// record does not name are absent (stored as a zero entry). An empty payload is absent too.
#[derive(Clone, Debug, Default)]
pub struct Record<'a> {
    pub(crate) values: Vec<(&'a str, &'a [u8])>,
}

impl<'a> Record<'a> {
    /// A record with no fields yet.
    pub fn new() -> Record<'a> {
        Record { values: Vec::new() }
    }

    /// Sets `field` to `payload`.
    pub fn with(mut self, field: &'a str, payload: &'a [u8]) -> Record<'a> {
        self.values.push((field, payload));
        self
    }

    /// Sets `field` to `payload`.
    pub fn set(&mut self, field: &'a str, payload: &'a [u8]) {
        self.values.push((field, payload));
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

pub(crate) struct Inner {
    pub(crate) dir: PathBuf,
    pub(crate) fields: Vec<FieldSpec>,
    field_ids: AHashMap<String, usize>,
    pub(crate) chunk_records: u32,
    pub(crate) chunk_grow_bytes: u64,
    pub(crate) view: RwLock<View>,
    pub(crate) writers: Option<Writers>,
    pub(crate) runtime: Arc<Runtime>,
    _lock: File,
}

/// A dataset, open for gathers and — unless opened read-only — for writes. Cheap to clone;
/// clones share everything. See the crate documentation for the guarantees.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
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
        let dir = dir.as_ref();
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
        };
        meta.validate().map_err(Error::InvalidSchema)?;
        match fs::read_dir(dir) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(Error::AlreadyExists {
                        path: dir.to_path_buf(),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(dir).ctx("create directory", dir)?;
            }
            Err(e) => return Err(e).ctx("read directory", dir),
        }
        let lock = lock_dir(dir, true)?;
        fs::create_dir(dir.join(CHUNK_DIR)).ctx("create directory", &dir.join(CHUNK_DIR))?;
        for field in &meta.fields {
            let path = dir.join(offset_file_name(&field.name));
            let file = File::create(&path).ctx("create", &path)?;
            file.set_len(meta.offset_grow_entries * ENTRY_BYTES)
                .ctx("grow", &path)?;
            file.sync_all().ctx("fsync", &path)?;
        }
        sync_dir(&dir.join(CHUNK_DIR))?;
        // meta.json last: a directory without it is not a dataset yet.
        meta.store(dir)?;
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
        let lock = lock_dir(dir, true)?;
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
        let lock = lock_dir(dir, false)?;
        Store::open_locked(dir, lock, true, runtime)
    }

    fn open_locked(
        dir: &Path,
        lock: File,
        read_only: bool,
        runtime: RuntimeOptions,
    ) -> Result<Store> {
        let runtime = Runtime::new(runtime);
        let meta = Meta::load(dir)?;
        let corrupt = |path: &Path, reason: String| Error::Corrupt {
            path: path.to_path_buf(),
            reason,
        };

        // Offset tables: each must hold at least N entries.
        let mut offset_files = Vec::with_capacity(meta.fields.len());
        let mut offset_maps = Vec::with_capacity(meta.fields.len());
        let mut offset_capacity = u64::MAX;
        for field in &meta.fields {
            let path = dir.join(offset_file_name(&field.name));
            let file = OpenOptions::new()
                .read(true)
                .write(!read_only)
                .open(&path)
                .ctx("open offset table", &path)?;
            let bytes = file.metadata().ctx("stat", &path)?.len();
            if bytes % ENTRY_BYTES != 0 || bytes / ENTRY_BYTES < meta.length {
                return Err(corrupt(
                    &path,
                    format!(
                        "offset table has {bytes} bytes; it must be a multiple of {ENTRY_BYTES} holding at least the {} committed entries",
                        meta.length
                    ),
                ));
            }
            offset_capacity = offset_capacity.min(bytes / ENTRY_BYTES);
            offset_maps.push(Mapped::new(&file, &path)?);
            offset_files.push((file, path));
        }

        // Chunks: each must hold at least the bytes meta.json commits.
        let chunk_slots = meta.chunks.last().map_or(0, |c| c.id as usize + 1);
        let mut chunk_maps: Vec<Option<Arc<Mapped>>> = vec![None; chunk_slots];
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
            chunk_maps[chunk.id as usize] = Mapped::new(&file, &path)?;
        }

        let maps = Arc::new(Maps {
            offsets: offset_maps,
            chunks: chunk_maps,
        });
        let mut view = View {
            len: meta.length,
            committed_len: meta.length,
            maps,
            overlay: AHashMap::new(),
        };

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
                offset_files,
                offset_capacity,
                runtime.options.writers,
            )?;
            {
                let mut shared = writers.shared();
                shared.settle_redo(&mut view)?;
                shared.remove_uncommitted_chunks()?;
            }
            Some(writers)
        };

        let field_ids = meta
            .fields
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.clone(), i))
            .collect();
        Ok(Store {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                fields: meta.fields,
                field_ids,
                chunk_records: meta.chunk_records,
                chunk_grow_bytes: meta.chunk_grow_bytes,
                view: RwLock::new(view),
                writers,
                runtime,
                _lock: lock,
            }),
        })
    }

    /// The dataset directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Number of records N (including appends not yet committed).
    pub fn len(&self) -> u64 {
        self.inner.read_view().len
    }

    /// True if the dataset holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The schema.
    pub fn fields(&self) -> &[FieldSpec] {
        &self.inner.fields
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

    /// Gathers records `indices` (any order, repeats allowed) for `fields` (empty = all
    /// fields, in schema order).
    pub fn gather(&self, indices: &[u64], fields: &[&str]) -> Result<Batch> {
        self.gather_with(indices, fields, GatherOptions::default())
    }

    /// [`Store::gather`] with options.
    pub fn gather_with(
        &self,
        indices: &[u64],
        fields: &[&str],
        options: GatherOptions,
    ) -> Result<Batch> {
        let field_ids: Vec<usize> = if fields.is_empty() {
            (0..self.inner.fields.len()).collect()
        } else {
            fields
                .iter()
                .map(|name| self.field_id(name))
                .collect::<Result<_>>()?
        };

        // Resolve indices to spans under the read lock: entries cannot change meanwhile.
        let view = self.inner.read_view();
        if let Some(&index) = indices.iter().find(|&&i| i >= view.len) {
            return Err(Error::IndexOutOfRange {
                index,
                len: view.len,
            });
        }
        let maps = Arc::clone(&view.maps);
        let mut resolved = Vec::with_capacity(field_ids.len());
        for &field in &field_ids {
            resolved.push(self.resolve(&view, field, indices)?);
        }
        drop(view);

        let mut columns = Vec::with_capacity(field_ids.len());
        for (field, spans) in field_ids.into_iter().zip(resolved) {
            let spec = &self.inner.fields[field];
            let data = match spec.compress {
                Compression::Raw => {
                    if options.verify {
                        for (pos, span) in spans.iter().enumerate() {
                            let header = self.frame_header(&maps, field, indices[pos], span)?;
                            if let Some(header) = header {
                                self.check_crc(&maps, field, indices[pos], span, header)?;
                            }
                        }
                    }
                    ColumnData::Mapped(spans)
                }
                Compression::Flate => {
                    self.inflate(&maps, field, indices, &spans, options.verify)?
                }
            };
            columns.push(Column {
                name: spec.name.clone(),
                data,
            });
        }
        Ok(Batch {
            maps,
            len: indices.len(),
            columns,
        })
    }

    /// Turns `indices` into checked spans of `field`.
    fn resolve(&self, view: &View, field: usize, indices: &[u64]) -> Result<Vec<Span>> {
        let mut spans = Vec::with_capacity(indices.len());
        let table = view.maps.offsets.get(field).and_then(|t| t.as_deref());
        for (k, &index) in indices.iter().enumerate() {
            // Start loading an entry a few indices ahead: random entries are cache misses,
            // and overlapping them is most of a zero-copy gather's speed.
            if let (Some(table), Some(&ahead)) = (table, indices.get(k + ENTRY_PREFETCH_AHEAD)) {
                table.prefetch(ahead.wrapping_mul(ENTRY_BYTES), ENTRY_BYTES);
            }
            let entry = view.entry(field, index).ok_or_else(|| {
                self.bad(field, index, "offset table ends before this entry".into())
            })?;
            if entry.is_absent() {
                spans.push(Span::default());
                continue;
            }
            let chunk = view.maps.chunk(entry.chunk_id).ok_or_else(|| {
                self.bad(
                    field,
                    index,
                    format!(
                        "entry points to chunk {}, which does not exist",
                        entry.chunk_id
                    ),
                )
            })?;
            let start = entry.offset.saturating_add(FRAME_HEADER_BYTES);
            if start.saturating_add(entry.len as u64) > chunk.len() {
                return Err(self.bad(
                    field,
                    index,
                    format!(
                        "entry (chunk {}, offset {}, length {}) points past the chunk's end ({} bytes)",
                        entry.chunk_id,
                        entry.offset,
                        entry.len,
                        chunk.len()
                    ),
                ));
            }
            spans.push(Span {
                start,
                chunk: entry.chunk_id,
                len: entry.len,
            });
        }
        Ok(spans)
    }

    /// Reads and checks the frame header in front of `span` (`None` for an absent record).
    fn frame_header(
        &self,
        maps: &Maps,
        field: usize,
        index: u64,
        span: &Span,
    ) -> Result<Option<FrameHeader>> {
        if span.len == 0 {
            return Ok(None);
        }
        let bytes = maps
            .chunk(span.chunk)
            .and_then(|c| c.read16(span.start - FRAME_HEADER_BYTES))
            .ok_or_else(|| self.bad(field, index, "frame header lies outside the chunk".into()))?;
        let header = FrameHeader::decode(bytes).map_err(|reason| self.bad(field, index, reason))?;
        if header.stored_len != span.len {
            return Err(self.bad(
                field,
                index,
                format!(
                    "frame holds {} bytes but the offset entry says {}",
                    header.stored_len, span.len
                ),
            ));
        }
        if self.inner.fields[field].compress == Compression::Raw
            && header.logical_len != header.stored_len
        {
            return Err(self.bad(
                field,
                index,
                "raw frame has a logical length unequal to its stored length".into(),
            ));
        }
        Ok(Some(header))
    }

    fn check_crc(
        &self,
        maps: &Maps,
        field: usize,
        index: u64,
        span: &Span,
        header: FrameHeader,
    ) -> Result<()> {
        let payload = maps
            .chunk(span.chunk)
            .and_then(|c| c.bytes(span.start, span.len as u64))
            .unwrap_or_default();
        let crc = frame_crc(header.stored_len, header.logical_len, payload);
        if crc != header.crc {
            return Err(self.bad(
                field,
                index,
                format!(
                    "CRC mismatch (stored {:08x}, computed {crc:08x})",
                    header.crc
                ),
            ));
        }
        Ok(())
    }

    /// Decompresses the records of a flate field into one owned buffer.
    fn inflate(
        &self,
        maps: &Maps,
        field: usize,
        indices: &[u64],
        spans: &[Span],
        verify: bool,
    ) -> Result<ColumnData> {
        let mut offsets = Vec::with_capacity(spans.len() + 1);
        let mut headers = Vec::with_capacity(spans.len());
        let mut total = 0u64;
        offsets.push(0);
        for (pos, span) in spans.iter().enumerate() {
            let header = self.frame_header(maps, field, indices[pos], span)?;
            if let Some(header) = header {
                if verify {
                    self.check_crc(maps, field, indices[pos], span, header)?;
                }
                total += header.logical_len as u64;
            }
            headers.push(header);
            offsets.push(total);
        }
        let mut bytes = vec![0u8; total as usize];
        let mut inflater = Decompress::new(false);
        for (pos, (span, header)) in spans.iter().zip(&headers).enumerate() {
            let Some(header) = header else { continue };
            let index = indices[pos];
            let input = maps
                .chunk(span.chunk)
                .and_then(|c| c.bytes(span.start, span.len as u64))
                .unwrap_or_default();
            let out = &mut bytes[offsets[pos] as usize..offsets[pos + 1] as usize];
            inflater.reset(false);
            let status = inflater
                .decompress(input, out, FlushDecompress::Finish)
                .map_err(|e| self.bad(field, index, format!("cannot inflate: {e}")))?;
            if status != Status::StreamEnd || inflater.total_out() != header.logical_len as u64 {
                return Err(self.bad(
                    field,
                    index,
                    format!(
                        "inflates to {} bytes (stream {}), frame says {}",
                        inflater.total_out(),
                        if status == Status::StreamEnd {
                            "complete"
                        } else {
                            "incomplete"
                        },
                        header.logical_len
                    ),
                ));
            }
        }
        Ok(ColumnData::Owned { bytes, offsets })
    }

    fn bad(&self, field: usize, index: u64, reason: String) -> Error {
        Error::BadRecord {
            field: self.inner.fields[field].name.clone(),
            index,
            reason,
        }
    }
}

impl Inner {
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

/// Takes the dataset's lock file: exclusive for a writer, shared for a reader.
fn lock_dir(dir: &Path, exclusive: bool) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .ctx("open lock file", &path)?;
    let taken = if exclusive {
        file.try_lock()
    } else {
        file.try_lock_shared()
    };
    match taken {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(Error::Locked {
            path: dir.to_path_buf(),
            why: if exclusive {
                "it is open elsewhere; a writer needs it alone"
            } else {
                "it is open for writing elsewhere"
            },
        }),
        Err(TryLockError::Error(e)) => Err(e).ctx("lock", &path),
    }
}
