//! Every change the store makes to its files goes through a [`Disk`]: writes, lengths,
//! syncs, creations, renames and removals. A store is given its disk when it is opened
//! (`RuntimeOptions::disk`), and so are the node's other files (fence, staged moves). The
//! default disk is the file system: each call is the system call it names. A test passes
//! instead a [`PowerCut`]'s disk, which also logs the changes under the recorder's
//! directory with what they replaced, until a sync makes them durable, so that the test can
//! stop the store at any change and then undo what a power cut may undo: any subset of the
//! data written to a file since its last `fdatasync`, and a suffix of the name changes
//! (creations, renames, removals) made in a directory since its last fsync, as a
//! journalling file system persists them in order. Nothing is global: stores on other
//! disks in the same process are not touched.
//!
//! `kill -9` keeps the page cache, so it never tests the order of syncs; this does.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

/// Where a store's changes to its files go: the file system (the default), or the file
/// system with a [`PowerCut`] recorder logging what a cut may undo. Cheap to clone; two
/// disks are equal when they log to the same recorder, or to none.
#[derive(Clone, Debug, Default)]
pub struct Disk {
    recorder: Option<Arc<Recorder>>,
}

impl PartialEq for Disk {
    fn eq(&self, other: &Disk) -> bool {
        match (&self.recorder, &other.recorder) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Disk {}

/// One change not yet durable, with what it replaced.
#[derive(Debug)]
enum Change {
    /// `bytes` written at `offset`; `old` the bytes there before (as many as existed),
    /// `old_len` the file's length before.
    Write {
        path: PathBuf,
        offset: u64,
        bytes: Vec<u8>,
        old: Vec<u8>,
        old_len: u64,
    },
    /// The length set from `old_len` to `len`; `tail` the bytes cut off, if it shrank.
    SetLen {
        path: PathBuf,
        len: u64,
        old_len: u64,
        tail: Vec<u8>,
    },
    /// A file created where none was.
    Create { path: PathBuf },
    /// `from` renamed to `to`, replacing `replaced` (the old `to`'s bytes), if any.
    Rename {
        from: PathBuf,
        to: PathBuf,
        replaced: Option<Vec<u8>>,
    },
    /// A file removed; `bytes` what it held.
    Remove { path: PathBuf, bytes: Vec<u8> },
    /// A directory made where none was.
    CreateDir { path: PathBuf },
    /// Two directories swapped (`renameat2(RENAME_EXCHANGE)`).
    Exchange { a: PathBuf, b: PathBuf },
    /// A directory tree removed; while recording, it is moved to `stash` instead, so that
    /// a cut can bring it back.
    RemoveTree { path: PathBuf, stash: PathBuf },
}

impl Change {
    /// The directory whose fsync makes a name change durable; `None` for data changes.
    fn directory(&self) -> Option<&Path> {
        match self {
            Change::Create { path } | Change::Remove { path, .. } => path.parent(),
            Change::Rename { to, .. } => to.parent(),
            Change::Exchange { b, .. } => b.parent(),
            Change::CreateDir { path } => path.parent(),
            Change::RemoveTree { path, .. } => path.parent(),
            Change::Write { .. } | Change::SetLen { .. } => None,
        }
    }

    /// `e`, saying which change it was while doing `what` with it.
    fn failed(&self, what: &str, e: io::Error) -> io::Error {
        let name = match self {
            Change::Write { path, .. } => format!("write to {}", path.display()),
            Change::SetLen { path, .. } => format!("length of {}", path.display()),
            Change::Create { path } => format!("creation of {}", path.display()),
            Change::Rename { from, to, .. } => {
                format!("rename of {} to {}", from.display(), to.display())
            }
            Change::Remove { path, .. } => format!("removal of {}", path.display()),
            Change::CreateDir { path } => format!("creation of directory {}", path.display()),
            Change::Exchange { a, b } => format!("exchange of {} and {}", a.display(), b.display()),
            Change::RemoveTree { path, .. } => format!("removal of tree {}", path.display()),
        };
        io::Error::new(
            e.kind(),
            format!("power cut: cannot {what} the {name}: {e}"),
        )
    }

    /// Every path the change touches.
    fn paths(&self) -> Vec<&Path> {
        match self {
            Change::Write { path, .. }
            | Change::SetLen { path, .. }
            | Change::Create { path }
            | Change::Remove { path, .. }
            | Change::CreateDir { path }
            | Change::RemoveTree { path, .. } => vec![path],
            Change::Rename { from, to, .. } => vec![from, to],
            Change::Exchange { a, b } => vec![a, b],
        }
    }

    /// The file whose fdatasync makes a data change durable.
    fn file(&self) -> Option<&Path> {
        match self {
            Change::Write { path, .. } | Change::SetLen { path, .. } => Some(path),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Log {
    /// Changes not yet durable, in the order they were made.
    pending: Vec<Change>,
    /// Changes allowed before the power fails (`None`: no limit).
    allowed: Option<u64>,
    /// Changes made (durable or not).
    made: u64,
    /// The power has failed: every change from now on fails.
    cut: bool,
}

#[derive(Debug)]
struct Recorder {
    root: PathBuf,
    log: Mutex<Log>,
}

impl Recorder {
    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Disk {
    /// The file system itself, as production runs.
    pub fn real() -> Disk {
        Disk::default()
    }

    /// The recorder covering `path`, if any.
    fn recorder(&self, path: &Path) -> Option<&Arc<Recorder>> {
        self.recorder.as_ref().filter(|r| path.starts_with(&r.root))
    }
}

fn power_failed() -> io::Error {
    io::Error::other("simulated power cut")
}

/// Runs `make` (a change to `path`) unless the power has failed, logging the change
/// `record` describes (`None`: `make` changes nothing, as opening an existing file). Without
/// a recorder, just `make`.
fn change<T>(
    disk: &Disk,
    path: &Path,
    record: impl FnOnce() -> Option<Change>,
    make: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    let Some(recorder) = disk.recorder(path) else {
        return make();
    };
    let mut log = recorder.log();
    if log.cut {
        return Err(power_failed());
    }
    let Some(change) = record() else {
        return make();
    };
    if log.allowed.is_some_and(|allowed| log.made >= allowed) {
        log.cut = true;
        return Err(power_failed());
    }
    log.made += 1;
    let made = make()?;
    log.pending.push(change);
    Ok(made)
}

/// The bytes of `path` in `offset..offset + len` (fewer past its end), and its length.
fn read_range(path: &Path, offset: u64, len: usize) -> (Vec<u8>, u64) {
    let Ok(file) = File::open(path) else {
        return (Vec::new(), 0);
    };
    let file_len = file.metadata().map_or(0, |m| m.len());
    let have = file_len.saturating_sub(offset).min(len as u64) as usize;
    let mut bytes = vec![0u8; have];
    if file.read_exact_at(&mut bytes, offset).is_err() {
        bytes.clear();
    }
    (bytes, file_len)
}

/// Bytes this process's stores have written to their files (see [`bytes_written`]).
static WRITTEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes every store of this process has written to its files so far (data, offset tables,
/// logs and metadata; what the page cache then sends to the disk), as a measure of the
/// work an operation costs the disks: e.g. `move_bench`'s bytes written per byte moved.
pub fn bytes_written() -> u64 {
    WRITTEN.load(Ordering::Relaxed)
}

impl Disk {
    /// `pwrite` of all of `bytes` at `offset`.
    pub fn write_at(&self, file: &File, path: &Path, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.write_parts_at(file, path, &[bytes], offset)
    }
}

impl Disk {
    /// `pwritev` of all of `parts`, back to back, at `offset`: one system call for many
    /// pieces (as a network delivers them, a few KiB each) where a `pwrite` each would make the
    /// file system take the pages they share at their edges once per piece.
    pub fn write_parts_at(
        &self,
        file: &File,
        path: &Path,
        parts: &[&[u8]],
        offset: u64,
    ) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        WRITTEN.fetch_add(total as u64, Ordering::Relaxed);
        change(
            self,
            path,
            || {
                let (old, old_len) = read_range(path, offset, total);
                Some(Change::Write {
                    path: path.to_path_buf(),
                    offset,
                    bytes: parts.concat(),
                    old,
                    old_len,
                })
            },
            || write_all_vectored_at(file, parts, offset),
        )
    }
}

fn write_all_vectored_at(file: &File, parts: &[&[u8]], mut offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut slices: Vec<io::IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| io::IoSlice::new(p))
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let count = rest.len().min(libc::UIO_MAXIOV as usize);
        let at = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past off_t"))?;
        // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix (std guarantees it); the
        // `count` slices point into `parts`, which outlive the call; the file descriptor is
        // open for as long as `file` is borrowed.
        let written = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                rest.as_ptr().cast::<libc::iovec>(),
                count as libc::c_int,
                at,
            )
        };
        if written < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the file took no bytes",
            ));
        }
        offset += written as u64;
        io::IoSlice::advance_slices(&mut rest, written as usize);
    }
    Ok(())
}

