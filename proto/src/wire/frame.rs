//! The framing: a message's prefix (magic, version, kind, header length), its bincode
//! header and its body; the checks each request kind passes before anything is allocated
//! from what it says; encoding and decoding.

use super::*;

pub(super) const KIND_CLIENT_REQUEST: u16 = 1;
pub(super) const KIND_REPLY: u16 = 2;
pub(super) const KIND_NODE_REQUEST: u16 = 3;

/// A request of one of the two protocols: its message kind, and the checks its header and
/// body must pass before anything is allocated from them.
pub trait Request: Serialize + serde::de::DeserializeOwned + sealed::Sealed {
    /// The message kind in the prefix: a request of the other protocol is refused unread.
    const KIND: u16;
    /// Checks the header's counts against the limits and the body's size.
    fn check(&self, body: usize) -> Result<(), Error>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ClientMessage {}
    impl Sealed for super::NodeMessage {}
}

impl Request for ClientMessage {
    const KIND: u16 = KIND_CLIENT_REQUEST;

    fn check(&self, body: usize) -> Result<(), Error> {
        if let Some(name) = &self.dataset {
            check_dataset_name(name)?;
        }
        match &self.request {
            ClientRequest::Gather {
                indices, fields, ..
            } => check_gather(indices, fields, body),
            ClientRequest::WriteField { lengths, .. } => check_field_values(lengths, body),
            ClientRequest::CreateDataset { fields, dicts } => check_create(fields, dicts, body),
            ClientRequest::Append { fields, lengths } => check_append(fields, lengths, body),
            ClientRequest::Modify {
                fields, lengths, ..
            } => check_modify(fields, lengths, body),
            ClientRequest::Revoke { name, .. } if name.len() > CERT_NAME_BYTES_MAX => {
                Err(Error::Malformed(format!(
                    "a certificate name of {} bytes (at most {CERT_NAME_BYTES_MAX})",
                    name.len()
                )))
            }
            ClientRequest::RevokeSerial { serial, .. } if serial.len() > CERT_NAME_BYTES_MAX => {
                Err(Error::Malformed(format!(
                    "a serial number of {} bytes (at most {CERT_NAME_BYTES_MAX})",
                    serial.len()
                )))
            }
            ClientRequest::Grant { grant, .. } => grant.check().and_then(|()| expect_empty(body)),
            ClientRequest::MoveShards { nodes, .. } if nodes.len() > NODES_MAX => Err(
                Error::Malformed(format!("{} nodes (at most {NODES_MAX})", nodes.len())),
            ),
            ClientRequest::Scrub { count, .. } if *count > DIGEST_RECORDS_MAX => {
                Err(Error::Malformed(format!(
                    "a scrub of {count} records (at most {DIGEST_RECORDS_MAX} at once)"
                )))
            }
            ClientRequest::Info
            | ClientRequest::WaitLen { .. }
            | ClientRequest::Datasets
            | ClientRequest::DropDataset
            | ClientRequest::AddField { .. }
            | ClientRequest::Delete { .. }
            | ClientRequest::Commit
            | ClientRequest::Status
            | ClientRequest::Scrub { .. }
            | ClientRequest::ReplaceNode { .. }
            | ClientRequest::MoveShards { .. }
            | ClientRequest::MoveProgress
            | ClientRequest::Revoke { .. }
            | ClientRequest::RevokeSerial { .. }
            | ClientRequest::Grants
            | ClientRequest::Topology { .. } => expect_empty(body),
        }
    }
}

impl Request for NodeMessage {
    const KIND: u16 = KIND_NODE_REQUEST;

