//! A dataset's locks: any number of readers, in any processes, beside one writer.
//!
//! - `lock`: every reader holds it shared, and so does the writer — exclusive only while it
//!   changes, in place, offset-table entries a reader may be reading (a commit's changes to
//!   records below the committed length: modify, delete, a field written). While another
//!   process reads, those changes wait in the redo log and the writer's overlay, which every
//!   commit writes again, until a commit (or the next writer's open) finds the dataset alone.
//!   Everything else a writer writes lies past what any reader can reach (see `store`).
//! - `writer.lock`: the writer holds it exclusive: one writer at a time.
//!
//! A reader therefore sees the dataset as of the last commit when it opened: appends since
//! lie past its length, and entries it can reach do not change under it.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use crate::disk::Disk;
use crate::error::{Error, IoContext, Result};

/// Name of the lock file every reader and the writer hold, inside a dataset directory.
pub const LOCK_FILE: &str = "lock";
/// Name of the lock file the writer holds alone.
pub const WRITER_LOCK_FILE: &str = "writer.lock";

/// Retries of a contended lock, [`LOCK_RETRY_WAIT`] apart.
const LOCK_RETRIES: u32 = 20;
const LOCK_RETRY_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// The locks a handle holds (see the module documentation).
pub(crate) struct Locks {
    /// `lock`, shared (`None`: a reader of a read-only directory without a lock file, which
    /// no writer can have open — it would have made the file).
    readers: Option<File>,
    /// `writer.lock`, exclusive (`None`: a reader).
    writer: Option<File>,
}

impl Locks {
    /// A reader's: `lock`, shared.
    pub(crate) fn reader(disk: &Disk, dir: &Path) -> Result<Locks> {
        Ok(Locks {
            readers: take(disk, dir, LOCK_FILE, Kind::Shared)?,
            writer: None,
        })
    }

    /// The writer's: `writer.lock` alone, then `lock` shared.
    pub(crate) fn writer(disk: &Disk, dir: &Path) -> Result<Locks> {
        let writer = take(disk, dir, WRITER_LOCK_FILE, Kind::Exclusive)?;
        Ok(Locks {
            readers: take(disk, dir, LOCK_FILE, Kind::Shared)?,
            writer,
        })
    }

    /// The same locks, for another handle of this process (they are held until both go).
    pub(crate) fn try_clone(&self, dir: &Path) -> Result<Locks> {
        let clone = |file: &Option<File>| match file {
            Some(file) => file.try_clone().ctx("share the lock", dir).map(Some),
            None => Ok(None),
        };
        Ok(Locks {
            readers: clone(&self.readers)?,
            writer: clone(&self.writer)?,
        })
    }

    /// Runs `change` with `lock` held exclusive, if no other process holds it (no reader
    /// elsewhere); `None`, with nothing run, otherwise. The writer's only.
    pub(crate) fn alone<T>(&self, change: impl FnOnce() -> T) -> Option<T> {
        let readers = self.readers.as_ref()?;
        // Converting a flock is not atomic: a failed attempt may have given up the shared
        // lock, which is taken again (only readers, who share it, can have come meanwhile).
        match readers.try_lock() {
            Ok(()) => {
                let changed = change();
                if let Err(e) = readers.lock_shared() {
                    tracing::warn!("taking the dataset's lock back to shared: {e}");
                }
                Some(changed)
            }
            Err(_) => {
                if let Err(e) = readers.lock_shared() {
                    tracing::warn!("taking the dataset's shared lock again: {e}");
                }
                None
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Shared,
    Exclusive,
}

/// Takes lock file `name` of `dir`, made if missing (unless the directory is read-only and
/// the lock is shared).
fn take(disk: &Disk, dir: &Path, name: &str, kind: Kind) -> Result<Option<File>> {
    let path = dir.join(name);
    let opened = disk.open(
        &path,
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false),
    );
    let file = match opened {
        Ok(file) => file,
        // A reader of a directory it may not write (a read-only mount, another user's
        // data): a lock file that exists is locked through a read-only descriptor; without
        // one, no writer can have the dataset open (it would have made it).
        Err(e) if kind == Kind::Shared && is_read_only(&e) => match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).ctx("open lock file", &path),
        },
        Err(e) => return Err(e).ctx("open lock file", &path),
    };
    let try_lock = || match kind {
        Kind::Exclusive => file.try_lock(),
        Kind::Shared => file.try_lock_shared(),
    };
    // A lock just released can linger for a moment: a process that forks (any program
    // spawning a subprocess) shares the lock's file description with the child until the
    // child execs. So a contended lock is retried briefly before it counts as taken.
    let mut taken = try_lock();
    for _ in 0..LOCK_RETRIES {
        if !matches!(taken, Err(TryLockError::WouldBlock)) {
            break;
        }
        std::thread::sleep(LOCK_RETRY_WAIT);
        taken = try_lock();
    }
    match taken {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Err(Error::Locked {
            path: dir.to_path_buf(),
            why: match (name, kind) {
                (WRITER_LOCK_FILE, _) => "it is open for writing elsewhere: one writer at a time",
                // Only a writer of an earlier zrecord holds `lock` exclusive.
                _ => "it is open for writing elsewhere, by an earlier version of zrecord",
            },
        }),
        Err(TryLockError::Error(e)) => Err(e).ctx("lock", &path),
    }
}

fn is_read_only(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
    )
}
