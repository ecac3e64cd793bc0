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
use std::sync::atomic::{AtomicU64, Ordering};

use super::format::{self, Rec, Spec, KIND_ITEM, SEG_HDR};
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

/// With no_evict, this part of the segment budget is kept for rewrites: a touch that adds
/// a rewrite stamp (or an expiry) to an item makes it a few bytes longer, and a full log
/// must still take the touches of all its items.
const REWRITE_RESERVE_DIVISOR: usize = 32;

impl LogEngine {
    /// Segment memory that writes of new bytes may use: all of it, except with no_evict,
    /// where [`REWRITE_RESERVE_DIVISOR`] keeps a part for rewrites.
    pub(super) fn write_budget(&self) -> usize {
        let b = self.budget();
        if self.no_evict {
            b - b / REWRITE_RESERVE_DIVISOR
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
    /// net one: the victim with the fewest live bytes goes into the room left in the
    /// compactor's segment if it fits (and is at least an eighth dead: the reserve is not
    /// spent on moving full segments around); or the two with the fewest go, the first
    /// verbatim into the spare (which it replaces), the second after it, if both fit in
    /// one segment. True if a segment was freed.
    pub(super) fn compact_for_segment(&self) -> bool {
        let mut c = lock(&self.compactor);
        let payload = self.seg_size - SEG_HDR;
        let worth = |live: usize| live + payload / 8 <= payload;
        let Some(first) = self.take_victim(worth) else {
            return false;
        };
        let live = |id| self.live_bytes(id).unwrap_or(usize::MAX);
        // A copy into another CAS base may be a few bytes longer or shorter: only segments
        // that fit by their live bytes with some slack get the exact (costly) look.
        let plausible = |bytes: usize, room: usize| bytes <= room + room / 64;
        if let Some(o) = c.dest {
            let room = o.cap - o.used;
            if plausible(live(first), room) && self.copied_len(first, o.base) <= room {
                return self.compact_into(&mut c, first);
            }
        }
        let second = self.take_victim(worth);
        let fits = match (second, self.cas_base(first)) {
            (Some(s), Some(base)) => {
                let room = payload.saturating_sub(live(first));
                plausible(live(s), room) && self.copied_len(s, base) <= room
            }
            _ => false,
        };
        if !fits {
            let mut fifo = lock(&self.fifo);
            for id in std::iter::once(first).chain(second) {
                fifo.push(id, Queue::Main);
            }
            return false;
        }
        let Some(second) = second else { return false };
        if !self.compact_into_spare(&mut c, first) {
            lock(&self.fifo).push(second, Queue::Main);
            return false;
        }
        self.compact_into(&mut c, second)
    }

    /// Move `victim` (ours) into the compactor's segment and free it.
    fn compact_into(&self, c: &mut Compactor, victim: u32) -> bool {
        if !self.move_live(c, victim) {
            return false;
        }
        self.free_victim(c, victim);
        true
    }

    /// Seal the compactor's segment, open the spare with `victim`'s CAS base, move the
    /// victim's live items into it and keep the victim as the new spare.
    fn compact_into_spare(&self, c: &mut Compactor, victim: u32) -> bool {
        let spare = c.spare.take().or_else(|| self.take_segment_no_evict());
        let base = self.cas_base(victim);
        let opened = spare.and_then(|s| self.open_segment_at(s, base));
        let Some(fresh) = opened else {
            if let Some(s) = spare {
                c.spare = Some(s);
            }
            lock(&self.fifo).push(victim, Queue::Main);
            return false;
        };
        if let Some(o) = c.dest.replace(fresh) {
            self.seal(o, Queue::Main);
        }
        if !self.move_live(c, victim) {
            return false;
        }
        self.free_victim(c, victim);
        true
    }

    fn cas_base(&self, id: u32) -> Option<u64> {
        let seg = self.segs.get(id)?;
        let ptr = NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire))?;
        // SAFETY: a sealed segment we took out of the FIFO: ours, mapped, not reused.
        Some(unsafe { format::seg_cas_base(ptr.as_ptr()) })
    }

    fn live_bytes(&self, id: u32) -> Option<usize> {
        let s = self.segs.get(id)?;
        Some(s.acct.0.live_bytes.load(Ordering::Acquire) as usize)
    }

    /// Take the regular sealed segment with the fewest live bytes among those
    /// `ok(live_bytes)` accepts out of the FIFO (it is then ours, as in eviction).
    fn take_victim(&self, ok: impl Fn(usize) -> bool) -> Option<u32> {
        let mut fifo = lock(&self.fifo);
        let (_, id) = fifo
            .small
            .iter()
            .chain(fifo.main.iter())
            .filter_map(|&id| {
                let s = self.segs.get(id)?;
                let live = s.acct.0.live_bytes.load(Ordering::Acquire) as usize;
                (!s.mem.0.large.load(Ordering::Relaxed) && ok(live)).then_some((live, id))
            })
            .min()?;
        fifo.remove_first(|x| x == id)
    }

    /// An upper bound of the bytes `victim`'s (ours) live items take when copied into a segment
    /// with CAS base `base` (items only die meanwhile, never come back).
    fn copied_len(&self, victim: u32, base: u64) -> usize {
        let mut total = 0;
        self.for_live(victim, |_, r, _| {
            let spec = verbatim(r);
            total += format::encoded_len(&spec, base);
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
        mut f: impl FnMut(&AtomicU64, &Rec<'_>, u64) -> bool,
    ) -> bool {
        let Some(seg) = self.segs.get(id) else {
            return true;
        };
        let Some(ptr) = NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire)) else {
            return true;
        };
        let used = seg.mem.0.used.load(Ordering::Acquire);
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
                found.is_none_or(|(slot, v)| f(slot, r, v))
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
                self.note_removed(r, v);
                slot.store(0, Ordering::Release);
                self.account_remove(v, r.len, self.rec_size(r));
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
            lock(&self.fifo).push(victim, Queue::Main);
        }
        moved
    }

    /// Write a copy of live record `r` (slot value `v`) into the compactor's segment: the
    /// same item (CAS, stamp, flags, expiry, marks), and point `slot` at it (access bits
    /// kept); None when it does not fit.
    fn copy_verbatim(
        &self,
        c: &mut Compactor,
        r: &Rec<'_>,
        v: u64,
        slot: &AtomicU64,
    ) -> Option<()> {
        let spec = verbatim(r);
        let need = format::encoded_len(&spec, c.dest?.base);
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
        if c.spare.is_none() && self.allocated.load(Ordering::Relaxed) <= self.budget() {
            c.spare = Some(victim);
            return;
        }
        let mut p = lock(&self.pool);
        if self.allocated.load(Ordering::Relaxed) > self.budget() {
            self.release(&mut p, victim);
        } else {
            p.free.push(victim);
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

/// The record of a copy of `r`: the same item.
fn verbatim<'a>(r: &Rec<'a>) -> Spec<'a> {
    Spec {
        kind: KIND_ITEM,
        key: r.key,
        parts: [r.value, &[]],
        flags: r.flags,
        exptime: r.exptime,
        cas: r.cas,
        stamp: r.stamp,
        meta: r.meta,
        explicit_cas: r.explicit_cas,
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
