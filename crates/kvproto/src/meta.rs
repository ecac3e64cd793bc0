//! The memcached meta protocol (`mg`, `ms`, `md`, `ma`, `mn`, `me`): request parsing and reply
//! composing.
//!
//! Meta commands share a connection with the classic text commands, so they are parsed by
//! [`text::parse`](crate::text::parse), which hands a line starting `mg `, `ms `, ... to this
//! module and returns [`Request::Meta`]. As there, keys and data borrow from the read buffer,
//! [`Parse::Incomplete`] is a normal result, nothing allocates and nothing panics. The reply
//! helpers ([`MetaReply`], [`write_debug`]) append memcached's exact bytes to a `Vec<u8>`.
//!
//! # Syntax
//!
//! ```text
//! mg <key> <flag>*            ms <key> <datalen> <flag>*\r\n<data>\r\n
//! md <key> <flag>*            ma <key> <flag>*
//! mn [anything]               me <key> [b <anything>]
//! ```
//!
//! A flag is a token whose first byte names it; the rest of the token is its argument (`T30`,
//! `Oabc`, `MS`). Any flag is accepted by any of `mg`, `ms`, `md`, `ma` (the newest memcached
//! parses them all with one routine and each command ignores the ones it has no use for); the
//! docs of [`MetaArgs`]'s accessors say what each command does with each flag.
//!
//! # Whose behaviour
//!
//! The newest memcached (1.6.4x, `proto_parser.c`'s `_meta_flag_preparse` and the mcmc
//! tokenizer), checked against a build of it, errors and their order included:
//!
//! 1. A line is split into at most 23 tokens, as for the text commands. A token in a flag
//!    position (from the third token on; from the fourth for `ms`) must start with a digit or a
//!    byte in `A..=z`, or the whole line is `CLIENT_ERROR bad command line format` (for `ms`
//!    without swallowing its data block, which is then read as a command).
//! 2. `ms` needs `<datalen>`: a strict decimal `0..=2147483645` (as `set`'s), or the line is
//!    `CLIENT_ERROR bad command line format`, again swallowing nothing. Every later `ms` error
//!    swallows the data block.
//! 3. A key over 250 bytes (counted before base64 decoding) is
//!    `CLIENT_ERROR bad command line format`; more than 20 tokens on the line is
//!    `CLIENT_ERROR options flags are too long`.
//! 4. Flags are read left to right. A second flag with the same first byte is
//!    `CLIENT_ERROR duplicate flag` and an unknown one `CLIENT_ERROR invalid flag`, at once. A bad
//!    argument does not stop the scan: the error reported is the last one found (`N`, `T`, `R`,
//!    `C`, `E`: `bad token in command line format`; `J`: `invalid numeric initial value`; `D`:
//!    `invalid numeric delta value`; `b` with a key that does not decode: `error decoding key`;
//!    `F` sets no message of its own, so alone it is `bad command line format`).
//! 5. `ma` replaces any error of steps 3-4 with `CLIENT_ERROR invalid or duplicate flag`.
//! 6. `ms`/`ma`: the mode (the byte after `M`) must be one the command knows:
//!    `CLIENT_ERROR invalid mode for ms M token` / `... for ma M token`.
//! 7. `ms`: a data block larger than [`Limits::max_value`] is
//!    `SERVER_ERROR object too large for cache` ([`Parse::TooLarge`]).
//! 8. An `O` token longer than 32 bytes (`O` included) is `CLIENT_ERROR opaque token too long`.
//! 9. `ms`: a data block not followed by `\r\n` is `CLIENT_ERROR bad data chunk`; the line, the
//!    block and the two bytes after it are consumed.
//!
//! The `q` flag never silences an error: every [`Parse::Error`] from here has `noreply: false`.
//!
//! Deliberate differences from the newest memcached:
//!
//! - An over-long opaque is refused before anything happens. memcached notices it while writing
//!   the reply, after `mg` has applied `T`/`N` and after `ma` has applied its delta.
//! - `ms` with a base64 key (`b`) and a too-large data block: memcached also removes the item
//!   under the decoded key; here it is a plain [`Parse::Error`] with [`TOO_LARGE`], as a decoded
//!   key cannot be borrowed from the buffer. With a plain key it is a [`Parse::TooLarge`] whose
//!   `mode` is always [`StoreMode::Set`], because memcached's `ms` removes the old item in every
//!   mode, as the text protocol's `set` does.
//!
//! memcached 1.6.18 (Debian) differs in ways listed in the tests' module docs; the main ones:
//! it allows only 19 tokens, rejects flags a command does not use with `invalid flag`, wants `M`
//! tokens to be exactly two bytes (`incorrect length for M token`), reports bad flag starts as
//! `invalid flag`, parses numbers more loosely, and its `md`/`ma` report most errors as
//! `invalid or duplicate flag`.

use crate::syntax::{
    fail, put_u64, tok_i32, tok_u32, tok_u64, ErrorReply, Limits, StoreMode, Tokens, Toks,
    BAD_DATA_CHUNK, BAD_FORMAT, TOO_LARGE,
};
use crate::MAX_KEY_LEN;

/// A meta command's parse result.
type Parse<'a> = crate::syntax::Parse<'a, MetaRequest<'a>>;

/// At most this many tokens on a meta command line (command, key, `ms`'s data length and
/// flags together).
pub const MAX_META_TOKENS: usize = 20;

