//! Putting a scattered gather back together: each shard's columnar reply holds its records in
//! its own order, with the caller's positions beside them; this builds one contiguous column
//! per field in the caller's order, after checking that the parts fit — every position
//! covered exactly once, every part with the same fields, bodies as long as their lengths.
//!
//! The router streams a gather's parts to the client as the shards answer
//! ([`Reply::GatherParts`]): the body is a sequence of frames, each a `u64` little-endian
//! length and one wire message — per part a [`Reply::Part`] with its positions followed by
//! the shard's [`Reply::Gather`], or a single [`Reply::Error`] that fails the whole gather.
//! Reassembly happens at the client, so the router forwards shard replies as they arrive
//! instead of storing and copying the whole batch.

use crate::chunks::Chunks;
use crate::error::Error;
use crate::placement::SHARDS_MAX;
use crate::wire::{self, Reply, RECORDS_MAX};
use zr_common::Contiguous;

/// One shard's share of a gather: where its records go, their lengths per field
/// (`lengths[f][k]`), and its body (field 0's payloads back to back, then field 1's, ...),
/// still in the chunks it arrived in: payloads are copied once, into the columns.
pub struct PartReply<'a> {
    pub positions: &'a [u32],
    pub lengths: &'a [Vec<u32>],
    pub body: Chunks<'a>,
}

/// Why a gather's parts do not make its batch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Misfit {
    #[error("a part has {0} columns, another {1}")]
    Columns(usize, usize),
    #[error("a part lists {positions} positions but columns of {columns:?} records")]
    Positions {
        positions: usize,
        columns: Vec<usize>,
    },
    #[error("a part's lengths add up to {total} bytes but its body has {body}")]
    Body { total: u64, body: usize },
    #[error("position {0} is filled twice")]
    Twice(u32),
    #[error("position {position} is outside a batch of {records}")]
    Outside { position: u32, records: usize },
    #[error("position {position} of {records} is missing")]
    Missing { position: usize, records: usize },
    #[error("a part's body ends early")]
    Short,
    #[error("its {bytes} bytes do not fit in this process's memory")]
    TooLarge { bytes: u64 },
}

/// What a part's head says of it: where its records go, their lengths per field
/// (`lengths[f][k]`) and its body's length.
pub struct PartHead<'a> {
    pub positions: &'a [u32],
    pub lengths: &'a [Vec<u32>],
    pub body_len: u64,
}

/// Where every byte of a gather goes, once every part's head is known: each field's column
/// offsets (`records + 1` of them), position `p`'s record at `offsets[f][p]..offsets[f][p + 1]`.
/// Made only for parts that fit: so the records' slots tile each column, one part's each.
pub struct Layout {
    offsets: Vec<Vec<u64>>,
}

impl Layout {
    /// Checks that `parts` make a batch of `records` — every position covered exactly once,
    /// every part with the same fields, each body as long as its lengths — and lays out its
    /// columns. `fields` is the number of columns when there are no parts.
    pub fn new(records: usize, fields: usize, parts: &[PartHead]) -> Result<Layout, Misfit> {
        let fields = parts.first().map_or(fields, |p| p.lengths.len());
        let mut covered = vec![false; records];
        for part in parts {
            if part.lengths.len() != fields {
                return Err(Misfit::Columns(part.lengths.len(), fields));
            }
            if part.lengths.iter().any(|l| l.len() != part.positions.len()) {
                return Err(Misfit::Positions {
                    positions: part.positions.len(),
                    columns: part.lengths.iter().map(Vec::len).collect(),
                });
            }
            let total: u64 = part.lengths.iter().flatten().map(|&l| l as u64).sum();
            if total != part.body_len {
                return Err(Misfit::Body {
                    total,
                    body: part.body_len as usize,
                });
            }
            for &pos in part.positions {
                match covered.get_mut(pos as usize) {
                    Some(seen) if !*seen => *seen = true,
                    Some(_) => return Err(Misfit::Twice(pos)),
                    None => {
                        return Err(Misfit::Outside {
                            position: pos,
                            records,
                        })
                    }
                }
            }
        }
        if let Some(missing) = covered.iter().position(|&c| !c) {
            return Err(Misfit::Missing {
                position: missing,
                records,
            });
        }
        let offsets = (0..fields)
            .map(|f| {
                let mut lengths = vec![0u32; records];
                for part in parts {
                    for (&pos, &len) in part.positions.iter().zip(&part.lengths[f]) {
                        lengths[pos as usize] = len;
                    }
                }
                let mut offsets = Vec::with_capacity(records + 1);
                let mut total = 0u64;
                offsets.push(0);
                for &len in &lengths {
                    total += len as u64;
                    offsets.push(total);
                }
                offsets
            })
            .collect();
        Ok(Layout { offsets })
    }

