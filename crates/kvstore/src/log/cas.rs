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
//! Three rules keep the orderings:
//!
//! - **Per key.** Each lock stripe of the index keeps a *floor*: one more than the highest
//!   unique any record of the stripe's keys was written with (drawn here, replicated or
//!   restored), or a tombstone's unique. A writer holds the key's stripe lock while it draws,
//!   and a unique below the floor is not used: the thread takes a fresh range, which starts
//!   above everything reserved so far. So a key's records increase, and a store after a
//!   delete gets at least the tombstone's unique.
//! - **Flushes.** A flush's watermark is [`CasClock::issued`]: at least every unique handed
//!   out so far, read from the cells. A draw below the watermarks takes a fresh range, so a
//!   store that follows a flush is never flushed by it.
//! - **Uniques from elsewhere** (a replica applying its master's records, a warm restart)
//!   are [`CasClock::observe`]d: the counter and the flush bound move past them.
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

    /// A bound above every unique handed out so far (a flush's watermark). Uniques drawn
    /// after it returns are at or above it only if the draw checks it as a floor, which
    /// [`super::LogEngine`] does with its flush marks.
    pub(super) fn issued(&self) -> u64 {
        let counter = self.counter.load(Ordering::SeqCst);
        if counter >= PACK_MAX - RANGE {
            return counter;
        }
        let cells = self
            .cells
            .iter()
            .map(|c| c.0.load(Ordering::SeqCst) >> LEFT_BITS)
            .max()
            .unwrap_or(0);
        cells.max(self.seen.load(Ordering::SeqCst)).max(1)
    }

    /// A bound above every unique handed out and every unique in a thread's range: what no
    /// draw from now on goes below unless told a lower floor (segment bases, the replication
    /// header, a tombstone for a key that is not here).
    pub(super) fn reserved(&self) -> u64 {
        self.counter.load(Ordering::SeqCst)
    }

    /// Uniques up to `next - 1` were used elsewhere (a replica's master, a saved file).
    pub(super) fn observe(&self, next: u64) {
        self.counter.fetch_max(next, Ordering::SeqCst);
        self.seen.fetch_max(next, Ordering::SeqCst);
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
        assert_eq!(c.issued(), 3 * RANGE + 6);
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
    fn issued_bounds_every_drawn_unique_and_observed_ones() {
        let c = CasClock::new();
        let mut max = 0;
        for _ in 0..10 {
            max = max.max(c.draw(0));
        }
        assert!(c.issued() > max);
        c.observe(5_000);
        assert!(c.issued() >= 5_000);
        assert!(c.draw(0) < 5_000, "a draw with no floor keeps its range");
        assert!(c.draw(c.issued()) >= 5_000);
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
                                floor = c.issued();
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
        assert!(c.issued() > max);
    }
}
