//! Shared test harness: start a real kvcached (or Debian's memcached) on a free loopback port,
//! talk to it over sockets, and stop it when the handle drops.
#![allow(dead_code)]

pub mod diff;
pub mod netns;
pub mod ports;
pub mod repl;
pub mod skip;

pub use ports::free_port;
#[allow(unused_imports)] // not every test file has something to skip
pub use skip::skip;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a test waits for a server to accept connections, or for a reply, before failing.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// `both!(a, b)`: for each test body `fn a(kind: Kind)`, a module `a` with two tests that run
/// it against memcached and against kvcached (`cargo test a::kvcached`).
#[allow(unused_macros)] // not every test file runs a test against both servers
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
#[allow(unused_imports)]
pub(crate) use both;

/// Which server a test talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kvcached,
    Memcached,
}

/// A running server process, killed on drop.
pub struct Server {
    pub kind: Kind,
    pub port: u16,
    pub child: Child,
    /// The unix socket path, when the server listens on one.
    pub socket: Option<PathBuf>,
    /// Drains the server's stderr into `logged` so that a chatty server never blocks on a
    /// full pipe (memcached writes accept errors there during a connection storm).
    log: Option<std::thread::JoinHandle<()>>,
    /// What the server wrote to stderr so far (its last MiB or two).
    logged: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

/// Keep at most this much of a server's stderr (the tail).
const LOG_KEEP: usize = 1 << 20;

/// Path of Debian's memcached binary (the differential tests' reference).
pub fn memcached_path() -> PathBuf {
    std::env::var_os("MEMCACHED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/memcached"))
}

pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc_geteuid() == 0 }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

