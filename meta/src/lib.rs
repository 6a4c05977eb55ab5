//! zr-meta: the cluster's metadata in a consensus store, behind one trait ([`MetaStore`]).
//!
//! Agreement is not something we invent. The store is a small key-value map with
//! compare-and-swap on each key's revision; revisions only grow, across keys, processes and
//! restarts (so they serve as fencing tokens):
//! - [`EtcdStore`]: etcd v3, for clusters that span hosts;
//! - [`EmbeddedStore`]: a directory on one host (atomic replace, fsync, a file lock), with
//!   the same semantics, for the demo, the simulator and one-machine clusters.
//!
//! The same conformance suite (`tests/conformance.rs`) runs on both. What zrecord keeps
//! there, and how, is in [`cluster`] and [`writer`].

pub mod access;
pub mod cluster;
mod embedded;
mod etcd;
pub mod nodes;
pub mod replicas;
pub mod testing;
pub mod writer;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use embedded::EmbeddedStore;
pub use etcd::EtcdStore;

/// A key's version: it changes at every write of the key, and is larger than every revision
/// the store gave before (of any key).
pub use zr_coord::lease::Revision;

/// A boxed future of the store's calls (the trait is used as `dyn MetaStore`).
pub type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// Errors of the metadata store. Each names the store (its directory or endpoints).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A compare-and-swap found another revision (`None`: no value): someone else wrote first.
    #[error(
        "metadata store {store}: {key} was changed meanwhile (expected {}, found {})",
        show_revision(*expected),
        show_revision(*found)
    )]
    Conflict {
        store: String,
        key: String,
        expected: Option<Revision>,
        found: Option<Revision>,
    },
    /// The store could not be reached or did not answer in time.
    #[error("metadata store {store} is unavailable: {reason}")]
    Unavailable { store: String, reason: String },
    /// The store answered, but what it holds cannot be used.
    #[error("metadata store {store}: {reason}")]
    Corrupt { store: String, reason: String },
}

/// A key's revision in words, for messages.
fn show_revision(revision: Option<Revision>) -> String {
    revision.map_or("no value".into(), |r| format!("revision {r}"))
}

/// What a cluster's coordination needs of a consensus store.
pub trait MetaStore: Send + Sync + std::fmt::Debug {
    /// Where the store is, for messages.
    fn describe(&self) -> String;

    /// The value of `key` and its revision, or `None` if the key does not exist. A call
    /// borrows the store alone: what it needs of its arguments it takes at once.
    fn get(&self, key: &str) -> Call<'_, Option<(String, Revision)>>;

    /// Writes `value` under `key` if the key's revision is still `expected` (`None`: if the
    /// key does not exist yet); returns the new revision, or [`Error::Conflict`].
    fn put_if(&self, key: &str, expected: Option<Revision>, value: &str) -> Call<'_, Revision>;
}

/// The value under `key`, kept as JSON, and its revision; `None` if the key has none. `what`
/// names the value in errors ("the cluster record").
pub(crate) async fn load_json<T: serde::de::DeserializeOwned>(
    store: &dyn MetaStore,
    key: &str,
    what: &str,
) -> Result<Option<(T, Revision)>, Error> {
    let Some((text, revision)) = store.get(key).await? else {
        return Ok(None);
    };
    let value = serde_json::from_str(&text).map_err(|e| Error::Corrupt {
        store: store.describe(),
        reason: format!("{what} cannot be read: {e}"),
    })?;
    Ok(Some((value, revision)))
}

/// [`load_json`], with the value's default (and no revision) where the key has none.
pub(crate) async fn load_or_default<T: serde::de::DeserializeOwned + Default>(
    store: &dyn MetaStore,
    key: &str,
    what: &str,
) -> Result<(T, Option<Revision>), Error> {
    Ok(match load_json(store, key, what).await? {
        Some((value, revision)) => (value, Some(revision)),
        None => (T::default(), None),
    })
}

/// Applies `change` to the JSON value under `key` by compare-and-swap, read afresh after
/// each conflict; returns the value written (or as it was, if `change` left it so).
pub(crate) async fn update_json<T, E>(
    store: &dyn MetaStore,
    key: &str,
    what: &str,
    change: impl Fn(&T) -> Result<T, E>,
) -> Result<T, E>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Default + PartialEq,
    E: From<Error>,
{
    loop {
        let (value, revision) = load_or_default::<T>(store, key, what).await?;
        let next = change(&value)?;
        if next == value {
            return Ok(value);
        }
        match store_json(store, key, revision, &next, what).await {
            Ok(_) => return Ok(next),
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes `value` as JSON under `key` if the key's revision is still `expected` (`None`: if
/// it has none yet); `what` names the value in errors.
pub(crate) async fn store_json<T: serde::Serialize>(
    store: &dyn MetaStore,
    key: &str,
    expected: Option<Revision>,
    value: &T,
    what: &str,
) -> Result<Revision, Error> {
    let text = serde_json::to_string(value).map_err(|e| Error::Corrupt {
        store: store.describe(),
        reason: format!("cannot encode {what}: {e}"),
    })?;
    store.put_if(key, expected, &text).await
}

/// Where a cluster's metadata store is (nodes.toml's `[metadata]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// An [`EmbeddedStore`] in this directory.
    Embedded(PathBuf),
    /// An [`EtcdStore`]: the etcd cluster at `endpoints`, keys under `prefix`.
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
    },
}

/// Opens the store at `location`; every call to etcd gets `timeout`.
pub async fn open(location: &Location, timeout: Duration) -> Result<Arc<dyn MetaStore>, Error> {
    Ok(match location {
        Location::Embedded(dir) => Arc::new(EmbeddedStore::open(dir)?),
        Location::Etcd { endpoints, prefix } => {
            Arc::new(EtcdStore::connect(endpoints, prefix, timeout).await?)
        }
    })
}
