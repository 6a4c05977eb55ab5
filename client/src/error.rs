//! The router's errors. [`Failure`] is why one operation failed inside the router; it
//! reaches the client as its stable code and its message. [`Error`] is what the router's and
//! the client library's calls return.

use std::net::SocketAddr;
use std::sync::Arc;

use zr_proto::ErrorCode;

/// Why a router operation failed. Each names the shard and address where one is involved.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// A shard's node could not be reached, did not answer in time, or broke the protocol.
    #[error("shard {shard} at {addr}: {reason}")]
    ShardUnavailable {
        shard: u32,
        addr: SocketAddr,
        reason: String,
    },
    /// A shard's node refused the request with an error of its own.
    #[error("shard {shard}: {message}")]
    ShardRefused {
        shard: u32,
        code: ErrorCode,
        message: String,
    },
    /// An index at or past the cluster's length.
    #[error("index {index} is out of range: the dataset holds {len} records")]
    OutOfRange { index: u64, len: u64 },
    /// Other routers' writes kept the cluster's write lease busy.
    #[error("other routers' writes kept the cluster busy for {waited_ms} ms ({reason})")]
    Busy { waited_ms: u128, reason: String },
    /// The write lease would run out before a write could finish: it stopped before writing.
    #[error("the write took too long: the cluster's write lease runs out within {timeout_ms} ms, so it stopped before writing to shard {shard}")]
    LeaseRunningOut { shard: u32, timeout_ms: u128 },
    /// A request the router cannot carry out as asked.
    #[error("{0}")]
    BadRequest(String),
    /// A shard's node holds fewer records than the cluster has committed on it: its data
    /// directory is empty, another one, or damaged. It is refused, never taken as a short
    /// shard, and nothing is cut from the others.
    #[error("shard {shard} at {addr} holds {holds} records but cluster {cluster} has committed {committed} on it: its data is missing (a wiped or wrong data directory?); it is refused until its directory is restored or rebuilt")]
    MissingData {
        shard: u32,
        addr: SocketAddr,
        holds: u64,
        committed: u64,
        cluster: String,
    },
    /// The metadata store failed or could not be reached; its own error is the source.
    #[error("{0}")]
    Store(#[source] Arc<zr_meta::Error>),
    /// A shard has no replica in sync: nothing reads from or writes to it until one is.
    #[error("{}", match .shard { Some(shard) => format!("shard {shard} has no replica in sync"), None => "a shard has no replica in sync".to_string() })]
    NoReplicaInSync { shard: Option<u32> },
    /// The write lease lapsed, or another router took it, before the write was recorded.
    #[error("{0}")]
    LeaseLost(String),
    /// A record of the metadata store kept changing under this router's compare-and-swap
    /// (other routers writing it): nothing was recorded; try again.
    #[error("{0}")]
    Contended(String),
    /// The cluster's record, or the copies of a shard, contradict what this router needs
    /// (a map it cannot place, an address it cannot read, a move that is not there, no good
    /// copy to repair from).
    #[error("{0}")]
    Inconsistent(String),
    /// A failure, and what the router was doing when it happened.
    #[error("{doing}: {failure}")]
    While {
        doing: String,
        failure: Box<Failure>,
    },
    /// The sender's certificate is of a role that may not make the request.
    #[error("{request} needs the {needs} role; this connection's certificate is of the {has} role (an operator issues one with `zr cluster issue --role {needs} --name NAME`)")]
    Forbidden {
        request: &'static str,
        needs: &'static str,
        has: String,
    },
    /// No grant of the sender's certificate name covers the dataset (`zr grant`).
    #[error("the certificate named '{who}' has no grant to {doing} dataset '{dataset}' (an operator grants it with `zr grant {who} {doing} {dataset}`)")]
    NotGranted {
        who: String,
        doing: &'static str,
        dataset: String,
    },
    /// The sender's certificate was revoked (`zr cluster revoke`).
    #[error("{why}")]
    Revoked { why: String },
    /// A delete that failed after it was recorded: the next write finishes it.
    #[error("{0}; the delete is recorded, and the next write through any router finishes it")]
    DeleteRecorded(Box<Failure>),
    /// The request names a dataset the cluster does not have.
    /// It names no other dataset: a caller learns which datasets exist from the listing
    /// its role may read, not from an error.
    #[error("the cluster has no dataset '{name}' (never created, or dropped; `zr dataset list` shows those it has)")]
    NoSuchDataset { name: String },
    /// The request conflicts with the cluster's state (a dataset or field that exists, a
    /// move under way).
    #[error("{0}")]
    Conflict(String),
    /// A consumer waited for records that were not committed in time.
    #[error("waited {waited_ms} ms for {needed} records to be committed; dataset '{dataset}' has {committed}")]
    WaitedOut {
        dataset: String,
        waited_ms: u32,
        needed: u64,
        committed: u64,
    },
}

