//! What a router asks of a node, and the message that carries it: the cluster and map it
//! was placed by, and the node it is meant for.

use super::*;

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
