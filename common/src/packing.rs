//! Documents packed whole into rows of `W + 1` tokens, as a pure function of (document
//! lengths, seed, configuration): every rank computes the same plan with nothing to
//! coordinate, and a row is an observation like a window, so samplers, mixtures, loaders
//! and their checkpoints use packed rows as they use records.
//!
//! - Documents are taken in a shuffled order (a keyed permutation of their indices).
//! - A document longer than a row is cut into pieces of `W + 1` tokens, each a full row;
//!   its remainder is packed like any document.
//! - [`Packer::BestFit`] (the default) places `lookahead` documents at a time, longest first,
//!   each into the row with the least room that holds it (best-fit decreasing);
//!   [`Packer::FirstFit`] places them in their shuffled order, each into the first row that
//!   holds it. A window's rows are emitted when it is placed.
//!
//! What a training step takes of a row ([`PackedColumns`]): its tokens, each token's
//! segment (1, 2, … per piece in the row; 0 for padding), its position within its piece,
//! the loss mask (1 where the next token is the same piece's: 0 on padding and at each
//! piece's last token) and, for a batch, `cu_seqlens`/`max_seqlen` over the inputs
//! (`tokens[:, :W]`) flattened, as flash-attention's variable-length kernels take them.

use std::collections::BTreeSet;

use crate::columns::Contiguous;
use crate::error::BoxError;
use crate::feistel::Feistel;

/// How documents are placed into rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packer {
    /// Longest first, each into the row with the least room that holds it.
    BestFit,
    /// In order, each into the first row that holds it.
    FirstFit,
}

impl Packer {
    /// Its name: `best_fit` or `first_fit`.
    pub fn name(self) -> &'static str {
        match self {
            Packer::BestFit => "best_fit",
            Packer::FirstFit => "first_fit",
        }
    }
}

impl std::str::FromStr for Packer {
    type Err = BadPacking;

    fn from_str(text: &str) -> Result<Packer, BadPacking> {
        match text {
            "best_fit" => Ok(Packer::BestFit),
            "first_fit" => Ok(Packer::FirstFit),
            other => Err(BadPacking(format!(
                "'{other}' is not a packer: best_fit or first_fit (fixed windows cut anywhere are a stream's windows)"
            ))),
        }
    }
}

/// Lookahead unless asked otherwise: documents placed at a time.
pub const LOOKAHEAD_DEFAULT: usize = 1024;

/// A packing asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PackConfig {
    /// `W`: a row holds `W + 1` tokens (inputs and labels shifted by one).
    pub seq_len: u64,
    pub packer: Packer,
    /// Documents placed at a time (at least 1).
    pub lookahead: usize,
    /// The key of the documents' shuffled order.
    pub seed: u64,
}

impl PackConfig {
    /// Best-fit packing into rows of `seq_len + 1` tokens, [`LOOKAHEAD_DEFAULT`] documents
    /// at a time, in the order `seed` shuffles them into.
    pub fn new(seq_len: u64, seed: u64) -> PackConfig {
        PackConfig {
            seq_len,
            packer: Packer::BestFit,
            lookahead: LOOKAHEAD_DEFAULT,
            seed,
        }
    }

    /// Tokens per row: `seq_len + 1`.
    pub fn width(&self) -> u64 {
        self.seq_len + 1
    }

