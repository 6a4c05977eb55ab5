//! Moving records to the next cluster map, online: `zr cluster add-shard` and `drain-shard`.
//!
//! ```text
//! 1. record the move        cluster record: moving = {to: next map}            (CAS)
//! 2. copy, writes going on  every node gaining slots builds them beside the ones it serves
//!                           (zr_shard::stage), their records read from the shard holding
//!                           them at the same node addresses — up to the length now
//! 3. switch, writes held    under the write lock and lease: copy the rest, publish the map
//!                           (CAS: map = next, switched_at = length), then every node
//!                           switches (checks each slot's length, serves the slots it
//!                           built, drops the ones it gave); the move is cleared (CAS)
//! ```
//! The slots a shard keeps are not touched: a move writes the records that move, once.
//! Reads and writes use the current map throughout; a node refuses a request placed by
//! another map than its own, so no router ever reads a record from a place that does not
//! hold it: a router that is behind is refused, reloads the map, and its client retries. Each
//! step is kept (the record in the metadata store, the datasets on the nodes), so a move
//! stopped anywhere — router, donor or new node killed — is finished by running the same
//! command again: the copy goes on from where each slot ends, and a published map is
//! switched to by the nodes that have not yet.

use std::sync::Arc;
// The runtime's clock: virtual in a simulated cluster on virtual time, so a seed replays a
// move's pacing too.
use tokio::time::Instant;

use zr_meta::cluster::{self, AddedShard, ClusterRecord, MapChange, MapMove, MapRecord};
use zr_proto::placement::{unit_address, Placement};
use zr_proto::wire::{self, MoveReport, NodeRequest, Reply};

use super::rebuild::{SHIP_POLL, SHIP_STALL};
use super::Router;
use crate::catchup::{ShipStep, ShipWatch};
use crate::error::Failure;
use crate::moveplan::{self, batches_of, changed_shards, gained_slots, switch_slots, Next, Switch};
use crate::nodes::NodeId;
use zr_coord::moving::{recorded, target, MoveStep, Start};

mod copy;

/// Records staged per request.
const STAGE_RECORDS: u64 = 4096;
/// Time a move pauses after each batch, per unit of time the batch took.
const PAUSE_PER_WORK: f64 = 2.0;
/// Stage requests between two that make a node's built slots durable (and the last of each
/// slot's pass).
const STAGES_PER_COMMIT: u64 = 16;

/// The placement `map` gives, with `shards` shards at least (those beyond the map own
/// nothing).
pub(crate) fn placement_of(map: &MapRecord, shards: u32) -> Result<Placement, Failure> {
    let built = map.cluster_map().map_err(Failure::Inconsistent)?;
    Ok(Placement::new(built)
        .map_err(|e| Failure::Inconsistent(e.to_string()))?
        .padded(shards))
}

fn metadata(e: zr_meta::Error) -> Failure {
    Failure::from(e)
}

impl Router {
    /// From now on, moves stop with an error at `step` (`None`: they run to their end).
    /// Fault injection for tests: a stopped move is what a router dying there leaves.
    pub fn stop_moves_at(&self, step: Option<MoveStep>) {
        self.coordinator().moving.stop_at = step;
    }

    fn stop_here(&self, step: MoveStep) -> Result<(), Failure> {
        if self.coordinator().moving.stop_at == Some(step) {
            return Err(Failure::Inconsistent(format!(
                "the move was stopped at step {step:?} (injected)"
            )));
        }
        Ok(())
    }

    /// Runs [`Self::move_shards`] in the background, unless a move runs here already; its
    /// progress and outcome are [`Self::move_progress`].
    /// A move of another change than `change` running on this router is refused, naming
    /// it: one command's result is never reported as another's.
    pub(super) fn start_move(
        self: &Arc<Self>,
        change: wire::MapChange,
        nodes: Vec<(u32, u32, String)>,
        rate: u64,
    ) -> Result<(), Failure> {
        match self.coordinator().moving.start(change, rate) {
            Ok(Start::Run) => {}
            Ok(Start::Joined) => return Ok(()),
            Err(reason) => {
                return Err(Failure::Busy {
                    waited_ms: 0,
                    reason,
                })
            }
        }
        let router = Arc::clone(self);
        self.spawn(async move {
            let outcome = router.move_shards(change, &nodes).await.map_err(|e| {
                tracing::warn!("moving records ({change:?}): {e}");
                e.to_string()
            });
            router.coordinator().moving.ended(change, outcome);
        });
        Ok(())
    }

