//! Token streams: windows and documents compared with slicing of the concatenated tokens,
//! spans, refreshes, crashes and power cuts, damage found, and the converters (Megatron-LM
//! `.bin/.idx` written here as Megatron writes it, NumPy tokens + document lengths).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use zr_node::disk::PowerCut;
use zr_node::stream::{
    convert_megatron, convert_tokens, Component, Observations, Span, Stream, WindowMode, Windows,
};
use zr_node::{Error, GatherOptions, ReadPath};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A model of a stream: the tokens, each token's document, and the spans (absolute).
#[derive(Clone, Default)]
struct Model {
    tokens: Vec<u32>,
    document: Vec<i64>,
    starts: Vec<u64>,
    spans: Vec<(u64, u64, Vec<u8>)>,
}

impl Model {
    fn documents(&self) -> u64 {
        self.starts.len() as u64
    }
}

fn u32_element() -> Vec<Component> {
    vec![Component::new("token", "<u4")]
}

/// A new stream of u32 tokens in `dir`, `docs` random documents of at most `max_len` tokens
/// appended and committed; its path and the model of what it holds.
fn committed(dir: &Path, rng: &mut Rng, docs: usize, max_len: u64) -> (PathBuf, Stream, Model) {
    let path = dir.join("s");
    let stream = Stream::create(&path, u32_element()).expect("create");
    let mut model = Model::default();
    fill(&stream, &mut model, rng, docs, max_len);
    stream.commit().expect("commit");
    (path, stream, model)
}

/// Appends `docs` random documents (some empty, some with spans) to `stream` and `model`.
fn fill(stream: &Stream, model: &mut Model, rng: &mut Rng, docs: usize, max_len: u64) {
    for _ in 0..docs {
        let len = if rng.below(8) == 0 {
            0
        } else {
            1 + rng.below(max_len)
        };
        let d = model.documents() as i64;
        let tokens: Vec<u32> = (0..len).map(|_| rng.next() as u32).collect();
        let mut spans = Vec::new();
        let mut metadata = Vec::new();
        if len > 0 {
            for _ in 0..rng.below(4) {
                let a = rng.below(len);
                let b = a + 1 + rng.below(len - a);
                metadata.push((a, b, format!("doc {d} span {a}..{b}").into_bytes()));
            }
        }
        for (a, b, m) in &metadata {
            spans.push(Span {
                start: *a,
                end: *b,
                metadata: m,
            });
        }
        let base = model.tokens.len() as u64;
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let got = stream.append_document(&bytes, &spans).expect("append");
        assert_eq!(got, d as u64);
        model.starts.push(base);
        model.tokens.extend_from_slice(&tokens);
        model.document.extend(std::iter::repeat_n(d, len as usize));
        metadata.sort_by_key(|s| s.0);
        for (a, b, m) in metadata {
            model.spans.push((base + a, base + b, m));
        }
    }
}

