//! Allocator settings for the zrecord processes.
//!
//! Gathers move batches of megabytes through short-lived buffers (reply bodies, received
//! messages, reassembled columns). glibc serves allocations from 128 KiB up with fresh
//! `mmap`s and trims freed heap tops eagerly, so every batch paid page faults and page
//! clearing for memory it had just returned. Measured on the 4-shard loopback cluster
//! (`cluster_bench`): router gathers of 1 KiB records 0.19 -> 0.30-0.34 GiB/s, of 16 KiB
//! records 0.21 -> 0.32-0.37 GiB/s. The cost is that up to [`TRIM_BYTES`] of freed memory
//! stays with the process — and freed memory in glibc's per-thread arenas is not returned
//! at all on its own. So the servers also trim once a burst is over
//! ([`trim_when_idle`]): memory goes back to the system seconds after the clients leave.

/// Allocations up to this size come from the heap, not from their own `mmap`.
pub const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;
/// Free memory at the top of a heap is returned to the system only beyond this.
pub const TRIM_BYTES: i32 = 128 << 20;

/// Applies the settings above (glibc only; elsewhere a no-op). Call once, early in `main`.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time
    // (glibc serializes it with allocation), and both values are within glibc's ranges.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_BYTES);
    }
}

/// How often [`trim_when_idle`] looks at the process's activity.
pub const TRIM_CHECK: std::time::Duration = std::time::Duration::from_secs(1);
/// Quiet checks after a burst's trim before the second one.
pub const TRIM_AGAIN_AFTER: u32 = 3;

/// Returns freed memory to the system once activity stops: on a thread of its own, every
/// [`TRIM_CHECK`] it asks `activity` for (requests begun so far, requests still open); after
/// a check that saw requests begin, the first check that sees none begun and none open
/// trims every arena (`malloc_trim`), and [`TRIM_AGAIN_AFTER`] quiet checks later once more:
/// what a burst frees after its last request ends (a closed connection's buffers, freed
/// once it has drained) goes back too. A process that stays busy is never trimmed (the
/// settings of [`tune`] keep its buffers), an idle one twice per burst. glibc only;
/// elsewhere a no-op.
pub fn trim_when_idle(activity: impl Fn() -> (u64, usize) + Send + 'static) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let spawned = std::thread::Builder::new()
            .name("zr-trim".into())
            .spawn(move || {
                let mut last = activity().0;
                let mut trims = Trims::default();
                loop {
                    std::thread::sleep(TRIM_CHECK);
                    let (begun, open) = activity();
                    let quiet = begun == last && open == 0;
                    last = begun;
                    if trims.check(quiet) {
                        // SAFETY: malloc_trim only returns free pages to the system; it is
                        // safe to call at any time (glibc locks each arena as it goes).
                        unsafe {
                            libc::malloc_trim(0);
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("zrecord: cannot start the allocator's idle trim: {e}");
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = activity;
}

/// When [`trim_when_idle`] trims: at the first quiet check after activity, and again
/// [`TRIM_AGAIN_AFTER`] quiet checks later.
#[derive(Debug, Default)]
struct Trims {
    /// Activity seen since the last trim.
    dirty: bool,
    /// Quiet checks left before the second trim (0: none due).
    again: u32,
}

impl Trims {
    /// A check that found the process `quiet` (no request begun since the last check, none
    /// open): whether to trim now.
    fn check(&mut self, quiet: bool) -> bool {
        if !quiet {
            self.dirty = true;
            self.again = 0;
            return false;
        }
        if self.dirty {
            self.dirty = false;
            self.again = TRIM_AGAIN_AFTER;
            return true;
        }
        if self.again > 0 {
            self.again -= 1;
            return self.again == 0;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_trimmed_when_it_ends_and_once_more_later() {
        let mut trims = Trims::default();
        let checks = |trims: &mut Trims, quiet: &[bool]| -> Vec<bool> {
            quiet.iter().map(|&q| trims.check(q)).collect()
        };
        // Quiet from the start: nothing to give back.
        assert_eq!(checks(&mut trims, &[true, true]), [false, false]);
        // A burst, then quiet: a trim at once, another three quiet checks later, no more.
        let after = checks(
            &mut trims,
            &[false, false, true, true, true, true, true, true],
        );
        assert_eq!(
            after,
            [false, false, true, false, false, true, false, false]
        );
        // Activity before the second trim starts over.
        let again = checks(
            &mut trims,
            &[false, true, true, false, true, true, true, true],
        );
        assert_eq!(again, [false, true, false, false, true, false, false, true]);
    }
}
