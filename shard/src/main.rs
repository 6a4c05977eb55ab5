//! `zr-node`: serves one shard of a zrecord cluster.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use zr_service::config::ClusterConfig;

/// Serve shard K (one of its replicas) of the cluster described by nodes.toml over QUIC.
///
/// The shard's store lives in --data, else in the directory nodes.toml gives for it, else in
/// ./zr-data/shard-K (./zr-data/shard-K-rJ for replica J > 0); it is created with the configured fields if it does not exist. SIGINT or
/// SIGTERM stops accepting, finishes requests in flight, commits and exits 0.
///
/// Connections are mutual TLS from the cluster CA named in nodes.toml's [tls] section (made
/// by `zr cluster-init`): the node presents node.pem and accepts only peers with a router
/// certificate.
///
/// A node keeps each slot of the cluster map it holds as files of its own. A data directory
/// written by an older build (a shard's records as one sequence, ranked by the map) is
/// converted when the node starts, by the map in the metadata store: each dataset rebuilt
/// beside its directory and swapped in (free space for a copy of the largest is needed; a
/// conversion cut short goes on at the next start). It is refused while a move recorded by
/// the older build is unfinished: finish it with that build first.
#[derive(Parser)]
#[command(name = "zr-node", version)]
struct Args {
    /// The shard to serve.
    #[arg(long)]
    shard: u32,
    /// Which of the shard's replicas to serve (0..replicas of nodes.toml).
    #[arg(long, default_value_t = 0)]
    replica: u32,
    /// The cluster configuration.
    #[arg(long, default_value = "nodes.toml")]
    nodes: PathBuf,
    /// Data directory (overrides nodes.toml).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Run without certificates: encrypted, but anyone who can reach the port gets in.
    /// For development on a trusted machine only; the router must run with it too.
    #[arg(long)]
    insecure_dev: bool,
    /// Log level: error, warn, info, debug, trace (RUST_LOG, when set, overrides it).
    #[arg(long, default_value = "info")]
    log: String,
    /// Serve Prometheus metrics at http://ADDR/metrics (overrides the shard's `metrics` in
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
    let role = zr_net::tls::Role::Node;
    let (config, security) =
        match ClusterConfig::load_for(&args.nodes, role, args.insecure_dev, "zr-node") {
            Ok(loaded) => loaded,
            Err(e) => {
                eprintln!("zr-node: {e}");
                return ExitCode::FAILURE;
            }
        };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("zr-node: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Signals from here on stop the process gracefully, also while it is still starting.
    let shutdown = {
        let _runtime = runtime.enter();
        zr_net::shutdown_signal()
    };
    let configured = config
        .node(args.shard, args.replica)
        .and_then(|s| s.metrics);
    if let Some(listen) = args.metrics.or(configured) {
        let _runtime = runtime.enter();
        if let Err(e) = zr_service::metrics::serve_metrics(listen) {
            eprintln!("zr-node: {e}");
            return ExitCode::FAILURE;
        }
    }
    let result = runtime.block_on(zr_shard::server::run_shard(
        &config,
        &security,
        args.shard,
        args.replica,
        args.data.as_deref(),
        shutdown,
    ));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zr-node: shard {}: {e}", args.shard);
            ExitCode::FAILURE
        }
    }
}
