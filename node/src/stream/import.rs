//! Building streams from the token files training pipelines already have: Megatron-LM's
//! indexed dataset (`PREFIX.bin` + `PREFIX.idx`) and flat NumPy token arrays with document
//! lengths (as OLMo-core and nanotron keep them).
//!
//! Inputs are memory-mapped and checked whole before the destination is made; tokens are
//! appended in slices of a few MiB and committed once at the end. A conversion that fails
//! midway removes what it made: nothing is left behind.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::{Component, Stream, StreamMeta};
use crate::convert::NpyHeader;
use crate::error::{Error, IoContext, Result};

/// Bytes appended per call.
const SLICE_BYTES: usize = 8 << 20;
/// The header of a Megatron-LM `.idx` file.
const MEGATRON_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// Header bytes: magic, version u64, dtype code u8, sequence count u64, document count u64.
const MEGATRON_HEADER_BYTES: usize = 9 + 8 + 1 + 8 + 8;

fn map(path: &Path) -> Result<Option<Mmap>> {
    let file = File::open(path).ctx("open", path)?;
    let len = file.metadata().ctx("stat", path)?.len();
    if len == 0 {
        return Ok(None);
    }
    // SAFETY: the input is only read; a file changed by another process during the
    // conversion gives wrong bytes or a fault, as with any reader of it.
    Ok(Some(unsafe { Mmap::map(&file) }.ctx("mmap", path)?))
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

/// A checked Megatron-LM `.idx`: where its arrays lie in the file's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MegatronIndex {
    /// The token type code (Megatron's `DType`: 8 = uint16, 4 = int32).
    pub dtype_code: u8,
    /// Bytes per token.
    pub token_bytes: u64,
    pub sequences: u64,
    /// Entries of the document index (documents + 1).
    pub document_entries: u64,
    lengths_at: usize,
    pointers_at: usize,
    documents_at: usize,
}

