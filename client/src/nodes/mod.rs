//! The router's links to its nodes: one endpoint and connection per node (each shard has
//! `replicas` of them), reconnected on demand, a heartbeat per node (see `zr_coord::liveness`), and
//! one request to a node within the router's timeout — or failed at once while it is down.
//!
//! What these links learn — heartbeats, incarnations, writes and commits, the replica record
//! (`zr_meta::replicas`) — is told to one [`Replicas`] (`zr_coord`), which decides without I/O:
//! which node is down, which restarted after this router wrote to it and must be marked
//! behind, which is reached elsewhere now, until when write acknowledgments wait. The links
//! perform what it answers (`Nodes::tell`). Reads and writes go to in-sync replicas only,
//! by the record it last published. A router's [`Replicas`] is part of its
//! [`Coordinator`], under the one lock of everything else it decides; a client's reading one
//! hop is its own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use quinn::{Connection, Endpoint};
use tokio::sync::Mutex;
use zr_net::Security;
use zr_proto::chunks::Chunks;
use zr_proto::wire::{self, NodeRequest, Reply};

use arc_swap::ArcSwap;
use zr_coord::replicas::{Effect, Event, Replicas};
use zr_coord::Coordinator;
use zr_meta::replicas::{self, ReplicaRecord};

use crate::error::{Error, Failure};
use crate::liveness::{self, Health};

mod calls;
mod in_sync;
mod watch;

/// A node: its place among the router's links, `shard * replicas + replica`.
pub type NodeId = zr_coord::NodeId;

/// One node, reconnected on demand, through an endpoint (a UDP socket) of its own: replies
/// from several nodes are then received in parallel, not by one socket's driver in turn.
/// Records a checked read found damaged: the dataset (`None`: the default one), the node,
/// the shard-local indices.
pub type Suspect = (Option<Arc<str>>, NodeId, Vec<u64>);

struct NodeLink {
    shard: u32,
    replica: u32,
    /// Where it is served now (nodes.toml's address, or the one it was moved to by
    /// `zr cluster replace-node`), and the endpoint to reach it through.
    target: std::sync::Mutex<Target>,
    connection: Mutex<Option<Connection>>,
    /// Its health as [`Replicas`] last gave it, published to the calls waiting for it to
    /// come back.
    health: tokio::sync::watch::Sender<Health>,
    /// Its last heartbeat failed (or it is down): a read its partner can serve need not
    /// wait for it to be found down (see [`Nodes::wait_failing`]).
    failing: tokio::sync::watch::Sender<bool>,
    /// Requests to it in flight (Info requests, as heartbeats send, aside), and their gauge
    /// (`zr_router_node_in_flight`; taken when the links are made, after the binaries
    /// install their metrics exporter).
    in_flight: AtomicU64,
    in_flight_gauge: metrics::Gauge,
    /// Its name in metrics: `K`, or `K/J` with replicas.
    label: String,
    /// The connection last given up on, until one is made anew: if the node closed it (it
    /// stopped), calls go to its partners without trying it meanwhile (heartbeats do).
    forgotten: std::sync::Mutex<Option<Connection>>,
}

/// Where a node is reached.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    endpoint: Endpoint,
}

/// A node's reply, decoded, with the message as it arrived (chunks of received packets,
/// forwarded to clients without a copy); its body starts `body_start` bytes in.
pub struct NodeReply {
    pub reply: Reply,
    pub chunks: Vec<Bytes>,
    pub body_start: usize,
}

impl NodeReply {
    /// The body, in one piece.
    pub fn body(&self) -> Vec<u8> {
        let mut body = Chunks::new(&self.chunks);
        body.skip(self.body_start);
        body.to_vec()
    }
}

