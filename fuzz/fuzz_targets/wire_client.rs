//! A router's decoder of client requests: any bytes decode or fail cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zr_proto::wire::{self, ClientMessage};

fuzz_target!(|data: &[u8]| {
    if let Ok((request, _rest)) = wire::decode_request::<ClientMessage>(data) {
        let _ = wire::encode_request(&request);
    }
});
