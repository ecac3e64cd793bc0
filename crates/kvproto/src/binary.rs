//! memcached's binary protocol: request parsing and response composing.
//!
//! [`parse`] looks at the front of a connection's read buffer and returns one request and the
//! number of bytes it occupied, or [`Parse::Incomplete`] when more bytes are needed. It borrows
//! the key and value from the buffer (no copies, no allocation), runs in constant time (it never
//! scans), and never panics.
//!
//! The composers append memcached's exact response packets to a `Vec<u8>`; they allocate nothing
//! beyond growing that vector.
//!
//! # Packets
//!
//! Every packet starts with a 24-byte header, all fields big-endian:
//!
//! ```text
//! 0 magic (0x80 request, 0x81 response)   1 opcode         2-3 key length
//! 4 extras length     5 data type (0)     6-7 vbucket (request) / status (response)
//! 8-11 total body length (extras + key + value)            12-15 opaque (echoed back)
//! 16-23 CAS
//! ```
//!
//! followed by the extras, the key and the value, in that order.
//!
//! # Whose behaviour
//!
//! The parser follows the newest memcached (1.6.4x, `proto_bin.c`), quirks included:
//!
//! - memcached reads the 24-byte header and checks the magic byte, then reads the extras and
//!   the key before it looks at anything else, so every other verdict below waits for those
//!   bytes ([`Parse::Incomplete`]). It keeps
//!   them in a fixed 16 KiB read buffer: a header whose extras and key cannot fit
//!   ([`MAX_HEAD_LEN`]) can never be served, and memcached closes the connection once its
//!   buffer is full; here that is an immediate [`Parse::Close`].
//! - A first byte other than `0x80` closes the connection without a reply ([`Parse::Close`]).
//!   memcached also drops replies still queued from the same read (a `noop` flushes them).
//! - Then, in this order, each answered with an error packet after which the connection is
//!   closed: key + extras longer than the body (`0x81` Unknown command), a body over 1 GiB
//!   (`0x04`; 1.6.18 has no such check), a key over 250 bytes (`0x04`), and per-opcode checks
//!   of extras length, key and value presence (`0x04` Invalid arguments).
//! - An unknown opcode (including `verbosity`, 0x1b, which memcached 1.6 dropped, and the
//!   range opcodes 0x30-0x3c) is answered `0x81` Unknown command and the connection stays
//!   open. memcached then swallows `body length` bytes *after* the extras and key it has
//!   already consumed, so it eats the first `extras + key` bytes of whatever follows; this
//!   parser reports the same `swallow` so that the byte streams stay in step.
//! - `touch`/`gat*` do not check the body length against extras + key, and `stat` does not
//!   check it against the key: anything beyond is parsed as the next request.
//! - Quiet opcodes (`getq`, `setq`, ...) silence success only (for the `get` family: misses
//!   only); errors are always sent. A reply echoes the opcode *as sent* and the opaque.
//! - Binary keys are any bytes (spaces and control bytes included), 1 to 250 of them.
//! - `set`/`add`/`replace` with a non-zero CAS are compare-and-swap operations, whatever the
//!   opcode ([`StoreMode::Cas`]); `append`/`prepend` with a non-zero CAS are checked against it.
//! - Exptimes are unsigned 32-bit numbers (never negative, unlike the text protocol's).
//! - With flush disabled (`-F`), `flush` is answered `0x20` Auth failure (connection open).
//! - The SASL opcodes are parsed; memcached without SASL (`-S`) answers them `0x81` Unknown
//!   command after the same validation, keeping the connection open.

use crate::text::StoreMode;
use crate::MAX_KEY_LEN;

pub use crate::text::Limits;

/// Length of a packet header.
pub const HEADER_LEN: usize = 24;

/// First byte of a request.
pub const REQUEST_MAGIC: u8 = 0x80;

/// First byte of a response.
pub const RESPONSE_MAGIC: u8 = 0x81;

/// memcached's per-connection read buffer: the header, extras and key of a request must fit in
/// it. A request whose header declares more closes the connection ([`Parse::Close`]).
pub const MAX_HEAD_LEN: usize = 16384;

