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
use zr_net::CLIENT_TIMEOUT_MS_DEFAULT;
use zr_net::{self as net, Security};
use zr_proto::assemble::{decode_gather_parts, reassemble, PartReply};
use zr_proto::chunks::Chunks;
use zr_proto::wire::{self, ClientRequest, FieldDict, FieldInfo, Reply};
use zr_proto::ErrorCode;

use crate::direct::{self, Direct, Gathered};
use crate::error::Error;

mod admin;
mod blocking;
mod reads;
mod writes;

pub use blocking::Client;

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
    /// Gathers one hop, straight from the nodes (`None`: through the router); set once: at
    /// connect, or by the first dataset handle if grants keep the default dataset from
    /// this certificate.
    direct: std::sync::OnceLock<Option<Direct>>,
    /// The links to the nodes to make for one-hop gathers, if wanted: connections per
    /// node and how recent a topology must be.
    direct_wanted: Option<(usize, Duration)>,
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
    /// How long one-hop gathers go by the router's description of the cluster (which
    /// replicas are in sync, the map, the length) before asking for it again; a node that
    /// refuses a read as placed by another map makes the client ask at once.
    pub topology_every: Duration,
}

impl ClientOptions {
    /// The defaults, with `timeout` for every network wait.
    pub fn with_timeout(timeout: Duration) -> ClientOptions {
        ClientOptions {
            timeout,
            ..ClientOptions::default()
        }
    }
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            timeout: Duration::from_millis(CLIENT_TIMEOUT_MS_DEFAULT),
            direct: true,
            connections_per_node: 0,
            topology_every: direct::TOPOLOGY_EVERY,
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
        let options = ClientOptions::with_timeout(timeout);
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
                direct_wanted: options
                    .direct
                    .then_some((options.connections_per_node, options.topology_every)),
            }),
            dataset: None,
            fields: Vec::new(),
        };
        // The first request also completes authentication: a router that refuses this
        // client's certificate says so here. Under grants that do not cover the default
        // dataset, the router still answered: a handle on a granted dataset reads it.
        match client.info().await {
            Ok((_, fields)) => client.fields = fields,
            Err(e) if e.code() == Some(ErrorCode::NotGranted) => return Ok(client),
            Err(e) => return Err(e),
        }
        client.link_direct().await;
        Ok(client)
    }

    /// Makes the links for one-hop gathers, if wanted and not made yet, through this
    /// handle's dataset's topology.
    async fn link_direct(&self) {
        if self.link.direct.get().is_some() {
            return;
        }
        let direct = match self.link.direct_wanted {
            Some((connections, recent)) => self.connect_direct(connections, recent).await,
            None => None,
        };
        let _ = self.link.direct.set(direct);
    }

    /// Links to the nodes for one-hop gathers, or `None` (said in the log) if the router
    /// cannot describe them or none answers.
    async fn connect_direct(&self, connections: usize, recent: Duration) -> Option<Direct> {
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
                recent,
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
        handle.link_direct().await;
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
        self.call_within(request, body, self.link.timeout).await
    }

    /// [`Self::call`] bounded by `timeout` rather than the client's: for requests the router
    /// holds on purpose (a wait for commits).
    async fn call_within(
        &self,
        request: &ClientRequest,
        body: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<(Reply, Vec<Bytes>, usize), Error> {
        let mut connection = self.connection().await?;
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

    /// The dataset's fields (as of connecting).
    pub fn fields(&self) -> &[FieldInfo] {
        &self.fields
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

fn unexpected(what: &str, reply: &Reply) -> Error {
    zr_proto::Error::Malformed(format!("the router answered {what} with {reply:?}")).into()
}
