//! A worker: one thread, one mio event loop, the connections it accepted.
//!
//! The loop accepts from every listener, drives connections whose sockets are ready, runs
//! connections that yielded (they used their `-R` share while more input was waiting), and
//! once a second closes connections idle longer than `-o idle_timeout`.
//!
//! Accepting stops (memcached's `listen_disabled_num`) when the process runs out of file
//! descriptors (retried every 10 ms) or, with `-o no_maxconns_fast`, while `-c` connections
//! are open (resumed by the worker that closes one). With `maxconns_fast` (the default) a
//! connection over `-c` is accepted, told `ERROR Too many open connections` and closed.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};

use crate::exec::session::{BufferLimit, Ctx};
use crate::runtime::conn::{Conn, Drive, Stream};
use crate::runtime::listener::Listener;
use crate::state::registry::{ConnInfo, ConnKind};
use crate::state::shared::Shared;
use crate::state::stats::WorkerStats;

/// Size of the read buffer each worker shares among its connections.
pub const SCRATCH: usize = 64 * 1024;

/// How long accepting pauses after the process ran out of file descriptors.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

const WAKER: Token = Token(usize::MAX);

enum MioListener {
    /// A TCP listener and its TLS policy (`None`: plaintext).
    Tcp(mio::net::TcpListener, Option<kvtls::server::Peer>),
    Unix(mio::net::UnixListener),
}

pub struct Worker {
    index: usize,
    shared: Arc<Shared>,
    stats: Arc<WorkerStats>,
    poll: Poll,
    waker: Arc<Waker>,
    listeners: Vec<MioListener>,
    /// This worker's own UDP sockets (SO_REUSEPORT), tokens after the listeners'.
    udp: Vec<mio::net::UdpSocket>,
    /// UDP sockets that may hold more datagrams than one turn took (by index in `udp`).
    udp_ready: Vec<usize>,
    /// Connections by slot; a slot's token is `conn_base() + slot`.
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    ready: VecDeque<usize>,
    /// Slots of the connections that are `watch`ers (driven when the waker fires).
    watching: Vec<usize>,
    /// Accepting failed for want of descriptors: try again at this time.
    accept_retry: Option<Instant>,
    /// This worker's share of `-o read_buf_mem_limit` (0: none) and what its connections'
    /// buffers hold (the sum of their `accounted`).
    buffer_limit: usize,
    buffers_held: usize,
    /// Server time for this turn of the loop.
    now: u32,
}

