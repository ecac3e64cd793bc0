//! Tests of the text protocol parser and composers. Expected values follow the newest
//! memcached; the rows were checked against a build of memcached's current source.

use super::*;
use proptest::prelude::*;

/// The configuration most rows use: small values so that "too large" is easy to reach.
const LIMITS: Limits = Limits {
    max_value: 100,
    flush_enabled: true,
    shutdown_enabled: true,
};

type Row = (&'static [u8], Parse<'static>);

/// A row whose request occupies the whole input.
fn r(input: &'static [u8], request: Request<'static>) -> Row {
    (input, Parse::Request(request, input.len()))
}

/// A row whose error occupies the whole input and swallows nothing.
fn e(input: &'static [u8], reply: ErrorReply, noreply: bool) -> Row {
    (input, fail(reply, noreply, input.len(), 0))
}

/// A storage command rejected after its line: the line is consumed, `swallow` bytes follow.
fn rejected(input: &'static [u8], noreply: bool, line_len: usize, swallow: usize) -> Row {
    (input, fail(BAD_FORMAT, noreply, line_len, swallow))
}

fn get(with_cas: bool, keys: &'static [u8]) -> Request<'static> {
    Request::Get {
        with_cas,
        keys: Keys::new(keys),
        rejected: false,
    }
}

fn gat(with_cas: bool, exptime: i64, keys: &'static [u8]) -> Request<'static> {
    Request::Gat {
        with_cas,
        exptime,
        keys: Keys::new(keys),
        rejected: false,
    }
}

fn store(
    mode: StoreMode,
    key: &'static [u8],
    flags: u32,
    exptime: i64,
    cas: u64,
    data: &'static [u8],
    noreply: bool,
) -> Request<'static> {
    Request::Store {
        mode,
        key,
        flags,
        exptime,
        cas,
        data,
        noreply,
    }
}

fn set(key: &'static [u8], flags: u32, exptime: i64, data: &'static [u8]) -> Request<'static> {
    store(StoreMode::Set, key, flags, exptime, 0, data, false)
}

fn arith(incr: bool, key: &'static [u8], delta: u64, noreply: bool) -> Request<'static> {
    Request::Arith {
        incr,
        key,
        delta,
        noreply,
    }
}

fn admin(name: &'static [u8], args: &'static [u8]) -> Request<'static> {
    Request::Admin {
        name,
        args: Tokens::new(args),
    }
}

fn check_with(limits: &Limits, input: &[u8], expected: &Parse<'_>) {
    let got = parse(input, limits);
    assert_eq!(&got, expected, "input {:?}", String::from_utf8_lossy(input));
}

fn check_rows(limits: &Limits, rows: &[Row]) {
    for (input, expected) in rows {
        check_with(limits, input, expected);
    }
}

#[test]
fn framing() {
    check_rows(
        &LIMITS,
        &[
            (b"", Parse::Incomplete),
            (b"get k", Parse::Incomplete),
            (b"get k\r", Parse::Incomplete),
            (b"version", Parse::Incomplete),
            // Fewer than 4 bytes with the terminator: bad format, so an empty line is too.
            e(b"\r\n", BAD_FORMAT, false),
            e(b"\n", BAD_FORMAT, false),
            e(b"a\r\n", BAD_FORMAT, false),
            e(b"ab\n", BAD_FORMAT, false),
            e(b"mn\n", BAD_FORMAT, false),
            e(b" \r\n", BAD_FORMAT, false),
            e(b"ab\r\n", ErrorReply::Error, false),
            e(b"  \r\n", ErrorReply::Error, false),
            e(b"\r\r\n", BAD_FORMAT, false),
            e(b"\r\r\r\n", ErrorReply::Error, false),
            // Command names are case-sensitive and found before the first space only.
            e(b"GET foo\r\n", ErrorReply::Error, false),
            e(b" get foo\r\n", ErrorReply::Error, false),
            e(b" version\r\n", ErrorReply::Error, false),
            e(b"getx foo\r\n", ErrorReply::Error, false),
            e(b"bget foo\r\n", ErrorReply::Error, false),
            e(b"get\tfoo\r\n", ErrorReply::Error, false),
            // Unknown commands: noreply silences ERROR; HTTP closes.
            e(b"foo noreply\r\n", ErrorReply::Error, true),
            e(b"foo noreply x\r\n", ErrorReply::Error, false),
            (b"foo bar HTTP/1.1\r\n", Parse::Close),
            (b"GET / HTTP/1.1\r\n", Parse::Close),
            (b"POST /x HTTP/1.0\n", Parse::Close),
            e(b"HTTP/1.1\r\n", ErrorReply::Error, false),
            e(b"foo HTTP\r\n", ErrorReply::Error, false),
            // Only one '\r' before the '\n' is part of the terminator.
            r(b"get a\r\r\n", get(false, b"a\r")),
            e(b"version\r\r\n", ErrorReply::Error, false),
            e(b"quit\r\r\n", ErrorReply::Error, false),
            // A '\r' elsewhere is an ordinary byte.
            r(b"get a\rb\r\n", get(false, b"a\rb")),
        ],
    );
}

#[test]
fn get_family() {
    check_rows(
        &LIMITS,
        &[
            r(b"get foo\r\n", get(false, b"foo")),
            r(b"get foo\n", get(false, b"foo")),
            r(b"gets foo\r\n", get(true, b"foo")),
            r(b"gets a b c\r\n", get(true, b"a b c")),
            r(b"get  foo   bar  \r\n", get(false, b"foo   bar  ")),
            r(b"get foo\tbar\r\n", get(false, b"foo\tbar")),
            r(b"get a noreply\r\n", get(false, b"a noreply")),
            r(b"get noreply\r\n", get(false, b"noreply")),
            r(b"get / HTTP/1.1\r\n", get(false, b"/ HTTP/1.1")),
            r(b"get \x00\x01\xff\r\n", get(false, b"\x00\x01\xff")),
            e(b"get\r\n", BAD_FORMAT, false),
            e(b"get \r\n", BAD_FORMAT, false),
            e(b"get    \r\n", BAD_FORMAT, false),
            e(b"gets\r\n", BAD_FORMAT, false),
            r(b"gat 10 k\r\n", gat(false, 10, b"k")),
            r(b"gats -1 a b\r\n", gat(true, -1, b"a b")),
            r(b"gat - k\r\n", gat(false, 0, b"k")),
            r(b"gat -0 k\r\n", gat(false, 0, b"k")),
            r(b"gat 2147483647 k\r\n", gat(false, 2147483647, b"k")),
            r(b"gat -2147483648 k\r\n", gat(false, -2147483648, b"k")),
            r(b"gat 1 noreply\r\n", gat(false, 1, b"noreply")),
            r(b"gat 00000000001 k\r\n", gat(false, 1, b"k")),
            e(b"gat 000000000001 k\r\n", INVALID_EXPTIME, false),
            e(b"gat 10\r\n", BAD_FORMAT, false),
            e(b"gat\r\n", BAD_FORMAT, false),
            e(b"gats\r\n", BAD_FORMAT, false),
            e(b"gat abc k\r\n", INVALID_EXPTIME, false),
            e(b"gat +1 k\r\n", INVALID_EXPTIME, false),
            e(b"gat 2147483648 k\r\n", INVALID_EXPTIME, false),
            e(b"gat -2147483649 k\r\n", INVALID_EXPTIME, false),
            e(b"gat 1x k\r\n", INVALID_EXPTIME, false),
            e(b"gat abc k noreply\r\n", INVALID_EXPTIME, false),
        ],
    );
}

