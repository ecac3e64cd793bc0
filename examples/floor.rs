//! The floor under a memcached-style GET server on this kernel: a server that answers every
//! `get` with the same canned value and does nothing else (no table, no protocol beyond
//! finding the key), with the same system-call techniques kvcached uses. `bench/floor.sh`
//! runs it beside kvcached and the reference: its CPU per request is what the kernel's
//! network path costs alone, so no server built on these interfaces can go below it.
//!
//! usage: floor udp PORT VALUE_BYTES [ADDR]   (recvmmsg/sendmmsg, 64 datagrams per call)
//!        floor tcp PORT VALUE_BYTES [ADDR]   (io_uring: multishot accept and receive into
//!                                             provided buffers, one submission per loop)
//!
//! Two techniques kvcached does not use can be switched on over TCP, so that
//! `bench/floor.sh -V` measures them beside the plain floor: `FLOOR_FIXED=1` (connections in
//! io_uring's registered file table) and `FLOOR_GATHER=N:U` (each wait asks for the turn's
//! sends and N more completions, and returns after U microseconds with whatever came).
//!
//! It listens on ADDR (default 127.0.0.1), prints `ready` once bound, and runs until killed. TCP answers
//! `get KEY` with the value and `set KEY F E N` (after its N bytes) with `STORED`; anything
//! else closes the connection. A benchmark tool only: it trusts its load generator.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mode), Some(port), Some(value)) = (args.get(1), args.get(2), args.get(3)) else {
        return Err(io::Error::other(
            "usage: floor udp|tcp PORT VALUE_BYTES [ADDR]",
        ));
    };
    let port: u16 = port.parse().map_err(io::Error::other)?;
    let value = vec![b'x'; value.parse::<usize>().map_err(io::Error::other)?];
    let addr: std::net::IpAddr = match args.get(4) {
        Some(a) => a.parse().map_err(io::Error::other)?,
        None => std::net::Ipv4Addr::LOCALHOST.into(),
    };
    match mode.as_str() {
        "udp" => udp((addr, port), &value),
        "tcp" => tcp((addr, port), &value),
        _ => Err(io::Error::other("mode is udp or tcp")),
    }
}

fn ready() -> io::Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()
}

/// `VALUE key 0 len\r\n<value>\r\nEND\r\n` appended to `out`.
fn reply(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.extend_from_slice(format!(" 0 {}\r\n", value.len()).as_bytes());
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\nEND\r\n");
}

const BATCH: usize = 64;
const DGRAM: usize = 1500;

