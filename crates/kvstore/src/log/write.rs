//! The write path: a `Commit` (what to check, what to append) applied under the key's stripe
//! lock, large items in their own segments, and store, touch, delete and incr/decr built on it.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::format::{
    self, Rec, Spec, HDR_MAX, KIND_ITEM, KIND_TOMBSTONE, META_BINARY_KEY, META_STALE, SEG_HDR,
};
use super::index::{Insert, Slot, IDENT_MASK};
use super::segments::{Dest, Evicted, Open, Queue};
use super::{index, LogEngine, Vis, GROW_EVERY, MAX_KEY, PAGE, RETRIES};
use crate::{
    number, ItemView, MetaArith, MetaArithResult, MetaStoreRequest, StoreMode, StoreResult, Time,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cond {
    Any,
    Absent,
    Present,
    Cas(u64),
    /// `ms ... I`: like `Cas`, but a non-zero CAS lower than the item's also stores, and
    /// then the new item is stale and keeps the old expiry and win mark.
    CasStale(u64),
    /// The live item must still be at this location (slot identity bits).
    Loc(u64),
    /// A replicated record (replica): stores with this version (CAS, rewrite stamp) if
    /// the key's current record, live or not, has a lower one.
    Newer(u64, u64),
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Src<'a> {
    Bytes(&'a [u8]),
    OldThen(&'a [u8]),
    ThenOld(&'a [u8]),
    Old,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fail {
    Present,
    Absent,
    CasMismatch,
    Moved,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Stored(u64),
    Failed(Fail),
    NoMemory,
    TooLarge,
}

/// One write: what to check and what to append.
#[derive(Clone, Copy)]
pub(super) struct Commit<'a> {
    pub(super) key: &'a [u8],
    pub(super) h: u64,
    pub(super) cond: Cond,
    pub(super) src: Src<'a>,
    /// Length of the old value where `src` uses it (as read before locking; `Loc`
    /// guarantees it is unchanged).
    pub(super) old_len: usize,
    /// None: keep the old item's.
    pub(super) flags: Option<u32>,
    pub(super) exptime: Option<Time>,
    /// Keep the old item's CAS (touch) instead of drawing a new one.
    pub(super) keep_cas: bool,
    /// Keep the old slot's access bits (the same item rewritten), and with `access` count
    /// this write as an access too.
    pub(super) keep_access: bool,
    pub(super) access: bool,
    pub(super) meta: MetaW,
}

/// The meta-protocol state a write gives the new item.
#[derive(Debug, Clone, Copy)]
pub(super) struct MetaW {
    /// The CAS clients see (`E`), when not the drawn version; ignored with `keep_cas`
    /// (the old item's is kept) and when CAS is off.
    pub(super) explicit_cas: Option<u64>,
    /// The stale mark; None keeps the old item's.
    pub(super) stale: Option<bool>,
    /// The binary-key mark; None keeps the old item's.
    pub(super) binary_key: Option<bool>,
    /// Set or clear the win mark; None keeps the old slot's with `keep_access`, else
    /// clears it.
    pub(super) win: Option<bool>,
}

/// The callback of a write that shows its result (gat, mg with T, mg with N): the slot and
/// the value it held before (when the write replaced a live item in place) and the new
/// record, all under the key's stripe lock.
pub(super) type ShowFn<'s> = &'s mut dyn FnMut(Option<(Slot<'_>, u64)>, &Rec<'_>, u64);

/// A stripe lock still held after a write, with the slot value written.
pub(super) struct Held<'a> {
    pub(super) _g: MutexGuard<'a, ()>,
    /// The slot and its value before the write, when a live item was replaced.
    pub(super) prev: Option<(Slot<'a>, u64)>,
    pub(super) v: u64,
}

impl LogEngine {
    /// Check `c.cond` under the bucket lock and, if it holds, append the record at `dest`
    /// and point the index at it. Returns the outcome and the bytes appended.
    ///
    /// On success the stripe lock is handed back with the new slot value, so that the
    /// caller can finish its bookkeeping (advance its append offset, queue a large
    /// segment) before a `gat` callback runs under the same lock: a panicking callback
    /// then cannot leave a published record inside the free part of a segment.
    pub(super) fn apply(
        &self,
        c: &Commit<'_>,
        dest: &Dest,
        now: Time,
    ) -> (Outcome, usize, Option<Held<'_>>) {
        let g = self.index.lock(c.h);
        let mut fetch = super::flash::Fetch::default();
        // SAFETY: we hold `c.h`'s stripe lock.
        let cur = unsafe { self.lookup(c.h, c.key, &mut fetch) };
        let mut live = None;
        if let Some((_, v, r)) = &cur {
            match self.vis(r, now) {
                Vis::Live => live = Some((*v, *r)),
                vis => self.count_dead(vis),
            }
        }
        let mut stale_store = false;
        let failed = match (c.cond, &live) {
            (Cond::Any, _) => None,
            (Cond::Absent, Some(_)) => Some(Fail::Present),
            (Cond::Absent, None) => None,
            (Cond::Present, None) => Some(Fail::Absent),
            (Cond::Present, Some(_)) => None,
            (Cond::Cas(_) | Cond::CasStale(_), None) => Some(Fail::Absent),
            (Cond::Cas(want), Some((_, r))) => {
                (want == 0 || want != self.rec_cas(r)).then_some(Fail::CasMismatch)
            }
            (Cond::CasStale(want), Some((_, r))) => {
                let have = self.rec_cas(r);
                if want != 0 && want == have {
                    None
                } else if want != 0 && want < have {
                    stale_store = true;
                    None
                } else {
                    Some(Fail::CasMismatch)
                }
            }
            (Cond::Loc(ident), Some((v, _))) => (v & IDENT_MASK != ident).then_some(Fail::Moved),
            (Cond::Loc(_), None) => Some(Fail::Moved),
            (Cond::Newer(cas, stamp), _) => cur
                .as_ref()
                .is_some_and(|(_, _, r)| (r.cas, r.stamp) >= (cas, stamp))
                .then_some(Fail::Present),
        };
        if let Some(f) = failed {
            return (Outcome::Failed(f), 0, None);
        }
        let old = live.map(|(_, r)| r);
        let old_value: &[u8] = old.map_or(&[], |r| r.value);
        let parts: [&[u8]; 2] = match c.src {
            Src::Bytes(b) => [b, &[]],
            Src::OldThen(b) => [old_value, b],
            Src::ThenOld(b) => [b, old_value],
            Src::Old => [old_value, &[]],
        };
        if HDR_MAX + c.key.len() + parts[0].len() + parts[1].len() > dest.room {
            // The old value is not the length the reservation was made for: the slot
            // went away and came back at the same place with another record (ABA).
            // Never write past the reservation; the caller retries.
            return (Outcome::Failed(Fail::Moved), 0, None);
        }
        let (cas, stamp, explicit_cas) = match (c.cond, c.keep_cas, old) {
            (Cond::Newer(cas, stamp), _, _) => (cas, stamp, c.meta.explicit_cas),
            (_, true, Some(r)) => (r.cas, self.rewrite_stamp(r.stamp), r.explicit_cas),
            _ => {
                // Above the key's current record, at or above the stripe's floor (the
                // versions of its keys' tombstones and of items that left the index) and
                // the flush marks (a store after a flush survives it): the version the
                // record's place gives if it is, so the record stores none (`format.rs`),
                // else a drawn one.
                let min = cur
                    .as_ref()
                    .map_or(0, |(_, _, r)| r.cas.saturating_add(1))
                    .max(self.index.floor(c.h))
                    .max(self.flush.floor())
                    .max(self.cas.seen());
                let natural = dest.natural();
                let cas = if natural >= min {
                    natural
                } else {
                    self.cas.draw(min)
                };
                (cas, 0, c.meta.explicit_cas.filter(|_| self.config.use_cas))
            }
        };
        let old_meta = old.map_or(0, |r| r.meta);
        let stale = stale_store || c.meta.stale.unwrap_or(old_meta & META_STALE != 0);
        let binary = c.meta.binary_key.unwrap_or(old_meta & META_BINARY_KEY != 0);
        let exptime = match (stale_store, old) {
            (true, Some(r)) => r.exptime,
            _ => c.exptime.or(old.map(|r| r.exptime)).unwrap_or(0),
        };
        let spec = Spec {
            kind: KIND_ITEM,
            key: c.key,
            parts,
            flags: c.flags.or(old.map(|r| r.flags)).unwrap_or(0),
            exptime,
            cas,
            stamp,
            meta: if stale { META_STALE } else { 0 } | if binary { META_BINARY_KEY } else { 0 },
            explicit_cas,
        };
        // SAFETY: `dest` is in a segment the caller owns for appending (its shard's open
        // segment under the shard lock, or a fresh large segment) and `dest.room` bytes
        // from `dest.off` are unwritten and inside the mapping; the record takes at most
        // `HDR_MAX + key + value <= dest.room` bytes (checked above). The parts borrow
        // the old record, which the stripe lock keeps in place, and cannot overlap the
        // unpublished destination.
        let len = unsafe {
            format::write(
                dest.ptr.as_ptr().add(dest.off),
                dest.room,
                &spec,
                dest.natural(),
            )
        };
        let fresh = index::pack(self.index.tag(c.h), dest.id, dest.off as u32, 0, false);
        // The new slot value, from the value the slot holds when it is replaced: readers
        // may set access or win bits until then (by compare-exchange), and a write that
        // keeps them must not lose one.
        let next = |cur: Option<u64>| {
            let mut n = fresh;
            if let Some(x) = cur {
                if c.keep_access {
                    n |= x & !IDENT_MASK;
                } else if stale_store {
                    n |= x & index::WIN;
                }
            }
            match c.meta.win {
                Some(true) => n |= index::WIN,
                Some(false) => n &= !index::WIN,
                None => {}
            }
            if c.access {
                n = index::bumped(n);
            }
            n
        };
        let mut new_v = next(None);
        let mut held_prev = None;
        let mut indexed = true;
        match &cur {
            Some((slot, v, r)) => {
                // A dead item's time and bits are not kept (`Loc` writes, the only ones
                // that keep them, need a live item).
                let keep = live.is_some();
                let prev = slot.fetch_update(|x| next(keep.then_some(x)));
                new_v = next(keep.then_some(prev));
                held_prev = keep.then_some((*slot, prev));
                self.account_remove(*v, r.len, self.rec_size(r));
                if !keep {
                    // An expired or flushed item replaced: its memory is the new item's,
                    // as memcached reuses an expired item's for the next store.
                    self.count_reclaimed(*v, self.rec_size(r), false);
                }
            }
            None => {
                new_v = self.admit(c.h, new_v);
                let ins = self.index.insert(c.h, new_v);
                if let Insert::Full = ins {
                    // No slot to take (only markers of a split in the chain): the new
                    // record stays unreferenced, as if evicted at once.
                    self.count_index_eviction();
                    self.tally_evicted(self.spec_size(&spec));
                    indexed = false;
                }
                if let Insert::Victim(slot) = ins {
                    // The chain is full: this slot's item is evicted to make room.
                    self.evict_index_slot(slot, slot.load(), new_v);
                }
            }
        }
        let shown = if self.config.use_cas {
            explicit_cas.unwrap_or(cas)
        } else {
            0
        };
        if !indexed {
            return (Outcome::Stored(shown), len, None);
        }
        self.account_add(dest.id, len, self.spec_size(&spec), spec.exptime);
        (
            Outcome::Stored(shown),
            len,
            Some(Held {
                _g: g,
                prev: held_prev,
                v: new_v,
            }),
        )
    }

    /// Show the item just written to a callback, still under its stripe lock.
    pub(super) fn show(&self, held: Option<Held<'_>>, view: Option<ShowFn<'_>>) {
        if let (Some(held), Some(cb)) = (held, view) {
            // SAFETY: `held.v` is in its slot and we hold the stripe lock (`held._g`).
            if let Some(r) = unsafe { self.rec(held.v) } {
                cb(held.prev, &r, held.v);
            }
        }
    }

    pub(super) fn commit(&self, c: &Commit<'_>, now: Time, view: Option<ShowFn<'_>>) -> Outcome {
        let extra = match c.src {
            Src::Bytes(b) | Src::OldThen(b) | Src::ThenOld(b) => b.len(),
            Src::Old => 0,
        };
        let vlen = match c.src {
            Src::Bytes(_) => extra,
            _ => extra + c.old_len,
        };
        if c.key.len() > MAX_KEY || vlen > self.config.max_item_size {
            return Outcome::TooLarge;
        }
        let need = HDR_MAX + c.key.len() + vlen;
        if SEG_HDR + need > self.seg_size {
            return self.commit_large(c, need, now, view);
        }
        let mut sh = self.open_for(c.exptime, now);
        // A rewrite of the item's own bytes (touch) frees as much as it takes: with -M and
        // full memory it goes where compaction makes room.
        let rewrite = self.config.no_evict && c.keep_cas && matches!(c.src, Src::Old);
        let Some(open) = self.room_with(&mut sh, need, !rewrite) else {
            drop(sh);
            if rewrite {
                return self.commit_compacted(c, need, now, view);
            }
            return Outcome::NoMemory;
        };
        let Some(dest) = self.dest(&open) else {
            return Outcome::NoMemory;
        };
        let (out, len, held) = self.apply(c, &dest, now);
        let mut grow = false;
        if len > 0 {
            self.advance(&mut sh, open, len);
            if !c.keep_cas && !c.keep_access {
                let n = self.stats.count_store();
                grow = n % GROW_EVERY == GROW_EVERY - 1;
            }
        }
        self.show(held, view);
        drop(sh);
        if grow {
            self.grow(false);
        }
        out
    }

    /// The open segment a new record expiring at `exptime` goes to (None: the old item's
    /// expiry, unknown before the stripe lock), locked: its TTL class's, or the thread's
    /// shard's for items that never expire, expire beyond the classes or have no class
    /// (see [`super::open::OpenSegs::for_expiry`]).
    fn open_for(&self, exptime: Option<Time>, now: Time) -> MutexGuard<'_, Option<Open>> {
        let ttl = exptime.filter(|&e| e > now).map(|e| e - now);
        let (slot, busy) = self.open.for_expiry(ttl);
        if busy {
            self.st().ttl_class_busy.fetch_add(1, Ordering::Relaxed);
        }
        slot
    }

    pub(super) fn commit_large(
        &self,
        c: &Commit<'_>,
        need: usize,
        now: Time,
        view: Option<ShowFn<'_>>,
    ) -> Outcome {
        let total = (SEG_HDR + need).div_ceil(PAGE) * PAGE;
        if total > self.budget() {
            return Outcome::TooLarge;
        }
        let Some((id, ptr)) = self.reserve_large(total) else {
            return Outcome::NoMemory;
        };
        // One unique for its one record (see `format::natural_cas`).
        let base = self.cas.reserve_block(1).wrapping_sub(SEG_HDR as u64);
        // The sequence number is drawn once the record is in (a failed write never
        // becomes visible, and log readers expect every number to name a segment).
        // SAFETY: the mapping is fresh, `total >= SEG_HDR`, and nothing else knows it.
        unsafe { format::write_seg_header(ptr.as_ptr(), format::SEG_KIND_LARGE, 0, base) };
        let dest = Dest {
            id,
            ptr,
            off: SEG_HDR,
            base,
            room: total - SEG_HDR,
        };
        let (out, len, held) = self.apply(c, &dest, now);
        if len == 0 {
            // Never visible: free it at once.
            let mut p = self.arena.pool();
            self.release(&mut p, id);
            return out;
        }
        if let Some(seg) = self.segs.get(id) {
            let mut order = self.order.lock();
            let seq = order.number(id, false);
            // SAFETY: bytes 8..16 of the header (the sequence number) are read by no one
            // (readers of the record read the CAS base, bytes 16..24).
            unsafe {
                std::ptr::copy_nonoverlapping(seq.to_le_bytes().as_ptr(), ptr.as_ptr().add(8), 8)
            };
            seg.publish_sealed(seq, SEG_HDR + len);
        }
        if !c.keep_cas && !c.keep_access {
            self.stats.count_store();
        }
        // Queued only now that its slot is installed (the evictor frees large segments
        // that no slot points at).
        self.eviction.push(id, Queue::Small);
        self.show(held, view);
        out
    }

    /// Map a large segment of `total` bytes within the budget, evicting if allowed.
    pub(super) fn reserve_large(&self, total: usize) -> Option<(u32, NonNull<u8>)> {
        let attempts = 4 * (self.arena.allocated() / self.seg_size) + 16;
        for _ in 0..attempts {
            {
                let mut p = self.arena.pool();
                if self.arena.allocated() + total <= self.write_budget() {
                    return self.new_segment(&mut p, total, true);
                }
                if let Some(id) = p.pop_free() {
                    self.release(&mut p, id);
                    continue;
                }
            }
            if self.config.no_evict {
                if self.reclaim_dead() || self.unstick() && self.reclaim_dead() {
                    continue;
                }
                return None;
            }
            if self.evict_one(true) == Evicted::Nothing && !self.unstick() {
                return None;
            }
        }
        None
    }

    /// A store with the meta options (the classic store is one without them); returns the
    /// result and the stored value's length (the request's when nothing was stored).
    pub(super) fn store_inner(
        &self,
        req: &MetaStoreRequest<'_>,
        h: u64,
        now: Time,
    ) -> (StoreResult, usize) {
        let len = req.value.len();
        let base = Commit {
            key: req.key,
            h,
            cond: Cond::Any,
            src: Src::Bytes(req.value),
            old_len: 0,
            flags: Some(req.flags),
            exptime: Some(req.exptime),
            keep_cas: false,
            keep_access: false,
            access: false,
            meta: MetaW {
                explicit_cas: req.new_cas,
                binary_key: Some(req.binary_key),
                ..MetaW::default()
            },
        };
        let c = match req.mode {
            StoreMode::Set => base,
            StoreMode::Add => {
                if self.peek(h, req.key, now).is_some() {
                    return (StoreResult::NotStored, len);
                }
                Commit {
                    cond: Cond::Absent,
                    ..base
                }
            }
            StoreMode::Replace => {
                if self.peek(h, req.key, now).is_none() {
                    return (StoreResult::NotStored, len);
                }
                Commit {
                    cond: Cond::Present,
                    ..base
                }
            }
            StoreMode::Cas(want) => {
                if self.peek(h, req.key, now).is_none() {
                    return (StoreResult::NotFound, len);
                }
                let cond = if req.invalidate {
                    Cond::CasStale(want)
                } else {
                    Cond::Cas(want)
                };
                Commit { cond, ..base }
            }
            StoreMode::Append | StoreMode::Prepend => {
                for _ in 0..RETRIES {
                    let Some(p) = self.peek(h, req.key, now) else {
                        if !req.vivify {
                            return (StoreResult::NotStored, len);
                        }
                        let c = Commit {
                            cond: Cond::Absent,
                            ..base
                        };
                        match self.commit(&c, now, None) {
                            // Created meanwhile: append to it.
                            Outcome::Failed(Fail::Present) => continue,
                            o => return (self.result(o, false), len),
                        }
                    };
                    if req.compare_cas.is_some_and(|c| c != 0 && c != p.cas) {
                        return (StoreResult::Exists, len);
                    }
                    if self.too_large(req.key.len(), p.value_len + req.value.len(), p.flags) {
                        return (StoreResult::NotStored, len);
                    }
                    let src = if req.mode == StoreMode::Append {
                        Src::OldThen(req.value)
                    } else {
                        Src::ThenOld(req.value)
                    };
                    let c = Commit {
                        cond: Cond::Loc(p.ident),
                        src,
                        old_len: p.value_len,
                        flags: None,
                        exptime: None,
                        ..base
                    };
                    match self.commit(&c, now, None) {
                        Outcome::Failed(Fail::Moved) => continue,
                        Outcome::TooLarge => return (StoreResult::NotStored, len),
                        o @ Outcome::Stored(_) => {
                            return (self.result(o, false), p.value_len + req.value.len())
                        }
                        o => return (self.result(o, false), len),
                    }
                }
                return (StoreResult::NotStored, len);
            }
        };
        let out = self.commit(&c, now, None);
        (self.result(out, matches!(req.mode, StoreMode::Cas(_))), len)
    }

    pub(super) fn result(&self, o: Outcome, cas_mode: bool) -> StoreResult {
        match o {
            Outcome::Stored(c) => StoreResult::Stored(c),
            Outcome::Failed(Fail::CasMismatch) => StoreResult::Exists,
            Outcome::Failed(Fail::Absent | Fail::Moved) if cas_mode => StoreResult::NotFound,
            Outcome::Failed(_) => StoreResult::NotStored,
            Outcome::NoMemory => StoreResult::NoMemory,
            Outcome::TooLarge => StoreResult::TooLarge,
        }
    }

    /// Rewrite the live item with a new expiry (same CAS); `found` sees the result.
    pub(super) fn touch_inner(
        &self,
        key: &[u8],
        h: u64,
        exptime: Time,
        now: Time,
        mut found: Option<&mut dyn FnMut(ItemView<'_>)>,
    ) -> bool {
        for _ in 0..RETRIES {
            let Some(p) = self.peek(h, key, now) else {
                return false;
            };
            if p.exptime == exptime {
                // The expiry stays as it is: nothing the log holds changes (nothing to
                // rewrite or replicate), so this is an access, as a get is. (A gat that
                // slides a time to live gives each key one new expiry a second at most.)
                let _pin = self.pin();
                let mut fetch = super::flash::Fetch::default();
                // SAFETY: pinned while `r` is used (the callback included).
                match unsafe { self.lookup(h, key, &mut fetch) } {
                    Some((slot, v, r))
                        if v & IDENT_MASK == p.ident && self.vis(&r, now) == Vis::Live =>
                    {
                        self.mark_access(slot, v);
                        if let Some(f) = found.as_mut() {
                            f(self.view_leasable(key, &r, v));
                        }
                        return true;
                    }
                    // Changed meanwhile: look again.
                    _ => continue,
                }
            }
            let c = Commit {
                key,
                h,
                cond: Cond::Loc(p.ident),
                src: Src::Old,
                old_len: p.value_len,
                flags: None,
                exptime: Some(exptime),
                keep_cas: true,
                keep_access: true,
                access: true,
                meta: MetaW {
                    stale: None,
                    binary_key: None,
                    ..MetaW::default()
                },
            };
            let mut show = |_: Option<(Slot<'_>, u64)>, r: &Rec<'_>, v: u64| {
                if let Some(f) = found.as_mut() {
                    // Under the stripe lock of the item just written (see `lease`).
                    f(self.view_leasable(key, r, v));
                }
            };
            match self.commit(&c, now, Some(&mut show)) {
                Outcome::Stored(_) => return true,
                Outcome::Failed(Fail::Moved) => continue,
                _ => return false,
            }
        }
        false
    }

    /// Copy the flash item `key` (hash `h`, slot value `v`, a value of `len` bytes, its
    /// record just read into `fetch`) back to memory at the log's head, with its CAS,
    /// flags, expiry and access bits, as a touch that keeps the expiry would (memcached's
    /// recache; `flash.rs` decides when). The record is kept for this write's own lookup,
    /// which so reads nothing again. Nothing happens if the item changed meanwhile or
    /// there is no room.
    pub(super) fn recache(
        &self,
        key: &[u8],
        h: u64,
        v: u64,
        len: usize,
        fetch: super::flash::Fetch,
        now: Time,
    ) {
        self.keep_for_write(v, fetch);
        let c = Commit {
            key,
            h,
            cond: Cond::Loc(v & IDENT_MASK),
            src: Src::Old,
            old_len: len,
            flags: None,
            exptime: None,
            keep_cas: true,
            keep_access: true,
            access: false,
            meta: MetaW {
                stale: None,
                binary_key: None,
                ..MetaW::default()
            },
        };
        if let Outcome::Stored(_) = self.commit(&c, now, None) {
            self.note_recache();
        }
    }

    pub(super) fn delete_inner(&self, key: &[u8], h: u64, now: Time) -> bool {
        if key.len() > MAX_KEY {
            return false;
        }
        if self.peek(h, key, now).is_none() {
            self.tombstone_for_replicas(key, h);
            return false;
        }
        self.delete_at(key, h, now, None).unwrap_or(false)
    }

    /// Delete the live item of `key` (only if it still has identity `want`, when given);
    /// None if it moved.
    pub(super) fn delete_at(
        &self,
        key: &[u8],
        h: u64,
        now: Time,
        want: Option<u64>,
    ) -> Option<bool> {
        let need = HDR_MAX + key.len();
        let mut sh = self.open.shard();
        // Without room for a tombstone (no_evict and full) the delete still happens; only
        // a log reader would miss it.
        let open = self.room(&mut sh, need);
        let dest = open.as_ref().and_then(|o| self.dest(o));
        let _g = self.index.lock(h);
        let mut fetch = super::flash::Fetch::default();
        // SAFETY: we hold `h`'s stripe lock.
        let Some((slot, v, r)) = (unsafe { self.lookup(h, key, &mut fetch) }) else {
            return want.map_or(Some(false), |_| None);
        };
        let vis = self.vis(&r, now);
        if vis != Vis::Live {
            self.count_dead(vis);
            self.unlink(slot, &r, v);
            return Some(false);
        }
        if want.is_some_and(|w| w != v & IDENT_MASK) {
            return None;
        }
        // Not a new version: a tombstone removes versions below this one, and the
        // stripe's floor makes the next set of the key draw this value or a later one.
        let cas = self.index.floor(h).max(r.cas.saturating_add(1));
        self.index.raise_floor(h, cas);
        let (len, size) = (r.len, self.rec_size(&r));
        // The item leaves the index before its tombstone is published (as a write enters
        // it before its record is): a replica's full sync whose snapshot range holds the
        // tombstone must not find the item still indexed.
        slot.store(0);
        if let (Some(o), Some(d)) = (open, dest) {
            self.append_tombstone(&mut sh, o, &d, key, (cas, 0));
        }
        self.account_remove(v, len, size);
        Some(true)
    }

    /// Append a tombstone for `key` with version `cas` at `d`, the shard's open segment
    /// `o`, whose room for `HDR_MAX + key` bytes the caller reserved under the shard lock
    /// it holds (`sh`).
    pub(super) fn append_tombstone(
        &self,
        sh: &mut Option<Open>,
        o: Open,
        d: &Dest,
        key: &[u8],
        (cas, stamp): super::repl::Version,
    ) {
        let spec = Spec {
            kind: KIND_TOMBSTONE,
            key,
            parts: [&[], &[]],
            flags: 0,
            exptime: 0,
            stamp,
            cas,
            meta: 0,
            explicit_cas: None,
        };
        // SAFETY: per this function's contract `HDR_MAX + key` bytes at `d.off` are
        // reserved in the open segment only the caller appends to.
        let len = unsafe { format::write(d.ptr.as_ptr().add(d.off), d.room, &spec, d.natural()) };
        self.advance(sh, o, len);
        self.st().tombstones.fetch_add(1, Ordering::Relaxed);
    }

    /// incr/decr with the meta options (the classic arith is one without them).
    pub(super) fn arith_inner(
        &self,
        key: &[u8],
        h: u64,
        now: Time,
        req: &MetaArith,
    ) -> MetaArithResult {
        for _ in 0..RETRIES {
            let read = {
                let _pin = self.pin();
                let mut fetch = super::flash::Fetch::default();
                // SAFETY: pinned.
                match unsafe { self.lookup(h, key, &mut fetch) } {
                    Some((_, v, r)) if self.vis(&r, now) == Vis::Live => Some((
                        v & IDENT_MASK,
                        r.value.len(),
                        number::parse_item(key, r.value, r.flags),
                        number::chunked(key.len(), r.value.len(), r.flags),
                        self.rec_cas(&r),
                        r.exptime,
                    )),
                    _ => None,
                }
            };
            let Some((ident, old_len, n, chunked, cas, exptime_before)) = read else {
                // Count and unlink a dead item as a lookup would.
                if self.peek(h, key, now).is_some() {
                    continue;
                }
                let Some((exptime, initial)) = req.vivify else {
                    return MetaArithResult::NotFound;
                };
                let mut digits = [0u8; 20];
                let text = number::format(initial, &mut digits);
                if self.too_large(key.len(), text.len(), 0) {
                    return MetaArithResult::NoMemory;
                }
                let c = Commit {
                    key,
                    h,
                    cond: Cond::Absent,
                    src: Src::Bytes(text),
                    old_len: 0,
                    flags: Some(0),
                    exptime: Some(exptime),
                    keep_cas: false,
                    keep_access: false,
                    access: false,
                    meta: MetaW {
                        explicit_cas: req.new_cas,
                        binary_key: Some(req.binary_key),
                        ..MetaW::default()
                    },
                };
                match self.commit(&c, now, None) {
                    Outcome::Stored(cas) => {
                        return MetaArithResult::Value {
                            value: initial,
                            cas,
                            exptime_before: 0,
                            exptime,
                            created: true,
                        }
                    }
                    // Created meanwhile: change that one.
                    Outcome::Failed(_) => continue,
                    Outcome::NoMemory | Outcome::TooLarge => return MetaArithResult::NoMemory,
                }
            };
            // As memcached: an empty value, or one it stores in chunks, is non-numeric
            // before the CAS is compared; other values after.
            if old_len == 0 || chunked {
                return MetaArithResult::NonNumeric;
            }
            if req.compare_cas.is_some_and(|c| c != 0 && c != cas) {
                return MetaArithResult::Exists;
            }
            let Some(cur) = n else {
                return MetaArithResult::NonNumeric;
            };
            let new = if req.incr {
                cur.wrapping_add(req.delta)
            } else {
                cur.saturating_sub(req.delta)
            };
            let mut text = new.to_string().into_bytes();
            let in_place = text.len() <= old_len;
            if in_place {
                text.resize(old_len, b' ');
            }
            let c = Commit {
                key,
                h,
                cond: Cond::Loc(ident),
                src: Src::Bytes(&text),
                old_len,
                flags: None,
                exptime: req.touch,
                keep_cas: false,
                // In memcached an in-place update keeps the item (its fetched bit, stale
                // and win marks); a longer number is a new item, counted in total_items,
                // with none of them.
                keep_access: in_place,
                access: false,
                meta: MetaW {
                    explicit_cas: req.new_cas,
                    stale: if in_place { None } else { Some(false) },
                    binary_key: None,
                    ..MetaW::default()
                },
            };
            match self.commit(&c, now, None) {
                Outcome::Stored(cas) => {
                    return MetaArithResult::Value {
                        value: new,
                        cas,
                        exptime_before,
                        exptime: req.touch.unwrap_or(exptime_before),
                        created: false,
                    }
                }
                Outcome::Failed(Fail::Moved) => continue,
                Outcome::Failed(_) => return MetaArithResult::NotFound,
                Outcome::NoMemory | Outcome::TooLarge => return MetaArithResult::NoMemory,
            }
        }
        MetaArithResult::NotFound
    }
}
