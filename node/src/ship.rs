//! A dataset as the files that make it, to copy elsewhere: how a cluster rebuilds a replica
//! from a partner at the speed of a file copy (`zr-node` ships them node to node).
//!
//! A snapshot is the dataset as of its last commit: `meta.json` (the commit point), the redo
//! log that goes with it, each field's offset table up to the committed length, the
//! dictionaries, and each chunk up to its committed bytes. meta.json, the redo log and the
//! dictionaries are read into memory while no commit can run; the snapshot then holds the
//! dataset's lock shared, as a reader in another process would, so that no commit changes
//! offset-table entries in place while it lives (such changes wait in the redo log and the
//! writer's overlay: see `lock`) and the entries below the committed length are read from
//! the tables as they are sent. Chunks are append-only, so their committed bytes are too.
//! A dataset written from the files of a snapshot opens as the dataset was at that commit.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, IoContext, Result};
use crate::meta::{Meta, META_FILE};
use crate::offset::{offset_file_name, ENTRY_BYTES};
use crate::store::Store;
use crate::unit::{chunk_unit, offset_path, UNITS_DIR};

/// One file of a snapshot: its path inside the dataset directory and where its bytes are.
#[derive(Clone, Debug)]
pub struct SnapshotFile {
    /// Relative to the dataset directory (`meta.json`, `chunk/3.zr`, …).
    pub name: String,
    pub source: Source,
}

/// Where a snapshot file's bytes are.
#[derive(Clone, Debug)]
pub enum Source {
    /// Read when the snapshot was taken.
    Bytes(Arc<[u8]>),
    /// The first `len` bytes of a file, which do not change while the snapshot lives (a
    /// chunk's committed bytes; an offset table's committed entries), mapped read-only at
    /// the first piece asked of them (`map`, shared by the snapshot's clones).
    File {
        path: PathBuf,
        len: u64,
        map: Arc<std::sync::OnceLock<Arc<memmap2::Mmap>>>,
    },
}

impl Source {
    /// The first `len` bytes of the file at `path`.
    pub fn file(path: PathBuf, len: u64) -> Source {
        Source::File {
            path,
            len,
            map: Arc::default(),
        }
    }
}

impl SnapshotFile {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        match &self.source {
            Source::Bytes(bytes) => bytes.len() as u64,
            Source::File { len, .. } => *len,
        }
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to `len` of its bytes from `offset` (fewer at its end), without copying them: a
    /// chunk's from a read-only mapping of its file (a chunk's committed bytes never change).
    pub fn piece(&self, offset: u64, len: usize) -> Result<Piece> {
        let end = self.len().min(offset.saturating_add(len as u64));
        if offset >= end {
            return Ok(Piece::Bytes(Arc::from(Vec::new()), 0..0));
        }
        match &self.source {
            Source::Bytes(bytes) => Ok(Piece::Bytes(
                Arc::clone(bytes),
                offset as usize..end as usize,
            )),
            Source::File { path, len, map } => {
                let map = match map.get() {
                    Some(map) => Arc::clone(map),
                    None => {
                        let file = std::fs::File::open(path).ctx("open", path)?;
                        // SAFETY: the bytes mapped do not change while the snapshot lives
                        // (a chunk's committed bytes never do; an offset table's committed
                        // entries are not written in place while it holds the dataset's lock
                        // shared), and the mapping is read-only; a file truncated by another
                        // process meanwhile would fault, as with any mapped reader.
                        let mapped =
                            unsafe { memmap2::MmapOptions::new().len(*len as usize).map(&file) }
                                .ctx("mmap", path)?;
                        // Read through once, in order: the kernel reads ahead.
                        let _ = mapped.advise(memmap2::Advice::Sequential);
                        // Two threads mapping it at once: the first mapping stays.
                        Arc::clone(map.get_or_init(|| Arc::new(mapped)))
                    }
                };
                Ok(Piece::Mapped(map, offset as usize..end as usize))
            }
        }
    }

    /// Up to `len` of its bytes from `offset` (fewer at its end).
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let end = self.len().min(offset.saturating_add(len as u64));
        if offset >= end {
            return Ok(Vec::new());
        }
        match &self.source {
            Source::Bytes(bytes) => Ok(bytes[offset as usize..end as usize].to_vec()),
            Source::File { path, .. } => {
                let file = std::fs::File::open(path).ctx("open", path)?;
                let mut out = vec![0u8; (end - offset) as usize];
                file.read_exact_at(&mut out, offset).ctx("read", path)?;
                Ok(out)
            }
        }
    }
}

