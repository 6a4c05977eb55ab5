//! `zr convert`: build a dataset from NumPy files, or a token stream from Megatron-LM's
//! indexed dataset or NumPy tokens.

use std::path::PathBuf;

use clap::Args;
use zr_node::convert::{convert_npy, convert_values, Destination, LocalDataset, Target};
use zr_node::stream::{convert_megatron, convert_tokens, megatron_into, tokens_into};
use zr_node::Compression;

use crate::cluster::{target_dir, ClusterDestination, RouterArgs};
use crate::sinks::{ClusterRecords, ClusterSink};
use crate::{progress_bar, CliResult};
use zr_net::tls::Access;

/// Build a dataset from a NumPy .npy (one record per row) or from values.bin + offsets.npy;
/// or a token stream from --megatron PREFIX or --tokens with --doc-lengths.
///
/// With --npy every row becomes one record; the dtype and row shape are recorded in
/// meta.json. With --values and --offsets, record i is `values[offsets[i]..offsets[i+1]]`
/// (offsets.npy: N+1 little-endian u64). The target must not exist or be empty, unless
/// --append adds the records to an existing dataset. The dataset is committed once, at the
/// end: if the conversion fails, it is left as it was.
///
/// With --router instead of a directory, the records are bulk-loaded into a cluster through
/// its router (the field must be one of the cluster's; an empty cluster unless --append).
/// A cluster shows appended records at once, so a conversion that fails midway leaves the
/// records appended so far in place; the error says where it stopped.
///
/// With --jsonl, text (JSON lines, .jsonl, .jsonl.gz or .jsonl.zst, one document a line)
/// is tokenized with a Hugging Face tokenizer.json — by the library the Python `tokenizers`
/// package is built on, so the tokens are the same — into a token stream (uint16 tokens
/// when the vocabulary fits, else uint32), on every core while the input streams, in the
/// input's order. A bad line fails the conversion naming file:line (--skip-bad counts and
/// skips it); a failed conversion leaves no new stream, and an appended one at its last
/// commit.
///
/// With --parquet and --tokenizer, a text column of Parquet files (--text-column, default
/// text) is tokenized into a token stream as JSON lines are.
///
/// With --parquet, Parquet files (a Hugging Face dataset's) become a record dataset, a column
/// a field: binary and string columns bytes (a null absent), numbers and fixed-size lists of
/// numbers typed fields of their dtype and shape, image and audio structs ({bytes, path})
/// their bytes; any other type is refused by name, and a failed conversion leaves nothing.
///
/// With --webdataset, WebDataset tar shards become a record dataset: each sample's members
/// (consecutive members sharing a key) its fields, named by extension, stored as they are.
/// A sample lacking a member the first sample has fails the conversion naming the shard and
/// the key (--missing skip counts and skips it); a failed conversion leaves nothing.
///
/// Their inputs may also be object-store URLs (s3://bucket/key, gs://, az://, https://),
/// read in ranges as the conversion goes, with credentials from the environment as each
/// store takes them (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION,
/// AWS_ENDPOINT, GOOGLE_SERVICE_ACCOUNT, AZURE_STORAGE_ACCOUNT_NAME, …).
///
/// --jsonl, --parquet and --webdataset also convert into a cluster: --router ADDR --certs
/// DIR --dataset NAME (an operator's certificate) makes NAME a new dataset — a token stream
/// for text, a record dataset for tables — committed every 256 MiB, and dropped again if
/// the conversion fails.
///
/// A token stream (--megatron, --tokens) keeps the tokens densely with their document
/// boundaries; training reads windows of any length from it (`zrecord.open_stream(DIR)
/// .windows(seq_len=2048)`), so the window length is not fixed here. Its input is checked
/// whole before anything is written, and a failed conversion leaves nothing behind. With
/// --router and --dataset NAME the stream becomes a new dataset of the cluster (operator
/// certificate), committed every 256 MiB of tokens, and dropped again if the conversion
/// fails.
#[derive(Args)]
pub struct ConvertArgs {
    /// Dataset directory to create (or extend, with --append).
    dir: Option<PathBuf>,
    #[command(flatten)]
    remote: RouterArgs,
    /// A .npy array: one record per row (C order, any fixed-size dtype).
    #[arg(long, conflicts_with_all = ["values", "offsets", "megatron", "tokens", "jsonl", "webdataset", "parquet"], required_unless_present_any = ["values", "megatron", "tokens", "jsonl", "webdataset", "parquet"])]
    npy: Option<PathBuf>,
    /// JSON-lines files of text (.jsonl, .jsonl.gz, .jsonl.zst), one document a line:
    /// tokenized with --tokenizer into a token stream.
    #[arg(long, num_args = 1.., requires = "tokenizer", conflicts_with_all = ["values", "offsets", "megatron", "tokens"])]
    jsonl: Vec<PathBuf>,
    /// A Hugging Face tokenizer.json (for --jsonl).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The key of each line's text (for --jsonl), or the text column (for --parquet with
    /// --tokenizer).
    #[arg(long, default_value = "text", alias = "text-column")]
    text_key: String,
    /// A token to end every document with, by its text (e.g. '</s>'; for --jsonl).
    #[arg(long)]
    eos: Option<String>,
    /// Count and skip lines that are not JSON objects with the text key (for --jsonl).
    #[arg(long)]
    skip_bad: bool,
    /// Threads tokenizing (for --jsonl; default: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Keys of each line kept as metadata of a span over its whole document, e.g. url,source
    /// (for --jsonl; read back with the stream's spans).
    #[arg(long, value_delimiter = ',')]
    meta_keys: Vec<String>,
    /// WebDataset tar shards ('shard-{000000..000099}.tar' expands): each sample's members
    /// become its fields, named by extension (jpg, cls, json, ...), stored as they are.
    #[arg(long, num_args = 1.., conflicts_with_all = ["values", "offsets", "megatron", "tokens", "jsonl", "npy"])]
    webdataset: Vec<String>,
    /// Parquet files (a Hugging Face dataset's, say): each column a field — binary and
    /// string columns bytes, numbers and fixed-size lists of numbers typed fields, image and
    /// audio structs their bytes; other types are refused by name.
    #[arg(long, num_args = 1.., conflicts_with_all = ["values", "offsets", "megatron", "tokens", "jsonl", "npy", "webdataset"])]
    parquet: Vec<PathBuf>,
    /// The Parquet columns to keep, in this order (default: all).
    #[arg(long, value_delimiter = ',')]
    columns: Vec<String>,
    /// What a sample lacking a member the first sample has becomes (for --webdataset):
    /// fail (the error names the shard and the key) or skip (counted).
    #[arg(long, default_value = "fail", value_parser = ["fail", "skip"])]
    missing: String,
    /// A Megatron-LM indexed dataset, PREFIX.bin + PREFIX.idx: builds a token stream (one
    /// document per Megatron document; uint16 tokens stay uint16, int32 become uint32).
    #[arg(long, value_name = "PREFIX", conflicts_with_all = ["values", "offsets", "tokens"])]
    megatron: Option<PathBuf>,
    /// Token ids back to back (a 1-D integer .npy): builds a token stream, cut into documents
    /// by --doc-lengths.
    #[arg(long, requires = "doc_lengths", conflicts_with_all = ["values", "offsets"])]
    tokens: Option<PathBuf>,
    /// Document lengths in tokens (a 1-D integer .npy summing to the number of tokens).
    #[arg(long, requires = "tokens")]
    doc_lengths: Option<PathBuf>,
    /// A token stream in a cluster: tokens per block (a record; the cluster places blocks
    /// by extents as it places records). A window crossing blocks is read in pieces.
    #[arg(long, default_value_t = zr_router::stream::BLOCK_TOKENS_DEFAULT)]
    block_tokens: u64,
    /// Payloads back to back, for variable-length records.
    #[arg(long, requires = "offsets")]
    values: Option<PathBuf>,
    /// N+1 byte offsets into --values (.npy of <u8).
    #[arg(long, requires = "values")]
    offsets: Option<PathBuf>,
    /// Field to fill.
    #[arg(long, default_value = "data")]
    field: String,
    /// Storage of the field: raw, flate, zstd or zstd:LEVEL (1-22, default 3); default raw
    /// (a cluster's is set in nodes.toml or `zr dataset create`).
    #[arg(long, value_parser = parse_compression)]
    compress: Option<(Compression, Option<i32>)>,
    /// Add to an existing dataset instead of creating a new one.
    #[arg(long)]
    append: bool,
    /// Compress the field with a zstd dictionary trained on a sample of its records: for
    /// small records. A local dataset is converted, then rewritten with it (as `zr dict
    /// train`); with --router, the dictionary is trained on the --values records first and
    /// --dataset NAME is made with it (a new dataset: operator certificate), then filled.
    #[arg(long)]
    dict: bool,
}

