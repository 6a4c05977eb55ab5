//! Revoked certificates: the names (`zr cluster issue --name`) that routers and nodes refuse,
//! kept under [`REVOKED_KEY`] and changed only by compare-and-swap. Every router and node
//! reads it every [`WATCH_EVERY`] ([`watch`]), and a router reads it before it serves, so a
//! revocation reaches every open connection within a few seconds, and a router that was
//! down when it was made refuses the name from its start.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, MetaStore, Revision};

/// The key of the revocation record.
pub const REVOKED_KEY: &str = "revoked";

/// How often routers and nodes read the record.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The revocation record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedRecord {
    /// The certificate names refused.
    pub names: BTreeSet<String>,
}

/// The record and its revision (`None`: nobody was ever revoked).
pub async fn load(store: &dyn MetaStore) -> Result<(RevokedRecord, Option<Revision>), Error> {
    Ok(
        match crate::load_json(store, REVOKED_KEY, "the revocation record").await? {
            Some((record, revision)) => (record, Some(revision)),
            None => (RevokedRecord::default(), None),
        },
    )
}

/// Adds `name` to the record (`undo`: takes it out), by compare-and-swap retried on a
/// conflict; returns the record written.
pub async fn revoke(store: &dyn MetaStore, name: &str, undo: bool) -> Result<RevokedRecord, Error> {
    loop {
        let (record, revision) = load(store).await?;
        let mut next = record.clone();
        if undo {
            next.names.remove(name);
        } else {
            next.names.insert(name.to_string());
        }
        if next == record {
            return Ok(record);
        }
        match crate::store_json(store, REVOKED_KEY, revision, &next, "the revocation record").await
        {
            Ok(_) => return Ok(next),
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The names a server refuses, as it last read them; shared by its request handlers.
#[derive(Debug, Default)]
pub struct Revoked {
    names: RwLock<Arc<BTreeSet<String>>>,
}

impl Revoked {
    /// Whether `name` is refused.
    pub fn contains(&self, name: &str) -> bool {
        let names = self.names.read().unwrap_or_else(|e| e.into_inner());
        !names.is_empty() && names.contains(name)
    }

    /// Takes `record` as the names refused from now on.
    pub fn set(&self, record: RevokedRecord) {
        *self.names.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(record.names);
    }

    /// Reads the record into this once.
    pub async fn refresh(&self, store: &dyn MetaStore) -> Result<(), Error> {
        let (record, _) = load(store).await?;
        self.set(record);
        Ok(())
    }
}

/// Reads the record into `revoked` every [`WATCH_EVERY`], for as long as it runs. A store
/// that cannot be read keeps the names last read (logged once until it answers again).
pub async fn watch(store: Arc<dyn MetaStore>, revoked: Arc<Revoked>) {
    let mut failing = false;
    loop {
        match revoked.refresh(&*store).await {
            Ok(()) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::warn!("cannot read the revoked certificates: {e}");
                }
                failing = true;
            }
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revocations_survive_the_store_and_can_be_undone() {
        let dir = tempfile::tempdir().unwrap();
        let run = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        run.block_on(async {
            let store = crate::EmbeddedStore::open(dir.path()).unwrap();
            assert!(load(&store).await.unwrap().0.names.is_empty());
            revoke(&store, "team-a", false).await.unwrap();
            revoke(&store, "team-b", false).await.unwrap();
            revoke(&store, "team-a", false).await.unwrap(); // twice: no change
            let revoked = Revoked::default();
            assert!(!revoked.contains("team-a"), "not before it is read");
            revoked.refresh(&store).await.unwrap();
            assert!(revoked.contains("team-a") && revoked.contains("team-b"));
            assert!(!revoked.contains("team-c"));
            revoke(&store, "team-a", true).await.unwrap();
            drop(store);
            let store = crate::EmbeddedStore::open(dir.path()).unwrap();
            revoked.refresh(&store).await.unwrap();
            assert!(!revoked.contains("team-a") && revoked.contains("team-b"));
        });
    }
}
