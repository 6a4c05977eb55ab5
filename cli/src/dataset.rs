//! `zr info`, `zr gather`, `zr verify`, `zr rebalance`: one dataset directory each.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use zr_node::meta::Meta;
use zr_node::{rebalance, GatherOptions, ReadPath, Store};

use crate::cluster::{target_dir, RouterArgs};
use crate::{human_bytes, progress_bar, CliResult};
use zr_net::tls::Access;

/// Show a dataset: length, fields, chunks, bytes on disk, utilization.
///
/// With --router, a cluster's length and fields as its router reports them.
#[derive(Args)]
pub struct InfoArgs {
    /// Dataset directory.
    dir: Option<PathBuf>,
    #[command(flatten)]
    remote: RouterArgs,
}

pub fn info(args: InfoArgs) -> CliResult {
    let Some(dir) = target_dir(&args.dir, &args.remote)? else {
        let client = args
            .remote
            .client(Access::Read)?
            .ok_or("--router is missing")?;
        let (len, fields) = client.info()?;
        println!("cluster      router {}", client.router());
        println!("records      {len}");
        println!("fields       {}", fields.len());
        for field in &fields {
            let dict = field
                .dict
                .map_or_else(String::new, |d| format!(" dict {}", d.id));
            println!("  {:<20} {}{dict}", field.name, field.compress);
        }
        return Ok(());
    };
    if zr_node::stream::is_stream(dir) {
        return stream_info(dir);
    }
    let store = Store::open_read_only(dir)?;
    let meta = Meta::load(dir)?;
    println!("dataset      {}", dir.display());
    println!(
        "format       {} v{} (generation {})",
        meta.format, meta.version, meta.generation
    );
    println!("records      {}", store.len());
    println!("fields       {}", meta.fields.len());
    for field in &meta.fields {
        let compress = field.storage();
        let typed = match (&field.dtype, &field.shape) {
            (Some(dtype), Some(shape)) => format!(" dtype {dtype} shape {shape:?}"),
            (Some(dtype), None) => format!(" dtype {dtype}"),
            _ => String::new(),
        };
        let dict = field
            .dict
            .map_or_else(String::new, |id| format!(" dict {id}"));
        println!("  {:<20} {compress}{dict}{typed}", field.name);
    }
    let sealed = meta.chunks.iter().filter(|c| c.sealed).count();
    println!(
        "chunks       {} ({sealed} sealed, {} unfull; {} records each)",
        meta.chunks.len(),
        meta.chunks.len() - sealed,
        meta.chunk_records
    );
    println!("on disk      {}", human_bytes(disk_usage(dir)?));
    let u = store.utilization()?;
    println!(
        "utilization  {:.3} ({} live of {} in chunks)",
        u.ratio(),
        human_bytes(u.live_bytes),
        human_bytes(u.allocated_bytes)
    );
    Ok(())
}

/// Bytes the directory's files occupy on disk (allocated blocks, not apparent sizes).
fn disk_usage(dir: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            disk_usage(&entry.path())?
        } else {
            meta.blocks() * 512
        };
    }
    Ok(total)
}

/// Write the payloads of records to a file, back to back in the given order.
///
/// Prints the payload lengths (space-separated, in order), so a script can cut the file.
/// With --router, the records come from a cluster.
#[derive(Args)]
pub struct GatherArgs {
    /// Dataset directory.
    dir: Option<PathBuf>,
    #[command(flatten)]
    remote: RouterArgs,
    /// Record indices, comma-separated (any order, repeats allowed).
    #[arg(long, value_delimiter = ',', required_unless_present = "indices_file")]
    indices: Vec<u64>,
    /// A file with one index per line, for long lists.
    #[arg(long, conflicts_with = "indices")]
    indices_file: Option<PathBuf>,
    /// Field to read (needed when the dataset has several).
    #[arg(long)]
    field: Option<String>,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
    /// Skip checking each record's CRC32 while reading (a corrupt record is then returned as
    /// it is, as training's fast path does). Checked by default; through a router with
    /// replicas, a damaged copy is read from another replica and repaired.
    #[arg(long)]
    no_verify: bool,
    #[command(flatten)]
    read: ReadArgs,
}

/// How a local dataset's records are read.
#[derive(Args, Clone, Copy)]
pub struct ReadArgs {
    /// How records are read: `mmap` (through the memory mappings: fastest while the data is
    /// in memory), `direct` (explicit reads of exactly each record at a deep queue: for data
    /// that is not), or `auto` (per batch, from whether its pages are in memory).
    #[arg(long, default_value = "auto", value_name = "mmap|direct|auto")]
    pub read: ReadPath,
    /// Direct reads bypass the page cache (O_DIRECT), so that a dataset far larger than
    /// memory does not evict everything else on the host.
    #[arg(long)]
    pub uncached: bool,
}

