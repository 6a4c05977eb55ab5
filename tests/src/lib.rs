//! Workspace-level integration tests live in `tests/tests/`; this is their kit: model rows
//! of the two fields the simulated clusters are made with (`a` raw, `b` flate), appends
//! that keep the model, checks of gathers against it, loads of gathers and appends on the
//! cluster's clock (a cluster on virtual time), and waits on a condition with a deadline.

use std::time::Duration;

use zr_common::hash::mix2;
use zr_common::Record;
use zr_router::{AsyncClient, Client};
use zr_sim::{SimCluster, SimOptions};

/// A simulated cluster's options as these tests make them: `fields` (name, compression),
/// `extent_records` records per extent, every wait bounded by `timeout_ms`, `replicas` per
/// shard; with `ZR_TEST_LOG` set, the servers log to stderr.
pub fn options(
    fields: &[(&str, &str)],
    extent_records: u64,
    timeout_ms: u64,
    replicas: u32,
) -> SimOptions {
    if std::env::var("ZR_TEST_LOG").is_ok() {
        zr_service::logging::init_logging("info", zr_service::logging::LogFormat::Text);
    }
    SimOptions {
        fields: fields
            .iter()
            .map(|&(name, compression)| (name.to_string(), compression.to_string()))
            .collect(),
        extent_records,
        timeout_ms,
        replicas,
        ..SimOptions::default()
    }
}

/// The options of the tests of rebuilding a replica from its partner's files: two fields
/// (one raw, one compressed), small extents, two replicas, on virtual time.
pub fn shipping_options() -> SimOptions {
    SimOptions {
        virtual_time: true,
        ..options(&[("a", "raw"), ("b", "flate")], 3, 2_000, 2)
    }
}

/// `min` to `min + spread - 1` bytes, as many as `seed` hashes to, each a hash of `seed`
/// and its place: a test's record, the same every time.
pub fn bytes(seed: u64, min: u64, spread: u64) -> Vec<u8> {
    let len = min + mix2(seed, 1) % spread.max(1);
    (0..len).map(|i| mix2(seed, i) as u8).collect()
}

/// Gathers `indices` (every field) through `client` and checks the first field of each
/// against `want(index)`.
pub fn check_first<T: AsRef<[u8]>>(client: &Client, indices: &[u64], want: impl Fn(u64) -> T) {
    let columns = client.gather(indices, &[]).expect("gather");
    for (pos, &i) in indices.iter().enumerate() {
        assert!(
            columns[0].get(pos).expect("in the batch") == want(i).as_ref(),
            "record {i} differs"
        );
    }
}

/// A record of the model: field `a`, field `b`.
pub type Row = [Vec<u8>; 2];

/// Row `seed`: `a` up to `longest` bytes from a hash, `b` text naming the seed.
pub fn row(seed: u64, longest: u64) -> Row {
    let len = (mix2(seed, 1) % longest.max(1)) as usize;
    let a: Vec<u8> = (0..len).map(|i| mix2(seed, i as u64) as u8).collect();
    let b = format!("record {seed} ").repeat(1 + len / 50).into_bytes();
    [a, b]
}

/// `row` as a record of fields `a` and `b`.
pub fn record(row: &Row) -> Record<'_> {
    Record::new().with("a", &row[0]).with("b", &row[1])
}

/// Appends `count` rows (seeds from `seed`, `a` up to `longest` bytes) through `client`,
/// checks they landed at the model's end, and adds them to it.
pub fn append(client: &Client, model: &mut Vec<Row>, seed: u64, count: u64, longest: u64) {
    let rows: Vec<Row> = (0..count).map(|k| row(mix2(seed, k), longest)).collect();
    let records: Vec<Record> = rows.iter().map(record).collect();
    let range = client.append_many(&records).expect("append");
    assert_eq!(
        range.start,
        model.len() as u64,
        "appended at the wrong index"
    );
    model.extend(rows);
}

