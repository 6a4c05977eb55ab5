//! `zr convert`: build a dataset from NumPy files.

use std::path::PathBuf;

use clap::Args;
use zr_node::convert::{convert_npy, convert_values, Target};
use zr_node::Compression;

use crate::{progress_bar, CliResult};

/// Build a dataset from a NumPy .npy (one record per row) or from values.bin + offsets.npy.
///
/// With --npy every row becomes one record; the dtype and row shape are recorded in
/// meta.json. With --values and --offsets, record i is values[offsets[i]..offsets[i+1]]
/// (offsets.npy: N+1 little-endian u64). The target must not exist or be empty, unless
/// --append adds the records to an existing dataset. The dataset is committed once, at the
/// end: if the conversion fails, it is left as it was.
#[derive(Args)]
pub struct ConvertArgs {
    /// Dataset directory to create (or extend, with --append).
    dir: PathBuf,
    /// A .npy array: one record per row (C order, any fixed-size dtype).
    #[arg(long, conflicts_with_all = ["values", "offsets"], required_unless_present = "values")]
    npy: Option<PathBuf>,
    /// Payloads back to back, for variable-length records.
    #[arg(long, requires = "offsets")]
    values: Option<PathBuf>,
    /// N+1 byte offsets into --values (.npy of <u8).
    #[arg(long, requires = "values")]
    offsets: Option<PathBuf>,
    /// Field to fill.
    #[arg(long, default_value = "data")]
    field: String,
    /// Storage of the field.
    #[arg(long, default_value = "raw", value_parser = parse_compression)]
    compress: Compression,
    /// Add to an existing dataset instead of creating a new one.
    #[arg(long)]
    append: bool,
}

fn parse_compression(s: &str) -> Result<Compression, String> {
    s.parse()
}

pub fn run(args: ConvertArgs) -> CliResult {
    let target = Target {
        dir: &args.dir,
        field: &args.field,
        compress: args.compress,
        append: args.append,
    };
    let (input_bytes, source) = match (&args.npy, &args.values) {
        (Some(npy), _) => (
            std::fs::metadata(npy).map(|m| m.len()).unwrap_or(0),
            npy.display().to_string(),
        ),
        (None, Some(values)) => (
            std::fs::metadata(values).map(|m| m.len()).unwrap_or(0),
            values.display().to_string(),
        ),
        (None, None) => return Err("give --npy FILE, or --values FILE with --offsets FILE".into()),
    };
    let bar = progress_bar(input_bytes, true);
    bar.set_message("converting");
    let started = std::time::Instant::now();
    let records = match (&args.npy, &args.values, &args.offsets) {
        (Some(npy), _, _) => convert_npy(npy, &target, |done| bar.set_position(done))?,
        (None, Some(values), Some(offsets)) => {
            convert_values(values, offsets, &target, |done| bar.set_position(done))?
        }
        _ => return Err("--values needs --offsets".into()),
    };
    bar.finish_and_clear();
    println!(
        "converted {records} records from {source} into {} (field '{}', {}) in {:.1} s",
        args.dir.display(),
        args.field,
        match args.compress {
            Compression::Raw => "raw",
            Compression::Flate => "flate",
        },
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
