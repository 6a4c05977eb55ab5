//! Named datasets through the simulator: several side by side, each byte-exact against a
//! model of its own through two routers; dropped, grown by a field, written one field at a
//! time; consumers waiting for records a producer appends; nodes away during a create or a
//! drop brought in step when they return; shards added and drained online with three
//! datasets, one appended to and one read throughout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zr_common::hash::mix2;
use zr_common::Record;
use zr_net::tls::Role;
use zr_router::server::MoveStep;
use zr_router::{AsyncClient, Client, ClientOptions, Error, FieldInfo, MapChange};
use zr_sim::{SimCluster, SimOptions};

/// On virtual time: waits take no real time, and a seed replays a run.
fn options(replicas: u32) -> SimOptions {
    SimOptions {
        virtual_time: true,
        ..zr_tests::options(&[("a", "raw")], 3, 5_000, replicas)
    }
}

fn field(name: &str, compress: &str) -> FieldInfo {
    FieldInfo::new(name, compress)
}

/// Record `i` of dataset `salt`: one value per field, lengths varying.
fn value(salt: u64, field: u64, i: u64) -> Vec<u8> {
    let len = (mix2(salt ^ field, i) % 300) as usize + 1;
    (0..len).map(|k| mix2(salt + i, k as u64) as u8).collect()
}

/// Records `start..start + count` of dataset `salt`: each a value per field of `names`.
fn rows(names: &[&str], salt: u64, start: u64, count: u64) -> Vec<Vec<Vec<u8>>> {
    (start..start + count)
        .map(|i| (0..names.len() as u64).map(|f| value(salt, f, i)).collect())
        .collect()
}

/// `rows` as records of the fields `names`.
fn records<'a>(names: &[&'a str], rows: &'a [Vec<Vec<u8>>]) -> Vec<Record<'a>> {
    rows.iter()
        .map(|row| {
            let mut record = Record::new();
            for (name, v) in names.iter().zip(row) {
                record.set(name, v);
            }
            record
        })
        .collect()
}

fn load(client: &Client, names: &[&str], salt: u64, count: u64) {
    let start = client.len().unwrap();
    let rows = rows(names, salt, start, count);
    let appended = client.append_many(&records(names, &rows)).unwrap();
    assert_eq!(appended, start..start + count);
    client.commit().unwrap();
}

/// [`load`] through an async client.
async fn load_async(client: &AsyncClient, names: &[&str], salt: u64, count: u64) {
    let start = client.len().await.unwrap();
    let rows = rows(names, salt, start, count);
    let appended = client.append_many(&records(names, &rows)).await.unwrap();
    assert_eq!(appended, start..start + count);
    client.commit().await.unwrap();
}

fn check(client: &Client, names: &[&str], salt: u64, count: u64) {
    assert_eq!(client.len().unwrap(), count, "{}", client.name());
    let indices: Vec<u64> = (0..count).rev().collect();
    let columns = client.gather(&indices, names).unwrap();
    for (f, column) in columns.iter().enumerate() {
        for (pos, &i) in indices.iter().enumerate() {
            assert!(
                column.get(pos).unwrap() == value(salt, f as u64, i).as_slice(),
                "{}: field {} of record {i} differs",
                client.name(),
                names[f]
            );
        }
    }
}

#[test]
fn two_datasets_side_by_side_through_two_routers() {
    side_by_side(1);
}

#[test]
fn two_replicated_datasets_side_by_side_through_two_routers() {
    side_by_side(2);
}

