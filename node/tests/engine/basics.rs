//! Behaviour a user relies on, one property per test: round trips, errors that name what is
//! wrong, reopen, locking.

use zr_node::{CreateOptions, Error, FieldSpec, GatherOptions, Record, Store};

use crate::kit::{column, schema, small, small_store};

#[test]
fn append_gather_reopen() {
    let (_dir, path, store) = small_store();
    let payloads: Vec<Vec<u8>> = (0..20u32)
        .map(|i| vec![i as u8; (i * 37 % 300) as usize + 1])
        .collect();
    for (i, p) in payloads.iter().enumerate() {
        let mut r = Record::new().with("a", p);
        if i % 3 != 0 {
            r.set("b", p);
        }
        assert_eq!(store.append(&r).unwrap(), i as u64);
    }
    store.commit().unwrap();
    let indices = [5u64, 0, 19, 5, 7];
    let check = |store: &Store| {
        let batch = store.gather(&indices, &[]).unwrap();
        let a = batch.field("a").unwrap();
        let b = batch.field("b").unwrap();
        for (pos, &i) in indices.iter().enumerate() {
            assert_eq!(a.get(pos).unwrap(), &payloads[i as usize][..]);
            let want_b: &[u8] = if i % 3 != 0 {
                &payloads[i as usize]
            } else {
                &[]
            };
            assert_eq!(b.get(pos).unwrap(), want_b);
        }
        let c = b.to_contiguous();
        assert_eq!(c.offsets.len(), indices.len() + 1);
        assert_eq!(c.get(1).unwrap(), b.get(1).unwrap());
    };
    check(&store);
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.len(), 20);
    check(&store);
    store
        .gather_with(&indices, &[], GatherOptions::verified())
        .unwrap();
}

#[test]
fn errors_name_the_problem() {
    let (dir, path, store) = small_store();
    store.append(&Record::new().with("a", b"x")).unwrap();
    let err = store.gather(&[0, 7], &[]).unwrap_err();
    assert!(
        matches!(err, Error::IndexOutOfRange { index: 7, len: 1 }),
        "{err}"
    );
    assert!(err.to_string().contains("index 7") && err.to_string().contains("1 records"));
    let err = store.gather(&[0], &["nope"]).unwrap_err();
    assert!(
        err.to_string().contains("'nope'") && err.to_string().contains("a, b"),
        "{err}"
    );
    let err = store.append(&Record::new().with("zz", b"x")).unwrap_err();
    assert!(matches!(err, Error::UnknownField { .. }), "{err}");
    let err = store
        .append(&Record::new().with("a", b"x").with("a", b"y"))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidRecord(_)), "{err}");
    assert!(matches!(
        store.delete(1),
        Err(Error::IndexOutOfRange { index: 1, len: 1 })
    ));
    assert!(matches!(
        store.modify(3, &Record::new()),
        Err(Error::IndexOutOfRange { .. })
    ));
    // A second writer is refused while the first holds the dataset; readers are not (and
    // see what is committed: nothing yet).
    assert!(matches!(Store::open(&path), Err(Error::Locked { .. })));
    assert_eq!(Store::open_read_only(&path).unwrap().len(), 0);
    assert!(matches!(
        Store::create(&path, schema(), small()),
        Err(Error::AlreadyExists { .. })
    ));
    drop(store);
    // Not a dataset.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(matches!(
        Store::open(&empty),
        Err(Error::NotADataset { .. })
    ));
    // Unknown format version.
    let meta = std::fs::read_to_string(path.join("meta.json")).unwrap();
    std::fs::write(
        path.join("meta.json"),
        meta.replace("\"version\": 1", "\"version\": 99"),
    )
    .unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedVersion { found: 99, .. }),
        "{err}"
    );
}

#[test]
fn bad_schemas_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for fields in [
        vec![],
        vec![FieldSpec::raw("a"), FieldSpec::raw("a")],
        vec![FieldSpec::raw("a/b")],
        vec![FieldSpec::raw("x").typed("float", vec![2])],
    ] {
        let err = Store::create(dir.path().join("x"), fields, small()).unwrap_err();
        assert!(matches!(err, Error::InvalidSchema(_)), "{err}");
    }
}

