//! One client connection: its socket, its partial input, its pending output, and the loop
//! that reads requests, executes them and writes replies.
//!
//! A connection's life ends in exactly one of these ways, and each costs nothing afterwards:
//! - The peer finishes sending (FIN): every whole request already received is executed, the
//!   replies owed are written, then the connection closes (an unfinished request is
//!   dropped). EOF is read even when it arrived in the same readiness event as the last
//!   request: a hang-up reported with the event disables the "short read means drained"
//!   shortcut, so the read that returns 0 is always made.
//! - The peer resets the connection, or a read or write fails: it closes at once.
//! - A request asks to close (`quit`, a fatal protocol error): pending replies are written
//!   first (`close_after_write`), except where memcached drops them (`Step::Close`).
//! - The worker closes it: idle too long (`-o idle_timeout`), out of buffer memory
//!   (`-o read_buf_mem_limit`), or at shutdown.
//!
//! Memory per connection is bounded and mostly zero while idle:
//! - Input is read into the worker's shared scratch buffer; only the bytes of an unfinished
//!   request are copied into the connection's own buffer, which is capped at the largest
//!   request the configuration allows (`-I` plus a command line, or a long `get` line).
//! - Output is appended to the connection's write buffer. Once it holds more than
//!   [`OUTPUT_HIGH_WATER`] bytes the connection stops executing requests (and so stops
//!   reading) until the client has read enough: a client that sends without reading is held
//!   back by TCP flow control, not by server memory. A multiget pauses between keys.
//!   Values of 16 KiB or more are not copied into it but leased from the engine and
//!   written from the log (`exec/splice.rs`); they count towards the high-water mark, and
//!   what leases hold is bounded by the engine (an eighth of `-m`).

// The request path: a client's bytes cannot make it panic (no unwrap, expect, panic or
// unchecked indexing outside tests).
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kvproto::binary as bin;
use kvproto::text as proto;

use crate::exec::dispatch;
use crate::exec::session::{Ctx, Protocol, Session, Step, OUTPUT_HIGH_WATER};
use crate::exec::splice::MAX_SLICES;
use crate::runtime::ring::RingSock;
use crate::runtime::spares::Spares;
use crate::state::registry::{ConnInfo, ConnState};
use crate::state::stats::WorkerStats;

/// Buffers larger than this are given back once empty.
const KEEP_CAPACITY: usize = 64 * 1024;

/// The first growth step of a connection's own input buffer (an unfinished request).
const INPUT_STEP: usize = 2 * 1024;

/// A connection whose last request was large reads its next straight into a spare buffer;
/// if less than this came first, its requests are likely small again.
const LEND_MIN: usize = crate::runtime::ring::RX_BUF;

/// Of a spare buffer taken for the next request, at least this much is ready to read into
/// (all of its initialized length is used).
const SPARE_READ: usize = crate::runtime::ring::DIRECT_BUF;

/// A request at least this long makes the connection read its next one straight into a
/// spare buffer: a client that sends one large set likely sends more, and the scratch
/// buffer (or, under io_uring, the ring's provided buffers, 4 KiB at a time) would take it
/// only to have it copied again. It is the first length that does not fit one provided
/// buffer: such a request arrived in two receives or more, and the connection's own
/// buffer took the rest after a copy of the start.
const LARGE_REQUEST: usize = crate::runtime::ring::RX_BUF + 1;

/// The socket of a connection.
pub enum Stream {
    Tcp(mio::net::TcpStream),
    Unix(mio::net::UnixStream),
    /// TLS over TCP (`-Z`): reads give plaintext, writes take plaintext.
    Tls(Box<kvtls::TlsStream<Sock>>),
    /// A TCP or unix socket under the io_uring runtime (`runtime/ring.rs`).
    Ring(RingSock),
}

