//! The dataset's length: what the nodes hold, what is committed (recorded in the metadata
//! store), and the shards whose nodes hold less than their share.

use super::*;

impl Router {
    /// Marks the shards whose nodes hold fewer records (`lens`) than the committed length
    /// gives them, and clears the others; true if any is marked.
    pub(super) fn note_missing(&self, lens: &[u64]) -> bool {
        let placement = self.cluster.placement.load();
        let committed = self.committed.load(Ordering::SeqCst);
        let mut missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        if missing.len() < lens.len() {
            missing.resize(lens.len(), None);
        }
        for (shard, (&have, slot)) in lens.iter().zip(missing.iter_mut()).enumerate() {
            let share = placement.shard_len(shard as u32, committed);
            *slot = (have < share).then_some(have);
        }
        missing.iter().any(Option::is_some)
    }

    /// The length to serve with `lens`: a shard missing data counts as holding its share of
    /// the committed length (its records are refused at gather time, not made out of range).
    pub(super) fn served_len(&self, lens: &[u64]) -> u64 {
        let placement = self.cluster.placement.load();
        let committed = self.committed.load(Ordering::SeqCst);
        let lens: Vec<u64> = lens
            .iter()
            .enumerate()
            .map(|(shard, &have)| have.max(placement.shard_len(shard as u32, committed)))
            .collect();
        placement.consistent_len(&lens)
    }

    /// The refusal of the first shard missing data, if any.
    pub(super) fn missing_failure(&self) -> Option<Failure> {
        let missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        let (shard, holds) = missing
            .iter()
            .enumerate()
            .find_map(|(shard, m)| m.map(|holds| (shard as u32, holds)))?;
        Some(self.missing_data(shard, holds))
    }

    pub(super) fn missing_data(&self, shard: u32, holds: u64) -> Failure {
        let committed = self.committed.load(Ordering::SeqCst);
        Failure::MissingData {
            shard,
            addr: self.nodes().addr(self.nodes().id(shard, 0)),
            holds,
            committed: self.cluster.placement.load().shard_len(shard, committed),
            cluster: self.cluster.cluster_id.clone(),
        }
    }

    /// Re-reads the committed length from the metadata store (another router may have
    /// committed since).
    pub(crate) async fn reload_committed(&self) -> Result<u64, Failure> {
        if self.dataset.is_some() {
            let (record, _) = self.load_named_committed().await?;
            self.set_committed(record.committed_len);
            return Ok(record.committed_len);
        }
        let (record, _) = self.load_cluster().await?;
        self.set_committed(record.committed_len);
        Ok(record.committed_len)
    }

    /// Records `len` as the committed length in the metadata store. The caller holds the
    /// write lease. Only a delete (`lowering`) may record less than is recorded: otherwise
    /// the nodes hold less than was committed, and the commit is refused.
    pub(crate) async fn record_committed(&self, len: u64, lowering: bool) -> Result<(), Failure> {
        // Records rewritten since the last commit make this one count as a change even if
        // the length stayed; a change this commit fails to record is kept for the next.
        let rewritten = self.rewritten.swap(false, Ordering::SeqCst);
        let recorded = match self.dataset {
            Some(_) => self.record_named_committed(len, lowering, rewritten).await,
            None => {
                self.record_default_committed(len, lowering, rewritten)
                    .await
            }
        };
        if recorded.is_err() && rewritten {
            self.rewritten.store(true, Ordering::SeqCst);
        }
        recorded
    }

    /// [`Router::record_committed`] of the default dataset: in the cluster record.
    pub(super) async fn record_default_committed(
        &self,
        len: u64,
        lowering: bool,
        rewritten: bool,
    ) -> Result<(), Failure> {
        let meta = Failure::from;
        for _ in 0..8 {
            let Some((mut record, revision)) =
                cluster::load(&*self.cluster.meta).await.map_err(meta)?
            else {
                return Err(Failure::Inconsistent(format!(
                    "metadata store {} holds no cluster record any more",
                    self.cluster.meta.describe()
                )));
            };
            if record.committed_len == len && !rewritten {
                self.set_committed(len);
                return Ok(());
            }
            if record.committed_len > len && !lowering {
                self.set_committed(record.committed_len);
                return Err(Failure::Inconsistent(format!(
                    "cluster {} has committed {} records but its shards hold {len}: data is missing; the commit is refused",
                    record.id, record.committed_len
                )));
            }
            record.committed_len = len;
            record.commits += 1;
            match cluster::store(&*self.cluster.meta, Some(revision), &record).await {
                Ok(_) => {
                    self.set_committed(len);
                    return Ok(());
                }
                Err(zr_meta::Error::Conflict { .. }) => continue,
                Err(e) => return Err(meta(e)),
            }
        }
        Err(Failure::Contended(format!(
            "the cluster record in {} kept changing; the commit is not recorded",
            self.cluster.meta.describe()
        )))
    }

    /// Shard `shard` is missing data: `Some(refusal)` unless its node holds its share of the
    /// committed length again (its directory was restored), which clears the mark.
    pub(super) async fn still_missing(&self, shard: u32) -> Option<Failure> {
        let holds = self
            .missing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(shard as usize)
            .copied()
            .flatten()?;
        let share = self
            .cluster
            .placement
            .load()
            .shard_len(shard, self.committed.load(Ordering::SeqCst));
        match self
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
            )) if len >= share => {
                if let Some(slot) = self
                    .missing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(shard as usize)
                {
                    *slot = None;
                }
                None
            }
            Ok((
                _,
                crate::nodes::NodeReply {
                    reply: Reply::Info { len, .. },
                    ..
                },
            )) => Some(self.missing_data(shard, len)),
            _ => Some(self.missing_data(shard, holds)),
        }
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
        let mut answers: Vec<Option<Result<u64, Failure>>> = self
            .each_node_info(fence)
            .await
            .into_iter()
            .map(|answer| Some(answer.map(|(len, _)| len)))
            .collect();
        let mut shards = Vec::with_capacity(self.nodes().shards() as usize);
        let placement = self.cluster.placement.load_full();
        for shard in 0..self.nodes().shards() {
            let mut lens = ShardLens::default();
            let mut failed = Vec::new();
            for node in self.nodes().in_sync_of(shard) {
                match answers.get_mut(node).and_then(Option::take) {
                    Some(Ok(len)) => {
                        lens.len = lens.len.max(len);
                        lens.replicas.push((node, len));
                    }
                    Some(Err(failure)) => failed.push((node, failure)),
                    None => {}
                }
            }
            if placement.slots(shard).is_empty() && lens.replicas.is_empty() {
                // A shard the map places nothing on (drained, or not added yet) holds
                // nothing: its nodes may be gone.
                shards.push(lens);
                continue;
            }
            if lens.replicas.is_empty() {
                return Err(failed.into_iter().next().map_or_else(
                    || Failure::NoReplicaInSync { shard: Some(shard) },
                    |(_, failure)| failure,
                ));
            }
            if mark {
                for (node, failure) in failed {
                    self.nodes().mark_behind(node, &failure.to_string()).await?;
                }
            }
            shards.push(lens);
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
        self.note_missing(&lens);
        let len = self.served_len(&lens);
        self.len.store(len, Ordering::SeqCst);
        Ok(len)
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
