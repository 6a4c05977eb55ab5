//! The cluster's write lease, kept by shard 0's node: a router holds it around every write
//! that changes the cluster (append, modify, delete, start-up repair), so writes through
//! several routers are serialized as one router's own writes are by its lock. A write spans
//! several shards (a swap-remove moves the last record across them), so no shard alone can
//! keep two of them apart.
//!
//! Beside the holder it keeps a *cut*: a global length the cluster must be cut back to. A
//! delete whose last record has been copied into the hole records it before cutting that
//! record off; if the cut does not happen (its shard failed, the router died), the next
//! holder learns it with the lease and finishes it, so the moved record is not left twice.
//!
//! The lease runs out by itself, so a router that dies holding it stops the others for no
//! longer than that. The state is in memory: a restarted node starts with no holder and no
//! cut.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Who holds the lease and until when, and the cut left to make.
#[derive(Debug, Default)]
pub struct WriteLease {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    holder: Option<(u64, Instant)>,
    cut: Option<u64>,
}

/// Longest lease a router may ask for.
pub const LEASE_MAX: Duration = Duration::from_secs(3600);

impl WriteLease {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the lease to `holder` until `now + lease` (renews it if `holder` has it), and
    /// tells it the cut left to make, if any. Refused, with the time left, while another
    /// holder's lease runs.
    pub fn acquire(
        &self,
        holder: u64,
        lease: Duration,
        now: Instant,
    ) -> Result<Option<u64>, Duration> {
        let mut state = self.state();
        match state.holder {
            Some((other, until)) if other != holder && until > now => Err(until - now),
            _ => {
                state.holder = Some((holder, now + lease.min(LEASE_MAX)));
                Ok(state.cut)
            }
        }
    }

    /// Takes the lease back from `holder`. Refused if another router holds it now
    /// (`holder`'s ran out and was taken), or nobody does. The cut stays.
    pub fn release(&self, holder: u64) -> Result<(), String> {
        let mut state = self.state();
        match state.holder {
            Some((h, _)) if h == holder => {
                state.holder = None;
                Ok(())
            }
            Some(_) => Err("the write lease ran out and another router holds it now".into()),
            None => Err("the write lease is not held".into()),
        }
    }

    /// Records (`Some`) or clears (`None`) the cut, for `holder` only while its lease runs.
    pub fn intend(&self, holder: u64, cut: Option<u64>, now: Instant) -> Result<(), String> {
        let mut state = self.state();
        match state.holder {
            Some((h, until)) if h == holder && until > now => {
                state.cut = cut;
                Ok(())
            }
            Some((h, _)) if h == holder => Err("the write lease ran out".into()),
            Some(_) => Err("another router holds the write lease".into()),
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
        assert_eq!(lease.acquire(1, LEASE, t0), Ok(None));
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

    #[test]
    fn a_cut_outlives_its_holder_until_cleared() {
        let lease = WriteLease::default();
        let t0 = Instant::now();
        // Only the holder, while its lease runs, may record a cut.
        assert!(lease.intend(1, Some(41), t0).is_err());
        lease.acquire(1, LEASE, t0).unwrap();
        assert!(lease.intend(2, Some(41), t0).is_err());
        assert!(lease.intend(1, Some(41), t0 + LEASE).is_err());
        lease.intend(1, Some(41), t0).unwrap();
        // Holder 1 gives the lease back (or dies): the next holder learns the cut, and
        // keeps learning it until one of them clears it.
        lease.release(1).unwrap();
        assert_eq!(lease.acquire(2, LEASE, t0), Ok(Some(41)));
        lease.release(2).unwrap();
        assert_eq!(lease.acquire(3, LEASE, t0), Ok(Some(41)));
        lease.intend(3, None, t0).unwrap();
        lease.release(3).unwrap();
        assert_eq!(lease.acquire(1, LEASE, t0 + LEASE), Ok(None));
    }
}
