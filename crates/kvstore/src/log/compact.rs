//! Compaction, for `no_evict` (memcached's `-M`) only: where eviction would drop items,
//! compaction keeps every live one. It moves the live items of the sealed segment with the
//! fewest live bytes into a segment of its own (the compactor's) and frees the victim, so
//! the dead bytes that overwrites, deletes, touches and expiry leave behind are used again.
//! memcached's slabs reuse a freed chunk at once; without this, a full `-M` log refused
//! writes while most of it was dead, and a touch (a rewrite at the log head) missed.
//!
//! The compactor keeps one free segment back (its *spare*) while memory is free, so that a
//! compaction always has somewhere to copy to. A copy into a fresh segment opened with the
//! victim's CAS base is byte for byte the same length (same CAS, stamp, flags, expiry and
//! marks: a copy is the same item, so it keeps the rewrite stamp, as a replica's copies do),
//! so a victim always fits in the spare; the victim then becomes the spare.
//!
//! Rewrites that keep the item's bytes (touch, gat, `mg ... T`) that find no room in their
//! shard write into the compactor's segment, refilling it by compaction when it is full, so
//! they succeed as long as any byte of the log is dead or free. Writes of new bytes take
//! whole segments; compaction gives them one when two victims fit in one segment.
//!
//! Lock order: shard → compactor → bucket stripe → evictor → pool / FIFO.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::format::{self, Rec, Spec, KIND_ITEM, SEG_HDR};
use super::index::Slot;
use super::segments::{Open, Queue};
use super::sync::lock;
use super::write::{Commit, Outcome};
use super::{index, LogEngine, Vis};
use crate::Time;

use super::write::ShowFn;

#[derive(Default)]
pub(super) struct Compactor {
    /// Where compaction copies and kept-bytes rewrites are appended.
    pub(super) dest: Option<Open>,
    /// A free segment kept back for the next compaction.
    pub(super) spare: Option<u32>,
}

/// With no_evict, this part of the segment budget (at least) is kept for rewrites: a touch
/// makes an item a few bytes longer (it stores its version, a rewrite stamp, maybe an
/// expiry), and a full log must still take the touches of all its items.
const REWRITE_RESERVE_DIVISOR: usize = 32;
/// ... and at least this much per item, up to an eighth of the budget: a rewritten record
/// stores its version (a delta of 4-5 bytes), an extension byte and a stamp (`format.rs`),
/// 8-12 bytes more than a fresh one, and touching every item of a full log must fit.
const REWRITE_BYTES_PER_ITEM: usize = 12;

impl LogEngine {
    /// Segment memory that writes of new bytes may use: all of it, except with no_evict,
    /// where [`REWRITE_RESERVE_DIVISOR`] keeps a part for rewrites.
    pub(super) fn write_budget(&self) -> usize {
        let b = self.budget();
        if self.config.no_evict {
            let per_item = self
                .stats
                .live_items()
                .saturating_mul(REWRITE_BYTES_PER_ITEM);
            b - (b / REWRITE_RESERVE_DIVISOR).max(per_item.min(b / 8))
        } else {
            b
        }
    }

    /// Keep a spare back, and an open segment for rewrites, while memory is free (no_evict
    /// only).
    pub(super) fn keep_reserve(&self, c: &mut Compactor) {
        if c.spare.is_none() {
            c.spare = self.take_segment_no_evict();
        }
        if c.dest.is_none() {
            c.dest = self.open_free_segment();
        }
    }

    /// A free segment opened for appending, without evicting or compacting.
    fn open_free_segment(&self) -> Option<Open> {
        self.take_segment_no_evict()
            .and_then(|id| self.open_segment(id))
    }

    /// Make room for `need` bytes in the compactor's segment: compact a segment with an
    /// eighth or more dead, else take memory kept for rewrites, else compact any segment
    /// whose dead bytes make room for the record.
    pub(super) fn compactor_room(&self, c: &mut Compactor, need: usize) -> Option<Open> {
        let payload = self.seg_size - SEG_HDR;
        for _ in 0..3 {
            if let Some(o) = c.dest.filter(|o| o.used + need <= o.cap) {
                return Some(o);
            }
            let worth = |live: usize| live + need.max(payload / 8) <= payload;
            if let Some(victim) = self.take_victim(worth) {
                if !self.compact_into_spare(c, victim) {
                    return None;
                }
                continue;
            }
            if let Some(fresh) = self.open_free_segment() {
                if let Some(o) = c.dest.replace(fresh) {
                    self.seal(o, Queue::Main);
                }
                continue;
            }
            let victim = self.take_victim(|live| live + need <= payload)?;
            if !self.compact_into_spare(c, victim) {
                return None;
            }
        }
        None
    }

