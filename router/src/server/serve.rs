//! Serving clients: connections accepted, each request decoded, checked against its
//! dataset and carried out, and gathers streamed from the nodes to the client.

use super::*;
use zr_coord::admission::{self, Asked, Verdict};

impl Router {
    /// Accepts clients on `endpoint` until `shutdown`; then stops accepting and lets requests
    /// in flight finish.
    pub async fn serve(self: Arc<Self>, endpoint: Endpoint, shutdown: impl Future<Output = ()>) {
        if let Ok(addr) = endpoint.local_addr() {
            let _ = self.cluster.listening.set(addr);
        }
        let (timeout, request_budget) = (self.cluster.timeout, self.cluster.request_budget);
        let requests_per_identity = self.cluster.requests_per_identity;
        let bytes_per_second_per_identity = self.cluster.bytes_per_second_per_identity;
        let handler = move |peer: &net::Peer, bytes: Vec<u8>| {
            let router = Arc::clone(&self);
            let peer = peer.clone();
            async move { router.handle_from(&peer, &bytes).await }
        };
        let limits = net::Limits {
            connections_per_identity: CONNECTIONS_PER_IDENTITY_MAX,
            request_bytes: request_budget,
            request_bytes_per_identity: request_budget / 2,
            request_bytes_kept_from_readers: request_budget / 4,
            requests_per_identity,
            bytes_per_second_per_identity,
            ..net::Limits::new(CONNECTIONS_MAX, timeout)
        };
        net::serve_peers(&endpoint, limits, shutdown, handler).await;
    }

    /// Decodes, executes and encodes one client request, with every right (a caller inside
    /// the process).
    pub async fn handle(self: &Arc<Self>, bytes: &[u8]) -> (Vec<u8>, Body) {
        let anyone = net::Peer {
            role: None,
            identity: 0,
            name: Some("in-process".into()),
            serial: None,
        };
        self.handle_from(&anyone, bytes).await
    }

