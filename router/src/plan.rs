//! Router planning, pure: split a gather by shard, put the replies back in the caller's
//! order, split an append by shard. No I/O here; the server only moves what these compute.

use zr_common::placement::Placement;

/// The records one shard serves for a gather.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub shard: u32,
    /// Node-local indices, in request order.
    pub local: Vec<u64>,
    /// Where each record goes in the caller's batch.
    pub positions: Vec<u32>,
}

/// One part per involved shard, in shard order.
pub fn plan_gather(placement: &Placement, indices: &[u64]) -> Vec<Part> {
    let mut parts: Vec<Part> = (0..placement.shards())
        .map(|shard| Part {
            shard,
            local: Vec::new(),
            positions: Vec::new(),
        })
        .collect();
    for (pos, &g) in indices.iter().enumerate() {
        let (shard, local) = placement.locate(g);
        let part = &mut parts[shard as usize];
        part.local.push(local);
        part.positions.push(pos as u32);
    }
    parts.retain(|p| !p.local.is_empty());
    parts
}

/// Reassembled columns: `lengths[f][k]` and one contiguous body per field.
pub type Columns = (Vec<Vec<u32>>, Vec<Vec<u8>>);

/// A shard's columnar reply: `lengths[f][k]`, and the body (per field, payloads back to back).
pub struct PartReply<'a> {
    pub lengths: &'a [Vec<u32>],
    pub body: &'a [u8],
}

/// Reassembles the parts' replies into the caller's order: per field, the lengths of all `n`
/// records and one contiguous payload. Checks every reply against its part.
pub fn reassemble(n: usize, parts: &[Part], replies: &[PartReply]) -> Result<Columns, String> {
    if parts.len() != replies.len() {
        return Err(format!(
            "{} parts but {} replies",
            parts.len(),
            replies.len()
        ));
    }
    let fields = replies.first().map_or(0, |r| r.lengths.len());
    for (part, reply) in parts.iter().zip(replies) {
        if reply.lengths.len() != fields
            || reply.lengths.iter().any(|l| l.len() != part.local.len())
        {
            return Err(format!(
                "shard {} answered {} columns of {:?} records for {} records",
                part.shard,
                reply.lengths.len(),
                reply.lengths.iter().map(Vec::len).collect::<Vec<_>>(),
                part.local.len()
            ));
        }
    }
    let mut all_lengths = vec![vec![0u32; n]; fields];
    let mut bodies = Vec::with_capacity(fields);
    // Each reply's body holds field 0's payloads, then field 1's, ...: walk them in step.
    let mut cursors: Vec<usize> = vec![0; replies.len()];
    for (f, lengths) in all_lengths.iter_mut().enumerate() {
        for (part, reply) in parts.iter().zip(replies) {
            for (k, &pos) in part.positions.iter().enumerate() {
                lengths[pos as usize] = reply.lengths[f][k];
            }
        }
        let mut offsets = Vec::with_capacity(n + 1);
        let mut total = 0usize;
        offsets.push(0);
        for &len in lengths.iter() {
            total += len as usize;
            offsets.push(total);
        }
        let mut out = vec![0u8; total];
        for ((part, reply), cursor) in parts.iter().zip(replies).zip(cursors.iter_mut()) {
            for (k, &pos) in part.positions.iter().enumerate() {
                let len = reply.lengths[f][k] as usize;
                let src = reply.body.get(*cursor..*cursor + len).ok_or_else(|| {
                    format!("shard {} sent a body shorter than its lengths", part.shard)
                })?;
                let at = offsets[pos as usize];
                out[at..at + len].copy_from_slice(src);
                *cursor += len;
            }
        }
        bodies.push(out);
    }
    Ok((all_lengths, bodies))
}

/// The records of an append that go to one shard: `positions` into the caller's records,
/// to be stored from node-local index `local_start` on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendPart {
    pub shard: u32,
    pub local_start: u64,
    pub positions: Vec<usize>,
}

/// Splits an append of `count` records taking global indices `start..` by shard.
pub fn plan_append(placement: &Placement, start: u64, count: usize) -> Vec<AppendPart> {
    let mut parts: Vec<Option<AppendPart>> = vec![None; placement.shards() as usize];
    for k in 0..count {
        let (shard, local) = placement.locate(start + k as u64);
        parts[shard as usize]
            .get_or_insert_with(|| AppendPart {
                shard,
                local_start: local,
                positions: Vec::new(),
            })
            .positions
            .push(k);
    }
    parts.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use zr_common::placement::ClusterMap;

    fn placement() -> Placement {
        Placement::new(ClusterMap::balanced(3, 2, 1).unwrap()).unwrap()
    }

    #[test]
    fn gather_round_trip_through_parts() {
        let p = placement();
        let indices: Vec<u64> = vec![5, 0, 9, 5, 3000, 1, 2];
        let parts = plan_gather(&p, &indices);
        // Each shard answers with record g's payload = g as text, in its own order.
        let answers: Vec<(Vec<Vec<u32>>, Vec<u8>)> = parts
            .iter()
            .map(|part| {
                let payloads: Vec<String> = part
                    .local
                    .iter()
                    .map(|&l| p.global(part.shard, l).to_string())
                    .collect();
                (
                    vec![payloads.iter().map(|s| s.len() as u32).collect()],
                    payloads.concat().into_bytes(),
                )
            })
            .collect();
        let replies: Vec<PartReply> = answers
            .iter()
            .map(|(l, b)| PartReply {
                lengths: l,
                body: b,
            })
            .collect();
        let (lengths, bodies) = reassemble(indices.len(), &parts, &replies).unwrap();
        let expected: String = indices.iter().map(u64::to_string).collect();
        assert_eq!(String::from_utf8(bodies[0].clone()).unwrap(), expected);
        assert_eq!(
            lengths[0],
            indices
                .iter()
                .map(|i| i.to_string().len() as u32)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn reassemble_refuses_replies_that_do_not_fit() {
        let p = placement();
        let parts = plan_gather(&p, &[0, 1]);
        let wrong = vec![vec![1u32, 1, 1]];
        let replies: Vec<PartReply> = parts
            .iter()
            .map(|_| PartReply {
                lengths: &wrong,
                body: b"abc",
            })
            .collect();
        assert!(reassemble(2, &parts, &replies).is_err());
    }

    #[test]
    fn append_parts_are_consecutive_per_shard() {
        let p = placement();
        let parts = plan_append(&p, 17, 50);
        let mut seen = 0;
        for part in &parts {
            for (k, &pos) in part.positions.iter().enumerate() {
                assert_eq!(
                    p.locate(17 + pos as u64),
                    (part.shard, part.local_start + k as u64)
                );
            }
            seen += part.positions.len();
        }
        assert_eq!(seen, 50);
    }
}
