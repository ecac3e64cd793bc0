//! Connection handling: the connection limit, hostile and slow clients, clients that never
//! read, the idle timeout, and the unix socket. Each behaviour runs against Debian's
//! memcached 1.6.18 (`<test>::memcached`, the reference) and kvcached (`<test>::kvcached`).
//! Nothing sleeps to pass: waits are polls with deadlines.

mod common;

use common::{Client, Kind, Server};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn memcached() {
                super::$name(super::Kind::Memcached);
            }
            #[test]
            fn kvcached() {
                super::$name(super::Kind::Kvcached);
            }
        }
    )*};
}

both!(
    connection_limit,
    random_bytes_do_not_disturb_others,
    huge_declared_length,
    slow_sender,
    client_that_never_reads,
    idle_timeout_closes,
    unix_socket,
    partial_data_block_then_close,
    many_simultaneous_connections,
    client_closes_mid_reply,
);

const TOO_MANY: &str = "ERROR Too many open connections\r\n";

/// Poll `f` until it returns true or `within` passes.
fn poll_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a fresh connection sees when it sends `version`.
enum Attempt {
    Accepted(Client),
    Rejected(String),
}

fn attempt(server: &Server) -> Attempt {
    let mut c = server.connect();
    c.send(b"version\r\n");
    let l = c.line();
    if l.starts_with("VERSION ") {
        Attempt::Accepted(c)
    } else {
        assert_eq!(l, TOO_MANY, "unexpected greeting");
        assert!(c.closed(), "a rejected connection must be closed");
        Attempt::Rejected(l)
    }
}

// ---------------------------------------------------------------------------------------------

fn connection_limit(kind: Kind) {
    // memcached rejects a connection whose fd number is >= maxconns - 1, so with its own
    // descriptors (listeners, pipes, epoll, stdio) it accepts fewer than -c; kvcached may
    // count exactly. Either way: some, at most -c, and then a clear rejection.
    let n = 50;
    let server = Server::start_verified(kind, &["-c", &n.to_string(), "-t", "2"]);
    let mut accepted = Vec::new();
    let mut rejected = None;
    for _ in 0..n + 10 {
        match attempt(&server) {
            Attempt::Accepted(c) => accepted.push(c),
            Attempt::Rejected(l) => {
                rejected = Some(l);
                break;
            }
        }
    }
    let count = accepted.len();
    eprintln!("{kind:?}: -c {n}: accepted {count}");
    assert!(
        rejected.is_some(),
        "{kind:?}: -c {n} but {count} connections were accepted"
    );
    assert!(
        count >= n / 2 && count <= n,
        "{kind:?}: -c {n} accepted {count} connections"
    );
    // Another attempt is rejected the same way.
    assert!(matches!(attempt(&server), Attempt::Rejected(_)));
    // Every accepted connection still works.
    for (i, c) in accepted.iter_mut().enumerate() {
        assert_eq!(
            c.call(&format!("set k{i} 0 0 1\r\nx\r\n")),
            "STORED\r\n",
            "{kind:?}: connection {i} after the limit"
        );
    }
    let rejected_stat: u64 = accepted[0]
        .stat("rejected_connections")
        .expect("rejected_connections")
        .parse()
        .unwrap();
    assert!(rejected_stat >= 2, "rejected_connections {rejected_stat}");
    // Close two; a new connection is accepted again (the server notices the close
    // asynchronously: poll).
    accepted.truncate(count - 2);
    let mut fresh = None;
    poll_until(
        "a slot to free up",
        Duration::from_secs(10),
        || match attempt(&server) {
            Attempt::Accepted(c) => {
                fresh = Some(c);
                true
            }
            Attempt::Rejected(_) => false,
        },
    );
    let mut fresh = fresh.unwrap();
    assert_eq!(fresh.call("get k0\r\n"), "VALUE k0 0 1\r\n");
}

