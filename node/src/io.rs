//! Batched reads of exact byte ranges, for gathers of data that is not in memory.
//!
//! A page fault reads one page (or, without `MADV_RANDOM`, megabytes around it) and a thread
//! waits for each in turn, so a cold gather through the mappings keeps the device at a queue
//! depth of one. Here a gather's reads are all issued at once: through a per-thread io_uring
//! ring at a queue depth of [`QUEUE_DEPTH`] where the kernel allows it, else on a pool of
//! threads calling `preadv`. Every read lands straight in its destination (`preadv`
//! semantics: up to two buffers per read, so a frame's header and its payload can go to
//! different places). A read that comes back short is finished with `preadv`; one that
//! meets the end of the file is an error, never a signal.

use std::cell::RefCell;
use std::io;
use std::marker::PhantomData;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};

/// Reads in flight per ring: deep enough to keep an NVMe device busy from one gather.
pub(crate) const QUEUE_DEPTH: u32 = 128;
/// Threads of the `preadv` fallback, at most, per gather.
const THREADS_MAX: usize = 32;

/// How a gather's reads are issued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoBackend {
    /// io_uring where the kernel allows it, else the `preadv` threads (the default).
    #[default]
    Auto,
    /// io_uring only: an error where it cannot be set up.
    Uring,
    /// A pool of threads calling `preadv`.
    Threads,
}

/// One read: `len` bytes of `fd` from `offset`, into one or two buffers in order.
pub(crate) struct ReadOp<'a> {
    fd: RawFd,
    offset: u64,
    iov: [libc::iovec; 2],
    iovcnt: usize,
    /// Bytes the buffers hold.
    len: usize,
    /// Bytes that must be read: fewer than `len` for page-aligned reads whose last page the
    /// file ends inside.
    need: usize,
    /// An `O_DIRECT` read: a short read means the end of the file (a read resumed at an
    /// unaligned offset would be refused).
    aligned: bool,
    _buffers: PhantomData<&'a mut [u8]>,
}

// SAFETY: the iovecs point into buffers borrowed mutably for 'a by this op alone (see
// `ReadOp::new`); moving the op to another thread moves that exclusive access with it.
unsafe impl Send for ReadOp<'_> {}

impl<'a> ReadOp<'a> {
    /// A read of `first.len() + second.len()` bytes of `fd` at `offset`, `first` filled first.
    pub(crate) fn new(fd: RawFd, offset: u64, first: &'a mut [u8], second: &'a mut [u8]) -> Self {
        let len = first.len() + second.len();
        let iov = [
            libc::iovec {
                iov_base: first.as_mut_ptr().cast(),
                iov_len: first.len(),
            },
            libc::iovec {
                iov_base: second.as_mut_ptr().cast(),
                iov_len: second.len(),
            },
        ];
        let iovcnt = if second.is_empty() { 1 } else { 2 };
        ReadOp {
            fd,
            offset,
            iov,
            iovcnt,
            len,
            need: len,
            aligned: false,
            _buffers: PhantomData,
        }
    }

    /// An `O_DIRECT` read of whole pages into `pages` (page-aligned, as is `offset`), of
    /// which the first `need` bytes must be there: the file may end inside the last page.
    pub(crate) fn aligned(fd: RawFd, offset: u64, pages: &'a mut [u8], need: usize) -> Self {
        let mut op = ReadOp::new(fd, offset, pages, &mut []);
        op.need = need.min(op.len);
        op.aligned = true;
        op
    }

