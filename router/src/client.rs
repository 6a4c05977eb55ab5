//! The store's operations against a router: [`AsyncClient`] for async callers, and
//! [`Client`], the same with a blocking API (it runs its own small tokio runtime), so
//! training code and the loader use it like a local `Store`.

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, Endpoint};
use zr_common::{BoxError, Contiguous, GatherSource, Record};
use zr_net::{self as net, Security};
use zr_proto::assemble::{decode_gather_parts, reassemble, PartReply};
use zr_proto::chunks::Chunks;
use zr_proto::wire::{self, ClientRequest, FieldDict, FieldInfo, Reply};
use zr_service::config::CLIENT_TIMEOUT_MS_DEFAULT;

use crate::direct::{self, Direct, Gathered};
use crate::error::Error;

/// Records encoded for the wire: field names, `lengths[f][k]`, one body piece per field.
type Encoded = (Vec<String>, Vec<Vec<u32>>, Vec<Bytes>);
/// One record encoded for the wire: field names, lengths, the body.
type EncodedOne = (Vec<String>, Vec<u32>, Vec<Bytes>);

/// A connection to a router, for async callers (inside a tokio runtime). A connection the
/// router closed (a restart, an idle timeout) is reopened before the next call; a call that
/// fails midway is not retried (an append might have landed), its error is returned; so is
/// a call whose future is dropped: its exchange runs on to its reply or its timeout.
/// [`Client`] is the same with a blocking API.
///
/// A client addresses one dataset (the default one, as connected); [`AsyncClient::dataset`]
/// gives a handle on another over the same connection.
pub struct AsyncClient {
    link: Arc<Link>,
    /// The dataset addressed (`None`: the default one).
    dataset: Option<String>,
    fields: Vec<FieldInfo>,
}

/// A connection to a router, shared by a client's dataset handles; closed when the last
/// one goes.
struct Link {
    endpoint: Endpoint,
    security: Security,
    addr: SocketAddr,
    connection: std::sync::Mutex<Connection>,
    timeout: Duration,
    /// Gathers one hop, straight from the nodes (`None`: through the router); set once at
    /// connect.
    direct: std::sync::OnceLock<Option<Direct>>,
}

/// How a client connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// Bound on every network wait. Make it longer than the router's `timeout_ms`, so that
    /// a failed node is reported naming its shard rather than by this client's own timeout.
    pub timeout: Duration,
    /// Gathers go straight to the nodes (one hop) once the router has said where they are;
    /// `false` reads through the router. Writes, commits and admin requests always go
    /// through the router. A client that cannot reach any node at connect reads through the
    /// router, and says so once in its log.
    pub direct: bool,
    /// Connections to each node for one-hop gathers, taken in turn (0: by the core count,
    /// one per four cores beyond four, up to four).
    pub connections_per_node: usize,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            timeout: Duration::from_millis(CLIENT_TIMEOUT_MS_DEFAULT),
            direct: true,
            connections_per_node: 0,
        }
    }
}

impl std::fmt::Debug for AsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClient")
            .field("router", &self.link.addr)
            .field("dataset", &self.name())
            .finish()
    }
}

impl AsyncClient {
    /// Connects to the router at `addr` with `security` (a client identity from the
    /// cluster's certificate directory: `Security::load(dir, Role::Writer)`), with `timeout`
    /// for every network wait. Make it longer than the router's `timeout_ms`, so that a
    /// failed node is reported by the router (naming the shard) rather than by this client's
    /// own timeout.
    pub async fn connect(
        addr: SocketAddr,
        security: Security,
        timeout: Duration,
    ) -> Result<AsyncClient, Error> {
        let options = ClientOptions {
            timeout,
            ..ClientOptions::default()
        };
        AsyncClient::connect_with(addr, security, options).await
    }

    /// Connects to the router at `addr` as `options` say: gathers one hop, straight from the
    /// nodes, unless `options.direct` is false or no node can be reached.
    pub async fn connect_with(
        addr: SocketAddr,
        security: Security,
        options: ClientOptions,
    ) -> Result<AsyncClient, Error> {
        let timeout = options.timeout;
        let endpoint = net::client_endpoint(addr)?;
        let connection = net::connect(&endpoint, &security, addr, timeout)
            .await
            .map_err(Error::Router)?;
        let mut client = AsyncClient {
            link: Arc::new(Link {
                endpoint,
                security,
                addr,
                connection: std::sync::Mutex::new(connection),
                timeout,
                direct: std::sync::OnceLock::new(),
            }),
            dataset: None,
            fields: Vec::new(),
        };
        // The first request also completes authentication: a router that refuses this
        // client's certificate says so here.
        let (_, fields) = client.info().await?;
        client.fields = fields;
        let direct = match options.direct {
            true => client.connect_direct(options.connections_per_node).await,
            false => None,
        };
        let _ = client.link.direct.set(direct);
        Ok(client)
    }

