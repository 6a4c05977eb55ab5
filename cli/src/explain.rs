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
/// the one it replaced; over a mixture or a ramp, the dataset's epoch. A dataset of packed
/// rows or of windows whose stream is at the path run.json gives shows each row's documents
/// and the token ranges (within each document) it holds.
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
    /// Print the step's digest instead of its rows: per dataset, a hash of the CRC32 every
    /// field of every record of the step carries (each checked against its payload), or of
    /// a stream's rows. Kept, it lets --verify tell later whether the step still reads the
    /// same bytes; the datasets are opened from the paths run.json gives.
    #[arg(long, conflicts_with = "verify")]
    digest: bool,
    /// NAME=HEX,…: a digest --digest printed for this step; checks that every dataset still
    /// serves the bytes the step read, naming each that does not. Only the step's records
    /// are read.
    #[arg(long, value_name = "DIGEST")]
    verify: Option<String>,
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
    let ranks = run.ranks();
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
    // Over several datasets, each position's own dataset epoch is worth showing.
    let mixed = !matches!(run, Run::Sampler { .. });
    let manifest = run.manifest(step);
    let rows = row_readers(&spec)?;
    if args.digest || args.verify.is_some() {
        let digests = step_digests(&spec, &rows, &manifest)?;
        let printed: Vec<String> = digests
            .iter()
            .map(|(name, d)| format!("{name}={d:016x}"))
            .collect();
        let Some(wanted) = &args.verify else {
            if args.json {
                let map: serde_json::Map<String, serde_json::Value> = digests
                    .iter()
                    .map(|(name, d)| (name.clone(), format!("{d:016x}").into()))
                    .collect();
                println!("{}", serde_json::json!({ "step": step, "digest": map }));
            } else {
                println!("{}", printed.join(","));
            }
            return Ok(());
        };
        let mut differs = Vec::new();
        for part in wanted.split(',').filter(|p| !p.trim().is_empty()) {
            let (name, hex) = part
                .trim()
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not NAME=HEX (give what --digest printed)"))?;
            let then = u64::from_str_radix(hex, 16)
                .map_err(|_| format!("'{hex}' is not a hexadecimal digest (dataset '{name}')"))?;
            match digests.iter().find(|(n, _)| n == name) {
                None => {
                    return Err(format!(
                        "the digest names dataset '{name}', which step {step} does not read"
                    )
                    .into())
                }
                Some((_, now)) if *now != then => differs.push(name.to_string()),
                Some(_) => {}
            }
        }
        if !differs.is_empty() {
            return Err(format!(
                "step {step} no longer reads what it read: dataset{} {} changed since the digest was taken (now {})",
                if differs.len() > 1 { "s" } else { "" },
                differs.iter().map(|d| format!("'{d}'")).collect::<Vec<_>>().join(", "),
                printed.join(",")
            )
            .into());
        }
        println!(
            "step {step} reads what it read: {} positions over {} dataset{}",
            manifest.len(),
            digests.len(),
            if digests.len() > 1 { "s" } else { "" }
        );
        return Ok(());
    }
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
        let pieces = match rows.get(entry.dataset as usize) {
            Some(Rows::Packed(p)) => p.plan().row_read(entry.record).map(|row| {
                row.iter()
                    .map(|p| (p.document, p.offset as u64, (p.offset + p.len) as u64))
                    .collect::<Vec<_>>()
            }),
            Some(Rows::Windows(w)) => w.pieces(entry.record),
            _ => None,
        };
        print_entry(&spec, entry, pieces, mixed, args.json);
    }
    Ok(())
}