/// The socket under a TLS session: polled by mio, or driven through io_uring.
pub enum Sock {
    Mio(mio::net::TcpStream),
    Ring(RingSock),
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Mio(s) => s.read(buf),
            Sock::Ring(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Mio(s) => s.write(buf),
            Sock::Ring(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stream {
    /// The socket to register with mio (`None` under io_uring).
    pub fn source(&mut self) -> Option<&mut dyn mio::event::Source> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::Unix(s) => Some(s),
            Stream::Tls(s) => match s.socket_mut() {
                Sock::Mio(s) => Some(s),
                Sock::Ring(_) => None,
            },
            Stream::Ring(_) => None,
        }
    }

    /// The io_uring socket underneath, under that runtime.
    pub fn ring_mut(&mut self) -> Option<&mut RingSock> {
        match self {
            Stream::Ring(s) => Some(s),
            Stream::Tls(s) => match s.socket_mut() {
                Sock::Ring(s) => Some(s),
                Sock::Mio(_) => None,
            },
            _ => None,
        }
    }

    /// The io_uring socket underneath, under that runtime.
    fn ring(&self) -> Option<&RingSock> {
        match self {
            Stream::Ring(s) => Some(s),
            Stream::Tls(s) => match s.socket() {
                Sock::Ring(s) => Some(s),
                Sock::Mio(_) => None,
            },
            _ => None,
        }
    }

    /// The generation of the io_uring socket underneath.
    pub fn ring_gen(&self) -> Option<u32> {
        self.ring().map(|r| r.gen)
    }

    /// Take the io_uring socket out of a stream that is being closed.
    pub fn into_ring(self) -> Option<RingSock> {
        match self {
            Stream::Ring(s) => Some(s),
            Stream::Tls(s) => match s.into_socket() {
                Sock::Ring(s) => Some(s),
                Sock::Mio(_) => None,
            },
            _ => None,
        }
    }

    /// The socket's descriptor.
    pub fn fd(&self) -> i32 {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tls(s) => match s.socket() {
                Sock::Mio(s) => s.as_raw_fd(),
                Sock::Ring(s) => s.fd(),
            },
            Stream::Ring(s) => s.fd(),
        }
    }

    /// Bytes the connection owes the socket beyond its own output buffer: TLS records
    /// (handshake flights, the tail of a reply) waiting for writability, or, under io_uring,
    /// output staged or in flight.
    pub fn owes(&self) -> bool {
        matches!(self, Stream::Tls(s) if s.wants_write()) || self.ring().is_some_and(RingSock::owes)
    }

    /// Buffer memory the socket layer holds for the connection (io_uring's input queue and
    /// staged output).
    pub fn held(&self) -> usize {
        self.ring().map_or(0, RingSock::held)
    }

    /// Bytes of the connection's input buffer, lent to the io_uring socket for a receive.
    pub fn lent(&self) -> usize {
        self.ring().map_or(0, RingSock::lent_capacity)
    }

    /// A TLS session whose handshake has not completed.
    pub fn handshaking(&self) -> bool {
        matches!(self, Stream::Tls(s) if s.is_handshaking())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
            Stream::Ring(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
            Stream::Ring(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tls(s) => s.write_vectored(bufs),
            Stream::Ring(s) => s.write_vectored(bufs),
        }
    }
    /// Send what TLS still holds (a no-op for plain sockets); what the socket does not take
    /// waits for writability ([`Stream::owes`]).
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tls(s) => s.flush(),
            _ => Ok(()),
        }
    }
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
    /// The socket's descriptor (`cfd` in `watch` lines).
    pub fd: i32,
    /// Unfinished input (`input[input_pos..input_len]`), when a request spans reads. The
    /// vector's length is how much of it was ever initialized, so that growing it for the
    /// next read zeroes only new bytes (a 256 KiB value read in pieces zeroed the buffer
    /// again before each read: a quarter of the CPU of such sets).
    input: Vec<u8>,
    input_pos: usize,
    input_len: usize,
    /// The length of the unfinished request at the front of `input` (`input_pos` 0), once
    /// its head told it (`request_len_hint`) and the parser found it incomplete; 0 when not
    /// known. Until that many bytes are in, the request is not parsed again after every
    /// read (under io_uring a large value arrives in receive buffers of a few KiB).
    input_need: usize,
    /// Under io_uring, `input` is lent to the socket for a receive straight into it (the
    /// rest of a request whose length is known): `input` is empty meanwhile, and
    /// `input_len` counts the bytes it held.
    input_lent: bool,
    /// The last request whose length its head told was large: the next one is read straight
    /// into a spare buffer (`spare_for_next`).
    large: bool,
    /// Under io_uring, `input_lent` is a spare lent for the next request, counted in the
    /// worker's [`Spares::lend`] until it comes back (or the connection closes).
    lent_next: bool,
    /// How many bytes at the front of the unfinished input are known to hold no line end
    /// (text protocol; 0: unknown), so that a long line arriving in pieces is not scanned
    /// again from its start after every read.
    no_newline: usize,
    pub session: Session,
    /// Whether the socket is registered for writability: only while output is blocked, so
    /// that a connection whose replies fit the socket buffer never wakes the worker twice.
    pub write_interest: bool,
    /// The poller reported a hang-up or an error with a readiness event: read until EOF or
    /// EAGAIN, never stopping at a short read (the edge that announced EOF is spent).
    pub hangup: bool,
    /// The peer has finished sending (a read returned 0).
    eof: bool,
    /// Bytes of buffer memory this connection held when the worker last accounted for it.
    pub accounted: usize,
    /// What the worker's buffer gauges (`stats`) last counted for this connection.
    pub gauged: crate::state::stats::Gauged,
    /// When it was accepted (a TLS handshake must complete within
    /// `-o ssl_handshake_timeout`).
    pub accepted_at: std::time::Instant,
}

