//! The repair of an interrupted write, as a decision: what the router knows — each in-sync
//! replica's length, the placement, the write recorded as pending in the writer lease, the
//! committed length — in, the actions to perform out. I/O-free; `server::writes` performs
//! the actions. A router that died at any point of a write leaves nodes whose lengths this
//! turns back into one cluster: the longest length every shard agrees with, an append cut
//! off midway removed whole, a delete finished, a modify's replicas made equal; committed
//! records never cut.

use crate::writer::PendingWrite;
use zr_proto::placement::Placement;

/// What one shard's in-sync replicas hold: (node, records) each.
pub type ReplicaLens<'a> = &'a [(usize, u64)];

/// Whether the committed length must be read afresh before planning: anything to cut or
/// settle (a pending write, replicas off their share, a length below the cached committed
/// one). Otherwise the cached committed length will do.
pub fn needs_fresh_committed(
    placement: &Placement,
    shards: &[ReplicaLens<'_>],
    pending: Option<PendingWrite>,
    cached_committed: u64,
) -> bool {
    let len = agreed_len(placement, shards);
    let clean = pending.is_none()
        && len >= cached_committed
        && shards.iter().enumerate().all(|(shard, replicas)| {
            let share = placement.shard_len(shard as u32, len);
            replicas.iter().all(|&(_, have)| have == share)
        });
    !clean
}

/// The longest global length every shard holds its share of (by its fullest in-sync
/// replica).
fn agreed_len(placement: &Placement, shards: &[ReplicaLens<'_>]) -> u64 {
    let lens: Vec<u64> = shards
        .iter()
        .map(|replicas| replicas.iter().map(|&(_, have)| have).max().unwrap_or(0))
        .collect();
    placement.consistent_len(&lens)
}

/// One thing the repair does, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Drop a replica's records past `want` (a write that did not reach every shard).
    Truncate {
        shard: u32,
        node: usize,
        have: u64,
        want: u64,
    },
    /// A replica lacks records its partners hold: it missed a write.
    MarkBehind {
        shard: u32,
        node: usize,
        have: u64,
        want: u64,
    },
    /// The cluster's length is `len` from here on.
    SetLen { len: u64 },
    /// Finish a swap-remove of `index` in a cluster of `len` records (it ends at `len - 1`).
    FinishDelete { index: u64, len: u64 },
    /// Write one in-sync replica's copy of record `index` to all of its shard's.
    CopyRecord { index: u64 },
    /// The pending write is settled: clear it from the writer record.
    ClearPending,
}

/// What the repair found and does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The cluster's length once the nodes are cut back (before a delete is finished).
    pub len: u64,
    /// An append cut off midway: (its start, the records of it that had landed).
    pub cut_append: Option<(u64, u64)>,
    pub actions: Vec<Action>,
}

