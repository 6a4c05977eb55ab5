//! What a node lacks of the cluster record's datasets, and what it holds that the record
//! dropped: the changes that bring it in step. A node that was away while datasets were
//! made, dropped or given fields is told them when it is back.

use zr_proto::wire::{self, DatasetInfo, FieldInfo, DEFAULT_DATASET};

use crate::cluster::{ClusterRecord, DatasetRecord, DictRef, FieldRecord};

/// One change that brings a node in step with the cluster record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change<'a> {
    /// Add `field` to dataset `dataset` (`None`: the default one).
    AddField {
        dataset: Option<&'a str>,
        field: FieldInfo,
    },
    /// Make the dataset, empty, as the record has it.
    Create(&'a DatasetRecord),
    /// Drop the dataset `name` the node holds under id `id`.
    Drop { name: &'a str, id: u64 },
}

/// The changes that bring a node holding `held` in step with `record`, whose default
/// dataset has the fields `default_fields`:
/// - a dataset of the record the node lacks, or holds under an older id (dropped and made
///   again while it was away), is made;
/// - a field of the record's the node's copy lacks is added;
/// - a dataset the node holds that the record dropped is dropped. Ids only grow, so one
///   past the record's last id was made after the record was read, and is left alone; so
///   is a copy newer than the record's.
pub fn node_changes<'a>(
    record: &'a ClusterRecord,
    default_fields: &[FieldInfo],
    held: &'a [DatasetInfo],
) -> Vec<Change<'a>> {
    let mut changes = Vec::new();
    let missing = |want: &[FieldInfo], have: &[FieldInfo]| -> Vec<FieldInfo> {
        want.iter()
            .filter(|f| !have.iter().any(|h| h.name == f.name))
            .cloned()
            .collect()
    };
    for dataset in &record.datasets {
        match held.iter().find(|h| h.name == dataset.name) {
            Some(h) if h.id == dataset.id => {
                for field in missing(&wire_fields(&dataset.fields), &h.fields) {
                    changes.push(Change::AddField {
                        dataset: Some(&dataset.name),
                        field,
                    });
                }
            }
            Some(h) if h.id > dataset.id => {} // made after this record was read
            _ => changes.push(Change::Create(dataset)),
        }
    }
    for h in held {
        if h.name == DEFAULT_DATASET {
            for field in missing(default_fields, &h.fields) {
                changes.push(Change::AddField {
                    dataset: None,
                    field,
                });
            }
            continue;
        }
        let dropped =
            h.id <= record.dataset_ids && record.dataset(&h.name).is_none_or(|d| d.id > h.id);
        if dropped {
            changes.push(Change::Drop {
                name: &h.name,
                id: h.id,
            });
        }
    }
    changes
}

/// A named dataset as a router knows it: name, id and how many fields it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known<'a> {
    pub name: &'a str,
    pub id: u64,
    pub fields: usize,
}

