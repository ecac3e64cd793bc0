//! The UDP path (`-U`): memcached's framed datagrams, received and sent in batches.
//!
//! Every worker has its own socket on the UDP port (SO_REUSEPORT; the first worker's are bound
//! at startup, so that a port the kernel picks is known to the others), so the kernel spreads
//! datagrams over the workers and no socket is shared. A worker takes up to [`BATCH`]
//! datagrams per `recvmmsg` into buffers it keeps ([`Buffers`]), answers them into one output
//! buffer (values are copied once, from the item memory into it), and sends the reply
//! datagrams with `sendmmsg`, [`BATCH`] per call, each as two pieces (the 8-byte frame header
//! and a slice of the output buffer), so a reply is never copied again to be framed.
//!
//! A request is one datagram (memcached drops requests that span datagrams). Requests run
//! through the same dispatch as a stream's (`exec::dispatch::request`), on a session that
//! lives for one datagram. Replies are framed as memcached 1.6 frames them (see `kvproto::udp`): each
//! request's reply is its own message, and a multi-key `get` sends one message per key (`END`
//! goes with the last). memcached keeps its replies in a queue that it flushes at the end of
//! a datagram, every `-R` requests (21 the first time) and after `mn` or a binary `noop`,
//! error or `quit`. A message with no bytes is a bare 8-byte header (count 0), sent only when
//! no other message of its flush went out before it: memcached consumes later empty messages
//! as part of the send before them. Silent text replies (`noreply`, `q`) are no message at
//! all; silent binary replies (quiet commands) are empty messages. A multiget rejected for an
//! over-long key drops the unsent messages of its flush, as memcached does.

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

use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr;

use kvproto::binary as bin;
use kvproto::text as proto;
use kvproto::udp::{self as frame, Datagrams, HEADER_LEN};
use socket2::{Domain, Socket, Type};

use crate::exec::dispatch::{self, Dispatch, Kind};
use crate::exec::session::{Ctx, Protocol, Session, Step};
use crate::exec::text::GetFraming;
use crate::setup::config::Config;

/// Datagrams per `recvmmsg` or `sendmmsg` call.
const BATCH: usize = 32;

/// `recvmmsg` calls per turn before the worker turns to other sockets.
const ROUNDS: usize = 2;

/// Receive buffer per datagram: the largest UDP payload fits.
const RECV_SLOT: usize = 64 * 1024;

/// Queued replies are sent once the output buffer holds this much.
const FLUSH_AT: usize = 256 * 1024;

/// Capacity the output buffer keeps after a large reply.
const KEEP_CAPACITY: usize = 1 << 20;

/// The largest reply sent for one datagram; a request whose reply would exceed it gets
/// memcached's error for a get response it cannot build.
const MAX_REPLY: usize = 8 << 20;

/// The first UDP socket of each address the configuration asks for (none when UDP is off),
/// for the first worker. A port of 0 (`-U -1`, `-l HOST:0`) is one the kernel picks; the
/// other workers bind theirs to the address these got ([`bind_like`]).
pub fn bind_first(config: &Config) -> Result<Vec<mio::net::UdpSocket>, String> {
    if config.udp_port == 0 || config.unix_socket.is_some() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in &config.listeners {
        let addrs = entry
            .socket_addrs(config.udp_port)
            .map_err(|e| format!("failed to resolve {:?}: {e}", entry.host))?;
        for addr in addrs {
            out.push(bind(addr).map_err(|e| format!("failed to listen on UDP {addr}: {e}"))?);
        }
    }
    Ok(out)
}

/// A worker's own UDP sockets, bound to `addrs` (the addresses the first sockets got), in
/// the first sockets' SO_REUSEPORT groups.
pub fn bind_like(addrs: &[SocketAddr]) -> io::Result<Vec<mio::net::UdpSocket>> {
    addrs.iter().map(|a| bind(*a)).collect()
}

/// A non-blocking UDP socket on `addr` that other workers' sockets share (SO_REUSEPORT).
fn bind(addr: SocketAddr) -> io::Result<mio::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, None)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(mio::net::UdpSocket::from_std(socket.into()))
}