/// Longest `O` token, the `O` included (so the opaque value itself is at most 31 bytes).
pub const MAX_OPAQUE_TOKEN_LEN: usize = 32;

/// `CLIENT_ERROR options flags are too long`: more than [`MAX_META_TOKENS`] tokens.
pub const TOO_MANY_TOKENS: ErrorReply = ErrorReply::Client("options flags are too long");
/// `CLIENT_ERROR duplicate flag`: two flags with the same first byte.
pub const DUPLICATE_FLAG: ErrorReply = ErrorReply::Client("duplicate flag");
/// `CLIENT_ERROR invalid flag`: a flag memcached does not know.
pub const INVALID_FLAG: ErrorReply = ErrorReply::Client("invalid flag");
/// `CLIENT_ERROR bad token in command line format`: a bad `N`, `T`, `R`, `C` or `E` argument.
pub const BAD_TOKEN: ErrorReply = ErrorReply::Client("bad token in command line format");
/// `CLIENT_ERROR invalid numeric initial value`: a bad `J` argument.
pub const INVALID_INITIAL: ErrorReply = ErrorReply::Client("invalid numeric initial value");
/// `CLIENT_ERROR invalid numeric delta value`: a bad `D` argument.
pub const INVALID_DELTA: ErrorReply = ErrorReply::Client("invalid numeric delta value");
/// `CLIENT_ERROR error decoding key`: `b` with a key that is not base64.
pub const KEY_NOT_BASE64: ErrorReply = ErrorReply::Client("error decoding key");
/// `CLIENT_ERROR opaque token too long`: an `O` token over [`MAX_OPAQUE_TOKEN_LEN`] bytes.
pub const OPAQUE_TOO_LONG: ErrorReply = ErrorReply::Client("opaque token too long");
/// `CLIENT_ERROR invalid mode for ms M token`.
pub const INVALID_SET_MODE: ErrorReply = ErrorReply::Client("invalid mode for ms M token");
/// `CLIENT_ERROR invalid mode for ma M token`.
pub const INVALID_ARITH_MODE: ErrorReply = ErrorReply::Client("invalid mode for ma M token");
/// `CLIENT_ERROR invalid or duplicate flag`: what `ma` reports for any flag or key error.
pub const INVALID_OR_DUPLICATE_FLAG: ErrorReply = ErrorReply::Client("invalid or duplicate flag");
/// `CLIENT_ERROR cannot increment or decrement non-numeric value`: `ma` on an item whose value
/// is not a number (the server's to send).
pub const NON_NUMERIC: ErrorReply =
    ErrorReply::Client("cannot increment or decrement non-numeric value");

/// One parsed meta request. Byte slices borrow from the buffer given to
/// [`text::parse`](crate::text::parse).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaRequest<'a> {
    /// `mg <key> <flag>*`. Replies: hit `VA <len> <flags>*\r\n<data>\r\n` with `v`, else
    /// `HD <flags>*`; miss `EN` (nothing with `q`).
    Get(MetaArgs<'a>),
    /// `ms <key> <datalen> <flag>*\r\n<data>\r\n`; `data` excludes its `\r\n`. Replies `HD`
    /// (stored; nothing with `q`), `NS` (not stored), `EX` (CAS mismatch), `NF` (CAS given, no
    /// item).
    Set {
        args: MetaArgs<'a>,
        mode: SetMode,
        data: &'a [u8],
    },
    /// `md <key> <flag>*`. Replies `HD` (deleted or invalidated; nothing with `q`), `NF`, `EX`
    /// (CAS mismatch), `NS` (`x` could not store the emptied item).
    Delete(MetaArgs<'a>),
    /// `ma <key> <flag>*`. Replies `HD` or with `v` `VA <len> <flags>*\r\n<number>\r\n`
    /// (nothing with `q`), `NF` (miss without `N`), `NS` (could not create), `EX` (CAS
    /// mismatch), or [`NON_NUMERIC`].
    Arith { args: MetaArgs<'a>, mode: ArithMode },
    /// `mn`: reply [`MN`], and send everything queued for the connection now (memcached
    /// flushes its output on `mn`, which clients put after a batch of `q` requests). Anything
    /// after `mn` on the line is ignored.
    Noop,
    /// `me <key>`: reply [`write_debug`] on a hit, `EN` on a miss. The newest memcached decodes
    /// the key as base64 only when the third token is exactly `b` *and* a fourth token follows
    /// (`me a2V5 b x`; a quirk of its token count, 1.6.18 needs just `me a2V5 b`); any other
    /// tokens are ignored. An item stored with a base64 key is shown with its key in base64.
    Debug { key: MetaKey<'a> },
}

impl<'a> MetaRequest<'a> {
    /// The flags of `mg`, `ms`, `md` and `ma`.
    pub fn args(&self) -> Option<&MetaArgs<'a>> {
        match self {
            MetaRequest::Get(args)
            | MetaRequest::Delete(args)
            | MetaRequest::Set { args, .. }
            | MetaRequest::Arith { args, .. } => Some(args),
            MetaRequest::Noop | MetaRequest::Debug { .. } => None,
        }
    }

    /// The key, for all but `mn`.
    pub fn key(&self) -> Option<MetaKey<'a>> {
        match self {
            MetaRequest::Debug { key } => Some(*key),
            other => other.args().map(|a| a.key()),
        }
    }
}

/// `ms`'s mode, from its `M` flag (`S` when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// `MS`: store unconditionally (the default).
    Set,
    /// `ME`: store only if absent; if present, bump it in the LRU and reply `NS`.
    Add,
    /// `MR`: store only if present (`NS` otherwise).
    Replace,
    /// `MA`: append to the present value (`NS` if absent, unless `N` vivifies).
    Append,
    /// `MP`: prepend to the present value (`NS` if absent, unless `N` vivifies).
    Prepend,
}

