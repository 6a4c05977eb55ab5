//! What a router (or a client reading one hop) knows of its nodes, as one value without I/O:
//! each node's liveness, incarnation, length and address, whether this router wrote to it
//! since its last commit, the replica record, and until when write acknowledgments wait.
//!
//! [`Replicas::handle`] is told what happened — a heartbeat answered or failed, a connection
//! made to a node and the incarnation it gave, a write, a commit, the replica record read
//! from or written to the metadata store — and [`Replicas::poll`] hands out what to do about
//! it: mark a node behind, reach a node at a new address, publish a node's health or the
//! record, wake the catch-up task. The driver (`zr_router`'s `Nodes`) performs the effects
//! and reports their outcomes as events; every decision is made here, where a test can step
//! it on a clock of its own (`tests/pair.rs`).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::lease::{LeaseView, Revision, READ_LEASE_WAIT};
use crate::liveness::{Health, Liveness};
use crate::record::ReplicaRecord;

/// A node: its place among the links, `shard * replicas + replica`.
pub type NodeId = usize;

/// What happened, as the driver saw it.
#[derive(Clone, Debug)]
pub enum Event {
    /// A heartbeat to `node` was answered (a refusal too: the node is up), with the node's
    /// length if it gave one.
    Answered { node: NodeId, len: Option<u64> },
    /// A heartbeat to `node` sent at `sent` (`wall`: the same moment by the system clock)
    /// failed, for `reason`.
    Failed {
        node: NodeId,
        sent: Instant,
        wall: SystemTime,
        reason: String,
    },
    /// Any reply from `node`.
    Heard { node: NodeId },
    /// `node`'s liveness lease was read: its revision, `None` if it has none.
    LeaseRead {
        node: NodeId,
        revision: Option<Revision>,
    },
    /// A connection to `node` was made, before anything else went over it; the node is
    /// the process `incarnation`.
    Connected { node: NodeId, incarnation: u64 },
    /// This router wrote to `node` (not durable there until a commit).
    Wrote { node: NodeId },
    /// `node` made every write so far durable.
    Committed { node: NodeId },
    /// The replica record, as read from or written to the metadata store.
    Record(ReplicaRecord),
}

/// What the driver is to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Mark `node` behind in the metadata store (unless it is its shard's last replica in
    /// sync), then report the record written with [`Event::Record`].
    MarkBehind { node: NodeId, why: &'static str },
    /// Reach `node` at `addr` from now on: its connection is closed, and calls meanwhile
    /// wait for the new one.
    Retarget { node: NodeId, addr: SocketAddr },
    /// `node`'s health changed: tell those waiting on it.
    Health { node: NodeId, health: Health },
    /// Whether `node`'s last heartbeat failed changed.
    Failing { node: NodeId, failing: bool },
    /// The replica record reads go by from now on.
    Publish(Arc<ReplicaRecord>),
    /// A replica may want catching up (marked behind, moved, or back up).
    CatchUp,
    /// Something the operator should read, as it happened.
    Warn(String),
}

/// One node as known here.
#[derive(Debug)]
struct Node {
    shard: u32,
    replica: u32,
    /// Its address in nodes.toml.
    configured: SocketAddr,
    /// Where it is reached now (nodes.toml's address, or the one it was moved to).
    target: SocketAddr,
    liveness: Liveness,
    /// The incarnation its last new connection gave.
    incarnation: Option<u64>,
    /// Written to since its last commit: a restart may have lost those writes.
    written: bool,
    /// The length its last answer to a heartbeat gave.
    len: Option<u64>,
    /// When it last answered anything.
    last_seen: Option<Instant>,
    /// Whether its last heartbeat failed, as last told (see [`Effect::Failing`]).
    failing_told: bool,
}

impl Node {
    /// Shard `shard`'s replica `replica`, at `configured` in nodes.toml, reached at `target`:
    /// nothing known of it yet but from its heartbeats to come.
    fn new(shard: u32, replica: u32, configured: SocketAddr, target: SocketAddr) -> Node {
        Node {
            shard,
            replica,
            configured,
            target,
            liveness: Liveness::default(),
            incarnation: None,
            written: false,
            len: None,
            last_seen: None,
            failing_told: false,
        }
    }
}