/// One reply message: `out[start..end]`, for the datagram in receive slot `peer`.
#[derive(Debug, Clone, Copy)]
struct Message {
    peer: usize,
    request_id: u16,
    start: usize,
    end: usize,
}

/// Datagrams a worker keeps waiting for flash reads at once; beyond them, a datagram's gets
/// read flash on the worker (`flash_inline_reads`).
const PARK_MAX: usize = 64;

/// Flash reads one datagram waits for at most; items beyond them are read on the worker
/// when it runs.
const PARK_READS: usize = 32;

/// Binary requests of a datagram looked at for flash reads.
const BIN_REQUESTS: usize = 64;

/// A datagram whose gets need items on flash (`-o ext_path`): kept, with its sender, while
/// the worker has the reads done (as a stream's request waits), then answered
/// ([`answer`]) as it would have been at once.
pub struct Parked {
    /// The worker's UDP socket it came on.
    pub socket: usize,
    datagram: Vec<u8>,
    addr: libc::sockaddr_storage,
    addr_len: libc::socklen_t,
    /// The reads it waits for.
    pub reads: Vec<kvstore::FlashRead>,
}

/// A worker's UDP buffers, allocated on first use and reused for every datagram.
pub struct Buffers {
    /// [`BATCH`] receive slots of [`RECV_SLOT`] bytes (pages are touched only as used).
    recv: Vec<u8>,
    /// The bytes received in each slot.
    lens: [usize; BATCH],
    /// Each slot's sender, as `recvmmsg` wrote it, and its length.
    addrs: Vec<libc::sockaddr_storage>,
    addr_lens: [libc::socklen_t; BATCH],
    /// Replies not yet sent, and their messages in order.
    out: Vec<u8>,
    messages: Vec<Message>,
    /// Datagrams set aside by the last [`serve`] for flash reads (the worker takes them),
    /// and how many are waiting in all (at most [`PARK_MAX`]).
    pub parked: Vec<Parked>,
    pub waiting: usize,
}

impl Buffers {
    pub fn new() -> Buffers {
        Buffers {
            recv: Vec::new(),
            lens: [0; BATCH],
            addrs: Vec::new(),
            addr_lens: [0; BATCH],
            out: Vec::new(),
            messages: Vec::new(),
            parked: Vec::new(),
            waiting: 0,
        }
    }
}

/// Answer the datagrams waiting on `sock`, up to [`ROUNDS`] batches. Returns true if more
/// may be waiting (the last batch was full): the caller should come back without waiting
/// for readiness, which an edge-triggered poll would not report again.
pub fn serve(sock: &mio::net::UdpSocket, ctx: &mut Ctx<'_>, b: &mut Buffers) -> bool {
    if b.recv.is_empty() {
        b.recv = vec![0; BATCH * RECV_SLOT];
        // SAFETY: sockaddr_storage is a plain C struct for which all zero bytes is a valid
        // value (an unspecified address family).
        b.addrs = vec![unsafe { zeroed::<libc::sockaddr_storage>() }; BATCH];
    }
    let fd = sock.as_raw_fd();
    let mut rounds = 0;
    while rounds < ROUNDS {
        let n = match recv_batch(fd, b) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        };
        rounds += 1;
        if n > 1 {
            prefetch(ctx, b, n);
        }
        for slot in 0..n {
            ctx.stats
                .bytes_read
                .add(b.lens.get(slot).copied().unwrap_or(0) as u64);
            let Some(datagram) = datagram(&b.recv, &b.lens, slot) else {
                continue;
            };
            let Some((header, payload)) = frame::parse_frame(datagram) else {
                continue; // malformed or multi-datagram request: memcached drops it silently
            };
            if b.waiting < PARK_MAX {
                let reads = flash_reads(ctx, payload);
                if !reads.is_empty() {
                    // Answered once its reads are done, with what it asks found then.
                    let (Some(&addr), Some(&addr_len)) = (b.addrs.get(slot), b.addr_lens.get(slot))
                    else {
                        continue;
                    };
                    b.parked.push(Parked {
                        socket: 0,
                        datagram: datagram.to_vec(),
                        addr,
                        addr_len,
                        reads,
                    });
                    b.waiting += 1;
                    continue;
                }
            }
            let reply = Reply {
                peer: slot,
                request_id: header.request_id,
                messages: &mut b.messages,
            };
            execute(ctx, payload, &mut b.out, reply);
            if b.out.len() >= FLUSH_AT {
                send_all(fd, ctx, b);
            }
        }
        send_all(fd, ctx, b);
        if n < BATCH {
            return false;
        }
    }
    true
}

