//! The wire protocol between clients, routers and nodes: one request and one reply per QUIC
//! bidirectional stream.
//!
//! ```text
//! message = "ZRW1" | version u16 | kind u16 | header_len u32 | header (bincode) | body
//! ```
//! The body carries payloads columnar: for each field, that field's payloads back to back
//! (F pieces after one header holding every length), never one message per record. Every
//! decode is bounded — header size, counts and lengths checked against limits and against the
//! body before anything is allocated from them — so a hostile or corrupt message is an error,
//! not a panic or an allocation bomb.

use bincode::Options;
use serde::{Deserialize, Serialize};

use crate::chunks::Chunks;
pub use crate::error::ErrorCode;
use crate::error::{Error, Invalid};
use crate::placement::Run;

/// Protocol version spoken by this build.
pub const WIRE_VERSION: u16 = 17;

/// Most records one `Digest` request covers.
pub const DIGEST_RECORDS_MAX: u64 = 1 << 20;
const MAGIC: [u8; 4] = *b"ZRW1";
const PREFIX_BYTES: usize = 12;
/// Longest header accepted.
pub const HEADER_BYTES_MAX: usize = 64 << 20;
/// Longest message accepted (header and body).
pub const MESSAGE_BYTES_MAX: usize = 1 << 30;
/// Most records one gather or append may carry.
pub const RECORDS_MAX: usize = 1 << 20;
/// Most fields one message may name.
pub const FIELDS_MAX: usize = 256;
/// Most nodes a request may name.
pub const NODES_MAX: usize = 1 << 16;
/// Longest cluster id a node request may carry.
pub const CLUSTER_ID_BYTES_MAX: usize = 128;
/// Longest dataset name (see [`check_dataset_name`]).
pub const DATASET_NAME_BYTES_MAX: usize = 64;
/// Largest zstd dictionary a cluster's dataset may have (zstd trains 110 KiB by default):
/// it is kept in the metadata store, whose requests etcd bounds to 1.5 MiB by default, and
/// a value crosses etcd's gateway base64-encoded twice.
pub const DICT_BYTES_MAX: usize = 512 << 10;
/// Largest piece of a file one `ShipRead` asks for.
pub const SHIP_PIECE_MAX: usize = 16 << 20;
/// Bytes a second each node gaining slots in a move copies their files at, unless the
/// operator says otherwise (`zr cluster add-shard --max-rate`): a move is not urgent, and
/// the cluster's readers keep most of the machines meanwhile (a rebuild of a lost replica
/// is not paced). Measured with every process on two shared cores (`move_bench`), gathers
/// kept 0.86× their rate at 64 MiB/s, 0.73-0.79× at 96 and 0.64-0.72× at 128.
pub const MOVE_RATE_DEFAULT: u64 = 64 << 20;
/// Longest node address a request names.
pub const ADDR_BYTES_MAX: usize = 256;
/// The dataset a request that names none addresses: the one `zr cluster-init` made.
pub const DEFAULT_DATASET: &str = "default";
/// Longest a wait for records not committed yet may be (`WaitLen`'s `wait_ms`).
pub const WAIT_MS_MAX: u32 = 3_600_000;

/// Checks a dataset name: `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn check_dataset_name(name: &str) -> Result<(), Invalid> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c));
    if !first_ok || !rest_ok || name.len() > DATASET_NAME_BYTES_MAX {
        return Err(Invalid::DatasetName(name.escape_debug().to_string()));
    }
    Ok(())
}

/// A client request as it crosses the wire: the dataset it addresses (`None`: the default
/// one) and the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientMessage {
    pub dataset: Option<String>,
    pub request: ClientRequest,
}

impl ClientMessage {
    /// `request` for dataset `dataset` (`None`: the default one).
    pub fn new(dataset: Option<&str>, request: ClientRequest) -> ClientMessage {
        ClientMessage {
            dataset: dataset.map(str::to_string),
            request,
        }
    }

    /// The dataset's name, the default one's if the message names none.
    pub fn dataset(&self) -> &str {
        self.dataset.as_deref().unwrap_or(DEFAULT_DATASET)
    }
}

const KIND_CLIENT_REQUEST: u16 = 1;
const KIND_REPLY: u16 = 2;
const KIND_NODE_REQUEST: u16 = 3;

/// What a client asks of a router. The client protocol has no internal requests: a client
/// cannot even encode one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientRequest {
    /// Length and schema.
    Info,
    /// Records `indices` of `fields` (empty = all). Reply: `GatherParts`. `checked`: every
    /// record is read against its CRC; a copy that fails is read from another replica instead
    /// (and repaired), or, with none left, the gather fails naming it.
    /// An index not committed yet fails it as out of range: a client that would wait for
    /// records waits with `WaitLen` first, which holds nothing of the router's while it
    /// waits.
    Gather {
        indices: Vec<u64>,
        fields: Vec<String>,
        checked: bool,
    },
    /// Append records; body: per field of `fields`, the payloads (`lengths[f][k]` bytes each).
    /// Reply: `Appended`, the global indices the records got.
    Append {
        fields: Vec<String>,
        lengths: Vec<Vec<u32>>,
    },
    /// Replace the fields `fields` of record `index`; body: per field, its payload (empty:
    /// the field becomes absent). Its other fields keep their values.
    Modify {
        index: u64,
        fields: Vec<String>,
        lengths: Vec<u32>,
    },
    /// Write field `field` of records `start..start + lengths.len()`; body: their payloads
    /// back to back. Their other fields keep their values.
    WriteField {
        field: String,
        start: u64,
        lengths: Vec<u32>,
    },
    /// Wait until the dataset's committed length reaches `len`, `wait_ms` at most. Reply:
    /// `Info` (its length then).
    WaitLen { len: u64, wait_ms: u32 },
    /// The cluster's datasets. Reply: `Datasets`.
    Datasets,
    /// Create the message's dataset with `fields`, zstd fields among them compressed with
    /// the dictionaries `dicts` (a field's `dict` is then that dictionary's id). Reply: `Done`.
    CreateDataset {
        fields: Vec<FieldInfo>,
        dicts: Vec<FieldDict>,
    },
    /// Drop the message's dataset and every record in it. Reply: `Done`.
    DropDataset,
    /// Add `field` to the dataset; the records stored lack it until written. Reply: `Done`.
    AddField { field: FieldInfo },
    /// Swap-remove record `index` (the last record takes its place).
    Delete { index: u64 },
    /// Make every write so far durable on every shard.
    Commit,
    /// The cluster as the router sees it now. Reply: `Status`.
    Status,
    /// Check records `start..start + count` (shard-local) of shard `shard` on each of its
    /// in-sync replicas — every record read against its CRC, and the replicas' copies
    /// compared — and repair what fails or differs from a good copy. Reply: `Scrubbed`.
    Scrub { shard: u32, start: u64, count: u64 },
    /// Serve shard `shard`'s replica `replica` from the node at `addr` from now on (a
    /// replacement machine, empty): it is rebuilt from an in-sync partner, then serves.
    /// Reply: `Status`, taken once the move is recorded (the rebuild goes on).
    ReplaceNode {
        shard: u32,
        replica: u32,
        addr: String,
    },
    /// Change the cluster map (add a shard, or drain one) and move the records whose shard
    /// changes, online; or finish the move under way, if it is this one. The router starts
    /// it and replies at once: `Moving`, its progress (see `MoveProgress`).
    MoveShards {
        change: MapChange,
        /// Nodes as the operator's nodes.toml lists them — (shard, replica, address) — where
        /// the router finds a new shard's nodes that its own nodes.toml predates.
        nodes: Vec<(u32, u32, String)>,
        /// Most bytes a second each node gaining slots copies their files at (0: as fast
        /// as it can; `None`: the router's default, [`MOVE_RATE_DEFAULT`]).
        rate: Option<u64>,
    },
    /// How far the move under way is. Reply: `Moving`.
    MoveProgress,
    /// What a client needs to read from the nodes itself (one hop): the cluster id, the
    /// map, every node's address and whether it is in sync, and the length — read afresh
    /// from the nodes if `covering` is past the router's (as for a gather of that index).
    /// Reply: `Topology`.
    Topology { covering: u64 },
}

