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
//! Each grant of the lease comes with a token larger than every earlier one. Before it
//! writes, a holder raises every node's [`Fence`] to its token, and each of its writes
//! carries the token: a write from a router whose lease ran out and passed on — a request
//! that arrives, or is handled, after the next holder fenced the node — is refused instead of
//! landing on top of the next holder's writes.
//!
//! The lease runs out by itself, so a router that dies holding it stops the others for no
//! longer than that. The state is in memory: a restarted node starts with no holder and no
//! cut, and its fence down; tokens come from the clock (microseconds since 1970, or one
//! more than the last if that is larger), so they keep growing across restarts of shard 0's
//! node.

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
    /// The last token granted.
    token: u64,
}

/// What a granted lease tells its holder.
#[derive(Debug, PartialEq, Eq)]
pub struct Grant {
    /// A cut left to make (see the module documentation).
    pub cut: Option<u64>,
    /// Larger than any earlier grant's.
    pub token: u64,
}

/// What a node keeps for the routers besides its store: the write lease (used on shard 0's
/// node) and its fence.
#[derive(Debug, Default)]
pub struct Coordination {
    pub lease: WriteLease,
    pub fence: Fence,
}

/// Longest lease a router may ask for.
pub const LEASE_MAX: Duration = Duration::from_secs(3600);

impl WriteLease {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the lease to `holder` until `now + lease` (renews it if `holder` has it), with a
    /// new token and the cut left to make, if any. Refused, with the time left, while another
    /// holder's lease runs.
    pub fn acquire(&self, holder: u64, lease: Duration, now: Instant) -> Result<Grant, Duration> {
        let mut state = self.state();
        match state.holder {
            Some((other, until)) if other != holder && until > now => Err(until - now),
            _ => {
                state.holder = Some((holder, now + lease.min(LEASE_MAX)));
                let clock = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as u64);
                state.token = clock.max(state.token + 1);
                Ok(Grant {
                    cut: state.cut,
                    token: state.token,
                })
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

/// A node's fence: the largest lease token it has been fenced with. Writes are checked and
/// made under its lock, so a write admitted before the fence rises is finished before the
/// fence's holder reads the node's length.
#[derive(Debug, Default)]
pub struct Fence {
    highest: Mutex<u64>,
}

impl Fence {
    /// Raises the fence to `token` (never lowers it), then runs `read` once any write
    /// admitted before has finished.
    pub fn raise<T>(&self, token: u64, read: impl FnOnce() -> T) -> T {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        *highest = (*highest).max(token);
        read()
    }

    /// Runs `write` if `token` is not below the fence; refused, saying why, otherwise.
    pub fn admit<T>(&self, token: u64, write: impl FnOnce() -> T) -> Result<T, String> {
        let highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if token < *highest {
            return Err(format!(
                "a write from a router whose write lease has since passed to another (its token {token} is below the node's fence {})",
                *highest
            ));
        }
        let done = write();
        drop(highest);
        Ok(done)
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
        assert_eq!(lease.acquire(1, LEASE, t0).map(|g| g.cut), Ok(None));
        // Held: others wait, the holder renews.
        let later = t0 + Duration::from_secs(4);
        assert_eq!(
            lease.acquire(2, LEASE, later).map(|g| g.cut),
            Err(Duration::from_secs(6))
        );
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
        assert_eq!(lease.acquire(2, LEASE, t0).map(|g| g.cut), Ok(Some(41)));
        lease.release(2).unwrap();
        assert_eq!(lease.acquire(3, LEASE, t0).map(|g| g.cut), Ok(Some(41)));
        lease.intend(3, None, t0).unwrap();
        lease.release(3).unwrap();
        assert_eq!(lease.acquire(1, LEASE, t0 + LEASE).map(|g| g.cut), Ok(None));
    }

    #[test]
    fn tokens_grow_and_fences_hold_back_older_ones() {
        let lease = WriteLease::default();
        let t0 = Instant::now();
        let first = lease.acquire(1, LEASE, t0).unwrap().token;
        let renewed = lease.acquire(1, LEASE, t0).unwrap().token;
        lease.release(1).unwrap();
        let next = lease.acquire(2, LEASE, t0).unwrap().token;
        assert!(
            first < renewed && renewed < next,
            "{first} {renewed} {next}"
        );

        let fence = Fence::default();
        assert_eq!(fence.admit(first, || 1), Ok(1));
        assert_eq!(fence.raise(next, || 2), 2);
        let refused = fence.admit(renewed, || 3).unwrap_err();
        assert!(refused.contains("passed to another"), "{refused}");
        assert_eq!(fence.admit(next, || 4), Ok(4));
        // A late, lower fence does not lower it.
        fence.raise(first, || ());
        assert!(fence.admit(renewed, || 5).is_err());
    }
}
