//! The router: accepts clients over QUIC, scatters each gather as one sub-request per
//! involved shard (concurrently), reassembles in the caller's order, and routes writes.
//!
//! It keeps no per-record state: the placement is a pure function of the cluster map (held
//! in an `ArcSwap` and read lock-free), and the global length is recomputed from the nodes at
//! start-up — so a restarted router, or two at once, give the same answers. Writes are
//! serialized by one lock, so concurrent appenders get disjoint, consecutive ranges.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use quinn::{Connection, Endpoint};
use tokio::sync::Mutex;
use zr_common::config::ClusterConfig;
use zr_common::placement::Placement;
use zr_common::wire::{self, ErrorCode, FieldInfo, Reply, Request};
use zr_common::{net, Error};

use crate::plan::{plan_append, plan_gather, reassemble, PartReply};

/// Most client connections a router serves at once.
pub const CONNECTIONS_MAX: usize = 256;

/// A failed operation: the stable code and a message naming the shard where one is involved.
type Failure = (ErrorCode, String);

/// One node, reconnected on demand.
struct NodeLink {
    shard: u32,
    addr: SocketAddr,
    connection: Mutex<Option<Connection>>,
}

/// A node's reply with its raw bytes (the body is a slice of them).
struct NodeReply {
    reply: Reply,
    bytes: Vec<u8>,
    body_start: usize,
}

impl NodeReply {
    fn body(&self) -> &[u8] {
        &self.bytes[self.body_start..]
    }
}

/// The router's state. See the module documentation.
pub struct Router {
    placement: ArcSwap<Placement>,
    nodes: Vec<NodeLink>,
    endpoint: Endpoint,
    security: net::Security,
    len: AtomicU64,
    writes: Mutex<()>,
    fields: Vec<FieldInfo>,
    timeout: Duration,
}

impl Router {
    /// Connects to every node of `config` through `endpoint`, checks they agree on the
    /// fields, and recovers the global length from their lengths. Shards holding records past
    /// the longest consistent length (an append that did not reach every shard) are cut back
    /// to it, with a warning naming them.
    pub async fn start(
        config: &ClusterConfig,
        security: net::Security,
        endpoint: Endpoint,
    ) -> Result<Arc<Router>, Error> {
        let placement = config.placement()?;
        let mut nodes: Vec<NodeLink> = config
            .shards
            .iter()
            .map(|s| NodeLink {
                shard: s.id,
                addr: s.addr,
                connection: Mutex::new(None),
            })
            .collect();
        nodes.sort_by_key(|n| n.shard);
        let mut router = Router {
            placement: ArcSwap::from_pointee(placement),
            nodes,
            endpoint,
            security,
            len: AtomicU64::new(0),
            writes: Mutex::new(()),
            fields: Vec::new(),
            timeout: Duration::from_millis(config.router.timeout_ms),
        };
        let mut lens = Vec::new();
        let mut fields: Option<(u32, Vec<FieldInfo>)> = None;
        for shard in 0..router.nodes.len() as u32 {
            let reply = router
                .call(shard, &Request::Info, Vec::new())
                .await
                .map_err(remote)?;
            let Reply::Info {
                len,
                fields: theirs,
            } = reply.reply
            else {
                return Err(Error::Protocol(format!(
                    "shard {shard} answered Info with {:?}",
                    reply.reply
                )));
            };
            match &fields {
                Some((first, ours)) if *ours != theirs => {
                    return Err(Error::Config {
                        path: format!("shard {shard}"),
                        reason: format!("its fields differ from shard {first}'s"),
                    })
                }
                Some(_) => {}
                None => fields = Some((shard, theirs)),
            }
            lens.push(len);
        }
        router.fields = fields.map(|(_, f)| f).unwrap_or_default();
        let placement = router.placement.load_full();
        let len = placement.consistent_len(&lens);
        for (shard, &have) in lens.iter().enumerate() {
            let want = placement.shard_len(shard as u32, len);
            if have != want {
                tracing::warn!(
                    "shard {shard} holds {have} records but a cluster of {len} gives it {want}: dropping its last {} (an append that did not reach every shard)",
                    have - want
                );
                router
                    .call(shard as u32, &Request::Truncate { len: want }, Vec::new())
                    .await
                    .map_err(remote)?;
            }
        }
        router.len.store(len, Ordering::SeqCst);
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
        net::serve(&endpoint, CONNECTIONS_MAX, timeout, shutdown, handler).await;
    }

