//! zr-coord: what the router decides, as values without I/O. A driver (the router's `Nodes`,
//! a client's one-hop links) tells them what happened and performs what they answer; tests
//! step them on a clock of their own.
//!
//! - [`replicas`] — each node's liveness, incarnation and address, the replica record, and
//!   when write acknowledgments may go: [`Replicas`], `handle(event, now)` / `poll()`.
//! - [`liveness`] — one node's heartbeats and the health they give.
//! - [`lease`] — the nodes' liveness leases as an observer judges them; the read lease's terms.
//! - [`record`] — the replica record: which replicas are behind, and which were moved.
//! - [`plan`] — a gather split by shard, for the router and for a client reading one hop.

pub mod lease;
pub mod liveness;
pub mod plan;
pub mod record;
pub mod replicas;

pub use record::ReplicaRecord;
pub use replicas::{Effect, Event, NodeId, Replicas};
