//! Scrubbing: every record of a range of a shard read on each in-sync replica against its
//! CRC (`NodeRequest::Digest`), the copies compared, and each copy that fails its check or
//! differs from the others replaced by a good one. `zr verify --router` runs it over the
//! whole cluster, range by range.
//!
//! Which copy is good: of those that pass their check, the one most replicas hold (a tie
//! goes to the lowest replica number). A record no replica holds intact is reported and
//! left as it is.

use std::collections::HashMap;

use bytes::Bytes;
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
        if shard >= self.nodes.shards() {
            return Err(Failure::BadRequest(format!(
                "shard {shard} does not exist (the cluster has {})",
                self.nodes.shards()
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
        let nodes = self.nodes.in_sync_of(shard);
        let placement = self.placement.load_full();
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
            digests.push((node, crcs, corrupt));
        }
        for index in start..end {
            let k = (index - start) as usize;
            // Each replica's copy: its CRC, or None if it failed its check.
            let copies: Vec<(NodeId, Option<u32>)> = digests
                .iter()
                .map(|(node, crcs, corrupt)| {
                    let bad = corrupt.binary_search(&index).is_ok();
                    (*node, (!bad).then_some(crcs[k]))
                })
                .collect();
            let Some(good) = most_held(&copies) else {
                for &(node, _) in &copies {
                    report.problems.push(ScrubProblem {
                        replica: self.nodes.replica(node),
                        index,
                        what: "fails its check, and no replica holds it intact".into(),
                        repaired: false,
                    });
                }
                continue;
            };
            let wrong: Vec<(NodeId, &str)> = copies
                .iter()
                .filter(|(_, crc)| *crc != Some(good))
                .map(|&(node, crc)| {
                    let what = if crc.is_none() {
                        "fails its check (CRC)"
                    } else {
                        "differs from its partners' copies"
                    };
                    (node, what)
                })
                .collect();
            if wrong.is_empty() {
                continue;
            }
            let source = copies
                .iter()
                .find(|(_, crc)| *crc == Some(good))
                .map(|&(node, _)| node)
                .ok_or_else(|| Failure::Inconsistent("no good copy after all".into()))?;
            let address = placement.address_of(shard, index);
            let (lengths, body) = self.read_records(source, vec![address]).await?;
            let columns = wire::split_columns(&lengths, &body);
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
                let replica = self.nodes.replica(node);
                tracing::warn!(
                    "scrub: shard {shard} replica {replica} record {index} {what}{}",
                    if repaired {
                        "; repaired from replica ".to_string()
                            + &self.nodes.replica(source).to_string()
                    } else {
                        String::new()
                    }
                );
                report.problems.push(ScrubProblem {
                    replica,
                    index,
                    what: what.into(),
                    repaired,
                });
            }
        }
        metrics::counter!("zr_router_records_scrubbed_total").increment(report.records);
        Ok(report)
    }
}

/// The CRC most copies that passed their check have (a tie: the first such copy's);
/// `None` if none passed.
fn most_held(copies: &[(NodeId, Option<u32>)]) -> Option<u32> {
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for crc in copies.iter().filter_map(|(_, crc)| *crc) {
        *counts.entry(crc).or_default() += 1;
    }
    let most = counts.values().copied().max()?;
    copies
        .iter()
        .filter_map(|(_, crc)| *crc)
        .find(|crc| counts[crc] == most)
}

#[cfg(test)]
mod tests {
    use super::most_held;

    #[test]
    fn the_good_copy_is_the_one_most_intact_replicas_hold() {
        assert_eq!(
            most_held(&[(0, Some(1)), (1, Some(2)), (2, Some(2))]),
            Some(2)
        );
        assert_eq!(most_held(&[(0, None), (1, Some(5))]), Some(5));
        assert_eq!(most_held(&[(0, Some(7)), (1, Some(5))]), Some(7));
        assert_eq!(most_held(&[(0, None), (1, None)]), None);
    }
}
