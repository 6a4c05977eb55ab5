//! A secured cluster under failure and attack, through the simulator: dead and stalled nodes
//! fail only the requests that need them, within the timeout and naming the shard; nobody
//! without the right certificate gets in; garbage on the wire is refused without disturbing a
//! client that keeps gathering.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zr_common::hash::mix2;
use zr_common::Record;
use zr_meta::writer::{self, WriterRecord};
use zr_net::tls::{self, Role};
use zr_net::{self as net, Security};
use zr_proto::wire::{self, ClientRequest, ErrorCode, NodeMessage, NodeRequest, Reply};
use zr_router::Client;
use zr_sim::{Faults, SimCluster, SimOptions};

const TIMEOUT_MS: u64 = 800;
const RECORDS: u64 = 400;

fn payload(i: u64) -> Vec<u8> {
    format!("record {i} ")
        .repeat(1 + (mix2(i, 7) % 30) as usize)
        .into_bytes()
}

/// A 4-shard cluster holding RECORDS committed records.
fn loaded_cluster() -> SimCluster {
    loaded_cluster_of(4, TIMEOUT_MS)
}

/// A cluster of `shards` shards, every wait `timeout_ms`, holding RECORDS committed records,
/// on virtual time: its waits take no real time, and a seed replays it.
fn loaded_cluster_of(shards: u32, timeout_ms: u64) -> SimCluster {
    loaded(shards, timeout_ms, true)
}

/// [`loaded_cluster`] on real time, for a test whose point is clients connecting over real
/// sockets from runtimes of their own (which a cluster on virtual time does not serve: it
/// runs only while its own runtime is driven).
fn loaded_cluster_on_real_time() -> SimCluster {
    loaded(4, TIMEOUT_MS, false)
}

/// An empty cluster of `shards` shards, every wait `timeout_ms`, extents of 4 records.
fn empty(shards: u32, timeout_ms: u64, virtual_time: bool) -> SimCluster {
    let options = SimOptions {
        extent_records: 4,
        timeout_ms,
        virtual_time,
        ..SimOptions::default()
    };
    SimCluster::start(shards, options).unwrap()
}

fn loaded(shards: u32, timeout_ms: u64, virtual_time: bool) -> SimCluster {
    let cluster = empty(shards, timeout_ms, virtual_time);
    let client = cluster.client().unwrap();
    let rows: Vec<Vec<u8>> = (0..RECORDS).map(payload).collect();
    let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
    client.append_many(&records).unwrap();
    client.commit().unwrap();
    cluster
}

/// Indices held by `shard`, and indices held by any other shard.
fn split_by_shard(cluster: &SimCluster, shard: u32) -> (Vec<u64>, Vec<u64>) {
    let placement = cluster.config().placement().unwrap();
    (0..RECORDS).partition(|&i| placement.locate(i).0 == shard)
}

fn check(client: &Client, indices: &[u64]) {
    zr_tests::check_first(client, indices, payload);
}

/// Gathers `indices`, expecting a failure that names `shard` and its address, well within a
/// bound that only a hang would break.
fn expect_unavailable(
    cluster: &SimCluster,
    client: &Client,
    shard: u32,
    indices: &[u64],
) -> String {
    let started = Instant::now();
    let err = client.gather(indices, &[]).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a gather waited {:?} for a dead node",
        started.elapsed()
    );
    let addr = cluster.config().shard(shard).unwrap().addr;
    let text = err.to_string();
    assert!(
        text.contains(&format!("shard {shard}")) && text.contains(&addr.to_string()),
        "{text}"
    );
    assert!(err.code() == Some(ErrorCode::Unavailable), "{err:?}");
    text
}

#[test]
fn a_stopped_node_fails_only_the_gathers_that_need_it() {
    let mut cluster = loaded_cluster();
    let client = cluster.client().unwrap();
    let (on_two, elsewhere) = split_by_shard(&cluster, 2);
    assert!(!on_two.is_empty() && !elsewhere.is_empty());

    cluster.stop_node(2).unwrap();
    expect_unavailable(&cluster, &client, 2, &on_two[..3]);
    // A batch mixing shards is refused whole, never passed off partially.
    expect_unavailable(&cluster, &client, 2, &[elsewhere[0], on_two[0]]);
    check(&client, &elsewhere);

    cluster.start_node(2).unwrap();
    wait_node_up(&cluster, &client, 2);
    let all: Vec<u64> = (0..RECORDS).collect();
    check(&client, &all);
}

#[test]
fn a_stalled_node_is_detected_by_the_timeout() {
    let mut cluster = loaded_cluster();
    let client = cluster.client().unwrap();
    let (on_one, elsewhere) = split_by_shard(&cluster, 1);

    cluster.stall_node(1).unwrap();
    let text = expect_unavailable(&cluster, &client, 1, &on_one);
    // The call's own timeout, as a rule; on a slow machine the heartbeats (750 ms each, two
    // failing) may find the node down first, which fails the call as well.
    assert!(
        text.contains(&format!("{TIMEOUT_MS} ms")) || text.contains("down"),
        "{text}"
    );
    check(&client, &elsewhere);

    cluster.start_node(1).unwrap();
    wait_node_up(&cluster, &client, 1);
    check(&client, &on_one);
}