/// Every node's state, and the replica record (see the module's description).
#[derive(Debug)]
pub struct Replicas {
    replicas: u32,
    nodes: Vec<Node>,
    record: Arc<ReplicaRecord>,
    /// Until when writes are not acknowledged.
    acks_after: Option<Instant>,
    effects: VecDeque<Effect>,
}

impl Replicas {
    /// No nodes yet, `replicas` per shard.
    pub fn new(replicas: u32) -> Replicas {
        Replicas {
            replicas: replicas.max(1),
            nodes: Vec::new(),
            record: Arc::new(ReplicaRecord::default()),
            acks_after: None,
            effects: VecDeque::new(),
        }
    }

    /// Adds shard `shard`'s replica `replica` at `addr` (nodes.toml's): nodes are added in
    /// (shard, replica) order, so its id is `shard * replicas + replica`. Refused out of order.
    pub fn add(&mut self, shard: u32, replica: u32, addr: SocketAddr) -> Result<NodeId, String> {
        let id = self.nodes.len();
        if id != (shard as usize) * self.replicas as usize + replica as usize
            || replica >= self.replicas
        {
            return Err(format!(
                "shard {shard} replica {replica} added as node {id}, out of (shard, replica) order"
            ));
        }
        self.nodes.push(Node::new(shard, replica, addr, addr));
        Ok(id)
    }

