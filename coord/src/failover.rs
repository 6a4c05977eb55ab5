//! A shard's part of a gather, read from its replicas in turn: which replica is asked first
//! (spread by turns, those known down last), which are passed over, and how a reply that
//! failed midway goes on from another replica without a byte passed on twice.
//!
//! Replicas hold the same records, so their replies to the same request are the same bytes:
//! the part goes on from where the failed one stopped, once the new reply's head announces
//! the same lengths and length. The router's and the one-hop client's part readers
//! (`zr_client::forward`) drive these.

use crate::replicas::NodeId;

/// The order in which a shard's in-sync replicas `in_sync` are asked, at turn `turn`: each
/// turn starts from the next one, so that reads spread over them, and those known down go
/// last (tried only when every other failed).
pub fn read_order(
    mut in_sync: Vec<NodeId>,
    turn: usize,
    known_down: impl Fn(NodeId) -> bool,
) -> Vec<NodeId> {
    if in_sync.len() > 1 {
        let at = turn % in_sync.len();
        in_sync.rotate_left(at);
        in_sync.sort_by_key(|&node| known_down(node));
    }
    in_sync
}

/// The replicas of a part's shard, walked in their read order.
#[derive(Debug)]
pub struct Failover {
    order: Vec<NodeId>,
    next: usize,
}

/// Whom a part's reader turns to next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Ask `node`; `last`: no replica is left after it.
    Ask { node: NodeId, last: bool },
    /// `node` is known down and others are left: it is passed over (it counts as failed).
    PassOver(NodeId),
    /// Every replica was asked or passed over.
    Exhausted,
}

impl Failover {
    /// The replicas in `order` (see [`read_order`]).
    pub fn new(order: Vec<NodeId>) -> Failover {
        Failover { order, next: 0 }
    }

    /// The next replica: one known down is passed over unless it is the last (it may be
    /// back before its heartbeats say so).
    pub fn next(&mut self, known_down: impl Fn(NodeId) -> bool) -> Turn {
        let Some(&node) = self.order.get(self.next) else {
            return Turn::Exhausted;
        };
        self.next += 1;
        let last = self.next == self.order.len();
        if !last && known_down(node) {
            return Turn::PassOver(node);
        }
        Turn::Ask { node, last }
    }
}

/// How far a part's reply has been passed on, across the replicas asked.
#[derive(Debug, Default)]
pub struct Relay {
    /// Bytes of the reply's message passed on.
    sent: u64,
    /// What the first reply's head announced: its lengths and its message's length.
    head: Option<(Vec<Vec<u32>>, u64)>,
}

/// What a reply's head means for the part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// The first reply: everything received is passed on, from the head on.
    First,
    /// A reply after one that failed: its first `skip` bytes were passed on already.
    Resume { skip: u64 },
}

impl Relay {
    /// Bytes of the reply passed on so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// A replica's reply announced `lengths` and a message of `message_len` bytes, of which
    /// `received` are in hand (the head's, all passed on if this is the first reply). The
    /// error: it is not the reply another replica gave.
    pub fn head(
        &mut self,
        lengths: Vec<Vec<u32>>,
        message_len: u64,
        received: u64,
    ) -> Result<Head, String> {
        match &self.head {
            None => {
                self.sent = received;
                self.head = Some((lengths, message_len));
                Ok(Head::First)
            }
            Some((first, first_len)) if *first == lengths && *first_len == message_len => {
                Ok(Head::Resume { skip: self.sent })
            }
            Some(_) => Err("its reply differs from another replica's for the same records".into()),
        }
    }