fn side_by_side(replicas: u32) {
    let mut cluster = SimCluster::start(3, options(replicas)).unwrap();
    let second = cluster.add_router().unwrap();
    let one = cluster.client().unwrap();
    let two = cluster
        .client_of(second, Role::Operator, ClientOptions::default())
        .unwrap();
    let images = one
        .create_dataset("images", vec![field("img", "raw"), field("label", "flate")])
        .unwrap();
    // The other router knows it at once.
    let text = two
        .create_dataset("text", vec![field("tokens", "raw")])
        .unwrap();
    let images_two = two.dataset("images").unwrap();
    let text_one = one.dataset("text").unwrap();
    load(&images, &["img", "label"], 1, 200);
    load(&text_two_or(&text), &["tokens"], 2, 150);
    load(&images_two, &["img", "label"], 1, 100);
    check(&images, &["img", "label"], 1, 300);
    check(&images_two, &["img", "label"], 1, 300);
    check(&text_one, &["tokens"], 2, 150);
    // The default dataset is untouched.
    assert_eq!(one.len().unwrap(), 0);
    let listed = two.datasets().unwrap();
    let names: Vec<(&str, u64, Option<u64>)> = listed
        .iter()
        .map(|d| (d.name.as_str(), d.len, d.committed))
        .collect();
    assert_eq!(
        names,
        [
            ("default", 0, Some(0)),
            ("images", 300, Some(300)),
            ("text", 150, Some(150))
        ]
    );
    assert!(listed[1].bytes > 0, "the listing counts bytes");
    // Room reserved ahead in chunk files holds nothing (an empty dataset once listed 1 GiB).
    assert!(
        listed[0].bytes < 1 << 20,
        "the empty dataset lists {} bytes",
        listed[0].bytes
    );

    // Bad requests change nothing.
    let exists = one
        .create_dataset("images", vec![field("x", "raw")])
        .unwrap_err();
    assert!(exists.to_string().contains("exists already"), "{exists}");
    let bad = one
        .create_dataset("Bad Name", vec![field("x", "raw")])
        .unwrap_err();
    assert!(bad.to_string().contains("[a-z0-9._-]"), "{bad}");
    let missing = one.dataset("nothing").unwrap_err();
    assert_eq!(missing.code(), Some(zr_proto::ErrorCode::NoSuchDataset));
    // It names no other dataset: which exist is the listing's to say, to whom may read it.
    assert!(
        !missing.to_string().contains("images") && !missing.to_string().contains("text"),
        "{missing}"
    );

    // A drop leaves the other byte-exact; a handle on the dropped one says so.
    two.drop_dataset("text").unwrap();
    let dropped = text_one.gather(&[0], &[]).unwrap_err();
    assert!(matches!(dropped, Error::Dropped { .. }), "{dropped}");
    let write = text
        .append(&Record::new().with("tokens", b"late"))
        .unwrap_err();
    assert_eq!(
        write.code(),
        Some(zr_proto::ErrorCode::NoSuchDataset),
        "{write}"
    );
    assert!(one.drop_dataset("text").is_err(), "dropped twice");
    check(&images, &["img", "label"], 1, 300);

    // A field grown on stored records, written for a range through the other router.
    let mut grown = one.dataset("images").unwrap();
    grown.add_field(field("reward", "flate")).unwrap();
    let rewards: Vec<Vec<u8>> = (10..30u64).map(|i| format!("r{i}").into_bytes()).collect();
    let slices: Vec<&[u8]> = rewards.iter().map(Vec::as_slice).collect();
    let images_two = two.dataset("images").unwrap();
    // What a reader's order proof keeps of a dataset: its commits that changed records.
    let commits = |client: &Client| {
        let listed = client.datasets().unwrap();
        let images = listed.iter().find(|d| d.name == "images").unwrap();
        (images.committed, images.commits.unwrap())
    };
    let before = commits(&one);
    images_two.commit().unwrap();
    assert_eq!(commits(&one), before, "a commit of nothing changes nothing");
    images_two.write_field("reward", 10, &slices).unwrap();
    images_two
        .modify(5, &Record::new().with("label", b"relabelled"))
        .unwrap();
    images_two.commit().unwrap();
    let after = commits(&one);
    assert_eq!(after.0, before.0, "the length stayed");
    assert_eq!(
        after.1,
        before.1 + 1,
        "records rewritten in place count a change"
    );
    assert_eq!(commits(&two), after, "every router lists the same");
    let indices: Vec<u64> = (0..300).collect();
    let columns = grown.gather(&indices, &["img", "label", "reward"]).unwrap();
    for i in 0..300u64 {
        let k = i as usize;
        assert_eq!(columns[0].get(k).unwrap(), value(1, 0, i).as_slice());
        let label = if i == 5 {
            b"relabelled".to_vec()
        } else {
            value(1, 1, i)
        };
        assert_eq!(columns[1].get(k).unwrap(), label.as_slice(), "label {i}");
        let reward = if (10..30).contains(&i) {
            format!("r{i}").into_bytes()
        } else {
            Vec::new()
        };
        assert_eq!(columns[2].get(k).unwrap(), reward.as_slice(), "reward {i}");
    }
    let twice = grown.add_field(field("reward", "raw")).unwrap_err();
    assert!(twice.to_string().contains("already"), "{twice}");
}

