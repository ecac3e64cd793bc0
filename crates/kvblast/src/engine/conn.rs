//! Per-connection I/O: connecting and reconnecting, queueing and flushing requests, and
//! picking a connection for the next request.

use super::*;

pub(super) const READ_CHUNK: usize = 64 * 1024;

/// A request sent and not yet answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pub(super) op: Op,
    pub(super) key: u64,
    pub(super) nkeys: u32,
    /// Latency is measured from here: the intended send time (open loop) or the time the
    /// request was written (closed loop).
    pub(super) t0: Instant,
    pub(super) measured: bool,
    pub(super) load: bool,
    /// How it was sent, so which parser reads its reply.
    pub(super) wire: Wire,
    /// UDP request id (0 on streams).
    pub(super) id: u16,
}

pub(super) struct Conn {
    pub(super) sock: Stream,
    pub(super) server: usize,
    pub(super) wbuf: Vec<u8>,
    pub(super) wpos: usize,
    pub(super) rbuf: Vec<u8>,
    pub(super) rpos: usize,
    pub(super) rlen: usize,
    pub(super) inflight: VecDeque<Pending>,
    /// Closed loop, batch: keys whose look-aside set goes out with the next batch.
    pub(super) aside: VecDeque<u64>,
    /// `VALUE` items seen so far for the get at the front of `inflight`.
    pub(super) values: u32,
    pub(super) alive: bool,
    /// A dead connection's next reconnection attempt.
    pub(super) retry_at: Option<Instant>,
    /// The wait before the next attempt after a failure: [`RECONNECT_MIN`], doubled by each
    /// failure up to [`RECONNECT_MAX`], back to the minimum after a reply.
    pub(super) backoff: Duration,
    /// A reconnection in progress (a non-blocking TCP connect): when it began.
    pub(super) connecting_since: Option<Instant>,
    /// Datagram state, for a UDP "connection" (a connected UDP socket).
    pub(super) udp: Option<Box<UdpState>>,
    /// Requests sent since it was opened (load-phase sets not counted), for
    /// `--reconnect-interval`.
    pub(super) sent: u64,
}

/// UDP framing: each request is one datagram with an 8-byte header; a reply may come in
/// several messages (memcached 1.6 sends each `VALUE` of a get, and the `END`, as separate
/// messages, each numbered from sequence 0 under the request's id). Replies come back in
/// request order on loopback, so the reply bytes of the request at the front of `inflight`
/// are gathered in the connection's read buffer; a datagram for a later request means the
/// front one's reply was lost.
pub(super) struct UdpState {
    /// End offset in `wbuf` of each datagram not yet sent.
    pub(super) ends: VecDeque<usize>,
    pub(super) next_id: u16,
    /// The request id whose reply bytes are in the read buffer, and the last sequence number.
    pub(super) cur: Option<(u16, u16)>,
    pub(super) scratch: Vec<u8>,
}

impl Conn {
    /// Up, and not still connecting.
    pub(super) fn usable(&self) -> bool {
        self.alive && self.connecting_since.is_none()
    }

    /// Whether it has sent its `--reconnect-interval` requests: it takes no more, and is
    /// closed and opened again once their replies are in.
    pub(super) fn used_up(&self, interval: Option<u64>) -> bool {
        interval.is_some_and(|n| self.sent >= n)
    }
}

impl UdpState {
    pub(super) fn new() -> Box<UdpState> {
        Box::new(UdpState {
            ends: VecDeque::new(),
            next_id: 0,
            cur: None,
            scratch: vec![0; 65_536],
        })
    }
}

impl Worker {
    // ----- composing ------------------------------------------------------------------------