#[test]
fn typed_fields_check_record_length() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(
        dir.path().join("t"),
        vec![FieldSpec::raw("v").typed("<f4", vec![2, 3])],
        small(),
    )
    .unwrap();
    store.append(&Record::new().with("v", &[0u8; 24])).unwrap();
    let err = store
        .append(&Record::new().with("v", &[0u8; 20]))
        .unwrap_err();
    assert!(err.to_string().contains("24 bytes per record"), "{err}");
}

#[test]
fn read_only_stores_refuse_writes_and_share() {
    let (_dir, path, store) = small_store();
    store.append(&Record::new().with("a", b"hello")).unwrap();
    store.commit().unwrap();
    drop(store);
    let r1 = Store::open_read_only(&path).unwrap();
    let r2 = Store::open_read_only(&path).unwrap();
    assert!(matches!(
        r1.append(&Record::new()),
        Err(Error::ReadOnly { .. })
    ));
    assert_eq!(
        r2.gather(&[0], &["a"])
            .unwrap()
            .field("a")
            .unwrap()
            .get(0)
            .unwrap(),
        b"hello"
    );
    // A writer opens beside them; a second one does not.
    let writer = Store::open(&path).unwrap();
    assert!(matches!(Store::open(&path), Err(Error::Locked { .. })));
    writer.append(&Record::new().with("a", b"more")).unwrap();
    writer.commit().unwrap();
    assert_eq!((r1.len(), r2.len()), (1, 1));
}

#[test]
fn corruption_is_reported() {
    let (_dir, path, store) = small_store();
    for i in 0..6u8 {
        store
            .append(&Record::new().with("a", &[i; 100]).with("b", &[i; 100]))
            .unwrap();
    }
    store.commit().unwrap();
    drop(store);
    // Flip one payload bit of record 2 of field a, found through its offset entry.
    let entries = std::fs::read(path.join("a.offset")).unwrap();
    let entry = zr_node::offset::Entry::decode(entries[32..48].try_into().unwrap());
    assert_eq!((entry.chunk_id, entry.len), (0, 100));
    let chunk = path.join("chunk/0.zr");
    let mut bytes = std::fs::read(&chunk).unwrap();
    bytes[entry.offset as usize + 16 + 5] ^= 1;
    std::fs::write(&chunk, &bytes).unwrap();
    let store = Store::open(&path).unwrap();
    store.gather(&[2], &["a"]).unwrap(); // unverified raw gathers do not read the frame
    let err = store
        .gather_with(&[2], &["a"], GatherOptions::verified())
        .unwrap_err();
    assert!(
        matches!(&err, Error::BadRecord { field, index: 2, .. } if field == "a"),
        "{err}"
    );
    assert!(err.to_string().contains("CRC"), "{err}");
    drop(store);
    // An offset entry pointing past the chunk's end.
    let table = path.join("a.offset");
    let mut bytes = std::fs::read(&table).unwrap();
    bytes[16 * 3..16 * 3 + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&table, &bytes).unwrap();
    let store = Store::open(&path).unwrap();
    let err = store.gather(&[3], &["a"]).unwrap_err();
    assert!(err.to_string().contains("past the chunk's end"), "{err}");
    drop(store);
    // A truncated offset table.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&table)
        .unwrap()
        .set_len(16 * 2)
        .unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    // A truncated chunk.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&table)
        .unwrap()
        .set_len(16 * 8)
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&chunk)
        .unwrap()
        .set_len(100)
        .unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(
        err.to_string().contains("chunk file has 100 bytes"),
        "{err}"
    );
}

#[test]
fn parallel_gathers_match_serial_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ds");
    let store = Store::create(&path, schema(), CreateOptions::default()).unwrap();
    let rows: Vec<Vec<u8>> = (0..20_000u32)
        .map(|i| i.to_le_bytes().repeat(1 + (i % 40) as usize))
        .collect();
    let records: Vec<Record> = rows
        .iter()
        .map(|r| Record::new().with("a", r).with("b", r))
        .collect();
    store.append_many(&records).unwrap();
    store.commit().unwrap();
    drop(store);
    // Shuffled, with repeats: every part boundary lands somewhere different.
    let indices: Vec<u64> = (0..40_000u64).map(|i| (i * 7919) % 20_000).collect();
    let mut results = Vec::new();
    for readers in [1, 4] {
        let runtime = zr_node::RuntimeOptions {
            readers,
            ..Default::default()
        };
        let store = Store::open_read_only_with(&path, runtime).unwrap();
        let batch = store
            .gather_with(&indices, &[], GatherOptions::verified())
            .unwrap();
        let columns: Vec<_> = batch.fields().map(|f| f.to_contiguous()).collect();
        for column in &columns {
            for (pos, &i) in indices.iter().enumerate() {
                assert_eq!(column.get(pos).unwrap(), &rows[i as usize][..]);
            }
        }
        results.push(columns);
    }
    assert_eq!(results[0], results[1]);
}

