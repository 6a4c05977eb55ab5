//! `zr cluster restore-record`: a cluster record lost from the metadata store (its key
//! deleted, the embedded store's file removed) rebuilt from what the nodes keep — the cluster
//! id and map version in each data directory's identity, and each node's length — instead
//! of a new record whose new id every node would refuse.

use std::sync::Arc;

use zr_meta::cluster::{self, ClusterRecord, MapRecord};
use zr_net::config::ClusterConfig;
use zr_net::Security;
use zr_proto::wire::{NodeRequest, Reply};

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
) -> Result<ClusterRecord, Error> {
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
    let nodes = Nodes::new(config, security, Arc::clone(&meta))?;
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
    let placement =
        crate::server::placement_of(&map, config.cluster.shards).map_err(Failure::Metadata)?;
    let record = ClusterRecord {
        id,
        committed_len: placement.consistent_len(&lens),
        map,
        moving: None,
        added: Vec::new(),
        datasets: Vec::new(),
        dataset_ids: 0,
    };
    cluster::store(&*meta, None, &record).await?;
    Ok(record)
}