/// Every shard's nodes, in (shard, replica) order.
pub struct Nodes {
    /// Append-only: a shard added to the cluster gets its links at the end (see
    /// [`Nodes::grow`]); a link's place never changes.
    links: boxcar::Vec<NodeLink>,
    /// Shards whose links are all made.
    shards: std::sync::atomic::AtomicU32,
    /// Held while links are added.
    growing: std::sync::Mutex<()>,
    replicas: u32,
    /// What is known of the nodes and the replica record, and decided from it.
    state: Held,
    /// Which replicas are behind, as `state` last published it: what reads and writes go by.
    replica_record: ArcSwap<ReplicaRecord>,
    /// Turns reads among a shard's replicas.
    turn: AtomicU64,
    /// Woken when a replica may want catching up (marked behind, or back up).
    catch_up: Arc<tokio::sync::Notify>,
    /// Records a checked read found damaged, by node, for the router to repair.
    suspects: std::sync::Mutex<Vec<Suspect>>,
    security: Security,
    timeout: Duration,
    /// The cluster id and map version every request carries, once the router knows them.
    tag: arc_swap::ArcSwapOption<(String, u64)>,
    /// Woken when a node refuses a request as placed by another map than its own.
    stale_map: Arc<tokio::sync::Notify>,
    /// Where the nodes' liveness leases and the replica record are: a router's. A client
    /// reading one hop has none; it learns which replicas are in sync from its router
    /// ([`Nodes::adopt`]).
    meta: Option<Arc<dyn zr_meta::MetaStore>>,
    /// Set by [`Nodes::stop`]: the heartbeat tasks end.
    stopped: tokio::sync::watch::Sender<bool>,
    /// Heartbeats sent so far (see [`Nodes::heartbeats`]).
    beats: AtomicU64,
}

impl Nodes {
    /// A router's links to the nodes at `entries` — (shard, replica, address) of each, in
    /// nodes.toml — with `shards` shards of `replicas` replicas, every wait bounded by
    /// `timeout`; the replica marks and liveness leases are kept in `meta`. Connections are
    /// made on first use. What they learn is stepped in the router's `coordinator` (whose
    /// replica set, empty, of `replicas` per shard, gets `entries` here), or, without one, in
    /// a replica set of their own.
    pub fn for_router(
        entries: &[(u32, u32, SocketAddr)],
        shards: u32,
        replicas: u32,
        security: Security,
        timeout: Duration,
        meta: Arc<dyn zr_meta::MetaStore>,
        coordinator: Option<Arc<std::sync::Mutex<Coordinator>>>,
    ) -> Result<Nodes, Error> {
        let mut entries = entries.to_vec();
        entries.sort_by_key(|&(shard, replica, _)| (shard, replica));
        let state = match coordinator {
            Some(coordinator) => Held::Coordinator(coordinator),
            None => Held::Own(std::sync::Mutex::new(Replicas::new(replicas))),
        };
        Nodes::with_links(
            &entries,
            shards,
            replicas,
            security,
            timeout,
            Some(meta),
            state,
        )
    }

    /// A client's links to the nodes of `topology`, as its router gave it: reads go to the
    /// replicas the router has in sync, every request carries its cluster id and map version.
    /// Heartbeats start with [`Nodes::watch`].
    pub fn for_client(
        topology: &wire::Topology,
        security: Security,
        timeout: Duration,
    ) -> Result<Nodes, Error> {
        let mut entries = Vec::with_capacity(topology.nodes.len());
        for node in &topology.nodes {
            let addr = node.addr.parse::<SocketAddr>().map_err(|e| {
                Error::Client(format!(
                    "the router gives shard {} replica {} the address '{}', which is no address: {e}",
                    node.shard, node.replica, node.addr
                ))
            })?;
            entries.push((node.shard, node.replica, addr));
        }
        entries.sort_by_key(|&(shard, replica, _)| (shard, replica));
        let expected = topology.shards as usize * topology.replicas as usize;
        let in_order = entries
            .iter()
            .enumerate()
            .all(|(k, &(shard, replica, _))| (shard * topology.replicas + replica) as usize == k);
        if entries.len() != expected || !in_order {
            return Err(Error::Client(format!(
                "the router lists {} nodes for {} shards of {} replicas: not one per shard and replica",
                entries.len(),
                topology.shards,
                topology.replicas
            )));
        }
        let nodes = Nodes::with_links(
            &entries,
            topology.shards,
            topology.replicas,
            security,
            timeout,
            None,
            Held::Own(std::sync::Mutex::new(Replicas::new(topology.replicas))),
        )?;
        nodes.set_cluster(&topology.cluster, topology.map.version);
        // Nothing to perform: the links were made at the addresses the record gives.
        let _ = nodes.tell(Event::Record(client_record(topology, &nodes)));
        Ok(nodes)
    }

