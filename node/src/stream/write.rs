//! Appending to a stream: tokens, the documents they form, and the spans with their
//! metadata; `commit` makes them durable and visible.
//!
//! Tokens go to `tokens.bin` as they come (its bytes past the committed length are no
//! reader's); the CRCs of pages they fill, the document ends and the span entries wait in
//! memory until the next commit writes them. A commit syncs the files in order, commits the
//! metadata records, and then replaces `stream.json`.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crc32fast::Hasher;

use super::{
    element_bytes, Stream, StreamMeta, StreamView, CRC_FILE, DOCUMENTS_FILE, METADATA_DIR,
    METADATA_FIELD, SPANS_FILE, SPAN_BYTES, TOKENS_FILE,
};
use crate::disk::Disk;
use crate::error::{Error, IoContext, Result};
use crate::map::PAGE_BYTES;
use crate::meta::FieldSpec;
use crate::store::{CreateOptions, Store};
use zr_common::Record;

/// Pending entries written out once they reach this many bytes, not only at commit.
const PENDING_BYTES_MAX: usize = 1 << 20;

/// One span of a document being appended: tokens `[start, end)` of the document (not of
/// the stream), and its metadata bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span<'a> {
    pub start: u64,
    pub end: u64,
    pub metadata: &'a [u8],
}

/// The writer's side: open files and everything appended since the last commit.
pub(crate) struct Tail {
    dir: PathBuf,
    /// Where its changes to the files go (the stream's).
    disk: Disk,
    element_bytes: u64,
    tokens_file: File,
    crc_file: File,
    documents_file: File,
    spans_file: File,
    /// Tokens, documents and spans appended (committed or not).
    tokens: u64,
    documents: u64,
    spans: u64,
    /// The CRC of the current, partial page of tokens so far.
    page: Hasher,
    /// Running CRCs of the document and span entries.
    documents_crc: Hasher,
    spans_crc: Hasher,
    /// Entries not yet written: page CRCs (from page `crcs_at`), document ends (from
    /// document `documents_at`), span entries (from span `spans_at`).
    crcs: Vec<u8>,
    crcs_at: u64,
    ends: Vec<u8>,
    documents_at: u64,
    span_entries: Vec<u8>,
    spans_at: u64,
    /// Where the last document ended, and the largest span end so far.
    last_end: u64,
    reach: u64,
    /// The span metadata records (made on the first span).
    metadata: Option<Arc<Store>>,
    /// Anything appended since the last commit.
    dirty: bool,
}

impl Tail {
    /// Opens `dir`'s files for appending after what `stream.json` commits (bytes past it,
    /// left by a crash, are written over), and the metadata records, dropping any a crash
    /// left past the committed spans.
    pub(crate) fn recover(
        disk: &Disk,
        dir: &Path,
    ) -> Result<(Tail, StreamMeta, Option<Arc<Store>>)> {
        let meta = StreamMeta::load(dir)?;
        let e = element_bytes(&meta.element).map_err(|reason| Error::Corrupt {
            path: dir.join(super::STREAM_FILE),
            reason: reason.to_string(),
        })?;
        let open = |name: &str| {
            let path = dir.join(name);
            disk.open(&path, OpenOptions::new().read(true).write(true))
                .ctx("open", &path)
        };
        let tokens_file = open(TOKENS_FILE)?;
        let crc_file = open(CRC_FILE)?;
        let documents_file = open(DOCUMENTS_FILE)?;
        let spans_file = open(SPANS_FILE)?;

        // The tail page's bytes, checked against the CRC that commits them.
        let token_bytes = meta.tokens * e;
        let tail_start = token_bytes / PAGE_BYTES * PAGE_BYTES;
        let mut tail = vec![0u8; (token_bytes - tail_start) as usize];
        read_exact_at(&tokens_file, &dir.join(TOKENS_FILE), &mut tail, tail_start)?;
        let mut page = Hasher::new();
        page.update(&tail);
        if page.clone().finalize() != meta.tail_crc {
            return Err(Error::Corrupt {
                path: dir.join(TOKENS_FILE),
                reason: format!(
                    "bytes {tail_start}..{token_bytes} do not match their CRC in {}",
                    super::STREAM_FILE
                ),
            });
        }
        let last_end = match meta.documents.checked_sub(1) {
            None => 0,
            Some(last) => read_u64_at(&documents_file, &dir.join(DOCUMENTS_FILE), last * 8)?,
        };
        if last_end != meta.tokens {
            return Err(Error::Corrupt {
                path: dir.join(DOCUMENTS_FILE),
                reason: format!(
                    "the last document ends at token {last_end}, and the stream holds {}",
                    meta.tokens
                ),
            });
        }
        // The last span's end: its third field.
        let reach = match meta.spans.checked_sub(1) {
            None => 0,
            Some(last) => read_u64_at(&spans_file, &dir.join(SPANS_FILE), last * SPAN_BYTES + 16)?,
        };
        let metadata = open_metadata(disk, dir, meta.spans)?;
        let tail = Tail {
            dir: dir.to_path_buf(),
            disk: disk.clone(),
            element_bytes: e,
            tokens_file,
            crc_file,
            documents_file,
            spans_file,
            tokens: meta.tokens,
            documents: meta.documents,
            spans: meta.spans,
            page,
            documents_crc: Hasher::new_with_initial(meta.documents_crc),
            spans_crc: Hasher::new_with_initial(meta.spans_crc),
            crcs: Vec::new(),
            crcs_at: token_bytes / PAGE_BYTES,
            ends: Vec::new(),
            documents_at: meta.documents,
            span_entries: Vec::new(),
            spans_at: meta.spans,
            last_end,
            reach,
            metadata: metadata.clone(),
            dirty: false,
        };
        Ok((tail, meta, metadata))
    }

