//! Leases: a reader's hold on a value's bytes past its lookup, so that a server can send a
//! large value straight from the log (the socket reads the segment) instead of copying it
//! into an output buffer first (memcached sends from the item, holding a reference, too).
//!
//! A pin keeps a segment's memory only while it is held, and a reply may take a while to
//! leave (a slow client). So a segment that was leased gets a *lease block* (created by
//! the first lease, found through [`SegMem::lease`]): a count of holders and the mapping's
//! address. The engine frees a segment's memory only after the pin barrier that follows
//! its last unlink, and it *detaches* the block there first ([`detach`]):
//! - no holder: the block goes, and the memory is reused or unmapped as before;
//! - holders: the mapping becomes the block's. The segment is reused with a fresh mapping
//!   (or left without one), and the last holder to let go unmaps the old one. Its bytes
//!   stay counted as allocated until then, so the memory limit holds them too.
//!
//! No lease can start after the detach: a lease is taken under a pin, on a record reached
//! through a slot, and the segment had no slot left before the barrier that came first.
//! The block's state is one word (holders × 2, plus `DETACHED`), so exactly one of "the
//! detach" and "the last release" sees the other and frees the block.
//!
//! Leased memory is bounded: a lease that would make a segment leased while the leased
//! segments already take [`LEASE_SHARE`] of the memory limit is refused (the caller copies
//! instead), so clients that stop reading can hold at most that share of the cache.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Arc;

use super::arena::Counts;
use super::{mem, LogEngine};

/// At most `1 / LEASE_SHARE` of the memory limit may be held by leases (whole segments).
pub(super) const LEASE_SHARE: usize = 8;

const DETACHED: usize = 1;
const HOLDER: usize = 2;

/// A leased segment's mapping and who holds it.
pub(super) struct Block {
    state: AtomicUsize,
    ptr: NonNull<u8>,
    cap: usize,
    /// The engine's bytes of mapped segment memory (a detached mapping stays counted in it
    /// until its last holder unmaps it) and of leased segments (`arena.rs`).
    counts: Arc<Counts>,
}

