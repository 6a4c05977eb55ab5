//! `zr sample`: print the indices a rank will read, batch by batch, and checkpoint states.

use std::io::{BufWriter, Write};

use clap::{Args, ValueEnum};
use zr_common::{
    Mixture, MixtureConfig, MixtureState, Order, Sampler, SamplerConfig, SamplerState, Stage, Tail,
};

use crate::CliResult;

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    /// 0, 1, 2, …
    Sequential,
    /// Windows of --window consecutive indices, starts advancing by --stride, wrapping round.
    Sliding,
    /// Uniform random with replacement.
    Random,
    /// A seeded permutation per epoch (random without replacement).
    Shuffle,
}

/// Print the indices a rank reads, one batch per line (space-separated).
///
/// Every index is a pure function of (seed, epoch, position), so this shows exactly what a
/// training job with the same settings reads. With --state, a last line `state {json}` gives
/// the checkpoint after the printed batches; --resume continues from such a state.
///
/// With --mixture, the batches of a mixture of datasets instead (this rank's part of each
/// global batch of --batch × --ranks), as `dataset:record` pairs: e.g. `zr sample --mixture
/// 1000000:0.7,200000:0.2,50000:0.1 --batch 8 --ranks 4 --count 3 --state`.
#[derive(Args)]
pub struct SampleArgs {
    /// Number of records in the dataset.
    #[arg(long, required_unless_present = "mixture")]
    len: Option<u64>,
    /// A mixture instead of one dataset: each dataset's records and weight, LEN:WEIGHT,…
    #[arg(long, value_name = "LEN:WEIGHT,...", conflicts_with_all = ["len", "kind", "pad", "epoch", "from"])]
    mixture: Option<String>,
    /// A stage of the mixture: from global batch BATCH on, these weights (repeatable).
    #[arg(long = "stage", value_name = "BATCH:W,W,...", requires = "mixture")]
    stages: Vec<String>,
    /// Visiting order.
    #[arg(long, value_enum, default_value = "sequential")]
    kind: Kind,
    /// Window size for --kind sliding.
    #[arg(long, default_value_t = 1)]
    window: u64,
    /// Window stride for --kind sliding (default: the window size).
    #[arg(long)]
    stride: Option<u64>,
    /// Seed of the random orders.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Epoch to start in.
    #[arg(long, default_value_t = 0, conflicts_with = "resume")]
    epoch: u64,
    /// This rank.
    #[arg(long, default_value_t = 0)]
    rank: u64,
    /// Number of ranks sharing each epoch.
    #[arg(long, default_value_t = 1)]
    ranks: u64,
    /// Indices per batch (default: the window for --kind sliding, else 1).
    #[arg(long)]
    batch: Option<u64>,
    /// Pad the uneven tail (every rank gets ⌈units/ranks⌉, wrapping round) instead of dropping it.
    #[arg(long)]
    pad: bool,
    /// Position in this rank's epoch to start from.
    #[arg(long, default_value_t = 0, conflicts_with = "resume")]
    from: u64,
    /// Batches to print (default: to the end of the epoch; 10 with --mixture); may run into later epochs.
    #[arg(long)]
    count: Option<u64>,
    /// After the batches, print `state {json}`: the checkpoint to resume from.
    #[arg(long)]
    state: bool,
    /// Continue from a checkpoint printed by --state (the JSON text, or @FILE holding it).
    #[arg(long, value_name = "STATE")]
    resume: Option<String>,
}

