//! zr-common: what every zrecord process shares — samplers and the loader, the columnar batch
//! shape, and keyed hashing (placement and the wire protocol will join them).

pub mod columns;
pub mod config;
pub mod error;
pub mod feistel;
pub mod hash;
pub mod loader;
pub mod net;
pub mod placement;
pub mod record;
pub mod sampler;
pub mod wire;

pub use columns::Contiguous;
pub use error::{BoxError, Error};
pub use loader::{GatherSource, LoadedBatch, Loader, LoaderOptions};
pub use record::Record;
pub use sampler::{Order, Sampler, SamplerConfig, SamplerState, Tail};
