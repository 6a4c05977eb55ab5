//! The router's links to its nodes: one endpoint and connection per node (each shard has
//! `replicas` of them), reconnected on demand, a heartbeat per node (see `liveness.rs`), and
//! one request to a node within the router's timeout — or failed at once while it is down.
//!
//! Which replicas are in sync is kept here too, as last read from or written to the metadata
//! store (`zr_meta::replicas`): reads and writes go to in-sync replicas only. A heartbeat that
//! finds a node restarted (another incarnation) after this router wrote to it since its last
//! commit marks it behind: it may have lost those writes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use quinn::{Connection, Endpoint};
use tokio::sync::Mutex;
use zr_net::Security;
use zr_proto::chunks::Chunks;
use zr_proto::wire::{self, NodeRequest, Reply};
use zr_service::config::ClusterConfig;

use arc_swap::ArcSwap;
use zr_meta::replicas::{self, ReplicaRecord};

use crate::error::{Error, Failure};
use crate::liveness::{self, Health, Liveness};

/// A node: its place among the router's links, `shard * replicas + replica`.
pub(crate) type NodeId = usize;

/// One node, reconnected on demand, through an endpoint (a UDP socket) of its own: replies
/// from several nodes are then received in parallel, not by one socket's driver in turn.
/// Records a checked read found damaged: the dataset (`None`: the default one), the node,
/// the shard-local indices.
pub(crate) type Suspect = (Option<Arc<str>>, NodeId, Vec<u64>);

struct NodeLink {
    shard: u32,
    replica: u32,
    /// Its address in nodes.toml.
    configured: SocketAddr,
    /// Where it is served now (nodes.toml's address, or the one it was moved to by
    /// `zr cluster replace-node`), and the endpoint to reach it through.
    target: std::sync::Mutex<Target>,
    connection: Mutex<Option<Connection>>,
    /// When the node last answered.
    last_seen: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// Its heartbeats so far, and the health they give, published to the calls waiting for
    /// it to come back.
    liveness: std::sync::Mutex<Liveness>,
    health: tokio::sync::watch::Sender<Health>,
    /// Its last heartbeat failed (or it is down): a read its partner can serve need not
    /// wait for it to be found down (see [`Nodes::wait_failing`]).
    failing: tokio::sync::watch::Sender<bool>,
    /// The incarnation its last answer to a heartbeat gave.
    incarnation: std::sync::Mutex<Option<u64>>,
    /// This router wrote to it since its last commit: a restart may have lost writes.
    written: AtomicBool,
    /// The length its last answer to a heartbeat gave.
    len: std::sync::Mutex<Option<u64>>,
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
pub(crate) struct NodeReply {
    pub(crate) reply: Reply,
    pub(crate) chunks: Vec<Bytes>,
    pub(crate) body_start: usize,
}

impl NodeReply {
    /// The body, in one piece.
    pub(crate) fn body(&self) -> Vec<u8> {
        let mut body = Chunks::new(&self.chunks);
        body.skip(self.body_start);
        body.to_vec()
    }
}

/// Every shard's nodes, in (shard, replica) order.
pub(crate) struct Nodes {
    /// Append-only: a shard added to the cluster gets its links at the end (see
    /// [`Nodes::grow`]); a link's place never changes.
    links: boxcar::Vec<NodeLink>,
    /// Shards whose links are all made.
    shards: std::sync::atomic::AtomicU32,
    /// Held while links are added.
    growing: std::sync::Mutex<()>,
    replicas: u32,
    /// Which replicas are behind, as last read from or written to the metadata store.
    replica_record: ArcSwap<ReplicaRecord>,
    /// Until when writes are not acknowledged (see [`Nodes::acks_may_go`]).
    acks_after: std::sync::Mutex<Option<tokio::time::Instant>>,
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
}

impl Nodes {
    /// An endpoint for each shard of `config`; connections are made on first use.
    pub(crate) fn new(
        config: &ClusterConfig,
        security: Security,
        meta: Arc<dyn zr_meta::MetaStore>,
    ) -> Result<Nodes, Error> {
        let mut entries: Vec<_> = config
            .shards
            .iter()
            .map(|s| (s.id, s.replica, s.addr))
            .collect();
        entries.sort_by_key(|&(shard, replica, _)| (shard, replica));
        Nodes::with_links(
            &entries,
            config.cluster.shards,
            config.cluster.replicas,
            security,
            Duration::from_millis(config.router.timeout_ms),
            Some(meta),
        )
    }

