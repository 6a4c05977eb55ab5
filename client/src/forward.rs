//! Streamed gathers: each shard's reply goes on to the client as its packets arrive, not once
//! it is whole, so the router's two hops (nodes → router → client) overlap instead of taking
//! turns, and the router holds only what is received but not yet forwarded.
//!
//! The client's stream carries one frame after another ([`zr_proto::assemble`]): per shard
//! a `Part` frame with the caller's positions, then the shard's own message. Frames cannot
//! interleave, so the shards take turns: the first whose reply head arrives is forwarded to
//! its end while the others keep receiving into their queues, then the next. A frame's
//! length is known from the shard's head (its header announces every length), and the shard's
//! message is checked to be exactly that long. A shard that fails before its frame has begun
//! fails the gather with an error frame naming it; one that fails midway leaves nothing
//! well-formed to add, so the client's stream is reset (never passed off as complete) and the
//! reason is logged here.

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use zr_common::Contiguous;
use zr_coord::failover::{self, Failover, Head, Relay};
use zr_net as net;
use zr_proto::assemble::{push_frame, Misfit};
use zr_proto::wire::{self, NodeRequest, Reply};

use crate::budget::{GatherBudget, Turn};
use crate::error::Failure;
use crate::nodes::{NodeId, Nodes};
use crate::place::{Batch, Placing};
use crate::plan::Part;

/// Most pieces handed to the client's stream in one write.
const PIECES_PER_WRITE_MAX: usize = 256;

/// What a shard's reader passes on, in order: its head, then the rest of its message, then
/// the end — or a failure at any point.
enum Piece {
    /// The message's first chunks (holding its head), its whole length and the lengths
    /// its head announces.
    Head {
        chunks: Vec<Bytes>,
        message_len: u64,
        lengths: Vec<Vec<u32>>,
    },
    /// The next pieces, as they were read together.
    Chunks(Vec<Bytes>),
    End,
    Failed(Failure),
}

/// Where a part's reader passes its pieces: a queue that a forwarder reads as they come
/// (the router's streamed gathers), or the reader's own [`Placing`], which places them into
/// the batch itself (a client reading one hop: nobody else is woken for each piece).
trait PassOn: Send {
    /// Passes `piece` on; false if nobody reads on.
    fn pass(&mut self, piece: Piece) -> bool;
}

impl PassOn for mpsc::UnboundedSender<Piece> {
    fn pass(&mut self, piece: Piece) -> bool {
        self.send(piece).is_ok()
    }
}

/// A one-hop gather's part, placed into the batch by its own reader as it arrives.
impl PassOn for Placing {
    fn pass(&mut self, piece: Piece) -> bool {
        match piece {
            Piece::Head {
                chunks,
                message_len,
                lengths,
            } => self.head(chunks, lengths, message_len),
            Piece::Chunks(chunks) => self.received(chunks),
            Piece::End => self.ended(Ok(())),
            Piece::Failed(failure) => self.ended(Err(failure)),
        }
        true
    }
}

/// What a gather's node requests address: the dataset (`None`: the default one) and the
/// version of the map its plan was made by.
#[derive(Clone, Debug)]
pub struct Placed {
    pub dataset: Option<Arc<str>>,
    pub map_version: u64,
}

