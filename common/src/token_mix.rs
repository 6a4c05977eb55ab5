//! Mixtures weighed in tokens: sources with different lengths mixed by their share of the
//! tokens read, each with an optional budget (stop after N tokens, or after k epochs), in a
//! tree of mixtures with weights at each level — compiled into a [`Mixture`]'s stages, so
//! that the stream, its checkpoints and its resume under other ranks are a mixture's.
//!
//! - A leaf of `len` records of `tokens_per_record` tokens on average (a packed row's real
//!   tokens, a window's `W + 1`, or an SFT example's mean length) read with token weight `w`
//!   is drawn with record weight `w / tokens_per_record`.
//! - A leaf's weight is the product of the weights on its path, each level's renormalized
//!   over the siblings still read: when a leaf's budget is spent, its siblings share its
//!   part of their parent's, and a group whose leaves are all spent gives its part to its
//!   own siblings.
//! - Budgets are met at global-batch boundaries: the first batch after which a leaf has
//!   drawn its budget starts a stage without it (a leaf reads at most one global batch's
//!   share past its budget). When every leaf with a budget is spent and none without one is
//!   left, the stream ends ([`TokenMixPlan::end`]).

use crate::error::Error;
use crate::mixture::{Mixture, MixtureConfig, Stage};

/// How much of a leaf is read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// As long as the stream runs.
    Unlimited,
    /// Until it has given this many tokens.
    Tokens(u64),
    /// Until it has been read this many times over (may be fractional).
    Epochs(f64),
}

/// A node of the mixture's tree.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A dataset (its position among the leaves, in the tree's order, is its index in the
    /// mixture).
    Leaf {
        len: u64,
        tokens_per_record: f64,
        budget: Budget,
    },
    /// A mixture of its children, by token weight.
    Group(Vec<(f64, Source)>),
}

/// A token-weighted mixture compiled into a record mixture.
#[derive(Clone, Debug)]
pub struct TokenMixPlan {
    pub config: MixtureConfig,
    /// The global batch the stream ends at (every budget spent), if it ends.
    pub end: Option<u64>,
    /// Each leaf's budget in records (`None`: unlimited).
    pub budgets: Vec<Option<u64>>,
}

struct Leaf {
    len: u64,
    tokens_per_record: f64,
    budget: Option<u64>,
}

fn leaves(source: &Source, out: &mut Vec<Leaf>) -> Result<(), Error> {
    let bad = |why: String| Err(Error::Sampler(why));
    match source {
        Source::Leaf {
            len,
            tokens_per_record,
            budget,
        } => {
            let leaf = out.len();
            if *len == 0 {
                return bad(format!("source {leaf} is empty"));
            }
            if !(tokens_per_record.is_finite() && *tokens_per_record > 0.0) {
                return bad(format!(
                    "source {leaf} has {tokens_per_record} tokens per record: give a positive number"
                ));
            }
            let budget = match *budget {
                Budget::Unlimited => None,
                Budget::Tokens(tokens) => Some((tokens as f64 / tokens_per_record).ceil() as u64),
                Budget::Epochs(epochs) if epochs.is_finite() && epochs > 0.0 => {
                    Some((epochs * *len as f64).ceil() as u64)
                }
                Budget::Epochs(epochs) => {
                    return bad(format!(
                        "source {leaf} has a budget of {epochs} epochs: give a positive number"
                    ))
                }
            };
            out.push(Leaf {
                len: *len,
                tokens_per_record: *tokens_per_record,
                budget,
            });
            Ok(())
        }
        Source::Group(children) => {
            if children.is_empty() {
                return bad("a group of no sources".into());
            }
            for (k, (weight, child)) in children.iter().enumerate() {
                if !(weight.is_finite() && *weight >= 0.0) {
                    return bad(format!("weight {weight} of a group's child {k}"));
                }
                leaves(child, out)?;
            }
            Ok(())
        }
    }
}

