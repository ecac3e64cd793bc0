//! Careless and hostile clients, each while a well-behaved client keeps working: a byte a
//! second (slowloris), 100,000 pipelined gets that are never read, a 10 MB multiget line,
//! and connect/close storms. Each test asserts that the well-behaved client's every request
//! is answered correctly meanwhile, that the server's resident memory stays within a bound
//! stated below (and in docs/CONFIGURATION.md), and that the connections cost nothing once
//! they are gone.
//!
//! Loops are bounded in count and time; waits are polls with deadlines; nothing asserts a
//! duration.

mod common;

use common::{Client, Kind, Server};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Slack on every RSS bound: the well-behaved client's items and replies, allocator arenas
/// and rounding.
const SLACK: u64 = 16 * MIB;

/// What one connection costs the server while it holds no buffer: `Conn`, its `ConnInfo`,
/// the registry entry and allocator rounding (docs/CONFIGURATION.md).
const PER_IDLE_CONN: u64 = 4 * KIB;

/// How many round trips the well-behaved client may run ahead of what the test has asked for,
/// so that it keeps loading the server between the test's checks.
const AHEAD: u64 = 1000;

/// A well-behaved client that sets and gets its own keys in a loop on a thread; it fails the
/// test on any wrong or missing reply. Its work is paced by the test, not by the machine's
/// speed: it runs at most [`AHEAD`] round trips past what [`Wellbehaved::progresses`] last
/// asked for and then waits for the next request (or for [`Wellbehaved::finish`] or drop),
/// so a fast machine never runs it to a bound before the test is done with it, and a slow one
/// is only asked for what each check needs.
struct Wellbehaved {
    pace: Arc<Pace>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// What the test and the client's thread share.
struct Pace {
    /// Round trips completed, each one checked.
    rounds: AtomicU64,
    state: Mutex<Allowance>,
    changed: Condvar,
}

struct Allowance {
    /// The client may complete round trips up to this count.
    until: u64,
    stop: bool,
}

impl Wellbehaved {
    fn start(server: &Server) -> Wellbehaved {
        let mut c = server.connect();
        let pace = Arc::new(Pace {
            rounds: AtomicU64::new(0),
            state: Mutex::new(Allowance {
                until: AHEAD,
                stop: false,
            }),
            changed: Condvar::new(),
        });
        let handle = {
            let pace = pace.clone();
            std::thread::spawn(move || {
                let mut i = 0u64;
                loop {
                    // Bounded: never past the allowance the test has given, and gone once
                    // the test finishes or drops its handle.
                    {
                        let mut state = pace.state.lock().unwrap();
                        while !state.stop && i >= state.until {
                            state = pace.changed.wait(state).unwrap();
                        }
                        if state.stop {
                            return;
                        }
                    }
                    let key = format!("good{}", i % 100);
                    let value = format!("value-{i}");
                    assert_eq!(
                        c.call(&format!("set {key} 0 0 {}\r\n{value}\r\n", value.len())),
                        "STORED\r\n",
                        "set #{i}"
                    );
                    assert_eq!(
                        c.call(&format!("get {key}\r\n")),
                        format!("VALUE {key} 0 {}\r\n", value.len()),
                        "get #{i}"
                    );
                    assert_eq!(c.until("END\r\n"), format!("{value}\r\nEND\r\n"));
                    i += 1;
                    pace.rounds.store(i, Ordering::Relaxed);
                }
            })
        };
        Wellbehaved {
            pace,
            handle: Some(handle),
        }
    }

    /// Round trips completed so far.
    fn rounds(&self) -> u64 {
        self.pace.rounds.load(Ordering::Relaxed)
    }

