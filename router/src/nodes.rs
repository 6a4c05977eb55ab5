//! The router's links to its nodes: one endpoint and connection per shard, reconnected on
//! demand, a heartbeat per node (see `liveness.rs`), and one request to a shard within the
//! router's timeout — or failed at once while its node is down.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use quinn::{Connection, Endpoint};
use tokio::sync::Mutex;
use zr_net::config::ClusterConfig;
use zr_net::Security;
use zr_proto::chunks::Chunks;
use zr_proto::wire::{self, NodeRequest, Reply};

use crate::error::{Error, Failure};
use crate::liveness::{self, Health, Liveness};

/// One node, reconnected on demand, through an endpoint (a UDP socket) of its own: replies
/// from several nodes are then received in parallel, not by one socket's driver in turn.
struct NodeLink {
    addr: SocketAddr,
    endpoint: Endpoint,
    connection: Mutex<Option<Connection>>,
    /// When the node last answered.
    last_seen: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// Its heartbeats so far, and the health they give, published to the calls waiting for
    /// it to come back.
    liveness: std::sync::Mutex<Liveness>,
    health: tokio::sync::watch::Sender<Health>,
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

/// Every shard's node, in shard order.
pub(crate) struct Nodes {
    links: Vec<NodeLink>,
    security: Security,
    timeout: Duration,
    /// The cluster id and map version every request carries, once the router knows them.
    tag: std::sync::OnceLock<(String, u64)>,
    /// Where the nodes' liveness leases are.
    meta: Arc<dyn zr_meta::MetaStore>,
}

impl Nodes {
    /// An endpoint for each shard of `config`; connections are made on first use.
    pub(crate) fn new(
        config: &ClusterConfig,
        security: Security,
        meta: Arc<dyn zr_meta::MetaStore>,
    ) -> Result<Nodes, Error> {
        let mut shards: Vec<_> = config.shards.iter().collect();
        shards.sort_by_key(|s| s.id);
        let links = shards
            .into_iter()
            .map(|s| {
                Ok(NodeLink {
                    addr: s.addr,
                    endpoint: zr_net::client_endpoint(s.addr)?,
                    connection: Mutex::new(None),
                    last_seen: std::sync::Mutex::new(None),
                    liveness: std::sync::Mutex::new(Liveness::default()),
                    health: tokio::sync::watch::Sender::new(Health::Unknown),
                })
            })
            .collect::<Result<_, Error>>()?;
        Ok(Nodes {
            links,
            security,
            timeout: Duration::from_millis(config.router.timeout_ms),
            tag: std::sync::OnceLock::new(),
            meta,
        })
    }

    /// From now on every request carries cluster id `cluster` and map version `version`,
    /// and nodes refuse it if their data is of another cluster or map.
    pub(crate) fn set_cluster(&self, cluster: &str, version: u64) {
        let _ = self.tag.set((cluster.to_string(), version));
    }

    /// `request` encoded with this router's cluster id and map version.
    pub(crate) fn encode(&self, request: &NodeRequest) -> Result<Vec<u8>, zr_proto::Error> {
        match self.tag.get() {
            Some((cluster, version)) => wire::encode_node_request(Some(cluster), *version, request),
            None => wire::encode_node_request(None, 0, request),
        }
    }

    /// How many shards there are.
    pub(crate) fn shards(&self) -> u32 {
        self.links.len() as u32
    }

    /// Shard `shard`'s address, for errors.
    pub(crate) fn addr(&self, shard: u32) -> SocketAddr {
        self.links[shard as usize].addr
    }

    /// How long ago shard `shard`'s node last answered, if it ever did.
    pub(crate) fn last_seen(&self, shard: u32) -> Option<Duration> {
        let seen = *self.links[shard as usize]
            .last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        seen.map(|at| at.elapsed())
    }

    /// The round-trip time of the connection to shard `shard`'s node, if there is one.
    pub(crate) fn rtt(&self, shard: u32) -> Option<Duration> {
        let cached = self.links[shard as usize].connection.try_lock().ok()?;
        let connection = cached.as_ref().filter(|c| c.close_reason().is_none())?;
        Some(connection.stats().path.rtt)
    }

