//! Router planning, pure: split a gather by shard (the client puts the parts back in order,
//! see `zr_proto::assemble`), split an append by shard. No I/O here.

use zr_proto::placement::Placement;

/// The records one shard serves for a gather.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub shard: u32,
    /// Node addresses (slot and index inside it), in request order.
    pub addresses: Vec<u64>,
    /// Where each record goes in the caller's batch.
    pub positions: Vec<u32>,
}

/// One part per involved shard, in shard order.
pub fn plan_gather(placement: &Placement, indices: &[u64]) -> Vec<Part> {
    let mut parts: Vec<Part> = (0..placement.shards())
        .map(|shard| Part {
            shard,
            addresses: Vec::new(),
            positions: Vec::new(),
        })
        .collect();
    for (pos, &g) in indices.iter().enumerate() {
        let (shard, address) = placement.locate_address(g);
        let part = &mut parts[shard as usize];
        part.addresses.push(address);
        part.positions.push(pos as u32);
    }
    parts.retain(|p| !p.addresses.is_empty());
    parts
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
    use zr_proto::placement::ClusterMap;

    fn placement() -> Placement {
        Placement::new(ClusterMap::balanced(3, 2, 1).unwrap()).unwrap()
    }

    #[test]
    fn gather_parts_cover_every_position_once() {
        let p = placement();
        let indices: Vec<u64> = vec![5, 0, 9, 5, 3000, 1, 2];
        let parts = plan_gather(&p, &indices);
        let mut seen = vec![0; indices.len()];
        for part in &parts {
            for (&address, &pos) in part.addresses.iter().zip(&part.positions) {
                let (shard, local) = p.locate(indices[pos as usize]);
                assert_eq!((shard, p.address_of(shard, local)), (part.shard, address));
                seen[pos as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
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