impl ReadArgs {
    /// The gather options these arguments ask for.
    pub fn options(self, verify: bool) -> GatherOptions {
        GatherOptions {
            verify,
            read: self.read,
            uncached: self.uncached,
            ..GatherOptions::default()
        }
    }
}

/// The field to read: the one named, or the only one there is.
fn one_field(chosen: &Option<String>, names: Vec<&str>) -> Result<String, String> {
    match (chosen, names.as_slice()) {
        (Some(name), _) => Ok(name.clone()),
        (None, [only]) => Ok(only.to_string()),
        (None, names) => Err(format!(
            "the dataset has several fields ({}); choose one with --field",
            names.join(", ")
        )),
    }
}

pub fn gather(args: GatherArgs) -> CliResult {
    let dir = target_dir(&args.dir, &args.remote)?;
    let indices = match &args.indices_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            text.lines()
                .enumerate()
                .filter(|(_, line)| !line.trim().is_empty())
                .map(|(n, line)| {
                    line.trim().parse::<u64>().map_err(|_| {
                        format!(
                            "{} line {}: '{}' is not an index",
                            path.display(),
                            n + 1,
                            line.trim()
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        None => args.indices.clone(),
    };
    let mut lengths = Vec::with_capacity(indices.len());
    // Written beside --out and renamed onto it at the end: a failed gather leaves nothing.
    let partial = Partial::create(&args.out)?;
    let mut out = std::io::BufWriter::new(&partial.file);
    match dir {
        Some(dir) => {
            let store = Store::open_read_only(dir)?;
            let field = one_field(
                &args.field,
                store.fields().iter().map(|f| f.name.as_str()).collect(),
            )?;
            let batch =
                store.gather_with(&indices, &[&field], args.read.options(!args.no_verify))?;
            let column = batch.field(&field).ok_or("field missing from the batch")?;
            for payload in column.iter() {
                out.write_all(payload)?;
                lengths.push(payload.len().to_string());
            }
        }
        None => {
            let client = args
                .remote
                .client(Access::Read)?
                .ok_or("--router is missing")?;
            let field = one_field(
                &args.field,
                client.fields().iter().map(|f| f.name.as_str()).collect(),
            )?;
            let columns = if args.no_verify {
                client.gather(&indices, &[&field])?
            } else {
                client.gather_checked(&indices, &[&field])?
            };
            let column = columns.first().ok_or("the router sent no column")?;
            for k in 0..indices.len() {
                let payload = column.get(k).ok_or("the router sent a short column")?;
                out.write_all(payload)?;
                lengths.push(payload.len().to_string());
            }
        }
    }
    out.flush()?;
    drop(out);
    partial.finish()?;
    println!("{}", lengths.join(" "));
    Ok(())
}

/// A file written under a temporary name beside its destination, renamed onto it by
/// `finish`, removed if dropped before.
struct Partial {
    file: std::fs::File,
    path: PathBuf,
    to: PathBuf,
    done: bool,
}

impl Partial {
    fn create(to: &std::path::Path) -> Result<Partial, String> {
        let name = to
            .file_name()
            .ok_or_else(|| format!("{} is not a file name", to.display()))?;
        let mut temporary = name.to_os_string();
        temporary.push(format!(".partial-{}", std::process::id()));
        let path = to.with_file_name(temporary);
        let file = std::fs::File::create(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(Partial {
            file,
            path,
            to: to.to_path_buf(),
            done: false,
        })
    }

    fn finish(mut self) -> Result<(), String> {
        std::fs::rename(&self.path, &self.to)
            .map_err(|e| format!("cannot write {}: {e}", self.to.display()))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Check every record's CRC32 and every offset entry's bounds.
///
/// A dataset directory is checked, never repaired: each bad record is printed as `bad
/// field: record index: reason`, and the exit status is non-zero if there is any.
///
/// With --router, every record of the cluster is checked on every in-sync replica of its
/// shard (the copies compared too), throttled to --rate records a second, with progress;
/// a copy that fails its check or differs from its partners' is repaired from a good one
/// (the copy most intact replicas hold). Each problem is printed as it is found; the exit
/// status is non-zero if one could not be repaired (no intact copy, as with one replica).
#[derive(Args)]
pub struct VerifyArgs {
    /// Dataset directory.
    dir: Option<PathBuf>,
    #[command(flatten)]
    remote: RouterArgs,
    /// With --router: at most this many records a second (each checked on every replica);
    /// 0 for no limit.
    #[arg(long, default_value_t = 200_000, value_name = "RECORDS")]
    rate: u64,
}

pub fn verify(args: VerifyArgs) -> CliResult {
    let Some(dir) = target_dir(&args.dir, &args.remote)? else {
        return scrub_cluster(&args);
    };
    if zr_node::stream::is_stream(dir) {
        return stream_verify(dir);
    }
    let store = Store::open_read_only(dir)?;
    let report = verifying(store.len(), false, |shown| store.verify(shown))?;
    let ok = || {
        format!(
            "{} records, {} fields, {} of payload",
            report.records,
            store.fields().len(),
            human_bytes(report.bytes)
        )
    };
    verdict(&report.problems, ("record", "bad record(s)"), dir, ok)
}

/// Runs `verify` under a progress bar of `total` records (bytes if `bytes`), which it moves
/// on with the count done; the bar is cleared after.
fn verifying<T>(total: u64, bytes: bool, verify: impl FnOnce(&dyn Fn(u64)) -> T) -> T {
    let bar = progress_bar(total, bytes);
    bar.set_message("verifying");
    let report = verify(&|done| bar.set_position(done));
    bar.finish_and_clear();
    report
}

/// Prints each problem `zr verify` found (at an `entry`, e.g. "record"), then "ok: {ok}
/// verified" if there is none, or fails counting them as `what`.
fn verdict(
    problems: &[zr_node::Problem],
    (entry, what): (&str, &str),
    dir: &Path,
    ok: impl FnOnce() -> String,
) -> CliResult {
    for problem in problems {
        let (field, index, reason) = (&problem.field, problem.index, &problem.reason);
        println!("bad {field}: {entry} {index}: {reason}");
    }
    if problems.is_empty() {
        println!("ok: {} verified", ok());
        Ok(())
    } else {
        Err(format!("{} {what} in {}", problems.len(), dir.display()).into())
    }
}

/// Rewrite the live records into fresh chunks and switch to them atomically.
///
/// Modifies and deletes leave dead payloads behind; this reclaims them. It prints the
/// utilization (live bytes / bytes in chunks) before and after. It needs the dataset to
/// itself and free space for a second copy of the live records; a crash at any moment leaves
/// either the old or the new dataset, whole.
#[derive(Args)]
pub struct RebalanceArgs {
    /// Dataset directory.
    dir: PathBuf,
}

pub fn rebalance(args: RebalanceArgs) -> CliResult {
    let bar = progress_bar(0, false);
    bar.set_message("rebalancing");
    let report = rebalance::rebalance(&args.dir, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    println!(
        "utilization before {:.3} ({} live of {})",
        report.before.ratio(),
        human_bytes(report.before.live_bytes),
        human_bytes(report.before.allocated_bytes)
    );
    println!(
        "utilization after  {:.3} ({} live of {}); {} records rewritten",
        report.after.ratio(),
        human_bytes(report.after.live_bytes),
        human_bytes(report.after.allocated_bytes),
        report.records
    );
    Ok(())
}

/// Zstandard dictionaries: `zr dict train`.
#[derive(clap::Subcommand)]
pub enum DictCommand {
    Train(DictTrainArgs),
}

/// Train a zstd dictionary for a field on a sample of its records, and rewrite the dataset
/// with the field compressed with it.
///
/// Small records (captions, JSON lines, short token lists) give a compressor too little
/// context alone; a dictionary trained on the dataset gives it back. The dictionary is kept
/// in DIR/dict/FIELD.zdict and its id in meta.json, checked on every open. Like `zr
/// rebalance`, it runs by hand, needs the dataset to itself and room for a second copy, and
/// a crash at any moment leaves the old or the new dataset, whole.
#[derive(Args)]
pub struct DictTrainArgs {
    /// Dataset directory.
    dir: PathBuf,
    /// The field to compress with the dictionary (it becomes zstd if it is not).
    #[arg(long)]
    field: String,
    /// Most bytes of the dictionary.
    #[arg(long, default_value_t = zr_node::dict::DICT_BYTES_DEFAULT)]
    size: usize,
    /// zstd level (1-22; default: the field's, else 3).
    #[arg(long)]
    level: Option<i32>,
}

pub fn dict(command: DictCommand) -> CliResult {
    let DictCommand::Train(args) = command;
    train_dict(&args.dir, &args.field, args.size, args.level)
}

/// Trains field `field`'s dictionary of the dataset at `dir` and rewrites it (a progress
/// bar meanwhile); prints what it did.
pub fn train_dict(dir: &Path, field: &str, size: usize, level: Option<i32>) -> CliResult {
    if let Some(level) = level {
        zr_node::meta::parse_storage(&format!("zstd:{level}"))?;
    }
    let before: u64 = zr_node::meta::Meta::load(dir)?
        .chunks
        .iter()
        .map(|c| c.bytes)
        .sum();
    let bar = progress_bar(0, false);
    bar.set_message("training a dictionary and rewriting");
    let report = rebalance::train_dict(dir, field, size, level, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let after: u64 = zr_node::meta::Meta::load(dir)?
        .chunks
        .iter()
        .map(|c| c.bytes)
        .sum();
    println!(
        "field '{field}': dictionary {} ({}) trained on {} records; {} records rewritten, chunks {} -> {}",
        report.id,
        human_bytes(report.bytes as u64),
        report.samples,
        report.rewrite.records,
        human_bytes(before),
        human_bytes(after)
    );
    Ok(())
}

/// Records one scrub request covers.
const SCRUB_STEP: u64 = 4096;

/// `zr verify --router`: every shard scrubbed range by range (see [`VerifyArgs`]).
fn scrub_cluster(args: &VerifyArgs) -> CliResult {
    let client = args
        .remote
        .client(Access::Operate)?
        .ok_or("--router is missing: zr verify --router ADDR --certs DIR")?;
    let status = client.status()?;
    let shards = status.nodes.iter().map(|n| n.shard + 1).max().unwrap_or(0);
    let bar = progress_bar(client.len()?, false);
    bar.set_message("scrubbing");
    let started = std::time::Instant::now();
    let (mut records, mut found, mut left) = (0u64, 0u64, 0u64);
    let mut replicas = 0;
    for shard in 0..shards {
        let mut start = 0;
        loop {
            let report = client.scrub(shard, start, SCRUB_STEP)?;
            replicas = replicas.max(report.replicas);
            for problem in &report.problems {
                found += 1;
                left += u64::from(!problem.repaired);
                bar.println(format!(
                    "shard {shard} replica {} record {}: {}{}",
                    problem.replica,
                    problem.index,
                    problem.what,
                    if problem.repaired {
                        "; repaired"
                    } else {
                        "; NOT repaired"
                    }
                ));
            }
            records += report.records;
            bar.inc(report.records);
            start += report.records;
            if report.records == 0 || start >= report.shard_len {
                break;
            }
            if args.rate > 0 {
                // Throttled: each range takes at least its share of a second.
                let due = std::time::Duration::from_secs_f64(records as f64 / args.rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{records} records checked on {replicas} replica(s) each in {seconds:.1} s: {found} problem(s), {} repaired",
        found - left
    );
    if left > 0 {
        return Err(format!("{left} record copies could not be repaired (no intact copy)").into());
    }
    Ok(())
}

/// `zr info` of a token stream.
fn stream_info(dir: &std::path::Path) -> CliResult {
    let stream = zr_node::stream::Stream::open_read_only(dir)?;
    let meta = stream.meta();
    let element: Vec<String> = meta
        .element
        .iter()
        .map(|c| format!("{} {}", c.name, c.dtype))
        .collect();
    println!("token stream {}", dir.display());
    println!("format       {} v{}", meta.format, meta.version);
    println!(
        "element      {} ({} bytes)",
        element.join(", "),
        stream.element_bytes()
    );
    println!(
        "tokens       {} ({})",
        meta.tokens,
        human_bytes(meta.tokens * stream.element_bytes())
    );
    println!("documents    {}", meta.documents);
    println!("spans        {}", meta.spans);
    for seq_len in [2048u64, 4096, 8192] {
        let mode = zr_common::WindowMode::Windows {
            seq_len,
            stride: seq_len,
        };
        let windows = mode.count(meta.tokens, meta.documents);
        println!("windows      {windows} of {seq_len} + 1 tokens at stride {seq_len}");
    }
    Ok(())
}

/// `zr verify` of a token stream.
fn stream_verify(dir: &std::path::Path) -> CliResult {
    let stream = zr_node::stream::Stream::open_read_only(dir)?;
    let total = stream.len() * stream.element_bytes();
    let report = verifying(total, true, |shown| stream.verify(shown))?;
    let ok = || {
        format!(
            "{} tokens ({}), {} documents, {} spans",
            report.tokens,
            human_bytes(report.bytes),
            stream.documents(),
            stream.spans()
        )
    };
    verdict(
        &report.problems,
        ("entry", "problem(s) in the token stream"),
        dir,
        ok,
    )
}
