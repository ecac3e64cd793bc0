//! Feeds arbitrary text to kvblast's agent-report decoder (counters and HdrHistogram V2
//! histograms, from a peer over TCP): it must never panic or allocate beyond its bounds, and
//! what it accepts must encode and decode again to the same report.
#![no_main]

use kvblast::agent::{decode_stats, encode_stats};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Ok(st) = decode_stats(text) {
        let again = encode_stats(&st);
        let back = decode_stats(&again);
        assert!(back.is_ok(), "re-encoded report refused: {back:?}");
        assert_eq!(encode_stats(&back.unwrap_or_default()), again);
    }
});
