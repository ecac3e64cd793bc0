//! A worker thread: its connections and event loop, the load phase, and the closed and open
//! loops that draw requests and keep them in flight.

use super::*;

pub(super) const TIMER: Token = Token(usize::MAX);

/// The first wait before reconnecting a failed connection; each failure in a row doubles it,
/// up to [`RECONNECT_MAX`].
pub(super) const RECONNECT_MIN: Duration = Duration::from_millis(10);
pub(super) const RECONNECT_MAX: Duration = Duration::from_millis(500);

/// The main loops stop when no connection has been up for this long.
pub(super) const GIVE_UP: Duration = Duration::from_secs(10);

/// Load-phase sets outstanding per UDP socket: a burst of datagrams larger than the server's
/// receive buffer is dropped by the kernel, so UDP keeps a smaller window than streams.
pub(super) const UDP_LOAD_WINDOW: usize = 8;

/// The load phase gives up when no set has been answered for this long (or five UDP
/// timeouts, if longer): a server that stops answering cannot hold it until `load_timeout`.
pub(super) const LOAD_STALL: Duration = Duration::from_secs(5);

/// What a worker thread returns: whether it was the probe, its counters, and the keys its
/// main phase sent requests for (a bit per key; empty when not tracked).
pub(super) type WorkerResult = Result<(bool, Stats, Vec<u64>), EngineError>;

/// A one-shot relative timer (timerfd), so the open loop can sleep with microsecond
/// precision (epoll's own timeout is in milliseconds).
pub(super) struct Timer {
    pub(super) fd: OwnedFd,
}

impl Timer {
    pub(super) fn new() -> std::io::Result<Timer> {
        // SAFETY: timerfd_create takes no pointers; a negative return is an error.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Timer { fd })
    }

    pub(super) fn arm(&self, after: Duration) {
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: spec is a valid itimerspec; the old-value pointer may be null.
        unsafe {
            libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut());
        }
    }

    pub(super) fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reading 8 bytes into an 8-byte buffer; EAGAIN is fine (non-blocking).
        unsafe {
            libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8);
        }
    }
}

pub(super) struct Worker {
    /// Thread number; the probe's is `threads` of the main configuration (its progress slot).
    pub(super) t: usize,
    pub(super) cfg: RunConfig,
    pub(super) shared: Arc<Shared>,
    pub(super) poll: Poll,
    pub(super) conns: Vec<Conn>,
    pub(super) by_server: Vec<Vec<usize>>,
    pub(super) rr: Vec<usize>,
    pub(super) rng: Xoshiro256PlusPlus,
    pub(super) chooser: KeyChooser,
    pub(super) stats: Stats,
    pub(super) keybuf: Vec<u8>,
    pub(super) keyends: Vec<usize>,
    pub(super) flagbuf: Vec<u8>,
    /// Connections with bytes waiting to be written.
    pub(super) dirty: Vec<usize>,
    pub(super) is_dirty: Vec<bool>,
    pub(super) max_reply: usize,
    pub(super) has_udp: bool,
    /// The servers, for reconnecting.
    pub(super) addrs: Vec<Endpoint>,
    /// Some connection is dead (waiting to reconnect) or still connecting.
    pub(super) unsettled: bool,
    /// The last time some connection was up.
    pub(super) last_up: Instant,
    // Window, set when the main phase starts.
    pub(super) run_start: Instant,
    pub(super) measure_start: Instant,
    pub(super) end: Instant,
    pub(super) quota: Option<u64>,
    pub(super) stopping: bool,
    // Load phase.
    pub(super) load_next: u64,
    /// The load phase's step between this thread's keys.
    pub(super) load_stride: u64,
    pub(super) load_deadline: Option<Instant>,
    /// A bit per key the main phase sent a request for (empty when not tracked).
    pub(super) touched: Vec<u64>,
}

/// Set key `k`'s bit (no-op when keys are not tracked).
pub(super) fn mark(touched: &mut [u64], k: u64) {
    if let Some(w) = touched.get_mut((k / 64) as usize) {
        *w |= 1 << (k % 64);
    }
}

