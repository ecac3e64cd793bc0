//! Executing binary-protocol requests against the engine, with memcached's statuses and
//! counters. Parsing is `kvproto::binary`'s; this module maps requests onto the engine.
//!
//! Quiet opcodes suppress the reply to a success (for the `get` family: to a miss); errors
//! are always answered. memcached holds quiet replies until the next non-quiet one; here every
//! reply is queued at once, which gives the client the same bytes in the same order.

use kvproto::binary::{self as bin, opcode, Command, Request, Status};
use kvproto::text::StoreMode;
use kvstore::{
    MetaArith, MetaArithResult, MetaDelete, MetaDeleteResult, MetaStoreRequest, StoreResult,
};

use crate::exec::ops::{self, Proto};
use crate::exec::session::{Ctx, Session, Step};
use crate::exec::splice::{self, Splices};
use crate::exec::stats_report;
use crate::state::replication::Access;

/// Execute one binary request, appending its reply (if any) to `s.out`.
pub fn execute(req: Request<'_>, ctx: &mut Ctx<'_>, s: &mut Session) -> Step {
    let shared = ctx.shared;
    // A get on a stream may wait for flash reads (`state/flash.rs`).
    let may_wait = s.may_wait_for_flash(shared.engine.has_flash());
    let (op, opaque) = (req.opcode, req.opaque);
    let access = match req.command {
        Command::GetAndTouch { .. }
        | Command::Touch { .. }
        | Command::Store { .. }
        | Command::Delete
        | Command::Arith { .. }
        | Command::Flush { .. } => Access::Write,
        Command::Get { .. } => Access::Read,
        _ => Access::Other,
    };
    if let Some(refusal) = shared.repl.refusal(access, &shared.config) {
        // A replica refuses writes, a master short of --min-replicas too, and a replica out
        // of sync with --replica-serve-stale no refuses reads: "Not stored." with the text
        // protocol's message, without its SERVER_ERROR prefix.
        let msg = std::str::from_utf8(refusal).unwrap_or_default();
        let msg = msg.trim_start_matches("SERVER_ERROR ").trim_end();
        bin::write_error_message(&mut s.out, op, opaque, Status::NotStored, msg);
        return Step::Next;
    }
    // A write over an item on flash: read it first, off the worker (`ops::flash_first`).
    if matches!(access, Access::Write) && !matches!(req.command, Command::Flush { .. }) {
        if let Some(step) = ops::flash_first(ctx, s, req.key) {
            return step;
        }
    }
    let out = &mut s.out;
    let spliced = s.splice_ok.then_some(&mut s.spliced);
    match req.command {
        Command::Get { with_key } => {
            if let Some(reads) = get(ctx, out, spliced, &req, with_key, None, may_wait) {
                // Run again once the item is read (the worker's ring or an I/O thread).
                return s.wait_for_flash(reads);
            }
            s.flash_rounds = 0;
        }
        Command::GetAndTouch { with_key, exptime } => {
            let at = Some(ctx.expiry(exptime));
            get(ctx, out, spliced, &req, with_key, at, false);
        }
        Command::Touch { exptime } => {
            let at = Some(ctx.expiry(exptime));
            let mut found = None;
            let hit = ops::read(ctx, req.key, ctx.now, at, &mut |item| {
                found = Some((item.flags, item.cas))
            });
            shared.detail.record_get(req.key, hit);
            match found {
                Some((flags, cas)) => {
                    if !req.quiet {
                        bin::write_response(
                            out,
                            op,
                            Status::Success,
                            opaque,
                            cas,
                            &flags.to_be_bytes(),
                            &[],
                            &[],
                        );
                    }
                }
                None => {
                    bin::write_error(out, op, opaque, Status::KeyNotFound);
                }
            }
        }
        Command::Store {
            mode,
            flags,
            exptime,
        } => store(ctx, out, &req, mode, flags, exptime),
        Command::Delete => {
            // A non-zero CAS must match; the engine checks it under the item's lock.
            let req_del = MetaDelete {
                compare_cas: (req.cas != 0).then_some(req.cas),
                ..MetaDelete::default()
            };
            shared.detail.record_delete(req.key);
            match ops::delete(ctx, req.key, ctx.now, req_del, Proto::Binary) {
                MetaDeleteResult::Deleted => {
                    if !req.quiet {
                        bin::write_ok(out, op, opaque, 0);
                    }
                }
                MetaDeleteResult::Exists => bin::write_error(out, op, opaque, Status::KeyExists),
                MetaDeleteResult::NotFound | MetaDeleteResult::NotStored => {
                    bin::write_error(out, op, opaque, Status::KeyNotFound);
                }
            }
        }
        Command::Arith {
            incr,
            delta,
            initial,
            exptime,
            create,
        } => arith(ctx, out, &req, incr, delta, initial, exptime, create),
        Command::Quit => {
            if req.quiet {
                return Step::Close;
            }
            bin::write_ok(out, op, opaque, 0);
            s.close_after_write = true;
        }
        Command::Flush { exptime } => {
            if !shared.config.flush_enabled {
                ops::flush_refused(ctx);
                bin::write_error(out, op, opaque, Status::AuthError);
                return Step::Next;
            }
            let at = if exptime > 0 {
                ctx.expiry(exptime)
            } else {
                ctx.now
            };
            ops::flush_all(ctx, at);
            if !req.quiet {
                bin::write_ok(out, op, opaque, 0);
            }
        }
        Command::Noop => bin::write_ok(out, op, opaque, 0),
        Command::Version => bin::write_version(out, opaque, crate::setup::VERSION),
        Command::Stat => {
            let group = stats_report::classify_binary(req.key);
            match group {
                stats_report::Group::Reset => {
                    stats_report::reset(shared);
                    bin::write_stat_end(out, opaque);
                }
                stats_report::Group::Detail => {
                    match stats_report::detail_binary(
                        ctx,
                        req.key.get(b"detail".len()..).unwrap_or_default(),
                    ) {
                        Some(dump) => {
                            if let Some(text) = dump {
                                bin::write_stat(out, opaque, b"detailed", &text);
                            }
                            bin::write_stat_end(out, opaque);
                        }
                        None => bin::write_error(out, op, opaque, Status::KeyNotFound),
                    }
                }
                _ => {
                    let emitted = stats_report::emit_group(ctx, group, &mut |name, value| {
                        bin::write_stat_fmt(out, opaque, name.as_bytes(), value)
                    });
                    if emitted {
                        bin::write_stat_end(out, opaque);
                    } else {
                        bin::write_error(out, op, opaque, Status::KeyNotFound);
                    }
                }
            }
        }
        Command::ReplPull => crate::exec::replication::serve_binary(ctx, out, &req),
        // Without -S, memcached answers the SASL opcodes as unknown commands.
        Command::SaslListMechs | Command::SaslAuth | Command::SaslStep => {
            bin::write_error(out, op, opaque, Status::UnknownCommand);
        }
    }
    Step::Next
}