impl SetMode {
    fn from_byte(b: u8) -> Option<SetMode> {
        Some(match b {
            b'S' => SetMode::Set,
            b'E' => SetMode::Add,
            b'R' => SetMode::Replace,
            b'A' => SetMode::Append,
            b'P' => SetMode::Prepend,
            _ => return None,
        })
    }

    /// The classic storage command memcached runs for this mode: `Set` and `Replace` with a
    /// `C` compare-CAS become `Cas` (store only if the item's CAS equals it: `EX` if not, `NF`
    /// if there is no item); `Add`, `Append` and `Prepend` keep their mode and check a `C`
    /// themselves (`Append`/`Prepend` reply `EX` on a mismatch; `Add` ignores it).
    pub fn store_mode(self, compare_cas: bool) -> StoreMode {
        match self {
            SetMode::Set | SetMode::Replace if compare_cas => StoreMode::Cas,
            SetMode::Set => StoreMode::Set,
            SetMode::Replace => StoreMode::Replace,
            SetMode::Add => StoreMode::Add,
            SetMode::Append => StoreMode::Append,
            SetMode::Prepend => StoreMode::Prepend,
        }
    }
}

/// `ma`'s mode, from its `M` flag (`I` when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithMode {
    /// `MI` or `M+`: add the delta (wrapping at 2^64, as `incr`).
    Incr,
    /// `MD` or `M-`: subtract the delta, stopping at 0 (as `decr`).
    Decr,
}

impl ArithMode {
    fn from_byte(b: u8) -> Option<ArithMode> {
        match b {
            b'I' | b'+' => Some(ArithMode::Incr),
            b'D' | b'-' => Some(ArithMode::Decr),
            _ => None,
        }
    }
}

/// A buffer for a decoded key (see [`MetaKey::bytes`]).
pub type KeyBuf = [u8; MAX_KEY_LEN];

/// A meta command's key: the token as sent, and whether the `b` flag says it is base64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaKey<'a> {
    raw: &'a [u8],
    base64: bool,
}

impl<'a> MetaKey<'a> {
    /// A key used as sent.
    pub const fn plain(raw: &'a [u8]) -> Self {
        MetaKey { raw, base64: false }
    }

    /// A base64 key, if it decodes (by memcached's rules, see [`decode_base64`]).
    pub fn base64(raw: &'a [u8]) -> Option<Self> {
        let mut buf = [0u8; MAX_KEY_LEN];
        decode_base64(raw, &mut buf)?;
        Some(MetaKey { raw, base64: true })
    }

    /// The key token as sent (still base64 when [`is_base64`](Self::is_base64)).
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// Whether the request had the `b` flag: the key is base64 and the item it names has a
    /// binary key. memcached remembers that on the item (set by `ms ... b`) and echoes such a
    /// key in base64 followed by a ` b` flag ([`MetaReply::key`]).
    pub fn is_base64(&self) -> bool {
        self.base64
    }

    /// The key to look up: the token itself, or its base64 decoding written into `buf`.
    /// The parser has checked that a base64 key decodes; one that does not (only possible for
    /// a hand-built `MetaKey`) gives an empty slice.
    pub fn bytes<'s>(&'s self, buf: &'s mut KeyBuf) -> &'s [u8] {
        if !self.base64 {
            return self.raw;
        }
        let n = decode_base64(self.raw, buf).unwrap_or(0);
        buf.get(..n).unwrap_or_default()
    }
}

/// The set of flags present on a meta request, by their letter (`A`..=`z`).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct FlagSet(u64);

impl FlagSet {
    fn bit(flag: u8) -> u64 {
        if (b'A'..=b'z').contains(&flag) {
            1 << (flag - b'A')
        } else {
            0
        }
    }

    /// Whether `flag` (e.g. `b'v'`) was given.
    pub fn contains(self, flag: u8) -> bool {
        self.0 & Self::bit(flag) != 0
    }

    fn insert(&mut self, flag: u8) {
        self.0 |= Self::bit(flag);
    }

    /// The flags present, in byte order.
    pub fn iter(self) -> impl Iterator<Item = u8> {
        (b'A'..=b'z').filter(move |&f| self.contains(f))
    }
}

impl core::fmt::Debug for FlagSet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let letters: String = self.iter().map(char::from).collect();
        write!(f, "FlagSet({letters:?})")
    }
}

/// The key and flags of `mg`, `ms`, `md` or `ma`, parsed and checked.
///
/// Numeric arguments are `None` when their flag is absent. TTLs (`T`, `N`, `R`) are memcached
/// exptimes within `i32`: negative means already expired, up to 30 days relative, above that
/// a Unix time (as the text protocol's exptime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaArgs<'a> {
    /// The key token; base64 when `flags` has `b`.
    key: &'a [u8],
    flags: FlagSet,
    /// The flag tokens, as sent, for [`MetaArgs::return_flags`] and [`MetaArgs::opaque`].
    section: &'a [u8],
    ttl: i32,
    vivify: i32,
    recache: i32,
    client_flags: u32,
    compare_cas: u64,
    new_cas: u64,
    initial: u64,
    delta: u64,
}

