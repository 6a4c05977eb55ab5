//! zr-node: the single-host zrecord engine.
//!
//! A dataset is a directory holding N records, each with the same named fields:
//!
//! ```text
//! dataset/
//! ├── meta.json      format version, N, chunk parameters, chunks, fields — the commit point
//! ├── <field>.offset one 16-byte entry per record: offset u64, chunk_id u32, len u32
//! └── chunk/<id>.zr  append-only frames (header + payload), shared by all fields
//! ```
//!
//! A dataset may keep its records in several independent index spaces, *units* (see
//! [`unit`](mod@unit)): how a cluster node keeps each slot it holds, so that slots come and
//! go as files. A dataset on one host has one, unit 0, whose addresses are the plain
//! indices.
//!
//! [`Store`] appends, modifies (append + repoint) and deletes (swap-remove) records, commits
//! them durably, and gathers any list of indices: raw fields as zero-copy slices of the mapped
//! chunks, flate fields decompressed into the [`Batch`]. Guarantees:
//! - After a crash, a reopen yields exactly the last committed state.
//! - A gather never sees a torn entry, whatever writes run at the same time.
//! - A [`Batch`] keeps what it points at alive; it is valid as long as it is held.
//! - Bad indices, unknown fields and damaged files are errors naming what is wrong.
#![deny(unsafe_op_in_unsafe_fn)]

mod batch;
mod codec;
pub mod convert;
pub mod dict;
pub mod disk;
mod error;
mod explicit;
pub mod frame;
mod gather;
mod io;
mod lock;
mod map;
pub mod meta;
pub mod offset;
pub mod page_cache;
pub mod prefetch;
pub mod rebalance;
pub mod redo;
mod runtime;
pub mod ship;
mod source;
mod store;
pub mod stream;
pub mod unit;
mod verify;
mod view;
mod write;
mod writer;

pub use batch::{Batch, FieldView};
pub use error::{Error, IoContext, Result, SchemaError};
pub use io::IoBackend;
pub use meta::{Compression, FieldSpec, Meta, UnitMeta};
pub use prefetch::Prefetched;
pub use runtime::{RuntimeOptions, CLEANERS_MAX, READERS_MAX, WRITERS_MAX};
pub use store::{
    chunk_path, CreateOptions, GatherOptions, ReadPath, ReadStats, Store, StoreMark,
    UnknownReadPath, CHUNK_DIR, LOCK_FILE, WRITER_LOCK_FILE,
};
pub use verify::{Problem, Utilization, VerifyReport};
pub use zr_common::Contiguous;
pub use zr_common::Record;