    /// The number of columns.
    pub fn fields(&self) -> usize {
        self.offsets.len()
    }

    /// Column `field`'s length in bytes.
    pub fn column_len(&self, field: usize) -> usize {
        self.offsets[field].last().copied().unwrap_or(0) as usize
    }

    /// The columns, given their bytes (`data[f]`, each [`Layout::column_len`] long).
    pub fn columns(self, data: Vec<Vec<u8>>) -> Vec<Contiguous> {
        data.into_iter()
            .zip(self.offsets)
            .map(|(data, offsets)| Contiguous { data, offsets })
            .collect()
    }
}

/// How far a part's body has been placed into its [`Layout`]: the field and the record its
/// next byte belongs to, and how much of that record is placed already. The body holds
/// field 0's payloads in the part's order, then field 1's, and so on.
#[derive(Clone, Debug, Default)]
pub struct Placer {
    field: usize,
    record: usize,
    within: u64,
}

impl Placer {
    /// Places `bytes`, the next of the body of the part whose records go to `positions`
    /// with `lengths`: hands `put` each piece as (field, byte in that column, piece). Every
    /// piece lies inside its record's slot. False if `bytes` run past the body (the pieces
    /// up to its end are handed over).
    pub fn place(
        &mut self,
        layout: &Layout,
        positions: &[u32],
        lengths: &[Vec<u32>],
        mut bytes: &[u8],
        put: &mut impl FnMut(usize, usize, &[u8]),
    ) -> bool {
        while !bytes.is_empty() {
            let Some(len) = self.current(lengths) else {
                return false;
            };
            let n = ((len - self.within) as usize).min(bytes.len());
            let Some(&start) = positions
                .get(self.record)
                .and_then(|&pos| layout.offsets.get(self.field)?.get(pos as usize))
            else {
                return false;
            };
            put(self.field, (start + self.within) as usize, &bytes[..n]);
            self.within += n as u64;
            bytes = &bytes[n..];
        }
        true
    }

    /// Whether the whole body of a part with `lengths` is placed.
    pub fn done(&mut self, lengths: &[Vec<u32>]) -> bool {
        self.current(lengths).is_none()
    }

    /// The length of the record the next byte belongs to (records placed whole, and empty
    /// ones, passed over); `None` once the body is placed.
    fn current(&mut self, lengths: &[Vec<u32>]) -> Option<u64> {
        loop {
            let column = lengths.get(self.field)?;
            match column.get(self.record) {
                Some(&len) if (len as u64) > self.within => return Some(len as u64),
                Some(_) => {
                    self.record += 1;
                    self.within = 0;
                }
                None => {
                    self.field += 1;
                    self.record = 0;
                    self.within = 0;
                }
            }
        }
    }
}

/// The columns of `records` records from `parts`, in position order. `fields` is the number
/// of columns to return when there are no parts (an empty gather).
pub fn reassemble(
    records: usize,
    fields: usize,
    parts: &[PartReply],
) -> Result<Vec<Contiguous>, Misfit> {
    let heads: Vec<PartHead> = parts
        .iter()
        .map(|part| PartHead {
            positions: part.positions,
            lengths: part.lengths,
            body_len: part.body.len() as u64,
        })
        .collect();
    let layout = Layout::new(records, fields, &heads)?;
    // Filled in place, not zeroed first: the slots of the positions tile each column.
    let mut data: Vec<Vec<u8>> = (0..layout.fields())
        .map(|f| Vec::with_capacity(layout.column_len(f)))
        .collect();
    for part in parts {
        let mut placer = Placer::default();
        let mut fits = true;
        part.body.clone().read_pieces(part.body.len(), |_, piece| {
            fits &= placer.place(
                &layout,
                part.positions,
                part.lengths,
                piece,
                &mut |f, at, bytes| {
                    data[f].spare_capacity_mut()[at..at + bytes.len()].write_copy_of_slice(bytes);
                },
            );
        });
        if !fits || !placer.done(part.lengths) {
            // Unreachable: each body's length was checked against its lengths.
            return Err(Misfit::Short);
        }
    }
    for (f, column) in data.iter_mut().enumerate() {
        // SAFETY: every position in 0..records is covered exactly once (the layout checked),
        // position p's slot is offsets[p]..offsets[p + 1], of its part's length for p, so the
        // slots tile the column; and every part's body was placed whole, each byte in its
        // record's slot (`done`): every byte of the column was written.
        unsafe { column.set_len(layout.column_len(f)) };
    }
    Ok(layout.columns(data))
}

