//! zr-common: what every zrecord process shares — samplers and the loader, the columnar batch
//! shape, and keyed hashing (placement and the wire protocol will join them).

pub mod columns;
pub mod error;
pub mod feistel;
pub mod hash;
pub mod loader;
pub mod sampler;

pub use columns::Contiguous;
pub use error::{BoxError, Error};
pub use loader::{GatherSource, LoadedBatch, Loader, LoaderOptions};
pub use sampler::{Order, Sampler, SamplerConfig, SamplerState, Tail};