/// [`append`] through an async client (a cluster on virtual time).
pub async fn append_async(
    client: &AsyncClient,
    model: &mut Vec<Row>,
    seed: u64,
    count: u64,
    longest: u64,
) {
    let rows: Vec<Row> = (0..count).map(|k| row(mix2(seed, k), longest)).collect();
    let records: Vec<Record> = rows.iter().map(record).collect();
    let range = client.append_many(&records).await.expect("append");
    assert_eq!(
        range.start,
        model.len() as u64,
        "appended at the wrong index"
    );
    model.extend(rows);
}

/// `count` rows of `seed` appended through `client` of `cluster` and committed: the model
/// of the records, to check against.
pub fn loaded(
    cluster: &SimCluster,
    client: &AsyncClient,
    seed: u64,
    count: u64,
    longest: u64,
) -> Vec<Row> {
    let mut model = Vec::new();
    cluster.run(async {
        append_async(client, &mut model, seed, count, longest).await;
        client.commit().await.expect("commit");
    });
    model
}

/// [`check`] through an async client (a cluster on virtual time).
pub async fn check_async(client: &AsyncClient, model: &[Row], indices: &[u64]) {
    let columns = client.gather(indices, &[]).await.expect("gather");
    for (pos, &i) in indices.iter().enumerate() {
        for (f, column) in columns.iter().enumerate() {
            assert!(
                column.get(pos) == Some(&model[i as usize][f][..]),
                "field {f} of record {i} differs"
            );
        }
    }
}

