//! A node's decoder of router requests: any bytes decode or fail cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zr_proto::wire::{self, NodeMessage};

fuzz_target!(|data: &[u8]| {
    let _ = wire::is_message(data);
    if let Ok((message, rest)) = wire::decode_request::<NodeMessage>(data) {
        // What decodes encodes again.
        let _ = rest.len();
        let _ = wire::encode_request(&message);
    }
});