/// A dataset holding the most fields a request may name refuses one more, by name, and
/// stays writable and readable whole (a 257th field once made every append fail).
#[test]
fn a_dataset_at_the_field_limit_refuses_one_more_and_stays_writable() {
    let cluster = SimCluster::start(2, options(1)).unwrap();
    let client = cluster.client().unwrap();
    let fields: Vec<FieldInfo> = (0..zr_proto::wire::FIELDS_MAX)
        .map(|i| field(&format!("f{i}"), "raw"))
        .collect();
    let mut wide = client.create_dataset("wide", fields).unwrap();
    let refused = wide.add_field(field("one-more", "raw")).unwrap_err();
    assert!(
        refused.to_string().contains("256 fields, the most"),
        "{refused}"
    );
    assert_eq!(wide.fields().len(), zr_proto::wire::FIELDS_MAX);
    wide.append(&Record::new().with("f0", b"a").with("f255", b"z"))
        .unwrap();
    wide.commit().unwrap();
    let columns = wide.gather(&[0], &[]).unwrap();
    assert_eq!(columns.len(), zr_proto::wire::FIELDS_MAX);
    assert_eq!(columns[255].get(0).unwrap(), b"z");
}

fn text_two_or(text: &Client) -> Client {
    text.dataset("text").unwrap()
}

#[test]
fn a_consumer_waits_for_what_a_producer_appends() {
    let mut cluster = SimCluster::start(3, options(1)).unwrap();
    let second = cluster.add_router().unwrap();
    let writer = cluster.async_client().unwrap();
    let reader = cluster
        .async_client_with(second, Role::Reader, ClientOptions::default())
        .unwrap();
    const BATCHES: u64 = 12;
    const BATCH: u64 = 25;
    // Raised just before each commit: a record gathered earlier was not waited for.
    let commit_begun = AtomicU64::new(0);
    let seen = cluster.run(async {
        let producer = writer
            .create_dataset("stream", vec![field("x", "raw")])
            .await
            .unwrap();
        let consumer = reader.dataset("stream").await.unwrap();
        let producing = async {
            for b in 0..BATCHES {
                let rows: Vec<Vec<u8>> = (b * BATCH..(b + 1) * BATCH)
                    .map(|i| value(7, 0, i))
                    .collect();
                let records: Vec<Record> =
                    rows.iter().map(|r| Record::new().with("x", r)).collect();
                producer.append_many(&records).await.unwrap();
                tokio::time::sleep(Duration::from_millis(30)).await;
                commit_begun.store((b + 1) * BATCH, Ordering::SeqCst);
                producer.commit().await.unwrap();
            }
        };
        let consuming = async {
            let mut seen = 0u64;
            while seen < BATCHES * BATCH {
                let indices: Vec<u64> = (seen..seen + 10).collect();
                let columns = consumer
                    .gather_waiting(&indices, &["x"], Duration::from_secs(20))
                    .await
                    .unwrap();
                assert!(
                    commit_begun.load(Ordering::SeqCst) > *indices.last().unwrap(),
                    "records {indices:?} were read before their commit began"
                );
                for (k, &i) in indices.iter().enumerate() {
                    assert_eq!(columns[0].get(k).unwrap(), value(7, 0, i).as_slice());
                }
                seen += indices.len() as u64;
            }
            seen
        };
        let ((), seen) = tokio::join!(producing, consuming);
        seen
    });
    let consumer = cluster
        .client_of(second, Role::Reader, ClientOptions::default())
        .unwrap()
        .dataset("stream")
        .unwrap();
    assert_eq!(
        consumer.wait_len(seen, Duration::from_secs(1)).unwrap(),
        seen
    );
    // Nothing more comes: the wait ends, naming the length reached.
    let waited = consumer
        .gather_waiting(&[seen], &[], Duration::from_millis(200))
        .unwrap_err();
    assert!(
        waited.to_string().contains(&format!("has {seen}")),
        "{waited}"
    );
}

