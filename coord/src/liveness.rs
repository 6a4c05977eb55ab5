//! Which nodes are up, as the router's heartbeats find them: a state machine without I/O,
//! told each heartbeat's outcome through [`crate::Replicas`] (`zr_client::nodes` sends the
//! heartbeats, and calls wait on the health it publishes).
//!
//! Every node gets a small request every [`EVERY_UP`] (every [`EVERY_DOWN`] while down),
//! answered within [`HEARTBEAT_TIMEOUT`] or counted failed. A node whose
//! heartbeats have failed for [`DOWN_AFTER`] in a row, [`FAILED_TO_DOWN`] of them at least —
//! a node killed, a host gone, a link cut — is down within about two seconds, long before a
//! request's own timeout (10 s by default) runs out; one heartbeat late on a lossy or busy
//! link (a lost handshake packet alone costs a second) does not make it down.
//! Calls that need a node that is down fail at once, naming it and since when (after
//! waiting up to [`WAIT_FOR_UP`] in case it has just come back), and calls that do not need
//! it are never slowed by it. Any answer, even a refusal, means the node is up.
//!
//! Every [`LEASE_READ_EVERY`] heartbeats the router also reads the node's liveness lease in
//! the metadata store (`crate::lease`): a failing heartbeat to a node whose lease has
//! lapsed makes it down at once.

use std::time::{Duration, Instant, SystemTime};

use crate::lease::{LeaseView, LeaseWatch};

/// Pause between heartbeats to a node that is up.
pub const EVERY_UP: Duration = Duration::from_millis(250);
/// Pause between heartbeats to a node that is down (so that its return is noticed quickly).
pub const EVERY_DOWN: Duration = Duration::from_millis(100);
/// Longest wait for a heartbeat's answer (or the router's timeout, if shorter).
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(750);
/// The same while the node is down: a connection attempt is given up and begun afresh this
/// often, so that a node coming back is found within about this long.
pub const HEARTBEAT_TIMEOUT_DOWN: Duration = Duration::from_millis(250);
/// Heartbeats failing for this long in a row (from the first failed one's sending to the
/// last one's failure) make a node down.
pub const DOWN_AFTER: Duration = Duration::from_millis(750);
/// Heartbeats failed in a row, at least, that make a node down (with [`DOWN_AFTER`]).
pub const FAILED_TO_DOWN: u32 = 2;
/// Heartbeats between two reads of the node's liveness lease in the metadata store.
pub const LEASE_READ_EVERY: u32 = 4;
/// How long a call to a node that is down waits for a heartbeat to find it back.
pub const WAIT_FOR_UP: Duration = Duration::from_millis(500);

/// A node's health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// No heartbeat has answered or failed long enough yet: calls go ahead.
    Unknown,
    Up,
    /// Down since `since` (when the first of the failed heartbeats was sent), for `reason`
    /// (the last failure).
    Down {
        since: SystemTime,
        at: Instant,
        reason: String,
    },
}

impl Health {
    /// "down since HH:MM:SS UTC (N.N s ago): reason", for messages; `None` unless down.
    pub fn describe_down(&self, now: Instant) -> Option<String> {
        let Health::Down { since, at, reason } = self else {
            return None;
        };
        Some(format!(
            "down since {} ({:.1} s ago): {reason}",
            clock_time(*since),
            now.saturating_duration_since(*at).as_secs_f64()
        ))
    }
}

/// `time` as `HH:MM:SS UTC`.
fn clock_time(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// One node's heartbeats so far.
#[derive(Debug)]
pub struct Liveness {
    health: Health,
    /// When the first of the heartbeats failing in a row was sent (by both clocks).
    failing_since: Option<(Instant, SystemTime)>,
    /// Heartbeats failed in a row.
    failed: u32,
    /// The node's liveness lease as read so far.
    lease: LeaseWatch,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            health: Health::Unknown,
            failing_since: None,
            failed: 0,
            lease: LeaseWatch::default(),
        }
    }
}

impl Liveness {
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The node's liveness lease, read at `now`: its revision, or `None` if it has none.
    pub fn lease_read(&mut self, revision: Option<crate::lease::Revision>, now: Instant) {
        self.lease.observe(revision, now);
    }

    /// The node's liveness lease as of `now`.
    pub fn lease(&self, now: Instant) -> LeaseView {
        self.lease.view(now)
    }

