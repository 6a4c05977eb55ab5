//! The cluster's trust boundaries, as an outside audit probed them: what each client role may
//! ask of a router, a router started from a nodes.toml with two nodes' addresses swapped,
//! two moves asked of one router at once, and an add-shard refused for a dead address.

use zr_common::Record;
use zr_net::tls::Role;
use zr_proto::wire::MapChange;
use zr_proto::ErrorCode;
use zr_router::Client;
use zr_sim::{SimCluster, SimOptions};

/// On virtual time: waits take no real time, and a seed replays a run.
fn options() -> SimOptions {
    SimOptions {
        virtual_time: true,
        ..zr_tests::options(&[("x", "raw")], 8, 5_000, 1)
    }
}

/// A client of the router at `router` presenting `security`, with the cluster's timeout.
fn connect_as(
    cluster: &SimCluster,
    router: std::net::SocketAddr,
    security: zr_net::Security,
) -> Client {
    cluster
        .client_with_security(router, security, zr_router::ClientOptions::default())
        .expect("connect")
}

fn row(k: u64) -> Vec<u8> {
    zr_tests::bytes(k, 16, 200)
}

/// A cluster of `shards` shards holding `records` committed records (row(k) at k).
fn loaded(shards: u32, records: u64) -> SimCluster {
    let cluster = SimCluster::start(shards, options()).expect("cluster");
    let client = cluster.client().expect("client");
    let rows: Vec<Vec<u8>> = (0..records).map(row).collect();
    for batch in rows.chunks(2048) {
        let records: Vec<Record> = batch.iter().map(|r| Record::new().with("x", r)).collect();
        client.append_many(&records).expect("append");
    }
    client.commit().expect("commit");
    cluster
}

/// Every record byte-exact through `client`, and no more.
fn check_all(client: &Client, records: u64) {
    assert_eq!(client.len().expect("len"), records);
    let all: Vec<u64> = (0..records).collect();
    let columns = client.gather(&all, &[]).expect("gather");
    for k in 0..records {
        assert!(
            columns[0].get(k as usize).expect("record") == &row(k)[..],
            "record {k} differs"
        );
    }
}

/// The code and message of a refused call.
fn refusal<T: std::fmt::Debug>(result: Result<T, zr_router::Error>) -> (Option<ErrorCode>, String) {
    let e = result.expect_err("refused");
    let code = match &e {
        zr_router::Error::Proto(zr_proto::Error::Remote { code, .. }) => Some(*code),
        _ => None,
    };
    (code, e.to_string())
}

/// Each role against each kind of request: readers read (gather, info, status), writers also
/// write (append, commit), operators also operate (scrub, moves, node replacement); a request
/// outside the role is refused naming the role it needs, and changes nothing.
#[test]
fn each_role_may_ask_what_it_is_for_and_nothing_more() {
    let cluster = loaded(2, 300);
    let as_role = |role: Role| {
        connect_as(
            &cluster,
            cluster.router_addr(),
            cluster.security(role).expect("certs"),
        )
    };
    let one = [Record::new().with("x", b"appended")];
    let mut len = 300;
    for role in [Role::Reader, Role::Writer, Role::Operator] {
        let client = as_role(role);
        // Reading: everyone.
        assert_eq!(client.len().expect("info"), len);
        client.gather(&[0, 299], &[]).expect("gather");
        client.status().expect("status");
        // Writing: writers and operators.
        let appended = client.append_many(&one);
        let committed = client.commit();
        if role == Role::Reader {
            for (code, message) in [refusal(appended), refusal(committed)] {
                assert_eq!(code, Some(ErrorCode::Forbidden), "{message}");
                assert!(
                    message.contains("needs the writer role") && message.contains("reader"),
                    "{message}"
                );
            }
        } else {
            appended.expect("append");
            committed.expect("commit");
            len += 1;
        }
        // Operating: operators only. An operator's requests pass the role check and are then
        // judged on their merits (a shard that does not exist, a cluster of one replica).
        let scrubbed = client.scrub(0, 0, 16);
        let drained = client.move_shards(MapChange::DrainShard(9), Vec::new());
        let replaced = client.replace_node(1, 0, "127.0.0.1:9".parse().expect("address"));
        if role == Role::Operator {
            scrubbed.expect("scrub");
            let (code, message) = refusal(replaced);
            assert_ne!(code, Some(ErrorCode::Forbidden), "{message}");
            // A move runs in the background: it stops, naming the shard that is not there.
            drained.expect("a move is started");
            let report = zr_tests::move_ended(&cluster, &client);
            let stopped = report.error.clone().unwrap_or_default();
            assert!(stopped.contains('9'), "{report:?}");
        } else {
            for (code, message) in [refusal(scrubbed), refusal(drained), refusal(replaced)] {
                assert_eq!(code, Some(ErrorCode::Forbidden), "{message}");
                assert!(
                    message.contains("needs the operator role") && message.contains(role.name()),
                    "{message}"
                );
            }
        }
    }
    // Nothing but the two allowed appends changed.
    let client = as_role(Role::Reader);
    assert_eq!(client.len().expect("len"), 302);
    let status = client.status().expect("status");
    assert!(status.moving.is_none(), "{status:?}");
    let rows = client
        .gather(&(0..300).collect::<Vec<_>>(), &[])
        .expect("gather");
    for k in 0..300u64 {
        assert!(rows[0].get(k as usize).expect("record") == &row(k)[..]);
    }
}

