//! The router: accepts clients over QUIC, scatters each gather as one sub-request per
//! involved shard (concurrently), reassembles in the caller's order, and routes writes.
//!
//! It keeps no per-record state: the placement is a pure function of the cluster map (held
//! in an `ArcSwap` and read lock-free), and the global length is recomputed from the nodes at
//! start-up — so a restarted router, or two at once, give the same answers. Writes are
//! serialized by one lock here and by the cluster's write lease across routers
//! (`writes.rs`), so concurrent appenders get disjoint, consecutive ranges.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use quinn::Endpoint;
use tokio::sync::Mutex;
use zr_net::{self as net, Body};
use zr_proto::placement::Placement;
use zr_proto::wire::{self, ClientMessage, ClientRequest, FieldInfo, NodeRequest, Reply};
use zr_service::config::ClusterConfig;

use crate::budget::ReplyBudget;
use crate::error::{Error, Failure};
use crate::nodes::{NodeId, Nodes};
use crate::plan::plan_gather;
use crate::startup;
use zr_coord::dataset::DatasetState;
use zr_coord::status::Answer;
use zr_coord::{Coordinator, DatasetKey};
use zr_meta::cluster::{self, ClusterRecord};
use zr_meta::MetaStore;

mod datasets;
mod lease;
mod moves;
pub(crate) use moves::placement_of;
pub use zr_coord::moving::MoveStep;
mod lens;
mod rebuild;
mod scrub;
mod serve;
mod start;
mod writes;

/// Most client connections one certificate may hold open on a router at once (its idle ones
/// are reclaimed first): one job's leaks cannot take every slot.
pub const CONNECTIONS_PER_IDENTITY_MAX: usize = 256;
/// Most client connections a router serves at once.
pub const CONNECTIONS_MAX: usize = 1024;

/// How long a starting router waits for each node's first answer: one that does not answer
/// by then counts as down (its heartbeats find it later), so a router starts within this
/// long whatever nodes are down.
const START_PROBE: Duration = Duration::from_secs(2);

/// How often the router reads the cluster map, at the latest (a node refusing a request as
/// placed by another map makes it read the map at once).
const MAP_RELOAD_EVERY: Duration = Duration::from_secs(1);
/// Shortest pause between two reloads: refusals that keep coming (a stopped move's switch
/// failing the same way each time it is tried) are answered at this pace, not in a loop.
const MAP_RELOAD_PAUSE: Duration = Duration::from_millis(20);

/// How often the router's gauges are set.
const GAUGES_EVERY: Duration = Duration::from_secs(5);

/// Writes of a streamed gather queued for the client's stream.
const FRAMES_QUEUED: usize = 8;

/// The links to the nodes `config` (nodes.toml) lists, their replica marks and liveness
/// leases kept in `meta`.
pub(crate) fn links_of(
    config: &ClusterConfig,
    security: net::Security,
    meta: Arc<dyn MetaStore>,
    coordinator: Option<Arc<std::sync::Mutex<Coordinator>>>,
) -> Result<Nodes, Error> {
    let entries: Vec<_> = config
        .shards
        .iter()
        .map(|s| (s.id, s.replica, s.addr))
        .collect();
    Nodes::for_router(
        &entries,
        config.cluster.shards,
        config.cluster.replicas,
        security,
        Duration::from_millis(config.router.timeout_ms),
        meta,
        coordinator,
    )
}

