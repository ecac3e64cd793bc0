//! memcached's command line, parsed into a [`Config`].
//!
//! kvcached takes every option memcached 1.6 takes, spelled the same way, so that it can
//! replace memcached in a unit file or a container command line. Parsing has two stages:
//!
//! 1. [`Lexer`] splits the arguments the way glibc's `getopt_long` does with memcached's
//!    option table: bundled short flags (`-vv`, `-dv`), values attached or separate
//!    (`-p11211`, `-p 11211`), long options with `=` or a separate value (`--port=11211`,
//!    `--port 11211`), unambiguous long-option prefixes (`--thr 4`), `--` ending the
//!    options, and arguments that are not options skipped over (memcached ignores them).
//! 2. [`Builder`] applies each option in order, checking its value, then checks the
//!    options against each other the way memcached does after its option loop, and yields
//!    the validated [`Config`].
//!
//! Options are handled in order, so `-h`, `-i` and `-V` win over anything after them and
//! an error before them wins over them, as with memcached.

use crate::setup::config::{Config, IoChoice, ListenAddr, ListenTls, MemoryLimit, ProtocolChoice};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run the server. `notes` are messages to log at startup (for example, memcached
    /// options that kvcached accepts and ignores).
    Run {
        config: Box<Config>,
        notes: Vec<String>,
    },
    /// Print this text to stdout and exit 0 (`-h` gives the help text, `-i` the license).
    Help(String),
    /// Print the version and exit 0 (`-V`).
    Version,
}

/// Parse the arguments after the program name. An `Err` is a message for stderr and a
/// non-zero exit.
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Action, String> {
    let args: Vec<OsString> = args.into_iter().collect();
    let mut lexer = Lexer::new(&args);
    let mut builder = Builder::new();
    while let Some(opt) = lexer.next_opt() {
        if let Some(action) = builder.apply(&opt?)? {
            return Ok(action);
        }
    }
    for operand in &lexer.operands {
        builder.note(format!(
            "ignoring extra argument '{}': kvcached, like memcached, takes only options",
            operand.to_string_lossy()
        ));
    }
    builder.finish()
}

/// Smallest `-I`.
pub const ITEM_SIZE_MIN: usize = 1024;
/// Largest `-I`.
pub const ITEM_SIZE_MAX: usize = 1 << 30;
/// Above this many worker threads, warn (as memcached does).
pub const THREADS_WARN: usize = 64;
/// `-o io_sqpoll` without a value: the polling thread sleeps after 10 ms without work.
const DEFAULT_SQPOLL_IDLE_MS: u32 = 10;

// ---------------------------------------------------------------------------------------
// Stage 1: getopt_long.
// ---------------------------------------------------------------------------------------

/// Whether an option takes a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HasArg {
    No,
    Required,
    /// Only as `--name=value` (memcached's `--verbose`).
    Optional,
}

/// One entry of the option table: the short letter, the long name, and the value.
struct OptSpec {
    short: u8,
    long: &'static str,
    arg: HasArg,
}

const fn spec(short: u8, long: &'static str, arg: HasArg) -> OptSpec {
    OptSpec { short, long, arg }
}

/// memcached 1.6's options (its getopt string and long-option table), in its order.
const OPTIONS: &[OptSpec] = &[
    spec(b'a', "unix-mask", HasArg::Required),
    spec(b'A', "enable-shutdown", HasArg::No),
    spec(b'Z', "enable-ssl", HasArg::No),
    spec(b'p', "port", HasArg::Required),
    spec(b's', "unix-socket", HasArg::Required),
    spec(b'U', "udp-port", HasArg::Required),
    spec(b'm', "memory-limit", HasArg::Required),
    spec(b'M', "disable-evictions", HasArg::No),
    spec(b'c', "conn-limit", HasArg::Required),
    spec(b'k', "lock-memory", HasArg::No),
    spec(b'h', "help", HasArg::No),
    spec(b'i', "license", HasArg::No),
    spec(b'V', "version", HasArg::No),
    spec(b'r', "enable-coredumps", HasArg::No),
    spec(b'v', "verbose", HasArg::Optional),
    spec(b'd', "daemon", HasArg::No),
    spec(b'l', "listen", HasArg::Required),
    spec(b'u', "user", HasArg::Required),
    spec(b'P', "pidfile", HasArg::Required),
    spec(b'f', "slab-growth-factor", HasArg::Required),
    spec(b'n', "slab-min-size", HasArg::Required),
    spec(b't', "threads", HasArg::Required),
    spec(b'D', "", HasArg::Required),
    spec(b'L', "enable-largepages", HasArg::No),
    spec(b'R', "max-reqs-per-event", HasArg::Required),
    spec(b'C', "disable-cas", HasArg::No),
    spec(b'b', "listen-backlog", HasArg::Required),
    spec(b'B', "protocol", HasArg::Required),
    spec(b'I', "max-item-size", HasArg::Required),
    spec(b'S', "enable-sasl", HasArg::No),
    spec(b'F', "disable-flush-all", HasArg::No),
    spec(b'X', "disable-dumping", HasArg::No),
    spec(b'W', "disable-watch", HasArg::No),
    spec(b'Y', "auth-file", HasArg::Required),
    spec(b'e', "memory-file", HasArg::Required),
    spec(b'o', "extended", HasArg::Required),
    spec(b'N', "napi-ids", HasArg::Required),
    // kvcached's own (no short letter).
    spec(REPLICA_OF, "replica-of", HasArg::Required),
    spec(REPLICA_AUTH, "replica-auth", HasArg::Required),
    spec(MIN_REPLICAS, "min-replicas", HasArg::Required),
    spec(
        MIN_REPLICAS_MAX_LAG,
        "min-replicas-max-lag",
        HasArg::Required,
    ),
    spec(REPLICA_SERVE_STALE, "replica-serve-stale", HasArg::Required),
    spec(REPLICA_AUTH_MECH, "replica-auth-mech", HasArg::Required),
    spec(REPLICA_TLS, "replica-tls", HasArg::No),
    spec(REPLICA_TLS_CA, "replica-tls-ca", HasArg::Required),
    spec(REPLICA_TLS_CERT, "replica-tls-cert", HasArg::Required),
    spec(REPLICA_TLS_KEY, "replica-tls-key", HasArg::Required),
    spec(REPLICA_TLS_NAME, "replica-tls-name", HasArg::Required),
    spec(REPL_BACKLOG, "repl-backlog", HasArg::Required),
];

/// The option code of `--repl-backlog` (long form only).
const REPL_BACKLOG: u8 = 12;

/// The option codes of `--replica-tls` and its settings (long form only).
const REPLICA_TLS: u8 = 7;
const REPLICA_TLS_CA: u8 = 8;
const REPLICA_TLS_CERT: u8 = 9;
const REPLICA_TLS_KEY: u8 = 10;
const REPLICA_TLS_NAME: u8 = 11;

/// The option code of `--replica-auth-mech` (long form only).
const REPLICA_AUTH_MECH: u8 = 6;

/// The option code of `--replica-serve-stale` (long form only).
const REPLICA_SERVE_STALE: u8 = 5;

/// The option codes of `--min-replicas` and `--min-replicas-max-lag` (long form only).
const MIN_REPLICAS: u8 = 3;
const MIN_REPLICAS_MAX_LAG: u8 = 4;

/// The option code of `--replica-auth` (long form only).
const REPLICA_AUTH: u8 = 2;

/// The option code of `--replica-of` (not a letter: long form only).
const REPLICA_OF: u8 = 1;

fn short_spec(c: u8) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|o| o.short == c)
}

/// Find a long option by its name or, like glibc, by an unambiguous prefix of it.
fn long_spec(name: &[u8]) -> Result<&'static OptSpec, String> {
    let shown = String::from_utf8_lossy(name);
    if let Some(o) = OPTIONS
        .iter()
        .find(|o| !o.long.is_empty() && o.long.as_bytes() == name)
    {
        return Ok(o);
    }
    let matches: Vec<&OptSpec> = OPTIONS
        .iter()
        .filter(|o| !o.long.is_empty() && o.long.as_bytes().starts_with(name))
        .collect();
    match matches.len() {
        0 => Err(format!(
            "unknown option '--{shown}' (kvcached -h lists the options)"
        )),
        1 => Ok(matches[0]),
        _ => Err(format!(
            "option '--{shown}' is ambiguous: it could be {}",
            matches
                .iter()
                .map(|o| format!("--{}", o.long))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// One option as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawOpt {
    /// The short letter the option maps to.
    short: u8,
    /// How it was spelled (`-p` or `--port`), for messages.
    spelling: String,
    /// Its value, leading white space removed (as memcached 1.6.32+ does).
    value: Option<OsString>,
}

/// getopt_long over memcached's option table.
struct Lexer<'a> {
    args: &'a [OsString],
    /// Index of the next argument to look at.
    next: usize,
    /// Inside a bundle of short options: (argument index, byte offset of the next letter).
    bundle: Option<(usize, usize)>,
    /// Arguments that are not options (getopt permutes them to the end; memcached
    /// ignores them).
    operands: Vec<OsString>,
    /// `--` was seen: everything after it is an operand.
    no_more_options: bool,
}

fn trim_value(v: &[u8]) -> OsString {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    OsStr::from_bytes(&v[start..]).to_os_string()
}

impl<'a> Lexer<'a> {
    fn new(args: &'a [OsString]) -> Lexer<'a> {
        Lexer {
            args,
            next: 0,
            bundle: None,
            operands: Vec::new(),
            no_more_options: false,
        }
    }

    /// The next option, an error for a malformed one, or `None` at the end.
    fn next_opt(&mut self) -> Option<Result<RawOpt, String>> {
        if let Some((i, pos)) = self.bundle.take() {
            return Some(self.short_in_bundle(i, pos));
        }
        while self.next < self.args.len() {
            let i = self.next;
            self.next += 1;
            let arg = self.args[i].as_bytes();
            if self.no_more_options {
                self.operands.push(self.args[i].clone());
            } else if arg == b"--" {
                self.no_more_options = true;
            } else if let Some(rest) = arg.strip_prefix(b"--") {
                return Some(self.long(rest));
            } else if arg.len() > 1 && arg[0] == b'-' {
                return Some(self.short_in_bundle(i, 1));
            } else {
                self.operands.push(self.args[i].clone());
            }
        }
        None
    }

    fn short_in_bundle(&mut self, i: usize, pos: usize) -> Result<RawOpt, String> {
        let arg = self.args[i].as_bytes();
        let c = arg[pos];
        let Some(spec) = short_spec(c) else {
            return Err(if c.is_ascii_graphic() {
                format!(
                    "unknown option '-{}' (kvcached -h lists the options)",
                    c as char
                )
            } else {
                format!(
                    "unknown option byte 0x{c:02x} in '{}'",
                    String::from_utf8_lossy(arg)
                )
            });
        };
        let spelling = format!("-{}", c as char);
        let rest = &arg[pos + 1..];
        if spec.arg != HasArg::Required {
            if !rest.is_empty() {
                self.bundle = Some((i, pos + 1));
            }
            return Ok(RawOpt {
                short: c,
                spelling,
                value: None,
            });
        }
        let value = if !rest.is_empty() {
            rest
        } else if self.next < self.args.len() {
            self.next += 1;
            self.args[self.next - 1].as_bytes()
        } else {
            return Err(format!("option {spelling} needs a value"));
        };
        Ok(RawOpt {
            short: c,
            spelling,
            value: Some(trim_value(value)),
        })
    }

    fn long(&mut self, rest: &[u8]) -> Result<RawOpt, String> {
        let (name, inline) = match rest.iter().position(|&b| b == b'=') {
            Some(eq) => (&rest[..eq], Some(&rest[eq + 1..])),
            None => (rest, None),
        };
        let spec = long_spec(name)?;
        let spelling = format!("--{}", spec.long);
        let value = match (spec.arg, inline) {
            (HasArg::No, Some(_)) => {
                return Err(format!("option {spelling} does not take a value"));
            }
            (HasArg::No, None) | (HasArg::Optional, None) => None,
            (HasArg::Optional, Some(v)) | (HasArg::Required, Some(v)) => Some(trim_value(v)),
            (HasArg::Required, None) => {
                if self.next < self.args.len() {
                    self.next += 1;
                    Some(trim_value(self.args[self.next - 1].as_bytes()))
                } else {
                    return Err(format!("option {spelling} needs a value"));
                }
            }
        };
        Ok(RawOpt {
            short: spec.short,
            spelling,
            value,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Stage 2: options to a Config.
// ---------------------------------------------------------------------------------------

/// The configuration being built, and what memcached's later checks need to know.
struct Builder {
    cfg: Config,
    notes: Vec<String>,
    tcp_specified: bool,
    udp_specified: bool,
    protocol_specified: bool,
    /// The first `-l` replaces the default listener; later ones add to it.
    listen_given: bool,
    /// `-N`.
    napi_ids: Option<u32>,
    /// `-n` (memcached's default 48): the smallest `slab_sizes` entry.
    slab_min_size: u32,
    /// `-o slab_chunk_max`, in bytes, when given.
    slab_chunk_max: Option<usize>,
    /// `-o slab_sizes`, checked at the end against `-n` and `slab_chunk_max`.
    slab_sizes: Option<String>,
    /// `-f` (memcached's default 1.25).
    slab_growth_factor: f64,
    hot_lru_pct: u32,
    warm_lru_pct: u32,
    temporary_ttl: bool,
    /// `-o ext_path` was given (extstore would be on).
    ext_path: bool,
    /// `-o ext_wbuf_size`, in bytes (memcached's default 4 MiB).
    ext_wbuf_size: u64,
}

/// `value` as text, or an error naming the option.
fn text<'v>(spelling: &str, value: &'v OsStr) -> Result<&'v str, String> {
    value
        .to_str()
        .ok_or_else(|| format!("the value of {spelling} is not valid UTF-8"))
}

fn bad(spelling: &str, value: &str, expected: &str) -> String {
    format!("invalid value '{value}' for {spelling}: expected {expected}")
}

/// A decimal integer (an optional `+`, then digits), nothing else.
fn int<T: std::str::FromStr>(spelling: &str, value: &str, expected: &str) -> Result<T, String> {
    let digits = value.strip_prefix('+').unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(spelling, value, expected));
    }
    digits.parse().map_err(|_| bad(spelling, value, expected))
}

/// A decimal integer in `lo..=hi`.
fn int_in<T>(spelling: &str, value: &str, lo: T, hi: T, expected: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + Copy,
{
    let n: T = int(spelling, value, expected)?;
    if n < lo || n > hi {
        return Err(bad(spelling, value, expected));
    }
    Ok(n)
}

/// A CPU list: numbers and ranges as taskset writes them, separated by `:` because `-o`
/// separates suboptions with commas (`2:3`, `4-7:12`), each CPU below 4096, at most 1024
/// in all.
fn cpu_list(spelling: &str, value: &str) -> Result<Vec<u32>, String> {
    const EXPECTED: &str =
        "CPU numbers or ranges separated by ':', e.g. 2:3 or 4-7 (each below 4096)";
    let mut cpus = Vec::new();
    for part in value.split(':') {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (
                int_in(spelling, a, 0u32, 4095, EXPECTED)?,
                int_in(spelling, b, 0u32, 4095, EXPECTED)?,
            ),
            None => {
                let n = int_in(spelling, part, 0u32, 4095, EXPECTED)?;
                (n, n)
            }
        };
        if lo > hi || cpus.len() + (hi - lo) as usize >= 1024 {
            return Err(bad(spelling, value, EXPECTED));
        }
        cpus.extend(lo..=hi);
    }
    Ok(cpus)
}

/// A finite decimal number.
fn float(spelling: &str, value: &str, expected: &str) -> Result<f64, String> {
    let ok = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'+' | b'-' | b'e' | b'E'));
    match value.parse::<f64>() {
        Ok(f) if ok && f.is_finite() => Ok(f),
        _ => Err(bad(spelling, value, expected)),
    }
}

