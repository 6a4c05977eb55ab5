//! The protocol's errors: what a message, a map or a peer's answer can get wrong.

use serde::{Deserialize, Serialize};

/// Stable error codes: what crosses the wire in an error reply, so that a caller can act on
/// it without parsing the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The request is malformed or breaks a limit.
    BadRequest,
    /// An index is out of range.
    IndexOutOfRange,
    /// A field name is unknown.
    UnknownField,
    /// The storage failed (I/O).
    Storage,
    /// A shard could not be reached or did not answer in time.
    Unavailable,
    /// The request conflicts with the current state (e.g. a node out of step).
    Conflict,
    /// The peer speaks another protocol version.
    Version,
    /// A stored record, or a file of the dataset, is damaged (a CRC mismatch, an entry out
    /// of bounds): the data, not the request, is at fault.
    CorruptRecord,
    /// The request was placed by another version of the cluster map than the node serves.
    StaleMap,
    /// The node's data belongs to another cluster.
    WrongCluster,
    /// The sender's role does not allow the request.
    Forbidden,
    /// The request was meant for another shard or replica than the node serves.
    WrongShard,
    /// The dataset the request names does not exist (never made, or dropped).
    NoSuchDataset,
    /// A node asked by a client does not know itself in sync with its partners (marked
    /// behind, or cut off from the metadata store): read elsewhere, or through the router.
    NotInSync,
    /// Grants exist (`zr grant`) and none of the sender's certificate name covers the
    /// dataset: its role allows the request, on other datasets.
    NotGranted,
}

impl ErrorCode {
    /// A short name, for logs and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::IndexOutOfRange => "index_out_of_range",
            ErrorCode::UnknownField => "unknown_field",
            ErrorCode::Storage => "storage",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Version => "version",
            ErrorCode::CorruptRecord => "corrupt_record",
            ErrorCode::StaleMap => "stale_map",
            ErrorCode::WrongCluster => "wrong_cluster",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NoSuchDataset => "no_such_dataset",
            ErrorCode::NotInSync => "not_in_sync",
            ErrorCode::WrongShard => "wrong_shard",
            ErrorCode::NotGranted => "not_granted",
        }
    }
}

/// A name or a storage a caller wrote that breaks the rules it must follow (what it says
/// is what was written, escaped for printing).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Invalid {
    #[error("dataset name '{0}' must be 1-{max} characters of [a-z0-9._-], starting with a letter or digit", max = crate::wire::DATASET_NAME_BYTES_MAX)]
    DatasetName(String),
    #[error("zstd level '{0}' is not a whole number from 1 to 22")]
    ZstdLevel(String),
    #[error("unknown compression '{0}' (expected raw, flate, zstd or zstd:LEVEL)")]
    Compression(String),
}

impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Error {
        Error::Malformed(invalid.to_string())
    }
}

/// Errors of the protocol crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A message that breaks the protocol: truncated, over a limit, inconsistent.
    #[error("protocol: {0}")]
    Malformed(String),
    /// A message of another protocol version.
    #[error("protocol: unsupported protocol version {theirs} (this build speaks {ours})")]
    Version { theirs: u16, ours: u16 },
    /// A cluster map that cannot be used.
    #[error("placement: {0}")]
    Placement(String),
    /// The peer answered with an error.
    #[error("{message}")]
    Remote { code: ErrorCode, message: String },
}

impl Error {
    /// The code this error crosses the wire with, when a process passes it on.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Malformed(_) | Error::Placement(_) => ErrorCode::BadRequest,
            Error::Version { .. } => ErrorCode::Version,
            Error::Remote { code, .. } => *code,
        }
    }
}
