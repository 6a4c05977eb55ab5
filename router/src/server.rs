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
use zr_net::config::ClusterConfig;
use zr_net::{self as net, Body};
use zr_proto::placement::Placement;
use zr_proto::wire::{self, ClientRequest, FieldInfo, NodeRequest, Reply};

use crate::error::{Error, Failure};
use crate::nodes::Nodes;
use crate::plan::plan_gather;

mod writes;

/// Most client connections a router serves at once.
pub const CONNECTIONS_MAX: usize = 256;

/// Writes of a streamed gather queued for the client's stream.
const FRAMES_QUEUED: usize = 8;

/// The router's state. See the module documentation.
pub struct Router {
    placement: ArcSwap<Placement>,
    nodes: Arc<Nodes>,
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
        let nodes = Arc::new(Nodes::new(config, security)?);
        let mut router = Router {
            placement: ArcSwap::from_pointee(placement),
            nodes,
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
        let infos = router.node_infos(None).await?;
        let mut fields: Option<(u32, &Vec<FieldInfo>)> = None;
        for (shard, (_, theirs)) in infos.iter().enumerate() {
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
        router.fields = fields.map(|(_, f)| f.clone()).unwrap_or_default();
        // Recover the length, repairing what a write cut off midway left behind.
        router.exclusive(|| async { Ok(()) }).await?;
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
            Ok((request, body)) => {
                self.execute(request, body)
                    .await
                    .map_err(|failure| Reply::Error {
                        code: failure.code(),
                        message: failure.to_string(),
                    })
            }
            Err(e) => {
                tracing::warn!("bad request from a client: {e}");
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
                    fields: self.fields.clone(),
                }))
            }
            ClientRequest::Gather { indices, fields } => self.gather(&indices, fields).await,
            ClientRequest::Append {
                fields, lengths, ..
            } => self
                .exclusive(|| self.append(fields, lengths, body))
                .await
                .map(ready_body),
            ClientRequest::Modify {
                index,
                fields,
                lengths,
                ..
            } => self
                .exclusive(|| self.modify(index, fields, lengths, body))
                .await
                .map(ready),
            ClientRequest::Delete { index } => {
                self.exclusive(|| self.delete(index)).await.map(ready_body)
            }
            ClientRequest::Commit => {
                let calls = (0..self.nodes.shards())
                    .map(|shard| self.nodes.call(shard, &NodeRequest::Commit, Vec::new()));
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
            return Err(Failure::OutOfRange { index, len });
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
            Arc::clone(&self.nodes),
            parts,
            fields,
            frames,
        ));
        Ok((reply, Body::Streamed(body)))
    }

    /// Every node's length and fields, asked concurrently, in shard order; with `fence`, each
    /// node is fenced with that lease token first (see `NodeRequest::Fence`).
    async fn node_infos(&self, fence: Option<u64>) -> Result<Vec<(u64, Vec<FieldInfo>)>, Failure> {
        let request = match fence {
            Some(token) => NodeRequest::Fence { token },
            None => NodeRequest::Info,
        };
        let calls =
            (0..self.nodes.shards()).map(|shard| self.nodes.call(shard, &request, Vec::new()));
        let mut infos = Vec::with_capacity(self.nodes.shards() as usize);
        for (shard, result) in futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            match result?.reply {
                Reply::Info { len, fields } => infos.push((len, fields)),
                other => {
                    let shard = shard as u32;
                    return Err(Failure::ShardUnavailable {
                        shard,
                        addr: self.nodes.addr(shard),
                        reason: format!("answered Info with {other:?}"),
                    });
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
            Err(e) => {
                tracing::debug!("cannot refresh the length: {e}");
                len
            }
        }
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
    router.serve(endpoint, shutdown).await;
    tracing::info!("router stopped");
    Ok(())
}
