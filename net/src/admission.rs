//! The request budget: bytes of requests being read or handled at once, bounded in total,
//! per identity, and for readers together.
//!
//! - No identity (one certificate) holds more than its share, however many connections
//!   and streams it opens.
//! - Readers together hold at most the budget less a part kept for every other role, so
//!   that an operator's or a writer's requests find room whatever readers send.
//!
//! A request draws its share as its bytes arrive ([`Share::grow`]). Taking more while holding
//! some could deadlock against other half-read requests, so a request that cannot have more
//! at once gives back what it holds and waits for the whole amount, from each pool in one
//! fixed order (identity, readers, total): waits that take their pools in the same order form
//! no cycle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::tls::Role;
use crate::Peer;

/// Granularity of the budget: a request holds at least this much while it lives (a small
/// request, such as a wait for a commit, costs 4 KiB of it).
pub(crate) const UNIT: usize = 4 << 10;

/// The pools of one server.
pub(crate) struct RequestBudget {
    total: Arc<Semaphore>,
    readers: Arc<Semaphore>,
    per_identity: usize,
    identities: Mutex<Identities>,
}

#[derive(Default)]
struct Identities {
    pools: HashMap<u64, Weak<Semaphore>>,
    /// The map's size after it was last swept of identities with no connection.
    swept: usize,
}

impl RequestBudget {
    /// `bytes` in total, at most `per_identity` to one identity, and `kept` of it that
    /// readers never take.
    pub(crate) fn new(bytes: usize, per_identity: usize, kept: usize) -> RequestBudget {
        let units = bytes.div_ceil(UNIT).max(1);
        let kept = (kept / UNIT).min(units - 1);
        RequestBudget {
            total: Arc::new(Semaphore::new(units)),
            readers: Arc::new(Semaphore::new(units - kept)),
            per_identity: per_identity.div_ceil(UNIT).clamp(1, units),
            identities: Mutex::default(),
        }
    }

    /// Most bytes one request may have: its identity's share.
    pub(crate) fn request_max(&self) -> usize {
        self.per_identity * UNIT
    }

    /// The pools `peer`'s requests draw from, for as long as the connection holds them.
    pub(crate) fn pools_of(&self, peer: &Peer) -> Pools {
        let mut identities = self.identities.lock().unwrap_or_else(|e| e.into_inner());
        let own = match identities.pools.get(&peer.identity).and_then(Weak::upgrade) {
            Some(own) => own,
            None => {
                let own = Arc::new(Semaphore::new(self.per_identity));
                identities.pools.insert(peer.identity, Arc::downgrade(&own));
                if identities.pools.len() > 2 * identities.swept.max(64) {
                    identities.pools.retain(|_, pool| pool.strong_count() > 0);
                    identities.swept = identities.pools.len();
                }
                own
            }
        };
        Pools {
            identity: own,
            readers: (peer.role == Some(Role::Reader)).then(|| Arc::clone(&self.readers)),
            total: Arc::clone(&self.total),
        }
    }
}

/// The pools one connection's requests draw from, in the order they are taken.
#[derive(Clone)]
pub(crate) struct Pools {
    identity: Arc<Semaphore>,
    readers: Option<Arc<Semaphore>>,
    total: Arc<Semaphore>,
}

impl Pools {
    fn each(&self) -> impl Iterator<Item = &Arc<Semaphore>> {
        [
            Some(&self.identity),
            self.readers.as_ref(),
            Some(&self.total),
        ]
        .into_iter()
        .flatten()
    }
}

/// What one request holds of the budget; given back when dropped.
#[derive(Default)]
pub(crate) struct Share {
    permits: Vec<OwnedSemaphorePermit>,
    units: usize,
}

impl Share {
    /// Grows the share to cover `bytes`; `None` if the server's budget is gone (it stops).
    pub(crate) async fn grow(&mut self, pools: &Pools, bytes: usize) -> Option<()> {
        let need = bytes.div_ceil(UNIT).max(1);
        if need <= self.units {
            return Some(());
        }
        let more = u32::try_from(need - self.units).ok()?;
        let mut taken = Vec::with_capacity(3);
        for pool in pools.each() {
            match Arc::clone(pool).try_acquire_many_owned(more) {
                Ok(permit) => taken.push(permit),
                Err(_) => {
                    // Give everything back, then wait for the whole amount in order.
                    drop(taken);
                    self.permits.clear();
                    self.units = 0;
                    let all = u32::try_from(need).ok()?;
                    for pool in pools.each() {
                        let permit = Arc::clone(pool).acquire_many_owned(all).await.ok()?;
                        self.permits.push(permit);
                    }
                    self.units = need;
                    return Some(());
                }
            }
        }
        self.merge(taken);
        self.units = need;
        Some(())
    }

