//! nodes.toml: any text parses and checks, or fails with an error naming the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zr_service::config::ClusterConfig;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(config) = ClusterConfig::parse(text, "nodes.toml") {
            let _ = config.placement();
        }
    }
});