    /// Appends token bytes to the open document.
    fn append_tokens(&mut self, bytes: &[u8]) -> Result<u64> {
        let disk = &self.disk;
        let e = self.element_bytes;
        if !(bytes.len() as u64).is_multiple_of(e) {
            return Err(Error::InvalidRecord(format!(
                "{} bytes of tokens are not whole {e}-byte elements",
                bytes.len()
            )));
        }
        let path = self.dir.join(TOKENS_FILE);
        let at = self.tokens * e;
        disk.write_at(&self.tokens_file, &path, bytes, at)
            .ctx("write", &path)?;
        // CRCs of the pages the bytes fill.
        let mut pos = at;
        let mut rest = bytes;
        while !rest.is_empty() {
            let room = (PAGE_BYTES - pos % PAGE_BYTES) as usize;
            let (piece, more) = rest.split_at(room.min(rest.len()));
            self.page.update(piece);
            pos += piece.len() as u64;
            rest = more;
            if pos.is_multiple_of(PAGE_BYTES) {
                let crc = std::mem::take(&mut self.page).finalize();
                self.crcs.extend_from_slice(&crc.to_le_bytes());
            }
        }
        self.tokens += bytes.len() as u64 / e;
        self.dirty = true;
        if self.crcs.len() >= PENDING_BYTES_MAX {
            self.write_pending()?;
        }
        Ok(self.tokens)
    }

    /// Ends the open document at the current token.
    fn end_document(&mut self) -> Result<u64> {
        let end = self.tokens;
        self.push_end(end)?;
        Ok(self.documents - 1)
    }

    fn push_end(&mut self, end: u64) -> Result<()> {
        if end < self.last_end || end > self.tokens {
            return Err(Error::InvalidRecord(format!(
                "a document cannot end at token {end}: the last one ends at {} and {} tokens are appended",
                self.last_end, self.tokens
            )));
        }
        let bytes = end.to_le_bytes();
        self.documents_crc.update(&bytes);
        self.ends.extend_from_slice(&bytes);
        self.documents += 1;
        self.last_end = end;
        self.dirty = true;
        if self.ends.len() >= PENDING_BYTES_MAX {
            self.write_pending()?;
        }
        Ok(())
    }

    /// Adds spans of the document that starts at `base` and holds `len` tokens.
    fn add_spans(&mut self, base: u64, len: u64, spans: &[Span]) -> Result<()> {
        if spans.is_empty() {
            return Ok(());
        }
        check_spans(len, spans)?;
        let mut order: Vec<&Span> = spans.iter().collect();
        order.sort_by_key(|s| s.start);
        let store = match &self.metadata {
            Some(store) => store.clone(),
            None => {
                let store = Arc::new(create_metadata(&self.disk, &self.dir)?);
                self.metadata = Some(store.clone());
                store
            }
        };
        let records: Vec<Record> = order
            .iter()
            .map(|s| Record::new().with(METADATA_FIELD, s.metadata))
            .collect();
        let added = store.append_many(&records)?;
        if added.start != self.spans {
            return Err(Error::Corrupt {
                path: self.dir.join(METADATA_DIR),
                reason: format!(
                    "metadata record {} was appended for span {}",
                    added.start, self.spans
                ),
            });
        }
        for s in order {
            let (start, end) = (base + s.start, base + s.end);
            self.reach = self.reach.max(end);
            for value in [start, end, self.reach] {
                let bytes = value.to_le_bytes();
                self.spans_crc.update(&bytes);
                self.span_entries.extend_from_slice(&bytes);
            }
            self.spans += 1;
        }
        self.dirty = true;
        Ok(())
    }