    /// Free a whole segment by compaction for writes of new bytes, if the log's dead bytes
    /// net one. Victims are the sealed segments with the fewest live bytes, at least an
    /// eighth dead (the reserve is not spent on moving full segments around). Their live
    /// items go into the compactor's segment, as many as fit; a victim moved whole is
    /// freed. When that segment has no room left, it is sealed and the emptiest victim
    /// moves whole into the spare, opened with the victim's CAS base (its copies' versions
    /// then differ from their places' by less than a segment), and becomes the spare.
    /// A copy is a few bytes longer than its record (it stores its version), so two
    /// half-live victims do not fit in one segment: a victim that does not fit whole is
    /// moved in part, and is the emptiest next time. True if a segment was freed or items
    /// moved (the caller tries again, a bounded number of times).
    pub(super) fn compact_for_segment(&self) -> bool {
        let mut c = lock(&self.compactor);
        let payload = self.seg_size - SEG_HDR;
        let worth = |live: usize| live + payload / 8 <= payload;
        let room = c.dest.map_or(0, |o| o.cap - o.used);
        if room < payload / 8 {
            // Too little room to be worth a victim's copies: a fresh destination, from
            // the spare and the emptiest victim.
            let Some(first) = self.take_victim(worth) else {
                return false;
            };
            let fits = self
                .cas_base(first)
                .is_some_and(|base| self.copied_len(first, base, SEG_HDR) <= payload);
            if !fits {
                self.eviction.push(first, Queue::Main);
                return false;
            }
            return self.compact_into_spare(&mut c, first);
        }
        let Some(victim) = self.take_victim(worth) else {
            return false;
        };
        let before = self.live_bytes(victim).unwrap_or(0);
        if self.move_live(&mut c, victim) {
            self.free_victim(&mut c, victim);
            return true;
        }
        // Moved in part, or not at all (it went back to the FIFO). The compactor's
        // segment stays: sealing it would have `keep_reserve` open a fresh one from the
        // memory kept for rewrites, which compaction would then hand to new writes (a
        // refused store would make room for the next: memcached's t/dash-M.t).
        let after = self.live_bytes(victim).unwrap_or(0);
        after < before
    }

    /// Seal the compactor's segment, open the spare with `victim`'s CAS base, move the
    /// victim's live items into it and keep the victim as the new spare. True if any item
    /// moved.
    fn compact_into_spare(&self, c: &mut Compactor, victim: u32) -> bool {
        let spare = c.spare.take().or_else(|| self.take_segment_no_evict());
        let base = self.cas_base(victim);
        let opened = spare.and_then(|s| self.open_segment_at(s, base));
        let Some(fresh) = opened else {
            if let Some(s) = spare {
                c.spare = Some(s);
            }
            self.eviction.push(victim, Queue::Main);
            return false;
        };
        if let Some(o) = c.dest.replace(fresh) {
            self.seal(o, Queue::Main);
        }
        if !self.move_live(c, victim) {
            return true;
        }
        self.free_victim(c, victim);
        true
    }

    fn cas_base(&self, id: u32) -> Option<u64> {
        let seg = self.segs.get(id)?;
        let ptr = seg.ptr()?;
        // SAFETY: a sealed segment we took out of the FIFO: ours, mapped, not reused.
        Some(unsafe { format::seg_cas_base(ptr.as_ptr()) })
    }

    fn live_bytes(&self, id: u32) -> Option<usize> {
        let s = self.segs.get(id)?;
        Some(s.live_bytes() as usize)
    }

    /// Take the regular sealed segment with the fewest live bytes among those
    /// `ok(live_bytes)` accepts out of the FIFO (it is then ours, as in eviction).
    fn take_victim(&self, ok: impl Fn(usize) -> bool) -> Option<u32> {
        self.eviction.take_least(|id| {
            let s = self.segs.get(id)?;
            let live = s.live_bytes() as usize;
            (!s.is_large() && ok(live)).then_some(live)
        })
    }

    /// An upper bound of the bytes `victim`'s (ours) live items take when copied into a
    /// segment with CAS base `base` from offset `at` (items only die meanwhile, never come
    /// back; a copy that lands earlier than counted here, after one died, may take one
    /// more byte for its version's delta, which the byte counted per copy covers).
    fn copied_len(&self, victim: u32, base: u64, at: usize) -> usize {
        let mut total = 0;
        self.for_live(victim, |_, r, _| {
            let spec = Spec::copy_of(r);
            total += format::encoded_len(&spec, format::natural_cas(base, at + total)) + 1;
            true
        });
        total
    }

    /// Call `f` with each record of sealed segment `id` (ours: taken out of the FIFO, by
    /// eviction or compaction) that the index points at (slot,
    /// record, slot value), under the record's stripe lock, until it returns false; false
    /// then.
    pub(super) fn for_live(
        &self,
        id: u32,
        mut f: impl FnMut(Slot<'_>, &Rec<'_>, u64) -> bool,
    ) -> bool {
        self.for_live_at(id, |slot, r, v, _, _| f(slot, r, v))
    }

