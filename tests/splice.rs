//! Large values sent from the log (crates/kvcached/exec/splice.rs, crates/kvstore/src/log/lease.rs):
//! a value of 16 KiB or more is not copied into the connection's output but leased from the
//! engine and written with the reply's other bytes in one vectored write. These tests run
//! the real server with clients that read slowly, leave in the middle of a value, or do not
//! read at all, while the leased items are overwritten and their segments evicted and reused.

mod common;

use common::{Client, Server};
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const KEYS: usize = 24;
const TIMEOUT: Duration = Duration::from_secs(30);

/// Key `k`'s value at version `ver`: `"<k>:<ver>:"`, then one byte that depends on both.
fn body(k: usize, ver: usize) -> Vec<u8> {
    let len = 16 * 1024 + k * 4099;
    let mut v = format!("{k}:{ver}:").into_bytes();
    v.resize(len, b'a' + ((k * 7 + ver) % 26) as u8);
    v
}

/// Check a value read back: it must be exactly some version of key `k`.
fn check(k: usize, value: &[u8]) {
    let text = String::from_utf8_lossy(&value[..value.len().min(24)]).into_owned();
    let mut parts = text.splitn(3, ':');
    let (Some(got_k), Some(ver)) = (parts.next(), parts.next()) else {
        panic!("key {k}: no version prefix in {text:?}");
    };
    assert_eq!(got_k, k.to_string(), "key {k}: value of another key");
    let ver: usize = ver
        .parse()
        .unwrap_or_else(|_| panic!("key {k}: bad prefix {text:?}"));
    assert!(value == body(k, ver), "key {k} version {ver}: bytes differ");
}

/// A server with `-m MEGABYTES` holding version 0 of every key, a client that stored them,
/// and a `get` of all the keys.
fn loaded(megabytes: &str) -> (Server, Client, String) {
    let server = Server::kvcached(&["-m", megabytes]);
    let mut w = server.connect();
    for k in 0..KEYS {
        set(&mut w, &format!("k{k}"), &body(k, 0));
    }
    let keys: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    (server, w, format!("get {}\r\n", keys.join(" ")))
}

fn set(c: &mut Client, key: &str, value: &[u8]) {
    c.send(format!("set {key} 0 0 {}\r\n", value.len()).as_bytes());
    c.send(value);
    c.send(b"\r\n");
    assert_eq!(c.line(), "STORED\r\n");
}

fn stat_slabs(c: &mut Client, name: &str) -> u64 {
    c.stats("slabs")
        .into_iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in stats slabs"))
}

/// Poll `stats slabs` until `ok(leased_bytes)`, up to TIMEOUT; the last value seen.
fn wait_leased(c: &mut Client, ok: impl Fn(u64) -> bool) -> u64 {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let v = stat_slabs(c, "leased_bytes");
        if ok(v) || Instant::now() >= deadline {
            return v;
        }
        std::thread::yield_now();
    }
}

#[test]
fn large_values_arrive_intact_while_overwritten_and_evicted() {
    let (server, mut w, get_line) = loaded("16");
    let mut mon = server.connect();
    let filler = vec![b'f'; 100 * 1024];
    let mut r = server.connect();
    let mut hits = 0;
    for ver in 1..=4 {
        // The reader asks for every value many times over and reads nothing yet: the
        // server's output stops with values leased in it.
        let rounds = 12;
        for round in 0..rounds {
            r.send(get_line.as_bytes());
            for k in (round % 3..KEYS).step_by(3) {
                r.send(format!("mg k{k} v k\r\n").as_bytes());
            }
        }
        assert!(wait_leased(&mut mon, |v| v > 0) > 0, "nothing leased");
        // Meanwhile ten times the memory goes through the cache (the segments the values
        // were leased from are evicted and reused), and every key is written again.
        for j in 0..(10 * 16 * 1024 / 100) {
            set(&mut w, &format!("fill{ver}_{j}"), &filler);
        }
        for k in 0..KEYS {
            set(&mut w, &format!("k{k}"), &body(k, ver));
        }
        // Now read it all, slowly: every value is one version of its key, whole.
        for round in 0..rounds {
            loop {
                let line = r.line();
                if line == "END\r\n" {
                    break;
                }
                let f: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(f.first(), Some(&"VALUE"), "{line:?}");
                let k: usize = f[1][1..].parse().expect("key");
                let len: usize = f[3].parse().expect("length");
                let v = slow_exact(&mut r, len + 2);
                assert_eq!(&v[len..], b"\r\n");
                check(k, &v[..len]);
                hits += 1;
            }
            for _ in (round % 3..KEYS).step_by(3) {
                let line = r.line();
                if line.starts_with("EN") {
                    continue; // evicted meanwhile
                }
                let f: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(f.first(), Some(&"VA"), "{line:?}");
                let len: usize = f[1].parse().expect("length");
                let k: usize = f[2][2..].parse().expect("key");
                let v = slow_exact(&mut r, len + 2);
                assert_eq!(&v[len..], b"\r\n");
                check(k, &v[..len]);
                hits += 1;
            }
        }
    }
    assert!(hits > 0);
    assert_eq!(wait_leased(&mut mon, |v| v == 0), 0, "leases left behind");
}

