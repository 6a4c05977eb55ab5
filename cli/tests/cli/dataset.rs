//! The `zr` dataset commands as a user runs them: convert, info, gather, verify, rebalance.

use crate::common::zr;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use zr_node::{CreateOptions, FieldSpec, Record, Store};

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Writes a .npy file (format 1.0) of `descr` and `shape` holding `data`.
fn write_npy(path: &Path, descr: &str, shape: &[u64], data: &[u8]) {
    std::fs::write(path, zr_node::convert::npy_bytes(descr, shape, data)).unwrap();
}

/// `dir/values.bin` holding `values` and `dir/offsets.npy` cutting it into records of
/// `lengths` (N+1 u64 offsets), as `zr convert --values --offsets` reads them.
fn write_values(dir: &Path, values: &[u8], lengths: &[usize]) -> (PathBuf, PathBuf) {
    let mut offsets = vec![0u64];
    for &len in lengths {
        offsets.push(offsets.last().unwrap() + len as u64);
    }
    let values_path = dir.join("values.bin");
    let offsets_path = dir.join("offsets.npy");
    std::fs::write(&values_path, values).unwrap();
    let raw: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
    write_npy(&offsets_path, "<u8", &[offsets.len() as u64], &raw);
    (values_path, offsets_path)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i / 251) as u8)
        .collect()
}

fn all_records(dir: &Path, field: &str) -> Vec<Vec<u8>> {
    let store = Store::open_read_only(dir).unwrap();
    let indices: Vec<u64> = (0..store.len()).collect();
    let batch = store
        .gather_with(&indices, &[field], zr_node::GatherOptions::verified())
        .unwrap();
    batch
        .field(field)
        .unwrap()
        .iter()
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn convert_npy_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    for (descr, shape, itemsize) in [
        ("<f4", vec![50u64, 3, 4], 4usize),
        ("|u1", vec![7, 1000], 1),
        ("<i8", vec![33], 8),
        ("<c16", vec![5, 2], 16),
    ] {
        for compress in ["raw", "flate"] {
            let rows = shape[0] as usize;
            let row_bytes = itemsize * shape[1..].iter().product::<u64>() as usize;
            let data = pattern(rows * row_bytes, shape.len() as u8);
            let npy = tmp
                .path()
                .join(format!("{}-{compress}.npy", descr.replace(['<', '|'], "")));
            write_npy(&npy, descr, &shape, &data);
            let dir = tmp
                .path()
                .join(format!("ds-{}-{compress}", descr.replace(['<', '|'], "")));
            let (ok, out, err) = zr(&[
                "convert",
                "--npy",
                p(&npy),
                p(&dir),
                "--compress",
                compress,
                "--field",
                "x",
            ]);
            assert!(ok, "{err}");
            assert!(out.contains(&format!("converted {rows} records")), "{out}");
            let records = all_records(&dir, "x");
            assert_eq!(records.len(), rows);
            for (i, record) in records.iter().enumerate() {
                assert_eq!(
                    &record[..],
                    &data[i * row_bytes..(i + 1) * row_bytes],
                    "{descr} {compress} row {i}"
                );
            }
            let meta = std::fs::read_to_string(dir.join("meta.json")).unwrap();
            assert!(meta.contains(&format!("\"dtype\": \"{descr}\"")), "{meta}");
            let (ok, info, _) = zr(&["info", p(&dir)]);
            assert!(
                ok && info.contains(&format!("records      {rows}")) && info.contains(descr),
                "{info}"
            );
        }
    }
    // Appending rows of another type is refused in words, not debug forms.
    let dir = tmp.path().join("ds-u1-raw");
    let other = tmp.path().join("other.npy");
    write_npy(&other, "<u2", &[2, 3], &[0u8; 12]);
    let (ok, _, err) = zr(&[
        "convert",
        "--npy",
        p(&other),
        p(&dir),
        "--field",
        "x",
        "--append",
    ]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("holds dtype |u1 shape (")
            && err.contains("the input has dtype <u2 shape (3,)"),
        "{err}"
    );
    assert!(!err.contains("Some("), "{err}");
}

