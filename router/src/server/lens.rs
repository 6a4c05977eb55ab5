//! The dataset's length: what the nodes hold, what is committed (recorded in the metadata
//! store), and the shards whose nodes hold less than their share.

use super::*;
use zr_coord::lengths::{self, Commit, ShardLens};

/// Where a dataset's committed length is recorded, as read: in the cluster record (the
/// default dataset) or under the dataset's own key.
enum CommittedAt {
    Cluster(Box<ClusterRecord>, zr_meta::Revision),
    Named(cluster::CommittedRecord, Option<zr_meta::Revision>),
}

impl CommittedAt {
    fn committed_len(&self) -> u64 {
        match self {
            CommittedAt::Cluster(record, _) => record.committed_len,
            CommittedAt::Named(record, _) => record.committed_len,
        }
    }
}

impl Router {
    /// Marks the shards whose nodes hold fewer records (`lens`) than the committed length
    /// gives them, and clears the others; true if any is marked.
    pub(super) fn note_missing(&self, lens: &[u64]) -> bool {
        let placement = self.cluster.placement.load();
        self.state().lengths.note_missing(&placement, lens)
    }

    /// Serves the length the nodes' `lens` give: a shard missing data counts as holding its
    /// share of the committed length (its records are refused at gather time, not made out
    /// of range).
    pub(super) fn serve_len_of(&self, lens: &[u64]) {
        let placement = self.cluster.placement.load();
        self.state().lengths.serve(&placement, lens);
    }

    /// The refusal of the first shard missing data, if any.
    pub(super) fn missing_failure(&self) -> Option<Failure> {
        let (shard, holds) = self.state().lengths.missing()?;
        Some(self.missing_data(shard, holds))
    }

    pub(super) fn missing_data(&self, shard: u32, holds: u64) -> Failure {
        let committed = self
            .state()
            .lengths
            .share(&self.cluster.placement.load(), shard);
        Failure::MissingData {
            shard,
            addr: self.nodes().addr(self.nodes().id(shard, 0)),
            holds,
            committed,
            cluster: self.cluster.cluster_id.clone(),
        }
    }

    /// Re-reads the committed length from the metadata store (another router may have
    /// committed since).
    pub(crate) async fn reload_committed(&self) -> Result<u64, Failure> {
        let len = self.load_committed_at().await?.committed_len();
        self.set_committed(len);
        Ok(len)
    }

    /// Records `len` as the committed length in the metadata store. The caller holds the
    /// write lease. Only a delete (`lowering`) may record less than is recorded: otherwise
    /// the nodes hold less than was committed, and the commit is refused.
    pub(crate) async fn record_committed(&self, len: u64, lowering: bool) -> Result<(), Failure> {
        // Records rewritten since the last commit make this one count as a change even if
        // the length stayed; a change this commit fails to record is kept for the next.
        let rewritten = self.state().lengths.take_rewritten();
        let recorded = self.store_committed(len, lowering, rewritten).await;
        if recorded.is_err() {
            self.state().lengths.commit_failed(rewritten);
        }
        recorded
    }

    /// [`Router::record_committed`]'s compare-and-swap, tried again while other routers
    /// change the record under it.
    async fn store_committed(
        &self,
        len: u64,
        lowering: bool,
        rewritten: bool,
    ) -> Result<(), Failure> {
        for _ in 0..8 {
            let at = self.load_committed_at().await?;
            match Commit::decide(at.committed_len(), len, lowering, rewritten) {
                Commit::Unchanged => {}
                Commit::Refused { recorded } => {
                    self.set_committed(recorded);
                    let whose = match &at {
                        CommittedAt::Cluster(record, _) => format!("cluster {}", record.id),
                        CommittedAt::Named(..) => format!("dataset '{}'", self.dataset_name()),
                    };
                    return Err(Failure::Inconsistent(format!(
                        "{whose} has committed {recorded} records but its shards hold {len}: data is missing; the commit is refused"
                    )));
                }
                Commit::Store => {
                    let meta = &*self.cluster.meta;
                    let stored = match at {
                        CommittedAt::Cluster(mut record, revision) => {
                            record.committed_len = len;
                            record.commits += 1;
                            cluster::store(meta, Some(revision), &record).await
                        }
                        CommittedAt::Named(mut record, revision) => {
                            record.committed_len = len;
                            record.commits += 1;
                            let name = self.dataset_name();
                            cluster::store_committed(meta, name, revision, &record).await
                        }
                    };
                    match stored {
                        Ok(_) => {}
                        Err(zr_meta::Error::Conflict { .. }) => continue,
                        Err(e) => return Err(Failure::from(e)),
                    }
                }
            }
            self.set_committed(len);
            return Ok(());
        }
        Err(Failure::Contended(format!(
            "the committed length of dataset '{}' in {} kept changing; the commit is not recorded",
            self.dataset_name(),
            self.cluster.meta.describe()
        )))
    }

    /// Where this dataset's committed length is recorded, read from the metadata store.
    async fn load_committed_at(&self) -> Result<CommittedAt, Failure> {
        if self.dataset.is_some() {
            let (record, revision) = self.load_named_committed().await?;
            return Ok(CommittedAt::Named(record, revision));
        }
        let (record, revision) = self.load_cluster().await?;
        Ok(CommittedAt::Cluster(Box::new(record), revision))
    }

    /// Shard `shard` is missing data: `Some(refusal)` unless its node holds its share of the
    /// committed length again (its directory was restored), which clears the mark.
    pub(super) async fn still_missing(&self, shard: u32) -> Option<Failure> {
        let holds = self.state().lengths.missing_on(shard)?;
        let holds = match self
            .nodes()
            .read(self.on(), shard, &NodeRequest::Info)
            .await
        {
            Ok((
                _,
                crate::nodes::NodeReply {
                    reply: Reply::Info { len, .. },
                    ..
                },
            )) => {
                let placement = self.cluster.placement.load();
                self.state().lengths.holds_now(&placement, shard, len)?
            }
            _ => holds,
        };
        Some(self.missing_data(shard, holds))
    }