    fn merge(&mut self, taken: Vec<OwnedSemaphorePermit>) {
        if self.permits.is_empty() {
            self.permits = taken;
            return;
        }
        for (held, more) in self.permits.iter_mut().zip(taken) {
            held.merge(more);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(identity: u64, role: Role) -> Peer {
        Peer {
            role: Some(role),
            identity,
            name: None,
            serial: None,
        }
    }

    fn share(pools: &Pools, bytes: usize) -> Option<Share> {
        let mut share = Share::default();
        futures_now(share.grow(pools, bytes))?;
        Some(share)
    }

    /// Polls `future` once: `None` if it would wait.
    fn futures_now<T>(future: impl std::future::Future<Output = Option<T>>) -> Option<T> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => out,
            std::task::Poll::Pending => None,
        }
    }

    #[test]
    fn one_identity_holds_at_most_its_share() {
        let budget = RequestBudget::new(64 * UNIT, 16 * UNIT, 16 * UNIT);
        let reader = budget.pools_of(&peer(1, Role::Reader));
        let held: Vec<Share> = (0..16).filter_map(|_| share(&reader, UNIT)).collect();
        assert_eq!(held.len(), 16);
        assert!(share(&reader, 1).is_none(), "a 17th unit was granted");
        // Another connection of the same identity draws from the same pool.
        let again = budget.pools_of(&peer(1, Role::Reader));
        assert!(share(&again, 1).is_none());
        // Another identity is not affected.
        let other = budget.pools_of(&peer(2, Role::Reader));
        assert!(share(&other, 16 * UNIT).is_some());
        drop(held);
        assert!(share(&reader, UNIT).is_some());
    }

    #[test]
    fn readers_leave_room_for_writers_and_operators() {
        let budget = RequestBudget::new(64 * UNIT, 16 * UNIT, 16 * UNIT);
        // Three reader identities take the readers' 48 units.
        let mut held = Vec::new();
        for identity in 0..4 {
            let pools = budget.pools_of(&peer(identity, Role::Reader));
            held.extend(share(&pools, 16 * UNIT));
        }
        assert_eq!(held.len(), 3, "readers took more than their pool");
        let writer = budget.pools_of(&peer(10, Role::Writer));
        let operator = budget.pools_of(&peer(11, Role::Operator));
        assert!(share(&writer, 8 * UNIT).is_some());
        assert!(share(&operator, 8 * UNIT).is_some());
    }

    #[test]
    fn a_request_too_large_for_one_identity_is_not_admitted() {
        let budget = RequestBudget::new(64 * UNIT, 16 * UNIT, 16 * UNIT);
        assert_eq!(budget.request_max(), 16 * UNIT);
    }

    #[test]
    fn a_share_grows_and_gives_everything_back() {
        let budget = RequestBudget::new(8 * UNIT, 8 * UNIT, 0);
        let pools = budget.pools_of(&peer(1, Role::Writer));
        let mut one = Share::default();
        futures_now(one.grow(&pools, 100)).expect("room");
        futures_now(one.grow(&pools, 3 * UNIT)).expect("room");
        assert_eq!(budget.total.available_permits(), 5);
        futures_now(one.grow(&pools, 2 * UNIT)).expect("already covered");
        assert_eq!(budget.total.available_permits(), 5);
        drop(one);
        assert_eq!(budget.total.available_permits(), 8);
        assert_eq!(budget.readers.available_permits(), 8);
    }

    #[test]
    fn identities_without_connections_are_swept() {
        let budget = RequestBudget::new(64 * UNIT, 16 * UNIT, 0);
        for identity in 0..1000 {
            drop(budget.pools_of(&peer(identity, Role::Reader)));
        }
        assert!(budget.identities.lock().unwrap().pools.len() <= 256);
    }
}
