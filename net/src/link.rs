//! What lies between an endpoint and its peers, and the transport tuned for it.
//!
//! Tuning for loopback and LANs, measured on a 2-core machine: 4 MiB UDP socket buffers
//! (default buffers drop packets under scatter/gather), GSO/GRO left on, MTU discovery up to
//! 6,500 bytes on a network (10 GSO segments stay under 64 KiB) and up to 32,000 on loopback
//! (2 segments; see `Link`), and flow-control windows large enough for a 16 MiB gather reply
//! in flight, and peers asked to acknowledge within 1 ms (a lost tail packet is otherwise
//! recovered only after QUIC's default 25 ms). What a connection holds unacknowledged is
//! bounded ([`SEND_WINDOW_BYTES`]), which bounds memory per connection and the number of
//! buffered pieces quinn scans for each packet it builds (a router forwards a 16 MiB reply as
//! ~2,600 received pieces). Measured: 4, 8 and 16 MiB windows gather as fast as 256 MiB.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{AsyncUdpSocket, MtuDiscoveryConfig, TransportConfig, VarInt};

/// Most concurrent requests (streams) one connection may have open.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 1024;

/// Each side pings an idle connection this often, so that it stays open while both live.
const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// A connection that hears nothing from its peer for this long is closed: the peer is gone.
/// (Keep-alives make this independent of how long a client pauses between requests.)
const IDLE_TIMEOUT_MS: u32 = 10_000;

/// Most bytes a connection holds written but not yet acknowledged; writers wait beyond it.
pub const SEND_WINDOW_BYTES: u64 = 8 << 20;

/// What lies between an endpoint and its peers, which decides how large its packets get.
/// An endpoint bound to a loopback address can reach only loopback peers; the endpoints of
/// one connection then agree on packet sizes, and one datagram may be as large as UDP allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Link {
    /// A network: MTU discovery up to [`Link::mtu_max`] (6,500 bytes, for jumbo-frame LANs;
    /// a 1,500-byte path is found by discovery).
    Network,
    /// Loopback (lo's MTU is 64 KiB). quinn's cost is per packet: at 16 KiB records, 32,000
    /// rather than 6,500 bytes took 25-35% less CPU per gathered byte on every path (router,
    /// direct and plain quinn alike) and 64,000 was no better.
    Loopback,
}

/// Most bytes one GSO send may carry: segments x MTU must fit one UDP datagram (64 KiB).
const GSO_BYTES_MAX: usize = 65_000;

impl Link {
    pub(crate) fn of(addr: SocketAddr) -> Link {
        if addr.ip().is_loopback() {
            Link::Loopback
        } else {
            Link::Network
        }
    }

    /// The largest UDP payload this endpoint sends, and accepts from its peers.
    pub(crate) fn mtu_max(self) -> u16 {
        match self {
            Link::Network => 6_500,
            Link::Loopback => 32_000,
        }
    }

    /// The first packets' size: on loopback already large (discovery climbs from there),
    /// but within QUIC's initial congestion window (14,720 bytes), or the handshake stalls.
    fn mtu_initial(self) -> Option<u16> {
        match self {
            Link::Network => None,
            Link::Loopback => Some(6_500),
        }
    }

    /// The smallest step MTU discovery takes between probes. A probe is a packet of the size
    /// tried, padded, and its receiver walks the padding a byte at a time (a padding byte is
    /// a QUIC frame): on loopback quinn's default of 20 bytes made a dozen probes of 19-32 KB
    /// per direction of every connection, about a tenth of the CPU of a short shard move. In
    /// steps of at least 2,000 bytes the search from 6,500 takes 4 probes and still ends at
    /// 32,000 (19,250, 25,625, 28,812, then the upper bound). On a network the probes are a
    /// few KB and the default's precision is worth them.
    fn mtu_probe_step(self) -> u16 {
        match self {
            Link::Network => 20,
            Link::Loopback => 2_000,
        }
    }

    /// Most datagrams per GSO send at the largest MTU.
    pub(crate) fn gso_segments_max(self) -> usize {
        GSO_BYTES_MAX / self.mtu_max() as usize
    }
}