/// Plans the repair (see the module documentation). Refused, cutting nothing, if the nodes
/// agree on fewer records than are committed.
pub fn plan(
    placement: &Placement,
    shards: &[ReplicaLens<'_>],
    pending: Option<PendingWrite>,
    committed: u64,
) -> Result<Plan, String> {
    let mut len = agreed_len(placement, shards);
    let mut cut_append = None;
    if let Some(PendingWrite::Append { start, count }) = pending {
        if start < len && len < start + count {
            cut_append = Some((start, len - start));
            len = start;
        }
    }
    if len < committed {
        return Err(format!(
            "the nodes agree on {len} records but {committed} are committed; nothing is cut"
        ));
    }
    let mut actions = Vec::new();
    for (shard, replicas) in shards.iter().enumerate() {
        let shard = shard as u32;
        let want = placement.shard_len(shard, len);
        for &(node, have) in replicas.iter() {
            if have > want {
                actions.push(Action::Truncate {
                    shard,
                    node,
                    have,
                    want,
                });
            } else if have < want {
                actions.push(Action::MarkBehind {
                    shard,
                    node,
                    have,
                    want,
                });
            }
        }
    }
    actions.push(Action::SetLen { len });
    match pending {
        Some(PendingWrite::Delete { index, len: before }) if len == before => {
            actions.push(Action::FinishDelete { index, len: before });
        }
        Some(PendingWrite::Modify { index }) if index < len => {
            actions.push(Action::CopyRecord { index });
        }
        Some(PendingWrite::WriteField { start, count }) => {
            actions.extend(
                (start..(start + count).min(len)).map(|index| Action::CopyRecord { index }),
            );
        }
        _ => {}
    }
    if pending.is_some() {
        // Settled: cleared, so that no later write, which may change the length without
        // recording itself (cutting the last record off), reads it again.
        actions.push(Action::ClearPending);
    }
    Ok(Plan {
        len,
        cut_append,
        actions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zr_proto::placement::ClusterMap;

    fn placement(shards: u32, extent: u64) -> Placement {
        Placement::new(ClusterMap::balanced(shards, extent, 7).expect("map")).expect("placement")
    }

    /// Nodes of `shards` shards × `replicas`, numbered shard·replicas + replica.
    fn nodes_at(
        placement: &Placement,
        shards: u32,
        replicas: usize,
        len: u64,
    ) -> Vec<Vec<(usize, u64)>> {
        (0..shards)
            .map(|s| {
                (0..replicas)
                    .map(|r| (s as usize * replicas + r, placement.shard_len(s, len)))
                    .collect()
            })
            .collect()
    }

    fn views(shards: &[Vec<(usize, u64)>]) -> Vec<ReplicaLens<'_>> {
        shards.iter().map(Vec::as_slice).collect()
    }

    #[test]
    fn a_clean_cluster_needs_nothing() {
        let p = placement(3, 4);
        let shards = nodes_at(&p, 3, 2, 500);
        assert!(!needs_fresh_committed(&p, &views(&shards), None, 500));
        assert!(needs_fresh_committed(&p, &views(&shards), None, 501));
        let plan = plan(&p, &views(&shards), None, 500).expect("plan");
        assert_eq!(plan.actions, vec![Action::SetLen { len: 500 }]);
    }

    #[test]
    fn committed_records_are_never_cut() {
        let p = placement(3, 4);
        let mut shards = nodes_at(&p, 3, 1, 500);
        shards[1][0].1 -= 2; // a shard lost records that were committed
        let refused = plan(&p, &views(&shards), None, 500).expect_err("refused");
        assert!(refused.to_string().contains("nothing is cut"), "{refused}");
    }

    #[test]
    fn a_delete_left_at_its_start_is_finished_and_one_already_cut_is_only_cleared() {
        let p = placement(2, 3);
        let shards = nodes_at(&p, 2, 1, 100);
        let pending = Some(PendingWrite::Delete { index: 7, len: 100 });
        let planned = plan(&p, &views(&shards), pending, 90).expect("plan");
        assert_eq!(
            planned.actions[1..],
            [
                Action::FinishDelete { index: 7, len: 100 },
                Action::ClearPending
            ]
        );
        let cut = nodes_at(&p, 2, 1, 99);
        let planned = plan(&p, &views(&cut), pending, 90).expect("plan");
        assert_eq!(planned.actions[1..], [Action::ClearPending]);
    }

    #[test]
    fn a_field_write_copies_the_records_the_cluster_still_holds() {
        let p = placement(2, 3);
        let shards = nodes_at(&p, 2, 2, 10);
        let pending = Some(PendingWrite::WriteField { start: 8, count: 5 });
        let planned = plan(&p, &views(&shards), pending, 10).expect("plan");
        assert_eq!(
            planned.actions[1..],
            [
                Action::CopyRecord { index: 8 },
                Action::CopyRecord { index: 9 },
                Action::ClearPending
            ]
        );
    }

    proptest! {
        /// Every crash point of an append: each node either got its part of the append or
        /// did not (a request is applied whole or not at all), replicas independently. The
        /// plan keeps the whole append if every shard has it on one replica at least; else,
        /// the append recorded as pending, the cluster before it; never cuts committed
        /// records; leaves every replica at its share (cut, or marked behind to catch up).
        #[test]
        fn every_crash_point_of_an_append_is_repaired(
            shards in 1u32..5,
            extent in 1u64..6,
            replicas in 1usize..3,
            before in 0u64..300,
            count in 1u64..100,
            landed in proptest::collection::vec(any::<bool>(), 10),
            recorded in any::<bool>(),
        ) {
            let p = placement(shards, extent);
            let after_len = before + count;
            let nodes: Vec<Vec<(usize, u64)>> = (0..shards)
                .map(|s| {
                    (0..replicas)
                        .map(|r| {
                            let node = s as usize * replicas + r;
                            let got = landed[node % landed.len()];
                            (node, p.shard_len(s, if got { after_len } else { before }))
                        })
                        .collect()
                })
                .collect();
            let pending = recorded.then_some(PendingWrite::Append { start: before, count });
            let planned = plan(&p, &views(&nodes), pending, before).expect("never refused");
            // A shard has the append once one in-sync replica has it (the others then
            // catch up from it).
            let all_landed = nodes.iter().enumerate().all(|(s, rs)| {
                rs.iter().any(|&(_, have)| have == p.shard_len(s as u32, after_len))
            });
            if all_landed {
                prop_assert_eq!(planned.len, after_len);
            } else if recorded {
                prop_assert_eq!(planned.len, before, "a recorded append is cut off whole");
            }
            prop_assert!(planned.len >= before, "committed records are never cut");
            // Every replica ends at its share: cut to it, or marked behind to catch up.
            for (s, rs) in nodes.iter().enumerate() {
                let want = p.shard_len(s as u32, planned.len);
                for &(node, have) in rs {
                    let acted = planned.actions.iter().any(|a| match *a {
                        Action::Truncate { node: n, want: w, .. } => n == node && w == want && have > want,
                        Action::MarkBehind { node: n, want: w, .. } => n == node && w == want && have < want,
                        _ => false,
                    });
                    prop_assert!(have == want || acted, "node {} holds {} of {}", node, have, want);
                }
            }
            prop_assert_eq!(planned.actions.last() == Some(&Action::ClearPending), recorded);
        }
    }
}
