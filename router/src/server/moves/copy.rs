//! A move's copy: every slot a node gains built from the shard that holds it, in batches,
//! paced so that the cluster's readers keep most of the machines.

use super::*;

impl Router {
    /// [`Self::copy_shard`] for each of `shards`, one after another (side by side, they
    /// take the machines from the cluster's readers); returns the records copied from other
    /// shards.
    pub(crate) async fn copy_shards(
        &self,
        progress: &Router,
        shards: &[u32],
        old: &Placement,
        new: &Placement,
        version: u64,
        len: u64,
    ) -> Result<u64, Failure> {
        let mut moved = 0;
        for &shard in shards {
            moved += self
                .copy_shard(progress, shard, old, new, version, len)
                .await?;
        }
        Ok(moved)
    }

    /// Builds, on shard `shard`'s nodes, this dataset's records of the slots the shard
    /// gains with map `version` (placement `new`, from `old`), up to its length `len`, from
    /// where each slot ends there: read from the shard that holds the slot now, at the same
    /// node addresses (a slot's records are numbered inside it, whichever shard holds it).
    /// Returns the records it copied, and counts them in `progress` (the move's router).
    pub(crate) async fn copy_shard(
        &self,
        progress: &Router,
        shard: u32,
        old: &Placement,
        new: &Placement,
        version: u64,
        len: u64,
    ) -> Result<u64, Failure> {
        let gained = gained_slots(old, new, shard);
        let nodes: Vec<_> = self.nodes().of_shard(shard).collect();
        let mut have = self.open_stage(&nodes, version, &gained).await?;
        let target = |slot: u32| new.slot_len(slot, len);
        let holder = |slot: u32| old.map().owners[slot as usize];
        // Slots none of whose records are here yet: their files, copied node to node from
        // the shard holding them (the records written since follow below, as records) —
        // from every shard at once, to every replica at once.
        let to_ship = moveplan::copy_pass(&have, target, holder, true).files;
        let copies = to_ship.iter().flat_map(|(&holder, slots)| {
            nodes.iter().map(move |&node| async move {
                match self.ship_slots(progress, node, holder, slots).await {
                    Ok(records) => records,
                    Err(e) => {
                        tracing::warn!(
                            "shard {shard} replica {}: copying {} slots' files from shard {holder} failed ({e}); their records are copied one by one instead",
                            self.nodes().replica(node),
                            slots.len()
                        );
                        0
                    }
                }
            })
        });
        let shipped: u64 = futures::future::join_all(copies).await.into_iter().sum();
        let mut moved = shipped / nodes.len().max(1) as u64;
        if shipped > 0 {
            progress.note_staged(moved, moved);
            have = self.open_stage(&nodes, version, &gained).await?;
        }
        // What is left to copy of each slot, by the shard holding it now: runs from where
        // the nodes got to (a run of none cuts what they built past the length).
        let wanted = moveplan::copy_pass(&have, target, holder, false).records;
        let fields = self.field_names();
        let mut stages = 0u64;
        for (holder, runs) in wanted {
            let batches = batches_of(&runs, STAGE_RECORDS);
            let last = batches.len().saturating_sub(1);
            for (b, runs) in batches.into_iter().enumerate() {
                let batch_started = Instant::now();
                let count: u64 = runs.iter().map(|r| r.count).sum();
                let (lengths, body) = if count == 0 {
                    (vec![Vec::new(); fields.len()], bytes::Bytes::new())
                } else {
                    let request = NodeRequest::Gather {
                        indices: runs
                            .iter()
                            .flat_map(|r| (r.at..r.at + r.count).map(|i| unit_address(r.slot, i)))
                            .collect(),
                        fields: Vec::new(),
                        checked: true,
                    };
                    let (node, read) = self.nodes().read(self.on(), holder, &request).await?;
                    let Reply::Gather { lengths } = read.reply.clone() else {
                        return Err(self.nodes().unavailable(
                            node,
                            format!("answered a gather with {:?}", read.reply),
                        ));
                    };
                    if lengths.len() != fields.len()
                        || lengths.iter().any(|l| l.len() as u64 != count)
                    {
                        return Err(self
                            .nodes()
                            .unavailable(node, "answered a gather with the wrong shape".into()));
                    }
                    (lengths, bytes::Bytes::from(read.body()))
                };
                stages += 1;
                let request = NodeRequest::Stage {
                    version,
                    runs: runs.clone(),
                    fields: fields.clone(),
                    lengths,
                    commit: b == last || stages.is_multiple_of(STAGES_PER_COMMIT),
                };
                let expected: Vec<(u32, u64)> =
                    runs.iter().map(|r| (r.slot, r.at + r.count)).collect();
                for &node in &nodes {
                    match self
                        .nodes()
                        .call(self.on(), node, &request, vec![body.clone()])
                        .await?
                        .reply
                    {
                        Reply::Staged { slots } if slots == expected => {}
                        other => {
                            return Err(self.nodes().unavailable(
                                node,
                                format!("answered a stage of {count} records with {other:?}"),
                            ))
                        }
                    }
                }
                moved += count;
                progress.note_staged(count, count);
                // Leaves the nodes to the cluster's readers for a while: a move works at
                // most about a third of the time.
                tokio::time::sleep(batch_started.elapsed().mul_f64(PAUSE_PER_WORK)).await;
            }
        }
        Ok(moved)
    }

