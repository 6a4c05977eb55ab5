//! The cluster on virtual time (`SimOptions::virtual_time`): one thread, tokio's clock paused
//! and moved on only when every task waits, so timeouts and delays of any length take no
//! real time, and a seed names a whole run — faults, operations, and the order of events —
//! which `ZR_SIM_SEED=<seed>` replays exactly.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use zr_common::hash::mix2;
use zr_common::Record;
use zr_meta::{Call, MetaStore, Revision};
use zr_router::AsyncClient;
use zr_sim::{Faults, SimCluster, SimOptions};

fn start(seed: u64, timeout_ms: u64) -> SimCluster {
    SimCluster::start(
        3,
        SimOptions {
            extent_records: 3,
            timeout_ms,
            seed,
            virtual_time: true,
            ..SimOptions::default()
        },
    )
    .unwrap()
}

fn row(seed: u64) -> Vec<u8> {
    zr_tests::bytes(seed, 0, 300)
}

/// What a run did: a digest of every byte it gathered, the datagrams each node lost, and how
/// long it took on the cluster's clock.
#[derive(Debug, PartialEq)]
struct Transcript {
    gathered: u64,
    lost: Vec<u64>,
    took: Duration,
}

/// A seed's run, twice: random appends, modifies, deletes and gathers under loss and delay
/// equal a model, and the second run goes exactly as the first.
#[test]
fn a_lossy_run_matches_a_model_and_replays_exactly() {
    let seed = zr_sim::SimOptions::default().seed;
    eprintln!("seed {seed} (ZR_SIM_SEED={seed} replays this run exactly)");
    let first = lossy_run(seed);
    assert!(
        first.lost.iter().sum::<u64>() > 0,
        "nothing lost: {first:?}"
    );
    eprintln!("{first:?}");
    let again = lossy_run(seed);
    assert_eq!(first, again, "seed {seed}: the second run went otherwise");
}

/// A seed whose first handshake packets to the lossiest node are lost: with quinn's
/// default initial round trip each cost about a second, two heartbeats in a row missed
/// their deadline, and the router found the node down while it answered (a gather failed).
#[test]
fn a_node_whose_handshake_packets_are_lost_is_not_found_down() {
    lossy_run(16_100_604_567_107_958_080);
}

/// Random appends, modifies, deletes and gathers under loss and delay, checked against a model.
fn lossy_run(seed: u64) -> Transcript {
    let cluster = start(seed, 5_000);
    for shard in 0..3 {
        let faults = Faults {
            loss: 0.03 * shard as f64,
            delay: Duration::from_millis(1 + shard as u64),
            partitioned: false,
        };
        cluster.set_faults(shard, faults).unwrap();
    }
    let client = cluster.async_client().unwrap();
    let mut gathered = 0u64;
    let (took, calls) = cluster.run(async {
        let began = Instant::now();
        let mut model: Vec<Vec<u8>> = Vec::new();
        let mut calls = 0u32;
        for step in 0..80u64 {
            let r = mix2(seed, step);
            if !model.is_empty() || r % 6 < 2 {
                calls += 1;
            }
            match r % 6 {
                0 | 1 => {
                    let rows: Vec<Vec<u8>> = (0..1 + r % 40).map(|k| row(r ^ k)).collect();
                    let records: Vec<Record> =
                        rows.iter().map(|r| Record::new().with("data", r)).collect();
                    let range = client.append_many(&records).await.unwrap();
                    assert_eq!(range.start, model.len() as u64);
                    model.extend(rows);
                }
                2 if !model.is_empty() => {
                    let i = mix2(r, 2) % model.len() as u64;
                    let new = row(r);
                    client
                        .modify(i, &Record::new().with("data", &new))
                        .await
                        .unwrap();
                    model[i as usize] = new;
                }
                3 if !model.is_empty() => {
                    let i = mix2(r, 3) % model.len() as u64;
                    client.delete(i).await.unwrap();
                    model.swap_remove(i as usize);
                }
                _ if !model.is_empty() => {
                    let indices: Vec<u64> = (0..1 + r % 50)
                        .map(|k| mix2(r, k) % model.len() as u64)
                        .collect();
                    let columns = client.gather(&indices, &[]).await.unwrap();
                    for (pos, &i) in indices.iter().enumerate() {
                        assert!(
                            columns[0].get(pos).unwrap() == &model[i as usize][..],
                            "seed {seed}: record {i} differs"
                        );
                    }
                    for &byte in &columns[0].data {
                        gathered = mix2(gathered, byte.into());
                    }
                }
                _ => {}
            }
        }
        client.commit().await.unwrap();
        assert_eq!(client.len().await.unwrap(), model.len() as u64);
        (began.elapsed(), calls + 2)
    });
    // Every call waits for some node's reply, and every node's datagrams leave at least
    // 1 ms late on the cluster's clock.
    assert!(
        took >= Duration::from_millis(calls.into()),
        "{took:?} for {calls} calls"
    );
    Transcript {
        gathered,
        lost: (0..3).map(|shard| cluster.datagrams_lost(shard)).collect(),
        took,
    }
}