    /// Checks the numbers: `1 <= seq_len < 2^31` and a lookahead of at least 1.
    pub fn check(&self) -> Result<(), BadPacking> {
        if self.seq_len == 0 || self.seq_len >= i32::MAX as u64 {
            return Err(BadPacking(format!(
                "seq_len must be 1..2^31 - 1, not {}",
                self.seq_len
            )));
        }
        if self.lookahead == 0 {
            return Err(BadPacking(
                "a lookahead of 0 documents places none: give at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// A packing that cannot be made as asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("packing: {0}")]
pub struct BadPacking(pub String);

/// Tokens `[offset, offset + len)` of document `document`, placed in a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub document: u64,
    pub offset: u32,
    pub len: u32,
}

/// What a plan comes to.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PackStats {
    pub rows: u64,
    pub documents: u64,
    pub tokens: u64,
    /// Documents longer than a row, cut into pieces.
    pub split: u64,
    pub pieces: u64,
}

impl PackStats {
    /// Padding over all the rows' tokens.
    pub fn padding_fraction(&self, width: u64) -> f64 {
        let room = self.rows * width;
        if room == 0 {
            return 0.0;
        }
        (room - self.tokens) as f64 / room as f64
    }
}

/// Which pieces each row holds.
#[derive(Clone, Debug)]
pub struct PackPlan {
    config: PackConfig,
    /// Row r holds `pieces[row_ends[r - 1]..row_ends[r]]` (from 0 for row 0).
    row_ends: Vec<u64>,
    pieces: Vec<Piece>,
    stats: PackStats,
    /// Documents not to read: their pieces leave their rows (see [`PackPlan::block`]).
    blocked: std::collections::HashSet<u64>,
    documents: u64,
}

impl PackPlan {
    /// The plan of documents of `lengths` tokens packed as `config` says.
    pub fn build(lengths: &[u64], config: PackConfig) -> Result<PackPlan, BadPacking> {
        config.check()?;
        let width = config.width();
        let n = lengths.len() as u64;
        // A permutation needs at least one element: an empty stream has one, unused.
        let order = Feistel::new(n.max(1), config.seed);
        let mut plan = PackPlan {
            config,
            row_ends: Vec::new(),
            pieces: Vec::new(),
            stats: PackStats::default(),
            blocked: Default::default(),
            documents: n,
        };
        let mut window: Vec<Piece> = Vec::with_capacity(config.lookahead);
        let mut placer = Placer::new(width as u32, config.packer, config.lookahead);
        let mut taken = 0;
        for i in 0..n {
            let document = order.apply(i);
            let len = lengths[document as usize];
            if len == 0 {
                continue;
            }
            if len > u32::MAX as u64 {
                return Err(BadPacking(format!(
                    "document {document} holds {len} tokens, more than 2^32 - 1"
                )));
            }
            plan.stats.documents += 1;
            plan.stats.tokens += len;
            let full = len / width;
            if len > width {
                plan.stats.split += 1;
            }
            for k in 0..full {
                plan.push_row(&[Piece {
                    document,
                    offset: (k * width) as u32,
                    len: width as u32,
                }]);
            }
            let rest = len % width;
            if rest > 0 {
                window.push(Piece {
                    document,
                    offset: (full * width) as u32,
                    len: rest as u32,
                });
            }
            taken += 1;
            if taken == config.lookahead {
                placer.place(&mut window, &mut plan);
                taken = 0;
            }
        }
        placer.place(&mut window, &mut plan);
        plan.stats.rows = plan.row_ends.len() as u64;
        plan.stats.pieces = plan.pieces.len() as u64;
        Ok(plan)
    }

    fn push_row(&mut self, pieces: &[Piece]) {
        self.pieces.extend_from_slice(pieces);
        self.row_ends.push(self.pieces.len() as u64);
    }

    pub fn config(&self) -> &PackConfig {
        &self.config
    }

    /// Rows of `W + 1` tokens.
    pub fn rows(&self) -> u64 {
        self.row_ends.len() as u64
    }

    pub fn stats(&self) -> PackStats {
        self.stats
    }

    /// The pieces of row `row`, in the order they lie in it; `None` past the last row.
    pub fn row(&self, row: u64) -> Option<&[Piece]> {
        crate::run_of(&self.pieces, &self.row_ends, row)
    }

    /// The plan with `documents` not read: each row that holds a piece of one keeps its
    /// other pieces, moved up, and ends in more padding; every other row — and every row's
    /// place in the run — stays as it was. A document the stream does not hold is refused
    /// by name.
    pub fn block(mut self, documents: &[u64]) -> Result<PackPlan, BadPacking> {
        if let Some(&d) = documents.iter().find(|&&d| d >= self.documents) {
            return Err(BadPacking(format!(
                "the blocklist names document {d}, and the stream holds {}",
                self.documents
            )));
        }
        self.blocked.extend(documents.iter().copied());
        Ok(self)
    }

    /// Documents not read.
    pub fn blocked(&self) -> usize {
        self.blocked.len()
    }

    /// Row `row` as it is read: [`Self::row`] without the pieces of blocked documents.
    pub fn row_read(&self, row: u64) -> Option<std::borrow::Cow<'_, [Piece]>> {
        let pieces = self.row(row)?;
        if self.blocked.is_empty() || !pieces.iter().any(|p| self.blocked.contains(&p.document)) {
            return Some(std::borrow::Cow::Borrowed(pieces));
        }
        Some(std::borrow::Cow::Owned(
            pieces
                .iter()
                .filter(|p| !self.blocked.contains(&p.document))
                .copied()
                .collect(),
        ))
    }
}

/// Places one lookahead window of pieces at a time into fresh rows.
struct Placer {
    width: u32,
    packer: Packer,
    /// Each open row's pieces.
    rows: Vec<Vec<Piece>>,
    /// Best fit: (room left, row) of the rows with room.
    room: BTreeSet<(u32, u32)>,
    /// First fit: the most room among rows, as a tree over row indices.
    most: MaxTree,
}

impl Placer {
    fn new(width: u32, packer: Packer, lookahead: usize) -> Placer {
        Placer {
            width,
            packer,
            rows: Vec::new(),
            room: BTreeSet::new(),
            most: MaxTree::new(lookahead),
        }
    }

    /// Places `window` (emptied) and appends its rows to `plan`.
    fn place(&mut self, window: &mut Vec<Piece>, plan: &mut PackPlan) {
        if window.is_empty() {
            return;
        }
        match self.packer {
            Packer::BestFit => {
                // Longest first; equal lengths in their shuffled order.
                window.sort_by_key(|p| std::cmp::Reverse(p.len));
                for &piece in window.iter() {
                    let fits = self.room.range((piece.len, 0)..).next().copied();
                    let row = match fits {
                        Some((room, row)) => {
                            self.room.remove(&(room, row));
                            if room > piece.len {
                                self.room.insert((room - piece.len, row));
                            }
                            row as usize
                        }
                        None => {
                            self.rows.push(Vec::new());
                            let row = self.rows.len() - 1;
                            if self.width > piece.len {
                                self.room.insert((self.width - piece.len, row as u32));
                            }
                            row
                        }
                    };
                    self.rows[row].push(piece);
                }
                self.room.clear();
            }
            Packer::FirstFit => {
                self.most.reset(window.len());
                for &piece in window.iter() {
                    let row = match self.most.first_at_least(piece.len) {
                        Some(row) => row,
                        None => {
                            self.rows.push(Vec::new());
                            let row = self.rows.len() - 1;
                            self.most.set(row, self.width);
                            row
                        }
                    };
                    let room = self.most.get(row) - piece.len;
                    self.most.set(row, room);
                    self.rows[row].push(piece);
                }
            }
        }
        for row in self.rows.drain(..) {
            plan.push_row(&row);
        }
        window.clear();
    }
}

/// A segment tree of the room left in each row, for the first row with room enough.
struct MaxTree {
    leaves: usize,
    tree: Vec<u32>,
}

impl MaxTree {
    fn new(rows: usize) -> MaxTree {
        let leaves = rows.max(1).next_power_of_two();
        MaxTree {
            leaves,
            tree: vec![0; 2 * leaves],
        }
    }

    /// Every row empty, room for at least `rows` rows.
    fn reset(&mut self, rows: usize) {
        if rows > self.leaves {
            *self = MaxTree::new(rows);
        } else {
            self.tree.fill(0);
        }
    }

    fn get(&self, row: usize) -> u32 {
        self.tree[self.leaves + row]
    }

    fn set(&mut self, row: usize, room: u32) {
        let mut at = self.leaves + row;
        self.tree[at] = room;
        while at > 1 {
            at /= 2;
            self.tree[at] = self.tree[2 * at].max(self.tree[2 * at + 1]);
        }
    }

    /// The first row with at least `need` room.
    fn first_at_least(&self, need: u32) -> Option<usize> {
        if self.tree[1] < need {
            return None;
        }
        let mut at = 1;
        while at < self.leaves {
            at = if self.tree[2 * at] >= need {
                2 * at
            } else {
                2 * at + 1
            };
        }
        Some(at - self.leaves)
    }
}

/// A gathered batch of packed rows, as a loader hands it over.
#[derive(Debug, Default)]
pub struct PackedColumns {
    pub rows: usize,
    /// Tokens per row: `W + 1`.
    pub width: usize,
    pub element_bytes: usize,
    /// `rows × width` elements.
    pub tokens: Vec<u8>,
    /// Each token's document (-1 for padding).
    pub document: Vec<i64>,
    /// Each token's piece in its row, from 1 (0 for padding).
    pub segment_ids: Vec<i32>,
    /// Each token's position in its piece (0 for padding).
    pub positions: Vec<i32>,
    /// 1 where the next token is the same piece's.
    pub loss_mask: Vec<u8>,
    /// Sequence boundaries over the inputs (`W` of each row) flattened: the pieces cut at
    /// `W`, and each row's padding as one sequence.
    pub cu_seqlens: Vec<i32>,
    /// The longest of those sequences.
    pub max_seqlen: i32,
    /// 0, 1, 2, …: positions are copied from it.
    ramp: Vec<i32>,
}

/// Which per-token columns a gather fills besides the tokens (and `cu_seqlens` and
/// `max_seqlen`, which cost a few numbers per row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub document: bool,
    pub segment_ids: bool,
    pub positions: bool,
    pub loss_mask: bool,
}

impl Wanted {
    /// Tokens, `cu_seqlens` and `max_seqlen` alone: what flash-attention's variable-length
    /// kernels take (positions and the loss mask follow from `cu_seqlens`).
    pub const VARLEN: Wanted = Wanted {
        document: false,
        segment_ids: false,
        positions: false,
        loss_mask: false,
    };

