//! Calls to the nodes: a link per node made on demand and forgotten when it breaks, one
//! request within the timeout, and a gather's reply read as it arrives.

use super::*;

impl Nodes {
    /// The open connection to node `node`, connected first (within `timeout`) if there is
    /// none.
    pub async fn link(&self, node: NodeId, timeout: Duration) -> Result<Connection, Error> {
        let id = node;
        let node = &self.links[node];
        let mut cached = node.connection.lock().await;
        match cached.as_ref().filter(|c| c.close_reason().is_none()) {
            Some(c) => Ok(c.clone()),
            None => {
                if let Some(closed) = cached.take() {
                    // Kept to tell calls meanwhile whether the node closed it (it stopped).
                    *node.forgotten.lock().unwrap_or_else(|e| e.into_inner()) = Some(closed);
                }
                let target = node.target();
                let c = zr_net::connect_to(
                    &target.endpoint,
                    &self.security,
                    target.addr,
                    timeout,
                    zr_net::Windows::ROUTER_TO_NODE,
                    Some(zr_net::tls::Role::Node),
                )
                .await?;
                *node.forgotten.lock().unwrap_or_else(|e| e.into_inner()) = None;
                // Before anything else goes over it: is this the process written to before?
                if let Some(incarnation) = self.incarnation_on(id, &c, timeout).await? {
                    self.check_incarnation(id, incarnation).await;
                }
                *cached = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// Forgets `connection` to node `node` after an exchange on it failed: the next call
    /// reconnects.
    pub async fn forget(&self, node: NodeId, connection: &Connection) {
        *self.links[node]
            .forgotten
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(connection.clone());
        let mut cached = self.links[node].connection.lock().await;
        if cached
            .as_ref()
            .is_some_and(|c| c.stable_id() == connection.stable_id())
        {
            *cached = None;
        }
    }

    /// Closes every node's connection (a client going away: the nodes free its slots at
    /// once); returns the endpoints, to wait on while the closes go out.
    pub fn close_all(&self) -> Vec<Endpoint> {
        self.links
            .iter()
            .map(|(_, link)| {
                if let Ok(cached) = link.connection.try_lock() {
                    if let Some(connection) = cached.as_ref() {
                        connection.close(0u32.into(), b"client done");
                    }
                }
                link.target().endpoint
            })
            .collect()
    }

    /// One request to node `node`; errors name its shard and address. Fails at once while
    /// the node is down, and as soon as its heartbeats find it down while the call waits.
    /// `dataset`: the dataset the request addresses (`None`: the default one).
    pub async fn call(
        &self,
        dataset: Option<&str>,
        node: NodeId,
        request: &NodeRequest,
        body: Vec<Bytes>,
    ) -> Result<NodeReply, Failure> {
        self.call_within(dataset, node, request, body, self.timeout)
            .await
    }

    /// [`Self::call`] within `timeout` rather than the router's.
    pub async fn call_within(
        &self,
        dataset: Option<&str>,
        node: NodeId,
        request: &NodeRequest,
        body: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<NodeReply, Failure> {
        if let Some(down) = self.down(node).await {
            return Err(down);
        }
        // A node its heartbeats find down meanwhile (killed, cut off) fails the call then,
        // naming it, rather than at the end of the timeout.
        let mut exchange = std::pin::pin!(self.exchange(dataset, node, request, body, timeout));
        tokio::select! {
            biased;
            answer = &mut exchange => answer,
            () = self.wait_down(node) => {
                // An answer under way may still come (heartbeats can lag a node that answers
                // this call): a moment's grace, then the call fails.
                match tokio::time::timeout(liveness::WAIT_FOR_UP, &mut exchange).await {
                    Ok(answer) => answer,
                    Err(_) => Err(self.unavailable(
                        node,
                        "its heartbeats found it down while this call waited for it".into(),
                    )),
                }
            }
        }
    }

    /// A read of shard `shard`: `request` to its in-sync replicas in [`Self::read_order`]
    /// until one answers; the last failure if none does.
    pub async fn read(
        &self,
        dataset: Option<&str>,
        shard: u32,
        request: &NodeRequest,
    ) -> Result<(NodeId, NodeReply), Failure> {
        let order = self.read_order(shard);
        let mut last = None;
        for (k, &node) in order.iter().enumerate() {
            // A replica known down is skipped at once while another may answer.
            let answer = if k + 1 < order.len() && self.is_down(node) {
                Err(self.unavailable(node, "down".into()))
            } else {
                self.call(dataset, node, request, Vec::new()).await
            };
            match answer {
                Ok(reply) => return Ok((node, reply)),
                Err(failure) => last = Some(failure),
            }
        }
        Err(last.unwrap_or(Failure::NoReplicaInSync { shard: Some(shard) }))
    }

    /// One request to node `node` within `timeout`, whatever its health.
    pub(super) async fn exchange(
        &self,
        dataset: Option<&str>,
        node: NodeId,
        request: &NodeRequest,
        body: Vec<Bytes>,
        timeout: Duration,
    ) -> Result<NodeReply, Failure> {
        let _counted = (!matches!(request, NodeRequest::Info)).then(|| self.in_flight(node));
        let shard = self.shard(node);
        let addr = self.addr(node);
        let unavailable = |reason: String| Failure::ShardUnavailable {
            shard,
            addr,
            reason,
        };
        let header = self
            .encode(dataset, node, request)
            .map_err(|e| Failure::BadRequest(e.to_string()))?;
        // One deadline covers waiting for the link, connecting and the exchange, so callers
        // queued behind a dead node's connect also fail within the timeout.
        let exchange = async {
            let connection = self.link(node, timeout).await.map_err(|e| e.to_string())?;
            let called = zr_net::call_chunks(&connection, header, body, timeout).await;
            if called.is_err() {
                self.forget(node, &connection).await;
            }
            called.map_err(|e| e.to_string())
        };
        let chunks = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(chunks)) => chunks,
            Ok(Err(e)) => return Err(unavailable(e)),
            Err(_) => {
                return Err(unavailable(format!(
                    "no reply within {} ms",
                    timeout.as_millis()
                )))
            }
        };
        let (reply, body_start) =
            wire::decode_reply_chunks(&chunks).map_err(|e| unavailable(e.to_string()))?;
        let _ = self.tell(Event::Heard { node });
        if let Reply::Error { code, message } = reply {
            if code == wire::ErrorCode::StaleMap {
                self.stale_map.notify_one();
            }
            return Err(Failure::ShardRefused {
                shard,
                code,
                message,
            });
        }
        Ok(NodeReply {
            reply,
            chunks,
            body_start,
        })
    }
}