/// With one replica and a long timeout, calls already waiting on a node that stops
/// answering (a `kill -9` as its peers see it: no close, no reply) fail once its heartbeats
/// find it down — naming the shard — not at the end of the 20 s timeout; an `info` answers
/// from what is known; the other shards serve throughout.
#[test]
fn calls_waiting_on_a_node_found_down_fail_then_not_at_the_timeout() {
    let mut cluster = loaded_cluster_of(3, 20_000);
    let client = cluster.client().unwrap();
    let (on_one, elsewhere) = split_by_shard(&cluster, 1);
    let waiter = cluster.client().unwrap();
    cluster.stall_node(1).unwrap();
    let started = Instant::now();
    let gather = std::thread::spawn(move || waiter.gather(&on_one, &[]));
    let err = gather.join().unwrap().unwrap_err();
    let waited = started.elapsed();
    let text = err.to_string();
    // Found down while the call waited, as a rule; on a slow machine the heartbeats may
    // have found it down before the call began, which fails it at once (the path taken
    // while waiting is tested on virtual time, where its timing is exact).
    assert!(
        text.contains("shard 1") && (text.contains("found it down") || text.contains("down since")),
        "{text}"
    );
    // Well before the timeout: a bound only waiting for the timeout would break.
    assert!(
        waited < Duration::from_secs(15),
        "the gather waited {waited:?}"
    );
    let started = Instant::now();
    assert_eq!(
        client.len().unwrap(),
        RECORDS,
        "info answers from what is known"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "info waited {:?}",
        started.elapsed()
    );
    check(&client, &elsewhere);
    cluster.start_node(1).unwrap();
    wait_node_up(&cluster, &client, 1);
    let all: Vec<u64> = (0..RECORDS).collect();
    check(&client, &all);
}

/// Copies `from`'s CA and `as_role`'s files under `claimed`'s file names: a peer presenting
/// a genuine cluster certificate for the wrong role.
fn impersonate(from: &Path, to: &Path, as_role: Role, claimed: Role) {
    std::fs::create_dir_all(to).unwrap();
    let from = tls::role_dir(from, as_role);
    std::fs::copy(from.join(tls::CA_FILE), to.join(tls::CA_FILE)).unwrap();
    for ext in ["pem", "key"] {
        std::fs::copy(
            from.join(format!("{}.{ext}", as_role.name())),
            to.join(format!("{}.{ext}", claimed.name())),
        )
        .unwrap();
    }
}

/// One raw request to `addr` as `security`: the connection error or the reply's bytes.
fn raw_call(
    cluster: &SimCluster,
    security: &Security,
    addr: SocketAddr,
    message: Vec<u8>,
) -> Result<Vec<u8>, String> {
    cluster.run(async {
        let endpoint = net::client_endpoint(addr).unwrap();
        let timeout = Duration::from_secs(5);
        let connection = net::connect(&endpoint, security, addr, timeout)
            .await
            .map_err(|e| e.to_string())?;
        net::call(&connection, message, Vec::new(), timeout)
            .await
            .map_err(|e| e.to_string())
    })
}

#[test]
fn only_the_right_certificates_get_in() {
    let cluster = loaded_cluster_on_real_time();
    let certs = cluster.certs_dir().unwrap();
    let router = cluster.router_addr();
    let node = cluster.config().shard(0).unwrap().addr;
    let timeout = Duration::from_secs(3);
    let scratch = tempfile::tempdir().unwrap();

    // A client without a certificate.
    let err = Client::connect_with_timeout(router, Security::InsecureDev, timeout)
        .unwrap_err()
        .to_string();
    assert!(err.contains("presented none"), "{err}");

    // A client whose certificates come from another cluster's CA.
    let other = scratch.path().join("other");
    tls::init_certs(&other, tls::CERT_VALID_DAYS).unwrap();
    let err = Client::connect_with_timeout(
        router,
        Security::load(&other, Role::Writer).unwrap(),
        timeout,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("not from this cluster's CA"), "{err}");

    // A client pointed at a wrong address.
    let nobody: SocketAddr = {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap()
    };
    let err = Client::connect_with_timeout(
        nobody,
        Security::load(&certs, Role::Writer).unwrap(),
        Duration::from_millis(500),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains(&format!("no answer from {nobody}")), "{err}");

    // A genuine client certificate passed off as a router's is refused before it is used
    // (a process refuses to start on another role's certificate).
    let rogue = scratch.path().join("rogue");
    impersonate(&certs, &rogue, Role::Writer, Role::Router);
    let info = wire::encode_request(&NodeMessage::unchecked(NodeRequest::Info)).unwrap();
    let err = Security::load(&rogue, Role::Router)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("router.pem")
            && err.contains("is a writer certificate, not a router certificate"),
        "{err}"
    );
    // ... and a router certificate gets in.
    let reply = raw_call(
        &cluster,
        &Security::load(&certs, Role::Router).unwrap(),
        node,
        info,
    )
    .unwrap();
    assert!(matches!(
        wire::decode_reply(&reply).unwrap().0,
        Reply::Info { .. }
    ));

    // The cluster still serves its own client.
    let client = cluster.client().unwrap();
    check(&client, &[0, RECORDS - 1]);
}

