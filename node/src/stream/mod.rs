//! Token streams: one long sequence of fixed-width elements (tokens), cut into documents,
//! with optional metadata attached to spans of it. Observations — windows of `W + 1`
//! tokens at a stride, or whole documents — are computed at read time (see [`Windows`]), so
//! `W` changes without rewriting anything.
//!
//! ```text
//! stream/
//! ├── stream.json    format, version, element type, committed counts and CRCs — the commit point
//! ├── tokens.bin     the elements back to back, append-only; no per-token index
//! ├── tokens.crc     CRC32 of each whole 4 KiB page of tokens.bin, u32 each
//! ├── documents.bin  one u64 per document: the token position where it ends
//! ├── spans.bin      per span: start u64, end u64, reach u64 (the largest end of spans 0..=j)
//! └── metadata/      a record dataset: record j is span j's metadata bytes
//! ```
//!
//! Every file is append-only: a commit writes past what `stream.json` commits, syncs the
//! files, commits the metadata records, and then replaces `stream.json` — the last write is
//! the commit point, as for record datasets, and bytes past it are ignored (and written
//! over) after a crash. The CRC of the last, partial page of tokens lives in `stream.json`,
//! so no committed byte of `tokens.crc` is ever rewritten. Readers and the writer share the
//! dataset as records datasets do (`lock`, `writer.lock`); a reader sees the stream as of
//! the last commit when it opened or last refreshed.

mod check;
mod import;
mod packed;
mod read;
mod write;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};

use crate::disk::Disk;
use crate::error::SchemaError;
use crate::error::{Error, IoContext, Result};
use crate::lock::Locks;
use crate::map::{Mapped, PAGE_BYTES};
use crate::meta::{dtype_itemsize, write_atomically, FieldSpec};
use crate::store::Store;

pub use check::StreamReport;
pub use import::{
    convert_megatron, convert_tokens, megatron_into, tokens_into, Converted, MegatronIndex,
    TokenSink,
};
pub use packed::{document_lengths, Packed};
pub use read::{Observations, SpanHit, SpanSink, WindowMode, Windows};
pub use write::Span;
pub use zr_common::packing::{PackConfig, PackPlan, PackStats, PackedColumns, Packer, Wanted};

/// The file that commits a stream.
pub const STREAM_FILE: &str = "stream.json";
const STREAM_FORMAT: &str = "zrecord-stream";
const STREAM_VERSION: u32 = 1;
const TOKENS_FILE: &str = "tokens.bin";
const CRC_FILE: &str = "tokens.crc";
const DOCUMENTS_FILE: &str = "documents.bin";
const SPANS_FILE: &str = "spans.bin";
const METADATA_DIR: &str = "metadata";
/// The metadata dataset's one field.
pub const METADATA_FIELD: &str = "metadata";
/// Bytes per entry of `spans.bin`.
const SPAN_BYTES: u64 = 24;
/// Most bytes one element may have.
const ELEMENT_BYTES_MAX: u64 = 64;

/// True if `dir` holds a token stream (not a record dataset).
pub fn is_stream(dir: &Path) -> bool {
    dir.join(STREAM_FILE).is_file()
}

/// One component of a stream's element: the token itself first, then any per-token
/// values (a concept id, a loss weight), as a NumPy structured dtype lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    pub name: String,
    /// NumPy type string: `<u2` or `<u4` for the token, any fixed-width number after it.
    pub dtype: String,
}

impl Component {
    /// A component `name` of `dtype`.
    pub fn new(name: impl Into<String>, dtype: impl Into<String>) -> Component {
        Component {
            name: name.into(),
            dtype: dtype.into(),
        }
    }
}