/// A second router started from a nodes.toml that swaps two shards' addresses reaches the
/// right processes under the wrong names: every node refuses its requests as meant for
/// another shard, so it serves no record from the wrong place and cuts nothing — the
/// audit's run returned 19,632 records at wrong positions and cut 1,177 acknowledged ones.
#[test]
fn a_swapped_nodes_toml_fails_loudly_and_changes_nothing() {
    let mut cluster = loaded(3, 3000);
    let mut swapped = cluster.config().clone();
    let (a, b) = (swapped.shards[0].addr, swapped.shards[1].addr);
    swapped.shards[0].addr = b;
    swapped.shards[1].addr = a;
    match cluster.add_router_with(swapped) {
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("shard"), "{e}");
        }
        Ok(second) => {
            let security = cluster.security(Role::Writer).expect("certs");
            let options = zr_router::ClientOptions::default();
            if let Ok(client) = cluster.client_with_security(second, security, options) {
                let all: Vec<u64> = (0..3000).collect();
                let began = cluster.now();
                let (code, message) = refusal(client.gather(&all, &[]));
                // A refusal by the map the router gives is no stale map: the one-hop gather
                // hands it to the router at once rather than retrying it for its timeout.
                let waited = cluster.now() - began;
                let timeout = cluster.client_timeout();
                assert!(
                    waited < timeout,
                    "a misplaced node's refusal took {waited:?}, retried as a stale map"
                );
                assert!(
                    code == Some(ErrorCode::WrongShard) || message.contains("meant for"),
                    "{message}"
                );
                assert!(
                    message.contains("shard 0 replica 0") || message.contains("shard 1 replica 0"),
                    "{message}"
                );
                let appended = client.append_many(&[Record::new().with("x", b"late")]);
                assert!(
                    appended.is_err(),
                    "an append through the swapped router landed"
                );
                assert!(client.commit().is_err() || client.len().is_err());
            }
        }
    }
    // Through the true router: everything as it was.
    check_all(&cluster.client().expect("client"), 3000);
}

/// Two moves asked of one router at once: the second, of another change, is refused naming
/// the one under way — never answered with the first one's result — and the first runs to
/// its end, its report naming its own change.
#[test]
fn a_move_never_reports_another_moves_result() {
    let cluster = loaded(3, 6000);
    let client = cluster.client().expect("client");
    client
        .move_shards(MapChange::DrainShard(1), Vec::new())
        .expect("first move");
    let (code, message) = refusal(client.move_shards(MapChange::DrainShard(0), Vec::new()));
    let report = zr_tests::move_ended(&cluster, &client);
    assert_eq!(report.change, Some(MapChange::DrainShard(1)), "{report:?}");
    assert!(report.error.is_none(), "{report:?}");
    // Unless the first had ended before the second arrived (then it would have run), the
    // second was refused by name.
    assert_eq!(code, Some(ErrorCode::Conflict), "{message}");
    assert!(
        message.contains("another move (drain shard 1)") && message.contains("drain shard 0"),
        "{message}"
    );
    let status = client.status().expect("status");
    let held: Vec<u64> = status
        .nodes
        .iter()
        .filter(|n| n.shard == 0)
        .map(|n| n.records.unwrap_or(0))
        .collect();
    assert!(held.iter().all(|&r| r > 0), "shard 0 was drained: {held:?}");
    check_all(&client, 6000);
}

