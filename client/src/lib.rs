//! zr-client: a cluster's client library — what a training job links to read and write a
//! cluster, without the router's server.
//!
//! - [`Client`] and [`AsyncClient`] (`api/`): the store's operations against a router; its
//!   gathers go one hop, straight from the nodes (`direct`), where the router allows.
//! - [`stream`]: token streams in a cluster — [`ClusterStream`], its windows and packed rows.
//!
//! Below both the client and the router (which builds on this crate):
//! - [`nodes`] — links to the nodes, their heartbeats, and what is known of them, told to
//!   `zr_coord::Replicas` and its effects performed;
//! - [`forward`] — a gather's parts read from the nodes, failed over between replicas, and
//!   passed on frame by frame, or placed straight into a one-hop gather's batch (`place`);
//!   [`budget`] — the router's reply budget for them;
//! - [`error`] — why an operation failed ([`Failure`], with its wire code) and what calls
//!   return ([`Error`]);
//! - [`plan`] (from `zr_coord`) — a gather split by shard.

mod api;
pub mod budget;
mod direct;
pub mod error;
pub mod forward;
pub mod nodes;
mod place;
pub mod stream;

use zr_coord::liveness;
pub use zr_coord::plan;

pub use api::{AsyncClient, Client, ClientOptions};
pub use error::{Error, Failure};
pub use stream::{ClusterPacked, ClusterStream, ClusterWindows};
pub use zr_proto::wire::{
    DatasetInfo, DictRef, FieldDict, FieldInfo, Grant, MapChange, MoveReport, MOVE_RATE_DEFAULT,
};
