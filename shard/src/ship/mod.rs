//! Rebuilding a replica's dataset from its partner's files, node to node.
//!
//! A replica that lost a dataset (a wiped or replaced disk) would be caught up record by
//! record through the router; instead the router asks it (`NodeRequest::ShipFrom`) to copy
//! the dataset's files from an in-sync partner. The partner takes a snapshot — the files as
//! of its last commit (`zr_node::ship`) — and serves their bytes in pieces
//! (`ShipOpen`, `ShipRead`), each with its CRC32, checked on arrival (a damaged piece is
//! asked for again). The replica writes them into `.<dataset>.ship` beside its dataset,
//! makes them durable, opens them as a dataset, and swaps them in as a move's switch does
//! (its own identity and fence kept). The records written since the snapshot, and any that
//! differ, are then caught up by the router's digest comparison, as for any behind replica.
//!
//! Nodes connect to nodes with their own certificates for this (a node certificate made
//! before these rebuilds cannot: the router then catches up record by record, and says so).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use quinn::Endpoint;
use zr_net as net;
use zr_node::ship::{target_path, Snapshot};
use zr_node::{Error, IoContext, Store};
use zr_proto::wire::{
    self, NodeMessage, NodeRequest, Reply, ShipFile, ShipStatus, Target, SHIP_PIECES_MAX,
    SHIP_PIECE_MAX,
};

use crate::stage::Shard;

mod fetch;
use fetch::{Fetch, Pace};

/// Bytes one `ShipRead` asks for.
const PIECE_BYTES: u32 = 4 << 20;
/// Pieces asked for at once.
const PIECES_IN_FLIGHT: usize = 8;
/// Times a piece whose CRC does not match is asked for before the rebuild gives up.
const PIECE_TRIES: u32 = 3;
/// Snapshots a node keeps open for partners at once (the oldest is let go first).
const OPEN_MAX: usize = 8;
/// Bound on each exchange with the partner.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A snapshot no piece was asked of for this long is let go (its reader gone): while one
/// is held, the dataset's commits keep changes to existing records in the redo log.
const OPEN_IDLE: Duration = Duration::from_secs(60);
/// How long a finished rebuild is reported as finished to routers that ask again.
const FINISHED_KEPT: Duration = Duration::from_secs(60);

/// Why a rebuild from files, or a request of one, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShipError {
    /// A piece asked of a snapshot this node does not keep.
    #[error("no snapshot {0:016x} is open here (this node restarted, or opened {OPEN_MAX} others since): open another")]
    NoSnapshot(u64),
    #[error("snapshot {ship:016x} has no file {file}")]
    NoFile { ship: u64, file: u32 },
    /// This node cannot rebuild from a partner (why).
    #[error("this node cannot rebuild from a partner: {0}")]
    Cannot(String),
    /// The partner could not be reached, refused, or sent something wrong.
    #[error("rebuilding from {partner} at {addr}: {reason}")]
    Partner {
        partner: Target,
        addr: SocketAddr,
        reason: String,
    },
    /// The files could not be read, written or opened.
    #[error(transparent)]
    Store(#[from] Error),
}

type Result<T, E = ShipError> = std::result::Result<T, E>;

/// Datasets this process's nodes rebuilt from files, and pieces they asked for again.
static REBUILT: AtomicU64 = AtomicU64::new(0);
static ASKED_AGAIN: AtomicU64 = AtomicU64::new(0);
/// Slots this process's nodes took from other nodes' files for a move.
static SLOTS_COPIED: AtomicU64 = AtomicU64::new(0);

/// Slots the nodes of this process took from other nodes' files for a shard move (also the
/// metric `zr_node_slots_copied_from_files_total`).
pub fn slots_copied() -> u64 {
    SLOTS_COPIED.load(Ordering::SeqCst)
}

/// Datasets the nodes of this process rebuilt from a partner's files, and pieces they asked
/// for again because they arrived damaged (also the metrics
/// `zr_node_datasets_rebuilt_from_files_total` and `zr_node_ship_pieces_asked_again_total`).
pub fn counts() -> (u64, u64) {
    (
        REBUILT.load(Ordering::SeqCst),
        ASKED_AGAIN.load(Ordering::SeqCst),
    )
}

/// Faults a test injects into the pieces one node serves its partners (given to the node
/// with `server::Serving::ship_faults`; none in production).
#[derive(Debug, Default)]
pub struct ShipFaults {
    /// Pieces still to be served damaged.
    damage_next: AtomicU32,
}

