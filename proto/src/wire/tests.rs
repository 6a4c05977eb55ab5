use super::*;

fn message(prefix: Vec<u8>, body: &[u8]) -> Vec<u8> {
    [prefix, body.to_vec()].concat()
}

#[test]
fn round_trips() {
    let request = NodeRequest::Append {
        runs: vec![Run {
            slot: 7,
            at: 5,
            count: 2,
        }],
        token: Some(9),
        fields: vec!["a".into(), "b".into()],
        lengths: vec![vec![1, 2], vec![0, 3]],
    };
    let sent = NodeMessage::new(
        "c1",
        3,
        Some(Target {
            shard: 2,
            replica: 1,
        }),
        request,
    )
    .on(Some("images"));
    // The borrowing encoder writes the same bytes as the message.
    let encoded = encode_request(&sent).unwrap();
    assert_eq!(
        encode_node_request(Some("c1"), Some("images"), 3, sent.target, &sent.request).unwrap(),
        encoded
    );
    let bytes = message(encoded, b"xyy___");
    let (back, body) = decode_request::<NodeMessage>(&bytes).unwrap();
    assert_eq!(back, sent);
    let NodeRequest::Append { lengths, .. } = back.request else {
        unreachable!()
    };
    assert_eq!(
        split_columns(&lengths, body),
        vec![vec![&b"x"[..], b"yy"], vec![&b""[..], b"___"]]
    );
    let reply = Reply::Error {
        code: ErrorCode::IndexOutOfRange,
        message: "index 9".into(),
    };
    assert_eq!(
        decode_reply(&encode_reply(&reply).unwrap()).unwrap().0,
        reply
    );
}

/// A reply's head is known once its first bytes arrive, with the length of the whole
/// message; before that there is nothing to know, and a bad head is an error at once.
#[test]
fn heads_decode_from_the_first_chunks() {
    let reply = Reply::Gather {
        lengths: vec![vec![3, 0, 5], vec![1, 1, 1]],
    };
    let head = encode_reply(&reply).unwrap();
    let whole = [head.clone(), b"abcdefgh123".to_vec()].concat();
    for arrived in 0..=whole.len() {
        let chunks: Vec<bytes::Bytes> = whole[..arrived]
            .chunks(5)
            .map(bytes::Bytes::copy_from_slice)
            .collect();
        match decode_reply_head(&chunks).unwrap() {
            Some((back, len)) => {
                assert!(arrived >= head.len(), "decoded from {arrived} bytes");
                assert_eq!(back, reply);
                assert_eq!(len, whole.len() as u64);
            }
            None => assert!(arrived < head.len(), "not decoded from {arrived} bytes"),
        }
    }
    let mut bad = head.clone();
    bad[0] = b'X';
    assert!(decode_reply_head(&[bytes::Bytes::from(bad)]).is_err());
    let uneven = encode_reply(&Reply::Gather {
        lengths: vec![vec![1, 2], vec![3]],
    })
    .unwrap();
    assert!(decode_reply_head(&[bytes::Bytes::from(uneven)]).is_err());
}

#[test]
fn replies_decode_the_same_from_any_chunking() {
    let reply = Reply::Gather {
        lengths: vec![vec![3, 0, 5], vec![1, 1, 1]],
    };
    let whole = [encode_reply(&reply).unwrap(), b"abcdefgh123".to_vec()].concat();
    for cut in [1, 5, 12, 13, whole.len() - 1] {
        for step in [cut, 1] {
            let chunks: Vec<bytes::Bytes> = whole
                .chunks(step)
                .map(bytes::Bytes::copy_from_slice)
                .collect();
            let (back, body_start) = decode_reply_chunks(&chunks).unwrap();
            assert_eq!(back, reply);
            assert_eq!(&whole[body_start..], b"abcdefgh123");
        }
    }
    // Truncated anywhere: an error.
    for cut in 0..whole.len() {
        let chunks = vec![bytes::Bytes::copy_from_slice(&whole[..cut])];
        assert!(decode_reply_chunks(&chunks).is_err(), "cut {cut}");
    }
}

