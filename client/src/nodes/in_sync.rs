//! Which replicas are in sync: the replica record read and written by compare-and-swap,
//! a replica marked behind or in sync, and the write acknowledgments held while one leaves.

use super::*;

impl Nodes {
    /// Re-reads which replicas are behind, and where they are, from the metadata store.
    pub async fn refresh_replicas(&self) -> Result<(), Failure> {
        let (record, _) = replicas::load(self.meta()?).await.map_err(Failure::from)?;
        self.set_record(record).await;
        Ok(())
    }

    /// Takes `record` as the replica record: which replicas are behind, and the addresses
    /// replicas were moved to. A node whose address changed is reached there from now on,
    /// known afresh: its old connection closed, its health, length and incarnation
    /// forgotten (the heartbeats learn the new node's).
    pub(super) async fn set_record(&self, record: ReplicaRecord) {
        for effect in self.tell(Event::Record(record)) {
            if let Effect::Retarget { node, addr } = effect {
                self.retarget(node, addr).await;
            }
        }
    }

    /// Reaches node `node` at `addr` from now on (the state decided it): its connection is
    /// closed, and the next call connects there.
    async fn retarget(&self, node: NodeId, addr: SocketAddr) {
        let link = &self.links[node];
        let current = link.target();
        if current.addr == addr {
            return;
        }
        let endpoint = if current.addr.is_ipv4() == addr.is_ipv4() {
            current.endpoint.clone()
        } else {
            match zr_net::client_endpoint(addr) {
                Ok(endpoint) => endpoint,
                Err(e) => {
                    tracing::error!(
                        "shard {} replica {} moved to {addr}, but no endpoint reaches it: {e}",
                        link.shard,
                        link.replica
                    );
                    return;
                }
            }
        };
        let mut cached = link.connection.lock().await;
        // Records taken meanwhile may have moved it again: the state's word is the last.
        if self.state().target(node) != Some(addr) {
            return;
        }
        *link.target.lock().unwrap_or_else(|e| e.into_inner()) = Target { addr, endpoint };
        if let Some(old) = cached.take() {
            old.close(0u32.into(), b"the node moved");
        }
        drop(cached);
        *link.forgotten.lock().unwrap_or_else(|e| e.into_inner()) = None;
        tracing::warn!(
            "shard {} replica {} moved from {} to {addr}: reached there from now on",
            link.shard,
            link.replica,
            current.addr
        );
    }

    /// Serves shard `shard`'s replica `replica` from `addr` from now on: recorded in the
    /// metadata store (the replica marked behind, as the node there holds nothing yet) and
    /// taken up here; the catch-up task then rebuilds it from a partner. Refused unless a
    /// partner is in sync.
    pub async fn move_replica(
        &self,
        shard: u32,
        replica: u32,
        addr: SocketAddr,
    ) -> Result<(), Failure> {
        let record = replicas::move_replica(
            self.meta()?,
            (shard, replica),
            self.replicas,
            &addr.to_string(),
        )
        .await
        .map_err(|e| match e {
            replicas::MarkError::LastInSync(_) => Failure::BadRequest(format!(
                "shard {shard} replica {replica} cannot be replaced now: no other replica of shard {shard} is in sync to rebuild it from"
            )),
            replicas::MarkError::Store(e) => Failure::from(e),
            other => Failure::Inconsistent(other.to_string()),
        })?;
        tracing::warn!(
            "shard {shard} replica {replica} is being replaced by the node at {addr}: it serves nothing until it is rebuilt"
        );
        // The replaced node, if it still runs, stops serving clients before any write
        // it misses is acknowledged (see `acks_may_go`).
        self.set_record(record).await;
        Ok(())
    }

    /// Marks node `node` behind in the metadata store (it missed a write, or may have):
    /// it serves nothing until it has caught up. Refused for its shard's last in-sync node.
    pub async fn mark_behind(&self, node: NodeId, why: &str) -> Result<(), Failure> {
        if !self.in_sync(node) {
            return Ok(());
        }
        let (shard, replica) = (self.shard(node), self.replica(node));
        match replicas::mark_behind(self.meta()?, (shard, replica), self.replicas).await {
            Ok(record) => {
                tracing::warn!(
                    "shard {shard} replica {replica} at {} is behind ({why}): it serves nothing until it has caught up",
                    self.addr(node)
                );
                // Clients read one hop from nodes that know themselves in sync: the node's
                // read lease runs out before what it missed is acknowledged (see
                // `acks_may_go`).
                self.set_record(record).await;
                Ok(())
            }
            Err(replicas::MarkError::Store(e)) => Err(Failure::from(e)),
            Err(e) => Err(Failure::Inconsistent(format!(
                "shard {shard} replica {replica} missed a write ({why}) but cannot be marked behind: {e}"
            ))),
        }
    }

    /// Waits, before a client's write is acknowledged, until every replica this router saw
    /// leave the in-sync set (marked behind, or replaced) has stopped serving clients by
    /// itself (`zr_meta::nodes::ReadLease`): no one reads one hop, from a replica that missed
    /// it, what came before a write acknowledged. Only acknowledgments wait — the writes
    /// themselves, and a catch-up's work under the write lock, go on meanwhile. A router
    /// that learns of the change later, from the metadata store, waits from then.
    pub async fn acks_may_go(&self) {
        let after = self.state().acks_after();
        if let Some(until) = after {
            tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
        }
    }

    /// Marks node `node` in sync again: it holds what its partners hold.
    pub async fn mark_in_sync(&self, node: NodeId) -> Result<(), Failure> {
        let (shard, replica) = (self.shard(node), self.replica(node));
        let record = replicas::mark_in_sync(self.meta()?, (shard, replica))
            .await
            .map_err(Failure::from)?;
        tracing::info!(
            "shard {shard} replica {replica} at {} has caught up: in sync again",
            self.addr(node)
        );
        self.set_record(record).await;
        Ok(())
    }

    /// The length node `node` gave in its last answer to a heartbeat.
    pub fn heard_len(&self, node: NodeId) -> Option<u64> {
        self.state().len(node)
    }

    /// This router wrote to node `node` (and it is not durable there until a commit).
    pub fn note_written(&self, node: NodeId) {
        // Nothing follows from a write but what a reconnect finds.
        let _ = self.tell(Event::Wrote { node });
    }

    /// Node `node` made every write so far durable.
    pub fn note_committed(&self, node: NodeId) {
        let _ = self.tell(Event::Committed { node });
    }
}
