//! `zr explain`: what a run read at a step, computed from its description (`run.json`),
//! and the steps that read a record.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use zr_common::provenance::{Entry, Run, RunSpec};

/// Show what every rank of a run received in global batch N, or (--grep) the steps that
/// read a record.
///
/// The run's order is a pure function of its description — the sampler's or mixture's
/// configuration, its datasets and blocklist — which `zrecord.Loader.describe()` writes as
/// run.json; nothing is logged while the run trains. Each row names the rank, its place in
/// the rank's batch, the dataset and the record; a record a blocklist replaced is shown with
/// the one it replaced. A dataset of packed rows whose stream is at the path run.json gives
/// shows each row's documents and token ranges.
#[derive(Args)]
pub struct ExplainArgs {
    /// The run's description (run.json).
    #[arg(long)]
    run: PathBuf,
    /// The global batch to list.
    #[arg(long, required_unless_present = "grep")]
    step: Option<u64>,
    /// Only this rank's part.
    #[arg(long)]
    rank: Option<u64>,
    /// DATASET:RECORD (a dataset's name or index): the steps that read it, over --steps
    /// (default: the first epoch).
    #[arg(long, value_name = "DATASET:RECORD")]
    grep: Option<String>,
    /// FROM..TO: the global batches --grep looks through.
    #[arg(long, value_name = "FROM..TO")]
    steps: Option<String>,
    /// A file of records not to read, one DATASET:RECORD a line (added to run.json's own).
    #[arg(long)]
    blocklist: Option<PathBuf>,
    /// One JSON object a row.
    #[arg(long)]
    json: bool,
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

pub fn run(args: ExplainArgs) -> Result<()> {
    let text =
        std::fs::read_to_string(&args.run).map_err(|e| format!("{}: {e}", args.run.display()))?;
    let spec: RunSpec = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a run description: {e}", args.run.display()))?;
    let mut spec = spec.check()?;
    if let Some(file) = &args.blocklist {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let pair =
                record_of(&spec, line).map_err(|e| format!("{}:{}: {e}", file.display(), n + 1))?;
            spec.blocklist.push(pair);
        }
    }
    let run = spec.run()?;
    let ranks = match &run {
        Run::Sampler { ranks, .. } => ranks.len() as u64,
        Run::Mixture { ranks, .. } => ranks.len() as u64,
    };
    if let Some(rank) = args.rank.filter(|&r| r >= ranks) {
        return Err(format!("rank {rank}: the run has {ranks} ranks (0..{ranks})").into());
    }
    if let Some(wanted) = &args.grep {
        let (dataset, record) = record_of(&spec, wanted)?;
        let steps =
            match (&args.steps, run.steps_per_epoch()) {
                (Some(range), _) => parse_range(range)?,
                (None, Some(per_epoch)) => 0..per_epoch,
                (None, None) => return Err(
                    "a mixture has no epochs: give the steps to look through (--steps FROM..TO)"
                        .into(),
                ),
            };
        let started = std::time::Instant::now();
        let found = run.grep(dataset, record, steps.clone());
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "dataset": dataset, "record": record, "steps": found })
            );
        } else {
            println!(
                "{}:{record} is read at {} of global batches {}..{}: {:?} ({:.3} s)",
                name_of(&spec, dataset),
                found.len(),
                steps.start,
                steps.end,
                found,
                started.elapsed().as_secs_f64()
            );
        }
        return Ok(());
    }
    let step = args.step.ok_or("give --step N or --grep DATASET:RECORD")?;
    let manifest = run.manifest(step);
    let packed = packings(&spec)?;
    if !args.json {
        let epoch = run
            .steps_per_epoch()
            .map(|per| {
                format!(
                    " (epoch {}, its batch {})",
                    step / per.max(1),
                    step % per.max(1)
                )
            })
            .unwrap_or_default();
        println!(
            "global batch {step}{epoch}: {} positions over {ranks} ranks",
            manifest.len()
        );
    }
    for entry in manifest
        .iter()
        .filter(|e| args.rank.is_none_or(|r| e.rank == r))
    {
        let pieces = packed
            .get(entry.dataset as usize)
            .and_then(Option::as_ref)
            .and_then(|p| p.plan().row(entry.record))
            .map(|row| {
                row.iter()
                    .map(|p| (p.document, p.offset, p.offset + p.len))
                    .collect::<Vec<_>>()
            });
        print_entry(&spec, entry, pieces, args.json);
    }
    Ok(())
}

fn print_entry(spec: &RunSpec, e: &Entry, pieces: Option<Vec<(u64, u32, u32)>>, json: bool) {
    if json {
        let mut row = serde_json::json!({
            "rank": e.rank, "slot": e.slot, "dataset": name_of(spec, e.dataset),
            "record": e.record, "replaced": e.replaced,
        });
        if let Some(pieces) = &pieces {
            row["pieces"] = serde_json::json!(pieces
                .iter()
                .map(|(d, a, b)| serde_json::json!({"document": d, "tokens": [a, b]}))
                .collect::<Vec<_>>());
        }
        println!("{row}");
        return;
    }
    let mut line = format!(
        "rank {:<3} {:>5}  {} record {}",
        e.rank,
        e.slot,
        name_of(spec, e.dataset),
        e.record
    );
    if let Some(was) = e.replaced {
        line.push_str(&format!(" (in place of {was}, blocklisted)"));
    }
    if let Some(pieces) = pieces {
        let listed: Vec<String> = pieces
            .iter()
            .map(|(d, a, b)| format!("document {d} tokens {a}..{b}"))
            .collect();
        line.push_str(&format!(": {}", listed.join(", ")));
    }
    println!("{line}");
}

/// The packing of each dataset that has one, its stream opened from its path.
fn packings(spec: &RunSpec) -> Result<Vec<Option<zr_node::stream::Packed>>> {
    spec.datasets
        .iter()
        .map(|d| match (&d.packing, &d.path) {
            (Some(config), Some(path)) => {
                let stream = zr_node::stream::Stream::open_read_only(path)
                    .map_err(|e| format!("dataset '{}': {e}", d.name))?;
                Ok(Some(zr_node::stream::Packed::new(
                    Arc::new(stream),
                    *config,
                )?))
            }
            _ => Ok(None),
        })
        .collect()
}

fn name_of(spec: &RunSpec, dataset: u32) -> String {
    spec.datasets
        .get(dataset as usize)
        .map_or_else(|| dataset.to_string(), |d| d.name.clone())
}

/// `DATASET:RECORD`, the dataset by name or index.
fn record_of(spec: &RunSpec, text: &str) -> Result<(u32, u64)> {
    let (dataset, record) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("'{text}' is not DATASET:RECORD"))?;
    let record: u64 = record
        .parse()
        .map_err(|_| format!("'{record}' in '{text}' is not a record index"))?;
    let dataset = match spec.datasets.iter().position(|d| d.name == dataset) {
        Some(i) => i as u32,
        None => dataset.parse().map_err(|_| {
            format!(
                "the run has no dataset '{dataset}' (it has: {})",
                spec.datasets
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?,
    };
    Ok((dataset, record))
}

fn parse_range(text: &str) -> Result<std::ops::Range<u64>> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| format!("'{text}' is not FROM..TO"))?;
    let (a, b): (u64, u64) = (
        a.parse().map_err(|_| format!("'{a}' is not a step"))?,
        b.parse().map_err(|_| format!("'{b}' is not a step"))?,
    );
    if b < a {
        return Err(format!("{a}..{b} is empty").into());
    }
    Ok(a..b)
}