    /// A heartbeat was answered: the node is up. True if that changed its health.
    pub fn answered(&mut self) -> bool {
        self.failing_since = None;
        self.failed = 0;
        let changed = self.health != Health::Up;
        self.health = Health::Up;
        changed
    }

    /// A heartbeat sent at `sent` (`wall`: the same moment by the system clock) failed at
    /// `now` for `reason`. True if that changed the node's health.
    pub fn failed(
        &mut self,
        sent: Instant,
        wall: SystemTime,
        now: Instant,
        reason: String,
    ) -> bool {
        let (first, first_wall) = *self.failing_since.get_or_insert((sent, wall));
        self.failed = self.failed.saturating_add(1);
        match &mut self.health {
            Health::Down {
                reason: last_reason,
                ..
            } => {
                *last_reason = reason;
                false
            }
            _ if (self.failed >= FAILED_TO_DOWN
                && now.saturating_duration_since(first) >= DOWN_AFTER)
                || matches!(self.lease.view(now), LeaseView::Lapsed(_)) =>
            {
                self.health = Health::Down {
                    since: first_wall,
                    at: first,
                    reason,
                };
                true
            }
            _ => false,
        }
    }

    /// True while its last heartbeat failed (it is down, or may soon be).
    pub fn failing(&self) -> bool {
        self.failed > 0
    }

    /// The pause before the next heartbeat.
    pub fn pause(&self) -> Duration {
        match self.health {
            Health::Down { .. } => EVERY_DOWN,
            _ => EVERY_UP,
        }
    }

    /// How long the next heartbeat waits for its answer, at most.
    pub fn timeout(&self) -> Duration {
        match self.health {
            Health::Down { .. } => HEARTBEAT_TIMEOUT_DOWN,
            _ => HEARTBEAT_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_down_once_heartbeats_fail_long_enough_and_up_at_the_first_answer() {
        let mut node = Liveness::default();
        assert_eq!(node.health(), &Health::Unknown);
        assert!(node.answered());
        assert!(!node.answered());
        let t0 = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(3600 + 120 + 5);
        // One failed heartbeat (a lost packet, a slow moment): still up, even one that
        // failed for all of DOWN_AFTER.
        assert!(!node.failed(t0, wall, t0 + DOWN_AFTER, "slow".into()));
        assert_eq!(node.health(), &Health::Up);
        assert!(node.failing(), "failing, not down");
        assert_eq!(node.pause(), EVERY_UP);
        // Failing in a row for DOWN_AFTER, twice at least: down since the first failed one.
        let later = t0 + DOWN_AFTER + EVERY_UP + HEARTBEAT_TIMEOUT;
        assert!(node.failed(later - HEARTBEAT_TIMEOUT, wall, later, "no reply".into()));
        let down = node.health().describe_down(later + Duration::from_secs(1));
        assert_eq!(
            down.as_deref(),
            Some("down since 01:02:05 UTC (2.8 s ago): no reply")
        );
        assert_eq!(node.pause(), EVERY_DOWN);
        // Further failures change nothing but the reason.
        assert!(!node.failed(later, wall, later + EVERY_DOWN, "refused".into()));
        assert!(node
            .health()
            .describe_down(later)
            .is_some_and(|d| d.ends_with("refused")));
        // Back at the first answer; a new run of failures counts from its own start.
        assert!(node.answered());
        assert!(!node.failing());
        let t1 = later + Duration::from_secs(5);
        assert!(!node.failed(t1, wall, t1 + DOWN_AFTER / 2, "slow".into()));
        assert!(!node.failed(t1, wall, t1 + DOWN_AFTER / 2 + EVERY_UP, "slow".into()));
        assert_eq!(node.health(), &Health::Up);
    }

    /// A failing heartbeat to a node whose liveness lease has lapsed makes it down at once.
    #[test]
    fn a_lapsed_lease_and_a_failed_heartbeat_make_a_node_down_at_once() {
        let mut node = Liveness::default();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        node.answered();
        node.lease_read(Some(3), t0);
        let later = t0 + crate::lease::LEASE;
        node.lease_read(Some(3), later);
        assert!(matches!(node.lease(later), LeaseView::Lapsed(_)));
        // Its heartbeats still answer: up (it serves, though it cannot reach the store).
        assert_eq!(node.health(), &Health::Up);
        assert!(node.failed(later, wall, later + Duration::from_millis(1), "gone".into()));
        assert!(matches!(node.health(), Health::Down { .. }));
    }
}
