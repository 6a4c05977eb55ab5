//! Megatron-LM `.idx` files (`zr convert --megatron`): any bytes parse or fail with an error,
//! against a `.bin` of any length; a parsed index's counts fit the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zr_node::stream::MegatronIndex;

fuzz_target!(|data: &[u8]| {
    let Some((&bin, idx)) = data.split_first() else {
        return;
    };
    let bin_len = u64::from(bin) * 512;
    if let Ok(index) = MegatronIndex::parse(idx, bin_len, std::path::Path::new("fuzzed.idx")) {
        assert!(index.sequences * 12 + index.document_entries * 8 <= idx.len() as u64);
        assert!(index.documents() < index.document_entries);
    }
});
