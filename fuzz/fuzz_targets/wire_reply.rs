//! The decoders of replies (clients of routers, routers of nodes): whole, head first from
//! chunks split anywhere, and streamed gathers' parts.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use zr_proto::assemble::decode_gather_parts;
use zr_proto::chunks::Chunks;
use zr_proto::wire::{self, Reply};

fuzz_target!(|data: &[u8]| {
    let Some((&split, data)) = data.split_first() else {
        return;
    };
    let _ = wire::decode_reply(data);
    // The same bytes as two chunks, cut where the first byte says.
    let cut = (split as usize * data.len() / 255).min(data.len());
    let chunks = [
        Bytes::copy_from_slice(&data[..cut]),
        Bytes::copy_from_slice(&data[cut..]),
    ];
    let _ = wire::decode_reply_head(&chunks);
    if let Ok((Reply::GatherParts { records, parts }, start)) = wire::decode_reply_chunks(&chunks) {
        let mut body = Chunks::new(&chunks);
        body.skip(start);
        for fields in 1..=2 {
            let _ = decode_gather_parts(records, parts, fields, body.clone());
        }
    }
});
