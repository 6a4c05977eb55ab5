//! `Batch`: the result of a gather — per selected field, one payload per requested index, in
//! the caller's order.
//!
//! Raw fields are spans into the mapped chunks (zero-copy); flate fields are decompressed into
//! one buffer the batch owns. The batch holds the mappings it points into, so it stays valid
//! while writes continue and after the store is dropped. A field can be materialized into the
//! columnar shape consumers want: one contiguous buffer plus N+1 offsets.

use std::mem::MaybeUninit;
use std::sync::Arc;

use rayon::prelude::*;

use zr_common::Contiguous;

use crate::runtime::{part_len, Runtime};
use crate::view::{Maps, Published};

/// How many records ahead of the copy `write_contiguous` prefetches.
const PREFETCH_RECORDS_AHEAD: usize = 4;
/// Materializations smaller than this stay on the calling thread.
const PARALLEL_COPY_MIN_BYTES: usize = 1 << 20;
/// Fewest records per part of a parallel materialization.
const PARALLEL_COPY_PART_MIN: usize = 64;

/// Where one raw payload lies: `len` bytes at `start` of chunk `chunk`. `len == 0` is absent.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Span {
    pub(crate) start: u64,
    pub(crate) chunk: u32,
    pub(crate) len: u32,
    /// Where its bytes are in the mapping of its chunk in the gather's `Maps` (0 when
    /// absent): checked when the span was made (`Store::span_in`), so that copying or
    /// reading it needs no lookup of its chunk (measured: a node's 1 KiB gathers over 1,024
    /// units ran at 0.78x of one unit's with a lookup per record).
    pub(crate) at: usize,
}

impl Span {
    /// The span's bytes, read from its address (`at`), not found again through `maps`:
    /// on a node, finding the chunk again cost a chase through the unit's `Arc`s per record.
    ///
    /// # Safety
    ///
    /// The span was made from `maps` (by `Store::span_in`), so `at..at + len` lies inside
    /// a mapping `maps` holds for `'m`.
    #[inline]
    pub(crate) unsafe fn bytes<'m>(&self, maps: &'m Maps) -> &'m [u8] {
        if self.len == 0 {
            return &[];
        }
        debug_assert_eq!(
            maps.chunk(self.chunk)
                .and_then(|c| c.bytes(self.start, self.len as u64))
                .map(|b| b.as_ptr() as usize),
            Some(self.at),
            "a span's address is in its chunk's mapping"
        );
        // SAFETY: `at..at + len` lies inside the mapping of chunk `chunk` in `maps`, which
        // lives for `'m` (the caller's contract); a chunk's bytes never change once a reader
        // can reach them.
        unsafe { std::slice::from_raw_parts(self.at as *const u8, self.len as usize) }
    }
}

pub(crate) enum ColumnData {
    /// Zero-copy spans into the mapped chunks.
    Mapped(Vec<Span>),
    /// Payloads back to back in `bytes`; record i is `bytes[offsets[i]..offsets[i + 1]]`.
    Owned { bytes: Vec<u8>, offsets: Vec<u64> },
}

pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) data: ColumnData,
}

/// The records of one gather. See the module documentation.
pub struct Batch {
    pub(crate) maps: Arc<Published>,
    /// Pools: the readers split large copies, the cleaners free owned buffers on drop.
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) len: usize,
    pub(crate) columns: Vec<Column>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("len", &self.len)
            .field(
                "fields",
                &self
                    .columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Batch {
    /// Number of records (the number of indices gathered).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no indices were gathered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The gathered fields, in the order requested.
    pub fn fields(&self) -> impl Iterator<Item = FieldView<'_>> {
        self.columns.iter().map(|column| FieldView {
            batch: self,
            column,
        })
    }

    /// The gathered field called `name`.
    pub fn field(&self, name: &str) -> Option<FieldView<'_>> {
        self.fields().find(|f| f.name() == name)
    }

    /// Record `i` as a [`Record`](zr_common::Record) of every field gathered (a field it
    /// lacks is empty), its payloads borrowed from the batch; `None` if `i >= len()`. How a
    /// gathered record is written again elsewhere.
    pub fn record(&self, i: usize) -> Option<zr_common::Record<'_>> {
        let mut record = zr_common::Record::new();
        for field in self.fields() {
            record.set(field.name(), field.get(i)?);
        }
        (i < self.len).then_some(record)
    }
}

/// One field of a [`Batch`].
#[derive(Clone, Copy)]
pub struct FieldView<'a> {
    batch: &'a Batch,
    column: &'a Column,
}

