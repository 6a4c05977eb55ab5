//! The binaries as a user runs them: two `zr-node`s and a `zr-router` from one nodes.toml,
//! a client loading and gathering through them, SIGTERM shutting them down cleanly, and the
//! data there again after a restart.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use zr_common::Record;
use zr_router::Client;

/// The binaries under test: `zr-router` is this package's; `zr-node` sits beside it in the
/// same target directory (`cargo test --workspace` builds both).
fn binary(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_zr-router")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn write_config(dir: &Path) -> (PathBuf, String) {
    let (n0, n1, router) = (free_port(), free_port(), free_port());
    let text = format!(
        r#"
[cluster]
shards = 2
[[field]]
name = "x"
[[shard]]
id = 0
addr = "127.0.0.1:{n0}"
data = "{d0}"
[[shard]]
id = 1
addr = "127.0.0.1:{n1}"
data = "{d1}"
[router]
listen = "127.0.0.1:{router}"
timeout_ms = 3000
"#,
        d0 = dir.join("s0").display(),
        d1 = dir.join("s1").display()
    );
    let path = dir.join("nodes.toml");
    std::fs::write(&path, text).unwrap();
    (path, format!("127.0.0.1:{router}"))
}

fn spawn(binary: &Path, args: &[&str]) -> Child {
    Command::new(binary)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn terminate(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exited with {status} after SIGTERM");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "did not stop within 20 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Connects once the router is up (it starts after the nodes answer).
fn connect(addr: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::connect_with_timeout(addr.parse().unwrap(), Duration::from_secs(2)) {
            Ok(client) => return client,
            Err(e) => {
                assert!(Instant::now() < deadline, "router never came up: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn start(node: &Path, router: &Path, config: &Path) -> Vec<Child> {
    let config = config.to_str().unwrap();
    let nodes = vec![
        spawn(node, &["--shard", "0", "--nodes", config]),
        spawn(node, &["--shard", "1", "--nodes", config]),
    ];
    // The router needs the nodes; it fails fast if they are not up yet, so retry it.
    let mut all = nodes;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut router = spawn(router, &["--nodes", config]);
        std::thread::sleep(Duration::from_millis(300));
        if router.try_wait().unwrap().is_none() {
            all.push(router);
            return all;
        }
        assert!(Instant::now() < deadline, "the router kept exiting");
    }
}

#[test]
fn binaries_serve_a_cluster_and_stop_cleanly() {
    let (node, router) = (binary("zr-node"), binary("zr-router"));
    let tmp = tempfile_dir();
    let (config, addr) = write_config(&tmp);

    let processes = start(&node, &router, &config);
    let client = connect(&addr);
    let rows: Vec<Vec<u8>> = (0..300u32)
        .map(|i| format!("row {i}").repeat(1 + i as usize % 7).into_bytes())
        .collect();
    let records: Vec<Record> = rows.iter().map(|r| Record::new().with("x", r)).collect();
    assert_eq!(client.append_many(&records).unwrap(), 0..300);
    client.commit().unwrap();
    let indices: Vec<u64> = (0..300).rev().collect();
    let columns = client.gather(&indices, &[]).unwrap();
    for (pos, &i) in indices.iter().enumerate() {
        assert_eq!(columns[0].get(pos).unwrap(), &rows[i as usize][..]);
    }
    drop(client);
    // Router first, then the nodes: each exits 0 on SIGTERM.
    let mut processes = processes;
    terminate(processes.pop().unwrap());
    for p in processes {
        terminate(p);
    }

    // Everything again from the data directories.
    let processes = start(&node, &router, &config);
    let client = connect(&addr);
    assert_eq!(client.len().unwrap(), 300);
    let columns = client.gather(&[299, 0], &["x"]).unwrap();
    assert_eq!(columns[0].get(0).unwrap(), &rows[299][..]);
    drop(client);
    for p in processes.into_iter().rev() {
        terminate(p);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zr-processes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