impl From<zr_meta::Error> for Failure {
    fn from(e: zr_meta::Error) -> Failure {
        Failure::Store(Arc::new(e))
    }
}

impl Failure {
    /// The code the failure reaches the client with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Failure::ShardUnavailable { .. }
            | Failure::LeaseRunningOut { .. }
            | Failure::MissingData { .. }
            | Failure::Store(_)
            | Failure::NoReplicaInSync { .. }
            | Failure::LeaseLost(_)
            | Failure::Contended(_)
            | Failure::Inconsistent(_) => ErrorCode::Unavailable,
            Failure::ShardRefused { code, .. } => *code,
            Failure::OutOfRange { .. } | Failure::WaitedOut { .. } => ErrorCode::IndexOutOfRange,
            Failure::NoSuchDataset { .. } => ErrorCode::NoSuchDataset,
            Failure::Conflict(_) => ErrorCode::Conflict,
            Failure::Busy { .. } => ErrorCode::Conflict,
            Failure::BadRequest(_) => ErrorCode::BadRequest,
            Failure::Forbidden { .. } | Failure::Revoked { .. } => ErrorCode::Forbidden,
            Failure::NotGranted { .. } => ErrorCode::NotGranted,
            Failure::While { failure, .. } | Failure::DeleteRecorded(failure) => failure.code(),
        }
    }

    /// `self`, noted as having happened while `doing`.
    pub fn while_(self, doing: impl Into<String>) -> Failure {
        Failure::While {
            doing: doing.into(),
            failure: Box::new(self),
        }
    }
}

/// Errors of the router and the client library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Connecting or talking to a peer failed: timeouts, refused certificates, broken links.
    #[error(transparent)]
    Net(#[from] zr_net::Error),
    /// A message broke the protocol, or the router answered with an error (its code in
    /// [`zr_proto::Error::Remote`]).
    #[error(transparent)]
    Proto(#[from] zr_proto::Error),
    /// The router could not carry out an operation.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// Connecting or talking to the router failed.
    #[error("router {0}")]
    Router(#[source] zr_net::Error),
    /// A record names a field the dataset does not have (checked before it is sent).
    #[error("unknown field '{name}' (the dataset has: {known})")]
    UnknownField { name: String, known: String },
    /// The metadata store failed or could not be reached.
    #[error(transparent)]
    Meta(#[from] zr_meta::Error),
    /// nodes.toml and the cluster's stored map disagree: applying it would re-map the data.
    #[error("nodes.toml says {key} = {given} but the cluster's map (version {version}, in {store}) has {key} = {stored}; a changed map would move every record, so it is not applied: put {key} = {stored} back")]
    MapMismatch {
        key: &'static str,
        given: u64,
        stored: u64,
        version: u64,
        store: String,
    },
    /// Two shards hold different fields.
    #[error("shard {shard}: its fields differ from shard {first}'s")]
    FieldsDiffer { shard: u32, first: u32 },
    /// The client library itself failed (its runtime, its state).
    #[error("client: {0}")]
    Client(String),
    /// The dataset a handle addresses was dropped since the handle was made.
    #[error("dataset '{dataset}' was dropped ({message})")]
    Dropped { dataset: String, message: String },
    /// A token stream's dataset is not one, holds a malformed block, or was asked for
    /// something it cannot give.
    #[error("token stream '{dataset}': {reason}")]
    Stream { dataset: String, reason: String },
}

impl Error {
    /// The stable code of an error the router answered with, or would answer with.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Proto(zr_proto::Error::Remote { code, .. }) => Some(*code),
            Error::Failed(failure) => Some(failure.code()),
            Error::UnknownField { .. } => Some(ErrorCode::UnknownField),
            Error::Dropped { .. } => Some(ErrorCode::NoSuchDataset),
            _ => None,
        }
    }

    /// True for a peer that did not answer in time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Net(e) | Error::Router(e) if e.is_timeout())
    }
}
