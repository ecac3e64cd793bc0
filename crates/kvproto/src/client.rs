//! The client side of the text protocol: composing requests and parsing replies, as a load
//! generator or a test needs them.
//!
//! The composers append one request's exact bytes to a caller's `Vec<u8>`. [`parse_reply`]
//! looks at the front of a connection's read buffer and returns one reply line (or one
//! `VALUE` item with its data block) and the number of bytes it occupied, or
//! [`ParseReply::Incomplete`] when more bytes are needed. It borrows from the buffer, never
//! allocates and never panics: a reply it cannot make sense of is [`ParseReply::Invalid`],
//! after which the caller should close the connection (there is no way to resynchronise with
//! a server that sends garbage).
//!
//! A retrieval (`get`, `gets`, multiget) answers with zero or more [`Reply::Value`] items and
//! then [`Reply::End`]; the caller counts the items between them. This module does not track
//! which request a reply belongs to: that is the connection's job (replies come in request
//! order on one connection).
//!
//! The binary protocol lives in [`binary`]. The meta protocol (memcached 1.6:
//! `mg`/`ms`/`md`/`mn`) has its own composers and its own
//! parser, [`parse_meta_reply`], with the same incremental contract; a connection may mix
//! both kinds of command, and the caller knows which parser the next reply needs.
//!
//! It must not do I/O, and it knows nothing of workloads or timing.

use std::io::Write as _;

/// A reply line longer than this without a newline is invalid (memcached's longest lines,
/// `VALUE` headers with a 250-byte key and `SERVER_ERROR` messages, are far shorter).
pub const MAX_REPLY_LINE: usize = 2048;

// ---------------------------------------------------------------------------------------------
// Composing requests
// ---------------------------------------------------------------------------------------------

fn push_u64(buf: &mut Vec<u8>, n: u64) {
    // Writing to a Vec cannot fail.
    let _ = write!(buf, "{n}");
}

fn push_i64(buf: &mut Vec<u8>, n: i64) {
    let _ = write!(buf, "{n}");
}

fn push_noreply(buf: &mut Vec<u8>, noreply: bool) {
    if noreply {
        buf.extend_from_slice(b" noreply");
    }
    buf.extend_from_slice(b"\r\n");
}

/// `get <key>\r\n`.
pub fn get(buf: &mut Vec<u8>, key: &[u8]) {
    buf.extend_from_slice(b"get ");
    buf.extend_from_slice(key);
    buf.extend_from_slice(b"\r\n");
}

/// `get <key> <key> ...\r\n` (or `gets` with `with_cas`). With no keys it writes nothing and
/// returns false (memcached answers a bare `get` with `ERROR`).
pub fn multiget<'k, I>(buf: &mut Vec<u8>, with_cas: bool, keys: I) -> bool
where
    I: IntoIterator<Item = &'k [u8]>,
{
    let start = buf.len();
    buf.extend_from_slice(if with_cas { b"gets" } else { b"get" });
    let mut any = false;
    for key in keys {
        buf.push(b' ');
        buf.extend_from_slice(key);
        any = true;
    }
    if !any {
        buf.truncate(start);
        return false;
    }
    buf.extend_from_slice(b"\r\n");
    true
}

/// The storage commands a client can send (`cas` has its own composer, [`cas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
}

impl Store {
    fn name(self) -> &'static [u8] {
        match self {
            Store::Set => b"set",
            Store::Add => b"add",
            Store::Replace => b"replace",
            Store::Append => b"append",
            Store::Prepend => b"prepend",
        }
    }
}

fn store_header(buf: &mut Vec<u8>, name: &[u8], key: &[u8], flags: u32, exptime: i64, len: usize) {
    buf.extend_from_slice(name);
    buf.push(b' ');
    buf.extend_from_slice(key);
    buf.push(b' ');
    push_u64(buf, u64::from(flags));
    buf.push(b' ');
    push_i64(buf, exptime);
    buf.push(b' ');
    push_u64(buf, len as u64);
}

/// `<cmd> <key> <flags> <exptime> <bytes> [noreply]\r\n<data>\r\n`.
pub fn store(
    buf: &mut Vec<u8>,
    cmd: Store,
    key: &[u8],
    flags: u32,
    exptime: i64,
    data: &[u8],
    noreply: bool,
) {
    store_header(buf, cmd.name(), key, flags, exptime, data.len());
    push_noreply(buf, noreply);
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\r\n");
}

/// `set <key> <flags> <exptime> <bytes> [noreply]\r\n<data>\r\n`.
pub fn set(buf: &mut Vec<u8>, key: &[u8], flags: u32, exptime: i64, data: &[u8], noreply: bool) {
    store(buf, Store::Set, key, flags, exptime, data, noreply);
}

/// `cas <key> <flags> <exptime> <bytes> <unique> [noreply]\r\n<data>\r\n`.
pub fn cas(
    buf: &mut Vec<u8>,
    key: &[u8],
    flags: u32,
    exptime: i64,
    data: &[u8],
    unique: u64,
    noreply: bool,
) {
    store_header(buf, b"cas", key, flags, exptime, data.len());
    buf.push(b' ');
    push_u64(buf, unique);
    push_noreply(buf, noreply);
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\r\n");
}

/// `delete <key> [noreply]\r\n`.
pub fn delete(buf: &mut Vec<u8>, key: &[u8], noreply: bool) {
    buf.extend_from_slice(b"delete ");
    buf.extend_from_slice(key);
    push_noreply(buf, noreply);
}

