//! Eviction: whole segments, oldest first, from the two FIFOs; items read since they were
//! written are copied forward (CLOCK second chance), the rest dropped.
//!
//! [`Eviction`] is the policy's state, owned here: the two FIFOs of sealed segments, the
//! evictor's copy destination and spare, the miss sketch, the size factor, whether eviction
//! ever ran, and the eviction observer. The rest of the engine reaches it only through its
//! methods; the `impl LogEngine` block below is the eviction path itself (popping a
//! segment, deciding each item's fate, copying forward), which needs the index and the
//! segments as well.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::format::{self, Rec, Spec, HDR_MAX, KIND_ITEM, SEG_HDR};
use super::index::Slot;
use super::repl::EvictionNotes;
use super::segments::{Evicted, Open, Queue};
use super::sketch::MissSketch;
use super::sync::lock;
use super::{index, EvictionObserver, LogEngine, Vis};
use crate::Time;

/// The small (probation) FIFO is evicted first while it holds more than this percentage of
/// the sealed segments: with a size factor (and the sketch's readmissions), and without.
const SMALL_PERCENT: usize = 10;
const SMALL_PERCENT_BLIND: usize = 40;
/// Eviction's default size factor ([`LogEngine::set_size_factor`]).
pub const DEFAULT_SIZE_FACTOR: u32 = 4;
/// The miss sketch has a counter (half a byte) per this many bytes of the memory limit,
/// within these bounds (2 KiB to 8 MiB of counters): 1/64 of the memory.
pub(super) const BYTES_PER_COUNTER: usize = 32;
const MIN_COUNTERS: usize = 1 << 12;
const MAX_COUNTERS: usize = 1 << 24;

/// The miss sketch's counters for a memory limit of `max_bytes` (it follows the limit:
/// `cache_memlimit`, `-m auto` following its cgroup).
fn sketch_counters(max_bytes: usize) -> usize {
    (max_bytes / BYTES_PER_COUNTER).clamp(MIN_COUNTERS, MAX_COUNTERS)
}

/// The eviction policy's state (S3-FIFO by whole segments, with a size bias and a miss
/// sketch as its ghost queue). It owns:
///
/// * the two FIFOs of sealed segments ([`Fifo`], behind the FIFO lock, last in the lock
///   order): a segment is in them from its sealing until someone takes it out (eviction,
///   compaction, the maintenance pass), and whoever takes it out owns it;
/// * the evictor ([`Evictor`], behind the evictor lock, taken before the pool and FIFO
///   locks): the open segment second-chance copies go to and a spare free segment;
/// * the miss sketch, the size factor, whether eviction ever ran (the sketch is used only
///   from then on), and the observer told of each evicted item.
///
/// Its invariants: the probation queue is evicted first while it holds more than its share
/// of the sealed segments (`SMALL_PERCENT`, or `SMALL_PERCENT_BLIND` without a size
/// factor); the sketch counts nothing before eviction first ran, nor without a size factor.
pub(super) struct Eviction {
    fifo: Mutex<Fifo>,
    evictor: Mutex<Evictor>,
    /// Keys stored while absent, lately (see [`Eviction::readmits`]).
    sketch: MissSketch,
    /// Eviction's size bias (see [`LogEngine::set_size_factor`]); 0: none.
    size_factor: AtomicU32,
    /// Set once eviction first took a segment (never cleared).
    evicting: AtomicBool,
    /// Told of every item evicted (`watch evictions`); see [`LogEngine::observe_evictions`].
    on_evict: OnceLock<EvictionObserver>,
}

impl Eviction {
    /// The policy for a memory limit of `max_bytes`: empty FIFOs, the default size factor.
    pub(super) fn new(max_bytes: usize) -> Eviction {
        Eviction {
            fifo: Mutex::new(Fifo::default()),
            evictor: Mutex::new(Evictor::default()),
            sketch: MissSketch::new(sketch_counters(max_bytes), MAX_COUNTERS),
            size_factor: AtomicU32::new(DEFAULT_SIZE_FACTOR),
            evicting: AtomicBool::new(false),
            on_evict: OnceLock::new(),
        }
    }

