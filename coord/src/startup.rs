//! A router's start-up, as a decision: what the metadata store holds (the cluster record,
//! if any), what nodes.toml gives, and what the nodes hold in, what to do out — serve the
//! stored record, make the cluster's first record, or refuse, naming why and the cure.
//! I/O-free; `server` performs it.

use crate::cluster::{ClusterRecord, MapRecord};

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