/// An add-shard refused because nothing answers at the new shard's address leaves the
/// router as it was: no link to that address (which used to make every later connect and
/// status wait on it), status answering at once, every record served.
#[test]
fn a_refused_add_shard_leaves_no_link_behind() {
    let cluster = loaded(2, 500);
    let client = cluster.client().expect("client");
    let nobody = {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("socket");
        socket.local_addr().expect("address")
    };
    let mut nodes = cluster.listed_nodes();
    nodes.push((2, 0, nobody));
    client
        .move_shards(MapChange::AddShard, nodes)
        .expect("a move is started");
    let report = zr_tests::move_ended(&cluster, &client);
    assert!(!report.done, "a shard at {nobody} was added: {report:?}");
    let stopped = report.error.unwrap_or_default();
    assert!(stopped.contains(&nobody.to_string()), "{stopped}");
    let status = client.status().expect("status");
    assert!(
        status.nodes.iter().all(|n| n.shard < 2),
        "a link to the refused shard remains: {:?}",
        status.nodes
    );
    assert_eq!(status.map_version, 1, "{status:?}");
    check_all(&client, 500);
}

/// A router with `[router] audit_log` writes who did what: an operator's dataset created and
/// dropped, a writer's commit (named by the certificate `zr cluster issue --name` gave), and
/// a reader's refused appends — once for ten refusals, since one identity's refusals are
/// logged once a minute. Gathers and appends are not logged. The lines come back in order.
#[test]
fn the_audit_log_says_who_did_what() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("audit.log");
    let cluster = SimCluster::start(
        2,
        SimOptions {
            audit_log: Some(path.clone()),
            ..options()
        },
    )
    .expect("cluster");
    let connect = |role: Role, name: &str| issued(&cluster, role, name);
    let operator = connect(Role::Operator, "ops-1");
    let writer = connect(Role::Writer, "ingest-job");
    let reader = connect(Role::Reader, "team-a");

    let fields = vec![zr_proto::wire::FieldInfo::new("y", "raw")];
    operator.create_dataset("imgs", fields).expect("create");
    writer
        .append(&Record::new().with("x", &row(1)))
        .expect("append");
    writer.commit().expect("commit");
    assert_eq!(reader.gather(&[0], &[]).expect("gather").len(), 1);
    for _ in 0..10 {
        let refused = reader.append(&Record::new().with("x", &row(2)));
        assert!(refused.is_err(), "a reader cannot append");
    }
    operator.drop_dataset("imgs").expect("drop");

    let entries = zr_service::audit::read(&path, None).expect("read");
    let said: Vec<(&str, &str, &str, &str, &str)> = entries
        .iter()
        .map(|e| {
            (
                e.who.as_str(),
                e.role.as_str(),
                e.action.as_str(),
                e.dataset.as_str(),
                e.outcome.as_str(),
            )
        })
        .collect();
    assert_eq!(
        said,
        vec![
            ("ops-1", "operator", "create-dataset", "imgs", "ok"),
            ("ingest-job", "writer", "commit", "default", "ok"),
            ("team-a", "reader", "append", "default", "refused"),
            ("ops-1", "operator", "drop-dataset", "imgs", "ok"),
        ]
    );
    assert!(
        entries[2].detail.contains("writer"),
        "the refusal says what it needs: {}",
        entries[2].detail
    );
    // A path that cannot be written stops the router at start, naming it.
    let unwritable = dir.path().join("no-such-dir").join("audit.log");
    let e = SimCluster::start(
        1,
        SimOptions {
            audit_log: Some(unwritable),
            ..options()
        },
    )
    .err()
    .expect("refused");
    assert!(e.to_string().contains("no-such-dir"), "{e}");
}

/// Gathers through `client` until one fails, `within` of the cluster's clock at most; the
/// time it took and the error.
fn refused_within(
    cluster: &SimCluster,
    client: &Client,
    within: std::time::Duration,
) -> (std::time::Duration, String) {
    let started = cluster.now();
    loop {
        match client.gather(&[0, 1, 2], &[]) {
            Err(e) => return (cluster.now() - started, e.to_string()),
            Ok(_) => assert!(
                cluster.now() - started < within,
                "still served {within:?} after the revocation"
            ),
        }
        cluster.pause(std::time::Duration::from_millis(20));
    }
}