/// Readers open beside the writer, each seeing the dataset as of the last commit before it
/// opened: appends since lie past its length, and a modify or delete committed while it
/// reads waits for it to go before it is written in place — readers opened after the commit
/// see it at once (from the redo log), and the writer's next commit alone applies it.
#[test]
fn readers_beside_a_writer_see_the_commit_they_opened_at() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ds");
    let writer = Store::create(&path, vec![FieldSpec::raw("a")], small()).unwrap();
    let rows = |from: u8, to: u8| -> Vec<Vec<u8>> { (from..to).map(|i| vec![i; 3]).collect() };
    let append = |rows: &[Vec<u8>]| {
        let records: Vec<Record> = rows.iter().map(|r| Record::new().with("a", r)).collect();
        writer.append_many(&records).unwrap();
    };
    append(&rows(0, 10));
    writer.commit().unwrap();
    let early = Store::open_read_only(&path).unwrap();
    append(&rows(10, 20));
    // Not committed: no new reader sees it either.
    assert_eq!(Store::open_read_only(&path).unwrap().len(), 10);
    writer.commit().unwrap();
    writer
        .modify(3, &Record::new().with("a", b"changed"))
        .unwrap();
    writer.delete(0).unwrap(); // record 19 takes index 0
    writer.commit().unwrap();

    assert_eq!(
        column(&early, "a", early.len()),
        rows(0, 10),
        "a reader's snapshot changed"
    );
    let late = Store::open_read_only(&path).unwrap();
    let mut expected = rows(0, 19);
    expected[0] = vec![19; 3];
    expected[3] = b"changed".to_vec();
    assert_eq!(column(&late, "a", late.len()), expected);
    assert_eq!(column(&writer, "a", writer.len()), expected);

    // Alone again, the next commit writes the changes in place; a writer reopened after
    // that, and readers, see the same.
    drop((early, late));
    writer.append(&Record::new().with("a", b"last")).unwrap();
    writer.commit().unwrap();
    drop(writer);
    std::fs::remove_file(path.join(zr_node::redo::REDO_FILE)).unwrap();
    expected.push(b"last".to_vec());
    let reader = Store::open_read_only(&path).unwrap();
    assert_eq!(column(&reader, "a", reader.len()), expected);
    drop(reader);
    let reopened = Store::open(&path).unwrap();
    assert_eq!(column(&reopened, "a", reopened.len()), expected);
}

