//! `SimCluster`: S shard servers and a router in one process, on 127.0.0.1 with temporary
//! data directories, running exactly the code the `zr-node` and `zr-router` binaries run.
//! With [`SimOptions::replicas`] R > 1 each shard has R nodes; the methods that take a node
//! number take `shard * R + replica` ([`SimCluster::node`]), which is the shard when R = 1.
//! Nodes can be stopped (gracefully: finish requests, commit), crashed (dropped without a
//! commit), stalled (the address accepts connections but never answers) or replaced by an
//! impostor answering as a test says (`fake_node`), and started again
//! on the same address with their data; routers can be restarted or added. Each node's
//! traffic can suffer loss, delay or a partition (`set_faults`), decided from the cluster's
//! seed (see [`faults`]); a test that uses faults prints the seed, and `ZR_SIM_SEED` replays
//! it.
//!
//! By default the cluster is secured as a real one is: `zr cluster-init`'s CA and
//! certificates in the temporary directory, mutual TLS on every connection.
//!
//! With [`SimOptions::virtual_time`] the cluster runs on one thread with tokio's clock paused,
//! moved on only when every task waits: quinn, the routers' timeouts and the nodes' lease
//! clock read that clock, so timeouts and delays of any length take no real time. Nodes run
//! their store calls inline, and every endpoint draws quinn's random numbers from the seed,
//! so a seed names the whole run, the order of events included: `ZR_SIM_SEED` replays it
//! exactly; each such cluster prints its seed as it starts (seen with a failing test's output).
//! Such a cluster runs only inside [`SimCluster::run`], and its clients are
//! [`SimCluster::async_client`]s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use zr_net::tls::{self, Role};
use zr_net::{self as net, Security};
use zr_proto::placement::EXTENT_RECORDS_DEFAULT;
use zr_router::{AsyncClient, Client, ClientOptions, Router};
use zr_service::config::{
    ClusterConfig, ClusterSection, FieldConfig, RouterConfig, ShardConfig, TlsConfig,
};
use zr_shard::server::Handling;

pub mod faults;
mod lifecycle;
pub use faults::Faults;
use faults::{FaultState, FaultySocket};
use lifecycle::faulty_endpoint;

/// Errors of the simulator: a message.
pub type SimError = Box<dyn std::error::Error + Send + Sync>;

/// How to build a cluster.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// (name, "raw" | "flate") of each field.
    pub fields: Vec<(String, String)>,
    /// Records per placement extent.
    pub extent_records: u64,
    /// Every network wait, in milliseconds.
    pub timeout_ms: u64,
    /// Mutual TLS from a generated cluster CA (true), or `--insecure-dev` (false).
    pub secure: bool,
    /// Seed of the network faults: `ZR_SIM_SEED` if set, else a fresh one.
    pub seed: u64,
    /// Run on virtual time: one thread, tokio's clock paused and moved on only when every
    /// task waits, so timeouts and delays take no real time and the seed names the whole
    /// run, the order of events included (the sockets are still real loopback ones, which
    /// deliver at once). Such a cluster is used through [`SimCluster::run`] and
    /// [`SimCluster::async_client`].
    pub virtual_time: bool,
    /// The metadata store the routers use (an etcd, say); `None`: an embedded store in the
    /// cluster's directory.
    pub metadata: Option<Arc<dyn zr_meta::MetaStore>>,
    /// Nodes holding each shard.
    pub replicas: u32,
    /// The routers' `[router] reply_budget_mib`.
    pub reply_budget_mib: u64,
    /// The routers' `[router] request_budget_mib`.
    pub request_budget_mib: u64,
    /// The routers' `[router] audit_log`.
    pub audit_log: Option<std::path::PathBuf>,
    /// The nodes' `[node] audit_log` (with `{shard}` and `{replica}`).
    pub node_audit_log: Option<String>,
    /// The routers' and nodes' `mib_per_second_per_identity`.
    pub mib_per_second_per_identity: Option<u64>,
}

