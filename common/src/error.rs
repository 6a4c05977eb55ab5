//! The common crate's error type.

/// Errors of the sampler and the loader.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A sampler configuration or checkpoint that cannot be used.
    #[error("sampler: {0}")]
    Sampler(String),
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
