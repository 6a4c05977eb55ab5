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

/// Pieces still to be served damaged: a test's way to damage a file in transit.
static DAMAGE_NEXT: AtomicU32 = AtomicU32::new(0);
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

/// Makes the next `pieces` pieces any node of this process serves arrive damaged (one byte
/// flipped after their CRC is taken), as a fault in transit would: for tests.
pub fn damage_next_pieces(pieces: u32) {
    DAMAGE_NEXT.store(pieces, Ordering::SeqCst);
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
}

impl Ships {
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
        let (crc, bytes) = Self::piece_of(&snapshot, ship, file, offset, len)?;
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
                Self::piece_of(&snapshot, ship, piece.file, piece.offset, piece.len)?;
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
        let damage = DAMAGE_NEXT
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if damage {
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

/// One rebuild of a dataset from a partner's files.
struct Fetch {
    shard: Arc<Shard>,
    dataset: Option<String>,
    /// The slots a move copies (none: the whole dataset, a rebuild).
    slots: Vec<u32>,
    /// The rate it keeps to (none: as fast as it can).
    pace: Option<Arc<Pace>>,
    partner: Target,
    addr: SocketAddr,
    endpoint: Endpoint,
    security: net::Security,
    status: Arc<Mutex<ShipStatus>>,
}

impl Fetch {
    /// Connects to the partner, copies its snapshot's files into `.<dataset>.ship`, and
    /// swaps them in; returns the records they hold.
    async fn run(&self) -> Result<u64> {
        let serving = self.shard.serving();
        let identity = &serving.coordination.identity;
        let (Some(cluster), Some(version)) = (identity.cluster(), identity.map_version()) else {
            return Err(ShipError::Cannot(
                "it belongs to no cluster yet: nothing to rebuild".into(),
            ));
        };
        let dir = serving.store.dir().to_path_buf();
        drop(serving);
        let began = tokio::time::Instant::now();
        let connection = net::endpoint::connect_to(
            &self.endpoint,
            &self.security,
            self.addr,
            CALL_TIMEOUT,
            net::Windows::DEFAULT,
            Some(net::tls::Role::Node),
        )
        .await
        .map_err(|e| self.failed(e))?;
        let partner = Partner {
            fetch: self,
            connection,
            cluster,
            version,
        };
        let open = NodeRequest::ShipOpen {
            slots: self.slots.clone(),
        };
        let (ship, len, files, mark) = match partner.call(open).await? {
            (
                Reply::Manifest {
                    ship,
                    len,
                    files,
                    mark,
                },
                _,
            ) => (ship, len, files, mark),
            (other, _) => return Err(self.unexpected(&other)),
        };
        {
            let mut status = lock(&self.status);
            status.total = files.iter().map(|f| f.len).sum();
            status.len = len;
        }
        let building = if self.slots.is_empty() {
            ship_dir(&dir)?
        } else {
            beside(&dir, &format!("slots-{}", self.partner.shard))?
        };
        remove_if_there(&building)?;
        std::fs::create_dir_all(&building).ctx("create", &building)?;
        let opened_at = began.elapsed();
        let started = tokio::time::Instant::now();
        let copying = partner.copy_all(ship, &files, &building).await;
        // The partner lets the snapshot go (else it would after a minute idle).
        if let Err(e) = partner.call(NodeRequest::ShipClose { ship }).await {
            tracing::debug!("closing snapshot {ship:016x}: {e}");
        }
        let synced = copying?;
        let copied = started.elapsed();
        // Every folder the files went into, durable too.
        let mut folders = vec![building.clone()];
        for folder in [zr_node::dict::DICT_DIR, "chunk", zr_node::unit::UNITS_DIR] {
            let path = building.join(folder);
            if path.exists() {
                folders.push(path);
            }
        }
        let mut opened = Vec::with_capacity(folders.len());
        for folder in folders {
            opened.push((std::fs::File::open(&folder).ctx("open", &folder)?, folder));
        }
        sync_files(opened).await?;
        if !self.slots.is_empty() {
            // A move's slots: taken into the dataset as built.
            let adopting = tokio::time::Instant::now();
            self.shard.adopt(&building, &self.slots)?;
            let adopted = adopting.elapsed();
            remove_if_there(&building)?;
            SLOTS_COPIED.fetch_add(self.slots.len() as u64, Ordering::SeqCst);
            metrics::counter!("zr_node_slots_copied_from_files_total")
                .increment(self.slots.len() as u64);
            lock(&self.status).mark = mark;
            tracing::info!(
                "{}: dataset '{}': {len} records of {} slots copied from the files of {} at {} in {:.3} s: connected and snapshot taken in {:.3} s, {} files ({:.1} MiB) copied in {:.3} s (the last {:.3} s making them durable), adopted in {:.3} s",
                dir.display(),
                self.dataset.as_deref().unwrap_or(wire::DEFAULT_DATASET),
                self.slots.len(),
                self.partner,
                self.addr,
                began.elapsed().as_secs_f64(),
                opened_at.as_secs_f64(),
                files.len(),
                files.iter().map(|f| f.len).sum::<u64>() as f64 / (1 << 20) as f64,
                copied.as_secs_f64(),
                synced.as_secs_f64(),
                adopted.as_secs_f64()
            );
            return Ok(len);
        }
        // Opened once as a dataset: its structure checked, its redo log applied.
        let opened = Store::open(&building)?;
        if opened.len() != len {
            return Err(self.failed(format!(
                "the files copied hold {} records, the snapshot {len}",
                opened.len()
            )));
        }
        drop(opened);
        self.shard.install(&building)?;
        lock(&self.status).mark = mark;
        REBUILT.fetch_add(1, Ordering::SeqCst);
        metrics::counter!("zr_node_datasets_rebuilt_from_files_total").increment(1);
        let total: u64 = files.iter().map(|f| f.len).sum();
        tracing::info!(
            "{}: dataset '{}' rebuilt from the files of {} at {}: {len} records; connected and snapshot taken in {:.3} s, {:.1} MiB copied in {:.3} s (the last {:.3} s making them durable), opened and swapped in in {:.3} s",
            dir.display(),
            self.dataset.as_deref().unwrap_or(wire::DEFAULT_DATASET),
            self.partner,
            self.addr,
            opened_at.as_secs_f64(),
            total as f64 / (1 << 20) as f64,
            copied.as_secs_f64(),
            synced.as_secs_f64(),
            (started.elapsed() - copied).as_secs_f64()
        );
        Ok(len)
    }

    fn failed(&self, e: impl std::fmt::Display) -> ShipError {
        ShipError::Partner {
            partner: self.partner,
            addr: self.addr,
            reason: e.to_string(),
        }
    }

    fn unexpected(&self, reply: &Reply) -> ShipError {
        self.failed(format!("unexpected reply {reply:?}"))
    }
}

/// The partner a rebuild copies from, on one connection.
struct Partner<'a> {
    fetch: &'a Fetch,
    connection: quinn::Connection,
    cluster: String,
    version: u64,
}

impl Partner<'_> {
    /// One request to the partner, placed as this node's data is; its reply and body (as
    /// it arrived, unjoined). A refusal is an error.
    async fn call(&self, request: NodeRequest) -> Result<(Reply, Piece)> {
        let message = NodeMessage {
            dataset: self.fetch.dataset.clone(),
            ..NodeMessage::new(
                &self.cluster,
                self.version,
                Some(self.fetch.partner),
                request,
            )
        };
        let header = wire::encode_request(&message).map_err(|e| self.fetch.failed(e))?;
        let chunks = net::rpc::call_chunks(&self.connection, header, Vec::new(), CALL_TIMEOUT)
            .await
            .map_err(|e| self.fetch.failed(e))?;
        let (reply, body_at) =
            wire::decode_reply_chunks(&chunks).map_err(|e| self.fetch.failed(e))?;
        match reply {
            Reply::Error { code, message } => {
                Err(self.fetch.failed(format!("refused ({code:?}): {message}")))
            }
            reply => Ok((reply, Piece { chunks, body_at })),
        }
    }

