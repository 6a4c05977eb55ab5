//! Observations of a stream, computed at read time: windows of `W + 1` tokens every `S`
//! tokens (inputs and the labels shifted by one), or whole documents cut or padded to
//! `W + 1`. Either is an index space `[0, n)`, so samplers, mixtures and loaders use it as
//! they use records.
//!
//! A gather copies each observation's tokens once — from the mapping, or read from the disk
//! (whole 4 KiB pages, each checked against its CRC) — and gives each token its document
//! (a binary search per observation, then runs) and each observation the spans it overlaps.

use std::sync::Arc;

pub use zr_common::WindowMode;
use zr_common::{BoxError, Contiguous, GatherSource, WindowColumns};

use super::{Stream, StreamView, METADATA_FIELD};
use crate::error::{Error, Result};
use crate::explicit::{aligned, pages_around};
use crate::io::{self, ReadError, ReadOp};
use crate::map::PAGE_BYTES;
use crate::store::{GatherOptions, ReadPath};

/// One span an observation overlaps: `[start, end)` within the observation's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanHit {
    /// The observation's row in the batch.
    pub row: u64,
    pub start: u64,
    pub end: u64,
    /// The span's index in the stream (its metadata is record `span` of the metadata).
    pub span: u64,
}

/// A gathered batch of observations, `rows × width` tokens.
#[derive(Clone, Debug, Default)]
pub struct Observations {
    pub rows: usize,
    /// Tokens per row: `seq_len + 1`.
    pub width: usize,
    /// The tokens, `rows × width` elements.
    pub tokens: Vec<u8>,
    /// Each token's document index (-1 for padding).
    pub document: Vec<i64>,
    /// Document mode: 1 for a token, 0 for padding (empty for windows).
    pub mask: Vec<u8>,
    /// The spans each row overlaps, by row then start.
    pub spans: Vec<SpanHit>,
    /// The spans hit, each once, ascending; `metadata` holds their records in this order.
    pub span_ids: Vec<u64>,
    pub metadata: Contiguous,
}

/// The observations of a stream (see [`WindowMode`]).
#[derive(Clone, Debug)]
pub struct Windows {
    stream: Arc<Stream>,
    mode: WindowMode,
    options: GatherOptions,
}

impl Windows {
    /// Observations of `stream` as `mode` says; `seq_len` and `stride` must be at least 1.
    pub fn new(stream: Arc<Stream>, mode: WindowMode) -> Result<Windows> {
        mode.check()
            .map_err(|e| Error::InvalidRecord(e.to_string()))?;
        Ok(Windows {
            stream,
            mode,
            options: GatherOptions {
                read: ReadPath::Mmap,
                ..GatherOptions::default()
            },
        })
    }

    /// The same observations read as `options` say (the read path, `uncached`, `verify`).
    pub fn with_options(mut self, options: GatherOptions) -> Windows {
        self.options = options;
        self
    }

    /// The stream observed.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// The mode.
    pub fn mode(&self) -> WindowMode {
        self.mode
    }

    /// Tokens per observation: `seq_len + 1`.
    pub fn width(&self) -> usize {
        self.mode.width() as usize
    }