/// A wait for commits may outlast the client's own timeout: the call is bounded by the wait
/// it asks for plus that timeout. (It was bounded by the timeout alone: a reader's long
/// wait failed with "no reply" once the client's timeout had passed.)
#[test]
fn a_wait_for_commits_outlasts_the_clients_timeout() {
    let cluster = SimCluster::start(2, options(1)).unwrap();
    let writer = cluster.async_client().unwrap();
    let reader = cluster
        .async_client_with(
            cluster.router_addr(),
            Role::Reader,
            ClientOptions::default(),
        )
        .unwrap();
    let timeout = cluster.client_timeout();
    let (waited, gathered) = cluster.run(async {
        let began = tokio::time::Instant::now();
        let waiting = reader.gather_waiting(&[0], &["a"], timeout * 4);
        let producing = async {
            tokio::time::sleep(timeout * 3).await;
            writer
                .append(&Record::new().with("a", b"late"))
                .await
                .unwrap();
            writer.commit().await.unwrap();
        };
        let (gathered, ()) = tokio::join!(waiting, producing);
        (began.elapsed(), gathered)
    });
    let columns = gathered.unwrap();
    assert_eq!(columns[0].get(0).unwrap(), b"late");
    assert!(waited >= timeout * 3, "answered after {waited:?}");
}

#[test]
fn a_node_down_during_a_create_and_a_drop_learns_both_when_it_returns() {
    let mut cluster = SimCluster::start(3, options(1)).unwrap();
    let client = cluster.client().unwrap();
    let old = client
        .create_dataset("old", vec![field("x", "raw")])
        .unwrap();
    load(&old, &["x"], 3, 60);
    let node = cluster.node(1, 0);
    cluster.stop_node(node).unwrap();
    let late = client
        .create_dataset("late", vec![field("y", "flate")])
        .unwrap();
    client.drop_dataset("old").unwrap();
    let dir = cluster.data_dir(node).join("datasets");
    assert!(dir.join("old").exists() && !dir.join("late").exists());
    cluster.start_node(node).unwrap();
    let within = Duration::from_secs(10);
    zr_tests::eventually(
        &cluster,
        "the returned node takes the create",
        within,
        || dir.join("late").exists() && !dir.join("old").exists(),
    );
    zr_tests::eventually(&cluster, "the returned node serves it", within, || {
        late.append(&Record::new().with("y", b"probe")).is_ok()
    });
    let start = late.len().unwrap();
    load(&late, &["y"], 4, 90);
    let indices: Vec<u64> = (start..start + 90).collect();
    let column = &late.gather(&indices, &["y"]).unwrap()[0];
    for (k, &i) in indices.iter().enumerate() {
        assert_eq!(column.get(k).unwrap(), value(4, 0, i).as_slice());
    }
}

#[test]
fn the_default_dataset_of_a_cluster_made_before_names_serves_as_it_did() {
    let mut cluster = SimCluster::start(2, options(1)).unwrap();
    let client = cluster.client().unwrap();
    load(&client, &["a"], 5, 80);
    // Requests that name no dataset, and those naming "default", are the same dataset.
    check(&client.dataset("default").unwrap(), &["a"], 5, 80);
    let named = client
        .create_dataset("more", vec![field("a", "raw")])
        .unwrap();
    load(&named, &["a"], 6, 40);
    drop((client, named));
    // Every process restarts: nodes reopen both layouts, the router both records.
    for node in 0..cluster.node_count() {
        cluster.stop_node(node).unwrap();
        cluster.start_node(node).unwrap();
    }
    cluster.restart_router().unwrap();
    let client = cluster.client().unwrap();
    check(&client, &["a"], 5, 80);
    check(&client.dataset("more").unwrap(), &["a"], 6, 40);
}

#[test]
fn shards_move_online_with_three_datasets() {
    moves_with_datasets(1);
}

#[test]
fn replicated_shards_move_online_with_three_datasets() {
    moves_with_datasets(2);
}