/// `zr cluster revoke`: a reader's certificate revoked while it gathers one hop is refused
/// by the nodes within seconds — with the router stopped, so the nodes alone refuse it —
/// while another reader's gathers go on; a router started afterwards refuses it from its
/// first request; an operator cannot revoke its own certificate or the cluster's operator
/// certificate; `--undo` serves it again.
#[test]
fn a_revoked_certificate_is_refused_by_nodes_and_routers_within_seconds() {
    let mut cluster = loaded(2, 300);
    let certs = cluster.certs_dir().expect("a secured cluster");
    let connect = |role: Role, name: &str| issued(&cluster, role, name);
    let operator = connect(Role::Operator, "ops-1");
    let (team_a, team_b) = (
        connect(Role::Reader, "team-a"),
        connect(Role::Reader, "team-b"),
    );
    assert!(team_a.reads_direct() && team_b.reads_direct(), "one hop");
    check_all(&team_a, 300);

    // Refusals that change nothing.
    for (name, why) in [("ops-1", "comes with"), ("operator", "cluster's own")] {
        let (code, message) = refusal(operator.revoke(name, false));
        assert_eq!(code, Some(ErrorCode::BadRequest), "{message}");
        assert!(message.contains(why), "{message}");
    }
    let (code, message) = refusal(team_b.revoke("team-a", false));
    assert_eq!(
        code,
        Some(ErrorCode::Forbidden),
        "a reader revokes nothing: {message}"
    );
    let (_, message) = refusal(operator.revoke("Team A!", false));
    assert!(message.contains("not a usable name"), "{message}");

    assert_eq!(
        operator.revoke("team-a", false).expect("revoke"),
        ["team-a"]
    );
    cluster.stop_router(0).expect("stop the router");
    let (took, error) = refused_within(&cluster, &team_a, std::time::Duration::from_secs(10));
    assert!(error.contains("'team-a' is revoked"), "{error}");
    println!("team-a refused one hop {took:?} after the revocation");
    check_all_one_hop(&team_b, 300);

    // A router started after the revocation refuses team-a at once; team-b is served.
    cluster.add_router().expect("a new router");
    let fresh = cluster.router_addrs()[0];
    let reader = |name: &str| {
        let home = certs.join(format!("reader-{name}"));
        let security = zr_net::Security::load(&home, Role::Reader).expect("load");
        let options = zr_router::ClientOptions::default();
        cluster.client_with_security(fresh, security, options)
    };
    let e: Box<dyn std::error::Error + Send + Sync> = reader("team-a")
        .and_then(|c| c.len().map_err(Into::into))
        .expect_err("refused");
    assert!(e.to_string().contains("revoked"), "{e}");
    assert_eq!(reader("team-b").expect("connect").len().expect("len"), 300);

    // Undone: served again.
    let operator = {
        let home = certs.join("operator-ops-1");
        let security = zr_net::Security::load(&home, Role::Operator).expect("load");
        connect_as(&cluster, fresh, security)
    };
    assert!(operator.revoke("team-a", true).expect("undo").is_empty());
    let team_a = reader("team-a").expect("connect");
    assert_eq!(team_a.len().expect("the router serves it at once"), 300);
    // The nodes, once they read the record again (a poll on real time, as above).
    served_again(&cluster, &team_a);
    check_all_one_hop(&team_a, 300);
}

/// Waits (within 10 s of the cluster's clock) until `client`'s gathers are served again
/// after an undone revocation.
fn served_again(cluster: &SimCluster, client: &Client) {
    let within = std::time::Duration::from_secs(10);
    zr_tests::eventually(cluster, "served again", within, || {
        client.gather(&[0], &[]).is_ok()
    });
}

/// Every record byte-exact through `client`, read one hop (no router needed).
fn check_all_one_hop(client: &Client, records: u64) {
    let all: Vec<u64> = (0..records).collect();
    let columns = client.gather(&all, &[]).expect("gather");
    for k in 0..records {
        assert!(columns[0].get(k as usize).expect("record") == &row(k)[..]);
    }
}

