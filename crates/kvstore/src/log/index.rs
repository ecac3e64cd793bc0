//! The hash index: cache-line buckets of eight tagged 64-bit slots.
//!
//! A slot is `VALID | - | win | fetched | freq(2) | tag(16) | segment(22) | offset(20)`, or 0
//! when empty. Readers load slots atomically and never lock; writers change the location
//! bits only while holding the lock stripe of the key's main bucket. Readers change only the
//! `freq`/`fetched`/`win` bits, and only by compare-exchange, so they never undo a writer.
//! `win` ("a win token was sent for this item", meta protocol) is set by a reader's
//! compare-exchange, so exactly one reader sets it; a writer that keeps it (a rewrite of the
//! same item) carries it over with a compare-exchange loop too, never with a plain store of
//! a value it loaded earlier.
//!
//! Next to every slot the index keeps the item's last access time in a parallel table: the
//! low 16 bits of the unix time (`AtomicU16`), written before the slot is published for a
//! new item, and by readers (relaxed) on every access. It reads back as the latest time at
//! or before `now` with those low bits: exact for items accessed within the last 18 hours
//! (65536 s), the age modulo 65536 s beyond. Two bytes per slot instead of four keep the
//! index at about a fifth of `-m`.
//!
//! Every key hashes to one main bucket; when its eight slots are taken the bucket chains
//! to overflow buckets taken from a pool that is sized up front and never shrinks (an
//! overflow bucket once linked stays linked, so a reader walking a chain never lands in a
//! bucket that belongs to another chain). When the pool is exhausted the insert replaces a
//! slot of the chain (the index is lossy, as MICA's is: that item is evicted).

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::Time;
use std::sync::{Mutex, MutexGuard};

use super::mem::ZeroedSlice;

pub(crate) const SLOTS: usize = 8;

const OFF_BITS: u32 = 20;
const SEG_BITS: u32 = 22;
const TAG_SHIFT: u32 = OFF_BITS + SEG_BITS;
const FREQ_SHIFT: u32 = TAG_SHIFT + 16;
pub(crate) const FREQ_MAX: u64 = 3;
const FREQ_MASK: u64 = FREQ_MAX << FREQ_SHIFT;
pub(crate) const FETCHED: u64 = 1 << 60;
/// Meta protocol: a win token was handed out for this item.
pub(crate) const WIN: u64 = 1 << 61;
const VALID: u64 = 1 << 63;
/// The bits that name an item's location (everything but the access and win bits).
pub(crate) const IDENT_MASK: u64 = !(FREQ_MASK | FETCHED | WIN);
/// Largest segment id a slot can name.
pub(crate) const MAX_SEGMENTS: usize = 1 << SEG_BITS;
/// Largest in-segment offset + 1 a slot can name.
pub(crate) const MAX_OFFSET: usize = 1 << OFF_BITS;