/// A field's storage and Zstandard level.
type Storage = (Compression, Option<i32>);

fn parse_compression(s: &str) -> Result<(Compression, Option<i32>), zr_node::SchemaError> {
    Ok(zr_node::meta::parse_storage(s)?)
}

pub fn run(args: ConvertArgs) -> CliResult {
    if !args.jsonl.is_empty() {
        return convert_jsonl(&args);
    }
    if !args.webdataset.is_empty() {
        return convert_webdataset(&args);
    }
    if !args.parquet.is_empty() && args.tokenizer.is_some() {
        return convert_jsonl(&args); // a text column, tokenized into a stream
    }
    if !args.parquet.is_empty() {
        return convert_parquet(&args);
    }
    if args.megatron.is_some() || args.tokens.is_some() {
        return convert_stream(&args);
    }
    let dir = target_dir(&args.dir, &args.remote)?;
    let (mut dest, (compress, level), name): (
        Box<dyn Destination>,
        (Compression, Option<i32>),
        String,
    ) = match dir {
        Some(dir) => {
            // Appending without --compress keeps the field's own compression.
            let existing = if args.append && args.compress.is_none() {
                zr_node::Store::open_read_only(dir).ok().and_then(|store| {
                    store
                        .fields()
                        .iter()
                        .find(|f| f.name == args.field)
                        .map(|f| (f.compress, f.level))
                })
            } else {
                None
            };
            (
                Box::new(LocalDataset::new(dir)),
                args.compress
                    .or(existing)
                    .unwrap_or((Compression::Raw, None)),
                dir.display().to_string(),
            )
        }
        None if args.dict => {
            let (client, storage) = cluster_dataset_with_dict(&args)?;
            let name = format!(
                "dataset '{}' of the cluster at {}",
                client.name(),
                client.router()
            );
            (Box::new(ClusterDestination { client }), storage, name)
        }
        None => {
            let client = args
                .remote
                .client(Access::Write)?
                .ok_or("--router is missing")?;
            let cluster_compress = client
                .fields()
                .iter()
                .find(|f| f.name == args.field)
                .and_then(|f| zr_node::meta::parse_storage(&f.compress).ok());
            let name = format!("the cluster at {}", client.router());
            (
                Box::new(ClusterDestination { client }),
                args.compress
                    .or(cluster_compress)
                    .unwrap_or((Compression::Raw, None)),
                name,
            )
        }
    };
    let target = Target {
        field: &args.field,
        compress,
        level,
        append: args.append,
    };
    let (input_bytes, source) = match (&args.npy, &args.values) {
        (Some(npy), _) => (
            std::fs::metadata(npy).map(|m| m.len()).unwrap_or(0),
            npy.display().to_string(),
        ),
        (None, Some(values)) => (
            std::fs::metadata(values).map(|m| m.len()).unwrap_or(0),
            values.display().to_string(),
        ),
        (None, None) => return Err("give --npy FILE, or --values FILE with --offsets FILE".into()),
    };
    let bar = progress_bar(input_bytes, true);
    bar.set_message("converting");
    let started = std::time::Instant::now();
    // A new dataset that a failed conversion leaves half made is removed: nothing stays
    // behind to make the next attempt fail with "already exists".
    let created = match dir {
        Some(dir) if !args.append && !dir.exists() => Some(dir.to_path_buf()),
        _ => None,
    };
    let converted = match (&args.npy, &args.values, &args.offsets) {
        (Some(npy), _, _) => {
            convert_npy(npy, &target, dest.as_mut(), |done| bar.set_position(done))
        }
        (None, Some(values), Some(offsets)) => {
            convert_values(values, offsets, &target, dest.as_mut(), |done| {
                bar.set_position(done)
            })
        }
        _ => return Err("--values needs --offsets".into()),
    };
    let records = match converted {
        Ok(records) => records,
        Err(e) => {
            bar.finish_and_clear();
            drop(dest);
            if let Some(dir) = created {
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(removal) if removal.kind() == std::io::ErrorKind::NotFound => {}
                    Err(removal) => {
                        eprintln!("zr: could not remove {}: {removal}", dir.display())
                    }
                }
            }
            return Err(e.into());
        }
    };
    bar.finish_and_clear();
    println!(
        "converted {records} records from {source} into {} (field '{}', {}) in {:.1} s",
        name,
        args.field,
        target.storage(),
        started.elapsed().as_secs_f64()
    );
    // The dataset let go before its rewrite, which needs it alone.
    drop(dest);
    if let (true, Some(dir)) = (args.dict, dir) {
        crate::dataset::train_dict(dir, &args.field, zr_node::dict::DICT_BYTES_DEFAULT, level)?;
    }
    Ok(())
}