/// Token weight of each leaf, its ancestors' weights renormalized over children with a leaf
/// still read (`active`); 0 for leaves not read.
fn token_weights(root: &Source, active: &[bool]) -> Vec<f64> {
    fn walk(source: &Source, share: f64, next: &mut usize, active: &[bool], out: &mut Vec<f64>) {
        match source {
            Source::Leaf { .. } => {
                out.push(if active[*next] { share } else { 0.0 });
                *next += 1;
            }
            Source::Group(children) => {
                // Which children still have a leaf read, counted before descending.
                let mut at = *next;
                let live: Vec<bool> = children
                    .iter()
                    .map(|(_, child)| {
                        let n = count(child);
                        let any = active[at..at + n].iter().any(|&a| a);
                        at += n;
                        any
                    })
                    .collect();
                let total: f64 = children
                    .iter()
                    .zip(&live)
                    .filter(|(_, &l)| l)
                    .map(|((w, _), _)| *w)
                    .sum();
                for ((weight, child), &l) in children.iter().zip(&live) {
                    let part = if l && total > 0.0 {
                        share * weight / total
                    } else {
                        0.0
                    };
                    walk(child, part, next, active, out);
                }
            }
        }
    }
    fn count(source: &Source) -> usize {
        match source {
            Source::Leaf { .. } => 1,
            Source::Group(children) => children.iter().map(|(_, c)| count(c)).sum(),
        }
    }
    let mut out = Vec::with_capacity(active.len());
    walk(root, 1.0, &mut 0, active, &mut out);
    out
}