/// `zr grant`: with no grant, every reader reads every dataset; once team-a is granted
/// read on `imgs*`, it reads `imgs` through the router and one hop, is refused on `text`
/// both ways (the nodes within seconds), and its dataset listing shows `imgs` only; a
/// writer granted write on `imgs` writes there and not in `text`; operators see all. A grant
/// of a dataset the cluster lacks is refused unless `create_later`; a malformed pattern is
/// refused; a grant holds on the nodes at once; taking the grants back restores the cluster as
/// it was.
#[test]
fn grants_bound_readers_and_writers_to_their_datasets() {
    let logs = tempfile::tempdir().expect("dir");
    let node_log = logs.path().join("node-{shard}-{replica}.log");
    let cluster = SimCluster::start(
        2,
        SimOptions {
            node_audit_log: Some(node_log.to_str().expect("utf-8").to_string()),
            ..options()
        },
    )
    .expect("cluster");
    let connect = |role: Role, name: &str| issued(&cluster, role, name);
    let operator = connect(Role::Operator, "ops-1");
    for name in ["imgs", "text"] {
        let dataset = operator
            .create_dataset(name, vec![zr_proto::wire::FieldInfo::new("x", "raw")])
            .expect("create");
        let rows: Vec<Vec<u8>> = (0..50).map(row).collect();
        let records: Vec<Record> = rows.iter().map(|r| Record::new().with("x", r)).collect();
        dataset.append_many(&records).expect("append");
        dataset.commit().expect("commit");
    }
    // Team A's client asks the router for the map no more than once a minute, so that the
    // one-hop refusal below is the nodes' own, not the router's answer to a refresh.
    let team_a = {
        let security = issued_security(&cluster, Role::Reader, "team-a");
        let options = zr_router::ClientOptions {
            topology_every: std::time::Duration::from_secs(60),
            ..zr_router::ClientOptions::default()
        };
        cluster
            .client_with_security(cluster.router_addr(), security, options)
            .expect("connect")
    };
    let writer = connect(Role::Writer, "ingest");
    let on = |client: &Client, name: &str| client.dataset(name).expect("a handle");
    // Handles made before any grant (their one-hop gathers know where the nodes are).
    let (imgs, text) = (on(&team_a, "imgs"), on(&team_a, "text"));
    let (writer_imgs, writer_text) = (on(&writer, "imgs"), on(&writer, "text"));
    assert_eq!(text.len().expect("no grants: as before"), 50);
    assert_eq!(text.gather(&[0], &[]).expect("one hop").len(), 1);

    let grant = |who: &str, write: bool, pattern: &str, create_later: bool| {
        let grant = zr_router::Grant {
            who: who.into(),
            write,
            pattern: pattern.into(),
        };
        operator.grant(grant, false, create_later)
    };
    grant("team-a", false, "imgs*", false).expect("grant");
    grant("ingest", true, "imgs", false).expect("grant");
    let (code, message) = refusal(grant("team-a", false, "nope", false));
    assert_eq!(code, Some(ErrorCode::BadRequest), "{message}");
    assert!(message.contains("create-later"), "{message}");
    assert_eq!(
        grant("team-a", false, "nope", true).expect("later").len(),
        3
    );
    let (_, message) = refusal(grant("team-a", false, "Im*g", false));
    assert!(message.contains("grant pattern"), "{message}");

    // Through the router.
    assert_eq!(imgs.len().expect("granted"), 50);
    let (code, message) = refusal(text.len());
    assert_eq!(code, Some(ErrorCode::NotGranted), "{message}");
    assert!(
        message.contains("no grant to read dataset 'text'"),
        "{message}"
    );
    assert!(team_a.dataset("text").is_err(), "no new handle either");
    let listed: Vec<String> = team_a
        .datasets()
        .expect("list")
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(listed, ["imgs"]);
    assert!(
        operator.datasets().expect("list").len() >= 2,
        "operators see all"
    );
    // One hop: the nodes refuse `text` once they read the grants (a poll on real time).
    assert!(imgs.reads_direct());
    let columns = imgs.gather(&[0, 49], &[]).expect("one hop, granted");
    assert!(columns[0].get(1) == Some(&row(49)[..]));
    let started = cluster.now();
    loop {
        match text.gather(&[0], &[]) {
            Err(e) => {
                assert!(e.to_string().contains("no grant to read"), "{e}");
                break;
            }
            Ok(_) => assert!(
                cluster.now() - started < std::time::Duration::from_secs(10),
                "the nodes still serve text"
            ),
        }
        cluster.pause(std::time::Duration::from_millis(20));
    }
    // The node that refused it wrote it to its audit log.
    let refusals: Vec<zr_service::audit::Entry> = (0..2)
        .flat_map(|shard| {
            let path = logs.path().join(format!("node-{shard}-0.log"));
            zr_service::audit::read(&path, None).expect("a node's audit log")
        })
        .collect();
    assert!(
        refusals.iter().any(|e| e.server == "node"
            && e.who == "team-a"
            && e.dataset == "text"
            && e.outcome == "refused"),
        "{refusals:?}"
    );
    // A grant holds on the nodes at once: one that refused `text` a moment ago reads the
    // grants again before it refuses, rather than refusing until its next read.
    grant("team-a", false, "text", false).expect("grant");
    let columns = text
        .gather(&[0], &[])
        .expect("one hop, granted a moment ago");
    assert!(columns[0].get(0) == Some(&row(0)[..]));
    // A writer granted write on imgs writes there, and not in text.
    writer_imgs
        .append(&Record::new().with("x", &row(50)))
        .expect("granted write");
    let (code, message) = refusal(writer_text.append(&Record::new().with("x", &row(50))));
    assert_eq!(code, Some(ErrorCode::NotGranted), "{message}");
    assert!(
        message.contains("no grant to write dataset 'text'"),
        "{message}"
    );

    // Every grant taken back: as before.
    for g in operator.grants().expect("grants") {
        operator.grant(g, true, false).expect("take back");
    }
    assert!(operator.grants().expect("grants").is_empty());
    assert_eq!(text.len().expect("no grants again"), 50);
}