/// Sends each shard's reply on as a `Part` frame and the shard's own message (forwarded as
/// received, not re-encoded), shard after shard in the order their replies begin. Ends the
/// body with `None` when all are sent, after an error frame when a shard failed before its
/// frame began, and without it (the reader resets the client's stream) when one failed
/// midway: that failure is returned (and logged). The router forwards the frames to its
/// client; a client reading one hop (`crate::direct`) reassembles them itself.
pub async fn forward_parts(
    nodes: Arc<Nodes>,
    placed: Placed,
    parts: Vec<Part>,
    fields: Vec<String>,
    checked: bool,
    budget: Option<Arc<GatherBudget>>,
    frames: mpsc::Sender<Option<Vec<Bytes>>>,
) -> Result<(), Failure> {
    // Readers run on their own so every shard keeps receiving while one is forwarded;
    // dropping the set (the client went away, a shard failed) abandons them.
    let mut readers = tokio::task::JoinSet::new();
    let mut starting: FuturesUnordered<_> = parts
        .into_iter()
        .map(|part| {
            let reading = Reading {
                nodes: &nodes,
                placed: &placed,
                fields: &fields,
                checked,
                budget: &budget,
            };
            let (shard, positions, mut queue, turn) = reading.spawn(&mut readers, part);
            async move {
                let first = queue.recv().await;
                (shard, positions, first, queue, turn)
            }
        })
        .collect();
    while let Some((shard, positions, first, mut queue, turn)) = starting.next().await {
        turn.begin();
        let (chunks, message_len) = match first {
            Some(Piece::Head {
                chunks,
                message_len,
                ..
            }) => (chunks, message_len),
            Some(Piece::Failed(failure)) => {
                fail(&frames, failure).await;
                return Ok(());
            }
            Some(Piece::Chunks(_) | Piece::End) | None => {
                let failure = Failure::Inconsistent(format!(
                    "shard {shard}: its reader stopped before the reply"
                ));
                fail(&frames, failure).await;
                return Ok(());
            }
        };
        let mut out = Vec::with_capacity(chunks.len() + 3);
        match wire::encode_reply(&Reply::Part { positions }) {
            Ok(part) => push_frame(&mut out, vec![Bytes::from(part)]),
            Err(e) => {
                fail(&frames, Failure::BadRequest(e.to_string())).await;
                return Ok(());
            }
        }
        out.push(Bytes::copy_from_slice(&message_len.to_le_bytes()));
        out.extend(chunks);
        // The rest of the shard's message as it arrives; whatever has queued up meanwhile
        // goes in one write.
        loop {
            if !out.is_empty() && frames.send(Some(std::mem::take(&mut out))).await.is_err() {
                // The client is gone: dropping the readers abandons the shards.
                return Ok(());
            }
            let mut next = queue.recv().await;
            let ended = loop {
                match next {
                    Some(Piece::Chunks(chunks)) => out.extend(chunks),
                    Some(Piece::End) => break true,
                    Some(Piece::Failed(failure)) => {
                        tracing::warn!("gather abandoned midway, its reply is reset: {failure}");
                        return Err(failure);
                    }
                    Some(Piece::Head { .. }) | None => {
                        let failure = Failure::Inconsistent(format!(
                            "shard {shard}'s reader stopped midway through its reply"
                        ));
                        tracing::warn!("gather abandoned midway, its reply is reset: {failure}");
                        return Err(failure);
                    }
                }
                if out.len() >= PIECES_PER_WRITE_MAX {
                    break false;
                }
                match queue.try_recv() {
                    Ok(piece) => next = Some(piece),
                    Err(_) => break false,
                }
            };
            if ended {
                if !out.is_empty() && frames.send(Some(out)).await.is_err() {
                    return Ok(());
                }
                break;
            }
        }
    }
    let _ = frames.send(None).await;
    Ok(())
}

/// Reads each part's reply, all at once, each from its shard's in-sync replicas with the
/// failover [`forward_parts`] has (a replica failing midway is replaced from the byte where
/// it stopped), straight into the columns of a batch of `records` records (see
/// [`crate::place`]): for a client reading one hop. Returns the columns, or why the parts
/// do not make a batch; or the first failure to arrive, the other readers then abandoned.
pub(crate) async fn read_parts(
    nodes: Arc<Nodes>,
    placed: Placed,
    parts: Vec<Part>,
    records: usize,
    fields: Vec<String>,
) -> Result<Result<Vec<Contiguous>, Misfit>, Failure> {
    // Dropping the set (a part failed) abandons the other readers.
    let mut readers = tokio::task::JoinSet::new();
    let reading = Reading {
        nodes: &nodes,
        placed: &placed,
        fields: &fields,
        checked: false,
        budget: &None,
    };
    let batch = Batch::new(records, parts.iter().map(|p| p.positions.clone()).collect());
    let ended = Ended::new(parts.len());
    for (k, part) in parts.into_iter().enumerate() {
        let (_, _, read, _) = reading.reader(part, batch.placing(k));
        let slot = Ended::slot(&ended, k);
        readers.spawn(async move { slot.fill(read.await) });
    }
    let placings = ended.all().await?;
    drop(readers);
    batch.finish(placings)
}

/// Where a one-hop gather's readers hand back their [`Placing`]s: the gathering task is woken
/// once, when the last has ended or one has failed, rather than once per reader (each wake
/// of a blocking caller's thread is a thread switch).
struct Ended {
    state: std::sync::Mutex<Returns>,
    done: tokio::sync::Notify,
}

