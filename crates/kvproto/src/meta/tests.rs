//! Tests of the meta protocol parser and composers. Expected values follow the newest memcached;
//! the rows were checked against a build of its current source (and, where they differ, against
//! Debian's 1.6.18, which is noted on the row).
//!
//! Where 1.6.18 differs from the newest memcached (the newest is followed):
//!
//! - at most 19 tokens per line instead of 20, and `md`/`ma` spell the error
//!   `CLIENT_ERROR options flags too long`;
//! - each command accepts only its own flags (`mg foo x` is `CLIENT_ERROR invalid flag`);
//! - a flag token starting with a byte outside `0-9A-z` is `CLIENT_ERROR invalid flag` (a byte
//!   over 127: `duplicate flag`), not `bad command line format`;
//! - `M` tokens must be exactly two bytes: `CLIENT_ERROR incorrect length for M token`, also
//!   from `mg`;
//! - numbers go through `strtol`/`strtoull`: `T+5`, `T99999999999` (wrapped), `F4294967296`
//!   accepted, `T-` refused;
//! - `md` reports every flag error as `CLIENT_ERROR invalid or duplicate flag`, `ma` a key too
//!   long as `bad command line format`;
//! - `ms` with a key over 250 bytes does not swallow its data block;
//! - `ma ... N0 J42 v q`: 1.6.18 sends the `VA` reply of a created item, the newest does not;
//! - `me <key> b` decodes the key; the newest only decodes with a fourth token
//!   (`me <key> b x`); `mn q` is silent in 1.6.18;
//! - `ms ... MA s`/`MP s`/`MR s`: 1.6.18 leaves out `s`; the newest writes the new size;
//! - an over-long opaque is noticed before the `ms` data-size check (the newest: after).

use super::*;
use crate::text::{parse as text_parse, write_error, Limits, Parse, Request};
use proptest::prelude::*;

const LIMITS: Limits = Limits {
    max_value: 100,
    flush_enabled: true,
    shutdown_enabled: false,
};