    /// Ask for `n` more round trips (and up to [`AHEAD`] beyond) and wait until the client has
    /// made the `n` (it is being served now). Fails the test if the client got a wrong reply
    /// or lost its connection, or if it is not served within the harness's timeout.
    fn progresses(&mut self, n: u64) {
        let from = self.rounds();
        {
            let mut state = self.pace.state.lock().unwrap();
            state.until = state.until.max(from + n + AHEAD);
        }
        self.pace.changed.notify_all();
        let deadline = Instant::now() + common::TIMEOUT;
        while self.rounds() < from + n {
            if self.handle.as_ref().is_some_and(|h| h.is_finished()) {
                // Told neither to stop nor that it may stop: it can only have failed.
                match self.handle.take().map(|h| h.join()) {
                    Some(Err(panic)) => {
                        let why = panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("(no message)");
                        panic!("the well-behaved client failed: {why}")
                    }
                    _ => panic!("the well-behaved client stopped without being told to"),
                }
            }
            assert!(
                Instant::now() < deadline,
                "the well-behaved client is not being served: {} of {n} round trips in {:?}",
                self.rounds() - from,
                common::TIMEOUT
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn stop(&self) {
        self.pace.state.lock().unwrap().stop = true;
        self.pace.changed.notify_all();
    }

    /// Stop the client and return how many round trips it made.
    fn finish(mut self) -> u64 {
        self.stop();
        if let Some(h) = self.handle.take() {
            h.join()
                .expect("the well-behaved client failed (see its panic above)");
        }
        self.rounds()
    }
}

impl Drop for Wellbehaved {
    /// A test that fails midway still stops the client's thread.
    fn drop(&mut self) {
        self.stop();
    }
}

fn stat(c: &mut Client, name: &str) -> u64 {
    c.stat(name)
        .unwrap_or_else(|| panic!("stats lacks {name}"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// Poll until `curr_connections` is `n`.
fn wait_conns(mon: &mut Client, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let curr = stat(mon, "curr_connections");
        if curr == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "curr_connections {curr}, expected {n}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sockets of the server's port in CLOSE-WAIT.
fn close_wait(port: u16) -> usize {
    let filter = format!("( sport = :{port} )");
    let out = std::process::Command::new("ss")
        .args(["-tanH", "state", "close-wait", &filter])
        .output()
        .expect("run ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// A server, its monitor connection, the baseline connection count (the monitor and the
/// well-behaved client) and RSS.
fn setup(kind: Kind, args: &[&str]) -> (Server, Client, Wellbehaved, u64) {
    let server = Server::start_verified(kind, args);
    let mut mon = server.connect();
    let mut good = Wellbehaved::start(&server);
    good.progresses(100);
    wait_conns(&mut mon, 2);
    let rss = server.rss_kib() * KIB;
    (server, mon, good, rss)
}

// ---------------------------------------------------------------------------------------------

/// 300 connections each dribbling a `get` line one byte a second. The well-behaved client is
/// served throughout; the dribblers cost no more than their bookkeeping and a small buffer
/// each; with `-o idle_timeout` they are kicked, since no command ever completes.
fn slowloris(kind: Kind) {
    let (server, mut mon, mut good, rss0) = setup(kind, &["-o", "idle_timeout=3", "-t", "2"]);
    let n = 300;
    let mut conns: Vec<TcpStream> = (0..n)
        .map(|_| {
            let s = TcpStream::connect(server.addr()).expect("connect");
            s.set_nodelay(true).unwrap();
            s
        })
        .collect();
    wait_conns(&mut mon, 2 + n as u64);
    let line = b"get slowloris-key-that-never-ends";
    let mut peak = 0;
    let mut kicked_at = None;
    // One byte per connection per second, for at most 10 seconds (the kick comes after
    // idle_timeout, 3 s, plus up to a second of the server's sweep).
    for (second, &byte) in line.iter().enumerate().take(10) {
        let started = Instant::now();
        let mut open = 0;
        for s in &mut conns {
            if s.write_all(&[byte]).is_ok() {
                open += 1;
            }
        }
        good.progresses(10);
        peak = peak.max(server.rss_kib() * KIB);
        if open == 0 || stat(&mut mon, "curr_connections") == 2 {
            kicked_at = Some(second);
            break;
        }
        let left = Duration::from_secs(1).saturating_sub(started.elapsed());
        std::thread::sleep(left);
    }
    let bound = rss0 + n as u64 * (PER_IDLE_CONN + 16 * KIB) + SLACK;
    eprintln!(
        "{kind:?}: slowloris x{n}: RSS {} KiB -> peak {} KiB (bound {} KiB); kicked after {kicked_at:?} s",
        rss0 / KIB,
        peak / KIB,
        bound / KIB
    );
    assert!(peak <= bound, "{kind:?}: RSS peak {peak} over {bound}");
    // Every dribbler is closed by the idle kick (its command line never completes).
    wait_conns(&mut mon, 2);
    assert!(
        stat(&mut mon, "idle_kicks") >= n as u64,
        "{kind:?}: idle_kicks"
    );
    for s in &mut conns {
        s.set_read_timeout(Some(common::TIMEOUT)).unwrap();
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            other => panic!("{kind:?}: a dribbler was not closed: {other:?}"),
        }
    }
    assert!(good.finish() > 0);
}

/// One client pipelines 100,000 gets of a 100 KB value and never reads. The server executes
/// what fits its output high-water mark and then stops reading it (TCP holds the rest back);
/// the well-behaved client is served throughout.
fn pipeline_never_read(kind: Kind) {
    let (server, mut mon, mut good, _) = setup(kind, &["-t", "2"]);
    let size = 100_000;
    let mut c = server.connect();
    let mut set = format!("set big 0 0 {size}\r\n").into_bytes();
    set.extend(std::iter::repeat_n(b'b', size));
    set.extend_from_slice(b"\r\n");
    assert_eq!(c.call(std::str::from_utf8(&set).unwrap()), "STORED\r\n");
    drop(c);
    wait_conns(&mut mon, 2);
    let rss0 = server.rss_kib() * KIB;
    let gets = "get big\r\n".repeat(100_000);
    let mut hog = TcpStream::connect(server.addr()).expect("connect");
    hog.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut peak = 0;
    // Send until TCP pushes back (the server has stopped reading) or all is sent.
    while sent < gets.len() && Instant::now() < deadline {
        match hog.write(&gets.as_bytes()[sent..]) {
            Ok(k) => sent += k,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("{kind:?}: writing the pipeline failed: {e}"),
        }
        good.progresses(1);
        peak = peak.max(server.rss_kib() * KIB);
    }
    // Steady state: the server executes no more of the hog's gets. Between two samples of
    // `cmd_get` the well-behaved client made at least one get per round trip it completed
    // after the first sample and before the second, less the one it may have had in flight at
    // the first; whatever else was counted is the hog's (or the client's get in flight at the
    // second). Its pace does not matter.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = stat(&mut mon, "cmd_get");
    let mut last_rounds = good.rounds();
    loop {
        good.progresses(50);
        let rounds = good.rounds();
        let now = stat(&mut mon, "cmd_get");
        let hogs = (now - last).saturating_sub((rounds - last_rounds).saturating_sub(1));
        if hogs <= 10 {
            break;
        }
        last = now;
        last_rounds = good.rounds();
        assert!(
            Instant::now() < deadline,
            "{kind:?}: the hog's gets never stop ({hogs} in the last sample)"
        );
    }
    peak = peak.max(server.rss_kib() * KIB);
    // One connection's output stops at the high-water mark plus one reply, and its input at
    // what one read leaves unexecuted (kvcached: 256 KiB + 100 KB + 64 KiB).
    let bound = rss0 + 256 * KIB + 2 * size as u64 + 64 * KIB + SLACK;
    eprintln!(
        "{kind:?}: 100,000 gets never read ({sent} bytes sent): RSS {} KiB -> peak {} KiB (bound {} KiB)",
        rss0 / KIB,
        peak / KIB,
        bound / KIB
    );
    assert!(peak <= bound, "{kind:?}: RSS peak {peak} over {bound}");
    // The hog goes away with everything unread: it costs nothing afterwards.
    socket2::SockRef::from(&hog)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(hog);
    wait_conns(&mut mon, 2);
    good.progresses(100);
    assert_eq!(close_wait(server.port), 0);
    assert!(good.finish() > 0);
}

/// A multiget line of 10 MB with no end: kvcached closes the connection once the line passes
/// its 1 MiB cap (memcached would buffer all of it), and the well-behaved client is served
/// throughout.
#[test]
fn ten_megabyte_multiget_line() {
    let kind = Kind::Kvcached;
    let (server, mut mon, mut good, rss0) = setup(kind, &["-t", "2"]);
    let mut c = TcpStream::connect(server.addr()).expect("connect");
    c.set_write_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let keys = b"a-key-of-about-thirty-bytes-xx ".repeat(10 * 1024 * 1024 / 31);
    c.write_all(b"get ").unwrap();
    let mut sent = 4;
    let mut peak = 0;
    let closed = loop {
        if sent >= keys.len() {
            break false;
        }
        let end = (sent + 64 * 1024).min(keys.len());
        match c.write(&keys[sent..end]) {
            Ok(k) => sent += k,
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
                break true
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // The server stopped reading: it must have closed.
                let mut b = [0u8; 16];
                c.set_read_timeout(Some(common::TIMEOUT)).unwrap();
                match c.read(&mut b) {
                    Ok(0) => break true,
                    Err(e) if e.kind() == ErrorKind::ConnectionReset => break true,
                    other => panic!("the server neither reads nor closes: {other:?}"),
                }
            }
            Err(e) => panic!("write failed: {e}"),
        }
        if sent % (MIB as usize) < 64 * 1024 {
            good.progresses(1);
            peak = peak.max(server.rss_kib() * KIB);
        }
    };
    assert!(closed, "10 MB of get line were taken without a close");
    assert!(
        sent as u64 > MIB,
        "closed after {sent} bytes, before the 1 MiB cap"
    );
    peak = peak.max(server.rss_kib() * KIB);
    // At most one line at the cap, page-rounded, plus a read.
    let bound = rss0 + MIB + 64 * KIB + SLACK;
    eprintln!(
        "10 MB get line: closed after {sent} bytes; RSS {} KiB -> peak {} KiB (bound {} KiB)",
        rss0 / KIB,
        peak / KIB,
        bound / KIB
    );
    assert!(peak <= bound);
    drop(c);
    wait_conns(&mut mon, 2);
    good.progresses(100);
    assert!(good.finish() > 0);
}

/// Thousands of connections a second that connect, maybe send a request, and close (half
/// with a FIN, half with a reset), for at most 5 seconds or 20,000 connections.
fn connect_close_storm(kind: Kind) {
    let (server, mut mon, mut good, rss0) = setup(kind, &["-t", "2", "-c", "4096"]);
    let total0 = stat(&mut mon, "total_connections");
    let made = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let addr = server.addr();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let made = made.clone();
            s.spawn(move || {
                let mut i = 0u64;
                while i < 5000 && started.elapsed() < Duration::from_secs(5) {
                    let Ok(mut c) = TcpStream::connect(addr) else {
                        continue;
                    };
                    made.fetch_add(1, Ordering::Relaxed);
                    match (t + i) % 4 {
                        // Connect and close at once.
                        0 => {}
                        // A request, then FIN without reading.
                        1 => {
                            let _ = c.write_all(b"version\r\n");
                        }
                        // A request and its reply, then FIN.
                        2 => {
                            let _ = c.write_all(b"version\r\n");
                            let mut b = [0u8; 8];
                            let _ = c.read_exact(&mut b);
                        }
                        // A request, then a reset.
                        _ => {
                            let _ = c.write_all(b"get storm\r\n");
                            let _ = socket2::SockRef::from(&c).set_linger(Some(Duration::ZERO));
                        }
                    }
                    drop(c);
                    i += 1;
                }
            });
        }
        // Meanwhile the well-behaved client is served.
        while started.elapsed() < Duration::from_secs(5) && made.load(Ordering::Relaxed) < 20_000 {
            good.progresses(10);
        }
    });
    let made = made.load(Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{kind:?}: storm of {made} connections in {secs:.1} s ({:.0}/s)",
        made as f64 / secs
    );
    let peak = server.rss_kib() * KIB;
    wait_conns(&mut mon, 2);
    // memcached counts a connection when a worker takes it from the accepting thread's
    // queue, which can be after the client is gone and `curr_connections` has settled:
    // wait (with a deadline) for the count to come in, then hold it to exactly one per
    // connection made.
    let deadline = Instant::now() + common::TIMEOUT;
    let mut total = stat(&mut mon, "total_connections");
    while total < total0 + made && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        total = stat(&mut mon, "total_connections");
    }
    assert_eq!(total, total0 + made, "{kind:?}: total_connections");
    let deadline = Instant::now() + common::TIMEOUT;
    while close_wait(server.port) > 0 {
        assert!(
            Instant::now() < deadline,
            "{kind:?}: sockets left in CLOSE-WAIT"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Nothing retained in proportion to the connections that came and went.
    let bound = rss0 + SLACK;
    assert!(
        peak <= bound,
        "{kind:?}: RSS {} KiB after the storm (before {} KiB)",
        peak / KIB,
        rss0 / KIB
    );
    good.progresses(100);
    assert!(good.finish() > 0);
}

common::both!(slowloris, pipeline_never_read, connect_close_storm);
