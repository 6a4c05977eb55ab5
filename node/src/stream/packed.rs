//! A stream's documents packed whole into rows of `W + 1` tokens ([`zr_common::packing`]):
//! the plan is built once from the stream's document lengths, and each row is read as the
//! ranges of its pieces, laid back to back — from the mapping, or from the disk with every
//! page checked, as windows are.

use std::sync::Arc;

use zr_common::packing::{PackConfig, PackPlan, PackedColumns, Wanted};
use zr_common::{BoxError, Contiguous, GatherSource};

use super::read::{lay_rows, Layout, SpanSink};
use super::Stream;
use crate::error::{Error, Result};
use crate::store::{GatherOptions, ReadPath};

/// The packed rows of a stream.
#[derive(Clone, Debug)]
pub struct Packed {
    stream: Arc<Stream>,
    plan: Arc<PackPlan>,
    options: GatherOptions,
}

impl Packed {
    /// The documents `stream` has committed, packed as `config` says.
    pub fn new(stream: Arc<Stream>, config: PackConfig) -> Result<Packed> {
        let lengths = document_lengths(&stream);
        let plan =
            PackPlan::build(&lengths, config).map_err(|e| Error::InvalidRecord(e.to_string()))?;
        Ok(Packed {
            stream,
            plan: Arc::new(plan),
            options: GatherOptions {
                read: ReadPath::Mmap,
                ..GatherOptions::default()
            },
        })
    }

    /// The same rows without the documents `documents` (see [`PackPlan::block`]): a row
    /// that held a piece of one reads its other pieces and more padding; no other row
    /// changes. A document the stream does not hold is refused by name.
    pub fn block(mut self, documents: &[u64]) -> Result<Packed> {
        let plan = Arc::unwrap_or_clone(self.plan)
            .block(documents)
            .map_err(|e| Error::InvalidRecord(e.to_string()))?;
        self.plan = Arc::new(plan);
        Ok(self)
    }

    /// The same rows read as `options` say (the read path, `uncached`, `verify`).
    pub fn with_options(mut self, options: GatherOptions) -> Packed {
        self.options = options;
        self
    }

    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    pub fn plan(&self) -> &PackPlan {
        &self.plan
    }

    /// Tokens per row: `seq_len + 1`.
    pub fn width(&self) -> usize {
        self.plan.config().width() as usize
    }

    /// Rows.
    pub fn len(&self) -> u64 {
        self.plan.rows()
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gathers rows `indices` into `out` (its buffers reused), and the spans each row
    /// overlaps into `spans` if given.
    pub fn gather(
        &self,
        indices: &[u64],
        out: &mut PackedColumns,
        spans: Option<&mut SpanSink>,
    ) -> Result<()> {
        self.gather_wanted(indices, out, spans, Wanted::ALL)
    }

    /// [`Self::gather`] of the per-token columns `wanted` only (tokens always).
    pub fn gather_wanted(
        &self,
        indices: &[u64],
        out: &mut PackedColumns,
        spans: Option<&mut SpanSink>,
        wanted: Wanted,
    ) -> Result<()> {
        let view = self.stream.view();
        let rows = self.plan.rows();
        let mut layout = Layout::with_rows(indices.len());
        let mut pieces = Vec::with_capacity(indices.len());
        for &i in indices {
            let row = self.plan.row_read(i).ok_or(Error::IndexOutOfRange {
                index: i,
                len: rows,
            })?;
            for piece in row.iter() {
                let start = view.document_start(piece.document) + piece.offset as u64;
                layout.push((start, piece.len as u64));
            }
            layout.end_row();
            pieces.push(row);
        }
        let width = self.width();
        out.describe_wanted(
            pieces.iter().map(|row| &**row),
            width,
            view.element_bytes as usize,
            wanted,
        );
        lay_rows(
            &view,
            &layout,
            width,
            self.options,
            &mut out.tokens,
            None,
            None,
            spans,
        )
    }
}

/// Tokens in each document `stream` has committed.
pub fn document_lengths(stream: &Stream) -> Vec<u64> {
    let view = stream.view();
    let mut start = 0;
    (0..view.meta.documents)
        .map(|d| {
            let end = view.document_end(d);
            let len = end - start;
            start = end;
            len
        })
        .collect()
}

impl GatherSource for Packed {
    /// Columns `tokens`, `document`, `segment_ids`, `positions`, `loss_mask`, `cu_seqlens`
    /// and `max_seqlen` (see [`PackedColumns::into_columns`]); `fields` picks and orders
    /// them (empty: all).
    fn gather_into(
        &self,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> std::result::Result<(), BoxError> {
        let mut out = PackedColumns::default();
        self.gather_wanted(indices, &mut out, None, Wanted::of(fields))?;
        out.into_columns(fields, columns)
    }
}