impl Disk {
    /// `ftruncate` to `len`.
    pub fn set_len(&self, file: &File, path: &Path, len: u64) -> io::Result<()> {
        change(
            self,
            path,
            || {
                let old_len = file.metadata().map_or(0, |m| m.len());
                let tail = if len < old_len {
                    read_range(path, len, (old_len - len) as usize).0
                } else {
                    Vec::new()
                };
                Some(Change::SetLen {
                    path: path.to_path_buf(),
                    len,
                    old_len,
                    tail,
                })
            },
            || file.set_len(len),
        )
    }
}

impl Disk {
    /// `fdatasync`: the file's data changes so far are durable.
    pub fn sync(&self, file: &File, path: &Path) -> io::Result<()> {
        let Some(recorder) = self.recorder(path) else {
            return file.sync_data();
        };
        let mut log = recorder.log();
        if log.cut {
            return Err(power_failed());
        }
        file.sync_data()?;
        log.pending.retain(|c| c.file() != Some(path));
        Ok(())
    }
}

impl Disk {
    /// Opens `path` with `options`, logging its creation if it did not exist (`options` must
    /// not truncate an existing file: that is [`create`]).
    pub fn open(&self, path: &Path, options: &OpenOptions) -> io::Result<File> {
        change(
            self,
            path,
            || {
                (!path.exists()).then(|| Change::Create {
                    path: path.to_path_buf(),
                })
            },
            || options.open(path),
        )
    }
}

