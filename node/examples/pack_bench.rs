//! Packed rows from a warm local stream, next to fixed windows of the same length in the
//! same run; the padding best-fit and first-fit leave; and the time to build a packing plan
//! for ten million documents.
//!
//! ```text
//! cargo run --release -p zr-node --example pack_bench -- [--corpus DIR] [--tokens-mib 256] [--seq-len 2048] [--batch 32]
//! ```
//! Document lengths are real ones: each text file under `--corpus` is a document of
//! `bytes / 4` tokens (about what a BPE tokenizer makes of English and code). By default the
//! corpus is the Rust crate sources cargo keeps on this machine (`~/.cargo/registry/src`,
//! `.rs` and `.md` files), or `/usr/share/doc` where there are none. The stream holds
//! documents of lengths drawn from those (random tokens); the ten million documents of the
//! plan's timing are drawn the same way.
//!
//! Both methods copy `batch` random rows of `seq_len + 1` uint32 tokens into one buffer;
//! packed rows also give the batch its `cu_seqlens` (what flash-attention's variable-length
//! kernels take) and, in the rows that ask, every token its position and loss mask
//! (Megatron's), or also its document and segment (every column). Rounds alternate; each figure is the median of its rounds.

mod bench_util;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use zr_node::stream::{
    Component, PackConfig, PackPlan, Packed, PackedColumns, Packer, Stream, Wanted, WindowMode,
    Windows,
};

use bench_util::{median, time_batches, BoxResult, Rng, ROUNDS};

#[derive(Parser)]
#[command(about = "Packed rows vs fixed windows from a warm stream; padding; plan build time")]
struct Args {
    /// Where the document lengths come from (every .rs, .md, .txt or .py file a document).
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Tokens in the stream, in MiB of uint32.
    #[arg(long, default_value_t = 256)]
    tokens_mib: u64,
    /// Row length W (each row holds W + 1 tokens).
    #[arg(long, default_value_t = 2048)]
    seq_len: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Documents placed at a time.
    #[arg(long, default_value_t = zr_common::packing::LOOKAHEAD_DEFAULT)]
    lookahead: usize,
    /// Seconds per method (split into rounds).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Documents of the plan whose build is timed.
    #[arg(long, default_value_t = 10_000_000)]
    plan_documents: u64,
}

fn main() -> BoxResult<()> {
    let args = Args::parse();
    let corpus = match &args.corpus {
        Some(dir) => dir.clone(),
        None => default_corpus(),
    };
    let mut real = Vec::new();
    collect_lengths(&corpus, &mut real)?;
    if real.is_empty() {
        return Err(format!("no text files under {}", corpus.display()).into());
    }
    real.sort_unstable();
    let mean = real.iter().sum::<u64>() as f64 / real.len() as f64;
    println!(
        "document lengths: {} files under {} (tokens = bytes / 4): mean {mean:.0}, median {}, p90 {}, p99 {}, longest {}",
        real.len(),
        corpus.display(),
        real[real.len() / 2],
        real[real.len() * 9 / 10],
        real[real.len() * 99 / 100],
        real[real.len() - 1]
    );
    let scratch = tempfile::tempdir_in(".")?;
    let (stream, lengths) = build(&scratch.path().join("s"), &real, args.tokens_mib << 18)?;
    compare(&args, &stream)?;
    padding(&args, &lengths)?;
    plan_time(&args, &real)?;
    Ok(())
}

fn default_corpus() -> PathBuf {
    let cargo = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|c| c.join("registry/src"));
    match cargo {
        Some(dir) if dir.is_dir() => dir,
        _ => PathBuf::from("/usr/share/doc"),
    }
}

/// The token length (`bytes / 4`, at least 1) of every text file under `dir`.
fn collect_lengths(dir: &Path, out: &mut Vec<u64>) -> BoxResult<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_dir() {
            collect_lengths(&path, out)?;
        } else if kind.is_file()
            && path
                .extension()
                .is_some_and(|e| ["rs", "md", "txt", "py"].iter().any(|t| e == *t))
        {
            let bytes = entry.metadata()?.len();
            out.push((bytes / 4).max(1));
        }
    }
    Ok(())
}

/// A stream of about `tokens` random uint32 tokens in documents whose lengths are drawn
/// from `real`; returns it and the lengths.
fn build(dir: &Path, real: &[u64], tokens: u64) -> BoxResult<(Arc<Stream>, Vec<u64>)> {
    let started = Instant::now();
    let stream = Stream::create(dir, vec![Component::new("token", "<u4")])?;
    let mut rng = Rng(7);
    let mut lengths = Vec::new();
    let mut buffer = Vec::new();
    let mut done = 0;
    while done < tokens {
        let len = real[(rng.next() % real.len() as u64) as usize];
        buffer.resize(len as usize * 4, 0);
        rng.fill(&mut buffer);
        stream.append_document(&buffer, &[])?;
        lengths.push(len);
        done += len;
    }
    stream.commit()?;
    drop(stream);
    let stream = Arc::new(Stream::open_read_only(dir)?);
    println!(
        "stream: {} tokens ({:.2} GiB), {} documents, built in {:.1} s",
        stream.len(),
        (stream.len() * 4) as f64 / (1u64 << 30) as f64,
        stream.documents(),
        started.elapsed().as_secs_f64()
    );
    Ok((stream, lengths))
}

