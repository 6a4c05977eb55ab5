//! Network faults on a simulated node's traffic: datagrams lost, delayed, or cut off
//! altogether (a partition), decided from a seed.
//!
//! Each node's UDP socket is wrapped in a `FaultySocket`, which quinn drives like any
//! other socket. Whether a datagram is lost is a pure function of the cluster's seed, the
//! shard and the datagram's number on that socket, so a seed names a fault schedule; the
//! sockets are real, so which datagram gets which number still depends on timing. Loss
//! applies to each datagram in both directions (one by one in a batch the kernel coalesced),
//! delay to those the node sends, a partition to everything.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use zr_common::hash::mix2;

/// What a node's traffic suffers; the default is a healthy network.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Share of datagrams lost, each way, in `[0, 1]`.
    pub loss: f64,
    /// How long every datagram the node sends takes to leave.
    pub delay: Duration,
    /// Nothing gets to or from the node.
    pub partitioned: bool,
}

/// One node's faults, shared by its socket (across restarts) and the cluster that sets them.
pub(crate) struct FaultState {
    faults: Mutex<Faults>,
    seed: u64,
    /// Datagrams decided so far.
    rolls: AtomicU64,
    /// Datagrams lost so far (a partition's not counted).
    pub(crate) lost: AtomicU64,
}

impl FaultState {
    pub(crate) fn new(seed: u64, shard: u32) -> FaultState {
        FaultState {
            faults: Mutex::new(Faults::default()),
            seed: mix2(seed, shard as u64),
            rolls: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        }
    }

    pub(crate) fn set(&self, faults: Faults) {
        *self.faults.lock().unwrap_or_else(|e| e.into_inner()) = faults;
    }

    pub(crate) fn get(&self) -> Faults {
        *self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the next datagram is lost, at rate `loss`.
    fn lose(&self, loss: f64) -> bool {
        if loss <= 0.0 {
            return false;
        }
        let roll = self.rolls.fetch_add(1, Ordering::Relaxed);
        let lost = (mix2(self.seed, roll) as f64) < loss * u64::MAX as f64;
        if lost {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
        lost
    }
}

/// A UDP socket that loses, delays or cuts off datagrams as its [`FaultState`] says.
pub(crate) struct FaultySocket {
    pub(crate) inner: Arc<dyn AsyncUdpSocket>,
    pub(crate) state: Arc<FaultState>,
}

impl fmt::Debug for FaultySocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultySocket")
            .field("inner", &self.inner)
            .field("faults", &self.state.get())
            .finish()
    }
}

