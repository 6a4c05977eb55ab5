//! Bytes per second per identity: what one certificate's requests and replies may move
//! through one server, so that one job cannot take a server's whole bandwidth from another.
//!
//! A token bucket that may go into debt. A request of an identity in debt waits, before it
//! is handled, until the debt is paid; its bytes are charged as it is taken, and its
//! reply's as each piece is handed to the transport — before the peer can have it, so the
//! identity's next request finds them owed. Charging as it goes needs no reply size in
//! advance (a gather's is known only once it is read), and a waiting request holds no reply
//! memory, only its place among the identity's requests in flight. Requests in flight
//! together may overdraw by what they send at once; the average over a second or more is
//! the rate.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How much an idle identity may send at once, in seconds of its rate.
const BURST_SECONDS: f64 = 0.25;

/// One identity's bucket.
pub(crate) struct Rate {
    bytes_per_second: f64,
    /// Bytes it may still send (negative: its debt), as of the instant beside them.
    state: Mutex<(f64, Instant)>,
}

impl Rate {
    pub(crate) fn new(bytes_per_second: u64) -> Rate {
        let bytes_per_second = bytes_per_second.max(1) as f64;
        Rate {
            bytes_per_second,
            state: Mutex::new((bytes_per_second * BURST_SECONDS, Instant::now())),
        }
    }

    /// The bytes it may send now, refilled up to the burst.
    fn refilled(&self, state: &mut (f64, Instant)) -> f64 {
        let now = Instant::now();
        let earned = now.duration_since(state.1).as_secs_f64() * self.bytes_per_second;
        state.0 = (state.0 + earned).min(self.bytes_per_second * BURST_SECONDS);
        state.1 = now;
        state.0
    }

    /// How long until its debt is paid (zero when it has none).
    pub(crate) fn wait(&self) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let tokens = self.refilled(&mut state);
        if tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-tokens / self.bytes_per_second)
        }
    }

    /// Waits until its debt is paid; returns whether it had to.
    pub(crate) async fn ready(&self) -> bool {
        let mut waited = false;
        loop {
            let wait = self.wait();
            if wait.is_zero() {
                return waited;
            }
            waited = true;
            tokio::time::sleep(wait).await;
        }
    }

    /// Charges `bytes` moved.
    pub(crate) fn charge(&self, bytes: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refilled(&mut state);
        state.0 -= bytes as f64;
    }

    /// Whether it is owed nothing and has its whole burst back (forgetting it loses nothing).
    pub(crate) fn settled(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refilled(&mut state) >= self.bytes_per_second * BURST_SECONDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_debt_is_paid_at_the_rate() {
        let rate = Rate::new(1000);
        assert!(!rate.ready().await, "a new identity waits for nothing");
        rate.charge(250 + 1000); // its burst and a second more
        assert_eq!(rate.wait(), Duration::from_secs(1));
        let began = Instant::now();
        assert!(rate.ready().await);
        assert_eq!(began.elapsed(), Duration::from_secs(1));
        assert!(!rate.settled(), "the burst refills after the debt");
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(rate.settled());
        // Idle time earns no more than the burst.
        tokio::time::sleep(Duration::from_secs(60)).await;
        rate.charge(251);
        assert!(rate.wait() > Duration::ZERO);
    }
}