    /// Every column.
    pub const ALL: Wanted = Wanted {
        document: true,
        segment_ids: true,
        positions: true,
        loss_mask: true,
    };

    /// The columns `fields` names (empty: all).
    pub fn of(fields: &[String]) -> Wanted {
        if fields.is_empty() {
            return Wanted::ALL;
        }
        let has = |name: &str| fields.iter().any(|f| f == name);
        Wanted {
            document: has("document"),
            segment_ids: has("segment_ids"),
            positions: has("positions"),
            loss_mask: has("loss_mask"),
        }
    }
}

impl PackedColumns {
    /// Sizes the columns for `rows` rows of `width` (reusing their buffers) and fills every
    /// per-token one but `tokens` from the rows' pieces.
    pub fn describe<'a>(
        &mut self,
        rows: impl ExactSizeIterator<Item = &'a [Piece]>,
        width: usize,
        element_bytes: usize,
    ) {
        self.describe_wanted(rows, width, element_bytes, Wanted::ALL)
    }

    /// [`Self::describe`] of the columns `wanted` (the others left empty).
    pub fn describe_wanted<'a>(
        &mut self,
        rows: impl ExactSizeIterator<Item = &'a [Piece]>,
        width: usize,
        element_bytes: usize,
        wanted: Wanted,
    ) {
        let count = rows.len();
        self.rows = count;
        self.width = width;
        self.element_bytes = element_bytes;
        let cells = count * width;
        self.tokens.resize(cells * element_bytes, 0);
        let size = |on: bool| if on { cells } else { 0 };
        self.document.resize(size(wanted.document), -1);
        self.segment_ids.resize(size(wanted.segment_ids), 0);
        self.positions.resize(size(wanted.positions), 0);
        self.loss_mask.resize(size(wanted.loss_mask), 0);
        if wanted.positions && self.ramp.len() < width {
            self.ramp = (0..width as i32).collect();
        }
        self.cu_seqlens.clear();
        self.cu_seqlens.push(0);
        self.max_seqlen = 0;
        let inputs = width - 1;
        for (r, pieces) in rows.enumerate() {
            let base = r * width;
            let mut at = 0usize;
            for (k, piece) in pieces.iter().enumerate() {
                let len = piece.len as usize;
                let span = base + at..base + at + len;
                if wanted.document {
                    self.document[span.clone()].fill(piece.document as i64);
                }
                if wanted.segment_ids {
                    self.segment_ids[span.clone()].fill(k as i32 + 1);
                }
                if wanted.positions {
                    self.positions[span.clone()].copy_from_slice(&self.ramp[..len]);
                }
                if wanted.loss_mask {
                    self.loss_mask[span.clone()].fill(1);
                    self.loss_mask[span.end - 1] = 0;
                }
                let input_end = (at + len).min(inputs);
                if input_end > at {
                    self.push_sequence(input_end - at);
                }
                at += len;
            }
            let pad = base + at..base + width;
            if wanted.document {
                self.document[pad.clone()].fill(-1);
            }
            if wanted.segment_ids {
                self.segment_ids[pad.clone()].fill(0);
            }
            if wanted.positions {
                self.positions[pad.clone()].fill(0);
            }
            if wanted.loss_mask {
                self.loss_mask[pad].fill(0);
            }
            if at < inputs {
                self.push_sequence(inputs - at);
            }
        }
    }

    /// One more sequence of `len` inputs, after those of the batch so far.
    fn push_sequence(&mut self, len: usize) {
        let end = self.cu_seqlens.last().copied().unwrap_or(0) + len as i32;
        self.cu_seqlens.push(end);
        self.max_seqlen = self.max_seqlen.max(len as i32);
    }

    /// The columns `fields` names (empty: all), each row one packed row, into `columns`:
    /// `tokens`, `document`, `segment_ids`, `positions`, `loss_mask` per token, and
    /// `cu_seqlens` (int32, one row holding the batch's boundaries) and `max_seqlen` (one
    /// int32).
    pub fn into_columns(
        mut self,
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), BoxError> {
        let names: Vec<&str> = if fields.is_empty() {
            PACKED_FIELDS.to_vec()
        } else {
            fields.iter().map(String::as_str).collect()
        };
        columns.resize_with(names.len(), Contiguous::default);
        let rows = self.rows as u64;
        let per_row = |column: &mut Contiguous, data: Vec<u8>, row: u64| {
            if data.len() as u64 != rows * row {
                return Err(format!(
                    "a packed batch's column of {} bytes for {rows} rows of {row}: it was not gathered",
                    data.len()
                ));
            }
            column.data = data;
            column.offsets = (0..=rows).map(|r| r * row).collect();
            Ok(())
        };
        let width = self.width as u64;
        for (column, name) in columns.iter_mut().zip(names) {
            match name {
                "tokens" => per_row(
                    column,
                    std::mem::take(&mut self.tokens),
                    width * self.element_bytes as u64,
                )?,
                "document" => per_row(column, le_bytes(&self.document), width * 8)?,
                "segment_ids" => per_row(column, le_bytes(&self.segment_ids), width * 4)?,
                "positions" => per_row(column, le_bytes(&self.positions), width * 4)?,
                "loss_mask" => per_row(column, std::mem::take(&mut self.loss_mask), width)?,
                "cu_seqlens" => {
                    column.data = le_bytes(&self.cu_seqlens);
                    column.offsets = vec![0, column.data.len() as u64];
                }
                "max_seqlen" => {
                    column.data = self.max_seqlen.to_le_bytes().to_vec();
                    column.offsets = vec![0, 4];
                }
                other => {
                    return Err(format!(
                        "unknown field '{other}' of packed rows (they have: {})",
                        PACKED_FIELDS.join(", ")
                    )
                    .into())
                }
            }
        }
        Ok(())
    }
}

/// The fields of packed rows, in order.
pub const PACKED_FIELDS: [&str; 7] = [
    "tokens",
    "document",
    "segment_ids",
    "positions",
    "loss_mask",
    "cu_seqlens",
    "max_seqlen",
];

/// Fixed-size numbers as their little-endian bytes, back to back.
trait LeBytes: Copy {
    const SIZE: usize;
    fn put(self, out: &mut [u8]);
}

impl LeBytes for i64 {
    const SIZE: usize = 8;
    fn put(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
}

impl LeBytes for i32 {
    const SIZE: usize = 4;
    fn put(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
}

fn le_bytes<T: LeBytes>(values: &[T]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * T::SIZE];
    for (chunk, &value) in out.chunks_exact_mut(T::SIZE).zip(values) {
        value.put(chunk);
    }
    out
}

#[cfg(test)]
mod tests;
