//! `zr`: the zrecord command line.

mod bench;
mod cluster;
mod convert;
mod dataset;
mod datasets;
mod explain;
mod grants;
mod sample;
mod sinks;
mod stream;

use std::process::ExitCode;
pub use zr_common::human_bytes;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(name = "zr", version, about = "zrecord: a record store for ML training data", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    ClusterInit(cluster::ClusterInitArgs),
    ClusterRenew(cluster::ClusterRenewArgs),
    /// A running cluster: `zr cluster status`.
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// A cluster's datasets: `zr dataset create|list|info|drop|add-field`.
    Dataset {
        #[command(subcommand)]
        command: datasets::DatasetCommand,
    },
    Convert(Box<convert::ConvertArgs>),
    Info(dataset::InfoArgs),
    Gather(dataset::GatherArgs),
    Verify(dataset::VerifyArgs),
    Rebalance(dataset::RebalanceArgs),
    /// Zstandard dictionaries of a dataset's fields: `zr dict train`.
    Dict {
        #[command(subcommand)]
        command: dataset::DictCommand,
    },
    Bench(bench::BenchArgs),
    Sample(sample::SampleArgs),
    Explain(explain::ExplainArgs),
    Grant(grants::GrantArgs),
    RevokeGrant(grants::RevokeGrantArgs),
    Grants(grants::GrantsArgs),
    /// Token streams: `zr stream pack-stats`.
    Stream {
        #[command(subcommand)]
        command: stream::StreamCommand,
    },
}

/// mimalloc for every Rust allocation of the CLI: a conversion through a tokenizer ran
/// 1.4× as fast as on glibc's malloc, with a lower peak (`zr convert --jsonl`, 2 cores).
/// The servers keep glibc's, tuned for their gathers (`zr_common::alloc`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    die_quietly_on_closed_pipes();
    zr_common::alloc::tune();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::ClusterInit(args) => cluster::init(args),
        Command::ClusterRenew(args) => cluster::renew(args),
        Command::Cluster { command } => cluster::run(command),
        Command::Grant(args) => grants::grant(args),
        Command::RevokeGrant(args) => grants::revoke_grant(args),
        Command::Grants(args) => grants::list(args),
        Command::Dataset { command } => datasets::run(command),
        Command::Convert(args) => convert::run(*args),
        Command::Info(args) => dataset::info(args),
        Command::Gather(args) => dataset::gather(args),
        Command::Verify(args) => dataset::verify(args),
        Command::Rebalance(args) => dataset::rebalance(args),
        Command::Dict { command } => dataset::dict(command),
        Command::Bench(args) => bench::run(args),
        Command::Sample(args) => sample::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Stream { command } => stream::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zr: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writing to a closed pipe (`zr info DIR | head -1`) ends the process quietly, as it ends any
/// Unix tool, instead of failing a `println!` with a panic: Rust ignores SIGPIPE by default.
fn die_quietly_on_closed_pipes() {
    // SAFETY: restores SIGPIPE's default disposition first thing in main, before any other
    // thread exists; it touches no memory of this program.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Errors of the command line: a message for the user.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// A progress bar on stderr (hidden when stderr is not a terminal) with rate and ETA.
pub fn progress_bar(total: u64, bytes: bool) -> ProgressBar {
    let template = if bytes {
        "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}"
    } else {
        "{msg} [{bar:30}] {human_pos}/{human_len} {per_sec} eta {eta}"
    };
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
