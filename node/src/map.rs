//! Read-only memory mappings of dataset files.
//!
//! Files are written with `pwrite` and read through these mappings; the page cache keeps the
//! two coherent. A mapping may cover bytes that are being written at the same moment (the
//! unused tail of a chunk, offset entries past `len`), so this type never hands out a slice of
//! the whole mapping: callers ask for exactly the range they will read, and the engine's
//! protocol (append-only chunks, entries changed only under the view lock) guarantees nothing
//! writes that range while the returned slice lives.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use memmap2::{Advice, Mmap};

use crate::error::{IoContext, Result};

/// Page size the residency checks and `O_DIRECT` alignment assume.
pub(crate) const PAGE_BYTES: u64 = 4096;

/// One read-only mapping of a file at the size it had when mapped, with the file itself for
/// explicit reads (see `io`).
pub(crate) struct Mapped {
    map: Mmap,
    /// The mapping's address and length, for reads.
    region: Region,
    /// The file, for explicit reads: kept from the start for unit 0, opened on first use for
    /// the others (see [`Mapped::of_unit`]).
    file: OnceLock<std::result::Result<File, std::sync::Arc<std::io::Error>>>,
    path: PathBuf,
    /// The file opened again with `O_DIRECT`, on first use.
    uncached: OnceLock<std::result::Result<File, std::sync::Arc<std::io::Error>>>,
}

impl Mapped {
    /// Maps `file` (of `path`, for messages) read-only. `None` for an empty file, which has no
    /// bytes to map.
    pub(crate) fn new(file: &File, path: &Path) -> Result<Option<Arc<Mapped>>> {
        Mapped::of_unit(file, path, 0)
    }

    /// [`Mapped::new`] for a file of unit `unit` (see `unit`): for units other than 0 it
    /// keeps no descriptor of its own until an explicit read needs one — a node holding
    /// hundreds of slots would otherwise hold thousands — and then opens the file by `path`
    /// (a file replaced there since is caught by the CRC every explicit read checks).
    pub(crate) fn of_unit(file: &File, path: &Path, unit: u32) -> Result<Option<Arc<Mapped>>> {
        let len = file.metadata().ctx("stat", path)?.len();
        if len == 0 {
            return Ok(None);
        }
        // SAFETY: the dataset directory is locked (see `Store::open`), so no other zrecord
        // process writes these files; this process writes only ranges no reader is given a
        // slice of (see the module comment). A file shrunk by a foreign process would fault
        // on access, which no safe mapping API can prevent.
        let map = unsafe { Mmap::map(file) }.ctx("mmap", path)?;
        // Random access: a fault reads its own page, not the readahead window around it (up
        // to megabytes per record on a cold dataset). Advice only: failing to give it is not
        // an error.
        let _ = map.advise(Advice::Random);
        let kept = OnceLock::new();
        if unit == 0 {
            let _ = kept.set(Ok(file.try_clone().ctx("dup", path)?));
        }
        Ok(Some(Arc::new(Mapped {
            region: Region {
                addr: map.as_ptr() as usize,
                len: map.len() as u64,
            },
            map,
            file: kept,
            path: path.to_path_buf(),
            uncached: OnceLock::new(),
        })))
    }

    /// The mapped file's path, for messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file's descriptor, for reads through the page cache.
    pub(crate) fn fd(&self) -> Result<RawFd> {
        self.opened(&self.file, "open", || File::open(&self.path))
    }

