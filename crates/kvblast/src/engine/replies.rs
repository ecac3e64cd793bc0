//! Reply matching: reading replies, parsing them with `kvproto::client`, matching each to the
//! request it answers (by order on streams, by request id and sequence over UDP) and
//! recording its outcome and latency.

use super::*;

/// The reply reduced to what the engine needs (so the read buffer's borrow ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Got {
    Value,
    End,
    Stored,
    NotStored,
    Exists,
    Deleted,
    NotFound,
    Touched,
    Number,
    Error,
    Other,
    // Meta replies that have no text counterpart.
    Hd,
    En,
    Mn,
}

impl Got {
    pub(super) fn of(r: &Reply<'_>) -> Got {
        match r {
            Reply::Value { .. } => Got::Value,
            Reply::End => Got::End,
            Reply::Stored => Got::Stored,
            Reply::NotStored => Got::NotStored,
            Reply::Exists => Got::Exists,
            Reply::Deleted => Got::Deleted,
            Reply::NotFound => Got::NotFound,
            Reply::Touched => Got::Touched,
            Reply::Number(_) => Got::Number,
            Reply::Error | Reply::ClientError(_) | Reply::ServerError(_) => Got::Error,
            _ => Got::Other,
        }
    }

    pub(super) fn of_binary(r: &binary::Response<'_>) -> Got {
        use binary::{opcode, status};
        match (r.opcode, r.status) {
            (opcode::GET | opcode::GETQ | opcode::GAT, status::SUCCESS) => Got::Value,
            (opcode::GET | opcode::GAT, status::KEY_NOT_FOUND) => Got::En,
            (opcode::NOOP, status::SUCCESS) => Got::Mn,
            (opcode::INCREMENT, status::SUCCESS) => Got::Number,
            (opcode::SET | opcode::DELETE | opcode::TOUCH, status::SUCCESS) => Got::Hd,
            (_, status::KEY_NOT_FOUND) => Got::NotFound,
            (_, status::NOT_STORED) => Got::NotStored,
            (_, status::KEY_EXISTS) => Got::Exists,
            _ => Got::Error,
        }
    }