struct Returns {
    /// Each part's, once its reader has ended.
    placings: Vec<Option<Placing>>,
    failure: Option<Failure>,
}

impl Ended {
    fn new(parts: usize) -> Arc<Ended> {
        Arc::new(Ended {
            state: std::sync::Mutex::new(Returns {
                placings: (0..parts).map(|_| None).collect(),
                failure: None,
            }),
            done: tokio::sync::Notify::new(),
        })
    }

    /// Part `part`'s place: filled by its reader, or, if the reader stops before it returns
    /// (aborted, or a panic), marked as stopped.
    fn slot(this: &Arc<Ended>, part: usize) -> Slot {
        Slot {
            ended: Arc::clone(this),
            part,
            placing: None,
        }
    }

    /// Every part's `Placing`, by part, once all have ended; the first failure as soon as a
    /// part fails.
    async fn all(&self) -> Result<Vec<Placing>, Failure> {
        loop {
            // Registered before the state is read: a wake between the two is not lost.
            let woken = self.done.notified();
            {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(failure) = state.failure.take() {
                    return Err(failure);
                }
                if state.placings.iter().all(Option::is_some) {
                    return Ok(state.placings.drain(..).flatten().collect());
                }
            }
            woken.await;
        }
    }

    fn put(&self, part: usize, placing: Option<Placing>) {
        let failure = match &placing {
            Some(placing) => placing.failure(),
            None => Some(Failure::Inconsistent(format!(
                "part {part} of a gather: its reader stopped before its reply"
            ))),
        };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(place) = state.placings.get_mut(part) {
            *place = placing;
        }
        let wake = failure.is_some() || state.placings.iter().all(Option::is_some);
        if state.failure.is_none() {
            state.failure = failure;
        }
        drop(state);
        if wake {
            self.done.notify_one();
        }
    }
}

/// One reader's place in [`Ended`].
struct Slot {
    ended: Arc<Ended>,
    part: usize,
    placing: Option<Placing>,
}

impl Slot {
    fn fill(mut self, placing: Placing) {
        self.placing = Some(placing);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.ended.put(self.part, self.placing.take());
    }
}

/// What each part of one gather is read with.
struct Reading<'a> {
    nodes: &'a Arc<Nodes>,
    placed: &'a Placed,
    fields: &'a [String],
    checked: bool,
    budget: &'a Option<Arc<GatherBudget>>,
}

impl Reading<'_> {
    /// Starts `part`'s reader in `readers`; returns its shard, its positions, the queue its
    /// pieces arrive on and the turn its charges wait for.
    fn spawn(
        &self,
        readers: &mut tokio::task::JoinSet<()>,
        part: Part,
    ) -> (u32, Vec<u32>, mpsc::UnboundedReceiver<Piece>, Arc<Turn>) {
        let (pieces, queue) = mpsc::unbounded_channel();
        let (shard, positions, read, turn) = self.reader(part, pieces);
        readers.spawn(async move {
            read.await;
        });
        (shard, positions, queue, turn)
    }

    /// `part`'s reader, passing its pieces to `pieces` (and returning it once the part is
    /// read), with its shard, its positions and the turn its charges wait for.
    fn reader<P: PassOn + 'static>(
        &self,
        part: Part,
        pieces: P,
    ) -> (
        u32,
        Vec<u32>,
        impl std::future::Future<Output = P> + Send + 'static,
        Arc<Turn>,
    ) {
        let request = NodeRequest::Gather {
            indices: part.addresses,
            fields: self.fields.to_vec(),
            checked: self.checked,
        };
        let charge = Charge {
            budget: self.budget.clone(),
            turn: Arc::new(Turn::default()),
        };
        let turn = Arc::clone(&charge.turn);
        let read = read_part(
            Arc::clone(self.nodes),
            self.placed.clone(),
            part.shard,
            request,
            part.positions.len(),
            charge,
            pieces,
        );
        (part.shard, part.positions, read, turn)
    }
}

/// Ends the body with an error frame: it fails the client's whole gather with `failure`.
async fn fail(frames: &mpsc::Sender<Option<Vec<Bytes>>>, failure: Failure) {
    let mut out = Vec::new();
    let error = wire::encode_reply(&Reply::Error {
        code: failure.code(),
        message: failure.to_string(),
    })
    .unwrap_or_default();
    push_frame(&mut out, vec![Bytes::from(error)]);
    if frames.send(Some(out)).await.is_ok() {
        let _ = frames.send(None).await;
    }
}