/// What a router knows of the cluster as a whole, and how it serves: one per router,
/// shared by every dataset's [`Router`].
pub(crate) struct Cluster {
    /// The links to the nodes; what they learn is decided in `coordinator`.
    nodes: Arc<Nodes>,
    /// The longest a call to a node or to the metadata store takes.
    timeout: Duration,
    /// The cluster's metadata: its id, map and committed length.
    meta: Arc<dyn MetaStore>,
    cluster_id: String,
    /// Where every dataset's records are: the placement by the cluster's map, and that
    /// map's version (`Placement::version`), published whole.
    placement: ArcSwap<Placement>,
    /// The named datasets' routers.
    named: std::sync::RwLock<std::collections::BTreeMap<String, Arc<Router>>>,
    /// The lock an adoption of the record's datasets takes (`datasets.rs`).
    adopting: Mutex<()>,
    /// What it knows and decides: the replica set with the nodes' liveness (which `nodes`
    /// steps), the move it runs, the catch-ups running, the revision of the record whose
    /// datasets it follows, and each dataset's state, the default one's and every named
    /// one's (see [`zr_coord::coordinator`]). Locked for a moment, never across an await,
    /// and never while calling on `nodes`.
    coordinator: Arc<std::sync::Mutex<Coordinator>>,
    /// The bytes of gather replies held at once (see `budget.rs`).
    replies: Arc<ReplyBudget>,
    /// Bytes of requests read or handled at once (`[router] request_budget_mib`).
    request_budget: usize,
    /// Requests one identity has in flight at once (`[router] requests_per_identity`).
    requests_per_identity: usize,
    /// Bytes per second one identity moves through it (`[router] mib_per_second_per_identity`).
    bytes_per_second_per_identity: Option<u64>,
    /// The failed requests' log lines each client identity may cause.
    log_budget: std::sync::Mutex<zr_service::logging::LogBudget>,
    /// The address this router serves clients on, once it does.
    listening: std::sync::OnceLock<SocketAddr>,
    /// Revoked certificate names and grants (`zr cluster revoke`, `zr grant`), as last read
    /// from the metadata store.
    access: Arc<zr_meta::access::AccessControl>,
    /// Where admin actions, commits and refused requests are written (`[router] audit_log`).
    audit: Option<Arc<zr_service::audit::AuditLog>>,
    /// Set once by [`Router::kill`]: every task the router runs in the background ends at
    /// once (see [`Router::spawn`]).
    killed: tokio::sync::watch::Sender<bool>,
}

/// The router's state of one dataset, beside the [`Cluster`] every dataset shares: the
/// router of the default dataset is the one that serves, and sends each request to its
/// dataset's (`datasets.rs`). See the module documentation.
pub struct Router {
    cluster: Arc<Cluster>,
    /// The dataset served (`None`: the default one).
    dataset: Option<Arc<str>>,
    /// Its id (0 for the default dataset).
    dataset_id: u64,
    /// Its state in the coordinator: its fields, its lengths (served, committed, rewritten
    /// since the last commit, the shards missing data), its writer lease (`lease.rs`) and
    /// whether it was dropped (see [`zr_coord::dataset`]). Opened with the router, closed
    /// when the last handle of it is dropped.
    key: DatasetKey,
    writes: Mutex<()>,
    /// Where the dataset's writer lease is kept in the metadata store.
    writer_key: String,
    /// Wakes the consumers waiting on records (`datasets.rs`) when the committed length
    /// changes, or the dataset is dropped; they read both from `state`.
    committed_watch: tokio::sync::watch::Sender<()>,
    /// Whether a task reads commits through other routers for the waiters (`datasets.rs`).
    watching_commits: std::sync::atomic::AtomicBool,
}

impl Cluster {
    fn coordinator(&self) -> std::sync::MutexGuard<'_, Coordinator> {
        self.coordinator.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One dataset's state in the coordinator, its lock held: see [`Router::state`].
pub(crate) struct DatasetGuard<'a> {
    coordinator: std::sync::MutexGuard<'a, Coordinator>,
    key: DatasetKey,
}

/// A router's dataset is open in the coordinator from the router's making to its drop.
const OPEN: &str = "a router's dataset is open in its coordinator while the router lives";

impl std::ops::Deref for DatasetGuard<'_> {
    type Target = DatasetState;

    fn deref(&self) -> &DatasetState {
        self.coordinator.dataset(self.key).expect(OPEN)
    }
}

impl std::ops::DerefMut for DatasetGuard<'_> {
    fn deref_mut(&mut self) -> &mut DatasetState {
        self.coordinator.dataset_mut(self.key).expect(OPEN)
    }
}

impl Drop for Router {
    /// Its dataset's state leaves the coordinator with its last handle.
    fn drop(&mut self) {
        self.cluster.coordinator().close(self.key);
    }
}

/// Opens the metadata store `config` names (`[metadata]`).
pub async fn open_metadata(config: &ClusterConfig) -> Result<Arc<dyn MetaStore>, Error> {
    let timeout = Duration::from_millis(config.router.timeout_ms);
    Ok(zr_meta::open(&config.metadata_location(), timeout).await?)
}

