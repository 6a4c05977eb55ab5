//! One dataset's lengths as a router knows them: the length it serves, the committed length
//! (recorded in the metadata store), whether records were rewritten in place since the last
//! commit, and the shards whose nodes hold less than the committed length gives them (their
//! data is missing: a wiped or wrong data directory). The router tells it what the nodes and
//! the metadata store answered and asks it what follows; it reads no clock and does no I/O.
//!
//! A shard missing data is never taken as a short shard: the length served counts it as
//! holding its share of the committed length (its records are refused at gather time, not
//! made out of range), and no write goes on until its node holds that share again.

use zr_proto::placement::Placement;

use crate::NodeId;

/// One dataset's lengths; see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lengths {
    /// The length served.
    len: u64,
    /// The committed length as last read from or written to the metadata store.
    committed: u64,
    /// Records rewritten in place (modify, delete, write-field) since the last commit was
    /// recorded: the next commit counts as a change even if the length stayed.
    rewritten: bool,
    /// Per shard: `Some(records its node holds)` while that is less than its share of the
    /// committed length.
    missing: Vec<Option<u64>>,
}

/// What a commit of the nodes' length does, given the length the metadata store records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// The store records it already, and no record was rewritten since: nothing to store.
    Unchanged,
    /// The store records more than the nodes hold, and this is no delete: data is missing,
    /// and the commit is refused (`recorded` is what the store holds).
    Refused { recorded: u64 },
    /// Store the new length (and count one more commit).
    Store,
}

impl Commit {
    /// A commit of `len` records against `recorded` in the store; only a delete
    /// (`lowering`) may record less; `rewritten`: records changed in place since the last.
    pub fn decide(recorded: u64, len: u64, lowering: bool, rewritten: bool) -> Commit {
        if recorded == len && !rewritten {
            Commit::Unchanged
        } else if recorded > len && !lowering {
            Commit::Refused { recorded }
        } else {
            Commit::Store
        }
    }
}

impl Lengths {
    /// Nothing known yet of a dataset on `shards` shards.
    pub fn new(shards: usize) -> Lengths {
        Lengths {
            missing: vec![None; shards],
            ..Lengths::default()
        }
    }

    /// The length served.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True if no record is served.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Serves `len` records from now on (a write's outcome, a repair's).
    pub fn set_len(&mut self, len: u64) {
        self.len = len;
    }

    /// The committed length.
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Notes `len` as the committed length; true if it changed.
    pub fn set_committed(&mut self, len: u64) -> bool {
        let changed = self.committed != len;
        self.committed = len;
        changed
    }

    /// Records were rewritten in place: the next commit counts as a change.
    pub fn rewrote(&mut self) {
        self.rewritten = true;
    }

    /// Takes the rewritten mark for a commit about to be recorded; a commit that fails
    /// gives it back ([`Lengths::commit_failed`]), so the change is kept for the next.
    pub fn take_rewritten(&mut self) -> bool {
        std::mem::take(&mut self.rewritten)
    }

    /// A commit that took the mark `rewritten` failed to be recorded.
    pub fn commit_failed(&mut self, rewritten: bool) {
        self.rewritten |= rewritten;
    }

    /// Shard `shard`'s share of the committed length under `placement`.
    pub fn share(&self, placement: &Placement, shard: u32) -> u64 {
        placement.shard_len(shard, self.committed)
    }

    /// The nodes hold `lens` records, per shard: marks the shards that hold less than their
    /// share of the committed length, clears the others; true if any is marked.
    pub fn note_missing(&mut self, placement: &Placement, lens: &[u64]) -> bool {
        if self.missing.len() < lens.len() {
            self.missing.resize(lens.len(), None);
        }
        for (shard, (&have, slot)) in lens.iter().zip(self.missing.iter_mut()).enumerate() {
            let share = placement.shard_len(shard as u32, self.committed);
            *slot = (have < share).then_some(have);
        }
        self.missing.iter().any(Option::is_some)
    }

    /// Serves the length the nodes' `lens` give, and returns it: a shard missing data
    /// counts as holding its share of the committed length.
    pub fn serve(&mut self, placement: &Placement, lens: &[u64]) -> u64 {
        let lens: Vec<u64> = lens
            .iter()
            .enumerate()
            .map(|(shard, &have)| have.max(placement.shard_len(shard as u32, self.committed)))
            .collect();
        self.len = placement.consistent_len(&lens);
        self.len
    }

    /// [`Lengths::note_missing`], then [`Lengths::serve`].
    pub fn nodes_hold(&mut self, placement: &Placement, lens: &[u64]) -> u64 {
        self.note_missing(placement, lens);
        self.serve(placement, lens)
    }

