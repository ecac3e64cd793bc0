//! The segments' memory budget and its accounting ([`Arena`]): the memory limit, the bytes
//! of segment memory mapped and leased, and the pool of free segments and unused segment
//! ids. It maps and unmaps nothing itself: the engine's segment paths (`segments.rs`, the
//! large-item path in `write.rs`, a warm restart's `snapshot.rs`) and the last holder of a
//! detached lease block (`lease.rs`) tell it what they mapped and unmapped, and take free
//! segments and ids from its pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::sync::lock;

/// The memory limit and what segment memory takes of it. It owns:
///
/// * the limit (`-m`, changed at run time by `cache_memlimit` or `-m auto`), which covers
///   the index and the miss sketch as well as the segments ([`Arena::budget`]);
/// * [`Counts`]: the bytes of segment memory mapped, and of it the bytes of segments that
///   leases hold, shared with the lease blocks (a detached mapping stays counted until its
///   last holder unmaps it);
/// * the [`Pool`] (behind the pool lock, taken after the evictor's): free regular segments
///   that keep their memory, and segment ids without memory.
///
/// Its invariants: `allocated` is the sum of the sizes of the mappings installed in
/// segments or held by detached lease blocks (each mapping is counted when it is installed
/// and uncounted by whoever unmaps it, exactly once); a segment id is in the pool at most
/// once, as free (with memory) or as unused (without), never both (until the engine drops and
/// releases every segment).
pub(super) struct Arena {
    max_bytes: AtomicUsize,
    counts: Arc<Counts>,
    pool: Mutex<Pool>,
}

impl Arena {
    /// An arena for a limit of `max_bytes`: nothing mapped, no segment id used yet.
    pub(super) fn new(max_bytes: usize) -> Arena {
        Arena {
            max_bytes: AtomicUsize::new(max_bytes),
            counts: Arc::default(),
            pool: Mutex::new(Pool::default()),
        }
    }

    /// The memory limit (index and segments).
    pub(super) fn limit(&self) -> usize {
        self.max_bytes.load(Ordering::Relaxed)
    }

    /// A new memory limit (the caller then shrinks what exceeds it).
    pub(super) fn set_limit(&self, max_bytes: usize) {
        self.max_bytes.store(max_bytes, Ordering::Relaxed);
    }

    /// Bytes segments may use when the rest of the engine (the index, the sketch) takes
    /// `others`: the limit minus those, but at least a quarter of the limit (the index does
    /// not shrink: if the limit later falls under it, segments keep a quarter of it, and
    /// memory exceeds the limit by up to the index, rather than segments getting nothing).
    pub(super) fn budget(&self, others: usize) -> usize {
        let max = self.limit();
        max.saturating_sub(others).max(max / 4)
    }

    /// Bytes of segment memory mapped, detached lease blocks' included.
    pub(super) fn allocated(&self) -> usize {
        self.counts.allocated.load(Ordering::Relaxed)
    }

    /// Bytes of segments that leases hold.
    pub(super) fn leased(&self) -> usize {
        self.counts.leased.load(Ordering::Relaxed)
    }

    /// A mapping of `cap` bytes was installed in a segment.
    pub(super) fn mapped(&self, cap: usize) {
        self.counts.allocated.fetch_add(cap, Ordering::Relaxed);
    }

    /// A mapping of `cap` bytes was unmapped.
    pub(super) fn unmapped(&self, cap: usize) {
        self.counts.unmapped(cap);
    }

    /// The counts, for a lease block to share.
    pub(super) fn counts(&self) -> Arc<Counts> {
        Arc::clone(&self.counts)
    }

    /// The pool, locked (the lock order's "pool": after the evictor, with the FIFOs).
    pub(super) fn pool(&self) -> MutexGuard<'_, Pool> {
        lock(&self.pool)
    }
}

/// The bytes of segment memory mapped and leased, shared by the [`Arena`] and the lease
/// blocks (`lease.rs`) that may outlive a segment's use of a mapping.
#[derive(Default)]
pub(super) struct Counts {
    allocated: AtomicUsize,
    leased: AtomicUsize,
}

impl Counts {
    /// A mapping of `cap` bytes was unmapped (by the engine, or by the last holder of a
    /// detached lease block).
    pub(super) fn unmapped(&self, cap: usize) {
        self.allocated.fetch_sub(cap, Ordering::Relaxed);
    }

    /// Bytes of segments that leases hold.
    pub(super) fn leased(&self) -> usize {
        self.leased.load(Ordering::Relaxed)
    }

    /// A segment of `cap` bytes got its first holder.
    pub(super) fn leased_more(&self, cap: usize) {
        self.leased.fetch_add(cap, Ordering::Relaxed);
    }

    /// A segment of `cap` bytes lost its last holder.
    pub(super) fn leased_less(&self, cap: usize) {
        self.leased.fetch_sub(cap, Ordering::Relaxed);
    }
}

/// Free segments and unused segment ids, behind the pool lock ([`Arena::pool`]).
#[derive(Default)]
pub(super) struct Pool {
    /// Regular segments with memory, empty, ready to open.
    free: Vec<u32>,
    /// Ids without memory.
    ids: Vec<u32>,
    /// Ids below this were given out at some time.
    next_id: u32,
}

impl Pool {
    /// A free regular segment (with memory), if any.
    pub(super) fn pop_free(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Segment `id`, its memory kept, is free: no slot points into it and no reader from
    /// before its last unlink is left (the caller waited out the pins).
    pub(super) fn push_free(&mut self, id: u32) {
        self.free.push(id);
    }

    /// Free regular segments.
    pub(super) fn free_len(&self) -> usize {
        self.free.len()
    }

    /// An id for a segment to be given memory: an unused one, else the next never used if
    /// it is below `max`.
    pub(super) fn draw_id(&mut self, max: usize) -> Option<u32> {
        if let Some(id) = self.ids.pop() {
            return Some(id);
        }
        if self.next_id as usize >= max {
            return None;
        }
        self.next_id += 1;
        Some(self.next_id - 1)
    }

    /// Segment `id` has no memory any more (or never got it): its id may be drawn again.
    pub(super) fn return_id(&mut self, id: u32) {
        self.ids.push(id);
    }

    /// Segment ids given out so far: every segment that ever had memory is below this.
    pub(super) fn ids_used(&self) -> u32 {
        self.next_id
    }
}
