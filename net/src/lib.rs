//! zr-net: the cluster's transport — QUIC endpoints secured by the cluster's TLS identities,
//! one request and one reply per stream, and the accept loop every server runs. What the
//! servers share besides (nodes.toml, logging, the metrics exporter) is `zr_service`'s.
//!
//! - [`security`]: mutual TLS by role, or the explicit `--insecure-dev` mode.
//! - [`tls`]: the cluster CA and each role's certificate: making, renewing, loading, checking.
//! - `link`: packet sizes and transport tuning by link (loopback or a network).
//! - [`endpoint`]: sockets, endpoints, connecting within a deadline.
//! - [`rpc`]: calls; messages sent whole or reset, never cut off to look whole.
//! - [`serve`]: the accept loop (caps, budgets, deadlines, drain on shutdown);
//!   `admission`: the request budget in total, per identity and for readers; `rate`: bytes
//!   per second per identity.
//! - [`metrics`]: each connection's QUIC statistics as gauges.

mod admission;
pub mod endpoint;
mod error;
mod link;
pub mod metrics;
mod rate;
mod refusal;
pub mod rpc;
pub mod security;
pub mod serve;
pub mod tls;

pub use endpoint::{
    client_endpoint, connect, connect_to, connect_with_windows, seed_endpoints_on_this_thread,
    server_endpoint, server_endpoint_wrapped,
};
pub use error::Error;

/// Default for every network wait of the router (and of nodes' peers).
pub const TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default for a client's waits: longer than the router's, so that when a node fails the
/// router's answer naming the shard arrives before the client gives up.
pub const CLIENT_TIMEOUT_MS_DEFAULT: u64 = 3 * TIMEOUT_MS_DEFAULT;
pub use link::{Windows, SEND_WINDOW_BYTES, STREAMS_PER_CONNECTION_MAX};
pub use refusal::describe;
pub use rpc::{
    call, call_chunks, read_chunk, read_chunks, send_request, Body, ABANDONED, PROTOCOL_VIOLATION,
};
pub use security::{Peer, Security};
pub use serve::{
    requests, serve, serve_peers, shutdown_signal, Limits, DRAIN_TIMEOUT, IDLE_RECLAIM, RECLAIMED,
    REQUESTS_PER_IDENTITY_DEFAULT, TOO_MANY,
};
