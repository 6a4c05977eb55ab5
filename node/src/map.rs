//! Read-only memory mappings of dataset files.
//!
//! Files are written with `pwrite` and read through these mappings; the page cache keeps the
//! two coherent. A mapping may cover bytes that are being written at the same moment (the
//! unused tail of a chunk, offset entries past `len`), so this type never hands out a slice of
//! the whole mapping: callers ask for exactly the range they will read, and the engine's
//! protocol (append-only chunks, entries changed only under the view lock) guarantees nothing
//! writes that range while the returned slice lives.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{IoContext, Result};

/// One read-only mapping of a file at the size it had when mapped.
pub(crate) struct Mapped {
    map: Mmap,
}

impl Mapped {
    /// Maps `file` (of `path`, for messages) read-only. `None` for an empty file, which has no
    /// bytes to map.
    pub(crate) fn new(file: &File, path: &Path) -> Result<Option<Arc<Mapped>>> {
        let len = file.metadata().ctx("stat", path)?.len();
        if len == 0 {
            return Ok(None);
        }
        // SAFETY: the dataset directory is locked (see `Store::open`), so no other zrecord
        // process writes these files; this process writes only ranges no reader is given a
        // slice of (see the module comment). A file shrunk by a foreign process would fault
        // on access, which no safe mapping API can prevent.
        let map = unsafe { Mmap::map(file) }.ctx("mmap", path)?;
        Ok(Some(Arc::new(Mapped { map })))
    }

    /// Mapped length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.map.len() as u64
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

    /// The 16 bytes at `start`, copied out, or `None` if they are not inside the mapping.
    #[inline]
    pub(crate) fn read16(&self, start: u64) -> Option<[u8; 16]> {
        if start.checked_add(16)? > self.len() {
            return None;
        }
        // SAFETY: the 16 bytes lie inside the mapping (checked above); `read_unaligned` copies
        // them without forming a reference and without an alignment requirement.
        Some(unsafe {
            std::ptr::read_unaligned(self.map.as_ptr().add(start as usize) as *const [u8; 16])
        })
    }

    /// Hints the CPU to start loading `[start, start + len)` (capped at `PREFETCH_BYTES_MAX`)
    /// into cache. Out-of-range requests are ignored. A gather issues this a few records ahead
    /// of the copy, so the memory latency of random records overlaps instead of adding up.
    #[inline]
    pub(crate) fn prefetch(&self, start: u64, len: u64) {
        let len = len.min(PREFETCH_BYTES_MAX);
        if start.saturating_add(len) > self.len() {
            return;
        }
        let base = self.map.as_ptr().wrapping_add(start as usize);
        let mut line = 0;
        while line < len as usize {
            prefetch_line(base.wrapping_add(line));
            line += 64;
        }
    }
}

/// Longest prefix of a record that `Mapped::prefetch` touches: past this, the hardware
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
