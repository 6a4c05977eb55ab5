//! Every node brought in step with the cluster record: datasets created or removed where
//! they were missed, fields added (which, `zr_coord::datasets` decides), and commits
//! followed.

use zr_coord::datasets::{self, Change};

use super::*;

impl Router {
    /// Asks every node not known down `request` of dataset `dataset`, at once: each node's
    /// answer.
    pub(crate) async fn ask_nodes_up(
        &self,
        dataset: Option<&str>,
        request: &NodeRequest,
    ) -> Vec<(NodeId, Result<crate::nodes::NodeReply, Failure>)> {
        let nodes = self.nodes();
        let calls = nodes
            .all()
            .filter(|&node| !nodes.is_down(node))
            .map(
                |node| async move { (node, nodes.call(dataset, node, request, Vec::new()).await) },
            );
        futures::future::join_all(calls).await
    }

    /// Sends `request` to every node not known down, at once; a node that fails it is
    /// brought in step by the next sync (`sync_datasets`).
    pub(crate) async fn on_every_node(
        &self,
        dataset: Option<&str>,
        request: &NodeRequest,
        what: &str,
    ) {
        for (node, result) in self.ask_nodes_up(dataset, request).await {
            if let Err(e) = result {
                tracing::warn!(
                    "{what} dataset '{}' on shard {} replica {}: {e} (done when it is back)",
                    dataset.unwrap_or(DEFAULT_DATASET),
                    self.nodes().shard(node),
                    self.nodes().replica(node)
                );
            }
        }
    }

