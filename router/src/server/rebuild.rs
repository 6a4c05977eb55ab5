//! Catching up a behind replica from an in-sync partner, online: the cluster serves reads and
//! writes meanwhile.
//!
//! Replicas hold the same records at the same local indices, so catching up is a comparison
//! by index: per slice of records (about [`SLICE_BYTES`]), both sides' digests (`NodeRequest::Digest`: per
//! record a CRC of its fields, each read checked), every record that differs is copied over
//! with a `Modify`, the records the replica lacks are appended in one request (the partner's
//! gather reply is already an append's body), and records past the partner's end are cut.
//! A wiped replica is all tail: only its partner is read.
//!
//! Each slice runs under the write lock and lease (a write waits for one slice at most), but
//! writes between slices reach only the in-sync replicas, so a pass leaves the replica
//! nearly caught up, not caught up. After [`ONLINE_PASSES`] such pass, a last pass runs
//! under the lock from start to end (comparing digests, copying only what changed) and marks the replica in sync
//! before any write goes on: then it holds exactly what its partners hold.

use std::sync::Arc;
use std::time::Duration;

// The runtime's clock: virtual in a simulated cluster on virtual time.
use tokio::time::Instant;

use bytes::Bytes;
use zr_proto::wire::{self, NodeRequest, Reply};

use super::Router;
use crate::catchup::{self, Progress, ShipStep, ShipWatch};
use crate::error::Failure;
use crate::nodes::{NodeId, NodeReply};

/// Records compared and copied in the first step; later steps take about [`SLICE_BYTES`].
const SLICE_FIRST: u64 = 1024;
/// Bytes a step copies at most, about (its records are sized from those copied before).
const SLICE_BYTES: u64 = 8 << 20;
/// Fewest and most records a step takes.
const SLICE_MIN: u64 = 256;
const SLICE_MAX: u64 = 1 << 16;
/// Passes with writes going on between slices before the last pass, which holds them off.
const ONLINE_PASSES: u32 = 1;
/// How often the router asks how far a rebuild from files got.
pub(super) const SHIP_POLL: Duration = Duration::from_millis(10);
/// A rebuild from files that receives nothing for this long is given up (and the replica
/// caught up record by record).
pub(super) const SHIP_STALL: Duration = Duration::from_secs(60);
/// How often the router looks for behind replicas to catch up, at the latest (a replica
/// marked behind, or a node back up, starts a look at once).
const LOOK_EVERY: Duration = Duration::from_secs(1);

impl Router {
    /// Starts the task that catches up behind replicas that answer, one at a time; it ends
    /// with the router.
    pub(super) fn start_rebuilds(self: &Arc<Self>) {
        if self.nodes().replicas() < 2 {
            return;
        }
        let router = Arc::downgrade(self);
        self.spawn(async move {
            loop {
                let Some(wake) = router.upgrade().map(|r| r.nodes().catch_up_wanted()) else {
                    return;
                };
                let _ = tokio::time::timeout(LOOK_EVERY, wake.notified()).await;
                let Some(router) = router.upgrade() else {
                    return;
                };
                router.find_short().await;
                router.repair_suspects().await;
                for node in router.nodes().all() {
                    if router.nodes().in_sync(node) || router.nodes().is_down(node) {
                        continue;
                    }
                    if let Err(e) = router.catch_up(node).await {
                        tracing::warn!(
                            "catching up shard {} replica {}: {e} (tried again in a moment)",
                            router.nodes().shard(node),
                            router.nodes().replica(node)
                        );
                    }
                }
            }
        });
    }

    /// Marks behind every in-sync replica whose heartbeats say it holds fewer records than
    /// the committed length gives its shard, of any dataset, while a partner holds them: it
    /// came back empty (a wiped or replaced disk) or lost data, and is caught up rather than
    /// read from. The default dataset's lengths come with the heartbeats; a named one's are
    /// asked for (with one replica there is no partner, and nothing to ask).
    async fn find_short(self: &Arc<Self>) {
        self.find_short_of().await;
        if self.nodes().replicas() > 1 {
            for named in self.named_routers() {
                named.find_short_of().await;
            }
        }
    }