/// `ZR_SIM_SEED`, or a seed from the clock.
fn default_seed() -> u64 {
    if let Some(seed) = std::env::var("ZR_SIM_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return seed;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    zr_common::hash::mix2(now.as_nanos() as u64, std::process::id() as u64)
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            fields: vec![("data".into(), "raw".into())],
            extent_records: EXTENT_RECORDS_DEFAULT,
            timeout_ms: 5_000,
            secure: true,
            seed: default_seed(),
            virtual_time: false,
            metadata: None,
            replicas: 1,
            reply_budget_mib: zr_service::config::REPLY_BUDGET_MIB_DEFAULT,
            request_budget_mib: zr_service::config::REQUEST_BUDGET_MIB_DEFAULT,
            audit_log: None,
            node_audit_log: None,
            mib_per_second_per_identity: None,
        }
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), String>>,
}

/// A server standing in for a node (see [`SimCluster::fake_node`]).
struct Impostor {
    task: JoinHandle<Result<(), String>>,
    endpoint: quinn::Endpoint,
}

impl Impostor {
    /// Stops it at once and frees its address: its connections are closed (the routers'
    /// heartbeats would otherwise keep them, and so its socket, alive), new ones refused.
    fn stop(self, runtime: &tokio::runtime::Runtime) {
        self.endpoint.set_server_config(None);
        self.endpoint.close(0u32.into(), b"impostor stopped");
        self.task.abort();
        let _ = runtime.block_on(self.task);
    }
}

/// An in-process cluster. See the module documentation.
pub struct SimCluster {
    runtime: Arc<tokio::runtime::Runtime>,
    _data: tempfile::TempDir,
    config: ClusterConfig,
    nodes: Vec<Option<Running>>,
    impostors: Vec<Option<Impostor>>,
    /// Each node's network faults, kept across its restarts.
    faults: Vec<Arc<FaultState>>,
    /// Each node's faults in the files it serves its partners, kept across its restarts.
    ship_faults: Vec<Arc<zr_shard::ship::ShipFaults>>,
    seed: u64,
    virtual_time: bool,
    routers: Vec<(SocketAddr, Running, Arc<Router>)>,
    /// The metadata store the routers use, if not the embedded one.
    metadata: Option<Arc<dyn zr_meta::MetaStore>>,
}

impl SimCluster {
    /// Starts `shards` × `options.replicas` nodes and one router.
    pub fn start(shards: u32, options: SimOptions) -> Result<SimCluster, SimError> {
        let replicas = options.replicas.max(1);
        let count = shards * replicas;
        let runtime = if options.virtual_time {
            // Printed for every cluster on virtual time: a test that fails shows the seed
            // that replays it.
            eprintln!(
                "a cluster on virtual time, seed {0} (ZR_SIM_SEED={0} replays this run)",
                options.seed
            );
            // Everything runs on this thread, its endpoints' randomness drawn from the seed.
            net::seed_endpoints_on_this_thread(Some(options.seed));
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()?
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("zr-sim")
                .enable_all()
                .build()?
        };
        let data = tempfile::tempdir()?;
        let loopback: SocketAddr = "127.0.0.1:0".parse()?;
        let tls = if options.secure {
            let certs = data.path().join("certs");
            tls::init_certs(&certs, tls::CERT_VALID_DAYS)?;
            Some(TlsConfig { certs })
        } else {
            None
        };
        let node_security = match &tls {
            Some(tls) => Security::load(&tls.certs, Role::Node)?,
            None => Security::InsecureDev,
        };
        // Bind every node first: the configuration needs their ports.
        let faults: Vec<Arc<FaultState>> = (0..count)
            .map(|node| Arc::new(FaultState::new(options.seed, node)))
            .collect();
        let endpoints = {
            let _guard = runtime.enter();
            faults
                .iter()
                .map(|state| faulty_endpoint(loopback, &node_security, state))
                .collect::<Result<Vec<_>, _>>()?
        };
        let shard_configs = endpoints
            .iter()
            .enumerate()
            .map(|(node, e)| {
                let (id, replica) = (node as u32 / replicas, node as u32 % replicas);
                let dir = if replica == 0 {
                    format!("shard-{id}")
                } else {
                    format!("shard-{id}-r{replica}")
                };
                Ok(ShardConfig {
                    id,
                    replica,
                    addr: e.local_addr()?,
                    data: Some(data.path().join(dir)),
                    metrics: None,
                })
            })
            .collect::<Result<Vec<_>, std::io::Error>>()?;
        let config = ClusterConfig {
            cluster: ClusterSection {
                shards,
                extent_records: options.extent_records,
                seed: 0,
                replicas,
            },
            fields: options
                .fields
                .iter()
                .map(|(name, compress)| FieldConfig {
                    name: name.clone(),
                    compress: compress.clone(),
                })
                .collect(),
            shards: shard_configs,
            router: RouterConfig {
                listen: loopback,
                timeout_ms: options.timeout_ms,
                metrics: None,
                reply_budget_mib: options.reply_budget_mib,
                request_budget_mib: options.request_budget_mib,
                requests_per_identity: zr_net::REQUESTS_PER_IDENTITY_DEFAULT,
                mib_per_second_per_identity: options.mib_per_second_per_identity,
                audit_log: options.audit_log.clone(),
            },
            node: zr_service::config::NodeConfig {
                audit_log: options.node_audit_log.clone(),
                mib_per_second_per_identity: options.mib_per_second_per_identity,
                ..Default::default()
            },
            metadata: Some(zr_service::config::MetadataConfig {
                dir: Some(data.path().join("metadata")),
                ..Default::default()
            }),
            tls,
            origin: "simulated cluster".into(),
        };
        let mut cluster = SimCluster {
            runtime: Arc::new(runtime),
            _data: data,
            config,
            nodes: Vec::new(),
            impostors: (0..count).map(|_| None).collect(),
            faults,
            ship_faults: (0..count).map(|_| Arc::default()).collect(),
            seed: options.seed,
            virtual_time: options.virtual_time,
            routers: Vec::new(),
            metadata: options.metadata.clone(),
        };
        for (node, endpoint) in endpoints.into_iter().enumerate() {
            let running = cluster.run_node(node as u32, endpoint)?;
            cluster.nodes.push(Some(running));
        }
        cluster.add_router()?;
        Ok(cluster)
    }

