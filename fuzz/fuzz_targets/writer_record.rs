//! The write-in-progress record (the writer lease and the write it covers, JSON in the
//! metadata store): any bytes parse or fail, and a router observing what parsed never panics.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use zr_meta::writer::{LeaseState, WriterRecord};

fuzz_target!(|data: &[u8]| {
    let Some((&revision, data)) = data.split_first() else {
        return;
    };
    if let Ok(record) = serde_json::from_slice::<WriterRecord>(data) {
        let mut state = LeaseState::new(7, Duration::from_millis(500));
        let now = Instant::now();
        let _ = state.observe(Some((&record, u64::from(revision))), now);
        let _ = state.usable(now, Duration::from_millis(10));
        let _ = state.needs_renewal(now + Duration::from_secs(1));
        let _ = state.observe(None, now);
    }
});
