//! One-hop reads: a client gathers straight from the nodes, the router stays the door.
//!
//! At connect a client asks its router for the cluster's topology (`ClientRequest::Topology`:
//! cluster id, map, every node's address and whether it is in sync) and keeps links to the
//! nodes — the router's own [`Nodes`], with heartbeats, replica choice and a down node's
//! calls failed fast — then plans each gather with the router's [`plan_gather`] and reads
//! each part with the router's readers ([`read_parts`]): the same replica order, the same
//! failover midway through a reply. Each shard's message is then decoded where it arrived,
//! straight into the batch, where the router would frame it for its client. Nothing of it
//! is a copy of the router's path.
//!
//! The router stays in charge: writes, commits and admin requests go to it; a gather that
//! waits for commits, a checked one (a damaged copy is repaired by the router) and one that
//! touches a shard the router has missing data for go through it. A node refusing a request
//! as placed by another map (a move switched it), or as not knowing itself in sync (see
//! `zr_meta::nodes::ReadLease`), makes the client take the topology anew and try again
//! within the call; a node set behind serves none of its reads meanwhile. Nodes accept a
//! client's certificate for reads only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use zr_common::Contiguous;
use zr_net::Security;
use zr_proto::assemble::reassemble;
use zr_proto::placement::Placement;
use zr_proto::wire::{self, Topology};

use crate::error::Error;
use crate::forward::{read_parts, Placed};
use crate::nodes::Nodes;
use crate::plan::plan_gather;
use zr_coord::onehop::Described;

/// How long a client goes by the router's description of a dataset before it asks again, by
/// default (one request to the router; its length is asked of the nodes only when a gather
/// needs it): `ClientOptions::topology_every`.
pub(crate) const TOPOLOGY_EVERY: Duration = Duration::from_secs(5);
/// Longest a client waits, at connect, for a node to answer before it reads through the
/// router instead.
const REACH_TIMEOUT: Duration = Duration::from_secs(2);

/// A client's one-hop reads: its links to the nodes and, per dataset, how it is placed.
pub(crate) struct Direct {
    /// One set of links per connection a node gets (see [`connections_per_node`]); gathers
    /// take them in turn.
    sets: Vec<Arc<Nodes>>,
    turn: std::sync::atomic::AtomicUsize,
    /// How long a view is gone by before the router is asked again.
    recent: Duration,
    views: std::sync::Mutex<HashMap<String, Arc<View>>>,
}

/// One dataset as the router last described it.
#[derive(Clone)]
pub(crate) struct View {
    placement: Arc<Placement>,
    /// Its length then: a gather past it asks the router again.
    len: u64,
    /// Shards read through the router (their nodes hold less than their share).
    missing: Vec<u32>,
    /// Which nodes were in sync, in shard × replica order.
    in_sync: Vec<bool>,
    /// When the router gave it, or was last asked for it in vain.
    taken: tokio::time::Instant,
}

impl View {
    /// The dataset's length as the router last gave it.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// What the one-hop retries decide by (`zr_coord::onehop`).
    pub(crate) fn described(&self) -> Described<'_> {
        Described {
            map_version: self.placement.version(),
            in_sync: &self.in_sync,
            len: self.len,
        }
    }
}

/// What a one-hop gather came to.
pub(crate) enum Gathered {
    Columns(Vec<Contiguous>),
    /// Read this one through the router (a shard it has missing data for, or nodes that
    /// cannot say they are in sync).
    ViaRouter(&'static str),
}

impl Direct {
    /// Links to the nodes `topology` lists, for dataset `dataset`, with heartbeats; refused
    /// if none of them answers within a moment (the client then reads through the router).
    pub(crate) async fn connect(
        dataset: &str,
        topology: Topology,
        security: Security,
        timeout: Duration,
        connections: usize,
        recent: Duration,
    ) -> Result<Direct, Error> {
        // Each exchange with a node is bounded as the router bounds its own, so that a node
        // that fails is reported naming its shard, as through the router.
        let node_timeout = Duration::from_millis(topology.timeout_ms.max(1)).min(timeout);
        let nodes = Arc::new(Nodes::for_client(
            &topology,
            security.clone(),
            node_timeout,
        )?);
        // One node answering is enough: the others fail over as a router's do.
        let reach = REACH_TIMEOUT.min(timeout);
        let mut attempts: futures::stream::FuturesUnordered<_> = nodes
            .all()
            .map(|node| {
                let nodes = Arc::clone(&nodes);
                async move { (node, nodes.link(node, reach).await) }
            })
            .collect();
        let mut reached = false;
        let mut last = None;
        while let Some((node, attempt)) = futures::StreamExt::next(&mut attempts).await {
            match attempt {
                Ok(_) => {
                    reached = true;
                    break;
                }
                Err(e) => last = Some(format!("{}: {e}", nodes.addr(node))),
            }
        }
        drop(attempts);
        if !reached {
            return Err(Error::Client(format!(
                "no node answered within {} ms ({})",
                reach.as_millis(),
                last.unwrap_or_else(|| "the cluster has no nodes".into())
            )));
        }
        let mut sets = vec![nodes];
        for _ in 1..connections.max(1) {
            let more = Nodes::for_client(&topology, security.clone(), node_timeout)?;
            sets.push(Arc::new(more));
        }
        for set in &sets {
            set.watch();
        }
        let direct = Direct {
            sets,
            turn: std::sync::atomic::AtomicUsize::new(0),
            recent,
            views: std::sync::Mutex::new(HashMap::new()),
        };
        direct.keep(dataset, &topology)?;
        Ok(direct)
    }