/// `touch <key> <exptime> [noreply]\r\n`.
pub fn touch(buf: &mut Vec<u8>, key: &[u8], exptime: i64, noreply: bool) {
    buf.extend_from_slice(b"touch ");
    buf.extend_from_slice(key);
    buf.push(b' ');
    push_i64(buf, exptime);
    push_noreply(buf, noreply);
}

/// `gat <exptime> <key>\r\n`: get the item and set its expiry (a `get`'s reply).
pub fn gat(buf: &mut Vec<u8>, exptime: i64, key: &[u8]) {
    buf.extend_from_slice(b"gat ");
    push_i64(buf, exptime);
    buf.push(b' ');
    buf.extend_from_slice(key);
    buf.extend_from_slice(b"\r\n");
}

/// `incr <key> <delta> [noreply]\r\n`, or `decr` when `incr` is false.
pub fn arith(buf: &mut Vec<u8>, incr: bool, key: &[u8], delta: u64, noreply: bool) {
    buf.extend_from_slice(if incr { b"incr " } else { b"decr " });
    buf.extend_from_slice(key);
    buf.push(b' ');
    push_u64(buf, delta);
    push_noreply(buf, noreply);
}

/// `stats [args]\r\n`; `args` is appended after a space when not empty.
pub fn stats(buf: &mut Vec<u8>, args: &[u8]) {
    buf.extend_from_slice(b"stats");
    if !args.is_empty() {
        buf.push(b' ');
        buf.extend_from_slice(args);
    }
    buf.extend_from_slice(b"\r\n");
}

/// `version\r\n`.
pub fn version(buf: &mut Vec<u8>) {
    buf.extend_from_slice(b"version\r\n");
}

/// `flush_all\r\n`.
pub fn flush_all(buf: &mut Vec<u8>) {
    buf.extend_from_slice(b"flush_all\r\n");
}

// ---------------------------------------------------------------------------------------------
// Composing meta requests (memcached 1.6's meta protocol; `flags` are the space-separated
// flag tokens, e.g. `b"v"`, `b"v q"`, `b"T30"`, or empty)
// ---------------------------------------------------------------------------------------------

fn push_flags(buf: &mut Vec<u8>, flags: &[u8]) {
    if !flags.is_empty() {
        buf.push(b' ');
        buf.extend_from_slice(flags);
    }
    buf.extend_from_slice(b"\r\n");
}

/// `mg <key> [flags]\r\n`.
pub fn meta_get(buf: &mut Vec<u8>, key: &[u8], flags: &[u8]) {
    buf.extend_from_slice(b"mg ");
    buf.extend_from_slice(key);
    push_flags(buf, flags);
}

/// `ms <key> <datalen> [flags]\r\n<data>\r\n`.
pub fn meta_set(buf: &mut Vec<u8>, key: &[u8], data: &[u8], flags: &[u8]) {
    buf.extend_from_slice(b"ms ");
    buf.extend_from_slice(key);
    buf.push(b' ');
    push_u64(buf, data.len() as u64);
    push_flags(buf, flags);
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\r\n");
}

/// `md <key> [flags]\r\n`.
pub fn meta_delete(buf: &mut Vec<u8>, key: &[u8], flags: &[u8]) {
    buf.extend_from_slice(b"md ");
    buf.extend_from_slice(key);
    push_flags(buf, flags);
}

/// `mn\r\n`: the server answers `MN` after everything sent before it (ends a batch of quiet
/// requests).
pub fn meta_noop(buf: &mut Vec<u8>) {
    buf.extend_from_slice(b"mn\r\n");
}

// ---------------------------------------------------------------------------------------------
// Parsing replies
// ---------------------------------------------------------------------------------------------

/// One reply from the server. Byte slices borrow from the buffer given to [`parse_reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// One item of a retrieval reply: `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n`.
    Value {
        key: &'a [u8],
        flags: u32,
        cas: Option<u64>,
        data: &'a [u8],
    },
    /// `END`: the end of a retrieval (or `stats`) reply.
    End,
    Stored,
    NotStored,
    Exists,
    NotFound,
    Deleted,
    Touched,
    /// `OK` (`flush_all`, `verbosity`, ...).
    Ok,
    /// The new value after `incr`/`decr`.
    Number(u64),
    /// `VERSION <text>`.
    Version(&'a [u8]),
    /// `STAT <name> <value>`.
    Stat {
        name: &'a [u8],
        value: &'a [u8],
    },
    /// `ERROR`.
    Error,
    /// `CLIENT_ERROR <message>`.
    ClientError(&'a [u8]),
    /// `SERVER_ERROR <message>`.
    ServerError(&'a [u8]),
}

impl Reply<'_> {
    /// Whether this reply is one of the error replies.
    pub fn is_error(&self) -> bool {
        matches!(
            self,
            Reply::Error | Reply::ClientError(_) | Reply::ServerError(_)
        )
    }
}

/// Why a reply could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// No newline within [`MAX_REPLY_LINE`] bytes.
    LineTooLong,
    /// A line that is no reply the protocol defines.
    UnknownReply,
    /// A `VALUE` header with missing or malformed fields.
    BadValueHeader,
    /// A `VALUE` data block larger than the caller's limit.
    ValueTooLarge,
    /// A data block not followed by `\r\n`.
    BadDataTerminator,
}

/// The result of looking at the front of a read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseReply<'a> {
    /// A whole reply, which occupied the first `usize` bytes.
    Reply(Reply<'a>, usize),
    /// More bytes are needed; nothing was consumed.
    Incomplete,
    /// The server sent something that is no reply; close the connection.
    Invalid(Invalid),
}

fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