    /// Of the reply's next chunk, `len` bytes, with `skip` bytes of the reply still to be
    /// skipped (passed on already): the offset in the chunk from which it is passed on, or
    /// `None` if all of it was.
    pub fn pass(&mut self, len: u64, skip: &mut u64) -> Option<u64> {
        if *skip >= len {
            *skip -= len;
            return None;
        }
        let from = *skip;
        *skip = 0;
        self.sent += len - from;
        Some(from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_spread_by_turn_and_down_replicas_go_last() {
        let up = |_| false;
        assert_eq!(read_order(vec![3, 4, 5], 0, up), [3, 4, 5]);
        assert_eq!(read_order(vec![3, 4, 5], 1, up), [4, 5, 3]);
        assert_eq!(read_order(vec![3, 4, 5], 5, up), [5, 3, 4]);
        assert_eq!(read_order(vec![3, 4, 5], 1, |n| n == 4), [5, 3, 4]);
        assert_eq!(read_order(vec![7], 3, |_| true), [7]);
        assert!(read_order(Vec::new(), 3, up).is_empty());
    }

    #[test]
    fn a_down_replica_is_passed_over_unless_it_is_the_last() {
        let mut failover = Failover::new(vec![1, 2, 3]);
        let down = |n| n != 3;
        assert_eq!(failover.next(down), Turn::PassOver(1));
        assert_eq!(failover.next(down), Turn::PassOver(2));
        assert_eq!(
            failover.next(down),
            Turn::Ask {
                node: 3,
                last: true
            }
        );
        assert_eq!(failover.next(down), Turn::Exhausted);
        let mut alone = Failover::new(vec![9]);
        assert_eq!(
            alone.next(|_| true),
            Turn::Ask {
                node: 9,
                last: true
            }
        );
        assert_eq!(Failover::new(Vec::new()).next(|_| false), Turn::Exhausted);
    }

    #[test]
    fn a_reply_other_than_the_first_is_refused() {
        let mut relay = Relay::default();
        assert_eq!(relay.head(vec![vec![2, 3]], 40, 12), Ok(Head::First));
        assert_eq!(relay.sent(), 12);
        assert!(relay.head(vec![vec![2, 4]], 40, 12).is_err());
        assert!(relay.head(vec![vec![2, 3]], 41, 12).is_err());
        assert_eq!(
            relay.head(vec![vec![2, 3]], 40, 3),
            Ok(Head::Resume { skip: 12 })
        );
    }

    proptest! {
        /// However the replicas' replies are cut into chunks, and wherever each fails,
        /// what is passed on is the message once, in order: a prefix of it while replicas
        /// fail, all of it once one finishes.
        #[test]
        fn what_is_passed_on_is_the_message_once(
            len in 1u64..400,
            head in 1u64..30,
            replies in proptest::collection::vec(
                (proptest::collection::vec(1u64..50, 1..20), 0u64..500),
                1..5,
            ),
        ) {
            let head = head.min(len);
            let message: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut relay = Relay::default();
            let mut passed: Vec<u8> = Vec::new();
            for (k, (cuts, fails_after)) in replies.iter().enumerate() {
                let finishes = k + 1 == replies.len();
                let end = if finishes { len } else { (*fails_after).clamp(head, len) };
                // The head arrives whole first, then chunks cut as `cuts` say.
                let mut skip = match relay.head(vec![vec![1]], len, head).unwrap() {
                    Head::First => {
                        passed.extend_from_slice(&message[..head as usize]);
                        0
                    }
                    Head::Resume { skip } => {
                        let mut skip = skip;
                        if let Some(from) = relay.pass(head, &mut skip) {
                            passed.extend_from_slice(&message[from as usize..head as usize]);
                        }
                        skip
                    }
                };
                let mut at = head;
                for &cut in cuts.iter().cycle() {
                    if at >= end {
                        break;
                    }
                    let chunk = cut.min(end - at);
                    if let Some(from) = relay.pass(chunk, &mut skip) {
                        let from = at + from;
                        passed.extend_from_slice(&message[from as usize..(at + chunk) as usize]);
                    }
                    at += chunk;
                }
                prop_assert_eq!(relay.sent(), passed.len() as u64);
                prop_assert_eq!(&passed[..], &message[..passed.len()]);
            }
            prop_assert_eq!(passed, message);
        }
    }
}
