use super::*;

fn gather(records: usize, fields: &[&str]) -> NodeRequest {
    NodeRequest::Gather {
        indices: (0..records as u64).collect(),
        fields: fields.iter().map(|f| f.to_string()).collect(),
        checked: false,
    }
}

#[test]
fn only_small_gathers_of_raw_fields_may_run_inline() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let fields = vec![
        FieldSpec::new("image", Compression::Raw),
        FieldSpec::new("label", Compression::Flate),
    ];
    let store = Store::create(dir.path(), fields, CreateOptions::default()).expect("create");
    let inline = |request: &NodeRequest| runs_inline_when_warm(&store, request);
    assert!(inline(&gather(1024, &["image"])));
    assert!(!inline(&gather(1025, &["image"])), "too many records");
    assert!(!inline(&gather(1, &["label"])), "decompression");
    assert!(!inline(&gather(1, &[])), "all fields include a flate one");
    assert!(
        !inline(&gather(1, &["nope"])),
        "an unknown field is an error, off the workers"
    );
    assert!(!inline(&NodeRequest::Info));
}

/// Each refusal crosses the wire with a code a router can act on: a damaged record is
/// `CorruptRecord` (the data is at fault), an index past the end `IndexOutOfRange`, a
/// write without a lease token `BadRequest`, a client's request `BadRequest` unread.
/// What each sender may ask of a node: a router anything, a client reads, a partner
/// node its files (and nothing it could change or read records with).
#[test]
fn each_sender_may_ask_what_it_is_for() {
    use net::tls::Role;
    let message = |request: NodeRequest| NodeMessage::unchecked(request);
    let requests = [
        gather(1, &[]),
        NodeRequest::Info,
        NodeRequest::ShipOpen { slots: Vec::new() },
        NodeRequest::ShipRead {
            ship: 1,
            file: 0,
            offset: 0,
            len: 10,
        },
        NodeRequest::ShipClose { ship: 1 },
        NodeRequest::ShipFrom {
            addr: "127.0.0.1:1".into(),
            replica: 0,
            shard: None,
            slots: Vec::new(),
            rate: 0,
        },
        NodeRequest::Commit,
        NodeRequest::Digest {
            runs: vec![Run {
                slot: 0,
                at: 0,
                count: 1,
            }],
        },
    ];
    let allowed = |sender: Sender| -> Vec<&'static str> {
        requests
            .iter()
            .filter(|r| sender.refuses(&message((*r).clone())).is_none())
            .map(NodeRequest::kind)
            .collect()
    };
    assert_eq!(allowed(Sender::Router).len(), requests.len());
    assert_eq!(allowed(Sender::Client(Role::Reader)), ["gather", "info"]);
    assert_eq!(allowed(Sender::Client(Role::Operator)), ["gather", "info"]);
    assert_eq!(
        allowed(Sender::Client(Role::Node)),
        ["info", "ship-open", "ship-read", "ship-close"]
    );
}

#[test]
fn refusals_carry_their_codes() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let fields = vec![FieldSpec::new("image", Compression::Raw)];
    let store = Store::create(dir.path(), fields, CreateOptions::default()).expect("create");
    let record = zr_common::Record::new().with("image", b"0123456789");
    store
        .append_many(&[record.clone(), record])
        .expect("append");
    store.commit().expect("commit");
    drop(store);
    // Record 1's entry now claims a length past the chunk's end.
    let table = dir.path().join(zr_node::offset::offset_file_name("image"));
    let mut bytes = std::fs::read(&table).expect("offset table");
    bytes[16 + 12..16 + 16].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&table, bytes).expect("damage the entry");
    let store = Store::open(dir.path()).expect("open");
    let coordination =
        Coordination::open(&zr_node::disk::Disk::real(), dir.path()).expect("coordination");
    let code_of_reply = |request: Vec<u8>| {
        let (header, _) = handle(&store, &coordination, &request);
        match wire::decode_reply(&header).expect("reply").0 {
            Reply::Error { code, .. } => code,
            other => panic!("not refused: {other:?}"),
        }
    };
    let ask = |request: &NodeRequest| {
        code_of_reply(
            wire::encode_request(&NodeMessage::unchecked(request.clone())).expect("encode"),
        )
    };
    let gather = |index: u64| NodeRequest::Gather {
        indices: vec![index],
        fields: Vec::new(),
        checked: false,
    };
    assert_eq!(ask(&gather(1)), ErrorCode::CorruptRecord);
    assert_eq!(ask(&gather(2)), ErrorCode::IndexOutOfRange);
    let untokened = NodeRequest::Modify {
        index: 0,
        token: None,
        fields: Vec::new(),
        lengths: Vec::new(),
    };
    assert_eq!(ask(&untokened), ErrorCode::BadRequest);
    let client = wire::ClientMessage::new(None, wire::ClientRequest::Commit);
    assert_eq!(
        code_of_reply(wire::encode_request(&client).expect("encode")),
        ErrorCode::BadRequest
    );
}

/// A gather of data not in memory waits for the disk inside the store call, whichever way
/// it reads (the pages of a gather sent from the mapping are touched there, not later in
/// the transport; explicit reads are done there), and the node's warmth sees it: the next
/// gathers go to the blocking threads.
#[cfg(target_os = "linux")]
#[test]
fn a_cold_gather_waits_for_the_disk_in_the_store_call() {
    for read in [ReadPath::Mmap, ReadPath::Auto] {
        let dir = tempfile::tempdir().expect("temporary directory");
        let fields = vec![FieldSpec::new("image", Compression::Raw)];
        let store = Store::create(dir.path(), fields, CreateOptions::default()).expect("create");
        let payloads: Vec<Vec<u8>> = (0..64u8).map(|k| vec![k; 16 << 10]).collect();
        let records: Vec<zr_common::Record> = payloads
            .iter()
            .map(|p| zr_common::Record::new().with("image", p))
            .collect();
        store.append_many(&records).expect("append");
        store.commit().expect("commit");
        drop(store);
        for chunk in std::fs::read_dir(dir.path().join(zr_node::CHUNK_DIR)).expect("chunks") {
            if !zr_node::page_cache::evict(&chunk.expect("chunk").path()).expect("evict") {
                eprintln!("skipped: the page cache keeps the chunks in memory");
                return;
            }
        }
        let store = Store::open(dir.path())
            .expect("open")
            .with_gather_options(GatherOptions {
                read,
                ..GatherOptions::default()
            });
        let coordination =
            Coordination::open(&zr_node::disk::Disk::real(), dir.path()).expect("coordination");
        let request =
            wire::encode_request(&NodeMessage::unchecked(gather(64, &[]))).expect("encode");
        let warmth = Warmth::default();
        for _ in 0..crate::warm::WARM_STREAK {
            warmth.observe(|| ());
        }
        assert!(warmth.is_warm());
        let reads = || store.read_stats().direct_gathers;
        let (header, body) =
            warmth.observe_reads(reads, || handle(&store, &coordination, &request));
        let mut reply = header;
        body.iter().for_each(|piece| reply.extend_from_slice(piece));
        assert!(matches!(
            wire::decode_reply(&reply).expect("reply").0,
            Reply::Gather { .. }
        ));
        assert_eq!(body.len(), 64, "16 KiB records are sent one by one");
        assert_eq!(body[5].as_ref(), &[5u8; 16 << 10][..]);
        assert_eq!(
            store.read_stats().direct_gathers,
            u64::from(read == ReadPath::Auto),
            "{read:?}"
        );
        assert!(
            !warmth.is_warm(),
            "{read:?}: the pages came from the disk inside the call, not later in the transport"
        );
    }
}
