//! The one way a request is executed, whatever carries it: [`request`] takes the bytes at
//! the front of a connection's input or of a datagram, sends them through the
//! authentication gates (`-Y`, `-S`), parses them with the protocol's parser and gives what
//! the parser made of them (a request, or an error a client caused) to the protocol's
//! executor, which writes the reply into the session. [`stream`] runs a stream's batch of
//! pipelined requests through it (`runtime/conn.rs`); `runtime/udp.rs` runs a datagram's
//! requests through it with its own reply framing. Neither touches a socket here.

use kvproto::binary as bin;
use kvproto::meta::MetaRequest;
use kvproto::text::{self as proto, Parse, Request};

use crate::exec::auth::{self, Gate};
use crate::exec::binary;
use crate::exec::session::{
    Ctx, Protocol, Session, Step, OUTPUT_HIGH_WATER, RESPONSE_OBJECT_BYTES,
};
use crate::exec::text::{self, GetFraming};
use crate::setup::config::ProtocolChoice;

/// memcached's read buffer (`READ_BUFFER_SIZE`): what one of its reads takes at most, so
/// the most of an unfinished line it has read when it judges one (see `Session::more_input`).
const MEMCACHED_READ_BUFFER: usize = 16 * 1024;

/// What [`request`] did with the front of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// No whole request there yet: wait for more bytes. `line`: the text parser found a
    /// line without its end (not a data block still arriving).
    Incomplete { line: bool },
    /// Close the connection now, without a reply and without consuming anything.
    Close,
    /// One request was answered, by its executor or with an error: it took `used` bytes
    /// (to skip unless `step` is [`Step::Pause`]) and asks `step` of the connection.
    Done { used: usize, step: Step, kind: Kind },
}

/// What the request answered by [`Dispatch::Done`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A request its executor ran.
    Executed,
    /// The meta no-op `mn` (memcached flushes its UDP reply queue after it).
    MetaNoop,
    /// Refused with an error reply (a bad command line, a bad data chunk, a binary request
    /// memcached refuses) or answered by an authentication gate.
    Refused,
    /// A storage request whose value exceeds `-I`, answered with memcached's error.
    TooLarge,
}

/// The protocol a stream speaks, from `-B` and its first byte (memcached's `-B auto`: a
/// first byte of 0x80 is the binary magic).
pub fn stream_protocol(choice: ProtocolChoice, first: Option<u8>) -> Protocol {
    match (choice, first) {
        (ProtocolChoice::Binary, _) => Protocol::Binary,
        (ProtocolChoice::Ascii, _) => Protocol::Text,
        (ProtocolChoice::Auto, Some(bin::REQUEST_MAGIC)) => Protocol::Binary,
        (ProtocolChoice::Auto, _) => Protocol::Text,
    }
}

/// Parse and execute the request at the front of `data`, spoken in `protocol`, with a
/// get's replies framed by `framing`. Sets the session's `swallow` (the bytes of a refused
/// data block still to come) and `close_after_write` as the request asks.
pub fn request<F: GetFraming>(
    ctx: &mut Ctx<'_>,
    s: &mut Session,
    protocol: Protocol,
    data: &[u8],
    framing: &mut F,
) -> Dispatch {
    match protocol {
        Protocol::Binary => binary_request(ctx, s, data),
        Protocol::Text => text_request(ctx, s, data, framing),
    }
}

fn text_request<F: GetFraming>(
    ctx: &mut Ctx<'_>,
    s: &mut Session,
    data: &[u8],
    framing: &mut F,
) -> Dispatch {
    let shared = ctx.shared;
    // -Y: until authenticated, every line is an authentication attempt or refused.
    if shared.config.auth_file.is_some() && !s.auth.authenticated {
        return match auth::ascii_gate(ctx, s, data) {
            Gate::Incomplete => Dispatch::Incomplete { line: false },
            Gate::Close => Dispatch::Close,
            Gate::Done(used) => Dispatch::Done {
                used,
                step: Step::Next,
                kind: Kind::Refused,
            },
        };
    }
    let limits = shared.limits;
    match proto::parse(data, &limits) {
        Parse::Incomplete => Dispatch::Incomplete {
            line: !data.contains(&b'\n'),
        },
        Parse::Request(req, used) => {
            let kind = match req {
                Request::Meta(MetaRequest::Noop) => Kind::MetaNoop,
                _ => Kind::Executed,
            };
            let step = text::execute(req, ctx, s, framing);
            Dispatch::Done { used, step, kind }
        }
        Parse::Error {
            reply,
            noreply,
            consumed,
            swallow,
        } => {
            if !noreply {
                proto::write_error(&mut s.out, reply);
            }
            s.swallow = swallow;
            Dispatch::Done {
                used: consumed.max(1),
                step: Step::Next,
                kind: Kind::Refused,
            }
        }
        Parse::TooLarge {
            mode,
            key,
            noreply,
            consumed,
            swallow,
        } => {
            text::too_large(ctx, s, mode, key, noreply);
            s.swallow = swallow;
            Dispatch::Done {
                used: consumed,
                step: Step::Next,
                kind: Kind::TooLarge,
            }
        }
        // An unfinished line the parser refuses for its length: memcached refuses it only
        // once it has read what the client sent, up to its read buffer, so while more may be
        // in the socket it is not judged yet (and is parsed again after the next read).
        Parse::Close
            if s.more_input && data.len() <= MEMCACHED_READ_BUFFER && !data.contains(&b'\n') =>
        {
            Dispatch::Incomplete { line: false }
        }
        Parse::Close => Dispatch::Close,
    }
}