/// Bytes of a snapshot file, where they are (see [`SnapshotFile::piece`]).
pub enum Piece {
    Bytes(Arc<[u8]>, std::ops::Range<usize>),
    Mapped(Arc<memmap2::Mmap>, std::ops::Range<usize>),
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        match self {
            Piece::Bytes(bytes, range) => &bytes[range.clone()],
            Piece::Mapped(map, range) => &map[range.clone()],
        }
    }
}

/// A dataset's files as of its last commit (see the module documentation).
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The committed records.
    pub len: u64,
    /// The store's mark when the snapshot was taken, if no change to an existing record was
    /// waiting for a commit then: the records below `len` were then the same in the
    /// snapshot as in the store, and stay so while its mark stays this.
    pub mark: Option<crate::StoreMark>,
    pub files: Vec<SnapshotFile>,
    /// The dataset's lock, held shared while the snapshot lives.
    _held: Arc<Held>,
}

/// The lock a snapshot holds.
struct Held {
    _locks: crate::lock::Locks,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the dataset's lock, shared")
    }
}

impl Snapshot {
    /// Bytes in all.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(SnapshotFile::len).sum()
    }
}

impl Store {
    /// The dataset's files as of its last commit, to copy elsewhere (see the module
    /// documentation). No commit runs while the small files are read.
    pub fn snapshot(&self) -> Result<Snapshot> {
        self.snapshot_of(None)
    }

    /// The files of units `units` as of the last commit (those the dataset has), with its
    /// `meta.json` (which says their lengths and chunks): what [`Store::adopt_units`] of
    /// another dataset takes. Its `len` counts their records.
    pub fn snapshot_units(&self, units: &[u32]) -> Result<Snapshot> {
        self.snapshot_of(Some(units))
    }

