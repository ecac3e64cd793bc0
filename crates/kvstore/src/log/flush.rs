//! `flush_all`, immediate and delayed, as the state every read consults ([`Flush`]).
//!
//! An immediate `flush_all` records a CAS watermark (every item with a smaller CAS is dead,
//! for good). A delayed one records its deadline `at - 1`; while the clock is at the
//! deadline every item is dead, and the first operation after it turns the deadline into a
//! second watermark, which a later delayed flush replaces (memcached keeps a single
//! `oldest_live`, so items not yet removed come back until the new deadline; the model does
//! the same). With a non-decreasing clock this is exactly "stored or accessed at or before
//! `at - 1`": an item stored before the deadline cannot be accessed after it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use super::sync::lock;
use crate::Time;

/// The flush watermarks and the pending deadline.
#[derive(Default)]
pub(super) struct Flush {
    /// Items with a smaller CAS were flushed by an immediate flush (for good).
    mark: AtomicU64,
    /// Items with a smaller CAS were flushed by the last delayed flush once it passed; a
    /// newer delayed flush replaces it.
    delayed: AtomicU64,
    /// A delayed flush's deadline (`at - 1`), 0 when none is pending.
    deadline: AtomicU32,
    /// Serializes flushes and the turning of a passed deadline into `delayed`.
    lock: Mutex<()>,
}

impl Flush {
    /// `flush_all` at `at` (0 or in the past: now) when the clock is `now`; `issued` is the
    /// highest CAS unique issued so far.
    pub(super) fn flush_all(&self, at: Time, now: Time, issued: impl FnOnce() -> u64) {
        let _f = lock(&self.lock);
        self.delayed.store(0, Ordering::SeqCst);
        if at <= now || at == 1 {
            self.deadline.store(0, Ordering::Release);
            self.mark.fetch_max(issued(), Ordering::SeqCst);
        } else {
            self.deadline.store(at - 1, Ordering::Release);
        }
    }

    /// The clock reads `now`: a delayed flush whose deadline has passed becomes a watermark
    /// (`issued`: the highest CAS unique issued so far).
    #[inline]
    pub(super) fn tick(&self, now: Time, issued: impl FnOnce() -> u64) {
        let d = self.deadline.load(Ordering::Acquire);
        if d != 0 && now > d {
            let _f = lock(&self.lock);
            if self.deadline.load(Ordering::Acquire) == d {
                // Every item stored so far was stored or accessed at or before `d`.
                self.delayed.store(issued(), Ordering::SeqCst);
                self.deadline.store(0, Ordering::Release);
            }
        }
    }

    /// Whether the item with CAS unique `cas` is flushed at `now`.
    #[inline]
    pub(super) fn flushed(&self, cas: u64, now: Time) -> bool {
        if cas < self.mark.load(Ordering::Acquire) || cas < self.delayed.load(Ordering::Acquire) {
            return true;
        }
        self.deadline_passed(now)
    }

    /// Whether a delayed flush's deadline has come (every item is dead until it turns into a
    /// watermark).
    #[inline]
    pub(super) fn deadline_passed(&self, now: Time) -> bool {
        let d = self.deadline.load(Ordering::Acquire);
        d != 0 && now >= d
    }

    /// The lowest CAS unique a new version may have so that it survives the flushes so far.
    #[inline]
    pub(super) fn floor(&self) -> u64 {
        self.mark
            .load(Ordering::Acquire)
            .max(self.delayed.load(Ordering::Acquire))
    }

    /// The two watermarks (the sweep rereads everything once after they change).
    pub(super) fn marks(&self) -> (u64, u64) {
        (
            self.mark.load(Ordering::Acquire),
            self.delayed.load(Ordering::Acquire),
        )
    }

    /// The watermarks a master ships in every batch (before its next CAS unique).
    pub(super) fn shipped_marks(&self) -> (u64, u64) {
        (
            self.mark.load(Ordering::SeqCst),
            self.delayed.load(Ordering::SeqCst),
        )
    }

    /// The pending deadline (0: none), shipped after the next CAS unique.
    pub(super) fn deadline(&self) -> Time {
        self.deadline.load(Ordering::Acquire)
    }

    /// A replica takes its master's state.
    pub(super) fn adopt(&self, mark: u64, delayed: u64, deadline: Time) {
        let _f = lock(&self.lock);
        self.mark.store(mark, Ordering::SeqCst);
        self.delayed.store(delayed, Ordering::SeqCst);
        self.deadline.store(deadline, Ordering::Release);
    }
}