/// Appends one frame (length, then the message pieces) to `out`.
pub fn push_frame(out: &mut Vec<bytes::Bytes>, message: Vec<bytes::Bytes>) {
    let len: usize = message.iter().map(|b| b.len()).sum();
    out.push(bytes::Bytes::copy_from_slice(&(len as u64).to_le_bytes()));
    out.extend(message);
}

/// Splits a `GatherParts` body into its frames' messages, each decoded and checked.
fn frames(mut body: Chunks<'_>) -> impl Iterator<Item = Result<(Reply, Chunks<'_>), Error>> {
    std::iter::from_fn(move || {
        if body.is_empty() {
            return None;
        }
        let mut len = [0u8; 8];
        if !body.read_into(&mut len) {
            body = Chunks::new(&[]);
            return Some(Err(Error::Malformed("a frame's length is cut off".into())));
        }
        let len = u64::from_le_bytes(len);
        let Some(message) = usize::try_from(len).ok().and_then(|n| body.split_to(n)) else {
            let left = body.len();
            body = Chunks::new(&[]);
            return Some(Err(Error::Malformed(format!(
                "a frame of {len} bytes overruns the {left} left"
            ))));
        };
        Some(wire::decode_reply_from(message))
    })
}

/// A part as taken off the wire: positions, `lengths[f][k]`, body.
type DecodedPart<'a> = (Vec<u32>, Vec<Vec<u32>>, Chunks<'a>);

/// Decodes a router's streamed gather reply (`Reply::GatherParts { records, parts }` with
/// `body`) into one column per field, in the caller's order. An error frame from any shard
/// fails the whole gather with that error; a batch with a part missing, doubled, or not
/// fitting is refused, never returned partially.
pub fn decode_gather_parts(
    records: u32,
    parts: u32,
    fields: usize,
    body: Chunks<'_>,
) -> Result<Vec<Contiguous>, Error> {
    let bad = |why: String| Error::Malformed(format!("gather reply: {why}"));
    if records as usize > RECORDS_MAX || parts > SHARDS_MAX {
        return Err(bad(format!(
            "{records} records in {parts} parts exceed the limits"
        )));
    }
    let mut decoded: Vec<DecodedPart> = Vec::with_capacity(parts as usize);
    let mut frames = frames(body);
    while let Some(frame) = frames.next() {
        match frame? {
            (Reply::Error { code, message }, _) => return Err(Error::Remote { code, message }),
            (Reply::Part { positions }, _) => match frames.next() {
                Some(Ok((Reply::Gather { lengths }, part_body))) => {
                    decoded.push((positions, lengths, part_body));
                }
                Some(Ok((Reply::Error { code, message }, _))) => {
                    return Err(Error::Remote { code, message })
                }
                Some(Ok((other, _))) => {
                    return Err(bad(format!("a part is followed by {other:?}")))
                }
                Some(Err(e)) => return Err(e),
                None => return Err(bad("the last part has no records".into())),
            },
            (other, _) => return Err(bad(format!("unexpected frame {other:?}"))),
        }
        if decoded.len() > parts as usize {
            return Err(bad(format!("more than the {parts} parts announced")));
        }
    }
    if decoded.len() != parts as usize {
        return Err(bad(format!("{} of {parts} parts arrived", decoded.len())));
    }
    reassemble_decoded(records as usize, fields, &decoded).map_err(|e| bad(e.to_string()))
}

