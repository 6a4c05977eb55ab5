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
use std::sync::atomic::{AtomicU64, Ordering};
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
use zr_meta::cluster::{self, ClusterRecord};
use zr_meta::MetaStore;

mod datasets;
mod lease;
mod moves;
pub(crate) use datasets::record_fields;
pub(crate) use moves::placement_of;
pub use moves::MoveStep;
mod rebuild;
mod scrub;
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

/// How often the router's gauges are set.
const GAUGES_EVERY: Duration = Duration::from_secs(5);

/// Writes of a streamed gather queued for the client's stream.
const FRAMES_QUEUED: usize = 8;

/// The router's state, of one dataset: the router of the default dataset is the one that
/// serves, and sends each request to its dataset's (`datasets.rs`). See the module
/// documentation.
pub struct Router {
    /// The dataset served (`None`: the default one).
    dataset: Option<Arc<str>>,
    /// Its id (0 for the default dataset).
    dataset_id: u64,
    /// The named datasets' routers (the default dataset's router holds them).
    named: std::sync::RwLock<std::collections::BTreeMap<String, Arc<Router>>>,
    /// Set when the dataset was dropped: its router serves nothing more.
    dropped: std::sync::atomic::AtomicBool,
    /// The revision of the cluster record whose datasets `named` holds, and the lock its
    /// adoption takes (`datasets.rs`).
    adopted: AtomicU64,
    adopting: Mutex<()>,
    placement: ArcSwap<Placement>,
    nodes: Arc<Nodes>,
    len: AtomicU64,
    writes: Mutex<()>,
    /// The dataset's writer lease as this router knows it (see `lease.rs`), kept at
    /// `writer_key` in the metadata store.
    lease: std::sync::Mutex<zr_meta::writer::LeaseState>,
    writer_key: String,
    /// When this router's last write under the lease finished.
    lease_used: std::sync::Mutex<Option<tokio::time::Instant>>,
    fields: std::sync::RwLock<Vec<FieldInfo>>,
    /// The committed length, for consumers waiting on records (`datasets.rs`).
    committed_watch: tokio::sync::watch::Sender<u64>,
    /// Whether a task reads commits through other routers for the waiters (`datasets.rs`).
    watching_commits: std::sync::atomic::AtomicBool,
    timeout: Duration,
    /// The cluster's metadata: its id, map and committed length.
    meta: Arc<dyn MetaStore>,
    cluster_id: String,
    /// The version of the map placing reads and writes.
    map_version: AtomicU64,
    /// The move this router runs, if any (see `moves.rs`).
    moving: std::sync::Mutex<Option<wire::MoveReport>>,
    /// Bytes a second each node gaining slots copies their files at in the move this
    /// router runs (0: as fast as it can).
    move_rate: AtomicU64,
    /// Where moves stop (see [`Router::stop_moves_at`]).
    move_stop: std::sync::Mutex<Option<MoveStep>>,
    /// The committed length as last read from or written to the metadata store.
    committed: AtomicU64,
    /// Records rewritten in place (modify, delete, write-field) since the last commit was
    /// recorded: the next commit counts as a change even if the length stayed.
    rewritten: std::sync::atomic::AtomicBool,
    /// Per shard: `Some(records it holds)` while its node holds fewer records than the
    /// committed length gives it (its data is missing); see [`Failure::MissingData`].
    missing: std::sync::Mutex<Vec<Option<u64>>>,
    /// Catch-ups of behind replicas running here (see `rebuild.rs`), by node.
    rebuilds: Arc<std::sync::Mutex<std::collections::HashMap<NodeId, rebuild::Progress>>>,
    /// The bytes of gather replies held at once (see `budget.rs`).
    replies: Arc<ReplyBudget>,
    /// Bytes of requests read or handled at once (`[router] request_budget_mib`).
    request_budget: usize,
    /// The failed requests' log lines each client identity may cause.
    log_budget: std::sync::Mutex<zr_service::logging::LogBudget>,
    /// The address this router serves clients on, once it does.
    listening: std::sync::OnceLock<SocketAddr>,
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
        self.replies.held()
    }

    /// Connects to every node of `config`, checks they agree on the
    /// fields, and recovers the global length from their lengths. Shards holding records past
    /// the longest consistent length (an append that did not reach every shard) are cut back
    /// to it, with a warning naming them.
    pub async fn start(
        config: &ClusterConfig,
        security: net::Security,
    ) -> Result<Arc<Router>, Error> {
        let meta = open_metadata(config).await?;
        Router::start_with(config, security, meta).await
    }

    /// [`Router::start`] with the metadata store `meta`. The cluster record there (made on
    /// the first start from nodes.toml, with the nodes' length as committed) must have the
    /// map nodes.toml gives, or the router refuses to start. A shard whose node holds fewer
    /// records than the committed length gives it is refused by name, and the router serves
    /// the others; nothing is cut.
    pub async fn start_with(
        config: &ClusterConfig,
        security: net::Security,
        meta: Arc<dyn MetaStore>,
    ) -> Result<Arc<Router>, Error> {
        let placement = config.placement()?;
        let nodes = Arc::new(Nodes::new(config, security, Arc::clone(&meta))?);
        nodes.watch();
        let shards = nodes.shards() as usize;
        let mut router = Router {
            dataset: None,
            dataset_id: 0,
            named: Default::default(),
            dropped: Default::default(),
            adopted: Default::default(),
            adopting: Default::default(),
            writer_key: zr_meta::writer::key(None),
            committed_watch: tokio::sync::watch::Sender::new(0),
            watching_commits: Default::default(),
            placement: ArcSwap::from_pointee(placement),
            nodes,
            len: AtomicU64::new(0),
            writes: Mutex::new(()),
            lease: std::sync::Mutex::new(zr_meta::writer::LeaseState::new(
                // This router's name for the lease: random, one per router.
                std::hash::BuildHasher::hash_one(
                    &std::collections::hash_map::RandomState::new(),
                    std::process::id(),
                ),
                Duration::from_millis(config.router.timeout_ms) * lease::LEASE_TIMEOUTS,
            )),
            lease_used: std::sync::Mutex::new(None),
            fields: Default::default(),
            timeout: Duration::from_millis(config.router.timeout_ms),
            meta,
            cluster_id: String::new(),
            map_version: AtomicU64::new(0),
            moving: std::sync::Mutex::new(None),
            move_rate: AtomicU64::new(wire::MOVE_RATE_DEFAULT),
            move_stop: std::sync::Mutex::new(None),
            committed: AtomicU64::new(0),
            rewritten: Default::default(),
            missing: std::sync::Mutex::new(vec![None; shards]),
            rebuilds: Default::default(),
            replies: Arc::new(ReplyBudget::new(config.router.reply_budget_mib)),
            request_budget: usize::try_from(config.router.request_budget_mib << 20)
                .unwrap_or(usize::MAX),
            log_budget: Default::default(),
            listening: Default::default(),
        };
        // Which replicas are behind (none if the store has no record of them).
        if let Err(e) = router.nodes.refresh_replicas().await {
            return Err(Error::Failed(e));
        }
        // Every node that answers; a router starts, and serves what it can, with some down
        // (found so within START_PROBE, not the whole timeout; heartbeats bring them in).
        let mut answers: Vec<Option<(u64, Vec<FieldInfo>)>> = Vec::new();
        let mut down = Vec::new();
        let probe = START_PROBE.min(router.timeout);
        for answer in router.each_node_info_within(None, probe).await {
            match answer {
                Ok(info) => answers.push(Some(info)),
                Err(failure) => {
                    down.push(failure);
                    answers.push(None);
                }
            }
        }
        // Per shard: the most records an in-sync replica that answered holds, and its fields.
        let infos: Vec<Option<(u64, Vec<FieldInfo>)>> = (0..router.nodes.shards())
            .map(|shard| {
                router
                    .nodes
                    .in_sync_of(shard)
                    .into_iter()
                    .filter_map(|node| answers[node].clone())
                    .max_by_key(|(len, _)| *len)
            })
            .collect();
        // A shard is down when none of its in-sync replicas answered.
        let down: Vec<Failure> = if router.nodes.replicas() == 1 {
            down
        } else {
            (0..router.nodes.shards())
                .filter(|&shard| infos[shard as usize].is_none())
                .map(|shard| {
                    let node = router.nodes.id(shard, 0);
                    router
                        .nodes
                        .unavailable(node, "no in-sync replica answered".into())
                })
                .collect()
        };
        let mut fields: Option<(u32, &Vec<FieldInfo>)> = None;
        for (shard, info) in infos.iter().enumerate() {
            let Some((_, theirs)) = info else { continue };
            match fields {
                Some((first, ours)) if ours != theirs => {
                    return Err(Error::FieldsDiffer {
                        shard: shard as u32,
                        first,
                    })
                }
                Some(_) => {}
                None => fields = Some((shard as u32, theirs)),
            }
        }
        *router.fields.get_mut().unwrap_or_else(|e| e.into_inner()) = match fields {
            Some((_, fields)) => fields.clone(),
            // No node answered: the fields nodes.toml gives them.
            None => config
                .fields
                .iter()
                .map(|f| FieldInfo::new(f.name.clone(), f.compress.clone()))
                .collect(),
        };
        let known: Option<Vec<u64>> = infos
            .iter()
            .map(|i| i.as_ref().map(|(len, _)| *len))
            .collect();
        let record = router
            .cluster_record(config, known.as_deref(), down.first())
            .await?;
        router.cluster_id = record.id.clone();
        router.grow_from(&record).map_err(Error::Failed)?;
        let placement =
            moves::placement_of(&record.map, router.nodes.shards()).map_err(Error::Failed)?;
        router.adopt_map(&record.map, placement);
        router.set_committed(record.committed_len);
        // A node that is down counts as holding its committed share until it answers.
        let lens: Vec<u64> = infos
            .iter()
            .enumerate()
            .map(|(shard, info)| match info {
                Some((len, _)) => *len,
                None => router
                    .placement
                    .load()
                    .shard_len(shard as u32, record.committed_len),
            })
            .collect();
        if router.note_missing(&lens) || !down.is_empty() {
            // Serve what is there; writes wait for the missing data and the nodes down.
            router.len.store(router.served_len(&lens), Ordering::SeqCst);
            if let Some(failure) = router.missing_failure() {
                tracing::error!("{failure}");
            }
            for failure in &down {
                tracing::warn!("{failure}: serving the other shards meanwhile");
            }
        } else {
            // Recover the length, repairing what a write cut off midway left behind. While
            // another router holds the writer lease (perhaps a dead one, until its lease
            // lapses), serve what the nodes agree on; the first write repairs.
            match router.exclusive(|| async { Ok(()) }).await {
                Ok(()) => {}
                Err(busy @ Failure::Busy { .. }) => {
                    tracing::warn!("{busy}: serving meanwhile; the first write repairs");
                    router.len.store(router.served_len(&lens), Ordering::SeqCst);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let router = Arc::new(router);
        router.open_datasets(&record).await?;
        router.start_rebuilds();
        router.start_gauges();
        router.start_map_reloads();
        // Gives the writer lease back once the router has been idle for a moment; ends with
        // the router.
        let keeper = Arc::downgrade(&router);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(lease::LINGER).await;
                let Some(router) = keeper.upgrade() else {
                    return;
                };
                router.release_if_idle().await;
                for named in router.named_routers() {
                    named.release_if_idle().await;
                }
            }
        });
        Ok(router)
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
        self.fields
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Notes `len` as the committed length, waking the consumers it lets go on.
    pub(crate) fn set_committed(&self, len: u64) {
        self.committed.store(len, Ordering::SeqCst);
        self.committed_watch.send_if_modified(|seen| {
            let changed = *seen != len;
            *seen = len;
            changed
        });
    }

    /// The cluster record of the metadata store, checked against nodes.toml's map; made if
    /// there is none yet, with `lens` (the nodes' lengths) as the committed length — which
    /// needs every node (`down`: the first that did not answer).
    async fn cluster_record(
        &self,
        config: &ClusterConfig,
        lens: Option<&[u64]>,
        down: Option<&Failure>,
    ) -> Result<ClusterRecord, Error> {
        let given = crate::restore::initial_map(config);
        loop {
            let stored = cluster::load(&*self.meta).await?.map(|(record, _)| record);
            let decision = startup::decide_record(
                stored.as_ref(),
                &given,
                config.cluster.shards,
                lens,
                || down.map_or_else(|| "a node did not answer".to_string(), |f| f.to_string()),
                |lens| self.placement.load().consistent_len(lens),
            );
            let committed_len = match decision {
                startup::RecordDecision::Use => {
                    return stored.ok_or_else(|| {
                        Error::Failed(Failure::Inconsistent("the cluster record went".into()))
                    })
                }
                startup::RecordDecision::MapMismatch {
                    key,
                    given,
                    stored,
                    version,
                } => {
                    return Err(Error::MapMismatch {
                        key,
                        given,
                        stored,
                        version,
                        store: self.meta.describe(),
                    })
                }
                startup::RecordDecision::NodesMissing { why } => {
                    return Err(Error::Failed(Failure::Inconsistent(format!(
                        "the cluster is not recorded in {} yet, and recording it needs every node: {why}",
                        self.meta.describe()
                    ))))
                }
                // Nodes holding records with no record to say whose: the record was lost. A
                // new one would give the cluster a new id, which every node would refuse.
                startup::RecordDecision::RecordLost { held } => {
                    return Err(Error::Failed(Failure::Inconsistent(format!(
                        "{} holds no cluster record, but the nodes hold {held} records: the record was lost (or [metadata] names another cluster's store). A new record would orphan their data, so none is made: rebuild it from the nodes with `zr cluster restore-record --nodes {}` (run where the router's certificate is), or point [metadata] at the store that holds it",
                        self.meta.describe(),
                        config.origin
                    ))))
                }
                startup::RecordDecision::Create { committed_len } => committed_len,
            };
            let record = ClusterRecord {
                id: cluster::new_cluster_id(),
                map: given.clone(),
                committed_len,
                moving: None,
                added: Vec::new(),
                datasets: Vec::new(),
                dataset_ids: 0,
                commits: 0,
            };
            match cluster::store(&*self.meta, None, &record).await {
                Ok(_) => {
                    tracing::info!(
                        "cluster {} recorded in {} ({} records committed)",
                        record.id,
                        self.meta.describe(),
                        record.committed_len
                    );
                    return Ok(record);
                }
                // Another router recorded it first: read theirs.
                Err(zr_meta::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sets the router's gauges every [`GAUGES_EVERY`] until the router is dropped: the
    /// committed and served lengths, the map version, the replicas behind.
    fn start_gauges(self: &Arc<Self>) {
        let router = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(router) = router.upgrade() else {
                    return;
                };
                metrics::gauge!("zr_router_committed_records")
                    .set(router.committed.load(Ordering::SeqCst) as f64);
                metrics::gauge!("zr_router_records").set(router.len() as f64);
                metrics::gauge!("zr_router_map_version")
                    .set(router.map_version.load(Ordering::SeqCst) as f64);
                let behind = router
                    .nodes
                    .all()
                    .filter(|&n| !router.nodes.in_sync(n))
                    .count();
                metrics::gauge!("zr_router_replicas_behind").set(behind as f64);
                router.nodes.refresh_in_flight();
                metrics::gauge!("zr_router_reply_bytes").set(router.replies.held() as f64);
                drop(router);
                tokio::time::sleep(GAUGES_EVERY).await;
            }
        });
    }

    /// Reloads the map from the metadata store when a node refuses a request as placed by
    /// another map, and every [`MAP_RELOAD_EVERY`] anyway; ends with the router.
    fn start_map_reloads(self: &Arc<Self>) {
        let router = Arc::downgrade(self);
        let stale = self.nodes.stale_map();
        tokio::spawn(async move {
            loop {
                let _ = tokio::time::timeout(MAP_RELOAD_EVERY, stale.notified()).await;
                let Some(router) = router.upgrade() else {
                    return;
                };
                match router.reload_map().await {
                    Ok(record) => router.finish_stopped_switch(record).await,
                    Err(e) => tracing::warn!("reloading the cluster map: {e}"),
                }
                router.sync_datasets().await;
            }
        });
    }

    /// Marks the shards whose nodes hold fewer records (`lens`) than the committed length
    /// gives them, and clears the others; true if any is marked.
    fn note_missing(&self, lens: &[u64]) -> bool {
        let placement = self.placement.load();
        let committed = self.committed.load(Ordering::SeqCst);
        let mut missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        if missing.len() < lens.len() {
            missing.resize(lens.len(), None);
        }
        for (shard, (&have, slot)) in lens.iter().zip(missing.iter_mut()).enumerate() {
            let share = placement.shard_len(shard as u32, committed);
            *slot = (have < share).then_some(have);
        }
        missing.iter().any(Option::is_some)
    }

    /// The length to serve with `lens`: a shard missing data counts as holding its share of
    /// the committed length (its records are refused at gather time, not made out of range).
    fn served_len(&self, lens: &[u64]) -> u64 {
        let placement = self.placement.load();
        let committed = self.committed.load(Ordering::SeqCst);
        let lens: Vec<u64> = lens
            .iter()
            .enumerate()
            .map(|(shard, &have)| have.max(placement.shard_len(shard as u32, committed)))
            .collect();
        placement.consistent_len(&lens)
    }

    /// The refusal of the first shard missing data, if any.
    fn missing_failure(&self) -> Option<Failure> {
        let missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        let (shard, holds) = missing
            .iter()
            .enumerate()
            .find_map(|(shard, m)| m.map(|holds| (shard as u32, holds)))?;
        Some(self.missing_data(shard, holds))
    }

    fn missing_data(&self, shard: u32, holds: u64) -> Failure {
        let committed = self.committed.load(Ordering::SeqCst);
        Failure::MissingData {
            shard,
            addr: self.nodes.addr(self.nodes.id(shard, 0)),
            holds,
            committed: self.placement.load().shard_len(shard, committed),
            cluster: self.cluster_id.clone(),
        }
    }

    /// Re-reads the committed length from the metadata store (another router may have
    /// committed since).
    pub(crate) async fn reload_committed(&self) -> Result<u64, Failure> {
        if self.dataset.is_some() {
            let (record, _) = self.load_named_committed().await?;
            self.set_committed(record.committed_len);
            return Ok(record.committed_len);
        }
        let (record, _) = self.load_cluster().await?;
        self.set_committed(record.committed_len);
        Ok(record.committed_len)
    }

    /// Records `len` as the committed length in the metadata store. The caller holds the
    /// write lease. Only a delete (`lowering`) may record less than is recorded: otherwise
    /// the nodes hold less than was committed, and the commit is refused.
    pub(crate) async fn record_committed(&self, len: u64, lowering: bool) -> Result<(), Failure> {
        // Records rewritten since the last commit make this one count as a change even if
        // the length stayed; a change this commit fails to record is kept for the next.
        let rewritten = self.rewritten.swap(false, Ordering::SeqCst);
        let recorded = match self.dataset {
            Some(_) => self.record_named_committed(len, lowering, rewritten).await,
            None => {
                self.record_default_committed(len, lowering, rewritten)
                    .await
            }
        };
        if recorded.is_err() && rewritten {
            self.rewritten.store(true, Ordering::SeqCst);
        }
        recorded
    }

    /// [`Router::record_committed`] of the default dataset: in the cluster record.
    async fn record_default_committed(
        &self,
        len: u64,
        lowering: bool,
        rewritten: bool,
    ) -> Result<(), Failure> {
        let meta = Failure::from;
        for _ in 0..8 {
            let Some((mut record, revision)) = cluster::load(&*self.meta).await.map_err(meta)?
            else {
                return Err(Failure::Inconsistent(format!(
                    "metadata store {} holds no cluster record any more",
                    self.meta.describe()
                )));
            };
            if record.committed_len == len && !rewritten {
                self.set_committed(len);
                return Ok(());
            }
            if record.committed_len > len && !lowering {
                self.set_committed(record.committed_len);
                return Err(Failure::Inconsistent(format!(
                    "cluster {} has committed {} records but its shards hold {len}: data is missing; the commit is refused",
                    record.id, record.committed_len
                )));
            }
            record.committed_len = len;
            record.commits += 1;
            match cluster::store(&*self.meta, Some(revision), &record).await {
                Ok(_) => {
                    self.set_committed(len);
                    return Ok(());
                }
                Err(zr_meta::Error::Conflict { .. }) => continue,
                Err(e) => return Err(meta(e)),
            }
        }
        Err(Failure::Contended(format!(
            "the cluster record in {} kept changing; the commit is not recorded",
            self.meta.describe()
        )))
    }

    /// A write's outcome; a rewrite in place is noted for the next commit to count.
    pub(crate) async fn rewrite<T>(
        &self,
        write: impl std::future::Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let outcome = write.await;
        if outcome.is_ok() {
            self.rewritten.store(true, Ordering::SeqCst);
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
        let (shards, replicas) = (self.nodes.shards(), self.nodes.replicas());
        if shard >= shards {
            return Err(Failure::BadRequest(format!(
                "there is no shard {shard}: the cluster has {shards} (0..{shards})"
            )));
        }
        if replicas < 2 {
            return Err(Failure::BadRequest(format!(
                "shard {shard} has a single replica (nodes.toml: replicas = 1): a replacement is rebuilt from a partner replica, and there is none; restore the node's data directory instead"
            )));
        }
        if replica >= replicas {
            return Err(Failure::BadRequest(format!(
                "shard {shard} has replicas 0..{replicas}, not {replica}"
            )));
        }
        let addr: std::net::SocketAddr = addr.parse().map_err(|e| {
            Failure::BadRequest(format!("'{addr}' is not an address (IP:PORT): {e}"))
        })?;
        if addr.ip().is_unspecified() || addr.port() == 0 {
            return Err(Failure::BadRequest(format!(
                "{addr} is no address a node can be reached at: give its IP and port"
            )));
        }
        if self.listening.get() == Some(&addr) {
            return Err(Failure::BadRequest(format!(
                "{addr} is this router's own address, not a node's"
            )));
        }
        if self.nodes.addr(self.nodes.id(shard, replica)) == addr {
            return Err(Failure::BadRequest(format!(
                "{addr} is shard {shard} replica {replica}'s address already: a replacement is a node at another address (a node restarted at the same address with its data lost is rebuilt without one)"
            )));
        }
        if let Some(other) = self
            .nodes
            .all()
            .find(|&n| self.nodes.addr(n) == addr && self.nodes.id(shard, replica) != n)
        {
            return Err(Failure::BadRequest(format!(
                "{addr} already serves shard {} replica {}",
                self.nodes.shard(other),
                self.nodes.replica(other)
            )));
        }
        let all = self.all_routers();
        Router::exclusive_all(&all, || {
            Box::pin(self.nodes.move_replica(shard, replica, addr))
        })
        .await
    }

    /// The cluster as this router sees it now: every node asked at once.
    async fn status(&self) -> wire::ClusterStatus {
        let moving = match cluster::load(&*self.meta).await {
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
        let committed = self.committed.load(Ordering::SeqCst);
        let placement = self.placement.load_full();
        let answers = self.each_node_info(None).await;
        let rebuilds = self
            .rebuilds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let nodes = answers
            .into_iter()
            .enumerate()
            .map(|(node, answer)| {
                let shard = self.nodes.shard(node);
                let in_sync = self.nodes.in_sync(node);
                let share = placement.shard_len(shard, committed);
                let (state, records) = match answer {
                    Ok((len, _)) if len < share && in_sync => (
                        format!("refused: holds {len} of the {share} records committed on it (its data is missing)"),
                        Some(len),
                    ),
                    Ok((len, _)) if in_sync => ("up".to_string(), Some(len)),
                    Ok((len, _)) => ("behind: catching up, serves nothing meanwhile".to_string(), Some(len)),
                    Err(Failure::ShardRefused { message, .. }) => {
                        (format!("refused: {message}"), None)
                    }
                    Err(failure) => (format!("down: {failure}"), None),
                };
                wire::NodeStatus {
                    shard,
                    replica: self.nodes.replica(node),
                    in_sync,
                    rebuild: rebuilds.get(&node).map(|p| p.describe()),
                    addr: self.nodes.addr(node).to_string(),
                    state,
                    records,
                    last_seen_ms: self.nodes.last_seen(node).map(|d| d.as_millis() as u64),
                    lease: self.nodes.lease(node),
                    rtt_us: self.nodes.rtt(node).map(|d| d.as_micros() as u64),
                }
            })
            .collect();
        wire::ClusterStatus {
            cluster: self.cluster_id.clone(),
            map_version: self.map_version.load(Ordering::SeqCst),
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
        let placement = self.placement.load_full();
        let nodes = self
            .nodes
            .all()
            .map(|node| wire::NodeAddr {
                shard: self.nodes.shard(node),
                replica: self.nodes.replica(node),
                addr: self.nodes.addr(node).to_string(),
                in_sync: self.nodes.in_sync(node),
            })
            .collect();
        let missing = self
            .missing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .enumerate()
            .filter(|(_, holds)| holds.is_some())
            .map(|(shard, _)| shard as u32)
            .collect();
        Ok(wire::Topology {
            cluster: self.cluster_id.clone(),
            map: placement.map().clone(),
            shards: self.nodes.shards(),
            replicas: self.nodes.replicas(),
            nodes,
            len,
            missing,
            timeout_ms: self.timeout.as_millis() as u64,
        })
    }

    /// Shard `shard` is missing data: `Some(refusal)` unless its node holds its share of the
    /// committed length again (its directory was restored), which clears the mark.
    async fn still_missing(&self, shard: u32) -> Option<Failure> {
        let holds = self
            .missing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(shard as usize)
            .copied()
            .flatten()?;
        let share = self
            .placement
            .load()
            .shard_len(shard, self.committed.load(Ordering::SeqCst));
        match self.nodes.read(self.on(), shard, &NodeRequest::Info).await {
            Ok((
                _,
                crate::nodes::NodeReply {
                    reply: Reply::Info { len, .. },
                    ..
                },
            )) if len >= share => {
                if let Some(slot) = self
                    .missing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(shard as usize)
                {
                    *slot = None;
                }
                None
            }
            Ok((
                _,
                crate::nodes::NodeReply {
                    reply: Reply::Info { len, .. },
                    ..
                },
            )) => Some(self.missing_data(shard, len)),
            _ => Some(self.missing_data(shard, holds)),
        }
    }

    /// The global length.
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::SeqCst)
    }

    /// True if the cluster holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Accepts clients on `endpoint` until `shutdown`; then stops accepting and lets requests
    /// in flight finish.
    pub async fn serve(self: Arc<Self>, endpoint: Endpoint, shutdown: impl Future<Output = ()>) {
        if let Ok(addr) = endpoint.local_addr() {
            let _ = self.listening.set(addr);
        }
        let (timeout, request_budget) = (self.timeout, self.request_budget);
        let handler = move |peer: &net::Peer, bytes: Vec<u8>| {
            let router = Arc::clone(&self);
            let peer = peer.clone();
            async move { router.handle_from(&peer, &bytes).await }
        };
        let limits = net::Limits {
            connections_per_identity: CONNECTIONS_PER_IDENTITY_MAX,
            request_bytes: request_budget,
            request_bytes_per_identity: request_budget / 2,
            request_bytes_kept_from_readers: request_budget / 4,
            ..net::Limits::new(CONNECTIONS_MAX, timeout)
        };
        net::serve_peers(&endpoint, limits, shutdown, handler).await;
    }

    /// Decodes, executes and encodes one client request, with every right (a caller inside
    /// the process).
    pub async fn handle(self: &Arc<Self>, bytes: &[u8]) -> (Vec<u8>, Body) {
        let anyone = net::Peer {
            role: None,
            identity: 0,
        };
        self.handle_from(&anyone, bytes).await
    }

    /// Decodes, executes and encodes one client request from `peer`: a request its role
    /// does not allow is refused, naming the role it needs.
    pub async fn handle_from(self: &Arc<Self>, peer: &net::Peer, bytes: &[u8]) -> (Vec<u8>, Body) {
        let outcome = match wire::decode_request::<ClientMessage>(bytes) {
            Ok((message, body)) => {
                let request = &message.request;
                let kind = request.kind();
                // Labelled by dataset: a name this router knows (a hostile client cannot grow
                // the label set with names that do not exist).
                let dataset = match message.dataset() {
                    name if name == wire::DEFAULT_DATASET || self.named_router(name).is_some() => {
                        name.to_string()
                    }
                    _ => "unknown".to_string(),
                };
                let started = std::time::Instant::now();
                metrics::counter!("zr_router_received_bytes_total").increment(bytes.len() as u64);
                let executed = if peer.access().is_some_and(|has| has >= request.access()) {
                    self.dispatch(message, body).await
                } else {
                    Err(Failure::Forbidden {
                        request: kind,
                        needs: request.access().role_name(),
                        has: peer.role.map_or("unknown".into(), |r| r.name().to_string()),
                    })
                };
                let outcome = if executed.is_ok() { "ok" } else { "error" };
                metrics::counter!("zr_router_requests_total", "kind" => kind, "outcome" => outcome, "dataset" => dataset.clone())
                    .increment(1);
                metrics::histogram!("zr_router_request_duration_seconds", "kind" => kind, "dataset" => dataset)
                    .record(started.elapsed());
                executed.map_err(|failure| {
                    // At a level a default run shows, a few a second per client at most.
                    self.log_failure(peer, || format!("{kind} failed: {failure}"));
                    metrics::counter!("zr_router_errors_total", "code" => failure.code().name())
                        .increment(1);
                    Reply::Error {
                        code: failure.code(),
                        message: failure.to_string(),
                    }
                })
            }
            Err(e) => {
                self.log_failure(peer, || format!("bad request from a client: {e}"));
                metrics::counter!("zr_router_errors_total", "code" => e.code().name()).increment(1);
                Err(Reply::Error {
                    code: e.code(),
                    message: e.to_string(),
                })
            }
        };
        let (reply, body) = outcome.unwrap_or_else(|reply| (reply, Body::Ready(Vec::new())));
        match wire::encode_reply(&reply) {
            Ok(header) => (header, body),
            Err(e) => (
                wire::encode_reply(&Reply::Error {
                    code: e.code(),
                    message: e.to_string(),
                })
                .unwrap_or_default(),
                Body::Ready(Vec::new()),
            ),
        }
    }

    /// Logs a failed request of `peer`'s, unless its identity has had its lines for now
    /// (see [`zr_service::logging::LogBudget`]); a line left out is counted in
    /// `zr_router_log_lines_suppressed_total` and said with the identity's next line.
    fn log_failure(&self, peer: &net::Peer, line: impl FnOnce() -> String) {
        let now = std::time::Instant::now();
        let said = self
            .log_budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .line(peer.identity, now);
        match said {
            zr_service::logging::LogLine::Write { suppressed: 0 } => tracing::warn!("{}", line()),
            zr_service::logging::LogLine::Write { suppressed } => tracing::warn!(
                "{} ({suppressed} more failed requests of this client were not logged)",
                line()
            ),
            zr_service::logging::LogLine::Suppress => {
                metrics::counter!("zr_router_log_lines_suppressed_total").increment(1);
            }
        }
    }

    async fn execute(
        self: &Arc<Self>,
        request: ClientRequest,
        body: &[u8],
    ) -> Result<(Reply, Body), Failure> {
        let ready = |reply: Reply| (reply, Body::Ready(Vec::new()));
        let ready_body = |(reply, body): (Reply, Vec<Bytes>)| (reply, Body::Ready(body));
        match request {
            ClientRequest::Info => {
                // Fresh from the nodes (another router may have written); the cached length
                // if a node cannot answer, so a client can still connect.
                let len = match self.refresh_len().await {
                    Ok(len) => len,
                    Err(e) => {
                        tracing::debug!("cannot refresh the length: {e}");
                        self.len()
                    }
                };
                Ok(ready(Reply::Info {
                    len,
                    fields: self.fields(),
                    incarnation: 0,
                }))
            }
            ClientRequest::Gather {
                indices,
                fields,
                checked,
            } => {
                let gathered = self.gather(&indices, fields, checked).await;
                if gathered.is_ok() {
                    metrics::counter!("zr_router_records_gathered_total")
                        .increment(indices.len() as u64);
                }
                gathered
            }
            ClientRequest::Append {
                fields, lengths, ..
            } => self
                .acked(self.exclusive(|| self.append(fields, lengths, body)))
                .await
                .map(ready_body),
            ClientRequest::Modify {
                index,
                fields,
                lengths,
                ..
            } => self
                .acked(self.exclusive(|| self.rewrite(self.modify(index, fields, lengths, body))))
                .await
                .map(ready),
            ClientRequest::Delete { index } => self
                .acked(self.exclusive(|| self.rewrite(self.delete(index))))
                .await
                .map(ready_body),
            ClientRequest::WriteField {
                field,
                start,
                lengths,
            } => self
                .acked(
                    self.exclusive(|| self.rewrite(self.write_field(field, start, lengths, body))),
                )
                .await
                .map(ready),
            ClientRequest::WaitLen { len, wait_ms } => {
                let committed = self.wait_committed(len, wait_ms).await?;
                // A length reached tells of writes as their acknowledgment does.
                self.nodes.acks_may_go().await;
                Ok(ready(Reply::Info {
                    len: committed,
                    fields: self.fields(),
                    incarnation: 0,
                }))
            }
            ClientRequest::AddField { field } => {
                self.add_field(field).await?;
                Ok(ready(Reply::Done))
            }
            ClientRequest::Datasets
            | ClientRequest::CreateDataset { .. }
            | ClientRequest::DropDataset => Err(Failure::BadRequest(
                "a dataset's own router cannot list, create or drop datasets".into(),
            )),
            ClientRequest::Status => Ok(ready(Reply::Status(self.status().await))),
            ClientRequest::Scrub {
                shard,
                start,
                count,
            } => self
                .scrub(shard, start, count)
                .await
                .map(|report| ready(Reply::Scrubbed(report))),
            ClientRequest::ReplaceNode {
                shard,
                replica,
                addr,
            } => {
                self.replace_node(shard, replica, &addr).await?;
                Ok(ready(Reply::Status(self.status().await)))
            }
            ClientRequest::MoveShards {
                change,
                nodes,
                rate,
            } => {
                let rate = rate.unwrap_or(wire::MOVE_RATE_DEFAULT);
                self.start_move(change, nodes, rate)?;
                Ok(ready(Reply::Moving(self.move_progress())))
            }
            ClientRequest::MoveProgress => Ok(ready(Reply::Moving(self.move_progress()))),
            ClientRequest::Topology { covering } => {
                Ok(ready(Reply::Topology(self.topology(covering).await?)))
            }
            ClientRequest::Commit => {
                let commit = self.exclusive(|| async {
                    let placement = self.placement.load_full();
                    for shard in 0..self.nodes.shards() {
                        if !placement.slots(shard).is_empty() {
                            self.commit_shard(shard).await?;
                        }
                    }
                    // Every shard holds the length durably now: the promise moves.
                    self.record_committed(self.len(), false).await?;
                    Ok(ready(Reply::Done))
                });
                self.acked(commit).await
            }
        }
    }

    /// `write`'s outcome, once a success may be acknowledged (`Nodes::acks_may_go`): after
    /// the write lock is let go, so that what holds the acknowledgment holds no other write.
    async fn acked<T>(
        &self,
        write: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let outcome = write.await;
        if outcome.is_ok() {
            self.nodes.acks_may_go().await;
        }
        outcome
    }

    /// Scatters a gather, one sub-request per involved shard, and streams the shards'
    /// replies to the client as they arrive (`Reply::GatherParts`; the client reassembles).
    /// A failed shard ends the stream with an error frame and abandons the others.
    async fn gather(
        self: &Arc<Self>,
        indices: &[u64],
        fields: Vec<String>,
        checked: bool,
    ) -> Result<(Reply, Body), Failure> {
        let len = self
            .len_covering(indices.iter().copied().max().unwrap_or(0))
            .await?;
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err(Failure::OutOfRange { index, len });
        }
        // One snapshot of the map for the plan and for the version its requests carry.
        let placement = self.placement.load_full();
        let parts = plan_gather(&placement, indices);
        for part in &parts {
            if let Some(refusal) = self.still_missing(part.shard).await {
                return Err(refusal);
            }
        }
        if parts.is_empty() {
            // No index: an empty column per requested field.
            let count = if fields.is_empty() {
                self.fields().len()
            } else {
                fields.len()
            };
            let lengths = vec![Vec::new(); count];
            return Ok((Reply::Gather { lengths }, Body::Ready(Vec::new())));
        }
        let reply = Reply::GatherParts {
            records: indices.len() as u32,
            parts: parts.len() as u32,
        };
        // A few writes' worth queued: the shards' readers keep receiving meanwhile.
        let (frames, body) = tokio::sync::mpsc::channel(FRAMES_QUEUED);
        let forwarded = crate::forward::forward_parts(
            Arc::clone(&self.nodes),
            crate::forward::Placed {
                dataset: self.dataset.clone(),
                map_version: placement.version(),
            },
            parts,
            fields,
            checked,
            Some(self.replies.gather()),
            frames,
        );
        // A failure midway is logged there; the client's stream is reset.
        tokio::spawn(async move {
            let _ = forwarded.await;
        });
        Ok((reply, Body::Streamed(body)))
    }

    /// Every node's length and fields, or why it did not say, asked concurrently, in node
    /// order; with `fence`, each node is fenced with that lease token first (see
    /// `NodeRequest::Fence`).
    async fn each_node_info(
        &self,
        fence: Option<u64>,
    ) -> Vec<Result<(u64, Vec<FieldInfo>), Failure>> {
        self.each_node_info_within(fence, self.timeout).await
    }

    /// [`Self::each_node_info`], each node given `timeout` to answer. With replicas, one
    /// known down is not waited for.
    async fn each_node_info_within(
        &self,
        fence: Option<u64>,
        timeout: Duration,
    ) -> Vec<Result<(u64, Vec<FieldInfo>), Failure>> {
        let request = match fence {
            Some(token) => NodeRequest::Fence { token },
            None => NodeRequest::Info,
        };
        let calls = self.nodes.all().map(|node| {
            let request = &request;
            async move {
                if self.nodes.replicas() > 1 && self.nodes.is_down(node) {
                    return Err(self.nodes.unavailable(node, "down".into()));
                }
                self.nodes
                    .call_within(self.on(), node, request, Vec::new(), timeout)
                    .await
            }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
            .map(|(node, result)| match result?.reply {
                Reply::Info { len, fields, .. } => Ok((len, fields)),
                other => Err(self
                    .nodes
                    .unavailable(node, format!("answered Info with {other:?}"))),
            })
            .collect()
    }

    /// Every shard's length: the most records one of its in-sync replicas holds, and what
    /// each that answered holds; `fence` as for [`Self::each_node_info`] (every node is
    /// fenced). Fails if none of a shard's in-sync replicas answered. With `mark`, an in-sync
    /// replica that did not answer is marked behind (a write is about to go on without it).
    async fn shard_lens(&self, fence: Option<u64>, mark: bool) -> Result<Vec<ShardLens>, Failure> {
        let mut answers: Vec<Option<Result<u64, Failure>>> = self
            .each_node_info(fence)
            .await
            .into_iter()
            .map(|answer| Some(answer.map(|(len, _)| len)))
            .collect();
        let mut shards = Vec::with_capacity(self.nodes.shards() as usize);
        let placement = self.placement.load_full();
        for shard in 0..self.nodes.shards() {
            let mut lens = ShardLens::default();
            let mut failed = Vec::new();
            for node in self.nodes.in_sync_of(shard) {
                match answers.get_mut(node).and_then(Option::take) {
                    Some(Ok(len)) => {
                        lens.len = lens.len.max(len);
                        lens.replicas.push((node, len));
                    }
                    Some(Err(failure)) => failed.push((node, failure)),
                    None => {}
                }
            }
            if placement.slots(shard).is_empty() && lens.replicas.is_empty() {
                // A shard the map places nothing on (drained, or not added yet) holds
                // nothing: its nodes may be gone.
                shards.push(lens);
                continue;
            }
            if lens.replicas.is_empty() {
                return Err(failed.into_iter().next().map_or_else(
                    || Failure::NoReplicaInSync { shard: Some(shard) },
                    |(_, failure)| failure,
                ));
            }
            if mark {
                for (node, failure) in failed {
                    self.nodes.mark_behind(node, &failure.to_string()).await?;
                }
            }
            shards.push(lens);
        }
        Ok(shards)
    }

    /// Every shard's length, in shard order (see [`Self::shard_lens`]).
    async fn node_lens(&self, fence: Option<u64>) -> Result<Vec<u64>, Failure> {
        let shards = self.shard_lens(fence, false).await?;
        Ok(shards.into_iter().map(|s| s.len).collect())
    }

    /// Makes every write so far durable on shard `shard`'s in-sync replicas (one that
    /// fails it is marked behind).
    async fn commit_shard(&self, shard: u32) -> Result<(), Failure> {
        let targets = self.nodes.in_sync_of(shard);
        let calls = targets.iter().map(|&node| {
            self.nodes
                .call(self.on(), node, &NodeRequest::Commit, Vec::new())
        });
        let results = futures::future::join_all(calls).await;
        let (_, done) = self.all_or_behind(&targets, results).await?;
        for node in done {
            self.nodes.note_committed(node);
        }
        Ok(())
    }

    /// Re-reads the global length from the nodes (another router may have written): the
    /// longest length every shard agrees with. Repairs nothing — another router's append
    /// may be in flight. Waits for this router's writes in flight, so a length read before
    /// them cannot overwrite theirs.
    async fn refresh_len(&self) -> Result<u64, Failure> {
        let _writes = self.writes.lock().await;
        let lens = self.node_lens(None).await?;
        self.note_missing(&lens);
        let len = self.served_len(&lens);
        self.len.store(len, Ordering::SeqCst);
        Ok(len)
    }

    /// The global length as the nodes have it now if `index` is past the cached one (another
    /// router may have appended); the cached one otherwise, or if a node cannot say — unless
    /// it refused as placed by another map (the cluster moved: the caller tries again once
    /// this router has the new map).
    async fn len_covering(&self, index: u64) -> Result<u64, Failure> {
        let len = self.len();
        if index < len {
            return Ok(len);
        }
        match self.refresh_len().await {
            Ok(len) => Ok(len),
            Err(e) if e.code() == wire::ErrorCode::StaleMap => Err(e),
            Err(e) => {
                tracing::debug!("cannot refresh the length: {e}");
                Ok(len)
            }
        }
    }
}

/// A shard's length (see [`Router::shard_lens`]).
#[derive(Debug, Default)]
pub(crate) struct ShardLens {
    /// The most records one of its in-sync replicas holds.
    pub(crate) len: u64,
    /// What each in-sync replica that answered holds.
    pub(crate) replicas: Vec<(NodeId, u64)>,
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