/// What a row expects: a request (rendered by [`render`]) occupying the whole input, or an
/// exact parse result.
enum Want {
    Req(&'static str),
    Exact(Parse<'static>),
}

type Row = (&'static [u8], Want);

fn ok(input: &'static [u8], rendered: &'static str) -> Row {
    (input, Want::Req(rendered))
}

/// An error that consumes the whole input and swallows nothing.
fn err(input: &'static [u8], reply: ErrorReply) -> Row {
    (input, Want::Exact(fail(reply, false, input.len(), 0)))
}

/// An error that consumes `consumed` bytes and swallows `swallow` more.
fn err_at(input: &'static [u8], reply: ErrorReply, consumed: usize, swallow: usize) -> Row {
    (input, Want::Exact(fail(reply, false, consumed, swallow)))
}

/// An error that consumes the first line and swallows `swallow` more bytes.
fn err_line(input: &'static [u8], reply: ErrorReply, swallow: usize) -> Row {
    let line = input.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    err_at(input, reply, line, swallow)
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn render_key(key: &MetaKey<'_>) -> String {
    if key.is_base64() {
        let mut buf = [0u8; MAX_KEY_LEN];
        format!("{}(b64 {})", lossy(key.raw()), lossy(key.bytes(&mut buf)))
    } else {
        lossy(key.raw())
    }
}

/// `<key> <flag><value>*` with the flags in byte order.
fn render_args(a: &MetaArgs<'_>) -> String {
    let mut s = render_key(&a.key());
    for f in a.flags().iter() {
        s.push(' ');
        s.push(char::from(f));
        let value = match f {
            b'O' => a.opaque().map(lossy),
            b'T' => a.ttl().map(|v| v.to_string()),
            b'N' => a.vivify().map(|v| v.to_string()),
            b'R' => a.recache().map(|v| v.to_string()),
            b'F' => a.client_flags().map(|v| v.to_string()),
            b'C' => a.compare_cas().map(|v| v.to_string()),
            b'E' => a.new_cas().map(|v| v.to_string()),
            b'J' => a.initial().map(|v| v.to_string()),
            b'D' => a.delta().map(|v| v.to_string()),
            _ => None,
        };
        if let Some(v) = value {
            s.push_str(&v);
        }
    }
    s
}

fn render(req: &MetaRequest<'_>) -> String {
    match req {
        MetaRequest::Get(a) => format!("mg {}", render_args(a)),
        MetaRequest::Delete(a) => format!("md {}", render_args(a)),
        MetaRequest::Set { args, mode, data } => {
            format!("ms {} {mode:?} data={:?}", render_args(args), lossy(data))
        }
        MetaRequest::Arith { args, mode } => format!("ma {} {mode:?}", render_args(args)),
        MetaRequest::Noop => "mn".to_string(),
        MetaRequest::Debug { key } => format!("me {}", render_key(key)),
    }
}

fn check_rows_with(limits: &Limits, rows: &[Row]) {
    for (input, want) in rows {
        let got = text_parse(input, limits);
        let shown = lossy(input);
        match want {
            Want::Req(rendered) => match got {
                Parse::Request(Request::Meta(req), n) => {
                    assert_eq!(render(&req), *rendered, "input {shown:?}");
                    assert_eq!(n, input.len(), "consumed, input {shown:?}");
                }
                other => panic!("input {shown:?}: expected {rendered:?}, got {other:?}"),
            },
            Want::Exact(expected) => assert_eq!(&got, expected, "input {shown:?}"),
        }
    }
}

fn check_rows(rows: &[Row]) {
    check_rows_with(&LIMITS, rows);
}

#[test]
fn commands() {
    check_rows(&[
        ok(b"mg foo\r\n", "mg foo"),
        ok(b"mg foo v\r\n", "mg foo v"),
        ok(b"mg foo v\n", "mg foo v"),
        ok(b"mg  foo   v  k \r\n", "mg foo k v"),
        ok(b"md foo\r\n", "md foo"),
        ok(b"md foo q k\r\n", "md foo k q"),
        ok(b"ma foo\r\n", "ma foo Incr"),
        ok(b"ma foo v D5\r\n", "ma foo D5 v Incr"),
        ok(b"ms foo 2\r\nab\r\n", "ms foo Set data=\"ab\""),
        ok(b"ms foo 0\r\n\r\n", "ms foo Set data=\"\""),
        ok(b"ms foo 0 k\n\r\n", "ms foo k Set data=\"\""),
        ok(b"ms foo 02 T5\r\nab\r\n", "ms foo T5 Set data=\"ab\""),
        ok(b"ms foo -\r\n\r\n", "ms foo Set data=\"\""),
        ok(b"ms foo 4\r\na\r\nb\r\n", "ms foo Set data=\"a\\r\\nb\""),
        ok(b"mn\r\n", "mn"),
        ok(b"mn foo bar !\r\n", "mn"),
        ok(b"mn q\r\n", "mn"),
        ok(b"me foo\r\n", "me foo"),
        ok(b"me foo zz yy\r\n", "me foo"),
        // The key is any bytes but a space.
        ok(b"mg f\x80\to k\r\n", "mg f\u{fffd}\to k"),
        // Too short or no key.
        err(b"mg\r\n", BAD_FORMAT),
        err(b"mg \r\n", BAD_FORMAT),
        err(b"md  \r\n", BAD_FORMAT),
        err(b"ma\r\n", BAD_FORMAT),
        err(b"me\r\n", BAD_FORMAT),
        err(b"me \r\n", BAD_FORMAT),
        err(b"ms foo\r\n", BAD_FORMAT),
        err(b"ms\r\n", BAD_FORMAT),
        // mn without \r is shorter than any command.
        err(b"mn\n", BAD_FORMAT),
        // Other two-letter m-commands, longer ones and other cases are unknown.
        err(b"mx foo\r\n", ErrorReply::Error),
        err(b"mgx foo\r\n", ErrorReply::Error),
        err(b"MG foo\r\n", ErrorReply::Error),
        err(b" mg foo\r\n", ErrorReply::Error),
        (b"mg foo v", Want::Exact(Parse::Incomplete)),
        (b"mn\r", Want::Exact(Parse::Incomplete)),
    ]);
}

#[test]
fn every_flag() {
    check_rows(&[
        ok(b"mg Zm9v b\r\n", "mg Zm9v(b64 foo) b"),
        ok(b"mg k c\r\n", "mg k c"),
        ok(b"mg k f\r\n", "mg k f"),
        ok(b"mg k h\r\n", "mg k h"),
        ok(b"mg k k\r\n", "mg k k"),
        ok(b"mg k l\r\n", "mg k l"),
        ok(b"mg k q\r\n", "mg k q"),
        ok(b"mg k s\r\n", "mg k s"),
        ok(b"mg k t\r\n", "mg k t"),
        ok(b"mg k u\r\n", "mg k u"),
        ok(b"mg k v\r\n", "mg k v"),
        ok(b"mg k x\r\n", "mg k x"),
        ok(b"mg k I\r\n", "mg k I"),
        ok(b"mg k Oabc\r\n", "mg k Oabc"),
        ok(b"mg k O\r\n", "mg k O"),
        ok(b"mg k P\r\n", "mg k P"),
        ok(b"mg k Pfoo/bar\r\n", "mg k P"),
        ok(b"mg k Lpath/\r\n", "mg k L"),
        ok(b"mg k T30\r\n", "mg k T30"),
        ok(b"mg k T-1\r\n", "mg k T-1"),
        ok(b"mg k T-\r\n", "mg k T0"),
        ok(b"mg k T-2147483648\r\n", "mg k T-2147483648"),
        ok(b"mg k T2147483647\r\n", "mg k T2147483647"),
        ok(b"mg k N30\r\n", "mg k N30"),
        ok(b"mg k R30\r\n", "mg k R30"),
        ok(b"mg k F33\r\n", "mg k F33"),
        ok(b"mg k F4294967295\r\n", "mg k F4294967295"),
        ok(b"mg k C999\r\n", "mg k C999"),
        ok(
            b"mg k C18446744073709551615\r\n",
            "mg k C18446744073709551615",
        ),
        ok(b"mg k E5\r\n", "mg k E5"),
        ok(b"mg k J0\r\n", "mg k J0"),
        ok(b"mg k D1\r\n", "mg k D1"),
        // mg and md ignore the mode, whatever it is.
        ok(b"mg k M\r\n", "mg k M"),
        ok(b"mg k Mxyz\r\n", "mg k M"),
        ok(b"md k MS\r\n", "md k M"),
        // Only a flag's first byte counts.
        ok(b"mg k vabc kk\r\n", "mg k k v"),
        // Every flag on every command (each ignores what it has no use for).
        ok(
            b"ms Zm9v 1 b c f h k l q s t u v x I\r\n5\r\n",
            "ms Zm9v(b64 foo) I b c f h k l q s t u v x Set data=\"5\"",
        ),
        ok(
            b"md k T1 N2 R3 F4 C5 E6 J7 D8 Ox\r\n",
            "md k C5 D8 E6 F4 J7 N2 Ox R3 T1",
        ),
        ok(
            b"ma k s f h l u x I P L v\r\n",
            "ma k I L P f h l s u v x Incr",
        ),
    ]);
}

#[test]
fn flag_errors() {
    check_rows(&[
        // Unknown flags, including digits and the bytes between Z and a.
        err(b"mg k z\r\n", INVALID_FLAG),
        err(b"mg k A\r\n", INVALID_FLAG),
        err(b"mg k Y\r\n", INVALID_FLAG),
        err(b"mg k 5\r\n", INVALID_FLAG),
        err(b"mg k [\r\n", INVALID_FLAG),
        // No `S` flag; `W`, `X`, `Z` are reply flags only; `K` is no flag either.
        err(b"mg k S100\r\n", INVALID_FLAG),
        err_line(b"ms k 2 S100\r\nxx\r\n", INVALID_FLAG, 4),
        err(b"mg k W\r\n", INVALID_FLAG),
        err(b"mg k X\r\n", INVALID_FLAG),
        err(b"mg k Z\r\n", INVALID_FLAG),
        err(b"mg k Kabc\r\n", INVALID_FLAG),
        err(b"mg k `\r\n", INVALID_FLAG),
        // A flag token must start with 0-9 or A..=z, else the line is bad.
        err(b"mg k !\r\n", BAD_FORMAT),
        err(b"mg k -\r\n", BAD_FORMAT),
        err(b"mg k @\r\n", BAD_FORMAT),
        err(b"mg k {\r\n", BAD_FORMAT),
        err(b"mg k \x80\r\n", BAD_FORMAT),
        err(b"mg k \tv\r\n", BAD_FORMAT),
        err(b"md k v !\r\n", BAD_FORMAT),
        err(b"ma k !\r\n", BAD_FORMAT),
        err(b"me k !\r\n", BAD_FORMAT),
        // ...checked before anything else, even the key length.
        (
            [b"mg ".as_slice(), &[b'k'; 251], b" !\r\n"].concat().leak(),
            Want::Exact(fail(BAD_FORMAT, false, 258, 0)),
        ),
        // Duplicates, by first byte.
        err(b"mg k v v\r\n", DUPLICATE_FLAG),
        err(b"mg k T5 T6\r\n", DUPLICATE_FLAG),
        err(b"mg k F1 Fx\r\n", DUPLICATE_FLAG),
        err(b"mg k Oa Ob\r\n", DUPLICATE_FLAG),
        err(b"mg k b b\r\n", DUPLICATE_FLAG),
        // Bad arguments.
        err(b"mg k T\r\n", BAD_TOKEN),
        err(b"mg k Tx\r\n", BAD_TOKEN),
        err(b"mg k T+5\r\n", BAD_TOKEN),
        err(b"mg k T2147483648\r\n", BAD_TOKEN),
        err(b"mg k T-2147483649\r\n", BAD_TOKEN),
        err(b"mg k T99999999999\r\n", BAD_TOKEN),
        err(b"mg k N\r\n", BAD_TOKEN),
        err(b"mg k Nx\r\n", BAD_TOKEN),
        err(b"mg k R\r\n", BAD_TOKEN),
        err(b"mg k R1.5\r\n", BAD_TOKEN),
        err(b"mg k C\r\n", BAD_TOKEN),
        err(b"mg k Cx\r\n", BAD_TOKEN),
        err(b"mg k C-1\r\n", BAD_TOKEN),
        err(b"mg k C+5\r\n", BAD_TOKEN),
        err(b"mg k C18446744073709551616\r\n", BAD_TOKEN),
        err(b"mg k E\r\n", BAD_TOKEN),
        err(b"mg k Ex\r\n", BAD_TOKEN),
        err(b"mg k J\r\n", INVALID_INITIAL),
        err(b"mg k Jx\r\n", INVALID_INITIAL),
        err(b"mg k D\r\n", INVALID_DELTA),
        err(b"mg k D-1\r\n", INVALID_DELTA),
        // F has no message of its own.
        err(b"mg k F\r\n", BAD_FORMAT),
        err(b"mg k Fx\r\n", BAD_FORMAT),
        err(b"mg k F4294967296\r\n", BAD_FORMAT),
        err(b"mg k F-1\r\n", BAD_FORMAT),
        // A bad argument does not stop the scan: the last message wins...
        err(b"mg k Nabc Jx\r\n", INVALID_INITIAL),
        err(b"mg k Jx Nabc\r\n", BAD_TOKEN),
        err(b"mg k Fx Tx\r\n", BAD_TOKEN),
        err(b"mg k Tx Fx\r\n", BAD_TOKEN),
        err(b"mg k Dx Fx v\r\n", INVALID_DELTA),
        // ...but an unknown or duplicate flag ends it at once.
        err(b"mg k Fx z\r\n", INVALID_FLAG),
        err(b"mg k Tx z Jx\r\n", INVALID_FLAG),
        err(b"mg k z Tx\r\n", INVALID_FLAG),
        err(b"mg k Tx v v\r\n", DUPLICATE_FLAG),
        err(b"mg k Tabc Tx\r\n", DUPLICATE_FLAG),
        // md reports as mg does.
        err(b"md k z\r\n", INVALID_FLAG),
        err(b"md k v v\r\n", DUPLICATE_FLAG),
        err(b"md k Tx\r\n", BAD_TOKEN),
        err(b"md k Fx\r\n", BAD_FORMAT),
    ]);
}

#[test]
fn token_limit() {
    check_rows(&[
        // 20 tokens: fine.
        ok(
            b"mg foo k s t c f h l u v O1 P L q x I T1 N1 R1\r\n",
            "mg foo I L N1 O1 P R1 T1 c f h k l q s t u v x",
        ),
        err(
            b"mg foo a b c d e f g h i j k l m n o p q r\r\n",
            INVALID_FLAG,
        ),
        // 21 and more: too long, before any flag is looked at.
        err(
            b"mg foo k s t c f h l u v O1 P L q x I T1 N1 R1 C1\r\n",
            TOO_MANY_TOKENS,
        ),
        err(
            b"mg foo k k k k k k k k k k k k k k k k k k k\r\n",
            TOO_MANY_TOKENS,
        ),
        err(
            b"md n Mx D5 J5 N5 R5 E5 C5 T5 F5 v s t c f h l u x I P L\r\n",
            TOO_MANY_TOKENS,
        ),
        // Past 23 tokens nothing is looked at, not even the first byte.
        err(
            b"mg foo k s t c f h l u v O1 P L q x I T1 N1 R1 C1 E1 F1 J1 D1 !\r\n",
            TOO_MANY_TOKENS,
        ),
        // ms counts its data length.
        ok(
            b"ms foo 1 k s t c f h l u v O1 P L q x I T1 N1\r\n5\r\n",
            "ms foo I L N1 O1 P T1 c f h k l q s t u v x Set data=\"5\"",
        ),
        err_line(
            b"ms foo 1 k s t c f h l u v O1 P L q x I T1 N1 R1\r\n5\r\n",
            TOO_MANY_TOKENS,
            3,
        ),
        // me and mn have no limit.
        ok(
            b"me foo a b c d e f g h i j k l m n o p q r s t u v w x y z\r\n",
            "me foo",
        ),
    ]);
}

#[test]
fn key_length() {
    let k250 = [b'k'; 250];
    let k251 = [b'k'; 251];
    let line = |cmd: &str, key: &[u8], rest: &str| -> &'static [u8] {
        [cmd.as_bytes(), b" ", key, rest.as_bytes()].concat().leak()
    };
    check_rows(&[
        (
            line("mg", &k250, " v\r\n"),
            Want::Req(leak_render("mg", &k250, " v")),
        ),
        err(line("mg", &k251, " v\r\n"), BAD_FORMAT),
        err(line("mg", &k251, "\r\n"), BAD_FORMAT),
        err(line("md", &k251, "\r\n"), BAD_FORMAT),
        err(line("me", &k251, "\r\n"), BAD_FORMAT),
        // ma reports every flag-parsing error its own way.
        err(line("ma", &k251, " v\r\n"), INVALID_OR_DUPLICATE_FLAG),
        // The key is checked before the token count.
        err(
            line("mg", &k251, " a b c d e f g h i j k l m n o p q r s\r\n"),
            BAD_FORMAT,
        ),
        // ms swallows its data block.
        err_line(line("ms", &k251, " 2\r\nab\r\n"), BAD_FORMAT, 4),
        (
            line("ms", &k250, " 2\r\nab\r\n"),
            Want::Req(leak_render("ms", &k250, " Set data=\"ab\"")),
        ),
    ]);
}

fn leak_render(cmd: &str, key: &[u8], rest: &str) -> &'static str {
    format!("{cmd} {}{rest}", lossy(key)).leak()
}

#[test]
fn opaque() {
    let o31 = "O0123456789012345678901234567890";
    let o32 = "O01234567890123456789012345678901";
    let line = |s: String| -> &'static [u8] { s.into_bytes().leak() };
    check_rows(&[
        (
            line(format!("mg k {o31}\r\n")),
            Want::Req(format!("mg k {o31}").leak()),
        ),
        err(line(format!("mg k {o32}\r\n")), OPAQUE_TOO_LONG),
        err(line(format!("md k {o32}\r\n")), OPAQUE_TOO_LONG),
        err(line(format!("ma k {o32} v\r\n")), OPAQUE_TOO_LONG),
        err_line(
            line(format!("ms k 2 {o32} q\r\nxx\r\n")),
            OPAQUE_TOO_LONG,
            4,
        ),
        // Flag errors and modes come first.
        err(line(format!("mg k {o32} Tx\r\n")), BAD_TOKEN),
        err(line(format!("ma k {o32} Mx\r\n")), INVALID_ARITH_MODE),
        err_line(
            line(format!("ms k 2 MX {o32}\r\nxx\r\n")),
            INVALID_SET_MODE,
            4,
        ),
        err_line(
            line(format!("ms k 2 {o32} MX\r\nxx\r\n")),
            INVALID_SET_MODE,
            4,
        ),
        // The opaque is checked as the line arrives, not after the data.
        err_line(line(format!("ms k 5 {o32}\r\n")), OPAQUE_TOO_LONG, 7),
    ]);
}

#[test]
fn base64_keys() {
    check_rows(&[
        ok(b"mg Zm9v b k\r\n", "mg Zm9v(b64 foo) b k"),
        ok(b"mg Zm9v bx\r\n", "mg Zm9v(b64 foo) b"),
        ok(b"mg Zm9v k b\r\n", "mg Zm9v(b64 foo) b k"),
        // Bytes outside the alphabet are skipped; decoding stops after a padded group.
        ok(b"mg Z!m9v b\r\n", "mg Z!m9v(b64 foo) b"),
        ok(b"mg AA== b\r\n", "mg AA==(b64 \0) b"),
        ok(b"mg Zm9vYg==Zm9v b\r\n", "mg Zm9vYg==Zm9v(b64 foob) b"),
        err(b"mg Zm9v== b k\r\n", KEY_NOT_BASE64),
        err(b"mg Zm9 b\r\n", KEY_NOT_BASE64),
        err(b"mg ==== b\r\n", KEY_NOT_BASE64),
        err(b"mg A=== b\r\n", KEY_NOT_BASE64),
        err(b"mg @@@@ b\r\n", KEY_NOT_BASE64),
        err(b"md Zm9 b\r\n", KEY_NOT_BASE64),
        err(b"ma Zm9 b\r\n", INVALID_OR_DUPLICATE_FLAG),
        err_at(b"ms foo 2 b\r\nxx\r\n", KEY_NOT_BASE64, 12, 4),
        // Later argument errors replace the message; unknown flags end the scan.
        err(b"mg Zm9 b Tx\r\n", BAD_TOKEN),
        err(b"mg Zm9 b z\r\n", INVALID_FLAG),
        ok(
            b"ms Zm9v 2 b k O1 c\r\nab\r\n",
            "ms Zm9v(b64 foo) O1 b c k Set data=\"ab\"",
        ),
        // me: only `me <key> b <more>` decodes (the newest memcached's token count).
        ok(b"me Zm9v b\r\n", "me Zm9v"),
        ok(b"me Zm9v b x\r\n", "me Zm9v(b64 foo)"),
        ok(b"me Zm9v bb x\r\n", "me Zm9v"),
        ok(b"me foo b\r\n", "me foo"),
        err(b"me Zm9 b x\r\n", BAD_FORMAT),
    ]);
}

#[test]
fn base64_codec() {
    let decode = |s: &[u8]| {
        let mut buf = [0u8; MAX_KEY_LEN];
        decode_base64(s, &mut buf).map(|n| buf[..n].to_vec())
    };
    let rows: &[(&[u8], Option<&[u8]>)] = &[
        (b"", None),
        (b"Zg==", Some(b"f")),
        (b"Zm8=", Some(b"fo")),
        (b"Zm9v", Some(b"foo")),
        (b"Zm9vYmFy", Some(b"foobar")),
        (b"Zm9\nv", Some(b"foo")),
        (b"A=BC", Some(b"\0\0")),
        (b"=AAA", Some(b"\0\0")),
        (b"AA==AAAA", Some(b"\0")),
        (b"Zm9", None),
        (b"Zm9v=", None),
        (b"A===", None),
        (b"====", None),
        (b"!!!!", None),
        (b"+/+/", Some(&[0xfb, 0xff, 0xbf])),
    ];
    for (input, want) in rows {
        assert_eq!(decode(input).as_deref(), *want, "decode {:?}", lossy(input));
    }
    // The output must fit.
    assert_eq!(decode_base64(b"Zm9v", &mut [0u8; 2]), None);
    assert_eq!(decode_base64(b"Zm9v", &mut [0u8; 3]), Some(3));
    let encode = |s: &[u8]| {
        let mut out = Vec::new();
        encode_base64(&mut out, s);
        out
    };
    assert_eq!(encode(b""), b"");
    assert_eq!(encode(b"f"), b"Zg==");
    assert_eq!(encode(b"fo"), b"Zm8=");
    assert_eq!(encode(b"foo"), b"Zm9v");
    assert_eq!(encode(b"foob"), b"Zm9vYg==");
    assert_eq!(encode(&[0xfb, 0xff, 0xbf]), b"+/+/");
    // It appends to what the reply already holds.
    let mut out = b"VA 3 k".to_vec();
    encode_base64(&mut out, b"fo");
    assert_eq!(out, b"VA 3 kZm8=");
    // Round trips, including the longest key that decodes from 250 bytes.
    for len in 0..=187usize {
        let key: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
        let encoded = encode(&key);
        if len > 0 {
            assert_eq!(decode(&encoded).as_deref(), Some(key.as_slice()));
        }
    }
    // MetaKey::bytes.
    let mut buf = [0u8; MAX_KEY_LEN];
    assert_eq!(MetaKey::plain(b"Zm9v").bytes(&mut buf), b"Zm9v");
    let key = MetaKey::base64(b"Zm9v").unwrap();
    assert_eq!(key.bytes(&mut buf), b"foo");
    assert_eq!(MetaKey::base64(b"Zm9"), None);
}

#[test]
fn arith_modes_and_errors() {
    check_rows(&[
        ok(b"ma k MI\r\n", "ma k M Incr"),
        ok(b"ma k M+\r\n", "ma k M Incr"),
        ok(b"ma k MD\r\n", "ma k M Decr"),
        ok(b"ma k M-\r\n", "ma k M Decr"),
        ok(b"ma k MDx v\r\n", "ma k M v Decr"),
        ok(
            b"ma k N0 J42 D7 v t c k Oxy\r\n",
            "ma k D7 J42 N0 Oxy c k t v Incr",
        ),
        err(b"ma k Mx\r\n", INVALID_ARITH_MODE),
        err(b"ma k Md\r\n", INVALID_ARITH_MODE),
        err(b"ma k M v\r\n", INVALID_ARITH_MODE),
        err(b"ma k M\r\n", INVALID_ARITH_MODE),
        err(b"ma k M\n", INVALID_ARITH_MODE),
        // Every flag error is the same message for ma, and comes before the mode.
        err(b"ma k z\r\n", INVALID_OR_DUPLICATE_FLAG),
        err(b"ma k v v\r\n", INVALID_OR_DUPLICATE_FLAG),
        err(b"ma k Dx\r\n", INVALID_OR_DUPLICATE_FLAG),
        err(b"ma k Jx\r\n", INVALID_OR_DUPLICATE_FLAG),
        err(b"ma k Tx Mx\r\n", INVALID_OR_DUPLICATE_FLAG),
        err(
            b"ma k k k k k k k k k k k k k k k k k k k k\r\n",
            INVALID_OR_DUPLICATE_FLAG,
        ),
        // ...but a bad flag start is still the tokenizer's.
        err(b"ma k !\r\n", BAD_FORMAT),
    ]);
}

#[test]
fn set_modes_and_errors() {
    check_rows(&[
        ok(b"ms k 2 MS\r\nab\r\n", "ms k M Set data=\"ab\""),
        ok(b"ms k 2 MSabc\r\nab\r\n", "ms k M Set data=\"ab\""),
        ok(b"ms k 2 ME\r\nab\r\n", "ms k M Add data=\"ab\""),
        ok(b"ms k 2 MR\r\nab\r\n", "ms k M Replace data=\"ab\""),
        ok(b"ms k 2 MA N30\r\nab\r\n", "ms k M N30 Append data=\"ab\""),
        ok(b"ms k 2 MP\r\nab\r\n", "ms k M Prepend data=\"ab\""),
        ok(
            b"ms k 2 I C5 F9 T-1 E7\r\nab\r\n",
            "ms k C5 E7 F9 I T-1 Set data=\"ab\"",
        ),
        err_line(b"ms k 2 MX\r\nab\r\n", INVALID_SET_MODE, 4),
        err_line(b"ms k 2 Ms\r\nab\r\n", INVALID_SET_MODE, 4),
        err_line(b"ms k 2 M\r\nab\r\n", INVALID_SET_MODE, 4),
        err_line(b"ms k 2 M k\r\nab\r\n", INVALID_SET_MODE, 4),
        // Flag errors swallow the data block and come before the mode.
        err_line(b"ms k 2 z\r\nab\r\n", INVALID_FLAG, 4),
        err_line(b"ms k 2 k k\r\nab\r\n", DUPLICATE_FLAG, 4),
        err_line(b"ms k 2 Tx\r\nab\r\n", BAD_TOKEN, 4),
        err_line(b"ms k 2 Fx\r\nab\r\n", BAD_FORMAT, 4),
        err_line(b"ms k 2 Tx MX\r\nab\r\n", BAD_TOKEN, 4),
        err_line(b"ms k 2 5 k k\r\nab\r\n", INVALID_FLAG, 4),
        err_line(b"ms k 2 k k 5\r\nab\r\n", DUPLICATE_FLAG, 4),
        // A bad data length or a bad flag start swallows nothing (the data is a command).
        err_line(b"ms k x2\r\nab\r\n", BAD_FORMAT, 0),
        err_line(b"ms k -1\r\nab\r\n", BAD_FORMAT, 0),
        err_line(b"ms k 2147483646\r\n", BAD_FORMAT, 0),
        err_line(b"ms k 99999999999\r\n", BAD_FORMAT, 0),
        err_line(b"ms k 2 !\r\nab\r\n", BAD_FORMAT, 0),
        // A data block not followed by \r\n: the line, the block and two bytes are consumed.
        err_at(b"ms k 2 q\r\nabc\r\n", BAD_DATA_CHUNK, 14, 0),
        err_at(b"ms k 2\r\nab\n\r\n", BAD_DATA_CHUNK, 12, 0),
        err_at(b"ms k 2\r\nab\rx", BAD_DATA_CHUNK, 12, 0),
        (b"ms k 2\r\nab\r", Want::Exact(Parse::Incomplete)),
        (b"ms k 2 Tx\r", Want::Exact(Parse::Incomplete)),
    ]);
}

#[test]
fn set_too_large() {
    check_rows(&[
        ok(
            [b"ms k 100\r\n".as_slice(), &[b'x'; 100], b"\r\n"]
                .concat()
                .leak(),
            {
                let data = "x".repeat(100);
                format!("ms k Set data={data:?}").leak()
            },
        ),
        (
            b"ms k 101 q MA\r\n",
            Want::Exact(Parse::TooLarge {
                mode: StoreMode::Set,
                key: b"k",
                noreply: false,
                consumed: 15,
                swallow: 103,
            }),
        ),
        // A base64 key cannot be borrowed decoded: a plain error.
        err_line(b"ms Zm9v 101 b\r\n", TOO_LARGE, 103),
        // Flag errors and the mode come first, the opaque after.
        err_line(b"ms k 101 Tx\r\n", BAD_TOKEN, 103),
        err_line(b"ms k 101 MX\r\n", INVALID_SET_MODE, 103),
        (
            b"ms k 101 O01234567890123456789012345678901\r\n",
            Want::Exact(Parse::TooLarge {
                mode: StoreMode::Set,
                key: b"k",
                noreply: false,
                consumed: 44,
                swallow: 103,
            }),
        ),
        (
            b"ms k 2147483645\r\n",
            Want::Exact(Parse::TooLarge {
                mode: StoreMode::Set,
                key: b"k",
                noreply: false,
                consumed: 17,
                swallow: 2147483647,
            }),
        ),
    ]);
    check_rows_with(
        &Limits::new(0),
        &[
            ok(b"ms k 0\r\n\r\n", "ms k Set data=\"\""),
            (
                b"ms k 1\r\nx\r\n",
                Want::Exact(Parse::TooLarge {
                    mode: StoreMode::Set,
                    key: b"k",
                    noreply: false,
                    consumed: 8,
                    swallow: 3,
                }),
            ),
        ],
    );
}

/// Every prefix of a complete `ms` is incomplete; the whole is one request.
#[test]
fn set_split_at_every_byte() {
    let inputs: &[&[u8]] = &[
        b"ms foo 5 T30 F7 k c Oabc\r\nhello\r\n",
        b"ms foo 0\r\n\r\n",
        b"ms Zm9v 4 b\n\r\n\r\n\r\n",
        b"ms Zm9v 6 b MA N5 q\r\nab\r\ncd\r\n",
    ];
    for input in inputs {
        for cut in 0..input.len() {
            assert_eq!(
                text_parse(&input[..cut], &LIMITS),
                Parse::Incomplete,
                "{:?} cut at {cut}",
                lossy(input)
            );
        }
        match text_parse(input, &LIMITS) {
            Parse::Request(Request::Meta(MetaRequest::Set { .. }), n) => {
                assert_eq!(n, input.len())
            }
            other => panic!("{:?}: {other:?}", lossy(input)),
        }
        // With a following request, only the first is consumed.
        let two = [*input, b"mn\r\n"].concat();
        match text_parse(&two, &LIMITS) {
            Parse::Request(Request::Meta(MetaRequest::Set { .. }), n) => {
                assert_eq!(n, input.len())
            }
            other => panic!("{:?}: {other:?}", lossy(input)),
        }
    }
    // A bad line is answered as soon as it is complete, before its data arrives.
    assert_eq!(
        text_parse(b"ms foo 5 z\r\n", &LIMITS),
        fail(INVALID_FLAG, false, 12, 7)
    );
}

#[test]
fn pipelined() {
    let buf = b"mg a v\r\nms b 1 q\r\nx\r\nmd c\r\nma d\r\nmn\r\nme e\r\nget f\r\n";
    let mut rest: &[u8] = buf;
    let mut seen = Vec::new();
    while !rest.is_empty() {
        match text_parse(rest, &LIMITS) {
            Parse::Request(Request::Meta(req), n) => {
                seen.push(render(&req));
                rest = &rest[n..];
            }
            Parse::Request(_, n) => {
                seen.push("text".to_string());
                rest = &rest[n..];
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        seen,
        [
            "mg a v",
            "ms b q Set data=\"x\"",
            "md c",
            "ma d Incr",
            "mn",
            "me e",
            "text"
        ]
    );
}

#[test]
fn accessors() {
    let Parse::Request(Request::Meta(req), _) = text_parse(
        b"mg Zm9v b T30 N-5 R7 F9 C11 E12 J13 D14 Oop q v u I x k c\r\n",
        &LIMITS,
    ) else {
        panic!("no request");
    };
    let a = *req.args().unwrap();
    assert_eq!(req.key(), Some(a.key()));
    let mut buf = [0u8; MAX_KEY_LEN];
    assert_eq!(a.key().bytes(&mut buf), b"foo");
    assert!(a.key().is_base64());
    assert_eq!(a.ttl(), Some(30));
    assert_eq!(a.vivify(), Some(-5));
    assert_eq!(a.recache(), Some(7));
    assert_eq!(a.client_flags(), Some(9));
    assert_eq!(a.compare_cas(), Some(11));
    assert_eq!(a.new_cas(), Some(12));
    assert_eq!(a.initial(), Some(13));
    assert_eq!(a.delta(), Some(14));
    assert_eq!(a.opaque(), Some(b"op".as_slice()));
    assert!(a.quiet() && a.value() && a.no_bump() && a.invalidate() && a.remove_value());
    assert!(a.has(b'k') && a.has(b'c') && !a.has(b's') && !a.has(b'!'));
    assert_eq!(format!("{:?}", a.flags()), "FlagSet(\"CDEFIJNORTbckquvx\")");

    let Parse::Request(Request::Meta(req), _) = text_parse(b"mg k\r\n", &LIMITS) else {
        panic!("no request");
    };
    let a = *req.args().unwrap();
    assert_eq!(a.ttl(), None);
    assert_eq!(a.opaque(), None);
    assert_eq!(a.delta(), None);
    assert!(!a.quiet());
    assert_eq!(a.return_flags().count(), 0);
    assert_eq!(MetaRequest::Noop.args(), None);
    assert_eq!(MetaRequest::Noop.key(), None);
}

#[test]
fn return_flags_in_request_order() {
    let Parse::Request(Request::Meta(req), _) =
        text_parse(b"mg k t v Oab T5 k c s q f h l Pz\r\n", &LIMITS)
    else {
        panic!("no request");
    };
    let got: Vec<ReturnFlag<'_>> = req.args().unwrap().return_flags().collect();
    assert_eq!(
        got,
        [
            ReturnFlag::Ttl,
            ReturnFlag::Opaque(b"ab"),
            ReturnFlag::Key,
            ReturnFlag::Cas,
            ReturnFlag::Size,
            ReturnFlag::ClientFlags,
            ReturnFlag::Hit,
            ReturnFlag::LastAccess,
        ]
    );
    // ms: the data length is not a flag.
    let Parse::Request(Request::Meta(req), _) = text_parse(b"ms k 1 c Ox s\r\n5\r\n", &LIMITS)
    else {
        panic!("no request");
    };
    let got: Vec<ReturnFlag<'_>> = req.args().unwrap().return_flags().collect();
    assert_eq!(
        got,
        [ReturnFlag::Cas, ReturnFlag::Opaque(b"x"), ReturnFlag::Size]
    );
}

#[test]
fn flag_positions_tell_which_came_first() {
    let Parse::Request(Request::Meta(req), _) = text_parse(b"mg k t R30 v T5 N9\r\n", &LIMITS)
    else {
        panic!("no request");
    };
    let args = req.args().unwrap();
    assert_eq!(args.position(b't'), Some(0));
    assert_eq!(args.position(b'T'), Some(3));
    assert_eq!(args.position(b'N'), Some(4));
    assert_eq!(args.position(b'c'), None);
    assert!(args.before(b't', b'T'));
    assert!(args.before(b'R', b'T'));
    assert!(!args.before(b'N', b'T'));
    assert!(args.before(b'T', b'N'));
    // Not when either is missing.
    assert!(!args.before(b'c', b'T'));
    assert!(!args.before(b'T', b'c'));
}

#[test]
fn set_mode_to_store_mode() {
    assert_eq!(SetMode::Set.store_mode(false), StoreMode::Set);
    assert_eq!(SetMode::Set.store_mode(true), StoreMode::Cas);
    assert_eq!(SetMode::Replace.store_mode(false), StoreMode::Replace);
    assert_eq!(SetMode::Replace.store_mode(true), StoreMode::Cas);
    assert_eq!(SetMode::Add.store_mode(true), StoreMode::Add);
    assert_eq!(SetMode::Append.store_mode(true), StoreMode::Append);
    assert_eq!(SetMode::Prepend.store_mode(false), StoreMode::Prepend);
}

#[test]
fn composers() {
    type Compose = dyn Fn(&mut Vec<u8>);
    let cases: &[(&Compose, &[u8])] = &[
        (
            &|o| {
                MetaReply::va(o, 5)
                    .num(b'c', 123)
                    .num(b'f', 0)
                    .int(b't', -1)
                    .opaque(b"abc")
                    .key(b"foo", false)
                    .finish_value(b"hello")
            },
            b"VA 5 c123 f0 t-1 Oabc kfoo\r\nhello\r\n",
        ),
        (&|o| MetaReply::va(o, 0).finish_value(b""), b"VA 0\r\n\r\n"),
        (&|o| MetaReply::hd(o).finish(), b"HD\r\n"),
        (&|o| MetaReply::en(o).finish(), b"EN\r\n"),
        (&|o| MetaReply::nf(o).finish(), b"NF\r\n"),
        (&|o| MetaReply::ns(o).finish(), b"NS\r\n"),
        (&|o| MetaReply::ex(o).finish(), b"EX\r\n"),
        (
            &|o| {
                MetaReply::en(o)
                    .key(b"missing", false)
                    .opaque(b"abc")
                    .finish()
            },
            b"EN kmissing Oabc\r\n",
        ),
        (
            &|o| {
                MetaReply::hd(o)
                    .key(b"foo", true)
                    .opaque(b"1")
                    .num(b'c', 24)
                    .finish()
            },
            b"HD kZm9v b O1 c24\r\n",
        ),
        (
            &|o| {
                MetaReply::va(o, 0)
                    .int(b't', 30)
                    .num(b'c', 36)
                    .num(b's', 0)
                    .flag(b'W')
                    .finish_value(b"")
            },
            b"VA 0 t30 c36 s0 W\r\n\r\n",
        ),
        (
            &|o| {
                MetaReply::hd(o)
                    .num(b'h', 1)
                    .num(b'l', 7)
                    .flag(b'Z')
                    .flag(b'X')
                    .finish()
            },
            b"HD h1 l7 Z X\r\n",
        ),
        (&|o| MetaReply::hd(o).opaque(b"").finish(), b"HD O\r\n"),
        (
            &|o| {
                MetaReply::va(o, 20)
                    .num(b'c', u64::MAX)
                    .int(b't', i64::MIN)
                    .finish()
            },
            b"VA 20 c18446744073709551615 t-9223372036854775808\r\n",
        ),
        (
            &|o| {
                write_debug(
                    o,
                    b"foo",
                    false,
                    &DebugInfo {
                        exp: -1,
                        la: 0,
                        cas: 24,
                        fetched: true,
                        cls: 1,
                        size: 64,
                    },
                )
            },
            b"ME foo exp=-1 la=0 cas=24 fetch=yes cls=1 size=64\r\n",
        ),
        (
            &|o| {
                write_debug(
                    o,
                    b"foo",
                    true,
                    &DebugInfo {
                        exp: 30,
                        la: 5,
                        cas: 1,
                        fetched: false,
                        cls: 12,
                        size: 1000,
                    },
                )
            },
            b"ME Zm9v exp=30 la=5 cas=1 fetch=no cls=12 size=1000\r\n",
        ),
        (
            &|o| write_error(o, OPAQUE_TOO_LONG),
            b"CLIENT_ERROR opaque token too long\r\n",
        ),
        (
            &|o| write_error(o, NON_NUMERIC),
            b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        ),
        (&|o| o.extend_from_slice(MN), b"MN\r\n"),
    ];
    for (i, (compose, want)) in cases.iter().enumerate() {
        let mut out = b"prefix ".to_vec();
        compose(&mut out);
        assert_eq!(lossy(&out[7..]), lossy(want), "case {i}");
    }
    for (constant, want) in [(EN, "EN"), (HD, "HD"), (NF, "NF"), (NS, "NS"), (EX, "EX")] {
        assert_eq!(constant, format!("{want}\r\n").as_bytes());
    }
}

/// Feed `buf` through the parser as the server would, checking its promises.
fn drain(buf: &[u8], limits: &Limits) {
    let mut rest = buf;
    let mut swallow = 0usize;
    let mut out = Vec::new();
    while !rest.is_empty() {
        if swallow > 0 {
            let n = swallow.min(rest.len());
            rest = &rest[n..];
            swallow -= n;
            continue;
        }
        match text_parse(rest, limits) {
            Parse::Request(req, n) => {
                assert!(n > 0 && n <= rest.len());
                if let Request::Meta(req) = req {
                    check_request(&req, &rest[..n], limits, &mut out);
                }
                rest = &rest[n..];
            }
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
                assert!(consumed > 0 && consumed <= rest.len());
                rest = &rest[consumed..];
                swallow = s;
            }
            Parse::Incomplete | Parse::Close => break,
        }
    }
}

fn check_request(req: &MetaRequest<'_>, bytes: &[u8], limits: &Limits, out: &mut Vec<u8>) {
    if let Some(key) = req.key() {
        assert!(!key.raw().is_empty() && key.raw().len() <= MAX_KEY_LEN);
        let mut buf = [0u8; MAX_KEY_LEN];
        let decoded = key.bytes(&mut buf);
        assert!(!decoded.is_empty());
        out.clear();
        MetaReply::hd(out).key(decoded, key.is_base64()).finish();
    }
    if let Some(args) = req.args() {
        if let Some(o) = args.opaque() {
            assert!(o.len() < MAX_OPAQUE_TOKEN_LEN);
        }
        assert!(args.return_flags().count() <= MAX_META_TOKENS);
    }
    if let MetaRequest::Set { data, .. } = req {
        assert!(data.len() <= limits.max_value);
        assert!(bytes.ends_with(b"\r\n"));
    }
}

const FRAGMENTS: &[&[u8]] = &[
    b"mg ",
    b"ms ",
    b"md ",
    b"ma ",
    b"mn",
    b"me ",
    b"k",
    b"Zm9v",
    b" ",
    b"\r\n",
    b"\n",
    b"\r",
    b" v",
    b" k",
    b" q",
    b" b",
    b" O",
    b" Oabc",
    b" T",
    b" T30",
    b" T-",
    b" N5",
    b" R1",
    b" F",
    b" F7",
    b" C",
    b" C99",
    b" E1",
    b" J",
    b" D2",
    b" M",
    b" MS",
    b" MA",
    b" MD",
    b" I",
    b" x",
    b" z",
    b" !",
    b" 5",
    b"0",
    b"1",
    b"2",
    b"10",
    b"-1",
    b"xx",
    b"=",
    b"0123456789012345678901234567890123",
];

fn fragments() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(FRAGMENTS), 0..40).prop_map(|f| f.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(tail in prop::collection::vec(any::<u8>(), 0..300), cmd in 0usize..6) {
        let head: &[u8] = [b"mg ".as_slice(), b"ms ", b"md ", b"ma ", b"mn ", b"me "][cmd];
        drain(&[head, &tail].concat(), &LIMITS);
        drain(&tail, &Limits::new(0));
    }

    #[test]
    fn meta_shaped_bytes(buf in fragments()) {
        drain(&buf, &LIMITS);
    }

    #[test]
    fn base64_round_trip(key in prop::collection::vec(any::<u8>(), 1..187)) {
        let mut encoded = Vec::new();
        encode_base64(&mut encoded, &key);
        let mut buf = [0u8; MAX_KEY_LEN];
        let n = decode_base64(&encoded, &mut buf);
        prop_assert_eq!(n.map(|n| buf[..n].to_vec()), Some(key));
    }

    #[test]
    fn decode_never_overflows(src in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut buf = [0u8; MAX_KEY_LEN];
        if let Some(n) = decode_base64(&src, &mut buf) {
            prop_assert!(n > 0 && n <= src.len() * 3 / 4);
        }
    }
}
