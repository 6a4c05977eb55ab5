//! Token-stream window benchmark: random windows of `--seq-len + 1` tokens in batches, from
//! a zrecord stream, next to slicing a memory map of the same `tokens.bin` (what NumPy's
//! memmap slicing does) — warm, and with `--cold` from a stream several times larger than
//! the memory the process may use, next to raw io_uring reads of the same windows.
//!
//! ```text
//! cargo run --release -p zr-node --example stream_bench -- [--tokens-mib 512] [--seq-len 2048] [--batch 32] [--seconds 4]
//! sudo cargo run --release -p zr-node --example stream_bench -- --cold [--memory-mib 256] [--factor 4]
//! ```
//! Warm, every method copies each window's `seq_len + 1` uint32 tokens into one buffer the
//! caller owns (`out=` in Python):
//! - memmap slicing: a copy from a mapping of the stream's own `tokens.bin` (the baseline);
//! - zrecord tokens: `Windows::gather_to` without documents;
//! - zrecord tokens + documents: the document index of each token too (a binary search per
//!   window, then runs), next to memmap slicing plus the same search over the document ends
//!   held in memory (NumPy's `searchsorted`).
//!
//! Rounds of each method alternate and each figure is the median of its rounds. Cold (needs
//! root: a memory cgroup, as `cold_bench`): each method starts with the stream's pages
//! dropped from the cache; raw io_uring reads each window's bytes with one read at a queue
//! depth of `--queue-depth`; zrecord reads the pages under each window (checking their CRCs).

mod bench_util;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use zr_node::stream::{Component, Stream, WindowMode, Windows};
use zr_node::{GatherOptions, ReadPath};

use bench_util::{evict, median, time_batches, uring_read, BoxResult, Cgroup, Rng, ROUNDS};

#[derive(Parser)]
#[command(
    about = "Random token windows from a zrecord stream, next to memmap slicing and raw io_uring"
)]
struct Args {
    /// Tokens in the warm stream, in MiB of uint32.
    #[arg(long, default_value_t = 512)]
    tokens_mib: u64,
    /// Window length W (each window holds W + 1 tokens).
    #[arg(long, default_value_t = 2048)]
    seq_len: u64,
    /// Windows per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Seconds per method (split into rounds).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Also the cold benchmark: needs root.
    #[arg(long)]
    cold: bool,
    /// Memory the cold measurement may use (its cgroup's limit), in MiB.
    #[arg(long, default_value_t = 256)]
    memory_mib: u64,
    /// The cold stream's size as a multiple of that memory.
    #[arg(long, default_value_t = 4.0)]
    factor: f64,
    /// Reads in flight of the raw io_uring baseline.
    #[arg(long, default_value_t = 128)]
    queue_depth: u32,
}

fn main() -> BoxResult<()> {
    let args = Args::parse();
    let scratch = tempfile::tempdir_in(".")?;
    warm(&args, &scratch.path().join("warm"))?;
    if args.cold {
        cold(&args, &scratch.path().join("cold"))?;
    }
    Ok(())
}

/// A stream of `tokens` random uint32 tokens in documents of 1 to 4,000 tokens; returns
/// the document ends.
fn build(dir: &Path, tokens: u64) -> BoxResult<(Arc<Stream>, Vec<u64>)> {
    let started = Instant::now();
    let stream = Stream::create(dir, vec![Component::new("token", "<u4")])?;
    let mut rng = Rng(42);
    let mut buffer = vec![0u8; 8 << 20];
    let mut ends = Vec::new();
    let mut done = 0;
    while done < tokens {
        let take = ((buffer.len() / 4) as u64).min(tokens - done);
        let bytes = &mut buffer[..take as usize * 4];
        rng.fill(bytes);
        stream.append_tokens(bytes)?;
        let mut at = done;
        ends.clear();
        loop {
            at += 1 + rng.next() % 4000;
            if at >= done + take {
                break;
            }
            ends.push(at);
        }
        stream.end_documents_at(&ends)?;
        done += take;
    }
    stream.end_document()?;
    stream.commit()?;
    drop(stream);
    let stream = Arc::new(Stream::open_read_only(dir)?);
    let ends: Vec<u64> = (0..stream.documents())
        .map(|d| stream.document(d).map(|r| r.1))
        .collect::<Result<_, _>>()?;
    println!(
        "stream: {} tokens ({:.2} GiB), {} documents, built in {:.1} s",
        stream.len(),
        (stream.len() * 4) as f64 / (1u64 << 30) as f64,
        stream.documents(),
        started.elapsed().as_secs_f64()
    );
    Ok((stream, ends))
}