    /// Write one request for `key` (and, for a multiget, more keys of the same server) on
    /// connection `c`.
    pub(super) fn send(
        &mut self,
        c: usize,
        op: Op,
        key: u64,
        t0: Instant,
        measured: bool,
        load: bool,
    ) {
        let shared = Arc::clone(&self.shared);
        let w = &self.cfg.workload;
        if !load {
            mark(&mut self.touched, key);
        }
        let conn = &mut self.conns[c];
        if !load {
            conn.sent += 1;
        }
        self.keybuf.clear();
        shared.keyspace.write_key(key, &mut self.keybuf);
        let mut nkeys = 1u32;
        let wire = match self.cfg.protocol {
            Protocol::Text => Wire::Text,
            Protocol::Binary => Wire::Binary,
            // Meta has no touch, gat or plain incr of its own here: those stay classic.
            Protocol::Meta if matches!(op, Op::Get | Op::Set | Op::Delete) => Wire::Meta,
            Protocol::Meta => Wire::Text,
        };
        let exptime = if w.exptime_max > w.exptime {
            w.exptime + dist::below(&mut self.rng, (w.exptime_max - w.exptime) as u64 + 1) as i64
        } else {
            w.exptime
        };
        // Binary expiration times are unsigned 32-bit; negative means "already expired".
        let bin_exptime = u32::try_from(exptime.max(0)).unwrap_or(u32::MAX);
        // UDP: this request's datagram starts with the frame header (request id, sequence 0,
        // one datagram, reserved).
        let dgram_start = conn.wbuf.len();
        let id = match &mut conn.udp {
            Some(u) => {
                let id = u.next_id;
                u.next_id = id.wrapping_add(1);
                conn.wbuf.extend_from_slice(&id.to_be_bytes());
                conn.wbuf.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
                id
            }
            None => 0,
        };
        let wb = &mut conn.wbuf;
        let kb = &self.keybuf;
        match op {
            Op::Get if w.multiget > 1 && !load => {
                self.keyends.clear();
                self.keyends.push(self.keybuf.len());
                let server = conn.server;
                let tries = 8 * self.by_server.len();
                for _ in 1..w.multiget {
                    // Keys of one multiget must live on one server.
                    let mut found = None;
                    for _ in 0..tries.max(1) {
                        let k = self.chooser.next(&mut self.rng);
                        if shared.server_of(k) == server {
                            found = Some(k);
                            break;
                        }
                    }
                    if let Some(k) = found {
                        mark(&mut self.touched, k);
                        self.keybuf.push(b' ');
                        shared.keyspace.write_key(k, &mut self.keybuf);
                        self.keyends.push(self.keybuf.len());
                        nkeys += 1;
                    }
                }
                let wb = &mut conn.wbuf;
                let keys = self.keyends.iter().scan(0usize, |start, &end| {
                    let k = &self.keybuf[*start..end];
                    *start = end + 1;
                    Some(k)
                });
                match wire {
                    // Quiet gets (misses say nothing), then a no-op that ends the batch.
                    Wire::Meta => {
                        for k in keys {
                            proto::meta_get(wb, k, b"v q");
                        }
                        proto::meta_noop(wb);
                    }
                    Wire::Binary => {
                        for k in keys {
                            proto::binary::get(wb, k, true, 0);
                        }
                        proto::binary::noop(wb, 0);
                    }
                    // The keys are already space-separated: one slice is the whole list.
                    Wire::Text => {
                        proto::multiget(wb, false, [&self.keybuf[..]]);
                    }
                }
            }
            Op::Get => match wire {
                Wire::Text => proto::get(wb, kb),
                Wire::Meta => proto::meta_get(wb, kb, b"v"),
                Wire::Binary => proto::binary::get(wb, kb, false, 0),
            },
            Op::Set => {
                let len = if w.value_per_key {
                    w.value_size.quantile(dist::unit_of_key(key))
                } else if load {
                    w.value_size.quantile(dist::unit_open0(&mut self.rng))
                } else {
                    w.value_size.sample(&mut self.rng)
                };
                let data = &shared.value[..len.min(shared.value.len())];
                match wire {
                    Wire::Text => proto::set(wb, kb, 0, exptime, data, false),
                    Wire::Meta => {
                        self.flagbuf.clear();
                        let _ = write!(self.flagbuf, "T{exptime}");
                        proto::meta_set(wb, kb, data, &self.flagbuf);
                    }
                    Wire::Binary => proto::binary::set(wb, kb, 0, bin_exptime, data, 0),
                }
            }
            Op::Delete => match wire {
                Wire::Text => proto::delete(wb, kb, false),
                Wire::Meta => proto::meta_delete(wb, kb, b""),
                Wire::Binary => proto::binary::delete(wb, kb, 0),
            },
            Op::Touch => match wire {
                Wire::Binary => proto::binary::touch(wb, kb, bin_exptime, 0),
                _ => proto::touch(wb, kb, exptime, false),
            },
            Op::Incr => match wire {
                Wire::Binary => proto::binary::increment(wb, kb, 1, false, 0),
                _ => proto::arith(wb, true, kb, 1, false),
            },
            Op::Gat => match wire {
                Wire::Binary => proto::binary::gat(wb, kb, bin_exptime, 0),
                _ => proto::gat(wb, exptime, kb),
            },
        }
        if let Some(u) = &mut conn.udp {
            if conn.wbuf.len() - dgram_start > crate::transport::UDP_MAX_REQUEST {
                // Too big for one datagram: not sent (validation keeps values small enough).
                conn.wbuf.truncate(dgram_start);
                self.stats.skipped += 1;
                return;
            }
            u.ends.push_back(conn.wbuf.len());
        }
        conn.inflight.push_back(Pending {
            op,
            key,
            nkeys,
            t0,
            measured,
            load,
            wire,
            id,
        });
        if !self.is_dirty[c] {
            self.is_dirty[c] = true;
            self.dirty.push(c);
        }
    }