#[inline]
pub(crate) fn tag_of(h: u64) -> u64 {
    h & 0xffff
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
/// `v` with one more access recorded (saturating).
#[inline]
pub(crate) fn bumped(v: u64) -> u64 {
    let f = (freq(v) + 1).min(FREQ_MAX);
    (v & !FREQ_MASK) | (f << FREQ_SHIFT) | FETCHED
}

#[derive(Default)]
#[repr(align(64))]
pub(crate) struct Bucket(pub(crate) [AtomicU64; SLOTS]);

pub(crate) struct Index {
    /// Main buckets first, then the overflow pool.
    buckets: ZeroedSlice<Bucket>,
    /// Per bucket: 1 + the overflow bucket that follows it, or 0.
    next: ZeroedSlice<AtomicU32>,
    /// Per slot (bucket * SLOTS + i): low 16 bits of the last access time of its item.
    times: ZeroedSlice<AtomicU16>,
    nmain: usize,
    over_used: AtomicUsize,
    locks: Box<[Mutex<()>]>,
}

impl Index {
    /// An index with room for about `slots` items in main buckets. Its pages become
    /// resident only as items land in them.
    pub(crate) fn new(slots: usize) -> Index {
        let nmain = slots.div_ceil(SLOTS).max(16);
        let nover = (nmain / 8).max(4);
        let nlocks = (nmain / 4).clamp(16, 4096).next_power_of_two();
        Index {
            // SAFETY: a bucket is eight AtomicU64: all-zero bytes are its default (empty
            // slots); no drop; 64-byte alignment.
            buckets: unsafe { ZeroedSlice::new(nmain + nover) },
            // SAFETY: all-zero bytes are AtomicU32's default (0: no next bucket); no drop.
            next: unsafe { ZeroedSlice::new(nmain + nover) },
            // SAFETY: all-zero bytes are AtomicU16's default; no drop.
            times: unsafe { ZeroedSlice::new((nmain + nover) * SLOTS) },
            nmain,
            over_used: AtomicUsize::new(0),
            locks: (0..nlocks).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Bytes the index occupies.
    pub(crate) fn bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
            + self.next.len() * 4
            + self.times.len() * 2
            + self.locks.len() * std::mem::size_of::<Mutex<()>>()
    }

    pub(crate) fn nmain(&self) -> usize {
        self.nmain
    }

    pub(crate) fn overflow_used(&self) -> usize {
        self.over_used
            .load(Ordering::Relaxed)
            .min(self.buckets.len() - self.nmain)
    }

    #[inline]
    fn main_bucket(&self, h: u64) -> usize {
        ((u128::from(h) * self.nmain as u128) >> 64) as usize
    }

    /// Lock the stripe that guards `h`'s bucket chain.
    pub(crate) fn lock(&self, h: u64) -> MutexGuard<'_, ()> {
        let i = self.main_bucket(h) & (self.locks.len() - 1);
        match self.locks.get(i) {
            Some(m) => m.lock().unwrap_or_else(|e| e.into_inner()),
            // Unreachable: the mask keeps `i` in range.
            None => self.locks[0].lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Call `f` on every occupied slot of `h`'s chain whose tag matches, until it returns
    /// true; returns that slot and the value `f` saw.
    #[inline]
    pub(crate) fn find(&self, h: u64, mut f: impl FnMut(u64) -> bool) -> Option<(&AtomicU64, u64)> {
        let tag = tag_of(h);
        let mut b = self.main_bucket(h);
        loop {
            let bucket = self.buckets.get(b)?;
            for slot in &bucket.0 {
                let v = slot.load(Ordering::Acquire);
                if is_valid(v) && slot_tag(v) == tag && f(v) {
                    return Some((slot, v));
                }
            }
            let n = self.next.get(b)?.load(Ordering::Acquire);
            if n == 0 {
                return None;
            }
            b = n as usize - 1;
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

    /// Put `v` into a free slot of `h`'s chain, with last access time `t` (stored before
    /// the slot is published). When the chain is full and the overflow pool is exhausted,
    /// nothing is stored and a slot of the chain is returned instead: the caller evicts
    /// its item and stores `v` there.
    ///
    /// The caller holds `h`'s stripe lock.
    pub(crate) fn insert(&self, h: u64, v: u64, t: Time) -> Option<&AtomicU64> {
        let mut b = self.main_bucket(h);
        loop {
            let bucket = self.buckets.get(b)?;
            for slot in &bucket.0 {
                if slot.load(Ordering::Relaxed) == 0 {
                    self.set_atime(slot, t);
                    slot.store(v, Ordering::Release);
                    return None;
                }
            }
            let next = self.next.get(b)?;
            let n = next.load(Ordering::Acquire);
            if n != 0 {
                b = n as usize - 1;
                continue;
            }
            // End of the chain: link a fresh overflow bucket, or replace a slot here.
            let o = self.over_used.fetch_add(1, Ordering::Relaxed);
            let nb = self.nmain + o;
            if nb < self.buckets.len() {
                // The new bucket has never been used, so it is all zero: fill its first
                // slot before linking it so readers find the item as soon as they see it.
                self.set_atime(&self.buckets[nb].0[0], t);
                self.buckets[nb].0[0].store(v, Ordering::Release);
                next.store(nb as u32 + 1, Ordering::Release);
                return None;
            }
            return bucket.0.get((h as usize >> 16) % SLOTS);
        }
    }

    /// Visit every occupied slot of the main bucket `b` and its chain.
    pub(crate) fn for_each_in_chain(&self, b: usize, mut f: impl FnMut(&AtomicU64, u64)) {
        let mut b = b;
        loop {
            let Some(bucket) = self.buckets.get(b) else {
                return;
            };
            for slot in &bucket.0 {
                let v = slot.load(Ordering::Acquire);
                if is_valid(v) {
                    f(slot, v);
                }
            }
            let n = self.next.get(b).map_or(0, |n| n.load(Ordering::Acquire));
            if n == 0 {
                return;
            }
            b = n as usize - 1;
        }
    }

    /// Lock the stripe of main bucket `b` (for scans that walk buckets, not keys).
    pub(crate) fn lock_bucket(&self, b: usize) -> MutexGuard<'_, ()> {
        let i = b & (self.locks.len() - 1);
        match self.locks.get(i) {
            Some(m) => m.lock().unwrap_or_else(|e| e.into_inner()),
            None => self.locks[0].lock().unwrap_or_else(|e| e.into_inner()),
        }
    }
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
        assert!(is_valid(v));
        assert_eq!(slot_tag(v), 0xabcd);
        assert_eq!(slot_seg(v) as usize, MAX_SEGMENTS - 1);
        assert_eq!(slot_off(v), MAX_OFFSET - 1);
        assert_eq!(freq(v), 2);
        assert!(fetched(v));
        let b = bumped(bumped(v));
        assert_eq!(freq(b), FREQ_MAX);
        assert_eq!(b & IDENT_MASK, v & IDENT_MASK);
        assert_eq!((v | WIN) & IDENT_MASK, v & IDENT_MASK);
        let z = pack(0, 0, 0, 0, false);
        assert!(is_valid(z) && z != 0 && !fetched(z) && freq(z) == 0);
    }

    #[test]
    fn chains_and_lossy_overflow() {
        let idx = Index::new(16);
        // Every key in the same main bucket: h's high bits pick the bucket.
        let h = |i: u64| (i << 16) | 0x77;
        let mut victims = 0;
        let n = (SLOTS * (idx.buckets.len() + 4)) as u64;
        for i in 0..n {
            let _g = idx.lock(h(i));
            let v = pack(0x77, i as u32, 0, 0, false);
            if let Some(slot) = idx.insert(h(i), v, i as u32) {
                assert!(is_valid(slot.load(Ordering::Relaxed)));
                slot.store(v, Ordering::Relaxed);
                victims += 1;
            }
        }
        // The chain consumed the whole overflow pool before any slot was replaced.
        let chain_slots = SLOTS * (1 + idx.buckets.len() - idx.nmain);
        assert_eq!(victims as usize, n as usize - chain_slots);
        let mut seen = 0;
        idx.for_each_in_chain(idx.main_bucket(h(0)), |_, _| seen += 1);
        assert_eq!(seen, chain_slots);
        // find stops at the first match.
        let found = idx.find(h(0), |v| slot_seg(v) == (n - 1) as u32);
        assert!(found.is_some());
    }

    #[test]
    fn access_times() {
        let idx = Index::new(64);
        let h = 0x1234_5678_9abc_def0;
        let _g = idx.lock(h);
        let v = pack(tag_of(h), 1, 2, 0, false);
        assert!(idx.insert(h, v, 1_000_000).is_none());
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
