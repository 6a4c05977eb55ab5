//! zr-common: what every zrecord process shares — samplers and the loader, the columnar batch
//! shape, keyed hashing, placement, the wire protocol, the cluster configuration, the QUIC
//! transport and the cluster's TLS identities.

pub mod alloc;
pub mod assemble;
pub mod chunks;
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
pub mod tls;
pub mod wire;

pub use columns::Contiguous;
pub use error::{BoxError, Error};
pub use loader::{GatherSource, LoadedBatch, Loader, LoaderOptions};
pub use record::Record;
pub use sampler::{Order, Sampler, SamplerConfig, SamplerState, Tail};