    /// Writes the pending entries to their files.
    fn write_pending(&mut self) -> Result<()> {
        let disk = &self.disk;
        let write = |file: &File, name: &str, bytes: &mut Vec<u8>, at: &mut u64, unit: u64| {
            if bytes.is_empty() {
                return Ok(());
            }
            let path = self.dir.join(name);
            disk.write_at(file, &path, bytes, *at * unit)
                .ctx("write", &path)?;
            *at += bytes.len() as u64 / unit;
            bytes.clear();
            Ok::<(), Error>(())
        };
        write(
            &self.crc_file,
            CRC_FILE,
            &mut self.crcs,
            &mut self.crcs_at,
            4,
        )?;
        write(
            &self.documents_file,
            DOCUMENTS_FILE,
            &mut self.ends,
            &mut self.documents_at,
            8,
        )?;
        write(
            &self.spans_file,
            SPANS_FILE,
            &mut self.span_entries,
            &mut self.spans_at,
            SPAN_BYTES,
        )?;
        Ok(())
    }

    /// Makes everything appended durable; returns the metadata to commit.
    fn commit(&mut self, old: &StreamMeta) -> Result<Option<StreamMeta>> {
        let disk = self.disk.clone();
        if !self.dirty {
            return Ok(None);
        }
        if self.tokens != self.last_end {
            return Err(Error::InvalidRecord(format!(
                "tokens {}..{} belong to no document yet: end the document before committing",
                self.last_end, self.tokens
            )));
        }
        self.write_pending()?;
        for (file, name) in [
            (&self.tokens_file, TOKENS_FILE),
            (&self.crc_file, CRC_FILE),
            (&self.documents_file, DOCUMENTS_FILE),
            (&self.spans_file, SPANS_FILE),
        ] {
            let path = self.dir.join(name);
            disk.sync(file, &path).ctx("fdatasync", &path)?;
        }
        if let Some(store) = &self.metadata {
            store.commit()?;
        }
        let meta = StreamMeta {
            tokens: self.tokens,
            documents: self.documents,
            spans: self.spans,
            tail_crc: self.page.clone().finalize(),
            documents_crc: self.documents_crc.clone().finalize(),
            spans_crc: self.spans_crc.clone().finalize(),
            ..old.clone()
        };
        meta.store(&disk, &self.dir)?;
        self.dirty = false;
        Ok(Some(meta))
    }
}

/// Refuses spans that are empty or reach outside a document of `len` tokens.
fn check_spans(len: u64, spans: &[Span]) -> Result<()> {
    match spans.iter().find(|s| s.start >= s.end || s.end > len) {
        Some(s) => Err(Error::InvalidRecord(format!(
            "span [{}, {}) is not a non-empty range inside its document of {len} tokens",
            s.start, s.end
        ))),
        None => Ok(()),
    }
}