/// Largest total body length memcached accepts (its `ITEM_SIZE_MAX_UPPER_LIMIT`, 1 GiB); a
/// longer one is answered `0x04` Invalid arguments and the connection is closed.
pub const MAX_BODY_LEN: u32 = 1 << 30;

/// The opcodes memcached 1.6 knows.
pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    /// Not implemented by memcached 1.6 (answered Unknown command).
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
    /// kvcached's own: a replica's pull (the text protocol's `replpull`), for masters that
    /// speak only the binary protocol (`-S`). Key: `<replid> <name>`; value: the cursor.
    /// The reply's key is the master's replid and its value the batch.
    pub const REPL_PULL: u8 = 0xe0;
}

/// A response status, with memcached's default message for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    Success = 0x00,
    /// `Not found`.
    KeyNotFound = 0x01,
    /// `Data exists for key.`
    KeyExists = 0x02,
    /// `Too large.`
    TooLarge = 0x03,
    /// `Invalid arguments`.
    InvalidArguments = 0x04,
    /// `Not stored.`
    NotStored = 0x05,
    /// `Non-numeric server-side value for incr or decr`.
    DeltaBadValue = 0x06,
    /// `Auth failure.`
    AuthError = 0x20,
    /// SASL step needed (no default message).
    AuthContinue = 0x21,
    /// `Unknown command`.
    UnknownCommand = 0x81,
    /// `Out of memory` (memcached usually sends a specific message instead).
    OutOfMemory = 0x82,
}

impl Status {
    /// The wire value.
    pub const fn code(self) -> u16 {
        self as u16
    }

    /// The body memcached sends with this status when it has no more specific message.
    pub const fn message(self) -> &'static str {
        match self {
            Status::Success | Status::AuthContinue => "",
            Status::KeyNotFound => "Not found",
            Status::KeyExists => "Data exists for key.",
            Status::TooLarge => "Too large.",
            Status::InvalidArguments => "Invalid arguments",
            Status::NotStored => "Not stored.",
            Status::DeltaBadValue => "Non-numeric server-side value for incr or decr",
            Status::AuthError => "Auth failure.",
            Status::UnknownCommand => "Unknown command",
            Status::OutOfMemory => "Out of memory",
        }
    }

    /// The status with this wire value, if memcached defines it.
    pub const fn from_code(code: u16) -> Option<Status> {
        Some(match code {
            0x00 => Status::Success,
            0x01 => Status::KeyNotFound,
            0x02 => Status::KeyExists,
            0x03 => Status::TooLarge,
            0x04 => Status::InvalidArguments,
            0x05 => Status::NotStored,
            0x06 => Status::DeltaBadValue,
            0x20 => Status::AuthError,
            0x21 => Status::AuthContinue,
            0x81 => Status::UnknownCommand,
            0x82 => Status::OutOfMemory,
            _ => return None,
        })
    }
}

/// What a request asks for, with its extras decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `get`/`getq`/`getk`/`getkq`: a hit is answered with the flags as extras and the value
    /// (and the key when `with_key`); see [`write_get_hit`] and [`write_get_miss`].
    Get { with_key: bool },
    /// `gat`/`gatq`/`gatk`/`gatkq`: get and set a new exptime.
    GetAndTouch { with_key: bool, exptime: i64 },
    /// `touch`: a hit is answered with the flags as extras and no value.
    Touch { exptime: i64 },
    /// `set`/`add`/`replace` (flags and exptime from the extras; mode [`StoreMode::Cas`] when
    /// the request's CAS is non-zero) and `append`/`prepend` (no extras: flags and exptime 0;
    /// a non-zero CAS must match). The data is [`Request::value`].
    Store {
        mode: StoreMode,
        flags: u32,
        exptime: i64,
    },
    /// `delete` (a non-zero CAS must match).
    Delete,
    /// `increment`/`decrement`. On a miss, the item is created with `initial` and `exptime`
    /// unless `create` is false (exptime `0xffffffff` on the wire), which answers Not found.
    /// The reply's body is the new value as 8 big-endian bytes ([`write_arith`]).
    Arith {
        incr: bool,
        delta: u64,
        initial: u64,
        exptime: i64,
        create: bool,
    },
    /// `quit`/`quitq`: reply (unless quiet), then close.
    Quit,
    /// `flush`/`flushq`, with the exptime from the optional extras (0 without).
    Flush { exptime: i64 },
    /// `noop`: reply at once; memcached flushes queued replies here.
    Noop,
    /// `version`: the version string is the reply's value.
    Version,
    /// `stat`: the key is the group (empty for the general stats). memcached matches `reset`,
    /// `settings` and `detail` by prefix (`resetxyz` is `reset`) and otherwise the whole key
    /// (`items`, `slabs`, `sizes`, `conns`, ...); an unknown group is Not found. The reply is
    /// one packet per stat ([`write_stat`]) and an empty one at the end ([`write_stat_end`]).
    Stat,
    /// `sasl list mechs`.
    SaslListMechs,
    /// `sasl auth`: the key is the mechanism, the value the client's data.
    SaslAuth,
    /// `sasl step`: as [`Command::SaslAuth`].
    SaslStep,
    /// kvcached's replication pull ([`opcode::REPL_PULL`]): the key is `<replid> <name>`,
    /// the value the replica's cursor.
    ReplPull,
}

