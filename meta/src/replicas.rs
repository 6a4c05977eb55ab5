//! Which replicas are behind: kept under [`REPLICAS_KEY`], changed only by compare-and-swap.
//!
//! Every replica of a shard holds the same records at the same local indices, except those
//! marked behind here: a replica that missed a write (it failed, was cut off, or restarted and
//! lost writes it had not made durable), or came back empty. A behind replica serves no reads
//! and takes no writes until it has caught up from an in-sync partner; a write is
//! acknowledged once every in-sync replica of each shard it touches holds it. No shard is
//! ever left without an in-sync replica: marking its last one behind is refused, and the
//! write that would have needed it fails instead.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{Error, MetaStore, Revision};

/// The key of the replica record.
pub const REPLICAS_KEY: &str = "replicas";

/// A shard's replica: (shard, replica).
pub type ReplicaId = (u32, u32);

/// The replica record: the replicas that are behind, and those moved to another address
/// than nodes.toml gives them. No record: every replica is in sync where nodes.toml says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub behind: BTreeSet<ReplicaId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<Moved>,
}

/// A replica served from another address than nodes.toml's (`zr cluster replace-node`):
/// this one wins wherever the two differ.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub shard: u32,
    pub replica: u32,
    pub addr: String,
}

/// Marking a replica behind would leave its shard with none in sync.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("shard {shard}'s replica {replica} is its last one in sync, so it cannot be marked behind")]
pub struct LastInSync {
    pub shard: u32,
    pub replica: u32,
}

impl ReplicaRecord {
    /// True if `id` is in sync.
    pub fn in_sync(&self, id: ReplicaId) -> bool {
        !self.behind.contains(&id)
    }

    /// `self` with `id` marked behind, in a cluster of `replicas` replicas per shard;
    /// refused if it is its shard's last replica in sync.
    pub fn with_behind(&self, id: ReplicaId, replicas: u32) -> Result<ReplicaRecord, LastInSync> {
        if self.in_sync(id) && !self.partner_in_sync(id, replicas) {
            return Err(LastInSync {
                shard: id.0,
                replica: id.1,
            });
        }
        let mut next = self.clone();
        next.behind.insert(id);
        Ok(next)
    }

    /// True if another replica of `id`'s shard, of `replicas`, is in sync.
    fn partner_in_sync(&self, (shard, replica): ReplicaId, replicas: u32) -> bool {
        (0..replicas)
            .filter(|&r| r != replica)
            .any(|r| self.in_sync((shard, r)))
    }

    /// The address replica `id` was moved to, if it was.
    pub fn moved_to(&self, id: ReplicaId) -> Option<&str> {
        self.moved
            .iter()
            .find(|m| (m.shard, m.replica) == id)
            .map(|m| m.addr.as_str())
    }

    /// `self` with replica `id` served from `addr` from now on, and behind (the node there
    /// holds nothing yet: it is caught up from a partner before it serves); refused if no
    /// partner of it is in sync.
    pub fn with_moved(
        &self,
        id: ReplicaId,
        replicas: u32,
        addr: &str,
    ) -> Result<ReplicaRecord, LastInSync> {
        let (shard, replica) = id;
        if !self.partner_in_sync(id, replicas) {
            return Err(LastInSync { shard, replica });
        }
        let mut next = self.with_behind(id, replicas)?;
        next.moved.retain(|m| (m.shard, m.replica) != id);
        next.moved.push(Moved {
            shard,
            replica,
            addr: addr.to_string(),
        });
        next.moved.sort_by_key(|m| (m.shard, m.replica));
        Ok(next)
    }
}

/// The replica record and its revision (`None`: there is none yet, so every replica is in
/// sync).
pub async fn load(store: &dyn MetaStore) -> Result<(ReplicaRecord, Option<Revision>), Error> {
    Ok(
        match crate::load_json(store, REPLICAS_KEY, "the replica record").await? {
            Some((record, revision)) => (record, Some(revision)),
            None => (ReplicaRecord::default(), None),
        },
    )
}