    /// [`LogEngine::set_size_factor`].
    pub(super) fn set_size_factor(&self, factor: u32) {
        self.size_factor.store(factor, Ordering::Relaxed);
    }

    /// [`LogEngine::size_factor`].
    pub(super) fn size_factor(&self) -> u32 {
        self.size_factor.load(Ordering::Relaxed)
    }

    /// The reads since it was written that keep an item of `len` record bytes through an
    /// eviction, given the mean record `unit` and the size factor.
    pub(super) fn keep_need(&self, len: usize, unit: usize) -> u64 {
        let factor = self.size_factor() as usize;
        if factor == 0 {
            return 1;
        }
        (1 + len / factor.saturating_mul(unit).max(1)).min(index::FREQ_MAX as usize) as u64
    }

    /// What percentage of the sealed segments the probation queue may hold.
    fn small_percent(&self) -> usize {
        if self.size_factor() == 0 {
            SMALL_PERCENT_BLIND
        } else {
            SMALL_PERCENT
        }
    }

    /// A key (hash `h`) is stored while absent: count it in the sketch, and say whether it
    /// starts with one read counted (the sketch remembers it being stored while absent
    /// lately: it was evicted unread and asked for again, or it churns through the
    /// probation queue).
    #[inline]
    pub(super) fn readmits(&self, h: u64) -> bool {
        // Until eviction first runs no key can have left the cache unread, and the sketch
        // stays untouched (no memory) in a cache that never fills.
        if self.size_factor() == 0 || !self.evicting.load(Ordering::Relaxed) {
            return false;
        }
        self.sketch.add(h) > 0
    }

    /// The memory limit is now `max_bytes`: the sketch follows it.
    pub(super) fn resize_sketch(&self, max_bytes: usize) {
        self.sketch.resize(sketch_counters(max_bytes));
    }

    /// Halve the sketch's counters if a period of additions passed (the background pass).
    pub(super) fn age_sketch(&self) {
        self.sketch.halve_if_due();
    }

    /// Bytes the sketch's counters take (counted against the memory limit).
    pub(super) fn sketch_bytes(&self) -> usize {
        self.sketch.bytes()
    }

    /// Counters the sketch uses.
    #[cfg(test)]
    pub(super) fn sketch_counters(&self) -> u64 {
        self.sketch.counters()
    }

    /// [`LogEngine::observe_evictions`]: once; a second call is ignored.
    pub(super) fn observe(&self, f: EvictionObserver) {
        let _ = self.on_evict.set(f);
    }

    /// Segment `id` was sealed (or kept whole, or given back) and joins `queue`.
    pub(super) fn push(&self, id: u32, queue: Queue) {
        lock(&self.fifo).push(id, queue);
    }

    /// Take the next segment to evict out of the FIFOs (it is then the caller's), and note
    /// that eviction runs.
    fn pop(&self) -> Option<u32> {
        let small = self.small_percent();
        let id = lock(&self.fifo).pop(small)?;
        if !self.evicting.load(Ordering::Relaxed) {
            self.evicting.store(true, Ordering::Relaxed);
        }
        Some(id)
    }

    /// Sealed segments waiting in the FIFOs.
    pub(super) fn sealed(&self) -> usize {
        lock(&self.fifo).len()
    }

    /// Take the first sealed segment (oldest first, probation queue first) that `f`
    /// chooses out of the FIFOs; it is then the caller's.
    pub(super) fn take_first(&self, f: impl FnMut(u32) -> bool) -> Option<u32> {
        lock(&self.fifo).remove_first(f)
    }

    /// Take every sealed segment `f` chooses out of the FIFOs, in one pass under the FIFO
    /// lock; they are then the caller's.
    pub(super) fn take_all(&self, mut f: impl FnMut(u32) -> bool) -> Vec<u32> {
        let mut taken = Vec::new();
        lock(&self.fifo).retain(|id| {
            let take = f(id);
            if take {
                taken.push(id);
            }
            !take
        });
        taken
    }