    /// A client's links to the nodes of `topology`, as its router gave it: reads go to the
    /// replicas the router has in sync, every request carries its cluster id and map version.
    /// Heartbeats start with [`Nodes::watch`].
    pub(crate) fn for_client(
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
        )?;
        nodes.set_cluster(&topology.cluster, topology.map.version);
        nodes
            .replica_record
            .store(Arc::new(client_record(topology, &nodes)));
        Ok(nodes)
    }

    fn with_links(
        entries: &[(u32, u32, SocketAddr)],
        shards: u32,
        replicas: u32,
        security: Security,
        timeout: Duration,
        meta: Option<Arc<dyn zr_meta::MetaStore>>,
    ) -> Result<Nodes, Error> {
        let links = boxcar::Vec::new();
        for &(shard, replica, addr) in entries {
            links.push(NodeLink::new(shard, replica, addr, replicas)?);
        }
        Ok(Nodes {
            links,
            shards: std::sync::atomic::AtomicU32::new(shards),
            growing: std::sync::Mutex::new(()),
            replicas,
            replica_record: ArcSwap::from_pointee(ReplicaRecord::default()),
            acks_after: std::sync::Mutex::new(None),
            turn: AtomicU64::new(0),
            catch_up: Arc::new(tokio::sync::Notify::new()),
            suspects: std::sync::Mutex::new(Vec::new()),
            security,
            timeout,
            tag: arc_swap::ArcSwapOption::empty(),
            stale_map: Arc::new(tokio::sync::Notify::new()),
            meta,
        })
    }

    /// A client takes `topology` from its router anew: links to shards added since, which
    /// replicas are in sync and where each is served, the cluster id and map version its
    /// requests carry.
    pub(crate) async fn adopt(self: &Arc<Self>, topology: &wire::Topology) -> Result<(), Failure> {
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
    pub(crate) fn set_cluster(&self, cluster: &str, version: u64) {
        self.tag
            .store(Some(Arc::new((cluster.to_string(), version))));
    }

    /// Woken when a node refuses a request as placed by another map (see `set_cluster`).
    pub(crate) fn stale_map(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.stale_map)
    }