    /// Copies the snapshot's `files` into `building`: every piece of every file asked for
    /// in turn, several at once, each checked against its CRC32 (and asked for again if it
    /// fails) and handed to a writer thread as it arrives, which writes it where it goes
    /// (the async threads keep receiving meanwhile); then each file made durable (how long
    /// that took is returned).
    async fn copy_all(
        &self,
        ship: u64,
        files: &[ShipFile],
        building: &Path,
    ) -> Result<std::time::Duration> {
        let mut pieces = Vec::new();
        for (k, file) in files.iter().enumerate() {
            for offset in (0..file.len).step_by(PIECE_BYTES as usize) {
                let len = (file.len - offset).min(u64::from(PIECE_BYTES)) as u32;
                pieces.push((k, offset, len));
            }
        }
        // Pieces of many small files (a node's slots) asked for together, up to a piece's
        // size each time: one request per file would cost more than its bytes.
        let mut groups: Vec<Group> = Vec::new();
        let mut room = 0u64;
        for piece in pieces {
            if u64::from(piece.2) > room
                || groups.last().is_some_and(|g| g.len() >= SHIP_PIECES_MAX)
            {
                groups.push(Vec::new());
                room = u64::from(PIECE_BYTES);
            }
            room -= u64::from(piece.2);
            if let Some(group) = groups.last_mut() {
                group.push(piece);
            }
        }
        let outs = Arc::new(Outs {
            building: building.to_path_buf(),
            names: files.iter().map(|f| f.name.clone()).collect(),
            files: files.iter().map(|_| Mutex::new(None)).collect(),
            status: Arc::clone(&self.fetch.status),
        });
        // Every file made at once, while the first pieces travel (a piece made its file on
        // arrival otherwise: a node's slots are a thousand files, each a few tens of
        // microseconds to make, or hundreds while the disk's journal is busy).
        let making = {
            let outs = Arc::clone(&outs);
            tokio::task::spawn_blocking(move || {
                (0..outs.names.len()).try_for_each(|k| outs.file(k).map(drop))
            })
        };
        let mut groups = groups.into_iter();
        let mut arriving = futures::stream::FuturesUnordered::new();
        loop {
            while arriving.len() < PIECES_IN_FLIGHT {
                let Some(group) = groups.next() else {
                    break;
                };
                let outs = Arc::clone(&outs);
                arriving.push(async move {
                    if let Some(pace) = &self.fetch.pace {
                        pace.take(group.iter().map(|&(_, _, len)| u64::from(len)).sum())
                            .await;
                    }
                    let arrived = self.pieces(ship, &group, files).await?;
                    // Written off the async threads, which go on receiving meanwhile; one
                    // short blocking task per group (a long-lived one would stop a paused
                    // clock from advancing, as in a simulated cluster on virtual time).
                    tokio::task::spawn_blocking(move || outs.write(&group, &arrived))
                        .await
                        .map_err(|e| ShipError::Cannot(format!("writing the files copied: {e}")))?
                });
            }
            match arriving.next().await {
                Some(written) => written?,
                None => break,
            }
        }
        drop(arriving);
        making
            .await
            .map_err(|e| ShipError::Cannot(format!("making the files copied: {e}")))??;
        let outs = Arc::into_inner(outs)
            .ok_or_else(|| ShipError::Cannot("the files copied are still being written".into()))?;
        let syncing = tokio::time::Instant::now();
        let opened = tokio::task::spawn_blocking(move || outs.into_files())
            .await
            .map_err(|e| ShipError::Cannot(format!("opening the files copied: {e}")))??;
        sync_files(opened).await?;
        Ok(syncing.elapsed())
    }

