//! Units: independent index spaces in one dataset (see `zr_node::unit`). A model test of
//! random appends, modifies, deletes, unit drops, commits and reopens over several units;
//! power cuts among them; and the properties a cluster node relies on — a unit's indices
//! never change when other units come or go, its chunks are its own, and a snapshot carries
//! every unit.

use std::collections::BTreeMap;
use std::path::Path;

use crate::workload::{fields, make_row, mix, options, record, Row};
use proptest::prelude::*;
use zr_node::disk::PowerCut;
use zr_node::unit::{address, chunk_unit};
use zr_node::{Error, GatherOptions, Record, Store};

/// Every unit's records, by unit.
type Model = BTreeMap<u32, Vec<Row>>;

#[derive(Clone, Debug)]
enum Op {
    Append(u32, Vec<u64>),
    /// Runs of several units at once (`Store::append_runs`, as a cluster node appends).
    AppendRuns(Vec<(u32, Vec<u64>)>),
    Modify(u32, usize, u64),
    Delete(u32, usize),
    Drop(u32),
    Commit,
    Reopen,
    Gather(Vec<(u32, usize)>),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let unit = prop_oneof![Just(0u32), Just(1), Just(5), Just(1023)];
    prop_oneof![
        5 => (unit.clone(), prop::collection::vec(any::<u64>(), 0..6)).prop_map(|(u, r)| Op::Append(u, r)),
        1 => (unit.clone(), prop::collection::vec(any::<u64>(), 64..80)).prop_map(|(u, r)| Op::Append(u, r)),
        2 => prop::collection::vec((unit.clone(), prop::collection::vec(any::<u64>(), 0..40)), 0..6)
            .prop_map(Op::AppendRuns),
        2 => (unit.clone(), any::<usize>(), any::<u64>()).prop_map(|(u, i, r)| Op::Modify(u, i, r)),
        2 => (unit.clone(), any::<usize>()).prop_map(|(u, i)| Op::Delete(u, i)),
        1 => unit.clone().prop_map(Op::Drop),
        2 => Just(Op::Commit),
        1 => Just(Op::Reopen),
        2 => prop::collection::vec((unit, any::<usize>()), 0..20).prop_map(Op::Gather),
    ]
}

/// Every record of every unit of `store`, read with frames and CRCs checked.
fn read_units(store: &Store) -> Model {
    let mut found = Model::new();
    for (unit, len) in store.units() {
        let addresses: Vec<u64> = (0..len).map(|i| address(unit, i)).collect();
        let batch = store
            .gather_with(&addresses, &[], GatherOptions::verified())
            .unwrap_or_else(|e| panic!("unit {unit}: {e}"));
        let (raw, zip) = (batch.field("raw").unwrap(), batch.field("zip").unwrap());
        let rows = (0..addresses.len())
            .map(|k| [raw.get(k).unwrap().to_vec(), zip.get(k).unwrap().to_vec()])
            .collect();
        found.insert(unit, rows);
    }
    found
}

