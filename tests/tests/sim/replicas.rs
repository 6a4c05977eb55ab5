//! Replicas through the simulator: with every shard on two nodes, any one node may crash,
//! be wiped or be cut off while clients gather and append, and no caller sees an error, a
//! wrong byte or a lost acknowledged append; a node that comes back catches up from its
//! partner, online, and serves reads only once it has.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use zr_common::hash::mix2;
use zr_common::Record;
use zr_router::AsyncClient;
use zr_sim::{Faults, SimCluster, SimOptions};
use zr_tests as kit;
use zr_tests::{append, check, record, row, Row};

/// Longest field `a` of a row.
const LONGEST: u64 = 300;

fn options() -> SimOptions {
    kit::options(&[("a", "raw"), ("b", "flate")], 3, 2_000, 2)
}

/// Gathers and appends through `client` until every replica is in sync again (each
/// checked against `model`, which the appends grow); returns the gathers made.
fn load_until_in_sync(cluster: &SimCluster, client: &AsyncClient, model: &mut Vec<Row>) -> u64 {
    kit::load_until_in_sync(
        cluster,
        client,
        model,
        0x5eed,
        Duration::from_secs(120),
        LONGEST,
    )
}

/// Every record of `model`, read through `client` once shard `shard`'s replica `replica`
/// (a partner) is down: the other replica alone serves its shard.
fn served_without(
    cluster: &mut SimCluster,
    (shard, replica): (u32, u32),
    client: &AsyncClient,
    model: &[Row],
) {
    cluster.crash_node(cluster.node(shard, replica));
    let all: Vec<u64> = (0..model.len() as u64).collect();
    cluster.run(kit::check_async(client, model, &all));
}

/// Any one node killed in turn while a client gathers and appends costs the client nothing:
/// no error, no wrong byte; each node restarted catches up, and each replica alone then
/// serves all of it. On virtual time, the seed orders every kill, heartbeat and catch-up
/// against the load.
#[test]
fn any_one_node_killed_in_turn_costs_nothing() {
    let mut cluster = SimCluster::start(2, on_virtual_time()).expect("cluster");
    let client = cluster.async_client().expect("client");
    let mut model = kit::loaded(&cluster, &client, 1, 300, LONGEST);
    let mut gathers = 0;
    for node in 0..cluster.node_count() {
        let seed = mix2(node.into(), 0x5eed);
        let span = Duration::from_millis(300);
        gathers += cluster.run(kit::load_for(&client, &mut model, seed, span, 8, LONGEST));
        cluster.crash_node(node);
        let span = Duration::from_millis(1_500);
        gathers += cluster.run(kit::load_for(&client, &mut model, !seed, span, 8, LONGEST));
        // The kill was seen: the node is down, and the load went on regardless.
        let status = cluster.run(client.status()).expect("status");
        let (shard, replica) = cluster.place(node);
        let seen = status
            .nodes
            .iter()
            .find(|n| (n.shard, n.replica) == (shard, replica))
            .expect("its status");
        assert!(seen.state.starts_with("down"), "{seen:?}");
        cluster.start_node(node).expect("restart");
        gathers += load_until_in_sync(&cluster, &client, &mut model);
    }
    assert!(gathers > 0);
    cluster.run(async {
        client.commit().await.expect("commit");
        kit::serves_all_async(&client, &model)
            .await
            .expect("every record");
    });
    // And each caught-up replica alone holds all of it: every partner down in turn.
    for shard in 0..2 {
        cluster.crash_node(cluster.node(shard, 0));
    }
    cluster
        .run(kit::serves_all_async(&client, &model))
        .expect("from the other replicas");
}

/// The options of a cluster on virtual time (a seed orders the whole run).
fn on_virtual_time() -> SimOptions {
    SimOptions {
        virtual_time: true,
        ..options()
    }
}

