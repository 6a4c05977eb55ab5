//! What of a file the page cache holds, and dropping it from there: how benchmarks and tests
//! start a read cold, and see that it was.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// The pages of `file` the page cache holds, and its pages in all (4 KiB each).
pub fn resident_pages(file: &File) -> io::Result<(usize, usize)> {
    let len = file.metadata()?.len() as usize;
    if len == 0 {
        return Ok((0, 0));
    }
    // SAFETY: a read-only mapping, only its residency asked about: no byte of it is read, so
    // a concurrent writer cannot make this read torn data.
    let map = unsafe { memmap2::Mmap::map(file) }?;
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: the range is the whole mapping; `vec` has a byte per page of it.
    let status = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((vec.iter().filter(|&&v| v & 1 == 1).count(), vec.len()))
}

/// Drops the clean pages of the file at `path` that nothing maps from the page cache;
/// returns whether none of its pages is left there (false on a file system that keeps files
/// in memory, as tmpfs does).
pub fn evict(path: &Path) -> io::Result<bool> {
    let file = File::open(path)?;
    // SAFETY: plain advice on an open descriptor; it changes no memory of ours.
    let status = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if status != 0 {
        return Err(io::Error::from_raw_os_error(status));
    }
    Ok(resident_pages(&file)?.0 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_is_resident_until_evicted() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("pages");
        std::fs::write(&path, vec![1u8; 64 << 10]).expect("write");
        let file = File::open(&path).expect("open");
        assert_eq!(resident_pages(&file).expect("mincore"), (16, 16));
        std::fs::File::open(&path)
            .expect("open")
            .sync_all()
            .expect("sync");
        if evict(&path).expect("evict") {
            assert_eq!(resident_pages(&file).expect("mincore"), (0, 16));
        }
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").expect("write");
        assert!(evict(&empty).expect("evict"));
        assert_eq!(
            evict(&dir.path().join("absent")).map_err(|e| e.kind()),
            Err(io::ErrorKind::NotFound)
        );
    }
}
