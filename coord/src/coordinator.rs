//! What a router knows and decides, as one value: its name for the writer leases it takes,
//! the replica set with each node's liveness and the replica record ([`crate::Replicas`],
//! stepped by `handle`/`poll`), the move it runs, the catch-ups of behind replicas running,
//! the revision of the cluster record whose datasets it follows, and each dataset it serves
//! ([`crate::dataset`]: fields, lengths, writer lease, dropped) — the default one and every
//! named one alike. The router keeps it under one lock, held for a moment and never across
//! an await, and performs what it decides; its links to the nodes step the replica set
//! through the same lock.
//!
//! A client reading one hop keeps a replica set of its own, without the rest. The placement
//! every dataset is read and written by sits beside, published as an immutable snapshot that
//! gathers read without a lock.

use std::collections::HashMap;
use std::time::Duration;

use zr_proto::wire::FieldInfo;

use crate::catchup::Progress;
use crate::cluster::{ClusterRecord, DatasetRecord};
use crate::dataset::DatasetState;
use crate::datasets::{router_changes, wire_fields, Adopt, Known};
use crate::moving::MoveRun;
use crate::replicas::Replicas;
use crate::NodeId;

/// Which of a coordinator's datasets: given by [`Coordinator::open`], good until
/// [`Coordinator::close`]. A dataset dropped and made again under the same name is another
/// one, with another key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatasetKey(u64);

/// What a router does to follow a cluster record (see [`Coordinator::follow_record`]); the
/// fields a record adds to a dataset are taken by the coordinator itself.
#[derive(Debug, PartialEq, Eq)]
pub enum Follow<'a> {
    /// Named dataset `name` of id `id` was dropped: it is marked so (it serves nothing
    /// more); its handle is to be let go and its waiters woken, to fail.
    Dropped { name: String, id: u64 },
    /// A dataset the router does not serve yet: open it (its lengths are read from the
    /// metadata store and the nodes, then [`Coordinator::open`]).
    Open(&'a DatasetRecord),
}

/// A dataset served: which (`None`: the default one; else its name and id) and its state.
#[derive(Debug)]
struct Served {
    named: Option<(String, u64)>,
    state: DatasetState,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Coordinator {
    /// This router's name for the writer leases it takes, one per router.
    me: u64,
    /// How long a writer lease it takes is held.
    lease: Duration,
    /// The nodes, their liveness and the replica record.
    replicas: Replicas,
    /// The move this router runs, or ran last.
    pub moving: MoveRun,
    /// The catch-ups running here, by the node caught up.
    pub catch_ups: HashMap<NodeId, Progress>,
    /// The revision of the cluster record whose datasets this router follows.
    followed: u64,
    /// Each dataset served, by its key.
    datasets: HashMap<DatasetKey, Served>,
    /// The key the next dataset opened gets.
    next_key: u64,
}

impl Coordinator {
    /// A router's, whose name for the writer leases it takes is `me` (one per router), each
    /// lease held for `lease`, knowing the nodes as `replicas` says; serving no dataset yet.
    pub fn new(me: u64, lease: Duration, replicas: Replicas) -> Coordinator {
        Coordinator {
            me,
            lease,
            replicas,
            moving: MoveRun::default(),
            catch_ups: HashMap::new(),
            followed: 0,
            datasets: HashMap::new(),
            next_key: 0,
        }
    }

    /// The nodes, their liveness and the replica record.
    pub fn replicas(&self) -> &Replicas {
        &self.replicas
    }

    /// The same, to step (`Replicas::handle`, `Replicas::poll`) or to add nodes to.
    pub fn replicas_mut(&mut self) -> &mut Replicas {
        &mut self.replicas
    }

    /// Serves a dataset of `fields` on `shards` shards from now on, under the key returned:
    /// the default dataset (`named` is `None`) or the named dataset of that name and id.
    /// Nothing is known yet of its lengths; its writer lease is this router's to take.
    pub fn open(
        &mut self,
        named: Option<(&str, u64)>,
        shards: usize,
        fields: Vec<FieldInfo>,
    ) -> DatasetKey {
        let key = DatasetKey(self.next_key);
        self.next_key += 1;
        let named = named.map(|(name, id)| (name.to_string(), id));
        let lease = crate::writer::LeaseState::new(self.me, self.lease);
        let served = Served {
            named,
            state: DatasetState::new(shards, fields, lease),
        };
        self.datasets.insert(key, served);
        key
    }

