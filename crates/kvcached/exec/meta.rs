//! Executing meta-protocol requests (`mg`, `ms`, `md`, `ma`, `mn`, `me`) against the engine,
//! with memcached's replies and counters. Parsing (and every protocol error) is `kvproto`'s
//! (`kvproto::meta`); the item semantics are the engine's meta methods (`Engine::meta_get`,
//! ...). This module turns flags into engine options and results into reply lines.
//!
//! Counters, as the newest memcached (`proto_parser.c`) bumps them (in `exec/ops.rs`, where
//! every protocol's counting is):
//! - `mg`: a hit (or an item created by `N`) counts `cmd_get`/`get_hits`, or with `T`
//!   `cmd_touch`/`touch_hits`; a miss counts `cmd_get`/`get_misses` (`T` or not).
//! - `ms`: `cmd_set` once the item could be built; in CAS mode (`C` with set/replace)
//!   `cas_hits` (a stale store included), `cas_badval` or `cas_misses`; a store the engine
//!   refuses as too large or for memory counts `store_too_large`/`store_no_memory` instead
//!   and removes the old item, in every mode.
//! - `md`: `delete_hits` when the item is removed or emptied (`x`) but not when invalidated
//!   (`I`); `delete_misses` on `NF` and on `EX`.
//! - `ma`: `incr_hits`/`decr_hits` when a number changed, `incr_misses`/`decr_misses` on `NF`;
//!   nothing when `N` created the item or on `EX`.
//! - `cmd_meta` counts `me` only: memcached bumps it nowhere else.
//!
//! `q` leaves out only the "as expected" reply (`mg` `EN`, `ms`/`md` `HD`, `ma` `HD`/`VA`);
//! errors never reach here (the parser reports them, unsilenced).
//!
//! Flag order (`mg`, `ma`): memcached applies `T`, and `N` on an item it created, while it
//! writes the return flags, in request order. So a `t` before `T` shows the TTL from before
//! it, `R` compares with the TTL set by a `T` before it (else the old one), and a created
//! item keeps the TTL of whichever of `T` and `N` came last. The same here
//! ([`MetaArgs::position`]). (An `ma` whose number grows longer is the exception memcached
//! makes: docs/COMPATIBILITY.md.)

use kvproto::meta::{
    write_debug, ArithMode, DebugInfo, KeyBuf, MetaArgs, MetaReply, MetaRequest, ReturnFlag,
    SetMode, MN, NON_NUMERIC,
};
use kvproto::text::{self as proto, ErrorReply};
use kvproto::MAX_KEY_LEN;
use kvstore::{
    Engine, MetaArith, MetaArithResult, MetaDelete, MetaDeleteResult, MetaGet, MetaItem, MetaRead,
    MetaStoreRequest, StoreMode, StoreResult, Time, Win,
};

use crate::exec::items::size_and_class;
use crate::exec::ops::{self, Proto};
use crate::exec::session::{Ctx, Session, Step};
use crate::exec::splice::{self, Splices};
use crate::state::replication::Access;

/// Execute one meta request, appending its reply to `s.out`.
pub fn execute(req: MetaRequest<'_>, ctx: &mut Ctx<'_>, s: &mut Session) -> Step {
    let access = match req {
        MetaRequest::Set { .. } | MetaRequest::Delete(_) | MetaRequest::Arith { .. } => {
            Access::Write
        }
        MetaRequest::Get(_) => Access::Read,
        _ => Access::Other,
    };
    if let Some(refusal) = ctx.shared.repl.refusal(access, &ctx.shared.config) {
        s.out.extend_from_slice(refusal);
        return Step::Next;
    }
    // A command that may write over an item on flash: read it first, off the worker
    // (`ops::flash_first`; a plain `mg` waits in `get`).
    let writes = match &req {
        MetaRequest::Set { args, .. }
        | MetaRequest::Delete(args)
        | MetaRequest::Arith { args, .. } => Some(args),
        MetaRequest::Get(args) if args.ttl().is_some() || args.vivify().is_some() => Some(args),
        _ => None,
    };
    if let Some(args) = writes {
        let mut buf: KeyBuf = [0; MAX_KEY_LEN];
        let key = args.key();
        let k = key.bytes(&mut buf);
        if let Some(step) = ops::flash_first(ctx, s, k) {
            return step;
        }
    }
    match req {
        MetaRequest::Get(args) => get(ctx, s, &args),
        MetaRequest::Set { args, mode, data } => set(ctx, s, &args, mode, data),
        MetaRequest::Delete(args) => delete(ctx, s, &args),
        MetaRequest::Arith { args, mode } => arith(ctx, s, &args, mode),
        MetaRequest::Noop => {
            s.out.extend_from_slice(MN);
            Step::Next
        }
        MetaRequest::Debug { key } => {
            let shared = ctx.shared;
            let mut buf: KeyBuf = [0; MAX_KEY_LEN];
            let k = key.bytes(&mut buf);
            let now = ctx.now;
            match ops::debug_item(ctx, k, now) {
                Some(d) => {
                    let (size, cls) = size_and_class(&shared.config, k.len(), d.value_len, d.flags);
                    let info = DebugInfo {
                        exp: ttl(d.exptime, now),
                        la: u64::from(now.wrapping_sub(d.last_access)),
                        cas: d.cas,
                        fetched: d.fetched,
                        cls,
                        size: size as u64,
                    };
                    write_debug(&mut s.out, k, d.binary_key, &info);
                }
                None => s.out.extend_from_slice(kvproto::meta::EN),
            }
            Step::Next
        }
    }
}