/// The flash reads the gets of `payload` need, [`PARK_READS`] at most (none without a
/// tier; reads the page cache could answer at once are done here): text `get`/`gets`/`mg`
/// lines up to the first other one (`kvproto::text::read_keys`), and every binary get of
/// the first [`BIN_REQUESTS`] requests (length-framed, so a store between them is skipped).
fn flash_reads(ctx: &Ctx<'_>, payload: &[u8]) -> Vec<kvstore::FlashRead> {
    let engine = &ctx.shared.engine;
    if !engine.has_flash() {
        return Vec::new();
    }
    let mut reads = Vec::new();
    // Whether there is room for more.
    let mut add = |key: &[u8]| {
        for r in engine.flash_reads_for(key) {
            if !reads.contains(&r) {
                reads.push(r);
            }
        }
        reads.len() < PARK_READS
    };
    if payload.first() == Some(&bin::REQUEST_MAGIC) {
        let mut rest = payload;
        for _ in 0..BIN_REQUESTS {
            let bin::Parse::Request(req, used) = bin::parse(rest, &ctx.shared.limits) else {
                break;
            };
            if matches!(req.command, bin::Command::Get { .. }) && !add(req.key) {
                break;
            }
            rest = rest.get(used..).unwrap_or_default();
        }
    } else {
        for key in proto::read_keys(payload) {
            if !add(key) {
                break;
            }
        }
    }
    reads
}

/// Answer datagram `p`, set aside by [`serve`] until its flash reads were done, on `sock`.
pub fn answer(sock: &mio::net::UdpSocket, ctx: &mut Ctx<'_>, b: &mut Buffers, p: Parked) {
    b.waiting = b.waiting.saturating_sub(1);
    let Some((header, payload)) = frame::parse_frame(&p.datagram) else {
        return;
    };
    // Its sender in the first receive slot's place: nothing else is queued between calls
    // of `serve`, which sends everything it queued before it returns.
    let (Some(addr), Some(addr_len)) = (b.addrs.get_mut(0), b.addr_lens.get_mut(0)) else {
        return;
    };
    (*addr, *addr_len) = (p.addr, p.addr_len);
    let reply = Reply {
        peer: 0,
        request_id: header.request_id,
        messages: &mut b.messages,
    };
    execute(ctx, payload, &mut b.out, reply);
    send_all(sock.as_raw_fd(), ctx, b);
}

/// Start loading the index buckets and records the first `n` datagrams' reads will look up,
/// before any of them runs, so that their cache misses overlap instead of following one
/// another (MICA's batched prefetch; most datagrams carry one key). Only hints: a datagram
/// that is malformed or holds no read adds nothing.
fn prefetch(ctx: &Ctx<'_>, b: &Buffers, n: usize) {
    let keys = (0..n)
        .filter_map(|slot| datagram(&b.recv, &b.lens, slot))
        .filter_map(|d| frame::parse_frame(d).map(|(_, payload)| payload))
        .flat_map(proto::read_keys);
    ctx.shared.engine.prefetch(keys);
}

/// The datagram `recvmmsg` left in receive slot `slot` (None past the slots).
fn datagram<'a>(recv: &'a [u8], lens: &[usize], slot: usize) -> Option<&'a [u8]> {
    let start = slot * RECV_SLOT;
    recv.get(start..start + lens.get(slot).copied().unwrap_or(0))
}

