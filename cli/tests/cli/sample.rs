//! `zr sample` as a script uses it: batches per line, checkpoint, resume, errors.

use crate::common::zr;

use std::process::Command;

fn batches(stdout: &str) -> Vec<Vec<u64>> {
    stdout
        .lines()
        .filter(|l| !l.starts_with("state "))
        .map(|l| l.split(' ').map(|x| x.parse().unwrap()).collect())
        .collect()
}

#[test]
fn resume_continues_exactly() {
    let common = [
        "sample", "--len", "37", "--kind", "shuffle", "--seed", "9", "--batch", "5", "--rank", "1",
        "--ranks", "2",
    ];
    let (ok, whole, _) = zr(&[&common[..], &["--count", "9"]].concat());
    assert!(ok);
    let whole = batches(&whole);
    assert_eq!(whole.len(), 9, "runs on into the next epoch");
    assert_eq!(
        whole[..4].concat().len(),
        18,
        "37 records over 2 ranks: 18 each, tail dropped"
    );

    let (ok, first, _) = zr(&[&common[..], &["--count", "2", "--state"]].concat());
    assert!(ok);
    let state = first.lines().last().unwrap().to_string();
    assert!(state.starts_with("state {"), "{state}");
    let (ok, rest, stderr) = zr(&[&common[..], &["--count", "7", "--resume", &state]].concat());
    assert!(ok, "{stderr}");
    assert_eq!([batches(&first), batches(&rest)].concat(), whole);

    // A state is the same on every rank: rank 0 resumes from rank 1's at the same place.
    let other = [
        "sample", "--len", "37", "--kind", "shuffle", "--seed", "9", "--batch", "5", "--rank", "0",
        "--ranks", "2",
    ];
    let (ok, resumed, stderr) = zr(&[&other[..], &["--count", "1", "--resume", &state]].concat());
    assert!(ok, "{stderr}");
    let (_, all, _) = zr(&[&other[..], &["--count", "3"]].concat());
    assert_eq!(batches(&resumed), batches(&all)[2..]);
    // Another global batch is refused with a reason.
    let narrower = [
        "sample", "--len", "37", "--kind", "shuffle", "--seed", "9", "--batch", "4", "--ranks", "3",
    ];
    let (ok, _, stderr) = zr(&[&narrower[..], &["--resume", &state]].concat());
    assert!(
        !ok && stderr.contains("global batch (batch × ranks) of 10, this sampler has 12"),
        "{stderr}"
    );
}

#[test]
fn ranks_partition_an_epoch() {
    let mut all = Vec::new();
    for rank in 0..3 {
        let rank = rank.to_string();
        let (ok, out, _) = zr(&[
            "sample", "--len", "30", "--kind", "shuffle", "--seed", "4", "--batch", "4", "--rank",
            &rank, "--ranks", "3",
        ]);
        assert!(ok);
        all.extend(batches(&out).concat());
    }
    all.sort_unstable();
    assert_eq!(all, (0..30).collect::<Vec<u64>>());
}

#[test]
fn sliding_batches_are_windows() {
    let (ok, out, _) = zr(&[
        "sample", "--len", "10", "--kind", "sliding", "--window", "4",
    ]);
    assert!(ok);
    assert_eq!(
        batches(&out),
        vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 0, 1]]
    );
}

