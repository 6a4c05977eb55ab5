//! One request and one reply per bidirectional stream: sending a message whole or resetting
//! it, calls with a deadline, and reading replies as the pieces they arrived in.

use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, SendStream, VarInt};
use zr_proto::chunks::Chunks;
use zr_proto::wire::MESSAGE_BYTES_MAX;

use crate::error::Error;
use crate::refusal::{connection_error, describe};

/// Stream reset code: the sender gave up on the message (timeout, shutdown); it is not whole.
pub const ABANDONED: u32 = 1;
/// Connection close code: the peer broke the protocol.
pub const PROTOCOL_VIOLATION: u32 = 2;

/// A reply's body: pieces ready now, or batches of pieces a producer is still making (the
/// router's streamed gathers). A streamed body ends with `None`; a channel that closes
/// without it was abandoned, and the reply is reset.
pub enum Body {
    Ready(Vec<Bytes>),
    Streamed(tokio::sync::mpsc::Receiver<Option<Vec<Bytes>>>),
}

/// A send stream that is reset, not finished, if dropped before it is sent whole: a
/// message cut off midway (a timeout, a shutdown) can never look complete to the receiver.
/// (quinn finishes a dropped stream, which would make a truncated message look whole.)
pub(crate) struct Outgoing(pub(crate) Option<SendStream>);