    /// Decodes, executes and encodes one client request from `peer`: a request its role
    /// does not allow is refused, naming the role it needs.
    pub async fn handle_from(self: &Arc<Self>, peer: &net::Peer, bytes: &[u8]) -> (Vec<u8>, Body) {
        let outcome = match wire::decode_request::<ClientMessage>(bytes) {
            Ok((message, body)) => {
                let request = &message.request;
                let kind = request.kind();
                // Labelled by dataset: a name this router knows (a hostile client cannot grow
                // the label set with names that do not exist).
                let dataset = match message.dataset() {
                    name if name == wire::DEFAULT_DATASET || self.named_router(name).is_some() => {
                        name.to_string()
                    }
                    _ => "unknown".to_string(),
                };
                let started = std::time::Instant::now();
                let arrived = tokio::time::Instant::now();
                metrics::counter!("zr_router_received_bytes_total").increment(bytes.len() as u64);
                let access = request.access();
                let judged = || {
                    let revoked = match (peer.role, peer.name.as_deref()) {
                        (Some(role), Some(name)) if role.access().is_some() => self
                            .cluster
                            .access
                            .revoked_why(name, peer.serial.as_deref()),
                        _ => None,
                    };
                    // Grants bound readers and writers to the datasets they cover, once any
                    // exist (operators and in-process callers are not bound).
                    let granted = match request.on_records() {
                        Some(write)
                            if admission::bound_by_grants(peer.role.and_then(|r| r.access()))
                                && self.cluster.access.has_grants() =>
                        {
                            Some(self.cluster.access.record().allows(
                                peer.certified_name().unwrap_or_default(),
                                message.dataset(),
                                write,
                            ))
                        }
                        _ => None,
                    };
                    (revoked, granted)
                };
                let (mut revoked, mut granted) = judged();
                if revoked.is_some() || granted == Some(false) {
                    // Not refused by a record read before the request arrived: a grant made,
                    // or a revocation undone, a moment ago through another router holds here.
                    self.cluster.access.confirmed_since(arrived).await;
                    (revoked, granted) = judged();
                }
                let revokes_itself = match request {
                    ClientRequest::Revoke { name, undo: false } => peer.name.as_ref() == Some(name),
                    ClientRequest::RevokeSerial {
                        serial,
                        undo: false,
                    } => {
                        peer.serial.is_some()
                            && peer.serial == net::tls::normalized_serial(serial).ok()
                    }
                    _ => false,
                };
                let verdict = Verdict::of(&Asked {
                    has: peer.access(),
                    needs: access,
                    revoked,
                    granted,
                    writes: request.on_records() == Some(true),
                    revokes_itself,
                });
                // The audit names the dataset asked for if the caller's role may ask (a
                // dataset being created is not known yet); a refused caller's name for it is
                // not kept.
                let allowed = !matches!(verdict, Verdict::Revoked(_) | Verdict::Forbidden { .. });
                let asked: String = match (&self.cluster.audit, allowed) {
                    (None, _) => String::new(),
                    (Some(_), true) => message.dataset().chars().take(128).collect(),
                    (Some(_), false) => dataset.clone(),
                };
                let executed = match &verdict {
                    Verdict::Revoked(why) => Err(Failure::Revoked { why: why.clone() }),
                    Verdict::Forbidden { needs } => Err(Failure::Forbidden {
                        request: kind,
                        needs: needs.role_name(),
                        has: peer.role.map_or("unknown".into(), |r| r.name().to_string()),
                    }),
                    Verdict::NotGranted { write } => Err(Failure::NotGranted {
                        who: peer.who(),
                        doing: if *write { "write" } else { "read" },
                        dataset: message.dataset().to_string(),
                    }),
                    Verdict::RevokesItself => Err(Failure::BadRequest(format!(
                        "refusing to revoke '{}': it is the certificate this request comes with",
                        peer.who()
                    ))),
                    Verdict::Admit => self
                        .dispatch(message, body)
                        .await
                        .map(|answer| self.listed_for(peer, answer)),
                };
                // Admin actions and commits, and refusals (once a minute per identity and dataset).
                let audited = verdict.audited(access, kind, executed.is_ok());
                if let Some(outcome) = audited {
                    let detail = executed.as_ref().err().map(ToString::to_string);
                    self.audit(peer, kind, &asked, outcome, detail);
                }
                let outcome = if executed.is_ok() { "ok" } else { "error" };
                metrics::counter!("zr_router_requests_total", "kind" => kind, "outcome" => outcome, "dataset" => dataset.clone())
                    .increment(1);
                metrics::histogram!("zr_router_request_duration_seconds", "kind" => kind, "dataset" => dataset)
                    .record(started.elapsed());
                executed.map_err(|failure| {
                    // At a level a default run shows, a few a second per client at most.
                    self.log_failure(peer, || format!("{kind} failed: {failure}"));
                    metrics::counter!("zr_router_errors_total", "code" => failure.code().name())
                        .increment(1);
                    Reply::Error {
                        code: failure.code(),
                        message: failure.to_string(),
                    }
                })
            }
            Err(e) => {
                self.log_failure(peer, || format!("bad request from a client: {e}"));
                self.audit(
                    peer,
                    "undecodable",
                    "unknown",
                    "refused",
                    Some(e.to_string()),
                );
                metrics::counter!("zr_router_errors_total", "code" => e.code().name()).increment(1);
                Err(Reply::Error {
                    code: e.code(),
                    message: e.to_string(),
                })
            }
        };
        let (reply, body) = outcome.unwrap_or_else(|reply| (reply, Body::Ready(Vec::new())));
        match wire::encode_reply(&reply) {
            Ok(header) => (header, body),
            Err(e) => (
                wire::encode_reply(&Reply::Error {
                    code: e.code(),
                    message: e.to_string(),
                })
                .unwrap_or_default(),
                Body::Ready(Vec::new()),
            ),
        }
    }