    /// Opens the building of `slots` for map `version` on `nodes` (a shard's): how far each
    /// slot got, on the node that got least far.
    pub(crate) async fn open_stage(
        &self,
        nodes: &[NodeId],
        version: u64,
        slots: &[u32],
    ) -> Result<std::collections::BTreeMap<u32, u64>, Failure> {
        let mut have: std::collections::BTreeMap<u32, u64> =
            slots.iter().map(|&slot| (slot, u64::MAX)).collect();
        let open = NodeRequest::StageOpen {
            version,
            slots: slots.to_vec(),
        };
        for &node in nodes {
            match self
                .nodes()
                .call(self.on(), node, &open, Vec::new())
                .await?
                .reply
            {
                Reply::Staged { slots } => {
                    for (slot, len) in slots {
                        if let Some(least) = have.get_mut(&slot) {
                            *least = (*least).min(len);
                        }
                    }
                }
                other => {
                    return Err(self
                        .nodes()
                        .unavailable(node, format!("answered StageOpen with {other:?}")))
                }
            }
        }
        Ok(have)
    }

    /// Has node `node` copy the files of `slots` from an in-sync node of shard `holder`
    /// (`NodeRequest::ShipFrom` with slots; see `zr_shard::ship`), and waits for it; returns
    /// the records copied; at the rate of the move `progress` runs.
    pub(crate) async fn ship_slots(
        &self,
        progress: &Router,
        node: NodeId,
        holder: u32,
        slots: &[u32],
    ) -> Result<u64, Failure> {
        let donor = self.partner(holder)?;
        let request = NodeRequest::ShipFrom {
            addr: self.nodes().addr(donor).to_string(),
            replica: self.nodes().replica(donor),
            shard: Some(holder),
            slots: slots.to_vec(),
            rate: progress.coordinator().moving.rate(),
        };
        let mut watch = ShipWatch::new(Instant::now().into_std(), SHIP_STALL);
        loop {
            let status = self.ship_status(node, &request).await?;
            match watch.observe(&status, Instant::now().into_std()) {
                ShipStep::Wait => tokio::time::sleep(SHIP_POLL).await,
                ShipStep::Failed(why) => return Err(self.nodes().unavailable(node, why)),
                ShipStep::Installed { len } => return Ok(len),
            }
        }
    }

    /// Starts the progress of a move to map `version`: what it copies, the records of the
    /// slots each shard of `staged` gains from `old`.
    /// `lens`: each dataset's length, the default one's first.
    pub(crate) fn set_moving(
        &self,
        version: u64,
        (old, new): (&Placement, &Placement),
        staged: &[u32],
        lens: &[u64],
    ) {
        let total = moveplan::records_to_stage(old, new, staged, lens);
        let len = lens.first().copied().unwrap_or(0);
        self.coordinator().moving.copying(version, len, total);
    }

    pub(crate) fn note_staged(&self, staged: u64, moved: u64) {
        self.coordinator().moving.staged(staged, moved);
    }
}
