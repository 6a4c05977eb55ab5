//! Who may do what beyond their certificate's role, kept under [`ACCESS_KEY`] and changed
//! only by compare-and-swap:
//! - revoked certificate names and serial numbers (`zr cluster revoke --name|--serial`),
//!   refused everywhere;
//! - grants (`zr grant`): read or write on datasets by name or prefix, per certificate name.
//!   A cluster with no grant lets every role do what it does today; with grants, a reader
//!   or writer reads (writes) only the datasets some grant of its name covers. Operators
//!   see and do everything.
//!
//! Every router and node reads it before it serves and every [`WATCH_EVERY`] after
//! ([`watch`]), so a change reaches every open connection within a few seconds, and a
//! server that was down when it was made applies it from its start. A refusal is never made
//! by a record read before the request arrived: a server about to refuse reads the record
//! again first ([`AccessControl::confirmed_since`]), so a certificate granted (or served
//! again) a moment ago is served at once by every router and node.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use serde::{Deserialize, Serialize};
pub use zr_proto::wire::Grant;

use crate::{Error, MetaStore, Revision};

/// The key of the access record.
pub const ACCESS_KEY: &str = "access";

/// How often routers and nodes read the record.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Fewest time between two reads that confirm refusals: requests refused in a stream (a
/// misconfigured job, a hostile one) read the store at most this often, each waiting for
/// the next read.
pub const CONFIRM_EVERY: Duration = Duration::from_millis(50);

/// The access record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessRecord {
    /// The certificate names refused.
    #[serde(default)]
    pub revoked: BTreeSet<String>,
    /// The serial numbers of certificates refused (lower-case hex, see
    /// `zr_net::tls::serial_hex`): one certificate, where its name may have several.
    #[serde(default)]
    pub revoked_serials: BTreeSet<String>,
    /// What names may read or write, where.
    #[serde(default)]
    pub grants: BTreeSet<Grant>,
}

impl AccessRecord {
    /// Whether the certificate named `who` may read (`write`: write) dataset `dataset`
    /// under the grants: always while there are none.
    pub fn allows(&self, who: &str, dataset: &str, write: bool) -> bool {
        self.grants.is_empty()
            || self
                .grants
                .iter()
                .any(|g| g.who == who && (g.write || !write) && g.covers(dataset))
    }
}

/// The record and its revision (`None`: there is none yet).
pub async fn load(store: &dyn MetaStore) -> Result<(AccessRecord, Option<Revision>), Error> {
    crate::load_or_default(store, ACCESS_KEY, "the access record").await
}

/// Applies `change` to the record by compare-and-swap, read afresh after each conflict;
/// returns the record written (or as it was, if `change` left it so).
pub async fn update<E: From<Error>>(
    store: &dyn MetaStore,
    change: impl Fn(&AccessRecord) -> Result<AccessRecord, E>,
) -> Result<AccessRecord, E> {
    crate::update_json(store, ACCESS_KEY, "the access record", change).await
}

/// Adds `name` to the revoked names (`undo`: takes it out); returns the record written.
pub async fn revoke(store: &dyn MetaStore, name: &str, undo: bool) -> Result<AccessRecord, Error> {
    toggle(store, |r| &mut r.revoked, &name.to_string(), undo).await
}

/// Adds `serial` to the revoked serial numbers (`undo`: takes it out); returns the record
/// written.
pub async fn revoke_serial(
    store: &dyn MetaStore,
    serial: &str,
    undo: bool,
) -> Result<AccessRecord, Error> {
    toggle(store, |r| &mut r.revoked_serials, &serial.to_string(), undo).await
}

/// Adds `grant` (`undo`: takes it out); returns the record written.
pub async fn grant(
    store: &dyn MetaStore,
    grant: &Grant,
    undo: bool,
) -> Result<AccessRecord, Error> {
    toggle(store, |r| &mut r.grants, grant, undo).await
}