    /// Refuses the certificates named `name` on every router and node (`undo`: serves them
    /// again), in the metadata store; this router refuses them at once, the others and the
    /// nodes within [`zr_meta::access::WATCH_EVERY`]. The cluster's own operator, router
    /// and node certificates cannot be revoked (the first is the way back in).
    async fn revoke(&self, name: &str, undo: bool) -> Result<Reply, Failure> {
        net::tls::check_name(name).map_err(|e| Failure::BadRequest(e.to_string()))?;
        if !undo && ["operator", "router", "node"].contains(&name) {
            return Err(Failure::BadRequest(format!(
                "refusing to revoke '{name}': it is the cluster's own {name} certificate (made by `zr cluster-init`); revoke the names `zr cluster issue` gave"
            )));
        }
        let record = zr_meta::access::revoke(&*self.cluster.meta, name, undo)
            .await
            .map_err(Failure::from)?;
        let names = record.revoked.iter().cloned().collect();
        self.cluster.access.set(record);
        Ok(Reply::Revoked { names })
    }

    /// Adds the serial number `serial` to those refused (`undo`: takes it out). Only
    /// certificates `zr cluster issue` made are refused by serial: the cluster's own role
    /// certificates, the way back in, are not.
    async fn revoke_serial(&self, serial: &str, undo: bool) -> Result<Reply, Failure> {
        let serial = net::tls::normalized_serial(serial).map_err(Failure::BadRequest)?;
        let record = zr_meta::access::revoke_serial(&*self.cluster.meta, &serial, undo)
            .await
            .map_err(Failure::from)?;
        let serials = record.revoked_serials.iter().cloned().collect();
        self.cluster.access.set(record);
        Ok(Reply::Revoked { names: serials })
    }

    /// Adds `grant` (`undo`: takes it out). A pattern without `*` must name a dataset the
    /// cluster has, unless `create_later`.
    async fn grant(
        &self,
        grant: wire::Grant,
        undo: bool,
        create_later: bool,
    ) -> Result<Reply, Failure> {
        net::tls::check_name(&grant.who).map_err(|e| Failure::BadRequest(e.to_string()))?;
        let names_one = !grant.pattern.ends_with('*');
        if !undo && names_one && !create_later && !self.has_dataset(&grant.pattern) {
            return Err(Failure::BadRequest(format!(
                "the cluster has no dataset '{}' to grant; `--create-later` grants it before it is created",
                grant.pattern
            )));
        }
        let record = zr_meta::access::grant(&*self.cluster.meta, &grant, undo)
            .await
            .map_err(Failure::from)?;
        let grants = record.grants.iter().cloned().collect();
        self.cluster.access.set(record);
        Ok(Reply::Grants { grants })
    }

    /// Whether the cluster has a dataset named `name` (the default one included).
    fn has_dataset(&self, name: &str) -> bool {
        name == wire::DEFAULT_DATASET || self.named_router(name).is_some()
    }

    /// `answer`, with a listing of datasets cut to those `peer` may read under the grants.
    fn listed_for(&self, peer: &net::Peer, answer: (Reply, Body)) -> (Reply, Body) {
        let bound = peer
            .role
            .is_some_and(|r| r.access().is_some_and(|a| a < net::tls::Access::Operate));
        match answer {
            (Reply::Datasets(mut datasets), body) if bound && self.cluster.access.has_grants() => {
                let (record, who) = (self.cluster.access.record(), peer.certified_name());
                datasets.retain(|d| record.allows(who.unwrap_or_default(), &d.name, false));
                (Reply::Datasets(datasets), body)
            }
            other => other,
        }
    }

    /// Writes an audit entry of `peer`'s `action` on `dataset`, if this router keeps an
    /// audit log; a refusal only if `peer` had none logged in the last minute.
    fn audit(
        &self,
        peer: &net::Peer,
        action: &str,
        dataset: &str,
        outcome: &str,
        detail: Option<String>,
    ) {
        if let Some(audit) = &self.cluster.audit {
            let detail = detail.unwrap_or_default();
            let entry =
                zr_service::audit::Entry::of("router", peer, action, dataset, outcome, detail);
            audit.note(peer.identity, &entry);
        }
    }