impl<'a> MetaArgs<'a> {
    /// The key (`b`: base64, decode with [`MetaKey::bytes`]).
    pub fn key(&self) -> MetaKey<'a> {
        MetaKey {
            raw: self.key,
            base64: self.has(b'b'),
        }
    }

    /// The flags present.
    pub fn flags(&self) -> FlagSet {
        self.flags
    }

    /// Whether `flag` was given, e.g. `has(b'k')`.
    pub fn has(&self, flag: u8) -> bool {
        self.flags.contains(flag)
    }

    fn get<T>(&self, flag: u8, value: T) -> Option<T> {
        self.has(flag).then_some(value)
    }

    /// `q`, quiet: leave out the reply that means "as expected": `mg` `EN` (a miss; a hit is
    /// still sent), `ms` `HD`, `md` `HD`, `ma` `HD`/`VA`. Other replies (`NS`, `EX`, `NF`) and
    /// all errors are still sent; clients end a batch of quiet requests with `mn`.
    pub fn quiet(&self) -> bool {
        self.has(b'q')
    }

    /// `v`: `mg`/`ma` reply `VA <len>` with the value (or the new number) as a data block,
    /// instead of `HD`. Ignored by `ms`/`md`.
    pub fn value(&self) -> bool {
        self.has(b'v')
    }

    /// `u`: `mg` neither bumps the item in the LRU nor marks it fetched nor updates its last
    /// access time. Ignored by the others.
    pub fn no_bump(&self) -> bool {
        self.has(b'u')
    }

    /// `I`, invalidate. `md`: instead of removing the item, mark it stale, give it a new CAS
    /// (`E` or the next one) and clear its "win token sent" mark (with `T`, also set its TTL);
    /// `mg` then reports it with `X` (and `W` to the first client to ask). `ms` with `C`: a
    /// compare-CAS *lower* than the item's is accepted too, storing the value as stale (keeping
    /// the old TTL and token-sent mark). Ignored by `mg`/`ma`.
    pub fn invalidate(&self) -> bool {
        self.has(b'I')
    }

    /// `x`: `md` replaces the item with an empty one (client flags from `F`, else 0; TTL from
    /// `T`, else 0 = never; CAS from `E`, else the old item's) instead of removing it (`NS` if
    /// that cannot be stored); with `I` this leaves a stale tombstone. Ignored by the others.
    pub fn remove_value(&self) -> bool {
        self.has(b'x')
    }

    /// `O<opaque>`: echoed as ` O<opaque>` in the reply (any status), at its place among the
    /// return flags ([`return_flags`](Self::return_flags)). At most 31 bytes (checked).
    pub fn opaque(&self) -> Option<&'a [u8]> {
        if !self.has(b'O') {
            return None;
        }
        self.return_flags().find_map(|flag| match flag {
            ReturnFlag::Opaque(opaque) => Some(opaque),
            _ => None,
        })
    }

    /// `T<ttl>`. `mg`: on a hit, set the item's TTL (a touch; memcached counts it as a touch,
    /// not a get). `ms`: the new item's TTL (0 = never expires when absent; ignored by
    /// append/prepend, which keep the old TTL). `md`: with `I`, the stale item's new TTL (and
    /// with `x`, the emptied item's). `ma`: on success, set the item's TTL.
    pub fn ttl(&self) -> Option<i64> {
        self.get(b'T', i64::from(self.ttl))
    }

    /// `N<ttl>`, vivify on miss. `mg`: on a miss, create an empty item (client flags 0, CAS
    /// from `E` or the next one) with this TTL and reply as for a hit with a `W` (won) flag;
    /// later `mg`s see `Z`. `ma`: on a miss, create the item with the `J` initial value and
    /// this TTL (the reply shows the initial value, no delta applied). `ms` in append/prepend
    /// mode: on a miss, store the data as a new item with this TTL. Ignored by `md`.
    pub fn vivify(&self) -> Option<i64> {
        self.get(b'N', i64::from(self.vivify))
    }

    /// `R<ttl>`, recache. `mg`: on a hit whose item has a TTL, no win token sent yet, and
    /// remaining TTL below this, reply `W` (the client won the right to recache) and mark the
    /// token sent. Ignored by the others.
    pub fn recache(&self) -> Option<i64> {
        self.get(b'R', i64::from(self.recache))
    }

    /// `F<flags>`: `ms` stores these client flags (0 when absent); so does `md` with `x` for
    /// the emptied item. Ignored by `mg`/`ma`.
    pub fn client_flags(&self) -> Option<u32> {
        self.get(b'F', self.client_flags)
    }

    /// `C<cas>`, compare CAS. `mg`: if it equals the item's CAS, drop `v` (reply `HD`, no
    /// value); other flags act as usual. `ms`: store only if it equals the item's CAS (see
    /// [`SetMode::store_mode`] and [`invalidate`](Self::invalidate)). `md`, `ma`: act only if it
    /// equals the item's CAS, else `EX`.
    pub fn compare_cas(&self) -> Option<u64> {
        self.get(b'C', self.compare_cas)
    }

    /// `E<cas>`: the CAS value to give the item if this request creates or changes it,
    /// instead of the next one from the server's counter (`mg` vivify, `ms`, `md` with `I`
    /// or `x`, `ma`).
    pub fn new_cas(&self) -> Option<u64> {
        self.get(b'E', self.new_cas)
    }

    /// `J<number>`: `ma`'s initial value when `N` creates the item (0 when absent). Ignored by
    /// the others.
    pub fn initial(&self) -> Option<u64> {
        self.get(b'J', self.initial)
    }

    /// `D<number>`: `ma`'s delta (1 when absent). Ignored by the others.
    pub fn delta(&self) -> Option<u64> {
        self.get(b'D', self.delta)
    }

    /// Where `flag` stands among the flag tokens (0 for the first), if it was given.
    /// memcached applies `T` and `N` (`mg`, `ma`) and `R` (`mg`) while it writes the return
    /// flags, in this order: a `t` before `T` shows the TTL from before it, for one.
    pub fn position(&self, flag: u8) -> Option<usize> {
        if !self.has(flag) {
            return None; // most requests: no scan of the tokens
        }
        Tokens::new(self.section).position(|t| t.first() == Some(&flag))
    }

    /// Whether flags `a` and `b` were both given, `a` first.
    pub fn before(&self, a: u8, b: u8) -> bool {
        matches!((self.position(a), self.position(b)), (Some(x), Some(y)) if x < y)
    }

    /// The flags that put something in the reply, in the order given (memcached writes them
    /// in request order). What each command writes, for each status:
    ///
    /// - `mg` hit (`VA`/`HD`): `s`, `t`, `c`, `f`, `l`, `h`, `O`, `k`; then ` Z` if a win token
    ///   was already sent for the item, ` X` if it is stale, ` W` if this request won (`N`
    ///   created it, `R` matched, or the item is stale and no token was sent yet).
    ///   `mg` miss (`EN`): `O`, `k`.
    /// - `ms`, any status: `O`, `k`, `c` (the new CAS; 0 unless stored), `s` (the stored
    ///   size, after append/prepend; the request's data length when not stored).
    /// - `md`, any status: `O`, `k`.
    /// - `ma` success (`HD`/`VA`): `c` (the new CAS), `t`, `O`, `k`; failure (`NF`, `EX`,
    ///   `NS`): `O`, `k`.
    ///
    /// The `k` echo is the item's key as stored (a hit) or the request's decoded key (a miss),
    /// in base64 followed by ` b` when binary (see [`MetaReply::key`]).
    pub fn return_flags(&self) -> ReturnFlags<'a> {
        ReturnFlags {
            tokens: Tokens::new(self.section),
        }
    }
}

