//! Where the background sweep (`maintain`) is in the index, and what it knows of flushes.
//!
//! The sweep scans a bounded slice of the index's main buckets per call, continuing where
//! the last call stopped. Once a whole pass has gone by under the same `flush_all`
//! watermarks, no indexed item is below them (each one found was unlinked, and items
//! stored since are above them), so only expiry can make an item dead and a segment whose
//! earliest expiry is still ahead needs no reading.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::sync::lock;

pub(super) struct Sweep {
    cursor: AtomicUsize,
    marks: Mutex<Marks>,
}

/// The flush watermarks the sweep last saw, and the buckets it has scanned since they
/// changed.
struct Marks {
    seen: (u64, u64),
    scanned: usize,
}

impl Default for Sweep {
    fn default() -> Sweep {
        Sweep {
            cursor: AtomicUsize::new(0),
            marks: Mutex::new(Marks {
                seen: (0, 0),
                // Nothing is below watermarks of 0: no pass is owed.
                scanned: usize::MAX,
            }),
        }
    }
}

impl Sweep {
    /// The next slice: `chunk` buckets of `nmain` starting at the returned one, under the
    /// flush watermarks `marks`. The flag says whether every item of the slice must be
    /// read (a pass since the watermarks last changed is not complete yet).
    pub(super) fn next(&self, nmain: usize, chunk: usize, marks: (u64, u64)) -> (usize, bool) {
        let start = self.cursor.fetch_add(chunk, Ordering::Relaxed) % nmain.max(1);
        let mut m = lock(&self.marks);
        if m.seen != marks {
            m.seen = marks;
            m.scanned = 0;
        }
        let every = m.scanned < nmain;
        m.scanned = m.scanned.saturating_add(chunk);
        (start, every)
    }
}

#[cfg(test)]
mod tests {
    use super::Sweep;

    #[test]
    fn a_pass_is_owed_after_the_watermarks_change_and_only_then() {
        let s = Sweep::default();
        assert_eq!(
            s.next(10, 4, (0, 0)),
            (0, false),
            "no flush yet: nothing owed"
        );
        assert_eq!(s.next(10, 4, (5, 0)), (4, true));
        assert_eq!(s.next(10, 4, (5, 0)), (8, true));
        assert_eq!(s.next(10, 4, (5, 0)), (2, true), "8 of 10 scanned so far");
        assert_eq!(s.next(10, 4, (5, 0)), (6, false), "a whole pass went by");
        assert_eq!(
            s.next(10, 4, (5, 7)),
            (0, true),
            "a delayed flush owes one more"
        );
    }
}