    /// Logs a failed request of `peer`'s, unless its identity has had its lines for now
    /// (see [`zr_service::logging::LogBudget`]); a line left out is counted in
    /// `zr_router_log_lines_suppressed_total` and said with the identity's next line.
    pub(super) fn log_failure(&self, peer: &net::Peer, line: impl FnOnce() -> String) {
        let now = std::time::Instant::now();
        let said = self
            .cluster
            .log_budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .line(peer.identity, now);
        match said {
            zr_service::logging::LogLine::Write { suppressed: 0 } => tracing::warn!("{}", line()),
            zr_service::logging::LogLine::Write { suppressed } => tracing::warn!(
                "{} ({suppressed} more failed requests of this client were not logged)",
                line()
            ),
            zr_service::logging::LogLine::Suppress => {
                metrics::counter!("zr_router_log_lines_suppressed_total").increment(1);
            }
        }
    }

    pub(super) async fn execute(
        self: &Arc<Self>,
        request: ClientRequest,
        body: &[u8],
    ) -> Result<(Reply, Body), Failure> {
        let ready = |reply: Reply| (reply, Body::Ready(Vec::new()));
        let ready_body = |(reply, body): (Reply, Vec<Bytes>)| (reply, Body::Ready(body));
        match request {
            ClientRequest::Info => {
                // Fresh from the nodes (another router may have written), or this router's
                // own while it writes under the lease; the cached length if a node cannot
                // answer, so a client can still connect.
                let len = match self.current_len().await {
                    Ok(len) => len,
                    Err(e) => {
                        tracing::debug!("cannot refresh the length: {e}");
                        self.len()
                    }
                };
                Ok(ready(Reply::Info {
                    len,
                    fields: self.fields(),
                    incarnation: 0,
                }))
            }
            ClientRequest::Gather {
                indices,
                fields,
                checked,
            } => {
                let gathered = self.gather(&indices, fields, checked).await;
                if gathered.is_ok() {
                    metrics::counter!("zr_router_records_gathered_total")
                        .increment(indices.len() as u64);
                }
                gathered
            }
            ClientRequest::Append {
                fields, lengths, ..
            } => self
                .acked(self.exclusive(|| self.append(fields, lengths, body)))
                .await
                .map(ready_body),
            ClientRequest::Modify {
                index,
                fields,
                lengths,
                ..
            } => self
                .acked(self.exclusive(|| self.rewrite(self.modify(index, fields, lengths, body))))
                .await
                .map(ready),
            ClientRequest::Delete { index } => self
                .acked(self.exclusive(|| self.rewrite(self.delete(index))))
                .await
                .map(ready_body),
            ClientRequest::WriteField {
                field,
                start,
                lengths,
            } => self
                .acked(
                    self.exclusive(|| self.rewrite(self.write_field(field, start, lengths, body))),
                )
                .await
                .map(ready),
            ClientRequest::WaitLen { len, wait_ms } => {
                let committed = self.wait_committed(len, wait_ms).await?;
                // A length reached tells of writes as their acknowledgment does.
                self.nodes().acks_may_go().await;
                Ok(ready(Reply::Info {
                    len: committed,
                    fields: self.fields(),
                    incarnation: 0,
                }))
            }
            ClientRequest::AddField { field } => {
                self.add_field(field).await?;
                Ok(ready(Reply::Done))
            }
            ClientRequest::Datasets
            | ClientRequest::CreateDataset { .. }
            | ClientRequest::DropDataset => Err(Failure::BadRequest(
                "a dataset's own router cannot list, create or drop datasets".into(),
            )),
            ClientRequest::Status => Ok(ready(Reply::Status(self.status().await))),
            ClientRequest::Scrub {
                shard,
                start,
                count,
            } => self
                .scrub(shard, start, count)
                .await
                .map(|report| ready(Reply::Scrubbed(report))),
            ClientRequest::ReplaceNode {
                shard,
                replica,
                addr,
            } => {
                self.replace_node(shard, replica, &addr).await?;
                Ok(ready(Reply::Status(self.status().await)))
            }
            ClientRequest::MoveShards {
                change,
                nodes,
                rate,
            } => {
                let rate = rate.unwrap_or(wire::MOVE_RATE_DEFAULT);
                self.start_move(change, nodes, rate)?;
                Ok(ready(Reply::Moving(self.move_progress())))
            }
            ClientRequest::MoveProgress => Ok(ready(Reply::Moving(self.move_progress()))),
            ClientRequest::Topology { covering } => {
                Ok(ready(Reply::Topology(self.topology(covering).await?)))
            }
            ClientRequest::Revoke { name, undo } => self.revoke(&name, undo).await.map(ready),
            ClientRequest::RevokeSerial { serial, undo } => {
                self.revoke_serial(&serial, undo).await.map(ready)
            }
            ClientRequest::Grant {
                grant,
                undo,
                create_later,
            } => self.grant(grant, undo, create_later).await.map(ready),
            ClientRequest::Grants => Ok(ready(Reply::Grants {
                grants: self
                    .cluster
                    .access
                    .record()
                    .grants
                    .iter()
                    .cloned()
                    .collect(),
            })),
            ClientRequest::Commit => {
                let commit = self.exclusive(|| async {
                    let placement = self.cluster.placement.load_full();
                    for shard in 0..self.nodes().shards() {
                        if !placement.slots(shard).is_empty() {
                            self.commit_shard(shard).await?;
                        }
                    }
                    // Every shard holds the length durably now: the promise moves.
                    self.record_committed(self.len(), false).await?;
                    Ok(ready(Reply::Done))
                });
                self.acked(commit).await
            }
        }
    }

