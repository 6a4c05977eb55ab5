//! What zrecord keeps in the metadata store: one record per cluster under [`CLUSTER_KEY`] —
//! its id, its versioned map, and its committed length — changed only by compare-and-swap,
//! so two routers never both believe they moved it.
//!
//! The committed length is the promise the cluster keeps: a shard may hold more records than
//! its share of it (the tail of a write not yet committed, which repair may cut), never fewer
//! (then its data is missing, and the shard is refused until it is rebuilt or restored).

use serde::{Deserialize, Serialize};
pub use zr_coord::cluster::{
    AddedShard, ClusterRecord, CommittedRecord, DatasetRecord, DictRef, FieldRecord, MapChange,
    MapMove, MapRecord,
};

use crate::{Error, MetaStore, Revision};

/// The key of the cluster record.
pub const CLUSTER_KEY: &str = "cluster";

/// The key of a zstd dictionary's bytes: named by its id and CRC32, written once and never
/// changed (a dataset made again with the same dictionary finds it there), so a node that
/// was away when its dataset was made, or that is rebuilt, gets the same bytes.
pub fn dict_key(dict: DictRef) -> String {
    format!("dict/{}-{:08x}", dict.id, dict.crc)
}

#[derive(Serialize, Deserialize)]
struct DictValue {
    /// The dictionary, base64.
    bytes: String,
}

/// Keeps dictionary `dict`'s bytes under [`dict_key`]; done already if they are there.
pub async fn store_dict(store: &dyn MetaStore, dict: DictRef, bytes: &[u8]) -> Result<(), Error> {
    use base64::Engine;
    let value = DictValue {
        bytes: base64::engine::general_purpose::STANDARD.encode(bytes),
    };
    match crate::store_json(store, &dict_key(dict), None, &value, "a dictionary").await {
        Ok(_) => Ok(()),
        Err(Error::Conflict { .. }) => match load_dict(store, dict).await? {
            Some(held) if held == bytes => Ok(()),
            _ => Err(Error::Corrupt {
                store: store.describe(),
                reason: format!(
                    "{} holds other bytes than dictionary {} with CRC32 {:08x}",
                    dict_key(dict),
                    dict.id,
                    dict.crc
                ),
            }),
        },
        Err(e) => Err(e),
    }
}

/// Dictionary `dict`'s bytes, if the store keeps them (the caller checks them against its
/// id and CRC32).
pub async fn load_dict(store: &dyn MetaStore, dict: DictRef) -> Result<Option<Vec<u8>>, Error> {
    use base64::Engine;
    let key = dict_key(dict);
    let Some((value, _)) = crate::load_json::<DictValue>(store, &key, "a dictionary").await? else {
        return Ok(None);
    };
    base64::engine::general_purpose::STANDARD
        .decode(value.bytes)
        .map(Some)
        .map_err(|e| Error::Corrupt {
            store: store.describe(),
            reason: format!("{key}: not base64: {e}"),
        })
}

/// The key of named dataset `name`'s committed length.
pub fn committed_key(name: &str) -> String {
    format!("dataset/{name}/committed")
}

/// Named dataset `name`'s committed-length record and its revision, if any.
pub async fn load_committed(
    store: &dyn MetaStore,
    name: &str,
) -> Result<Option<(CommittedRecord, Revision)>, Error> {
    crate::load_json(store, &committed_key(name), "a dataset's committed length").await
}

/// Writes named dataset `name`'s committed-length record if it is still at `expected`.
pub async fn store_committed(
    store: &dyn MetaStore,
    name: &str,
    expected: Option<Revision>,
    record: &CommittedRecord,
) -> Result<Revision, Error> {
    crate::store_json(
        store,
        &committed_key(name),
        expected,
        record,
        "a dataset's committed length",
    )
    .await
}

/// A fresh cluster id: 128 bits from the system's randomness, as 32 hex digits.
pub fn new_cluster_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut words = [0u64; 2];
    for (k, word) in words.iter_mut().enumerate() {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(k as u64);
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        hasher.write_u32(std::process::id());
        *word = hasher.finish();
    }
    format!("{:016x}{:016x}", words[0], words[1])
}

/// The cluster record and its revision, or `None` if the store holds none.
pub async fn load(store: &dyn MetaStore) -> Result<Option<(ClusterRecord, Revision)>, Error> {
    crate::load_json(store, CLUSTER_KEY, "the cluster record").await
}

/// Writes `record` if the record is still at `expected` (`None`: if there is none yet).
pub async fn store(
    store: &dyn MetaStore,
    expected: Option<Revision>,
    record: &ClusterRecord,
) -> Result<Revision, Error> {
    crate::store_json(store, CLUSTER_KEY, expected, record, "the cluster record").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_differ() {
        assert_ne!(new_cluster_id(), new_cluster_id());
        assert_eq!(new_cluster_id().len(), 32);
    }
}
