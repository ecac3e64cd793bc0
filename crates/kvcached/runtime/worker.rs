//! A worker: one thread, one event loop (mio's epoll, or an io_uring ring with the mio
//! poller inside it: `-o io`, `ring.rs`), the connections it accepted.
//!
//! The loop accepts from every listener, drives connections whose sockets are ready, runs
//! connections that yielded (they used their `-R` share while more input was waiting), and
//! once a second closes connections idle longer than `-o idle_timeout`.
//!
//! Accepting stops (memcached's `listen_disabled_num`) when the process runs out of file
//! descriptors (retried every 10 ms) or, with `-o no_maxconns_fast`, while `-c` connections
//! are open (resumed by the worker that closes one). With `maxconns_fast` (the default) a
//! connection over `-c` is accepted, told `ERROR Too many open connections` and closed.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};

use crate::exec::session::{BufferLimit, Ctx};
use crate::runtime::conn::{Conn, Drive, Sock, Stream};
use crate::runtime::listener::Listener;
use crate::runtime::ring::{Completion, Op, Reactor, RingSock};
use crate::runtime::spares::Spares;
use crate::setup::config::IoChoice;
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

impl MioListener {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            MioListener::Tcp(l, _) => l,
            MioListener::Unix(l) => l,
        }
    }

    fn fd(&self) -> i32 {
        match self {
            MioListener::Tcp(l, _) => l.as_raw_fd(),
            MioListener::Unix(l) => l.as_raw_fd(),
        }
    }

    /// The local end's name (`stats conns`' `listen_addr`) that every connection accepted
    /// here shares: `None` for a TCP wildcard address, where each connection's own address
    /// (`getsockname`) tells which of the machine's addresses it came to.
    fn shared_name(&self) -> Option<String> {
        match self {
            MioListener::Tcp(l, _) => l
                .local_addr()
                .ok()
                .filter(|a| !a.ip().is_unspecified())
                .map(|a| format!("tcp:{a}")),
            MioListener::Unix(l) => {
                let path = l
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
                    .unwrap_or_default();
                Some(format!("unix:{path}"))
            }
        }
    }
}

/// What waits for flash reads: a connection's request, or a datagram set aside.
enum Waiter {
    Conn(usize),
    Datagram(Box<crate::runtime::udp::Parked>),
}

pub struct Worker {
    index: usize,
    shared: Arc<Shared>,
    stats: Arc<WorkerStats>,
    poll: Poll,
    waker: Arc<Waker>,
    listeners: Vec<MioListener>,
    /// Per listener, the local name its connections share ([`MioListener::shared_name`]).
    listen_names: Vec<Option<String>>,
    /// Listeners accept through the ring (`ring.rs`: io_uring, `maxconns_fast`, not
    /// `KVCACHED_ACCEPT_MULTISHOT=0`), and whether each one's multishot accept is in flight.
    ring_accept: bool,
    /// Flash reads go through the ring (under io_uring, unless `KVCACHED_FLASH_RING=0`).
    ring_flash: bool,
    accept_armed: Vec<bool>,
    /// The open-file limit the ring's accepts were armed under (the kernel keeps the one in
    /// force at arming).
    accept_limit: Option<u64>,
    /// The ring's accepts were armed again after a pause: unless one fails for want of
    /// descriptors in the next turn, accepting has resumed.
    accept_resume: bool,
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
    /// The io_uring runtime's ring (`-o io=uring`), made on the worker's thread.
    ring: Option<Reactor>,
    /// The generation of the next connection under io_uring.
    next_gen: u32,
    /// Input buffers kept for the next large request.
    spares: Spares,
    /// The last ticket given to a connection waiting for flash reads.
    flash_tickets: u64,
    /// Per ticket of a connection or datagram waiting for flash reads: which one, and how
    /// many reads (a read through the ring, or a job of the I/O threads) it still waits for.
    flash_waits: HashMap<u64, (Waiter, usize)>,
    /// Datagrams whose flash reads are done, answered at the end of the turn.
    udp_due: Vec<crate::runtime::udp::Parked>,
    /// Flash reads in flight in the ring, by number: the ticket each is for and the read.
    ring_reads: HashMap<usize, (u64, kvstore::FlashIo)>,
}