fn run(ops: Vec<Op>) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let mut store = Store::create(&dir, fields(), options()).unwrap();
    let mut model: Model = [(0, Vec::new())].into();
    let mut committed = model.clone();
    for op in ops {
        match op {
            Op::Append(unit, seeds) => {
                let rows: Vec<Row> = seeds.into_iter().map(make_row).collect();
                let records: Vec<Record> = rows.iter().map(record).collect();
                let range = store.append_to(unit, &records).unwrap();
                let rows_of = model.entry(unit).or_default();
                assert_eq!(range.start, rows_of.len() as u64, "unit {unit}");
                rows_of.extend(rows);
            }
            Op::AppendRuns(runs) => {
                let rows: Vec<Vec<Row>> = runs
                    .iter()
                    .map(|(_, seeds)| seeds.iter().copied().map(make_row).collect())
                    .collect();
                let records: Vec<Vec<Record>> = rows
                    .iter()
                    .map(|r| r.iter().map(record).collect())
                    .collect();
                let parts: Vec<(u32, &[Record])> = runs
                    .iter()
                    .zip(&records)
                    .map(|((unit, _), r)| (*unit, &r[..]))
                    .collect();
                let starts = store.append_runs(&parts).unwrap();
                for (((unit, _), rows), start) in runs.iter().zip(rows).zip(starts) {
                    let rows_of = model.entry(*unit).or_default();
                    assert_eq!(start, rows_of.len() as u64, "unit {unit}");
                    rows_of.extend(rows);
                }
            }
            Op::Modify(unit, i, seed) => {
                let Some(rows) = model.get_mut(&unit).filter(|r| !r.is_empty()) else {
                    continue;
                };
                let i = i % rows.len();
                let row = make_row(seed);
                store
                    .modify(address(unit, i as u64), &record(&row))
                    .unwrap();
                rows[i] = row;
            }
            Op::Delete(unit, i) => {
                let Some(rows) = model.get_mut(&unit).filter(|r| !r.is_empty()) else {
                    continue;
                };
                let i = i % rows.len();
                store.delete(address(unit, i as u64)).unwrap();
                rows.swap_remove(i);
            }
            Op::Drop(unit) => {
                // Drops commit everything else too.
                store.drop_unit(unit).unwrap();
                model.remove(&unit);
                committed = model.clone();
            }
            Op::Commit => {
                store.commit().unwrap();
                committed = model.clone();
            }
            Op::Reopen => {
                drop(store);
                store = Store::open(&dir).unwrap();
                model = committed.clone();
                assert_eq!(read_units(&store), model);
            }
            Op::Gather(picks) => {
                let picks: Vec<(u32, u64)> = picks
                    .into_iter()
                    .filter_map(|(unit, i)| {
                        let rows = model.get(&unit).filter(|r| !r.is_empty())?;
                        Some((unit, (i % rows.len()) as u64))
                    })
                    .collect();
                let addresses: Vec<u64> = picks.iter().map(|&(u, i)| address(u, i)).collect();
                let batch = store.gather(&addresses, &["raw", "zip"]).unwrap();
                for (k, &(unit, i)) in picks.iter().enumerate() {
                    let row = &model[&unit][i as usize];
                    assert_eq!(batch.field("raw").unwrap().get(k).unwrap(), &row[0][..]);
                    assert_eq!(batch.field("zip").unwrap().get(k).unwrap(), &row[1][..]);
                }
            }
        }
        let lens: Vec<(u32, u64)> = model.iter().map(|(&u, r)| (u, r.len() as u64)).collect();
        assert_eq!(store.units(), lens);
    }
    assert_eq!(read_units(&store), model);
    let report = store.verify(|_| {}).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    drop(store);
    let store = Store::open(&dir).unwrap();
    assert_eq!(read_units(&store), committed);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn units_match_the_model(ops in prop::collection::vec(op_strategy(), 1..50)) {
        run(ops);
    }
}

/// A unit other than 0 keeps to one chunk file (its writer's) however its records come —
/// one large append, or runs of many units at once — while unit 0's large appends are split
/// among the writers: a node holds hundreds of units, and a move ships their files.
#[test]
fn a_unit_keeps_to_one_chunk() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let store = Store::create(&dir, fields(), zr_node::CreateOptions::default()).unwrap();
    let rows: Vec<Row> = (0..300).map(make_row).collect();
    let records: Vec<Record> = rows.iter().map(record).collect();
    store.append_to(3, &records).unwrap();
    let runs: Vec<(u32, &[Record])> = (1..40).map(|u| (u, &records[..100])).collect();
    let starts = store.append_runs(&runs).unwrap();
    assert_eq!(starts[2], 300, "unit 3's run follows its records");
    store.append_to(0, &records).unwrap();
    store.commit().unwrap();
    let mut chunks: BTreeMap<u32, usize> = BTreeMap::new();
    for entry in std::fs::read_dir(dir.join("chunk")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let id: u32 = name.trim_end_matches(".zr").parse().unwrap();
        *chunks.entry(chunk_unit(id)).or_default() += 1;
    }
    for unit in 1..40 {
        assert_eq!(chunks.get(&unit), Some(&1), "unit {unit}: {chunks:?}");
    }
    assert!(chunks[&0] > 1, "unit 0's large append is split: {chunks:?}");
    let batch = store
        .gather_with(
            &[address(3, 299), address(3, 300), address(39, 99)],
            &[],
            GatherOptions::verified(),
        )
        .unwrap();
    let raw = batch.field("raw").unwrap();
    assert_eq!(raw.get(0).unwrap(), &rows[299][0][..]);
    assert_eq!(raw.get(1).unwrap(), &rows[0][0][..]);
    assert_eq!(raw.get(2).unwrap(), &rows[99][0][..]);
}

