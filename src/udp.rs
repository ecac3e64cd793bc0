//! The UDP path (`-U`): memcached's framed datagrams.
//!
//! Every worker binds its own socket to the UDP port with SO_REUSEPORT, so the kernel spreads
//! datagrams over the workers and no socket is shared. A request is one datagram (memcached
//! drops requests that span datagrams); its reply is one message, split into datagrams of at
//! most 1400 bytes with the request's id, sequence numbers and count. Requests run through
//! the same text and binary executors as TCP, on a session that lives for one datagram.
//!
//! Difference from memcached: a multiget's reply is one message here, where memcached sends
//! one message per key; single-key replies are the same bytes.

use std::io;
use std::net::SocketAddr;

use kvproto::binary as bin;
use kvproto::text::{self as proto, Parse};
use kvproto::udp::{self as frame, Datagrams};
use socket2::{Domain, Socket, Type};

use crate::binary;
use crate::config::Config;
use crate::conn::{Ctx, Session, Step};
use crate::text;

/// Datagrams handled per readiness event before the worker turns to other sockets.
const BATCH: usize = 64;

/// The largest reply sent for one datagram; a request whose reply would exceed it gets
/// memcached's error for a get response it cannot build.
const MAX_REPLY: usize = 8 << 20;

/// The addresses to bind UDP sockets on (empty when UDP is off).
pub fn addresses(config: &Config) -> Result<Vec<SocketAddr>, String> {
    if config.udp_port == 0 || config.unix_socket.is_some() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in &config.listeners {
        let port = entry.port_or(config.udp_port);
        if port == 0 {
            continue;
        }
        let addrs = entry
            .socket_addrs(config.udp_port)
            .map_err(|e| format!("failed to resolve {:?}: {e}", entry.host))?;
        out.extend(addrs);
    }
    Ok(out)
}

/// A non-blocking UDP socket on `addr` that other workers' sockets share (SO_REUSEPORT).
pub fn bind(addr: SocketAddr) -> io::Result<mio::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, None)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(mio::net::UdpSocket::from_std(socket.into()))
}

/// Answer the datagrams waiting on `sock`, up to a batch.
pub fn serve(
    sock: &mio::net::UdpSocket,
    ctx: &mut Ctx<'_>,
    datagram: &mut [u8],
    out: &mut Vec<u8>,
) {
    for _ in 0..BATCH {
        let (n, peer) = match sock.recv_from(datagram) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        ctx.stats.bytes_read.add(n as u64);
        let Some((header, payload)) = datagram.get(..n).and_then(frame::parse_frame) else {
            continue; // malformed or multi-datagram request: memcached drops it silently
        };
        let reply = execute(ctx, payload);
        if reply.is_empty() {
            continue;
        }
        for d in Datagrams::new(header.request_id, &reply) {
            out.clear();
            d.write_to(out);
            match sock.send_to(out, peer) {
                Ok(sent) => ctx.stats.bytes_written.add(sent as u64),
                // UDP is lossy: a full socket buffer drops the rest of this reply.
                Err(_) => break,
            }
        }
    }
}

/// Execute every request in one datagram; returns the reply message.
fn execute(ctx: &mut Ctx<'_>, payload: &[u8]) -> Vec<u8> {
    let mut s = Session::new();
    let limits = ctx.shared.limits;
    let binary = payload.first() == Some(&bin::REQUEST_MAGIC);
    let mut pos = 0;
    while pos < payload.len() && s.out.len() <= MAX_REPLY {
        let rest = &payload[pos..];
        if binary {
            match bin::parse(rest, &limits) {
                bin::Parse::Request(req, used) => {
                    if binary::execute(req, ctx, &mut s) == Step::Close {
                        break;
                    }
                    pos += used;
                }
                bin::Parse::Error {
                    opcode,
                    opaque,
                    status,
                    ..
                } => {
                    bin::write_error(&mut s.out, opcode, opaque, status);
                    break;
                }
                bin::Parse::TooLarge {
                    opcode,
                    opaque,
                    status,
                    key,
                    ..
                } => {
                    binary::too_large(ctx, &mut s, opcode, opaque, status, key);
                    break;
                }
                bin::Parse::Incomplete | bin::Parse::Close => break,
            }
        } else {
            match proto::parse(rest, &limits) {
                Parse::Request(req, used) => match text::execute(req, ctx, &mut s) {
                    // A multiget paused for output: continue it (the session remembers
                    // which keys are done); MAX_REPLY bounds the message.
                    Step::Pause => continue,
                    Step::Close => break,
                    Step::Next => pos += used,
                },
                Parse::Error {
                    reply,
                    noreply,
                    consumed,
                    ..
                } => {
                    if !noreply {
                        proto::write_error(&mut s.out, reply);
                    }
                    pos += consumed.max(1);
                }
                Parse::TooLarge {
                    mode, key, noreply, ..
                } => {
                    text::too_large(ctx, &mut s, mode, key, noreply);
                    break;
                }
                Parse::Incomplete | Parse::Close => break,
            }
        }
        if s.close_after_write {
            break;
        }
    }
    if s.out.len() > MAX_REPLY {
        s.out.clear();
        s.out
            .extend_from_slice(b"SERVER_ERROR out of memory writing get response\r\n");
    }
    s.out
}
