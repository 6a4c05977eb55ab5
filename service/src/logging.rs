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

/// Lines per identity per [`LogBudget::WINDOW`] a [`LogBudget`] lets through.
const LINES_PER_WINDOW: u32 = 10;

/// What a [`LogBudget`] says of one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLine {
    /// Write it; `suppressed` lines of the same identity were left out before it (say so).
    Write { suppressed: u64 },
    /// Leave it out (counted, and said with the next line written).
    Suppress,
}

/// Bounds the lines one peer's requests make a server log: at most [`LINES_PER_WINDOW`]
/// per identity per [`LogBudget::WINDOW`]; the rest are counted and said as a number with
/// the next line that is written. A peer that sends a flood of refused requests then costs
/// the log a few lines a second, not one a request. Pure: the caller gives the time.
#[derive(Debug, Default)]
pub struct LogBudget {
    peers: std::collections::HashMap<u64, Window>,
    /// How many were kept at the last sweep of quiet identities.
    swept: usize,
}

#[derive(Debug)]
struct Window {
    began: std::time::Instant,
    written: u32,
    suppressed: u64,
}

impl LogBudget {
    /// How long one identity's allowance of lines lasts.
    pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

    /// Whether a line of `identity`'s at `now` is written.
    pub fn line(&mut self, identity: u64, now: std::time::Instant) -> LogLine {
        if self.peers.len() > 2 * self.swept.max(2048) {
            // Identities quiet for a window have nothing to carry over but a count.
            self.peers
                .retain(|_, w| now.duration_since(w.began) < Self::WINDOW || w.suppressed > 0);
            self.swept = self.peers.len();
        }
        let window = self.peers.entry(identity).or_insert(Window {
            began: now,
            written: 0,
            suppressed: 0,
        });
        if now.duration_since(window.began) >= Self::WINDOW {
            window.began = now;
            window.written = 0;
        }
        if window.written >= LINES_PER_WINDOW {
            window.suppressed += 1;
            return LogLine::Suppress;
        }
        window.written += 1;
        LogLine::Write {
            suppressed: std::mem::take(&mut window.suppressed),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_flood_from_one_identity_is_a_few_lines_and_a_count() {
        let mut budget = LogBudget::default();
        let start = Instant::now();
        let mut written = 0;
        for k in 0..100_000u32 {
            let now = start + Duration::from_micros(k as u64 * 100); // 10 s of 10,000/s
            if let LogLine::Write { .. } = budget.line(7, now) {
                written += 1;
            }
        }
        assert_eq!(written, LINES_PER_WINDOW);
        // Another identity still gets its lines.
        assert_eq!(
            budget.line(8, start + Duration::from_secs(5)),
            LogLine::Write { suppressed: 0 }
        );
        // The next window says how many were left out.
        assert_eq!(
            budget.line(7, start + LogBudget::WINDOW),
            LogLine::Write {
                suppressed: 100_000 - LINES_PER_WINDOW as u64
            }
        );
    }

    #[test]
    fn many_identities_are_forgotten_once_quiet() {
        let mut budget = LogBudget::default();
        let start = Instant::now();
        for identity in 0..10_000 {
            budget.line(identity, start);
        }
        for identity in 10_000..20_000 {
            budget.line(identity, start + LogBudget::WINDOW);
        }
        // The first ten thousand were quiet a window long when the map was swept.
        assert!(budget.peers.len() <= 12_000, "{} kept", budget.peers.len());
    }
}
