//! Model-based property test: random sequences of append / modify / delete / commit / reopen
//! against a `Vec` model, with every gather checked against it (raw and flate fields).

use proptest::prelude::*;
use zr_node::{CreateOptions, FieldSpec, GatherOptions, Record, Store};

const FIELDS: [&str; 2] = ["raw", "zip"];

#[derive(Clone, Debug)]
enum Op {
    /// Append records given as (seed, length, which fields present as a bitmask).
    Append(Vec<(u8, u16, u8)>),
    Modify(usize, (u8, u16, u8)),
    Delete(usize),
    Commit,
    Reopen,
    Gather(Vec<usize>, u8),
}

fn record_strategy() -> impl Strategy<Value = (u8, u16, u8)> {
    (any::<u8>(), 0u16..700, 0u8..4)
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(record_strategy(), 1..8).prop_map(Op::Append),
        // Large enough to be split across the writers.
        1 => prop::collection::vec(record_strategy(), 64..90).prop_map(Op::Append),
        2 => (any::<usize>(), record_strategy()).prop_map(|(i, r)| Op::Modify(i, r)),
        2 => any::<usize>().prop_map(Op::Delete),
        1 => Just(Op::Commit),
        1 => Just(Op::Reopen),
        3 => (prop::collection::vec(any::<usize>(), 0..20), 1u8..4).prop_map(|(v, m)| Op::Gather(v, m)),
    ]
}

/// A payload: half a repeating pattern (so Deflate has something to do), half pseudo-random.
fn payload(seed: u8, len: u16, field: usize) -> Vec<u8> {
    let mut x = (seed as u32)
        .wrapping_mul(2654435761)
        .wrapping_add(field as u32 + 1)
        | 1;
    (0..len as usize)
        .map(|i| {
            if i % 2 == 0 {
                (seed as usize + i / 16) as u8
            } else {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            }
        })
        .collect()
}

type Row = [Vec<u8>; 2];

fn row((seed, len, mask): (u8, u16, u8)) -> Row {
    [0, 1].map(|f| {
        if mask & (1 << f) != 0 {
            payload(seed, len, f)
        } else {
            Vec::new()
        }
    })
}

fn record(row: &Row) -> Record<'_> {
    let mut r = Record::new();
    // Every field named (an empty payload is an absent field): a modify replaces it all.
    for (f, name) in FIELDS.iter().enumerate() {
        r.set(name, &row[f]);
    }
    r
}

fn check_all(store: &Store, model: &[Row]) {
    assert_eq!(store.len(), model.len() as u64);
    let indices: Vec<u64> = (0..model.len() as u64).collect();
    let batch = store
        .gather_with(&indices, &[], GatherOptions::verified())
        .unwrap();
    for (f, name) in FIELDS.iter().enumerate() {
        let field = batch.field(name).unwrap();
        for (i, row) in model.iter().enumerate() {
            assert_eq!(
                field.get(i).unwrap(),
                &row[f][..],
                "field {name} record {i}"
            );
        }
    }
}

fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ds");
    let options = CreateOptions {
        chunk_records: 3,
        chunk_grow_bytes: 4096,
        offset_grow_entries: 5,
    };
    let mut store = Store::create(
        &path,
        vec![FieldSpec::raw(FIELDS[0]), FieldSpec::flate(FIELDS[1])],
        options,
    )
    .unwrap();
    let mut model: Vec<Row> = Vec::new();
    let mut committed: Vec<Row> = Vec::new();
    for op in ops {
        match op {
            Op::Append(specs) => {
                let rows: Vec<Row> = specs.into_iter().map(row).collect();
                let records: Vec<Record> = rows.iter().map(record).collect();
                let range = store.append_many(&records).unwrap();
                assert_eq!(range.start, model.len() as u64);
                model.extend(rows);
            }
            Op::Modify(i, spec) if !model.is_empty() => {
                let i = i % model.len();
                let new = row(spec);
                store.modify(i as u64, &record(&new)).unwrap();
                model[i] = new;
            }
            Op::Delete(i) if !model.is_empty() => {
                let i = i % model.len();
                store.delete(i as u64).unwrap();
                model.swap_remove(i);
            }
            Op::Commit => {
                store.commit().unwrap();
                committed = model.clone();
            }
            Op::Reopen => {
                drop(store);
                store = Store::open(&path).unwrap();
                model = committed.clone();
                check_all(&store, &model);
            }
            Op::Gather(picks, mask) if !model.is_empty() => {
                let indices: Vec<u64> = picks.iter().map(|&p| (p % model.len()) as u64).collect();
                let names: Vec<&str> = (0..2)
                    .filter(|f| mask & (1 << f) != 0)
                    .map(|f| FIELDS[f])
                    .collect();
                let batch = store.gather(&indices, &names).unwrap();
                for name in &names {
                    let f = FIELDS.iter().position(|n| n == name).unwrap();
                    let field = batch.field(name).unwrap();
                    let contiguous = field.to_contiguous();
                    for (pos, &i) in indices.iter().enumerate() {
                        assert_eq!(field.get(pos).unwrap(), &model[i as usize][f][..]);
                        assert_eq!(contiguous.get(pos).unwrap(), &model[i as usize][f][..]);
                    }
                }
            }
            _ => {}
        }
    }
    check_all(&store, &model);
    drop(store);
    let store = Store::open(&path).unwrap();
    check_all(&store, &committed);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(ops in prop::collection::vec(op_strategy(), 1..60)) {
        run(ops);
    }
}