/// A deterministic byte stream (xorshift), so failures reproduce.
fn junk(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn random_bytes_do_not_disturb_others(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for seed in 1..=3u64 {
        let mut s = TcpStream::connect(server.addr()).expect("connect");
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || {
            // Drain whatever the server answers so it never blocks on us.
            let mut r = s.try_clone().unwrap();
            r.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let drain = std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                }
            });
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && i < 64 {
                // Mostly binary noise, sometimes with newlines and command-like words.
                let mut chunk = junk(seed * 1000 + i, 4096);
                if i % 3 == 0 {
                    chunk.extend_from_slice(b"\r\nset x 0 0 99999999\r\n\nget \x00\xff\r\n");
                }
                if s.write_all(&chunk).is_err() {
                    break; // closed on us: fine
                }
                i += 1;
            }
            drop(s);
            let _ = drain.join();
        }));
    }
    // Meanwhile another client gets correct answers.
    let mut c = server.connect();
    for i in 0..300 {
        let v = format!("value-{i}");
        assert_eq!(
            c.call(&format!("set good{i} {i} 0 {}\r\n{v}\r\n", v.len())),
            "STORED\r\n"
        );
        assert_eq!(
            c.call(&format!("get good{i}\r\n")),
            format!("VALUE good{i} {i} {}\r\n", v.len())
        );
        assert_eq!(c.until("END\r\n"), format!("{v}\r\nEND\r\n"));
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    // Still alive and consistent.
    assert!(server_alive(&server));
    assert_eq!(c.call("get good299\r\n"), "VALUE good299 299 9\r\n");
}

fn server_alive(server: &Server) -> bool {
    let mut c = server.connect();
    c.call("version\r\n").starts_with("VERSION ")
}

fn huge_declared_length(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    // Beyond i32: a bad command line, nothing to swallow, the connection goes on.
    for len in [
        "4294967295",
        "2147483647",
        "18446744073709551615",
        "99999999999999999999",
    ] {
        assert_eq!(
            c.call(&format!("set k 0 0 {len}\r\n")),
            "CLIENT_ERROR bad command line format\r\n",
            "{kind:?}: length {len}"
        );
    }
    assert_eq!(c.call("get k\r\n"), "END\r\n");
    // A length that parses but is far too large: the server must not allocate it up front.
    let rss0 = server.rss_kib();
    let mut hog = server.connect();
    hog.send(b"set k 0 0 2000000000\r\n");
    hog.send(&vec![b'z'; 1 << 20]);
    // Others are served meanwhile, and memory stays flat.
    for i in 0..50 {
        assert_eq!(c.call(&format!("set o{i} 0 0 1\r\nx\r\n")), "STORED\r\n");
    }
    let rss1 = server.rss_kib();
    eprintln!("{kind:?}: RSS {rss0} KiB -> {rss1} KiB after a 2 GB declaration");
    assert!(
        rss1 < rss0 + 64 * 1024,
        "{kind:?}: RSS grew from {rss0} KiB to {rss1} KiB after a 2 GB declaration"
    );
    drop(hog);
    assert!(server_alive(&server));
}

fn slow_sender(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut slow = server.connect();
    let mut other = server.connect();
    let request = b"set slow 3 0 10\r\n0123456789\r\nget slow\r\n";
    for (i, b) in request.iter().enumerate() {
        slow.send(&[*b]);
        // Each byte is its own segment (TCP_NODELAY); give the server a chance to see a
        // partial request, and check it keeps serving others while waiting.
        std::thread::sleep(Duration::from_millis(2));
        if i % 8 == 0 {
            assert!(other.call("version\r\n").starts_with("VERSION "));
        }
    }
    assert_eq!(slow.line(), "STORED\r\n");
    assert_eq!(
        slow.until("END\r\n"),
        "VALUE slow 3 10\r\n0123456789\r\nEND\r\n"
    );
    // A data block split at every possible point of the trailing \r\n.
    for split in 1..14 {
        let req = b"set s2 0 0 5\r\nabcde\r\n";
        slow.send(&req[..split]);
        assert!(other.call("version\r\n").starts_with("VERSION "));
        slow.send(&req[split..]);
        assert_eq!(slow.line(), "STORED\r\n", "split at {split}");
    }
}