    /// A descriptor of the file opened with `O_DIRECT` (reads that bypass the page cache and
    /// must be aligned to [`PAGE_BYTES`]); an error naming the file where the file system
    /// refuses it.
    pub(crate) fn uncached_fd(&self) -> Result<RawFd> {
        self.opened(&self.uncached, "open with O_DIRECT", || {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&self.path)
        })
    }

    /// The descriptor of the file `slot` keeps, opened by `open` on first use; a failure to
    /// open is kept too, and named (`op`, the path) each time.
    fn opened(
        &self,
        slot: &OnceLock<std::result::Result<File, std::sync::Arc<std::io::Error>>>,
        op: &'static str,
        open: impl FnOnce() -> std::io::Result<File>,
    ) -> Result<RawFd> {
        match slot.get_or_init(|| open().map_err(std::sync::Arc::new)) {
            Ok(file) => Ok(file.as_raw_fd()),
            Err(e) => Err(crate::Error::Io {
                op,
                path: self.path.clone(),
                source: std::io::Error::new(e.kind(), std::sync::Arc::clone(e)),
            }),
        }
    }

    /// True if every page of `[start, start + len)` is in the page cache, so that reading it
    /// through the mapping costs no disk read. Out of range, or if the kernel cannot say:
    /// false.
    pub(crate) fn resident(&self, start: u64, len: u64) -> bool {
        let Some(end) = start.checked_add(len.max(1)) else {
            return false;
        };
        if end > self.len() {
            return false;
        }
        let first = start / PAGE_BYTES * PAGE_BYTES;
        let pages = (end - first).div_ceil(PAGE_BYTES) as usize;
        const PAGES_MAX: usize = 8;
        let mut vec = [0u8; PAGES_MAX];
        let pages = pages.min(PAGES_MAX);
        // SAFETY: `first` is page-aligned and inside the mapping, and `pages` pages from it
        // lie inside the mapping's last page at most (end <= len, rounded up to a page,
        // which the mapping spans); `vec` has a byte for each page asked about.
        let status = unsafe {
            libc::mincore(
                self.map.as_ptr().add(first as usize) as *mut libc::c_void,
                pages * PAGE_BYTES as usize,
                vec.as_mut_ptr(),
            )
        };
        status == 0 && vec[..pages].iter().all(|v| v & 1 == 1)
    }

    /// Mapped length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.region.len
    }

    /// The mapping's bytes as a [`Region`], to read 16 bytes from or prefetch.
    #[inline]
    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    /// The bytes `[start, start + len)`, or `None` if the range is not inside the mapping.
    #[inline]
    pub(crate) fn bytes(&self, start: u64, len: u64) -> Option<&[u8]> {
        let end = start.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // SAFETY: `start..end` lies inside the mapping (checked above), which lives as long as
        // `self`. The engine never writes a range after a reader can reach it (append-only
        // chunks; entry changes are excluded by the view lock), so the bytes do not change
        // while the slice is alive.
        Some(unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().add(start as usize), len as usize)
        })
    }
}

/// A mapping's bytes as their address and length: what a gather reads offset entries
/// through and places records by. Each is held beside the mapping it describes — in its
/// [`Mapped`], or in the published maps (`view::Published`) that hold the `Mapped` too —
/// and is only lent out by reference from there, so the bytes are mapped while it is in
/// reach.
#[derive(Clone, Default)]
pub(crate) struct Region {
    /// 0 (with `len` 0) for no mapping.
    addr: usize,
    len: u64,
}

impl Region {
    /// No mapping: nothing lies inside it.
    pub(crate) const NONE: Region = Region { addr: 0, len: 0 };

    /// Length in bytes.
    #[inline]
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The address of byte `start` (for a range checked to lie inside the mapping).
    #[inline]
    pub(crate) fn addr(&self, start: u64) -> usize {
        self.addr.wrapping_add(start as usize)
    }

    /// The 16 bytes at `start`, copied out, or `None` if they are not inside the mapping.
    #[inline]
    pub(crate) fn read16(&self, start: u64) -> Option<[u8; 16]> {
        if start.checked_add(16)? > self.len {
            return None;
        }
        // SAFETY: the 16 bytes lie inside the mapping (checked above), which is mapped while
        // this region is in reach (see the type); `read_unaligned` copies them without
        // forming a reference and without an alignment requirement.
        Some(unsafe { std::ptr::read_unaligned(self.addr(start) as *const [u8; 16]) })
    }

    /// Hints the CPU to start loading `[start, start + len)` (capped at `PREFETCH_BYTES_MAX`)
    /// into cache. Out-of-range requests are ignored. A gather issues this a few records ahead
    /// of the copy, so the memory latency of random records overlaps instead of adding up.
    #[inline]
    pub(crate) fn prefetch(&self, start: u64, len: u64) {
        let len = len.min(PREFETCH_BYTES_MAX);
        if start.saturating_add(len) > self.len {
            return;
        }
        prefetch_at(self.addr(start), len);
    }
}

/// [`Region::prefetch`] of the bytes at address `at` (inside a mapping; 0: nothing).
#[inline]
pub(crate) fn prefetch_at(at: usize, len: u64) {
    if at == 0 {
        return;
    }
    let base = at as *const u8;
    let mut line = 0;
    while line < len.min(PREFETCH_BYTES_MAX) as usize {
        prefetch_line(base.wrapping_add(line));
        line += 64;
    }
}

/// Longest prefix of a record that `Region::prefetch` touches: past this, the hardware
/// prefetcher follows the copy on its own.
const PREFETCH_BYTES_MAX: u64 = 2048;

#[inline(always)]
fn prefetch_line(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no observable effect, even
    // for an address that is not mapped (the callers pass addresses inside a mapping anyway).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ptr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}
