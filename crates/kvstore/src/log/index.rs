//! The hash index: cache-line main buckets of eight tagged 64-bit slots, overflow buckets
//! of four, grown by linear hashing.
//!
//! A slot is `VALID | MOVED | win | fetched | freq(2) | tag(16) | segment(22) | offset(20)`,
//! or 0 when empty. Readers load slots atomically and never lock; writers change the
//! location bits only while holding the lock stripe of the key's bucket. Readers change
//! only the `freq`/`fetched`/`win` bits, and only by compare-exchange, so they never undo a
//! writer. `win` ("a win token was sent for this item", meta protocol) is set by a
//! reader's compare-exchange, so exactly one reader sets it; a writer that keeps it (a
//! rewrite of the same item) carries it over with a compare-exchange loop too, never with
//! a plain store of a value it loaded earlier.
//!
//! Next to every slot the index keeps the item's last access time in a parallel table: the
//! low 16 bits of the unix time (`AtomicU16`), written before the slot is published for a
//! new item, and by readers (relaxed) on every access. It reads back as the latest time at
//! or before `now` with those low bits: exact for items accessed within the last 18 hours
//! (65536 s), the age modulo 65536 s beyond.
//!
//! # Addressing and growth
//!
//! The table is sized to the items it holds, not to `-m`: it starts small and grows one
//! bucket at a time (linear hashing). The addressing state is a level `L` and a split
//! pointer `p`: `nmain = 2^L + p` main buckets; a key's bucket is `h mod 2^L`, or
//! `h mod 2^(L+1)` when that is below `p`. Splitting bucket `p` moves the items whose bit
//! `L` is set to the new bucket `p + 2^L`; buckets never move, so a slot's address stays
//! valid. An empty index that is about to be bulk loaded (a warm restart, which knows its
//! item count) is set to its final size at once instead (`presize`). The whole table (main and overflow buckets) is one mapping reserved up front for
//! the most buckets the memory limit could need and touched only as it grows. The tag is
//! the top 16 bits of the hash, the bucket the low bits, the lock stripe the low bits too
//! (`h mod nlocks`, with `nlocks <= 2^L`), so a key's stripe never changes as the table
//! grows and a split needs one stripe lock.
//!
//! A split never lets a lock-free reader miss an item:
//! 1. Under the stripe lock, the chain is flagged as being worked on (`work`); each moving
//!    item's old slot is marked `MOVED` by an atomic `fetch_or`, which returns the item
//!    with every access or win bit a reader set before (a reader's compare-exchange after
//!    it fails), and the item is then stored into the new bucket (not yet addressable).
//!    The state then advances, the work flag is cleared and the lock released.
//! 2. A reader skips `MOVED` slots. One that saw a `MOVED` slot with its tag and found
//!    nothing waits while its chain is flagged, then reloads the state: if its key's bucket
//!    changed it searches the new one; otherwise it rescans once (see 3).
//! 3. After a pin barrier (every reader that could still use the old addressing is gone)
//!    the `MOVED` slots are cleared and the chain compacted: items in overflow buckets move
//!    forward into free slots of the same chain by the same flag-mark-store steps (a reader
//!    that meets such a mark waits for the flag to clear and rescans the chain once).
//! 4. After a second barrier those marks are cleared and overflow buckets left empty are
//!    unlinked; after a third they may be reused (a reader inside an unlinked bucket still
//!    follows its intact `next` link back into the chain).
//!
//! Every key hashes to one main bucket; when its eight slots are taken the bucket chains to
//! overflow buckets of four slots from a pool (reused once unlinked, see above): two of them
//! share a cache line of the pool, each with its own link and its chain's stripe lock. When the pool is
//! exhausted, or the table has reached its largest size, an insert replaces a slot of the
//! chain (the index is lossy, as MICA's is: that item is evicted).

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::Time;
use std::sync::{Mutex, MutexGuard};

use super::mem::ZeroedSlice;

pub(crate) const SLOTS: usize = 8;
/// Bytes one more main bucket adds to the index (the bucket, its link, its time cells).
pub(crate) const BUCKET_BYTES: usize = std::mem::size_of::<Bucket>() + 4 + SLOTS * 2;
/// Slots of an overflow bucket: half a main bucket's (two share a cache line). Most
/// chains that overflow do by a few items: at the load the index grows at (eight items
/// per main bucket on average), 4-slot overflow buckets hold the same items in fewer
/// bytes than 8-slot ones (`bench/memory.sh`: BENCHMARKS.md).
pub(crate) const OVER_SLOTS: usize = SLOTS / 2;
/// Bytes one more overflow bucket adds (its slots, link and time cells).
const OVER_BYTES: usize = OVER_SLOTS * (8 + 2) + 4;