/// What a part's reader charges the bytes it receives to (see [`crate::budget`]): the
/// router's reply budget, or nothing for a client reading one hop (it keeps every chunk
/// until its batch is whole, and asked for that batch itself).
struct Charge {
    budget: Option<Arc<GatherBudget>>,
    turn: Arc<Turn>,
}

impl Charge {
    async fn charge(&self, chunk: Bytes) -> Result<Bytes, Received> {
        let Some(budget) = &self.budget else {
            return Ok(chunk);
        };
        budget
            .charge(&self.turn, chunk)
            .await
            .ok_or_else(|| Received::Net("the router is stopping".into()))
    }
}

/// Sends `request` to one of shard `shard`'s in-sync replicas and passes its reply on to
/// `pieces` as it arrives, each exchange within the router's timeout. The reply must be a
/// gather of `records` records, exactly as long as its head announces. If the replica fails
/// — before its reply or midway — the next replica is asked the same: replicas hold the same
/// records, so their replies are the same bytes, and the part goes on from where the failed
/// one stopped (checked: the new reply must announce the same lengths). Fails only when
/// every replica did; a replica known down is tried last. `zr_coord::failover` decides the
/// order, who is passed over and which bytes are passed on.
async fn read_part<P: PassOn>(
    nodes: Arc<Nodes>,
    placed: Placed,
    shard: u32,
    request: NodeRequest,
    records: usize,
    charge: Charge,
    mut pieces: P,
) -> P {
    let mut replicas = Failover::new(nodes.read_order(shard));
    let mut relay = Relay::default();
    let mut failure = None;
    loop {
        let (node, last) = match replicas.next(|node| nodes.is_down(node)) {
            failover::Turn::Ask { node, last } => (node, last),
            failover::Turn::PassOver(node) => {
                failure = Some(nodes.unavailable(node, "down".into()));
                continue;
            }
            failover::Turn::Exhausted => break,
        };
        if let Some(down) = nodes.down(node).await {
            failure = Some(down);
            continue;
        }
        // Each replica is sent the request as meant for it (it checks which node it is),
        // placed by the map version the plan was made by: a node serving another refuses
        // it, however the router's own map moved meanwhile.
        let header = match nodes.encode_at(
            placed.dataset.as_deref(),
            node,
            Some(placed.map_version),
            &request,
        ) {
            Ok(header) => header,
            Err(e) => {
                pieces.pass(Piece::Failed(Failure::BadRequest(e.to_string())));
                return pieces;
            }
        };
        match attempt(
            &nodes,
            node,
            header,
            records,
            &charge,
            &mut pieces,
            &mut relay,
        )
        .await
        {
            Ok(()) => {
                pieces.pass(Piece::End);
                return pieces;
            }
            Err(failed) => {
                if failed.code() == zr_proto::ErrorCode::CorruptRecord {
                    // A copy failed its check: the partner's is read instead, and the bad
                    // one is repaired from a good one.
                    if let NodeRequest::Gather { indices, .. } = &request {
                        nodes.suspect(placed.dataset.clone(), node, indices.clone());
                    }
                }
                if !last {
                    metrics::counter!("zr_router_gather_retries_total").increment(1);
                    tracing::info!(
                        "{failed}; asking another replica of shard {shard} (after {} bytes)",
                        relay.sent()
                    );
                }
                failure = Some(failed);
            }
        }
    }
    let failure = failure.unwrap_or(Failure::NoReplicaInSync { shard: Some(shard) });
    pieces.pass(Piece::Failed(failure));
    pieces
}