    /// The pieces `group` — (file, offset, length) — asked for at once, each checked
    /// against its CRC32 (all asked for again if one fails): their bytes back to back.
    async fn pieces(
        &self,
        ship: u64,
        group: &[(usize, u64, u32)],
        files: &[ShipFile],
    ) -> Result<Piece> {
        let asked: Vec<wire::ShipPiece> = group
            .iter()
            .map(|&(k, offset, len)| wire::ShipPiece {
                file: k as u32,
                offset,
                len,
            })
            .collect();
        let mut tries = 0;
        loop {
            tries += 1;
            let request = NodeRequest::ShipReadMany {
                ship,
                pieces: asked.clone(),
            };
            let (reply, body) = self.call(request).await?;
            let Reply::Pieces { pieces } = reply else {
                return Err(self.fetch.unexpected(&reply));
            };
            let mut why = (pieces.len() != group.len()).then(|| {
                let (file, offset, _) = group[0];
                (
                    file,
                    offset,
                    format!("{} pieces arrived of {}", pieces.len(), group.len()),
                )
            });
            let mut at = 0usize;
            for (sent, &(file, offset, len)) in pieces.iter().zip(group) {
                if why.is_some() {
                    break;
                }
                let end = at + sent.len as usize;
                let mut crc = crc32fast::Hasher::new();
                let got = body.range(at, end).fold(0, |n, part| {
                    crc.update(part);
                    n + part.len()
                });
                at = end;
                if sent.len != len || got != len as usize {
                    why = Some((file, offset, format!("{got} bytes arrived of {len}")));
                } else if crc.finalize() != sent.crc {
                    why = Some((file, offset, "its CRC32 does not match".to_string()));
                }
            }
            let Some((file, offset, why)) = why else {
                return Ok(body);
            };
            let name = &files[file].name;
            if tries >= PIECE_TRIES {
                return Err(self
                    .fetch
                    .failed(format!("{name} bytes from {offset}: {why}, {tries} times")));
            }
            ASKED_AGAIN.fetch_add(1, Ordering::SeqCst);
            metrics::counter!("zr_node_ship_pieces_asked_again_total").increment(1);
            tracing::warn!(
                "{name} bytes from {offset} from {}: {why}; asking again",
                self.fetch.partner
            );
        }
    }
}

