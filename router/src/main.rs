//! `zr-router`: the cluster's front door.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use zr_service::config::ClusterConfig;

/// Route a zrecord cluster: accept clients over QUIC, scatter gathers to the shards named in
/// nodes.toml, reassemble them in order, and route writes.
///
/// The router keeps no per-record state; at start it recovers the cluster's length from the
/// nodes, so it can be restarted, or run twice, at any time. SIGINT or SIGTERM stops
/// accepting and finishes requests in flight.
///
/// Connections are mutual TLS from the cluster CA named in nodes.toml's [tls] section (made
/// by `zr cluster-init`): clients must present a client certificate, nodes a node
/// certificate; the router presents router.pem to both.
#[derive(Parser)]
#[command(name = "zr-router", version)]
struct Args {
    /// The cluster configuration.
    #[arg(long, default_value = "nodes.toml")]
    nodes: PathBuf,
    /// Address to listen on (overrides router.listen in nodes.toml).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Run without certificates: encrypted, but anyone who can reach the port gets in.
    /// For development on a trusted machine only; nodes must run with it too.
    #[arg(long)]
    insecure_dev: bool,
    /// Log level: error, warn, info, debug, trace (RUST_LOG, when set, overrides it).
    #[arg(long, default_value = "info")]
    log: String,
    /// Serve Prometheus metrics at http://ADDR/metrics (overrides [router] metrics in
    /// nodes.toml; off unless one is given; ops/README.md lists them).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Log lines as `text` (colour only on a terminal) or `json` (one object per line).
    #[arg(long, default_value = "text", value_name = "text|json")]
    log_format: zr_service::logging::LogFormat,
}

fn main() -> ExitCode {
    zr_common::alloc::tune();
    zr_common::alloc::trim_when_idle(zr_net::requests);
    let args = Args::parse();
    zr_service::logging::init_logging(&args.log, args.log_format);
    let role = zr_net::tls::Role::Router;
    let (config, security) =
        match ClusterConfig::load_for(&args.nodes, role, args.insecure_dev, "zr-router") {
            Ok(loaded) => loaded,
            Err(e) => {
                eprintln!("zr-router: {e}");
                return ExitCode::FAILURE;
            }
        };
    let listen = args.listen.unwrap_or(config.router.listen);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("zr-router: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Signals from here on stop the process gracefully, also while it is still starting.
    let shutdown = {
        let _runtime = runtime.enter();
        zr_net::shutdown_signal()
    };
    if let Some(listen) = args.metrics.or(config.router.metrics) {
        let _runtime = runtime.enter();
        if let Err(e) = zr_service::metrics::serve_metrics(listen) {
            eprintln!("zr-router: {e}");
            return ExitCode::FAILURE;
        }
    }
    match runtime.block_on(zr_router::server::run_router(
        &config, &security, listen, shutdown,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zr-router: {e}");
            ExitCode::FAILURE
        }
    }
}