/// What a gather of `indices` should return, by the model.
fn expected(model: &Model, mode: WindowMode, indices: &[u64]) -> Observations {
    let width = match mode {
        WindowMode::Windows { seq_len, .. } | WindowMode::Documents { seq_len } => seq_len + 1,
    } as usize;
    let mut out = Observations {
        rows: indices.len(),
        width,
        ..Observations::default()
    };
    let mut ids = Vec::new();
    for (row, &i) in indices.iter().enumerate() {
        let (start, len) = match mode {
            WindowMode::Windows { stride, .. } => (i * stride, width),
            WindowMode::Documents { .. } => {
                let start = model.starts[i as usize];
                let end = model
                    .starts
                    .get(i as usize + 1)
                    .copied()
                    .unwrap_or(model.tokens.len() as u64);
                (start, ((end - start) as usize).min(width))
            }
        };
        let s = start as usize;
        for k in 0..width {
            let real = k < len;
            let t = if real { model.tokens[s + k] } else { 0 };
            out.tokens.extend_from_slice(&t.to_le_bytes());
            out.document
                .push(if real { model.document[s + k] } else { -1 });
            if matches!(mode, WindowMode::Documents { .. }) {
                out.mask.push(real as u8);
            }
        }
        let end = start + len as u64;
        for (j, (a, b, _)) in model.spans.iter().enumerate() {
            if *a < end && *b > start && len > 0 {
                out.spans.push(zr_node::stream::SpanHit {
                    row: row as u64,
                    start: a.max(&start) - start,
                    end: b.min(&end) - start,
                    span: j as u64,
                });
                ids.push(j as u64);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    out.metadata.offsets.push(0);
    for &j in &ids {
        out.metadata
            .data
            .extend_from_slice(&model.spans[j as usize].2);
        out.metadata.offsets.push(out.metadata.data.len() as u64);
    }
    out.span_ids = ids;
    out
}

fn check(windows: &Windows, model: &Model, indices: &[u64]) {
    let mut got = Observations::default();
    windows.gather(indices, &mut got).expect("gather");
    let want = expected(model, windows.mode(), indices);
    assert_eq!(got.tokens, want.tokens, "tokens of {indices:?}");
    assert_eq!(got.document, want.document, "documents of {indices:?}");
    assert_eq!(got.mask, want.mask, "mask of {indices:?}");
    let mut spans = got.spans.clone();
    spans.sort_by_key(|h| (h.row, h.span));
    assert_eq!(spans, want.spans, "spans of {indices:?}");
    assert_eq!(got.span_ids, want.span_ids);
    assert_eq!(got.metadata, want.metadata);
}

fn window_count(model: &Model, seq_len: u64, stride: u64) -> u64 {
    let t = model.tokens.len() as u64;
    if t < seq_len + 1 {
        0
    } else {
        (t - seq_len - 1) / stride + 1
    }
}

#[test]
fn windows_match_slices_of_the_concatenated_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng(7);
    let (path, stream, model) = committed(dir.path(), &mut rng, 300, 200);
    assert_eq!(stream.len(), model.tokens.len() as u64);
    assert_eq!(stream.documents(), model.documents());
    drop(stream);

    // W changes between opens; nothing is rewritten.
    for (seq_len, stride) in [(16, 16), (63, 7), (1, 1), (1000, 333), (2047, 2048)] {
        let stream = Arc::new(Stream::open_read_only(&path).expect("open"));
        let mode = WindowMode::Windows { seq_len, stride };
        let windows = Windows::new(stream, mode).expect("windows");
        let n = window_count(&model, seq_len, stride);
        assert_eq!(windows.len(), n, "seq_len {seq_len} stride {stride}");
        if n == 0 {
            continue;
        }
        let all: Vec<u64> = (0..n).collect();
        for batch in all.chunks(37) {
            check(&windows, &model, batch);
        }
        let random: Vec<u64> = (0..64).map(|_| rng.below(n)).collect();
        check(&windows, &model, &random);
        // Disk reads (through the page cache and around it) give the same bytes.
        for uncached in [false, true] {
            let direct = windows.clone().with_options(GatherOptions {
                read: ReadPath::Direct,
                uncached,
                ..GatherOptions::default()
            });
            check(&direct, &model, &random);
        }
        let past = windows.gather(&[n], &mut Observations::default());
        assert!(
            matches!(past, Err(Error::IndexOutOfRange { index, len }) if index == n && len == n),
            "{past:?}"
        );
    }
}

#[test]
fn document_mode_cuts_and_pads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stream = Stream::create(dir.path().join("s"), u32_element()).expect("create");
    let mut model = Model::default();
    let mut rng = Rng(11);
    fill(&stream, &mut model, &mut rng, 120, 90);
    stream.commit().expect("commit");
    let stream = Arc::new(stream);
    let windows = Windows::new(stream, WindowMode::Documents { seq_len: 40 }).expect("docs");
    assert_eq!(windows.len(), model.documents());
    let all: Vec<u64> = (0..model.documents()).collect();
    check(&windows, &model, &all);
    let direct = windows.with_options(GatherOptions {
        read: ReadPath::Direct,
        ..GatherOptions::default()
    });
    check(&direct, &model, &[5, 0, 119, 5]);
}

#[test]
fn uint16_and_structured_elements() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stream = Stream::create(dir.path().join("s16"), vec![Component::new("token", "<u2")])
        .expect("create");
    let tokens: Vec<u8> = (0u16..5000).flat_map(|t| t.to_le_bytes()).collect();
    stream
        .append_document(&tokens[..3000], &[])
        .expect("append");
    stream
        .append_document(&tokens[3000..], &[])
        .expect("append");
    stream.commit().expect("commit");
    assert_eq!(stream.len(), 5000);
    let windows = Windows::new(
        Arc::new(stream),
        WindowMode::Windows {
            seq_len: 999,
            stride: 1000,
        },
    )
    .expect("windows");
    let mut out = Observations::default();
    windows.gather(&[1], &mut out).expect("gather");
    assert_eq!(&out.tokens[..], &tokens[2000..4000]);
    assert_eq!(out.document[499], 0);
    assert_eq!(out.document[500], 1);

    // token u32 + concept u16, as one 6-byte element.
    let element = vec![
        Component::new("token", "<u4"),
        Component::new("concept", "<u2"),
    ];
    let stream = Stream::create(dir.path().join("s6"), element).expect("create");
    assert_eq!(stream.element_bytes(), 6);
    let doc: Vec<u8> = (0u32..1000)
        .flat_map(|t| {
            let mut e = t.to_le_bytes().to_vec();
            e.extend_from_slice(&((t % 7) as u16).to_le_bytes());
            e
        })
        .collect();
    stream.append_document(&doc, &[]).expect("append");
    assert!(
        stream.append_document(&doc[..5], &[]).is_err(),
        "a part of an element"
    );
    stream.commit().expect("commit");
    let windows = Windows::new(
        Arc::new(stream),
        WindowMode::Windows {
            seq_len: 9,
            stride: 10,
        },
    )
    .expect("windows");
    windows.gather(&[3], &mut out).expect("gather");
    assert_eq!(&out.tokens[..], &doc[180..240]);

    for bad in [
        vec![Component::new("token", "<f4")],
        vec![],
        vec![Component::new("token", ">u4")],
        vec![
            Component::new("token", "<u4"),
            Component::new("token", "<u2"),
        ],
    ] {
        let made = Stream::create(dir.path().join("bad"), bad.clone());
        assert!(matches!(made, Err(Error::InvalidSchema(_))), "{bad:?}");
    }
}