    /// Moves the cluster to the map with `change`, or finishes the move under way if it is
    /// this change; see the module documentation.
    pub(super) async fn move_shards(
        self: &Arc<Self>,
        change: wire::MapChange,
        listed: &[(u32, u32, String)],
    ) -> Result<MoveReport, Failure> {
        let change = recorded(change);
        let (record, revision) = self.load_cluster().await?;
        // Every dataset moves: this router knows each the record lists (none is made or
        // dropped while a move runs).
        self.adopt_datasets(&record, revision).await;
        // The nodes of a shard added by a move another router began.
        self.grow_from(&record)?;
        if self.behind(record.map.version) {
            self.reload_map().await?;
        }
        let listed_shards = listed
            .iter()
            .map(|(shard, _, _)| *shard + 1)
            .max()
            .unwrap_or_else(|| self.nodes().shards());
        let (from, to) = match moveplan::next(&record, change, listed_shards) {
            Next::Switch => {
                // Published: what is left is switching the nodes that have not.
                return match self.finish_published().await? {
                    Some(report) => Ok(report),
                    // Finished meanwhile by another router.
                    None => Ok(MoveReport {
                        version: record.map.version,
                        records: self.len(),
                        done: true,
                        already: true,
                        ..MoveReport::default()
                    }),
                };
            }
            Next::Copy { from, to } => (from, to),
            Next::Busy(moving) => {
                return Err(Failure::Busy {
                    waited_ms: 0,
                    reason: format!(
                        "a move {} is under way: run that command again to finish it",
                        target(&moving)
                    ),
                })
            }
            Next::Done => {
                return Ok(MoveReport {
                    version: record.map.version,
                    records: self.len(),
                    done: true,
                    already: true,
                    ..MoveReport::default()
                });
            }
            Next::Record { to } => {
                let mut added = None;
                if change == MapChange::AddShard {
                    let shard = to.total_shards() - 1;
                    let addrs = self.new_shard_nodes(shard, listed).await?;
                    added = Some(AddedShard {
                        shard,
                        addrs: addrs.iter().map(ToString::to_string).collect(),
                    });
                    // Each new node must answer, empty, as the node it is listed as, before
                    // this router links to it: a refused add leaves no link behind.
                    for (replica, &addr) in addrs.iter().enumerate() {
                        let refused = |reason: String| Failure::ShardUnavailable {
                            shard,
                            addr,
                            reason,
                        };
                        match self.nodes().probe(addr, shard, replica as u32).await {
                            Ok(0) => {}
                            Ok(len) => {
                                return Err(refused(format!(
                                    "it holds {len} records, and a new shard's nodes start empty"
                                )))
                            }
                            Err(failure) => return Err(failure),
                        }
                    }
                    self.nodes()
                        .grow(shard, &addrs)
                        .map_err(|e| Failure::BadRequest(e.to_string()))?;
                }
                placement_of(&to, self.nodes().shards())
                    .map_err(|e| Failure::BadRequest(e.to_string()))?;
                let moving = moveplan::recording(&record, to.clone(), added);
                cluster::store(&*self.cluster.meta, Some(revision), &moving)
                    .await
                    .map_err(metadata)?;
                tracing::info!("move to map version {} ({change}) recorded", to.version);
                (record.map.clone(), to)
            }
        };
        let shards = self.nodes().shards();
        let old = placement_of(&from, shards)?;
        let new = placement_of(&to, shards)?;
        if let Some(node) = self.nodes().all().find(|&n| !self.nodes().in_sync(n)) {
            return Err(Failure::Busy {
                waited_ms: 0,
                reason: format!(
                    "shard {} replica {} is behind: a move copies from and to in-sync replicas only; run the command again once it has caught up",
                    self.nodes().shard(node),
                    self.nodes().replica(node)
                ),
            });
        }
        let staged = changed_shards(&old, &new);
        let started = Instant::now();
        let all = self.all_routers();
        // The nodes of a new shard hold every named dataset, empty, before it is built.
        for router in all.iter().filter(|r| r.dataset.is_some()) {
            router.create_on(&record, &staged).await?;
        }
        // Copy up to the lengths now while writes go on, then the rest with every dataset's
        // writes held.
        let lens: Vec<u64> = all.iter().map(|r| r.len()).collect();
        self.set_moving(to.version, (&old, &new), &staged, &lens);
        self.stop_here(MoveStep::Recorded)?;
        let mut moved = 0;
        for (router, &len) in all.iter().zip(&lens) {
            moved += router
                .copy_shards(self, &staged, &old, &new, to.version, len)
                .await?;
        }
        self.stop_here(MoveStep::Copied)?;
        let report = Router::exclusive_all(&all, || {
            Box::pin(async {
                let mut len = 0;
                let mut switched_lens = std::collections::BTreeMap::new();
                for router in &all {
                    let at = router.len();
                    moved += router
                        .copy_shards(self, &staged, &old, &new, to.version, at)
                        .await?;
                    match &router.dataset {
                        Some(name) => {
                            switched_lens.insert(name.to_string(), at);
                        }
                        None => len = at,
                    }
                }
                // Publish: from here on the new map is the cluster's.
                let (record, revision) = self.load_cluster().await?;
                let published = moveplan::publishing(&record, to.clone(), len, switched_lens);
                let revision = cluster::store(&*self.cluster.meta, Some(revision), &published)
                    .await
                    .map_err(metadata)?;
                tracing::info!(
                    "map version {} published at {len} records; switching the nodes",
                    to.version
                );
                let mut report = self.finish_switch(published, revision).await?;
                report.moved = moved;
                Ok(report)
            })
        })
        .await?;
        tracing::info!(
            "move to map version {} done in {:.1} s: {} of {} records moved",
            to.version,
            started.elapsed().as_secs_f64(),
            report.moved,
            report.records
        );
        metrics::counter!("zr_router_records_moved_total").increment(report.moved);
        Ok(report)
    }