/// A flag that writes into the reply, from [`MetaArgs::return_flags`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnFlag<'a> {
    /// `O`: echo ` O<opaque>` ([`MetaReply::opaque`]).
    Opaque(&'a [u8]),
    /// `k`: ` k<key>` ([`MetaReply::key`]).
    Key,
    /// `c`: ` c<cas>`.
    Cas,
    /// `f`: ` f<client flags>`.
    ClientFlags,
    /// `h`: ` h0`/` h1`, whether the item had been fetched before this request.
    Hit,
    /// `l`: ` l<seconds>` since the item was last accessed, before this request.
    LastAccess,
    /// `s`: ` s<size>`, the value's length in bytes.
    Size,
    /// `t`: ` t<seconds>` of TTL remaining, ` t-1` for none.
    Ttl,
}

/// Iterator over [`ReturnFlag`]s in request order.
#[derive(Debug, Clone)]
pub struct ReturnFlags<'a> {
    tokens: Tokens<'a>,
}

impl<'a> Iterator for ReturnFlags<'a> {
    type Item = ReturnFlag<'a>;

    fn next(&mut self) -> Option<ReturnFlag<'a>> {
        for token in self.tokens.by_ref() {
            let flag = match token.split_first() {
                Some((b'O', opaque)) => ReturnFlag::Opaque(opaque),
                Some((b'k', _)) => ReturnFlag::Key,
                Some((b'c', _)) => ReturnFlag::Cas,
                Some((b'f', _)) => ReturnFlag::ClientFlags,
                Some((b'h', _)) => ReturnFlag::Hit,
                Some((b'l', _)) => ReturnFlag::LastAccess,
                Some((b's', _)) => ReturnFlag::Size,
                Some((b't', _)) => ReturnFlag::Ttl,
                _ => continue,
            };
            return Some(flag);
        }
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing.

/// Parse a meta command line (`line` ends in `\n` and starts `m` + one of `gsdnae` + a space or
/// the terminator); `buf` is the whole buffer, from the start of `line`, for `ms`'s data.
pub(crate) fn parse<'a>(buf: &'a [u8], line: &'a [u8], limits: &Limits) -> Parse<'a> {
    let len = line.len();
    let meta = |request| Parse::Request(request, len);
    let command = line.get(1).copied().unwrap_or_default();
    if command == b'n' {
        return meta(MetaRequest::Noop);
    }
    let toks = Toks::new(line);
    let first_flag = if command == b's' { 3 } else { 2 };
    let bad_start = (first_flag..toks.count).any(|i| {
        toks.get(line, i)
            .and_then(|t| t.first())
            .is_none_or(|&b| !(b.is_ascii_digit() || (b'A'..=b'z').contains(&b)))
    });
    if bad_start || toks.count < first_flag {
        return fail(BAD_FORMAT, false, len, 0);
    }
    match command {
        b'g' => match parse_args(line, &toks, 2) {
            Ok((args, _)) => checked(args, || meta(MetaRequest::Get(args)), len, 0),
            Err(reply) => fail(reply, false, len, 0),
        },
        b'd' => match parse_args(line, &toks, 2) {
            Ok((args, _)) => checked(args, || meta(MetaRequest::Delete(args)), len, 0),
            Err(reply) => fail(reply, false, len, 0),
        },
        b'a' => {
            let (args, mode) = match parse_args(line, &toks, 2) {
                Ok(parsed) => parsed,
                Err(_) => return fail(INVALID_OR_DUPLICATE_FLAG, false, len, 0),
            };
            match mode.map_or(Some(ArithMode::Incr), ArithMode::from_byte) {
                Some(mode) => checked(args, || meta(MetaRequest::Arith { args, mode }), len, 0),
                None => fail(INVALID_ARITH_MODE, false, len, 0),
            }
        }
        b's' => parse_set(buf, line, &toks, limits),
        _ => parse_debug(line, &toks),
    }
}

/// `build()` unless the opaque is too long (memcached's last check, made while replying).
fn checked<'a>(
    args: MetaArgs<'a>,
    build: impl FnOnce() -> Parse<'a>,
    consumed: usize,
    swallow: usize,
) -> Parse<'a> {
    if args
        .opaque()
        .is_some_and(|o| o.len() + 1 > MAX_OPAQUE_TOKEN_LEN)
    {
        return fail(OPAQUE_TOO_LONG, false, consumed, swallow);
    }
    build()
}