impl Server {
    /// Wrap a started server: from now on its stderr is read on a thread until it exits.
    pub fn new(kind: Kind, port: u16, mut child: Child, socket: Option<PathBuf>) -> Server {
        let logged = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = child.stderr.take().map(|mut e| {
            let logged = logged.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match e.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let mut kept = logged.lock().unwrap_or_else(|p| p.into_inner());
                            kept.extend_from_slice(&buf[..n]);
                            if kept.len() > 2 * LOG_KEEP {
                                let cut = kept.len() - LOG_KEEP;
                                kept.drain(..cut);
                            }
                        }
                    }
                }
            })
        });
        Server {
            kind,
            port,
            child,
            socket,
            log,
            logged,
        }
    }

    /// Start kvcached on a free loopback port with these extra arguments.
    pub fn kvcached(args: &[&str]) -> Server {
        Server::start(Kind::Kvcached, args)
    }

    /// Start Debian's memcached on a free loopback port with these extra arguments.
    pub fn memcached(args: &[&str]) -> Server {
        Server::start(Kind::Memcached, args)
    }

    /// Start `kind` on a free loopback port with these extra arguments.
    pub fn start(kind: Kind, args: &[&str]) -> Server {
        Server::try_start(kind, args, &[]).unwrap_or_else(|e| panic!("{kind:?} did not start: {e}"))
    }

    /// Start `kind` on a free loopback port with these extra arguments and environment
    /// variables; the error is why it did not (what it wrote to stderr, at the last try).
    pub fn try_start(
        kind: Kind,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Server, String> {
        Server::try_start_in(kind, args, envs, None)
    }

    /// [`Server::try_start`] with the process's file size limit (`RLIMIT_FSIZE`) set to
    /// `bytes`: writes and allocations past it fail (`EFBIG`), as on a full disk.
    pub fn try_start_with_file_limit(
        kind: Kind,
        args: &[&str],
        bytes: u64,
    ) -> Result<Server, String> {
        Server::try_start_in(kind, args, &[], Some(bytes))
    }

    fn try_start_in(
        kind: Kind,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
        file_limit: Option<u64>,
    ) -> Result<Server, String> {
        let program = match kind {
            Kind::Kvcached => PathBuf::from(env!("CARGO_BIN_EXE_kvcached")),
            Kind::Memcached => memcached_path(),
        };
        assert!(
            program.exists(),
            "{} not found: run scripts/install-deps.sh",
            program.display()
        );
        // A port can be taken between free_port() and the server's bind; try a few.
        let mut last_err = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = Command::new(&program);
            cmd.arg("-l")
                .arg("127.0.0.1")
                .arg("-p")
                .arg(port.to_string());
            if running_as_root() && !args.contains(&"-u") {
                cmd.arg("-u").arg("root");
            }
            cmd.args(args)
                .envs(envs.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            if let Some(bytes) = file_limit {
                use std::os::unix::process::CommandExt;
                // SAFETY: only setrlimit and signal (both async-signal-safe) run between
                // fork and exec.
                unsafe {
                    cmd.pre_exec(move || {
                        // A write past the limit then fails instead of killing the child.
                        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                        let lim = libc::rlimit {
                            rlim_cur: bytes,
                            rlim_max: libc::RLIM_INFINITY,
                        };
                        if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            let mut child = cmd.spawn().expect("spawn server");
            match wait_listening(&mut child, port) {
                Ok(()) => return Ok(Server::new(kind, port, child, None)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_err = e;
                }
            }
        }
        Err(last_err)
    }

    /// Start `kind` listening only on the unix socket `path` (TCP off).
    pub fn start_unix(kind: Kind, path: &Path, args: &[&str]) -> Server {
        let program = match kind {
            Kind::Kvcached => PathBuf::from(env!("CARGO_BIN_EXE_kvcached")),
            Kind::Memcached => memcached_path(),
        };
        let _ = std::fs::remove_file(path);
        let mut cmd = Command::new(&program);
        cmd.arg("-s").arg(path);
        if running_as_root() && !args.contains(&"-u") {
            cmd.arg("-u").arg("root");
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn server");
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Ok(s) = std::os::unix::net::UnixStream::connect(path) {
                served(s);
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{kind:?} exited early: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "{kind:?} did not listen on {path:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Server::new(kind, 0, child, Some(path.to_path_buf()))
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A new client connection with read/write timeouts set.
    pub fn connect(&self) -> Client {
        let stream = TcpStream::connect(self.addr()).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Client::new(stream)
    }

    /// Set the running server's file size limit (`RLIMIT_FSIZE`) to `bytes` (its writes
    /// past it then fail with `EFBIG`; kvcached ignores the signal that comes with them).
    pub fn set_file_limit(&self, bytes: u64) {
        let lim = libc::rlimit {
            rlim_cur: bytes,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: prlimit on our own child's pid with a valid rlimit; no old value asked.
        let rc = unsafe {
            libc::prlimit(
                self.child.id() as libc::pid_t,
                libc::RLIMIT_FSIZE,
                &lim,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    }

    /// Send SIGTERM and wait for the exit status (None if it had to be killed).
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc_kill(self.child.id() as i32, 15) };
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        None
    }

    /// Whatever the server wrote to stderr, up to its last MiB (waits for EOF: call after
    /// it exited).
    pub fn stderr(&mut self) -> String {
        if let Some(h) = self.log.take() {
            let _ = h.join();
        }
        self.stderr_so_far()
    }

    /// What the server has written to stderr so far (up to its last MiB or two).
    pub fn stderr_so_far(&self) -> String {
        let kept = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&kept).into_owned()
    }

    /// Wait until the server has written `needle` to stderr `times` times in all (at most
    /// [`TIMEOUT`]); whether it did.
    pub fn wait_stderr(&self, needle: &str, times: usize) -> bool {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if self.stderr_so_far().matches(needle).count() >= times {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(p) = &self.socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What a condition polled by [`poll_until`] returns: `true` or `Ok(())` when it holds,
/// else `false` or why not (the last reason is in the failure's message).
pub trait Holds {
    fn holds(self) -> Result<(), String>;
}

impl Holds for bool {
    fn holds(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("the condition is false".into())
        }
    }
}

impl Holds for Result<(), String> {
    fn holds(self) -> Result<(), String> {
        self
    }
}

/// Poll `f` until its condition holds, failing the test if it still does not after
/// `within` (a bound for a stuck server, far above what a slow machine needs, never the
/// time something is expected to take).
pub fn poll_until<H: Holds>(what: &str, within: Duration, mut f: impl FnMut() -> H) {
    let end = Instant::now() + within;
    loop {
        match f().holds() {
            Ok(()) => return,
            Err(why) => assert!(
                Instant::now() < end,
                "timed out after {within:?} waiting for {what}: {why}"
            ),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Poll until something accepts on `port`, or the child exits, or TIMEOUT passes.
/// The connection that found the server listening: close its sending side and wait (2 s
/// at most) for the server to close it too, so that the server has accepted and counted
/// it before the test's own connections. Dropped at once, it could still sit in the
/// accept queue when a test takes its baseline of `total_connections`, and be counted
/// after it. Nothing is sent, so TLS listeners see what they saw before: a client that
/// left before its handshake.
fn served<S: Read + ShutdownWrite>(mut s: S) {
    if s.shutdown_write() {
        let mut buf = [0u8; 256];
        while let Ok(1..) = s.read(&mut buf) {}
    }
}

/// Closing the sending side, with a read timeout, on either kind of stream.
trait ShutdownWrite {
    fn shutdown_write(&self) -> bool;
}

impl ShutdownWrite for TcpStream {
    fn shutdown_write(&self) -> bool {
        self.set_read_timeout(Some(Duration::from_secs(2))).is_ok()
            && self.shutdown(std::net::Shutdown::Write).is_ok()
    }
}

impl ShutdownWrite for std::os::unix::net::UnixStream {
    fn shutdown_write(&self) -> bool {
        self.set_read_timeout(Some(Duration::from_secs(2))).is_ok()
            && self.shutdown(std::net::Shutdown::Write).is_ok()
    }
}

fn wait_listening(child: &mut Child, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        // The listener must be the child's: another test's server that took the port
        // first would answer too, while this one fails to bind and exits (and the test
        // would later find the port closed when the other server stops).
        if listens(child.id(), port) {
            if let Ok(s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
                served(s);
                return Ok(());
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("exited with {status}: {err}"));
        }
        if Instant::now() >= deadline {
            return Err("timed out waiting for the port".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether process `pid` holds a socket listening on TCP port `port` (from /proc: the
/// listening sockets' inodes in /proc/net/tcp and tcp6, and the process's descriptors).
pub fn listens(pid: u32, port: u16) -> bool {
    let suffix = format!(":{port:04X}");
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st ... inode (the 10th field); 0A is LISTEN.
            if f.len() > 9 && f[1].ends_with(&suffix) && f[3] == "0A" {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

/// A blocking client connection with helpers for the text protocol.
pub struct Client {
    pub reader: BufReader<TcpStream>,
}

impl Client {
    pub fn new(stream: TcpStream) -> Client {
        stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        stream.set_write_timeout(Some(TIMEOUT)).expect("timeout");
        Client {
            reader: BufReader::new(stream),
        }
    }

    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    /// Send raw bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.reader.get_mut().write_all(bytes).expect("send");
    }

    /// Read one line including its `\r\n`.
    pub fn line(&mut self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = self.reader.read_until(b'\n', &mut buf) {
            panic!("read line: {e} (after {:?})", String::from_utf8_lossy(&buf));
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Read exactly `n` bytes.
    pub fn exact(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        self.reader.read_exact(&mut buf).expect("read exact");
        buf
    }

    /// Send a request and read one reply line.
    pub fn call(&mut self, request: &str) -> String {
        self.send(request.as_bytes());
        self.line()
    }

    /// Read lines until one equals `last` (e.g. "END\r\n"); returns them all joined.
    pub fn until(&mut self, last: &str) -> String {
        let mut out = String::new();
        loop {
            let l = self.line();
            if l.is_empty() {
                panic!("connection closed before {last:?}; got {out:?}");
            }
            out.push_str(&l);
            if l == last {
                return out;
            }
        }
    }

    /// True if the server closed the connection (EOF) within TIMEOUT.
    pub fn closed(&mut self) -> bool {
        let mut buf = [0u8; 4096];
        loop {
            match self.reader.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// `stats` as (name, value) pairs.
    pub fn stats(&mut self, group: &str) -> Vec<(String, String)> {
        let cmd = if group.is_empty() {
            "stats\r\n".to_string()
        } else {
            format!("stats {group}\r\n")
        };
        self.send(cmd.as_bytes());
        let text = self.until("END\r\n");
        text.lines()
            .filter_map(|l| {
                let mut it = l.splitn(3, ' ');
                match (it.next(), it.next(), it.next()) {
                    (Some("STAT"), Some(k), Some(v)) => Some((k.to_string(), v.to_string())),
                    _ => None,
                }
            })
            .collect()
    }

    /// One `stats` value by name.
    pub fn stat(&mut self, name: &str) -> Option<String> {
        self.stats("")
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

/// The `pid` that whatever answers on `addr` reports in `stats`, or None on any failure (the
/// other end may be another test's server that is going away and resets the connection).
fn probe_pid(addr: SocketAddr) -> Option<String> {
    stats_pid(TcpStream::connect(addr).ok()?).ok().flatten()
}

/// The process id the server on `stream` gives in `stats` (`STAT pid`): None when it gives
/// none (its stats end without one, or it refuses the command); an error when the exchange
/// fails (the connection was reset or closed).
pub fn stats_pid(stream: TcpStream) -> io::Result<Option<String>> {
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut reader = BufReader::new(stream);
    reader.get_mut().write_all(b"stats\r\n")?;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if line == "END\r\n" || line.starts_with("ERROR") {
            return Ok(None);
        }
        if let Some(pid) = line.strip_prefix("STAT pid ") {
            return Ok(Some(pid.trim_end().to_string()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Added by the integration tests (text_protocol.rs, connections.rs, cli.rs).

impl Server {
    /// Like [`Server::start`], but also checks that the process answering on the port is the
    /// one just started (`stats` `pid` equals the child's pid), retrying otherwise. Guards
    /// against two concurrently started servers being handed the same free port: the loser
    /// exits on EADDRINUSE, but its readiness probe may already have connected to the winner.
    pub fn start_verified(kind: Kind, args: &[&str]) -> Server {
        for _ in 0..5 {
            let mut s = Server::start(kind, args);
            let ok = probe_pid(s.addr()) == Some(s.child.id().to_string());
            if ok && s.child.try_wait().map(|st| st.is_none()).unwrap_or(false) {
                return s;
            }
            drop(s);
        }
        panic!("{kind:?}: could not start a server that answers on its own port");
    }

    /// [`Server::start_verified`] with UDP on (`-U`) as well, and its UDP port. A server
    /// that cannot bind the UDP port exits before it answers on TCP (kvcached and memcached
    /// both bind UDP first), so the start is verified, or tried again on other ports.
    pub fn start_udp(kind: Kind, args: &[&str]) -> (Server, u16) {
        for _ in 0..5 {
            let port = free_port();
            let p = port.to_string();
            let mut all = vec!["-U", &p];
            all.extend_from_slice(args);
            let mut s = Server::start_verified(kind, &all);
            if s.child.try_wait().map(|st| st.is_none()).unwrap_or(false) {
                return (s, port);
            }
            let _ = s.terminate();
        }
        panic!("{kind:?}: could not start with UDP");
    }

    /// The server's resident set size in KiB (`VmRSS` in /proc/<pid>/status).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }
}

impl Client {
    /// A client on a unix socket path (the same helpers work on it).
    pub fn unix(path: &Path) -> std::os::unix::net::UnixStream {
        let s = std::os::unix::net::UnixStream::connect(path).expect("connect unix socket");
        s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        s.set_write_timeout(Some(TIMEOUT)).expect("timeout");
        s
    }
}

/// A small deterministic generator (xorshift64*) for tests' random requests.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0 | 1;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A fresh directory for one test's files (a flash tier's, say), removed when dropped;
/// unique per process and call.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("kvcached-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("make a directory");
        TempDir(d)
    }

    /// `-o ext_path=` a flash file of `size` (memcached's suffixes) in this directory.
    pub fn ext_path(&self, size: &str) -> String {
        format!("ext_path={}:{size}", self.0.join("ext").display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