    /// The first shard missing data and what its node holds, if any.
    pub fn missing(&self) -> Option<(u32, u64)> {
        self.missing
            .iter()
            .enumerate()
            .find_map(|(shard, m)| m.map(|holds| (shard as u32, holds)))
    }

    /// What shard `shard`'s node holds while it is missing data.
    pub fn missing_on(&self, shard: u32) -> Option<u64> {
        self.missing.get(shard as usize).copied().flatten()
    }

    /// The shards missing data.
    pub fn missing_shards(&self) -> Vec<u32> {
        self.missing
            .iter()
            .enumerate()
            .filter(|(_, holds)| holds.is_some())
            .map(|(shard, _)| shard as u32)
            .collect()
    }

    /// Shard `shard`'s node, marked missing data, holds `holds` records now: its mark is
    /// cleared if that is its share again (its directory was restored), else it records
    /// `holds`. Returns what it still misses by: `None` once cleared.
    pub fn holds_now(&mut self, placement: &Placement, shard: u32, holds: u64) -> Option<u64> {
        let share = self.share(placement, shard);
        let slot = self.missing.get_mut(shard as usize)?;
        slot.as_ref()?;
        *slot = (holds < share).then_some(holds);
        *slot
    }
}

/// A shard's length, from what its in-sync replicas hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardLens {
    /// The most records one of its in-sync replicas holds.
    pub len: u64,
    /// What each in-sync replica that answered holds.
    pub replicas: Vec<(NodeId, u64)>,
}

/// Every shard's length, and the in-sync replicas that failed where a partner answered.
#[derive(Debug)]
pub struct Answered<F> {
    pub shards: Vec<ShardLens>,
    /// A write that goes on without them marks them behind.
    pub behind: Vec<(NodeId, F)>,
}