impl MegatronIndex {
    /// Parses and checks an `.idx` file's bytes against a `.bin` of `bin_len` bytes; errors
    /// name `path` and what is wrong.
    pub fn parse(bytes: &[u8], bin_len: u64, path: &Path) -> Result<MegatronIndex> {
        let bad = |reason: String| Error::InvalidInput {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() < MEGATRON_HEADER_BYTES {
            return Err(bad(format!(
                "{} bytes is too short for a Megatron .idx header ({MEGATRON_HEADER_BYTES} bytes)",
                bytes.len()
            )));
        }
        if &bytes[..9] != MEGATRON_MAGIC {
            return Err(bad(
                "bad magic: not a Megatron-LM .idx file (it starts with MMIDIDX\\x00\\x00)".into(),
            ));
        }
        let version = le_u64(bytes, 9);
        if version != 1 {
            return Err(bad(format!(
                "unsupported .idx version {version} (this converter reads version 1)"
            )));
        }
        let dtype_code = bytes[17];
        let token_bytes = match dtype_code {
            8 => 2,
            4 => 4,
            code => {
                let name = match code {
                    1 => "uint8",
                    2 => "int8",
                    3 => "int16",
                    5 => "int64",
                    6 => "float64",
                    7 => "float32",
                    _ => "unknown",
                };
                return Err(bad(format!(
                    "dtype code {code} ({name}) is not a token type this converter takes: uint16 (code 8) or int32 (code 4)"
                )));
            }
        };
        let sequences = le_u64(bytes, 18);
        let document_entries = le_u64(bytes, 26);
        let need = sequences
            .checked_mul(4 + 8)
            .and_then(|b| b.checked_add(document_entries.checked_mul(8)?))
            .and_then(|b| b.checked_add(MEGATRON_HEADER_BYTES as u64));
        let have = bytes.len() as u64;
        let Some(need) = need.filter(|&n| n <= have) else {
            return Err(bad(format!(
                "its counts ({sequences} sequences, {document_entries} document index entries) need more bytes than the file's {have}"
            )));
        };
        // Multimodal indices add one mode byte per sequence; nothing else may follow.
        if have != need && have != need + sequences {
            return Err(bad(format!(
                "holds {} bytes past its arrays ({sequences} sequences, {document_entries} document index entries)",
                have - need
            )));
        }
        let index = MegatronIndex {
            dtype_code,
            token_bytes,
            sequences,
            document_entries,
            lengths_at: MEGATRON_HEADER_BYTES,
            pointers_at: MEGATRON_HEADER_BYTES + sequences as usize * 4,
            documents_at: MEGATRON_HEADER_BYTES + sequences as usize * 12,
        };
        if document_entries == 0 {
            return Err(bad("the document index is empty (it starts with 0)".into()));
        }
        let mut previous = 0;
        for j in 0..document_entries {
            let entry = index.document_entry(bytes, j);
            if (j == 0 && entry != 0) || entry < previous || entry > sequences {
                return Err(bad(format!(
                    "document index entry {j} is {entry}: entries rise from 0 to the sequence count {sequences}"
                )));
            }
            previous = entry;
        }
        if previous != sequences {
            return Err(bad(format!(
                "the document index ends at sequence {previous}, and the file holds {sequences} sequences"
            )));
        }
        // Sequences lie in order, each after the one before: an index whose pointers
        // overlap or go back would make the import write the same bytes many times over.
        let mut previous_end = 0u64;
        for i in 0..sequences {
            let (pointer, len) = index.sequence(bytes, i);
            let end = len
                .checked_mul(token_bytes)
                .and_then(|b| b.checked_add(pointer));
            if end.is_none_or(|end| end > bin_len) {
                return Err(bad(format!(
                    "sequence {i} ({len} tokens at byte {pointer}) lies past the end of the .bin file ({bin_len} bytes)"
                )));
            }
            if pointer < previous_end {
                return Err(bad(format!(
                    "sequence {i} starts at byte {pointer}, inside or before sequence {} (which ends at byte {previous_end}): sequences must follow one another in the .bin file",
                    i - 1
                )));
            }
            previous_end = end.unwrap_or(previous_end);
        }
        Ok(index)
    }

    /// Documents the index holds.
    pub fn documents(&self) -> u64 {
        self.document_entries - 1
    }

    fn document_entry(&self, bytes: &[u8], j: u64) -> u64 {
        le_u64(bytes, self.documents_at + j as usize * 8)
    }

    /// Sequence `i`: (byte pointer into `.bin`, tokens). Negative values read as huge,
    /// which the bounds check refuses.
    fn sequence(&self, bytes: &[u8], i: u64) -> (u64, u64) {
        let at = self.lengths_at + i as usize * 4;
        let len = i32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let pointer = le_u64(bytes, self.pointers_at + i as usize * 8);
        (pointer, if len < 0 { u64::MAX } else { len as u64 })
    }
}

/// Where a conversion's tokens go: a new local stream ([`convert_megatron`],
/// [`convert_tokens`]), or anything else that takes tokens and document ends in order (the
/// command line's cluster streams).
pub trait TokenSink {
    /// Called first, once the input is checked, with the token type (`<u2` or `<u4`).
    fn start(&mut self, dtype: &str) -> Result<()>;
    /// Tokens, back to back.
    fn append_tokens(&mut self, bytes: &[u8]) -> Result<()>;
    /// Documents end at these token positions (absolute, ascending).
    fn end_documents_at(&mut self, ends: &[u64]) -> Result<()>;
    /// Every token handed over so far belongs to a document: a sink may commit here.
    fn aligned(&mut self) -> Result<()> {
        Ok(())
    }
    /// The conversion is done: commit.
    fn finish(&mut self) -> Result<()>;
}

/// What a conversion handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Converted {
    pub tokens: u64,
    pub documents: u64,
    /// `<u2` or `<u4`.
    pub dtype: &'static str,
}

/// A new local stream as a sink.
struct LocalSink<'a> {
    dest: &'a Path,
    stream: Option<Stream>,
}

impl LocalSink<'_> {
    fn stream(&self) -> Result<&Stream> {
        self.stream.as_ref().ok_or_else(|| Error::InvalidInput {
            path: self.dest.to_path_buf(),
            reason: "tokens before the stream was made".into(),
        })
    }
}

impl TokenSink for LocalSink<'_> {
    fn start(&mut self, dtype: &str) -> Result<()> {
        self.stream = Some(Stream::create(
            self.dest,
            vec![Component::new("token", dtype)],
        )?);
        Ok(())
    }

    fn append_tokens(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream()?.append_tokens(bytes).map(|_| ())
    }

    fn end_documents_at(&mut self, ends: &[u64]) -> Result<()> {
        self.stream()?.end_documents_at(ends)
    }

    fn finish(&mut self) -> Result<()> {
        self.stream()?.commit()
    }
}

/// Runs a conversion into a new stream at `dest`, committed once at the end; removes what
/// it made if it fails.
fn local(
    dest: &Path,
    convert: impl FnOnce(&mut dyn TokenSink) -> Result<Converted>,
) -> Result<StreamMeta> {
    let existed = dest.exists();
    let mut sink = LocalSink { dest, stream: None };
    let result = convert(&mut sink).and_then(|_| Ok(sink.stream()?.meta()));
    let made = sink.stream.take().is_some();
    drop(sink);
    if result.is_err() && made {
        let _ = remove_made(dest, existed);
    }
    result
}