    /// The cluster's configuration (with the ports actually bound).
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Credentials for `role` (as the binaries load them from nodes.toml).
    pub fn security(&self, role: Role) -> Result<Security, SimError> {
        Ok(self.config.security(role, self.config.tls.is_none())?)
    }

    /// The certificate directory (`None` for an insecure cluster).
    pub fn certs_dir(&self) -> Option<PathBuf> {
        self.config.tls.as_ref().map(|t| t.certs.clone())
    }

    /// Node `node`'s data directory.
    pub fn data_dir(&self, node: u32) -> PathBuf {
        let (shard, replica) = self.place(node);
        self.config.node_data_dir(shard, replica)
    }

    /// The number of shard `shard`'s replica `replica` (what the node methods take).
    pub fn node(&self, shard: u32, replica: u32) -> u32 {
        shard * self.config.cluster.replicas + replica
    }

    /// Node `node`'s shard and replica.
    pub fn place(&self, node: u32) -> (u32, u32) {
        let replicas = self.config.cluster.replicas;
        (node / replicas, node % replicas)
    }

    /// How many nodes there are (shards × replicas).
    pub fn node_count(&self) -> u32 {
        self.config.cluster.shards * self.config.cluster.replicas
    }

    fn run_node(&self, node: u32, endpoint: quinn::Endpoint) -> Result<Running, SimError> {
        let (shard, replica) = self.place(node);
        let timeout = Duration::from_millis(self.config.router.timeout_ms);
        self.runtime.block_on(zr_shard::server::upgrade_layout(
            &self.config,
            &self.data_dir(node),
            shard,
            timeout,
        ))?;
        let store =
            zr_shard::server::open_shard_store(&self.config, &self.data_dir(node), shard, replica)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let timeout = Duration::from_millis(self.config.router.timeout_ms);
        let handling = if self.virtual_time {
            Handling::Inline
        } else {
            Handling::Adaptive
        };
        let meta = self.metadata()?;
        let addr = endpoint.local_addr()?.to_string();
        let reads = Arc::new(zr_meta::nodes::ReadLease::new(self.config.cluster.replicas));
        let security = Some(self.security(Role::Node)?);
        let ship_faults = Arc::clone(&self.ship_faults[node as usize]);
        let audit = match self.config.node.audit_path(shard, replica) {
            Some(path) => Some(Arc::new(zr_service::audit::AuditLog::open(&path)?)),
            None => None,
        };
        let bytes_per_second_per_identity =
            zr_service::config::bytes_per_second(self.config.node.mib_per_second_per_identity);
        let task = self.runtime.spawn(async move {
            // The node's liveness lease, stopped with the node (or its crash).
            let mut lease = tokio::task::JoinSet::new();
            let kept = Arc::clone(&reads);
            let access = Arc::new(zr_meta::access::AccessControl::default());
            // Read before the first request; a store that cannot answer yet is read again by
            // the watch.
            let _ = access.refresh(&*meta).await;
            lease.spawn(zr_meta::access::watch(
                Arc::clone(&meta),
                Arc::clone(&access),
            ));
            lease.spawn(zr_meta::nodes::keep_alive(meta, shard, replica, addr, kept));
            let serving = zr_shard::server::Serving {
                timeout,
                handling,
                reads,
                security,
                ship_faults: Some(ship_faults),
                access,
                audit,
                bytes_per_second_per_identity,
            };
            zr_shard::server::serve_with(endpoint, store, serving, async {
                let _ = stopped.await;
            })
            .await
            .map_err(|e| e.to_string())
        });
        Ok(Running { stop, task })
    }