/// A change of the cluster map, as a client asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MapChange {
    /// A shard more: the first shard nodes.toml lists beyond the map.
    AddShard,
    /// Shard K's records go to the others.
    DrainShard(u32),
}

/// What a move of records between shards did, or has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveReport {
    /// The map version moved to.
    pub version: u64,
    /// Records that changed shard (copied from one shard's nodes to another's), of the
    /// cluster's `records`.
    pub moved: u64,
    pub records: u64,
    /// Records written into the slots nodes gain with the next map, in all, and of how
    /// many.
    pub staged: u64,
    pub staged_total: u64,
    /// Whether the cluster serves the new map.
    pub done: bool,
    /// Why the move stopped, if it failed (running the command again goes on with it).
    pub error: Option<String>,
    /// The map had this change already: nothing was moved.
    pub already: bool,
    /// The change this move makes (`None`: no move was started on this router).
    pub change: Option<MapChange>,
}

/// What a client request needs of its sender's role, least first: readers read, writers
/// also write, operators may do everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Gather, info, status.
    Read,
    /// Read, and append, modify, delete, commit.
    Write,
    /// Everything: moves, node replacement, scrub and repair.
    Operate,
}

impl Access {
    /// The least role with this access: `reader`, `writer`, `operator`.
    pub fn role_name(self) -> &'static str {
        match self {
            Access::Read => "reader",
            Access::Write => "writer",
            Access::Operate => "operator",
        }
    }
}

impl ClientRequest {
    /// What the request needs of its sender's role.
    pub fn access(&self) -> Access {
        match self {
            ClientRequest::Info
            | ClientRequest::Gather { .. }
            | ClientRequest::WaitLen { .. }
            | ClientRequest::Datasets
            | ClientRequest::Status
            | ClientRequest::MoveProgress
            | ClientRequest::Topology { .. } => Access::Read,
            ClientRequest::Append { .. }
            | ClientRequest::Modify { .. }
            | ClientRequest::WriteField { .. }
            | ClientRequest::Delete { .. }
            | ClientRequest::Commit => Access::Write,
            ClientRequest::CreateDataset { .. }
            | ClientRequest::DropDataset
            | ClientRequest::AddField { .. }
            | ClientRequest::Scrub { .. }
            | ClientRequest::ReplaceNode { .. }
            | ClientRequest::MoveShards { .. } => Access::Operate,
        }
    }

    /// The request's kind, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientRequest::Info => "info",
            ClientRequest::Gather { .. } => "gather",
            ClientRequest::Append { .. } => "append",
            ClientRequest::Modify { .. } => "modify",
            ClientRequest::WriteField { .. } => "write-field",
            ClientRequest::WaitLen { .. } => "wait-len",
            ClientRequest::Datasets => "datasets",
            ClientRequest::CreateDataset { .. } => "create-dataset",
            ClientRequest::DropDataset => "drop-dataset",
            ClientRequest::AddField { .. } => "add-field",
            ClientRequest::Delete { .. } => "delete",
            ClientRequest::Commit => "commit",
            ClientRequest::Status => "status",
            ClientRequest::Scrub { .. } => "scrub",
            ClientRequest::ReplaceNode { .. } => "replace-node",
            ClientRequest::MoveShards { .. } => "move-shards",
            ClientRequest::MoveProgress => "move-progress",
            ClientRequest::Topology { .. } => "topology",
        }
    }
}

/// What a router asks of a node: the shard's data, and the coordination of writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRequest {
    /// Length and schema.
    Info,
    /// Records `indices` (node addresses: slot and index inside it, see
    /// [`crate::placement::unit_address`]) of `fields` (empty = all). Reply: `Gather`.
    /// `checked`: each record read against its CRC (a failure is a `CorruptRecord` refusal).
    Gather {
        indices: Vec<u64>,
        fields: Vec<String>,
        checked: bool,
    },
    /// Append records; body: per field of `fields`, the payloads (`lengths[f][k]` bytes each).
    /// `runs`: where they go, in order — each run's records at the end of its slot, which
    /// must hold `at` records (the router's check that a node is in step).
    /// `token`: see [`NodeRequest::Fence`]; a node takes writes only with one.
    Append {
        runs: Vec<Run>,
        token: Option<u64>,
        fields: Vec<String>,
        lengths: Vec<Vec<u32>>,
    },
    /// Replace the fields `fields` of record `index` (a node address); body: per field, its
    /// payload. Its other fields keep their values. `token` as for `Append`.
    Modify {
        index: u64,
        token: Option<u64>,
        fields: Vec<String>,
        lengths: Vec<u32>,
    },
    /// Write field `field` of records `indices` (node addresses); body: their payloads back
    /// to back. `token` as for `Append`.
    WriteField {
        token: u64,
        field: String,
        indices: Vec<u64>,
        lengths: Vec<u32>,
    },
    /// Drop records from the end of each slot listed until as many remain as listed with it
    /// (repair, global delete).
    Truncate { slots: Vec<(u32, u64)>, token: u64 },
    /// The datasets this node holds. Reply: `Datasets` (`committed` unset).
    Datasets,
    /// Create the message's dataset, made as `id` (its creation's metadata revision), with
    /// `fields` and the zstd dictionaries `dicts`; a dataset of that name made earlier
    /// (dropped while this node was away) is replaced. Reply: `Done`.
    CreateDataset {
        id: u64,
        fields: Vec<FieldInfo>,
        dicts: Vec<FieldDict>,
    },
    /// Drop the message's dataset if it was made as `id` or earlier. Reply: `Done`.
    DropDataset { id: u64 },
    /// Add `field` to the message's dataset (nothing if it has it already). Reply: `Done`.
    AddField { field: FieldInfo },
    /// Holding the write lease whose token is `token`: refuse from now on every write with a
    /// smaller token (a router whose lease ran out and passed on, whose write arrives late).
    /// Reply: `Info`, the length read after any earlier write.
    Fence { token: u64 },
    /// Make every write so far durable.
    Commit,
    /// A digest of the records of `runs` (each clamped to its slot's length), each read and
    /// checked against its CRC: how replicas find the records in which they differ.
    /// Reply: `Digest`.
    Digest { runs: Vec<Run> },
    /// A move: the slots `slots` this node gains with map `version`, held beside the ones
    /// it serves (and not counted in its length) until it switches; slots it held for
    /// another move and not for this one are dropped. Reply: `Staged`, their lengths.
    StageOpen { version: u64, slots: Vec<u32> },
    /// A move: records of slots this node gains with map `version`: per run, its slot's
    /// records from index `at` on (what it held from there on is dropped first; a run of no
    /// records only cuts); body: per field of `fields`, the payloads of every run in turn,
    /// as for `Append`. With `commit`, everything so far is made durable (a restarted node
    /// goes on from there). Reply: `Staged`, the runs' slots' lengths.
    Stage {
        version: u64,
        runs: Vec<Run>,
        fields: Vec<String>,
        lengths: Vec<Vec<u32>>,
        commit: bool,
    },
    /// A move: serve map `version` from now on, holding the slots `slots` with these
    /// lengths (the ones gained become served, every other slot is dropped). Placed by the
    /// map it switches to, and admitted by a node of the previous one. Reply: `Done`.
    Switch {
        version: u64,
        slots: Vec<(u32, u64)>,
        token: u64,
    },
    /// Which cluster and map the node's data belongs to, and its length (what
    /// `zr cluster restore-record` rebuilds a lost cluster record from). Reply: `Identity`.
    Identity,
    /// A rebuild by files: takes a snapshot of the message's dataset (its files as of its
    /// last commit) for `ShipRead`s; sent by a replica rebuilding itself from this one. With
    /// `slots`, of those slots only (a shard move's copy: their tables and chunks, and the
    /// dataset's `meta.json`). Reply: `Manifest`.
    ShipOpen { slots: Vec<u32> },
    /// Bytes `offset..offset + len` of file `file` of snapshot `ship` (fewer at its end).
    /// Reply: `Piece`, their CRC32; body: the bytes.
    ShipRead {
        ship: u64,
        file: u32,
        offset: u64,
        len: u32,
    },
    /// Pieces of several files of snapshot `ship` at once, each its file's bytes
    /// `offset..offset + len` (fewer at its end): how a copy of many small files (a node's
    /// slots) asks for them. Reply: `Pieces`; body: their bytes back to back.
    ShipReadMany { ship: u64, pieces: Vec<ShipPiece> },
    /// Lets snapshot `ship` go: its reader is done with it. Reply: `Done`.
    ShipClose { ship: u64 },
    /// Rebuild the message's dataset on this node from the files of its partner, the node
    /// at `addr` serving replica `replica` (of this node's shard, or of `shard`): started if
    /// it is not running (a finished one is reported once, then forgotten). With `slots`,
    /// copy those slots only, which a move is building here, from the shard holding them,
    /// at most `rate` bytes a second (0: as fast as it can), all of this node's copies for
    /// a move together. Reply: `Shipping`, how far it got.
    ShipFrom {
        addr: String,
        replica: u32,
        shard: Option<u32>,
        slots: Vec<u32>,
        rate: u64,
    },
}

