//! Segments' lives: which FIFO a sealed segment joins (`Queue`; the FIFOs are the eviction
//! policy's, `evict.rs`), and taking, opening, sealing, releasing and retiring a segment.
//! Their headers are [`super::seg::Seg`]s; the memory they take is counted, and free ones
//! pooled, by [`super::arena::Arena`].

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::arena::Pool;
use super::format::{self, Spec, SEG_HDR};
use super::seg::Seg;
use super::sync::lock;
use super::{mem, LogEngine};
use crate::Time;

use super::repl::{held_for_replica, Holds};

/// Where a record goes: an open segment at `off`.
pub(super) struct Dest {
    pub(super) id: u32,
    pub(super) ptr: NonNull<u8>,
    pub(super) off: usize,
    pub(super) base: u64,
    /// Bytes writable from `off`.
    pub(super) room: usize,
}

impl Dest {
    /// The version a record written here has unless it stores another (see
    /// `format::natural_cas`).
    pub(super) fn natural(&self) -> u64 {
        format::natural_cas(self.base, self.off)
    }
}

/// What one eviction did (`evict_one`): found nothing to evict, gave the oldest segment a
/// second chance whole, or freed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Evicted {
    Nothing,
    Kept,
    Freed,
}

/// A segment being appended to, owned by a shard or by the evictor.
#[derive(Debug, Clone, Copy)]
pub(super) struct Open {
    pub(super) id: u32,
    pub(super) cap: usize,
    pub(super) used: usize,
    pub(super) base: u64,
    /// The engine's clock when it was opened (a TTL class's segment is sealed once its
    /// first items have all expired, see `seal_aged`).
    pub(super) opened: Time,
}

/// Which FIFO a sealed segment joins.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Queue {
    /// Segments of new writes: a probation queue (S3-FIFO's small queue).
    Small,
    /// Segments of second-chance copies: items read while on probation or since.
    Main,
}

impl LogEngine {
    /// A segment no reader can reach any more is about to be reused or unmapped: end its
    /// lease block ([`super::lease::detach`]). True if holders still read its memory: the
    /// mapping is theirs now, and the segment is left without one.
    pub(super) fn detach_leases(&self, seg: &Seg) -> bool {
        if !super::lease::detach(seg.lease_cell()) {
            return false;
        }
        seg.take_mapping();
        true
    }

    pub(super) fn new_segment(
        &self,
        p: &mut Pool,
        len: usize,
        large: bool,
    ) -> Option<(u32, NonNull<u8>)> {
        let ptr = mem::map(len)?;
        match self.install_segment(p, ptr, len, large, false) {
            Some(id) => Some((id, ptr)),
            None => {
                // SAFETY: the mapping is ours, fresh from `mem::map(len)`, and unused.
                unsafe { mem::unmap(ptr, len) };
                None
            }
        }
    }

    /// Give the mapping `ptr` (`cap` bytes, from `mem::map` or, with `file`, from
    /// `mem::map_file`) a segment id and count it as allocated. None when no id is left
    /// (the caller keeps the mapping).
    pub(super) fn install_segment(
        &self,
        p: &mut Pool,
        ptr: NonNull<u8>,
        cap: usize,
        large: bool,
        file: bool,
    ) -> Option<u32> {
        let id = p.draw_id(self.index.max_segments())?;
        let Some(seg) = self.segs.get_or_create(id) else {
            p.return_id(id);
            return None;
        };
        seg.install(ptr, cap, large, file);
        self.arena.mapped(cap);
        Some(id)
    }

    /// Give a segment's memory back to the OS. No slot may point into it and no reader
    /// may hold a pin from before its last slot was unlinked (or it was never visible).
    pub(super) fn release(&self, p: &mut Pool, id: u32) {
        if let Some(seg) = self.segs.get(id) {
            // Leased: the mapping goes with its holders (and stays counted until then).
            self.detach_leases(seg);
            if let Some((ptr, cap)) = seg.take_mapping() {
                // SAFETY: the mapping came from `mem::map(cap)` or `mem::map_file(.., cap)`;
                // per this function's contract nothing can reach it any more.
                unsafe { mem::unmap(ptr, cap) };
                self.arena.unmapped(cap);
            }
            seg.reset_accounting();
        }
        p.return_id(id);
    }