#[test]
fn readers_see_commits_when_they_refresh_and_the_writer_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s");
    let writer = Stream::create(&path, u32_element()).expect("create");
    let reader = Stream::open_read_only(&path).expect("reader");
    let mut model = Model::default();
    let mut rng = Rng(3);
    fill(&writer, &mut model, &mut rng, 10, 50);
    assert_eq!(writer.len(), 0, "not committed yet");
    writer.commit().expect("commit");
    assert_eq!(writer.len(), model.tokens.len() as u64);
    assert_eq!(
        reader.len(),
        0,
        "a reader sees what it opened until it refreshes"
    );
    assert_eq!(
        reader.refresh().expect("refresh"),
        model.tokens.len() as u64
    );
    fill(&writer, &mut model, &mut rng, 10, 5000);
    writer.commit().expect("commit");
    reader.refresh().expect("refresh");
    let windows = Windows::new(
        Arc::new(reader),
        WindowMode::Windows {
            seq_len: 100,
            stride: 50,
        },
    )
    .expect("windows");
    let n = windows.len();
    assert_eq!(n, window_count(&model, 100, 50));
    let all: Vec<u64> = (0..n).collect();
    check(&windows, &model, &all);

    // A second writer is refused; so is an open document at commit.
    assert!(matches!(Stream::open(&path), Err(Error::Locked { .. })));
    writer.append_tokens(&[1, 0, 0, 0]).expect("tokens");
    assert!(writer.commit().is_err(), "an open document");
    writer.end_document().expect("end");
    writer.commit().expect("commit");
    assert_eq!(writer.documents(), model.documents() + 1);
}

#[test]
fn uncommitted_appends_are_gone_after_a_crash_and_the_stream_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng(5);
    let (path, stream, mut model) = committed(dir.path(), &mut rng, 50, 3000);
    let mut lost = model.clone();
    fill(&stream, &mut lost, &mut rng, 20, 3000);
    drop(stream); // no commit: as if the process died

    let stream = Stream::open(&path).expect("reopen");
    assert_eq!(stream.len(), model.tokens.len() as u64);
    assert_eq!(stream.spans(), model.spans.len() as u64);
    fill(&stream, &mut model, &mut rng, 20, 3000);
    stream.commit().expect("commit");
    let report = stream.verify(|_| {}).expect("verify");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let windows =
        Windows::new(Arc::new(stream), WindowMode::Documents { seq_len: 3000 }).expect("docs");
    let all: Vec<u64> = (0..model.documents()).collect();
    check(&windows, &model, &all);
}