    /// [`Self::find_short`] of this router's dataset.
    async fn find_short_of(&self) {
        let placement = self.cluster.placement.load_full();
        let committed = self.state().lengths.committed();
        for shard in 0..self.nodes().shards() {
            let share = placement.shard_len(shard, committed);
            let mut heard: Vec<(NodeId, Option<u64>)> = Vec::new();
            for node in self.nodes().in_sync_of(shard) {
                let len = match self.dataset {
                    None => self.nodes().heard_len(node),
                    Some(_) if self.nodes().is_down(node) => None,
                    Some(_) => self.node_len(node).await.ok(),
                };
                heard.push((node, len));
            }
            if !heard
                .iter()
                .any(|&(_, len)| len.is_some_and(|l| l >= share))
            {
                continue;
            }
            for (node, len) in heard {
                if len.is_none_or(|l| l >= share) {
                    continue;
                }
                // Heard a moment ago: asked afresh before it is marked.
                let Ok(len) = self.node_len(node).await else {
                    continue;
                };
                if len < share {
                    let why = format!(
                        "it holds {len} of the {share} records of dataset '{}' committed on it",
                        self.dataset_name()
                    );
                    if let Err(e) = self.nodes().mark_behind(node, &why).await {
                        tracing::warn!("{e}");
                    }
                }
            }
        }
    }

    /// Scrubs the records checked reads found damaged (see `Nodes::suspect`), repairing the
    /// bad copies from good ones.
    async fn repair_suspects(self: &Arc<Self>) {
        for (dataset, node, mut indices) in self.nodes().take_suspects() {
            let name = dataset.as_deref().unwrap_or(wire::DEFAULT_DATASET);
            let Ok(router) = self.router_of(name).await else {
                continue; // dropped meanwhile
            };
            let shard = self.nodes().shard(node);
            // Read by node address: scrubbed by local index.
            let placement = router.cluster.placement.load();
            indices = indices
                .iter()
                .filter_map(|&address| placement.local_of(shard, address))
                .collect();
            indices.sort_unstable();
            indices.dedup();
            // Nearby records in one range each.
            let mut ranges: Vec<(u64, u64)> = Vec::new();
            for index in indices {
                match ranges.last_mut() {
                    Some((_, end)) if index <= *end + 64 => *end = index + 1,
                    _ => ranges.push((index, index + 1)),
                }
            }
            for (start, end) in ranges {
                match router.scrub(shard, start, end - start).await {
                    Ok(report) => {
                        let repaired = report.problems.iter().filter(|p| p.repaired).count();
                        tracing::info!(
                            "shard {shard}: records {start}..{end}, read damaged, scrubbed: {repaired} copies repaired"
                        );
                    }
                    Err(e) => tracing::warn!(
                        "shard {shard}: records {start}..{end} were read damaged, and scrubbing them failed: {e}"
                    ),
                }
            }
        }
    }

    /// Catches up behind node `node` from an in-sync partner and marks it in sync (see the
    /// module documentation).
    pub(crate) async fn catch_up(self: &Arc<Self>, node: NodeId) -> Result<(), Failure> {
        let shard = self.nodes().shard(node);
        let replica = self.nodes().replica(node);
        tracing::info!(
            "shard {shard} replica {replica} at {}: catching up",
            self.nodes().addr(node)
        );
        let started = Instant::now();
        // Every dataset: online passes until little is left, then one last pass of all of
        // them with every dataset's writes held off, and the node marked in sync.
        let all = self.all_routers();
        let result = async {
            let mut copied = 0;
            let mut resumes = Vec::with_capacity(all.len());
            for router in &all {
                let shipped = match router.ship(node).await {
                    Ok(shipped) => shipped,
                    Err(e) => {
                        tracing::warn!(
                            "shard {shard} replica {replica}: dataset '{}' is caught up record by record: rebuilding it from a partner's files failed: {e}",
                            router.dataset_name()
                        );
                        None
                    }
                };
                // Both nodes' marks before the online passes read anything: unchanged at the
                // last pass, it need not compare again what they compared.
                let partner = router.partner(shard)?;
                let marks = (router.mark(partner).await?, router.mark(node).await?);
                let from = catchup::online_from(shipped.as_ref(), partner, marks.0);
                if shipped.is_some() {
                    tracing::info!(
                        "shard {shard} replica {replica}: dataset '{}' compared from record {from}{}",
                        router.dataset_name(),
                        match from {
                            0 => " (the partner changed a record since its snapshot)",
                            _ => " (the records copied are the partner's as they are)",
                        }
                    );
                }
                let mut pass = 1;
                let mut end = from;
                while pass <= ONLINE_PASSES {
                    let (step, reached) = router.sync_pass(node, pass, false, from).await?;
                    copied += step;
                    end = reached;
                    // Nothing left to copy: the last pass will be short.
                    pass = if step == 0 {
                        ONLINE_PASSES + 1
                    } else {
                        pass + 1
                    };
                }
                resumes.push(catchup::Resume {
                    partner,
                    partner_mark: marks.0,
                    node_mark: marks.1,
                    end,
                });
            }
            copied += Router::last_passes(&all, node, ONLINE_PASSES + 1, &resumes).await?;
            Ok::<u64, Failure>(copied)
        }
        .await;
        let progress = self.coordinator().catch_ups.remove(&node);
        if result.is_ok() {
            let (copied, bytes) = progress.map_or((0, 0), |p| (p.copied, p.bytes));
            tracing::info!(
                "shard {shard} replica {replica} caught up in {:.1} s: {copied} records copied ({:.1} MiB)",
                started.elapsed().as_secs_f64(),
                bytes as f64 / (1 << 20) as f64
            );
            metrics::counter!("zr_router_records_rebuilt_total").increment(copied);
        }
        result.map(|_| ())
    }