impl NodeRequest {
    /// The request's kind, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            NodeRequest::Info => "info",
            NodeRequest::Gather { .. } => "gather",
            NodeRequest::Append { .. } => "append",
            NodeRequest::Modify { .. } => "modify",
            NodeRequest::WriteField { .. } => "write-field",
            NodeRequest::Truncate { .. } => "truncate",
            NodeRequest::Datasets => "datasets",
            NodeRequest::CreateDataset { .. } => "create-dataset",
            NodeRequest::DropDataset { .. } => "drop-dataset",
            NodeRequest::AddField { .. } => "add-field",
            NodeRequest::Fence { .. } => "fence",
            NodeRequest::Commit => "commit",
            NodeRequest::Digest { .. } => "digest",
            NodeRequest::StageOpen { .. } => "stage-open",
            NodeRequest::Stage { .. } => "stage",
            NodeRequest::Switch { .. } => "switch",
            NodeRequest::Identity => "identity",
            NodeRequest::ShipOpen { .. } => "ship-open",
            NodeRequest::ShipReadMany { .. } => "ship-read-many",
            NodeRequest::ShipRead { .. } => "ship-read",
            NodeRequest::ShipClose { .. } => "ship-close",
            NodeRequest::ShipFrom { .. } => "ship-from",
        }
    }

    /// Records the request reads or writes (gathers and appends; 0 for the others).
    pub fn records(&self) -> usize {
        match self {
            NodeRequest::Gather { indices, .. } => indices.len(),
            NodeRequest::Append { lengths, .. } => lengths.first().map_or(0, Vec::len),
            _ => 0,
        }
    }
}

/// A node request as it crosses the wire: with the cluster it is meant for and the map
/// version its sender placed it by, so that a node of another cluster, or one that knows
/// another map, refuses it instead of guessing. Tools that talk to a node directly
/// (benchmarks, tests) may leave the cluster out ([`NodeMessage::unchecked`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMessage {
    /// The cluster id (see zr-meta); `None`: not checked.
    pub cluster: Option<String>,
    /// The dataset the request addresses (`None`: the default one).
    pub dataset: Option<String>,
    /// The version of the cluster map the sender placed the request by.
    pub map_version: u64,
    /// The shard and replica the sender meant the request for (from its nodes.toml or the
    /// cluster record); `None`: not checked.
    pub target: Option<Target>,
    pub request: NodeRequest,
}

/// Which node a request is meant for: a shard and one of its replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub shard: u32,
    pub replica: u32,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shard {} replica {}", self.shard, self.replica)
    }
}

impl NodeMessage {
    /// `request` for cluster `cluster` placed by map `map_version`, meant for `target`.
    pub fn new(
        cluster: &str,
        map_version: u64,
        target: Option<Target>,
        request: NodeRequest,
    ) -> NodeMessage {
        NodeMessage {
            cluster: Some(cluster.to_string()),
            dataset: None,
            map_version,
            target,
            request,
        }
    }

    /// This message, addressed to dataset `dataset` (`None`: the default one).
    pub fn on(mut self, dataset: Option<&str>) -> NodeMessage {
        self.dataset = dataset.map(str::to_string);
        self
    }

    /// `request` without a cluster or a node to check: for tools that talk to a node
    /// directly.
    pub fn unchecked(request: NodeRequest) -> NodeMessage {
        NodeMessage {
            cluster: None,
            dataset: None,
            map_version: 0,
            target: None,
            request,
        }
    }
}

/// A request of one of the two protocols: its message kind, and the checks its header and
/// body must pass before anything is allocated from them.
pub trait Request: Serialize + serde::de::DeserializeOwned + sealed::Sealed {
    /// The message kind in the prefix: a request of the other protocol is refused unread.
    const KIND: u16;
    /// Checks the header's counts against the limits and the body's size.
    fn check(&self, body: usize) -> Result<(), Error>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ClientMessage {}
    impl Sealed for super::NodeMessage {}
}

impl Request for ClientMessage {
    const KIND: u16 = KIND_CLIENT_REQUEST;

    fn check(&self, body: usize) -> Result<(), Error> {
        if let Some(name) = &self.dataset {
            check_dataset_name(name)?;
        }
        match &self.request {
            ClientRequest::Gather {
                indices, fields, ..
            } => check_gather(indices, fields, body),
            ClientRequest::WriteField { lengths, .. } => check_field_values(lengths, body),
            ClientRequest::CreateDataset { fields, dicts } => check_create(fields, dicts, body),
            ClientRequest::Append { fields, lengths } => check_append(fields, lengths, body),
            ClientRequest::Modify {
                fields, lengths, ..
            } => check_modify(fields, lengths, body),
            ClientRequest::MoveShards { nodes, .. } if nodes.len() > NODES_MAX => Err(
                Error::Malformed(format!("{} nodes (at most {NODES_MAX})", nodes.len())),
            ),
            ClientRequest::Scrub { count, .. } if *count > DIGEST_RECORDS_MAX => {
                Err(Error::Malformed(format!(
                    "a scrub of {count} records (at most {DIGEST_RECORDS_MAX} at once)"
                )))
            }
            ClientRequest::Info
            | ClientRequest::WaitLen { .. }
            | ClientRequest::Datasets
            | ClientRequest::DropDataset
            | ClientRequest::AddField { .. }
            | ClientRequest::Delete { .. }
            | ClientRequest::Commit
            | ClientRequest::Status
            | ClientRequest::Scrub { .. }
            | ClientRequest::ReplaceNode { .. }
            | ClientRequest::MoveShards { .. }
            | ClientRequest::MoveProgress
            | ClientRequest::Topology { .. } => expect_empty(body),
        }
    }
}

impl Request for NodeMessage {
    const KIND: u16 = KIND_NODE_REQUEST;

    fn check(&self, body: usize) -> Result<(), Error> {
        if self
            .cluster
            .as_ref()
            .is_some_and(|c| c.len() > CLUSTER_ID_BYTES_MAX)
        {
            return Err(Error::Malformed(format!(
                "a cluster id longer than {CLUSTER_ID_BYTES_MAX} bytes"
            )));
        }
        if let Some(name) = &self.dataset {
            check_dataset_name(name)?;
        }
        match &self.request {
            NodeRequest::WriteField {
                indices, lengths, ..
            } => {
                if indices.len() != lengths.len() {
                    return Err(Error::Malformed(format!(
                        "{} indices but {} lengths",
                        indices.len(),
                        lengths.len()
                    )));
                }
                check_field_values(lengths, body)
            }
            NodeRequest::CreateDataset { fields, dicts, .. } => check_create(fields, dicts, body),
            NodeRequest::Gather {
                indices, fields, ..
            } => check_gather(indices, fields, body),
            NodeRequest::Append {
                runs,
                fields,
                lengths,
                ..
            }
            | NodeRequest::Stage {
                runs,
                fields,
                lengths,
                ..
            } => check_placed_append(runs, fields, lengths, body),
            NodeRequest::Modify {
                fields, lengths, ..
            } => check_modify(fields, lengths, body),
            NodeRequest::Digest { runs } => {
                let count = check_runs(runs)?;
                if count > DIGEST_RECORDS_MAX {
                    return Err(Error::Malformed(format!(
                        "a digest of {count} records (at most {DIGEST_RECORDS_MAX} at once)"
                    )));
                }
                expect_empty(body)
            }
            NodeRequest::Info
            | NodeRequest::Datasets
            | NodeRequest::DropDataset { .. }
            | NodeRequest::AddField { .. }
            | NodeRequest::Truncate { .. }
            | NodeRequest::Commit
            | NodeRequest::Fence { .. }
            | NodeRequest::StageOpen { .. }
            | NodeRequest::Switch { .. }
            | NodeRequest::Identity
            | NodeRequest::ShipOpen { .. }
            | NodeRequest::ShipClose { .. } => expect_empty(body),
            NodeRequest::ShipRead { len, .. } if *len as usize > SHIP_PIECE_MAX => Err(
                Error::Malformed(format!("a piece of {len} bytes (at most {SHIP_PIECE_MAX})")),
            ),
            NodeRequest::ShipReadMany { pieces, .. } => {
                let sum: u64 = pieces.iter().map(|p| u64::from(p.len)).sum();
                if sum > SHIP_PIECE_MAX as u64 || pieces.len() > SHIP_PIECES_MAX {
                    return Err(Error::Malformed(format!(
                        "{} pieces of {sum} bytes at once (at most {SHIP_PIECES_MAX} of {SHIP_PIECE_MAX})",
                        pieces.len()
                    )));
                }
                expect_empty(body)
            }
            NodeRequest::ShipFrom { addr, .. } if addr.len() > ADDR_BYTES_MAX => Err(
                Error::Malformed(format!("an address of {} bytes", addr.len())),
            ),
            NodeRequest::ShipRead { .. } | NodeRequest::ShipFrom { .. } => expect_empty(body),
        }
    }
}

