//! When each record of a segment was written, to the second, without a byte per record:
//! a segment keeps the offsets at which the clock changed while it was being appended to
//! ([`WriteTimes`]). The meta protocol's last-access time (`l`, `me`'s `la`) is read from
//! here: an item's time is that of its record, which a write, a touch or a copy by
//! eviction (only items read since they were written are copied) puts at the log head.
//!
//! A segment appended to over more distinct seconds than [`MAX_MARKS`] keeps every other
//! mark each time it fills up, so its older records' times get coarser (never later than
//! the truth); a segment filled within a few minutes, as a busy cache's are, keeps them all.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use crate::Time;

/// Most marks a segment keeps (2 KiB at most per segment).
const MAX_MARKS: usize = 256;

/// The clock changes seen by one segment's appends: (offset, time), both increasing.
#[derive(Default)]
pub(super) struct WriteTimes {
    /// The time of the latest mark (0: none yet): most appends only compare with it.
    last: AtomicU32,
    marks: Mutex<Vec<(u32, Time)>>,
}

impl WriteTimes {
    /// Forget every mark (the segment is being opened for new records).
    pub(super) fn reset(&self) {
        self.last.store(0, Ordering::Relaxed);
        lock(&self.marks).clear();
    }

    /// A record was written at `off` at `now`. Appends to one segment come from one thread
    /// at a time (its owner), in offset order.
    #[inline]
    pub(super) fn note(&self, off: usize, now: Time) {
        if self.last.load(Ordering::Relaxed) >= now {
            return;
        }
        let mut m = lock(&self.marks);
        if m.len() >= MAX_MARKS {
            let mut i = 0;
            m.retain(|_| {
                i += 1;
                i % 2 == 1
            });
        }
        m.push((u32::try_from(off).unwrap_or(u32::MAX), now));
        self.last.store(now, Ordering::Relaxed);
    }

    /// When the record at `off` was written, as far as the marks tell (None: no mark at or
    /// before it).
    pub(super) fn at(&self, off: usize) -> Option<Time> {
        let off = u32::try_from(off).unwrap_or(u32::MAX);
        let m = lock(&self.marks);
        let i = m.partition_point(|&(o, _)| o <= off);
        i.checked_sub(1).and_then(|i| m.get(i)).map(|&(_, t)| t)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_gets_the_time_of_the_last_mark_before_it() {
        let w = WriteTimes::default();
        assert_eq!(w.at(100), None);
        w.note(24, 1000);
        w.note(80, 1000);
        w.note(130, 1003);
        assert_eq!(w.at(24), Some(1000));
        assert_eq!(w.at(80), Some(1000));
        assert_eq!(w.at(129), Some(1000));
        assert_eq!(w.at(130), Some(1003));
        assert_eq!(w.at(10_000), Some(1003));
        assert_eq!(w.at(10), None);
        w.reset();
        assert_eq!(w.at(130), None);
    }

    #[test]
    fn a_long_lived_segment_keeps_bounded_marks_never_later_than_the_truth() {
        let w = WriteTimes::default();
        for i in 0..10 * MAX_MARKS {
            w.note(24 + 10 * i, 1000 + i as Time);
        }
        assert!(lock(&w.marks).len() <= MAX_MARKS);
        for i in (0..10 * MAX_MARKS).step_by(7) {
            let t = w.at(24 + 10 * i).unwrap_or(0);
            assert!(t <= 1000 + i as Time && t >= 1000, "record {i}: {t}");
        }
        // The newest records keep their exact time.
        let last = 10 * MAX_MARKS - 1;
        assert_eq!(w.at(24 + 10 * last), Some(1000 + last as Time));
    }
}