#[test]
fn bad_arguments_fail_with_a_reason() {
    for (args, needle) in [
        (vec!["sample", "--len", "0"], "empty"),
        (
            vec!["sample", "--len", "5", "--rank", "2", "--ranks", "2"],
            "rank 2",
        ),
        (
            vec!["sample", "--len", "5", "--resume", "{nonsense"],
            "not a sampler state",
        ),
        (vec!["sample", "--len", "5", "--from", "9"], "past the end"),
    ] {
        let (ok, _, stderr) = zr(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// A command line `zr` cannot parse exits 2 saying what it expected, as the README says; an error of
/// a command that ran exits 1 with one line.
#[test]
fn usage_errors_exit_2_and_failures_exit_1() {
    for args in [&["bogus"][..], &["sample", "--kind", "bogus"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_zr"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--help"),
            "{args:?}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_zr"))
        .args(["info", "/nonexistent/dataset"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// `--mixture`: this rank's part of each global batch as `dataset:record` pairs; a state
/// taken on 2 ranks resumes on 1 with the rest of the same global batches; a bad mixture is
/// refused by name.
#[test]
fn a_mixture_prints_pairs_and_resumes_on_other_ranks() {
    let pairs = |stdout: &str| -> Vec<Vec<(u32, u64)>> {
        stdout
            .lines()
            .filter(|l| !l.starts_with("state "))
            .map(|l| {
                l.split(' ')
                    .map(|p| {
                        let (s, r) = p.split_once(':').unwrap();
                        (s.parse().unwrap(), r.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    };
    let mix = ["sample", "--mixture", "100:0.7,20:0.3", "--stage", "2:0,1"];
    let (ok, whole, _) = zr(&[&mix[..], &["--batch", "8", "--count", "5"]].concat());
    assert!(ok);
    let whole = pairs(&whole);
    assert!(whole[2..].iter().flatten().all(|&(s, r)| s == 1 && r < 20));
    let (ok, halves, _) = zr(&[
        &mix[..],
        &[
            "--batch", "4", "--ranks", "2", "--rank", "1", "--count", "2", "--state",
        ],
    ]
    .concat());
    assert!(ok);
    assert_eq!(
        pairs(&halves),
        whole[..2]
            .iter()
            .map(|b| b[4..].to_vec())
            .collect::<Vec<_>>()
    );
    let state = halves.lines().last().unwrap();
    let (ok, rest, _) = zr(&[
        &mix[..],
        &["--batch", "8", "--count", "3", "--resume", state],
    ]
    .concat());
    assert!(ok);
    assert_eq!(pairs(&rest), whole[2..]);
    let (ok, _, err) = zr(&[&mix[..], &["--batch", "5", "--resume", state]].concat());
    assert!(
        !ok && err.contains("global batch (batch × ranks) of 8"),
        "{err}"
    );
    let (ok, _, err) = zr(&["sample", "--mixture", "100:0,20:0", "--count", "1"]);
    assert!(!ok && err.contains("every weight is 0"), "{err}");
}

/// `zr explain`: global batch N of a run described in run.json, rank by rank, is what `zr
/// sample` gives each rank as its batch N; `--grep` finds the step back; a blocklist
/// replaces a blocked record where it would be read; bad requests are refused by name.
#[test]
fn explain_lists_what_each_rank_read_at_a_step() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run.json");
    let spec = r#"{"format": "zrecord-run", "version": 1,
        "order": {"sampler": {"len": 37, "order": {"kind": "shuffle"}, "seed": 9, "rank": 0,
                              "ranks": 2, "batch": 5, "tail": "drop"}},
        "datasets": [{"name": "train"}], "blocklist": []}"#;
    std::fs::write(&run, spec).unwrap();
    let run = run.to_str().unwrap();
    for step in [0u64, 2, 5] {
        let (ok, out, err) = zr(&["explain", "--run", run, "--step", &step.to_string()]);
        assert!(ok, "{err}");
        for rank in 0..2u64 {
            let common = [
                "sample", "--len", "37", "--kind", "shuffle", "--seed", "9", "--batch", "5",
                "--ranks", "2",
            ];
            let rank_arg = rank.to_string();
            let count = (step + 1).to_string();
            let (_, sampled, _) =
                zr(&[&common[..], &["--rank", &rank_arg, "--count", &count]].concat());
            let want = &batches(&sampled)[step as usize];
            let got: Vec<u64> = out
                .lines()
                .filter(|l| l.starts_with(&format!("rank {rank} ")))
                .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
                .collect();
            assert_eq!(&got, want, "step {step} rank {rank}: {out}");
        }
    }
    let (ok, out, _) = zr(&["explain", "--run", run, "--step", "2", "--json"]);
    assert!(ok);
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let record = first["record"].as_u64().unwrap();
    let (ok, out, err) = zr(&[
        "explain",
        "--run",
        run,
        "--grep",
        &format!("train:{record}"),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains(": [2]"), "{out}");
    // Blocked: the record is read nowhere, its position reads another.
    let blocklist = tmp.path().join("blocked.txt");
    std::fs::write(
        &blocklist,
        format!("# records not to read\ntrain:{record}\n"),
    )
    .unwrap();
    let (ok, out, err) = zr(&[
        "explain",
        "--run",
        run,
        "--step",
        "2",
        "--blocklist",
        blocklist.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("(in place of {record}, blocklisted)")),
        "{out}"
    );
    // Wrong requests.
    let (ok, _, err) = zr(&["explain", "--run", run, "--grep", "test:3"]);
    assert!(
        !ok && err.contains("no dataset 'test' (it has: train)"),
        "{err}"
    );
    let (ok, _, err) = zr(&["explain", "--run", run, "--step", "1", "--rank", "2"]);
    assert!(!ok && err.contains("the run has 2 ranks"), "{err}");
    std::fs::write(&blocklist, "train:37\n").unwrap();
    let (ok, _, err) = zr(&[
        "explain",
        "--run",
        run,
        "--step",
        "1",
        "--blocklist",
        blocklist.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("record 37 of dataset 0, which holds 37"),
        "{err}"
    );
    std::fs::write(
        tmp.path().join("old.json"),
        spec.replace("\"version\": 1", "\"version\": 0"),
    )
    .unwrap();
    let (ok, _, err) = zr(&[
        "explain",
        "--run",
        tmp.path().join("old.json").to_str().unwrap(),
        "--step",
        "0",
    ]);
    assert!(!ok && err.contains("version 0"), "{err}");
}

/// `zr explain` of a run over a stream's windows names each row's documents and their token
/// ranges; a mixture's positions say their dataset's epoch.
#[test]
fn explain_names_a_windows_documents_and_a_mixtures_epochs() {
    use zr_node::stream::{Component, Stream};
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("s");
    let stream = Stream::create(&path, vec![Component::new("token", "<u4")]).unwrap();
    // Documents of 5, 3 and 9 tokens: windows of 4 + 1 tokens at stride 4.
    for len in [5u32, 3, 9] {
        let tokens: Vec<u8> = (0..len).flat_map(|t| t.to_le_bytes()).collect();
        stream.append_document(&tokens, &[]).unwrap();
    }
    stream.commit().unwrap();
    drop(stream);
    let run = tmp.path().join("run.json");
    let spec = serde_json::json!({"format": "zrecord-run", "version": 1,
        "order": {"sampler": {"len": 3, "order": {"kind": "sequential"}, "seed": 0, "rank": 0,
                              "ranks": 1, "batch": 3, "tail": "drop"}},
        "datasets": [{"name": "s", "path": path, "windows": {"windows": {"seq_len": 4, "stride": 4}}}],
        "blocklist": []});
    std::fs::write(&run, spec.to_string()).unwrap();
    let (ok, out, err) = zr(&["explain", "--run", run.to_str().unwrap(), "--step", "0"]);
    assert!(ok, "{err}");
    // Tokens 0..5, 4..9 and 8..13 of the 17.
    assert!(out.contains("record 0: document 0 tokens 0..5\n"), "{out}");
    assert!(
        out.contains(
            "record 1: document 0 tokens 4..5, document 1 tokens 0..3, document 2 tokens 0..1\n"
        ),
        "{out}"
    );
    assert!(out.contains("record 2: document 2 tokens 0..5\n"), "{out}");

    let spec = serde_json::json!({"format": "zrecord-run", "version": 1,
        "order": {"mixture": {"lengths": [4, 40], "stages": [{"start": 0, "weights": [1.0, 1.0]}],
                              "seed": 1, "rank": 0, "ranks": 1, "batch": 8}},
        "datasets": [{"name": "small"}, {"name": "big"}], "blocklist": []});
    std::fs::write(&run, spec.to_string()).unwrap();
    let (ok, out, err) = zr(&[
        "explain",
        "--run",
        run.to_str().unwrap(),
        "--step",
        "3",
        "--json",
    ]);
    assert!(ok, "{err}");
    let small: Vec<u64> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["dataset"] == "small")
        .map(|e| e["epoch"].as_u64().unwrap())
        .collect();
    // About 4 draws of `small` a step: by step 3, its third or fourth epoch.
    assert!(
        !small.is_empty() && small.iter().all(|&e| (2..=4).contains(&e)),
        "{out}"
    );
}

/// `zr explain --digest` of a step, kept, lets `--verify` tell later that the step still
/// reads the same bytes, or name the dataset one of its records changed in.
#[test]
fn explain_verifies_a_step_against_its_digest() {
    use zr_node::{CreateOptions, FieldSpec, Record, Store};
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("train");
    let store = Store::create(
        &path,
        vec![FieldSpec::raw("a"), FieldSpec::flate("b")],
        CreateOptions::default(),
    )
    .unwrap();
    for i in 0..40u32 {
        let (a, b) = (i.to_le_bytes(), format!("record {i}"));
        let r = Record::new().with("a", &a).with("b", b.as_bytes());
        store.append(&r).unwrap();
    }
    store.commit().unwrap();
    let run = tmp.path().join("run.json");
    let spec = serde_json::json!({"format": "zrecord-run", "version": 1,
        "order": {"sampler": {"len": 40, "order": {"kind": "shuffle"}, "seed": 2, "rank": 0,
                              "ranks": 2, "batch": 4, "tail": "drop"}},
        "datasets": [{"name": "train", "path": path}], "blocklist": []});
    std::fs::write(&run, spec.to_string()).unwrap();
    let run = run.to_str().unwrap();
    let (ok, digest, err) = zr(&["explain", "--run", run, "--step", "1", "--digest"]);
    assert!(ok && digest.starts_with("train="), "{err}");
    let digest = digest.trim();
    let (ok, out, err) = zr(&["explain", "--run", run, "--step", "1", "--verify", digest]);
    assert!(ok && out.contains("step 1 reads what it read"), "{err}");
    // Another step's digest differs: it read other records.
    let (_, other, _) = zr(&["explain", "--run", run, "--step", "2", "--digest"]);
    assert_ne!(other.trim(), digest);
    // A record the step read, rewritten: the step no longer verifies, naming the dataset.
    let (_, listed, _) = zr(&["explain", "--run", run, "--step", "1", "--json"]);
    let first: serde_json::Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    let record = first["record"].as_u64().unwrap();
    store
        .modify(
            record,
            &Record::new().with("a", b"new!").with("b", b"changed"),
        )
        .unwrap();
    store.commit().unwrap();
    drop(store);
    let (ok, _, err) = zr(&["explain", "--run", run, "--step", "1", "--verify", digest]);
    assert!(
        !ok && err.contains("dataset 'train' changed since the digest was taken"),
        "{err}"
    );
    let (ok, _, err) = zr(&[
        "explain", "--run", run, "--step", "1", "--verify", "test=12",
    ]);
    assert!(
        !ok && err.contains("'test', which step 1 does not read"),
        "{err}"
    );
    let (ok, _, err) = zr(&["explain", "--run", run, "--step", "1", "--verify", "train"]);
    assert!(!ok && err.contains("is not NAME=HEX"), "{err}");
}