    /// Serves dataset `key` no more (its last handle is gone): what was known of it.
    pub fn close(&mut self, key: DatasetKey) -> Option<DatasetState> {
        self.datasets.remove(&key).map(|served| served.state)
    }

    /// Dataset `key`, if it is served.
    pub fn dataset(&self, key: DatasetKey) -> Option<&DatasetState> {
        self.datasets.get(&key).map(|served| &served.state)
    }

    /// Dataset `key`, if it is served, to change.
    pub fn dataset_mut(&mut self, key: DatasetKey) -> Option<&mut DatasetState> {
        self.datasets.get_mut(&key).map(|served| &mut served.state)
    }

    /// The named dataset `name` of id `id` served and not dropped.
    fn named_mut(&mut self, name: &str, id: u64) -> Option<&mut DatasetState> {
        self.datasets
            .values_mut()
            .find_map(|served| match &served.named {
                Some((n, i)) if n == name && *i == id && !served.state.dropped() => {
                    Some(&mut served.state)
                }
                _ => None,
            })
    }

    /// The cluster record of `revision` was read: its named datasets are followed, unless
    /// it is older than one followed before (it could bring back a dataset dropped since).
    /// A dataset it no longer lists, or lists under another id (dropped and made again), is
    /// marked dropped; one it lists with more fields takes them; what the router does beside
    /// — let go of the dropped, open what it does not serve — is returned, the drops first.
    pub fn follow_record<'a>(
        &mut self,
        record: &'a ClusterRecord,
        revision: u64,
    ) -> Vec<Follow<'a>> {
        if !self.follow(revision) {
            return Vec::new();
        }
        // What it serves, owned, so that the datasets can be changed as the changes come.
        let serving: Vec<(String, u64, usize)> = self
            .named()
            .map(|(name, id, state)| (name.to_string(), id, state.fields().len()))
            .collect();
        let known: Vec<Known> = serving
            .iter()
            .map(|(name, id, fields)| Known {
                name,
                id: *id,
                fields: *fields,
            })
            .collect();
        let mut follow = Vec::new();
        for change in router_changes(record, &known) {
            match change {
                Adopt::Drop { name, id } => {
                    if let Some(dataset) = self.named_mut(name, id) {
                        dataset.drop_it();
                    }
                    let name = name.to_string();
                    follow.push(Follow::Dropped { name, id });
                }
                Adopt::Fields(dataset) => {
                    if let Some(served) = self.named_mut(&dataset.name, dataset.id) {
                        served.recorded_fields(wire_fields(&dataset.fields));
                    }
                }
                Adopt::Open(dataset) => follow.push(Follow::Open(dataset)),
            }
        }
        follow
    }

    /// The named datasets served and not dropped: name, id and state.
    fn named(&self) -> impl Iterator<Item = (&str, u64, &DatasetState)> {
        self.datasets.values().filter_map(|served| {
            let (name, id) = served.named.as_ref()?;
            (!served.state.dropped()).then_some((name.as_str(), *id, &served.state))
        })
    }

    /// The named datasets served and not dropped, as (name, id), by name.
    pub fn serving(&self) -> Vec<(&str, u64)> {
        let mut serving: Vec<(&str, u64)> = self.named().map(|(name, id, _)| (name, id)).collect();
        serving.sort_unstable();
        serving
    }

    /// How many datasets are served (the default one among them).
    pub fn datasets(&self) -> usize {
        self.datasets.len()
    }

    /// A cluster record of `revision` was read: true if its datasets are to be followed
    /// (it is no older than the one followed, which it now is); an older one is ignored,
    /// since it would bring back a dataset dropped since.
    pub fn follow(&mut self, revision: u64) -> bool {
        if revision < self.followed {
            return false;
        }
        self.followed = revision;
        true
    }

    /// This router wrote the cluster record at `revision` itself (a drop): records older
    /// than that are not followed from now on.
    pub fn wrote(&mut self, revision: u64) {
        self.followed = self.followed.max(revision);
    }

    /// Whether a record of `revision` is older than the one followed.
    pub fn outdated(&self, revision: u64) -> bool {
        revision < self.followed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_record_is_never_followed() {
        let mut state = coordinator();
        assert!(state.follow(0), "the first read");
        assert!(state.follow(5));
        assert!(state.follow(5), "the same record again");
        assert!(
            !state.follow(4),
            "older: it may list a dataset dropped since"
        );
        assert!(state.outdated(4) && !state.outdated(5));
        // A drop this router wrote at 9: what it read before is outdated.
        state.wrote(9);
        assert!(!state.follow(7));
        assert!(state.follow(9));
        state.wrote(3);
        assert!(
            state.outdated(8),
            "a write of an older revision moves nothing back"
        );
    }

    #[test]
    fn each_dataset_opened_is_its_own_until_closed() {
        let mut coordinator = coordinator();
        let default = coordinator.open(None, 2, Vec::new());
        let named = coordinator.open(Some(("text", 1)), 2, Vec::new());
        let lease = coordinator.dataset(named).map(|d| d.lease.me());
        assert_eq!(lease, Some(1), "the router's own name for its leases");
        assert_ne!(default, named);
        assert_eq!(coordinator.datasets(), 2);
        // What one is told stays its own.
        let named_state = coordinator.dataset_mut(named).expect("named is open");
        named_state.lengths.set_len(7);
        assert_eq!(coordinator.dataset(named).map(|d| d.lengths.len()), Some(7));
        assert_eq!(
            coordinator.dataset(default).map(|d| d.lengths.len()),
            Some(0)
        );
        // Closed (its last handle gone), it is served no more; one made again under the
        // same name is another, with a key of its own.
        let closed = coordinator.close(named).expect("it was open");
        assert_eq!(closed.lengths.len(), 7);
        assert!(coordinator.dataset(named).is_none());
        assert!(coordinator.close(named).is_none(), "closed once");
        let again = coordinator.open(Some(("text", 2)), 2, Vec::new());
        assert_ne!(again, named);
        assert_eq!(coordinator.dataset(again).map(|d| d.lengths.len()), Some(0));
        assert_eq!(coordinator.datasets(), 2);
    }

    #[test]
    fn a_record_is_followed_by_drops_opens_and_fields_never_an_older_one() {
        use crate::datasets::tests::{dataset, record};
        let raw = |names: &[&str]| names.iter().map(|f| FieldInfo::new(*f, "raw")).collect();
        let mut coordinator = coordinator();
        let default = coordinator.open(None, 2, raw(&["x"]));
        let text = coordinator.open(Some(("text", 3)), 2, raw(&["a"]));
        let images = coordinator.open(Some(("images", 5)), 2, raw(&["p"]));
        let read = record(
            vec![
                dataset("text", 3, &["a", "b"]),
                dataset("images", 8, &["p"]),
                dataset("new", 9, &["y"]),
            ],
            9,
        );
        let follow = coordinator.follow_record(&read, 20);
        assert_eq!(
            follow,
            vec![
                Follow::Dropped {
                    name: "images".into(),
                    id: 5
                },
                Follow::Open(&read.datasets[1]),
                Follow::Open(&read.datasets[2]),
            ],
            "images made again under id 8 is another dataset"
        );
        let fields = |key| coordinator.dataset(key).map(|d| d.fields().len());
        assert_eq!(fields(text), Some(2), "the fields added are taken");
        assert_eq!(
            fields(default),
            Some(1),
            "the default dataset is no record's"
        );
        assert!(coordinator.dataset(images).is_some_and(|d| d.dropped()));
        // The new ones opened: the same record again asks for nothing.
        coordinator.open(Some(("images", 8)), 2, raw(&["p"]));
        coordinator.open(Some(("new", 9)), 2, raw(&["y"]));
        assert_eq!(coordinator.follow_record(&read, 20), Vec::new());
        // An older record, read before a drop, brings nothing back and drops nothing.
        let older = record(vec![dataset("text", 3, &["a", "b"])], 9);
        assert_eq!(coordinator.follow_record(&older, 19), Vec::new());
        assert!(coordinator.dataset(text).is_some_and(|d| !d.dropped()));
        // A newer one without "text": dropped once, and the handle let go closes it.
        let newer = record(
            vec![dataset("images", 8, &["p"]), dataset("new", 9, &["y"])],
            10,
        );
        let dropped = vec![Follow::Dropped {
            name: "text".into(),
            id: 3,
        }];
        assert_eq!(coordinator.follow_record(&newer, 21), dropped);
        assert_eq!(coordinator.follow_record(&newer, 21), Vec::new());
        assert!(coordinator.close(text).is_some());
        assert_eq!(coordinator.datasets(), 4);
    }

    /// A coordinator for the tests.
    fn coordinator() -> Coordinator {
        Coordinator::new(1, Duration::from_secs(8), Replicas::new(1))
    }

    /// A router as a driver runs one: its coordinator, and the handle (key) of each named
    /// dataset it opened, by name and id, let go when the coordinator says it was dropped.
    struct Driver {
        /// The run's seed, for the failures to name.
        seed: u64,
        coordinator: Coordinator,
        handles: Vec<(String, u64, DatasetKey)>,
        /// The revision of the newest record it followed by reading it.
        read: u64,
        /// Every (name, id) it ever let go of: none is opened again.
        let_go: Vec<(String, u64)>,
    }

    impl Driver {
        fn new(seed: u64) -> Driver {
            Driver {
                seed,
                coordinator: coordinator(),
                handles: Vec::new(),
                read: 0,
                let_go: Vec::new(),
            }
        }

        /// Reads `record` of `revision` and does what the coordinator answers.
        fn read(&mut self, record: &ClusterRecord, revision: u64) {
            if !self.coordinator.outdated(revision) {
                self.read = revision;
            }
            for step in self.coordinator.follow_record(record, revision) {
                match step {
                    Follow::Dropped { name, id } => self.let_go(&name, id),
                    Follow::Open(dataset) => {
                        let (name, id) = (dataset.name.as_str(), dataset.id);
                        assert!(
                            !self.let_go.iter().any(|(n, i)| n == name && *i == id),
                            "seed {}: {name} (id {id}) opened again after it was dropped",
                            self.seed
                        );
                        let fields = crate::datasets::wire_fields(&dataset.fields);
                        let key = self.coordinator.open(Some((name, id)), 2, fields);
                        self.handles.push((name.to_string(), id, key));
                    }
                }
            }
        }

        /// Lets go of the handle of `name` of id `id`: its state leaves the coordinator.
        fn let_go(&mut self, name: &str, id: u64) {
            let at = self
                .handles
                .iter()
                .position(|(n, i, _)| n == name && *i == id);
            let (_, _, key) = self.handles.remove(at.expect("a handle for each drop"));
            assert!(self.coordinator.close(key).is_some_and(|d| d.dropped()));
            self.let_go.push((name.to_string(), id));
        }
    }

    /// Routers read a cluster record that datasets are made in, dropped from (by the
    /// routers themselves too) and given fields, each read answered late, so that they come
    /// in any order: after every step each router serves exactly the datasets of the
    /// newest record it followed, with its fields; none is ever opened again once dropped;
    /// once every router reads the newest record, all serve the same. Seeded
    /// (`ZR_FOLLOW_SEED` replays one).
    #[test]
    fn routers_reading_records_out_of_order_serve_the_newest_they_followed() {
        use crate::datasets::tests::{dataset, record};
        let seeds = match std::env::var("ZR_FOLLOW_SEED") {
            Ok(seed) => vec![seed.parse().expect("ZR_FOLLOW_SEED is a number")],
            Err(_) => (0..200).collect::<Vec<u64>>(),
        };
        for seed in seeds {
            let mut drawn = 0u64;
            let mut below = |n: u64| {
                drawn += 1;
                zr_common::hash::mix2(seed, drawn) % n.max(1)
            };
            // The store's history: the record at each revision (revision = position).
            let mut history = vec![record(Vec::new(), 0)];
            let mut routers: Vec<Driver> = (0..3).map(|_| Driver::new(seed)).collect();
            // Reads under way: (router, revision read), answered in any order.
            let mut reads: Vec<(usize, u64)> = Vec::new();
            let names = ["a", "b", "c"];
            for _ in 0..120 {
                let newest = history.len() as u64 - 1;
                let mut next = history[newest as usize].clone();
                match below(6) {
                    // A dataset made (again, under a new id, if it was before).
                    0 => {
                        let name = names[below(3) as usize];
                        if next.dataset(name).is_none() {
                            next.dataset_ids += 1;
                            next.datasets.push(dataset(name, next.dataset_ids, &["x"]));
                            history.push(next);
                        }
                    }
                    // A field added to a dataset.
                    1 => {
                        let name = names[below(3) as usize];
                        let grown = next.datasets.iter_mut().find(|d| d.name == name);
                        if let Some(grown) = grown {
                            let mut field = grown.fields[0].clone();
                            field.name = format!("f{}", grown.fields.len());
                            grown.fields.push(field);
                            history.push(next);
                        }
                    }
                    // A router drops a dataset it serves: it stores the record, notes it
                    // wrote that revision, and lets go of the dataset at once.
                    2 => {
                        let r = below(3) as usize;
                        let serving = routers[r].coordinator.serving();
                        let current = serving
                            .into_iter()
                            .find(|(name, id)| next.dataset(name).is_some_and(|d| d.id == *id))
                            .map(|(name, id)| (name.to_string(), id));
                        if let Some((name, id)) = current {
                            next.datasets.retain(|d| d.name != name);
                            next.dataset_ids += 1;
                            history.push(next);
                            let router = &mut routers[r];
                            router.coordinator.wrote(newest + 1);
                            let key = router.handles.iter().find(|h| h.0 == name && h.1 == id);
                            let key = key.expect("a handle of each dataset served").2;
                            if let Some(dropped) = router.coordinator.dataset_mut(key) {
                                dropped.drop_it();
                            }
                            router.let_go(&name, id);
                        }
                    }
                    // A read begins, of the record as it is now.
                    3 | 4 => reads.push((below(3) as usize, newest)),
                    // A read under way is answered.
                    _ => {
                        if !reads.is_empty() {
                            let (r, revision) = reads.remove(below(reads.len() as u64) as usize);
                            routers[r].read(&history[revision as usize], revision);
                        }
                    }
                }
                for (r, router) in routers.iter().enumerate() {
                    check(seed, r, router, &history);
                }
            }
            let newest = history.len() as u64 - 1;
            for (r, router) in routers.iter_mut().enumerate() {
                router.read(&history[newest as usize], newest);
                check(seed, r, router, &history);
            }
            let serving: Vec<_> = routers.iter().map(|r| r.coordinator.serving()).collect();
            assert!(
                serving.windows(2).all(|w| w[0] == w[1]),
                "seed {seed}: {serving:?}"
            );
        }
    }

    /// Router `r` serves what the newest record it read lists, but for the drops it wrote
    /// itself, each with that record's fields, and holds a handle of each.
    fn check(seed: u64, r: usize, router: &Driver, history: &[ClusterRecord]) {
        let followed = &history[router.read as usize];
        let mut listed: Vec<(&str, u64)> = followed
            .datasets
            .iter()
            .map(|d| (d.name.as_str(), d.id))
            .collect();
        listed.sort_unstable();
        let serving = router.coordinator.serving();
        let said = format!(
            "seed {seed} router {r} having read revision {}",
            router.read
        );
        // A drop this router wrote itself is served no more even before it reads it back.
        let dropped_here =
            |(name, id): &(&str, u64)| router.let_go.iter().any(|(n, i)| n == name && i == id);
        listed.retain(|d| !dropped_here(d));
        assert_eq!(serving, listed, "{said}");
        assert_eq!(router.handles.len(), serving.len(), "{said}");
        for (name, id, key) in &router.handles {
            let state = router.coordinator.dataset(*key).expect("open while held");
            let recorded = followed.dataset(name).filter(|d| d.id == *id);
            let recorded = recorded.map_or(0, |d| d.fields.len());
            assert_eq!(state.fields().len(), recorded, "{said}: {name}'s fields");
        }
    }
}