#[test]
fn hostile_messages_are_errors() {
    let good = encode_request(&node(NodeRequest::Gather {
        indices: vec![1, 2, 3],
        fields: vec![],
        checked: false,
    }))
    .unwrap();
    // Every truncation, and every single-byte corruption, decodes to an error or to a
    // valid request — never a panic.
    for cut in 0..good.len() {
        assert!(decode_request::<NodeMessage>(&good[..cut]).is_err());
    }
    for i in 0..good.len() {
        for flip in [1u8, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[i] ^= flip;
            let _ = decode_request::<NodeMessage>(&bad);
        }
    }
    // A length prefix claiming 2^60 indices is refused without allocating them.
    let mut bomb = good.clone();
    let at = PREFIX_BYTES + 1 + 8 + 4; // after no cluster, the map version, the enum tag
    bomb[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(decode_request::<NodeMessage>(&bomb).is_err());
    // Body sizes must match the lengths.
    let append = encode_request(&node(NodeRequest::Append {
        runs: vec![Run {
            slot: 0,
            at: 0,
            count: 1,
        }],
        token: None,
        fields: vec!["a".into()],
        lengths: vec![vec![4]],
    }))
    .unwrap();
    assert!(decode_request::<NodeMessage>(&message(append.clone(), b"abc")).is_err());
    assert!(decode_request::<NodeMessage>(&message(append, b"abcd")).is_ok());
    // Another version is named in the error.
    let mut other = good;
    other[4] = 99;
    let e = decode_request::<NodeMessage>(&other).unwrap_err();
    assert!(matches!(e, Error::Version { theirs: 99, .. }), "{e}");
    assert!(e.to_string().contains("version 99"), "{e}");
}

/// A peer of the previous protocol version (16: dataset listings without their changes) is refused
/// by both protocols' decoders and by the reply decoder, naming both versions — never
/// read as this version's layout (ops/README.md, Upgrading).
#[test]
fn the_previous_version_is_refused_by_name() {
    let previous = (WIRE_VERSION - 1).to_le_bytes();
    let at = MAGIC.len();
    let named = |e: Error| {
        assert!(
            matches!(
                e,
                Error::Version {
                    theirs: 16,
                    ours: 17
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("unsupported protocol version 16 (this build speaks 17)"),
            "{e}"
        );
    };
    let mut node = encode_request(&NodeMessage::unchecked(NodeRequest::Info)).unwrap();
    node[at..at + 2].copy_from_slice(&previous);
    named(decode_request::<NodeMessage>(&node).unwrap_err());
    let mut client = encode_request(&ClientMessage::new(None, ClientRequest::Info)).unwrap();
    client[at..at + 2].copy_from_slice(&previous);
    named(decode_request::<ClientMessage>(&client).unwrap_err());
    let mut reply = encode_reply(&Reply::Moving(None)).unwrap();
    reply[at..at + 2].copy_from_slice(&previous);
    named(decode_reply(&reply).unwrap_err());
}

/// A zstd dictionary names itself by its header; a create's dictionaries are for its
/// fields and bounded in size.
#[test]
fn dictionaries_are_named_and_bounded() {
    let mut dict = 0xEC30_A437u32.to_le_bytes().to_vec();
    dict.extend_from_slice(&77u32.to_le_bytes());
    dict.extend_from_slice(b"entropy tables and content");
    assert_eq!(zstd_dict_id(&dict), Some(77));
    assert_eq!(DictRef::of(&dict).map(|d| d.id), Some(77));
    assert_eq!(zstd_dict_id(&dict[..7]), None);
    assert_eq!(zstd_dict_id(b"plain text, no dictionary"), None);
    let mut no_id = dict.clone();
    no_id[4..8].copy_from_slice(&[0; 4]);
    assert_eq!(zstd_dict_id(&no_id), None);
    let create = |field: &str, bytes: Vec<u8>| {
        let message = ClientMessage::new(
            Some("captions"),
            ClientRequest::CreateDataset {
                fields: vec![FieldInfo::new("c", "zstd")],
                dicts: vec![FieldDict {
                    field: field.into(),
                    bytes,
                }],
            },
        );
        decode_request::<ClientMessage>(&encode_request(&message).unwrap()).map(|_| ())
    };
    assert!(create("c", dict.clone()).is_ok());
    let e = create("d", dict).unwrap_err();
    assert!(e.to_string().contains("field 'd'"), "{e}");
    let e = create("c", vec![0; DICT_BYTES_MAX + 1]).unwrap_err();
    assert!(e.to_string().contains("at most"), "{e}");
}

/// A dataset name outside the pattern is refused before anything else, and a message
/// naming none addresses the default dataset.
#[test]
fn dataset_names_follow_the_pattern() {
    for good in ["default", "imagenet-1k", "a", "0.v2_b", &"x".repeat(64)] {
        assert_eq!(check_dataset_name(good), Ok(()), "{good}");
    }
    for bad in ["", "Images", "-a", ".a", "a/b", "a b", &"x".repeat(65), "é"] {
        assert!(check_dataset_name(bad).is_err(), "{bad}");
        let message = ClientMessage::new(Some(bad), ClientRequest::Info);
        let bytes = encode_request(&message).unwrap();
        let e = decode_request::<ClientMessage>(&bytes);
        assert!(matches!(e, Err(Error::Malformed(_))), "{bad}: {e:?}");
    }
    assert_eq!(
        ClientMessage::new(None, ClientRequest::Info).dataset(),
        "default"
    );
}

/// A revocation carries a certificate name of at most 64 bytes and no body.
#[test]
fn revocations_are_bounded() {
    let revoke = |name: String, body: Vec<u8>| {
        let message = ClientMessage::new(None, ClientRequest::Revoke { name, undo: false });
        let mut bytes = encode_request(&message).unwrap();
        bytes.extend_from_slice(&body);
        decode_request::<ClientMessage>(&bytes).map(|_| ())
    };
    assert!(revoke("team-a".into(), Vec::new()).is_ok());
    let e = revoke("x".repeat(CERT_NAME_BYTES_MAX + 1), Vec::new()).unwrap_err();
    assert!(e.to_string().contains("at most 64"), "{e}");
    assert!(revoke("team-a".into(), vec![1]).is_err(), "a body");
    let message = ClientMessage::new(
        None,
        ClientRequest::Revoke {
            name: "a".into(),
            undo: true,
        },
    );
    assert_eq!(message.request.access(), Access::Operate);
    // By serial number: as bounded, and an operator's too.
    let by_serial = |serial: String| {
        let message = ClientMessage::new(
            None,
            ClientRequest::RevokeSerial {
                serial,
                undo: false,
            },
        );
        assert_eq!(message.request.access(), Access::Operate);
        decode_request::<ClientMessage>(&encode_request(&message).unwrap()).map(|_| ())
    };
    assert!(by_serial("0a1b".into()).is_ok());
    let e = by_serial("0".repeat(CERT_NAME_BYTES_MAX + 1)).unwrap_err();
    assert!(e.to_string().contains("serial number of 65 bytes"), "{e}");
}

/// A node request's dataset is read from the start of its header alone, as the whole
/// decode reads it.
#[test]
fn a_node_requests_dataset_is_read_from_its_head() {
    for dataset in [None, Some("imgs"), Some("a-much-longer-dataset-name")] {
        let mut message = NodeMessage::unchecked(NodeRequest::Gather {
            indices: (0..300).collect(),
            fields: vec!["x".into()],
            checked: false,
        });
        message.cluster = Some("c0ffee".into());
        message.dataset = dataset.map(str::to_string);
        let bytes = encode_request(&message).unwrap();
        assert_eq!(node_request_dataset(&bytes).unwrap(), dataset);
    }
    let client = encode_request(&ClientMessage::new(None, ClientRequest::Info)).unwrap();
    assert!(node_request_dataset(&client).is_err(), "a client's message");
    assert!(node_request_dataset(b"ZRW1").is_err(), "cut short");
}

/// A grant's pattern is a dataset's name, the start of one followed by `*`, or `*`; its
/// name is bounded.
#[test]
fn grant_patterns_are_checked() {
    let grant = |who: &str, pattern: &str| Grant {
        who: who.into(),
        write: false,
        pattern: pattern.into(),
    };
    for good in ["imgs", "imgs*", "*", "a.b-c_d*"] {
        assert!(grant("team-a", good).check().is_ok(), "{good}");
    }
    for bad in ["", "Imgs", "im*gs", "**", "a b", "*imgs", &"x".repeat(65)] {
        let e = grant("team-a", bad).check().unwrap_err();
        assert!(e.to_string().contains("grant pattern"), "{bad}: {e}");
    }
    assert!(grant("", "imgs").check().is_err());
    assert!(grant(&"x".repeat(65), "imgs").check().is_err());
    assert!(grant("t", "imgs*").covers("imgs-2") && !grant("t", "imgs").covers("imgs-2"));
    assert!(grant("t", "*").covers("anything"));
}

/// A client's request and a node's are different messages: a node refuses a client's
/// unread, and a router a node's, so an internal request cannot come from a client.
#[test]
fn the_two_protocols_do_not_mix() {
    let sent = ClientMessage::new(Some("text"), ClientRequest::Delete { index: 7 });
    let client = encode_request(&sent).unwrap();
    let (back, _) = decode_request::<ClientMessage>(&client).unwrap();
    assert_eq!(back.dataset(), "text");
    assert_eq!(back.request, ClientRequest::Delete { index: 7 });
    let e = decode_request::<NodeMessage>(&client).unwrap_err();
    assert!(matches!(e, Error::Malformed(_)), "{e}");
    let fence = encode_request(&node(NodeRequest::Fence { token: 3 })).unwrap();
    assert!(decode_request::<ClientMessage>(&fence).is_err());
    // A cluster id past the limit is refused before anything else.
    let long = NodeMessage::new(&"c".repeat(200), 1, None, NodeRequest::Info);
    assert!(decode_request::<NodeMessage>(&encode_request(&long).unwrap()).is_err());
}

fn node(request: NodeRequest) -> NodeMessage {
    NodeMessage::unchecked(request)
}

use proptest::prelude::*;

fn request() -> impl Strategy<Value = (NodeRequest, Vec<u8>)> {
    let names = proptest::collection::vec("[a-z]{0,8}", 0..4);
    prop_oneof![
        Just((NodeRequest::Info, Vec::new())),
        Just((NodeRequest::Commit, Vec::new())),
        (
            proptest::collection::vec((any::<u32>(), any::<u64>()), 0..8),
            any::<u64>()
        )
            .prop_map(|(slots, token)| (NodeRequest::Truncate { slots, token }, Vec::new())),
        any::<u64>().prop_map(|token| (NodeRequest::Fence { token }, Vec::new())),
        (
            proptest::collection::vec(any::<u64>(), 0..64),
            names.clone(),
            any::<bool>()
        )
            .prop_map(|(indices, fields, checked)| (
                NodeRequest::Gather {
                    indices,
                    fields,
                    checked
                },
                Vec::new()
            )),
        (
            names,
            proptest::collection::vec(0u32..40, 0..20),
            any::<u32>(),
            any::<Option<u64>>()
        )
            .prop_map(|(fields, lens, slot, token)| {
                let lengths: Vec<Vec<u32>> = fields.iter().map(|_| lens.clone()).collect();
                let total: u32 = lengths.iter().flatten().sum();
                let body = vec![0xab; total as usize];
                let runs = vec![Run {
                    slot,
                    at: 0,
                    count: lengths.first().map_or(0, Vec::len) as u64,
                }];
                (
                    NodeRequest::Append {
                        runs,
                        token,
                        fields,
                        lengths,
                    },
                    body,
                )
            }),
    ]
}

/// What a decoded request promises its user: bodies that match their lengths.
fn consistent(request: &NodeRequest, body: &[u8]) {
    if let NodeRequest::Append { lengths, .. } = request {
        let columns = split_columns(lengths, body);
        for (column, lens) in columns.iter().zip(lengths) {
            for (payload, &len) in column.iter().zip(lens) {
                assert_eq!(payload.len(), len as usize);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    // Fuzz targets: arbitrary bytes never panic any decoder.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok((message, body)) = decode_request::<NodeMessage>(&bytes) {
            consistent(&message.request, body);
        }
        let _ = decode_reply(&bytes);
        let mut framed = [MAGIC.to_vec(), WIRE_VERSION.to_le_bytes().to_vec()].concat();
        framed.extend_from_slice(&bytes);
        let _ = decode_request::<NodeMessage>(&framed);
        let _ = decode_reply(&framed);
    }

    // Valid messages round-trip; every truncation is an error; any corruption is an error
    // or a request whose body matches its lengths.
    #[test]
    fn valid_messages_round_trip_and_damage_is_caught(
        (request, body) in request(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..,
    ) {
        let sent = node(request);
        let message = [encode_request(&sent).unwrap(), body.clone()].concat();
        let (back, back_body) = decode_request::<NodeMessage>(&message).unwrap();
        prop_assert_eq!(&back, &sent);
        prop_assert_eq!(back_body, &body[..]);
        let cut = at.index(message.len());
        prop_assert!(decode_request::<NodeMessage>(&message[..cut]).is_err());
        let mut damaged = message.clone();
        damaged[cut] ^= flip;
        if let Ok((message, body)) = decode_request::<NodeMessage>(&damaged) {
            consistent(&message.request, body);
        }
    }

    #[test]
    fn gather_replies_check_their_bodies(
        lens in proptest::collection::vec(0u32..50, 0..30),
        extra in 0usize..3,
    ) {
        let header = encode_reply(&Reply::Gather { lengths: vec![lens.clone()] }).unwrap();
        let total: usize = lens.iter().map(|&l| l as usize).sum();
        let ok = [header.clone(), vec![1; total]].concat();
        prop_assert!(decode_reply(&ok).is_ok());
        let long = [header.clone(), vec![1; total + 1 + extra]].concat();
        prop_assert!(decode_reply(&long).is_err());
        if total > 0 {
            let short = [header, vec![1; total - 1]].concat();
            prop_assert!(decode_reply(&short).is_err());
        }
    }
}
