//! Token streams in a cluster: a named dataset whose records are blocks of tokens.
//!
//! Record b holds tokens `[b·B, (b + 1)·B)` of the stream (field `stream.tokens`; every block
//! is full but the last) and where documents end inside it (field `stream.documents`:
//! `B u32 | bytes per token u32 | documents ended before the block u64 | ends within the
//! block u32...`). Blocks are
//! records, so the cluster places them by extents like any records — extents of
//! `extent_records · B` tokens — replicates, moves and rebuilds them unchanged. A window is
//! read as the blocks under it, all of a batch's in one gather, and joined in order here.
//!
//! The writer fills the last block; a commit stores it (appended, or replacing the partial
//! block the previous commit stored) with the blocks filled since, then commits. A reader's
//! length is the committed blocks': `(N - 1)·B` plus the last block's tokens. A replaced
//! last block only grows by whole documents, so a reader that reads it between the
//! replacement and the commit sees a stream a few documents longer, never a torn one; blocks
//! a failed commit appended are removed before the next write.

use zr_common::{Contiguous, Record, WindowMode};

mod packed;
pub use packed::ClusterPacked;

use crate::api::Client;
use crate::error::Error;
use zr_proto::wire::FieldInfo;

/// The field of a block's tokens.
pub const TOKENS_FIELD: &str = "stream.tokens";
/// The field of a block's document ends.
pub const DOCUMENTS_FIELD: &str = "stream.documents";
/// Tokens per block unless asked otherwise.
pub const BLOCK_TOKENS_DEFAULT: u64 = 16_384;
/// Blocks appended per call while committing.
const APPEND_BLOCKS_MAX: usize = 64;

/// One block being written.
#[derive(Clone, Debug, Default)]
struct Block {
    tokens: Vec<u8>,
    /// Documents that ended before the block starts (set at commit).
    first_document: u64,
    /// Where the documents ending in it end, within it: 1..=B, or 0 for a document that
    /// ended where the block starts (an empty one after a commit).
    ends: Vec<u32>,
}

impl Block {
    fn documents_record(&self, block_tokens: u64, element_bytes: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 4 * self.ends.len());
        out.extend_from_slice(&(block_tokens as u32).to_le_bytes());
        out.extend_from_slice(&(element_bytes as u32).to_le_bytes());
        out.extend_from_slice(&self.first_document.to_le_bytes());
        for end in &self.ends {
            out.extend_from_slice(&end.to_le_bytes());
        }
        out
    }
}

/// A block's document record, parsed.
#[derive(Debug)]
struct Parsed {
    /// Tokens per block and bytes per token (the same in every block).
    block_tokens: u64,
    element_bytes: u64,
    /// Documents that ended before the block.
    first_document: u64,
    /// Where documents end within it.
    ends: Vec<u32>,
}

/// What is wrong with a stream's dataset as a token stream.
#[derive(Debug, thiserror::Error)]
enum Malformed {
    #[error(
        "block {block}'s {DOCUMENTS_FIELD} record has {bytes} bytes: not 16 + 4 per document end"
    )]
    Documents { block: u64, bytes: usize },
    #[error("tokens of {0}: a cluster's token streams hold uint16 (<u2) or uint32 (<u4)")]
    TokenType(String),
}

