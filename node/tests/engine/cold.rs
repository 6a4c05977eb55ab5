//! The explicit read path (data not in memory): it returns exactly what the mappings return,
//! for every kind of field, through io_uring, the `preadv` threads and `O_DIRECT`; a file
//! cut short under it is an error naming the file; `Auto` turns to it when the pages a
//! gather needs are not in memory.

use std::path::{Path, PathBuf};

use zr_node::{CreateOptions, Error, FieldSpec, GatherOptions, IoBackend, ReadPath, Record, Store};

/// A scratch directory on the build's own disk: `O_DIRECT` needs a file system that
/// supports it, which a tmpfs `/tmp` may not.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch directory")
}

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_add(0x632b_e59b_d9b4_e019);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

/// Record `i`: a fixed 64-byte raw field, a variable raw field absent from every fifth
/// record, and a flate field of compressible text.
fn record_fields(i: u64) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let fixed: Vec<u8> = (0..64).map(|k| mix(i, k) as u8).collect();
    let variable: Vec<u8> = if i.is_multiple_of(5) {
        Vec::new()
    } else {
        (0..(mix(i, 99) % 5000) as usize)
            .map(|k| mix(i, k as u64) as u8)
            .collect()
    };
    let text = format!("record {i} says {} ", mix(i, 7) % 1000)
        .repeat(1 + (mix(i, 8) % 40) as usize)
        .into_bytes();
    (fixed, variable, text)
}

fn build(dir: &Path, records: u64) -> Store {
    let fields = vec![
        FieldSpec::raw("fixed"),
        FieldSpec::raw("variable"),
        FieldSpec::flate("text"),
    ];
    let options = CreateOptions {
        chunk_records: 300,
        ..CreateOptions::default()
    };
    let store = Store::create(dir, fields, options).expect("create");
    let rows: Vec<_> = (0..records).map(record_fields).collect();
    let batch: Vec<Record> = rows
        .iter()
        .map(|(f, v, t)| {
            let mut r = Record::new().with("fixed", f).with("text", t);
            if !v.is_empty() {
                r.set("variable", v);
            }
            r
        })
        .collect();
    store.append_many(&batch).expect("append");
    store.commit().expect("commit");
    store
}

fn with(read: ReadPath, uncached: bool, io: IoBackend) -> GatherOptions {
    GatherOptions {
        read,
        uncached,
        io,
        ..GatherOptions::default()
    }
}

/// Every field's records of a gather, as owned bytes.
fn rows(store: &Store, indices: &[u64], options: GatherOptions) -> Vec<Vec<Vec<u8>>> {
    let batch = store.gather_with(indices, &[], options).expect("gather");
    batch
        .fields()
        .map(|f| f.iter().map(<[u8]>::to_vec).collect())
        .collect()
}

#[test]
fn explicit_reads_return_what_the_mappings_return() {
    let dir = scratch();
    let store = build(dir.path(), 2000);
    // Uncommitted changes below the committed length live in the overlay: explicit reads
    // must see them too.
    for i in [3u64, 700, 1999] {
        let (f, _, t) = record_fields(i + 10_000);
        store
            .modify(i, &Record::new().with("fixed", &f).with("text", &t))
            .expect("modify");
    }
    for round in 0..4u64 {
        let indices: Vec<u64> = (0..500).map(|k| mix(round, k) % store.len()).collect();
        let want = rows(
            &store,
            &indices,
            with(ReadPath::Mmap, false, IoBackend::Auto),
        );
        for (i, row) in indices.iter().zip(&want[0]) {
            let expect = if [3, 700, 1999].contains(i) {
                record_fields(i + 10_000).0
            } else {
                record_fields(*i).0
            };
            assert_eq!(row, &expect, "record {i} from the mappings");
        }
        for (uncached, io) in [
            (false, IoBackend::Auto),
            (false, IoBackend::Threads),
            (true, IoBackend::Auto),
            (true, IoBackend::Threads),
        ] {
            let got = rows(&store, &indices, with(ReadPath::Direct, uncached, io));
            assert!(
                got == want,
                "explicit reads (uncached {uncached}, {io:?}) differ from the mappings"
            );
        }
    }
    let stats = store.read_stats();
    assert_eq!(stats.direct_gathers, 16);
    assert_eq!(stats.mmap_gathers, 4);
}

#[test]
fn a_chunk_cut_short_under_an_open_store_is_an_error_naming_it() {
    let dir = scratch();
    let store = build(dir.path(), 600);
    // The chunk holding record 450 — which chunk that is depends on how the store's
    // writers shared the appends — cut just before its first field's frame: every gather
    // below needs it, and `Auto`'s residency check samples it.
    let table = std::fs::read(dir.path().join(zr_node::offset::offset_file_name("fixed")))
        .expect("offset table");
    let entry = zr_node::offset::Entry::decode(
        table[450 * 16..451 * 16]
            .try_into()
            .expect("an entry is 16 bytes"),
    );
    let chunk: PathBuf = zr_node::chunk_path(dir.path(), entry.chunk_id);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&chunk)
        .expect("open the chunk")
        .set_len(entry.offset)
        .expect("cut the chunk short");
    let indices: Vec<u64> = (300..600).collect();
    for read in [ReadPath::Direct, ReadPath::Auto] {
        for uncached in [false, true] {
            let options = GatherOptions {
                read,
                uncached,
                ..GatherOptions::default()
            };
            // Auto reads through the mappings for 20 ms after a check finds pages in memory
            // (`WARM_RECHECK_NS`), without looking again: past that, it checks and reads
            // explicitly (a zero-copy batch through the mappings would fault only when read).
            std::thread::sleep(std::time::Duration::from_millis(50));
            let e = store
                .gather_with(&indices, &[], options)
                .expect_err("a gather past the file's end");
            assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
            assert!(e.to_string().contains(&chunk.display().to_string()), "{e}");
        }
    }
}

#[test]
fn auto_reads_explicitly_while_the_pages_are_not_in_memory() {
    let dir = scratch();
    drop(build(dir.path(), 2000));
    for entry in walk(dir.path()) {
        if !zr_node::page_cache::evict(&entry).expect("evict") {
            eprintln!(
                "skipped: the page cache keeps {} in memory",
                entry.display()
            );
            return;
        }
    }
    let store = Store::open(dir.path()).expect("open");
    let indices: Vec<u64> = (0..256).map(|k| mix(5, k) % 2000).collect();
    let auto = GatherOptions::default();
    let cold = rows(&store, &indices, auto);
    assert_eq!(
        store.read_stats().direct_gathers,
        1,
        "{:?}",
        store.read_stats()
    );
    assert_eq!(store.read_stats().mmap_gathers, 0);
    // Those reads went through the page cache: the same gather now finds its pages there.
    let warm = rows(&store, &indices, auto);
    assert_eq!(
        store.read_stats().mmap_gathers,
        1,
        "{:?}",
        store.read_stats()
    );
    assert!(cold == warm);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