impl Disk {
    /// Creates `path` for reading and writing, or empties it (a length change) if it exists.
    pub fn create(&self, path: &Path) -> io::Result<File> {
        let file = self.open(
            path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )?;
        self.set_len(&file, path, 0)?;
        Ok(file)
    }
}

impl Disk {
    /// Renames `from` to `to` (replacing it).
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        change(
            self,
            to,
            || {
                Some(Change::Rename {
                    from: from.to_path_buf(),
                    to: to.to_path_buf(),
                    replaced: std::fs::read(to).ok(),
                })
            },
            || std::fs::rename(from, to),
        )
    }
}

impl Disk {
    /// Removes the file `path`.
    pub fn remove(&self, path: &Path) -> io::Result<()> {
        change(
            self,
            path,
            || {
                Some(Change::Remove {
                    path: path.to_path_buf(),
                    bytes: std::fs::read(path).unwrap_or_default(),
                })
            },
            || std::fs::remove_file(path),
        )
    }
}

impl Disk {
    /// Swaps the directories `a` and `b` atomically (Linux `renameat2` with `RENAME_EXCHANGE`).
    pub fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        change(
            self,
            b,
            || {
                Some(Change::Exchange {
                    a: a.to_path_buf(),
                    b: b.to_path_buf(),
                })
            },
            || rename_exchange(a, b),
        )
    }
}