/// `-I`'s value: bytes, or a number with a `k`, `m` or `g` suffix (either case).
fn item_size(spelling: &str, value: &str) -> Result<usize, String> {
    const EXPECTED: &str = "a size in bytes, or with a k, m or g suffix (like 1m)";
    let (digits, mult) = match value.as_bytes().last() {
        Some(b'k' | b'K') => (&value[..value.len() - 1], 1usize << 10),
        Some(b'm' | b'M') => (&value[..value.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&value[..value.len() - 1], 1 << 30),
        _ => (value, 1),
    };
    let n: usize = int(spelling, digits, EXPECTED).map_err(|_| bad(spelling, value, EXPECTED))?;
    n.checked_mul(mult)
        .ok_or_else(|| bad(spelling, value, EXPECTED))
}

/// `-m`'s value: megabytes (an `m` suffix is allowed), or `auto`.
fn memory_limit(spelling: &str, value: &str) -> Result<MemoryLimit, String> {
    const EXPECTED: &str = "a number of megabytes greater than 0, or auto";
    if value == "auto" {
        return Ok(MemoryLimit::Auto);
    }
    let digits = value
        .strip_suffix('m')
        .or_else(|| value.strip_suffix('M'))
        .unwrap_or(value);
    let mb: usize = int(spelling, digits, EXPECTED).map_err(|_| bad(spelling, value, EXPECTED))?;
    if mb == 0 {
        return Err(bad(spelling, value, EXPECTED));
    }
    mb.checked_mul(1 << 20)
        .map(MemoryLimit::Fixed)
        .ok_or_else(|| bad(spelling, value, "a memory limit this machine can address"))
}

/// One `-l` entry: `[notls:|btls:|mtls:][proto[NAME]:][tag[NAME]:|tag_NAME_:]HOST[:PORT]`.
/// (Whether a TLS prefix comes with `-Z` is checked once every option is read.)
fn listen_entry(entry: &str, auth_file: bool) -> Result<ListenAddr, String> {
    let err = |why: &str| format!("invalid -l entry '{entry}': {why}");
    let mut p = entry;
    let mut tls = ListenTls::Default;
    for (prefix, kind) in [
        ("notls", ListenTls::Plain),
        ("btls", ListenTls::NoPeer),
        ("mtls", ListenTls::Peer),
    ] {
        if let Some(rest) = p.strip_prefix(prefix) {
            // memcached skips the prefix and one separator after it.
            p = rest.get(1..).unwrap_or("");
            tls = kind;
            break;
        }
    }
    let mut protocol = None;
    if let Some(rest) = p.strip_prefix("proto") {
        if let Some(rest) = rest.strip_prefix('[') {
            let end = rest
                .find(']')
                .ok_or_else(|| err("proto[ has no closing ]"))?;
            let name = &rest[..end];
            protocol = Some(match name {
                "ascii" => ProtocolChoice::Ascii,
                "binary" => {
                    if auth_file {
                        return Err(err(
                            "proto[binary] cannot be used with -Y (ASCII authentication)",
                        ));
                    }
                    ProtocolChoice::Binary
                }
                "negotiating" | "auto" => {
                    if auth_file {
                        ProtocolChoice::Ascii
                    } else {
                        ProtocolChoice::Auto
                    }
                }
                "proxy" => return Err(err("kvcached has no proxy mode")),
                _ => {
                    return Err(err(&format!(
                        "unknown protocol '{name}' (ascii, binary or negotiating)"
                    )))
                }
            });
            p = rest[end + 1..]
                .strip_prefix(':')
                .unwrap_or(&rest[end + 1..]);
        }
    }
    let mut tag = None;
    if let Some(rest) = p.strip_prefix("tag") {
        let close = match rest.as_bytes().first() {
            Some(b'[') => Some(']'),
            Some(b'_') => Some('_'),
            _ => None,
        };
        if let Some(close) = close {
            let inner = &rest[1..];
            let end = inner
                .find(close)
                .ok_or_else(|| err("the tag has no closing ] or _"))?;
            let name = &inner[..end];
            if name.is_empty() || name.len() > 8 {
                return Err(err("a listener tag must be 1 to 8 characters"));
            }
            tag = Some(name.to_string());
            let after = &inner[end + 1..];
            p = after.strip_prefix(':').unwrap_or(after);
        }
    }
    let port_of = |s: &str| -> Result<u16, String> {
        int(&format!("-l {entry}"), s, "a port number 0-65535")
            .map_err(|_| err(&format!("'{s}' is not a port number 0-65535")))
    };
    let (host, port) = if let Some(rest) = p.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or_else(|| err("an IPv6 address in [ has no closing ]"))?;
        let host = &rest[..end];
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port_of(port)?),
            None if after.is_empty() => None,
            None => return Err(err("unexpected text after the ]")),
        };
        (host, port)
    } else {
        match p.find(':') {
            // One colon: HOST:PORT. More: a bare IPv6 address without a port.
            Some(colon) if !p[colon + 1..].contains(':') => {
                (&p[..colon], Some(port_of(&p[colon + 1..])?))
            }
            _ => (p, None),
        }
    };
    if host.is_empty() {
        return Err(err("no host (use * for every interface)"));
    }
    Ok(ListenAddr {
        host: (host != "*").then(|| host.to_string()),
        port,
        protocol,
        tag,
        tls,
    })
}

/// `-o ext_path`'s value: `PATH:SIZE[:BUCKET]`, SIZE a number with m, g, t or p.
fn ext_path(value: &str) -> Result<(), String> {
    let err = |why: &str| format!("invalid -o ext_path={value}: {why}");
    let mut parts = value.split(':').filter(|s| !s.is_empty());
    parts.next().ok_or_else(|| err("no file"))?;
    let size = parts
        .next()
        .ok_or_else(|| err("no size (like ext_path=/mnt/extstore:64g)"))?;
    let (digits, unit) = size.split_at(size.len() - 1);
    if !matches!(unit, "m" | "M" | "g" | "G" | "t" | "T" | "p" | "P")
        || digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(err("the size must be a number with an m, g, t or p suffix"));
    }
    if let Some(bucket) = parts.next() {
        if !matches!(
            bucket,
            "compact" | "lowttl" | "chunked" | "default" | "coldcompact" | "old"
        ) {
            return Err(err(&format!("unknown bucket '{bucket}'")));
        }
    }
    Ok(())
}

impl Builder {
    fn new() -> Builder {
        Builder {
            cfg: Config::default(),
            notes: Vec::new(),
            tcp_specified: false,
            udp_specified: false,
            protocol_specified: false,
            listen_given: false,
            napi_ids: None,
            slab_min_size: 48,
            slab_chunk_max: None,
            slab_sizes: None,
            slab_growth_factor: 1.25,
            hot_lru_pct: 20,
            warm_lru_pct: 40,
            temporary_ttl: false,
            ext_path: false,
            ext_wbuf_size: 4 << 20,
        }
    }

    fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// An option that sizes memcached's slabs: kvcached has none, but the option still
    /// sets the size classes its stats report.
    fn classes_only(&mut self, what: &str) {
        self.note(format!(
            "memcached option {what}: kvcached has no slabs; it sets only the size classes \
             that stats items and stats slabs report"
        ));
    }

    fn ignored(&mut self, what: &str) {
        self.note(format!(
            "ignoring memcached option {what}: no meaning in kvcached"
        ));
    }

