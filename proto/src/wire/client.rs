//! What a client asks of a router: the request, the message that carries it, and the
//! roles that may send it.

use super::*;

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
    /// Refuse the certificates issued under `name` (`zr cluster issue --name`) on every
    /// router and node from now on (`undo`: serve them again). Reply: `Revoked`, the names
    /// refused after it.
    Revoke { name: String, undo: bool },
    /// Add `grant` (`undo`: take it out); `create_later`: its pattern may name a dataset not
    /// created yet. Reply: `Grants`, every grant after it.
    Grant {
        grant: Grant,
        undo: bool,
        create_later: bool,
    },
    /// Every grant. Reply: `Grants`.
    Grants,
    /// Refuse the one certificate of serial number `serial` (lower-case hex, as `zr cluster
    /// issue` prints it) on every router and node from now on (`undo`: serve it again).
    /// Reply: `Revoked`, the serial numbers refused after it.
    RevokeSerial { serial: String, undo: bool },
}

/// What a certificate name may do beyond its role's default: read (`write`: also write)
/// the datasets `pattern` covers — a dataset's name, or a prefix ending in `*` (`*` alone:
/// every dataset). A role still bounds it: a reader granted write only reads.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Grant {
    pub who: String,
    pub write: bool,
    pub pattern: String,
}

impl Grant {
    /// Whether its pattern covers dataset `dataset`.
    pub fn covers(&self, dataset: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => dataset.starts_with(prefix),
            None => self.pattern == dataset,
        }
    }

    /// Checks the name and the pattern: a dataset name (see [`check_dataset_name`]), or a
    /// prefix of one followed by `*`, or `*`.
    pub fn check(&self) -> Result<(), Error> {
        if self.who.is_empty() || self.who.len() > CERT_NAME_BYTES_MAX {
            return Err(Error::Malformed(format!(
                "a grant to a name of {} bytes (1 to {CERT_NAME_BYTES_MAX})",
                self.who.len()
            )));
        }
        let bad = || {
            Error::Malformed(format!(
                "grant pattern {:?}: a dataset's name, or the start of one followed by '*' (imgs*), or '*'",
                self.pattern
            ))
        };
        match self.pattern.strip_suffix('*') {
            Some("") => Ok(()),
            Some(prefix) => check_dataset_name(prefix).map_err(|_| bad()),
            None => check_dataset_name(&self.pattern).map_err(|_| bad()),
        }
    }
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
            | ClientRequest::MoveShards { .. }
            | ClientRequest::Revoke { .. }
            | ClientRequest::Grant { .. }
            | ClientRequest::Grants
            | ClientRequest::RevokeSerial { .. } => Access::Operate,
        }
    }

    /// For a request on its dataset's records, whether it writes them (`Some(false)`: it
    /// reads them); `None` for the others (the cluster's state, the listing, admin). What a
    /// grant (`zr grant`) must cover.
    pub fn on_records(&self) -> Option<bool> {
        match self {
            ClientRequest::Info
            | ClientRequest::Gather { .. }
            | ClientRequest::WaitLen { .. }
            | ClientRequest::Topology { .. } => Some(false),
            ClientRequest::Append { .. }
            | ClientRequest::Modify { .. }
            | ClientRequest::WriteField { .. }
            | ClientRequest::Delete { .. }
            | ClientRequest::Commit => Some(true),
            _ => None,
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
            ClientRequest::Revoke { .. } => "revoke",
            ClientRequest::Grant { undo: false, .. } => "grant",
            ClientRequest::Grant { undo: true, .. } => "revoke-grant",
            ClientRequest::Grants => "grants",
            ClientRequest::RevokeSerial { .. } => "revoke-serial",
        }
    }
}
