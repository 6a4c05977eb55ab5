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

mod execute;
mod refusal;
mod store;
#[cfg(test)]
mod tests;

use execute::*;
pub use refusal::Refusal;
use refusal::*;
pub use store::open_shard_store;
use store::*;

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
    /// Faults injected into the pieces of files it serves its partners (tests; `None`).
    pub ship_faults: Option<Arc<crate::ship::ShipFaults>>,
    /// Revoked certificate names and grants, as last read from the metadata store
    /// ([`zr_meta::access::watch`]): a client revoked, or reading a dataset no grant of its
    /// name covers, is refused.
    pub access: Arc<zr_meta::access::AccessControl>,
    /// Where access-control refusals are written (`[node] audit_log`), if anywhere.
    pub audit: Option<Arc<zr_service::audit::AuditLog>>,
    /// Bytes per second one client certificate moves through the node
    /// (`[node] mib_per_second_per_identity`; routers are not limited).
    pub bytes_per_second_per_identity: Option<u64>,
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
        ship_faults,
        access,
        audit,
        bytes_per_second_per_identity,
    } = serving;
    let coordination = Coordination::open(store.disk(), store.dir())?;
    let shard = Shard::new(store, coordination, shard_runtime())?;
    let catalog = Arc::new(Catalog::open(shard, shard_runtime())?);
    if let Some(security) = security {
        catalog.ships.set_reach(endpoint.clone(), security);
    }
    if let Some(faults) = ship_faults {
        catalog.ships.inject(faults);
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
        // A client (reader, writer, operator) whose certificate's name or serial was revoked.
        let revoked = match (sender, peer.name.as_deref()) {
            (Sender::Client(role), Some(name)) if role.access().is_some() => {
                access.revoked_why(name, peer.serial.as_deref())
            }
            _ => None,
        };
        // Under grants, a reader or writer reads one hop only the datasets its grants cover.
        let granted = (matches!(sender, Sender::Client(role) if role.access().is_some_and(|a| a < net::tls::Access::Operate))
            && access.has_grants())
        .then(|| access.record());
        // Who it is, and the audit log, only where a refusal may need them (a router's
        // requests, and a cluster without grants or revocations, pay nothing for them).
        let checked = revoked.is_some() || granted.is_some();
        let who = if checked { peer.who() } else { String::new() };
        let audit = audit
            .as_ref()
            .filter(|_| checked)
            .map(|log| (Arc::clone(log), peer.clone()));
        // A refusal is confirmed by the record read again if it was read before the request
        // arrived: a grant made, or a revocation undone, a moment ago holds at once. Only
        // a request that may be refused pays for what that needs.
        let confirm = checked.then(|| {
            let arrived = tokio::time::Instant::now();
            (
                Arc::clone(&access),
                arrived,
                peer.name.clone(),
                peer.serial.clone(),
            )
        });
        async move {
            if let Some(record) = granted {
                if let Ok(dataset) = wire::node_request_dataset(&bytes) {
                    let dataset = dataset.unwrap_or(wire::DEFAULT_DATASET);
                    let confirmed = match &confirm {
                        Some((access, arrived, ..)) if !record.allows(&who, dataset, false) => {
                            access.confirmed_since(*arrived).await
                        }
                        _ => record,
                    };
                    if !confirmed.allows(&who, dataset, false) {
                        let why = format!(
                            "the certificate named '{who}' has no grant to read dataset '{dataset}' (an operator grants it with `zr grant {who} read {dataset}`)"
                        );
                        refused(&audit, "read", dataset, &why);
                        let (header, body) = error_reply(ErrorCode::NotGranted, why);
                        return (header, net::Body::Ready(body));
                    }
                }
            }
            let revoked = match (revoked, &confirm) {
                (Some(_), Some((access, arrived, Some(name), serial))) => {
                    access.confirmed_since(*arrived).await;
                    access.revoked_why(name, serial.as_deref())
                }
                (revoked, _) => revoked,
            };
            if let Some(why) = revoked {
                refused(&audit, "request", "unknown", &why);
                let (header, body) = error_reply(ErrorCode::Forbidden, why);
                return (header, net::Body::Ready(body));
            }
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
        bytes_per_second_per_identity,
        // A client's heartbeats are answered however far over its rate it is.
        unpaced: Some(wire::is_liveness_probe),
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
    let access = Arc::new(zr_meta::access::AccessControl::default());
    let audit = match config.node.audit_path(shard, replica) {
        Some(path) => Some(Arc::new(zr_service::audit::AuditLog::open(&path)?)),
        None => None,
    };
    match zr_meta::open(&config.metadata_location(), timeout).await {
        Ok(meta) => {
            // Revoked certificates refused from the first request on, if the store answers.
            if let Err(e) = access.refresh(&*meta).await {
                tracing::warn!("shard {shard}: cannot read the access record yet: {e}");
            }
            background.spawn(zr_meta::access::watch(
                Arc::clone(&meta),
                Arc::clone(&access),
            ));
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
        ship_faults: None,
        access,
        audit,
        bytes_per_second_per_identity: zr_service::config::bytes_per_second(
            config.node.mib_per_second_per_identity,
        ),
    };
    serve_with(endpoint, store, serving, shutdown).await?;
    tracing::info!("shard {shard} stopped");
    Ok(())
}
