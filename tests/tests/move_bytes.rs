//! What a shard move writes: only the records that change shard. Alone in its binary, so
//! that the process's count of bytes its stores wrote (`zr_node::disk::bytes_written`) is
//! this test's.

use zr_common::Record;
use zr_router::MapChange;
use zr_sim::SimCluster;

/// Adding a shard writes, on every node together, at most 1.2 times the bytes of the
/// records that move (plus a fixed allowance for metadata and commits), copied as the
/// files of the slots that move, node to node.
#[test]
fn adding_a_shard_writes_only_what_moves() {
    const RECORDS: u64 = 24_000;
    const SIZE: usize = 1024;
    let mut cluster =
        SimCluster::start(2, zr_tests::options(&[("data", "raw")], 16, 5_000, 1)).unwrap();
    let client = cluster.client().unwrap();
    let rows: Vec<Vec<u8>> = (0..RECORDS)
        .map(|i| (0..SIZE).map(|k| (i as usize * 31 + k) as u8).collect())
        .collect();
    let records: Vec<Record> = rows.iter().map(|r| Record::new().with("data", r)).collect();
    for batch in records.chunks(4_000) {
        client.append_many(batch).unwrap();
    }
    client.commit().unwrap();
    cluster.add_shard_nodes().unwrap();
    let (written, copied) = (
        zr_node::disk::bytes_written(),
        zr_shard::ship::slots_copied(),
    );
    let report = cluster.run_move(&client, MapChange::AddShard).unwrap();
    let written = zr_node::disk::bytes_written() - written;
    let moved = report.moved * SIZE as u64;
    assert!(
        report.moved > RECORDS / 4 && report.moved < RECORDS / 2,
        "{report:?}"
    );
    eprintln!(
        "{} records moved ({moved} bytes): {written} bytes written ({:.2}x)",
        report.moved,
        written as f64 / moved as f64
    );
    // Metadata and commits: each commit rewrites a node's meta.json (its slots and chunks).
    const ALLOWANCE: u64 = 4 << 20;
    assert!(
        written <= moved * 6 / 5 + ALLOWANCE,
        "{written} bytes written for {moved} bytes moved"
    );
    assert!(
        zr_shard::ship::slots_copied() > copied,
        "the slots were not copied as files"
    );
    let all: Vec<u64> = (0..RECORDS).collect();
    let columns = client.gather(&all, &[]).unwrap();
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(columns[0].get(k).unwrap(), &row[..], "record {k}");
    }
}
