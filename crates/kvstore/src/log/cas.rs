//! CAS uniques without a shared counter on the write path.
//!
//! Every successful write draws a CAS unique (FORMAT.md, "CAS / version"). The uniques must
//! be unique across the engine, and increasing per key: replay, replicas and tombstones order
//! a key's records by them. A flush marks every unique drawn before it dead. Drawing each
//! one from a single atomic counter would make every writer thread write the same cache line.
//!
//! Instead each thread draws from a *range* of [`RANGE`] uniques, reserved from the shared
//! counter one range at a time and kept in a cell of its own (cells are picked by thread, as
//! the engine's other per-thread counters are). Ranges are disjoint, so uniques are unique.
//! Four rules keep the orderings:
//!
//! - **Segments.** A segment reserves a block of uniques as large as it is when it opens
//!   ([`CasClock::reserve_block`]): each place in it names one, so a record written where its
//!   place's unique is good enough stores none (`format::natural_cas`). Writes into
//!   segments opened at different times are not in the order of their uniques, so:
//! - **Per key.** A new record's unique is above the key's current record's (the writer
//!   holds the key's stripe lock and sees it), and at or above its stripe's *floor*: one
//!   more than the version of any record of the stripe's keys that left the index (expired,
//!   flushed, evicted: `note_removed`), or a tombstone's unique. A place's unique below that
//!   is not used: the writer draws one here instead, from a fresh range if its own is
//!   below. So a key's records increase, and a store after a delete gets at least the
//!   tombstone's unique.
//! - **From elsewhere.** Uniques a replica applies or a warm restart loads are
//!   [`CasClock::observe`]d: the counter moves past them, and so does every write of the
//!   engine's own ([`CasClock::seen`] is a floor, like a flush's).
//! - **Flushes.** A flush's watermark is [`CasClock::reserved`]: above every unique handed
//!   out or reserved so far. A draw below the watermarks takes a fresh range, and a place
//!   below them is not used, so a store that follows a flush is never flushed by it.
//!
//! A single thread therefore draws 1, 2, 3, ... exactly as one counter would; threads that
//! write the same stripes take a fresh range more often, which is no worse than the shared
//! counter they replace.

use std::sync::atomic::{AtomicU64, Ordering};

use super::sync::{tid, Padded};

/// Uniques a thread reserves at a time.
const RANGE: u64 = 64;
/// A cell packs the next unique (high bits) and how many are left in its range (low bits).
const LEFT_BITS: u32 = 8;
const LEFT_MASK: u64 = (1 << LEFT_BITS) - 1;
/// Uniques from here on are not cached (they would not fit a cell); every draw then takes
/// the counter itself. 2^56 uniques last 2,000 years at a million writes a second.
const PACK_MAX: u64 = 1 << (64 - LEFT_BITS);
/// Cells; threads beyond this share (correct, only slower).
const CELLS: usize = 64;

const _: () = assert!(RANGE <= LEFT_MASK);

pub(super) struct CasClock {
    /// Every unique below this has been reserved (drawn, or in some thread's range).
    counter: AtomicU64,
    /// Per thread: `next << LEFT_BITS | left`. `next` only grows.
    cells: Box<[Padded<AtomicU64>]>,
    /// One more than the highest unique observed from elsewhere.
    seen: AtomicU64,
}

impl CasClock {
    pub(super) fn new() -> CasClock {
        CasClock {
            counter: AtomicU64::new(1),
            cells: (0..CELLS).map(|_| Padded::default()).collect(),
            seen: AtomicU64::new(0),
        }
    }

    /// A new unique, at least `floor`.
    #[inline]
    pub(super) fn draw(&self, floor: u64) -> u64 {
        let cell = &self.cells[tid() % self.cells.len()].0;
        let mut x = cell.load(Ordering::Relaxed);
        loop {
            let (next, left) = (x >> LEFT_BITS, x & LEFT_MASK);
            if left == 0 || next < floor {
                break;
            }
            // One unique out of the range: next + 1, one fewer left.
            match cell.compare_exchange_weak(
                x,
                x + (1 << LEFT_BITS) - 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(now) => x = now,
            }
        }
        self.refill(cell, floor)
    }

