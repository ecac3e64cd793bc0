//! The Rust `memcache` crate (crates.io) against the real binary, over every transport the crate
//! offers without TLS: TCP text and binary, unix socket text and binary, UDP binary, and UDP
//! text for the commands the crate can send over UDP; plus its text-protocol authentication.
//!
//! Each round trip runs against Debian's memcached first and then kvcached, and every call's
//! result (as the crate reports it, errors included) must be the same. CAS tokens are compared
//! only as present or absent, and the version string only as answered (the two servers report
//! different versions). The crate's own quirks (a text `add` that was not stored returns
//! `Ok(())`, a binary `incr` on a missing key creates it with 0, ...) are what both servers give.
//!
//! What the crate cannot do over UDP, and is therefore not run there: multi-key gets (it never
//! sends the request), and, with the text protocol, `get`, `incr`/`decr` and `flush_all` (it
//! writes them without flushing its datagram buffer). In the UDP text round trip those go
//! through a TCP text client of the same server.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use common::{Kind, Server, TIMEOUT};
use memcache::{Client, MemcacheError, ToMemcacheValue};

/// A value with client flags (the crate's own value types always send flags 0).
struct Flagged<'a> {
    data: &'a [u8],
    flags: u32,
}

impl<W: Write> ToMemcacheValue<W> for Flagged<'_> {
    fn get_flags(&self) -> u32 {
        self.flags
    }

    fn get_length(&self) -> usize {
        self.data.len()
    }

    fn write_to(&self, stream: &mut W) -> std::io::Result<()> {
        stream.write_all(self.data)
    }
}

fn flagged(data: &[u8], flags: u32) -> Flagged<'_> {
    Flagged { data, flags }
}

/// A client for `url` with every wait bounded.
fn connect(url: &str) -> Result<Client, MemcacheError> {
    Client::builder()
        .add_server(url)?
        .with_read_timeout(TIMEOUT)
        .with_write_timeout(TIMEOUT)
        .with_connection_timeout(TIMEOUT)
        .build()
}

