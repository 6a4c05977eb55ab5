//! zr-router: the cluster's router and its client library.
//!
//! - [`plan`] — pure planning: split a gather or an append by shard, reassemble in order.
//! - [`server`] — the router: placement snapshot, scatter/gather over QUIC, writes.
//! - `nodes` — the links to the nodes; `forward` — streamed gathers, shard by shard.
//! - [`client`] — [`Client`]: the store's operations against a router; `direct` — its
//!   gathers one hop, straight from the nodes.
//! - `restore` — a lost cluster record rebuilt from the nodes (`zr cluster restore-record`).

mod budget;
pub mod client;
mod direct;
mod error;
mod forward;
mod nodes;
mod restore;
pub mod server;
pub mod stream;

/// Planning, pure, shared with the client: below both, in `zr_coord`.
pub use zr_coord::plan;
use zr_coord::{catchup, liveness, moveplan, repair, startup};

pub use client::{AsyncClient, Client, ClientOptions};
pub use error::{Error, Failure};
pub use restore::{restore_record, Restored};
pub use server::Router;
pub use stream::{ClusterPacked, ClusterStream, ClusterWindows};
pub use zr_proto::wire::{
    DatasetInfo, DictRef, FieldDict, FieldInfo, MapChange, MoveReport, MOVE_RATE_DEFAULT,
};
