//! Growing a dataset's fields and writing one field of stored records.

use zr_node::{Error, FieldSpec, Record, Store};

use crate::kit::{column, small, store_ab};

#[test]
fn a_field_added_later_is_absent_until_written_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ds");
    let store = Store::create(&path, vec![FieldSpec::raw("x")], small()).unwrap();
    for i in 0..30u8 {
        store.append(&Record::new().with("x", &[i; 5])).unwrap();
    }
    let grown = store.add_field(FieldSpec::flate("reward")).unwrap();
    // The old handle reads, and refuses writes.
    assert_eq!(column(&store, "x", 30)[7], vec![7u8; 5]);
    assert!(store.append(&Record::new().with("x", b"late")).is_err());
    assert!(column(&grown, "reward", 30).iter().all(Vec::is_empty));
    let values: Vec<Vec<u8>> = (10..30u8).map(|i| vec![i * 2; 3 + i as usize]).collect();
    let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let indices: Vec<u64> = (10..30).collect();
    grown.write_field("reward", &indices, &slices).unwrap();
    // Appends after the growth name either field.
    grown
        .append(&Record::new().with("x", b"new").with("reward", b"r"))
        .unwrap();
    grown.commit().unwrap();
    drop((store, grown));
    let reopened = Store::open(&path).unwrap();
    let x = column(&reopened, "x", 31);
    let reward = column(&reopened, "reward", 31);
    for i in 0..30usize {
        assert_eq!(x[i], vec![i as u8; 5], "x of record {i} kept");
        let expected = if i >= 10 {
            values[i - 10].clone()
        } else {
            Vec::new()
        };
        assert_eq!(reward[i], expected, "reward of record {i}");
    }
    assert_eq!(
        (x[30].as_slice(), reward[30].as_slice()),
        (&b"new"[..], &b"r"[..])
    );
}

#[test]
fn adding_a_field_that_exists_or_is_typed_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ds");
    let store = Store::create(&path, vec![FieldSpec::raw("x")], small()).unwrap();
    store.append(&Record::new().with("x", b"a")).unwrap();
    let exists = store.add_field(FieldSpec::raw("x")).unwrap_err();
    assert!(
        exists.to_string().contains("has a field 'x' already"),
        "{exists}"
    );
    let typed = store
        .add_field(FieldSpec::raw("e").typed("<f4", vec![4]))
        .unwrap_err();
    assert!(typed.to_string().contains("without a dtype"), "{typed}");
    // Still writable: nothing was replaced.
    store.append(&Record::new().with("x", b"b")).unwrap();
    assert_eq!(store.len(), 2);
}

#[test]
fn modify_keeps_the_fields_it_does_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_ab(&dir, small());
    for i in 0..6u8 {
        store
            .append(&Record::new().with("a", &[i; 3]).with("b", &[i + 100; 9]))
            .unwrap();
    }
    store.commit().unwrap();
    store
        .modify(2, &Record::new().with("b", b"changed"))
        .unwrap();
    store.modify(4, &Record::new().with("a", b"")).unwrap();
    assert_eq!(column(&store, "a", 6)[2], vec![2u8; 3]);
    assert_eq!(column(&store, "b", 6)[2], b"changed".to_vec());
    assert!(
        column(&store, "a", 6)[4].is_empty(),
        "an empty value clears a field"
    );
    assert_eq!(column(&store, "b", 6)[4], vec![104u8; 9]);
    let out = store.write_field("b", &[1, 6], &[b"x", b"y"]).unwrap_err();
    assert!(
        matches!(out, Error::IndexOutOfRange { index: 6, len: 6 }),
        "{out}"
    );
    assert_eq!(
        column(&store, "b", 6)[1],
        vec![101u8; 9],
        "a refused call writes nothing"
    );
}
