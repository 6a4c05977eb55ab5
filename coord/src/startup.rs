//! A router's start-up, as a decision: what the metadata store holds (the cluster record,
//! if any), what nodes.toml gives, and what the nodes hold in, what to do out — serve the
//! stored record, make the cluster's first record, or refuse, naming why and the cure.
//! I/O-free; `server` performs it.

use zr_proto::placement::Placement;
use zr_proto::wire::FieldInfo;

use crate::cluster::{ClusterRecord, MapRecord};
use crate::NodeId;

/// What a starting router heard of each shard: its length (the most records an in-sync
/// replica that answered holds; `None`: none answered) and the fields the shards hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heard {
    pub lens: Vec<Option<u64>>,
    /// The fields of the first shard that answered (`None`: no shard answered).
    pub fields: Option<Vec<FieldInfo>>,
}

/// Two shards answered with different fields: `shard`'s differ from `first`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldsDiffer {
    pub shard: u32,
    pub first: u32,
}

impl Heard {
    /// From each node's answer (`answers[node]`: its length and fields, `None` if it did not
    /// answer), each shard's by its in-sync replicas (`in_sync[shard]`). Shards that answered
    /// with different fields are refused, naming both.
    pub fn of(
        in_sync: &[Vec<NodeId>],
        answers: &[Option<(u64, Vec<FieldInfo>)>],
    ) -> Result<Heard, FieldsDiffer> {
        let best: Vec<Option<&(u64, Vec<FieldInfo>)>> = in_sync
            .iter()
            .map(|nodes| {
                nodes
                    .iter()
                    .filter_map(|&node| answers.get(node).and_then(Option::as_ref))
                    .max_by_key(|(len, _)| *len)
            })
            .collect();
        let mut fields: Option<(u32, &Vec<FieldInfo>)> = None;
        for (shard, (_, theirs)) in best
            .iter()
            .enumerate()
            .filter_map(|(shard, b)| Some((shard as u32, (*b)?)))
        {
            match fields {
                Some((first, ours)) if ours != theirs => {
                    return Err(FieldsDiffer { shard, first });
                }
                Some(_) => {}
                None => fields = Some((shard, theirs)),
            }
        }
        Ok(Heard {
            lens: best.iter().map(|b| b.map(|(len, _)| *len)).collect(),
            fields: fields.map(|(_, fields)| fields.clone()),
        })
    }

    /// The shards none of whose in-sync replicas answered.
    pub fn down(&self) -> Vec<u32> {
        (0..self.lens.len() as u32)
            .filter(|&shard| self.lens[shard as usize].is_none())
            .collect()
    }

    /// Every shard's length, if every shard answered.
    pub fn all(&self) -> Option<Vec<u64>> {
        self.lens.iter().copied().collect()
    }

    /// Every shard's length, a shard that did not answer counted as holding its share of
    /// `committed` under `placement` until it does.
    pub fn counting_down_as_committed(&self, placement: &Placement, committed: u64) -> Vec<u64> {
        self.lens
            .iter()
            .enumerate()
            .map(|(shard, len)| len.unwrap_or_else(|| placement.shard_len(shard as u32, committed)))
            .collect()
    }
}

/// What start-up does with the cluster record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordDecision {
    /// Serve the stored record.
    Use,
    /// No record yet and every node empty: record the cluster, with this committed length.
    Create { committed_len: u64 },
    /// nodes.toml disagrees with the stored map: applying it would re-map the data.
    MapMismatch {
        key: &'static str,
        given: u64,
        stored: u64,
        version: u64,
    },
    /// No record, and a node did not answer: recording the cluster needs every node.
    NodesMissing { why: String },
    /// No record, but the nodes hold records: the record was lost; a new one would give the
    /// cluster a new id, which every node refuses.
    RecordLost { held: u64 },
}