    /// Take the sealed segment with the least `key` (among those it gives one for) out of
    /// the FIFOs, chosen and taken under one hold of the FIFO lock; it is then the caller's.
    pub(super) fn take_least<K: Ord>(&self, mut key: impl FnMut(u32) -> Option<K>) -> Option<u32> {
        let mut fifo = lock(&self.fifo);
        let (_, id) = fifo
            .small
            .iter()
            .chain(fifo.main.iter())
            .filter_map(|&id| Some((key(id)?, id)))
            .min()?;
        fifo.remove_first(|x| x == id)
    }

    /// Call `f` with every sealed segment, under the FIFO lock (it must not take it).
    pub(super) fn for_each_sealed(&self, mut f: impl FnMut(u32)) {
        let fifo = lock(&self.fifo);
        for &id in fifo.small.iter().chain(&fifo.main) {
            f(id);
        }
    }

    /// The evictor, locked (the lock order's "evictor": after the bucket stripes, before
    /// the pool and the FIFOs).
    pub(super) fn evictor(&self) -> MutexGuard<'_, Evictor> {
        lock(&self.evictor)
    }
}

/// The sealed segments in two FIFOs, oldest first (S3-FIFO, by segment): new items wait
/// in `small`, which is evicted first while it holds more than `SMALL_PERCENT` of the
/// sealed segments (`SMALL_PERCENT_BLIND` without a size factor), so an item nobody reads
/// leaves after a short probation instead of a trip through the whole cache; items read
/// meanwhile are copied into `main`, evicted with CLOCK second chances.
#[derive(Default)]
struct Fifo {
    small: VecDeque<u32>,
    main: VecDeque<u32>,
}

impl Fifo {
    fn push(&mut self, id: u32, queue: Queue) {
        match queue {
            Queue::Small => self.small.push_back(id),
            Queue::Main => self.main.push_back(id),
        }
    }

    /// The next segment to evict, with the small queue allowed `small_percent` of the
    /// sealed segments.
    fn pop(&mut self, small_percent: usize) -> Option<u32> {
        let total = self.small.len() + self.main.len();
        if self.small.len() * 100 > total * small_percent || self.main.is_empty() {
            self.small.pop_front().or_else(|| self.main.pop_front())
        } else {
            self.main.pop_front()
        }
    }

    fn len(&self) -> usize {
        self.small.len() + self.main.len()
    }

    fn remove_first(&mut self, mut f: impl FnMut(u32) -> bool) -> Option<u32> {
        for q in [&mut self.small, &mut self.main] {
            if let Some(i) = q.iter().position(|&id| f(id)) {
                return q.remove(i);
            }
        }
        None
    }

    fn retain(&mut self, mut f: impl FnMut(u32) -> bool) {
        self.small.retain(|&id| f(id));
        self.main.retain(|&id| f(id));
    }
}

/// The segments eviction holds back for itself, behind the evictor lock.
#[derive(Default)]
pub(super) struct Evictor {
    /// Where second-chance items are copied.
    dest: Option<Open>,
    /// A free segment kept for the next `dest`: when eviction runs the free list is empty,
    /// and the segment being cleaned is not free until it is done.
    spare: Option<u32>,
}

impl Evictor {
    /// With neither a destination nor a spare, keep the free segment `take` gives (if any)
    /// as the spare, so that eviction has somewhere to copy to once memory runs out.
    pub(super) fn fill_spare(&mut self, take: impl FnOnce() -> Option<u32>) {
        if self.spare.is_none() && self.dest.is_none() {
            self.spare = take();
        }
    }

    /// Keep the free segment `id` as the spare if there is none; false if there is one
    /// (the caller keeps `id`).
    fn offer_spare(&mut self, id: u32) -> bool {
        if self.spare.is_some() {
            return false;
        }
        self.spare = Some(id);
        true
    }

    /// Give up the spare, if any (the caller frees it).
    pub(super) fn take_spare(&mut self) -> Option<u32> {
        self.spare.take()
    }

    /// Give up the open destination, if any (the caller seals it).
    pub(super) fn take_dest(&mut self) -> Option<Open> {
        self.dest.take()
    }
}