/// A client of `cluster`'s first router with a certificate of `role` issued under `name`.
fn issued(cluster: &SimCluster, role: Role, name: &str) -> Client {
    connect_as(
        cluster,
        cluster.router_addr(),
        issued_security(cluster, role, name),
    )
}

/// A certificate of `role` issued under `name` in `cluster`'s certificate directory.
fn issued_security(cluster: &SimCluster, role: Role, name: &str) -> zr_net::Security {
    let certs = cluster.certs_dir().expect("a secured cluster");
    let home = zr_net::tls::issue_cert(&certs, role, name, 1).expect("issue");
    zr_net::Security::load(&home, role).expect("load")
}

/// `mib_per_second_per_identity`: a reader's gathers move no more than the rate allows, one
/// hop (each node's own allowance) and through the router (the router's; its own requests
/// to the nodes are not limited), and its debt is its own: another reader is served while the
/// first one's next gather still waits.
#[test]
fn a_reader_moves_at_most_its_bytes_per_second_and_others_do_not_wait_for_it() {
    use std::time::Duration;
    const RECORD: usize = 64 << 10;
    const RECORDS: u64 = 64; // 4 MiB, 2 MiB on each node
    const RATE: u64 = 1 << 20;
    // On virtual time, as every limit reads the runtime's clock: the figures are exact,
    // whatever else the machine runs.
    let options = SimOptions {
        mib_per_second_per_identity: Some(RATE >> 20),
        ..options()
    };
    let cluster = SimCluster::start(2, options).expect("cluster");
    let writer = cluster.client().expect("client");
    let rows: Vec<Vec<u8>> = (0..RECORDS)
        .map(|k| zr_tests::bytes(k, RECORD as u64, 1))
        .collect();
    let records: Vec<Record> = rows.iter().map(|r| Record::new().with("x", r)).collect();
    writer.append_many(&records).expect("append");
    writer.commit().expect("commit");
    let all: Vec<u64> = (0..RECORDS).collect();
    let as_reader = |name: &str, direct: bool| {
        let security = issued_security(&cluster, Role::Reader, name);
        let options = zr_router::ClientOptions {
            direct,
            timeout: Duration::from_secs(20),
            ..zr_router::ClientOptions::default()
        };
        (security, options)
    };
    let connect = |name: &str, direct: bool| {
        let (security, options) = as_reader(name, direct);
        let router = cluster.router_addr();
        cluster
            .client_with_security(router, security, options)
            .expect("connect")
    };
    // One server's allowance over `ran`: its burst, its rate, and one gather's share sent
    // before the debt it leaves is known.
    const GATHER: usize = 16; // 1 MiB
    let allowed = |servers: u64, ran: Duration| {
        let share = (GATHER * RECORD) as f64 / servers as f64;
        servers as f64 * (RATE as f64 * (ran.as_secs_f64() + 0.25) + share)
    };
    let mut readers = Vec::new();
    for (name, direct, servers) in [("team-a", true, 2), ("team-c", false, 1)] {
        let reader = connect(name, direct);
        assert_eq!(reader.reads_direct(), direct);
        let (began, mut moved) = (cluster.now(), 0u64);
        for batch in all.chunks(GATHER).cycle() {
            if cluster.now() - began >= Duration::from_secs(2) {
                break;
            }
            moved += reader.gather(batch, &[]).expect("gather")[0].data.len() as u64;
        }
        let ran = cluster.now() - began;
        println!("{name} (one hop: {direct}) moved {moved} bytes in {ran:?} at 1 MiB/s per server");
        assert!(
            (moved as f64) <= allowed(servers, ran),
            "{name} moved {moved} bytes in {ran:?}"
        );
        readers.push(reader);
    }
    // Team A is in debt for seconds on each node; team B is not: B's gather is answered
    // while A's next one still waits.
    let team_a = readers.swap_remove(0);
    team_a.gather(&all, &[]).expect("gather");
    let (security, options) = as_reader("team-b", true);
    let team_b = cluster
        .async_client_with_security(cluster.router_addr(), security, options)
        .expect("connect");
    let (a_done, b_done) = cluster.run(async {
        let a = async {
            let columns = team_a.as_async().gather(&all, &[]).await.expect("gather");
            assert_eq!(columns[0].len(), RECORDS as usize);
            tokio::time::Instant::now()
        };
        let b = async {
            let columns = team_b.gather(&all[..8], &[]).await.expect("gather");
            assert_eq!(columns[0].len(), 8);
            tokio::time::Instant::now()
        };
        tokio::join!(a, b)
    });
    assert!(b_done < a_done, "team-a's debt was forgiven");
}