/// Why a message was not sent whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendFailed {
    #[error("stream already finished")]
    Finished,
    #[error("{0}")]
    Write(#[from] quinn::WriteError),
    #[error("the peer took nothing for {0} ms")]
    Stalled(u128),
    #[error("the reply's producer gave up")]
    ProducerGone,
    #[error("{0}")]
    Closed(#[from] quinn::ClosedStream),
}

impl Outgoing {
    async fn send(&mut self, header: Vec<u8>, body: Vec<Bytes>) -> Result<(), SendFailed> {
        self.send_body(header, Body::Ready(body), None, &|_| {})
            .await
    }

    /// Sends `header` and `body`, then finishes, telling `charge` each piece's bytes before
    /// it is handed to the transport. With `timeout` (a server's reply), each write must make
    /// progress within it (waiting for a streamed body's producer is not bounded here), and
    /// the call returns once the peer has read the reply to its end.
    pub(crate) async fn send_body(
        &mut self,
        header: Vec<u8>,
        body: Body,
        timeout: Option<Duration>,
        charge: &(dyn Fn(u64) + Sync),
    ) -> Result<(), SendFailed> {
        let Some(stream) = self.0.as_mut() else {
            return Err(SendFailed::Finished);
        };
        async fn write(
            stream: &mut SendStream,
            mut pieces: Vec<Bytes>,
            timeout: Option<Duration>,
        ) -> Result<(), SendFailed> {
            let written = stream.write_all_chunks(&mut pieces);
            match timeout {
                None => Ok(written.await?),
                Some(t) => match tokio::time::timeout(t, written).await {
                    Ok(result) => Ok(result?),
                    Err(_) => Err(SendFailed::Stalled(t.as_millis())),
                },
            }
        }
        let size = |pieces: &[Bytes]| pieces.iter().map(|p| p.len() as u64).sum::<u64>();
        match body {
            Body::Ready(body) => {
                charge(header.len() as u64 + size(&body));
                let pieces = std::iter::once(Bytes::from(header)).chain(body).collect();
                write(stream, pieces, timeout).await?;
            }
            Body::Streamed(mut pieces) => {
                charge(header.len() as u64);
                write(stream, vec![Bytes::from(header)], timeout).await?;
                loop {
                    match pieces.recv().await {
                        Some(Some(batch)) => {
                            charge(size(&batch));
                            write(stream, batch, timeout).await?
                        }
                        Some(None) => break,
                        None => return Err(SendFailed::ProducerGone),
                    }
                }
            }
        }
        stream.finish()?;
        let finished = self.0.take();
        // A server's reply: wait (within the timeout) until the peer has it all, so that
        // what the reply holds stays counted until then, and a shutdown that waits for
        // requests in flight never closes the connection under a reply not yet delivered.
        if let (Some(stream), Some(t)) = (finished, timeout) {
            let _ = tokio::time::timeout(t, stream.stopped()).await;
        }
        Ok(())
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        if let Some(mut stream) = self.0.take() {
            let _ = stream.reset(VarInt::from_u32(ABANDONED));
        }
    }
}

/// Sends one request (`header` then the `body` pieces) on a new stream of `connection` and
/// returns the whole reply, all within `timeout`. On timeout the request stream is reset and
/// the reply stream stopped, so neither side can take a cut-off message for a whole one.
pub async fn call(
    connection: &Connection,
    header: Vec<u8>,
    body: Vec<Bytes>,
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let chunks = call_chunks(connection, header, body, timeout).await?;
    Ok(Chunks::new(&chunks).to_vec())
}

/// [`call`], returning the reply as the chunks it arrived in (no copy: each is a piece of a
/// received packet), for replies that are forwarded rather than read.
pub async fn call_chunks(
    connection: &Connection,
    header: Vec<u8>,
    body: Vec<Bytes>,
    timeout: Duration,
) -> Result<Vec<Bytes>, Error> {
    let peer = connection.remote_address();
    let exchange = async {
        let mut recv = send_request(connection, header, body).await?;
        let mut chunks = Vec::new();
        let mut total = 0usize;
        while let Some(chunk) = read_chunk(connection, &mut recv).await? {
            total += chunk.len();
            if total > MESSAGE_BYTES_MAX {
                return Err(Error::Link {
                    peer,
                    reason: format!(
                        "receiving failed: the reply exceeds {MESSAGE_BYTES_MAX} bytes"
                    ),
                });
            }
            chunks.push(chunk);
        }
        Ok(chunks)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(Error::NoReply {
            peer,
            waited_ms: timeout.as_millis(),
        }),
    }
}

/// Opens a stream on `connection` and sends one request on it (`header`, then the `body`
/// pieces); the reply is to be read from the stream returned. Not bounded in time: callers
/// put their deadline around the whole exchange.
pub async fn send_request(
    connection: &Connection,
    header: Vec<u8>,
    body: Vec<Bytes>,
) -> Result<quinn::RecvStream, Error> {
    let (send, recv) = connection
        .open_bi()
        .await
        .map_err(|e| lost(connection, "cannot open a stream", describe(&e)))?;
    Outgoing(Some(send))
        .send(header, body)
        .await
        .map_err(|e| lost(connection, "sending failed", e.to_string()))?;
    Ok(recv)
}

/// The next piece of a reply arriving on `recv` (a piece of a received packet, not copied),
/// or `None` once it is whole. A reply its sender abandoned midway is an error saying so.
pub async fn read_chunk(
    connection: &Connection,
    recv: &mut quinn::RecvStream,
) -> Result<Option<Bytes>, Error> {
    match recv.read_chunk(usize::MAX, true).await {
        Ok(chunk) => Ok(chunk.map(|c| c.bytes)),
        Err(quinn::ReadError::Reset(code)) if code == VarInt::from_u32(ABANDONED) => Err(lost(
            connection,
            "receiving failed",
            "the peer abandoned the reply midway (its log says why)".into(),
        )),
        Err(e) => Err(lost(connection, "receiving failed", e.to_string())),
    }
}

/// Most pieces [`read_chunks`] takes at once.
const CHUNKS_PER_READ: usize = 64;

/// The pieces of a reply arriving on `recv` that are ready, at least one (waiting for it),
/// appended to `out`; false once the reply is whole (nothing appended then). One call per
/// burst of packets rather than per packet: on a network link a reply arrives in pieces of
/// about a packet each.
pub async fn read_chunks(
    connection: &Connection,
    recv: &mut quinn::RecvStream,
    out: &mut Vec<Bytes>,
) -> Result<bool, Error> {
    let mut bufs: [Bytes; CHUNKS_PER_READ] = std::array::from_fn(|_| Bytes::new());
    match recv.read_chunks(&mut bufs).await {
        Ok(Some(n)) => {
            out.extend(bufs.into_iter().take(n));
            Ok(true)
        }
        Ok(None) => Ok(false),
        Err(quinn::ReadError::Reset(code)) if code == VarInt::from_u32(ABANDONED) => Err(lost(
            connection,
            "receiving failed",
            "the peer abandoned the reply midway (its log says why)".into(),
        )),
        Err(e) => Err(lost(connection, "receiving failed", e.to_string())),
    }
}

/// An exchange with `connection`'s peer failed at `what`: a closed connection explains
/// itself better than the stream error `e`, and a refused certificate (which a client may
/// learn of only after its handshake, once it sends) is [`Error::NotAuthorised`].
fn lost(connection: &Connection, what: &str, e: String) -> Error {
    let peer = connection.remote_address();
    let why = match connection.close_reason() {
        Some(reason) => match connection_error(peer, &reason) {
            refused @ Error::NotAuthorised { .. } => return refused,
            _ => describe(&reason),
        },
        None => e,
    };
    Error::Link {
        peer,
        reason: format!("{what}: {why}"),
    }
}
