//! The writer fence under power cuts (the node's fence file lives beside its datasets; see
//! `zr_node::disk::PowerCut` for what a cut undoes).

use zr_common::hash::mix2;
use zr_node::disk::{Disk, PowerCut};
use zr_shard::fence::Fence;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// The writer fence under power cuts: cut at every change of a run of rises, losing any
/// subset of what was not synced, a rise that returned is never undone — a late write of an
/// older lease holder stays refused after the node comes back — and the fence file reads.
#[test]
fn a_power_cut_never_lowers_the_writer_fence() {
    let first = env_u64("ZR_POWER_SEED").unwrap_or(0x90_7e4);
    // Each rise makes 5 changes (create, write, sync'd data, rename, directory sync).
    let mut cut_before = [0u64; 2];
    for k in 0..240u64 {
        let seed = mix2(first, k);
        let tmp = scratch();
        let dir = tmp.path().join("node");
        std::fs::create_dir(&dir).unwrap();
        let power = PowerCut::record(tmp.path());
        power.fail_after(k % 30);
        let fence = Fence::open(&power.disk(), &dir).unwrap();
        let mut raised = 0;
        for token in 1..=6u64 {
            match fence.raise(token * 10, || ()) {
                Ok(()) => raised = token * 10,
                Err(_) => break,
            }
        }
        drop(fence);
        cut_before[usize::from(raised == 60)] += 1;
        power
            .cut(|change| mix2(seed, change as u64).is_multiple_of(2))
            .unwrap();
        let fence = Fence::open(&Disk::real(), &dir).unwrap();
        if raised > 0 {
            assert!(
                fence.admit(raised - 1, || ()).is_err(),
                "seed {seed}: the fence went back below {raised} after a power cut"
            );
        }
        assert!(fence.admit(60, || ()).is_ok());
    }
    // Cuts landed both amid the rises and after all of them.
    assert!(cut_before[0] > 0 && cut_before[1] > 0, "{cut_before:?}");
}