/// `ms <key> <datalen> <flag>*\r\n<data>\r\n`.
fn parse_set<'a>(buf: &'a [u8], line: &'a [u8], toks: &Toks, limits: &Limits) -> Parse<'a> {
    let line_len = line.len();
    let vlen = match toks.get(line, 2).and_then(tok_i32) {
        Some(v) if (0..=i32::MAX - 2).contains(&v) => v as usize,
        _ => return fail(BAD_FORMAT, false, line_len, 0),
    };
    let swallow = vlen + 2;
    let (args, mode) = match parse_args(line, toks, 3) {
        Ok(parsed) => parsed,
        Err(reply) => return fail(reply, false, line_len, swallow),
    };
    let Some(mode) = mode.map_or(Some(SetMode::Set), SetMode::from_byte) else {
        return fail(INVALID_SET_MODE, false, line_len, swallow);
    };
    if vlen > limits.max_value {
        if args.has(b'b') {
            return fail(TOO_LARGE, false, line_len, swallow);
        }
        return Parse::TooLarge {
            mode: StoreMode::Set,
            key: args.key,
            noreply: false,
            consumed: line_len,
            swallow,
        };
    }
    let Some(total) = line_len.checked_add(swallow) else {
        return Parse::Close;
    };
    checked(
        args,
        || {
            let Some(block) = buf.get(line_len..total) else {
                return Parse::Incomplete;
            };
            let (data, terminator) = block.split_at(vlen);
            if terminator != b"\r\n" {
                return fail(BAD_DATA_CHUNK, false, total, 0);
            }
            Parse::Request(MetaRequest::Set { args, mode, data }, total)
        },
        line_len,
        swallow,
    )
}

/// `me <key> [b <anything>]`.
fn parse_debug<'a>(line: &'a [u8], toks: &Toks) -> Parse<'a> {
    let len = line.len();
    let Some(raw) = toks.get(line, 1).filter(|k| k.len() <= MAX_KEY_LEN) else {
        return fail(BAD_FORMAT, false, len, 0);
    };
    let key = if toks.count >= 4 && toks.get(line, 2) == Some(b"b".as_slice()) {
        match MetaKey::base64(raw) {
            Some(key) => key,
            None => return fail(BAD_FORMAT, false, len, 0),
        }
    } else {
        MetaKey::plain(raw)
    };
    Parse::Request(MetaRequest::Debug { key }, len)
}

