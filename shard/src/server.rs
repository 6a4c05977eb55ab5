//! The shard server: one `Store` served over QUIC with the `zr_proto::wire` protocol.
//!
//! Protocol handling (`execute`) is a plain function from a request to a reply, testable
//! without a network; the async part only moves bytes. Store calls run on blocking threads,
//! except small gathers of data in memory, which run inline (see [`Handling::Adaptive`]).
//! Connections are capped; each request is one stream; a malformed request gets an error
//! reply and a log line and affects nothing else.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use quinn::Endpoint;
use zr_common::Record;
use zr_net as net;
use zr_proto::placement::{unit_address, Run};
use zr_proto::wire::{
    self, DictRef, ErrorCode, FieldDict, FieldInfo, NodeMessage, NodeRequest, Reply,
};
use zr_service::config::ClusterConfig;

use crate::catalog::Catalog;
use crate::fence::Coordination;
use crate::stage::Shard;
use crate::warm::Warmth;
use zr_node::meta::{Compression, FieldSpec};
use zr_node::prefetch::touch_pages;
use zr_node::Batch;
use zr_node::Error;
use zr_node::RuntimeOptions;
use zr_node::{CreateOptions, GatherOptions, ReadPath, Store};

/// Records at least this long on average are sent from the mapping one by one; shorter
/// ones are copied into one buffer per field (measured: per-record handles cost more for
/// 1 KiB records than the copy they save).
const ZERO_COPY_MEAN_BYTES: u64 = 4096;

/// Most connections a node serves at once: routers and clients reading one hop.
pub const CONNECTIONS_MAX: usize = 1024;
/// Of those, kept for routers: however many clients read from a node, its routers can reach
/// it.
pub const ROUTER_CONNECTIONS: usize = 64;

/// Who sent a request, as far as what it may ask goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// A router (or anyone, on an `--insecure-dev` node): every request.
    Router,
    /// A client reading one hop (its role named): gathers and info only, for the cluster
    /// and map this node's data is placed by already. A partner node (role `node`)
    /// rebuilding from this one: snapshots of its files (`ShipOpen`, `ShipRead`) and info.
    Client(net::tls::Role),
}

impl Sender {
    /// The sender of a request from `peer`.
    pub fn of(peer: &net::Peer) -> Sender {
        match peer.role {
            None | Some(net::tls::Role::Router) => Sender::Router,
            Some(role) => Sender::Client(role),
        }
    }

    /// The client's role if this sender may not ask `message` of a node (a client only
    /// reads); `None` if it may.
    fn refuses(self, message: &NodeMessage) -> Option<net::tls::Role> {
        let allowed = match (self, &message.request) {
            (Sender::Router, _) | (Sender::Client(_), NodeRequest::Info) => true,
            (Sender::Client(net::tls::Role::Node), request) => matches!(
                request,
                NodeRequest::ShipOpen { .. }
                    | NodeRequest::ShipRead { .. }
                    | NodeRequest::ShipReadMany { .. }
                    | NodeRequest::ShipClose { .. }
            ),
            (Sender::Client(_), request) => matches!(request, NodeRequest::Gather { .. }),
        };
        match self {
            Sender::Client(role) if !allowed => Some(role),
            _ => None,
        }
    }
}
/// Opens shard `shard` replica `replica`'s store at `dir`, creating it with the cluster's
/// fields if it does not exist yet; refuses a store whose fields differ from the
/// configuration, a directory that holds another node's data, and one that holds records but
/// no identity (see `identity`).
pub fn open_shard_store(
    config: &ClusterConfig,
    dir: &Path,
    shard: u32,
    replica: u32,
) -> Result<Store, Error> {
    let store = open_shard_store_fields(config, dir)?;
    crate::identity::Identity::claim(dir, shard, replica, store.len())?;
    Ok(store)
}

fn open_shard_store_fields(config: &ClusterConfig, dir: &Path) -> Result<Store, Error> {
    let fields: Vec<FieldSpec> = config
        .fields
        .iter()
        .map(|f| {
            let compress = f
                .compress
                .parse::<Compression>()
                .map_err(|e| Error::InvalidSchema(e.to_string()))?;
            Ok(FieldSpec::new(f.name.clone(), compress))
        })
        .collect::<Result<_, Error>>()?;
    let runtime = shard_runtime();
    let reads = GatherOptions {
        read: config
            .node
            .read
            .parse::<ReadPath>()
            .map_err(|e| Error::InvalidInput {
                path: config.origin.clone().into(),
                reason: e.to_string(),
            })?,
        uncached: config.node.uncached,
        ..GatherOptions::default()
    };
    if !dir.join(zr_node::meta::META_FILE).exists() {
        return Ok(
            Store::create_with(dir, fields, CreateOptions::default(), runtime)?
                .with_gather_options(reads),
        );
    }
    let store = Store::open_with(dir, runtime)?.with_gather_options(reads);
    let names = |fs: &[FieldSpec]| {
        fs.iter()
            .map(|f| format!("{}:{:?}", f.name, f.compress))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let have: Vec<(String, Compression)> = store
        .fields()
        .iter()
        .map(|f| (f.name.clone(), f.compress))
        .collect();
    let want: Vec<(String, Compression)> = fields
        .iter()
        .map(|f| (f.name.clone(), f.compress))
        .collect();
    if have != want {
        return Err(Error::InvalidSchema(format!(
            "{} holds fields [{}] but the configuration says [{}]",
            dir.display(),
            names(store.fields()),
            names(&fields)
        )));
    }
    Ok(store)
}

/// The runtime of a node's stores. Requests run side by side on blocking threads, one each:
/// splitting one request over a reader pool as well only adds thread hand-offs (measured:
/// spinning idle readers cost the network path more than the parallel copy saves).
fn shard_runtime() -> RuntimeOptions {
    RuntimeOptions {
        readers: 1,
        ..RuntimeOptions::default()
    }
}

/// How a node serves (see [`serve_with`]).
pub struct Serving {
    /// Bounds reading each request and sending each reply.
    pub timeout: std::time::Duration,
    /// Where store calls run.
    pub handling: Handling,
    /// Clients' reads are served while it is held (see [`zr_meta::nodes::ReadLease`];
    /// `ReadLease::always()` for a node with no partner).
    pub reads: Arc<zr_meta::nodes::ReadLease>,
    /// The node's own credentials, with which it connects to a partner to rebuild a
    /// dataset from its files (`None`: it rebuilds only record by record, through a router).
    pub security: Option<net::Security>,
}

/// Where a node runs its store calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// Small gathers of raw fields inline, on the task that read the request, while recent
    /// gathers found their pages in memory; every other call, and every gather while the
    /// disk is involved, on tokio's blocking threads (a disk wait would stall an async
    /// worker). What the binary does; see the `warm` module.
    Adaptive,
    /// Every call inline, on the task that read the request: for a simulation on one thread,
    /// where the order of events must follow from the requests alone, not from when a thread
    /// finished.
    Inline,
}