/// A field's storage as commands, configurations and the wire spell it: `raw`, `flate`,
/// `zstd` or `zstd:LEVEL` (1–22). Returns the kind and the level, if given.
pub fn parse_storage(text: &str) -> Result<(&'static str, Option<i32>), Invalid> {
    match text {
        "raw" => Ok(("raw", None)),
        "flate" => Ok(("flate", None)),
        "zstd" => Ok(("zstd", None)),
        _ => match text.strip_prefix("zstd:") {
            Some(level) => {
                let level = level
                    .parse::<i32>()
                    .ok()
                    .filter(|l| (1..=22).contains(l))
                    .ok_or_else(|| Invalid::ZstdLevel(level.escape_debug().to_string()))?;
                Ok(("zstd", Some(level)))
            }
            None => Err(Invalid::Compression(text.escape_debug().to_string())),
        },
    }
}

/// A field as the wire describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldInfo {
    pub name: String,
    /// Its storage (see [`parse_storage`]).
    pub compress: String,
    pub dtype: Option<String>,
    pub shape: Option<Vec<u64>>,
    /// The zstd dictionary its records are compressed with, if any.
    pub dict: Option<DictRef>,
}

/// A zstd dictionary as a field names it: its id and the CRC32 of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DictRef {
    pub id: u32,
    pub crc: u32,
}

impl DictRef {
    /// How `bytes` are named, or `None` if they are no zstd dictionary.
    pub fn of(bytes: &[u8]) -> Option<DictRef> {
        Some(DictRef {
            id: zstd_dict_id(bytes)?,
            crc: crc32fast::hash(bytes),
        })
    }
}

impl FieldInfo {
    /// A field of storage `compress` (see [`parse_storage`]), untyped, with no dictionary.
    pub fn new(name: impl Into<String>, compress: impl Into<String>) -> FieldInfo {
        FieldInfo {
            name: name.into(),
            compress: compress.into(),
            dtype: None,
            shape: None,
            dict: None,
        }
    }
}

/// A zstd dictionary for field `field`, as a dataset is created with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldDict {
    pub field: String,
    pub bytes: Vec<u8>,
}

/// The id a zstd dictionary names itself by (RFC 8878, section 5: the magic number
/// 0xEC30A437, then the id, both little-endian), or `None` for bytes that do not start like
/// one (or whose id is 0, "no id").
pub fn zstd_dict_id(bytes: &[u8]) -> Option<u32> {
    const MAGIC: u32 = 0xEC30_A437;
    let word = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    (word(0)? == MAGIC).then_some(())?;
    word(4).filter(|&id| id != 0)
}

/// What comes back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Info {
        len: u64,
        fields: Vec<FieldInfo>,
        /// A node's: a number drawn when its process started, so that a restart (which loses
        /// writes not yet made durable) is told from a node that stayed up. 0 from a router.
        incarnation: u64,
    },
    /// A node's digest of the records a `Digest` asked for: per record, a CRC32 of its
    /// fields' lengths and contents (0 for a record that failed its check); `corrupt` lists
    /// those, by their position among them.
    Digest {
        crcs: Vec<u32>,
        corrupt: Vec<u64>,
        /// Read before the digest: while it stays the same, no record the digest covers has
        /// changed on the node since.
        mark: DataMark,
    },
    /// Body: per field, the payloads back to back; `lengths[f][k]` is record k's length.
    Gather {
        lengths: Vec<Vec<u32>>,
    },
    Appended {
        start: u64,
        count: u64,
    },
    Done,
    Error {
        code: ErrorCode,
        message: String,
    },
    /// The router's gather reply, streamed as the shards answer: the body is `parts` frames
    /// pairs (a `Part`, then that shard's `Gather`), or an `Error` frame; see
    /// [`crate::assemble`]. `records` is the batch's size.
    GatherParts {
        records: u32,
        parts: u32,
    },
    /// Inside `GatherParts`: where the next frame's records go in the caller's batch.
    Part {
        positions: Vec<u32>,
    },
    /// The cluster as the router sees it.
    Status(ClusterStatus),
    /// What a scrub of part of a shard found and did.
    Scrubbed(ScrubReport),
    /// The lengths of the slots a node gains with the next map: (slot, records held).
    Staged {
        slots: Vec<(u32, u64)>,
    },
    /// The move this router runs or ran last, if any.
    Moving(Option<MoveReport>),
    /// The datasets of the cluster (from a router) or of a node.
    Datasets(Vec<DatasetInfo>),
    /// A node's identity: the cluster and map version its data belongs to (`None` until a
    /// router's first request names them), and how many records it holds.
    Identity {
        cluster: Option<String>,
        map_version: Option<u64>,
        len: u64,
    },
    /// The cluster as a client reading one hop needs it (see `ClientRequest::Topology`).
    Topology(Topology),
    /// A snapshot of a dataset, to read with `ShipRead`: its id, committed records and files.
    Manifest {
        ship: u64,
        len: u64,
        files: Vec<ShipFile>,
        /// The node's mark of the dataset when the snapshot was taken, if its records below
        /// `len` were then the same as the snapshot's (no change waited for a commit).
        mark: Option<DataMark>,
    },
    /// A piece of a snapshot's file; body: the bytes, whose CRC32 is `crc`.
    Piece {
        crc: u32,
    },
    /// Pieces of a snapshot's files (see `NodeRequest::ShipReadMany`): each one's length and
    /// CRC32; body: their bytes back to back.
    Pieces {
        pieces: Vec<PieceSent>,
    },
    /// How far a rebuild by files got (see `NodeRequest::ShipFrom`).
    Shipping(ShipStatus),
}

/// Which process and open of a node's dataset answered, and how many changes to existing
/// records (modifies, field writes, deletes) it had made: two equal marks mean no record
/// below the length seen changed between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataMark {
    pub incarnation: u64,
    pub instance: u64,
    pub rewrites: u64,
}

/// A piece of a snapshot's file asked for (see `NodeRequest::ShipReadMany`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShipPiece {
    pub file: u32,
    pub offset: u64,
    pub len: u32,
}

/// A piece of a snapshot's file sent: its length and CRC32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceSent {
    pub len: u32,
    pub crc: u32,
}

/// Most pieces one `ShipReadMany` asks for.
pub const SHIP_PIECES_MAX: usize = 4096;

/// A file of a dataset snapshot: its path inside the dataset directory and its length.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShipFile {
    pub name: String,
    pub len: u64,
}

/// A rebuild by files, as the node rebuilding says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShipStatus {
    /// Finished: the snapshot installed (`error` unset) or given up (`error` says why).
    pub done: bool,
    /// Bytes received so far, of `total` (0 until the partner's manifest arrives).
    pub bytes: u64,
    pub total: u64,
    /// Records the snapshot holds.
    pub len: u64,
    pub error: Option<String>,
    /// The partner's mark of the dataset when its snapshot was taken (see `Manifest`):
    /// unchanged since, the records below `len` need no comparing.
    pub mark: Option<DataMark>,
}