/// A partitioned node, and then a stalled one, fail the requests already waiting on them
/// once the router's heartbeats find them down — on the cluster's clock, before its 8 s
/// timeout (under the transport's idle timeout) runs out, taking no real time — and serve
/// again once healed.
#[test]
fn a_partition_times_out_on_the_clusters_clock() {
    let timeout = Duration::from_secs(8);
    let mut cluster = start(7, timeout.as_millis() as u64);
    let client = cluster.async_client().unwrap();
    cluster.run(async {
        let records: Vec<Vec<u8>> = (0..30).map(row).collect();
        let batch: Vec<Record> = records
            .iter()
            .map(|r| Record::new().with("data", r))
            .collect();
        client.append_many(&batch).await.unwrap();
        client.commit().await.unwrap();
    });
    cluster
        .set_faults(
            1,
            Faults {
                partitioned: true,
                ..Faults::default()
            },
        )
        .unwrap();
    let all: Vec<u64> = (0..30).collect();
    fails_when_found_down(&cluster, &client, &all, 1, timeout);
    cluster.set_faults(1, Faults::default()).unwrap();
    let columns = cluster
        .run(async { client.gather(&all, &[]).await })
        .unwrap();
    assert_eq!(columns[0].get(29).unwrap(), &row(29)[..]);

    // A node that takes requests and never answers: the same wait, then the same error.
    cluster.stall_node(2).unwrap();
    fails_when_found_down(&cluster, &client, &all, 2, timeout);
    cluster.start_node(2).unwrap();
    let columns = cluster
        .run(async { client.gather(&all, &[]).await })
        .unwrap();
    assert_eq!(columns[0].get(0).unwrap(), &row(0)[..]);
}

/// A gather of `indices` fails naming `shard` once its heartbeats find it down, before
/// `timeout` has run out on the cluster's clock.
fn fails_when_found_down(
    cluster: &SimCluster,
    client: &AsyncClient,
    indices: &[u64],
    shard: u32,
    timeout: Duration,
) {
    let real = std::time::Instant::now();
    let (failed, waited) = cluster.run(async {
        let began = Instant::now();
        let failed = client.gather(indices, &[]).await.unwrap_err().to_string();
        (failed, began.elapsed())
    });
    // Not a measure of speed: a clock that is not virtual would take seconds.
    let real = real.elapsed();
    assert!(
        real < timeout / 2,
        "{real:?} of real time: the clock is not virtual"
    );
    assert!(
        failed.contains(&format!("shard {shard}")) && failed.contains("found it down"),
        "{failed}"
    );
    assert!(
        waited < timeout,
        "failed after {waited:?} of the cluster's clock, the whole timeout: {failed}"
    );
}

