//! memcached's authentication wire formats: the ASCII authentication handshake of `-Y` and the
//! binary protocol's SASL requests under `-S` (the header checks made before authentication,
//! and the SASL PLAIN message).
//!
//! # ASCII authentication (`-Y`)
//!
//! Until a connection has authenticated, memcached (1.6.4x, `proto_text.c`
//! `try_read_command_asciiauth`) reads each request as a possible
//! `set <key> <flags> <exptime> <bytes>\r\n<user> <password>\r\n`:
//!
//! - Fewer than 3 bytes buffered: wait. No `\n` in the buffer: wait, or close the connection
//!   once more than 2048 bytes are buffered.
//! - A line (up to its `\n`, without it) shorter than 6 bytes closes the connection.
//! - The line is tokenized on spaces the way memcached's `mcmc` tokenizer is called there: it is
//!   given the line without its `\n`, drops one more byte at the end (the `\r`, or the last
//!   character of a line ended by a bare `\n`), or two when the one before the end is a `\r`.
//! - A line that does not start with the three bytes `set`, has fewer than 5 tokens, or whose
//!   fifth token is not a decimal `u32` (digits only, at most 11 of them) is answered
//!   `CLIENT_ERROR unauthenticated` ([`AuthLine::Unauthenticated`]). This is the reply to every
//!   other command, meta commands included.
//! - A length over 16384 is answered `CLIENT_ERROR auth token too long`; the data block is not
//!   skipped (it is read as the next command line).
//! - Otherwise the data block of `bytes + 2` bytes is read ([`parse_auth_data`]): it must end in
//!   `\r\n` (else `CLIENT_ERROR bad command line termination`), and hold a space (else
//!   `CLIENT_ERROR bad authentication token format`). The user is what precedes the first space,
//!   the password everything after it (spaces included) up to the `\r\n`.
//!
//! # SASL PLAIN
//!
//! The client's message is `authzid NUL authcid NUL password` (RFC 4616), parsed as Cyrus SASL's
//! PLAIN plugin does ([`parse_sasl_plain`]).

use crate::binary::{HEADER_LEN, MAX_BODY_LEN, MAX_HEAD_LEN, REQUEST_MAGIC};

/// Longest data block of an ASCII authentication request (memcached's `MAX_AUTH_REQ_LEN`).
pub const MAX_AUTH_DATA_LEN: u32 = 16384;

/// A command line shorter than this (without its `\n`) closes an unauthenticated connection
/// (memcached's `MIN_AUTH_REQ_LEN`).
pub const MIN_AUTH_LINE_LEN: usize = 6;

/// Without a `\n` in this many bytes, an unauthenticated connection is closed.
pub const MAX_AUTH_LINE_WAIT: usize = 2048;

/// Longest SASL mechanism name memcached accepts (`MAX_SASL_MECH_LEN`).
pub const MAX_SASL_MECH_LEN: usize = 32;

/// Replies of the ASCII authentication handshake.
pub const REPLY_UNAUTHENTICATED: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";
pub const REPLY_TOKEN_TOO_LONG: &[u8] = b"CLIENT_ERROR auth token too long\r\n";
pub const REPLY_BAD_TERMINATION: &[u8] = b"CLIENT_ERROR bad command line termination\r\n";
pub const REPLY_BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad authentication token format\r\n";
pub const REPLY_FAILURE: &[u8] = b"CLIENT_ERROR authentication failure\r\n";
pub const REPLY_STORED: &[u8] = b"STORED\r\n";

/// The most tokens memcached's tokenizer records for the handshake line.
const MAX_TOKENS: usize = 23;

/// memcached's tokenizer clamps the line length to this (its token offsets are 16-bit).
const TOKENIZER_MAXLEN: usize = u16::MAX as usize - 1;

