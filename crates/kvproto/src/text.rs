//! The classic memcached text protocol: request parsing and reply composing.
//!
//! [`parse`] looks at the front of a connection's read buffer and returns one request and the
//! number of bytes it occupied, or [`Parse::Incomplete`] when more bytes are needed. It borrows
//! keys and data blocks from the buffer (no copies, no allocation), runs in time linear in the
//! length of the line it looks at, and never panics.
//!
//! The reply helpers append memcached's exact reply bytes to a `Vec<u8>`; they allocate nothing
//! beyond growing that vector.
//!
//! # Whose behaviour
//!
//! The parser follows the newest memcached (1.6.4x, `proto_parser.c` + `proto_text.c` +
//! `vendor/mcmc`), quirks included, because clients and the differential test see the bytes:
//!
//! - A line ends at `\n`; one `\r` before it is dropped. A line of fewer than 4 bytes (with its
//!   terminator) is `CLIENT_ERROR bad command line format`, so an empty line is too.
//! - The command word is everything up to the first space. `get`, `gets`, `gat`, `gats`, the six
//!   storage commands, `incr`, `decr`, `touch`, `delete`, `stats`, `watch`, `version`, `quit` and
//!   the meta commands are recognised that way only (a leading space makes them unknown); the
//!   admin commands (`flush_all`, `verbosity`, `shutdown`, `cache_memlimit`, `slabs`, `lru`,
//!   `lru_crawler`, `extstore`, ...) are recognised by their first token, leading spaces allowed.
//! - Arguments are tokens split on spaces; only the first 23 tokens of a line (and only its first
//!   65,534 bytes) are looked at, later ones are ignored. `noreply` means the last of those tokens
//!   is exactly `noreply`; it also silences most error replies, as in memcached.
//! - Numbers are plain decimal digits (a leading `-` for signed ones, where a lone `-` is 0) with
//!   range checks and a length cap, except a storage command's flags and exptime, which go
//!   through C's `strtoul`/`strtol` (leading whitespace and `+` accepted, values wrap to 32 bits).
//! - A storage command whose line is well formed up to its data length but whose key, flags,
//!   exptime or CAS unique is bad gets its error and has its data block swallowed.
//!
//! Deliberate differences from the newest memcached (bugs there, not behaviour to copy):
//!
//! - A `get`-family key over 250 bytes: memcached sends `CLIENT_ERROR bad command line
//!   format\r\n\r\n` (one empty line too many; with `noreply`, a stale or empty line) and drops
//!   replies still queued from earlier requests of the same read. Here it is a plain
//!   [`BAD_FORMAT`] error that is always sent; earlier replies are the server's business.

use crate::syntax::{
    c_strncmp_eq, c_strtol_i32, c_strtoul_u32, fail, find_byte, put_u64, tok_i32, tok_i64, tok_u32,
    tok_u64, Toks, TOKENIZER_MAX_LEN,
};
pub use crate::syntax::{
    ErrorReply, Limits, StoreMode, Tokens, BAD_DATA_CHUNK, BAD_FORMAT, FLUSH_NOT_ALLOWED,
    INVALID_DELTA, INVALID_EXPTIME, INVALID_SHUTDOWN_MODE, SHUTDOWN_NOT_ENABLED, TOO_LARGE,
};
use crate::MAX_KEY_LEN;

/// The result of parsing the front of a read buffer: one of [`Request`], or what to do instead.
pub type Parse<'a> = crate::syntax::Parse<'a, Request<'a>>;

/// A command line longer than this with no newline closes the connection, unless it is a
/// `get`/`gets` line (memcached's rule).
pub const MAX_LINE_LEN: usize = 2048;

/// memcached lets a `get`/`gets` line grow without limit; kvcached bounds it so that a client
/// cannot make the server buffer without limit. A longer line closes the connection.
pub const MAX_GET_LINE_LEN: usize = 1 << 20;

/// An over-long `get` line may start with at most this many spaces.
const MAX_LEADING_SPACES: usize = 100;