/// Hostile messages: garbage, truncations, lies about lengths, other versions, requests of
/// the other protocol; `good` is a valid gather request of the target's protocol.
fn hostile_messages(good: Vec<u8>) -> Vec<Vec<u8>> {
    let mut messages: Vec<Vec<u8>> = (0..good.len())
        .step_by(3)
        .map(|n| good[..n].to_vec())
        .collect();
    messages.push((0..200u64).map(|k| mix2(5, k) as u8).collect());
    let mut huge = good.clone();
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    messages.push(huge);
    let mut version = good.clone();
    version[4] = 77;
    messages.push(version);
    let mut kind = good.clone();
    kind[6] = 9;
    messages.push(kind);
    let mut count = good;
    count[16..24].copy_from_slice(&(1u64 << 58).to_le_bytes());
    messages.push(count);
    messages
}

#[test]
fn garbage_is_refused_while_a_client_keeps_gathering() {
    let cluster = loaded_cluster();
    let certs = cluster.certs_dir().unwrap();
    let client = cluster.client().unwrap();
    let (indices, fields) = (vec![1, 2, 3], vec![]);
    let node_gather = wire::encode_request(&NodeMessage::unchecked(NodeRequest::Gather {
        indices: indices.clone(),
        fields: fields.clone(),
        checked: false,
    }))
    .unwrap();
    let client_gather = wire::encode_client_request(
        None,
        &ClientRequest::Gather {
            indices,
            fields,
            checked: false,
        },
    )
    .unwrap();
    let targets = [
        (
            Security::load(&certs, Role::Router).unwrap(),
            cluster.config().shard(1).unwrap().addr,
            node_gather.clone(),
            client_gather.clone(),
        ),
        (
            Security::load(&certs, Role::Writer).unwrap(),
            cluster.router_addr(),
            client_gather,
            node_gather,
        ),
    ];
    for (security, addr, good, other_protocol) in &targets {
        let mut messages = hostile_messages(good.clone());
        messages.push(other_protocol.clone());
        for (n, message) in messages.into_iter().enumerate() {
            let is_message = wire::is_message(&message);
            match raw_call(&cluster, security, *addr, message) {
                // A zrecord message, however broken, gets an error reply.
                Ok(reply) => {
                    assert!(is_message, "garbage #{n} got a reply");
                    let Reply::Error { code, message } = wire::decode_reply(&reply).unwrap().0
                    else {
                        panic!("hostile message #{n} was accepted");
                    };
                    assert!(
                        matches!(code, ErrorCode::BadRequest | ErrorCode::Version),
                        "{message}"
                    );
                }
                // Anything else loses its connection.
                Err(e) => assert!(!is_message, "message #{n} to {addr}: {e}"),
            }
            let indices: Vec<u64> = (0..32).map(|k| mix2(n as u64, k) % RECORDS).collect();
            check(&client, &indices);
        }
        // Raw datagrams that are not QUIC at all.
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for k in 0..50u64 {
            let junk: Vec<u8> = (0..(mix2(k, 1) % 1400) as usize)
                .map(|i| mix2(k, i as u64) as u8)
                .collect();
            let _ = socket.send_to(&junk, addr);
        }
        check(&client, &[0, 1, RECORDS - 1]);
    }
}

#[test]
fn an_insecure_dev_cluster_works_and_refuses_certificate_clients() {
    let cluster = SimCluster::start(
        2,
        SimOptions {
            secure: false,
            ..SimOptions::default()
        },
    )
    .unwrap();
    assert!(cluster.certs_dir().is_none());
    let client = cluster.client().unwrap();
    let rows: Vec<Vec<u8>> = (0..50).map(payload).collect();
    let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
    assert_eq!(client.append_many(&records).unwrap(), 0..50);
    let columns = client.gather(&[49, 0], &[]).unwrap();
    assert_eq!(columns[0].get(0).unwrap(), &rows[49][..]);
    // A client holding real certificates will not trust a throwaway one.
    let certs = tempfile::tempdir().unwrap();
    tls::init_certs(certs.path(), tls::CERT_VALID_DAYS).unwrap();
    let err = Client::connect_with_timeout(
        cluster.router_addr(),
        Security::load(certs.path(), Role::Writer).unwrap(),
        Duration::from_secs(3),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("not from this cluster's CA"), "{err}");
}

/// An impostor for a shard whose gather replies announce `record_len` bytes a record and then
/// break that promise as `fault` says: (bytes more or fewer than announced, abandon the stream
/// instead of finishing it).
async fn break_gathers(
    request: Vec<u8>,
    (record_len, extra, abandon): (u32, i64, bool),
) -> (Vec<u8>, net::Body) {
    let Ok((
        NodeMessage {
            request: NodeRequest::Gather { indices, .. },
            ..
        },
        _,
    )) = wire::decode_request::<NodeMessage>(&request)
    else {
        // The router's heartbeats: any answer will do.
        return refusal(ErrorCode::BadRequest, "this impostor answers only gathers");
    };
    let lengths = vec![vec![record_len; indices.len()]];
    let header = wire::encode_reply(&Reply::Gather { lengths }).unwrap();
    let announced = (record_len as i64 * indices.len() as i64).min(1 << 20);
    let body = vec![bytes::Bytes::from(vec![
        7u8;
        (announced + extra).max(0) as usize
    ])];
    if !abandon {
        return (header, net::Body::Ready(body));
    }
    // The body's producer gives up after its first piece: the stream is reset.
    let (pieces, streamed) = tokio::sync::mpsc::channel(1);
    pieces.send(Some(body)).await.unwrap();
    (header, net::Body::Streamed(streamed))
}