    fn snapshot_of(&self, only: Option<&[u32]>) -> Result<Snapshot> {
        let dir = self.dir().to_path_buf();
        let no_commit = self.inner.writers.as_ref().map(|w| w.shared());
        let pending = no_commit.as_ref().is_some_and(|shared| {
            shared.committed_rewrites
                != self
                    .inner
                    .rewrites
                    .load(std::sync::atomic::Ordering::SeqCst)
        });
        let mark = (!pending).then(|| self.mark());
        // Taken before a commit can run again: the entries below the committed length stay
        // as they are until it is let go.
        let held = Arc::new(Held {
            _locks: crate::lock::Locks::reader(self.inner.disk(), &dir)?,
        });
        let meta_path = dir.join(META_FILE);
        let meta_bytes = std::fs::read(&meta_path).ctx("read", &meta_path)?;
        let meta = Meta::parse(&meta_bytes, &dir)?;
        let mut files = vec![SnapshotFile {
            name: META_FILE.into(),
            source: Source::Bytes(meta_bytes.into()),
        }];
        let redo = dir.join(crate::redo::REDO_FILE);
        match std::fs::read(&redo) {
            // Units are shipped only with nothing waiting in the log (see `adopt_units`).
            Ok(_) if only.is_some() => {
                return Err(Error::InvalidInput {
                    path: redo,
                    reason: "changes to existing records wait in the redo log: ship units after the next commit applies them".into(),
                })
            }
            Ok(bytes) => files.push(SnapshotFile {
                name: crate::redo::REDO_FILE.into(),
                source: Source::Bytes(bytes.into()),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).ctx("read", &redo),
        }
        let shipped = |unit: u32| only.is_none_or(|units| units.contains(&unit));
        let mut len = meta.length;
        if only.is_some() {
            len = meta
                .units()
                .iter()
                .filter(|u| shipped(u.id))
                .map(|u| u.length)
                .sum();
        }
        for unit in meta.units().into_iter().filter(|u| shipped(u.id)) {
            for field in &meta.fields {
                let name = offset_file_name(&field.name);
                let name = match unit.id {
                    0 => name,
                    id => format!("{UNITS_DIR}/{id}.{name}"),
                };
                files.push(SnapshotFile {
                    name,
                    source: Source::file(
                        offset_path(&dir, unit.id, &field.name),
                        unit.length * ENTRY_BYTES,
                    ),
                });
            }
        }
        for field in meta.fields.iter().filter(|_| only.is_none()) {
            if field.dict.is_some() {
                let path = crate::dict::path(&dir, &field.name);
                let bytes = std::fs::read(&path).ctx("read", &path)?;
                files.push(SnapshotFile {
                    name: format!("{}/{}.zdict", crate::dict::DICT_DIR, field.name),
                    source: Source::Bytes(bytes.into()),
                });
            }
        }
        for chunk in meta.chunks.iter().filter(|c| shipped(chunk_unit(c.id))) {
            files.push(SnapshotFile {
                name: format!("{}/{}.zr", crate::view::CHUNK_DIR, chunk.id),
                source: Source::file(crate::view::chunk_path(&dir, chunk.id), chunk.bytes),
            });
        }
        drop(no_commit);
        Ok(Snapshot {
            len,
            mark,
            files,
            _held: held,
        })
    }
}

/// Where snapshot file `name` goes in dataset directory `dir`: refused unless it is one of
/// the names a snapshot has (so a peer cannot write outside the directory).
pub fn target_path(dir: &Path, name: &str) -> Result<PathBuf> {
    let bad = || Error::InvalidInput {
        path: dir.to_path_buf(),
        reason: format!(
            "'{}' is not a file of a dataset snapshot",
            name.escape_debug()
        ),
    };
    let plain = |part: &str| {
        !part.is_empty()
            && !part.starts_with('.')
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    };
    let top = |name: &str| {
        name == META_FILE
            || name == crate::redo::REDO_FILE
            || name.strip_suffix(".offset").is_some_and(plain)
    };
    let unit_table = |name: &str| {
        let mut parts = name.split('/');
        match (parts.next(), parts.next(), parts.next()) {
            // The unit's number as the store writes it: digits, no leading zero.
            (Some(UNITS_DIR), Some(file), None) => {
                crate::unit::unit_of_table(file).is_some()
                    && file
                        .split_once('.')
                        .is_some_and(|(_, f)| f.strip_suffix(".offset").is_some_and(plain))
            }
            _ => false,
        }
    };
    if unit_table(name) {
        return Ok(dir.join(name));
    }
    match name.split_once('/') {
        None if top(name) => Ok(dir.join(name)),
        Some((folder, file))
            if (folder == crate::view::CHUNK_DIR || folder == crate::dict::DICT_DIR)
                && plain(file) =>
        {
            Ok(dir.join(folder).join(file))
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{Compression, FieldSpec};
    use crate::{CreateOptions, Record};

    /// A snapshot's files written into another directory open as the dataset was at the
    /// commit: appends after it are not in it.
    #[test]
    fn a_snapshot_copied_opens_as_the_committed_dataset() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let fields = vec![
            FieldSpec::new("x", Compression::Raw),
            FieldSpec::new("y", Compression::Flate),
        ];
        let options = CreateOptions {
            chunk_records: 16,
            ..CreateOptions::default()
        };
        let store = Store::create(&dir, fields, options).unwrap();
        let value = |i: u64| {
            format!("record {i} ")
                .repeat(1 + i as usize % 5)
                .into_bytes()
        };
        for i in 0..100u64 {
            store
                .append(&Record::new().with("x", &value(i)).with("y", &value(i + 7)))
                .unwrap();
        }
        store
            .modify(3, &Record::new().with("x", b"changed"))
            .unwrap();
        store.commit().unwrap();
        let snapshot = store.snapshot().unwrap();
        let all: Vec<u64> = (0..100).collect();
        let before: Vec<Vec<u8>> = {
            let batch = store.gather(&all, &["x"]).unwrap();
            let column = batch.field("x").unwrap();
            (0..100).map(|k| column.get(k).unwrap().to_vec()).collect()
        };
        // Changed and committed after the snapshot: not in it (the entry waits in the redo
        // log while the snapshot holds the lock).
        store.append(&Record::new().with("x", b"later")).unwrap();
        store.modify(5, &Record::new().with("x", b"after")).unwrap();
        store.commit().unwrap();
        assert_eq!(snapshot.len, 100);
        let copy = tmp.path().join("b");
        for file in &snapshot.files {
            let path = target_path(&copy, &file.name).unwrap();
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut bytes = Vec::new();
            let mut at = 0;
            while at < file.len() {
                let piece = file.read(at, 1000).unwrap();
                at += piece.len() as u64;
                bytes.extend(piece);
            }
            std::fs::write(path, bytes).unwrap();
        }
        drop(snapshot);
        let copied = Store::open(&copy).unwrap();
        assert_eq!(copied.len(), 100);
        let ours = copied.gather(&all, &["x", "y"]).unwrap();
        let theirs = store.gather(&all, &["x", "y"]).unwrap();
        for (k, was) in before.iter().enumerate() {
            assert_eq!(
                ours.field("x").unwrap().get(k),
                Some(&was[..]),
                "record {k}"
            );
            assert_eq!(
                ours.field("y").unwrap().get(k),
                theirs.field("y").unwrap().get(k)
            );
        }
        assert!(copied.verify(|_| {}).unwrap().problems.is_empty());
        // The dataset itself has both changes, and keeps them once it is alone again.
        assert_eq!(theirs.field("x").unwrap().get(5), Some(&b"after"[..]));
        store.commit().unwrap();
        drop((theirs, store));
        let reopened = Store::open(&dir).unwrap();
        let batch = reopened.gather(&[3, 5, 100], &["x"]).unwrap();
        let column = batch.field("x").unwrap();
        assert_eq!(column.get(0), Some(&b"changed"[..]));
        assert_eq!(column.get(1), Some(&b"after"[..]));
        assert_eq!(column.get(2), Some(&b"later"[..]));
    }

    /// A snapshot carries the store's mark only when no change to an existing record waits
    /// for a commit.
    #[test]
    fn a_snapshot_is_marked_only_when_nothing_waits_for_a_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let fields = vec![FieldSpec::new("x", Compression::Raw)];
        let store = Store::create(tmp.path(), fields, CreateOptions::default()).unwrap();
        for i in 0..4u8 {
            store.append(&Record::new().with("x", &[i])).unwrap();
        }
        // Appends waiting are past the committed length: the snapshot is marked.
        assert_eq!(store.snapshot().unwrap().mark, Some(store.mark()));
        store.commit().unwrap();
        store.modify(1, &Record::new().with("x", b"m")).unwrap();
        assert_eq!(store.snapshot().unwrap().mark, None, "a modify waits");
        store.commit().unwrap();
        assert_eq!(store.snapshot().unwrap().mark, Some(store.mark()));
        store.delete(0).unwrap();
        assert_eq!(store.snapshot().unwrap().mark, None, "a delete waits");
    }

    /// A store's mark moves with every change to an existing record, not with appends, and
    /// differs between opens.
    #[test]
    fn a_mark_counts_changes_to_existing_records() {
        let tmp = tempfile::tempdir().unwrap();
        let fields = vec![FieldSpec::new("x", Compression::Raw)];
        let store = Store::create(tmp.path(), fields, CreateOptions::default()).unwrap();
        let start = store.mark();
        for i in 0..4u8 {
            store.append(&Record::new().with("x", &[i])).unwrap();
        }
        assert_eq!(store.mark(), start, "appends change no existing record");
        store.modify(1, &Record::new().with("x", b"m")).unwrap();
        let modified = store.mark();
        assert_eq!(modified.rewrites, start.rewrites + 1);
        store.write_field("x", &[0, 2], &[b"a", b"b"]).unwrap();
        assert_eq!(store.mark().rewrites, modified.rewrites + 1);
        store.delete(0).unwrap();
        store.delete(store.len() - 1).unwrap();
        assert_eq!(store.mark().rewrites, modified.rewrites + 3);
        assert_eq!(store.clone().mark(), store.mark(), "clones share the open");
        store.commit().unwrap();
        drop(store);
        let again = Store::open(tmp.path()).unwrap();
        assert_ne!(again.mark().instance, start.instance);
    }

    #[test]
    fn only_snapshot_names_are_written() {
        let dir = Path::new("/d");
        for good in [
            "meta.json",
            "redo.log",
            "x.offset",
            "chunk/3.zr",
            "dict/c.zdict",
        ] {
            assert!(target_path(dir, good).is_ok(), "{good}");
        }
        for bad in [
            "../x",
            "chunk/../../x",
            "/etc/passwd",
            "identity.json",
            "writer-fence",
            "a/b",
            ".hidden",
            "chunk/",
            "",
        ] {
            assert!(target_path(dir, bad).is_err(), "{bad}");
        }
    }
}
