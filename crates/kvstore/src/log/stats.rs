//! The engine's statistics, counted per thread ([`Stats`]): the items the index points at,
//! the items stored, and the event counters `stats` shows. A write or a read that counts
//! something touches its own thread's cache line, not one every thread writes; a reader sums
//! the cells. Besides `stats`, the counts are read for the index's growth (`write.rs`,
//! `grow.rs`), what `no_evict` keeps back (`compact.rs`) and the mean record size eviction
//! weighs items by.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use super::sync::{tid, Padded};

/// The engine's event counters, one set per thread ([`Stats::mine`]). [`Totals`] sums them
/// for `stats`.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        #[derive(Default)]
        pub(super) struct Counters {
            $($(#[$doc])* pub(super) $name: AtomicU64,)*
        }

        /// [`Counters`] summed over the threads.
        #[derive(Default)]
        pub(super) struct Totals {
            $(pub(super) $name: u64,)*
        }

        impl Counters {
            fn add_to(&self, t: &mut Totals) {
                $(t.$name += self.$name.load(Ordering::Relaxed);)*
            }

            fn reset(&self) {
                $(self.$name.store(0, Ordering::Relaxed);)*
            }
        }
    };
}

counters! {
    evictions,
    evicted_index,
    reclaimed,
    crawler_reclaimed,
    crawler_checked,
    expired_unfetched,
    evicted_unfetched,
    evicted_nonzero,
    get_expired,
    get_flushed,
    copied_forward,
    /// Keys stored while absent that the sketch remembered (given one read).
    readmitted,
    segments_evicted,
    segments_compacted,
    segments_expired,
    /// Records with a time to live written to a shard's segment because every open
    /// segment of their TTL class was busy.
    ttl_class_busy,
    tombstones,
    index_splits,
}

/// The engine's counts, in cells picked by thread (`tid() % cells`, as the append shards
/// are). It owns:
///
/// * the items the index points at (a cell alone may go negative: an item one thread
///   added may be removed by another; only the sum means anything);
/// * the items stored (`total_items`, cleared by `stats reset`);
/// * the event counters ([`Counters`]).
///
/// Every count is relaxed: a sum is a snapshot of no single instant, and no memory is
/// published through a count.
pub(super) struct Stats {
    stored: Box<[Padded<AtomicU64>]>,
    live: Box<[Padded<AtomicI64>]>,
    events: Box<[Padded<Counters>]>,
}

impl Stats {
    /// Counts of `cells` cells (at least one), all zero.
    pub(super) fn new(cells: usize) -> Stats {
        let cells = cells.max(1);
        Stats {
            stored: (0..cells).map(|_| Padded::default()).collect(),
            live: (0..cells).map(|_| Padded::default()).collect(),
            events: (0..cells).map(|_| Padded::default()).collect(),
        }
    }

    /// How many cells the counts are spread over.
    pub(super) fn cells(&self) -> usize {
        self.live.len()
    }

    /// This thread's event counters.
    #[inline]
    pub(super) fn mine(&self) -> &Counters {
        &self.events[tid() % self.events.len()].0
    }

    /// The event counters summed over the threads.
    pub(super) fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for c in self.events.iter() {
            c.0.add_to(&mut t);
        }
        t
    }

    /// This thread stored an item; returns how many it had stored before (of its cell).
    pub(super) fn count_store(&self) -> u64 {
        self.stored[tid() % self.stored.len()]
            .0
            .fetch_add(1, Ordering::Relaxed)
    }

    /// Items stored, summed over the threads (since the last [`Stats::reset`]).
    pub(super) fn stored(&self) -> u64 {
        self.stored
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum()
    }

    /// The index gained `n` items (lost them, if negative).
    #[inline]
    pub(super) fn add_live(&self, n: i64) {
        self.live[tid() % self.live.len()]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Items the index points at: the sum of the cells (read one by one while other
    /// threads count, so it may be off, even negative).
    pub(super) fn live_sum(&self) -> i64 {
        self.live.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }

    /// Live items now ([`Stats::live_sum`], at least 0).
    pub(super) fn live_items(&self) -> usize {
        usize::try_from(self.live_sum()).unwrap_or(0)
    }

    /// `stats reset`: the event counters and the items stored start again from 0 (the live
    /// items are a state, not a count of events, and stay).
    pub(super) fn reset(&self) {
        for c in self.events.iter() {
            c.0.reset();
        }
        for c in self.stored.iter() {
            c.0.store(0, Ordering::Relaxed);
        }
    }
}
