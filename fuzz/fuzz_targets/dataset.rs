//! A whole dataset with one of its files damaged — meta.json, an offset table, a chunk, the
//! redo log, a zstd dictionary: overwritten at any place with any bytes, or cut short. Opening it, verifying
//! it and gathering every record (unchecked and checked) either works or fails with an
//! error; never a panic, never a read outside the files.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zr_node::{CreateOptions, FieldSpec, GatherOptions, Record, RuntimeOptions, Store};

/// One file of the undamaged dataset: where, how long (files are sparse: offset tables and
/// chunks are made long and filled as records come), and its first bytes, which hold all
/// the records.
struct File {
    path: PathBuf,
    len: u64,
    head: Vec<u8>,
}

/// Bytes of each file kept (every record of the template lies within them).
const HEAD_BYTES: usize = 64 << 10;

/// The undamaged dataset, made once and kept in memory: four fields (raw, Deflate, zstd, and
/// zstd with a dictionary trained on captions), records of varied sizes, some modified and
/// one deleted after a first commit (so a redo log exists).
fn build_template() -> &'static [File] {
    static TEMPLATE: OnceLock<Vec<File>> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir = tempfile::tempdir_in(scratch_root()).expect("scratch directory");
        let data = dir.path().join("ds");
        let fields = vec![
            FieldSpec::raw("a"),
            FieldSpec::flate("b"),
            FieldSpec::stored("c", "zstd").expect("zstd"),
            FieldSpec::stored("d", "zstd").expect("zstd"),
        ];
        let samples: Vec<Vec<u8>> = (0..600u64).map(caption).collect();
        let sample_refs: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
        let dict = zr_node::dict::train(&sample_refs, 4096).expect("a dictionary");
        let store = Store::create_with_dicts(
            &data,
            fields,
            CreateOptions::default(),
            RuntimeOptions::default(),
            &[("d".to_string(), dict)],
        )
        .expect("create");
        for i in 0..40u64 {
            let a = vec![i as u8; (i as usize * 37) % 300];
            let b = format!("record {i} ").repeat(1 + i as usize % 7);
            // Compressed, and (every fifth, one byte) stored as given.
            let c = if i % 5 == 0 {
                vec![i as u8]
            } else {
                b.clone().into_bytes()
            };
            store
                .append(
                    &Record::new()
                        .with("a", &a)
                        .with("b", b.as_bytes())
                        .with("c", &c)
                        .with("d", &caption(i)),
                )
                .expect("append");
        }
        store.commit().expect("commit");
        for i in [3u64, 17, 29] {
            store
                .modify(
                    i,
                    &Record::new()
                        .with("a", b"changed")
                        .with("b", b"changed too"),
                )
                .expect("modify");
        }
        store.delete(39).expect("delete");
        store.commit().expect("commit");
        drop(store);
        let mut paths = Vec::new();
        list(&data, Path::new(""), &mut paths);
        paths.sort();
        paths
            .into_iter()
            .map(|path| {
                let file = std::fs::File::open(data.join(&path)).expect("open");
                let mut len = file.metadata().expect("length").len();
                let mut head = Vec::new();
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(file, HEAD_BYTES as u64),
                    &mut head,
                )
                .expect("read");
                if path.starts_with("chunk") {
                    // Only the written part: a full-length (sparse) chunk makes every copy
                    // slow and a damaged entry fault in pages across a gigabyte.
                    len = head.len() as u64;
                }
                File { path, len, head }
            })
            .collect()
    })
}

/// A caption-like line for record `i` (what a dictionary is for: short, alike records).
fn caption(i: u64) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "a", "photo", "of", "the", "dog", "cat", "on", "grass", "beach", "red", "small", "city",
    ];
    let words: Vec<&str> = (0..6 + i % 9)
        .map(|k| WORDS[((i * 7 + k * 13 + i / 3) % 12) as usize])
        .collect();
    format!(
        "{{\"id\": {i}, \"caption\": \"{}\", \"lang\": \"en\"}}",
        words.join(" ")
    )
    .into_bytes()
}

/// The template, checked once: written out undamaged it opens, holds its 39 records (the last was deleted) and
/// verifies clean (else the harness would only ever try broken datasets).
fn template() -> &'static [File] {
    static CHECKED: OnceLock<()> = OnceLock::new();
    let files = build_template();
    CHECKED.get_or_init(|| {
        let copy = tempfile::tempdir_in(scratch_root()).expect("scratch directory");
        let ds = copy.path().join("ds");
        materialize(files, &ds, None);
        assert_eq!(exercise(&ds), Some((39, 0)), "the undamaged template");
    });
    files
}

/// Every file under `dir/under` (the lock file aside), relative to `dir`.
fn list(dir: &Path, under: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir.join(under)).expect("list").flatten() {
        let relative = under.join(entry.file_name());
        let path = entry.path();
        if path.is_dir() {
            list(dir, &relative, out);
        } else if entry.file_name() != "lock" {
            out.push(relative);
        }
    }
}

/// Memory-backed scratch space where there is one (`ZR_FUZZ_SCRATCH` overrides it).
fn scratch_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("ZR_FUZZ_SCRATCH") {
        return dir.into();
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Writes the dataset to `ds`, with one file damaged as `damage` says (its first byte picks
/// the file, the next four the place, the sixth how: overwritten with the rest, or cut).
fn materialize(files: &[File], ds: &Path, damage: Option<&[u8]>) {
    let damaged = damage.map(|d| d[0] as usize % files.len());
    for (k, file) in files.iter().enumerate() {
        let path = ds.join(&file.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        let mut bytes = file.head.clone();
        let mut len = file.len;
        if let (Some(data), true) = (damage, damaged == Some(k)) {
            let at = u32::from_le_bytes([data[1], data[2], data[3], data[4]]) as usize
                % (bytes.len() + 1);
            let patch = &data[6..];
            if data[5] < 224 {
                let end = (at + patch.len()).min(bytes.len());
                bytes[at..end].copy_from_slice(&patch[..end - at]);
                bytes.extend_from_slice(&patch[end - at..]);
                len = len.max(bytes.len() as u64);
            } else {
                bytes.truncate(at);
                len = at as u64;
            }
        }
        let out = std::fs::File::create(&path).expect("create");
        std::io::Write::write_all(&mut &out, &bytes).expect("write");
        out.set_len(len).expect("set length");
    }
}

/// Opens, verifies and gathers from the dataset in `ds`: its length and the problems
/// verify found, if it opened.
fn exercise(ds: &Path) -> Option<(u64, usize)> {
    let runtime = RuntimeOptions {
        readers: 1,
        writers: 1,
        cleaners: 1,
        ..RuntimeOptions::default()
    };
    let store = Store::open_read_only_with(ds, runtime).ok()?;
    let problems = store
        .verify(|_| {})
        .map_or(usize::MAX, |r| r.problems.len());
    let all: Vec<u64> = (0..store.len().min(1_000)).collect();
    let _ = store.gather(&all, &[]);
    let _ = store.gather_with(&all, &[], GatherOptions::verified());
    for field in ["a", "b"] {
        for &i in all.iter().take(50) {
            let _ = store.gather(&[i], &[field]);
        }
    }
    Some((store.len(), problems))
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let files = template();
    let copy = tempfile::tempdir_in(scratch_root()).expect("scratch directory");
    let ds = copy.path().join("ds");
    materialize(files, &ds, Some(data));
    let _ = exercise(&ds);
});