fn client_that_never_reads(kind: Kind) {
    let server = Server::start_verified(kind, &["-m", "64"]);
    let mut c = server.connect();
    let size = 512 * 1024;
    let mut req = format!("set big 0 0 {size}\r\n").into_bytes();
    req.extend(std::iter::repeat_n(b'b', size));
    req.extend_from_slice(b"\r\n");
    c.send(&req);
    assert_eq!(c.line(), "STORED\r\n");
    let rss0 = server.rss_kib();
    // 4000 gets of 512 KiB = 2 GB of replies; the request is only 40 KB, so it all reaches
    // the server. The client never reads.
    let mut hog = TcpStream::connect(server.addr()).expect("connect");
    hog.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let writer = std::thread::spawn(move || {
        let gets = "get big\r\n".repeat(4000);
        let _ = hog.write_all(gets.as_bytes());
        hog // keep it open until the test is done
    });
    // Others keep being served; the server's memory stays bounded.
    let mut peak = rss0;
    for i in 0..200 {
        assert_eq!(c.call(&format!("set x{i} 0 0 1\r\nx\r\n")), "STORED\r\n");
        assert_eq!(
            c.call(&format!("get x{i}\r\n")),
            format!("VALUE x{i} 0 1\r\n")
        );
        assert_eq!(c.until("END\r\n"), "x\r\nEND\r\n");
        if i % 10 == 0 {
            peak = peak.max(server.rss_kib());
        }
    }
    let hog = writer.join().unwrap();
    peak = peak.max(server.rss_kib());
    eprintln!("{kind:?}: RSS {rss0} KiB -> peak {peak} KiB with a non-reading client");
    assert!(
        peak < rss0 + 128 * 1024,
        "{kind:?}: RSS grew from {rss0} KiB to {peak} KiB for a client that does not read"
    );
    // Reading now: the replies that were produced are intact, in order.
    let mut r = BufReader::new(hog);
    r.get_mut()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    for n in 0..3 {
        let mut head = String::new();
        r.read_line(&mut head).unwrap();
        assert_eq!(head, format!("VALUE big 0 {size}\r\n"), "reply {n}");
        let mut data = vec![0; size + 2];
        r.read_exact(&mut data).unwrap();
        assert!(data[..size].iter().all(|&b| b == b'b'));
        let mut end = String::new();
        r.read_line(&mut end).unwrap();
        assert_eq!(end, "END\r\n");
    }
    drop(r);
    assert!(server_alive(&server));
}

fn idle_timeout_closes(kind: Kind) {
    let server = Server::start_verified(kind, &["-o", "idle_timeout=1"]);
    let mut idle = server.connect();
    assert!(idle.call("version\r\n").starts_with("VERSION "));
    // A busy connection: one command every 100 ms must keep it open past the timeout.
    let mut busy = server.connect();
    let done = Arc::new(AtomicBool::new(false));
    let busy_thread = {
        let done = done.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !done.load(Ordering::Relaxed) || t0.elapsed() < Duration::from_millis(2500) {
                std::thread::sleep(Duration::from_millis(100));
                let mut c2 = String::new();
                busy.send(b"version\r\n");
                if busy.reader.read_line(&mut c2).unwrap_or(0) == 0 {
                    return Err(format!("busy connection closed after {:?}", t0.elapsed()));
                }
            }
            Ok(())
        })
    };
    let t0 = Instant::now();
    // memcached checks idle connections about once a second: within a few seconds.
    idle.stream()
        .set_read_timeout(Some(Duration::from_secs(6)))
        .unwrap();
    let mut buf = [0u8; 64];
    let closed = match idle.reader.read(&mut buf) {
        Ok(0) => true,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
        _ => false,
    };
    let waited = t0.elapsed();
    assert!(closed, "{kind:?}: idle connection not closed within 6 s");
    assert!(
        waited >= Duration::from_millis(900),
        "{kind:?}: closed after only {waited:?}"
    );
    done.store(true, Ordering::Relaxed);
    busy_thread
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    // New connections are still welcome; the setting is reported.
    let mut c = server.connect();
    let settings = c.stats("settings");
    assert!(
        settings
            .iter()
            .any(|(k, v)| k == "idle_timeout" && v == "1"),
        "{kind:?}: stats settings idle_timeout"
    );
}