/// A held value: its bytes stay readable and unchanged until the lease is dropped. Cheap to
/// keep (two words and a pointer), `Send`, and independent of the engine's lifetime.
pub struct ValueLease {
    block: NonNull<Block>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the bytes a lease names are never written while it lives (published records are
// immutable and the mapping is not reused before every holder let go), and the block is
// only touched through atomics (and freed by exactly one party, see the module comment).
unsafe impl Send for ValueLease {}
// SAFETY: as above; a shared lease only reads.
unsafe impl Sync for ValueLease {}

impl ValueLease {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr .. ptr + len` lies in the block's mapping (checked when the lease
        // was made), which stays mapped and unmodified while this lease holds the block.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for ValueLease {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for ValueLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueLease")
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for ValueLease {
    fn drop(&mut self) {
        // SAFETY: this lease counts as a holder, so the block is alive until the update
        // below, and whoever takes the count to zero after the detach frees it.
        let b = unsafe { self.block.as_ref() };
        // Taken before the update: once it leaves no holder on a block not yet detached,
        // a detach may free the block at once, so the last holder must not touch it
        // after (it did, reading the counts of a freed block).
        let (counts, cap) = (Arc::clone(&b.counts), b.cap);
        let prev = b.state.fetch_sub(HOLDER, Ordering::AcqRel);
        if prev >> 1 == 1 {
            counts.leased_less(cap);
            if prev & DETACHED != 0 {
                // The last holder of a detached block: the mapping and the block are ours.
                counts.unmapped(cap);
                // SAFETY: the engine gave the mapping (`cap` bytes from `mem::map` or
                // `mem::map_file`) to the block at the detach and no lease is left.
                unsafe {
                    mem::unmap(b.ptr, cap);
                    drop(Box::from_raw(self.block.as_ptr()));
                }
            }
        }
    }
}

/// Where an item's value lives, for [`crate::ItemView::lease`]: the engine and the segment
/// that holds the record.
#[derive(Clone, Copy)]
pub struct LeaseSite<'a> {
    pub(super) engine: &'a LogEngine,
    /// The segment's id (looked up only if a lease is asked for).
    pub(super) seg: u32,
}

impl std::fmt::Debug for LeaseSite<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseSite")
    }
}

impl PartialEq for LeaseSite<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.engine, other.engine) && self.seg == other.seg
    }
}

impl Eq for LeaseSite<'_> {}

impl LeaseSite<'_> {
    /// Hold `value` (bytes of the record this site was made for) past the lookup. `None`
    /// when the leased memory is at its bound or `value` is not in the segment: the
    /// caller copies it instead.
    ///
    /// Must be called while the lookup's pin is held (the callback of a read is), or under
    /// the stripe lock of the key whose indexed record holds `value` (the callback of a
    /// touch or gat is): every path that frees a segment first unlinks its indexed records
    /// under their stripe locks (eviction, compaction) or waits until it has none
    /// (`live_items`), so the segment is not released, and its lease block not detached,
    /// before the lease is counted in the block.
    pub(crate) fn lease(&self, value: &[u8]) -> Option<ValueLease> {
        let e = self.engine;
        let seg = e.segs.get(self.seg)?;
        let (ptr, cap) = seg.mapping()?;
        let cell = seg.lease_cell();
        let start = (value.as_ptr() as usize).checked_sub(ptr.as_ptr() as usize)?;
        if start.checked_add(value.len())? > cap {
            return None;
        }
        let limit = e.arena.limit() / LEASE_SHARE;
        let mut block = cell.load(Ordering::Acquire);
        if block.is_null() {
            let fresh = Box::into_raw(Box::new(Block {
                state: AtomicUsize::new(0),
                ptr,
                cap,
                counts: e.arena.counts(),
            }));
            block = match cell.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => fresh,
                Err(theirs) => {
                    // SAFETY: ours, never shared.
                    drop(unsafe { Box::from_raw(fresh) });
                    theirs
                }
            };
        }
        // SAFETY: a block stays while it is the segment's (it is detached and freed only
        // after the barrier that waits for our pin).
        let b = unsafe { &*block };
        if b.state.load(Ordering::Relaxed) < HOLDER && b.counts.leased().saturating_add(cap) > limit
        {
            return None;
        }
        if b.state.fetch_add(HOLDER, Ordering::AcqRel) >> 1 == 0 {
            b.counts.leased_more(cap);
        }
        Some(ValueLease {
            block: NonNull::new(block)?,
            // SAFETY: in bounds, checked above.
            ptr: unsafe { NonNull::new_unchecked(ptr.as_ptr().add(start)) },
            len: value.len(),
        })
    }
}

/// End the lease block in `slot` (a segment's, see [`Block`]), if it has one: the segment no
/// reader can reach any more (after the barrier that followed its last unlink) is about to
/// be reused or unmapped. True if holders still read its memory: the mapping is theirs now
/// (they unmap it, and it stays counted as allocated until they do), and the caller must
/// leave the segment without it.
pub(super) fn detach(slot: &AtomicPtr<Block>) -> bool {
    let block = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
    let Some(block) = NonNull::new(block) else {
        return false;
    };
    // SAFETY: the block is alive until it is detached and its holders are gone.
    let prev = unsafe { block.as_ref() }
        .state
        .fetch_or(DETACHED, Ordering::AcqRel);
    if prev >> 1 == 0 {
        // No holder, and none can come (see the module comment).
        // SAFETY: nobody else refers to it.
        drop(unsafe { Box::from_raw(block.as_ptr()) });
        return false;
    }
    true
}

impl LogEngine {
    /// Bytes of segments that leases hold (`stats slabs`: `leased_bytes`).
    pub(super) fn leased_bytes(&self) -> usize {
        self.arena.leased()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::cfg;
    use super::*;
    use crate::{Engine, ReadOptions, StoreMode, StoreRequest, StoreResult};

    fn engine(max_bytes: usize) -> LogEngine {
        LogEngine::new(cfg(max_bytes))
    }

    fn set(e: &LogEngine, key: &[u8], value: &[u8]) {
        let r = super::super::tests::set(e, key, value, 1);
        assert!(matches!(r, StoreResult::Stored(_)), "{r:?}");
    }

    fn lease(e: &LogEngine, key: &[u8]) -> Option<ValueLease> {
        let mut held = None;
        e.get(key, 1, ReadOptions::default(), &mut |v| held = v.lease());
        held
    }

    /// A lease of the item a `gat` rewrote (its view comes under the stripe lock).
    fn lease_touched(e: &LogEngine, key: &[u8]) -> Option<ValueLease> {
        let mut held = None;
        let opts = ReadOptions { touch: Some(0) };
        e.get(key, 1, opts, &mut |v| held = v.lease());
        held
    }

    /// A value whose bytes say which key and version wrote it.
    fn value(key: u32, version: u32, len: usize) -> Vec<u8> {
        let mut v = vec![(key ^ version) as u8; len];
        v[..4].copy_from_slice(&key.to_le_bytes());
        v[4..8].copy_from_slice(&version.to_le_bytes());
        v
    }

    #[test]
    fn a_leased_value_outlives_overwrite_eviction_and_reuse() {
        let e = engine(16 << 20);
        let len = e.segment_size() / 4;
        let first = value(0, 0, len);
        set(&e, b"k", &first);
        let held = lease(&e, b"k").expect("leased");
        assert_eq!(held.len(), len);
        assert_eq!(e.leased_bytes(), e.segment_size());
        // Overwrite it, then write ten times the memory: every segment of the start is
        // evicted and reused (or unmapped) meanwhile.
        set(&e, b"k", &value(0, 1, len));
        for i in 1..(10 * (16 << 20) / len) as u32 {
            set(&e, format!("other{i}").as_bytes(), &value(i, 0, len));
        }
        assert!(held[..] == first[..], "the leased bytes changed");
        // The detached mapping is still counted; dropping the lease unmaps it.
        let before = e.arena.allocated();
        drop(held);
        assert_eq!(e.leased_bytes(), 0);
        assert_eq!(e.arena.allocated(), before - e.segment_size());
        assert!(e.arena.allocated() <= e.budget());
    }

    #[test]
    fn leases_of_an_unchanged_segment_share_its_block() {
        let e = engine(16 << 20);
        set(&e, b"a", &value(1, 0, 1000));
        set(&e, b"b", &value(2, 0, 1000));
        let a = lease(&e, b"a").expect("leased");
        let b = lease(&e, b"b").expect("leased");
        let a2 = lease(&e, b"a").expect("leased");
        assert_eq!(e.leased_bytes(), e.segment_size());
        assert_eq!(&a[..], &value(1, 0, 1000)[..]);
        assert_eq!(&b[..], &value(2, 0, 1000)[..]);
        drop((a, b));
        assert_eq!(e.leased_bytes(), e.segment_size());
        drop(a2);
        assert_eq!(e.leased_bytes(), 0);
        // Not detached: the segment is still in use, with its memory.
        let again = lease(&e, b"a").expect("leased");
        assert_eq!(&again[..], &value(1, 0, 1000)[..]);
    }

    #[test]
    fn leases_take_at_most_their_share_of_memory() {
        let max = 16 << 20;
        let e = engine(max);
        let seg = e.segment_size();
        // Each value more than half a segment: one per segment.
        let n = max / LEASE_SHARE / seg;
        assert!(n >= 1);
        for i in 0..=n as u32 {
            set(&e, format!("k{i}").as_bytes(), &value(i, 0, seg / 2 + 1));
        }
        let mut held: Vec<_> = (0..n)
            .map(|i| lease(&e, format!("k{i}").as_bytes()).expect("within the share"))
            .collect();
        assert_eq!(e.leased_bytes(), n * seg);
        let last = format!("k{n}");
        assert!(lease(&e, last.as_bytes()).is_none(), "over the share");
        // A segment already leased takes more leases.
        assert!(lease(&e, b"k0").is_some());
        held.pop();
        assert!(lease(&e, last.as_bytes()).is_some());
    }

    #[test]
    fn gat_leases_the_item_it_rewrote() {
        let e = engine(8 << 20);
        let v = value(1, 7, 40_000);
        set(&e, b"k", &v);
        let Some(l) = lease_touched(&e, b"k") else {
            panic!("gat's value was not leased");
        };
        assert!(l[..] == v[..]);
        assert!(e.leased_bytes() > 0);
        drop(l);
        assert_eq!(e.leased_bytes(), 0);
    }

    #[test]
    fn views_without_a_site_do_not_lease() {
        let m = crate::model::Model::new(cfg(1 << 20));
        let _ = m.store(
            StoreRequest {
                mode: StoreMode::Set,
                key: b"k",
                value: b"v",
                flags: 0,
                exptime: 0,
            },
            1,
        );
        let mut leased = None;
        assert!(m.get(b"k", 1, ReadOptions::default(), &mut |v| {
            leased = Some(v.lease().is_some())
        }));
        assert_eq!(leased, Some(false));
    }

    /// Readers lease values and check them after a delay while writers overwrite, evict
    /// and reuse every segment: no leased byte ever changes.
    #[test]
    fn concurrent_leases_never_see_reused_memory() {
        let e = engine(8 << 20);
        let len = e.segment_size() / 8;
        let keys = 64u32;
        for k in 0..keys {
            set(&e, &k.to_le_bytes(), &value(k, 0, len));
        }
        let rounds = 300u32;
        // Leases taken by both readers together: one reader alone may get none, when the
        // other holds the whole leased share (a matter of scheduling).
        let leased = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for w in 0..2u32 {
                let e = &e;
                s.spawn(move || {
                    for r in 1..=rounds {
                        for k in (w..keys).step_by(2) {
                            set(e, &k.to_le_bytes(), &value(k, r, len));
                        }
                    }
                });
            }
            for t in 0..2u32 {
                let (e, leased) = (&e, &leased);
                s.spawn(move || {
                    let mut held: std::collections::VecDeque<(u32, ValueLease)> =
                        Default::default();
                    for i in 0..20_000u32 {
                        let k = (i * 7 + t) % keys;
                        // Every third a gat, whose view is leased under the stripe lock.
                        let l = if i % 3 == 0 {
                            lease_touched(e, &k.to_le_bytes())
                        } else {
                            lease(e, &k.to_le_bytes())
                        };
                        if let Some(l) = l {
                            leased.fetch_add(1, Ordering::Relaxed);
                            held.push_back((k, l));
                        }
                        if held.len() > 8 {
                            let (k, l) = held.pop_front().expect("held");
                            let version = u32::from_le_bytes(l[4..8].try_into().expect("4"));
                            assert!(
                                l[..] == value(k, version, len)[..],
                                "key {k}: leased bytes changed"
                            );
                        }
                    }
                });
            }
        });
        assert!(leased.load(Ordering::Relaxed) > 0, "nothing was leased");
        assert_eq!(e.leased_bytes(), 0);
    }
}