/// A unit's records keep their indices, and their chunk files, whatever other units come
/// and go; dropping a unit removes its files and nothing else; its addresses then name it.
#[test]
fn a_unit_is_untouched_by_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let store = Store::create(&dir, fields(), options()).unwrap();
    let rows = |base: u64, n: u64| -> Vec<Row> { (0..n).map(|k| make_row(base + k)).collect() };
    let (seven, nine) = (rows(100, 40), rows(900, 25));
    store
        .append_to(7, &seven.iter().map(record).collect::<Vec<_>>())
        .unwrap();
    store.commit().unwrap();
    // A unit's chunk files: (name, bytes), by name.
    let chunks_of = |unit: u32| -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.join("chunk"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|path| {
                path.file_name()
                    .and_then(|n| n.to_str()?.strip_suffix(".zr")?.parse::<u32>().ok())
                    .is_some_and(|id| chunk_unit(id) == unit)
            })
            .map(|path| {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&path).unwrap())
            })
            .collect();
        files.sort();
        files
    };
    let before = chunks_of(7);
    assert!(!before.is_empty());
    // Other units come, take records, and go.
    store
        .append_to(9, &nine.iter().map(record).collect::<Vec<_>>())
        .unwrap();
    store.delete(address(9, 3)).unwrap();
    store.drop_unit(0).unwrap();
    store.commit().unwrap();
    let table = dir.join("units/9.raw.offset");
    assert!(table.is_file(), "{}", table.display());
    store.drop_unit(9).unwrap();
    assert!(!table.exists(), "a dropped unit's tables go");
    assert!(chunks_of(9).is_empty(), "a dropped unit's chunks go");
    assert!(
        !dir.join("raw.offset").exists(),
        "unit 0's tables go with it"
    );
    assert_eq!(
        chunks_of(7),
        before,
        "unit 7's chunk files are as they were"
    );
    drop(store);
    let store = Store::open(&dir).unwrap();
    assert_eq!(store.units(), vec![(7, 40)]);
    assert_eq!(read_units(&store)[&7], seven);
    // Addresses outside a unit, or of a unit the dataset lacks, name it.
    match store.gather(&[address(7, 40)], &[]) {
        Err(Error::UnitIndexOutOfRange {
            unit: 7,
            index: 40,
            len: 40,
        }) => {}
        other => panic!("{other:?}"),
    }
    let lacking = store.gather(&[address(9, 0)], &[]).unwrap_err();
    assert_eq!(
        lacking.to_string(),
        "record 0 of unit 9 is out of range: the unit holds 0 records"
    );
    assert!(matches!(
        store.gather(&[3], &[]),
        Err(Error::IndexOutOfRange { index: 3, len: 0 })
    ));
}

/// A dataset with hundreds of units holds no descriptors for the ones it is not writing
/// (a node holds a unit per slot, for every dataset).
#[test]
fn units_hold_no_descriptors_between_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let store = Store::create(&dir, fields(), options()).unwrap();
    let held = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.starts_with(&dir))
            .count()
    };
    let rows: Vec<Row> = (0..3).map(make_row).collect();
    let records: Vec<Record> = rows.iter().map(record).collect();
    for unit in 1..=300 {
        store.append_to(unit, &records).unwrap();
    }
    store.commit().unwrap();
    for unit in 301..=600 {
        store.append_to(unit, &records).unwrap();
    }
    // Unit 0's tables and chunk, the locks: a handful, whatever the number of units.
    assert!(held() < 16, "{} descriptors held", held());
    drop(store);
    let store = Store::open(&dir).unwrap();
    assert_eq!(store.units().len(), 301, "the uncommitted units are gone");
    assert!(held() < 16, "{} descriptors held after opening", held());
}

