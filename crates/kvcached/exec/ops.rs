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

use crate::exec::session::Ctx;

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
    let hit = ctx
        .shared
        .engine
        .get(key, now, ReadOptions { touch }, found);
    ctx.stats.count_read(touch.is_some(), hit);
    hit
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
    let result = ctx.shared.engine.meta_get(key, now, opts, found);
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
    result
}

/// A store in any mode. `cmd_set` counts a store whose item could be built (memcached counts
/// it when the item is allocated: not for an item too large or out of memory); a `cas`
/// counts `cas_hits`, `cas_badval` or `cas_misses`.
pub fn store(ctx: &Ctx<'_>, req: MetaStoreRequest<'_>, now: Time) -> MetaStored {
    let st = ctx.stats;
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
    stored
}

/// A store whose data block is over `-I`, refused before it reached the engine: counts
/// `store_too_large` (not `cmd_set`, as memcached), and a `set` removes the old item so
/// that no reader sees stale data.
pub fn store_too_large(ctx: &Ctx<'_>, key: &[u8], set: bool) {
    ctx.stats.store_too_large.incr();
    if set {
        ctx.shared.engine.delete(key, ctx.shared.clock.now());
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
    let result = ctx.shared.engine.meta_delete(key, now, req);
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
    ctx.shared.engine.flush_all(at, ctx.shared.clock.now());
}

/// A `flush_all` refused because `-F` disabled it, which memcached's binary protocol still
/// counts in `cmd_flush`.
pub fn flush_refused(ctx: &Ctx<'_>) {
    ctx.stats.cmd_flush.incr();
}