/// `--dict` with `--router`: a dictionary trained on the `--values` records, and the new
/// dataset `--dataset NAME` made with the field stored zstd with it. Returns a client of the
/// dataset and the field's storage.
fn cluster_dataset_with_dict(
    args: &ConvertArgs,
) -> Result<(zr_router::Client, Storage), Box<dyn std::error::Error>> {
    let (Some(values), Some(offsets)) = (&args.values, &args.offsets) else {
        return Err("--dict trains on records of varied length: give --values and --offsets (an --npy array's rows are all one size)".into());
    };
    if args.append {
        return Err("--dict with --router makes a new dataset, and --append adds to one that exists: train a dictionary when a dataset is made".into());
    }
    let storage = match args.compress {
        None => (Compression::Zstd, None),
        Some((Compression::Zstd, level)) => (Compression::Zstd, level),
        Some(_) => return Err("--dict compresses the field with zstd: give --compress zstd[:LEVEL] or leave --compress out".into()),
    };
    let mut remote = args.remote.clone();
    let name = remote.dataset.take().ok_or(
        "--dict with --router makes a new dataset with the dictionary: name it with --dataset NAME",
    )?;
    let client = remote
        .client(Access::Operate)?
        .ok_or("--router is missing")?;
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_message(format!("training a dictionary on {}", values.display()));
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    let trained =
        zr_node::convert::train_dict_on_values(values, offsets, zr_node::dict::DICT_BYTES_DEFAULT);
    spinner.finish_and_clear();
    let (dict, samples) = trained?;
    let id = zr_node::dict::id(&dict).unwrap_or_default();
    let storage_name = zr_node::meta::FieldSpec {
        level: storage.1,
        ..zr_node::meta::FieldSpec::new(args.field.clone(), Compression::Zstd)
    }
    .storage();
    let client = client.create_dataset_with_dicts(
        &name,
        vec![zr_router::FieldInfo::new(
            args.field.clone(),
            storage_name.clone(),
        )],
        vec![zr_router::FieldDict {
            field: args.field.clone(),
            bytes: dict.clone(),
        }],
    )?;
    println!(
        "made dataset '{name}': field '{}' stored {storage_name} with dictionary {id} ({} bytes, trained on {samples} records)",
        args.field,
        dict.len()
    );
    Ok((client, storage))
}

