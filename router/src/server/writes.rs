//! Writes through the router: append, modify, delete, each under this router's write lock
//! and the cluster's writer lease (kept in the metadata store, see `lease.rs` and
//! `zr_meta::writer`), so that writes through several routers are serialized as well. When
//! the lease is taken, the global length is re-read from the nodes first, and shards left out
//! of step by a write cut off midway are cut back to the longest length all agree with.
//!
//! An append or a delete (which copies the last record into the hole, then cuts the last
//! record off) is recorded in the writer record before it starts. If it stops halfway (a
//! shard failed, the router died), whoever takes the lease next settles it before writing —
//! cuts off the part of an append that landed, finishes a delete — so a write is never left
//! in part past the next write.
//!
//! Each grant of the lease carries a token: the repair fences every node with it, and
//! `write_call` stamps it on every write, so a write of a router whose lease has passed on
//! is refused by the nodes instead of landing late on top of the next holder's.

use std::future::Future;

use bytes::Bytes;
use zr_meta::writer::PendingWrite;
use zr_proto::wire::{self, ErrorCode, NodeRequest, Reply};

use super::Router;
use crate::error::Failure;
use crate::nodes::{NodeId, NodeReply};
use crate::plan::plan_append;
use crate::repair;

impl Router {
    /// Runs `write` holding this router's write lock and the cluster's write lease, with
    /// the global length fresh from the nodes (and repaired, see the module documentation).
    pub(super) async fn exclusive<T, F>(&self, write: impl FnOnce() -> F) -> Result<T, Failure>
    where
        F: Future<Output = Result<T, Failure>>,
    {
        let _writes = self.writes.lock().await;
        let pending = self.acquire_lease().await?;
        let result = match self.repair_locked(pending).await {
            Ok(()) => write().await,
            Err(e) => Err(e),
        };
        if result.is_ok() {
            self.lease_used();
        } else {
            // Whoever takes the lease next (this router too) settles what this write left.
            self.release_lease(false).await;
        }
        result
    }

    /// One write to every in-sync replica of shard `shard`, carrying the write lease's
    /// token (see [`Self::write_node`]). Done once it is done on every in-sync replica, at
    /// least one: a replica that failed it is marked behind first (it serves nothing until
    /// it has caught up). Fails if it failed on all of them.
    pub(super) async fn write_call(
        &self,
        shard: u32,
        request: NodeRequest,
        body: Vec<Bytes>,
    ) -> Result<NodeReply, Failure> {
        let targets = self.nodes().in_sync_of(shard);
        let several = targets.len() > 1;
        let calls = targets.iter().map(|&node| {
            let (request, body) = (request.clone(), body.clone());
            async move {
                if !several {
                    return self.write_node(node, request, body).await;
                }
                // A replica known down, or found down meanwhile, is not waited for while
                // another takes the write: it is marked behind instead.
                if self.nodes().is_down(node) {
                    return Err(self.nodes().unavailable(node, "down".into()));
                }
                tokio::select! {
                    written = self.write_node(node, request, body) => written,
                    _ = self.nodes().wait_down(node) => Err(self.nodes().unavailable(
                        node,
                        "its heartbeats found it down during the write".into(),
                    )),
                }
            }
        });
        let results = futures::future::join_all(calls).await;
        let (reply, _) = self.all_or_behind(&targets, results).await?;
        Ok(reply)
    }

    /// From the outcomes of one request on `targets` (replicas of one shard): the first
    /// reply and who answered, once every replica that failed is marked behind; the first
    /// failure if none answered.
    pub(super) async fn all_or_behind(
        &self,
        targets: &[NodeId],
        results: Vec<Result<NodeReply, Failure>>,
    ) -> Result<(NodeReply, Vec<NodeId>), Failure> {
        let mut answered = None;
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for (&node, result) in targets.iter().zip(results) {
            match result {
                Ok(reply) => {
                    answered.get_or_insert(reply);
                    done.push(node);
                }
                Err(failure) => failed.push((node, failure)),
            }
        }
        let Some(reply) = answered else {
            return Err(failed.into_iter().next().map_or_else(
                || Failure::NoReplicaInSync { shard: None },
                |(_, failure)| failure,
            ));
        };
        for (node, failure) in failed {
            self.nodes().mark_behind(node, &failure.to_string()).await?;
        }
        Ok((reply, done))
    }