/// The start of each window of a batch, the same for every method.
fn batch_starts(number: usize, batch: usize, windows: u64, stride: u64, out: &mut Vec<u64>) {
    let mut rng = Rng(Rng(number as u64 ^ 0x5EED).next());
    out.clear();
    out.extend((0..batch).map(|_| rng.next() % windows * stride));
}

/// The windows starting at `starts` (`seq_len` apart) gathered into `out` by zrecord.
fn gather_windows(
    windows: &Windows,
    starts: &[u64],
    seq_len: u64,
    indices: &mut Vec<u64>,
    out: &mut [u8],
) {
    indices.clear();
    indices.extend(starts.iter().map(|s| s / seq_len));
    windows
        .gather_to(indices, out, None, None, None)
        .expect("gather");
}

/// Windows of `--seq-len` at that stride over a new stream of `tokens` tokens, and its
/// document ends.
fn windows_of(args: &Args, dir: &Path, tokens: u64) -> BoxResult<(Windows, Vec<u64>)> {
    let (stream, ends) = build(dir, tokens)?;
    let mode = WindowMode::Windows {
        seq_len: args.seq_len,
        stride: args.seq_len,
    };
    Ok((Windows::new(stream, mode)?, ends))
}

fn warm(args: &Args, dir: &Path) -> BoxResult<()> {
    let (windows, ends) = windows_of(args, dir, (args.tokens_mib << 20) / 4)?;
    let (width, n) = (windows.width(), windows.len());
    let file = std::fs::File::open(dir.join("tokens.bin"))?;
    // SAFETY: a read-only mapping of a file nothing writes to during the benchmark.
    let map = unsafe { memmap2::Mmap::map(&file) }?;
    let mut out = vec![0u8; args.batch * width * 4];
    let mut documents = vec![0i64; args.batch * width];
    let mut starts = Vec::new();
    let mut indices = Vec::new();
    // Touch everything once: warm means in the page cache.
    std::hint::black_box(map.iter().step_by(4096).fold(0u8, |a, &b| a ^ b));

    let slice_into = |starts: &[u64], out: &mut [u8]| {
        for (row, &s) in starts.iter().enumerate() {
            let from = s as usize * 4;
            out[row * width * 4..(row + 1) * width * 4]
                .copy_from_slice(&map[from..from + width * 4]);
        }
    };
    let search_documents = |starts: &[u64], documents: &mut [i64]| {
        for (row, &s) in starts.iter().enumerate() {
            let row = &mut documents[row * width..(row + 1) * width];
            let mut d = ends.partition_point(|&e| e <= s);
            let mut pos = s;
            let end = s + width as u64;
            while pos < end {
                let stop = ends[d].min(end);
                row[(pos - s) as usize..(stop - s) as usize].fill(d as i64);
                pos = stop;
                d += 1;
            }
        }
    };
    let round = args.seconds / ROUNDS as f64;
    let mut rates: [Vec<f64>; 4] = Default::default();
    for _ in 0..ROUNDS {
        rates[0].push(time_batches(round, |b| {
            batch_starts(b, args.batch, n, args.seq_len, &mut starts);
            slice_into(&starts, &mut out);
            std::hint::black_box(&out);
        }));
        rates[1].push(time_batches(round, |b| {
            batch_starts(b, args.batch, n, args.seq_len, &mut starts);
            gather_windows(&windows, &starts, args.seq_len, &mut indices, &mut out);
            std::hint::black_box(&out);
        }));
        rates[2].push(time_batches(round, |b| {
            batch_starts(b, args.batch, n, args.seq_len, &mut starts);
            slice_into(&starts, &mut out);
            search_documents(&starts, &mut documents);
            std::hint::black_box((&out, &documents));
        }));
        rates[3].push(time_batches(round, |b| {
            batch_starts(b, args.batch, n, args.seq_len, &mut starts);
            indices.clear();
            indices.extend(starts.iter().map(|s| s / args.seq_len));
            windows
                .gather_to(&indices, &mut out, Some(&mut documents), None, None)
                .expect("gather");
            std::hint::black_box((&out, &documents));
        }));
    }
    let [slice, tokens, slice_docs, tokens_docs] = rates.map(median);
    let per_s = |batches: f64| batches * args.batch as f64;
    let gib = |batches: f64| batches * (args.batch * width * 4) as f64 / (1u64 << 30) as f64;
    println!(
        "\nwarm: random windows of {width} uint32 tokens, batches of {}, median of {ROUNDS} rounds",
        args.batch
    );
    println!(
        "  {:<44} {:>12} {:>9} {:>8}",
        "method", "windows/s", "GiB/s", "ratio"
    );
    for (name, rate, base) in [
        ("memmap slicing (baseline)", slice, slice),
        ("zrecord windows, tokens", tokens, slice),
        (
            "memmap slicing + searchsorted documents",
            slice_docs,
            slice_docs,
        ),
        (
            "zrecord windows, tokens + documents",
            tokens_docs,
            slice_docs,
        ),
    ] {
        println!(
            "  {:<44} {:>12.0} {:>9.2} {:>7.2}x",
            name,
            per_s(rate),
            gib(rate),
            rate / base
        );
    }
    Ok(())
}

