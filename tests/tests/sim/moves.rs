//! Growing and shrinking a cluster online through the simulator: shards added and drained
//! (`zr cluster add-shard` / `drain-shard`) while clients gather and append, every gather
//! byte-exact against a model, every acknowledged append present; a move stopped at any step
//! (its router killed there, a node crashed meanwhile) finished by running it again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use zr_common::hash::mix2;
use zr_common::Record;
use zr_proto::placement::Placement;
use zr_proto::wire::FieldInfo;
use zr_router::server::MoveStep;
use zr_router::{AsyncClient, MapChange};
use zr_sim::{SimCluster, SimOptions};
use zr_tests as kit;

/// Longest field `a` of a row: small, as every move copies them.
const LONGEST: u64 = 48;

fn options(replicas: u32) -> SimOptions {
    kit::options(&[("a", "raw"), ("b", "flate")], 2, 2_000, replicas)
}

/// Every shard holds what the map gives it (counted by the router's status), the shards
/// holding records within `tolerance` of an even share, and `drained` none.
fn check_spread(
    status: &zr_proto::wire::ClusterStatus,
    records: u64,
    drained: &[u32],
    tolerance: f64,
) {
    let mut per_shard: std::collections::BTreeMap<u32, u64> = Default::default();
    for node in status.nodes.iter().filter(|n| n.replica == 0) {
        per_shard.insert(node.shard, node.records.expect("every node answers"));
    }
    assert_eq!(per_shard.values().sum::<u64>(), records, "{per_shard:?}");
    let active = per_shard.len() - drained.len();
    let share = records as f64 / active as f64;
    for (shard, &held) in &per_shard {
        if drained.contains(shard) {
            assert_eq!(held, 0, "drained shard {shard} holds records");
        } else {
            assert!(
                (held as f64 - share).abs() <= tolerance * share,
                "shard {shard} holds {held}, an even share is {share:.0}: {per_shard:?}"
            );
        }
    }
}

