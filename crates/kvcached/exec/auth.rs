//! The authentication gates (`-Y`, `-S`): what a connection that has not authenticated may do.
//! The runtime calls them before executing a request; the credentials they check against and
//! each connection's progress are `state::credentials`.

use kvproto::auth::{self as proto, AuthData, AuthLine};
use kvproto::binary::{self as bin, opcode, Status};

use crate::exec::session::{Ctx, Session, Step};
use crate::state::credentials::SaslState;

/// The mechanisms `sasl list mechs` answers.
const MECHANISMS: &[u8] = b"PLAIN";

/// What the `-Y` gate did with the front of the input.
pub enum Gate {
    /// Nothing yet: wait for more bytes.
    Incomplete,
    /// Consumed this many bytes (a reply may have been written).
    Done(usize),
    /// Close the connection without a reply.
    Close,
}

/// `-Y`: handle the front of an unauthenticated connection's input: the authentication
/// request, or the refusal of anything else.
pub fn ascii_gate(ctx: &Ctx<'_>, s: &mut Session, data: &[u8]) -> Gate {
    let len = match s.auth.pending_data {
        Some(len) => len,
        None => match proto::parse_auth_line(data) {
            AuthLine::Incomplete => return Gate::Incomplete,
            AuthLine::Close => return Gate::Close,
            AuthLine::Unauthenticated { consumed } => {
                s.out.extend_from_slice(proto::REPLY_UNAUTHENTICATED);
                return Gate::Done(consumed);
            }
            AuthLine::TooLong { consumed } => {
                s.out.extend_from_slice(proto::REPLY_TOKEN_TOO_LONG);
                return Gate::Done(consumed);
            }
            AuthLine::Data { consumed, len } => {
                // Like memcached, the line is consumed now and the data block awaited.
                s.auth.pending_data = Some(len as usize + 2);
                return Gate::Done(consumed);
            }
        },
    };
    let Some(block) = data.get(..len) else {
        return Gate::Incomplete;
    };
    s.auth.pending_data = None;
    let reply = match proto::parse_auth_data(block) {
        AuthData::BadTermination => proto::REPLY_BAD_TERMINATION,
        AuthData::BadFormat => proto::REPLY_BAD_FORMAT,
        AuthData::Credentials { user, password } => {
            ctx.stats.auth_cmds.incr();
            if ctx.shared.auth.check_ascii(user, password) {
                s.auth.authenticated = true;
                tracing::debug!("ASCII authentication succeeded");
                proto::REPLY_STORED
            } else {
                ctx.stats.auth_errors.incr();
                tracing::info!(
                    "ASCII authentication failed for user <{}>",
                    user.escape_ascii()
                );
                proto::REPLY_FAILURE
            }
        }
    };
    s.out.extend_from_slice(reply);
    Gate::Done(len)
}

/// What the `-S` gate did with a binary request.
pub struct Handled {
    /// Bytes consumed (0: wait for more).
    pub consumed: usize,
    /// Bytes to discard after them as they arrive.
    pub swallow: usize,
    pub step: Step,
}

/// `-S`: look at the binary request at the front of `data` before it is parsed. Answers the
/// SASL commands, and refuses anything but them and `version` until the connection has
/// authenticated (`0x20` Auth failure, then close), as memcached does. `None`: parse and
/// execute the request as usual.
pub fn sasl_gate(ctx: &Ctx<'_>, s: &mut Session, data: &[u8]) -> Option<Handled> {
    let h = proto::binary_head(data)?;
    let done = |consumed| Handled {
        consumed,
        swallow: 0,
        step: Step::Next,
    };
    match h.opcode {
        opcode::SASL_LIST_MECHS => {
            if h.extlen != 0 || h.keylen != 0 || h.bodylen != 0 {
                return None;
            }
            // memcached starts a new SASL session here, which forgets any authentication.
            s.auth.authenticated = false;
            bin::write_response(
                &mut s.out,
                h.opcode,
                Status::Success,
                h.opaque,
                0,
                &[],
                &[],
                MECHANISMS,
            );
            Some(done(h.head_len()))
        }
        opcode::SASL_AUTH | opcode::SASL_STEP => {
            if h.extlen != 0 || h.keylen == 0 || h.keylen > kvproto::MAX_KEY_LEN {
                return None;
            }
            Some(sasl_auth(ctx, s, data, &h))
        }
        opcode::VERSION => None,
        _ if s.auth.authenticated => None,
        _ => {
            bin::write_error(&mut s.out, h.opcode, h.opaque, Status::AuthError);
            s.close_after_write = true;
            Some(done(h.head_len()))
        }
    }
}