fn rename_exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
    };
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: both arguments are valid NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Disk {
    /// Makes the directory `path` and any missing parents. A directory another process made
    /// meanwhile (nodes started together on a fresh cluster directory) is taken as made.
    pub fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        // A relative path's last ancestor is "" (the working directory): never made.
        let mut missing: Vec<&Path> = path
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .collect();
        missing.reverse();
        for dir in missing {
            let made = change(
                self,
                dir,
                || {
                    Some(Change::CreateDir {
                        path: dir.to_path_buf(),
                    })
                },
                || std::fs::create_dir(dir),
            );
            match made {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                other => other?,
            }
        }
        Ok(())
    }
}

impl Disk {
    /// Removes the directory `path` and everything in it.
    pub fn remove_tree(&self, path: &Path) -> io::Result<()> {
        let Some(recorder) = self.recorder(path) else {
            return std::fs::remove_dir_all(path);
        };
        let stash = {
            let log = recorder.log();
            recorder.root.join(format!(".power-cut-stash-{}", log.made))
        };
        change(
            self,
            path,
            || {
                Some(Change::RemoveTree {
                    path: path.to_path_buf(),
                    stash: stash.clone(),
                })
            },
            || std::fs::rename(path, &stash),
        )
    }
}

impl Disk {
    /// [`remove_tree`], where a tree already gone (or being removed by another thread, as a
    /// dropped unit's files are while a store reopens) is not an error.
    pub fn remove_tree_if_present(&self, path: &Path) -> io::Result<()> {
        match self.remove_tree(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

impl Disk {
    /// `fsync` of the directory `dir`: its name changes so far are durable.
    pub fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let recorder = self.recorder(dir);
        if recorder.as_ref().is_some_and(|r| r.log().cut) {
            return Err(power_failed());
        }
        File::open(dir).and_then(|d| d.sync_all())?;
        if let Some(recorder) = recorder {
            recorder
                .log()
                .pending
                .retain(|c| c.directory() != Some(dir));
        }
        Ok(())
    }
}

/// A simulated power cut for the files under one directory (tests). The changes a store
/// given [`PowerCut::disk`] makes there are logged until durable;
/// [`PowerCut::fail_after`] makes the power fail at a chosen change (that change and every
/// later one fail with an error, as the store's process would stop); [`PowerCut::cut`]
/// then undoes what the power cut loses. Drop the store before cutting.
#[derive(Debug)]
pub struct PowerCut {
    recorder: Arc<Recorder>,
}

impl PowerCut {
    /// A recorder of the changes under `root` made through its [`PowerCut::disk`].
    pub fn record(root: &Path) -> PowerCut {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let recorder = Arc::new(Recorder {
            root,
            log: Mutex::new(Log::default()),
        });
        PowerCut { recorder }
    }

    /// The disk whose changes under the root this recorder logs: give it to the store (and
    /// whatever else writes there) under test.
    pub fn disk(&self) -> Disk {
        Disk {
            recorder: Some(Arc::clone(&self.recorder)),
        }
    }

    /// Changes made under the root so far.
    pub fn changes(&self) -> u64 {
        self.recorder.log().made
    }

    /// Changes made but not yet durable.
    pub fn pending(&self) -> usize {
        self.recorder.log().pending.len()
    }

    /// Whether the power has failed (a change was refused).
    pub fn failed(&self) -> bool {
        self.recorder.log().cut
    }

    /// Lets `more` further changes through; the one after fails, and the power with it.
    pub fn fail_after(&self, more: u64) {
        let mut log = self.recorder.log();
        log.allowed = Some(log.made + more);
    }

    /// The power fails now (if it has not): every further change fails.
    pub fn fail_now(&self) {
        self.recorder.log().cut = true;
    }

    /// Undoes what a power cut loses, choosing with `keep(k)` for each pending change
    /// (numbered in the order they were made) whether it reached the disk anyway. Data
    /// changes are kept or lost one by one; each directory's name changes are kept up to
    /// its first lost one. Then the power is back: changes through its disk are logged
    /// afresh, none refused.
    pub fn cut(self, mut keep: impl FnMut(usize) -> bool) -> io::Result<()> {
        let pending = {
            let mut log = self.recorder.log();
            log.cut = false;
            log.allowed = None;
            std::mem::take(&mut log.pending)
        };
        // Which survive: a directory's name changes only as a prefix.
        let mut lost_dirs: Vec<PathBuf> = Vec::new();
        let kept: Vec<bool> = pending
            .iter()
            .enumerate()
            .map(|(k, change)| {
                let wanted = keep(k);
                match change.directory() {
                    Some(dir) if lost_dirs.iter().any(|d| d == dir) => false,
                    Some(dir) if !wanted => {
                        lost_dirs.push(dir.to_path_buf());
                        false
                    }
                    _ => wanted,
                }
            })
            .collect();
        // Back to the durable state: every pending change undone, newest first (a created
        // file's durable bytes kept aside)...
        let root = &self.recorder.root;
        let mut stashed: Vec<Option<Stash>> = Vec::with_capacity(pending.len());
        for (k, change) in pending.iter().enumerate().rev() {
            stashed.push(undo(change, root, k).map_err(|e| change.failed("undo", e))?);
        }
        stashed.reverse();
        // ...then the survivors made again, in order. Whatever was made inside a directory
        // whose creation is lost is lost with it.
        let mut lost: Vec<PathBuf> = Vec::new();
        for ((change, kept), stash) in pending.iter().zip(kept).zip(stashed) {
            let inside_lost = change
                .paths()
                .iter()
                .any(|p| lost.iter().any(|dir| p.starts_with(dir) && p != dir));
            if let Change::CreateDir { path } = change {
                lost.retain(|dir| dir != path);
                if !kept || inside_lost {
                    lost.push(path.clone());
                }
            }
            if kept && !inside_lost {
                redo(change, stash).map_err(|e| change.failed("redo", e))?;
            }
        }
        Ok(())
    }
}

/// What a created file or directory held once the changes after its creation were undone:
/// what was durable in it, to be put back if its creation survives the cut.
enum Stash {
    Bytes(Vec<u8>),
    /// The directory, moved aside to this path.
    Dir(PathBuf),
}

/// Undoes `change` (number `k`); for a creation, returns what it held.
fn undo(change: &Change, root: &Path, k: usize) -> io::Result<Option<Stash>> {
    let done = match change {
        Change::Create { path } => {
            let bytes = std::fs::read(path).ok();
            ignore(std::fs::remove_file(path), io::ErrorKind::NotFound)?;
            return Ok(bytes.map(Stash::Bytes));
        }
        // A directory whose creation is lost takes what it holds with it.
        Change::CreateDir { path } => {
            if !path.exists() {
                return Ok(None);
            }
            let aside = root.join(format!(".power-cut-dir-{k}"));
            std::fs::rename(path, &aside)?;
            return Ok(Some(Stash::Dir(aside)));
        }
        Change::Write {
            path,
            offset,
            old,
            old_len,
            ..
        } => {
            let Ok(file) = OpenOptions::new().write(true).open(path) else {
                return Ok(None);
            };
            file.write_all_at(old, *offset)?;
            file.set_len(*old_len)
        }
        Change::SetLen {
            path,
            old_len,
            tail,
            len,
        } => {
            let Ok(file) = OpenOptions::new().write(true).open(path) else {
                return Ok(None);
            };
            file.set_len(*old_len)?;
            file.write_all_at(tail, *len)
        }
        Change::Rename { from, to, replaced } => {
            std::fs::rename(to, from)?;
            match replaced {
                Some(bytes) => std::fs::write(to, bytes),
                None => Ok(()),
            }
        }
        Change::Remove { path, bytes } => std::fs::write(path, bytes),
        Change::Exchange { a, b } => rename_exchange(a, b),
        Change::RemoveTree { path, stash } => std::fs::rename(stash, path),
    };
    done.map(|()| None)
}

/// `result`, with an error of kind `kind` taken as success.
fn ignore(result: io::Result<()>, kind: io::ErrorKind) -> io::Result<()> {
    match result {
        Err(e) if e.kind() == kind => Ok(()),
        other => other,
    }
}

/// Makes `change` again; a creation gets back `stash`, what was durable in it. A name
/// change inside a directory whose own creation was lost is lost with it.
fn redo(change: &Change, stash: Option<Stash>) -> io::Result<()> {
    if change.directory().is_some_and(|dir| !dir.exists()) {
        return Ok(());
    }
    match change {
        Change::Write {
            path,
            offset,
            bytes,
            ..
        } => match OpenOptions::new().write(true).open(path) {
            // A file whose creation was lost takes its data with it.
            Err(_) => Ok(()),
            Ok(file) => file.write_all_at(bytes, *offset),
        },
        Change::SetLen { path, len, .. } => match OpenOptions::new().write(true).open(path) {
            Err(_) => Ok(()),
            Ok(file) => file.set_len(*len),
        },
        Change::Create { path } => match stash {
            Some(Stash::Bytes(bytes)) => std::fs::write(path, bytes),
            _ => std::fs::write(path, []),
        },
        Change::Rename { from, to, .. } => std::fs::rename(from, to),
        Change::Remove { path, .. } => ignore(std::fs::remove_file(path), io::ErrorKind::NotFound),
        Change::Exchange { a, b } => rename_exchange(a, b),
        Change::RemoveTree { path, stash } => std::fs::rename(path, stash),
        Change::CreateDir { path } => match stash {
            Some(Stash::Dir(aside)) => std::fs::rename(aside, path),
            _ => ignore(std::fs::create_dir(path), io::ErrorKind::AlreadyExists),
        },
    }
}

#[cfg(test)]
mod tests {
    /// Processes started together on a fresh directory each make the same parents: every
    /// one succeeds, whichever made each directory first.
    #[test]
    fn directories_made_meanwhile_by_others_are_taken_as_made() {
        let scratch = tempfile::tempdir().expect("scratch");
        for round in 0..20 {
            let path = scratch.path().join(format!("c{round}/data/shard-0"));
            let barrier = std::sync::Barrier::new(6);
            std::thread::scope(|s| {
                let made: Vec<_> = (0..6)
                    .map(|k| {
                        let (path, barrier) = (path.join(format!("r{k}")), &barrier);
                        s.spawn(move || {
                            barrier.wait();
                            super::Disk::real().create_dir_all(&path)
                        })
                    })
                    .collect();
                for m in made {
                    m.join().expect("thread").expect("made");
                }
            });
        }
    }

    /// Pieces written at once land back to back at their offset, past `UIO_MAXIOV` pieces and
    /// with empty ones among them; under a power-cut recorder they are one change, which a
    /// cut that loses it takes back to the bytes before.
    #[test]
    fn pieces_written_at_once_land_back_to_back_and_are_one_change() {
        let scratch = tempfile::tempdir().expect("scratch");
        let path = scratch.path().join("file");
        std::fs::write(&path, vec![1u8; 100]).expect("write the file");
        let pieces: Vec<Vec<u8>> = (0..2500u32)
            .map(|k| vec![(k % 251) as u8; (k % 7) as usize])
            .collect();
        let parts: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let expected: Vec<u8> = [vec![1u8; 60], parts.concat()].concat();

        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        super::Disk::real()
            .write_parts_at(&file, &path, &parts, 60)
            .expect("written");
        assert_eq!(std::fs::read(&path).expect("read"), expected);

        let power = super::PowerCut::record(scratch.path());
        power
            .disk()
            .write_parts_at(&file, &path, &parts[..10], 0)
            .expect("written");
        assert_eq!(power.pending(), 1, "one change for all the pieces");
        drop(file);
        power.cut(|_| false).expect("cut");
        assert_eq!(std::fs::read(&path).expect("read"), expected);
    }
}