/// The key and flags from token `first` on, as memcached's `_meta_flag_preparse` reads them,
/// with the byte after `M` (the mode), if any.
fn parse_args<'a>(
    line: &'a [u8],
    toks: &Toks,
    first: usize,
) -> Result<(MetaArgs<'a>, Option<u8>), ErrorReply> {
    let raw = toks.get(line, 1).unwrap_or_default();
    if raw.len() > MAX_KEY_LEN {
        return Err(BAD_FORMAT);
    }
    if toks.count > MAX_META_TOKENS {
        return Err(TOO_MANY_TOKENS);
    }
    let section = match (toks.start(first), toks.end(toks.count.wrapping_sub(1))) {
        (Some(s), Some(e)) if first < toks.count => line.get(s..e).unwrap_or_default(),
        _ => &[],
    };
    let mut args = MetaArgs {
        key: raw,
        flags: FlagSet::default(),
        section,
        ttl: 0,
        vivify: 0,
        recache: 0,
        client_flags: 0,
        compare_cas: 0,
        new_cas: 0,
        initial: 0,
        delta: 0,
    };
    let mut mode = None;
    // memcached keeps scanning after a bad argument and reports the last message set.
    let mut error: Option<ErrorReply> = None;
    let mut message = BAD_FORMAT;
    let mut bad = |m: Option<ErrorReply>| {
        if let Some(m) = m {
            message = m;
        }
        error = Some(message);
    };
    for i in first..toks.count {
        let (Some(token), Some(start)) = (toks.get(line, i), toks.start(i)) else {
            continue;
        };
        let Some((&flag, arg)) = token.split_first() else {
            continue;
        };
        if args.flags.contains(flag) {
            return Err(DUPLICATE_FLAG);
        }
        match flag {
            b'b' => {
                if MetaKey::base64(raw).is_none() {
                    bad(Some(KEY_NOT_BASE64));
                }
            }
            b'N' | b'T' | b'R' => match flag_arg(arg, tok_i32) {
                Some(v) if flag == b'N' => args.vivify = v,
                Some(v) if flag == b'T' => args.ttl = v,
                Some(v) => args.recache = v,
                None => bad(Some(BAD_TOKEN)),
            },
            b'F' => match flag_arg(arg, tok_u32) {
                Some(v) => args.client_flags = v,
                None => bad(None),
            },
            b'C' | b'E' | b'J' | b'D' => match flag_arg(arg, tok_u64) {
                Some(v) => match flag {
                    b'C' => args.compare_cas = v,
                    b'E' => args.new_cas = v,
                    b'J' => args.initial = v,
                    _ => args.delta = v,
                },
                None => bad(Some(match flag {
                    b'J' => INVALID_INITIAL,
                    b'D' => INVALID_DELTA,
                    _ => BAD_TOKEN,
                })),
            },
            b'M' => mode = line.get(start + 1).copied(),
            b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'v' | b'h' | b'l' | b'u'
            | b'q' | b'x' | b'I' => {}
            // Digits pass the tokenizer's check but name no flag.
            _ => return Err(INVALID_FLAG),
        }
        args.flags.insert(flag);
    }
    match error {
        Some(reply) => Err(reply),
        None => Ok((args, mode)),
    }
}

/// A flag's numeric argument: the rest of its token, which must not be empty.
fn flag_arg<T>(arg: &[u8], parse: fn(&[u8]) -> Option<T>) -> Option<T> {
    if arg.is_empty() {
        return None;
    }
    parse(arg)
}

// ---------------------------------------------------------------------------------------------
// Base64, as memcached's `base64.c` reads and writes it. Writing is standard base64 with
// padding (the `base64` crate); reading is memcached's own lenient decoder, below.

/// The 6-bit value of a base64 byte (`=` is 0), or `None` for a byte the decoder skips.
fn base64_value(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        b'=' => Some(0),
        _ => None,
    }
}

/// Decodes base64 the way memcached does, into `out`; returns the decoded length, `None` where
/// memcached fails (it then replies with an error). Its rules: bytes outside the alphabet and
/// `=` are skipped; the remaining count must be a non-zero multiple of 4 (and fit in `out`);
/// `=` counts as a zero digit, and the first group of four containing any `=` ends the input
/// (one `=` drops one byte of that group, two drop two, more is an error).
pub fn decode_base64(src: &[u8], out: &mut [u8]) -> Option<usize> {
    let count = src.iter().filter(|&&b| base64_value(b).is_some()).count();
    if count == 0 || count % 4 != 0 || count / 4 * 3 > out.len() {
        return None;
    }
    let mut group = [0u8; 4];
    let mut filled = 0;
    let mut pad = 0;
    let mut n = 0;
    for &b in src {
        let Some(v) = base64_value(b) else {
            continue;
        };
        if b == b'=' {
            pad += 1;
        }
        if let Some(slot) = group.get_mut(filled) {
            *slot = v;
        }
        filled += 1;
        if filled < 4 {
            continue;
        }
        filled = 0;
        let [a, b, c, d] = group;
        for byte in [a << 2 | b >> 4, b << 4 | c >> 2, c << 6 | d] {
            if let Some(slot) = out.get_mut(n) {
                *slot = byte;
            }
            n += 1;
        }
        if pad > 0 {
            if pad > 2 {
                return None;
            }
            n -= pad;
            break;
        }
    }
    Some(n)
}

/// Appends the padded base64 encoding of `src`.
pub fn encode_base64(out: &mut Vec<u8>, src: &[u8]) {
    use base64::Engine as _;
    let at = out.len();
    let len = src.len().div_ceil(3) * 4;
    out.resize(at + len, 0);
    let written = out
        .get_mut(at..)
        .and_then(|tail| {
            base64::engine::general_purpose::STANDARD
                .encode_slice(src, tail)
                .ok()
        })
        .unwrap_or(0);
    out.truncate(at + written);
}

// ---------------------------------------------------------------------------------------------
// Replies.

/// `MN\r\n`: the reply to `mn`.
pub const MN: &[u8] = b"MN\r\n";
/// `EN\r\n`: a miss (`mg`, `me`) with no flags to echo.
pub const EN: &[u8] = b"EN\r\n";
/// `HD\r\n`: success with no flags to echo.
pub const HD: &[u8] = b"HD\r\n";
/// `NF\r\n`: not found.
pub const NF: &[u8] = b"NF\r\n";
/// `NS\r\n`: not stored.
pub const NS: &[u8] = b"NS\r\n";
/// `EX\r\n`: CAS mismatch.
pub const EX: &[u8] = b"EX\r\n";

