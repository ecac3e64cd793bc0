//! What the text and meta protocols share below their commands: the parse result, error
//! replies, the server's limits, memcached's tokenizer and its number parsing. `text` and
//! `meta` both build on this module; it imports neither (the text parser hands a meta line to
//! `meta`, which returns its own request type, so no module of this crate imports one that
//! imports it back).

/// memcached's tokenizer only looks at this many bytes of a line (its token offsets are `u16`).
pub(crate) const TOKENIZER_MAX_LEN: usize = 65534;

/// memcached's tokenizer keeps this many tokens of a line and ignores the rest.
pub(crate) const MAX_TOKENS: usize = 23;

/// What the parser needs to know about the server's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest data block a storage command may carry (memcached's `-I`, item size max).
    /// A storage command that declares more is answered with
    /// `SERVER_ERROR object too large for cache` (unless `noreply`) and its data block is
    /// swallowed.
    pub max_value: usize,
    /// `flush_all` is allowed (memcached's default; its `-F` forbids it, and then every
    /// `flush_all` is answered `CLIENT_ERROR flush_all not allowed`).
    pub flush_enabled: bool,
    /// `shutdown` is allowed (memcached's `-A`; off by default, and then every `shutdown` is
    /// answered `SERVER_ERROR: shutdown not enabled`).
    pub shutdown_enabled: bool,
}

impl Limits {
    /// memcached's defaults with the given largest data block.
    pub const fn new(max_value: usize) -> Self {
        Limits {
            max_value,
            flush_enabled: true,
            shutdown_enabled: false,
        }
    }
}

impl Default for Limits {
    /// memcached's defaults: 1 MiB items, `flush_all` allowed, `shutdown` not.
    fn default() -> Self {
        Limits::new(1 << 20)
    }
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

/// Space-separated tokens of the rest of a command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens<'a> {
    pub(crate) rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    pub fn new(rest: &'a [u8]) -> Self {
        Tokens { rest }
    }

    /// The unsplit remaining bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.rest
    }

    /// Whether the last token is exactly `noreply` (memcached's test for the admin commands).
    pub fn ends_with_noreply(&self) -> bool {
        self.last() == Some(b"noreply".as_slice())
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = self.rest.get(start..)?;
        let end = find_byte(b' ', rest).unwrap_or(rest.len());
        let (token, after) = rest.split_at(end);
        self.rest = after;
        Some(token)
    }
}

/// The first `byte` in `hay`: byte by byte in a short haystack, with `memchr`'s SIMD
/// search in a longer one. Byte at a time costs a few instructions a byte (a tenth of a
/// pipelined GET's instructions with 32-byte keys: line ends, then key separators), while
/// `memchr`'s setup costs more than a short scan (always calling it made a GET of a 10-byte
/// key 4-5% more instructions; `bench/instructions.sh`, BENCHMARKS.md).
#[inline]
pub(crate) fn find_byte(byte: u8, hay: &[u8]) -> Option<usize> {
    if hay.len() < 32 {
        hay.iter().position(|&b| b == byte)
    } else {
        memchr::memchr(byte, hay)
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
    /// A whole line in another shape (without its `\r\n`), e.g.
    /// `SERVER_ERROR: shutdown not enabled`.
    Raw(&'static str),
}

/// `CLIENT_ERROR bad command line format`.
pub const BAD_FORMAT: ErrorReply = ErrorReply::Client("bad command line format");
/// `CLIENT_ERROR bad data chunk`: a data block not followed by `\r\n`.
pub const BAD_DATA_CHUNK: ErrorReply = ErrorReply::Client("bad data chunk");
/// `CLIENT_ERROR invalid exptime argument` (`touch`, `gat`, `flush_all`).
pub const INVALID_EXPTIME: ErrorReply = ErrorReply::Client("invalid exptime argument");
/// `CLIENT_ERROR invalid numeric delta argument` (`incr`, `decr`).
pub const INVALID_DELTA: ErrorReply = ErrorReply::Client("invalid numeric delta argument");
/// `CLIENT_ERROR invalid shutdown mode`.
pub const INVALID_SHUTDOWN_MODE: ErrorReply = ErrorReply::Client("invalid shutdown mode");
/// `CLIENT_ERROR flush_all not allowed` (flush disabled).
pub const FLUSH_NOT_ALLOWED: ErrorReply = ErrorReply::Client("flush_all not allowed");
/// `SERVER_ERROR: shutdown not enabled` (shutdown disabled; note the colon).
pub const SHUTDOWN_NOT_ENABLED: ErrorReply = ErrorReply::Raw("SERVER_ERROR: shutdown not enabled");
/// `SERVER_ERROR object too large for cache`: the reply to [`Parse::TooLarge`].
pub const TOO_LARGE: ErrorReply = ErrorReply::Server("object too large for cache");

/// The result of looking at the front of a read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse<'a, R> {
    /// A whole request, which occupied the first `usize` bytes.
    Request(R, usize),
    /// More bytes are needed; nothing was consumed.
    Incomplete,
    /// A malformed request: send `reply` unless `noreply` (memcached silences most errors of
    /// a `noreply` request), drop the first `consumed` bytes, then discard `swallow` further
    /// bytes as they arrive (a rejected storage command's data block and its `\r\n`; usually
    /// 0), and carry on.
    Error {
        reply: ErrorReply,
        noreply: bool,
        consumed: usize,
        swallow: usize,
    },
    /// A storage command whose declared data block is larger than [`Limits::max_value`]:
    /// reply `SERVER_ERROR object too large for cache` ([`TOO_LARGE`]) unless `noreply`
    /// (memcached 1.6.18 and the newest both stay silent then), drop the first `consumed`
    /// bytes (the command line) and then discard `swallow` further bytes (the data block and
    /// its `\r\n`) as they arrive. For `set`, memcached also removes the old item under `key`.
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

impl<'a, R> Parse<'a, R> {
    /// The same result with its request turned into another type (a meta request into the
    /// text protocol's `Request::Meta`).
    pub fn map<S>(self, f: impl FnOnce(R) -> S) -> Parse<'a, S> {
        match self {
            Parse::Request(r, n) => Parse::Request(f(r), n),
            Parse::Incomplete => Parse::Incomplete,
            Parse::Error {
                reply,
                noreply,
                consumed,
                swallow,
            } => Parse::Error {
                reply,
                noreply,
                consumed,
                swallow,
            },
            Parse::TooLarge {
                mode,
                key,
                noreply,
                consumed,
                swallow,
            } => Parse::TooLarge {
                mode,
                key,
                noreply,
                consumed,
                swallow,
            },
            Parse::Close => Parse::Close,
        }
    }
}

/// Builds a [`Parse::Error`].
pub(crate) fn fail<'a, R>(
    reply: ErrorReply,
    noreply: bool,
    consumed: usize,
    swallow: usize,
) -> Parse<'a, R> {
    Parse::Error {
        reply,
        noreply,
        consumed,
        swallow,
    }
}