/// Zstandard fields round-trip every kind of record — absent, empty, one byte, random
/// (stored as given), compressible, 1 MiB — through the mappings and through explicit
/// reads, checked or not, and across a reopen; a damaged compressed record is reported by
/// a checked gather.
#[test]
fn zstd_fields_round_trip_every_kind_of_record() {
    use zr_node::ReadPath;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ds");
    let fields = vec![
        FieldSpec::stored("z", "zstd").unwrap(),
        FieldSpec::stored("z9", "zstd:9").unwrap(),
    ];
    assert!(FieldSpec::stored("bad", "zstd:23").is_err());
    assert!(FieldSpec::stored("bad", "lz4").is_err());
    let store = Store::create(&path, fields, small()).unwrap();
    let random: Vec<u8> = (0..5000u64)
        .map(|i| zr_common::hash::mix2(3, i) as u8)
        .collect();
    let text = b"a photo of a small dog running on the beach at sunset, ".repeat(9);
    let big: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i % 251) as u8 ^ (i >> 12) as u8)
        .collect();
    let payloads: Vec<Option<Vec<u8>>> = vec![
        None,
        Some(Vec::new()),
        Some(vec![42]),
        Some(random.clone()),
        Some(text.clone()),
        Some(big.clone()),
    ];
    for p in &payloads {
        let mut r = Record::new();
        if let Some(p) = p {
            r.set("z", p);
            r.set("z9", p);
        }
        store.append(&r).unwrap();
    }
    store.commit().unwrap();
    let expected: Vec<Vec<u8>> = payloads
        .iter()
        .map(|p| p.clone().unwrap_or_default())
        .collect();
    let indices: Vec<u64> = (0..payloads.len() as u64).rev().collect();
    let check = |store: &Store| {
        for read in [ReadPath::Mmap, ReadPath::Direct] {
            for verify in [false, true] {
                let options = GatherOptions {
                    read,
                    verify,
                    ..GatherOptions::default()
                };
                let batch = store.gather_with(&indices, &[], options).unwrap();
                for name in ["z", "z9"] {
                    let column = batch.field(name).unwrap();
                    for (pos, &i) in indices.iter().enumerate() {
                        assert_eq!(
                            column.get(pos).unwrap(),
                            &expected[i as usize][..],
                            "{name} record {i} ({read:?}, verify {verify})"
                        );
                    }
                }
            }
        }
    };
    check(&store);
    // Compressible records are stored smaller; random ones no larger than given.
    let (_, bytes) = store.chunk_stats();
    let given: usize = expected.iter().map(Vec::len).sum::<usize>() * 2;
    assert!(
        (bytes as usize) < given / 3,
        "{bytes} bytes on disk for {given} given"
    );
    drop(store);
    let reopened = Store::open_read_only(&path).unwrap();
    check(&reopened);
    assert_eq!(
        reopened.fields()[1].storage(),
        "zstd:9",
        "the level is kept in meta.json"
    );
    drop(reopened);
    // A damaged compressed record (a byte after a zstd frame's magic) is reported by a
    // checked gather (as every damaged record is: its CRC), never returned.
    let mut damaged = false;
    for entry in std::fs::read_dir(path.join(zr_node::CHUNK_DIR)).unwrap() {
        let chunk = entry.unwrap().path();
        let mut data = std::fs::read(&chunk).unwrap();
        if let Some(at) = data.windows(4).position(|w| w == [0x28, 0xb5, 0x2f, 0xfd]) {
            data[at + 12] ^= 0x5a;
            std::fs::write(&chunk, data).unwrap();
            damaged = true;
            break;
        }
    }
    assert!(damaged, "no zstd frame found");
    let store = Store::open_read_only(&path).unwrap();
    for read in [ReadPath::Mmap, ReadPath::Direct] {
        let options = GatherOptions {
            verify: true,
            read,
            ..GatherOptions::default()
        };
        let e = store.gather_with(&indices, &[], options).unwrap_err();
        assert!(
            matches!(e, Error::BadRecord { .. } | Error::Corrupt { .. }),
            "{read:?}: {e}"
        );
    }
}

/// A zstd dictionary trained on a field's records: the dataset rewritten with it reads
/// back byte-exact (mapped and explicit reads, reopened), smaller than without; a damaged
/// or missing dictionary file is named when the dataset opens.
#[test]
fn a_trained_dictionary_compresses_small_records_and_is_checked() {
    use zr_node::ReadPath;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ds");
    let store = Store::create(
        &path,
        vec![FieldSpec::stored("j", "zstd").unwrap(), FieldSpec::raw("n")],
        small(),
    )
    .unwrap();
    let words = [
        "dog", "beach", "sunset", "red", "car", "city", "night", "two", "people",
    ];
    let records: Vec<Vec<u8>> = (0..3000u64)
        .map(|i| {
            let h = zr_common::hash::mix2(1, i);
            format!(
                "{{\"id\": {i}, \"caption\": \"a {} on a {} at {}\", \"width\": {}, \"tags\": [\"{}\"]}}",
                words[(h % 9) as usize],
                words[(h / 9 % 9) as usize],
                words[(h / 81 % 9) as usize],
                256 + h % 1024,
                words[(h / 729 % 9) as usize]
            )
            .into_bytes()
        })
        .collect();
    for (i, r) in records.iter().enumerate() {
        store
            .append(
                &Record::new()
                    .with("j", r)
                    .with("n", &(i as u64).to_le_bytes()),
            )
            .unwrap();
    }
    store.commit().unwrap();
    drop(store);
    let bytes = |path: &std::path::Path| -> u64 {
        zr_node::meta::Meta::load(path)
            .unwrap()
            .chunks
            .iter()
            .map(|c| c.bytes)
            .sum()
    };
    let before = bytes(&path);
    let report = zr_node::rebalance::train_dict(&path, "j", 16 << 10, None, |_, _| {}).unwrap();
    assert!(report.samples > 1000 && report.bytes > 0, "{report:?}");
    let after = bytes(&path);
    assert!(
        after < before * 9 / 10,
        "{before} -> {after} bytes with a dictionary"
    );
    let store = Store::open_read_only(&path).unwrap();
    assert_eq!(store.fields()[0].dict, Some(report.id));
    let indices: Vec<u64> = (0..3000).rev().collect();
    for read in [ReadPath::Mmap, ReadPath::Direct] {
        let options = GatherOptions {
            read,
            verify: true,
            ..GatherOptions::default()
        };
        let batch = store.gather_with(&indices, &[], options).unwrap();
        let (j, n) = (batch.field("j").unwrap(), batch.field("n").unwrap());
        for (pos, &i) in indices.iter().enumerate() {
            assert_eq!(
                j.get(pos).unwrap(),
                &records[i as usize][..],
                "{read:?} {i}"
            );
            assert_eq!(n.get(pos).unwrap(), &i.to_le_bytes()[..]);
        }
    }
    drop(store);
    // Damaged (its id, or its body), then missing: named.
    let file = zr_node::dict::path(&path, "j");
    let good = std::fs::read(&file).unwrap();
    let mut damaged = good.clone();
    damaged[5] ^= 0xff;
    std::fs::write(&file, &damaged).unwrap();
    let e = Store::open_read_only(&path).unwrap_err().to_string();
    assert!(
        e.contains("j.zdict") && e.contains(&format!("dictionary {}", report.id)),
        "{e}"
    );
    let mut damaged = good.clone();
    let at = damaged.len() - 100;
    damaged[at] ^= 0xff;
    std::fs::write(&file, &damaged).unwrap();
    let e = Store::open_read_only(&path).unwrap_err().to_string();
    assert!(e.contains("j.zdict") && e.contains("is damaged"), "{e}");
    std::fs::remove_file(&file).unwrap();
    let e = Store::open_read_only(&path).unwrap_err().to_string();
    assert!(e.contains("j.zdict") && e.contains("cannot be read"), "{e}");
}