/// Checks an element type; returns its size in bytes.
pub fn element_bytes(element: &[Component]) -> Result<u64, SchemaError> {
    let Some(token) = element.first() else {
        return Err(SchemaError::NoToken);
    };
    if !matches!(
        token.dtype.as_str(),
        "<u2" | "<u4" | "=u2" | "=u4" | "u2" | "u4"
    ) {
        return Err(SchemaError::TokenType {
            name: token.name.clone(),
            dtype: token.dtype.clone(),
        });
    }
    let mut bytes = 0;
    for (k, c) in element.iter().enumerate() {
        FieldSpec::raw(c.name.clone())
            .validate()
            .map_err(|e| e.of(format!("element component {k}")))?;
        if element[..k].iter().any(|o| o.name == c.name) {
            return Err(SchemaError::ComponentTwice(c.name.clone()));
        }
        if c.dtype.starts_with('>') {
            return Err(SchemaError::BigEndian {
                name: c.name.clone(),
                dtype: c.dtype.clone(),
            });
        }
        bytes += dtype_itemsize(&c.dtype)
            .map_err(|e| e.of(format!("element component '{}'", c.name)))?;
    }
    if bytes > ELEMENT_BYTES_MAX {
        return Err(SchemaError::ElementTooLarge {
            bytes,
            max: ELEMENT_BYTES_MAX,
        });
    }
    Ok(bytes)
}

/// What `stream.json` commits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMeta {
    pub format: String,
    pub version: u32,
    /// The element type.
    pub element: Vec<Component>,
    /// Committed tokens (elements).
    pub tokens: u64,
    /// Committed documents.
    pub documents: u64,
    /// Committed spans.
    pub spans: u64,
    /// CRC32 of the bytes of tokens.bin past its last whole page, up to `tokens`.
    pub tail_crc: u32,
    /// CRC32 of documents.bin's committed entries.
    pub documents_crc: u32,
    /// CRC32 of spans.bin's committed entries.
    pub spans_crc: u32,
}

impl StreamMeta {
    fn empty(element: Vec<Component>) -> StreamMeta {
        StreamMeta {
            format: STREAM_FORMAT.into(),
            version: STREAM_VERSION,
            element,
            tokens: 0,
            documents: 0,
            spans: 0,
            tail_crc: 0,
            documents_crc: 0,
            spans_crc: 0,
        }
    }

    /// Reads and checks `dir/stream.json`.
    pub fn load(dir: &Path) -> Result<StreamMeta> {
        let path = dir.join(STREAM_FILE);
        let not_stream = |reason: String| Error::NotADataset {
            path: dir.to_path_buf(),
            reason,
        };
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(not_stream(format!(
                    "{STREAM_FILE} not found (not a token stream)"
                )))
            }
            Err(e) => return Err(e).ctx("read", &path),
        };
        let value: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| not_stream(format!("{STREAM_FILE} is not valid JSON: {e}")))?;
        if value.get("format").and_then(|f| f.as_str()) != Some(STREAM_FORMAT) {
            return Err(not_stream(format!(
                "{STREAM_FILE} has no \"format\": \"{STREAM_FORMAT}\" key"
            )));
        }
        let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if version != STREAM_VERSION as u64 {
            return Err(Error::UnsupportedVersion {
                path: dir.to_path_buf(),
                found: version,
                supported: STREAM_VERSION,
            });
        }
        let corrupt = |reason: String| Error::Corrupt {
            path: path.clone(),
            reason,
        };
        let meta: StreamMeta = serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        element_bytes(&meta.element).map_err(|e| corrupt(e.to_string()))?;
        if meta.documents == 0 && meta.tokens != 0 {
            return Err(corrupt(format!("{} tokens in no document", meta.tokens)));
        }
        Ok(meta)
    }

    fn store(&self, disk: &Disk, dir: &Path) -> Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| Error::Corrupt {
            path: dir.join(STREAM_FILE),
            reason: format!("cannot serialize the stream's metadata: {e}"),
        })?;
        write_atomically(disk, dir, STREAM_FILE, &text)
    }
}

