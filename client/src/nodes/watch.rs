//! Each node watched: a heartbeat task per node, its liveness lease read, its incarnation
//! checked, and whether it is down.

use super::*;

impl Nodes {
    /// Starts a heartbeat task per node; each ends when the `Nodes` are dropped or
    /// [`Nodes::stop`] is called.
    pub fn watch(self: &Arc<Self>) {
        for node in self.all() {
            self.watch_node(node);
        }
    }

    /// Ends every heartbeat task at once (a killed router's: nothing of it may go on
    /// reading leases or telling liveness, whoever still holds it).
    pub fn stop(&self) {
        self.stopped.send_replace(true);
    }

    /// Starts node `node`'s heartbeat task; it ends when the `Nodes` are dropped or stopped.
    pub(super) fn watch_node(self: &Arc<Self>, node: NodeId) {
        let nodes: Weak<Nodes> = Arc::downgrade(self);
        let mut stopped = self.stopped.subscribe();
        tokio::spawn(async move {
            let beats = async {
                for beat in 0u32.. {
                    let Some(nodes) = nodes.upgrade() else {
                        return;
                    };
                    if beat % liveness::LEASE_READ_EVERY == 0 {
                        nodes.read_lease(node).await;
                        if node == 0 && nodes.replicas > 1 && nodes.meta.is_some() {
                            // Marks other routers made.
                            if let Err(e) = nodes.refresh_replicas().await {
                                tracing::debug!("replica record: {e}");
                            }
                        }
                    }
                    let pause = nodes.heartbeat(node).await;
                    // Not held over the pause: dropping the last other reference ends
                    // the task at its next beat.
                    drop(nodes);
                    tokio::time::sleep(pause).await;
                }
            };
            tokio::select! {
                biased;
                _ = stopped.wait_for(|stopped| *stopped) => {}
                () = beats => {}
            }
        });
    }

    /// Heartbeats sent so far, to every node: a stopped `Nodes` sends no more.
    pub fn heartbeats(&self) -> u64 {
        self.beats.load(Ordering::Relaxed)
    }

    /// Reads node `node`'s liveness lease into its liveness (a store that cannot say
    /// changes nothing).
    pub(super) async fn read_lease(&self, node: NodeId) {
        let (shard, replica) = (self.shard(node), self.replica(node));
        let Some(meta) = self.meta.as_deref() else {
            return;
        };
        match zr_meta::nodes::load(meta, shard, replica).await {
            Ok(lease) => {
                let revision = lease.map(|(_, revision)| revision);
                self.tell(Event::LeaseRead { node, revision });
            }
            Err(e) => tracing::debug!("shard {shard} replica {replica}: its liveness lease: {e}"),
        }
    }

    /// Node `node`'s liveness lease, as this router has read it, in words.
    pub fn lease(&self, node: NodeId) -> String {
        self.state().lease(node, now()).describe()
    }

    /// One heartbeat to node `node`, its outcome told to the node's liveness; returns the
    /// pause before the next.
    pub(super) async fn heartbeat(&self, node: NodeId) -> Duration {
        self.beats.fetch_add(1, Ordering::Relaxed);
        let sent = tokio::time::Instant::now();
        let wall = SystemTime::now();
        let link = &self.links[node];
        let timeout = self.state().heartbeat(node).1.min(self.timeout);
        let outcome = self
            .exchange(None, node, &NodeRequest::Info, Vec::new(), timeout)
            .await;
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
        let event = match outcome {
            Ok(NodeReply {
                reply: Reply::Info { len, .. },
                ..
            }) => Event::Answered {
                node,
                len: Some(len),
            },
            // Any answer, a refusal too, means the node is up.
            Ok(_) | Err(Failure::ShardRefused { .. }) => Event::Answered { node, len: None },
            Err(failure) => Event::Failed {
                node,
                sent: sent.into_std(),
                wall,
                reason: failure.to_string(),
            },
        };
        // A heartbeat's outcome decides nothing that waits.
        let _ = self.tell(event);
        let state = self.state();
        let up = !matches!(state.health(node), Some(Health::Down { .. }));
        metrics::gauge!("zr_router_node_up", "shard" => label.clone()).set(if up {
            1.0
        } else {
            0.0
        });
        state.heartbeat(node).0
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
        for effect in self.tell(Event::Connected { node, incarnation }) {
            if let Effect::MarkBehind { node, why } = effect {
                if let Err(e) = self.mark_behind(node, why).await {
                    tracing::error!("{e}");
                }
            }
        }
    }

    /// The refusal of a call to node `node` while it is down, after waiting a moment for a
    /// heartbeat to find it back; `None` if it is not down.
    pub async fn down(&self, node: NodeId) -> Option<Failure> {
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