/// What a client needs to read a dataset from the nodes itself: where each record is (the
/// map), who holds it (the nodes, in shard × replica order) and what requests must carry
/// (the cluster id and map version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub cluster: String,
    /// The map placing the dataset's records; its version goes on every request.
    pub map: crate::placement::ClusterMap,
    /// Shards with nodes (at least the map's: a shard being added has nodes first).
    pub shards: u32,
    pub replicas: u32,
    pub nodes: Vec<NodeAddr>,
    /// The dataset's length as the router serves it.
    pub len: u64,
    /// Shards whose node holds less than its committed share: read through the router,
    /// which refuses them naming what is missing.
    pub missing: Vec<u32>,
    /// The router's bound on each exchange with a node, in milliseconds.
    pub timeout_ms: u64,
}

/// Where one node is served, and whether it may be read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    pub shard: u32,
    pub replica: u32,
    pub addr: String,
    /// False while it is behind: it serves no reads until it has caught up.
    pub in_sync: bool,
}

/// A dataset as a router or a node describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetInfo {
    pub name: String,
    /// When it was made: its creation's revision in the metadata store (0: the default
    /// dataset of a cluster made before datasets had names).
    pub id: u64,
    pub fields: Vec<FieldInfo>,
    /// Records (a router's: every shard's; a node's: its own).
    pub len: u64,
    /// Records committed (a router's; `None` from a node).
    pub committed: Option<u64>,
    /// Bytes its chunks hold (on every in-sync replica, from a router).
    pub bytes: u64,
    /// Commits recorded that changed its records (a router's; `None` from a node): with
    /// `id` and `committed`, the identity of its committed contents.
    pub commits: Option<u64>,
}

/// What a scrub of records of one shard found and did (see `ClientRequest::Scrub`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubReport {
    /// The shard's length (its in-sync replicas'); the range scrubbed ends there at most.
    pub shard_len: u64,
    /// Records checked, each on every in-sync replica.
    pub records: u64,
    /// Replicas checked.
    pub replicas: u32,
    /// Each problem found, in words (replica, local index, what), and whether repaired.
    pub problems: Vec<ScrubProblem>,
}

/// One record's copy that failed its check or differed from its partners'.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubProblem {
    pub replica: u32,
    /// The shard-local index.
    pub index: u64,
    pub what: String,
    pub repaired: bool,
}

/// The cluster as a router sees it (`zr cluster status`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub cluster: String,
    pub map_version: u64,
    /// Records committed on every shard (the metadata store's record).
    pub committed_len: u64,
    /// Records the router serves.
    pub len: u64,
    pub nodes: Vec<NodeStatus>,
    /// The move of records to another map under way, if any, in words.
    pub moving: Option<String>,
}

/// One node as the router sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub shard: u32,
    pub replica: u32,
    /// False while it is behind: it missed writes and serves nothing until it caught up.
    pub in_sync: bool,
    /// Its catch-up from an in-sync partner, while one runs, in words (progress, rate, ETA).
    pub rebuild: Option<String>,
    pub addr: String,
    /// `up`, `down: why`, or `refused: why`.
    pub state: String,
    /// Records it holds, if it answered.
    pub records: Option<u64>,
    /// Milliseconds since the router last heard from it, if ever.
    pub last_seen_ms: Option<u64>,
    /// Its liveness lease in the metadata store, as the router has read it, in words.
    pub lease: String,
    /// The QUIC path's round-trip time to it, in microseconds, if connected.
    pub rtt_us: Option<u64>,
}

fn options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(HEADER_BYTES_MAX as u64)
        .reject_trailing_bytes()
}

/// Encodes a message prefix and header; the body pieces follow it on the stream.
fn encode(kind: u16, header: &impl Serialize) -> Result<Vec<u8>, Error> {
    let header = options()
        .serialize(header)
        .map_err(|e| Error::Malformed(format!("cannot encode header: {e}")))?;
    let mut out = Vec::with_capacity(PREFIX_BYTES + header.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    Ok(out)
}

/// The length of a message's prefix and header, from at least its first `PREFIX_BYTES`
/// bytes: the magic, version, kind and header length are checked.
pub fn head_len(bytes: &[u8], kind: u16) -> Result<usize, Error> {
    let bad = |why: String| Err(Error::Malformed(why));
    if bytes.len() < PREFIX_BYTES {
        return bad(format!(
            "message of {} bytes is shorter than its {PREFIX_BYTES}-byte prefix",
            bytes.len()
        ));
    }
    if bytes[0..4] != MAGIC {
        return bad("message does not start with ZRW1".into());
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != WIRE_VERSION {
        return Err(Error::Version {
            theirs: version,
            ours: WIRE_VERSION,
        });
    }
    let found = u16::from_le_bytes([bytes[6], bytes[7]]);
    if found != kind {
        return bad(format!("unexpected message kind {found}"));
    }
    let header_len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    if header_len > HEADER_BYTES_MAX {
        return bad(format!(
            "header length {header_len} exceeds the limit of {HEADER_BYTES_MAX}"
        ));
    }
    Ok(PREFIX_BYTES + header_len)
}

/// Splits a message into its decoded header and its body.
fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], kind: u16) -> Result<(T, &[u8]), Error> {
    let head = head_len(bytes, kind)?;
    if head > bytes.len() {
        return Err(Error::Malformed(format!(
            "header length {} exceeds the message ({} bytes)",
            head - PREFIX_BYTES,
            bytes.len()
        )));
    }
    let (header, body) = bytes[PREFIX_BYTES..].split_at(head - PREFIX_BYTES);
    let value = options()
        .deserialize(header)
        .map_err(|e| Error::Malformed(format!("malformed header: {e}")))?;
    Ok((value, body))
}

/// True if `bytes` start like a zrecord message (of any version or kind). Anything else is
/// not a malformed request but another protocol, or garbage.
pub fn is_message(bytes: &[u8]) -> bool {
    bytes.len() >= MAGIC.len() && bytes[..MAGIC.len()] == MAGIC
}

/// Encodes a request's prefix and header (its body pieces are sent after it).
pub fn encode_request<R: Request>(request: &R) -> Result<Vec<u8>, Error> {
    encode(R::KIND, request)
}

/// Encodes `request` as a [`NodeMessage`] for `cluster` (`None`: unchecked) placed by map
/// `map_version` and meant for `target`, the same bytes, without copying the request into one (a router's hot
/// path: a gather's indices).
pub fn encode_node_request(
    cluster: Option<&str>,
    dataset: Option<&str>,
    map_version: u64,
    target: Option<Target>,
    request: &NodeRequest,
) -> Result<Vec<u8>, Error> {
    /// [`NodeMessage`], borrowed: serde encodes `&str` as `String` and `&T` as `T`.
    #[derive(Serialize)]
    struct Borrowed<'a> {
        cluster: Option<&'a str>,
        dataset: Option<&'a str>,
        map_version: u64,
        target: Option<Target>,
        request: &'a NodeRequest,
    }
    encode(
        KIND_NODE_REQUEST,
        &Borrowed {
            cluster,
            dataset,
            map_version,
            target,
            request,
        },
    )
}

/// Encodes `request` for dataset `dataset` as a [`ClientMessage`], the same bytes, without
/// copying the request into one (a client's hot path: a gather's indices).
pub fn encode_client_request(
    dataset: Option<&str>,
    request: &ClientRequest,
) -> Result<Vec<u8>, Error> {
    /// [`ClientMessage`], borrowed.
    #[derive(Serialize)]
    struct Borrowed<'a> {
        dataset: Option<&'a str>,
        request: &'a ClientRequest,
    }
    encode(KIND_CLIENT_REQUEST, &Borrowed { dataset, request })
}

/// Encodes a reply's prefix and header (its body pieces are sent after it).
pub fn encode_reply(reply: &Reply) -> Result<Vec<u8>, Error> {
    encode(KIND_REPLY, reply)
}

