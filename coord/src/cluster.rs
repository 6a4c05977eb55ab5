//! The cluster record, as the metadata store keeps it (`zr_meta::cluster` reads and writes
//! it, by compare-and-swap): the cluster's id, its versioned map — the map it was made with
//! and each shard added or drained since —, the committed length, the move under way, the
//! added shards' node addresses, and the named datasets with their fields.

use serde::{Deserialize, Serialize};

/// The cluster's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    /// Made once, when the cluster is made; every node keeps it in its data directory.
    pub id: String,
    pub map: MapRecord,
    /// Records every shard has committed: no repair cuts below this.
    pub committed_len: u64,
    /// The move under way (`zr cluster add-shard` / `drain-shard`), if any. Set and cleared
    /// by compare-and-swap: one move at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<MapMove>,
    /// Shards added since the cluster was made, with their nodes' addresses (replica
    /// order): routers whose nodes.toml predates a shard reach its nodes here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<AddedShard>,
    /// The named datasets (the default one, whose committed length is `committed_len`
    /// above, is not listed: a record made before datasets had names reads as it was).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<DatasetRecord>,
    /// The last dataset id given out: every create takes the next, and a drop counts one
    /// too, so ids only grow (a node holding a dataset made later than a router's view of
    /// this record knows it is newer).
    #[serde(default)]
    pub dataset_ids: u64,
    /// Commits recorded for the default dataset: each that changed its records (its length,
    /// or records rewritten in place) counts one. With `committed_len`, what a reader's
    /// order proof holds of the dataset's contents.
    #[serde(default)]
    pub commits: u64,
}

/// A named dataset: what every router and node needs to agree on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetRecord {
    pub name: String,
    /// Given when it was made (see [`ClusterRecord::dataset_ids`]).
    pub id: u64,
    pub fields: Vec<FieldRecord>,
}

/// A dataset's field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldRecord {
    pub name: String,
    /// Its storage: `raw`, `flate`, `zstd` or `zstd:LEVEL`.
    pub compress: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    /// The zstd dictionary its records are compressed with: its id and the CRC32 of its
    /// bytes, which are kept under [`dict_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dict: Option<DictRef>,
}

/// Which zstd dictionary a field is compressed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DictRef {
    pub id: u32,
    pub crc: u32,
}

impl ClusterRecord {
    /// The named dataset `name`, if the cluster has it.
    pub fn dataset(&self, name: &str) -> Option<&DatasetRecord> {
        self.datasets.iter().find(|d| d.name == name)
    }
}

/// A named dataset's committed length, under [`committed_key`]: its own key, so commits of
/// different datasets do not contend for the cluster record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedRecord {
    /// The dataset it belongs to: a record of an earlier dataset of the same name (dropped)
    /// counts as nothing committed.
    pub id: u64,
    pub committed_len: u64,
    /// Commits recorded that changed the dataset's records (see [`ClusterRecord::commits`]).
    #[serde(default)]
    pub commits: u64,
}

/// A shard added to the cluster, and where its nodes are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddedShard {
    pub shard: u32,
    pub addrs: Vec<String>,
}

/// A move of records to the next map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapMove {
    /// The map moved to. While its records are copied, the record's `map` (the previous one)
    /// places every read and write.
    pub to: MapRecord,
    /// Once `to` is published as the map, the cluster length at that moment (the nodes
    /// switch with datasets of exactly their share of it); `None` while copying.
    pub switched_at: Option<u64>,
    /// Beside `switched_at`, the default dataset's, each named dataset's length then.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub switched_lens: std::collections::BTreeMap<String, u64>,
}

/// The versioned cluster map: what placement is computed from — the balanced map of the
/// cluster as it was made, then each change since, in order (`version` = 1 + changes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapRecord {
    pub version: u64,
    /// Shards the cluster was made with.
    pub shards: u32,
    pub extent_records: u64,
    pub seed: u64,
    /// Nodes holding each shard (a map recorded before replicas existed has one).
    #[serde(default = "one")]
    pub replicas: u32,
    /// Shards added and drained since the cluster was made, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<MapChange>,
}

/// A change of the cluster map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapChange {
    /// A shard more (its id: the shard count before), taking an even share of slots.
    AddShard,
    /// The shard's slots go to the others; it keeps its id, owning none.
    DrainShard(u32),
}

impl MapRecord {
    /// The cluster map this record describes: the balanced map of the cluster as it was
    /// made, then each change, in order. An error names a record that does not hold
    /// together (a change that cannot be made, a version other than its changes give).
    pub fn cluster_map(&self) -> Result<zr_proto::placement::ClusterMap, String> {
        use zr_proto::placement::ClusterMap;
        let mut built = ClusterMap::balanced(self.shards, self.extent_records, self.seed)
            .map_err(|e| e.to_string())?;
        for change in &self.changes {
            built = match change {
                MapChange::AddShard => built.with_added_shard(),
                MapChange::DrainShard(shard) => built.with_drained_shard(*shard),
            }
            .map_err(|e| e.to_string())?;
        }
        if built.version != self.version {
            return Err(format!(
                "map version {} records {} changes (a version {} map)",
                self.version,
                self.changes.len(),
                built.version
            ));
        }
        Ok(built)
    }
}

impl std::fmt::Display for MapChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapChange::AddShard => write!(f, "add a shard"),
            MapChange::DrainShard(shard) => write!(f, "drain shard {shard}"),
        }
    }
}

