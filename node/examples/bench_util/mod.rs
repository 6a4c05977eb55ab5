//! Helpers shared by the benchmark examples.
#![allow(dead_code)] // each example uses a subset

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zr_node::{CreateOptions, FieldSpec, Record, Store};

/// What a benchmark's steps return.
pub type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Rounds a timed comparison alternates over (the median is printed).
pub const ROUNDS: usize = 5;

/// SplitMix64: fast, reproducible pseudo-random data for benchmarks.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// Creates a dataset of `n` random records of `size` bytes in one raw field "data", calling
/// `also` with every run of records' bytes (to build a baseline from the same bytes).
pub fn build_dataset(dir: &Path, n: u64, size: usize, also: impl FnMut(&[u8])) -> BoxResult<Store> {
    build_field(dir, n, size, FieldSpec::raw("data"), Rng::fill, also)
}

/// [`build_dataset`] with the field `spec` (named "data") and the records' bytes made by
/// `fill`.
pub fn build_field(
    dir: &Path,
    n: u64,
    size: usize,
    spec: FieldSpec,
    mut fill: impl FnMut(&mut Rng, &mut [u8]),
    mut also: impl FnMut(&[u8]),
) -> BoxResult<Store> {
    let store = Store::create(dir, vec![spec], CreateOptions::default())?;
    let started = Instant::now();
    let mut rng = Rng(size as u64);
    let per_call = 1024usize;
    let mut buf = vec![0u8; per_call * size];
    let mut written = 0u64;
    while written < n {
        let count = per_call.min((n - written) as usize);
        let bytes = &mut buf[..count * size];
        fill(&mut rng, bytes);
        also(bytes);
        let records: Vec<Record> = bytes
            .chunks(size)
            .map(|r| Record::new().with("data", r))
            .collect();
        store.append_many(&records)?;
        written += count as u64;
    }
    store.commit()?;
    eprintln!(
        "built {n} records of {size} B ({:.2} GiB) in {:.1} s",
        (n * size as u64) as f64 / (1u64 << 30) as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(store)
}

/// Gathers every record of field "data" once, through the mappings (every page read, the
/// mappings warm), into the buffers returned, which a benchmark may reuse.
pub fn warm(store: &Store) -> BoxResult<(Vec<u8>, Vec<u64>)> {
    let all: Vec<u64> = (0..store.len()).collect();
    let (mut data, mut offsets) = (Vec::new(), Vec::new());
    for part in all.chunks(4096) {
        gather_data(store, part, &mut data, &mut offsets)?;
    }
    Ok((data, offsets))
}

/// One materialized gather: records `indices` of field "data" copied into `data`, their
/// ends into `offsets`.
pub fn gather_data(
    store: &Store,
    indices: &[u64],
    data: &mut Vec<u8>,
    offsets: &mut Vec<u64>,
) -> BoxResult<()> {
    store
        .gather(indices, &["data"])?
        .field("data")
        .ok_or("no field")?
        .write_contiguous(data, offsets);
    std::hint::black_box(&data);
    Ok(())
}

/// Runs `step` (one batch) repeatedly for about `seconds`; returns batches per second.
pub fn time_batches(seconds: f64, mut step: impl FnMut(usize)) -> f64 {
    let budget = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut batches = 0usize;
    while start.elapsed() < budget {
        for _ in 0..16 {
            step(batches);
            batches += 1;
        }
    }
    batches as f64 / start.elapsed().as_secs_f64()
}

/// Median of a few measurements.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Reads `(fd, offset, len)` each with one io_uring read, `depth` in flight, into one
/// buffer: the device's limit, as the raw baseline of the cold benchmarks.
pub fn uring_read(
    reads: &[(std::os::fd::RawFd, u64, usize)],
    depth: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    use io_uring::{opcode, types, IoUring};
    thread_local! {
        static RING: std::cell::RefCell<Option<IoUring>> = const { std::cell::RefCell::new(None) };
    }
    let total: usize = reads.iter().map(|r| r.2).sum();
    let mut buffer = vec![0u8; total];
    RING.with(|cell| -> Result<(), Box<dyn std::error::Error>> {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(depth)?);
        }
        let ring = slot.as_mut().ok_or("no ring")?;
        let mut pieces = Vec::with_capacity(reads.len());
        let mut rest = &mut buffer[..];
        for read in reads {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(read.2);
            pieces.push(piece);
            rest = tail;
        }
        let (mut next, mut in_flight) = (0usize, 0usize);
        while next < reads.len() || in_flight > 0 {
            while next < reads.len() && in_flight < depth as usize {
                let (fd, offset, _) = reads[next];
                let piece = &mut pieces[next];
                let entry =
                    opcode::Read::new(types::Fd(fd), piece.as_mut_ptr(), piece.len() as u32)
                        .offset(offset)
                        .build()
                        .user_data(next as u64);
                // SAFETY: `pieces` (and the buffer they cut) outlive every read submitted
                // here: this loop waits for all of them before returning.
                if unsafe { ring.submission().push(&entry) }.is_err() {
                    break;
                }
                next += 1;
                in_flight += 1;
            }
            ring.submit_and_wait(1)?;
            let done: Vec<i32> = ring.completion().map(|c| c.result()).collect();
            in_flight -= done.len();
            if let Some(e) = done.iter().find(|&&r| r < 0) {
                // Wait out the rest before the buffers go.
                while in_flight > 0 {
                    ring.submit_and_wait(1)?;
                    in_flight -= ring.completion().count();
                }
                return Err(std::io::Error::from_raw_os_error(-e).into());
            }
        }
        Ok(())
    })?;
    std::hint::black_box(&buffer);
    Ok(())
}

/// Drops the pages of `paths` from the page cache, so that the next method starts cold.
pub fn evict(paths: &[std::path::PathBuf]) -> Result<(), Box<dyn std::error::Error>> {
    for path in paths {
        zr_node::page_cache::evict(path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// A memory cgroup holding this process for as long as it lives.
pub struct Cgroup {
    dir: PathBuf,
    /// Where this process goes back to.
    parent_procs: PathBuf,
    pub kind: &'static str,
}

impl Cgroup {
    /// Makes a cgroup limited to `limit` bytes (page cache included) and moves this process
    /// into it.
    pub fn create(limit: u64) -> Result<Cgroup, Box<dyn std::error::Error>> {
        let name = format!("zr-bench-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (root, limit_file, kind) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.to_path_buf(), "memory.limit_in_bytes", "cgroup v1")
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (PathBuf::from("/sys/fs/cgroup"), "memory.max", "cgroup v2")
        } else {
            return Err("no memory cgroup controller found under /sys/fs/cgroup".into());
        };
        let dir = root.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cgroup = Cgroup {
            parent_procs: root.join("cgroup.procs"),
            dir,
            kind,
        };
        std::fs::write(cgroup.dir.join(limit_file), limit.to_string())
            .map_err(|e| format!("cannot limit {}: {e}", cgroup.dir.display()))?;
        std::fs::write(
            cgroup.dir.join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .map_err(|e| format!("cannot move into {}: {e}", cgroup.dir.display()))?;
        Ok(cgroup)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.parent_procs, std::process::id().to_string());
        // A cgroup empties a moment after its last process leaves.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "could not remove {}; remove it by hand (rmdir)",
            self.dir.display()
        );
    }
}
