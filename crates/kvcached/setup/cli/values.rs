//! The values of options: numbers as memcached reads them, sizes, CPU lists, listener
//! entries. Each returns the message an invalid value exits with, naming the option.

use std::ffi::OsStr;

use crate::setup::config::{ListenAddr, ListenTls, MemoryLimit, ProtocolChoice};

/// `value` as text, or an error naming the option.
pub(super) fn text<'v>(spelling: &str, value: &'v OsStr) -> Result<&'v str, String> {
    value
        .to_str()
        .ok_or_else(|| format!("the value of {spelling} is not valid UTF-8"))
}

pub(super) fn bad(spelling: &str, value: &str, expected: &str) -> String {
    format!("invalid value '{value}' for {spelling}: expected {expected}")
}

/// A decimal integer (an optional `+`, then digits), nothing else.
pub(super) fn int<T: std::str::FromStr>(
    spelling: &str,
    value: &str,
    expected: &str,
) -> Result<T, String> {
    let digits = value.strip_prefix('+').unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(spelling, value, expected));
    }
    digits.parse().map_err(|_| bad(spelling, value, expected))
}

/// A `-p` or `-U` port as memcached keeps it: 1-65535, 0 (that protocol off) or -1 (a port
/// the kernel picks; memcached binds port 0). memcached takes any number (`atoi`) and fails
/// later to bind other negative ones; kvcached refuses them here.
pub(super) fn port(spelling: &str, value: &str, proto: &str) -> Result<i32, String> {
    if value == "-1" {
        return Ok(-1);
    }
    let expected =
        format!("a port number 0-65535 (0 turns {proto} off, -1 lets the kernel pick one)");
    int_in(spelling, value, 0, 65535, &expected)
}

/// A decimal integer in `lo..=hi`.
pub(super) fn int_in<T>(
    spelling: &str,
    value: &str,
    lo: T,
    hi: T,
    expected: &str,
) -> Result<T, String>
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
pub(super) fn cpu_list(spelling: &str, value: &str) -> Result<Vec<u32>, String> {
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
pub(super) fn float(spelling: &str, value: &str, expected: &str) -> Result<f64, String> {
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
pub(super) fn item_size(spelling: &str, value: &str) -> Result<usize, String> {
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
pub(super) fn memory_limit(spelling: &str, value: &str) -> Result<MemoryLimit, String> {
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
pub(super) fn listen_entry(entry: &str, auth_file: bool) -> Result<ListenAddr, String> {
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
    // As in memcached, `:0` and `:-1` are a port the kernel picks.
    let port_of = |s: &str| -> Result<u16, String> {
        if s == "-1" {
            return Ok(0);
        }
        int(&format!("-l {entry}"), s, "a port number 0-65535")
            .map_err(|_| err(&format!("'{s}' is not a port number 0-65535 (or -1)")))
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

/// `-o ext_path`'s value: `PATH:SIZE[:BUCKET]`, SIZE a number with m, g, t or p; the
/// path and the size in bytes.
pub(super) fn ext_path(value: &str) -> Result<(std::path::PathBuf, u64), String> {
    let err = |why: &str| format!("invalid -o ext_path={value}: {why}");
    let mut parts = value.split(':').filter(|s| !s.is_empty());
    let path = parts.next().ok_or_else(|| err("no file"))?;
    let size = parts
        .next()
        .ok_or_else(|| err("no size (like ext_path=/mnt/extstore:64g)"))?;
    let (digits, unit) = size.split_at(size.len() - 1);
    let shift = match unit {
        "m" | "M" => 20,
        "g" | "G" => 30,
        "t" | "T" => 40,
        "p" | "P" => 50,
        _ => 0,
    };
    if shift == 0 || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err("the size must be a number with an m, g, t or p suffix"));
    }
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| err("the size is too large"))?;
    if let Some(bucket) = parts.next() {
        if !matches!(
            bucket,
            "compact" | "lowttl" | "chunked" | "default" | "coldcompact" | "old"
        ) {
            return Err(err(&format!("unknown bucket '{bucket}'")));
        }
    }
    Ok((std::path::PathBuf::from(path), bytes))
}