/// Random rows of a batch, the same for both methods.
fn rows(number: usize, batch: usize, n: u64, out: &mut Vec<u64>) {
    let mut rng = Rng(Rng(number as u64 ^ 0x5EED).next());
    out.clear();
    out.extend((0..batch).map(|_| rng.next() % n));
}

fn compare(args: &Args, stream: &Arc<Stream>) -> BoxResult<()> {
    let windows = Windows::new(
        Arc::clone(stream),
        WindowMode::Windows {
            seq_len: args.seq_len,
            stride: args.seq_len,
        },
    )?;
    let config = PackConfig {
        lookahead: args.lookahead,
        ..PackConfig::new(args.seq_len, 1)
    };
    let packed = Packed::new(Arc::clone(stream), config)?;
    let width = windows.width();
    let mut tokens = vec![0u8; args.batch * width * 4];
    let mut document = vec![0i64; args.batch * width];
    let mut out = PackedColumns::default();
    let mut indices = Vec::new();
    // What a Megatron-style step takes beside cu_seqlens: positions and the loss mask.
    let masked = Wanted {
        document: false,
        segment_ids: false,
        positions: true,
        loss_mask: true,
    };
    let mut figures = [(); 5].map(|_| Vec::new());
    let seconds = args.seconds / ROUNDS as f64;
    for _ in 0..ROUNDS {
        figures[0].push(time_batches(seconds, |b| {
            rows(b, args.batch, windows.len(), &mut indices);
            windows
                .gather_to(&indices, &mut tokens, None, None, None)
                .expect("windows");
        }));
        figures[1].push(time_batches(seconds, |b| {
            rows(b, args.batch, windows.len(), &mut indices);
            windows
                .gather_to(&indices, &mut tokens, Some(&mut document), None, None)
                .expect("windows");
        }));
        figures[2].push(time_batches(seconds, |b| {
            rows(b, args.batch, packed.len(), &mut indices);
            packed
                .gather_wanted(&indices, &mut out, None, Wanted::VARLEN)
                .expect("packed");
        }));
        figures[3].push(time_batches(seconds, |b| {
            rows(b, args.batch, packed.len(), &mut indices);
            packed
                .gather_wanted(&indices, &mut out, None, masked)
                .expect("packed");
        }));
        figures[4].push(time_batches(seconds, |b| {
            rows(b, args.batch, packed.len(), &mut indices);
            packed.gather(&indices, &mut out, None).expect("packed");
        }));
    }
    let [tokens_only, with_documents, packed_varlen, packed_masked, packed_all] =
        figures.map(median);
    println!(
        "W = {}, batches of {} random rows, batches/s:",
        args.seq_len, args.batch
    );
    println!("  fixed windows, tokens                                {tokens_only:>9.0}");
    println!("  fixed windows, tokens + document                     {with_documents:>9.0}");
    println!(
        "  packed rows, tokens + cu_seqlens                     {packed_varlen:>9.0}  ({:.2}x windows' tokens)",
        packed_varlen / tokens_only,
    );
    println!(
        "  packed rows, tokens + positions + loss_mask + cu_seqlens {packed_masked:>9.0}  ({:.2}x windows' tokens, {:.2}x with documents)",
        packed_masked / tokens_only,
        packed_masked / with_documents
    );
    println!(
        "  packed rows, every column                            {packed_all:>9.0}  ({:.2}x windows' tokens, {:.2}x with documents)",
        packed_all / tokens_only,
        packed_all / with_documents
    );
    Ok(())
}

fn padding(args: &Args, lengths: &[u64]) -> BoxResult<()> {
    let width = args.seq_len + 1;
    let mut line = format!(
        "padding of the stream's {} documents, W = {}:",
        lengths.len(),
        args.seq_len
    );
    for (packer, lookahead) in [
        (Packer::BestFit, args.lookahead),
        (Packer::FirstFit, args.lookahead),
        (Packer::BestFit, 64),
        (Packer::FirstFit, 64),
    ] {
        let config = PackConfig {
            packer,
            lookahead,
            ..PackConfig::new(args.seq_len, 1)
        };
        let stats = PackPlan::build(lengths, config)?.stats();
        line.push_str(&format!(
            "  {} (lookahead {lookahead}) {:.2}%",
            packer.name(),
            100.0 * stats.padding_fraction(width)
        ));
    }
    println!("{line}");
    Ok(())
}

fn plan_time(args: &Args, real: &[u64]) -> BoxResult<()> {
    let mut rng = Rng(11);
    let lengths: Vec<u64> = (0..args.plan_documents)
        .map(|_| real[(rng.next() % real.len() as u64) as usize])
        .collect();
    for packer in [Packer::BestFit, Packer::FirstFit] {
        let config = PackConfig {
            packer,
            lookahead: args.lookahead,
            ..PackConfig::new(args.seq_len, 1)
        };
        let started = Instant::now();
        let plan = PackPlan::build(&lengths, config)?;
        println!(
            "plan of {} documents ({} tokens) by {}: {:.2} s, {} rows, {:.2}% padding",
            args.plan_documents,
            plan.stats().tokens,
            packer.name(),
            started.elapsed().as_secs_f64(),
            plan.rows(),
            100.0 * plan.stats().padding_fraction(args.seq_len + 1)
        );
    }
    Ok(())
}