/// `--megatron` / `--tokens`: a token stream in a new local directory, or (with
/// `--router`) a new dataset of the cluster (`--dataset NAME`).
fn convert_stream(args: &ConvertArgs) -> CliResult {
    if args.append || args.dict || args.compress.is_some() {
        return Err(
            "--append, --compress and --dict are for record datasets, not token streams".into(),
        );
    }
    let dir = target_dir(&args.dir, &args.remote)?;
    let mut remote = args.remote.clone();
    let name = remote.dataset.take();
    let mut sink = match dir {
        Some(_) => None,
        None => {
            let name = name.ok_or(
                "a token stream in a cluster is a new dataset: name it with --dataset NAME",
            )?;
            let client = remote
                .client(Access::Operate)?
                .ok_or("--router is missing")?;
            Some(ClusterSink::new(client, name, args.block_tokens))
        }
    };
    let bar = progress_bar(0, true);
    bar.set_message("converting");
    let started = std::time::Instant::now();
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let megatron = |prefix: &PathBuf| format!("{}.{{bin,idx}}", prefix.display());
    let (converted, source) = match (
        &args.megatron,
        &args.tokens,
        &args.doc_lengths,
        dir,
        sink.as_mut(),
    ) {
        (Some(prefix), _, _, Some(dir), _) => (
            convert_megatron(prefix, dir, progress).map(|m| (m.tokens, m.documents)),
            megatron(prefix),
        ),
        (Some(prefix), _, _, None, Some(sink)) => (
            megatron_into(prefix, sink, progress).map(|c| (c.tokens, c.documents)),
            megatron(prefix),
        ),
        (None, Some(tokens), Some(lengths), Some(dir), _) => (
            convert_tokens(tokens, lengths, dir, progress).map(|m| (m.tokens, m.documents)),
            tokens.display().to_string(),
        ),
        (None, Some(tokens), Some(lengths), None, Some(sink)) => (
            tokens_into(tokens, lengths, sink, progress).map(|c| (c.tokens, c.documents)),
            tokens.display().to_string(),
        ),
        _ => return Err("--tokens needs --doc-lengths".into()),
    };
    bar.finish_and_clear();
    let (tokens, documents) = match converted {
        Ok(done) => done,
        Err(e) => {
            if let Some(sink) = sink.as_mut() {
                sink.abandon();
            }
            return Err(e.into());
        }
    };
    let target = match dir {
        Some(dir) => dir.display().to_string(),
        None => format!(
            "the cluster's dataset '{}'",
            args.remote.dataset.as_deref().unwrap_or_default()
        ),
    };
    println!(
        "converted {tokens} tokens in {documents} documents from {source} into the token stream {target} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The cluster a conversion without DIR writes into: an operator's client of the router and
/// the new dataset's name (`--dataset NAME`); `None` with a DIR.
fn cluster_target(
    args: &ConvertArgs,
    what: &str,
) -> Result<Option<(zr_router::Client, String)>, Box<dyn std::error::Error>> {
    if target_dir(&args.dir, &args.remote)?.is_some() {
        return Ok(None);
    }
    if args.append {
        return Err(format!(
            "{what} into a cluster makes a new dataset; --append adds to a local one (DIR)"
        )
        .into());
    }
    let mut remote = args.remote.clone();
    let name = remote.dataset.take().ok_or_else(|| {
        format!("{what} into a cluster makes a new dataset: name it with --dataset NAME")
    })?;
    let client = remote
        .client(Access::Operate)?
        .ok_or("--router is missing")?;
    Ok(Some((client, name)))
}

/// Where a table conversion's records go, and its name: a new local dataset at DIR, or with
/// `--router` the cluster's new dataset.
fn record_sink(
    args: &ConvertArgs,
    what: &str,
) -> Result<(Box<dyn zr_ingest::RecordSink>, String), Box<dyn std::error::Error>> {
    Ok(match cluster_target(args, what)? {
        Some((client, name)) => {
            let target = format!("the cluster's dataset '{name}'");
            (Box::new(ClusterRecords::new(client, name)), target)
        }
        None => {
            let dest = args.dir.clone().ok_or("give a dataset directory (DIR)")?;
            let sink = zr_ingest::LocalRecords::new(&dest)?;
            (Box::new(sink), dest.display().to_string())
        }
    })
}

/// `--jsonl`: text through a tokenizer into a local token stream or a cluster's new one,
/// with a progress line of documents, tokens/s and bytes/s.
fn convert_jsonl(args: &ConvertArgs) -> CliResult {
    let cluster = cluster_target(args, "text")?;
    let dest = args.dir.clone().unwrap_or_default();
    let tokenizer = args
        .tokenizer
        .clone()
        .ok_or("--jsonl needs --tokenizer FILE")?;
    let inputs = if args.jsonl.is_empty() {
        args.parquet.clone()
    } else {
        args.jsonl.clone()
    };
    let options = zr_ingest::JsonlOptions {
        inputs: inputs.clone(),
        tokenizer,
        text_key: args.text_key.clone(),
        eos: args.eos.clone(),
        dest: dest.clone(),
        append: args.append,
        skip_bad: args.skip_bad,
        threads: args.threads,
        meta_keys: args.meta_keys.clone(),
    };
    let total: u64 = inputs
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
    let started = std::time::Instant::now();
    let show = |p: zr_ingest::Progress| {
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        spinner.set_message(format!(
            "{} documents, {} tokens ({:.0} tokens/s, {:.1} MiB/s of text; {:.0} MiB of input files)",
            p.documents,
            p.tokens,
            p.tokens as f64 / seconds,
            p.bytes as f64 / seconds / (1 << 20) as f64,
            total as f64 / (1 << 20) as f64
        ));
        spinner.tick();
    };
    let (report, target) = match cluster {
        None => (
            zr_ingest::tokenize_jsonl(&options, show)?,
            dest.display().to_string(),
        ),
        Some((client, name)) => {
            let target = format!("the cluster's dataset '{name}'");
            let mut sink = ClusterSink::new(client, name, args.block_tokens);
            let report = zr_ingest::tokenize_jsonl_into(&options, &mut sink, show);
            if report.is_err() {
                sink.abandon();
            }
            (report?, target)
        }
    };
    spinner.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "converted {} documents, {} tokens ({}) into {} in {seconds:.1} s ({:.0} tokens/s){}",
        report.documents,
        report.tokens,
        report.dtype,
        target,
        report.tokens as f64 / seconds.max(1e-9),
        skipped(report.skipped, "bad lines")
    );
    Ok(())
}

/// "; N {what} skipped" where a conversion skipped any, else nothing.
fn skipped(count: u64, what: &str) -> String {
    if count == 0 {
        return String::new();
    }
    format!("; {count} {what} skipped")
}

/// `--webdataset`: tar shards into a local record dataset, with a progress line.
fn convert_webdataset(args: &ConvertArgs) -> CliResult {
    let (mut sink, target) = record_sink(args, "--webdataset")?;
    let options = zr_ingest::TarOptions {
        shards: zr_ingest::webdataset::shards_of(&args.webdataset)?,
        dest: args.dir.clone().unwrap_or_default(),
        skip_incomplete: args.missing == "skip",
    };
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
    let started = std::time::Instant::now();
    let show = |samples: u64, bytes: u64| {
        let seconds = started.elapsed().as_secs_f64().max(1e-9);
        spinner.set_message(format!(
            "{samples} samples, {:.1} MiB ({:.1} MiB/s) from {} shards",
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / seconds / (1 << 20) as f64,
            options.shards.len()
        ));
        spinner.tick();
    };
    let report = zr_ingest::convert_tars_into(&options, sink.as_mut(), show)?;
    spinner.finish_and_clear();
    println!(
        "converted {} samples ({} fields: {}) from {} shards into {} in {:.1} s{}",
        report.samples,
        report.fields.len(),
        report.fields.join(", "),
        options.shards.len(),
        target,
        started.elapsed().as_secs_f64(),
        skipped(report.skipped, "samples lacking a member")
    );
    Ok(())
}

/// `--parquet`: Parquet files into a local record dataset, a column a field.
fn convert_parquet(args: &ConvertArgs) -> CliResult {
    let (mut sink, target) = record_sink(args, "--parquet")?;
    let options = zr_ingest::ParquetOptions {
        inputs: args.parquet.clone(),
        columns: args.columns.clone(),
        dest: args.dir.clone().unwrap_or_default(),
    };
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
    let started = std::time::Instant::now();
    let show = |rows: u64| {
        spinner.set_message(format!(
            "{rows} rows ({:.0} rows/s)",
            rows as f64 / started.elapsed().as_secs_f64().max(1e-9)
        ));
        spinner.tick();
    };
    let report = zr_ingest::convert_parquet_into(&options, sink.as_mut(), show)?;
    spinner.finish_and_clear();
    println!(
        "converted {} rows ({}) from {} files into {} in {:.1} s",
        report.rows,
        report
            .fields
            .iter()
            .map(|(name, what)| format!("{name}: {what}"))
            .collect::<Vec<_>>()
            .join(", "),
        options.inputs.len(),
        target,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
