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
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod power_cut;

pub use power_cut::PowerCut;
use power_cut::{Change, Recorder};

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

impl Disk {
    /// The file system itself, as production runs.
    pub fn real() -> Disk {
        Disk::default()
    }

    /// The recorder covering `path`, if any.
    fn recorder(&self, path: &Path) -> Option<&Arc<Recorder>> {
        self.recorder.as_ref().filter(|r| path.starts_with(&r.root))
    }

    /// `pwrite` of all of `bytes` at `offset`.
    pub fn write_at(&self, file: &File, path: &Path, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.write_parts_at(file, path, &[bytes], offset)
    }

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

    /// Opens `path` with `options`, logging its creation if it did not exist (`options` must
    /// not truncate an existing file: that is [`Disk::create`]).
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

    /// [`Disk::remove_tree`], where a tree already gone (or being removed by another thread, as a
    /// dropped unit's files are while a store reopens) is not an error.
    pub fn remove_tree_if_present(&self, path: &Path) -> io::Result<()> {
        match self.remove_tree(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

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