impl Router {
    /// Bytes of gather replies this router holds now: received from nodes and not yet
    /// acknowledged by their clients (at most `[router] reply_budget_mib`).
    pub fn reply_bytes_held(&self) -> usize {
        self.cluster.replies.held()
    }

    /// Runs `task` in the background until it ends or the router is killed, whichever
    /// comes first: every task the router starts goes through here, so that a killed
    /// router runs nothing more.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut killed = self.cluster.killed.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                biased;
                // Killed (or the router gone: nothing of it is left to run for).
                _ = killed.wait_for(|killed| *killed) => {}
                () = task => {}
            }
        });
    }

    /// Ends everything the router runs in the background at once, wherever it is, as a
    /// process's death would: a move goes no further, the writer lease is not given back
    /// (it lapses), nothing more is written to the nodes or the metadata store by it. For
    /// tests that kill a router (the simulator's `kill_router`); its serving is stopped by
    /// its caller. Its heartbeats end too, whoever still holds the router; its links close
    /// once the last of it is dropped.
    pub fn kill(&self) {
        self.cluster.killed.send_replace(true);
        self.nodes().stop();
    }

    /// Heartbeats this router has sent its nodes so far.
    pub fn heartbeats(&self) -> u64 {
        self.nodes().heartbeats()
    }

    /// What the router knows and decides, every dataset's state among it, locked for a
    /// moment (the guard cannot be held across an await: it is not `Send`). Never taken
    /// twice in one statement or while [`Self::state`]'s guard is held: it is one lock.
    pub(crate) fn coordinator(&self) -> std::sync::MutexGuard<'_, Coordinator> {
        self.cluster.coordinator()
    }

    /// The links to the nodes, shared by every dataset.
    pub(crate) fn nodes(&self) -> &Arc<Nodes> {
        &self.cluster.nodes
    }

    /// The dataset this router's node requests address (`None`: the default one).
    pub(crate) fn on(&self) -> Option<&str> {
        self.dataset.as_deref()
    }

    /// The dataset's name.
    pub fn dataset_name(&self) -> &str {
        self.dataset.as_deref().unwrap_or(wire::DEFAULT_DATASET)
    }

    /// The dataset's fields now.
    pub(crate) fn fields(&self) -> Vec<FieldInfo> {
        self.state().fields().to_vec()
    }

    /// What is known of the dataset, locked for a moment: the coordinator's lock (the guard
    /// cannot be held across an await: it is not `Send`).
    pub(crate) fn state(&self) -> DatasetGuard<'_> {
        DatasetGuard {
            coordinator: self.cluster.coordinator(),
            key: self.key,
        }
    }

    /// Notes `len` as the committed length, waking the consumers waiting if it changed.
    pub(crate) fn set_committed(&self, len: u64) {
        let changed = self.state().lengths.set_committed(len);
        if changed {
            self.committed_watch.send_modify(|_| {});
        }
    }

    /// A write's outcome; a rewrite in place is noted for the next commit to count.
    pub(crate) async fn rewrite<T>(
        &self,
        write: impl std::future::Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let outcome = write.await;
        if outcome.is_ok() {
            self.state().lengths.rewrote();
        }
        outcome
    }

    /// `zr cluster replace-node`: shard `shard`'s replica `replica` is served from the node
    /// at `addr` from now on, rebuilt first from an in-sync partner (the catch-up task does
    /// it, online). Recorded holding every dataset's write lock and lease, so no write is in
    /// flight to the old node meanwhile, and every router writes next by the new record (a
    /// router reads it afresh whenever it takes a lease).
    async fn replace_node(
        self: &Arc<Self>,
        shard: u32,
        replica: u32,
        addr: &str,
    ) -> Result<(), Failure> {
        let nodes: Vec<_> = self
            .nodes()
            .all()
            .map(|n| {
                (
                    self.nodes().shard(n),
                    self.nodes().replica(n),
                    self.nodes().addr(n),
                )
            })
            .collect();
        let layout = zr_coord::record::Layout {
            shards: self.nodes().shards(),
            replicas: self.nodes().replicas(),
            nodes: &nodes,
            router: self.cluster.listening.get().copied(),
        };
        let addr = zr_coord::record::replacement(shard, replica, addr, &layout)
            .map_err(Failure::BadRequest)?;
        let all = self.all_routers();
        Router::exclusive_all(&all, || {
            Box::pin(self.nodes().move_replica(shard, replica, addr))
        })
        .await
    }

    /// The cluster as this router sees it now: every node asked at once.
    async fn status(&self) -> wire::ClusterStatus {
        let moving = match cluster::load(&*self.cluster.meta).await {
            Ok(Some((record, _))) => {
                self.set_committed(record.committed_len);
                record.moving.map(|moving| self.describe_move(&moving))
            }
            Ok(None) => None,
            Err(e) => {
                tracing::debug!("status: {e}");
                None
            }
        };
        let committed = self.state().lengths.committed();
        let placement = self.cluster.placement.load_full();
        let answers = self.each_node_info(None).await;
        let rebuilds = self.coordinator().catch_ups.clone();
        let nodes = answers
            .into_iter()
            .enumerate()
            .map(|(node, answer)| {
                let shard = self.nodes().shard(node);
                let in_sync = self.nodes().in_sync(node);
                let share = placement.shard_len(shard, committed);
                let answer = match answer {
                    Ok((len, _)) => Answer::Holds(len),
                    Err(Failure::ShardRefused { message, .. }) => Answer::Refused(message),
                    Err(failure) => Answer::Down(failure.to_string()),
                };
                let (state, records) = zr_coord::status::node_state(answer, in_sync, share);
                wire::NodeStatus {
                    shard,
                    replica: self.nodes().replica(node),
                    in_sync,
                    rebuild: rebuilds
                        .get(&node)
                        .map(|p| p.describe(tokio::time::Instant::now().into_std())),
                    addr: self.nodes().addr(node).to_string(),
                    state,
                    records,
                    last_seen_ms: self.nodes().last_seen(node).map(|d| d.as_millis() as u64),
                    lease: self.nodes().lease(node),
                    rtt_us: self.nodes().rtt(node).map(|d| d.as_micros() as u64),
                }
            })
            .collect();
        wire::ClusterStatus {
            cluster: self.cluster.cluster_id.clone(),
            map_version: self.cluster.placement.load().version(),
            committed_len: committed,
            len: self.len(),
            nodes,
            moving,
        }
    }

    /// What a client reading one hop needs: the map this dataset is placed by, every node
    /// and whether it is in sync, the length (read afresh from the nodes if `covering` is
    /// past it, as for a gather of that index), and the shards it must read through this
    /// router.
    /// A node refusing the length as placed by another map fails it (the cluster moved: the
    /// client asks again once this router has the new map).
    async fn topology(&self, covering: u64) -> Result<wire::Topology, Failure> {
        let len = self.len_covering(covering).await?;
        let placement = self.cluster.placement.load_full();
        let nodes = self
            .nodes()
            .all()
            .map(|node| wire::NodeAddr {
                shard: self.nodes().shard(node),
                replica: self.nodes().replica(node),
                addr: self.nodes().addr(node).to_string(),
                in_sync: self.nodes().in_sync(node),
            })
            .collect();
        let missing = self.state().lengths.missing_shards();
        Ok(wire::Topology {
            cluster: self.cluster.cluster_id.clone(),
            map: placement.map().clone(),
            shards: self.nodes().shards(),
            replicas: self.nodes().replicas(),
            nodes,
            len,
            missing,
            timeout_ms: self.cluster.timeout.as_millis() as u64,
        })
    }

    /// The global length.
    pub fn len(&self) -> u64 {
        self.state().lengths.len()
    }

    /// True if the cluster holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Starts a router for `config` listening on `listen` (the binary's path).
pub async fn run_router(
    config: &ClusterConfig,
    security: &net::Security,
    listen: SocketAddr,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let endpoint = net::server_endpoint(listen, security)?;
    let router = Router::start(config, security.clone()).await?;
    tracing::info!(
        "router on {listen}: {} shards, {} records",
        config.cluster.shards,
        router.len()
    );
    Arc::clone(&router).serve(endpoint, shutdown).await;
    router.give_back_lease().await;
    tracing::info!("router stopped");
    Ok(())
}