/// Read `n` bytes a little at a time (a slow client: the server's write stops part way
/// through values).
fn slow_exact(c: &mut Client, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let buf = c.reader.fill_buf().expect("read");
        assert!(!buf.is_empty(), "closed after {} of {n} bytes", out.len());
        let take = buf.len().min(n - out.len()).min(1500);
        out.extend_from_slice(&buf[..take]);
        c.reader.consume(take);
    }
    out
}

#[test]
fn a_client_that_leaves_mid_value_releases_its_leases() {
    let (server, _w, get_line) = loaded("64");
    let mut mon = server.connect();
    // gat and `mg ... T` lease the item they rewrote (under its stripe lock).
    let gat_line = get_line.replacen("get", "gat 0", 1);
    let mg_lines: String = (0..KEYS).map(|k| format!("mg k{k} v T0\r\n")).collect();
    for (how, line) in [
        ("close", &get_line),
        ("reset", &gat_line),
        ("shutdown", &mg_lines),
        ("close", &gat_line),
    ] {
        let what = line.split(' ').next().unwrap_or_default();
        let mut c = TcpStream::connect(server.addr()).expect("connect");
        c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        // Far more than the socket buffers take: the server stops with values leased.
        for _ in 0..40 {
            c.write_all(line.as_bytes()).expect("send");
        }
        let held = wait_leased(&mut mon, |v| v > 0);
        assert!(
            held > 0,
            "{how} after {what}: nothing leased while the client does not read"
        );
        let mut part = vec![0; 20_000];
        c.read_exact(&mut part).expect("read a part");
        match how {
            "reset" => {
                socket2::SockRef::from(&c)
                    .set_linger(Some(Duration::ZERO))
                    .expect("SO_LINGER 0");
                drop(c);
            }
            "shutdown" => {
                c.shutdown(std::net::Shutdown::Both).expect("shutdown");
                drop(c);
            }
            _ => drop(c),
        }
        assert_eq!(
            wait_leased(&mut mon, |v| v == 0),
            0,
            "{how} after {what}: leases kept"
        );
    }
    // The data and the server are fine.
    let mut c = server.connect();
    c.send(b"get k3\r\n");
    let line = c.line();
    let len: usize = line
        .split_whitespace()
        .nth(3)
        .and_then(|l| l.parse().ok())
        .expect("a hit");
    let v = c.exact(len + 2);
    check(3, &v[..len]);
    assert_eq!(c.line(), "END\r\n");
}

