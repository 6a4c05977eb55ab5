//! zr-shard: the shard server — a node of a zrecord cluster (the `zr-node` process).
//!
//! A node holds one replica of one shard: its datasets (the default one and each named
//! one, see [`catalog`]) as stores of the engine (`zr_node`), served over QUIC with the
//! `zr_proto::wire` protocol ([`server`]). Around the stores it keeps what a cluster needs
//! and a single host does not: which shard and replica of which cluster the data directory
//! holds ([`identity`]), the writer fence that refuses writes from a lease holder that lost
//! its lease ([`fence`]), a shard move's next-map copy and switch ([`stage`]), and whether
//! gathers are served from memory ([`warm`]).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod catalog;
pub mod fence;
pub mod filesystem;
pub mod identity;
pub mod server;
pub mod ship;
pub mod stage;
#[cfg(test)]
mod testkit;
pub mod upgrade;
mod warm;
