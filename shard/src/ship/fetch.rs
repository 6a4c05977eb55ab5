//! A rebuild (or a move's copy) by files, on the receiving node: a partner's snapshot
//! fetched piece by piece at a rate, written beside the dataset, made durable and swapped in.

use super::*;

/// One rebuild of a dataset from a partner's files.
pub(super) struct Fetch {
    pub(super) shard: Arc<Shard>,
    pub(super) dataset: Option<String>,
    /// The slots a move copies (none: the whole dataset, a rebuild).
    pub(super) slots: Vec<u32>,
    /// The rate it keeps to (none: as fast as it can).
    pub(super) pace: Option<Arc<Pace>>,
    pub(super) partner: Target,
    pub(super) addr: SocketAddr,
    pub(super) endpoint: Endpoint,
    pub(super) security: net::Security,
    pub(super) status: Arc<Mutex<ShipStatus>>,
}

impl Fetch {
    /// Connects to the partner, copies its snapshot's files into `.<dataset>.ship`, and
    /// swaps them in; returns the records they hold.
    pub(super) async fn run(&self) -> Result<u64> {
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
pub(super) struct Pace {
    /// Bytes a second (0: none).
    rate: AtomicU64,
    /// When the next request may go.
    next: Mutex<Option<tokio::time::Instant>>,
}

impl Pace {
    pub(super) fn set_rate(&self, rate: u64) {
        self.rate.store(rate, Ordering::SeqCst);
    }

    /// Waits for the turn of a request of `bytes` bytes.
    pub(super) async fn take(&self, bytes: u64) {
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
            zr_node::disk::Disk::real()
                .write_parts_at(out, &path, &parts, offset)
                .ctx("write", &path)?;
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