/// Most records a gather may ask for and still run inline: bounds the time it holds an
/// async worker. The worst case is records just under `ZERO_COPY_MEAN_BYTES`, which are
/// copied: 1,024 × 4,000 bytes take about 0.8 ms (`cluster_bench --sizes 4000 --only
/// handling`); longer records are sent from the mapping, and only touched.
const INLINE_GATHER_RECORDS_MAX: usize = 1024;

/// Serves `store` on `endpoint` as `serving` says until `shutdown` resolves; then stops
/// accepting, lets requests in flight finish and commits.
pub async fn serve_with(
    endpoint: Endpoint,
    store: Store,
    serving: Serving,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let Serving {
        timeout,
        handling,
        reads,
        security,
    } = serving;
    let coordination = Coordination::open(store.dir())?;
    let shard = Shard::new(store, coordination, shard_runtime())?;
    let catalog = Arc::new(Catalog::open(shard, shard_runtime())?);
    if let Some(security) = security {
        catalog.ships.set_reach(endpoint.clone(), security);
    }
    // Gauges where the binary serves (a simulation's events follow from its requests
    // alone); stopped with the server.
    let mut gauges = tokio::task::JoinSet::new();
    if handling == Handling::Adaptive {
        gauges.spawn(store_gauges(Arc::clone(&catalog)));
    }
    let warmth = Arc::new(Warmth::default());
    let handler_catalog = Arc::clone(&catalog);
    let handler = move |peer: &net::Peer, bytes: Vec<u8>| {
        let catalog = Arc::clone(&handler_catalog);
        let warmth = Arc::clone(&warmth);
        let sender = Sender::of(peer);
        let reads = Arc::clone(&reads);
        async move {
            if let Sender::Client(role) = sender {
                if !reads.held() && is_gather(&bytes) {
                    let (header, body) = error_reply(
                        ErrorCode::NotInSync,
                        format!(
                            "this node cannot serve {} now: it does not know itself in sync with its partners (behind, or cut off from the metadata store); read through the router",
                            role.with_article()
                        ),
                    );
                    return (header, net::Body::Ready(body));
                }
            }
            let answer = match handling {
                Handling::Inline => Ok(handle_in(&catalog, &bytes, sender)),
                Handling::Adaptive => match decode(&bytes, sender).and_then(|(request, body_at)| {
                    let shard = addressed(&catalog, &request)?;
                    Ok((request, body_at, shard))
                }) {
                    Err(reply) => Ok(reply),
                    Ok((request, body_at, shard)) => {
                        let serving = shard.serving();
                        let may_inline = runs_inline_when_warm(&serving.store, &request.request);
                        let reads = {
                            let serving = Arc::clone(&serving);
                            move || serving.store.read_stats().direct_gathers
                        };
                        let call = move || {
                            respond(
                                &serving.store,
                                &serving.coordination,
                                Some((&shard, &catalog)),
                                sender,
                                request,
                                &bytes[body_at..],
                            )
                        };
                        if may_inline && warmth.is_warm() {
                            Ok(warmth.observe_reads(reads, call))
                        } else if may_inline {
                            tokio::task::spawn_blocking(move || warmth.observe_reads(reads, call))
                                .await
                        } else {
                            tokio::task::spawn_blocking(call).await
                        }
                    }
                },
            };
            let (header, body) = answer.unwrap_or_else(|e| {
                error_reply(ErrorCode::Storage, format!("request handler failed: {e}"))
            });
            (header, net::Body::Ready(body))
        }
    };
    // Routers share one certificate: one allowance for all of them, and room kept for them
    // however many clients connect; a client's certificate gets half of the rest.
    let limits = net::Limits {
        connections_per_identity: (CONNECTIONS_MAX - ROUTER_CONNECTIONS) / 2,
        reserved: Some((net::tls::Role::Router, ROUTER_CONNECTIONS)),
        ..net::Limits::new(CONNECTIONS_MAX, timeout)
    };
    net::serve_peers(&endpoint, limits, shutdown, handler).await;
    let committed = tokio::task::spawn_blocking(move || {
        for shard in catalog.all() {
            match shard.serving().store.commit() {
                Ok(()) | Err(Error::ReadOnly { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
    .await;
    committed.unwrap_or_else(|e| {
        Err(Error::InvalidRecord(format!(
            "commit at shutdown panicked: {e}"
        )))
    })
}

/// Whether `bytes` is a gather (decoded again where it is served; a request that does not
/// decode is not one).
fn is_gather(bytes: &[u8]) -> bool {
    matches!(
        wire::decode_request::<NodeMessage>(bytes),
        Ok((
            NodeMessage {
                request: NodeRequest::Gather { .. },
                ..
            },
            _
        ))
    )
}

/// Decodes and answers one request of any dataset of `catalog` from `sender`.
fn handle_in(catalog: &Catalog, bytes: &[u8], sender: Sender) -> (Vec<u8>, Vec<Bytes>) {
    let (message, body_at) = match decode(bytes, sender) {
        Ok(decoded) => decoded,
        Err(reply) => return reply,
    };
    let shard = match addressed(catalog, &message) {
        Ok(shard) => shard,
        Err(reply) => return reply,
    };
    let serving = shard.serving();
    respond(
        &serving.store,
        &serving.coordination,
        Some((&shard, catalog)),
        sender,
        message,
        &bytes[body_at..],
    )
}

/// The dataset `message` addresses (for a request about the node's datasets, the default
/// one, whose identity it is checked against), or the reply that it has none of that name.
fn addressed(
    catalog: &Catalog,
    message: &NodeMessage,
) -> Result<Arc<Shard>, (Vec<u8>, Vec<Bytes>)> {
    let of_node = matches!(
        message.request,
        NodeRequest::Datasets | NodeRequest::CreateDataset { .. } | NodeRequest::DropDataset { .. }
    );
    if of_node {
        return Ok(Arc::clone(catalog.root()));
    }
    catalog.get(message.dataset.as_deref()).ok_or_else(|| {
        let name = message
            .dataset
            .as_deref()
            .unwrap_or(crate::catalog::DEFAULT);
        error_reply(
            ErrorCode::NoSuchDataset,
            format!("this node holds no dataset '{name}'"),
        )
    })
}

/// Decodes, executes and encodes one request: the whole protocol, without I/O.
/// `coordination` holds this node's identity and fence.
/// Requests of a shard move are refused: they need a [`Shard`] (see [`serve_with`]).
/// Requests of other datasets are refused as the node holding none.
pub fn handle(store: &Store, coordination: &Coordination, bytes: &[u8]) -> (Vec<u8>, Vec<Bytes>) {
    match decode(bytes, Sender::Router) {
        Ok((message, _)) if message.dataset.is_some() => error_reply(
            ErrorCode::NoSuchDataset,
            "this server holds one dataset, the default one".into(),
        ),
        Ok((message, body_at)) => respond(
            store,
            coordination,
            None,
            Sender::Router,
            message,
            &bytes[body_at..],
        ),
        Err(reply) => reply,
    }
}

/// A node's datasets, and the one a request addresses.
type OnNode<'a> = Option<(&'a Shard, &'a Catalog)>;

/// Decodes a request from `sender`: it and where its body starts in `bytes`, or the error
/// reply (a client's request other than a read is refused here, before anything else).
fn decode(bytes: &[u8], sender: Sender) -> Result<(NodeMessage, usize), (Vec<u8>, Vec<Bytes>)> {
    match wire::decode_request::<NodeMessage>(bytes) {
        Ok((message, body)) => match sender.refuses(&message) {
            None => Ok((message, bytes.len() - body.len())),
            Some(role) => {
                let may = match role {
                    net::tls::Role::Node => {
                        "copy a dataset's files from a node (ship-open, ship-read, info)"
                    }
                    _ => "read from a node (gather, info)",
                };
                tracing::warn!(
                    "refused {} from {}: it may only {may}",
                    message.request.kind(),
                    role.with_article()
                );
                Err(error_reply(
                    ErrorCode::Forbidden,
                    format!(
                        "{} certificate may only {may}; {} goes through the router",
                        role.with_article(),
                        message.request.kind()
                    ),
                ))
            }
        },
        Err(e) => {
            tracing::warn!("bad request: {e}");
            Err(error_reply(e.code(), e.to_string()))
        }
    }
}

/// Executes and encodes one decoded request, and records it in the node's metrics
/// (`ops/README.md` lists them).
fn respond(
    store: &Store,
    coordination: &Coordination,
    shard: OnNode<'_>,
    sender: Sender,
    message: NodeMessage,
    body: &[u8],
) -> (Vec<u8>, Vec<Bytes>) {
    let started = std::time::Instant::now();
    let (kind, records, received) = (
        message.request.kind(),
        message.request.records(),
        body.len(),
    );
    let (header, reply_body, ok) =
        respond_unrecorded(store, coordination, shard, sender, message, body);
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!("zr_node_requests_total", "kind" => kind, "outcome" => outcome).increment(1);
    metrics::histogram!("zr_node_request_duration_seconds", "kind" => kind)
        .record(started.elapsed());
    metrics::counter!("zr_node_received_bytes_total").increment(received as u64);
    let sent = header.len() + reply_body.iter().map(Bytes::len).sum::<usize>();
    metrics::counter!("zr_node_sent_bytes_total").increment(sent as u64);
    if ok {
        match kind {
            "gather" => {
                metrics::counter!("zr_node_records_gathered_total").increment(records as u64)
            }
            "append" => {
                metrics::counter!("zr_node_records_appended_total").increment(records as u64)
            }
            _ => {}
        }
    }
    (header, reply_body)
}

/// [`respond`] without the metrics; also says whether the request succeeded.
fn respond_unrecorded(
    store: &Store,
    coordination: &Coordination,
    on: OnNode<'_>,
    sender: Sender,
    message: NodeMessage,
    body: &[u8],
) -> (Vec<u8>, Vec<Bytes>, bool) {
    let refused = |(header, body): (Vec<u8>, Vec<Bytes>)| (header, body, false);
    if let Some(target) = message.target {
        if let Err(mismatch) = coordination.identity.admit_target(target) {
            tracing::warn!("refused a request: {mismatch}");
            let refusal = Refusal::Identity(mismatch);
            return refused(error_reply(refusal.code(), refusal.to_string()));
        }
    }
    if let Sender::Client(_) = sender {
        // A client names no cluster or map for a node: it reads by the ones it has.
        let admitted = match &message.cluster {
            Some(cluster) => coordination
                .identity
                .admit_placed(cluster, message.map_version),
            None => Err(crate::identity::Mismatch::Unplaced),
        };
        if let Err(mismatch) = admitted {
            let refusal = Refusal::Identity(mismatch);
            return refused(error_reply(refusal.code(), refusal.to_string()));
        }
    } else if let Some(cluster) = &message.cluster {
        let admitted = match message.request {
            // Placed by the map it switches to.
            NodeRequest::Switch { .. } => coordination.identity.admit_cluster(cluster),
            _ => match coordination.identity.admit(cluster, message.map_version) {
                // A node holding nothing holds it the same way under every map: it takes
                // a newer one as it comes (a shard not added yet, or drained, that a switch
                // passed by).
                Err(crate::identity::Mismatch::Map { ours, theirs })
                    if theirs > ours && on.is_some_and(|(s, _)| s.holds_nothing(coordination)) =>
                {
                    coordination
                        .identity
                        .adopt(theirs)
                        .map_err(|e| crate::identity::Mismatch::Storage(e.to_string()))
                }
                other => other,
            },
        };
        if let Err(mismatch) = admitted {
            let refusal = Refusal::Identity(mismatch);
            return refused(error_reply(refusal.code(), refusal.to_string()));
        }
    }
    let dataset = message.dataset.as_deref();
    match execute(store, coordination, on, dataset, message.request, body) {
        Ok((reply, body)) => match wire::encode_reply(&reply) {
            Ok(header) => (header, body, true),
            Err(e) => refused(error_reply(ErrorCode::Storage, e.to_string())),
        },
        Err(refusal) => refused(error_reply(refusal.code(), refusal.to_string())),
    }
}

/// Whether `request` is a gather small enough, and of raw fields only (no decompression), to
/// run inline on an async worker while the store's pages are in memory.
fn runs_inline_when_warm(store: &Store, request: &NodeRequest) -> bool {
    let NodeRequest::Gather {
        indices,
        fields,
        checked: false,
    } = request
    else {
        // Checked gathers read every byte: never inline.
        return false;
    };
    let raw = |spec: &FieldSpec| spec.compress == Compression::Raw;
    indices.len() <= INLINE_GATHER_RECORDS_MAX
        && if fields.is_empty() {
            store.fields().iter().all(raw)
        } else {
            fields
                .iter()
                .all(|name| store.fields().iter().any(|f| &f.name == name && raw(f)))
        }
}

/// Why a node refused a request. Each crosses the wire as its code and its message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] Error),
    /// The fence could not be kept.
    #[error(transparent)]
    FenceStorage(crate::fence::FenceError),
    /// A write without a lease token.
    #[error("a node takes writes only from a router holding the write lease, and this one carries no lease token")]
    NoLeaseToken,
    /// A write whose lease token is below the node's fence.
    #[error(transparent)]
    Fenced(crate::fence::FenceError),
    /// The request is for another cluster or map than this node's data.
    #[error(transparent)]
    Identity(crate::identity::Mismatch),
    /// An append that does not start at its slot's length.
    #[error("append expected to start at record {at} of slot {slot}, but this node holds {len} of that slot")]
    OutOfStep { slot: u32, at: u64, len: u64 },
    /// An append to a slot a move is building here, not served.
    #[error(
        "slot {0} is being built here by a shard move: it takes no appends until it is served"
    )]
    Building(u32),
    /// A request of a rebuild from files that cannot be served.
    #[error(transparent)]
    Ship(#[from] crate::ship::ShipError),
    /// A create whose field names another dictionary than the one sent for it.
    #[error("field '{field}' names dictionary {}, and the dictionary sent {sent}", want.map_or("none".into(), |id| id.to_string()))]
    DictMismatch {
        field: String,
        want: Option<u32>,
        sent: String,
    },
}

impl Refusal {
    /// The code the refusal crosses the wire with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Store(e) | Refusal::Ship(crate::ship::ShipError::Store(e)) => code_of(e),
            Refusal::Ship(_) => ErrorCode::BadRequest,
            Refusal::FenceStorage(_) => ErrorCode::Storage,
            Refusal::NoLeaseToken | Refusal::DictMismatch { .. } | Refusal::Building(_) => {
                ErrorCode::BadRequest
            }
            Refusal::Identity(crate::identity::Mismatch::Cluster { .. }) => ErrorCode::WrongCluster,
            Refusal::Identity(
                crate::identity::Mismatch::Map { .. } | crate::identity::Mismatch::Unplaced,
            ) => ErrorCode::StaleMap,
            Refusal::Identity(crate::identity::Mismatch::Storage(_)) => ErrorCode::Storage,
            Refusal::Identity(crate::identity::Mismatch::Node { .. }) => ErrorCode::WrongShard,
            Refusal::Fenced(_) | Refusal::OutOfStep { .. } => ErrorCode::Conflict,
        }
    }
}

fn error_reply(code: ErrorCode, message: String) -> (Vec<u8>, Vec<Bytes>) {
    let reply = Reply::Error { code, message };
    (wire::encode_reply(&reply).unwrap_or_default(), Vec::new())
}

fn code_of(e: &Error) -> ErrorCode {
    match e {
        Error::IndexOutOfRange { .. } | Error::UnitIndexOutOfRange { .. } => {
            ErrorCode::IndexOutOfRange
        }
        Error::UnknownField { .. } => ErrorCode::UnknownField,
        Error::InvalidRecord(_) => ErrorCode::BadRequest,
        Error::BadRecord { .. } | Error::Corrupt { .. } => ErrorCode::CorruptRecord,
        _ => ErrorCode::Storage,
    }
}

type Outcome = Result<(Reply, Vec<Bytes>), Refusal>;

/// Runs `write` if it carries a lease token the node's fence admits.
fn fenced(
    coordination: &Coordination,
    token: Option<u64>,
    write: impl FnOnce() -> Outcome,
) -> Outcome {
    let Some(token) = token else {
        return Err(Refusal::NoLeaseToken);
    };
    coordination
        .fence
        .admit(token, write)
        .map_err(Refusal::Fenced)?
}

fn execute(
    store: &Store,
    coordination: &Coordination,
    on: OnNode<'_>,
    dataset: Option<&str>,
    request: NodeRequest,
    body: &[u8],
) -> Outcome {
    let node = || {
        on.map(|(_, catalog)| catalog).ok_or_else(|| {
            Refusal::Store(Error::InvalidRecord(
                "this server holds one dataset: it has no others to list, create or drop".into(),
            ))
        })
    };
    let mover = || {
        on.map(|(shard, _)| shard).ok_or_else(|| {
            Refusal::Store(Error::InvalidRecord(
                "this server does not take part in shard moves".into(),
            ))
        })
    };
    let named = || {
        dataset.filter(|&d| d != crate::catalog::DEFAULT).ok_or_else(|| {
            Refusal::Store(Error::InvalidRecord(
                "the default dataset is the data directory itself: it is never created or dropped".into(),
            ))
        })
    };
    let fail = Refusal::Store;
    let served_len = || crate::stage::served_len(store, coordination);
    let info = || {
        let fields = store.fields().iter().map(field_info).collect();
        Ok((
            Reply::Info {
                len: served_len(),
                fields,
                incarnation: coordination.incarnation,
            },
            Vec::new(),
        ))
    };
    match request {
        NodeRequest::Info => info(),
        NodeRequest::Identity => Ok((
            Reply::Identity {
                cluster: coordination.identity.cluster(),
                map_version: coordination.identity.map_version(),
                len: served_len(),
            },
            Vec::new(),
        )),
        NodeRequest::Gather {
            indices,
            fields,
            checked,
        } => {
            let names: Vec<&str> = fields.iter().map(String::as_str).collect();
            let options = GatherOptions {
                verify: checked || store.gather_options().verify,
                ..store.gather_options()
            };
            let batch = Arc::new(store.gather_with(&indices, &names, options).map_err(fail)?);
            // The reply's body is sent straight from the batch: raw payloads from the mapped
            // chunks, flate ones from the batch's buffers; no copy into a reply buffer.
            let mut lengths = Vec::new();
            let mut pieces = Vec::new();
            for (field, view) in batch.fields().enumerate() {
                let column: Vec<u32> = view.iter().map(|p| p.len() as u32).collect();
                let total: u64 = column.iter().map(|&l| l as u64).sum();
                if total >= ZERO_COPY_MEAN_BYTES * column.len().max(1) as u64 {
                    // Every page read here: a record sent from the mapping is copied later, by
                    // the transport, on an async worker; a page the page cache no longer
                    // holds is read from the disk here instead, in the store call, where
                    // `Handling` chose to wait for the disk and `warm` counts the fault.
                    view.iter().for_each(touch_pages);
                    for (record, &len) in column.iter().enumerate() {
                        if len > 0 {
                            pieces.push(Bytes::from_owner(RecordBytes {
                                batch: Arc::clone(&batch),
                                field,
                                record,
                            }));
                        }
                    }
                } else {
                    // Small records: one copy is cheaper than a handle per record.
                    pieces.push(Bytes::from(view.to_contiguous().data));
                }
                lengths.push(column);
            }
            Ok((Reply::Gather { lengths }, pieces))
        }
        NodeRequest::Append {
            runs,
            token,
            fields,
            lengths,
        } => fenced(coordination, token, || {
            let building = coordination.identity.staged();
            // Where each slot's next record goes: its length, then past the runs before.
            let mut next_at: std::collections::HashMap<u32, u64> = Default::default();
            for run in &runs {
                if building
                    .as_ref()
                    .is_some_and(|b| b.slots.contains(&run.slot))
                {
                    return Err(Refusal::Building(run.slot));
                }
                let at = next_at
                    .entry(run.slot)
                    .or_insert_with(|| store.unit_len(run.slot).unwrap_or(0));
                if run.at != *at {
                    return Err(Refusal::OutOfStep {
                        slot: run.slot,
                        at: run.at,
                        len: *at,
                    });
                }
                *at += run.count;
            }
            let records = records_of(&fields, &lengths, body);
            let mut next = 0;
            let mut parts = Vec::with_capacity(runs.len());
            for run in &runs {
                let end = next + run.count as usize;
                let part = records.get(next..end).ok_or_else(|| {
                    Refusal::Store(Error::InvalidRecord(format!(
                        "the runs count {} records or more, the body holds {}",
                        end,
                        records.len()
                    )))
                })?;
                parts.push((run.slot, part));
                next = end;
            }
            store.append_runs(&parts).map_err(fail)?;
            Ok((
                Reply::Appended {
                    start: runs.first().map_or(0, |r| unit_address(r.slot, r.at)),
                    count: records.len() as u64,
                },
                Vec::new(),
            ))
        }),
        NodeRequest::Modify {
            index,
            token,
            fields,
            lengths,
        } => fenced(coordination, token, || {
            let columns =
                wire::split_columns(&lengths.iter().map(|&l| vec![l]).collect::<Vec<_>>(), body);
            let mut record = Record::new();
            for (name, column) in fields.iter().zip(&columns) {
                record.set(name, column[0]);
            }
            store.modify(index, &record).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }),
        NodeRequest::WriteField {
            token,
            field,
            indices,
            lengths,
        } => fenced(coordination, Some(token), || {
            let values = wire::split_columns(&[lengths], body);
            let values = values.first().map_or(&[][..], Vec::as_slice);
            store.write_field(&field, &indices, values).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }),
        NodeRequest::Datasets => {
            let held = node()?
                .list()
                .into_iter()
                .map(|held| wire::DatasetInfo {
                    name: held.name,
                    id: held.id,
                    fields: held.fields.iter().map(field_info).collect(),
                    len: held.len,
                    committed: None,
                    bytes: held.bytes,
                    commits: None,
                })
                .collect();
            Ok((Reply::Datasets(held), Vec::new()))
        }
        NodeRequest::CreateDataset { id, fields, dicts } => {
            let specs = fields
                .iter()
                .map(field_spec)
                .collect::<Result<Vec<_>, _>>()
                .map_err(fail)?;
            let dicts = field_dicts(&fields, dicts)?;
            node()?.create(named()?, id, specs, &dicts).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::ShipOpen { slots } => {
            // Slots being built are not served: not copied from here either.
            let building = coordination.identity.staged();
            let refused = match &building {
                Some(_) if slots.is_empty() => true,
                Some(staged) => slots.iter().any(|s| staged.slots.contains(s)),
                None => false,
            };
            if refused {
                return Err(Refusal::Store(Error::InvalidRecord(
                    "a shard move is building slots on this node: copy from it once the move is done".into(),
                )));
            }
            let reply = node()?
                .ships
                .open(store, &slots, coordination.incarnation)?;
            Ok((reply, Vec::new()))
        }
        NodeRequest::ShipRead {
            ship,
            file,
            offset,
            len,
        } => {
            let (reply, bytes) = node()?.ships.read(ship, file, offset, len)?;
            Ok((reply, vec![bytes]))
        }
        NodeRequest::ShipReadMany { ship, pieces } => {
            let (reply, bytes) = node()?.ships.read_many(ship, &pieces)?;
            Ok((reply, bytes))
        }
        NodeRequest::ShipClose { ship } => {
            node()?.ships.close(ship);
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::ShipFrom {
            addr,
            replica,
            shard: from_shard,
            slots,
            rate,
        } => {
            let catalog = node()?;
            let shard = catalog.get(dataset).ok_or_else(|| {
                Refusal::Store(Error::InvalidRecord(format!(
                    "this node holds no dataset '{}'",
                    dataset.unwrap_or(crate::catalog::DEFAULT)
                )))
            })?;
            let place = coordination.identity.place().ok_or_else(|| {
                Refusal::Store(Error::InvalidRecord(
                    "this node belongs to no cluster yet: nothing to rebuild".into(),
                ))
            })?;
            let partner = wire::Target {
                shard: from_shard.unwrap_or(place.shard),
                replica,
            };
            let dataset = dataset.map(str::to_string);
            let status = catalog
                .ships
                .start(shard, dataset, partner, &addr, slots, rate)?;
            Ok((Reply::Shipping(status), Vec::new()))
        }
        NodeRequest::DropDataset { id } => {
            node()?.drop_dataset(named()?, id).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::AddField { field } => {
            let spec = field_spec(&field).map_err(fail)?;
            node()?.add_field(dataset, spec).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::Truncate { slots, token } => fenced(coordination, Some(token), || {
            for (slot, len) in slots {
                store.truncate_unit(slot, len).map_err(fail)?;
            }
            Ok((Reply::Done, Vec::new()))
        }),
        NodeRequest::Fence { token } => coordination
            .fence
            .raise(token, info)
            .map_err(Refusal::FenceStorage)?,
        NodeRequest::Commit => {
            store.commit().map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::StageOpen { version, slots } => {
            let slots = mover()?.open_stage(version, &slots).map_err(fail)?;
            Ok((Reply::Staged { slots }, Vec::new()))
        }
        NodeRequest::Stage {
            version,
            runs,
            fields,
            lengths,
            commit,
        } => {
            let received = records_of(&fields, &lengths, body);
            let slots = mover()?
                .stage(version, &runs, &received, commit)
                .map_err(fail)?;
            Ok((Reply::Staged { slots }, Vec::new()))
        }
        NodeRequest::Switch {
            version,
            slots,
            token,
        } => {
            // Checked, not held: a switch is no write.
            fenced(coordination, Some(token), || Ok((Reply::Done, Vec::new())))?;
            mover()?.switch(version, &slots).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::Digest { runs } => {
            // Before the records are read (see `Store::mark`).
            let of_store = store.mark();
            let mark = wire::DataMark {
                incarnation: coordination.incarnation,
                instance: of_store.instance,
                rewrites: of_store.rewrites,
            };
            let (crcs, corrupt) = digest(store, &runs).map_err(fail)?;
            Ok((
                Reply::Digest {
                    crcs,
                    corrupt,
                    mark,
                },
                Vec::new(),
            ))
        }
    }
}

/// The records an append's body carries: per field of `fields`, `lengths` payloads.
fn records_of<'a>(fields: &'a [String], lengths: &[Vec<u32>], body: &'a [u8]) -> Vec<Record<'a>> {
    let columns = wire::split_columns(lengths, body);
    let count = lengths.first().map_or(0, Vec::len);
    (0..count)
        .map(|k| {
            let mut record = Record::new();
            for (name, column) in fields.iter().zip(&columns) {
                record.set(name, column[k]);
            }
            record
        })
        .collect()
}

/// Records read per gather of a digest.
const DIGEST_BATCH: usize = 4096;

/// Per record of `runs` (each clamped to its slot's length), in order: a CRC32 of each
/// field's length and contents, each read checked against its CRC; and the positions among
/// them of the records that failed the check (their digest is 0).
fn digest(store: &Store, runs: &[Run]) -> zr_node::Result<(Vec<u32>, Vec<u64>)> {
    let addresses: Vec<u64> = runs
        .iter()
        .flat_map(|run| {
            let end = run
                .at
                .saturating_add(run.count)
                .min(store.unit_len(run.slot).unwrap_or(0));
            (run.at..end.max(run.at)).map(move |i| unit_address(run.slot, i))
        })
        .collect();
    let mut crcs = Vec::with_capacity(addresses.len());
    let mut corrupt = Vec::new();
    let checked = GatherOptions {
        verify: true,
        ..store.gather_options()
    };
    let record_crc = |batch: &Batch, k: usize| {
        let mut hasher = crc32fast::Hasher::new();
        for field in batch.fields() {
            let payload = field.get(k).unwrap_or_default();
            hasher.update(&(payload.len() as u32).to_le_bytes());
            hasher.update(payload);
        }
        hasher.finalize()
    };
    for (part, indices) in addresses.chunks(DIGEST_BATCH).enumerate() {
        match store.gather_with(indices, &[], checked) {
            Ok(batch) => crcs.extend((0..indices.len()).map(|k| record_crc(&batch, k))),
            Err(Error::BadRecord { .. } | Error::Corrupt { .. }) => {
                // Which ones: record by record.
                for (k, &index) in indices.iter().enumerate() {
                    match store.gather_with(&[index], &[], checked) {
                        Ok(batch) => crcs.push(record_crc(&batch, 0)),
                        Err(Error::BadRecord { .. } | Error::Corrupt { .. }) => {
                            crcs.push(0);
                            corrupt.push((part * DIGEST_BATCH + k) as u64);
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok((crcs, corrupt))
}

/// One gathered payload as a `Bytes` that keeps its batch (and so its mapping) alive.
struct RecordBytes {
    batch: Arc<Batch>,
    field: usize,
    record: usize,
}

impl AsRef<[u8]> for RecordBytes {
    fn as_ref(&self) -> &[u8] {
        self.batch
            .fields()
            .nth(self.field)
            .and_then(|f| f.get(self.record))
            .unwrap_or_default()
    }
}

fn field_info(spec: &FieldSpec) -> FieldInfo {
    FieldInfo {
        name: spec.name.clone(),
        compress: spec.storage(),
        dtype: spec.dtype.clone(),
        shape: spec.shape.clone(),
        // A cluster's datasets are made with their dictionary's CRC32 (only local
        // datasets of an early format lack it).
        dict: spec.dict.map(|id| DictRef {
            id,
            crc: spec.dict_crc.unwrap_or_default(),
        }),
    }
}

/// The dictionaries a create sends, each checked against the id its field names (the
/// engine checks that the bytes are a dictionary of that id and that the field is zstd).
fn field_dicts(
    fields: &[FieldInfo],
    dicts: Vec<FieldDict>,
) -> Result<Vec<(String, Vec<u8>)>, Refusal> {
    for field in fields {
        let sent = dicts
            .iter()
            .find(|d| d.field == field.name)
            .map(|d| DictRef::of(&d.bytes));
        match (field.dict, sent) {
            (None, None) => {}
            (Some(want), Some(Some(have))) if want == have => {}
            (want, sent) => {
                return Err(Refusal::DictMismatch {
                    field: field.name.clone(),
                    want: want.map(|d| d.id),
                    sent: match sent {
                        None => "is none".into(),
                        Some(None) => "is no zstd dictionary".into(),
                        Some(Some(have)) => {
                            format!("is dictionary {} with CRC32 {:08x}", have.id, have.crc)
                        }
                    },
                })
            }
        }
    }
    Ok(dicts.into_iter().map(|d| (d.field, d.bytes)).collect())
}

/// The field a wire description asks for: its compression and type checked.
fn field_spec(info: &FieldInfo) -> Result<FieldSpec, Error> {
    let spec = FieldSpec::stored(info.name.clone(), &info.compress)?;
    Ok(match (&info.dtype, &info.shape) {
        (Some(dtype), shape) => spec.typed(dtype.clone(), shape.clone().unwrap_or_default()),
        (None, _) => spec,
    })
}

/// Keeps every dataset's gauges and read counters current (labelled by dataset): every few
/// seconds, off the request path (the chunk lists are walked).
async fn store_gauges(catalog: Arc<Catalog>) {
    loop {
        let (mut mmap, mut direct) = (0, 0);
        for (name, shard) in catalog.named_all() {
            let store = shard.serving().store.clone();
            let (chunks, bytes) = store.chunk_stats();
            metrics::gauge!("zr_node_chunks", "dataset" => name.clone()).set(chunks as f64);
            metrics::gauge!("zr_node_chunk_bytes", "dataset" => name.clone()).set(bytes as f64);
            metrics::gauge!("zr_node_records", "dataset" => name).set(store.len() as f64);
            let reads = store.read_stats();
            mmap += reads.mmap_gathers;
            direct += reads.direct_gathers;
        }
        metrics::counter!("zr_node_gathers_total", "read" => "mmap").absolute(mmap);
        metrics::counter!("zr_node_gathers_total", "read" => "direct").absolute(direct);
        if let Some((minor, major)) = page_faults() {
            metrics::counter!("zr_node_page_faults_total", "kind" => "minor").absolute(minor);
            metrics::counter!("zr_node_page_faults_total", "kind" => "major").absolute(major);
        }
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    }
}

/// The process's page faults so far: (minor, major). Major ones read from the disk: a
/// shard served through its mappings while its data is not in memory shows them rising.
fn page_faults() -> Option<(u64, u64)> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the `rusage` it is given; it is read only if the call
    // succeeded.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    Some((usage.ru_minflt as u64, usage.ru_majflt as u64))
}

/// Binds the address of shard `shard`'s replica `replica` from `config` and serves its store
/// (the binary's path).
/// Converts the data directory `dir` of shard `shard` if an older build wrote it (see
/// `upgrade`), by the cluster map the metadata store holds: what a node does before it
/// opens its data.
pub async fn upgrade_layout(
    config: &ClusterConfig,
    dir: &Path,
    shard: u32,
    timeout: std::time::Duration,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let check = dir.to_path_buf();
    if !tokio::task::spawn_blocking(move || crate::upgrade::needed(&check)).await?? {
        return Ok(());
    }
    let location = config.metadata_location();
    let cannot = |why: String| {
        format!(
            "{}: {} It cannot be converted now: {why}",
            dir.display(),
            crate::identity::LEGACY_LAYOUT
        )
    };
    let meta = zr_meta::open(&location, timeout)
        .await
        .map_err(|e| cannot(format!("the metadata store: {e}")))?;
    let (record, _) = zr_meta::cluster::load(&*meta)
        .await
        .map_err(|e| cannot(format!("the metadata store: {e}")))?
        .ok_or_else(|| cannot("the metadata store holds no cluster record".into()))?;
    if let Some(moving) = &record.moving {
        return Err(cannot(format!(
            "a move to map version {} is recorded, unfinished: finish it with the older build first",
            moving.to.version
        ))
        .into());
    }
    let map = record.map.cluster_map().map_err(cannot)?;
    let placement = zr_proto::placement::Placement::new(map).map_err(|e| cannot(e.to_string()))?;
    let dir = dir.to_path_buf();
    let started = std::time::Instant::now();
    let records = tokio::task::spawn_blocking(move || {
        crate::upgrade::convert(&dir, shard, &placement, shard_runtime())
    })
    .await??;
    tracing::info!(
        "shard {shard}: {records} records converted to one unit per slot in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub async fn run_shard(
    config: &ClusterConfig,
    security: &net::Security,
    shard: u32,
    replica: u32,
    data: Option<&Path>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let entry = config.node(shard, replica).ok_or_else(|| {
        format!(
            "shard {shard} replica {replica} is not in the configuration (shards 0..{}, replicas 0..{})",
            config.cluster.shards, config.cluster.replicas
        )
    })?;
    let dir = data
        .map(Path::to_path_buf)
        .unwrap_or_else(|| config.node_data_dir(shard, replica));
    let timeout = std::time::Duration::from_millis(config.router.timeout_ms);
    upgrade_layout(config, &dir, shard, timeout).await?;
    let store = {
        let config = config.clone();
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || open_shard_store(&config, &dir, shard, replica))
            .await??
    };
    let addr: SocketAddr = entry.addr;
    let endpoint = net::server_endpoint(addr, security)?;
    tracing::info!(
        "shard {shard} serving {} records from {} on {addr}",
        store.len(),
        dir.display()
    );
    if let Some(why) = crate::filesystem::slow_to_make_files(&dir) {
        tracing::warn!("the data directory {why}");
    }
    // The node's liveness lease in the metadata store, renewed while it serves; a node that
    // cannot reach the store serves all the same (the lease says so by lapsing).
    let mut background = tokio::task::JoinSet::new(); // dropped (so stopped) with the node
                                                      // Clients read from it while it knows itself in sync (see `Sender`).
    let reads = Arc::new(zr_meta::nodes::ReadLease::new(config.cluster.replicas));
    match zr_meta::open(&config.metadata_location(), timeout).await {
        Ok(meta) => {
            background.spawn(zr_meta::nodes::keep_alive(
                meta,
                shard,
                replica,
                addr.to_string(),
                Arc::clone(&reads),
            ));
        }
        Err(e) => tracing::warn!("shard {shard}: no liveness lease: {e}"),
    }
    let serving = Serving {
        timeout,
        handling: Handling::Adaptive,
        reads,
        security: Some(security.clone()),
    };
    serve_with(endpoint, store, serving, shutdown).await?;
    tracing::info!("shard {shard} stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gather(records: usize, fields: &[&str]) -> NodeRequest {
        NodeRequest::Gather {
            indices: (0..records as u64).collect(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
            checked: false,
        }
    }

    #[test]
    fn only_small_gathers_of_raw_fields_may_run_inline() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let fields = vec![
            FieldSpec::new("image", Compression::Raw),
            FieldSpec::new("label", Compression::Flate),
        ];
        let store = Store::create(dir.path(), fields, CreateOptions::default()).expect("create");
        let inline = |request: &NodeRequest| runs_inline_when_warm(&store, request);
        assert!(inline(&gather(1024, &["image"])));
        assert!(!inline(&gather(1025, &["image"])), "too many records");
        assert!(!inline(&gather(1, &["label"])), "decompression");
        assert!(!inline(&gather(1, &[])), "all fields include a flate one");
        assert!(
            !inline(&gather(1, &["nope"])),
            "an unknown field is an error, off the workers"
        );
        assert!(!inline(&NodeRequest::Info));
    }

    /// Each refusal crosses the wire with a code a router can act on: a damaged record is
    /// `CorruptRecord` (the data is at fault), an index past the end `IndexOutOfRange`, a
    /// write without a lease token `BadRequest`, a client's request `BadRequest` unread.
    /// What each sender may ask of a node: a router anything, a client reads, a partner
    /// node its files (and nothing it could change or read records with).
    #[test]
    fn each_sender_may_ask_what_it_is_for() {
        use net::tls::Role;
        let message = |request: NodeRequest| NodeMessage::unchecked(request);
        let requests = [
            gather(1, &[]),
            NodeRequest::Info,
            NodeRequest::ShipOpen { slots: Vec::new() },
            NodeRequest::ShipRead {
                ship: 1,
                file: 0,
                offset: 0,
                len: 10,
            },
            NodeRequest::ShipClose { ship: 1 },
            NodeRequest::ShipFrom {
                addr: "127.0.0.1:1".into(),
                replica: 0,
                shard: None,
                slots: Vec::new(),
                rate: 0,
            },
            NodeRequest::Commit,
            NodeRequest::Digest {
                runs: vec![Run {
                    slot: 0,
                    at: 0,
                    count: 1,
                }],
            },
        ];
        let allowed = |sender: Sender| -> Vec<&'static str> {
            requests
                .iter()
                .filter(|r| sender.refuses(&message((*r).clone())).is_none())
                .map(NodeRequest::kind)
                .collect()
        };
        assert_eq!(allowed(Sender::Router).len(), requests.len());
        assert_eq!(allowed(Sender::Client(Role::Reader)), ["gather", "info"]);
        assert_eq!(allowed(Sender::Client(Role::Operator)), ["gather", "info"]);
        assert_eq!(
            allowed(Sender::Client(Role::Node)),
            ["info", "ship-open", "ship-read", "ship-close"]
        );
    }

    #[test]
    fn refusals_carry_their_codes() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let fields = vec![FieldSpec::new("image", Compression::Raw)];
        let store = Store::create(dir.path(), fields, CreateOptions::default()).expect("create");
        let record = zr_common::Record::new().with("image", b"0123456789");
        store
            .append_many(&[record.clone(), record])
            .expect("append");
        store.commit().expect("commit");
        drop(store);
        // Record 1's entry now claims a length past the chunk's end.
        let table = dir.path().join(zr_node::offset::offset_file_name("image"));
        let mut bytes = std::fs::read(&table).expect("offset table");
        bytes[16 + 12..16 + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&table, bytes).expect("damage the entry");
        let store = Store::open(dir.path()).expect("open");
        let coordination = Coordination::open(dir.path()).expect("coordination");
        let code_of_reply = |request: Vec<u8>| {
            let (header, _) = handle(&store, &coordination, &request);
            match wire::decode_reply(&header).expect("reply").0 {
                Reply::Error { code, .. } => code,
                other => panic!("not refused: {other:?}"),
            }
        };
        let ask = |request: &NodeRequest| {
            code_of_reply(
                wire::encode_request(&NodeMessage::unchecked(request.clone())).expect("encode"),
            )
        };
        let gather = |index: u64| NodeRequest::Gather {
            indices: vec![index],
            fields: Vec::new(),
            checked: false,
        };
        assert_eq!(ask(&gather(1)), ErrorCode::CorruptRecord);
        assert_eq!(ask(&gather(2)), ErrorCode::IndexOutOfRange);
        let untokened = NodeRequest::Modify {
            index: 0,
            token: None,
            fields: Vec::new(),
            lengths: Vec::new(),
        };
        assert_eq!(ask(&untokened), ErrorCode::BadRequest);
        let client = wire::ClientMessage::new(None, wire::ClientRequest::Commit);
        assert_eq!(
            code_of_reply(wire::encode_request(&client).expect("encode")),
            ErrorCode::BadRequest
        );
    }

    /// A gather of data not in memory waits for the disk inside the store call, whichever way
    /// it reads (the pages of a gather sent from the mapping are touched there, not later in
    /// the transport; explicit reads are done there), and the node's warmth sees it: the next
    /// gathers go to the blocking threads.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_cold_gather_waits_for_the_disk_in_the_store_call() {
        for read in [ReadPath::Mmap, ReadPath::Auto] {
            let dir = tempfile::tempdir().expect("temporary directory");
            let fields = vec![FieldSpec::new("image", Compression::Raw)];
            let store =
                Store::create(dir.path(), fields, CreateOptions::default()).expect("create");
            let payloads: Vec<Vec<u8>> = (0..64u8).map(|k| vec![k; 16 << 10]).collect();
            let records: Vec<zr_common::Record> = payloads
                .iter()
                .map(|p| zr_common::Record::new().with("image", p))
                .collect();
            store.append_many(&records).expect("append");
            store.commit().expect("commit");
            drop(store);
            for chunk in std::fs::read_dir(dir.path().join(zr_node::CHUNK_DIR)).expect("chunks") {
                if !crate::warm::tests::evict(&chunk.expect("chunk").path()) {
                    eprintln!("skipped: the page cache keeps the chunks in memory");
                    return;
                }
            }
            let store = Store::open(dir.path())
                .expect("open")
                .with_gather_options(GatherOptions {
                    read,
                    ..GatherOptions::default()
                });
            let coordination = Coordination::open(dir.path()).expect("coordination");
            let request =
                wire::encode_request(&NodeMessage::unchecked(gather(64, &[]))).expect("encode");
            let warmth = Warmth::default();
            for _ in 0..crate::warm::WARM_STREAK {
                warmth.observe(|| ());
            }
            assert!(warmth.is_warm());
            let reads = || store.read_stats().direct_gathers;
            let (header, body) =
                warmth.observe_reads(reads, || handle(&store, &coordination, &request));
            let mut reply = header;
            body.iter().for_each(|piece| reply.extend_from_slice(piece));
            assert!(matches!(
                wire::decode_reply(&reply).expect("reply").0,
                Reply::Gather { .. }
            ));
            assert_eq!(body.len(), 64, "16 KiB records are sent one by one");
            assert_eq!(body[5].as_ref(), &[5u8; 16 << 10][..]);
            assert_eq!(
                store.read_stats().direct_gathers,
                u64::from(read == ReadPath::Auto),
                "{read:?}"
            );
            assert!(
                !warmth.is_warm(),
                "{read:?}: the pages came from the disk inside the call, not later in the transport"
            );
        }
    }
}
