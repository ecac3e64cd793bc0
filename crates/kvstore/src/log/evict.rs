//! Eviction: whole segments, oldest first, from the two FIFOs; items read since they were
//! written are copied forward (CLOCK second chance), the rest dropped.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::format::{self, Rec, Spec, HDR_MAX, KIND_ITEM, SEG_HDR};
use super::index::Slot;
use super::repl::{held_for_replica, EvictionNotes};
use super::segments::{Evicted, Open, Queue};
use super::sync::lock;
use super::{index, LogEngine, Vis};
use crate::Time;

#[derive(Default)]
pub(super) struct Evictor {
    /// Where second-chance items are copied.
    pub(super) dest: Option<Open>,
    /// A free segment kept for the next `dest`: when eviction runs the free list is empty,
    /// and the segment being cleaned is not free until it is done.
    pub(super) spare: Option<u32>,
}

impl LogEngine {
    /// Evict the oldest sealed segment. With `release`, or when over budget, its memory
    /// goes back to the OS, else to the free list.
    pub(super) fn evict_one(&self, release: bool) -> Evicted {
        // Popping the segment makes it ours: several threads may clean different
        // segments at once (they share only the evictor's copy destination).
        let small = self.small_percent();
        let Some(id) = lock(&self.fifo).pop(small) else {
            return Evicted::Nothing;
        };
        if !self.evicting.load(Ordering::Relaxed) {
            self.evicting.store(true, Ordering::Relaxed);
        }
        let Some(seg) = self.segs.get(id) else {
            return Evicted::Nothing;
        };
        let large = seg.mem.0.large.load(Ordering::Relaxed);
        let empty = seg.acct.0.live_items.load(Ordering::Acquire) == 0;
        if empty {
            // Nothing in it is referenced (everything was overwritten, deleted or
            // unlinked already): no need to look at its records.
        } else if large {
            if self.clean_large(id) {
                lock(&self.fifo).push(id, Queue::Main);
                return Evicted::Kept;
            }
        } else {
            self.clean(id);
        }
        self.st().segments_evicted.fetch_add(1, Ordering::Relaxed);
        // A replica that has not read it skips it, once what it held is logged anew (what
        // was copied forward is in the log already).
        if self.repl.active.load(Ordering::Relaxed) {
            self.relog_if_unread(id, |seq| held_for_replica(&lock(&self.repl.holds), seq));
        }
        self.retire(id);
        self.barrier();
        let over = self.allocated.load(Ordering::Relaxed) > self.budget();
        let release = release || over || self.gives_back(id);
        if !release {
            let mut ev = lock(&self.evictor);
            if ev.spare.is_none() {
                ev.spare = Some(id);
                return Evicted::Kept;
            }
        }
        let mut p = lock(&self.pool);
        if release {
            self.release(&mut p, id);
        } else {
            p.free.push(id);
        }
        Evicted::Freed
    }

    /// Tell the eviction observer, if any, of the live item in `slot` being evicted.
    #[inline]
    fn observe_eviction(&self, r: &Rec<'_>, v: u64, now: Time) {
        if let Some(f) = self.on_evict.get() {
            let item = crate::ScanItem {
                key: r.key,
                meta: self.describe(r, v, now),
            };
            f(item, now);
        }
    }

    /// Decide the fate of one live slot `v` of a segment being evicted: count it and
    /// return whether to give it a second chance (enough reads for its size, given the mean
    /// record `unit`: `keep_need`).
    pub(super) fn evict_item(
        &self,
        r: &Rec<'_>,
        v: u64,
        now: Time,
        notes: &mut EvictionNotes,
        unit: usize,
    ) -> bool {
        match self.vis(r, now) {
            Vis::Live => {
                if index::freq(v) >= self.keep_need(r.len, unit) {
                    return true;
                }
                self.observe_eviction(r, v, now);
                self.note_eviction_in(notes, r.key, (r.cas, r.stamp));
                self.st().evictions.fetch_add(1, Ordering::Relaxed);
                self.tally_evicted(self.rec_size(r));
                if !index::fetched(v) {
                    self.st().evicted_unfetched.fetch_add(1, Ordering::Relaxed);
                }
                if r.exptime != 0 {
                    self.st().evicted_nonzero.fetch_add(1, Ordering::Relaxed);
                }
            }
            Vis::Expired | Vis::Flushed => self.count_reclaimed(v, self.rec_size(r), false),
        }
        false
    }

