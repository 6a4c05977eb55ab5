//! The transport's own metrics: each connection's QUIC statistics, recorded through the
//! `metrics` facade (nothing is recorded, at almost no cost, when no exporter is installed;
//! `zr_service::metrics` installs one).

use std::time::Duration;

/// How often each connection's transport statistics are sampled.
pub const PEER_STATS_EVERY: Duration = Duration::from_secs(5);

/// Sets the gauges of one QUIC connection's transport statistics, labelled with its peer's
/// address: round-trip time, congestion window, packets lost and bytes sent on the path.
pub fn record_peer_stats(connection: &quinn::Connection) {
    let peer = connection.remote_address().to_string();
    let path = connection.stats().path;
    metrics::gauge!("zr_quic_peer_rtt_seconds", "peer" => peer.clone()).set(path.rtt.as_secs_f64());
    metrics::gauge!("zr_quic_peer_cwnd_bytes", "peer" => peer.clone()).set(path.cwnd as f64);
    metrics::gauge!("zr_quic_peer_lost_packets", "peer" => peer.clone())
        .set(path.lost_packets as f64);
    metrics::gauge!("zr_quic_peer_sent_packets", "peer" => peer).set(path.sent_packets as f64);
}