#[test]
fn a_power_cut_at_any_change_keeps_exactly_the_last_commit() {
    let mut rng = Rng(99);
    for cut_at in 0..60u64 {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, stream, mut model) = committed(dir.path(), &mut rng, 8, 1500);
        drop(stream);
        // Opened again on the recorder's disk: from here on its changes are logged.
        let recorder = PowerCut::record(dir.path());
        let stream = Stream::open_on(&recorder.disk(), &path).expect("open on the recorder");
        recorder.fail_after(cut_at);
        let mut next = model.clone();
        let mut done = true;
        for _ in 0..3 {
            let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fill(&stream, &mut next, &mut rng, 3, 1500);
            }));
            if step.is_err() || stream.commit().is_err() {
                done = false;
                break;
            }
            model = next.clone();
        }
        drop(stream);
        let keep_seed = rng.next();
        recorder
            .cut(|k| (keep_seed >> (k % 64)) & 1 == 1)
            .expect("cut");
        let stream = Stream::open(&path).expect("reopen after the cut");
        assert_eq!(
            stream.len(),
            model.tokens.len() as u64,
            "cut at change {cut_at} (finished: {done})"
        );
        let report = stream.verify(|_| {}).expect("verify");
        assert!(
            report.problems.is_empty(),
            "cut at {cut_at}: {:?}",
            report.problems
        );
        let windows =
            Windows::new(Arc::new(stream), WindowMode::Documents { seq_len: 1500 }).expect("docs");
        let all: Vec<u64> = (0..model.documents()).collect();
        check(&windows, &model, &all);
        if done {
            break;
        }
    }
}

/// Flips one byte of `file` at `at`.
fn flip(file: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .expect("open");
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).expect("read");
    b[0] ^= 0x40;
    f.write_all_at(&b, at).expect("write");
}

/// Counts in `stream.json` too large for any file are refused at open, naming the count
/// (multiplied unchecked, `documents = 2^61 + 200` came to 1,600 bytes and opened).
#[test]
fn counts_past_any_file_size_are_refused_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, stream, _) = committed(dir.path(), &mut Rng(3), 30, 500);
    drop(stream);
    let json_path = path.join("stream.json");
    let good = std::fs::read_to_string(&json_path).expect("stream.json");
    let meta: serde_json::Value = serde_json::from_str(&good).expect("json");
    for (key, value) in [
        ("documents", (1u64 << 61) + 200),
        ("tokens", (1u64 << 62) + 1),
        ("spans", u64::MAX / 2),
    ] {
        let mut bad = meta.clone();
        bad[key] = serde_json::json!(value);
        std::fs::write(&json_path, bad.to_string()).expect("write");
        let err = Stream::open_read_only(&path).expect_err(key).to_string();
        assert!(err.contains(&format!("{key} = {value}")), "{key}: {err}");
    }
    std::fs::write(&json_path, good).expect("write");
    Stream::open_read_only(&path).expect("the good file opens again");
}

#[test]
fn damage_is_found_by_verify_and_by_checked_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, stream, _) = committed(dir.path(), &mut Rng(1), 40, 2000);
    drop(stream);
    flip(&path.join("tokens.bin"), 5000);
    flip(&path.join("documents.bin"), 8);
    let stream = Arc::new(Stream::open_read_only(&path).expect("open"));
    let report = stream.verify(|_| {}).expect("verify");
    let tables: Vec<(&str, u64)> = report
        .problems
        .iter()
        .map(|p| (p.field.as_str(), p.index))
        .collect();
    assert!(tables.contains(&("tokens", 1)), "{:?}", report.problems);
    assert!(
        tables.iter().any(|t| t.0 == "documents"),
        "{:?}",
        report.problems
    );

    let windows = Windows::new(
        stream,
        WindowMode::Windows {
            seq_len: 99,
            stride: 100,
        },
    )
    .expect("windows");
    // Token 1250 (byte 5000) is in window 12.
    for options in [
        GatherOptions {
            read: ReadPath::Direct,
            ..GatherOptions::default()
        },
        GatherOptions {
            read: ReadPath::Mmap,
            verify: true,
            ..GatherOptions::default()
        },
    ] {
        let read = windows
            .clone()
            .with_options(options)
            .gather(&[12], &mut Observations::default());
        let message = read.expect_err("damage").to_string();
        assert!(
            message.contains("tokens.bin") && message.contains("CRC"),
            "{message}"
        );
        windows
            .clone()
            .with_options(options)
            .gather(&[40], &mut Observations::default())
            .expect("an undamaged window");
    }
}

