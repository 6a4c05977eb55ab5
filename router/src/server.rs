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
use quinn::{Connection, Endpoint};
use tokio::sync::Mutex;
use zr_common::chunks::Chunks;
use zr_common::config::ClusterConfig;
use zr_common::net::Body;
use zr_common::placement::Placement;
use zr_common::wire::{self, ErrorCode, FieldInfo, Reply, Request};
use zr_common::{net, Error};

use crate::plan::plan_gather;

mod writes;

/// Most client connections a router serves at once.
pub const CONNECTIONS_MAX: usize = 256;

/// Writes of a streamed gather queued for the client's stream.
const FRAMES_QUEUED: usize = 8;

/// A failed operation: the stable code and a message naming the shard where one is involved.
type Failure = (ErrorCode, String);

/// One node, reconnected on demand, through an endpoint (a UDP socket) of its own: replies
/// from several nodes are then received in parallel, not by one socket's driver in turn.
struct NodeLink {
    shard: u32,
    addr: SocketAddr,
    endpoint: Endpoint,
    connection: Mutex<Option<Connection>>,
}

/// A node's reply, decoded, with the message as it arrived (chunks of received packets,
/// forwarded to clients without a copy); its body starts `body_start` bytes in.
struct NodeReply {
    reply: Reply,
    chunks: Vec<Bytes>,
    body_start: usize,
}

impl NodeReply {
    /// The body, in one piece.
    fn body(&self) -> Vec<u8> {
        let mut body = Chunks::new(&self.chunks);
        body.skip(self.body_start);
        body.to_vec()
    }
}

/// The router's state. See the module documentation.
pub struct Router {
    placement: ArcSwap<Placement>,
    nodes: Vec<NodeLink>,
    security: net::Security,
    len: AtomicU64,
    writes: Mutex<()>,
    /// This router's name for the cluster's write lease: random, one per router.
    holder: u64,
    /// The write lease this router holds, if any.
    lease: std::sync::Mutex<Option<writes::Lease>>,
    fields: Vec<FieldInfo>,
    timeout: Duration,
}