impl Worker {
    pub fn new(
        index: usize,
        shared: Arc<Shared>,
        stats: Arc<WorkerStats>,
        listeners: Vec<Listener>,
        udp_addrs: &[std::net::SocketAddr],
    ) -> io::Result<Worker> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let mut mine = Vec::with_capacity(listeners.len());
        for (i, l) in listeners.into_iter().enumerate() {
            let mut ml = match l {
                Listener::Tcp(l, tls) => MioListener::Tcp(mio::net::TcpListener::from_std(l), tls),
                Listener::Unix(l) => MioListener::Unix(mio::net::UnixListener::from_std(l)),
            };
            let source: &mut dyn mio::event::Source = match &mut ml {
                MioListener::Tcp(l, _) => l,
                MioListener::Unix(l) => l,
            };
            poll.registry()
                .register(source, Token(i), Interest::READABLE)?;
            mine.push(ml);
        }
        let mut udp = Vec::with_capacity(udp_addrs.len());
        for (i, addr) in udp_addrs.iter().enumerate() {
            let mut sock = crate::runtime::udp::bind(*addr)?;
            poll.registry()
                .register(&mut sock, Token(mine.len() + i), Interest::READABLE)?;
            udp.push(sock);
        }
        let threads = shared.config.threads.max(1);
        let buffer_limit = shared.config.read_buf_mem_limit / threads;
        // The scratch buffer is this worker's one fixed read buffer.
        stats.buffers.set_scratch(SCRATCH);
        Ok(Worker {
            index,
            shared,
            stats,
            poll,
            waker,
            listeners: mine,
            udp,
            udp_ready: Vec::new(),
            conns: Vec::new(),
            free: Vec::new(),
            ready: VecDeque::new(),
            watching: Vec::new(),
            accept_retry: None,
            buffer_limit,
            buffers_held: 0,
            now: 0,
        })
    }

    pub fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    /// The token of connection slot 0.
    fn conn_base(&self) -> usize {
        self.listeners.len() + self.udp.len()
    }

    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut scratch = vec![0u8; SCRATCH];
        // Receive slots and replies of the UDP sockets (allocated on first use).
        let mut udp = crate::runtime::udp::Buffers::new();
        let mut last_sweep = Instant::now();
        let idle = self.shared.config.idle_timeout;
        // TLS handshakes that never finish are closed by the same once-a-second sweep.
        let handshake = if self.shared.tls.is_some() {
            self.shared.config.ssl.handshake_timeout
        } else {
            None
        };
        while !self.shared.shutting_down() {
            let mut timeout = if !self.ready.is_empty() || !self.udp_ready.is_empty() {
                Some(Duration::ZERO)
            } else if idle.is_some() || handshake.is_some() {
                Some(Duration::from_secs(1))
            } else {
                None
            };
            if let Some(at) = self.accept_retry {
                let wait = at.saturating_duration_since(Instant::now());
                timeout = Some(timeout.map_or(wait, |t| t.min(wait)));
            }
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                self.shared
                    .log(0, || format!("worker {}: poll failed: {e}", self.index));
                break;
            }
            self.now = self.shared.clock.now();
            for event in events.iter() {
                let token = event.token();
                if token == WAKER {
                    // Watchers with new lines (or a shutdown, seen by the loop's test).
                    for slot in self.watching.clone() {
                        self.drive(slot, &mut scratch);
                    }
                    continue;
                }
                if token.0 < self.listeners.len() {
                    self.accept(token.0);
                } else if token.0 < self.conn_base() {
                    self.serve_udp(token.0 - self.listeners.len(), &mut udp);
                } else {
                    let slot = token.0 - self.conn_base();
                    if event.is_read_closed() || event.is_error() {
                        if let Some(Some(conn)) = self.conns.get_mut(slot) {
                            conn.hangup = true;
                        }
                    }
                    self.drive(slot, &mut scratch);
                }
            }
            // UDP sockets left with datagrams waiting get another turn (edge-triggered
            // readiness would not report them again).
            for index in std::mem::take(&mut self.udp_ready) {
                self.serve_udp(index, &mut udp);
            }
            // Connections that yielded get another turn after this round of events.
            for _ in 0..self.ready.len() {
                if let Some(slot) = self.ready.pop_front() {
                    self.drive(slot, &mut scratch);
                }
            }
            if self.accept_retry.is_some_and(|at| Instant::now() >= at) {
                self.accept_retry = None;
                self.accept_all();
            }
            if (idle.is_some() || handshake.is_some())
                && last_sweep.elapsed() >= Duration::from_secs(1)
            {
                last_sweep = Instant::now();
                if let Some(limit) = idle {
                    self.close_idle(limit);
                }
                if let Some(limit) = handshake {
                    self.close_stalled_handshakes(limit);
                }
            }
        }
        let slots: Vec<usize> = (0..self.conns.len()).collect();
        for slot in slots {
            self.close_for(slot, Some("shutdown"));
        }
    }

    fn serve_udp(&mut self, index: usize, buffers: &mut crate::runtime::udp::Buffers) {
        let Some(sock) = self.udp.get(index) else {
            return;
        };
        let mut ctx = Ctx {
            shared: &self.shared,
            stats: &self.stats,
            scratch: &mut Vec::new(),
            now: self.now,
            buffers: BufferLimit::default(),
            worker: self.index,
            cfd: sock.as_raw_fd(),
        };
        if crate::runtime::udp::serve(sock, &mut ctx, buffers) && !self.udp_ready.contains(&index) {
            self.udp_ready.push(index);
        }
    }

    fn drive(&mut self, slot: usize, scratch: &mut Vec<u8>) {
        let Some(conn) = self.conns.get_mut(slot).and_then(|c| c.as_mut()) else {
            return;
        };
        let mut ctx = Ctx {
            shared: &self.shared,
            stats: &self.stats,
            scratch,
            now: self.now,
            buffers: BufferLimit {
                limit: self.buffer_limit,
                others: self.buffers_held - conn.accounted,
            },
            worker: self.index,
            cfd: conn.fd,
        };
        let drive = conn.drive(&mut ctx);
        self.account(slot);
        let Some(conn) = self.conns.get_mut(slot).and_then(|c| c.as_mut()) else {
            return;
        };
        if conn.session.watch.is_some() && !self.watching.contains(&slot) {
            self.watching.push(slot);
        }
        if drive != Drive::Close {
            let want = conn.session.pending() > 0 || conn.stream.owes();
            if want != conn.write_interest {
                let interest = if want {
                    Interest::READABLE | Interest::WRITABLE
                } else {
                    Interest::READABLE
                };
                let token = Token(self.listeners.len() + self.udp.len() + slot);
                if self
                    .poll
                    .registry()
                    .reregister(conn.stream.source(), token, interest)
                    .is_err()
                {
                    self.close(slot);
                    return;
                }
                conn.write_interest = want;
            }
        }
        match drive {
            Drive::Wait => {}
            Drive::Yield => self.ready.push_back(slot),
            Drive::Close => self.close(slot),
        }
    }

    /// Bring the worker's buffer accounting up to date with a connection's buffers.
    fn account(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(|c| c.as_mut()) else {
            return;
        };
        let (input, output) = conn.buffer_split();
        let now = input + output;
        if now != conn.accounted {
            self.buffers_held = self.buffers_held - conn.accounted + now;
            conn.accounted = now;
        }
        self.stats.buffers.update(&mut conn.gauged, input, output);
    }

    /// Accept on every listener (after a pause).
    fn accept_all(&mut self) {
        for i in 0..self.listeners.len() {
            self.accept(i);
        }
    }

    fn accept(&mut self, index: usize) {
        let shared = self.shared.clone();
        let config = &shared.config;
        // With `no_maxconns_fast`, a connection's place under `-c` is reserved before the
        // accept, so workers racing for the last place cannot take more than `-c` between
        // them (the one that loses leaves the connection in the backlog).
        let reserve = !config.maxconns_fast;
        loop {
            if reserve {
                let count = shared.curr_conns.fetch_add(1, Ordering::AcqRel) + 1;
                if count > config.max_connections {
                    shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
                    // Leave connections in the backlog until one closes (`close` resumes).
                    shared.set_accepting(false);
                    return;
                }
            }
            let accepted = match &self.listeners[index] {
                MioListener::Tcp(l, tls) => l.accept().and_then(|(s, addr)| {
                    let _ = s.set_nodelay(true);
                    let listen = s
                        .local_addr()
                        .map(|a| format!("tcp:{a}"))
                        .unwrap_or_default();
                    let stream = match tls {
                        None => Stream::Tcp(s),
                        Some(peer) => self.tls_stream(s, *peer)?,
                    };
                    Ok((stream, format!("tcp:{addr}"), listen))
                }),
                MioListener::Unix(l) => l.accept().map(|(s, _)| {
                    let path = s
                        .local_addr()
                        .ok()
                        .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
                        .unwrap_or_default();
                    (
                        Stream::Unix(s),
                        format!("unix:{path}"),
                        format!("unix:{path}"),
                    )
                }),
            };
            if reserve && accepted.is_err() {
                shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
            }
            match accepted {
                Ok((stream, addr, listen)) => {
                    self.admit(stream, addr, listen, reserve);
                    // Accepting resumes once there is room (always, with maxconns_fast, where
                    // a connection over -c is told so and closed). It stops only when a
                    // connection finds no room (above), as memcached stops when one arrives
                    // at the limit: another worker's place reserved for a moment must not
                    // count as a stop.
                    if !reserve || self.room() {
                        shared.set_accepting(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.accept_retry.is_none() && (!reserve || self.room()) {
                        shared.set_accepting(true);
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if out_of_descriptors(&e) => {
                    // Like memcached: stop accepting, leave the connection in the backlog
                    // and try again shortly (edge-triggered readiness will not remind us).
                    shared.log(1, || format!("accept failed: {e}; pausing"));
                    shared.set_accepting(false);
                    self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
                Err(e) => {
                    // A connection that went away in the backlog (ECONNABORTED) and the like.
                    shared.log(1, || format!("accept failed: {e}"));
                    continue;
                }
            }
        }
    }

    /// Whether a connection fits under `-c` now.
    fn room(&self) -> bool {
        self.shared.curr_conns.load(Ordering::Acquire) < self.shared.config.max_connections
    }

    /// Take an accepted connection; `reserved`: its place in `curr_connections` was taken
    /// before the accept.
    fn admit(&mut self, mut stream: Stream, addr: String, listen: String, reserved: bool) {
        let shared = &self.shared;
        let count = if reserved {
            shared.curr_conns.load(Ordering::Acquire)
        } else {
            shared.curr_conns.fetch_add(1, Ordering::AcqRel) + 1
        };
        if !reserved && count > shared.config.max_connections {
            shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
            shared.rejected_conns.fetch_add(1, Ordering::Relaxed);
            // Best effort: a fresh socket's send buffer takes this short line. A TLS client
            // could not read it before a handshake: it is just closed.
            let _ = match &mut stream {
                Stream::Tcp(s) => s.write(b"ERROR Too many open connections\r\n"),
                Stream::Unix(s) => s.write(b"ERROR Too many open connections\r\n"),
                Stream::Tls(_) => Ok(0),
            };
            return;
        }
        shared.total_conns.fetch_add(1, Ordering::Relaxed);
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        let token = Token(self.conn_base() + slot);
        if let Err(e) = self
            .poll
            .registry()
            .register(stream.source(), token, Interest::READABLE)
        {
            shared.log(1, || format!("register failed: {e}"));
            shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
            self.free.push(slot);
            return;
        }
        let info = Arc::new(ConnInfo::new(addr, listen));
        info.last_cmd.store(self.now, Ordering::Relaxed);
        let fd = stream_fd(&stream);
        shared.register(fd, ConnKind::Client, info.clone());
        tracing::debug!(fd, "<{fd} new client connection");
        watch_conn(shared, &info, fd, None);
        self.conns[slot] = Some(Conn::new(stream, info, fd));
    }

    /// A TLS session for a connection accepted on a TLS listener. (An error here is the
    /// server's, not the peer's: the connection is dropped and the error logged.)
    fn tls_stream(
        &self,
        sock: mio::net::TcpStream,
        peer: kvtls::server::Peer,
    ) -> io::Result<Stream> {
        let tls = self
            .shared
            .tls
            .as_ref()
            .ok_or_else(|| io::Error::other("a TLS listener without TLS settings"))?;
        let session = tls.accept(peer).map_err(io::Error::other)?;
        let mut stream = kvtls::TlsStream::new(session, sock);
        stream.set_write_chunk(self.shared.config.ssl.wbuf_size);
        Ok(Stream::Tls(Box::new(stream)))
    }

    fn close(&mut self, slot: usize) {
        self.close_for(slot, None);
    }

    /// Close a connection; `reason` for `watch connevents` (by default the connection's own).
    fn close_for(&mut self, slot: usize, reason: Option<&'static str>) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(|c| c.take()) else {
            return;
        };
        self.watching.retain(|&s| s != slot);
        let fd = stream_fd(&conn.stream);
        let reason = reason.unwrap_or_else(|| conn.close_reason());
        watch_conn(&self.shared, &conn.info, fd, Some(reason));
        let _ = self.poll.registry().deregister(conn.stream.source());
        self.buffers_held -= conn.accounted;
        self.stats.buffers.update(&mut conn.gauged, 0, 0);
        self.shared.unregister(fd);
        self.shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!(fd, "<{fd} connection closed.");
        self.free.push(slot);
        // The socket closes here, when `conn` drops.
        drop(conn);
        if !self.shared.accepting() && self.accept_retry.is_none() {
            // A slot is free again: take what waits in the backlog.
            self.accept_all();
        }
    }

    /// The slots of the connections for which `f` holds (for the once-a-second sweeps).
    fn slots_where(&self, f: impl Fn(&Conn) -> bool) -> Vec<usize> {
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().is_some_and(&f).then_some(i))
            .collect()
    }

    /// Close connections that have waited for a command longer than `limit` (memcached's
    /// idle kick: only connections waiting for a command line, never one mid-request or
    /// blocked writing).
    fn close_idle(&mut self, limit: Duration) {
        let limit = limit.as_secs();
        let now = u64::from(self.now);
        let idle = self.slots_where(|c| {
            let last = u64::from(c.info.last_cmd.load(Ordering::Relaxed));
            c.info.state().kickable() && now.saturating_sub(last) > limit
        });
        for slot in idle {
            self.stats.idle_kicks.incr();
            self.shared.log(2, || "closing idle connection".into());
            self.close_for(slot, Some("idle_timeout"));
        }
    }

    /// Close connections whose TLS handshake has not completed within `limit` (a client
    /// that connects to a TLS port and never finishes, or never starts, its handshake).
    fn close_stalled_handshakes(&mut self, limit: Duration) {
        let stalled =
            self.slots_where(|c| c.stream.handshaking() && c.accepted_at.elapsed() >= limit);
        for slot in stalled {
            if let Some(tls) = &self.shared.tls {
                tls.counters
                    .handshake_timeouts
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.shared.log(1, || {
                "closing a connection whose TLS handshake stalled".into()
            });
            self.close(slot);
        }
    }
}

/// Whether an accept failed for want of descriptors (or of the memory for one).
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// A `watch connevents` line for a connection opened (`closed: None`) or closed, as
/// memcached writes it: `type=conn_new rip=IP rport=PORT transport=tcp cfd=FD`, and for a
/// close `reason=normal|error|idle_timeout|shutdown` before `cfd`.
fn watch_conn(shared: &Shared, info: &ConnInfo, fd: i32, closed: Option<&str>) {
    use std::io::Write as _;
    if !shared.watchers.wants(crate::state::watch::CONNEVENTS) {
        return;
    }
    let (transport, rip, rport) = match info.addr.strip_prefix("tcp:") {
        Some(a) => match a.rsplit_once(':') {
            Some((ip, port)) => (
                "tcp",
                ip.trim_start_matches('[').trim_end_matches(']'),
                port,
            ),
            None => ("tcp", a, "0"),
        },
        None => ("local", info.addr.strip_prefix("unix:").unwrap_or(""), "0"),
    };
    shared
        .watchers
        .emit(crate::state::watch::CONNEVENTS, |line| {
            let kind = if closed.is_some() {
                "conn_close"
            } else {
                "conn_new"
            };
            let _ = write!(
                line,
                "type={kind} rip={rip} rport={rport} transport={transport}"
            );
            if let Some(reason) = closed {
                let _ = write!(line, " reason={reason}");
            }
            let _ = write!(line, " cfd={fd}");
        });
}

fn stream_fd(s: &Stream) -> i32 {
    match s {
        Stream::Tcp(s) => s.as_raw_fd(),
        Stream::Unix(s) => s.as_raw_fd(),
        Stream::Tls(s) => s.socket().as_raw_fd(),
    }
}
