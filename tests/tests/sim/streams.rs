//! Token streams in a cluster, through the simulator: the same documents written to a local
//! stream and to a cluster's, every window (crossing blocks, extents and shards) read from
//! both and compared, over several commits and a reader that refreshes; a shuffled window
//! loader resumed; a node away with two replicas; wrong uses refused by name.

use std::sync::Arc;

use zr_common::hash::mix2;
use zr_common::{Loader, LoaderOptions, Order, Sampler, SamplerConfig, Tail, WindowMode};
use zr_node::stream::{Component, Observations, Stream, Windows};
use zr_router::{Client, ClusterStream, ClusterWindows, Error};
use zr_sim::{SimCluster, SimOptions};

fn options(replicas: u32) -> SimOptions {
    zr_tests::options(&[("a", "raw")], 2, 5_000, replicas)
}

/// Document `d`'s tokens: lengths from 0 to a few blocks, values from a hash.
fn document(salt: u64, d: u64, block: u64) -> Vec<u8> {
    let len = match mix2(salt, d) % 10 {
        0 => 0,
        1 => block * 3 + mix2(salt, d + 1) % block,
        _ => 1 + mix2(salt, d + 2) % (block / 2),
    };
    (0..len)
        .flat_map(|k| (mix2(salt ^ d, k) as u32).to_le_bytes())
        .collect()
}

/// Every window of `mode` from both streams, compared.
fn compare(local: &Windows, cluster: &ClusterStream, mode: WindowMode) {
    let n = local.len();
    assert_eq!(cluster.count(mode).unwrap(), n, "{mode:?}");
    let width = mode.width() as usize;
    let all: Vec<u64> = (0..n).collect();
    for batch in all.chunks(23) {
        let mut want = Observations::default();
        local.gather(batch, &mut want).unwrap();
        let mut tokens = vec![0u8; batch.len() * width * 4];
        let mut document = vec![0i64; batch.len() * width];
        cluster
            .gather(mode, batch, &mut tokens, Some(&mut document))
            .unwrap();
        assert_eq!(tokens, want.tokens, "{mode:?} windows {batch:?}");
        assert_eq!(document, want.document, "{mode:?} windows {batch:?}");
    }
}

/// Every packed row of both streams, compared, for each packer.
fn compare_packed(local: &Arc<Stream>, cluster: ClusterStream) {
    use zr_common::packing::{PackConfig, PackedColumns, Packer};
    let config = PackConfig {
        seq_len: 95,
        packer: Packer::BestFit,
        lookahead: 16,
        seed: 4,
    };
    let lengths = cluster.document_lengths().unwrap();
    assert_eq!(lengths, zr_node::stream::document_lengths(local));
    // A blocklist leaves the same rows in both.
    let blocked = [1, lengths.len() as u64 / 2];
    let packed = zr_router::ClusterPacked::new(cluster, config)
        .unwrap()
        .block(&blocked)
        .unwrap();
    let here = zr_node::stream::Packed::new(local.clone(), config)
        .unwrap()
        .block(&blocked)
        .unwrap();
    assert_eq!(packed.len(), here.len());
    assert!(
        packed.plan().stats().split > 0,
        "documents longer than a row were cut"
    );
    let all: Vec<u64> = (0..here.len()).rev().collect();
    for batch in all.chunks(17) {
        let (mut want, mut got) = (PackedColumns::default(), PackedColumns::default());
        here.gather(batch, &mut want, None).unwrap();
        packed.gather(batch, &mut got).unwrap();
        assert_eq!(got.tokens, want.tokens, "rows {batch:?}");
        assert_eq!(got.document, want.document, "rows {batch:?}");
        assert_eq!(got.cu_seqlens, want.cu_seqlens, "rows {batch:?}");
        assert!(!got.document.iter().any(|&d| blocked.contains(&(d as u64))));
    }
    let past = packed.gather(&[packed.len()], &mut PackedColumns::default());
    assert!(past.unwrap_err().to_string().contains("out of range"));
}

