//! A client's one-hop gather after a node refused it: when to ask the router for its
//! description of the cluster again, when to gather again, when to hand the gather to the
//! router, when to give up. Without I/O: the client tells [`OneHop`] each refusal and what
//! the router then said, and does what it answers.
//!
//! - A node placed by another map (a move switched it): the description is asked again
//!   after a pause (5 ms, doubling up to 200 ms) and the gather made again, for as long as
//!   the client's timeout allows. A map the router still gives as it was is no stale map
//!   but a misplaced node, which only the router can say why: it serves the gather.
//! - A shard whose replicas all failed, could not say they are in sync, or hold fewer
//!   records than asked for: the description is asked again once; if it changed (replicas
//!   caught up, records deleted) the gather is made again, else the router serves it — it
//!   knows which replicas are in sync now, without a node's lease to wait for. A shard with
//!   one replica that failed fails here: the router has no other.
//! - Anything else fails the gather.
//!
//! The pauses together stay within the timeout; every other wait (a node's reply, a call
//! to the router) is bounded by it on its own.

use std::time::{Duration, Instant};

use zr_proto::ErrorCode;

/// The first pause before asking again after a map switch.
pub const PAUSE_FIRST: Duration = Duration::from_millis(5);
/// The longest pause.
pub const PAUSE_MAX: Duration = Duration::from_millis(200);

/// What the client does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Ask the router for its description after `pause`, then tell [`OneHop::described`].
    Describe { pause: Duration },
    /// Gather again, by the description just taken.
    Again,
    /// Hand the gather to the router, for this reason.
    ViaRouter(&'static str),
    /// Return the refusal as the gather's error.
    Fail,
}

/// What a description of the cluster says that these decisions need.
#[derive(Clone, Copy, Debug)]
pub struct Described<'a> {
    /// The version of the map it places records by.
    pub map_version: u64,
    /// Which nodes are in sync, in shard × replica order.
    pub in_sync: &'a [bool],
    /// The dataset's length.
    pub len: u64,
}

/// Why the description was asked for.
#[derive(Debug)]
enum Asked {
    /// A node refused the gather as placed by another map than version `refused`.
    MapSwitch { refused: u64 },
    /// A shard failed it with `code`, the description then as given.
    Failover {
        code: ErrorCode,
        in_sync: Vec<bool>,
        len: u64,
    },
}

/// One gather's retries (see the module's description).
#[derive(Debug)]
pub struct OneHop {
    deadline: Instant,
    pause: Duration,
    replicas: u32,
    failed_over: bool,
    asked: Option<Asked>,
}

impl OneHop {
    /// A gather begun at `now`, within `timeout`, over shards of `replicas` replicas.
    pub fn new(now: Instant, timeout: Duration, replicas: u32) -> OneHop {
        OneHop {
            deadline: now + timeout,
            pause: PAUSE_FIRST,
            replicas,
            failed_over: false,
            asked: None,
        }
    }

    /// The gather, made by description `by`, was refused at `now` with `code` (`None`: a
    /// failure with no code, such as a malformed reply).
    pub fn refused(&mut self, code: Option<ErrorCode>, by: Described<'_>, now: Instant) -> Next {
        match code {
            Some(ErrorCode::StaleMap | ErrorCode::WrongShard) => {
                if now + self.pause >= self.deadline {
                    return Next::Fail;
                }
                let pause = self.pause;
                self.pause = (self.pause * 2).min(PAUSE_MAX);
                self.asked = Some(Asked::MapSwitch {
                    refused: by.map_version,
                });
                Next::Describe { pause }
            }
            Some(
                code @ (ErrorCode::Unavailable | ErrorCode::NotInSync | ErrorCode::IndexOutOfRange),
            ) => {
                if std::mem::replace(&mut self.failed_over, true) {
                    return self.give_up(code);
                }
                self.asked = Some(Asked::Failover {
                    code,
                    in_sync: by.in_sync.to_vec(),
                    len: by.len,
                });
                Next::Describe {
                    pause: Duration::ZERO,
                }
            }
            _ => Next::Fail,
        }
    }

    /// The router's description, asked for as [`Next::Describe`] said.
    pub fn described(&mut self, fresh: Described<'_>) -> Next {
        match self.asked.take() {
            Some(Asked::MapSwitch { refused }) if fresh.map_version == refused => {
                Next::ViaRouter("a node refused the router's own map")
            }
            Some(Asked::Failover { code, in_sync, len })
                if fresh.in_sync == in_sync.as_slice() && fresh.len == len =>
            {
                self.give_up(code)
            }
            _ => Next::Again,
        }
    }