/// Builds one meta reply line in place: a status code, then flags, then `\r\n`.
///
/// ```
/// use kvproto::meta::MetaReply;
/// let mut out = Vec::new();
/// MetaReply::va(&mut out, 5)
///     .num(b'c', 123)
///     .num(b'f', 0)
///     .int(b't', -1)
///     .opaque(b"abc")
///     .key(b"foo", false)
///     .finish_value(b"hello");
/// assert_eq!(out, b"VA 5 c123 f0 t-1 Oabc kfoo\r\nhello\r\n");
/// ```
#[must_use = "a reply line needs finish()"]
pub struct MetaReply<'o> {
    out: &'o mut Vec<u8>,
}

impl<'o> MetaReply<'o> {
    fn code(out: &'o mut Vec<u8>, code: &[u8]) -> Self {
        out.extend_from_slice(code);
        MetaReply { out }
    }

    /// `VA <len>`: a value follows ([`finish_value`](Self::finish_value)).
    pub fn va(out: &'o mut Vec<u8>, len: usize) -> Self {
        out.extend_from_slice(b"VA ");
        put_u64(out, len as u64);
        MetaReply { out }
    }

    /// `HD`: success.
    pub fn hd(out: &'o mut Vec<u8>) -> Self {
        Self::code(out, b"HD")
    }

    /// `EN`: `mg` miss.
    pub fn en(out: &'o mut Vec<u8>) -> Self {
        Self::code(out, b"EN")
    }

    /// `NF`: not found.
    pub fn nf(out: &'o mut Vec<u8>) -> Self {
        Self::code(out, b"NF")
    }

    /// `NS`: not stored.
    pub fn ns(out: &'o mut Vec<u8>) -> Self {
        Self::code(out, b"NS")
    }

    /// `EX`: CAS mismatch.
    pub fn ex(out: &'o mut Vec<u8>) -> Self {
        Self::code(out, b"EX")
    }

    /// ` <flag><n>`, e.g. ` c123`, ` s5`, ` f0`, ` h1`, ` l30`.
    pub fn num(self, flag: u8, n: u64) -> Self {
        self.out.push(b' ');
        self.out.push(flag);
        put_u64(self.out, n);
        self
    }

    /// ` <flag><n>` for a signed number, e.g. ` t-1` (no TTL).
    pub fn int(self, flag: u8, n: i64) -> Self {
        self.out.push(b' ');
        self.out.push(flag);
        put_i64(self.out, n);
        self
    }

    /// ` <flag>` alone, e.g. ` W` (won), ` X` (stale), ` Z` (win token already sent).
    pub fn flag(self, flag: u8) -> Self {
        self.out.push(b' ');
        self.out.push(flag);
        self
    }

    /// ` O<opaque>`.
    pub fn opaque(self, opaque: &[u8]) -> Self {
        self.out.extend_from_slice(b" O");
        self.out.extend_from_slice(opaque);
        self
    }

    /// ` k<key>`, or for a binary key (`b`) ` k<base64 of key> b`. `key` is the decoded key.
    pub fn key(self, key: &[u8], binary: bool) -> Self {
        self.out.extend_from_slice(b" k");
        if binary {
            encode_base64(self.out, key);
            self.out.extend_from_slice(b" b");
        } else {
            self.out.extend_from_slice(key);
        }
        self
    }

    /// Ends the line.
    pub fn finish(self) {
        self.out.extend_from_slice(b"\r\n");
    }

    /// Ends the line before a data block that the caller writes itself, followed by
    /// `\r\n` (after [`va`](Self::va)): the output to write it to.
    pub fn finish_before_value(self) -> &'o mut Vec<u8> {
        self.out.extend_from_slice(b"\r\n");
        self.out
    }

    /// Ends the line and appends the data block and its `\r\n` (after [`va`](Self::va)).
    pub fn finish_value(self, data: &[u8]) {
        self.out.reserve(data.len() + 4);
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(data);
        self.out.extend_from_slice(b"\r\n");
    }
}

/// What `me` shows about an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugInfo {
    /// Seconds until it expires, -1 for never.
    pub exp: i64,
    /// Seconds since it was last accessed.
    pub la: u64,
    /// Its CAS unique.
    pub cas: u64,
    /// Whether it has been fetched.
    pub fetched: bool,
    /// Its slab class id.
    pub cls: u32,
    /// Its total size in memory, header included.
    pub size: u64,
}

/// `ME <key> exp=<exp> la=<la> cas=<cas> fetch=<yes|no> cls=<cls> size=<size>\r\n`: the reply to
/// `me` on a hit. A binary key (an item stored with `b`) is written in base64, with no ` b`.
pub fn write_debug(out: &mut Vec<u8>, key: &[u8], binary: bool, info: &DebugInfo) {
    out.extend_from_slice(b"ME ");
    if binary {
        encode_base64(out, key);
    } else {
        out.extend_from_slice(key);
    }
    out.extend_from_slice(b" exp=");
    put_i64(out, info.exp);
    out.extend_from_slice(b" la=");
    put_u64(out, info.la);
    out.extend_from_slice(b" cas=");
    put_u64(out, info.cas);
    out.extend_from_slice(if info.fetched {
        b" fetch=yes cls="
    } else {
        b" fetch=no cls="
    });
    put_u64(out, u64::from(info.cls));
    out.extend_from_slice(b" size=");
    put_u64(out, info.size);
    out.extend_from_slice(b"\r\n");
}

/// Appends the decimal digits of `n`, with a `-` when negative.
fn put_i64(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    put_u64(out, n.unsigned_abs());
}

#[cfg(test)]
mod tests;