const OFF_BITS: u32 = 20;
const SEG_BITS: u32 = 22;
const TAG_SHIFT: u32 = OFF_BITS + SEG_BITS;
const FREQ_SHIFT: u32 = TAG_SHIFT + 16;
pub(crate) const FREQ_MAX: u64 = 3;
const FREQ_MASK: u64 = FREQ_MAX << FREQ_SHIFT;
pub(crate) const FETCHED: u64 = 1 << 60;
/// Meta protocol: a win token was handed out for this item.
pub(crate) const WIN: u64 = 1 << 61;
/// The item was copied elsewhere by a split or a compaction; this slot is only a marker
/// (never read through) until it is cleared after a pin barrier.
pub(crate) const MOVED: u64 = 1 << 62;
const VALID: u64 = 1 << 63;
/// The bits that name an item's location (everything but the access and win bits).
pub(crate) const IDENT_MASK: u64 = !(FREQ_MASK | FETCHED | WIN);
/// Largest segment id a slot can name.
pub(crate) const MAX_SEGMENTS: usize = 1 << SEG_BITS;
/// Largest in-segment offset + 1 a slot can name.
pub(crate) const MAX_OFFSET: usize = 1 << OFF_BITS;

const LEVEL_SHIFT: u32 = 32;

#[inline]
pub(crate) fn tag_of(h: u64) -> u64 {
    h >> 48
}

#[inline]
pub(crate) fn pack(tag: u64, seg: u32, off: u32, freq: u64, fetched: bool) -> u64 {
    VALID
        | if fetched { FETCHED } else { 0 }
        | (freq.min(FREQ_MAX) << FREQ_SHIFT)
        | ((tag & 0xffff) << TAG_SHIFT)
        | ((u64::from(seg) & ((1 << SEG_BITS) - 1)) << OFF_BITS)
        | (u64::from(off) & ((1 << OFF_BITS) - 1))
}

#[inline]
pub(crate) fn is_valid(v: u64) -> bool {
    v & VALID != 0
}
/// A slot that names a live record: valid and not a `MOVED` marker.
#[inline]
pub(crate) fn is_item(v: u64) -> bool {
    v & (VALID | MOVED) == VALID
}
#[inline]
pub(crate) fn slot_tag(v: u64) -> u64 {
    (v >> TAG_SHIFT) & 0xffff
}
#[inline]
pub(crate) fn slot_seg(v: u64) -> u32 {
    ((v >> OFF_BITS) & ((1 << SEG_BITS) - 1)) as u32
}
#[inline]
pub(crate) fn slot_off(v: u64) -> usize {
    (v & ((1 << OFF_BITS) - 1)) as usize
}
#[inline]
pub(crate) fn freq(v: u64) -> u64 {
    (v & FREQ_MASK) >> FREQ_SHIFT
}
#[inline]
pub(crate) fn fetched(v: u64) -> bool {
    v & FETCHED != 0
}
/// `v` with its access counter set to `f` (at most `FREQ_MAX`).
pub(crate) fn with_freq(v: u64, f: u64) -> u64 {
    (v & !FREQ_MASK) | (f.min(FREQ_MAX) << FREQ_SHIFT)
}

/// `v` with one more access recorded (saturating).
#[inline]
pub(crate) fn bumped(v: u64) -> u64 {
    let f = (freq(v) + 1).min(FREQ_MAX);
    (v & !FREQ_MASK) | (f << FREQ_SHIFT) | FETCHED
}

#[inline]
fn level(s: u64) -> u32 {
    (s >> LEVEL_SHIFT) as u32
}
#[inline]
fn split_ptr(s: u64) -> usize {
    (s & 0xffff_ffff) as usize
}
#[inline]
fn main_count(s: u64) -> usize {
    (1usize << level(s)) + split_ptr(s)
}
/// The main buckets under addressing `s` (from [`Index::addressing`]).
pub(crate) fn home_buckets(s: u64) -> usize {
    main_count(s)
}

/// For main bucket `b` under addressing `s`: the items it held then are, under any later
/// addressing, in the main buckets `b`, `b + stride`, `b + 2 * stride`, ... (splits only
/// move an item to a bucket that many above, and its bucket's low bits stay its hash's),
/// and every item in those buckets had `b` as its bucket under `s`.
pub(crate) fn home_stride(s: u64, b: usize) -> usize {
    let m = 1usize << level(s);
    if b < split_ptr(s) || b >= m {
        2 * m
    } else {
        m
    }
}

/// The main bucket of hash `h` under state `s`.
#[inline]
fn addr(h: u64, s: u64) -> usize {
    let m = 1u64 << level(s);
    let b = h & (m - 1);
    if (b as usize) < split_ptr(s) {
        (h & (2 * m - 1)) as usize
    } else {
        b as usize
    }
}

/// Where an insert went.
pub(crate) enum Insert<'a> {
    Stored,
    /// The chain is full and no overflow bucket is left: the caller evicts this slot's
    /// item and stores its value there.
    Victim(&'a AtomicU64),
    /// As `Victim`, but every candidate slot is a `MOVED` marker: nothing was stored.
    Full,
}

#[derive(Default)]
#[repr(align(64))]
pub(crate) struct Bucket(pub(crate) [AtomicU64; SLOTS]);

/// A bucket of a chain: a main bucket (its index), or an overflow bucket (its index in
/// the pool: the half `o % 2` of the pool's `Bucket` `o / 2`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Node {
    Main(usize),
    Over(usize),
}