    /// A free regular segment, evicting if needed (and allowed); with no_evict,
    /// compacting if `compact`.
    pub(super) fn take_segment(&self, compact: bool) -> Option<u32> {
        if self.config.no_evict {
            // Keep segments back for compaction and rewrites while memory is free.
            self.keep_reserve(&mut lock(&self.compactor));
        } else {
            // Give the evictor a segment to copy second-chance items into before memory
            // runs out (when it runs out, nothing is free until an eviction finishes).
            self.eviction
                .evictor()
                .fill_spare(|| self.take_segment_no_evict());
        }
        let attempts = 4 * (self.arena.allocated() / self.seg_size) + 16;
        for _ in 0..attempts {
            {
                let mut p = self.arena.pool();
                if let Some(id) = p.pop_free() {
                    return Some(id);
                }
                if self.arena.allocated() + self.seg_size <= self.write_budget() {
                    if let Some((id, _)) = self.new_segment(&mut p, self.seg_size, false) {
                        return Some(id);
                    }
                }
            }
            if self.config.no_evict {
                if self.reclaim_dead()
                    || self.unstick() && self.reclaim_dead()
                    || compact && self.compact_for_segment()
                {
                    continue;
                }
                return None;
            }
            if self.evict_one(false) == Evicted::Nothing && !self.unstick() {
                return None;
            }
        }
        None
    }

    /// Free one sealed segment that holds no live item (everything in it was deleted,
    /// overwritten or expired and unlinked). This is not eviction, so it also runs with
    /// `no_evict` (memcached's `-M`), where deleting items must make room again.
    pub(super) fn reclaim_dead(&self) -> bool {
        let id = {
            let dead = self
                .eviction
                .take_first(|id| self.segs.get(id).is_some_and(|s| s.live_items() == 0));
            match dead {
                Some(id) => id,
                None => return false,
            }
        };
        let give_back = self.gives_back(id);
        self.retire(id);
        // Readers that found a slot into it before it emptied must be done before reuse.
        self.barrier();
        let mut p = self.arena.pool();
        if give_back || self.arena.allocated() > self.budget() {
            self.release(&mut p, id);
        } else {
            p.push_free(id);
        }
        true
    }

    /// Nothing is sealed, so nothing can be evicted: all memory sits in open segments
    /// (small limits, or a shrunk one). Hand the evictor's spare back, and seal open
    /// segments of the evictor and of shards whose lock is free (try_lock: the caller
    /// holds its own shard lock, and shards never wait for each other). True if anything
    /// became free or evictable.
    pub(super) fn unstick(&self) -> bool {
        let mut changed = false;
        {
            let mut ev = self.eviction.evictor();
            if let Some(id) = ev.take_spare() {
                self.arena.pool().push_free(id);
                changed = true;
            }
            if let Some(o) = ev.take_dest() {
                self.seal(o, Queue::Main);
                changed = true;
            }
        }
        for shard in self.open.all() {
            if let Ok(mut sh) = shard.try_lock() {
                if let Some(o) = sh.take() {
                    self.seal(o, Queue::Small);
                    changed = true;
                }
            }
        }
        changed
    }

    /// Take a free segment without evicting (for the evictor's copies).
    pub(super) fn take_segment_no_evict(&self) -> Option<u32> {
        let mut p = self.arena.pool();
        if let Some(id) = p.pop_free() {
            return Some(id);
        }
        if self.arena.allocated() + self.seg_size <= self.budget() {
            return self
                .new_segment(&mut p, self.seg_size, false)
                .map(|(id, _)| id);
        }
        None
    }

    /// Prepare a free segment for appending: its CAS base names a block of uniques, one
    /// per place in it (`format::natural_cas`).
    pub(super) fn open_segment(&self, id: u32) -> Option<Open> {
        self.open_segment_at(id, None)
    }