    /// Decodes, executes and encodes one client request.
    pub async fn handle(&self, bytes: &[u8]) -> (Vec<u8>, Vec<Bytes>) {
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
        let (reply, body) =
            outcome.unwrap_or_else(|(code, message)| (Reply::Error { code, message }, Vec::new()));
        match wire::encode_reply(&reply) {
            Ok(header) => (header, body),
            Err(e) => (
                wire::encode_reply(&Reply::Error {
                    code: ErrorCode::BadRequest,
                    message: e.to_string(),
                })
                .unwrap_or_default(),
                Vec::new(),
            ),
        }
    }

    async fn execute(&self, request: Request, body: &[u8]) -> Result<(Reply, Vec<Bytes>), Failure> {
        match request {
            Request::Info => Ok((
                Reply::Info {
                    len: self.len(),
                    fields: self.fields.clone(),
                },
                Vec::new(),
            )),
            Request::Gather { indices, fields } => self.gather(&indices, fields).await,
            Request::Append {
                fields, lengths, ..
            } => self.append(fields, lengths, body).await,
            Request::Modify {
                index,
                fields,
                lengths,
            } => {
                let _writes = self.writes.lock().await;
                self.check_index(index)?;
                let (shard, local) = self.placement.load().locate(index);
                let request = Request::Modify {
                    index: local,
                    fields,
                    lengths,
                };
                self.call(shard, &request, vec![Bytes::copy_from_slice(body)])
                    .await?;
                Ok((Reply::Done, Vec::new()))
            }
            Request::Delete { index } => self.delete(index).await,
            Request::Truncate { .. } => Err((
                ErrorCode::BadRequest,
                "truncate is for nodes; delete records one by one".into(),
            )),
            Request::Commit => {
                let calls = (0..self.nodes.len() as u32)
                    .map(|shard| self.call(shard, &Request::Commit, Vec::new()));
                for result in futures::future::join_all(calls).await {
                    result?;
                }
                Ok((Reply::Done, Vec::new()))
            }
        }
    }

    fn check_index(&self, index: u64) -> Result<(), Failure> {
        let len = self.len();
        if index >= len {
            return Err((
                ErrorCode::IndexOutOfRange,
                format!("index {index} is out of range: the dataset holds {len} records"),
            ));
        }
        Ok(())
    }

