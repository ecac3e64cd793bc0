//! A count-min sketch of how often keys were stored while absent (a miss, then a set, in a
//! look-aside cache): the memory of keys that left the cache, which the index forgets.
//!
//! Four-bit counters, sixteen to an `AtomicU64`, two counters per key picked from the
//! key's hash; a key's estimate is the smaller of its two. After every `counters / 4`
//! additions all counters are halved (by the engine's background pass, `halve_if_due`),
//! so the sketch follows the recent past (TinyLFU's reset). Updates
//! are compare-exchanges on one word at a time: two threads adding to the same word at
//! once both count, and a halving that races an addition may lose that one addition,
//! which only makes an estimate a little low.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::mem::ZeroedSlice;
use super::sync::{tid, Padded};

/// Additions between halvings: this fraction of the counters, so that at most a quarter
/// of them is nonzero for each key seen once, and a key never seen has both its counters
/// nonzero (a false positive) about one time in 20 at worst.
const PERIOD_DIV: usize = 4;
/// Counters per word.
const PER_WORD: usize = 16;
/// Each counter's high bit cleared: what a halving keeps after the shift.
const LOW3: u64 = 0x7777_7777_7777_7777;
/// Cells of the addition count (per thread, so that writers share no counter).
const ADD_CELLS: usize = 16;
/// A writer sums the cells to see whether it must halve once per this many of its own
/// additions (a power of two, dividing every period).
const CHECK_EVERY: u64 = 256;

pub(super) struct MissSketch {
    /// In an anonymous mapping, reserved for the most counters the sketch may grow to: a
    /// page costs memory once a counter in it was counted.
    words: ZeroedSlice<AtomicU64>,
    /// Counters in use - 1 (a power of two): the counters are the first `mask + 1`.
    mask: AtomicU64,
    /// The most words ever in use (those a halving must look at, and the memory held).
    used_words: AtomicUsize,
    /// Additions, per thread: their sum is the count.
    adds: Box<[Padded<AtomicU64>]>,
    /// The count of additions when the counters were last halved.
    halved_at: AtomicU64,
    /// Additions between halvings.
    period: AtomicU64,
}

impl MissSketch {
    /// A sketch of `counters` counters, able to grow to `most` ([`MissSketch::resize`]);
    /// both are rounded up to a power of two, at least 1024.
    pub(super) fn new(counters: usize, most: usize) -> MissSketch {
        let most = most.max(counters).max(1024).next_power_of_two();
        let s = MissSketch {
            // SAFETY: an all-zero AtomicU64 is a valid zero, and it has no drop glue.
            words: unsafe { ZeroedSlice::new(most / PER_WORD) },
            mask: AtomicU64::new(0),
            used_words: AtomicUsize::new(0),
            adds: (0..ADD_CELLS).map(|_| Padded::default()).collect(),
            halved_at: AtomicU64::new(0),
            period: AtomicU64::new(0),
        };
        s.resize(counters);
        s
    }

    /// Use `counters` counters (rounded up to a power of two, at least 1024, at most what
    /// the sketch was made for), as the memory limit changes. Keys then map to other
    /// counters, so what the sketch remembered is mostly forgotten, as after a few
    /// halvings; counters no longer in use keep their pages until they decay to zero.
    pub(super) fn resize(&self, counters: usize) {
        let counters = counters
            .max(1024)
            .next_power_of_two()
            .min(self.words.len() * PER_WORD);
        let mask = counters as u64 - 1;
        if self.mask.swap(mask, Ordering::Relaxed) == mask {
            return;
        }
        self.used_words
            .fetch_max(counters / PER_WORD, Ordering::Relaxed);
        self.period
            .store((counters / PERIOD_DIV) as u64, Ordering::Relaxed);
        self.halved_at.store(self.adds(), Ordering::Relaxed);
    }

    /// Counters in use.
    #[cfg(test)]
    pub(super) fn counters(&self) -> u64 {
        self.mask.load(Ordering::Relaxed) + 1
    }

    /// Bytes the counters take: the most ever in use.
    pub(super) fn bytes(&self) -> usize {
        self.used_words.load(Ordering::Relaxed) * 8
    }