/// Puts `item` in the set `set` picks (`undo`: takes it out), by compare-and-swap; returns
/// the record written.
async fn toggle<T: Ord + Clone>(
    store: &dyn MetaStore,
    set: impl Fn(&mut AccessRecord) -> &mut BTreeSet<T>,
    item: &T,
    undo: bool,
) -> Result<AccessRecord, Error> {
    update(store, |record| {
        Ok::<_, Error>(toggled(record, &set, item, undo))
    })
    .await
}

/// `record` with `item` in the set `set` picks (`undo`: out of it).
fn toggled<T: Ord + Clone>(
    record: &AccessRecord,
    set: impl Fn(&mut AccessRecord) -> &mut BTreeSet<T>,
    item: &T,
    undo: bool,
) -> AccessRecord {
    let mut next = record.clone();
    if undo {
        set(&mut next).remove(item);
    } else {
        set(&mut next).insert(item.clone());
    }
    next
}

/// The access record as a server last read it; shared by its request handlers.
#[derive(Default)]
pub struct AccessControl {
    record: RwLock<Arc<AccessRecord>>,
    /// Where the record is kept, once told ([`Self::keep_store`], [`watch`]).
    store: OnceLock<Arc<dyn MetaStore>>,
    /// When the newest read whose record was taken began.
    read_began: Mutex<Option<Instant>>,
    /// When the newest read that ended, answered or not, began.
    tried_began: Mutex<Option<Instant>>,
    /// Held by the one read that confirms refusals at a time.
    confirming: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for AccessControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessControl")
            .field("record", &self.record())
            .finish_non_exhaustive()
    }
}

impl AccessControl {
    /// Reads the record from `store` to confirm refusals from now on (the first store told
    /// is kept).
    pub fn keep_store(&self, store: Arc<dyn MetaStore>) {
        let _ = self.store.set(store);
    }

