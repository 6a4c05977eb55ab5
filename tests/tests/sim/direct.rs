//! One-hop reads: clients gather straight from the nodes once the router has said where
//! they are. Byte-exact without the router in the path; nodes take only reads from client
//! certificates; a client that cannot reach the nodes reads through the router; a replica
//! set behind stops serving clients by itself; a node that stops answering is failed over
//! (R = 2) at once, not at the end of the timeout.

use std::time::Duration;

use zr_common::hash::mix2;
use zr_common::Record;
use zr_net::tls::Role;
use zr_proto::placement::Placement;
use zr_proto::wire::{NodeRequest, Reply};
use zr_proto::ErrorCode;
use zr_router::{Client, ClientOptions};
use zr_sim::{SimCluster, SimOptions};
use zr_tests as kit;

/// On virtual time: waits take no real time, and a seed replays a run.
fn options(replicas: u32, timeout_ms: u64) -> SimOptions {
    SimOptions {
        virtual_time: true,
        ..kit::options(&[("x", "raw"), ("y", "flate")], 5, timeout_ms, replicas)
    }
}

fn row(k: u64) -> Vec<u8> {
    kit::bytes(k, 8, 300)
}

/// A cluster of `shards` shards holding `records` committed records (row(k) in both fields).
fn loaded(shards: u32, records: u64, options: SimOptions) -> SimCluster {
    let cluster = SimCluster::start(shards, options).expect("cluster");
    let client = cluster.client().expect("client");
    let rows: Vec<Vec<u8>> = (0..records).map(row).collect();
    let batch: Vec<Record> = rows
        .iter()
        .map(|r| Record::new().with("x", r).with("y", r))
        .collect();
    client.append_many(&batch).expect("append");
    client.commit().expect("commit");
    cluster
}

/// Gathers `indices` through `client` and checks every record.
fn check(client: &Client, indices: &[u64]) -> Result<(), String> {
    let columns = client.gather(indices, &[]).map_err(|e| e.to_string())?;
    for (pos, &k) in indices.iter().enumerate() {
        for column in &columns {
            if column.get(pos) != Some(&row(k)[..]) {
                return Err(format!("record {k} differs"));
            }
        }
    }
    Ok(())
}

fn batch(seed: u64, records: u64) -> Vec<u64> {
    (0..257).map(|k| mix2(seed, k) % records).collect()
}

/// Gathers go to the nodes, not through the router: with the router stopped, a client that
/// connected before it reads on, byte-exact, in both fields.
#[test]
fn one_hop_gathers_are_byte_exact_and_go_around_the_router() {
    const RECORDS: u64 = 3_000;
    let mut cluster = loaded(3, RECORDS, options(1, 2_000));
    let client = cluster.client().expect("client");
    assert!(client.reads_direct(), "gathers should go one hop");
    let routed = cluster.client_via_router().expect("client");
    assert!(!routed.reads_direct());
    for seed in 0..20 {
        check(&client, &batch(seed, RECORDS)).expect("one hop");
        check(&routed, &batch(seed, RECORDS)).expect("through the router");
    }
    // Empty and repeated batches, and a batch of one shard's records only.
    check(&client, &[]).expect("empty");
    check(&client, &[7, 7, 7, 0, RECORDS - 1]).expect("repeated");
    // Past the end: refused naming the index and the length, as the router refuses it.
    let e = client.gather(&[1, RECORDS], &[]).expect_err("past the end");
    assert_eq!(e.code(), Some(ErrorCode::IndexOutOfRange), "{e}");
    assert!(e.to_string().contains(&RECORDS.to_string()), "{e}");

    // Several connections to each node, taken in turn: the same records.
    let spread = cluster
        .client_with_options(ClientOptions {
            connections_per_node: 3,
            ..ClientOptions::default()
        })
        .expect("client");
    assert!(spread.reads_direct());
    for seed in 30..40 {
        check(&spread, &batch(seed, RECORDS)).expect("three connections a node");
    }

    cluster.stop_router(0).expect("stop the router");
    for seed in 20..30 {
        check(&client, &batch(seed, RECORDS)).expect("one hop, no router");
        check(&spread, &batch(seed, RECORDS)).expect("three connections, no router");
    }
    assert!(
        check(&routed, &batch(0, RECORDS)).is_err(),
        "a client reading through a stopped router should fail"
    );
}

/// A one-hop gather larger than any reply window — every shard's part held until the batch
/// is whole — comes back whole and byte-exact.
#[test]
fn a_gather_of_many_megabytes_goes_one_hop() {
    const RECORDS: u64 = 480;
    let cluster = SimCluster::start(3, options(1, 5_000)).expect("cluster");
    let client = cluster.client().expect("client");
    let big = |k: u64| -> Vec<u8> { (0..64 << 10).map(|i| mix2(k, i) as u8).collect() };
    let rows: Vec<Vec<u8>> = (0..RECORDS).map(big).collect();
    for chunk in rows.chunks(64) {
        let batch: Vec<Record> = chunk.iter().map(|r| Record::new().with("x", r)).collect();
        client.append_many(&batch).expect("append");
    }
    client.commit().expect("commit");
    assert!(client.reads_direct());
    let all: Vec<u64> = (0..RECORDS).rev().collect();
    let columns = client.gather(&all, &["x"]).expect("30 MiB in one gather");
    for (pos, &k) in all.iter().enumerate() {
        assert!(
            columns[0].get(pos) == Some(&rows[k as usize][..]),
            "record {k}"
        );
    }
}

