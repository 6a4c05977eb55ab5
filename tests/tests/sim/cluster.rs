//! The cluster through the simulator, as a client sees it: every gather equals an in-memory
//! model after random appends, modifies, deletes and commits; nodes and routers restart
//! without changing an answer.

use zr_common::hash::mix2;
use zr_common::Record;
use zr_net::tls::Role;
use zr_router::Client;
use zr_sim::{SimCluster, SimOptions};

type Row = [Vec<u8>; 2];

fn options() -> SimOptions {
    // Small extents: a few hundred records already spread over every shard.
    zr_tests::options(&[("a", "raw"), ("b", "flate")], 3, 5_000, 1)
}

fn row(seed: u64) -> Row {
    let len = (mix2(seed, 1) % 600) as usize;
    let a: Vec<u8> = (0..len).map(|i| mix2(seed, i as u64) as u8).collect();
    let b: Vec<u8> = if seed.is_multiple_of(4) {
        Vec::new()
    } else {
        format!("record {seed} ").repeat(1 + len / 40).into_bytes()
    };
    [a, b]
}

fn record(row: &Row) -> Record<'_> {
    Record::new().with("a", &row[0]).with("b", &row[1])
}

fn check(client: &Client, model: &[Row], indices: &[u64]) {
    let columns = client.gather(indices, &[]).unwrap();
    assert_eq!(columns.len(), 2);
    for (pos, &i) in indices.iter().enumerate() {
        for f in 0..2 {
            assert!(
                columns[f].get(pos).unwrap() == &model[i as usize][f][..],
                "field {f} of record {i} differs"
            );
        }
    }
}

fn check_all(client: &Client, model: &[Row]) {
    assert_eq!(client.len().unwrap(), model.len() as u64);
    let all: Vec<u64> = (0..model.len() as u64).collect();
    check(client, model, &all);
}

#[test]
fn cluster_matches_a_model_through_random_operations() {
    matches_a_model(1);
}

#[test]
fn a_replicated_cluster_matches_a_model_through_random_operations() {
    matches_a_model(2);
}

fn matches_a_model(replicas: u32) {
    let options = SimOptions {
        replicas,
        ..options()
    };
    let mut cluster = SimCluster::start(3, options).unwrap();
    let client = cluster.client().unwrap();
    let mut model: Vec<Row> = Vec::new();
    let mut committed: Vec<Row> = Vec::new();
    for step in 0..300u64 {
        let r = mix2(0xc1u64, step);
        match r % 10 {
            0..=3 => {
                let rows: Vec<Row> = (0..1 + r % 40).map(|k| row(r ^ k)).collect();
                let records: Vec<Record> = rows.iter().map(record).collect();
                let range = client.append_many(&records).unwrap();
                assert_eq!(range.start, model.len() as u64);
                model.extend(rows);
            }
            4 if !model.is_empty() => {
                let i = mix2(r, 2) % model.len() as u64;
                let new = row(r);
                client.modify(i, &record(&new)).unwrap();
                model[i as usize] = new;
            }
            5 if !model.is_empty() => {
                let i = mix2(r, 3) % model.len() as u64;
                client.delete(i).unwrap();
                model.swap_remove(i as usize);
            }
            6 => {
                client.commit().unwrap();
                committed = model.clone();
            }
            _ if !model.is_empty() => {
                // Random, repeated, cross-shard.
                let indices: Vec<u64> = (0..1 + r % 50)
                    .map(|k| mix2(r, k) % model.len() as u64)
                    .collect();
                check(&client, &model, &indices);
            }
            _ => {}
        }
    }
    check_all(&client, &model);
    client.commit().unwrap();
    committed.clone_from(&model);
    // Every replica holds the same records.
    for shard in 0..3 {
        let report = client.scrub(shard, 0, 1 << 20).unwrap();
        assert_eq!(report.replicas, replicas);
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }

    // Errors name what is wrong.
    let err = client
        .gather(&[model.len() as u64 + 5], &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("index {}", model.len() + 5))
            && err.contains(&format!("holds {} records", model.len())),
        "{err}"
    );
    let err = client.gather(&[0], &["nope"]).unwrap_err().to_string();
    assert!(err.contains("'nope'"), "{err}");

    // A node stopped and started again serves its committed data.
    cluster.stop_node(1).unwrap();
    cluster.start_node(1).unwrap();
    let client = cluster.client().unwrap();
    check_all(&client, &committed);
}

#[test]
fn restarted_and_second_routers_answer_identically() {
    let mut cluster = SimCluster::start(4, options()).unwrap();
    let client = cluster.client().unwrap();
    let rows: Vec<Row> = (0..500).map(row).collect();
    let records: Vec<Record> = rows.iter().map(record).collect();
    client.append_many(&records).unwrap();
    client.commit().unwrap();
    let indices: Vec<u64> = (0..700u64).map(|k| mix2(9, k) % 500).collect();
    let before = client.gather(&indices, &[]).unwrap();
    drop(client);

    cluster.restart_router().unwrap();
    let second = cluster.add_router().unwrap();
    let after = cluster.client().unwrap().gather(&indices, &[]).unwrap();
    let other = Client::connect(second, cluster.security(Role::Writer).unwrap())
        .unwrap()
        .gather(&indices, &[])
        .unwrap();
    assert_eq!(before, after);
    assert_eq!(before, other);
    let client = cluster.client().unwrap();
    assert_eq!(client.len().unwrap(), 500);
    check_all(&client, &rows);
}

