//! One client connection: its socket, its partial input, its pending output, and the loop
//! that reads requests, executes them and writes replies.
//!
//! Memory per connection is bounded and mostly zero while idle:
//! - Input is read into the worker's shared scratch buffer; only the bytes of an unfinished
//!   request are copied into the connection's own buffer, which is capped at the largest
//!   request the configuration allows (`-I` plus a command line, or a long `get` line).
//! - Output is appended to the connection's write buffer. Once it holds more than
//!   [`OUTPUT_HIGH_WATER`] bytes the connection stops executing requests (and so stops
//!   reading) until the client has read enough: a client that sends without reading is held
//!   back by TCP flow control, not by server memory. A multiget pauses between keys.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvproto::binary as bin;
use kvproto::text::{self as proto, Parse};

use crate::binary;
use crate::config::ProtocolChoice;
use crate::server::Shared;
use crate::stats::WorkerStats;
use crate::text;

/// Output beyond which a connection stops executing requests until the client reads.
pub const OUTPUT_HIGH_WATER: usize = 256 * 1024;

/// Buffers larger than this are given back once empty.
const KEEP_CAPACITY: usize = 64 * 1024;

/// An idle connection keeps an output buffer up to this size (small replies), no more.
const IDLE_KEEP: usize = 4 * 1024;

/// The socket of a connection.
pub enum Stream {
    Tcp(mio::net::TcpStream),
    Unix(mio::net::UnixStream),
}

impl Stream {
    pub fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What `stats conns` shows of a connection; shared with the registry in [`Shared`].
pub struct ConnInfo {
    pub addr: String,
    /// The listening socket it came in on.
    pub listen_addr: String,
    /// Unix time of the last command.
    pub last_cmd: AtomicU32,
    pub state: AtomicU8,
}

pub const STATE_READ: u8 = 0;
pub const STATE_WRITE: u8 = 1;

impl ConnInfo {
    pub fn new(addr: String, listen_addr: String) -> ConnInfo {
        ConnInfo {
            addr,
            listen_addr,
            last_cmd: AtomicU32::new(0),
            state: AtomicU8::new(STATE_READ),
        }
    }

    pub fn state_name(&self) -> &'static str {
        match self.state.load(Ordering::Relaxed) {
            STATE_WRITE => "conn_mwrite",
            _ => "conn_parse_cmd",
        }
    }
}

/// Per-connection protocol state that request execution reads and writes.
pub struct Session {
    /// Replies not yet written; `out[out_pos..]` is pending.
    pub out: Vec<u8>,
    out_pos: usize,
    /// Bytes of an oversize data block still to discard.
    swallow: usize,
    /// Keys of the multiget at the front of the input that were already answered.
    pub get_progress: usize,
    /// Close once the pending output is written (`quit`, fatal errors).
    pub close_after_write: bool,
    /// The protocol this connection speaks, decided by its first byte.
    protocol: Option<Protocol>,
    /// Authentication state (`-Y`, `-S`).
    pub auth: crate::auth::ConnAuth,
}

/// The protocols a TCP or unix connection can speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// Classic text and meta commands.
    Text,
    Binary,
}

impl Session {
    pub fn new() -> Session {
        Session {
            out: Vec::new(),
            out_pos: 0,
            swallow: 0,
            get_progress: 0,
            close_after_write: false,
            protocol: None,
            auth: crate::auth::ConnAuth::default(),
        }
    }

    /// Bytes of output waiting to be written.
    pub fn pending(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Give the output buffer back when nothing is pending and it is larger than
    /// [`IDLE_KEEP`]: thousands of idle connections that once fetched a large item must not
    /// keep that much memory each, while a connection of small replies keeps its small
    /// buffer instead of allocating one per request.
    fn release_idle(&mut self) {
        if self.pending() == 0 && self.out.capacity() > IDLE_KEEP {
            self.out = Vec::new();
            self.out_pos = 0;
        }
    }
}

/// What executing one request asks of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Carry on with the next request.
    Next,
    /// The request is not finished (a multiget paused for output to drain): keep its bytes,
    /// flush, and run it again later.
    Pause,
    /// Close the connection now, without writing what is pending.
    Close,
}

