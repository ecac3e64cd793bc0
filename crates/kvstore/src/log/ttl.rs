//! TTL classes: items with a time to live go to an open segment of their class (geometric
//! classes of times to live from 1 s to [`TTL_SPAN`]), so that the items of a segment expire
//! about together and the segment empties by expiry soon after its items' time is up,
//! instead of when its longest-lived neighbour's is. A class has a few open segments
//! (`ways`), shared by the threads and each playing a shard's part in the lock order, so a
//! writer only tries their locks ([`TtlClasses::try_open`]).

use std::sync::{Mutex, MutexGuard, TryLockError};

use super::segments::Open;
use super::sync::Padded;
use crate::Time;

/// TTL classes cover times to live from 1 s to this many seconds (36 h), in geometric
/// steps; items that live longer (or forever) go to their shard's segment.
pub(super) const TTL_SPAN: u32 = 1 << 17;
/// At most this many TTL classes (a ratio of 1.097 between neighbours).
pub(super) const MAX_TTL_CLASSES: usize = 128;

/// The TTL classes for an engine of `segments` segments and `shards` shards: their upper
/// bounds and the open segments per class. Their open segments take at most an eighth of
/// the segments (as the shards' do), so a small cache gets few, coarse classes and a very
/// small one none.
pub(super) fn ttl_classes(segments: usize, shards: usize) -> (Box<[u32]>, usize) {
    let open = segments / 8;
    let n = open.min(MAX_TTL_CLASSES);
    if n < 2 {
        return (Box::new([]), 1);
    }
    let mut bounds: Vec<u32> = Vec::with_capacity(n);
    for i in 1..=n {
        let b = f64::from(TTL_SPAN).powf(i as f64 / n as f64).ceil() as u32;
        let b = b.max(bounds.last().map_or(2, |&l| l + 1));
        bounds.push(b.min(TTL_SPAN));
    }
    bounds.dedup();
    let ways = (open / bounds.len()).clamp(1, shards);
    (bounds.into_boxed_slice(), ways)
}

/// The classes' bounds and open segments.
pub(super) struct TtlClasses {
    /// `ways` open segments per class, class by class.
    open: Box<[Padded<Mutex<Option<Open>>>]>,
    /// Exclusive upper bounds, in seconds, of the classes (empty: no classes, the memory is
    /// too small for their open segments).
    bounds: Box<[u32]>,
    ways: usize,
}

/// What [`TtlClasses::try_open`] found for an item.
pub(super) enum ClassSeg<'a> {
    /// The item has no class (it lives too long, or there are none).
    NoClass,
    /// Every open segment of its class was busy.
    Busy,
    /// One of its class's open segments, locked.
    Open(MutexGuard<'a, Option<Open>>),
}

impl TtlClasses {
    /// The classes of an engine of `segments` segments and `shards` shards ([`ttl_classes`]).
    pub(super) fn new(segments: usize, shards: usize) -> TtlClasses {
        let (bounds, ways) = ttl_classes(segments, shards);
        TtlClasses {
            open: (0..bounds.len() * ways)
                .map(|_| Padded::default())
                .collect(),
            bounds,
            ways,
        }
    }

    /// No classes: every item goes to its shard's segment (for comparisons).
    #[cfg(test)]
    pub(super) fn none() -> TtlClasses {
        TtlClasses {
            open: Box::new([]),
            bounds: Box::new([]),
            ways: 1,
        }
    }

    /// The classes' exclusive upper bounds, in seconds.
    #[cfg(test)]
    pub(super) fn bounds(&self) -> &[u32] {
        &self.bounds
    }

    /// Try the open segments of the class of an item that lives `ttl` more seconds, starting
    /// at the one `start` picks (a thread's number spreads the threads over them).
    pub(super) fn try_open(&self, ttl: Time, start: usize) -> ClassSeg<'_> {
        let class = self.bounds.partition_point(|&b| b <= ttl);
        if class >= self.bounds.len() {
            return ClassSeg::NoClass;
        }
        for w in 0..self.ways {
            let i = class * self.ways + (start + w) % self.ways;
            let Some(slot) = self.open.get(i) else {
                break;
            };
            match slot.0.try_lock() {
                Ok(g) => return ClassSeg::Open(g),
                Err(TryLockError::Poisoned(p)) => return ClassSeg::Open(p.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        ClassSeg::Busy
    }

    /// Every open segment's slot, with the longest time to live of its class.
    pub(super) fn slots(&self) -> impl Iterator<Item = (&Mutex<Option<Open>>, u32)> {
        self.open.iter().enumerate().map(|(i, slot)| {
            let longest = self.bounds.get(i / self.ways).copied().unwrap_or(1);
            (&slot.0, longest)
        })
    }

    /// Lock every open segment of class `class` (a test's busy writers).
    #[cfg(test)]
    pub(super) fn lock_class(&self, class: usize) -> Vec<MutexGuard<'_, Option<Open>>> {
        (0..self.ways)
            .filter_map(|w| self.open.get(class * self.ways + w))
            .map(|s| super::sync::lock(&s.0))
            .collect()
    }
}
