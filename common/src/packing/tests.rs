use super::*;
use crate::hash::mix2;

/// Blocked documents leave exactly the rows that held them; every other document's
/// tokens are read where they were, once.
#[test]
fn a_blocked_document_leaves_only_its_rows() {
    let lengths = lengths(2000, 6);
    let plan = PackPlan::build(&lengths, PackConfig::new(511, 3)).unwrap();
    let blocked = [7u64, 500, 1999];
    let with = plan.clone().block(&blocked).unwrap();
    assert_eq!(with.rows(), plan.rows(), "the rows stay where they are");
    let mut seen = vec![0u64; lengths.len()];
    for r in 0..plan.rows() {
        let (was, now) = (plan.row(r).unwrap(), with.row_read(r).unwrap());
        let kept: Vec<Piece> = was
            .iter()
            .filter(|p| !blocked.contains(&p.document))
            .copied()
            .collect();
        assert_eq!(&*now, &kept[..], "row {r}");
        for p in now.iter() {
            seen[p.document as usize] += p.len as u64;
        }
    }
    for (d, &len) in lengths.iter().enumerate() {
        let want = if blocked.contains(&(d as u64)) {
            0
        } else {
            len
        };
        assert_eq!(seen[d], want, "document {d}");
    }
    let e = plan.block(&[2000]).unwrap_err();
    assert!(
        e.to_string()
            .contains("document 2000, and the stream holds 2000"),
        "{e}"
    );
}

/// Lengths drawn long-tailed, as real corpora are: most short, some many rows long.
fn lengths(n: usize, seed: u64) -> Vec<u64> {
    (0..n as u64)
        .map(|i| {
            let u = (mix2(seed, i) % 10_000) as f64 / 10_000.0;
            // An exponential with mean 300, some documents empty.
            let len = (-(1.0 - u).ln() * 300.0) as u64;
            if mix2(seed ^ 1, i).is_multiple_of(50) {
                len * 20
            } else {
                len
            }
        })
        .collect()
}

fn check_plan(lengths: &[u64], plan: &PackPlan) {
    let width = plan.config().width();
    // Every token of every document once, pieces of a document in order and adjacent.
    let mut covered: Vec<Vec<(u32, u32)>> = vec![Vec::new(); lengths.len()];
    for r in 0..plan.rows() {
        let pieces = plan.row(r).expect("row");
        let used: u64 = pieces.iter().map(|p| p.len as u64).sum();
        assert!(used <= width, "row {r} holds {used} tokens");
        assert!(!pieces.is_empty(), "row {r} is empty");
        for p in pieces {
            covered[p.document as usize].push((p.offset, p.len));
        }
    }
    for (d, pieces) in covered.iter_mut().enumerate() {
        pieces.sort();
        let mut at = 0u64;
        for &(offset, len) in pieces.iter() {
            assert_eq!(offset as u64, at, "document {d}: a gap or an overlap");
            at += len as u64;
        }
        assert_eq!(
            at, lengths[d],
            "document {d}: {at} of {} tokens",
            lengths[d]
        );
    }
    let stats = plan.stats();
    assert_eq!(stats.tokens, lengths.iter().sum::<u64>());
    assert_eq!(stats.rows, plan.rows());
}

#[test]
fn every_token_once_and_no_row_too_long() {
    for (n, seq_len, lookahead) in [(2_000, 127, 64), (500, 2047, 1), (3_000, 511, 4096)] {
        let lengths = lengths(n, n as u64);
        for packer in [Packer::BestFit, Packer::FirstFit] {
            let config = PackConfig {
                seq_len,
                packer,
                lookahead,
                seed: 9,
            };
            let plan = PackPlan::build(&lengths, config).expect("plan");
            check_plan(&lengths, &plan);
            assert!(plan.stats().split > 0 || seq_len > 2047);
        }
    }
}