pub fn run(args: SampleArgs) -> CliResult {
    if let Some(mixture) = &args.mixture {
        return run_mixture(&args, mixture);
    }
    let len = args.len.ok_or("--len is needed (or --mixture)")?;
    let order = match args.kind {
        Kind::Sequential => Order::Sequential,
        Kind::Random => Order::Random,
        Kind::Shuffle => Order::Shuffle,
        Kind::Sliding => Order::Sliding {
            window: args.window,
            stride: args.stride.unwrap_or(args.window),
        },
    };
    let sampler = Sampler::new(SamplerConfig {
        len,
        order,
        seed: args.seed,
        rank: args.rank,
        ranks: args.ranks,
        batch: args.batch.unwrap_or(if matches!(args.kind, Kind::Sliding) {
            args.window
        } else {
            1
        }),
        tail: if args.pad { Tail::Pad } else { Tail::Drop },
    })?;
    let start = match &args.resume {
        Some(text) => {
            let state: SamplerState = serde_json::from_str(&resumed(text)?)
                .map_err(|e| format!("--resume: not a sampler state: {e}"))?;
            sampler.adopt(&state)?
        }
        None => {
            if args.from > sampler.items_per_epoch() {
                return Err(format!(
                    "--from {} is past the end of the rank's epoch ({} indices)",
                    args.from,
                    sampler.items_per_epoch()
                )
                .into());
            }
            sampler.state_at(args.epoch, args.from)
        }
    };
    let (mut epoch, mut position) = (start.epoch, start.position);
    let items = sampler.items_per_epoch();
    let batch = sampler.config().batch;
    let count = args
        .count
        .unwrap_or_else(|| (items - position).div_ceil(batch));

    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut indices = Vec::with_capacity(batch as usize);
    let mut line = String::new();
    for _ in 0..count {
        let end = (position + batch).min(items);
        indices.clear();
        sampler.epoch(epoch).fill(position, end, &mut indices);
        line.clear();
        for (k, index) in indices.iter().enumerate() {
            if k > 0 {
                line.push(' ');
            }
            line.push_str(&index.to_string());
        }
        writeln!(out, "{line}")?;
        let next = sampler.state_at(epoch, end);
        (epoch, position) = (next.epoch, next.position);
    }
    if args.state {
        writeln!(
            out,
            "state {}",
            serde_json::to_string(&sampler.state_at(epoch, position))?
        )?;
    }
    out.flush()?;
    Ok(())
}

/// The JSON of a `--resume` argument: the text, or the file `@PATH` holds; a leading
/// `state` (as --state prints it) is allowed.
fn resumed(text: &str) -> Result<String, String> {
    let json = match text.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read state file {path}: {e}"))?,
        None => text.to_string(),
    };
    Ok(json.trim().trim_start_matches("state").trim().to_string())
}

/// Weights `W,W,…` as numbers, or why not.
fn weights(text: &str, what: &str) -> Result<Vec<f64>, String> {
    text.split(',')
        .map(|w| {
            w.trim()
                .parse::<f64>()
                .map_err(|_| format!("{what}: weight '{w}' is not a number"))
        })
        .collect()
}

/// `zr sample --mixture`: this rank's part of global batches, as `dataset:record` pairs.
fn run_mixture(args: &SampleArgs, mixture: &str) -> CliResult {
    let mut lengths = Vec::new();
    let mut first = Vec::new();
    for part in mixture.split(',') {
        let (len, weight) = part
            .split_once(':')
            .ok_or_else(|| format!("--mixture: '{part}' is not LEN:WEIGHT (e.g. 1000000:0.7)"))?;
        lengths.push(
            len.trim()
                .parse::<u64>()
                .map_err(|_| format!("--mixture: length '{len}' is not a whole number"))?,
        );
        first.extend(weights(weight, "--mixture")?);
    }
    let mut stages = vec![Stage::new(0, first)];
    for stage in &args.stages {
        let (start, ws) = stage.split_once(':').ok_or_else(|| {
            format!("--stage: '{stage}' is not BATCH:W,W,... (e.g. 1000:0.5,0.5)")
        })?;
        stages.push(Stage {
            start: start
                .trim()
                .parse()
                .map_err(|_| format!("--stage: batch '{start}' is not a whole number"))?,
            weights: weights(ws, "--stage")?,
        });
    }
    let mixture = Mixture::new(MixtureConfig {
        lengths,
        stages,
        seed: args.seed,
        rank: args.rank,
        ranks: args.ranks,
        batch: args.batch.unwrap_or(1),
    })?;
    let start = match &args.resume {
        Some(text) => {
            let state: MixtureState = serde_json::from_str(&resumed(text)?)
                .map_err(|e| format!("--resume: not a mixture state: {e}"))?;
            mixture.check_state(&state)?;
            state.batches
        }
        None => 0,
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let (mut sources, mut records) = (Vec::new(), Vec::new());
    let mut line = String::new();
    let count = args.count.unwrap_or(10);
    for batch in start..start + count {
        sources.clear();
        records.clear();
        mixture.fill(batch, &mut sources, &mut records);
        line.clear();
        for (k, (s, r)) in sources.iter().zip(&records).enumerate() {
            if k > 0 {
                line.push(' ');
            }
            line.push_str(&format!("{s}:{r}"));
        }
        writeln!(out, "{line}")?;
    }
    if args.state {
        writeln!(
            out,
            "state {}",
            serde_json::to_string(&mixture.state_at(start + count))?
        )?;
    }
    out.flush()?;
    Ok(())
}