#[test]
fn get_key_lengths() {
    let key250 = vec![b'k'; MAX_KEY_LEN];
    let key251 = vec![b'k'; MAX_KEY_LEN + 1];
    for (prefix, ok) in [
        (&b"get "[..], true),
        (b"gets a ", true),
        (b"gat 1 ", true),
        (b"gats 1 a b ", true),
    ] {
        let mut good = prefix.to_vec();
        good.extend_from_slice(&key250);
        good.extend_from_slice(b" x\r\n");
        let keys: Vec<Vec<u8>> = match parse(&good, &LIMITS) {
            Parse::Request(Request::Get { keys, .. } | Request::Gat { keys, .. }, n) => {
                assert_eq!(n, good.len());
                keys.map(<[u8]>::to_vec).collect()
            }
            other => panic!("unexpected {other:?}"),
        };
        assert!(ok);
        assert!(keys.contains(&key250));

        // A long key ends the keys there and rejects the request (after the keys before it
        // are looked up, as memcached does), noreply or not.
        for (before, expect) in [
            (&b""[..], vec![]),
            (b"a b ", vec![b"a".to_vec(), b"b".to_vec()]),
        ] {
            let mut bad = prefix.to_vec();
            bad.extend_from_slice(before);
            bad.extend_from_slice(&key251);
            bad.extend_from_slice(b" c noreply\r\n");
            match parse(&bad, &LIMITS) {
                Parse::Request(
                    Request::Get { keys, rejected, .. } | Request::Gat { keys, rejected, .. },
                    n,
                ) => {
                    assert!(rejected);
                    assert_eq!(n, bad.len());
                    let got: Vec<Vec<u8>> = keys.map(<[u8]>::to_vec).collect();
                    // The prefix's own keys ("a" of "gets a ") come first.
                    assert!(got.ends_with(&expect), "{got:?}");
                    assert!(!got.contains(&key251));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

#[test]
fn storage() {
    use StoreMode::*;
    check_rows(
        &LIMITS,
        &[
            r(b"set k 0 0 5\r\nhello\r\n", set(b"k", 0, 0, b"hello")),
            r(b"set k 0 0 5\nhello\r\n", set(b"k", 0, 0, b"hello")),
            r(b"set k 1 2 0\r\n\r\n", set(b"k", 1, 2, b"")),
            r(b"set k 0 0 4\r\na\r\nb\r\n", set(b"k", 0, 0, b"a\r\nb")),
            r(
                b"add k 7 -1 1\r\nx\r\n",
                store(Add, b"k", 7, -1, 0, b"x", false),
            ),
            r(
                b"replace k 0 0 1\r\nx\r\n",
                store(Replace, b"k", 0, 0, 0, b"x", false),
            ),
            r(
                b"append k 0 0 1\r\nx\r\n",
                store(Append, b"k", 0, 0, 0, b"x", false),
            ),
            r(
                b"prepend k 0 0 1\r\nx\r\n",
                store(Prepend, b"k", 0, 0, 0, b"x", false),
            ),
            r(
                b"cas k 0 0 1 99\r\nx\r\n",
                store(Cas, b"k", 0, 0, 99, b"x", false),
            ),
            r(
                b"cas k 0 0 1 18446744073709551615 noreply\r\nx\r\n",
                store(Cas, b"k", 0, 0, u64::MAX, b"x", true),
            ),
            r(
                b"set k 0 0 1 noreply\r\nx\r\n",
                store(Set, b"k", 0, 0, 0, b"x", true),
            ),
            r(
                b"set  k  0  0  1  noreply  \r\nx\r\n",
                store(Set, b"k", 0, 0, 0, b"x", true),
            ),
            // Extra tokens are ignored; noreply must be the last one.
            r(b"set k 0 0 1 extra\r\nx\r\n", set(b"k", 0, 0, b"x")),
            r(b"set k 0 0 1 noreply extra\r\nx\r\n", set(b"k", 0, 0, b"x")),
            r(
                b"set k 0 0 1 x noreply\r\nx\r\n",
                store(Set, b"k", 0, 0, 0, b"x", true),
            ),
            r(b"set noreply 0 0 1\r\nx\r\n", set(b"noreply", 0, 0, b"x")),
            // Flags: strtoul, then truncated to 32 bits.
            r(
                b"set k 4294967295 0 1\r\nx\r\n",
                set(b"k", u32::MAX, 0, b"x"),
            ),
            r(b"set k 4294967296 0 1\r\nx\r\n", set(b"k", 0, 0, b"x")),
            r(b"set k 4294967297 0 1\r\nx\r\n", set(b"k", 1, 0, b"x")),
            r(
                b"set k -18446744073709551615 0 1\r\nx\r\n",
                set(b"k", 1, 0, b"x"),
            ),
            r(b"set k +5 0 1\r\nx\r\n", set(b"k", 5, 0, b"x")),
            r(b"set k 007 0 1\r\nx\r\n", set(b"k", 7, 0, b"x")),
            r(b"set k -0 0 1\r\nx\r\n", set(b"k", 0, 0, b"x")),
            r(b"set k 5\x00 0 1\r\nx\r\n", set(b"k", 5, 0, b"x")),
            r(b"set k 5\x0b 0 1\r\nx\r\n", set(b"k", 5, 0, b"x")),
            r(b"set k \x0b5 0 1\r\nx\r\n", set(b"k", 5, 0, b"x")),
            r(b"set k 5\r 0 1\r\nx\r\n", set(b"k", 5, 0, b"x")),
            // strtoul skips whitespace into the next tokens.
            r(b"set k \t 3 1\r\nx\r\n", set(b"k", 3, 3, b"x")),
            // Exptime: strtol, then truncated to 32 bits.
            r(b"set k 0 4294967296 1\r\nx\r\n", set(b"k", 0, 0, b"x")),
            r(
                b"set k 0 2147483648 1\r\nx\r\n",
                set(b"k", 0, -2147483648, b"x"),
            ),
            r(
                b"set k 0 -9223372036854775808 1\r\nx\r\n",
                set(b"k", 0, 0, b"x"),
            ),
            r(b"set k 0 +30 1\r\nx\r\n", set(b"k", 0, 30, b"x")),
            r(b"set k 0 \t0 1\r\nx\r\n", set(b"k", 0, 0, b"x")),
            // Data length: the strict parser ('-' alone is 0, at most 11 bytes).
            r(b"set k 0 0 -\r\n\r\n", set(b"k", 0, 0, b"")),
            r(b"set k 0 0 -0\r\n\r\n", set(b"k", 0, 0, b"")),
            r(b"set k 0 0 00000000001\r\nx\r\n", set(b"k", 0, 0, b"x")),
            e(b"set k 0 0 000000000001\r\n", BAD_FORMAT, false),
            e(b"set k 0 0 -1\r\n", BAD_FORMAT, false),
            e(b"set k 0 0 +1\r\n", BAD_FORMAT, false),
            e(b"set k 0 0 abc\r\n", BAD_FORMAT, false),
            e(b"set k 0 0 1x\r\n", BAD_FORMAT, false),
            e(b"set k 0 0 2147483646\r\n", BAD_FORMAT, false),
            e(b"set k 0 0 2147483647\r\n", BAD_FORMAT, false),
            e(b"set k 0 0 -1 noreply\r\n", BAD_FORMAT, false),
            // Too few tokens (spaces only split tokens).
            e(b"set k 0 0\r\n", BAD_FORMAT, false),
            e(b"set\r\n", BAD_FORMAT, false),
            e(b"set k\t0 0 1\r\n", BAD_FORMAT, false),
            e(b"cas k 0 0\r\n", BAD_FORMAT, false),
            // Bad flags/exptime/CAS after a good length: error, and the data is swallowed.
            rejected(b"set k abc 0 1\r\nx\r\n", false, 15, 3),
            rejected(b"set k -1 0 1\r\n", false, 14, 3),
            rejected(b"set k - 0 1\r\n", false, 13, 3),
            rejected(b"set k 0x10 0 1\r\n", false, 16, 3),
            rejected(b"set k 18446744073709551616 0 1\r\n", false, 32, 3),
            rejected(b"set k 1.5 0 1\r\n", false, 15, 3),
            rejected(b"set k 0 abc 1\r\n", false, 15, 3),
            rejected(b"set k 0 - 1\r\n", false, 13, 3),
            rejected(b"set k 0 9223372036854775808 1\r\n", false, 31, 3),
            rejected(b"set k 0 -9223372036854775809 1\r\n", false, 32, 3),
            rejected(b"set k abc 0 1 noreply\r\n", true, 23, 3),
            rejected(b"set k abc 0 0\r\n", false, 15, 2),
            rejected(b"cas k 0 0 1\r\nx\r\n", false, 13, 3),
            rejected(b"cas k 0 0 1 abc\r\nx\r\n", false, 17, 3),
            rejected(b"cas k 0 0 1 -1\r\nx\r\n", false, 16, 3),
            rejected(b"cas k 0 0 1 +1\r\nx\r\n", false, 16, 3),
            rejected(b"cas k 0 0 1 noreply\r\nx\r\n", true, 21, 3),
            rejected(b"cas k 0 0 1 18446744073709551616\r\n", false, 34, 3),
            // Too large: only after everything else is valid.
            (
                b"set k 0 0 101\r\n",
                Parse::TooLarge {
                    mode: Set,
                    key: b"k",
                    noreply: false,
                    consumed: 15,
                    swallow: 103,
                },
            ),
            (
                b"append k 0 0 2147483645 noreply\r\n",
                Parse::TooLarge {
                    mode: Append,
                    key: b"k",
                    noreply: true,
                    consumed: 33,
                    swallow: 2147483647,
                },
            ),
            rejected(b"set k x 0 101\r\n", false, 15, 103),
            (b"set k 0 0 100\r\n", Parse::Incomplete),
            // The data block must end in exactly "\r\n"; exactly len + 2 bytes are consumed.
            (b"set k 0 0 1\r\nx\r", Parse::Incomplete),
            (b"set k 0 0 1\r\nxyz", fail(BAD_DATA_CHUNK, false, 16, 0)),
            (b"set k 0 0 1\r\nx\n\n", fail(BAD_DATA_CHUNK, false, 16, 0)),
            (b"set k 0 0 1\r\nx\rX", fail(BAD_DATA_CHUNK, false, 16, 0)),
            (b"set k 0 0 1\r\nab\r\n", fail(BAD_DATA_CHUNK, false, 16, 0)),
            (
                b"set k 0 0 1 noreply\r\nab\r\n",
                fail(BAD_DATA_CHUNK, true, 24, 0),
            ),
            (b"set k 0 0 0\r\nxy", fail(BAD_DATA_CHUNK, false, 15, 0)),
        ],
    );
}

#[test]
fn storage_key_lengths() {
    let mut ok = b"set ".to_vec();
    ok.extend_from_slice(&[b'k'; MAX_KEY_LEN]);
    ok.extend_from_slice(b" 0 0 1\r\nx\r\n");
    assert!(
        matches!(parse(&ok, &LIMITS), Parse::Request(Request::Store { key, .. }, n)
        if key.len() == MAX_KEY_LEN && n == ok.len())
    );

    let mut bad = b"set ".to_vec();
    bad.extend_from_slice(&[b'k'; MAX_KEY_LEN + 1]);
    bad.extend_from_slice(b" 0 0 1 noreply\r\nx\r\n");
    let line = bad.len() - 3;
    check_with(&LIMITS, &bad, &fail(BAD_FORMAT, true, line, 3));
}

#[test]
fn arith_touch_delete() {
    check_rows(
        &LIMITS,
        &[
            r(b"incr k 1\r\n", arith(true, b"k", 1, false)),
            r(
                b"decr k 18446744073709551615\r\n",
                arith(false, b"k", u64::MAX, false),
            ),
            r(b"incr k 1 2\r\n", arith(true, b"k", 1, false)),
            r(b"incr k 01\r\n", arith(true, b"k", 1, false)),
            r(
                b"incr k 0000000000000000000001\r\n",
                arith(true, b"k", 1, false),
            ),
            r(b"incr k 1 noreply\r\n", arith(true, b"k", 1, true)),
            e(b"incr k 00000000000000000000001\r\n", INVALID_DELTA, false),
            e(b"incr k -1\r\n", INVALID_DELTA, false),
            e(b"incr k +1\r\n", INVALID_DELTA, false),
            e(b"incr k -\r\n", INVALID_DELTA, false),
            e(b"incr k abc\r\n", INVALID_DELTA, false),
            e(b"incr k 18446744073709551616\r\n", INVALID_DELTA, false),
            e(b"incr k abc noreply\r\n", INVALID_DELTA, true),
            e(b"decr k noreply\r\n", INVALID_DELTA, true),
            e(b"incr k\r\n", BAD_FORMAT, false),
            e(b"incr noreply\r\n", BAD_FORMAT, false),
            e(b"incr\r\n", BAD_FORMAT, false),
            r(
                b"touch k 10\r\n",
                Request::Touch {
                    key: b"k",
                    exptime: 10,
                    noreply: false,
                },
            ),
            r(
                b"touch k - noreply\r\n",
                Request::Touch {
                    key: b"k",
                    exptime: 0,
                    noreply: true,
                },
            ),
            r(
                b"touch k -30 x\r\n",
                Request::Touch {
                    key: b"k",
                    exptime: -30,
                    noreply: false,
                },
            ),
            e(b"touch k +1\r\n", INVALID_EXPTIME, false),
            e(b"touch k abc\r\n", INVALID_EXPTIME, false),
            e(b"touch k 4294967296\r\n", INVALID_EXPTIME, false),
            e(b"touch k abc noreply\r\n", INVALID_EXPTIME, true),
            e(b"touch k\r\n", BAD_FORMAT, false),
            e(b"touch noreply\r\n", BAD_FORMAT, false),
            r(
                b"delete k\r\n",
                Request::Delete {
                    key: b"k",
                    noreply: false,
                },
            ),
            r(
                b"delete k 0\r\n",
                Request::Delete {
                    key: b"k",
                    noreply: false,
                },
            ),
            r(
                b"delete k 1\r\n",
                Request::Delete {
                    key: b"k",
                    noreply: false,
                },
            ),
            r(
                b"delete k a b\r\n",
                Request::Delete {
                    key: b"k",
                    noreply: false,
                },
            ),
            r(
                b"delete k noreply\r\n",
                Request::Delete {
                    key: b"k",
                    noreply: true,
                },
            ),
            r(
                b"delete k 0 noreply\r\n",
                Request::Delete {
                    key: b"k",
                    noreply: true,
                },
            ),
            r(
                b"delete noreply\r\n",
                Request::Delete {
                    key: b"noreply",
                    noreply: true,
                },
            ),
            e(b"delete\r\n", BAD_FORMAT, false),
            e(b"delete \r\n", BAD_FORMAT, false),
        ],
    );
    let long = [b'k'; MAX_KEY_LEN + 1];
    for (cmd, args, reply) in [
        (&b"incr "[..], &b" 1 noreply\r\n"[..], BAD_FORMAT),
        (b"decr ", b" 1\r\n", BAD_FORMAT),
        (b"touch ", b" 1\r\n", BAD_FORMAT),
        (b"delete ", b"\r\n", BAD_FORMAT),
        (b"delete ", b" noreply\r\n", BAD_FORMAT),
    ] {
        let input = [cmd, &long[..], args].concat();
        let noreply = args.ends_with(b"noreply\r\n");
        check_with(&LIMITS, &input, &fail(reply, noreply, input.len(), 0));
    }
}

#[test]
fn admin_commands() {
    let disabled = Limits {
        flush_enabled: false,
        shutdown_enabled: false,
        ..LIMITS
    };
    let flush = |delay, noreply| Request::FlushAll { delay, noreply };
    check_rows(
        &LIMITS,
        &[
            r(b"flush_all\r\n", flush(0, false)),
            r(b"flush_all 10\r\n", flush(10, false)),
            r(b"flush_all -1\r\n", flush(-1, false)),
            r(b"flush_all 1 2\r\n", flush(1, false)),
            r(b"flush_all noreply\r\n", flush(0, true)),
            r(b"flush_all 0 noreply\r\n", flush(0, true)),
            r(b" flush_all\r\n", flush(0, false)),
            r(b"flush_all  \r\n", flush(0, false)),
            e(b"flush_all abc\r\n", INVALID_EXPTIME, false),
            e(b"flush_all +1\r\n", INVALID_EXPTIME, false),
            e(b"flush_all noreply noreply\r\n", INVALID_EXPTIME, true),
            e(b"flush_allx\r\n", ErrorReply::Error, false),
            r(
                b"verbosity 1\r\n",
                Request::Verbosity {
                    level: 1,
                    noreply: false,
                },
            ),
            r(
                b"verbosity 1 2 3\r\n",
                Request::Verbosity {
                    level: 1,
                    noreply: false,
                },
            ),
            r(
                b"verbosity 4294967295 noreply\r\n",
                Request::Verbosity {
                    level: u32::MAX,
                    noreply: true,
                },
            ),
            e(b"verbosity\r\n", BAD_FORMAT, false),
            e(b"verbosity noreply\r\n", BAD_FORMAT, true),
            e(b"verbosity abc\r\n", BAD_FORMAT, false),
            e(b"verbosity +1\r\n", BAD_FORMAT, false),
            e(b"verbosity 4294967296\r\n", BAD_FORMAT, false),
            r(
                b"cache_memlimit 100\r\n",
                Request::CacheMemlimit {
                    megabytes: 100,
                    noreply: false,
                },
            ),
            r(
                b"cache_memlimit 7 noreply\r\n",
                Request::CacheMemlimit {
                    megabytes: 7,
                    noreply: true,
                },
            ),
            e(b"cache_memlimit\r\n", ErrorReply::Error, false),
            e(b"cache_memlimit abc\r\n", ErrorReply::Error, false),
            e(b"cache_memlimit 4294967296\r\n", ErrorReply::Error, false),
            r(b"shutdown\r\n", Request::Shutdown { graceful: false }),
            r(
                b"shutdown graceful\r\n",
                Request::Shutdown { graceful: true },
            ),
            r(b"shutdown grace\r\n", Request::Shutdown { graceful: true }),
            r(b"shutdown g\r\n", Request::Shutdown { graceful: true }),
            e(b"shutdown gracefully\r\n", INVALID_SHUTDOWN_MODE, false),
            e(b"shutdown foo\r\n", INVALID_SHUTDOWN_MODE, false),
            e(b"shutdown graceful x\r\n", INVALID_SHUTDOWN_MODE, false),
            e(b"shutdown noreply\r\n", INVALID_SHUTDOWN_MODE, true),
            r(b"version\r\n", Request::Version),
            r(b"version foo\r\n", Request::Version),
            r(b"version noreply\r\n", Request::Version),
            r(b"quit\r\n", Request::Quit),
            r(b"quit foo\r\n", Request::Quit),
            r(
                b"stats\r\n",
                Request::Stats {
                    args: Tokens::new(b""),
                },
            ),
            r(
                b"stats reset\r\n",
                Request::Stats {
                    args: Tokens::new(b" reset"),
                },
            ),
            r(
                b"stats noreply\r\n",
                Request::Stats {
                    args: Tokens::new(b" noreply"),
                },
            ),
            e(b" stats\r\n", ErrorReply::Error, false),
            r(b"watch\r\n", admin(b"watch", b"")),
            r(
                b"watch fetchers mutations\r\n",
                admin(b"watch", b" fetchers mutations"),
            ),
            r(b"slabs reassign 1 2\r\n", admin(b"slabs", b" reassign 1 2")),
            r(b" slabs automove 1\r\n", admin(b"slabs", b" automove 1")),
            r(
                b"lru_crawler crawl all\r\n",
                admin(b"lru_crawler", b" crawl all"),
            ),
            r(b"lru mode flat\r\n", admin(b"lru", b" mode flat")),
            r(
                b"extstore item_size 1\r\n",
                admin(b"extstore", b" item_size 1"),
            ),
            r(b"misbehave\r\n", admin(b"misbehave", b"")),
            r(b"debugtime 5\r\n", Request::DebugTime { seconds: 5 }),
            r(b"debugtime -5 x\r\n", Request::DebugTime { seconds: -5 }),
            e(b"debugtime\r\n", ErrorReply::Error, false),
            e(b"debugtime p\r\n", ErrorReply::Error, false),
            e(b"debugtime x noreply\r\n", ErrorReply::Error, true),
            // memcached runs refresh_certs whatever follows it.
            r(b"refresh_certs\r\n", admin(b"refresh_certs", b"")),
            r(b"refresh_certs now\r\n", admin(b"refresh_certs", b" now")),
            // Meta commands are parsed by kvproto::meta; an unknown m-command is unknown.
            e(b"mz k\r\n", ErrorReply::Error, false),
        ],
    );
    check_rows(
        &disabled,
        &[
            e(b"flush_all\r\n", FLUSH_NOT_ALLOWED, false),
            e(b"flush_all abc\r\n", FLUSH_NOT_ALLOWED, false),
            e(b"flush_all noreply\r\n", FLUSH_NOT_ALLOWED, true),
            e(b"shutdown\r\n", SHUTDOWN_NOT_ENABLED, false),
            e(b"shutdown foo\r\n", SHUTDOWN_NOT_ENABLED, false),
            e(b"shutdown noreply\r\n", SHUTDOWN_NOT_ENABLED, true),
        ],
    );
    assert!(Tokens::new(b" a noreply").ends_with_noreply());
    assert!(!Tokens::new(b" noreply a").ends_with_noreply());
    assert!(!Tokens::new(b"").ends_with_noreply());
}

/// memcached only looks at the first 23 tokens of a line.
#[test]
fn token_limit() {
    let line = |n: usize, last: &str| {
        let mut v = b"set k 0 0 1".to_vec();
        for _ in 0..n {
            v.extend_from_slice(b" a");
        }
        v.extend_from_slice(format!(" {last}\r\nx\r\n").as_bytes());
        v
    };
    // 5 + 17 + 1 = 23 tokens: noreply is seen.
    let input = line(17, "noreply");
    assert!(matches!(
        parse(&input, &LIMITS),
        Parse::Request(Request::Store { noreply: true, .. }, n) if n == input.len()
    ));
    let input = line(17, "noreply   ");
    assert!(matches!(
        parse(&input, &LIMITS),
        Parse::Request(Request::Store { noreply: true, .. }, _)
    ));
    // 24 tokens: it is not.
    let input = line(18, "noreply");
    assert!(matches!(
        parse(&input, &LIMITS),
        Parse::Request(Request::Store { noreply: false, .. }, _)
    ));

    let unknown = |n: usize, last: &str| {
        let mut v = b"foo".to_vec();
        for _ in 0..n {
            v.extend_from_slice(b" a");
        }
        v.extend_from_slice(format!(" {last}\r\n").as_bytes());
        v
    };
    assert_eq!(parse(&unknown(21, "HTTP/1.1"), &LIMITS), Parse::Close);
    let input = unknown(22, "HTTP/1.1");
    check_with(
        &LIMITS,
        &input,
        &fail(ErrorReply::Error, false, input.len(), 0),
    );
    let input = unknown(21, "noreply");
    check_with(
        &LIMITS,
        &input,
        &fail(ErrorReply::Error, true, input.len(), 0),
    );
    let input = unknown(22, "noreply");
    check_with(
        &LIMITS,
        &input,
        &fail(ErrorReply::Error, false, input.len(), 0),
    );

    // A get line's keys are all used, however many.
    let mut input = b"get".to_vec();
    for i in 0..1000 {
        input.extend_from_slice(format!(" key{i}").as_bytes());
    }
    input.extend_from_slice(b"\r\n");
    match parse(&input, &LIMITS) {
        Parse::Request(Request::Get { keys, .. }, n) => {
            assert_eq!(n, input.len());
            assert_eq!(keys.count(), 1000);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn long_lines() {
    let xs = |n| vec![b'x'; n];
    assert_eq!(parse(&xs(MAX_LINE_LEN), &LIMITS), Parse::Incomplete);
    assert_eq!(parse(&xs(MAX_LINE_LEN + 1), &LIMITS), Parse::Close);
    // With its newline in the buffer, a long line is just a line.
    let mut line = xs(3000);
    line.extend_from_slice(b"\r\n");
    check_with(
        &LIMITS,
        &line,
        &fail(ErrorReply::Error, false, line.len(), 0),
    );

    for prefix in [&b"get "[..], b"gets "] {
        let mut partial = prefix.to_vec();
        partial.extend_from_slice(&xs(3000));
        assert_eq!(parse(&partial, &LIMITS), Parse::Incomplete);
        partial.extend_from_slice(b"\r\n");
        // The key is too long, but the line was allowed: rejected, with no keys before it.
        match parse(&partial, &LIMITS) {
            Parse::Request(Request::Get { keys, rejected, .. }, n) => {
                assert!(rejected);
                assert_eq!(n, partial.len());
                assert_eq!(keys.count(), 0);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // A long multiget of short keys.
    let mut multi = b"get".to_vec();
    while multi.len() < 100_000 {
        multi.extend_from_slice(b" somekey");
    }
    assert_eq!(parse(&multi, &LIMITS), Parse::Incomplete);
    multi.extend_from_slice(b"\n");
    assert!(
        matches!(parse(&multi, &LIMITS), Parse::Request(Request::Get { .. }, n) if n == multi.len())
    );

    // Up to 100 leading spaces are allowed (the line is then an unknown command).
    let mut spaced = vec![b' '; 100];
    spaced.extend_from_slice(b"get ");
    spaced.extend_from_slice(&xs(3000));
    assert_eq!(parse(&spaced, &LIMITS), Parse::Incomplete);
    spaced.extend_from_slice(b"\r\n");
    check_with(
        &LIMITS,
        &spaced,
        &fail(ErrorReply::Error, false, spaced.len(), 0),
    );
    let mut spaced = vec![b' '; 101];
    spaced.extend_from_slice(b"get ");
    spaced.extend_from_slice(&xs(3000));
    assert_eq!(parse(&spaced, &LIMITS), Parse::Close);

    for prefix in [&b"get"[..], b"getx ", b"set ", b"GET "] {
        let mut partial = prefix.to_vec();
        partial.extend_from_slice(&xs(3000));
        assert_eq!(parse(&partial, &LIMITS), Parse::Close);
    }

    // kvcached's own bound on get lines.
    let mut huge = b"get ".to_vec();
    huge.resize(MAX_GET_LINE_LEN, b'k');
    assert_eq!(parse(&huge, &LIMITS), Parse::Incomplete);
    huge.push(b'k');
    assert_eq!(parse(&huge, &LIMITS), Parse::Close);
    let mut exact = b"get ".to_vec();
    exact.resize(MAX_GET_LINE_LEN - 1, b' ');
    exact.push(b'\n');
    check_with(&LIMITS, &exact, &fail(BAD_FORMAT, false, exact.len(), 0));
    let mut over = b"get a".to_vec();
    over.resize(MAX_GET_LINE_LEN, b' ');
    over.push(b'\n');
    assert_eq!(parse(&over, &LIMITS), Parse::Close);
}

/// memcached's tokenizer stops at 65,534 bytes: tokens after that are not seen.
#[test]
fn tokenizer_window() {
    let mut line = b"set k 0 0 1".to_vec();
    line.resize(70_000, b' ');
    line.extend_from_slice(b"noreply\r\nx\r\n");
    assert!(matches!(
        parse(&line, &LIMITS),
        Parse::Request(Request::Store { noreply: false, .. }, n) if n == line.len()
    ));
    let mut line = b"get".to_vec();
    line.resize(70_000, b' ');
    line.extend_from_slice(b"k\r\n");
    check_with(&LIMITS, &line, &fail(BAD_FORMAT, false, line.len(), 0));
}

#[test]
fn pipelining() {
    let buf = b"get a\r\nset k 0 0 1\r\nx\r\nincr k 1 noreply\r\nbogus\r\nset k x 0 2\r\nab\r\nversion\r\n";
    let mut rest = &buf[..];
    let mut seen = Vec::new();
    let mut swallow = 0;
    loop {
        if swallow > 0 {
            let n = swallow.min(rest.len());
            rest = &rest[n..];
            swallow -= n;
        }
        match parse(rest, &LIMITS) {
            Parse::Request(req, n) => {
                assert!(n > 0 && n <= rest.len());
                seen.push(format!("{req:?}"));
                rest = &rest[n..];
            }
            Parse::Error {
                reply,
                noreply,
                consumed,
                swallow: s,
            } => {
                seen.push(format!("{reply:?} {noreply}"));
                rest = &rest[consumed..];
                swallow = s;
            }
            Parse::Incomplete => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(rest.is_empty());
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(seen[0].starts_with("Get"));
    assert!(seen[1].starts_with("Store"));
    assert!(seen[2].starts_with("Arith"));
    assert_eq!(seen[3], "Error false");
    assert_eq!(seen[4], r#"Client("bad command line format") false"#);
    assert_eq!(seen[5], "Version");

    // The first of two requests: consumed covers exactly the first.
    assert_eq!(
        parse(b"get a\r\nget b\r\n", &LIMITS),
        Parse::Request(get(false, b"a"), 7)
    );
    assert_eq!(
        parse(b"set k 0 0 1\r\nx\r\nget k\r\n", &LIMITS),
        Parse::Request(set(b"k", 0, 0, b"x"), 16)
    );
    assert_eq!(
        parse(b"set k 0 0 1 noreply\r\nab\r\nget k\r\n", &LIMITS),
        fail(BAD_DATA_CHUNK, true, 24, 0)
    );
}

/// Every proper prefix of a whole request is incomplete; the whole is the request.
#[test]
fn incomplete_at_every_split() {
    let inputs: &[&[u8]] = &[
        b"get foo\r\n",
        b"gets a b c\n",
        b"gat 10 a b\r\n",
        b"set k 0 0 5\r\nhello\r\n",
        b"set k 0 0 0\r\n\r\n",
        b"cas key 1 2 3 4 noreply\r\nabc\r\n",
        b"append k 0 0 4\r\n\r\n\r\n\r\n",
        b"incr k 5\r\n",
        b"touch k 5\r\n",
        b"delete k noreply\r\n",
        b"flush_all 5\r\n",
        b"version\r\n",
        b"stats items\r\n",
        b"set k 0 0 1\r\nxyz",
    ];
    for input in inputs {
        let whole = parse(input, &LIMITS);
        match whole {
            Parse::Request(_, n) | Parse::Error { consumed: n, .. } => assert_eq!(n, input.len()),
            ref other => panic!("unexpected {other:?}"),
        }
        for split in 0..input.len() {
            assert_eq!(
                parse(&input[..split], &LIMITS),
                Parse::Incomplete,
                "{:?} at {split}",
                String::from_utf8_lossy(input)
            );
        }
    }
}

#[test]
fn number_parsers() {
    assert_eq!(tok_u32(b"0"), Some(0));
    assert_eq!(tok_u32(b"4294967295"), Some(u32::MAX));
    assert_eq!(tok_u32(b"4294967296"), None);
    assert_eq!(tok_u32(b"00000000001"), Some(1));
    assert_eq!(tok_u32(b"000000000001"), None);
    assert_eq!(tok_u32(b"+1"), None);
    assert_eq!(tok_u32(b"-0"), None);
    assert_eq!(tok_u64(b"18446744073709551615"), Some(u64::MAX));
    assert_eq!(tok_u64(b"18446744073709551616"), None);
    assert_eq!(tok_u64(b"99999999999999999999"), None);
    assert_eq!(tok_i32(b"-"), Some(0));
    assert_eq!(tok_i32(b"-2147483648"), Some(i32::MIN));
    assert_eq!(tok_i32(b"-2147483649"), None);
    assert_eq!(tok_i32(b"2147483647"), Some(i32::MAX));
    assert_eq!(tok_i32(b"--1"), None);
    assert_eq!(tok_i32(b"1-"), None);
    assert_eq!(tok_i64(b"-9223372036854775808"), Some(i64::MIN));
    assert_eq!(tok_i64(b"9223372036854775808"), None);
    assert_eq!(tok_i64(b"-9223372036854775809"), None);

    assert_eq!(c_strtoul_u32(b"5 "), Some(5));
    assert_eq!(c_strtoul_u32(b"5"), Some(5));
    assert_eq!(c_strtoul_u32(b"5x"), None);
    assert_eq!(c_strtoul_u32(b" \t+5\n"), Some(5));
    assert_eq!(c_strtoul_u32(b"-1 "), None);
    assert_eq!(c_strtoul_u32(b"-0 "), Some(0));
    assert_eq!(c_strtoul_u32(b"18446744073709551615 "), Some(u32::MAX));
    assert_eq!(c_strtoul_u32(b"18446744073709551616 "), None);
    assert_eq!(c_strtoul_u32(b"-9223372036854775808 "), None);
    assert_eq!(c_strtoul_u32(b"-9223372036854775809 "), Some(4294967295));
    assert_eq!(c_strtoul_u32(b""), None);
    assert_eq!(c_strtoul_u32(b"+"), None);
    assert_eq!(c_strtoul_u32(b"   "), None);
    assert_eq!(c_strtol_i32(b"-1\r"), Some(-1));
    assert_eq!(c_strtol_i32(b"4294967295\0"), Some(-1));
    assert_eq!(c_strtol_i32(b"9223372036854775807 "), Some(-1));
    assert_eq!(c_strtol_i32(b"9223372036854775808 "), None);
    assert_eq!(c_strtol_i32(b"-9223372036854775808 "), Some(0));
    assert_eq!(c_strtol_i32(b"99999999999999999999999 "), None);
    assert_eq!(c_strtol_i32(b"1e3 "), None);

    assert!(c_strncmp_eq(b"grace", b"graceful"));
    assert!(c_strncmp_eq(b"graceful", b"graceful"));
    assert!(c_strncmp_eq(b"graceful\0x", b"graceful"));
    assert!(!c_strncmp_eq(b"gracefulx", b"graceful"));
    assert!(!c_strncmp_eq(b"gr\0", b"graceful"));
}

#[test]
fn composers() {
    let mut out = Vec::new();
    write_value(&mut out, b"key", 5, b"hello", None);
    write_value(&mut out, b"k", u32::MAX, b"", Some(u64::MAX));
    write_value_header(&mut out, b"k", 0, 1234567890, Some(0));
    assert_eq!(
        out,
        b"VALUE key 5 5\r\nhello\r\nVALUE k 4294967295 0 18446744073709551615\r\n\r\nVALUE k 0 1234567890 0\r\n"
    );

    let mut out = Vec::new();
    write_number(&mut out, 0);
    write_number(&mut out, 10);
    write_number(&mut out, u64::MAX);
    assert_eq!(out, b"0\r\n10\r\n18446744073709551615\r\n");

    let mut out = Vec::new();
    for reply in [
        ErrorReply::Error,
        BAD_FORMAT,
        TOO_LARGE,
        SHUTDOWN_NOT_ENABLED,
        BAD_DATA_CHUNK,
        INVALID_EXPTIME,
        INVALID_DELTA,
    ] {
        write_error(&mut out, reply);
    }
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "ERROR\r\nCLIENT_ERROR bad command line format\r\nSERVER_ERROR object too large for cache\r\n\
         SERVER_ERROR: shutdown not enabled\r\nCLIENT_ERROR bad data chunk\r\n\
         CLIENT_ERROR invalid exptime argument\r\nCLIENT_ERROR invalid numeric delta argument\r\n"
    );

    let mut out = Vec::new();
    write_stat(&mut out, "pid", 42);
    write_stat(&mut out, "rusage_user", format_args!("{}.{:06}", 1, 5));
    write_stat(&mut out, "version", "1.6.41");
    write_stat_u64(&mut out, "curr_items", 7);
    write_version(&mut out, "1.6.41");
    assert_eq!(
        out,
        b"STAT pid 42\r\nSTAT rusage_user 1.000005\r\nSTAT version 1.6.41\r\nSTAT curr_items 7\r\nVERSION 1.6.41\r\n"
    );

    for fixed in [
        END, STORED, NOT_STORED, EXISTS, NOT_FOUND, DELETED, TOUCHED, OK, ERROR, RESET,
    ] {
        assert!(fixed.ends_with(b"\r\n"));
    }
}

#[test]
fn limits_defaults() {
    let limits = Limits::default();
    assert_eq!(limits.max_value, 1 << 20);
    assert!(limits.flush_enabled);
    assert!(!limits.shutdown_enabled);
    assert_eq!(Limits::new(5).max_value, 5);
}

/// Checks the invariants of one parse result against its buffer.
fn check_invariants(buf: &[u8], parsed: &Parse<'_>) {
    match *parsed {
        Parse::Request(_, n) => assert!(n > 0 && n <= buf.len()),
        Parse::Error { consumed, .. } => assert!(consumed > 0 && consumed <= buf.len()),
        Parse::TooLarge {
            consumed, swallow, ..
        } => assert!(consumed > 0 && consumed <= buf.len() && swallow >= 2),
        Parse::Incomplete | Parse::Close => {}
    }
}

/// Protocol-shaped fragments, so that random inputs reach deep into the parser.
const FRAGMENTS: &[&[u8]] = &[
    b"get ",
    b"gets ",
    b"gat ",
    b"set ",
    b"cas ",
    b"append ",
    b"incr ",
    b"touch ",
    b"delete ",
    b"flush_all ",
    b"verbosity ",
    b"shutdown ",
    b"stats ",
    b"mg ",
    b"noreply",
    b"HTTP/1.1",
    b" ",
    b"  ",
    b"\r\n",
    b"\n",
    b"\r",
    b"\t",
    b"k",
    b"0",
    b"1",
    b"5",
    b"-",
    b"+",
    b"-1",
    b"4294967296",
    b"18446744073709551616",
    b"2147483645",
    b"hello",
];

fn fragments() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(FRAGMENTS), 0..24).prop_map(|parts| parts.concat())
}

/// Feeds `buf` through the parser the way a server does, checking every step.
fn drain(buf: &[u8]) {
    let limits = LIMITS;
    let mut rest = buf;
    let mut swallow = 0usize;
    for _ in 0..=buf.len() {
        if swallow > 0 {
            let n = swallow.min(rest.len());
            rest = &rest[n..];
            swallow -= n;
        }
        let parsed = parse(rest, &limits);
        check_invariants(rest, &parsed);
        // Appending bytes never changes a decided request.
        if matches!(
            parsed,
            Parse::Request(..) | Parse::Error { .. } | Parse::TooLarge { .. }
        ) {
            let mut longer = rest.to_vec();
            longer.extend_from_slice(b"get x\r\n");
            assert_eq!(parse(&longer, &limits), parsed);
        }
        match parsed {
            Parse::Request(_, n) => rest = &rest[n..],
            Parse::Error {
                consumed,
                swallow: s,
                ..
            }
            | Parse::TooLarge {
                consumed,
                swallow: s,
                ..
            } => {
                rest = &rest[consumed..];
                swallow = s;
            }
            Parse::Incomplete | Parse::Close => return,
        }
    }
    panic!("no progress");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(buf in prop::collection::vec(any::<u8>(), 0..600)) {
        drain(&buf);
    }

    #[test]
    fn protocol_shaped_bytes(buf in fragments()) {
        drain(&buf);
    }

    /// A get's keys start where memcached's tokenizer puts the line's second token (the
    /// parser finds it without tokenizing): lines of spaces, key bytes, tabs and stray
    /// `\r`, either terminator.
    #[test]
    fn get_keys_start_at_the_second_token(
        cmd in prop::sample::select(vec!["get", "gets"]),
        body in prop::collection::vec(prop::sample::select(vec![b' ', b'k', b'\t', b'\r']), 0..40),
        crlf: bool,
    ) {
        let mut line = cmd.as_bytes().to_vec();
        line.extend_from_slice(&body);
        line.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        let toks = Toks::new(&line);
        let end = line.len() - if line.ends_with(b"\r\n") { 2 } else { 1 };
        let want = match toks.start(1) {
            Some(s) if toks.count >= 2 => Parse::Request(
                Request::Get { with_cas: cmd == "gets", keys: Keys::new(&line[s..end]), rejected: false },
                line.len(),
            ),
            _ => fail(BAD_FORMAT, false, line.len(), 0),
        };
        // A command glued to what follows ("getk") is another command: not compared.
        if body.first().is_none_or(|&b| b == b' ') {
            prop_assert_eq!(parse(&line, &LIMITS), want);
        }
    }

    #[test]
    fn keys_round_trip(keys in prop::collection::vec("[a-z0-9]{1,20}", 1..10)) {
        let line = format!("get {}\r\n", keys.join(" "));
        match parse(line.as_bytes(), &LIMITS) {
            Parse::Request(Request::Get { keys: got, .. }, n) => {
                prop_assert_eq!(n, line.len());
                let got: Vec<&[u8]> = got.collect();
                let want: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
                prop_assert_eq!(got, want);
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn storage_round_trip(
        key in "[!-~]{1,250}",
        flags: u32,
        exptime: i32,
        data in prop::collection::vec(any::<u8>(), 0..100),
        noreply: bool,
    ) {
        let mut buf = format!(
            "set {key} {flags} {exptime} {}{}\r\n",
            data.len(),
            if noreply { " noreply" } else { "" }
        )
        .into_bytes();
        buf.extend_from_slice(&data);
        buf.extend_from_slice(b"\r\n");
        let expected = Parse::Request(
            Request::Store {
                mode: StoreMode::Set,
                key: key.as_bytes(),
                flags,
                exptime: i64::from(exptime),
                cas: 0,
                data: &data,
                noreply,
            },
            buf.len(),
        );
        prop_assert_eq!(parse(&buf, &LIMITS), expected);
    }

    #[test]
    fn numbers_format(n: u64, flags: u32) {
        let mut out = Vec::new();
        write_number(&mut out, n);
        prop_assert_eq!(out, format!("{n}\r\n").into_bytes());
        let mut out = Vec::new();
        write_value_header(&mut out, b"k", flags, n as usize, Some(n));
        prop_assert_eq!(out, format!("VALUE k {flags} {} {n}\r\n", n as usize).into_bytes());
    }
}

#[test]
fn read_keys_of_a_pipelined_batch() {
    let keys = |buf: &'static [u8]| read_keys(buf).collect::<Vec<&[u8]>>();
    assert_eq!(
        keys(b"get a b\r\ngets c\r\nmg d v f\r\nget e\r\n"),
        [&b"a"[..], b"b", b"c", b"d", b"e"]
    );
    // Up to the first line that is not a read, or is unfinished.
    assert_eq!(
        keys(b"get a\r\nset b 0 0 3\r\nget x\r\nget c\r\n"),
        [&b"a"[..]]
    );
    assert_eq!(keys(b"get a\r\nget b"), [&b"a"[..]]);
    assert_eq!(keys(b"get a\nget  b \r\n"), [&b"a"[..], b"b"]);
    assert!(keys(b"").is_empty());
    assert!(keys(b"\r\n").is_empty());
    assert!(keys(b"mg\r\n").is_empty());
    // At most 64 lines.
    let many: &'static [u8] = "get k\r\n".repeat(100).leak().as_bytes();
    assert_eq!(keys(many).len(), 64);
}

#[test]
fn single_read_key_of_one_request() {
    assert_eq!(single_read_key(b"get a\r\n"), Some(&b"a"[..]));
    assert_eq!(single_read_key(b"gets key:1\n"), Some(&b"key:1"[..]));
    // Anything else, or more: none (the connection's own prefetch sees batches).
    for buf in [
        &b"get a b\r\n"[..],
        b"get a\r\nget b\r\n",
        b"get a",
        b"get a\r",
        b"get \r\n",
        b"get  a\r\n",
        b"get a \r\n",
        b"mg a v\r\n",
        b"set a 0 0 1\r\n",
        b"GET a\r\n",
        b"\n",
        b"",
    ] {
        assert_eq!(single_read_key(buf), None, "{buf:?}");
    }
    // A key as read_keys would yield it, never past the span.
    let long = [b"get ".as_slice(), &[b'k'; READ_KEYS_SPAN], b"\r\n"].concat();
    assert_eq!(single_read_key(&long), None);
}

#[test]
fn read_keys_looks_at_a_bounded_span() {
    // A long line without its end (a huge multiget still arriving) is not scanned past the
    // span, and nothing of it is yielded.
    let mut long = b"get".to_vec();
    while long.len() < 4 * READ_KEYS_SPAN {
        long.extend_from_slice(b" key");
    }
    assert_eq!(read_keys(&long).count(), 0);
    long.extend_from_slice(b"\r\n");
    assert_eq!(read_keys(&long).count(), 0, "a line ending past the span");
    // Lines inside the span still count.
    let mut batch = b"get a\r\n".to_vec();
    batch.extend_from_slice(&long);
    assert_eq!(read_keys(&batch).collect::<Vec<_>>(), [&b"a"[..]]);
}

#[test]
fn request_len_hint_sizes_storage_requests_only() {
    let limits = Limits {
        max_value: 1 << 20,
        flush_enabled: true,
        shutdown_enabled: false,
    };
    for line in [
        "set k 0 0 5\r\n",
        "add k 1 2 5 noreply\r\n",
        "cas k 0 0 5 77\r\n",
        "append k 0 0 5\n",
    ] {
        let whole = format!("{line}hello\r\n");
        // The line alone tells the length the parser takes once all of it is there.
        assert_eq!(
            request_len_hint(line.as_bytes()),
            Some(whole.len()),
            "{line:?}"
        );
        match parse(whole.as_bytes(), &limits) {
            Parse::Request(Request::Store { .. }, n) => assert_eq!(n, whole.len(), "{line:?}"),
            other => panic!("{line:?}: {other:?}"),
        }
    }
    for other in [
        "set k 0 0",
        "get k\r\n",
        "set k 0 0 -1\r\n",
        "set k 0 0 x\r\n",
        "ms k 5\r\n",
    ] {
        assert_eq!(request_len_hint(other.as_bytes()), None, "{other:?}");
    }
}
