use std::net::SocketAddr;

use bytes::Bytes;

use super::*;
use crate::endpoint::{client_endpoint, connect, server_endpoint};
use crate::link::Link;
use crate::rpc::call;
use crate::security::Security;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

const SECURITY: Security = Security::InsecureDev;
const TIMEOUT: Duration = Duration::from_secs(5);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A loopback server presenting `security`, running `handler` under `limits` until
/// `shutdown`, and a client endpoint: (the server's address, the client endpoint, the
/// server's task).
fn start_as<H, F>(
    security: &Security,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    handler: H,
) -> (SocketAddr, Endpoint, tokio::task::JoinHandle<()>)
where
    H: Fn(Vec<u8>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = (Vec<u8>, Body)> + Send + 'static,
{
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = server_endpoint(loopback, security).unwrap();
    let addr = server.local_addr().unwrap();
    let served = tokio::spawn(async move { serve(&server, limits, shutdown, handler).await });
    (addr, client_endpoint(loopback).unwrap(), served)
}

/// On loopback, packets grow past a network's sizes (discovery climbs from the initial
/// MTU, within what one GSO send may carry), and large messages cross whole both ways.
#[test]
fn loopback_connections_use_large_packets() {
    runtime().block_on(async {
        let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
        let (addr, client, _served) = start_as(
            &SECURITY,
            Limits::new(4, TIMEOUT),
            std::future::pending(),
            echo,
        );
        assert!(client.local_addr().unwrap().ip().is_loopback());
        let connection = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
        let mut message: Vec<u8> = (0..8u32 << 20).map(|k| (k * 7 + k / 4099) as u8).collect();
        message[..4].copy_from_slice(b"ZRW1"); // a zrecord message, or the server hangs up
        let (header, body) = message.split_at(4);
        for _ in 0..2 {
            let body = vec![Bytes::copy_from_slice(body)];
            let reply = call(&connection, header.to_vec(), body, TIMEOUT)
                .await
                .unwrap();
            assert!(reply == message, "the echoed message differs");
        }
        // Discovery reached the largest size in a few probes (each is mostly padding,
        // which the peer reads a byte at a time).
        let path = connection.stats().path;
        assert_eq!(path.current_mtu, Link::Loopback.mtu_max(), "path MTU");
        assert!(
            path.sent_plpmtud_probes <= 5,
            "{} MTU probes sent",
            path.sent_plpmtud_probes
        );
    });
}

/// Moving a cluster to a new CA, one process at a time (ops/README.md): first every
/// process trusts both CAs (`ca.pem` holding the new CA, then the old), then each takes
/// its new certificate. At every step, each pair of processes that the procedure lets
/// meet connects; a process that still trusts only the old CA refuses the new
/// certificates, which is why the first step must reach every process first.
#[test]
fn a_cluster_moves_to_a_new_ca_one_process_at_a_time() {
    use crate::tls::{init_certs, Role, CA_FILE, CERT_VALID_DAYS};
    let scratch = tempfile::tempdir().unwrap();
    let dir = |name: &str| scratch.path().join(name);
    init_certs(&dir("made-old"), CERT_VALID_DAYS).unwrap();
    init_certs(&dir("made-new"), CERT_VALID_DAYS).unwrap();
    // Each CA's node and router files side by side, as an operator copies them.
    for name in ["old", "new"] {
        std::fs::create_dir(dir(name)).unwrap();
        let made = dir(&format!("made-{name}"));
        std::fs::copy(made.join("ca").join(CA_FILE), dir(name).join(CA_FILE)).unwrap();
        for file in ["node.pem", "node.key", "router.pem", "router.key"] {
            let role = file.split('.').next().unwrap();
            std::fs::copy(made.join(role).join(file), dir(name).join(file)).unwrap();
        }
    }
    let both = [
        std::fs::read(dir("new").join(CA_FILE)).unwrap(),
        std::fs::read(dir("old").join(CA_FILE)).unwrap(),
    ]
    .concat();
    // Step 1: the old certificates, trusting both CAs; step 2: the new ones.
    for (step, certificates) in [("trusting", "old"), ("moved", "new")] {
        std::fs::create_dir(dir(step)).unwrap();
        std::fs::write(dir(step).join(CA_FILE), &both).unwrap();
        for entry in std::fs::read_dir(dir(certificates)).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().unwrap() != CA_FILE {
                std::fs::copy(&path, dir(step).join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    let call = |node: &str, router: &str| {
        runtime().block_on(async {
            let node = Security::load(&dir(node), Role::Node).unwrap();
            let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let stopped = async {
                let _ = stopped.await;
            };
            let (addr, client, served) = start_as(&node, Limits::new(4, TIMEOUT), stopped, echo);
            let router = Security::load(&dir(router), Role::Router).unwrap();
            let message = b"ZRW1 hello".to_vec();
            let reply = async {
                let connection = connect(&client, &router, addr, TIMEOUT).await?;
                call(&connection, message.clone(), Vec::new(), TIMEOUT).await
            }
            .await;
            let _ = stop.send(());
            served.await.unwrap();
            reply.map(|r| assert_eq!(r, message))
        })
    };
    for (node, router) in [
        ("old", "trusting"),
        ("trusting", "old"),
        ("trusting", "trusting"),
        ("trusting", "moved"),
        ("moved", "trusting"),
        ("moved", "moved"),
        ("new", "moved"),
    ] {
        call(node, router).unwrap_or_else(|e| panic!("node {node}, router {router}: {e}"));
    }
    for (node, router) in [("old", "moved"), ("moved", "old")] {
        let e = call(node, router).unwrap_err();
        assert!(
            matches!(e, crate::Error::NotAuthorised { .. }),
            "node {node}, router {router}: {e:?}"
        );
        assert!(
            e.to_string().contains("CA"),
            "node {node}, router {router}: {e}"
        );
    }
}

/// Nodes connect to nodes (a replica copying its partner's files) with the node
/// certificate `zr cluster-init` makes now. A node certificate of an earlier version —
/// for serving only — still serves a router, and is refused as a node's client by name,
/// which is what sends the rebuild back to copying record by record.
#[test]
fn nodes_connect_to_nodes_and_older_node_certificates_still_serve() {
    use crate::endpoint::connect_to;
    use crate::link::Windows;
    use crate::tls::{init_certs, issue_node_as_before, Role, CERT_VALID_DAYS};
    let scratch = tempfile::tempdir().unwrap();
    let (now, before) = (scratch.path().join("now"), scratch.path().join("before"));
    init_certs(&now, CERT_VALID_DAYS).unwrap();
    std::fs::create_dir(&before).unwrap();
    for entry in walk(&now) {
        let to = before.join(entry.strip_prefix(&now).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &to).unwrap();
    }
    issue_node_as_before(&before).unwrap();
    let node = |dir: &std::path::Path| Security::load(dir, Role::Node).unwrap();
    let router = Security::load(&now, Role::Router).unwrap();
    let exchange = |server: &Security, client: &Security, as_node: bool| {
        runtime().block_on(async {
            let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let stopped = async {
                let _ = stopped.await;
            };
            let (addr, endpoint, served) = start_as(server, Limits::new(4, TIMEOUT), stopped, echo);
            let message = b"ZRW1 files".to_vec();
            let target = as_node.then_some(Role::Node);
            let reply = async {
                let connection =
                    connect_to(&endpoint, client, addr, TIMEOUT, Windows::DEFAULT, target).await?;
                call(&connection, message.clone(), Vec::new(), TIMEOUT).await
            }
            .await;
            let _ = stop.send(());
            served.await.unwrap();
            reply.map(|r| assert_eq!(r, message))
        })
    };
    exchange(&node(&now), &node(&now), true).expect("node to node");
    exchange(&node(&before), &router, false).expect("an older node serves a router");
    let e = exchange(&node(&now), &node(&before), true).unwrap_err();
    assert!(matches!(e, crate::Error::NotAuthorised { .. }), "{e:?}");
    assert!(e.to_string().contains("zr cluster-renew"), "{e}");
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Shutdown lets a request in flight finish, then refuses new connections.
#[test]
fn shutdown_drains_requests_in_flight() {
    runtime().block_on(async {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // The handler says when it has the request, and answers when let go.
        let (began, release) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        let slow_echo = {
            let (began, release) = (Arc::clone(&began), Arc::clone(&release));
            move |bytes: Vec<u8>| {
                let (began, release) = (Arc::clone(&began), Arc::clone(&release));
                async move {
                    began.notify_one();
                    release.notified().await;
                    (bytes, Body::Ready(Vec::new()))
                }
            }
        };
        let stopped = async {
            let _ = stopped.await;
        };
        let (addr, client, served) =
            start_as(&SECURITY, Limits::new(4, TIMEOUT), stopped, slow_echo);
        let connection = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
        let message = b"ZRW1 echo".to_vec();
        let call = tokio::spawn({
            let message = message.clone();
            async move { call(&connection, message, Vec::new(), TIMEOUT).await }
        });
        began.notified().await;
        let _ = stop.send(());
        // Shutdown has begun with the request in flight; now it may finish.
        tokio::task::yield_now().await;
        release.notify_one();
        // The request in flight is answered in full.
        assert_eq!(call.await.unwrap().unwrap(), message);
        served.await.unwrap();
        // The server is gone: new connections get no answer.
        let again = connect(&client, &SECURITY, addr, Duration::from_millis(300)).await;
        assert!(again.is_err());
    });
}

/// A request cut off by the caller's timeout is reset, never finished: the server never
/// mistakes its first part for a whole message.
#[test]
fn a_request_cut_off_by_a_timeout_never_reaches_the_handler() {
    runtime().block_on(async {
        let seen = Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
        let record_len = {
            let seen = Arc::clone(&seen);
            move |bytes: Vec<u8>| {
                seen.lock().unwrap().push(bytes.len());
                async move { (Vec::new(), Body::Ready(Vec::new())) }
            }
        };
        let limits = Limits::new(4, TIMEOUT);
        let (addr, client, served) =
            start_as(&SECURITY, limits, std::future::pending(), record_len);
        let connection = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
        // Larger than the stream's flow-control window: the send is cut off midway.
        let body = vec![Bytes::from(vec![7u8; 160 << 20])];
        let cut = call(
            &connection,
            b"ZRW1".to_vec(),
            body,
            Duration::from_millis(20),
        )
        .await;
        let cut = cut.unwrap_err();
        assert!(cut.is_timeout(), "{cut:?}");
        assert!(cut.to_string().contains("no reply within"), "{cut}");
        // A whole request afterwards still goes through on the same connection.
        call(&connection, b"ZRW1 small".to_vec(), Vec::new(), TIMEOUT)
            .await
            .unwrap();
        // Give a (wrongly) finished stream time to arrive: most of it was buffered.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            *seen.lock().unwrap(),
            vec![10],
            "the handler saw a cut-off request"
        );
        served.abort();
    });
}

/// An echo server allowing `connections` in total and `per_identity` to one identity
/// (every insecure client is one), the message to send it, and its client endpoint.
fn echo_server(
    connections: usize,
    per_identity: usize,
) -> (SocketAddr, Endpoint, tokio::task::JoinHandle<()>, Vec<u8>) {
    let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
    let limits = Limits {
        connections_per_identity: per_identity,
        ..Limits::new(connections, TIMEOUT)
    };
    let (addr, client, served) = start_as(&SECURITY, limits, std::future::pending(), echo);
    (addr, client, served, b"ZRW1 hello".to_vec())
}

/// `count` connections to `addr`, each answered once.
async fn answered(
    client: &Endpoint,
    addr: SocketAddr,
    message: &[u8],
    count: usize,
) -> Vec<quinn::Connection> {
    let mut open = Vec::new();
    for _ in 0..count {
        let c = connect(client, &SECURITY, addr, TIMEOUT).await.unwrap();
        call(&c, message.to_vec(), Vec::new(), TIMEOUT)
            .await
            .unwrap();
        open.push(c);
    }
    open
}

/// Connections beyond the cap are refused; those within it keep working.
#[test]
fn connections_beyond_the_cap_are_refused() {
    runtime().block_on(async {
        let (addr, client, served, message) = echo_server(2, 2);
        let open = answered(&client, addr, &message, 2).await;
        let third = match connect(&client, &SECURITY, addr, TIMEOUT).await {
            Ok(c) => call(&c, message.clone(), Vec::new(), TIMEOUT).await.err(),
            Err(e) => Some(e),
        };
        assert!(third.is_some(), "a third connection was served");
        for c in &open {
            let reply = call(c, message.clone(), Vec::new(), TIMEOUT).await.unwrap();
            assert_eq!(reply, message);
        }
        served.abort();
    });
}

/// At the cap, a connection idle for [`IDLE_RECLAIM`] makes room for a new one (closed
/// as reclaimed, so its client knows to reconnect); connections in use are kept.
#[test]
fn idle_connections_make_room_at_the_cap() {
    runtime().block_on(async {
        let (addr, client, served, message) = echo_server(2, 2);
        let idle = answered(&client, addr, &message, 1).await.remove(0);
        tokio::time::sleep(IDLE_RECLAIM + Duration::from_millis(200)).await;
        let busy = answered(&client, addr, &message, 1).await.remove(0);
        // Full: the idle one goes, the new one is served, the busy one kept.
        let third = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
        let reply = call(&third, message.clone(), Vec::new(), TIMEOUT).await.unwrap();
        assert_eq!(reply, message);
        let closed = idle.closed().await;
        assert!(
            matches!(&closed, quinn::ConnectionError::ApplicationClosed(c) if c.error_code == VarInt::from_u32(RECLAIMED)),
            "{closed:?}"
        );
        call(&busy, message.clone(), Vec::new(), TIMEOUT).await.unwrap();
        served.abort();
    });
}

/// One identity cannot hold more than its allowance: its connections beyond it are
/// closed (`TOO_MANY`) while none of its own is idle, whatever room is left in total.
#[test]
fn one_identity_cannot_take_every_slot() {
    runtime().block_on(async {
        let (addr, client, served, message) = echo_server(16, 2);
        let open = answered(&client, addr, &message, 2).await;
        let third = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
        let refused = call(&third, message.clone(), Vec::new(), TIMEOUT).await;
        assert!(refused.is_err(), "a third connection of one identity was served");
        assert!(
            matches!(third.close_reason(), Some(quinn::ConnectionError::ApplicationClosed(c)) if c.error_code == VarInt::from_u32(TOO_MANY)),
            "{:?}",
            third.close_reason()
        );
        for c in &open {
            call(c, message.clone(), Vec::new(), TIMEOUT).await.unwrap();
        }
        served.abort();
    });
}

/// Requests share a byte budget: a request larger than the whole budget is refused
/// (reset), requests that fit together all get through, and the endpoint keeps serving.
#[test]
fn requests_share_a_byte_budget() {
    runtime().block_on(async {
        let slow_len = |bytes: Vec<u8>| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            (bytes.len().to_le_bytes().to_vec(), Body::Ready(Vec::new()))
        };
        let limits = Limits {
            request_bytes: 256 << 10,
            request_bytes_per_identity: 256 << 10,
            ..Limits::new(4, TIMEOUT)
        };
        let (addr, client, served) = start_as(&SECURITY, limits, std::future::pending(), slow_len);
        let c = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
        let request = |len: usize| {
            let c = c.clone();
            async move {
                let body = vec![Bytes::from(vec![1u8; len])];
                call(&c, b"ZRW1".to_vec(), body, TIMEOUT).await
            }
        };
        // Too big for the whole budget: refused.
        assert!(request(300 << 10).await.is_err());
        // Four of 100 KiB, twice the budget together: they take turns, all answered.
        let tasks: Vec<_> = (0..4).map(|_| tokio::spawn(request(100 << 10))).collect();
        for task in tasks {
            let reply = task.await.unwrap().unwrap();
            assert_eq!(reply, (4 + (100usize << 10)).to_le_bytes().to_vec());
        }
        served.abort();
    });
}

/// One identity's requests in flight are capped over all its connections: with a cap
/// of 3, eight requests over two connections run at most three at once (and three do:
/// the cap is not a queue of one), and every one is answered.
#[test]
fn one_identity_has_at_most_its_requests_in_flight() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    runtime().block_on(async {
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let handler = {
            let (now, most) = (Arc::clone(&now), Arc::clone(&most));
            move |bytes: Vec<u8>| {
                let (now, most) = (Arc::clone(&now), Arc::clone(&most));
                async move {
                    let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(running, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    (bytes, Body::Ready(Vec::new()))
                }
            }
        };
        let limits = Limits {
            requests_per_identity: 3,
            ..Limits::new(8, TIMEOUT)
        };
        let (addr, client, served) = start_as(&SECURITY, limits, std::future::pending(), handler);
        // On an `--insecure-dev` endpoint, one address is one identity.
        let first = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
        let second = connect(&client, &SECURITY, addr, TIMEOUT).await.unwrap();
        let calls: Vec<_> = (0..8)
            .map(|k| {
                let c = if k % 2 == 0 {
                    first.clone()
                } else {
                    second.clone()
                };
                tokio::spawn(async move { call(&c, b"ZRW1".to_vec(), Vec::new(), TIMEOUT).await })
            })
            .collect();
        for task in calls {
            assert_eq!(task.await.unwrap().unwrap(), b"ZRW1".to_vec());
        }
        assert_eq!(most.load(Ordering::SeqCst), 3, "requests in flight at most");
        served.abort();
    });
}
/// One identity's bytes per second are capped over all its connections, and its debt is
/// its own: with 1 MiB/s, a client echoing 64 KiB messages moves no more than the rate
/// allows over the time it ran (plus a burst and what its requests in flight sent at
/// once), and another certificate's request is answered while the first's next request
/// still waits for its debt.
#[test]
fn one_identity_moves_at_most_its_bytes_per_second() {
    use crate::tls::{init_certs, Role, CERT_VALID_DAYS};
    const RATE: u64 = 1 << 20;
    const MESSAGE: usize = 64 << 10;
    const IN_FLIGHT: usize = 4;
    let scratch = tempfile::tempdir().unwrap();
    init_certs(scratch.path(), CERT_VALID_DAYS).unwrap();
    let load = |role: Role| Security::load(&scratch.path().join(role.name()), role).unwrap();
    runtime().block_on(async {
        let echo = |bytes: Vec<u8>| async move { (bytes, Body::Ready(Vec::new())) };
        // Messages ending in `!` stand for liveness probes: answered however deep in debt.
        let limits = Limits {
            bytes_per_second_per_identity: Some(RATE),
            unpaced: Some(|bytes: &[u8]| bytes.ends_with(b"!")),
            ..Limits::new(8, TIMEOUT)
        };
        let (addr, client, served) =
            start_as(&load(Role::Router), limits, std::future::pending(), echo);
        let first = connect(&client, &load(Role::Reader), addr, TIMEOUT)
            .await
            .unwrap();
        let message = |len: usize| {
            let mut m = b"ZRW1".to_vec();
            m.resize(len, 7);
            m
        };
        let began = Instant::now();
        let moved = Arc::new(AtomicU64::new(0));
        let calls: Vec<_> = (0..IN_FLIGHT)
            .map(|_| {
                let (c, moved) = (first.clone(), Arc::clone(&moved));
                tokio::spawn(async move {
                    while began.elapsed() < Duration::from_millis(1500) {
                        let m = message(MESSAGE);
                        let reply = call(&c, m.clone(), Vec::new(), TIMEOUT).await.unwrap();
                        assert_eq!(reply, m);
                        moved.fetch_add(2 * MESSAGE as u64, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for task in calls {
            task.await.unwrap();
        }
        let (moved, ran) = (moved.load(Ordering::SeqCst), began.elapsed());
        let allowed = RATE as f64 * (ran.as_secs_f64() + 0.25) + (IN_FLIGHT * 2 * MESSAGE) as f64;
        assert!(
            (moved as f64) <= allowed,
            "{moved} bytes in {ran:?}; at most {allowed} allowed"
        );
        assert!(moved >= 4 * MESSAGE as u64, "it moved {moved} bytes at all");
        // Two seconds of debt: its next request waits for them; another identity's
        // does not.
        call(&first, message(RATE as usize), Vec::new(), TIMEOUT)
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let c = first.clone();
            async move { call(&c, b"ZRW1".to_vec(), Vec::new(), TIMEOUT).await }
        });
        // Its probe is not paced: answered while its request still waits.
        call(&first, b"ZRW1 probe!".to_vec(), Vec::new(), TIMEOUT)
            .await
            .unwrap();
        assert!(
            !waiting.is_finished(),
            "the probe was answered only once the debt was paid"
        );
        let other = connect(&client, &load(Role::Writer), addr, TIMEOUT)
            .await
            .unwrap();
        call(&other, b"ZRW1 other".to_vec(), Vec::new(), TIMEOUT)
            .await
            .unwrap();
        assert!(
            !waiting.is_finished(),
            "the first identity's debt was forgiven"
        );
        assert_eq!(waiting.await.unwrap().unwrap(), b"ZRW1".to_vec());
        served.abort();
    });
}
