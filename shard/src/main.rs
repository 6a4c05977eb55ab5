//! `zr-node`: serves one shard of a zrecord cluster.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use zr_net::tls::Role;
use zr_service::process::{self, ServerArgs};

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
    #[command(flatten)]
    server: ServerArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (shard, replica) = (args.shard, args.replica);
    process::run(
        &args.server,
        &args.nodes,
        Role::Node,
        "zr-node",
        |config| config.node(shard, replica).and_then(|s| s.metrics),
        |config, security, shutdown| async move {
            let data = args.data.as_deref();
            zr_shard::server::run_shard(&config, &security, shard, replica, data, shutdown)
                .await
                .map_err(|e| format!("shard {shard}: {e}"))
        },
    )
}