    /// Process every record of sealed segment `id` (popped from the FIFO, so ours). The
    /// evictor lock is taken per second-chance copy, inside the record's stripe lock.
    pub(super) fn clean(&self, id: u32) {
        let now = self.clock.load(Ordering::Relaxed);
        // Evictions are noted for replicas once per segment, not under each stripe lock.
        let mut notes = EvictionNotes::default();
        let unit = self.mean_record();
        self.for_live(id, |slot, r, v| {
            if self.evict_item(r, v, now, &mut notes, unit) {
                let copied = self.copy_forward(&mut lock(&self.evictor), r, v, slot);
                if copied.is_some() {
                    self.account_remove(v, r.len, self.rec_size(r));
                    self.st().copied_forward.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                self.observe_eviction(r, v, now);
                self.note_eviction_in(&mut notes, r.key, (r.cas, r.stamp));
                self.st().evictions.fetch_add(1, Ordering::Relaxed);
                self.tally_evicted(self.rec_size(r));
            }
            self.note_removed(r, v);
            slot.store(0);
            self.account_remove(v, r.len, self.rec_size(r));
            true
        });
        self.note_evictions(notes);
    }

    /// Copy a second-chance item into the evictor's segment and point its `slot` at the
    /// copy (access counter decremented); None when there is no room without evicting.
    pub(super) fn copy_forward(
        &self,
        ev: &mut Evictor,
        r: &Rec<'_>,
        v: u64,
        slot: Slot<'_>,
    ) -> Option<()> {
        let need = HDR_MAX + r.key.len() + r.value.len();
        let fits = ev.dest.is_some_and(|o| o.used + need <= o.cap);
        if !fits {
            if let Some(o) = ev.dest.take() {
                self.seal(o, Queue::Main);
            }
            let id = match ev.spare.take() {
                Some(id) => id,
                None => self.take_segment_no_evict()?,
            };
            ev.dest = Some(self.open_segment(id)?);
        }
        let spec = Spec {
            kind: KIND_ITEM,
            key: r.key,
            parts: [r.value, &[]],
            flags: r.flags,
            exptime: r.exptime,
            cas: r.cas,
            // A replica keeps the master's stamp: its copies must not outrank a later
            // rewrite of the same item on the master.
            stamp: if self.repl.replica.load(Ordering::Relaxed) {
                r.stamp
            } else {
                self.rewrite_stamp(r.stamp)
            },
            meta: r.meta,
            explicit_cas: r.explicit_cas,
        };
        self.append_copy(&mut ev.dest, &spec, need, |seg, off| {
            let new_v = index::pack(
                index::slot_tag(v),
                seg,
                off,
                index::freq(v) - 1,
                index::fetched(v),
            ) | (v & index::WIN);
            self.relocate(slot, new_v);
        })
    }

    /// A large segment reached the FIFO head: true if its item gets a second chance (it
    /// stays where it is and goes to the back of the FIFO).
    pub(super) fn clean_large(&self, id: u32) -> bool {
        let now = self.clock.load(Ordering::Relaxed);
        let Some(seg) = self.segs.get(id) else {
            return false;
        };
        let Some(ptr) = NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire)) else {
            return false;
        };
        let used = seg.mem.0.used.load(Ordering::Acquire);
        // SAFETY: sealed large segment popped from the FIFO under the evictor lock: ours.
        let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
        // SAFETY: as above.
        let Some(r) = (unsafe { format::read(ptr.as_ptr(), used, SEG_HDR, base) }) else {
            return false;
        };
        let h = self.hash(r.key);
        let _g = self.index.lock(h);
        let Some((slot, v)) = self.index.find(h, |v| {
            index::slot_seg(v) == id && index::slot_off(v) == SEG_HDR
        }) else {
            return false;
        };
        let mut notes = EvictionNotes::default();
        let again = self.evict_item(&r, v, now, &mut notes, self.mean_record());
        self.note_evictions(notes);
        if again {
            let f = index::freq(v) - 1;
            let nv = index::pack(index::slot_tag(v), id, SEG_HDR as u32, f, index::fetched(v))
                | (v & index::WIN);
            self.relocate(slot, nv);
            self.st().copied_forward.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.note_removed(&r, v);
        slot.store(0);
        self.account_remove(v, r.len, self.rec_size(&r));
        false
    }

    /// Point `slot` at the second-chance copy `new_v` of its item (under the key's stripe
    /// lock). `new_v` was computed from a value loaded earlier; readers may since have set
    /// the fetched or win bit by compare-exchange, and those must survive (a lost win mark
    /// would let a second reader win the same token).
    pub(super) fn relocate(&self, slot: Slot<'_>, new_v: u64) {
        let keep = index::FETCHED | index::WIN;
        slot.fetch_update(|x| new_v | (x & keep));
    }
}
