//! A real etcd server for tests: started on 127.0.0.1 with a temporary data directory,
//! stoppable and restartable on the same ports and data, killed when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{EtcdStore, MetaStore};

/// An etcd server of a test's own.
pub struct TestEtcd {
    child: Option<Child>,
    endpoint: String,
    peer: String,
    data: tempfile::TempDir,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl TestEtcd {
    /// Starts etcd, or `None` where it is not installed (with a note), except under
    /// `CI=true`, where a missing etcd panics: CI must install it.
    pub fn start() -> Option<TestEtcd> {
        let installed = Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("etcd is not installed: CI must install it (apt-get install etcd-server)");
            }
            eprintln!("skipped: etcd is not installed (apt-get install etcd-server)");
            return None;
        }
        let (client, peer) = (
            free_port().expect("a free port"),
            free_port().expect("a free port"),
        );
        let mut etcd = TestEtcd {
            child: None,
            endpoint: format!("http://127.0.0.1:{client}"),
            peer: format!("http://127.0.0.1:{peer}"),
            data: tempfile::tempdir().expect("etcd data directory"),
        };
        etcd.resume();
        Some(etcd)
    }

    /// The client URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Kills the server (its data stays).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports and data.
    pub fn resume(&mut self) {
        self.stop();
        let child = Command::new("etcd")
            .args(["--name", "zr-test", "--data-dir"])
            .arg(self.data.path())
            .args(["--listen-client-urls", &self.endpoint])
            .args(["--advertise-client-urls", &self.endpoint])
            .args(["--listen-peer-urls", &self.peer])
            .args(["--initial-advertise-peer-urls", &self.peer])
            .args(["--initial-cluster", &format!("zr-test={}", self.peer)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
    }

    /// A store on this server under `prefix`, once the server answers (within 20 s).
    pub async fn connect(&self, prefix: &str, timeout: Duration) -> EtcdStore {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match EtcdStore::connect(std::slice::from_ref(&self.endpoint), prefix, timeout).await {
                Ok(store) if store.get("probe").await.is_ok() => return store,
                _ if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Ok(_) | Err(_) => panic!("etcd at {} did not come up", self.endpoint),
            }
        }
    }

    /// Waits until the server answers `store` again (within 20 s).
    pub async fn wait_ready(&self, store: &dyn MetaStore) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while store.get("probe").await.is_err() {
            assert!(
                Instant::now() < deadline,
                "etcd at {} did not come back",
                self.endpoint
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        self.stop();
    }
}
