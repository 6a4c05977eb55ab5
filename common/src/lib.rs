//! zr-common: what a training job needs from zrecord whatever it reads from — the samplers
//! (index orders as pure functions of seed, epoch and position) and mixtures of datasets
//! read as one stream of global batches, the Feistel permutation
//! behind shuffles, the prefetching loader over any [`GatherSource`], and the shapes every
//! part of zrecord shares ([`Record`], [`Contiguous`]). It depends on no async runtime and
//! no network stack.

pub mod alloc;
pub mod blocklist;
pub mod budget;
pub mod columns;
pub mod error;
pub mod feistel;
pub mod hash;
pub mod loader;
pub mod mixture;
pub mod packing;
pub mod provenance;
pub mod record;
pub mod sampler;
pub mod schedule;
pub mod token_mix;
pub mod windows;

pub use blocklist::Blocklist;
pub use budget::{BudgetConfig, BudgetState, TokenBudget};
pub use columns::Contiguous;
pub use error::{BoxError, Error};
pub use loader::{
    BudgetLoader, GatherSource, LoadedBatch, LoadedStep, Loader, LoaderOptions, MixtureLoader,
    RampLoader,
};
pub use mixture::{Mixture, MixtureConfig, MixtureState, Stage};
pub use packing::{PackConfig, PackPlan, PackStats, PackedColumns, Packer, Piece};
pub use record::Record;
pub use sampler::{Order, Sampler, SamplerConfig, SamplerState, Tail};
pub use schedule::{BatchSchedule, RampSampler, RampState};
pub use windows::{WindowColumns, WindowMode};

/// Run `k` of `items` cut at `ends` (run k is `items[ends[k - 1]..ends[k]]`, run 0 from the
/// start); `None` past the last run, or where `ends` overruns `items`.
pub fn run_of<'a, T>(items: &'a [T], ends: &[u64], k: u64) -> Option<&'a [T]> {
    let k = usize::try_from(k).ok()?;
    let end = usize::try_from(*ends.get(k)?).ok()?;
    let start = match k.checked_sub(1) {
        None => 0,
        Some(before) => usize::try_from(ends[before]).ok()?,
    };
    items.get(start..end)
}

/// `bytes` in the binary unit that reads best: "512 B", "1.50 GiB".
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_are_cut_at_their_ends() {
        let items = [1, 2, 3, 4, 5];
        let ends = [2, 2, 5];
        assert_eq!(super::run_of(&items, &ends, 0), Some(&[1, 2][..]));
        assert_eq!(super::run_of(&items, &ends, 1), Some(&[][..]));
        assert_eq!(super::run_of(&items, &ends, 2), Some(&[3, 4, 5][..]));
        assert_eq!(super::run_of(&items, &ends, 3), None);
        assert_eq!(super::run_of(&items, &[7], 0), None);
    }

    #[test]
    fn human_bytes_picks_the_unit() {
        assert_eq!(super::human_bytes(0), "0 B");
        assert_eq!(super::human_bytes(1023), "1023 B");
        assert_eq!(super::human_bytes(1536), "1.50 KiB");
        assert_eq!(super::human_bytes(3 << 40), "3.00 TiB");
        assert_eq!(super::human_bytes(u64::MAX), "16.00 EiB");
    }
}