/// Compiles `root` into a record mixture of global batches of `batch × ranks` (this rank's
/// part: `rank`), read in the orders `seed` gives.
pub fn plan(
    root: &Source,
    seed: u64,
    rank: u64,
    ranks: u64,
    batch: u64,
) -> Result<TokenMixPlan, Error> {
    let mut found = Vec::new();
    leaves(root, &mut found)?;
    let lengths: Vec<u64> = found.iter().map(|l| l.len).collect();
    let budgets: Vec<Option<u64>> = found.iter().map(|l| l.budget).collect();
    let mut active: Vec<bool> = found.iter().map(|l| l.budget != Some(0)).collect();
    let mut stages: Vec<Stage> = Vec::new();
    let mut start = 0u64;
    let mut end = None;
    loop {
        let tokens = token_weights(root, &active);
        let weights: Vec<f64> = tokens
            .iter()
            .zip(&found)
            .map(|(w, leaf)| w / leaf.tokens_per_record)
            .collect();
        if weights.iter().all(|&w| w <= 0.0) {
            if stages.is_empty() {
                return Err(Error::Sampler(
                    "every source has a weight or a budget of 0: nothing to read".into(),
                ));
            }
            end = Some(start);
            break;
        }
        stages.push(Stage { start, weights });
        let config = MixtureConfig {
            lengths: lengths.clone(),
            stages: stages.clone(),
            seed,
            rank,
            ranks,
            batch,
        };
        let mixture = Mixture::new(config)?;
        // The first batch after which some leaf read in this stage has drawn its budget.
        let mut next: Option<u64> = None;
        for (i, leaf) in found.iter().enumerate() {
            let (Some(budget), true) = (leaf.budget, active[i] && tokens[i] > 0.0) else {
                continue;
            };
            let reached = |b: u64| mixture.drawn_before(b)[i] >= budget;
            // Exponential search, then binary: draws only grow.
            let mut hi = start + 1;
            while !reached(hi) {
                hi = start + (hi - start) * 2;
            }
            let mut lo = start;
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if reached(mid) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            next = Some(next.map_or(hi, |n| n.min(hi)));
        }
        let Some(at) = next else {
            break; // nothing read in this stage ever runs out
        };
        let drawn = mixture.drawn_before(at);
        for (i, leaf) in found.iter().enumerate() {
            if leaf.budget.is_some_and(|b| drawn[i] >= b) {
                active[i] = false;
            }
        }
        start = at;
    }
    Ok(TokenMixPlan {
        config: MixtureConfig {
            lengths,
            stages,
            seed,
            rank,
            ranks,
            batch,
        },
        end,
        budgets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(len: u64, tokens_per_record: f64, budget: Budget) -> Source {
        Source::Leaf {
            len,
            tokens_per_record,
            budget,
        }
    }

    /// Two sources of very different lengths weighed 1:1 by token: records drawn 1:4, so
    /// their tokens come out even.
    #[test]
    fn token_shares_become_record_weights() {
        let root = Source::Group(vec![
            (1.0, leaf(1000, 400.0, Budget::Unlimited)),
            (1.0, leaf(1000, 100.0, Budget::Unlimited)),
        ]);
        let plan = plan(&root, 1, 0, 1, 50).unwrap();
        assert_eq!(plan.end, None);
        let mixture = Mixture::new(plan.config).unwrap();
        let drawn = mixture.drawn_before(200);
        let tokens = [drawn[0] as f64 * 400.0, drawn[1] as f64 * 100.0];
        assert!((tokens[0] / tokens[1] - 1.0).abs() < 0.01, "{tokens:?}");
    }

    /// A budget spent: its siblings share its part of their group, the group keeps its
    /// weight against the other group, and the stream ends when every budget is spent.
    #[test]
    fn budgets_end_sources_and_nested_weights_renormalize() {
        let root = Source::Group(vec![
            (
                3.0,
                Source::Group(vec![
                    (1.0, leaf(500, 10.0, Budget::Tokens(20_000))),
                    (1.0, leaf(800, 10.0, Budget::Epochs(3.0))),
                ]),
            ),
            (1.0, leaf(300, 10.0, Budget::Epochs(2.0))),
        ]);
        let plan = plan(&root, 7, 0, 2, 16).unwrap();
        let end = plan.end.expect("every source has a budget");
        assert_eq!(plan.budgets, vec![Some(2000), Some(2400), Some(600)]);
        let mixture = Mixture::new(plan.config.clone()).unwrap();
        let drawn = mixture.drawn_before(end);
        let global = 32;
        for (i, budget) in plan.budgets.iter().enumerate() {
            let budget = budget.unwrap();
            assert!(drawn[i] >= budget, "source {i}: {} of {budget}", drawn[i]);
            assert!(
                drawn[i] < budget + global,
                "source {i} read far past its budget"
            );
        }
        // In the first stage: the group's two leaves 3/8 each, the lone leaf 1/4.
        let first = &plan.config.stages[0].weights;
        let sum: f64 = first.iter().sum();
        assert!((first[0] / sum - 0.375).abs() < 1e-9 && (first[2] / sum - 0.25).abs() < 1e-9);
        // Source 2 (the lone leaf: 8 a batch for 600) is spent first: the group takes its
        // quarter, its two leaves half each; then source 0, and source 1 reads alone.
        let weights: Vec<Vec<f64>> = plan
            .config
            .stages
            .iter()
            .map(|s| {
                let sum: f64 = s.weights.iter().sum();
                s.weights.iter().map(|w| w / sum).collect()
            })
            .collect();
        assert_eq!(weights.len(), 3, "{weights:?}");
        assert!(
            (weights[1][0] - 0.5).abs() < 1e-9 && weights[1][2] == 0.0,
            "{weights:?}"
        );
        assert_eq!(weights[2], vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn bad_trees_are_refused() {
        assert!(plan(&Source::Group(vec![]), 0, 0, 1, 1).is_err());
        assert!(plan(&leaf(0, 1.0, Budget::Unlimited), 0, 0, 1, 1).is_err());
        assert!(plan(&leaf(5, 0.0, Budget::Unlimited), 0, 0, 1, 1).is_err());
        assert!(plan(&leaf(5, 1.0, Budget::Tokens(0)), 0, 0, 1, 1).is_err());
    }
}