fn split_space(s: &[u8]) -> (&[u8], &[u8]) {
    match s.iter().position(|&b| b == b' ') {
        Some(i) => (
            s.get(..i).unwrap_or_default(),
            s.get(i + 1..).unwrap_or_default(),
        ),
        None => (s, &[]),
    }
}

/// Parse one reply from the front of `buf`. `max_value` bounds the data block of a `VALUE`
/// item the caller is prepared to buffer; a larger one is [`Invalid::ValueTooLarge`].
pub fn parse_reply(buf: &[u8], max_value: usize) -> ParseReply<'_> {
    let scan = buf.get(..MAX_REPLY_LINE).unwrap_or(buf);
    let Some(nl) = scan.iter().position(|&b| b == b'\n') else {
        return if buf.len() >= MAX_REPLY_LINE {
            ParseReply::Invalid(Invalid::LineTooLong)
        } else {
            ParseReply::Incomplete
        };
    };
    let line_end = nl + 1;
    let line = scan.get(..nl).unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let reply = match line {
        b"END" => Reply::End,
        b"STORED" => Reply::Stored,
        b"NOT_STORED" => Reply::NotStored,
        b"EXISTS" => Reply::Exists,
        b"NOT_FOUND" => Reply::NotFound,
        b"DELETED" => Reply::Deleted,
        b"TOUCHED" => Reply::Touched,
        b"OK" => Reply::Ok,
        b"ERROR" => Reply::Error,
        _ => {
            if let Some(rest) = line.strip_prefix(b"VALUE ") {
                return parse_value(buf, rest, line_end, max_value);
            } else if let Some(rest) = line.strip_prefix(b"STAT ") {
                let (name, value) = split_space(rest);
                Reply::Stat { name, value }
            } else if let Some(rest) = line.strip_prefix(b"VERSION ") {
                Reply::Version(rest)
            } else if let Some(rest) = line.strip_prefix(b"CLIENT_ERROR") {
                Reply::ClientError(rest.strip_prefix(b" ").unwrap_or(rest))
            } else if let Some(rest) = line.strip_prefix(b"SERVER_ERROR") {
                Reply::ServerError(rest.strip_prefix(b" ").unwrap_or(rest))
            } else if let Some(n) = parse_u64(line.strip_suffix(b" ").unwrap_or(line)) {
                // memcached pads a decr result that got shorter with trailing spaces; one
                // is tolerated here, more would be odd enough to reject.
                Reply::Number(n)
            } else {
                return ParseReply::Invalid(Invalid::UnknownReply);
            }
        }
    };
    ParseReply::Reply(reply, line_end)
}

fn parse_value<'a>(
    buf: &'a [u8],
    header: &'a [u8],
    line_end: usize,
    max_value: usize,
) -> ParseReply<'a> {
    let mut fields = header.split(|&b| b == b' ');
    let (Some(key), Some(flags), Some(bytes)) = (fields.next(), fields.next(), fields.next())
    else {
        return ParseReply::Invalid(Invalid::BadValueHeader);
    };
    let cas = fields.next();
    if key.is_empty() || fields.next().is_some() {
        return ParseReply::Invalid(Invalid::BadValueHeader);
    }
    let Some(flags) = parse_u64(flags).and_then(|f| u32::try_from(f).ok()) else {
        return ParseReply::Invalid(Invalid::BadValueHeader);
    };
    let Some(len) = parse_u64(bytes) else {
        return ParseReply::Invalid(Invalid::BadValueHeader);
    };
    let cas = match cas {
        None => None,
        Some(c) => match parse_u64(c) {
            Some(c) => Some(c),
            None => return ParseReply::Invalid(Invalid::BadValueHeader),
        },
    };
    let len = match usize::try_from(len) {
        Ok(l) if l <= max_value => l,
        _ => return ParseReply::Invalid(Invalid::ValueTooLarge),
    };
    // line_end + len + 2 cannot overflow: line_end <= MAX_REPLY_LINE and len <= max_value,
    // but use checked arithmetic anyway so that a huge max_value cannot wrap.
    let Some(end) = line_end.checked_add(len).and_then(|e| e.checked_add(2)) else {
        return ParseReply::Invalid(Invalid::ValueTooLarge);
    };
    // `line_end < end`, so this is `None` exactly when the block has not all arrived.
    let Some(block) = buf.get(line_end..end) else {
        return ParseReply::Incomplete;
    };
    let Some(data) = block.strip_suffix(b"\r\n") else {
        return ParseReply::Invalid(Invalid::BadDataTerminator);
    };
    ParseReply::Reply(
        Reply::Value {
            key,
            flags,
            cas,
            data,
        },
        end,
    )
}