    /// `request` for node `node`, encoded with this router's cluster id and map version and
    /// the shard and replica it is meant for: a node that is not that one refuses it (a
    /// nodes.toml with two nodes' addresses swapped fails loudly, and changes nothing).
    pub(crate) fn encode(
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
    pub(crate) fn encode_at(
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
    pub(crate) async fn probe(
        &self,
        addr: SocketAddr,
        shard: u32,
        replica: u32,
    ) -> Result<u64, Failure> {
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
    pub(crate) fn shards(&self) -> u32 {
        self.shards.load(Ordering::Acquire)
    }

    /// Adds links to shard `shard`'s nodes at `addrs` (one per replica, in order), and their
    /// heartbeats: a shard added to the cluster after this router started. Nothing to do for
    /// a shard it knows; refused for one that is not the next.
    pub(crate) fn grow(self: &Arc<Self>, shard: u32, addrs: &[SocketAddr]) -> Result<(), Failure> {
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
        let mut added = Vec::new();
        for (replica, &addr) in addrs.iter().enumerate() {
            let link = NodeLink::new(shard, replica as u32, addr, self.replicas).map_err(|e| {
                Failure::ShardUnavailable {
                    shard,
                    addr,
                    reason: e.to_string(),
                }
            })?;
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
    pub(crate) fn replicas(&self) -> u32 {
        self.replicas
    }

    /// Every node.
    pub(crate) fn all(&self) -> std::ops::Range<NodeId> {
        0..self.shards() as usize * self.replicas as usize
    }

    /// Shard `shard`'s replica `replica`.
    pub(crate) fn id(&self, shard: u32, replica: u32) -> NodeId {
        (shard * self.replicas + replica) as NodeId
    }

    /// Shard `shard`'s nodes.
    pub(crate) fn of_shard(&self, shard: u32) -> std::ops::Range<NodeId> {
        self.id(shard, 0)..self.id(shard + 1, 0)
    }

    /// The shard node `node` holds.
    pub(crate) fn shard(&self, node: NodeId) -> u32 {
        self.links[node].shard
    }

    /// Which of its shard's replicas node `node` is.
    pub(crate) fn replica(&self, node: NodeId) -> u32 {
        self.links[node].replica
    }

    /// Node `node`'s address, for errors.
    pub(crate) fn addr(&self, node: NodeId) -> SocketAddr {
        self.links[node]
            .target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .addr
    }

    /// Node `node` could not be reached, or failed: `reason`.
    pub(crate) fn unavailable(&self, node: NodeId, reason: String) -> Failure {
        Failure::ShardUnavailable {
            shard: self.shard(node),
            addr: self.addr(node),
            reason,
        }
    }

    /// How long ago node `node` last answered, if it ever did.
    pub(crate) fn last_seen(&self, node: NodeId) -> Option<Duration> {
        let seen = *self.links[node]
            .last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        seen.map(|at| at.elapsed())
    }

    /// The round-trip time of the connection to node `node`, if there is one.
    pub(crate) fn rtt(&self, node: NodeId) -> Option<Duration> {
        let cached = self.links[node].connection.try_lock().ok()?;
        let connection = cached.as_ref().filter(|c| c.close_reason().is_none())?;
        Some(connection.stats().path.rtt)
    }

    /// True unless node `node` is marked behind.
    pub(crate) fn in_sync(&self, node: NodeId) -> bool {
        self.replica_record
            .load()
            .in_sync((self.shard(node), self.replica(node)))
    }

    /// Shard `shard`'s in-sync nodes.
    pub(crate) fn in_sync_of(&self, shard: u32) -> Vec<NodeId> {
        self.of_shard(shard).filter(|&n| self.in_sync(n)).collect()
    }

    /// The nodes to read shard `shard` from, best first: its in-sync replicas, each read
    /// taking the next in turn (so every replica serves), those known down last.
    pub(crate) fn read_order(&self, shard: u32) -> Vec<NodeId> {
        let mut order = self.in_sync_of(shard);
        if order.len() > 1 {
            let turn = self.turn.fetch_add(1, Ordering::Relaxed) as usize % order.len();
            order.rotate_left(turn);
            order.sort_by_key(|&n| self.is_down(n));
        }
        order
    }

    /// Waits until node `node`'s heartbeats find it down (forever, if they never do).
    pub(crate) async fn wait_down(&self, node: NodeId) {
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
    pub(crate) async fn wait_failing(&self, node: NodeId) {
        let mut failing = self.links[node].failing.subscribe();
        if failing.wait_for(|&f| f).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// True if node `node`'s heartbeats have found it down (and not up since).
    pub(crate) fn found_down(&self, node: NodeId) -> bool {
        matches!(*self.links[node].health.borrow(), Health::Down { .. })
    }

    /// True if node `node`'s heartbeats have found it down, or it closed its last
    /// connection and none was made since.
    pub(crate) fn is_down(&self, node: NodeId) -> bool {
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
    pub(crate) fn suspect(&self, dataset: Option<Arc<str>>, node: NodeId, indices: Vec<u64>) {
        self.suspects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((dataset, node, indices));
        self.catch_up.notify_one();
    }

    /// The damaged reads noted since the last call.
    pub(crate) fn take_suspects(&self) -> Vec<Suspect> {
        std::mem::take(&mut *self.suspects.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Counts a request to node `node` in flight until the guard is dropped
    /// (`zr_router_node_in_flight`).
    pub(crate) fn in_flight(&self, node: NodeId) -> InFlight<'_> {
        let link = &self.links[node];
        let now = link.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        link.in_flight_gauge.set(now as f64);
        InFlight { link }
    }

    /// Sets every node's `zr_router_node_in_flight` again (gauges not set for a while drop
    /// out of the exposition).
    pub(crate) fn refresh_in_flight(&self) {
        for (_, link) in self.links.iter() {
            link.in_flight_gauge
                .set(link.in_flight.load(Ordering::Relaxed) as f64);
        }
    }

    /// What wakes the router's catch-up task (see [`Self::catch_up`]).
    pub(crate) fn catch_up_wanted(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.catch_up)
    }

    /// The metadata store, which only a router's links have.
    fn meta(&self) -> Result<&dyn zr_meta::MetaStore, Failure> {
        self.meta.as_deref().ok_or_else(|| {
            Failure::Inconsistent("a client's links to the nodes keep no replica record".into())
        })
    }

    /// Re-reads which replicas are behind, and where they are, from the metadata store.
    pub(crate) async fn refresh_replicas(&self) -> Result<(), Failure> {
        let (record, _) = replicas::load(self.meta()?).await.map_err(Failure::from)?;
        self.set_record(record).await;
        Ok(())
    }

    /// Takes `record` as the replica record: which replicas are behind, and the addresses
    /// replicas were moved to. A node whose address changed is reached there from now on,
    /// known afresh: its old connection closed, its health, length and incarnation
    /// forgotten (the heartbeats learn the new node's).
    async fn set_record(&self, record: ReplicaRecord) {
        // Only a change gives the catch-up task something new to look at.
        let before = self.replica_record.load_full();
        let changed = *before != record;
        // A replica no longer in sync, or no longer at its address, may still serve
        // clients by itself until its read lease runs out: no write it misses is
        // acknowledged before then.
        if self.links.iter().any(|(_, link)| {
            let id = (link.shard, link.replica);
            (before.in_sync(id) && !record.in_sync(id))
                || before.moved_to(id) != record.moved_to(id)
        }) {
            self.hold_acks();
        }
        for (node, link) in self.links.iter() {
            let wanted = match record.moved_to((link.shard, link.replica)) {
                None => link.configured,
                Some(text) => match text.parse::<SocketAddr>() {
                    Ok(addr) => addr,
                    Err(e) => {
                        tracing::error!(
                            "the replica record moves shard {} replica {} to '{text}', which is no address ({e}); it stays at {}",
                            link.shard,
                            link.replica,
                            self.addr(node)
                        );
                        continue;
                    }
                },
            };
            let current = link.target();
            if current.addr == wanted {
                continue;
            }
            let endpoint = if current.addr.is_ipv4() == wanted.is_ipv4() {
                current.endpoint.clone()
            } else {
                match zr_net::client_endpoint(wanted) {
                    Ok(endpoint) => endpoint,
                    Err(e) => {
                        tracing::error!(
                            "shard {} replica {} moved to {wanted}, but no endpoint reaches it: {e}",
                            link.shard,
                            link.replica
                        );
                        continue;
                    }
                }
            };
            let mut cached = link.connection.lock().await;
            *link.target.lock().unwrap_or_else(|e| e.into_inner()) = Target {
                addr: wanted,
                endpoint,
            };
            if let Some(old) = cached.take() {
                old.close(0u32.into(), b"the node moved");
            }
            drop(cached);
            *link.forgotten.lock().unwrap_or_else(|e| e.into_inner()) = None;
            *link.incarnation.lock().unwrap_or_else(|e| e.into_inner()) = None;
            *link.len.lock().unwrap_or_else(|e| e.into_inner()) = None;
            *link.last_seen.lock().unwrap_or_else(|e| e.into_inner()) = None;
            *link.liveness.lock().unwrap_or_else(|e| e.into_inner()) = Liveness::default();
            link.written.store(false, Ordering::SeqCst);
            link.health.send_replace(Health::Unknown);
            link.failing.send_replace(false);
            tracing::warn!(
                "shard {} replica {} moved from {} to {wanted}: reached there from now on",
                link.shard,
                link.replica,
                current.addr
            );
        }
        self.replica_record.store(Arc::new(record));
        if changed {
            self.catch_up.notify_one();
        }
    }

    /// Serves shard `shard`'s replica `replica` from `addr` from now on: recorded in the
    /// metadata store (the replica marked behind, as the node there holds nothing yet) and
    /// taken up here; the catch-up task then rebuilds it from a partner. Refused unless a
    /// partner is in sync.
    pub(crate) async fn move_replica(
        &self,
        shard: u32,
        replica: u32,
        addr: SocketAddr,
    ) -> Result<(), Failure> {
        let record = replicas::move_replica(
            self.meta()?,
            (shard, replica),
            self.replicas,
            &addr.to_string(),
        )
        .await
        .map_err(|e| match e {
            replicas::MarkError::LastInSync(_) => Failure::BadRequest(format!(
                "shard {shard} replica {replica} cannot be replaced now: no other replica of shard {shard} is in sync to rebuild it from"
            )),
            replicas::MarkError::Store(e) => Failure::from(e),
            other => Failure::Inconsistent(other.to_string()),
        })?;
        tracing::warn!(
            "shard {shard} replica {replica} is being replaced by the node at {addr}: it serves nothing until it is rebuilt"
        );
        // The replaced node, if it still runs, stops serving clients before any write
        // it misses is acknowledged (see `acks_may_go`).
        self.set_record(record).await;
        Ok(())
    }

    /// Marks node `node` behind in the metadata store (it missed a write, or may have):
    /// it serves nothing until it has caught up. Refused for its shard's last in-sync node.
    pub(crate) async fn mark_behind(&self, node: NodeId, why: &str) -> Result<(), Failure> {
        if !self.in_sync(node) {
            return Ok(());
        }
        let (shard, replica) = (self.shard(node), self.replica(node));
        match replicas::mark_behind(self.meta()?, (shard, replica), self.replicas).await {
            Ok(record) => {
                tracing::warn!(
                    "shard {shard} replica {replica} at {} is behind ({why}): it serves nothing until it has caught up",
                    self.addr(node)
                );
                // Clients read one hop from nodes that know themselves in sync: the node's
                // read lease runs out before what it missed is acknowledged (see
                // `acks_may_go`).
                self.set_record(record).await;
                Ok(())
            }
            Err(replicas::MarkError::Store(e)) => Err(Failure::from(e)),
            Err(e) => Err(Failure::Inconsistent(format!(
                "shard {shard} replica {replica} missed a write ({why}) but cannot be marked behind: {e}"
            ))),
        }
    }

    /// Holds the acknowledgment of writes for [`zr_meta::nodes::READ_LEASE_WAIT`] from now:
    /// a replica just seen to leave the in-sync set may serve clients by itself until then.
    fn hold_acks(&self) {
        let until = tokio::time::Instant::now() + zr_meta::nodes::READ_LEASE_WAIT;
        let mut after = self.acks_after.lock().unwrap_or_else(|e| e.into_inner());
        *after = Some(after.map_or(until, |t| t.max(until)));
    }

    /// Waits, before a client's write is acknowledged, until every replica this router saw
    /// leave the in-sync set (marked behind, or replaced) has stopped serving clients by
    /// itself (`zr_meta::nodes::ReadLease`): no one reads one hop, from a replica that missed
    /// it, what came before a write acknowledged. Only acknowledgments wait — the writes
    /// themselves, and a catch-up's work under the write lock, go on meanwhile. A router
    /// that learns of the change later, from the metadata store, waits from then.
    pub(crate) async fn acks_may_go(&self) {
        let after = *self.acks_after.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(until) = after {
            tokio::time::sleep_until(until).await;
        }
    }

    /// Marks node `node` in sync again: it holds what its partners hold.
    pub(crate) async fn mark_in_sync(&self, node: NodeId) -> Result<(), Failure> {
        let (shard, replica) = (self.shard(node), self.replica(node));
        let record = replicas::mark_in_sync(self.meta()?, (shard, replica))
            .await
            .map_err(Failure::from)?;
        tracing::info!(
            "shard {shard} replica {replica} at {} has caught up: in sync again",
            self.addr(node)
        );
        self.set_record(record).await;
        Ok(())
    }

    /// The length node `node` gave in its last answer to a heartbeat.
    pub(crate) fn heard_len(&self, node: NodeId) -> Option<u64> {
        *self.links[node]
            .len
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// This router wrote to node `node` (and it is not durable there until a commit).
    pub(crate) fn note_written(&self, node: NodeId) {
        self.links[node].written.store(true, Ordering::SeqCst);
    }

    /// Node `node` made every write so far durable.
    pub(crate) fn note_committed(&self, node: NodeId) {
        self.links[node].written.store(false, Ordering::SeqCst);
    }

    /// Every network wait's bound.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The open connection to node `node`, connected first (within `timeout`) if there is
    /// none.
    pub(crate) async fn link(&self, node: NodeId, timeout: Duration) -> Result<Connection, Error> {
        let id = node;
        let node = &self.links[node];
        let mut cached = node.connection.lock().await;
        match cached.as_ref().filter(|c| c.close_reason().is_none()) {
            Some(c) => Ok(c.clone()),
            None => {
                if let Some(closed) = cached.take() {
                    // Kept to tell calls meanwhile whether the node closed it (it stopped).
                    *node.forgotten.lock().unwrap_or_else(|e| e.into_inner()) = Some(closed);
                }
                let target = node.target();
                let c = zr_net::connect_to(
                    &target.endpoint,
                    &self.security,
                    target.addr,
                    timeout,
                    zr_net::Windows::ROUTER_TO_NODE,
                    Some(zr_net::tls::Role::Node),
                )
                .await?;
                *node.forgotten.lock().unwrap_or_else(|e| e.into_inner()) = None;
                // Before anything else goes over it: is this the process written to before?
                if let Some(incarnation) = self.incarnation_on(id, &c, timeout).await? {
                    self.check_incarnation(id, incarnation).await;
                }
                *cached = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// Forgets `connection` to node `node` after an exchange on it failed: the next call
    /// reconnects.
    pub(crate) async fn forget(&self, node: NodeId, connection: &Connection) {
        *self.links[node]
            .forgotten
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(connection.clone());
        let mut cached = self.links[node].connection.lock().await;
        if cached
            .as_ref()
            .is_some_and(|c| c.stable_id() == connection.stable_id())
        {
            *cached = None;
        }
    }

    /// Closes every node's connection (a client going away: the nodes free its slots at
    /// once); returns the endpoints, to wait on while the closes go out.
    pub(crate) fn close_all(&self) -> Vec<Endpoint> {
        self.links
            .iter()
            .map(|(_, link)| {
                if let Ok(cached) = link.connection.try_lock() {
                    if let Some(connection) = cached.as_ref() {
                        connection.close(0u32.into(), b"client done");
                    }
                }
                link.target().endpoint
            })
            .collect()
    }

    /// Starts a heartbeat task per node; each ends when the `Nodes` are dropped.
    pub(crate) fn watch(self: &Arc<Self>) {
        for node in self.all() {
            self.watch_node(node);
        }
    }

    /// Starts node `node`'s heartbeat task; it ends when the `Nodes` are dropped.
    fn watch_node(self: &Arc<Self>, node: NodeId) {
        {
            let nodes: Weak<Nodes> = Arc::downgrade(self);
            tokio::spawn(async move {
                for beat in 0u32.. {
                    let Some(pause) = (match nodes.upgrade() {
                        Some(nodes) => {
                            if beat % liveness::LEASE_READ_EVERY == 0 {
                                nodes.read_lease(node).await;
                                if node == 0 && nodes.replicas > 1 && nodes.meta.is_some() {
                                    // Marks other routers made.
                                    if let Err(e) = nodes.refresh_replicas().await {
                                        tracing::debug!("replica record: {e}");
                                    }
                                }
                            }
                            Some(nodes.heartbeat(node).await)
                        }
                        None => None,
                    }) else {
                        return;
                    };
                    tokio::time::sleep(pause).await;
                }
            });
        }
    }

    /// Reads node `node`'s liveness lease into its liveness (a store that cannot say
    /// changes nothing).
    async fn read_lease(&self, node: NodeId) {
        let (shard, replica) = (self.shard(node), self.replica(node));
        let Some(meta) = self.meta.as_deref() else {
            return;
        };
        match zr_meta::nodes::load(meta, shard, replica).await {
            Ok(lease) => self.links[node]
                .liveness
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .lease_read(
                    lease.map(|(_, revision)| revision),
                    tokio::time::Instant::now().into_std(),
                ),
            Err(e) => tracing::debug!("shard {shard} replica {replica}: its liveness lease: {e}"),
        }
    }

    /// Node `node`'s liveness lease, as this router has read it, in words.
    pub(crate) fn lease(&self, node: NodeId) -> String {
        self.links[node]
            .liveness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lease(tokio::time::Instant::now().into_std())
            .describe()
    }

    /// One heartbeat to node `node`, its outcome told to the node's liveness; returns the
    /// pause before the next.
    async fn heartbeat(&self, node: NodeId) -> Duration {
        let sent = tokio::time::Instant::now();
        let wall = SystemTime::now();
        let link = &self.links[node];
        let shard = link.shard;
        let timeout = {
            let liveness = link.liveness.lock().unwrap_or_else(|e| e.into_inner());
            liveness.timeout().min(self.timeout)
        };
        let outcome = self
            .exchange(None, node, &NodeRequest::Info, Vec::new(), timeout)
            .await;
        if let Ok(NodeReply {
            reply: Reply::Info { len, .. },
            ..
        }) = &outcome
        {
            *link.len.lock().unwrap_or_else(|e| e.into_inner()) = Some(*len);
        }
        let label = &link.label;
        if outcome.is_ok() || matches!(outcome, Err(Failure::ShardRefused { .. })) {
            metrics::histogram!("zr_router_node_heartbeat_seconds", "shard" => label.clone())
                .record(sent.elapsed());
        }
        if let Some(connection) = link.connection.try_lock().ok().and_then(|c| c.clone()) {
            let path = connection.stats().path;
            metrics::gauge!("zr_router_node_rtt_seconds", "shard" => label.clone())
                .set(path.rtt.as_secs_f64());
            metrics::gauge!("zr_router_node_cwnd_bytes", "shard" => label.clone())
                .set(path.cwnd as f64);
            metrics::gauge!("zr_router_node_lost_packets", "shard" => label.clone())
                .set(path.lost_packets as f64);
        }
        let mut liveness = link.liveness.lock().unwrap_or_else(|e| e.into_inner());
        let changed = match outcome {
            // Any answer, a refusal too, means the node is up.
            Ok(_) | Err(Failure::ShardRefused { .. }) => liveness.answered(),
            Err(failure) => liveness.failed(
                sent.into_std(),
                wall,
                tokio::time::Instant::now().into_std(),
                failure.to_string(),
            ),
        };
        if changed {
            let health = liveness.health().clone();
            match health.describe_down(sent.into_std()) {
                Some(down) => tracing::warn!("shard {shard} at {}: {down}", link.target().addr),
                None => {
                    tracing::info!("shard {shard} at {} is up", link.target().addr);
                    self.catch_up.notify_one();
                }
            }
            link.health.send_replace(health);
        }
        link.failing.send_if_modified(|failing| {
            let now = liveness.failing();
            std::mem::replace(failing, now) != now
        });
        let up = !matches!(liveness.health(), Health::Down { .. });
        metrics::gauge!("zr_router_node_up", "shard" => label.clone()).set(if up {
            1.0
        } else {
            0.0
        });
        liveness.pause()
    }

    /// The incarnation of the node at the far end of `connection`, new: asked before the
    /// connection is used (`None` if the node answers with a refusal of its own).
    async fn incarnation_on(
        &self,
        node: NodeId,
        connection: &Connection,
        timeout: Duration,
    ) -> Result<Option<u64>, Error> {
        let header = self.encode(None, node, &NodeRequest::Info)?;
        let chunks = zr_net::call_chunks(connection, header, Vec::new(), timeout).await?;
        match wire::decode_reply_chunks(&chunks)?.0 {
            Reply::Info { incarnation, .. } => Ok(Some(incarnation)),
            _ => Ok(None),
        }
    }

    /// Node `node`, connected anew, is the process `incarnation`: if that is another than
    /// before while this router's writes to it were not yet durable, it restarted and may have
    /// lost them, and is marked behind. Every connection is checked so before its first
    /// request, so no write is taken for one the node lost.
    async fn check_incarnation(&self, node: NodeId, incarnation: u64) {
        let link = &self.links[node];
        let before = link
            .incarnation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(incarnation);
        let restarted = before.is_some_and(|before| before != incarnation);
        if restarted && link.written.load(Ordering::SeqCst) && self.replicas > 1 {
            match self
                .mark_behind(node, "it restarted, losing writes it had not made durable")
                .await
            {
                Ok(()) => link.written.store(false, Ordering::SeqCst),
                Err(e) => tracing::error!("{e}"),
            }
        }
    }

    /// The refusal of a call to node `node` while it is down, after waiting a moment for a
    /// heartbeat to find it back; `None` if it is not down.
    pub(crate) async fn down(&self, node: NodeId) -> Option<Failure> {
        let link = &self.links[node];
        let shard = link.shard;
        let mut health = link.health.subscribe();
        if !matches!(*health.borrow(), Health::Down { .. }) {
            return None;
        }
        let back = health.wait_for(|h| !matches!(h, Health::Down { .. }));
        let _ = tokio::time::timeout(liveness::WAIT_FOR_UP, back).await;
        let reason = health
            .borrow()
            .describe_down(tokio::time::Instant::now().into_std())?;
        Some(Failure::ShardUnavailable {
            shard,
            addr: link.target().addr,
            reason,
        })
    }

    /// One request to node `node`; errors name its shard and address. Fails at once while
    /// the node is down, and as soon as its heartbeats find it down while the call waits.
    /// `dataset`: the dataset the request addresses (`None`: the default one).
    pub(crate) async fn call(
        &self,
        dataset: Option<&str>,
        node: NodeId,
        request: &NodeRequest,
        body: Vec<Bytes>,
    ) -> Result<NodeReply, Failure> {
        self.call_within(dataset, node, request, body, self.timeout)
            .await
    }

    /// [`Self::call`] within `timeout` rather than the router's.
    pub(crate) async fn call_within(
        &self,
        dataset: Option<&str>,
        node: NodeId,
        request: &NodeRequest,
        body: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<NodeReply, Failure> {
        if let Some(down) = self.down(node).await {
            return Err(down);
        }
        // A node its heartbeats find down meanwhile (killed, cut off) fails the call then,
        // naming it, rather than at the end of the timeout.
        let mut exchange = std::pin::pin!(self.exchange(dataset, node, request, body, timeout));
        tokio::select! {
            biased;
            answer = &mut exchange => answer,
            () = self.wait_down(node) => {
                // An answer under way may still come (heartbeats can lag a node that answers
                // this call): a moment's grace, then the call fails.
                match tokio::time::timeout(liveness::WAIT_FOR_UP, &mut exchange).await {
                    Ok(answer) => answer,
                    Err(_) => Err(self.unavailable(
                        node,
                        "its heartbeats found it down while this call waited for it".into(),
                    )),
                }
            }
        }
    }

    /// A read of shard `shard`: `request` to its in-sync replicas in [`Self::read_order`]
    /// until one answers; the last failure if none does.
    pub(crate) async fn read(
        &self,
        dataset: Option<&str>,
        shard: u32,
        request: &NodeRequest,
    ) -> Result<(NodeId, NodeReply), Failure> {
        let order = self.read_order(shard);
        let mut last = None;
        for (k, &node) in order.iter().enumerate() {
            // A replica known down is skipped at once while another may answer.
            let answer = if k + 1 < order.len() && self.is_down(node) {
                Err(self.unavailable(node, "down".into()))
            } else {
                self.call(dataset, node, request, Vec::new()).await
            };
            match answer {
                Ok(reply) => return Ok((node, reply)),
                Err(failure) => last = Some(failure),
            }
        }
        Err(last.unwrap_or(Failure::NoReplicaInSync { shard: Some(shard) }))
    }

    /// One request to node `node` within `timeout`, whatever its health.
    async fn exchange(
        &self,
        dataset: Option<&str>,
        node: NodeId,
        request: &NodeRequest,
        body: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<NodeReply, Failure> {
        let _counted = (!matches!(request, NodeRequest::Info)).then(|| self.in_flight(node));
        let shard = self.shard(node);
        let addr = self.addr(node);
        let unavailable = |reason: String| Failure::ShardUnavailable {
            shard,
            addr,
            reason,
        };
        let header = self
            .encode(dataset, node, request)
            .map_err(|e| Failure::BadRequest(e.to_string()))?;
        // One deadline covers waiting for the link, connecting and the exchange, so callers
        // queued behind a dead node's connect also fail within the timeout.
        let exchange = async {
            let connection = self.link(node, timeout).await.map_err(|e| e.to_string())?;
            let called = zr_net::call_chunks(&connection, header, body, timeout).await;
            if called.is_err() {
                self.forget(node, &connection).await;
            }
            called.map_err(|e| e.to_string())
        };
        let chunks = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(chunks)) => chunks,
            Ok(Err(e)) => return Err(unavailable(e)),
            Err(_) => {
                return Err(unavailable(format!(
                    "no reply within {} ms",
                    timeout.as_millis()
                )))
            }
        };
        let (reply, body_start) =
            wire::decode_reply_chunks(&chunks).map_err(|e| unavailable(e.to_string()))?;
        *self.links[node]
            .last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(tokio::time::Instant::now());
        if let Reply::Error { code, message } = reply {
            if code == wire::ErrorCode::StaleMap {
                self.stale_map.notify_one();
            }
            return Err(Failure::ShardRefused {
                shard,
                code,
                message,
            });
        }
        Ok(NodeReply {
            reply,
            chunks,
            body_start,
        })
    }
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
            configured: addr,
            target: std::sync::Mutex::new(Target {
                addr,
                endpoint: zr_net::client_endpoint(addr)?,
            }),
            connection: Mutex::new(None),
            last_seen: std::sync::Mutex::new(None),
            liveness: std::sync::Mutex::new(Liveness::default()),
            health: tokio::sync::watch::Sender::new(Health::Unknown),
            failing: tokio::sync::watch::Sender::new(false),
            incarnation: std::sync::Mutex::new(None),
            written: AtomicBool::new(false),
            len: std::sync::Mutex::new(None),
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
        let configured = (node.shard < nodes.shards()).then(|| nodes.links[id].configured);
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
pub(crate) struct InFlight<'a> {
    link: &'a NodeLink,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let now = self.link.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        self.link.in_flight_gauge.set(now as f64);
    }
}