/// Why a replica could not be marked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MarkError {
    #[error(transparent)]
    LastInSync(#[from] LastInSync),
    #[error(transparent)]
    Store(#[from] Error),
}

/// Marks `id` behind (compare-and-swap, retried on a conflict); returns the record written.
pub async fn mark_behind(
    store: &dyn MetaStore,
    id: ReplicaId,
    replicas: u32,
) -> Result<ReplicaRecord, MarkError> {
    update(store, |record| {
        Ok::<_, MarkError>(record.with_behind(id, replicas)?)
    })
    .await
}

/// Moves replica `id` to `addr` and marks it behind, in one compare-and-swap (retried on a
/// conflict); returns the record written. Refused unless a partner of it is in sync.
pub async fn move_replica(
    store: &dyn MetaStore,
    id: ReplicaId,
    replicas: u32,
    addr: &str,
) -> Result<ReplicaRecord, MarkError> {
    update(store, |record| {
        Ok::<_, MarkError>(record.with_moved(id, replicas, addr)?)
    })
    .await
}

/// Marks `id` in sync again (compare-and-swap, retried on a conflict).
pub async fn mark_in_sync(store: &dyn MetaStore, id: ReplicaId) -> Result<ReplicaRecord, Error> {
    update(store, |record| {
        let mut next = record.clone();
        next.behind.remove(&id);
        Ok::<_, Error>(next)
    })
    .await
}

/// Applies `change` to the record by compare-and-swap, read afresh after each conflict.
async fn update<E: From<Error>>(
    store: &dyn MetaStore,
    change: impl Fn(&ReplicaRecord) -> Result<ReplicaRecord, E>,
) -> Result<ReplicaRecord, E> {
    loop {
        let (record, revision) = load(store).await?;
        let next = change(&record)?;
        if next == record {
            return Ok(record);
        }
        match crate::store_json(store, REPLICAS_KEY, revision, &next, "the replica record").await {
            Ok(_) => return Ok(next),
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_keeps_one_replica_in_sync() {
        let none = ReplicaRecord::default();
        let one = none.with_behind((0, 1), 2).unwrap();
        assert!(!one.in_sync((0, 1)) && one.in_sync((0, 0)));
        assert_eq!(
            one.with_behind((0, 0), 2),
            Err(LastInSync {
                shard: 0,
                replica: 0
            })
        );
        // Another shard's replicas are their own; marking a behind one again changes nothing.
        assert!(one.with_behind((1, 0), 2).is_ok());
        assert_eq!(one.with_behind((0, 1), 2).unwrap(), one);
        // One replica per shard: it is always the last.
        assert!(none.with_behind((3, 0), 1).is_err());
    }

    #[test]
    fn a_replica_moves_only_while_a_partner_is_in_sync() {
        let none = ReplicaRecord::default();
        let moved = none.with_moved((1, 0), 2, "10.0.0.9:7003").unwrap();
        assert_eq!(moved.moved_to((1, 0)), Some("10.0.0.9:7003"));
        assert_eq!(moved.moved_to((1, 1)), None);
        assert!(!moved.in_sync((1, 0)) && moved.in_sync((1, 1)));
        // Moved again before it caught up: the new address wins, still behind.
        let again = moved.with_moved((1, 0), 2, "10.0.0.10:7003").unwrap();
        assert_eq!(again.moved.len(), 1);
        assert_eq!(again.moved_to((1, 0)), Some("10.0.0.10:7003"));
        // Its partner cannot move while it is behind, nor a replica with no partner.
        assert!(again.with_moved((1, 1), 2, "10.0.0.11:7004").is_err());
        assert!(none.with_moved((0, 0), 1, "10.0.0.11:7004").is_err());
        // A record without moves reads as before (no `moved` key written).
        let text = serde_json::to_string(&none.with_behind((0, 1), 2).unwrap()).unwrap();
        assert!(!text.contains("moved"), "{text}");
        let old: ReplicaRecord = serde_json::from_str(r#"{"behind":[[0,1]]}"#).unwrap();
        assert!(!old.in_sync((0, 1)) && old.moved.is_empty());
    }

    #[test]
    fn marks_survive_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::EmbeddedStore::open(dir.path()).unwrap();
        let run = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        run.block_on(async {
            mark_behind(&store, (2, 1), 2).await.unwrap();
            assert!(matches!(
                mark_behind(&store, (2, 0), 2).await,
                Err(MarkError::LastInSync(_))
            ));
            let (record, _) = load(&store).await.unwrap();
            assert!(!record.in_sync((2, 1)));
            mark_in_sync(&store, (2, 1)).await.unwrap();
            assert!(load(&store).await.unwrap().0.behind.is_empty());
        });
    }
}
