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
//! server that was down when it was made applies it from its start.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use zr_proto::wire::Grant;

use crate::{Error, MetaStore, Revision};

/// The key of the access record.
pub const ACCESS_KEY: &str = "access";

/// How often routers and nodes read the record.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

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
    Ok(
        match crate::load_json(store, ACCESS_KEY, "the access record").await? {
            Some((record, revision)) => (record, Some(revision)),
            None => (AccessRecord::default(), None),
        },
    )
}

/// Applies `change` to the record by compare-and-swap, read afresh after each conflict;
/// returns the record written (or as it was, if `change` left it so).
pub async fn update<E: From<Error>>(
    store: &dyn MetaStore,
    change: impl Fn(&AccessRecord) -> Result<AccessRecord, E>,
) -> Result<AccessRecord, E> {
    loop {
        let (record, revision) = load(store).await?;
        let next = change(&record)?;
        if next == record {
            return Ok(record);
        }
        match crate::store_json(store, ACCESS_KEY, revision, &next, "the access record").await {
            Ok(_) => return Ok(next),
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Adds `name` to the revoked names (`undo`: takes it out); returns the record written.
pub async fn revoke(store: &dyn MetaStore, name: &str, undo: bool) -> Result<AccessRecord, Error> {
    let name = name.to_string();
    update(store, |record| {
        Ok::<_, Error>(toggled(record, |r| &mut r.revoked, &name, undo))
    })
    .await
}

/// Adds `serial` to the revoked serial numbers (`undo`: takes it out); returns the record
/// written.
pub async fn revoke_serial(
    store: &dyn MetaStore,
    serial: &str,
    undo: bool,
) -> Result<AccessRecord, Error> {
    let serial = serial.to_string();
    update(store, |record| {
        Ok::<_, Error>(toggled(record, |r| &mut r.revoked_serials, &serial, undo))
    })
    .await
}

/// Adds `grant` (`undo`: takes it out); returns the record written.
pub async fn grant(
    store: &dyn MetaStore,
    grant: &Grant,
    undo: bool,
) -> Result<AccessRecord, Error> {
    update(store, |record| {
        Ok::<_, Error>(toggled(record, |r| &mut r.grants, grant, undo))
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
#[derive(Debug, Default)]
pub struct AccessControl {
    record: RwLock<Arc<AccessRecord>>,
}

impl AccessControl {
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

    /// Reads the record into this once.
    pub async fn refresh(&self, store: &dyn MetaStore) -> Result<(), Error> {
        let (record, _) = load(store).await?;
        self.set(record);
        Ok(())
    }
}

/// Reads the record into `control` every [`WATCH_EVERY`], for as long as it runs. A store
/// that cannot be read keeps the record last read (logged once until it answers again).
pub async fn watch(store: Arc<dyn MetaStore>, control: Arc<AccessControl>) {
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
}
