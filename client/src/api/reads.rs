//! The client's reads: gathers one hop from the nodes where it can (the router's plan, run
//! here), through the router otherwise, and waits for records not committed yet.

use super::*;
use zr_coord::onehop::{Next, OneHop};

impl AsyncClient {
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

    pub(super) async fn gather_with(
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
    pub(super) fn dropped(&self, e: Error) -> Error {
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
    /// returns its committed length then. The router holds the request that long, so the
    /// call's own bound is the wait plus the client's timeout, not the timeout alone.
    pub async fn wait_len(&self, len: u64, timeout: Duration) -> Result<u64, Error> {
        let wait_ms = timeout.as_millis().min(wire::WAIT_MS_MAX as u128) as u32;
        let bound = self.link.timeout + Duration::from_millis(wait_ms.into());
        match self
            .call_within(&ClientRequest::WaitLen { len, wait_ms }, Vec::new(), bound)
            .await?
            .0
        {
            Reply::Info { len, .. } => Ok(len),
            other => Err(unexpected("wait-len", &other)),
        }
    }

    /// Runs `call` again while the router answers that a node serves another map than the
    /// one the router placed by (a move switching the cluster to its next map: the router
    /// reloads it meanwhile), for up to the client's timeout. Such a refusal changed nothing.
    pub(super) async fn across_map_switches<'a, T, F, Fut>(
        &'a self,
        mut call: F,
    ) -> Result<T, Error>
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

    pub(super) async fn gather_once(
        &self,
        indices: &[u64],
        fields: &[&str],
        checked: bool,
    ) -> Result<Vec<Contiguous>, Error> {
        // Checked gathers (a damaged copy is repaired) are the router's to serve.
        if let Some(direct) = self.link.direct().filter(|_| !checked) {
            // Every wait of a one-hop gather is bounded on its own (a node's reply, a call to
            // the router) and its retries' pauses stay within the timeout
            // (`zr_coord::onehop`), but the whole is not: a failover across R replicas can
            // take R timeouts, each ask of the router one more. One-hop gathers were once
            // seen to hang for good (3 in ~100 move_bench runs); with the waits bounded since,
            // 302 runs (2026-11-28, default move_bench, every gather watched) had none reach
            // this bound, hang or slow. The cause was not pinned down, so a gather still going
            // at twice the timeout is handed to the router, logged and counted: a guard that
            // costs nothing unless it fires, and may cut short a failover that was only slow.
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
    pub(super) async fn topology(
        &self,
        direct: &Direct,
        covering: u64,
    ) -> Result<Arc<direct::View>, Error> {
        let request = ClientRequest::Topology { covering };
        let topology = direct::topology_of(self.call(&request, Vec::new()).await?.0)?;
        direct.adopt(self.name(), &topology).await
    }

    /// Asks the router for the topology anew in a task of its own, and takes it as the one
    /// one-hop gathers go by when it comes.
    fn refresh_topology(&self, covering: u64) {
        let handle = AsyncClient {
            link: Arc::clone(&self.link),
            dataset: self.dataset.clone(),
            fields: Vec::new(),
        };
        tokio::spawn(async move {
            let Some(direct) = handle.link.direct() else {
                return;
            };
            if let Err(e) = handle.topology(direct, covering).await {
                tracing::debug!("reading by the map the router gave last ({e})");
            }
        });
    }

    /// [`Self::gather_once`] one hop: planned by the map the router last gave, read from
    /// the nodes. An index past the length known asks the router for it again; a node placed
    /// by another map makes this take the topology anew and try again within the client's
    /// timeout; a shard that failed is tried again if the router's description changed
    /// meanwhile, and else read through the router.
    pub(super) async fn gather_direct(
        &self,
        direct: &Direct,
        indices: &[u64],
        fields: &[&str],
    ) -> Result<Gathered, Error> {
        let now = tokio::time::Instant::now().into_std();
        let mut retries = OneHop::new(now, self.link.timeout, direct.replicas());
        let covering = indices.iter().copied().max().unwrap_or(0);
        let mut view = match direct.view(self.name()) {
            Some(view) if direct.is_recent(&view) => view,
            // Asked again now and then, beside the reads: they go by what the router said
            // last meanwhile (the nodes refuse what that no longer places), so a router that
            // cannot answer holds none of them up.
            Some(view) => {
                self.refresh_topology(covering);
                direct.keep_going_by(self.name(), &view)
            }
            None => self.topology(direct, covering).await?,
        };
        let mut len_asked = false;
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
            let now = tokio::time::Instant::now().into_std();
            let mut next = retries.refused(e.code(), view.described(), now);
            // Asked again as the policy says, until it says what to do with the gather.
            while let Next::Describe { pause } = next {
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
                view = self.topology(direct, covering).await?;
                next = retries.described(view.described());
            }
            match next {
                Next::Again | Next::Describe { .. } => {}
                Next::ViaRouter(why) => return Ok(Gathered::ViaRouter(why)),
                Next::Fail => return gathered,
            }
        }
    }
}