    /// One write to node `node`, carrying the write lease's token (whatever token `request`
    /// has is replaced), if the lease is sure to outlast it (each call takes at most the
    /// timeout); otherwise another router may be writing by then, and the write stops here.
    pub(super) async fn write_node(
        &self,
        node: NodeId,
        mut request: NodeRequest,
        body: Vec<Bytes>,
    ) -> Result<NodeReply, Failure> {
        let Some(token) = self.usable_lease().map(|held| held.token) else {
            return Err(Failure::LeaseRunningOut {
                shard: self.nodes().shard(node),
                timeout_ms: self.nodes().timeout().as_millis(),
            });
        };
        match &mut request {
            NodeRequest::Append { token: t, .. } | NodeRequest::Modify { token: t, .. } => {
                *t = Some(token)
            }
            NodeRequest::Truncate { token: t, .. } | NodeRequest::WriteField { token: t, .. } => {
                *t = token
            }
            _ => {}
        }
        let reply = self.nodes().call(self.on(), node, &request, body).await?;
        self.nodes().note_written(node);
        Ok(reply)
    }

    /// Re-reads every node's length and cuts back shards holding records past the longest
    /// length they all agree with (a write that did not reach every shard), then settles
    /// `pending` (a write perhaps left half done: the part of an append that landed is cut
    /// off, a delete is finished); stores the global length. The caller holds the write
    /// lease, which told it `pending`.
    async fn repair_locked(&self, pending: Option<PendingWrite>) -> Result<(), Failure> {
        let token = self.state().lease.held().map(|held| held.token);
        let shards = self.shard_lens(token, true).await?;
        let lens: Vec<u64> = shards.iter().map(|s| s.len).collect();
        let replicas: Vec<repair::ReplicaLens<'_>> =
            shards.iter().map(|s| s.replicas.as_slice()).collect();
        let placement = self.cluster.placement.load_full();
        // Committed data is never cut. When there is nothing to cut or settle, the cached
        // committed length does; otherwise it is read afresh first (another router may have
        // committed more), once per such write, not per record.
        let cached = self.state().lengths.committed();
        let committed = if repair::needs_fresh_committed(&placement, &replicas, pending, cached) {
            self.reload_committed().await?
        } else {
            cached
        };
        // A shard holding less than the committed length gives it is missing data, and no
        // write goes on until it is back.
        if self.note_missing(&lens) {
            if let Some(refusal) = self.missing_failure() {
                return Err(refusal);
            }
        }
        let plan = repair::plan(&placement, &replicas, pending, committed)
            .map_err(Failure::Inconsistent)?;
        if let Some((start, landed)) = plan.cut_append {
            tracing::warn!(
                "cutting off the {landed} records that landed of an append from index {start} (a write cut off midway)"
            );
        }
        for action in plan.actions {
            match action {
                repair::Action::Truncate {
                    shard,
                    node,
                    have,
                    want,
                } => {
                    tracing::warn!(
                        "shard {shard} at {} holds {have} records but a cluster of {} gives it {want}: dropping its last {} (a write that did not reach every shard)",
                        self.nodes().addr(node),
                        plan.len,
                        have - want
                    );
                    let cut = self.truncate_to(shard, want);
                    self.write_node(node, cut, Vec::new()).await?;
                }
                repair::Action::MarkBehind {
                    have, want, node, ..
                } => {
                    // Its partners hold records it lacks: it missed a write.
                    let why = format!("it holds {have} records, its partners {want}");
                    self.nodes().mark_behind(node, &why).await?;
                }
                repair::Action::SetLen { len } => self.state().lengths.set_len(len),
                repair::Action::FinishDelete { index, len } => {
                    tracing::warn!(
                        "finishing the delete of record {index} that a router left half done"
                    );
                    self.withdraw_last(len).await?;
                    self.finish_delete(index, len).await?;
                    self.state().lengths.set_len(len - 1);
                }
                repair::Action::CopyRecord { index } => self.copy_record(index).await?,
                repair::Action::ClearPending => self.intend(None).await?,
            }
        }
        if let Some(token) = token {
            self.state().len_read_under(token);
        }
        Ok(())
    }

    /// A request that cuts shard `shard`'s nodes back to its first `len` records (its
    /// local indices `0..len`): each of its slots to its part of them.
    pub(super) fn truncate_to(&self, shard: u32, len: u64) -> NodeRequest {
        NodeRequest::Truncate {
            slots: self.cluster.placement.load().slot_lens(shard, len),
            token: 0, // write_node or write_call sets it
        }
    }