    /// `write`'s outcome, once a success may be acknowledged (`Nodes::acks_may_go`): after
    /// the write lock is let go, so that what holds the acknowledgment holds no other write.
    pub(super) async fn acked<T>(
        &self,
        write: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let outcome = write.await;
        if outcome.is_ok() {
            self.nodes().acks_may_go().await;
        }
        outcome
    }

    /// Scatters a gather, one sub-request per involved shard, and streams the shards'
    /// replies to the client as they arrive (`Reply::GatherParts`; the client reassembles).
    /// A failed shard ends the stream with an error frame and abandons the others.
    pub(super) async fn gather(
        self: &Arc<Self>,
        indices: &[u64],
        fields: Vec<String>,
        checked: bool,
    ) -> Result<(Reply, Body), Failure> {
        let len = self
            .len_covering(indices.iter().copied().max().unwrap_or(0))
            .await?;
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err(Failure::OutOfRange { index, len });
        }
        // One snapshot of the map for the plan and for the version its requests carry.
        let placement = self.cluster.placement.load_full();
        let parts = plan_gather(&placement, indices);
        for part in &parts {
            if let Some(refusal) = self.still_missing(part.shard).await {
                return Err(refusal);
            }
        }
        if parts.is_empty() {
            // No index: an empty column per requested field.
            let count = if fields.is_empty() {
                self.fields().len()
            } else {
                fields.len()
            };
            let lengths = vec![Vec::new(); count];
            return Ok((Reply::Gather { lengths }, Body::Ready(Vec::new())));
        }
        let reply = Reply::GatherParts {
            records: indices.len() as u32,
            parts: parts.len() as u32,
        };
        // A few writes' worth queued: the shards' readers keep receiving meanwhile.
        let (frames, body) = tokio::sync::mpsc::channel(FRAMES_QUEUED);
        let forwarded = crate::forward::forward_parts(
            Arc::clone(self.nodes()),
            crate::forward::Placed {
                dataset: self.dataset.clone(),
                map_version: placement.version(),
            },
            parts,
            fields,
            checked,
            Some(self.cluster.replies.gather()),
            frames,
        );
        // A failure midway is logged there; the client's stream is reset.
        self.spawn(async move {
            let _ = forwarded.await;
        });
        Ok((reply, Body::Streamed(body)))
    }
}