    /// Links to the nodes for one-hop gathers, or `None` (said in the log) if the router
    /// cannot describe them or none answers.
    async fn connect_direct(&self, connections: usize) -> Option<Direct> {
        let connections = match connections {
            0 => direct::connections_per_node(),
            n => n,
        };
        let described = async {
            let topology = direct::topology_of(
                self.call(&ClientRequest::Topology { covering: 0 }, Vec::new())
                    .await?
                    .0,
            )?;
            Direct::connect(
                self.name(),
                topology,
                self.link.security.clone(),
                self.link.timeout,
                connections,
            )
            .await
        };
        match described.await {
            Ok(direct) => Some(direct),
            Err(e) => {
                tracing::warn!(
                    "gathers go through the router at {}: the nodes cannot be read directly ({e})",
                    self.link.addr
                );
                None
            }
        }
    }

    /// True if gathers go straight to the nodes (one hop), false if through the router.
    pub fn reads_direct(&self) -> bool {
        self.link.direct().is_some()
    }

    /// The router's address.
    pub fn router(&self) -> SocketAddr {
        self.link.addr
    }

    /// The name of the dataset this handle addresses.
    pub fn name(&self) -> &str {
        self.dataset.as_deref().unwrap_or(wire::DEFAULT_DATASET)
    }

    /// A handle on dataset `name` over the same connection (refused if the cluster has no
    /// such dataset).
    pub async fn dataset(&self, name: &str) -> Result<AsyncClient, Error> {
        wire::check_dataset_name(name).map_err(|e| Error::Proto(e.into()))?;
        let mut handle = self.addressing(name);
        handle.fields = handle.info().await?.1;
        Ok(handle)
    }

    /// A handle on dataset `name` over the same connection, not yet checked (it knows no
    /// fields).
    fn addressing(&self, name: &str) -> AsyncClient {
        AsyncClient {
            link: Arc::clone(&self.link),
            dataset: (name != wire::DEFAULT_DATASET).then(|| name.to_string()),
            fields: Vec::new(),
        }
    }

    /// The open connection, reopened first if the router closed it.
    async fn connection(&self) -> Result<Connection, Error> {
        let link = &self.link;
        let lock = || {
            link.connection
                .lock()
                .map_err(|_| Error::Client("the connection lock is poisoned".into()))
        };
        let open = lock()?.clone();
        if open.close_reason().is_none() {
            return Ok(open);
        }
        let fresh = net::connect(&link.endpoint, &link.security, link.addr, link.timeout)
            .await
            .map_err(Error::Router)?;
        *lock()? = fresh.clone();
        Ok(fresh)
    }

    /// Sends `request` and returns the reply with the chunks it arrived in (no copy) and
    /// where its body starts in them.
    async fn call(
        &self,
        request: &ClientRequest,
        body: Vec<Bytes>,
    ) -> Result<(Reply, Vec<Bytes>, usize), Error> {
        let mut connection = self.connection().await?;
        let timeout = self.link.timeout;
        let chunks = loop {
            let header = wire::encode_client_request(self.dataset.as_deref(), request)?;
            // The exchange runs as a task of its own, beside the connection's driver: each
            // packet it reads wakes it there, not a thread blocked on it.
            let exchange = {
                let (connection, body) = (connection.clone(), body.clone());
                tokio::spawn(
                    async move { net::call_chunks(&connection, header, body, timeout).await },
                )
            };
            let called = exchange
                .await
                .map_err(|e| Error::Client(format!("the call task failed: {e}")))?;
            match called {
                Ok(chunks) => break chunks,
                // The router closed the connection as idle just as this call began: it had
                // no request in flight, so this one was never carried out. Once more, anew.
                Err(_) if reclaimed(&connection) => connection = self.connection().await?,
                Err(e) => return Err(Error::Router(e)),
            }
        };
        let (reply, body_start) = wire::decode_reply_chunks(&chunks)?;
        if let Reply::Error { code, message } = reply {
            if code == wire::ErrorCode::NoSuchDataset && !self.fields.is_empty() {
                // This handle found its dataset when it was made.
                return Err(Error::Dropped {
                    dataset: self.name().to_string(),
                    message,
                });
            }
            return Err(zr_proto::Error::Remote { code, message }.into());
        }
        Ok((reply, chunks, body_start))
    }

    /// Length and fields.
    pub async fn info(&self) -> Result<(u64, Vec<FieldInfo>), Error> {
        match self.call(&ClientRequest::Info, Vec::new()).await?.0 {
            Reply::Info { len, fields, .. } => Ok((len, fields)),
            other => Err(unexpected("info", &other)),
        }
    }

    /// Number of records.
    pub async fn len(&self) -> Result<u64, Error> {
        Ok(self.info().await?.0)
    }

    /// True if the cluster holds no records.
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// The dataset's fields (as of connecting).
    pub fn fields(&self) -> &[FieldInfo] {
        &self.fields
    }

    /// The cluster as the router sees it: id, map version, committed length, every node.
    pub async fn status(&self) -> Result<wire::ClusterStatus, Error> {
        match self.call(&ClientRequest::Status, Vec::new()).await?.0 {
            Reply::Status(status) => Ok(status),
            other => Err(unexpected("status", &other)),
        }
    }

