//! A cluster stream's documents packed whole into rows ([`zr_common::packing`]), byte for
//! byte the rows the same stream packs into locally: the plan is built from every
//! document's length (read once from the blocks' document records), and a batch's rows are
//! read as the blocks under their pieces, in one gather.

use std::sync::Arc;

use zr_common::packing::{PackConfig, PackPlan, PackedColumns, Wanted};
use zr_common::Contiguous;

use super::{parse_documents, ClusterStream, DOCUMENTS_FIELD, TOKENS_FIELD};
use crate::error::Error;

/// Blocks' document records read per gather while listing document lengths.
const BLOCKS_PER_GATHER: u64 = 1 << 16;

impl ClusterStream {
    /// Tokens in each committed document, in order.
    pub fn document_lengths(&self) -> Result<Vec<u64>, Error> {
        let b = self.block_tokens;
        let mut ends = Vec::with_capacity(self.documents as usize);
        let mut first = 0;
        while first < self.blocks && (ends.len() as u64) < self.documents {
            let last = (first + BLOCKS_PER_GATHER).min(self.blocks);
            let blocks: Vec<u64> = (first..last).collect();
            let columns = self.client.gather(&blocks, &[DOCUMENTS_FIELD])?;
            for (k, &block) in blocks.iter().enumerate() {
                let parsed = parse_documents(columns[0].get(k).unwrap_or_default(), block)
                    .map_err(|e| self.error(e.to_string()))?;
                if parsed.first_document != ends.len() as u64 {
                    return Err(self.error(format!(
                        "block {block} says {} documents ended before it, and the blocks before it end {}",
                        parsed.first_document,
                        ends.len()
                    )));
                }
                ends.extend(parsed.ends.iter().map(|&end| block * b + u64::from(end)));
            }
            first = last;
        }
        ends.truncate(self.documents as usize);
        if (ends.len() as u64) < self.documents {
            return Err(self.error(format!(
                "its blocks end {} documents, and it has committed {}",
                ends.len(),
                self.documents
            )));
        }
        let mut start = 0;
        ends.into_iter()
            .enumerate()
            .map(|(d, end)| {
                if end < start || end > self.tokens {
                    return Err(self.error(format!(
                        "document {d} ends at token {end}, before its start {start} or past the stream's {} tokens",
                        self.tokens
                    )));
                }
                let len = end - start;
                start = end;
                Ok(len)
            })
            .collect()
    }

    /// Copies token ranges `(first token, tokens, byte offset in tokens)` into `tokens`: the
    /// blocks under them read in one gather.
    fn read_ranges(&self, ranges: &[(u64, u64, usize)], tokens: &mut [u8]) -> Result<(), Error> {
        let (b, e) = (self.block_tokens, self.element_bytes);
        let mut blocks: Vec<u64> = Vec::new();
        for &(start, len, _) in ranges {
            if len > 0 {
                blocks.extend(start / b..=(start + len - 1) / b);
            }
        }
        blocks.sort_unstable();
        blocks.dedup();
        let columns = self.client.gather(&blocks, &[TOKENS_FIELD])?;
        for &(start, len, place) in ranges {
            self.walk_range(
                &columns[0],
                &blocks,
                start,
                len,
                |_, block, from, _, bytes| {
                    let at = place + ((block * b + from - start) * e) as usize;
                    tokens[at..at + bytes.len()].copy_from_slice(bytes);
                },
            )?;
        }
        Ok(())
    }
}

/// The packed rows of a cluster's token stream, as a loader source: the columns of
/// [`PackedColumns::into_columns`].
#[derive(Debug)]
pub struct ClusterPacked {
    stream: ClusterStream,
    plan: Arc<PackPlan>,
    /// Where each document starts.
    starts: Vec<u64>,
}

impl ClusterPacked {
    /// The documents `stream` has committed (as last read), packed as `config` says.
    pub fn new(stream: ClusterStream, config: PackConfig) -> Result<ClusterPacked, Error> {
        let lengths = stream.document_lengths()?;
        let plan = PackPlan::build(&lengths, config).map_err(|e| stream.error(e.to_string()))?;
        let mut at = 0;
        let starts = lengths
            .iter()
            .map(|&len| {
                let start = at;
                at += len;
                start
            })
            .collect();
        Ok(ClusterPacked {
            stream,
            plan: Arc::new(plan),
            starts,
        })
    }

    pub fn plan(&self) -> &PackPlan {
        &self.plan
    }

    /// The same rows without the documents `documents`, as a local stream's
    /// (`zr_common::PackPlan::block`).
    pub fn block(mut self, documents: &[u64]) -> Result<ClusterPacked, Error> {
        let plan = Arc::unwrap_or_clone(self.plan)
            .block(documents)
            .map_err(|e| self.stream.error(e.to_string()))?;
        self.plan = Arc::new(plan);
        Ok(self)
    }

    pub fn stream(&self) -> &ClusterStream {
        &self.stream
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

    /// Gathers rows `indices` into `out` (its buffers reused).
    pub fn gather(&self, indices: &[u64], out: &mut PackedColumns) -> Result<(), Error> {
        self.gather_wanted(indices, out, Wanted::ALL)
    }

    /// [`Self::gather`] of the per-token columns `wanted` only (tokens always).
    pub fn gather_wanted(
        &self,
        indices: &[u64],
        out: &mut PackedColumns,
        wanted: Wanted,
    ) -> Result<(), Error> {
        let rows = self.plan.rows();
        let width = self.width();
        let e = self.stream.element_bytes as usize;
        let mut pieces = Vec::with_capacity(indices.len());
        let mut ranges = Vec::new();
        let mut used = Vec::with_capacity(indices.len());
        for (k, &i) in indices.iter().enumerate() {
            let row = self.plan.row_read(i).ok_or_else(|| {
                Error::Proto(zr_proto::Error::Remote {
                    code: zr_proto::ErrorCode::IndexOutOfRange,
                    message: format!("row {i} is out of range: the packing has {rows}"),
                })
            })?;
            let mut at = 0usize;
            for p in row.iter() {
                let start = self.starts[p.document as usize] + u64::from(p.offset);
                ranges.push((start, u64::from(p.len), (k * width + at) * e));
                at += p.len as usize;
            }
            pieces.push(row);
            used.push(at);
        }
        out.describe_wanted(pieces.iter().map(|row| &**row), width, e, wanted);
        for (k, at) in used.into_iter().enumerate() {
            out.tokens[(k * width + at) * e..(k + 1) * width * e].fill(0);
        }
        self.stream.read_ranges(&ranges, &mut out.tokens)
    }
}

impl zr_common::GatherSource for ClusterPacked {
    fn gather_into(
        &self,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), zr_common::BoxError> {
        let mut out = PackedColumns::default();
        self.gather_wanted(indices, &mut out, Wanted::of(fields))?;
        out.into_columns(fields, columns)
    }
}
