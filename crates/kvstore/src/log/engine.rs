//! The `Engine` trait implemented on the log: each command's entry point.

use std::sync::atomic::Ordering;

use super::format::{Rec, SEG_HDR};
use super::index::Slot;
use super::meta::Step;
use super::write::{Commit, Cond, Fail, MetaW, Outcome, Src};
use super::{index, LogEngine, Vis, MAINTAIN_BUCKETS, MAX_KEY, RETRIES};
use crate::{
    DebugItem, Engine, EngineStats, ItemView, MetaArith, MetaArithResult, MetaDelete,
    MetaDeleteResult, MetaGet, MetaItem, MetaRead, MetaStoreRequest, MetaStored, ReadOptions,
    StoreMode, StoreResult, Time, Win,
};

impl Engine for LogEngine {
    fn get(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOptions,
        found: &mut dyn FnMut(ItemView<'_>),
    ) -> bool {
        self.tick(now);
        let h = self.hash(key);
        if let Some(exptime) = opts.touch {
            return self.touch_inner(key, h, exptime, now, Some(found));
        }
        let mut fetch = super::flash::Fetch::default();
        // The item's slot value and visibility, and for a live flash item to copy back to
        // memory its value's length.
        let (v, vis, value_len) = {
            let _pin = self.pin();
            // SAFETY: pinned for as long as `r` is used (the callback included).
            let Some((slot, v, r)) = (unsafe { self.lookup(h, key, &mut fetch) }) else {
                return false;
            };
            match self.vis(&r, now) {
                Vis::Live => {
                    self.mark_access(slot, v);
                    found(self.view_leasable(key, &r, v));
                    if !self.wants_recache(v) {
                        return true;
                    }
                    (v, Vis::Live, r.value.len())
                }
                vis => (v, vis, 0),
            }
        };
        if vis == Vis::Live {
            // A flash item read again: back to memory, after the pin (a write may evict).
            self.recache(key, h, v, value_len, fetch, now);
            return true;
        }
        self.count_dead(vis);
        self.unlink_dead(h, v);
        false
    }

    fn delete(&self, key: &[u8], now: Time) -> bool {
        self.tick(now);
        self.delete_inner(key, self.hash(key), now)
    }

    fn touch(&self, key: &[u8], exptime: Time, now: Time) -> bool {
        self.tick(now);
        self.touch_inner(key, self.hash(key), exptime, now, None)
    }

    fn flush_all(&self, at: Time, now: Time) {
        self.tick(now);
        self.flush.flush_all(at, now, || self.cas.reserved());
    }

    fn set_max_bytes(&self, max_bytes: usize, now: Time) {
        self.tick(now);
        self.arena.set_limit(max_bytes);
        self.eviction.resize_sketch(max_bytes);
        self.shrink();
    }

    fn stats(&self) -> EngineStats {
        let mut items = 0;
        let mut bytes = 0;
        for id in 0..self.seg_ids() {
            if let Some(s) = self.segs.get(id) {
                items += s.live_items();
                bytes += s.live_bytes();
            }
        }
        let st = self.stats.totals();
        EngineStats {
            bytes,
            curr_items: items,
            total_items: self.stats.stored(),
            evictions: st.evictions,
            reclaimed: st.reclaimed,
            crawler_reclaimed: st.crawler_reclaimed,
            crawler_items_checked: st.crawler_checked,
            expired_unfetched: st.expired_unfetched,
            evicted_unfetched: st.evicted_unfetched,
            evicted_nonzero: st.evicted_nonzero,
            get_expired: st.get_expired,
            get_flushed: st.get_flushed,
            limit_maxbytes: self.arena.limit() as u64,
            total_malloced: self.arena.allocated() as u64,
            hash_power_level: u64::from(self.index.level()),
            hash_bytes: self.index.bytes() as u64,
            // A batch is under way while its steps are pending (or running right now).
            hash_is_expanding: self.grow_lock.try_lock().is_ok_and(|g| g.expanding),
        }
    }

    fn stats_detail(&self, group: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut put = |k: &str, v: u64| out.push((k.to_string(), v.to_string()));
        let st = self.stats.totals();
        match group {
            "slabs" => {
                let (mut regular, mut large, mut large_bytes, mut used, mut live) = (0, 0, 0, 0, 0);
                for id in 0..self.seg_ids() {
                    let Some(s) = self.segs.get(id) else { continue };
                    if s.ptr().is_none() {
                        continue;
                    }
                    if s.is_large() {
                        large += 1;
                        large_bytes += s.cap() as u64;
                    } else {
                        regular += 1;
                    }
                    used += s.used().saturating_sub(SEG_HDR) as u64;
                    live += s.live_bytes();
                }
                let free = self.arena.pool().free_len() as u64;
                let sealed = self.eviction.sealed() as u64;
                // memcached's summary names first: the log is one "slab class".
                put("active_slabs", 1);
                put("segment_size", self.seg_size as u64);
                put("segments_total", regular);
                put("segments_free", free);
                put("segments_sealed", sealed);
                put("large_items_segments", large);
                put("large_items_bytes", large_bytes);
                put("live_bytes", live);
                put("dead_bytes", used.saturating_sub(live));
                put("index_bytes", self.index.bytes() as u64);
                put("index_buckets", self.index.nmain() as u64);
                put("index_max_buckets", self.index.max_main() as u64);
                put("index_level", u64::from(self.index.level()));
                put("index_splits", st.index_splits);
                put(
                    "index_overflow_buckets_used",
                    self.index.overflow_used() as u64,
                );
                put("leased_bytes", self.leased_bytes() as u64);
                put("total_malloced", self.arena.allocated() as u64);
            }
            "items" => {
                // memcached's names, per slab class; the log has one "class" (1).
                let evictions = st.evictions;
                let rows: [(&str, u64); 16] = [
                    ("number", self.stats().curr_items),
                    ("evicted", evictions),
                    ("evicted_nonzero", st.evicted_nonzero),
                    ("evicted_unfetched", st.evicted_unfetched),
                    ("reclaimed", st.reclaimed),
                    ("expired_unfetched", st.expired_unfetched),
                    ("outofmemory", 0),
                    ("evicted_clock", evictions - st.evicted_index),
                    ("evicted_index_full", st.evicted_index),
                    ("copied_forward", st.copied_forward),
                    ("readmitted", st.readmitted),
                    ("segments_evicted", st.segments_evicted),
                    ("segments_compacted", st.segments_compacted),
                    ("segments_expired", st.segments_expired),
                    ("ttl_class_busy", st.ttl_class_busy),
                    ("tombstones", st.tombstones),
                ];
                for (name, value) in rows {
                    put(&format!("items:1:{name}"), value);
                }
            }
            _ => {}
        }
        out
    }

    fn tally_sizes(&self, bounds: &[u32], steps: bool) {
        let t =
            super::tally::Tally::new(bounds, self.stats.cells(), steps, self.config.max_item_size);
        if self.tally.set(t).is_err() {
            return;
        }
        let Some(t) = self.tally.get() else { return };
        // Count what the index already holds (a warm restart's items).
        self.for_each_indexed(|_, v| {
            let mut fetch = super::flash::Fetch::default();
            // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
            if let Some(r) = unsafe { self.rec_any(v, &mut fetch) } {
                t.count(self.rec_size(&r), 1);
            }
        });
    }

    fn size_bands(&self) -> Vec<crate::SizeBand> {
        self.tally.get().map_or_else(Vec::new, |t| t.bands())
    }

    fn size_steps(&self) -> Option<Vec<(usize, u64)>> {
        self.tally.get()?.steps()
    }

    fn reset_stats(&self) {
        self.stats.reset();
        if let Some(t) = self.tally.get() {
            t.reset();
        }
    }

    fn meta_get(
        &self,
        key: &[u8],
        now: Time,
        opts: MetaRead,
        found: &mut dyn FnMut(MetaItem<'_>),
    ) -> MetaGet {
        self.tick(now);
        if key.len() > MAX_KEY {
            return MetaGet::Miss;
        }
        let h = self.hash(key);
        for _ in 0..RETRIES {
            let step = match opts.touch {
                Some(t) => self.meta_touch(key, h, t, now, &opts, found),
                None => self.meta_read(key, h, now, &opts, None, found),
            };
            match step {
                Step::Done(r) => return r,
                Step::Retry => continue,
                Step::Missing => {}
            }
            let Some(exptime) = opts.vivify else {
                return MetaGet::Miss;
            };
            if self.too_large(key.len(), 0, 0) {
                return MetaGet::Miss;
            }
            // Create an empty item; this request holds its win token.
            let c = Commit {
                key,
                h,
                cond: Cond::Absent,
                src: Src::Bytes(&[]),
                old_len: 0,
                flags: Some(0),
                exptime: Some(exptime),
                keep_cas: false,
                keep_access: false,
                access: !opts.no_bump,
                meta: MetaW {
                    explicit_cas: opts.new_cas,
                    binary_key: Some(opts.binary_key),
                    win: Some(true),
                    ..MetaW::default()
                },
            };
            let mut show = |_: Option<(Slot<'_>, u64)>, r: &Rec<'_>, _: u64| {
                found(MetaItem {
                    item: self.view(key, r),
                    exptime_before: 0,
                    created: true,
                    last_access: now,
                    fetched: false,
                    stale: false,
                    win: Win::Won,
                    binary_key: opts.binary_key,
                })
            };
            match self.commit(&c, now, Some(&mut show)) {
                Outcome::Stored(_) => return MetaGet::Vivified,
                // Created meanwhile: read that one.
                Outcome::Failed(_) => continue,
                Outcome::NoMemory | Outcome::TooLarge => return MetaGet::Miss,
            }
        }
        MetaGet::Miss
    }

    fn meta_store(&self, req: MetaStoreRequest<'_>, now: Time) -> MetaStored {
        self.tick(now);
        let h = self.hash(req.key);
        let (result, len) = if req.key.len() > MAX_KEY
            || self.too_large(req.key.len(), req.value.len(), req.flags)
        {
            (StoreResult::TooLarge, req.value.len())
        } else {
            self.store_inner(&req, h, now)
        };
        if matches!(result, StoreResult::TooLarge | StoreResult::NoMemory)
            && req.mode == StoreMode::Set
            && req.key.len() <= MAX_KEY
        {
            // memcached drops the old item when a set is refused (no stale data).
            self.delete_inner(req.key, h, now);
        }
        MetaStored { result, len }
    }

    fn meta_delete(&self, key: &[u8], now: Time, req: MetaDelete) -> MetaDeleteResult {
        self.tick(now);
        if key.len() > MAX_KEY {
            return MetaDeleteResult::NotFound;
        }
        let h = self.hash(key);
        for _ in 0..RETRIES {
            let Some(p) = self.peek(h, key, now) else {
                self.tombstone_for_replicas(key, h);
                return MetaDeleteResult::NotFound;
            };
            if req.compare_cas.is_some_and(|c| c != p.cas) {
                return MetaDeleteResult::Exists;
            }
            if !req.remove_value && !req.invalidate {
                match self.delete_at(key, h, now, Some(p.ident)) {
                    Some(true) => return MetaDeleteResult::Deleted,
                    Some(false) => return MetaDeleteResult::NotFound,
                    None => continue,
                }
            }
            // `x` replaces the item by an empty one (a new item, keeping its CAS unless
            // `E` gives one); `I` rewrites it stale with a new CAS, keeping its value,
            // access bits and time. Both draw a new version and clear the win mark.
            let explicit_cas = if req.invalidate {
                req.new_cas
            } else {
                Some(req.new_cas.unwrap_or(p.cas))
            };
            let exptime = match (req.ttl, req.remove_value) {
                (Some(t), _) => Some(t),
                (None, true) => Some(0),
                (None, false) => None,
            };
            let c = Commit {
                key,
                h,
                cond: Cond::Loc(p.ident),
                src: if req.remove_value {
                    Src::Bytes(&[])
                } else {
                    Src::Old
                },
                old_len: p.value_len,
                flags: req.remove_value.then_some(req.flags),
                exptime,
                keep_cas: false,
                keep_access: !req.remove_value,
                access: false,
                meta: MetaW {
                    explicit_cas,
                    stale: Some(req.invalidate),
                    binary_key: None,
                    win: Some(false),
                },
            };
            match self.commit(&c, now, None) {
                Outcome::Stored(_) => return MetaDeleteResult::Deleted,
                Outcome::Failed(Fail::Moved) => continue,
                Outcome::Failed(_) => return MetaDeleteResult::NotFound,
                Outcome::NoMemory | Outcome::TooLarge => return MetaDeleteResult::NotStored,
            }
        }
        MetaDeleteResult::NotFound
    }

    fn meta_arith(&self, key: &[u8], now: Time, req: MetaArith) -> MetaArithResult {
        self.tick(now);
        if key.len() > MAX_KEY {
            return MetaArithResult::NotFound;
        }
        self.arith_inner(key, self.hash(key), now, &req)
    }

    fn debug_item(&self, key: &[u8], now: Time) -> Option<DebugItem> {
        self.tick(now);
        if key.len() > MAX_KEY {
            return None;
        }
        let h = self.hash(key);
        let dead = {
            let _pin = self.pin();
            let mut fetch = super::flash::Fetch::default();
            // SAFETY: pinned while `r` is used.
            let (_, v, r) = unsafe { self.lookup(h, key, &mut fetch) }?;
            match self.vis(&r, now) {
                Vis::Live => return Some(self.describe(&r, v, now)),
                vis => (v, vis),
            }
        };
        self.count_dead(dead.1);
        self.unlink_dead(h, dead.0);
        None
    }

    fn maintain(&self, now: Time, sweep: bool) -> u64 {
        self.tick(now);
        self.settle();
        self.flash_make_room();
        self.repl_log_evictions();
        self.eviction.age_sketch();
        let mut n = 0;
        let mut checked = 0u64;
        // A bounded slice of the index per call, continuing where the last call stopped.
        let nmain = self.index.nmain();
        let chunk = if sweep {
            nmain.min(MAINTAIN_BUCKETS)
        } else {
            0
        };
        // Items are read only where one may be dead: in a segment whose earliest expiry
        // has come, or anywhere during the first pass after a flush (an idle cache of items
        // without times to live costs the sweep no reads of the log).
        let (start, every) = self.sweep.next(nmain, chunk, self.flush.marks());
        let every = every || self.flush.deadline_passed(now);
        // Nothing to look for at all (no segment's earliest expiry has come): the index is
        // not walked. A segment header each is far less than a walk of the index.
        let chunk = if every
            || (0..self.seg_ids())
                .any(|id| self.segs.get(id).is_some_and(|s| s.may_have_expired(now)))
        {
            chunk
        } else {
            0
        };
        for i in 0..chunk {
            let b = (start + i) % nmain;
            let _g = self.index.lock_bucket(b);
            self.index.for_each_in_chain(b, |slot, v| {
                if !every
                    && !self
                        .segs
                        .get(index::slot_seg(v))
                        .is_some_and(|s| s.may_have_expired(now))
                {
                    return;
                }
                // A flash item is read too (blocking: this is the maintenance thread).
                let mut fetch = super::flash::Fetch::default();
                // SAFETY: we hold the stripe lock of this chain and `v` is in its slot.
                let Some(r) = (unsafe { self.rec_any(v, &mut fetch) }) else {
                    return;
                };
                checked += 1;
                if self.vis(&r, now) != Vis::Live {
                    self.unlink(slot, &r, v);
                    self.count_reclaimed(v, self.rec_size(&r), true);
                    n += 1;
                }
            });
        }
        let st = self.st();
        st.crawler_checked.fetch_add(checked, Ordering::Relaxed);
        st.crawler_reclaimed.fetch_add(n, Ordering::Relaxed);
        // The segments kept for replicas, and every replica's position (what is freed
        // while one still needs it is logged anew so that it can skip it).
        let holds = self.retire_holds(now);
        let wanted = self.repl.holds();
        if sweep {
            self.seal_aged(now);
            self.expire_segments(&holds, &wanted);
        }
        self.free_dead_segments(&holds, &wanted);
        self.prune_skippable(&wanted);
        self.grow(true);
        n
    }
}

impl LogEngine {
    /// How many [`Engine::maintain`] calls with `sweep` look at every index bucket once: a
    /// whole pass of the expiry sweep (what the server runs for memcached's `lru_crawler
    /// crawl`).
    pub fn sweep_calls(&self) -> usize {
        self.index.nmain().div_ceil(MAINTAIN_BUCKETS).max(1)
    }
}