/// One parsed request. Byte slices borrow from the buffer given to [`parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The opcode as sent (quiet forms included); replies echo it.
    pub opcode: u8,
    /// Echoed in every reply to this request.
    pub opaque: u32,
    /// The request's CAS (0 for none).
    pub cas: u64,
    /// A quiet opcode: send no reply on success (for the `get` family: on a miss). Errors are
    /// always sent.
    pub quiet: bool,
    /// The key: 1 to 250 bytes, except for `stat` (0 to 250) and the commands that take none.
    pub key: &'a [u8],
    pub command: Command,
    /// The value of a store or SASL request; empty for the others.
    pub value: &'a [u8],
}

/// The result of looking at the front of a read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse<'a> {
    /// A whole request, which occupied the first `usize` bytes.
    Request(Request<'a>, usize),
    /// More bytes are needed; nothing was consumed.
    Incomplete,
    /// A bad request: send `status` with its default message ([`write_error`], echoing
    /// `opcode` and `opaque`) whether or not the opcode is quiet. Then close the connection if
    /// `close`; otherwise drop the first `consumed` bytes, discard `swallow` further bytes as
    /// they arrive, and carry on.
    Error {
        opcode: u8,
        opaque: u32,
        status: Status,
        close: bool,
        consumed: usize,
        swallow: usize,
    },
    /// A request carrying a value longer than [`Limits::max_value`]: send `status` (Too large
    /// for the storage commands; Unknown command for the SASL ones, as memcached without SASL)
    /// with [`write_error`], drop the first `consumed` bytes (header, extras and key) and then
    /// discard `swallow` further bytes (the value) as they arrive. For `set`/`setq`, memcached
    /// also removes the old item under `key`.
    TooLarge {
        opcode: u8,
        opaque: u32,
        status: Status,
        key: &'a [u8],
        consumed: usize,
        swallow: usize,
    },
    /// Close the connection without a reply (a bad magic byte, or a header whose extras and
    /// key cannot fit in [`MAX_HEAD_LEN`]).
    Close,
}

/// The fixed fields of a request header.
struct Header {
    magic: u8,
    opcode: u8,
    keylen: u16,
    extlen: u8,
    bodylen: u32,
    opaque: u32,
    cas: u64,
}

impl Header {
    fn decode(h: &[u8; HEADER_LEN]) -> Header {
        Header {
            magic: h[0],
            opcode: h[1],
            keylen: u16::from_be_bytes([h[2], h[3]]),
            extlen: h[4],
            bodylen: be32(h, 8),
            opaque: be32(h, 12),
            cas: be64(h, 16),
        }
    }
}

/// Reads a big-endian `u32` at `at` in `b` (0 when out of range, which validation excludes).
fn be32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_be_bytes(w)
}

/// Reads a big-endian `u64` at `at` in `b` (0 when out of range, which validation excludes).
fn be64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        w.copy_from_slice(s);
    }
    u64::from_be_bytes(w)
}