/// `zr cluster revoke --serial`: one certificate refused by its serial number, one hop and
/// through the router, while another certificate is served; an operator cannot revoke its
/// own certificate's serial, a serial that is not one is refused, and `--undo` serves it
/// again.
#[test]
fn a_certificate_is_revoked_by_its_serial_number() {
    let cluster = loaded(2, 100);
    let certs = cluster.certs_dir().expect("a secured cluster");
    let serial_of = |role: Role, name: &str| {
        let pem = certs
            .join(format!("{}-{name}", role.name()))
            .join(format!("{}.pem", role.name()));
        zr_net::tls::serial_of(&std::fs::read(pem).expect("read")).expect("serial")
    };
    let operator = issued(&cluster, Role::Operator, "ops-1");
    let (team_a, team_b) = (
        issued(&cluster, Role::Reader, "team-a"),
        issued(&cluster, Role::Reader, "team-b"),
    );
    check_all_one_hop(&team_a, 100);
    let (code, message) =
        refusal(operator.revoke_serial(&serial_of(Role::Operator, "ops-1"), false));
    assert_eq!(code, Some(ErrorCode::BadRequest), "{message}");
    assert!(message.contains("comes with"), "{message}");
    let (code, message) = refusal(operator.revoke_serial("not-hex", false));
    assert_eq!(code, Some(ErrorCode::BadRequest), "{message}");
    assert!(
        message.contains("not a certificate serial number"),
        "{message}"
    );

    let serial = serial_of(Role::Reader, "team-a");
    assert_eq!(
        operator
            .revoke_serial(&serial.to_ascii_uppercase(), false)
            .expect("revoke"),
        std::slice::from_ref(&serial)
    );
    let (took, error) = refused_within(&cluster, &team_a, std::time::Duration::from_secs(10));
    assert!(
        error.contains(&format!("serial number {serial} is revoked")),
        "{error}"
    );
    println!("team-a refused one hop {took:?} after its serial's revocation");
    let e = team_a.len().expect_err("the router refuses it too");
    assert!(e.to_string().contains("revoke --serial"), "{e}");
    check_all_one_hop(&team_b, 100);

    assert!(operator
        .revoke_serial(&serial, true)
        .expect("undo")
        .is_empty());
    served_again(&cluster, &team_a);
    check_all(&team_a, 100);
}