/// A node that dies is known down within about two seconds on the cluster's clock, long
/// before the router's timeout: a gather that needs it then fails at once, naming the shard
/// and since when; one that does not is served; once the node is back, it serves again.
#[test]
fn a_dead_node_is_known_down_long_before_the_timeout() {
    let timeout = Duration::from_secs(8);
    let mut cluster = start(11, timeout.as_millis() as u64);
    let client = cluster.async_client().unwrap();
    let rows: Vec<Vec<u8>> = (0..30).map(row).collect();
    cluster.run(async {
        let batch: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
        client.append_many(&batch).await.unwrap();
        client.commit().await.unwrap();
    });
    let placement = cluster.config().placement().unwrap();
    let (on1, others): (Vec<u64>, Vec<u64>) = (0..30).partition(|&i| placement.locate(i).0 == 1);
    cluster.crash_node(1);
    let (failed, waited) = cluster.run(async {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let began = Instant::now();
        let failed = client.gather(&on1, &[]).await.unwrap_err().to_string();
        (failed, began.elapsed())
    });
    assert!(
        failed.contains("shard 1") && failed.contains("down since"),
        "{failed}"
    );
    assert!(
        waited < Duration::from_secs(1),
        "failed after {waited:?} of the cluster's clock, not at once: {failed}"
    );
    let columns = cluster
        .run(async { client.gather(&others, &[]).await })
        .unwrap();
    for (pos, &i) in others.iter().enumerate() {
        assert_eq!(columns[0].get(pos).unwrap(), &rows[i as usize][..]);
    }
    let status = cluster.run(async { client.status().await }).unwrap();
    assert!(status.nodes[1].state.contains("down since"), "{status:?}");
    // Its liveness lease in the metadata store lapses too; the others' are renewed.
    let status = cluster.run(async {
        tokio::time::sleep(zr_meta::nodes::LEASE + Duration::from_secs(1)).await;
        client.status().await
    });
    let status = status.unwrap();
    assert!(status.nodes[1].lease.contains("lapsed"), "{status:?}");
    assert!(status.nodes[0].lease.contains("renewed"), "{status:?}");

    cluster.start_node(1).unwrap();
    let all: Vec<u64> = (0..30).collect();
    let columns = cluster
        .run(async { client.gather(&all, &[]).await })
        .unwrap();
    assert_eq!(columns[0].get(29).unwrap(), &rows[29][..]);
}

/// A metadata store that takes `latency` of the cluster's clock per call, as one across a
/// network does, so that a router can be stopped between any two of its steps.
#[derive(Debug)]
struct Distant {
    inner: Arc<dyn MetaStore>,
    latency: Duration,
}

impl MetaStore for Distant {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn get(&self, key: &str) -> Call<'_, Option<(String, Revision)>> {
        let key = key.to_string();
        Box::pin(async move {
            tokio::time::sleep(self.latency).await;
            self.inner.get(&key).await
        })
    }

    fn put_if(&self, key: &str, expected: Option<Revision>, value: &str) -> Call<'_, Revision> {
        let (key, value) = (key.to_string(), value.to_string());
        Box::pin(async move {
            tokio::time::sleep(self.latency).await;
            self.inner.put_if(&key, expected, &value).await
        })
    }
}

