//! The cluster on virtual time (`SimOptions::virtual_time`): one thread, tokio's clock paused
//! and moved on only when every task waits, so timeouts and delays of any length take no
//! real time, and a seed names a whole run — faults, operations, and the order of events —
//! which `ZR_SIM_SEED=<seed>` replays exactly.

use std::time::Duration;

use tokio::time::Instant;
use zr_common::hash::mix2;
use zr_common::Record;
use zr_router::AsyncClient;
use zr_sim::{Faults, SimCluster, SimOptions};

fn start(seed: u64, timeout_ms: u64) -> SimCluster {
    SimCluster::start(
        3,
        SimOptions {
            extent_records: 3,
            timeout_ms,
            seed,
            virtual_time: true,
            ..SimOptions::default()
        },
    )
    .unwrap()
}

fn row(seed: u64) -> Vec<u8> {
    let len = (mix2(seed, 1) % 300) as usize;
    (0..len).map(|i| mix2(seed, i as u64) as u8).collect()
}

/// What a run did: a digest of every byte it gathered, the datagrams each node lost, and how
/// long it took on the cluster's clock.
#[derive(Debug, PartialEq)]
struct Transcript {
    gathered: u64,
    lost: Vec<u64>,
    took: Duration,
}

/// A seed's run, twice: random appends, modifies, deletes and gathers under loss and delay
/// equal a model, and the second run goes exactly as the first.
#[test]
fn a_lossy_run_matches_a_model_and_replays_exactly() {
    let seed = zr_sim::SimOptions::default().seed;
    eprintln!("seed {seed} (ZR_SIM_SEED={seed} replays this run exactly)");
    let first = lossy_run(seed);
    assert!(
        first.lost.iter().sum::<u64>() > 0,
        "nothing lost: {first:?}"
    );
    eprintln!("{first:?}");
    let again = lossy_run(seed);
    assert_eq!(first, again, "seed {seed}: the second run went otherwise");
}

/// Random appends, modifies, deletes and gathers under loss and delay, checked against a model.
fn lossy_run(seed: u64) -> Transcript {
    let cluster = start(seed, 5_000);
    for shard in 0..3 {
        let faults = Faults {
            loss: 0.03 * shard as f64,
            delay: Duration::from_millis(1 + shard as u64),
            partitioned: false,
        };
        cluster.set_faults(shard, faults).unwrap();
    }
    let client = cluster.async_client().unwrap();
    let mut gathered = 0u64;
    let (took, calls) = cluster.run(async {
        let began = Instant::now();
        let mut model: Vec<Vec<u8>> = Vec::new();
        let mut calls = 0u32;
        for step in 0..80u64 {
            let r = mix2(seed, step);
            if !model.is_empty() || r % 6 < 2 {
                calls += 1;
            }
            match r % 6 {
                0 | 1 => {
                    let rows: Vec<Vec<u8>> = (0..1 + r % 40).map(|k| row(r ^ k)).collect();
                    let records: Vec<Record> =
                        rows.iter().map(|r| Record::new().with("data", r)).collect();
                    let range = client.append_many(&records).await.unwrap();
                    assert_eq!(range.start, model.len() as u64);
                    model.extend(rows);
                }
                2 if !model.is_empty() => {
                    let i = mix2(r, 2) % model.len() as u64;
                    let new = row(r);
                    client
                        .modify(i, &Record::new().with("data", &new))
                        .await
                        .unwrap();
                    model[i as usize] = new;
                }
                3 if !model.is_empty() => {
                    let i = mix2(r, 3) % model.len() as u64;
                    client.delete(i).await.unwrap();
                    model.swap_remove(i as usize);
                }
                _ if !model.is_empty() => {
                    let indices: Vec<u64> = (0..1 + r % 50)
                        .map(|k| mix2(r, k) % model.len() as u64)
                        .collect();
                    let columns = client.gather(&indices, &[]).await.unwrap();
                    for (pos, &i) in indices.iter().enumerate() {
                        assert!(
                            columns[0].get(pos).unwrap() == &model[i as usize][..],
                            "seed {seed}: record {i} differs"
                        );
                    }
                    for &byte in &columns[0].data {
                        gathered = mix2(gathered, byte.into());
                    }
                }
                _ => {}
            }
        }
        client.commit().await.unwrap();
        assert_eq!(client.len().await.unwrap(), model.len() as u64);
        (began.elapsed(), calls + 2)
    });
    // Every call waits for some node's reply, and every node's datagrams leave at least
    // 1 ms late on the cluster's clock.
    assert!(
        took >= Duration::from_millis(calls.into()),
        "{took:?} for {calls} calls"
    );
    Transcript {
        gathered,
        lost: (0..3).map(|shard| cluster.datagrams_lost(shard)).collect(),
        took,
    }
}

/// A partitioned node, and then a stalled one, fail the requests that need them once the
/// router's timeout has run out on the cluster's clock — a minute here, which takes no real
/// time — and serve again once healed.
#[test]
fn a_partition_times_out_on_the_clusters_clock() {
    let timeout = Duration::from_secs(60);
    let mut cluster = start(7, timeout.as_millis() as u64);
    let client = cluster.async_client().unwrap();
    cluster.run(async {
        let records: Vec<Vec<u8>> = (0..30).map(row).collect();
        let batch: Vec<Record> = records
            .iter()
            .map(|r| Record::new().with("data", r))
            .collect();
        client.append_many(&batch).await.unwrap();
        client.commit().await.unwrap();
    });
    cluster
        .set_faults(
            1,
            Faults {
                partitioned: true,
                ..Faults::default()
            },
        )
        .unwrap();
    let all: Vec<u64> = (0..30).collect();
    times_out(&cluster, &client, &all, 1, timeout);
    cluster.set_faults(1, Faults::default()).unwrap();
    let columns = cluster
        .run(async { client.gather(&all, &[]).await })
        .unwrap();
    assert_eq!(columns[0].get(29).unwrap(), &row(29)[..]);

    // A node that takes requests and never answers: the same minute, then the same error.
    cluster.stall_node(2).unwrap();
    times_out(&cluster, &client, &all, 2, timeout);
    cluster.start_node(2).unwrap();
    let columns = cluster
        .run(async { client.gather(&all, &[]).await })
        .unwrap();
    assert_eq!(columns[0].get(0).unwrap(), &row(0)[..]);
}

/// A gather of `indices` fails naming `shard` once `timeout` has run out on the cluster's
/// clock, and not much later.
fn times_out(
    cluster: &SimCluster,
    client: &AsyncClient,
    indices: &[u64],
    shard: u32,
    timeout: Duration,
) {
    let real = std::time::Instant::now();
    let (failed, waited) = cluster.run(async {
        let began = Instant::now();
        let failed = client.gather(indices, &[]).await.unwrap_err().to_string();
        (failed, began.elapsed())
    });
    // Not a measure of speed: a clock that is not virtual would take the whole timeout.
    let real = real.elapsed();
    assert!(
        real < timeout / 2,
        "{real:?} of real time: the clock is not virtual"
    );
    assert!(failed.contains(&format!("shard {shard}")), "{failed}");
    assert!(
        waited >= timeout && waited < timeout + Duration::from_secs(5),
        "failed after {waited:?} of the cluster's clock: {failed}"
    );
}