fn client(url: &str) -> Client {
    connect(url).unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// Results of one round trip, one line per call.
#[derive(Default)]
struct Log(Vec<String>);

impl Log {
    fn rec<T: std::fmt::Debug>(&mut self, what: &str, r: &Result<T, MemcacheError>) {
        self.0.push(format!("{what} -> {r:?}"));
    }
}

/// `(value, flags)` as text, for a readable log.
fn text(v: Option<(Vec<u8>, u32)>) -> Option<(String, u32)> {
    v.map(|(d, f)| (String::from_utf8_lossy(&d).into_owned(), f))
}

fn get(c: &Client, key: &str) -> Result<Option<(String, u32)>, MemcacheError> {
    c.get::<(Vec<u8>, u32)>(key).map(text)
}

/// What a `gets`-style read shows: the value, its flags, and whether a CAS token came back.
type WithCas = (String, u32, bool);

/// A `gets`-style read, and the CAS token to use next (0 if none).
fn get_cas(c: &Client, key: &str) -> (Result<Option<WithCas>, MemcacheError>, u64) {
    match c.get::<(Vec<u8>, u32, Option<u64>)>(key) {
        Ok(Some((d, f, cas))) => (
            Ok(Some((
                String::from_utf8_lossy(&d).into_owned(),
                f,
                cas.is_some(),
            ))),
            cas.unwrap_or(0),
        ),
        Ok(None) => (Ok(None), 0),
        Err(e) => (Err(e), 0),
    }
}

fn multi_get(c: &Client, keys: &[&str]) -> Result<BTreeMap<String, (String, u32)>, MemcacheError> {
    c.gets::<(Vec<u8>, u32)>(keys).map(|m| {
        m.into_iter()
            .map(|(k, (d, f))| (k, (String::from_utf8_lossy(&d).into_owned(), f)))
            .collect()
    })
}

/// What a transport can do with this crate.
struct Caps {
    /// Multi-key gets (not over UDP).
    multi_get: bool,
    /// The large value's size: 500 KB over streams; over UDP a request must fit one datagram.
    big: usize,
}

/// The round trip. Stores, cas, delete, touch and version go through `w`; reads, counters and
/// flush through `r` (the same client except for the UDP text round trip).
fn round_trip(w: &Client, r: &Client, caps: &Caps) -> Vec<String> {
    let mut log = Log::default();

    let v = w.version();
    assert!(
        matches!(&v, Ok(list) if list.len() == 1 && list[0].1.starts_with("1.")),
        "version: {v:?}"
    );
    log.rec("version answers", &v.map(|_| ()));

    log.rec("get missing", &get(r, "missing"));

    // set/get with flags
    log.rec("set k1 flags 42", &w.set("k1", flagged(b"hello", 42), 0));
    log.rec("get k1", &get(r, "k1"));
    log.rec("get k1 as String", &r.get::<String>("k1"));
    log.rec("set k1 flags 7", &w.set("k1", flagged(b"hello", 7), 0));
    log.rec("get k1", &get(r, "k1"));
    log.rec("set empty", &w.set("empty", flagged(b"", 0xffff_ffff), 0));
    log.rec("get empty", &get(r, "empty"));

    // add
    log.rec("add k1 (exists)", &w.add("k1", "other", 0));
    log.rec("get k1", &get(r, "k1"));
    log.rec("add k2 (new)", &w.add("k2", flagged(b"new", 3), 0));
    log.rec("get k2", &get(r, "k2"));

    // replace
    log.rec("replace k3 (missing)", &w.replace("k3", "x", 0));
    log.rec("get k3", &get(r, "k3"));
    log.rec("replace k2", &w.replace("k2", flagged(b"replaced", 9), 0));
    log.rec("get k2", &get(r, "k2"));

    // append/prepend (flags are kept)
    log.rec("append k1", &w.append("k1", " world"));
    log.rec("prepend k1", &w.prepend("k1", ">> "));
    log.rec("get k1", &get(r, "k1"));
    log.rec("append missing", &w.append("nokey", "a"));
    log.rec("prepend missing", &w.prepend("nokey", "p"));
    log.rec("get nokey", &get(r, "nokey"));

    // cas, wrong and right, and on a missing key
    let (g, cas) = get_cas(r, "k1");
    log.rec("gets k1", &g);
    log.rec(
        "cas k1 wrong",
        &w.cas("k1", "wrong", 0, cas.wrapping_add(1000)),
    );
    log.rec("get k1", &get(r, "k1"));
    log.rec("cas k1 right", &w.cas("k1", flagged(b"swapped", 5), 0, cas));
    log.rec("get k1", &get(r, "k1"));
    log.rec("cas k1 stale", &w.cas("k1", "stale", 0, cas));
    log.rec("get k1", &get(r, "k1"));
    log.rec("cas missing", &w.cas("casnokey", "x", 0, cas));
    log.rec("get casnokey", &get(r, "casnokey"));

    // delete
    log.rec("delete k2", &w.delete("k2"));
    log.rec("delete k2 again", &w.delete("k2"));
    log.rec("get k2", &get(r, "k2"));

    // incr/decr
    log.rec("set n 10", &w.set("n", 10u64, 0));
    log.rec("incr n 5", &r.increment("n", 5));
    log.rec("decr n 3", &r.decrement("n", 3));
    log.rec("decr n 100 (floors at 0)", &r.decrement("n", 100));
    log.rec("get n (memcached pads a shrunk counter)", &get(r, "n"));
    log.rec("set max", &w.set("max", u64::MAX, 0));
    log.rec("incr max 2 (wraps)", &r.increment("max", 2));
    log.rec("incr missing", &r.increment("cnt-missing", 1));
    log.rec("get cnt-missing", &get(r, "cnt-missing"));
    log.rec("decr missing", &r.decrement("cnt-missing2", 1));
    log.rec("get cnt-missing2", &get(r, "cnt-missing2"));
    log.rec("set word", &w.set("word", "abc", 0));
    log.rec("incr non-numeric", &r.increment("word", 1));
    log.rec("get word", &get(r, "word"));

    // touch
    log.rec("touch k1", &w.touch("k1", 3600));
    log.rec("touch missing", &w.touch("touch-missing", 3600));
    log.rec("get k1", &get(r, "k1"));

    // gets of several keys
    if caps.multi_get {
        log.rec("set m1", &w.set("m1", flagged(b"one", 1), 0));
        log.rec("set m2", &w.set("m2", flagged(b"two", 2), 0));
        log.rec("set m3", &w.set("m3", "three", 0));
        log.rec(
            "gets m1 m2 missing m3",
            &multi_get(r, &["m1", "m2", "missing", "m3"]),
        );
        log.rec("gets missing only", &multi_get(r, &["missing", "nokey"]));
        let with_cas = r
            .gets::<(Vec<u8>, u32, Option<u64>)>(&["m1", "m3"])
            .map(|m| {
                m.into_iter()
                    .map(|(k, (d, f, c))| (k, (d.len(), f, c.is_some())))
                    .collect::<BTreeMap<_, _>>()
            });
        log.rec("gets m1 m3 with cas", &with_cas);
    }

    // a large value
    let big: Vec<u8> = (0..caps.big).map(|i| (i * 7 % 251) as u8).collect();
    log.rec("set big", &w.set("big", flagged(&big, 11), 0));
    let got = r.get::<(Vec<u8>, u32)>("big");
    assert!(
        matches!(&got, Ok(Some((d, 11))) if *d == big),
        "big value did not come back whole: {:?}",
        got.as_ref().map(|o| o.as_ref().map(|(d, f)| (d.len(), *f)))
    );
    log.rec(
        "get big (length, flags)",
        &got.map(|o| o.map(|(d, f)| (d.len(), f))),
    );

    // flush
    log.rec("flush", &r.flush());
    log.rec("get k1 after flush", &get(r, "k1"));
    log.rec("get big after flush", &get(r, "big"));
    if caps.multi_get {
        log.rec("gets after flush", &multi_get(r, &["m1", "m2", "m3"]));
    }
    log.rec("add k1 after flush", &w.add("k1", "again", 0));
    log.rec("get k1", &get(r, "k1"));

    log.0
}

/// Sanity checks on memcached's log, so that the comparison is not between two broken runs.
fn check_reference(log: &[String]) {
    for want in [
        "get k1 -> Ok(Some((\"hello\", 42)))",
        "get k1 -> Ok(Some((\">> hello world\", 7)))",
        "get k1 -> Ok(Some((\"swapped\", 5)))",
        "delete k2 -> Ok(true)",
        "delete k2 again -> Ok(false)",
        "incr n 5 -> Ok(15)",
        "touch k1 -> Ok(true)",
        "touch missing -> Ok(false)",
        "get k1 after flush -> Ok(None)",
    ] {
        assert!(
            log.iter().any(|l| l == want),
            "memcached's log lacks {want:?}:\n{}",
            log.join("\n")
        );
    }
}

/// Compare kvcached's log with memcached's, reporting the first calls that differ.
fn assert_same(transport: &str, memcached: &[String], kvcached: &[String]) {
    check_reference(memcached);
    let diffs: Vec<String> = memcached
        .iter()
        .zip(kvcached)
        .filter(|(m, k)| m != k)
        .map(|(m, k)| format!("  memcached: {m}\n  kvcached:  {k}"))
        .collect();
    assert!(
        diffs.is_empty() && memcached.len() == kvcached.len(),
        "{transport}: kvcached differs from memcached:\n{}\nfull kvcached log:\n{}",
        diffs.join("\n"),
        kvcached.join("\n")
    );
}

const STREAM: Caps = Caps {
    multi_get: true,
    big: 500 * 1024,
};

/// TCP round trip with the given `protocol=` query value.
fn tcp(kind: Kind, protocol: &str) -> Vec<String> {
    let server = Server::start_verified(kind, &[]);
    let c = client(&format!(
        "memcache://127.0.0.1:{}?protocol={protocol}&timeout=10",
        server.port
    ));
    round_trip(&c, &c, &STREAM)
}

#[test]
fn tcp_text_matches_memcached() {
    let memcached = tcp(Kind::Memcached, "ascii");
    let kvcached = tcp(Kind::Kvcached, "ascii");
    assert_same("tcp text", &memcached, &kvcached);
}

#[test]
fn tcp_binary_matches_memcached() {
    let memcached = tcp(Kind::Memcached, "binary");
    let kvcached = tcp(Kind::Kvcached, "binary");
    assert_same("tcp binary", &memcached, &kvcached);
}

/// A unix socket path unique to this process, server kind and protocol.
fn socket_path(kind: Kind, protocol: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "kvcached-rustclient-{}-{kind:?}-{protocol}.sock",
        std::process::id()
    ))
}