/// What the command line at the front of an unauthenticated connection's input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthLine {
    /// More bytes are needed; nothing was consumed.
    Incomplete,
    /// Close the connection without a reply.
    Close,
    /// Not an authentication request: consume `consumed` bytes (the line) and answer
    /// [`REPLY_UNAUTHENTICATED`].
    Unauthenticated { consumed: usize },
    /// The declared length is over [`MAX_AUTH_DATA_LEN`]: consume the line and answer
    /// [`REPLY_TOKEN_TOO_LONG`].
    TooLong { consumed: usize },
    /// An authentication request: consume the line, then read a data block of `len + 2` bytes
    /// and give it to [`parse_auth_data`].
    Data { consumed: usize, len: u32 },
}

/// Look at the command line at the front of `buf` (see the module documentation).
pub fn parse_auth_line(buf: &[u8]) -> AuthLine {
    if buf.len() < 3 {
        return AuthLine::Incomplete;
    }
    let Some(el) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() > MAX_AUTH_LINE_WAIT {
            AuthLine::Close
        } else {
            AuthLine::Incomplete
        };
    };
    if el < MIN_AUTH_LINE_LEN {
        return AuthLine::Close;
    }
    let consumed = el + 1;
    // The tokenizer is handed the line without its '\n' but expects one: it drops the last
    // byte, or the last two when the one before the last is a '\r'.
    let len = el.min(TOKENIZER_MAXLEN);
    let end = if buf.get(len.wrapping_sub(2)) == Some(&b'\r') {
        len - 2
    } else {
        len - 1
    };
    let line = buf.get(..end).unwrap_or(&[]);
    let mut tokens = line
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .take(MAX_TOKENS);
    let size = tokens.nth(4).and_then(parse_u32);
    match size {
        Some(size) if buf.starts_with(b"set") => {
            if size > MAX_AUTH_DATA_LEN {
                AuthLine::TooLong { consumed }
            } else {
                AuthLine::Data {
                    consumed,
                    len: size,
                }
            }
        }
        _ => AuthLine::Unauthenticated { consumed },
    }
}

/// memcached's `mcmc_toktou32`: decimal digits only, at most 11 of them, no overflow.
fn parse_u32(t: &[u8]) -> Option<u32> {
    if t.is_empty() || t.len() > 11 {
        return None;
    }
    let mut sum: u32 = 0;
    for &b in t {
        if !b.is_ascii_digit() {
            return None;
        }
        sum = sum.checked_mul(10)?.checked_add(u32::from(b - b'0'))?;
    }
    Some(sum)
}

/// The data block of an ASCII authentication request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthData<'a> {
    /// It does not end in `\r\n`: [`REPLY_BAD_TERMINATION`].
    BadTermination,
    /// It holds no space: [`REPLY_BAD_FORMAT`].
    BadFormat,
    /// The credentials to check.
    Credentials { user: &'a [u8], password: &'a [u8] },
}

/// Split the data block (`len + 2` bytes, as announced by [`AuthLine::Data`]) into the user and
/// the password.
pub fn parse_auth_data(block: &[u8]) -> AuthData<'_> {
    let Some(body) = block.strip_suffix(b"\r\n") else {
        return AuthData::BadTermination;
    };
    match body.iter().position(|&b| b == b' ') {
        Some(mid) => AuthData::Credentials {
            user: body.get(..mid).unwrap_or_default(),
            password: body.get(mid + 1..).unwrap_or_default(),
        },
        None => AuthData::BadFormat,
    }
}

/// The three fields of a SASL PLAIN message. The password is secret: never log it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Plain<'a> {
    /// The identity to act as (often empty: the same as `authcid`).
    pub authzid: &'a [u8],
    /// The user name.
    pub authcid: &'a [u8],
    pub password: &'a [u8],
}