/// A get-family command; a large value is spliced into the output when `spliced` is given.
/// A get (or gat, with `touch`); with `may_wait`, a get that meets an item on flash not
/// read yet answers nothing and returns the reads it needs (`ops::read_or_wait`).
fn get(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    mut spliced: Option<&mut Splices>,
    req: &Request<'_>,
    with_key: bool,
    touch: Option<u32>,
    may_wait: bool,
) -> Option<Vec<kvstore::FlashRead>> {
    let key = if with_key { Some(req.key) } else { None };
    let now = ctx.now;
    let mut found = |item: kvstore::ItemView<'_>| {
        let (op, opaque) = (req.opcode, req.opaque);
        match splice::lease_into(spliced.as_deref_mut(), &item) {
            Some((q, value)) => {
                bin::write_get_hit_header(out, op, opaque, item.cas, item.flags, key, value.len());
                q.push(out.len(), value);
            }
            None => bin::write_get_hit(out, op, opaque, item.cas, item.flags, key, item.value),
        }
    };
    let hit = if may_wait && touch.is_none() {
        match ops::read_or_wait(ctx, req.key, now, &mut found) {
            Ok(hit) => hit,
            Err(reads) => return Some(reads),
        }
    } else {
        ops::read(ctx, req.key, now, touch, &mut found)
    };
    ctx.shared.detail.record_get(req.key, hit);
    if !hit && !req.quiet {
        bin::write_get_miss(out, req.opcode, req.opaque, key);
    }
    None
}