pub(crate) struct Index {
    /// Main buckets `0 .. max_main`, then the overflow pool (each `Bucket` there holds two
    /// overflow buckets of `OVER_SLOTS` slots).
    buckets: ZeroedSlice<Bucket>,
    /// Per main bucket: 1 + the overflow bucket that follows it, or 0.
    next: ZeroedSlice<AtomicU32>,
    /// Per overflow bucket: 1 + the overflow bucket that follows it, or 0.
    over_next: ZeroedSlice<AtomicU32>,
    /// Per slot (bucket * SLOTS + i): low 16 bits of the last access time of its item.
    times: ZeroedSlice<AtomicU16>,
    max_main: usize,
    /// `level << 32 | split pointer` (see the module documentation).
    state: AtomicU64,
    /// 1 + the main bucket whose chain is being split or compacted, or 0.
    work: AtomicUsize,
    /// Overflow buckets ever handed out (the pool's high-water mark).
    over_used: AtomicUsize,
    /// Overflow buckets unlinked and past their barriers: free to link again.
    over_free: Mutex<Vec<u32>>,
    /// Lock stripes. Each guards its keys' chains and the stripe's CAS floor, which the
    /// engine keeps (see `cas.rs`).
    locks: Box<[Mutex<u64>]>,
}

impl Index {
    /// An index that can grow to about `max_slots` slots in main buckets (plus a quarter
    /// as overflow). It starts small; its pages become resident only as it grows.
    pub(crate) fn new(max_slots: usize) -> Index {
        let mut max_main = max_slots.div_ceil(SLOTS).clamp(16, u32::MAX as usize / 2);
        let nlocks = (max_main / 4).clamp(16, 4096).next_power_of_two();
        let start = nlocks;
        loop {
            let total = max_main + max_main / 2 + 4;
            // SAFETY: a bucket is eight AtomicU64, an AtomicU32 and an AtomicU16 are
            // valid and default as all-zero bytes (empty slot, no next bucket, time 0);
            // none needs drop; alignment is at most 64.
            let over = 2 * (total - max_main);
            let parts = unsafe {
                (
                    ZeroedSlice::<Bucket>::reserve(total),
                    ZeroedSlice::<AtomicU32>::reserve(max_main),
                    ZeroedSlice::<AtomicU32>::reserve(over),
                    ZeroedSlice::<AtomicU16>::reserve(total * SLOTS),
                )
            };
            let (buckets, next, over_next, times) = match parts {
                (Some(b), Some(n), Some(o), Some(t)) => (b, n, o, t),
                _ if max_main > 2 * start => {
                    max_main /= 2;
                    continue;
                }
                _ => {
                    // SAFETY: as above.
                    unsafe {
                        (
                            ZeroedSlice::new(total),
                            ZeroedSlice::new(max_main),
                            ZeroedSlice::new(over),
                            ZeroedSlice::new(total * SLOTS),
                        )
                    }
                }
            };
            return Index {
                buckets,
                next,
                over_next,
                times,
                max_main,
                state: AtomicU64::new(u64::from(start.trailing_zeros()) << LEVEL_SHIFT),
                work: AtomicUsize::new(0),
                over_used: AtomicUsize::new(0),
                over_free: Mutex::new(Vec::new()),
                locks: (0..nlocks).map(|_| Mutex::new(0)).collect(),
            };
        }
    }

    /// Bytes the index occupies (main buckets in use and every overflow bucket ever
    /// handed out, with their link and time cells).
    pub(crate) fn bytes(&self) -> usize {
        self.nmain() * BUCKET_BYTES
            + self.overflow_used() * OVER_BYTES
            + self.locks.len() * std::mem::size_of::<Mutex<u64>>()
    }

    /// Main buckets in use now.
    pub(crate) fn nmain(&self) -> usize {
        main_count(self.state.load(Ordering::Acquire))
    }

    /// The addressing now (level and split pointer), for a walk that must follow splits:
    /// see [`home_buckets`] and [`home_stride`].
    pub(crate) fn addressing(&self) -> u64 {
        self.state.load(Ordering::Acquire)
    }

    /// The level `L` (`2^L <= nmain < 2^(L+1)`), memcached's `hash_power_level` analog.
    pub(crate) fn level(&self) -> u32 {
        level(self.state.load(Ordering::Acquire))
    }

    /// Main buckets the index may grow to.
    pub(crate) fn max_main(&self) -> usize {
        self.max_main
    }

    /// Overflow buckets (of `OVER_SLOTS` slots) ever handed out.
    pub(crate) fn overflow_used(&self) -> usize {
        self.over_used
            .load(Ordering::Relaxed)
            .min(self.over_next.len())
    }

    /// The slots of chain bucket `n`.
    #[inline]
    fn slots(&self, n: Node) -> Option<&[AtomicU64]> {
        match n {
            Node::Main(b) if b < self.max_main => self.buckets.get(b).map(|bk| &bk.0[..]),
            Node::Main(_) => None,
            Node::Over(o) => {
                let at = (o % 2) * OVER_SLOTS;
                self.buckets
                    .get(self.max_main + o / 2)?
                    .0
                    .get(at..at + OVER_SLOTS)
            }
        }
    }