    /// Rebuilds this dataset on behind node `node` from the files of an in-sync partner
    /// (`NodeRequest::ShipFrom`; see `zr_shard::ship`) when it holds less than half of what
    /// the partner holds: a wiped or replaced disk. The passes that follow catch up what was
    /// written since the partner's snapshot, comparing digests as for any behind replica.
    /// Returns what it installed, if it ran.
    async fn ship(&self, node: NodeId) -> Result<Option<catchup::Shipped>, Failure> {
        let shard = self.nodes().shard(node);
        let partner = self.partner(shard)?;
        let (len, partner_len) = (self.node_len(node).await?, self.node_len(partner).await?);
        if !catchup::from_files(len, partner_len) {
            return Ok(None);
        }
        let request = NodeRequest::ShipFrom {
            addr: self.nodes().addr(partner).to_string(),
            replica: self.nodes().replica(partner),
            shard: None,
            slots: Vec::new(),
            // A lost replica is rebuilt as fast as it can be.
            rate: 0,
        };
        let started = Instant::now();
        let mut watch = ShipWatch::new(started.into_std(), SHIP_STALL);
        // Bytes copied for earlier datasets of this catch-up, which stay counted.
        let before = self
            .coordinator()
            .catch_ups
            .get(&node)
            .map_or(0, |p| p.bytes);
        loop {
            let status = self.ship_status(node, &request).await?;
            self.progress(node, partner, started, |progress| {
                progress.files_total = Some(status.total);
                progress.bytes = before + status.bytes;
                if status.done && status.error.is_none() {
                    progress.copied += status.len;
                    progress.files_total = None;
                }
            });
            match watch.observe(&status, Instant::now().into_std()) {
                ShipStep::Wait => tokio::time::sleep(SHIP_POLL).await,
                ShipStep::Failed(why) => return Err(self.nodes().unavailable(node, why)),
                ShipStep::Installed { len } => {
                    tracing::info!(
                        "shard {shard} replica {}: dataset '{}' rebuilt from replica {}'s files in {:.1} s: {len} records ({:.1} MiB)",
                        self.nodes().replica(node),
                        self.dataset_name(),
                        self.nodes().replica(partner),
                        started.elapsed().as_secs_f64(),
                        status.total as f64 / (1 << 20) as f64
                    );
                    if status.mark.is_none() {
                        tracing::info!(
                            "shard {shard} replica {}: dataset '{}': the partner's snapshot was taken with changes to existing records waiting for a commit, so every record copied is compared",
                            self.nodes().replica(node),
                            self.dataset_name()
                        );
                    }
                    return Ok(status
                        .mark
                        .map(|mark| catchup::Shipped { partner, mark, len }));
                }
            }
        }
    }

    /// Updates node `node`'s catch-up progress with `update`, copying from `partner` (begun
    /// at `started` if this is its first news).
    fn progress(
        &self,
        node: NodeId,
        partner: NodeId,
        started: Instant,
        update: impl FnOnce(&mut Progress),
    ) {
        let replica = self.nodes().replica(partner);
        let mut state = self.coordinator();
        let progress = state
            .catch_ups
            .entry(node)
            .or_insert_with(|| Progress::new(started.into_std()));
        progress.partner = replica;
        update(progress);
    }

