//! `zr sample`: print the indices a rank will read, batch by batch, and checkpoint states.

use std::io::{BufWriter, Write};

use clap::{Args, ValueEnum};
use zr_common::{Order, Sampler, SamplerConfig, SamplerState, Tail};

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
#[derive(Args)]
pub struct SampleArgs {
    /// Number of records in the dataset.
    #[arg(long)]
    len: u64,
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
    /// Batches to print (default: to the end of the epoch); may run into later epochs.
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
        len: args.len,
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
            let json = match text.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read state file {path}: {e}"))?,
                None => text.clone(),
            };
            let state: SamplerState =
                serde_json::from_str(json.trim().trim_start_matches("state").trim())
                    .map_err(|e| format!("--resume: not a sampler state: {e}"))?;
            sampler.check_state(&state)?;
            state
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