/// 2 → 3 → 4 shards, then shard 1 drained, each move under a running loop of gathers and
/// appends (gathers through a second router's map too, which learns the new nodes and maps
/// from the metadata store and from its nodes' refusals); checked after each. On virtual
/// time: the seed orders every copy, switch and request (`ZR_SIM_SEED` replays a run).
fn grow_and_drain(replicas: u32) {
    let seed = SimOptions::default().seed;
    let mut cluster = on_virtual_time(2, options(replicas));
    let other = cluster.add_router().expect("second router");
    let client = cluster.async_client().expect("client");
    let second = cluster
        .async_client_of(other)
        .expect("client of the second router");
    let mover = cluster.async_client().expect("client");
    let mut model = Vec::new();
    cluster.run(kit::append_async(&client, &mut model, 1, 6000, LONGEST));
    for (step, change) in [
        MapChange::AddShard,
        MapChange::AddShard,
        MapChange::DrainShard(1),
    ]
    .into_iter()
    .enumerate()
    {
        if change == MapChange::AddShard {
            cluster.add_shard_nodes().expect("new shard's nodes");
        }
        let nodes = cluster.listed_nodes();
        let moved = AtomicBool::new(false);
        let (report, gathers) = cluster.run(async {
            let moving = async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                mover
                    .move_shards(change, nodes)
                    .await
                    .expect("start the move");
                let report = loop {
                    let report = mover.move_progress().await.expect("progress");
                    let report = report.expect("a move");
                    assert!(report.error.is_none(), "seed {seed}: {report:?}");
                    if report.done {
                        break report;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                };
                tokio::time::sleep(Duration::from_millis(200)).await;
                moved.store(true, Ordering::SeqCst);
                report
            };
            let working = async {
                let mut gathers = 0u64;
                for k in 0u64.. {
                    if moved.load(Ordering::SeqCst) {
                        break;
                    }
                    let r = mix2(seed ^ step as u64, k);
                    if r.is_multiple_of(4) {
                        kit::append_async(&client, &mut model, r, 1 + r % 16, LONGEST).await;
                    } else {
                        let indices: Vec<u64> =
                            (0..64).map(|j| mix2(r, j) % model.len() as u64).collect();
                        let reader = if k % 2 == 0 { &client } else { &second };
                        kit::check_async(reader, &model, &indices).await;
                        gathers += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                gathers
            };
            tokio::join!(moving, working)
        });
        assert!(gathers > 0, "no gather ran during the move");
        assert!(report.done && report.moved > 0 && report.moved < report.records);
        let status = cluster.run(async {
            let all: Vec<u64> = (0..model.len() as u64).collect();
            assert_eq!(client.len().await.expect("len"), model.len() as u64);
            kit::check_async(&client, &model, &all).await;
            client.status().await.expect("status")
        });
        let drained: &[u32] = if step == 2 { &[1] } else { &[] };
        check_spread(&status, model.len() as u64, drained, 0.25);
        assert_eq!(status.map_version, 2 + step as u64);
    }
    // Still writable and readable as a whole.
    cluster.run(async {
        kit::append_async(&client, &mut model, 99, 100, LONGEST).await;
        let all: Vec<u64> = (0..model.len() as u64).collect();
        kit::check_async(&second, &model, &all).await;
    });
}

/// Waits, on the cluster's clock, until a write could take the cluster's write lease (a
/// killed router's lapses within 2 × its timeout).
async fn wait_for_lease(client: &AsyncClient) {
    let started = tokio::time::Instant::now();
    loop {
        match client.commit().await {
            Ok(()) => return,
            // Taken, then refused by nodes not yet switched to a published map.
            Err(e) if e.to_string().contains("stale map") => return,
            Err(e)
                if e.to_string().contains("busy")
                    && started.elapsed() < Duration::from_secs(20) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the write lease: {e}"),
        }
    }
}

/// A cluster of `shards` shards on virtual time (the seed orders the whole run).
fn on_virtual_time(shards: u32, options: SimOptions) -> SimCluster {
    let options = SimOptions {
        virtual_time: true,
        ..options
    };
    SimCluster::start(shards, options).expect("cluster")
}

#[test]
fn shards_are_added_and_drained_online_with_one_replica() {
    grow_and_drain(1);
}

#[test]
fn shards_are_added_and_drained_online_with_two_replicas() {
    grow_and_drain(2);
}

/// The move from 4 to 5 shards moves at most 1.1 × N/5 records, as counted by the move, and
/// leaves every shard within 5% of N/5.
#[test]
fn adding_a_fifth_shard_moves_a_fifth_of_the_records() {
    let options = SimOptions {
        extent_records: 1,
        ..options(1)
    };
    let mut cluster = on_virtual_time(4, options);
    let client = cluster.async_client().expect("client");
    let mut model = Vec::new();
    cluster.run(kit::append_async(&client, &mut model, 5, 40_960, LONGEST));
    cluster.add_shard_nodes().expect("new shard's nodes");
    let report = cluster
        .run(cluster.run_move_async(&client, MapChange::AddShard))
        .expect("the move");
    let n = model.len() as u64;
    assert_eq!(report.records, n);
    assert!(
        report.moved <= n * 11 / 50,
        "moved {} of {n} records",
        report.moved
    );
    let status = cluster.run(client.status()).expect("status");
    check_spread(&status, n, &[], 0.05);
    cluster
        .run(kit::serves_all_async(&client, &model))
        .expect("every record");
}

/// A move stopped at each of its steps — its router killed there, a node of each role
/// crashed and restarted meanwhile — leaves a cluster serving every record (by the old map
/// while copying; once the new map is published, a router switches the nodes left behind on
/// its own), and running the command again finishes it (or says it is done): every record
/// present once, every acknowledged append kept.
#[test]
fn a_move_stopped_at_any_step_is_finished_by_running_it_again() {
    stop_at_every_step(1);
}

/// [`a_move_stopped_at_any_step_is_finished_by_running_it_again`] with two replicas per
/// shard: a crashed replica may come back behind, and is caught up before the move goes on.
#[test]
fn a_replicated_move_stopped_at_any_step_is_finished_by_running_it_again() {
    stop_at_every_step(2);
}

fn stop_at_every_step(replicas: u32) {
    let mut cluster = on_virtual_time(2, options(replicas));
    let mut model = Vec::new();
    let client = cluster.async_client().expect("client");
    cluster.run(kit::append_async(&client, &mut model, 7, 3000, LONGEST));
    let steps = [
        MoveStep::Recorded,
        MoveStep::Copied,
        MoveStep::Published,
        MoveStep::SwitchedOne,
    ];
    for (round, step) in steps.into_iter().enumerate() {
        let change = if round % 2 == 0 {
            MapChange::AddShard
        } else {
            MapChange::DrainShard(round as u32 / 2)
        };
        if change == MapChange::AddShard {
            cluster.add_shard_nodes().expect("new shard's nodes");
        }
        cluster.router(0).expect("router").stop_moves_at(Some(step));
        let client = cluster.async_client().expect("client");
        let stopped = cluster
            .run(cluster.run_move_async(&client, change))
            .expect_err("the move stops");
        assert!(stopped.contains("injected"), "{stopped}");
        if step != MoveStep::Published && step != MoveStep::SwitchedOne {
            cluster.run(async {
                // One move at a time: another is refused while this one is recorded.
                let other = match change {
                    MapChange::AddShard => MapChange::DrainShard(1),
                    MapChange::DrainShard(_) => MapChange::AddShard,
                };
                let refused = cluster
                    .run_move_async(&client, other)
                    .await
                    .expect_err("a second move");
                assert!(
                    refused.contains(&format!("a move to map version {} ", 2 + round))
                        && refused.contains("is under way"),
                    "{refused}"
                );
                // Modify and delete would change records already copied: refused meanwhile.
                let row = &model[5];
                let e = client
                    .modify(5, &Record::new().with("a", &row[0]).with("b", &row[1]))
                    .await
                    .expect_err("a modify during a move");
                assert!(e.to_string().contains("records are moving"), "{e}");
                let e = client.delete(5).await.expect_err("a delete during a move");
                assert!(e.to_string().contains("records are moving"), "{e}");
                // What a crash may lose: nothing acknowledged as committed.
                client.commit().await.expect("commit");
            });
        }
        // The router dies there; a node of each kind (a donor, and the newest) crashes.
        cluster.kill_router(0);
        let newest = cluster.node_count() - 1;
        for node in [0, newest] {
            cluster.crash_node(node);
            cluster.start_node(node).expect("node back");
        }
        cluster.add_router().expect("router");
        let client = cluster.async_client().expect("client");
        let published = step == MoveStep::Published || step == MoveStep::SwitchedOne;
        cluster.run(async {
            if published {
                // The new router switches the nodes left behind on its own (once the killed
                // one's write lease lapses): every record is served before anyone runs the
                // command again.
                let started = tokio::time::Instant::now();
                while let Err(e) = kit::serves_all_async(&client, &model).await {
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "the published map never served: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            } else {
                let moving = client.status().await.expect("status").moving;
                assert!(
                    moving
                        .as_deref()
                        .is_some_and(|m| m.contains(&format!("to map version {}", 2 + round))),
                    "{moving:?}"
                );
                // Served by the old map meanwhile; appends go on once the killed router's
                // write lease lapses.
                kit::serves_all_async(&client, &model)
                    .await
                    .expect("every record by the old map");
                wait_for_lease(&client).await;
                kit::append_async(&client, &mut model, 100 + round as u64, 50, LONGEST).await;
            }
            kit::in_sync(&client, Duration::from_secs(30)).await;
            let report = cluster
                .run_move_async(&client, change)
                .await
                .expect("the move, run again");
            assert!(report.done, "{report:?}");
            assert_eq!(report.already, published, "{report:?}");
            let status = client.status().await.expect("status");
            assert_eq!(status.map_version, 2 + round as u64);
            assert_eq!(status.moving, None);
            kit::append_async(&client, &mut model, 200 + round as u64, 50, LONGEST).await;
            kit::serves_all_async(&client, &model)
                .await
                .expect("every record");
        });
    }
}

/// Rewrites node `node`'s data directory (shard `shard`'s, stopped) as a build from before
/// slots were kept apart laid it out: each dataset's records as one sequence, record k the
/// shard's local index k under `placement`, and an identity that does not say it is slotted.
fn rewrite_in_the_older_layout(dir: &std::path::Path, shard: u32, placement: &Placement) {
    use zr_node::{CreateOptions, GatherOptions, Store};
    let rewrite = |dir: &std::path::Path| {
        let store = Store::open(dir).unwrap();
        let len = store.len();
        let addresses: Vec<u64> = (0..len).map(|l| placement.address_of(shard, l)).collect();
        let batch = store
            .gather_with(&addresses, &[], GatherOptions::verified())
            .unwrap();
        let records: Vec<Record> = (0..len as usize)
            .map(|k| batch.record(k).unwrap())
            .collect();
        let old = dir.with_file_name(".older");
        let older = Store::create(&old, store.fields().to_vec(), CreateOptions::default()).unwrap();
        older.append_many(&records).unwrap();
        older.commit().unwrap();
        drop((older, batch, store));
        // What an older build kept beside the data: an identity without `slotted`.
        let identity = std::fs::read_to_string(dir.join("identity.json")).unwrap();
        let mut identity: serde_json::Value = serde_json::from_str(&identity).unwrap();
        identity.as_object_mut().unwrap().remove("slotted");
        std::fs::write(old.join("identity.json"), identity.to_string()).unwrap();
        for kept in ["writer-fence", "dataset.json"] {
            if dir.join(kept).exists() {
                std::fs::copy(dir.join(kept), old.join(kept)).unwrap();
            }
        }
        if dir.join("datasets").exists() {
            std::fs::rename(dir.join("datasets"), old.join("datasets")).unwrap();
        }
        std::fs::remove_dir_all(dir).unwrap();
        std::fs::rename(&old, dir).unwrap();
        len
    };
    let named = dir.join("datasets").join("named");
    assert!(rewrite(&named) > 0);
    assert!(rewrite(dir) > 0);
    let store = Store::open(dir).unwrap();
    assert_eq!(
        store.units(),
        [(0, store.len())],
        "one sequence, as older builds kept it"
    );
}

/// A data directory an older build wrote (a shard's records as one sequence ranked by the
/// map) is converted when its node starts — the default dataset and a named one, every
/// record to its slot — and then serves every record byte-exact, one hop and through the
/// router, and takes appends.
#[test]
fn a_node_written_in_the_older_layout_is_converted_when_it_starts() {
    const RECORDS: u64 = 600;
    let mut cluster = SimCluster::start(2, options(1)).unwrap();
    let client = cluster.client().unwrap();
    let rows: Vec<Vec<u8>> = (0..RECORDS)
        .map(|i| kit::row(i, LONGEST).concat())
        .collect();
    let records: Vec<Record> = rows
        .iter()
        .map(|r| Record::new().with("a", r).with("b", r))
        .collect();
    client.append_many(&records).unwrap();
    client.commit().unwrap();
    let named = client
        .create_dataset("named", vec![FieldInfo::new("c", "raw")])
        .unwrap();
    let named_rows: Vec<Record> = rows.iter().map(|r| Record::new().with("c", r)).collect();
    named.append_many(&named_rows[..300]).unwrap();
    named.commit().unwrap();
    let placement = Placement::new(client.map().unwrap()).unwrap();
    cluster.stop_node(1).unwrap();
    rewrite_in_the_older_layout(&cluster.data_dir(1), 1, &placement);
    cluster.start_node(1).unwrap();
    kit::eventually(&cluster, "node 1 to be up", Duration::from_secs(10), || {
        client
            .status()
            .unwrap()
            .nodes
            .iter()
            .any(|n| n.shard == 1 && n.state == "up")
    });
    let identity = std::fs::read_to_string(cluster.data_dir(1).join("identity.json")).unwrap();
    assert!(identity.contains("\"slotted\": true"), "{identity}");
    let all: Vec<u64> = (0..RECORDS).collect();
    for reader in [
        cluster.client().unwrap(),
        cluster.client_via_router().unwrap(),
    ] {
        let columns = reader.gather(&all, &[]).unwrap();
        for (k, row) in rows.iter().enumerate() {
            assert_eq!(columns[0].get(k).unwrap(), &row[..], "record {k}");
            assert_eq!(columns[1].get(k).unwrap(), &row[..], "record {k}");
        }
        let named = reader.dataset("named").unwrap();
        let columns = named.gather(&all[..300], &[]).unwrap();
        for (k, row) in rows[..300].iter().enumerate() {
            assert_eq!(columns[0].get(k).unwrap(), &row[..], "named record {k}");
        }
    }
    assert_eq!(client.append(&records[0]).unwrap(), RECORDS);
    client.commit().unwrap();
}