    /// The link of chain bucket `n` to the next one.
    #[inline]
    fn link(&self, n: Node) -> Option<&AtomicU32> {
        match n {
            Node::Main(b) => self.next.get(b),
            Node::Over(o) => self.over_next.get(o),
        }
    }

    /// The chain bucket after `n`, if any.
    #[inline]
    fn follow(&self, n: Node) -> Option<Node> {
        let v = self.link(n)?.load(Ordering::Acquire);
        (v != 0).then(|| Node::Over(v as usize - 1))
    }

    /// Lock the stripe that guards `h`'s bucket chain.
    pub(crate) fn lock(&self, h: u64) -> MutexGuard<'_, u64> {
        self.lock_bucket(h as usize)
    }

    /// Lock the stripe of main bucket `b` (for scans that walk buckets, not keys): the
    /// same stripe as every key whose bucket is `b`.
    pub(crate) fn lock_bucket(&self, b: usize) -> MutexGuard<'_, u64> {
        let i = b & (self.locks.len() - 1);
        match self.locks.get(i) {
            Some(m) => m.lock().unwrap_or_else(|e| e.into_inner()),
            // Unreachable: the mask keeps `i` in range.
            None => self.locks[0].lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Call `f` on every item slot of `h`'s chain whose tag matches, until it returns
    /// true; returns that slot and the value `f` saw. Lock-free (see the module
    /// documentation for how a concurrent split or compaction is followed).
    #[inline]
    pub(crate) fn find(&self, h: u64, mut f: impl FnMut(u64) -> bool) -> Option<(&AtomicU64, u64)> {
        let tag = tag_of(h);
        let mut b = addr(h, self.state.load(Ordering::Acquire));
        let mut rescanned = false;
        loop {
            let mut moved = false;
            let mut c = Node::Main(b);
            loop {
                for slot in self.slots(c)? {
                    let v = slot.load(Ordering::Acquire);
                    if is_valid(v) && slot_tag(v) == tag {
                        if v & MOVED != 0 {
                            moved = true;
                        } else if f(v) {
                            return Some((slot, v));
                        }
                    }
                }
                match self.follow(c) {
                    Some(n) => c = n,
                    None => break,
                }
            }
            if !moved {
                return None;
            }
            // A slot with our tag moved during the scan: maybe our item. Its copy is
            // in place once the work on this chain is over.
            let mut spins = 0u32;
            while self.work.load(Ordering::Acquire) == b + 1 {
                // Bounded work by a thread that holds this chain's stripe lock.
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            let nb = addr(h, self.state.load(Ordering::Acquire));
            if nb != b {
                b = nb;
            } else if rescanned {
                return None;
            } else {
                // Moved within the chain (compaction), or another key's marker.
                rescanned = true;
            }
        }
    }

    /// The last-access time cell of `slot` (a slot of this index).
    fn time(&self, slot: &AtomicU64) -> Option<&AtomicU16> {
        let base = self.buckets.as_ptr() as usize;
        let at = (slot as *const AtomicU64 as usize).wrapping_sub(base);
        self.times.get(at / std::mem::size_of::<AtomicU64>())
    }

    /// The last access time recorded for `slot`'s item, as seen at `now`: the latest
    /// time at or before `now` with the recorded low 16 bits.
    pub(crate) fn atime(&self, slot: &AtomicU64, now: Time) -> Time {
        let low = self
            .time(slot)
            .map_or(now as u16, |t| t.load(Ordering::Relaxed));
        now.saturating_sub(u32::from((now as u16).wrapping_sub(low)))
    }

    /// Record an access at `now` (skips the write when nothing changes).
    pub(crate) fn set_atime(&self, slot: &AtomicU64, now: Time) {
        if let Some(t) = self.time(slot) {
            let low = now as u16;
            if t.load(Ordering::Relaxed) != low {
                t.store(low, Ordering::Relaxed);
            }
        }
    }

    fn copy_atime(&self, from: &AtomicU64, to: &AtomicU64) {
        if let (Some(a), Some(b)) = (self.time(from), self.time(to)) {
            b.store(a.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// A fresh overflow bucket (all slots empty, no next link), or None.
    fn take_overflow(&self) -> Option<usize> {
        let reused = self
            .over_free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        if let Some(o) = reused {
            let o = o as usize;
            self.over_next.get(o)?.store(0, Ordering::Relaxed);
            return Some(o);
        }
        let o = self.over_used.fetch_add(1, Ordering::Relaxed);
        (o < self.over_next.len()).then_some(o)
    }

    /// Put `v` into the first free slot of the chain of main bucket `b` (time `t` stored
    /// before the slot is published); link an overflow bucket if the chain is full. When
    /// none is left, returns a slot of the chain's last bucket to replace.
    fn insert_at(&self, b: usize, h: u64, v: u64, t: Time) -> Insert<'_> {
        let mut c = Node::Main(b);
        loop {
            let Some(slots) = self.slots(c) else {
                return Insert::Full;
            };
            for slot in slots {
                if slot.load(Ordering::Relaxed) == 0 {
                    self.set_atime(slot, t);
                    slot.store(v, Ordering::Release);
                    return Insert::Stored;
                }
            }
            let Some(next) = self.link(c) else {
                return Insert::Full;
            };
            let n = next.load(Ordering::Acquire);
            if n != 0 {
                c = Node::Over(n as usize - 1);
                continue;
            }
            // End of the chain: link a fresh overflow bucket, or replace a slot here.
            if let Some(o) = self.take_overflow() {
                // The new bucket is empty and unreachable: fill its first slot before
                // linking it so readers find the item as soon as they see the bucket.
                if let Some(first) = self.slots(Node::Over(o)).and_then(|s| s.first()) {
                    self.set_atime(first, t);
                    first.store(v, Ordering::Release);
                    next.store(o as u32 + 1, Ordering::Release);
                    return Insert::Stored;
                }
            }
            let start = (h >> 32) as usize;
            for i in 0..slots.len() {
                let slot = &slots[(start + i) % slots.len()];
                if is_item(slot.load(Ordering::Relaxed)) {
                    return Insert::Victim(slot);
                }
            }
            return Insert::Full;
        }
    }

    /// Put `v` into a free slot of `h`'s chain, with last access time `t`.
    ///
    /// The caller holds `h`'s stripe lock (which keeps `h`'s bucket fixed).
    pub(crate) fn insert(&self, h: u64, v: u64, t: Time) -> Insert<'_> {
        let b = addr(h, self.state.load(Ordering::Acquire));
        self.insert_at(b, h, v, t)
    }

    /// Visit every item slot of the main bucket `b` and its chain.
    pub(crate) fn for_each_in_chain(&self, b: usize, mut f: impl FnMut(&AtomicU64, u64)) {
        self.walk(b, |_, slot| {
            let v = slot.load(Ordering::Acquire);
            if is_item(v) {
                f(slot, v);
            }
        });
    }

    /// Visit every slot of `b`'s chain, saying whether it is in an overflow bucket.
    fn walk<'a>(&'a self, b: usize, mut f: impl FnMut(bool, &'a AtomicU64)) {
        let mut c = Node::Main(b);
        loop {
            let Some(slots) = self.slots(c) else {
                return;
            };
            for slot in slots {
                f(matches!(c, Node::Over(_)), slot);
            }
            match self.follow(c) {
                Some(n) => c = n,
                None => return,
            }
        }
    }

    // ---- growth (one thread at a time: the engine's grow lock) ----------------------

    /// The bucket the next split would split and its level, or None at the largest size.
    pub(crate) fn next_split(&self) -> Option<(usize, u32)> {
        let s = self.state.load(Ordering::Acquire);
        (main_count(s) < self.max_main).then(|| (split_ptr(s), level(s)))
    }

    /// Split bucket `b` at level `l` (from [`Index::next_split`]): `hash` gives the hash of
    /// an item slot's key (it may read the record: the caller holds `b`'s stripe lock).
    /// Items whose bit `l` is set move to bucket `b + 2^l`, leaving `MOVED` markers here;
    /// `evict` is called with a slot (already a marker) and the item it held when the
    /// new bucket has no room, and must clear the slot. Then the state advances.
    ///
    /// The caller holds the grow lock and `b`'s stripe lock.
    pub(crate) fn split(
        &self,
        b: usize,
        l: u32,
        mut hash: impl FnMut(u64) -> Option<u64>,
        mut evict: impl FnMut(&AtomicU64, u64),
    ) {
        let s = self.state.load(Ordering::Acquire);
        if split_ptr(s) != b || level(s) != l {
            return;
        }
        let to = b + (1usize << l);
        self.work.store(b + 1, Ordering::Release);
        self.walk(b, |_, slot| {
            let v = slot.load(Ordering::Acquire);
            if !is_item(v) {
                return;
            }
            let Some(h) = hash(v) else { return };
            if h >> l & 1 == 0 {
                return;
            }
            let x = self.mark(slot);
            let t = self.time(slot).map_or(0, |c| c.load(Ordering::Relaxed));
            if !matches!(self.insert_at(to, h, x, Time::from(t)), Insert::Stored) {
                evict(slot, x);
            }
        });
        let n = if b + 1 == 1usize << l {
            u64::from(l + 1) << LEVEL_SHIFT
        } else {
            (u64::from(l) << LEVEL_SHIFT) | (b as u64 + 1)
        };
        self.state.store(n, Ordering::Release);
        self.work.store(0, Ordering::Release);
    }

    /// Mark `slot` `MOVED`; returns the item value it held (with every access bit a
    /// reader set before the mark: their compare-exchanges fail after it).
    fn mark(&self, slot: &AtomicU64) -> u64 {
        slot.fetch_or(MOVED, Ordering::AcqRel)
    }

    /// Whether main bucket `b`'s chain has an overflow bucket.
    pub(crate) fn has_overflow(&self, b: usize) -> bool {
        self.next
            .get(b)
            .is_some_and(|n| n.load(Ordering::Relaxed) != 0)
    }

    /// Compact `b`'s chain after a barrier: clear its `MOVED` markers, then move items
    /// from overflow buckets forward into free slots (marking the old slots `MOVED`).
    /// Returns whether any item moved (another barrier is then due before
    /// [`Index::release_chain`]).
    ///
    /// The caller holds the grow lock and `b`'s stripe lock, and every reader that could
    /// have seen this chain's markers has unpinned since they were set.
    pub(crate) fn compact(&self, b: usize) -> bool {
        self.clear_markers(b);
        self.work.store(b + 1, Ordering::Release);
        let mut moved = false;
        let mut free: Vec<&AtomicU64> = Vec::new();
        self.walk(b, |over, slot| {
            let v = slot.load(Ordering::Relaxed);
            if v == 0 {
                free.push(slot);
            } else if over && is_item(v) {
                // In an overflow bucket: the first free slot before it, if any.
                if !free.is_empty() {
                    let to = free.remove(0);
                    let x = self.mark(slot);
                    self.copy_atime(slot, to);
                    to.store(x, Ordering::Release);
                    moved = true;
                }
            }
        });
        self.work.store(0, Ordering::Release);
        moved
    }

    /// Clear `b`'s markers and unlink the overflow buckets of its chain left empty;
    /// returns them (to [`Index::recycle`] after one more barrier).
    ///
    /// The caller holds the grow lock and `b`'s stripe lock, and every reader that could
    /// have seen this chain's markers has unpinned since they were set.
    pub(crate) fn release_chain(&self, b: usize) -> Vec<u32> {
        self.clear_markers(b);
        let mut out = Vec::new();
        let mut prev = Node::Main(b);
        loop {
            let Some(link) = self.link(prev) else {
                return out;
            };
            let n = link.load(Ordering::Acquire);
            if n == 0 {
                return out;
            }
            let cur = Node::Over(n as usize - 1);
            let empty = self
                .slots(cur)
                .is_some_and(|s| s.iter().all(|s| s.load(Ordering::Relaxed) == 0));
            if empty {
                // Readers inside `cur` still follow its own link back into the chain;
                // it is reused only after another barrier.
                let after = self.link(cur).map_or(0, |x| x.load(Ordering::Acquire));
                link.store(after, Ordering::Release);
                out.push(n - 1);
            } else {
                prev = cur;
            }
        }
    }

    /// Overflow buckets unlinked by [`Index::release_chain`] before a barrier that no
    /// reader inside them can have survived: free to link again.
    pub(crate) fn recycle(&self, ids: Vec<u32>) {
        if !ids.is_empty() {
            self.over_free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(ids);
        }
    }

    /// Grow an index that holds no item to `nmain` main buckets at once (at most
    /// [`Index::max_main`]; never shrinks): a warm restart knows how many items are coming
    /// and skips the splits. Nothing moves, so no barrier is due; but a key's bucket
    /// changes, so the caller must be the only thread using the index (the engine checks
    /// that it is empty and holds the grow lock).
    pub(crate) fn presize(&self, nmain: usize) {
        let s = self.state.load(Ordering::Acquire);
        let n = nmain.min(self.max_main);
        if n <= main_count(s) {
            return;
        }
        let l = usize::BITS - 1 - n.leading_zeros();
        let p = n - (1usize << l);
        self.state
            .store((u64::from(l) << LEVEL_SHIFT) | p as u64, Ordering::Release);
        // The whole table is about to be written: fault it in at once.
        self.buckets.populate(n);
        self.next.populate(n);
        self.times.populate(n * SLOTS);
    }

    /// Start loading the cache lines `h`'s main bucket lives in (its slots, link and
    /// access times), for a caller that will look it up a few keys from now.
    #[inline]
    pub(crate) fn prefetch(&self, h: u64) {
        self.prefetch_slots(h);
        self.prefetch_side(h);
    }

    /// Start loading the cache line of `h`'s main bucket's slots alone (its link and access
    /// times: [`Index::prefetch_side`]), so that a batch keeps fewer loads in flight.
    #[inline]
    pub(crate) fn prefetch_slots(&self, h: u64) {
        let b = addr(h, self.state.load(Ordering::Relaxed));
        if let Some(bucket) = self.buckets.get(b) {
            prefetch(std::ptr::from_ref(bucket).cast());
        }
    }

    /// Start loading `h`'s main bucket's link and access times.
    #[inline]
    pub(crate) fn prefetch_side(&self, h: u64) {
        let b = addr(h, self.state.load(Ordering::Relaxed));
        if let (Some(next), Some(time)) = (self.next.get(b), self.times.get(b * SLOTS)) {
            prefetch(std::ptr::from_ref(next).cast());
            prefetch(std::ptr::from_ref(time).cast());
        }
    }

    /// The slot values in `h`'s main bucket with its tag (for prefetching records: no
    /// chain walk, no moved-slot handling, a hint may miss).
    #[inline]
    pub(crate) fn tagged_in_main(&self, h: u64, mut f: impl FnMut(u64)) {
        let tag = tag_of(h);
        let b = addr(h, self.state.load(Ordering::Relaxed));
        if let Some(bucket) = self.buckets.get(b) {
            for slot in &bucket.0 {
                let v = slot.load(Ordering::Relaxed);
                if is_item(v) && slot_tag(v) == tag {
                    f(v);
                }
            }
        }
    }

    fn clear_markers(&self, b: usize) {
        self.walk(b, |_, slot| {
            if slot.load(Ordering::Relaxed) & MOVED != 0 {
                slot.store(0, Ordering::Release);
            }
        });
    }
}

/// A hint to load the cache line at `p` (no effect on other architectures).
#[inline(always)]
pub(crate) fn prefetch(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and reads nothing observable,
    // whatever the address; SSE is part of x86_64's baseline.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_packing() {
        let v = pack(
            0xabcd,
            (MAX_SEGMENTS - 1) as u32,
            (MAX_OFFSET - 1) as u32,
            2,
            true,
        );
        assert!(is_valid(v) && is_item(v) && !is_item(v | MOVED));
        assert_eq!(slot_tag(v), 0xabcd);
        assert_eq!(slot_seg(v) as usize, MAX_SEGMENTS - 1);
        assert_eq!(slot_off(v), MAX_OFFSET - 1);
        assert_eq!(freq(v), 2);
        assert!(fetched(v));
        let b = bumped(bumped(v));
        assert_eq!(freq(b), FREQ_MAX);
        assert_eq!(b & IDENT_MASK, v & IDENT_MASK);
        assert_eq!((v | WIN) & IDENT_MASK, v & IDENT_MASK);
        assert_ne!((v | MOVED) & IDENT_MASK, v & IDENT_MASK);
        let z = pack(0, 0, 0, 0, false);
        assert!(is_valid(z) && z != 0 && !fetched(z) && freq(z) == 0);
    }

    #[test]
    fn addressing_follows_the_split_pointer() {
        // Level 2, split pointer 1: buckets 0..5; bucket 0 was split into 0 and 4.
        let s = (2u64 << LEVEL_SHIFT) | 1;
        assert_eq!(main_count(s), 5);
        assert_eq!(addr(0b000, s), 0);
        assert_eq!(addr(0b100, s), 4);
        assert_eq!(addr(0b101, s), 1);
        assert_eq!(addr(0b111, s), 3);
        // Splitting the last bucket of a level starts the next one.
        assert_eq!(main_count(3u64 << LEVEL_SHIFT), 8);
    }

    #[test]
    fn chains_and_lossy_overflow() {
        let idx = Index::new(16);
        // Every key in bucket 0 (low bits zero), different tags.
        let h = |i: u64| i << 30;
        let mut victims = 0;
        let n = (SLOTS * (idx.buckets.len() + 4)) as u64;
        for i in 0..n {
            let _g = idx.lock(h(i));
            let v = pack(tag_of(h(i)), i as u32, 0, 0, false);
            match idx.insert(h(i), v, i as u32) {
                Insert::Stored => {}
                Insert::Victim(slot) => {
                    assert!(is_item(slot.load(Ordering::Relaxed)));
                    slot.store(v, Ordering::Relaxed);
                    victims += 1;
                }
                Insert::Full => panic!("no markers here"),
            }
        }
        // The chain consumed the whole overflow pool before any slot was replaced.
        let chain_slots = SLOTS * (1 + idx.buckets.len() - idx.max_main);
        assert_eq!(victims as usize, n as usize - chain_slots);
        let mut seen = 0;
        idx.for_each_in_chain(0, |_, _| seen += 1);
        assert_eq!(seen, chain_slots);
        let found = idx.find(h(n - 1), |v| slot_seg(v) == (n - 1) as u32);
        assert!(found.is_some());
    }

    /// Hash of item `i` in the split tests: spread over buckets, tags distinct.
    fn test_hash(i: u64) -> u64 {
        // splitmix64's finalizer.
        let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Split the next bucket of an index of `test_hash` items (ids in the segment field);
    /// the bucket split, or None at the largest size.
    fn split_next(idx: &Index) -> Option<usize> {
        let (b, l) = idx.next_split()?;
        let _g = idx.lock_bucket(b);
        idx.split(
            b,
            l,
            |v| Some(test_hash(u64::from(slot_seg(v)))),
            |_, _| panic!("room for every moved item"),
        );
        Some(b)
    }

    /// A presized index addresses every bucket it was sized to, keeps items where they
    /// were inserted, splits on from there, never shrinks and stops at its largest size.
    #[test]
    fn presize_then_split() {
        let idx = Index::new(1 << 18);
        let start = idx.nmain();
        idx.presize(start - 1);
        assert_eq!(idx.nmain(), start, "never shrinks");
        for n in [start + 1, 3 * start + 5, 4 * start] {
            idx.presize(n);
            assert_eq!(idx.nmain(), n);
            assert!(idx.level() == usize::BITS - 1 - n.leading_zeros());
        }
        // Keys land in the buckets up to nmain (about 4 per bucket: nearly all of them
        // used) and in no other.
        let n = 4 * idx.nmain() as u64;
        let mut used = vec![false; idx.max_main()];
        for i in 0..n {
            let h = test_hash(i);
            let b = addr(h, idx.state.load(Ordering::Relaxed));
            assert!(b < idx.nmain());
            used[b] = true;
            let _g = idx.lock(h);
            let v = pack(tag_of(h), i as u32, 0, 0, false);
            assert!(matches!(idx.insert(h, v, 7), Insert::Stored), "item {i}");
        }
        let hit = used.iter().filter(|&&u| u).count();
        assert!(
            hit > idx.nmain() * 9 / 10,
            "{hit} of {} buckets used",
            idx.nmain()
        );
        assert!(
            used[idx.nmain() - 8..].iter().any(|&u| u),
            "the last buckets are used"
        );
        // Growth continues from the presized state without losing an item.
        for _ in 0..100 {
            if split_next(&idx).is_none() {
                break;
            }
        }
        assert_eq!(idx.nmain(), 4 * start + 100);
        for i in 0..n {
            let h = test_hash(i);
            assert!(
                idx.find(h, |v| slot_seg(v) == i as u32).is_some(),
                "item {i}"
            );
        }
        idx.presize(usize::MAX);
        assert_eq!(idx.nmain(), idx.max_main(), "capped at the largest size");
        assert!(idx.next_split().is_none());
    }

    #[test]
    fn splits_compaction_and_reuse_keep_every_item() {
        let idx = Index::new(1 << 16);
        let n = 40_000u64;
        let put = |i: u64| {
            let h = test_hash(i);
            let _g = idx.lock(h);
            let v = pack(tag_of(h), i as u32, 0, 0, false);
            assert!(matches!(idx.insert(h, v, 7), Insert::Stored), "item {i}");
        };
        let check = |upto: u64| {
            for i in 0..upto {
                let h = test_hash(i);
                let got = idx.find(h, |v| slot_seg(v) == i as u32);
                assert!(got.is_some(), "item {i} lost at {} buckets", idx.nmain());
            }
        };
        let start = idx.nmain();
        let mut inserted = 0;
        let mut overflow_high = 0;
        let mut recycled = 0;
        while inserted < n {
            for i in inserted..inserted + 1000 {
                put(i);
            }
            inserted += 1000;
            let mut split = Vec::new();
            while inserted as usize > idx.nmain() * SLOTS {
                let Some(b) = split_next(&idx) else {
                    break;
                };
                split.push(b);
            }
            // Markers are skipped, items found (through the new addressing).
            check(inserted);
            for &b in &split {
                let _g = idx.lock_bucket(b);
                idx.compact(b);
            }
            check(inserted);
            let mut spare = Vec::new();
            for &b in &split {
                let _g = idx.lock_bucket(b);
                spare.extend(idx.release_chain(b));
            }
            recycled += spare.len();
            idx.recycle(spare);
            check(inserted);
            overflow_high = overflow_high.max(idx.overflow_used());
        }
        assert!(
            idx.nmain() > start * 2,
            "grew from {start} to {}",
            idx.nmain()
        );
        // Every item exactly once in the chain of its bucket, no marker left.
        let mut count = 0;
        for b in 0..idx.nmain() {
            idx.walk(b, |_, slot| {
                let v = slot.load(Ordering::Relaxed);
                assert_eq!(v & MOVED, 0, "marker left in bucket {b}");
                if is_item(v) {
                    let h = test_hash(u64::from(slot_seg(v)));
                    assert_eq!(addr(h, idx.state.load(Ordering::Relaxed)), b);
                    count += 1;
                }
            });
        }
        assert_eq!(count, n);
        // Overflow buckets emptied by splits are unlinked and linked again, so their slots
        // stay fewer than half the main buckets' (each has half a main bucket's slots).
        assert!(recycled > 0);
        assert!(
            overflow_high * OVER_SLOTS < idx.nmain() * SLOTS / 2,
            "{overflow_high} overflow buckets"
        );
    }

    #[test]
    fn access_times() {
        let idx = Index::new(64);
        let h = 0x1234_5678_9abc_def0;
        let _g = idx.lock(h);
        let v = pack(tag_of(h), 1, 2, 0, false);
        assert!(matches!(idx.insert(h, v, 1_000_000), Insert::Stored));
        let (slot, _) = idx.find(h, |x| x == v).expect("inserted");
        assert_eq!(idx.atime(slot, 1_000_000), 1_000_000);
        assert_eq!(idx.atime(slot, 1_000_050), 1_000_000);
        // Exact within 65536 s; the age wraps beyond.
        assert_eq!(idx.atime(slot, 1_065_535), 1_000_000);
        assert_eq!(idx.atime(slot, 1_065_536), 1_065_536);
        idx.set_atime(slot, 1_000_077);
        assert_eq!(idx.atime(slot, 1_000_080), 1_000_077);
    }
}
