//! The replica record: which replicas are behind and which were moved, as the metadata store
//! keeps it (`zr_meta::replicas` reads and writes it, by compare-and-swap).
//!
//! Every replica of a shard holds the same records at the same local indices, except those
//! marked behind here. No shard is ever left without an in-sync replica: marking its last one
//! behind is refused.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// A shard's replica: (shard, replica).
pub type ReplicaId = (u32, u32);

/// The replica record: the replicas that are behind, and those moved to another address
/// than nodes.toml gives them. No record: every replica is in sync where nodes.toml says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub behind: BTreeSet<ReplicaId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<Moved>,
}

/// A replica served from another address than nodes.toml's (`zr cluster replace-node`):
/// this one wins wherever the two differ.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub shard: u32,
    pub replica: u32,
    pub addr: String,
}

/// Marking a replica behind would leave its shard with none in sync.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("shard {shard}'s replica {replica} is its last one in sync, so it cannot be marked behind")]
pub struct LastInSync {
    pub shard: u32,
    pub replica: u32,
}

impl ReplicaRecord {
    /// True if `id` is in sync.
    pub fn in_sync(&self, id: ReplicaId) -> bool {
        !self.behind.contains(&id)
    }

    /// `self` with `id` marked behind, in a cluster of `replicas` replicas per shard;
    /// refused if it is its shard's last replica in sync.
    pub fn with_behind(&self, id: ReplicaId, replicas: u32) -> Result<ReplicaRecord, LastInSync> {
        if self.in_sync(id) && !self.partner_in_sync(id, replicas) {
            return Err(LastInSync {
                shard: id.0,
                replica: id.1,
            });
        }
        let mut next = self.clone();
        next.behind.insert(id);
        Ok(next)
    }

    /// True if another replica of `id`'s shard, of `replicas`, is in sync.
    fn partner_in_sync(&self, (shard, replica): ReplicaId, replicas: u32) -> bool {
        (0..replicas)
            .filter(|&r| r != replica)
            .any(|r| self.in_sync((shard, r)))
    }

    /// The address replica `id` was moved to, if it was.
    pub fn moved_to(&self, id: ReplicaId) -> Option<&str> {
        self.moved
            .iter()
            .find(|m| (m.shard, m.replica) == id)
            .map(|m| m.addr.as_str())
    }

    /// `self` with replica `id` served from `addr` from now on, and behind (the node there
    /// holds nothing yet: it is caught up from a partner before it serves); refused if no
    /// partner of it is in sync.
    pub fn with_moved(
        &self,
        id: ReplicaId,
        replicas: u32,
        addr: &str,
    ) -> Result<ReplicaRecord, LastInSync> {
        let (shard, replica) = id;
        if !self.partner_in_sync(id, replicas) {
            return Err(LastInSync { shard, replica });
        }
        let mut next = self.with_behind(id, replicas)?;
        next.moved.retain(|m| (m.shard, m.replica) != id);
        next.moved.push(Moved {
            shard,
            replica,
            addr: addr.to_string(),
        });
        next.moved.sort_by_key(|m| (m.shard, m.replica));
        Ok(next)
    }
}

/// Where shard `shard`'s replica `replica` is served today, with every node of the cluster
/// (shard, replica, address) and the router's own address: what a replacement is checked
/// against ([`replacement`]).
pub struct Layout<'a> {
    pub shards: u32,
    pub replicas: u32,
    /// Every node: (shard, replica, address).
    pub nodes: &'a [(u32, u32, std::net::SocketAddr)],
    /// The address the router serves clients on, once it does.
    pub router: Option<std::net::SocketAddr>,
}

