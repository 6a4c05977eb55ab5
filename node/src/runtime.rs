//! The engine's thread pools: readers split large gathers, writers encode large appends in
//! parallel (each into its own chunk), cleaners free the decompressed buffers of dropped
//! batches off the caller's thread. Pools start on first use, so a store that never needs
//! one costs no threads.

use crate::disk::Disk;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use rayon::{ThreadPool, ThreadPoolBuilder};

/// Most reader threads a store starts.
pub const READERS_MAX: usize = 256;
/// Most writers (each owns one unfull chunk).
pub const WRITERS_MAX: usize = 64;
/// Most cleaner threads.
pub const CLEANERS_MAX: usize = 16;
/// Buffers smaller than this are freed on the spot: handing them over costs more.
const CLEANER_MIN_BYTES: usize = 64 << 10;

/// What a store runs on: the sizes of its pools (each clamped to 1..=its maximum), and the
/// disk its changes go through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Threads that share a large gather (default: the machine's cores; more threads than
    /// cores only take turns, and made sequential reads slower).
    pub readers: usize,
    /// Writers: appends run on up to this many chunks at once (default 2).
    pub writers: usize,
    /// Threads that free dropped batches' buffers (default 2).
    pub cleaners: usize,
    /// Where its changes to its files go (default: the file system; a test's power-cut
    /// recorder, see [`crate::disk::PowerCut`]).
    pub disk: Disk,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            readers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            writers: 2,
            cleaners: 2,
            disk: Disk::real(),
        }
    }
}

impl RuntimeOptions {
    pub(crate) fn clamped(self) -> RuntimeOptions {
        RuntimeOptions {
            readers: self.readers.clamp(1, READERS_MAX),
            writers: self.writers.clamp(1, WRITERS_MAX),
            cleaners: self.cleaners.clamp(1, CLEANERS_MAX),
            disk: self.disk,
        }
    }
}

pub(crate) struct Runtime {
    pub(crate) options: RuntimeOptions,
    readers: OnceLock<Option<ThreadPool>>,
    writers: OnceLock<Option<ThreadPool>>,
    cleaner: OnceLock<Option<Mutex<Sender<Vec<u8>>>>>,
}

impl Runtime {
    pub(crate) fn new(options: RuntimeOptions) -> Arc<Runtime> {
        Arc::new(Runtime {
            options: options.clamped(),
            readers: OnceLock::new(),
            writers: OnceLock::new(),
            cleaner: OnceLock::new(),
        })
    }

    /// The reader pool, if there is more than one reader (and threads could be started).
    pub(crate) fn readers(&self) -> Option<&ThreadPool> {
        self.readers
            .get_or_init(|| pool("zr-reader", self.options.readers))
            .as_ref()
    }

    /// The writer pool, if there is more than one writer.
    pub(crate) fn writers(&self) -> Option<&ThreadPool> {
        self.writers
            .get_or_init(|| pool("zr-writer", self.options.writers))
            .as_ref()
    }

    /// Frees `buffer` on a cleaner thread (or here, if it is small or no cleaner runs).
    pub(crate) fn discard(&self, buffer: Vec<u8>) {
        if buffer.capacity() < CLEANER_MIN_BYTES {
            return;
        }
        let cleaner = self
            .cleaner
            .get_or_init(|| start_cleaners(self.options.cleaners));
        if let Some(sender) = cleaner {
            if let Ok(sender) = sender.lock() {
                // A send fails only if every cleaner died; then the buffer is dropped here.
                let _ = sender.send(buffer);
            }
        }
    }
}

fn pool(name: &'static str, threads: usize) -> Option<ThreadPool> {
    if threads <= 1 {
        return None;
    }
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .build()
        .ok()
}

fn start_cleaners(threads: usize) -> Option<Mutex<Sender<Vec<u8>>>> {
    let (sender, receiver) = channel::<Vec<u8>>();
    let receiver = Arc::new(Mutex::new(receiver));
    let mut started = 0;
    for i in 0..threads {
        let receiver: Arc<Mutex<Receiver<Vec<u8>>>> = Arc::clone(&receiver);
        let spawned = std::thread::Builder::new()
            .name(format!("zr-cleaner-{i}"))
            .spawn(move || loop {
                // Ends when the store (the only sender) is gone.
                let next = match receiver.lock() {
                    Ok(receiver) => receiver.recv(),
                    Err(_) => return,
                };
                match next {
                    Ok(buffer) => drop(buffer),
                    Err(_) => return,
                }
            });
        started += spawned.is_ok() as usize;
    }
    (started > 0).then(|| Mutex::new(sender))
}

/// Part length for `n` items split over the reader pool, or `None` to stay on this thread.
pub(crate) fn part_len(runtime: &Runtime, n: usize, part_min: usize) -> Option<usize> {
    let readers = runtime.options.readers;
    if readers <= 1 || n < 2 * part_min {
        return None;
    }
    Some(n.div_ceil(readers).max(part_min))
}