impl LogEngine {
    /// Evict the oldest sealed segment. With `release`, or when over budget, its memory
    /// goes back to the OS, else to the free list.
    pub(super) fn evict_one(&self, release: bool) -> Evicted {
        // Flash writes that finished: their segments' memory comes back (`flash.rs`).
        self.settle();
        // Popping the segment makes it ours: several threads may clean different
        // segments at once (they share only the evictor's copy destination).
        let Some(id) = self.eviction.pop() else {
            return Evicted::Nothing;
        };
        let Some(seg) = self.segs.get(id) else {
            return Evicted::Nothing;
        };
        let large = seg.is_large();
        let empty = seg.live_items() == 0;
        if empty {
            // Nothing in it is referenced (everything was overwritten, deleted or
            // unlinked already): no need to look at its records.
        } else if large {
            if self.clean_large(id) {
                self.eviction.push(id, Queue::Main);
                return Evicted::Kept;
            }
        } else if self.demoting() && self.demote_segment(id) {
            // Its cold items go to flash with it; its memory comes back once it is
            // written (`flash.rs`).
            self.st().segments_evicted.fetch_add(1, Ordering::Relaxed);
            return Evicted::Kept;
        } else {
            self.clean(id);
        }
        self.st().segments_evicted.fetch_add(1, Ordering::Relaxed);
        // A replica that has not read it skips it, once what it held is logged anew (what
        // was copied forward is in the log already).
        if self.repl.is_active() {
            self.relog_if_unread(id, |seq| self.repl.is_held(seq));
        }
        self.retire(id);
        self.barrier();
        let over = self.arena.allocated() > self.budget();
        let release = release || over || self.gives_back(id);
        if !release && self.eviction.evictor().offer_spare(id) {
            return Evicted::Kept;
        }
        let mut p = self.arena.pool();
        if release {
            self.release(&mut p, id);
        } else {
            p.push_free(id);
        }
        Evicted::Freed
    }

    /// Tell the eviction observer, if any, of the live item in `slot` being evicted.
    #[inline]
    fn observe_eviction(&self, r: &Rec<'_>, v: u64, now: Time) {
        if let Some(f) = self.eviction.on_evict.get() {
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
                if index::freq(v) >= self.eviction.keep_need(r.len, unit) {
                    return true;
                }
                self.count_evicted(r, v, now, notes);
            }
            Vis::Expired | Vis::Flushed => self.count_reclaimed(v, self.rec_size(r), false),
        }
        false
    }

    /// Unlink the record `r` that `slot` (value `v`) names: noted as removed (replicas,
    /// observers), the slot emptied, its accounting taken off its segment. The caller holds
    /// the slot's stripe lock and counts why (evicted, expired, flushed).
    pub(super) fn unlink(&self, slot: Slot<'_>, r: &Rec<'_>, v: u64) {
        self.note_removed(r, v);
        slot.store(0);
        self.account_remove(v, r.len, self.rec_size(r));
    }

    /// Count the eviction of the live item `r` (slot value `v`), from memory or from
    /// flash: memcached's counters, the `watch evictions` observer, replicas' notes.
    pub(super) fn count_evicted(&self, r: &Rec<'_>, v: u64, now: Time, notes: &mut EvictionNotes) {
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

    /// Process every record of sealed segment `id` (popped from the FIFO, so ours). The
    /// evictor lock is taken per second-chance copy, inside the record's stripe lock.
    pub(super) fn clean(&self, id: u32) {
        let now = self.clock.load(Ordering::Relaxed);
        // Evictions are noted for replicas once per segment, not under each stripe lock.
        let mut notes = EvictionNotes::default();
        let unit = self.mean_record();
        self.for_live(id, |slot, r, v| {
            if self.evict_item(r, v, now, &mut notes, unit) {
                let copied = self.copy_forward(&mut self.eviction.evictor(), r, v, slot);
                if copied.is_some() {
                    self.account_remove(v, r.len, self.rec_size(r));
                    self.st().copied_forward.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                self.count_evicted(r, v, now, &mut notes);
            }
            self.unlink(slot, r, v);
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
            stamp: if self.repl.is_replica() {
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
        let Some(ptr) = seg.ptr() else {
            return false;
        };
        let used = seg.used();
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
        self.unlink(slot, &r, v);
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