/// Every record of the cluster through `client`, retrying (a router that has just started
/// waits out the lease of one that died) until a write settles whatever was left behind.
async fn settled_contents(client: &AsyncClient) -> Vec<Vec<u8>> {
    let mut tries = 0;
    loop {
        match client.append_many(&[]).await {
            Ok(_) => break,
            Err(e) => {
                tries += 1;
                assert!(tries < 50, "the cluster did not settle: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let len = client.len().await.unwrap();
    let columns = client
        .gather(&(0..len).collect::<Vec<_>>(), &[])
        .await
        .unwrap();
    (0..len as usize)
        .map(|k| columns[0].get(k).unwrap_or_default().to_vec())
        .collect()
}

/// A router killed at every step of an append and of a delete — its metadata calls and its
/// node calls, each in turn: killed at every 200 µs of the write on the cluster's clock,
/// where each call takes at least a millisecond — and then another router: the cluster
/// holds the state before the write or the whole write, never part of it, and a write that
/// was acknowledged is there.
#[test]
fn a_router_killed_at_every_step_of_a_write_leaves_none_or_all_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = zr_meta::EmbeddedStore::open(dir.path()).unwrap().inline();
    let meta: Arc<dyn MetaStore> = Arc::new(Distant {
        inner: Arc::new(embedded),
        latency: Duration::from_millis(1),
    });
    let mut cluster = SimCluster::start(
        3,
        SimOptions {
            extent_records: 3,
            timeout_ms: 500,
            seed: 5,
            virtual_time: true,
            metadata: Some(meta),
            ..SimOptions::default()
        },
    )
    .unwrap();
    // Each node's replies a little slower than the one before, so that the router hears
    // them in turn and can be killed between any two.
    for shard in 0..3u32 {
        let slow = Faults {
            delay: Duration::from_millis(1 + 2 * shard as u64),
            ..Faults::default()
        };
        cluster.set_faults(shard, slow).unwrap();
    }
    let mut model: Vec<Vec<u8>> = (0..40).map(row).collect();
    let first = cluster.async_client().unwrap();
    cluster.run(async {
        let batch: Vec<Record> = model
            .iter()
            .map(|r| Record::new().with("data", r))
            .collect();
        first.append_many(&batch).await.unwrap();
        first.commit().await.unwrap();
    });
    drop(first);
    cluster.stop_router(0).unwrap();

    let (mut kills, mut partial) = (0, 0);
    for delete in [false, true] {
        let mut at = Duration::ZERO;
        loop {
            let len = model.len() as u64;
            let mut after = model.clone();
            let rows: Vec<Vec<u8>> = (0..7).map(|k| row(1000 + len + k)).collect();
            if delete {
                after.swap_remove(5);
            } else {
                after.extend(rows.iter().cloned());
            }
            // A router that is killed `at` into the write.
            let addr = cluster.add_router().unwrap();
            let client = cluster.async_client_of(addr).unwrap();
            let outcome = cluster.run(async {
                // Long enough for the router to have given back the lease its start took.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let write = async {
                    if delete {
                        client.delete(5).await
                    } else {
                        let records: Vec<Record> =
                            rows.iter().map(|r| Record::new().with("data", r)).collect();
                        client.append_many(&records).await.map(|_| ())
                    }
                };
                tokio::select! {
                    biased;
                    done = write => Some(done),
                    _ = tokio::time::sleep(at) => None,
                }
            });
            let index = cluster.router_addrs().len() - 1;
            cluster.kill_router(index);
            drop(client);
            // Another router, which waits out the dead one's lease and settles its write.
            let addr = cluster.add_router().unwrap();
            let client = cluster.async_client_of(addr).unwrap();
            let held = cluster.run(settled_contents(&client));
            drop(client);
            cluster
                .stop_router(cluster.router_addrs().len() - 1)
                .unwrap();
            match &outcome {
                Some(Ok(())) => assert!(held == after, "an acknowledged write is not all there"),
                _ => assert!(
                    held == model || held == after,
                    "killed {at:?} into a {}: {} records, {len} before, {} had it landed",
                    if delete { "delete" } else { "append" },
                    held.len(),
                    after.len()
                ),
            }
            let done = outcome.is_some();
            if !done {
                kills += 1;
                partial += usize::from(held != model);
            }
            model = held;
            if done {
                // The write was done before the kill: every step has been tried.
                break;
            }
            at += Duration::from_micros(200);
        }
    }
    eprintln!("{kills} kills mid-write; {partial} left the whole write, the others none");
    assert!(kills >= 10, "only {kills} kills: the writes took no time");
}

/// Gathers and appends interleaved with every step of a move (add a shard, then drain one),
/// on virtual time with per-node delays drawn from the seed, so that each seed orders the
/// move's copies, its switch (map published, each node swapped, each router adopting the
/// map) and the clients' requests differently: every gather is byte-exact against the
/// model and none fails — a client sees a move only as latency. A gather planned by one map
/// and sent after the router adopted the next once paired the old local indices with the
/// new version (an out-of-range refusal, or records from the wrong place).
#[test]
fn gathers_and_appends_interleaved_with_moves_never_fail_or_differ() {
    let first = zr_sim::SimOptions::default().seed;
    for k in 0..8u64 {
        let seed = first.wrapping_add(k);
        eprintln!("seed {seed} (ZR_SIM_SEED={seed} replays the first of these runs)");
        interleaved_move_run(seed);
    }
}

fn interleaved_move_run(seed: u64) {
    let mut cluster = SimCluster::start(
        2,
        SimOptions {
            extent_records: 4,
            timeout_ms: 5_000,
            seed,
            virtual_time: true,
            ..SimOptions::default()
        },
    )
    .unwrap();
    let added = cluster.add_shard_nodes().unwrap();
    for shard in 0..=added {
        let faults = Faults {
            loss: 0.0,
            delay: Duration::from_micros(200 + mix2(seed, shard.into()) % 3_000),
            partitioned: false,
        };
        cluster.set_faults(shard, faults).unwrap();
    }
    let listed = cluster.listed_nodes();
    let (client, mover) = (
        cluster.async_client().unwrap(),
        cluster.async_client().unwrap(),
    );
    let model: Arc<std::sync::Mutex<Vec<Vec<u8>>>> = Arc::default();
    let moved = std::sync::atomic::AtomicBool::new(false);
    cluster.run(async {
        let rows: Vec<Vec<u8>> = (0..600).map(|k| row(mix2(seed, k))).collect();
        let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
        client.append_many(&records).await.unwrap();
        client.commit().await.unwrap();
        model.lock().unwrap().extend(rows);
        let moving = async {
            for change in [
                zr_proto::wire::MapChange::AddShard,
                zr_proto::wire::MapChange::DrainShard(0),
            ] {
                let nodes = listed.iter().map(|&(s, r, a)| (s, r, a)).collect();
                mover.move_shards(change, nodes).await.unwrap();
                loop {
                    let report = mover.move_progress().await.unwrap().unwrap();
                    assert!(report.error.is_none(), "seed {seed}: {report:?}");
                    if report.done {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(mix2(seed, 7) % 20 + 1)).await;
                }
            }
            moved.store(true, std::sync::atomic::Ordering::SeqCst);
        };
        let working = async {
            let mut step = 0u64;
            // Each call runs to its end: a dropped append would still land.
            while !moved.load(std::sync::atomic::Ordering::SeqCst) {
                step += 1;
                let r = mix2(seed ^ 0x5eed, step);
                if r.is_multiple_of(5) {
                    let new: Vec<Vec<u8>> = (0..1 + r % 7).map(|j| row(mix2(r, j))).collect();
                    let records: Vec<Record> =
                        new.iter().map(|r| Record::new().with("data", r)).collect();
                    let range = client.append_many(&records).await.unwrap();
                    let mut model = model.lock().unwrap();
                    assert_eq!(range.start, model.len() as u64, "seed {seed}");
                    model.extend(new);
                } else {
                    let len = model.lock().unwrap().len() as u64;
                    let indices: Vec<u64> = (0..1 + r % 64).map(|j| mix2(r, j) % len).collect();
                    let columns = client.gather(&indices, &[]).await.unwrap_or_else(|e| {
                        panic!("seed {seed}: a gather during the move failed: {e}")
                    });
                    let model = model.lock().unwrap();
                    for (pos, &i) in indices.iter().enumerate() {
                        assert!(
                            columns[0].get(pos).unwrap() == &model[i as usize][..],
                            "seed {seed}: record {i} differs during the move"
                        );
                    }
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::join!(moving, working);
        client.commit().await.unwrap();
        let model = model.lock().unwrap().clone();
        assert_eq!(client.len().await.unwrap(), model.len() as u64);
        let all: Vec<u64> = (0..model.len() as u64).collect();
        let columns = client.gather(&all, &[]).await.unwrap();
        for (i, want) in model.iter().enumerate() {
            assert!(
                columns[0].get(i).unwrap() == &want[..],
                "seed {seed}: record {i}"
            );
        }
    });
}

/// A client asking for the length while the router writes (a load whose first shard answers
/// slowly) is answered before the write in flight is done, with the length before it: a
/// load on a busy host made `len` outlast a client's timeout.
#[test]
fn the_length_is_answered_during_a_write() {
    let cluster = start(zr_sim::SimOptions::default().seed, 5_000);
    let (writer, reader) = (
        cluster.async_client().unwrap(),
        cluster.async_client().unwrap(),
    );
    let rows: Vec<Vec<u8>> = (0..60).map(row).collect();
    let records = |from: usize| -> Vec<Record> {
        rows[from..from + 30]
            .iter()
            .map(|r| Record::new().with("data", r))
            .collect()
    };
    cluster.run(async {
        writer.append_many(&records(0)).await.unwrap();
        // Below the heartbeats' deadline: the node stays up, only slow.
        let slow = Faults {
            delay: Duration::from_millis(500),
            ..Faults::default()
        };
        cluster.set_faults(0, slow).unwrap();
        let more = records(30);
        let load = async {
            let loaded = writer.append_many(&more).await;
            (loaded, Instant::now())
        };
        let ask = async {
            // The append under way (within the lease's linger, so the router keeps it).
            tokio::time::sleep(Duration::from_millis(5)).await;
            let len = reader.len().await.unwrap();
            (len, Instant::now())
        };
        let ((loaded, loaded_at), (len, answered_at)) = tokio::join!(load, ask);
        assert_eq!(loaded.unwrap(), 30..60);
        assert_eq!(len, 30, "the length before the write in flight");
        assert!(
            answered_at < loaded_at,
            "the length was answered once the write was done"
        );
        assert_eq!(reader.len().await.unwrap(), 60);
    });
}