fn one() -> u32 {
    1
}

impl MapRecord {
    /// Shards in the map now: those it was made with and those added since (drained ones
    /// keep their ids).
    pub fn total_shards(&self) -> u32 {
        let added = self
            .changes
            .iter()
            .filter(|c| **c == MapChange::AddShard)
            .count();
        self.shards + added as u32
    }

    /// The next version: `self` with `change`.
    pub fn with(&self, change: MapChange) -> MapRecord {
        let mut next = self.clone();
        next.version += 1;
        next.changes.push(change);
        next
    }

    /// The version before: `self` without its last change (`None` for the map the cluster
    /// was made with).
    pub fn before(&self) -> Option<MapRecord> {
        let (_, changes) = self.changes.split_last()?;
        Some(MapRecord {
            version: self.version.saturating_sub(1),
            changes: changes.to_vec(),
            ..self.clone()
        })
    }

    /// The first key in which `self` and `other` differ, with both values, for a message
    /// (`None` if they describe the same cluster; the version and changes are not compared,
    /// and `shards` counts every shard either has now).
    pub fn difference(&self, other: &MapRecord) -> Option<(&'static str, u64, u64)> {
        [
            (
                "shards",
                self.total_shards() as u64,
                other.total_shards() as u64,
            ),
            ("extent_records", self.extent_records, other.extent_records),
            ("seed", self.seed, other.seed),
            ("replicas", self.replicas as u64, other.replicas as u64),
        ]
        .into_iter()
        .find(|(_, a, b)| a != b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records a previous version wrote, without the count of commits that changed their
    /// dataset, read as counting none: a cluster upgraded in place keeps its records.
    #[test]
    fn records_of_the_previous_version_read_with_no_commits_counted() {
        let committed: CommittedRecord =
            serde_json::from_str(r#"{"id": 4, "committed_len": 1200}"#).unwrap();
        assert_eq!(
            (committed.id, committed.committed_len, committed.commits),
            (4, 1200, 0)
        );
        let cluster: ClusterRecord = serde_json::from_str(
            r#"{"id": "c0ffee", "committed_len": 77,
                "map": {"version": 1, "shards": 2, "extent_records": 64, "seed": 0, "replicas": 1}}"#,
        )
        .unwrap();
        assert_eq!((cluster.committed_len, cluster.commits), (77, 0));
        let written = serde_json::to_value(&committed).unwrap();
        assert_eq!(written["commits"], 0, "written back with the count");
    }

    #[test]
    fn maps_name_their_difference() {
        let map = MapRecord {
            version: 1,
            shards: 3,
            extent_records: 64,
            seed: 0,
            replicas: 1,
            changes: Vec::new(),
        };
        let next = map.with(MapChange::AddShard);
        assert_eq!((next.version, next.total_shards()), (2, 4));
        assert_eq!(
            map.difference(&MapRecord {
                version: 2,
                ..map.clone()
            }),
            None
        );
        assert_eq!(map.difference(&next), Some(("shards", 3, 4)));
        assert_eq!(
            map.difference(&MapRecord {
                seed: 9,
                ..map.clone()
            }),
            Some(("seed", 0, 9))
        );
        // Records written before maps could change read as before.
        let old = r#"{"version":1,"shards":3,"extent_records":64,"seed":0}"#;
        let read: MapRecord = serde_json::from_str(old).expect("old record");
        assert_eq!(read, map);
        let drained = next.with(MapChange::DrainShard(1));
        let text = serde_json::to_string(&drained).expect("encode");
        assert!(
            text.contains(r#""changes":["add_shard",{"drain_shard":1}]"#),
            "{text}"
        );
    }

    #[test]
    fn cluster_records_made_before_datasets_had_names_read_as_before() {
        let old = r#"{"id":"abc","map":{"version":1,"shards":2,"extent_records":64,"seed":0},"committed_len":7}"#;
        let read: ClusterRecord = serde_json::from_str(old).expect("old record");
        assert!(read.datasets.is_empty());
        assert_eq!((read.dataset_ids, read.committed_len), (0, 7));
        assert!(read.dataset("anything").is_none());
        // And a record without named datasets is written as it always was.
        let text = serde_json::to_string(&read).expect("encode");
        assert!(!text.contains("datasets\""), "{text}");
    }

    /// A record written before fields could name a dictionary reads with none, and one with
    /// no dictionary is written as it was: routers of the previous version read it too.
    #[test]
    fn cluster_records_made_before_dictionaries_read_as_before() {
        let old = r#"{"id":"abc","map":{"version":1,"shards":2,"extent_records":64,"seed":0},"committed_len":7,"datasets":[{"name":"text","id":1,"fields":[{"name":"c","compress":"zstd:5"}]}],"dataset_ids":1}"#;
        let read: ClusterRecord = serde_json::from_str(old).expect("old record");
        let field = &read.dataset("text").expect("text").fields[0];
        assert_eq!((field.compress.as_str(), field.dict), ("zstd:5", None));
        let text = serde_json::to_string(&read).expect("encode");
        assert!(!text.contains("dict"), "{text}");
        // One with a dictionary names it by id and CRC32, and reads back the same.
        let mut with = read.clone();
        with.datasets[0].fields[0].dict = Some(DictRef { id: 9, crc: 0xfeed });
        let text = serde_json::to_string(&with).expect("encode");
        assert_eq!(
            serde_json::from_str::<ClusterRecord>(&text).expect("read"),
            with
        );
    }
}