    /// One pass over the shard from record `from` on: every slice compared and copied, each
    /// under the write lock (`locked`: the caller holds it for the whole pass); returns the
    /// records copied and where the pass ended.
    pub(super) async fn sync_pass(
        &self,
        node: NodeId,
        pass: u32,
        locked: bool,
        from: u64,
    ) -> Result<(u64, u64), Failure> {
        let shard = self.nodes().shard(node);
        let mut from = from;
        let mut copied = 0;
        let mut slice = SLICE_FIRST;
        loop {
            let partner = self.partner(shard)?;
            let step = if locked {
                // Renewed as it runs; lost, it stops (another router's writes may follow).
                if self.acquire_lease().await?.is_some() {
                    return Err(Failure::LeaseLost(
                        "the write lease passed on during the last pass of a catch-up".into(),
                    ));
                }
                self.sync_slice(node, partner, from, slice).await?
            } else {
                self.exclusive(|| self.sync_slice(node, partner, from, slice))
                    .await?
            };
            copied += step.copied;
            if step.copied > 0 && step.bytes > 0 {
                let per_record = (step.bytes / step.copied).max(1);
                slice = (SLICE_BYTES / per_record).clamp(SLICE_MIN, SLICE_MAX);
            } else {
                // Compared only: digests are small, take the most.
                slice = SLICE_MAX.min(slice * 4);
            }
            self.progress(node, partner, Instant::now(), |progress| {
                progress.files_total = None;
                progress.pass = pass;
                progress.last_pass = locked;
                progress.done = step.end;
                progress.total = step.partner_len;
                progress.copied += step.copied;
                progress.bytes += step.bytes;
            });
            if step.end >= step.partner_len {
                return Ok((copied, step.end));
            }
            from = step.end;
        }
    }

    /// Asks node `node` to copy files (`request`: a `ShipFrom`), or how far it got.
    pub(super) async fn ship_status(
        &self,
        node: NodeId,
        request: &NodeRequest,
    ) -> Result<wire::ShipStatus, Failure> {
        let reply = self
            .nodes()
            .call(self.on(), node, request, Vec::new())
            .await?;
        match reply.reply {
            Reply::Shipping(status) => Ok(status),
            other => Err(self
                .nodes()
                .unavailable(node, format!("answered ship-from with {other:?}"))),
        }
    }

    /// An in-sync replica of `shard` to copy from: one not known down.
    pub(super) fn partner(&self, shard: u32) -> Result<NodeId, Failure> {
        self.nodes()
            .read_order(shard)
            .into_iter()
            .find(|&n| !self.nodes().is_down(n))
            .ok_or_else(|| {
                Failure::Inconsistent(format!(
                    "shard {shard} has no in-sync replica up to copy from"
                ))
            })
    }

    /// Makes records `from..from + count` of `node` what they are on `partner` (and cuts
    /// records past the partner's end). The caller holds the write lock and lease.
    async fn sync_slice(
        &self,
        node: NodeId,
        partner: NodeId,
        from: u64,
        count: u64,
    ) -> Result<Slice, Failure> {
        let partner_len = self.node_len(partner).await?;
        let len = self.node_len(node).await?;
        let plan = catchup::plan_slice(from, count, len, partner_len)
            .map_err(|why| self.nodes().unavailable(node, why))?;
        let mut slice = Slice {
            end: plan.end,
            partner_len,
            copied: 0,
            bytes: 0,
        };
        let placement = self.cluster.placement.load();
        let shard = self.nodes().shard(node);
        // Records both hold: copy those that differ.
        if !plan.compare.is_empty() {
            let (start, n) = (plan.compare.start, plan.compare.end - plan.compare.start);
            let (theirs, corrupt) = self.digest(partner, start, n).await?;
            let (ours, _) = self.digest(node, start, n).await?;
            let differ = catchup::differing(plan.compare.clone(), &theirs, &corrupt, &ours)
                .map_err(|bad| {
                    self.nodes().unavailable(
                        partner,
                        format!("its record {bad} fails its check, so it cannot be copied from (zr verify --router repairs it)"),
                    )
                })?;
            if !differ.is_empty() {
                let addresses: Vec<u64> = differ
                    .iter()
                    .map(|&local| placement.address_of(shard, local))
                    .collect();
                let (lengths, body) = self.read_records(partner, addresses.clone()).await?;
                let columns = wire::split_columns(&lengths, &body);
                for (k, &index) in addresses.iter().enumerate() {
                    let request = NodeRequest::Modify {
                        index,
                        token: None, // write_node sets it
                        fields: self.field_names(),
                        lengths: lengths.iter().map(|l| l[k]).collect(),
                    };
                    let payload: Vec<Bytes> = columns
                        .iter()
                        .map(|column| Bytes::copy_from_slice(column[k]))
                        .collect();
                    slice.bytes += payload.iter().map(|p| p.len() as u64).sum::<u64>();
                    self.write_node(node, request, payload).await?;
                }
                slice.copied += differ.len() as u64;
            }
        }
        // Records it lacks: appended in one request.
        if !plan.append.is_empty() {
            let (start, end) = (plan.append.start, plan.append.end);
            let addresses = (start..end)
                .map(|local| placement.address_of(shard, local))
                .collect();
            let read = self.gather_all(partner, addresses).await?;
            let Reply::Gather { lengths } = &read.reply else {
                return Err(self
                    .nodes()
                    .unavailable(partner, format!("answered a gather with {:?}", read.reply)));
            };
            let mut body = zr_proto::chunks::Chunks::new(&read.chunks);
            body.skip(read.body_start);
            let body = body.to_vec();
            slice.bytes += body.len() as u64;
            let request = NodeRequest::Append {
                runs: placement.runs(shard, start, end - start),
                token: None, // write_node sets it
                fields: self.field_names(),
                lengths: lengths.clone(),
            };
            self.write_node(node, request, vec![Bytes::from(body)])
                .await?;
            slice.copied += end - start;
        }
        // Records past the partner's end (it missed a delete).
        if let Some(to) = plan.truncate_to {
            let cut = self.truncate_to(shard, to);
            self.write_node(node, cut, Vec::new()).await?;
        }
        Ok(slice)
    }