impl std::fmt::Debug for Plain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plain")
            .field("authzid", &self.authzid.escape_ascii().to_string())
            .field("authcid", &self.authcid.escape_ascii().to_string())
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Parse a SASL PLAIN message, `authzid NUL authcid NUL password`. Like Cyrus SASL's PLAIN
/// plugin: both NULs must be present and the password must not contain another one. `None`
/// for a malformed message.
pub fn parse_sasl_plain(msg: &[u8]) -> Option<Plain<'_>> {
    let mut parts = msg.splitn(3, |&b| b == 0);
    let authzid = parts.next()?;
    let authcid = parts.next()?;
    let password = parts.next()?;
    if password.contains(&0) {
        return None;
    }
    Some(Plain {
        authzid,
        authcid,
        password,
    })
}

/// The fields of a binary request header that the authentication check needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinaryHead {
    pub opcode: u8,
    pub opaque: u32,
    pub extlen: usize,
    pub keylen: usize,
    /// Extras + key + value.
    pub bodylen: usize,
}

impl BinaryHead {
    /// The header, extras and key.
    pub fn head_len(&self) -> usize {
        HEADER_LEN + self.extlen + self.keylen
    }

    /// The value's length.
    pub fn value_len(&self) -> usize {
        self.bodylen.saturating_sub(self.extlen + self.keylen)
    }
}

