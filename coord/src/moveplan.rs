//! What a move command (`zr cluster add-shard` / `drain-shard`) does next, from the cluster
//! record alone: a pure function, so that every state a stopped move can leave — recorded,
//! copied, published, partly switched — has one answer, tested here without I/O. The
//! router's `moves` module is the shell that carries each step out.
//!
//! ```text
//! no move, change not made ──► Record ──► (copy) ──► publish ──► Switch ──► no move
//!                                  ▲ stopped: Copy     ▲ stopped: Switch
//! ```
//! The copy is redone from where each node's slots end, and a switch from the nodes that
//! have not switched, so running the same command again after a stop anywhere finishes the
//! move, and running it once more says it is done. Each copy pass is planned here too
//! ([`copy_pass`]): from what a shard's nodes hold of each slot they gain, which slots go as
//! files and which records go one by one.

use std::collections::BTreeMap;

use crate::cluster::{AddedShard, ClusterRecord, MapChange, MapMove, MapRecord};
use zr_proto::placement::{Placement, Run};

/// What a shard gaining slots in a copy pass has to do, by the shard holding each slot:
/// the slots to copy as files, and the records to copy (or cut) one by one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotCopy {
    /// Slots none of whose records its nodes hold yet: copied as files, by holder.
    pub files: BTreeMap<u32, Vec<u32>>,
    /// Per holder, each slot's records from where its nodes got to up to its target (a
    /// run of none: they hold more than the target, cut back to it).
    pub records: BTreeMap<u32, Vec<Run>>,
}

/// The copy pass for a shard whose nodes hold `have` of each slot they gain (the least
/// over its nodes), each slot `slot` to reach `target(slot)` records, held now by shard
/// `holder(slot)`. With `files`, slots none of whose records are there yet go as files
/// (after which the pass is planned again, from what the files brought); without, every
/// record goes one by one.
pub fn copy_pass(
    have: &BTreeMap<u32, u64>,
    target: impl Fn(u32) -> u64,
    holder: impl Fn(u32) -> u32,
    files: bool,
) -> SlotCopy {
    let mut pass = SlotCopy::default();
    for (&slot, &least) in have {
        let target = target(slot);
        if least == target {
            continue;
        }
        if files && least == 0 {
            pass.files.entry(holder(slot)).or_default().push(slot);
            continue;
        }
        let at = least.min(target);
        pass.records.entry(holder(slot)).or_default().push(Run {
            slot,
            at,
            count: target - at,
        });
    }
    pass
}

/// The next step of a move asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// The move's map is published: switch the nodes that have not, then clear the move.
    Switch,
    /// This move is recorded and not published: copy (on from where each dataset ends),
    /// then publish `to`.
    Copy { from: MapRecord, to: MapRecord },
    /// No move under way, and this change is the map's last already: nothing to do.
    Done,
    /// No move under way: record the move to `to`, then copy.
    Record { to: MapRecord },
    /// Another move is under way: refused, naming it (finishing it is running its own
    /// command again).
    Busy(MapMove),
}

/// The next step of the move that makes `change` to the cluster `record` describes.
/// `listed_shards`: the shards the operator's nodes.toml lists — an add asked for again
/// after it ended lists no shard beyond the map.
pub fn next(record: &ClusterRecord, change: MapChange, listed_shards: u32) -> Next {
    match &record.moving {
        Some(moving) if moving.switched_at.is_some() => Next::Switch,
        Some(moving)
            if moving.to.version == record.map.version + 1
                && moving.to.changes.last() == Some(&change) =>
        {
            Next::Copy {
                from: record.map.clone(),
                to: moving.to.clone(),
            }
        }
        Some(moving) => Next::Busy(moving.clone()),
        None if done_already(&record.map, change, listed_shards) => Next::Done,
        None => Next::Record {
            to: record.map.with(change),
        },
    }
}

/// True if `map`'s last change is `change` and asking for it again asks for nothing new:
/// for an add, every shard listed is in the map already; a drained shard is drained.
fn done_already(map: &MapRecord, change: MapChange, listed_shards: u32) -> bool {
    if map.changes.last() != Some(&change) {
        return false;
    }
    match change {
        MapChange::AddShard => listed_shards <= map.total_shards(),
        MapChange::DrainShard(_) => true,
    }
}