/// A snapshot of a dataset with units, its files written elsewhere, opens as the dataset
/// was at its last commit, every unit in it.
#[test]
fn a_snapshot_carries_every_unit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let store = Store::create(&dir, fields(), options()).unwrap();
    for unit in [0, 3, 12] {
        let rows: Vec<Row> = (0..30)
            .map(|k| make_row(u64::from(unit) * 100 + k))
            .collect();
        store
            .append_to(unit, &rows.iter().map(record).collect::<Vec<_>>())
            .unwrap();
    }
    store
        .modify(address(3, 4), &record(&make_row(7777)))
        .unwrap();
    store.commit().unwrap();
    let expected = read_units(&store);
    let snapshot = store.snapshot().unwrap();
    // Written after the snapshot: not in it.
    store.append_to(3, &[record(&make_row(5))]).unwrap();
    store.commit().unwrap();
    let copy = tmp.path().join("b");
    for file in &snapshot.files {
        let target = zr_node::ship::target_path(&copy, &file.name).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let mut bytes = Vec::new();
        let mut at = 0;
        while at < file.len() {
            let piece = file.read(at, 1 << 20).unwrap();
            at += piece.len() as u64;
            bytes.extend(piece);
        }
        std::fs::write(&target, bytes).unwrap();
    }
    assert!(
        snapshot
            .files
            .iter()
            .any(|f| f.name == "units/12.raw.offset"),
        "{:?}",
        snapshot.files.iter().map(|f| &f.name).collect::<Vec<_>>()
    );
    let copied = Store::open(&copy).unwrap();
    assert_eq!(read_units(&copied), expected);
    for bad in [
        "units/012.raw.offset",
        "units/0.raw.offset",
        "units/x.raw.offset",
        "units/3.raw",
        "units/3/raw.offset",
        "units/../a.offset",
        "units/3.a/raw.offset",
    ] {
        assert!(
            zr_node::ship::target_path(&copy, bad).is_err(),
            "{bad} accepted"
        );
    }
}

/// Units copied as files from one dataset's snapshot into another are taken whole: their
/// records at the same indices, their chunks their own, later appends after them; the units
/// the other holds are untouched, and a unit holding records here is refused.
#[test]
fn units_move_between_datasets_as_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let from = Store::create(&a, fields(), options()).unwrap();
    let to = Store::create(&b, fields(), options()).unwrap();
    let rows = |base: u64, n: u64| -> Vec<Row> { (0..n).map(|k| make_row(base + k)).collect() };
    let mut expected = Model::new();
    for (unit, base, n) in [(0, 0, 12), (4, 100, 30), (9, 200, 17)] {
        let rows = rows(base, n);
        from.append_to(unit, &rows.iter().map(record).collect::<Vec<_>>())
            .unwrap();
        expected.insert(unit, rows);
    }
    from.commit().unwrap();
    let kept = rows(500, 5);
    to.append_to(2, &kept.iter().map(record).collect::<Vec<_>>())
        .unwrap();
    to.commit().unwrap();
    let snapshot = from.snapshot_units(&[0, 4]).unwrap();
    assert_eq!(snapshot.len, 42);
    assert!(
        snapshot.files.iter().all(|f| !f.name.contains("units/9.")),
        "only the units asked for"
    );
    let copy = tmp.path().join("copy");
    for file in &snapshot.files {
        let target = zr_node::ship::target_path(&copy, &file.name).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, file.read(0, file.len() as usize).unwrap()).unwrap();
    }
    to.adopt_units(&copy, &[0, 4]).unwrap();
    assert_eq!(to.units(), [(0, 12), (2, 5), (4, 30)]);
    let more = rows(900, 3);
    to.append_to(4, &more.iter().map(record).collect::<Vec<_>>())
        .unwrap();
    to.commit().unwrap();
    drop(to);
    let to = Store::open(&b).unwrap();
    let found = read_units(&to);
    assert_eq!(found[&0], expected[&0]);
    assert_eq!(found[&2], kept);
    assert_eq!(found[&4], [expected[&4].clone(), more].concat());
    assert!(to.verify(|_| {}).unwrap().problems.is_empty());
    let e = to.adopt_units(&copy, &[2]).unwrap_err();
    assert!(e.to_string().contains("holds records here already"), "{e}");
}