/// What the worker should do with a connection after driving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drive {
    /// Wait for the socket to become readable or writable.
    Wait,
    /// More work is ready but the connection used its share (`-R`): run it again soon.
    Yield,
    /// Close it.
    Close,
}

pub struct Conn {
    pub stream: Stream,
    pub info: Arc<ConnInfo>,
    /// Unfinished input (`input[input_pos..]`), when a request spans reads.
    input: Vec<u8>,
    input_pos: usize,
    pub session: Session,
    pub last_active: Instant,
    /// Whether the socket is registered for writability: only while output is blocked, so
    /// that a connection whose replies fit the socket buffer never wakes the worker twice.
    pub write_interest: bool,
}

/// Worker-owned context for driving connections.
pub struct Ctx<'a> {
    pub shared: &'a Shared,
    pub stats: &'a WorkerStats,
    /// The worker's read buffer, shared by all its connections.
    pub scratch: &'a mut Vec<u8>,
}

/// Where the bytes being parsed live.
enum Source {
    Scratch(usize),
    Input,
}

impl Conn {
    pub fn new(stream: Stream, info: Arc<ConnInfo>) -> Conn {
        Conn {
            stream,
            info,
            input: Vec::new(),
            input_pos: 0,
            session: Session::new(),
            last_active: Instant::now(),
            write_interest: false,
        }
    }

    /// Read, execute and write until the socket would block, the connection has used its
    /// share of requests, or it must close.
    pub fn drive(&mut self, ctx: &mut Ctx<'_>) -> Drive {
        let mut budget = ctx.shared.config.reqs_per_event.max(1);
        // A read that did not fill the buffer drained the socket: reading again would only
        // return EAGAIN, and new data raises a new (edge-triggered) event anyway.
        let mut drained = false;
        loop {
            // 1. Write what is pending.
            match self.flush(ctx.stats) {
                Ok(()) => {}
                Err(_) => return Drive::Close,
            }
            if self.session.close_after_write && self.session.pending() == 0 {
                return Drive::Close;
            }
            if self.session.pending() >= OUTPUT_HIGH_WATER {
                self.info.state.store(STATE_WRITE, Ordering::Relaxed);
                return Drive::Wait;
            }
            self.info.state.store(STATE_READ, Ordering::Relaxed);
            if self.session.close_after_write {
                // Output still pending but below the mark: wait for writability.
                return Drive::Wait;
            }

            // 2. Execute requests already buffered.
            if self.input_pos < self.input.len() {
                let data = std::mem::take(&mut self.input);
                let start = self.input_pos;
                let (consumed, step) = self.execute(ctx, &data[start..], &mut budget);
                self.input = data;
                self.input_pos += consumed;
                if self.input_pos == self.input.len() {
                    self.input.clear();
                    self.input_pos = 0;
                    if self.input.capacity() > KEEP_CAPACITY {
                        self.input = Vec::new();
                    }
                }
                match step {
                    Step::Close => return Drive::Close,
                    Step::Pause => continue,
                    Step::Next => {}
                }
                if budget == 0 {
                    ctx.stats.conn_yields.incr();
                    return Drive::Yield;
                }
                if self.session.pending() > 0 || self.session.close_after_write {
                    continue;
                }
            }

            // 3. Read more.
            if drained {
                self.idle();
                return Drive::Wait;
            }
            let source = match self.read(ctx) {
                Ok(Some((s, full))) => {
                    drained = !full;
                    s
                }
                Ok(None) => {
                    self.idle();
                    return Drive::Wait;
                }
                Err(_) => return Drive::Close,
            };
            self.last_active = Instant::now();
            self.info
                .last_cmd
                .store(ctx.shared.clock.now(), Ordering::Relaxed);
            if let Source::Scratch(n) = source {
                // Execute straight from the worker's buffer; keep only what is unfinished.
                let scratch = std::mem::take(ctx.scratch);
                let (consumed, step) = self.execute(ctx, &scratch[..n], &mut budget);
                if consumed < n {
                    self.input.extend_from_slice(&scratch[consumed..n]);
                    self.input_pos = 0;
                }
                *ctx.scratch = scratch;
                match step {
                    Step::Close => return Drive::Close,
                    Step::Pause | Step::Next => {}
                }
                if budget == 0 {
                    ctx.stats.conn_yields.incr();
                    return Drive::Yield;
                }
            }
        }
    }

