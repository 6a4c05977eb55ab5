//! The cluster over a faulty network, through the simulator: datagrams lost and delayed on
//! the way to and from every node change no answer. Every test prints its seed;
//! `ZR_SIM_SEED=<seed>` replays its faults and operations. (Partitions: `failures.rs`.)

use std::time::Duration;

use zr_common::hash::mix2;
use zr_common::Record;
use zr_router::Client;
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
    let len = (mix2(seed, 1) % 500) as usize;
    (0..len).map(|i| mix2(seed, i as u64) as u8).collect()
}

fn check(client: &Client, model: &[Vec<u8>], indices: &[u64]) {
    let columns = client.gather(indices, &[]).unwrap();
    for (pos, &i) in indices.iter().enumerate() {
        assert!(
            columns[0].get(pos).unwrap() == &model[i as usize][..],
            "record {i} differs"
        );
    }
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
