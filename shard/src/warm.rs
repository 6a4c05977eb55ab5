//! Whether a node's gathers find their pages in memory, judged by the major page faults they
//! take (faults that waited for the disk).
//!
//! A node reads its records through memory maps, so a gather of pages the page cache does not
//! hold waits for the disk inside an ordinary memory copy. On an async worker that wait
//! would stall every connection the worker drives; on a blocking thread it stalls only that
//! request, but handing each request to a blocking thread and back costs a thread wake-up
//! each way (measured on a busy 2-core machine: about 0.15 ms of a 1.6 ms gather of 1,024 ×
//! 1 KiB). So the server runs small gathers inline while the last few gathers all found
//! their pages in memory, and on blocking threads otherwise: a gather that faults sends the
//! next ones back to the threads until a run of them is fault-free again. Cold data thus
//! never blocks an async worker more than once in a run; hot data never pays the hand-off.
//! A gather the store serves by explicit reads (data not in memory, see `explicit`) takes no
//! fault but waits for the disk all the same: it counts as cold too.

use std::sync::atomic::{AtomicU32, Ordering};

/// Consecutive fault-free gathers after which gathers run inline.
pub(crate) const WARM_STREAK: u32 = 8;

/// The record of recent gathers: how many in a row took no major fault.
#[derive(Debug, Default)]
pub(crate) struct Warmth {
    streak: AtomicU32,
}

impl Warmth {
    /// Whether the last [`WARM_STREAK`] gathers found all their pages in memory.
    pub(crate) fn is_warm(&self) -> bool {
        self.streak.load(Ordering::Relaxed) >= WARM_STREAK
    }

    /// Runs `gather` on this thread and records whether it took a major fault. Where faults
    /// cannot be counted, every gather counts as cold.
    #[cfg(test)]
    pub(crate) fn observe<T>(&self, gather: impl FnOnce() -> T) -> T {
        self.observe_reads(|| 0, gather)
    }

    /// [`Warmth::observe`], where `reads` counts the disk reads the store made by itself
    /// (explicit reads of data not in memory, which take no page fault): a gather during
    /// which it moved waited for the disk too.
    pub(crate) fn observe_reads<T>(
        &self,
        reads: impl Fn() -> u64,
        gather: impl FnOnce() -> T,
    ) -> T {
        let before = (major_faults(), reads());
        let out = gather();
        let faulted = match (before.0, major_faults()) {
            (Some(before), Some(after)) => after != before,
            _ => true,
        };
        self.record(faulted || reads() != before.1);
        out
    }

    fn record(&self, faulted: bool) {
        if faulted {
            if self.streak.swap(0, Ordering::Relaxed) >= WARM_STREAK {
                tracing::debug!("a gather waited for the disk: gathers run on blocking threads");
            }
        } else {
            // Counted up to WARM_STREAK only: past it, every fault-free gather is alike.
            let before = self
                .streak
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                    (s < WARM_STREAK).then_some(s + 1)
                });
            if before == Ok(WARM_STREAK - 1) {
                tracing::debug!("{WARM_STREAK} gathers in a row found their pages in memory: gathers run inline");
            }
        }
    }
}

/// Major page faults this thread has taken so far (Linux); `None` where they cannot be read.
fn major_faults() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `usage` is a valid, writable `rusage`; RUSAGE_THREAD asks only about the
        // calling thread, and getrusage writes nothing else.
        let status = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
        if status != 0 {
            return None;
        }
        // SAFETY: getrusage returned 0, so it filled `usage` (and it was zeroed before).
        let usage = unsafe { usage.assume_init() };
        u64::try_from(usage.ru_majflt).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn gathers_turn_inline_after_a_fault_free_run_and_back_at_a_fault() {
        let warmth = Warmth::default();
        assert!(!warmth.is_warm(), "a new node starts cold");
        for _ in 0..WARM_STREAK - 1 {
            warmth.record(false);
        }
        assert!(!warmth.is_warm());
        warmth.record(false);
        assert!(warmth.is_warm());
        warmth.record(true);
        assert!(
            !warmth.is_warm(),
            "one fault is enough to go back to the threads"
        );
        for _ in 0..WARM_STREAK {
            warmth.record(false);
        }
        assert!(warmth.is_warm());
    }

    #[test]
    fn a_long_warm_run_stays_warm() {
        let warmth = Warmth {
            streak: AtomicU32::new(u32::MAX - 1),
        };
        warmth.record(false);
        warmth.record(false);
        assert!(warmth.is_warm());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_page_read_from_the_disk_counts_as_a_major_fault() {
        use std::io::Write;

        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("pages");
        let bytes = 1usize << 20;
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(&vec![1u8; bytes]).expect("write");
        file.sync_all().expect("sync");
        drop(file);
        if !zr_node::page_cache::evict(&path).expect("evict") {
            eprintln!("skipped: the page cache keeps {} in memory", path.display());
            return;
        }
        let file = std::fs::File::open(&path).expect("open");
        // SAFETY: the file is ours, in a private directory, and nothing writes to it.
        let map = unsafe { memmap2::Mmap::map(&file) }.expect("map");
        let warmth = Warmth::default();
        for _ in 0..WARM_STREAK {
            warmth.record(false);
        }
        let sum = warmth.observe(|| map.iter().step_by(4096).map(|&b| b as u64).sum::<u64>());
        assert_eq!(sum, (bytes / 4096) as u64);
        assert!(
            !warmth.is_warm(),
            "reading pages from the disk counts as cold"
        );
        for _ in 0..WARM_STREAK {
            warmth.observe(|| map.iter().step_by(4096).map(|&b| b as u64).sum::<u64>());
        }
        assert!(
            warmth.is_warm(),
            "the same pages, now in memory, count as warm"
        );
    }
}