fn udp(addr: (std::net::IpAddr, u16), value: &[u8]) -> io::Result<()> {
    let sock = UdpSocket::bind(addr)?;
    ready()?;
    let fd = sock.as_raw_fd();
    let mut input = vec![[0u8; DGRAM]; BATCH];
    let mut output: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(DGRAM)).collect();
    // SAFETY: all-zero sockaddr_storage, iovec and mmsghdr are valid values of these C types.
    let (peer, iov, msg): (libc::sockaddr_storage, libc::iovec, libc::mmsghdr) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
    let mut peers: Vec<libc::sockaddr_storage> = vec![peer; BATCH];
    let mut in_iov: Vec<libc::iovec> = vec![iov; BATCH];
    let mut out_iov: Vec<libc::iovec> = vec![iov; BATCH];
    let mut in_msgs: Vec<libc::mmsghdr> = vec![msg; BATCH];
    let mut out_msgs: Vec<libc::mmsghdr> = vec![msg; BATCH];
    loop {
        for i in 0..BATCH {
            in_iov[i] = libc::iovec {
                iov_base: input[i].as_mut_ptr().cast(),
                iov_len: DGRAM,
            };
            let h = &mut in_msgs[i].msg_hdr;
            h.msg_name = (&mut peers[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_iov = &mut in_iov[i];
            h.msg_iovlen = 1;
        }
        // SAFETY: every header points at a buffer, address and iovec that live across the call.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                in_msgs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        let Ok(n) = usize::try_from(n) else {
            continue;
        };
        let mut out_n = 0;
        for i in 0..n {
            let d = &input[i][..(in_msgs[i].msg_len as usize).min(DGRAM)];
            // An 8-byte frame header (request id, sequence, count, reserved), then `get KEY`.
            let Some(key) = d.get(8..).and_then(|r| r.strip_prefix(b"get ")) else {
                continue;
            };
            let end = key
                .iter()
                .position(|&b| b == b'\r' || b == b' ')
                .unwrap_or(key.len());
            let out = &mut output[out_n];
            out.clear();
            out.extend_from_slice(&d[..2]);
            out.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
            reply(out, &key[..end], value);
            out_iov[out_n] = libc::iovec {
                iov_base: out.as_mut_ptr().cast(),
                iov_len: out.len(),
            };
            let h = &mut out_msgs[out_n].msg_hdr;
            h.msg_name = (&mut peers[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = in_msgs[i].msg_hdr.msg_namelen;
            h.msg_iov = &mut out_iov[out_n];
            h.msg_iovlen = 1;
            out_n += 1;
        }
        if out_n > 0 {
            // SAFETY: as for the receive: the headers point at live buffers and addresses.
            unsafe { libc::sendmmsg(fd, out_msgs.as_mut_ptr(), out_n as u32, 0) };
        }
    }
}

const RX_BUFS: u16 = 256;
const RX_BUF: usize = 4096;
const GROUP: u16 = 0;
const OP_ACCEPT: u64 = 1;
const OP_RECV: u64 = 2;
const OP_SEND: u64 = 3;

/// `$make` with `$t` naming the connection's socket: its slot in the registered file table
/// under `FLOOR_FIXED`, else its descriptor (two types, so not a function).
macro_rules! on_conn {
    ($fixed:expr, $slot:expr, $fd:expr, |$t:ident| $make:expr) => {
        if $fixed {
            let $t = types::Fixed($slot as u32);
            $make
        } else {
            let $t = $fd;
            $make
        }
    };
}

fn ud(op: u64, slot: usize) -> u64 {
    op << 56 | slot as u64
}

#[derive(Default)]
struct Conn {
    fd: Option<OwnedFd>,
    input: Vec<u8>,
    out: Vec<u8>,
    sending: Vec<u8>,
    sent: usize,
    send_inflight: bool,
    recv_armed: bool,
}

fn tcp(addr: (std::net::IpAddr, u16), value: &[u8]) -> io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    let mut ring: IoUring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(8192)
        .build(4096)?;
    // The provided buffers: RX_BUFS of RX_BUF bytes, and their descriptor ring (page-aligned).
    let mut bufs = vec![0u8; usize::from(RX_BUFS) * RX_BUF];
    let entries_len = usize::from(RX_BUFS) * std::mem::size_of::<types::BufRingEntry>();
    let layout =
        std::alloc::Layout::from_size_align(entries_len, 4096).map_err(io::Error::other)?;
    // SAFETY: a non-zero size; zeroed is a valid state for the descriptors. Never freed: the
    // process ends by being killed.
    let entries = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<types::BufRingEntry>();
    if entries.is_null() {
        return Err(io::Error::other("out of memory"));
    }
    // SAFETY: the descriptors live for the rest of the process.
    unsafe {
        ring.submitter()
            .register_buf_ring_with_flags(entries as u64, RX_BUFS, GROUP, 0)?
    };
    let mut tail: u16 = 0;
    let give_back = |tail: &mut u16, bufs: &mut [u8], bid: u16| {
        // SAFETY: the index is below RX_BUFS, inside the descriptor mapping.
        let e = unsafe { &mut *entries.add(usize::from(*tail & (RX_BUFS - 1))) };
        e.set_addr(bufs[usize::from(bid) * RX_BUF..].as_mut_ptr() as u64);
        e.set_len(RX_BUF as u32);
        e.set_bid(bid);
        *tail = tail.wrapping_add(1);
    };
    let publish = |tail: u16| {
        // SAFETY: the tail field lies in the first descriptor; the kernel reads it.
        let t =
            unsafe { &*types::BufRingEntry::tail(entries).cast::<std::sync::atomic::AtomicU16>() };
        t.store(tail, std::sync::atomic::Ordering::Release);
    };
    for bid in 0..RX_BUFS {
        give_back(&mut tail, &mut bufs, bid);
    }
    publish(tail);
    let push = |ring: &mut IoUring, e: squeue::Entry| -> io::Result<()> {
        // SAFETY: every entry points at memory that outlives it (a connection's `sending`,
        // which is not touched while its send is in flight, or provided buffers).
        while unsafe { ring.submission().push(&e) }.is_err() {
            ring.submit()?;
        }
        Ok(())
    };
    let lfd: RawFd = listener.as_raw_fd();
    push(
        &mut ring,
        opcode::AcceptMulti::new(types::Fd(lfd))
            .build()
            .user_data(ud(OP_ACCEPT, 0)),
    )?;
    ready()?;
    let mut conns: Vec<Conn> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut touched: VecDeque<usize> = VecDeque::new();
    let gather = gather();
    // `FLOOR_FIXED=1`: connections in io_uring's registered file table (no fget per op).
    let fixed = std::env::var_os("FLOOR_FIXED").is_some();
    if fixed {
        ring.submitter().register_files_sparse(4096)?;
    }
    let mut sends = 0u32;
    loop {
        match gather {
            Some((more, usec)) => {
                // Wait for this turn's sends and `more` further completions, or `usec` and
                // then any one.
                let ts = types::Timespec::new().sec(3600);
                let args = types::SubmitArgs::new().timespec(&ts).min_wait_usec(usec);
                match ring
                    .submitter()
                    .submit_with_args((sends + more) as usize, &args)
                {
                    Ok(_) => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                    Err(e) => return Err(e),
                }
            }
            None => {
                ring.submit_and_wait(1)?;
            }
        }
        sends = 0;
        let done: Vec<cqueue::Entry> = ring.completion().collect();
        for c in done {
            let slot = (c.user_data() & 0xff_ffff) as usize;
            match c.user_data() >> 56 {
                OP_ACCEPT => {
                    if c.result() >= 0 {
                        // SAFETY: a fresh descriptor the kernel just made for us.
                        let fd = unsafe { OwnedFd::from_raw_fd(c.result()) };
                        let slot = free.pop().unwrap_or_else(|| {
                            conns.push(Conn::default());
                            conns.len() - 1
                        });
                        if fixed {
                            ring.submitter()
                                .register_files_update(slot as u32, &[fd.as_raw_fd()])?;
                        }
                        conns[slot] = Conn {
                            fd: Some(fd),
                            ..Conn::default()
                        };
                        touched.push_back(slot);
                    }
                    if !cqueue::more(c.flags()) {
                        let e = opcode::AcceptMulti::new(types::Fd(lfd)).build();
                        push(&mut ring, e.user_data(ud(OP_ACCEPT, 0)))?;
                    }
                }
                OP_RECV => {
                    let conn = &mut conns[slot];
                    if !cqueue::more(c.flags()) {
                        conn.recv_armed = false;
                    }
                    if let Some(bid) = cqueue::buffer_select(c.flags()) {
                        let n = usize::try_from(c.result()).unwrap_or(0).min(RX_BUF);
                        let start = usize::from(bid) * RX_BUF;
                        conn.input.extend_from_slice(&bufs[start..start + n]);
                        give_back(&mut tail, &mut bufs, bid);
                    }
                    if c.result() <= 0 && c.result() != -libc::ENOBUFS {
                        conn.fd = None;
                    } else {
                        serve(conn, value);
                    }
                    touched.push_back(slot);
                }
                OP_SEND => {
                    let conn = &mut conns[slot];
                    conn.send_inflight = false;
                    match usize::try_from(c.result()) {
                        Ok(n) => conn.sent += n,
                        Err(_) => conn.fd = None,
                    }
                    touched.push_back(slot);
                }
                _ => {}
            }
        }
        publish(tail);
        while let Some(slot) = touched.pop_front() {
            let conn = &mut conns[slot];
            let Some(fd) = conn.fd.as_ref().map(|f| types::Fd(f.as_raw_fd())) else {
                if !conn.recv_armed && !conn.send_inflight && !free.contains(&slot) {
                    if fixed {
                        ring.submitter().register_files_update(slot as u32, &[-1])?;
                    }
                    free.push(slot);
                }
                continue;
            };
            if !conn.recv_armed {
                let e = on_conn!(fixed, slot, fd, |t| opcode::RecvMulti::new(t, GROUP)
                    .build());
                push(&mut ring, e.user_data(ud(OP_RECV, slot)))?;
                conn.recv_armed = true;
            }
            if !conn.send_inflight {
                if conn.sent == conn.sending.len() {
                    conn.sending.clear();
                    conn.sent = 0;
                    std::mem::swap(&mut conn.sending, &mut conn.out);
                }
                if conn.sent < conn.sending.len() {
                    let rest = &conn.sending[conn.sent..];
                    let e = on_conn!(fixed, slot, fd, |t| {
                        opcode::Send::new(t, rest.as_ptr(), rest.len() as u32)
                            .flags(libc::MSG_NOSIGNAL)
                            .build()
                    });
                    push(&mut ring, e.user_data(ud(OP_SEND, slot)))?;
                    conn.send_inflight = true;
                    sends += 1;
                }
            }
        }
    }
}

/// `FLOOR_GATHER=MORE:USEC`: each wait asks for the turn's sends and MORE completions,
/// returning after USEC microseconds with whatever came (io_uring's minimum wait).
fn gather() -> Option<(u32, u32)> {
    let v = std::env::var("FLOOR_GATHER").ok()?;
    let (a, b) = v.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Answer every whole request in `conn.input`.
fn serve(conn: &mut Conn, value: &[u8]) {
    let mut pos = 0;
    while let Some(nl) = conn.input[pos..].windows(2).position(|w| w == b"\r\n") {
        let line = &conn.input[pos..pos + nl];
        let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
        match (words.next(), words.next()) {
            (Some(b"get"), Some(key)) => {
                reply(&mut conn.out, key, value);
                pos += nl + 2;
            }
            (Some(b"set"), Some(_)) => {
                let n: usize = words
                    .nth(2)
                    .and_then(|w| std::str::from_utf8(w).ok())
                    .and_then(|w| w.parse().ok())
                    .unwrap_or(0);
                let whole = nl + 2 + n + 2;
                if conn.input.len() - pos < whole {
                    break;
                }
                conn.out.extend_from_slice(b"STORED\r\n");
                pos += whole;
            }
            _ => {
                conn.fd = None;
                return;
            }
        }
    }
    conn.input.drain(..pos);
}
