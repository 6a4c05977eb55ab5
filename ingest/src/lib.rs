//! zr-ingest: raw corpora in. WebDataset tar shards into record datasets ([`webdataset`]);
//! text in JSON lines (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`),
//! one document per line, tokenized with a Hugging Face `tokenizer.json` — by the library
//! the Python `tokenizers` package is built on, so the tokens are the same — into a token
//! stream, on every core while the input streams, in the input's order (each worker's ids
//! from an `encoder::Encoder`, exact against the library and faster).
//!
//! ```text
//! reader ──batches of lines──▶ workers (parse, tokenize) ──▶ writer (in order) ──▶ Stream
//! ```
//! Memory is bounded by the batches in flight, whatever the input's size. A conversion that
//! fails leaves no new stream behind, and an appended one at its last commit.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use zr_node::stream::{Component, Stream};

use encoder::Encoder;

mod encoder;
pub mod parquet;
pub mod remote;
pub mod webdataset;
pub use parquet::{convert_parquet, convert_parquet_into, ParquetOptions, ParquetReport};
pub use webdataset::{convert_tars, convert_tars_into, TarOptions, TarReport};

/// Lines a worker takes at a time.
const BATCH_LINES: usize = 256;

/// What to convert, and how.
#[derive(Clone, Debug)]
pub struct JsonlOptions {
    /// The files, read in this order.
    pub inputs: Vec<PathBuf>,
    /// A Hugging Face `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// The key of each line's text.
    pub text_key: String,
    /// A token appended to every document (by its text, e.g. `</s>`), if any.
    pub eos: Option<String>,
    /// The stream to make (a new or empty directory), or to add to with `append`.
    pub dest: PathBuf,
    pub append: bool,
    /// Lines that are not JSON objects with a string at `text_key`, or not UTF-8, are
    /// counted and left out instead of failing the conversion.
    pub skip_bad: bool,
    /// Threads tokenizing (0: one per core).
    pub threads: usize,
    /// Keys of each line kept as metadata of a span over its whole document (a JSON object
    /// of those present), e.g. `url`, `source`.
    pub meta_keys: Vec<String>,
}

/// How far a conversion is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub documents: u64,
    pub tokens: u64,
    /// Bytes of text lines read (decompressed).
    pub bytes: u64,
}

/// What a conversion did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub documents: u64,
    pub tokens: u64,
    /// Lines left out (`skip_bad`).
    pub skipped: u64,
    /// The stream's token type: `<u2` or `<u4`, by the vocabulary's size.
    pub dtype: String,
}

/// Why a conversion failed.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{path}: {reason}")]
    Input { path: PathBuf, reason: String },
    #[error("{path}:{line}: {reason}")]
    Line {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("{0}")]
    Stream(#[from] zr_node::Error),
    #[error("{0}")]
    Usage(String),
}

type Result<T> = std::result::Result<T, IngestError>;

/// One line to tokenize: its file, its number (from 1), its bytes.
struct Line {
    file: usize,
    number: u64,
    bytes: Vec<u8>,
    /// A Parquet row's text (its column read already; `bytes` then empty), or its null.
    text: Option<Option<String>>,
}

/// A document: its tokens' bytes and its metadata (empty: none).
type Document = (Vec<u8>, Vec<u8>);

/// A batch's documents, the lines left out, and the bytes of text read.
type Tokenized = Result<(Vec<Document>, u64, u64)>;

/// Converts `options.inputs` into the stream at `options.dest`, calling `progress` as
/// documents are written.
pub fn tokenize_jsonl(
    options: &JsonlOptions,
    mut progress: impl FnMut(Progress),
) -> Result<Report> {
    let (tokenizer, eos, dtype) = prepare(options)?;
    let (stream, made) = open_dest(options, dtype)?;
    let outcome = convert(
        options,
        &tokenizer,
        eos,
        dtype,
        Target::Local(&stream),
        &mut progress,
    );
    match outcome {
        Ok(report) => Ok(report),
        Err(e) => {
            drop(stream); // appended documents not committed are gone with it
            if made {
                let _ = std::fs::remove_dir_all(&options.dest);
            }
            Err(e)
        }
    }
}