/// Power cuts among appends to several units, deletes, modifies, drops and commits: the
/// reopened dataset holds exactly the last commit that returned, or the one in progress.
#[test]
fn power_cuts_lose_no_unit() {
    let cuts: u64 = std::env::var("ZR_POWER_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(200, |n: u64| n / 5);
    for cut in 0..cuts {
        let seed = mix(0x0417 ^ cut);
        one_cut(seed, 1 + mix(seed) % 400);
    }
}

fn one_cut(seed: u64, allowed: u64) {
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let dir = tmp.path().join("ds");
    let power = PowerCut::record(tmp.path());
    power.fail_after(allowed);
    let on_power = zr_node::RuntimeOptions {
        disk: power.disk(),
        ..zr_node::RuntimeOptions::default()
    };
    let mut committed: Option<Model> = None;
    let mut during: Option<Model> = None;
    let mut model: Model = [(0, Vec::new())].into();
    'run: {
        let Ok(store) = Store::create_with(&dir, fields(), options(), on_power) else {
            during = Some(model.clone());
            break 'run;
        };
        committed = Some(model.clone());
        for step in 0..40u64 {
            let r = mix(seed ^ mix(step));
            let unit = [0, 2, 9][(r % 3) as usize];
            let len = model.get(&unit).map_or(0, Vec::len) as u64;
            let outcome = match (r >> 8) % 16 {
                0..=2 => store.commit().map(|()| {
                    committed = Some(model.clone());
                }),
                3 => store.drop_unit(unit).map(|()| {
                    model.remove(&unit);
                    committed = Some(model.clone());
                }),
                4..=5 if len > 0 => {
                    let i = mix(r) % len;
                    store.delete(address(unit, i)).map(|()| {
                        model.get_mut(&unit).unwrap().swap_remove(i as usize);
                    })
                }
                6..=7 if len > 0 => {
                    let (i, row) = (mix(r) % len, make_row(mix(r + 1)));
                    store.modify(address(unit, i), &record(&row)).map(|()| {
                        model.get_mut(&unit).unwrap()[i as usize] = row;
                    })
                }
                _ => {
                    let rows: Vec<Row> = (0..1 + r % 4).map(|k| make_row(mix(r + k))).collect();
                    let records: Vec<Record> = rows.iter().map(record).collect();
                    store.append_to(unit, &records).map(|_| {
                        model.entry(unit).or_default().extend(rows);
                    })
                }
            };
            if let Err(e) = outcome {
                assert!(power.failed(), "seed {seed}: {e} without a power cut");
                // A failed commit (or drop, which commits) was writing the model as it is.
                let mut writing = model.clone();
                if (r >> 8) % 16 == 3 {
                    writing.remove(&unit);
                }
                during = Some(writing);
                break 'run;
            }
        }
    }
    power.fail_now();
    power
        .cut(|k| mix(seed ^ mix(allowed) ^ k as u64) & 1 == 0)
        .unwrap();
    let store = match Store::open(&dir) {
        Ok(store) => store,
        Err(e) => {
            assert!(
                committed.is_none(),
                "seed {seed}, cut after {allowed}: the dataset does not open: {e}"
            );
            return;
        }
    };
    let found = read_units(&store);
    let matches = |state: &Option<Model>| state.as_ref() == Some(&found);
    assert!(
        matches(&committed) || matches(&during),
        "seed {seed}, cut after {allowed}: found units {:?}; the last commit held {:?}, the one in progress {:?}",
        store.units(),
        committed.as_ref().map(|m| m.iter().map(|(u, r)| (*u, r.len())).collect::<Vec<_>>()),
        during.as_ref().map(|m| m.iter().map(|(u, r)| (*u, r.len())).collect::<Vec<_>>()),
    );
    let report = store.verify(|_| {}).unwrap();
    assert!(
        report.problems.is_empty(),
        "seed {seed}: {:?}",
        report.problems
    );
    // No file of a unit it lacks is left.
    let held: Vec<u32> = store.units().iter().map(|&(u, _)| u).collect();
    for entry in std::fs::read_dir(dir.join("chunk")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let id: u32 = name.trim_end_matches(".zr").parse().unwrap();
        assert!(
            held.contains(&chunk_unit(id)),
            "seed {seed}: chunk {name} left"
        );
    }
    store.append_to(2, &[record(&make_row(1))]).unwrap();
    store.commit().unwrap();
}