/// Decodes and checks a request; returns it with its body.
pub fn decode_request<R: Request>(bytes: &[u8]) -> Result<(R, &[u8]), Error> {
    let (request, body): (R, &[u8]) = decode(bytes, R::KIND)?;
    request.check(body.len())?;
    Ok((request, body))
}

/// Decodes and checks a reply; returns it with its body.
pub fn decode_reply(bytes: &[u8]) -> Result<(Reply, &[u8]), Error> {
    let (reply, body): (Reply, &[u8]) = decode(bytes, KIND_REPLY)?;
    check_reply(&reply, body.len())?;
    Ok((reply, body))
}

/// Decodes and checks a reply that arrived in `chunks` (copying only its head); returns it
/// with the length of its head, where the body starts.
pub fn decode_reply_chunks(chunks: &[bytes::Bytes]) -> Result<(Reply, usize), Error> {
    let message = Chunks::new(chunks);
    let total = message.len();
    let (reply, body) = decode_reply_from(message)?;
    Ok((reply, total - body.len()))
}

/// Decodes the head of a reply still arriving in `chunks` (its first pieces): `None` until the
/// whole head is there, then the reply and the length of the whole message — the head plus
/// the body its header announces. What the header says is checked as in a whole message,
/// except the body, which has not arrived yet: the caller checks it as it comes.
pub fn decode_reply_head(chunks: &[bytes::Bytes]) -> Result<Option<(Reply, u64)>, Error> {
    let Some(prefix) = Chunks::new(chunks).read_vec(PREFIX_BYTES) else {
        return Ok(None);
    };
    let want = head_len(&prefix, KIND_REPLY)?;
    let Some(head) = Chunks::new(chunks).read_vec(want) else {
        return Ok(None);
    };
    let (reply, _): (Reply, &[u8]) = decode(&head, KIND_REPLY)?;
    let body = match &reply {
        Reply::Gather { lengths } => column_bytes(lengths)?,
        // Frames whose length only their producer knows: never announced ahead.
        Reply::GatherParts { .. } => {
            return Err(Error::Malformed(
                "a streamed gather cannot be forwarded again".into(),
            ))
        }
        _ => 0,
    };
    Ok(Some((reply, want as u64 + body)))
}

/// Decodes and checks a reply read from `message` (copying only its head); returns it with
/// its body, still in the chunks it arrived in.
pub fn decode_reply_from(mut message: Chunks<'_>) -> Result<(Reply, Chunks<'_>), Error> {
    let total = message.len();
    let cut = || Error::Malformed(format!("message of {total} bytes ends inside its head"));
    let mut head = message.read_vec(PREFIX_BYTES).ok_or_else(cut)?;
    let want = head_len(&head, KIND_REPLY)?;
    head.extend(message.read_vec(want - PREFIX_BYTES).ok_or_else(cut)?);
    let (reply, rest): (Reply, &[u8]) = decode(&head, KIND_REPLY)?;
    debug_assert!(rest.is_empty());
    check_reply(&reply, message.len())?;
    Ok((reply, message))
}

fn check_reply(reply: &Reply, body: usize) -> Result<(), Error> {
    match reply {
        Reply::Gather { lengths } => check_columns(lengths, body),
        // Frames, checked as they are taken apart (crate::assemble).
        Reply::GatherParts { .. } => Ok(()),
        // The piece's bytes, checked against its CRC32 by the receiver.
        Reply::Piece { .. } if body <= SHIP_PIECE_MAX => Ok(()),
        Reply::Piece { .. } => Err(Error::Malformed(format!(
            "a piece of {body} bytes (at most {SHIP_PIECE_MAX})"
        ))),
        Reply::Pieces { pieces } => {
            let sum: u64 = pieces.iter().map(|p| u64::from(p.len)).sum();
            if sum != body as u64 || body > SHIP_PIECE_MAX {
                return Err(Error::Malformed(format!(
                    "pieces of {sum} bytes in a body of {body} (at most {SHIP_PIECE_MAX})"
                )));
            }
            Ok(())
        }
        _ => expect_empty(body),
    }
}

fn check_fields(fields: &[String]) -> Result<(), Error> {
    if fields.len() > FIELDS_MAX {
        return Err(Error::Malformed(format!(
            "{} fields exceed the limit of {FIELDS_MAX}",
            fields.len()
        )));
    }
    Ok(())
}

/// Checks per-field length lists against each other and against the body size.
fn check_columns(lengths: &[Vec<u32>], body: usize) -> Result<(), Error> {
    let total = column_bytes(lengths)?;
    if total != body as u64 {
        return Err(Error::Malformed(format!(
            "lengths add up to {total} bytes but the body has {body}"
        )));
    }
    Ok(())
}

/// Checks per-field length lists against each other and the limits; returns their total.
fn column_bytes(lengths: &[Vec<u32>]) -> Result<u64, Error> {
    if lengths.len() > FIELDS_MAX {
        return Err(Error::Malformed(format!(
            "{} columns exceed the limit of {FIELDS_MAX}",
            lengths.len()
        )));
    }
    let records = lengths.first().map_or(0, Vec::len);
    if records > RECORDS_MAX || lengths.iter().any(|l| l.len() != records) {
        return Err(Error::Malformed(format!(
            "columns must all hold the same number (≤ {RECORDS_MAX}) of records"
        )));
    }
    Ok(lengths.iter().flatten().map(|&l| l as u64).sum())
}

fn check_create(fields: &[FieldInfo], dicts: &[FieldDict], body: usize) -> Result<(), Error> {
    if fields.len() > FIELDS_MAX {
        return Err(Error::Malformed(format!(
            "{} fields (at most {FIELDS_MAX})",
            fields.len()
        )));
    }
    for dict in dicts {
        if !fields.iter().any(|f| f.name == dict.field) {
            return Err(Error::Malformed(format!(
                "a dictionary for field '{}', which the dataset does not have",
                dict.field.escape_debug()
            )));
        }
        if dict.bytes.len() > DICT_BYTES_MAX {
            return Err(Error::Malformed(format!(
                "field '{}''s dictionary holds {} bytes (at most {DICT_BYTES_MAX})",
                dict.field.escape_debug(),
                dict.bytes.len()
            )));
        }
    }
    expect_empty(body)
}

/// Records appended where `runs` say: as many runs' records as lengths, then as an append.
fn check_placed_append(
    runs: &[Run],
    fields: &[String],
    lengths: &[Vec<u32>],
    body: usize,
) -> Result<(), Error> {
    let count = check_runs(runs)?;
    let records = lengths.first().map_or(0, Vec::len) as u64;
    if count != records {
        return Err(Error::Malformed(format!(
            "runs of {count} records, but the lengths describe {records}"
        )));
    }
    check_append(fields, lengths, body)
}

/// The records `runs` cover, refused past [`RECORDS_MAX`] or with a run that overflows.
fn check_runs(runs: &[Run]) -> Result<u64, Error> {
    let mut count = 0u64;
    for run in runs {
        if run
            .at
            .checked_add(run.count)
            .is_none_or(|end| end > 1 << crate::placement::UNIT_SHIFT)
        {
            return Err(Error::Malformed(format!(
                "a run of {} records from {} in slot {} passes a slot's end",
                run.count, run.at, run.slot
            )));
        }
        count = count.saturating_add(run.count);
    }
    if count > RECORDS_MAX as u64 {
        return Err(Error::Malformed(format!(
            "runs of {count} records (at most {RECORDS_MAX} at once)"
        )));
    }
    Ok(count)
}

fn check_gather(indices: &[u64], fields: &[String], body: usize) -> Result<(), Error> {
    check_fields(fields)?;
    if indices.len() > RECORDS_MAX {
        return Err(Error::Malformed(format!(
            "{} indices exceed the limit of {RECORDS_MAX}",
            indices.len()
        )));
    }
    expect_empty(body)
}

fn check_append(fields: &[String], lengths: &[Vec<u32>], body: usize) -> Result<(), Error> {
    check_fields(fields)?;
    if lengths.len() != fields.len() {
        return Err(Error::Malformed(format!(
            "{} fields but {} length lists",
            fields.len(),
            lengths.len()
        )));
    }
    check_columns(lengths, body)
}

