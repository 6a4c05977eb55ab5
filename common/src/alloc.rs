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

/// Returns freed memory to the system once activity stops: on a thread of its own, every
/// [`TRIM_CHECK`] it asks `activity` for (requests begun so far, requests still open); after
/// a check that saw requests begin, the first check that sees none begun and none open
/// trims every arena (`malloc_trim`). A process that stays busy is never trimmed (the
/// settings of [`tune`] keep its buffers), an idle one only once per burst. glibc only;
/// elsewhere a no-op.
pub fn trim_when_idle(activity: impl Fn() -> (u64, usize) + Send + 'static) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let spawned = std::thread::Builder::new()
            .name("zr-trim".into())
            .spawn(move || {
                let mut last = activity().0;
                let mut dirty = false;
                loop {
                    std::thread::sleep(TRIM_CHECK);
                    let (begun, open) = activity();
                    if begun != last {
                        last = begun;
                        dirty = true;
                    } else if dirty && open == 0 {
                        dirty = false;
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
