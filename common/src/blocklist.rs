//! Records a run must not read, each replaced where the run would have read it by another
//! record of the same dataset, chosen by a hash of the position: every other position of
//! the run keeps its record, on any number of ranks, and a longer list changes only the
//! positions that held the records added.
//!
//! A replacement is the first of `hash(key, position, 0), hash(key, position, 1), …` (each
//! reduced into the dataset) that is not blocked itself; a list must leave at least one
//! record of every dataset it names readable.

use crate::error::Error;
use crate::hash::{mix2, reduce};

/// The records of each dataset (by its index in the run) a run does not read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blocklist {
    /// Per dataset, its blocked records, sorted and distinct.
    blocked: Vec<Vec<u64>>,
    key: u64,
}

impl Blocklist {
    /// `(dataset, record)` pairs over datasets of `lengths` records; refused naming a record
    /// past its dataset's end, or a dataset left with nothing to read.
    pub fn new(pairs: &[(u32, u64)], lengths: &[u64], seed: u64) -> Result<Blocklist, Error> {
        let mut blocked = vec![Vec::new(); lengths.len()];
        for &(dataset, record) in pairs {
            let Some(&len) = lengths.get(dataset as usize) else {
                return Err(Error::Sampler(format!(
                    "the blocklist names dataset {dataset}, and the run reads {}",
                    lengths.len()
                )));
            };
            if record >= len {
                return Err(Error::Sampler(format!(
                    "the blocklist names record {record} of dataset {dataset}, which holds {len}"
                )));
            }
            blocked[dataset as usize].push(record);
        }
        for (dataset, list) in blocked.iter_mut().enumerate() {
            list.sort_unstable();
            list.dedup();
            if !list.is_empty() && list.len() as u64 >= lengths[dataset] {
                return Err(Error::Sampler(format!(
                    "the blocklist names every record of dataset {dataset}: nothing is left to read in their place"
                )));
            }
        }
        Ok(Blocklist {
            blocked,
            key: mix2(seed, 0xb10c_0b10),
        })
    }

    /// True if it blocks nothing.
    pub fn is_empty(&self) -> bool {
        self.blocked.iter().all(Vec::is_empty)
    }

    /// Every blocked `(dataset, record)`, in order.
    pub fn pairs(&self) -> Vec<(u32, u64)> {
        self.blocked
            .iter()
            .enumerate()
            .flat_map(|(d, list)| list.iter().map(move |&r| (d as u32, r)))
            .collect()
    }

    /// True if `record` of `dataset` is blocked.
    #[inline]
    pub fn blocks(&self, dataset: usize, record: u64) -> bool {
        self.blocked
            .get(dataset)
            .is_some_and(|list| !list.is_empty() && list.binary_search(&record).is_ok())
    }

    /// What the run reads at `position` (any number that names the position within the
    /// dataset's draws, the same on every rank) in place of `record` of `dataset` (of `len`
    /// records): `record` itself unless blocked.
    #[inline]
    pub fn read(&self, dataset: usize, record: u64, position: u64, len: u64) -> u64 {
        if !self.blocks(dataset, record) {
            return record;
        }
        let at = mix2(mix2(self.key, dataset as u64), position);
        (0u64..)
            .map(|k| reduce(mix2(at, k), len))
            .find(|&r| !self.blocks(dataset, r))
            .unwrap_or(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_record_is_replaced_by_an_unblocked_one_and_others_stay() {
        let list = Blocklist::new(&[(0, 3), (0, 7), (1, 0)], &[10, 5], 1).unwrap();
        for position in 0..1000 {
            let r = list.read(0, 3, position, 10);
            assert!(r != 3 && r != 7 && r < 10);
            assert_eq!(list.read(0, 4, position, 10), 4);
        }
        // Deterministic: the same position, the same replacement.
        assert_eq!(list.read(0, 3, 42, 10), list.read(0, 3, 42, 10));
        assert_eq!(list.pairs(), vec![(0, 3), (0, 7), (1, 0)]);
    }

    #[test]
    fn bad_lists_are_refused_by_name() {
        let e = Blocklist::new(&[(0, 10)], &[10], 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("record 10 of dataset 0, which holds 10"),
            "{e}"
        );
        let e = Blocklist::new(&[(2, 0)], &[10], 1).unwrap_err();
        assert!(e.to_string().contains("dataset 2"), "{e}");
        let e = Blocklist::new(&[(0, 0), (0, 1)], &[2], 1).unwrap_err();
        assert!(e.to_string().contains("every record of dataset 0"), "{e}");
    }
}