impl Worker {
    pub(super) fn connect(
        t: usize,
        cfg: &RunConfig,
        shared: Arc<Shared>,
        addrs: &[Endpoint],
    ) -> Result<Worker, EngineError> {
        let poll = Poll::new().map_err(EngineError::Poll)?;
        let mut conns = Vec::new();
        let mut by_server = vec![Vec::new(); addrs.len()];
        for (s, addr) in addrs.iter().enumerate() {
            for _ in 0..cfg.conns {
                let mut sock = addr
                    .connect(cfg.connect_timeout, cfg.tls.as_ref())
                    .map_err(|source| EngineError::Connect {
                        server: addr.to_string(),
                        source,
                    })?;
                let idx = conns.len();
                poll.registry()
                    .register(
                        &mut sock,
                        Token(idx),
                        Interest::READABLE | Interest::WRITABLE,
                    )
                    .map_err(EngineError::Register)?;
                by_server[s].push(idx);
                conns.push(Conn {
                    sock,
                    server: s,
                    wbuf: Vec::with_capacity(READ_CHUNK),
                    wpos: 0,
                    rbuf: vec![0; READ_CHUNK],
                    rpos: 0,
                    rlen: 0,
                    inflight: VecDeque::with_capacity(cfg.depth.min(4096)),
                    aside: VecDeque::new(),
                    values: 0,
                    alive: true,
                    retry_at: None,
                    backoff: RECONNECT_MIN,
                    connecting_since: None,
                    udp: addr.is_udp().then(UdpState::new),
                    sent: 0,
                });
            }
        }
        let mut chooser = shared.chooser.clone();
        chooser
            .set_sequence_start((cfg.workload.keys / cfg.threads as u64).saturating_mul(t as u64));
        // The load phase: thread t of T sets keys t, t + T, ...; with a share i of N of the
        // key space, keys i + N·t, i + N·(t + T), ...
        let (mut load_next, mut load_stride) = (t as u64, cfg.threads as u64);
        if let Some((i, parts)) = cfg.key_share() {
            chooser.set_partition(i, parts)?;
            load_next = i + parts * t as u64;
            load_stride = parts * cfg.threads as u64;
        }
        let probe = t >= cfg.threads;
        let keys = cfg.workload.keys;
        let touched = if !probe
            && keys <= TRACK_KEYS_MAX
            && keys.saturating_mul(cfg.threads as u64) <= TRACK_BITS_TOTAL
        {
            vec![0u64; keys.div_ceil(64) as usize]
        } else {
            Vec::new()
        };
        let n = conns.len();
        let now = Instant::now();
        Ok(Worker {
            t,
            cfg: cfg.clone(),
            poll,
            conns,
            rr: vec![0; by_server.len()],
            by_server,
            rng: Xoshiro256PlusPlus::seed_from_u64(dist::mix64(cfg.stream_seed() ^ (t as u64 + 1))),
            chooser,
            stats: Stats::default(),
            keybuf: Vec::with_capacity(256),
            keyends: Vec::new(),
            flagbuf: Vec::with_capacity(32),
            dirty: Vec::with_capacity(n),
            is_dirty: vec![false; n],
            max_reply: cfg.workload.value_size.max.max(2 << 20) + 4096,
            has_udp: addrs.iter().any(Endpoint::is_udp),
            addrs: addrs.to_vec(),
            unsettled: false,
            last_up: now,
            measure_start: now,
            run_start: now,
            end: now,
            quota: None,
            stopping: false,
            load_next,
            load_stride,
            load_deadline: None,
            touched,
            shared,
        })
    }

