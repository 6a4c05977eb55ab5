//! A wiped replica rebuilt from its partner's files is told finished to every router that
//! asks after: with two routers, the one that asked second once started a second copy,
//! swapped in under reads. Its own file (so its process's counters are its own).

use std::time::Duration;

use zr_net::tls::Role;
use zr_proto::wire::{NodeRequest, Reply};
use zr_sim::SimCluster;
use zr_tests as kit;

const LONGEST: u64 = 2_000;

#[test]
fn a_finished_rebuild_is_reported_to_a_second_router_not_started_again() {
    let mut cluster = SimCluster::start(2, kit::shipping_options()).expect("cluster");
    let client = cluster.async_client().expect("client");
    let mut model = Vec::new();
    cluster.run(async {
        kit::append_async(&client, &mut model, 1, 6_000, LONGEST).await;
        client.commit().await.expect("commit");
    });
    let (rebuilt, _) = zr_shard::ship::counts();
    let wiped = cluster.node(1, 1);
    cluster.crash_node(wiped);
    std::fs::remove_dir_all(cluster.data_dir(wiped)).expect("wipe");
    cluster.start_node(wiped).expect("restart empty");
    kit::load_until_in_sync(
        &cluster,
        &client,
        &mut model,
        3,
        Duration::from_secs(20),
        LONGEST,
    );
    assert_eq!(
        zr_shard::ship::counts().0 - rebuilt,
        1,
        "rebuilt from files"
    );
    // A second router that asked while the copy ran asks again after the first was told
    // it finished: it is told the same.
    let partner = cluster
        .listed_nodes()
        .into_iter()
        .find(|&(s, r, _)| (s, r) == (1, 0))
        .expect("partner")
        .2;
    let request = NodeRequest::ShipFrom {
        addr: partner.to_string(),
        replica: 0,
        shard: None,
        slots: Vec::new(),
        rate: 0,
    };
    let status = cluster
        .run(cluster.async_client().expect("client").status())
        .expect("status");
    let placed = (status.cluster.as_str(), status.map_version);
    match kit::ask_node(&cluster, Role::Router, (1, 1), placed, &request) {
        Reply::Shipping(status) => {
            assert!(status.done && status.error.is_none(), "{status:?}");
            assert!(status.len >= 3_000, "{status:?}");
        }
        other => panic!("ship-from: {other:?}"),
    }
    cluster.run(async { tokio::time::sleep(Duration::from_secs(5)).await });
    assert_eq!(
        zr_shard::ship::counts().0 - rebuilt,
        1,
        "the wiped replica's files were copied a second time"
    );
    cluster.run(async {
        let all: Vec<u64> = (0..model.len() as u64).collect();
        kit::check_async(&client, &model, &all).await;
    });
}