/// memcached's view of a command line: the first [`MAX_TOKENS`] space-separated tokens within
/// its first [`TOKENIZER_MAX_LEN`] bytes (minus the terminator), as `(start, end)` offsets.
#[derive(Clone, Copy)]
pub(crate) struct Toks {
    pub(crate) count: usize,
    spans: [(u16, u16); MAX_TOKENS],
}

impl Toks {
    /// Tokenize a whole line, terminator included.
    pub(crate) fn new(line: &[u8]) -> Toks {
        let mut toks = Toks {
            count: 0,
            spans: [(0, 0); MAX_TOKENS],
        };
        let len = line.len().min(TOKENIZER_MAX_LEN);
        if len < 2 {
            return toks;
        }
        // As memcached: the last byte of what it looks at is the terminator, with a '\r'
        // before it dropped (for a line cut at 65,534 bytes this drops a real byte).
        let end = if line.get(len - 2) == Some(&b'\r') {
            len - 2
        } else {
            len - 1
        };
        let body = line.get(..end).unwrap_or_default();
        let mut i = 0;
        while toks.count < MAX_TOKENS {
            while body.get(i) == Some(&b' ') {
                i += 1;
            }
            if i >= body.len() {
                break;
            }
            let start = i;
            while body.get(i).is_some_and(|&b| b != b' ') {
                i += 1;
            }
            // Offsets are below TOKENIZER_MAX_LEN, so they fit in u16.
            if let Some(span) = toks.spans.get_mut(toks.count) {
                *span = (start as u16, i as u16);
            }
            toks.count += 1;
        }
        toks
    }

    pub(crate) fn span(&self, i: usize) -> Option<(usize, usize)> {
        if i >= self.count {
            return None;
        }
        self.spans
            .get(i)
            .map(|&(s, e)| (usize::from(s), usize::from(e)))
    }

    pub(crate) fn start(&self, i: usize) -> Option<usize> {
        self.span(i).map(|(s, _)| s)
    }

    pub(crate) fn end(&self, i: usize) -> Option<usize> {
        self.span(i).map(|(_, e)| e)
    }

    pub(crate) fn get<'a>(&self, line: &'a [u8], i: usize) -> Option<&'a [u8]> {
        let (s, e) = self.span(i)?;
        line.get(s..e)
    }

    /// memcached's `noreply` test: the last token (of the first 23) is exactly `noreply`.
    pub(crate) fn ends_with_noreply(&self, line: &[u8]) -> bool {
        let last = self.count.checked_sub(1).and_then(|i| self.get(line, i));
        last == Some(b"noreply".as_slice())
    }
}

/// C's `strncmp(token, lit, token_len) == 0`, which memcached uses to match a subcommand:
/// true when the token is a prefix of `lit` (or equals it up to a NUL byte).
pub(crate) fn c_strncmp_eq(token: &[u8], lit: &[u8]) -> bool {
    for (i, &a) in token.iter().enumerate() {
        let b = lit.get(i).copied().unwrap_or(0);
        if a != b {
            return false;
        }
        if a == 0 {
            return true;
        }
    }
    true
}