    // ----- I/O ------------------------------------------------------------------------------

    pub(super) fn flush(&mut self) {
        while let Some(c) = self.dirty.pop() {
            self.is_dirty[c] = false;
            self.flush_conn(c);
        }
    }

    pub(super) fn flush_conn(&mut self, c: usize) {
        let conn = &mut self.conns[c];
        if !conn.alive {
            return;
        }
        while conn.wpos < conn.wbuf.len() {
            // One datagram per write on UDP; as much as the socket takes on a stream.
            let end = match &conn.udp {
                Some(u) => u.ends.front().copied().unwrap_or(conn.wbuf.len()),
                None => conn.wbuf.len(),
            };
            match conn.sock.write(&conn.wbuf[conn.wpos..end]) {
                // A datagram goes whole or not at all.
                Ok(_) if conn.udp.is_some() => {
                    conn.wpos = end;
                    if let Some(u) = &mut conn.udp {
                        u.ends.pop_front();
                    }
                }
                Ok(0) => {
                    self.fail(c);
                    return;
                }
                Ok(n) => conn.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.fail(c);
                    return;
                }
            }
        }
        conn.wbuf.clear();
        conn.wpos = 0;
        // TLS records the socket has not taken yet go with the next writability event.
        if conn.sock.flush().is_err() {
            self.fail(c);
        }
    }

    /// Close a connection that sent its `--reconnect-interval` requests and has every reply,
    /// as a client that connects per request does; [`Worker::reconnect_due`] opens it again
    /// at once (no backoff: this is not a failure).
    pub(super) fn recycle(&mut self, c: usize, now: Instant) {
        let conn = &self.conns[c];
        if conn.alive && conn.inflight.is_empty() {
            self.close(c, now);
        }
    }

    /// Close live connection `c`, to be reopened at `retry_at` by [`Worker::reconnect_due`].
    fn close(&mut self, c: usize, retry_at: Instant) {
        let conn = &mut self.conns[c];
        conn.alive = false;
        let _ = self.poll.registry().deregister(&mut conn.sock);
        conn.sock.shutdown();
        conn.retry_at = Some(retry_at);
        conn.connecting_since = None;
        self.unsettled = true;
    }

    /// Close a connection that failed or misbehaved; its outstanding requests are lost. It is
    /// opened again after its backoff by [`Worker::reconnect_due`].
    pub(super) fn fail(&mut self, c: usize) {
        let conn = &mut self.conns[c];
        if !conn.alive {
            return;
        }
        let retry_at = Instant::now() + conn.backoff;
        self.close(c, retry_at);
        let conn = &mut self.conns[c];
        conn.backoff = (conn.backoff * 2).min(RECONNECT_MAX);
        self.stats.conn_failures += 1;
        self.stats.lost += conn.inflight.len() as u64;
        self.shared.progress[self.t]
            .errors
            .fetch_add(conn.inflight.len() as u64 + 1, Ordering::Relaxed);
        conn.inflight.clear();
        conn.aside.clear();
        conn.wbuf = Vec::new();
        conn.rbuf = Vec::new();
    }

    /// Reopen the dead connections whose backoff has passed (non-blocking), and fail those
    /// whose reconnection has taken longer than the connect timeout. A reopened connection
    /// gets its share of work once it is established: its load-phase window, or its
    /// closed-loop depth.
    pub(super) fn reconnect_due(&mut self, now: Instant) {
        if !self.unsettled {
            return;
        }
        let mut unsettled = false;
        for c in 0..self.conns.len() {
            let conn = &self.conns[c];
            if conn.alive {
                if conn
                    .connecting_since
                    .is_some_and(|t| now.saturating_duration_since(t) > self.cfg.connect_timeout)
                {
                    self.fail(c);
                }
                unsettled |= self.conns[c].connecting_since.is_some() || !self.conns[c].alive;
                continue;
            }
            if conn.retry_at.is_none_or(|t| t > now) {
                unsettled = true;
                continue;
            }
            let server = conn.server;
            let opened = self.addrs[server]
                .connect_nonblocking(self.cfg.tls.as_ref())
                .and_then(|mut sock| {
                    self.poll
                        .registry()
                        .register(&mut sock, Token(c), Interest::READABLE | Interest::WRITABLE)
                        .map(|()| sock)
                });
            let conn = &mut self.conns[c];
            match opened {
                Ok(sock) => {
                    conn.sock = sock;
                    conn.alive = true;
                    conn.retry_at = None;
                    conn.connecting_since = (!conn.sock.is_udp()).then_some(now);
                    // A recycled connection's buffers are kept (a failed one's were freed).
                    conn.wbuf.clear();
                    conn.wbuf.reserve(READ_CHUNK);
                    conn.wpos = 0;
                    if conn.rbuf.len() < READ_CHUNK {
                        conn.rbuf = vec![0; READ_CHUNK];
                    }
                    conn.rpos = 0;
                    conn.rlen = 0;
                    conn.values = 0;
                    conn.sent = 0;
                    if conn.udp.is_some() {
                        conn.udp = Some(UdpState::new());
                    }
                    if conn.connecting_since.is_some() {
                        // Work waits for the connection (see `handle_events`).
                        unsettled = true;
                    } else {
                        self.stats.reconnects += 1;
                        self.prime(c, now);
                    }
                }
                Err(_) => {
                    conn.retry_at = Some(now + conn.backoff);
                    conn.backoff = (conn.backoff * 2).min(RECONNECT_MAX);
                    unsettled = true;
                    self.stats.conn_failures += 1;
                    self.shared.progress[self.t]
                        .errors
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.unsettled = unsettled;
        self.flush();
    }

    /// Give a freshly reopened connection its work: the load phase's window, or the closed
    /// loop's `depth` requests (a window, or the first batch) (the open loop picks connections as requests fall due).
    pub(super) fn prime(&mut self, c: usize, now: Instant) {
        if self.load_deadline.is_some() {
            for _ in 0..self.load_window(c) {
                if self.load_next >= self.cfg.workload.keys {
                    break;
                }
                self.send_load(c, now);
            }
        } else if self.cfg.load == LoadModel::Closed {
            self.prime_closed(c, now);
        }
    }

    pub(super) fn load_window(&self, c: usize) -> usize {
        if self.conns[c].udp.is_some() {
            UDP_LOAD_WINDOW
        } else {
            32
        }
    }

    /// Whether every connection has been down for [`GIVE_UP`] (a run limited only by a
    /// request count would otherwise keep reconnecting to a dead server for its hour).
    pub(super) fn all_down_too_long(&mut self, now: Instant) -> bool {
        if self.conns.iter().any(|c| c.alive) {
            self.last_up = now;
            false
        } else {
            now.saturating_duration_since(self.last_up) >= GIVE_UP
        }
    }

    /// Whether no connection to `server` is up (its requests cannot be sent at all).
    pub(super) fn server_down(&self, server: usize) -> bool {
        !self.by_server[server]
            .iter()
            .any(|&i| self.conns[i].usable())
    }

    /// How long an event loop may sleep before the next reconnection attempt is due.
    pub(super) fn reconnect_wait(&self, now: Instant, max: Duration) -> Duration {
        if !self.unsettled {
            return max;
        }
        self.conns
            .iter()
            .filter_map(|c| c.retry_at)
            .map(|t| t.saturating_duration_since(now))
            .fold(max, Duration::min)
    }

    /// A live connection to `server` with fewer than `cap` outstanding, round robin.
    pub(super) fn pick_conn(&mut self, server: usize, cap: usize) -> Option<usize> {
        let list = &self.by_server[server];
        let n = list.len();
        for i in 0..n {
            let idx = list[(self.rr[server] + i) % n];
            let conn = &self.conns[idx];
            if conn.usable()
                && conn.inflight.len() < cap
                && !conn.used_up(self.cfg.reconnect_interval)
            {
                self.rr[server] = (self.rr[server] + i + 1) % n;
                return Some(idx);
            }
        }
        None
    }
}