/// One parsed request. Byte slices borrow from the buffer given to [`parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get <key>*` / `gets <key>*` (`with_cas` for `gets`). A final `noreply` is just a key.
    ///
    /// `rejected`: a key after `keys` is over 250 bytes. memcached has then already looked up
    /// (and for `gat`, touched) the keys before it; it drops their replies and answers only
    /// `CLIENT_ERROR bad command line format`. The server must do the same: look up `keys`
    /// for their side effects, send none of their values, then send [`BAD_FORMAT`].
    Get {
        with_cas: bool,
        keys: Keys<'a>,
        rejected: bool,
    },
    /// `gat <exptime> <key>*` / `gats <exptime> <key>*`. `exptime` is within `i32`.
    /// `rejected` as for [`Request::Get`].
    Gat {
        with_cas: bool,
        exptime: i64,
        keys: Keys<'a>,
        rejected: bool,
    },
    /// `set|add|replace|append|prepend <key> <flags> <exptime> <bytes> [noreply]`,
    /// `cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]`; `data` excludes the `\r\n`.
    /// Extra tokens are ignored. `exptime` is within `i32`.
    Store {
        mode: StoreMode,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        /// The CAS unique for `cas`; 0 for the other modes.
        cas: u64,
        data: &'a [u8],
        noreply: bool,
    },
    /// `delete <key> [anything] [noreply]`: the newest memcached ignores extra tokens.
    Delete { key: &'a [u8], noreply: bool },
    /// `incr|decr <key> <delta> [noreply]`.
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    /// `touch <key> <exptime> [noreply]`. `exptime` is within `i32`.
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`; `delay` is 0 when absent and may be negative (memcached
    /// treats `delay <= 0` as "now").
    FlushAll { delay: i64, noreply: bool },
    /// `version` (any arguments are ignored).
    Version,
    /// `verbosity <level> [noreply]`.
    Verbosity { level: u32, noreply: bool },
    /// `quit` (any arguments are ignored).
    Quit,
    /// `shutdown [graceful]` (only when [`Limits::shutdown_enabled`]). memcached accepts any
    /// prefix of `graceful` too. It closes the connection without a reply.
    Shutdown { graceful: bool },
    /// `stats [group [args]]`: the tokens after `stats`, unparsed. Note that memcached matches
    /// its built-in groups (`reset`, `detail`, `settings`, `cachedump`, `conns`, ...) by prefix:
    /// `stats r` is `stats reset`, `stats s` is `stats settings`. `noreply` is not special.
    Stats { args: Tokens<'a> },
    /// `cache_memlimit <megabytes> [noreply]` (`megabytes` fits in `u32`; the range checks,
    /// `MEMLIMIT_TOO_SMALL ...` below 8 and `MEMLIMIT_ADJUST_FAILED ...` above 1000000000,
    /// are the server's).
    CacheMemlimit { megabytes: u64, noreply: bool },
    /// `debugtime <seconds>`: shift the server's clock (only honoured when the server enables
    /// its test clock; otherwise the server answers `ERROR`, as an unknown command).
    DebugTime { seconds: i64 },
    /// `replicaof <host> <port>`: follow that master; `replicaof no one`: stop following
    /// (promotion). kvcached's own command (as Redis names it).
    ReplicaOf { master: Option<(&'a [u8], u16)> },
    /// `replpull <replid> <bytes> [<name>]\r\n<cursor>\r\n`: a replica's pull
    /// (kvcached's own). `replid` is the log the cursor refers to (`-` for none); `name`
    /// identifies the replica (at most 64 bytes); the cursor is opaque here.
    ReplPull {
        replid: &'a [u8],
        name: &'a [u8],
        cursor: &'a [u8],
    },
    /// Commands memcached knows that kvcached answers without implementing them in full:
    /// `slabs`, `lru`, `lru_crawler`, `watch`, `misbehave`, `extstore`. `name` is the command.
    /// `args.ends_with_noreply()` tells whether memcached would stay silent (except `watch`).
    Admin { name: &'a [u8], args: Tokens<'a> },
    /// A meta command (`mg`, `ms`, `md`, `ma`, `mn`, `me`); see [`crate::meta`].
    Meta(crate::meta::MetaRequest<'a>),
}

/// Space-separated keys of a `get`-family line, borrowed from the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys<'a> {
    tokens: Tokens<'a>,
}

impl<'a> Keys<'a> {
    /// Keys from the key section of a command line (already validated by the parser).
    pub fn new(section: &'a [u8]) -> Self {
        Keys {
            tokens: Tokens::new(section),
        }
    }

    /// The unsplit key section.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.tokens.rest
    }
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        self.tokens.next()
    }
}

/// The keys a batch of pipelined reads at the front of `buf` will look up, for a server to
/// prefetch before it executes them: the keys of each whole `get`/`gets` line and the key
/// of each whole `mg` line, in order, until a line that is anything else or is unfinished
/// (a `set`'s data block must not be read as commands). At most 64 lines and the first
/// [`READ_KEYS_SPAN`] bytes are looked at, so a long unfinished line that a server offers
/// again after every read costs a bounded scan each time.
/// Only a hint: it validates nothing (the parser does, when the request runs), a key it
/// yields may be refused later, and a line of other whitespace yields tokens as found.
pub fn read_keys(buf: &[u8]) -> ReadKeys<'_> {
    ReadKeys {
        rest: buf.get(..READ_KEYS_SPAN).unwrap_or(buf),
        line: Tokens::new(&[]),
        lines: 0,
    }
}

/// The key of the one read `buf` holds, when it is exactly one whole `get` or `gets` line
/// (`\r\n` or `\n` ended) of one key and nothing after it: what a connection with one
/// request in flight sends. For a server to prefetch across connections before it runs
/// any of them; a cheaper test than [`read_keys`] (one scan for the line end), and as
/// much a hint: it validates nothing (the key may be refused when the request runs).
pub fn single_read_key(buf: &[u8]) -> Option<&[u8]> {
    let (last, line) = buf.split_last()?;
    if *last != b'\n' || buf.len() > READ_KEYS_SPAN || find_byte(b'\n', line).is_some() {
        return None;
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let key = line
        .strip_prefix(b"get ")
        .or_else(|| line.strip_prefix(b"gets "))?;
    (!key.is_empty() && find_byte(b' ', key).is_none()).then_some(key)
}

/// How many bytes the request at the front of `buf` takes, once its command line is there:
/// for a storage command (`set`, `add`, `replace`, `append`, `prepend`, `cas`) whose data has
/// not all arrived, the line, the data and its `\r\n`, so that a server need not grow its
/// buffer past it nor parse the request again before it is whole. None for anything else or
/// an unfinished line. Only a hint, as
/// [`read_keys`]: the parser decides when the request runs.
pub fn request_len_hint(buf: &[u8]) -> Option<usize> {
    let scan = buf.get(..MAX_LINE_LEN).unwrap_or(buf);
    let line_len = find_byte(b'\n', scan)? + 1;
    let line = buf.get(..line_len)?;
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let mut tokens = Tokens::new(body.strip_suffix(b"\r").unwrap_or(body));
    let (b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas") = tokens.next()? else {
        return None;
    };
    let vlen = tokens.nth(3).and_then(tok_i32)?;
    let vlen = usize::try_from(vlen).ok()?;
    line_len.checked_add(vlen)?.checked_add(2)
}

/// The most bytes [`read_keys`] looks at.
pub const READ_KEYS_SPAN: usize = 8 * 1024;

/// The iterator [`read_keys`] returns.
#[derive(Debug, Clone)]
pub struct ReadKeys<'a> {
    rest: &'a [u8],
    line: Tokens<'a>,
    lines: u32,
}

impl<'a> Iterator for ReadKeys<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        loop {
            if let Some(key) = self.line.next() {
                return Some(key);
            }
            if self.lines >= 64 {
                return None;
            }
            self.lines += 1;
            let end = find_byte(b'\n', self.rest)?;
            let (line, rest) = (self.rest.get(..end)?, self.rest.get(end + 1..)?);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            self.rest = rest;
            let mut tokens = Tokens::new(line);
            match tokens.next() {
                Some(b"get" | b"gets") => self.line = tokens,
                Some(b"mg") => {
                    let key = tokens.next();
                    self.line = Tokens::new(key.unwrap_or(&[]));
                }
                _ => {
                    self.rest = &[];
                    return None;
                }
            }
        }
    }
}

/// Parse one request from the front of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parse<'a> {
    let line_len = match line_length(buf) {
        Ok(n) => n,
        Err(p) => return p,
    };
    match buf.get(..line_len) {
        Some(line) => parse_line(buf, line, limits),
        None => Parse::Close,
    }
}

/// The length of the first line of `buf` including its `\n`, or what to do without one.
fn line_length(buf: &[u8]) -> Result<usize, Parse<'static>> {
    let scan = buf.get(..MAX_GET_LINE_LEN).unwrap_or(buf);
    if let Some(i) = find_byte(b'\n', scan) {
        return Ok(i + 1);
    }
    if buf.len() > MAX_GET_LINE_LEN || (buf.len() > MAX_LINE_LEN && !may_grow(buf)) {
        return Err(Parse::Close);
    }
    Err(Parse::Incomplete)
}

/// Whether an over-long partial line may keep growing: memcached allows it for a multiget,
/// after at most 100 leading spaces.
fn may_grow(buf: &[u8]) -> bool {
    let spaces = buf
        .iter()
        .take(buf.len().saturating_sub(6))
        .take_while(|&&b| b == b' ')
        .count();
    let rest = buf.get(spaces..).unwrap_or_default();
    spaces <= MAX_LEADING_SPACES && (rest.starts_with(b"get ") || rest.starts_with(b"gets "))
}

/// Parse one whole line (`line` ends in `\n` and is the front of `buf`).
fn parse_line<'a>(buf: &'a [u8], line: &'a [u8], limits: &Limits) -> Parse<'a> {
    let len = line.len();
    // memcached: no command is shorter than 2 bytes plus "\r\n".
    if len < 4 {
        return fail(BAD_FORMAT, false, len, 0);
    }
    let end = if line.get(len - 2) == Some(&b'\r') {
        len - 2
    } else {
        len - 1
    };
    let content = line.get(..end).unwrap_or_default();
    let cmd_len = find_byte(b' ', content).unwrap_or(end);
    let cmd = content.get(..cmd_len).unwrap_or_default();
    let ok = |request| Parse::Request(request, len);
    match cmd {
        b"get" => parse_get(line, content, cmd_len, false),
        b"gets" => parse_get(line, content, cmd_len, true),
        b"gat" => parse_gat(line, content, false),
        b"gats" => parse_gat(line, content, true),
        b"set" => parse_store(buf, line, StoreMode::Set, limits),
        b"add" => parse_store(buf, line, StoreMode::Add, limits),
        b"cas" => parse_store(buf, line, StoreMode::Cas, limits),
        b"replace" => parse_store(buf, line, StoreMode::Replace, limits),
        b"append" => parse_store(buf, line, StoreMode::Append, limits),
        b"prepend" => parse_store(buf, line, StoreMode::Prepend, limits),
        b"incr" => parse_arith(line, true),
        b"decr" => parse_arith(line, false),
        b"touch" => parse_touch(line),
        b"delete" => parse_delete(line),
        b"quit" => ok(Request::Quit),
        b"version" => ok(Request::Version),
        b"stats" => ok(Request::Stats {
            args: Tokens::new(content.get(cmd_len..).unwrap_or_default()),
        }),
        b"watch" => ok(Request::Admin {
            name: cmd,
            args: Tokens::new(content.get(cmd_len..).unwrap_or_default()),
        }),
        [b'm', b'g' | b's' | b'd' | b'n' | b'a' | b'e'] => {
            crate::meta::parse(buf, line, limits).map(Request::Meta)
        }
        _ => parse_other(buf, line, content, limits),
    }
}

/// `get`/`gets <key>*`.
/// `get`/`gets <key>*` (`cmd_len`: the command's length, at the front of `content`).
fn parse_get<'a>(line: &'a [u8], content: &'a [u8], cmd_len: usize, with_cas: bool) -> Parse<'a> {
    // memcached tokenizes the line first, but of its tokens a get needs only where the
    // second starts (the keys are the raw line from there). Within the tokenizer's span
    // (every line but an over-long multiget) that is the first byte after the command that
    // is not a space: found without tokenizing the line, the cost of most requests.
    let first = if line.len() <= TOKENIZER_MAX_LEN {
        let after = content.get(cmd_len..).unwrap_or_default();
        after.iter().position(|&b| b != b' ').map(|i| cmd_len + i)
    } else {
        Toks::new(line).start(1)
    };
    key_section(line, content, first, |keys, rejected| Request::Get {
        with_cas,
        keys,
        rejected,
    })
}

/// `gat`/`gats <exptime> <key>*`.
fn parse_gat<'a>(line: &'a [u8], content: &'a [u8], with_cas: bool) -> Parse<'a> {
    let toks = Toks::new(line);
    if toks.count < 3 {
        return fail(BAD_FORMAT, false, line.len(), 0);
    }
    let Some(exptime) = toks.get(line, 1).and_then(tok_i32) else {
        return fail(INVALID_EXPTIME, false, line.len(), 0);
    };
    key_section(line, content, toks.start(2), |keys, rejected| {
        Request::Gat {
            with_cas,
            exptime: i64::from(exptime),
            keys,
            rejected,
        }
    })
}

/// The keys of a `get`-family line, from the start of its first key token (`first`; None
/// when the line has none: a format error) to the end of the line. memcached walks the raw
/// line (not its 23 tokens), so every key counts. A key over 250 bytes ends the keys there
/// and marks the request rejected (see [`Request::Get`]).
fn key_section<'a>(
    line: &'a [u8],
    content: &'a [u8],
    first: Option<usize>,
    build: impl FnOnce(Keys<'a>, bool) -> Request<'a>,
) -> Parse<'a> {
    let Some(section) = first.and_then(|s| content.get(s..)) else {
        return fail(BAD_FORMAT, false, line.len(), 0);
    };
    let mut tokens = Tokens::new(section);
    let mut end = 0;
    while let Some(key) = tokens.next() {
        if key.len() > MAX_KEY_LEN {
            let before = section.get(..end).unwrap_or_default();
            return Parse::Request(build(Keys::new(before), true), line.len());
        }
        end = section.len() - tokens.rest.len();
    }
    Parse::Request(build(Keys::new(section), false), line.len())
}

/// The six storage commands, data block included.
fn parse_store<'a>(buf: &'a [u8], line: &'a [u8], mode: StoreMode, limits: &Limits) -> Parse<'a> {
    let line_len = line.len();
    let toks = Toks::new(line);
    if toks.count < 5 {
        return fail(BAD_FORMAT, false, line_len, 0);
    }
    // Only the data length is checked before memcached knows how much to swallow.
    let vlen = match toks.get(line, 4).and_then(tok_i32) {
        Some(v) if (0..=i32::MAX - 2).contains(&v) => v as usize,
        _ => return fail(BAD_FORMAT, false, line_len, 0),
    };
    let noreply = toks.ends_with_noreply(line);
    let swallow = vlen + 2;
    let reject = || fail(BAD_FORMAT, noreply, line_len, swallow);
    let Some(key) = toks.get(line, 1) else {
        return reject();
    };
    if key.len() > MAX_KEY_LEN {
        return reject();
    }
    // flags and exptime go through strtoul/strtol on the raw line, as in memcached.
    let flags = toks
        .start(2)
        .and_then(|s| line.get(s..))
        .and_then(c_strtoul_u32);
    let exptime = toks
        .start(3)
        .and_then(|s| line.get(s..))
        .and_then(c_strtol_i32);
    let (Some(flags), Some(exptime)) = (flags, exptime) else {
        return reject();
    };
    let cas = if mode == StoreMode::Cas {
        match toks.get(line, 5).and_then(tok_u64) {
            Some(cas) => cas,
            None => return reject(),
        }
    } else {
        0
    };
    if vlen > limits.max_value {
        return Parse::TooLarge {
            mode,
            key,
            noreply,
            consumed: line_len,
            swallow,
        };
    }
    let Some(total) = line_len.checked_add(swallow) else {
        return Parse::Close;
    };
    let Some(block) = buf.get(line_len..total) else {
        return Parse::Incomplete;
    };
    let (data, terminator) = block.split_at(vlen);
    if terminator != b"\r\n" {
        return fail(BAD_DATA_CHUNK, noreply, total, 0);
    }
    Parse::Request(
        Request::Store {
            mode,
            key,
            flags,
            exptime: i64::from(exptime),
            cas,
            data,
            noreply,
        },
        total,
    )
}

/// The largest cursor a `replpull` may carry.
pub const MAX_REPL_CURSOR: usize = 1 << 20;

/// `replpull <replid> <bytes>\r\n<cursor>\r\n`.
fn parse_replpull<'a>(buf: &'a [u8], line: &'a [u8], toks: &Toks) -> Parse<'a> {
    let line_len = line.len();
    let (3 | 4, Some(replid), Some(n)) = (toks.count, toks.get(line, 1), toks.get(line, 2)) else {
        return fail(BAD_FORMAT, false, line_len, 0);
    };
    let name = toks.get(line, 3).unwrap_or(b"-");
    if name.len() > 64 || replid.len() > 64 {
        return fail(BAD_FORMAT, false, line_len, 0);
    }
    let Some(n) = tok_u32(n)
        .map(|n| n as usize)
        .filter(|&n| n <= MAX_REPL_CURSOR)
    else {
        return Parse::Close;
    };
    let total = line_len + n + 2;
    let Some(block) = buf.get(line_len..total) else {
        return Parse::Incomplete;
    };
    let (cursor, terminator) = block.split_at(n);
    if terminator != b"\r\n" {
        return fail(BAD_DATA_CHUNK, false, total, 0);
    }
    Parse::Request(
        Request::ReplPull {
            replid,
            name,
            cursor,
        },
        total,
    )
}

/// `incr`/`decr <key> <delta> [noreply]`.
fn parse_arith(line: &[u8], incr: bool) -> Parse<'_> {
    let len = line.len();
    let toks = Toks::new(line);
    let (Some(key), true) = (toks.get(line, 1), toks.count >= 3) else {
        return fail(BAD_FORMAT, false, len, 0);
    };
    let noreply = toks.ends_with_noreply(line);
    if key.len() > MAX_KEY_LEN {
        return fail(BAD_FORMAT, noreply, len, 0);
    }
    let Some(delta) = toks.get(line, 2).and_then(tok_u64) else {
        return fail(INVALID_DELTA, noreply, len, 0);
    };
    Parse::Request(
        Request::Arith {
            incr,
            key,
            delta,
            noreply,
        },
        len,
    )
}

/// `touch <key> <exptime> [noreply]`.
fn parse_touch(line: &[u8]) -> Parse<'_> {
    let len = line.len();
    let toks = Toks::new(line);
    let (Some(key), true) = (toks.get(line, 1), toks.count >= 3) else {
        return fail(BAD_FORMAT, false, len, 0);
    };
    let noreply = toks.ends_with_noreply(line);
    if key.len() > MAX_KEY_LEN {
        return fail(BAD_FORMAT, noreply, len, 0);
    }
    let Some(exptime) = toks.get(line, 2).and_then(tok_i32) else {
        return fail(INVALID_EXPTIME, noreply, len, 0);
    };
    Parse::Request(
        Request::Touch {
            key,
            exptime: i64::from(exptime),
            noreply,
        },
        len,
    )
}

/// `delete <key> [...] [noreply]`.
fn parse_delete(line: &[u8]) -> Parse<'_> {
    let len = line.len();
    let toks = Toks::new(line);
    let Some(key) = toks.get(line, 1) else {
        return fail(BAD_FORMAT, false, len, 0);
    };
    let noreply = toks.ends_with_noreply(line);
    if key.len() > MAX_KEY_LEN {
        return fail(BAD_FORMAT, noreply, len, 0);
    }
    Parse::Request(Request::Delete { key, noreply }, len)
}

/// Everything not recognised by its command word: the admin commands, found by their first
/// token, then unknown commands (`ERROR`, or a silent close for something ending in `HTTP/`).
fn parse_other<'a>(buf: &'a [u8], line: &'a [u8], content: &'a [u8], limits: &Limits) -> Parse<'a> {
    let len = line.len();
    let toks = Toks::new(line);
    let noreply = toks.ends_with_noreply(line);
    let ok = |request| Parse::Request(request, len);
    if let (Some(name), Some(name_end)) = (toks.get(line, 0), toks.end(0)) {
        let args = Tokens::new(content.get(name_end..).unwrap_or_default());
        match name {
            b"flush_all" => {
                if !limits.flush_enabled {
                    return fail(FLUSH_NOT_ALLOWED, noreply, len, 0);
                }
                let bare = toks.count == if noreply { 2 } else { 1 };
                let delay = if bare {
                    Some(0)
                } else {
                    toks.get(line, 1).and_then(tok_i32)
                };
                return match delay {
                    Some(delay) => ok(Request::FlushAll {
                        delay: i64::from(delay),
                        noreply,
                    }),
                    None => fail(INVALID_EXPTIME, noreply, len, 0),
                };
            }
            b"verbosity" => {
                return match toks.get(line, 1).and_then(tok_u32) {
                    Some(level) => ok(Request::Verbosity { level, noreply }),
                    None => fail(BAD_FORMAT, noreply, len, 0),
                };
            }
            b"cache_memlimit" => {
                return match toks.get(line, 1).and_then(tok_u32) {
                    Some(mb) => ok(Request::CacheMemlimit {
                        megabytes: u64::from(mb),
                        noreply,
                    }),
                    None => fail(ErrorReply::Error, noreply, len, 0),
                };
            }
            b"shutdown" => {
                if !limits.shutdown_enabled {
                    return fail(SHUTDOWN_NOT_ENABLED, noreply, len, 0);
                }
                return match (toks.count, toks.get(line, 1)) {
                    (1, _) => ok(Request::Shutdown { graceful: false }),
                    (2, Some(mode)) if c_strncmp_eq(mode, b"graceful") => {
                        ok(Request::Shutdown { graceful: true })
                    }
                    _ => fail(INVALID_SHUTDOWN_MODE, noreply, len, 0),
                };
            }
            b"slabs" | b"lru" | b"lru_crawler" | b"extstore" | b"misbehave" | b"refresh_certs" => {
                return ok(Request::Admin { name, args });
            }
            b"debugtime" => {
                if let Some(seconds) = toks.get(line, 1).and_then(tok_i64) {
                    return ok(Request::DebugTime { seconds });
                }
            }
            b"replicaof" => {
                return match (toks.count, toks.get(line, 1), toks.get(line, 2)) {
                    (3, Some(b"no"), Some(b"one")) => ok(Request::ReplicaOf { master: None }),
                    (3, Some(host), Some(port)) => match tok_u32(port) {
                        Some(p @ 1..=65535) if host.len() <= 255 => ok(Request::ReplicaOf {
                            master: Some((host, p as u16)),
                        }),
                        _ => fail(BAD_FORMAT, false, len, 0),
                    },
                    _ => fail(BAD_FORMAT, false, len, 0),
                };
            }
            b"replpull" => return parse_replpull(buf, line, &toks),
            _ => {}
        }
    }
    let last = toks.count.checked_sub(1).and_then(|i| toks.get(line, i));
    if toks.count > 1 && last.is_some_and(|t| t.starts_with(b"HTTP/")) {
        return Parse::Close;
    }
    fail(ErrorReply::Error, noreply, len, 0)
}

// ---------------------------------------------------------------------------------------------
// Replies.

/// `END\r\n`: the end of a `get` reply or a stats listing.
pub const END: &[u8] = b"END\r\n";
/// `STORED\r\n`.
pub const STORED: &[u8] = b"STORED\r\n";
/// `NOT_STORED\r\n`.
pub const NOT_STORED: &[u8] = b"NOT_STORED\r\n";
/// `EXISTS\r\n`.
pub const EXISTS: &[u8] = b"EXISTS\r\n";
/// `NOT_FOUND\r\n`.
pub const NOT_FOUND: &[u8] = b"NOT_FOUND\r\n";
/// `DELETED\r\n`.
pub const DELETED: &[u8] = b"DELETED\r\n";
/// `TOUCHED\r\n`.
pub const TOUCHED: &[u8] = b"TOUCHED\r\n";
/// `OK\r\n`.
pub const OK: &[u8] = b"OK\r\n";
/// `ERROR\r\n`.
pub const ERROR: &[u8] = b"ERROR\r\n";
/// `RESET\r\n`: the reply to `stats reset`.
pub const RESET: &[u8] = b"RESET\r\n";

/// `VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\n`: one item of a `get`-family reply.
pub fn write_value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    out.reserve(key.len() + data.len() + 64);
    write_value_header(out, key, flags, data.len(), cas);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// `VALUE <key> <flags> <bytes>[ <cas>]\r\n` alone, for a server that sends the data block
/// (and its `\r\n`) from the item without copying it.
pub fn write_value_header(
    out: &mut Vec<u8>,
    key: &[u8],
    flags: u32,
    bytes: usize,
    cas: Option<u64>,
) {
    out.reserve(key.len() + 62);
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    put_u64(out, u64::from(flags));
    out.push(b' ');
    put_u64(out, bytes as u64);
    if let Some(cas) = cas {
        out.push(b' ');
        put_u64(out, cas);
    }
    out.extend_from_slice(b"\r\n");
}

/// The line for an error reply, `\r\n` included.
pub fn write_error(out: &mut Vec<u8>, reply: ErrorReply) {
    match reply {
        ErrorReply::Error => out.extend_from_slice(ERROR),
        ErrorReply::Client(msg) => {
            out.extend_from_slice(b"CLIENT_ERROR ");
            out.extend_from_slice(msg.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        ErrorReply::Server(msg) => {
            out.extend_from_slice(b"SERVER_ERROR ");
            out.extend_from_slice(msg.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        ErrorReply::Raw(line) => {
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// `<n>\r\n`: the reply to a successful `incr`/`decr`.
pub fn write_number(out: &mut Vec<u8>, n: u64) {
    put_u64(out, n);
    out.extend_from_slice(b"\r\n");
}

/// `STAT <name> <value>\r\n`. Formatting `value` allocates nothing beyond growing `out`.
pub fn write_stat(out: &mut Vec<u8>, name: &str, value: impl core::fmt::Display) {
    use std::io::Write as _;
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{value}");
    out.extend_from_slice(b"\r\n");
}

/// `STAT <name> <value>\r\n` for an integer, without the formatting machinery.
pub fn write_stat_u64(out: &mut Vec<u8>, name: &str, value: u64) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    put_u64(out, value);
    out.extend_from_slice(b"\r\n");
}

/// `VERSION <version>\r\n`.
pub fn write_version(out: &mut Vec<u8>, version: &str) {
    out.extend_from_slice(b"VERSION ");
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests;