/// memcached's strict unsigned token parser (mcmc `toktou32`/`toktou64`): at most `max_len`
/// bytes, digits only, no sign.
pub(crate) fn tok_unsigned(tok: &[u8], max_len: usize) -> Option<u64> {
    if tok.len() > max_len {
        return None;
    }
    tok.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// memcached's strict signed token parser (mcmc `tokto32`/`tokto64`): at most `max_len`
/// bytes, an optional leading `-`, then digits (none at all reads as 0, so `-` is 0).
pub(crate) fn tok_signed(tok: &[u8], max_len: usize) -> Option<i64> {
    if tok.len() > max_len {
        return None;
    }
    let (negative, digits) = match tok.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, tok),
    };
    digits.iter().try_fold(0i64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        let d = i64::from(b - b'0');
        let acc = acc.checked_mul(10)?;
        if negative {
            acc.checked_sub(d)
        } else {
            acc.checked_add(d)
        }
    })
}

pub(crate) fn tok_u32(tok: &[u8]) -> Option<u32> {
    tok_unsigned(tok, 11).and_then(|v| u32::try_from(v).ok())
}

pub(crate) fn tok_u64(tok: &[u8]) -> Option<u64> {
    tok_unsigned(tok, 22)
}

pub(crate) fn tok_i32(tok: &[u8]) -> Option<i32> {
    tok_signed(tok, 11).and_then(|v| i32::try_from(v).ok())
}

pub(crate) fn tok_i64(tok: &[u8]) -> Option<i64> {
    tok_signed(tok, 22)
}

/// C's `isspace` in the C locale.
pub(crate) fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// A number read the way glibc's `strtoul`/`strtol` read base 10, plus memcached's `safe_`
/// wrappers' check that it ends at whitespace or the end of the string.
pub(crate) struct CNumber {
    negative: bool,
    /// The magnitude, `None` when it overflowed `u64` (`ERANGE`).
    magnitude: Option<u64>,
}

/// Reads a C number from `s` (which stands for a NUL-terminated string: the end of `s` or a NUL
/// byte ends it). `None` when there are no digits or they are not followed by whitespace/NUL.
pub(crate) fn c_number(s: &[u8]) -> Option<CNumber> {
    let mut i = s.iter().take_while(|&&b| is_c_space(b)).count();
    let mut negative = false;
    if let Some(&sign @ (b'+' | b'-')) = s.get(i) {
        negative = sign == b'-';
        i += 1;
    }
    let digits = s
        .get(i..)
        .unwrap_or_default()
        .iter()
        .take_while(|b| b.is_ascii_digit());
    let mut count = 0;
    let mut magnitude = Some(0u64);
    for &b in digits {
        count += 1;
        magnitude = magnitude
            .and_then(|m| m.checked_mul(10))
            .and_then(|m| m.checked_add(u64::from(b - b'0')));
    }
    if count == 0 {
        return None;
    }
    match s.get(i + count) {
        None | Some(0) => {}
        Some(&b) if is_c_space(b) => {}
        Some(_) => return None,
    }
    Some(CNumber {
        negative,
        magnitude,
    })
}

/// memcached's `safe_strtoul` into 32-bit client flags: `strtoul` with a 64-bit `long`, a
/// negative result refused only when it looks negative as a signed number, then truncated to
/// 32 bits (so `4294967297` is 1 and `-18446744073709551615` is 1).
pub(crate) fn c_strtoul_u32(s: &[u8]) -> Option<u32> {
    let n = c_number(s)?;
    let magnitude = n.magnitude?;
    let value = if n.negative {
        magnitude.wrapping_neg()
    } else {
        magnitude
    };
    if n.negative && (value as i64) < 0 {
        return None;
    }
    Some(value as u32)
}

/// memcached's `safe_strtol` into an `int32_t`: `strtol` with a 64-bit `long` (out of range is
/// an error), then truncated to 32 bits.
pub(crate) fn c_strtol_i32(s: &[u8]) -> Option<i32> {
    let n = c_number(s)?;
    let magnitude = n.magnitude?;
    let value = if n.negative {
        if magnitude > 1 << 63 {
            return None;
        }
        (magnitude as i64).wrapping_neg()
    } else {
        i64::try_from(magnitude).ok()?
    };
    Some(value as i32)
}

/// Appends the decimal digits of `n`.
pub(crate) fn put_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        if let Some(d) = digits.get_mut(i) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(digits.get(i..).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::find_byte;

    /// Short haystacks and long ones (the two ways it searches) find what a plain scan finds:
    /// the first match at every position, a later duplicate ignored, and no match.
    #[test]
    fn find_byte_finds_what_a_scan_finds() {
        for len in 0..100 {
            let mut hay = vec![b'k'; len];
            assert_eq!(find_byte(b'\n', &hay), None, "len {len}");
            for at in 0..len {
                hay.fill(b'k');
                hay[at] = b'\n';
                if let Some(last) = hay.last_mut().filter(|_| at + 1 < len) {
                    *last = b'\n';
                }
                assert_eq!(find_byte(b'\n', &hay), Some(at), "len {len} at {at}");
            }
        }
    }
}
