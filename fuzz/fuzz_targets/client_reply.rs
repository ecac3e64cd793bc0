//! Feeds arbitrary bytes to the text-protocol reply parser that kvblast reads servers with
//! (`kvproto::client::parse_reply`), the way kvblast does (parse, consume, repeat), checking
//! its promises on hostile input: it never panics, a reply's length is within the buffer and
//! never 0, every shorter prefix of a reply is incomplete, a value's block respects the
//! caller's limit, parsing is deterministic, and a value composed again by the server's own
//! composer (`kvproto::text::write_value`) parses back to the same reply.
#![no_main]

use kvproto::client::{parse_reply, ParseReply, Reply, MAX_REPLY_LINE};
use kvproto::text;
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
    // Each reply consumes at least one byte, so this bounds the loop.
    for _ in 0..=stream.len() {
        let parsed = parse_reply(rest, max_value);
        assert_eq!(parsed, parse_reply(rest, max_value), "not deterministic");
        match parsed {
            ParseReply::Reply(reply, n) => {
                assert!(n > 0 && n <= rest.len(), "bad reply length {n}");
                let whole = rest.get(..n).unwrap_or_default();
                // What follows a reply does not change it.
                assert_eq!(
                    parse_reply(whole, max_value),
                    parsed,
                    "depends on what follows"
                );
                // A reply cut short is incomplete, never another reply or an error.
                for cut in [n - 1, n / 2] {
                    let short = rest.get(..cut).unwrap_or_default();
                    assert_eq!(
                        parse_reply(short, max_value),
                        ParseReply::Incomplete,
                        "a prefix of {cut} of {n} bytes"
                    );
                }
                check(&reply, n, max_value);
                rest = rest.get(n..).unwrap_or_default();
            }
            ParseReply::Incomplete => {
                // Only a line that may still end within the limit waits for more.
                let line = rest.iter().position(|&b| b == b'\n');
                assert!(
                    line.is_some() || rest.len() < MAX_REPLY_LINE,
                    "incomplete past the line limit"
                );
                break;
            }
            ParseReply::Invalid(_) => break,
        }
    }
});

/// A reply's own promises, and the round trip of a value through the server's composer.
fn check(reply: &Reply<'_>, n: usize, max_value: usize) {
    match *reply {
        Reply::Value {
            key,
            flags,
            cas,
            data,
        } => {
            assert!(data.len() <= max_value, "a value over the limit");
            assert!(!key.is_empty(), "an empty key");
            assert!(
                !key.contains(&b' ') && !key.contains(&b'\n'),
                "bad key bytes"
            );
            let mut again = Vec::new();
            text::write_value(&mut again, key, flags, data, cas);
            assert_eq!(
                parse_reply(&again, max_value),
                ParseReply::Reply(*reply, again.len()),
                "a composed value parses differently"
            );
        }
        Reply::Version(text)
        | Reply::ClientError(text)
        | Reply::ServerError(text)
        | Reply::Stat { name: text, .. } => {
            assert!(text.len() < n && !text.contains(&b'\n'), "bad text");
        }
        Reply::Number(number) => {
            let mut again = Vec::new();
            text::write_number(&mut again, number);
            assert_eq!(
                parse_reply(&again, max_value),
                ParseReply::Reply(*reply, again.len()),
                "a composed number parses differently"
            );
        }
        _ => {}
    }
}