/// Writes `PREFIX.bin` and `PREFIX.idx` as Megatron-LM's `IndexedDatasetBuilder` does: one
/// sequence per document here, except that `split` documents are written as two sequences.
fn write_megatron(prefix: &Path, documents: &[Vec<u32>], uint16: bool, split: bool) {
    let size = if uint16 { 2 } else { 4 };
    let mut bin = Vec::new();
    let mut lengths: Vec<i32> = Vec::new();
    let mut doc_index: Vec<i64> = vec![0];
    for doc in documents {
        let parts: Vec<&[u32]> = if split && doc.len() > 1 {
            let (a, b) = doc.split_at(doc.len() / 2);
            vec![a, b]
        } else {
            vec![&doc[..]]
        };
        for part in parts {
            for &t in part {
                if uint16 {
                    bin.extend_from_slice(&(t as u16).to_le_bytes());
                } else {
                    bin.extend_from_slice(&(t as i32).to_le_bytes());
                }
            }
            lengths.push(part.len() as i32);
        }
        doc_index.push(lengths.len() as i64);
    }
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(if uint16 { 8 } else { 4 });
    idx.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
    idx.extend_from_slice(&(doc_index.len() as u64).to_le_bytes());
    for l in &lengths {
        idx.extend_from_slice(&l.to_le_bytes());
    }
    let mut pointer = 0i64;
    for l in &lengths {
        idx.extend_from_slice(&pointer.to_le_bytes());
        pointer += *l as i64 * size;
    }
    for d in &doc_index {
        idx.extend_from_slice(&d.to_le_bytes());
    }
    std::fs::write(prefix.with_extension("bin"), bin).expect("bin");
    std::fs::write(prefix.with_extension("idx"), idx).expect("idx");
}

fn random_documents(rng: &mut Rng, count: usize, vocab: u64) -> Vec<Vec<u32>> {
    (0..count)
        .map(|_| {
            let len = if rng.below(10) == 0 {
                0
            } else {
                rng.below(700)
            };
            (0..len).map(|_| rng.below(vocab) as u32).collect()
        })
        .collect()
}

#[test]
fn megatron_indexed_datasets_convert_window_for_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng(21);
    for (uint16, split) in [(true, false), (false, true), (false, false)] {
        let documents = random_documents(&mut rng, 150, if uint16 { 50_000 } else { 1 << 31 });
        let prefix = dir.path().join(format!("corpus_{uint16}_{split}"));
        write_megatron(&prefix, &documents, uint16, split);
        let dest = dir.path().join(format!("stream_{uint16}_{split}"));
        let mut reported = 0;
        let meta = convert_megatron(&prefix, &dest, |done, _| reported = done).expect("convert");
        let size = if uint16 { 2 } else { 4 };
        let total: usize = documents.iter().map(Vec::len).sum();
        assert_eq!(meta.tokens, total as u64);
        assert_eq!(meta.documents, documents.len() as u64);
        assert_eq!(reported, total as u64 * size);
        assert_eq!(meta.element[0].dtype, if uint16 { "<u2" } else { "<u4" });

        // Every window against NumPy-style slicing of the concatenated tokens.
        let flat: Vec<u32> = documents.concat();
        let doc_of: Vec<i64> = documents
            .iter()
            .enumerate()
            .flat_map(|(d, doc)| std::iter::repeat_n(d as i64, doc.len()))
            .collect();
        let stream = Arc::new(Stream::open_read_only(&dest).expect("open"));
        let (seq_len, stride) = (127, 128);
        let windows =
            Windows::new(stream, WindowMode::Windows { seq_len, stride }).expect("windows");
        let n = (flat.len() as u64 - seq_len - 1) / stride + 1;
        assert_eq!(windows.len(), n);
        let mut out = Observations::default();
        let all: Vec<u64> = (0..n).collect();
        windows.gather(&all, &mut out).expect("gather");
        for (row, &i) in all.iter().enumerate() {
            let s = (i * stride) as usize;
            let w = seq_len as usize + 1;
            let tokens = &out.tokens[row * w * size as usize..(row + 1) * w * size as usize];
            let want: Vec<u8> = flat[s..s + w]
                .iter()
                .flat_map(|&t| {
                    if uint16 {
                        (t as u16).to_le_bytes().to_vec()
                    } else {
                        t.to_le_bytes().to_vec()
                    }
                })
                .collect();
            assert_eq!(tokens, &want[..], "window {i}");
            assert_eq!(&out.document[row * w..(row + 1) * w], &doc_of[s..s + w]);
        }
    }
}