impl ShipFaults {
    /// Makes the next `pieces` pieces the node serves arrive damaged (one byte flipped
    /// after their CRC is taken), as a fault in transit would.
    pub fn damage_next_pieces(&self, pieces: u32) {
        self.damage_next.store(pieces, Ordering::SeqCst);
    }

    /// True if the piece being served is to be damaged (one fewer to go).
    fn damage(&self) -> bool {
        self.damage_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// A node's rebuilds by files: the snapshots it serves its partners, and its own datasets
/// being rebuilt.
#[derive(Default)]
pub struct Ships {
    /// Open snapshots: id, snapshot, when a piece was last asked of it.
    open: Mutex<Vec<(u64, Arc<Snapshot>, tokio::time::Instant)>>,
    next_id: AtomicU64,
    fetches: Mutex<HashMap<String, Arc<Mutex<ShipStatus>>>>,
    /// Rebuilds that installed their files, reported since: each router that asks after
    /// one finished is told it finished (with two routers, the one that asks second once
    /// started a second copy, swapped in under reads), while the dataset still holds what
    /// was installed and for [`FINISHED_KEPT`] at most.
    finished: Mutex<HashMap<String, (ShipStatus, tokio::time::Instant)>>,
    /// How this node reaches its partners: its endpoint and credentials (unset: it cannot).
    reach: Mutex<Option<(Endpoint, net::Security)>>,
    /// The rate this node's copies for a move keep to, together.
    pace: Arc<Pace>,
    /// Faults injected into the pieces served (tests).
    faults: std::sync::OnceLock<Arc<ShipFaults>>,
}

impl Ships {
    /// Serves pieces with `faults` from now on (tests; set once).
    pub fn inject(&self, faults: Arc<ShipFaults>) {
        let _ = self.faults.set(faults);
    }

    /// Lets this node connect to its partners from `endpoint` with `security`.
    pub fn set_reach(&self, endpoint: Endpoint, security: net::Security) {
        *lock(&self.reach) = Some((endpoint, security));
    }

    /// `ShipOpen`: a snapshot of `store` (of its units `slots` only, if any) kept for
    /// `ShipRead`s, and its manifest.
    pub fn open(self: &Arc<Self>, store: &Store, slots: &[u32], incarnation: u64) -> Result<Reply> {
        let snapshot = Arc::new(if slots.is_empty() {
            store.snapshot()?
        } else {
            store.snapshot_units(slots)?
        });
        let id = zr_common::hash::mix2(incarnation, self.next_id.fetch_add(1, Ordering::Relaxed));
        let files = snapshot
            .files
            .iter()
            .map(|f| ShipFile {
                name: f.name.clone(),
                len: f.len(),
            })
            .collect();
        let len = snapshot.len;
        let mark = snapshot.mark.map(|m| wire::DataMark {
            incarnation,
            instance: m.instance,
            rewrites: m.rewrites,
        });
        let mut open = lock(&self.open);
        if open.len() >= OPEN_MAX {
            open.remove(0);
        }
        let sweeping = !open.is_empty();
        open.push((id, snapshot, tokio::time::Instant::now()));
        drop(open);
        if !sweeping {
            self.sweep_idle();
        }
        Ok(Reply::Manifest {
            ship: id,
            len,
            files,
            mark,
        })
    }

    /// `ShipRead`: a piece of a file of an open snapshot, with its CRC32.
    pub fn read(
        &self,
        ship: u64,
        file: u32,
        offset: u64,
        len: u32,
    ) -> Result<(Reply, bytes::Bytes)> {
        let snapshot = self.snapshot(ship)?;
        let (crc, bytes) = self.piece_of(&snapshot, ship, file, offset, len)?;
        Ok((Reply::Piece { crc }, bytes))
    }

    /// `ShipReadMany`: pieces of files of an open snapshot, with their lengths and CRC32s.
    pub fn read_many(
        &self,
        ship: u64,
        pieces: &[wire::ShipPiece],
    ) -> Result<(Reply, Vec<bytes::Bytes>)> {
        let snapshot = self.snapshot(ship)?;
        let mut sent = Vec::with_capacity(pieces.len());
        let mut body = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let (crc, bytes) =
                self.piece_of(&snapshot, ship, piece.file, piece.offset, piece.len)?;
            sent.push(wire::PieceSent {
                len: bytes.len() as u32,
                crc,
            });
            body.push(bytes);
        }
        Ok((Reply::Pieces { pieces: sent }, body))
    }

    /// Open snapshot `ship`, marked as used now.
    fn snapshot(&self, ship: u64) -> Result<Arc<Snapshot>> {
        lock(&self.open)
            .iter_mut()
            .find(|(id, _, _)| *id == ship)
            .map(|(_, s, used)| {
                *used = tokio::time::Instant::now();
                Arc::clone(s)
            })
            .ok_or(ShipError::NoSnapshot(ship))
    }

    /// Bytes `offset..offset + len` of file `file` of `snapshot` (`ship`), and their CRC32
    /// (damaged after it is taken if a test asked for it).
    fn piece_of(
        &self,
        snapshot: &Snapshot,
        ship: u64,
        file: u32,
        offset: u64,
        len: u32,
    ) -> Result<(u32, bytes::Bytes)> {
        let file = snapshot
            .files
            .get(file as usize)
            .ok_or(ShipError::NoFile { ship, file })?;
        let piece = file.piece(offset, (len as usize).min(SHIP_PIECE_MAX))?;
        let crc = crc32fast::hash(piece.as_ref());
        if self.faults.get().is_some_and(|faults| faults.damage()) {
            let mut bytes = piece.as_ref().to_vec();
            if let Some(byte) = bytes.last_mut() {
                *byte ^= 0x5a;
            }
            return Ok((crc, bytes::Bytes::from(bytes)));
        }
        // Sent from where it lies (a chunk's mapping): no copy.
        Ok((crc, bytes::Bytes::from_owner(piece)))
    }

    /// `ShipClose`: lets snapshot `ship` go (nothing if it is gone already).
    pub fn close(&self, ship: u64) {
        lock(&self.open).retain(|(id, _, _)| *id != ship);
    }

    /// Lets go, every few seconds, of snapshots idle for [`OPEN_IDLE`] (a partner that died
    /// mid-copy); ends when none is open.
    fn sweep_idle(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let ships = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(OPEN_IDLE / 4).await;
                let Some(ships) = ships.upgrade() else {
                    return;
                };
                let mut open = lock(&ships.open);
                open.retain(|(_, _, used)| used.elapsed() < OPEN_IDLE);
                if open.is_empty() {
                    return;
                }
            }
        });
    }

    /// `ShipFrom`: starts rebuilding dataset `dataset` of this node (served by `shard`)
    /// from `partner`, the node at `addr`, unless it runs already — or, with `slots`,
    /// copying those slots, which a move builds here, at most `rate` bytes a second with
    /// this node's other copies for the move (0: as fast as it can); returns how far it got
    /// (a finished copy is reported once).
    pub fn start(
        self: &Arc<Self>,
        shard: Arc<Shard>,
        dataset: Option<String>,
        partner: Target,
        addr: &str,
        slots: Vec<u32>,
        rate: u64,
    ) -> Result<ShipStatus> {
        // The rate asked last holds for every copy running (a move run again at another).
        let paced = !slots.is_empty() && rate > 0;
        self.pace.set_rate(if paced { rate } else { 0 });
        // A move copies from several shards at once: one copy per shard it copies from.
        let mut key = dataset.clone().unwrap_or_default();
        if !slots.is_empty() {
            key.push_str(&format!("/slots from shard {}", partner.shard));
        }
        let mut fetches = lock(&self.fetches);
        if let Some(status) = fetches.get(&key) {
            let status = lock(status).clone();
            if status.done {
                fetches.remove(&key);
                if status.error.is_none() && slots.is_empty() {
                    let now = tokio::time::Instant::now();
                    let mut finished = lock(&self.finished);
                    finished.retain(|_, (_, at)| now.duration_since(*at) < FINISHED_KEPT);
                    finished.insert(key, (status.clone(), now));
                }
            }
            return Ok(status);
        }
        if slots.is_empty() {
            let mut finished = lock(&self.finished);
            if let Some((status, at)) = finished.remove(&key) {
                // Still what was installed (not wiped again since): finished, as said.
                if at.elapsed() < FINISHED_KEPT && shard.serving().store.len() >= status.len {
                    finished.insert(key, (status.clone(), at));
                    return Ok(status);
                }
            }
        }
        let addr: SocketAddr = addr.parse().map_err(|e| {
            ShipError::Cannot(format!(
                "the partner's address '{}': {e}",
                addr.escape_debug()
            ))
        })?;
        let Some((endpoint, security)) = lock(&self.reach).clone() else {
            return Err(ShipError::Cannot(
                "it serves without credentials to connect with".into(),
            ));
        };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| ShipError::Cannot("it runs no async runtime".into()))?;
        let status = Arc::new(Mutex::new(ShipStatus {
            done: false,
            bytes: 0,
            total: 0,
            len: 0,
            error: None,
            mark: None,
        }));
        fetches.insert(key, Arc::clone(&status));
        let reported = lock(&status).clone();
        let job = Fetch {
            shard,
            dataset,
            pace: paced.then(|| Arc::clone(&self.pace)),
            slots,
            partner,
            addr,
            endpoint,
            security,
            status: Arc::clone(&status),
        };
        runtime.spawn(async move {
            let outcome = job.run().await;
            let mut status = lock(&status);
            status.done = true;
            match outcome {
                Ok(len) => status.len = len,
                Err(e) => status.error = Some(e.to_string()),
            }
        });
        Ok(reported)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a rebuild of the dataset at `dir` writes the files it copies.
