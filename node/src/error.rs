//! The engine's error type: one enum whose variants a caller can act on, each message naming
//! the thing that is wrong (the index and N, the field, the file).

use std::io;
use std::path::{Path, PathBuf};

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A gather, modify or delete named an index outside `[0, len)`.
    #[error("index {index} is out of range: the dataset holds {len} records")]
    IndexOutOfRange { index: u64, len: u64 },

    /// A field name the dataset does not have.
    #[error("unknown field '{name}' (the dataset has: {known})")]
    UnknownField { name: String, known: String },

    /// The schema given to `create` is unusable.
    #[error("invalid schema: {0}")]
    InvalidSchema(String),

    /// A record handed to append/modify does not fit the schema.
    #[error("invalid record: {0}")]
    InvalidRecord(String),

    /// The directory is not a dataset (no or unreadable meta.json).
    #[error("{path}: not a zrecord dataset: {reason}")]
    NotADataset { path: PathBuf, reason: String },

    /// An input file (for conversion) is malformed.
    #[error("{path}: {reason}")]
    InvalidInput { path: PathBuf, reason: String },

    /// The dataset was written by a format version this build cannot read.
    #[error("{path}: unsupported format version {found} (this build reads version {supported})")]
    UnsupportedVersion {
        path: PathBuf,
        found: u64,
        supported: u32,
    },

    /// A file of the dataset contradicts what meta.json commits.
    #[error("{path}: corrupt dataset: {reason}")]
    Corrupt { path: PathBuf, reason: String },

    /// One record's stored bytes are bad (entry out of bounds, frame damaged, CRC mismatch).
    #[error("field '{field}', record {index}: {reason}")]
    BadRecord {
        field: String,
        index: u64,
        reason: String,
    },

    /// `create` was pointed at a directory that already holds something.
    #[error("{path} already exists and is not empty")]
    AlreadyExists { path: PathBuf },

    /// Another process holds the dataset lock.
    #[error("{path}: the dataset is locked by another process ({why})")]
    Locked { path: PathBuf, why: &'static str },

    /// A write was attempted on a store opened read-only.
    #[error("{path}: the dataset is open read-only")]
    ReadOnly { path: PathBuf },

    /// A conversion's destination outside the engine (a cluster, through its router)
    /// refused or failed an operation.
    #[error("cluster: {0}")]
    Cluster(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// An operating-system call failed; `op` says what was being done to `path`.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches "what was being done to which file" to an `io::Error`.
pub trait IoContext<T> {
    fn ctx(self, op: &'static str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, op: &'static str, path: &Path) -> Result<T> {
        self.map_err(|source| Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        })
    }
}