/// [`reassemble`] from parts decoded apart: each its positions, its shard's lengths and the
/// body after its shard's head.
fn reassemble_decoded<P: AsRef<[u32]>>(
    records: usize,
    fields: usize,
    decoded: &[(P, Vec<Vec<u32>>, Chunks<'_>)],
) -> Result<Vec<Contiguous>, Misfit> {
    let views: Vec<PartReply> = decoded
        .iter()
        .map(|(positions, lengths, body)| PartReply {
            positions: positions.as_ref(),
            lengths,
            body: body.clone(),
        })
        .collect();
    reassemble(records, fields, &views)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// Decodes `body` arriving in chunks of uneven sizes, as packets do.
    fn decode(
        records: u32,
        parts: u32,
        fields: usize,
        body: &[u8],
    ) -> Result<Vec<Contiguous>, Error> {
        let mut chunks = Vec::new();
        let mut rest = body;
        for step in [1usize, 7, 64, 5, 300].iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (chunk, after) = rest.split_at((*step).min(rest.len()));
            chunks.push(Bytes::copy_from_slice(chunk));
            rest = after;
        }
        decode_gather_parts(records, parts, fields, Chunks::new(&chunks))
    }

    /// Record g's payload in field f: g and f as text.
    fn payload(g: u64, f: usize) -> String {
        format!("{g}/{f};")
    }

    /// A streamed reply for `indices` split over parts by `shard_of`, frames in `order`.
    fn streamed(indices: &[u64], shards: u32, fields: usize, order: &[u32]) -> Vec<u8> {
        let mut frames = Vec::new();
        for &shard in order {
            let positions: Vec<u32> = (0..indices.len() as u32)
                .filter(|&p| indices[p as usize] % shards as u64 == shard as u64)
                .collect();
            if positions.is_empty() {
                continue;
            }
            let lengths: Vec<Vec<u32>> = (0..fields)
                .map(|f| {
                    positions
                        .iter()
                        .map(|&p| payload(indices[p as usize], f).len() as u32)
                        .collect()
                })
                .collect();
            let body: String = (0..fields)
                .flat_map(|f| positions.iter().map(move |&p| (p, f)))
                .map(|(p, f)| payload(indices[p as usize], f))
                .collect();
            let part = wire::encode_reply(&Reply::Part { positions }).unwrap();
            push_frame(&mut frames, vec![Bytes::from(part)]);
            let header = wire::encode_reply(&Reply::Gather { lengths }).unwrap();
            push_frame(&mut frames, vec![Bytes::from(header), Bytes::from(body)]);
        }
        frames.concat()
    }

    #[test]
    fn parts_in_any_order_reassemble_in_caller_order() {
        let indices = [5u64, 0, 9, 5, 3000, 1, 2, 7];
        for order in [[0u32, 1, 2], [2, 0, 1], [1, 2, 0]] {
            let body = streamed(&indices, 3, 2, &order);
            let columns = decode(8, 3, 2, &body).unwrap();
            for (f, column) in columns.iter().enumerate() {
                for (pos, &g) in indices.iter().enumerate() {
                    assert_eq!(column.get(pos).unwrap(), payload(g, f).as_bytes());
                }
            }
        }
        // No parts: empty columns of the requested fields.
        let columns = decode(0, 0, 3, &[]).unwrap();
        assert_eq!(columns.len(), 3);
    }

    #[test]
    fn broken_replies_are_refused_never_partial() {
        let indices = [1u64, 2, 3, 4];
        let body = streamed(&indices, 2, 1, &[0, 1]);
        // A part missing, or announced parts that never come.
        let half = streamed(&indices, 2, 1, &[0]);
        assert!(decode(4, 2, 1, &half).is_err());
        assert!(decode(4, 3, 1, &body).is_err());
        // A part doubled.
        let doubled = [half.clone(), half].concat();
        assert!(decode(4, 2, 1, &doubled).is_err());
        // Any truncation.
        for cut in 0..body.len() {
            assert!(decode(4, 2, 1, &body[..cut]).is_err(), "cut {cut}");
        }
        // An error frame anywhere fails the gather with its message.
        let mut with_error = vec![Bytes::from(streamed(&indices, 2, 1, &[0]))];
        let error = wire::encode_reply(&Reply::Error {
            code: wire::ErrorCode::Unavailable,
            message: "shard 1 at 127.0.0.1:9: no reply".into(),
        })
        .unwrap();
        push_frame(&mut with_error, vec![Bytes::from(error)]);
        let err = decode(4, 2, 1, &with_error.concat()).unwrap_err();
        assert!(err.to_string().contains("shard 1"), "{err}");
    }

    proptest::proptest! {
        // Fuzz target: any body, any announced shape, never a panic or a partial batch.
        #[test]
        fn arbitrary_gather_bodies_never_panic(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
            records in 0u32..64,
            parts in 0u32..8,
            fields in 0usize..4,
        ) {
            if let Ok(columns) = decode(records, parts, fields, &body) {
                for column in &columns {
                    proptest::prop_assert_eq!(column.offsets.len(), records as usize + 1);
                }
            }
        }

        // Damage to a valid reply is an error or the same batch, never another batch.
        #[test]
        fn damaged_replies_never_decode_to_other_data(at in proptest::prelude::any::<proptest::sample::Index>(), flip in 1u8..) {
            let indices = [3u64, 1, 4, 1, 5, 9, 2, 6];
            let mut body = streamed(&indices, 3, 2, &[2, 0, 1]);
            let whole = decode(8, 3, 2, &body).unwrap();
            let i = at.index(body.len());
            body[i] ^= flip;
            if let Ok(columns) = decode(8, 3, 2, &body) {
                // Only payload bytes can change undetected (there is no checksum on the wire
                // beyond QUIC's own); the shape must not.
                for (a, b) in columns.iter().zip(&whole) {
                    proptest::prop_assert_eq!(&a.offsets, &b.offsets);
                }
            }
        }
    }
}