#[test]
fn convert_variable_layout_round_trips_and_appends() {
    let tmp = tempfile::tempdir().unwrap();
    let lengths = [0usize, 5, 1000, 1, 0, 70_000, 3];
    let values = pattern(lengths.iter().sum(), 9);
    let (values_path, offsets_path) = write_values(tmp.path(), &values, &lengths);
    let dir = tmp.path().join("var");
    let (ok, _, err) = zr(&[
        "convert",
        "--values",
        p(&values_path),
        "--offsets",
        p(&offsets_path),
        p(&dir),
        "--compress",
        "flate",
    ]);
    assert!(ok, "{err}");
    let mut start = 0;
    let expect: Vec<Vec<u8>> = lengths
        .iter()
        .map(|&len| {
            start += len;
            values[start - len..start].to_vec()
        })
        .collect();
    assert_eq!(all_records(&dir, "data"), expect);

    // A second conversion into the same directory is refused, unless --append.
    let (ok, _, err) = zr(&[
        "convert",
        "--values",
        p(&values_path),
        "--offsets",
        p(&offsets_path),
        p(&dir),
    ]);
    assert!(!ok && err.contains("already exists"), "{err}");
    // Appending asks for the field's own compression, or refuses another.
    let (ok, _, err) = zr(&[
        "convert",
        "--values",
        p(&values_path),
        "--offsets",
        p(&offsets_path),
        p(&dir),
        "--append",
        "--compress",
        "raw",
    ]);
    assert!(!ok && err.contains("stored flate"), "{err}");
    let (ok, stdout, err) = zr(&[
        "convert",
        "--values",
        p(&values_path),
        "--offsets",
        p(&offsets_path),
        p(&dir),
        "--append",
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("flate"), "{stdout}");
    assert_eq!(all_records(&dir, "data"), [expect.clone(), expect].concat());

    // gather writes the payloads back to back and prints their lengths.
    let out = tmp.path().join("out.bin");
    let (ok, stdout, err) = zr(&["gather", p(&dir), "--indices", "2,1,2,0", "--out", p(&out)]);
    assert!(ok, "{err}");
    assert_eq!(stdout.trim(), "1000 5 1000 0");
    assert_eq!(
        std::fs::read(&out).unwrap(),
        [&values[5..1005], &values[0..5], &values[5..1005]].concat()
    );
    let (ok, _, err) = zr(&["gather", p(&dir), "--indices", "99", "--out", p(&out)]);
    assert!(
        !ok && err.contains("index 99") && err.contains("14 records"),
        "{err}"
    );
}

#[test]
fn bad_inputs_are_refused_with_reasons() {
    let tmp = tempfile::tempdir().unwrap();
    let t = |name: &str| tmp.path().join(name);
    std::fs::write(t("junk.npy"), b"this is not numpy").unwrap();
    write_npy(&t("short.npy"), "<f4", &[10, 2], &[0u8; 50]);
    write_npy(&t("object.npy"), "|O", &[3], &[0u8; 24]);
    let mut bad_header = std::fs::read(t("short.npy")).unwrap();
    bad_header[8] = 0xff; // header length far past the file
    std::fs::write(t("bad-header.npy"), bad_header).unwrap();
    std::fs::write(t("values.bin"), [1u8; 10]).unwrap();
    let encode = |offsets: &[u64]| {
        offsets
            .iter()
            .flat_map(|o| o.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    write_npy(&t("backwards.npy"), "<u8", &[3], &encode(&[0, 6, 4]));
    write_npy(&t("past.npy"), "<u8", &[3], &encode(&[0, 6, 11]));
    write_npy(&t("floats.npy"), "<f8", &[2], &encode(&[0, 1]));
    // A shape whose byte count overflows 64 bits: an error, not a panic.
    write_npy(
        &t("huge.npy"),
        "<u8",
        &[2305843009213693953],
        &encode(&[0, 1]),
    );
    // `--npy FILE`, or `--values values.bin --offsets FILE`.
    let npy = |file: &str| vec!["--npy".to_string(), p(&t(file)).into()];
    let offsets = |file: &str| {
        let values = p(&t("values.bin")).to_string();
        vec![
            "--values".into(),
            values,
            "--offsets".into(),
            p(&t(file)).into(),
        ]
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (offsets("huge.npy"), "2305843009213693953 offsets"),
        (npy("junk.npy"), "not a .npy file"),
        (npy("short.npy"), "truncated"),
        (npy("object.npy"), "not supported"),
        (npy("bad-header.npy"), "header"),
        (npy("missing.npy"), "missing.npy"),
        (offsets("backwards.npy"), "not monotonic"),
        (offsets("past.npy"), "past the end"),
        (offsets("floats.npy"), "64-bit integers"),
    ];
    for (mut args, needle) in cases {
        let dir = tmp.path().join("never");
        args.insert(0, "convert".into());
        args.push(p(&dir).into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, _, err) = zr(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            err.contains(needle) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
        assert!(!dir.exists(), "{args:?} left {} behind", dir.display());
    }
}

fn sample_dataset(dir: &Path, n: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    let store = Store::create(
        dir,
        vec![FieldSpec::raw("a"), FieldSpec::flate("b")],
        CreateOptions {
            chunk_records: 50,
            ..Default::default()
        },
    )
    .unwrap();
    let rows: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|i| {
            (
                pattern(100 + (i % 300) as usize, i as u8),
                format!("row {i}").repeat(1 + i as usize % 5).into_bytes(),
            )
        })
        .collect();
    let records: Vec<Record> = rows
        .iter()
        .map(|(a, b)| Record::new().with("a", a).with("b", b))
        .collect();
    store.append_many(&records).unwrap();
    store.commit().unwrap();
    rows
}

#[test]
fn verify_reports_a_bit_flip_and_a_truncated_chunk() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    sample_dataset(&dir, 200);
    let (ok, out, _) = zr(&["verify", p(&dir)]);
    assert!(ok && out.starts_with("ok: 200 records"), "{out}");

    // Flip one bit inside record 7's payload of field a.
    let entry = zr_node::offset::Entry::decode(
        std::fs::read(dir.join("a.offset")).unwrap()[7 * 16..8 * 16]
            .try_into()
            .unwrap(),
    );
    let chunk = zr_node::chunk_path(&dir, entry.chunk_id);
    let mut bytes = std::fs::read(&chunk).unwrap();
    bytes[entry.offset as usize + 16 + 3] ^= 0x10;
    std::fs::write(&chunk, &bytes).unwrap();
    let (ok, out, err) = zr(&["verify", p(&dir)]);
    assert!(!ok, "verify passed a flipped bit");
    assert!(
        out.contains("bad a: record 7: CRC mismatch") && out.lines().count() == 1,
        "{out}"
    );
    assert!(err.contains("1 bad record"), "{err}");
    // `zr gather` checks by default (and leaves no output); --no-verify returns the bytes.
    let out_file = tmp.path().join("seven.bin");
    let gather = |extra: &[&str]| {
        let mut args = vec!["gather", p(&dir), "--indices", "6,7", "--field", "a"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--out", p(&out_file)]);
        zr(&args)
    };
    let (ok, _, err) = gather(&[]);
    assert!(
        !ok && err.contains("7"),
        "a gather returned a flipped record: {err}"
    );
    assert!(!out_file.exists(), "a failed gather left its output");
    let (ok, _, err) = gather(&["--no-verify"]);
    assert!(ok, "{err}");
    assert!(out_file.exists());

    // Truncate the last chunk.
    let last = std::fs::read_dir(dir.join("chunk")).unwrap().count() as u32 - 1;
    let path = zr_node::chunk_path(&dir, last);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let (ok, _, err) = zr(&["verify", p(&dir)]);
    assert!(
        !ok && err.contains(&format!("{last}.zr")) && err.contains("commits"),
        "{err}"
    );
}

#[test]
fn rebalance_reclaims_dead_space_and_keeps_every_record() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let mut model = sample_dataset(&dir, 600);
    let store = Store::open(&dir).unwrap();
    for i in 0..400u32 {
        let index = (i * 7919) as usize % model.len();
        if i % 3 == 0 {
            store.delete(index as u64).unwrap();
            model.swap_remove(index);
        } else {
            let row = (pattern(200, i as u8), format!("modified {i}").into_bytes());
            store
                .modify(
                    index as u64,
                    &Record::new().with("a", &row.0).with("b", &row.1),
                )
                .unwrap();
            model[index] = row;
        }
    }
    store.commit().unwrap();
    let before = store.utilization().unwrap().ratio();
    drop(store);
    assert!(before < 0.8, "the test should leave dead space: {before}");

    let (ok, out, err) = zr(&["rebalance", p(&dir)]);
    assert!(ok, "{err}");
    assert!(
        out.contains("utilization before") && out.contains("utilization after"),
        "{out}"
    );
    let store = Store::open(&dir).unwrap();
    let after = store.utilization().unwrap().ratio();
    assert!(after >= 0.99, "utilization after rebalance {after}");
    drop(store);
    let a: Vec<Vec<u8>> = model.iter().map(|r| r.0.clone()).collect();
    let b: Vec<Vec<u8>> = model.iter().map(|r| r.1.clone()).collect();
    assert_eq!(all_records(&dir, "a"), a);
    assert_eq!(all_records(&dir, "b"), b);
    assert!(
        !tmp.path().join(".ds.rebalance").exists(),
        "scratch directory left behind"
    );
}

#[test]
fn a_killed_rebalance_leaves_a_whole_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let rows = sample_dataset(&dir, 3000);
    let store = Store::open(&dir).unwrap();
    for i in 0..1000u64 {
        store
            .modify(
                i * 3 % 3000,
                &Record::new()
                    .with("a", &rows[(i * 3 % 3000) as usize].0)
                    .with("b", &rows[(i * 3 % 3000) as usize].1),
            )
            .unwrap();
    }
    store.commit().unwrap();
    drop(store);
    let a: Vec<Vec<u8>> = rows.iter().map(|r| r.0.clone()).collect();
    for (round, delay_ms) in [0u64, 3, 10, 25, 60, 150].into_iter().enumerate() {
        let mut child = Command::new(env!("CARGO_BIN_EXE_zr"))
            .args(["rebalance", p(&dir)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        child.wait().unwrap();
        let (ok, out, err) = zr(&["verify", p(&dir)]);
        assert!(ok, "round {round}: {out}{err}");
        assert_eq!(all_records(&dir, "a"), a, "round {round}");
    }
}

/// `zr gather --read direct` (with and without `--uncached`) writes the same bytes as the
/// mappings; `zr bench --read direct` says its batches were read directly; a bad read path
/// is refused naming the choices.
#[test]
fn gather_and_bench_read_directly_when_asked() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path().join("ds");
    let rows = sample_dataset(&dir, 300);
    let indices = "7,299,0,7,150";
    let mut outputs = Vec::new();
    for read in [
        &["--read", "mmap"][..],
        &["--read", "direct"],
        &["--read", "direct", "--uncached"],
    ] {
        let out = tmp.path().join(format!("out-{}.bin", outputs.len()));
        let mut args = vec![
            "gather",
            p(&dir),
            "--indices",
            indices,
            "--field",
            "b",
            "--out",
            p(&out),
        ];
        args.extend_from_slice(read);
        let (ok, _, err) = zr(&args);
        assert!(ok, "{read:?}: {err}");
        outputs.push(std::fs::read(&out).unwrap());
    }
    let want: Vec<u8> = [7usize, 299, 0, 7, 150]
        .iter()
        .flat_map(|&i| rows[i].1.clone())
        .collect();
    for output in &outputs {
        assert_eq!(output, &want);
    }
    let (ok, out, err) = zr(&[
        "bench",
        p(&dir),
        "--seconds",
        "0.05",
        "--batch",
        "16",
        "--read",
        "direct",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("from memory (mmap) 0, by direct reads"),
        "{out}"
    );
    let (ok, _, err) = zr(&["bench", p(&dir), "--read", "fast"]);
    assert!(!ok);
    assert!(err.contains("mmap, direct or auto"), "{err}");
    // A gather that fails leaves no output file behind, and no partial one.
    let out = tmp.path().join("failed.bin");
    let (ok, _, err) = zr(&[
        "gather",
        p(&dir),
        "--indices",
        "1,300",
        "--field",
        "b",
        "--out",
        p(&out),
    ]);
    assert!(!ok && err.contains("out of range"), "{err}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("failed"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `zr info DIR | head -1`: output to a pipe closed early ends `zr` quietly (as SIGPIPE ends
/// any tool), never with a panic.
#[test]
fn a_closed_pipe_ends_zr_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    sample_dataset(&dir, 20);
    for _ in 0..5 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_zr"))
            .args(["info", p(&dir)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before zr writes a line.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(101), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A typed field is in every record, so a zeroed offset entry, or a `length` in meta.json
/// raised past the data, is found by `zr verify` and refused by `zr gather` (which checks by
/// default) instead of read as empty records.
#[test]
fn zeroed_entries_and_a_raised_length_are_found() {
    let tmp = tempfile::tempdir().unwrap();
    let npy = tmp.path().join("rows.npy");
    write_npy(&npy, "|u1", &[40, 64], &pattern(40 * 64, 3));
    let dir = tmp.path().join("ds");
    let (ok, _, err) = zr(&["convert", "--npy", p(&npy), p(&dir), "--field", "x"]);
    assert!(ok, "{err}");
    let (ok, out, _) = zr(&["verify", p(&dir)]);
    assert!(ok && out.starts_with("ok: 40 records"), "{out}");
    let pristine = std::fs::read(dir.join("x.offset")).unwrap();

    // Ten entries zeroed.
    let mut zeroed = pristine.clone();
    zeroed[10 * 16..20 * 16].fill(0);
    std::fs::write(dir.join("x.offset"), &zeroed).unwrap();
    let (ok, out, _) = zr(&["verify", p(&dir)]);
    assert!(!ok, "verify passed zeroed entries: {out}");
    assert_eq!(out.matches("zeroed offset entry").count(), 10, "{out}");
    assert!(
        out.contains("record 10:") && out.contains("record 19:"),
        "{out}"
    );
    let out_file = tmp.path().join("g.bin");
    let (ok, _, err) = zr(&["gather", p(&dir), "--indices", "12", "--out", p(&out_file)]);
    assert!(!ok && err.contains("zeroed offset entry"), "{err}");
    std::fs::write(dir.join("x.offset"), &pristine).unwrap();

    // The length raised by five.
    let meta_path = dir.join("meta.json");
    let meta = std::fs::read_to_string(&meta_path).unwrap();
    assert!(
        meta.contains("\"length\": 40") || meta.contains("\"length\":40"),
        "{meta}"
    );
    let raised = meta
        .replacen("\"length\": 40", "\"length\": 45", 1)
        .replacen("\"length\":40", "\"length\":45", 1);
    std::fs::write(&meta_path, raised).unwrap();
    let (ok, out, err) = zr(&["verify", p(&dir)]);
    assert!(!ok, "verify passed a raised length: {out} {err}");
    assert!(
        out.contains("record 44:") || err.contains("45"),
        "{out} {err}"
    );
}

/// A record without a typed field is refused (it could not be told from a zeroed entry).
#[test]
fn a_record_without_a_typed_field_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::create(
        tmp.path().join("t"),
        vec![
            FieldSpec::raw("v").typed("<f4", vec![2]),
            FieldSpec::raw("note"),
        ],
        CreateOptions::default(),
    )
    .unwrap();
    store
        .append(&Record::new().with("v", &[0u8; 8]).with("note", b"x"))
        .unwrap();
    let err = store
        .append(&Record::new().with("note", b"no v"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("field 'v' holds 8 bytes per record (dtype <f4, shape [2])")
            && err.contains("every record needs it"),
        "{err}"
    );
}

/// A trillion empty rows take no data bytes but 16 TB of offset entries: refused at once,
/// saying what they need and what the disk has, leaving nothing behind (#23, item 2).
#[test]
fn a_conversion_the_disk_cannot_hold_is_refused_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let npy = tmp.path().join("empty-rows.npy");
    write_npy(&npy, "|u1", &[1_000_000_000_000, 0], &[]);
    let dir = tmp.path().join("ds");
    let (ok, _, err) = zr(&["convert", "--npy", p(&npy), p(&dir), "--field", "x"]);
    assert!(!ok, "a trillion rows were accepted");
    assert!(
        err.contains("1000000000000 records") && err.contains("TiB") && err.contains("free"),
        "{err}"
    );
    assert!(!dir.exists(), "a refused conversion left {}", dir.display());
}

/// `zr convert --compress zstd:5 --dict`: short JSON lines stored with a trained dictionary,
/// shown by `zr info`, read back by `zr gather`; `zr dict train` refuses a field the dataset
/// lacks; `zr verify` names a damaged dictionary.
#[test]
fn zstd_with_a_trained_dictionary_on_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let lines: Vec<Vec<u8>> = (0..2000u64)
        .map(|i| {
            format!(
                "{{\"id\": {i}, \"caption\": \"a photo of {} dogs on the beach\", \"w\": {}}}",
                i % 13,
                200 + i % 97
            )
            .into_bytes()
        })
        .collect();
    let lengths: Vec<usize> = lines.iter().map(Vec::len).collect();
    let (values_path, offsets_path) = write_values(tmp.path(), &lines.concat(), &lengths);
    let dir = tmp.path().join("captions");
    let (ok, stdout, err) = zr(&[
        "convert",
        "--values",
        p(&values_path),
        "--offsets",
        p(&offsets_path),
        p(&dir),
        "--compress",
        "zstd:5",
        "--dict",
    ]);
    assert!(ok, "{err}");
    assert!(
        stdout.contains("(field 'data', zstd:5)") && stdout.contains("trained on"),
        "{stdout}"
    );
    let (ok, info, _) = zr(&["info", p(&dir)]);
    assert!(ok && info.contains("zstd:5 dict "), "{info}");
    assert_eq!(all_records(&dir, "data"), lines);
    let (ok, _, err) = zr(&["dict", "train", p(&dir), "--field", "nope"]);
    assert!(!ok && err.contains("'nope'"), "{err}");
    let (ok, _, err) = zr(&[
        "convert",
        "--values",
        p(&values_path),
        "--offsets",
        p(&offsets_path),
        p(&tmp.path().join("x")),
        "--compress",
        "zstd:0",
    ]);
    assert!(!ok && err.contains("zstd level '0'"), "{err}");
    // A damaged dictionary is named, by verify as by every open.
    let file = zr_node::dict::path(&dir, "data");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let (ok, _, err) = zr(&["verify", p(&dir)]);
    assert!(
        !ok && err.contains("data.zdict") && err.contains("damaged"),
        "{err}"
    );
}

#[test]
fn token_streams_convert_show_and_verify() {
    let tmp = tempfile::tempdir().unwrap();
    // 10,000 int64 tokens in three documents.
    let tokens: Vec<u8> = (0..10_000i64)
        .flat_map(|t| (t * 13).to_le_bytes())
        .collect();
    let lengths: Vec<u8> = [3000i64, 0, 7000]
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    write_npy(&tmp.path().join("t.npy"), "<i8", &[10_000], &tokens);
    write_npy(&tmp.path().join("l.npy"), "<i8", &[3], &lengths);
    let dest = tmp.path().join("stream");
    let (ok, out, err) = zr(&[
        "convert",
        p(&dest),
        "--tokens",
        p(&tmp.path().join("t.npy")),
        "--doc-lengths",
        p(&tmp.path().join("l.npy")),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("converted 10000 tokens in 3 documents"),
        "{out}"
    );
    let (ok, out, err) = zr(&["info", p(&dest)]);
    assert!(ok, "{err}");
    assert!(
        out.contains("token stream") && out.contains("token <u4"),
        "{out}"
    );
    assert!(out.contains("documents    3"), "{out}");
    assert!(out.contains("windows      4 of 2048"), "{out}");
    let (ok, out, err) = zr(&["verify", p(&dest)]);
    assert!(ok && out.starts_with("ok: 10000 tokens"), "{out}{err}");

    // A damaged page is named.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dest.join("tokens.bin"))
            .unwrap();
        f.write_all_at(&[0xFF], 9000).unwrap();
    }
    let (ok, out, _) = zr(&["verify", p(&dest)]);
    assert!(!ok && out.contains("bad tokens: entry 2"), "{out}");

    // A Megatron .idx with a bad magic is refused by name, and nothing is made.
    std::fs::write(
        tmp.path().join("m.idx"),
        b"NOTANIDX_and_more_bytes_here_to_be_long",
    )
    .unwrap();
    std::fs::write(tmp.path().join("m.bin"), b"").unwrap();
    let dest = tmp.path().join("m");
    let (ok, _, err) = zr(&["convert", p(&dest), "--megatron", p(&tmp.path().join("m"))]);
    assert!(
        !ok && err.contains("m.idx") && err.contains("bad magic"),
        "{err}"
    );
    assert!(!dest.exists());
    let (ok, _, err) = zr(&[
        "convert",
        p(&dest),
        "--tokens",
        p(&tmp.path().join("t.npy")),
    ]);
    assert!(!ok && err.contains("--doc-lengths"), "{err}");
}

/// `zr stream pack-stats`: documents of 3,000, 700, 600 and 7,000 tokens (and an empty
/// one) packed into rows of 1,025 tokens: the two long ones cut into 2 and 6 full rows,
/// their remainders (950 and 850) and the short ones placed best-fit; bad settings refused
/// by name.
#[test]
fn pack_stats_of_a_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let lengths_of = [3000i64, 0, 700, 600, 7000];
    let total: i64 = lengths_of.iter().sum();
    let tokens: Vec<u8> = (0..total).flat_map(|t| t.to_le_bytes()).collect();
    let lengths: Vec<u8> = lengths_of.iter().flat_map(|t| t.to_le_bytes()).collect();
    write_npy(&tmp.path().join("t.npy"), "<i8", &[total as u64], &tokens);
    write_npy(&tmp.path().join("l.npy"), "<i8", &[5], &lengths);
    let dest = tmp.path().join("stream");
    let (ok, _, err) = zr(&[
        "convert",
        p(&dest),
        "--tokens",
        p(&tmp.path().join("t.npy")),
        "--doc-lengths",
        p(&tmp.path().join("l.npy")),
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = zr(&["stream", "pack-stats", p(&dest), "--seq-len", "1024"]);
    assert!(ok, "{err}");
    assert!(out.contains("documents    5 (1 empty, left out)"), "{out}");
    assert!(out.contains("tokens       11300"), "{out}");
    // 8 full rows; 950, 850, 700 and 600 need at least 4 more rows of 1,025 (no two fit in
    // one), so 12 rows.
    assert!(out.contains("rows         12"), "{out}");
    assert!(out.contains("split        2 documents"), "{out}");
    let padding = 12 * 1025 - 11300;
    assert!(out.contains(&format!("({padding} tokens)")), "{out}");
    let (ok, _, err) = zr(&[
        "stream",
        "pack-stats",
        p(&dest),
        "--seq-len",
        "1024",
        "--lookahead",
        "0",
    ]);
    assert!(!ok && err.contains("lookahead of 0"), "{err}");
    let (ok, _, err) = zr(&[
        "stream",
        "pack-stats",
        p(&dest),
        "--seq-len",
        "1024",
        "--packer",
        "greedy",
    ]);
    assert!(!ok && err.contains("best_fit or first_fit"), "{err}");
}