/// `recvmmsg` into the receive slots; returns how many datagrams arrived (0: none waiting).
fn recv_batch(fd: RawFd, b: &mut Buffers) -> io::Result<usize> {
    // SAFETY: iovec and mmsghdr are plain C structs; all zero bytes is a valid value
    // (null pointers, zero lengths).
    let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
    for (iov, slot) in iovs.iter_mut().zip(b.recv.chunks_exact_mut(RECV_SLOT)) {
        iov.iov_base = slot.as_mut_ptr().cast();
        iov.iov_len = slot.len();
    }
    let iov_base = iovs.as_mut_ptr();
    let addr_base = b.addrs.as_mut_ptr();
    let slots = BATCH.min(b.addrs.len()).min(b.recv.len() / RECV_SLOT);
    for (i, h) in hdrs.iter_mut().enumerate().take(slots) {
        // Pointers into `iovs` and `b.addrs`, both left alone until recvmmsg returns.
        h.msg_hdr.msg_iov = iov_base.wrapping_add(i);
        h.msg_hdr.msg_iovlen = 1;
        h.msg_hdr.msg_name = addr_base.wrapping_add(i).cast();
        h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    }
    // SAFETY: the first `slots` headers point at valid iovecs, each covering a distinct
    // RECV_SLOT-byte region of `b.recv`, and at distinct sockaddr_storage entries of
    // `b.addrs` with their true size; none of these is moved or otherwise accessed during
    // the call, and the kernel writes at most `slots` headers and within those bounds.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            hdrs.as_mut_ptr(),
            slots as libc::c_uint,
            libc::MSG_DONTWAIT,
            ptr::null_mut(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(0),
            _ => Err(e),
        };
    }
    let n = (n as usize).min(slots);
    for ((h, len), addr_len) in hdrs
        .iter()
        .take(n)
        .zip(b.lens.iter_mut())
        .zip(b.addr_lens.iter_mut())
    {
        *len = (h.msg_len as usize).min(RECV_SLOT);
        *addr_len = h.msg_hdr.msg_namelen;
    }
    Ok(n)
}

/// Send every queued message and empty the queue.
fn send_all(fd: RawFd, ctx: &mut Ctx<'_>, b: &mut Buffers) {
    send_messages(fd, ctx, b);
    b.out.clear();
    b.messages.clear();
    if b.out.capacity() > KEEP_CAPACITY {
        b.out.shrink_to(FLUSH_AT);
    }
}

fn send_messages(fd: RawFd, ctx: &mut Ctx<'_>, b: &Buffers) {
    let out = &b.out;
    let mut datagrams = b.messages.iter().enumerate().flat_map(|(m, msg)| {
        let body = out.get(msg.start..msg.end).unwrap_or_default();
        Datagrams::new(msg.request_id, body).map(move |d| (m, msg.peer, d))
    });
    let mut heads = [[0u8; HEADER_LEN]; BATCH];
    let mut payloads: [&[u8]; BATCH] = [&[]; BATCH];
    let mut peers = [0usize; BATCH];
    let mut msgs = [0usize; BATCH];
    // A message whose datagram could not be sent: the rest of it is dropped too.
    let mut dropped = None;
    loop {
        let mut n = 0;
        while n < BATCH {
            let Some((m, peer, d)) = datagrams.next() else {
                break;
            };
            if dropped == Some(m) {
                continue;
            }
            let (Some(head), Some(payload), Some(to), Some(of)) = (
                heads.get_mut(n),
                payloads.get_mut(n),
                peers.get_mut(n),
                msgs.get_mut(n),
            ) else {
                break; // n < BATCH: never
            };
            (*head, *payload, *to, *of) = (d.header, d.payload, peer, m);
            n += 1;
        }
        if n == 0 {
            return;
        }
        let mut done = 0;
        while done < n {
            let batch = Batch {
                heads: heads.get(done..n).unwrap_or_default(),
                payloads: payloads.get(done..n).unwrap_or_default(),
                peers: peers.get(done..n).unwrap_or_default(),
            };
            match send_batch(fd, batch, b) {
                Ok((sent, bytes)) if sent > 0 => {
                    ctx.stats.bytes_written.add(bytes);
                    done += sent;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // UDP is lossy: a full socket buffer drops the rest of this reply.
                _ => {
                    let Some(&m) = msgs.get(done) else {
                        break;
                    };
                    dropped = Some(m);
                    while done < n && msgs.get(done) == Some(&m) {
                        done += 1;
                    }
                }
            }
        }
    }
}

/// Datagrams for one `sendmmsg`: headers, payloads and receive slots of their peers.
struct Batch<'a> {
    heads: &'a [[u8; HEADER_LEN]],
    payloads: &'a [&'a [u8]],
    peers: &'a [usize],
}

