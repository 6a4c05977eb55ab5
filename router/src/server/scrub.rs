//! Scrubbing: every record of a range of a shard read on each in-sync replica against its
//! CRC (`NodeRequest::Digest`), the copies compared, and each copy that fails its check or
//! differs from the others replaced by a good one. `zr verify --router` runs it over the
//! whole cluster, range by range.
//!
//! Which copy is good, and which are replaced, is `zr_coord::scrub`'s to say; this file reads
//! the digests and performs the repairs.

use bytes::Bytes;
use zr_coord::scrub::{verdicts, Digest, Verdict, Wrong};
use zr_proto::wire::{self, NodeRequest, ScrubProblem, ScrubReport};

use super::Router;
use crate::error::Failure;
use crate::nodes::NodeId;

impl Router {
    /// Scrubs records `start..start + count` of shard `shard` (see the module
    /// documentation), under the write lock and lease so that no write lands meanwhile.
    pub(super) async fn scrub(
        &self,
        shard: u32,
        start: u64,
        count: u64,
    ) -> Result<ScrubReport, Failure> {
        if shard >= self.nodes().shards() {
            return Err(Failure::BadRequest(format!(
                "shard {shard} does not exist (the cluster has {})",
                self.nodes().shards()
            )));
        }
        self.exclusive(|| self.scrub_locked(shard, start, count))
            .await
    }

    async fn scrub_locked(
        &self,
        shard: u32,
        start: u64,
        count: u64,
    ) -> Result<ScrubReport, Failure> {
        let nodes = self.nodes().in_sync_of(shard);
        let placement = self.cluster.placement.load_full();
        let shard_len = placement.shard_len(shard, self.len());
        let end = start.saturating_add(count).min(shard_len);
        let mut report = ScrubReport {
            shard_len,
            records: end.saturating_sub(start),
            replicas: nodes.len() as u32,
            problems: Vec::new(),
        };
        if start >= end {
            return Ok(report);
        }
        let mut digests = Vec::with_capacity(nodes.len());
        for &node in &nodes {
            let (crcs, corrupt) = self.digest(node, start, end - start).await?;
            digests.push(Digest {
                node,
                crcs,
                corrupt,
            });
        }
        for verdict in verdicts(start, &digests).map_err(Failure::Inconsistent)? {
            match verdict {
                Verdict::Lost { index, nodes } => {
                    for node in nodes {
                        report.problems.push(ScrubProblem {
                            replica: self.nodes().replica(node),
                            index,
                            what: "fails its check, and no replica holds it intact".into(),
                            repaired: false,
                        });
                    }
                }
                Verdict::Repair {
                    index,
                    source,
                    wrong,
                } => {
                    let address = placement.address_of(shard, index);
                    let problems = self
                        .repair_copies(shard, (index, address), source, wrong)
                        .await?;
                    report.problems.extend(problems);
                }
            }
        }
        metrics::counter!("zr_router_records_scrubbed_total").increment(report.records);
        Ok(report)
    }

    /// Reads record `index` of shard `shard` (at node address `address`) from `source` and
    /// writes it over each copy of `wrong`; returns what each was, and whether it was
    /// repaired.
    async fn repair_copies(
        &self,
        shard: u32,
        (index, address): (u64, u64),
        source: NodeId,
        wrong: Vec<(NodeId, Wrong)>,
    ) -> Result<Vec<ScrubProblem>, Failure> {
        let (lengths, body) = self.read_records(source, vec![address]).await?;
        let columns = wire::split_columns(&lengths, &body);
        let mut problems = Vec::with_capacity(wrong.len());
        for (node, what) in wrong {
            let request = NodeRequest::Modify {
                index: address,
                token: None, // write_node sets it
                fields: self.field_names(),
                lengths: lengths.iter().map(|l| l[0]).collect(),
            };
            let payload: Vec<Bytes> = columns
                .iter()
                .map(|column| Bytes::copy_from_slice(column[0]))
                .collect();
            let repaired = match self.write_node(node, request, payload).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!("repairing record {index} of shard {shard}: {e}");
                    false
                }
            };
            let replica = self.nodes().replica(node);
            let what = what.describe();
            if repaired {
                let from = self.nodes().replica(source);
                tracing::warn!(
                    "scrub: shard {shard} replica {replica} record {index} {what}; repaired from replica {from}"
                );
            } else {
                tracing::warn!("scrub: shard {shard} replica {replica} record {index} {what}");
            }
            problems.push(ScrubProblem {
                replica,
                index,
                what: what.into(),
                repaired,
            });
        }
        Ok(problems)
    }
}
