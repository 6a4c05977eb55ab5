//! A router starting: the cluster record read or made, the map checked against nodes.toml,
//! the links to the nodes, the tasks it runs (gauges, map reloads, catch-up, scrub).

use super::*;

impl Router {
    /// Connects to every node of `config`, checks they agree on the
    /// fields, and recovers the global length from their lengths. Shards holding records past
    /// the longest consistent length (an append that did not reach every shard) are cut back
    /// to it, with a warning naming them.
    pub async fn start(
        config: &ClusterConfig,
        security: net::Security,
    ) -> Result<Arc<Router>, Error> {
        let meta = open_metadata(config).await?;
        Router::start_with(config, security, meta).await
    }

    /// [`Router::start`] with the metadata store `meta`. The cluster record there (made on
    /// the first start from nodes.toml, with the nodes' length as committed) must have the
    /// map nodes.toml gives, or the router refuses to start. A shard whose node holds fewer
    /// records than the committed length gives it is refused by name, and the router serves
    /// the others; nothing is cut.
    pub async fn start_with(
        config: &ClusterConfig,
        security: net::Security,
        meta: Arc<dyn MetaStore>,
    ) -> Result<Arc<Router>, Error> {
        let placement = config.placement()?;
        let audit = match &config.router.audit_log {
            Some(path) => Some(Arc::new(
                zr_service::audit::AuditLog::open(path)
                    .map_err(|e| Error::Net(net::Error::Setup(e.to_string())))?,
            )),
            None => None,
        };
        // The coordinator: its replica set empty (the links to the nodes fill it and step
        // it), the default dataset's state first.
        let coordinator = Arc::new(std::sync::Mutex::new(Coordinator::new(
            // This router's name for the writer leases it takes: random, one per router.
            std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                std::process::id(),
            ),
            Duration::from_millis(config.router.timeout_ms) * lease::LEASE_TIMEOUTS,
            zr_coord::Replicas::new(config.cluster.replicas),
        )));
        let links = super::links_of(
            config,
            security,
            Arc::clone(&meta),
            Some(Arc::clone(&coordinator)),
        )?;
        let nodes = Arc::new(links);
        nodes.watch();
        let shards = nodes.shards() as usize;
        let key =
            coordinator
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .open(None, shards, Vec::new());
        let cluster = Cluster {
            nodes,
            timeout: Duration::from_millis(config.router.timeout_ms),
            meta,
            cluster_id: String::new(),
            placement: ArcSwap::from_pointee(placement),
            named: Default::default(),
            adopting: Default::default(),
            coordinator,
            replies: Arc::new(ReplyBudget::new(config.router.reply_budget_mib)),
            request_budget: usize::try_from(config.router.request_budget_mib << 20)
                .unwrap_or(usize::MAX),
            requests_per_identity: config.router.requests_per_identity,
            bytes_per_second_per_identity: zr_service::config::bytes_per_second(
                config.router.mib_per_second_per_identity,
            ),
            log_budget: Default::default(),
            listening: Default::default(),
            audit,
            access: Default::default(),
            killed: tokio::sync::watch::Sender::new(false),
        };
        let mut router = Router {
            cluster: Arc::new(cluster),
            dataset: None,
            dataset_id: 0,
            writer_key: zr_meta::writer::key(None),
            committed_watch: tokio::sync::watch::Sender::new(()),
            watching_commits: Default::default(),
            key,
            writes: Mutex::new(()),
        };
        // Which replicas are behind (none if the store has no record of them).
        if let Err(e) = router.nodes().refresh_replicas().await {
            return Err(Error::Failed(e));
        }
        // Every node that answers; a router starts, and serves what it can, with some down
        // (found so within START_PROBE, not the whole timeout; heartbeats bring them in).
        let mut answers: Vec<Option<(u64, Vec<FieldInfo>)>> = Vec::new();
        let mut down = Vec::new();
        let probe = START_PROBE.min(router.cluster.timeout);
        for answer in router.each_node_info_within(None, probe).await {
            match answer {
                Ok(info) => answers.push(Some(info)),
                Err(failure) => {
                    down.push(failure);
                    answers.push(None);
                }
            }
        }
        // Per shard: the most records an in-sync replica that answered holds, and its fields.
        let in_sync: Vec<Vec<NodeId>> = (0..router.nodes().shards())
            .map(|shard| router.nodes().in_sync_of(shard))
            .collect();
        let heard = startup::Heard::of(&in_sync, &answers).map_err(
            |startup::FieldsDiffer { shard, first }| Error::FieldsDiffer { shard, first },
        )?;
        // A shard is down when none of its in-sync replicas answered.
        let down: Vec<Failure> = if router.nodes().replicas() == 1 {
            down
        } else {
            heard
                .down()
                .into_iter()
                .map(|shard| {
                    let node = router.nodes().id(shard, 0);
                    router
                        .nodes()
                        .unavailable(node, "no in-sync replica answered".into())
                })
                .collect()
        };
        router.state().set_fields(match &heard.fields {
            Some(fields) => fields.clone(),
            // No node answered: the fields nodes.toml gives them.
            None => config
                .fields
                .iter()
                .map(|f| FieldInfo::new(f.name.clone(), f.compress.clone()))
                .collect(),
        });
        let known = heard.all();
        let record = router
            .cluster_record(config, known.as_deref(), down.first())
            .await?;
        // Nothing holds the cluster's state but this router yet.
        let Some(cluster) = Arc::get_mut(&mut router.cluster) else {
            return Err(Error::Failed(Failure::Inconsistent(
                "the router's state was shared before it knew the cluster's id".into(),
            )));
        };
        cluster.cluster_id = record.id.clone();
        router.grow_from(&record).map_err(Error::Failed)?;
        let placement =
            moves::placement_of(&record.map, router.nodes().shards()).map_err(Error::Failed)?;
        router.place_by(&record.map, placement);
        router.set_committed(record.committed_len);
        // A node that is down counts as holding its committed share until it answers.
        let lens = heard
            .counting_down_as_committed(&router.cluster.placement.load(), record.committed_len);
        if router.note_missing(&lens) || !down.is_empty() {
            // Serve what is there; writes wait for the missing data and the nodes down.
            router.serve_len_of(&lens);
            if let Some(failure) = router.missing_failure() {
                tracing::error!("{failure}");
            }
            for failure in &down {
                tracing::warn!("{failure}: serving the other shards meanwhile");
            }
        } else {
            // Recover the length, repairing what a write cut off midway left behind. While
            // another router holds the writer lease (perhaps a dead one, until its lease
            // lapses), serve what the nodes agree on; the first write repairs.
            match router.exclusive(|| async { Ok(()) }).await {
                Ok(()) => {}
                Err(busy @ Failure::Busy { .. }) => {
                    tracing::warn!("{busy}: serving meanwhile; the first write repairs");
                    router.serve_len_of(&lens);
                }
                Err(e) => return Err(e.into()),
            }
        }
        // Revoked certificates are refused from the first request on.
        router.cluster.access.refresh(&*router.cluster.meta).await?;
        router
            .cluster
            .access
            .keep_store(Arc::clone(&router.cluster.meta));
        let router = Arc::new(router);
        router.open_datasets(&record).await?;
        router.start_rebuilds();
        router.start_gauges();
        router.start_map_reloads();
        router.start_access_reads();
        // Gives the writer lease back once the router has been idle for a moment; ends with
        // the router.
        let keeper = Arc::downgrade(&router);
        router.spawn(async move {
            loop {
                tokio::time::sleep(lease::LINGER).await;
                let Some(router) = keeper.upgrade() else {
                    return;
                };
                router.release_if_idle().await;
                for named in router.named_routers() {
                    named.release_if_idle().await;
                }
            }
        });
        Ok(router)
    }

    /// The cluster record of the metadata store, checked against nodes.toml's map; made if
    /// there is none yet, with `lens` (the nodes' lengths) as the committed length — which
    /// needs every node (`down`: the first that did not answer).
    pub(super) async fn cluster_record(
        &self,
        config: &ClusterConfig,
        lens: Option<&[u64]>,
        down: Option<&Failure>,
    ) -> Result<ClusterRecord, Error> {
        let given = crate::restore::initial_map(config);
        loop {
            let stored = cluster::load(&*self.cluster.meta)
                .await?
                .map(|(record, _)| record);
            let decision = startup::decide_record(
                stored.as_ref(),
                &given,
                config.cluster.shards,
                lens,
                || down.map_or_else(|| "a node did not answer".to_string(), |f| f.to_string()),
                |lens| self.cluster.placement.load().consistent_len(lens),
            );
            let committed_len = match decision {
                startup::RecordDecision::Use => {
                    return stored.ok_or_else(|| {
                        Error::Failed(Failure::Inconsistent("the cluster record went".into()))
                    })
                }
                startup::RecordDecision::MapMismatch {
                    key,
                    given,
                    stored,
                    version,
                } => {
                    return Err(Error::MapMismatch {
                        key,
                        given,
                        stored,
                        version,
                        store: self.cluster.meta.describe(),
                    })
                }
                startup::RecordDecision::NodesMissing { why } => {
                    return Err(Error::Failed(Failure::Inconsistent(format!(
                        "the cluster is not recorded in {} yet, and recording it needs every node: {why}",
                        self.cluster.meta.describe()
                    ))))
                }
                // Nodes holding records with no record to say whose: the record was lost. A
                // new one would give the cluster a new id, which every node would refuse.
                startup::RecordDecision::RecordLost { held } => {
                    return Err(Error::Failed(Failure::Inconsistent(format!(
                        "{} holds no cluster record, but the nodes hold {held} records: the record was lost (or [metadata] names another cluster's store). A new record would orphan their data, so none is made: rebuild it from the nodes with `zr cluster restore-record --nodes {}` (run where the router's certificate is), or point [metadata] at the store that holds it",
                        self.cluster.meta.describe(),
                        config.origin
                    ))))
                }
                startup::RecordDecision::Create { committed_len } => committed_len,
            };
            let record = ClusterRecord {
                id: cluster::new_cluster_id(),
                map: given.clone(),
                committed_len,
                moving: None,
                added: Vec::new(),
                datasets: Vec::new(),
                dataset_ids: 0,
                commits: 0,
            };
            match cluster::store(&*self.cluster.meta, None, &record).await {
                Ok(_) => {
                    tracing::info!(
                        "cluster {} recorded in {} ({} records committed)",
                        record.id,
                        self.cluster.meta.describe(),
                        record.committed_len
                    );
                    return Ok(record);
                }
                // Another router recorded it first: read theirs.
                Err(zr_meta::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sets the router's gauges every [`GAUGES_EVERY`] until the router is dropped: the
    /// committed and served lengths, the map version, the replicas behind.
    pub(super) fn start_gauges(self: &Arc<Self>) {
        let router = Arc::downgrade(self);
        self.spawn(async move {
            loop {
                let Some(router) = router.upgrade() else {
                    return;
                };
                metrics::gauge!("zr_router_committed_records")
                    .set(router.state().lengths.committed() as f64);
                metrics::gauge!("zr_router_records").set(router.len() as f64);
                metrics::gauge!("zr_router_map_version")
                    .set(router.cluster.placement.load().version() as f64);
                let behind = router
                    .nodes()
                    .all()
                    .filter(|&n| !router.nodes().in_sync(n))
                    .count();
                metrics::gauge!("zr_router_replicas_behind").set(behind as f64);
                router.nodes().refresh_in_flight();
                metrics::gauge!("zr_router_reply_bytes").set(router.cluster.replies.held() as f64);
                drop(router);
                tokio::time::sleep(GAUGES_EVERY).await;
            }
        });
    }

    /// Reads the access record (revocations, grants) every [`zr_meta::access::WATCH_EVERY`]; ends with the
    /// router. A store that cannot be read keeps the names read last.
    pub(super) fn start_access_reads(self: &Arc<Self>) {
        let router = Arc::downgrade(self);
        self.spawn(async move {
            let mut failing = false;
            loop {
                tokio::time::sleep(zr_meta::access::WATCH_EVERY).await;
                let Some(router) = router.upgrade() else {
                    return;
                };
                match router.cluster.access.refresh(&*router.cluster.meta).await {
                    Ok(()) => failing = false,
                    Err(e) if !failing => {
                        tracing::warn!("cannot read the access record: {e}");
                        failing = true;
                    }
                    Err(_) => {}
                }
            }
        });
    }

    /// Reloads the map from the metadata store when a node refuses a request as placed by
    /// another map, [`MAP_RELOAD_PAUSE`] after the last reload at the soonest, and every
    /// [`MAP_RELOAD_EVERY`] anyway; ends with the router.
    pub(super) fn start_map_reloads(self: &Arc<Self>) {
        let router = Arc::downgrade(self);
        let stale = self.nodes().stale_map();
        self.spawn(async move {
            loop {
                let _ = tokio::time::timeout(MAP_RELOAD_EVERY, stale.notified()).await;
                let Some(router) = router.upgrade() else {
                    return;
                };
                match router.reload_map().await {
                    Ok(record) => router.finish_stopped_switch(record).await,
                    Err(e) => tracing::warn!("reloading the cluster map: {e}"),
                }
                router.sync_datasets().await;
                drop(router);
                // A refusal meanwhile is kept (`notify_one`): answered after the pause.
                tokio::time::sleep(MAP_RELOAD_PAUSE).await;
            }
        });
    }
}
