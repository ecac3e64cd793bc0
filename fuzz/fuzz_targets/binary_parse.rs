//! Feeds arbitrary bytes to the binary protocol parser the way the server does (parse, reply,
//! consume, swallow, repeat) and composes a reply for every request, checking the parser's
//! promises: it never panics, `consumed` is within the buffer and covers at least a header,
//! a request's pieces obey memcached's limits, what it waits for is bounded, composed replies
//! read back, and parsing is deterministic.
#![no_main]

use kvproto::binary::{self, Command, Limits, Parse, ResponseParse, Status, HEADER_LEN};
use kvproto::MAX_KEY_LEN;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // The first byte picks the server configuration; the rest is what a client sent.
    let (config, stream) = match input.split_first() {
        Some((&c, rest)) => (c, rest),
        None => (0, input),
    };
    let limits = Limits {
        max_value: match config & 3 {
            0 => 0,
            1 => 16,
            2 => 1024,
            _ => 1 << 20,
        },
        flush_enabled: config & 4 == 0,
        shutdown_enabled: false,
    };
    let mut out = Vec::new();
    let mut rest = stream;
    let mut swallow = 0usize;
    // Each step consumes at least one header, so this bounds the loop.
    for _ in 0..=stream.len() {
        if swallow > 0 {
            let n = swallow.min(rest.len());
            rest = &rest[n..];
            swallow -= n;
            if swallow > 0 {
                break;
            }
        }
        let parsed = binary::parse(rest, &limits);
        assert_eq!(
            parsed,
            binary::parse(rest, &limits),
            "parse is not deterministic"
        );
        let start = out.len();
        // The buffer-sizing hint never panics and is a storage request's length.
        let hint = binary::request_len_hint(rest);
        match parsed {
            Parse::Request(request, n) => {
                assert!(n >= HEADER_LEN && n <= rest.len(), "bad request length {n}");
                if let Some(h) = hint {
                    assert_eq!(h, n, "request_len_hint of a storage request");
                }
                assert!(request.key.len() <= MAX_KEY_LEN, "key too long");
                assert!(request.value.len() <= limits.max_value, "value too large");
                reply(&mut out, &request);
                rest = &rest[n..];
            }
            Parse::Error {
                opcode,
                opaque,
                status,
                close,
                consumed,
                swallow: s,
            } => {
                assert!(
                    consumed >= HEADER_LEN && consumed <= rest.len(),
                    "bad error length"
                );
                assert!(consumed <= binary::MAX_HEAD_LEN, "waited too long");
                assert!(s <= binary::MAX_BODY_LEN as usize, "swallow too large");
                binary::write_error(&mut out, opcode, opaque, status);
                if close {
                    break;
                }
                rest = &rest[consumed..];
                swallow = s;
            }
            Parse::TooLarge {
                opcode,
                opaque,
                status,
                key,
                consumed,
                swallow: s,
            } => {
                assert!(
                    consumed >= HEADER_LEN && consumed <= rest.len(),
                    "bad too-large length"
                );
                assert!(s > limits.max_value, "not too large");
                assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN, "bad key");
                binary::write_error(&mut out, opcode, opaque, status);
                rest = &rest[consumed..];
                swallow = s;
            }
            Parse::Incomplete => {
                // What the parser waits for is bounded by the head limit plus a value.
                assert!(
                    rest.len() < binary::MAX_HEAD_LEN + limits.max_value,
                    "incomplete with {} bytes",
                    rest.len()
                );
                break;
            }
            Parse::Close => break,
        }
        // Whatever was composed reads back as whole responses.
        let mut composed = &out[start..];
        while !composed.is_empty() {
            match binary::parse_response(composed) {
                ResponseParse::Response(_, n) => composed = &composed[n..],
                other => panic!("composed reply does not parse: {other:?}"),
            }
        }
        if out.len() > 1 << 16 {
            out.clear();
        }
    }
});

/// Composes a plausible reply, exercising every composer.
fn reply(out: &mut Vec<u8>, r: &binary::Request<'_>) {
    let (op, opaque) = (r.opcode, r.opaque);
    match r.command {
        Command::Get { with_key } | Command::GetAndTouch { with_key, .. } => {
            assert!(!r.key.is_empty());
            let key = with_key.then_some(r.key);
            if r.key.first().is_some_and(|b| b & 1 == 0) {
                binary::write_get_hit(out, op, opaque, r.cas, 7, key, r.key);
            } else if !r.quiet {
                binary::write_get_miss(out, op, opaque, key);
            }
        }
        Command::Touch { .. } => binary::write_get_hit(out, op, opaque, 1, 7, None, &[]),
        Command::Store { .. } | Command::Delete => {
            assert!(!r.key.is_empty());
            if !r.quiet {
                binary::write_ok(out, op, opaque, 1);
            }
        }
        Command::Arith { delta, initial, .. } => {
            binary::write_arith(out, op, opaque, 1, delta.wrapping_add(initial))
        }
        Command::Stat => {
            binary::write_stat(out, opaque, r.key, r.value);
            binary::write_stat_fmt(out, opaque, b"len", r.key.len());
            binary::write_stat_end(out, opaque);
        }
        Command::Version => binary::write_version(out, opaque, "1.6.41"),
        Command::SaslListMechs | Command::SaslAuth | Command::SaslStep => {
            binary::write_error(out, op, opaque, Status::UnknownCommand)
        }
        Command::ReplPull => binary::write_response(
            out,
            op,
            binary::Status::Success,
            opaque,
            0,
            &[],
            r.key,
            r.value,
        ),
        Command::Quit | Command::Flush { .. } | Command::Noop => {
            binary::write_ok(out, op, opaque, 0)
        }
    }
}
