//! What the server processes (`zr-node`, `zr-router`) share as they start: their common
//! options, logging, the cluster configuration and credentials, the runtime with its stop
//! signals, and the metrics endpoint.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::process::ExitCode;

use zr_net::tls::Role;
use zr_net::Security;

use crate::config::ClusterConfig;
use crate::logging::LogFormat;

/// The options every server process takes (flattened into its own).
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// Run without certificates: encrypted, but anyone who can reach the port gets in.
    /// For development on a trusted machine only; every server of the cluster must run
    /// with it.
    #[arg(long)]
    pub insecure_dev: bool,
    /// Log level: error, warn, info, debug, trace (RUST_LOG, when set, overrides it).
    #[arg(long, default_value = "info")]
    pub log: String,
    /// Serve Prometheus metrics at http://ADDR/metrics (overrides this process's `metrics`
    /// in nodes.toml; off unless one is given; ops/README.md lists them).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Log lines as `text` (colour only on a terminal) or `json` (one object per line).
    #[arg(long, default_value = "text", value_name = "text|json")]
    pub log_format: LogFormat,
}

/// A server process under way: its configuration and credentials, its runtime, and what
/// resolves when a signal asks it to stop (SIGINT or SIGTERM, from the start on).
struct Started {
    config: ClusterConfig,
    security: Security,
    runtime: tokio::runtime::Runtime,
    shutdown: Shutdown,
}

/// Starts server process `name` as `role`: logging as `args` say, nodes.toml at `nodes`
/// loaded with the role's credentials, a runtime. The error is the line to print.
fn start(args: &ServerArgs, nodes: &Path, role: Role, name: &str) -> Result<Started, String> {
    crate::logging::init_logging(&args.log, args.log_format);
    let (config, security) = ClusterConfig::load_for(nodes, role, args.insecure_dev, name)
        .map_err(|e| format!("{name}: {e}"))?;
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| format!("{name}: cannot start the runtime: {e}"))?;
    // Signals from here on stop the process gracefully, also while it is still starting.
    let shutdown = {
        let _runtime = runtime.enter();
        Box::pin(zr_net::shutdown_signal())
    };
    Ok(Started {
        config,
        security,
        runtime,
        shutdown,
    })
}

impl Started {
    /// Serves the metrics at `--metrics`, else at `configured` (nodes.toml), if either.
    fn serve_metrics(
        &self,
        args: &ServerArgs,
        configured: Option<SocketAddr>,
        name: &str,
    ) -> Result<(), String> {
        if let Some(listen) = args.metrics.or(configured) {
            let _runtime = self.runtime.enter();
            crate::metrics::serve_metrics(listen).map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    }
}

/// What resolves when a signal asks a server process to stop.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs server process `name` as `role`: the allocator set for a server (see
/// [`zr_common::alloc`]: buffers kept while busy, memory returned when idle), started as
/// [`start`] does, its metrics served at `--metrics` or where `metrics` finds them in the
/// configuration, then `serve` on its runtime until it returns. Every failure is one line on
/// stderr, and the exit code says whether there was one.
pub fn run<F, Fut>(
    args: &ServerArgs,
    nodes: &Path,
    role: Role,
    name: &str,
    metrics: impl FnOnce(&ClusterConfig) -> Option<SocketAddr>,
    serve: F,
) -> ExitCode
where
    F: FnOnce(ClusterConfig, Security, Shutdown) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    zr_common::alloc::tune();
    zr_common::alloc::trim_when_idle(zr_net::requests);
    let started = match start(args, nodes, role, name) {
        Ok(started) => started,
        Err(line) => {
            eprintln!("{line}");
            return ExitCode::FAILURE;
        }
    };
    let configured = metrics(&started.config);
    if let Err(line) = started.serve_metrics(args, configured, name) {
        eprintln!("{line}");
        return ExitCode::FAILURE;
    }
    let Started {
        config,
        security,
        runtime,
        shutdown,
    } = started;
    match runtime.block_on(serve(config, security, shutdown)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(line) => {
            eprintln!("{name}: {line}");
            ExitCode::FAILURE
        }
    }
}