    /// The two counters of the key hashed to `h`: (word, shift) pairs.
    #[inline]
    fn cells(&self, h: u64) -> [(usize, u32); 2] {
        // The index takes the hash's low bits for the bucket and a tag from the middle:
        // remix so the sketch's counters are independent of the bucket.
        let x = (h ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let x = x ^ (x >> 32);
        let mask = self.mask.load(Ordering::Relaxed);
        let a = x & mask;
        let b = (x.rotate_left(32).wrapping_mul(0x94d0_49bb_1331_11eb) >> 16) & mask;
        [a, b].map(|c| ((c as usize) / PER_WORD, (c as u32 % PER_WORD as u32) * 4))
    }

    /// The key's estimated count (0-15); `add` returns it as it counts.
    #[cfg(test)]
    fn estimate(&self, h: u64) -> u64 {
        self.estimate_at(&self.cells(h))
    }

    /// The smaller of two counters.
    #[inline]
    fn estimate_at(&self, cells: &[(usize, u32); 2]) -> u64 {
        cells
            .iter()
            .map(|&(w, s)| {
                self.words
                    .get(w)
                    .map_or(0, |x| x.load(Ordering::Relaxed) >> s & 15)
            })
            .min()
            .unwrap_or(0)
    }

    /// Count one more for the key (the smaller counter, or both when equal: conservative
    /// update), halving every counter once per period; the key's estimate before this one.
    pub(super) fn add(&self, h: u64) -> u64 {
        let cells = self.cells(h);
        let est = self.estimate_at(&cells);
        if est < 15 {
            for (w, s) in cells {
                if let Some(word) = self.words.get(w) {
                    let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
                        (x >> s & 15 == est).then(|| x + (1 << s))
                    });
                }
            }
        }
        // The background pass halves (`halve_if_due`); a writer only does when that pass
        // is two periods late (an engine nobody maintains), and looks only now and then.
        let mine = self.adds[tid() % ADD_CELLS]
            .0
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        if mine % CHECK_EVERY == 0 {
            let adds = self.adds();
            // A halving may have recorded a count newer than this one: saturate.
            let period = self.period.load(Ordering::Relaxed);
            if adds.saturating_sub(self.halved_at.load(Ordering::Relaxed)) >= 2 * period {
                self.halve_at(adds);
            }
        }
        est
    }

    /// Additions so far.
    fn adds(&self) -> u64 {
        self.adds.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }

    /// Halve every counter if a period of additions passed since the last halving. Bounded
    /// work (one pass over the counters), for the background pass rather than a writer.
    pub(super) fn halve_if_due(&self) {
        let adds = self.adds();
        if adds.saturating_sub(self.halved_at.load(Ordering::Relaxed))
            >= self.period.load(Ordering::Relaxed)
        {
            self.halve_at(adds);
        }
    }

    /// Halve, once for the additions up to `adds` (a racing caller that lost does nothing).
    fn halve_at(&self, adds: u64) {
        let last = self.halved_at.load(Ordering::Relaxed);
        if adds > last
            && self
                .halved_at
                .compare_exchange(last, adds, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.halve();
        }
    }

    fn halve(&self) {
        let used = self.used_words.load(Ordering::Relaxed);
        for w in self.words.iter().take(used) {
            // Words still zero are left alone, so their pages stay untouched.
            if w.load(Ordering::Relaxed) != 0 {
                let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
                    Some(x >> 1 & LOW3)
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_saturate_and_halve() {
        let s = MissSketch::new(1 << 12, 1 << 12);
        let h = 0x1234_5678_9abc_def0;
        assert_eq!(s.estimate(h), 0);
        for i in 1..=20 {
            s.add(h);
            assert_eq!(s.estimate(h), i.min(15));
        }
        // Another key is (almost surely) not counted.
        assert_eq!(s.estimate(0x0fed_cba9_8765_4321), 0);
        s.halve();
        assert_eq!(s.estimate(h), 7);
        // Halving waits for a period of additions, and for the background pass.
        s.halve_if_due();
        assert_eq!(s.estimate(h), 7);
        let period = s.period.load(Ordering::Relaxed);
        for i in 0..period {
            s.add(0x9999_0000 + i * 0x1_0000_0001);
        }
        let e = s.estimate(h);
        assert!(e >= 7, "{e}");
        s.halve_if_due();
        let e = s.estimate(h);
        assert!((3..7).contains(&e), "{e}");
        // Two periods without the background pass: a writer halves (it looks once per
        // `CHECK_EVERY` of its additions).
        for i in 0..2 * period + CHECK_EVERY {
            s.add(0x7777_0000 + i * 0x1_0000_0001);
        }
        assert!(s.estimate(h) < e, "{e}");
    }

    #[test]
    fn resizes_with_the_memory_limit() {
        let s = MissSketch::new(1 << 12, 1 << 16);
        assert_eq!((s.counters(), s.bytes()), (1 << 12, (1 << 12) / 2));
        let h = 0x1234_5678_9abc_def0;
        for _ in 0..5 {
            s.add(h);
        }
        assert_eq!(s.estimate(h), 5);
        // Grown: more counters, a longer period, the memory they may take counted.
        s.resize(1 << 15);
        assert_eq!(s.counters(), 1 << 15);
        assert_eq!(
            s.period.load(Ordering::Relaxed),
            (1 << 15) / PERIOD_DIV as u64
        );
        assert_eq!(s.bytes(), (1 << 15) / 2);
        // Keys spread over all of them: some land beyond the first 4,096.
        let beyond = (0..1000u64)
            .map(|i| s.cells(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .filter(|c| c.iter().any(|&(w, _)| w >= (1 << 12) / PER_WORD))
            .count();
        assert!(beyond > 500, "{beyond}");
        // At most what it was made for; shrunk, it keeps counting the memory it touched.
        s.resize(1 << 20);
        assert_eq!(s.counters(), 1 << 16);
        s.resize(1 << 10);
        assert_eq!(s.counters(), 1 << 10);
        assert_eq!(s.bytes(), (1 << 16) / 2);
        for i in 0..5000u64 {
            let c = s.cells(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            assert!(c.iter().all(|&(w, _)| w < (1 << 10) / PER_WORD));
        }
    }
}
