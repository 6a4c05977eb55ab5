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
    type Err = UnknownLogFormat;

    fn from_str(text: &str) -> Result<LogFormat, UnknownLogFormat> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(UnknownLogFormat(other.to_string())),
        }
    }
}

/// A log format that is neither text nor json.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a log format: text or json")]
pub struct UnknownLogFormat(pub String);

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
