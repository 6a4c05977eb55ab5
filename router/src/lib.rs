//! zr-router: the cluster's router. The client library it serves is `zr-client`, re-exported
//! here.
//!
//! - [`server`] — the router: placement snapshot, scatter/gather over QUIC, writes.
//! - `restore` — a lost cluster record rebuilt from the nodes (`zr cluster restore-record`).
//! - Its decisions without I/O are `zr_coord`'s; its links to the nodes and streamed gathers
//!   are `zr_client`'s (`nodes`, `forward`, `budget`), which one-hop clients use too.

mod restore;
pub mod server;

use zr_client::{budget, error, forward, nodes};
use zr_coord::{catchup, moveplan, repair, startup};

pub use restore::{restore_record, Restored};
pub use server::Router;
pub use zr_client::{
    plan, stream, AsyncClient, Client, ClientOptions, ClusterPacked, ClusterStream, ClusterWindows,
    DatasetInfo, DictRef, Error, Failure, FieldDict, FieldInfo, Grant, MapChange, MoveReport,
    MOVE_RATE_DEFAULT,
};