    /// Prepare a free segment for appending, with `base` as its CAS base instead of a fresh
    /// block. Compaction opens its spare with its victim's base: the copies it writes keep
    /// their versions, which then differ from their places' by less than a segment (a delta
    /// of at most 3 bytes), and no version is drawn from such a segment's places (only
    /// copies and rewrites that keep their CAS go there).
    pub(super) fn open_segment_at(&self, id: u32, base: Option<u64>) -> Option<Open> {
        let seg = self.segs.get(id)?;
        // A leased mapping stays with its holders; the segment gets a fresh one.
        let leased = self.detach_leases(seg);
        if leased || seg.is_file() || seg.cap() != self.seg_size {
            self.remap(seg)?;
        }
        let (ptr, cap) = seg.mapping()?;
        // A fresh mapping (`used` is 0 only until its first opening) gets its pages with
        // one system call rather than a fault each, zeroed by the kernel; a reused
        // segment's are resident and hold old records, which stay: only the first state
        // byte is cleared, and each record clears the one after it (`format::write`), so
        // the written part still ends at the first unpublished state byte. (Clearing the
        // whole segment cost as much as writing it: 16% of the CPU of gets and sets of
        // 256 KiB values.)
        if seg.is_fresh() {
            mem::populate(ptr, cap);
        } else if cap > SEG_HDR {
            // SAFETY: a free segment is unreachable (no slot points into it, readers from
            // before it was freed are gone, see `release`/`evict_one`) and owned by us
            // now, so we may write any of its `cap` bytes.
            unsafe { ptr.as_ptr().add(SEG_HDR).write(0) };
        }
        seg.reset_accounting();
        // The number is drawn and published under the order lock, so that a log reader
        // that holds it sees every number below the next one either live or retired.
        let mut order = self.order.lock();
        // Records start at `SEG_HDR`: the block's first unique is the first record's.
        let base = base.unwrap_or_else(|| {
            self.cas
                .reserve_block(cap.saturating_sub(SEG_HDR) as u64)
                .wrapping_sub(SEG_HDR as u64)
        });
        let seq = order.number(id, true);
        // SAFETY: as above.
        unsafe { format::write_seg_header(ptr.as_ptr(), format::SEG_KIND_REGULAR, seq, base) };
        seg.open(seq, SEG_HDR);
        Some(Open {
            id,
            cap,
            used: SEG_HDR,
            base,
            opened: self.clock.load(Ordering::Relaxed),
        })
    }

    /// Whether a freed segment's memory goes back to the system rather than to the free
    /// pool: a large one's, and a mapping of a warm restart's snapshot file (which would
    /// keep the file's pages, and need `remap` before reuse anyway).
    pub(super) fn gives_back(&self, id: u32) -> bool {
        self.segs
            .get(id)
            .is_some_and(|s| s.is_large() || s.is_file())
    }

    /// Replace a free segment's mapping with a fresh anonymous one of the regular size:
    /// a segment image a warm restart loaded is a mapping of the snapshot file (whose
    /// pages would each be copied when written) or a copy of the image's size.
    fn remap(&self, seg: &Seg) -> Option<()> {
        let fresh = mem::map(self.seg_size)?;
        let old = seg.replace_mapping(fresh, self.seg_size);
        self.arena.mapped(self.seg_size);
        if let Some((old, cap)) = old {
            // SAFETY: the segment is free (unreachable, see `open_segment`), so
            // nothing refers to its old mapping, which came from `mem::map_file(.., cap)`
            // or `mem::map(cap)`.
            unsafe { mem::unmap(old, cap) };
            self.arena.unmapped(cap);
        }
        Some(())
    }

    pub(super) fn seal(&self, open: Open, queue: Queue) {
        if let Some(seg) = self.segs.get(open.id) {
            seg.seal(open.used);
        }
        self.order.sealed(open.id);
        self.eviction.push(open.id, queue);
    }

    /// `len` bytes were appended at the end of open segment `o`, which `slot` holds: record
    /// the new length there and publish it to log readers.
    pub(super) fn advance(&self, slot: &mut Option<Open>, o: Open, len: usize) {
        let used = o.used + len;
        *slot = Some(Open { used, ..o });
        if let Some(seg) = self.segs.get(o.id) {
            seg.note_written(o.used, self.clock.load(Ordering::Relaxed));
            seg.publish_used(used);
        }
    }