fn cold(args: &Args, dir: &Path) -> BoxResult<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("--cold needs root: it makes a memory cgroup to hold the page cache".into());
    }
    let limit = args.memory_mib << 20;
    let tokens = (limit as f64 * args.factor / 4.0) as u64;
    let (windows, _) = windows_of(args, dir, tokens)?;
    let (width, n) = (windows.width(), windows.len());
    let file = std::fs::File::open(dir.join("tokens.bin"))?;
    let files: Vec<_> = ["tokens.bin", "tokens.crc", "documents.bin"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    let cgroup = Cgroup::create(limit)?;
    println!(
        "\ncold: memory limit {} MiB ({}), stream {:.1}x that, batches of {}, each method from a dropped cache",
        args.memory_mib,
        cgroup.kind,
        args.factor,
        args.batch
    );
    println!("  {:<44} {:>12} {:>8}", "method", "windows/s", "ratio");
    let mut out = vec![0u8; args.batch * width * 4];
    let mut starts = Vec::new();
    let mut indices = Vec::new();
    let mut baseline = None;
    let methods: [(&str, Option<GatherOptions>); 4] = [
        ("raw io_uring, one read per window (baseline)", None),
        (
            "zrecord direct (pages, CRC-checked)",
            Some(GatherOptions {
                read: ReadPath::Direct,
                ..GatherOptions::default()
            }),
        ),
        (
            "zrecord direct, O_DIRECT",
            Some(GatherOptions {
                read: ReadPath::Direct,
                uncached: true,
                ..GatherOptions::default()
            }),
        ),
        ("zrecord auto", Some(GatherOptions::default())),
    ];
    for (name, options) in methods {
        evict(&files)?;
        let windows = windows.clone().with_options(options.unwrap_or_default());
        let rate = time_batches(args.seconds, |b| {
            batch_starts(b, args.batch, n, args.seq_len, &mut starts);
            match options {
                None => {
                    let reads: Vec<_> = starts
                        .iter()
                        .map(|&s| (file.as_raw_fd(), s * 4, width * 4))
                        .collect();
                    uring_read(&reads, args.queue_depth).expect("read");
                }
                Some(_) => gather_windows(&windows, &starts, args.seq_len, &mut indices, &mut out),
            }
            std::hint::black_box(&out);
        });
        let base = *baseline.get_or_insert(rate);
        println!(
            "  {:<44} {:>12.0} {:>7.2}x",
            name,
            rate * args.batch as f64,
            rate / base
        );
    }
    drop(cgroup);
    Ok(())
}
