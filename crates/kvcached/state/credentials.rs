//! Authentication, as memcached 1.6 does it: ASCII authentication with `-Y FILE` and SASL PLAIN
//! over the binary protocol with `-S`. Wire formats are `kvproto::auth`'s; this module holds the
//! credentials and each connection's authentication state; the gates that run before a request
//! on a connection that has not authenticated are `exec::auth`.
//!
//! # `-Y`: the auth file (memcached's `authfile.c`)
//!
//! Loaded at startup (a failure stops the server) and again on SIGHUP (a failure keeps the old
//! entries). The file is read the way memcached reads it with `fgets` into 256-byte buffers:
//!
//! - Each line is `user:password`; the user ends at the first `:`, the password at the first
//!   `\r`, `\n` or NUL after it (so it may contain `:`). A line without `:` (an empty line
//!   included) is malformed and the whole file is refused.
//! - A line is read in pieces of at most 255 bytes: a longer line's first 255 bytes are the
//!   entry, and reading stops there. Reading also stops at a NUL byte, at the end of a last line
//!   without a newline, and after 8 entries (the rest are ignored).
//!
//! # `-S`: SASL PLAIN (memcached's `proto_bin.c` with Cyrus SASL and `sasl_defs.c`)
//!
//! The only mechanism is `PLAIN`. Credentials come from the file named by the environment
//! variable `MEMCACHED_SASL_PWDB`, as in memcached built with `--enable-sasl-pwdb`; it is read
//! on every attempt (edits take effect at once). Each line (read in 255-byte pieces like the
//! auth file) is `user:password`, optionally followed by `:` and anything. Cyrus SASL gives
//! memcached's password check the user name with surrounding white space removed and, when it
//! has no `@`, `@` and the host name appended: a line for `user@HOSTNAME` matches a client that
//! sent `user`, as with memcached. kvcached also accepts a line for the name exactly as sent.
//! A user name and password longer than 252 bytes together never match.
//!
//! Secrets are never logged, never kept beyond the check (the loaded auth file excepted, whose
//! copies are zeroed when dropped), and compared in constant time.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use kvproto::auth as proto;

use crate::setup::config::Config;

/// The environment variable naming the SASL password file.
pub const PWDB_ENV: &str = "MEMCACHED_SASL_PWDB";

/// Most entries read from a `-Y` file (memcached's `MAX_ENTRIES`).
const MAX_ENTRIES: usize = 8;

/// memcached reads both files with `fgets` into buffers of this size.
const MAX_ENTRY_LEN: usize = 256;