/// One replica's exchange of [`read_part`], within the router's timeout.
async fn attempt(
    nodes: &Nodes,
    node: NodeId,
    header: Vec<u8>,
    records: usize,
    charge: &Charge,
    pieces: &mut impl PassOn,
    relay: &mut Relay,
) -> Result<(), Failure> {
    let shard = nodes.shard(node);
    let _counted = nodes.in_flight(node);
    let mut used = None;
    let exchange = async {
        let connection = nodes
            .link(node, nodes.timeout())
            .await
            .map_err(|e| Received::Net(e.to_string()))?;
        used = Some(connection.clone());
        receive(&connection, header, shard, records, charge, pieces, relay).await
    };
    let bounded = async {
        tokio::time::timeout(nodes.timeout(), exchange)
            .await
            .unwrap_or_else(|_| {
                let waited = nodes.timeout().as_millis();
                Err(Received::Net(format!("no reply within {waited} ms")))
            })
    };
    // A node its heartbeats find down meanwhile (killed, cut off) is not waited for to the
    // end of the timeout: a partner is asked instead — as soon as one heartbeat to the node
    // fails — or, with none, the gather fails naming the shard once it is found down.
    // (A sole replica already down when asked is still tried: it may be back before its
    // heartbeats say so.)
    let partnered = nodes.replicas() > 1;
    let race = partnered || !nodes.found_down(node);
    let given_up = async {
        match partnered {
            true => nodes.wait_failing(node).await,
            false => nodes.wait_down(node).await,
        }
    };
    let received = {
        let mut bounded = std::pin::pin!(bounded);
        tokio::select! {
            biased;
            received = &mut bounded => received,
            _ = given_up, if race => {
                // A reply under way may still finish (heartbeats can lag a node that
                // answers this call): a moment's grace, then the call fails.
                match tokio::time::timeout(crate::liveness::WAIT_FOR_UP, &mut bounded).await {
                    Ok(received) => received,
                    Err(_) if partnered => Err(Received::Net(
                        "a heartbeat to it failed meanwhile".into(),
                    )),
                    Err(_) => Err(Received::Net("its heartbeats found it down meanwhile".into())),
                }
            }
        }
    };
    match received {
        Ok(()) => Ok(()),
        // The node answered with an error of its own: the connection is fine.
        Err(Received::Refused(failure)) => Err(failure),
        Err(Received::Net(e) | Received::Protocol(e)) => {
            // A node that broke the protocol, went silent or was replaced is connected to
            // afresh on the next request.
            if let Some(connection) = &used {
                nodes.forget(node, connection).await;
            }
            Err(nodes.unavailable(node, e))
        }
    }
}

/// Why a shard's reply did not come through.
enum Received {
    /// The connection or stream failed.
    Net(String),
    /// The reply is not what was asked for.
    Protocol(String),
    /// The node answered with an error of its own.
    Refused(Failure),
}

/// The exchange of [`attempt`], without its deadline: passes on the reply's bytes past the
/// `relay` says were passed on already (from a replica asked before).
async fn receive(
    connection: &quinn::Connection,
    header: Vec<u8>,
    shard: u32,
    records: usize,
    charge: &Charge,
    pieces: &mut impl PassOn,
    relay: &mut Relay,
) -> Result<(), Received> {
    let net = |e: zr_net::Error| Received::Net(e.to_string());
    let mut recv = net::send_request(connection, header, Vec::new())
        .await
        .map_err(net)?;
    // Until the head is whole.
    let mut chunks = Vec::new();
    let mut received = 0u64;
    let (reply, message_len) = loop {
        let Some(chunk) = net::read_chunk(connection, &mut recv).await.map_err(net)? else {
            return Err(Received::Protocol(format!(
                "the reply ends inside its head, after {received} bytes"
            )));
        };
        received += chunk.len() as u64;
        chunks.push(charge.charge(chunk).await?);
        match wire::decode_reply_head(&chunks) {
            Ok(Some(head)) => break head,
            Ok(None) => continue,
            Err(e) => return Err(Received::Protocol(e.to_string())),
        }
    };
    let lengths = match reply {
        Reply::Gather { lengths } if lengths.iter().all(|l| l.len() == records) => lengths,
        Reply::Error { code, message } => {
            return Err(Received::Refused(Failure::ShardRefused {
                shard,
                code,
                message,
            }))
        }
        other => {
            return Err(Received::Protocol(format!(
                "answered a gather of {records} records with {other:?}"
            )))
        }
    };
    let too_long = || {
        Received::Protocol(format!(
            "the reply runs past the {message_len} bytes its head announces"
        ))
    };
    if message_len > wire::MESSAGE_BYTES_MAX as u64 {
        return Err(Received::Protocol(format!(
            "the reply announces {message_len} bytes, over the limit of {}",
            wire::MESSAGE_BYTES_MAX
        )));
    }
    if received > message_len {
        return Err(too_long());
    }
    // Bytes of this reply already passed on from an earlier replica's, to be skipped.
    let mut skip = match relay
        .head(lengths.clone(), message_len, received)
        .map_err(Received::Protocol)?
    {
        Head::First => {
            pieces.pass(Piece::Head {
                chunks,
                message_len,
                lengths,
            });
            0
        }
        Head::Resume { mut skip } => {
            let mut batch = Vec::new();
            for chunk in chunks {
                pass_on(chunk, &mut skip, &mut batch, relay);
            }
            if !send_batch(batch, pieces) {
                return Ok(());
            }
            skip
        }
    };
    let mut read = Vec::new();
    while net::read_chunks(connection, &mut recv, &mut read)
        .await
        .map_err(net)?
    {
        let mut batch = Vec::with_capacity(read.len());
        for chunk in read.drain(..) {
            received += chunk.len() as u64;
            if received > message_len {
                return Err(too_long());
            }
            // Bytes passed on already (from another replica) are not charged again.
            let chunk = if skip >= chunk.len() as u64 {
                chunk
            } else {
                charge.charge(chunk).await?
            };
            pass_on(chunk, &mut skip, &mut batch, relay);
        }
        if !send_batch(batch, pieces) {
            // The gather was abandoned: nobody reads on.
            return Ok(());
        }
    }
    if received != message_len {
        return Err(Received::Protocol(format!(
            "the reply ends after {received} of the {message_len} bytes its head announces"
        )));
    }
    Ok(())
}

