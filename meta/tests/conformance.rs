//! One suite, both backends: the embedded store always; etcd when its server is installed
//! (`apt-get install etcd-server`); under `CI=true` a missing etcd fails the test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use zr_meta::cluster::{self, ClusterRecord, MapRecord};
use zr_meta::testing::TestEtcd;
use zr_meta::writer::{self, LeaseState, Step};
use zr_meta::{EmbeddedStore, Error, MetaStore};

const TIMEOUT: Duration = Duration::from_secs(5);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// What every backend must do. `reopen` makes a second, independent handle on the same
/// store (another process's view).
async fn conformance(first: Arc<dyn MetaStore>, reopen: impl Fn() -> Arc<dyn MetaStore>) {
    let store = &*first;
    // A key that was never written.
    assert_eq!(store.get("nothing").await.expect("get"), None);
    // Create once; a second create is a conflict.
    let r1 = store.put_if("k", None, "one").await.expect("create");
    let e = store
        .put_if("k", None, "again")
        .await
        .expect_err("second create");
    assert!(matches!(e, Error::Conflict { .. }), "{e}");
    assert_eq!(store.get("k").await.expect("get"), Some(("one".into(), r1)));
    // Swap from the current revision; a stale one is a conflict and changes nothing.
    let r2 = store.put_if("k", Some(r1), "two").await.expect("swap");
    assert!(r2 > r1);
    let e = store
        .put_if("k", Some(r1), "stale")
        .await
        .expect_err("stale swap");
    assert!(matches!(e, Error::Conflict { .. }), "{e}");
    assert!(e.to_string().contains(&store.describe()), "{e}");
    assert_eq!(store.get("k").await.expect("get"), Some(("two".into(), r2)));
    // Another handle sees the same history.
    let other = reopen();
    assert_eq!(other.get("k").await.expect("get"), Some(("two".into(), r2)));
    // Revisions only grow, across keys and handles: they serve as fencing tokens.
    let mut last = r2;
    for round in 0..6 {
        let handle = if round % 2 == 0 { &first } else { &other };
        let key = format!("grow{}", round % 3);
        let expected = handle.get(&key).await.expect("get").map(|(_, r)| r);
        let revision = handle.put_if(&key, expected, "x").await.expect("put");
        assert!(revision > last, "revision {revision} after {last}");
        last = revision;
    }
    // Racing read-modify-writes through two handles lose no update.
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let handle = if t % 2 == 0 {
                Arc::clone(&first)
            } else {
                reopen()
            };
            tokio::spawn(async move {
                for _ in 0..5 {
                    loop {
                        let current = handle.get("counter").await.expect("get");
                        let (n, expected) = match current {
                            Some((text, revision)) => {
                                (text.parse::<u64>().expect("number"), Some(revision))
                            }
                            None => (0, None),
                        };
                        match handle
                            .put_if("counter", expected, &(n + 1).to_string())
                            .await
                        {
                            Ok(_) => break,
                            Err(Error::Conflict { .. }) => continue,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let (count, _) = store.get("counter").await.expect("get").expect("counter");
    assert_eq!(count, "40");
    // The typed cluster record round-trips through compare-and-swap.
    let record = ClusterRecord {
        id: cluster::new_cluster_id(),
        map: MapRecord {
            version: 1,
            shards: 3,
            extent_records: 64,
            seed: 7,
            replicas: 2,
            changes: Vec::new(),
        },
        committed_len: 0,
        moving: None,
        added: Vec::new(),
        datasets: vec![cluster::DatasetRecord {
            name: "text".into(),
            id: 1,
            fields: vec![cluster::FieldRecord {
                name: "tokens".into(),
                compress: "raw".into(),
                dtype: Some("<u4".into()),
                shape: None,
                dict: None,
            }],
        }],
        dataset_ids: 1,
        commits: 0,
    };
    let revision = cluster::store(store, None, &record)
        .await
        .expect("create the record");
    let longer = ClusterRecord {
        committed_len: 30_000,
        ..record.clone()
    };
    cluster::store(store, Some(revision), &longer)
        .await
        .expect("commit");
    assert!(cluster::store(store, Some(revision), &record)
        .await
        .is_err());
    let (back, _) = cluster::load(&*other)
        .await
        .expect("load")
        .expect("a record");
    assert_eq!(back, longer);
    // A dictionary's bytes: kept once under its name; the same bytes again are no change,
    // other bytes under that name are refused.
    let dict = cluster::DictRef { id: 7, crc: 0xabcd };
    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    assert_eq!(cluster::load_dict(store, dict).await.expect("load"), None);
    cluster::store_dict(store, dict, &bytes)
        .await
        .expect("store");
    cluster::store_dict(&*other, dict, &bytes)
        .await
        .expect("store again");
    let e = cluster::store_dict(store, dict, b"other")
        .await
        .expect_err("other bytes");
    assert!(e.to_string().contains("dict/7-0000abcd"), "{e}");
    assert_eq!(
        cluster::load_dict(&*other, dict).await.expect("load"),
        Some(bytes)
    );
    // Two routers race for the free writer lease through two handles: exactly one takes it.
    let racers: Vec<_> = [(1, Arc::clone(&first)), (2, reopen())]
        .into_iter()
        .map(|(me, handle)| {
            tokio::spawn(async move {
                let mut state = LeaseState::new(me, Duration::from_secs(30));
                let read = writer::load(&*handle, writer::WRITER_KEY)
                    .await
                    .expect("load the writer record");
                let now = Instant::now();
                match state.observe(read.as_ref().map(|(r, revision)| (r, *revision)), now) {
                    Step::Take { expected, pending } => writer::store(
                        &*handle,
                        writer::WRITER_KEY,
                        expected,
                        &state.record(pending),
                    )
                    .await
                    .is_ok(),
                    Step::Wait { .. } => false,
                }
            })
        })
        .collect();
    let mut took = 0;
    for racer in racers {
        took += usize::from(racer.await.expect("racer"));
    }
    assert_eq!(took, 1, "routers that took the writer lease");
}

#[test]
fn the_embedded_store_conforms() {
    let dir = tempfile::tempdir().expect("scratch");
    let path = dir.path().to_path_buf();
    runtime().block_on(async move {
        let open = || -> Arc<dyn MetaStore> { Arc::new(EmbeddedStore::open(&path).expect("open")) };
        conformance(open(), open).await;
    });
    // What it holds survives the handles: a later process reads it back.
    runtime().block_on(async {
        let store = EmbeddedStore::open(dir.path()).expect("reopen");
        assert!(cluster::load(&store).await.expect("load").is_some());
        let (_, before) = cluster::load(&store).await.expect("load").expect("record");
        let after = store.put_if("later", None, "x").await.expect("put");
        assert!(
            after > before,
            "revision {after} after a restart, {before} before"
        );
    });
}

#[test]
fn the_embedded_store_names_a_damaged_file() {
    let dir = tempfile::tempdir().expect("scratch");
    std::fs::write(dir.path().join("metadata.json"), b"{ not json").expect("damage");
    runtime().block_on(async {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        let e = store.get("k").await.expect_err("damaged");
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("metadata.json"), "{e}");
    });
}

/// A store whose directory was removed under it says so, and makes nothing again.
#[test]
fn the_embedded_store_names_its_removed_directory() {
    let dir = tempfile::tempdir().expect("scratch");
    let path = dir.path().join("metadata");
    runtime().block_on(async {
        let store = EmbeddedStore::open(&path).expect("open");
        store.put_if("k", None, "v").await.expect("put");
        std::fs::remove_dir_all(&path).expect("remove");
        let e = store.get("k").await.expect_err("removed");
        assert!(matches!(e, Error::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("directory is gone"), "{e}");
        assert!(!path.exists(), "a read made the directory again");
    });
}

#[test]
fn etcd_conforms_and_a_stopped_etcd_is_named() {
    let Some(mut etcd) = TestEtcd::start() else {
        return;
    };
    runtime().block_on(async {
        let first = Arc::new(etcd.connect("/zr-test", TIMEOUT).await);
        let second = Arc::new(etcd.connect("/zr-test", TIMEOUT).await);
        conformance(first.clone(), move || second.clone() as Arc<dyn MetaStore>).await;
        // Another prefix is another cluster.
        let other = etcd.connect("/zr-other", TIMEOUT).await;
        assert_eq!(other.get("k").await.expect("get"), None);
        // Stopped: calls fail within the timeout, naming the store.
        etcd.stop();
        let started = Instant::now();
        let e = first.get("k").await.expect_err("etcd is down");
        assert!(started.elapsed() < TIMEOUT + Duration::from_secs(2));
        assert!(matches!(e, Error::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains(etcd.endpoint()), "{e}");
    });
}
