//! `zr`: the zrecord command line.

mod sample;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "zr",
    version,
    about = "zrecord: a record store for ML training data"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Sample(sample::SampleArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sample(args) => sample::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zr: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Errors of the command line: a message for the user.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;