/// The bytes on disk a dataset lists are the chunks' written blocks, not the room a chunk
/// file reserves ahead for growth (an empty cluster dataset once listed 1 GiB).
#[test]
fn bytes_on_disk_are_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("d"), schema(), CreateOptions::default()).unwrap();
    let record = vec![7u8; 1000];
    store
        .append_many(&vec![Record::new().with("a", &record); 100])
        .unwrap();
    store.commit().unwrap();
    let (_, spanned) = store.chunk_stats();
    let held = store.chunk_bytes_on_disk();
    assert!(held >= 100 * 1000, "{held} bytes held for 100 KB written");
    assert!(
        held < 1 << 20,
        "{held} bytes held for 100 KB written (files span {spanned})"
    );
    // Asked again, the figure follows what was written since (it is kept between asks
    // only while nothing changes).
    assert_eq!(store.chunk_bytes_on_disk(), held);
    store
        .append_many(&vec![Record::new().with("a", &record); 200])
        .unwrap();
    store.commit().unwrap();
    let grown = store.chunk_bytes_on_disk();
    assert!(
        grown >= held + 200 * 1000,
        "{grown} bytes held after 200 KB more, {held} before"
    );
}

/// A gathered record, taken whole from its batch, writes back as it was: every field, the
/// one it lacks empty; past the batch's end there is none.
#[test]
fn a_batch_gives_each_record_back_whole() {
    let (dir, _path, store) = small_store();
    crate::kit::append_ab(
        &store,
        &[
            (b"one".to_vec(), b"uno".to_vec()),
            (b"two".to_vec(), Vec::new()),
        ],
    );
    let batch = store.gather(&[1, 0, 1], &[]).unwrap();
    let second = batch.record(0).unwrap();
    assert_eq!(second.values(), &[("a", &b"two"[..]), ("b", &b""[..])]);
    assert_eq!(batch.record(1).unwrap().get("b"), Some(&b"uno"[..]));
    assert_eq!(batch.record(2), batch.record(0));
    assert!(batch.record(3).is_none());
    let copy = Store::create(dir.path().join("copy"), schema(), small()).unwrap();
    let records: Vec<Record> = (0..batch.len()).filter_map(|k| batch.record(k)).collect();
    copy.append_many(&records).unwrap();
    assert_eq!(
        column(&copy, "a", 3),
        [b"two".to_vec(), b"one".to_vec(), b"two".to_vec()]
    );
    assert_eq!(
        column(&copy, "b", 3),
        [Vec::new(), b"uno".to_vec(), Vec::new()]
    );
}
