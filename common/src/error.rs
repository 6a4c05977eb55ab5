//! The common crate's error type.

/// Errors of the shared components.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A sampler configuration or checkpoint that cannot be used.
    #[error("sampler: {0}")]
    Sampler(String),
    /// A cluster map that cannot be used.
    #[error("placement: {0}")]
    Placement(String),
    /// A cluster configuration file that cannot be used.
    #[error("{path}: {reason}")]
    Config { path: String, reason: String },
    /// A network message that breaks the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A network operation failed; the message names the peer.
    #[error("network: {0}")]
    Net(String),
    /// The router or a node answered with an error.
    #[error("{message}")]
    Remote {
        code: crate::wire::ErrorCode,
        message: String,
    },
    /// A gather behind the loader failed.
    #[error("loader: gather of epoch {epoch} positions {start}..{end} failed: {source}")]
    Gather {
        epoch: u64,
        start: u64,
        end: u64,
        #[source]
        source: BoxError,
    },
}

/// A boxed error from a gather source (a local store, a cluster client).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