    /// Waits until the dataset has committed `needed` records, `wait_ms` at most; returns
    /// the committed length then. A commit through this router wakes it at once; commits
    /// through others are read from the metadata store every [`WAIT_POLL`] by one task for
    /// all waiters of the dataset ([`Self::watch_commits`]), so a waiter costs a subscription
    /// and a timer, whatever their number.
    pub(crate) async fn wait_committed(
        self: &Arc<Self>,
        needed: u64,
        wait_ms: u32,
    ) -> Result<u64, Failure> {
        let wait_ms = wait_ms.min(wire::WAIT_MS_MAX);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms as u64);
        let mut commits = self.committed_watch.subscribe();
        let mut watched = false;
        loop {
            let committed = self.state().lengths.committed();
            if committed >= needed {
                return Ok(committed);
            }
            if self.state().dropped() {
                return Err(Failure::NoSuchDataset {
                    name: self.dataset_name().to_string(),
                });
            }
            if !watched {
                // Subscribed first: a watcher that sees no subscriber and stops is seen
                // stopped here, and started again.
                self.watch_commits();
                watched = true;
            }
            tokio::select! {
                changed = commits.changed() => {
                    if changed.is_err() {
                        return Err(Failure::Inconsistent("the router is stopping".into()));
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Failure::WaitedOut {
                        dataset: self.dataset_name().to_string(),
                        waited_ms: wait_ms,
                        needed,
                        committed: self.state().lengths.committed(),
                    });
                }
            }
        }
    }

    /// Starts the dataset's commit watcher unless it runs: while anyone waits for commits,
    /// it reads the committed length from the metadata store every [`WAIT_POLL`] (commits
    /// through other routers) and wakes the waiters it lets go on.
    pub(crate) fn watch_commits(self: &Arc<Self>) {
        if self.watching_commits.swap(true, Ordering::SeqCst) {
            return;
        }
        let router = Arc::downgrade(self);
        self.spawn(async move {
            loop {
                tokio::time::sleep(WAIT_POLL).await;
                let Some(router) = router.upgrade() else {
                    return;
                };
                if router.committed_watch.receiver_count() == 0 {
                    router.watching_commits.store(false, Ordering::SeqCst);
                    // A waiter that subscribed meanwhile saw the flag set and started
                    // nobody: it is this task's again.
                    if router.committed_watch.receiver_count() == 0
                        || router.watching_commits.swap(true, Ordering::SeqCst)
                    {
                        return;
                    }
                }
                if let Err(e) = router.reload_committed().await {
                    tracing::debug!("watching for commits: {e}");
                }
            }
        });
    }

    /// Brings every node that answers in step with the cluster record's datasets: creates
    /// those it lacks, drops those dropped while it was away, adds fields added meanwhile.
    pub(crate) async fn sync_datasets(self: &Arc<Self>) {
        let (record, revision) = match self.load_cluster().await {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!("syncing datasets: {e}");
                return;
            }
        };
        self.adopt_datasets(&record, revision).await;
        if self.coordinator().outdated(revision) {
            return; // a newer record was adopted meanwhile: the next sync uses it
        }
        let default_fields = self.fields();
        for (node, answer) in self.ask_nodes_up(None, &NodeRequest::Datasets).await {
            let Ok(crate::nodes::NodeReply {
                reply: Reply::Datasets(held),
                ..
            }) = answer
            else {
                continue;
            };
            self.sync_node(node, &record, &default_fields, &held).await;
        }
    }

    pub(crate) async fn sync_node(
        &self,
        node: NodeId,
        record: &ClusterRecord,
        default_fields: &[FieldInfo],
        held: &[DatasetInfo],
    ) {
        let mut changes: Vec<(Option<&str>, NodeRequest)> = Vec::new();
        for change in datasets::node_changes(record, default_fields, held) {
            match change {
                Change::AddField { dataset, field } => {
                    changes.push((dataset, NodeRequest::AddField { field }))
                }
                Change::Create(dataset) => match self.create_request(dataset).await {
                    Ok(request) => changes.push((Some(&dataset.name), request)),
                    Err(e) => tracing::warn!(
                        "shard {} replica {} lacks dataset '{}', which cannot be made there: {e}",
                        self.nodes().shard(node),
                        self.nodes().replica(node),
                        dataset.name
                    ),
                },
                Change::Drop { name, id } => {
                    changes.push((Some(name), NodeRequest::DropDataset { id }))
                }
            }
        }
        for (dataset, request) in changes {
            let kind = request.kind();
            match self.nodes().call(dataset, node, &request, Vec::new()).await {
                Ok(_) => tracing::info!(
                    "shard {} replica {}: {kind} of dataset '{}' done (it missed it)",
                    self.nodes().shard(node),
                    self.nodes().replica(node),
                    dataset.unwrap_or(DEFAULT_DATASET)
                ),
                Err(e) => tracing::warn!(
                    "shard {} replica {}: {kind} of dataset '{}': {e}",
                    self.nodes().shard(node),
                    self.nodes().replica(node),
                    dataset.unwrap_or(DEFAULT_DATASET)
                ),
            }
        }
    }

    /// One last pass of every dataset of `all` over `node`, with every dataset's writes
    /// held, and the node marked in sync. Each begins where its online pass (`resumes`, in
    /// the order of `all`) ended if nothing it compared has changed since, else at the start
    /// (see `catchup::last_pass_from`).
    pub(crate) async fn last_passes(
        all: &[Arc<Router>],
        node: NodeId,
        pass: u32,
        resumes: &[crate::catchup::Resume],
    ) -> Result<u64, Failure> {
        Router::exclusive_all(all, || {
            Box::pin(async move {
                let mut copied = 0;
                for (k, router) in all.iter().enumerate() {
                    let partner = router.partner(router.nodes().shard(node))?;
                    let marks = (router.mark(partner).await?, router.mark(node).await?);
                    let from =
                        crate::catchup::last_pass_from(resumes.get(k), partner, marks.0, marks.1);
                    tracing::info!(
                        "shard {} replica {}: last pass over dataset '{}' from record {from}{}",
                        router.nodes().shard(node),
                        router.nodes().replica(node),
                        router.dataset_name(),
                        match from {
                            0 => " (records changed since the online pass began, or none ran)",
                            _ => " (nothing before it changed since the online pass compared it)",
                        }
                    );
                    let (step, _) = router.sync_pass(node, pass, true, from).await?;
                    copied += step;
                }
                if let Some(first) = all.first() {
                    first.nodes().mark_in_sync(node).await?;
                }
                Ok(copied)
            })
        })
        .await
    }

    /// The request that makes `dataset` on a node, with its dictionaries from the metadata
    /// store (each checked against the id and CRC32 the record names it by).
    pub(crate) async fn create_request(
        &self,
        dataset: &DatasetRecord,
    ) -> Result<NodeRequest, Failure> {
        let mut dicts = Vec::new();
        for field in &dataset.fields {
            let Some(at) = field.dict else { continue };
            let bytes = cluster::load_dict(&*self.cluster.meta, at)
                .await
                .map_err(metadata)?
                .filter(|bytes| dict_ref(bytes) == Some(at))
                .ok_or_else(|| {
                    Failure::Inconsistent(format!(
                        "dataset '{}' field '{}': dictionary {} (CRC32 {:08x}) is missing from the metadata store, or damaged there ({})",
                        dataset.name,
                        field.name,
                        at.id,
                        at.crc,
                        cluster::dict_key(at)
                    ))
                })?;
            dicts.push(FieldDict {
                field: field.name.clone(),
                bytes,
            });
        }
        Ok(NodeRequest::CreateDataset {
            id: dataset.id,
            fields: wire_fields(&dataset.fields),
            dicts,
        })
    }

    /// Makes this named dataset, empty, on the nodes of `shards` that lack it (the nodes of
    /// a shard a move adds), as `record` lists it.
    pub(crate) async fn create_on(
        &self,
        record: &ClusterRecord,
        shards: &[u32],
    ) -> Result<(), Failure> {
        let name = self.dataset_name();
        let dataset = record.dataset(name).ok_or_else(|| {
            Failure::Inconsistent(format!("the cluster record lists no dataset '{name}'"))
        })?;
        let request = self.create_request(dataset).await?;
        for &shard in shards {
            for node in self.nodes().of_shard(shard) {
                self.nodes()
                    .call(self.on(), node, &request, Vec::new())
                    .await?;
            }
        }
        Ok(())
    }
}