/// How much a connection's receiver lets its peer send ahead of what it has read: per
/// stream and for the whole connection. Received bytes not yet read are held in memory up
/// to these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    pub stream: u32,
    pub connection: u32,
}

impl Windows {
    /// Clients' and nodes' connections: large, so that one reply of a few hundred MiB never
    /// waits for the reader.
    pub const DEFAULT: Windows = Windows {
        stream: 64 << 20,
        connection: 256 << 20,
    };
    /// A router's connections to its nodes: what it receives from a node but cannot pass
    /// on yet (the client reads slowly, or the reply budget is spent) stays within these.
    pub const ROUTER_TO_NODE: Windows = Windows {
        stream: 16 << 20,
        connection: 64 << 20,
    };
}

/// The round trip a connection assumes before it has measured one. quinn's default
/// (333 ms, for the internet) makes a lost handshake packet, or any packet lost before the
/// first measurement, cost about a second: longer than a heartbeat's deadline, so a node on
/// a lossy link could be found down while it answers. The links of a cluster are a
/// machine's or a data center's, well under this.
const INITIAL_RTT: std::time::Duration = std::time::Duration::from_millis(100);

/// Transport settings for connections over `link`, receiving with `windows`.
pub(crate) fn transport(link: Link, windows: Windows) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    if let Some(initial) = link.mtu_initial() {
        t.initial_mtu(initial);
    }
    let mut mtu = MtuDiscoveryConfig::default();
    mtu.upper_bound(link.mtu_max())
        .minimum_change(link.mtu_probe_step());
    t.mtu_discovery_config(Some(mtu))
        .initial_rtt(INITIAL_RTT)
        .max_concurrent_bidi_streams(VarInt::from_u32(STREAMS_PER_CONNECTION_MAX))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(windows.stream))
        .receive_window(VarInt::from_u32(windows.connection))
        .send_window(SEND_WINDOW_BYTES)
        .ack_frequency_config(Some(ack_frequency()))
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_idle_timeout(Some(VarInt::from_u32(IDLE_TIMEOUT_MS).into()));
    Arc::new(t)
}

/// Asks peers to acknowledge within [`ACK_DELAY_MAX`] rather than QUIC's default 25 ms. The
/// probe timeout that recovers a lost tail packet waits for the peer's delayed ACK, so on a
/// fast link one drop at the end of a reply cost a whole 25 ms (measured: plain 16 MiB
/// transfers on loopback, p99 44-47 ms at a 14-16 ms median; with 1 ms, p99 24-26 ms).
fn ack_frequency() -> quinn::AckFrequencyConfig {
    let mut ack = quinn::AckFrequencyConfig::default();
    ack.max_ack_delay(Some(ACK_DELAY_MAX));
    ack
}

/// Longest a peer may delay an acknowledgement (see [`ack_frequency`]).
const ACK_DELAY_MAX: Duration = Duration::from_millis(1);

/// A UDP socket that asks quinn for at most `segments` datagrams per GSO send (quinn asks
/// the socket, which knows only the kernel's limit, not the MTU).
#[derive(Debug)]
pub(crate) struct SegmentCap {
    pub(crate) inner: Arc<dyn AsyncUdpSocket>,
    pub(crate) segments: usize,
}

impl AsyncUdpSocket for SegmentCap {
    fn create_io_poller(self: Arc<Self>) -> std::pin::Pin<Box<dyn quinn::UdpPoller>> {
        Arc::clone(&self.inner).create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit) -> std::io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut std::task::Context,
        bufs: &mut [std::io::IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments().min(self.segments).max(1)
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every link's GSO send fits one UDP datagram at its largest MTU.
    #[test]
    fn gso_sends_fit_one_datagram() {
        for link in [Link::Network, Link::Loopback] {
            assert!(link.gso_segments_max() >= 1);
            assert!(link.gso_segments_max() * link.mtu_max() as usize <= 65_507);
            assert!(link.mtu_initial().unwrap_or(1200) <= link.mtu_max());
        }
        assert_eq!(Link::of("127.0.0.1:9".parse().unwrap()), Link::Loopback);
        assert_eq!(Link::of("[::1]:9".parse().unwrap()), Link::Loopback);
        assert_eq!(Link::of("0.0.0.0:9".parse().unwrap()), Link::Network);
    }
}
