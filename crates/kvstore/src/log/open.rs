//! The open segments writers append to: one per append shard (a thread's picked by its
//! number, see `sync::tid`) and the TTL classes' (`ttl.rs`). Each is an `Option<Open>`
//! behind its own lock; holding that lock is what makes a thread the segment's only
//! appender. Shard and class locks come first in the engine's lock order, and a thread
//! never waits for a second one: other threads' slots are only tried.

use std::sync::{Mutex, MutexGuard};

use super::segments::Open;
use super::sync::{lock, tid, Padded};
use super::ttl::{ClassSeg, TtlClasses};
use crate::Time;

pub(super) struct OpenSegs {
    shards: Box<[Padded<Mutex<Option<Open>>>]>,
    ttl: TtlClasses,
}

impl OpenSegs {
    /// `shards` append shards, and TTL classes for an engine of `segments` segments.
    pub(super) fn new(shards: usize, segments: usize) -> OpenSegs {
        OpenSegs {
            shards: (0..shards.max(1)).map(|_| Padded::default()).collect(),
            ttl: TtlClasses::new(segments, shards.max(1)),
        }
    }

    /// The calling thread's shard's open segment, locked.
    pub(super) fn shard(&self) -> MutexGuard<'_, Option<Open>> {
        lock(&self.shards[tid() % self.shards.len()].0)
    }

    /// The open segment a record of an item with `ttl` more seconds to live (None: it never
    /// expires) goes to, locked: its TTL class's, or the thread's shard's. A class's
    /// segments are shared by the threads, so they are only tried: when every one is busy
    /// the record goes to the shard's instead of waiting (it then expires with less
    /// company, and no writer ever waits for another's class); the flag says so.
    pub(super) fn for_expiry(&self, ttl: Option<Time>) -> (MutexGuard<'_, Option<Open>>, bool) {
        let busy = match ttl.map(|t| self.ttl.try_open(t, tid())) {
            Some(ClassSeg::Open(g)) => return (g, false),
            Some(ClassSeg::Busy) => true,
            Some(ClassSeg::NoClass) | None => false,
        };
        (self.shard(), busy)
    }

    /// Every slot, shards first, for a caller that only tries their locks (it may hold
    /// its own).
    pub(super) fn all(&self) -> impl Iterator<Item = &Mutex<Option<Open>>> {
        let shards = self.shards.iter().map(|s| &s.0);
        shards.chain(self.ttl.slots().map(|(s, _)| s))
    }

    /// The TTL classes.
    pub(super) fn ttl(&self) -> &TtlClasses {
        &self.ttl
    }

    /// Replace the TTL classes (a test comparing with none).
    #[cfg(test)]
    pub(super) fn set_ttl(&mut self, ttl: TtlClasses) {
        self.ttl = ttl;
    }
}
