//! Placement: which shard holds a global index, and where on its nodes — a pure function of
//! the index and a small, versioned cluster map. No per-record state anywhere.
//!
//! ```text
//! global g ──► extent e = g / E, offset o = g % E        (E consecutive records per extent)
//!          ──► round  r = e / SLOTS, slot j = e % SLOTS  (extents go round the slots)
//!          ──► shard  s = owner[j]                       (the cluster map: slot → shard)
//!          ──► node address (j, r · E + o)               (the slot, the index inside it)
//!          ──► local  (r · slots_of(s) + rank_s(j)) · E + o
//! ```
//! A node keeps each slot it holds as a unit of storage of its own (`zr_node::unit`), so a
//! record's node address — its slot and its index among the slot's records — is the same on
//! whichever shard holds the slot, under every map: a move copies a slot as it is, and the
//! slots a shard keeps are not touched. The local index, `rank_s(j)` being j's position among
//! the slots s owns, numbers a shard's records densely: global indices fill in order, so each
//! shard's local indices do too, and its length for a cluster of N records is
//! [`Placement::shard_len`] — the router's measure of lengths, converted to slots
//! ([`Placement::runs`], [`Placement::slot_lens`]) when it asks a node. The owner table deals
//! slots out evenly in a seeded hashed order, so every full round is balanced to one slot and
//! any prefix of the index space to within one round (E · SLOTS records).
//!
//! Growth: [`ClusterMap::with_added_shard`] gives the next map version, in which the new
//! shard takes ⌊SLOTS/(S+1)⌋ slots from the shards owning the most, and
//! [`ClusterMap::with_drained_shard`] the one in which a shard's slots go to the others (it
//! keeps its id, owning none). Only the extents of slots that change owner change shard, about
//! 1/(S+1) of the records for an add, and only they are copied: see `zr_shard::stage` and the
//! router's `moves`.

use serde::{Deserialize, Serialize};

use crate::error::Error;
use zr_common::hash::mix2;

/// Slots in a cluster map: the granularity of balance and of moves.
pub const SLOTS: u32 = 1024;
/// Bits of a node address that hold the index inside its slot: a node keeps each slot it
/// holds as its own unit of storage (`zr_node::unit`, whose addresses these are), and a
/// record's address is its slot in the top bits and its index inside the slot below.
pub const UNIT_SHIFT: u32 = 48;

/// The node address of record `index` of slot `slot`.
#[inline]
pub fn unit_address(slot: u32, index: u64) -> u64 {
    (u64::from(slot) << UNIT_SHIFT) | index
}

/// The slot and the index inside it of node address `address`.
#[inline]
pub fn split_address(address: u64) -> (u32, u64) {
    (
        (address >> UNIT_SHIFT) as u32,
        address & ((1 << UNIT_SHIFT) - 1),
    )
}

