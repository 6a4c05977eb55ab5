//! The reply budget: the bytes of gather replies the router holds — received from nodes and
//! not yet acknowledged by the client — are bounded in total, and per gather, whatever
//! clients do (a client that stops reading holds at most its gather's share until the
//! router's timeout resets its stream).
//!
//! Every chunk a node sends is charged before it is passed on, and carries its charge (a
//! [`Bytes`] whose owner holds the permits) until its last copy is dropped: after quinn has
//! had it acknowledged, or when the gather is abandoned. A gather's parts are forwarded one
//! at a time ([`crate::forward`]); the part being forwarded (its *turn*) draws from the
//! gather's window, the others — read ahead, queued until their turn — from the gather's
//! read-ahead allowance and the router's read-ahead half. Read-ahead never waits for the part
//! being forwarded, and the part being forwarded never waits for read-ahead, so no gather
//! can wait on another in a cycle: every wait ends as some client reads on (or its stream
//! times out).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Most bytes the part being forwarded holds (its window), and most bytes a gather reads
/// ahead: each at most a quarter of the budget.
const WINDOW_MAX: usize = 8 << 20;
const AHEAD_MAX: usize = 64 << 20;

/// The router's reply budget.
pub struct ReplyBudget {
    bytes: usize,
    total: Arc<Semaphore>,
    /// Read-ahead may hold at most half of the budget, so that parts being forwarded always
    /// find room as clients read on.
    ahead: Arc<Semaphore>,
}

impl ReplyBudget {
    pub fn new(mib: u64) -> ReplyBudget {
        let bytes = usize::try_from(mib << 20)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        ReplyBudget {
            bytes,
            total: Arc::new(Semaphore::new(bytes)),
            ahead: Arc::new(Semaphore::new(bytes / 2)),
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.bytes - self.total.available_permits()
    }

    /// A new gather's share.
    pub fn gather(self: &Arc<Self>) -> Arc<GatherBudget> {
        let window = WINDOW_MAX.min(self.bytes / 4).max(1);
        Arc::new(GatherBudget {
            router: Arc::clone(self),
            window: Arc::new(Semaphore::new(window)),
            ahead: Arc::new(Semaphore::new(AHEAD_MAX.min(self.bytes / 4).max(1))),
            // A chunk larger than the window (chunks are ~64 KiB) is charged the window.
            chunk_max: u32::try_from(window).unwrap_or(u32::MAX),
        })
    }
}

/// One gather's share of the budget.
pub struct GatherBudget {
    router: Arc<ReplyBudget>,
    window: Arc<Semaphore>,
    ahead: Arc<Semaphore>,
    chunk_max: u32,
}

/// Whether a part is being forwarded (see the module documentation).
#[derive(Default)]
pub struct Turn {
    current: AtomicBool,
    began: Notify,
}

impl Turn {
    /// The part's turn has come: its reader draws from the window from now on.
    pub fn begin(&self) {
        self.current.store(true, Ordering::SeqCst);
        self.began.notify_waiters();
    }

    fn is_current(&self) -> bool {
        self.current.load(Ordering::SeqCst)
    }
}

/// A chunk and the permits it holds until dropped: the router's total and the window, or
/// the router's total and both read-ahead allowances.
struct Charged {
    chunk: Bytes,
    _permits: [Option<OwnedSemaphorePermit>; 3],
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.chunk
    }
}

impl GatherBudget {
    /// `chunk`, charged to the budget: waits until there is room for it. `None` if the
    /// budget is gone (never, while the router runs).
    pub async fn charge(&self, turn: &Turn, chunk: Bytes) -> Option<Bytes> {
        if chunk.is_empty() {
            return Some(chunk);
        }
        let n = u32::try_from(chunk.len())
            .unwrap_or(u32::MAX)
            .min(self.chunk_max);
        let total = Arc::clone(&self.router.total);
        loop {
            if turn.is_current() {
                let window = Arc::clone(&self.window).acquire_many_owned(n).await.ok()?;
                let total = total.acquire_many_owned(n).await.ok()?;
                return Some(Bytes::from_owner(Charged {
                    chunk,
                    _permits: [Some(total), Some(window), None],
                }));
            }
            let began = turn.began.notified();
            tokio::pin!(began);
            began.as_mut().enable();
            if turn.is_current() {
                continue;
            }
            let ahead = async {
                let mine = Arc::clone(&self.ahead).acquire_many_owned(n).await.ok()?;
                let router = Arc::clone(&self.router.ahead)
                    .acquire_many_owned(n)
                    .await
                    .ok()?;
                let total = Arc::clone(&total).acquire_many_owned(n).await.ok()?;
                Some([Some(total), Some(mine), Some(router)])
            };
            tokio::select! {
                permits = ahead => {
                    return Some(Bytes::from_owner(Charged { chunk, _permits: permits? }));
                }
                _ = &mut began => continue,
            }
        }
    }
}
