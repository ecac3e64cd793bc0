//! Feeds arbitrary bytes to the parser the way the server does (parse, reply, consume,
//! swallow, repeat), composing a meta reply for every meta request, and checks the meta
//! parser's promises: it never panics, `consumed` is within the buffer and never 0, a meta
//! request's pieces obey memcached's limits (key, opaque, token count, data size), base64 keys
//! decode, meta errors are never silenced, and parsing is deterministic.
#![no_main]

use kvproto::meta::{self, MetaReply, MetaRequest, ReturnFlag};
use kvproto::text::{self, Limits, Parse, Request};
use kvproto::MAX_KEY_LEN;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // The first byte picks the largest data block; the rest is what a client sent.
    let (config, stream) = match input.split_first() {
        Some((&c, rest)) => (c, rest),
        None => (0, input),
    };
    let limits = Limits::new(match config & 3 {
        0 => 0,
        1 => 16,
        2 => 1024,
        _ => 1 << 20,
    });
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
        // A meta command word: `m` + one of `gsdnae`, then a space or the line's end.
        let is_meta = rest.first() == Some(&b'm')
            && rest.get(1).is_some_and(|b| b"gsdnae".contains(b))
            && (rest.get(2) == Some(&b' ')
                || rest[2..].starts_with(b"\r\n")
                || rest[2..].starts_with(b"\n"));
        match parsed {
            Parse::Request(request, n) => {
                assert!(n > 0 && n <= rest.len(), "bad request length {n}");
                if let Request::Meta(request) = request {
                    assert!(is_meta, "a meta request from a line not starting with m");
                    reply(&mut out, &request, &rest[..n], &limits);
                }
                rest = &rest[n..];
            }
            Parse::Error {
                reply,
                noreply,
                consumed,
                swallow: s,
            } => {
                assert!(consumed > 0 && consumed <= rest.len(), "bad error length");
                assert!(!(is_meta && noreply), "a meta error was silenced");
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
                assert!(
                    !key.is_empty() && key.len() <= MAX_KEY_LEN,
                    "bad key length"
                );
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

/// Checks a meta request and composes a plausible reply with every composer.
fn reply(out: &mut Vec<u8>, request: &MetaRequest<'_>, bytes: &[u8], limits: &Limits) {
    let mut buf = [0u8; MAX_KEY_LEN];
    let key = request.key().map(|k| {
        let raw = k.raw();
        assert!(
            !raw.is_empty() && raw.len() <= MAX_KEY_LEN,
            "bad key length"
        );
        assert!(
            !raw.contains(&b' ') && !raw.contains(&b'\n'),
            "bad key bytes"
        );
        (k.bytes(&mut buf).to_vec(), k.is_base64())
    });
    if let Some((decoded, _)) = &key {
        assert!(!decoded.is_empty(), "a key that does not decode");
    }
    let Some(args) = request.args() else {
        match request {
            MetaRequest::Noop => out.extend_from_slice(meta::MN),
            _ => {
                let (decoded, binary) = key.unwrap_or_default();
                let info = meta::DebugInfo {
                    exp: -1,
                    la: 0,
                    cas: 1,
                    fetched: false,
                    cls: 1,
                    size: decoded.len() as u64,
                };
                meta::write_debug(out, &decoded, binary, &info);
            }
        }
        return;
    };
    let (decoded, binary) = key.unwrap_or_default();
    let data: &[u8] = match request {
        MetaRequest::Set { data, .. } => {
            assert!(data.len() <= limits.max_value, "data over the limit");
            assert!(bytes.ends_with(b"\r\n"), "data block without its \\r\\n");
            data
        }
        _ => b"",
    };
    let mut line = if args.value() {
        MetaReply::va(out, data.len())
    } else {
        MetaReply::hd(out)
    };
    let mut count = 0;
    for flag in args.return_flags() {
        count += 1;
        line = match flag {
            ReturnFlag::Opaque(o) => {
                assert!(o.len() < meta::MAX_OPAQUE_TOKEN_LEN, "opaque too long");
                assert_eq!(args.opaque(), Some(o));
                line.opaque(o)
            }
            ReturnFlag::Key => line.key(&decoded, binary),
            ReturnFlag::Ttl => line.int(b't', args.ttl().unwrap_or(-1)),
            ReturnFlag::Cas => line.num(b'c', args.compare_cas().unwrap_or(0)),
            ReturnFlag::ClientFlags => line.num(b'f', u64::from(args.client_flags().unwrap_or(0))),
            ReturnFlag::Size => line.num(b's', data.len() as u64),
            ReturnFlag::Hit => line.num(b'h', 0),
            ReturnFlag::LastAccess => line.num(b'l', 0),
        };
    }
    assert!(count <= meta::MAX_META_TOKENS, "too many flags");
    if args.value() {
        line.flag(b'W').finish_value(data);
    } else {
        line.finish();
    }
}