impl Worker {
    pub fn new(
        index: usize,
        shared: Arc<Shared>,
        stats: Arc<WorkerStats>,
        listeners: Vec<Listener>,
        udp_socks: Vec<mio::net::UdpSocket>,
    ) -> io::Result<Worker> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let mut mine = Vec::with_capacity(listeners.len());
        for (i, l) in listeners.into_iter().enumerate() {
            let mut ml = match l {
                Listener::Tcp(l, tls) => MioListener::Tcp(mio::net::TcpListener::from_std(l), tls),
                Listener::Unix(l) => MioListener::Unix(mio::net::UnixListener::from_std(l)),
            };
            poll.registry()
                .register(ml.source(), Token(i), Interest::READABLE)?;
            mine.push(ml);
        }
        let listen_names = mine.iter().map(MioListener::shared_name).collect();
        let accept_armed = vec![false; mine.len()];
        let mut udp = Vec::with_capacity(udp_socks.len());
        for (i, mut sock) in udp_socks.into_iter().enumerate() {
            poll.registry()
                .register(&mut sock, Token(mine.len() + i), Interest::READABLE)?;
            // `stats conns` lists it, as memcached lists each worker's UDP socket.
            let bound = sock
                .local_addr()
                .map_or_else(|_| "?".into(), |a| a.to_string());
            let info = Arc::new(ConnInfo::new(format!("udp:{bound}"), String::new()));
            info.last_cmd.store(shared.clock.now(), Ordering::Relaxed);
            shared.register(sock.as_raw_fd(), ConnKind::Udp, info);
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
            listen_names,
            ring_accept: false,
            ring_flash: false,
            accept_armed,
            accept_limit: None,
            accept_resume: false,
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
            ring: None,
            next_gen: 0,
            spares: Spares::new(buffer_limit),
            flash_tickets: 0,
            flash_waits: HashMap::new(),
            udp_due: Vec::new(),
            ring_reads: HashMap::new(),
        })
    }

    pub fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    /// The token of connection slot 0.
    fn conn_base(&self) -> usize {
        self.listeners.len() + self.udp.len()
    }

    /// Set up the worker's I/O runtime, wait at `ready` until every worker has, then serve
    /// until shutdown. No worker serves before all are set up, so a server that answers
    /// has every worker's ring (and descriptor) in place: a worker that started late must
    /// not open its ring after the first clients came and went.
    pub fn run(mut self, ready: &std::sync::Barrier) {
        if self.shared.config.io == IoChoice::Uring {
            let sqpoll = self.shared.config.io_sqpoll;
            let cpus = &self.shared.config.io_sqpoll_cpus;
            let sq_cpu = cpus.get(self.index % cpus.len().max(1)).copied();
            match Reactor::new(sqpoll, sq_cpu) {
                Ok(r) => {
                    if sqpoll.is_some() && !r.sqpoll() {
                        let on = sq_cpu.map(|c| format!(" on CPU {c}")).unwrap_or_default();
                        tracing::warn!(
                            "worker {}: the kernel refused an io_uring with SQPOLL{on}; \
                             running without",
                            self.index
                        );
                    }
                    self.ring = Some(r)
                }
                Err(e) => {
                    tracing::warn!(
                        "worker {}: io_uring could not be set up ({e}); using epoll",
                        self.index
                    );
                    self.shared.epoll_fallbacks.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        ready.wait();
        if self.ring.is_some() {
            self.ring_accept =
                self.shared.config.maxconns_fast && crate::runtime::ring::multishot_accepts();
            self.ring_flash = crate::runtime::ring::flash_reads();
            self.run_ring()
        } else {
            self.run_epoll()
        }
    }

    /// The worker's loop under io_uring (`runtime/ring.rs`): one `io_uring_enter` a turn
    /// submits every connection's receives and sends and waits for completions; the mio
    /// poller (listeners, UDP, the waker) is one of the things it waits for.
    fn run_ring(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut scratch = vec![0u8; SCRATCH];
        let mut udp = crate::runtime::udp::Buffers::new();
        let mut batch: Vec<Completion> = Vec::with_capacity(256);
        let mut last_sweep = Instant::now();
        let idle = self.shared.config.idle_timeout;
        let handshake = self.handshake_timeout();
        let epoll = self.poll.as_raw_fd();
        if self.ring_accept {
            // The listeners leave the poller: the ring accepts for them.
            for l in &mut self.listeners {
                let _ = self.poll.registry().deregister(l.source());
            }
            self.arm_accepts();
        }
        while !self.shared.shutting_down() {
            let timeout = self.timeout(idle.is_some() || handshake.is_some());
            let Some(ring) = self.ring.as_mut() else {
                break;
            };
            let waited = ring.arm_poll(epoll).and_then(|()| ring.wait(timeout));
            match waited {
                Ok(done) => {
                    batch.clear();
                    batch.extend_from_slice(done);
                }
                Err(e) => {
                    tracing::warn!("worker {}: io_uring wait failed: {e}", self.index);
                    break;
                }
            }
            self.now = self.shared.clock.now();
            let (ahead, n) = self.prefetch_buckets(&batch);
            // ahead[next] is the first single read after this completion, and the records of
            // ahead[..loaded] are loading: each read's record starts loading (its bucket came
            // in a while ago) once the read before it is handled, so the completions in
            // between hide the miss.
            let (mut next, mut loaded) = (0, 0);
            for (i, c) in batch.iter().enumerate() {
                while next < n && ahead[next].0 <= i {
                    next += 1;
                }
                if next < n && loaded <= next {
                    self.shared.engine.prefetch_records(ahead[next].1);
                    loaded = next + 1;
                }
                match c.op {
                    Op::Poll => {
                        if !c.more() {
                            if let Some(r) = self.ring.as_mut() {
                                r.poll_disarmed();
                            }
                        }
                        match self.poll.poll(&mut events, Some(Duration::ZERO)) {
                            Ok(()) => {
                                for event in events.iter() {
                                    self.event(event, &mut scratch, &mut udp);
                                }
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => {
                                tracing::warn!("worker {}: poll failed: {e}", self.index);
                            }
                        }
                    }
                    Op::Recv | Op::Send => self.completed(c, &mut scratch),
                    Op::Accept => self.ring_accepted(c),
                    Op::Read => self.ring_read_done(c, &mut scratch),
                    Op::None => {}
                }
            }
            self.turn_end(&mut scratch, &mut udp, idle, handshake, &mut last_sweep);
        }
        self.close_all();
    }

    /// Start loading the index buckets of the batch's single reads, across its connections,
    /// before any of them runs: with one request in flight per connection each receive
    /// brings one `get`, and taken together their misses overlap instead of following one
    /// another (MICA's batched prefetch, across connections; `run_ring` then loads each
    /// one's record while the completion before it is handled). Returns (completion index,
    /// key hash) of up to 32 of them. A receive of several requests is left to its
    /// connection, which prefetches a pipelined batch itself (`Conn::execute`). Only hints.
    fn prefetch_buckets(&self, batch: &[Completion]) -> ([(usize, u64); 32], usize) {
        let mut ahead = [(0usize, 0u64); 32];
        let mut n = 0;
        let Some(ring) = self.ring.as_ref() else {
            return (ahead, n);
        };
        for (i, c) in batch.iter().enumerate() {
            if n == ahead.len() {
                break;
            }
            let Some(key) = ring.received(c).and_then(kvproto::text::single_read_key) else {
                continue;
            };
            let text = self
                .conns
                .get(c.slot)
                .and_then(|x| x.as_ref())
                .is_some_and(|conn| {
                    conn.stream.ring_gen() == Some(c.gen) && conn.receives_text_requests()
                });
            if text {
                ahead[n] = (i, self.shared.engine.prefetch_bucket(key));
                n += 1;
            }
        }
        (ahead, n)
    }

    /// A receive or a send completed: update the connection, drive it if that lets it go
    /// on, and queue what it needs next.
    fn completed(&mut self, c: &Completion, scratch: &mut Vec<u8>) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let conn = self
            .conns
            .get_mut(c.slot)
            .and_then(|x| x.as_mut())
            .filter(|conn| conn.stream.ring_gen() == Some(c.gen));
        let Some(conn) = conn else {
            ring.complete(c, None);
            return;
        };
        let Some(sock) = conn.stream.ring_mut() else {
            return;
        };
        let go_on = ring.complete(c, Some(sock));
        let failed = sock.failed();
        if go_on && (c.op == Op::Recv || failed || conn.waits_for_output()) {
            self.drive(c.slot, scratch);
            return;
        }
        let armed = conn.stream.ring_mut().map(|sock| ring.arm(sock, c.slot));
        if c.op == Op::Send {
            conn.refresh_state();
        }
        if matches!(armed, Some(Err(_))) {
            self.close(c.slot);
        }
    }

    /// How long a TLS handshake may take (`-o ssl_handshake_timeout`, with `-Z`): handshakes
    /// that never finish are closed by the once-a-second sweep that kicks idle connections.
    fn handshake_timeout(&self) -> Option<Duration> {
        if self.shared.tls.is_some() {
            self.shared.config.ssl.handshake_timeout
        } else {
            None
        }
    }

    /// Close every connection (the worker is stopping).
    fn close_all(&mut self) {
        for slot in 0..self.conns.len() {
            self.close_for(slot, Some("shutdown"));
        }
    }

    /// How long the next wait may last.
    fn timeout(&self, sweeps: bool) -> Option<Duration> {
        let mut timeout = if !self.ready.is_empty() || !self.udp_ready.is_empty() {
            Some(Duration::ZERO)
        } else if sweeps {
            Some(Duration::from_secs(1))
        } else {
            None
        };
        if let Some(at) = self.accept_retry {
            let wait = at.saturating_duration_since(Instant::now());
            timeout = Some(timeout.map_or(wait, |t| t.min(wait)));
        }
        if self.accept_resume {
            timeout = Some(timeout.map_or(ACCEPT_RETRY, |t| t.min(ACCEPT_RETRY)));
        }
        timeout
    }

    /// One readiness event from mio.
    fn event(
        &mut self,
        event: &mio::event::Event,
        scratch: &mut Vec<u8>,
        udp: &mut crate::runtime::udp::Buffers,
    ) {
        let token = event.token();
        if token == WAKER {
            // Connections whose flash reads are done go on.
            self.flash_done(scratch);
            // Watchers with new lines (or a shutdown, seen by the loop's test).
            for slot in self.watching.clone() {
                self.drive(slot, scratch);
            }
            return;
        }
        if token.0 < self.listeners.len() {
            self.accept(token.0);
        } else if token.0 < self.conn_base() {
            self.serve_udp(token.0 - self.listeners.len(), udp);
        } else {
            let slot = token.0 - self.conn_base();
            if event.is_read_closed() || event.is_error() {
                if let Some(Some(conn)) = self.conns.get_mut(slot) {
                    conn.hangup = true;
                }
            }
            self.drive(slot, scratch);
        }
    }

    /// Drive again the connections whose flash reads the I/O threads finished (a
    /// connection closed meanwhile, its slot perhaps reused, has another ticket).
    fn flash_done(&mut self, scratch: &mut Vec<u8>) {
        let shared = Arc::clone(&self.shared);
        let Some(io) = &shared.flash_io else {
            return;
        };
        for (_, ticket) in io.take_done(self.index) {
            self.flash_step(ticket, scratch);
        }
    }

    /// One of the reads ticket `ticket` waits for is done: once the last one is, its
    /// connection goes on (a connection closed meanwhile, its slot perhaps reused, has
    /// another ticket: counted as aborted).
    fn flash_step(&mut self, ticket: u64, scratch: &mut Vec<u8>) {
        let Some((_, left)) = self.flash_waits.get_mut(&ticket) else {
            return;
        };
        *left = left.saturating_sub(1);
        if *left > 0 {
            return;
        }
        let Some((waiter, _)) = self.flash_waits.remove(&ticket) else {
            return;
        };
        let slot = match waiter {
            Waiter::Conn(slot) => slot,
            Waiter::Datagram(p) => {
                self.udp_due.push(*p);
                return;
            }
        };
        match self.conns.get_mut(slot) {
            Some(Some(conn)) if conn.session.flash_wait == Some(ticket) => {
                conn.session.flash_wait = None;
                self.drive(slot, scratch);
            }
            _ => {
                if let Some(io) = &self.shared.flash_io {
                    io.note_aborted();
                }
            }
        }
    }

    /// Start the flash reads a connection's request or a datagram (`waiter`) needs before
    /// it runs (again): in the worker's ring, each its own read, under io_uring; else (or
    /// should the ring refuse one) as one job of the I/O threads (`state/flash.rs`). A read
    /// with nothing to read (its page taken back) needs no wait; with none to wait for,
    /// the connection goes on, or the datagram is answered, at the end of the turn.
    fn start_flash_reads(&mut self, waiter: Waiter, reads: Vec<kvstore::FlashRead>) {
        let shared = Arc::clone(&self.shared);
        let Some(io) = &shared.flash_io else {
            if let Waiter::Datagram(p) = waiter {
                self.udp_due.push(*p);
            }
            return;
        };
        let slot = match &waiter {
            Waiter::Conn(slot) => *slot,
            Waiter::Datagram(_) => usize::MAX,
        };
        self.flash_tickets += 1;
        let ticket = self.flash_tickets;
        let mut left = 0;
        let mut threads = Vec::new();
        if let Some(ring) = self.ring.as_mut().filter(|_| self.ring_flash) {
            for r in reads {
                let Some(read) = shared.engine.flash_read_start(&r) else {
                    continue;
                };
                match ring.read_at(read.span.fd, read.span.at, read.span.len) {
                    Ok(id) => {
                        self.ring_reads.insert(id, (ticket, read));
                        io.note_ring_read();
                        left += 1;
                    }
                    Err(_) => threads.push(r),
                }
            }
        } else {
            threads = reads;
        }
        if !threads.is_empty() {
            io.submit(crate::state::flash::Job {
                reads: threads,
                worker: self.index,
                slot,
                ticket,
            });
            left += 1;
        }
        match waiter {
            Waiter::Datagram(p) if left == 0 => self.udp_due.push(*p),
            Waiter::Datagram(p) => {
                self.flash_waits.insert(ticket, (Waiter::Datagram(p), left));
            }
            Waiter::Conn(slot) => {
                let Some(Some(conn)) = self.conns.get_mut(slot) else {
                    return;
                };
                if left == 0 {
                    self.ready.push_back(slot);
                    return;
                }
                conn.session.flash_wait = Some(ticket);
                self.flash_waits.insert(ticket, (Waiter::Conn(slot), left));
            }
        }
    }

    /// A flash read in the ring completed: its bytes checked (`LogEngine::flash_read_end`),
    /// a longer read queued if the record needs one, else one read less to wait for.
    fn ring_read_done(&mut self, c: &Completion, scratch: &mut Vec<u8>) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let Some(mut buf) = ring.read_done(c) else {
            return;
        };
        let Some((ticket, read)) = self.ring_reads.remove(&c.slot) else {
            ring.spare_read(buf);
            return;
        };
        let got = match usize::try_from(c.result()) {
            Ok(n) => {
                let raw = buf.get(read.span.len);
                Ok(&raw[..n.min(raw.len())])
            }
            Err(_) => Err(io::Error::from_raw_os_error(-c.result())),
        };
        let next = self.shared.engine.flash_read_end(&read, got);
        ring.spare_read(buf);
        if let Some(next) = next {
            if let Ok(id) = ring.read_at(next.span.fd, next.span.at, next.span.len) {
                self.ring_reads.insert(id, (ticket, next));
                return;
            }
            // The ring refused the longer read: the re-run reads it on an I/O thread.
        }
        self.flash_step(ticket, scratch);
    }

    /// What every turn of the loop ends with: UDP sockets and connections with more to do,
    /// accepting again after a pause, and the once-a-second sweeps.
    fn turn_end(
        &mut self,
        scratch: &mut Vec<u8>,
        udp: &mut crate::runtime::udp::Buffers,
        idle: Option<Duration>,
        handshake: Option<Duration>,
        last_sweep: &mut Instant,
    ) {
        // UDP sockets left with datagrams waiting get another turn (edge-triggered
        // readiness would not report them again).
        for index in std::mem::take(&mut self.udp_ready) {
            self.serve_udp(index, udp);
        }
        self.answer_due(udp);
        // Connections that yielded get another turn after this round of events.
        for _ in 0..self.ready.len() {
            if let Some(slot) = self.ready.pop_front() {
                self.drive(slot, scratch);
            }
        }
        if self.accept_resume && self.accept_retry.is_none() {
            // The accepts armed last turn after a pause did not fail: accepting again.
            self.accept_resume = false;
            self.shared.set_accepting(true);
        }
        if self.accept_retry.is_some_and(|at| Instant::now() >= at) {
            self.accept_retry = None;
            self.accept_all();
            // Under epoll the retry's `accept4` said at once whether there is room; the
            // ring's accepts say so in their completions, by the next turn.
            self.accept_resume = self.ring_accept;
        } else if self.ring_accept && self.accept_retry.is_none() {
            // A listener's accept that ended (an error, a connection that went away before
            // it was taken) starts again.
            self.arm_accepts();
        }
        if (idle.is_some() || handshake.is_some()) && last_sweep.elapsed() >= Duration::from_secs(1)
        {
            *last_sweep = Instant::now();
            if let Some(limit) = idle {
                self.close_idle(limit);
            }
            if let Some(limit) = handshake {
                self.close_stalled_handshakes(limit);
            }
        }
    }

    /// The worker's loop under epoll (mio).
    fn run_epoll(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut scratch = vec![0u8; SCRATCH];
        // Receive slots and replies of the UDP sockets (allocated on first use).
        let mut udp = crate::runtime::udp::Buffers::new();
        let mut last_sweep = Instant::now();
        let idle = self.shared.config.idle_timeout;
        let handshake = self.handshake_timeout();
        while !self.shared.shutting_down() {
            let timeout = self.timeout(idle.is_some() || handshake.is_some());
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::warn!("worker {}: poll failed: {e}", self.index);
                break;
            }
            self.now = self.shared.clock.now();
            for event in events.iter() {
                self.event(event, &mut scratch, &mut udp);
            }
            self.turn_end(&mut scratch, &mut udp, idle, handshake, &mut last_sweep);
        }
        self.close_all();
    }

    /// The context of a request on UDP socket `sock` (no connection, no buffer limit).
    fn udp_ctx<'s>(&'s self, sock: &mio::net::UdpSocket, scratch: &'s mut Vec<u8>) -> Ctx<'s> {
        Ctx {
            shared: &self.shared,
            stats: &self.stats,
            scratch,
            now: self.now,
            buffers: BufferLimit::default(),
            worker: self.index,
            cfd: sock.as_raw_fd(),
        }
    }

    fn serve_udp(&mut self, index: usize, buffers: &mut crate::runtime::udp::Buffers) {
        let Some(sock) = self.udp.get(index) else {
            return;
        };
        let mut scratch = Vec::new();
        let mut ctx = self.udp_ctx(sock, &mut scratch);
        if crate::runtime::udp::serve(sock, &mut ctx, buffers) && !self.udp_ready.contains(&index) {
            self.udp_ready.push(index);
        }
        // Datagrams whose gets need flash reads wait for them (`udp::Parked`).
        for mut p in std::mem::take(&mut buffers.parked) {
            p.socket = index;
            let reads = std::mem::take(&mut p.reads);
            self.start_flash_reads(Waiter::Datagram(Box::new(p)), reads);
        }
    }

    /// Answer the datagrams whose flash reads are done.
    fn answer_due(&mut self, buffers: &mut crate::runtime::udp::Buffers) {
        for p in std::mem::take(&mut self.udp_due) {
            let Some(sock) = self.udp.get(p.socket) else {
                continue;
            };
            let mut scratch = Vec::new();
            let mut ctx = self.udp_ctx(sock, &mut scratch);
            crate::runtime::udp::answer(sock, &mut ctx, buffers, p);
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
        let drive = conn.drive(&mut ctx, &mut self.spares);
        if !conn.session.flash_reads.is_empty() {
            // A get needs flash reads.
            let reads = std::mem::take(&mut conn.session.flash_reads);
            self.start_flash_reads(Waiter::Conn(slot), reads);
        }
        self.account(slot);
        let Some(conn) = self.conns.get_mut(slot).and_then(|c| c.as_mut()) else {
            return;
        };
        if conn.session.watch.is_some() && !self.watching.contains(&slot) {
            self.watching.push(slot);
        }
        if drive != Drive::Close {
            if let Some(sock) = conn.stream.ring_mut() {
                // io_uring: queue the connection's next receive and send.
                let armed = self.ring.as_mut().map(|r| r.arm(sock, slot));
                if !matches!(armed, Some(Ok(()))) {
                    self.close(slot);
                    return;
                }
                match drive {
                    Drive::Yield => self.ready.push_back(slot),
                    Drive::Wait | Drive::Close => {}
                }
                return;
            }
            let want = conn.session.pending() > 0 || conn.stream.owes();
            if want != conn.write_interest {
                let interest = if want {
                    Interest::READABLE | Interest::WRITABLE
                } else {
                    Interest::READABLE
                };
                let token = Token(self.listeners.len() + self.udp.len() + slot);
                let Some(source) = conn.stream.source() else {
                    return;
                };
                if self
                    .poll
                    .registry()
                    .reregister(source, token, interest)
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
        if self.ring_accept {
            self.arm_accepts();
            return;
        }
        for i in 0..self.listeners.len() {
            self.accept(i);
        }
    }

    /// Arm the multishot accept of every listener that has none in flight.
    fn arm_accepts(&mut self) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        if self.accept_armed.contains(&false) {
            self.accept_limit = crate::setup::daemon::open_file_limit();
        }
        for (i, l) in self.listeners.iter().enumerate() {
            if self.accept_armed.get(i) != Some(&false) {
                continue;
            }
            match ring.arm_accept(l.fd(), i) {
                Ok(()) => self.accept_armed[i] = true,
                Err(e) => {
                    // The ring would not take it now: try again after a pause.
                    tracing::info!("accept failed: {e}; pausing");
                    self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
            }
        }
    }

    /// An armed accept takes descriptors up to the open-file limit of when it was armed.
    /// If the limit changed since (`prlimit` on the running server), the accepts end and
    /// are armed again under the new one, so a lowered limit pauses accepting as it does
    /// under epoll. Checked after each accepted connection (one `getrlimit`), not on a
    /// timer that would wake an idle worker. A lowered limit lets in what the accepts armed
    /// before it take until the worker sees their completions: one connection each when
    /// the worker keeps up, more when the kernel accepts a queue of them first (under
    /// SQPOLL, with the worker not running). A raised one is found when the old one runs
    /// out (EMFILE pauses, and the retry arms under the new limit).
    fn check_accept_limit(&mut self) {
        let now = crate::setup::daemon::open_file_limit();
        if now == self.accept_limit {
            return;
        }
        self.accept_limit = now;
        if let Some(ring) = self.ring.as_mut() {
            for (i, armed) in self.accept_armed.iter().enumerate() {
                if *armed {
                    ring.cancel_accept(i);
                }
            }
        }
    }

    /// A listener's multishot accept completed: a new connection, or the accept failed.
    fn ring_accepted(&mut self, c: &Completion) {
        let index = c.slot;
        if index >= self.listeners.len() {
            return;
        }
        if !c.more() {
            // It ended: armed again at the end of the turn, or after a pause.
            self.accept_armed[index] = false;
        }
        let res = c.result();
        if res < 0 {
            if res == -libc::ECANCELED {
                return;
            }
            if self.accept_failed(&io::Error::from_raw_os_error(-res)) {
                self.accept_resume = false;
                if c.more() {
                    if let Some(ring) = self.ring.as_mut() {
                        ring.cancel_accept(index);
                    }
                }
            }
            return;
        }
        // SAFETY: the kernel made this descriptor for this accept; nothing else owns it.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(res) };
        self.check_accept_limit();
        // (The ring's accepts make blocking sockets, and do not tell the peer's address.)
        if self.open(index, fd, None, true, false) && self.accept_retry.is_none() {
            self.shared.set_accepting(true);
        }
    }

    /// Make the connection for a socket that listener `index` accepted, by `accept4` or
    /// through the ring (the one way from an accepted socket to a connection), and admit
    /// it. `peer`: its address, where the accept told it; `blocking`: the socket is
    /// blocking already (the ring's accepts); `reserved` as for [`Worker::admit`]. False
    /// when no connection could be made (the error is the server's, not the peer's, and
    /// logged; a reserved place is given back).
    fn open(
        &mut self,
        index: usize,
        fd: std::os::fd::OwnedFd,
        peer: Option<std::net::SocketAddr>,
        blocking: bool,
        reserved: bool,
    ) -> bool {
        match self.connection(index, fd, peer, blocking) {
            Ok((stream, addr, listen)) => {
                self.admit(stream, addr, listen, reserved);
                true
            }
            Err(e) => {
                if reserved {
                    self.shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
                }
                tracing::info!("accept failed: {e}");
                false
            }
        }
    }

    /// The stream of a socket listener `index` accepted, under this worker's runtime (an
    /// io_uring socket, or one mio polls; a TLS session over it on a TLS listener), and its
    /// names for `stats conns`: the peer's address and the local end's.
    fn connection(
        &mut self,
        index: usize,
        fd: std::os::fd::OwnedFd,
        peer: Option<std::net::SocketAddr>,
        blocking: bool,
    ) -> io::Result<(Stream, String, String)> {
        let listen = self.listen_name(index, &fd);
        let ring = if self.ring.is_some() {
            self.next_gen = self.next_gen.wrapping_add(1);
            Some(self.next_gen)
        } else {
            None
        };
        let ring_sock = |fd, gen| match blocking {
            true => Ok(RingSock::new(fd, gen)),
            false => ring_sock(fd, gen),
        };
        match self.listeners.get(index) {
            Some(MioListener::Tcp(_, tls)) => {
                // A peer that reset the connection in the backlog has no address any more
                // (ENOTCONN); the connection is still taken and counted, as `accept4`
                // takes it, and its first receive ends it.
                let addr = peer
                    .or_else(|| {
                        socket2::SockRef::from(&fd)
                            .peer_addr()
                            .ok()
                            .and_then(|a| a.as_socket())
                    })
                    .map_or_else(|| "tcp:".to_string(), |a| format!("tcp:{a}"));
                // (TCP_NODELAY comes from the listener.)
                let sock = match ring {
                    Some(gen) => Sock::Ring(ring_sock(fd, gen)?),
                    None => Sock::Mio(mio::net::TcpStream::from(fd)),
                };
                Ok((self.tcp_stream(sock, *tls)?, addr, listen))
            }
            Some(MioListener::Unix(_)) => {
                let stream = match ring {
                    Some(gen) => Stream::Ring(ring_sock(fd, gen)?),
                    None => Stream::Unix(mio::net::UnixStream::from(fd)),
                };
                Ok((stream, listen.clone(), listen))
            }
            None => Err(io::Error::other("no such listener")),
        }
    }

    /// An accept failed. For want of descriptors: stop accepting, leave connections in the
    /// backlog and try again shortly, as memcached does (edge-triggered readiness will not
    /// remind us), and return true. Otherwise (a connection that went away in the backlog,
    /// ECONNABORTED, and the like) log it and return false.
    fn accept_failed(&mut self, e: &io::Error) -> bool {
        if out_of_descriptors(e) {
            tracing::info!("accept failed: {e}; pausing");
            self.shared.set_accepting(false);
            self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
            true
        } else {
            tracing::info!("accept failed: {e}");
            false
        }
    }

    /// The local end's name for a connection accepted on listener `index`: the listener's
    /// own, or the connection's where the listener is a wildcard address.
    fn listen_name(&self, index: usize, sock: &impl std::os::fd::AsFd) -> String {
        if let Some(Some(name)) = self.listen_names.get(index) {
            return name.clone();
        }
        socket2::SockRef::from(sock)
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| format!("tcp:{a}"))
            .unwrap_or_default()
    }

    fn accept(&mut self, index: usize) {
        let shared = self.shared.clone();
        let config = &shared.config;
        // With `no_maxconns_fast`, a connection's place under `-c` is reserved before the
        // accept, so workers racing for the last place cannot take more than `-c` between
        // them (the one that loses leaves the connection in the backlog).
        let reserve = !config.maxconns_fast;
        // One more look at the backlog after a race with another worker (below).
        let mut retried = false;
        loop {
            if reserve {
                let count = shared.curr_conns.fetch_add(1, Ordering::AcqRel) + 1;
                if count > config.max_connections {
                    shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
                    // Leave connections in the backlog until one closes (`close` resumes).
                    shared.set_accepting(false);
                    // The place that was missing may have been another worker's, held for a
                    // moment for a connection that was not there: this worker took the
                    // readiness of the one that came, so it looks again if there is room.
                    // (With the other worker's check after its accept, one of the two sees
                    // the other's change: see the `WouldBlock` case.)
                    std::sync::atomic::fence(Ordering::SeqCst);
                    if !retried && self.room() {
                        retried = true;
                        continue;
                    }
                    return;
                }
            }
            let accepted = match &self.listeners[index] {
                MioListener::Tcp(l, _) => l.accept().map(|(s, addr)| (s.into(), Some(addr))),
                MioListener::Unix(l) => l.accept().map(|(s, _)| (s.into(), None)),
            };
            match accepted {
                Ok((fd, peer)) => {
                    if !self.open(index, fd, peer, false, reserve) {
                        continue;
                    }
                    // Accepting resumes once there is room (always, with maxconns_fast, where
                    // a connection over -c is told so and closed). It stops only when a
                    // connection finds no room (above), as memcached stops when one arrives
                    // at the limit: another worker's place reserved for a moment must not
                    // count as a stop.
                    if !reserve || self.room() {
                        shared.set_accepting(true);
                    }
                }
                Err(e) => {
                    if reserve {
                        shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
                    }
                    match e.kind() {
                        io::ErrorKind::WouldBlock => {
                            // While this worker held a place, another may have found the
                            // server full and stopped, leaving a connection that came
                            // meanwhile in the backlog with its readiness taken: look once
                            // more.
                            std::sync::atomic::fence(Ordering::SeqCst);
                            if reserve && !retried && !shared.accepting() {
                                retried = true;
                                continue;
                            }
                            if self.accept_retry.is_none() && (!reserve || self.room()) {
                                shared.set_accepting(true);
                            }
                            return;
                        }
                        io::ErrorKind::Interrupted => continue,
                        _ if self.accept_failed(&e) => return,
                        _ => continue,
                    }
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
            const TOO_MANY: &[u8] = b"ERROR Too many open connections\r\n";
            let _ = match &mut stream {
                Stream::Tcp(s) => s.write(TOO_MANY),
                Stream::Unix(s) => s.write(TOO_MANY),
                Stream::Ring(s) => send_now(s.fd(), TOO_MANY),
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
        if let Some(source) = stream.source() {
            if let Err(e) = self
                .poll
                .registry()
                .register(source, token, Interest::READABLE)
            {
                tracing::info!("register failed: {e}");
                shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
                self.free.push(slot);
                return;
            }
        }
        let info = Arc::new(ConnInfo::new(addr, listen));
        info.last_cmd.store(self.now, Ordering::Relaxed);
        let fd = stream.fd();
        shared.register(fd, ConnKind::Client, info.clone());
        tracing::debug!(fd, "<{fd} new client connection");
        watch_conn(shared, &info, fd, None);
        let mut conn = Conn::new(stream, info, fd);
        // io_uring: the first receive.
        let armed = match (conn.stream.ring_mut(), self.ring.as_mut()) {
            (Some(sock), Some(ring)) => ring.arm(sock, slot).is_ok(),
            _ => true,
        };
        self.conns[slot] = Some(conn);
        if !armed {
            self.close(slot);
        }
    }

    /// The stream of a connection accepted on a TCP listener: the socket itself, or a TLS
    /// session over it on a TLS listener (`tls`). (An error here is the server's, not the
    /// peer's: the connection is dropped and the error logged.)
    fn tcp_stream(&self, sock: Sock, tls: Option<kvtls::server::Peer>) -> io::Result<Stream> {
        let Some(peer) = tls else {
            return Ok(match sock {
                Sock::Mio(s) => Stream::Tcp(s),
                Sock::Ring(s) => Stream::Ring(s),
            });
        };
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
        let fd = conn.stream.fd();
        let reason = reason.unwrap_or_else(|| conn.close_reason());
        watch_conn(&self.shared, &conn.info, fd, Some(reason));
        if let Some(source) = conn.stream.source() {
            let _ = self.poll.registry().deregister(source);
        }
        self.buffers_held -= conn.accounted;
        self.stats.buffers.update(&mut conn.gauged, 0, 0);
        // A large input buffer serves the worker's next large request.
        let input = conn.take_input(&mut self.spares);
        self.spares.put(input, &self.stats);
        self.shared.unregister(fd);
        self.shared.curr_conns.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!(fd, "<{fd} connection closed.");
        self.free.push(slot);
        // The socket closes here, when `conn` drops; under io_uring, once the kernel's
        // operations on it have completed.
        let Conn { stream, .. } = conn;
        if let (Some(ring), Some(sock)) = (self.ring.as_mut(), stream.into_ring()) {
            ring.retire(slot, sock);
        }
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
            tracing::debug!("closing idle connection");
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
            tracing::info!("closing a connection whose TLS handshake stalled");
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

/// An accepted socket for the io_uring runtime: blocking (the ring waits for it, and a
/// non-blocking descriptor could have an operation fail with `EAGAIN`), with its generation.
fn ring_sock(fd: std::os::fd::OwnedFd, gen: u32) -> io::Result<RingSock> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function owns.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(RingSock::new(fd, gen))
}

/// Write a short line to a socket at once, never blocking (a connection refused over `-c`
/// under io_uring, whose descriptor is blocking).
fn send_now(fd: i32, line: &[u8]) -> io::Result<usize> {
    // SAFETY: `line` is valid for its length; `fd` is an open socket this worker owns.
    let n = unsafe {
        libc::send(
            fd,
            line.as_ptr().cast(),
            line.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