    /// Every network wait's bound.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The open connection to shard `shard`'s node, connected first (within `timeout`) if
    /// there is none.
    pub(crate) async fn link(&self, shard: u32, timeout: Duration) -> Result<Connection, Error> {
        let node = &self.links[shard as usize];
        let mut cached = node.connection.lock().await;
        match cached.as_ref().filter(|c| c.close_reason().is_none()) {
            Some(c) => Ok(c.clone()),
            None => {
                let c = zr_net::connect(&node.endpoint, &self.security, node.addr, timeout).await?;
                *cached = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// Forgets `connection` to shard `shard` after an exchange on it failed: the next call
    /// reconnects.
    pub(crate) async fn forget(&self, shard: u32, connection: &Connection) {
        let mut cached = self.links[shard as usize].connection.lock().await;
        if cached
            .as_ref()
            .is_some_and(|c| c.stable_id() == connection.stable_id())
        {
            *cached = None;
        }
    }

    /// Starts a heartbeat task per node; each ends when the `Nodes` are dropped.
    pub(crate) fn watch(self: &Arc<Self>) {
        for shard in 0..self.shards() {
            let nodes: Weak<Nodes> = Arc::downgrade(self);
            tokio::spawn(async move {
                for beat in 0u32.. {
                    let Some(pause) = (match nodes.upgrade() {
                        Some(nodes) => {
                            if beat % liveness::LEASE_READ_EVERY == 0 {
                                nodes.read_lease(shard).await;
                            }
                            Some(nodes.heartbeat(shard).await)
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

    /// Reads shard `shard`'s node liveness lease into its liveness (a store that cannot say
    /// changes nothing).
    async fn read_lease(&self, shard: u32) {
        match zr_meta::nodes::load(&*self.meta, shard).await {
            Ok(lease) => self.links[shard as usize]
                .liveness
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .lease_read(
                    lease.map(|(_, revision)| revision),
                    tokio::time::Instant::now().into_std(),
                ),
            Err(e) => tracing::debug!("shard {shard}: its liveness lease: {e}"),
        }
    }

    /// Shard `shard`'s node liveness lease, as this router has read it, in words.
    pub(crate) fn lease(&self, shard: u32) -> String {
        self.links[shard as usize]
            .liveness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lease(tokio::time::Instant::now().into_std())
            .describe()
    }

    /// One heartbeat to shard `shard`'s node, its outcome told to the node's liveness;
    /// returns the pause before the next.
    async fn heartbeat(&self, shard: u32) -> Duration {
        let sent = tokio::time::Instant::now();
        let wall = SystemTime::now();
        let link = &self.links[shard as usize];
        let timeout = {
            let liveness = link.liveness.lock().unwrap_or_else(|e| e.into_inner());
            liveness.timeout().min(self.timeout)
        };
        let outcome = self
            .exchange(shard, &NodeRequest::Info, Vec::new(), timeout)
            .await;
        let label = shard.to_string();
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
                Some(down) => tracing::warn!("shard {shard} at {}: {down}", link.addr),
                None => tracing::info!("shard {shard} at {} is up", link.addr),
            }
            link.health.send_replace(health);
        }
        let up = !matches!(liveness.health(), Health::Down { .. });
        metrics::gauge!("zr_router_node_up", "shard" => label).set(if up { 1.0 } else { 0.0 });
        liveness.pause()
    }

    /// The refusal of a call to shard `shard` while its node is down, after waiting a moment
    /// for a heartbeat to find it back; `None` if it is not down.
    pub(crate) async fn down(&self, shard: u32) -> Option<Failure> {
        let link = &self.links[shard as usize];
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
            addr: link.addr,
            reason,
        })
    }

    /// One request to shard `shard`; errors name the shard and its address. Fails at once
    /// while the node is down.
    pub(crate) async fn call(
        &self,
        shard: u32,
        request: &NodeRequest,
        body: Vec<Bytes>,
    ) -> Result<NodeReply, Failure> {
        self.call_within(shard, request, body, self.timeout).await
    }

    /// [`Self::call`] within `timeout` rather than the router's.
    pub(crate) async fn call_within(
        &self,
        shard: u32,
        request: &NodeRequest,
        body: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<NodeReply, Failure> {
        if let Some(down) = self.down(shard).await {
            return Err(down);
        }
        self.exchange(shard, request, body, timeout).await
    }

    /// One request to shard `shard` within `timeout`, whatever its health.
    async fn exchange(
        &self,
        shard: u32,
        request: &NodeRequest,
        body: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<NodeReply, Failure> {
        let addr = self.addr(shard);
        let unavailable = |reason: String| Failure::ShardUnavailable {
            shard,
            addr,
            reason,
        };
        let header = self
            .encode(request)
            .map_err(|e| Failure::BadRequest(e.to_string()))?;
        // One deadline covers waiting for the link, connecting and the exchange, so callers
        // queued behind a dead node's connect also fail within the timeout.
        let exchange = async {
            let connection = self.link(shard, timeout).await.map_err(|e| e.to_string())?;
            let called = zr_net::call_chunks(&connection, header, body, timeout).await;
            if called.is_err() {
                self.forget(shard, &connection).await;
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
        *self.links[shard as usize]
            .last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(tokio::time::Instant::now());
        if let Reply::Error { code, message } = reply {
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