#[test]
fn clients_that_do_not_read_hold_at_most_an_eighth_of_memory() {
    let server = Server::kvcached(&["-m", "64"]);
    let mut w = server.connect();
    // 96 values of 16-110 KiB: about 6 MiB, in several segments.
    for k in 0..96 {
        set(&mut w, &format!("k{k}"), &body(k % KEYS, k));
    }
    let mut stalled = Vec::new();
    for c in 0..16 {
        let mut s = TcpStream::connect(server.addr()).expect("connect");
        // Each asks for the values in another order and never reads.
        let keys: Vec<String> = (0..96)
            .map(|k| format!("k{}", (k * 5 + c * 11) % 96))
            .collect();
        let line = format!("get {}\r\n", keys.join(" "));
        for _ in 0..8 {
            s.write_all(line.as_bytes()).expect("send");
        }
        stalled.push(s);
    }
    let mut mon = server.connect();
    let held = wait_leased(&mut mon, |v| v > 0);
    let segment = stat_slabs(&mut mon, "segment_size");
    let threads: u64 = mon
        .stat("threads")
        .and_then(|t| t.parse().ok())
        .expect("threads");
    // The bound is checked before a segment's first lease, so each worker may pass it by
    // one segment.
    let bound = (64 << 20) / 8 + threads * segment;
    assert!(held > 0 && held <= bound, "leased {held}, bound {bound}");
    // The values wait in the log, not in the connections' buffers (copied, they would
    // take up to 512 KiB a connection).
    let buffers: u64 = mon
        .stat("response_obj_bytes")
        .and_then(|b| b.parse().ok())
        .expect("response_obj_bytes");
    assert!(
        buffers <= 16 * 32 * 1024,
        "output buffers hold {buffers} bytes"
    );
    // Writes and reads still work for others meanwhile.
    let fresh = vec![b'z'; 50 * 1024];
    for i in 0..200 {
        set(&mut w, &format!("new{i}"), &fresh);
    }
    w.send(b"get new199\r\n");
    assert_eq!(w.line(), format!("VALUE new199 0 {}\r\n", fresh.len()));
    assert_eq!(w.exact(fresh.len() + 2)[..fresh.len()], fresh[..]);
    assert_eq!(w.line(), "END\r\n");
    drop(stalled);
    assert_eq!(wait_leased(&mut mon, |v| v == 0), 0, "leases kept");
}

/// Every command that splices large values (text get, gets, gat, mg with v, binary get,
/// getk and gat) sends them whole, next to small ones it copies.
#[test]
fn every_get_form_sends_large_values_whole() {
    let (server, mut c, _) = loaded("64");
    set(&mut c, "small", b"tiny");
    for k in (0..KEYS).step_by(5) {
        let v = body(k, 0);
        for cmd in ["get", "gets", "gat 0"] {
            c.send(format!("{cmd} small k{k}\r\n").as_bytes());
            assert!(c.line().starts_with("VALUE small 0 4"));
            assert_eq!(c.exact(6), b"tiny\r\n");
            let head = c.line();
            assert!(
                head.starts_with(&format!("VALUE k{k} 0 {}", v.len())),
                "{head:?}"
            );
            let got = c.exact(v.len() + 2);
            assert!(got[..v.len()] == v[..], "{cmd} k{k}");
            assert_eq!(c.line(), "END\r\n");
        }
        c.send(format!("mg k{k} v s\r\n").as_bytes());
        assert_eq!(c.line(), format!("VA {} s{}\r\n", v.len(), v.len()));
        let got = c.exact(v.len() + 2);
        assert!(
            got[..v.len()] == v[..] && got[v.len()..] == *b"\r\n",
            "mg k{k}"
        );
    }
    // The binary protocol on a connection of its own: get (0x00), getk (0x0c), gat (0x1d).
    let mut b = server.connect();
    for k in (0..KEYS).step_by(5) {
        let v = body(k, 0);
        let key = format!("k{k}");
        for (op, extras) in [
            (0x00u8, &[][..]),
            (0x0c, &[][..]),
            (0x1d, &[0u8, 0, 0, 0][..]),
        ] {
            let mut req = vec![0x80, op];
            req.extend_from_slice(&(key.len() as u16).to_be_bytes());
            req.extend_from_slice(&[extras.len() as u8, 0, 0, 0]);
            req.extend_from_slice(&((extras.len() + key.len()) as u32).to_be_bytes());
            req.extend_from_slice(&7u32.to_be_bytes());
            req.extend_from_slice(&[0; 8]);
            req.extend_from_slice(extras);
            req.extend_from_slice(key.as_bytes());
            b.send(&req);
            let h = b.exact(24);
            assert_eq!(
                (h[0], h[1], h[6], h[7]),
                (0x81, op, 0, 0),
                "status of {op:#x}"
            );
            let klen = usize::from(u16::from_be_bytes([h[2], h[3]]));
            let elen = usize::from(h[4]);
            let body_len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
            let got = b.exact(body_len);
            assert_eq!(
                &got[elen..elen + klen],
                if op == 0x0c { key.as_bytes() } else { b"" }
            );
            assert!(got[elen + klen..] == v[..], "binary {op:#x} {key}");
        }
    }
    let mut mon = server.connect();
    assert_eq!(wait_leased(&mut mon, |v| v == 0), 0, "leases left behind");
}