/// The non-quiet opcode for a quiet one, and whether it was quiet.
fn unquiet(op: u8) -> (u8, bool) {
    use opcode::*;
    let base = match op {
        GETQ => GET,
        GETKQ => GETK,
        SETQ => SET,
        ADDQ => ADD,
        REPLACEQ => REPLACE,
        DELETEQ => DELETE,
        INCREMENTQ => INCREMENT,
        DECREMENTQ => DECREMENT,
        QUITQ => QUIT,
        FLUSHQ => FLUSH,
        APPENDQ => APPEND,
        PREPENDQ => PREPEND,
        GATQ => GAT,
        GATKQ => GATK,
        _ => return (op, false),
    };
    (base, true)
}

/// How a valid request occupies the buffer beyond its header, extras and key.
enum Body {
    /// Nothing more is part of it (any further body bytes are the next request).
    None,
    /// A value of this many bytes follows.
    Value(usize),
}

/// How many bytes the storage request (set, add, replace, append, prepend, or a quiet one)
/// at the front of `buf` takes, header and body, once its header is there and names a body
/// the parser could accept (`MAX_BODY_LEN`), so that a server need not grow its buffer past
/// it nor parse the request again before it is whole. None for other requests. Only a hint:
/// the parser decides.
pub fn request_len_hint(buf: &[u8]) -> Option<usize> {
    use opcode::*;
    let h = Header::decode(buf.get(..HEADER_LEN)?.try_into().ok()?);
    let storage = matches!(unquiet(h.opcode).0, SET | ADD | REPLACE | APPEND | PREPEND);
    (h.magic == REQUEST_MAGIC && storage && h.bodylen <= MAX_BODY_LEN)
        .then(|| HEADER_LEN + h.bodylen as usize)
}