    fn with_links(
        entries: &[(u32, u32, SocketAddr)],
        shards: u32,
        replicas: u32,
        security: Security,
        timeout: Duration,
        meta: Option<Arc<dyn zr_meta::MetaStore>>,
        state: Held,
    ) -> Result<Nodes, Error> {
        let links = boxcar::Vec::new();
        for &(shard, replica, addr) in entries {
            state
                .lock()
                .add(shard, replica, addr)
                .map_err(Error::Client)?;
            links.push(NodeLink::new(shard, replica, addr, replicas)?);
        }
        Ok(Nodes {
            links,
            shards: std::sync::atomic::AtomicU32::new(shards),
            growing: std::sync::Mutex::new(()),
            replicas,
            state,
            replica_record: ArcSwap::from_pointee(ReplicaRecord::default()),
            turn: AtomicU64::new(0),
            catch_up: Arc::new(tokio::sync::Notify::new()),
            suspects: std::sync::Mutex::new(Vec::new()),
            security,
            timeout,
            tag: arc_swap::ArcSwapOption::empty(),
            stale_map: Arc::new(tokio::sync::Notify::new()),
            meta,
            stopped: tokio::sync::watch::Sender::new(false),
            beats: AtomicU64::new(0),
        })
    }

    /// A client takes `topology` from its router anew: links to shards added since, which
    /// replicas are in sync and where each is served, the cluster id and map version its
    /// requests carry.
    pub async fn adopt(self: &Arc<Self>, topology: &wire::Topology) -> Result<(), Failure> {
        for shard in self.shards()..topology.shards {
            let mut addrs: Vec<(u32, SocketAddr)> = Vec::new();
            for node in topology.nodes.iter().filter(|n| n.shard == shard) {
                let addr = node.addr.parse::<SocketAddr>().map_err(|e| {
                    Failure::Inconsistent(format!(
                        "the router gives shard {shard} replica {} the address '{}', which is no address: {e}",
                        node.replica, node.addr
                    ))
                })?;
                addrs.push((node.replica, addr));
            }
            addrs.sort_by_key(|&(replica, _)| replica);
            let addrs: Vec<SocketAddr> = addrs.into_iter().map(|(_, addr)| addr).collect();
            self.grow(shard, &addrs)?;
        }
        self.set_cluster(&topology.cluster, topology.map.version);
        self.set_record(client_record(topology, self)).await;
        Ok(())
    }

    /// From now on every request carries cluster id `cluster` and map version `version`,
    /// and nodes refuse it if their data is of another cluster or map.
    pub fn set_cluster(&self, cluster: &str, version: u64) {
        self.tag
            .store(Some(Arc::new((cluster.to_string(), version))));
    }

