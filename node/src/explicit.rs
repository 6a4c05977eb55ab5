//! The explicit read path: gathers of data that is not in memory.
//!
//! Through the mappings, every record that is not in the page cache costs a page fault, and
//! a thread takes its faults one at a time. Here a gather reads in at most two rounds, each
//! issued all at once (see `io`): the offset entries its indices need (when the offset
//! table's pages are not in memory either), then exactly each record's frame — header and
//! payload — into buffers the batch owns, raw payloads straight into the field's column.
//! Every frame read is checked as `verify` checks it: header, lengths, CRC.
//!
//! With `uncached` the payload reads bypass the page cache (`O_DIRECT`): each covers the
//! 4 KiB pages around its frame, read into an aligned scratch buffer and copied out. Offset
//! entries are still read through the cache, which keeps the (small) tables.
//!
//! `Auto` chooses per gather: `mincore` on a sample of the pages a gather needs (a few
//! syscalls, not one per record) tells whether the mappings can serve it from memory.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::batch::{Batch, Column, ColumnData, Span};
use crate::error::{Error, Result};
use crate::frame::{FrameHeader, FRAME_HEADER_BYTES};
use crate::io::{self, Issued, ReadError, ReadOp};
use crate::map::{Mapped, PAGE_BYTES};
use crate::meta::Compression;
use crate::offset::{Entry, ENTRY_BYTES};
use crate::store::{GatherOptions, Store};
use crate::unit::split;
use crate::view::{Maps, Published, View};

/// Records of a gather whose pages `Auto` checks.
const RESIDENCY_SAMPLES: usize = 4;
/// After a check finds a gather's pages in memory, `Auto` reads through the mappings for
/// this long without checking again. A check costs up to eight system calls (the sampled
/// offset entries, then the sampled frames): measured, a zero-copy gather of 1,024 warm
/// records went from about 6 to 23 µs with a check on every gather. A node of a cluster
/// serves a gather every millisecond or two, so at 2 ms it checked on nearly every one:
/// 4-5% of the nodes' CPU in `cluster_bench --sizes 1024` (one hop), gone at 20 ms. A
/// dataset that goes cold meanwhile costs at most the gathers of one window read through
/// page faults; a gather that faults takes longer than the window itself.
const WARM_RECHECK_NS: u64 = 20_000_000;

/// Nanoseconds on a monotonic clock since this process first asked.
pub(crate) fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// Up to [`RESIDENCY_SAMPLES`] positions spread over `0..n`.
fn sample(n: usize) -> impl Iterator<Item = usize> {
    let take = n.min(RESIDENCY_SAMPLES);
    (0..take).map(move |k| k * n / take)
}

/// A buffer of at least `len` bytes whose `start..start + len` begins on a page.
pub(crate) fn aligned(len: usize) -> (Vec<u8>, usize) {
    let buffer = vec![0u8; len + PAGE_BYTES as usize];
    let start = buffer.as_ptr().align_offset(PAGE_BYTES as usize);
    (buffer, start)
}

/// The page-aligned range around `[start, start + len)`.
pub(crate) fn pages_around(start: u64, len: u64) -> (u64, u64) {
    let first = start / PAGE_BYTES * PAGE_BYTES;
    let end = (start + len).div_ceil(PAGE_BYTES) * PAGE_BYTES;
    (first, end - first)
}

/// One range of a file to read for the gather: `len` bytes of `file` at `offset`.
struct Wanted<'m> {
    file: &'m Mapped,
    offset: u64,
    len: u64,
}

impl Store {
    /// True while a recent residency check found a gather's pages in memory (see
    /// [`WARM_RECHECK_NS`]).
    pub(crate) fn recently_warm(&self) -> bool {
        now_ns()
            < self
                .inner
                .read_counters
                .warm_until_ns
                .load(Ordering::Relaxed)
    }

    /// Records that a residency check found a gather's pages in memory just now.
    pub(crate) fn found_warm(&self) {
        self.inner
            .read_counters
            .warm_until_ns
            .store(now_ns() + WARM_RECHECK_NS, Ordering::Relaxed);
    }

    /// True if the first field's offset entries of a sample of `indices` are in memory.
    pub(crate) fn entries_resident(&self, view: &View, fields: &[usize], indices: &[u64]) -> bool {
        let Some(&field) = fields.first() else {
            return true;
        };
        sample(indices.len()).all(|k| {
            let (unit, index) = split(indices[k]);
            view.maps
                .table(unit, field)
                .is_none_or(|table| table.resident(index.saturating_mul(ENTRY_BYTES), ENTRY_BYTES))
        })
    }

    /// True if the first field's frames of a sample of `spans` are in memory.
    pub(crate) fn payloads_resident(&self, maps: &Maps, spans: &[Vec<Span>]) -> bool {
        let Some(spans) = spans.first() else {
            return true;
        };
        sample(spans.len()).all(|k| {
            let span = spans[k];
            span.len == 0
                || maps.chunk(span.chunk).is_some_and(|chunk| {
                    chunk.resident(
                        span.start - FRAME_HEADER_BYTES,
                        FRAME_HEADER_BYTES + span.len as u64,
                    )
                })
        })
    }