/// The default dataset and two named ones: a shard added, then one drained, while a
/// producer appends to one and a reader gathers another (every gather byte-exact); all
/// three byte-exact after each move; then a move whose router dies after switching one
/// node, finished by the next router on its own.
fn moves_with_datasets(replicas: u32) {
    let mut cluster = SimCluster::start(2, options(replicas)).unwrap();
    let client = cluster.client().unwrap();
    let images = client
        .create_dataset("images", vec![field("img", "raw"), field("label", "flate")])
        .unwrap();
    let text = client
        .create_dataset("text", vec![field("tokens", "raw")])
        .unwrap();
    load(&client, &["a"], 0, 300);
    load(&images, &["img", "label"], 1, 500);
    load(&text, &["tokens"], 2, 400);
    let check_all = |client: &Client, text_len: u64| {
        check(client, &["a"], 0, 300);
        check(
            &client.dataset("images").unwrap(),
            &["img", "label"],
            1,
            500,
        );
        check(&client.dataset("text").unwrap(), &["tokens"], 2, text_len);
    };
    let mut text_len = 400;
    for change in [MapChange::AddShard, MapChange::DrainShard(0)] {
        if change == MapChange::AddShard {
            cluster.add_shard_nodes().unwrap();
        }
        // A producer appends to one dataset and a reader gathers another while the move
        // runs, each pausing 2 ms between calls so that the cluster's clock moves on.
        let (text, images, mover) = (
            cluster.async_client().unwrap(),
            cluster.async_client().unwrap(),
            cluster.async_client().unwrap(),
        );
        let stop = AtomicBool::new(false);
        let (report, appended, gathers) = cluster.run(async {
            let (text, images) = (
                text.dataset("text").await.unwrap(),
                images.dataset("images").await.unwrap(),
            );
            let producing = async {
                let mut appended = 0;
                while !stop.load(Ordering::SeqCst) {
                    load_async(&text, &["tokens"], 2, 7).await;
                    appended += 7;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                appended
            };
            let reading = async {
                let mut gathers = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let indices: Vec<u64> = (0..32).map(|k| mix2(gathers, k) % 500).collect();
                    let columns = images.gather(&indices, &["img", "label"]).await.unwrap();
                    for (pos, &i) in indices.iter().enumerate() {
                        for (f, column) in columns.iter().enumerate() {
                            assert!(
                                column.get(pos).unwrap() == value(1, f as u64, i).as_slice(),
                                "during the move: field {f} of images record {i} differs"
                            );
                        }
                    }
                    gathers += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                gathers
            };
            let moving = async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let report = cluster.run_move_async(&mover, change).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                stop.store(true, Ordering::SeqCst);
                report
            };
            tokio::join!(moving, producing, reading)
        });
        text_len += appended;
        assert!(gathers > 0, "no gather ran during the move");
        assert!(report.done && report.moved > 0, "{report:?}");
        check_all(&client, text_len);
        let status = client.status().unwrap();
        assert_eq!(status.moving, None);
    }
    // Every node of the added shard holds every dataset.
    for replica in 0..replicas {
        let dir = cluster.data_dir(cluster.node(2, replica)).join("datasets");
        assert!(dir.join("images").exists() && dir.join("text").exists());
    }

    // A move whose router dies after one node switched: the next router switches the rest
    // of every dataset on its own, and the command run again says it is done.
    cluster.add_shard_nodes().unwrap();
    cluster
        .router(0)
        .unwrap()
        .stop_moves_at(Some(MoveStep::SwitchedOne));
    let stopped = cluster.run_move(&client, MapChange::AddShard).unwrap_err();
    assert!(stopped.contains("injected"), "{stopped}");
    drop((client, images, text));
    cluster.kill_router(0);
    cluster.add_router().unwrap();
    let client = cluster.client().unwrap();
    let deadline = cluster.now() + Duration::from_secs(30);
    while std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_all(&client, text_len)
    }))
    .is_err()
    {
        assert!(
            cluster.now() < deadline,
            "the published map never served every dataset"
        );
        cluster.pause(Duration::from_millis(200));
    }
    let report = cluster.run_move(&client, MapChange::AddShard).unwrap();
    assert!(report.done && report.already, "{report:?}");
    check_all(&client, text_len);
    load(&client.dataset("text").unwrap(), &["tokens"], 2, 10);
    check(
        &client.dataset("text").unwrap(),
        &["tokens"],
        2,
        text_len + 10,
    );
}