    pub(super) fn of_meta(r: &MetaReply<'_>) -> Got {
        match r {
            MetaReply::Value { .. } => Got::Value,
            MetaReply::Hd { .. } => Got::Hd,
            MetaReply::En => Got::En,
            MetaReply::Nf => Got::NotFound,
            MetaReply::Ns => Got::NotStored,
            MetaReply::Ex => Got::Exists,
            MetaReply::Mn => Got::Mn,
            MetaReply::Error | MetaReply::ClientError(_) | MetaReply::ServerError(_) => Got::Error,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outcome {
    pub(super) hits: u32,
    pub(super) misses: u32,
    pub(super) error: bool,
}

pub(super) fn hit() -> Outcome {
    Outcome {
        hits: 1,
        misses: 0,
        error: false,
    }
}

pub(super) fn miss() -> Outcome {
    Outcome {
        hits: 0,
        misses: 1,
        error: false,
    }
}

impl Worker {
    /// Read everything available on `c` and handle every complete reply.
    pub(super) fn on_readable(&mut self, c: usize) {
        if self.conns[c].udp.is_some() {
            self.on_readable_udp(c);
            return;
        }
        loop {
            let conn = &mut self.conns[c];
            if !conn.alive {
                return;
            }
            if conn.rpos == conn.rlen {
                conn.rpos = 0;
                conn.rlen = 0;
            }
            if conn.rlen == conn.rbuf.len() {
                if conn.rpos > 0 {
                    conn.rbuf.copy_within(conn.rpos..conn.rlen, 0);
                    conn.rlen -= conn.rpos;
                    conn.rpos = 0;
                } else if conn.rbuf.len() < self.max_reply {
                    let new = (conn.rbuf.len() * 2).min(self.max_reply);
                    conn.rbuf.resize(new, 0);
                } else {
                    // parse_reply bounds values by max_reply, so this is unreachable with a
                    // sane server; a hostile one just loses its connection.
                    self.fail(c);
                    return;
                }
            }
            let rlen = conn.rlen;
            let space = conn.rbuf.len() - rlen;
            match conn.sock.read(&mut conn.rbuf[rlen..]) {
                Ok(0) => {
                    self.fail(c);
                    return;
                }
                Ok(n) => {
                    conn.rlen += n;
                    let now = Instant::now();
                    if !self.parse_replies(c, now) {
                        return;
                    }
                    // A short read emptied the socket; with edge-triggered readiness, bytes
                    // that arrive later raise a new event. Skipping the read that would
                    // return WouldBlock saves a system call per reply.
                    if n < space && !self.conns[c].sock.is_tls() {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.fail(c);
                    return;
                }
            }
        }
    }

    /// Receive every waiting datagram on UDP connection `c`.
    pub(super) fn on_readable_udp(&mut self, c: usize) {
        loop {
            let conn = &mut self.conns[c];
            if !conn.alive {
                return;
            }
            let Some(u) = conn.udp.as_mut() else {
                return;
            };
            let n = match conn.sock.read(&mut u.scratch) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // ECONNREFUSED and the like: nothing listens; the requests time out.
                Err(_) => return,
            };
            if n < crate::transport::UDP_HEADER {
                continue;
            }
            let id = u16::from_be_bytes([u.scratch[0], u.scratch[1]]);
            let seq = u16::from_be_bytes([u.scratch[2], u.scratch[3]]);
            let now = Instant::now();
            self.on_datagram(c, id, seq, n, now);
        }
    }

    /// One reply datagram of `n` bytes (header included) in the connection's scratch buffer.
    pub(super) fn on_datagram(&mut self, c: usize, id: u16, seq: u16, n: usize, now: Instant) {
        // Requests before the one this datagram answers lost their replies.
        loop {
            let Some(front) = self.conns[c].inflight.front().copied() else {
                return; // a stale or unsolicited datagram
            };
            let ahead = id.wrapping_sub(front.id);
            if ahead == 0 {
                break;
            }
            if ahead >= 0x8000 {
                return; // a late datagram for a request already given up
            }
            self.drop_front(c, now);
        }
        let max_reply = self.max_reply;
        let conn = &mut self.conns[c];
        let Some(u) = conn.udp.as_mut() else {
            return;
        };
        let payload = n - crate::transport::UDP_HEADER;
        let in_order = match u.cur {
            Some((cur, last)) if cur == id => seq == 0 || seq == last.wrapping_add(1),
            _ => seq == 0,
        };
        let same = u.cur.map(|(cur, _)| cur) == Some(id);
        if !in_order || (same && conn.rlen + payload > max_reply) {
            self.drop_front(c, now);
            return;
        }
        if !same {
            conn.rpos = 0;
            conn.rlen = 0;
            conn.values = 0;
        }
        u.cur = Some((id, seq));
        if conn.rbuf.len() < conn.rlen + payload {
            conn.rbuf.resize(conn.rlen + payload, 0);
        }
        conn.rbuf[conn.rlen..conn.rlen + payload]
            .copy_from_slice(&u.scratch[crate::transport::UDP_HEADER..n]);
        conn.rlen += payload;
        if !self.parse_replies(c, now) {
            return;
        }
        // Once the request is answered, its leftover bytes (there should be none) go.
        let conn = &mut self.conns[c];
        if conn.inflight.front().map(|p| p.id) != Some(id) {
            conn.rpos = 0;
            conn.rlen = 0;
            if let Some(u) = conn.udp.as_mut() {
                u.cur = None;
            }
        }
    }

    /// Give up on the request at the front of UDP connection `c` (its reply was lost): count
    /// it and, in the closed loop, free its slot.
    pub(super) fn drop_front(&mut self, c: usize, now: Instant) {
        let conn = &mut self.conns[c];
        let Some(p) = conn.inflight.pop_front() else {
            return;
        };
        conn.rpos = 0;
        conn.rlen = 0;
        conn.values = 0;
        if let Some(u) = conn.udp.as_mut() {
            u.cur = None;
        }
        self.stats.dropped += 1;
        self.shared.progress[self.t]
            .errors
            .fetch_add(1, Ordering::Relaxed);
        if p.load {
            // The load phase sets every key: send a lost one again (the load phase's deadline
            // bounds the retries). Once the load phase is over, a late load request is only
            // forgotten; it held no slot of the main loop.
            if self.load_deadline.is_some() {
                self.stats.load_retries += 1;
                self.send(c, Op::Set, p.key, now, false, true);
            } else {
                self.load_leftover_done(c, now);
            }
        } else if self.cfg.load == LoadModel::Closed {
            self.slot_freed(c, now);
        }
    }

    /// UDP: give up on requests at the front of a connection that waited longer than
    /// `udp_timeout` (the reply of the last request sent can be lost with nothing after it).
    pub(super) fn sweep_udp(&mut self, now: Instant) {
        let timeout = self.cfg.udp_timeout;
        for c in 0..self.conns.len() {
            while self.conns[c].alive
                && self.conns[c].udp.is_some()
                && self.conns[c]
                    .inflight
                    .front()
                    .is_some_and(|p| now.saturating_duration_since(p.t0) > timeout)
            {
                self.drop_front(c, now);
            }
        }
    }

    /// A reply that does not parse or does not fit its request. On a stream the connection
    /// cannot be trusted any more and is closed; on UDP it is a damaged or partly lost reply,
    /// so only its request is given up. Either way, the caller stops parsing this buffer.
    pub(super) fn bad_reply(&mut self, c: usize, now: Instant) {
        if self.conns[c].udp.is_some() {
            self.drop_front(c, now);
        } else {
            self.fail(c);
        }
    }

    /// Handle the complete replies in `c`'s buffer. False if the connection was closed (or,
    /// on UDP, the reply was given up).
    pub(super) fn parse_replies(&mut self, c: usize, now: Instant) -> bool {
        loop {
            let conn = &mut self.conns[c];
            let pending = &conn.rbuf[conn.rpos..conn.rlen];
            let parsed = match conn.inflight.front().map(|p| p.wire) {
                Some(Wire::Meta) => match proto::parse_meta_reply(pending, self.max_reply) {
                    ParseMetaReply::Reply(r, n) => Some((Got::of_meta(&r), n)),
                    ParseMetaReply::Incomplete => return true,
                    ParseMetaReply::Invalid(_) => None,
                },
                Some(Wire::Binary) => match binary::parse_response(pending, self.max_reply) {
                    binary::ParseResponse::Response(r, n) => Some((Got::of_binary(&r), n)),
                    binary::ParseResponse::Incomplete => return true,
                    binary::ParseResponse::Invalid(_) => None,
                },
                _ => match proto::parse_reply(pending, self.max_reply) {
                    ParseReply::Reply(r, n) => Some((Got::of(&r), n)),
                    ParseReply::Incomplete => return true,
                    ParseReply::Invalid(_) => None,
                },
            };
            let Some((got, n)) = parsed else {
                self.bad_reply(c, now);
                return false;
            };
            conn.rpos += n;
            let Some(front) = conn.inflight.front().copied() else {
                // A reply to nothing.
                self.bad_reply(c, now);
                return false;
            };
            let outcome = match (front.op, got) {
                // A single meta or binary get (or binary gat): a value is the hit, EN / not
                // found the miss.
                (Op::Get | Op::Gat, Got::Value) if front.wire != Wire::Text && front.nkeys == 1 => {
                    hit()
                }
                (Op::Get | Op::Gat, Got::En) if front.wire != Wire::Text && front.nkeys == 1 => {
                    miss()
                }
                (Op::Get | Op::Gat, Got::Value) => {
                    conn.values += 1;
                    if conn.values > front.nkeys {
                        self.bad_reply(c, now);
                        return false;
                    }
                    continue;
                }
                (Op::Get | Op::Gat, Got::End) | (Op::Get, Got::Mn) => {
                    if (got == Got::Mn) != (front.wire != Wire::Text && front.nkeys > 1) {
                        self.bad_reply(c, now);
                        return false;
                    }
                    let hits = conn.values;
                    conn.values = 0;
                    Outcome {
                        hits,
                        misses: front.nkeys - hits,
                        error: false,
                    }
                }
                (_, Got::Error) => {
                    conn.values = 0;
                    Outcome {
                        hits: 0,
                        misses: 0,
                        error: true,
                    }
                }
                (Op::Set, Got::Stored) => hit(),
                (Op::Set | Op::Delete, Got::Hd) if front.wire != Wire::Text => hit(),
                (Op::Touch, Got::Hd) if front.wire == Wire::Binary => hit(),
                (Op::Set, Got::NotStored | Got::Exists) => miss(),
                (Op::Delete, Got::Deleted) => hit(),
                (Op::Touch, Got::Touched) => hit(),
                (Op::Incr, Got::Number) => hit(),
                (Op::Delete | Op::Touch | Op::Incr, Got::NotFound) => miss(),
                _ => {
                    self.bad_reply(c, now);
                    return false;
                }
            };
            conn.inflight.pop_front();
            self.complete(c, front, outcome, now);
        }
    }

    /// A load-phase request left over from the load phase was answered (or given up) during
    /// the main phase. It held no slot of a window; a batch, which waits for nothing to be
    /// outstanding, may now go out.
    fn load_leftover_done(&mut self, c: usize, now: Instant) {
        if self.cfg.load == LoadModel::Closed && self.cfg.pipeline == Pipeline::Batch {
            self.send_batch(c, now);
        }
    }

    pub(super) fn complete(&mut self, c: usize, p: Pending, o: Outcome, now: Instant) {
        // A reply: the connection works, so its next failure starts the backoff afresh.
        self.conns[c].backoff = RECONNECT_MIN;
        self.shared.progress[self.t]
            .completed
            .fetch_add(1, Ordering::Relaxed);
        if o.error {
            self.shared.progress[self.t]
                .errors
                .fetch_add(1, Ordering::Relaxed);
        }
        if p.load {
            self.stats.loaded += 1;
            if self.load_deadline.is_some() {
                if self.load_next < self.cfg.workload.keys {
                    self.send_load(c, now);
                }
            } else {
                self.load_leftover_done(c, now);
            }
            return;
        }
        if self.stats.interval_ns > 0 {
            let i = (now.saturating_duration_since(self.run_start).as_nanos()
                / u128::from(self.stats.interval_ns)) as usize;
            if i < crate::stats::MAX_INTERVALS {
                while self.stats.intervals.len() <= i {
                    self.stats
                        .intervals
                        .push(crate::stats::new_interval_histogram());
                }
                let us = now.saturating_duration_since(p.t0).as_micros() as u64;
                self.stats.intervals[i].saturating_record(us.max(1));
            }
        }
        let st = &mut self.stats.ops[p.op.index()];
        st.total += 1;
        st.total_keys += u64::from(p.nkeys);
        st.total_hits += u64::from(o.hits);
        if p.measured {
            let ns = now.saturating_duration_since(p.t0).as_nanos() as u64;
            st.hist.saturating_record(ns.max(1));
            st.count += 1;
            st.hits += u64::from(o.hits);
            st.misses += u64::from(o.misses);
            st.errors += u64::from(o.error);
            let w = &self.cfg.workload;
            if w.value_per_key && p.op == Op::Get && p.nkeys == 1 {
                let len = w.value_size.quantile(crate::dist::unit_of_key(p.key)) as u64;
                st.hit_bytes += len * u64::from(o.hits);
                st.miss_bytes += len * u64::from(o.misses);
            }
            if ns > self.cfg.slo.as_nanos() as u64 {
                st.late += 1;
            }
        }
        // Look-aside: fill the cache after a single-key get misses.
        let refill = self.cfg.look_aside && p.op == Op::Get && p.nkeys == 1 && o.misses == 1;
        match self.cfg.load {
            LoadModel::Closed => match self.cfg.pipeline {
                Pipeline::Window if refill && !self.stopping => {
                    let m = self.in_window(now);
                    self.send(c, Op::Set, p.key, now, m, false);
                }
                Pipeline::Window => self.refill_closed(c, now),
                // The set goes with the next batch, which waits for this one's replies.
                Pipeline::Batch => {
                    if refill && !self.stopping {
                        self.conns[c].aside.push_back(p.key);
                    }
                    self.send_batch(c, now);
                }
            },
            LoadModel::Open { .. } => {
                if refill && !self.stopping {
                    let m = self.in_window(now);
                    self.send(c, Op::Set, p.key, now, m, false);
                }
            }
        }
        if self.conns[c].used_up(self.cfg.reconnect_interval) {
            self.recycle(c, now);
        }
    }
}