    /// Node `node`'s length.
    async fn node_len(&self, node: NodeId) -> Result<u64, Failure> {
        match self
            .nodes()
            .call(self.on(), node, &NodeRequest::Info, Vec::new())
            .await?
            .reply
        {
            Reply::Info { len, .. } => Ok(len),
            other => Err(self
                .nodes()
                .unavailable(node, format!("answered Info with {other:?}"))),
        }
    }

    /// Node `node`'s mark of this dataset (see `wire::DataMark`).
    pub(super) async fn mark(&self, node: NodeId) -> Result<wire::DataMark, Failure> {
        let request = NodeRequest::Digest { runs: Vec::new() };
        match self
            .nodes()
            .call(self.on(), node, &request, Vec::new())
            .await?
            .reply
        {
            Reply::Digest { mark, .. } => Ok(mark),
            other => Err(self.nodes().unavailable(
                node,
                format!("answered a digest of no records with {other:?}"),
            )),
        }
    }

    /// Node `node`'s digest of its records `start..start + count` (shard-local indices):
    /// per record its CRC, and the records that failed their check.
    pub(crate) async fn digest(
        &self,
        node: NodeId,
        start: u64,
        count: u64,
    ) -> Result<(Vec<u32>, Vec<u64>), Failure> {
        let runs = self
            .cluster
            .placement
            .load()
            .runs(self.nodes().shard(node), start, count);
        let request = NodeRequest::Digest { runs };
        match self
            .nodes()
            .call(self.on(), node, &request, Vec::new())
            .await?
            .reply
        {
            Reply::Digest { crcs, corrupt, .. } if crcs.len() as u64 == count => {
                Ok((crcs, corrupt.into_iter().map(|k| start + k).collect()))
            }
            other => Err(self.nodes().unavailable(
                node,
                format!("answered a digest of {count} records from {start} with {other:?}"),
            )),
        }
    }

    /// Records `indices` of node `node`, every field.
    async fn gather_all(&self, node: NodeId, indices: Vec<u64>) -> Result<NodeReply, Failure> {
        // Checked: a copy that fails its check is not copied on.
        let request = NodeRequest::Gather {
            indices,
            fields: Vec::new(),
            checked: true,
        };
        self.nodes()
            .call(self.on(), node, &request, Vec::new())
            .await
    }

    /// Records `indices` of node `node`, every field: per field their lengths, and the body.
    pub(crate) async fn read_records(
        &self,
        node: NodeId,
        indices: Vec<u64>,
    ) -> Result<(Vec<Vec<u32>>, Vec<u8>), Failure> {
        let read = self.gather_all(node, indices).await?;
        match &read.reply {
            Reply::Gather { lengths } => Ok((lengths.clone(), read.body())),
            other => Err(self
                .nodes()
                .unavailable(node, format!("answered a gather with {other:?}"))),
        }
    }
}

/// What one slice did.
struct Slice {
    /// Where the slice ended (the next begins there).
    end: u64,
    partner_len: u64,
    copied: u64,
    bytes: u64,
}