    /// Append `spec`, a copy of a live item, to the open segment `slot` holds (the evictor's
    /// or the compactor's, under its lock), if `need` bytes (at least the record's length)
    /// are free there; count it live. `install` is given its segment and offset once it is
    /// written and before it is published: the index must point at a copy before a log
    /// reader can see it (a full sync's snapshot finds a copy published before its starting
    /// cursor through the index only, and may have passed the old place already).
    pub(super) fn append_copy(
        &self,
        slot: &mut Option<Open>,
        spec: &Spec<'_>,
        need: usize,
        install: impl FnOnce(u32, u32),
    ) -> Option<()> {
        let o = (*slot)?;
        let d = self.dest(&o)?;
        if need > d.room {
            return None;
        }
        // SAFETY: the slot's open segment is only appended to by its owner, whose lock the
        // caller holds; `need` bytes, at least the record's length (callers' contract), are
        // free from `d.off`. The source record lives in a segment being evicted or
        // compacted, not in this one.
        let len = unsafe { format::write(d.ptr.as_ptr().add(d.off), d.room, spec, d.natural()) };
        install(o.id, d.off as u32);
        self.advance(slot, o, len);
        self.account_add(o.id, len, self.spec_size(spec), spec.exptime);
        Some(())
    }

    /// Make sure `slot` holds an open segment with `need` free bytes.
    pub(super) fn room(&self, slot: &mut Option<Open>, need: usize) -> Option<Open> {
        self.room_with(slot, need, true)
    }

    /// [`LogEngine::room`]; with `compact` false, no_evict does not compact for a whole
    /// segment (a rewrite that needs only its own bytes goes to the compactor instead).
    pub(super) fn room_with(
        &self,
        slot: &mut Option<Open>,
        need: usize,
        compact: bool,
    ) -> Option<Open> {
        if let Some(o) = *slot {
            if o.used + need <= o.cap {
                return Some(o);
            }
            *slot = None;
            self.seal(o, Queue::Small);
        }
        let id = self.take_segment(compact)?;
        let o = self.open_segment(id)?;
        *slot = Some(o);
        Some(o)
    }

    pub(super) fn dest(&self, o: &Open) -> Option<Dest> {
        let ptr = self.segs.get(o.id)?.ptr()?;
        Some(Dest {
            id: o.id,
            ptr,
            off: o.used,
            base: o.base,
            room: o.cap.saturating_sub(o.used),
        })
    }

    /// Evict and release until the segment memory fits the budget.
    pub(super) fn shrink(&self) {
        if self.arena.allocated() > self.budget() {
            if let Some(id) = lock(&self.compactor).spare.take() {
                self.release(&mut self.arena.pool(), id);
            }
        }
        if self.arena.allocated() > self.budget() {
            let mut ev = self.eviction.evictor();
            if let Some(id) = ev.take_spare() {
                self.release(&mut self.arena.pool(), id);
            }
        }
        loop {
            if self.arena.allocated() <= self.budget() {
                return;
            }
            {
                let mut p = self.arena.pool();
                if let Some(id) = p.pop_free() {
                    self.release(&mut p, id);
                    continue;
                }
            }
            if self.evict_one(true) == Evicted::Nothing && !self.unstick() {
                return;
            }
        }
    }

    /// Free sealed segments that hold no live item any more, except those a replica of
    /// `holds` has not read (see [`LogEngine::retire_holds`]).
    /// One a replica of `wanted` (every replica's position, kept or not) still needs is
    /// logged anew first, so that the replica can skip it (`relog_for_skip`).
    pub(super) fn free_dead_segments(&self, holds: &Holds, wanted: &Holds) -> usize {
        let dead = self.take_sealed(|s| s.live_items() == 0 && !held_for_replica(holds, s.seq()));
        if dead.is_empty() {
            return 0;
        }
        for &id in &dead {
            self.relog_if_unread(id, |seq| held_for_replica(wanted, seq));
            self.retire(id);
        }
        self.free_retired(&dead);
        dead.len()
    }

    /// Take out of the FIFOs every sealed segment `pick` chooses (they are then ours, as
    /// a segment popped for eviction is).
    fn take_sealed(&self, pick: impl Fn(&Seg) -> bool) -> Vec<u32> {
        self.eviction
            .take_all(|id| self.segs.get(id).is_some_and(&pick))
    }

    /// Segments of ours that no slot points into and that were retired: wait out the
    /// readers that may still hold one, then keep them for reuse, or give their memory
    /// back (see `gives_back`, or while over the budget).
    fn free_retired(&self, ids: &[u32]) {
        self.barrier();
        let mut p = self.arena.pool();
        for &id in ids {
            if self.gives_back(id) || self.arena.allocated() > self.budget() {
                self.release(&mut p, id);
            } else {
                p.push_free(id);
            }
        }
    }

