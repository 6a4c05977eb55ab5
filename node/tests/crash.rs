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

mod workload;

use workload::{mix, op, options, record, replay, Op, Row, SEED};
use zr_node::{FieldSpec, GatherOptions, Record, Store};

const CHILD_DIR: &str = "ZR_CRASH_CHILD_DIR";
const CHILD_ROUND: &str = "ZR_CRASH_CHILD_ROUND";
/// Rounds, unless `ZR_CRASH_ROUNDS` says (`ops/crash-campaign.sh` runs 1,000).
const ROUNDS: u64 = 10;

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
    let rounds = std::env::var("ZR_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(ROUNDS);
    let mut total_acked = 0;
    for round in 0..rounds {
        if round > 0 && round % 100 == 0 {
            println!("crash campaign: {round} of {rounds} rounds, {total_acked} commits acknowledged, no failure");
        }
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
        total_acked += acked;

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
    println!(
        "crash campaign: {rounds} rounds, each killed with SIGKILL at a random point; \
         {total_acked} commits acknowledged, {last_generation} landed; 0 failures"
    );
}
