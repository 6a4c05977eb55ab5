//! What a router knows of the cluster beside each dataset's state ([`crate::dataset`]), as
//! one value: the move it runs, the catch-ups of behind replicas running, and the revision
//! of the cluster record whose datasets it follows. The placement every dataset is read and
//! written by is published apart, as an immutable snapshot gathers read without a lock.

use std::collections::HashMap;

use crate::catchup::Progress;
use crate::moving::MoveRun;
use crate::NodeId;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct RouterState {
    /// The move this router runs, or ran last.
    pub moving: MoveRun,
    /// The catch-ups running here, by the node caught up.
    pub catch_ups: HashMap<NodeId, Progress>,
    /// The revision of the cluster record whose datasets this router follows.
    followed: u64,
}

impl RouterState {
    /// A cluster record of `revision` was read: true if its datasets are to be followed
    /// (it is no older than the one followed, which it now is); an older one is ignored,
    /// since it would bring back a dataset dropped since.
    pub fn follow(&mut self, revision: u64) -> bool {
        if revision < self.followed {
            return false;
        }
        self.followed = revision;
        true
    }

    /// This router wrote the cluster record at `revision` itself (a drop): records older
    /// than that are not followed from now on.
    pub fn wrote(&mut self, revision: u64) {
        self.followed = self.followed.max(revision);
    }

    /// Whether a record of `revision` is older than the one followed.
    pub fn outdated(&self, revision: u64) -> bool {
        revision < self.followed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_record_is_never_followed() {
        let mut state = RouterState::default();
        assert!(state.follow(0), "the first read");
        assert!(state.follow(5));
        assert!(state.follow(5), "the same record again");
        assert!(
            !state.follow(4),
            "older: it may list a dataset dropped since"
        );
        assert!(state.outdated(4) && !state.outdated(5));
        // A drop this router wrote at 9: what it read before is outdated.
        state.wrote(9);
        assert!(!state.follow(7));
        assert!(state.follow(9));
        state.wrote(3);
        assert!(
            state.outdated(8),
            "a write of an older revision moves nothing back"
        );
    }
}