#[test]
fn malformed_megatron_indexes_are_refused_and_leave_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = dir.path().join("good");
    let documents = random_documents(&mut Rng(4), 5, 1000);
    write_megatron(&prefix, &documents, true, false);
    let good = std::fs::read(prefix.with_extension("idx")).expect("idx");
    let bin = std::fs::read(prefix.with_extension("bin")).expect("bin");
    let sequences = documents.len();
    let mut cases: Vec<(&str, Vec<u8>, Vec<u8>)> = Vec::new();
    let mut bad = good.clone();
    bad[0] = b'X';
    cases.push(("magic", bad, bin.clone()));
    let mut bad = good.clone();
    bad[9] = 2;
    cases.push(("version 2", bad, bin.clone()));
    let mut bad = good.clone();
    bad[17] = 6;
    cases.push(("float64", bad, bin.clone()));
    let mut bad = good.clone();
    bad[18..26].copy_from_slice(&(1u64 << 40).to_le_bytes());
    cases.push(("need more bytes", bad, bin.clone()));
    cases.push(("too short", good[..20].to_vec(), bin.clone()));
    cases.push((
        "past the end of the .bin",
        good.clone(),
        bin[..bin.len() - 2].to_vec(),
    ));
    let mut bad = good.clone();
    let last = bad.len() - 8;
    bad[last..].copy_from_slice(&(sequences as u64 - 1).to_le_bytes());
    cases.push(("ends at sequence", bad, bin.clone()));
    let mut bad = good.clone();
    bad.extend_from_slice(&[0; 3]);
    cases.push(("past its arrays", bad, bin.clone()));
    // Sequence 3 pointing back at the start: the same bytes read twice (an import would
    // multiply its input).
    let mut bad = good.clone();
    let pointer_3 = 34 + sequences * 4 + 3 * 8;
    bad[pointer_3..pointer_3 + 8].copy_from_slice(&0u64.to_le_bytes());
    cases.push((
        "sequence 3 starts at byte 0, inside or before",
        bad,
        bin.clone(),
    ));
    for (k, (expect, idx, bin)) in cases.into_iter().enumerate() {
        let prefix = dir.path().join(format!("bad{k}"));
        std::fs::write(prefix.with_extension("idx"), idx).expect("idx");
        std::fs::write(prefix.with_extension("bin"), bin).expect("bin");
        let dest = dir.path().join(format!("dest{k}"));
        let err = convert_megatron(&prefix, &dest, |_, _| {}).expect_err(expect);
        let message = err.to_string();
        assert!(message.contains(expect), "{expect}: {message}");
        assert!(
            message.contains(".idx") || message.contains(".bin"),
            "{message}"
        );
        assert!(!dest.exists(), "{expect}: a destination was left behind");
    }
    // A negative int32 token is found while copying: the half-made stream is removed.
    let prefix = dir.path().join("negative");
    write_megatron(&prefix, &[vec![1, 2, 3], vec![u32::MAX]], false, false);
    let dest = dir.path().join("neg");
    let err = convert_megatron(&prefix, &dest, |_, _| {}).expect_err("negative");
    assert!(err.to_string().contains("negative"), "{err}");
    assert!(!dest.exists());
}

fn write_npy(path: &Path, descr: &str, count: usize, data: &[u8]) {
    let bytes = zr_node::convert::npy_bytes(descr, &[count as u64], data);
    std::fs::write(path, bytes).expect("npy");
}

