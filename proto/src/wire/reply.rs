//! What comes back: the replies, and the reports and descriptions they carry.

use super::*;

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
    /// The certificate names the cluster refuses (see `ClientRequest::Revoke`), or its
    /// serial numbers (`ClientRequest::RevokeSerial`).
    Revoked {
        names: Vec<String>,
    },
    /// Every grant (see `ClientRequest::Grant`).
    Grants {
        grants: Vec<super::Grant>,
    },
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