pub fn ship_dir(dir: &Path) -> zr_node::Result<PathBuf> {
    beside(dir, "ship")
}

/// `.<name>.<what>` beside the dataset at `dir`.
fn beside(dir: &Path, what: &str) -> zr_node::Result<PathBuf> {
    let name = dir.file_name().ok_or_else(|| Error::InvalidInput {
        path: dir.to_path_buf(),
        reason: "a dataset path must end in a directory name".into(),
    })?;
    Ok(dir.with_file_name(format!(".{}.{what}", name.to_string_lossy())))
}

/// True if `name`, beside a dataset, is where a move's copy of slots is written before the
/// dataset takes them (one per shard copied from: `.<name>.slots-<shard>`).
pub fn is_slots_dir(name: &str) -> bool {
    name.starts_with('.')
        && name.rsplit_once(".slots-").is_some_and(|(_, shard)| {
            !shard.is_empty() && shard.bytes().all(|b| b.is_ascii_digit())
        })
}

/// Removes `path` and all in it, if it is there (a rebuild cut short leaves it). Shipped
/// files are made and removed on the file system itself: power-cut tests cover the stores
/// they are installed into, not the copy.
pub fn remove_if_there(path: &Path) -> zr_node::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => zr_node::disk::Disk::real()
            .remove_tree(path)
            .ctx("remove", path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).ctx("stat", path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zr_node::meta::{Compression, FieldSpec};
    use zr_node::{CreateOptions, Record};

    /// Copies keep to the rate together, on the runtime's clock: of 10 requests of 4 MiB
    /// from two copies at 8 MiB/s, the last goes 4.5 s after the first, on virtual time; a
    /// rate of 0 does not wait.
    #[tokio::test(start_paused = true)]
    async fn copies_keep_to_the_rate_together() {
        let pace = Arc::new(Pace::default());
        pace.set_rate(8 << 20);
        let started = tokio::time::Instant::now();
        let copy = |pace: Arc<Pace>| async move {
            for _ in 0..5 {
                pace.take(4 << 20).await;
            }
        };
        tokio::join!(copy(Arc::clone(&pace)), copy(Arc::clone(&pace)));
        let took = started.elapsed();
        assert_eq!(took, Duration::from_millis(4_500), "{took:?}");
        pace.set_rate(0);
        let unpaced = tokio::time::Instant::now();
        for _ in 0..100 {
            pace.take(1 << 30).await;
        }
        assert_eq!(unpaced.elapsed(), Duration::ZERO);
    }

    /// A snapshot is served piece by piece with the CRC of each, and once closed it is gone
    /// (its hold on the dataset's lock with it).
    #[test]
    fn a_snapshot_is_served_in_pieces_until_closed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let fields = vec![FieldSpec::new("x", Compression::Raw)];
        let store = Store::create(tmp.path(), fields, CreateOptions::default()).expect("create");
        store
            .append(&Record::new().with("x", b"a record"))
            .expect("append");
        store.commit().expect("commit");
        let ships = Arc::new(Ships::default());
        let Reply::Manifest {
            ship,
            len,
            files,
            mark,
        } = ships.open(&store, &[], 7).expect("open")
        else {
            panic!("no manifest");
        };
        assert_eq!(len, 1);
        let own = store.mark();
        assert_eq!(
            mark,
            Some(wire::DataMark {
                incarnation: 7,
                instance: own.instance,
                rewrites: own.rewrites
            })
        );
        let meta = files
            .iter()
            .position(|f| f.name == zr_node::meta::META_FILE)
            .expect("meta.json") as u32;
        let (reply, bytes) = ships.read(ship, meta, 0, 10).expect("read");
        assert_eq!(
            reply,
            Reply::Piece {
                crc: crc32fast::hash(&bytes)
            }
        );
        assert_eq!(bytes.len(), 10);
        assert!(matches!(
            ships.read(ship, 999, 0, 10),
            Err(ShipError::NoFile { .. })
        ));
        ships.close(ship);
        assert!(matches!(
            ships.read(ship, meta, 0, 10),
            Err(ShipError::NoSnapshot(_))
        ));
    }
}