    /// Observations in the stream as this handle sees it.
    pub fn len(&self) -> u64 {
        count(&self.stream.view(), self.mode)
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What observation `i` holds: `(document, from, to)` per document it overlaps, the
    /// token range counted within the document; `None` past the end.
    pub fn pieces(&self, i: u64) -> Option<Vec<(u64, u64, u64)>> {
        let view = self.stream.view();
        if i >= count(&view, self.mode) {
            return None;
        }
        let width = self.mode.width();
        Some(match self.mode {
            WindowMode::Windows { stride, .. } => {
                let (start, end) = (i * stride, i * stride + width);
                let mut out = Vec::new();
                let mut d = view.document_of(start);
                while d < view.meta.documents && view.document_start(d) < end {
                    let first = view.document_start(d);
                    let (from, to) = (start.max(first), end.min(view.document_end(d)));
                    out.push((d, from - first, to - first));
                    d += 1;
                }
                out
            }
            WindowMode::Documents { .. } => {
                let len = view.document_end(i) - view.document_start(i);
                vec![(i, 0, len.min(width))]
            }
        })
    }

    /// Gathers observations `indices` into `out` (its buffers reused).
    pub fn gather(&self, indices: &[u64], out: &mut Observations) -> Result<()> {
        let width = self.width();
        let e = self.stream.view().element_bytes as usize;
        out.rows = indices.len();
        out.width = width;
        out.tokens.resize(indices.len() * width * e, 0);
        out.document.resize(indices.len() * width, 0);
        let documents = matches!(self.mode, WindowMode::Documents { .. });
        out.mask
            .resize(if documents { indices.len() * width } else { 0 }, 0);
        let mask = documents.then_some(&mut out.mask[..]);
        let mut spans = SpanSink {
            hits: std::mem::take(&mut out.spans),
            ids: std::mem::take(&mut out.span_ids),
            metadata: std::mem::take(&mut out.metadata),
        };
        let result = self.gather_to(
            indices,
            &mut out.tokens,
            Some(&mut out.document),
            mask,
            Some(&mut spans),
        );
        out.spans = spans.hits;
        out.span_ids = spans.ids;
        out.metadata = spans.metadata;
        result
    }

    /// Gathers observations `indices` into the caller's buffers: `tokens` of `rows × width`
    /// elements, and optionally `document` of `rows × width`, `mask` (document mode) of
    /// `rows × width`, and the spans hit.
    pub fn gather_to(
        &self,
        indices: &[u64],
        tokens: &mut [u8],
        document: Option<&mut [i64]>,
        mask: Option<&mut [u8]>,
        spans: Option<&mut SpanSink>,
    ) -> Result<()> {
        let view = self.stream.view();
        let width = self.width();
        let e = view.element_bytes as usize;
        let rows = indices.len();
        if tokens.len() != rows * width * e
            || document.as_ref().is_some_and(|d| d.len() != rows * width)
            || mask.as_ref().is_some_and(|m| m.len() != rows * width)
        {
            return Err(Error::InvalidRecord(format!(
                "buffers for {rows} observations of {width} tokens hold {} token bytes (need {}), and {} document and {} mask entries (need {} each)",
                tokens.len(),
                rows * width * e,
                document.as_ref().map_or(0, |d| d.len()),
                mask.as_ref().map_or(0, |m| m.len()),
                rows * width,
            )));
        }
        // Where each row's tokens come from: (first token, tokens to copy).
        let n = count(&view, self.mode);
        let mut layout = Layout::with_rows(rows);
        for &i in indices {
            if i >= n {
                return Err(Error::IndexOutOfRange { index: i, len: n });
            }
            layout.push(match self.mode {
                WindowMode::Windows { stride, .. } => (i * stride, width as u64),
                WindowMode::Documents { .. } => {
                    let (start, end) = (view.document_start(i), view.document_end(i));
                    (start, (end - start).min(width as u64))
                }
            });
            layout.end_row();
        }
        lay_rows(
            &view,
            &layout,
            width,
            self.options,
            tokens,
            document,
            mask,
            spans,
        )
    }
}

/// Where a gather's tokens come from: per row, ranges of the stream laid back to back from
/// the row's start, the rest of the row padding.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    /// (first token, tokens) of every range, row after row.
    pub(crate) ranges: Vec<(u64, u64)>,
    /// Row r's ranges are `ranges[ends[r - 1]..ends[r]]`.
    ends: Vec<usize>,
}

impl Layout {
    pub(crate) fn with_rows(rows: usize) -> Layout {
        Layout {
            ranges: Vec::with_capacity(rows),
            ends: Vec::with_capacity(rows),
        }
    }

    /// A range of the row being laid out.
    pub(crate) fn push(&mut self, range: (u64, u64)) {
        self.ranges.push(range);
    }

    /// Ends the row being laid out.
    pub(crate) fn end_row(&mut self) {
        self.ends.push(self.ranges.len());
    }

    /// Each row's ranges, in order.
    fn rows(&self) -> impl Iterator<Item = &[(u64, u64)]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(start, end)| &self.ranges[start..end])
    }
}