fn parse_documents(bytes: &[u8], block: u64) -> Result<Parsed, Malformed> {
    if bytes.len() < 16 || !(bytes.len() - 16).is_multiple_of(4) {
        return Err(Malformed::Documents {
            block,
            bytes: bytes.len(),
        });
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    let ends = bytes[16..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let header = word(0);
    Ok(Parsed {
        block_tokens: header & 0xFFFF_FFFF,
        element_bytes: header >> 32,
        first_document: word(8),
        ends,
    })
}

/// A token stream held by a cluster's named dataset (see the module documentation).
#[derive(Debug)]
pub struct ClusterStream {
    client: Client,
    dtype: String,
    element_bytes: u64,
    block_tokens: u64,
    /// Committed blocks, tokens and documents, as last read or written.
    blocks: u64,
    tokens: u64,
    documents: u64,
    /// The writer's blocks not yet committed, from token `pending_start` on (`None`: not
    /// writing since the last commit): the first replaces the last committed block when
    /// `replaces_last` (it was partial), the rest are appended. Block k starts at
    /// `pending_start + k·B`; documents ended before the first: `pending_documents`.
    pending: Option<Vec<Block>>,
    pending_start: u64,
    pending_documents: u64,
    replaces_last: bool,
    /// Tokens and documents appended, committed or not; where the last document ended.
    appended: u64,
    appended_documents: u64,
    last_end: u64,
}

impl ClusterStream {
    /// Makes dataset `name` a token stream of `dtype` (`<u2` or `<u4`) in blocks of
    /// `block_tokens`, through `client` (an operator's); returns it, open for writing with a
    /// writer's handle.
    pub fn create(
        client: &Client,
        name: &str,
        dtype: &str,
        block_tokens: u64,
    ) -> Result<ClusterStream, Error> {
        let element_bytes = element_bytes(dtype).map_err(|e| stream_error(name, e.to_string()))?;
        if block_tokens == 0 || block_tokens * element_bytes > u32::MAX as u64 / 2 {
            return Err(stream_error(
                name,
                format!("{block_tokens} tokens per block: it needs 1 to 2^31 bytes"),
            ));
        }
        let fields = vec![
            // Untyped: blocks vary in length (the last); the token type is in each block's
            // documents record.
            FieldInfo::new(TOKENS_FIELD, "raw"),
            FieldInfo::new(DOCUMENTS_FIELD, "raw"),
        ];
        let client = client.create_dataset(name, fields)?;
        // An empty stream is one empty block (whose record, like every block's, says B).
        let mut stream = ClusterStream::empty(client, dtype.into(), element_bytes, block_tokens);
        let block = Block::default();
        stream
            .client
            .append(&Record::new().with(TOKENS_FIELD, &[]).with(
                DOCUMENTS_FIELD,
                &block.documents_record(block_tokens, element_bytes),
            ))?;
        stream.client.commit()?;
        stream.refresh()?;
        Ok(stream)
    }

    fn empty(client: Client, dtype: String, element_bytes: u64, block_tokens: u64) -> Self {
        ClusterStream {
            client,
            dtype,
            element_bytes,
            block_tokens,
            blocks: 0,
            tokens: 0,
            documents: 0,
            pending: None,
            pending_start: 0,
            pending_documents: 0,
            replaces_last: false,
            appended: 0,
            appended_documents: 0,
            last_end: 0,
        }
    }

    /// Opens the token stream that `client`'s dataset holds; refused, naming why, if the
    /// dataset is not one.
    pub fn open(client: Client) -> Result<ClusterStream, Error> {
        let name = client.name().to_string();
        let fields = client.fields();
        let has = |field: &str| fields.iter().any(|f| f.name == field);
        if !(has(TOKENS_FIELD) && has(DOCUMENTS_FIELD)) {
            return Err(stream_error(
                &name,
                format!(
                    "not a token stream (it has no {TOKENS_FIELD} and {DOCUMENTS_FIELD} fields)"
                ),
            ));
        }
        let mut stream = ClusterStream::empty(client, String::new(), 0, 0);
        stream.refresh()?;
        Ok(stream)
    }

    /// Reads the committed length again; returns the tokens.
    pub fn refresh(&mut self) -> Result<u64, Error> {
        self.read_last()?;
        Ok(self.tokens)
    }

    /// Reads the committed length and the last committed block, whose record also says the
    /// block size and token width (every block's does); returns its tokens and documents.
    fn read_last(&mut self) -> Result<(Vec<u8>, Parsed), Error> {
        let blocks = self.committed_blocks()?;
        if blocks == 0 {
            return Err(self.error("it holds no block 0 (made by an interrupted create?)".into()));
        }
        let last = blocks - 1;
        let columns = self
            .client
            .gather(&[last], &[TOKENS_FIELD, DOCUMENTS_FIELD])?;
        let tokens = columns[0].get(0).unwrap_or_default().to_vec();
        let parsed = parse_documents(columns[1].get(0).unwrap_or_default(), last)
            .map_err(|e| self.error(e.to_string()))?;
        let (block_tokens, element) = (parsed.block_tokens, parsed.element_bytes);
        if block_tokens == 0 || (self.block_tokens != 0 && block_tokens != self.block_tokens) {
            return Err(self.error(format!("block {last} says {block_tokens} tokens per block")));
        }
        let dtype = match element {
            2 => "<u2",
            4 => "<u4",
            other => return Err(self.error(format!("block {last} says {other} bytes per token"))),
        };
        let last_bytes = tokens.len() as u64;
        if !last_bytes.is_multiple_of(element) || last_bytes > block_tokens * element {
            return Err(self.error(format!("block {last} holds {last_bytes} bytes of tokens")));
        }
        self.dtype = dtype.into();
        self.element_bytes = element;
        self.block_tokens = block_tokens;
        self.blocks = blocks;
        self.tokens = last * block_tokens + last_bytes / element;
        self.documents = parsed.first_document + parsed.ends.len() as u64;
        Ok((tokens, parsed))
    }

    /// Blocks the cluster has committed (blocks appended by a commit that failed midway
    /// are past them).
    fn committed_blocks(&self) -> Result<u64, Error> {
        self.client.wait_len(0, std::time::Duration::from_millis(1))
    }

    fn error(&self, reason: String) -> Error {
        stream_error(self.client.name(), reason)
    }

    /// The dataset's handle.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Committed tokens.
    pub fn len(&self) -> u64 {
        self.tokens
    }

    /// True if no token is committed.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// Committed documents.
    pub fn documents(&self) -> u64 {
        self.documents
    }

    /// The token type (`<u2` or `<u4`).
    pub fn dtype(&self) -> &str {
        &self.dtype
    }

    /// Bytes per token.
    pub fn element_bytes(&self) -> u64 {
        self.element_bytes
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> u64 {
        self.block_tokens
    }

    /// Observations of `mode` in the committed stream (document mode is not offered in a
    /// cluster: finding a document's start would cost a search over the blocks).
    pub fn count(&self, mode: WindowMode) -> Result<u64, Error> {
        self.check_mode(mode)?;
        Ok(mode.count(self.tokens, self.documents))
    }

    fn check_mode(&self, mode: WindowMode) -> Result<(), Error> {
        mode.check().map_err(|e| self.error(e.to_string()))?;
        if matches!(mode, WindowMode::Documents { .. }) {
            return Err(self.error(
                "document windows are offered for local streams only; read windows".into(),
            ));
        }
        Ok(())
    }

    /// Gathers windows `indices` of `mode`: their tokens into `tokens` (rows of `seq_len +
    /// 1` elements) and, if given, each token's document into `document`. The blocks under
    /// the batch are read in one gather and joined here.
    pub fn gather(
        &self,
        mode: WindowMode,
        indices: &[u64],
        tokens: &mut [u8],
        mut document: Option<&mut [i64]>,
    ) -> Result<(), Error> {
        self.check_mode(mode)?;
        let WindowMode::Windows { stride, .. } = mode else {
            return Ok(());
        };
        let width = mode.width();
        let e = self.element_bytes;
        let rows = indices.len() as u64;
        if tokens.len() as u64 != rows * width * e
            || document
                .as_ref()
                .is_some_and(|d| d.len() as u64 != rows * width)
        {
            return Err(self.error(format!(
                "buffers for {rows} windows of {width} tokens need {} token bytes and {} document entries",
                rows * width * e,
                rows * width
            )));
        }
        let n = mode.count(self.tokens, self.documents);
        let b = self.block_tokens;
        let mut blocks: Vec<u64> = Vec::new();
        for &i in indices {
            if i >= n {
                return Err(Error::Proto(zr_proto::Error::Remote {
                    code: zr_proto::ErrorCode::IndexOutOfRange,
                    message: format!("window {i} is out of range: the stream holds {n}"),
                }));
            }
            let start = i * stride;
            blocks.extend(start / b..=(start + width - 1) / b);
        }
        blocks.sort_unstable();
        blocks.dedup();
        let columns = self
            .client
            .gather(&blocks, &[TOKENS_FIELD, DOCUMENTS_FIELD])?;
        let parsed: Vec<(u64, Vec<u32>)> = blocks
            .iter()
            .enumerate()
            .map(|(k, &block)| {
                let bytes = columns[0].get(k).unwrap_or_default();
                let full = block + 1 < self.blocks;
                if full && bytes.len() as u64 != b * e {
                    return Err(self.error(format!(
                        "block {block} holds {} bytes of tokens, and every block but the last holds {}",
                        bytes.len(),
                        b * e
                    )));
                }
                let parsed = parse_documents(columns[1].get(k).unwrap_or_default(), block)
                    .map_err(|e| self.error(e.to_string()))?;
                Ok((parsed.first_document, parsed.ends))
            })
            .collect::<Result<_, Error>>()?;
        for (row, &i) in indices.iter().enumerate() {
            let start = i * stride;
            let row_tokens =
                &mut tokens[(row as u64 * width * e) as usize..][..(width * e) as usize];
            self.walk_range(
                &columns[0],
                &blocks,
                start,
                width,
                |k, block, from, until, bytes| {
                    let at = ((block * b + from - start) * e) as usize;
                    row_tokens[at..at + bytes.len()].copy_from_slice(bytes);
                    if let Some(document) = document.as_deref_mut() {
                        let (first, ends) = &parsed[k];
                        let row_docs =
                            &mut document[(row as u64 * width) as usize..][..width as usize];
                        let mut d =
                            *first + ends.partition_point(|&end| u64::from(end) <= from) as u64;
                        let mut next = ends
                            .iter()
                            .map(|&end| u64::from(end))
                            .filter(|&end| end > from);
                        let mut boundary = next.next();
                        for offset in from..until {
                            while boundary.is_some_and(|end| end <= offset) {
                                d += 1;
                                boundary = next.next();
                            }
                            row_docs[(block * b + offset - start) as usize] = d as i64;
                        }
                    }
                },
            )?;
        }
        Ok(())
    }

    /// Appends a document of `tokens` (whole elements' bytes); returns its index. Visible
    /// at [`ClusterStream::commit`].
    pub fn append_document(&mut self, tokens: &[u8]) -> Result<u64, Error> {
        self.check_elements(tokens)?;
        self.resume()?;
        if self.appended != self.last_end {
            return Err(self.error(
                "a document is open (append_tokens without end_document): end it first".into(),
            ));
        }
        self.append_tokens(tokens)?;
        self.end_document()
    }

    fn check_elements(&self, tokens: &[u8]) -> Result<(), Error> {
        let e = self.element_bytes;
        if !(tokens.len() as u64).is_multiple_of(e) {
            return Err(self.error(format!(
                "{} bytes of tokens are not whole {e}-byte elements",
                tokens.len()
            )));
        }
        Ok(())
    }

    /// Appends tokens to the open document (see [`ClusterStream::end_document_at`]);
    /// returns the tokens appended so far.
    pub fn append_tokens(&mut self, tokens: &[u8]) -> Result<u64, Error> {
        self.check_elements(tokens)?;
        self.resume()?;
        let (b, e) = (self.block_tokens, self.element_bytes);
        let full = (b * e) as usize;
        let pending = self.pending.get_or_insert_with(Vec::new);
        let mut rest = tokens;
        while !rest.is_empty() {
            if pending
                .last()
                .is_none_or(|block| block.tokens.len() == full)
            {
                pending.push(Block::default());
            }
            if let Some(block) = pending.last_mut() {
                let room = full - block.tokens.len();
                let (piece, more) = rest.split_at(room.min(rest.len()));
                block.tokens.extend_from_slice(piece);
                rest = more;
            }
        }
        self.appended += tokens.len() as u64 / e;
        Ok(self.appended)
    }

    /// Ends the open document at the last token appended; returns its index.
    pub fn end_document(&mut self) -> Result<u64, Error> {
        self.end_document_at(self.appended)?;
        Ok(self.appended_documents - 1)
    }

    /// Ends a document at token position `end` (absolute; at least where the last one
    /// ended, at most the tokens appended): a converter's way to mark boundaries after
    /// handing over the tokens in slices.
    pub fn end_document_at(&mut self, end: u64) -> Result<(), Error> {
        self.resume()?;
        if end < self.last_end || end > self.appended {
            return Err(self.error(format!(
                "a document cannot end at token {end}: the last one ends at {} and {} tokens are appended",
                self.last_end, self.appended
            )));
        }
        let b = self.block_tokens;
        let start = self.pending_start;
        let pending = self.pending.get_or_insert_with(Vec::new);
        // The block the end closes: the one holding token end - 1, or (an empty document
        // where a block starts) the block starting there.
        let k = if end == start {
            0
        } else {
            (end - start - 1) / b
        };
        while pending.len() as u64 <= k {
            pending.push(Block::default());
        }
        pending[k as usize].ends.push((end - start - k * b) as u32);
        self.last_end = end;
        self.appended_documents += 1;
        Ok(())
    }

    /// Starts writing after the last commit: the last committed block, if it has room, is
    /// extended (and replaced at the next commit); else new blocks follow it.
    fn resume(&mut self) -> Result<(), Error> {
        if self.pending.is_some() {
            return Ok(());
        }
        let (tokens, parsed) = self.read_last()?;
        // Blocks a failed commit appended and did not commit would be committed by the
        // next one, past blocks they do not follow: they go first.
        let served = self.client.len()?;
        for index in (self.blocks..served).rev() {
            self.client.delete(index)?;
        }
        let last = self.blocks - 1;
        let b = self.block_tokens;
        if (tokens.len() as u64) < b * self.element_bytes {
            self.pending = Some(vec![Block {
                tokens,
                first_document: parsed.first_document,
                ends: parsed.ends,
            }]);
            self.pending_start = last * b;
            self.pending_documents = parsed.first_document;
            self.replaces_last = true;
        } else {
            self.pending = Some(Vec::new());
            self.pending_start = self.blocks * b;
            self.pending_documents = self.documents;
            self.replaces_last = false;
        }
        self.appended = self.tokens;
        self.appended_documents = self.documents;
        self.last_end = self.tokens;
        Ok(())
    }

    /// Stores the blocks written since the last commit and commits them; refused while a
    /// document is open (its tokens would belong to none).
    pub fn commit(&mut self) -> Result<(), Error> {
        if self.appended != self.last_end {
            return Err(self.error(format!(
                "tokens {}..{} belong to no document yet: end the document before committing",
                self.last_end, self.appended
            )));
        }
        let Some(mut pending) = self.pending.take() else {
            return self.client.commit();
        };
        let (b, e) = (self.block_tokens, self.element_bytes);
        let mut first_document = self.pending_documents;
        for block in &mut pending {
            block.first_document = first_document;
            first_document += block.ends.len() as u64;
        }
        let documents: Vec<Vec<u8>> = pending
            .iter()
            .map(|block| block.documents_record(b, e))
            .collect();
        let mut blocks = pending.iter().zip(&documents);
        let stored = if self.replaces_last {
            blocks.next()
        } else {
            None
        };
        let result = (|| {
            if let Some((block, docs)) = stored {
                self.client.modify(
                    self.blocks - 1,
                    &Record::new()
                        .with(TOKENS_FIELD, &block.tokens)
                        .with(DOCUMENTS_FIELD, docs),
                )?;
            }
            let rest: Vec<Record> = blocks
                .map(|(block, docs)| {
                    Record::new()
                        .with(TOKENS_FIELD, &block.tokens)
                        .with(DOCUMENTS_FIELD, docs)
                })
                .collect();
            for part in rest.chunks(APPEND_BLOCKS_MAX) {
                self.client.append_many(part)?;
            }
            self.client.commit()
        })();
        if let Err(e) = result {
            // What was sent may be in part applied: the next write starts again from what
            // the cluster committed.
            self.refresh().ok();
            self.appended = self.tokens;
            self.appended_documents = self.documents;
            self.last_end = self.tokens;
            return Err(e);
        }
        self.refresh()?;
        self.appended = self.tokens;
        self.appended_documents = self.documents;
        self.last_end = self.tokens;
        Ok(())
    }
}

/// Bytes `[from, until)` of record `k` of `column`.
impl ClusterStream {
    /// Walks the tokens [start, start + len) over `blocks` (sorted, gathered: their tokens in
    /// `column`), a piece per block: `visit(k, block, from, until, bytes)`, with k the
    /// block's place in `blocks` and [from, until) the piece's tokens inside the block.
    fn walk_range(
        &self,
        column: &Contiguous,
        blocks: &[u64],
        start: u64,
        len: u64,
        mut visit: impl FnMut(usize, u64, u64, u64, &[u8]),
    ) -> Result<(), Error> {
        let (b, e) = (self.block_tokens, self.element_bytes);
        let mut pos = start;
        while pos < start + len {
            let block = pos / b;
            let k = blocks.partition_point(|&x| x < block);
            let from = pos - block * b;
            let until = ((block + 1) * b).min(start + len) - block * b;
            let bytes = column
                .get(k)
                .and_then(|bytes| bytes.get((from * e) as usize..(until * e) as usize))
                .ok_or_else(|| {
                    self.error(format!(
                        "block {block} ends before token {}",
                        block * b + until
                    ))
                })?;
            visit(k, block, from, until, bytes);
            pos = block * b + until;
        }
        Ok(())
    }
}

fn element_bytes(dtype: &str) -> Result<u64, Malformed> {
    match dtype {
        "<u2" | "=u2" | "u2" => Ok(2),
        "<u4" | "=u4" | "u4" => Ok(4),
        other => Err(Malformed::TokenType(other.to_string())),
    }
}

fn stream_error(dataset: &str, reason: String) -> Error {
    Error::Stream {
        dataset: dataset.to_string(),
        reason,
    }
}

/// Windows of a cluster's token stream as a loader source: columns `tokens` (rows of
/// `seq_len + 1` elements) and `document` (i64 per token); `fields` picks and orders them.
#[derive(Debug)]
pub struct ClusterWindows {
    stream: ClusterStream,
    mode: WindowMode,
}

impl ClusterWindows {
    /// The windows of `mode` of `stream` (its committed length as last read).
    pub fn new(stream: ClusterStream, mode: WindowMode) -> Result<ClusterWindows, Error> {
        stream.check_mode(mode)?;
        Ok(ClusterWindows { stream, mode })
    }

    /// Windows in the stream.
    pub fn len(&self) -> u64 {
        self.mode.count(self.stream.tokens, self.stream.documents)
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stream.
    pub fn stream(&self) -> &ClusterStream {
        &self.stream
    }
}

impl zr_common::GatherSource for ClusterWindows {
    fn gather_into(
        &self,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), zr_common::BoxError> {
        self.stream
            .gather_columns(self.mode, indices, fields, columns)
    }
}

impl ClusterStream {
    /// Windows `indices` of `mode` as loader columns: `tokens` (rows of `seq_len + 1`
    /// elements) and `document` (i64 per token), as `fields` picks and orders them (empty:
    /// both).
    pub fn gather_columns(
        &self,
        mode: WindowMode,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), zr_common::BoxError> {
        let width = mode.width() as usize;
        let e = self.element_bytes as usize;
        let rows = indices.len();
        let mut tokens = vec![0u8; rows * width * e];
        let mut document = vec![0i64; rows * width];
        self.gather(mode, indices, &mut tokens, Some(&mut document))?;
        zr_common::WindowColumns {
            rows,
            width,
            element_bytes: e,
            tokens,
            document,
            mask: Vec::new(),
        }
        .into_columns(fields, columns)
    }
}