    /// Woken when a node refuses a request as placed by another map (see `set_cluster`).
    pub fn stale_map(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.stale_map)
    }

    /// `request` for node `node`, encoded with this router's cluster id and map version and
    /// the shard and replica it is meant for: a node that is not that one refuses it (a
    /// nodes.toml with two nodes' addresses swapped fails loudly, and changes nothing).
    pub fn encode(
        &self,
        dataset: Option<&str>,
        node: NodeId,
        request: &NodeRequest,
    ) -> Result<Vec<u8>, zr_proto::Error> {
        self.encode_at(dataset, node, None, request)
    }

    /// [`Self::encode`], placed by map `map_version` (`None`: the router's map now) — the
    /// version of the placement the request's local indices were computed with, so that a
    /// map adopted between planning and sending cannot pair the old indices with the new
    /// version.
    pub fn encode_at(
        &self,
        dataset: Option<&str>,
        node: NodeId,
        map_version: Option<u64>,
        request: &NodeRequest,
    ) -> Result<Vec<u8>, zr_proto::Error> {
        let target = wire::Target {
            shard: self.shard(node),
            replica: self.replica(node),
        };
        self.encode_for(dataset, target, map_version, request)
    }

    /// `request` for the node that is `target`, with this router's cluster id and map
    /// version (`map_version`, if given).
    fn encode_for(
        &self,
        dataset: Option<&str>,
        target: wire::Target,
        map_version: Option<u64>,
        request: &NodeRequest,
    ) -> Result<Vec<u8>, zr_proto::Error> {
        match self.tag.load().as_deref() {
            Some((cluster, version)) => wire::encode_node_request(
                Some(cluster),
                dataset,
                map_version.unwrap_or(*version),
                Some(target),
                request,
            ),
            None => wire::encode_node_request(None, dataset, 0, Some(target), request),
        }
    }

    /// Asks the node at `addr` — not (yet) a link of this router — for its length, as shard
    /// `shard`'s replica `replica`, over a connection of its own that is closed after: a node
    /// that does not answer, or is another node, leaves nothing behind.
    pub async fn probe(&self, addr: SocketAddr, shard: u32, replica: u32) -> Result<u64, Failure> {
        let unavailable = |reason: String| Failure::ShardUnavailable {
            shard,
            addr,
            reason,
        };
        let header = self
            .encode_for(
                None,
                wire::Target { shard, replica },
                None,
                &NodeRequest::Info,
            )
            .map_err(|e| Failure::BadRequest(e.to_string()))?;
        let endpoint = zr_net::client_endpoint(addr).map_err(|e| unavailable(e.to_string()))?;
        let asked = async {
            let connection = zr_net::connect(&endpoint, &self.security, addr, self.timeout)
                .await
                .map_err(|e| unavailable(e.to_string()))?;
            let chunks = zr_net::call_chunks(&connection, header, Vec::new(), self.timeout).await;
            connection.close(0u32.into(), b"probed");
            let chunks = chunks.map_err(|e| unavailable(e.to_string()))?;
            match wire::decode_reply_chunks(&chunks)
                .map_err(|e| unavailable(e.to_string()))?
                .0
            {
                Reply::Info { len, .. } => Ok(len),
                Reply::Error { code, message } => Err(Failure::ShardRefused {
                    shard,
                    code,
                    message,
                }),
                other => Err(unavailable(format!("answered Info with {other:?}"))),
            }
        };
        let answer = tokio::time::timeout(self.timeout, asked)
            .await
            .unwrap_or_else(|_| {
                Err(unavailable(format!(
                    "no answer within {} ms",
                    self.timeout.as_millis()
                )))
            });
        endpoint.close(0u32.into(), b"probed");
        answer
    }

    /// How many shards there are.
    pub fn shards(&self) -> u32 {
        self.shards.load(Ordering::Acquire)
    }

    /// Adds links to shard `shard`'s nodes at `addrs` (one per replica, in order), and their
    /// heartbeats: a shard added to the cluster after this router started. Nothing to do for
    /// a shard it knows; refused for one that is not the next.
    pub fn grow(self: &Arc<Self>, shard: u32, addrs: &[SocketAddr]) -> Result<(), Failure> {
        let _growing = self.growing.lock().unwrap_or_else(|e| e.into_inner());
        let known = self.shards();
        if shard < known {
            return Ok(());
        }
        if shard > known || addrs.len() != self.replicas as usize {
            return Err(Failure::Inconsistent(format!(
                "cannot add links to shard {shard} with {} addresses: this router knows shards 0..{known}, with {} replicas each",
                addrs.len(),
                self.replicas
            )));
        }
        let mut links = Vec::new();
        for (replica, &addr) in addrs.iter().enumerate() {
            let link = NodeLink::new(shard, replica as u32, addr, self.replicas).map_err(|e| {
                Failure::ShardUnavailable {
                    shard,
                    addr,
                    reason: e.to_string(),
                }
            })?;
            links.push((link, addr));
        }
        let mut added = Vec::new();
        for (replica, (link, addr)) in links.into_iter().enumerate() {
            self.state()
                .add(shard, replica as u32, addr)
                .map_err(Failure::Inconsistent)?;
            added.push(self.links.push(link));
        }
        self.shards.store(shard + 1, Ordering::Release);
        for node in added {
            self.watch_node(node);
        }
        tracing::info!("shard {shard}'s nodes added: {addrs:?}");
        Ok(())
    }

    /// How many nodes hold each shard.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// Every node.
    pub fn all(&self) -> std::ops::Range<NodeId> {
        0..self.shards() as usize * self.replicas as usize
    }

    /// Shard `shard`'s replica `replica`.
    pub fn id(&self, shard: u32, replica: u32) -> NodeId {
        (shard * self.replicas + replica) as NodeId
    }

    /// Shard `shard`'s nodes.
    pub fn of_shard(&self, shard: u32) -> std::ops::Range<NodeId> {
        self.id(shard, 0)..self.id(shard + 1, 0)
    }

    /// The shard node `node` holds.
    pub fn shard(&self, node: NodeId) -> u32 {
        self.links[node].shard
    }

    /// Which of its shard's replicas node `node` is.
    pub fn replica(&self, node: NodeId) -> u32 {
        self.links[node].replica
    }

    /// Node `node`'s address, for errors.
    pub fn addr(&self, node: NodeId) -> SocketAddr {
        self.links[node]
            .target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .addr
    }

    /// Node `node` could not be reached, or failed: `reason`.
    pub fn unavailable(&self, node: NodeId, reason: String) -> Failure {
        Failure::ShardUnavailable {
            shard: self.shard(node),
            addr: self.addr(node),
            reason,
        }
    }

    /// How long ago node `node` last answered, if it ever did.
    pub fn last_seen(&self, node: NodeId) -> Option<Duration> {
        self.state().last_seen(node, now())
    }

    /// The round-trip time of the connection to node `node`, if there is one.
    pub fn rtt(&self, node: NodeId) -> Option<Duration> {
        let cached = self.links[node].connection.try_lock().ok()?;
        let connection = cached.as_ref().filter(|c| c.close_reason().is_none())?;
        Some(connection.stats().path.rtt)
    }

    /// True unless node `node` is marked behind.
    pub fn in_sync(&self, node: NodeId) -> bool {
        self.replica_record
            .load()
            .in_sync((self.shard(node), self.replica(node)))
    }

    /// Shard `shard`'s in-sync nodes.
    pub fn in_sync_of(&self, shard: u32) -> Vec<NodeId> {
        self.of_shard(shard).filter(|&n| self.in_sync(n)).collect()
    }

    /// The nodes to read shard `shard` from, best first: its in-sync replicas, each read
    /// taking the next in turn (so every replica serves), those known down last.
    pub fn read_order(&self, shard: u32) -> Vec<NodeId> {
        let in_sync = self.in_sync_of(shard);
        if in_sync.len() < 2 {
            return in_sync;
        }
        let turn = self.turn.fetch_add(1, Ordering::Relaxed) as usize;
        zr_coord::failover::read_order(in_sync, turn, |node| self.is_down(node))
    }

    /// Waits until node `node`'s heartbeats find it down (forever, if they never do).
    pub async fn wait_down(&self, node: NodeId) {
        let mut health = self.links[node].health.subscribe();
        if health
            .wait_for(|h| matches!(h, Health::Down { .. }))
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// Waits until a heartbeat to node `node` fails (forever, if none does): one failure,
    /// not the two that make it down — soon enough for a read to turn to a partner replica
    /// without waiting for the node to be found down, and harmless if the node was only
    /// late (the partner serves the read).
    pub async fn wait_failing(&self, node: NodeId) {
        let mut failing = self.links[node].failing.subscribe();
        if failing.wait_for(|&f| f).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// True if node `node`'s heartbeats have found it down (and not up since).
    pub fn found_down(&self, node: NodeId) -> bool {
        matches!(*self.links[node].health.borrow(), Health::Down { .. })
    }

    /// True if node `node`'s heartbeats have found it down, or it closed its last
    /// connection and none was made since.
    pub fn is_down(&self, node: NodeId) -> bool {
        let link = &self.links[node];
        let cached_closed = link
            .connection
            .try_lock()
            .is_ok_and(|c| c.as_ref().is_some_and(closed_by_peer));
        cached_closed
            || matches!(*link.health.borrow(), Health::Down { .. })
            || link
                .forgotten
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(closed_by_peer)
    }

    /// A checked read of `indices` (shard-local) of `dataset` on node `node` found a copy
    /// damaged: noted for the router's repair task, which it wakes.
    pub fn suspect(&self, dataset: Option<Arc<str>>, node: NodeId, indices: Vec<u64>) {
        self.suspects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((dataset, node, indices));
        self.catch_up.notify_one();
    }

    /// The damaged reads noted since the last call.
    pub fn take_suspects(&self) -> Vec<Suspect> {
        std::mem::take(&mut *self.suspects.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Counts a request to node `node` in flight until the guard is dropped
    /// (`zr_router_node_in_flight`).
    pub fn in_flight(&self, node: NodeId) -> InFlight<'_> {
        let link = &self.links[node];
        let now = link.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        link.in_flight_gauge.set(now as f64);
        InFlight { link }
    }

    /// Sets every node's `zr_router_node_in_flight` again (gauges not set for a while drop
    /// out of the exposition).
    pub fn refresh_in_flight(&self) {
        for (_, link) in self.links.iter() {
            link.in_flight_gauge
                .set(link.in_flight.load(Ordering::Relaxed) as f64);
        }
    }

    /// What wakes the router's catch-up task: a replica may want catching up (marked
    /// behind, moved, or back up).
    pub fn catch_up_wanted(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.catch_up)
    }

    /// The metadata store, which only a router's links have.
    fn meta(&self) -> Result<&dyn zr_meta::MetaStore, Failure> {
        self.meta.as_deref().ok_or_else(|| {
            Failure::Inconsistent("a client's links to the nodes keep no replica record".into())
        })
    }

    /// Every network wait's bound.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The decisions' state, locked (briefly: nothing waits while it is held). A router's
    /// is its coordinator's lock: never taken while the router holds that.
    fn state(&self) -> StateGuard<'_> {
        self.state.lock()
    }

    /// Tells the state `event`, performs what follows at once (publishing the record and
    /// health, waking the catch-up task, logging) under its lock, so that what is published
    /// goes in the order decided; returns what needs a wait (a node marked behind, a node
    /// reached elsewhere), for the caller to perform.
    pub(super) fn tell(&self, event: Event) -> Vec<Effect> {
        let mut state = self.state();
        let now = now();
        state.handle(event, now);
        let mut later = Vec::new();
        while let Some(effect) = state.poll() {
            match effect {
                Effect::Publish(record) => self.replica_record.store(record),
                Effect::Health { node, health } => {
                    let link = &self.links[node];
                    match health.describe_down(now) {
                        Some(down) => {
                            tracing::warn!("shard {} at {}: {down}", link.shard, link.target().addr)
                        }
                        None if health == Health::Up => {
                            tracing::info!("shard {} at {} is up", link.shard, link.target().addr)
                        }
                        None => {}
                    }
                    link.health.send_replace(health);
                }
                Effect::Failing { node, failing } => {
                    self.links[node].failing.send_replace(failing);
                }
                Effect::CatchUp => self.catch_up.notify_one(),
                Effect::Warn(message) => tracing::error!("{message}"),
                Effect::MarkBehind { .. } | Effect::Retarget { .. } => later.push(effect),
            }
        }
        later
    }
}

