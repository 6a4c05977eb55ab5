//! Crash consistency: a child process writes (appends, modifies, deletes, commits) until it is
//! killed with SIGKILL at a random moment; the parent reopens the dataset and checks that it
//! holds exactly the state of the last commit that landed — nothing committed lost, nothing
//! uncommitted visible — then lets the next child continue on the same dataset.
//!
//! The workload is a pure function of (seed, round, step, current length), so the parent
//! replays it to know every committed state.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use zr_node::{CreateOptions, FieldSpec, GatherOptions, Record, Store};

const CHILD_DIR: &str = "ZR_CRASH_CHILD_DIR";
const CHILD_ROUND: &str = "ZR_CRASH_CHILD_ROUND";
const SEED: u64 = 0x5eed_c4a5;
const ROUNDS: u64 = 10;

type Row = [Vec<u8>; 2];

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn make_row(r: u64) -> Row {
    let len = (r % 1500) as usize;
    let raw: Vec<u8> = (0..len).map(|i| mix(r ^ i as u64) as u8).collect();
    let zip: Vec<u8> = if r.is_multiple_of(5) {
        Vec::new()
    } else {
        (0..len * 2).map(|i| (i / 7) as u8 ^ r as u8).collect()
    };
    [raw, zip]
}

enum Op {
    Append(Vec<Row>),
    Modify(u64, Row),
    Delete(u64),
    Commit,
}

fn op(round: u64, step: u64, len: u64) -> Op {
    let r = mix(SEED ^ mix(round << 32 | step));
    match r % 16 {
        0..=2 => Op::Commit,
        3..=4 if len > 0 => Op::Delete(mix(r) % len),
        5..=7 if len > 0 => Op::Modify(mix(r) % len, make_row(mix(r + 1))),
        _ => Op::Append((0..1 + r % 5).map(|k| make_row(mix(r + k))).collect()),
    }
}

fn record(row: &Row) -> Record<'_> {
    let mut rec = Record::new().with("raw", &row[0]);
    if !row[1].is_empty() {
        rec.set("zip", &row[1]);
    }
    rec
}

fn options() -> CreateOptions {
    CreateOptions {
        chunk_records: 7,
        chunk_grow_bytes: 64 << 10,
        offset_grow_entries: 16,
    }
}

/// Replays `round` on `model` until `commits` commits have happened.
fn replay(model: &mut Vec<Row>, round: u64, commits: u64) {
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

fn generation(dir: &Path) -> u64 {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
    meta["generation"].as_u64().unwrap()
}

/// The child's body: runs round `round` on the dataset until killed.
#[test]
#[ignore = "child process of crash_recovers_last_commit"]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let round: u64 = std::env::var(CHILD_ROUND).unwrap().parse().unwrap();
    let dir = Path::new(&dir);
    let store = if dir.join("meta.json").exists() {
        Store::open(dir).unwrap()
    } else {
        Store::create(
            dir,
            vec![FieldSpec::raw("raw"), FieldSpec::flate("zip")],
            options(),
        )
        .unwrap()
    };
    for step in 0.. {
        match op(round, step, store.len()) {
            Op::Append(rows) => {
                let records: Vec<Record> = rows.iter().map(record).collect();
                store.append_many(&records).unwrap();
            }
            Op::Modify(i, row) => store.modify(i, &record(&row)).unwrap(),
            Op::Delete(i) => store.delete(i).unwrap(),
            Op::Commit => {
                store.commit().unwrap();
                println!("commit {step}");
            }
        }
    }
}

#[test]
fn crash_recovers_last_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let mut model: Vec<Row> = Vec::new();
    let mut last_generation = 0;
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, &dir)
            .env(CHILD_ROUND, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Kill after a pseudo-random number of acknowledged commits plus a random delay, so
        // the kill lands anywhere: mid-append, mid-commit, between commits.
        let wait_commits = mix(SEED + round) % 12;
        let delay = Duration::from_micros(mix(SEED ^ round) % 20_000);
        let reader = std::thread::spawn(move || {
            let mut acked = 0u64;
            let mut lines = BufReader::new(stdout).lines();
            while acked < wait_commits {
                match lines.next() {
                    Some(Ok(line)) if line.contains("commit ") => acked += 1,
                    Some(_) => {}
                    None => break,
                }
            }
            (acked, lines)
        });
        let (mut acked, lines) = reader.join().unwrap();
        std::thread::sleep(delay);
        child.kill().unwrap();
        child.wait().unwrap();
        acked += lines
            .map_while(Result::ok)
            .filter(|l| l.contains("commit "))
            .count() as u64;

        if !dir.join("meta.json").exists() {
            continue; // killed before the dataset was created
        }
        let generation = generation(&dir);
        let commits = generation - last_generation;
        assert!(
            commits == acked || commits == acked + 1,
            "round {round}: {acked} commits acknowledged but generation moved by {commits}"
        );
        replay(&mut model, round, commits);
        last_generation = generation;

        let store = Store::open(&dir).unwrap();
        assert_eq!(
            store.len(),
            model.len() as u64,
            "round {round}: length after reopen"
        );
        let indices: Vec<u64> = (0..model.len() as u64).collect();
        let batch = store
            .gather_with(&indices, &[], GatherOptions::verified())
            .unwrap();
        for (f, name) in ["raw", "zip"].iter().enumerate() {
            let field = batch.field(name).unwrap();
            for (i, row) in model.iter().enumerate() {
                assert!(
                    field.get(i).unwrap() == &row[f][..],
                    "round {round}: field {name} record {i} differs"
                );
            }
        }
    }
    assert!(
        last_generation > 0,
        "no commit ever landed: the test exercised nothing"
    );
}