/// What readers see: one commit's counts and the files mapped at least that far.
pub(crate) struct StreamView {
    pub(crate) meta: StreamMeta,
    pub(crate) element_bytes: u64,
    pub(crate) tokens: Option<Arc<Mapped>>,
    pub(crate) crcs: Option<Arc<Mapped>>,
    pub(crate) documents: Option<Arc<Mapped>>,
    pub(crate) spans: Option<Arc<Mapped>>,
    /// The span metadata records (`None` while the stream has no spans).
    pub(crate) metadata: Option<Arc<Store>>,
}

impl StreamView {
    /// Maps the files of `dir` as far as `meta` commits; an error names a file shorter than
    /// that. `metadata` is reused when the spans did not change.
    fn open(
        dir: &Path,
        meta: StreamMeta,
        previous: Option<&StreamView>,
        metadata: Option<Arc<Store>>,
    ) -> Result<StreamView> {
        let element_bytes = element_bytes(&meta.element).map_err(|reason| Error::Corrupt {
            path: dir.join(STREAM_FILE),
            reason: reason.to_string(),
        })?;
        let need =
            |name: &str, bytes: u64, old: Option<&Arc<Mapped>>| map_at_least(dir, name, bytes, old);
        // Counts too large for any file are refused here, not multiplied past u64.
        let bytes_of = |count: u64, each: u64, what: &str| {
            count.checked_mul(each).ok_or_else(|| Error::Corrupt {
                path: dir.join(STREAM_FILE),
                reason: format!("{what} = {count} is larger than any file can hold"),
            })
        };
        let token_bytes = bytes_of(meta.tokens, element_bytes, "tokens")?;
        let document_bytes = bytes_of(meta.documents, 8, "documents")?;
        let span_bytes = bytes_of(meta.spans, SPAN_BYTES, "spans")?;
        let tokens = need(
            TOKENS_FILE,
            token_bytes,
            previous.and_then(|p| p.tokens.as_ref()),
        )?;
        let crcs = need(
            CRC_FILE,
            token_bytes / PAGE_BYTES * 4,
            previous.and_then(|p| p.crcs.as_ref()),
        )?;
        let documents = need(
            DOCUMENTS_FILE,
            document_bytes,
            previous.and_then(|p| p.documents.as_ref()),
        )?;
        let spans = need(
            SPANS_FILE,
            span_bytes,
            previous.and_then(|p| p.spans.as_ref()),
        )?;
        let metadata = match metadata {
            Some(store) => Some(store),
            None if meta.spans > 0 => {
                Some(Arc::new(Store::open_read_only(dir.join(METADATA_DIR))?))
            }
            None => None,
        };
        if let Some(store) = &metadata {
            if store.len() < meta.spans {
                return Err(Error::Corrupt {
                    path: dir.join(METADATA_DIR),
                    reason: format!(
                        "holds {} metadata records, and {STREAM_FILE} commits {} spans",
                        store.len(),
                        meta.spans
                    ),
                });
            }
        }
        Ok(StreamView {
            meta,
            element_bytes,
            tokens,
            crcs,
            documents,
            spans,
            metadata,
        })
    }

    /// Where document `d` ends (exclusive), as a token position.
    #[inline]
    pub(crate) fn document_end(&self, d: u64) -> u64 {
        debug_assert!(d < self.meta.documents);
        read_u64(self.documents.as_ref(), d * 8)
    }

    /// Where document `d` starts.
    #[inline]
    pub(crate) fn document_start(&self, d: u64) -> u64 {
        if d == 0 {
            0
        } else {
            self.document_end(d - 1)
        }
    }

