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