/// A mixture of two named datasets read through the cluster client by the Rust mixture
/// loader: every row is the record the mixture names, and a state taken on 2 ranks
/// resumes on 1 with the same global batches.
#[test]
fn a_mixture_of_named_datasets_loads_through_the_client() {
    use zr_common::{GatherSource, LoaderOptions, Mixture, MixtureConfig, MixtureLoader, Stage};

    let cluster = SimCluster::start(2, options(1)).unwrap();
    let client = cluster.client().unwrap();
    let mut sources: Vec<Arc<dyn GatherSource>> = Vec::new();
    for (salt, n) in [(21u64, 90u64), (22, 30)] {
        let ds = client
            .create_dataset(&format!("mix{salt}"), vec![field("v", "raw")])
            .unwrap();
        load(&ds, &["v"], salt, n);
        sources.push(Arc::new(ds));
    }
    let mixture = |rank, ranks| {
        Mixture::new(MixtureConfig {
            lengths: vec![90, 30],
            stages: vec![Stage {
                start: 0,
                weights: vec![0.6, 0.4],
            }],
            seed: 2,
            rank,
            ranks,
            batch: 8 / ranks,
        })
        .unwrap()
    };
    let options = || LoaderOptions {
        fields: vec!["v".into()],
        prefetch: 3,
        workers: 2,
        end_epoch: None,
    };
    let rows = |batch: zr_common::LoadedBatch| -> Vec<Vec<u8>> {
        (0..batch.indices.len())
            .map(|k| {
                let salt = 21 + batch.sources[k] as u64;
                let got = batch.columns[0].get(k).unwrap().to_vec();
                assert_eq!(got, value(salt, 0, batch.indices[k]), "row {k}");
                got
            })
            .collect()
    };
    let start = mixture(0, 1).state_at(0);
    let whole: Vec<Vec<Vec<u8>>> =
        MixtureLoader::new(sources.clone(), mixture(0, 1), &start, options())
            .unwrap()
            .take(10)
            .map(|b| rows(b.unwrap()))
            .collect();
    let mut halves = MixtureLoader::new(sources.clone(), mixture(1, 2), &start, options()).unwrap();
    for expected in &whole[..4] {
        assert_eq!(&rows(halves.next().unwrap().unwrap()), &expected[4..]);
    }
    let state = halves.state();
    let rest: Vec<Vec<Vec<u8>>> = MixtureLoader::new(sources, mixture(0, 1), &state, options())
        .unwrap()
        .take(6)
        .map(|b| rows(b.unwrap()))
        .collect();
    assert_eq!(rest, whole[4..]);
}

/// Zstandard fields through the cluster: a named dataset created with `zstd` and `zstd:9`
/// fields (R = 2), records of every kind gathered back byte-exact, the storage kept.
#[test]
fn zstd_fields_round_trip_through_the_cluster() {
    let cluster = SimCluster::start(2, options(2)).unwrap();
    let client = cluster.client().unwrap();
    let bad = client
        .create_dataset("bad", vec![field("c", "zstd:30")])
        .unwrap_err();
    assert!(bad.to_string().contains("zstd level '30'"), "{bad}");
    let ds = client
        .create_dataset("captions", vec![field("c", "zstd"), field("j", "zstd:9")])
        .unwrap();
    let text = |i: u64| {
        format!("{{\"id\": {i}, \"caption\": \"a dog on a beach number {i}\"}}")
            .repeat(1 + i as usize % 3)
    };
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..300u64)
        .map(|i| match i % 4 {
            0 => (Vec::new(), vec![i as u8]),
            1 => (text(i).into_bytes(), value(7, 0, i)),
            _ => (value(8, 1, i), text(i).into_bytes()),
        })
        .collect();
    let rows: Vec<Record> = records
        .iter()
        .map(|(c, j)| Record::new().with("c", c).with("j", j))
        .collect();
    ds.append_many(&rows).unwrap();
    ds.commit().unwrap();
    let indices: Vec<u64> = (0..300).rev().collect();
    let columns = ds.gather(&indices, &["c", "j"]).unwrap();
    for (pos, &i) in indices.iter().enumerate() {
        assert_eq!(columns[0].get(pos).unwrap(), &records[i as usize].0[..]);
        assert_eq!(columns[1].get(pos).unwrap(), &records[i as usize].1[..]);
    }
    let fields: Vec<String> = ds.fields().iter().map(|f| f.compress.clone()).collect();
    assert_eq!(fields, ["zstd", "zstd:9"]);
}

