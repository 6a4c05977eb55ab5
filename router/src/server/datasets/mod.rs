//! Named datasets: many in one cluster, each with its own fields, length, committed length,
//! writer lease and replicas' state, all placed by the cluster's one map.
//!
//! The router of the default dataset serves; it keeps one [`Router`] per named dataset
//! (sharing its node links, metadata store and reply budget) and sends each request to the
//! router of the dataset it names. The cluster record lists the named datasets; creating and
//! dropping one is a compare-and-swap there, so two routers never disagree on what exists —
//! a router that does not know a dataset a request names reads the record again before it
//! says there is none. Each second the record is read and every node that answers is
//! brought in step with it: a dataset it lacks is created, one dropped while it was away is
//! removed, a field added while it was away is added.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use zr_coord::coordinator::Follow;
use zr_coord::datasets::{record_fields, wire_fields};
use zr_meta::cluster::{self, ClusterRecord, CommittedRecord, DatasetRecord, DictRef};
use zr_meta::writer::PendingWrite;
use zr_net::Body;
use zr_proto::wire::{
    self, ClientMessage, ClientRequest, DatasetInfo, FieldDict, FieldInfo, NodeRequest, Reply,
    DEFAULT_DATASET,
};

use super::Router;
use crate::error::Failure;
use crate::nodes::NodeId;

mod fields;
mod sync;

/// How often a waiting consumer's router reads the committed length from the metadata store
/// (a commit through this router wakes it at once; this is for commits through others).
const WAIT_POLL: Duration = Duration::from_millis(20);

/// Longest field name (as the engine allows).
const FIELD_NAME_MAX: usize = 64;

/// One shard's part of a field write: its local indices, their lengths, their bytes.
#[derive(Default)]
struct ShardValues {
    indices: Vec<u64>,
    lengths: Vec<u32>,
    bytes: Vec<u8>,
}

fn metadata(e: zr_meta::Error) -> Failure {
    Failure::from(e)
}

fn ready(reply: Reply) -> (Reply, Body) {
    (reply, Body::Ready(Vec::new()))
}

/// How the cluster record names a dictionary: its id and CRC32 (`None`: no dictionary).
fn dict_ref(bytes: &[u8]) -> Option<DictRef> {
    wire::DictRef::of(bytes).map(|d| DictRef {
        id: d.id,
        crc: d.crc,
    })
}

/// Checks the dictionaries a create sends: each for a zstd field, one per field, each a
/// zstd dictionary; a field naming a dictionary has it sent. Sets each field's `dict`.
fn check_dicts(fields: &mut [FieldInfo], dicts: &[FieldDict]) -> Result<(), Failure> {
    for (k, dict) in dicts.iter().enumerate() {
        let name = &dict.field;
        if dicts[..k].iter().any(|d| &d.field == name) {
            return Err(Failure::BadRequest(format!(
                "field '{name}' is given two dictionaries"
            )));
        }
        let Some(field) = fields.iter_mut().find(|f| &f.name == name) else {
            return Err(Failure::BadRequest(format!(
                "a dictionary for field '{name}', which the dataset does not have"
            )));
        };
        if !matches!(wire::parse_storage(&field.compress), Ok(("zstd", _))) {
            return Err(Failure::BadRequest(format!(
                "field '{name}' is stored {}: a dictionary is for zstd fields",
                field.compress
            )));
        }
        let Some(sent) = wire::DictRef::of(&dict.bytes) else {
            return Err(Failure::BadRequest(format!(
                "field '{name}': the dictionary sent is no zstd dictionary (train one with `zr dict train` or zstd --train)"
            )));
        };
        if let Err(e) = try_dictionary(&dict.bytes) {
            return Err(Failure::BadRequest(format!(
                "field '{name}': the dictionary sent (id {}) cannot be used: {e}",
                sent.id
            )));
        }
        if let Some(want) = field.dict.filter(|&want| want != sent) {
            return Err(Failure::BadRequest(format!(
                "field '{name}' names dictionary {} (CRC32 {:08x}), and the one sent is {} (CRC32 {:08x})",
                want.id, want.crc, sent.id, sent.crc
            )));
        }
        field.dict = Some(sent);
    }
    if let Some(field) = fields
        .iter()
        .find(|f| f.dict.is_some() && !dicts.iter().any(|d| d.field == f.name))
    {
        return Err(Failure::BadRequest(format!(
            "field '{}' names dictionary {}, and its bytes were not sent",
            field.name,
            field.dict.map_or(0, |d| d.id)
        )));
    }
    Ok(())
}

