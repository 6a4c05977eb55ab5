//! A node as `zr cluster status` shows it: up, behind, refused or down, from what it
//! answered, whether it is in sync, and its share of the committed records.

/// What a node answered when asked its length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// It holds this many records.
    Holds(u64),
    /// It refused, saying why.
    Refused(String),
    /// It did not answer: why, in words.
    Down(String),
}

/// A node's state in words, and the records it holds if it said: refused while in sync and
/// holding less than `share`, its part of the committed records (its data is missing); up;
/// behind (catching up, serving nothing); refused, or down, with why.
pub fn node_state(answer: Answer, in_sync: bool, share: u64) -> (String, Option<u64>) {
    match answer {
        Answer::Holds(len) if len < share && in_sync => (
            format!(
                "refused: holds {len} of the {share} records committed on it (its data is missing)"
            ),
            Some(len),
        ),
        Answer::Holds(len) if in_sync => ("up".to_string(), Some(len)),
        Answer::Holds(len) => (
            "behind: catching up, serves nothing meanwhile".to_string(),
            Some(len),
        ),
        Answer::Refused(message) => (format!("refused: {message}"), None),
        Answer::Down(why) => (format!("down: {why}"), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_up_behind_missing_data_refused_or_down() {
        let state = |answer, in_sync| node_state(answer, in_sync, 10).0;
        assert_eq!(
            node_state(Answer::Holds(12), true, 10),
            ("up".into(), Some(12))
        );
        assert!(state(Answer::Holds(7), true).contains("holds 7 of the 10 records"));
        assert!(state(Answer::Holds(7), false).starts_with("behind"));
        assert!(state(Answer::Holds(12), false).starts_with("behind"));
        assert_eq!(
            state(Answer::Refused("wrong shard".into()), true),
            "refused: wrong shard"
        );
        let (down, records) = node_state(Answer::Down("timed out".into()), true, 10);
        assert_eq!((down.as_str(), records), ("down: timed out", None));
    }
}
