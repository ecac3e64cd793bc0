//! The classic memcached text protocol: request parsing and reply composing.
//!
//! [`parse`] looks at the front of a connection's read buffer and returns one request and the
//! number of bytes it occupied, or [`Parse::Incomplete`] when more bytes are needed. It borrows
//! keys and data blocks from the buffer (no copies, no allocation) and never panics.
//!
//! The reply helpers append memcached's exact reply bytes to a `Vec<u8>`.

use crate::MAX_KEY_LEN;

/// A command line longer than this with no newline closes the connection, unless it is a
/// `get`/`gets` line (memcached's rule).
pub const MAX_LINE_LEN: usize = 2048;

/// memcached lets a `get`/`gets` line grow without limit; kvcached bounds it so that a client
/// cannot make the server buffer without limit. A longer line closes the connection.
pub const MAX_GET_LINE_LEN: usize = 1 << 20;

/// What the parser needs to know about the server's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest data block a storage command may carry (memcached's `-I`, item size max).
    /// A storage command that declares more is answered with
    /// `SERVER_ERROR object too large for cache` and its data block is swallowed.
    pub max_value: usize,
}

/// The storage commands, which carry a data block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// `cas`: store only if the item's CAS unique still equals the one given.
    Cas,
}

/// One parsed request. Byte slices borrow from the buffer given to [`parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get <key>*` / `gets <key>*` (`with_cas` for `gets`).
    Get { with_cas: bool, keys: Keys<'a> },
    /// `gat <exptime> <key>*` / `gats <exptime> <key>*`.
    Gat {
        with_cas: bool,
        exptime: i64,
        keys: Keys<'a>,
    },
    /// `set|add|replace|append|prepend <key> <flags> <exptime> <bytes> [noreply]`,
    /// `cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]`; `data` excludes the `\r\n`.
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
    /// `delete <key> [noreply]` (memcached 1.6.40+ also tolerates extra tokens; see docs).
    Delete { key: &'a [u8], noreply: bool },
    /// `incr|decr <key> <delta> [noreply]`.
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    /// `touch <key> <exptime> [noreply]`.
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`; `delay` is 0 when absent.
    FlushAll { delay: i64, noreply: bool },
    /// `version`.
    Version,
    /// `verbosity <level> [noreply]`.
    Verbosity { level: u32, noreply: bool },
    /// `quit`.
    Quit,
    /// `shutdown [graceful]`.
    Shutdown { graceful: bool },
    /// `stats [group [args]]`: the tokens after `stats`, unparsed.
    Stats { args: Tokens<'a> },
    /// `cache_memlimit <megabytes> [noreply]`.
    CacheMemlimit { megabytes: u64, noreply: bool },
    /// `debugtime <seconds>`: shift the server's clock (only honoured when the server enables
    /// its test clock; otherwise the server answers `ERROR`, as an unknown command).
    DebugTime { seconds: i64 },
    /// Commands memcached knows that kvcached answers without implementing them in full:
    /// `slabs`, `lru`, `lru_crawler`, `watch`, `misbehave`, `extstore`. `name` is the command.
    Admin { name: &'a [u8], args: Tokens<'a> },
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
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        self.tokens.next()
    }
}

/// Space-separated tokens of the rest of a command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    pub fn new(rest: &'a [u8]) -> Self {
        Tokens { rest }
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = &self.rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        let (token, after) = rest.split_at(end);
        self.rest = after;
        Some(token)
    }
}

/// An error reply: the line memcached sends for a bad request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorReply {
    /// `ERROR` (unknown command).
    Error,
    /// `CLIENT_ERROR <message>`.
    Client(&'static str),
    /// `SERVER_ERROR <message>`.
    Server(&'static str),
}

/// The result of looking at the front of a read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse<'a> {
    /// A whole request, which occupied the first `usize` bytes.
    Request(Request<'a>, usize),
    /// More bytes are needed; nothing was consumed.
    Incomplete,
    /// A malformed request: send `reply`, drop the first `consumed` bytes, carry on.
    Error { reply: ErrorReply, consumed: usize },
    /// A storage command whose declared data block is larger than [`Limits::max_value`]:
    /// reply `SERVER_ERROR object too large for cache` (even with `noreply`, as memcached
    /// does), drop the first `consumed` bytes (the command line) and then discard `swallow`
    /// further bytes (the data block and its `\r\n`) as they arrive. For `set`, memcached
    /// also removes the old item under `key`.
    TooLarge {
        mode: StoreMode,
        key: &'a [u8],
        noreply: bool,
        consumed: usize,
        swallow: usize,
    },
    /// The connection must be closed without a reply (an over-long line, an HTTP request).
    Close,
}

/// Parse one request from the front of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parse<'a> {
    let _ = (buf, limits, MAX_KEY_LEN);
    Parse::Incomplete
}
