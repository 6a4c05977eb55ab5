//! `zr convert --jsonl` and `--webdataset` into a cluster (an in-process one): the text
//! becomes a new token stream, the shards a new record dataset, read back through a client;
//! a failed conversion leaves no dataset behind.

use crate::common::zr;

use std::path::Path;

use zr_sim::{SimCluster, SimOptions};

/// A word-level tokenizer of a few words, split on whitespace.
const TOKENIZER: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": null, "decoder": null,
  "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "</s>": 1, "the": 2, "cat": 3, "sat": 4},
            "unk_token": "[UNK]"}
}"#;

fn shard(path: &Path, samples: &[(String, Vec<u8>, Vec<u8>)]) {
    let mut builder = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (key, jpg, cls) in samples {
        for (extension, bytes) in [("jpg", jpg), ("cls", cls)] {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, format!("{key}.{extension}"), bytes.as_slice())
                .unwrap();
        }
    }
    builder.finish().unwrap();
}

#[test]
fn text_and_shards_convert_into_a_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = SimCluster::start(
        2,
        SimOptions {
            fields: vec![("a".into(), "raw".into())],
            timeout_ms: 5_000,
            ..SimOptions::default()
        },
    )
    .unwrap();
    let addr = cluster.router_addr().to_string();
    let certs = cluster.certs_dir();
    let mut remote = vec!["--router".to_string(), addr];
    match &certs {
        Some(dir) => remote.extend(["--certs".into(), dir.display().to_string()]),
        None => remote.push("--insecure-dev".into()),
    }
    let remote: Vec<&str> = remote.iter().map(String::as_str).collect();
    let tokenizer = tmp.path().join("tokenizer.json");
    std::fs::write(&tokenizer, TOKENIZER).unwrap();
    let tokenizer = tokenizer.to_str().unwrap();

    // Text: 300 documents, into a new token stream, in order.
    let lines: Vec<String> = (0..300)
        .map(|k| {
            let words = ["the", "cat", "sat"];
            let text: Vec<&str> = (0..k % 7).map(|w| words[(k + w) % 3]).collect();
            format!("{{\"text\": \"{}\"}}", text.join(" "))
        })
        .collect();
    let jsonl = tmp.path().join("docs.jsonl");
    std::fs::write(&jsonl, lines.join("\n") + "\n").unwrap();
    let args = [
        "convert",
        "--jsonl",
        jsonl.to_str().unwrap(),
        "--tokenizer",
        tokenizer,
        "--eos",
        "</s>",
        "--dataset",
        "text",
    ];
    let (ok, out, err) = zr(&[&args[..], &remote[..]].concat());
    assert!(ok, "{err}");
    assert!(
        out.contains("300 documents") && out.contains("'text'"),
        "{out}"
    );
    let client = cluster.client().unwrap();
    let stream = zr_router::ClusterStream::open(client.dataset("text").unwrap()).unwrap();
    assert_eq!((stream.documents(), stream.dtype()), (300, "<u2"));
    let lengths = stream.document_lengths().unwrap();
    for (k, len) in lengths.iter().enumerate() {
        assert_eq!(
            *len,
            (k % 7) as u64 + 1,
            "document {k}: its words and the end token"
        );
    }
    // Every token, in order: the words' ids, each document ended by </s>.
    let want: Vec<u16> = (0..300usize)
        .flat_map(|k| {
            let words = (0..k % 7).map(move |w| [2u16, 3, 4][(k + w) % 3]);
            words.chain(std::iter::once(1))
        })
        .collect();
    let total = want.len() as u64;
    let mode = zr_common::WindowMode::Windows {
        seq_len: total - 1,
        stride: total,
    };
    let mut tokens = vec![0u8; want.len() * 2];
    stream.gather(mode, &[0], &mut tokens, None).unwrap();
    let ids: Vec<u16> = tokens
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(ids, want);

    // Shards: a new record dataset, byte-exact.
    let mut samples = Vec::new();
    for s in 0..2 {
        let part: Vec<(String, Vec<u8>, Vec<u8>)> = (0..40)
            .map(|k| {
                let i = s * 40 + k;
                (
                    format!("s{i:04}"),
                    vec![i as u8; 100 + i],
                    i.to_string().into_bytes(),
                )
            })
            .collect();
        shard(&tmp.path().join(format!("train-{s}.tar")), &part);
        samples.extend(part);
    }
    let pattern = tmp.path().join("train-{0..1}.tar");
    let webdataset = [
        "convert",
        "--webdataset",
        pattern.to_str().unwrap(),
        "--dataset",
        "images",
    ];
    let (ok, out, err) = zr(&[&webdataset[..], &remote[..]].concat());
    assert!(ok, "{err}");
    assert!(out.contains("80 samples"), "{out}");
    let images = client.dataset("images").unwrap();
    assert_eq!(images.len().unwrap(), 80);
    let all: Vec<u64> = (0..80).collect();
    let columns = images.gather(&all, &["jpg", "cls"]).unwrap();
    for (k, (_, jpg, cls)) in samples.iter().enumerate() {
        assert_eq!(columns[0].get(k).unwrap(), jpg.as_slice());
        assert_eq!(columns[1].get(k).unwrap(), cls.as_slice());
    }

    // A bad line fails the conversion, names file:line, and leaves no dataset.
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"the cat\"}\nnot json\n").unwrap();
    let args = [
        "convert",
        "--jsonl",
        bad.to_str().unwrap(),
        "--tokenizer",
        tokenizer,
        "--dataset",
        "bad",
    ];
    let (ok, _, err) = zr(&[&args[..], &remote[..]].concat());
    assert!(!ok && err.contains("bad.jsonl:2"), "{err}");
    let listed: Vec<String> = client
        .datasets()
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert!(!listed.contains(&"bad".to_string()), "{listed:?}");
    // A dataset of that name exists already: refused, and the one there is kept.
    let (ok, _, err) = zr(&[&webdataset[..], &remote[..]].concat());
    assert!(!ok && err.contains("images"), "{err}");
    assert_eq!(client.dataset("images").unwrap().len().unwrap(), 80);
    // No name: refused before anything is read.
    let (ok, _, err) = zr(&[
        &[
            "convert",
            "--jsonl",
            bad.to_str().unwrap(),
            "--tokenizer",
            tokenizer,
        ][..],
        &remote[..],
    ]
    .concat());
    assert!(!ok && err.contains("--dataset NAME"), "{err}");
}
