//! What a router knows of one dataset, as one value: its fields, its lengths (see
//! [`crate::lengths`]), its writer lease (see [`crate::writer`]) and whether it was
//! dropped. The router keeps one per dataset it serves, the default one and each named one,
//! and tells it what it learns: fields added here or by another router, lengths, the
//! lease's reads and writes, a drop.

use std::time::{Duration, Instant};

use zr_proto::wire::FieldInfo;

use crate::lengths::Lengths;
use crate::writer::LeaseState;

/// One dataset as a router knows it; see the module documentation.
#[derive(Debug)]
pub struct DatasetState {
    /// Its lengths: served, committed, rewritten since the last commit, shards missing data.
    pub lengths: Lengths,
    /// Its writer lease as this router knows it.
    pub lease: LeaseState,
    /// Its fields, in order. Fields are only ever added, at the end.
    fields: Vec<FieldInfo>,
    /// Dropped: it serves nothing more, and its waiters fail.
    dropped: bool,
    /// The writer lease (its token) under which this router last read every shard's length
    /// and served what they gave (a write's repair does, before the write).
    len_read_under: Option<u64>,
}

impl DatasetState {
    /// A dataset of `fields` on `shards` shards, its writer lease known as `lease` says,
    /// nothing known yet of its lengths.
    pub fn new(shards: usize, fields: Vec<FieldInfo>, lease: LeaseState) -> DatasetState {
        DatasetState {
            lengths: Lengths::new(shards),
            lease,
            fields,
            dropped: false,
            len_read_under: None,
        }
    }

    /// Every shard's length was just read, and the length served set from them, under the
    /// writer lease taken at `token`.
    pub fn len_read_under(&mut self, token: u64) {
        self.len_read_under = Some(token);
    }

    /// The length served, if it is the cluster's without asking the nodes: this router
    /// holds the writer lease (with `margin` left at `now`) and read every shard's length
    /// under it, so no other router has written since. Its own write in flight is not
    /// counted until it is done, as if the question came just before it. `None` otherwise.
    pub fn own_len(&self, now: Instant, margin: Duration) -> Option<u64> {
        let held = self.lease.usable(now, margin)?;
        (self.len_read_under == Some(held.token)).then(|| self.lengths.len())
    }

    /// Its fields, in order.
    pub fn fields(&self) -> &[FieldInfo] {
        &self.fields
    }

    /// Takes `fields` as its fields (at start, from the nodes or nodes.toml).
    pub fn set_fields(&mut self, fields: Vec<FieldInfo>) {
        self.fields = fields;
    }

    /// Field `field` was added here (on every node and, for a named dataset, in the record).
    pub fn field_added(&mut self, field: FieldInfo) {
        self.fields.push(field);
    }

    /// The fields as the cluster record lists them (another router may have added some):
    /// taken if they are more than it knows. Returns whether they were.
    pub fn recorded_fields(&mut self, fields: Vec<FieldInfo>) -> bool {
        let more = fields.len() > self.fields.len();
        if more {
            self.fields = fields;
        }
        more
    }

    /// The fields as a node holds them (the default dataset's, which no record lists): taken
    /// if they are the known ones and more, after them. Returns whether they were.
    pub fn node_fields(&mut self, fields: Vec<FieldInfo>) -> bool {
        let more = fields.len() > self.fields.len() && fields.starts_with(&self.fields);
        if more {
            self.fields = fields;
        }
        more
    }

    /// Whether it was dropped.
    pub fn dropped(&self) -> bool {
        self.dropped
    }

    /// It was dropped: it serves nothing more.
    pub fn drop_it(&mut self) {
        self.dropped = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(fields: Vec<FieldInfo>) -> DatasetState {
        let lease = LeaseState::new(1, std::time::Duration::from_secs(8));
        DatasetState::new(2, fields, lease)
    }

    fn fields(names: &[&str]) -> Vec<FieldInfo> {
        names.iter().map(|n| FieldInfo::new(*n, "raw")).collect()
    }

    #[test]
    fn the_length_is_its_own_only_under_the_lease_it_was_read_under() {
        let (t0, margin) = (Instant::now(), Duration::from_secs(2));
        let mut state = known(fields(&["x"]));
        state.lengths.set_len(10);
        assert_eq!(state.own_len(t0, margin), None, "no lease held");
        state.lease.taken(3, t0, None);
        assert_eq!(state.own_len(t0, margin), None, "not read under it yet");
        state.len_read_under(3);
        assert_eq!(state.own_len(t0, margin), Some(10));
        // Renewed: the same lease, the same token.
        state.lease.taken(5, t0 + Duration::from_secs(1), None);
        assert_eq!(state.own_len(t0, margin), Some(10));
        // Too little of it left: another router may take it before the answer arrives.
        assert_eq!(state.own_len(t0 + Duration::from_secs(8), margin), None);
        // Given back and taken anew: another router may have written in between.
        state.lease.released(true);
        assert_eq!(state.own_len(t0, margin), None);
        state.lease.taken(9, t0, None);
        assert_eq!(
            state.own_len(t0, margin),
            None,
            "read under token 3, held 9"
        );
        state.len_read_under(9);
        assert_eq!(state.own_len(t0, margin), Some(10));
        state.lease.lost();
        assert_eq!(state.own_len(t0, margin), None);
    }

    #[test]
    fn fields_are_only_added_whoever_tells_of_them() {
        let mut state = known(fields(&["x"]));
        assert_eq!(state.fields(), fields(&["x"]).as_slice());
        state.field_added(FieldInfo::new("y", "zstd"));
        assert_eq!(state.fields().len(), 2);
        // A record listing fewer (read before the add) changes nothing; more are taken.
        assert!(!state.recorded_fields(fields(&["x"])));
        assert_eq!(state.fields().len(), 2);
        let three = vec![
            FieldInfo::new("x", "raw"),
            FieldInfo::new("y", "zstd"),
            FieldInfo::new("z", "raw"),
        ];
        assert!(state.recorded_fields(three.clone()));
        assert_eq!(state.fields(), three.as_slice());
        // A node's fields are taken only where they extend the known ones.
        let mut default = known(fields(&["x"]));
        assert!(!default.node_fields(fields(&["a", "b"])), "not after ours");
        assert!(!default.node_fields(fields(&["x"])), "no more");
        assert!(default.node_fields(fields(&["x", "b"])));
        assert_eq!(default.fields(), fields(&["x", "b"]).as_slice());
    }

    #[test]
    fn a_dropped_dataset_stays_dropped() {
        let mut state = known(fields(&["x"]));
        assert!(!state.dropped());
        state.drop_it();
        assert!(state.dropped());
        state.recorded_fields(fields(&["x", "y"]));
        assert!(state.dropped());
    }
}
