//! The servers' metrics in Prometheus text, served on `--metrics ADDR` at `/metrics`.
//! Metrics are recorded through the `metrics` facade wherever they arise (nothing is
//! recorded, at almost no cost, when no exporter is installed); this installs the exporter.
//! The transport's per-connection gauges come from `zr_net::metrics`.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;

/// Histogram buckets for durations, in seconds: 100 µs to 10 s.
const SECONDS_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0, 10.0,
];

/// A gauge not set for this long is dropped from the exposition: the per-peer gauges of a
/// connection that has closed. Servers set every gauge of theirs more often than this.
pub const GAUGE_IDLE: Duration = Duration::from_secs(60);

/// Serves every metric recorded from now on at `http://listen/metrics`. Call from within
/// the runtime that should run the listener.
pub fn serve_metrics(listen: SocketAddr) -> Result<(), MetricsError> {
    let failed = |source| MetricsError { listen, source };
    PrometheusBuilder::new()
        .with_http_listener(listen)
        .set_buckets(&SECONDS_BUCKETS)
        .map_err(failed)?
        .upkeep_timeout(Duration::from_secs(5))
        .idle_timeout(metrics_util::MetricKindMask::GAUGE, Some(GAUGE_IDLE))
        .install()
        .map_err(failed)
}

/// The metrics exporter could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {listen}: {source}")]
pub struct MetricsError {
    pub listen: SocketAddr,
    #[source]
    pub source: metrics_exporter_prometheus::BuildError,
}
