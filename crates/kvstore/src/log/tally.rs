//! Live items tallied by size: per size band (the server gives memcached's slab class
//! sizes, so `stats items` and `stats slabs` report per class from the real items) and,
//! when asked, per 32-byte step of size (`stats sizes` with `-o track_sizes`).
//!
//! An item's size is memcached's ([`crate::item_size`]), computed from the record when the
//! index gains it and again when the index loses it, so the two always agree. Counts live
//! in cells picked by thread, as the engine's live items do (`stats.rs`): no lock and no
//! shared cache line on the request path; a reader sums the cells (a cell alone may go
//! negative).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use super::sync::{tid, Padded};

/// Size bands at most (memcached's classes are 1 to 63).
pub const MAX_BANDS: usize = 64;
/// `stats sizes` steps, as memcached's (items.c `item_stats_sizes_add`).
pub const SIZE_STEP: usize = 32;
/// Cells of the size steps: each is `item_size_max / 32` counters, so fewer than the
/// engine's (`stats.rs`).
const STEP_CELLS: usize = 4;

struct Cell {
    items: [AtomicI64; MAX_BANDS],
    bytes: [AtomicI64; MAX_BANDS],
    evicted: [AtomicU64; MAX_BANDS],
    reclaimed: [AtomicU64; MAX_BANDS],
    crawler_reclaimed: [AtomicU64; MAX_BANDS],
}