#[test]
fn two_routers_writing_in_turn_stay_in_step() {
    let mut cluster = SimCluster::start(3, options()).unwrap();
    let second = cluster.add_router().unwrap();
    let a = cluster.client().unwrap();
    let b = Client::connect(second, cluster.security(Role::Writer).unwrap()).unwrap();
    let mut model: Vec<Row> = Vec::new();
    for step in 0..16u64 {
        let (writer, reader) = if step % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let rows: Vec<Row> = (0..1 + step % 7).map(|k| row(step * 100 + k)).collect();
        let records: Vec<Record> = rows.iter().map(record).collect();
        // The writer's cached length is stale after the other router's appends: the nodes
        // refuse the out-of-step append, and the router learns the length and retries.
        let range = writer.append_many(&records).unwrap();
        assert_eq!(range.start, model.len() as u64, "step {step}");
        model.extend(rows);
        // The other router serves the new records at once.
        check_all(reader, &model);
        if step % 5 == 4 {
            let i = mix2(step, 1) % model.len() as u64;
            let new = row(step + 7000);
            reader.modify(i, &record(&new)).unwrap();
            model[i as usize] = new;
            check_all(writer, &model);
        }
    }
    a.commit().unwrap();
    check_all(&b, &model);
}

/// A row no other tag gives: the tag leads its first field.
fn tagged_row(tag: u64) -> Row {
    let mut a = tag.to_le_bytes().to_vec();
    a.extend((0..mix2(tag, 2) % 300).map(|i| mix2(tag, i) as u8));
    [
        a,
        format!("tag {tag} ")
            .repeat((tag % 5) as usize)
            .into_bytes(),
    ]
}

/// Two routers appending, modifying and deleting at the same moment, from two threads: the
/// cluster's writes are serialized across routers, so the result is what some order of the
/// successful operations gives — the right length, no record lost or doubled. (Swap-removes
/// through two routers at once would move one record into two holes, or leave a hole behind
/// the other router's append.)
#[test]
fn two_routers_writing_at_once_lose_and_double_nothing() {
    let mut cluster = SimCluster::start(3, options()).unwrap();
    let second = cluster.add_router().unwrap();
    const INITIAL: u64 = 60;
    let initial: Vec<Row> = (0..INITIAL).map(tagged_row).collect();
    cluster
        .client()
        .unwrap()
        .append_many(&initial.iter().map(record).collect::<Vec<_>>())
        .unwrap();
    let security = cluster.security(Role::Writer).unwrap();
    let writers: Vec<_> = [cluster.router_addr(), second]
        .into_iter()
        .enumerate()
        .map(|(w, addr)| {
            let client = Client::connect(addr, security.clone()).unwrap();
            std::thread::spawn(move || {
                let mut written: Vec<Row> = Vec::new();
                let (mut appended, mut deleted) = (0u64, 0u64);
                for step in 0..40u64 {
                    let tag = (w as u64 + 1) * 1_000_000 + step * 10;
                    // The other router may delete meanwhile: an index out of range is fine.
                    let in_range = |result: Result<(), zr_router::Error>| match result {
                        Ok(()) => true,
                        Err(e) => {
                            assert!(e.to_string().contains("out of range"), "{e}");
                            false
                        }
                    };
                    let index = |client: &Client| mix2(tag, 6) % client.len().unwrap().max(1);
                    match mix2(tag, 5) % 3 {
                        0 => {
                            let rows: Vec<Row> =
                                (0..1 + step % 3).map(|k| tagged_row(tag + k)).collect();
                            client
                                .append_many(&rows.iter().map(record).collect::<Vec<_>>())
                                .unwrap();
                            appended += rows.len() as u64;
                            written.extend(rows);
                        }
                        1 => {
                            if in_range(client.delete(index(&client))) {
                                deleted += 1;
                            }
                        }
                        _ => {
                            let new = tagged_row(tag + 7);
                            if in_range(client.modify(index(&client), &record(&new))) {
                                written.push(new);
                            }
                        }
                    }
                }
                (written, appended, deleted)
            })
        })
        .collect();
    let mut known: std::collections::HashSet<Row> = initial.into_iter().collect();
    let mut expected_len = INITIAL;
    for writer in writers {
        let (written, appended, deleted) = writer.join().unwrap();
        expected_len = expected_len + appended - deleted;
        known.extend(written);
    }
    let reader = cluster.client().unwrap();
    assert_eq!(reader.len().unwrap(), expected_len);
    let all: Vec<u64> = (0..expected_len).collect();
    let columns = reader.gather(&all, &[]).unwrap();
    let mut seen = std::collections::HashSet::new();
    for pos in 0..expected_len as usize {
        let r: Row = [0, 1].map(|f| columns[f].get(pos).unwrap().to_vec());
        assert!(known.contains(&r), "record {pos} is none that was written");
        assert!(seen.insert(r), "record {pos} is held twice");
    }
}