    /// True while `view` is recent enough to go by without asking again: replicas that
    /// caught up meanwhile are read again within `ClientOptions::topology_every`.
    pub(crate) fn is_recent(&self, view: &View) -> bool {
        view.taken.elapsed() < self.recent
    }

    /// Goes on by `view` of dataset `dataset` for another `ClientOptions::topology_every`:
    /// the router could not be asked for a fresher one, and asking again at every gather
    /// would make each wait for the router's timeout.
    pub(crate) fn keep_going_by(&self, dataset: &str, view: &View) -> Arc<View> {
        let view = Arc::new(View {
            taken: tokio::time::Instant::now(),
            ..view.clone()
        });
        self.views
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(dataset.to_string(), Arc::clone(&view));
        view
    }

    /// Dataset `dataset` as last described, if it was.
    pub(crate) fn view(&self, dataset: &str) -> Option<Arc<View>> {
        self.views
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(dataset)
            .cloned()
    }

    /// Takes `topology`, the router's description of dataset `dataset`, as the one reads go
    /// by: the nodes' links follow it (shards added, replicas set behind or moved).
    pub(crate) async fn adopt(
        &self,
        dataset: &str,
        topology: &Topology,
    ) -> Result<Arc<View>, Error> {
        for set in &self.sets {
            set.adopt(topology).await?;
        }
        self.keep(dataset, topology)
    }

    fn keep(&self, dataset: &str, topology: &Topology) -> Result<Arc<View>, Error> {
        let placement = Placement::new(topology.map.clone())?.padded(topology.shards);
        let mut nodes: Vec<_> = topology.nodes.iter().collect();
        nodes.sort_by_key(|n| (n.shard, n.replica));
        let view = Arc::new(View {
            placement: Arc::new(placement),
            len: topology.len,
            missing: topology.missing.clone(),
            in_sync: nodes.iter().map(|n| n.in_sync).collect(),
            taken: tokio::time::Instant::now(),
        });
        self.views
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(dataset.to_string(), Arc::clone(&view));
        Ok(view)
    }

    /// Gathers `indices` of `fields` (`field_count` columns) of dataset `dataset` (`None`:
    /// the default one) as `view` places them, from the nodes. Indices must be below the
    /// view's length.
    pub(crate) async fn gather(
        &self,
        dataset: Option<&str>,
        view: &View,
        indices: &[u64],
        fields: Vec<String>,
        field_count: usize,
    ) -> Result<Gathered, Error> {
        let parts = plan_gather(&view.placement, indices);
        if parts.iter().any(|p| view.missing.contains(&p.shard)) {
            return Ok(Gathered::ViaRouter(
                "a shard's node holds less than its share",
            ));
        }
        if parts.is_empty() {
            let empty = reassemble(0, field_count, &[])
                .map_err(|e| zr_proto::Error::Malformed(e.to_string()))?;
            return Ok(Gathered::Columns(empty));
        }
        let placed = Placed {
            dataset: dataset.map(Arc::from),
            map_version: view.placement.version(),
        };
        // Each shard's records placed into the batch by its reader as they arrive: no
        // frames. A part's failure reads as the router's reply would say it (with its code).
        let columns = read_parts(
            Arc::clone(self.next_set()),
            placed,
            parts,
            indices.len(),
            fields,
        )
        .await
        .map_err(|failure| zr_proto::Error::Remote {
            code: failure.code(),
            message: failure.to_string(),
        })?
        .map_err(|e| zr_proto::Error::Malformed(format!("gather reply: {e}")))?;
        Ok(Gathered::Columns(columns))
    }

    /// How many replicas each shard has.
    pub(crate) fn replicas(&self) -> u32 {
        self.sets[0].replicas()
    }

    /// Closes every link to the nodes; returns their endpoints, to wait on while the closes
    /// go out.
    pub(crate) fn close(&self) -> Vec<quinn::Endpoint> {
        self.sets.iter().flat_map(|set| set.close_all()).collect()
    }
}

impl Direct {
    /// The set of links the next gather goes through.
    fn next_set(&self) -> &Arc<Nodes> {
        let k = self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.sets[k % self.sets.len()]
    }
}

/// Connections a client opens to each node by default: one per four cores beyond the first
/// four, up to four. A QUIC connection is driven by one task, so one node's replies reach a
/// client at what one core decodes; more connections let more cores take part where a
/// client has them (with S shards a gather already spreads over S connections).
pub(crate) fn connections_per_node() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 4).clamp(1, 4)
}

/// The topology reply's contents, or what else the router answered.
pub(crate) fn topology_of(reply: wire::Reply) -> Result<Topology, Error> {
    match reply {
        wire::Reply::Topology(topology) => Ok(topology),
        other => Err(zr_proto::Error::Malformed(format!(
            "the router answered topology with {other:?}"
        ))
        .into()),
    }
}
