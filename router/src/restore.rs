//! `zr cluster restore-record`: a cluster record lost from the metadata store (its key
//! deleted, the embedded store's file removed) rebuilt from what the nodes keep — the cluster
//! id and map version in each data directory's identity, each node's length, and the named
//! datasets each node holds — instead of a new record whose new id every node would refuse.
//!
//! Every named dataset some node holds is listed again, as made at the latest id a node
//! holds it under, with the most fields a node has for it: no data is left unlisted (a
//! dataset dropped while a node was away comes back, to be dropped again). A dataset's
//! committed length is restored beside it where its own record was lost too, and the
//! bytes of every zstd dictionary its fields name where the store lost those too — read from
//! a node that holds the dataset, and checked against the id and CRC32 the field names —
//! since no node could be given the dataset anew without them.

use std::collections::BTreeMap;
use std::sync::Arc;

use zr_meta::cluster::{self, ClusterRecord, CommittedRecord, DatasetRecord, DictRef, MapRecord};
use zr_net::Security;
use zr_proto::wire::{self, DatasetInfo, NodeRequest, Reply};
use zr_service::config::ClusterConfig;

use crate::error::{Error, Failure};
use crate::nodes::Nodes;

/// The map a cluster made from `config` starts with.
pub(crate) fn initial_map(config: &ClusterConfig) -> MapRecord {
    MapRecord {
        version: 1,
        replicas: config.cluster.replicas,
        shards: config.cluster.shards,
        extent_records: config.cluster.extent_records,
        seed: config.cluster.seed,
        changes: Vec::new(),
    }
}

/// Rebuilds the cluster record of the cluster `config` describes from its nodes (each must
/// answer, all naming one cluster and one map version) and stores it where `meta` is, if it
/// holds none. Connects to the nodes as a router (`security`: the router's certificate).
/// Refused, saying why, when a record exists, a node does not answer or names another
/// cluster, or the nodes' map has changed by moves since the cluster was made (the changes
/// are kept only in the record: restore the store from a backup then).
pub async fn restore_record(
    config: &ClusterConfig,
    security: Security,
    meta: Arc<dyn zr_meta::MetaStore>,
) -> Result<Restored, Error> {
    if let Some((record, _)) = cluster::load(&*meta).await? {
        return Err(Failure::BadRequest(format!(
            "{} holds the record of cluster {} already (map version {}, {} records committed): nothing to restore",
            meta.describe(),
            record.id,
            record.map.version,
            record.committed_len
        ))
        .into());
    }
    let nodes = crate::server::links_of(config, security, Arc::clone(&meta), None)?;
    let mut found: Option<(String, u64)> = None;
    let mut lens = vec![u64::MAX; config.cluster.shards as usize];
    for node in nodes.all() {
        let (shard, replica) = (nodes.shard(node), nodes.replica(node));
        let reply = nodes
            .call(None, node, &NodeRequest::Identity, Vec::new())
            .await?;
        let Reply::Identity {
            cluster,
            map_version,
            len,
        } = reply.reply
        else {
            return Err(nodes
                .unavailable(node, format!("answered Identity with {:?}", reply.reply))
                .into());
        };
        let (Some(cluster), Some(version)) = (cluster, map_version) else {
            return Err(Failure::BadRequest(format!(
                "shard {shard} replica {replica} at {} has never served a router: its data tells no cluster (start the routers on a fresh metadata store instead)",
                nodes.addr(node)
            ))
            .into());
        };
        match &found {
            None => found = Some((cluster, version)),
            Some((id, v)) if *id == cluster && *v == version => {}
            Some((id, v)) => {
                return Err(Failure::BadRequest(format!(
                    "shard {shard} replica {replica} at {} holds data of cluster {cluster} at map version {version}, and the nodes before it of cluster {id} at version {v}: they are not one cluster",
                    nodes.addr(node)
                ))
                .into())
            }
        }
        if let Some(slot) = lens.get_mut(shard as usize) {
            *slot = (*slot).min(len);
        }
    }
    let Some((id, version)) = found else {
        return Err(Failure::BadRequest("nodes.toml lists no node".into()).into());
    };
    let map = initial_map(config);
    if version != map.version {
        return Err(Failure::BadRequest(format!(
            "the nodes are at map version {version}: the map changed by moves (add-shard, drain-shard) since the cluster was made, and only the lost record kept those changes; restore the metadata store from a backup"
        ))
        .into());
    }
    let placement = crate::server::placement_of(&map, config.cluster.shards)?;
    let named = named_datasets(&nodes, config.cluster.shards).await?;
    let record = ClusterRecord {
        id,
        committed_len: placement.consistent_len(&lens),
        map,
        moving: None,
        added: Vec::new(),
        dataset_ids: named.iter().map(|(d, _)| d.id).max().unwrap_or(0),
        datasets: named.iter().map(|(d, _)| d.clone()).collect(),
        // The commits counted before are lost with the record: a count from 0 again tells
        // a reader's order proof that nothing can be vouched for across the restore.
        commits: 0,
    };
    let mut committed = BTreeMap::new();
    for (dataset, lens) in &named {
        let rebuilt = CommittedRecord {
            id: dataset.id,
            committed_len: placement.consistent_len(lens),
            commits: 0,
        };
        let len = match cluster::load_committed(&*meta, &dataset.name).await? {
            Some((kept, _)) if kept.id == dataset.id => kept.committed_len,
            kept => {
                let revision = kept.map(|(_, revision)| revision);
                cluster::store_committed(&*meta, &dataset.name, revision, &rebuilt).await?;
                rebuilt.committed_len
            }
        };
        committed.insert(dataset.name.clone(), len);
    }
    let (mut dicts, mut dicts_missing) = (Vec::new(), Vec::new());
    for (dataset, _) in &named {
        for field in &dataset.fields {
            let Some(dict) = field.dict else { continue };
            if cluster::load_dict(&*meta, dict).await?.is_some() {
                continue;
            }
            // One no node holds any more leaves the record restored all the same: only a
            // new node cannot be given that dataset (the router says so, naming the key).
            match node_dict(&nodes, &dataset.name, &field.name, dict).await {
                Ok(bytes) => {
                    cluster::store_dict(&*meta, dict, &bytes).await?;
                    dicts.push((dataset.name.clone(), field.name.clone()));
                }
                Err(e) => dicts_missing.push(e.to_string()),
            }
        }
    }
    cluster::store(&*meta, None, &record).await?;
    Ok(Restored {
        record,
        committed,
        dicts,
        dicts_missing,
    })
}