/// A reply status line's code.
#[derive(Clone, Copy)]
enum Code {
    Hd,
    Ns,
    Ex,
    Nf,
}

impl Code {
    fn start(self, out: &mut Vec<u8>) -> MetaReply<'_> {
        match self {
            Code::Hd => MetaReply::hd(out),
            Code::Ns => MetaReply::ns(out),
            Code::Ex => MetaReply::ex(out),
            Code::Nf => MetaReply::nf(out),
        }
    }
}

/// The decimal digits of `n`, in `buf` (no allocation).
pub(crate) fn digits(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut n = n;
    let mut i = buf.len();
    loop {
        i -= 1;
        if let Some(b) = buf.get_mut(i) {
            *b = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    buf.get(i..).unwrap_or_default()
}

/// Absolute expiry (from a protocol TTL) of a flag's argument.
fn expiry(ctx: &Ctx<'_>, ttl: Option<i64>) -> Option<Time> {
    ttl.map(|t| ctx.expiry(t))
}

/// TTL remaining for `me`: -1 for never, else seconds (negative if already past).
fn ttl(exptime: Time, now: Time) -> i64 {
    if exptime == 0 {
        -1
    } else {
        i64::from(exptime) - i64::from(now)
    }
}

/// ` t<seconds>` as memcached writes it: `-1` for no expiry, else the unsigned difference.
fn put_ttl(r: MetaReply<'_>, exptime: Time, now: Time) -> MetaReply<'_> {
    if exptime == 0 {
        r.int(b't', -1)
    } else {
        r.num(b't', u64::from(exptime.wrapping_sub(now)))
    }
}

/// The opaque and key flags, in request order (the replies that echo nothing else).
fn echo<'o>(mut r: MetaReply<'o>, args: &MetaArgs<'_>, key: &[u8]) -> MetaReply<'o> {
    let binary = args.key().is_base64();
    for flag in args.return_flags() {
        match flag {
            ReturnFlag::Opaque(o) => r = r.opaque(o),
            ReturnFlag::Key => r = r.key(key, binary),
            _ => {}
        }
    }
    r
}

fn get(ctx: &mut Ctx<'_>, s: &mut Session, args: &MetaArgs<'_>) -> Step {
    let now = ctx.now;
    let mut buf: KeyBuf = [0; MAX_KEY_LEN];
    let key = args.key();
    let k = key.bytes(&mut buf);
    let touch = expiry(ctx, args.ttl());
    let vivify = expiry(ctx, args.vivify());
    let opts = MetaRead {
        touch,
        no_bump: args.no_bump(),
        // A created item keeps the TTL of the later of `N` and `T` (see the module docs).
        vivify: vivify.map(|v| vivified_expiry(args, touch, v)),
        recache: expiry(ctx, args.recache()),
        recache_after_touch: args.before(b'T', b'R'),
        new_cas: args.new_cas(),
        binary_key: key.is_base64(),
    };
    let may_wait = s.may_wait_for_flash(ctx.shared.engine.has_flash());
    let out = &mut s.out;
    let mut spliced = s.splice_ok.then_some(&mut s.spliced);
    let mut hit = |mi: MetaItem<'_>| {
        let shown = ttl_shown(args, mi.exptime_before, mi.created, touch, vivify);
        write_hit(out, spliced.as_deref_mut(), args, &mi, shown, now);
    };
    let result = if may_wait {
        match ops::meta_read_or_wait(ctx, k, now, opts, &mut hit) {
            Ok(result) => result,
            // Run again once the item is read (the worker's ring or an I/O thread) (`state/flash.rs`).
            Err(reads) => return s.wait_for_flash(reads),
        }
    } else {
        ops::meta_read(ctx, k, now, opts, &mut hit)
    };
    s.flash_rounds = 0;
    if result == MetaGet::Miss && !args.quiet() {
        echo(MetaReply::en(&mut s.out), args, k).finish();
    }
    Step::Next
}

/// The expiry `mg`'s `t` shows: as memcached applies `T`, and `N` on a created item, while
/// it writes the return flags, the one set by the last of them before `t`, else the item's
/// expiry before the request (0 for a created item).
fn ttl_shown(
    args: &MetaArgs<'_>,
    exptime_before: Time,
    created: bool,
    touch: Option<Time>,
    vivify: Option<Time>,
) -> Time {
    let Some(t) = args.position(b't') else {
        return exptime_before;
    };
    let at = |flag: u8, value: Option<Time>| {
        value.and_then(|v| args.position(flag).filter(|&p| p < t).map(|p| (p, v)))
    };
    let by_t = at(b'T', touch);
    let by_n = at(b'N', vivify.filter(|_| created));
    by_t.max(by_n).map_or(exptime_before, |(_, v)| v)
}

/// The expiry of an item `N` creates when `T` is given too: the later of the two.
fn vivified_expiry(args: &MetaArgs<'_>, touch: Option<Time>, vivify: Time) -> Time {
    match touch {
        Some(t) if args.before(b'N', b'T') => t,
        _ => vivify,
    }
}

/// The `mg` reply for a found or created item, `t` showing `ttl` ([`ttl_shown`]); a large
/// value is spliced into the output when `spliced` is given.
fn write_hit(
    out: &mut Vec<u8>,
    spliced: Option<&mut Splices>,
    args: &MetaArgs<'_>,
    mi: &MetaItem<'_>,
    ttl: Time,
    now: Time,
) {
    let it = &mi.item;
    let value = args.value() && args.compare_cas() != Some(it.cas);
    let mut r = if value {
        MetaReply::va(out, it.value.len())
    } else {
        MetaReply::hd(out)
    };
    for flag in args.return_flags() {
        r = match flag {
            ReturnFlag::Size => r.num(b's', it.value.len() as u64),
            ReturnFlag::Ttl => put_ttl(r, ttl, now),
            ReturnFlag::Cas => r.num(b'c', it.cas),
            ReturnFlag::ClientFlags => r.num(b'f', u64::from(it.flags)),
            ReturnFlag::LastAccess => r.num(b'l', u64::from(now.wrapping_sub(mi.last_access))),
            ReturnFlag::Hit => r.num(b'h', u64::from(mi.fetched)),
            ReturnFlag::Opaque(o) => r.opaque(o),
            ReturnFlag::Key => r.key(it.key, mi.binary_key),
        };
    }
    if mi.win == Win::AlreadySent {
        r = r.flag(b'Z');
    }
    if mi.stale {
        r = r.flag(b'X');
    }
    if mi.win == Win::Won {
        r = r.flag(b'W');
    }
    if value {
        match splice::lease_into(spliced, it) {
            Some((q, lease)) => {
                let out = r.finish_before_value();
                q.push(out.len(), lease);
                out.extend_from_slice(b"\r\n");
            }
            None => r.finish_value(it.value),
        }
    } else {
        r.finish();
    }
}

fn set(
    ctx: &mut Ctx<'_>,
    s: &mut Session,
    args: &MetaArgs<'_>,
    mode: SetMode,
    data: &[u8],
) -> Step {
    let shared = ctx.shared;
    let now = ctx.now;
    let mut buf: KeyBuf = [0; MAX_KEY_LEN];
    let key = args.key();
    let k = key.bytes(&mut buf);
    let compare = args.compare_cas();
    let store_mode = match (mode, compare) {
        (SetMode::Set | SetMode::Replace, Some(c)) => StoreMode::Cas(c),
        (SetMode::Set, None) => StoreMode::Set,
        (SetMode::Replace, None) => StoreMode::Replace,
        (SetMode::Add, _) => StoreMode::Add,
        (SetMode::Append, _) => StoreMode::Append,
        (SetMode::Prepend, _) => StoreMode::Prepend,
    };
    let concat = matches!(mode, SetMode::Append | SetMode::Prepend);
    let vivify = concat && args.vivify().is_some();
    let exptime = if vivify {
        expiry(ctx, args.vivify())
    } else {
        expiry(ctx, args.ttl())
    };
    let req = MetaStoreRequest {
        mode: store_mode,
        key: k,
        value: data,
        flags: args.client_flags().unwrap_or(0),
        exptime: exptime.unwrap_or(0),
        compare_cas: compare,
        new_cas: args.new_cas(),
        invalidate: args.invalidate(),
        vivify,
        binary_key: key.is_base64(),
    };
    let stored = ops::store(ctx, req, now);
    let code = match stored.result {
        StoreResult::TooLarge | StoreResult::NoMemory => {
            // memcached could not build the item: it removes the old one in every mode.
            shared.engine.delete(k, now);
            let msg = if stored.result == StoreResult::TooLarge {
                "object too large for cache"
            } else {
                "out of memory storing object"
            };
            proto::write_error(&mut s.out, ErrorReply::Server(msg));
            return Step::Next;
        }
        StoreResult::Stored(_) => Code::Hd,
        StoreResult::NotStored => Code::Ns,
        StoreResult::Exists => Code::Ex,
        StoreResult::NotFound => Code::Nf,
    };
    let stored_ok = matches!(stored.result, StoreResult::Stored(_));
    if stored_ok && args.quiet() {
        return Step::Next;
    }
    let cas = match stored.result {
        StoreResult::Stored(c) => c,
        _ => 0,
    };
    let mut r = code.start(&mut s.out);
    for flag in args.return_flags() {
        r = match flag {
            ReturnFlag::Opaque(o) => r.opaque(o),
            ReturnFlag::Key => r.key(k, key.is_base64()),
            ReturnFlag::Cas => r.num(b'c', cas),
            ReturnFlag::Size => r.num(b's', stored.len as u64),
            _ => r,
        };
    }
    r.finish();
    Step::Next
}

fn delete(ctx: &mut Ctx<'_>, s: &mut Session, args: &MetaArgs<'_>) -> Step {
    let mut buf: KeyBuf = [0; MAX_KEY_LEN];
    let key = args.key();
    let k = key.bytes(&mut buf);
    let req = MetaDelete {
        compare_cas: args.compare_cas(),
        new_cas: args.new_cas(),
        invalidate: args.invalidate(),
        remove_value: args.remove_value(),
        ttl: expiry(ctx, args.ttl()),
        flags: args.client_flags().unwrap_or(0),
    };
    let code = match ops::delete(ctx, k, ctx.now, req, Proto::Meta) {
        MetaDeleteResult::Deleted => {
            if args.quiet() {
                return Step::Next;
            }
            Code::Hd
        }
        MetaDeleteResult::NotFound => Code::Nf,
        MetaDeleteResult::Exists => Code::Ex,
        MetaDeleteResult::NotStored => Code::Ns,
    };
    echo(code.start(&mut s.out), args, k).finish();
    Step::Next
}

fn arith(ctx: &mut Ctx<'_>, s: &mut Session, args: &MetaArgs<'_>, mode: ArithMode) -> Step {
    let now = ctx.now;
    let mut buf: KeyBuf = [0; MAX_KEY_LEN];
    let key = args.key();
    let k = key.bytes(&mut buf);
    let incr = mode == ArithMode::Incr;
    let touch = expiry(ctx, args.ttl());
    let vivify = expiry(ctx, args.vivify());
    let req = MetaArith {
        incr,
        delta: args.delta().unwrap_or(1),
        compare_cas: args.compare_cas(),
        new_cas: args.new_cas(),
        // A created item keeps the TTL of the later of `N` and `T` (see the module docs).
        vivify: vivify.map(|v| (vivified_expiry(args, touch, v), args.initial().unwrap_or(0))),
        touch,
        binary_key: key.is_base64(),
    };
    let code = match ops::arith(ctx, k, now, req, Proto::Meta) {
        MetaArithResult::Value {
            value,
            cas,
            exptime_before,
            created,
            ..
        } => {
            let exptime = ttl_shown(args, exptime_before, created, touch, vivify);
            if args.quiet() {
                return Step::Next;
            }
            let mut buf = [0u8; 20];
            let digits = digits(value, &mut buf);
            let mut r = if args.value() {
                MetaReply::va(&mut s.out, digits.len())
            } else {
                MetaReply::hd(&mut s.out)
            };
            for flag in args.return_flags() {
                r = match flag {
                    ReturnFlag::Cas => r.num(b'c', cas),
                    ReturnFlag::Ttl => put_ttl(r, exptime, now),
                    ReturnFlag::Opaque(o) => r.opaque(o),
                    ReturnFlag::Key => r.key(k, key.is_base64()),
                    _ => r,
                };
            }
            if args.value() {
                r.finish_value(digits);
            } else {
                r.finish();
            }
            return Step::Next;
        }
        MetaArithResult::NotFound => Code::Nf,
        MetaArithResult::Exists => Code::Ex,
        MetaArithResult::NonNumeric => {
            proto::write_error(&mut s.out, NON_NUMERIC);
            return Step::Next;
        }
        MetaArithResult::NoMemory => {
            proto::write_error(&mut s.out, ErrorReply::Server("out of memory"));
            return Step::Next;
        }
    };
    echo(code.start(&mut s.out), args, k).finish();
    Step::Next
}

#[cfg(test)]
mod tests {
    #[test]
    fn digits_match_to_string() {
        let mut buf = [0u8; 20];
        for n in [0u64, 7, 10, 12345, u64::MAX] {
            assert_eq!(super::digits(n, &mut buf), n.to_string().as_bytes());
        }
    }
}
