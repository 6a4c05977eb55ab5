//! `.npy` headers (`zr convert --npy`, `--offsets`): any bytes parse or fail with an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zr_node::convert::NpyHeader;

fuzz_target!(|data: &[u8]| {
    let _ = NpyHeader::parse(data, std::path::Path::new("fuzzed.npy"));
});