    /// Reads what is left of the op from byte `done` on, with `preadv`, until it is whole.
    fn finish(&mut self, mut done: usize) -> Result<(), ReadError> {
        while done < self.need {
            if self.aligned && done > 0 {
                return Err(ReadError::Eof { read: done });
            }
            // The iovecs past `done`: skip whole buffers, then part of one.
            let mut iov = self.iov;
            let mut skip = done;
            let mut first = 0;
            while first < self.iovcnt && skip >= iov[first].iov_len {
                skip -= iov[first].iov_len;
                first += 1;
            }
            // SAFETY: `skip` is less than this buffer's length (the loop above stopped on it),
            // so the advanced pointer stays inside the buffer.
            iov[first].iov_base = unsafe { iov[first].iov_base.cast::<u8>().add(skip).cast() };
            iov[first].iov_len -= skip;
            let offset = (self.offset + done as u64) as libc::off_t;
            // SAFETY: the iovecs describe live buffers borrowed mutably by this op (`new`).
            let read = unsafe {
                libc::preadv(
                    self.fd,
                    iov[first..self.iovcnt].as_ptr(),
                    (self.iovcnt - first) as libc::c_int,
                    offset,
                )
            };
            match read {
                0 => return Err(ReadError::Eof { read: done }),
                n if n > 0 => done += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(ReadError::Io(e));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Why a read failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The file ended after `read` of the op's bytes.
    Eof {
        read: usize,
    },
    Io(io::Error),
}

/// The first read of a batch that failed: its position in the batch, and why.
#[derive(Debug)]
pub(crate) struct ReadFailure {
    pub(crate) op: usize,
    pub(crate) error: ReadError,
}

/// Which way reads went, for the store's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Issued {
    Uring,
    Threads,
}

/// Set once a ring could not be made: the kernel refuses io_uring (too old, disabled by
/// `kernel.io_uring_disabled`, or a seccomp filter), so no thread tries again.
static URING_REFUSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread's ring, made on its first cold gather.
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Makes a ring of `entries` (a power of two up to the kernel's limit).
fn make_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::new(entries)
}

/// Reads every op whole, as `backend` says; on failure, the first op that failed (every op
/// has finished either way: no read is left writing into the buffers).
pub(crate) fn read_all(ops: &mut [ReadOp<'_>], backend: IoBackend) -> Result<Issued, ReadFailure> {
    read_all_with(ops, backend, QUEUE_DEPTH)
}

/// [`read_all`] with rings of `entries`; a ring that cannot be made falls back as `backend`
/// allows.
fn read_all_with(
    ops: &mut [ReadOp<'_>],
    backend: IoBackend,
    entries: u32,
) -> Result<Issued, ReadFailure> {
    if ops.is_empty() {
        return Ok(Issued::Threads);
    }
    if backend != IoBackend::Threads && !URING_REFUSED.load(Ordering::Relaxed) {
        let ran = RING.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                match make_ring(entries) {
                    Ok(ring) => *slot = Some(ring),
                    Err(e) => return Err(e),
                }
            }
            let ring = slot.as_mut().expect("the ring was just made");
            Ok(read_uring(ring, ops))
        });
        match ran {
            Ok(result) => return result.map(|()| Issued::Uring),
            Err(e) => {
                if backend == IoBackend::Uring {
                    return Err(ReadFailure {
                        op: 0,
                        error: ReadError::Io(io::Error::new(
                            e.kind(),
                            format!("cannot set up io_uring: {e}"),
                        )),
                    });
                }
                if !URING_REFUSED.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "io_uring is not available ({e}); cold reads use preadv threads"
                    );
                }
            }
        }
    } else if backend == IoBackend::Uring {
        return Err(ReadFailure {
            op: 0,
            error: ReadError::Io(io::Error::other("io_uring was refused earlier")),
        });
    }
    read_threads(ops).map(|()| Issued::Threads)
}