/// Files synced at once: a move copies a few files per slot, hundreds in all, and the disk
/// takes their syncs together far faster than one after another (measured: 512 files of
/// 200 KiB, 0.06 s with 32 at once, 0.14-0.20 s one by one).
const SYNCS_AT_ONCE: usize = 16;

/// Makes `files` durable (`fsync`), several at once, off the async threads.
async fn sync_files(files: Vec<(std::fs::File, PathBuf)>) -> Result<()> {
    let synced = tokio::task::spawn_blocking(move || {
        let per_thread = files.len().div_ceil(SYNCS_AT_ONCE).max(1);
        std::thread::scope(|scope| {
            let running: Vec<_> = files
                .chunks(per_thread)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter()
                            .try_for_each(|(file, path)| file.sync_all().ctx("sync", path))
                    })
                })
                .collect();
            running.into_iter().try_for_each(|t| {
                t.join().unwrap_or_else(|_| {
                    Err(Error::InvalidRecord(
                        "a thread syncing the files copied panicked".into(),
                    ))
                })
            })
        })
    })
    .await
    .map_err(|e| ShipError::Cannot(format!("syncing the files copied: {e}")))?;
    Ok(synced?)
}

/// Starts writing `len` bytes of `file` from `offset` to the disk, without waiting: the
/// disk works while the next pieces arrive, and the `fsync` at the end has little left to
/// do (measured: of a 52.6 MiB copy's 0.10 s on loopback, the final sync took 0.033 s
/// without this). Only a hint: durability comes from that `fsync`; an error is ignored.
fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: a plain system call on a file descriptor `file` keeps open for the call's
    // length; it reads no memory of ours.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// A byte rate that copies keep to together: each request of `n` bytes takes its turn,
/// `n / rate` seconds after the one before (timed on the runtime's clock, so a simulated
/// cluster on virtual time replays it).
#[derive(Default)]
struct Pace {
    /// Bytes a second (0: none).
    rate: AtomicU64,
    /// When the next request may go.
    next: Mutex<Option<tokio::time::Instant>>,
}

impl Pace {
    fn set_rate(&self, rate: u64) {
        self.rate.store(rate, Ordering::SeqCst);
    }

