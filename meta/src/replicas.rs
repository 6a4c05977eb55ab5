//! Which replicas are behind: kept under [`REPLICAS_KEY`], changed only by compare-and-swap.
//!
//! Every replica of a shard holds the same records at the same local indices, except those
//! marked behind here: a replica that missed a write (it failed, was cut off, or restarted and
//! lost writes it had not made durable), or came back empty. A behind replica serves no reads
//! and takes no writes until it has caught up from an in-sync partner; a write is
//! acknowledged once every in-sync replica of each shard it touches holds it. No shard is
//! ever left without an in-sync replica: marking its last one behind is refused, and the
//! write that would have needed it fails instead.

use crate::{Error, MetaStore, Revision};

/// The key of the replica record.
pub const REPLICAS_KEY: &str = "replicas";

pub use zr_coord::record::{LastInSync, Moved, ReplicaId, ReplicaRecord};

/// The replica record and its revision (`None`: there is none yet, so every replica is in
/// sync).
pub async fn load(store: &dyn MetaStore) -> Result<(ReplicaRecord, Option<Revision>), Error> {
    crate::load_or_default(store, REPLICAS_KEY, "the replica record").await
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
    crate::update_json(store, REPLICAS_KEY, "the replica record", change).await
}

#[cfg(test)]
mod tests {
    use super::*;

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