/// Reads `ops` through `ring`, [`QUEUE_DEPTH`] at a time at most; waits for every read it
/// submitted, even after a failure.
fn read_uring(ring: &mut IoUring, ops: &mut [ReadOp<'_>]) -> Result<(), ReadFailure> {
    let depth = ring.params().cq_entries().min(QUEUE_DEPTH) as usize;
    let mut next = 0usize;
    let mut in_flight = 0usize;
    let mut failure: Option<ReadFailure> = None;
    let mut done: Vec<(usize, i32)> = Vec::with_capacity(depth);
    loop {
        while failure.is_none() && next < ops.len() && in_flight < depth {
            let op = &ops[next];
            let entry = opcode::Readv::new(types::Fd(op.fd), op.iov.as_ptr(), op.iovcnt as u32)
                .offset(op.offset)
                .build()
                .user_data(next as u64);
            // SAFETY: the iovecs and the buffers they point into live, borrowed mutably by
            // `ops`, until this function returns, and it returns only once every read it
            // submitted has completed (the loop waits while any is in flight).
            if unsafe { ring.submission().push(&entry) }.is_err() {
                break;
            }
            next += 1;
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => {
                // Submit nothing more. Reads in flight still complete and are reaped below:
                // this function must not return before they have.
                failure.get_or_insert(ReadFailure {
                    op: next.saturating_sub(1),
                    error: ReadError::Io(e),
                });
                std::thread::yield_now();
            }
        }
        done.clear();
        done.extend(
            ring.completion()
                .map(|cqe| (cqe.user_data() as usize, cqe.result())),
        );
        for &(i, result) in &done {
            in_flight -= 1;
            let error = if result < 0 {
                Some(ReadError::Io(io::Error::from_raw_os_error(-result)))
            } else if (result as usize) < ops[i].need {
                // Short: the file ends there, or the kernel stopped early.
                ops[i].finish(result as usize).err()
            } else {
                None
            };
            if let Some(error) = error {
                if failure.as_ref().is_none_or(|f| f.op > i) {
                    failure = Some(ReadFailure { op: i, error });
                }
            }
        }
    }
    failure.map_or(Ok(()), Err)
}

/// Reads `ops` on up to [`THREADS_MAX`] threads, each taking the next op in turn.
fn read_threads(ops: &mut [ReadOp<'_>]) -> Result<(), ReadFailure> {
    let threads = ops.len().min(THREADS_MAX);
    let queue = Mutex::new(ops.iter_mut().enumerate());
    let failed = AtomicUsize::new(usize::MAX);
    let failure: Mutex<Option<ReadFailure>> = Mutex::new(None);
    let work = || loop {
        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
        let Some((i, op)) = next else { break };
        if failed.load(Ordering::Relaxed) < i {
            continue;
        }
        if let Err(error) = op.finish(0) {
            failed.fetch_min(i, Ordering::Relaxed);
            let mut first = failure.lock().unwrap_or_else(|e| e.into_inner());
            if first.as_ref().is_none_or(|f| f.op > i) {
                *first = Some(ReadFailure { op: i, error });
            }
        }
    };
    if threads <= 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 1..threads {
                scope.spawn(work);
            }
            work();
        });
    }
    failure
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use super::*;

    fn file_of(bytes: &[u8]) -> std::fs::File {
        let mut file = tempfile::tempfile().expect("temporary file");
        file.write_all(bytes).expect("write");
        file
    }

    /// Every backend reads the same bytes, split over two buffers as asked; a read past the
    /// end is an error naming the op, after the ops before it were read.
    #[test]
    fn every_backend_reads_exact_ranges() {
        let bytes: Vec<u8> = (0..100_000u32).map(|k| (k * 7 + k / 251) as u8).collect();
        let file = file_of(&bytes);
        let ranges: Vec<(u64, usize, usize)> = (0..300u64)
            .map(|k| {
                (
                    (k * 7919) % 90_000,
                    1 + (k as usize * 13) % 40,
                    (k as usize * 31) % 3000,
                )
            })
            .collect();
        for backend in [IoBackend::Auto, IoBackend::Threads] {
            let mut heads: Vec<Vec<u8>> = ranges.iter().map(|r| vec![0; r.1]).collect();
            let mut tails: Vec<Vec<u8>> = ranges.iter().map(|r| vec![0; r.2]).collect();
            let mut ops: Vec<ReadOp> = ranges
                .iter()
                .zip(heads.iter_mut().zip(tails.iter_mut()))
                .map(|(r, (h, t))| ReadOp::new(file.as_raw_fd(), r.0, h, t))
                .collect();
            read_all(&mut ops, backend).expect("read");
            drop(ops);
            for (r, (h, t)) in ranges.iter().zip(heads.iter().zip(&tails)) {
                let at = r.0 as usize;
                assert_eq!(&h[..], &bytes[at..at + r.1]);
                assert_eq!(&t[..], &bytes[at + r.1..at + r.1 + r.2]);
            }
            let mut a = vec![0u8; 10];
            let mut b = vec![0u8; 100];
            let mut past = vec![0u8; 10];
            let mut ops = vec![
                ReadOp::new(file.as_raw_fd(), 0, &mut a, &mut []),
                ReadOp::new(file.as_raw_fd(), 99_950, &mut b, &mut []),
                ReadOp::new(file.as_raw_fd(), 5, &mut past, &mut []),
            ];
            let failure = read_all(&mut ops, backend).expect_err("past the end");
            assert_eq!(failure.op, 1);
            assert!(
                matches!(failure.error, ReadError::Eof { read: 50 }),
                "{failure:?}"
            );
        }
    }

    /// A ring that cannot be set up (here: more entries than the kernel allows) falls back
    /// to the threads, which read the same bytes; forced io_uring reports it instead.
    #[test]
    fn without_io_uring_reads_fall_back_to_threads() {
        let bytes: Vec<u8> = (0..10_000u32).map(|k| k as u8).collect();
        let file = file_of(&bytes);
        let impossible = u32::MAX;
        // On a fresh thread: its ring is made by this call.
        std::thread::spawn(move || {
            let mut out = vec![0u8; 100];
            let mut ops = vec![ReadOp::new(file.as_raw_fd(), 1000, &mut out, &mut [])];
            let issued = read_all_with(&mut ops, IoBackend::Uring, impossible);
            assert!(issued.is_err(), "forced io_uring cannot fall back");
            drop(ops);
            // The fallback is decided per process; probe it without poisoning others.
            let refused_before = URING_REFUSED.load(Ordering::Relaxed);
            let mut ops = vec![ReadOp::new(file.as_raw_fd(), 1000, &mut out, &mut [])];
            let issued = read_all_with(&mut ops, IoBackend::Auto, impossible).expect("read");
            assert_eq!(issued, Issued::Threads);
            drop(ops);
            assert_eq!(&out[..], &bytes[1000..1100]);
            URING_REFUSED.store(refused_before, Ordering::Relaxed);
        })
        .join()
        .expect("test thread");
    }
}