/// Decides (see the module documentation). `given` is the map nodes.toml describes,
/// `config_shards` its shard count, `lens` each shard's length (`None` if a node did not
/// answer, `why` saying which), and `consistent_len` the length those lengths agree on.
pub fn decide_record(
    stored: Option<&ClusterRecord>,
    given: &MapRecord,
    config_shards: u32,
    lens: Option<&[u64]>,
    why: impl FnOnce() -> String,
    consistent_len: impl FnOnce(&[u64]) -> u64,
) -> RecordDecision {
    if let Some(record) = stored {
        // nodes.toml may list shards the map does not place on yet (to be added).
        let stored_shards = record.map.total_shards();
        let compared = MapRecord {
            shards: record.map.shards,
            changes: record.map.changes.clone(),
            ..given.clone()
        };
        // Shards added since are reached where the record says.
        let known = record
            .added
            .iter()
            .map(|a| a.shard + 1)
            .fold(config_shards, u32::max);
        let differs = record.map.difference(&compared).or_else(|| {
            (known < stored_shards).then_some((
                "shards",
                stored_shards as u64,
                config_shards as u64,
            ))
        });
        return match differs {
            Some((key, stored, given)) => RecordDecision::MapMismatch {
                key,
                given,
                stored,
                version: record.map.version,
            },
            None => RecordDecision::Use,
        };
    }
    let Some(lens) = lens else {
        return RecordDecision::NodesMissing { why: why() };
    };
    let held: u64 = lens.iter().sum();
    if held > 0 {
        return RecordDecision::RecordLost { held };
    }
    RecordDecision::Create {
        committed_len: consistent_len(lens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{AddedShard, MapChange};

    fn map(shards: u32) -> MapRecord {
        MapRecord {
            version: 1,
            shards,
            extent_records: 64,
            seed: 9,
            replicas: 1,
            changes: Vec::new(),
        }
    }

    fn record(map: MapRecord) -> ClusterRecord {
        ClusterRecord {
            id: "c".into(),
            map,
            committed_len: 10,
            moving: None,
            added: Vec::new(),
            datasets: Vec::new(),
            dataset_ids: 0,
            commits: 0,
        }
    }

    fn decide(stored: Option<&ClusterRecord>, shards: u32, lens: Option<&[u64]>) -> RecordDecision {
        decide_record(
            stored,
            &map(shards),
            shards,
            lens,
            || "shard 1 is down".into(),
            |l| l.iter().sum(),
        )
    }

    #[test]
    fn each_shard_is_heard_by_its_longest_in_sync_replica_and_fields_must_agree() {
        use zr_proto::placement::ClusterMap;
        let fields = |names: &[&str]| -> Vec<FieldInfo> {
            names.iter().map(|n| FieldInfo::new(*n, "raw")).collect()
        };
        let xy = fields(&["x", "y"]);
        // Shard 0: nodes 0, 1; shard 1: nodes 2, 3 (node 3 behind: not in sync); shard 2: 4.
        let in_sync = vec![vec![0, 1], vec![2], vec![4]];
        let answers = vec![
            Some((5, xy.clone())),
            Some((9, xy.clone())),
            None,
            Some((50, xy.clone())),
            Some((4, xy.clone())),
        ];
        let heard = Heard::of(&in_sync, &answers).unwrap();
        assert_eq!(heard.lens, vec![Some(9), None, Some(4)]);
        assert_eq!(heard.fields.as_ref(), Some(&xy));
        assert_eq!(heard.down(), vec![1]);
        assert_eq!(heard.all(), None);
        let placement = Placement::new(ClusterMap::balanced(3, 4, 1).unwrap()).unwrap();
        let lens = heard.counting_down_as_committed(&placement, 30);
        assert_eq!(lens, vec![9, placement.shard_len(1, 30), 4]);
        // Every shard answered.
        let answers: Vec<_> = (0..5).map(|n| Some((n as u64, xy.clone()))).collect();
        assert_eq!(
            Heard::of(&in_sync, &answers).unwrap().all(),
            Some(vec![1, 2, 4])
        );
        // Shard 2 holds other fields than shard 0.
        let mut answers = answers;
        answers[4] = Some((4, fields(&["x"])));
        assert_eq!(
            Heard::of(&in_sync, &answers),
            Err(FieldsDiffer { shard: 2, first: 0 })
        );
        // Nobody answered.
        let silent = Heard::of(&in_sync, &[None, None, None, None, None]).unwrap();
        assert_eq!(silent.fields, None);
        assert_eq!(silent.down(), vec![0, 1, 2]);
    }

    #[test]
    fn a_stored_record_that_matches_is_served() {
        let stored = record(map(3));
        assert_eq!(decide(Some(&stored), 3, None), RecordDecision::Use);
    }

    #[test]
    fn a_changed_map_is_refused_naming_what_changed() {
        let mut other = map(3);
        other.extent_records = 32;
        let stored = record(other);
        assert!(matches!(
            decide(Some(&stored), 3, Some(&[0, 0, 0])),
            RecordDecision::MapMismatch {
                key: "extent_records",
                given: 64,
                stored: 32,
                ..
            }
        ));
        // nodes.toml with fewer shards than the map places on.
        let mut grown = map(3);
        grown.changes.push(MapChange::AddShard);
        grown.version = 2;
        let stored = record(grown);
        assert!(matches!(
            decide(Some(&stored), 3, None),
            RecordDecision::MapMismatch {
                key: "shards",
                stored: 4,
                given: 3,
                ..
            }
        ));
        // ... unless the record says where the added shard is.
        let mut with_added = stored.clone();
        with_added.added.push(AddedShard {
            shard: 3,
            addrs: vec!["127.0.0.1:1".into()],
        });
        assert_eq!(decide(Some(&with_added), 3, None), RecordDecision::Use);
    }

    #[test]
    fn without_a_record_start_up_needs_every_node_and_empty_ones() {
        assert_eq!(
            decide(None, 2, None),
            RecordDecision::NodesMissing {
                why: "shard 1 is down".into()
            }
        );
        assert_eq!(
            decide(None, 2, Some(&[5, 0])),
            RecordDecision::RecordLost { held: 5 }
        );
        assert_eq!(
            decide(None, 2, Some(&[0, 0])),
            RecordDecision::Create { committed_len: 0 }
        );
    }
}