    /// The document holding token `pos` (the first whose end lies past it).
    pub(crate) fn document_of(&self, pos: u64) -> u64 {
        let (mut lo, mut hi) = (0, self.meta.documents);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.document_end(mid) > pos {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// Span `j`: (start, end, reach).
    #[inline]
    pub(crate) fn span(&self, j: u64) -> (u64, u64, u64) {
        let at = j * SPAN_BYTES;
        (
            read_u64(self.spans.as_ref(), at),
            read_u64(self.spans.as_ref(), at + 8),
            read_u64(self.spans.as_ref(), at + 16),
        )
    }

    /// The committed bytes of tokens `[start, start + len)`.
    #[inline]
    pub(crate) fn token_bytes(&self, start: u64, len: u64) -> &[u8] {
        let e = self.element_bytes;
        match &self.tokens {
            Some(map) => map.bytes(start * e, len * e).unwrap_or_default(),
            None => &[],
        }
    }
}

/// The u64 at byte `at` of `map`, which the view mapped at least that far (0 past it, which
/// the callers' bounds never reach).
#[inline]
fn read_u64(map: Option<&Arc<Mapped>>, at: u64) -> u64 {
    map.and_then(|m| m.bytes(at, 8))
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

/// `dir/name` mapped, holding at least `bytes` (reusing `old` when it does); `None` when
/// nothing is needed and the file is empty or absent.
fn map_at_least(
    dir: &Path,
    name: &str,
    bytes: u64,
    old: Option<&Arc<Mapped>>,
) -> Result<Option<Arc<Mapped>>> {
    if let Some(old) = old {
        if old.len() >= bytes {
            return Ok(Some(old.clone()));
        }
    }
    let path = dir.join(name);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && bytes == 0 => return Ok(None),
        Err(e) => return Err(e).ctx("open", &path),
    };
    let map = Mapped::new(&file, &path)?;
    let have = map.as_ref().map_or(0, |m| m.len());
    if have < bytes {
        return Err(Error::Corrupt {
            path,
            reason: format!("holds {have} bytes, and {STREAM_FILE} commits {bytes}"),
        });
    }
    Ok(map)
}

/// A token stream, open for reading (and writing, if opened so).
pub struct Stream {
    dir: PathBuf,
    view: RwLock<Arc<StreamView>>,
    writer: Option<Mutex<write::Tail>>,
    _locks: Locks,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("dir", &self.dir)
            .field("tokens", &self.len())
            .field("documents", &self.documents())
            .finish()
    }
}

impl Stream {
    /// Creates an empty stream of `element`s in `dir`, which must not exist or be empty, and
    /// opens it for writing.
    pub fn create(dir: impl AsRef<Path>, element: Vec<Component>) -> Result<Stream> {
        Stream::create_on(&Disk::real(), dir, element)
    }

    /// [`Stream::create`], its changes to its files going through `disk` (a test's
    /// power-cut recorder, see [`crate::disk::PowerCut`]).
    pub fn create_on(
        disk: &Disk,
        dir: impl AsRef<Path>,
        element: Vec<Component>,
    ) -> Result<Stream> {
        let dir = dir.as_ref();
        element_bytes(&element)?;
        if dir.exists() {
            let mut entries = std::fs::read_dir(dir).ctx("read directory", dir)?;
            if entries.next().is_some() {
                return Err(Error::AlreadyExists {
                    path: dir.to_path_buf(),
                });
            }
        }
        disk.create_dir_all(dir).ctx("create directory", dir)?;
        for name in [TOKENS_FILE, CRC_FILE, DOCUMENTS_FILE, SPANS_FILE] {
            disk.create(&dir.join(name))
                .ctx("create", &dir.join(name))?;
        }
        StreamMeta::empty(element).store(disk, dir)?;
        Stream::open_on(disk, dir)
    }

    /// Opens the stream in `dir` for reading and appending (one writer at a time).
    pub fn open(dir: impl AsRef<Path>) -> Result<Stream> {
        Stream::open_on(&Disk::real(), dir)
    }

