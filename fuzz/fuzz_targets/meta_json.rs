//! A dataset's meta.json: any bytes parse and validate, or fail with an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zr_node::Meta;

fuzz_target!(|data: &[u8]| {
    let _ = Meta::parse(data, std::path::Path::new("fuzzed"));
});