/// The shards whose slots differ between `from` and `to`: they build a dataset to switch to.
pub fn changed_shards(from: &Placement, to: &Placement) -> Vec<u32> {
    (0..to.shards().max(from.shards()))
        .filter(|&s| from.slots(s) != to.slots(s))
        .collect()
}

/// `runs` cut into batches of at most `most` records each (a run split where it must; runs
/// of no records kept, in the batch they fall in).
pub fn batches_of(runs: &[Run], most: u64) -> Vec<Vec<Run>> {
    let mut batches: Vec<Vec<Run>> = vec![Vec::new()];
    let mut room = most;
    for &run in runs {
        let mut run = run;
        loop {
            if room == 0 {
                batches.push(Vec::new());
                room = most;
            }
            let take = run.count.min(room);
            if let Some(batch) = batches.last_mut() {
                batch.push(Run { count: take, ..run });
            }
            room -= take;
            run.at += take;
            run.count -= take;
            if run.count == 0 {
                break;
            }
        }
    }
    batches.retain(|b| !b.is_empty());
    batches
}

/// The slots shard `shard` owns with `new` and did not with `old`, in slot order.
pub fn gained_slots(old: &Placement, new: &Placement, shard: u32) -> Vec<u32> {
    new.slots(shard)
        .iter()
        .copied()
        .filter(|&slot| old.map().owners[slot as usize] != shard)
        .collect()
}

/// The records a move from `old` to `new` writes into the slots the shards of `staged` gain,
/// for datasets of `lens` records each.
pub fn records_to_stage(old: &Placement, new: &Placement, staged: &[u32], lens: &[u64]) -> u64 {
    lens.iter()
        .flat_map(|&len| {
            staged.iter().flat_map(move |&shard| {
                gained_slots(old, new, shard)
                    .into_iter()
                    .map(move |slot| new.slot_len(slot, len))
            })
        })
        .sum()
}

/// `record` with the move to `to` recorded, and `added` (the nodes of the shard an add
/// makes) among its added shards in place of any earlier entry for that shard: the copy
/// starts from this.
pub fn recording(
    record: &ClusterRecord,
    to: MapRecord,
    added: Option<AddedShard>,
) -> ClusterRecord {
    let mut next = record.clone();
    if let Some(added) = added {
        next.added.retain(|a| a.shard != added.shard);
        next.added.push(added);
    }
    next.moving = Some(MapMove {
        to,
        switched_at: None,
        switched_lens: BTreeMap::new(),
    });
    next
}

/// `record` with its move's map `to` published, the cluster's from now on: the default
/// dataset switches at `len` records, each named one at its length in `lens`.
pub fn publishing(
    record: &ClusterRecord,
    to: MapRecord,
    len: u64,
    lens: BTreeMap<String, u64>,
) -> ClusterRecord {
    ClusterRecord {
        map: to.clone(),
        moving: Some(MapMove {
            to,
            switched_at: Some(len),
            switched_lens: lens,
        }),
        ..record.clone()
    }
}

/// `record` with its move done.
pub fn cleared(record: &ClusterRecord) -> ClusterRecord {
    ClusterRecord {
        moving: None,
        ..record.clone()
    }
}

/// A published move, as its nodes switch to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    /// The map switched from (the one before `to`).
    pub from: MapRecord,
    /// The map switched to, published.
    pub to: MapRecord,
    /// The default dataset's length at the switch.
    len: u64,
    /// Each named dataset's.
    lens: BTreeMap<String, u64>,
}

impl Switch {
    /// The switch `record` has published; the error says why there is none to finish.
    pub fn of(record: &ClusterRecord) -> Result<Switch, String> {
        let Some(MapMove {
            to,
            switched_at: Some(len),
            switched_lens,
        }) = &record.moving
        else {
            return Err("no published move to finish".into());
        };
        let from = to.before().ok_or_else(|| {
            format!(
                "map version {} is published as a move, but records no change",
                to.version
            )
        })?;
        Ok(Switch {
            from,
            to: to.clone(),
            len: *len,
            lens: switched_lens.clone(),
        })
    }