/// The tokenizer, the end token's id and the token type, with the inputs checked.
fn prepare(options: &JsonlOptions) -> Result<(tokenizers::Tokenizer, Option<u32>, &'static str)> {
    if options.inputs.is_empty() {
        return Err(IngestError::Usage("no input files".into()));
    }
    let tokenizer = tokenizers::Tokenizer::from_file(&options.tokenizer).map_err(|e| {
        IngestError::Tokenizer {
            path: options.tokenizer.clone(),
            reason: e.to_string(),
        }
    })?;
    let vocab = tokenizer.get_vocab_size(true);
    let dtype = if vocab <= 1 << 16 { "<u2" } else { "<u4" };
    let eos = match &options.eos {
        None => None,
        Some(token) => {
            Some(
                tokenizer
                    .token_to_id(token)
                    .ok_or_else(|| IngestError::Tokenizer {
                        path: options.tokenizer.clone(),
                        reason: format!("it has no token '{token}' to end documents with"),
                    })?,
            )
        }
    };
    for path in &options.inputs {
        remote::check_input(path)?;
    }
    Ok((tokenizer, eos, dtype))
}

/// [`tokenize_jsonl`] into `sink` (a cluster's new stream, say) instead of a local
/// directory: `options.dest` and `options.append` are not used, and `meta_keys` is
/// refused (span metadata is kept in local streams only). The sink is started with the
/// token type, handed each document's tokens and end in the input's order, told where it
/// may commit, and finished at the end; on an error it is left unfinished, for its owner to
/// drop.
pub fn tokenize_jsonl_into(
    options: &JsonlOptions,
    sink: &mut dyn zr_node::stream::TokenSink,
    mut progress: impl FnMut(Progress),
) -> Result<Report> {
    if !options.meta_keys.is_empty() {
        return Err(IngestError::Usage(
            "--meta-keys keeps metadata in a local stream's spans, which a cluster's stream does not hold".into(),
        ));
    }
    let (tokenizer, eos, dtype) = prepare(options)?;
    sink.start(dtype)?;
    let report = convert(
        options,
        &tokenizer,
        eos,
        dtype,
        Target::Sink(sink, 0),
        &mut progress,
    )?;
    Ok(report)
}