/// Copies `layout`'s ranges into rows of `width` tokens (read as `options` say), pads each
/// row's rest with zeros, and fills what else is asked: each token's document (-1 for
/// padding), the mask (1 for a token, 0 for padding) and the spans each row overlaps.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lay_rows(
    view: &StreamView,
    layout: &Layout,
    width: usize,
    options: GatherOptions,
    tokens: &mut [u8],
    mut document: Option<&mut [i64]>,
    mut mask: Option<&mut [u8]>,
    mut spans: Option<&mut SpanSink>,
) -> Result<()> {
    let e = view.element_bytes as usize;
    for &(start, len) in &layout.ranges {
        if start + len > view.meta.tokens {
            return Err(Error::InvalidRecord(format!(
                "tokens {start}..{} lie past the stream's end ({} tokens)",
                start + len,
                view.meta.tokens
            )));
        }
    }
    let explicit = match options.read {
        ReadPath::Mmap => false,
        ReadPath::Direct => true,
        ReadPath::Auto => !resident(view, &layout.ranges),
    };
    // Each range's place in `tokens`, in bytes.
    let mut places = Vec::with_capacity(layout.ranges.len());
    let mut used = Vec::with_capacity(layout.ends.len());
    for (k, row) in layout.rows().enumerate() {
        let mut at = 0usize;
        for &(_, len) in row {
            places.push((k * width + at) * e);
            at += len as usize;
        }
        if at > width {
            return Err(Error::InvalidRecord(format!(
                "row {k} is laid out with {at} tokens, more than its {width}"
            )));
        }
        used.push(at);
    }
    if explicit {
        read_explicit(view, &layout.ranges, &places, tokens, options)?;
    } else {
        for (&(start, len), &place) in layout.ranges.iter().zip(&places) {
            let bytes = view.token_bytes(start, len);
            if options.verify {
                check_range(view, start, len)?;
            }
            tokens[place..place + bytes.len()].copy_from_slice(bytes);
        }
    }
    for (k, &at) in used.iter().enumerate() {
        tokens[(k * width + at) * e..(k + 1) * width * e].fill(0);
    }
    if let Some(sink) = spans.as_deref_mut() {
        sink.hits.clear();
        sink.ids.clear();
    }
    for (k, (row, &at)) in layout.rows().zip(&used).enumerate() {
        let mut pos = 0usize;
        for &(start, len) in row {
            if let Some(document) = document.as_deref_mut() {
                let out = &mut document[k * width + pos..k * width + pos + len as usize];
                fill_documents(view, start, out);
            }
            if let Some(sink) = spans.as_deref_mut() {
                sink.collect(view, k as u64, pos as u64, start, len);
            }
            pos += len as usize;
        }
        if let Some(document) = document.as_deref_mut() {
            document[k * width + at..(k + 1) * width].fill(-1);
        }
        if let Some(mask) = mask.as_deref_mut() {
            let row = &mut mask[k * width..(k + 1) * width];
            row[..at].fill(1);
            row[at..].fill(0);
        }
    }
    if let Some(sink) = spans {
        sink.finish(view)?;
    }
    Ok(())
}

/// Where a gather puts the spans it finds (see [`Observations`]).
#[derive(Debug, Default)]
pub struct SpanSink {
    pub hits: Vec<SpanHit>,
    pub ids: Vec<u64>,
    pub metadata: Contiguous,
}