    /// The length dataset `dataset` (`None`: the default one) switches at; the error names
    /// a dataset the move was published without.
    pub fn len_of(&self, dataset: Option<&str>) -> Result<u64, String> {
        match dataset {
            None => Ok(self.len),
            Some(name) => self.lens.get(name).copied().ok_or_else(|| {
                format!(
                    "map version {} was published without the length of dataset '{name}'",
                    self.to.version
                )
            }),
        }
    }
}

/// What shard `shard` serves after a switch to `new` (the placement of the published map;
/// `staged`: the shards that built slots for it), each slot with its share of a dataset of
/// `len` records; `None` if it holds nothing before and after (drained, or not added yet)
/// and takes the map with its next request instead.
pub fn switch_slots(
    new: &Placement,
    staged: &[u32],
    shard: u32,
    len: u64,
) -> Option<Vec<(u32, u64)>> {
    let slots = new.slots(shard);
    if slots.is_empty() && !staged.contains(&shard) {
        return None;
    }
    Some(
        slots
            .iter()
            .map(|&slot| (slot, new.slot_len(slot, len)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cluster(shards: u32) -> ClusterRecord {
        ClusterRecord {
            id: "c".into(),
            map: MapRecord {
                version: 1,
                shards,
                extent_records: 4,
                seed: 7,
                replicas: 1,
                changes: Vec::new(),
            },
            committed_len: 0,
            moving: None,
            added: Vec::new(),
            dataset_ids: 0,
            datasets: Vec::new(),
            commits: 0,
        }
    }

    /// Where a run of the command stops, as if its router died there.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Stop {
        Recorded,
        Copied,
        Published,
        Never,
    }

    /// Runs the command for `change` on `record` as the shell does, stopping at `stop`;
    /// returns the step it began with.
    fn run(record: &mut ClusterRecord, change: MapChange, listed: u32, stop: Stop) -> Next {
        let first = next(record, change, listed);
        let mut step = first.clone();
        loop {
            match step {
                Next::Done | Next::Busy(_) => return first,
                Next::Record { to } => {
                    *record = recording(record, to, None);
                    if stop == Stop::Recorded {
                        return first;
                    }
                }
                Next::Copy { to, .. } => {
                    if stop == Stop::Copied {
                        return first;
                    }
                    *record = publishing(record, to, 0, BTreeMap::new());
                    if stop == Stop::Published {
                        return first;
                    }
                }
                Next::Switch => {
                    let switch = Switch::of(record).expect("published");
                    assert_eq!(switch.to, record.map);
                    assert_eq!(Some(&switch.from), record.map.before().as_ref());
                    *record = cleared(record);
                    return first;
                }
            }
            step = next(record, change, listed);
        }
    }

    #[test]
    fn each_state_of_a_move_has_its_next_step() {
        let mut record = cluster(2);
        let add = MapChange::AddShard;
        let to = record.map.with(add);
        assert_eq!(next(&record, add, 3), Next::Record { to: to.clone() });
        run(&mut record, add, 3, Stop::Recorded);
        assert_eq!(
            next(&record, add, 3),
            Next::Copy {
                from: cluster(2).map,
                to: to.clone()
            }
        );
        // Another move while this one is under way: refused, naming it.
        assert!(matches!(next(&record, MapChange::DrainShard(0), 3), Next::Busy(m) if m.to == to));
        run(&mut record, add, 3, Stop::Published);
        assert_eq!(record.map, to);
        assert_eq!(next(&record, add, 3), Next::Switch);
        // Published: even another command finishes the switch first.
        assert_eq!(next(&record, MapChange::DrainShard(0), 3), Next::Switch);
        run(&mut record, add, 3, Stop::Never);
        assert_eq!(record.moving, None);
        assert_eq!(next(&record, add, 3), Next::Done);
        // A fourth shard listed: another add.
        assert_eq!(next(&record, add, 4), Next::Record { to: to.with(add) });
        // Drained once, a drain of the same shard is done; of another, a new move.
        run(&mut record, MapChange::DrainShard(1), 3, Stop::Never);
        assert_eq!(next(&record, MapChange::DrainShard(1), 3), Next::Done);
        assert!(matches!(
            next(&record, MapChange::DrainShard(0), 3),
            Next::Record { .. }
        ));
    }

    /// A published switch names the map before and after, each dataset's length at the
    /// switch (a dataset it lacks by name), and what each shard serves after it: its slots
    /// with their share, nothing for a shard that holds none before and after.
    #[test]
    fn a_published_switch_tells_each_shard_its_slots() {
        let record = cluster(2);
        assert!(Switch::of(&record).is_err(), "no move");
        let add = MapChange::AddShard;
        let to = record.map.with(add);
        assert_eq!(to.before(), Some(record.map.clone()));
        assert_eq!(
            record.map.before(),
            None,
            "the map the cluster was made with"
        );
        let added = AddedShard {
            shard: 2,
            addrs: vec!["127.0.0.1:1".into()],
        };
        let recorded = recording(&record, to.clone(), Some(added.clone()));
        assert_eq!(
            recorded.map, record.map,
            "reads go by the old map while copying"
        );
        assert_eq!(recorded.added, vec![added.clone()]);
        // Recorded again (a stopped add run again): one entry for the shard.
        assert_eq!(recording(&recorded, to.clone(), Some(added)).added.len(), 1);
        assert!(Switch::of(&recorded).is_err(), "not published");
        let lens = BTreeMap::from([("images".to_string(), 40)]);
        let published = publishing(&recorded, to.clone(), 100, lens);
        let switch = Switch::of(&published).unwrap();
        assert_eq!((&switch.from, &switch.to), (&record.map, &to));
        assert_eq!(switch.len_of(None), Ok(100));
        assert_eq!(switch.len_of(Some("images")), Ok(40));
        assert!(switch.len_of(Some("text")).unwrap_err().contains("'text'"));
        assert_eq!(cleared(&published).moving, None);

        let old = Placement::new(record.map.cluster_map().unwrap())
            .unwrap()
            .padded(4);
        let new = Placement::new(to.cluster_map().unwrap()).unwrap().padded(4);
        let staged = changed_shards(&old, &new);
        assert_eq!(staged, vec![0, 1, 2]);
        let mut total = 0;
        for shard in 0..3 {
            let slots = switch_slots(&new, &staged, shard, 100).unwrap();
            assert_eq!(
                slots.iter().map(|s| s.0).collect::<Vec<_>>(),
                new.slots(shard)
            );
            total += slots.iter().map(|s| s.1).sum::<u64>();
        }
        assert_eq!(total, 100, "the shards' shares make up the dataset");
        // An add only takes slots from the shards there: what it writes is the new shard's
        // share of each dataset.
        assert_eq!(
            records_to_stage(&old, &new, &staged, &[100, 40]),
            new.shard_len(2, 100) + new.shard_len(2, 40)
        );
        assert!(new.shard_len(2, 100) > 0);
        assert_eq!(records_to_stage(&old, &old, &staged, &[100]), 0);
        // Shard 3 is in no map yet: it is not told.
        assert_eq!(switch_slots(&new, &staged, 3, 100), None);
        // A drained shard that built nothing either.
        let drained = to.with(MapChange::DrainShard(1));
        let after = Placement::new(drained.cluster_map().unwrap())
            .unwrap()
            .padded(4);
        assert_eq!(switch_slots(&after, &[0, 2], 1, 100), None);
        assert_eq!(switch_slots(&after, &[0, 1, 2], 1, 100), Some(Vec::new()));
    }

    fn stops() -> impl Strategy<Value = Stop> {
        prop_oneof![
            Just(Stop::Recorded),
            Just(Stop::Copied),
            Just(Stop::Published),
            Just(Stop::Never),
        ]
    }

    /// Whatever its nodes hold of each slot, a pass of files then records (or records alone)
    /// takes every slot to its target exactly: files for the empty slots, the missing
    /// records after what is held, a cut where more is held; nothing for a slot at its
    /// target.
    #[test]
    fn copy_passes_take_every_slot_to_its_target() {
        let holder = |slot: u32| slot % 3;
        let target = |slot: u32| u64::from(slot) * 7 % 20;
        for files in [true, false] {
            for seed in 0..50u64 {
                let have: BTreeMap<u32, u64> = (0..12u32)
                    .map(|slot| (slot, zr_common::hash::mix2(seed, slot.into()) % 25))
                    .collect();
                let mut now = have.clone();
                let first = copy_pass(&have, target, holder, files);
                for (&h, slots) in &first.files {
                    for &slot in slots {
                        assert!(files && have[&slot] == 0 && holder(slot) == h);
                        // The files bring what the holder holds: at least the target.
                        now.insert(slot, target(slot) + seed % 3);
                    }
                }
                // Records are copied by the pass planned once the files are in.
                let records = if files {
                    copy_pass(&now, target, holder, false)
                } else {
                    first
                };
                assert!(records.files.is_empty(), "files once");
                for (&h, runs) in &records.records {
                    for run in runs {
                        assert_eq!(holder(run.slot), h);
                        let held = now[&run.slot];
                        assert_eq!(run.at, held.min(target(run.slot)));
                        now.insert(run.slot, run.at + run.count);
                    }
                }
                for (slot, held) in now {
                    assert_eq!(held, target(slot), "slot {slot}, seed {seed}");
                }
            }
        }
    }

    proptest! {
        /// However often a move is stopped, and wherever, running its command again until
        /// it is done makes the change exactly once: one version more, the change last, no
        /// move left; one run more says it is done. A different move asked for meanwhile
        /// is refused (or finishes the switch) until then.
        #[test]
        fn a_move_stopped_anywhere_is_finished_by_its_command_once(
            drain in any::<bool>(),
            stopped in proptest::collection::vec(stops(), 0..6),
            interleaved in proptest::collection::vec(any::<bool>(), 0..6),
        ) {
            let mut record = cluster(3);
            let (change, listed) = match drain {
                true => (MapChange::DrainShard(1), 3),
                false => (MapChange::AddShard, 4),
            };
            let other = MapChange::DrainShard(2);
            let before = record.map.clone();
            for (k, &stop) in stopped.iter().chain([Stop::Never].iter()).enumerate() {
                if interleaved.get(k) == Some(&true) {
                    match next(&record, other, listed) {
                        Next::Busy(_) | Next::Switch => {}
                        step => prop_assert!(
                            record.moving.is_none(),
                            "{step:?} while a move is under way"
                        ),
                    }
                }
                run(&mut record, change, listed, stop);
                if stop == Stop::Never {
                    break;
                }
            }
            prop_assert_eq!(record.moving.as_ref(), None);
            prop_assert_eq!(&record.map, &before.with(change));
            prop_assert_eq!(next(&record, change, listed), Next::Done);
        }
    }

    /// Batches hold every record of the runs once, in order, at most `most` each; a run of
    /// none stays, to cut.
    #[test]
    fn batches_cover_the_runs_in_order_within_the_bound() {
        let run = |slot, at, count| Run { slot, at, count };
        let runs = [run(3, 10, 5), run(7, 0, 0), run(9, 2, 9), run(11, 4, 3)];
        for most in [1, 2, 4, 5, 100] {
            let batches = batches_of(&runs, most);
            let mut flat: Vec<(u32, u64)> = Vec::new();
            let mut cuts = 0;
            for batch in &batches {
                assert!(batch.iter().map(|r| r.count).sum::<u64>() <= most);
                for r in batch {
                    cuts += usize::from(r.count == 0);
                    flat.extend((r.at..r.at + r.count).map(|i| (r.slot, i)));
                }
            }
            let expected: Vec<(u32, u64)> = runs
                .iter()
                .flat_map(|r| (r.at..r.at + r.count).map(move |i| (r.slot, i)))
                .collect();
            assert_eq!(flat, expected, "at most {most}");
            assert_eq!(cuts, 1, "the cut is kept");
        }
        assert!(batches_of(&[], 4).is_empty());
    }
}