    /// The cluster map placing this handle's dataset, as the router places by it now.
    pub async fn map(&self) -> Result<zr_proto::placement::ClusterMap, Error> {
        let request = ClientRequest::Topology { covering: 0 };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Topology(topology) => Ok(topology.map),
            other => Err(unexpected("topology", &other)),
        }
    }

    /// Serves shard `shard`'s replica `replica` from the (new, empty) node at `addr` from
    /// now on: the router records the move, then rebuilds the node from an in-sync partner
    /// before it serves. Returns the cluster's status once the move is recorded; the rebuild
    /// shows in later ones (`NodeStatus::rebuild`, then `in_sync`).
    pub async fn replace_node(
        &self,
        shard: u32,
        replica: u32,
        addr: SocketAddr,
    ) -> Result<wire::ClusterStatus, Error> {
        let request = ClientRequest::ReplaceNode {
            shard,
            replica,
            addr: addr.to_string(),
        };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Status(status) => Ok(status),
            other => Err(unexpected("replace-node", &other)),
        }
    }

    /// Starts moving the cluster to the map with `change` (or goes on with that move, if it
    /// stopped); returns at once. `nodes`: (shard, replica, address) of nodes the router may
    /// not know yet — a new shard's, from the operator's nodes.toml. See
    /// [`Self::move_progress`]. Files are copied at the router's default rate.
    pub async fn move_shards(
        &self,
        change: wire::MapChange,
        nodes: Vec<(u32, u32, SocketAddr)>,
    ) -> Result<Option<wire::MoveReport>, Error> {
        self.move_shards_at(change, nodes, None).await
    }

    /// [`Self::move_shards`], with each node gaining slots copying their files at most
    /// `rate` bytes a second (`Some(0)`: as fast as it can; `None`: the router's default,
    /// [`wire::MOVE_RATE_DEFAULT`]).
    pub async fn move_shards_at(
        &self,
        change: wire::MapChange,
        nodes: Vec<(u32, u32, SocketAddr)>,
        rate: Option<u64>,
    ) -> Result<Option<wire::MoveReport>, Error> {
        let nodes = nodes
            .into_iter()
            .map(|(shard, replica, addr)| (shard, replica, addr.to_string()))
            .collect();
        let request = ClientRequest::MoveShards {
            change,
            nodes,
            rate,
        };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Moving(report) => Ok(report),
            other => Err(unexpected("move-shards", &other)),
        }
    }

    /// The move the router runs, or ran last: its progress, or how it ended.
    pub async fn move_progress(&self) -> Result<Option<wire::MoveReport>, Error> {
        match self.call(&ClientRequest::MoveProgress, Vec::new()).await?.0 {
            Reply::Moving(report) => Ok(report),
            other => Err(unexpected("move-progress", &other)),
        }
    }

    /// Scrubs records `start..start + count` of shard `shard` (shard-local indices): each
    /// read on every in-sync replica against its CRC, the copies compared, and what fails or
    /// differs repaired from a good copy.
    pub async fn scrub(
        &self,
        shard: u32,
        start: u64,
        count: u64,
    ) -> Result<wire::ScrubReport, Error> {
        let request = ClientRequest::Scrub {
            shard,
            start,
            count,
        };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Scrubbed(report) => Ok(report),
            other => Err(unexpected("scrub", &other)),
        }
    }

    /// Gathers `indices` for `fields` (empty = all): one column per field, in caller order.
    pub async fn gather(&self, indices: &[u64], fields: &[&str]) -> Result<Vec<Contiguous>, Error> {
        self.gather_with(indices, fields, false).await
    }

    /// [`Self::gather`], each record read against its CRC: a damaged copy is read from
    /// another replica instead (and repaired), or fails the gather naming it.
    pub async fn gather_checked(
        &self,
        indices: &[u64],
        fields: &[&str],
    ) -> Result<Vec<Contiguous>, Error> {
        self.gather_with(indices, fields, true).await
    }

    async fn gather_with(
        &self,
        indices: &[u64],
        fields: &[&str],
        checked: bool,
    ) -> Result<Vec<Contiguous>, Error> {
        self.across_map_switches(|| self.gather_once(indices, fields, checked))
            .await
            .map_err(|e| self.dropped(e))
    }

    /// `e`, said as the dataset's drop if that is what it is: a node refusing a part of a
    /// gather for a dataset this handle found when it was made.
    fn dropped(&self, e: Error) -> Error {
        match e {
            Error::Proto(zr_proto::Error::Remote { code, message })
                if code == wire::ErrorCode::NoSuchDataset && !self.fields.is_empty() =>
            {
                Error::Dropped {
                    dataset: self.name().to_string(),
                    message,
                }
            }
            other => other,
        }
    }

    /// [`Self::gather`] of records that may not be committed yet: waits until they are,
    /// `wait` at most (then fails, naming the length reached), then gathers them. No polling
    /// here: the router answers the wait once a commit covers them, and holds nothing of
    /// the gather meanwhile.
    pub async fn gather_waiting(
        &self,
        indices: &[u64],
        fields: &[&str],
        wait: Duration,
    ) -> Result<Vec<Contiguous>, Error> {
        if let Some(last) = indices.iter().copied().max() {
            let needed = last.checked_add(1).ok_or_else(|| {
                zr_proto::Error::Malformed(format!("index {last} cannot be committed"))
            })?;
            self.wait_len(needed, wait.max(Duration::from_millis(1)))
                .await
                .map_err(|e| self.dropped(e))?;
        }
        self.gather(indices, fields).await
    }

    /// Waits until the dataset has committed at least `len` records, `timeout` at most;
    /// returns its committed length then.
    pub async fn wait_len(&self, len: u64, timeout: Duration) -> Result<u64, Error> {
        let wait_ms = timeout.as_millis().min(wire::WAIT_MS_MAX as u128) as u32;
        match self
            .call(&ClientRequest::WaitLen { len, wait_ms }, Vec::new())
            .await?
            .0
        {
            Reply::Info { len, .. } => Ok(len),
            other => Err(unexpected("wait-len", &other)),
        }
    }

    /// The cluster's datasets: name, records, committed, fields, bytes.
    pub async fn datasets(&self) -> Result<Vec<wire::DatasetInfo>, Error> {
        match self.call(&ClientRequest::Datasets, Vec::new()).await?.0 {
            Reply::Datasets(all) => Ok(all),
            other => Err(unexpected("datasets", &other)),
        }
    }

    /// Creates dataset `name` with `fields` (operator role); returns a handle on it.
    pub async fn create_dataset(
        &self,
        name: &str,
        fields: Vec<FieldInfo>,
    ) -> Result<AsyncClient, Error> {
        self.create_dataset_with_dicts(name, fields, Vec::new())
            .await
    }

    /// Creates dataset `name` with `fields`, zstd fields among them compressed with the
    /// dictionaries `dicts` (e.g. trained by `zr_node::dict::train` on a sample of the
    /// records to come); returns a handle on it. The cluster keeps each dictionary in its
    /// metadata store and gives it to every node holding the dataset, now or later.
    pub async fn create_dataset_with_dicts(
        &self,
        name: &str,
        fields: Vec<FieldInfo>,
        dicts: Vec<FieldDict>,
    ) -> Result<AsyncClient, Error> {
        self.addressing(name)
            .call(&ClientRequest::CreateDataset { fields, dicts }, Vec::new())
            .await?;
        self.dataset(name).await
    }

    /// Drops dataset `name` and every record in it (operator role).
    pub async fn drop_dataset(&self, name: &str) -> Result<(), Error> {
        self.addressing(name)
            .call(&ClientRequest::DropDataset, Vec::new())
            .await
            .map(|_| ())
    }

    /// Adds `field` to this handle's dataset (operator role): the records stored so far
    /// lack it until written ([`Self::write_field`]). The handle knows it from then on.
    pub async fn add_field(&mut self, field: FieldInfo) -> Result<(), Error> {
        self.call(
            &ClientRequest::AddField {
                field: field.clone(),
            },
            Vec::new(),
        )
        .await?;
        self.fields.push(field);
        Ok(())
    }

    /// Writes field `field` of records `start..start + values.len()`, their other fields
    /// unchanged.
    pub async fn write_field(
        &self,
        field: &str,
        start: u64,
        values: &[&[u8]],
    ) -> Result<(), Error> {
        if !self.fields.iter().any(|f| f.name == field) {
            return Err(Error::UnknownField {
                name: field.to_string(),
                known: self
                    .fields
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let request = ClientRequest::WriteField {
            field: field.to_string(),
            start,
            lengths: values.iter().map(|v| v.len() as u32).collect(),
        };
        let body = vec![Bytes::from(values.concat())];
        self.call(&request, body).await.map(|_| ())
    }

    /// Runs `call` again while the router answers that a node serves another map than the
    /// one the router placed by (a move switching the cluster to its next map: the router
    /// reloads it meanwhile), for up to the client's timeout. Such a refusal changed nothing.
    async fn across_map_switches<'a, T, F, Fut>(&'a self, mut call: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>> + 'a,
    {
        let deadline = tokio::time::Instant::now() + self.link.timeout;
        let mut pause = std::time::Duration::from_millis(5);
        loop {
            match call().await {
                Err(e)
                    if e.code() == Some(wire::ErrorCode::StaleMap)
                        && tokio::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }

    async fn gather_once(
        &self,
        indices: &[u64],
        fields: &[&str],
        checked: bool,
    ) -> Result<Vec<Contiguous>, Error> {
        // Checked gathers (a damaged copy is repaired) are the router's to serve.
        if let Some(direct) = self.link.direct().filter(|_| !checked) {
            // Each wait of a one-hop gather is bounded by the timeout (a node's reply, a call
            // to the router) and its retries stop at it: one still going at twice the
            // timeout has lost its way (seen hanging for good in measurements, cause not
            // found). It is given up, and the router serves the gather.
            let bound = self.link.timeout * 2;
            match tokio::time::timeout(bound, self.gather_direct(direct, indices, fields)).await {
                Ok(gathered) => match gathered? {
                    Gathered::Columns(columns) => return Ok(columns),
                    Gathered::ViaRouter(why) => {
                        tracing::debug!("a gather goes through the router: {why}");
                    }
                },
                Err(_) => {
                    metrics::counter!("zr_client_direct_gathers_given_up_total").increment(1);
                    tracing::warn!(
                        "a one-hop gather of {} records had no end within {} ms; the router serves it",
                        indices.len(),
                        bound.as_millis()
                    );
                }
            }
        }
        let request = ClientRequest::Gather {
            indices: indices.to_vec(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
            checked,
        };
        let (reply, chunks, body_start) = self.call(&request, Vec::new()).await?;
        let mut body = Chunks::new(&chunks);
        // The head was decoded already: the body is what follows it.
        body.skip(body_start);
        match reply {
            // Streamed as the shards answered: put the parts in order here.
            Reply::GatherParts { records, parts } => {
                if records as usize != indices.len() {
                    return Err(zr_proto::Error::Malformed(format!(
                        "the router answered a gather of {} records with {records}",
                        indices.len()
                    ))
                    .into());
                }
                let fields = if fields.is_empty() {
                    self.fields.len()
                } else {
                    fields.len()
                };
                Ok(decode_gather_parts(records, parts, fields, body)?)
            }
            Reply::Gather { lengths } => {
                let positions: Vec<u32> = (0..indices.len() as u32).collect();
                let whole = PartReply {
                    positions: &positions,
                    lengths: &lengths,
                    body,
                };
                let parts: &[PartReply] = if lengths.is_empty() { &[] } else { &[whole] };
                reassemble(indices.len(), lengths.len(), parts)
                    .map_err(|e| zr_proto::Error::Malformed(e.to_string()).into())
            }
            other => Err(unexpected("gather", &other)),
        }
    }

    /// The topology of this handle's dataset, fresh from the router (its length read
    /// afresh from the nodes if `covering` is past the router's), taken as the one one-hop
    /// gathers go by.
    async fn topology(&self, direct: &Direct, covering: u64) -> Result<Arc<direct::View>, Error> {
        let request = ClientRequest::Topology { covering };
        let topology = direct::topology_of(self.call(&request, Vec::new()).await?.0)?;
        direct.adopt(self.name(), &topology).await
    }

    /// [`Self::gather_once`] one hop: planned by the map the router last gave, read from
    /// the nodes. An index past the length known asks the router for it again; a node placed
    /// by another map makes this take the topology anew and try again within the client's
    /// timeout; a shard that failed is tried again if the router's description changed
    /// meanwhile, and else read through the router.
    async fn gather_direct(
        &self,
        direct: &Direct,
        indices: &[u64],
        fields: &[&str],
    ) -> Result<Gathered, Error> {
        let deadline = tokio::time::Instant::now() + self.link.timeout;
        let mut pause = Duration::from_millis(5);
        let covering = indices.iter().copied().max().unwrap_or(0);
        let mut view = match direct.view(self.name()) {
            Some(view) if view.is_recent() => view,
            // Asked again now and then; a router that cannot answer leaves the reads to go
            // by what it said last (the nodes refuse what that no longer places).
            Some(view) => match self.topology(direct, covering).await {
                Ok(fresh) => fresh,
                Err(e) => {
                    tracing::debug!("reading by the map the router gave last ({e})");
                    view
                }
            },
            None => self.topology(direct, covering).await?,
        };
        let (mut len_asked, mut failed_over) = (false, false);
        let names: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
        let field_count = if fields.is_empty() {
            self.fields.len()
        } else {
            fields.len()
        };
        loop {
            let past = |view: &direct::View| indices.iter().copied().find(|&i| i >= view.len());
            if past(&view).is_some() && !len_asked {
                view = self.topology(direct, covering).await?;
                len_asked = true;
            }
            if let Some(index) = past(&view) {
                let failure = crate::error::Failure::OutOfRange {
                    index,
                    len: view.len(),
                };
                return Err(zr_proto::Error::Remote {
                    code: failure.code(),
                    message: failure.to_string(),
                }
                .into());
            }
            let gathered = direct
                .gather(
                    self.dataset.as_deref(),
                    &view,
                    indices,
                    names.clone(),
                    field_count,
                )
                .await;
            let Err(e) = &gathered else {
                return gathered;
            };
            match e.code() {
                // A move switched the map: as long as it takes, within the timeout, while
                // the router's map changes. One the router still gives as it was is no
                // stale map but a misplaced node, which only the router can say why: it
                // serves the gather (and fails it at once if it is so).
                Some(wire::ErrorCode::StaleMap | wire::ErrorCode::WrongShard)
                    if tokio::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                    let refused = view.map_version();
                    view = self.topology(direct, covering).await?;
                    if view.map_version() == refused {
                        return Ok(Gathered::ViaRouter("a node refused the router's own map"));
                    }
                }
                // A shard's replicas all failed, could not say they are in sync, or hold
                // fewer records than asked for: again if the router's description changed
                // (replicas caught up, records deleted), else the router serves it — it knows
                // which replicas are in sync now, without a node's lease to wait for. (A
                // shard with one replica that failed fails here: the router has no other.)
                Some(
                    code @ (wire::ErrorCode::Unavailable
                    | wire::ErrorCode::NotInSync
                    | wire::ErrorCode::IndexOutOfRange),
                ) => {
                    let changed = !std::mem::replace(&mut failed_over, true) && {
                        let fresh = self.topology(direct, covering).await?;
                        let changed =
                            fresh.in_sync() != view.in_sync() || fresh.len() != view.len();
                        view = fresh;
                        changed
                    };
                    if !changed {
                        let router_knows_more =
                            code != wire::ErrorCode::Unavailable || direct.replicas() > 1;
                        return match router_knows_more {
                            true => Ok(Gathered::ViaRouter("a shard's nodes failed it")),
                            false => gathered,
                        };
                    }
                }
                _ => return gathered,
            }
        }
    }

    /// One record's fields as it names them: names, lengths, one body piece.
    fn encode_named(&self, record: &Record) -> Result<EncodedOne, Error> {
        let mut names = Vec::new();
        let mut lengths = Vec::new();
        let mut body = Vec::new();
        for &(name, payload) in record.values() {
            if !self.fields.iter().any(|f| f.name == name) {
                return Err(Error::UnknownField {
                    name: name.to_string(),
                    known: self
                        .fields
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            names.push(name.to_string());
            lengths.push(payload.len() as u32);
            body.extend_from_slice(payload);
        }
        Ok((names, lengths, vec![Bytes::from(body)]))
    }

    fn encode_records(&self, records: &[Record]) -> Result<Encoded, Error> {
        let names: Vec<String> = self.fields.iter().map(|f| f.name.clone()).collect();
        for record in records {
            for (name, _) in record.values() {
                if !names.iter().any(|n| n == name) {
                    return Err(Error::UnknownField {
                        name: name.to_string(),
                        known: names.join(", "),
                    });
                }
            }
        }
        let mut lengths = Vec::with_capacity(names.len());
        let mut body = Vec::with_capacity(names.len());
        for name in &names {
            let payloads: Vec<&[u8]> = records
                .iter()
                .map(|r| r.get(name).unwrap_or_default())
                .collect();
            lengths.push(payloads.iter().map(|p| p.len() as u32).collect());
            body.push(Bytes::from(payloads.concat()));
        }
        Ok((names, lengths, body))
    }

    /// Appends records; returns their global index range.
    pub async fn append_many(&self, records: &[Record<'_>]) -> Result<Range<u64>, Error> {
        let (fields, lengths, body) = self.encode_records(records)?;
        // A refused append is cut back (where part of it landed) before the next write.
        self.across_map_switches(|| async {
            let request = ClientRequest::Append {
                fields: fields.clone(),
                lengths: lengths.clone(),
            };
            match self.call(&request, body.clone()).await?.0 {
                Reply::Appended { start, count } => Ok(start..start + count),
                other => Err(unexpected("append", &other)),
            }
        })
        .await
    }

    /// Appends one record; returns its index.
    pub async fn append(&self, record: &Record<'_>) -> Result<u64, Error> {
        Ok(self.append_many(std::slice::from_ref(record)).await?.start)
    }

    /// Replaces the fields `record` names of record `index`; its other fields keep their
    /// values (an empty payload makes a field absent).
    pub async fn modify(&self, index: u64, record: &Record<'_>) -> Result<(), Error> {
        let (fields, lengths, body) = self.encode_named(record)?;
        self.call(
            &ClientRequest::Modify {
                index,
                fields,
                lengths,
            },
            body,
        )
        .await
        .map(|_| ())
    }

    /// Swap-removes record `index`: the last record takes its index.
    pub async fn delete(&self, index: u64) -> Result<(), Error> {
        self.call(&ClientRequest::Delete { index }, Vec::new())
            .await
            .map(|_| ())
    }

    /// Commits every shard; returns once all have.
    pub async fn commit(&self) -> Result<(), Error> {
        self.call(&ClientRequest::Commit, Vec::new())
            .await
            .map(|_| ())
    }
}

/// True if the router closed `connection` as idle, to make room for others.
fn reclaimed(connection: &Connection) -> bool {
    matches!(
        connection.close_reason(),
        Some(quinn::ConnectionError::ApplicationClosed(close))
            if close.error_code == quinn::VarInt::from_u32(net::RECLAIMED)
    )
}

impl Link {
    /// The one-hop reads, if gathers go straight to the nodes.
    fn direct(&self) -> Option<&Direct> {
        self.direct.get().and_then(Option::as_ref)
    }

    /// Closes the connection, and those to the nodes, so that the router and the nodes free
    /// their slots at once rather than at their idle timeouts; returns the endpoints to wait
    /// on while the closes go out.
    fn close(&self) -> Vec<Endpoint> {
        if let Ok(connection) = self.connection.lock() {
            connection.close(quinn::VarInt::from_u32(0), b"client done");
        }
        let mut endpoints = vec![self.endpoint.clone()];
        if let Some(direct) = self.direct() {
            endpoints.extend(direct.close());
        }
        endpoints
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.close();
    }
}

/// A connection to a router with a blocking API: an [`AsyncClient`] on a small tokio runtime
/// of its own, so training code and the loader use it like a local `Store`.
///
/// A client addresses one dataset (the default one, as connected); [`Client::dataset`] gives
/// a handle on another over the same connection.
pub struct Client {
    runtime: Arc<tokio::runtime::Runtime>,
    inner: AsyncClient,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("router", &self.inner.link.addr)
            .field("dataset", &self.inner.name())
            .finish()
    }
}

impl Drop for Client {
    /// Closes the connection and lets the runtime send the close before it stops (briefly:
    /// the router frees the slot as soon as it hears of it).
    fn drop(&mut self) {
        if Arc::strong_count(&self.inner.link) > 1 {
            return; // another handle uses the connection
        }
        let endpoints = self.inner.link.close();
        self.runtime.block_on(async move {
            let idle = futures::future::join_all(endpoints.iter().map(Endpoint::wait_idle));
            let _ = tokio::time::timeout(Duration::from_millis(100), idle).await;
        });
    }
}

impl Client {
    /// Connects to the router at `addr` with `security` (a client identity from the
    /// cluster's certificate directory: `Security::load(dir, Role::Writer)`), with the
    /// default timeout for every wait.
    pub fn connect(addr: SocketAddr, security: Security) -> Result<Client, Error> {
        Client::connect_with_timeout(
            addr,
            security,
            Duration::from_millis(CLIENT_TIMEOUT_MS_DEFAULT),
        )
    }

    /// Connects with `timeout` for every network wait (see [`AsyncClient::connect`]).
    pub fn connect_with_timeout(
        addr: SocketAddr,
        security: Security,
        timeout: Duration,
    ) -> Result<Client, Error> {
        let options = ClientOptions {
            timeout,
            ..ClientOptions::default()
        };
        Client::connect_with(addr, security, options)
    }

    /// Connects as `options` say (see [`AsyncClient::connect_with`]).
    pub fn connect_with(
        addr: SocketAddr,
        security: Security,
        options: ClientOptions,
    ) -> Result<Client, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("zr-client")
            .enable_all()
            .build()
            .map_err(|e| Error::Client(format!("cannot start the runtime: {e}")))?;
        let inner = runtime.block_on(AsyncClient::connect_with(addr, security, options))?;
        Ok(Client {
            runtime: Arc::new(runtime),
            inner,
        })
    }

    /// A handle on dataset `name` over the same connection (refused if the cluster has no
    /// such dataset).
    pub fn dataset(&self, name: &str) -> Result<Client, Error> {
        let inner = self.runtime.block_on(self.inner.dataset(name))?;
        Ok(Client {
            runtime: Arc::clone(&self.runtime),
            inner,
        })
    }

    /// The name of the dataset this handle addresses.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The cluster's datasets (see [`AsyncClient::datasets`]).
    pub fn datasets(&self) -> Result<Vec<wire::DatasetInfo>, Error> {
        self.runtime.block_on(self.inner.datasets())
    }

    /// Creates a dataset (see [`AsyncClient::create_dataset`]); returns a handle on it.
    pub fn create_dataset(&self, name: &str, fields: Vec<FieldInfo>) -> Result<Client, Error> {
        self.create_dataset_with_dicts(name, fields, Vec::new())
    }

    /// Creates a dataset with zstd dictionaries (see
    /// [`AsyncClient::create_dataset_with_dicts`]); returns a handle on it.
    pub fn create_dataset_with_dicts(
        &self,
        name: &str,
        fields: Vec<FieldInfo>,
        dicts: Vec<FieldDict>,
    ) -> Result<Client, Error> {
        let inner = self
            .runtime
            .block_on(self.inner.create_dataset_with_dicts(name, fields, dicts))?;
        Ok(Client {
            runtime: Arc::clone(&self.runtime),
            inner,
        })
    }

    /// Drops a dataset (see [`AsyncClient::drop_dataset`]).
    pub fn drop_dataset(&self, name: &str) -> Result<(), Error> {
        self.runtime.block_on(self.inner.drop_dataset(name))
    }

    /// Adds a field (see [`AsyncClient::add_field`]).
    pub fn add_field(&mut self, field: FieldInfo) -> Result<(), Error> {
        self.runtime.block_on(self.inner.add_field(field))
    }

    /// Writes one field of a range of records (see [`AsyncClient::write_field`]).
    pub fn write_field(&self, field: &str, start: u64, values: &[&[u8]]) -> Result<(), Error> {
        self.runtime
            .block_on(self.inner.write_field(field, start, values))
    }

    /// Gathers records, waiting for their commit (see [`AsyncClient::gather_waiting`]).
    pub fn gather_waiting(
        &self,
        indices: &[u64],
        fields: &[&str],
        wait: Duration,
    ) -> Result<Vec<Contiguous>, Error> {
        self.runtime
            .block_on(self.inner.gather_waiting(indices, fields, wait))
    }

    /// Waits for the dataset's committed length (see [`AsyncClient::wait_len`]).
    pub fn wait_len(&self, len: u64, timeout: Duration) -> Result<u64, Error> {
        self.runtime.block_on(self.inner.wait_len(len, timeout))
    }

    /// The router's address.
    pub fn router(&self) -> SocketAddr {
        self.inner.router()
    }

    /// True if gathers go straight to the nodes (one hop), false if through the router.
    pub fn reads_direct(&self) -> bool {
        self.inner.reads_direct()
    }

    /// Length and fields.
    pub fn info(&self) -> Result<(u64, Vec<FieldInfo>), Error> {
        self.runtime.block_on(self.inner.info())
    }

    /// Number of records.
    pub fn len(&self) -> Result<u64, Error> {
        self.runtime.block_on(self.inner.len())
    }

    /// True if the cluster holds no records.
    pub fn is_empty(&self) -> Result<bool, Error> {
        self.runtime.block_on(self.inner.is_empty())
    }

    /// The dataset's fields (as of connecting).
    pub fn fields(&self) -> &[FieldInfo] {
        self.inner.fields()
    }

    /// The cluster as the router sees it (see [`AsyncClient::status`]).
    pub fn status(&self) -> Result<wire::ClusterStatus, Error> {
        self.runtime.block_on(self.inner.status())
    }

    /// The cluster map (see [`AsyncClient::map`]).
    pub fn map(&self) -> Result<zr_proto::placement::ClusterMap, Error> {
        self.runtime.block_on(self.inner.map())
    }

    /// Replaces a node (see [`AsyncClient::replace_node`]).
    pub fn replace_node(
        &self,
        shard: u32,
        replica: u32,
        addr: SocketAddr,
    ) -> Result<wire::ClusterStatus, Error> {
        self.runtime
            .block_on(self.inner.replace_node(shard, replica, addr))
    }

    /// Starts a move (see [`AsyncClient::move_shards`]).
    pub fn move_shards(
        &self,
        change: wire::MapChange,
        nodes: Vec<(u32, u32, SocketAddr)>,
    ) -> Result<Option<wire::MoveReport>, Error> {
        self.runtime.block_on(self.inner.move_shards(change, nodes))
    }

    /// Starts a move at a rate (see [`AsyncClient::move_shards_at`]).
    pub fn move_shards_at(
        &self,
        change: wire::MapChange,
        nodes: Vec<(u32, u32, SocketAddr)>,
        rate: Option<u64>,
    ) -> Result<Option<wire::MoveReport>, Error> {
        self.runtime
            .block_on(self.inner.move_shards_at(change, nodes, rate))
    }

    /// A move's progress (see [`AsyncClient::move_progress`]).
    pub fn move_progress(&self) -> Result<Option<wire::MoveReport>, Error> {
        self.runtime.block_on(self.inner.move_progress())
    }

    /// Scrubs part of a shard (see [`AsyncClient::scrub`]).
    pub fn scrub(&self, shard: u32, start: u64, count: u64) -> Result<wire::ScrubReport, Error> {
        self.runtime.block_on(self.inner.scrub(shard, start, count))
    }

    /// Gathers `indices` for `fields` (empty = all): one column per field, in caller order.
    pub fn gather(&self, indices: &[u64], fields: &[&str]) -> Result<Vec<Contiguous>, Error> {
        self.runtime.block_on(self.inner.gather(indices, fields))
    }

    /// Gathers, each record checked (see [`AsyncClient::gather_checked`]).
    pub fn gather_checked(
        &self,
        indices: &[u64],
        fields: &[&str],
    ) -> Result<Vec<Contiguous>, Error> {
        self.runtime
            .block_on(self.inner.gather_checked(indices, fields))
    }

    /// Appends records; returns their global index range.
    pub fn append_many(&self, records: &[Record]) -> Result<Range<u64>, Error> {
        self.runtime.block_on(self.inner.append_many(records))
    }

    /// Appends one record; returns its index.
    pub fn append(&self, record: &Record) -> Result<u64, Error> {
        self.runtime.block_on(self.inner.append(record))
    }

    /// Replaces the fields `record` names of record `index` (see [`AsyncClient::modify`]).
    pub fn modify(&self, index: u64, record: &Record) -> Result<(), Error> {
        self.runtime.block_on(self.inner.modify(index, record))
    }

    /// Swap-removes record `index`: the last record takes its index.
    pub fn delete(&self, index: u64) -> Result<(), Error> {
        self.runtime.block_on(self.inner.delete(index))
    }

    /// Commits every shard; returns once all have.
    pub fn commit(&self) -> Result<(), Error> {
        self.runtime.block_on(self.inner.commit())
    }
}

fn unexpected(what: &str, reply: &Reply) -> Error {
    zr_proto::Error::Malformed(format!("the router answered {what} with {reply:?}")).into()
}

impl GatherSource for Client {
    fn gather_into(
        &self,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), BoxError> {
        let names: Vec<&str> = fields.iter().map(String::as_str).collect();
        *columns = self.gather(indices, &names)?;
        Ok(())
    }
}