    fn check(&self, body: usize) -> Result<(), Error> {
        if self
            .cluster
            .as_ref()
            .is_some_and(|c| c.len() > CLUSTER_ID_BYTES_MAX)
        {
            return Err(Error::Malformed(format!(
                "a cluster id longer than {CLUSTER_ID_BYTES_MAX} bytes"
            )));
        }
        if let Some(name) = &self.dataset {
            check_dataset_name(name)?;
        }
        match &self.request {
            NodeRequest::WriteField {
                indices, lengths, ..
            } => {
                if indices.len() != lengths.len() {
                    return Err(Error::Malformed(format!(
                        "{} indices but {} lengths",
                        indices.len(),
                        lengths.len()
                    )));
                }
                check_field_values(lengths, body)
            }
            NodeRequest::CreateDataset { fields, dicts, .. } => check_create(fields, dicts, body),
            NodeRequest::Gather {
                indices, fields, ..
            } => check_gather(indices, fields, body),
            NodeRequest::Append {
                runs,
                fields,
                lengths,
                ..
            }
            | NodeRequest::Stage {
                runs,
                fields,
                lengths,
                ..
            } => check_placed_append(runs, fields, lengths, body),
            NodeRequest::Modify {
                fields, lengths, ..
            } => check_modify(fields, lengths, body),
            NodeRequest::Digest { runs } => {
                let count = check_runs(runs)?;
                if count > DIGEST_RECORDS_MAX {
                    return Err(Error::Malformed(format!(
                        "a digest of {count} records (at most {DIGEST_RECORDS_MAX} at once)"
                    )));
                }
                expect_empty(body)
            }
            NodeRequest::Info
            | NodeRequest::Datasets
            | NodeRequest::DropDataset { .. }
            | NodeRequest::AddField { .. }
            | NodeRequest::Truncate { .. }
            | NodeRequest::Commit
            | NodeRequest::Fence { .. }
            | NodeRequest::StageOpen { .. }
            | NodeRequest::Switch { .. }
            | NodeRequest::Identity
            | NodeRequest::ShipOpen { .. }
            | NodeRequest::ShipClose { .. } => expect_empty(body),
            NodeRequest::ShipRead { len, .. } if *len as usize > SHIP_PIECE_MAX => Err(
                Error::Malformed(format!("a piece of {len} bytes (at most {SHIP_PIECE_MAX})")),
            ),
            NodeRequest::ShipReadMany { pieces, .. } => {
                let sum: u64 = pieces.iter().map(|p| u64::from(p.len)).sum();
                if sum > SHIP_PIECE_MAX as u64 || pieces.len() > SHIP_PIECES_MAX {
                    return Err(Error::Malformed(format!(
                        "{} pieces of {sum} bytes at once (at most {SHIP_PIECES_MAX} of {SHIP_PIECE_MAX})",
                        pieces.len()
                    )));
                }
                expect_empty(body)
            }
            NodeRequest::ShipFrom { addr, .. } if addr.len() > ADDR_BYTES_MAX => Err(
                Error::Malformed(format!("an address of {} bytes", addr.len())),
            ),
            NodeRequest::ShipRead { .. } | NodeRequest::ShipFrom { .. } => expect_empty(body),
        }
    }
}

pub(super) fn options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(HEADER_BYTES_MAX as u64)
        .reject_trailing_bytes()
}