/// One meta-protocol reply. Byte slices borrow from the buffer given to
/// [`parse_meta_reply`]; `flags` are the reply's flag tokens, unparsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaReply<'a> {
    /// `VA <size> <flags>*\r\n<data>\r\n`: a value.
    Value { data: &'a [u8], flags: &'a [u8] },
    /// `HD <flags>*`: success with no value (stored, deleted, touched, ...).
    Hd { flags: &'a [u8] },
    /// `EN`: miss (get).
    En,
    /// `NF`: not found (delete, arithmetic).
    Nf,
    /// `NS`: not stored.
    Ns,
    /// `EX`: exists (CAS mismatch).
    Ex,
    /// `MN`: the answer to `mn`.
    Mn,
    /// `ERROR`.
    Error,
    /// `CLIENT_ERROR <message>`.
    ClientError(&'a [u8]),
    /// `SERVER_ERROR <message>`.
    ServerError(&'a [u8]),
}

/// The result of looking at the front of a read buffer for a meta reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseMetaReply<'a> {
    Reply(MetaReply<'a>, usize),
    Incomplete,
    Invalid(Invalid),
}

/// Parse one meta reply from the front of `buf`; `max_value` bounds a `VA` data block.
pub fn parse_meta_reply(buf: &[u8], max_value: usize) -> ParseMetaReply<'_> {
    let scan = buf.get(..MAX_REPLY_LINE).unwrap_or(buf);
    let Some(nl) = scan.iter().position(|&b| b == b'\n') else {
        return if buf.len() >= MAX_REPLY_LINE {
            ParseMetaReply::Invalid(Invalid::LineTooLong)
        } else {
            ParseMetaReply::Incomplete
        };
    };
    let line_end = nl + 1;
    let line = scan.get(..nl).unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (code, rest) = split_space(line);
    let reply = match code {
        b"HD" => MetaReply::Hd { flags: rest },
        b"EN" if rest.is_empty() => MetaReply::En,
        b"NF" if rest.is_empty() => MetaReply::Nf,
        b"NS" if rest.is_empty() => MetaReply::Ns,
        b"EX" if rest.is_empty() => MetaReply::Ex,
        b"MN" if rest.is_empty() => MetaReply::Mn,
        b"ERROR" if rest.is_empty() => MetaReply::Error,
        b"CLIENT_ERROR" => MetaReply::ClientError(rest),
        b"SERVER_ERROR" => MetaReply::ServerError(rest),
        b"VA" => {
            let (size, flags) = split_space(rest);
            let len = match parse_u64(size).map(usize::try_from) {
                Some(Ok(l)) if l <= max_value => l,
                Some(_) => return ParseMetaReply::Invalid(Invalid::ValueTooLarge),
                None => return ParseMetaReply::Invalid(Invalid::BadValueHeader),
            };
            let Some(end) = line_end.checked_add(len).and_then(|e| e.checked_add(2)) else {
                return ParseMetaReply::Invalid(Invalid::ValueTooLarge);
            };
            // `line_end < end`, so this is `None` exactly when the block has not all arrived.
            let Some(block) = buf.get(line_end..end) else {
                return ParseMetaReply::Incomplete;
            };
            let Some(data) = block.strip_suffix(b"\r\n") else {
                return ParseMetaReply::Invalid(Invalid::BadDataTerminator);
            };
            return ParseMetaReply::Reply(MetaReply::Value { data, flags }, end);
        }
        _ => return ParseMetaReply::Invalid(Invalid::UnknownReply),
    };
    ParseMetaReply::Reply(reply, line_end)
}

/// The binary protocol: 24-byte headers, magic 0x80 for requests and 0x81 for responses,
/// big-endian fields. Composers append one request; [`binary::parse_response`] has the same
/// incremental contract as the text parsers.
pub mod binary {
    use super::Invalid;

    // The wire constants are the server side's (crate::binary); the client adds composers
    // for requests and a parser for responses.
    pub use crate::binary::{opcode, HEADER_LEN, REQUEST_MAGIC, RESPONSE_MAGIC};

    /// Response statuses as wire values (from [`crate::binary::Status`]).
    pub mod status {
        use crate::binary::Status;
        pub const SUCCESS: u16 = Status::Success.code();
        pub const KEY_NOT_FOUND: u16 = Status::KeyNotFound.code();
        pub const KEY_EXISTS: u16 = Status::KeyExists.code();
        pub const VALUE_TOO_LARGE: u16 = Status::TooLarge.code();
        pub const INVALID_ARGUMENTS: u16 = Status::InvalidArguments.code();
        pub const NOT_STORED: u16 = Status::NotStored.code();
        pub const NON_NUMERIC: u16 = Status::DeltaBadValue.code();
        pub const UNKNOWN_COMMAND: u16 = Status::UnknownCommand.code();
        pub const OUT_OF_MEMORY: u16 = Status::OutOfMemory.code();
    }

    /// Append one request: header, extras, key, value. Keys are at most 250 bytes and extras
    /// at most 20 here, so the length fields cannot overflow; values over 4 GiB are the
    /// caller's mistake and are truncated in the length field (the server will reject them).
    pub fn request(
        buf: &mut Vec<u8>,
        op: u8,
        key: &[u8],
        extras: &[u8],
        value: &[u8],
        opaque: u32,
    ) {
        let body = extras.len() + key.len() + value.len();
        buf.push(REQUEST_MAGIC);
        buf.push(op);
        buf.extend_from_slice(&(key.len() as u16).to_be_bytes());
        buf.push(extras.len() as u8);
        buf.push(0); // data type
        buf.extend_from_slice(&0u16.to_be_bytes()); // vbucket
        buf.extend_from_slice(&(body as u32).to_be_bytes());
        buf.extend_from_slice(&opaque.to_be_bytes());
        buf.extend_from_slice(&0u64.to_be_bytes()); // CAS
        buf.extend_from_slice(extras);
        buf.extend_from_slice(key);
        buf.extend_from_slice(value);
    }

    /// Get (or, with `quiet`, GetQ: no response on a miss).
    pub fn get(buf: &mut Vec<u8>, key: &[u8], quiet: bool, opaque: u32) {
        let op = if quiet { opcode::GETQ } else { opcode::GET };
        request(buf, op, key, &[], &[], opaque);
    }

    /// Set with flags and expiration time.
    pub fn set(buf: &mut Vec<u8>, key: &[u8], flags: u32, exptime: u32, value: &[u8], opaque: u32) {
        let mut extras = [0u8; 8];
        extras[..4].copy_from_slice(&flags.to_be_bytes());
        extras[4..].copy_from_slice(&exptime.to_be_bytes());
        request(buf, opcode::SET, key, &extras, value, opaque);
    }

    pub fn delete(buf: &mut Vec<u8>, key: &[u8], opaque: u32) {
        request(buf, opcode::DELETE, key, &[], &[], opaque);
    }

    pub fn touch(buf: &mut Vec<u8>, key: &[u8], exptime: u32, opaque: u32) {
        request(buf, opcode::TOUCH, key, &exptime.to_be_bytes(), &[], opaque);
    }

    /// Get and touch: a get that also sets the expiration time.
    pub fn gat(buf: &mut Vec<u8>, key: &[u8], exptime: u32, opaque: u32) {
        request(buf, opcode::GAT, key, &exptime.to_be_bytes(), &[], opaque);
    }

    /// Increment by `delta`; with `create` false (exptime 0xffffffff) a missing key is
    /// KEY_NOT_FOUND, as text `incr` behaves.
    pub fn increment(buf: &mut Vec<u8>, key: &[u8], delta: u64, create: bool, opaque: u32) {
        let mut extras = [0u8; 20];
        extras[..8].copy_from_slice(&delta.to_be_bytes());
        let exptime: u32 = if create { 0 } else { u32::MAX };
        extras[16..].copy_from_slice(&exptime.to_be_bytes());
        request(buf, opcode::INCREMENT, key, &extras, &[], opaque);
    }

    pub fn noop(buf: &mut Vec<u8>, opaque: u32) {
        request(buf, opcode::NOOP, &[], &[], &[], opaque);
    }

    /// One response. Slices borrow from the buffer given to [`parse_response`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Response<'a> {
        pub opcode: u8,
        pub status: u16,
        pub opaque: u32,
        pub cas: u64,
        pub extras: &'a [u8],
        pub key: &'a [u8],
        pub value: &'a [u8],
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum ParseResponse<'a> {
        Response(Response<'a>, usize),
        Incomplete,
        Invalid(Invalid),
    }

    /// Parse one response from the front of `buf`; a body longer than `max_value` plus room
    /// for extras and a key is [`Invalid::ValueTooLarge`].
    pub fn parse_response(buf: &[u8], max_value: usize) -> ParseResponse<'_> {
        match buf.first() {
            None => return ParseResponse::Incomplete,
            Some(&magic) if magic != RESPONSE_MAGIC => {
                return ParseResponse::Invalid(Invalid::UnknownReply)
            }
            Some(_) => {}
        }
        let Some(h) = buf
            .get(..HEADER_LEN)
            .and_then(|h| <&[u8; HEADER_LEN]>::try_from(h).ok())
        else {
            return ParseResponse::Incomplete;
        };
        let key_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
        let extras_len = usize::from(h[4]);
        let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        if key_len + extras_len > body {
            return ParseResponse::Invalid(Invalid::BadValueHeader);
        }
        if body - key_len - extras_len > max_value {
            return ParseResponse::Invalid(Invalid::ValueTooLarge);
        }
        let Some(end) = HEADER_LEN.checked_add(body) else {
            return ParseResponse::Invalid(Invalid::ValueTooLarge);
        };
        let Some(payload) = buf.get(HEADER_LEN..end) else {
            return ParseResponse::Incomplete;
        };
        // `extras_len + key_len <= payload.len()`, checked above.
        let (extras, rest) = payload.split_at_checked(extras_len).unwrap_or_default();
        let (key, value) = rest.split_at_checked(key_len).unwrap_or_default();
        ParseResponse::Response(
            Response {
                opcode: h[1],
                status: u16::from_be_bytes([h[6], h[7]]),
                opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
                cas: u64::from_be_bytes([h[16], h[17], h[18], h[19], h[20], h[21], h[22], h[23]]),
                extras,
                key,
                value,
            },
            end,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 1 << 20;

    fn composed(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut buf = Vec::new();
        f(&mut buf);
        buf
    }

    #[test]
    fn composers_write_exact_bytes() {
        let rows: Vec<(Vec<u8>, &[u8])> = vec![
            (composed(|b| get(b, b"k1")), b"get k1\r\n"),
            (
                composed(|b| {
                    multiget(b, false, [&b"a"[..], b"bb", b"c"]);
                }),
                b"get a bb c\r\n",
            ),
            (
                composed(|b| {
                    multiget(b, true, [&b"a"[..]]);
                }),
                b"gets a\r\n",
            ),
            (
                composed(|b| set(b, b"k", 5, 0, b"hello", false)),
                b"set k 5 0 5\r\nhello\r\n",
            ),
            (
                composed(|b| set(b, b"k", 0, -1, b"", true)),
                b"set k 0 -1 0 noreply\r\n\r\n",
            ),
            (
                composed(|b| store(b, Store::Prepend, b"k", 0, 0, b"x", false)),
                b"prepend k 0 0 1\r\nx\r\n",
            ),
            (
                composed(|b| cas(b, b"k", 1, 2, b"v", 99, false)),
                b"cas k 1 2 1 99\r\nv\r\n",
            ),
            (composed(|b| delete(b, b"k", false)), b"delete k\r\n"),
            (composed(|b| delete(b, b"k", true)), b"delete k noreply\r\n"),
            (composed(|b| touch(b, b"k", 60, false)), b"touch k 60\r\n"),
            (composed(|b| gat(b, -1, b"k")), b"gat -1 k\r\n"),
            (
                composed(|b| arith(b, true, b"n", 7, false)),
                b"incr n 7\r\n",
            ),
            (
                composed(|b| arith(b, false, b"n", u64::MAX, true)),
                b"decr n 18446744073709551615 noreply\r\n",
            ),
            (composed(|b| stats(b, b"")), b"stats\r\n"),
            (composed(|b| stats(b, b"slabs")), b"stats slabs\r\n"),
            (composed(version), b"version\r\n"),
            (composed(flush_all), b"flush_all\r\n"),
        ];
        for (got, want) in rows {
            assert_eq!(
                got,
                want,
                "{:?} != {:?}",
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(want)
            );
        }
    }

    #[test]
    fn multiget_with_no_keys_writes_nothing() {
        let mut buf = b"x".to_vec();
        assert!(!multiget(&mut buf, false, std::iter::empty()));
        assert_eq!(buf, b"x");
    }

    #[test]
    fn parses_each_reply_kind() {
        let rows: Vec<(&[u8], Reply<'_>)> = vec![
            (b"END\r\n", Reply::End),
            (b"STORED\r\n", Reply::Stored),
            (b"NOT_STORED\r\n", Reply::NotStored),
            (b"EXISTS\r\n", Reply::Exists),
            (b"NOT_FOUND\r\n", Reply::NotFound),
            (b"DELETED\r\n", Reply::Deleted),
            (b"TOUCHED\r\n", Reply::Touched),
            (b"OK\r\n", Reply::Ok),
            (b"ERROR\r\n", Reply::Error),
            (b"42\r\n", Reply::Number(42)),
            (b"7 \r\n", Reply::Number(7)),
            (b"VERSION 1.6.18\r\n", Reply::Version(b"1.6.18")),
            (
                b"STAT cmd_get 10\r\n",
                Reply::Stat {
                    name: b"cmd_get",
                    value: b"10",
                },
            ),
            (
                b"CLIENT_ERROR bad data chunk\r\n",
                Reply::ClientError(b"bad data chunk"),
            ),
            (
                b"SERVER_ERROR out of memory storing object\r\n",
                Reply::ServerError(b"out of memory storing object"),
            ),
            (
                b"VALUE k 3 5\r\nhello\r\n",
                Reply::Value {
                    key: b"k",
                    flags: 3,
                    cas: None,
                    data: b"hello",
                },
            ),
            (
                b"VALUE k 0 0 77\r\n\r\n",
                Reply::Value {
                    key: b"k",
                    flags: 0,
                    cas: Some(77),
                    data: b"",
                },
            ),
            // A bare newline ends a line too.
            (b"END\n", Reply::End),
        ];
        for (input, want) in rows {
            assert_eq!(
                parse_reply(input, MAX),
                ParseReply::Reply(want, input.len()),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn rejects_garbage() {
        let rows: Vec<(&[u8], Invalid)> = vec![
            (b"HELLO\r\n", Invalid::UnknownReply),
            (b"\r\n", Invalid::UnknownReply),
            (b"-1\r\n", Invalid::UnknownReply),
            (b"99999999999999999999999\r\n", Invalid::UnknownReply),
            (b"VALUE k\r\n", Invalid::BadValueHeader),
            (b"VALUE k x 1\r\nx\r\n", Invalid::BadValueHeader),
            (b"VALUE k 0 -1\r\n", Invalid::BadValueHeader),
            (b"VALUE k 4294967296 1\r\nx\r\n", Invalid::BadValueHeader),
            (b"VALUE k 0 1 2 3\r\nx\r\n", Invalid::BadValueHeader),
            (b"VALUE  0 1\r\nx\r\n", Invalid::BadValueHeader),
            (b"VALUE k 0 1 z\r\nx\r\n", Invalid::BadValueHeader),
            (b"VALUE k 0 2000000\r\n", Invalid::ValueTooLarge),
            (
                b"VALUE k 0 18446744073709551615\r\n",
                Invalid::ValueTooLarge,
            ),
            (b"VALUE k 0 1\r\nxyz\r\n", Invalid::BadDataTerminator),
        ];
        for (input, want) in rows {
            assert_eq!(
                parse_reply(input, MAX),
                ParseReply::Invalid(want),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        let long = vec![b'a'; MAX_REPLY_LINE];
        assert_eq!(
            parse_reply(&long, MAX),
            ParseReply::Invalid(Invalid::LineTooLong)
        );
        assert_eq!(
            parse_reply(&long[..MAX_REPLY_LINE - 1], MAX),
            ParseReply::Incomplete
        );
    }

    #[test]
    fn huge_limit_does_not_overflow() {
        let input = b"VALUE k 0 18446744073709551615\r\n";
        assert_eq!(
            parse_reply(input, usize::MAX),
            ParseReply::Invalid(Invalid::ValueTooLarge)
        );
        assert_eq!(
            parse_reply(b"VALUE k 0 100\r\n", usize::MAX),
            ParseReply::Incomplete
        );
    }

    /// Parse a whole stream reply by reply, returning the replies in a printable form.
    fn parse_all(mut buf: &[u8]) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            match parse_reply(buf, MAX) {
                ParseReply::Reply(r, n) => {
                    out.push(format!("{r:?}"));
                    buf = &buf[n..];
                }
                ParseReply::Incomplete => return Err(format!("incomplete at {out:?}")),
                ParseReply::Invalid(e) => return Err(format!("{e:?}")),
            }
        }
        Ok(out)
    }

    #[test]
    fn every_split_point_is_incomplete_then_complete() {
        let stream: &[u8] =
            b"VALUE key1 1 5\r\nhello\r\nVALUE k2 0 10 9\r\nline\r\nline\r\nEND\r\n\
STORED\r\nNOT_FOUND\r\n1234\r\nSTAT pid 77\r\nEND\r\nSERVER_ERROR out of memory\r\n\
VERSION 1.6.18\r\nDELETED\r\nTOUCHED\r\nVALUE e 0 0\r\n\r\nEND\r\n";
        let whole = parse_all(stream).expect("whole stream parses");
        assert_eq!(whole.len(), 14);
        // Feed the stream as a connection would: bytes arrive in two pieces split at every
        // position, and the parser only ever sees a prefix of what remains.
        for split in 0..=stream.len() {
            let mut pending: Vec<u8> = Vec::new();
            let mut got = Vec::new();
            for piece in [&stream[..split], &stream[split..]] {
                pending.extend_from_slice(piece);
                loop {
                    match parse_reply(&pending, MAX) {
                        ParseReply::Reply(r, n) => {
                            got.push(format!("{r:?}"));
                            pending.drain(..n);
                        }
                        ParseReply::Incomplete => break,
                        ParseReply::Invalid(e) => panic!("split {split}: {e:?}"),
                    }
                }
            }
            assert!(pending.is_empty(), "split {split}: left {pending:?}");
            assert_eq!(got, whole, "split {split}");
        }
        // Every proper prefix of a single reply is incomplete.
        for reply in [
            &b"VALUE key1 1 5\r\nhello\r\n"[..],
            b"STORED\r\n",
            b"12\r\n",
        ] {
            for cut in 0..reply.len() {
                assert_eq!(
                    parse_reply(&reply[..cut], MAX),
                    ParseReply::Incomplete,
                    "{:?}",
                    String::from_utf8_lossy(&reply[..cut])
                );
            }
        }
    }

    #[test]
    fn byte_at_a_time_feeding() {
        let stream: &[u8] = b"VALUE a 0 3\r\nabc\r\nEND\r\nSTORED\r\n";
        let mut pending = Vec::new();
        let mut got = 0;
        for &b in stream {
            pending.push(b);
            while let ParseReply::Reply(_, n) = parse_reply(&pending, MAX) {
                pending.drain(..n);
                got += 1;
            }
        }
        assert_eq!(got, 3);
        assert!(pending.is_empty());
    }

    proptest::proptest! {
        /// Any bytes at all: no panic, and a reply never claims more bytes than it was given.
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            if let ParseReply::Reply(_, n) = parse_reply(&buf, 256) {
                proptest::prop_assert!(n > 0 && n <= buf.len());
            }
        }

        /// Any bytes after a response magic: no panic, no overreach.
        #[test]
        fn binary_arbitrary_bytes_never_panic(mut buf in proptest::collection::vec(proptest::num::u8::ANY, 0..100)) {
            if let Some(b) = buf.first_mut() {
                *b = binary::RESPONSE_MAGIC;
            }
            if let binary::ParseResponse::Response(r, n) = binary::parse_response(&buf, 64) {
                proptest::prop_assert!(n >= binary::HEADER_LEN && n <= buf.len());
                proptest::prop_assert!(r.value.len() <= 64);
            }
        }

        /// Reply-shaped input with random fields: same properties.
        #[test]
        fn value_headers_with_random_fields(
            key in "[a-z]{0,4}",
            flags in "[0-9a-z-]{0,6}",
            len in "[0-9]{0,4}",
            cas in proptest::option::of("[0-9]{0,3}"),
            tail in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
        ) {
            let mut buf = format!("VALUE {key} {flags} {len}").into_bytes();
            if let Some(c) = cas {
                buf.push(b' ');
                buf.extend_from_slice(c.as_bytes());
            }
            buf.extend_from_slice(b"\r\n");
            buf.extend_from_slice(&tail);
            match parse_reply(&buf, 100) {
                ParseReply::Reply(Reply::Value { data, .. }, n) => {
                    proptest::prop_assert!(n <= buf.len());
                    proptest::prop_assert!(data.len() <= 100);
                }
                ParseReply::Reply(r, _) => proptest::prop_assert!(false, "not a value: {r:?}"),
                ParseReply::Incomplete | ParseReply::Invalid(_) => {}
            }
        }
    }

    #[test]
    fn meta_composers_write_exact_bytes() {
        let rows: Vec<(Vec<u8>, &[u8])> = vec![
            (composed(|b| meta_get(b, b"k", b"v")), b"mg k v\r\n"),
            (composed(|b| meta_get(b, b"k", b"")), b"mg k\r\n"),
            (
                composed(|b| meta_set(b, b"k", b"abc", b"T0")),
                b"ms k 3 T0\r\nabc\r\n",
            ),
            (composed(|b| meta_delete(b, b"k", b"q")), b"md k q\r\n"),
            (composed(meta_noop), b"mn\r\n"),
        ];
        for (got, want) in rows {
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&got));
        }
    }

    #[test]
    fn parses_meta_replies() {
        // The replies memcached 1.6.18 sends for ms, mg (hit, miss, quiet), md, mn.
        let stream: &[u8] =
            b"HD\r\nVA 3\r\nabc\r\nEN\r\nVA 2 t-1 f0\r\nxy\r\nMN\r\nNF\r\nNS\r\nEX\r\nHD c5\r\n\
CLIENT_ERROR bad command line format\r\nERROR\r\n";
        let want = [
            MetaReply::Hd { flags: b"" },
            MetaReply::Value {
                data: b"abc",
                flags: b"",
            },
            MetaReply::En,
            MetaReply::Value {
                data: b"xy",
                flags: b"t-1 f0",
            },
            MetaReply::Mn,
            MetaReply::Nf,
            MetaReply::Ns,
            MetaReply::Ex,
            MetaReply::Hd { flags: b"c5" },
            MetaReply::ClientError(b"bad command line format"),
            MetaReply::Error,
        ];
        let mut rest = stream;
        for w in want {
            match parse_meta_reply(rest, MAX) {
                ParseMetaReply::Reply(r, n) => {
                    assert_eq!(r, w);
                    rest = &rest[n..];
                }
                other => panic!("{other:?} at {:?}", String::from_utf8_lossy(rest)),
            }
        }
        assert!(rest.is_empty());
        // Every split point of the stream is incomplete, never invalid.
        for cut in 0..stream.len() {
            let mut pos = 0;
            loop {
                match parse_meta_reply(&stream[pos..cut], MAX) {
                    ParseMetaReply::Reply(_, n) => pos += n,
                    ParseMetaReply::Incomplete => break,
                    ParseMetaReply::Invalid(e) => panic!("cut {cut}: {e:?}"),
                }
            }
        }
        for (bad, why) in [
            (&b"VA x\r\n"[..], Invalid::BadValueHeader),
            (b"VA 5000000\r\n", Invalid::ValueTooLarge),
            (b"VA 1\r\nabc\r\n", Invalid::BadDataTerminator),
            (b"EN extra\r\n", Invalid::UnknownReply),
            (b"STORED\r\n", Invalid::UnknownReply),
        ] {
            assert_eq!(parse_meta_reply(bad, MAX), ParseMetaReply::Invalid(why));
        }
    }

    #[test]
    fn binary_requests_have_the_documented_layout() {
        let mut b = Vec::new();
        binary::set(&mut b, b"key", 7, 60, b"val", 0xABCD);
        assert_eq!(
            b,
            [
                0x80, 0x01, 0, 3, 8, 0, 0, 0, 0, 0, 0, 14, 0, 0, 0xAB, 0xCD, 0, 0, 0, 0, 0, 0, 0,
                0, // header
                0, 0, 0, 7, 0, 0, 0, 60, // flags, exptime
                b'k', b'e', b'y', b'v', b'a', b'l',
            ]
        );
        let mut b = Vec::new();
        binary::increment(&mut b, b"n", 1, false, 0);
        assert_eq!(b.len(), 24 + 20 + 1);
        assert_eq!(&b[24 + 16..24 + 20], &[0xff; 4]);
        let mut b = Vec::new();
        binary::gat(&mut b, b"k", 60, 5);
        assert_eq!(b.len(), 24 + 4 + 1);
        assert_eq!((b[1], b[4]), (binary::opcode::GAT, 4));
        assert_eq!(&b[24..], &[0, 0, 0, 60, b'k']);
        let mut b = Vec::new();
        binary::noop(&mut b, 9);
        assert_eq!(b.len(), 24);
        assert_eq!(b[1], binary::opcode::NOOP);
    }

    fn response(op: u8, status: u16, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        binary::request(&mut b, op, key, extras, value, 77);
        b[0] = binary::RESPONSE_MAGIC;
        b[6..8].copy_from_slice(&status.to_be_bytes());
        b
    }

    #[test]
    fn binary_responses_parse_incrementally() {
        let mut stream = response(binary::opcode::GET, 0, &[0, 0, 0, 5], b"", b"hello");
        stream.extend(response(
            binary::opcode::GET,
            binary::status::KEY_NOT_FOUND,
            &[],
            b"",
            b"Not found",
        ));
        stream.extend(response(binary::opcode::NOOP, 0, &[], b"", b""));
        let mut rest = &stream[..];
        let mut got = Vec::new();
        while !rest.is_empty() {
            match binary::parse_response(rest, MAX) {
                binary::ParseResponse::Response(r, n) => {
                    assert_eq!(r.opaque, 77);
                    got.push((r.opcode, r.status, r.value.to_vec()));
                    rest = &rest[n..];
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].2, b"hello");
        assert_eq!(got[1].1, binary::status::KEY_NOT_FOUND);
        for cut in 0..stream.len() {
            let mut pos = 0;
            loop {
                match binary::parse_response(&stream[pos..cut], MAX) {
                    binary::ParseResponse::Response(_, n) => pos += n,
                    binary::ParseResponse::Incomplete => break,
                    binary::ParseResponse::Invalid(e) => panic!("cut {cut}: {e:?}"),
                }
            }
        }
        // Hostile headers.
        let mut bad = response(binary::opcode::GET, 0, &[0; 4], b"k", b"v");
        bad[0] = 0x80;
        assert!(matches!(
            binary::parse_response(&bad, MAX),
            binary::ParseResponse::Invalid(_)
        ));
        let mut bad = response(binary::opcode::GET, 0, &[0; 4], b"k", b"v");
        bad[8..12].copy_from_slice(&2u32.to_be_bytes()); // body shorter than extras + key
        assert!(matches!(
            binary::parse_response(&bad, MAX),
            binary::ParseResponse::Invalid(_)
        ));
        let mut bad = response(binary::opcode::GET, 0, &[], b"", b"");
        bad[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            binary::parse_response(&bad, MAX),
            binary::ParseResponse::Invalid(Invalid::ValueTooLarge)
        );
    }

    #[test]
    fn composed_requests_parse_on_the_server_side_shape() {
        // A set composed here carries exactly the declared number of bytes.
        let mut buf = Vec::new();
        set(&mut buf, b"key", 0, 0, &[b'x'; 300], false);
        let header_end = buf.iter().position(|&b| b == b'\n').unwrap_or(0) + 1;
        assert_eq!(&buf[..header_end], b"set key 0 0 300\r\n");
        assert_eq!(buf.len(), header_end + 300 + 2);
    }
}