    /// Seal the open segments of TTL classes whose first items have all expired by `now`
    /// (opened at least the class's longest time to live ago), so that a class written
    /// to slowly does not keep expired items in a segment that never fills; sealed, the
    /// segment goes by `expire_segments` once its last item expires. (Sealing sooner, at
    /// the class's shortest time to live, left short-lived classes' segments mostly
    /// unfilled, and that cost more than the expired items it freed: `bench/expiry.sh`.)
    /// Shard locks are only tried (a writer holding one is busy with it and will come
    /// back).
    pub(super) fn seal_aged(&self, now: Time) {
        for (slot, longest) in self.open.ttl().slots() {
            let Ok(mut sh) = slot.try_lock() else {
                continue;
            };
            if let Some(o) = *sh {
                if o.used > SEG_HDR && now >= o.opened.saturating_add(longest) {
                    *sh = None;
                    self.seal(o, Queue::Small);
                }
            }
        }
    }

    /// Free, ahead of eviction, every sealed segment whose items have all expired (the
    /// clock passed the latest expiry it was given): unlink what the index still points at
    /// in it, then free it. Returns the segments freed. This is where TTL classes pay:
    /// their segments' items expire together.
    ///
    /// Segments a replica of `holds` has not read stay (see [`LogEngine::retire_holds`]).
    /// One a replica of `wanted` still needs is logged anew first (`relog_for_skip`).
    pub(super) fn expire_segments(&self, holds: &Holds, wanted: &Holds) -> usize {
        let now = self.clock.load(Ordering::Relaxed);
        let expired =
            self.take_sealed(|s| s.expired_whole(now) && !held_for_replica(holds, s.seq()));
        if expired.is_empty() {
            return 0;
        }
        for &id in &expired {
            let Some(seg) = self.segs.get(id) else {
                continue;
            };
            self.relog_if_unread(id, |seq| held_for_replica(wanted, seq));
            // Every item in it is dead: cleaning unlinks the ones still indexed and
            // copies none forward.
            if seg.live_items() != 0 {
                if seg.is_large() {
                    self.clean_large(id);
                } else {
                    self.clean(id);
                }
            }
            self.retire(id);
        }
        self.st()
            .segments_expired
            .fetch_add(expired.len() as u64, Ordering::Relaxed);
        self.free_retired(&expired);
        expired.len()
    }

    /// Segment `id` (ours, out of the FIFO, about to be freed by the maintenance pass or by
    /// eviction): if a replica has not read all of it (`unread` says so of its sequence
    /// number), log anew what that replica would miss by skipping it.
    pub(super) fn relog_if_unread(&self, id: u32, unread: impl FnOnce(u64) -> bool) {
        let Some(seq) = self.segs.get(id).map(Seg::seq) else {
            return;
        };
        if seq != 0 && unread(seq) {
            self.relog_for_skip(id, seq);
        }
    }

    /// The positions of the replicas the maintenance pass keeps segments for (see
    /// [`LogEngine::repl_hold`]): none when keeping every dead or expired segment one of
    /// them has not read would take more than the backlog (`repl_backlog`; the
    /// pass then frees them, and the replica that needed them will need a full sync;
    /// counted).
    pub(super) fn retire_holds(&self, now: Time) -> Holds {
        let holds = self.repl.holds();
        if holds.is_empty() {
            self.repl.note_held(Some(0));
            return holds;
        }
        let (mut held, mut bytes) = (0u64, 0usize);
        self.eviction.for_each_sealed(|id| {
            let Some(s) = self.segs.get(id) else { return };
            let dead = s.live_items() == 0;
            if (dead || s.expired_whole(now)) && held_for_replica(&holds, s.seq()) {
                held += 1;
                bytes += s.cap();
            }
        });
        if bytes > self.repl_backlog() {
            self.repl.note_held(None);
            return Holds::new();
        }
        self.repl.note_held(Some(held));
        holds
    }

    /// A segment leaves the set a log reader may ship (before the barrier that precedes
    /// its reuse); its bytes count towards the log offset already shipped or lost.
    pub(super) fn retire(&self, id: u32) {
        if let Some(seg) = self.segs.get(id) {
            let mut order = self.order.lock();
            let seq = seg.take_seq();
            order.unlist(seq, id);
            drop(order);
            if seq != 0 {
                self.order.retired(seg.used());
            }
        }
    }

    pub(super) fn seg_ids(&self) -> u32 {
        self.arena.pool().ids_used()
    }
}