#[test]
fn best_fit_pads_no_more_than_first_fit_and_the_plan_is_a_pure_function() {
    let lengths = lengths(20_000, 3);
    let build = |packer| {
        PackPlan::build(
            &lengths,
            PackConfig {
                seq_len: 1023,
                packer,
                lookahead: 512,
                seed: 1,
            },
        )
        .expect("plan")
    };
    let (best, first) = (build(Packer::BestFit), build(Packer::FirstFit));
    let pad = |p: &PackPlan| p.stats().padding_fraction(1024);
    assert!(
        pad(&best) <= pad(&first),
        "{} vs {}",
        pad(&best),
        pad(&first)
    );
    assert!(pad(&best) < 0.05, "best fit pads {}", pad(&best));
    let again = build(Packer::BestFit);
    assert_eq!(again.pieces, best.pieces);
    assert_eq!(again.row_ends, best.row_ends);
    // Another seed, another order.
    let other = PackPlan::build(
        &lengths,
        PackConfig {
            seed: 2,
            ..*best.config()
        },
    )
    .expect("plan");
    assert_ne!(other.pieces, best.pieces);
}

#[test]
fn no_documents_make_no_rows() {
    let plan = PackPlan::build(&[], PackConfig::new(7, 1)).expect("plan");
    assert_eq!((plan.rows(), plan.stats().tokens), (0, 0));
    assert!(plan.row(0).is_none());
    let empty = PackPlan::build(&[0, 0], PackConfig::new(7, 1)).expect("plan");
    assert_eq!(empty.rows(), 0);
}

#[test]
fn bad_configurations_are_refused_by_name() {
    let bad = |config: PackConfig| PackPlan::build(&[5, 6], config).expect_err("bad").0;
    assert!(bad(PackConfig::new(0, 1)).contains("seq_len"));
    let mut none = PackConfig::new(8, 1);
    none.lookahead = 0;
    assert!(bad(none).contains("lookahead of 0"));
    assert!("greedy".parse::<Packer>().is_err());
    assert_eq!("first_fit".parse::<Packer>(), Ok(Packer::FirstFit));
}

#[test]
fn columns_agree_with_each_other_and_the_pieces() {
    let lengths = lengths(300, 11);
    let plan = PackPlan::build(&lengths, PackConfig::new(63, 5)).expect("plan");
    let width = 64usize;
    let rows: Vec<u64> = (0..plan.rows()).step_by(3).collect();
    let mut columns = PackedColumns::default();
    columns.describe(rows.iter().map(|&r| plan.row(r).expect("row")), width, 4);
    let inputs = width - 1;
    let mut boundaries = vec![0i32];
    for (k, &r) in rows.iter().enumerate() {
        let pieces = plan.row(r).expect("row");
        let row = |v: &[i32]| v[k * width..(k + 1) * width].to_vec();
        let (segments, positions) = (row(&columns.segment_ids), row(&columns.positions));
        let mask = &columns.loss_mask[k * width..(k + 1) * width];
        let document = &columns.document[k * width..(k + 1) * width];
        let mut at = 0;
        for (s, piece) in pieces.iter().enumerate() {
            for t in 0..piece.len as usize {
                assert_eq!(segments[at + t], s as i32 + 1);
                assert_eq!(positions[at + t], t as i32);
                assert_eq!(document[at + t], piece.document as i64);
                assert_eq!(mask[at + t], u8::from(t + 1 < piece.len as usize));
            }
            let end = (at + piece.len as usize).min(inputs);
            if end > at {
                boundaries.push((k * inputs + end) as i32);
            }
            at += piece.len as usize;
        }
        for t in at..width {
            assert_eq!(
                (segments[t], positions[t], mask[t], document[t]),
                (0, 0, 0, -1)
            );
        }
        if at < inputs {
            boundaries.push(((k + 1) * inputs) as i32);
        }
    }
    assert_eq!(columns.cu_seqlens, boundaries);
    assert_eq!(
        *columns.cu_seqlens.last().expect("end"),
        (rows.len() * inputs) as i32
    );
    let longest = boundaries
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(0);
    assert_eq!(columns.max_seqlen, longest);
    let mut out = Vec::new();
    columns.into_columns(&[], &mut out).expect("columns");
    assert_eq!(out.len(), PACKED_FIELDS.len());
    assert_eq!(out[2].offsets.len(), rows.len() + 1);
}
