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

    /// A gather, modify or delete named a record outside a unit other than 0 (see
    /// `unit`); `len` is 0 for a unit the dataset does not have.
    #[error("record {index} of unit {unit} is out of range: the unit holds {len} records")]
    UnitIndexOutOfRange { unit: u32, index: u64, len: u64 },

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
    #[error(
        "{path}: unsupported format version {found} (this build reads versions up to {supported})"
    )]
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

/// Longest field name accepted (names become file names).
pub const FIELD_NAME_MAX: usize = 128;

/// Why a description — a field, a NumPy type, a dataset's settings, a token stream's
/// element — is unusable: which rule it breaks, and where (`In` names the field or component).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A storage that is not raw, flate, zstd or zstd:LEVEL.
    #[error(transparent)]
    Storage(#[from] zr_proto::Invalid),
    #[error("a level or a dictionary is for zstd fields, and it is stored {storage}")]
    NotZstd { storage: String },
    #[error("zstd level must be 1 to 22")]
    ZstdLevel,
    #[error("field name '{0}' must be 1-{max} characters of [A-Za-z0-9_.-], not starting with '.'", max = FIELD_NAME_MAX)]
    FieldName(String),
    #[error("dtype '{0}' is not a NumPy type string (e.g. <f4, |u1, <i8)")]
    Dtype(String),
    #[error("shape {0:?} overflows a record length")]
    ShapeOverflow(Vec<u64>),
    #[error("records of {0} bytes exceed the 4 GiB record limit")]
    RecordTooLarge(u64),
    #[error("a dataset needs at least one field")]
    NoFields,
    #[error("field '{0}' is given twice")]
    FieldTwice(String),
    #[error("{setting} must be at least {min}")]
    TooSmall { setting: &'static str, min: u64 },
    #[error("chunk ids not strictly increasing ({0} then {1})")]
    ChunkOrder(u32, u32),
    #[error("unit ids not strictly increasing ({0} then {1})")]
    UnitOrder(u32, u32),
    #[error("unit {0} is past the largest unit id")]
    UnitId(u32),
    #[error("length {0} is not the sum of the units' lengths")]
    UnitLengths(u64),
    #[error("chunk {id} belongs to unit {unit}, which the dataset does not have")]
    ChunkUnit { id: u32, unit: u32 },
    #[error("chunk {id} holds {records} records, more than chunk_records {max}")]
    ChunkOverfull { id: u32, records: u64, max: u64 },
    #[error("an element needs at least its token component")]
    NoToken,
    #[error("the token component '{name}' is {dtype}: tokens are uint16 (<u2) or uint32 (<u4)")]
    TokenType { name: String, dtype: String },
    #[error("element component '{0}' appears twice")]
    ComponentTwice(String),
    #[error(
        "element component '{name}' is big-endian ({dtype}); streams store little-endian values"
    )]
    BigEndian { name: String, dtype: String },
    #[error("an element of {bytes} bytes is larger than the {max} allowed")]
    ElementTooLarge { bytes: u64, max: u64 },
    /// A rule broken by one field or component, named here.
    #[error("{what}: {source}")]
    In {
        what: String,
        #[source]
        source: Box<SchemaError>,
    },
}

impl SchemaError {
    /// `self`, said of `what` (a field, a component).
    pub fn of(self, what: impl Into<String>) -> SchemaError {
        SchemaError::In {
            what: what.into(),
            source: Box::new(self),
        }
    }
}

impl From<SchemaError> for Error {
    fn from(e: SchemaError) -> Error {
        Error::InvalidSchema(e.to_string())
    }
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