    /// Record `index` as one in-sync replica holds it, written to every in-sync replica.
    async fn copy_record(&self, index: u64) -> Result<(), Failure> {
        let place = self.cluster.placement.load().locate_address(index);
        self.copy_record_to(place, place).await
    }

    /// Record `from` (shard, node address), as an in-sync replica holding it has it,
    /// written over record `to` on every in-sync replica of its shard.
    async fn copy_record_to(&self, from: (u32, u64), to: (u32, u64)) -> Result<(), Failure> {
        let (lengths, body) = self.read_record(from.0, from.1).await?;
        let request = NodeRequest::Modify {
            index: to.1,
            token: None, // write_node sets it
            fields: self.field_names(),
            lengths,
        };
        self.write_call(to.0, request, body).await?;
        Ok(())
    }

    /// Every field's name, in order.
    pub(super) fn field_names(&self) -> Vec<String> {
        self.fields().iter().map(|f| f.name.clone()).collect()
    }

    /// Record `address` of shard `shard` from an in-sync replica holding it: every field's
    /// length and the body of a `Modify` to it.
    async fn read_record(
        &self,
        shard: u32,
        address: u64,
    ) -> Result<(Vec<u32>, Vec<Bytes>), Failure> {
        let (node, read) = self
            .nodes()
            .read(
                self.on(),
                shard,
                &NodeRequest::Gather {
                    indices: vec![address],
                    fields: Vec::new(),
                    // A copy that fails its check is not copied on.
                    checked: true,
                },
            )
            .await?;
        let Reply::Gather { lengths } = &read.reply else {
            return Err(self
                .nodes()
                .unavailable(node, format!("answered a gather with {:?}", read.reply)));
        };
        let lengths: Vec<u32> = lengths
            .iter()
            .map(|l| l.first().copied().unwrap_or(0))
            .collect();
        Ok((lengths, vec![Bytes::from(read.body())]))
    }

    /// Replaces record `index` with the record in `body`.
    pub(super) async fn modify(
        &self,
        index: u64,
        fields: Vec<String>,
        lengths: Vec<u32>,
        body: &[u8],
    ) -> Result<Reply, Failure> {
        self.check_index(index)?;
        self.refuse_while_moving("modify").await?;
        if self.nodes().replicas() > 1 {
            // Should it stop halfway, its replicas would differ: the next write settles it.
            self.intend(Some(PendingWrite::Modify { index }))
                .await
                .map_err(|e| e.while_("recording the modify in the metadata store"))?;
        }
        let (shard, address) = self.cluster.placement.load().locate_address(index);
        let request = NodeRequest::Modify {
            index: address,
            token: None, // write_call sets it
            fields,
            lengths,
        };
        self.write_call(shard, request, vec![Bytes::copy_from_slice(body)])
            .await?;
        Ok(Reply::Done)
    }

    /// Refuses an index past the end. The caller holds the lease (the length is fresh).
    fn check_index(&self, index: u64) -> Result<(), Failure> {
        let len = self.len();
        if index >= len {
            return Err(Failure::OutOfRange { index, len });
        }
        Ok(())
    }

    /// Appends as global records from the current length on. If a node is out of step (it
    /// restarted meanwhile), repairs and tries once more.
    pub(super) async fn append(
        &self,
        fields: Vec<String>,
        lengths: Vec<Vec<u32>>,
        body: &[u8],
    ) -> Result<(Reply, Vec<Bytes>), Failure> {
        let count = lengths.first().map_or(0, Vec::len);
        let columns = wire::split_columns(&lengths, body);
        let mut start = self.len();
        let mut attempt = self.append_at(start, &fields, &lengths, &columns).await;
        if matches!(&attempt, Err(e) if e.code() == ErrorCode::Conflict) {
            // A node out of step (it restarted and lost writes it had not committed): settle
            // this attempt as the next holder would, then try once more from the length the
            // nodes agree on now.
            let tried = PendingWrite::Append {
                start,
                count: count as u64,
            };
            self.repair_locked(Some(tried)).await?;
            start = self.len();
            attempt = self.append_at(start, &fields, &lengths, &columns).await;
        }
        attempt?;
        self.state().lengths.set_len(start + count as u64);
        metrics::counter!("zr_router_records_appended_total").increment(count as u64);
        Ok((
            Reply::Appended {
                start,
                count: count as u64,
            },
            Vec::new(),
        ))
    }

