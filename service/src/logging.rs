//! The servers' logs on stderr: plain text (with colour only on a terminal), or one JSON
//! object per line for log shippers. `RUST_LOG`, when set, chooses what is logged (its
//! syntax: `info`, `zr_router=debug,quinn=warn`, …); otherwise `--log` does.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`).
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<LogFormat, String> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("'{other}' is not a log format: text or json")),
        }
    }
}

/// Starts logging to stderr at `level` (unless `RUST_LOG` says otherwise) in `format`.
pub fn init_logging(level: &str, format: LogFormat) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::new(spec),
        _ => EnvFilter::new(level),
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().init(),
    }
}