fn check_modify(fields: &[String], lengths: &[u32], body: usize) -> Result<(), Error> {
    check_fields(fields)?;
    if lengths.len() != fields.len() {
        return Err(Error::Malformed(format!(
            "{} fields but {} lengths",
            fields.len(),
            lengths.len()
        )));
    }
    check_body(lengths, body)
}

/// One field's values of many records: at most `RECORDS_MAX`, their lengths adding up to
/// the body.
fn check_field_values(lengths: &[u32], body: usize) -> Result<(), Error> {
    if lengths.len() > RECORDS_MAX {
        return Err(Error::Malformed(format!(
            "{} records written at once (at most {RECORDS_MAX})",
            lengths.len()
        )));
    }
    check_body(lengths, body)
}

/// Payload lengths that add up to the body.
fn check_body(lengths: &[u32], body: usize) -> Result<(), Error> {
    let total: u64 = lengths.iter().map(|&l| l as u64).sum();
    if total != body as u64 {
        return Err(Error::Malformed(format!(
            "lengths add up to {total} bytes but the body has {body}"
        )));
    }
    Ok(())
}

fn expect_empty(body: usize) -> Result<(), Error> {
    if body != 0 {
        return Err(Error::Malformed(format!("unexpected body of {body} bytes")));
    }
    Ok(())
}