    /// One attempt at appending `columns` as global records `start..`; on failure, undoes
    /// what reached some shards so the cluster stays consistent.
    async fn append_at(
        &self,
        start: u64,
        fields: &[String],
        lengths: &[Vec<u32>],
        columns: &[Vec<&[u8]>],
    ) -> Result<(), Failure> {
        let count = lengths.first().map_or(0, Vec::len);
        if count > 0 {
            let write = PendingWrite::Append {
                start,
                count: count as u64,
            };
            self.intend(Some(write))
                .await
                .map_err(|e| e.while_("recording the append in the metadata store"))?;
        }
        let placement = self.cluster.placement.load();
        let parts = plan_append(&placement, start, count);
        let calls = parts.iter().map(|part| {
            let lengths: Vec<Vec<u32>> = lengths
                .iter()
                .map(|l| part.positions.iter().map(|&k| l[k]).collect())
                .collect();
            let body: Vec<Bytes> = columns
                .iter()
                .map(|column| {
                    let size = part.positions.iter().map(|&k| column[k].len()).sum();
                    let mut payload = Vec::with_capacity(size);
                    for &k in &part.positions {
                        payload.extend_from_slice(column[k]);
                    }
                    Bytes::from(payload)
                })
                .collect();
            let request = NodeRequest::Append {
                runs: placement.runs(part.shard, part.local_start, part.positions.len() as u64),
                token: None, // write_call sets it
                fields: fields.to_vec(),
                lengths,
            };
            async move { self.write_call(part.shard, request, body).await }
        });
        let results = futures::future::join_all(calls).await;
        if let Some(failure) = results.iter().find_map(|r| r.as_ref().err()).cloned() {
            for (part, result) in parts.iter().zip(&results) {
                if result.is_ok() {
                    let undo = self.truncate_to(part.shard, part.local_start);
                    if let Err(e) = self.write_call(part.shard, undo, Vec::new()).await {
                        tracing::warn!(
                            "undoing a failed append on shard {}: {e} (the next write cuts it off)",
                            part.shard
                        );
                    }
                }
            }
            return Err(failure);
        }
        Ok(())
    }

    /// Before a delete of a cluster of `len` records cuts record `len - 1` off its shard:
    /// the committed length must not promise it any more, or that shard would look as if it
    /// had lost data.
    async fn withdraw_last(&self, len: u64) -> Result<(), Failure> {
        if self.state().lengths.committed() >= len {
            self.record_committed(len - 1, true).await?;
        }
        Ok(())
    }

    /// Global swap-remove: the last record moves into the hole, across shards if needed.
    /// Recorded beside the lease first, so that a delete stopped halfway is finished by the
    /// next write (see the module documentation).
    pub(super) async fn delete(&self, index: u64) -> Result<(Reply, Vec<Bytes>), Failure> {
        self.check_index(index)?;
        self.refuse_while_moving("delete").await?;
        let len = self.len();
        self.withdraw_last(len).await?;
        // Recorded even when only the last record is cut: the writer record may still hold
        // an earlier append of this router's, which the shorter length would seem to cut
        // in part.
        self.intend(Some(PendingWrite::Delete { index, len }))
            .await
            .map_err(|e| e.while_("recording the delete in the metadata store"))?;
        self.finish_delete(index, len)
            .await
            .map_err(|e| Failure::DeleteRecorded(Box::new(e)))?;
        self.state().lengths.set_len(len - 1);
        Ok((Reply::Done, Vec::new()))
    }

    /// Moves record `len - 1` into `index` (unless it is that record), then cuts it off its
    /// old place. Each step can be redone: a delete stopped halfway is finished by running
    /// this again.
    async fn finish_delete(&self, index: u64, len: u64) -> Result<(), Failure> {
        let last = len - 1;
        let placement = self.cluster.placement.load();
        let (last_shard, last_local) = placement.locate(last);
        let truncate = self.truncate_to(last_shard, last_local);
        if index == last {
            self.write_call(last_shard, truncate, Vec::new()).await?;
            return Ok(());
        }
        self.copy_record_to(
            placement.locate_address(last),
            placement.locate_address(index),
        )
        .await?;
        self.write_call(last_shard, truncate, Vec::new()).await?;
        Ok(())
    }
}