fn binary_request(ctx: &mut Ctx<'_>, s: &mut Session, data: &[u8]) -> Dispatch {
    let limits = ctx.shared.limits;
    // -S: SASL commands, and refusal of the rest until authenticated.
    if ctx.shared.config.sasl {
        if let Some(h) = auth::sasl_gate(ctx, s, data) {
            s.swallow = h.swallow;
            return match h.consumed {
                0 => Dispatch::Incomplete { line: false },
                used => Dispatch::Done {
                    used,
                    step: h.step,
                    kind: Kind::Refused,
                },
            };
        }
    }
    match bin::parse(data, &limits) {
        bin::Parse::Incomplete => Dispatch::Incomplete { line: false },
        bin::Parse::Request(req, used) => Dispatch::Done {
            used,
            step: binary::execute(req, ctx, s),
            kind: Kind::Executed,
        },
        bin::Parse::Error {
            opcode,
            opaque,
            status,
            close,
            consumed,
            swallow,
        } => {
            bin::write_error(&mut s.out, opcode, opaque, status);
            // memcached sends the error, then closes (or skips the bad request's bytes).
            s.close_after_write |= close;
            s.swallow = swallow;
            Dispatch::Done {
                used: consumed.max(1),
                step: Step::Next,
                kind: Kind::Refused,
            }
        }
        bin::Parse::TooLarge {
            opcode,
            opaque,
            status,
            key,
            consumed,
            swallow,
        } => {
            binary::too_large(ctx, s, opcode, opaque, status, key);
            s.swallow = swallow;
            Dispatch::Done {
                used: consumed.max(1),
                step: Step::Next,
                kind: Kind::TooLarge,
            }
        }
        bin::Parse::Close => Dispatch::Close,
    }
}

/// What [`stream`] did with a batch of a stream's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Bytes consumed from the front of the input.
    pub used: usize,
    /// How the last request ended.
    pub step: Step,
    /// The batch stopped at a text line without its end, this long: until more of it
    /// arrives with a line end, parsing it again would find it unfinished again.
    pub unfinished_line: Option<usize>,
}

/// Execute the requests at the front of a stream's `data` (a TCP or unix connection's
/// input), discarding a refused data block's bytes first (`Session::swallow`). Stops when
/// the data holds no whole request, the output is over [`OUTPUT_HIGH_WATER`], a request
/// asks to pause or to close, or `budget` requests (`-R`) have run.
pub fn stream(ctx: &mut Ctx<'_>, s: &mut Session, data: &[u8], budget: &mut usize) -> Batch {
    let shared = ctx.shared;
    let mut pos = 0;
    // Requests answered in this call, whose replies wait for the next write.
    let mut queued = 0;
    let done = |used, step| Batch {
        used,
        step,
        unfinished_line: None,
    };
    if s.watch.is_some() {
        // A watcher only listens (memcached stops reading it): input is dropped.
        return done(data.len(), Step::Next);
    }
    if s.swallow == 0 && s.protocol == Some(Protocol::Text) {
        // A batch of pipelined reads: start loading their index buckets and records
        // together, so their cache misses overlap (the engine skips a lone key).
        shared.engine.prefetch(proto::read_keys(data));
    }
    while pos < data.len() {
        if s.swallow > 0 {
            let n = s.swallow.min(data.len() - pos);
            s.swallow -= n;
            pos += n;
            continue;
        }
        if s.pending() >= OUTPUT_HIGH_WATER || *budget == 0 {
            return done(pos, Step::Next);
        }
        // memcached closes a connection it cannot give a response object (one per
        // request whose reply is queued).
        let held = s.out.capacity() + queued * RESPONSE_OBJECT_BYTES;
        queued += 1;
        if !ctx.buffers.allows(held) {
            ctx.stats.response_obj_oom.incr();
            return done(pos, Step::Close);
        }
        let rest = data.get(pos..).unwrap_or_default();
        let protocol = *s
            .protocol
            .get_or_insert_with(|| stream_protocol(shared.config.protocol, rest.first().copied()));
        match request(ctx, s, protocol, rest, &mut text::Stream) {
            Dispatch::Incomplete { line } => {
                return Batch {
                    used: pos,
                    step: Step::Next,
                    unfinished_line: line.then_some(rest.len()),
                }
            }
            Dispatch::Close => return done(pos, Step::Close),
            Dispatch::Done { used, step, .. } => {
                *budget -= 1;
                match step {
                    Step::Next => pos += used,
                    Step::Pause => return done(pos, Step::Pause),
                    Step::Wait => return done(pos, Step::Wait),
                    Step::Close => return done(pos + used, Step::Close),
                }
                if s.close_after_write {
                    return done(pos, Step::Next);
                }
            }
        }
    }
    done(pos, Step::Next)
}

#[cfg(test)]
pub(crate) mod tests;
