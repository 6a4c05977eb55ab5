//! The cluster over a faulty network, through the simulator: datagrams lost and delayed on
//! the way to and from every node change no answer, and writes cut off by faults land whole
//! or not at all. Every test prints its seed; `ZR_SIM_SEED=<seed>` replays its faults and
//! operations (the write test runs on virtual time, and replays exactly).

use std::time::Duration;

use zr_common::hash::mix2;
use zr_common::Record;
use zr_router::{AsyncClient, Client};
use zr_sim::{Faults, SimCluster, SimOptions};

fn start(shards: u32, timeout_ms: u64) -> SimCluster {
    let cluster = SimCluster::start(
        shards,
        SimOptions {
            extent_records: 3,
            timeout_ms,
            ..SimOptions::default()
        },
    )
    .unwrap();
    eprintln!(
        "seed {0} (ZR_SIM_SEED={0} replays this run's faults and operations)",
        cluster.seed()
    );
    cluster
}

fn row(seed: u64) -> Vec<u8> {
    zr_tests::bytes(seed, 0, 500)
}

fn check(client: &Client, model: &[Vec<u8>], indices: &[u64]) {
    zr_tests::check_first(client, indices, |i| &model[i as usize]);
}

fn check_all(client: &Client, model: &[Vec<u8>]) {
    assert_eq!(client.len().unwrap(), model.len() as u64);
    let all: Vec<u64> = (0..model.len() as u64).collect();
    check(client, model, &all);
}

#[test]
fn loss_and_delay_change_no_answer() {
    let cluster = start(4, 5_000);
    let seed = cluster.seed();
    // Each node a little worse than the one before: up to 6% lost each way, 3 ms late.
    for shard in 0..4 {
        let faults = Faults {
            loss: 0.02 * shard as f64,
            delay: Duration::from_millis(shard as u64),
            partitioned: false,
        };
        cluster.set_faults(shard, faults).unwrap();
    }
    let client = cluster.client().unwrap();
    let mut model: Vec<Vec<u8>> = Vec::new();
    for step in 0..150u64 {
        let r = mix2(seed, step);
        match r % 8 {
            0..=2 => {
                let rows: Vec<Vec<u8>> = (0..1 + r % 60).map(|k| row(r ^ k)).collect();
                let records: Vec<Record> =
                    rows.iter().map(|r| Record::new().with("data", r)).collect();
                let range = client.append_many(&records).unwrap();
                assert_eq!(range.start, model.len() as u64);
                model.extend(rows);
            }
            3 if !model.is_empty() => {
                let i = mix2(r, 2) % model.len() as u64;
                let new = row(r);
                client.modify(i, &Record::new().with("data", &new)).unwrap();
                model[i as usize] = new;
            }
            4 if !model.is_empty() => {
                let i = mix2(r, 3) % model.len() as u64;
                client.delete(i).unwrap();
                model.swap_remove(i as usize);
            }
            5 => client.commit().unwrap(),
            _ if !model.is_empty() => {
                let indices: Vec<u64> = (0..1 + r % 200)
                    .map(|k| mix2(r, k) % model.len() as u64)
                    .collect();
                check(&client, &model, &indices);
            }
            _ => {}
        }
    }
    check_all(&client, &model);
    let lost: Vec<u64> = (0..4).map(|shard| cluster.datagrams_lost(shard)).collect();
    eprintln!("datagrams lost per shard: {lost:?}");
    assert!(lost[0] == 0 && lost[1..].iter().all(|&n| n > 0), "{lost:?}");
}

/// What a write does to the model if it lands.
type Effect = Box<dyn FnOnce(&mut Vec<Vec<u8>>)>;

/// Step `r`'s write through `client` on a cluster of `len` records: its result, and what
/// the cluster holds if it lands.
async fn write(client: &AsyncClient, r: u64, len: u64) -> (Result<(), zr_router::Error>, Effect) {
    match mix2(r, 3) % 3 {
        0 => {
            let rows: Vec<Vec<u8>> = (0..1 + mix2(r, 4) % 30).map(|k| row(r ^ k)).collect();
            let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
            let result = client.append_many(&records).await.map(|_| ());
            (result, Box::new(move |m: &mut Vec<Vec<u8>>| m.extend(rows)))
        }
        1 => {
            let i = mix2(r, 5) % len;
            let new = row(r);
            let result = client.modify(i, &Record::new().with("data", &new)).await;
            (
                result,
                Box::new(move |m: &mut Vec<Vec<u8>>| m[i as usize] = new),
            )
        }
        _ => {
            let i = mix2(r, 6) % len;
            let result = client.delete(i).await;
            (
                result,
                Box::new(move |m: &mut Vec<Vec<u8>>| {
                    m.swap_remove(i as usize);
                }),
            )
        }
    }
}

/// A write while the network fails around it: a node partitioned before or during the
/// write, lossy, or so slow that its replies come about when the router gives up. Once the
/// faults heal and the next write has run through the other of two routers or a router
/// started just then (which repairs what a cut-off write left), the cluster holds either
/// every effect of the write or none — never part of an append, a record twice, or a record
/// lost — and a write that succeeded is always there. On virtual time, so that a seed
/// replays the whole run, the moment of each partition included. Runs fixed seeds (the same
/// in every run) and one fresh seed (printed), and checks that faults failed some writes in
/// each, so that the test always tests something. (Stopped nodes: `failures.rs`.)
#[test]
fn a_write_cut_off_by_a_fault_lands_whole_or_not_at_all() {
    let fresh = SimOptions::default().seed;
    for seed in [1, 2, 3, fresh] {
        let (landed, undone) = writes_cut_off_by_faults(seed);
        assert!(
            landed + undone > 0,
            "seed {seed}: no write failed, so no fault cut one off"
        );
    }
}