impl<'a> FieldView<'a> {
    /// The field's name.
    pub fn name(&self) -> &'a str {
        &self.column.name
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.batch.len
    }

    /// True if the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.batch.len == 0
    }

    /// Record `i`'s payload (empty if the record lacks the field); `None` if `i >= len()`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        match &self.column.data {
            ColumnData::Mapped(spans) => {
                let span = spans.get(i)?;
                // SAFETY: the batch's spans were made from its maps, which it holds as long
                // as the slice's lifetime `'a`.
                Some(unsafe { span.bytes(&self.batch.maps) })
            }
            ColumnData::Owned { bytes, offsets } => {
                let start = *offsets.get(i)? as usize;
                let end = *offsets.get(i + 1)? as usize;
                bytes.get(start..end)
            }
        }
    }

    /// The payloads in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let this = *self;
        (0..this.len()).map(move |i| this.get(i).unwrap_or_default())
    }

    /// Sum of the payload lengths.
    pub fn total_bytes(&self) -> u64 {
        match &self.column.data {
            ColumnData::Mapped(spans) => spans.iter().map(|s| s.len as u64).sum(),
            ColumnData::Owned { bytes, .. } => bytes.len() as u64,
        }
    }

    /// Copies the payloads into `data` (cleared first) and their `len + 1` offsets into
    /// `offsets`, reusing both buffers' memory.
    pub fn write_contiguous(&self, data: &mut Vec<u8>, offsets: &mut Vec<u64>) {
        data.clear();
        offsets.clear();
        match &self.column.data {
            ColumnData::Mapped(spans) => {
                offsets.reserve(spans.len() + 1);
                offsets.push(0);
                let mut total = 0u64;
                for span in spans {
                    total += span.len as u64;
                    offsets.push(total);
                }
                let total = total as usize;
                data.reserve(total);
                let out = &mut data.spare_capacity_mut()[..total];
                let maps = &*self.batch.maps;
                let runtime = &self.batch.runtime;
                let parallel = (total >= PARALLEL_COPY_MIN_BYTES)
                    .then(|| part_len(runtime, spans.len(), PARALLEL_COPY_PART_MIN))
                    .flatten()
                    .zip(runtime.readers());
                match parallel {
                    Some((part, pool)) => {
                        let mut pieces = Vec::with_capacity(spans.len().div_ceil(part));
                        let mut rest = out;
                        for first in (0..spans.len()).step_by(part) {
                            let last = (first + part).min(spans.len());
                            let bytes = (offsets[last] - offsets[first]) as usize;
                            let (piece, tail) = rest.split_at_mut(bytes);
                            pieces.push((&spans[first..last], piece));
                            rest = tail;
                        }
                        pool.install(|| {
                            pieces
                                .into_par_iter()
                                .for_each(|(spans, piece)| copy_spans(maps, spans, piece))
                        });
                    }
                    None => copy_spans(maps, spans, out),
                }
                // SAFETY: `copy_spans` wrote every byte of `out`, which is the first `total`
                // bytes of `data`'s spare capacity: the pieces are disjoint and cover it.
                unsafe { data.set_len(total) };
            }
            ColumnData::Owned {
                bytes,
                offsets: own,
            } => {
                data.extend_from_slice(bytes);
                offsets.extend_from_slice(own);
            }
        }
    }

    /// Copies the payloads of `records`, each exactly `size` bytes, back to back into `out`
    /// (exactly `records.len() * size` bytes), prefetching ahead as
    /// [`Self::write_contiguous`] does; otherwise `Err(k)`, the first record (counted from
    /// `records.start`) of another length, and nothing is copied.
    pub(crate) fn copy_fixed_into(
        &self,
        records: std::ops::Range<usize>,
        size: usize,
        out: &mut [u8],
    ) -> Result<(), usize> {
        match &self.column.data {
            ColumnData::Mapped(spans) => {
                let spans = &spans[records];
                if let Some(k) = spans.iter().position(|s| s.len as usize != size) {
                    return Err(k);
                }
                // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and `copy_spans` only
                // writes initialized bytes (every one of them), so `out` stays initialized.
                let out = unsafe { &mut *(out as *mut [u8] as *mut [MaybeUninit<u8>]) };
                copy_spans(&self.batch.maps, spans, out);
                Ok(())
            }
            ColumnData::Owned { bytes, offsets } => {
                let offsets = &offsets[records.start..=records.end];
                if let Some(k) = offsets
                    .windows(2)
                    .position(|w| (w[1] - w[0]) as usize != size)
                {
                    return Err(k);
                }
                out.copy_from_slice(
                    &bytes[offsets[0] as usize..offsets[offsets.len() - 1] as usize],
                );
                Ok(())
            }
        }
    }

    /// The payloads as one contiguous buffer plus offsets.
    pub fn to_contiguous(&self) -> Contiguous {
        let mut out = Contiguous::default();
        self.write_contiguous(&mut out.data, &mut out.offsets);
        out
    }
}

/// Copies the spans' payloads back to back into `out` (exactly their total length),
/// prefetching a few records ahead so that their cache misses overlap. Writes every byte.
fn copy_spans(maps: &Maps, spans: &[Span], out: &mut [MaybeUninit<u8>]) {
    let mut at = 0;
    for (k, span) in spans.iter().enumerate() {
        if let Some(ahead) = spans.get(k + PREFETCH_RECORDS_AHEAD) {
            crate::map::prefetch_at(ahead.at, ahead.len as u64);
        }
        let len = span.len as usize;
        if len == 0 {
            continue;
        }
        // SAFETY: the spans were made from `maps` (the caller's batch's, held while this
        // runs).
        let bytes = unsafe { span.bytes(maps) };
        out[at..at + len].write_copy_of_slice(bytes);
        at += len;
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Large decompressed buffers are freed on a cleaner thread: unmapping them here would
        // stall the training loop that dropped the batch.
        for column in &mut self.columns {
            if let ColumnData::Owned { bytes, .. } = &mut column.data {
                self.runtime.discard(std::mem::take(bytes));
            }
        }
    }
}