/// Where a set of links keeps its replica state: a client reading one hop, its own; a
/// router, in its coordinator, beside everything else it decides (one lock for all).
enum Held {
    Own(std::sync::Mutex<Replicas>),
    Coordinator(Arc<std::sync::Mutex<Coordinator>>),
}

impl Held {
    fn lock(&self) -> StateGuard<'_> {
        match self {
            Held::Own(own) => StateGuard::Own(lock(own)),
            Held::Coordinator(coordinator) => StateGuard::Coordinator(lock(coordinator)),
        }
    }
}

/// The replica state, locked where it is held.
enum StateGuard<'a> {
    Own(std::sync::MutexGuard<'a, Replicas>),
    Coordinator(std::sync::MutexGuard<'a, Coordinator>),
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = Replicas;

    fn deref(&self) -> &Replicas {
        match self {
            StateGuard::Own(own) => own,
            StateGuard::Coordinator(coordinator) => coordinator.replicas(),
        }
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut Replicas {
        match self {
            StateGuard::Own(own) => own,
            StateGuard::Coordinator(coordinator) => coordinator.replicas_mut(),
        }
    }
}

/// `mutex` locked; a panic while it was held poisons nothing here (every state it guards is
/// whole between statements).
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Now, by the runtime's clock (virtual in tests on paused time), as the state takes it.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl NodeLink {
    /// The link to shard `shard`'s replica `replica` at `addr`; connected on first use.
    fn new(shard: u32, replica: u32, addr: SocketAddr, replicas: u32) -> Result<NodeLink, Error> {
        let label = if replicas == 1 {
            shard.to_string()
        } else {
            format!("{shard}/{replica}")
        };
        Ok(NodeLink {
            shard,
            replica,
            target: std::sync::Mutex::new(Target {
                addr,
                endpoint: zr_net::client_endpoint(addr)?,
            }),
            connection: Mutex::new(None),
            health: tokio::sync::watch::Sender::new(Health::Unknown),
            failing: tokio::sync::watch::Sender::new(false),
            in_flight: AtomicU64::new(0),
            in_flight_gauge: metrics::gauge!("zr_router_node_in_flight", "shard" => label.clone()),
            label,
            forgotten: std::sync::Mutex::new(None),
        })
    }

    /// Where the node is reached now.
    fn target(&self) -> Target {
        self.target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The replica record `topology` describes for a client's `nodes`: the replicas it has
/// behind, and as moved those it serves elsewhere than the client's links were made with.
fn client_record(topology: &wire::Topology, nodes: &Nodes) -> ReplicaRecord {
    let mut record = ReplicaRecord::default();
    for node in &topology.nodes {
        if !node.in_sync {
            record.behind.insert((node.shard, node.replica));
        }
        let id = nodes.id(node.shard, node.replica);
        let configured = (node.shard < nodes.shards())
            .then(|| nodes.state().configured(id))
            .flatten();
        if configured.is_some_and(|c| c.to_string() != node.addr) {
            record.moved.push(zr_meta::replicas::Moved {
                shard: node.shard,
                replica: node.replica,
                addr: node.addr.clone(),
            });
        }
    }
    record
}

/// True if `connection` was closed by its peer (a node that stopped says so as it goes).
fn closed_by_peer(connection: &Connection) -> bool {
    matches!(
        connection.close_reason(),
        Some(
            quinn::ConnectionError::ApplicationClosed(_)
                | quinn::ConnectionError::ConnectionClosed(_)
        )
    )
}

/// A request in flight to a node (see [`Nodes::in_flight`]).
pub struct InFlight<'a> {
    link: &'a NodeLink,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let now = self.link.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        self.link.in_flight_gauge.set(now as f64);
    }
}
