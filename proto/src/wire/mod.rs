//! The wire protocol between clients, routers and nodes: one request and one reply per QUIC
//! bidirectional stream.
//!
//! ```text
//! message = "ZRW1" | version u16 | kind u16 | header_len u32 | header (bincode) | body
//! ```
//! The body carries payloads columnar: for each field, that field's payloads back to back
//! (F pieces after one header holding every length), never one message per record. Every
//! decode is bounded — header size, counts and lengths checked against limits and against the
//! body before anything is allocated from them — so a hostile or corrupt message is an error,
//! not a panic or an allocation bomb.

use bincode::Options;
use serde::{Deserialize, Serialize};

use crate::chunks::Chunks;
pub use crate::error::ErrorCode;
use crate::error::{Error, Invalid};
use crate::placement::Run;

/// Protocol version spoken by this build.
pub const WIRE_VERSION: u16 = 17;

/// Most records one `Digest` request covers.
pub const DIGEST_RECORDS_MAX: u64 = 1 << 20;
const MAGIC: [u8; 4] = *b"ZRW1";
const PREFIX_BYTES: usize = 12;
/// Longest header accepted.
pub const HEADER_BYTES_MAX: usize = 64 << 20;
/// Longest message accepted (header and body).
pub const MESSAGE_BYTES_MAX: usize = 1 << 30;
/// Most records one gather or append may carry.
pub const RECORDS_MAX: usize = 1 << 20;
/// Most fields one message may name.
pub const FIELDS_MAX: usize = 256;
/// Most nodes a request may name.
pub const NODES_MAX: usize = 1 << 16;
/// Most bytes of a certificate name (`zr cluster issue --name`) a request may carry.
pub const CERT_NAME_BYTES_MAX: usize = 64;
/// Longest cluster id a node request may carry.
pub const CLUSTER_ID_BYTES_MAX: usize = 128;
/// Longest dataset name (see [`check_dataset_name`]).
pub const DATASET_NAME_BYTES_MAX: usize = 64;
/// Largest zstd dictionary a cluster's dataset may have (zstd trains 110 KiB by default):
/// it is kept in the metadata store, whose requests etcd bounds to 1.5 MiB by default, and
/// a value crosses etcd's gateway base64-encoded twice.
pub const DICT_BYTES_MAX: usize = 512 << 10;
/// Largest piece of a file one `ShipRead` asks for.
pub const SHIP_PIECE_MAX: usize = 16 << 20;
/// Bytes a second each node gaining slots in a move copies their files at, unless the
/// operator says otherwise (`zr cluster add-shard --max-rate`): a move is not urgent, and
/// the cluster's readers keep most of the machines meanwhile (a rebuild of a lost replica
/// is not paced). Measured with every process on two shared cores (`move_bench`), gathers
/// kept 0.86× their rate at 64 MiB/s, 0.73-0.79× at 96 and 0.64-0.72× at 128.
pub const MOVE_RATE_DEFAULT: u64 = 64 << 20;
/// Longest node address a request names.
pub const ADDR_BYTES_MAX: usize = 256;
/// The dataset a request that names none addresses: the one `zr cluster-init` made.
pub const DEFAULT_DATASET: &str = "default";
/// Longest a wait for records not committed yet may be (`WaitLen`'s `wait_ms`).
pub const WAIT_MS_MAX: u32 = 3_600_000;

/// Checks a dataset name: `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn check_dataset_name(name: &str) -> Result<(), Invalid> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c));
    if !first_ok || !rest_ok || name.len() > DATASET_NAME_BYTES_MAX {
        return Err(Invalid::DatasetName(name.escape_debug().to_string()));
    }
    Ok(())
}

mod check;
mod client;
mod fields;
mod frame;
mod node;
mod reply;
#[cfg(test)]
mod tests;

pub use check::split_columns;
use check::*;
pub use client::*;
pub use fields::*;
pub use frame::*;
pub use node::*;
pub use reply::*;