/// Every shard's length from its in-sync replicas' answers: `in_sync[shard]` are the
/// replicas asked, `answers[node]` what each said (its length, or why it did not). A shard
/// none of whose in-sync replicas answered fails the whole with the first of their failures
/// (`none_in_sync(shard)` if it had none to ask), unless the map places nothing on it
/// (`places_nothing(shard)`: drained, or not added yet; its nodes may be gone). Returns the
/// lengths, and the in-sync replicas that failed where a partner answered: a write that goes
/// on without them marks them behind.
pub fn shard_lens<F>(
    in_sync: &[Vec<NodeId>],
    mut answers: Vec<Option<Result<u64, F>>>,
    places_nothing: impl Fn(u32) -> bool,
    none_in_sync: impl Fn(u32) -> F,
) -> Result<Answered<F>, F> {
    let mut shards = Vec::with_capacity(in_sync.len());
    let mut behind = Vec::new();
    for (shard, nodes) in in_sync.iter().enumerate() {
        let shard = shard as u32;
        let mut lens = ShardLens::default();
        let mut failed = Vec::new();
        for &node in nodes {
            match answers.get_mut(node).and_then(Option::take) {
                Some(Ok(len)) => {
                    lens.len = lens.len.max(len);
                    lens.replicas.push((node, len));
                }
                Some(Err(failure)) => failed.push((node, failure)),
                None => {}
            }
        }
        if lens.replicas.is_empty() && !places_nothing(shard) {
            return Err(failed
                .into_iter()
                .next()
                .map_or_else(|| none_in_sync(shard), |(_, failure)| failure));
        }
        if !lens.replicas.is_empty() {
            behind.extend(failed);
        }
        shards.push(lens);
    }
    Ok(Answered { shards, behind })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zr_proto::placement::ClusterMap;

    fn placement(shards: u32) -> Placement {
        Placement::new(ClusterMap::balanced(shards, 4, 3).unwrap()).unwrap()
    }

    #[test]
    fn a_commit_is_stored_unchanged_or_refused() {
        assert_eq!(Commit::decide(10, 10, false, false), Commit::Unchanged);
        // Rewritten in place: the same length counts as a change.
        assert_eq!(Commit::decide(10, 10, false, true), Commit::Store);
        assert_eq!(Commit::decide(10, 12, false, false), Commit::Store);
        // The nodes hold less than was committed: data is missing.
        assert_eq!(
            Commit::decide(10, 9, false, false),
            Commit::Refused { recorded: 10 }
        );
        assert_eq!(
            Commit::decide(10, 9, false, true),
            Commit::Refused { recorded: 10 }
        );
        // Only a delete lowers it.
        assert_eq!(Commit::decide(10, 9, true, false), Commit::Store);
    }

    #[test]
    fn a_failed_commit_keeps_the_rewritten_mark_for_the_next() {
        let mut lengths = Lengths::new(2);
        assert!(!lengths.take_rewritten());
        lengths.rewrote();
        let taken = lengths.take_rewritten();
        assert!(taken);
        assert!(!lengths.take_rewritten(), "taken once");
        lengths.commit_failed(taken);
        assert!(lengths.take_rewritten(), "given back by the failed commit");
        lengths.commit_failed(false);
        assert!(!lengths.take_rewritten());
    }

    #[test]
    fn a_shard_holding_less_than_its_share_is_missing_data_and_served_as_whole() {
        let placement = placement(3);
        let mut lengths = Lengths::new(3);
        assert!(lengths.set_committed(100));
        assert!(!lengths.set_committed(100), "unchanged");
        let shares: Vec<u64> = (0..3).map(|s| lengths.share(&placement, s)).collect();
        assert_eq!(shares.iter().sum::<u64>(), 100);
        // Every shard holds its share and more: nothing is missing, the length is what all
        // agree on.
        let more: Vec<u64> = shares.iter().map(|s| s + 4).collect();
        assert!(!lengths.note_missing(&placement, &more));
        assert_eq!(lengths.missing(), None);
        let agreed = placement.consistent_len(&more);
        assert_eq!(lengths.nodes_hold(&placement, &more), agreed);
        assert_eq!(lengths.len(), agreed);
        // Shard 1 wiped: it is missing data, and the length still counts its share.
        let wiped = [shares[0], 0, shares[2]];
        assert!(lengths.note_missing(&placement, &wiped));
        assert_eq!(lengths.missing(), Some((1, 0)));
        assert_eq!(lengths.missing_on(1), Some(0));
        assert_eq!(lengths.missing_on(0), None);
        assert_eq!(lengths.missing_shards(), vec![1]);
        assert_eq!(lengths.nodes_hold(&placement, &wiped), 100);
        // Restored in part: still missing, by what it holds now; then whole: cleared.
        assert_eq!(lengths.holds_now(&placement, 1, 3), Some(3));
        assert_eq!(lengths.missing(), Some((1, 3)));
        assert_eq!(lengths.holds_now(&placement, 1, shares[1]), None);
        assert_eq!(lengths.missing(), None);
        // A shard not marked stays unmarked whatever it holds now.
        assert_eq!(lengths.holds_now(&placement, 0, 0), None);
        assert_eq!(lengths.missing(), None);
        // A shard past those known (added by a move) is taken in.
        let placement = placement_padded(3, 4);
        assert!(!lengths.note_missing(&placement, &[shares[0], shares[1], shares[2], 0]));
        assert_eq!(lengths.missing_shards(), Vec::<u32>::new());
    }

    #[test]
    fn a_shard_is_as_long_as_its_longest_in_sync_replica_and_fails_with_none() {
        // Shard 0: nodes 0 and 1; shard 1: nodes 2 and 3; shard 2: node 4 (drained).
        let in_sync = vec![vec![0, 1], vec![2, 3], vec![4]];
        let none = |shard: u32| format!("shard {shard} has no replica in sync");
        let answers = || -> Vec<Option<Result<u64, String>>> {
            vec![
                Some(Ok(10)),
                Some(Ok(12)),
                Some(Err("node 2 down".into())),
                Some(Ok(7)),
                Some(Err("node 4 gone".into())),
            ]
        };
        let drained = |shard: u32| shard == 2;
        let Answered {
            shards: lens,
            behind,
        } = shard_lens(&in_sync, answers(), drained, none).unwrap();
        assert_eq!(lens[0].len, 12);
        assert_eq!(lens[0].replicas, vec![(0, 10), (1, 12)]);
        assert_eq!((lens[1].len, lens[1].replicas.clone()), (7, vec![(3, 7)]));
        assert_eq!(
            lens[2],
            ShardLens::default(),
            "a drained shard holds nothing"
        );
        // Node 2 failed where its partner answered: behind. Node 4's shard places nothing.
        assert_eq!(behind, vec![(2, "node 2 down".to_string())]);
        // A shard the map places records on, with none of its replicas answering: the
        // first failure, and nothing is marked.
        let placed = |_: u32| false;
        assert_eq!(
            shard_lens(&in_sync, answers(), placed, none).unwrap_err(),
            "node 4 gone"
        );
        // With no in-sync replica to ask: named.
        let in_sync = vec![vec![0, 1], vec![]];
        assert_eq!(
            shard_lens(&in_sync, answers(), placed, none).unwrap_err(),
            "shard 1 has no replica in sync"
        );
    }

    fn placement_padded(shards: u32, to: u32) -> Placement {
        placement(shards).padded(to)
    }
}
