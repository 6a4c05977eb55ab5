//! What the shard crate's unit tests share.

use zr_node::Store;

/// The first field of records `indices` of `store`, each payload copied out (empty where a
/// record lacks it).
pub(crate) fn first_field(store: &Store, indices: &[u64]) -> Vec<Vec<u8>> {
    let batch = store.gather(indices, &[]).expect("gather");
    let column = batch.fields().next().expect("a field");
    (0..indices.len())
        .map(|k| column.get(k).unwrap_or_default().to_vec())
        .collect()
}
