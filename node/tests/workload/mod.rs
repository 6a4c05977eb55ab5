//! The crash tests' workload: appends, modifies, deletes and commits drawn from a seed, and
//! the model of the records they leave. A pure function of (seed, round, step, current
//! length), so a test can replay it to know every committed state.
#![allow(dead_code)]

use zr_node::{CreateOptions, Record};

pub const SEED: u64 = 0x5eed_c4a5;

pub type Row = [Vec<u8>; 2];

pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

pub fn make_row(r: u64) -> Row {
    let len = (r % 1500) as usize;
    let raw: Vec<u8> = (0..len).map(|i| mix(r ^ i as u64) as u8).collect();
    let zip: Vec<u8> = if r.is_multiple_of(5) {
        Vec::new()
    } else {
        (0..len * 2).map(|i| (i / 7) as u8 ^ r as u8).collect()
    };
    [raw, zip]
}

pub enum Op {
    Append(Vec<Row>),
    Modify(u64, Row),
    Delete(u64),
    Commit,
}

pub fn op(round: u64, step: u64, len: u64) -> Op {
    let r = mix(SEED ^ mix(round << 32 | step));
    match r % 16 {
        0..=2 => Op::Commit,
        3..=4 if len > 0 => Op::Delete(mix(r) % len),
        5..=7 if len > 0 => Op::Modify(mix(r) % len, make_row(mix(r + 1))),
        _ => Op::Append((0..1 + r % 5).map(|k| make_row(mix(r + k))).collect()),
    }
}

/// Every field named (an empty payload is an absent field), so that a modify replaces the
/// whole record.
pub fn record(row: &Row) -> Record<'_> {
    Record::new().with("raw", &row[0]).with("zip", &row[1])
}

pub fn options() -> CreateOptions {
    CreateOptions {
        chunk_records: 7,
        chunk_grow_bytes: 64 << 10,
        offset_grow_entries: 16,
    }
}

/// Replays `round` on `model` until `commits` commits have happened.
pub fn replay(model: &mut Vec<Row>, round: u64, commits: u64) {
    let mut done = 0;
    let mut step = 0;
    while done < commits {
        match op(round, step, model.len() as u64) {
            Op::Append(rows) => model.extend(rows),
            Op::Modify(i, row) => model[i as usize] = row,
            Op::Delete(i) => {
                model.swap_remove(i as usize);
            }
            Op::Commit => done += 1,
        }
        step += 1;
    }
}

/// The fields the workload writes.
pub fn fields() -> Vec<zr_node::FieldSpec> {
    vec![
        zr_node::FieldSpec::raw("raw"),
        zr_node::FieldSpec::flate("zip"),
    ]
}

/// Every record of `store`, read with its frames and CRCs checked.
pub fn read_all(store: &zr_node::Store) -> Result<Vec<Row>, String> {
    let indices: Vec<u64> = (0..store.len()).collect();
    let batch = store
        .gather_with(&indices, &[], zr_node::GatherOptions::verified())
        .map_err(|e| e.to_string())?;
    let raw = batch.field("raw").ok_or("no field raw")?;
    let zip = batch.field("zip").ok_or("no field zip")?;
    (0..indices.len())
        .map(|i| match (raw.get(i), zip.get(i)) {
            (Some(r), Some(z)) => Ok([r.to_vec(), z.to_vec()]),
            _ => Err(format!("record {i} missing from its batch")),
        })
        .collect()
}