/// Cuts a checked body into per-field, per-record slices: `columns[f][k]`.
pub fn split_columns<'a>(lengths: &[Vec<u32>], mut body: &'a [u8]) -> Vec<Vec<&'a [u8]>> {
    lengths
        .iter()
        .map(|column| {
            column
                .iter()
                .map(|&len| {
                    let (record, rest) = body.split_at((len as usize).min(body.len()));
                    body = rest;
                    record
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(prefix: Vec<u8>, body: &[u8]) -> Vec<u8> {
        [prefix, body.to_vec()].concat()
    }

    #[test]
    fn round_trips() {
        let request = NodeRequest::Append {
            runs: vec![Run {
                slot: 7,
                at: 5,
                count: 2,
            }],
            token: Some(9),
            fields: vec!["a".into(), "b".into()],
            lengths: vec![vec![1, 2], vec![0, 3]],
        };
        let sent = NodeMessage::new(
            "c1",
            3,
            Some(Target {
                shard: 2,
                replica: 1,
            }),
            request,
        )
        .on(Some("images"));
        // The borrowing encoder writes the same bytes as the message.
        let encoded = encode_request(&sent).unwrap();
        assert_eq!(
            encode_node_request(Some("c1"), Some("images"), 3, sent.target, &sent.request).unwrap(),
            encoded
        );
        let bytes = message(encoded, b"xyy___");
        let (back, body) = decode_request::<NodeMessage>(&bytes).unwrap();
        assert_eq!(back, sent);
        let NodeRequest::Append { lengths, .. } = back.request else {
            unreachable!()
        };
        assert_eq!(
            split_columns(&lengths, body),
            vec![vec![&b"x"[..], b"yy"], vec![&b""[..], b"___"]]
        );
        let reply = Reply::Error {
            code: ErrorCode::IndexOutOfRange,
            message: "index 9".into(),
        };
        assert_eq!(
            decode_reply(&encode_reply(&reply).unwrap()).unwrap().0,
            reply
        );
    }

    /// A reply's head is known once its first bytes arrive, with the length of the whole
    /// message; before that there is nothing to know, and a bad head is an error at once.
    #[test]
    fn heads_decode_from_the_first_chunks() {
        let reply = Reply::Gather {
            lengths: vec![vec![3, 0, 5], vec![1, 1, 1]],
        };
        let head = encode_reply(&reply).unwrap();
        let whole = [head.clone(), b"abcdefgh123".to_vec()].concat();
        for arrived in 0..=whole.len() {
            let chunks: Vec<bytes::Bytes> = whole[..arrived]
                .chunks(5)
                .map(bytes::Bytes::copy_from_slice)
                .collect();
            match decode_reply_head(&chunks).unwrap() {
                Some((back, len)) => {
                    assert!(arrived >= head.len(), "decoded from {arrived} bytes");
                    assert_eq!(back, reply);
                    assert_eq!(len, whole.len() as u64);
                }
                None => assert!(arrived < head.len(), "not decoded from {arrived} bytes"),
            }
        }
        let mut bad = head.clone();
        bad[0] = b'X';
        assert!(decode_reply_head(&[bytes::Bytes::from(bad)]).is_err());
        let uneven = encode_reply(&Reply::Gather {
            lengths: vec![vec![1, 2], vec![3]],
        })
        .unwrap();
        assert!(decode_reply_head(&[bytes::Bytes::from(uneven)]).is_err());
    }

    #[test]
    fn replies_decode_the_same_from_any_chunking() {
        let reply = Reply::Gather {
            lengths: vec![vec![3, 0, 5], vec![1, 1, 1]],
        };
        let whole = [encode_reply(&reply).unwrap(), b"abcdefgh123".to_vec()].concat();
        for cut in [1, 5, 12, 13, whole.len() - 1] {
            for step in [cut, 1] {
                let chunks: Vec<bytes::Bytes> = whole
                    .chunks(step)
                    .map(bytes::Bytes::copy_from_slice)
                    .collect();
                let (back, body_start) = decode_reply_chunks(&chunks).unwrap();
                assert_eq!(back, reply);
                assert_eq!(&whole[body_start..], b"abcdefgh123");
            }
        }
        // Truncated anywhere: an error.
        for cut in 0..whole.len() {
            let chunks = vec![bytes::Bytes::copy_from_slice(&whole[..cut])];
            assert!(decode_reply_chunks(&chunks).is_err(), "cut {cut}");
        }
    }

    #[test]
    fn hostile_messages_are_errors() {
        let good = encode_request(&node(NodeRequest::Gather {
            indices: vec![1, 2, 3],
            fields: vec![],
            checked: false,
        }))
        .unwrap();
        // Every truncation, and every single-byte corruption, decodes to an error or to a
        // valid request — never a panic.
        for cut in 0..good.len() {
            assert!(decode_request::<NodeMessage>(&good[..cut]).is_err());
        }
        for i in 0..good.len() {
            for flip in [1u8, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] ^= flip;
                let _ = decode_request::<NodeMessage>(&bad);
            }
        }
        // A length prefix claiming 2^60 indices is refused without allocating them.
        let mut bomb = good.clone();
        let at = PREFIX_BYTES + 1 + 8 + 4; // after no cluster, the map version, the enum tag
        bomb[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(decode_request::<NodeMessage>(&bomb).is_err());
        // Body sizes must match the lengths.
        let append = encode_request(&node(NodeRequest::Append {
            runs: vec![Run {
                slot: 0,
                at: 0,
                count: 1,
            }],
            token: None,
            fields: vec!["a".into()],
            lengths: vec![vec![4]],
        }))
        .unwrap();
        assert!(decode_request::<NodeMessage>(&message(append.clone(), b"abc")).is_err());
        assert!(decode_request::<NodeMessage>(&message(append, b"abcd")).is_ok());
        // Another version is named in the error.
        let mut other = good;
        other[4] = 99;
        let e = decode_request::<NodeMessage>(&other).unwrap_err();
        assert!(matches!(e, Error::Version { theirs: 99, .. }), "{e}");
        assert!(e.to_string().contains("version 99"), "{e}");
    }

    /// A peer of the previous protocol version (16: dataset listings without their changes) is refused
    /// by both protocols' decoders and by the reply decoder, naming both versions — never
    /// read as this version's layout (ops/README.md, Upgrading).
    #[test]
    fn the_previous_version_is_refused_by_name() {
        let previous = (WIRE_VERSION - 1).to_le_bytes();
        let at = MAGIC.len();
        let named = |e: Error| {
            assert!(
                matches!(
                    e,
                    Error::Version {
                        theirs: 16,
                        ours: 17
                    }
                ),
                "{e}"
            );
            assert!(
                e.to_string()
                    .contains("unsupported protocol version 16 (this build speaks 17)"),
                "{e}"
            );
        };
        let mut node = encode_request(&NodeMessage::unchecked(NodeRequest::Info)).unwrap();
        node[at..at + 2].copy_from_slice(&previous);
        named(decode_request::<NodeMessage>(&node).unwrap_err());
        let mut client = encode_request(&ClientMessage::new(None, ClientRequest::Info)).unwrap();
        client[at..at + 2].copy_from_slice(&previous);
        named(decode_request::<ClientMessage>(&client).unwrap_err());
        let mut reply = encode_reply(&Reply::Moving(None)).unwrap();
        reply[at..at + 2].copy_from_slice(&previous);
        named(decode_reply(&reply).unwrap_err());
    }

    /// A zstd dictionary names itself by its header; a create's dictionaries are for its
    /// fields and bounded in size.
    #[test]
    fn dictionaries_are_named_and_bounded() {
        let mut dict = 0xEC30_A437u32.to_le_bytes().to_vec();
        dict.extend_from_slice(&77u32.to_le_bytes());
        dict.extend_from_slice(b"entropy tables and content");
        assert_eq!(zstd_dict_id(&dict), Some(77));
        assert_eq!(DictRef::of(&dict).map(|d| d.id), Some(77));
        assert_eq!(zstd_dict_id(&dict[..7]), None);
        assert_eq!(zstd_dict_id(b"plain text, no dictionary"), None);
        let mut no_id = dict.clone();
        no_id[4..8].copy_from_slice(&[0; 4]);
        assert_eq!(zstd_dict_id(&no_id), None);
        let create = |field: &str, bytes: Vec<u8>| {
            let message = ClientMessage::new(
                Some("captions"),
                ClientRequest::CreateDataset {
                    fields: vec![FieldInfo::new("c", "zstd")],
                    dicts: vec![FieldDict {
                        field: field.into(),
                        bytes,
                    }],
                },
            );
            decode_request::<ClientMessage>(&encode_request(&message).unwrap()).map(|_| ())
        };
        assert!(create("c", dict.clone()).is_ok());
        let e = create("d", dict).unwrap_err();
        assert!(e.to_string().contains("field 'd'"), "{e}");
        let e = create("c", vec![0; DICT_BYTES_MAX + 1]).unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
    }

    /// A dataset name outside the pattern is refused before anything else, and a message
    /// naming none addresses the default dataset.
    #[test]
    fn dataset_names_follow_the_pattern() {
        for good in ["default", "imagenet-1k", "a", "0.v2_b", &"x".repeat(64)] {
            assert_eq!(check_dataset_name(good), Ok(()), "{good}");
        }
        for bad in ["", "Images", "-a", ".a", "a/b", "a b", &"x".repeat(65), "é"] {
            assert!(check_dataset_name(bad).is_err(), "{bad}");
            let message = ClientMessage::new(Some(bad), ClientRequest::Info);
            let bytes = encode_request(&message).unwrap();
            let e = decode_request::<ClientMessage>(&bytes);
            assert!(matches!(e, Err(Error::Malformed(_))), "{bad}: {e:?}");
        }
        assert_eq!(
            ClientMessage::new(None, ClientRequest::Info).dataset(),
            "default"
        );
    }

    /// A client's request and a node's are different messages: a node refuses a client's
    /// unread, and a router a node's, so an internal request cannot come from a client.
    #[test]
    fn the_two_protocols_do_not_mix() {
        let sent = ClientMessage::new(Some("text"), ClientRequest::Delete { index: 7 });
        let client = encode_request(&sent).unwrap();
        let (back, _) = decode_request::<ClientMessage>(&client).unwrap();
        assert_eq!(back.dataset(), "text");
        assert_eq!(back.request, ClientRequest::Delete { index: 7 });
        let e = decode_request::<NodeMessage>(&client).unwrap_err();
        assert!(matches!(e, Error::Malformed(_)), "{e}");
        let fence = encode_request(&node(NodeRequest::Fence { token: 3 })).unwrap();
        assert!(decode_request::<ClientMessage>(&fence).is_err());
        // A cluster id past the limit is refused before anything else.
        let long = NodeMessage::new(&"c".repeat(200), 1, None, NodeRequest::Info);
        assert!(decode_request::<NodeMessage>(&encode_request(&long).unwrap()).is_err());
    }

    fn node(request: NodeRequest) -> NodeMessage {
        NodeMessage::unchecked(request)
    }

    use proptest::prelude::*;

    fn request() -> impl Strategy<Value = (NodeRequest, Vec<u8>)> {
        let names = proptest::collection::vec("[a-z]{0,8}", 0..4);
        prop_oneof![
            Just((NodeRequest::Info, Vec::new())),
            Just((NodeRequest::Commit, Vec::new())),
            (
                proptest::collection::vec((any::<u32>(), any::<u64>()), 0..8),
                any::<u64>()
            )
                .prop_map(|(slots, token)| (NodeRequest::Truncate { slots, token }, Vec::new())),
            any::<u64>().prop_map(|token| (NodeRequest::Fence { token }, Vec::new())),
            (
                proptest::collection::vec(any::<u64>(), 0..64),
                names.clone(),
                any::<bool>()
            )
                .prop_map(|(indices, fields, checked)| (
                    NodeRequest::Gather {
                        indices,
                        fields,
                        checked
                    },
                    Vec::new()
                )),
            (
                names,
                proptest::collection::vec(0u32..40, 0..20),
                any::<u32>(),
                any::<Option<u64>>()
            )
                .prop_map(|(fields, lens, slot, token)| {
                    let lengths: Vec<Vec<u32>> = fields.iter().map(|_| lens.clone()).collect();
                    let total: u32 = lengths.iter().flatten().sum();
                    let body = vec![0xab; total as usize];
                    let runs = vec![Run {
                        slot,
                        at: 0,
                        count: lengths.first().map_or(0, Vec::len) as u64,
                    }];
                    (
                        NodeRequest::Append {
                            runs,
                            token,
                            fields,
                            lengths,
                        },
                        body,
                    )
                }),
        ]
    }

    /// What a decoded request promises its user: bodies that match their lengths.
    fn consistent(request: &NodeRequest, body: &[u8]) {
        if let NodeRequest::Append { lengths, .. } = request {
            let columns = split_columns(lengths, body);
            for (column, lens) in columns.iter().zip(lengths) {
                for (payload, &len) in column.iter().zip(lens) {
                    assert_eq!(payload.len(), len as usize);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        // Fuzz targets: arbitrary bytes never panic any decoder.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok((message, body)) = decode_request::<NodeMessage>(&bytes) {
                consistent(&message.request, body);
            }
            let _ = decode_reply(&bytes);
            let mut framed = [MAGIC.to_vec(), WIRE_VERSION.to_le_bytes().to_vec()].concat();
            framed.extend_from_slice(&bytes);
            let _ = decode_request::<NodeMessage>(&framed);
            let _ = decode_reply(&framed);
        }

        // Valid messages round-trip; every truncation is an error; any corruption is an error
        // or a request whose body matches its lengths.
        #[test]
        fn valid_messages_round_trip_and_damage_is_caught(
            (request, body) in request(),
            at in any::<prop::sample::Index>(),
            flip in 1u8..,
        ) {
            let sent = node(request);
            let message = [encode_request(&sent).unwrap(), body.clone()].concat();
            let (back, back_body) = decode_request::<NodeMessage>(&message).unwrap();
            prop_assert_eq!(&back, &sent);
            prop_assert_eq!(back_body, &body[..]);
            let cut = at.index(message.len());
            prop_assert!(decode_request::<NodeMessage>(&message[..cut]).is_err());
            let mut damaged = message.clone();
            damaged[cut] ^= flip;
            if let Ok((message, body)) = decode_request::<NodeMessage>(&damaged) {
                consistent(&message.request, body);
            }
        }

        #[test]
        fn gather_replies_check_their_bodies(
            lens in proptest::collection::vec(0u32..50, 0..30),
            extra in 0usize..3,
        ) {
            let header = encode_reply(&Reply::Gather { lengths: vec![lens.clone()] }).unwrap();
            let total: usize = lens.iter().map(|&l| l as usize).sum();
            let ok = [header.clone(), vec![1; total]].concat();
            prop_assert!(decode_reply(&ok).is_ok());
            let long = [header.clone(), vec![1; total + 1 + extra]].concat();
            prop_assert!(decode_reply(&long).is_err());
            if total > 0 {
                let short = [header, vec![1; total - 1]].concat();
                prop_assert!(decode_reply(&short).is_err());
            }
        }
    }
}