    /// Every node's length and fields, or why it did not say, asked concurrently, in node
    /// order; with `fence`, each node is fenced with that lease token first (see
    /// `NodeRequest::Fence`).
    pub(super) async fn each_node_info(
        &self,
        fence: Option<u64>,
    ) -> Vec<Result<(u64, Vec<FieldInfo>), Failure>> {
        self.each_node_info_within(fence, self.cluster.timeout)
            .await
    }

    /// [`Self::each_node_info`], each node given `timeout` to answer. With replicas, one
    /// known down is not waited for.
    pub(super) async fn each_node_info_within(
        &self,
        fence: Option<u64>,
        timeout: Duration,
    ) -> Vec<Result<(u64, Vec<FieldInfo>), Failure>> {
        let request = match fence {
            Some(token) => NodeRequest::Fence { token },
            None => NodeRequest::Info,
        };
        let calls = self.nodes().all().map(|node| {
            let request = &request;
            async move {
                if self.nodes().replicas() > 1 && self.nodes().is_down(node) {
                    return Err(self.nodes().unavailable(node, "down".into()));
                }
                self.nodes()
                    .call_within(self.on(), node, request, Vec::new(), timeout)
                    .await
            }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
            .map(|(node, result)| match result?.reply {
                Reply::Info { len, fields, .. } => Ok((len, fields)),
                other => Err(self
                    .nodes()
                    .unavailable(node, format!("answered Info with {other:?}"))),
            })
            .collect()
    }

    /// Every shard's length: the most records one of its in-sync replicas holds, and what
    /// each that answered holds; `fence` as for [`Self::each_node_info`] (every node is
    /// fenced). Fails if none of a shard's in-sync replicas answered. With `mark`, an in-sync
    /// replica that did not answer is marked behind (a write is about to go on without it).
    pub(super) async fn shard_lens(
        &self,
        fence: Option<u64>,
        mark: bool,
    ) -> Result<Vec<ShardLens>, Failure> {
        let answers = self
            .each_node_info(fence)
            .await
            .into_iter()
            .map(|answer| Some(answer.map(|(len, _)| len)))
            .collect();
        let placement = self.cluster.placement.load_full();
        let in_sync: Vec<Vec<NodeId>> = (0..self.nodes().shards())
            .map(|shard| self.nodes().in_sync_of(shard))
            .collect();
        let lengths::Answered { shards, behind } = lengths::shard_lens(
            &in_sync,
            answers,
            |shard| placement.slots(shard).is_empty(),
            |shard| Failure::NoReplicaInSync { shard: Some(shard) },
        )?;
        if mark {
            for (node, failure) in behind {
                self.nodes().mark_behind(node, &failure.to_string()).await?;
            }
        }
        Ok(shards)
    }

    /// Every shard's length, in shard order (see [`Self::shard_lens`]).
    pub(super) async fn node_lens(&self, fence: Option<u64>) -> Result<Vec<u64>, Failure> {
        let shards = self.shard_lens(fence, false).await?;
        Ok(shards.into_iter().map(|s| s.len).collect())
    }

    /// Makes every write so far durable on shard `shard`'s in-sync replicas (one that
    /// fails it is marked behind).
    pub(super) async fn commit_shard(&self, shard: u32) -> Result<(), Failure> {
        let targets = self.nodes().in_sync_of(shard);
        let calls = targets.iter().map(|&node| {
            self.nodes()
                .call(self.on(), node, &NodeRequest::Commit, Vec::new())
        });
        let results = futures::future::join_all(calls).await;
        let (_, done) = self.all_or_behind(&targets, results).await?;
        for node in done {
            self.nodes().note_committed(node);
        }
        Ok(())
    }

    /// Re-reads the global length from the nodes (another router may have written): the
    /// longest length every shard agrees with. Repairs nothing — another router's append
    /// may be in flight. Waits for this router's writes in flight, so a length read before
    /// them cannot overwrite theirs.
    pub(super) async fn refresh_len(&self) -> Result<u64, Failure> {
        let _writes = self.writes.lock().await;
        let lens = self.node_lens(None).await?;
        let placement = self.cluster.placement.load();
        Ok(self.state().lengths.nodes_hold(&placement, &lens))
    }

    /// The global length a client asks for: this router's own while it holds the lease it
    /// read the length under (no other router has written since; a write of its own in
    /// flight, a bulk load's, is not waited for), else [`Self::refresh_len`].
    pub(super) async fn current_len(&self) -> Result<u64, Failure> {
        let own = self
            .state()
            .own_len(super::lease::now(), self.cluster.timeout);
        match own {
            Some(len) => Ok(len),
            None => self.refresh_len().await,
        }
    }

    /// The global length as the nodes have it now if `index` is past the cached one (another
    /// router may have appended); the cached one otherwise, or if a node cannot say — unless
    /// it refused as placed by another map (the cluster moved: the caller tries again once
    /// this router has the new map).
    pub(super) async fn len_covering(&self, index: u64) -> Result<u64, Failure> {
        let len = self.len();
        if index < len {
            return Ok(len);
        }
        match self.refresh_len().await {
            Ok(len) => Ok(len),
            Err(e) if e.code() == wire::ErrorCode::StaleMap => Err(e),
            Err(e) => {
                tracing::debug!("cannot refresh the length: {e}");
                Ok(len)
            }
        }
    }
}