fn unix(kind: Kind, protocol: &str) -> Vec<String> {
    let path = socket_path(kind, protocol);
    let _server = Server::start_unix(kind, &path, &[]);
    let c = client(&format!(
        "memcache://{}?protocol={protocol}",
        path.to_str().expect("utf-8 path")
    ));
    round_trip(&c, &c, &STREAM)
}

#[test]
fn unix_text_matches_memcached() {
    let memcached = unix(Kind::Memcached, "ascii");
    let kvcached = unix(Kind::Kvcached, "ascii");
    assert_same("unix text", &memcached, &kvcached);
}

#[test]
fn unix_binary_matches_memcached() {
    let memcached = unix(Kind::Memcached, "binary");
    let kvcached = unix(Kind::Kvcached, "binary");
    assert_same("unix binary", &memcached, &kvcached);
}

const DATAGRAM: Caps = Caps {
    multi_get: false,
    // One request datagram; the reply spans several 1400-byte datagrams.
    big: 10 * 1024,
};

fn udp_binary(kind: Kind) -> Vec<String> {
    let (_server, port) = Server::start_udp(kind, &[]);
    let c = client(&format!("memcache+udp://127.0.0.1:{port}?protocol=binary"));
    round_trip(&c, &c, &DATAGRAM)
}

