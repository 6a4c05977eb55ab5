//! Placement: which shard holds a global index, and at which node-local index — a pure
//! function of the index and a small, versioned cluster map. No per-record state anywhere.
//!
//! ```text
//! global g ──► extent e = g / E, offset o = g % E        (E consecutive records per extent)
//!          ──► round  r = e / SLOTS, slot j = e % SLOTS  (extents go round the slots)
//!          ──► shard  s = owner[j]                       (the cluster map: slot → shard)
//!          ──► local  (r · slots_of(s) + rank_s(j)) · E + o
//! ```
//! `rank_s(j)` is j's position among the slots s owns, in slot order. Global indices fill in
//! order, so each shard's local indices fill in order too: a node's store has no holes, and
//! its length for a cluster of N records is [`Placement::shard_len`]. The owner table deals
//! slots out evenly in a seeded hashed order, so every full round is balanced to one slot and
//! any prefix of the index space to within one round (E · SLOTS records).
//!
//! Adding a shard (a later operation) reassigns ⌊SLOTS/(S+1)⌋ slots, taken evenly from the
//! others, to the newcomer: only the extents of those slots — about 1/(S+1) of the records —
//! move between machines. The procedure: publish map v+1 with the new owners in *pending*
//! state; copy the moving slots' extents to the new shard; renumber the local indices of the
//! shards that gave slots (their ranks change; a local rewrite, like a rebalance); then swap
//! the router's snapshot to v+1 and drop the moved extents from their old shards.

use serde::{Deserialize, Serialize};

use crate::error::Error;
use zr_common::hash::mix2;

/// Slots in a cluster map: the granularity of balance and of future moves.
pub const SLOTS: u32 = 1024;
/// Default records per extent.
pub const EXTENT_RECORDS_DEFAULT: u64 = 64;
/// Most shards a cluster may have (each needs at least one slot).
pub const SHARDS_MAX: u32 = SLOTS;

/// The versioned, immutable cluster map: slot → shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Incremented by every change of owners.
    pub version: u64,
    /// Number of shards.
    pub shards: u32,
    /// Consecutive records per extent.
    pub extent_records: u64,
    /// Owner shard of each slot.
    pub owners: Vec<u32>,
}

impl ClusterMap {
    /// The initial map for `shards` shards: slots dealt out evenly in a seeded hashed order.
    pub fn balanced(shards: u32, extent_records: u64, seed: u64) -> Result<ClusterMap, Error> {
        if shards == 0 || shards > SHARDS_MAX {
            return Err(Error::Placement(format!(
                "a cluster needs 1..={SHARDS_MAX} shards, not {shards}"
            )));
        }
        let mut order: Vec<u32> = (0..SLOTS).collect();
        order.sort_by_key(|&slot| mix2(seed, slot as u64));
        let mut owners = vec![0u32; SLOTS as usize];
        for (i, slot) in order.into_iter().enumerate() {
            owners[slot as usize] = i as u32 % shards;
        }
        Ok(ClusterMap {
            version: 1,
            shards,
            extent_records,
            owners,
        })
    }
}

/// A cluster map with the tables that make every lookup O(1).
#[derive(Clone, Debug)]
pub struct Placement {
    map: ClusterMap,
    /// Rank of each slot among its owner's slots.
    rank: Vec<u32>,
    /// Each shard's slots, in slot order.
    slots_of: Vec<Vec<u32>>,
}

impl Placement {
    /// Checks `map` and builds the lookup tables.
    pub fn new(map: ClusterMap) -> Result<Placement, Error> {
        let bad = |why: String| Err(Error::Placement(why));
        if map.extent_records == 0 {
            return bad("extent_records must be at least 1".into());
        }
        if map.owners.len() != SLOTS as usize {
            return bad(format!(
                "the map has {} slots, not {SLOTS}",
                map.owners.len()
            ));
        }
        let mut slots_of = vec![Vec::new(); map.shards as usize];
        let mut rank = vec![0u32; SLOTS as usize];
        for (slot, &owner) in map.owners.iter().enumerate() {
            let Some(list) = slots_of.get_mut(owner as usize) else {
                return bad(format!(
                    "slot {slot} belongs to shard {owner}, but there are {} shards",
                    map.shards
                ));
            };
            rank[slot] = list.len() as u32;
            list.push(slot as u32);
        }
        if let Some(empty) = slots_of.iter().position(Vec::is_empty) {
            return bad(format!("shard {empty} owns no slot"));
        }
        Ok(Placement {
            map,
            rank,
            slots_of,
        })
    }

    /// The map.
    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    /// Number of shards.
    pub fn shards(&self) -> u32 {
        self.map.shards
    }