    async fn gather(
        &self,
        indices: &[u64],
        fields: Vec<String>,
    ) -> Result<(Reply, Vec<Bytes>), Failure> {
        let len = self.len();
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err((
                ErrorCode::IndexOutOfRange,
                format!("index {index} is out of range: the dataset holds {len} records"),
            ));
        }
        let placement = self.placement.load();
        let parts = plan_gather(&placement, indices);
        let calls = parts.iter().map(|part| {
            let request = Request::Gather {
                indices: part.local.clone(),
                fields: fields.clone(),
            };
            async move { self.call(part.shard, &request, Vec::new()).await }
        });
        let replies: Vec<NodeReply> = futures::future::join_all(calls)
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        let mut views = Vec::with_capacity(replies.len());
        for (part, reply) in parts.iter().zip(&replies) {
            match &reply.reply {
                Reply::Gather { lengths } => views.push(PartReply {
                    lengths,
                    body: reply.body(),
                }),
                other => {
                    return Err((
                        ErrorCode::Unavailable,
                        format!("shard {} answered a gather with {other:?}", part.shard),
                    ))
                }
            }
        }
        let columns = if parts.is_empty() {
            // No index: an empty column per requested field.
            let count = if fields.is_empty() {
                self.fields.len()
            } else {
                fields.len()
            };
            (vec![Vec::new(); count], vec![Vec::new(); count])
        } else {
            reassemble(indices.len(), &parts, &views).map_err(|e| (ErrorCode::Unavailable, e))?
        };
        let (lengths, bodies) = columns;
        Ok((
            Reply::Gather { lengths },
            bodies.into_iter().map(Bytes::from).collect(),
        ))
    }

    async fn append(
        &self,
        fields: Vec<String>,
        lengths: Vec<Vec<u32>>,
        body: &[u8],
    ) -> Result<(Reply, Vec<Bytes>), Failure> {
        let count = lengths.first().map_or(0, Vec::len);
        let columns = wire::split_columns(&lengths, body);
        let _writes = self.writes.lock().await;
        let start = self.len();
        let placement = self.placement.load();
        let parts = plan_append(&placement, start, count);
        let calls = parts.iter().map(|part| {
            let lengths: Vec<Vec<u32>> = lengths
                .iter()
                .map(|l| part.positions.iter().map(|&k| l[k]).collect())
                .collect();
            let body: Vec<Bytes> = columns
                .iter()
                .map(|column| {
                    Bytes::from(
                        part.positions
                            .iter()
                            .flat_map(|&k| column[k].iter().copied())
                            .collect::<Vec<u8>>(),
                    )
                })
                .collect();
            let request = Request::Append {
                at: Some(part.local_start),
                fields: fields.clone(),
                lengths,
            };
            async move { self.call(part.shard, &request, body).await }
        });
        let results = futures::future::join_all(calls).await;
        if let Some(failure) = results.iter().find_map(|r| r.as_ref().err()).cloned() {
            // Undo what reached some shards, so the cluster stays consistent.
            for (part, result) in parts.iter().zip(&results) {
                if result.is_ok() {
                    let undo = Request::Truncate {
                        len: part.local_start,
                    };
                    if let Err((_, e)) = self.call(part.shard, &undo, Vec::new()).await {
                        tracing::warn!("undoing a failed append on shard {}: {e} (the next router start repairs it)", part.shard);
                    }
                }
            }
            return Err(failure);
        }
        self.len.store(start + count as u64, Ordering::SeqCst);
        Ok((
            Reply::Appended {
                start,
                count: count as u64,
            },
            Vec::new(),
        ))
    }

    /// Global swap-remove: the last record moves into the hole, across shards if needed.
    async fn delete(&self, index: u64) -> Result<(Reply, Vec<Bytes>), Failure> {
        let _writes = self.writes.lock().await;
        self.check_index(index)?;
        let last = self.len() - 1;
        let placement = self.placement.load();
        let (last_shard, last_local) = placement.locate(last);
        if index != last {
            let moved = self
                .call(
                    last_shard,
                    &Request::Gather {
                        indices: vec![last_local],
                        fields: Vec::new(),
                    },
                    Vec::new(),
                )
                .await?;
            let Reply::Gather { lengths } = &moved.reply else {
                return Err((
                    ErrorCode::Unavailable,
                    format!(
                        "shard {last_shard} answered a gather with {:?}",
                        moved.reply
                    ),
                ));
            };
            let lengths: Vec<u32> = lengths
                .iter()
                .map(|l| l.first().copied().unwrap_or(0))
                .collect();
            let fields = self.fields.iter().map(|f| f.name.clone()).collect();
            let (shard, local) = placement.locate(index);
            let request = Request::Modify {
                index: local,
                fields,
                lengths,
            };
            self.call(shard, &request, vec![Bytes::copy_from_slice(moved.body())])
                .await?;
        }
        self.call(
            last_shard,
            &Request::Truncate { len: last_local },
            Vec::new(),
        )
        .await?;
        self.len.store(last, Ordering::SeqCst);
        Ok((Reply::Done, Vec::new()))
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
            let connection = {
                let mut cached = node.connection.lock().await;
                match cached.as_ref().filter(|c| c.close_reason().is_none()) {
                    Some(c) => c.clone(),
                    None => {
                        let c =
                            net::connect(&self.endpoint, &self.security, node.addr, self.timeout)
                                .await
                                .map_err(|e| e.to_string())?;
                        *cached = Some(c.clone());
                        c
                    }
                }
            };
            match net::call(&connection, header, body, self.timeout).await {
                Ok(bytes) => Ok(bytes),
                Err(e) => {
                    // Forget the connection: the next call reconnects.
                    let mut cached = node.connection.lock().await;
                    if cached
                        .as_ref()
                        .is_some_and(|c| c.stable_id() == connection.stable_id())
                    {
                        *cached = None;
                    }
                    Err(e.to_string())
                }
            }
        };
        let bytes = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) => return Err(unavailable(e)),
            Err(_) => {
                return Err(unavailable(format!(
                    "no reply within {} ms",
                    self.timeout.as_millis()
                )))
            }
        };
        let (reply, body_start) = {
            let (reply, body) =
                wire::decode_reply(&bytes).map_err(|e| unavailable(e.to_string()))?;
            (reply, bytes.len() - body.len())
        };
        if let Reply::Error { code, message } = reply {
            return Err((code, format!("shard {shard}: {message}")));
        }
        Ok(NodeReply {
            reply,
            bytes,
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
    let router = Router::start(config, security.clone(), endpoint.clone()).await?;
    tracing::info!(
        "router on {listen}: {} shards, {} records",
        config.cluster.shards,
        router.len()
    );
    router.serve(endpoint, shutdown).await;
    tracing::info!("router stopped");
    Ok(())
}