/// `sasl auth` / `sasl step`.
fn sasl_auth(ctx: &Ctx<'_>, s: &mut Session, data: &[u8], h: &proto::BinaryHead) -> Handled {
    let vlen = h.value_len();
    let fail = |s: &mut Session, status| {
        bin::write_error(&mut s.out, h.opcode, h.opaque, status);
        Handled {
            consumed: h.head_len(),
            swallow: vlen,
            step: Step::Next,
        }
    };
    if h.keylen > proto::MAX_SASL_MECH_LEN {
        return fail(s, Status::InvalidArguments);
    }
    // memcached reads the data into an item, which cannot be chunked: about half of -I.
    if vlen > ctx.shared.limits.max_value / 2 {
        return fail(s, Status::OutOfMemory);
    }
    let Some(value) = data.get(h.head_len()..h.head_len() + vlen) else {
        return Handled {
            consumed: 0,
            swallow: 0,
            step: Step::Next,
        };
    };
    let key = data
        .get(bin::HEADER_LEN + h.extlen..h.head_len())
        .unwrap_or(&[]);
    // A new SASL exchange forgets any earlier authentication.
    s.auth.authenticated = false;
    #[derive(PartialEq)]
    enum Outcome {
        Ok,
        Continue,
        Fail,
    }
    let outcome = if h.opcode == opcode::SASL_AUTH {
        // The mechanism name ends at a NUL, as a C string would.
        let mech = key.split(|&b| b == 0).next().unwrap_or(&[]);
        let done = s.auth.sasl == SaslState::Done;
        let outcome = if !mech.eq_ignore_ascii_case(b"PLAIN") {
            Outcome::Fail
        } else if value.is_empty() {
            Outcome::Continue
        } else if !done && ctx.shared.auth.check_plain(value) {
            Outcome::Ok
        } else {
            Outcome::Fail
        };
        // Cyrus SASL keeps one exchange per connection: once one completed, nothing more can
        // (memcached answers a new `PLAIN` without data "continue", and fails the rest).
        if !done {
            s.auth.sasl = match outcome {
                Outcome::Ok => SaslState::Done,
                Outcome::Continue => SaslState::AwaitingPlain,
                Outcome::Fail => SaslState::Idle,
            };
        }
        outcome
    } else if s.auth.sasl == SaslState::AwaitingPlain {
        // A failed step leaves the exchange open for another.
        if ctx.shared.auth.check_plain(value) {
            s.auth.sasl = SaslState::Done;
            Outcome::Ok
        } else {
            Outcome::Fail
        }
    } else {
        Outcome::Fail
    };
    match outcome {
        Outcome::Ok => {
            s.auth.authenticated = true;
            ctx.stats.auth_cmds.incr();
            tracing::debug!("SASL authentication succeeded");
            bin::write_response(
                &mut s.out,
                h.opcode,
                Status::Success,
                h.opaque,
                0,
                &[],
                &[],
                b"Authenticated",
            );
        }
        Outcome::Continue => {
            bin::write_header(
                &mut s.out,
                h.opcode,
                Status::AuthContinue,
                h.opaque,
                0,
                0,
                0,
                0,
            );
        }
        Outcome::Fail => {
            ctx.stats.auth_cmds.incr();
            ctx.stats.auth_errors.incr();
            tracing::info!("SASL authentication failed");
            bin::write_error(&mut s.out, h.opcode, h.opaque, Status::AuthError);
        }
    }
    Handled {
        consumed: h.head_len() + vlen,
        swallow: 0,
        step: Step::Next,
    }
}