    pub(super) fn inflight(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| c.alive)
            .map(|c| c.inflight.len())
            .sum()
    }

    /// Draw the next request: (kind, key).
    pub(super) fn draw(&mut self) -> (Op, u64) {
        let op = self.cfg.workload.mix.pick(dist::unit(&mut self.rng));
        let key = self.chooser.next(&mut self.rng);
        (op, key)
    }

    /// Draw a request whose key lives on `server` (bounded search; counted if it fails).
    pub(super) fn draw_for(&mut self, server: usize) -> (Op, u64) {
        let (op, mut key) = self.draw();
        if self.by_server.len() > 1 {
            let tries = 16 * self.by_server.len();
            let mut n = 0;
            while self.shared.server_of(key) != server && n < tries {
                key = self.chooser.next(&mut self.rng);
                n += 1;
            }
            if self.shared.server_of(key) != server {
                self.stats.misrouted += 1;
            }
        }
        (op, key)
    }

    pub(super) fn in_window(&self, t: Instant) -> bool {
        t >= self.measure_start && t < self.end
    }

    pub(super) fn quota_left(&self) -> bool {
        self.quota.is_none_or(|q| self.stats.issued < q)
    }

    /// Closed loop: one completion frees one slot on `c`.
    pub(super) fn refill_closed(&mut self, c: usize, now: Instant) {
        if self.stopping || now >= self.end || !self.quota_left() {
            return;
        }
        if self.conns[c].used_up(self.cfg.reconnect_interval) {
            // Reopened when its last reply is in (`complete`), then primed.
            return;
        }
        let measured = self.in_window(now);
        let (op, key) = self.draw_for(self.conns[c].server);
        if measured {
            self.stats.issued += 1;
        }
        self.send(c, op, key, now, measured, false);
    }

    /// Closed loop: `c` has room again (a reply came in, or a UDP request was given up). A
    /// window sends one request into the freed slot; a batch sends the next batch once every
    /// reply of the last is in ([`Pipeline::sends`]).
    pub(super) fn slot_freed(&mut self, c: usize, now: Instant) {
        match self.cfg.pipeline {
            Pipeline::Window => self.refill_closed(c, now),
            Pipeline::Batch => self.send_batch(c, now),
        }
    }

    /// Closed loop, batch: when nothing is outstanding on `c`, send `depth` requests at once,
    /// the look-aside sets held back from the last batch first. All take `now` as their
    /// start, so a request's latency runs from its batch's send to its reply (as
    /// memtier_benchmark measures).
    pub(super) fn send_batch(&mut self, c: usize, now: Instant) {
        let n = Pipeline::Batch.sends(self.cfg.depth, self.conns[c].inflight.len());
        for _ in 0..n {
            match self.conns[c].aside.pop_front() {
                // Not counted as issued, as a window's look-aside set is not.
                Some(key) if !self.stopping => {
                    let m = self.in_window(now);
                    self.send(c, Op::Set, key, now, m, false);
                }
                _ => self.refill_closed(c, now),
            }
        }
    }

    /// Closed loop: a connection's first requests (at the start, or once reopened): `depth`
    /// of them, as a window or as the first batch.
    pub(super) fn prime_closed(&mut self, c: usize, now: Instant) {
        match self.cfg.pipeline {
            Pipeline::Window => {
                for _ in 0..self.cfg.depth {
                    self.refill_closed(c, now);
                }
            }
            Pipeline::Batch => self.send_batch(c, now),
        }
    }

    // ----- phases ---------------------------------------------------------------------------

    pub(super) fn send_load(&mut self, c: usize, _now: Instant) {
        // This thread's keys are t, t + threads, t + 2·threads, ...; each goes to its server's
        // connection, so the load phase walks its keys and sends each where it belongs.
        let key = self.load_next;
        self.load_next += self.load_stride;
        let s = self.shared.server_of(key);
        let target = if self.conns[c].server == s && self.conns[c].usable() {
            c
        } else {
            match self.pick_conn(s, usize::MAX) {
                Some(x) => x,
                None => return,
            }
        };
        self.send(target, Op::Set, key, Instant::now(), false, true);
    }

    /// Set every key of this thread's share once (closed loop, 32 outstanding per stream
    /// connection, [`UDP_LOAD_WINDOW`] per UDP socket). A UDP set whose reply is lost is sent
    /// again. Bounded by `load_timeout`, and by [`LOAD_STALL`] without any reply.
    pub(super) fn load_phase(&mut self) {
        let deadline = Instant::now() + self.cfg.load_timeout;
        self.load_deadline = Some(deadline);
        let now = Instant::now();
        for c in 0..self.conns.len() {
            self.prime(c, now);
        }
        self.flush();
        let mut events = Events::with_capacity(1024);
        let stall = LOAD_STALL.max(self.cfg.udp_timeout * 5);
        let mut last_loaded = (self.stats.loaded, Instant::now());
        loop {
            let now = Instant::now();
            self.reconnect_due(now);
            // Done when nothing is outstanding, unless keys remain and a connection that
            // failed is about to come back for them.
            let waiting = self.unsettled && self.load_next < self.cfg.workload.keys;
            if now >= deadline || (self.inflight() == 0 && !waiting) {
                break;
            }
            if self.stats.loaded != last_loaded.0 {
                last_loaded = (self.stats.loaded, now);
            } else if now.saturating_duration_since(last_loaded.1) >= stall {
                break;
            }
            let timeout =
                self.reconnect_wait(now, (deadline - now).min(Duration::from_millis(100)));
            if self.poll.poll(&mut events, Some(timeout)).is_err() {
                // EINTR (a debugger attaching, a signal) is not a reason to stop loading.
                continue;
            }
            self.handle_events(&events);
            if self.has_udp {
                // A lost reply to the last sets sent has no later reply to reveal it.
                self.sweep_udp(Instant::now());
            }
            self.flush();
        }
        // Anything still outstanding is abandoned with its connection state intact: the
        // replies will be read (and ignored as load replies) in the main phase.
        self.load_deadline = None;
    }

    pub(super) fn handle_events(&mut self, events: &Events) {
        for ev in events.iter() {
            let tok = ev.token();
            if tok == TIMER {
                continue;
            }
            let c = tok.0;
            if c >= self.conns.len() {
                continue;
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                self.on_readable(c);
            }
            if ev.is_writable() && self.conns[c].alive && self.conns[c].connecting_since.is_some() {
                // A reconnection that completed: now it gets its work.
                self.conns[c].connecting_since = None;
                self.stats.reconnects += 1;
                self.prime(c, Instant::now());
            }
            if ev.is_writable() && !self.is_dirty[c] {
                self.is_dirty[c] = true;
                self.dirty.push(c);
            }
        }
    }

    pub(super) fn main_phase(&mut self) {
        let start = self
            .shared
            .start
            .get()
            .copied()
            .unwrap_or_else(Instant::now);
        self.measure_start = start + self.cfg.warmup;
        self.run_start = start;
        // Timeline intervals: 1 s, or longer so that a long run keeps at most MAX_INTERVALS.
        let span = self.cfg.warmup + self.cfg.duration + self.cfg.drain;
        let secs = span.as_secs_f64() / crate::stats::MAX_INTERVALS as f64;
        self.stats.interval_ns = (secs.ceil().max(1.0) * 1e9) as u64;
        self.end = if self.cfg.duration.is_zero() {
            // A request count with no duration: bound the run at an hour all the same.
            self.measure_start + Duration::from_secs(3600)
        } else {
            self.measure_start + self.cfg.duration
        };
        self.quota = self.cfg.requests.map(|n| {
            let per = n / self.cfg.threads as u64;
            per + u64::from((self.t as u64) < n % self.cfg.threads as u64)
        });
        // Sleep until just before the start, then spin: a long spin by every worker would
        // starve other threads of the machine (an agent's thread reading its `go`, say).
        let before = start
            .saturating_duration_since(Instant::now())
            .saturating_sub(Duration::from_millis(1));
        if !before.is_zero() {
            std::thread::sleep(before);
        }
        while Instant::now() < start {
            std::hint::spin_loop();
        }
        match self.cfg.load {
            LoadModel::Closed => self.closed_loop(),
            LoadModel::Open { rate, arrival } => self.open_loop(rate, arrival),
        }
    }

    pub(super) fn closed_loop(&mut self) {
        let now = Instant::now();
        for c in 0..self.conns.len() {
            self.prime_closed(c, now);
        }
        self.flush();
        let mut events = Events::with_capacity(1024);
        let mut stopped_at = None;
        loop {
            let now = Instant::now();
            if !self.stopping && (now >= self.end || !self.quota_left()) {
                self.stopping = true;
                stopped_at = Some(now);
            }
            if self.stopping && self.inflight() == 0 {
                break;
            }
            if !self.stopping {
                self.reconnect_due(now);
            }
            if self.all_down_too_long(now) {
                break;
            }
            let limit = if self.stopping {
                stopped_at.unwrap_or(now) + self.cfg.drain
            } else {
                self.end
            };
            if now >= limit {
                break;
            }
            let timeout = self.reconnect_wait(now, (limit - now).min(Duration::from_millis(100)));
            if self.poll.poll(&mut events, Some(timeout)).is_err() {
                break;
            }
            self.handle_events(&events);
            if self.has_udp {
                self.sweep_udp(Instant::now());
            }
            self.flush();
        }
        let stop = stopped_at.unwrap_or_else(Instant::now);
        self.stats.window_ns = stop
            .saturating_duration_since(self.measure_start)
            .as_nanos() as u64;
        self.stats.timeouts += self.inflight() as u64;
    }

    pub(super) fn open_loop(&mut self, rate: f64, arrival: Arrival) {
        let timer = match Timer::new() {
            Ok(t) => t,
            Err(_) => {
                self.stats.conn_failures += 1;
                return;
            }
        };
        if self
            .poll
            .registry()
            .register(
                &mut mio::unix::SourceFd(&timer.fd.as_raw_fd()),
                TIMER,
                Interest::READABLE,
            )
            .is_err()
        {
            return;
        }
        // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer; it only affects this thread.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
        }
        let start = self
            .shared
            .start
            .get()
            .copied()
            .unwrap_or_else(Instant::now);
        let gaps: Dist = arrival.gaps(rate / self.cfg.threads as f64);
        // Threads start at random phases so that fixed arrivals do not all coincide.
        let mut next_ns: f64 = gaps.sample(&mut self.rng) * dist::unit(&mut self.rng);
        let cap = self.cfg.depth;
        let late_ns = late_send_ns(self.cfg.slo);
        let mut events = Events::with_capacity(1024);
        let mut stopped_at: Option<Instant> = None;
        loop {
            let now = Instant::now();
            // Send everything that is due.
            if stopped_at.is_none() {
                loop {
                    let intended = start + Duration::from_nanos(next_ns as u64);
                    if intended >= self.end || !self.quota_left() {
                        self.stopping = true;
                        stopped_at = Some(now);
                        break;
                    }
                    if intended > now {
                        break;
                    }
                    next_ns += gaps.sample(&mut self.rng);
                    let measured = self.in_window(intended);
                    let (op, key) = self.draw();
                    let server = self.shared.server_of(key);
                    if measured {
                        self.stats.issued += 1;
                        let lag = now.saturating_duration_since(intended).as_nanos() as u64;
                        self.stats.send_lag.saturating_record(lag.max(1));
                        if lag > late_ns {
                            self.stats.late_sends += 1;
                        }
                    }
                    match self.pick_conn(server, cap) {
                        Some(c) => self.send(c, op, key, intended, measured, false),
                        None if self.server_down(server) => self.stats.unsent += 1,
                        None => self.stats.skipped += 1,
                    }
                }
            }
            self.flush();
            if stopped_at.is_none() {
                self.reconnect_due(now);
            }
            if self.all_down_too_long(now) {
                break;
            }
            let timeout = match stopped_at {
                Some(s) => {
                    if self.inflight() == 0 {
                        break;
                    }
                    let limit = s + self.cfg.drain;
                    if now >= limit {
                        break;
                    }
                    (limit - now).min(Duration::from_millis(100))
                }
                None => {
                    let intended = start + Duration::from_nanos(next_ns as u64);
                    let wait = intended.saturating_duration_since(Instant::now());
                    if wait < Duration::from_micros(20) {
                        Duration::ZERO
                    } else {
                        timer.arm(wait);
                        self.reconnect_wait(now, Duration::from_millis(100))
                    }
                }
            };
            if self.poll.poll(&mut events, Some(timeout)).is_err() {
                break;
            }
            for ev in events.iter() {
                if ev.token() == TIMER {
                    timer.clear();
                }
            }
            self.handle_events(&events);
            if self.has_udp {
                self.sweep_udp(Instant::now());
            }
        }
        self.stats.timeouts += self.inflight() as u64;
        let _ = self
            .poll
            .registry()
            .deregister(&mut mio::unix::SourceFd(&timer.fd.as_raw_fd()));
    }
}