    /// Apply one option. `Ok(Some(action))` ends parsing (`-h`, `-i`, `-V`).
    fn apply(&mut self, opt: &RawOpt) -> Result<Option<Action>, String> {
        let sp = opt.spelling.as_str();
        // The value as text (options whose value is a path use `opt.value` directly).
        let value = match &opt.value {
            Some(v) if !matches!(opt.short, b's' | b'P' | b'Y' | b'e') => text(sp, v)?,
            _ => "",
        };
        let path = || -> Result<PathBuf, String> {
            match &opt.value {
                Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
                _ => Err(format!("option {sp} needs a file name")),
            }
        };
        match opt.short {
            b'a' => {
                let ok = !value.is_empty() && value.bytes().all(|b| (b'0'..=b'7').contains(&b));
                match u32::from_str_radix(value, 8) {
                    Ok(mask) if ok && mask <= 0o777 => self.cfg.unix_mask = mask,
                    _ => return Err(bad(sp, value, "octal permission bits such as 0700")),
                }
            }
            b'A' => self.cfg.enable_shutdown = true,
            b'Z' => self.cfg.ssl.enabled = true,
            b'p' => {
                self.cfg.tcp_port = int(sp, value, "a port number 0-65535 (0 turns TCP off)")?;
                self.tcp_specified = true;
            }
            b's' => self.cfg.unix_socket = Some(path()?),
            b'U' => {
                self.cfg.udp_port = int(sp, value, "a port number 0-65535 (0 turns UDP off)")?;
                self.udp_specified = true;
            }
            b'm' => self.cfg.memory_limit = memory_limit(sp, value)?,
            b'M' => self.cfg.no_evict = true,
            b'c' => {
                self.cfg.max_connections = int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as usize,
                    "a number of connections greater than 0",
                )?
            }
            b'k' => self.cfg.lock_memory = true,
            b'h' => return Ok(Some(Action::Help(help_text()))),
            b'i' => return Ok(Some(Action::Help(license_text()))),
            b'V' => return Ok(Some(Action::Version)),
            b'r' => self.cfg.max_core_file = true,
            b'v' => self.cfg.verbose = self.cfg.verbose.saturating_add(1),
            b'd' => self.cfg.daemonize = true,
            b'l' => {
                let auth_file = self.cfg.auth_file.is_some();
                let entries: Vec<&str> = value
                    .split([',', ';'])
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .collect();
                if entries.is_empty() {
                    return Err(format!(
                        "option {sp} needs an address (use * for every interface)"
                    ));
                }
                if !self.listen_given {
                    self.listen_given = true;
                    self.cfg.listen.clear();
                    self.cfg.listeners.clear();
                }
                for entry in entries {
                    let parsed = listen_entry(entry, auth_file)?;
                    if !self.cfg.listen.iter().any(|l| l == entry) {
                        self.cfg.listen.push(entry.to_string());
                        self.cfg.listeners.push(parsed);
                    }
                }
            }
            b'u' => {
                if value.is_empty() {
                    return Err(format!("option {sp} needs a user name"));
                }
                self.cfg.user = Some(value.to_string());
            }
            b'P' => self.cfg.pid_file = Some(path()?),
            b'f' => {
                let f = float(sp, value, "a growth factor greater than 1")?;
                if f <= 1.0 {
                    return Err(bad(sp, value, "a growth factor greater than 1"));
                }
                self.slab_growth_factor = f;
                self.classes_only(sp);
            }
            b'n' => {
                self.slab_min_size = int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as u32,
                    "a size in bytes greater than 0",
                )?;
                self.classes_only(sp);
            }
            b't' => {
                let n: usize = int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as usize,
                    "a number of threads greater than 0",
                )?;
                self.cfg.threads = n;
                if n > THREADS_WARN {
                    self.note(format!(
                        "warning: {n} worker threads is a lot; more threads than cores \
                         (or more than {THREADS_WARN}) is not recommended"
                    ));
                }
            }
            b'D' => {
                // memcached takes the first byte and switches prefix stats on.
                let Some(&d) = value.as_bytes().first() else {
                    return Err(format!("option {sp} needs a delimiter character"));
                };
                self.cfg.prefix_delimiter = d;
                self.cfg.detail_enabled = true;
            }
            b'L' => self.ignored(sp),
            b'R' => {
                self.cfg.reqs_per_event = int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as usize,
                    "a number of requests greater than 0",
                )?
            }
            b'C' => self.cfg.use_cas = false,
            b'b' => self.cfg.backlog = int(sp, value, "a backlog length 0 or more")?,
            b'B' => {
                self.cfg.protocol = match value {
                    "auto" => ProtocolChoice::Auto,
                    "ascii" => ProtocolChoice::Ascii,
                    "binary" => ProtocolChoice::Binary,
                    _ => return Err(bad(sp, value, "auto, ascii or binary")),
                };
                self.protocol_specified = true;
            }
            b'I' => self.cfg.item_size_max = item_size(sp, value)?,
            b'S' => self.cfg.sasl = true,
            b'F' => self.cfg.flush_enabled = false,
            b'X' => self.cfg.dump_enabled = false,
            b'W' => self.cfg.watch_enabled = false,
            b'Y' => self.cfg.auth_file = Some(path()?),
            b'e' => self.cfg.memory_file = Some(path()?),
            REPLICA_OF => {
                let ok = value
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
                if !ok {
                    return Err(bad(sp, value, "HOST:PORT of the master"));
                }
                self.cfg.replica_of = Some(value.to_string());
            }
            REPLICA_AUTH => self.cfg.replica_auth = Some(path()?),
            REPLICA_TLS => {
                self.cfg.replica_tls.get_or_insert_with(Default::default);
            }
            REPLICA_TLS_CA => {
                self.cfg.replica_tls.get_or_insert_with(Default::default).ca = Some(path()?)
            }
            REPLICA_TLS_CERT => {
                self.cfg
                    .replica_tls
                    .get_or_insert_with(Default::default)
                    .cert = Some(path()?)
            }
            REPLICA_TLS_KEY => {
                self.cfg
                    .replica_tls
                    .get_or_insert_with(Default::default)
                    .key = Some(path()?)
            }
            REPLICA_TLS_NAME => {
                if value.is_empty() {
                    return Err(bad(sp, value, "the name in the master's certificate"));
                }
                self.cfg
                    .replica_tls
                    .get_or_insert_with(Default::default)
                    .server_name = Some(value.to_string())
            }
            MIN_REPLICAS => {
                self.cfg.min_replicas = int_in(sp, value, 0, 1000, "a number of replicas 0-1000")?
            }
            REPLICA_AUTH_MECH => {
                self.cfg.replica_auth_sasl = match value {
                    "ascii" => false,
                    "sasl" => true,
                    _ => return Err(bad(sp, value, "ascii or sasl")),
                }
            }
            REPLICA_SERVE_STALE => {
                self.cfg.replica_serve_stale = match value {
                    "yes" => true,
                    "no" => false,
                    _ => return Err(bad(sp, value, "yes or no")),
                }
            }
            REPL_BACKLOG => {
                let mb: usize = int_in(sp, value, 1, 1 << 24, "a number of megabytes 1-16777216")?;
                self.cfg.repl_backlog = mb << 20;
            }
            MIN_REPLICAS_MAX_LAG => {
                let secs: u64 = int_in(sp, value, 1, 86_400, "a number of seconds 1-86400")?;
                self.cfg.min_replicas_max_lag = Duration::from_secs(secs);
            }
            b'N' => {
                self.napi_ids = Some(int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as u32,
                    "a number of NAPI ids greater than 0",
                )?);
                self.ignored(sp);
            }
            b'o' => self.suboptions(value)?,
            other => {
                return Err(format!(
                    "internal error: option -{} is in the table but not handled",
                    other as char
                ))
            }
        }
        Ok(None)
    }

    /// `-o a,b=c,...`, split the way getsubopt(3) splits it.
    fn suboptions(&mut self, list: &str) -> Result<(), String> {
        let mut items: Vec<&str> = list.split(',').collect();
        // getsubopt stops at the end of the string, so one trailing comma is harmless;
        // an empty item anywhere else is an error.
        if items.len() > 1 && items.last() == Some(&"") {
            items.pop();
        }
        if list.is_empty() {
            items.clear();
        }
        for item in items {
            let (key, val) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            self.suboption(item, key, val)?;
        }
        Ok(())
    }

    fn suboption(&mut self, item: &str, key: &str, val: Option<&str>) -> Result<(), String> {
        let sp = format!("-o {key}");
        let sp = sp.as_str();
        let need = |v: Option<&'_ str>| -> Result<String, String> {
            v.map(str::to_string)
                .ok_or_else(|| format!("-o {key} needs a value ({key}=...)"))
        };
        match key {
            // Implemented.
            "metrics" => {
                let v = need(val)?;
                let addr = std::net::ToSocketAddrs::to_socket_addrs(v.as_str())
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| format!("-o metrics: {v:?} is not HOST:PORT"))?;
                self.cfg.metrics = Some(addr);
            }
            "idle_timeout" => {
                let secs: u64 = int(sp, &need(val)?, "a number of seconds (0 turns it off)")?;
                self.cfg.idle_timeout = (secs > 0).then(|| Duration::from_secs(secs));
            }
            "reuseport" => self.cfg.reuseport = true,
            "cpu_affinity" => self.cfg.cpu_affinity = true,
            "io" => {
                self.cfg.io = IoChoice::parse(&need(val)?)
                    .ok_or_else(|| "-o io: expected uring, epoll or auto".to_string())?;
            }
            "io_sqpoll" => {
                let ms = match val {
                    Some(v) => int_in(sp, v, 1, 60_000, "milliseconds, 1 to 60000")?,
                    None => DEFAULT_SQPOLL_IDLE_MS,
                };
                self.cfg.io_sqpoll = Some(ms);
            }
            "io_sqpoll_cpus" => {
                self.cfg.io_sqpoll_cpus = cpu_list(sp, &need(val)?)?;
                self.cfg.io_sqpoll.get_or_insert(DEFAULT_SQPOLL_IDLE_MS);
            }
            "maxconns_fast" => self.cfg.maxconns_fast = true,
            "no_maxconns_fast" => self.cfg.maxconns_fast = false,
            "debug_clock" => self.cfg.debug_clock = true,
            // One engine is left; `engine=log` stays accepted so old command lines work.
            "engine" => match need(val)?.as_str() {
                "log" => {}
                "hashmap" => {
                    return Err("-o engine=hashmap: that engine was retired; \
                         the log engine is the only one (drop the option)"
                        .to_string())
                }
                other => return Err(format!("-o engine: unknown engine {other:?} (log)")),
            },

            // Accepted and ignored, values checked as memcached checks them.
            "hashpower" => {
                // Only the level `stats` reports starts there: kvcached's index sizes itself.
                self.cfg.hashpower =
                    int_in::<u32>(sp, &need(val)?, 12, 32, "a number from 12 to 32")?;
                self.ignored(sp);
            }
            "tail_repair_time" => {
                int_in::<u32>(
                    sp,
                    &need(val)?,
                    10,
                    u32::MAX,
                    "a number of seconds, 10 or more",
                )?;
                self.ignored(sp);
            }
            "hash_algorithm" => {
                let v = need(val)?;
                if !matches!(v.as_str(), "jenkins" | "murmur3" | "xxh3") {
                    return Err(bad(sp, &v, "jenkins, murmur3 or xxh3"));
                }
                self.ignored(sp);
            }
            "slab_automove" => {
                if let Some(v) = val {
                    int_in::<u32>(sp, v, 0, 2, "0, 1 or 2")?;
                }
                self.ignored(sp);
            }
            "slab_automove_ratio" => {
                let v = need(val)?;
                let r = float(sp, &v, "a ratio greater than 0, at most 1")?;
                if r <= 0.0 || r > 1.0 {
                    return Err(bad(sp, &v, "a ratio greater than 0, at most 1"));
                }
                self.ignored(sp);
            }
            "slab_automove_window" => {
                int_in::<u32>(sp, &need(val)?, 3, 1800, "a number from 3 to 1800")?;
                self.ignored(sp);
            }
            "slab_automove_freeratio" | "ext_max_frag" => {
                float(sp, &need(val)?, "a number")?;
                self.ignored(sp);
            }
            "lru_crawler_sleep" => {
                int_in::<u32>(
                    sp,
                    &need(val)?,
                    0,
                    1_000_000,
                    "microseconds from 0 to 1000000",
                )?;
                self.ignored(sp);
            }
            "read_buf_mem_limit" => {
                let mb = int::<u32>(sp, &need(val)?, "a whole number of megabytes")?;
                self.cfg.read_buf_mem_limit = (mb as usize).saturating_mul(1 << 20);
            }
            "watcher_logbuf_size" => {
                let kb: u32 = int(sp, &need(val)?, "a whole number")?;
                self.cfg.watcher_buf = (kb as usize).saturating_mul(1024);
            }
            "lru_crawler_tocrawl" | "worker_logbuf_size" => {
                int::<u32>(sp, &need(val)?, "a whole number")?;
                self.ignored(sp);
            }
            "warm_restart_ignore_bad_file" => self.cfg.warm_ignore_bad_file = true,
            "log_format" => {
                self.cfg.log_format = match need(val)?.as_str() {
                    "text" => crate::setup::logging::Format::Text,
                    "json" => crate::setup::logging::Format::Json,
                    other => return Err(format!("-o log_format: {other:?} is not text or json")),
                }
            }
            "evict_size_factor" => {
                self.cfg.evict_size_factor =
                    int_in::<u32>(sp, &need(val)?, 0, 64, "a whole number from 0 to 64")?;
            }
            "lru_crawler" => self.cfg.lru_crawler = true,
            "no_lru_crawler" => self.cfg.lru_crawler = false,
            "lru_maintainer" => {
                self.cfg.lru_maintainer = true;
                self.ignored(sp);
            }
            "no_lru_maintainer" => {
                self.cfg.lru_maintainer = false;
                self.ignored(sp);
            }
            "hot_lru_pct" | "warm_lru_pct" => {
                let pct = int_in::<u32>(sp, &need(val)?, 1, 79, "a percentage from 1 to 79")?;
                if key == "hot_lru_pct" {
                    self.hot_lru_pct = pct;
                } else {
                    self.warm_lru_pct = pct;
                }
                self.ignored(sp);
            }
            "hot_max_factor" | "warm_max_factor" => {
                let v = need(val)?;
                if float(sp, &v, "a number greater than 0")? <= 0.0 {
                    return Err(bad(sp, &v, "a number greater than 0"));
                }
                self.ignored(sp);
            }
            "temporary_ttl" => {
                int::<u32>(sp, &need(val)?, "a number of seconds")?;
                self.temporary_ttl = true;
                self.ignored(sp);
            }
            "slab_sizes" => {
                self.slab_sizes = Some(need(val)?);
                self.classes_only(sp);
            }
            "slab_chunk_max" => {
                // memcached 1.6.18 reads bytes; newer releases read kilobytes (at most
                // 1024). Take both: up to 1024 is kilobytes, more is bytes.
                let n: usize = int_in(
                    sp,
                    &need(val)?,
                    1,
                    1 << 30,
                    "a size in kilobytes (1 to 1024) or in bytes",
                )?;
                self.slab_chunk_max = Some(if n <= 1024 { n << 10 } else { n });
                self.classes_only(sp);
            }
            "no_modern" => {
                // As memcached: no slab mover, no LRU maintainer, no LRU crawler (a later
                // `-o lru_crawler` turns the crawler back on), and connections over -c
                // wait in the backlog (no_maxconns_fast).
                self.cfg.maxconns_fast = false;
                self.cfg.lru_maintainer = false;
                self.cfg.slab_reassign = false;
                self.cfg.lru_crawler = false;
            }
            "slab_reassign" | "no_slab_reassign" => {
                self.cfg.slab_reassign = key == "slab_reassign";
                self.ignored(sp);
            }
            "no_hashexpand"
            | "no_slab_automove"
            | "inline_ascii_resp"
            | "no_inline_ascii_resp"
            | "modern"
            | "no_chunked_items"
            | "drop_privileges"
            | "no_drop_privileges"
            | "relaxed_privileges"
            | "sock_cookie_id"
            | "proxy_arg"
            | "proxy_uring"
            | "proxy_memprofile" => self.ignored(sp),
            "track_sizes" => self.cfg.track_sizes = true,
            "resp_obj_mem_limit" => self.note(format!(
                "ignoring memcached option {sp}: deprecated in memcached, no meaning in kvcached"
            )),

            // TLS settings (they take effect with -Z).
            "ssl_chain_cert" => self.cfg.ssl.settings.chain_cert = Some(need(val)?.into()),
            "ssl_key" => self.cfg.ssl.settings.key = Some(need(val)?.into()),
            "ssl_ca_cert" => self.cfg.ssl.settings.ca_cert = Some(need(val)?.into()),
            "ssl_ciphers" => {
                let list = need(val)?;
                kvtls::server::check_ciphers(&list)?;
                self.cfg.ssl.settings.ciphers = Some(list);
            }
            "ssl_verify_mode" => {
                let n = int_in::<u32>(sp, &need(val)?, 0, 3, "0, 1, 2 or 3")?;
                self.cfg.ssl.settings.verify_mode =
                    kvtls::server::VerifyMode::from_number(n).unwrap_or_default();
            }
            "ssl_min_version" => {
                let n = int_in::<u32>(sp, &need(val)?, 0, 3, "0, 1, 2 or 3")?;
                self.cfg.ssl.settings.min_version = match n {
                    3 => kvtls::server::MinVersion::Tls13,
                    2 => kvtls::server::MinVersion::Tls12,
                    _ => {
                        return Err(format!(
                            "{sp}={n}: kvcached speaks TLS 1.2 and 1.3 only (2 or 3); TLS 1.0 \
                             and 1.1 are obsolete (RFC 8996)"
                        ))
                    }
                };
            }
            "ssl_keyformat" => {
                self.cfg.ssl.settings.key_format = match int::<u32>(sp, &need(val)?, "1 or 2")? {
                    1 => kvtls::server::KeyFormat::Pem,
                    2 => kvtls::server::KeyFormat::Der,
                    _ => {
                        return Err(format!(
                            "{sp}: kvcached reads PEM (1) or DER (2) keys; OpenSSL engines \
                             (3) are not supported"
                        ))
                    }
                };
            }
            "ssl_wbuf_size" => {
                let kib = int_in::<u32>(sp, &need(val)?, 1, 1 << 20, "a size in KiB, 1 or more")?;
                self.cfg.ssl.wbuf_size = kib as usize * 1024;
            }
            "ssl_session_cache" => self.cfg.ssl.settings.session_cache = true,
            "ssl_kernel_tls" => {
                // What memcached says when its OpenSSL cannot offload to the kernel.
                return Err(format!(
                    "{sp}: Kernel TLS offload is not available (kvcached's TLS is rustls, \
                     in user space)"
                ));
            }
            "ssl_handshake_timeout" => {
                let secs: u64 = int(sp, &need(val)?, "a number of seconds (0: never)")?;
                self.cfg.ssl.handshake_timeout = (secs > 0).then(|| Duration::from_secs(secs));
            }

            "proxy_config" => {
                return Err(format!(
                    "{sp}: kvcached has no proxy mode (it is a cache server only)"
                ))
            }

            // extstore: kvcached keeps every item in memory.
            "ext_path" => {
                ext_path(&need(val)?)?;
                self.ext_path = true;
                self.ext_ignored(sp);
            }
            "ext_wbuf_size" => {
                let mb: u64 = int::<u32>(sp, &need(val)?, "a number of megabytes")?.into();
                self.ext_wbuf_size = mb << 20;
                self.ext_ignored(sp);
            }
            "ext_page_size" | "ext_threads" | "ext_io_depth" | "ext_item_size" | "ext_item_age"
            | "ext_low_ttl" | "ext_recache_rate" | "ext_compact_under" | "ext_drop_under"
            | "ext_max_sleep" => {
                int::<u32>(sp, &need(val)?, "a whole number")?;
                self.ext_ignored(sp);
            }
            "ext_drop_unread" => self.ext_ignored(sp),

            _ => {
                return Err(format!(
                    "unknown -o suboption \"{item}\" (kvcached -h lists them)"
                ))
            }
        }
        Ok(())
    }

    fn ext_ignored(&mut self, sp: &str) {
        self.note(format!(
            "ignoring memcached option {sp}: kvcached has no external storage (extstore); \
             all items stay in memory"
        ));
    }

    /// The checks memcached makes after reading every option.
    fn finish(mut self) -> Result<Action, String> {
        let cfg = &mut self.cfg;
        if let Some(n) = self.napi_ids {
            if n as usize > cfg.threads {
                return Err(format!(
                    "-N {n}: there cannot be more NAPI ids than worker threads ({})",
                    cfg.threads
                ));
            }
        }
        if cfg.item_size_max < ITEM_SIZE_MIN {
            return Err(format!(
                "-I: the item size limit cannot be less than {ITEM_SIZE_MIN} bytes"
            ));
        }
        if cfg.item_size_max > ITEM_SIZE_MAX {
            return Err("-I: the item size limit cannot be more than 1 gigabyte (1g)".into());
        }
        if let MemoryLimit::Fixed(bytes) = cfg.memory_limit {
            if cfg.item_size_max > bytes / 2 {
                return Err(format!(
                    "-I: the item size limit ({} bytes) cannot be more than half the memory \
                     limit (-m {} megabytes)",
                    cfg.item_size_max,
                    bytes >> 20
                ));
            }
        }
        let chunk_max = self.slab_chunk_max.unwrap_or(512 << 10);
        if self.slab_chunk_max.is_some() {
            if chunk_max > cfg.item_size_max {
                return Err(format!(
                    "-o slab_chunk_max ({chunk_max} bytes) cannot be more than -I ({} bytes)",
                    cfg.item_size_max
                ));
            }
            if cfg.item_size_max % chunk_max != 0 || (1 << 20) % chunk_max != 0 {
                return Err(format!(
                    "-o slab_chunk_max ({chunk_max} bytes) must divide -I ({} bytes) and \
                     1 megabyte evenly",
                    cfg.item_size_max
                ));
            }
        }
        let mut listed: Option<Vec<u32>> = None;
        if let Some(sizes) = &self.slab_sizes {
            let mut last = 0u64;
            let mut count = 0;
            for s in sizes.split('-').filter(|s| !s.is_empty()) {
                let size: u64 = int("-o slab_sizes", s, "sizes in bytes separated by -")?;
                listed
                    .get_or_insert_with(Vec::new)
                    .push(u32::try_from(size).unwrap_or(u32::MAX));
                if size < u64::from(self.slab_min_size) || size > chunk_max as u64 {
                    return Err(format!("-o slab_sizes: size {s} is out of range"));
                }
                if size <= last + 8 {
                    return Err(format!(
                        "-o slab_sizes: size {s} must be more than 8 bytes larger than the one \
                         before it"
                    ));
                }
                last = size;
                count += 1;
                if count >= 63 {
                    return Err("-o slab_sizes: too many sizes (at most 62)".into());
                }
            }
            if count == 0 {
                return Err("-o slab_sizes needs a list of sizes".into());
            }
        }
        cfg.slab_classes = super::config::slab_classes(
            self.slab_min_size,
            self.slab_growth_factor,
            u32::try_from(chunk_max).unwrap_or(u32::MAX),
            listed.as_deref(),
        );
        if self.hot_lru_pct + self.warm_lru_pct > 80 {
            return Err(format!(
                "-o hot_lru_pct ({}) plus warm_lru_pct ({}) cannot be more than 80",
                self.hot_lru_pct, self.warm_lru_pct
            ));
        }
        if self.temporary_ttl && !cfg.lru_maintainer {
            return Err(
                "-o temporary_ttl needs the LRU maintainer (drop no_lru_maintainer \
                        and no_modern)"
                    .into(),
            );
        }
        if self.ext_path && cfg.item_size_max as u64 > self.ext_wbuf_size {
            return Err(format!(
                "-I ({} bytes) cannot be more than -o ext_wbuf_size ({} bytes)",
                cfg.item_size_max, self.ext_wbuf_size
            ));
        }
        for l in &cfg.listeners {
            let prefix = match l.tls {
                ListenTls::Default => continue,
                ListenTls::Plain => "notls",
                ListenTls::NoPeer => "btls",
                ListenTls::Peer => "mtls",
            };
            if !cfg.ssl.enabled {
                return Err(format!(
                    "-l: the '{prefix}' prefix is valid only when TLS is enabled (-Z)"
                ));
            }
        }
        if cfg.ssl.enabled {
            if cfg.tcp_port == 0 && cfg.listeners.iter().all(|l| l.port.is_none()) {
                return Err("-Z: You cannot enable SSL without a TCP port.".into());
            }
            if cfg.unix_socket.is_some() {
                return Err(
                    "-Z: TLS is for TCP listeners; -s (a unix socket) turns TCP off".into(),
                );
            }
            if cfg.ssl.settings.chain_cert.is_none() {
                return Err(
                    "-Z: TLS needs the server's certificate: -o ssl_chain_cert=FILE \
                            (and ssl_key=FILE unless the key is in the same file)"
                        .into(),
                );
            }
            if cfg.ssl.settings.verify_mode == kvtls::server::VerifyMode::Request
                && cfg.ssl.settings.ca_cert.is_none()
            {
                self.notes.push(
                    "-o ssl_verify_mode=1 without ssl_ca_cert: client certificates are asked \
                     for but none can be verified; clients without one are served, clients \
                     that send one are refused (as memcached does)"
                        .into(),
                );
            }
        }
        // -S with -Y: as in memcached, -S makes the default protocol binary, then -Y makes it
        // ASCII (and refuses an explicit -B binary), so SASL applies to no listener.
        if cfg.sasl && cfg.auth_file.is_some() && !self.protocol_specified {
            self.notes.push(
                "-S with -Y: every listener speaks the ASCII protocol and authenticates with \
                 the -Y file, as in memcached; SASL (binary protocol) is not served"
                    .into(),
            );
        }
        if cfg.sasl {
            if !self.protocol_specified {
                cfg.protocol = ProtocolChoice::Binary;
            } else if cfg.protocol != ProtocolChoice::Binary {
                return Err("-S: SASL authentication needs -B binary; \
                            the ASCII protocol cannot be allowed with SASL"
                    .into());
            }
            if cfg.udp_port != 0 {
                return Err("-S: UDP cannot be used with SASL authentication (-U 0)".into());
            }
        }
        if cfg.auth_file.is_some() {
            if !self.protocol_specified {
                cfg.protocol = ProtocolChoice::Ascii;
            } else if cfg.protocol != ProtocolChoice::Ascii {
                return Err("-Y: ASCII authentication needs -B ascii; \
                            the binary protocol cannot be allowed with it"
                    .into());
            }
        }
        // Like memcached: -U alone moves the TCP port too.
        if self.udp_specified && cfg.udp_port != 0 && !self.tcp_specified {
            cfg.tcp_port = cfg.udp_port;
        }
        if cfg.auth_file.is_some() && cfg.udp_port != 0 {
            return Err("-Y: UDP cannot be used with ASCII authentication (-U 0)".into());
        }
        if self.ext_path && cfg.udp_port != 0 {
            return Err("-o ext_path: UDP cannot be used with extstore (-U 0)".into());
        }
        Ok(Action::Run {
            config: Box::new(self.cfg),
            notes: self.notes,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Help and license.
// ---------------------------------------------------------------------------------------

/// The `-h` text.
pub fn help_text() -> String {
    let d = Config::default();
    let version = env!("CARGO_PKG_VERSION");
    let mb = match d.memory_limit {
        MemoryLimit::Fixed(b) => (b >> 20).to_string(),
        MemoryLimit::Auto => "auto".into(),
    };
    format!(
        "\
kvcached {version}: a memcached-compatible cache server.
Takes memcached 1.6's options. Usage: kvcached [options]

Network
  -p, --port=PORT             TCP port; 0 turns TCP off (default {tcp_port})
  -U, --udp-port=PORT         UDP port; 0 turns UDP off (default {udp_port}). Given
                              without -p, TCP uses this port too.
  -l, --listen=ADDR[,ADDR]    where to listen; repeatable (default {listen}).
                              ADDR is HOST, HOST:PORT, [IPv6]:PORT, or * for every
                              interface, optionally prefixed by proto[ascii|binary|
                              negotiating]: and tag[NAME]:
  -s, --unix-socket=FILE      listen on this unix socket instead of TCP and UDP
  -a, --unix-mask=MODE        permissions of the unix socket, octal (default {mask:o})
  -b, --listen-backlog=N      listen queue length (default {backlog})
  -c, --conn-limit=N          most simultaneous connections (default {conns})
  -B, --protocol=NAME         auto, ascii or binary (default auto)

TLS (as memcached's; rustls, no OpenSSL)
  -Z, --enable-ssl            serve TLS on every TCP listener; an -l entry prefixed
                              notls: stays plaintext, btls: never asks for a client
                              certificate, mtls: requires one
  -o ssl_chain_cert=FILE      the server's certificate chain (PEM)
  -o ssl_key=FILE             its private key (default: in the chain file)
  -o ssl_keyformat=N          1 PEM (default), 2 DER
  -o ssl_ca_cert=FILE         CAs (PEM) client certificates must chain to
  -o ssl_verify_mode=N        client certificates: 0 none (default), 1 request,
                              2 require, 3 once (as 2)
  -o ssl_min_version=N        2 TLS 1.2 (default), 3 TLS 1.3
  -o ssl_ciphers=LIST         OpenSSL cipher list restricting the TLS 1.2 suites
  -o ssl_session_cache        allow session resumption (server-side cache)
  -o ssl_wbuf_size=KB         most reply bytes encrypted per write (default 16)
  The refresh_certs command re-reads the files without a restart.

Memory and items
  -m, --memory-limit=MB       item memory in megabytes, or auto to size to the memory
                              the machine or container has (default {mb})
  -I, --max-item-size=SIZE    largest item, with k, m or g suffix; at least 1k, at most
                              1g and half of -m (default 1m)
  -M, --disable-evictions     answer writes with an error when memory is full instead
                              of evicting
  -C, --disable-cas           do not assign CAS values
  -e, --memory-file=FILE      memory file for restartable cache (as memcached's -e)

Commands
  -A, --enable-shutdown       allow the shutdown command
  -F, --disable-flush-all     refuse flush_all
  -X, --disable-dumping       refuse stats cachedump, stats detail and lru_crawler
                              metadump and mgdump
  -D CHAR                     count stats detail per key prefix from the start; a key's
                              prefix ends at its first CHAR (default :)
  -W, --disable-watch         refuse the watch command
  -S, --enable-sasl           require SASL authentication (binary protocol)
  -Y, --auth-file=FILE        require ASCII authentication; FILE holds user:password lines

Threads
  -t, --threads=N             worker threads (default: the number of CPUs the process
                              may run on)
  -R, --max-reqs-per-event=N  requests served on one connection before others get a
                              turn (default {reqs})

Process
  -d, --daemon                run in the background
  -P, --pidfile=FILE          write the process id to FILE
  -u, --user=USER             run as USER when started as root (required as root;
                              -u root keeps root)
  -k, --lock-memory           lock all memory into RAM (mlockall)
  -r, --enable-coredumps      raise the core file size limit as far as allowed
  -v, --verbose               log errors and warnings; -vv also commands, -vvv more
  -h, --help                  print this help and exit
  -i, --license               print the license and exit
  -V, --version               print the version and exit
      --config-file=FILE      read options from FILE, one per line, as Debian's
                              /etc/memcached.conf (# comments; -d and logfile lines
                              skipped); options after it override it (kvcached's own)

Replication (kvcached's own)
      --replica-of=HOST:PORT  follow that master as a read-only replica (at run time:
                              `replicaof HOST PORT`, `replicaof no one` to promote)
      --replica-auth=FILE     credentials for a master with -Y: the first line of FILE,
                              `user:password` (as in a -Y file)
      --replica-auth-mech=ascii|sasl
                              how to present them: ASCII auth (a -Y master, the default)
                              or SASL PLAIN, pulling over the binary protocol (a -S master)
      --min-replicas=N        refuse writes (SERVER_ERROR not enough good replicas) unless
                              N replicas are in sync (default 0: off)
      --min-replicas-max-lag=SECONDS
                              in sync: pulled within, and lagging at most, SECONDS
                              (default 10)
      --repl-backlog=MEGABYTES
                              the most memory (within -m) a master keeps in segments whose
                              items all expired or died, for replicas that have not read
                              them yet, so they continue without a full sync (default: a
                              sixteenth of -m)
      --replica-serve-stale=yes|no
                              a replica whose link is down or that is in a full sync
                              answers reads (yes, default) or refuses them (no)
      --replica-tls           connect to the master over TLS, checking its certificate
      --replica-tls-ca=FILE   the CA (PEM) the master's certificate chains to
      --replica-tls-cert=FILE, --replica-tls-key=FILE
                              a client certificate and key, for a master that requires
                              one (ssl_verify_mode 2 or 3, an mtls: listener)
      --replica-tls-name=NAME the name the master's certificate must carry (default:
                              the host in --replica-of)

Extended options: -o, --extended=OPT[,OPT=VALUE...]
  idle_timeout=SECONDS        close connections idle this long; 0 never (default 0)
  maxconns_fast               over -c, answer a new connection with an error and close
                              it (default); no_maxconns_fast (or no_modern) leaves it
                              queued instead
  read_buf_mem_limit=MB       memory all connections' read and reply buffers may hold
                              together; 0 no limit (default 0). Over it a connection that
                              needs more is closed (read_buf_oom, response_obj_oom) and a
                              get answers SERVER_ERROR out of memory writing get response
  watcher_logbuf_size=KB      bytes each watch connection's buffer holds (default 256)
  lru_crawler                 reclaim expired items in the background (default);
                              no_lru_crawler (or no_modern) leaves them until a request
                              finds them; `lru_crawler enable|disable` at run time
  evict_size_factor=N         eviction keeps an item up to N times the mean item's
                              size once it was read, a larger one only if read more
                              often: more items, more hits, fewer bytes hit (kvcached's
                              own; default 4; 0 treats all sizes alike)
  metrics=HOST:PORT           serve Prometheus metrics at http://HOST:PORT/metrics, in
                              memcached_exporter's names plus kvcached_* (off by default)
  engine=log                  the item store: the segmented log (the only one;
                              accepted so older command lines still work)
  log_format=text|json        log lines on stderr as text (default; no timestamps under
                              systemd, whose journal adds them) or as one JSON object per
                              line (kvcached's own). -v, -vv, -vvv add info, debug and
                              trace events, as memcached's -v levels
  warm_restart_ignore_bad_file
                              with -e: when the file cannot be used (damaged, cut short,
                              another format or other -C/-I), move it to FILE.bad and
                              start with an empty cache instead of exiting (kvcached's own)
  ssl_handshake_timeout=SECONDS
                              with -Z: close a connection whose TLS handshake has not
                              completed after SECONDS (kvcached's own; default 10; 0 never)
  reuseport                   a listening socket per worker thread (SO_REUSEPORT, each
                              with SO_INCOMING_CPU set to its worker's CPU) instead of
                              one socket all workers accept from (kvcached's own)
  cpu_affinity                pin worker N to the Nth CPU the process may run on
                              (kvcached's own)
  io=auto|uring|epoll         the I/O runtime of TCP and unix connections: io_uring
                              (one system call per turn of a worker's loop), epoll, or
                              io_uring where the kernel allows it (kvcached's own;
                              default auto, or $KVCACHED_IO)
  io_sqpoll[=MS]              under io_uring, a kernel thread per worker takes its
                              submissions (SQPOLL), sleeping after MS milliseconds
                              without any (default 10); it spends a CPU while busy, so
                              it pays only where cores are spare (kvcached's own;
                              default off, or $KVCACHED_IO_SQPOLL milliseconds)
  io_sqpoll_cpus=LIST         with io_sqpoll (on if not given): worker N's polling
                              thread on the (N mod len)-th CPU of LIST (2:3 or 4-7), e.g.
                              cores spare beside cpu_affinity's (kvcached's own)
  debug_clock                 TESTS ONLY: enable the debugtime command, which moves the
                              server clock. Never use in production.

Slab sizing (kvcached keeps items in a log, not in slabs; these set only the size
classes that stats items, stats slabs, me and lru_crawler metadump report):
  -f, --slab-growth-factor, -n, --slab-min-size, and the -o options slab_chunk_max,
  slab_sizes; -o track_sizes turns on stats sizes

Accepted for compatibility and ignored (logged at startup):
  -L, --enable-largepages,
  -N, --napi-ids, and the -o options hashpower,
  no_hashexpand, tail_repair_time, hash_algorithm, slab_reassign, slab_automove,
  slab_automove_ratio, slab_automove_window, slab_automove_freeratio,
  no_chunked_items, lru_crawler_sleep, lru_crawler_tocrawl,
  lru_maintainer, hot_lru_pct, warm_lru_pct, hot_max_factor, warm_max_factor,
  temporary_ttl, worker_logbuf_size, resp_obj_mem_limit, inline_ascii_resp, modern,
  drop_privileges, relaxed_privileges, sock_cookie_id, proxy_arg, proxy_uring,
  proxy_memprofile and ext_* (extstore settings); most have a no_ form. Their values
  are still checked as memcached checks them.

Refused: the option that starts memcached's proxy (no proxy mode), -o ssl_kernel_tls
  (TLS is in user space), ssl_min_version 0 and 1 (TLS 1.0 and 1.1), ssl_keyformat 3
  (OpenSSL engines).
",
        tcp_port = d.tcp_port,
        udp_port = d.udp_port,
        listen = d.listen.join(","),
        mask = d.unix_mask,
        backlog = d.backlog,
        conns = d.max_connections,
        reqs = d.reqs_per_event,
    )
}

/// The `-i` text.
pub fn license_text() -> String {
    format!(
        "kvcached {}\n\n\
         kvcached is distributed under the BSD 3-Clause license. It is a new program,\n\
         written in Rust, that follows memcached's protocols and command line; it\n\
         contains no memcached or libevent code.\n\
         memcached is Copyright (c) 2003, Danga Interactive, Inc., under a BSD license.\n",
        env!("CARGO_PKG_VERSION")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse_strs(args: &[&str]) -> Result<Action, String> {
        parse(args.iter().map(OsString::from))
    }

    fn run(args: &[&str]) -> Result<(Config, Vec<String>), String> {
        match parse_strs(args)? {
            Action::Run { config, notes } => Ok((*config, notes)),
            other => panic!("{args:?}: expected Run, got {other:?}"),
        }
    }

    fn cfg(args: &[&str]) -> Config {
        run(args)
            .unwrap_or_else(|e| panic!("{args:?} rejected: {e}"))
            .0
    }

    type Check = fn(&Config) -> bool;

    #[test]
    fn no_arguments_give_the_defaults() {
        let (c, notes) = run(&[]).unwrap();
        assert_eq!(c, Config::default());
        assert!(notes.is_empty());
        assert_eq!(c.listen, vec!["127.0.0.1"]);
        assert_eq!(c.listeners, vec![ListenAddr::host("127.0.0.1")]);
    }

    #[test]
    fn accepted_command_lines() {
        let mb = |n: usize| MemoryLimit::Fixed(n << 20);
        let rows: &[(&[&str], Check)] = &[
            // -p: separate, attached, long with = and with a separate value, prefix.
            (&["-p", "11212"], |c| c.tcp_port == 11212),
            (&["-o", "engine=log"], |c| *c == Config::default()),
            (&["-p11212"], |c| c.tcp_port == 11212),
            (&["--port=11212"], |c| c.tcp_port == 11212),
            (&["--port", "11212"], |c| c.tcp_port == 11212),
            (&["--po=11212"], |c| c.tcp_port == 11212),
            (&["-p", " 11212"], |c| c.tcp_port == 11212),
            (&["-p", "+11212"], |c| c.tcp_port == 11212),
            (&["-p", "0"], |c| c.tcp_port == 0),
            (&["-p", "65535"], |c| c.tcp_port == 65535),
            (&["-p", "1", "-p", "2"], |c| c.tcp_port == 2),
            // kvcached's eviction size factor.
            (&["-o", "evict_size_factor=0"], |c| c.evict_size_factor == 0),
            (&["-o", "evict_size_factor=64"], |c| {
                c.evict_size_factor == 64
            }),
            (&[], |c| c.evict_size_factor == 4),
            // io_uring's submission-queue polling thread, with its idle time.
            (&["-o", "io_sqpoll"], |c| c.io_sqpoll == Some(10)),
            (&["-o", "io_sqpoll=250"], |c| c.io_sqpoll == Some(250)),
            (&["-o", "io_sqpoll_cpus=2:4-6"], |c| {
                c.io_sqpoll == Some(10) && c.io_sqpoll_cpus == [2, 4, 5, 6]
            }),
            (&["-o", "io_sqpoll=250,io_sqpoll_cpus=1"], |c| {
                c.io_sqpoll == Some(250) && c.io_sqpoll_cpus == [1]
            }),
            // -U, and -U alone moving the TCP port too.
            (&["-U", "11300"], |c| {
                c.udp_port == 11300 && c.tcp_port == 11300
            }),
            (&["-U", "11300", "-p", "11211"], |c| {
                c.udp_port == 11300 && c.tcp_port == 11211
            }),
            (&["-p", "11211", "-U", "11300"], |c| {
                c.udp_port == 11300 && c.tcp_port == 11211
            }),
            (&["-U", "0"], |c| c.udp_port == 0 && c.tcp_port == 11211),
            (&["--udp-port=5"], |c| c.udp_port == 5),
            // -s, -a.
            (&["-s", "/tmp/k.sock"], |c| {
                c.unix_socket.as_deref() == Some(std::path::Path::new("/tmp/k.sock"))
            }),
            (&["--unix-socket=/tmp/k.sock", "-a", "0755"], |c| {
                c.unix_socket.is_some() && c.unix_mask == 0o755
            }),
            (&["-a", "700"], |c| c.unix_mask == 0o700),
            (&["-a0"], |c| c.unix_mask == 0),
            (&["--unix-mask", "777"], |c| c.unix_mask == 0o777),
            // -A -M -C -F -X -W -k -r -d -S.
            (&["-A"], |c| c.enable_shutdown),
            (&["--enable-shutdown"], |c| c.enable_shutdown),
            (&["-M"], |c| c.no_evict),
            (&["--disable-evictions"], |c| c.no_evict),
            (&["-C"], |c| !c.use_cas),
            (&["--disable-cas"], |c| !c.use_cas),
            (&["-F"], |c| !c.flush_enabled),
            (&["--disable-flush-all"], |c| !c.flush_enabled),
            (&["-X"], |c| !c.dump_enabled),
            (&["--disable-dumping"], |c| !c.dump_enabled),
            (&["-W"], |c| !c.watch_enabled),
            (&["--disable-watch"], |c| !c.watch_enabled),
            (&["-k"], |c| c.lock_memory),
            (&["--lock-memory"], |c| c.lock_memory),
            (&["-r"], |c| c.max_core_file),
            (&["--enable-coredumps"], |c| c.max_core_file),
            (&["-d"], |c| c.daemonize),
            (&["--daemon"], |c| c.daemonize),
            (&["-S"], |c| c.sasl && c.protocol == ProtocolChoice::Binary),
            (&["-S", "-B", "binary"], |c| c.sasl),
            (&["--enable-sasl"], |c| c.sasl),
            // Bundles.
            (&["-dv"], |c| c.daemonize && c.verbose == 1),
            (&["-vd"], |c| c.daemonize && c.verbose == 1),
            (&["-vv"], |c| c.verbose == 2),
            (&["-vvv"], |c| c.verbose == 3),
            (&["-v", "-v"], |c| c.verbose == 2),
            (&["-vvp11212"], |c| c.verbose == 2 && c.tcp_port == 11212),
            (&["-vp", "11212"], |c| c.verbose == 1 && c.tcp_port == 11212),
            (&["-dP/run/k.pid"], |c| {
                c.daemonize && c.pid_file.as_deref() == Some(std::path::Path::new("/run/k.pid"))
            }),
            (&["-MCAFk"], |c| {
                c.no_evict && !c.use_cas && c.enable_shutdown && !c.flush_enabled && c.lock_memory
            }),
            (&["--verbose"], |c| c.verbose == 1),
            (&["--verbose=2"], |c| c.verbose == 1),
            (&["--verbose", "--verb"], |c| c.verbose == 2),
            // -m.
            (&["-m", "128"], |c| {
                c.memory_limit == MemoryLimit::Fixed(128 << 20)
            }),
            (&["-m128"], |c| {
                c.memory_limit == MemoryLimit::Fixed(128 << 20)
            }),
            (&["-m", "128m"], |c| {
                c.memory_limit == MemoryLimit::Fixed(128 << 20)
            }),
            (&["-m", "128M"], |c| {
                c.memory_limit == MemoryLimit::Fixed(128 << 20)
            }),
            (&["--memory-limit=4096"], |c| {
                c.memory_limit == MemoryLimit::Fixed(4096 << 20)
            }),
            (&["-m", "auto"], |c| c.memory_limit == MemoryLimit::Auto),
            (&["-m", "auto", "-I", "1g"], |c| c.item_size_max == 1 << 30),
            (&["-m", "2"], |c| {
                c.memory_limit == MemoryLimit::Fixed(2 << 20)
            }),
            // -I: bytes and suffixes; at most half of -m; 1k to 1g.
            (&["-I", "2m"], |c| c.item_size_max == 2 << 20),
            (&["-I", "2M"], |c| c.item_size_max == 2 << 20),
            (&["-I2m"], |c| c.item_size_max == 2 << 20),
            (&["-I", "512k"], |c| c.item_size_max == 512 << 10),
            (&["-I", "512K"], |c| c.item_size_max == 512 << 10),
            (&["-I", "1k"], |c| c.item_size_max == 1024),
            (&["-I", "1024"], |c| c.item_size_max == 1024),
            (&["-I", "5000"], |c| c.item_size_max == 5000),
            (&["--max-item-size=32m"], |c| c.item_size_max == 32 << 20),
            (&["-I", "1g", "-m", "2048"], |c| c.item_size_max == 1 << 30),
            (&["-I", "1G", "-m", "2048"], |c| c.item_size_max == 1 << 30),
            (&["-I", "1024m", "-m", "2048"], |c| {
                c.item_size_max == 1 << 30
            }),
            (&["-m", "2", "-I", "1m"], |c| c.item_size_max == 1 << 20),
            (&["-m", "1", "-I", "512k"], |c| c.item_size_max == 512 << 10),
            // -c -t -R -b -B.
            (&["-c", "4096"], |c| c.max_connections == 4096),
            (&["--conn-limit=1"], |c| c.max_connections == 1),
            (&["-t", "1"], |c| c.threads == 1),
            (&["-t", "64"], |c| c.threads == 64),
            (&["--threads", "8"], |c| c.threads == 8),
            (&["-R", "5"], |c| c.reqs_per_event == 5),
            (&["--max-reqs-per-event=100"], |c| c.reqs_per_event == 100),
            (&["-b", "0"], |c| c.backlog == 0),
            (&["-b", "4096"], |c| c.backlog == 4096),
            (&["--listen-backlog=16"], |c| c.backlog == 16),
            (&["-B", "ascii"], |c| c.protocol == ProtocolChoice::Ascii),
            (&["-B", "binary"], |c| c.protocol == ProtocolChoice::Binary),
            (&["-B", "auto"], |c| c.protocol == ProtocolChoice::Auto),
            (&["--protocol=ascii"], |c| {
                c.protocol == ProtocolChoice::Ascii
            }),
            // -u -P -Y -e.
            (&["-u", "memcache"], |c| {
                c.user.as_deref() == Some("memcache")
            }),
            (&["--user=nobody"], |c| c.user.as_deref() == Some("nobody")),
            (&["-unobody"], |c| c.user.as_deref() == Some("nobody")),
            (&["-P", "/run/k.pid"], |c| c.pid_file.is_some()),
            (&["--pidfile=/run/k.pid"], |c| c.pid_file.is_some()),
            (&["-Y", "/etc/kv.auth"], |c| {
                c.auth_file.is_some() && c.protocol == ProtocolChoice::Ascii
            }),
            (&["-Y", "/etc/kv.auth", "-B", "ascii"], |c| {
                c.auth_file.is_some()
            }),
            (&["--auth-file=/etc/kv.auth"], |c| c.auth_file.is_some()),
            // -S with -Y: ASCII with the -Y file, as memcached ends up.
            (&["-S", "-Y", "/etc/kv.auth"], |c| {
                c.sasl && c.auth_file.is_some() && c.protocol == ProtocolChoice::Ascii
            }),
            (&["-Y", "/etc/kv.auth", "-S"], |c| {
                c.sasl && c.auth_file.is_some() && c.protocol == ProtocolChoice::Ascii
            }),
            (&["-e", "/dev/shm/kv"], |c| {
                c.memory_file.as_deref() == Some(std::path::Path::new("/dev/shm/kv"))
            }),
            (&["--memory-file=/dev/shm/kv"], |c| c.memory_file.is_some()),
            (&["-e", "/x", "-o", "warm_restart_ignore_bad_file"], |c| {
                c.warm_ignore_bad_file
            }),
            (&["-e", "/x"], |c| !c.warm_ignore_bad_file),
            // -o: implemented ones, lists, repeats, trailing comma, empty list.
            (&["-o", "idle_timeout=30"], |c| {
                c.idle_timeout == Some(Duration::from_secs(30))
            }),
            (&["-o", "idle_timeout=0"], |c| c.idle_timeout.is_none()),
            (&["-oidle_timeout=7"], |c| {
                c.idle_timeout == Some(Duration::from_secs(7))
            }),
            (&["--extended=idle_timeout=7"], |c| {
                c.idle_timeout == Some(Duration::from_secs(7))
            }),
            (&["--extended", "idle_timeout=7,debug_clock"], |c| {
                c.idle_timeout == Some(Duration::from_secs(7)) && c.debug_clock
            }),
            (&["-o", "debug_clock"], |c| c.debug_clock),
            (&["-o", "no_maxconns_fast"], |c| !c.maxconns_fast),
            (&["-o", "no_maxconns_fast,maxconns_fast"], |c| {
                c.maxconns_fast
            }),
            (&["-o", "no_maxconns_fast", "-o", "maxconns_fast"], |c| {
                c.maxconns_fast
            }),
            (&["-o", "modern,"], |c| c.maxconns_fast),
            (&["-o", ""], |c| c.maxconns_fast),
            (&["-o", " modern"], |c| c.maxconns_fast),
            (&["-o", "modern=1"], |c| c.maxconns_fast),
            (&["-o", "hashpower=12", "-o", "hashpower=32"], |c| {
                c.maxconns_fast
            }),
            (&["-o", "hot_lru_pct=40,warm_lru_pct=40"], |c| {
                c.maxconns_fast
            }),
            (&["-o", "slab_chunk_max=16", "-I", "1m"], |c| {
                c.item_size_max == 1 << 20
            }),
            (&["-o", "slab_sizes=100-200-300"], |c| c.maxconns_fast),
            (&["-o", "temporary_ttl=10"], |c| c.maxconns_fast),
            (&["-o", "lru_maintainer,temporary_ttl=10"], |c| {
                c.maxconns_fast
            }),
            (
                &["-o", "ext_path=/mnt/ext:64g,ext_wbuf_size=8", "-I", "8m"],
                |c| c.item_size_max == 8 << 20,
            ),
            (&["-o", "ext_path=/mnt/ext:1T:compact"], |c| c.maxconns_fast),
            // -l: lists, repeats, ports, IPv6, wildcards, prefixes.
            (&["-l", "0.0.0.0"], |c| {
                c.listen == ["0.0.0.0"] && c.listeners == [ListenAddr::host("0.0.0.0")]
            }),
            (&["-l", "127.0.0.1,::1"], |c| {
                c.listen == ["127.0.0.1", "::1"] && c.listeners[1] == ListenAddr::host("::1")
            }),
            (&["-l", "127.0.0.1", "-l", "::1"], |c| {
                c.listen == ["127.0.0.1", "::1"]
            }),
            (&["-l", "10.0.0.1;10.0.0.2"], |c| {
                c.listen == ["10.0.0.1", "10.0.0.2"]
            }),
            (&["-l", "10.0.0.1,,10.0.0.2,"], |c| c.listen.len() == 2),
            (&["-l", "10.0.0.1", "-l", "10.0.0.1"], |c| {
                c.listen == ["10.0.0.1"]
            }),
            (&["-l10.0.0.1"], |c| c.listen == ["10.0.0.1"]),
            (&["--listen=10.0.0.1"], |c| c.listen == ["10.0.0.1"]),
            (&["-l", "127.0.0.1:11300"], |c| {
                c.listeners[0].host.as_deref() == Some("127.0.0.1")
                    && c.listeners[0].port == Some(11300)
            }),
            (&["-l", "[::1]:11300"], |c| {
                c.listeners[0].host.as_deref() == Some("::1") && c.listeners[0].port == Some(11300)
            }),
            (&["-l", "[::1]"], |c| {
                c.listeners[0] == ListenAddr::host("::1")
            }),
            (&["-l", "fe80::1:2"], |c| {
                c.listeners[0] == ListenAddr::host("fe80::1:2")
            }),
            (&["-l", "*"], |c| c.listeners[0].host.is_none()),
            (&["-l", "*:11300"], |c| {
                c.listeners[0].host.is_none() && c.listeners[0].port == Some(11300)
            }),
            (&["-l", "localhost"], |c| {
                c.listeners[0] == ListenAddr::host("localhost")
            }),
            (&["-l", "proto[ascii]:127.0.0.1:11300"], |c| {
                c.listeners[0].protocol == Some(ProtocolChoice::Ascii)
                    && c.listeners[0].port == Some(11300)
            }),
            (
                &[
                    "-l",
                    "proto[binary]:tag[svc]:127.0.0.1:1,proto[negotiating]:tag_tools_:[::1]:2",
                ],
                |c| {
                    let (a, b) = (&c.listeners[0], &c.listeners[1]);
                    a.protocol == Some(ProtocolChoice::Binary)
                        && a.tag.as_deref() == Some("svc")
                        && a.port == Some(1)
                        && b.protocol == Some(ProtocolChoice::Auto)
                        && b.tag.as_deref() == Some("tools")
                        && b.host.as_deref() == Some("::1")
                        && b.port == Some(2)
                },
            ),
            (&["-Y", "/a", "-l", "proto[negotiating]:127.0.0.1"], |c| {
                c.listeners[0].protocol == Some(ProtocolChoice::Ascii)
            }),
            // Options permuted past operands, and "--".
            (&["extra", "-p", "5"], |c| c.tcp_port == 5),
            (&["-p", "5", "--", "-p", "6"], |c| c.tcp_port == 5),
            (&["-"], |c| c.tcp_port == 11211),
            // A value that looks like an option is still the value.
            (&["-u", "-p"], |c| c.user.as_deref() == Some("-p")),
            (&["--user", "--port"], |c| {
                c.user.as_deref() == Some("--port")
            }),
        ];
        let _ = mb;
        for (args, check) in rows {
            let c = cfg(args);
            assert!(check(&c), "{args:?} gave {c:#?}");
        }
    }

    #[test]
    fn rejected_command_lines() {
        let rows: &[(&[&str], &str)] = &[
            // getopt errors.
            (&["-Q"], "unknown option '-Q'"),
            (&["-vQ"], "unknown option '-Q'"),
            (&["--bogus"], "unknown option '--bogus'"),
            (&["--napi_ids=1"], "unknown option"),
            (&["--mem=1"], "ambiguous"),
            (&["--dis"], "ambiguous"),
            (&["--ver"], "ambiguous"),
            (&["--daemon=1"], "does not take a value"),
            (&["--port"], "--port needs a value"),
            // The retired engine is named as such; an unknown one as unknown.
            (&["-o", "engine=hashmap"], "that engine was retired"),
            (&["-o", "engine=btree"], "unknown engine"),
            (&["-o", "io_sqpoll=0"], "1 to 60000"),
            (&["-o", "io_sqpoll=60001"], "1 to 60000"),
            (&["-o", "io_sqpoll_cpus=3-1"], "CPU numbers or ranges"),
            (&["-o", "io_sqpoll_cpus=4096"], "CPU numbers or ranges"),
            (&["-o", "io_sqpoll_cpus=0-4095"], "CPU numbers or ranges"),
            (&["-o", "io_sqpoll_cpus=a"], "CPU numbers or ranges"),
            (&["-p"], "-p needs a value"),
            (&["-vp"], "-p needs a value"),
            // Numbers.
            (&["-p", "abc"], "for -p"),
            (&["-p", ""], "for -p"),
            (&["-p", "70000"], "0-65535"),
            (&["-p", "-1"], "for -p"),
            (&["-p", "12abc"], "for -p"),
            (&["--port=x"], "for --port"),
            (&["-U", "65536"], "for -U"),
            (&["-c", "0"], "greater than 0"),
            (&["-c", "abc"], "greater than 0"),
            (&["-c", "-5"], "greater than 0"),
            (&["-t", "0"], "greater than 0"),
            (&["-t", "abc"], "greater than 0"),
            (&["--threads=0"], "--threads"),
            (&["-R", "0"], "greater than 0"),
            (&["-b", "abc"], "backlog"),
            (&["-b", "-1"], "backlog"),
            (&["-a", "999"], "octal"),
            (&["-a", "abc"], "octal"),
            (&["-a", "1777"], "octal"),
            (&["-B", "foo"], "auto, ascii or binary"),
            (&["-B", "ASCII"], "auto, ascii or binary"),
            // -m and -I.
            (&["-m", "0"], "megabytes"),
            (&["-m", "abc"], "megabytes"),
            (&["-m", "-5"], "megabytes"),
            (&["-m", "1g"], "megabytes"),
            (&["-m", "64k"], "megabytes"),
            (&["-m", "99999999999999999999"], "for -m"),
            (&["-I", "1023"], "less than 1024"),
            (&["-I", "abc"], "size in bytes"),
            (&["-I", "1.5m"], "size in bytes"),
            (&["-I", "2t"], "size in bytes"),
            (&["-I", "k"], "size in bytes"),
            (&["-I", "5g"], "more than 1 gigabyte"),
            (&["-I", "2g", "-m", "auto"], "more than 1 gigabyte"),
            (&["-I", "1g"], "half the memory limit"),
            (&["-m", "1", "-I", "1m"], "half the memory limit"),
            (&["-I", "33m"], "half the memory limit"),
            // Flags that need something.
            (&["-D", ""], "delimiter"),
            (&["-u", ""], "user name"),
            (&["-s", ""], "file name"),
            (&["-P", ""], "file name"),
            (&["-l", ""], "needs an address"),
            (&["-l", ",,"], "needs an address"),
            (&["-f", "1.0"], "greater than 1"),
            (&["-f", "abc"], "greater than 1"),
            (&["-n", "0"], "greater than 0"),
            (&["-N", "0"], "greater than 0"),
            (&["-N", "3", "-t", "2"], "NAPI"),
            // -l entries.
            (&["-l", "127.0.0.1:abc"], "not a port"),
            (&["-l", "127.0.0.1:99999"], "not a port"),
            (&["-l", "[::1"], "closing ]"),
            (&["-l", "[::1]x"], "after the ]"),
            (&["-l", ":11211"], "no host"),
            (&["-l", "notls:127.0.0.1"], "only when TLS is enabled"),
            (&["-l", "mtls:127.0.0.1"], "only when TLS is enabled"),
            (&["-l", "proto[foo]:127.0.0.1"], "unknown protocol"),
            (&["-l", "proto[proxy]:127.0.0.1"], "proxy"),
            (&["-l", "proto[ascii:127.0.0.1"], "closing ]"),
            (&["-l", "tag[toolongtag]:127.0.0.1"], "1 to 8"),
            (&["-l", "tag[]:127.0.0.1"], "1 to 8"),
            (&["-Y", "/a", "-l", "proto[binary]:127.0.0.1"], "-Y"),
            // TLS, proxy.
            (&["-Z"], "ssl_chain_cert"),
            (&["--enable-ssl"], "ssl_chain_cert"),
            (
                &["-Z", "-o", "ssl_chain_cert=/c", "-s", "/tmp/s"],
                "unix socket",
            ),
            (
                &["-Z", "-o", "ssl_chain_cert=/c", "-p", "0"],
                "without a TCP port",
            ),
            (&["-o", "ssl_min_version=1"], "TLS 1.2 and 1.3 only"),
            (&["-o", "ssl_min_version=4"], "0, 1, 2 or 3"),
            (&["-o", "ssl_keyformat=3"], "engines"),
            (
                &["-o", "ssl_kernel_tls"],
                "Kernel TLS offload is not available",
            ),
            (
                &["-o", "ssl_ciphers=RC4-MD5"],
                "Error setting the provided cipher(s)",
            ),
            (&["-o", "ssl_wbuf_size=0"], "KiB"),
            (&["-o", "proxy_config=/etc/proxy.lua"], "proxy"),
            // SASL and ASCII auth interplay.
            (&["-S", "-B", "ascii"], "SASL"),
            (&["-S", "-B", "auto"], "SASL"),
            (&["-S", "-U", "11211"], "UDP"),
            (&["-Y", "/a", "-B", "binary"], "-Y"),
            (&["-Y", "/a", "-U", "5"], "UDP"),
            (
                &["-S", "-Y", "/a", "-B", "binary"],
                "-Y: ASCII authentication needs -B ascii",
            ),
            (&["-S", "-Y", "/a", "-B", "ascii"], "-S: SASL"),
            (&["-S", "-Y", "/a", "-U", "5"], "-S: UDP"),
            // -o.
            (&["-o", "badopt"], "unknown -o suboption \"badopt\""),
            (&["-o", "MODERN"], "unknown -o suboption"),
            (&["-o", "modern,,hashpower=20"], "unknown -o suboption \"\""),
            (&["-o", ",modern"], "unknown -o suboption \"\""),
            (&["-o", "idle_timeout"], "needs a value"),
            (&["-o", "idle_timeout=abc"], "seconds"),
            (&["-o", "idle_timeout=-5"], "seconds"),
            (&["-o", "hashpower"], "needs a value"),
            (&["-o", "hashpower=5"], "12 to 32"),
            (&["-o", "hashpower=33"], "12 to 32"),
            (&["-o", "tail_repair_time=5"], "10 or more"),
            (&["-o", "hash_algorithm=md5"], "jenkins"),
            (&["-o", "slab_automove=3"], "0, 1 or 2"),
            (&["-o", "slab_automove_ratio=0"], "ratio"),
            (&["-o", "slab_automove_ratio=1.5"], "ratio"),
            (&["-o", "slab_automove_window=2"], "3 to 1800"),
            (&["-o", "slab_automove_window=1801"], "3 to 1800"),
            (&["-o", "lru_crawler_sleep=1000001"], "microseconds"),
            (&["-o", "lru_crawler_tocrawl=x"], "whole number"),
            (&["-o", "hot_lru_pct=0"], "1 to 79"),
            (&["-o", "warm_lru_pct=80"], "1 to 79"),
            (&["-o", "hot_lru_pct=50"], "cannot be more than 80"),
            (
                &["-o", "hot_lru_pct=41,warm_lru_pct=40"],
                "cannot be more than 80",
            ),
            (&["-o", "hot_max_factor=0"], "greater than 0"),
            (&["-o", "warm_max_factor=x"], "greater than 0"),
            (
                &["-o", "no_lru_maintainer,temporary_ttl=10"],
                "LRU maintainer",
            ),
            (&["-o", "temporary_ttl=10,no_modern"], "LRU maintainer"),
            (&["-o", "slab_chunk_max=0"], "1 to 1024"),
            (&["-o", "slab_chunk_max=x"], "1 to 1024"),
            (&["-o", "slab_chunk_max=2000"], "evenly"),
            (
                &["-o", "slab_chunk_max=1024", "-I", "512k"],
                "cannot be more than -I",
            ),
            (&["-o", "slab_chunk_max=3"], "evenly"),
            (&["-o", "slab_sizes"], "needs a value"),
            (&["-o", "slab_sizes=300-200"], "larger"),
            (&["-o", "slab_sizes=100-104"], "larger"),
            (&["-o", "slab_sizes=10"], "out of range"),
            (&["-o", "slab_sizes=a-b"], "slab_sizes"),
            (&["-o", "slab_sizes=-"], "list of sizes"),
            (&["-o", "watcher_logbuf_size=x"], "whole number"),
            (&["-o", "read_buf_mem_limit=-1"], "whole number"),
            (&["-o", "evict_size_factor=65"], "0 to 64"),
            (&["-o", "evict_size_factor"], "needs a value"),
            (&["-o", "ssl_verify_mode=4"], "0, 1, 2 or 3"),
            (&["-o", "ssl_key"], "needs a value"),
            (&["-o", "ext_path=/mnt/ext"], "no size"),
            (&["-o", "ext_path=/mnt/ext:64"], "suffix"),
            (&["-o", "ext_path=/mnt/ext:64g:nope"], "bucket"),
            (&["-o", "ext_threads=abc"], "whole number"),
            (&["-o", "ext_path=/mnt/ext:1g", "-I", "8m"], "ext_wbuf_size"),
            (&["-o", "ext_path=/mnt/ext:1g", "-U", "5"], "UDP"),
        ];
        for (args, want) in rows {
            match run(args) {
                Ok((c, _)) => panic!("{args:?} accepted: {c:#?}"),
                Err(e) => assert!(e.contains(want), "{args:?}: {e:?} lacks {want:?}"),
            }
        }
    }

    #[test]
    fn d_sets_the_prefix_delimiter_and_starts_detail_stats() {
        let (c, notes) = run(&["-D/"]).unwrap();
        assert_eq!((c.prefix_delimiter, c.detail_enabled), (b'/', true));
        assert!(notes.is_empty(), "{notes:?}");
        let (c, _) = run(&["-D", "::x"]).unwrap();
        assert_eq!(c.prefix_delimiter, b':', "the first byte, as memcached");
        let (c, _) = run(&[]).unwrap();
        assert_eq!((c.prefix_delimiter, c.detail_enabled), (b':', false));
    }

    #[test]
    fn ignored_options_are_noted() {
        let rows: &[(&[&str], &str)] = &[
            (&["-f", "1.25"], "-f"),
            (&["--slab-growth-factor=1.08"], "--slab-growth-factor"),
            (&["-n", "48"], "-n"),
            (&["--slab-min-size", "96"], "--slab-min-size"),
            (&["-L"], "-L"),
            (&["--enable-largepages"], "--enable-largepages"),
            (&["-N", "1", "-t", "2"], "-N"),
            (&["--napi-ids=1", "-t", "2"], "--napi-ids"),
            (&["-o", "hashpower=20"], "-o hashpower"),
            (&["-o", "slab_reassign,slab_automove=1"], "-o slab_automove"),
            (&["-o", "modern"], "-o modern"),
            (&["-o", "relaxed_privileges"], "-o relaxed_privileges"),
            (&["-o", "resp_obj_mem_limit=5"], "deprecated"),
            (&["-o", "ext_path=/mnt/ext:64g"], "extstore"),
            (&["-t", "65"], "not recommended"),
            (&["stray"], "ignoring extra argument 'stray'"),
        ];
        for (args, want) in rows {
            let (_, notes) = run(args).unwrap_or_else(|e| panic!("{args:?} rejected: {e}"));
            assert!(
                notes.iter().any(|n| n.contains(want)),
                "{args:?}: notes {notes:?} lack {want:?}"
            );
        }
        // The same ignored option twice gives one note; implemented ones give none.
        let (_, notes) = run(&["-o", "modern", "-o", "modern", "-p", "1"]).unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
        let (_, notes) = run(&["-o", "idle_timeout=5,debug_clock", "-t", "64"]).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
    }

    /// Settings memcached accepts that do less than they seem to start with a warning.
    #[test]
    fn surprising_combinations_are_noted() {
        let rows: &[(&[&str], &str)] = &[
            (&["-S", "-Y", "/a"], "-S with -Y"),
            (
                &["-Z", "-o", "ssl_chain_cert=/c,ssl_verify_mode=1"],
                "ssl_verify_mode=1 without ssl_ca_cert",
            ),
        ];
        for (args, want) in rows {
            let (_, notes) = run(args).unwrap_or_else(|e| panic!("{args:?} rejected: {e}"));
            assert!(
                notes.iter().any(|n| n.contains(want)),
                "{args:?}: notes {notes:?} lack {want:?}"
            );
        }
        for args in [
            &["-Y", "/a"][..],
            &["-S"],
            &[
                "-Z",
                "-o",
                "ssl_chain_cert=/c,ssl_verify_mode=1,ssl_ca_cert=/ca",
            ],
        ] {
            let (_, notes) = run(args).unwrap_or_else(|e| panic!("{args:?} rejected: {e}"));
            assert!(notes.is_empty(), "{args:?}: {notes:?}");
        }
    }

    /// Every suboption memcached 1.6 knows (1.6.18 and the newest release), with a value
    /// it accepts, is accepted.
    #[test]
    fn every_memcached_suboption_is_accepted() {
        let all = [
            "maxconns_fast",
            "no_maxconns_fast",
            "hashpower=16",
            "no_hashexpand",
            "slab_reassign",
            "no_slab_reassign",
            "slab_automove",
            "slab_automove=2",
            "no_slab_automove",
            "slab_automove_ratio=0.8",
            "slab_automove_window=30",
            "slab_automove_freeratio=0.01",
            "tail_repair_time=60",
            "hash_algorithm=xxh3",
            "lru_crawler",
            "no_lru_crawler",
            "lru_crawler_sleep=100",
            "lru_crawler_tocrawl=0",
            "lru_maintainer",
            "no_lru_maintainer",
            "lru_maintainer",
            "hot_lru_pct=20",
            "warm_lru_pct=40",
            "hot_max_factor=0.2",
            "warm_max_factor=2.0",
            "temporary_ttl=61",
            "idle_timeout=0",
            "watcher_logbuf_size=256",
            "worker_logbuf_size=64",
            "slab_sizes=96-192-384",
            "slab_chunk_max=512",
            "track_sizes",
            "inline_ascii_resp",
            "no_inline_ascii_resp",
            "modern",
            "no_chunked_items",
            "drop_privileges",
            "no_drop_privileges",
            "resp_obj_mem_limit=1",
            "read_buf_mem_limit=0",
            "relaxed_privileges",
            "sock_cookie_id=1",
            "ssl_chain_cert=/c",
            "ssl_key=/k",
            "ssl_verify_mode=0",
            "ssl_keyformat=1",
            "ssl_ciphers=ALL",
            "ssl_ca_cert=/ca",
            "ssl_wbuf_size=16",
            "ssl_session_cache",
            "ssl_min_version=2",
            "ssl_min_version=3",
            "ssl_handshake_timeout=5",
            "proxy_arg=/x",
            "proxy_uring",
            "proxy_memprofile",
            "ext_page_size=64",
            "ext_wbuf_size=4",
            "ext_threads=1",
            "ext_io_depth=1",
            "ext_path=/e:1g",
            "ext_item_size=512",
            "ext_item_age=0",
            "ext_low_ttl=0",
            "ext_drop_unread",
            "ext_recache_rate=2000",
            "ext_compact_under=1",
            "ext_drop_under=1",
            "ext_max_sleep=1000000",
            "ext_max_frag=0.8",
            "debug_clock",
        ];
        for sub in all {
            run(&["-o", sub]).unwrap_or_else(|e| panic!("-o {sub} rejected: {e}"));
        }
        run(&["-o", &all.join(",")]).unwrap_or_else(|e| panic!("all at once rejected: {e}"));
        // no_modern turns the LRU maintainer off, which temporary_ttl needs.
        run(&["-o", "no_modern"]).unwrap();
    }

    #[test]
    fn tls_options_and_listener_prefixes() {
        let c = cfg(&[
            "-Z",
            "-o",
            "ssl_chain_cert=/c.pem,ssl_key=/k.pem,ssl_ca_cert=/ca.pem,ssl_verify_mode=3",
            "-o",
            "ssl_min_version=3,ssl_session_cache,ssl_wbuf_size=8,ssl_keyformat=2",
            "-o",
            "ssl_ciphers=ECDHE-RSA-AES128-GCM-SHA256,ssl_handshake_timeout=0",
            "-l",
            "notls:127.0.0.1:1,btls:127.0.0.1:2,mtls:127.0.0.1:3,127.0.0.1",
            "--replica-tls-ca",
            "/ca.pem",
            "--replica-tls-name",
            "master.example",
        ]);
        let s = &c.ssl;
        assert!(s.enabled);
        assert_eq!(s.settings.chain_cert.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(s.settings.key.as_deref(), Some(Path::new("/k.pem")));
        assert_eq!(s.settings.ca_cert.as_deref(), Some(Path::new("/ca.pem")));
        assert_eq!(s.settings.verify_mode, kvtls::server::VerifyMode::Once);
        assert_eq!(s.settings.min_version, kvtls::server::MinVersion::Tls13);
        assert_eq!(s.settings.key_format, kvtls::server::KeyFormat::Der);
        assert!(s.settings.session_cache);
        assert_eq!(s.wbuf_size, 8 * 1024);
        assert_eq!(s.handshake_timeout, None);
        let tls: Vec<_> = c.listeners.iter().map(|l| (l.port, l.tls)).collect();
        assert_eq!(
            tls,
            [
                (Some(1), ListenTls::Plain),
                (Some(2), ListenTls::NoPeer),
                (Some(3), ListenTls::Peer),
                (None, ListenTls::Default)
            ]
        );
        let r = c.replica_tls.expect("replica TLS");
        assert_eq!(r.ca.as_deref(), Some(Path::new("/ca.pem")));
        assert_eq!(r.server_name.as_deref(), Some("master.example"));
        assert!(cfg(&[]).replica_tls.is_none());
    }

    /// Every long option of memcached's table is spelled the same way.
    #[test]
    fn every_long_option_is_known() {
        for o in OPTIONS.iter().filter(|o| !o.long.is_empty()) {
            let flag = format!("--{}", o.long);
            let value = match o.short {
                b'a' => "700",
                b'm' => "64",
                b'c' | b't' | b'R' | b'b' | b'p' | b'U' => "4",
                b'f' => "1.25",
                b'n' => "48",
                b'N' => "1",
                b'B' => "ascii",
                b'I' => "1m",
                b'o' => "modern",
                b'l' => "127.0.0.1",
                REPLICA_OF => "127.0.0.1:11211",
                REPLICA_AUTH => "/etc/kvcached/replica-auth",
                MIN_REPLICAS | MIN_REPLICAS_MAX_LAG | REPL_BACKLOG => "1",
                REPLICA_SERVE_STALE => "no",
                REPLICA_AUTH_MECH => "sasl",
                REPLICA_TLS_CA | REPLICA_TLS_CERT | REPLICA_TLS_KEY => "/etc/kvcached/x.pem",
                _ => "x",
            };
            let mut args = vec![flag.clone()];
            if o.arg == HasArg::Required {
                args.push(value.to_string());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match (o.short, parse_strs(&args)) {
                // -Z alone: no certificate to serve.
                (b'Z', Err(e)) => assert!(e.contains("ssl_chain_cert"), "{e}"),
                (b'h' | b'i', Ok(Action::Help(_))) | (b'V', Ok(Action::Version)) => {}
                (_, Ok(Action::Run { .. })) => {}
                (_, other) => panic!("{flag}: {other:?}"),
            }
            assert_eq!(short_spec(o.short).unwrap().long, o.long);
        }
    }

    #[test]
    fn repl_backlog_is_megabytes() {
        assert_eq!(cfg(&[]).repl_backlog, 0);
        assert_eq!(cfg(&["--repl-backlog=32"]).repl_backlog, 32 << 20);
        assert_eq!(cfg(&["--repl-backlog", "1"]).repl_backlog, 1 << 20);
        for bad in ["0", "-1", "x", "16777217"] {
            let e = parse_strs(&["--repl-backlog", bad]).unwrap_err();
            assert!(e.contains("megabytes"), "{bad}: {e}");
        }
    }

    #[test]
    fn help_license_and_version_stop_parsing_in_order() {
        match parse_strs(&["-h"]).unwrap() {
            Action::Help(t) => {
                assert!(t.contains("--port"));
                assert!(t.contains("idle_timeout"));
                assert!(t.contains("debug_clock"));
                assert!(t.contains("ignored"));
                assert!(t.contains("--replica-of"));
                // Tools (memcached's own test suite among them) learn whether the proxy is
                // built in by looking for its option's name in -h.
                assert!(!t.contains("proxy_config"));
                for o in OPTIONS.iter().filter(|o| o.short.is_ascii_alphabetic()) {
                    assert!(
                        t.contains(&format!("-{},", o.short as char))
                            || t.contains(&format!("-{} ", o.short as char))
                            || t.contains(&format!("-{}\n", o.short as char)),
                        "help lacks -{}",
                        o.short as char
                    );
                }
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse_strs(&["--help"]).unwrap(), Action::Help(_)));
        assert!(matches!(parse_strs(&["-V"]).unwrap(), Action::Version));
        assert!(matches!(
            parse_strs(&["--version"]).unwrap(),
            Action::Version
        ));
        match parse_strs(&["-i"]).unwrap() {
            Action::Help(t) => assert!(t.contains("BSD")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_strs(&["--license"]).unwrap(),
            Action::Help(_)
        ));
        // Bundled, and after other options.
        assert!(matches!(parse_strs(&["-vh"]).unwrap(), Action::Help(_)));
        assert!(matches!(
            parse_strs(&["-p", "1", "-V"]).unwrap(),
            Action::Version
        ));
        // First one wins; what follows is not looked at; what precedes is.
        assert!(matches!(
            parse_strs(&["-V", "-h"]).unwrap(),
            Action::Version
        ));
        assert!(matches!(
            parse_strs(&["-h", "-t", "0"]).unwrap(),
            Action::Help(_)
        ));
        assert!(matches!(
            parse_strs(&["-h", "-Q"]).unwrap(),
            Action::Help(_)
        ));
        // Checks that memcached makes after the option loop do not apply to -h.
        assert!(matches!(
            parse_strs(&["-I", "5g", "-h"]).unwrap(),
            Action::Help(_)
        ));
        assert!(parse_strs(&["-t", "0", "-h"]).is_err());
        assert!(parse_strs(&["-Q", "-V"]).is_err());
    }

    #[test]
    fn paths_need_not_be_utf8() {
        use std::os::unix::ffi::OsStringExt;
        let raw = OsString::from_vec(b"/tmp/k\xff.sock".to_vec());
        let args = vec![
            OsString::from("-s"),
            raw.clone(),
            OsString::from("-P"),
            raw.clone(),
        ];
        match parse(args).unwrap() {
            Action::Run { config, .. } => {
                assert_eq!(
                    config.unix_socket.as_deref().map(|p| p.as_os_str()),
                    Some(raw.as_os_str())
                );
                assert!(config.pid_file.is_some());
            }
            other => panic!("{other:?}"),
        }
        let bad = vec![OsString::from("-u"), OsString::from_vec(b"\xff".to_vec())];
        assert!(parse(bad).unwrap_err().contains("UTF-8"));
        let bad = vec![OsString::from_vec(b"-\xff".to_vec())];
        assert!(parse(bad).unwrap_err().contains("unknown option"));
    }

    #[test]
    fn listen_addr_resolution() {
        let c = cfg(&["-l", "127.0.0.1,[::1]:7,*:8", "-p", "9"]);
        let a = c.listeners[0].socket_addrs(c.tcp_port).unwrap();
        assert_eq!(a, vec!["127.0.0.1:9".parse().unwrap()]);
        let a = c.listeners[1].socket_addrs(c.tcp_port).unwrap();
        assert_eq!(a, vec!["[::1]:7".parse().unwrap()]);
        let a = c.listeners[2].socket_addrs(c.tcp_port).unwrap();
        assert_eq!(
            a,
            vec!["0.0.0.0:8".parse().unwrap(), "[::]:8".parse().unwrap()]
        );
        assert_eq!(c.listeners[0].port_or(11211), 11211);
    }
}
