//! zr-service: what zrecord's servers and the `zr` command share beside the transport —
//! the cluster's configuration file, log output, and the metrics exporter. Kept apart from
//! `zr_net` so that the transport depends on no metadata store.
//!
//! - [`audit`]: the audit log (who did what, when), its rotation and reading back.
//! - [`config`]: nodes.toml (where every node, router and store is; TLS; fields).
//! - [`logging`]: text or JSON log lines.
//! - [`metrics`]: the Prometheus exporter of the servers' metrics.

pub mod audit;
pub mod config;
pub mod logging;
pub mod metrics;
pub mod process;