/// A shard whose reply breaks off midway, or runs short or long of what its head announced,
/// fails every gather that needs it — the router forwards replies as they arrive, so it
/// resets the client's stream rather than finish a batch it cannot complete — and the
/// client's other gathers go on.
#[test]
fn a_reply_broken_midway_fails_the_whole_gather() {
    let mut cluster = loaded_cluster();
    let client = cluster.client().unwrap();
    let (on_three, elsewhere) = split_by_shard(&cluster, 3);
    let mixed = [elsewhere[0], on_three[0], elsewhere[1], on_three[1]];
    // Cut off and abandoned, short, long, abandoned at the end, and announcing more than any
    // message may hold (4 GiB a record).
    let faults = [
        (1000, -500, true),
        (1000, -500, false),
        (1000, 10, false),
        (1000, 0, true),
        (u32::MAX, 0, false),
    ];
    for fault in faults {
        cluster
            .fake_node(3, move |request| break_gathers(request, fault))
            .unwrap();
        for indices in [&mixed[..], &on_three[..]] {
            let err = client.gather(indices, &[]).unwrap_err().to_string();
            assert!(
                err.contains("abandoned the reply midway") || err.contains("shard 3"),
                "{fault:?}: {err}"
            );
            // An impossible length is refused before anything is forwarded.
            if fault.0 == u32::MAX {
                assert!(err.contains("over the limit"), "{err}");
            }
        }
        check(&client, &elsewhere);
        cluster.start_node(3).unwrap();
        wait_node_up(&cluster, &client, 3);
        check(&client, &mixed);
    }
}

/// Waits until no router holds the cluster's write lease (the cluster's router gives its own
/// back 50 ms after its last write), up to 10 s.
fn wait_lease_free(cluster: &SimCluster) {
    let meta = cluster.metadata().unwrap();
    let deadline = cluster.now() + Duration::from_secs(10);
    loop {
        let record = cluster.run(async { writer::load(&*meta, writer::WRITER_KEY).await.unwrap() });
        if record.is_none_or(|(r, _)| r.holder.is_none()) {
            return;
        }
        assert!(
            cluster.now() < deadline,
            "the write lease was never given back"
        );
        cluster.pause(Duration::from_millis(10));
    }
}

/// Waits until `client`'s router reports shard `shard`'s node up, up to 10 s: a node just
/// started again may still be down to the router's heartbeats for a moment, and a call
/// that needs it meanwhile fails (after waiting half a second for it).
fn wait_node_up(cluster: &SimCluster, client: &Client, shard: u32) {
    let deadline = cluster.now() + Duration::from_secs(10);
    loop {
        let status = client.status().unwrap();
        if status
            .nodes
            .iter()
            .any(|n| n.shard == shard && n.state == "up")
        {
            return;
        }
        assert!(
            cluster.now() < deadline,
            "shard {shard} never reported up: {status:?}"
        );
        cluster.pause(Duration::from_millis(20));
    }
}

/// Waits until `status` (a router's) reports shard `shard`'s node down, up to 10 s.
fn wait_node_down(
    cluster: &SimCluster,
    mut status: impl FnMut() -> zr_proto::wire::ClusterStatus,
    shard: u32,
) {
    let deadline = cluster.now() + Duration::from_secs(10);
    loop {
        if status()
            .nodes
            .iter()
            // Found down by its heartbeats (not merely failing one call).
            .any(|n| n.shard == shard && n.state.contains("down since"))
        {
            return;
        }
        assert!(
            cluster.now() < deadline,
            "shard {shard} never reported down"
        );
        cluster.pause(Duration::from_millis(20));
    }
}

/// Writes the writer record as a router named 7 would that took the lease for `lease_ms`
/// (and then was never heard from again); returns its token.
fn take_lease_as_another_router(cluster: &SimCluster, lease_ms: u64) -> u64 {
    let meta = cluster.metadata().unwrap();
    cluster.run(async {
        let expected = writer::load(&*meta, writer::WRITER_KEY)
            .await
            .unwrap()
            .map(|(_, r)| r);
        let held = WriterRecord {
            holder: Some(7),
            lease_ms,
            pending: None,
        };
        writer::store(&*meta, writer::WRITER_KEY, expected, &held)
            .await
            .unwrap()
    })
}