    /// Takes `event`, which happened at `now`; what follows from it waits in [`Self::poll`].
    /// An event about a node not added is ignored.
    pub fn handle(&mut self, event: Event, now: Instant) {
        match event {
            Event::Record(record) => self.take_record(record, now),
            Event::Answered { node, len } => {
                let Some(n) = self.nodes.get_mut(node) else {
                    return;
                };
                n.last_seen = Some(now);
                if len.is_some() {
                    n.len = len;
                }
                if n.liveness.answered() {
                    let health = n.liveness.health().clone();
                    self.effects.push_back(Effect::Health { node, health });
                    // Back up: it may have missed writes meanwhile.
                    self.effects.push_back(Effect::CatchUp);
                }
                self.tell_failing(node);
            }
            Event::Failed {
                node,
                sent,
                wall,
                reason,
            } => {
                let Some(n) = self.nodes.get_mut(node) else {
                    return;
                };
                if n.liveness.failed(sent, wall, now, reason) {
                    let health = n.liveness.health().clone();
                    self.effects.push_back(Effect::Health { node, health });
                }
                self.tell_failing(node);
            }
            Event::Heard { node } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.last_seen = Some(now);
                }
            }
            Event::LeaseRead { node, revision } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.liveness.lease_read(revision, now);
                }
            }
            Event::Connected { node, incarnation } => {
                let replicas = self.replicas;
                let in_sync = self.in_sync(node);
                let Some(n) = self.nodes.get_mut(node) else {
                    return;
                };
                let before = n.incarnation.replace(incarnation);
                let restarted = before.is_some_and(|before| before != incarnation);
                // It may have lost writes it had not made durable: it serves nothing until
                // it has caught up. (A shard's only replica has no partner to catch up from.)
                if restarted && n.written && replicas > 1 && in_sync {
                    self.effects.push_back(Effect::MarkBehind {
                        node,
                        why: "it restarted, losing writes it had not made durable",
                    });
                }
            }
            Event::Wrote { node } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.written = true;
                }
            }
            Event::Committed { node } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.written = false;
                }
            }
        }
    }

    /// The next thing to do, in the order decided.
    pub fn poll(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Queues an [`Effect::Failing`] if whether `node`'s last heartbeat failed is not what
    /// was told last.
    fn tell_failing(&mut self, node: NodeId) {
        let n = &mut self.nodes[node];
        let failing = n.liveness.failing();
        if std::mem::replace(&mut n.failing_told, failing) != failing {
            self.effects.push_back(Effect::Failing { node, failing });
        }
    }

    /// Takes `record` as the replica record (see [`Event::Record`]).
    fn take_record(&mut self, record: ReplicaRecord, now: Instant) {
        let before = Arc::clone(&self.record);
        let changed = *before != record;
        // A replica no longer in sync, or no longer at its address, may still serve clients
        // by itself until its read lease runs out: no write it misses is acknowledged before
        // then.
        let left = self.nodes.iter().any(|n| {
            let id = (n.shard, n.replica);
            (before.in_sync(id) && !record.in_sync(id))
                || before.moved_to(id) != record.moved_to(id)
        });
        if left {
            let until = now + READ_LEASE_WAIT;
            self.acks_after = Some(self.acks_after.map_or(until, |t| t.max(until)));
        }
        for (id, n) in self.nodes.iter_mut().enumerate() {
            let wanted = match record.moved_to((n.shard, n.replica)) {
                None => n.configured,
                Some(text) => match text.parse::<SocketAddr>() {
                    Ok(addr) => addr,
                    Err(e) => {
                        self.effects.push_back(Effect::Warn(format!(
                            "the replica record moves shard {} replica {} to '{text}', which is no address ({e}); it stays at {}",
                            n.shard, n.replica, n.target
                        )));
                        continue;
                    }
                },
            };
            if !record.in_sync((n.shard, n.replica)) {
                // Behind: it catches up whole, so writes it may have lost no longer matter.
                n.written = false;
            }
            if n.target == wanted {
                continue;
            }
            // Another node there: known afresh, from its heartbeats.
            *n = Node::new(n.shard, n.replica, n.configured, wanted);
            self.effects.push_back(Effect::Retarget {
                node: id,
                addr: wanted,
            });
            self.effects.push_back(Effect::Health {
                node: id,
                health: Health::Unknown,
            });
            self.effects.push_back(Effect::Failing {
                node: id,
                failing: false,
            });
        }
        self.record = Arc::new(record);
        self.effects
            .push_back(Effect::Publish(Arc::clone(&self.record)));
        if changed {
            self.effects.push_back(Effect::CatchUp);
        }
    }

    /// The replica record as last taken.
    pub fn record(&self) -> &Arc<ReplicaRecord> {
        &self.record
    }

    /// True unless `node` is marked behind.
    pub fn in_sync(&self, node: NodeId) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|n| self.record.in_sync((n.shard, n.replica)))
    }

    /// `node`'s health.
    pub fn health(&self, node: NodeId) -> Option<&Health> {
        self.nodes.get(node).map(|n| n.liveness.health())
    }

    /// Where `node` is reached now.
    pub fn target(&self, node: NodeId) -> Option<SocketAddr> {
        self.nodes.get(node).map(|n| n.target)
    }

    /// `node`'s address in nodes.toml.
    pub fn configured(&self, node: NodeId) -> Option<SocketAddr> {
        self.nodes.get(node).map(|n| n.configured)
    }

    /// The length `node` gave in its last answer to a heartbeat.
    pub fn len(&self, node: NodeId) -> Option<u64> {
        self.nodes.get(node).and_then(|n| n.len)
    }

    /// How long before `now` `node` last answered, if it ever did.
    pub fn last_seen(&self, node: NodeId, now: Instant) -> Option<Duration> {
        let seen = self.nodes.get(node)?.last_seen?;
        Some(now.saturating_duration_since(seen))
    }

    /// `node`'s liveness lease as read so far, as of `now`.
    pub fn lease(&self, node: NodeId, now: Instant) -> LeaseView {
        self.nodes
            .get(node)
            .map_or(LeaseView::Unknown, |n| n.liveness.lease(now))
    }

    /// The pause before `node`'s next heartbeat, and how long that one waits for its answer.
    pub fn heartbeat(&self, node: NodeId) -> (Duration, Duration) {
        self.nodes.get(node).map_or(
            (
                crate::liveness::EVERY_UP,
                crate::liveness::HEARTBEAT_TIMEOUT,
            ),
            |n| (n.liveness.pause(), n.liveness.timeout()),
        )
    }

    /// Until when writes are not acknowledged: a replica seen to leave the in-sync set, or
    /// its address, may serve clients by itself until its read lease runs out.
    pub fn acks_after(&self) -> Option<Instant> {
        self.acks_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Two shards of two replicas, at ports 7000 + node.
    fn two_by_two() -> Replicas {
        let mut state = Replicas::new(2);
        for node in 0..4u32 {
            state
                .add(node / 2, node % 2, addr(7000 + node as u16))
                .unwrap();
        }
        state
    }

    /// Connected to `node`'s process `incarnation`.
    fn connect(state: &mut Replicas, node: NodeId, incarnation: u64, now: Instant) {
        state.handle(Event::Connected { node, incarnation }, now);
    }

    fn drain(state: &mut Replicas) -> Vec<Effect> {
        std::iter::from_fn(|| state.poll()).collect()
    }

    #[test]
    fn nodes_are_added_in_shard_and_replica_order_only() {
        let mut state = Replicas::new(2);
        assert!(state.add(0, 1, addr(1)).is_err());
        assert_eq!(state.add(0, 0, addr(1)), Ok(0));
        assert!(state.add(0, 2, addr(2)).is_err(), "no third replica");
        assert_eq!(state.add(0, 1, addr(2)), Ok(1));
        assert_eq!(state.add(1, 0, addr(3)), Ok(2));
    }

    /// Node `node` connected as incarnation `first`, written to, committed if `committed`,
    /// then connected again as `then`: the effects.
    fn reconnected(
        state: &mut Replicas,
        node: NodeId,
        (first, then): (u64, u64),
        committed: bool,
    ) -> Vec<Effect> {
        let t = Instant::now();
        connect(state, node, first, t);
        state.handle(Event::Wrote { node }, t);
        if committed {
            state.handle(Event::Committed { node }, t);
        }
        connect(state, node, then, t);
        drain(state)
    }

    #[test]
    fn a_restart_after_writes_not_made_durable_marks_the_node_behind() {
        let mut state = two_by_two();
        // Reconnected to the same process: nothing lost.
        assert_eq!(reconnected(&mut state, 1, (5, 5), false), vec![]);
        // Another process, before a commit: it may have lost the write.
        let why = "it restarted, losing writes it had not made durable";
        let effects = reconnected(&mut state, 1, (5, 6), false);
        assert_eq!(effects, vec![Effect::MarkBehind { node: 1, why }]);
        // Committed first: a restart loses nothing.
        assert_eq!(reconnected(&mut state, 0, (1, 2), true), vec![]);
    }

    #[test]
    fn a_shard_with_one_replica_is_never_marked_behind() {
        let mut state = Replicas::new(1);
        state.add(0, 0, addr(1)).unwrap();
        assert_eq!(reconnected(&mut state, 0, (1, 2), false), vec![]);
    }

    #[test]
    fn a_replica_leaving_the_in_sync_set_holds_acknowledgments_for_a_read_lease() {
        let mut state = two_by_two();
        let t = Instant::now();
        assert_eq!(state.acks_after(), None);
        let behind = ReplicaRecord::default().with_behind((1, 1), 2).unwrap();
        state.handle(Event::Record(behind.clone()), t);
        assert_eq!(state.acks_after(), Some(t + READ_LEASE_WAIT));
        assert!(!state.in_sync(3) && state.in_sync(2));
        let effects = drain(&mut state);
        assert_eq!(
            effects,
            vec![Effect::Publish(Arc::new(behind.clone())), Effect::CatchUp]
        );
        // The same record again changes nothing; catching up holds nothing.
        let later = t + Duration::from_secs(10);
        state.handle(Event::Record(behind), later);
        assert_eq!(state.acks_after(), Some(t + READ_LEASE_WAIT));
        assert!(!drain(&mut state).contains(&Effect::CatchUp));
        state.handle(Event::Record(ReplicaRecord::default()), later);
        assert_eq!(state.acks_after(), Some(t + READ_LEASE_WAIT));
    }

    #[test]
    fn a_moved_replica_is_reached_at_its_new_address_and_known_afresh() {
        let mut state = two_by_two();
        let t = Instant::now();
        state.handle(
            Event::Answered {
                node: 0,
                len: Some(7),
            },
            t,
        );
        connect(&mut state, 0, 3, t);
        drain(&mut state);
        let moved = ReplicaRecord::default()
            .with_moved((0, 0), 2, "127.0.0.1:9000")
            .unwrap();
        state.handle(Event::Record(moved.clone()), t);
        let effects = drain(&mut state);
        assert_eq!(
            effects[0],
            Effect::Retarget {
                node: 0,
                addr: addr(9000)
            }
        );
        assert!(effects.contains(&Effect::Health {
            node: 0,
            health: Health::Unknown
        }));
        assert_eq!((state.target(0), state.len(0)), (Some(addr(9000)), None));
        assert_eq!(state.configured(0), Some(addr(7000)));
        assert_eq!(state.acks_after(), Some(t + READ_LEASE_WAIT));
        // Taken again, it stays; a record that is no address leaves the node where it is.
        state.handle(Event::Record(moved), t);
        assert!(!drain(&mut state)
            .iter()
            .any(|e| matches!(e, Effect::Retarget { .. })));
        let mut bad = ReplicaRecord::default();
        bad.moved.push(crate::record::Moved {
            shard: 1,
            replica: 0,
            addr: "nowhere".into(),
        });
        state.handle(Event::Record(bad), t);
        let effects = drain(&mut state);
        assert!(
            effects
                .iter()
                .any(|e| matches!(e, Effect::Warn(m) if m.contains("'nowhere'"))),
            "{effects:?}"
        );
        assert_eq!(state.target(2), Some(addr(7002)));
        // Back where nodes.toml has it.
        assert_eq!(state.target(0), Some(addr(7000)));
    }

    #[test]
    fn heartbeats_publish_health_and_failing_only_when_they_change() {
        let mut state = two_by_two();
        let t = Instant::now();
        let wall = SystemTime::now();
        state.handle(
            Event::Answered {
                node: 2,
                len: Some(4),
            },
            t,
        );
        let up = Effect::Health {
            node: 2,
            health: Health::Up,
        };
        assert_eq!(drain(&mut state), vec![up.clone(), Effect::CatchUp]);
        state.handle(Event::Answered { node: 2, len: None }, t);
        assert_eq!(drain(&mut state), vec![]);
        assert_eq!(state.len(2), Some(4));
        let fail = |at: Instant| Event::Failed {
            node: 2,
            sent: at,
            wall,
            reason: "no reply".into(),
        };
        state.handle(fail(t), t + Duration::from_millis(750));
        assert_eq!(
            drain(&mut state),
            vec![Effect::Failing {
                node: 2,
                failing: true
            }]
        );
        let later = t + crate::liveness::DOWN_AFTER;
        state.handle(fail(later), later + Duration::from_millis(1));
        let effects = drain(&mut state);
        assert!(
            matches!(
                &effects[..],
                [Effect::Health {
                    node: 2,
                    health: Health::Down { .. }
                }]
            ),
            "{effects:?}"
        );
        assert_eq!(state.heartbeat(2).0, crate::liveness::EVERY_DOWN);
        state.handle(Event::Answered { node: 2, len: None }, later);
        assert_eq!(
            drain(&mut state),
            vec![
                up,
                Effect::CatchUp,
                Effect::Failing {
                    node: 2,
                    failing: false
                }
            ]
        );
        assert_eq!(
            state.last_seen(2, later + Duration::from_secs(1)),
            Some(Duration::from_secs(1))
        );
        // Events about nodes never added change nothing.
        state.handle(
            Event::Answered {
                node: 99,
                len: None,
            },
            later,
        );
        assert_eq!(drain(&mut state), vec![]);
    }
}
