//! A dataset's redo log: any bytes decode or fail with an error. The generation and field
//! count asked for are the ones the bytes claim (so the decoder goes past its first checks),
//! or others.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zr_node::redo;

fuzz_target!(|data: &[u8]| {
    let at = |i: usize, n: usize| data.get(i..i + n);
    let generation = at(8, 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
    let fields = at(16, 4).map_or(1, |b| u32::from_le_bytes(b.try_into().unwrap_or_default()));
    let path = std::path::Path::new("fuzzed/redo.log");
    for fields in [fields.min(64) as usize, 1, 3] {
        let _ = redo::decode(data, path, generation, fields);
    }
    let _ = redo::decode(data, path, generation.wrapping_add(1), 1);
});