/// Gathers (of 64 random records), appends (of up to `longest_batch` rows) and modifies (of
/// one record, every field) through `client` for `span` of the cluster's clock, each gather
/// checked against `model`; on a cluster on virtual time, inside `SimCluster::run`. Returns
/// the gathers made.
pub async fn load_for(
    client: &AsyncClient,
    model: &mut Vec<Row>,
    seed: u64,
    span: Duration,
    longest_batch: u64,
    longest: u64,
) -> u64 {
    let until = tokio::time::Instant::now() + span;
    let mut gathers = 0;
    for step in 0u64.. {
        if tokio::time::Instant::now() >= until {
            break;
        }
        let r = mix2(seed, step);
        if r.is_multiple_of(4) {
            append_async(client, model, r, 1 + r % longest_batch, longest).await;
        } else if r % 16 == 1 && !model.is_empty() {
            let index = mix2(r, 1) % model.len() as u64;
            let changed = row(mix2(r, 2), longest);
            client
                .modify(index, &record(&changed))
                .await
                .expect("modify");
            model[index as usize] = changed;
        } else {
            let indices: Vec<u64> = (0..64).map(|k| mix2(r, k) % model.len() as u64).collect();
            check_async(client, model, &indices).await;
            gathers += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gathers
}

/// [`load_for`] in slices of 200 ms of the cluster's clock until the router has every
/// replica in sync and up, `within` at most; returns the gathers made.
pub fn load_until_in_sync(
    cluster: &SimCluster,
    client: &AsyncClient,
    model: &mut Vec<Row>,
    seed: u64,
    within: Duration,
    longest: u64,
) -> u64 {
    let mut gathers = 0;
    let mut waited = Duration::ZERO;
    for slice in 0u64.. {
        let span = Duration::from_millis(200);
        gathers += cluster.run(load_for(client, model, mix2(seed, slice), span, 8, longest));
        waited += span;
        let status = cluster.run(client.status()).expect("status");
        if status.nodes.iter().all(|n| n.in_sync && n.state == "up") {
            break;
        }
        assert!(waited < within, "not in sync within {within:?}: {status:?}");
    }
    gathers
}

/// Waits, on the cluster's clock, until `client`'s router has every replica in sync and up,
/// `within` at most.
pub async fn in_sync(client: &AsyncClient, within: Duration) {
    let until = tokio::time::Instant::now() + within;
    loop {
        let status = client.status().await.expect("status");
        if status.nodes.iter().all(|n| n.in_sync && n.state == "up") {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "not in sync within {within:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Gathers `indices` through `client`: every field of every record as the model has it.
pub fn check(client: &Client, model: &[Row], indices: &[u64]) {
    let columns = client.gather(indices, &[]).expect("gather");
    for (pos, &i) in indices.iter().enumerate() {
        for (f, column) in columns.iter().enumerate() {
            assert!(
                column.get(pos) == Some(&model[i as usize][f][..]),
                "field {f} of record {i} differs"
            );
        }
    }
}

/// The cluster's length and every record, as the model has them.
pub fn check_all(client: &Client, model: &[Row]) {
    assert_eq!(client.len().expect("len"), model.len() as u64);
    let all: Vec<u64> = (0..model.len() as u64).collect();
    for batch in all.chunks(1000) {
        check(client, model, batch);
    }
}

/// [`serves_all`] through an async client (a cluster on virtual time).
pub async fn serves_all_async(client: &AsyncClient, model: &[Row]) -> Result<(), String> {
    let len = client.len().await.map_err(|e| e.to_string())?;
    if len != model.len() as u64 {
        return Err(format!("{len} records, not {}", model.len()));
    }
    let all: Vec<u64> = (0..len).collect();
    let columns = client.gather(&all, &[]).await.map_err(|e| e.to_string())?;
    for (i, row) in model.iter().enumerate() {
        for (f, column) in columns.iter().enumerate() {
            if column.get(i) != Some(&row[f][..]) {
                return Err(format!("field {f} of record {i} differs"));
            }
        }
    }
    Ok(())
}

/// Polls `done` every 100 ms of `cluster`'s clock until it holds; fails naming `what` after
/// `within` of it. On virtual time the cluster runs meanwhile and the wait takes no real
/// time.
pub fn eventually(
    cluster: &SimCluster,
    what: &str,
    within: Duration,
    mut done: impl FnMut() -> bool,
) {
    let deadline = cluster.now() + within;
    while !done() {
        assert!(cluster.now() < deadline, "{what}: not within {within:?}");
        cluster.pause(Duration::from_millis(100));
    }
}

/// One request, as `role`, to shard `shard`'s replica `replica` — straight to the node — as
/// placed by cluster id and map version `placed`; the reply's head.
pub fn ask_node(
    cluster: &SimCluster,
    role: zr_net::tls::Role,
    (shard, replica): (u32, u32),
    placed: (&str, u64),
    request: &zr_proto::wire::NodeRequest,
) -> zr_proto::wire::Reply {
    let addr = cluster
        .listed_nodes()
        .into_iter()
        .find(|&(s, r, _)| (s, r) == (shard, replica))
        .expect("listed")
        .2;
    let security = cluster.security(role).expect("certs");
    let header = zr_proto::wire::encode_node_request(
        Some(placed.0),
        None,
        placed.1,
        Some(zr_proto::wire::Target { shard, replica }),
        request,
    )
    .expect("encode");
    cluster.run(async {
        let timeout = Duration::from_secs(5);
        let endpoint = zr_net::client_endpoint(addr).expect("endpoint");
        let connection = zr_net::connect_to(
            &endpoint,
            &security,
            addr,
            timeout,
            zr_net::Windows::DEFAULT,
            Some(zr_net::tls::Role::Node),
        )
        .await
        .expect("a node accepts the certificate");
        let chunks = zr_net::call_chunks(&connection, header, Vec::new(), timeout)
            .await
            .expect("an answer");
        connection.close(0u32.into(), b"done");
        zr_proto::wire::decode_reply_chunks(&chunks)
            .expect("a reply")
            .0
    })
}

/// Waits until the move `client`'s router runs has ended, done or stopped by an error, and
/// returns its last report; 60 s of `cluster`'s clock at most, polling every 20 ms of it.
pub fn move_ended(cluster: &SimCluster, client: &Client) -> zr_router::MoveReport {
    let deadline = cluster.now() + Duration::from_secs(60);
    loop {
        let report = client
            .move_progress()
            .expect("progress")
            .expect("a move under way");
        if report.done || report.error.is_some() {
            return report;
        }
        assert!(cluster.now() < deadline, "the move never ended: {report:?}");
        cluster.pause(Duration::from_millis(20));
    }
}