impl Router {
    /// Connects to every node of `config`, checks they agree on the
    /// fields, and recovers the global length from their lengths. Shards holding records past
    /// the longest consistent length (an append that did not reach every shard) are cut back
    /// to it, with a warning naming them.
    pub async fn start(
        config: &ClusterConfig,
        security: net::Security,
    ) -> Result<Arc<Router>, Error> {
        let placement = config.placement()?;
        let mut nodes: Vec<NodeLink> = config
            .shards
            .iter()
            .map(|s| {
                Ok(NodeLink {
                    shard: s.id,
                    addr: s.addr,
                    endpoint: net::client_endpoint(s.addr)?,
                    connection: Mutex::new(None),
                })
            })
            .collect::<Result<_, Error>>()?;
        nodes.sort_by_key(|n| n.shard);
        let mut router = Router {
            placement: ArcSwap::from_pointee(placement),
            nodes,
            security,
            len: AtomicU64::new(0),
            writes: Mutex::new(()),
            holder: std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                std::process::id(),
            ),
            lease: std::sync::Mutex::new(None),
            fields: Vec::new(),
            timeout: Duration::from_millis(config.router.timeout_ms),
        };
        let infos = router.node_infos(None).await.map_err(remote)?;
        let mut fields: Option<(u32, &Vec<FieldInfo>)> = None;
        for (shard, (_, theirs)) in infos.iter().enumerate() {
            match fields {
                Some((first, ours)) if ours != theirs => {
                    return Err(Error::Config {
                        path: format!("shard {shard}"),
                        reason: format!("its fields differ from shard {first}'s"),
                    })
                }
                Some(_) => {}
                None => fields = Some((shard as u32, theirs)),
            }
        }
        router.fields = fields.map(|(_, f)| f.clone()).unwrap_or_default();
        // Recover the length, repairing what a write cut off midway left behind.
        router
            .exclusive(|| async { Ok(()) })
            .await
            .map_err(remote)?;
        Ok(Arc::new(router))
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
        let timeout = self.timeout;
        let handler = move |bytes: Vec<u8>| {
            let router = Arc::clone(&self);
            async move { router.handle(&bytes).await }
        };
        net::serve(
            &endpoint,
            net::Limits::new(CONNECTIONS_MAX, timeout),
            shutdown,
            handler,
        )
        .await;
    }

    /// Decodes, executes and encodes one client request.
    pub async fn handle(self: &Arc<Self>, bytes: &[u8]) -> (Vec<u8>, Body) {
        let outcome = match wire::decode_request(bytes) {
            Ok((request, body)) => self.execute(request, body).await,
            Err(e) => {
                tracing::warn!("bad request from a client: {e}");
                let code = if e.to_string().contains("version") {
                    ErrorCode::Version
                } else {
                    ErrorCode::BadRequest
                };
                Err((code, e.to_string()))
            }
        };
        let (reply, body) = outcome.unwrap_or_else(|(code, message)| {
            (Reply::Error { code, message }, Body::Ready(Vec::new()))
        });
        match wire::encode_reply(&reply) {
            Ok(header) => (header, body),
            Err(e) => (
                wire::encode_reply(&Reply::Error {
                    code: ErrorCode::BadRequest,
                    message: e.to_string(),
                })
                .unwrap_or_default(),
                Body::Ready(Vec::new()),
            ),
        }
    }

    async fn execute(
        self: &Arc<Self>,
        request: Request,
        body: &[u8],
    ) -> Result<(Reply, Body), Failure> {
        let ready = |reply: Reply| (reply, Body::Ready(Vec::new()));
        let ready_body = |(reply, body): (Reply, Vec<Bytes>)| (reply, Body::Ready(body));
        match request {
            Request::Info => {
                // Fresh from the nodes (another router may have written); the cached length
                // if a node cannot answer, so a client can still connect.
                let len = match self.refresh_len().await {
                    Ok(len) => len,
                    Err((_, e)) => {
                        tracing::debug!("cannot refresh the length: {e}");
                        self.len()
                    }
                };
                Ok(ready(Reply::Info {
                    len,
                    fields: self.fields.clone(),
                }))
            }
            Request::Gather { indices, fields } => self.gather(&indices, fields).await,
            Request::Append {
                fields, lengths, ..
            } => self
                .exclusive(|| self.append(fields, lengths, body))
                .await
                .map(ready_body),
            Request::Modify {
                index,
                fields,
                lengths,
                ..
            } => self
                .exclusive(|| self.modify(index, fields, lengths, body))
                .await
                .map(ready),
            Request::Delete { index } => {
                self.exclusive(|| self.delete(index)).await.map(ready_body)
            }
            Request::Truncate { .. }
            | Request::Acquire { .. }
            | Request::Release { .. }
            | Request::Intend { .. }
            | Request::Fence { .. } => Err((
                ErrorCode::BadRequest,
                "truncate and the write lease are for nodes".into(),
            )),
            Request::Commit => {
                let calls = (0..self.nodes.len() as u32)
                    .map(|shard| self.call(shard, &Request::Commit, Vec::new()));
                for result in futures::future::join_all(calls).await {
                    result?;
                }
                Ok(ready(Reply::Done))
            }
        }
    }

    /// Scatters a gather, one sub-request per involved shard, and streams the shards'
    /// replies to the client as they arrive (`Reply::GatherParts`; the client reassembles).
    /// A failed shard ends the stream with an error frame and abandons the others.
    async fn gather(
        self: &Arc<Self>,
        indices: &[u64],
        fields: Vec<String>,
    ) -> Result<(Reply, Body), Failure> {
        let len = self
            .len_covering(indices.iter().copied().max().unwrap_or(0))
            .await;
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err((
                ErrorCode::IndexOutOfRange,
                format!("index {index} is out of range: the dataset holds {len} records"),
            ));
        }
        let parts = plan_gather(&self.placement.load(), indices);
        if parts.is_empty() {
            // No index: an empty column per requested field.
            let count = if fields.is_empty() {
                self.fields.len()
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
        tokio::spawn(crate::forward::forward_parts(
            Arc::clone(self),
            parts,
            fields,
            frames,
        ));
        Ok((reply, Body::Streamed(body)))
    }

    /// Every node's length and fields, asked concurrently, in shard order; with `fence`, each
    /// node is fenced with that lease token first (see `Request::Fence`).
    async fn node_infos(&self, fence: Option<u64>) -> Result<Vec<(u64, Vec<FieldInfo>)>, Failure> {
        let request = match fence {
            Some(token) => Request::Fence { token },
            None => Request::Info,
        };
        let calls =
            (0..self.nodes.len() as u32).map(|shard| self.call(shard, &request, Vec::new()));
        let mut infos = Vec::with_capacity(self.nodes.len());
        for (shard, result) in futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            match result?.reply {
                Reply::Info { len, fields } => infos.push((len, fields)),
                other => {
                    return Err((
                        ErrorCode::Unavailable,
                        format!("shard {shard} answered Info with {other:?}"),
                    ))
                }
            }
        }
        Ok(infos)
    }

    /// Every node's length, in shard order; `fence` as for [`Self::node_infos`].
    async fn node_lens(&self, fence: Option<u64>) -> Result<Vec<u64>, Failure> {
        let infos = self.node_infos(fence).await?;
        Ok(infos.into_iter().map(|(len, _)| len).collect())
    }

    /// Re-reads the global length from the nodes (another router may have written): the
    /// longest length every shard agrees with. Repairs nothing — another router's append
    /// may be in flight. Waits for this router's writes in flight, so a length read before
    /// them cannot overwrite theirs.
    async fn refresh_len(&self) -> Result<u64, Failure> {
        let _writes = self.writes.lock().await;
        let len = self
            .placement
            .load()
            .consistent_len(&self.node_lens(None).await?);
        self.len.store(len, Ordering::SeqCst);
        Ok(len)
    }

    /// The global length as the nodes have it now if `index` is past the cached one (another
    /// router may have appended); the cached one otherwise, or if a node cannot say.
    async fn len_covering(&self, index: u64) -> u64 {
        let len = self.len();
        if index < len {
            return len;
        }
        match self.refresh_len().await {
            Ok(len) => len,
            Err((_, e)) => {
                tracing::debug!("cannot refresh the length: {e}");
                len
            }
        }
    }

    /// The open connection to shard `shard`'s node, connected first if there is none.
    pub(crate) async fn link(&self, shard: u32) -> Result<Connection, Error> {
        let node = &self.nodes[shard as usize];
        let mut cached = node.connection.lock().await;
        match cached.as_ref().filter(|c| c.close_reason().is_none()) {
            Some(c) => Ok(c.clone()),
            None => {
                let c =
                    net::connect(&node.endpoint, &self.security, node.addr, self.timeout).await?;
                *cached = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// Forgets `connection` to shard `shard` after an exchange on it failed: the next call
    /// reconnects.
    pub(crate) async fn forget(&self, shard: u32, connection: &Connection) {
        let mut cached = self.nodes[shard as usize].connection.lock().await;
        if cached
            .as_ref()
            .is_some_and(|c| c.stable_id() == connection.stable_id())
        {
            *cached = None;
        }
    }

    /// Shard `shard`'s address, for errors.
    pub(crate) fn node_addr(&self, shard: u32) -> SocketAddr {
        self.nodes[shard as usize].addr
    }

    /// Every network wait's bound.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One request to shard `shard`; errors name the shard and its address.
    async fn call(
        &self,
        shard: u32,
        request: &Request,
        body: Vec<Bytes>,
    ) -> Result<NodeReply, Failure> {
        let node = &self.nodes[shard as usize];
        let unavailable = |e: String| {
            (
                ErrorCode::Unavailable,
                format!("shard {shard} at {}: {e}", node.addr),
            )
        };
        let header =
            wire::encode_request(request).map_err(|e| (ErrorCode::BadRequest, e.to_string()))?;
        // One deadline covers waiting for the link, connecting and the exchange, so callers
        // queued behind a dead node's connect also fail within the timeout.
        let exchange = async {
            let connection = self.link(shard).await.map_err(|e| e.to_string())?;
            let called = net::call_chunks(&connection, header, body, self.timeout).await;
            if called.is_err() {
                self.forget(shard, &connection).await;
            }
            called.map_err(|e| e.to_string())
        };
        let chunks = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(chunks)) => chunks,
            Ok(Err(e)) => return Err(unavailable(e)),
            Err(_) => {
                return Err(unavailable(format!(
                    "no reply within {} ms",
                    self.timeout.as_millis()
                )))
            }
        };
        let (reply, body_start) =
            wire::decode_reply_chunks(&chunks).map_err(|e| unavailable(e.to_string()))?;
        if let Reply::Error { code, message } = reply {
            return Err((code, format!("shard {shard}: {message}")));
        }
        Ok(NodeReply {
            reply,
            chunks,
            body_start,
        })
    }
}

fn remote((code, message): Failure) -> Error {
    Error::Remote { code, message }
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
    router.serve(endpoint, shutdown).await;
    tracing::info!("router stopped");
    Ok(())
}