fn check_streams(replicas: u32) {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = SimCluster::start(3, options(replicas)).unwrap();
    let operator = cluster.client().unwrap();
    let block = 64;
    let mut writer = ClusterStream::create(&operator, "corpus", "<u4", block).unwrap();
    let local = Arc::new(
        Stream::create(dir.path().join("s"), vec![Component::new("token", "<u4")]).unwrap(),
    );
    let reader = corpus_reader(&cluster);
    let mut reader = ClusterStream::open(reader).unwrap();
    assert_eq!((reader.len(), reader.documents()), (0, 0));

    let mut d = 0;
    for round in 0..4 {
        let docs: Vec<Vec<u8>> = (d..d + 25 + round * 10)
            .map(|d| document(7, d, block))
            .collect();
        for tokens in &docs {
            local.append_document(tokens, &[]).unwrap();
        }
        if round % 2 == 0 {
            for tokens in &docs {
                assert_eq!(writer.append_document(tokens).unwrap(), d);
                d += 1;
            }
        } else {
            // As a converter writes: tokens in slices that ignore documents, then the ends.
            let all = docs.concat();
            let mut ends = Vec::new();
            let mut end = writer.len();
            for tokens in &docs {
                end += tokens.len() as u64 / 4;
                ends.push(end);
            }
            for slice in all.chunks(4 * 37) {
                writer.append_tokens(slice).unwrap();
            }
            for &end in &ends {
                writer.end_document_at(end).unwrap();
            }
            d += docs.len() as u64;
        }
        writer.commit().unwrap();
        local.commit().unwrap();
        assert_eq!(writer.len(), local.len());
        assert_eq!(writer.documents(), local.documents());
        reader.refresh().unwrap();
        assert_eq!(
            reader.len(),
            local.len(),
            "a reader sees the commit when it refreshes"
        );
        for (seq_len, stride) in [(31, 32), (100, 37), (200, 200)] {
            let mode = WindowMode::Windows { seq_len, stride };
            compare(&Windows::new(local.clone(), mode).unwrap(), &reader, mode);
        }
    }
    assert!(reader.len() > 10 * block, "the stream spans many blocks");
    // Packed rows: the same plan from the same document lengths, byte for byte the rows.
    let packing = corpus_reader(&cluster);
    compare_packed(&local, ClusterStream::open(packing).unwrap());

    // Two replicas: a node away, and every window still reads.
    if replicas == 2 {
        cluster.stop_node(0).unwrap();
        let mode = WindowMode::Windows {
            seq_len: 63,
            stride: 64,
        };
        compare(&Windows::new(local.clone(), mode).unwrap(), &reader, mode);
        cluster.start_node(0).unwrap();
    }

    // Wrong uses, refused by name.
    let mode = WindowMode::Windows {
        seq_len: 31,
        stride: 32,
    };
    let n = reader.count(mode).unwrap();
    let err = reader
        .gather(mode, &[n], &mut [0u8; 32 * 4], None)
        .unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    let err = reader
        .count(WindowMode::Documents { seq_len: 8 })
        .unwrap_err();
    assert!(matches!(err, Error::Stream { .. }), "{err}");
    let plain = operator
        .create_dataset("plain", vec![zr_router::FieldInfo::new("x", "raw")])
        .unwrap();
    let err = ClusterStream::open(plain).unwrap_err();
    assert!(err.to_string().contains("not a token stream"), "{err}");
    let err = ClusterStream::create(&operator, "floats", "<f4", 64).unwrap_err();
    assert!(err.to_string().contains("uint16"), "{err}");
    assert!(
        writer.append_document(&[1, 2, 3]).is_err(),
        "part of an element"
    );

    // A shuffled loader over the cluster's windows resumes exactly.
    let mode = WindowMode::Windows {
        seq_len: 47,
        stride: 48,
    };
    let windows = Arc::new(ClusterWindows::new(reader, mode).unwrap());
    let sampler = Sampler::new(SamplerConfig {
        len: windows.len(),
        order: Order::Shuffle,
        seed: 3,
        rank: 0,
        ranks: 1,
        batch: 8,
        tail: Tail::Drop,
    })
    .unwrap();
    let opts = LoaderOptions {
        fields: vec!["tokens".into()],
        prefetch: 2,
        workers: 2,
        end_epoch: Some(1),
    };
    let local_windows = Windows::new(local.clone(), mode).unwrap();
    let run = |loader: Loader, take: usize| {
        let mut loader = loader;
        let mut seen = Vec::new();
        for batch in loader.by_ref().take(take) {
            let batch = batch.unwrap();
            let mut want = Observations::default();
            local_windows.gather(&batch.indices, &mut want).unwrap();
            assert_eq!(batch.columns[0].data, want.tokens);
            seen.extend(batch.indices.clone());
        }
        (seen, loader.state())
    };
    let start = sampler.start(0);
    let (whole, _) = run(
        Loader::new(windows.clone(), sampler.clone(), start, opts.clone()).unwrap(),
        usize::MAX,
    );
    let (first, state) = run(
        Loader::new(windows.clone(), sampler.clone(), start, opts.clone()).unwrap(),
        3,
    );
    let (rest, _) = run(
        Loader::new(windows.clone(), sampler, state, opts).unwrap(),
        usize::MAX,
    );
    assert_eq!([first, rest].concat(), whole);
    drop(windows);
    drop(writer);
    drop(operator);
    drop(cluster);
}

#[test]
fn a_clusters_token_stream_reads_as_the_same_local_stream() {
    check_streams(1);
}

#[test]
fn a_replicated_token_stream_reads_through_a_node_away() {
    check_streams(2);
}

/// A reader of dataset `corpus`, with a reader's certificate.
fn corpus_reader(cluster: &SimCluster) -> Client {
    Client::connect_with_timeout(
        cluster.router_addrs()[0],
        cluster.security(zr_net::tls::Role::Reader).unwrap(),
        cluster.client_timeout(),
    )
    .unwrap()
    .dataset("corpus")
    .unwrap()
}