    /// [`LogEngine::for_live`], also telling `f` the record's offset in the segment and
    /// its key's hash.
    pub(super) fn for_live_at(
        &self,
        id: u32,
        mut f: impl FnMut(Slot<'_>, &Rec<'_>, u64, usize, u64) -> bool,
    ) -> bool {
        let Some(seg) = self.segs.get(id) else {
            return true;
        };
        let Some(ptr) = seg.ptr() else {
            return true;
        };
        let used = seg.used();
        // SAFETY: a sealed segment we took out of the FIFO (callers' contract): ours,
        // mapped, not reused; `used` is its published length.
        unsafe {
            for_records(ptr, used, |here, r| {
                if r.kind != KIND_ITEM {
                    return true;
                }
                let h = self.hash(r.key);
                let _g = self.index.lock(h);
                let found = self.index.find(h, |v| {
                    index::slot_seg(v) == id && index::slot_off(v) == here
                });
                found.is_none_or(|(slot, v)| f(slot, r, v, here, h))
            })
        }
    }

    /// Copy every live item of `victim` (ours, out of the FIFO) into the compactor's
    /// segment, unlinking expired and flushed ones. False if a copy did not fit (the
    /// victim goes back to the FIFO, what was moved stays moved).
    fn move_live(&self, c: &mut Compactor, victim: u32) -> bool {
        let now = self.clock.load(Ordering::Relaxed);
        let moved = self.for_live(victim, |slot, r, v| {
            if self.vis(r, now) != Vis::Live {
                self.unlink(slot, r, v);
                self.count_reclaimed(v, self.rec_size(r), false);
                return true;
            }
            if self.copy_verbatim(c, r, v, slot).is_none() {
                return false;
            }
            self.account_remove(v, r.len, self.rec_size(r));
            true
        });
        if !moved {
            self.eviction.push(victim, Queue::Main);
        }
        moved
    }

    /// Write a copy of live record `r` (slot value `v`) into the compactor's segment: the
    /// same item (CAS, stamp, flags, expiry, marks), and point `slot` at it (access bits
    /// kept); None when it does not fit.
    fn copy_verbatim(&self, c: &mut Compactor, r: &Rec<'_>, v: u64, slot: Slot<'_>) -> Option<()> {
        let spec = Spec::copy_of(r);
        let d = c.dest?;
        let need = format::encoded_len(&spec, format::natural_cas(d.base, d.used));
        self.append_copy(&mut c.dest, &spec, need, |seg, off| {
            let fresh = index::pack(index::slot_tag(v), seg, off, 0, false);
            self.relocate(slot, fresh | (v & !index::IDENT_MASK));
        })
    }

    /// The victim's items have all moved: retire it, wait out its readers, and keep it as
    /// the spare (or free it).
    fn free_victim(&self, c: &mut Compactor, victim: u32) {
        self.st().segments_compacted.fetch_add(1, Ordering::Relaxed);
        self.retire(victim);
        self.barrier();
        if c.spare.is_none() && self.arena.allocated() <= self.budget() {
            c.spare = Some(victim);
            return;
        }
        let mut p = self.arena.pool();
        if self.arena.allocated() > self.budget() {
            self.release(&mut p, victim);
        } else {
            p.push_free(victim);
        }
    }

    /// A kept-bytes rewrite (touch) that found no room in its shard: write it into the
    /// compactor's segment (no_evict only).
    pub(super) fn commit_compacted(
        &self,
        c: &Commit<'_>,
        need: usize,
        now: Time,
        view: Option<ShowFn<'_>>,
    ) -> Outcome {
        let mut cp = lock(&self.compactor);
        let Some(open) = self.compactor_room(&mut cp, need) else {
            return Outcome::NoMemory;
        };
        let Some(dest) = self.dest(&open) else {
            return Outcome::NoMemory;
        };
        let (out, len, held) = self.apply(c, &dest, now);
        if len > 0 {
            self.advance(&mut cp.dest, open, len);
        }
        self.show(held, view);
        out
    }
}

/// Call `f` with the offset and record of every record of the segment at `ptr`, in order,
/// until it returns false (then false). Stops quietly at a record that does not parse.
///
/// # Safety
/// `ptr` must be a mapped segment whose first `used` bytes are published and stay
/// unchanged during the call (a segment that is ours, or a quiescent engine's).
pub(super) unsafe fn for_records(
    ptr: NonNull<u8>,
    used: usize,
    mut f: impl FnMut(usize, &Rec<'_>) -> bool,
) -> bool {
    // SAFETY: per the contract.
    let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
    let mut off = SEG_HDR;
    while off < used {
        // SAFETY: per the contract; `read` checks every length against `used`.
        let Some(r) = (unsafe { format::read(ptr.as_ptr(), used, off, base) }) else {
            break;
        };
        let here = off;
        off += r.len;
        if !f(here, &r) {
            return false;
        }
    }
    true
}
