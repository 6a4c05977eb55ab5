//! The cluster's metadata keeps committed data safe: a node that lost its disk is refused by
//! name and nothing is cut from the others; putting its directory back makes the cluster
//! whole; a nodes.toml that disagrees with the stored map is refused.

use std::path::Path;

use zr_common::Record;
use zr_net::tls::Role;
use zr_proto::wire::ErrorCode;
use zr_router::{Client, Router};
use zr_sim::{SimCluster, SimOptions};

const RECORDS: u64 = 3000;

fn options() -> SimOptions {
    zr_tests::options(&[("data", "raw")], 16, 2_000, 1)
}

fn payload(i: u64) -> Vec<u8> {
    zr_tests::bytes(i, 16, 200)
}

fn load(client: &Client, from: u64, to: u64) {
    let rows: Vec<Vec<u8>> = (from..to).map(payload).collect();
    let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
    assert_eq!(client.append_many(&records).unwrap(), from..to);
    client.commit().unwrap();
}

fn check(client: &Client, indices: &[u64]) {
    zr_tests::check_first(client, indices, payload);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

#[test]
fn a_wiped_node_is_refused_by_name_and_the_other_shards_keep_every_record() {
    let mut cluster = SimCluster::start(3, options()).unwrap();
    let client = cluster.client().unwrap();
    load(&client, 0, RECORDS);
    drop(client);

    // Shard 2 loses its disk (its directory kept aside, as a backup would be).
    let placement = cluster.config().placement().unwrap();
    let backup = tempfile::tempdir().unwrap();
    cluster.stop_node(2).unwrap();
    let dir = cluster.data_dir(2);
    let kept = backup.path().join("shard-2");
    std::fs::rename(&dir, &kept).unwrap();
    cluster.start_node(2).unwrap();
    cluster.restart_router().unwrap();

    let client = cluster.client().unwrap();
    assert_eq!(client.len().unwrap(), RECORDS, "the committed length holds");
    let on = |shard: u32| -> Vec<u64> {
        (0..RECORDS)
            .filter(|&i| placement.locate(i).0 == shard)
            .collect()
    };
    // The healthy shards serve every record, byte-exact.
    check(&client, &on(0));
    check(&client, &on(1));
    // The wiped one is refused by name, for gathers and for writes.
    let addr = cluster.config().shard(2).unwrap().addr;
    let e = client.gather(&on(2)[..1], &[]).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("shard 2") && text.contains(&addr.to_string()) && text.contains("missing"),
        "{text}"
    );
    assert_eq!(e.code(), Some(ErrorCode::Unavailable));
    let row = payload(RECORDS);
    let e = client
        .append(&Record::new().with("data", &row))
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard 2") && e.contains("missing"), "{e}");
    // The status says which node and why.
    let status = client.status().unwrap();
    assert_eq!(status.committed_len, RECORDS);
    let states: Vec<&str> = status.nodes.iter().map(|n| n.state.as_str()).collect();
    assert_eq!(states[0], "up");
    assert_eq!(states[1], "up");
    assert!(
        states[2].starts_with("refused: holds 0 of the"),
        "{states:?}"
    );
    assert_eq!(status.nodes[2].addr, addr.to_string());
    drop(client);

    // Its directory comes back: every record is there again, and writes go on.
    cluster.stop_node(2).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::rename(&kept, &dir).unwrap();
    cluster.start_node(2).unwrap();
    let client = cluster.client().unwrap();
    let all: Vec<u64> = (0..RECORDS).collect();
    check(&client, &all);
    load(&client, RECORDS, RECORDS + 100);
    assert_eq!(client.len().unwrap(), RECORDS + 100);
    check(&client, &(RECORDS - 50..RECORDS + 100).collect::<Vec<_>>());
}

#[test]
fn a_changed_map_in_nodes_toml_is_refused_and_changes_nothing() {
    let cluster = SimCluster::start(2, options()).unwrap();
    let client = cluster.client().unwrap();
    load(&client, 0, 500);
    let security = cluster.security(Role::Router).unwrap();
    let metadata = cluster.metadata().unwrap();
    for (edit, key) in [
        (
            {
                let mut c = cluster.config().clone();
                c.cluster.seed = 99;
                c
            },
            "seed",
        ),
        (
            {
                let mut c = cluster.config().clone();
                c.cluster.extent_records = 1000;
                c
            },
            "extent_records",
        ),
    ] {
        let started = cluster.run(Router::start_with(
            &edit,
            security.clone(),
            metadata.clone(),
        ));
        let e = started
            .err()
            .expect("a router with another map")
            .to_string();
        assert!(
            e.contains(&format!("nodes.toml says {key}")) && e.contains("not applied"),
            "{e}"
        );
    }
    assert_eq!(client.len().unwrap(), 500);
    check(&client, &(0..500).collect::<Vec<_>>());
}