/// Compresses a sample with `dict` and reads it back: bytes that name themselves a
/// dictionary but are none fail here, not in every append after the create.
fn try_dictionary(dict: &[u8]) -> Result<(), String> {
    let sample = b"a sample record compressed with the dictionary, then read back".repeat(4);
    let compressed = zstd::bulk::Compressor::with_dictionary(3, dict)
        .and_then(|mut c| c.compress(&sample))
        .map_err(|e| e.to_string())?;
    let back = zstd::bulk::Decompressor::with_dictionary(dict)
        .and_then(|mut d| d.decompress(&compressed, sample.len()))
        .map_err(|e| e.to_string())?;
    match back == sample {
        true => Ok(()),
        false => Err("a sample compressed with it reads back different".into()),
    }
}

/// Checks a field as a client describes it: its name, compression and type.
fn check_field(field: &FieldInfo) -> Result<(), Failure> {
    let name = &field.name;
    let valid = !name.is_empty()
        && name.len() <= FIELD_NAME_MAX
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !valid {
        return Err(Failure::BadRequest(format!(
            "field name '{}' must be 1-{FIELD_NAME_MAX} characters of [A-Za-z0-9_.-], not starting with '.'",
            name.escape_debug()
        )));
    }
    if let Err(e) = wire::parse_storage(&field.compress) {
        return Err(Failure::BadRequest(format!("field '{name}': {e}")));
    }
    if let Some(dtype) = &field.dtype {
        let rest = dtype.strip_prefix(['<', '>', '|', '=']).unwrap_or(dtype);
        let mut chars = rest.chars();
        let kind_ok = chars.next().is_some_and(|k| "biufcSUV".contains(k));
        let size_ok = chars.as_str().parse::<u32>().is_ok_and(|n| n > 0);
        if !kind_ok || !size_ok {
            return Err(Failure::BadRequest(format!(
                "field '{name}': dtype '{}' is not a NumPy type string (e.g. <f4, |u1, <i8)",
                dtype.escape_debug()
            )));
        }
    }
    Ok(())
}

impl Router {
    /// Runs a client's request on the router of the dataset it names; requests about the
    /// datasets themselves and about the whole cluster run here.
    pub(super) async fn dispatch(
        self: &Arc<Self>,
        message: ClientMessage,
        body: &[u8],
    ) -> Result<(Reply, Body), Failure> {
        let name = message.dataset().to_string();
        match message.request {
            ClientRequest::Datasets => Ok(ready(Reply::Datasets(self.list_datasets().await?))),
            ClientRequest::CreateDataset { fields, dicts } => {
                self.create_dataset(&name, fields, dicts).await?;
                Ok(ready(Reply::Done))
            }
            ClientRequest::DropDataset => {
                self.drop_dataset(&name).await?;
                Ok(ready(Reply::Done))
            }
            request @ (ClientRequest::Status
            | ClientRequest::ReplaceNode { .. }
            | ClientRequest::MoveShards { .. }
            | ClientRequest::MoveProgress) => self.execute(request, body).await,
            request => {
                if matches!(request, ClientRequest::Info) {
                    // Fields another router added since are in the record (a named dataset's)
                    // or on the nodes (the default one's).
                    self.refresh_fields(&name).await;
                }
                let router = self.router_of(&name).await?;
                let executed = router.execute(request, body).await;
                if executed
                    .as_ref()
                    .is_err_and(|e| e.code() == wire::ErrorCode::NoSuchDataset)
                {
                    // A node has no such dataset: perhaps another router dropped it.
                    if let Ok((record, revision)) = self.load_cluster().await {
                        self.adopt_datasets(&record, revision).await;
                    }
                }
                if router.state().dropped() {
                    return Err(self.no_such(&name));
                }
                executed
            }
        }
    }