    /// (shard, node-local index) of global index `g`.
    #[inline]
    pub fn locate(&self, g: u64) -> (u32, u64) {
        let e_len = self.map.extent_records;
        let (extent, offset) = (g / e_len, g % e_len);
        let (round, slot) = (extent / SLOTS as u64, (extent % SLOTS as u64) as usize);
        let shard = self.map.owners[slot];
        let owned = self.slots_of[shard as usize].len() as u64;
        let local_extent = round * owned + self.rank[slot] as u64;
        (shard, local_extent * e_len + offset)
    }

    /// The global index at `local` of `shard` (the inverse of [`Placement::locate`]).
    pub fn global(&self, shard: u32, local: u64) -> u64 {
        let e_len = self.map.extent_records;
        let slots = &self.slots_of[shard as usize];
        let (local_extent, offset) = (local / e_len, local % e_len);
        let (round, rank) = (
            local_extent / slots.len() as u64,
            (local_extent % slots.len() as u64) as usize,
        );
        (round * SLOTS as u64 + slots[rank] as u64) * e_len + offset
    }

    /// How many of the global indices `[0, n)` shard `shard` holds.
    pub fn shard_len(&self, shard: u32, n: u64) -> u64 {
        let e_len = self.map.extent_records;
        let round_len = e_len * SLOTS as u64;
        let owned = self.slots_of[shard as usize].len() as u64;
        let (rounds, rest) = (n / round_len, n % round_len);
        let mut len = rounds * owned * e_len;
        let (full, partial) = (rest / e_len, rest % e_len);
        for &slot in &self.slots_of[shard as usize] {
            let slot = slot as u64;
            if slot < full {
                len += e_len;
            } else if slot == full {
                len += partial;
            }
        }
        len
    }

    /// The largest cluster length consistent with shards holding `lens` records: every shard
    /// holds at least its share of it. Equals `lens.sum()` when the shards agree.
    pub fn consistent_len(&self, lens: &[u64]) -> u64 {
        let fits = |n: u64| (0..self.shards()).all(|s| self.shard_len(s, n) <= lens[s as usize]);
        let (mut low, mut high) = (0u64, lens.iter().sum::<u64>());
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            if fits(mid) {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(shards: u32, extent: u64) -> Placement {
        Placement::new(ClusterMap::balanced(shards, extent, 7).unwrap()).unwrap()
    }

    #[test]
    fn locate_and_global_are_inverse_and_dense() {
        for (shards, extent) in [(1, 1), (3, 4), (4, 64), (7, 5)] {
            let p = placement(shards, extent);
            let n = 3 * SLOTS as u64 * extent + 1234;
            let mut next_local = vec![0u64; shards as usize];
            for g in 0..n {
                let (s, local) = p.locate(g);
                assert_eq!(
                    local, next_local[s as usize],
                    "shard {s} local indices are not dense"
                );
                next_local[s as usize] += 1;
                assert_eq!(p.global(s, local), g);
            }
            for s in 0..shards {
                assert_eq!(p.shard_len(s, n), next_local[s as usize]);
            }
            assert_eq!(p.consistent_len(&next_local), n);
        }
    }

    #[test]
    fn records_spread_evenly() {
        let p = placement(4, EXTENT_RECORDS_DEFAULT);
        let n = 1_000_000;
        let lens: Vec<u64> = (0..4).map(|s| p.shard_len(s, n)).collect();
        let mean = n as f64 / 4.0;
        for len in &lens {
            assert!(
                (*len as f64) < mean * 1.05,
                "shard holds {len}, mean {mean}"
            );
        }
        assert_eq!(lens.iter().sum::<u64>(), n);
    }

    #[test]
    fn consistent_len_drops_a_half_finished_append() {
        let p = placement(3, 4);
        let n = 5000;
        let mut lens: Vec<u64> = (0..3).map(|s| p.shard_len(s, n)).collect();
        // An append of 100 more records that reached only the shard of index n.
        let (s, _) = p.locate(n);
        lens[s as usize] += 3;
        assert_eq!(p.consistent_len(&lens), n + count_prefix_on(&p, n, s, 3));
    }

    /// How many of the records from `n` on can be taken before needing a shard other than `s`,
    /// up to `extra` records on `s`.
    fn count_prefix_on(p: &Placement, n: u64, s: u32, extra: u64) -> u64 {
        let mut taken = 0;
        let mut on_s = 0;
        while on_s < extra && p.locate(n + taken).0 == s {
            taken += 1;
            on_s += 1;
        }
        taken
    }

    #[test]
    fn bad_maps_are_refused() {
        assert!(ClusterMap::balanced(0, 64, 0).is_err());
        let mut map = ClusterMap::balanced(2, 64, 0).unwrap();
        map.owners[3] = 9;
        assert!(Placement::new(map).is_err());
        let mut map = ClusterMap::balanced(2, 64, 0).unwrap();
        map.owners.iter_mut().for_each(|o| *o = 0);
        assert!(Placement::new(map)
            .unwrap_err()
            .to_string()
            .contains("shard 1 owns no slot"));
    }
}
