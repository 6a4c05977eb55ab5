//! The cluster's write lease, kept by shard 0's node: a router holds it around every write
//! that changes the cluster (append, modify, delete, start-up repair), so writes through
//! several routers are serialized as one router's own writes are by its lock. A write spans
//! several shards (a swap-remove moves the last record across them), so no shard alone can
//! keep two of them apart.
//!
//! The lease runs out by itself, so a router that dies holding it stops the others for no
//! longer than that. The state is in memory: a restarted node starts with no holder.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Who holds the lease, and until when.
#[derive(Debug, Default)]
pub struct WriteLease {
    holder: Mutex<Option<(u64, Instant)>>,
}

/// Longest lease a router may ask for.
pub const LEASE_MAX: Duration = Duration::from_secs(3600);

impl WriteLease {
    /// Gives the lease to `holder` until `now + lease` (renews it if `holder` has it).
    /// Refused, with the time left, while another holder's lease runs.
    pub fn acquire(&self, holder: u64, lease: Duration, now: Instant) -> Result<(), Duration> {
        let mut current = self.holder.lock().unwrap_or_else(|e| e.into_inner());
        match *current {
            Some((other, until)) if other != holder && until > now => Err(until - now),
            _ => {
                *current = Some((holder, now + lease.min(LEASE_MAX)));
                Ok(())
            }
        }
    }

    /// Takes the lease back from `holder`. Refused if another router holds it now
    /// (`holder`'s ran out and was taken), or nobody does.
    pub fn release(&self, holder: u64) -> Result<(), String> {
        let mut current = self.holder.lock().unwrap_or_else(|e| e.into_inner());
        match *current {
            Some((h, _)) if h == holder => {
                *current = None;
                Ok(())
            }
            Some(_) => Err("the write lease ran out and another router holds it now".into()),
            None => Err("the write lease is not held".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);

    #[test]
    fn one_holder_at_a_time() {
        let lease = WriteLease::default();
        let t0 = Instant::now();
        lease.acquire(1, LEASE, t0).unwrap();
        // Held: others wait, the holder renews.
        let later = t0 + Duration::from_secs(4);
        assert_eq!(lease.acquire(2, LEASE, later), Err(Duration::from_secs(6)));
        lease.acquire(1, LEASE, later).unwrap();
        assert!(lease.release(2).is_err());
        lease.release(1).unwrap();
        assert!(lease.release(1).is_err());
        lease.acquire(2, LEASE, later).unwrap();
    }

    #[test]
    fn a_lease_runs_out_by_itself() {
        let lease = WriteLease::default();
        let t0 = Instant::now();
        lease.acquire(1, LEASE, t0).unwrap();
        // Holder 1 stops midway: holder 2 waits out its lease, then takes it.
        assert!(lease
            .acquire(2, LEASE, t0 + LEASE - Duration::from_millis(1))
            .is_err());
        lease.acquire(2, LEASE, t0 + LEASE).unwrap();
        // The late holder's release is refused and changes nothing.
        assert!(lease.release(1).is_err());
        assert!(lease.acquire(3, LEASE, t0 + LEASE).is_err());
        lease.release(2).unwrap();
        lease.acquire(3, LEASE, t0 + LEASE).unwrap();
    }
}
