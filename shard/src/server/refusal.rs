//! Why a request is refused: each refusal typed, with its wire code.

use super::*;

/// Why a node refused a request. Each crosses the wire as its code and its message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] Error),
    /// The fence could not be kept.
    #[error(transparent)]
    FenceStorage(crate::fence::FenceError),
    /// A write without a lease token.
    #[error("a node takes writes only from a router holding the write lease, and this one carries no lease token")]
    NoLeaseToken,
    /// A write whose lease token is below the node's fence.
    #[error(transparent)]
    Fenced(crate::fence::FenceError),
    /// The request is for another cluster or map than this node's data.
    #[error(transparent)]
    Identity(crate::identity::Mismatch),
    /// An append that does not start at its slot's length.
    #[error("append expected to start at record {at} of slot {slot}, but this node holds {len} of that slot")]
    OutOfStep { slot: u32, at: u64, len: u64 },
    /// An append to a slot a move is building here, not served.
    #[error(
        "slot {0} is being built here by a shard move: it takes no appends until it is served"
    )]
    Building(u32),
    /// A request of a rebuild from files that cannot be served.
    #[error(transparent)]
    Ship(#[from] crate::ship::ShipError),
    /// A create whose field names another dictionary than the one sent for it.
    #[error("field '{field}' names dictionary {}, and the dictionary sent {sent}", want.map_or("none".into(), |id| id.to_string()))]
    DictMismatch {
        field: String,
        want: Option<u32>,
        sent: String,
    },
}

impl Refusal {
    /// The code the refusal crosses the wire with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Store(e) | Refusal::Ship(crate::ship::ShipError::Store(e)) => code_of(e),
            Refusal::Ship(_) => ErrorCode::BadRequest,
            Refusal::FenceStorage(_) => ErrorCode::Storage,
            Refusal::NoLeaseToken | Refusal::DictMismatch { .. } | Refusal::Building(_) => {
                ErrorCode::BadRequest
            }
            Refusal::Identity(crate::identity::Mismatch::Cluster { .. }) => ErrorCode::WrongCluster,
            Refusal::Identity(
                crate::identity::Mismatch::Map { .. } | crate::identity::Mismatch::Unplaced,
            ) => ErrorCode::StaleMap,
            Refusal::Identity(crate::identity::Mismatch::Storage(_)) => ErrorCode::Storage,
            Refusal::Identity(crate::identity::Mismatch::Node { .. }) => ErrorCode::WrongShard,
            Refusal::Fenced(_) | Refusal::OutOfStep { .. } => ErrorCode::Conflict,
        }
    }
}

pub(super) fn error_reply(code: ErrorCode, message: String) -> (Vec<u8>, Vec<Bytes>) {
    let reply = Reply::Error { code, message };
    (wire::encode_reply(&reply).unwrap_or_default(), Vec::new())
}

pub(super) fn code_of(e: &Error) -> ErrorCode {
    match e {
        Error::IndexOutOfRange { .. } | Error::UnitIndexOutOfRange { .. } => {
            ErrorCode::IndexOutOfRange
        }
        Error::UnknownField { .. } => ErrorCode::UnknownField,
        Error::InvalidRecord(_) => ErrorCode::BadRequest,
        Error::BadRecord { .. } | Error::Corrupt { .. } => ErrorCode::CorruptRecord,
        _ => ErrorCode::Storage,
    }
}

/// Writes an access-control refusal of the peer's `action` on `dataset` to the node's audit
/// log, if it keeps one (once a minute per identity and dataset).
pub(super) fn refused(
    audit: &Option<(std::sync::Arc<zr_service::audit::AuditLog>, zr_net::Peer)>,
    action: &str,
    dataset: &str,
    why: &str,
) {
    if let Some((log, peer)) = audit {
        let entry =
            zr_service::audit::Entry::of("node", peer, action, dataset, "refused", why.into());
        log.note(peer.identity, &entry);
    }
}