    /// Resolves `indices` of `fields` to checked spans, reading the offset entries from the
    /// offset tables explicitly (entries changed since the last commit come from the
    /// overlay). Runs under the view's read lock, as resolving through the mappings does.
    pub(crate) fn resolve_explicit(
        &self,
        view: &View,
        fields: &[usize],
        indices: &[u64],
        options: GatherOptions,
    ) -> Result<Vec<Vec<Span>>> {
        let n = indices.len();
        let mut raw = vec![[0u8; 16]; fields.len() * n];
        let mut known: Vec<Option<Entry>> = vec![None; fields.len() * n];
        // Entries to read: `read[slot]`, and their ranges in slot order.
        let mut read = vec![false; fields.len() * n];
        let mut ranges: Vec<Wanted> = Vec::new();
        for (f, &field) in fields.iter().enumerate() {
            for (k, &address) in indices.iter().enumerate() {
                let slot = f * n + k;
                let (unit, index) = split(address);
                if !view.overlay.is_empty()
                    && view.lengths(unit).is_some_and(|l| index < l.committed)
                {
                    if let Some(entries) = view.overlay.get(&address) {
                        known[slot] = entries.get(field).copied();
                        continue;
                    }
                }
                let table = view.maps.table(unit, field);
                let at = index.checked_mul(ENTRY_BYTES);
                match (table, at) {
                    (Some(table), Some(at)) if at + ENTRY_BYTES <= table.len() => {
                        read[slot] = true;
                        ranges.push(Wanted {
                            file: table,
                            offset: at,
                            len: ENTRY_BYTES,
                        });
                    }
                    // Left unknown: `span_of` names the record.
                    _ => {}
                }
            }
        }
        let targets: Vec<(&mut [u8], &mut [u8])> = raw
            .iter_mut()
            .zip(&read)
            .filter(|(_, &read)| read)
            .map(|(entry, _)| (&mut entry[..], &mut [][..]))
            .collect();
        // Entries go through the page cache even when payloads bypass it: a table is a
        // sixty-fourth of 1 KiB records' data, and each entry read around it would cost a
        // whole page every time.
        let cached = GatherOptions {
            uncached: false,
            ..options
        };
        self.read_ranges(&ranges, targets, cached)?;
        for (slot, _) in read.iter().enumerate().filter(|(_, &read)| read) {
            known[slot] = Some(Entry::decode(raw[slot]));
        }
        let mut resolved = Vec::with_capacity(fields.len());
        for (f, &field) in fields.iter().enumerate() {
            let spans = indices
                .iter()
                .enumerate()
                .map(|(k, &index)| self.span_of(&view.maps, field, index, known[f * n + k]))
                .collect::<Result<Vec<Span>>>()?;
            resolved.push(spans);
        }
        Ok(resolved)
    }

    /// Reads each of `ranges` into the matching pair of `targets` (the first filled first;
    /// together as long as the range), through the page cache or around it as `options`
    /// say; errors name the file.
    fn read_ranges(
        &self,
        ranges: &[Wanted],
        mut targets: Vec<(&mut [u8], &mut [u8])>,
        options: GatherOptions,
    ) -> Result<Issued> {
        if !options.uncached {
            let mut ops = Vec::with_capacity(ranges.len());
            for (range, (first, second)) in ranges.iter().zip(targets.iter_mut()) {
                ops.push(ReadOp::new(range.file.fd()?, range.offset, first, second));
            }
            return io::read_all(&mut ops, options.io)
                .map_err(|f| read_error(&ranges[f.op], f.error));
        }
        // O_DIRECT: whole pages into an aligned scratch buffer, then copied out.
        let pages: Vec<(u64, u64)> = ranges
            .iter()
            .map(|r| pages_around(r.offset, r.len))
            .collect();
        let total: u64 = pages.iter().map(|p| p.1).sum();
        let (mut scratch, start) = aligned(total as usize);
        let fds = ranges
            .iter()
            .map(|r| r.file.uncached_fd())
            .collect::<Result<Vec<_>>>()?;
        let issued = {
            let mut rest = &mut scratch[start..start + total as usize];
            let mut ops = Vec::with_capacity(ranges.len());
            for ((range, &(first, len)), &fd) in ranges.iter().zip(&pages).zip(&fds) {
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(len as usize);
                rest = tail;
                let need = (range.offset + range.len - first) as usize;
                ops.push(ReadOp::aligned(fd, first, piece, need));
            }
            io::read_all(&mut ops, options.io).map_err(|f| read_error(&ranges[f.op], f.error))?
        };
        let mut at = start;
        for ((range, &(first, len)), (head, tail)) in
            ranges.iter().zip(&pages).zip(targets.iter_mut())
        {
            let from = at + (range.offset - first) as usize;
            let middle = from + head.len();
            head.copy_from_slice(&scratch[from..middle]);
            tail.copy_from_slice(&scratch[middle..middle + tail.len()]);
            at += len as usize;
        }
        Ok(issued)
    }