/// Consecutive records of one slot on a node: `count` of them from index `at` inside slot
/// `slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub slot: u32,
    pub at: u64,
    pub count: u64,
}
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

    /// Slots each shard owns.
    pub fn slot_counts(&self) -> Vec<u32> {
        let mut counts = vec![0u32; self.shards as usize];
        for &owner in &self.owners {
            if let Some(count) = counts.get_mut(owner as usize) {
                *count += 1;
            }
        }
        counts
    }

    /// The next map version with one shard more (its id: the old shard count), which takes
    /// ⌊SLOTS/(S+1)⌋ slots, one at a time from whichever shard owns the most (the lowest id
    /// among equals). Only those slots change owner, so only their records move: about
    /// 1/(S+1) of them, and every shard ends within one slot of an even share.
    pub fn with_added_shard(&self) -> Result<ClusterMap, Error> {
        let new = self.shards;
        if new >= SHARDS_MAX {
            return Err(Error::Placement(format!(
                "a cluster has at most {SHARDS_MAX} shards"
            )));
        }
        let active = self.slot_counts().iter().filter(|&&c| c > 0).count() as u32;
        let mut next = self.clone();
        next.version += 1;
        next.shards += 1;
        let mut counts = next.slot_counts();
        for _ in 0..SLOTS / (active + 1) {
            let donor = (0..new)
                .max_by_key(|&s| (counts[s as usize], std::cmp::Reverse(s)))
                .unwrap_or(0);
            // The donor's slot that goes: chosen by hash, so that the slots a shard gives
            // are spread over the index space as its others are.
            let slot = (0..SLOTS as usize)
                .filter(|&j| next.owners[j] == donor)
                .max_by_key(|&j| mix2(next.version, j as u64))
                .ok_or_else(|| Error::Placement(format!("shard {donor} owns no slot")))?;
            next.owners[slot] = new;
            counts[donor as usize] -= 1;
            counts[new as usize] += 1;
        }
        Ok(next)
    }

    /// The next map version with shard `shard` drained: each of its slots goes to whichever
    /// other shard owns the fewest (the lowest id among equals; shards drained before take
    /// none). Only its records move. The shard keeps its id, owning nothing: its nodes may go.
    pub fn with_drained_shard(&self, shard: u32) -> Result<ClusterMap, Error> {
        let mut counts = self.slot_counts();
        match counts.get(shard as usize) {
            None => {
                return Err(Error::Placement(format!(
                    "there is no shard {shard}: the map has {} (0..{})",
                    self.shards, self.shards
                )))
            }
            Some(0) => {
                return Err(Error::Placement(format!(
                    "shard {shard} owns no slot: it is drained already"
                )))
            }
            Some(_) => {}
        }
        let takers: Vec<u32> = (0..self.shards)
            .filter(|&s| s != shard && counts[s as usize] > 0)
            .collect();
        if takers.is_empty() {
            return Err(Error::Placement(format!(
                "shard {shard} is the last one holding records: it cannot be drained"
            )));
        }
        let mut next = self.clone();
        next.version += 1;
        for slot in 0..SLOTS as usize {
            if next.owners[slot] != shard {
                continue;
            }
            let taker = takers
                .iter()
                .copied()
                .min_by_key(|&s| (counts[s as usize], s))
                .unwrap_or(0);
            next.owners[slot] = taker;
            counts[taker as usize] += 1;
            counts[shard as usize] -= 1;
        }
        Ok(next)
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
    /// The version of the map this placement is of.
    pub fn version(&self) -> u64 {
        self.map.version
    }

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
        // A shard owning no slot is drained (it holds nothing); one must hold the records.
        if slots_of.iter().all(Vec::is_empty) {
            return bad("no shard owns a slot".into());
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

    /// The slots shard `shard` owns, in slot order (none for a drained shard or one beyond
    /// the map).
    pub fn slots(&self, shard: u32) -> &[u32] {
        self.slots_of.get(shard as usize).map_or(&[], Vec::as_slice)
    }

    /// The same placement with `shards` shards, the ones beyond the map owning nothing
    /// (shards a router knows of before the map gives them slots).
    pub fn padded(mut self, shards: u32) -> Placement {
        if shards > self.map.shards {
            self.map.shards = shards;
            self.slots_of.resize(shards as usize, Vec::new());
        }
        self
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

    /// (shard, node address) of global index `g`: the slot it is in, and its index inside
    /// the slot (`round · E + offset`), which no map changes.
    #[inline]
    pub fn locate_address(&self, g: u64) -> (u32, u64) {
        let e_len = self.map.extent_records;
        let (extent, offset) = (g / e_len, g % e_len);
        let (round, slot) = (extent / SLOTS as u64, (extent % SLOTS as u64) as u32);
        let shard = self.map.owners[slot as usize];
        (shard, unit_address(slot, round * e_len + offset))
    }

    /// The node address of `local` of `shard` (its shard-local index: its rank among the
    /// shard's records). `shard` must own a slot.
    #[inline]
    pub fn address_of(&self, shard: u32, local: u64) -> u64 {
        let e_len = self.map.extent_records;
        let slots = &self.slots_of[shard as usize];
        let (local_extent, offset) = (local / e_len, local % e_len);
        let owned = slots.len() as u64;
        let (round, rank) = (local_extent / owned, (local_extent % owned) as usize);
        unit_address(slots[rank], round * e_len + offset)
    }

    /// The local index of node address `address` on `shard` (the inverse of
    /// [`Placement::address_of`]); `None` if the shard does not own its slot.
    pub fn local_of(&self, shard: u32, address: u64) -> Option<u64> {
        let e_len = self.map.extent_records;
        let (slot, index) = split_address(address);
        if *self.map.owners.get(slot as usize)? != shard {
            return None;
        }
        let owned = self.slots_of[shard as usize].len() as u64;
        let (round, offset) = (index / e_len, index % e_len);
        Some((round * owned + self.rank[slot as usize] as u64) * e_len + offset)
    }

    /// Shard `shard`'s local indices `start..start + count` as runs inside its slots, in
    /// order. `shard` must own a slot if `count > 0`.
    pub fn runs(&self, shard: u32, start: u64, count: u64) -> Vec<Run> {
        let e_len = self.map.extent_records;
        let mut runs = Vec::new();
        let (mut at, end) = (start, start + count);
        while at < end {
            let take = (e_len - at % e_len).min(end - at);
            let (slot, index) = split_address(self.address_of(shard, at));
            runs.push(Run {
                slot,
                at: index,
                count: take,
            });
            at += take;
        }
        runs
    }

    /// The length of each of shard `shard`'s slots when it holds `len` records (its first
    /// `len` local indices), in slot order.
    pub fn slot_lens(&self, shard: u32, len: u64) -> Vec<(u32, u64)> {
        let e_len = self.map.extent_records;
        let slots = self.slots(shard);
        let round_len = e_len * slots.len() as u64;
        if round_len == 0 {
            return Vec::new();
        }
        let (rounds, rest) = (len / round_len, len % round_len);
        slots
            .iter()
            .enumerate()
            .map(|(rank, &slot)| {
                let part = rest.saturating_sub(rank as u64 * e_len).min(e_len);
                (slot, rounds * e_len + part)
            })
            .collect()
    }

    /// How many of the global indices `[0, n)` are in slot `slot`.
    pub fn slot_len(&self, slot: u32, n: u64) -> u64 {
        let e_len = self.map.extent_records;
        let round_len = e_len * SLOTS as u64;
        let (rounds, rest) = (n / round_len, n % round_len);
        rounds * e_len + rest.saturating_sub(slot as u64 * e_len).min(e_len)
    }

    /// The global index at `local` of `shard` (the inverse of [`Placement::locate`]).
    /// `shard` must own a slot (a drained shard has no local indices).
    pub fn global(&self, shard: u32, local: u64) -> u64 {
        let e_len = self.map.extent_records;
        let slots = &self.slots_of[shard as usize];
        assert!(
            !slots.is_empty(),
            "shard {shard} is drained: it has no records"
        );
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
        let slots = self.slots(shard);
        let owned = slots.len() as u64;
        let (rounds, rest) = (n / round_len, n % round_len);
        let mut len = rounds * owned * e_len;
        let (full, partial) = (rest / e_len, rest % e_len);
        for &slot in slots {
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
        let fits = |n: u64| {
            (0..self.shards())
                .all(|s| self.shard_len(s, n) <= lens.get(s as usize).copied().unwrap_or(0))
        };
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

    /// A record's node address is its slot and its index among that slot's records, the
    /// same whichever shard holds it; runs, slot lengths and the local index agree with it.
    #[test]
    fn addresses_are_slot_and_index_in_slot() {
        for (shards, extent) in [(1, 1), (3, 4), (4, 64)] {
            let p = placement(shards, extent);
            let n = 2 * SLOTS as u64 * extent + 777;
            let mut in_slot = vec![0u64; SLOTS as usize];
            let mut addresses: Vec<Vec<u64>> = vec![Vec::new(); shards as usize];
            for g in 0..n {
                let (s, local) = p.locate(g);
                let (s2, address) = p.locate_address(g);
                assert_eq!(s, s2);
                assert_eq!(p.address_of(s, local), address);
                assert_eq!(p.local_of(s, address), Some(local));
                assert_eq!(p.local_of((s + 1) % shards, address).is_none(), shards > 1);
                let slot = ((g / extent) % SLOTS as u64) as u32;
                assert_eq!(split_address(address), (slot, in_slot[slot as usize]));
                in_slot[slot as usize] += 1;
                addresses[s as usize].push(address);
            }
            for s in 0..shards {
                let len = p.shard_len(s, n);
                let runs = p.runs(s, 3, len - 3);
                let from_runs: Vec<u64> = runs
                    .iter()
                    .flat_map(|r| (r.at..r.at + r.count).map(|i| unit_address(r.slot, i)))
                    .collect();
                assert_eq!(from_runs, addresses[s as usize][3..]);
                for (slot, slot_len) in p.slot_lens(s, len) {
                    assert_eq!(slot_len, in_slot[slot as usize], "shard {s} slot {slot}");
                    assert_eq!(p.slot_len(slot, n), slot_len);
                }
            }
        }
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
        map.owners.iter_mut().for_each(|o| *o = 9);
        assert!(Placement::new(map).is_err());
        let mut map = ClusterMap::balanced(2, 64, 0).unwrap();
        map.shards = 0;
        assert!(Placement::new(map)
            .unwrap_err()
            .to_string()
            .contains("there are 0 shards"));
    }

    /// Records of `[0, n)` whose shard differs between `a` and `b`.
    fn moved(a: &Placement, b: &Placement, n: u64) -> u64 {
        (0..n).filter(|&g| a.locate(g).0 != b.locate(g).0).count() as u64
    }

    /// Every shard holding records is within 5% of an even share of `n`; drained ones hold
    /// none, and the placement stays dense and invertible.
    fn check_balanced(p: &Placement, n: u64) {
        let active: Vec<u32> = (0..p.shards())
            .filter(|&s| p.map().slot_counts()[s as usize] > 0)
            .collect();
        let share = n as f64 / active.len() as f64;
        for s in 0..p.shards() {
            let len = p.shard_len(s, n);
            if active.contains(&s) {
                assert!(
                    (len as f64 - share).abs() <= 0.05 * share,
                    "shard {s} holds {len}, an even share is {share}"
                );
            } else {
                assert_eq!(len, 0, "drained shard {s} holds records");
            }
        }
        for g in (0..n).step_by(7) {
            let (s, local) = p.locate(g);
            assert_eq!(p.global(s, local), g);
        }
    }

    #[test]
    fn adding_a_shard_moves_a_share_and_balances() {
        let n = 1_000_000;
        let mut p = placement(2, EXTENT_RECORDS_DEFAULT);
        for shards in 3..=5 {
            let next = Placement::new(p.map().with_added_shard().unwrap()).unwrap();
            assert_eq!(next.shards(), shards);
            assert_eq!(next.map().version, p.map().version + 1);
            let moved = moved(&p, &next, n);
            // Only to the new shard, and about 1/S of the records.
            for g in (0..n).step_by(13) {
                let (before, after) = (p.locate(g).0, next.locate(g).0);
                assert!(before == after || after == shards - 1);
            }
            let share = n / shards as u64;
            assert!(
                moved <= share + share / 10 && moved >= share - share / 10,
                "{} -> {shards} shards moved {moved} records, a share is {share}",
                shards - 1
            );
            check_balanced(&next, n);
            p = next;
        }
        // The same map always gives the same next one.
        assert_eq!(
            p.map().with_added_shard().unwrap(),
            p.map().with_added_shard().unwrap()
        );
    }

    #[test]
    fn draining_a_shard_moves_only_its_records() {
        let n = 1_000_000;
        let p = placement(4, EXTENT_RECORDS_DEFAULT);
        let drained = Placement::new(p.map().with_drained_shard(1).unwrap()).unwrap();
        assert_eq!(drained.shards(), 4);
        for g in (0..n).step_by(13) {
            let (before, after) = (p.locate(g).0, drained.locate(g).0);
            assert!(
                before == after || before == 1,
                "record {g} moved off shard {before}"
            );
            assert_ne!(after, 1);
        }
        assert_eq!(moved(&p, &drained, n), p.shard_len(1, n));
        check_balanced(&drained, n);
        // Drained twice, or to nothing, is refused; a shard added after takes its share.
        let again = drained.map().with_drained_shard(1).unwrap_err().to_string();
        assert!(again.contains("drained already"), "{again}");
        assert!(drained.map().with_drained_shard(9).is_err());
        let mut last = ClusterMap::balanced(1, 64, 0).unwrap();
        assert!(last
            .with_drained_shard(0)
            .unwrap_err()
            .to_string()
            .contains("last one"));
        last = drained.map().with_added_shard().unwrap();
        let grown = Placement::new(last).unwrap();
        assert_eq!(grown.shards(), 5);
        check_balanced(&grown, n);
    }
}