/// A caption such as a dataset of image-text pairs holds: a few hundred bytes of JSON whose
/// words and keys recur across records (what a dictionary learns), varying per record.
fn caption(i: u64) -> Vec<u8> {
    const WORDS: [&str; 24] = [
        "a", "dog", "cat", "running", "on", "the", "beach", "sunset", "with", "red", "ball",
        "photo", "of", "two", "people", "walking", "in", "park", "near", "lake", "blue", "sky",
        "small", "house",
    ];
    let words = 12 + mix2(i, 1) % 30;
    let text: Vec<&str> = (0..words)
        .map(|k| WORDS[(mix2(i, k + 2) % WORDS.len() as u64) as usize])
        .collect();
    format!(
        "{{\"id\": {i}, \"url\": \"https://images.example.com/{:08x}.jpg\", \"width\": {}, \"height\": {}, \"caption\": \"{}\", \"license\": \"cc-by-4.0\"}}",
        mix2(i, 0) as u32,
        256 + mix2(i, 40) % 1024,
        256 + mix2(i, 41) % 1024,
        text.join(" ")
    )
    .into_bytes()
}

/// Record `i` of the dictionary test: captions, and every kind of record besides (empty,
/// one byte, incompressible, 1 MiB).
fn dict_record(i: u64) -> Vec<u8> {
    match i {
        0 => Vec::new(),
        1 => vec![b'{'],
        2 => (0..4096).map(|k| mix2(i, k) as u8).collect(),
        3 => caption(i).repeat((1 << 20) / caption(i).len() + 1)[..1 << 20].to_vec(),
        _ => caption(i),
    }
}

/// Every record of the dictionary test's `count`, read back byte-exact through `client`.
fn check_dict_records(client: &Client, count: u64) {
    let indices: Vec<u64> = (0..count).rev().collect();
    let column = &client.gather(&indices, &["c"]).unwrap()[0];
    for (pos, &i) in indices.iter().enumerate() {
        assert!(
            column.get(pos).unwrap() == dict_record(i).as_slice(),
            "{}: record {i} differs",
            client.name()
        );
    }
}

