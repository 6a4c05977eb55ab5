//! Gathers: indices → spans (under the view's read lock) → a `Batch`.
//!
//! Large gathers are cut into parts that the reader pool handles in parallel, each part
//! writing its own slice of the result, so the caller's order holds without reordering.
//! Resolution prefetches offset entries a few indices ahead: random entries are cache misses,
//! and overlapping them is most of a zero-copy gather's speed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rayon::prelude::*;

use crate::batch::{Batch, Column, ColumnData, Span};
use crate::error::{Error, Result};
use crate::frame::{frame_crc, FrameHeader, FRAME_HEADER_BYTES};
use crate::map::{Mapped, Region};
use crate::meta::Compression;
use crate::offset::{Entry, ENTRY_BYTES};
use crate::runtime::part_len;
use crate::store::{GatherOptions, ReadPath, Store};
use crate::unit::{first_chunk, split};
use crate::view::{out_of_range, Maps, View};

/// How many indices ahead of the one being resolved a gather prefetches offset entries.
const ENTRY_PREFETCH_AHEAD: usize = 16;
/// Fewest indices per part when resolving in parallel (resolving is cheap).
const RESOLVE_PART_MIN: usize = 8192;
/// Fewest bytes per part when copying a gather into the caller's memory in parallel (waking
/// the reader threads costs more than copying a few MiB).
const COPY_PART_MIN_BYTES: usize = 2 << 20;
/// Fewest records per part when decompressing in parallel.
const INFLATE_PART_MIN: usize = 64;

impl Store {
    /// Gathers records `indices` (any order, repeats allowed) for `fields` (empty = all
    /// fields, in schema order).
    /// Reads as [`Store::with_gather_options`] set (by default: [`GatherOptions::default`]).
    pub fn gather(&self, indices: &[u64], fields: &[&str]) -> Result<Batch> {
        self.gather_with(indices, fields, self.defaults)
    }

    /// Gathers field `field` of records `indices` straight into `out`, the caller's memory
    /// (a NumPy array, a pinned buffer): record k's bytes at `k * size`, for a field whose
    /// dtype and shape fix every record's `size`. One copy, from the mapped chunks (or the
    /// decompressed payloads) into `out`, which must be exactly `indices.len() * size` long.
    pub fn gather_into(&self, indices: &[u64], field: &str, out: &mut [u8]) -> Result<()> {
        self.gather_into_with(indices, field, out, self.defaults)
    }

    /// [`Store::gather_into`] with options (`verify` to check each record's CRC).
    pub fn gather_into_with(
        &self,
        indices: &[u64],
        field: &str,
        out: &mut [u8],
        options: GatherOptions,
    ) -> Result<()> {
        let spec = &self.inner.fields[self.field_id(field)?];
        let Some(size) = spec.record_bytes() else {
            return Err(Error::InvalidRecord(format!(
                "field '{field}' has no fixed record size (give it a dtype and shape), so it cannot be gathered into one buffer"
            )));
        };
        let size = size as usize;
        if out.len() != indices.len() * size {
            return Err(Error::InvalidRecord(format!(
                "the destination holds {} bytes; {} records of field '{field}' take {}",
                out.len(),
                indices.len(),
                indices.len() * size
            )));
        }
        let batch = self.gather_with(indices, &[field], options)?;
        let view = batch.field(field).ok_or_else(|| {
            Error::InvalidRecord(format!("field '{field}' missing from the batch"))
        })?;
        // Split across the reader threads when large (waking them costs more than copying a
        // few MiB); each part copies its records back to back, prefetching ahead.
        let runtime = &self.inner.runtime;
        let part_min = (COPY_PART_MIN_BYTES / size).max(1);
        let copy = |first: usize, part: &mut [u8]| -> Result<()> {
            let records = first..first + part.len() / size;
            view.copy_fixed_into(records.clone(), size, part)
                .map_err(|k| {
                    let k = records.start + k;
                    Error::BadRecord {
                        field: field.to_string(),
                        index: indices[k],
                        // An absent field (length 0) in a fixed-size column: no value to give.
                        reason: format!(
                            "holds {} bytes, not {size}",
                            view.get(k).map_or(0, <[u8]>::len)
                        ),
                    }
                })
        };
        match (
            part_len(runtime, indices.len(), part_min),
            runtime.readers(),
        ) {
            (Some(part), Some(pool)) => pool.install(|| {
                out.par_chunks_mut(part * size)
                    .enumerate()
                    .try_for_each(|(p, slots)| copy(p * part, slots))
            }),
            _ => copy(0, out),
        }
    }

