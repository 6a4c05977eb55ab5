//! What the engine's test modules share: store options, the usual fields, a field's column.

use zr_node::{CreateOptions, FieldSpec, Record, Store};

/// Chunks of four records and files grown in small steps, so that every growth path runs.
pub fn small() -> CreateOptions {
    CreateOptions {
        chunk_records: 4,
        chunk_grow_bytes: 4096,
        offset_grow_entries: 3,
    }
}

/// Field "a", raw, and field "b", Deflate-compressed.
pub fn schema() -> Vec<FieldSpec> {
    vec![FieldSpec::raw("a"), FieldSpec::flate("b")]
}

/// A new store of [`schema`]'s fields in `dir`.
pub fn store_ab(dir: &tempfile::TempDir, options: CreateOptions) -> Store {
    Store::create(dir.path().join("ds"), schema(), options).unwrap()
}

/// A new store of [`schema`]'s fields and [`small`] options in a directory of its own, and
/// its path.
pub fn small_store() -> (tempfile::TempDir, std::path::PathBuf, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = store_ab(&dir, small());
    let path = store.dir().to_path_buf();
    (dir, path, store)
}

/// Appends `rows` as records of fields "a" and "b", and commits.
pub fn append_ab(store: &Store, rows: &[(Vec<u8>, Vec<u8>)]) {
    let records: Vec<Record> = rows
        .iter()
        .map(|(a, b)| Record::new().with("a", a).with("b", b))
        .collect();
    store.append_many(&records).unwrap();
    store.commit().unwrap();
}

/// Field `field` of the first `n` records (empty where a record has none).
pub fn column(store: &Store, field: &str, n: u64) -> Vec<Vec<u8>> {
    let indices: Vec<u64> = (0..n).collect();
    let batch = store.gather(&indices, &[field]).unwrap();
    let view = batch.field(field).unwrap();
    (0..n as usize)
        .map(|k| view.get(k).unwrap_or_default().to_vec())
        .collect()
}