    /// Waits for the turn of a request of `bytes` bytes.
    async fn take(&self, bytes: u64) {
        let rate = self.rate.load(Ordering::SeqCst);
        if rate == 0 {
            return;
        }
        let now = tokio::time::Instant::now();
        let turn = {
            let mut next = lock(&self.next);
            let turn = next.map_or(now, |n| n.max(now));
            *next = Some(turn + Duration::from_secs_f64(bytes as f64 / rate as f64));
            turn
        };
        tokio::time::sleep_until(turn).await;
    }
}

/// A piece of a file as it arrived: the reply's chunks, its bytes from `body_at` on.
struct Piece {
    chunks: Vec<bytes::Bytes>,
    body_at: usize,
}

impl Piece {
    /// Its bytes, in the pieces they arrived in.
    fn parts(&self) -> impl Iterator<Item = &[u8]> {
        let mut skip = self.body_at;
        self.chunks.iter().filter_map(move |chunk| {
            let from = skip.min(chunk.len());
            skip -= from;
            (from < chunk.len()).then(|| &chunk[from..])
        })
    }

    /// Its bytes `from..to`, in the pieces they arrived in (fewer if it holds fewer).
    fn range(&self, from: usize, to: usize) -> impl Iterator<Item = &[u8]> {
        let mut at = 0usize;
        self.parts().filter_map(move |part| {
            let (start, end) = (at, at + part.len());
            at = end;
            let (lo, hi) = (from.max(start), to.min(end));
            (lo < hi).then(|| &part[lo - start..hi - start])
        })
    }
}

/// Pieces asked for at once: (file, offset, length) each.
type Group = Vec<(usize, u64, u32)>;

/// The files a copy writes: each made at its first piece (several groups may be written
/// at once, on blocking threads).
struct Outs {
    building: PathBuf,
    names: Vec<String>,
    files: Vec<Mutex<Option<std::fs::File>>>,
    status: Arc<Mutex<ShipStatus>>,
}

impl Outs {
    /// File `k`, made if it is not yet, locked while written.
    fn file(
        &self,
        k: usize,
    ) -> Result<(std::sync::MutexGuard<'_, Option<std::fs::File>>, PathBuf)> {
        let (Some(slot), Some(name)) = (self.files.get(k), self.names.get(k)) else {
            return Err(ShipError::Cannot(format!(
                "a piece of file {k} of {}",
                self.names.len()
            )));
        };
        let path = target_path(&self.building, name)?;
        let mut file = lock(slot);
        if file.is_none() {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).ctx("create", parent)?;
            }
            *file = Some(std::fs::File::create(&path).ctx("create", &path)?);
        }
        Ok((file, path))
    }

    /// Writes the pieces `group` that arrived as `piece` where they go, each started on its
    /// way to the disk.
    fn write(&self, group: &[(usize, u64, u32)], piece: &Piece) -> Result<()> {
        let mut at = 0usize;
        for &(k, offset, len) in group {
            let end = at + len as usize;
            let (file, path) = self.file(k)?;
            let Some(out) = file.as_ref() else {
                return Err(ShipError::Cannot(format!(
                    "{} was not made",
                    path.display()
                )));
            };
            let parts: Vec<&[u8]> = piece.range(at, end).collect();
            zr_node::disk::write_parts_at(out, &path, &parts, offset).ctx("write", &path)?;
            start_writeback(out, offset, u64::from(len));
            at = end;
            lock(&self.status).bytes += u64::from(len);
        }
        Ok(())
    }

    /// Every file (all made by now: at the start of the copy, or at their first piece), to
    /// be made durable.
    fn into_files(self) -> Result<Vec<(std::fs::File, PathBuf)>> {
        let mut files = Vec::with_capacity(self.names.len());
        for k in 0..self.names.len() {
            let (mut file, path) = self.file(k)?;
            if let Some(file) = file.take() {
                files.push((file, path));
            }
        }
        Ok(files)
    }
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

/// Removes `path` and all in it, if it is there (a rebuild cut short leaves it).
pub fn remove_if_there(path: &Path) -> zr_node::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => zr_node::disk::remove_tree(path).ctx("remove", path),
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
