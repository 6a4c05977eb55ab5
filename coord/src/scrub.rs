//! A scrub's verdict on a range of a shard's records, from each in-sync replica's digest of
//! it (every record's CRC, and the records that failed their check): which copies are wrong,
//! which good copy replaces each, and which records no replica holds intact.
//!
//! Which copy is good: of those that pass their check, the one most replicas hold (a tie
//! goes to the lowest replica, the first in `digests`). A record no replica holds intact is
//! reported and left as it is.

use std::collections::HashMap;

use crate::NodeId;

/// One replica's digest of records `start..start + crcs.len()`.
#[derive(Clone, Debug)]
pub struct Digest {
    pub node: NodeId,
    /// Each record's CRC, in order.
    pub crcs: Vec<u32>,
    /// The indices (of the shard) of the records that failed their check, ascending.
    pub corrupt: Vec<u64>,
}

/// Why a copy is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrong {
    /// It fails its own check (CRC).
    FailsCheck,
    /// It passes its check but differs from the copy most replicas hold.
    Differs,
}

impl Wrong {
    pub fn describe(self) -> &'static str {
        match self {
            Wrong::FailsCheck => "fails its check (CRC)",
            Wrong::Differs => "differs from its partners' copies",
        }
    }
}

/// What a scrub does about one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No replica holds it intact: each of these holds a copy that fails its check.
    Lost { index: u64, nodes: Vec<NodeId> },
    /// Read it from `source` and write it over each of `wrong`'s copies.
    Repair {
        index: u64,
        source: NodeId,
        wrong: Vec<(NodeId, Wrong)>,
    },
}

/// What a scrub of records `start..start + n` (each digest holding `n` CRCs) does: a verdict
/// for each record that is not the same intact copy on every replica, in index order.
/// Refuses digests of different lengths, which no replica's answer to the same request
/// gives.
pub fn verdicts(start: u64, digests: &[Digest]) -> Result<Vec<Verdict>, String> {
    let Some(first) = digests.first() else {
        return Ok(Vec::new());
    };
    let n = first.crcs.len();
    if let Some(other) = digests.iter().find(|d| d.crcs.len() != n) {
        return Err(format!(
            "node {} digested {} records and node {} {}",
            first.node,
            n,
            other.node,
            other.crcs.len()
        ));
    }
    let mut out = Vec::new();
    for (k, index) in (start..start + n as u64).enumerate() {
        let copies: Vec<(NodeId, Option<u32>)> = digests
            .iter()
            .map(|d| {
                let bad = d.corrupt.binary_search(&index).is_ok();
                (d.node, (!bad).then_some(d.crcs[k]))
            })
            .collect();
        let Some((source, good)) = most_held(&copies) else {
            out.push(Verdict::Lost {
                index,
                nodes: copies.iter().map(|&(node, _)| node).collect(),
            });
            continue;
        };
        let wrong: Vec<(NodeId, Wrong)> = copies
            .iter()
            .filter(|(_, crc)| *crc != Some(good))
            .map(|&(node, crc)| match crc {
                None => (node, Wrong::FailsCheck),
                Some(_) => (node, Wrong::Differs),
            })
            .collect();
        if wrong.is_empty() {
            continue;
        }
        out.push(Verdict::Repair {
            index,
            source,
            wrong,
        });
    }
    Ok(out)
}

/// The first copy that passed its check with the CRC most such copies have: its node and
/// CRC; `None` if none passed.
fn most_held(copies: &[(NodeId, Option<u32>)]) -> Option<(NodeId, u32)> {
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for crc in copies.iter().filter_map(|(_, crc)| *crc) {
        *counts.entry(crc).or_default() += 1;
    }
    let most = counts.values().copied().max()?;
    copies.iter().find_map(|&(node, crc)| {
        let crc = crc?;
        (counts[&crc] == most).then_some((node, crc))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(node: NodeId, crcs: &[u32], corrupt: &[u64]) -> Digest {
        Digest {
            node,
            crcs: crcs.to_vec(),
            corrupt: corrupt.to_vec(),
        }
    }

    #[test]
    fn the_good_copy_is_the_one_most_intact_replicas_hold() {
        assert_eq!(
            most_held(&[(0, Some(1)), (1, Some(2)), (2, Some(2))]),
            Some((1, 2))
        );
        assert_eq!(most_held(&[(0, None), (1, Some(5))]), Some((1, 5)));
        assert_eq!(most_held(&[(0, Some(7)), (1, Some(5))]), Some((0, 7)));
        assert_eq!(most_held(&[(0, None), (1, None)]), None);
    }

    /// Over records 10..14 of three replicas: record 10 the same everywhere (nothing to do),
    /// 11 corrupt on one replica, 12 different on one, 13 corrupt everywhere (lost).
    #[test]
    fn each_wrong_copy_is_repaired_from_a_good_one_and_a_lost_record_named() {
        let digests = [
            digest(4, &[1, 2, 3, 9], &[11, 13]),
            digest(5, &[1, 2, 3, 9], &[13]),
            digest(6, &[1, 2, 7, 9], &[13]),
        ];
        let verdicts = verdicts(10, &digests).unwrap();
        assert_eq!(
            verdicts,
            vec![
                Verdict::Repair {
                    index: 11,
                    source: 5,
                    wrong: vec![(4, Wrong::FailsCheck)],
                },
                Verdict::Repair {
                    index: 12,
                    source: 4,
                    wrong: vec![(6, Wrong::Differs)],
                },
                Verdict::Lost {
                    index: 13,
                    nodes: vec![4, 5, 6],
                },
            ]
        );
    }

    /// Two replicas that disagree and both pass their checks: the lower replica's copy is
    /// taken (nothing tells them apart); a sole replica's corrupt copy is lost.
    #[test]
    fn a_tie_goes_to_the_first_replica_and_a_sole_bad_copy_is_lost() {
        let two = [digest(0, &[1], &[]), digest(1, &[2], &[])];
        assert_eq!(
            verdicts(0, &two).unwrap(),
            vec![Verdict::Repair {
                index: 0,
                source: 0,
                wrong: vec![(1, Wrong::Differs)],
            }]
        );
        let sole = [digest(3, &[1, 2], &[1])];
        assert_eq!(
            verdicts(0, &sole).unwrap(),
            vec![Verdict::Lost {
                index: 1,
                nodes: vec![3],
            }]
        );
        assert_eq!(verdicts(0, &[]).unwrap(), Vec::new());
    }

    #[test]
    fn digests_of_different_lengths_are_refused() {
        let digests = [digest(0, &[1, 2], &[]), digest(1, &[1], &[])];
        let e = verdicts(0, &digests).unwrap_err();
        assert!(e.contains("node 0 digested 2 records and node 1 1"), "{e}");
    }
}