/// One `sendmmsg`; returns the datagrams sent (from the first) and their bytes.
fn send_batch(fd: RawFd, batch: Batch<'_>, b: &Buffers) -> io::Result<(usize, u64)> {
    // SAFETY: iovec and mmsghdr are plain C structs; all zero bytes is a valid value
    // (null pointers, zero lengths).
    let mut iovs: [[libc::iovec; 2]; BATCH] = unsafe { zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
    let mut n = 0;
    for (iov, ((head, payload), &peer)) in iovs
        .iter_mut()
        .zip(batch.heads.iter().zip(batch.payloads).zip(batch.peers))
    {
        if peer >= b.addrs.len() || peer >= BATCH {
            break;
        }
        // The kernel only reads through these pointers (sendmmsg).
        iov[0].iov_base = head.as_ptr().cast_mut().cast();
        iov[0].iov_len = head.len();
        iov[1].iov_base = payload.as_ptr().cast_mut().cast();
        iov[1].iov_len = payload.len();
        n += 1;
    }
    let iov_base = iovs.as_mut_ptr();
    let mut ready = 0;
    for (h, &peer) in hdrs.iter_mut().zip(batch.peers).take(n) {
        let (Some(addr), Some(&addr_len)) = (b.addrs.get(peer), b.addr_lens.get(peer)) else {
            break;
        };
        h.msg_hdr.msg_iov = iov_base.wrapping_add(ready).cast();
        h.msg_hdr.msg_iovlen = 2;
        h.msg_hdr.msg_name = ptr::from_ref(addr).cast_mut().cast();
        h.msg_hdr.msg_namelen = addr_len;
        ready += 1;
    }
    let n = ready;
    if n == 0 {
        return Ok((0, 0));
    }
    // SAFETY: the first `n` headers point at two valid iovecs each (a header array and a
    // slice of the output buffer, both borrowed for the call) and at a sockaddr_storage
    // filled by recvmmsg with its length; sendmmsg only reads through them and writes
    // `msg_len` of at most `n` headers.
    let sent =
        unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let sent = (sent as usize).min(n);
    let bytes = hdrs.iter().take(sent).map(|h| u64::from(h.msg_len)).sum();
    Ok((sent, bytes))
}

/// Where one datagram's reply messages go, and the state of memcached's reply queue.
struct Reply<'a> {
    peer: usize,
    request_id: u16,
    messages: &'a mut Vec<Message>,
}

/// memcached's reply queue within one datagram: which messages one flush covers.
struct Queue {
    /// Index of the first message of the current flush.
    flush_start: usize,
    /// No message of the current flush was sent yet: an empty message would be.
    nothing_sent: bool,
    /// Requests left before memcached flushes for `-R`.
    left: usize,
    per_event: usize,
}

impl Reply<'_> {
    /// A message of `out[start..end]`: sent if not empty; if empty, sent as a bare header
    /// when `empty_counts` and nothing of this flush went out before it.
    fn message(&mut self, q: &mut Queue, start: usize, end: usize, empty_counts: bool) {
        if end > start || (empty_counts && q.nothing_sent) {
            q.nothing_sent = false;
            self.messages.push(Message {
                peer: self.peer,
                request_id: self.request_id,
                start,
                end,
            });
        }
    }

    fn flush(&mut self, q: &mut Queue) {
        q.flush_start = self.messages.len();
        q.nothing_sent = true;
    }

    /// One request done: memcached flushes every `-R` requests.
    fn request_done(&mut self, q: &mut Queue) {
        q.left = q.left.saturating_sub(1);
        if q.left == 0 {
            q.left = q.per_event.max(1);
            self.flush(q);
        }
    }
}