/// One change that brings a router's named datasets in step with the cluster record `'r`,
/// the router serving the datasets `'k` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adopt<'r, 'k> {
    /// Dataset `name`, served under id `id`, was dropped (or dropped and made again, under
    /// another id): it serves nothing more, and those waiting on it are told.
    Drop { name: &'k str, id: u64 },
    /// A dataset the router does not serve yet (made, or made again after a drop).
    Open(&'r DatasetRecord),
    /// A dataset it serves has gained fields: the record's are its fields now.
    Fields(&'r DatasetRecord),
}

/// What a router serving `known` does to follow `record`: the drops first, then each
/// dataset of the record it does not serve under the record's id opened, each that has
/// more fields than it serves given them. A field is never taken away (fields only grow).
pub fn router_changes<'r, 'k>(
    record: &'r ClusterRecord,
    known: &[Known<'k>],
) -> Vec<Adopt<'r, 'k>> {
    let current = |k: &Known| record.dataset(k.name).is_some_and(|d| d.id == k.id);
    let mut changes: Vec<Adopt> = known
        .iter()
        .filter(|k| !current(k))
        .map(|k| Adopt::Drop {
            name: k.name,
            id: k.id,
        })
        .collect();
    for dataset in &record.datasets {
        match known
            .iter()
            .find(|k| k.name == dataset.name && k.id == dataset.id)
        {
            None => changes.push(Adopt::Open(dataset)),
            Some(k) if k.fields < dataset.fields.len() => changes.push(Adopt::Fields(dataset)),
            Some(_) => {}
        }
    }
    changes
}

/// `fields` as the cluster record keeps them.
pub fn record_fields(fields: &[FieldInfo]) -> Vec<FieldRecord> {
    fields
        .iter()
        .map(|f| FieldRecord {
            name: f.name.clone(),
            compress: f.compress.clone(),
            dtype: f.dtype.clone(),
            shape: f.shape.clone(),
            dict: f.dict.map(|d| DictRef {
                id: d.id,
                crc: d.crc,
            }),
        })
        .collect()
}

/// A dataset's fields as the wire describes them.
pub fn wire_fields(fields: &[FieldRecord]) -> Vec<FieldInfo> {
    fields
        .iter()
        .map(|f| FieldInfo {
            name: f.name.clone(),
            compress: f.compress.clone(),
            dtype: f.dtype.clone(),
            shape: f.shape.clone(),
            dict: f.dict.map(|d| wire::DictRef {
                id: d.id,
                crc: d.crc,
            }),
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use crate::cluster::MapRecord;

    fn field(name: &str) -> FieldRecord {
        FieldRecord {
            name: name.into(),
            compress: "raw".into(),
            dtype: None,
            shape: None,
            dict: None,
        }
    }

    pub(crate) fn dataset(name: &str, id: u64, fields: &[&str]) -> DatasetRecord {
        DatasetRecord {
            name: name.into(),
            id,
            fields: fields.iter().map(|f| field(f)).collect(),
        }
    }

    fn held(name: &str, id: u64, fields: &[&str]) -> DatasetInfo {
        DatasetInfo {
            name: name.into(),
            id,
            fields: wire_fields(&fields.iter().map(|f| field(f)).collect::<Vec<_>>()),
            len: 0,
            committed: None,
            bytes: 0,
            commits: None,
        }
    }

    pub(crate) fn record(datasets: Vec<DatasetRecord>, dataset_ids: u64) -> ClusterRecord {
        ClusterRecord {
            id: "c0ffee".into(),
            map: MapRecord {
                version: 1,
                shards: 2,
                extent_records: 64,
                seed: 0,
                replicas: 1,
                changes: Vec::new(),
            },
            committed_len: 0,
            moving: None,
            added: Vec::new(),
            datasets,
            dataset_ids,
            commits: 0,
        }
    }

    /// A node back from a while away: it missed a dataset's making, a field added to
    /// another, a field of the default dataset, and a drop; it holds one dataset made since
    /// the record was read, which is left alone.
    #[test]
    fn a_node_back_is_told_what_it_missed_and_nothing_newer_is_undone() {
        let record = record(
            vec![
                dataset("text", 3, &["a", "b"]),
                dataset("images", 5, &["jpg"]),
            ],
            5,
        );
        let default_fields = wire_fields(&[field("x"), field("y")]);
        let held = [
            held(DEFAULT_DATASET, 0, &["x"]),
            held("text", 3, &["a"]),
            held("gone", 4, &["z"]),
            held("newer", 6, &["q"]),
        ];
        let changes = node_changes(&record, &default_fields, &held);
        assert_eq!(
            changes,
            vec![
                Change::AddField {
                    dataset: Some("text"),
                    field: wire_fields(&[field("b")]).remove(0),
                },
                Change::Create(&record.datasets[1]),
                Change::AddField {
                    dataset: None,
                    field: wire_fields(&[field("y")]).remove(0),
                },
                Change::Drop {
                    name: "gone",
                    id: 4
                },
            ]
        );
    }

    /// A dataset dropped and made again under its name while the node was away: the old
    /// copy is dropped and the new one made. A copy newer than the record's is left alone.
    #[test]
    fn a_dataset_made_again_replaces_the_old_copy_and_a_newer_copy_stays() {
        let record_then = record(vec![dataset("text", 7, &["a"])], 7);
        let held_old = [held("text", 2, &["a"])];
        assert_eq!(
            node_changes(&record_then, &[], &held_old),
            vec![
                Change::Create(&record_then.datasets[0]),
                Change::Drop {
                    name: "text",
                    id: 2
                },
            ]
        );
        let held_newer = [held("text", 9, &["a", "b"])];
        assert_eq!(node_changes(&record_then, &[], &held_newer), vec![]);
        let in_step = [held("text", 7, &["a"])];
        assert_eq!(node_changes(&record_then, &[], &in_step), vec![]);
    }

    /// A router follows the record: a dropped dataset is dropped, one made again under a
    /// new id dropped and opened anew, a new one opened, one given fields grown; fields it
    /// serves beyond the record's (read before they were recorded) stay.
    #[test]
    fn a_router_drops_opens_and_grows_its_datasets_as_the_record_says() {
        let record = record(
            vec![
                dataset("text", 3, &["a", "b"]),
                dataset("images", 9, &["x"]),
                dataset("new", 10, &["y"]),
                dataset("wide", 4, &["p"]),
            ],
            10,
        );
        let known = |name, id, fields| Known { name, id, fields };
        let serving = [
            known("text", 3, 1),
            known("images", 5, 1),
            known("gone", 2, 1),
            known("wide", 4, 3),
        ];
        let changes = router_changes(&record, &serving);
        assert_eq!(
            changes,
            vec![
                Adopt::Drop {
                    name: "images",
                    id: 5
                },
                Adopt::Drop {
                    name: "gone",
                    id: 2
                },
                Adopt::Fields(&record.datasets[0]),
                Adopt::Open(&record.datasets[1]),
                Adopt::Open(&record.datasets[2]),
            ]
        );
        let caught_up = [
            known("text", 3, 2),
            known("images", 9, 1),
            known("new", 10, 1),
            known("wide", 4, 3),
        ];
        assert_eq!(router_changes(&record, &caught_up), Vec::new());
    }
}