/// Compare two byte strings in time that depends only on their lengths (`subtle`).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// A user name and password from the `-Y` file. Its Debug output hides the password, and its
/// bytes are zeroed when dropped.
struct Credential {
    user: Box<[u8]>,
    password: Box<[u8]>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("user", &self.user.escape_ascii().to_string())
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Drop for Credential {
    fn drop(&mut self) {
        zero(&mut self.user);
        zero(&mut self.password);
    }
}

fn zero(b: &mut [u8]) {
    for x in b.iter_mut() {
        // SAFETY: a valid, aligned, exclusive reference; volatile so the write is not elided.
        unsafe { std::ptr::write_volatile(x, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Why a `-Y` file could not be loaded.
#[derive(Debug)]
pub enum LoadError {
    Open(io::Error),
    Malformed,
}

/// Read a file the way C's `fgets(buf, 256, f)` does: pieces of at most 255 bytes, each ending
/// after a `\n` or where the limit or the end of the file falls. Bounded memory whatever the
/// file holds.
struct Pieces<R> {
    reader: R,
}

impl<R: BufRead> Pieces<R> {
    /// The next piece into `buf` (cleared first); false at the end of the file.
    fn next_into(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        buf.clear();
        while buf.len() < MAX_ENTRY_LEN - 1 {
            let avail = self.reader.fill_buf()?;
            if avail.is_empty() {
                break;
            }
            let room = MAX_ENTRY_LEN - 1 - buf.len();
            let take = avail.len().min(room);
            let (n, newline) = match avail[..take].iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (take, false),
            };
            buf.extend_from_slice(&avail[..n]);
            self.reader.consume(n);
            if newline {
                break;
            }
        }
        Ok(!buf.is_empty())
    }
}

/// Parse a `-Y` file's contents (see the module documentation).
fn parse_auth_file<R: BufRead>(reader: R) -> Result<Vec<Credential>, LoadError> {
    let mut pieces = Pieces { reader };
    let mut buf = Vec::with_capacity(MAX_ENTRY_LEN);
    let mut entries = Vec::new();
    while pieces.next_into(&mut buf).map_err(LoadError::Open)? {
        // The piece is NUL-terminated in memcached's buffer.
        let at = |i: usize| buf.get(i).copied().unwrap_or(0);
        let Some(colon) = (0..=buf.len()).find(|&i| at(i) == b':' || at(i) == 0) else {
            return Err(LoadError::Malformed);
        };
        if at(colon) != b':' {
            return Err(LoadError::Malformed);
        }
        let end = (colon + 1..=buf.len())
            .find(|&i| matches!(at(i), b'\n' | b'\r' | 0))
            .unwrap_or(buf.len());
        entries.push(Credential {
            user: buf[..colon].into(),
            password: buf[colon + 1..end].into(),
        });
        let eof = at(end) == 0;
        zero(&mut buf);
        if entries.len() == MAX_ENTRIES || eof {
            break;
        }
    }
    zero(&mut buf);
    Ok(entries)
}

fn load_auth_file(path: &Path) -> Result<Vec<Credential>, LoadError> {
    let file = File::open(path).map_err(LoadError::Open)?;
    parse_auth_file(BufReader::new(file))
}

/// Credentials and settings shared by all workers.
#[derive(Debug, Default)]
pub struct Auth {
    /// `-Y`: the file and its entries.
    ascii: Option<(PathBuf, RwLock<Arc<Vec<Credential>>>)>,
    /// `-S`: the password file, if `MEMCACHED_SASL_PWDB` names one.
    sasl_pwdb: Option<PathBuf>,
    /// Appended to user names without `@` (Cyrus SASL's user realm: the host name).
    realm: Vec<u8>,
}

impl Auth {
    /// Load what the configuration asks for. The error is the message to exit with.
    pub fn new(config: &Config) -> Result<Auth, String> {
        let mut auth = Auth::default();
        if let Some(path) = &config.auth_file {
            let entries = load_auth_file(path).map_err(|e| describe(path, e))?;
            auth.ascii = Some((path.clone(), RwLock::new(Arc::new(entries))));
        }
        if config.sasl {
            auth.sasl_pwdb = std::env::var_os(PWDB_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from);
            // (With -Y, no listener speaks the binary protocol: SASL is never used.)
            if auth.sasl_pwdb.is_none() && config.auth_file.is_none() {
                tracing::warn!(
                    "-S without {PWDB_ENV}: no SASL user can authenticate \
                     (set it to a file of user:password lines)"
                );
            }
            auth.realm = hostname();
        }
        Ok(auth)
    }

    /// Read the `-Y` file again (SIGHUP). On failure the old entries stay.
    pub fn reload(&self) -> Result<(), String> {
        let Some((path, entries)) = &self.ascii else {
            return Ok(());
        };
        let fresh = load_auth_file(path).map_err(|e| describe(path, e))?;
        *entries.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
        Ok(())
    }

    /// Whether `user` and `password` match an entry of the `-Y` file. Every entry is compared,
    /// each in constant time.
    pub fn check_ascii(&self, user: &[u8], password: &[u8]) -> bool {
        let Some((_, entries)) = &self.ascii else {
            return false;
        };
        let entries = entries.read().unwrap_or_else(|e| e.into_inner()).clone();
        let mut ok = false;
        for e in entries.iter() {
            let m = ct_eq(user, &e.user) & ct_eq(password, &e.password);
            ok |= m;
        }
        ok
    }

    /// Whether a SASL PLAIN message carries valid credentials.
    pub fn check_plain(&self, msg: &[u8]) -> bool {
        let Some(plain) = proto::parse_sasl_plain(msg) else {
            return false;
        };
        let authcid = plain.authcid.trim_ascii();
        if authcid.is_empty() {
            return false;
        }
        let canonical = self.with_realm(authcid);
        let authzid = plain.authzid.trim_ascii();
        if !authzid.is_empty() && self.with_realm(authzid) != canonical {
            // Cyrus SASL's default policy: no acting as another user.
            return false;
        }
        let Some(path) = &self.sasl_pwdb else {
            return false;
        };
        let mut names: Vec<&[u8]> = vec![&canonical];
        if canonical != authcid {
            names.push(authcid);
        }
        // An unreadable file lets no one in.
        check_pwdb(path, &names, plain.password).unwrap_or_default()
    }

    fn with_realm(&self, user: &[u8]) -> Vec<u8> {
        let mut out = user.to_vec();
        if !self.realm.is_empty() && !user.contains(&b'@') {
            out.push(b'@');
            out.extend_from_slice(&self.realm);
        }
        out
    }
}

fn describe(path: &Path, e: LoadError) -> String {
    match e {
        LoadError::Open(e) => format!(
            "Could not open authfile [{}] for reading, error {e}",
            path.display()
        ),
        LoadError::Malformed => format!(
            "Authfile [{}] has a malformed entry. Should be 'user:password'",
            path.display()
        ),
    }
}

/// The host name, as Cyrus SASL's user realm.
fn hostname() -> Vec<u8> {
    let mut buf = [0u8; 1025];
    // SAFETY: the buffer is valid for its length minus one, leaving a terminating NUL.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return Vec::new();
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(0);
    buf[..len].to_vec()
}

/// memcached's `sasl_server_userdb_checkpass`: does a line of the password file give one of
/// `names` this password? Every line and name is compared, in constant time.
fn check_pwdb(path: &Path, names: &[&[u8]], password: &[u8]) -> io::Result<bool> {
    let file = File::open(path)?;
    let mut pieces = Pieces {
        reader: BufReader::new(file),
    };
    let mut buf = Vec::with_capacity(MAX_ENTRY_LEN);
    let mut ok = false;
    while pieces.next_into(&mut buf)? {
        // memcached zeroes its 256-byte buffer before each fgets.
        buf.resize(MAX_ENTRY_LEN, 0);
        for name in names {
            let ulen = name.len();
            let plen = password.len();
            if ulen + plen > MAX_ENTRY_LEN - 4 {
                continue;
            }
            let user_ok = ct_eq(name, &buf[..ulen]) & (buf[ulen] == b':');
            let pass_ok = ct_eq(password, &buf[ulen + 1..ulen + 1 + plen])
                & matches!(buf[ulen + 1 + plen], b':' | b'\n' | b'\r' | 0);
            ok |= user_ok & pass_ok;
        }
        zero(&mut buf);
    }
    Ok(ok)
}

/// SASL progress of one connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SaslState {
    /// No exchange started, or the last one failed to start.
    #[default]
    Idle,
    /// `PLAIN` was started without the client's message: a step must carry it.
    AwaitingPlain,
    /// An exchange completed: no other can (Cyrus SASL's "step after doneflag").
    Done,
}

/// One connection's authentication state.
#[derive(Debug, Default)]
pub struct ConnAuth {
    /// Authenticated (checked only under `-Y` or `-S`).
    pub authenticated: bool,
    /// `-Y`: the length of the data block of an authentication request whose line was read.
    pub pending_data: Option<usize>,
    pub sasl: SaslState,
}

#[cfg(test)]
mod tests {
    use super::*;

    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

    fn parse(text: &[u8]) -> Result<Pairs, String> {
        parse_auth_file(text)
            .map(|v| {
                v.iter()
                    .map(|c| (c.user.to_vec(), c.password.to_vec()))
                    .collect()
            })
            .map_err(|e| format!("{e:?}"))
    }

    fn pairs(list: &[(&str, &str)]) -> Pairs {
        list.iter()
            .map(|(u, p)| (u.as_bytes().to_vec(), p.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn auth_file_format() {
        assert_eq!(parse(b"").unwrap(), pairs(&[]));
        assert_eq!(parse(b"a:b\n").unwrap(), pairs(&[("a", "b")]));
        assert_eq!(parse(b"a:b").unwrap(), pairs(&[("a", "b")]));
        assert_eq!(
            parse(b"a:b\r\nc:d:e\n:x\ny:\n").unwrap(),
            pairs(&[("a", "b"), ("c", "d:e"), ("", "x"), ("y", "")])
        );
        assert_eq!(
            parse(b"a:b c \n").unwrap(),
            pairs(&[("a", "b c ")]),
            "spaces are part of the password"
        );
        assert!(parse(b"a:b\n\n").is_err(), "an empty line is malformed");
        assert!(parse(b"ab\n").is_err());
        assert!(parse(b"a:b\nnocolon\n").is_err());
        // A NUL ends the password and the file.
        assert_eq!(parse(b"a:b\0c\nd:e\n").unwrap(), pairs(&[("a", "b")]));
        // At most 8 entries.
        let many: Vec<u8> = (0..10)
            .flat_map(|i| format!("u{i}:p\n").into_bytes())
            .collect();
        assert_eq!(parse(&many).unwrap().len(), 8);
        // A line is read in 255-byte pieces: the first piece is the entry and reading stops.
        let mut long = b"u:".to_vec();
        long.extend(std::iter::repeat_n(b'x', 300));
        long.extend_from_slice(b"\nv:w\n");
        let got = parse(&long).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1.len(), 253);
        // No ':' within the first 255 bytes.
        assert!(parse(&[b'x'; 300]).is_err());
    }

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"", b""));
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }

    #[test]
    fn pwdb_lines() {
        let dir = std::env::temp_dir().join(format!("kvcached-pwdb-{}", std::process::id()));
        std::fs::write(&dir, b"alice@host:secret\nbob:pw:extra\ncarol:x\r\n").unwrap();
        let check = |names: &[&[u8]], pass: &[u8]| check_pwdb(&dir, names, pass).unwrap();
        assert!(check(&[b"alice@host"], b"secret"));
        assert!(!check(&[b"alice"], b"secret"));
        assert!(!check(&[b"alice@host"], b"secre"));
        assert!(!check(&[b"alice@host"], b"secrets"));
        assert!(check(&[b"bob"], b"pw"));
        assert!(
            check(&[b"bob"], b"pw:extra"),
            "memcached compares the bytes as given"
        );
        assert!(check(&[b"carol"], b"x"));
        assert!(check(&[b"nobody", b"carol"], b"x"));
        assert!(!check(&[b"carol"], b""));
        let _ = std::fs::remove_file(&dir);
        assert!(check_pwdb(&dir, &[b"a"], b"b").is_err());
    }

    #[test]
    fn credential_debug_hides_the_password() {
        let c = Credential {
            user: (*b"u").into(),
            password: (*b"hunter2").into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