/// Encodes a message prefix and header; the body pieces follow it on the stream.
pub(super) fn encode(kind: u16, header: &impl Serialize) -> Result<Vec<u8>, Error> {
    let header = options()
        .serialize(header)
        .map_err(|e| Error::Malformed(format!("cannot encode header: {e}")))?;
    let mut out = Vec::with_capacity(PREFIX_BYTES + header.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    Ok(out)
}

/// The length of a message's prefix and header, from at least its first `PREFIX_BYTES`
/// bytes: the magic, version, kind and header length are checked.
pub fn head_len(bytes: &[u8], kind: u16) -> Result<usize, Error> {
    let bad = |why: String| Err(Error::Malformed(why));
    if bytes.len() < PREFIX_BYTES {
        return bad(format!(
            "message of {} bytes is shorter than its {PREFIX_BYTES}-byte prefix",
            bytes.len()
        ));
    }
    if bytes[0..4] != MAGIC {
        return bad("message does not start with ZRW1".into());
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != WIRE_VERSION {
        return Err(Error::Version {
            theirs: version,
            ours: WIRE_VERSION,
        });
    }
    let found = u16::from_le_bytes([bytes[6], bytes[7]]);
    if found != kind {
        return bad(format!("unexpected message kind {found}"));
    }
    let header_len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    if header_len > HEADER_BYTES_MAX {
        return bad(format!(
            "header length {header_len} exceeds the limit of {HEADER_BYTES_MAX}"
        ));
    }
    Ok(PREFIX_BYTES + header_len)
}

/// Splits a message into its decoded header and its body.
pub(super) fn decode<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    kind: u16,
) -> Result<(T, &[u8]), Error> {
    let head = head_len(bytes, kind)?;
    if head > bytes.len() {
        return Err(Error::Malformed(format!(
            "header length {} exceeds the message ({} bytes)",
            head - PREFIX_BYTES,
            bytes.len()
        )));
    }
    let (header, body) = bytes[PREFIX_BYTES..].split_at(head - PREFIX_BYTES);
    let value = options()
        .deserialize(header)
        .map_err(|e| Error::Malformed(format!("malformed header: {e}")))?;
    Ok((value, body))
}

/// The dataset a node request addresses (`None`: the default one), read from the start of
/// its header alone: what a node's access check needs of a one-hop read, without decoding
/// the request (its indices) before the request is decoded to be served.
pub fn node_request_dataset(bytes: &[u8]) -> Result<Option<&str>, Error> {
    /// The leading fields of a [`NodeMessage`].
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(borrow)]
        _cluster: Option<&'a str>,
        #[serde(borrow)]
        dataset: Option<&'a str>,
    }
    let head = head_len(bytes, KIND_NODE_REQUEST)?;
    let header = bytes
        .get(PREFIX_BYTES..head)
        .ok_or_else(|| Error::Malformed("a header longer than its message".into()))?;
    let Head { dataset, .. } = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(HEADER_BYTES_MAX as u64)
        .allow_trailing_bytes()
        .deserialize(header)
        .map_err(|e| Error::Malformed(format!("malformed header: {e}")))?;
    Ok(dataset)
}

/// True if `bytes` are a node request for the default dataset's `Info`: what a client's or a
/// router's heartbeat asks (see `zr_net::Limits::unpaced`).
pub fn is_liveness_probe(bytes: &[u8]) -> bool {
    decode_request::<NodeMessage>(bytes)
        .is_ok_and(|(m, _)| m.dataset.is_none() && matches!(m.request, NodeRequest::Info))
}

/// True if `bytes` start like a zrecord message (of any version or kind). Anything else is
/// not a malformed request but another protocol, or garbage.
pub fn is_message(bytes: &[u8]) -> bool {
    bytes.len() >= MAGIC.len() && bytes[..MAGIC.len()] == MAGIC
}

/// Encodes a request's prefix and header (its body pieces are sent after it).
pub fn encode_request<R: Request>(request: &R) -> Result<Vec<u8>, Error> {
    encode(R::KIND, request)
}

/// Encodes `request` as a [`NodeMessage`] for `cluster` (`None`: unchecked) placed by map
/// `map_version` and meant for `target`, the same bytes, without copying the request into one (a router's hot
/// path: a gather's indices).
pub fn encode_node_request(
    cluster: Option<&str>,
    dataset: Option<&str>,
    map_version: u64,
    target: Option<Target>,
    request: &NodeRequest,
) -> Result<Vec<u8>, Error> {
    /// [`NodeMessage`], borrowed: serde encodes `&str` as `String` and `&T` as `T`.
    #[derive(Serialize)]
    struct Borrowed<'a> {
        cluster: Option<&'a str>,
        dataset: Option<&'a str>,
        map_version: u64,
        target: Option<Target>,
        request: &'a NodeRequest,
    }
    encode(
        KIND_NODE_REQUEST,
        &Borrowed {
            cluster,
            dataset,
            map_version,
            target,
            request,
        },
    )
}