/// A cluster dataset whose zstd field has a dictionary: bad dictionaries refused by name;
/// the records of every kind compressed with it on every node and read back one hop and
/// through the router; smaller on disk than without it; then a wiped replica and a shard
/// added later get the same dictionary, from the metadata store, and serve the records.
#[test]
fn a_zstd_dictionary_reaches_every_node_now_and_later() {
    let mut cluster = SimCluster::start(2, options(2)).unwrap();
    let client = cluster.client().unwrap();
    let samples: Vec<Vec<u8>> = (10..3_010).map(caption).collect();
    let refs: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
    let dict = zr_node::dict::train(&refs, 16 << 10).unwrap();
    let id = zr_node::dict::id(&dict).unwrap();
    let with = |field: &str, bytes: &[u8]| {
        vec![zr_router::FieldDict {
            field: field.into(),
            bytes: bytes.to_vec(),
        }]
    };
    // Refused, each naming what is wrong.
    for (fields, dicts, says) in [
        (
            vec![field("c", "raw")],
            with("c", &dict),
            "a dictionary is for zstd fields",
        ),
        (
            vec![field("c", "zstd")],
            with("c", b"not one"),
            "no zstd dictionary",
        ),
        (vec![field("c", "zstd")], with("d", &dict), "does not have"),
        // A dictionary's magic and id, then noise: once accepted, and every append failed.
        (
            vec![field("c", "zstd")],
            with("c", &[&dict[..8], &[0x5a; 4000][..]].concat()),
            "cannot be used",
        ),
    ] {
        let e = client
            .create_dataset_with_dicts("bad", fields, dicts)
            .unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
    let captions = client
        .create_dataset_with_dicts("captions", vec![field("c", "zstd")], with("c", &dict))
        .unwrap();
    let plain = client
        .create_dataset("plain", vec![field("c", "zstd")])
        .unwrap();
    assert_eq!(captions.fields()[0].dict.map(|d| d.id), Some(id));
    assert_eq!(plain.fields()[0].dict, None);
    let count = 2_000;
    for dataset in [&captions, &plain] {
        let records: Vec<Vec<u8>> = (0..count).map(dict_record).collect();
        let rows: Vec<Record> = records.iter().map(|r| Record::new().with("c", r)).collect();
        for batch in rows.chunks(500) {
            dataset.append_many(batch).unwrap();
        }
        dataset.commit().unwrap();
    }
    check_dict_records(&captions, count);
    let via_router = cluster
        .client_via_router()
        .unwrap()
        .dataset("captions")
        .unwrap();
    check_dict_records(&via_router, count);
    // Bytes the nodes' chunks hold (as each node's metadata commits them: chunk files are
    // grown ahead of their data, and a node's many small slots fill whole blocks each).
    let bytes = |name: &str| {
        let mut total = 0;
        for node in 0..cluster.node_count() {
            let dir = cluster.data_dir(node).join("datasets").join(name);
            let meta = zr_node::Meta::load(&dir).unwrap();
            total += meta.chunks.iter().map(|c| c.bytes).sum::<u64>();
        }
        total
    };
    let (small, large) = (bytes("captions"), bytes("plain"));
    assert!(
        small < large,
        "with the dictionary {small} bytes, without {large}"
    );
    let holds_dict = |cluster: &SimCluster, node: u32| {
        let path = cluster
            .data_dir(node)
            .join("datasets/captions/dict/c.zdict");
        std::fs::read(path).ok().as_deref() == Some(&dict[..])
    };
    for node in 0..cluster.node_count() {
        assert!(
            holds_dict(&cluster, node),
            "node {node} lacks the dictionary"
        );
    }

    // A wiped replica gets the dataset back with its dictionary, catches up, and serves it
    // alone.
    let wiped = cluster.node(1, 1);
    cluster.crash_node(wiped);
    std::fs::remove_dir_all(cluster.data_dir(wiped)).unwrap();
    cluster.start_node(wiped).unwrap();
    // Caught up: in sync, and holding as many records as its partner (committed: a
    // read-only open sees what is durable).
    let held = |node: u32| {
        let dir = cluster.data_dir(node).join("datasets/captions");
        zr_node::Store::open_read_only(dir).map_or(0, |store| store.len())
    };
    // The data first, then the router's word: a replica holding the records is in sync
    // only once the router has marked it so after catching it up (it marked it behind
    // before copying anything to it).
    let caught_up = || {
        let copied =
            held(wiped) > 0 && captions.commit().is_ok() && held(wiped) == held(cluster.node(1, 0));
        copied && {
            let status = client.status().unwrap();
            status
                .nodes
                .iter()
                .any(|n| (n.shard, n.replica) == (1, 1) && n.in_sync && n.state == "up")
        }
    };
    let deadline = cluster.now() + Duration::from_secs(60);
    while !caught_up() {
        assert!(
            cluster.now() < deadline,
            "the wiped node never caught up: {} vs {}",
            held(wiped),
            held(cluster.node(1, 0))
        );
        cluster.pause(Duration::from_millis(200));
    }
    assert!(held(wiped) > 0 && holds_dict(&cluster, wiped));
    cluster.crash_node(cluster.node(1, 0));
    check_dict_records(&captions, count);
    cluster.start_node(cluster.node(1, 0)).unwrap();

    // A shard added later: its nodes, and every dataset staged for the next map, hold it.
    cluster.add_shard_nodes().unwrap();
    let report = cluster.run_move(&client, MapChange::AddShard).unwrap();
    assert!(report.done && report.moved > 0, "{report:?}");
    for replica in 0..2 {
        assert!(holds_dict(&cluster, cluster.node(2, replica)));
    }
    for node in 0..cluster.node_count() {
        assert!(
            holds_dict(&cluster, node),
            "node {node} lacks the dictionary after the move"
        );
    }
    check_dict_records(&client.dataset("captions").unwrap(), count);
}
