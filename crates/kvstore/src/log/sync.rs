//! What every part of the engine shares to run on many threads: a thread's small number
//! (`tid`, to spread per-thread state over cells), cache-line padding, a lock that a panic
//! elsewhere does not poison, and the readers' pins with the barrier that reclaiming memory
//! waits on ([`Pins`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, TryLockError};

/// A value on a cache line of its own (cells written by different threads).
#[derive(Default)]
#[repr(align(64))]
pub(super) struct Padded<T>(pub(super) T);

static NEXT_TID: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static TID: usize = NEXT_TID.fetch_add(1, Ordering::Relaxed);
}

/// This thread's number: 0, 1, 2, ... in the order threads first ask.
pub(super) fn tid() -> usize {
    TID.try_with(|t| *t).unwrap_or(0)
}

/// Lock `m`, whether or not a thread panicked while holding it (the engine's state stays
/// consistent at every point a callback can panic).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reader pin locks (threads share them round-robin beyond this).
const NPINS: usize = 64;

/// A reader's pin: while it is held, memory the reader reached through the index stays as
/// it was (see [`Pins`]).
pub(super) type Pin<'a> = RwLockReadGuard<'a, ()>;

/// Readers' pins and the barrier: the invariant that makes lock-free reads of the log safe.
///
/// A reader takes a pin (the read side of one of `NPINS` reader-writer locks, picked by
/// thread) before it loads an index slot and holds it while it reads the record the slot
/// names. Memory is reused or unmapped only after (1) every slot into it has been unlinked,
/// each under its bucket stripe lock, and then (2) [`Pins::barrier`] has taken and released
/// the write side of every pin lock. A reader that loaded a slot into the memory did so under
/// a pin taken before (1) finished, so (2) waits for it; a reader that pins after (2) passed
/// its lock synchronizes with that release and sees the unlinked slot. Nobody waits for
/// pins while holding a bucket lock, and nobody takes a lock a writer holds while waiting
/// (the shard or evictor lock) while holding a pin, so the barrier cannot deadlock.
pub(super) struct Pins(Box<[Padded<RwLock<()>>]>);

impl Pins {
    pub(super) fn new() -> Pins {
        Pins((0..NPINS).map(|_| Padded::default()).collect())
    }

    /// Pin this thread's lock.
    #[inline]
    pub(super) fn pin(&self) -> Pin<'_> {
        let p = &self.0[tid() % NPINS].0;
        p.read().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Pins::barrier`], or (unless `block`) false at once if a reader still holds a pin
    /// lock (the caller tries again later: every lock taken once still counts).
    pub(super) fn try_barrier(&self, block: bool) -> bool {
        if block {
            self.barrier();
            return true;
        }
        for p in self.0.iter() {
            match p.0.try_write() {
                Ok(g) => drop(g),
                Err(TryLockError::Poisoned(e)) => drop(e.into_inner()),
                Err(TryLockError::WouldBlock) => return false,
            }
        }
        true
    }

    /// Wait until every reader that pinned before this call has unpinned.
    pub(super) fn barrier(&self) {
        for p in self.0.iter() {
            drop(p.0.write().unwrap_or_else(|e| e.into_inner()));
        }
    }
}