/// Encodes `request` for dataset `dataset` as a [`ClientMessage`], the same bytes, without
/// copying the request into one (a client's hot path: a gather's indices).
pub fn encode_client_request(
    dataset: Option<&str>,
    request: &ClientRequest,
) -> Result<Vec<u8>, Error> {
    /// [`ClientMessage`], borrowed.
    #[derive(Serialize)]
    struct Borrowed<'a> {
        dataset: Option<&'a str>,
        request: &'a ClientRequest,
    }
    encode(KIND_CLIENT_REQUEST, &Borrowed { dataset, request })
}

/// Encodes a reply's prefix and header (its body pieces are sent after it).
pub fn encode_reply(reply: &Reply) -> Result<Vec<u8>, Error> {
    encode(KIND_REPLY, reply)
}

/// Decodes and checks a request; returns it with its body.
pub fn decode_request<R: Request>(bytes: &[u8]) -> Result<(R, &[u8]), Error> {
    let (request, body): (R, &[u8]) = decode(bytes, R::KIND)?;
    request.check(body.len())?;
    Ok((request, body))
}

/// Decodes and checks a reply; returns it with its body.
pub fn decode_reply(bytes: &[u8]) -> Result<(Reply, &[u8]), Error> {
    let (reply, body): (Reply, &[u8]) = decode(bytes, KIND_REPLY)?;
    check_reply(&reply, body.len())?;
    Ok((reply, body))
}

/// Decodes and checks a reply that arrived in `chunks` (copying only its head); returns it
/// with the length of its head, where the body starts.
pub fn decode_reply_chunks(chunks: &[bytes::Bytes]) -> Result<(Reply, usize), Error> {
    let message = Chunks::new(chunks);
    let total = message.len();
    let (reply, body) = decode_reply_from(message)?;
    Ok((reply, total - body.len()))
}

/// Decodes the head of a reply still arriving in `chunks` (its first pieces): `None` until the
/// whole head is there, then the reply and the length of the whole message — the head plus
/// the body its header announces. What the header says is checked as in a whole message,
/// except the body, which has not arrived yet: the caller checks it as it comes.
pub fn decode_reply_head(chunks: &[bytes::Bytes]) -> Result<Option<(Reply, u64)>, Error> {
    let Some(prefix) = Chunks::new(chunks).read_vec(PREFIX_BYTES) else {
        return Ok(None);
    };
    let want = head_len(&prefix, KIND_REPLY)?;
    let Some(head) = Chunks::new(chunks).read_vec(want) else {
        return Ok(None);
    };
    let (reply, _): (Reply, &[u8]) = decode(&head, KIND_REPLY)?;
    let body = match &reply {
        Reply::Gather { lengths } => column_bytes(lengths)?,
        // Frames whose length only their producer knows: never announced ahead.
        Reply::GatherParts { .. } => {
            return Err(Error::Malformed(
                "a streamed gather cannot be forwarded again".into(),
            ))
        }
        _ => 0,
    };
    Ok(Some((reply, want as u64 + body)))
}

/// Decodes and checks a reply read from `message` (copying only its head); returns it with
/// its body, still in the chunks it arrived in.
pub fn decode_reply_from(mut message: Chunks<'_>) -> Result<(Reply, Chunks<'_>), Error> {
    let total = message.len();
    let cut = || Error::Malformed(format!("message of {total} bytes ends inside its head"));
    let mut head = message.read_vec(PREFIX_BYTES).ok_or_else(cut)?;
    let want = head_len(&head, KIND_REPLY)?;
    head.extend(message.read_vec(want - PREFIX_BYTES).ok_or_else(cut)?);
    let (reply, rest): (Reply, &[u8]) = decode(&head, KIND_REPLY)?;
    debug_assert!(rest.is_empty());
    check_reply(&reply, message.len())?;
    Ok((reply, message))
}
