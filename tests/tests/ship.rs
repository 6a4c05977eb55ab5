//! Rebuilding a replica from its partner's files (`zr_shard::ship`): a wiped node copies
//! each dataset's files node to node, a piece damaged in transit is asked for again, the
//! writes made meanwhile follow by digest comparison, and the node then serves alone. Its
//! own file (so its process's counters are its own).

use std::time::Duration;

use zr_common::hash::mix2;
use zr_router::AsyncClient;
use zr_sim::SimCluster;
use zr_tests as kit;
use zr_tests::Row;

/// Longest field `a` of a row.
const LONGEST: u64 = 2_000;

/// Node `node` crashed, its data directory removed, and started again empty.
fn wipe(cluster: &mut SimCluster, node: u32) {
    cluster.crash_node(node);
    std::fs::remove_dir_all(cluster.data_dir(node)).expect("wipe");
    cluster.start_node(node).expect("restart empty");
}

/// Gathers, appends and modifies through `client` until every replica is in sync again;
/// returns the gathers made.
fn load_until_in_sync(
    cluster: &SimCluster,
    client: &AsyncClient,
    model: &mut Vec<Row>,
    seed: u64,
) -> u64 {
    kit::load_until_in_sync(
        cluster,
        client,
        model,
        seed,
        Duration::from_secs(120),
        LONGEST,
    )
}

/// Every record of each dataset (client and model), read with node `partner` down: the
/// rebuilt replica alone serves them.
fn served_without(cluster: &mut SimCluster, partner: u32, datasets: &[(&AsyncClient, &[Row])]) {
    cluster.crash_node(partner);
    cluster.run(async {
        for (client, model) in datasets {
            let all: Vec<u64> = (0..model.len() as u64).collect();
            kit::check_async(client, model, &all).await;
        }
    });
}

#[test]
fn a_wiped_replica_is_rebuilt_from_its_partners_files_and_a_damaged_piece_sent_again() {
    let mut cluster = SimCluster::start(2, kit::shipping_options()).expect("cluster");
    let client = cluster.async_client().expect("client");
    let named = cluster.run(async {
        client
            .create_dataset(
                "named",
                vec![
                    zr_router::FieldInfo::new("a", "zstd"),
                    zr_router::FieldInfo::new("b", "raw"),
                ],
            )
            .await
            .expect("create")
    });
    let mut model = Vec::new();
    let mut named_model = Vec::new();
    cluster.run(async {
        kit::append_async(&client, &mut model, 1, 6_000, LONGEST).await;
        client.commit().await.expect("commit");
        kit::append_async(&named, &mut named_model, 2, 3_000, LONGEST).await;
        named.commit().await.expect("commit");
    });
    let (rebuilt, asked_again) = zr_shard::ship::counts();
    // The first piece the partner serves arrives damaged.
    let (wiped, partner) = (cluster.node(1, 1), cluster.node(1, 0));
    cluster
        .ship_faults(partner)
        .expect("node")
        .damage_next_pieces(1);
    wipe(&mut cluster, wiped);
    // Gathers and appends go on while it is rebuilt (what they write follows as a tail).
    let gathers = load_until_in_sync(&cluster, &client, &mut model, 0x5eed);
    assert!(gathers > 0);
    let (now_rebuilt, now_asked_again) = zr_shard::ship::counts();
    assert_eq!(now_rebuilt - rebuilt, 2, "both datasets rebuilt from files");
    assert_eq!(
        now_asked_again - asked_again,
        1,
        "the damaged piece asked for again"
    );
    // The rebuilt replica alone serves both datasets.
    served_without(
        &mut cluster,
        partner,
        &[(&client, &model), (&named, &named_model)],
    );
    cluster.start_node(partner).expect("restart");
    load_until_in_sync(&cluster, &client, &mut model, 7);

    // A change to an existing record waiting for a commit on the partner when it takes its
    // snapshot: the snapshot is not what the partner serves, so everything copied is
    // compared again (the router logs that it is), and still byte-exact.
    wipe(&mut cluster, wiped);
    cluster.run(async {
        for index in [3u64, 1_000, 2_500] {
            let changed = kit::row(mix2(index, 77), LONGEST);
            client
                .modify(index, &kit::record(&changed))
                .await
                .expect("modify");
            model[index as usize] = changed;
        }
    });
    load_until_in_sync(&cluster, &client, &mut model, 9);
    served_without(&mut cluster, partner, &[(&client, &model)]);
    cluster.start_node(partner).expect("restart");
    load_until_in_sync(&cluster, &client, &mut model, 10);
    let (now_rebuilt, _) = zr_shard::ship::counts();

    // Every piece damaged: the rebuild from files gives up after three tries of one piece,
    // and the replica is caught up record by record instead, as correctly.
    let faults = cluster.ship_faults(partner).expect("node");
    faults.damage_next_pieces(u32::MAX);
    wipe(&mut cluster, wiped);
    load_until_in_sync(&cluster, &client, &mut model, 8);
    cluster
        .ship_faults(partner)
        .expect("node")
        .damage_next_pieces(0);
    let (after_rebuilt, _) = zr_shard::ship::counts();
    assert_eq!(
        after_rebuilt, now_rebuilt,
        "no rebuild from damaged files installed"
    );
    served_without(
        &mut cluster,
        partner,
        &[(&client, &model), (&named, &named_model)],
    );
}