impl Default for Cell {
    fn default() -> Cell {
        Cell {
            items: std::array::from_fn(|_| AtomicI64::new(0)),
            bytes: std::array::from_fn(|_| AtomicI64::new(0)),
            evicted: std::array::from_fn(|_| AtomicU64::new(0)),
            reclaimed: std::array::from_fn(|_| AtomicU64::new(0)),
            crawler_reclaimed: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// One band's figures, summed over cells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Band {
    /// Live items whose size falls in the band.
    pub items: u64,
    /// Their sizes, summed (memcached's `mem_requested`).
    pub bytes: u64,
    /// Items of the band evicted since the start (or `stats reset`).
    pub evicted: u64,
    /// Expired or flushed items of the band taken out of the index since the start (or
    /// `stats reset`): memcached's `reclaimed`.
    pub reclaimed: u64,
    /// Of those, the ones the background sweep found (memcached's `crawler_reclaimed`).
    pub crawler_reclaimed: u64,
    /// The band has held an item since the start (memcached keeps a class's slab pages
    /// once it has any, and lists the class in `stats slabs` from then on).
    pub used: bool,
}

pub(super) struct Tally {
    /// Upper bounds of the bands (inclusive), ascending; a larger item counts in the last.
    bounds: Box<[u32]>,
    cells: Box<[Padded<Cell>]>,
    /// Bands that have held an item (set once, read on every add: a line that is shared,
    /// not written, on the request path).
    used: [AtomicBool; MAX_BANDS],
    /// Items per size step (`ceil(size / 32)`), when tracked.
    steps: Option<Box<[Box<[AtomicI64]>]>>,
}

impl Tally {
    /// Bands bounded by `bounds` (at most [`MAX_BANDS`], ascending; extra ones are
    /// dropped); size steps up to `max_size` when `steps`.
    pub(super) fn new(bounds: &[u32], cells: usize, steps: bool, max_size: usize) -> Tally {
        let mut b: Vec<u32> = Vec::with_capacity(bounds.len().min(MAX_BANDS));
        for &x in bounds {
            if b.len() < MAX_BANDS && b.last().is_none_or(|l| x > *l) {
                b.push(x);
            }
        }
        if b.is_empty() {
            b.push(u32::MAX);
        }
        // Every size up to `max_size` has its step (memcached's table is one short when
        // -I is not a multiple of 32, and so leaves its largest items out).
        let nsteps = max_size.div_ceil(SIZE_STEP) + 1;
        Tally {
            bounds: b.into_boxed_slice(),
            cells: (0..cells.max(1)).map(|_| Padded::default()).collect(),
            used: std::array::from_fn(|_| AtomicBool::new(false)),
            steps: steps.then(|| {
                (0..STEP_CELLS)
                    .map(|_| (0..nsteps).map(|_| AtomicI64::new(0)).collect())
                    .collect()
            }),
        }
    }

    fn band(&self, size: usize) -> usize {
        let i = self.bounds.partition_point(|b| (*b as usize) < size);
        i.min(self.bounds.len() - 1)
    }

    fn cell(&self) -> &Cell {
        &self.cells[tid() % self.cells.len()].0
    }

    /// An item of `size` bytes joined (`delta` 1) or left (-1) the index.
    pub(super) fn count(&self, size: usize, delta: i64) {
        let b = self.band(size);
        if delta > 0 && !self.used[b].load(Ordering::Relaxed) {
            self.used[b].store(true, Ordering::Relaxed);
        }
        let cell = self.cell();
        cell.items[b].fetch_add(delta, Ordering::Relaxed);
        cell.bytes[b].fetch_add(delta * size as i64, Ordering::Relaxed);
        if let Some(steps) = &self.steps {
            let cells = &steps[tid() % steps.len()];
            if let Some(c) = cells.get(size.div_ceil(SIZE_STEP)) {
                c.fetch_add(delta, Ordering::Relaxed);
            }
        }
    }

    /// An item of `size` bytes was evicted (after [`Tally::count`] took it out).
    pub(super) fn evicted(&self, size: usize) {
        self.cell().evicted[self.band(size)].fetch_add(1, Ordering::Relaxed);
    }

    /// An expired or flushed item of `size` bytes left the index (after [`Tally::count`]
    /// took it out); `crawler`: the background sweep found it.
    pub(super) fn reclaimed(&self, size: usize, crawler: bool) {
        let (b, cell) = (self.band(size), self.cell());
        cell.reclaimed[b].fetch_add(1, Ordering::Relaxed);
        if crawler {
            cell.crawler_reclaimed[b].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn reset(&self) {
        for c in self.cells.iter() {
            for e in
                c.0.evicted
                    .iter()
                    .chain(&c.0.reclaimed)
                    .chain(&c.0.crawler_reclaimed)
            {
                e.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Every band's figures, in band order.
    pub(super) fn bands(&self) -> Vec<Band> {
        (0..self.bounds.len())
            .map(|b| {
                let sum = |f: &dyn Fn(&Cell) -> i64| -> u64 {
                    let s: i64 = self.cells.iter().map(|c| f(&c.0)).sum();
                    s.max(0) as u64
                };
                Band {
                    items: sum(&|c| c.items[b].load(Ordering::Relaxed)),
                    bytes: sum(&|c| c.bytes[b].load(Ordering::Relaxed)),
                    evicted: self
                        .cells
                        .iter()
                        .map(|c| c.0.evicted[b].load(Ordering::Relaxed))
                        .sum(),
                    reclaimed: self
                        .cells
                        .iter()
                        .map(|c| c.0.reclaimed[b].load(Ordering::Relaxed))
                        .sum(),
                    crawler_reclaimed: self
                        .cells
                        .iter()
                        .map(|c| c.0.crawler_reclaimed[b].load(Ordering::Relaxed))
                        .sum(),
                    used: self.used[b].load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// (step, items) for every size step holding items, the step being the size rounded
    /// up to 32 bytes; `None` when steps are not tracked.
    pub(super) fn steps(&self) -> Option<Vec<(usize, u64)>> {
        let steps = self.steps.as_ref()?;
        let n = steps.first().map_or(0, |s| s.len());
        Some(
            (0..n)
                .filter_map(|i| {
                    let s: i64 = steps.iter().map(|c| c[i].load(Ordering::Relaxed)).sum();
                    (s > 0).then_some((i * SIZE_STEP, s as u64))
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_and_steps_count_what_joins_and_leaves() {
        let t = Tally::new(&[96, 120, 152], 3, true, 1000);
        for size in [50, 96, 97, 120, 500, 500] {
            t.count(size, 1);
        }
        t.count(97, -1);
        t.evicted(97);
        let b = t.bands();
        assert_eq!(b.len(), 3);
        assert_eq!((b[0].items, b[0].bytes), (2, 146));
        assert_eq!((b[1].items, b[1].bytes, b[1].evicted), (1, 120, 1));
        // Larger than every bound: the last band.
        assert_eq!((b[2].items, b[2].bytes), (2, 1000));
        let s = t.steps().unwrap_or_default();
        assert_eq!(s, vec![(64, 1), (96, 1), (128, 1), (512, 2)]);
        t.reset();
        assert_eq!(t.bands()[1].evicted, 0);
        assert!(Tally::new(&[96], 1, false, 1000).steps().is_none());
    }

    #[test]
    fn bounds_out_of_order_or_too_many_are_dropped() {
        let many: Vec<u32> = (1..200).collect();
        assert_eq!(Tally::new(&many, 1, false, 0).bands().len(), MAX_BANDS);
        assert_eq!(Tally::new(&[96, 90, 120], 1, false, 0).bands().len(), 2);
        assert_eq!(Tally::new(&[], 1, false, 0).bands().len(), 1);
    }
}