    /// The client has nothing more for now: give back the buffers that hold nothing (an
    /// idle connection holds no buffers).
    fn idle(&mut self) {
        self.session.release_idle();
        if self.input_pos == self.input.len() && self.input.capacity() > 0 {
            self.input = Vec::new();
            self.input_pos = 0;
        }
    }

    /// Read from the socket into the scratch buffer (when no request is unfinished) or onto
    /// the end of the unfinished input. `Ok(None)`: the socket would block; otherwise the
    /// source and whether the read filled all the room it was given.
    fn read(&mut self, ctx: &mut Ctx<'_>) -> io::Result<Option<(Source, bool)>> {
        let limit = ctx.shared.max_request_len();
        loop {
            let result = if self.input_pos == self.input.len() {
                self.input.clear();
                self.input_pos = 0;
                let scratch: &mut Vec<u8> = ctx.scratch;
                let room = scratch.len();
                self.stream
                    .read(&mut scratch[..])
                    .map(|n| (n, true, n == room))
            } else {
                // Make room: drop consumed bytes, then grow within the request limit.
                if self.input_pos > 0 {
                    self.input.drain(..self.input_pos);
                    self.input_pos = 0;
                }
                let have = self.input.len();
                if have >= limit {
                    return Err(io::Error::other("request exceeds the largest allowed"));
                }
                let want = (have + 16 * 1024).max(have * 2).min(limit);
                self.input.resize(want, 0);
                let r = self.stream.read(&mut self.input[have..]);
                let n = *r.as_ref().unwrap_or(&0);
                self.input.truncate(have + n);
                r.map(|n| (n, false, n == want - have))
            };
            match result {
                Ok((0, _, _)) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok((n, true, full)) => {
                    ctx.stats.bytes_read.add(n as u64);
                    return Ok(Some((Source::Scratch(n), full)));
                }
                Ok((n, false, full)) => {
                    ctx.stats.bytes_read.add(n as u64);
                    return Ok(Some((Source::Input, full)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Execute the requests at the front of `data`; returns the bytes consumed and how the
    /// last step ended. Stops when the data holds no whole request, the output is over the
    /// high-water mark, or the request budget is spent.
    fn execute(&mut self, ctx: &mut Ctx<'_>, data: &[u8], budget: &mut usize) -> (usize, Step) {
        let shared = ctx.shared;
        let limits = shared.limits;
        let mut pos = 0;
        while pos < data.len() {
            if self.session.swallow > 0 {
                let n = self.session.swallow.min(data.len() - pos);
                self.session.swallow -= n;
                pos += n;
                continue;
            }
            if self.session.pending() >= OUTPUT_HIGH_WATER || *budget == 0 {
                return (pos, Step::Next);
            }
            let rest = &data[pos..];
            let protocol = match self.session.protocol {
                Some(p) => p,
                None => {
                    // memcached's -B auto: a first byte of 0x80 is the binary magic.
                    let p = match (shared.config.protocol, rest.first()) {
                        (ProtocolChoice::Binary, _) => Protocol::Binary,
                        (ProtocolChoice::Ascii, _) => Protocol::Text,
                        (ProtocolChoice::Auto, Some(&bin::REQUEST_MAGIC)) => Protocol::Binary,
                        (ProtocolChoice::Auto, _) => Protocol::Text,
                    };
                    self.session.protocol = Some(p);
                    p
                }
            };
            if protocol == Protocol::Binary {
                let (used, step) = self.execute_binary(ctx, rest, budget);
                pos += used;
                if used == 0 || step != Step::Next || self.session.close_after_write {
                    return (pos, step);
                }
                continue;
            }
            // -Y: until authenticated, every line is an authentication attempt or refused.
            if shared.config.auth_file.is_some() && !self.session.auth.authenticated {
                match crate::auth::ascii_gate(ctx, &mut self.session, rest) {
                    crate::auth::Gate::Incomplete => return (pos, Step::Next),
                    crate::auth::Gate::Close => return (pos, Step::Close),
                    crate::auth::Gate::Done(used) => {
                        *budget -= 1;
                        pos += used;
                        continue;
                    }
                }
            }
            match proto::parse(rest, &limits) {
                Parse::Incomplete => return (pos, Step::Next),
                Parse::Request(req, used) => {
                    *budget -= 1;
                    match text::execute(req, ctx, &mut self.session) {
                        Step::Next => pos += used,
                        Step::Pause => return (pos, Step::Pause),
                        Step::Close => return (pos + used, Step::Close),
                    }
                    if self.session.close_after_write {
                        return (pos, Step::Next);
                    }
                }
                Parse::Error {
                    reply,
                    noreply,
                    consumed,
                    swallow,
                } => {
                    *budget -= 1;
                    if !noreply {
                        proto::write_error(&mut self.session.out, reply);
                    }
                    self.session.swallow = swallow;
                    pos += consumed.max(1);
                }
                Parse::TooLarge {
                    mode,
                    key,
                    noreply,
                    consumed,
                    swallow,
                } => {
                    *budget -= 1;
                    text::too_large(ctx, &mut self.session, mode, key, noreply);
                    self.session.swallow = swallow;
                    pos += consumed;
                }
                Parse::Close => return (pos, Step::Close),
            }
        }
        (pos, Step::Next)
    }

    /// Execute one binary request at the front of `data`: the bytes consumed (0: incomplete)
    /// and how it ended.
    fn execute_binary(
        &mut self,
        ctx: &mut Ctx<'_>,
        data: &[u8],
        budget: &mut usize,
    ) -> (usize, Step) {
        let limits = ctx.shared.limits;
        // -S: SASL commands, and refusal of the rest until authenticated.
        if ctx.shared.config.sasl {
            if let Some(h) = crate::auth::sasl_gate(ctx, &mut self.session, data) {
                if h.consumed > 0 {
                    *budget -= 1;
                }
                self.session.swallow = h.swallow;
                return (h.consumed, h.step);
            }
        }
        match bin::parse(data, &limits) {
            bin::Parse::Incomplete => (0, Step::Next),
            bin::Parse::Request(req, used) => {
                *budget -= 1;
                (used, binary::execute(req, ctx, &mut self.session))
            }
            bin::Parse::Error {
                opcode,
                opaque,
                status,
                close,
                consumed,
                swallow,
            } => {
                *budget -= 1;
                bin::write_error(&mut self.session.out, opcode, opaque, status);
                // memcached sends the error, then closes (or skips the bad request's bytes).
                self.session.close_after_write |= close;
                self.session.swallow = swallow;
                (consumed.max(1), Step::Next)
            }
            bin::Parse::TooLarge {
                opcode,
                opaque,
                status,
                key,
                consumed,
                swallow,
            } => {
                *budget -= 1;
                binary::too_large(ctx, &mut self.session, opcode, opaque, status, key);
                self.session.swallow = swallow;
                (consumed.max(1), Step::Next)
            }
            bin::Parse::Close => (0, Step::Close),
        }
    }

    /// Write pending output until done or the socket would block.
    fn flush(&mut self, stats: &WorkerStats) -> io::Result<()> {
        let s = &mut self.session;
        while s.out_pos < s.out.len() {
            match self.stream.write(&s.out[s.out_pos..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    s.out_pos += n;
                    stats.bytes_written.add(n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        s.out.clear();
        s.out_pos = 0;
        if s.out.capacity() > KEEP_CAPACITY.max(OUTPUT_HIGH_WATER) {
            s.out = Vec::new();
        }
        Ok(())
    }
}