/// Removes what a failed conversion made at `dest` (its contents, and the directory unless
/// it was there before).
fn remove_made(dest: &Path, existed: bool) -> std::io::Result<()> {
    if existed {
        for entry in std::fs::read_dir(dest)? {
            let path = entry?.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(())
    } else {
        std::fs::remove_dir_all(dest)
    }
}

/// `zr convert --megatron PREFIX`: the stream of `PREFIX.bin` + `PREFIX.idx` at `dest` (one
/// document per Megatron document, its sequences concatenated). `progress` gets token bytes
/// converted so far, and their total.
pub fn convert_megatron(
    prefix: &Path,
    dest: &Path,
    progress: impl FnMut(u64, u64),
) -> Result<StreamMeta> {
    local(dest, |sink| megatron_into(prefix, sink, progress))
}

/// [`convert_megatron`] into any sink.
pub fn megatron_into(
    prefix: &Path,
    sink: &mut dyn TokenSink,
    mut progress: impl FnMut(u64, u64),
) -> Result<Converted> {
    let with = |ext: &str| -> PathBuf {
        let mut name = prefix.as_os_str().to_owned();
        name.push(ext);
        PathBuf::from(name)
    };
    let (idx_path, bin_path) = (with(".idx"), with(".bin"));
    let idx = map(&idx_path)?;
    let idx = idx.as_deref().unwrap_or_default();
    let bin = map(&bin_path)?;
    let bin = bin.as_deref().unwrap_or_default();
    let index = MegatronIndex::parse(idx, bin.len() as u64, &idx_path)?;
    let total: u64 = (0..index.sequences)
        .map(|i| index.sequence(idx, i).1 * index.token_bytes)
        .sum();
    let dtype = if index.token_bytes == 2 { "<u2" } else { "<u4" };
    sink.start(dtype)?;
    let mut done = 0;
    let mut ends = Vec::new();
    let mut position = 0u64;
    // Runs of sequences contiguous in `.bin` are appended together.
    let mut run: Option<(u64, u64)> = None;
    let mut flush =
        |run: &mut Option<(u64, u64)>, done: &mut u64, sink: &mut dyn TokenSink| -> Result<()> {
            if let Some((start, end)) = run.take() {
                let bytes = &bin[start as usize..end as usize];
                if index.dtype_code == 4 {
                    if let Some(k) = bytes
                        .chunks_exact(4)
                        .position(|t| i32::from_le_bytes([t[0], t[1], t[2], t[3]]) < 0)
                    {
                        return Err(Error::InvalidInput {
                            path: bin_path.clone(),
                            reason: format!(
                                "token at byte {} is negative: int32 tokens must be token ids",
                                start + k as u64 * 4
                            ),
                        });
                    }
                }
                sink.append_tokens(bytes)?;
                *done += end - start;
                progress(*done, total);
            }
            Ok(())
        };
    for d in 0..index.documents() {
        let (first, last) = (
            index.document_entry(idx, d),
            index.document_entry(idx, d + 1),
        );
        for i in first..last {
            let (pointer, len) = index.sequence(idx, i);
            let end = pointer + len * index.token_bytes;
            run = match run {
                Some((start, at)) if at == pointer && end - start <= SLICE_BYTES as u64 => {
                    Some((start, end))
                }
                mut other => {
                    flush(&mut other, &mut done, sink)?;
                    Some((pointer, end))
                }
            };
            position += len;
        }
        ends.push(position);
        if ends.len() >= 1 << 16 {
            flush(&mut run, &mut done, sink)?;
            sink.end_documents_at(&ends)?;
            sink.aligned()?;
            ends.clear();
        }
    }
    flush(&mut run, &mut done, sink)?;
    sink.end_documents_at(&ends)?;
    sink.finish()?;
    Ok(Converted {
        tokens: position,
        documents: index.documents(),
        dtype,
    })
}

/// An integer `.npy` vector, mapped: its type and values.
struct NpyVector {
    path: PathBuf,
    map: Option<Mmap>,
    header: NpyHeader,
    itemsize: usize,
    signed: bool,
}

impl NpyVector {
    fn open(path: &Path, what: &str) -> Result<NpyVector> {
        let map = map(path)?;
        let bytes = map.as_deref().unwrap_or_default();
        let header = NpyHeader::parse(bytes, path)?;
        let bad = |reason: String| Error::InvalidInput {
            path: path.to_path_buf(),
            reason,
        };
        let (signed, itemsize) = match header.descr.as_str() {
            "<u2" | "=u2" => (false, 2),
            "<u4" | "=u4" => (false, 4),
            "<u8" | "=u8" => (false, 8),
            "<i2" | "=i2" => (true, 2),
            "<i4" | "=i4" => (true, 4),
            "<i8" | "=i8" => (true, 8),
            other => {
                return Err(bad(format!(
                "{what} must be little-endian integers (uint16/32/64 or int16/32/64), not {other}"
            )))
            }
        };
        if header.shape.len() != 1 {
            return Err(bad(format!(
                "{what} must be one-dimensional, not of shape {:?}",
                header.shape
            )));
        }
        let need = header.shape[0] * itemsize as u64;
        let have = bytes.len() as u64 - header.data_offset;
        if have != need {
            return Err(bad(format!(
                "holds {have} data bytes and its header ({} values) needs {need}: truncated?",
                header.shape[0]
            )));
        }
        Ok(NpyVector {
            path: path.to_path_buf(),
            map,
            header,
            itemsize,
            signed,
        })
    }

    fn len(&self) -> u64 {
        self.header.shape[0]
    }

    fn data(&self) -> &[u8] {
        let bytes = self.map.as_deref().unwrap_or_default();
        &bytes[self.header.data_offset as usize..]
    }

    /// Value `i`, widened (negative values as `None`).
    fn get(&self, i: u64) -> Option<u64> {
        let at = i as usize * self.itemsize;
        let b = &self.data()[at..at + self.itemsize];
        let mut wide = [0u8; 8];
        wide[..self.itemsize].copy_from_slice(b);
        let raw = u64::from_le_bytes(wide);
        if self.signed && (b[self.itemsize - 1] & 0x80) != 0 {
            return None;
        }
        Some(raw)
    }
}

/// `zr convert --tokens --doc-lengths`: the stream of the token ids in `tokens` (a 1-D
/// `.npy`), cut into documents of the lengths in `lengths` (a 1-D `.npy`, summing to the
/// token count). uint16 tokens stay uint16; other integer types become uint32 (values must
/// fit). `progress` gets bytes of `tokens` converted so far, and their total.
pub fn convert_tokens(
    tokens: &Path,
    lengths: &Path,
    dest: &Path,
    progress: impl FnMut(u64, u64),
) -> Result<StreamMeta> {
    local(dest, |sink| tokens_into(tokens, lengths, sink, progress))
}

/// [`convert_tokens`] into any sink.
pub fn tokens_into(
    tokens: &Path,
    lengths: &Path,
    sink: &mut dyn TokenSink,
    mut progress: impl FnMut(u64, u64),
) -> Result<Converted> {
    let tokens = NpyVector::open(tokens, "tokens")?;
    let lengths = NpyVector::open(lengths, "document lengths")?;
    let mut sum = 0u64;
    for d in 0..lengths.len() {
        let Some(len) = lengths.get(d) else {
            return Err(Error::InvalidInput {
                path: lengths.path.clone(),
                reason: format!("document {d} has a negative length"),
            });
        };
        sum = sum.saturating_add(len);
    }
    if sum != tokens.len() {
        return Err(Error::InvalidInput {
            path: lengths.path.clone(),
            reason: format!(
                "the document lengths sum to {sum}, and {} holds {} tokens",
                tokens.path.display(),
                tokens.len()
            ),
        });
    }
    let narrow = tokens.itemsize == 2 && !tokens.signed;
    let dtype = if narrow { "<u2" } else { "<u4" };
    let total = tokens.len();
    sink.start(dtype)?;
    let step = (SLICE_BYTES / tokens.itemsize) as u64;
    let size = tokens.itemsize;
    let mut converted = Vec::new();
    // Tokens [from, to) handed over in slices, converted to uint32 where they are not.
    let mut append = |from: u64, to: u64, sink: &mut dyn TokenSink| -> Result<()> {
        let mut start = from;
        while start < to {
            let end = (start + step).min(to);
            if narrow || (size == 4 && !tokens.signed) {
                sink.append_tokens(&tokens.data()[start as usize * size..end as usize * size])?;
            } else {
                converted.clear();
                for i in start..end {
                    let value = tokens.get(i).filter(|&v| v <= u32::MAX as u64).ok_or_else(|| {
                        Error::InvalidInput {
                            path: tokens.path.clone(),
                            reason: format!(
                                "token {i} is not a token id that fits uint32 (negative or too large)"
                            ),
                        }
                    })?;
                    converted.extend_from_slice(&(value as u32).to_le_bytes());
                }
                sink.append_tokens(&converted)?;
            }
            progress(end * size as u64, total * size as u64);
            start = end;
        }
        Ok(())
    };
    // Documents in batches: their tokens, then their ends.
    let mut ends = Vec::with_capacity(lengths.len().min(1 << 16) as usize);
    let (mut handed, mut position) = (0, 0);
    for d in 0..lengths.len() {
        position += lengths.get(d).unwrap_or_default();
        ends.push(position);
        if ends.len() >= 1 << 16 || position - handed >= step || d + 1 == lengths.len() {
            append(handed, position, sink)?;
            handed = position;
            sink.end_documents_at(&ends)?;
            sink.aligned()?;
            ends.clear();
        }
    }
    sink.finish()?;
    Ok(Converted {
        tokens: total,
        documents: lengths.len(),
        dtype,
    })
}