    /// The seed the network faults are decided from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// From now on, shard `shard`'s node's traffic suffers `faults` (also after a restart);
    /// `Faults::default()` heals it.
    pub fn set_faults(&self, shard: u32, faults: Faults) -> Result<(), SimError> {
        let state = self.faults.get(shard as usize).ok_or("no such shard")?;
        state.set(faults);
        Ok(())
    }

    /// Node `node`'s faults in the pieces of files it serves its partners (a rebuild's or a
    /// move's copy), kept across its restarts: e.g. `damage_next_pieces`.
    pub fn ship_faults(&self, node: u32) -> Result<&zr_shard::ship::ShipFaults, SimError> {
        Ok(self
            .ship_faults
            .get(node as usize)
            .ok_or("no such node")?
            .as_ref())
    }

    /// Datagrams to or from shard `shard`'s node lost so far to `Faults::loss`.
    pub fn datagrams_lost(&self, shard: u32) -> u64 {
        self.faults.get(shard as usize).map_or(0, |state| {
            state.lost.load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// The first router's address.
    pub fn router_addr(&self) -> SocketAddr {
        self.routers[0].0
    }

    /// Router `index` (in the order of [`Self::router_addrs`]) itself.
    pub fn router(&self, index: usize) -> Option<Arc<Router>> {
        self.routers
            .get(index)
            .map(|(_, _, router)| Arc::clone(router))
    }

    /// Every router's address.
    pub fn router_addrs(&self) -> Vec<SocketAddr> {
        self.routers.iter().map(|(addr, _, _)| *addr).collect()
    }

    /// A client timeout fitting the router's: long enough for the router's own timeout to
    /// fire first and name the failed shard.
    pub fn client_timeout(&self) -> Duration {
        Duration::from_millis(3 * self.config.router.timeout_ms + 1000)
    }

    /// A client of the first router, with the operator role (everything: the tests drive
    /// moves and repairs through it). On a cluster on virtual time its calls run on the
    /// cluster's runtime, and drive the cluster while they run: between calls the cluster
    /// stands still, so a test waits with [`SimCluster::pause`], never a thread's sleep.
    pub fn client(&self) -> Result<Client, SimError> {
        self.client_with(true)
    }

    /// [`SimCluster::client`], its gathers through the router rather than one hop.
    pub fn client_via_router(&self) -> Result<Client, SimError> {
        self.client_with(false)
    }

    /// A client of the first router connected as `options` say (its timeout: the
    /// cluster's client timeout), with the operator role.
    pub fn client_with_options(&self, options: ClientOptions) -> Result<Client, SimError> {
        self.client_of(self.router_addr(), Role::Operator, options)
    }

    /// A client of the router at `router` with `role`'s certificate, connected as `options`
    /// say (its timeout: the cluster's client timeout). On virtual time its calls run on
    /// the cluster's runtime (see [`SimCluster::client`]).
    pub fn client_of(
        &self,
        router: SocketAddr,
        role: Role,
        options: ClientOptions,
    ) -> Result<Client, SimError> {
        self.client_with_security(router, self.security(role)?, self.timed(options))
    }

    /// `options` with the cluster's client timeout.
    fn timed(&self, options: ClientOptions) -> ClientOptions {
        ClientOptions {
            timeout: self.client_timeout(),
            ..options
        }
    }

    /// A client of the router at `router` presenting `security` (a certificate issued
    /// under a name, say), connected as `options` say; on virtual time its calls run on the
    /// cluster's runtime (see [`SimCluster::client`]).
    pub fn client_with_security(
        &self,
        router: SocketAddr,
        security: Security,
        options: ClientOptions,
    ) -> Result<Client, SimError> {
        if self.virtual_time {
            let inner = self.async_client_with_security(router, security, options)?;
            return Ok(Client::on_runtime(Arc::clone(&self.runtime), inner));
        }
        Ok(Client::connect_with(router, security, options)?)
    }

    /// An async client of the router at `router` with `role`'s certificate, connected as
    /// `options` say (its timeout: the cluster's client timeout), on the cluster's runtime:
    /// use it inside [`SimCluster::run`].
    pub fn async_client_with(
        &self,
        router: SocketAddr,
        role: Role,
        options: ClientOptions,
    ) -> Result<AsyncClient, SimError> {
        let (security, options) = (self.security(role)?, self.timed(options));
        self.async_client_with_security(router, security, options)
    }

    /// An async client of the router at `router` presenting `security`, connected as
    /// `options` say, on the cluster's runtime: use it inside [`SimCluster::run`].
    pub fn async_client_with_security(
        &self,
        router: SocketAddr,
        security: Security,
        options: ClientOptions,
    ) -> Result<AsyncClient, SimError> {
        Ok(self.run(AsyncClient::connect_with(router, security, options))?)
    }

    fn client_with(&self, direct: bool) -> Result<Client, SimError> {
        self.client_with_options(ClientOptions {
            direct,
            ..ClientOptions::default()
        })
    }

    /// An async client of the first router, on the cluster's runtime: use it inside
    /// [`SimCluster::run`].
    pub fn async_client(&self) -> Result<AsyncClient, SimError> {
        self.async_client_of(self.router_addr())
    }

    /// An async client of the router at `router` (see [`SimCluster::async_client`]), with
    /// the operator role.
    pub fn async_client_of(&self, router: SocketAddr) -> Result<AsyncClient, SimError> {
        self.async_client_with(router, Role::Operator, ClientOptions::default())
    }

    /// Lets the cluster run for `duration` on its clock: on virtual time, the clock moves on
    /// that much (taking no real time) with every node and router running meanwhile; on
    /// real time, a sleep.
    pub fn pause(&self, duration: Duration) {
        self.run(async move { tokio::time::sleep(duration).await });
    }

    /// The cluster's clock: virtual on virtual time. Deadlines of a test that waits with
    /// [`SimCluster::pause`] are on this clock.
    pub fn now(&self) -> tokio::time::Instant {
        let _guard = self.runtime.enter();
        tokio::time::Instant::now()
    }

    /// Runs `future` to completion on the cluster's runtime (on a cluster on virtual time,
    /// the only way it runs).
    pub fn run<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// The cluster's metadata store (embedded, in the cluster's directory), its calls run
    /// on the calling task so that a cluster on virtual time replays exactly.
    pub fn metadata(&self) -> Result<Arc<dyn zr_meta::MetaStore>, SimError> {
        if let Some(store) = &self.metadata {
            return Ok(Arc::clone(store));
        }
        let dir = match self.config.metadata_location() {
            zr_service::config::MetadataLocation::Embedded(dir) => dir,
            other => {
                return Err(format!("a simulated cluster keeps no metadata in {other:?}").into())
            }
        };
        let store = zr_meta::EmbeddedStore::open(dir)?;
        // On virtual time each call runs on the calling task (a blocking thread would let the
        // clock jump meanwhile); otherwise on blocking threads, off the cluster's workers.
        Ok(if self.virtual_time {
            Arc::new(store.inline())
        } else {
            Arc::new(store)
        })
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        if self.virtual_time {
            net::seed_endpoints_on_this_thread(None);
        }
        for (_, running, _) in std::mem::take(&mut self.routers) {
            let _ = self.finish(running);
        }
        for shard in 0..self.nodes.len() {
            let _ = self.stop_node(shard as u32);
            if let Some(impostor) = self.impostors[shard].take() {
                impostor.stop(&self.runtime);
            }
        }
    }
}