impl SpanSink {
    /// Records the spans that overlap tokens `[start, start + len)`, laid at `at` in row
    /// `row`.
    fn collect(&mut self, view: &StreamView, row: u64, at: u64, start: u64, len: u64) {
        let spans = view.meta.spans;
        if spans == 0 || len == 0 {
            return;
        }
        let end = start + len;
        // The first span that reaches past `start` (reach is non-decreasing).
        let (mut lo, mut hi) = (0, spans);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if view.span(mid).2 > start {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let mut j = lo;
        while j < spans {
            let (s, t, _) = view.span(j);
            if s >= end {
                break;
            }
            if t > start {
                self.hits.push(SpanHit {
                    row,
                    start: at + s.max(start) - start,
                    end: at + t.min(end) - start,
                    span: j,
                });
                self.ids.push(j);
            }
            j += 1;
        }
    }

    /// Deduplicates the spans hit and reads their metadata.
    fn finish(&mut self, view: &StreamView) -> Result<()> {
        self.ids.sort_unstable();
        self.ids.dedup();
        self.metadata.data.clear();
        self.metadata.offsets.clear();
        self.metadata.offsets.push(0);
        if self.ids.is_empty() {
            return Ok(());
        }
        self.metadata = metadata_of(view, &self.ids)?;
        Ok(())
    }
}

/// Metadata records `ids` (committed spans) in order.
pub(crate) fn metadata_of(view: &StreamView, ids: &[u64]) -> Result<Contiguous> {
    let Some(store) = &view.metadata else {
        return Err(Error::Corrupt {
            path: std::path::PathBuf::from(super::METADATA_DIR),
            reason: "the stream has spans and no metadata records".into(),
        });
    };
    let batch = store.gather(ids, &[METADATA_FIELD])?;
    let mut out = Contiguous::default();
    if let Some(field) = batch.field(METADATA_FIELD) {
        field.write_contiguous(&mut out.data, &mut out.offsets);
    }
    Ok(out)
}

/// Observations of `mode` in `view`.
fn count(view: &StreamView, mode: WindowMode) -> u64 {
    mode.count(view.meta.tokens, view.meta.documents)
}

/// Each of tokens `[start, start + out.len())`'s document.
fn fill_documents(view: &StreamView, start: u64, out: &mut [i64]) {
    if out.is_empty() {
        return;
    }
    let end = start + out.len() as u64;
    let mut d = view.document_of(start);
    let mut pos = start;
    while pos < end && d < view.meta.documents {
        let stop = view.document_end(d).min(end);
        if stop > pos {
            out[(pos - start) as usize..(stop - start) as usize].fill(d as i64);
            pos = stop;
        }
        d += 1;
    }
}

/// True if the pages of a sample of `ranges` are in the page cache.
fn resident(view: &StreamView, ranges: &[(u64, u64)]) -> bool {
    let Some(map) = &view.tokens else {
        return true;
    };
    let e = view.element_bytes;
    let take = ranges.len().min(4);
    (0..take).all(|k| {
        let (start, len) = ranges[k * ranges.len() / take];
        map.resident(start * e, len * e)
    })
}

/// The CRC of page `p` of tokens.bin as the view commits it, and the bytes it covers:
/// whole pages from `tokens.crc`, the tail page from `stream.json`.
pub(super) fn page_crc(view: &StreamView, p: u64) -> Option<(u32, u64)> {
    let token_bytes = view.meta.tokens * view.element_bytes;
    let full = token_bytes / PAGE_BYTES;
    if p < full {
        let bytes = view.crcs.as_ref()?.bytes(p * 4, 4)?;
        Some((u32::from_le_bytes(bytes.try_into().ok()?), PAGE_BYTES))
    } else if p == full && !token_bytes.is_multiple_of(PAGE_BYTES) {
        Some((view.meta.tail_crc, token_bytes % PAGE_BYTES))
    } else {
        None
    }
}

/// Checks the pages `bytes` holds, which start at page `first_page` (the last one may be
/// cut short where the read stopped).
fn check_pages(view: &StreamView, first_page: u64, bytes: &[u8]) -> Result<()> {
    for (k, page) in bytes.chunks(PAGE_BYTES as usize).enumerate() {
        let p = first_page + k as u64;
        let Some((crc, len)) = page_crc(view, p) else {
            continue;
        };
        let Some(covered) = page.get(..len as usize) else {
            continue;
        };
        if crc32fast::hash(covered) != crc {
            return Err(Error::Corrupt {
                path: view_path(view),
                reason: format!(
                    "bytes {}..{} do not match their CRC",
                    p * PAGE_BYTES,
                    p * PAGE_BYTES + len
                ),
            });
        }
    }
    Ok(())
}

/// Checks the pages under tokens `[start, start + len)` through the mapping.
fn check_range(view: &StreamView, start: u64, len: u64) -> Result<()> {
    let e = view.element_bytes;
    let token_bytes = view.meta.tokens * e;
    let first = start * e / PAGE_BYTES;
    let last = ((start + len) * e)
        .div_ceil(PAGE_BYTES)
        .min(token_bytes.div_ceil(PAGE_BYTES));
    let Some(map) = &view.tokens else {
        return Ok(());
    };
    let from = first * PAGE_BYTES;
    let to = (last * PAGE_BYTES).min(token_bytes);
    let bytes = map.bytes(from, to.saturating_sub(from)).unwrap_or_default();
    check_pages(view, first, bytes)
}

fn view_path(view: &StreamView) -> std::path::PathBuf {
    view.tokens
        .as_ref()
        .map(|m| m.path().to_path_buf())
        .unwrap_or_default()
}

/// Reads each range's tokens from the disk: the whole pages under it, at once (io_uring or
/// `preadv` threads), each page checked against its CRC, then copied to its place (a byte
/// offset in `tokens`).
fn read_explicit(
    view: &StreamView,
    ranges: &[(u64, u64)],
    places: &[usize],
    tokens: &mut [u8],
    options: GatherOptions,
) -> Result<()> {
    let Some(map) = &view.tokens else {
        return Ok(());
    };
    let e = view.element_bytes;
    let file_len = map.len();
    // Per range: its first page, and the bytes to read from there.
    let pages: Vec<(u64, u64)> = ranges
        .iter()
        .map(|&(start, len)| {
            let (first, bytes) = pages_around(start * e, len * e);
            // Through the cache, the last page is read only as far as the file goes.
            let bytes = if options.uncached {
                bytes
            } else {
                bytes.min(file_len - first)
            };
            (first, bytes)
        })
        .collect();
    let total: u64 = pages.iter().map(|p| p.1).sum();
    let (mut scratch, base) = aligned(total as usize);
    let fd = if options.uncached {
        map.uncached_fd()?
    } else {
        map.fd()?
    };
    {
        let mut rest = &mut scratch[base..base + total as usize];
        let mut ops = Vec::with_capacity(ranges.len());
        for (&(start, len), &(first, bytes)) in ranges.iter().zip(&pages) {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(bytes as usize);
            rest = tail;
            ops.push(if options.uncached {
                let need = ((start + len) * e - first) as usize;
                ReadOp::aligned(fd, first, piece, need)
            } else {
                ReadOp::new(fd, first, piece, &mut [])
            });
        }
        io::read_all(&mut ops, options.io).map_err(|failure| {
            let (first, bytes) = pages[failure.op];
            match failure.error {
                ReadError::Eof { read } => Error::Corrupt {
                    path: map.path().to_path_buf(),
                    reason: format!(
                        "the file ends inside bytes {first}..{} (the read found {read} bytes; truncated?)",
                        first + bytes
                    ),
                },
                ReadError::Io(source) => Error::Io {
                    op: "read",
                    path: map.path().to_path_buf(),
                    source,
                },
            }
        })?;
    }
    let mut at = base;
    for ((&(start, len), &(first, bytes)), &place) in ranges.iter().zip(&pages).zip(places) {
        let read = &scratch[at..at + bytes as usize];
        check_pages(view, first / PAGE_BYTES, read)?;
        let from = (start * e - first) as usize;
        let n = (len * e) as usize;
        tokens[place..place + n].copy_from_slice(&read[from..from + n]);
        at += bytes as usize;
    }
    Ok(())
}

impl GatherSource for Windows {
    /// Columns `tokens` (rows of `width` elements), `document` (i64 per token) and, in
    /// document mode, `mask`; `fields` picks and orders them (empty: all).
    fn gather_into(
        &self,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), BoxError> {
        let mut out = Observations::default();
        self.gather(indices, &mut out)?;
        WindowColumns {
            rows: out.rows,
            width: out.width,
            element_bytes: self.stream.view().element_bytes as usize,
            tokens: out.tokens,
            document: out.document,
            mask: out.mask,
        }
        .into_columns(fields, columns)
    }
}