/// The bytes of dictionary `dict` of field `field` of dataset `dataset`, as the first node
/// holding them keeps them (its file among those of a snapshot of the dataset, as a
/// rebuild from files reads them), checked against `dict`.
async fn node_dict(
    nodes: &Nodes,
    dataset: &str,
    field: &str,
    dict: DictRef,
) -> Result<Vec<u8>, Error> {
    // Where a node keeps it in the dataset's directory (`zr_node::dict`).
    let name = format!("dict/{field}.zdict");
    let mut tried = Vec::new();
    for node in nodes.all() {
        match snapshot_file(nodes, node, dataset, &name).await {
            Ok(Some(bytes))
                if wire::DictRef::of(&bytes)
                    .is_some_and(|d| d.id == dict.id && d.crc == dict.crc) =>
            {
                return Ok(bytes)
            }
            Ok(Some(_)) => tried.push(format!(
                "shard {} replica {} holds other bytes",
                nodes.shard(node),
                nodes.replica(node)
            )),
            Ok(None) => {}
            Err(e) => tried.push(format!(
                "shard {} replica {}: {e}",
                nodes.shard(node),
                nodes.replica(node)
            )),
        }
    }
    Err(Failure::Inconsistent(format!(
        "dataset '{dataset}' field '{field}': no node holds its dictionary {} (CRC32 {:08x}){}: it cannot be made on a new node; restore the metadata store from a backup, or copy the dataset's records into a new one",
        dict.id,
        dict.crc,
        if tried.is_empty() {
            String::new()
        } else {
            format!(" ({})", tried.join("; "))
        }
    ))
    .into())
}