    /// The record to judge a request that arrived at `arrived` by, before refusing it: the
    /// one last read if that read began after `arrived`, else the record read again. One
    /// such read runs at a time for every caller, and at most one every [`CONFIRM_EVERY`].
    /// Without a store to read (none told) or if it does not answer, the record last read.
    pub async fn confirmed_since(&self, arrived: Instant) -> Arc<AccessRecord> {
        let Some(store) = self.store.get() else {
            return self.record();
        };
        let _one = self.confirming.lock().await;
        // A read begun since, answered or not (a store that does not answer fails each
        // refusal waiting once, not once each).
        let last = *self.tried_began.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|began| began > arrived) {
            return self.record();
        }
        if let Some(began) = last {
            tokio::time::sleep_until(began + CONFIRM_EVERY).await;
        }
        if let Err(e) = self.refresh(&**store).await {
            tracing::debug!("cannot read the access record to confirm a refusal: {e}");
        }
        self.record()
    }

    /// The record as last read.
    pub fn record(&self) -> Arc<AccessRecord> {
        Arc::clone(&self.record.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Why a certificate named `name`, of serial number `serial` (if `zr cluster issue` made
    /// it), is refused, if it is revoked by its name or its serial: the words routers and
    /// nodes answer with.
    pub fn revoked_why(&self, name: &str, serial: Option<&str>) -> Option<String> {
        let record = self.record.read().unwrap_or_else(|e| e.into_inner());
        if record.revoked.contains(name) {
            return Some(format!(
                "the certificate named '{name}' is revoked (an operator serves it again with `zr cluster revoke --name {name} --undo`)"
            ));
        }
        let serial = serial.filter(|s| record.revoked_serials.contains(*s))?;
        Some(format!(
            "the certificate named '{name}' of serial number {serial} is revoked (an operator serves it again with `zr cluster revoke --serial {serial} --undo`)"
        ))
    }

    /// Whether there are grants (a cluster with none checks none).
    pub fn has_grants(&self) -> bool {
        !self
            .record
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .grants
            .is_empty()
    }

    /// Takes `record` as the one in force from now on.
    pub fn set(&self, record: AccessRecord) {
        *self.record.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(record);
    }

    /// Reads the record into this once. The record is taken unless one read by a later
    /// read was taken already; the read counts as tried for [`Self::confirmed_since`]
    /// whether or not the store answered.
    pub async fn refresh(&self, store: &dyn MetaStore) -> Result<(), Error> {
        let began = Instant::now();
        let read = load(store).await;
        {
            let mut tried = self.tried_began.lock().unwrap_or_else(|e| e.into_inner());
            *tried = (*tried).max(Some(began));
        }
        let (record, _) = read?;
        let mut last = self.read_began.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|last| last <= began) {
            self.set(record);
            *last = Some(began);
        }
        Ok(())
    }
}

/// Reads the record into `control` every [`WATCH_EVERY`], for as long as it runs. A store
/// that cannot be read keeps the record last read (logged once until it answers again).
pub async fn watch(store: Arc<dyn MetaStore>, control: Arc<AccessControl>) {
    control.keep_store(Arc::clone(&store));
    let mut failing = false;
    loop {
        match control.refresh(&*store).await {
            Ok(()) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::warn!("cannot read the access record: {e}");
                }
                failing = true;
            }
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant_of(who: &str, write: bool, pattern: &str) -> Grant {
        Grant {
            who: who.into(),
            write,
            pattern: pattern.into(),
        }
    }

    #[test]
    fn grants_cover_names_and_prefixes_and_write_implies_read() {
        let mut record = AccessRecord::default();
        assert!(
            record.allows("anyone", "anything", true),
            "no grants: as before"
        );
        record.grants.insert(grant_of("team-a", false, "imgs*"));
        record.grants.insert(grant_of("team-w", true, "text"));
        assert!(record.allows("team-a", "imgs", false));
        assert!(record.allows("team-a", "imgs-2024", false));
        assert!(!record.allows("team-a", "imgs", true), "read only");
        assert!(!record.allows("team-a", "text", false));
        assert!(record.allows("team-w", "text", true) && record.allows("team-w", "text", false));
        assert!(
            !record.allows("team-w", "text-2", false),
            "a name is not a prefix"
        );
        assert!(
            !record.allows("team-b", "imgs", false),
            "no grant of its own"
        );
    }

    #[test]
    fn the_record_survives_the_store_and_changes_can_be_undone() {
        let dir = tempfile::tempdir().unwrap();
        let run = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        run.block_on(async {
            let store = crate::EmbeddedStore::open(dir.path()).unwrap();
            assert_eq!(load(&store).await.unwrap().0, AccessRecord::default());
            revoke(&store, "team-a", false).await.unwrap();
            revoke(&store, "team-b", false).await.unwrap();
            revoke(&store, "team-a", false).await.unwrap(); // twice: no change
            let g = grant_of("team-c", false, "imgs*");
            grant(&store, &g, false).await.unwrap();
            let control = AccessControl::default();
            revoke_serial(&store, "0a1b", false).await.unwrap();
            let revoked = |name: &str| control.revoked_why(name, None).is_some();
            assert!(!revoked("team-a"), "not before it is read");
            control.refresh(&store).await.unwrap();
            assert!(revoked("team-a") && revoked("team-b"));
            assert!(!revoked("team-c") && control.has_grants());
            assert!(
                control.revoked_why("team-c", Some("0a1b")).is_some(),
                "by its serial"
            );
            assert!(control.revoked_why("team-c", Some("0a1c")).is_none());
            revoke(&store, "team-a", true).await.unwrap();
            grant(&store, &g, true).await.unwrap();
            revoke_serial(&store, "0a1b", true).await.unwrap();
            drop(store);
            let store = crate::EmbeddedStore::open(dir.path()).unwrap();
            control.refresh(&store).await.unwrap();
            assert!(!revoked("team-a") && revoked("team-b"));
            assert!(control.revoked_why("team-c", Some("0a1b")).is_none());
            assert!(!control.has_grants());
        });
    }

    /// A store that counts its reads, and fails them while `down`.
    #[derive(Debug)]
    struct Counting {
        inner: crate::EmbeddedStore,
        gets: std::sync::atomic::AtomicUsize,
        down: std::sync::atomic::AtomicBool,
    }

    impl MetaStore for Counting {
        fn describe(&self) -> String {
            self.inner.describe()
        }

        fn get(&self, key: &str) -> crate::Call<'_, Option<(String, Revision)>> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                let down = Error::Unavailable {
                    store: self.describe(),
                    reason: "down".into(),
                };
                return Box::pin(async move { Err(down) });
            }
            self.inner.get(key)
        }

        fn put_if(
            &self,
            key: &str,
            expected: Option<Revision>,
            value: &str,
        ) -> crate::Call<'_, Revision> {
            self.inner.put_if(key, expected, value)
        }
    }

    /// `count` refusals of requests that arrived at `arrived`, confirmed at once.
    async fn together(
        control: &Arc<AccessControl>,
        arrived: Instant,
        count: usize,
    ) -> Vec<Arc<AccessRecord>> {
        let confirming: Vec<_> = (0..count)
            .map(|_| {
                let control = Arc::clone(control);
                tokio::spawn(async move { control.confirmed_since(arrived).await })
            })
            .collect();
        let mut confirmed = Vec::new();
        for task in confirming {
            confirmed.push(task.await.unwrap());
        }
        confirmed
    }

    /// A refusal is confirmed by a record read after the request arrived: a grant stored
    /// since the last read holds at once. Refusals arriving together share one read, and
    /// reads to confirm come no more often than every `CONFIRM_EVERY`.
    #[test]
    fn refusals_are_confirmed_by_a_fresh_read_shared_and_paced() {
        let dir = tempfile::tempdir().unwrap();
        let run = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        run.block_on(async {
            let store = Arc::new(Counting {
                inner: crate::EmbeddedStore::open(dir.path()).unwrap(),
                gets: Default::default(),
                down: Default::default(),
            });
            let gets = || store.gets.load(std::sync::atomic::Ordering::SeqCst);
            let control = Arc::new(AccessControl::default());
            control.keep_store(Arc::clone(&store) as Arc<dyn MetaStore>);
            grant(&*store, &grant_of("team-a", false, "imgs"), false)
                .await
                .unwrap();
            control.refresh(&*store).await.unwrap();
            // Team B is granted after the server's last read; its requests arrive after.
            grant(&*store, &grant_of("team-b", false, "text"), false)
                .await
                .unwrap();
            let read = gets();
            tokio::time::sleep(Duration::from_millis(10)).await;
            let arrived = Instant::now();
            assert!(!control.record().allows("team-b", "text", false), "stale");
            for confirmed in together(&control, arrived, 50).await {
                assert!(confirmed.allows("team-b", "text", false));
            }
            assert_eq!(gets(), read + 1, "fifty refusals, one read");
            assert!(
                arrived.elapsed() >= CONFIRM_EVERY - Duration::from_millis(10),
                "paced: {:?}",
                arrived.elapsed()
            );
            // A store that does not answer: the refusals waiting fail its read once, together,
            // and keep the record last read.
            store.down.store(true, std::sync::atomic::Ordering::SeqCst);
            let (read, arrived) = (gets(), Instant::now());
            for confirmed in together(&control, arrived, 20).await {
                assert!(confirmed.allows("team-b", "text", false));
            }
            assert_eq!(gets(), read + 1, "twenty refusals, one failed read");
            store.down.store(false, std::sync::atomic::Ordering::SeqCst);
            // Without a store told, the record last read (none: nothing read yet).
            let (control, since) = (AccessControl::default(), Instant::now());
            assert_eq!(
                *control.confirmed_since(since).await,
                AccessRecord::default()
            );
            // A refusal that still holds after the read is one.
            let control = AccessControl::default();
            control.keep_store(Arc::clone(&store) as Arc<dyn MetaStore>);
            let record = control.confirmed_since(Instant::now()).await;
            assert!(!record.allows("team-c", "text", false));
        });
    }
}