/// Adds `chunk` to `batch`, less the first `skip` bytes (already passed on from another
/// replica).
fn pass_on(chunk: Bytes, skip: &mut u64, batch: &mut Vec<Bytes>, relay: &mut Relay) {
    if let Some(from) = relay.pass(chunk.len() as u64, skip) {
        batch.push(chunk.slice(from as usize..));
    }
}

/// Passes `batch` on (if it holds anything); false if nobody reads on.
fn send_batch(batch: Vec<Bytes>, pieces: &mut impl PassOn) -> bool {
    batch.is_empty() || pieces.pass(Piece::Chunks(batch))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn the_gathering_task_has_every_placing_by_part_once_the_last_reader_ends() {
        runtime().block_on(async {
            let batch = Batch::new(3, vec![vec![0], vec![1], vec![2]]);
            let ended = Ended::new(3);
            let slots: Vec<Slot> = (0..3).map(|k| Ended::slot(&ended, k)).collect();
            let mut readers = tokio::task::JoinSet::new();
            // Ended in reverse order, each on a task of its own.
            for (k, slot) in slots.into_iter().enumerate().rev() {
                let mut placing = batch.placing(k);
                placing.ended(Ok(()));
                readers.spawn(async move { slot.fill(placing) });
            }
            let placings = ended.all().await.unwrap();
            let parts: Vec<usize> = placings.iter().map(Placing::part).collect();
            assert_eq!(parts, [0, 1, 2]);
        });
    }

    #[test]
    fn a_failed_part_ends_the_wait_while_others_still_read() {
        runtime().block_on(async {
            let batch = Batch::new(2, vec![vec![0], vec![1]]);
            let ended = Ended::new(2);
            let _still_reading = Ended::slot(&ended, 0);
            let mut failed = batch.placing(1);
            failed.ended(Err(Failure::BadRequest("gone".into())));
            Ended::slot(&ended, 1).fill(failed);
            let waited = tokio::time::timeout(Duration::from_secs(5), ended.all()).await;
            assert!(matches!(waited, Ok(Err(Failure::BadRequest(_)))));
        });
    }

    #[test]
    fn a_reader_that_stops_without_its_reply_fails_the_gather_rather_than_hanging_it() {
        runtime().block_on(async {
            let batch = Batch::new(2, vec![vec![0], vec![1]]);
            let ended = Ended::new(2);
            let mut whole = batch.placing(0);
            whole.ended(Ok(()));
            Ended::slot(&ended, 0).fill(whole);
            // A reader aborted or panicking drops its slot unfilled.
            let stopped = Ended::slot(&ended, 1);
            let reader = tokio::spawn(async move {
                let _slot = stopped;
                panic!("a reader's bug");
            });
            assert!(reader.await.is_err());
            let waited = tokio::time::timeout(Duration::from_secs(5), ended.all()).await;
            assert!(matches!(waited, Ok(Err(Failure::Inconsistent(_)))));
        });
    }
}