    /// The router of dataset `name`: the record is read again if this router does not know
    /// it (another router may have made it a moment ago).
    pub(super) async fn router_of(self: &Arc<Self>, name: &str) -> Result<Arc<Router>, Failure> {
        if name == DEFAULT_DATASET {
            return Ok(Arc::clone(self));
        }
        if let Some(router) = self.named_router(name) {
            return Ok(router);
        }
        let (record, revision) = self.load_cluster().await?;
        self.adopt_datasets(&record, revision).await;
        self.named_router(name).ok_or_else(|| self.no_such(name))
    }

    /// Takes the fields of dataset `name` afresh: from the cluster record, or for the
    /// default dataset from a node.
    async fn refresh_fields(self: &Arc<Self>, name: &str) {
        if name != DEFAULT_DATASET {
            if let Ok((record, revision)) = self.load_cluster().await {
                self.adopt_datasets(&record, revision).await;
            }
            return;
        }
        let placed = (0..self.nodes().shards())
            .find(|&s| !self.cluster.placement.load().slots(s).is_empty());
        let Some(shard) = placed else { return };
        if let Ok((
            _,
            crate::nodes::NodeReply {
                reply: Reply::Info { fields, .. },
                ..
            },
        )) = self.nodes().read(None, shard, &NodeRequest::Info).await
        {
            self.state().node_fields(fields);
        }
    }

    fn no_such(&self, name: &str) -> Failure {
        Failure::NoSuchDataset {
            name: name.to_string(),
        }
    }