    /// [`Stream::open`], its changes to its files going through `disk`.
    pub fn open_on(disk: &Disk, dir: impl AsRef<Path>) -> Result<Stream> {
        let dir = dir.as_ref();
        StreamMeta::load(dir)?;
        let locks = Locks::writer(disk, dir)?;
        let (tail, meta, metadata) = write::Tail::recover(disk, dir)?;
        let view = StreamView::open(dir, meta, None, metadata)?;
        Ok(Stream {
            dir: dir.to_path_buf(),
            view: RwLock::new(Arc::new(view)),
            writer: Some(Mutex::new(tail)),
            _locks: locks,
        })
    }

    /// Opens the stream in `dir` for reading; any number of readers, beside one writer.
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Stream> {
        let dir = dir.as_ref();
        let meta = StreamMeta::load(dir)?;
        let locks = Locks::reader(&Disk::real(), dir)?;
        let view = StreamView::open(dir, meta, None, None)?;
        Ok(Stream {
            dir: dir.to_path_buf(),
            view: RwLock::new(Arc::new(view)),
            writer: None,
            _locks: locks,
        })
    }

    /// Sees what was committed since this handle opened or last refreshed; returns the
    /// number of tokens.
    pub fn refresh(&self) -> Result<u64> {
        let meta = StreamMeta::load(&self.dir)?;
        let current = self.view();
        if meta == current.meta {
            return Ok(meta.tokens);
        }
        let metadata = match &current.metadata {
            Some(store) if store.len() >= meta.spans => Some(store.clone()),
            _ => None,
        };
        let view = StreamView::open(&self.dir, meta, Some(&current), metadata)?;
        let tokens = view.meta.tokens;
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
        Ok(tokens)
    }

    pub(crate) fn view(&self) -> Arc<StreamView> {
        self.view.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The stream's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Committed tokens (elements).
    pub fn len(&self) -> u64 {
        self.view().meta.tokens
    }

    /// True if no token is committed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Committed documents.
    pub fn documents(&self) -> u64 {
        self.view().meta.documents
    }

    /// Committed spans.
    pub fn spans(&self) -> u64 {
        self.view().meta.spans
    }

    /// The element type.
    pub fn element(&self) -> Vec<Component> {
        self.view().meta.element.clone()
    }

    /// Bytes per element.
    pub fn element_bytes(&self) -> u64 {
        self.view().element_bytes
    }

    /// What `stream.json` commits, as this handle sees it.
    pub fn meta(&self) -> StreamMeta {
        self.view().meta.clone()
    }

    /// Document `d`'s token range `[start, end)`.
    pub fn document(&self, d: u64) -> Result<(u64, u64)> {
        let view = self.view();
        if d >= view.meta.documents {
            return Err(Error::IndexOutOfRange {
                index: d,
                len: view.meta.documents,
            });
        }
        Ok((view.document_start(d), view.document_end(d)))
    }

    /// Copies tokens `[start, start + len)` into `out` (`len` elements' bytes).
    pub fn read_tokens(&self, start: u64, out: &mut [u8]) -> Result<()> {
        let view = self.view();
        let e = view.element_bytes;
        let len = out.len() as u64 / e;
        if !(out.len() as u64).is_multiple_of(e) {
            return Err(Error::InvalidRecord(format!(
                "a buffer of {} bytes does not hold whole {e}-byte elements",
                out.len()
            )));
        }
        let end = start.saturating_add(len);
        if end > view.meta.tokens {
            return Err(Error::IndexOutOfRange {
                index: end.saturating_sub(1),
                len: view.meta.tokens,
            });
        }
        out.copy_from_slice(view.token_bytes(start, len));
        Ok(())
    }

    /// Span `j`: its token range and its metadata bytes.
    pub fn span(&self, j: u64) -> Result<(u64, u64, Vec<u8>)> {
        let view = self.view();
        if j >= view.meta.spans {
            return Err(Error::IndexOutOfRange {
                index: j,
                len: view.meta.spans,
            });
        }
        let (start, end, _) = view.span(j);
        let metadata = read::metadata_of(&view, &[j])?;
        Ok((start, end, metadata.get(0).unwrap_or_default().to_vec()))
    }
}