/// With its metadata in etcd, a cluster whose etcd stops goes on serving gathers; writes
/// fail naming the metadata store; once etcd is back, they go through and nothing is lost. Needs the etcd server (`apt-get install etcd-server`; under CI=true it must be
/// there).
#[test]
fn gathers_go_on_while_etcd_is_down_and_writes_resume_after() {
    let Some(mut etcd) = zr_meta::testing::TestEtcd::start() else {
        return;
    };
    // The etcd client's connections live on this runtime, beside the cluster's.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(etcd.connect("/zr-sim", std::time::Duration::from_secs(2)));
    let store: std::sync::Arc<dyn zr_meta::MetaStore> = std::sync::Arc::new(store);
    let cluster = SimCluster::start(
        2,
        SimOptions {
            metadata: Some(store.clone()),
            ..options()
        },
    )
    .unwrap();
    let client = cluster.client().unwrap();
    load(&client, 0, 400);
    let (record, _) = cluster
        .run(zr_meta::cluster::load(&*store))
        .unwrap()
        .expect("the router recorded the cluster in etcd");
    assert_eq!(record.committed_len, 400);

    etcd.stop();
    check(&client, &(0..400).collect::<Vec<_>>());
    // Writes need the metadata store (an append is recorded there first): they fail at once,
    // naming it, and change nothing.
    let row = payload(400);
    for e in [
        client
            .append(&Record::new().with("data", &row))
            .unwrap_err()
            .to_string(),
        client.commit().unwrap_err().to_string(),
    ] {
        assert!(
            e.contains("metadata store") && e.contains(etcd.endpoint()),
            "{e}"
        );
    }
    assert_eq!(client.len().unwrap(), 400);
    check(&client, &(0..400).collect::<Vec<_>>());

    etcd.resume();
    cluster.run(etcd.wait_ready(&*store));
    assert_eq!(
        client.append(&Record::new().with("data", &row)).unwrap(),
        400
    );
    client.commit().unwrap();
    load(&client, 401, 500);
    assert_eq!(client.len().unwrap(), 500);
    check(&client, &(0..500).collect::<Vec<_>>());
    let (record, _) = cluster
        .run(zr_meta::cluster::load(&*store))
        .unwrap()
        .unwrap();
    assert_eq!(record.committed_len, 500);
}

/// A node's data directory knows its shard and its cluster: a node pointed at another
/// shard's directory does not start, and one given another cluster's directory is refused
/// by every request of this cluster's router, with a code a caller can act on.
#[test]
fn a_directory_of_another_shard_or_cluster_is_refused() {
    let mut ours = SimCluster::start(2, options()).unwrap();
    let mut theirs = SimCluster::start(2, options()).unwrap();
    load(&ours.client().unwrap(), 0, 300);
    load(&theirs.client().unwrap(), 0, 300);

    // Shard 1's node, started on shard 0's directory.
    ours.stop_node(0).unwrap();
    ours.stop_node(1).unwrap();
    let (zero, one) = (ours.data_dir(0), ours.data_dir(1));
    let aside = tempfile::tempdir().unwrap();
    copy_dir(&one, aside.path());
    std::fs::remove_dir_all(&one).unwrap();
    copy_dir(&zero, &one);
    let e = ours.start_node(1).unwrap_err().to_string();
    assert!(e.contains("shard 0's data, not shard 1's"), "{e}");

    // Shard 1's node, given shard 1's directory of the other cluster.
    theirs.stop_node(1).unwrap();
    std::fs::remove_dir_all(&one).unwrap();
    copy_dir(&theirs.data_dir(1), &one);
    ours.start_node(0).unwrap();
    ours.start_node(1).unwrap();
    let client = ours.client().unwrap();
    let placement = ours.config().placement().unwrap();
    let on_one = (0..300).find(|&i| placement.locate(i).0 == 1).unwrap();
    let e = client.gather(&[on_one], &[]).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::WrongCluster), "{e}");
    assert!(e.to_string().contains("another cluster"), "{e}");
    drop(client);

    // Its own directory back: whole again.
    ours.stop_node(1).unwrap();
    std::fs::remove_dir_all(&one).unwrap();
    copy_dir(aside.path(), &one);
    ours.start_node(1).unwrap();
    check(&ours.client().unwrap(), &(0..300).collect::<Vec<_>>());
}

/// A router starts while a node is down (the cluster record says what was committed): it
/// serves the shards that answer, fails the gathers that need the missing one naming it,
/// and serves everything once the node is back.
#[test]
fn a_router_starts_and_serves_while_a_node_is_down() {
    let mut cluster = SimCluster::start(3, options()).unwrap();
    load(&cluster.client().unwrap(), 0, 900);
    cluster.stop_node(1).unwrap();
    cluster.restart_router().unwrap();
    let client = cluster.client().unwrap();
    assert_eq!(client.len().unwrap(), 900);
    let placement = cluster.config().placement().unwrap();
    let (on1, others): (Vec<u64>, Vec<u64>) = (0..900).partition(|&i| placement.locate(i).0 == 1);
    check(&client, &others);
    let e = client.gather(&on1[..3], &[]).unwrap_err().to_string();
    assert!(e.contains("shard 1"), "{e}");
    let status = client.status().unwrap();
    assert!(
        status.nodes[1].state.starts_with("down: shard 1"),
        "{:?}",
        status.nodes[1]
    );
    assert_eq!(status.nodes[1].records, None);
    assert_eq!(status.nodes[0].state, "up");
    cluster.start_node(1).unwrap();
    check(&client, &(0..900).collect::<Vec<_>>());
    load(&client, 900, 1000);
    check(&client, &(850..1000).collect::<Vec<_>>());
}
