//! [`Client`]: the client with a blocking API, on a small tokio runtime of its own.

use super::*;

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
        let options = ClientOptions::with_timeout(timeout);
        Client::connect_with(addr, security, options)
    }

    /// Connects as `options` say (see [`AsyncClient::connect_with`]).
    pub fn connect_with(
        addr: SocketAddr,
        security: Security,
        options: ClientOptions,
    ) -> Result<Client, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(client_workers())
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

    /// A blocking client whose calls run on `runtime`, each as a `block_on` there: a cluster
    /// simulated on virtual time (`zr_sim`) runs its nodes and routers only while a call on
    /// its runtime runs, so its blocking clients must be driven by that runtime too.
    pub fn on_runtime(runtime: Arc<tokio::runtime::Runtime>, inner: AsyncClient) -> Client {
        Client { runtime, inner }
    }

    /// The async client beneath, to await on the runtime that drives this one (a simulated
    /// cluster's, see [`Client::on_runtime`]).
    pub fn as_async(&self) -> &AsyncClient {
        &self.inner
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

    /// Revokes a certificate name, or serves it again (see [`AsyncClient::revoke`]).
    pub fn revoke(&self, name: &str, undo: bool) -> Result<Vec<String>, Error> {
        self.runtime.block_on(self.inner.revoke(name, undo))
    }

    /// Revokes one certificate by its serial number, or serves it again (see
    /// [`AsyncClient::revoke_serial`]).
    pub fn revoke_serial(&self, serial: &str, undo: bool) -> Result<Vec<String>, Error> {
        self.runtime
            .block_on(self.inner.revoke_serial(serial, undo))
    }

    /// Adds a grant, or takes it out (see [`AsyncClient::grant`]).
    pub fn grant(
        &self,
        grant: wire::Grant,
        undo: bool,
        create_later: bool,
    ) -> Result<Vec<wire::Grant>, Error> {
        self.runtime
            .block_on(self.inner.grant(grant, undo, create_later))
    }

    /// Every grant (see [`AsyncClient::grants`]).
    pub fn grants(&self) -> Result<Vec<wire::Grant>, Error> {
        self.runtime.block_on(self.inner.grants())
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

/// Worker threads of a blocking client's runtime: half the host's cores, at least one and
/// at most two. The client shares its host with the job that reads (a training process, or
/// on one machine the nodes themselves): where a second worker would have no core of its
/// own, it mostly takes tasks from the first, and every such hand-over wakes a thread
/// (measured on 2 cores with `cluster_bench`: one worker spends 0.15–0.26 ms less CPU per
/// one-hop batch of 1,024 × 1 KiB records, at the same rate).
fn client_workers() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).clamp(1, 2)
}