#[test]
fn numpy_tokens_with_document_lengths_convert() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens: Vec<i64> = (0..10_000).map(|t| t * 7 % 100_003).collect();
    let lengths: Vec<i64> = vec![0, 4000, 1, 5999];
    let tokens_bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let lengths_bytes: Vec<u8> = lengths.iter().flat_map(|t| t.to_le_bytes()).collect();
    write_npy(
        &dir.path().join("t.npy"),
        "<i8",
        tokens.len(),
        &tokens_bytes,
    );
    write_npy(
        &dir.path().join("l.npy"),
        "<i8",
        lengths.len(),
        &lengths_bytes,
    );
    let dest = dir.path().join("s");
    let meta = convert_tokens(
        &dir.path().join("t.npy"),
        &dir.path().join("l.npy"),
        &dest,
        |_, _| {},
    )
    .expect("convert");
    assert_eq!((meta.tokens, meta.documents), (10_000, 4));
    assert_eq!(meta.element[0].dtype, "<u4");
    let stream = Stream::open_read_only(&dest).expect("open");
    assert_eq!(stream.document(1).expect("doc"), (0, 4000));
    assert_eq!(stream.document(3).expect("doc"), (4001, 10_000));
    let mut out = vec![0u8; 8];
    stream.read_tokens(4000, &mut out).expect("read");
    let want: Vec<u8> = [28_000u32, 28_007]
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    assert_eq!(out, want);

    // Lengths that do not add up, and negative tokens, are refused; nothing is left.
    write_npy(&dir.path().join("l2.npy"), "<i8", 1, &9999i64.to_le_bytes());
    let dest = dir.path().join("s2");
    let err = convert_tokens(
        &dir.path().join("t.npy"),
        &dir.path().join("l2.npy"),
        &dest,
        |_, _| {},
    )
    .expect_err("sum");
    assert!(err.to_string().contains("sum to 9999"), "{err}");
    assert!(!dest.exists());
    write_npy(
        &dir.path().join("neg.npy"),
        "<i4",
        2,
        &[1, 0, 0, 0, 255, 255, 255, 255],
    );
    write_npy(&dir.path().join("l3.npy"), "<i4", 1, &2i32.to_le_bytes());
    let err = convert_tokens(
        &dir.path().join("neg.npy"),
        &dir.path().join("l3.npy"),
        &dest,
        |_, _| {},
    )
    .expect_err("negative");
    assert!(err.to_string().contains("token 1"), "{err}");
    assert!(!dest.exists());
}

#[test]
fn a_shuffled_window_loader_resumes_exactly_and_on_other_ranks() {
    use zr_common::{Loader, LoaderOptions, Order, Sampler, SamplerConfig, Tail};
    let dir = tempfile::tempdir().expect("tempdir");
    let stream = Stream::create(dir.path().join("s"), u32_element()).expect("create");
    let mut model = Model::default();
    fill(&stream, &mut model, &mut Rng(8), 200, 400);
    stream.commit().expect("commit");
    let (seq_len, stride) = (31, 32);
    let windows = Arc::new(
        Windows::new(Arc::new(stream), WindowMode::Windows { seq_len, stride }).expect("windows"),
    );
    let sampler = |rank, ranks| {
        Sampler::new(SamplerConfig {
            len: windows.len(),
            order: Order::Shuffle,
            seed: 5,
            rank,
            ranks,
            batch: 4 / ranks, // the global batch stays 4
            tail: Tail::Drop,
        })
        .expect("sampler")
    };
    let options = LoaderOptions {
        fields: vec!["tokens".into(), "document".into()],
        prefetch: 2,
        workers: 2,
        end_epoch: Some(2),
    };
    // Every batch equals a direct gather; returns the indices seen and the state after.
    let run = |loader: Loader, take: usize| {
        let mut loader = loader;
        let mut seen = Vec::new();
        for batch in loader.by_ref().take(take) {
            let batch = batch.expect("batch");
            let want = expected(&model, windows.mode(), &batch.indices);
            assert_eq!(batch.columns[0].data, want.tokens);
            let docs: Vec<u8> = want.document.iter().flat_map(|d| d.to_le_bytes()).collect();
            assert_eq!(batch.columns[1].data, docs);
            seen.extend(batch.indices.clone());
        }
        (seen, loader.state())
    };
    let one = sampler(0, 1);
    let start = one.start(0);
    let (whole, _) = run(
        Loader::new(windows.clone(), one.clone(), start, options.clone()).expect("loader"),
        usize::MAX,
    );
    let (first, state) = run(
        Loader::new(windows.clone(), one.clone(), start, options.clone()).expect("loader"),
        7,
    );
    let (rest, _) = run(
        Loader::new(windows.clone(), one, state, options.clone()).expect("loader"),
        usize::MAX,
    );
    assert_eq!([first.clone(), rest].concat(), whole);
    // The same checkpoint resumed on two ranks: together they read what one rank would.
    let mut split = Vec::new();
    for rank in 0..2 {
        let ranked = sampler(rank, 2);
        let state = ranked.adopt(&state).expect("adopt");
        let (seen, _) = run(
            Loader::new(windows.clone(), ranked, state, options.clone()).expect("loader"),
            usize::MAX,
        );
        split.extend(seen);
    }
    let mut after: Vec<u64> = whole[first.len()..].to_vec();
    after.sort_unstable();
    split.sort_unstable();
    assert_eq!(split, after);
}

