//! The power-cut recorder behind a test's [`Disk`]: the changes not yet durable, with what
//! each replaced, and a cut that undoes what a power failure may lose.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{rename_exchange, Disk};

/// One change not yet durable, with what it replaced.
#[derive(Debug)]
pub(super) enum Change {
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
    pub(super) fn directory(&self) -> Option<&Path> {
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
    pub(super) fn failed(&self, what: &str, e: io::Error) -> io::Error {
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
    pub(super) fn paths(&self) -> Vec<&Path> {
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
    pub(super) fn file(&self) -> Option<&Path> {
        match self {
            Change::Write { path, .. } | Change::SetLen { path, .. } => Some(path),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Log {
    /// Changes not yet durable, in the order they were made.
    pub(super) pending: Vec<Change>,
    /// Changes allowed before the power fails (`None`: no limit).
    pub(super) allowed: Option<u64>,
    /// Changes made (durable or not).
    pub(super) made: u64,
    /// The power has failed: every change from now on fails.
    pub(super) cut: bool,
}

#[derive(Debug)]
pub(super) struct Recorder {
    pub(super) root: PathBuf,
    pub(super) log: Mutex<Log>,
}

impl Recorder {
    pub(super) fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
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