/// Parse one request from the front of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parse<'a> {
    let Some(Ok(h)) = buf.get(..HEADER_LEN).map(<&[u8; HEADER_LEN]>::try_from) else {
        return Parse::Incomplete;
    };
    let h = Header::decode(h);
    if h.magic != REQUEST_MAGIC {
        return Parse::Close;
    }
    let extlen = usize::from(h.extlen);
    let keylen = usize::from(h.keylen);
    let head_len = HEADER_LEN + extlen + keylen;
    if head_len > MAX_HEAD_LEN {
        return Parse::Close;
    }
    let (Some(extras), Some(key)) = (
        buf.get(HEADER_LEN..HEADER_LEN + extlen),
        buf.get(HEADER_LEN + extlen..head_len),
    ) else {
        return Parse::Incomplete;
    };
    let fail = |status, close, swallow| Parse::Error {
        opcode: h.opcode,
        opaque: h.opaque,
        status,
        close,
        consumed: head_len,
        swallow,
    };
    let bodylen = h.bodylen as usize;
    // Both fit in u32 arithmetic: extlen + keylen < 2^17.
    if u32::from(h.keylen) + u32::from(h.extlen) > h.bodylen {
        return fail(Status::UnknownCommand, true, 0);
    }
    if h.bodylen > MAX_BODY_LEN {
        return fail(Status::InvalidArguments, true, 0);
    }
    if keylen > MAX_KEY_LEN {
        return fail(Status::InvalidArguments, true, 0);
    }
    let rest = bodylen - extlen - keylen;
    let (base, quiet) = unquiet(h.opcode);
    let has_key = keylen > 0;
    let exact = rest == 0;
    use opcode::*;
    let (command, body) = match base {
        VERSION if extlen == 0 && keylen == 0 && exact => (Command::Version, Body::None),
        NOOP if extlen == 0 && keylen == 0 && exact => (Command::Noop, Body::None),
        QUIT if extlen == 0 && keylen == 0 && exact => (Command::Quit, Body::None),
        SASL_LIST_MECHS if extlen == 0 && keylen == 0 && exact => {
            (Command::SaslListMechs, Body::None)
        }
        FLUSH if keylen == 0 && exact && (extlen == 0 || extlen == 4) => {
            if !limits.flush_enabled {
                return fail(Status::AuthError, false, 0);
            }
            let exptime = if extlen == 4 { be32(extras, 0) } else { 0 };
            (
                Command::Flush {
                    exptime: i64::from(exptime),
                },
                Body::None,
            )
        }
        SET | ADD | REPLACE if extlen == 8 && has_key => {
            let mode = if h.cas != 0 {
                StoreMode::Cas
            } else if base == SET {
                StoreMode::Set
            } else if base == ADD {
                StoreMode::Add
            } else {
                StoreMode::Replace
            };
            let command = Command::Store {
                mode,
                flags: be32(extras, 0),
                exptime: i64::from(be32(extras, 4)),
            };
            (command, Body::Value(rest))
        }
        APPEND | PREPEND if extlen == 0 && has_key => {
            let mode = if base == APPEND {
                StoreMode::Append
            } else {
                StoreMode::Prepend
            };
            let command = Command::Store {
                mode,
                flags: 0,
                exptime: 0,
            };
            (command, Body::Value(rest))
        }
        GET | GETK if extlen == 0 && has_key && exact => (
            Command::Get {
                with_key: base == GETK,
            },
            Body::None,
        ),
        DELETE if extlen == 0 && has_key && exact => (Command::Delete, Body::None),
        INCREMENT | DECREMENT if extlen == 20 && has_key && exact => {
            let exptime = be32(extras, 16);
            let command = Command::Arith {
                incr: base == INCREMENT,
                delta: be64(extras, 0),
                initial: be64(extras, 8),
                exptime: i64::from(exptime),
                create: exptime != u32::MAX,
            };
            (command, Body::None)
        }
        TOUCH if extlen == 4 && has_key => (
            Command::Touch {
                exptime: i64::from(be32(extras, 0)),
            },
            Body::None,
        ),
        GAT | GATK if extlen == 4 && has_key => (
            Command::GetAndTouch {
                with_key: base == GATK,
                exptime: i64::from(be32(extras, 0)),
            },
            Body::None,
        ),
        STAT if extlen == 0 => (Command::Stat, Body::None),
        SASL_AUTH | SASL_STEP if extlen == 0 && has_key => {
            let command = if base == SASL_AUTH {
                Command::SaslAuth
            } else {
                Command::SaslStep
            };
            (command, Body::Value(rest))
        }
        REPL_PULL if extlen == 0 && has_key => (Command::ReplPull, Body::Value(rest)),
        VERSION | NOOP | QUIT | SASL_LIST_MECHS | FLUSH | SET | ADD | REPLACE | APPEND
        | PREPEND | GET | GETK | DELETE | INCREMENT | DECREMENT | TOUCH | GAT | GATK | STAT
        | SASL_AUTH | SASL_STEP | REPL_PULL => return fail(Status::InvalidArguments, true, 0),
        _ => return fail(Status::UnknownCommand, false, bodylen),
    };
    let (value, consumed) = match body {
        Body::None => (&[][..], head_len),
        Body::Value(len) => {
            if len > limits.max_value {
                let status = if matches!(command, Command::SaslAuth | Command::SaslStep) {
                    Status::UnknownCommand
                } else {
                    Status::TooLarge
                };
                return Parse::TooLarge {
                    opcode: h.opcode,
                    opaque: h.opaque,
                    status,
                    key,
                    consumed: head_len,
                    swallow: len,
                };
            }
            match buf.get(head_len..head_len + len) {
                Some(value) => (value, head_len + len),
                None => return Parse::Incomplete,
            }
        }
    };
    let request = Request {
        opcode: h.opcode,
        opaque: h.opaque,
        cas: h.cas,
        quiet,
        key,
        command,
        value,
    };
    Parse::Request(request, consumed)
}

// ---------------------------------------------------------------------------------------------
// Responses.