/// File `name` of dataset `dataset` as node `node` keeps it, read whole from a snapshot of
/// the dataset; `None` if the node holds no such dataset or file.
async fn snapshot_file(
    nodes: &Nodes,
    node: crate::nodes::NodeId,
    dataset: &str,
    name: &str,
) -> Result<Option<Vec<u8>>, Failure> {
    let opened = nodes
        .call(
            Some(dataset),
            node,
            &NodeRequest::ShipOpen { slots: Vec::new() },
            Vec::new(),
        )
        .await;
    let (ship, files) = match opened {
        Ok(reply) => match reply.reply {
            Reply::Manifest { ship, files, .. } => (ship, files),
            Reply::Error { .. } => return Ok(None),
            other => {
                return Err(nodes.unavailable(node, format!("answered ship-open with {other:?}")))
            }
        },
        // A node that holds no such dataset refuses.
        Err(Failure::ShardRefused { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let read = async {
        let Some((k, file)) = files.iter().enumerate().find(|(_, f)| f.name == name) else {
            return Ok(None);
        };
        if file.len > wire::DICT_BYTES_MAX as u64 {
            return Err(nodes.unavailable(
                node,
                format!(
                    "its {name} holds {} bytes, more than a dictionary may",
                    file.len
                ),
            ));
        }
        let request = NodeRequest::ShipRead {
            ship,
            file: k as u32,
            offset: 0,
            len: file.len as u32,
        };
        let reply = nodes
            .call(Some(dataset), node, &request, Vec::new())
            .await?;
        // Its bytes are checked whole by the caller, against the CRC32 the field names.
        let Reply::Piece { .. } = reply.reply else {
            return Err(
                nodes.unavailable(node, format!("answered ship-read with {:?}", reply.reply))
            );
        };
        Ok(Some(reply.body()))
    }
    .await;
    let _ = nodes
        .call(
            Some(dataset),
            node,
            &NodeRequest::ShipClose { ship },
            Vec::new(),
        )
        .await;
    read
}

/// What [`restore_record`] stored.
#[derive(Debug)]
pub struct Restored {
    pub record: ClusterRecord,
    /// Each named dataset's committed length (kept, or rebuilt from the nodes).
    pub committed: BTreeMap<String, u64>,
    /// The dictionaries put back, read from the nodes: (dataset, field).
    pub dicts: Vec<(String, String)>,
    /// Why each dictionary the store lost, and no node holds, could not be put back.
    pub dicts_missing: Vec<String>,
}

type Found = (u64, Vec<DatasetInfo>, Vec<(u32, u64)>);

/// The named datasets the nodes hold (see the module documentation), each with the least
/// length any replica of each shard holds of it (0 for a shard none of whose nodes has it).
async fn named_datasets(
    nodes: &Nodes,
    shards: u32,
) -> Result<Vec<(DatasetRecord, Vec<u64>)>, Error> {
    // Per name: the latest id, what each node holding it as that id says of it, and the
    // length each such node holds, by shard.
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    for node in nodes.all() {
        let reply = nodes
            .call(None, node, &NodeRequest::Datasets, Vec::new())
            .await?;
        let Reply::Datasets(held) = reply.reply else {
            return Err(nodes
                .unavailable(node, format!("answered Datasets with {:?}", reply.reply))
                .into());
        };
        for dataset in held
            .into_iter()
            .filter(|d| d.name != zr_proto::wire::DEFAULT_DATASET)
        {
            let shard = nodes.shard(node);
            let entry = found
                .entry(dataset.name.clone())
                .or_insert_with(|| (dataset.id, Vec::new(), Vec::new()));
            if dataset.id > entry.0 {
                *entry = (dataset.id, Vec::new(), Vec::new());
            }
            if dataset.id == entry.0 {
                entry.2.push((shard, dataset.len));
                entry.1.push(dataset);
            }
        }
    }
    Ok(found
        .into_values()
        .filter_map(|(id, held, shard_lens)| {
            let widest = held.into_iter().max_by_key(|d| d.fields.len())?;
            let mut lens = vec![u64::MAX; shards as usize];
            for (shard, len) in shard_lens {
                if let Some(slot) = lens.get_mut(shard as usize) {
                    *slot = (*slot).min(len);
                }
            }
            for slot in &mut lens {
                if *slot == u64::MAX {
                    *slot = 0;
                }
            }
            let record = DatasetRecord {
                name: widest.name,
                id,
                fields: zr_coord::datasets::record_fields(&widest.fields),
            };
            Some((record, lens))
        })
        .collect())
}