    pub(super) fn named_router(&self, name: &str) -> Option<Arc<Router>> {
        self.cluster
            .named
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// The routers of the named datasets, by name.
    pub(super) fn named_routers(&self) -> Vec<Arc<Router>> {
        self.cluster
            .named
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// This router (the default dataset's) and those of the named datasets: every dataset,
    /// the default one first.
    pub(super) fn all_routers(self: &Arc<Self>) -> Vec<Arc<Router>> {
        debug_assert!(
            self.dataset.is_none(),
            "walked from the default dataset's router"
        );
        let mut all = vec![Arc::clone(self)];
        all.extend(self.named_routers());
        all
    }

    /// Opens the routers of `record`'s named datasets (at start).
    pub(super) async fn open_datasets(
        self: &Arc<Self>,
        record: &ClusterRecord,
    ) -> Result<(), crate::Error> {
        self.adopt_datasets(record, 0).await;
        Ok(())
    }

    /// Makes the named routers `record`'s: routers for datasets made since are opened,
    /// those of datasets dropped since are closed (their requests find no dataset), and
    /// fields added since are taken. A record older (`revision`) than one adopted before is
    /// ignored: it would bring back a dataset dropped since.
    pub(super) async fn adopt_datasets(self: &Arc<Self>, record: &ClusterRecord, revision: u64) {
        let _one = self.cluster.adopting.lock().await;
        let follow = self.coordinator().follow_record(record, revision);
        for step in follow {
            match step {
                Follow::Dropped { name, id } => {
                    let mut named = self
                        .cluster
                        .named
                        .write()
                        .unwrap_or_else(|e| e.into_inner());
                    if let Some(gone) = named.get(&name).filter(|r| r.dataset_id == id) {
                        gone.committed_watch.send_modify(|_| {}); // its waiters fail now
                        named.remove(&name);
                        tracing::info!("dataset '{name}' was dropped");
                    }
                }
                Follow::Open(dataset) => {
                    let router = self.open_named(dataset).await;
                    self.cluster
                        .named
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(dataset.name.clone())
                        .or_insert(router);
                }
            }
        }
    }

    /// A router for named dataset `dataset`, sharing this one's links, metadata store and
    /// reply budget; its committed length read from the metadata store and its length from
    /// the nodes (the committed one while they cannot say).
    async fn open_named(self: &Arc<Self>, dataset: &DatasetRecord) -> Arc<Router> {
        let key = self.coordinator().open(
            Some((&dataset.name, dataset.id)),
            self.nodes().shards() as usize,
            wire_fields(&dataset.fields),
        );
        let router = Arc::new(Router {
            cluster: Arc::clone(&self.cluster),
            dataset: Some(Arc::from(dataset.name.as_str())),
            dataset_id: dataset.id,
            key,
            writes: Default::default(),
            writer_key: zr_meta::writer::key(Some(&dataset.name)),
            committed_watch: tokio::sync::watch::Sender::new(()),
            watching_commits: Default::default(),
        });
        if let Err(e) = router.reload_committed().await {
            tracing::warn!("dataset '{}': {e}", dataset.name);
        }
        if let Err(e) = router.refresh_len().await {
            tracing::debug!("dataset '{}': its length: {e}", dataset.name);
            let mut state = router.state();
            let committed = state.lengths.committed();
            state.lengths.set_len(committed);
        }
        router
    }

    /// A named dataset's committed length from the metadata store (0 if none is recorded
    /// for this dataset: a record of an earlier one of the same name counts for nothing),
    /// and the record's revision.
    pub(super) async fn load_named_committed(
        &self,
    ) -> Result<(CommittedRecord, Option<zr_meta::Revision>), Failure> {
        let name = self.dataset_name();
        let read = cluster::load_committed(&*self.cluster.meta, name)
            .await
            .map_err(metadata)?;
        let nothing = CommittedRecord {
            id: self.dataset_id,
            committed_len: 0,
            commits: 0,
        };
        Ok(match read {
            Some((record, revision)) if record.id == self.dataset_id => (record, Some(revision)),
            Some((_, revision)) => (nothing, Some(revision)),
            None => (nothing, None),
        })
    }

    /// `zr dataset create`: records dataset `name` with `fields` in the cluster record, then
    /// creates it on every node (one that is down gets it when it is back).
    async fn create_dataset(
        self: &Arc<Self>,
        name: &str,
        mut fields: Vec<FieldInfo>,
        dicts: Vec<FieldDict>,
    ) -> Result<(), Failure> {
        if name == DEFAULT_DATASET {
            return Err(Failure::Conflict(
                "dataset 'default' exists already: every cluster has it".into(),
            ));
        }
        if fields.is_empty() {
            return Err(Failure::BadRequest(format!(
                "dataset '{name}' needs at least one field"
            )));
        }
        for (k, field) in fields.iter().enumerate() {
            check_field(field)?;
            if fields[..k].iter().any(|f| f.name == field.name) {
                return Err(Failure::BadRequest(format!(
                    "field '{}' is named twice",
                    field.name
                )));
            }
        }
        check_dicts(&mut fields, &dicts)?;
        // The bytes first: the record never names a dictionary the store lacks.
        for dict in &dicts {
            if let Some(at) = dict_ref(&dict.bytes) {
                cluster::store_dict(&*self.cluster.meta, at, &dict.bytes)
                    .await
                    .map_err(metadata)?;
            }
        }
        let id = loop {
            let (record, revision) = self.load_cluster().await?;
            if record.moving.is_some() {
                return Err(Failure::Conflict(
                    "a shard move is under way: create the dataset once it is done".into(),
                ));
            }
            if record.dataset(name).is_some() {
                return Err(Failure::Conflict(format!(
                    "dataset '{name}' exists already"
                )));
            }
            let mut next = record.clone();
            next.dataset_ids += 1;
            let id = next.dataset_ids;
            next.datasets.push(DatasetRecord {
                name: name.to_string(),
                id,
                fields: record_fields(&fields),
            });
            match cluster::store(&*self.cluster.meta, Some(revision), &next).await {
                Ok(_) => break id,
                Err(zr_meta::Error::Conflict { .. }) => continue,
                Err(e) => return Err(metadata(e)),
            }
        };
        let request = NodeRequest::CreateDataset { id, fields, dicts };
        self.on_every_node(Some(name), &request, "create").await;
        let (record, revision) = self.load_cluster().await?;
        self.adopt_datasets(&record, revision).await;
        tracing::info!("created dataset '{name}' (id {id})");
        Ok(())
    }

    /// `zr dataset drop`: removes dataset `name` from the cluster record, then from every
    /// node (one that is down loses it when it is back). Refused during a move, and while a
    /// replica catches up.
    async fn drop_dataset(self: &Arc<Self>, name: &str) -> Result<(), Failure> {
        if name == DEFAULT_DATASET {
            return Err(Failure::BadRequest(
                "the default dataset cannot be dropped".into(),
            ));
        }
        let router = self.router_of(name).await?;
        // Writes in flight finish first; later ones find no dataset.
        let _writes = router.writes.lock().await;
        if let Some(node) = self.nodes().all().find(|&n| !self.nodes().in_sync(n)) {
            return Err(Failure::Conflict(format!(
                "shard {} replica {} is behind and being caught up: drop the dataset once it is in sync",
                self.nodes().shard(node),
                self.nodes().replica(node)
            )));
        }
        let id = loop {
            let (record, revision) = self.load_cluster().await?;
            if record.moving.is_some() {
                return Err(Failure::Conflict(
                    "a shard move is under way: drop the dataset once it is done".into(),
                ));
            }
            let Some(dataset) = record.dataset(name) else {
                return Err(self.no_such(name));
            };
            let id = dataset.id;
            let mut next = record.clone();
            next.datasets.retain(|d| d.name != name);
            next.dataset_ids += 1;
            match cluster::store(&*self.cluster.meta, Some(revision), &next).await {
                Ok(stored) => {
                    self.coordinator().wrote(stored);
                    break id;
                }
                Err(zr_meta::Error::Conflict { .. }) => continue,
                Err(e) => return Err(metadata(e)),
            }
        };
        router.state().drop_it();
        router.committed_watch.send_modify(|_| {}); // its waiters fail now
        self.cluster
            .named
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        router.release_lease(true).await;
        self.on_every_node(Some(name), &NodeRequest::DropDataset { id }, "drop")
            .await;
        tracing::info!("dropped dataset '{name}' (id {id})");
        Ok(())
    }

    /// `zr dataset list`: every dataset, with its length, committed length, fields and the
    /// bytes its chunks hold on the nodes that answered.
    async fn list_datasets(self: &Arc<Self>) -> Result<Vec<DatasetInfo>, Failure> {
        let (record, revision) = self.load_cluster().await?;
        self.adopt_datasets(&record, revision).await;
        let mut bytes = std::collections::HashMap::<(String, u64), u64>::new();
        for (_, answer) in self.ask_nodes_up(None, &NodeRequest::Datasets).await {
            if let Ok(crate::nodes::NodeReply {
                reply: Reply::Datasets(held),
                ..
            }) = answer
            {
                for dataset in held {
                    *bytes.entry((dataset.name, dataset.id)).or_default() += dataset.bytes;
                }
            }
        }
        let mut out = Vec::new();
        for router in self.all_routers() {
            let commits = if router.dataset.is_some() {
                match router.load_named_committed().await {
                    Ok((committed, _)) => {
                        router.set_committed(committed.committed_len);
                        Some(committed.commits)
                    }
                    Err(_) => None,
                }
            } else {
                self.set_committed(record.committed_len);
                Some(record.commits)
            };
            let len = match router.refresh_len().await {
                Ok(len) => len,
                Err(_) => router.len(),
            };
            let name = router.dataset_name().to_string();
            out.push(DatasetInfo {
                bytes: bytes
                    .get(&(name.clone(), router.dataset_id))
                    .copied()
                    .unwrap_or(0),
                name,
                id: router.dataset_id,
                fields: router.fields(),
                len,
                committed: Some(router.state().lengths.committed()),
                commits,
            });
        }
        Ok(out)
    }

    /// Runs `work` holding every dataset's write lock and lease (`all`, in their order: the
    /// default dataset first, then the named ones by name), each repaired as a write starts.
    pub(super) fn exclusive_all<'a, T: Send + 'a>(
        all: &'a [Arc<Router>],
        work: impl FnOnce() -> BoxFuture<'a, Result<T, Failure>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, Failure>> {
        Box::pin(async move {
            match all.split_first() {
                None => work().await,
                Some((first, rest)) => first.exclusive(|| Router::exclusive_all(rest, work)).await,
            }
        })
    }

    /// [`Self::exclusive_all`] without the repair, and giving the leases back after.
    pub(super) fn leased_all<'a, T: Send + 'a>(
        all: &'a [Arc<Router>],
        work: impl FnOnce() -> BoxFuture<'a, Result<T, Failure>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, Failure>> {
        Box::pin(async move {
            let Some((first, rest)) = all.split_first() else {
                return work().await;
            };
            let _writes = first.writes.lock().await;
            let result = match first.acquire_lease().await {
                Ok(_) => Router::leased_all(rest, work).await,
                Err(e) => Err(e),
            };
            // The next write settles whatever the lease says is pending.
            first.release_lease(false).await;
            result
        })
    }
}