    /// [`Store::gather`] with options.
    pub fn gather_with(
        &self,
        indices: &[u64],
        fields: &[&str],
        options: GatherOptions,
    ) -> Result<Batch> {
        let inner = &*self.inner;
        let field_ids: Vec<usize> = if fields.is_empty() {
            (0..inner.fields.len()).collect()
        } else {
            fields
                .iter()
                .map(|name| self.field_id(name))
                .collect::<Result<_>>()?
        };

        // Resolve indices to spans under the read lock: entries cannot change meanwhile.
        let view = inner.read_view();
        view.check_all(indices)?;
        let maps = Arc::clone(&view.maps);
        // `Auto` checks residency (a few system calls) unless a check found the pages in
        // memory moments ago.
        let check = options.read == ReadPath::Auto && !self.recently_warm();
        let entries_cold = match options.read {
            ReadPath::Mmap => false,
            ReadPath::Direct => true,
            ReadPath::Auto => check && !self.entries_resident(&view, &field_ids, indices),
        };
        let resolved = if entries_cold {
            self.resolve_explicit(&view, &field_ids, indices, options)?
        } else {
            let mut resolved = Vec::with_capacity(field_ids.len());
            for &field in &field_ids {
                let mut spans = vec![Span::default(); indices.len()];
                match (
                    part_len(&inner.runtime, indices.len(), RESOLVE_PART_MIN),
                    inner.runtime.readers(),
                ) {
                    (Some(part), Some(pool)) => pool.install(|| {
                        indices
                            .par_chunks(part)
                            .zip(spans.par_chunks_mut(part))
                            .try_for_each(|(indices, spans)| {
                                self.resolve(&view, field, indices, spans)
                            })
                    })?,
                    _ => self.resolve(&view, field, indices, &mut spans)?,
                }
                resolved.push(spans);
            }
            resolved
        };
        drop(view);

        let payloads_cold = match options.read {
            ReadPath::Mmap => false,
            ReadPath::Direct => true,
            ReadPath::Auto => entries_cold || (check && !self.payloads_resident(&maps, &resolved)),
        };
        if payloads_cold {
            return self.read_explicit(maps, field_ids, indices, resolved, options);
        }
        if check {
            self.found_warm();
        }
        inner.read_counters.mmap.fetch_add(1, Ordering::Relaxed);

        let mut columns = Vec::with_capacity(field_ids.len());
        for (field, spans) in field_ids.into_iter().zip(resolved) {
            let spec = &inner.fields[field];
            let data = match spec.compress {
                Compression::Raw => {
                    if options.verify {
                        self.for_parts(indices, &spans, INFLATE_PART_MIN, |indices, spans| {
                            for (&index, span) in indices.iter().zip(spans) {
                                if let Some(header) =
                                    self.frame_header(&maps, field, index, span)?
                                {
                                    self.check_crc(&maps, field, index, span, header)?;
                                }
                            }
                            Ok(())
                        })?;
                    }
                    ColumnData::Mapped(spans)
                }
                Compression::Flate | Compression::Zstd => {
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
            runtime: Arc::clone(&inner.runtime),
            len: indices.len(),
            columns,
        })
    }

    /// Runs `work` over aligned parts of `indices` and `spans`, in parallel when large.
    fn for_parts(
        &self,
        indices: &[u64],
        spans: &[Span],
        part_min: usize,
        work: impl Fn(&[u64], &[Span]) -> Result<()> + Sync,
    ) -> Result<()> {
        let runtime = &self.inner.runtime;
        match (
            part_len(runtime, indices.len(), part_min),
            runtime.readers(),
        ) {
            (Some(part), Some(pool)) => pool.install(|| {
                indices
                    .par_chunks(part)
                    .zip(spans.par_chunks(part))
                    .try_for_each(|(indices, spans)| work(indices, spans))
            }),
            _ => work(indices, spans),
        }
    }

    /// Resolves one index (for `verify`, which reports records one by one).
    pub(crate) fn resolve_one(
        &self,
        view: &View,
        field: usize,
        index: u64,
        out: &mut [Span; 1],
    ) -> Result<()> {
        self.resolve(view, field, &[index], out)
    }

    /// Turns `indices` into checked spans of `field`, written to `out` (same length).
    /// Consecutive indices of one unit (every index, in a dataset on one host) share the
    /// lookup of the unit's regions: the loop is a zero-copy gather's whole cost.
    fn resolve(&self, view: &View, field: usize, indices: &[u64], out: &mut [Span]) -> Result<()> {
        let overlay = !view.overlay.is_empty();
        let maps = &*view.maps;
        // The unit of the last index, its table of `field` and its chunks.
        let mut current: Option<(u32, &Region, &[Region])> = None;
        for (k, (&index, slot)) in indices.iter().zip(out.iter_mut()).enumerate() {
            let (unit, at) = split(index);
            let (table, chunks) = match current {
                Some((u, table, chunks)) if u == unit => (table, chunks),
                _ => {
                    let Some((table, chunks)) = maps.regions(unit, field) else {
                        return Err(out_of_range(index, 0));
                    };
                    current = Some((unit, table, chunks));
                    (table, chunks)
                }
            };
            if let Some(&ahead) = indices.get(k + ENTRY_PREFETCH_AHEAD) {
                let (ahead_unit, ahead) = split(ahead);
                let ahead_table = if ahead_unit == unit {
                    table
                } else {
                    maps.table_region(ahead_unit, field)
                };
                ahead_table.prefetch(ahead.wrapping_mul(ENTRY_BYTES), ENTRY_BYTES);
            }
            let entry = if overlay {
                view.entry(field, index)
            } else {
                at.checked_mul(ENTRY_BYTES)
                    .and_then(|at| table.read16(at))
                    .map(Entry::decode)
            };
            *slot = self.span_in(|seq| chunks.get(seq), unit, field, index, entry)?;
        }
        Ok(())
    }

    /// The checked span of `entry`, record `index`'s entry of `field` (`None`: the offset
    /// table ends before it).
    #[inline(always)]
    pub(crate) fn span_of(
        &self,
        maps: &Maps,
        field: usize,
        index: u64,
        entry: Option<Entry>,
    ) -> Result<Span> {
        let unit = split(index).0;
        match maps.unit(unit) {
            Some(maps) => {
                let chunk = |seq: usize| maps.chunks.get(seq)?.as_deref().map(Mapped::region);
                self.span_in(chunk, unit, field, index, entry)
            }
            None => Err(out_of_range(index, 0)),
        }
    }

    /// [`Store::span_of`] with the record's unit's chunks by number (`chunk`). Inlined: it is
    /// the body of the resolve loop, and its cold error paths must not make it a call per
    /// record (measured: a zero-copy gather of 1,024 records took 16 µs with the call, 6 µs
    /// inlined).
    #[inline(always)]
    fn span_in<'m>(
        &self,
        chunk: impl FnOnce(usize) -> Option<&'m Region>,
        unit: u32,
        field: usize,
        index: u64,
        entry: Option<Entry>,
    ) -> Result<Span> {
        let entry = entry
            .ok_or_else(|| self.bad(field, index, "offset table ends before this entry".into()))?;
        if entry.is_absent() {
            return Ok(Span::default());
        }
        // A unit's entries point into its own chunks: an id of another unit's wraps past
        // the end of this one's. A number with no chunk has an empty region.
        let seq = entry.chunk_id.wrapping_sub(first_chunk(unit));
        let chunk = chunk(seq as usize).filter(|c| c.len() > 0).ok_or_else(|| {
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
        Ok(Span {
            start,
            chunk: entry.chunk_id,
            len: entry.len,
            at: chunk.addr(start),
        })
    }

    /// Reads and checks the frame header in front of `span` (`None` for an absent record).
    pub(crate) fn frame_header(
        &self,
        maps: &Maps,
        field: usize,
        index: u64,
        span: &Span,
    ) -> Result<Option<FrameHeader>> {
        if span.len == 0 {
            self.check_absent(field, index)?;
            return Ok(None);
        }
        let bytes = maps
            .chunk(span.chunk)
            .and_then(|c| c.region().read16(span.start - FRAME_HEADER_BYTES))
            .ok_or_else(|| self.bad(field, index, "frame header lies outside the chunk".into()))?;
        self.check_header(field, index, span, bytes).map(Some)
    }

    /// An absent value of `field` in record `index` is refused if the field is typed with a
    /// fixed, non-zero length: every record holds it (see `write.rs`), so the entry was zeroed
    /// or the length raised past the data.
    pub(crate) fn check_absent(&self, field: usize, index: u64) -> Result<()> {
        let spec = &self.inner.fields[field];
        match spec.record_bytes().filter(|&n| n > 0) {
            Some(expected) => Err(self.bad(
                field,
                index,
                format!(
                    "no value, but field '{}' holds {expected} bytes in every record ({}): a zeroed offset entry, or a length past the data",
                    spec.name,
                    spec.describe_type()
                ),
            )),
            None => Ok(()),
        }
    }

    /// Decodes a frame header and checks it against its entry (`span`).
    pub(crate) fn check_header(
        &self,
        field: usize,
        index: u64,
        span: &Span,
        bytes: [u8; 16],
    ) -> Result<FrameHeader> {
        let header =
            FrameHeader::decode(bytes).map_err(|e| self.bad(field, index, e.to_string()))?;
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
        let spec = &self.inner.fields[field];
        if spec.compress == Compression::Raw && header.logical_len != header.stored_len {
            return Err(self.bad(
                field,
                index,
                "raw frame has a logical length unequal to its stored length".into(),
            ));
        }
        if let Some(expected) = spec.record_bytes() {
            if header.logical_len as u64 != expected {
                return Err(self.bad(
                    field,
                    index,
                    format!(
                        "holds {} bytes, but field '{}' holds {expected} in every record ({})",
                        header.logical_len,
                        spec.name,
                        spec.describe_type()
                    ),
                ));
            }
        }
        Ok(header)
    }

    pub(crate) fn check_crc(
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
        self.check_payload(field, index, header, payload)
    }

    /// Checks `payload` against its frame header's CRC.
    pub(crate) fn check_payload(
        &self,
        field: usize,
        index: u64,
        header: FrameHeader,
        payload: &[u8],
    ) -> Result<()> {
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
        // Logical lengths from the frame headers (checked, and CRC-verified if asked).
        let mut lens = vec![0u64; spans.len()];
        let runtime = &self.inner.runtime;
        let headers = |indices: &[u64], spans: &[Span], lens: &mut [u64]| -> Result<()> {
            for ((&index, span), len) in indices.iter().zip(spans).zip(lens.iter_mut()) {
                if let Some(header) = self.frame_header(maps, field, index, span)? {
                    if verify {
                        self.check_crc(maps, field, index, span, header)?;
                    }
                    *len = header.logical_len as u64;
                }
            }
            Ok(())
        };
        let parallel = part_len(runtime, indices.len(), INFLATE_PART_MIN).zip(runtime.readers());
        match parallel {
            Some((part, pool)) => pool.install(|| {
                indices
                    .par_chunks(part)
                    .zip(spans.par_chunks(part))
                    .zip(lens.par_chunks_mut(part))
                    .try_for_each(|((indices, spans), lens)| headers(indices, spans, lens))
            })?,
            None => headers(indices, spans, &mut lens)?,
        }
        let mut offsets = Vec::with_capacity(spans.len() + 1);
        offsets.push(0u64);
        let mut total = 0u64;
        for len in &lens {
            total += len;
            offsets.push(total);
        }
        let mut bytes = vec![0u8; total as usize];

        // Decompress each record into its slot; parts own disjoint slices of `bytes`.
        let inflate_part =
            |first: usize, indices: &[u64], spans: &[Span], out: &mut [u8]| -> Result<()> {
                let mut decoder = crate::codec::Decoder::new(
                    self.inner.fields[field].compress,
                    self.inner.dicts[field].clone(),
                );
                let base = offsets[first];
                for (k, (&index, span)) in indices.iter().zip(spans).enumerate() {
                    let (start, end) = (offsets[first + k] - base, offsets[first + k + 1] - base);
                    if span.len == 0 {
                        continue;
                    }
                    let input = maps
                        .chunk(span.chunk)
                        .and_then(|c| c.bytes(span.start, span.len as u64))
                        .unwrap_or_default();
                    decoder
                        .decode(input, &mut out[start as usize..end as usize])
                        .map_err(|e| self.bad(field, index, e.to_string()))?;
                }
                Ok(())
            };
        match parallel {
            Some((part, pool)) => {
                let mut pieces = Vec::with_capacity(indices.len().div_ceil(part));
                let mut rest: &mut [u8] = &mut bytes;
                for first in (0..indices.len()).step_by(part) {
                    let last = (first + part).min(indices.len());
                    let (piece, tail) =
                        rest.split_at_mut((offsets[last] - offsets[first]) as usize);
                    pieces.push((first, last, piece));
                    rest = tail;
                }
                pool.install(|| {
                    pieces.into_par_iter().try_for_each(|(first, last, piece)| {
                        inflate_part(first, &indices[first..last], &spans[first..last], piece)
                    })
                })?;
            }
            None => inflate_part(0, indices, spans, &mut bytes)?,
        }
        Ok(ColumnData::Owned { bytes, offsets })
    }
}