    /// Reads the frames of `spans` explicitly and builds the batch from them.
    pub(crate) fn read_explicit(
        &self,
        maps: Arc<Published>,
        fields: Vec<usize>,
        indices: &[u64],
        resolved: Vec<Vec<Span>>,
        options: GatherOptions,
    ) -> Result<Batch> {
        let inner = &*self.inner;
        let n = indices.len();
        // Per field: the payloads back to back (by stored length), and each frame's header.
        let mut payloads: Vec<Vec<u8>> = resolved
            .iter()
            .map(|spans| vec![0u8; spans.iter().map(|s| s.len as usize).sum()])
            .collect();
        let mut headers: Vec<Vec<[u8; 16]>> = vec![vec![[0u8; 16]; n]; fields.len()];
        let mut ranges: Vec<Wanted> = Vec::new();
        for (f, spans) in resolved.iter().enumerate() {
            for (k, span) in spans.iter().enumerate() {
                if span.len == 0 {
                    self.check_absent(fields[f], indices[k])?;
                    continue;
                }
                let file = maps.chunk(span.chunk).ok_or_else(|| {
                    self.bad(
                        fields[f],
                        indices[k],
                        format!("chunk {} is gone", span.chunk),
                    )
                })?;
                ranges.push(Wanted {
                    file,
                    offset: span.start - FRAME_HEADER_BYTES,
                    len: FRAME_HEADER_BYTES + span.len as u64,
                });
            }
        }
        // Header and payload straight to their places, one read each.
        let mut targets = Vec::with_capacity(ranges.len());
        for (payload, (spans, heads)) in payloads
            .iter_mut()
            .zip(resolved.iter().zip(headers.iter_mut()))
        {
            let mut rest = &mut payload[..];
            for (span, head) in spans.iter().zip(heads.iter_mut()) {
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(span.len as usize);
                rest = tail;
                if span.len > 0 {
                    targets.push((&mut head[..], piece));
                }
            }
        }
        let issued = self.read_ranges(&ranges, targets, options)?;
        inner.read_counters.direct.fetch_add(1, Ordering::Relaxed);
        if issued == Issued::Uring {
            inner.read_counters.uring.fetch_add(1, Ordering::Relaxed);
        }

        let mut columns = Vec::with_capacity(fields.len());
        for (f, &field) in fields.iter().enumerate() {
            let spec = &inner.fields[field];
            let spans = &resolved[f];
            let mut offsets = Vec::with_capacity(n + 1);
            offsets.push(0u64);
            let mut logical = Vec::with_capacity(n);
            let mut cursor = 0usize;
            for (k, span) in spans.iter().enumerate() {
                let len = span.len as usize;
                if len == 0 {
                    logical.push(0u64);
                    continue;
                }
                let payload = &payloads[f][cursor..cursor + len];
                cursor += len;
                let header = self.check_frame(field, indices[k], span, headers[f][k], payload)?;
                logical.push(header.logical_len as u64);
            }
            for len in &logical {
                offsets.push(offsets.last().copied().unwrap_or(0) + len);
            }
            let bytes = match spec.compress {
                Compression::Raw => std::mem::take(&mut payloads[f]),
                Compression::Flate | Compression::Zstd => {
                    let total = offsets.last().copied().unwrap_or(0) as usize;
                    let mut bytes = vec![0u8; total];
                    let mut decoder =
                        crate::codec::Decoder::new(spec.compress, inner.dicts[field].clone());
                    let mut cursor = 0usize;
                    for (k, span) in spans.iter().enumerate() {
                        let len = span.len as usize;
                        if len == 0 {
                            continue;
                        }
                        let input = &payloads[f][cursor..cursor + len];
                        cursor += len;
                        let out = &mut bytes[offsets[k] as usize..offsets[k + 1] as usize];
                        decoder
                            .decode(input, out)
                            .map_err(|e| self.bad(field, indices[k], e.to_string()))?;
                    }
                    bytes
                }
            };
            columns.push(Column {
                name: spec.name.clone(),
                data: ColumnData::Owned { bytes, offsets },
            });
        }
        Ok(Batch {
            maps,
            runtime: Arc::clone(&inner.runtime),
            len: n,
            columns,
        })
    }

    /// Checks a frame read from the disk against its entry: header, lengths and CRC.
    fn check_frame(
        &self,
        field: usize,
        index: u64,
        span: &Span,
        header: [u8; 16],
        payload: &[u8],
    ) -> Result<FrameHeader> {
        let header = self.check_header(field, index, span, header)?;
        self.check_payload(field, index, header, payload)?;
        Ok(header)
    }
}

/// The error of a failed read of `range`, naming its file.
fn read_error(range: &Wanted, error: ReadError) -> Error {
    match error {
        ReadError::Eof { read } => Error::Corrupt {
            path: range.file.path().to_path_buf(),
            reason: format!(
                "the file ends inside bytes {}..{}, which an offset entry points at (the read found {read} bytes; truncated?)",
                range.offset,
                range.offset + range.len
            ),
        },
        ReadError::Io(source) => Error::Io {
            op: "read",
            path: range.file.path().to_path_buf(),
            source,
        },
    }
}