/// Where tokenized documents go.
enum Target<'a> {
    Local(&'a Stream),
    /// A sink, and the tokens it was handed so far.
    Sink(&'a mut dyn zr_node::stream::TokenSink, u64),
}

impl Target<'_> {
    fn append(&mut self, tokens: &[u8], count: u64, spans: &[zr_node::stream::Span]) -> Result<()> {
        match self {
            Target::Local(stream) => {
                stream.append_document(tokens, spans)?;
            }
            Target::Sink(sink, at) => {
                sink.append_tokens(tokens)?;
                *at += count;
                sink.end_documents_at(&[*at])?;
            }
        }
        Ok(())
    }

    /// A batch of documents is written whole.
    fn aligned(&mut self) -> Result<()> {
        if let Target::Sink(sink, _) = self {
            sink.aligned()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        match self {
            Target::Local(stream) => stream.commit()?,
            Target::Sink(sink, _) => sink.finish()?,
        }
        Ok(())
    }
}

/// Where a table's records go: a new local dataset ([`LocalRecords`]), or anything else
/// that makes a dataset and takes records in order (the command line's cluster datasets).
pub trait RecordSink {
    /// Called once, before any record, with the fields the input gives.
    fn create(&mut self, fields: &[zr_node::FieldSpec]) -> Result<()>;
    /// Records, in the input's order.
    fn append(&mut self, records: &[zr_node::Record<'_>]) -> Result<()>;
    /// The conversion is done: make it durable.
    fn commit(&mut self) -> Result<()>;
    /// The conversion failed: remove what was made (a conversion leaves no destination).
    fn abandon(&mut self);
}

/// A new local dataset at `dest` as a conversion's sink: `dest` must be absent or empty,
/// and is removed if the conversion fails.
pub struct LocalRecords {
    dest: PathBuf,
    store: Option<zr_node::Store>,
}

impl LocalRecords {
    pub fn new(dest: &Path) -> Result<LocalRecords> {
        fresh_dest(dest, "")?;
        Ok(LocalRecords {
            dest: dest.to_path_buf(),
            store: None,
        })
    }

    fn store(&self) -> Result<&zr_node::Store> {
        self.store
            .as_ref()
            .ok_or_else(|| IngestError::Usage("records before the dataset was made".into()))
    }
}

impl RecordSink for LocalRecords {
    fn create(&mut self, fields: &[zr_node::FieldSpec]) -> Result<()> {
        let store = zr_node::Store::create(
            &self.dest,
            fields.to_vec(),
            zr_node::CreateOptions::default(),
        )?;
        self.store = Some(store);
        Ok(())
    }

    fn append(&mut self, records: &[zr_node::Record<'_>]) -> Result<()> {
        self.store()?.append_many(records)?;
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        Ok(self.store()?.commit()?)
    }

    fn abandon(&mut self) {
        drop(self.store.take());
        let _ = std::fs::remove_dir_all(&self.dest);
    }
}

/// Refuses `dest` if it holds anything: a conversion makes its destination, and removes it
/// if it fails. `hint` ends the error.
pub(crate) fn fresh_dest(dest: &Path, hint: &str) -> Result<()> {
    let occupied = dest.exists()
        && std::fs::read_dir(dest)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true);
    match occupied {
        true => Err(IngestError::Usage(format!(
            "{} exists and is not empty{hint}",
            dest.display()
        ))),
        false => Ok(()),
    }
}

/// The stream to write: made new (true), or opened to append to.
fn open_dest(options: &JsonlOptions, dtype: &str) -> Result<(Stream, bool)> {
    let dest = &options.dest;
    if options.append {
        let stream = Stream::open(dest)?;
        let has = stream.element();
        if has.len() != 1 || has[0].dtype != dtype {
            return Err(IngestError::Usage(format!(
                "{}: its tokens are {}, and this tokenizer's vocabulary makes {dtype}",
                dest.display(),
                has.iter()
                    .map(|c| c.dtype.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        return Ok((stream, false));
    }
    fresh_dest(dest, " (give --append to add to a stream)")?;
    Ok((
        Stream::create(dest, vec![Component::new("token", dtype)])?,
        true,
    ))
}

fn convert(
    options: &JsonlOptions,
    tokenizer: &tokenizers::Tokenizer,
    eos: Option<u32>,
    dtype: &str,
    mut target: Target<'_>,
    progress: &mut impl FnMut(Progress),
) -> Result<Report> {
    let threads = match options.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let wide = dtype == "<u4";
    let (to_work, work) = mpsc::sync_channel::<(u64, Vec<Line>)>(threads * 2);
    let work = std::sync::Mutex::new(work);
    let (to_write, done) = mpsc::sync_channel::<(u64, Tokenized)>(threads * 2);
    let mut report = Report {
        dtype: dtype.to_string(),
        ..Report::default()
    };
    std::thread::scope(|scope| -> Result<Report> {
        let reader = scope.spawn(move || read_lines(&options.inputs, &options.text_key, to_work));
        for _ in 0..threads {
            let (work, to_write) = (&work, to_write.clone());
            // A tokenizer each: its models' caches are not shared between threads.
            let tokenizer = tokenizer.clone();
            scope.spawn(move || {
                let mut encoder = Encoder::new(&tokenizer);
                loop {
                    let next = work.lock().map(|w| w.recv());
                    let Ok(Ok((seq, lines))) = next else { return };
                    let out = tokenize(options, &mut encoder, eos, wide, lines);
                    if to_write.send((seq, out)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(to_write);
        // Written in the input's order, whatever order the batches come back in.
        let mut waiting: BTreeMap<u64, Tokenized> = BTreeMap::new();
        let mut next = 0u64;
        let mut status = Progress::default();
        let result = (|| -> Result<()> {
            for (seq, out) in done.iter() {
                waiting.insert(seq, out);
                while let Some(out) = waiting.remove(&next) {
                    let (documents, skipped, bytes) = out?;
                    for (tokens, metadata) in &documents {
                        let count = (tokens.len() / if wide { 4 } else { 2 }) as u64;
                        let whole = [zr_node::stream::Span {
                            start: 0,
                            end: count,
                            metadata,
                        }];
                        let spans = if metadata.is_empty() || count == 0 {
                            &whole[..0]
                        } else {
                            &whole[..]
                        };
                        target.append(tokens, count, spans)?;
                        status.tokens += count;
                    }
                    target.aligned()?;
                    status.documents += documents.len() as u64;
                    status.bytes += bytes;
                    report.skipped += skipped;
                    next += 1;
                    progress(status);
                }
            }
            Ok(())
        })();
        // On an error the channels close: the reader and workers stop at their next send.
        drop(done);
        let read = reader
            .join()
            .map_err(|_| IngestError::Usage("the reader thread panicked".into()))?;
        result?;
        read?;
        target.finish()?;
        report.documents = status.documents;
        report.tokens = status.tokens;
        Ok(report)
    })
}

/// Reads every input's lines in order, in batches, into `to_work`.
fn read_lines(
    inputs: &[PathBuf],
    text_key: &str,
    to_work: mpsc::SyncSender<(u64, Vec<Line>)>,
) -> Result<()> {
    let mut seq = 0u64;
    let mut batch = Vec::with_capacity(BATCH_LINES);
    for (file, path) in inputs.iter().enumerate() {
        if path.to_string_lossy().ends_with(".parquet") {
            let sent = parquet::read_texts(path, text_key, |number, text| {
                batch.push(Line {
                    file,
                    number,
                    bytes: Vec::new(),
                    text: Some(text),
                });
                if batch.len() == BATCH_LINES {
                    if to_work.send((seq, std::mem::take(&mut batch))).is_err() {
                        return false; // the writer stopped
                    }
                    seq += 1;
                }
                true
            })?;
            if !sent {
                return Ok(());
            }
            continue;
        }
        let mut reader = BufReader::with_capacity(1 << 20, open_input(path)?);
        let mut number = 0u64;
        loop {
            let mut bytes = Vec::new();
            let read = reader
                .read_until(b'\n', &mut bytes)
                .map_err(|e| IngestError::Input {
                    path: path.clone(),
                    reason: format!("after line {number}: {e}"),
                })?;
            if read == 0 {
                break;
            }
            number += 1;
            if bytes.iter().all(u8::is_ascii_whitespace) {
                continue; // a blank line is no document
            }
            batch.push(Line {
                file,
                number,
                bytes,
                text: None,
            });
            if batch.len() == BATCH_LINES {
                if to_work.send((seq, std::mem::take(&mut batch))).is_err() {
                    return Ok(()); // the writer stopped
                }
                seq += 1;
            }
        }
    }
    if !batch.is_empty() {
        let _ = to_work.send((seq, batch));
    }
    Ok(())
}

/// A file's bytes, decompressed by its name's ending (`.gz`, `.zst`).
fn open_input(path: &Path) -> Result<Box<dyn Read + Send>> {
    let file = remote::open_read(path)?;
    let name = path.to_string_lossy();
    Ok(if name.ends_with(".gz") {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else if name.ends_with(".zst") {
        Box::new(
            zstd::stream::read::Decoder::new(file).map_err(|e| IngestError::Input {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?,
        )
    } else {
        Box::new(file)
    })
}

/// Each line's text tokenized, as little-endian token bytes.
fn tokenize(
    options: &JsonlOptions,
    encoder: &mut Encoder<'_>,
    eos: Option<u32>,
    wide: bool,
    lines: Vec<Line>,
) -> Tokenized {
    let mut documents = Vec::with_capacity(lines.len());
    let (mut skipped, mut bytes) = (0u64, 0u64);
    for line in lines {
        bytes += line.bytes.len() as u64;
        let bad = |reason: String| IngestError::Line {
            path: options.inputs[line.file].clone(),
            line: line.number,
            reason,
        };
        let text = match line.text.clone() {
            // A Parquet row: its text column read already.
            Some(Some(text)) => Ok((text, serde_json::Value::Null)),
            Some(None) => Err(bad(format!("'{}' is null", options.text_key))),
            None => std::str::from_utf8(&line.bytes)
                .map_err(|e| bad(format!("not UTF-8 ({e})")))
                .and_then(|text| {
                    serde_json::from_str::<serde_json::Value>(text)
                        .map_err(|e| bad(format!("not JSON: {e}")))
                })
                .and_then(|value| match value.get(&options.text_key) {
                    Some(serde_json::Value::String(text)) => Ok((text.clone(), value)),
                    Some(_) => Err(bad(format!("'{}' is not a string", options.text_key))),
                    None => Err(bad(format!("no key '{}'", options.text_key))),
                }),
        };
        let (text, value) = match text {
            Ok(found) => found,
            Err(_) if options.skip_bad => {
                skipped += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let ids = encoder
            .encode(&text)
            .map_err(|e| bad(format!("the tokenizer failed: {e}")))?;
        let mut out = Vec::with_capacity((ids.len() + 1) * if wide { 4 } else { 2 });
        for &id in ids.iter().chain(eos.as_ref()) {
            if wide {
                out.extend_from_slice(&id.to_le_bytes());
            } else {
                let id = u16::try_from(id)
                    .map_err(|_| bad(format!("token id {id} does not fit uint16")))?;
                out.extend_from_slice(&id.to_le_bytes());
            }
        }
        let metadata = if options.meta_keys.is_empty() {
            Vec::new()
        } else {
            let kept: serde_json::Map<String, serde_json::Value> = options
                .meta_keys
                .iter()
                .filter_map(|k| value.get(k).map(|v| (k.clone(), v.clone())))
                .collect();
            if kept.is_empty() {
                Vec::new()
            } else {
                serde_json::Value::Object(kept).to_string().into_bytes()
            }
        };
        documents.push((out, metadata));
    }
    Ok((documents, skipped, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer of a few words, split on whitespace: enough to check ids.
    const TOKENIZER: &str = r#"{
      "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
      "normalizer": null,
      "pre_tokenizer": {"type": "Whitespace"},
      "post_processor": null, "decoder": null,
      "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "</s>": 1, "the": 2, "cat": 3, "sat": 4, "é": 5, "🙂": 6},
                "unk_token": "[UNK]"}
    }"#;

    fn options(dir: &Path, inputs: Vec<PathBuf>) -> JsonlOptions {
        let tokenizer = dir.join("tokenizer.json");
        std::fs::write(&tokenizer, TOKENIZER).unwrap();
        JsonlOptions {
            inputs,
            tokenizer,
            text_key: "text".into(),
            eos: Some("</s>".into()),
            dest: dir.join("stream"),
            append: false,
            skip_bad: false,
            threads: 3,
            meta_keys: Vec::new(),
        }
    }

    fn documents(dest: &Path) -> Vec<Vec<u16>> {
        let stream = Stream::open_read_only(dest).unwrap();
        (0..stream.documents())
            .map(|d| {
                let (start, end) = stream.document(d).unwrap();
                let mut bytes = vec![0u8; ((end - start) * 2) as usize];
                stream.read_tokens(start, &mut bytes).unwrap();
                bytes
                    .chunks(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn lines_become_documents_in_order_from_plain_gzip_and_zstd_files() {
        let dir = tempfile::tempdir().unwrap();
        let lines: Vec<String> = (0..2000)
            .map(|k| {
                format!(
                    "{{\"text\": \"the cat {} sat\", \"id\": {k}}}",
                    if k % 3 == 0 { "é 🙂" } else { "" }
                )
            })
            .collect();
        let plain = dir.path().join("a.jsonl");
        std::fs::write(&plain, lines[..700].join("\n")).unwrap();
        let gz = dir.path().join("b.jsonl.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut enc, (lines[700..1400].join("\n") + "\n\n").as_bytes())
            .unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        let zst = dir.path().join("c.jsonl.zst");
        std::fs::write(
            &zst,
            zstd::encode_all(lines[1400..].join("\n").as_bytes(), 3).unwrap(),
        )
        .unwrap();
        let opts = options(dir.path(), vec![plain, gz, zst]);
        let mut last = Progress::default();
        let report = tokenize_jsonl(&opts, |p| last = p).unwrap();
        assert_eq!((report.documents, report.dtype.as_str()), (2000, "<u2"));
        assert_eq!(last.documents, 2000);
        let got = documents(&opts.dest);
        for (k, doc) in got.iter().enumerate() {
            let want: Vec<u16> = if k % 3 == 0 {
                vec![2, 3, 5, 6, 4, 1]
            } else {
                vec![2, 3, 4, 1]
            };
            assert_eq!(doc, &want, "document {k}");
        }
        // The keys asked for kept as metadata over each whole document.
        let with_meta = JsonlOptions {
            dest: dir.path().join("with-meta"),
            meta_keys: vec!["id".into(), "absent".into()],
            ..opts.clone()
        };
        tokenize_jsonl(&with_meta, |_| {}).unwrap();
        let stream = Stream::open_read_only(&with_meta.dest).unwrap();
        assert_eq!(stream.spans(), 2000);
        let (start, end, metadata) = stream.span(1234).unwrap();
        assert_eq!(stream.document(1234).unwrap(), (start, end));
        assert_eq!(metadata, br#"{"id":1234}"#);
        // Appended: more documents after the last commit.
        let more = dir.path().join("d.jsonl");
        std::fs::write(&more, "{\"text\": \"sat sat\"}\n").unwrap();
        let append = JsonlOptions {
            inputs: vec![more],
            append: true,
            ..opts.clone()
        };
        tokenize_jsonl(&append, |_| {}).unwrap();
        let got = documents(&opts.dest);
        assert_eq!(got.len(), 2001);
        assert_eq!(got[2000], vec![4, 4, 1]);
    }

    /// A Parquet text column tokenizes as JSON lines do; a null is named by file and row.
    #[test]
    fn a_parquet_text_column_becomes_documents() {
        use arrow_array::{ArrayRef, RecordBatch, StringArray};
        use arrow_schema::{DataType, Field, Schema};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let texts: Vec<Option<String>> = (0..3000)
            .map(|k| {
                (k != 2500).then(|| format!("the cat {}", if k % 2 == 0 { "sat" } else { "🙂" }))
            })
            .collect();
        let schema =
            std::sync::Arc::new(Schema::new(vec![Field::new("body", DataType::Utf8, true)]));
        let column: ArrayRef = std::sync::Arc::new(StringArray::from(texts.clone()));
        let batch = RecordBatch::try_new(schema, vec![column]).unwrap();
        crate::parquet::tests::write_parquet(&path, &batch);
        let opts = JsonlOptions {
            text_key: "body".into(),
            ..options(dir.path(), vec![path])
        };
        let e = tokenize_jsonl(&opts, |_| {}).unwrap_err().to_string();
        assert!(e.contains("t.parquet:2501: 'body' is null"), "{e}");
        let skipping = JsonlOptions {
            skip_bad: true,
            ..opts.clone()
        };
        let report = tokenize_jsonl(&skipping, |_| {}).unwrap();
        assert_eq!((report.documents, report.skipped), (2999, 1));
        let got = documents(&opts.dest);
        assert_eq!(got[0], vec![2, 3, 4, 1]);
        assert_eq!(got[1], vec![2, 3, 6, 1]);
        let wrong = JsonlOptions {
            text_key: "text".into(),
            dest: dir.path().join("other"),
            ..opts
        };
        let e = tokenize_jsonl(&wrong, |_| {}).unwrap_err().to_string();
        assert!(
            e.contains("no column 'text' to tokenize (it has: body)"),
            "{e}"
        );
    }

    #[test]
    fn bad_lines_name_file_and_line_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("bad.jsonl");
        std::fs::write(
            &input,
            "{\"text\": \"the\"}\n{\"text\": 3}\n{oops\n{\"body\": \"x\"}\n",
        )
        .unwrap();
        let opts = options(dir.path(), vec![input.clone()]);
        let e = tokenize_jsonl(&opts, |_| {}).unwrap_err().to_string();
        assert!(e.contains("bad.jsonl:2: 'text' is not a string"), "{e}");
        assert!(!opts.dest.exists(), "a failed conversion left its stream");
        let skipping = JsonlOptions {
            skip_bad: true,
            ..opts.clone()
        };
        let report = tokenize_jsonl(&skipping, |_| {}).unwrap();
        assert_eq!((report.documents, report.skipped), (1, 3));
        // Into a stream that has documents, a failed append leaves it at its last commit.
        std::fs::write(&input, b"{\"text\": \"cat\"}\n\xffbad\n").unwrap();
        let append = JsonlOptions {
            append: true,
            ..opts.clone()
        };
        let e = tokenize_jsonl(&append, |_| {}).unwrap_err().to_string();
        assert!(e.contains("bad.jsonl:2: not UTF-8"), "{e}");
        assert_eq!(documents(&opts.dest).len(), 1);
        // A tokenizer that does not parse, and an end token it lacks.
        std::fs::write(&opts.tokenizer, "{not a tokenizer").unwrap();
        let e = tokenize_jsonl(&opts, |_| {}).unwrap_err().to_string();
        assert!(
            e.contains("tokenizer") && e.contains("tokenizer.json"),
            "{e}"
        );
        std::fs::write(&opts.tokenizer, TOKENIZER).unwrap();
        let other = JsonlOptions {
            eos: Some("<|endoftext|>".into()),
            dest: dir.path().join("other"),
            ..opts.clone()
        };
        let e = tokenize_jsonl(&other, |_| {}).unwrap_err().to_string();
        assert!(e.contains("no token '<|endoftext|>'"), "{e}");
        let missing = JsonlOptions {
            inputs: vec![dir.path().join("nowhere.jsonl")],
            dest: dir.path().join("other"),
            ..opts
        };
        let e = tokenize_jsonl(&missing, |_| {}).unwrap_err().to_string();
        assert!(e.contains("nowhere.jsonl: no such file"), "{e}");
    }
}