fn store(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    req: &Request<'_>,
    mode: StoreMode,
    flags: u32,
    exptime: i64,
) {
    let shared = ctx.shared;
    let (op, opaque) = (req.opcode, req.opaque);
    shared.detail.record_set(req.key);
    let engine_mode = match mode {
        StoreMode::Set => kvstore::StoreMode::Set,
        StoreMode::Add => kvstore::StoreMode::Add,
        StoreMode::Replace => kvstore::StoreMode::Replace,
        StoreMode::Append => kvstore::StoreMode::Append,
        StoreMode::Prepend => kvstore::StoreMode::Prepend,
        StoreMode::Cas => kvstore::StoreMode::Cas(req.cas),
    };
    // append/prepend with a non-zero CAS must match it; the engine checks it atomically.
    let result = ops::store(
        ctx,
        MetaStoreRequest {
            mode: engine_mode,
            key: req.key,
            value: req.value,
            flags,
            exptime: ctx.expiry(exptime),
            compare_cas: (req.cas != 0).then_some(req.cas),
            new_cas: None,
            invalidate: false,
            vivify: false,
            binary_key: false,
        },
        ctx.now,
    )
    .result;
    let status = match result {
        StoreResult::Stored(cas) => {
            if !req.quiet {
                bin::write_ok(out, op, opaque, cas);
            }
            return;
        }
        // memcached answers a failed add "exists" and a failed replace "not found".
        StoreResult::NotStored => match mode {
            StoreMode::Add => Status::KeyExists,
            StoreMode::Replace => Status::KeyNotFound,
            _ => Status::NotStored,
        },
        StoreResult::Exists => Status::KeyExists,
        StoreResult::NotFound => Status::KeyNotFound,
        StoreResult::TooLarge => Status::TooLarge,
        StoreResult::NoMemory => Status::OutOfMemory,
    };
    bin::write_error(out, op, opaque, status);
}

#[allow(clippy::too_many_arguments)]
fn arith(
    ctx: &Ctx<'_>,
    out: &mut Vec<u8>,
    req: &Request<'_>,
    incr: bool,
    delta: u64,
    initial: u64,
    exptime: i64,
    create: bool,
) {
    let (op, opaque) = (req.opcode, req.opaque);
    // A miss creates the item with `initial` (no delta applied) unless `create` is off; the
    // engine does it atomically and returns the new CAS.
    let arith = MetaArith {
        incr,
        delta,
        vivify: create.then(|| (ctx.expiry(exptime), initial)),
        ..MetaArith::default()
    };
    match ops::arith(ctx, req.key, ctx.now, arith, Proto::Binary) {
        MetaArithResult::Value { value, cas, .. } => {
            if !req.quiet {
                bin::write_arith(out, op, opaque, cas, value);
            }
        }
        MetaArithResult::NotFound => bin::write_error(out, op, opaque, Status::KeyNotFound),
        MetaArithResult::Exists => bin::write_error(out, op, opaque, Status::KeyExists),
        MetaArithResult::NonNumeric => bin::write_error(out, op, opaque, Status::DeltaBadValue),
        MetaArithResult::NoMemory => bin::write_error(out, op, opaque, Status::OutOfMemory),
    }
}

/// A request whose value is larger than `-I`: memcached answers it (quiet or not) and, for
/// `set`, removes the old item so that readers cannot see stale data.
pub fn too_large(ctx: &Ctx<'_>, s: &mut Session, op: u8, opaque: u32, status: Status, key: &[u8]) {
    if matches!(op, opcode::SET | opcode::SETQ) {
        ops::store_too_large(ctx, key, true);
    }
    bin::write_error(&mut s.out, op, opaque, status);
}