/// Packed rows read back against the model: each row is its pieces' tokens of the
/// concatenated documents, back to back, then zeros; every token of every document is in
/// exactly one row; the spans a row overlaps are found where its pieces lie; and the read
/// paths (mapping, explicit reads with CRC checks) give the same bytes.
#[test]
fn packed_rows_are_their_documents_pieces() {
    use zr_node::stream::{PackConfig, Packed, PackedColumns, Packer, SpanSink};
    let dir = tempfile::tempdir().expect("tempdir");
    let stream = Stream::create(dir.path().join("s"), u32_element()).expect("create");
    let mut model = Model::default();
    fill(&stream, &mut model, &mut Rng(17), 400, 300);
    stream.commit().expect("commit");
    let stream = Arc::new(stream);
    let ends: Vec<u64> = model
        .starts
        .iter()
        .skip(1)
        .copied()
        .chain([model.tokens.len() as u64])
        .collect();
    for packer in [Packer::BestFit, Packer::FirstFit] {
        let config = PackConfig {
            seq_len: 127,
            packer,
            lookahead: 50,
            seed: 3,
        };
        let packed = Packed::new(Arc::clone(&stream), config).expect("pack");
        let width = packed.width();
        let rows: Vec<u64> = (0..packed.len()).collect();
        let mut out = PackedColumns::default();
        let mut spans = SpanSink::default();
        packed
            .gather(&rows, &mut out, Some(&mut spans))
            .expect("gather");
        let mut seen = vec![0u32; model.tokens.len()];
        for (k, &r) in rows.iter().enumerate() {
            let mut at = 0;
            for piece in packed.plan().row(r).expect("row") {
                let d = piece.document as usize;
                let start = model.starts[d] + piece.offset as u64;
                assert!(start + piece.len as u64 <= ends[d]);
                for t in 0..piece.len as usize {
                    let want = model.tokens[start as usize + t];
                    let at_byte = (k * width + at + t) * 4;
                    let got =
                        u32::from_le_bytes(out.tokens[at_byte..at_byte + 4].try_into().unwrap());
                    assert_eq!(got, want, "{packer:?} row {r} piece of document {d}");
                    assert_eq!(out.document[k * width + at + t], d as i64);
                    seen[start as usize + t] += 1;
                }
                // The spans of this piece's tokens, where the piece lies in the row.
                for (j, (s, e, _)) in model.spans.iter().enumerate() {
                    let (a, b) = (*s.max(&start), *e.min(&(start + piece.len as u64)));
                    if a < b {
                        let hit = zr_node::stream::SpanHit {
                            row: k as u64,
                            start: (at as u64) + a - start,
                            end: (at as u64) + b - start,
                            span: j as u64,
                        };
                        assert!(spans.hits.contains(&hit), "{hit:?} missing");
                    }
                }
                at += piece.len as usize;
            }
            let pad = &out.tokens[(k * width + at) * 4..(k + 1) * width * 4];
            assert!(pad.iter().all(|&b| b == 0), "row {r}: padding not zero");
        }
        assert!(seen.iter().all(|&n| n == 1), "a token missing or twice");
        // The explicit read path, every page checked, gives the same rows.
        let direct = packed.clone().with_options(GatherOptions {
            read: ReadPath::Direct,
            ..GatherOptions::default()
        });
        let mut again = PackedColumns::default();
        direct.gather(&rows, &mut again, None).expect("direct");
        assert_eq!(again.tokens, out.tokens);
        assert_eq!(again.cu_seqlens, out.cu_seqlens);
        let past = packed
            .gather(&[packed.len()], &mut again, None)
            .expect_err("past");
        assert!(matches!(past, Error::IndexOutOfRange { .. }), "{past}");
    }
    let zero = PackConfig {
        lookahead: 0,
        ..PackConfig::new(127, 1)
    };
    let refused = Packed::new(Arc::clone(&stream), zero).expect_err("lookahead 0");
    assert!(refused.to_string().contains("lookahead of 0"), "{refused}");
}
