//! Feeds arbitrary bytes to the text protocol parser the way the server does (parse, reply,
//! consume, swallow, repeat) and composes a reply for every request, checking the parser's
//! promises: it never panics, `consumed` is within the buffer and never 0, a request's pieces
//! obey memcached's limits, and parsing is deterministic.
#![no_main]

use kvproto::text::{self, Limits, Parse, Request};
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
        shutdown_enabled: config & 8 != 0,
    };
    // The prefetch hint's keys: tokens of whole lines, never more than 64 lines' worth.
    for key in text::read_keys(stream).take(100_000) {
        assert!(!key.is_empty() && key.len() <= stream.len(), "bad hint key");
        assert!(
            !key.contains(&b' ') && !key.contains(&b'\n'),
            "bad hint key bytes"
        );
    }
    // The cross-connection hint: one key of one whole read line, as read_keys sees it.
    if let Some(key) = text::single_read_key(stream) {
        assert!(
            text::read_keys(stream).eq(std::iter::once(key)),
            "single_read_key and read_keys disagree"
        );
    }
    let mut out = Vec::new();
    let mut rest = stream;
    let mut swallow = 0usize;
    // Each step consumes at least one byte, so this bounds the loop.
    for _ in 0..=stream.len() {
        if swallow > 0 {
            let n = swallow.min(rest.len());
            rest = &rest[n..];
            swallow -= n;
            if swallow > 0 {
                break;
            }
        }
        let parsed = text::parse(rest, &limits);
        assert_eq!(
            parsed,
            text::parse(rest, &limits),
            "parse is not deterministic"
        );
        // The buffer-sizing hint never panics and, for a storage request, is its length.
        let hint = text::request_len_hint(rest);
        match parsed {
            Parse::Request(request, n) => {
                assert!(n > 0 && n <= rest.len(), "bad request length {n}");
                if matches!(request, Request::Store { .. }) {
                    assert_eq!(hint, Some(n), "request_len_hint of a storage request");
                }
                reply(&mut out, &request, &limits);
                rest = &rest[n..];
            }
            Parse::Error {
                reply,
                noreply,
                consumed,
                swallow: s,
            } => {
                assert!(consumed > 0 && consumed <= rest.len(), "bad error length");
                if !noreply {
                    text::write_error(&mut out, reply);
                }
                rest = &rest[consumed..];
                swallow = s;
            }
            Parse::TooLarge {
                key,
                noreply,
                consumed,
                swallow: s,
                ..
            } => {
                assert!(
                    consumed > 0 && consumed <= rest.len(),
                    "bad too-large length"
                );
                assert!(s > limits.max_value.saturating_add(2), "not too large");
                check_key(key);
                if !noreply {
                    text::write_error(&mut out, text::TOO_LARGE);
                }
                rest = &rest[consumed..];
                swallow = s;
            }
            Parse::Incomplete | Parse::Close => break,
        }
        if out.len() > 1 << 16 {
            out.clear();
        }
    }
});

fn check_key(key: &[u8]) {
    assert!(
        !key.is_empty() && key.len() <= MAX_KEY_LEN,
        "bad key length"
    );
    assert!(
        !key.contains(&b' ') && !key.contains(&b'\n'),
        "bad key bytes"
    );
}

/// Composes a plausible reply, exercising every composer.
fn reply(out: &mut Vec<u8>, request: &Request<'_>, limits: &Limits) {
    match *request {
        Request::Get { with_cas, keys, .. } | Request::Gat { with_cas, keys, .. } => {
            for (i, key) in keys.enumerate() {
                check_key(key);
                text::write_value(out, key, i as u32, key, with_cas.then_some(i as u64));
            }
            out.extend_from_slice(text::END);
        }
        Request::Store {
            key, data, noreply, ..
        } => {
            check_key(key);
            assert!(data.len() <= limits.max_value);
            if !noreply {
                out.extend_from_slice(text::STORED);
            }
        }
        Request::Delete { key, .. } | Request::Touch { key, .. } => {
            check_key(key);
            out.extend_from_slice(text::NOT_FOUND);
        }
        Request::Arith { key, delta, .. } => {
            check_key(key);
            text::write_number(out, delta);
        }
        Request::Stats { args } => {
            for arg in args {
                text::write_stat(out, "arg", String::from_utf8_lossy(arg));
                text::write_stat_u64(out, "len", arg.len() as u64);
            }
            out.extend_from_slice(text::END);
        }
        Request::Version => text::write_version(out, "1.6.41"),
        Request::Admin { name, args } => {
            let _ = args.ends_with_noreply();
            // The argument checks of slabs/lru/lru_crawler (kvproto::admin).
            let toks: Vec<&[u8]> = args.collect();
            match kvproto::admin::refusal(name, &toks) {
                Some(reply) => out.extend_from_slice(reply),
                None => out.extend_from_slice(text::OK),
            }
            let _ = kvproto::admin::extstore_command(&toks);
            // lru_crawler metadump|mgdump CLASSES: the subcommand and the class list.
            if let [sub, classes] = toks[..] {
                let _ = kvproto::admin::dump_kind(sub);
                if let kvproto::admin::CrawlerClasses::Some(mask) =
                    kvproto::admin::crawler_classes(classes)
                {
                    assert!(mask != 0 && mask & 1 == 0, "class 0 or none in {mask:#x}");
                }
            }
        }
        Request::FlushAll { .. }
        | Request::Verbosity { .. }
        | Request::CacheMemlimit { .. }
        | Request::DebugTime { .. } => out.extend_from_slice(text::OK),
        Request::ReplicaOf { master } => {
            if let Some((host, port)) = master {
                assert!(host.len() <= 255 && port > 0);
            }
            out.extend_from_slice(text::OK);
        }
        Request::ReplPull {
            replid,
            name,
            cursor,
        } => {
            assert!(replid.len() <= 64 && name.len() <= 64);
            assert!(cursor.len() <= text::MAX_REPL_CURSOR);
            out.extend_from_slice(cursor);
        }
        Request::Quit | Request::Shutdown { .. } | Request::Meta(_) => {}
    }
}
