//! Tests of the binary protocol parser and composers. Expected verdicts follow the newest
//! memcached (checked against a build of its current source with a socket probe); the composer
//! tests compare with reply bytes captured from that build.

use super::*;
use proptest::prelude::*;

/// The configuration most rows use: small values so that "too large" is easy to reach.
const LIMITS: Limits = Limits {
    max_value: 100,
    flush_enabled: true,
    shutdown_enabled: false,
};

const OPAQUE: u32 = 0xdead_beef;

/// A well-formed request packet (lengths from the pieces).
fn pkt(op: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    pkt_cas(op, 0, extras, key, value)
}

fn pkt_cas(op: u8, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_request(&mut out, op, OPAQUE, cas, extras, key, value);
    out
}

/// A header with explicit lengths, followed by `tail`.
fn raw(op: u8, keylen: u16, extlen: u8, bodylen: u32, tail: &[u8]) -> Vec<u8> {
    let mut out = vec![REQUEST_MAGIC, op];
    out.extend_from_slice(&keylen.to_be_bytes());
    out.push(extlen);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&bodylen.to_be_bytes());
    out.extend_from_slice(&OPAQUE.to_be_bytes());
    out.extend_from_slice(&0u64.to_be_bytes());
    out.extend_from_slice(tail);
    out
}