/// Where the bytes being parsed live.
enum Source {
    Scratch(usize),
    Input,
}

/// What one read from the socket gave.
enum Received {
    /// Bytes, where they are, and whether they filled all the room they were given.
    Data(Source, bool),
    /// The peer has finished sending.
    Eof,
    /// Nothing now.
    WouldBlock,
}

impl Conn {
    pub fn new(stream: Stream, info: Arc<ConnInfo>, fd: i32) -> Conn {
        let mut session = Session::for_stream();
        // TLS copies every byte into its records: nothing to gain from splicing values.
        session.splice_ok = !matches!(stream, Stream::Tls(_));
        Conn {
            stream,
            fd,
            info,
            input: Vec::new(),
            input_pos: 0,
            input_len: 0,
            input_need: 0,
            input_lent: false,
            large: false,
            lent_next: false,
            no_newline: 0,
            session,
            write_interest: false,
            hangup: false,
            eof: false,
            accounted: 0,
            gauged: Default::default(),
            accepted_at: std::time::Instant::now(),
        }
    }

    /// Bytes of buffer memory the connection holds now: its input and its output buffer.
    pub fn buffer_split(&self) -> (usize, usize) {
        (
            self.input.capacity() + self.stream.lent(),
            self.session.out.capacity() + self.stream.held(),
        )
    }

    /// Whether the connection waits for its output to leave before it can go on: under
    /// io_uring, a send's completion drives it only then.
    pub fn waits_for_output(&self) -> bool {
        self.session.pending() > 0
            || self.session.close_after_write
            || self.eof
            || matches!(&self.stream, Stream::Tls(t) if t.wants_write())
    }

    /// Whether the next bytes this io_uring connection receives begin text requests, in the
    /// clear: nothing unfinished before them (no part of a line or a value, nothing to
    /// swallow), no TLS, the text protocol. The worker reads such bytes for a key to
    /// prefetch before it runs the connection.
    pub fn receives_text_requests(&self) -> bool {
        matches!(&self.stream, Stream::Ring(s) if s.rx_empty())
            && self.session.protocol == Some(Protocol::Text)
            && self.session.swallow == 0
            && self.session.watch.is_none()
            && self.buffered() == 0
            && !self.input_lent
    }

    /// Bytes of unfinished input.
    fn buffered(&self) -> usize {
        self.input_len - self.input_pos
    }

    /// Read, execute and write until the socket would block, the connection has used its
    /// share of requests, or it must close.
    /// Move a watcher's lines into the output, up to the high-water mark; true if it has
    /// more. (Out of line: the request path only tests `watch`.)
    #[cold]
    #[inline(never)]
    fn drain_watch(&mut self) -> bool {
        let Some(w) = &self.session.watch else {
            return false;
        };
        let room = OUTPUT_HIGH_WATER.saturating_sub(self.session.pending());
        room > 0 && w.drain(&mut self.session.out, room)
    }

