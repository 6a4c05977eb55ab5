//! Readers gathering on several threads while a writer appends, modifies, deletes and commits
//! see only whole, correct records; a batch stays valid while the files under it grow.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use zr_node::{CreateOptions, FieldSpec, Record, Store};

/// A self-describing payload: id, then bytes derived from it. Its length varies with the id.
fn payload(id: u64, salt: u8) -> Vec<u8> {
    let len = 8 + (id % 97) as usize * 13;
    let mut out = id.to_le_bytes().to_vec();
    out.extend((8..len).map(|i| (id as usize * 31 + i) as u8 ^ salt));
    out
}

/// The id a payload claims, if the payload is exactly what `payload(id, salt)` makes.
fn check(bytes: &[u8], salt: u8) -> Option<u64> {
    let id = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    (payload(id, salt) == bytes).then_some(id)
}

fn options() -> CreateOptions {
    CreateOptions {
        chunk_records: 50,
        chunk_grow_bytes: 8192,
        offset_grow_entries: 64,
    }
}

#[test]
fn readers_see_whole_records_during_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::kit::store_ab(&dir, options());
    let (pa, pb) = (payload(0, 1), payload(0, 2));
    store
        .append(&Record::new().with("a", &pa).with("b", &pb))
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));

    let readers: Vec<_> = (0..3u64)
        .map(|t| {
            let store = store.clone();
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                let mut gathered = 0u64;
                let mut x = t + 1;
                while !done.load(Ordering::Relaxed) {
                    let len = store.len();
                    let indices: Vec<u64> = (0..64)
                        .map(|_| {
                            x = x
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            (x >> 33) % len
                        })
                        .collect();
                    let batch = match store.gather(&indices, &[]) {
                        Ok(batch) => batch,
                        // A delete may shrink the dataset between len() and gather().
                        Err(zr_node::Error::IndexOutOfRange { .. }) => continue,
                        Err(e) => panic!("gather failed: {e}"),
                    };
                    let (a, b) = (batch.field("a").unwrap(), batch.field("b").unwrap());
                    for pos in 0..indices.len() {
                        let ida = check(a.get(pos).unwrap(), 1).expect("torn or wrong raw record");
                        let idb =
                            check(b.get(pos).unwrap(), 2).expect("torn or wrong flate record");
                        assert_eq!(ida, idb, "fields of one record come from different writes");
                    }
                    gathered += indices.len() as u64;
                }
                gathered
            })
        })
        .collect();

    let mut next_id = 1u64;
    for step in 0..1500u64 {
        let len = store.len();
        match step % 10 {
            0..=4 => {
                let rows: Vec<(Vec<u8>, Vec<u8>)> = (0..4)
                    .map(|k| (payload(next_id + k, 1), payload(next_id + k, 2)))
                    .collect();
                next_id += 4;
                let records: Vec<Record> = rows
                    .iter()
                    .map(|(a, b)| Record::new().with("a", a).with("b", b))
                    .collect();
                store.append_many(&records).unwrap();
            }
            5..=6 => {
                let (a, b) = (payload(next_id, 1), payload(next_id, 2));
                next_id += 1;
                store
                    .modify(
                        step * 7919 % len,
                        &Record::new().with("a", &a).with("b", &b),
                    )
                    .unwrap();
            }
            7..=8 if len > 1 => store.delete(step * 104729 % len).unwrap(),
            _ => store.commit().unwrap(),
        }
    }
    done.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(
            reader.join().unwrap() > 0,
            "a reader never completed a gather"
        );
    }
}

#[test]
fn batches_outlive_growth_and_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::create(dir.path().join("ds"), vec![FieldSpec::raw("a")], options()).unwrap();
    let rows: Vec<Vec<u8>> = (0..10).map(|i| payload(i, 1)).collect();
    for row in &rows {
        store.append(&Record::new().with("a", row)).unwrap();
    }
    let batch = store.gather(&(0..10).collect::<Vec<_>>(), &["a"]).unwrap();
    // Grow chunks and offset tables many times over, seal chunks, then drop the store.
    for i in 10..2000 {
        store
            .append(&Record::new().with("a", &payload(i, 1)))
            .unwrap();
    }
    store.commit().unwrap();
    drop(store);
    let field = batch.field("a").unwrap();
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(field.get(i).unwrap(), &row[..]);
    }
}

#[test]
fn parallel_appenders_get_disjoint_ordered_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = zr_node::RuntimeOptions {
        writers: 3,
        ..Default::default()
    };
    let store = Store::create_with(
        dir.path().join("ds"),
        vec![FieldSpec::raw("a"), FieldSpec::flate("b")],
        options(),
        runtime,
    )
    .unwrap();
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut ranges = Vec::new();
                for round in 0..20u64 {
                    // Alternate small appends (one writer) and large ones (split across writers).
                    let count = if round % 2 == 0 { 3 } else { 100 };
                    let ids: Vec<u64> = (0..count).map(|k| t << 40 | round << 20 | k).collect();
                    let rows: Vec<(Vec<u8>, Vec<u8>)> = ids
                        .iter()
                        .map(|&id| (payload(id, 1), payload(id, 2)))
                        .collect();
                    let records: Vec<Record> = rows
                        .iter()
                        .map(|(a, b)| Record::new().with("a", a).with("b", b))
                        .collect();
                    ranges.push((store.append_many(&records).unwrap(), ids));
                }
                ranges
            })
        })
        .collect();
    let mut all: Vec<(std::ops::Range<u64>, Vec<u64>)> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort_by_key(|(range, _)| range.start);
    let mut expected_start = 0;
    for (range, ids) in &all {
        assert_eq!(range.start, expected_start, "ranges leave a gap or overlap");
        expected_start = range.end;
        let indices: Vec<u64> = range.clone().collect();
        let batch = store.gather(&indices, &[]).unwrap();
        for (pos, &id) in ids.iter().enumerate() {
            assert_eq!(
                check(batch.field("a").unwrap().get(pos).unwrap(), 1),
                Some(id)
            );
            assert_eq!(
                check(batch.field("b").unwrap().get(pos).unwrap(), 2),
                Some(id)
            );
        }
    }
    assert_eq!(store.len(), expected_start);
    store.commit().unwrap();
}

/// A dataset closed by one thread can be reopened at once even while other threads spawn
/// processes: a forked child briefly shares the lock file's description (until it execs),
/// which used to make most such reopens fail with "locked by another process".
#[test]
fn reopening_while_other_threads_spawn_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    drop(Store::create(&dir, vec![FieldSpec::raw("a")], CreateOptions::default()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let spawners: Vec<_> = (0..2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::process::Command::new("true").status();
                }
            })
        })
        .collect();
    let failures: Vec<String> = (0..300)
        .filter_map(|_| Store::open(&dir).map(drop).err().map(|e| e.to_string()))
        .collect();
    stop.store(true, Ordering::Relaxed);
    for spawner in spawners {
        spawner.join().unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of 300 reopens failed: {:?}",
        failures.len(),
        failures.first()
    );
}