    /// A shard failed the gather with `code` and the router's description did not change:
    /// the router serves it if it may know more than the nodes said.
    fn give_up(&self, code: ErrorCode) -> Next {
        if code != ErrorCode::Unavailable || self.replicas > 1 {
            Next::ViaRouter("a shard's nodes failed it")
        } else {
            Next::Fail
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by(map_version: u64, in_sync: &[bool], len: u64) -> Described<'_> {
        Described {
            map_version,
            in_sync,
            len,
        }
    }

    #[test]
    fn a_map_switch_is_waited_out_within_the_timeout_with_growing_pauses() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(2);
        let mut one = OneHop::new(t0, timeout, 2);
        let (mut now, mut pauses, mut version) = (t0, Vec::new(), 1);
        loop {
            match one.refused(Some(ErrorCode::StaleMap), by(version, &[true; 2], 9), now) {
                Next::Describe { pause } => {
                    pauses.push(pause);
                    now += pause;
                    // The router's map moved on each time: gather again.
                    version += 1;
                    assert_eq!(one.described(by(version, &[true; 2], 9)), Next::Again);
                }
                Next::Fail => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            &pauses[..3],
            &[PAUSE_FIRST, PAUSE_FIRST * 2, PAUSE_FIRST * 4]
        );
        assert!(pauses.iter().all(|&p| p <= PAUSE_MAX));
        let waited: Duration = pauses.iter().sum();
        assert!(
            waited < timeout && waited > timeout - PAUSE_MAX,
            "{waited:?}"
        );
    }

    #[test]
    fn a_map_the_router_still_gives_goes_to_the_router() {
        let t0 = Instant::now();
        let mut one = OneHop::new(t0, Duration::from_secs(1), 1);
        let next = one.refused(Some(ErrorCode::WrongShard), by(4, &[true], 9), t0);
        assert_eq!(next, Next::Describe { pause: PAUSE_FIRST });
        assert_eq!(
            one.described(by(4, &[true], 9)),
            Next::ViaRouter("a node refused the router's own map")
        );
    }

    #[test]
    fn a_failed_shard_is_tried_again_once_if_the_description_changed() {
        let t0 = Instant::now();
        let zero = Next::Describe {
            pause: Duration::ZERO,
        };
        // Changed (a replica caught up): again; failed again: the router serves it.
        let mut one = OneHop::new(t0, Duration::from_secs(1), 2);
        let was = [true, false];
        assert_eq!(
            one.refused(Some(ErrorCode::NotInSync), by(1, &was, 9), t0),
            zero
        );
        assert_eq!(one.described(by(1, &[true; 2], 9)), Next::Again);
        assert_eq!(
            one.refused(Some(ErrorCode::Unavailable), by(1, &[true; 2], 9), t0),
            Next::ViaRouter("a shard's nodes failed it")
        );
        // Unchanged: with a partner the router may know more; a sole replica that failed
        // leaves the router nothing either, unless it was only out of step.
        for (replicas, code, then) in [
            (
                2,
                ErrorCode::Unavailable,
                Next::ViaRouter("a shard's nodes failed it"),
            ),
            (1, ErrorCode::Unavailable, Next::Fail),
            (
                1,
                ErrorCode::IndexOutOfRange,
                Next::ViaRouter("a shard's nodes failed it"),
            ),
        ] {
            let mut one = OneHop::new(t0, Duration::from_secs(1), replicas);
            assert_eq!(one.refused(Some(code), by(1, &[true], 9), t0), zero);
            assert_eq!(
                one.described(by(1, &[true], 9)),
                then,
                "{replicas} {code:?}"
            );
        }
        // Records deleted meanwhile: the length changed, so again.
        let mut one = OneHop::new(t0, Duration::from_secs(1), 1);
        one.refused(Some(ErrorCode::IndexOutOfRange), by(1, &[true], 9), t0);
        assert_eq!(one.described(by(1, &[true], 7)), Next::Again);
    }

    #[test]
    fn other_refusals_fail_the_gather() {
        let t0 = Instant::now();
        let mut one = OneHop::new(t0, Duration::from_secs(1), 2);
        for code in [
            Some(ErrorCode::BadRequest),
            Some(ErrorCode::Forbidden),
            Some(ErrorCode::NotGranted),
            None,
        ] {
            assert_eq!(one.refused(code, by(1, &[true; 2], 9), t0), Next::Fail);
        }
    }
}
