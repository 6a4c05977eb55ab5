//! Allocator settings for the zrecord processes.
//!
//! Gathers move batches of megabytes through short-lived buffers (reply bodies, received
//! messages, reassembled columns). glibc serves allocations from 128 KiB up with fresh
//! `mmap`s and trims freed heap tops eagerly, so every batch paid page faults and page
//! clearing for memory it had just returned. Measured on the 4-shard loopback cluster
//! (`cluster_bench`): router gathers of 1 KiB records 0.19 -> 0.30-0.34 GiB/s, of 16 KiB
//! records 0.21 -> 0.32-0.37 GiB/s. The cost is that up to [`TRIM_BYTES`] of freed memory
//! stays with the process.

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
