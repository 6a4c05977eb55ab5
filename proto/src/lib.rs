//! zr-proto: the cluster's protocol as pure functions over bytes and indices — no sockets, no
//! clock, no async runtime — so that every part of it is tested without a network.
//!
//! - [`wire`]: the two request protocols (client → router, router → node), the replies, and
//!   bounded decoding: a hostile message is an error, never a panic or an allocation bomb.
//! - [`assemble`]: a scattered gather put back in the caller's order, straight from the
//!   chunks the reply arrived in ([`chunks`]).
//! - [`placement`]: the cluster map (slot → shard) and the O(1) global ↔ (shard, local)
//!   mapping.

pub mod assemble;
pub mod chunks;
mod error;
pub mod placement;
pub mod wire;

pub use error::{Error, ErrorCode, Invalid};