/// Execute every request in one datagram, appending the replies to `out` and their
/// messages to `reply`.
fn execute(ctx: &mut Ctx<'_>, payload: &[u8], out: &mut Vec<u8>, mut reply: Reply<'_>) {
    let base = out.len();
    let base_messages = reply.messages.len();
    let mut s = Session::new();
    s.out = std::mem::take(out);
    let per_event = ctx.shared.config.reqs_per_event;
    let mut q = Queue {
        flush_start: base_messages,
        nothing_sent: true,
        // memcached runs one request before it starts counting.
        left: per_event.saturating_add(1),
        per_event,
    };
    // A datagram's protocol is its first byte's (UDP has no `-B`, no authentication).
    let protocol = match payload.first() {
        Some(&bin::REQUEST_MAGIC) => Protocol::Binary,
        _ => Protocol::Text,
    };
    let mut pos = 0;
    while pos < payload.len() && s.out.len() - base <= MAX_REPLY {
        let rest = payload.get(pos..).unwrap_or_default();
        let start = s.out.len();
        let mut framing = Datagram {
            reply: &mut reply,
            q: &mut q,
            base,
            framed: false,
        };
        let done = dispatch::request(ctx, &mut s, protocol, rest, &mut framing);
        let framed = framing.framed;
        let Dispatch::Done { used, step, kind } = done else {
            break; // incomplete (memcached drops requests that span datagrams), or close
        };
        if protocol == Protocol::Binary {
            // Quiet commands' silence is an empty message; an error ends the datagram.
            let stop = match kind {
                Kind::Executed | Kind::MetaNoop => {
                    pos += used;
                    step == Step::Close
                }
                Kind::Refused | Kind::TooLarge => true,
            };
            let end = s.out.len();
            reply.message(&mut q, start, end, true);
            if s.out.get(start..end).is_some_and(binary_flushes) {
                reply.flush(&mut q);
            }
            if stop {
                break;
            }
        } else {
            if !framed {
                reply.message(&mut q, start, s.out.len(), false);
            }
            match kind {
                Kind::Executed | Kind::MetaNoop => {
                    if kind == Kind::MetaNoop {
                        reply.flush(&mut q); // `mn` flushes memcached's queue
                    }
                    match step {
                        Step::Close => break,
                        // Over MAX_REPLY (the error replaces the reply below).
                        Step::Pause => break,
                        // Not on UDP: its requests never wait (a datagram waits for its
                        // flash reads before it runs: `Parked`).
                        Step::Wait => break,
                        Step::Next => pos += used,
                    }
                }
                Kind::Refused => pos += used,
                // The rest of the datagram is the value memcached would swallow.
                Kind::TooLarge => break,
            }
        }
        reply.request_done(&mut q);
        if s.close_after_write {
            break;
        }
    }
    if s.out.len() - base > MAX_REPLY {
        s.out.truncate(base);
        reply.messages.truncate(base_messages);
        s.out
            .extend_from_slice(b"SERVER_ERROR out of memory writing get response\r\n");
        let end = s.out.len();
        reply.message(&mut q, base, end, false);
    }
    *out = std::mem::take(&mut s.out);
}

/// Whether memcached flushes its reply queue after this binary reply: `noop` and `quit`,
/// and errors without a key (the miss of a `getk` keeps the queue).
fn binary_flushes(reply: &[u8]) -> bool {
    let Some(head) = reply.first_chunk::<8>() else {
        return false;
    };
    let [magic, opcode, k0, k1, _, _, s0, s1] = *head;
    magic == bin::RESPONSE_MAGIC
        && (opcode == bin::opcode::NOOP
            || opcode == bin::opcode::QUIT
            || (u16::from_be_bytes([s0, s1]) != 0 && u16::from_be_bytes([k0, k1]) == 0))
}