/// Where `zr cluster replace-node` may serve shard `shard`'s replica `replica` from: `addr`,
/// if the replica exists, has a partner to be rebuilt from, and `addr` is an address a
/// node can be reached at that no other node nor the router serves, and not the replica's
/// own. Else why not, in words an operator acts on.
pub fn replacement(
    shard: u32,
    replica: u32,
    addr: &str,
    layout: &Layout,
) -> Result<std::net::SocketAddr, String> {
    let Layout {
        shards, replicas, ..
    } = *layout;
    if shard >= shards {
        return Err(format!(
            "there is no shard {shard}: the cluster has {shards} (0..{shards})"
        ));
    }
    if replicas < 2 {
        return Err(format!(
            "shard {shard} has a single replica (nodes.toml: replicas = 1): a replacement is rebuilt from a partner replica, and there is none; restore the node's data directory instead"
        ));
    }
    if replica >= replicas {
        return Err(format!(
            "shard {shard} has replicas 0..{replicas}, not {replica}"
        ));
    }
    let addr: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| format!("'{addr}' is not an address (IP:PORT): {e}"))?;
    if addr.ip().is_unspecified() || addr.port() == 0 {
        return Err(format!(
            "{addr} is no address a node can be reached at: give its IP and port"
        ));
    }
    if layout.router == Some(addr) {
        return Err(format!("{addr} is this router's own address, not a node's"));
    }
    match layout.nodes.iter().find(|n| n.2 == addr) {
        Some(&(s, r, _)) if (s, r) == (shard, replica) => Err(format!(
            "{addr} is shard {shard} replica {replica}'s address already: a replacement is a node at another address (a node restarted at the same address with its data lost is rebuilt without one)"
        )),
        Some(&(s, r, _)) => Err(format!("{addr} already serves shard {s} replica {r}")),
        None => Ok(addr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_keeps_one_replica_in_sync() {
        let none = ReplicaRecord::default();
        let one = none.with_behind((0, 1), 2).unwrap();
        assert!(!one.in_sync((0, 1)) && one.in_sync((0, 0)));
        assert_eq!(
            one.with_behind((0, 0), 2),
            Err(LastInSync {
                shard: 0,
                replica: 0
            })
        );
        // Another shard's replicas are their own; marking a behind one again changes nothing.
        assert!(one.with_behind((1, 0), 2).is_ok());
        assert_eq!(one.with_behind((0, 1), 2).unwrap(), one);
        // One replica per shard: it is always the last.
        assert!(none.with_behind((3, 0), 1).is_err());
    }

    #[test]
    fn a_replica_moves_only_while_a_partner_is_in_sync() {
        let none = ReplicaRecord::default();
        let moved = none.with_moved((1, 0), 2, "10.0.0.9:7003").unwrap();
        assert_eq!(moved.moved_to((1, 0)), Some("10.0.0.9:7003"));
        assert_eq!(moved.moved_to((1, 1)), None);
        assert!(!moved.in_sync((1, 0)) && moved.in_sync((1, 1)));
        // Moved again before it caught up: the new address wins, still behind.
        let again = moved.with_moved((1, 0), 2, "10.0.0.10:7003").unwrap();
        assert_eq!(again.moved.len(), 1);
        assert_eq!(again.moved_to((1, 0)), Some("10.0.0.10:7003"));
        // Its partner cannot move while it is behind, nor a replica with no partner.
        assert!(again.with_moved((1, 1), 2, "10.0.0.11:7004").is_err());
        assert!(none.with_moved((0, 0), 1, "10.0.0.11:7004").is_err());
        // A record without moves reads as before (no `moved` key written).
        let text = serde_json::to_string(&none.with_behind((0, 1), 2).unwrap()).unwrap();
        assert!(!text.contains("moved"), "{text}");
        let old: ReplicaRecord = serde_json::from_str(r#"{"behind":[[0,1]]}"#).unwrap();
        assert!(!old.in_sync((0, 1)) && old.moved.is_empty());
    }

    #[test]
    fn a_replacement_is_a_new_address_for_a_replica_with_a_partner() {
        let at = |port: u16| std::net::SocketAddr::from(([10, 0, 0, 1], port));
        let nodes = [(0, 0, at(1)), (0, 1, at(2)), (1, 0, at(3)), (1, 1, at(4))];
        let layout = Layout {
            shards: 2,
            replicas: 2,
            nodes: &nodes,
            router: Some(at(9)),
        };
        let refused = |shard, replica, addr: &str| {
            replacement(shard, replica, addr, &layout).expect_err("refused")
        };
        assert_eq!(replacement(1, 0, "10.0.0.1:5", &layout), Ok(at(5)));
        assert!(refused(2, 0, "10.0.0.1:5").contains("no shard 2"));
        assert!(refused(0, 2, "10.0.0.1:5").contains("replicas 0..2, not 2"));
        assert!(refused(0, 0, "nowhere").contains("not an address"));
        assert!(refused(0, 0, "0.0.0.0:5").contains("no address a node can be reached at"));
        assert!(refused(0, 0, "10.0.0.1:0").contains("no address a node can be reached at"));
        assert!(refused(0, 0, "10.0.0.1:9").contains("router's own address"));
        assert!(refused(0, 0, "10.0.0.1:1").contains("replica 0's address already"));
        assert!(refused(0, 0, "10.0.0.1:4").contains("already serves shard 1 replica 1"));
        let single = Layout {
            replicas: 1,
            ..layout
        };
        let e = replacement(0, 0, "10.0.0.1:5", &single).expect_err("no partner");
        assert!(e.contains("single replica"), "{e}");
    }
}
