//! What each command does to the engine and to memcached's counters, whatever protocol
//! asked: the text, meta, binary and UDP executors call these and only turn the outcome into
//! their protocol's reply. Every one of memcached's command counters (`cmd_get`, `cmd_set`,
//! `get_hits`, `delete_misses`, `cas_badval`, ...) is bumped here and nowhere else.
//!
//! memcached counts a few outcomes differently per protocol; those differences are spelled
//! out here, next to each other, as [`Proto`] cases.
//!
//! Callers pass the server time (`now`), read once per request (once per multiget), so a
//! command costs no more clock reads here than it did in its executor.

use kvstore::{
    DebugItem, Engine, ItemView, MetaArith, MetaArithResult, MetaDelete, MetaDeleteResult, MetaGet,
    MetaItem, MetaRead, MetaStoreRequest, MetaStored, ReadOptions, StoreMode, StoreResult, Time,
};

use std::io::Write as _;

use crate::exec::items::size_and_class;
use crate::exec::session::{Ctx, Session, Step};
use crate::state::watch;

/// The protocol a command came in, where memcached's counting depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Text,
    Meta,
    Binary,
}

/// A get (`touch: None`) or a get-and-touch / touch of one key: `found` sees a hit.
/// Counts `cmd_get` and `get_hits`/`get_misses`, or for a touch `cmd_touch` and
/// `touch_hits`/`touch_misses`.
#[inline]
pub fn read(
    ctx: &Ctx<'_>,
    key: &[u8],
    now: Time,
    touch: Option<Time>,
    found: &mut dyn FnMut(ItemView<'_>),
) -> bool {
    if ctx.shared.watchers.wants(watch::FETCHERS) {
        return read_watched(ctx, key, now, touch, found);
    }
    let hit = ctx
        .shared
        .engine
        .get(key, now, ReadOptions { touch }, found);
    ctx.stats.count_read(touch.is_some(), hit);
    hit
}

/// [`read`] for a request that can wait (a get on a TCP or unix connection): with a flash
/// tier, a key whose item is on flash and not read yet is not answered here. Its reads
/// are returned (nothing counted, `found` not called), for the request to run again from
/// this key once they are done (the worker's ring or an I/O thread) (`state/flash.rs`).
pub fn read_or_wait(
    ctx: &Ctx<'_>,
    key: &[u8],
    now: Time,
    found: &mut dyn FnMut(ItemView<'_>),
) -> Result<bool, Vec<kvstore::FlashRead>> {
    let engine = &ctx.shared.engine;
    if !engine.has_flash() {
        return Ok(read(ctx, key, now, None, found));
    }
    if ctx.shared.watchers.wants(watch::FETCHERS) {
        watched_flash_reads(ctx, key)?;
        return Ok(read_watched(ctx, key, now, None, found));
    }
    let (hit, reads) =
        engine.defer_flash(|| engine.get(key, now, ReadOptions { touch: None }, found));
    // Reads a hit needed are another key's (a tag that matched): only a miss waits.
    if !hit && !reads.is_empty() {
        return Err(reads);
    }
    ctx.stats.count_read(false, hit);
    Ok(hit)
}

/// With a watcher attached, whether `key`'s item must be read from flash first (its
/// reads), found out before the lookup that answers, so that the watcher's line is written
/// once, for that lookup.
#[cold]
fn watched_flash_reads(ctx: &Ctx<'_>, key: &[u8]) -> Result<(), Vec<kvstore::FlashRead>> {
    let reads = ctx.shared.engine.flash_reads_for(key);
    if reads.is_empty() {
        Ok(())
    } else {
        Err(reads)
    }
}

/// [`flash_first`] for the keys of a multi-key command that writes (`gat`): the reads of
/// all of them, waited for together.
pub fn flash_first_all<'k>(
    ctx: &Ctx<'_>,
    s: &mut Session,
    keys: impl Iterator<Item = &'k [u8]>,
) -> Option<Step> {
    if !s.may_wait_for_flash(ctx.shared.engine.has_flash()) {
        return None;
    }
    let mut reads = Vec::new();
    for key in keys {
        reads.extend(ctx.shared.engine.flash_reads_for(key));
    }
    if reads.is_empty() {
        s.flash_rounds = 0;
        return None;
    }
    Some(s.wait_for_flash(reads))
}

/// Before a command that may write `key` (a store, delete, incr/decr, touch, a meta
/// command that writes): with a flash tier, the reads its item needs first, if any, so
/// that the command waits for them instead of reading flash on the worker; it
/// then runs again and finds the item read. None: run it now.
pub fn flash_first(ctx: &Ctx<'_>, s: &mut Session, key: &[u8]) -> Option<Step> {
    flash_first_all(ctx, s, std::iter::once(key))
}

/// [`read`] while a `watch fetchers` watcher is attached: the same, and an `item_get` line.
#[cold]
#[inline(never)]
fn read_watched(
    ctx: &Ctx<'_>,
    key: &[u8],
    now: Time,
    touch: Option<Time>,
    found: &mut dyn FnMut(ItemView<'_>),
) -> bool {
    let mut seen = None;
    let hit = ctx
        .shared
        .engine
        .get(key, now, ReadOptions { touch }, &mut |item| {
            seen = Some((item.value.len(), item.flags));
            found(item);
        });
    ctx.stats.count_read(touch.is_some(), hit);
    watch_get(ctx, key, seen);
    hit
}

/// The `item_get` line memcached logs for the lookup a store or delete makes first (its
/// `do_item_get`), before the command's own line: found or not, without counting a read.
#[cold]
#[inline(never)]
fn watch_lookup(ctx: &Ctx<'_>, key: &[u8], now: Time) {
    let seen = ctx
        .shared
        .engine
        .debug_item(key, now)
        .map(|d| (d.value_len, d.flags));
    watch_get(ctx, key, seen);
}

/// An `item_get` line: `status=found` with the item's class and value size, or
/// `status=not_found clsid=0 size=0`.
fn watch_get(ctx: &Ctx<'_>, key: &[u8], found: Option<(usize, u32)>) {
    ctx.shared.watchers.emit(watch::FETCHERS, |line| {
        line.extend_from_slice(b"type=item_get key=");
        kvproto::admin::uri_encode(line, key);
        let (status, class, size) = match found {
            Some((len, flags)) => {
                let (_, class) = size_and_class(&ctx.shared.config, key.len(), len, flags);
                ("found", class, len)
            }
            None => ("not_found", 0, 0),
        };
        let _ = write!(
            line,
            " status={status} clsid={class} cfd={} size={size}",
            ctx.cfd
        );
    });
}

/// `mg`: a hit (or an item `N` created) counts as a touch when `T` was given, else as a get;
/// a miss counts as a get miss either way (as memcached does).
pub fn meta_read(
    ctx: &Ctx<'_>,
    key: &[u8],
    now: Time,
    opts: MetaRead,
    found: &mut dyn FnMut(MetaItem<'_>),
) -> MetaGet {
    let st = ctx.stats;
    let result = if ctx.shared.watchers.wants(watch::FETCHERS) {
        let mut seen = None;
        let result = ctx.shared.engine.meta_get(key, now, opts, &mut |m| {
            seen = Some((m.item.value.len(), m.item.flags));
            found(m);
        });
        watch_get(ctx, key, seen);
        result
    } else {
        ctx.shared.engine.meta_get(key, now, opts, found)
    };
    count_meta_read(st, &opts, result);
    result
}

fn count_meta_read(st: &crate::state::stats::WorkerStats, opts: &MetaRead, result: MetaGet) {
    match result {
        MetaGet::Hit | MetaGet::Vivified if opts.touch.is_some() => {
            st.cmd_touch.incr();
            st.touch_hits.incr();
        }
        MetaGet::Hit | MetaGet::Vivified => {
            st.cmd_get.incr();
            st.get_hits.incr();
        }
        MetaGet::Miss => {
            st.cmd_get.incr();
            st.get_misses.incr();
        }
    }
}

/// [`meta_read`] for a request that can wait, as [`read_or_wait`]: an `mg` that writes
/// nothing on a miss (no `T`, no `N`) and meets an item on flash not read yet returns the
/// reads it needs, counting nothing and calling nothing.
pub fn meta_read_or_wait(
    ctx: &Ctx<'_>,
    key: &[u8],
    now: Time,
    opts: MetaRead,
    found: &mut dyn FnMut(MetaItem<'_>),
) -> Result<MetaGet, Vec<kvstore::FlashRead>> {
    let engine = &ctx.shared.engine;
    if !engine.has_flash() || opts.touch.is_some() || opts.vivify.is_some() {
        return Ok(meta_read(ctx, key, now, opts, found));
    }
    if ctx.shared.watchers.wants(watch::FETCHERS) {
        watched_flash_reads(ctx, key)?;
        return Ok(meta_read(ctx, key, now, opts, found));
    }
    let (result, reads) = engine.defer_flash(|| engine.meta_get(key, now, opts, found));
    if result == MetaGet::Miss && !reads.is_empty() {
        return Err(reads);
    }
    count_meta_read(ctx.stats, &opts, result);
    Ok(result)
}

/// A store in any mode. `cmd_set` counts a store whose item could be built (memcached counts
/// it when the item is allocated: not for an item too large or out of memory); a `cas`
/// counts `cas_hits`, `cas_badval` or `cas_misses`.
pub fn store(ctx: &Ctx<'_>, req: MetaStoreRequest<'_>, now: Time) -> MetaStored {
    let st = ctx.stats;
    if ctx.shared.watchers.wants(watch::FETCHERS) {
        watch_lookup(ctx, req.key, now);
    }
    let stored = ctx.shared.engine.meta_store(req, now);
    match stored.result {
        StoreResult::TooLarge => st.store_too_large.incr(),
        StoreResult::NoMemory => st.store_no_memory.incr(),
        _ => st.cmd_set.incr(),
    }
    if matches!(req.mode, StoreMode::Cas(_)) {
        match stored.result {
            StoreResult::Stored(_) => st.cas_hits.incr(),
            StoreResult::Exists => st.cas_badval.incr(),
            StoreResult::NotFound => st.cas_misses.incr(),
            _ => {}
        }
    }
    if ctx.shared.watchers.wants(watch::MUTATIONS) {
        watch_store(ctx, &req, stored.result, now);
    }
    stored
}

/// An `item_store` line, as memcached writes it: the outcome, the command, the seconds
/// left to live (0: none), the class and the value's size.
#[cold]
#[inline(never)]
fn watch_store(ctx: &Ctx<'_>, req: &MetaStoreRequest<'_>, result: StoreResult, now: Time) {
    let status = match result {
        StoreResult::Stored(_) => "stored",
        StoreResult::NotStored => "not_stored",
        StoreResult::Exists => "exists",
        StoreResult::NotFound => "not_found",
        StoreResult::TooLarge => "too_large",
        StoreResult::NoMemory => "no_memory",
    };
    let cmd = match req.mode {
        StoreMode::Set => "set",
        StoreMode::Add => "add",
        StoreMode::Replace => "replace",
        StoreMode::Append => "append",
        StoreMode::Prepend => "prepend",
        StoreMode::Cas(_) => "cas",
    };
    let ttl = if req.exptime == 0 {
        0
    } else {
        req.exptime.saturating_sub(now)
    };
    let (_, class) = size_and_class(
        &ctx.shared.config,
        req.key.len(),
        req.value.len(),
        req.flags,
    );
    ctx.shared.watchers.emit(watch::MUTATIONS, |line| {
        line.extend_from_slice(b"type=item_store key=");
        kvproto::admin::uri_encode(line, req.key);
        let _ = write!(
            line,
            " status={status} cmd={cmd} ttl={ttl} clsid={class} cfd={} size={}",
            ctx.cfd,
            req.value.len()
        );
    });
}

/// A store whose data block is over `-I`, refused before it reached the engine: counts
/// `store_too_large` (not `cmd_set`, as memcached), and a `set` removes the old item so
/// that no reader sees stale data.
pub fn store_too_large(ctx: &Ctx<'_>, key: &[u8], set: bool) {
    ctx.stats.store_too_large.incr();
    if set {
        ctx.shared.engine.delete(key, ctx.now);
    }
}

/// A delete (`md`'s options in `req`). A removal counts `delete_hits` (an `md ... I`, which
/// only marks the item stale, counts nothing); a miss `delete_misses`; a CAS mismatch
/// counts a miss for meta, nothing for binary.
pub fn delete(
    ctx: &Ctx<'_>,
    key: &[u8],
    now: Time,
    req: MetaDelete,
    proto: Proto,
) -> MetaDeleteResult {
    let st = ctx.stats;
    if ctx.shared.watchers.wants(watch::FETCHERS) {
        watch_lookup(ctx, key, now);
    }
    // A `watch deletions` line needs the item's size, read before it goes.
    let watched = (ctx.shared.watchers.wants(watch::DELETIONS) && !req.invalidate)
        .then(|| ctx.shared.engine.debug_item(key, now))
        .flatten();
    let result = ctx.shared.engine.meta_delete(key, now, req);
    if let (Some(item), MetaDeleteResult::Deleted) = (watched, result) {
        let (_, class) = size_and_class(&ctx.shared.config, key.len(), item.value_len, item.flags);
        let cmd = if proto == Proto::Meta { "md" } else { "delete" };
        ctx.shared.watchers.emit(watch::DELETIONS, |line| {
            line.extend_from_slice(b"type=deleted key=");
            kvproto::admin::uri_encode(line, key);
            let _ = write!(line, " cmd={cmd} clsid={class} size={}", item.value_len);
        });
    }
    match result {
        MetaDeleteResult::Deleted if !req.invalidate => st.delete_hits.incr(),
        MetaDeleteResult::NotFound => st.delete_misses.incr(),
        MetaDeleteResult::Exists if proto == Proto::Meta => st.delete_misses.incr(),
        _ => {}
    }
    result
}

/// incr/decr. A change counts `incr_hits`/`decr_hits`, a miss `incr_misses`/`decr_misses`;
/// an item the binary protocol creates on a miss counts as a miss (meta's `N` counts
/// nothing).
pub fn arith(
    ctx: &Ctx<'_>,
    key: &[u8],
    now: Time,
    req: MetaArith,
    proto: Proto,
) -> MetaArithResult {
    let st = ctx.stats;
    let (hits, misses) = if req.incr {
        (&st.incr_hits, &st.incr_misses)
    } else {
        (&st.decr_hits, &st.decr_misses)
    };
    let result = ctx.shared.engine.meta_arith(key, now, req);
    match result {
        MetaArithResult::Value { created: false, .. } => hits.incr(),
        MetaArithResult::Value { created: true, .. } if proto == Proto::Binary => misses.incr(),
        MetaArithResult::NotFound => misses.incr(),
        _ => {}
    }
    result
}

/// `me`: what is known of `key`'s item, counted in `cmd_meta` (memcached bumps it for `me`
/// only).
pub fn debug_item(ctx: &Ctx<'_>, key: &[u8], now: Time) -> Option<DebugItem> {
    ctx.stats.cmd_meta.incr();
    ctx.shared.engine.debug_item(key, now)
}

/// `flush_all` (at `at`, absolute), counted in `cmd_flush`.
pub fn flush_all(ctx: &Ctx<'_>, at: Time) {
    ctx.stats.cmd_flush.incr();
    ctx.shared.engine.flush_all(at, ctx.now);
}

/// A `flush_all` refused because `-F` disabled it, which memcached's binary protocol still
/// counts in `cmd_flush`.
pub fn flush_refused(ctx: &Ctx<'_>) {
    ctx.stats.cmd_flush.incr();
}