/// get/gets/gat/gats over UDP: one message per key, `END` with the last, as memcached does.
/// A get whose reply outgrows [`MAX_REPLY`] stops with `Step::Pause` (the datagram's reply
/// becomes memcached's error).
struct Datagram<'r, 'a> {
    reply: &'r mut Reply<'a>,
    q: &'r mut Queue,
    /// Where this datagram's replies start in the output.
    base: usize,
    /// A get framed its own messages.
    framed: bool,
}

impl GetFraming for Datagram<'_, '_> {
    fn before_key(&mut self, _: &Ctx<'_>, _: &mut Session, _: Option<usize>) -> Option<Step> {
        self.framed = true;
        None
    }

    fn after_key(
        &mut self,
        s: &mut Session,
        key_start: usize,
        more: bool,
        rejected: bool,
    ) -> Option<Step> {
        if s.out.len() - self.base > MAX_REPLY {
            return Some(Step::Pause);
        }
        if more && !rejected {
            self.reply.message(self.q, key_start, s.out.len(), true);
        }
        None
    }

    fn finish(&mut self, s: &mut Session, rejected: bool, last: usize) {
        self.framed = true;
        let (reply, q) = (&mut *self.reply, &mut *self.q);
        if rejected {
            // memcached drops the replies of this flush not sent yet and answers only the
            // error.
            let (cut, first) = reply
                .messages
                .get(q.flush_start)
                .map_or((s.out.len(), false), |m| (m.start, true));
            if first {
                reply.messages.truncate(q.flush_start);
            }
            s.out.truncate(cut.min(s.out.len()));
            let start = s.out.len();
            proto::write_error(&mut s.out, proto::BAD_FORMAT);
            q.nothing_sent = true;
            reply.message(q, start, s.out.len(), false);
        } else {
            s.out.extend_from_slice(proto::END);
            reply.message(q, last, s.out.len(), false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::dispatch::tests::TestSession;

    /// The messages one datagram's requests are answered with, as text.
    fn answer(t: &mut TestSession, payload: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let mut messages = Vec::new();
        t.with_ctx(|ctx, _| {
            let reply = Reply {
                peer: 0,
                request_id: 1,
                messages: &mut messages,
            };
            execute(ctx, payload, &mut out, reply);
        });
        messages
            .iter()
            .map(|m| out[m.start..m.end].escape_ascii().to_string())
            .collect()
    }

    #[test]
    fn a_datagram_runs_through_the_one_dispatch_and_is_framed_per_key() {
        let mut t = TestSession::new(&[]);
        t.send(b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\n");
        assert_eq!(
            answer(&mut t, b"get a b\r\n"),
            [
                "VALUE a 0 1\\r\\n1\\r\\n",
                "VALUE b 0 1\\r\\n2\\r\\nEND\\r\\n"
            ]
        );
        // A refused line is answered and the datagram goes on; noreply is no message.
        assert_eq!(
            answer(&mut t, b"bogus\r\nset c 0 0 1 noreply\r\n3\r\nget c\r\n"),
            ["ERROR\\r\\n", "VALUE c 0 1\\r\\n3\\r\\nEND\\r\\n"]
        );
        // An unfinished request (one spanning datagrams) is dropped.
        assert!(answer(&mut t, b"set d 0 0 5\r\nab").is_empty());
    }

    #[test]
    fn a_binary_error_ends_the_datagram() {
        let mut t = TestSession::new(&[]);
        let mut payload = Vec::new();
        kvproto::client::binary::request(&mut payload, 0x7f, b"", &[], &[], 1);
        kvproto::client::binary::noop(&mut payload, 2);
        let got = answer(&mut t, &payload);
        assert_eq!(got.len(), 1, "{got:?}");
        let mut want = Vec::new();
        bin::write_error(&mut want, 0x7f, 1, bin::Status::UnknownCommand);
        assert_eq!(got[0], want.escape_ascii().to_string());
    }
}