/// One run of [`a_write_cut_off_by_a_fault_lands_whole_or_not_at_all`] with `seed`; returns
/// how many failed writes landed whole, and how many were undone whole.
fn writes_cut_off_by_faults(seed: u64) -> (u32, u32) {
    const TIMEOUT_MS: u64 = 400;
    let mut cluster = SimCluster::start(
        4,
        SimOptions {
            extent_records: 3,
            timeout_ms: TIMEOUT_MS,
            virtual_time: true,
            seed,
            ..SimOptions::default()
        },
    )
    .unwrap();
    let client = cluster.async_client().unwrap();
    // A second router: each write goes through one of the two, and the other repairs.
    let second = cluster.add_router().unwrap();
    let other = cluster.async_client_of(second).unwrap();
    let mut model: Vec<Vec<u8>> = (0..120).map(|k| row(mix2(seed, k))).collect();
    let records: Vec<Record> = model
        .iter()
        .map(|r| Record::new().with("data", r))
        .collect();
    cluster.run(client.append_many(&records)).unwrap();
    let (mut landed, mut undone) = (0, 0);
    for step in 0..40u64 {
        let r = mix2(seed, 1000 + step);
        let shard = (mix2(r, 1) % 4) as u32;
        let cut_off = Faults {
            partitioned: true,
            ..Faults::default()
        };
        let lossy = Faults {
            loss: 0.3,
            ..Faults::default()
        };
        let slow = Faults {
            delay: Duration::from_millis(TIMEOUT_MS - 50 + mix2(r, 9) % 100),
            ..Faults::default()
        };
        let fault = mix2(r, 2) % 4;
        match fault {
            0 => cluster.set_faults(shard, cut_off).unwrap(),
            1 => cluster.set_faults(shard, lossy).unwrap(),
            2 => cluster.set_faults(shard, slow).unwrap(),
            _ => {} // partitioned midway, below
        }
        let (writer, repairer) = if mix2(r, 8).is_multiple_of(2) {
            (&client, &other)
        } else {
            (&other, &client)
        };
        let len = model.len() as u64;
        let mut after = model.clone();
        let (result, effect) = cluster.run(async {
            if fault == 3 {
                // Partitioned a few milliseconds into the write.
                let partition = async {
                    tokio::time::sleep(Duration::from_millis(mix2(r, 7) % 6)).await;
                    cluster.set_faults(shard, cut_off).unwrap();
                };
                tokio::join!(write(writer, r, len), partition).0
            } else {
                write(writer, r, len).await
            }
        });
        effect(&mut after);

        // Heal, and let the next write repair what this one left; now and then through a
        // router started just now, whose start-up settles the write first.
        for shard in 0..4 {
            cluster.set_faults(shard, Faults::default()).unwrap();
        }
        let started;
        let repairer = if mix2(r, 10).is_multiple_of(4) {
            let mut tries = 0;
            let addr = loop {
                match cluster.add_router() {
                    Ok(addr) => break addr,
                    Err(e) if tries < 20 => {
                        tries += 1;
                        eprintln!("retrying after: {e}");
                        cluster.run(async { tokio::time::sleep(Duration::from_millis(200)).await });
                    }
                    Err(e) => panic!("no router could start: {e}"),
                }
            };
            started = cluster.async_client_of(addr).unwrap();
            &started
        } else {
            repairer
        };
        let held = cluster.run(async {
            settle(|| async { repairer.append_many(&[]).await.map(|_| ()) }).await;
            settle(|| async {
                let len = repairer.len().await?;
                let columns = repairer.gather(&(0..len).collect::<Vec<_>>(), &[]).await?;
                Ok((0..len as usize)
                    .map(|k| columns[0].get(k).unwrap_or_default().to_vec())
                    .collect::<Vec<Vec<u8>>>())
            })
            .await
        });
        match &result {
            Ok(()) => assert!(
                held == after,
                "step {step}: a write that succeeded is not all there"
            ),
            Err(e) => {
                assert!(
                    held == after || held == model,
                    "step {step}: a failed write ({e}) left part of itself behind: {} records, {} before it, {} had it landed",
                    held.len(),
                    model.len(),
                    after.len()
                );
                if held == after {
                    landed += 1;
                } else {
                    undone += 1;
                }
            }
        }
        model = held;
    }
    eprintln!("failed writes that landed whole: {landed}, undone whole: {undone}");
    (landed, undone)
}

/// Runs `attempt` until it succeeds, for up to 20 tries: the cluster may need a moment after
/// faults heal (a router reconnecting).
async fn settle<T, F>(mut attempt: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Result<T, zr_router::Error>>,
{
    let mut tries = 0;
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(e) if tries < 20 => {
                tries += 1;
                eprintln!("retrying after: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the cluster did not recover: {e}"),
        }
    }
}
