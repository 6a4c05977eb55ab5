//! zr-coord: what the router decides, as values without I/O. A driver (the router's `Nodes`,
//! a client's one-hop links) tells them what happened and performs what they answer; tests
//! step them on a clock of their own.
//!
//! - [`admission`] — whether a client's request is carried out: revoked, its role, its
//!   grants, a self-revocation; and what the audit log keeps.
//! - [`replicas`] — each node's liveness, incarnation and address, the replica record, and
//!   when write acknowledgments may go: [`Replicas`], `handle(event, now)` / `poll()`.
//! - [`liveness`] — one node's heartbeats and the health they give.
//! - [`lease`] — the nodes' liveness leases as an observer judges them; the read lease's terms.
//! - [`record`] — the replica record: which replicas are behind, and which were moved.
//! - [`cluster`] — the cluster record: map, datasets, fields, committed lengths, moves.
//! - [`coordinator`] — what a router knows and decides, as one value: the move it runs, the
//!   catch-ups running, the revision of the record whose datasets it follows, and each
//!   dataset it serves.
//! - [`dataset`] — one dataset as a router knows it: its fields, lengths, writer lease, and
//!   whether dropped.
//! - [`lengths`] — one dataset's lengths: served, committed, rewritten since, the shards
//!   missing data; and whether a commit is stored, unchanged or refused.
//! - [`datasets`] — what a node lacks of the record's datasets, or holds that it dropped.
//! - [`writer`] — the writer lease's state machine and the record of a write in progress.
//! - [`repair`] — an interrupted write's repair, as actions, from the replicas' lengths.
//! - [`startup`] — whether a starting router serves the stored record, makes the first one,
//!   or refuses, naming the cure.
//! - [`moveplan`] — a move's next step from the cluster record; the copy pass of each node.
//! - [`moving`] — the move a router runs, as its commands report it: started once per change,
//!   its copy counted, how it ended, how a recorded move reads.
//! - [`catchup`] — how a behind replica is caught up, and how a copy of files is going.
//! - [`failover`] — a shard's part of a gather read from its replicas in turn: the order,
//!   who is passed over, and a reply that failed midway gone on with from another.
//! - [`onehop`] — a client's one-hop gather refused by a node: ask again, gather again, hand
//!   it to the router, or fail.
//! - [`scrub`] — a scrub's verdict on a range of records from each replica's digest: the
//!   copies to replace, and from which, and the records no replica holds intact.
//! - [`status`] — a node as `zr cluster status` shows it: up, behind, refused or down.
//! - [`plan`] — a gather split by shard, for the router and for a client reading one hop.

pub mod admission;
pub mod catchup;
pub mod cluster;
pub mod coordinator;
pub mod dataset;
pub mod datasets;
pub mod failover;
pub mod lease;
pub mod lengths;
pub mod liveness;
pub mod moveplan;
pub mod moving;
pub mod onehop;
pub mod plan;
pub mod record;
pub mod repair;
pub mod replicas;
pub mod scrub;
pub mod startup;
pub mod status;
pub mod writer;

pub use coordinator::{Coordinator, DatasetKey};
pub use record::ReplicaRecord;
pub use replicas::{Effect, Event, NodeId, Replicas};