#[test]
fn a_wiped_node_rebuilds_online_and_then_serves_alone() {
    let mut cluster = SimCluster::start(3, on_virtual_time()).expect("cluster");
    let client = cluster.async_client().expect("client");
    let mut model = kit::loaded(&cluster, &client, 2, 3_000, LONGEST);
    let wiped = cluster.node(1, 1);
    cluster.crash_node(wiped);
    std::fs::remove_dir_all(cluster.data_dir(wiped)).expect("wipe");
    cluster.start_node(wiped).expect("restart empty");
    // Gathers and appends go on while it rebuilds.
    let gathers = load_until_in_sync(&cluster, &client, &mut model);
    assert!(gathers > 0);
    // Its partner gone, the rebuilt node serves shard 1 alone.
    served_without(&mut cluster, (1, 0), &client, &model);
}

/// A node wiped while the default dataset is empty and a named one holds every record: the
/// router finds the named dataset short on it (no heartbeat tells), rebuilds it from the
/// partner, and it then serves the dataset alone.
#[test]
fn a_wiped_node_rebuilds_a_named_dataset_and_then_serves_it_alone() {
    let mut cluster = SimCluster::start(2, on_virtual_time()).expect("cluster");
    let client = cluster.async_client().expect("client");
    let fields = ["a", "b"].map(|name| zr_router::FieldInfo::new(name, "flate"));
    let mut model = Vec::new();
    let named = cluster.run(async {
        let named = client
            .create_dataset("named", fields.to_vec())
            .await
            .expect("create");
        kit::append_async(&named, &mut model, 3, 3_000, LONGEST).await;
        named.commit().await.expect("commit");
        named
    });
    let meta = cluster.metadata().expect("metadata");
    let revision = |meta: &Arc<dyn zr_meta::MetaStore>| {
        let meta = Arc::clone(meta);
        async move {
            let (record, revision) = zr_meta::replicas::load(&*meta).await.expect("replicas");
            (record.in_sync((1, 1)), revision.unwrap_or(0))
        }
    };
    let (_, before) = cluster.run(revision(&meta));
    let wiped = cluster.node(1, 1);
    cluster.crash_node(wiped);
    std::fs::remove_dir_all(cluster.data_dir(wiped)).expect("wipe");
    cluster.start_node(wiped).expect("restart empty");
    // Found short within a few seconds of the cluster's clock (once the node has the
    // dataset again, empty), then caught up: the replica record marks it behind and then
    // in sync again (written since, and in sync) — however short the rebuild, the record
    // tells.
    let rebuilt = cluster.run(async {
        for _ in 0..1_000 {
            match revision(&meta).await {
                (true, now) if now > before => return true,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        false
    });
    assert!(
        rebuilt,
        "the wiped node was never found short and caught up"
    );
    load_until_in_sync(&cluster, &named, &mut model);
    served_without(&mut cluster, (1, 0), &named, &model);
}

#[test]
fn a_replaced_node_is_rebuilt_at_its_new_address_online_and_then_serves_alone() {
    let mut cluster = SimCluster::start(3, on_virtual_time()).expect("cluster");
    // A second router, started before the move, learns of it from the metadata store.
    let second = cluster.add_router().expect("second router");
    let client = cluster.async_client().expect("client");
    let mut model = kit::loaded(&cluster, &client, 3, 2_000, LONGEST);
    let lost = cluster.node(2, 0);
    let old_addr = cluster.config().node(2, 0).expect("node").addr;
    let new_addr = cluster.replace_node(lost).expect("replacement");
    assert_ne!(new_addr, old_addr);
    let taken = cluster.config().node(0, 1).expect("node").addr;
    let node = |status: &zr_proto::wire::ClusterStatus| {
        status
            .nodes
            .iter()
            .find(|n| (n.shard, n.replica) == (2, 0))
            .cloned()
            .expect("node 2/0")
    };
    let mut gathers = cluster.run(kit::load_for(
        &client,
        &mut model,
        1,
        Duration::from_millis(200),
        8,
        LONGEST,
    ));
    cluster.run(async {
        // Wrong requests are refused, naming what is wrong, and change nothing.
        let anywhere = "0.0.0.0:7100".parse().expect("addr");
        let wrong = [
            (3, 0, new_addr, "there is no shard 3"),
            (2, 2, new_addr, "replicas 0..2, not 2"),
            (2, 0, taken, "already serves shard 0 replica 1"),
            (2, 0, old_addr, "shard 2 replica 0's address already"),
            (2, 0, cluster.router_addr(), "this router's own address"),
            (2, 0, anywhere, "no address a node can be reached at"),
        ];
        for (shard, replica, addr, says) in wrong {
            let refused = client.replace_node(shard, replica, addr).await;
            let e = refused.expect_err("refused").to_string();
            assert!(e.contains(says), "{shard}/{replica} at {addr}: {e}");
        }
        let began = tokio::time::Instant::now();
        let status = client.replace_node(2, 0, new_addr).await.expect("replace");
        assert_eq!(node(&status).addr, new_addr.to_string());
        assert!(
            !node(&status).in_sync,
            "the replacement serves before it holds anything"
        );
        // Its partner cannot be replaced while it rebuilds from it.
        if !node(&client.status().await.expect("status")).in_sync {
            let elsewhere = "127.0.0.1:9".parse().expect("addr");
            let refused = client.replace_node(2, 1, elsewhere).await;
            let message = refused.expect_err("refused").to_string();
            assert!(
                message.contains("no other replica of shard 2 is in sync"),
                "{message}"
            );
        }
        // A write right after is acknowledged only once the old node, which may still run
        // and serve clients one hop, has let its read lease run out.
        kit::append_async(&client, &mut model, 6, 10, LONGEST).await;
        assert!(
            began.elapsed() >= zr_meta::nodes::READ_LEASE_WAIT,
            "a write was acknowledged {:?} after the replacement",
            began.elapsed()
        );
    });
    gathers += load_until_in_sync(&cluster, &client, &mut model);
    assert!(gathers > 0);
    // The replacement alone serves shard 2, through either router.
    served_without(&mut cluster, (2, 1), &client, &model);
    let other = cluster
        .async_client_of(second)
        .expect("client of the second router");
    cluster.run(async {
        for _ in 0..300 {
            if node(&other.status().await.expect("status")).addr == new_addr.to_string() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let status = other.status().await.expect("status");
        assert_eq!(
            node(&status).addr,
            new_addr.to_string(),
            "the second router never learnt of the move"
        );
        kit::serves_all_async(&other, &model)
            .await
            .expect("every record through the second router");
    });
}

#[test]
fn a_replacement_survives_its_router_and_itself_restarting_before_it_is_rebuilt() {
    let mut cluster = SimCluster::start(2, on_virtual_time()).expect("cluster");
    let client = cluster.async_client().expect("client");
    let mut model = kit::loaded(&cluster, &client, 4, 1_000, LONGEST);
    let lost = cluster.node(1, 1);
    let new_addr = cluster.replace_node(lost).expect("replacement");
    // The replacement goes down before anything is copied to it, and the router that
    // recorded the move restarts: the move is in the metadata store, and is finished.
    cluster.crash_node(lost);
    cluster
        .run(client.replace_node(1, 1, new_addr))
        .expect("replace");
    cluster.restart_router().expect("router");
    let client = cluster.async_client().expect("client");
    cluster.run(kit::append_async(&client, &mut model, 5, 100, LONGEST));
    cluster.start_node(lost).expect("replacement back");
    load_until_in_sync(&cluster, &client, &mut model);
    let status = cluster.run(client.status()).expect("status");
    assert!(status
        .nodes
        .iter()
        .any(|n| (n.shard, n.replica) == (1, 1) && n.addr == new_addr.to_string()));
    served_without(&mut cluster, (1, 0), &client, &model);
}

#[test]
fn a_partitioned_replica_catches_up_before_it_serves() {
    let mut cluster = SimCluster::start(2, on_virtual_time()).expect("cluster");
    let client = cluster.async_client().expect("client");
    let mut model = Vec::new();
    cluster.run(kit::append_async(&client, &mut model, 3, 200, LONGEST));
    let cut = cluster.node(0, 1);
    cluster
        .set_faults(
            cut,
            Faults {
                partitioned: true,
                ..Faults::default()
            },
        )
        .expect("partition");
    // Appends and modifies go on without it; it is marked behind.
    let status = cluster.run(async {
        for step in 0..30u64 {
            kit::append_async(&client, &mut model, 100 + step, 5, LONGEST).await;
            let i = mix2(step, 9) % model.len() as u64;
            let new = row(mix2(step, 10), LONGEST);
            client.modify(i, &record(&new)).await.expect("modify");
            model[i as usize] = new;
        }
        client.status().await.expect("status")
    });
    let node = status
        .nodes
        .iter()
        .find(|n| n.shard == 0 && n.replica == 1)
        .expect("its status");
    assert!(
        !node.in_sync,
        "a replica that missed writes is behind: {node:?}"
    );
    let all = |model: &[Row]| (0..model.len() as u64).collect::<Vec<u64>>();
    cluster.run(kit::check_async(&client, &model, &all(&model)));
    cluster.set_faults(cut, Faults::default()).expect("heal");
    load_until_in_sync(&cluster, &client, &mut model);
    // Only the caught-up replica left for shard 0.
    cluster.crash_node(cluster.node(0, 0));
    cluster.run(kit::check_async(&client, &model, &all(&model)));
}

/// A replica whose gather replies break off midway (after their head and half their body):
/// the router asks the partner for the same part and goes on from the byte where the broken
/// reply stopped, so every caller still gets its whole batch, byte-exact.
#[test]
fn a_reply_broken_midway_is_finished_from_the_partner() {
    use std::sync::atomic::AtomicUsize;
    use zr_net as net;
    use zr_proto::wire::{self, NodeMessage, NodeRequest};

    let mut cluster = SimCluster::start(2, on_virtual_time()).expect("cluster");
    let client = cluster.client().expect("client");
    let mut model = Vec::new();
    append(&client, &mut model, 4, 600, LONGEST);
    client.commit().expect("commit");
    let broken = cluster.node(1, 1);
    cluster.stop_node(broken).expect("stop");
    let dir = cluster.data_dir(broken);
    let store = zr_shard::server::open_shard_store(cluster.config(), &dir, 1, 1).expect("store");
    let coordination =
        Arc::new(zr_shard::fence::Coordination::open(store.disk(), &dir).expect("coordination"));
    let cut_off = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&cut_off);
    cluster
        .fake_node(broken, move |request| {
            let (store, coordination, counted) = (
                store.clone(),
                Arc::clone(&coordination),
                Arc::clone(&counted),
            );
            async move {
                let gather = wire::decode_request::<NodeMessage>(&request)
                    .is_ok_and(|(m, _)| matches!(m.request, NodeRequest::Gather { .. }));
                // Inline, as the nodes of a cluster on virtual time handle requests.
                let (header, body) = zr_shard::server::handle(&store, &coordination, &request);
                if !gather {
                    return (header, net::Body::Ready(body));
                }
                // Half the body, and a moment later the stream is reset (at once, the reset
                // would discard what was sent before the router read it).
                let whole: Vec<u8> = body.iter().flat_map(|b| b.iter().copied()).collect();
                let half = bytes::Bytes::from(whole[..whole.len() / 2].to_vec());
                counted.fetch_add(1, Ordering::SeqCst);
                let (pieces, streamed) = tokio::sync::mpsc::channel(1);
                tokio::spawn(async move {
                    let _ = pieces.send(Some(vec![half])).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                });
                (header, net::Body::Streamed(streamed))
            }
        })
        .expect("impostor");
    // Until the impostor has broken off a few replies (the router reconnects to a node that
    // closed its connections only once its heartbeats have).
    let deadline = cluster.now() + Duration::from_secs(20);
    for round in 0u64.. {
        let indices: Vec<u64> = (0..200)
            .map(|k| mix2(round, k) % model.len() as u64)
            .collect();
        check(&client, &model, &indices);
        if cut_off.load(Ordering::SeqCst) >= 3 {
            break;
        }
        assert!(
            cluster.now() < deadline,
            "the broken replica was never read from"
        );
        cluster.pause(Duration::from_millis(10));
    }
}

/// Flips a byte in the middle of `payload` where it lies in node `node`'s chunk files (the
/// node stopped meanwhile, then started again).
fn damage(cluster: &mut SimCluster, node: u32, payload: &[u8]) {
    use std::io::{Read, Seek, Write};
    cluster.stop_node(node).expect("stop");
    let chunks = cluster.data_dir(node).join("chunk");
    let mut flipped = false;
    for entry in std::fs::read_dir(&chunks).expect("chunks") {
        let path = entry.expect("chunk").path();
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .expect("chunk")
            .take(1 << 20)
            .read_to_end(&mut bytes)
            .expect("read");
        if let Some(at) = bytes.windows(payload.len()).position(|w| w == payload) {
            let middle = payload.len() / 2;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open");
            file.seek(std::io::SeekFrom::Start((at + middle) as u64))
                .expect("seek");
            file.write_all(&[payload[middle] ^ 0x55]).expect("damage");
            flipped = true;
        }
    }
    assert!(flipped, "payload not found in {}", chunks.display());
    cluster.start_node(node).expect("start");
}

/// A byte flipped in one replica's copy of a record: a checked gather never returns it (the
/// partner's copy is read instead) and the router repairs it; the scrub finds another such
/// copy and repairs it. Then the partner may fail without a record lost.
#[test]
fn damaged_copies_are_never_returned_by_checked_gathers_and_are_repaired() {
    let mut cluster = SimCluster::start(2, on_virtual_time()).expect("cluster");
    let client = cluster.async_client().expect("client");
    // Every record's first field is distinct: a damaged one can be found in the chunks.
    let model: Vec<Row> = (0..300u64)
        .map(|k| {
            let a: Vec<u8> = (0..100u64).map(|i| mix2(k, i) as u8).collect();
            [a, format!("record {k}").into_bytes()]
        })
        .collect();
    cluster.run(async {
        let records: Vec<Record> = model.iter().map(record).collect();
        client.append_many(&records).await.expect("append");
        client.commit().await.expect("commit");
    });
    let placement = cluster.config().placement().expect("placement");
    let on_shard_1 = |local: u64| {
        (0..300u64)
            .find(|&g| placement.locate(g) == (1, local))
            .expect("a record on shard 1")
    };
    let damaged = cluster.node(1, 1);

    // The scrub.
    let scrubbed = on_shard_1(5);
    damage(&mut cluster, damaged, &model[scrubbed as usize][0]);
    cluster.run(async {
        kit::in_sync(&client, Duration::from_secs(30)).await;
        let mut problems = Vec::new();
        for shard in 0..2 {
            let report = client.scrub(shard, 0, 10_000).await.expect("scrub");
            assert_eq!(report.replicas, 2);
            problems.extend(report.problems.into_iter().map(|p| (shard, p)));
        }
        assert_eq!(problems.len(), 1, "{problems:?}");
        let (shard, problem) = &problems[0];
        assert_eq!((*shard, problem.replica, problem.index), (1, 1, 5));
        assert!(
            problem.repaired && problem.what.contains("check"),
            "{problem:?}"
        );
        let again = client.scrub(1, 0, 10_000).await.expect("scrub");
        assert!(again.problems.is_empty());
        // Committed before the next damage: the node then restarts with nothing lost, and
        // is not caught up — which would repair the copy too.
        client.commit().await.expect("commit");
    });

    // Checked gathers: the damaged copy is asked in turn, never returned, and repaired.
    let read = on_shard_1(7);
    damage(&mut cluster, damaged, &model[read as usize][0]);
    cluster.run(async {
        kit::in_sync(&client, Duration::from_secs(30)).await;
        for _ in 0..6 {
            let columns = client
                .gather_checked(&[read], &[])
                .await
                .expect("checked gather");
            assert_eq!(columns[0].get(0), Some(&model[read as usize][0][..]));
        }
        // Repaired in the background: wait until unchecked gathers, which take the
        // replicas in turn, return the right bytes ten times running.
        let until = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut right = 0;
        while right < 10 {
            assert!(
                tokio::time::Instant::now() < until,
                "the damaged copy was not repaired"
            );
            let columns = client.gather(&[read], &[]).await.expect("gather");
            if columns[0].get(0) == Some(&model[read as usize][0][..]) {
                right += 1;
            } else {
                right = 0;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    served_without(&mut cluster, (1, 0), &client, &model);
}

/// A router that takes the write lease writes by the replica record as it is then, not as
/// it last read it a moment ago: another router marked a replica behind meanwhile (here,
/// the metadata store is written directly), and the next write through this router counts
/// the replica out — so it holds the write's acknowledgment until the replica's read lease
/// has run out — rather than sending it on as if nothing had changed.
#[test]
fn a_router_taking_the_lease_writes_by_the_replica_record_as_it_is_then() {
    let mut cluster = SimCluster::start(2, on_virtual_time()).expect("cluster");
    let second = cluster.add_router().expect("second router");
    let client = cluster.async_client().expect("client");
    let other = cluster
        .async_client_of(second)
        .expect("client of the second router");
    let mut model = Vec::new();
    cluster.run(async {
        kit::append_async(&client, &mut model, 7, 300, LONGEST).await;
        client.commit().await.expect("commit");
        // The second router writes once (it holds the lease a moment, then gives it back).
        other
            .modify(0, &record(&model[0]))
            .await
            .expect("modify through the second router");
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
    let meta = cluster.metadata().expect("metadata");
    let waited = cluster.run(async {
        zr_meta::replicas::mark_behind(&*meta, (1, 1), 2)
            .await
            .expect("mark behind");
        let began = tokio::time::Instant::now();
        let new = row(0xbeef, LONGEST);
        other
            .modify(1, &record(&new))
            .await
            .expect("modify through the second router");
        began.elapsed()
    });
    assert!(
        waited >= zr_meta::nodes::READ_LEASE_WAIT,
        "the write was acknowledged after {waited:?}, by a replica record read before the mark"
    );
}

/// With a partner to turn to, a read waiting on a node that answers nothing (stalled: it
/// takes connections and requests, and never replies) turns to the partner as soon as one
/// heartbeat to the node fails, not once two have found it down: every gather is served,
/// the slowest within about a second and a half of the cluster's clock (a heartbeat's
/// 750 ms wait after up to 250 ms, then the 500 ms grace for a reply under way); waiting
/// for the node to be found down took 2 s.
#[test]
fn a_read_waiting_on_a_dead_node_turns_to_its_partner_at_the_first_failed_heartbeat() {
    let mut cluster = SimCluster::start(2, on_virtual_time()).expect("cluster");
    let client = cluster.async_client().expect("client");
    let model = kit::loaded(&cluster, &client, 8, 200, LONGEST);
    let all: Vec<u64> = (0..model.len() as u64).collect();
    cluster.stall_node(cluster.node(1, 0)).expect("stall");
    let slowest = cluster.run(async {
        // Its heartbeats connect again (to the stalled node, which answers nothing) before
        // the reads begin: reads are sent it in turn.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut slowest = Duration::ZERO;
        for _ in 0..4 {
            let began = tokio::time::Instant::now();
            kit::check_async(&client, &model, &all).await;
            slowest = slowest.max(began.elapsed());
        }
        slowest
    });
    assert!(
        slowest < Duration::from_millis(1_600),
        "a gather waited {slowest:?} of the cluster's clock on a dead node with a live partner"
    );
}
