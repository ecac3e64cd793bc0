//! Feeds arbitrary bytes to the binary-protocol response parser that kvblast reads servers
//! with (`kvproto::client::binary::parse_response`), the way kvblast does (parse, consume,
//! repeat), checking its promises on hostile input: it never panics, a response's length is
//! within the buffer and never 0, every shorter prefix of a response is incomplete, its
//! pieces lie within the body its header announced and the value respects the caller's
//! limit, and parsing is deterministic.
#![no_main]

use kvproto::client::binary::{parse_response, ParseResponse, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // The first byte picks the caller's limit on a value; the rest is what a server sent.
    let (config, stream) = match input.split_first() {
        Some((&c, rest)) => (c, rest),
        None => (0, input),
    };
    let max_value = match config & 3 {
        0 => 0,
        1 => 16,
        2 => 1 << 20,
        _ => usize::MAX,
    };
    let mut rest = stream;
    // Each response consumes at least a header, so this bounds the loop.
    for _ in 0..=stream.len() {
        let parsed = parse_response(rest, max_value);
        assert_eq!(parsed, parse_response(rest, max_value), "not deterministic");
        match parsed {
            ParseResponse::Response(r, n) => {
                assert!(
                    n >= HEADER_LEN && n <= rest.len(),
                    "bad response length {n}"
                );
                let whole = rest.get(..n).unwrap_or_default();
                assert_eq!(
                    parse_response(whole, max_value),
                    parsed,
                    "depends on what follows"
                );
                for cut in [n - 1, n / 2, 1] {
                    let short = rest.get(..cut).unwrap_or_default();
                    assert_eq!(
                        parse_response(short, max_value),
                        ParseResponse::Incomplete,
                        "a prefix of {cut} of {n} bytes"
                    );
                }
                assert_eq!(
                    HEADER_LEN + r.extras.len() + r.key.len() + r.value.len(),
                    n,
                    "the pieces are not the body"
                );
                assert!(r.value.len() <= max_value, "a value over the limit");
                rest = rest.get(n..).unwrap_or_default();
            }
            ParseResponse::Incomplete => {
                assert!(
                    rest.first().is_none_or(|&b| b == 0x81),
                    "incomplete on a byte that is no response's"
                );
                break;
            }
            ParseResponse::Invalid(_) => break,
        }
    }
});
