//! `zr stream`: what a token stream comes to when its documents are packed into rows.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use zr_node::stream::{PackConfig, PackPlan, Packer, Stream};

/// Token streams: `zr stream pack-stats`.
#[derive(clap::Subcommand)]
pub enum StreamCommand {
    PackStats(PackStatsArgs),
}

/// Show what packing a stream's documents whole into rows of W + 1 tokens comes to: rows,
/// padding, documents cut for being longer than a row.
///
/// Documents are taken in the order --seed shuffles them into; a document longer than a row
/// is cut into full rows and its remainder packed like any document. best_fit places
/// --lookahead documents at a time, longest first, each into the row with the least room
/// that holds it; first_fit places them in order, each into the first row that holds it.
/// Training reads the same rows (`zrecord.open_stream(DIR).packed(seq_len=W)`), so these
/// are its figures.
#[derive(Args)]
pub struct PackStatsArgs {
    /// Stream directory.
    dir: PathBuf,
    /// W: each row holds W + 1 tokens (the inputs and, shifted by one, the labels).
    #[arg(long)]
    seq_len: u64,
    /// best_fit or first_fit.
    #[arg(long, default_value = "best_fit")]
    packer: Packer,
    /// Documents placed at a time.
    #[arg(long, default_value_t = zr_common::packing::LOOKAHEAD_DEFAULT)]
    lookahead: usize,
    /// The key of the documents' shuffled order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(command: StreamCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        StreamCommand::PackStats(args) => pack_stats(args),
    }
}

fn pack_stats(args: PackStatsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let stream = Arc::new(Stream::open_read_only(&args.dir)?);
    let lengths = zr_node::stream::document_lengths(&stream);
    let config = PackConfig {
        seq_len: args.seq_len,
        packer: args.packer,
        lookahead: args.lookahead,
        seed: args.seed,
    };
    let started = std::time::Instant::now();
    let plan = PackPlan::build(&lengths, config)?;
    let stats = plan.stats();
    let width = config.width();
    println!("stream       {}", args.dir.display());
    println!(
        "documents    {} ({} empty, left out)",
        lengths.len(),
        lengths.len() as u64 - stats.documents
    );
    println!("tokens       {}", stats.tokens);
    println!(
        "packing      {} of rows of {width} tokens, lookahead {}, seed {}",
        args.packer.name(),
        args.lookahead,
        args.seed
    );
    println!("rows         {}", stats.rows);
    println!(
        "padding      {:.3}% ({} tokens)",
        100.0 * stats.padding_fraction(width),
        stats.rows * width - stats.tokens
    );
    println!(
        "split        {} documents longer than a row; {} pieces in all",
        stats.split, stats.pieces
    );
    println!("planned in   {:.2} s", started.elapsed().as_secs_f64());
    Ok(())
}
