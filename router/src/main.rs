//! `zr-router`: the cluster's front door.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use zr_net::tls::Role;
use zr_service::process::{self, ServerArgs};

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
    #[command(flatten)]
    server: ServerArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let listen = args.listen;
    process::run(
        &args.server,
        &args.nodes,
        Role::Router,
        "zr-router",
        |config| config.router.metrics,
        |config, security, shutdown| async move {
            let listen = listen.unwrap_or(config.router.listen);
            zr_router::server::run_router(&config, &security, listen, shutdown)
                .await
                .map_err(|e| e.to_string())
        },
    )
}
