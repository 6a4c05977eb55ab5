//! Chunk frame headers and offset-table entries, 16 bytes each: any bytes decode (entries)
//! or fail cleanly (frames), and what decodes encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zr_node::frame::FrameHeader;
use zr_node::offset::Entry;

fuzz_target!(|data: &[u8]| {
    for block in data.chunks_exact(16) {
        let bytes: [u8; 16] = block.try_into().unwrap_or_default();
        let _ = FrameHeader::decode(bytes);
        let entry = Entry::decode(bytes);
        assert_eq!(Entry::decode(entry.encode()), entry);
    }
});
