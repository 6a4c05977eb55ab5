//! Each node watched: a heartbeat task per node, its liveness lease read, its incarnation
//! checked, and whether it is down.

use super::*;

impl Nodes {
    /// Starts a heartbeat task per node; each ends when the `Nodes` are dropped.
    pub(crate) fn watch(self: &Arc<Self>) {
        for node in self.all() {
            self.watch_node(node);
        }
    }

    /// Starts node `node`'s heartbeat task; it ends when the `Nodes` are dropped.
    pub(super) fn watch_node(self: &Arc<Self>, node: NodeId) {
        {
            let nodes: Weak<Nodes> = Arc::downgrade(self);
            tokio::spawn(async move {
                for beat in 0u32.. {
                    let Some(pause) = (match nodes.upgrade() {
                        Some(nodes) => {
                            if beat % liveness::LEASE_READ_EVERY == 0 {
                                nodes.read_lease(node).await;
                                if node == 0 && nodes.replicas > 1 && nodes.meta.is_some() {
                                    // Marks other routers made.
                                    if let Err(e) = nodes.refresh_replicas().await {
                                        tracing::debug!("replica record: {e}");
                                    }
                                }
                            }
                            Some(nodes.heartbeat(node).await)
                        }
                        None => None,
                    }) else {
                        return;
                    };
                    tokio::time::sleep(pause).await;
                }
            });
        }
    }

    /// Reads node `node`'s liveness lease into its liveness (a store that cannot say
    /// changes nothing).
    pub(super) async fn read_lease(&self, node: NodeId) {
        let (shard, replica) = (self.shard(node), self.replica(node));
        let Some(meta) = self.meta.as_deref() else {
            return;
        };
        match zr_meta::nodes::load(meta, shard, replica).await {
            Ok(lease) => self.links[node]
                .liveness
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .lease_read(
                    lease.map(|(_, revision)| revision),
                    tokio::time::Instant::now().into_std(),
                ),
            Err(e) => tracing::debug!("shard {shard} replica {replica}: its liveness lease: {e}"),
        }
    }

    /// Node `node`'s liveness lease, as this router has read it, in words.
    pub(crate) fn lease(&self, node: NodeId) -> String {
        self.links[node]
            .liveness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lease(tokio::time::Instant::now().into_std())
            .describe()
    }

    /// One heartbeat to node `node`, its outcome told to the node's liveness; returns the
    /// pause before the next.
    pub(super) async fn heartbeat(&self, node: NodeId) -> Duration {
        let sent = tokio::time::Instant::now();
        let wall = SystemTime::now();
        let link = &self.links[node];
        let shard = link.shard;
        let timeout = {
            let liveness = link.liveness.lock().unwrap_or_else(|e| e.into_inner());
            liveness.timeout().min(self.timeout)
        };
        let outcome = self
            .exchange(None, node, &NodeRequest::Info, Vec::new(), timeout)
            .await;
        if let Ok(NodeReply {
            reply: Reply::Info { len, .. },
            ..
        }) = &outcome
        {
            *link.len.lock().unwrap_or_else(|e| e.into_inner()) = Some(*len);
        }
        let label = &link.label;
        if outcome.is_ok() || matches!(outcome, Err(Failure::ShardRefused { .. })) {
            metrics::histogram!("zr_router_node_heartbeat_seconds", "shard" => label.clone())
                .record(sent.elapsed());
        }
        if let Some(connection) = link.connection.try_lock().ok().and_then(|c| c.clone()) {
            let path = connection.stats().path;
            metrics::gauge!("zr_router_node_rtt_seconds", "shard" => label.clone())
                .set(path.rtt.as_secs_f64());
            metrics::gauge!("zr_router_node_cwnd_bytes", "shard" => label.clone())
                .set(path.cwnd as f64);
            metrics::gauge!("zr_router_node_lost_packets", "shard" => label.clone())
                .set(path.lost_packets as f64);
        }
        let mut liveness = link.liveness.lock().unwrap_or_else(|e| e.into_inner());
        let changed = match outcome {
            // Any answer, a refusal too, means the node is up.
            Ok(_) | Err(Failure::ShardRefused { .. }) => liveness.answered(),
            Err(failure) => liveness.failed(
                sent.into_std(),
                wall,
                tokio::time::Instant::now().into_std(),
                failure.to_string(),
            ),
        };
        if changed {
            let health = liveness.health().clone();
            match health.describe_down(sent.into_std()) {
                Some(down) => tracing::warn!("shard {shard} at {}: {down}", link.target().addr),
                None => {
                    tracing::info!("shard {shard} at {} is up", link.target().addr);
                    self.catch_up.notify_one();
                }
            }
            link.health.send_replace(health);
        }
        link.failing.send_if_modified(|failing| {
            let now = liveness.failing();
            std::mem::replace(failing, now) != now
        });
        let up = !matches!(liveness.health(), Health::Down { .. });
        metrics::gauge!("zr_router_node_up", "shard" => label.clone()).set(if up {
            1.0
        } else {
            0.0
        });
        liveness.pause()
    }

    /// The incarnation of the node at the far end of `connection`, new: asked before the
    /// connection is used (`None` if the node answers with a refusal of its own).
    pub(super) async fn incarnation_on(
        &self,
        node: NodeId,
        connection: &Connection,
        timeout: Duration,
    ) -> Result<Option<u64>, Error> {
        let header = self.encode(None, node, &NodeRequest::Info)?;
        let chunks = zr_net::call_chunks(connection, header, Vec::new(), timeout).await?;
        match wire::decode_reply_chunks(&chunks)?.0 {
            Reply::Info { incarnation, .. } => Ok(Some(incarnation)),
            _ => Ok(None),
        }
    }

    /// Node `node`, connected anew, is the process `incarnation`: if that is another than
    /// before while this router's writes to it were not yet durable, it restarted and may have
    /// lost them, and is marked behind. Every connection is checked so before its first
    /// request, so no write is taken for one the node lost.
    pub(super) async fn check_incarnation(&self, node: NodeId, incarnation: u64) {
        let link = &self.links[node];
        let before = link
            .incarnation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(incarnation);
        let restarted = before.is_some_and(|before| before != incarnation);
        if restarted && link.written.load(Ordering::SeqCst) && self.replicas > 1 {
            match self
                .mark_behind(node, "it restarted, losing writes it had not made durable")
                .await
            {
                Ok(()) => link.written.store(false, Ordering::SeqCst),
                Err(e) => tracing::error!("{e}"),
            }
        }
    }

    /// The refusal of a call to node `node` while it is down, after waiting a moment for a
    /// heartbeat to find it back; `None` if it is not down.
    pub(crate) async fn down(&self, node: NodeId) -> Option<Failure> {
        let link = &self.links[node];
        let shard = link.shard;
        let mut health = link.health.subscribe();
        if !matches!(*health.borrow(), Health::Down { .. }) {
            return None;
        }
        let back = health.wait_for(|h| !matches!(h, Health::Down { .. }));
        let _ = tokio::time::timeout(liveness::WAIT_FOR_UP, back).await;
        let reason = health
            .borrow()
            .describe_down(tokio::time::Instant::now().into_std())?;
        Some(Failure::ShardUnavailable {
            shard,
            addr: link.target().addr,
            reason,
        })
    }
}