fn unix_socket(kind: Kind) {
    let dir = std::env::temp_dir().join(format!("kvcache-itest-{}-{:?}", std::process::id(), kind));
    std::fs::create_dir_all(&dir).unwrap();
    for mask in ["700", "755"] {
        let path: PathBuf = dir.join(format!("s{mask}.sock"));
        let server = Server::start_unix(kind, &path, &["-a", mask]);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode,
            u32::from_str_radix(mask, 8).unwrap(),
            "{kind:?}: socket mode {mode:o} for -a {mask}"
        );
        let s = Client::unix(&path);
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        w.write_all(b"set u 5 0 2\r\nhi\r\nget u nope\r\n").unwrap();
        let mut out = String::new();
        while !out.ends_with("END\r\n") {
            let mut l = String::new();
            assert!(r.read_line(&mut l).unwrap() > 0, "closed; got {out:?}");
            out.push_str(&l);
        }
        assert_eq!(out, "STORED\r\nVALUE u 5 2\r\nhi\r\nEND\r\n");
        // TCP is off when listening on a unix socket.
        let _ = server;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn partial_data_block_then_close(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    assert_eq!(c.call("set k 0 0 3\r\nold\r\n"), "STORED\r\n");
    // The connection goes away in the middle of a data block: nothing is stored.
    for partial in [
        &b"set k 0 0 10\r\n01234"[..],
        b"set k 0 0 10\r\n0123456789",
        b"set k 0 0 10\r\n0123456789\r",
        b"set new 0 0 5\r\nab",
        b"append k 0 0 4\r\nxx",
    ] {
        let mut d = server.connect();
        d.send(partial);
        // Make sure the server has read it before the close.
        assert!(c.call("version\r\n").starts_with("VERSION "));
        drop(d);
        assert_eq!(
            c.call("get k new\r\n"),
            "VALUE k 0 3\r\n",
            "{kind:?}: after {:?}",
            String::from_utf8_lossy(partial)
        );
        assert_eq!(c.until("END\r\n"), "old\r\nEND\r\n");
    }
}

fn many_simultaneous_connections(kind: Kind) {
    let server = Server::start_verified(kind, &["-c", "1024"]);
    let n = 300;
    let mut conns: Vec<Client> = (0..n).map(|_| server.connect()).collect();
    // All send first, then all read: the server must serve every one.
    for (i, c) in conns.iter_mut().enumerate() {
        c.send(format!("set m{i} {i} 0 1\r\nx\r\nget m{i}\r\n").as_bytes());
    }
    for (i, c) in conns.iter_mut().enumerate() {
        assert_eq!(c.line(), "STORED\r\n", "{kind:?}: connection {i}");
        assert_eq!(
            c.until("END\r\n"),
            format!("VALUE m{i} {i} 1\r\nx\r\nEND\r\n")
        );
    }
    let curr: usize = conns[0].stat("curr_connections").unwrap().parse().unwrap();
    assert!(curr >= n, "{kind:?}: curr_connections {curr} with {n} open");
    // Drop them all; the count comes back down.
    let mut last = conns.pop().unwrap();
    drop(conns);
    poll_until("curr_connections to fall", Duration::from_secs(10), || {
        last.stat("curr_connections").as_deref() == Some("1")
    });
}

fn client_closes_mid_reply(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    let size = 900_000;
    let mut req = format!("set big 0 0 {size}\r\n").into_bytes();
    req.extend(std::iter::repeat_n(b'q', size));
    req.extend_from_slice(b"\r\n");
    c.send(&req);
    assert_eq!(c.line(), "STORED\r\n");
    for _ in 0..20 {
        let mut d = server.connect();
        d.send("get big\r\n".repeat(20).as_bytes());
        // Read a little of the reply, then go away (with unread data: an RST).
        let _ = d.exact(1000);
        drop(d);
    }
    // The server is fine and the value intact.
    c.send(b"get big\r\n");
    assert_eq!(c.line(), format!("VALUE big 0 {size}\r\n"));
    assert!(c.exact(size + 2)[..size].iter().all(|&b| b == b'q'));
    assert_eq!(c.line(), "END\r\n");
    assert!(server_alive(&server));
}