/// A router that dies holding the cluster's write lease holds up other routers' writes
/// until the lease runs out, and no longer: meanwhile writes fail with a clear Conflict
/// (reads go on), afterwards they succeed. On virtual time: the lease's two seconds take
/// none.
#[test]
fn a_write_lease_left_behind_runs_out() {
    let cluster = empty(4, TIMEOUT_MS, true);
    let client = cluster.async_client().unwrap();
    let meta = cluster.metadata().unwrap();
    let lease_ms = 2_000;
    cluster.run(async {
        let rows: Vec<Vec<u8>> = (0..RECORDS).map(payload).collect();
        let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
        client.append_many(&records).await.unwrap();
        client.commit().await.unwrap();
        // The router gives its own lease back once idle.
        loop {
            let record = writer::load(&*meta, writer::WRITER_KEY).await.unwrap();
            if record.is_none_or(|(r, _)| r.holder.is_none()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    take_lease_as_another_router(&cluster, lease_ms);
    let record = payload(RECORDS);
    cluster.run(async {
        let taken = tokio::time::Instant::now();
        let err = client
            .append(&Record::new().with("data", &record))
            .await
            .unwrap_err();
        assert!(
            err.code() == Some(ErrorCode::Conflict)
                && err
                    .to_string()
                    .contains("router 0000000000000007 holds the write lease"),
            "{err}"
        );
        let columns = client.gather(&[0, 1, 2, 3], &[]).await.unwrap();
        assert_eq!(columns[0].get(3).unwrap(), &payload(3)[..]);
        // Once the lease has run out, writes go through again.
        tokio::time::sleep_until(taken + Duration::from_millis(lease_ms + 100)).await;
        let appended = client
            .append(&Record::new().with("data", &record))
            .await
            .unwrap();
        assert_eq!(appended, RECORDS);
        let columns = client.gather(&[RECORDS, 0], &[]).await.unwrap();
        assert_eq!(columns[0].get(0).unwrap(), &record[..]);
        assert_eq!(columns[0].get(1).unwrap(), &payload(0)[..]);
    });
}

/// A router killed as `kill -9` would runs nothing more, even while a caller still holds
/// it: the write lease it held stays recorded as its until it lapses (no task of its gives
/// it back after its idle 50 ms, as a stopped router's would), the move it ran goes no
/// further (no task of its copies or publishes), its heartbeats stop, and another router
/// writes once the lease has lapsed.
#[test]
fn a_killed_router_gives_nothing_back() {
    let mut cluster = empty(2, TIMEOUT_MS, true);
    let other = cluster.add_router().unwrap();
    cluster.add_shard_nodes().unwrap();
    let meta = cluster.metadata().unwrap();
    let client = cluster.async_client().unwrap();
    let listed = cluster.listed_nodes();
    cluster.run(async {
        let rows: Vec<Vec<u8>> = (0..RECORDS).map(|i| vec![i as u8; 4096]).collect();
        let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
        client.append_many(&records).await.unwrap();
        client.commit().await.unwrap();
        // A slow move: files copied at 16 KiB a second.
        client
            .move_shards_at(wire::MapChange::AddShard, listed, Some(16 << 10))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let report = client.move_progress().await.unwrap().expect("a move");
        assert!(!report.done && report.error.is_none(), "{report:?}");
        // Appends go on while records are copied, and take the lease.
        let last = vec![7; 4096];
        client
            .append(&Record::new().with("data", &last))
            .await
            .unwrap();
    });
    drop(client);
    let load = |cluster: &SimCluster| {
        let writer = cluster.run(async { writer::load(&*meta, writer::WRITER_KEY).await.unwrap() });
        let record = cluster.run(async { zr_meta::cluster::load(&*meta).await.unwrap() });
        let record = record.expect("a cluster record").0;
        (
            writer.and_then(|(w, _)| w.holder),
            record.map.version,
            record.moving,
        )
    };
    let (holder, version, moving) = load(&cluster);
    assert!(
        holder.is_some() && moving.is_some(),
        "the move holds the lease"
    );
    // Held past its kill, as a caller may: it still runs nothing.
    let killed = cluster.router(0).expect("router 0");
    cluster.kill_router(0);
    let beats = killed.heartbeats();
    // Long enough for the move to have ended, had it gone on.
    cluster.pause(Duration::from_secs(120));
    assert_eq!(
        killed.heartbeats(),
        beats,
        "a killed router's heartbeats went on"
    );
    let (after, version_after, moving_after) = load(&cluster);
    assert_eq!(after, holder, "a killed router gave its lease back");
    assert_eq!(version_after, version, "a killed router's move went on");
    assert_eq!(moving_after, moving, "a killed router's move went on");
    // Lapsed (four timeouts unchanged, by the other router's count): it takes it and writes.
    let client = cluster.async_client_of(other).unwrap();
    cluster.run(async {
        let payload = payload(1);
        let row = Record::new().with("data", &payload);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let appended = loop {
            match client.append(&row).await {
                Ok(index) => break index,
                Err(e) if e.code() == Some(ErrorCode::Conflict) => {
                    assert!(tokio::time::Instant::now() < deadline, "{e}");
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(appended, RECORDS + 1);
    });
    assert_ne!(load(&cluster).0, holder);
}

/// Replaces shard `shard`'s node with one serving the same store through the same request
/// handler, except that it refuses the requests `refuse` picks ("the disk refuses"). Drop
/// the handle before `start_node(shard)`: it holds the store.
fn refusing_node(
    cluster: &mut SimCluster,
    shard: u32,
    refuse: fn(&NodeRequest) -> bool,
) -> RefusingNode {
    cluster.stop_node(shard).unwrap();
    let dir = cluster.data_dir(shard);
    let store = zr_shard::server::open_shard_store(cluster.config(), &dir, shard, 0).unwrap();
    let coordination = Arc::new(zr_shard::fence::Coordination::open(store.disk(), &dir).unwrap());
    let slot = Arc::new(Mutex::new(Some(store)));
    let serving = Arc::clone(&slot);
    cluster
        .fake_node(shard, move |request| {
            let store = serving.lock().unwrap().clone();
            let coordination = Arc::clone(&coordination);
            async move {
                let refused = wire::decode_request::<NodeMessage>(&request)
                    .is_ok_and(|(m, _)| refuse(&m.request));
                let Some(store) = store.filter(|_| !refused) else {
                    return refusal(ErrorCode::Storage, "the disk refuses");
                };
                let (header, body) = tokio::task::spawn_blocking(move || {
                    zr_shard::server::handle(&store, &coordination, &request)
                })
                .await
                .unwrap();
                (header, net::Body::Ready(body))
            }
        })
        .unwrap();
    RefusingNode(slot)
}

/// Holds a [`refusing_node`]'s store; dropping it lets the real node open the store again.
struct RefusingNode(Arc<Mutex<Option<zr_node::Store>>>);

impl Drop for RefusingNode {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// A delete that has copied the last record into the hole but cannot cut it off its old
/// place (that shard's node refuses) stays recorded in the writer record: the next write
/// finishes it, so no record is lost or left twice, and a restarted router agrees.
#[test]
fn a_delete_left_half_done_is_finished_by_the_next_write() {
    let mut cluster = loaded_cluster();
    let client = cluster.client().unwrap();
    let placement = cluster.config().placement().unwrap();
    let mut model: Vec<Vec<u8>> = (0..RECORDS).map(payload).collect();
    // The last record on a shard other than 0, the hole elsewhere.
    while placement.locate(model.len() as u64 - 1).0 == 0 {
        let row = payload(model.len() as u64);
        client.append(&Record::new().with("data", &row)).unwrap();
        model.push(row);
    }
    let last = model.len() as u64 - 1;
    let last_shard = placement.locate(last).0;
    let hole = (0..last)
        .find(|&i| placement.locate(i).0 != last_shard)
        .unwrap();

    // The last record's node, with its data, except that it refuses every cut.
    let node = refusing_node(&mut cluster, last_shard, |request| {
        matches!(request, NodeRequest::Truncate { .. })
    });
    let err = client.delete(hole).unwrap_err().to_string();
    assert!(
        err.contains("the disk refuses")
            && err.contains("the delete is recorded, and the next write through any router"),
        "{err}"
    );
    // Meanwhile the moved record is in both places.
    let columns = client.gather(&[hole, last], &[]).unwrap();
    assert_eq!(columns[0].get(0).unwrap(), &model[last as usize][..]);
    assert_eq!(columns[0].get(1).unwrap(), &model[last as usize][..]);

    // The node comes back, and another node restarts; the next write cuts the moved record
    // off its old place first.
    drop(node);
    cluster.start_node(last_shard).unwrap();
    cluster.stop_node(0).unwrap();
    cluster.start_node(0).unwrap();
    model.swap_remove(hole as usize);
    let row = payload(1_000_000);
    assert_eq!(
        client.append(&Record::new().with("data", &row)).unwrap(),
        last
    );
    model.push(row);
    let all: Vec<u64> = (0..model.len() as u64).collect();
    let expect_model = |client: &Client| {
        assert_eq!(client.len().unwrap(), model.len() as u64);
        let columns = client.gather(&all, &[]).unwrap();
        for (i, row) in model.iter().enumerate() {
            assert_eq!(columns[0].get(i).unwrap(), &row[..], "record {i}");
        }
    };
    expect_model(&client);
    cluster.restart_router().unwrap();
    expect_model(&cluster.client().unwrap());
}

/// A node cut off by a network partition fails only the requests that need it, in time and
/// naming it, and a write that needs it fails whole; once the partition heals, the router
/// reaches the node again and the cluster is as if the failed write had never been tried.
#[test]
fn a_partitioned_node_fails_only_what_needs_it_and_heals() {
    let cluster = loaded_cluster();
    let client = cluster.client().unwrap();
    let (on_two, elsewhere) = split_by_shard(&cluster, 2);
    let cut_off = Faults {
        partitioned: true,
        ..Faults::default()
    };
    cluster.set_faults(2, cut_off).unwrap();
    for indices in [&on_two[..3], &[elsewhere[0], on_two[0]][..]] {
        expect_unavailable(&cluster, &client, 2, indices);
        check(&client, &elsewhere);
    }
    let rows: Vec<Vec<u8>> = (RECORDS..RECORDS + 40).map(payload).collect();
    let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
    let err = client.append_many(&records).unwrap_err().to_string();
    assert!(err.contains("shard 2"), "{err}");

    cluster.set_faults(2, Faults::default()).unwrap();
    assert_eq!(client.len().unwrap(), RECORDS);
    check(&client, &(0..RECORDS).collect::<Vec<_>>());
    assert_eq!(client.append_many(&records).unwrap().start, RECORDS);
    check(&client, &(0..RECORDS + 40).collect::<Vec<_>>());
}

/// A write from a router whose write lease ran out and passed to another router is refused
/// by the nodes, which the new holder fenced before writing: a late truncate cannot cut off
/// what the new holder appended. A write carrying no lease token is refused too.
#[test]
fn a_write_from_a_router_whose_lease_passed_on_is_refused() {
    let mut cluster = loaded_cluster();
    let client = cluster.client().unwrap();
    let as_router = cluster.security(Role::Router).unwrap();
    let config = cluster.config().clone();
    let node = |shard: u32| config.shard(shard).unwrap().addr;
    let ask = |cluster: &SimCluster, shard: u32, request: &NodeRequest| {
        let reply = raw_call(
            cluster,
            &as_router,
            node(shard),
            wire::encode_request(&NodeMessage::unchecked(request.clone())).unwrap(),
        );
        wire::decode_reply(&reply.unwrap()).unwrap().0
    };
    // Another router takes the lease for 300 ms, then stalls.
    wait_lease_free(&cluster);
    let stale = take_lease_as_another_router(&cluster, 300);
    // Meanwhile the cluster's router waits the lease out, then appends (fencing every node).
    let record = payload(RECORDS);
    assert_eq!(
        client.append(&Record::new().with("data", &record)).unwrap(),
        RECORDS
    );
    // Shard 3's node restarts meanwhile: its fence was kept.
    cluster.stop_node(3).unwrap();
    cluster.start_node(3).unwrap();
    // The stalled router's truncate arrives late, at every node: refused.
    for shard in 0..4 {
        let late = ask(
            &cluster,
            shard,
            &NodeRequest::Truncate {
                slots: config.placement().unwrap().slot_lens(shard, 0),
                token: stale,
            },
        );
        match late {
            Reply::Error {
                code: ErrorCode::Conflict,
                message,
            } => assert!(message.contains("passed to another"), "{message}"),
            other => panic!("shard {shard} took a stale truncate: {other:?}"),
        }
    }
    let untokened = ask(
        &cluster,
        1,
        &NodeRequest::Modify {
            index: 0,
            token: None,
            fields: vec!["data".into()],
            lengths: vec![0],
        },
    );
    assert!(
        matches!(
            &untokened,
            Reply::Error { code: ErrorCode::BadRequest, message } if message.contains("no lease token")
        ),
        "{untokened:?}"
    );
    assert_eq!(client.len().unwrap(), RECORDS + 1);
    check(&client, &(0..=RECORDS).collect::<Vec<_>>());
}

/// A node that crashes loses the writes it had not committed; the cluster then cuts back to
/// the longest prefix every shard still holds (committed records stay), and the next append
/// lands right after it.
#[test]
fn a_crashed_node_loses_only_uncommitted_records_and_the_cluster_cuts_back_to_a_prefix() {
    let mut cluster = loaded_cluster();
    let client = cluster.client().unwrap();
    let rows: Vec<Vec<u8>> = (RECORDS..RECORDS + 40).map(payload).collect();
    let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
    client.append_many(&records).unwrap();
    cluster.crash_node(2);
    cluster.start_node(2).unwrap();
    wait_node_up(&cluster, &client, 2);
    // Shard 2 lost its share of the 40; the cluster keeps what comes before the first.
    let placement = cluster.config().placement().unwrap();
    let kept = (RECORDS..RECORDS + 40)
        .find(|&i| placement.locate(i).0 == 2)
        .unwrap();
    let row = payload(1_000_000);
    assert_eq!(
        client.append(&Record::new().with("data", &row)).unwrap(),
        kept
    );
    assert_eq!(client.len().unwrap(), kept + 1);
    check(&client, &(0..kept).collect::<Vec<_>>());
    let last = client.gather(&[kept], &[]).unwrap();
    assert_eq!(last[0].get(0).unwrap(), &row[..]);
}

/// Shard 0 is not special: with its node down, gathers that touch only the other shards go
/// on, and appends — through either of two routers, each taking the writer lease from the
/// metadata store — fail at once naming shard 0 and saying since when, leaving the lease
/// free; once the node is back, appends succeed, nothing lost or duplicated.
#[test]
fn with_shard_zero_down_writes_fail_naming_it_and_resume_after() {
    let mut cluster = loaded_cluster();
    let client = cluster.client().unwrap();
    let second = cluster.add_router().unwrap();
    let other = cluster.async_client_of(second).unwrap();
    let (_, elsewhere) = split_by_shard(&cluster, 0);
    let rows: Vec<Vec<u8>> = (RECORDS..RECORDS + 40).map(payload).collect();
    let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();

    cluster.crash_node(0);
    // Known down to both routers within a couple of seconds (heartbeats), then failing at once.
    wait_node_down(&cluster, || client.status().unwrap(), 0);
    wait_node_down(&cluster, || cluster.run(other.status()).unwrap(), 0);
    check(&client, &elsewhere);
    let failures = [
        client.append_many(&records).unwrap_err().to_string(),
        cluster
            .run(other.append_many(&records))
            .unwrap_err()
            .to_string(),
    ];
    for err in failures {
        assert!(
            err.contains("shard 0") && err.contains("down since"),
            "{err}"
        );
    }
    let meta = cluster.metadata().unwrap();
    let (writer, _) = cluster
        .run(writer::load(&*meta, writer::WRITER_KEY))
        .unwrap()
        .unwrap();
    assert_eq!(writer.holder, None, "a failed write left the lease held");
    check(&client, &elsewhere);

    cluster.start_node(0).unwrap();
    let start = loop {
        match cluster.run(other.append_many(&records)) {
            Ok(range) => break range.start,
            Err(e) => {
                assert!(e.to_string().contains("shard 0"), "{e}");
                cluster.pause(Duration::from_millis(100));
            }
        }
    };
    assert_eq!(start, RECORDS, "a failed append left records behind");
    assert_eq!(client.len().unwrap(), RECORDS + 40);
    check(&client, &(0..RECORDS + 40).collect::<Vec<_>>());
}

/// Clients that ask for large gathers and never read them hold no more of the router than
/// its reply budget (here 8 MiB), while a client that reads gets its gathers meanwhile; once
/// the abandoned streams are gone the budget is whole again.
#[test]
fn abandoned_gathers_hold_no_more_than_the_reply_budget() {
    const SIZE: usize = 16 << 10;
    const COUNT: u64 = 512;
    const BUDGET_MIB: u64 = 8;
    let cluster = SimCluster::start(
        2,
        SimOptions {
            timeout_ms: 3_000,
            reply_budget_mib: BUDGET_MIB,
            ..SimOptions::default()
        },
    )
    .unwrap();
    // Through the router: its budget is what is tested.
    let client = cluster.client_via_router().unwrap();
    let row = |i: u64| -> Vec<u8> { (0..SIZE).map(|k| mix2(i, k as u64) as u8).collect() };
    let payloads: Vec<Vec<u8>> = (0..COUNT).map(row).collect();
    let rows: Vec<Record> = payloads
        .iter()
        .map(|p| Record::new().with("data", p))
        .collect();
    client.append_many(&rows).unwrap();
    client.commit().unwrap();
    let router = cluster.router(0).unwrap();
    let budget = (BUDGET_MIB << 20) as usize;

    // Six gathers of every record (8 MiB each) on a connection that lets through 1 MiB and
    // is never read: a client that went away without closing, or a hostile one.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let request = wire::encode_client_request(
        None,
        &ClientRequest::Gather {
            indices: (0..COUNT).collect(),
            fields: Vec::new(),
            checked: false,
        },
    )
    .unwrap();
    let addr = cluster.router_addr();
    let security = cluster.security(Role::Writer).unwrap();
    let (endpoint, connection, streams) = runtime.block_on(async {
        let endpoint = net::client_endpoint(addr).unwrap();
        let windows = net::Windows {
            stream: 1 << 20,
            connection: 1 << 20,
        };
        let timeout = Duration::from_secs(5);
        let connection = net::connect_with_windows(&endpoint, &security, addr, timeout, windows)
            .await
            .unwrap();
        let mut streams = Vec::new();
        for _ in 0..6 {
            let stream = net::send_request(&connection, request.clone(), Vec::new());
            streams.push(stream.await.unwrap());
        }
        (endpoint, connection, streams)
    });
    // The router reads ahead until the budget is spent, never beyond. (Polled on real time:
    // the point is a connection of real sockets whose reader, on a runtime of its own,
    // never reads; a cluster on virtual time would not run while it waits.)
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut peak = 0;
    while peak < budget / 2 {
        peak = peak.max(router.reply_bytes_held());
        assert!(Instant::now() < deadline, "only {peak} bytes held");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A client that reads is served meanwhile (within the router's write timeout, as the
    // abandoned streams are reset), byte-exact.
    let watching = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|scope| {
        // Real time, as above: a thread samples what the router holds while it serves.
        let watcher = scope.spawn(|| {
            let mut most = 0;
            while watching.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(router.reply_bytes_held());
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        });
        for b in 0..4u64 {
            let indices: Vec<u64> = (0..64).map(|k| mix2(b, k) % COUNT).collect();
            let columns = client.gather(&indices, &[]).unwrap();
            for (pos, &i) in indices.iter().enumerate() {
                assert_eq!(columns[0].get(pos).unwrap(), &row(i)[..], "record {i}");
            }
        }
        watching.store(false, std::sync::atomic::Ordering::SeqCst);
        let most = watcher.join().unwrap();
        assert!(
            most <= budget,
            "{most} bytes held, over the budget of {budget}"
        );
    });
    // Gone: everything they held is given back.
    drop(streams);
    connection.close(0u32.into(), b"gone");
    drop(endpoint);
    // Real time, as above: the router learns of the closed connection over real sockets.
    let deadline = Instant::now() + Duration::from_secs(20);
    while router.reply_bytes_held() != 0 {
        assert!(
            Instant::now() < deadline,
            "{} bytes still held after the gathers were abandoned",
            router.reply_bytes_held()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(runtime);
}

/// A fake node's refusal: `code`, saying `message`.
fn refusal(code: ErrorCode, message: &str) -> (Vec<u8>, net::Body) {
    let refusal = Reply::Error {
        code,
        message: message.into(),
    };
    (
        wire::encode_reply(&refusal).unwrap(),
        net::Body::Ready(Vec::new()),
    )
}