    /// Why the connection ends, in `watch connevents` terms: `normal` when the client hung
    /// up or sent `quit`, else `error`.
    pub fn close_reason(&self) -> &'static str {
        if self.eof || self.hangup || self.session.close_after_write {
            "normal"
        } else {
            "error"
        }
    }

    /// The request at the front needs flash reads (`Session::flash_reads`, which the worker
    /// starts: `Worker::start_flash_reads`): send what is owed and wait.
    fn wait_flash(&mut self, ctx: &mut Ctx<'_>) -> Drive {
        if self.flush(ctx.stats).is_err() {
            return Drive::Close;
        }
        Drive::Wait
    }

    pub fn drive(&mut self, ctx: &mut Ctx<'_>, spares: &mut Spares) -> Drive {
        let reqs = ctx.shared.config.reqs_per_event.max(1);
        let mut budget = reqs;
        let drive = self.run(ctx, spares, &mut budget);
        if budget != reqs {
            self.info.last_cmd.store(ctx.now, Ordering::Relaxed);
        }
        if drive != Drive::Close {
            self.info.set_state(self.resting_state());
        }
        drive
    }

    fn run(&mut self, ctx: &mut Ctx<'_>, spares: &mut Spares, budget: &mut usize) -> Drive {
        // A read that did not fill its buffer drained the socket: reading again would only
        // return EAGAIN, and new data raises a new (edge-triggered) event anyway. Not so
        // after a hang-up: the event that reported it will not come again.
        let mut drained = false;
        loop {
            // 0. A watcher's connection: its log lines, up to the high-water mark.
            let watch_more = self.session.watch.is_some() && self.drain_watch();
            // 1. Write what is owed.
            if self.flush(ctx.stats).is_err() {
                return Drive::Close;
            }
            // Flash reads under way for the request at the front: it runs again when the
            // worker hears they are done.
            if self.session.flash_wait.is_some() {
                return Drive::Wait;
            }
            if watch_more && self.session.pending() == 0 {
                continue;
            }
            if self.session.close_after_write {
                return if self.session.pending() == 0 && !self.stream.owes() {
                    Drive::Close
                } else {
                    Drive::Wait
                };
            }
            if self.session.pending() >= OUTPUT_HIGH_WATER {
                return Drive::Wait;
            }

            // 2. Execute the whole requests already buffered.
            let waiting = self.input_pos == 0 && self.input_len < self.input_need;
            if self.buffered() > 0 && !waiting && !self.line_still_unfinished() {
                let data = std::mem::take(&mut self.input);
                let start = self.input_pos;
                let end = self.input_len.min(data.len());
                let (consumed, step) =
                    self.execute(ctx, data.get(start..end).unwrap_or_default(), budget);
                self.input = data;
                self.input_pos += consumed;
                if consumed > 0 {
                    self.input_need = 0;
                }
                if self.input_pos == self.input_len {
                    self.input_len = 0;
                    self.input_pos = 0;
                    if self.input.capacity() > KEEP_CAPACITY {
                        self.release_input(ctx, spares);
                    }
                }
                match step {
                    Step::Close => return Drive::Close,
                    Step::Pause if std::mem::take(&mut self.session.yield_now) => {
                        // A long request stopped to let the others run (it goes on from
                        // its `resume` at the next turn).
                        ctx.stats.conn_yields.incr();
                        return Drive::Yield;
                    }
                    Step::Pause => continue,
                    Step::Wait => return self.wait_flash(ctx),
                    Step::Next => {}
                }
                if *budget == 0 {
                    ctx.stats.conn_yields.incr();
                    return Drive::Yield;
                }
                if consumed > 0 {
                    // Progress: write the replies, then look again.
                    continue;
                }
            }

            // 3. Nothing whole is buffered. After EOF nothing more will come: write what is
            //    owed and close (an unfinished request is dropped, as memcached does).
            if self.eof {
                self.session.close_after_write = true;
                continue;
            }

            // 4. Read more.
            if drained {
                self.idle(ctx, spares);
                return Drive::Wait;
            }
            let source = match self.read(ctx, spares) {
                Ok(Received::Data(source, full)) => {
                    // A short read from TLS says nothing of the socket (rustls hands out
                    // one record's plaintext at a time): read until it would block.
                    drained = !full && !self.hangup && !matches!(self.stream, Stream::Tls(_));
                    self.session.more_input = match &self.stream {
                        Stream::Ring(ring) => ring.may_have_more(),
                        Stream::Tls(_) => true,
                        _ => full,
                    };
                    source
                }
                Ok(Received::Eof) => {
                    self.eof = true;
                    continue;
                }
                Ok(Received::WouldBlock) => {
                    // Everything there has been read (under io_uring: unless a receive for
                    // the rest of a full one is on its way): an unfinished line left unjudged
                    // for that is judged now.
                    let pending = matches!(&self.stream, Stream::Ring(r) if r.may_have_more());
                    if self.session.more_input && !pending && self.buffered() > 0 {
                        self.session.more_input = false;
                        continue;
                    }
                    self.idle(ctx, spares);
                    return Drive::Wait;
                }
                Err(e) => {
                    self.count_tls_failure(ctx, &e);
                    return Drive::Close;
                }
            };
            if let Source::Scratch(n) = source {
                // Execute straight from the worker's buffer; keep only what is unfinished.
                let scratch = std::mem::take(ctx.scratch);
                let (consumed, step) =
                    self.execute(ctx, scratch.get(..n).unwrap_or_default(), budget);
                let kept = if consumed < n && step != Step::Close {
                    self.keep(ctx, scratch.get(consumed..n).unwrap_or_default())
                } else {
                    true
                };
                *ctx.scratch = scratch;
                if !kept {
                    return Drive::Close;
                }
                match step {
                    Step::Close => return Drive::Close,
                    Step::Pause if std::mem::take(&mut self.session.yield_now) => {
                        ctx.stats.conn_yields.incr();
                        return Drive::Yield;
                    }
                    Step::Wait => return self.wait_flash(ctx),
                    Step::Pause | Step::Next => {}
                }
                if *budget == 0 {
                    ctx.stats.conn_yields.incr();
                    return Drive::Yield;
                }
            }
        }
    }

    /// Whether the unfinished input is a text line still without its end, known from the
    /// last parse and the bytes read since, with nothing the parser would refuse in the
    /// meantime (its length limits, checked again once crossed).
    fn line_still_unfinished(&mut self) -> bool {
        let known = self.no_newline;
        let have = self.buffered();
        if known == 0
            || known > have
            || self.session.swallow > 0
            || self.session.protocol != Some(Protocol::Text)
            || have > proto::MAX_GET_LINE_LEN
            || (have > proto::MAX_LINE_LEN && known <= proto::MAX_LINE_LEN)
        {
            return false;
        }
        let fresh = self
            .input
            .get(self.input_pos + known..self.input_len)
            .unwrap_or_default();
        if fresh.contains(&b'\n') {
            return false;
        }
        self.no_newline = have;
        true
    }

    /// Copy the unfinished end of a read into the connection's own buffer, within the
    /// buffer memory limit (false: over it; the connection must close, as memcached closes
    /// one it cannot give a read buffer).
    fn keep(&mut self, ctx: &Ctx<'_>, rest: &[u8]) -> bool {
        if !ctx.buffers.allows(rest.len() + self.session.out.capacity()) {
            ctx.stats.read_buf_oom.incr();
            return false;
        }
        // Called with no unfinished input (the read went to the scratch buffer).
        self.input.clear();
        self.input.extend_from_slice(rest);
        self.input_len = rest.len();
        self.input_pos = 0;
        self.input_need = 0;
        true
    }

    /// Show the state the connection rests in now (under io_uring, after a send completed
    /// without driving it: `conn_mwrite` no longer).
    pub fn refresh_state(&self) {
        self.info.set_state(self.resting_state());
    }

    /// The state `stats conns` shows while the connection waits for its socket.
    fn resting_state(&self) -> ConnState {
        if self.session.close_after_write || self.eof {
            ConnState::Closing
        } else if self.session.watch.is_some() {
            ConnState::Watch
        } else if self.session.pending() > 0 || self.stream.owes() {
            ConnState::MWrite
        } else if self.session.swallow > 0 {
            ConnState::Swallow
        } else if self.buffered() == 0 {
            ConnState::NewCmd
        } else if self.partial_has_command() {
            ConnState::NRead
        } else {
            ConnState::Read
        }
    }

    /// Whether the unfinished input holds a whole command line (or binary header) whose
    /// data is still coming.
    fn partial_has_command(&self) -> bool {
        if self.input_lent {
            // Lent only for the rest of a request whose head told its length.
            return true;
        }
        let rest = self
            .input
            .get(self.input_pos..self.input_len)
            .unwrap_or_default();
        match self.session.protocol {
            Some(Protocol::Binary) => rest.len() >= bin::HEADER_LEN,
            _ => rest.contains(&b'\n'),
        }
    }

    /// Move the unfinished request (`have` bytes) into one of the worker's spare buffers,
    /// if one is larger than this connection's, to read the rest of its `need` bytes into.
    fn take_spare(&mut self, ctx: &mut Ctx<'_>, spares: &mut Spares, need: usize, have: usize) {
        let Some(mut spare) = self.spare(ctx, spares, need, self.input.capacity()) else {
            return;
        };
        if spare.len() < have {
            spare.resize(have, 0);
        }
        match (spare.get_mut(..have), self.input.get(..have)) {
            (Some(to), Some(from)) => to.copy_from_slice(from),
            // `have` is within the input; were it not, the buffer stays as it is.
            _ => {
                spares.put(spare, ctx.stats);
                return;
            }
        }
        let old = std::mem::replace(&mut self.input, spare);
        spares.put(old, ctx.stats);
    }

    /// One of the worker's spares for a request of `need` bytes (see [`Spares::take`]),
    /// within the buffer memory this connection may hold with its output buffer.
    fn spare(
        &self,
        ctx: &mut Ctx<'_>,
        spares: &mut Spares,
        need: usize,
        cap: usize,
    ) -> Option<Vec<u8>> {
        let allows = self.input_allowed(ctx);
        spares.take(need, cap, allows, ctx.stats)
    }

    /// Whether this connection may hold an input buffer of so many bytes beside its output
    /// buffer, within the worker's buffer memory.
    fn input_allowed(&self, ctx: &Ctx<'_>) -> impl Fn(usize) -> bool {
        let out = self.session.out.capacity();
        let buffers = ctx.buffers;
        move |c| buffers.allows(c + out)
    }

    /// A spare buffer to read the next request straight into, for a connection whose last
    /// request was large and that has nothing unfinished (`None`: read as usual, into the
    /// worker's scratch buffer or the socket's receive buffers). Its first
    /// [`SPARE_READ`] bytes at least are initialized.
    fn spare_for_next(&mut self, ctx: &mut Ctx<'_>, spares: &mut Spares) -> Option<Vec<u8>> {
        if !self.large || self.session.swallow > 0 {
            return None;
        }
        let allows = self.input_allowed(ctx);
        let mut buf = spares.for_next(SPARE_READ, allows, ctx.stats)?;
        if buf.len() < SPARE_READ {
            buf.resize(SPARE_READ.min(buf.capacity()), 0);
        }
        Some(buf)
    }

    /// Under io_uring, lend a spare buffer (`spare_for_next`) to the socket, to receive the
    /// next request straight into, rather than into provided buffers or the socket's own
    /// and then copy it here.
    fn lend_spare(&mut self, ctx: &mut Ctx<'_>, spares: &mut Spares, limit: usize) -> bool {
        if !matches!(&self.stream, Stream::Ring(ring) if ring.can_lend()) || !self.large {
            return false;
        }
        if !spares.lend() {
            return false;
        }
        let Some(buf) = self.spare_for_next(ctx, spares) else {
            spares.lend_end();
            return false;
        };
        let end = buf.len().min(limit);
        self.release_input(ctx, spares);
        let Stream::Ring(ring) = &mut self.stream else {
            return false; // not reached: the stream is the one above
        };
        ring.lend(buf, 0, end);
        self.input_lent = true;
        self.lent_next = true;
        true
    }

    /// The spare lent for the next request is back (or the connection is closing).
    fn end_lend_next(&mut self, spares: &mut Spares) {
        if std::mem::take(&mut self.lent_next) {
            spares.lend_end();
        }
    }

    /// Other sockets: make a spare buffer (`spare_for_next`) the input buffer, to read the
    /// next request straight into rather than into the scratch buffer and copy what is
    /// unfinished of it.
    fn adopt_spare(&mut self, ctx: &mut Ctx<'_>, spares: &mut Spares) -> bool {
        if matches!(self.stream, Stream::Ring(_)) {
            return false;
        }
        let Some(buf) = self.spare_for_next(ctx, spares) else {
            return false;
        };
        let old = std::mem::replace(&mut self.input, buf);
        spares.put(old, ctx.stats);
        true
    }

    /// The input buffer of a connection that is closing (none while the kernel may still
    /// write into it).
    pub fn take_input(&mut self, spares: &mut Spares) -> Vec<u8> {
        self.end_lend_next(spares);
        if self.input_lent {
            return match self.stream.ring_mut().and_then(RingSock::reclaim) {
                Some((buf, _)) => {
                    self.input_lent = false;
                    buf
                }
                None => Vec::new(),
            };
        }
        std::mem::take(&mut self.input)
    }

    /// Give the input buffer back: to the worker's spares if it is large (its next large
    /// request then needs no growing).
    fn release_input(&mut self, ctx: &mut Ctx<'_>, spares: &mut Spares) {
        spares.put(std::mem::take(&mut self.input), ctx.stats);
    }

    /// The client has nothing more for now: give back the buffers that hold nothing (an
    /// idle connection holds no buffers).
    fn idle(&mut self, ctx: &mut Ctx<'_>, spares: &mut Spares) {
        self.session.release_idle();
        if self.input_pos == self.input_len && self.input.capacity() > 0 {
            self.release_input(ctx, spares);
            self.input_pos = 0;
            self.input_len = 0;
            self.input_need = 0;
        }
    }

    /// Read from the socket into the scratch buffer (when no request is unfinished) or onto
    /// the end of the unfinished input, growing it within the request limit and the buffer
    /// memory limit (an error closes the connection).
    fn read(&mut self, ctx: &mut Ctx<'_>, spares: &mut Spares) -> io::Result<Received> {
        let limit = ctx.shared.max_request_len();
        if self.input_lent {
            match self.stream.ring_mut().and_then(RingSock::reclaim) {
                None => return Ok(Received::WouldBlock),
                Some((buf, got)) => {
                    self.input = buf;
                    self.input_lent = false;
                    self.end_lend_next(spares);
                    if self.input_len == 0 && got < LEND_MIN {
                        // What came after a large request is small: most likely a small
                        // request, read as usual from now on.
                        self.large = false;
                    }
                    if got > 0 {
                        self.input_len += got;
                        ctx.stats.bytes_read.add(got as u64);
                        // Not `drained`: the connection lends its buffer again for the rest
                        // rather than wait for a receive of another kind.
                        return Ok(Received::Data(Source::Input, true));
                    }
                    // End of file or an error: the read below says which.
                }
            }
        }
        loop {
            let result = if self.buffered() == 0 {
                self.input_len = 0;
                self.input_pos = 0;
                self.input_need = 0;
                if self.lend_spare(ctx, spares, limit) {
                    return Ok(Received::WouldBlock);
                }
                if self.adopt_spare(ctx, spares) {
                    let end = self.input.len().min(limit);
                    let r = self
                        .stream
                        .read(self.input.get_mut(..end).unwrap_or_default());
                    if let Ok(n) = r {
                        self.input_len = n;
                        if n > 0 && n < LEND_MIN {
                            // As for a lent buffer (see `read`'s start).
                            self.large = false;
                        }
                    }
                    r.map(|n| (n, false, n == end))
                } else {
                    let scratch: &mut Vec<u8> = ctx.scratch;
                    let room = scratch.len();
                    self.stream
                        .read(&mut scratch[..])
                        .map(|n| (n, true, n == room))
                }
            } else {
                // Make room: drop consumed bytes, then grow within the request limit.
                if self.input_pos > 0 {
                    self.input.copy_within(self.input_pos..self.input_len, 0);
                    self.input_len -= self.input_pos;
                    self.input_pos = 0;
                }
                let have = self.input_len;
                if have >= limit {
                    return Err(io::Error::other("request exceeds the largest allowed"));
                }
                // Small steps first: a dribbling client (slowloris) holds a few KiB, not a
                // read-sized buffer, and a client holds at most twice what it sent (not
                // what it announced: memcached allocates the item when the line arrives,
                // but from -m); a large value still arrives in O(log n) reads. A request
                // whose length its head tells (a storage command's line, a binary header)
                // grows no further than that.
                // (Reached with input buffered only when the parser found the request at
                // its front incomplete: see step 2 of `run`.)
                let hint = match self.session.protocol {
                    _ if self.session.swallow > 0 => None,
                    Some(Protocol::Binary) => {
                        bin::request_len_hint(self.input.get(..have).unwrap_or_default())
                    }
                    _ => proto::request_len_hint(self.input.get(..have).unwrap_or_default()),
                };
                let need = hint.filter(|&total| total > have);
                self.input_need = need.unwrap_or(0);
                if let Some(total) = need {
                    self.large = total >= LARGE_REQUEST;
                }
                let step = (have + INPUT_STEP).max(have * 2);
                let want = step.min(need.unwrap_or(step)).min(limit);
                if let Some(total) = need.filter(|_| want > self.input.capacity()) {
                    self.take_spare(ctx, spares, total.min(limit), have);
                }
                if want > self.input.capacity()
                    && !ctx.buffers.allows(want + self.session.out.capacity())
                {
                    ctx.stats.read_buf_oom.incr();
                    return Err(io::Error::other("out of connection buffer memory"));
                }
                if want > self.input.len() {
                    self.input.resize(want, 0);
                }
                // Room already initialized (by an earlier, larger request) is used too.
                let end = self.input.len().min(limit);
                if let (Some(_), Stream::Ring(ring)) = (need, &mut self.stream) {
                    if ring.can_lend() && end > have {
                        // io_uring: the kernel receives the rest straight into this buffer.
                        ring.lend(std::mem::take(&mut self.input), have, end);
                        self.input_lent = true;
                        return Ok(Received::WouldBlock);
                    }
                }
                let r = self
                    .stream
                    .read(self.input.get_mut(have..end).unwrap_or_default());
                let n = *r.as_ref().unwrap_or(&0);
                self.input_len = have + n;
                r.map(|n| (n, false, n == end - have))
            };
            match result {
                Ok((0, _, _)) => return Ok(Received::Eof),
                Ok((n, scratch, full)) => {
                    ctx.stats.bytes_read.add(n as u64);
                    let source = if scratch {
                        Source::Scratch(n)
                    } else {
                        Source::Input
                    };
                    return Ok(Received::Data(source, full));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Received::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Execute the requests at the front of `data` (`exec::dispatch::stream`); returns the
    /// bytes consumed and how the last step ended.
    fn execute(&mut self, ctx: &mut Ctx<'_>, data: &[u8], budget: &mut usize) -> (usize, Step) {
        if self.session.watch.is_none() {
            self.info.set_state(ConnState::ParseCmd);
        }
        let batch = dispatch::stream(ctx, &mut self.session, data, budget);
        // A line without its end: the next parse need not look at these bytes again.
        self.no_newline = batch.unfinished_line.unwrap_or(0);
        (batch.used, batch.step)
    }

    /// Write pending output until done or the socket would block.
    fn flush(&mut self, stats: &WorkerStats) -> io::Result<()> {
        let s = &mut self.session;
        if let Stream::Ring(ring) = &mut self.stream {
            // io_uring: the output buffer itself becomes the send buffer (no copy, and no
            // memory beyond what the output buffer was allowed to take), with its spliced
            // values.
            if s.pending() > 0 {
                match ring.hand_over(&mut s.out, s.out_pos, &mut s.spliced) {
                    Some(n) => {
                        stats.bytes_written.add(n as u64);
                        s.out_pos = 0;
                    }
                    // A send is queued or in flight: the spliced values wait here for it
                    // (a write would copy them into its buffer).
                    None if !s.spliced.is_empty() => return ring.error(),
                    None => {}
                }
            }
        }
        while s.pending() > 0 {
            let wrote = if s.spliced.is_empty() {
                self.stream
                    .write(s.out.get(s.out_pos..).unwrap_or_default())
            } else {
                // One writev of the buffer's bytes and the values between them.
                let mut slices = [io::IoSlice::new(&[]); MAX_SLICES];
                let n = s.spliced.gather(&s.out, s.out_pos, &mut slices);
                self.stream
                    .write_vectored(slices.get(..n).unwrap_or_default())
            };
            match wrote {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    s.out_pos = s.spliced.advance(s.out.len(), s.out_pos, n);
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
        // TLS records of the last write that the socket did not take yet.
        self.stream.flush()
    }

    /// Count and log a TLS session that failed (memcached's `ssl_handshake_errors` and
    /// `ssl_proto_errors`).
    fn count_tls_failure(&self, ctx: &Ctx<'_>, e: &io::Error) {
        let Stream::Tls(tls) = &self.stream else {
            return;
        };
        let Some(failure) = tls.failure() else {
            return;
        };
        let Some(server) = &ctx.shared.tls else {
            return;
        };
        let (counter, what) = match failure {
            kvtls::Failure::Handshake => (&server.counters.handshake_errors, "handshake"),
            kvtls::Failure::Protocol => (&server.counters.proto_errors, "protocol"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::info!("{}: TLS {what} error: {e}", self.info.addr);
    }
}