#[test]
fn udp_binary_matches_memcached() {
    let memcached = udp_binary(Kind::Memcached);
    let kvcached = udp_binary(Kind::Kvcached);
    assert_same("udp binary", &memcached, &kvcached);
}

fn udp_text(kind: Kind) -> Vec<String> {
    let (server, port) = Server::start_udp(kind, &[]);
    let w = client(&format!(
        "memcache://127.0.0.1:{port}?udp=true&protocol=ascii"
    ));
    let r = client(&format!(
        "memcache://127.0.0.1:{}?protocol=ascii&timeout=10",
        server.port
    ));
    round_trip(&w, &r, &DATAGRAM)
}

#[test]
fn udp_text_matches_memcached() {
    let memcached = udp_text(Kind::Memcached);
    let kvcached = udp_text(Kind::Kvcached);
    assert_same("udp text", &memcached, &kvcached);
}

/// The crate's text-protocol authentication (`memcache://user:password@host`, sent as
/// `set auth`) against `-Y`: the right password works, a wrong one is refused.
fn ascii_auth(kind: Kind) -> Vec<String> {
    let file = std::env::temp_dir().join(format!(
        "kvcached-rustclient-{}-{kind:?}.auth",
        std::process::id()
    ));
    std::fs::write(&file, "alice:secret\n").expect("write auth file");
    // Not start_verified: its `stats` probe is refused before authentication.
    let server = Server::start(kind, &["-Y", file.to_str().expect("utf-8 path")]);
    let mut log = Log::default();
    let c = client(&format!(
        "memcache://alice:secret@127.0.0.1:{}?protocol=ascii&timeout=10",
        server.port
    ));
    log.rec("set", &c.set("k", flagged(b"authed", 4), 0));
    log.rec("get", &get(&c, "k"));
    // The pool retries until its connection timeout, then fails with the last attempt's
    // error, or with none (`Error(None)`) if no attempt had ended yet, as on a busy machine:
    // then it is asked again with a longer timeout (up to the harness's).
    let mut wait = Duration::from_millis(500);
    let wrong = loop {
        let built = Client::builder()
            .add_server(format!(
                "memcache://alice:wrong@127.0.0.1:{}?protocol=ascii&timeout=10",
                server.port
            ))
            .map(|b| {
                b.with_read_timeout(TIMEOUT)
                    .with_write_timeout(TIMEOUT)
                    .with_connection_timeout(wait)
            })
            .and_then(|b| b.build());
        let no_attempt_ended = match &built {
            Err(MemcacheError::PoolError(e)) => format!("{e:?}") == "Error(None)",
            _ => false,
        };
        if !no_attempt_ended || wait >= TIMEOUT {
            break built;
        }
        wait = (wait * 2).min(TIMEOUT);
    };
    log.rec("connect with a wrong password", &wrong.map(|_| ()));
    let _ = std::fs::remove_file(&file);
    log.0
}

#[test]
fn ascii_auth_matches_memcached() {
    let memcached = ascii_auth(Kind::Memcached);
    assert_eq!(memcached[1], "get -> Ok(Some((\"authed\", 4)))");
    assert!(memcached[2].contains("Err("), "{memcached:?}");
    let kvcached = ascii_auth(Kind::Kvcached);
    assert_eq!(kvcached, memcached);
}