fn print_entry(
    spec: &RunSpec,
    e: &Entry,
    pieces: Option<Vec<(u64, u64, u64)>>,
    mixed: bool,
    json: bool,
) {
    if json {
        let mut row = serde_json::json!({
            "rank": e.rank, "slot": e.slot, "dataset": name_of(spec, e.dataset),
            "record": e.record, "replaced": e.replaced, "epoch": e.epoch,
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
    if mixed {
        line.push_str(&format!(" (its epoch {})", e.epoch));
    }
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

/// How a dataset's records map onto a token stream, where run.json says and its path opens.
enum Rows {
    Packed(zr_node::stream::Packed),
    Windows(zr_node::stream::Windows),
    Records,
}

/// Each dataset's rows: packed rows or windows of a stream opened from its path.
fn row_readers(spec: &RunSpec) -> Result<Vec<Rows>> {
    spec.datasets
        .iter()
        .map(|d| {
            let open = |path: &String| {
                zr_node::stream::Stream::open_read_only(path)
                    .map(Arc::new)
                    .map_err(|e| format!("dataset '{}': {e}", d.name))
            };
            Ok(match (&d.packing, &d.windows, &d.path) {
                (Some(config), _, Some(path)) => Rows::Packed(
                    zr_node::stream::Packed::new(open(path)?, *config)?
                        .block(&d.blocked_documents)?,
                ),
                (None, Some(mode), Some(path)) => {
                    Rows::Windows(zr_node::stream::Windows::new(open(path)?, *mode)?)
                }
                _ => Rows::Records,
            })
        })
        .collect()
}

/// Per dataset the step reads (by name, in the order of run.json): a hash over its
/// positions, in manifest order, of each record's field CRCs (checked against the payloads),
/// or a stream row's tokens' CRC.
fn step_digests(spec: &RunSpec, rows: &[Rows], manifest: &[Entry]) -> Result<Vec<(String, u64)>> {
    use std::collections::BTreeMap;
    use zr_common::hash::mix2;
    let mut stores: BTreeMap<usize, zr_node::Store> = BTreeMap::new();
    let mut digests: BTreeMap<u32, u64> = BTreeMap::new();
    let (mut packed, mut tokens) = (zr_node::stream::PackedColumns::default(), Vec::new());
    for entry in manifest {
        let d = entry.dataset as usize;
        let name = || name_of(spec, entry.dataset);
        let crcs: Vec<u32> = match rows.get(d) {
            Some(Rows::Packed(p)) => {
                p.gather_wanted(
                    &[entry.record],
                    &mut packed,
                    None,
                    zr_common::packing::Wanted::VARLEN,
                )
                .map_err(|e| format!("dataset '{}': {e}", name()))?;
                vec![crc32fast::hash(&packed.tokens)]
            }
            Some(Rows::Windows(w)) => {
                let bytes = w.width() * w.stream().element_bytes() as usize;
                tokens.resize(bytes, 0);
                w.gather_to(&[entry.record], &mut tokens, None, None, None)
                    .map_err(|e| format!("dataset '{}': {e}", name()))?;
                vec![crc32fast::hash(&tokens)]
            }
            _ => {
                let store = match stores.entry(d) {
                    std::collections::btree_map::Entry::Occupied(open) => open.into_mut(),
                    std::collections::btree_map::Entry::Vacant(slot) => {
                        let path = spec
                            .datasets
                            .get(d)
                            .and_then(|ds| ds.path.as_ref())
                            .ok_or_else(|| {
                                format!("dataset '{}' has no path in run.json: its records cannot be read", name())
                            })?;
                        let store = zr_node::Store::open_read_only(path)
                            .map_err(|e| format!("dataset '{}' ({path}): {e}", name()))?;
                        slot.insert(store)
                    }
                };
                store
                    .record_crcs(entry.record)
                    .map_err(|e| format!("dataset '{}': {e}", name()))?
            }
        };
        let h = digests
            .entry(entry.dataset)
            .or_insert(0x7a72_6469_6765_7374);
        *h = mix2(*h, entry.record);
        for crc in crcs {
            *h = mix2(*h, crc as u64);
        }
    }
    Ok(digests
        .into_iter()
        .map(|(d, h)| (name_of(spec, d), h))
        .collect())
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
