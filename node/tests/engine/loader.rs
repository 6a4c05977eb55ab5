//! The loader over a real store: batches equal direct gathers, resume is exact.

use std::sync::Arc;

use zr_common::{Loader, LoaderOptions, Order, Sampler, SamplerConfig, Tail};
use zr_node::CreateOptions;

#[test]
fn loader_over_a_store_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::kit::store_ab(&dir, CreateOptions::default());
    let rows: Vec<(Vec<u8>, Vec<u8>)> = (0..257u32)
        .map(|i| {
            (
                i.to_le_bytes().repeat(1 + i as usize % 9),
                format!("record {i}").into_bytes(),
            )
        })
        .collect();
    crate::kit::append_ab(&store, &rows);
    let store = Arc::new(store);

    let sampler = Sampler::new(SamplerConfig {
        len: store.len(),
        order: Order::Shuffle,
        seed: 17,
        rank: 1,
        ranks: 3,
        batch: 10,
        tail: Tail::Drop,
    })
    .unwrap();
    let options = LoaderOptions {
        fields: vec!["b".into(), "a".into()],
        prefetch: 3,
        workers: 2,
        end_epoch: Some(2),
    };
    let run = |loader: Loader, take: usize| -> (Vec<Vec<u64>>, zr_common::SamplerState) {
        let mut loader = loader;
        let mut seen = Vec::new();
        for batch in loader.by_ref().take(take) {
            let batch = batch.unwrap();
            for (k, &i) in batch.indices.iter().enumerate() {
                assert_eq!(
                    batch.columns[0].get(k).unwrap(),
                    &rows[i as usize].1[..],
                    "field y of record {i}"
                );
                assert_eq!(
                    batch.columns[1].get(k).unwrap(),
                    &rows[i as usize].0[..],
                    "field x of record {i}"
                );
            }
            seen.push(batch.indices.clone());
        }
        (seen, loader.state())
    };
    let start = sampler.start(0);
    let (whole, end) = run(
        Loader::new(Arc::clone(&store), sampler.clone(), start, options.clone()).unwrap(),
        usize::MAX,
    );
    assert_eq!(
        whole.len(),
        2 * 9,
        "85 records per rank: 9 batches per epoch, 2 epochs"
    );
    assert_eq!(end, sampler.start(2));

    let (first, state) = run(
        Loader::new(Arc::clone(&store), sampler.clone(), start, options.clone()).unwrap(),
        11,
    );
    let (rest, _) = run(
        Loader::new(Arc::clone(&store), sampler.clone(), state, options).unwrap(),
        usize::MAX,
    );
    assert_eq!([first, rest].concat(), whole);
}