/// The header of the binary request at the front of `buf`, once memcached would check its
/// authentication: the header, extras and key are buffered, and the request passed the checks
/// memcached makes first (magic byte, extras and key within the body length, a body of at most
/// 1 GiB). `None` otherwise: [`crate::binary::parse`] then gives memcached's answer (wait,
/// close, or an error and close) whatever the authentication.
pub fn binary_head(buf: &[u8]) -> Option<BinaryHead> {
    let h: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
    if h[0] != REQUEST_MAGIC {
        return None;
    }
    let keylen = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let extlen = usize::from(h[4]);
    let bodylen = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
    let opaque = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
    let head = BinaryHead {
        opcode: h[1],
        opaque,
        extlen,
        keylen,
        bodylen: bodylen as usize,
    };
    if head.head_len() > MAX_HEAD_LEN || buf.len() < head.head_len() {
        return None;
    }
    if keylen + extlen > head.bodylen || bodylen > MAX_BODY_LEN {
        return None;
    }
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_lines() {
        use AuthLine::*;
        let cases: &[(&[u8], AuthLine)] = &[
            (b"se", Incomplete),
            (b"set a 0 0 5", Incomplete),
            (
                b"set a 0 0 5\r\n",
                Data {
                    consumed: 13,
                    len: 5,
                },
            ),
            (
                b"set a 0 0 5\r\nuser pass\r\n",
                Data {
                    consumed: 13,
                    len: 5,
                },
            ),
            (
                b"setx a 0 0 5\r\n",
                Data {
                    consumed: 14,
                    len: 5,
                },
            ),
            (
                b"set a b c 10 extra\r\n",
                Data {
                    consumed: 20,
                    len: 10,
                },
            ),
            (
                b"set  a  0  0  7 \r\n",
                Data {
                    consumed: 18,
                    len: 7,
                },
            ),
            // A bare '\n' makes the tokenizer drop the length's last digit.
            (b"set a 0 0 5\n", Unauthenticated { consumed: 12 }),
            (
                b"set a 0 0 15\n",
                Data {
                    consumed: 13,
                    len: 1,
                },
            ),
            (
                b"set a 0 0 5\r\r\n",
                Data {
                    consumed: 14,
                    len: 5,
                },
            ),
            (b"get foo\r\n", Unauthenticated { consumed: 9 }),
            (b"mg foo v\r\n", Unauthenticated { consumed: 10 }),
            (b" set a 0 0 5\r\n", Unauthenticated { consumed: 14 }),
            (b"set a 0 0\r\n", Unauthenticated { consumed: 11 }),
            (b"set a 0 0 -5\r\n", Unauthenticated { consumed: 14 }),
            (b"set a 0 0 +5\r\n", Unauthenticated { consumed: 14 }),
            (
                b"set a 0 0 4294967296\r\n",
                Unauthenticated { consumed: 22 },
            ),
            (
                b"set a 0 0 000000000005\r\n",
                Unauthenticated { consumed: 24 },
            ),
            (
                b"set a 0 0 16384\r\n",
                Data {
                    consumed: 17,
                    len: 16384,
                },
            ),
            (b"set a 0 0 16385\r\n", TooLong { consumed: 17 }),
            (b"set a 0 0 4294967295\r\n", TooLong { consumed: 22 }),
            (b"get\r\n", Close),
            (b"quit\r\n", Close),
            (b"\r\n", Incomplete),
            (b"abc\n", Close),
            (b"quit \r\n", Unauthenticated { consumed: 7 }),
        ];
        for (input, want) in cases {
            assert_eq!(parse_auth_line(input), *want, "{}", input.escape_ascii());
        }
        assert_eq!(parse_auth_line(&[b'x'; 2048]), Incomplete);
        assert_eq!(parse_auth_line(&[b'x'; 2049]), Close);
        let mut long = vec![b'x'; 5000];
        long.extend_from_slice(b"\r\n");
        assert_eq!(parse_auth_line(&long), Unauthenticated { consumed: 5002 });
    }

    #[test]
    fn auth_data() {
        assert_eq!(
            parse_auth_data(b"user pass\r\n"),
            AuthData::Credentials {
                user: b"user",
                password: b"pass"
            }
        );
        assert_eq!(
            parse_auth_data(b"user pa ss \r\n"),
            AuthData::Credentials {
                user: b"user",
                password: b"pa ss "
            }
        );
        assert_eq!(
            parse_auth_data(b" \r\n"),
            AuthData::Credentials {
                user: b"",
                password: b""
            }
        );
        assert_eq!(parse_auth_data(b"userpass\r\n"), AuthData::BadFormat);
        assert_eq!(parse_auth_data(b"\r\n"), AuthData::BadFormat);
        assert_eq!(parse_auth_data(b"user pass\n\n"), AuthData::BadTermination);
        assert_eq!(parse_auth_data(b""), AuthData::BadTermination);
    }

    #[test]
    fn plain() {
        let p = parse_sasl_plain(b"\0user\0pass").unwrap();
        assert_eq!(
            (p.authzid, p.authcid, p.password),
            (&b""[..], &b"user"[..], &b"pass"[..])
        );
        let p = parse_sasl_plain(b"z\0user\0").unwrap();
        assert_eq!(
            (p.authzid, p.authcid, p.password),
            (&b"z"[..], &b"user"[..], &b""[..])
        );
        assert!(parse_sasl_plain(b"").is_none());
        assert!(parse_sasl_plain(b"user").is_none());
        assert!(parse_sasl_plain(b"\0user").is_none());
        assert!(parse_sasl_plain(b"\0user\0pa\0ss").is_none());
        let p = parse_sasl_plain(b"\0user\0hunter2").unwrap();
        assert!(!format!("{p:?}").contains("hunter2"));
    }

    #[test]
    fn binary_heads() {
        let mut h = [0u8; 24];
        h[0] = 0x80;
        h[1] = 0x21;
        h[3] = 5; // key length
        h[11] = 9; // body length
        h[12..16].copy_from_slice(&7u32.to_be_bytes());
        assert_eq!(binary_head(&h), None, "key not buffered yet");
        let mut buf = h.to_vec();
        buf.extend_from_slice(b"PLAIN");
        let head = binary_head(&buf).unwrap();
        assert_eq!(head.opcode, 0x21);
        assert_eq!(head.opaque, 7);
        assert_eq!((head.head_len(), head.value_len()), (29, 4));
        buf[11] = 4; // key longer than the body
        assert_eq!(binary_head(&buf), None);
        buf[0] = 0x81;
        assert_eq!(binary_head(&buf), None);
        assert_eq!(binary_head(&buf[..10]), None);
    }
}