    /// Where the nodes of new shard `shard` are: this router's links if its nodes.toml lists
    /// them, else the operator's nodes.toml (`listed`); each must answer, holding no records,
    /// at an address no other node has.
    async fn new_shard_nodes(
        &self,
        shard: u32,
        listed: &[(u32, u32, String)],
    ) -> Result<Vec<std::net::SocketAddr>, Failure> {
        let replicas = self.nodes().replicas();
        let addrs: Vec<std::net::SocketAddr> = if shard < self.nodes().shards() {
            self.nodes()
                .of_shard(shard)
                .map(|n| self.nodes().addr(n))
                .collect()
        } else {
            (0..replicas)
                .map(|replica| {
                    let entry = listed
                        .iter()
                        .find(|(s, r, _)| (*s, *r) == (shard, replica))
                        .ok_or_else(|| {
                            Failure::BadRequest(format!(
                                "the new shard is shard {shard}, and neither this router's nodes.toml nor the one given lists its replica {replica}: add its [[shard]] entries (id = {shard}) to nodes.toml, start its nodes, and pass that nodes.toml (--nodes)"
                            ))
                        })?;
                    entry.2.parse().map_err(|e| {
                        Failure::BadRequest(format!(
                            "shard {shard} replica {replica}'s address '{}' is no address: {e}",
                            entry.2
                        ))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        for (replica, addr) in addrs.iter().enumerate() {
            if let Some(other) = self
                .nodes()
                .all()
                .find(|&n| self.nodes().shard(n) != shard && self.nodes().addr(n) == *addr)
            {
                return Err(Failure::BadRequest(format!(
                    "shard {shard} replica {replica}'s address {addr} is shard {} replica {}'s",
                    self.nodes().shard(other),
                    self.nodes().replica(other)
                )));
            }
        }
        Ok(addrs)
    }

    /// Adds links to the shards `record` says were added, that this router does not know.
    pub(super) fn grow_from(self: &Router, record: &ClusterRecord) -> Result<(), Failure> {
        let mut added = record.added.clone();
        added.sort_by_key(|a| a.shard);
        for shard in added.iter().filter(|a| a.shard >= self.nodes().shards()) {
            let addrs = shard
                .addrs
                .iter()
                .map(|a| {
                    a.parse().map_err(|e| {
                        Failure::Inconsistent(format!(
                            "shard {}'s recorded address '{a}': {e}",
                            shard.shard
                        ))
                    })
                })
                .collect::<Result<Vec<std::net::SocketAddr>, Failure>>()?;
            self.nodes().grow(shard.shard, &addrs)?;
        }
        Ok(())
    }

    /// Refuses a `what` (a modify or delete: a change of records already copied) while a
    /// move is under way; appends go on.
    pub(super) async fn refuse_while_moving(&self, what: &str) -> Result<(), Failure> {
        match self.load_cluster().await?.0.moving {
            Some(moving) => Err(Failure::Busy {
                waited_ms: 0,
                reason: format!(
                    "records are moving {}: a {what} waits until the move is done",
                    target(&moving)
                ),
            }),
            None => Ok(()),
        }
    }

    /// Switches the nodes that have not to the map `record` has published, and clears the
    /// move. Under every dataset's write lock and lease, without the repair a write starts
    /// with: it
    /// reads the nodes by the published map, which those not switched yet refuse.
    /// `None` if there is none to finish (another router finished it meanwhile).
    async fn finish_published(self: &Arc<Self>) -> Result<Option<MoveReport>, Failure> {
        let all = self.all_routers();
        Router::leased_all(&all, || {
            Box::pin(async {
                // Read under the leases: whoever held them before may have finished.
                let (record, revision) = self.load_cluster().await?;
                if record
                    .moving
                    .as_ref()
                    .is_some_and(|m| m.switched_at.is_some())
                {
                    self.finish_switch(record, revision).await.map(Some)
                } else {
                    Ok(None)
                }
            })
        })
        .await
    }

    /// Finishes a move whose map is published but whose nodes have not all switched (its
    /// router died there), unless a move runs here: the cluster serves every shard again
    /// without waiting for the command to be run again.
    pub(super) async fn finish_stopped_switch(self: &Arc<Self>, record: ClusterRecord) {
        if !self
            .coordinator()
            .moving
            .finishes_stopped_switch(record.moving.as_ref())
        {
            return;
        }
        match self.finish_published().await {
            Ok(None) => {}
            Ok(Some(report)) => tracing::info!(
                "map version {}: the nodes a stopped move left unswitched are switched",
                report.version
            ),
            Err(e) => {
                tracing::warn!("finishing a stopped move's switch: {e} (tried again in a moment)")
            }
        }
    }

    /// The cluster record and its revision.
    pub(super) async fn load_cluster(&self) -> Result<(ClusterRecord, zr_meta::Revision), Failure> {
        cluster::load(&*self.cluster.meta)
            .await
            .map_err(metadata)?
            .ok_or_else(|| {
                Failure::Inconsistent(format!(
                    "metadata store {} holds no cluster record any more",
                    self.cluster.meta.describe()
                ))
            })
    }

    /// Switches every node to the published map of `record` (those switched already say so)
    /// and clears the move. The new map is adopted here first.
    async fn finish_switch(
        self: &Arc<Self>,
        record: ClusterRecord,
        revision: zr_meta::Revision,
    ) -> Result<MoveReport, Failure> {
        let switch = Switch::of(&record).map_err(Failure::Inconsistent)?;
        let (to, len) = (
            &switch.to,
            switch.len_of(None).map_err(Failure::Inconsistent)?,
        );
        let shards = self.nodes().shards();
        let new = placement_of(to, shards)?;
        let old = placement_of(&switch.from, shards)?;
        let staged = changed_shards(&old, &new);
        self.adopt_map(to, new.clone());
        // Each dataset switches with its own lease's token (its nodes' fence) and its own
        // length at the switch.
        let mut switching = Vec::new();
        for router in self.all_routers() {
            let token =
                router
                    .usable_lease()
                    .map(|held| held.token)
                    .ok_or(Failure::LeaseRunningOut {
                        shard: 0,
                        timeout_ms: self.cluster.timeout.as_millis(),
                    })?;
            let len = switch
                .len_of(router.dataset.as_deref())
                .map_err(Failure::Inconsistent)?;
            switching.push((router, token, len));
        }
        self.stop_here(MoveStep::Published)?;
        // The nodes switch side by side: each switch makes the node's new slots durable and
        // drops the old ones, a few syncs each, and a node waits for no other (one still on
        // the old map refuses what the new one places, and the caller asks again).
        let switches = self.nodes().all().map(|node| {
            let (new, staged, switching) = (&new, &staged, &switching);
            async move {
                if node > 0 {
                    // Injected: the first node switched, the others not.
                    self.stop_here(MoveStep::SwitchedOne)?;
                }
                let shard = self.nodes().shard(node);
                for (router, token, len) in switching {
                    // None: the shard holds nothing before and after (drained, or not added
                    // yet), and takes the map with its next request.
                    let Some(slots) = switch_slots(new, staged, shard, *len) else {
                        return Ok(());
                    };
                    let request = NodeRequest::Switch {
                        version: to.version,
                        slots,
                        token: *token,
                    };
                    self.nodes().call(router.on(), node, &request, Vec::new()).await.map_err(|e| {
                        Failure::Inconsistent(format!(
                            "map version {} is published, but shard {shard} replica {} did not switch dataset '{}' to it: {e}; run the command again to finish",
                            to.version,
                            self.nodes().replica(node),
                            router.dataset_name()
                        ))
                    })?;
                }
                Ok::<(), Failure>(())
            }
        });
        futures::future::join_all(switches)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, Failure>>()?;
        cluster::store(
            &*self.cluster.meta,
            Some(revision),
            &moveplan::cleared(&record),
        )
        .await
        .map_err(metadata)?;
        let mut report = self.move_progress().unwrap_or_default();
        report.version = to.version;
        report.records = len;
        report.done = true;
        Ok(report)
    }

    /// `moving` in words, with its progress if this router runs it.
    pub(super) fn describe_move(&self, moving: &MapMove) -> String {
        self.coordinator().moving.describe(moving)
    }

    /// The move under way here, if any.
    pub(super) fn move_progress(&self) -> Option<MoveReport> {
        self.coordinator().moving.report()
    }

    /// Places every dataset by `map` (with `placement`) from now on, unless it places by
    /// that map already.
    pub(super) fn adopt_map(&self, map: &MapRecord, placement: Placement) {
        if self.cluster.placement.load().version() != map.version {
            self.place_by(map, placement);
        }
    }

    /// Places every dataset by `map` (with `placement`) from now on, whatever it placed by
    /// before (at start: by nodes.toml's map, of no cluster yet).
    pub(super) fn place_by(&self, map: &MapRecord, placement: Placement) {
        let cluster = &self.cluster;
        cluster.placement.store(Arc::new(placement));
        cluster.nodes.set_cluster(&cluster.cluster_id, map.version);
        tracing::info!("placing by map version {}", map.version);
    }

    /// True if the datasets are placed by an older map than `version`.
    fn behind(&self, version: u64) -> bool {
        self.cluster.placement.load().version() < version
    }

    /// Reads the map from the metadata store and adopts it if it is newer than the one this
    /// router places by (another router moved the cluster).
    pub(super) async fn reload_map(&self) -> Result<ClusterRecord, Failure> {
        let (record, _) = self.load_cluster().await?;
        self.grow_from(&record)?;
        if self.behind(record.map.version) {
            let placement = placement_of(&record.map, self.nodes().shards())?;
            if record.map.total_shards() > self.nodes().shards() {
                return Err(Failure::Inconsistent(format!(
                    "the cluster's map has {} shards, and this router's nodes.toml lists {}: add the new shards' nodes to it and restart the router",
                    record.map.total_shards(),
                    self.nodes().shards()
                )));
            }
            // Not amid a write of this router's, to any dataset: a write places its records
            // by one map from start to end (none can be published while this router holds
            // the lease, but one published before may be adopted only now). Locked in the
            // order moves lock them.
            let named = self.named_routers();
            let _writes = self.writes.lock().await;
            let mut _named_writes = Vec::with_capacity(named.len());
            for router in &named {
                _named_writes.push(router.writes.lock().await);
            }
            self.adopt_map(&record.map, placement);
        }
        Ok(record)
    }
}