fn set_extras(flags: u32, exptime: u32) -> Vec<u8> {
    let mut e = flags.to_be_bytes().to_vec();
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

fn arith_extras(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
    let mut e = delta.to_be_bytes().to_vec();
    e.extend_from_slice(&initial.to_be_bytes());
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

const EXP4: [u8; 4] = [0, 0, 0, 0x2a];

/// What a row expects, owning its pieces.
#[derive(Debug, Clone)]
enum Want {
    Req {
        command: Command,
        quiet: bool,
        key: Vec<u8>,
        value: Vec<u8>,
        consumed: usize,
    },
    Err {
        status: Status,
        close: bool,
        consumed: usize,
        swallow: usize,
    },
    Big {
        status: Status,
        key: Vec<u8>,
        consumed: usize,
        swallow: usize,
    },
    Close,
    Incomplete,
}

fn ok(command: Command, quiet: bool, key: &[u8], value: &[u8], consumed: usize) -> Want {
    Want::Req {
        command,
        quiet,
        key: key.to_vec(),
        value: value.to_vec(),
        consumed,
    }
}

/// A protocol error: `Invalid arguments`, then close.
fn einval(consumed: usize) -> Want {
    Want::Err {
        status: Status::InvalidArguments,
        close: true,
        consumed,
        swallow: 0,
    }
}

fn unknown(consumed: usize, swallow: usize) -> Want {
    Want::Err {
        status: Status::UnknownCommand,
        close: false,
        consumed,
        swallow,
    }
}

fn matches_want(input: &[u8], got: &Parse<'_>, want: &Want) -> bool {
    match (got, want) {
        (
            Parse::Request(r, n),
            Want::Req {
                command,
                quiet,
                key,
                value,
                consumed,
            },
        ) => {
            r.command == *command
                && r.quiet == *quiet
                && r.key == key.as_slice()
                && r.value == value.as_slice()
                && *n == *consumed
                && r.opaque == OPAQUE
                && Some(&r.opcode) == input.get(1)
        }
        (
            Parse::Error {
                opcode,
                opaque,
                status: s,
                close: c,
                consumed: n,
                swallow: w,
            },
            Want::Err {
                status,
                close,
                consumed,
                swallow,
            },
        ) => {
            s == status
                && c == close
                && n == consumed
                && w == swallow
                && *opaque == OPAQUE
                && Some(opcode) == input.get(1)
        }
        (
            Parse::TooLarge {
                opcode,
                opaque,
                status: s,
                key: k,
                consumed: n,
                swallow: w,
            },
            Want::Big {
                status,
                key,
                consumed,
                swallow,
            },
        ) => {
            s == status
                && *k == key.as_slice()
                && n == consumed
                && w == swallow
                && *opaque == OPAQUE
                && Some(opcode) == input.get(1)
        }
        (Parse::Close, Want::Close) | (Parse::Incomplete, Want::Incomplete) => true,
        _ => false,
    }
}

/// Every row: a name, the input, the expected verdict.
fn rows() -> Vec<(&'static str, Vec<u8>, Want)> {
    use opcode::*;
    let h = HEADER_LEN;
    let se = set_extras(0xcafe, 300);
    let ae = arith_extras(5, 42, 600);
    let store = |mode, flags, exptime| Command::Store {
        mode,
        flags,
        exptime,
    };
    let mut rows: Vec<(&'static str, Vec<u8>, Want)> = vec![
        // --- get family
        (
            "get",
            pkt(GET, &[], b"foo", &[]),
            ok(Command::Get { with_key: false }, false, b"foo", b"", h + 3),
        ),
        (
            "getq",
            pkt(GETQ, &[], b"foo", &[]),
            ok(Command::Get { with_key: false }, true, b"foo", b"", h + 3),
        ),
        (
            "getk",
            pkt(GETK, &[], b"foo", &[]),
            ok(Command::Get { with_key: true }, false, b"foo", b"", h + 3),
        ),
        (
            "getkq",
            pkt(GETKQ, &[], b"foo", &[]),
            ok(Command::Get { with_key: true }, true, b"foo", b"", h + 3),
        ),
        (
            "get binary key",
            pkt(GET, &[], b"a b\r\n\0", &[]),
            ok(
                Command::Get { with_key: false },
                false,
                b"a b\r\n\0",
                b"",
                h + 6,
            ),
        ),
        (
            "get key 250",
            pkt(GET, &[], &[b'k'; 250], &[]),
            ok(
                Command::Get { with_key: false },
                false,
                &[b'k'; 250],
                b"",
                h + 250,
            ),
        ),
        (
            "get key 251",
            pkt(GET, &[], &[b'k'; 251], &[]),
            einval(h + 251),
        ),
        ("get no key", pkt(GET, &[], b"", &[]), einval(h)),
        ("getq no key", pkt(GETQ, &[], b"", &[]), einval(h)),
        ("get extras", pkt(GET, &EXP4, b"foo", &[]), einval(h + 7)),
        ("get value", pkt(GET, &[], b"foo", b"v"), einval(h + 3)),
        ("getk value", pkt(GETK, &[], b"foo", b"v"), einval(h + 3)),
        // --- touch / gat
        (
            "touch",
            pkt(TOUCH, &EXP4, b"foo", &[]),
            ok(Command::Touch { exptime: 42 }, false, b"foo", b"", h + 7),
        ),
        (
            "touch exptime u32 max",
            pkt(TOUCH, &[0xff; 4], b"foo", &[]),
            ok(
                Command::Touch {
                    exptime: 0xffff_ffff,
                },
                false,
                b"foo",
                b"",
                h + 7,
            ),
        ),
        (
            "gat",
            pkt(GAT, &EXP4, b"foo", &[]),
            ok(
                Command::GetAndTouch {
                    with_key: false,
                    exptime: 42,
                },
                false,
                b"foo",
                b"",
                h + 7,
            ),
        ),
        (
            "gatq",
            pkt(GATQ, &EXP4, b"foo", &[]),
            ok(
                Command::GetAndTouch {
                    with_key: false,
                    exptime: 42,
                },
                true,
                b"foo",
                b"",
                h + 7,
            ),
        ),
        (
            "gatk",
            pkt(GATK, &EXP4, b"foo", &[]),
            ok(
                Command::GetAndTouch {
                    with_key: true,
                    exptime: 42,
                },
                false,
                b"foo",
                b"",
                h + 7,
            ),
        ),
        (
            "gatkq",
            pkt(GATKQ, &EXP4, b"foo", &[]),
            ok(
                Command::GetAndTouch {
                    with_key: true,
                    exptime: 42,
                },
                true,
                b"foo",
                b"",
                h + 7,
            ),
        ),
        // The body beyond extras + key is not checked: it is the next request.
        (
            "gat trailing body",
            pkt(GAT, &EXP4, b"foo", b"xyz"),
            ok(
                Command::GetAndTouch {
                    with_key: false,
                    exptime: 42,
                },
                false,
                b"foo",
                b"",
                h + 7,
            ),
        ),
        (
            "touch trailing body",
            pkt(TOUCH, &EXP4, b"foo", b"xyz"),
            ok(Command::Touch { exptime: 42 }, false, b"foo", b"", h + 7),
        ),
        (
            "touch no extras",
            pkt(TOUCH, &[], b"foo", &[]),
            einval(h + 3),
        ),
        (
            "gat extras 8",
            pkt(GAT, &[0; 8], b"foo", &[]),
            einval(h + 11),
        ),
        ("gatkq no key", pkt(GATKQ, &EXP4, b"", &[]), einval(h + 4)),
        (
            "touch key 251",
            pkt(TOUCH, &EXP4, &[b'k'; 251], &[]),
            einval(h + 255),
        ),
        // --- set / add / replace
        (
            "set",
            pkt(SET, &se, b"foo", b"bar"),
            ok(
                store(StoreMode::Set, 0xcafe, 300),
                false,
                b"foo",
                b"bar",
                h + 14,
            ),
        ),
        (
            "setq",
            pkt(SETQ, &se, b"foo", b"bar"),
            ok(
                store(StoreMode::Set, 0xcafe, 300),
                true,
                b"foo",
                b"bar",
                h + 14,
            ),
        ),
        (
            "add",
            pkt(ADD, &se, b"foo", b"bar"),
            ok(
                store(StoreMode::Add, 0xcafe, 300),
                false,
                b"foo",
                b"bar",
                h + 14,
            ),
        ),
        (
            "addq",
            pkt(ADDQ, &se, b"foo", b"bar"),
            ok(
                store(StoreMode::Add, 0xcafe, 300),
                true,
                b"foo",
                b"bar",
                h + 14,
            ),
        ),
        (
            "replace",
            pkt(REPLACE, &se, b"foo", b"bar"),
            ok(
                store(StoreMode::Replace, 0xcafe, 300),
                false,
                b"foo",
                b"bar",
                h + 14,
            ),
        ),
        (
            "replaceq",
            pkt(REPLACEQ, &se, b"foo", b"bar"),
            ok(
                store(StoreMode::Replace, 0xcafe, 300),
                true,
                b"foo",
                b"bar",
                h + 14,
            ),
        ),
        (
            "set empty value",
            pkt(SET, &se, b"foo", b""),
            ok(
                store(StoreMode::Set, 0xcafe, 300),
                false,
                b"foo",
                b"",
                h + 11,
            ),
        ),
        (
            "set value 100",
            pkt(SET, &se, b"foo", &[b'v'; 100]),
            ok(
                store(StoreMode::Set, 0xcafe, 300),
                false,
                b"foo",
                &[b'v'; 100],
                h + 111,
            ),
        ),
        (
            "set exptime u32 max",
            pkt(SET, &set_extras(1, u32::MAX), b"k", b"v"),
            ok(
                store(StoreMode::Set, 1, 0xffff_ffff),
                false,
                b"k",
                b"v",
                h + 10,
            ),
        ),
        (
            "set cas",
            pkt_cas(SET, 77, &se, b"foo", b"bar"),
            ok(
                store(StoreMode::Cas, 0xcafe, 300),
                false,
                b"foo",
                b"bar",
                h + 14,
            ),
        ),
        (
            "add cas is cas",
            pkt_cas(ADD, 77, &se, b"foo", b"bar"),
            ok(
                store(StoreMode::Cas, 0xcafe, 300),
                false,
                b"foo",
                b"bar",
                h + 14,
            ),
        ),
        (
            "replaceq cas is cas",
            pkt_cas(REPLACEQ, 77, &se, b"foo", b"bar"),
            ok(
                store(StoreMode::Cas, 0xcafe, 300),
                true,
                b"foo",
                b"bar",
                h + 14,
            ),
        ),
        (
            "set extras 4",
            pkt(SET, &EXP4, b"foo", b"bar"),
            einval(h + 7),
        ),
        (
            "set no extras",
            pkt(SET, &[], b"foo", b"bar"),
            einval(h + 3),
        ),
        (
            "set extras 12",
            pkt(SET, &[0; 12], b"foo", b"bar"),
            einval(h + 15),
        ),
        ("set no key", pkt(SET, &se, b"", b"bar"), einval(h + 8)),
        ("addq no key", pkt(ADDQ, &se, b"", b"bar"), einval(h + 8)),
        (
            "set key 251",
            pkt(SET, &se, &[b'k'; 251], b"bar"),
            einval(h + 259),
        ),
        // --- append / prepend
        (
            "append",
            pkt(APPEND, &[], b"foo", b"bar"),
            ok(store(StoreMode::Append, 0, 0), false, b"foo", b"bar", h + 6),
        ),
        (
            "appendq",
            pkt(APPENDQ, &[], b"foo", b"bar"),
            ok(store(StoreMode::Append, 0, 0), true, b"foo", b"bar", h + 6),
        ),
        (
            "prepend",
            pkt(PREPEND, &[], b"foo", b"bar"),
            ok(
                store(StoreMode::Prepend, 0, 0),
                false,
                b"foo",
                b"bar",
                h + 6,
            ),
        ),
        (
            "prependq",
            pkt(PREPENDQ, &[], b"foo", b"bar"),
            ok(store(StoreMode::Prepend, 0, 0), true, b"foo", b"bar", h + 6),
        ),
        (
            "append cas stays append",
            pkt_cas(APPEND, 9, &[], b"foo", b"bar"),
            ok(store(StoreMode::Append, 0, 0), false, b"foo", b"bar", h + 6),
        ),
        (
            "append empty value",
            pkt(APPEND, &[], b"foo", b""),
            ok(store(StoreMode::Append, 0, 0), false, b"foo", b"", h + 3),
        ),
        (
            "append extras",
            pkt(APPEND, &se, b"foo", b"bar"),
            einval(h + 11),
        ),
        ("prepend no key", pkt(PREPEND, &[], b"", b"bar"), einval(h)),
        // --- delete
        (
            "delete",
            pkt(DELETE, &[], b"foo", &[]),
            ok(Command::Delete, false, b"foo", b"", h + 3),
        ),
        (
            "deleteq",
            pkt(DELETEQ, &[], b"foo", &[]),
            ok(Command::Delete, true, b"foo", b"", h + 3),
        ),
        (
            "delete extras",
            pkt(DELETE, &EXP4, b"foo", &[]),
            einval(h + 7),
        ),
        (
            "delete value",
            pkt(DELETE, &[], b"foo", b"v"),
            einval(h + 3),
        ),
        ("delete no key", pkt(DELETE, &[], b"", &[]), einval(h)),
        // --- increment / decrement
        (
            "incr",
            pkt(INCREMENT, &ae, b"n", &[]),
            ok(
                Command::Arith {
                    incr: true,
                    delta: 5,
                    initial: 42,
                    exptime: 600,
                    create: true,
                },
                false,
                b"n",
                b"",
                h + 21,
            ),
        ),
        (
            "incrq",
            pkt(INCREMENTQ, &ae, b"n", &[]),
            ok(
                Command::Arith {
                    incr: true,
                    delta: 5,
                    initial: 42,
                    exptime: 600,
                    create: true,
                },
                true,
                b"n",
                b"",
                h + 21,
            ),
        ),
        (
            "decr",
            pkt(DECREMENT, &ae, b"n", &[]),
            ok(
                Command::Arith {
                    incr: false,
                    delta: 5,
                    initial: 42,
                    exptime: 600,
                    create: true,
                },
                false,
                b"n",
                b"",
                h + 21,
            ),
        ),
        (
            "decrq",
            pkt(DECREMENTQ, &ae, b"n", &[]),
            ok(
                Command::Arith {
                    incr: false,
                    delta: 5,
                    initial: 42,
                    exptime: 600,
                    create: true,
                },
                true,
                b"n",
                b"",
                h + 21,
            ),
        ),
        (
            "incr no create",
            pkt(INCREMENT, &arith_extras(u64::MAX, 1, u32::MAX), b"n", &[]),
            ok(
                Command::Arith {
                    incr: true,
                    delta: u64::MAX,
                    initial: 1,
                    exptime: 0xffff_ffff,
                    create: false,
                },
                false,
                b"n",
                b"",
                h + 21,
            ),
        ),
        (
            "incr extras 8",
            pkt(INCREMENT, &[0; 8], b"n", &[]),
            einval(h + 9),
        ),
        (
            "incr extras 21",
            pkt(INCREMENT, &[0; 21], b"n", &[]),
            einval(h + 22),
        ),
        (
            "incr value",
            pkt(INCREMENT, &ae, b"n", b"1"),
            einval(h + 21),
        ),
        ("decr no key", pkt(DECREMENT, &ae, b"", &[]), einval(h + 20)),
        // --- quit, noop, version
        (
            "quit",
            pkt(QUIT, &[], b"", &[]),
            ok(Command::Quit, false, b"", b"", h),
        ),
        (
            "quitq",
            pkt(QUITQ, &[], b"", &[]),
            ok(Command::Quit, true, b"", b"", h),
        ),
        ("quit value", pkt(QUIT, &[], b"", b"x"), einval(h)),
        (
            "noop",
            pkt(NOOP, &[], b"", &[]),
            ok(Command::Noop, false, b"", b"", h),
        ),
        ("noop extras", pkt(NOOP, &EXP4, b"", &[]), einval(h + 4)),
        ("noop key", pkt(NOOP, &[], b"k", &[]), einval(h + 1)),
        ("noop value", pkt(NOOP, &[], b"", b"abc"), einval(h)),
        (
            "version",
            pkt(VERSION, &[], b"", &[]),
            ok(Command::Version, false, b"", b"", h),
        ),
        ("version key", pkt(VERSION, &[], b"a", &[]), einval(h + 1)),
        // --- flush
        (
            "flush",
            pkt(FLUSH, &[], b"", &[]),
            ok(Command::Flush { exptime: 0 }, false, b"", b"", h),
        ),
        (
            "flushq",
            pkt(FLUSHQ, &[], b"", &[]),
            ok(Command::Flush { exptime: 0 }, true, b"", b"", h),
        ),
        (
            "flush exptime",
            pkt(FLUSH, &EXP4, b"", &[]),
            ok(Command::Flush { exptime: 42 }, false, b"", b"", h + 4),
        ),
        (
            "flush extras 8",
            pkt(FLUSH, &[0; 8], b"", &[]),
            einval(h + 8),
        ),
        (
            "flush extras + value",
            pkt(FLUSH, &EXP4, b"", b"x"),
            einval(h + 4),
        ),
        ("flush key", pkt(FLUSH, &[], b"x", &[]), einval(h + 1)),
        // --- stat
        (
            "stat",
            pkt(STAT, &[], b"", &[]),
            ok(Command::Stat, false, b"", b"", h),
        ),
        (
            "stat group",
            pkt(STAT, &[], b"settings", &[]),
            ok(Command::Stat, false, b"settings", b"", h + 8),
        ),
        (
            "stat trailing body",
            pkt(STAT, &[], b"reset", b"xyz"),
            ok(Command::Stat, false, b"reset", b"", h + 5),
        ),
        ("stat extras", pkt(STAT, &EXP4, b"", &[]), einval(h + 4)),
        (
            "stat key 251",
            pkt(STAT, &[], &[b's'; 251], &[]),
            einval(h + 251),
        ),
        // --- SASL
        (
            "sasl list",
            pkt(SASL_LIST_MECHS, &[], b"", &[]),
            ok(Command::SaslListMechs, false, b"", b"", h),
        ),
        (
            "sasl list value",
            pkt(SASL_LIST_MECHS, &[], b"", b"ab"),
            einval(h),
        ),
        (
            "sasl auth",
            pkt(SASL_AUTH, &[], b"PLAIN", b"\0u\0p"),
            ok(Command::SaslAuth, false, b"PLAIN", b"\0u\0p", h + 9),
        ),
        (
            "sasl step",
            pkt(SASL_STEP, &[], b"PLAIN", b"xx"),
            ok(Command::SaslStep, false, b"PLAIN", b"xx", h + 7),
        ),
        (
            "sasl auth no key",
            pkt(SASL_AUTH, &[], b"", b"xx"),
            einval(h),
        ),
        (
            "sasl auth extras",
            pkt(SASL_AUTH, &EXP4, b"PLAIN", b"xx"),
            einval(h + 9),
        ),
        // --- unknown opcodes: memcached swallows the whole body length after extras and key.
        (
            "verbosity is unknown",
            pkt(VERBOSITY, &EXP4, b"", &[]),
            unknown(h + 4, 4),
        ),
        (
            "unknown 0x50 with key",
            pkt(0x50, &[], b"abc", &[]),
            unknown(h + 3, 3),
        ),
        (
            "unknown 0x50 with value",
            pkt(0x50, &[], b"", b"abc"),
            unknown(h, 3),
        ),
        ("unknown 0x1f", pkt(0x1f, &[], b"", &[]), unknown(h, 0)),
        (
            "unknown 0x25",
            pkt(0x25, &[], b"k", b"v"),
            unknown(h + 1, 2),
        ),
        (
            "rget is unknown",
            pkt(0x30, &[], b"a", &[]),
            unknown(h + 1, 1),
        ),
        (
            "unknown 0xff",
            pkt(0xff, &[1, 2], b"k", b"vv"),
            unknown(h + 3, 5),
        ),
        (
            "unknown key 251",
            pkt(0x50, &[], &[b'k'; 251], &[]),
            einval(h + 251),
        ),
        // --- header checks, in memcached's order
        (
            "keylen > bodylen",
            raw(GET, 3, 0, 2, b"abc"),
            Want::Err {
                status: Status::UnknownCommand,
                close: true,
                consumed: h + 3,
                swallow: 0,
            },
        ),
        (
            "keylen + extlen > bodylen",
            raw(GAT, 3, 4, 6, b"\0\0\0\0abc"),
            Want::Err {
                status: Status::UnknownCommand,
                close: true,
                consumed: h + 7,
                swallow: 0,
            },
        ),
        (
            "keylen > bodylen unknown opcode",
            raw(0x50, 1, 0, 0, b"a"),
            Want::Err {
                status: Status::UnknownCommand,
                close: true,
                consumed: h + 1,
                swallow: 0,
            },
        ),
        (
            "bodylen 1 GiB + 1",
            raw(SET, 3, 8, MAX_BODY_LEN + 1, &[&se[..], b"big"].concat()),
            einval(h + 11),
        ),
        (
            "bodylen u32 max",
            raw(SET, 3, 8, u32::MAX, &[&se[..], b"big"].concat()),
            einval(h + 11),
        ),
        (
            "bodylen u32 max unknown",
            raw(0x50, 0, 0, u32::MAX, b""),
            einval(h),
        ),
        (
            "bodylen 1 GiB unknown swallows",
            raw(0x50, 0, 0, MAX_BODY_LEN, b""),
            unknown(h, 1 << 30),
        ),
        (
            "bad magic",
            [&[0x81u8][..], &pkt(NOOP, &[], b"", &[])[1..]].concat(),
            Want::Close,
        ),
        (
            "magic 0",
            [&[0u8][..], &pkt(NOOP, &[], b"", &[])[1..]].concat(),
            Want::Close,
        ),
        (
            "text command",
            b"get foo bar baz quux xyzzy\r\n".to_vec(),
            Want::Close,
        ),
        (
            "head over 16 KiB",
            raw(GET, 16361, 0, 16361, b""),
            Want::Close,
        ),
        (
            "head over 16 KiB by extras",
            raw(GET, 16200, 200, 16400, b""),
            Want::Close,
        ),
        (
            "head 16 KiB waits",
            raw(GET, 16360, 0, 16360, b""),
            Want::Incomplete,
        ),
        (
            "head 16 KiB",
            raw(GET, 16360, 0, 16360, &[b'k'; 16360]),
            einval(16384),
        ),
        // --- too large
        (
            "set too large",
            pkt(SET, &se, b"big", &[b'v'; 101]),
            Want::Big {
                status: Status::TooLarge,
                key: b"big".to_vec(),
                consumed: h + 11,
                swallow: 101,
            },
        ),
        (
            "setq too large",
            pkt(SETQ, &se, b"big", &[b'v'; 101]),
            Want::Big {
                status: Status::TooLarge,
                key: b"big".to_vec(),
                consumed: h + 11,
                swallow: 101,
            },
        ),
        (
            "set too large header only",
            raw(SET, 3, 8, 11 + 1_000_000, &[&se[..], b"big"].concat()),
            Want::Big {
                status: Status::TooLarge,
                key: b"big".to_vec(),
                consumed: h + 11,
                swallow: 1_000_000,
            },
        ),
        (
            "prepend too large",
            pkt(PREPEND, &[], b"big", &[b'v'; 101]),
            Want::Big {
                status: Status::TooLarge,
                key: b"big".to_vec(),
                consumed: h + 3,
                swallow: 101,
            },
        ),
        (
            "sasl auth too large",
            pkt(SASL_AUTH, &[], b"PLAIN", &[b'v'; 101]),
            Want::Big {
                status: Status::UnknownCommand,
                key: b"PLAIN".to_vec(),
                consumed: h + 5,
                swallow: 101,
            },
        ),
        // --- incomplete
        ("empty", Vec::new(), Want::Incomplete),
        (
            "header only of get",
            raw(GET, 3, 0, 3, b""),
            Want::Incomplete,
        ),
        (
            "set without value",
            raw(SET, 3, 8, 14, &[&se[..], b"foo"].concat()),
            Want::Incomplete,
        ),
        (
            "23 bytes",
            pkt(NOOP, &[], b"", &[])[..23].to_vec(),
            Want::Incomplete,
        ),
    ];
    // Data type and vbucket are ignored.
    let mut odd = pkt(NOOP, &[], b"", &[]);
    odd[5] = 1;
    odd[6] = 0;
    odd[7] = 5;
    rows.push((
        "datatype and vbucket",
        odd,
        ok(Command::Noop, false, b"", b"", h),
    ));
    rows
}

#[test]
fn table() {
    let mut failures = Vec::new();
    for (name, input, want) in rows() {
        let got = parse(&input, &LIMITS);
        if !matches_want(&input, &got, &want) {
            failures.push(format!("{name}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_opcode_is_covered() {
    // Each of the 256 opcodes, bare, parses to something without panicking; the known ones
    // are exactly those that do not answer Unknown command when well-formed.
    let known: Vec<u8> = (0..=255u8)
        .filter(|&op| {
            let input = pkt(op, &[], b"", &[]);
            !matches!(
                parse(&input, &LIMITS),
                Parse::Error {
                    status: Status::UnknownCommand,
                    ..
                }
            )
        })
        .collect();
    let mut want: Vec<u8> = (0x00..=0x1a).collect();
    want.extend([0x1c, 0x1d, 0x1e, 0x20, 0x21, 0x22, 0x23, 0x24]);
    // kvcached's own: the replication pull.
    want.push(0xe0);
    assert_eq!(known, want);
}

#[test]
fn flush_disabled_is_auth_failure() {
    let limits = Limits {
        flush_enabled: false,
        ..LIMITS
    };
    for (op, extras) in [(opcode::FLUSH, &[][..]), (opcode::FLUSHQ, &EXP4[..])] {
        let input = pkt(op, extras, b"", &[]);
        assert_eq!(
            parse(&input, &limits),
            Parse::Error {
                opcode: op,
                opaque: OPAQUE,
                status: Status::AuthError,
                close: false,
                consumed: input.len(),
                swallow: 0,
            }
        );
    }
    // A malformed flush is still a protocol error.
    let bad = pkt(opcode::FLUSH, &[], b"k", &[]);
    assert!(matches!(
        parse(&bad, &limits),
        Parse::Error {
            status: Status::InvalidArguments,
            close: true,
            ..
        }
    ));
}

#[test]
fn request_fields() {
    let input = pkt_cas(
        opcode::SETQ,
        0x0102_0304_0506_0708,
        &set_extras(7, 9),
        b"k",
        b"v",
    );
    let Parse::Request(r, n) = parse(&input, &LIMITS) else {
        panic!("not a request");
    };
    assert_eq!(n, input.len());
    assert_eq!(r.opcode, opcode::SETQ);
    assert_eq!(r.opaque, OPAQUE);
    assert_eq!(r.cas, 0x0102_0304_0506_0708);
    assert!(r.quiet);
    assert_eq!(
        r.command,
        Command::Store {
            mode: StoreMode::Cas,
            flags: 7,
            exptime: 9
        }
    );
}

#[test]
fn too_large_boundary_follows_limits() {
    let se = set_extras(0, 0);
    for max in [0usize, 1, 100] {
        let limits = Limits::new(max);
        let fits = pkt(opcode::SET, &se, b"k", &vec![b'v'; max]);
        assert!(matches!(parse(&fits, &limits), Parse::Request(..)));
        let over = pkt(opcode::SET, &se, b"k", &vec![b'v'; max + 1]);
        assert!(matches!(
            parse(&over, &limits),
            Parse::TooLarge { swallow, .. } if swallow == max + 1
        ));
    }
}

#[test]
fn pipeline() {
    use opcode::*;
    let mut input = Vec::new();
    input.extend(pkt(GETKQ, &[], b"a", &[]));
    input.extend(pkt(SET, &set_extras(1, 2), b"b", b"value"));
    input.extend(pkt(STAT, &[], b"items", &[]));
    input.extend(pkt(NOOP, &[], b"", &[]));
    let mut rest = &input[..];
    let mut ops = Vec::new();
    while let Parse::Request(r, n) = parse(rest, &LIMITS) {
        ops.push(r.opcode);
        rest = &rest[n..];
    }
    assert_eq!(ops, [GETKQ, SET, STAT, NOOP]);
    assert!(rest.is_empty());
}

#[test]
fn unknown_opcode_swallows_into_next_request() {
    // memcached's over-swallow: an unknown opcode with a 3-byte key swallows 3 more bytes,
    // which here are the first 3 bytes of the following noop.
    let mut input = pkt(0x50, &[], b"abc", &[]);
    input.extend(pkt(opcode::NOOP, &[], b"", &[]));
    let Parse::Error {
        consumed, swallow, ..
    } = parse(&input, &LIMITS)
    else {
        panic!("not an error");
    };
    assert_eq!((consumed, swallow), (HEADER_LEN + 3, 3));
    let after = &input[consumed + swallow..];
    assert_eq!(after.len(), HEADER_LEN - 3);
    assert_eq!(parse(after, &LIMITS), Parse::Incomplete);
}

/// Split every row at every byte: a prefix is either `Incomplete` or (for verdicts memcached
/// reaches before the whole packet is in) the same verdict; a request needs all its bytes, and
/// every verdict but a bad magic byte needs the header, extras and key.
#[test]
fn split_at_every_byte() {
    for (name, input, want) in rows() {
        let full = parse(&input, &LIMITS);
        let need = match &full {
            Parse::Request(_, n) => *n,
            Parse::Error { consumed, .. } | Parse::TooLarge { consumed, .. } => *consumed,
            Parse::Close | Parse::Incomplete => HEADER_LEN.min(input.len()),
        };
        for cut in 0..input.len() {
            let got = parse(&input[..cut], &LIMITS);
            if cut < need {
                assert_eq!(got, Parse::Incomplete, "{name} cut at {cut}");
            } else {
                assert!(
                    matches_want(&input, &got, &want),
                    "{name} cut at {cut}: {got:?}"
                );
            }
        }
    }
}

/// Feeds a byte stream through the parser the way a server does; checks `consumed` bounds.
fn drain(buf: &[u8], limits: &Limits) {
    let mut rest = buf;
    let mut swallow = 0usize;
    loop {
        if swallow > 0 {
            let n = swallow.min(rest.len());
            rest = &rest[n..];
            swallow -= n;
            if swallow > 0 {
                return;
            }
        }
        match parse(rest, limits) {
            Parse::Request(r, n) => {
                assert!(n >= HEADER_LEN && n <= rest.len());
                assert!(r.key.len() <= MAX_KEY_LEN);
                assert!(r.value.len() <= limits.max_value);
                rest = &rest[n..];
            }
            Parse::Error {
                consumed,
                swallow: s,
                close,
                ..
            } => {
                assert!(consumed >= HEADER_LEN && consumed <= rest.len());
                assert!(consumed <= MAX_HEAD_LEN);
                if close {
                    return;
                }
                rest = &rest[consumed..];
                swallow = s;
            }
            Parse::TooLarge {
                consumed,
                swallow: s,
                key,
                ..
            } => {
                assert!(consumed >= HEADER_LEN && consumed <= rest.len());
                assert!(s > limits.max_value);
                assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN);
                rest = &rest[consumed..];
                swallow = s;
            }
            Parse::Incomplete => {
                // Never waits for more than the head limit plus the largest value.
                return;
            }
            Parse::Close => return,
        }
    }
}

/// Request-shaped packets: real opcodes, small lengths, sometimes inconsistent.
fn packet() -> impl Strategy<Value = Vec<u8>> {
    let op = prop_oneof![0u8..=0x24, any::<u8>()];
    let ext = prop_oneof![Just(0usize), Just(4), Just(8), Just(20), 0usize..24];
    let key = prop::collection::vec(any::<u8>(), 0..12);
    let value = prop::collection::vec(any::<u8>(), 0..16);
    let skew = prop_oneof![Just(0i64), -3i64..4];
    (op, ext, key, value, skew, any::<u64>()).prop_map(|(op, ext, key, value, skew, cas)| {
        let extras = vec![0x11u8; ext];
        let mut out = pkt_cas(op, cas & 3, &extras, &key, &value);
        if skew != 0 {
            let body = (extras.len() + key.len() + value.len()) as i64 + skew;
            out[8..12].copy_from_slice(&(body.max(0) as u32).to_be_bytes());
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(buf in prop::collection::vec(any::<u8>(), 0..300)) {
        drain(&buf, &LIMITS);
        let mut with_magic = buf.clone();
        if let Some(b) = with_magic.first_mut() { *b = REQUEST_MAGIC; }
        drain(&with_magic, &LIMITS);
    }

    #[test]
    fn packet_streams(packets in prop::collection::vec(packet(), 1..6), max in 0usize..20) {
        let stream = packets.concat();
        drain(&stream, &Limits::new(max));
        // Parsing is a pure function of the prefix.
        prop_assert_eq!(parse(&stream, &LIMITS), parse(&stream, &LIMITS));
    }

    #[test]
    fn requests_round_trip(key in prop::collection::vec(any::<u8>(), 1..=250),
                           value in prop::collection::vec(any::<u8>(), 0..100),
                           flags in any::<u32>(), exptime in any::<u32>(), opaque in any::<u32>()) {
        let mut input = Vec::new();
        write_request(&mut input, opcode::SET, opaque, 0, &set_extras(flags, exptime), &key, &value);
        match parse(&input, &LIMITS) {
            Parse::Request(r, n) => {
                prop_assert_eq!(n, input.len());
                prop_assert_eq!(r.key, &key[..]);
                prop_assert_eq!(r.value, &value[..]);
                prop_assert_eq!(r.opaque, opaque);
                prop_assert_eq!(r.command, Command::Store {
                    mode: StoreMode::Set, flags, exptime: i64::from(exptime) });
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn responses_round_trip(opcode in any::<u8>(), opaque in any::<u32>(), cas in any::<u64>(),
                            extras in prop::collection::vec(any::<u8>(), 0..8),
                            key in prop::collection::vec(any::<u8>(), 0..8),
                            value in prop::collection::vec(any::<u8>(), 0..32)) {
        let mut out = Vec::new();
        write_response(&mut out, opcode, Status::KeyExists, opaque, cas, &extras, &key, &value);
        let want = Response { opcode, status: 2, opaque, cas, extras: &extras, key: &key, value: &value };
        prop_assert_eq!(parse_response(&out), ResponseParse::Response(want, out.len()));
        for cut in 0..out.len() {
            prop_assert_eq!(parse_response(&out[..cut]), ResponseParse::Incomplete);
        }
    }

    #[test]
    fn parse_response_never_panics(buf in prop::collection::vec(any::<u8>(), 0..100)) {
        if let ResponseParse::Response(r, n) = parse_response(&buf) {
            prop_assert!(n <= buf.len());
            prop_assert_eq!(HEADER_LEN + r.extras.len() + r.key.len() + r.value.len(), n);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Composers, byte for byte against replies captured from the newest memcached (opaque
// 0x01020304; its version string is UNKNOWN in an untagged build).

const OPQ: u32 = 0x0102_0304;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn composed(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    f(&mut out);
    out
}

#[test]
fn compose_like_memcached() {
    use opcode::*;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "set ok",
            composed(|o| write_ok(o, SET, OPQ, 2)),
            "810100000000000000000000010203040000000000000002",
        ),
        (
            "get hit",
            composed(|o| write_get_hit(o, GET, OPQ, 2, 0xcafe, None, b"bar")),
            "8100000004000000000000070102030400000000000000020000cafe626172",
        ),
        (
            "getk hit",
            composed(|o| write_get_hit(o, GETK, OPQ, 2, 0xcafe, Some(b"foo"), b"bar")),
            "810c0003040000000000000a0102030400000000000000020000cafe666f6f626172",
        ),
        (
            "getkq hit",
            composed(|o| write_get_hit(o, GETKQ, OPQ, 2, 0xcafe, Some(b"foo"), b"bar")),
            "810d0003040000000000000a0102030400000000000000020000cafe666f6f626172",
        ),
        (
            "touch hit",
            composed(|o| write_get_hit(o, TOUCH, OPQ, 2, 0xcafe, None, b"")),
            "811c000004000000000000040102030400000000000000020000cafe",
        ),
        (
            "gatk hit",
            composed(|o| write_get_hit(o, GATK, OPQ, 2, 0xcafe, Some(b"foo"), b"bar")),
            "81230003040000000000000a0102030400000000000000020000cafe666f6f626172",
        ),
        (
            "get miss",
            composed(|o| write_get_miss(o, GET, OPQ, None)),
            "8100000000000001000000090102030400000000000000004e6f7420666f756e64",
        ),
        (
            "getk miss",
            composed(|o| write_get_miss(o, GETK, OPQ, Some(b"nope"))),
            "810c000400000001000000040102030400000000000000006e6f7065",
        ),
        (
            "gatk miss",
            composed(|o| write_get_miss(o, GATK, OPQ, Some(b"nope"))),
            "8123000400000001000000040102030400000000000000006e6f7065",
        ),
        (
            "touch miss",
            composed(|o| write_get_miss(o, TOUCH, OPQ, None)),
            "811c000000000001000000090102030400000000000000004e6f7420666f756e64",
        ),
        (
            "add exists",
            composed(|o| write_error(o, ADD, OPQ, Status::KeyExists)),
            "810200000000000200000014010203040000000000000000446174612065786973747320666f72206b65792e",
        ),
        (
            "appendq not stored",
            composed(|o| write_error(o, APPENDQ, OPQ, Status::NotStored)),
            "81190000000000050000000b0102030400000000000000004e6f742073746f7265642e",
        ),
        (
            "incr created 42",
            composed(|o| write_arith(o, INCREMENT, OPQ, 5, 42)),
            "810500000000000000000008010203040000000000000005000000000000002a",
        ),
        (
            "decr to 40",
            composed(|o| write_arith(o, DECREMENT, OPQ, 6, 40)),
            "8106000000000000000000080102030400000000000000060000000000000028",
        ),
        (
            "incr non-numeric",
            composed(|o| write_error(o, INCREMENT, OPQ, Status::DeltaBadValue)),
            "81050000000000060000002e0102030400000000000000004e6f6e2d6e756d65726963207365727665722d736964652076616c756520666f7220696e6372206f722064656372",
        ),
        (
            "delete ok",
            composed(|o| write_ok(o, DELETE, OPQ, 0)),
            "810400000000000000000000010203040000000000000000",
        ),
        (
            "flush ok",
            composed(|o| write_ok(o, FLUSH, OPQ, 0)),
            "810800000000000000000000010203040000000000000000",
        ),
        (
            "quit ok",
            composed(|o| write_ok(o, QUIT, OPQ, 0)),
            "810700000000000000000000010203040000000000000000",
        ),
        (
            "version",
            composed(|o| write_version(o, OPQ, "UNKNOWN")),
            "810b00000000000000000007010203040000000000000000554e4b4e4f574e",
        ),
        (
            "unknown command",
            composed(|o| write_error(o, VERBOSITY, OPQ, Status::UnknownCommand)),
            "811b0000000000810000000f010203040000000000000000556e6b6e6f776e20636f6d6d616e64",
        ),
        (
            "stat unknown group",
            composed(|o| write_error(o, STAT, OPQ, Status::KeyNotFound)),
            "8110000000000001000000090102030400000000000000004e6f7420666f756e64",
        ),
        (
            "stat packet",
            composed(|o| write_stat(o, OPQ, b"maxbytes", b"67108864")),
            "8110000800000000000000100102030400000000000000006d617862797465733637313038383634",
        ),
        (
            "stat packet formatted",
            composed(|o| write_stat_fmt(o, OPQ, b"maxbytes", 67_108_864u64)),
            "8110000800000000000000100102030400000000000000006d617862797465733637313038383634",
        ),
        (
            "stat end",
            composed(|o| write_stat_end(o, OPQ)),
            "811000000000000000000000010203040000000000000000",
        ),
        (
            "too large",
            composed(|o| write_error(o, SET, OPQ, Status::TooLarge)),
            "81010000000000030000000a010203040000000000000000546f6f206c617267652e",
        ),
        (
            "invalid arguments",
            composed(|o| write_error(o, DELETE, OPQ, Status::InvalidArguments)),
            "810400000000000400000011010203040000000000000000496e76616c696420617267756d656e7473",
        ),
        (
            "keylen > bodylen",
            composed(|o| write_error(o, GET, OPQ, Status::UnknownCommand)),
            "81000000000000810000000f010203040000000000000000556e6b6e6f776e20636f6d6d616e64",
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, hex(want), "{name}");
        // Every captured reply reads back as one whole response.
        assert!(
            matches!(parse_response(&got), ResponseParse::Response(_, n) if n == got.len()),
            "{name}"
        );
    }
}

#[test]
fn compose_headers_for_zero_copy_values() {
    let mut split = Vec::new();
    write_get_hit_header(&mut split, opcode::GETK, OPQ, 2, 0xcafe, Some(b"foo"), 3);
    split.extend_from_slice(b"bar");
    let mut whole = Vec::new();
    write_get_hit(
        &mut whole,
        opcode::GETK,
        OPQ,
        2,
        0xcafe,
        Some(b"foo"),
        b"bar",
    );
    assert_eq!(split, whole);
}

#[test]
fn compose_appends() {
    let mut out = b"prefix".to_vec();
    write_ok(&mut out, opcode::NOOP, 7, 0);
    write_error_message(
        &mut out,
        opcode::SET,
        7,
        Status::OutOfMemory,
        "Out of memory allocating item",
    );
    assert!(out.starts_with(b"prefix"));
    let mut rest = &out[6..];
    let mut seen = Vec::new();
    while let ResponseParse::Response(r, n) = parse_response(rest) {
        seen.push((r.opcode, r.status, r.value.to_vec()));
        rest = &rest[n..];
    }
    assert_eq!(
        seen,
        [
            (opcode::NOOP, 0, Vec::new()),
            (opcode::SET, 0x82, b"Out of memory allocating item".to_vec()),
        ]
    );
}

#[test]
fn status_codes_and_messages() {
    for code in 0..=u16::MAX {
        if let Some(s) = Status::from_code(code) {
            assert_eq!(s.code(), code);
        }
    }
    assert_eq!(Status::from_code(0x81), Some(Status::UnknownCommand));
    assert_eq!(Status::from_code(0x07), None);
    assert_eq!(Status::InvalidArguments.message(), "Invalid arguments");
    assert_eq!(Status::Success.message(), "");
}

#[test]
fn parse_response_rejects() {
    assert_eq!(parse_response(&[0x81; 10]), ResponseParse::Incomplete);
    let mut bad = composed(|o| write_ok(o, opcode::NOOP, 0, 0));
    bad[0] = REQUEST_MAGIC;
    assert_eq!(parse_response(&bad), ResponseParse::Invalid);
    let mut short_body = composed(|o| write_ok(o, opcode::NOOP, 0, 0));
    short_body[3] = 1; // a 1-byte key in a 0-byte body
    assert_eq!(parse_response(&short_body), ResponseParse::Invalid);
}

#[test]
fn request_len_hint_sizes_storage_requests_only() {
    let mut set = Vec::new();
    crate::client::binary::set(&mut set, b"key", 0, 0, &[b'v'; 1000], 1);
    // The header alone tells the whole request's length.
    assert_eq!(request_len_hint(&set[..HEADER_LEN]), Some(set.len()));
    assert_eq!(request_len_hint(&set[..HEADER_LEN - 1]), None);
    let mut get = Vec::new();
    crate::client::binary::get(&mut get, b"key", false, 1);
    assert_eq!(request_len_hint(&get), None);
    let mut huge = set.clone();
    huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(request_len_hint(&huge), None, "beyond MAX_BODY_LEN");
    let mut response = set.clone();
    response[0] = RESPONSE_MAGIC;
    assert_eq!(request_len_hint(&response), None);
}