/// A node takes only reads from a client's certificate, whatever its role: info and gathers
/// answer; writes, fences, commits, truncations and dataset changes are refused as
/// forbidden and change nothing. A client's request names no cluster for a node: one
/// placed for another cluster or map is refused.
#[test]
fn a_client_certificate_only_reads_from_a_node() {
    const RECORDS: u64 = 400;
    let cluster = loaded(2, RECORDS, options(1, 2_000));
    let client = cluster.client().expect("client");
    let status = client.status().expect("status");
    let placed = (status.cluster.as_str(), status.map_version);
    let held = match kit::ask_node(&cluster, Role::Router, (0, 0), placed, &NodeRequest::Info) {
        Reply::Info { len, .. } => len,
        other => panic!("info: {other:?}"),
    };
    let placement = Placement::new(client.map().expect("map")).expect("placement");
    // Shard 0's first records, by node address.
    let addresses: Vec<u64> = (0..3).map(|local| placement.address_of(0, local)).collect();
    let forbidden = [
        NodeRequest::Append {
            runs: placement.runs(0, held, 0),
            token: Some(u64::MAX),
            fields: vec!["x".into(), "y".into()],
            lengths: vec![vec![], vec![]],
        },
        NodeRequest::Truncate {
            slots: placement.slot_lens(0, 0),
            token: u64::MAX,
        },
        NodeRequest::Fence { token: u64::MAX },
        NodeRequest::Commit,
        NodeRequest::DropDataset { id: 1 },
        NodeRequest::Digest {
            runs: placement.runs(0, 0, 4),
        },
    ];
    for role in [Role::Reader, Role::Writer, Role::Operator] {
        match kit::ask_node(&cluster, role, (0, 0), placed, &NodeRequest::Info) {
            Reply::Info { len, .. } => assert_eq!(len, held),
            other => panic!("{role} info: {other:?}"),
        }
        let gather = NodeRequest::Gather {
            indices: addresses.clone(),
            fields: Vec::new(),
            checked: false,
        };
        match kit::ask_node(&cluster, role, (0, 0), placed, &gather) {
            Reply::Gather { lengths } => assert_eq!(lengths.len(), 2),
            other => panic!("{role} gather: {other:?}"),
        }
        for request in &forbidden {
            match kit::ask_node(&cluster, role, (0, 0), placed, request) {
                Reply::Error { code, message } => {
                    assert_eq!(code, ErrorCode::Forbidden, "{role} {request:?}: {message}");
                    assert!(message.contains("only read"), "{message}");
                }
                other => panic!("{role} {request:?} was not refused: {other:?}"),
            }
        }
        // Placed for another cluster, or by another map: refused, and nothing claimed.
        let elsewhere = ("another-cluster", placed.1);
        match kit::ask_node(&cluster, role, (0, 0), elsewhere, &gather) {
            Reply::Error { code, .. } => assert_eq!(code, ErrorCode::WrongCluster),
            other => panic!("another cluster's gather: {other:?}"),
        }
        match kit::ask_node(&cluster, role, (0, 0), (placed.0, placed.1 + 1), &gather) {
            Reply::Error { code, .. } => assert_eq!(code, ErrorCode::StaleMap),
            other => panic!("another map's gather: {other:?}"),
        }
    }
    // Nothing changed: every record as written, the node still of this cluster.
    assert_eq!(client.len().expect("len"), RECORDS);
    let all: Vec<u64> = (0..RECORDS).collect();
    check(&client, &all).expect("unchanged");
    let routed = cluster.client_via_router().expect("client");
    check(&routed, &all).expect("unchanged, through the router");
}

/// A client that reaches no node at connect reads through the router (and says so once in
/// its log); one asked not to read one hop does the same.
#[test]
fn a_client_that_cannot_reach_the_nodes_reads_through_the_router() {
    const RECORDS: u64 = 300;
    let mut cluster = loaded(2, RECORDS, options(1, 2_000));
    for shard in 0..2 {
        cluster.stall_node(shard).expect("stall");
    }
    let options = ClientOptions {
        timeout: cluster.client_timeout(),
        direct: true,
        ..ClientOptions::default()
    };
    let started = cluster.now();
    let client = cluster
        .client_of(cluster.router_addr(), Role::Reader, options)
        .expect("the router answers");
    assert!(
        !client.reads_direct(),
        "no node answered: gathers should go through the router"
    );
    assert!(
        (cluster.now() - started) < Duration::from_secs(10),
        "{:?}",
        (cluster.now() - started)
    );
    for shard in 0..2 {
        cluster.start_node(shard).expect("start");
    }
    let all: Vec<u64> = (0..RECORDS).collect();
    kit_eventually(&cluster, || check(&client, &all).is_ok());
    let asked = cluster
        .client_of(
            cluster.router_addr(),
            Role::Reader,
            ClientOptions {
                direct: false,
                ..options
            },
        )
        .expect("connect");
    assert!(!asked.reads_direct());
    check(&asked, &all).expect("through the router");
}