/// The span metadata records of a stream with `spans` committed spans, opened for writing;
/// records past `spans` (appended before a crash) are dropped. `None` if none was made.
fn open_metadata(disk: &Disk, dir: &Path, spans: u64) -> Result<Option<Arc<Store>>> {
    let path = dir.join(METADATA_DIR);
    if !path.exists() {
        if spans > 0 {
            return Err(Error::Corrupt {
                path,
                reason: format!("missing, and {} commits {spans} spans", super::STREAM_FILE),
            });
        }
        return Ok(None);
    }
    let store = match Store::open_with(&path, runtime_on(disk)) {
        Ok(store) => store,
        // Made when the first span was added, before that span was committed: a crash
        // during its creation leaves a directory without meta.json.
        Err(Error::NotADataset { .. }) if spans == 0 => {
            disk.remove_tree(&path).ctx("remove", &path)?;
            super::super::meta::sync_dir(disk, dir)?;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let len = store.len();
    if len < spans {
        return Err(Error::Corrupt {
            path,
            reason: format!(
                "holds {len} metadata records, and {} commits {spans} spans",
                super::STREAM_FILE
            ),
        });
    }
    if len > spans {
        for index in (spans..len).rev() {
            store.delete(index)?;
        }
        store.commit()?;
    }
    Ok(Some(Arc::new(store)))
}

fn create_metadata(disk: &Disk, dir: &Path) -> Result<Store> {
    let options = CreateOptions {
        chunk_grow_bytes: 16 << 20,
        offset_grow_entries: 1 << 16,
        ..CreateOptions::default()
    };
    let store = Store::create_with(
        dir.join(METADATA_DIR),
        vec![FieldSpec::raw(METADATA_FIELD)],
        options,
        runtime_on(disk),
    )?;
    super::super::meta::sync_dir(disk, dir)?;
    Ok(store)
}

/// The metadata records' runtime: the default one, on the stream's disk.
fn runtime_on(disk: &Disk) -> crate::RuntimeOptions {
    crate::RuntimeOptions {
        disk: disk.clone(),
        ..crate::RuntimeOptions::default()
    }
}

/// The little-endian u64 at byte `at` of `file` (at `path`).
fn read_u64_at(file: &File, path: &Path, at: u64) -> Result<u64> {
    let mut entry = [0u8; 8];
    read_exact_at(file, path, &mut entry, at)?;
    Ok(u64::from_le_bytes(entry))
}

fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], at: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, at).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Corrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "ends before bytes {at}..{} that {} commits",
                    at + buf.len() as u64,
                    super::STREAM_FILE
                ),
            }
        } else {
            Error::Io {
                op: "read",
                path: path.to_path_buf(),
                source: e,
            }
        }
    })
}

impl Stream {
    fn tail(&self) -> Result<std::sync::MutexGuard<'_, Tail>> {
        match &self.writer {
            Some(tail) => Ok(tail.lock().unwrap_or_else(|e| e.into_inner())),
            None => Err(Error::ReadOnly {
                path: self.dir.clone(),
            }),
        }
    }

    /// Appends one document: its tokens (whole elements' bytes) and the spans of it that
    /// carry metadata (ranges of the document's tokens, non-empty, in any order). Returns
    /// the document's index. Visible and durable at the next [`Stream::commit`].
    pub fn append_document(&self, tokens: &[u8], spans: &[Span]) -> Result<u64> {
        let mut tail = self.tail()?;
        if tail.tokens != tail.last_end {
            return Err(Error::InvalidRecord(
                "a document is open (append_tokens without end_document): end it first".into(),
            ));
        }
        let base = tail.tokens;
        let e = tail.element_bytes;
        if !(tokens.len() as u64).is_multiple_of(e) {
            return Err(Error::InvalidRecord(format!(
                "{} bytes of tokens are not whole {e}-byte elements",
                tokens.len()
            )));
        }
        let len = tokens.len() as u64 / e;
        // Checked first: a refused span leaves nothing appended.
        check_spans(len, spans)?;
        tail.append_tokens(tokens)?;
        tail.add_spans(base, len, spans)?;
        tail.end_document()
    }

    /// Appends tokens to the open document (one that [`Stream::end_document`] ends), for
    /// documents too long to hand over at once and for converters. Returns the tokens
    /// appended so far.
    pub fn append_tokens(&self, tokens: &[u8]) -> Result<u64> {
        self.tail()?.append_tokens(tokens)
    }

    /// Ends the open document at the last token appended; returns its index.
    pub fn end_document(&self) -> Result<u64> {
        self.tail()?.end_document()
    }

    /// Ends documents at the token positions `ends` (absolute, ascending, none past the
    /// tokens appended): a converter's way to mark many boundaries at once.
    pub fn end_documents_at(&self, ends: &[u64]) -> Result<()> {
        let mut tail = self.tail()?;
        for &end in ends {
            tail.push_end(end)?;
        }
        Ok(())
    }

    /// Makes everything appended durable and visible to readers (of this handle at once,
    /// of others when they refresh).
    pub fn commit(&self) -> Result<()> {
        let mut tail = self.tail()?;
        let current = self.view();
        let Some(meta) = tail.commit(&current.meta)? else {
            return Ok(());
        };
        let metadata = tail.metadata.clone().filter(|_| meta.spans > 0);
        let view = StreamView::open(&self.dir, meta, Some(&current), metadata)?;
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
        Ok(())
    }

    /// Tokens appended so far, committed or not (the writer's position).
    pub fn appended(&self) -> Result<u64> {
        Ok(self.tail()?.tokens)
    }
}