/// Appends a response header. `body_len` is the total of extras, key and value, which the
/// caller appends (or sends from elsewhere) next.
#[allow(clippy::too_many_arguments)]
pub fn write_header(
    out: &mut Vec<u8>,
    opcode: u8,
    status: Status,
    opaque: u32,
    cas: u64,
    extras_len: u8,
    key_len: u16,
    body_len: u32,
) {
    out.reserve(HEADER_LEN);
    out.push(RESPONSE_MAGIC);
    out.push(opcode);
    out.extend_from_slice(&key_len.to_be_bytes());
    out.push(extras_len);
    out.push(0); // data type: raw bytes
    out.extend_from_slice(&status.code().to_be_bytes());
    out.extend_from_slice(&body_len.to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
}

/// Appends a whole response packet. Lengths beyond the header fields' range (extras over 255
/// bytes, a key over 65,535, a body over 4 GiB) are the caller's bug; they are truncated in the
/// header.
#[allow(clippy::too_many_arguments)]
pub fn write_response(
    out: &mut Vec<u8>,
    opcode: u8,
    status: Status,
    opaque: u32,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    let body_len = extras.len() + key.len() + value.len();
    out.reserve(HEADER_LEN + body_len);
    write_header(
        out,
        opcode,
        status,
        opaque,
        cas,
        extras.len() as u8,
        key.len() as u16,
        body_len as u32,
    );
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// An error response: `status` with its default message as the value, CAS 0. memcached sends
/// these for quiet opcodes too.
pub fn write_error(out: &mut Vec<u8>, opcode: u8, opaque: u32, status: Status) {
    write_error_message(out, opcode, opaque, status, status.message());
}

/// An error response with a specific message, e.g. `Out of memory allocating item` with
/// [`Status::OutOfMemory`] (memcached strips the text protocol's `SERVER_ERROR ` prefix).
pub fn write_error_message(out: &mut Vec<u8>, opcode: u8, opaque: u32, status: Status, msg: &str) {
    write_response(out, opcode, status, opaque, 0, &[], &[], msg.as_bytes());
}

/// A success response with an empty body: `set`, `delete`, `append`, `flush`, `noop`, `quit`
/// (`cas` is the new item's CAS for the storage commands, 0 for the others).
pub fn write_ok(out: &mut Vec<u8>, opcode: u8, opaque: u32, cas: u64) {
    write_header(out, opcode, Status::Success, opaque, cas, 0, 0, 0);
}

/// The header of a `get`-family hit, `touch` hit or `gat` hit, followed by the flags extras and
/// the key when `key` is given (`getk`, `getkq`, `gatk`, `gatkq`); the caller then appends or
/// sends the `value_len` bytes of the value (0 for `touch`).
pub fn write_get_hit_header(
    out: &mut Vec<u8>,
    opcode: u8,
    opaque: u32,
    cas: u64,
    flags: u32,
    key: Option<&[u8]>,
    value_len: usize,
) {
    let key = key.unwrap_or_default();
    let body_len = 4 + key.len() + value_len;
    out.reserve(HEADER_LEN + 4 + key.len());
    write_header(
        out,
        opcode,
        Status::Success,
        opaque,
        cas,
        4,
        key.len() as u16,
        body_len as u32,
    );
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(key);
}

/// A whole `get`-family (or `gat`, or `touch` with an empty value) hit: flags as extras, the
/// key when `key` is given, the value.
pub fn write_get_hit(
    out: &mut Vec<u8>,
    opcode: u8,
    opaque: u32,
    cas: u64,
    flags: u32,
    key: Option<&[u8]>,
    value: &[u8],
) {
    out.reserve(HEADER_LEN + 4 + key.map_or(0, <[u8]>::len) + value.len());
    write_get_hit_header(out, opcode, opaque, cas, flags, key, value.len());
    out.extend_from_slice(value);
}

/// A `get`-family, `gat` or `touch` miss (not sent for the quiet forms). With `key`
/// (`getk`/`gatk`) memcached sends the key as the key and no message; without, the error
/// `Not found`.
pub fn write_get_miss(out: &mut Vec<u8>, opcode: u8, opaque: u32, key: Option<&[u8]>) {
    match key {
        Some(key) => write_response(out, opcode, Status::KeyNotFound, opaque, 0, &[], key, &[]),
        None => write_error(out, opcode, opaque, Status::KeyNotFound),
    }
}

/// The reply to a successful `increment`/`decrement`: the new value as 8 big-endian bytes.
pub fn write_arith(out: &mut Vec<u8>, opcode: u8, opaque: u32, cas: u64, value: u64) {
    write_response(
        out,
        opcode,
        Status::Success,
        opaque,
        cas,
        &[],
        &[],
        &value.to_be_bytes(),
    );
}

/// The reply to `version`.
pub fn write_version(out: &mut Vec<u8>, opaque: u32, version: &str) {
    write_response(
        out,
        opcode::VERSION,
        Status::Success,
        opaque,
        0,
        &[],
        &[],
        version.as_bytes(),
    );
}

/// One stat of a `stat` reply: the name as the key, the value as the value.
pub fn write_stat(out: &mut Vec<u8>, opaque: u32, name: &[u8], value: &[u8]) {
    write_response(
        out,
        opcode::STAT,
        Status::Success,
        opaque,
        0,
        &[],
        name,
        value,
    );
}

/// One stat whose value is formatted from `value` (no allocation beyond growing `out`).
pub fn write_stat_fmt(out: &mut Vec<u8>, opaque: u32, name: &[u8], value: impl core::fmt::Display) {
    use std::io::Write as _;
    let start = out.len();
    write_header(out, opcode::STAT, Status::Success, opaque, 0, 0, 0, 0);
    out.extend_from_slice(name);
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{value}");
    let body_len = out.len() - start - HEADER_LEN;
    if let Some(h) = out.get_mut(start..start + HEADER_LEN) {
        let [_, _, k0, k1, _, _, _, _, b0, b1, b2, b3, ..] = h else {
            return;
        };
        [*k0, *k1] = (name.len() as u16).to_be_bytes();
        [*b0, *b1, *b2, *b3] = (body_len as u32).to_be_bytes();
    }
}

/// The empty packet that ends a `stat` reply.
pub fn write_stat_end(out: &mut Vec<u8>, opaque: u32) {
    write_ok(out, opcode::STAT, opaque, 0);
}

/// Appends a request packet (for clients and tests). Lengths beyond the header fields' range
/// are truncated in the header, as in [`write_response`].
pub fn write_request(
    out: &mut Vec<u8>,
    opcode: u8,
    opaque: u32,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    let body_len = extras.len() + key.len() + value.len();
    out.reserve(HEADER_LEN + body_len);
    out.push(REQUEST_MAGIC);
    out.push(opcode);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.extend_from_slice(&[0, 0, 0]); // data type, vbucket
    out.extend_from_slice(&(body_len as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

// ---------------------------------------------------------------------------------------------
// Reading responses (for clients and tests).

/// One response packet. Byte slices borrow from the buffer given to [`parse_response`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response<'a> {
    pub opcode: u8,
    /// The raw status ([`Status::from_code`] names the known ones).
    pub status: u16,
    pub opaque: u32,
    pub cas: u64,
    pub extras: &'a [u8],
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// The result of looking for a response at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseParse<'a> {
    /// A whole response, which occupied the first `usize` bytes.
    Response(Response<'a>, usize),
    /// More bytes are needed.
    Incomplete,
    /// Not a response: a bad magic byte, or extras and key longer than the body.
    Invalid,
}

/// Parse one response packet from the front of `buf`.
pub fn parse_response(buf: &[u8]) -> ResponseParse<'_> {
    let Some(Ok(h)) = buf.get(..HEADER_LEN).map(<&[u8; HEADER_LEN]>::try_from) else {
        return ResponseParse::Incomplete;
    };
    let status = u16::from_be_bytes([h[6], h[7]]);
    let h = Header::decode(h);
    let (extlen, keylen, bodylen) = (
        usize::from(h.extlen),
        usize::from(h.keylen),
        h.bodylen as usize,
    );
    if h.magic != RESPONSE_MAGIC || extlen + keylen > bodylen {
        return ResponseParse::Invalid;
    }
    let Some(body) = buf.get(HEADER_LEN..HEADER_LEN + bodylen) else {
        return ResponseParse::Incomplete;
    };
    let Some((extras, rest)) = body.split_at_checked(extlen) else {
        return ResponseParse::Invalid;
    };
    let Some((key, value)) = rest.split_at_checked(keylen) else {
        return ResponseParse::Invalid;
    };
    let response = Response {
        opcode: h.opcode,
        status,
        opaque: h.opaque,
        cas: h.cas,
        extras,
        key,
        value,
    };
    ResponseParse::Response(response, HEADER_LEN + bodylen)
}

#[cfg(test)]
mod tests;