fn kit_eventually(cluster: &SimCluster, mut done: impl FnMut() -> bool) {
    zr_tests::eventually(
        cluster,
        "gathers to be served",
        Duration::from_secs(30),
        &mut done,
    );
}

/// A replica set behind in the metadata store stops serving clients by itself within its
/// read lease — a client's own request to it is refused as not in sync — while one-hop
/// gathers go on, byte-exact, from its partner (the router stopped: nothing else can tell
/// the client); set in sync again, it serves again.
#[test]
fn a_replica_set_behind_stops_serving_clients_by_itself() {
    const RECORDS: u64 = 600;
    let mut cluster = loaded(2, RECORDS, options(2, 2_000));
    // The router's description is asked again every 300 ms (5 s by default), so that the
    // end shows reads going on past a failed refresh without waiting long for one.
    let every = Duration::from_millis(300);
    let client = cluster
        .client_with_options(ClientOptions {
            topology_every: every,
            ..ClientOptions::default()
        })
        .expect("client");
    assert!(client.reads_direct());
    let status = client.status().expect("status");
    let placed = (status.cluster.as_str(), status.map_version);
    // With the router stopped, nothing catches the replica up once it is marked behind:
    // the mark stays, and one-hop reads go on by the map the router gave last.
    let placement = Placement::new(client.map().expect("map")).expect("placement");
    cluster.stop_router(0).expect("stop the router");
    let gather = NodeRequest::Gather {
        indices: vec![placement.address_of(1, 0)],
        fields: Vec::new(),
        checked: false,
    };
    let refused = || {
        matches!(
            kit::ask_node(&cluster, Role::Reader, (1, 1), placed, &gather),
            Reply::Error {
                code: ErrorCode::NotInSync,
                ..
            }
        )
    };
    // Once past its start (see `zr_meta::nodes::START_HOLD`), an in-sync replica serves
    // clients.
    zr_tests::eventually(
        &cluster,
        "the replica to serve clients",
        Duration::from_secs(10),
        || !refused(),
    );
    let meta = cluster.metadata().expect("metadata");
    cluster
        .run(zr_meta::replicas::mark_behind(&*meta, (1, 1), 2))
        .expect("mark behind");
    let marked = cluster.now();
    zr_tests::eventually(
        &cluster,
        "the replica to refuse clients",
        Duration::from_secs(10),
        refused,
    );
    assert!(
        (cluster.now() - marked) < zr_meta::nodes::READ_LEASE + zr_meta::nodes::RENEW_EVERY * 2,
        "refused only after {:?}",
        (cluster.now() - marked)
    );
    // Meanwhile gathers go on, the partner serving what the replica refuses.
    for seed in 0..20 {
        check(&client, &batch(seed, RECORDS)).expect("served by the partner");
    }
    cluster
        .run(zr_meta::replicas::mark_in_sync(&*meta, (1, 1)))
        .expect("mark in sync");
    zr_tests::eventually(
        &cluster,
        "the replica to serve again",
        Duration::from_secs(10),
        || !refused(),
    );
    check(&client, &(0..RECORDS).collect::<Vec<_>>()).expect("all");
    // And with no router to ask, reads by the map it gave last go on past its refresh.
    cluster.pause(every * 2);
    check(&client, &batch(99, RECORDS)).expect("by the last map");
}

/// With two replicas and a 20 s timeout, a node that stops answering mid-run (its peers
/// hear nothing: no close, no reply) costs one-hop gathers no error and no wait near the
/// timeout: its partner serves them.
#[test]
fn a_node_that_stops_answering_is_failed_over_at_once() {
    const RECORDS: u64 = 1_000;
    let mut cluster = loaded(2, RECORDS, options(2, 20_000));
    let client = cluster.client().expect("client");
    assert!(client.reads_direct());
    check(&client, &batch(1, RECORDS)).expect("before");
    cluster.stall_node(cluster.node(0, 0)).expect("stall");
    let started = cluster.now();
    let mut slowest = Duration::ZERO;
    for seed in 0..40 {
        let one = cluster.now();
        check(&client, &batch(seed, RECORDS)).expect("the partner serves");
        slowest = slowest.max(cluster.now() - one);
    }
    assert!(
        slowest < Duration::from_secs(5),
        "a gather waited {slowest:?} for a node that stopped answering"
    );
    assert!((cluster.now() - started) < Duration::from_secs(30));
    let info = cluster.now();
    assert_eq!(client.len().expect("info"), RECORDS);
    assert!(
        (cluster.now() - info) < Duration::from_secs(5),
        "{:?}",
        (cluster.now() - info)
    );
}
