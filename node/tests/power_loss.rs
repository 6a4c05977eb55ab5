//! Power cuts, not just `kill -9`: the store runs the workload of `crash.rs` under a
//! [`PowerCut`] recorder, the power fails at a chosen change to its files (mid-append,
//! mid-commit, between commits), and then a random subset of the writes not yet synced is
//! lost, and a suffix of each directory's unsynced renames and creations. Now and then the
//! workload rebalances (commit, close, rewrite, reopen), so cuts land inside rebalances too.
//! Reopened, the store must hold exactly the last commit that returned — or, when the cut
//! came inside a commit, that commit's state — verify clean, and accept writes again.
//!
//! `ZR_POWER_CUTS` sets the number of cuts (default 1,000), `ZR_POWER_SEED` the first seed
//! (default: fixed; CI adds runs with fresh ones, printed).

mod workload;

use std::path::Path;

use workload::{fields, mix, op, options, read_all, record, Op, Row};
use zr_node::disk::PowerCut;
use zr_node::{Record, RuntimeOptions, Store};

/// Steps of the workload per cut.
const STEPS: u64 = 40;

/// How one cut went, for the summary.
#[derive(Default)]
struct Tally {
    cuts: u64,
    mid_commit: u64,
    rebalances: u64,
    mid_rebalance: u64,
    lost_writes: u64,
    at_previous_commit: u64,
}

/// Scratch space in memory where there is one: syncs are then free, and only the recorder
/// decides what survives.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// One cut: the workload of `seed` until the power fails after `allowed` changes.
fn one_cut(seed: u64, allowed: u64, tally: &mut Tally) {
    let tmp = scratch();
    let dir = tmp.path().join("ds");
    let power = PowerCut::record(tmp.path());
    power.fail_after(allowed);
    let disk = power.disk();
    let on_power = || RuntimeOptions {
        disk: disk.clone(),
        ..RuntimeOptions::default()
    };
    // The committed states: before the first commit there is no dataset; `during` is the
    // state a commit in progress at the cut was writing.
    let mut committed: Option<Vec<Row>> = None;
    let mut during: Option<Vec<Row>> = None;
    let mut model: Vec<Row> = Vec::new();
    'run: {
        let Ok(mut store) = Store::create_with(&dir, fields(), options(), on_power()) else {
            // Cut while creating: meta.json, written last, may or may not have landed.
            during = Some(Vec::new());
            break 'run;
        };
        committed = Some(Vec::new());
        for step in 0..STEPS {
            // Now and then a rebalance (it needs the dataset to itself): commit, close,
            // rewrite, reopen. It changes no record, so the committed state stays.
            if mix(seed ^ mix(step)).is_multiple_of(16) {
                match store.commit() {
                    Ok(()) => committed = Some(model.clone()),
                    Err(_) => {
                        during = Some(model.clone());
                        break 'run;
                    }
                }
                drop(store);
                tally.rebalances += 1;
                let rebalanced = zr_node::rebalance::rebalance_on(&disk, &dir, |_, _| {});
                store = match (rebalanced, Store::open_with(&dir, on_power())) {
                    (Ok(_), Ok(store)) => store,
                    _ => {
                        assert!(
                            power.failed(),
                            "seed {seed}: a rebalance failed without a power cut"
                        );
                        tally.mid_rebalance += 1;
                        break 'run;
                    }
                };
            }
            let outcome = match op(seed, step, model.len() as u64) {
                Op::Append(rows) => {
                    let records: Vec<Record> = rows.iter().map(record).collect();
                    let done = store.append_many(&records).map(|_| ());
                    if done.is_ok() {
                        model.extend(rows);
                    }
                    done
                }
                Op::Modify(i, row) => {
                    let done = store.modify(i, &record(&row));
                    if done.is_ok() {
                        model[i as usize] = row;
                    }
                    done
                }
                Op::Delete(i) => {
                    let done = store.delete(i);
                    if done.is_ok() {
                        model.swap_remove(i as usize);
                    }
                    done
                }
                Op::Commit => match store.commit() {
                    Ok(()) => {
                        committed = Some(model.clone());
                        Ok(())
                    }
                    Err(e) => {
                        during = Some(model.clone());
                        Err(e)
                    }
                },
            };
            if outcome.is_err() {
                assert!(power.failed(), "seed {seed}: an error without a power cut");
                break 'run;
            }
        }
    }
    // Whatever the store still holds in memory is lost with the power.
    power.fail_now();
    let pending = power.pending();
    let mut lost = 0;
    power
        .cut(|k| {
            let kept = mix(seed ^ mix(allowed) ^ k as u64) & 1 == 0;
            lost += u64::from(!kept);
            kept
        })
        .unwrap();
    tally.cuts += 1;
    tally.lost_writes += lost;
    if during.is_some() {
        tally.mid_commit += 1;
    }

    let store = match Store::open(&dir) {
        Ok(store) => store,
        Err(e) => {
            assert!(
                committed.is_none(),
                "seed {seed}, cut after {allowed} changes ({pending} pending, {lost} lost): \
                 the store does not open: {e}"
            );
            return;
        }
    };
    let found = read_all(&store).unwrap_or_else(|e| {
        panic!("seed {seed}, cut after {allowed} changes: gathering every record: {e}")
    });
    let matches = |state: &Option<Vec<Row>>| state.as_ref() == Some(&found);
    assert!(
        matches(&committed) || matches(&during),
        "seed {seed}, cut after {allowed} changes ({pending} pending, {lost} lost): \
         {} records found; the last commit held {:?}, the one in progress {:?}",
        found.len(),
        committed.as_ref().map(Vec::len),
        during.as_ref().map(Vec::len),
    );
    if during.is_some() && matches(&committed) {
        tally.at_previous_commit += 1;
    }
    let report = store.verify(|_| {}).unwrap();
    assert!(
        report.problems.is_empty(),
        "seed {seed}, cut after {allowed} changes: verify found {:?}",
        report.problems
    );
    // And it takes writes again.
    store
        .append(&record(&[b"after".to_vec(), Vec::new()]))
        .unwrap();
    store.commit().unwrap();
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn power_cuts_lose_nothing_committed() {
    let cuts = env_u64("ZR_POWER_CUTS").unwrap_or(1_000);
    let first = env_u64("ZR_POWER_SEED").unwrap_or(0x90_7e4);
    println!("power cuts: {cuts}, seeds from {first}");
    let mut tally = Tally::default();
    for k in 0..cuts {
        let seed = first + k;
        // The workload makes a few hundred changes; cut anywhere in them (or after all).
        let allowed = mix(seed) % 400;
        one_cut(seed, allowed, &mut tally);
    }
    println!(
        "{} cuts: {} inside a commit ({} of them back at the commit before), {} inside one of \
         {} rebalances, {} unsynced changes lost",
        tally.cuts,
        tally.mid_commit,
        tally.at_previous_commit,
        tally.mid_rebalance,
        tally.rebalances,
        tally.lost_writes
    );
    // The cuts must have tested something: commits cut midway, and writes lost.
    if cuts >= 100 {
        assert!(tally.mid_commit > 0, "no cut landed inside a commit");
        assert!(tally.mid_rebalance > 0, "no cut landed inside a rebalance");
        assert!(tally.lost_writes > 0, "no cut lost a write");
    }
}