    #[cold]
    fn refill(&self, cell: &AtomicU64, floor: u64) -> u64 {
        loop {
            let start = self.counter.fetch_add(RANGE, Ordering::SeqCst);
            if start < floor {
                // The floor came from elsewhere (a replica's master) and the counter had
                // not caught up: move it past, and reserve again.
                self.counter.fetch_max(floor, Ordering::SeqCst);
                continue;
            }
            if start >= PACK_MAX - RANGE {
                return start;
            }
            // `fetch_max`: a thread sharing the cell that reserved an older range must not
            // put the cell's `next` back below a unique this one hands out.
            cell.fetch_max(((start + 1) << LEFT_BITS) | (RANGE - 1), Ordering::SeqCst);
            return start;
        }
    }

    /// A bound above every unique handed out and every unique in a thread's range or a
    /// segment's block: what no draw from now on goes below unless told a lower floor (the
    /// replication header, a tombstone for a key that is not here), and a flush's watermark.
    pub(super) fn reserved(&self) -> u64 {
        self.counter.load(Ordering::SeqCst)
    }

    /// Reserve `n` consecutive uniques (a segment's places); returns the first.
    pub(super) fn reserve_block(&self, n: u64) -> u64 {
        self.counter.fetch_add(n.max(1), Ordering::SeqCst)
    }

    /// Uniques up to `next - 1` were used elsewhere (a replica's master, a saved file).
    pub(super) fn observe(&self, next: u64) {
        self.counter.fetch_max(next, Ordering::SeqCst);
        self.seen.fetch_max(next, Ordering::SeqCst);
    }

    /// One more than the highest unique observed from elsewhere: a write of this engine's
    /// own goes at or above it (a promoted replica's above every version it holds, a warm
    /// restart's above every one it loaded), even where its place's unique is lower.
    pub(super) fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn one_thread_draws_in_order_across_ranges() {
        let c = CasClock::new();
        for want in 1..=3 * RANGE + 5 {
            assert_eq!(c.draw(0), want);
        }
        assert_eq!(c.reserved(), 4 * RANGE + 1);
    }

    #[test]
    fn a_floor_above_the_range_takes_a_fresh_one() {
        let c = CasClock::new();
        assert_eq!(c.draw(0), 1);
        // Another thread's range (or a tombstone) put this stripe's floor at 100.
        c.observe(100);
        let v = c.draw(100);
        assert!(v >= 100, "{v}");
        assert_eq!(c.draw(0), v + 1, "the fresh range is used from then on");
        // A floor the counter has not reached is passed.
        let far = c.reserved() + 10 * RANGE;
        assert!(c.draw(far) >= far);
    }

    #[test]
    fn reserved_bounds_every_drawn_unique_block_and_observed_one() {
        let c = CasClock::new();
        let mut max = 0;
        for _ in 0..10 {
            max = max.max(c.draw(0));
        }
        assert!(c.reserved() > max);
        c.observe(5_000);
        assert!(c.reserved() >= 5_000);
        assert!(c.draw(0) < 5_000, "a draw with no floor keeps its range");
        assert!(c.draw(c.reserved()) >= 5_000);
        // A segment's block lies above everything reserved before and below the bound.
        let before = c.reserved();
        let block = c.reserve_block(1 << 20);
        assert!(block >= before && c.reserved() >= block + (1 << 20));
        assert!(
            c.draw(0) < block,
            "a thread's range reserved before stays below"
        );
    }

    #[test]
    fn uniques_are_unique_across_threads() {
        let c = CasClock::new();
        let all: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    let c = &c;
                    s.spawn(move || {
                        let mut got = Vec::new();
                        let mut floor = 0;
                        for i in 0..20_000u64 {
                            let v = c.draw(floor);
                            assert!(v >= floor);
                            got.push(v);
                            // Now and then, a floor as another thread's write would set.
                            if (i + t) % 97 == 0 {
                                floor = c.reserved();
                            }
                        }
                        got
                    })
                })
                .collect();
            hs.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        assert_eq!(all.len(), 4);
        let mut set = HashSet::new();
        for v in all.iter().flatten() {
            assert!(set.insert(*v), "{v} drawn twice");
        }
        let max = set.iter().copied().max().unwrap_or(0);
        assert!(c.reserved() > max);
    }
}