impl AsyncUdpSocket for FaultySocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Arc::clone(&self.inner).create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let faults = self.state.get();
        if faults == Faults::default() {
            return self.inner.try_send(transmit); // a healthy link: nothing to decide
        }
        if faults.partitioned {
            return Ok(()); // gone, as on a cut link
        }
        let segment = transmit
            .segment_size
            .unwrap_or(transmit.contents.len())
            .max(1);
        let datagrams = transmit.contents.chunks(segment);
        let total = datagrams.len();
        let kept: Vec<&[u8]> = datagrams
            .filter(|_| !self.state.lose(faults.loss))
            .collect();
        if faults.delay.is_zero() {
            if kept.len() == total {
                return self.inner.try_send(transmit);
            }
            for (k, datagram) in kept.iter().enumerate() {
                match self.inner.try_send(&single(transmit, datagram)) {
                    // Nothing sent yet: quinn waits and tries the whole transmit again.
                    Err(e) if k == 0 && e.kind() == io::ErrorKind::WouldBlock => return Err(e),
                    // The rest is lost, as on a full link.
                    Err(_) => break,
                    Ok(()) => {}
                }
            }
            return Ok(());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.inner.try_send(transmit);
        };
        let inner = Arc::clone(&self.inner);
        let kept: Vec<Vec<u8>> = kept.into_iter().map(<[u8]>::to_vec).collect();
        let (destination, ecn, src_ip) = (transmit.destination, transmit.ecn, transmit.src_ip);
        runtime.spawn(async move {
            tokio::time::sleep(faults.delay).await;
            for datagram in &kept {
                let late = Transmit {
                    destination,
                    ecn,
                    contents: datagram,
                    segment_size: None,
                    src_ip,
                };
                if inner.try_send(&late).is_err() {
                    break; // lost, as on a full link
                }
            }
        });
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            let received = match self.inner.poll_recv(cx, bufs, meta) {
                Poll::Ready(Ok(received)) => received,
                other => return other,
            };
            let faults = self.state.get();
            if faults.partitioned {
                continue; // all dropped; poll on until the socket is drained
            }
            if faults.loss > 0.0 {
                for (meta, buf) in meta[..received].iter_mut().zip(bufs.iter_mut()) {
                    meta.len =
                        lose_some(&self.state, faults.loss, &mut buf[..meta.len], meta.stride);
                }
            }
            return Poll::Ready(Ok(received));
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// Loses datagrams of `received` — several of `stride` bytes each when the kernel coalesced
/// them (GRO), the last maybe shorter — each on its own roll at rate `loss`: the kept ones
/// are moved to the front, in order, and their length returned (0: none kept, which quinn
/// reads as no datagram).
fn lose_some(state: &FaultState, loss: f64, received: &mut [u8], stride: usize) -> usize {
    let stride = stride.max(1);
    let mut kept = 0;
    for start in (0..received.len()).step_by(stride) {
        let end = (start + stride).min(received.len());
        if !state.lose(loss) {
            received.copy_within(start..end, kept);
            kept += end - start;
        }
    }
    kept
}

/// One datagram of `transmit`, sent on its own.
fn single<'a>(transmit: &Transmit, datagram: &'a [u8]) -> Transmit<'a> {
    Transmit {
        destination: transmit.destination,
        ecn: transmit.ecn,
        contents: datagram,
        segment_size: None,
        src_ip: transmit.src_ip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(seed: u64, shard: u32, loss: f64) -> Vec<bool> {
        let state = FaultState::new(seed, shard);
        (0..1000).map(|_| state.lose(loss)).collect()
    }

    #[test]
    fn a_seed_names_a_loss_schedule() {
        assert_eq!(schedule(7, 1, 0.1), schedule(7, 1, 0.1));
        assert_ne!(schedule(7, 1, 0.1), schedule(8, 1, 0.1));
        assert_ne!(schedule(7, 1, 0.1), schedule(7, 2, 0.1));
        let lost = schedule(7, 1, 0.1).iter().filter(|&&l| l).count();
        assert!((60..140).contains(&lost), "{lost} of 1000 lost at 10%");
        assert!(!schedule(7, 1, 0.0).contains(&true));
        assert!(!schedule(7, 1, 1.0).contains(&false));
    }

    /// A coalesced batch loses datagrams one by one, each on its own roll, and keeps the
    /// others whole and in order (the short last one too).
    #[test]
    fn a_coalesced_batch_loses_datagrams_one_by_one() {
        let datagrams: Vec<Vec<u8>> = (0..40u8)
            .map(|d| vec![d; if d == 39 { 3 } else { 8 }])
            .collect();
        let mut batch = datagrams.concat();
        let rolls = schedule(9, 0, 0.3);
        let state = FaultState::new(9, 0);
        let kept = lose_some(&state, 0.3, &mut batch, 8);
        let expected: Vec<u8> = datagrams
            .iter()
            .zip(&rolls)
            .filter(|(_, &lost)| !lost)
            .flat_map(|(d, _)| d.clone())
            .collect();
        assert!(kept < 40 * 8 && kept > 0, "{kept}");
        assert_eq!(&batch[..kept], &expected[..]);
        assert_eq!(
            state.lost.load(Ordering::Relaxed),
            rolls[..40].iter().filter(|&&l| l).count() as u64
        );
    }
}
