//! Segment headers: what the engine knows of each segment id ([`Seg`]), in a table that
//! never moves them ([`SegTable`]).
//!
//! A header holds the segment's *mapping* (pointer, capacity, whether it is a large item's
//! own mapping or a warm restart's file mapping), its *publication* (bytes appended so far,
//! sealed or not, its sequence number while live) and its *accounting* (live items and
//! bytes, the range of expiry times it was given, when its records were written). Every
//! field is private: the engine changes a header only through the methods here, each of
//! which says which ordering it publishes with, so that the rules below are kept in one
//! place.
//!
//! # What a header promises its readers
//!
//! - `used` is release-stored after the bytes it covers were written, and `sealed` after
//!   the final `used`: a reader that acquires either sees the records below it.
//! - The sequence number is stored after the segment's header is written and cleared
//!   before the pin barrier that precedes the segment's reuse ([`Seg::take_seq`]): a
//!   pinned reader that still sees the number may read the segment.
//! - The mapping is released only by whoever owns a segment that no slot points into and
//!   no pinned reader can reach (`LogEngine::release`, `remap`); until then a reader
//!   holding a pin taken before it loaded a slot may read `[ptr, ptr + cap)`.
//!
//! Nothing here dereferences the mapping: the engine's `unsafe` reads of it rely on the
//! promises above and on the pin protocol of `sync.rs`.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::lease::Block;
use super::sync::Padded;
use super::written::WriteTimes;
use crate::Time;

/// Segment headers are allocated in chunks of this many.
const CHUNK: usize = 1024;

#[derive(Default)]
struct SegMem {
    /// The mapping, or null when the segment id has no memory.
    ptr: AtomicPtr<u8>,
    cap: AtomicUsize,
    /// Bytes appended so far (published length, release-stored after each append).
    used: AtomicUsize,
    large: AtomicBool,
    /// The memory is a private mapping of a warm restart's snapshot file (`adopt_image`),
    /// not an anonymous one: it is replaced by a fresh mapping before the segment is
    /// opened for appending again (`remap`).
    file: AtomicBool,
    /// The segment's sequence number while it is live (open or sealed, holding records a
    /// log reader may ship), 0 otherwise.
    seq: AtomicU64,
    /// Sealed: `used` is final (release-stored before this flag).
    sealed: AtomicBool,
    /// The lease block of this mapping, once a value in it was leased (`lease.rs`).
    lease: AtomicPtr<Block>,
}

#[derive(Default)]
struct SegAcct {
    live_items: AtomicU64,
    live_bytes: AtomicU64,
    /// The latest expiry of any item the segment was given: 0 while it has none,
    /// `Time::MAX` once one never expires. Once the clock passes it, everything in the
    /// segment is dead and the whole segment can go (`expire_segments`).
    max_exp: AtomicU32,
    /// The earliest expiry of any item the segment was given (0 while it has none with a
    /// time to live). Until the clock reaches it nothing in the segment has expired, so
    /// the background sweep need not read its records (`maintain`).
    min_exp: AtomicU32,
    /// When its records were written (`written.rs`).
    written: WriteTimes,
}

/// One segment id's header (see the module's documentation).
#[derive(Default)]
pub(super) struct Seg {
    mem: Padded<SegMem>,
    acct: Padded<SegAcct>,
}

impl Seg {
    // --- the mapping ---

    /// The mapping's start, None while the id has no memory (acquire: the segment's
    /// header bytes, written before the mapping was installed or the segment opened, are
    /// visible).
    pub(super) fn ptr(&self) -> Option<NonNull<u8>> {
        NonNull::new(self.mem.0.ptr.load(Ordering::Acquire))
    }

    /// The mapping's length in bytes (0 without one).
    pub(super) fn cap(&self) -> usize {
        self.mem.0.cap.load(Ordering::Relaxed)
    }

    /// The mapping and its length, None while the id has no memory.
    pub(super) fn mapping(&self) -> Option<(NonNull<u8>, usize)> {
        let ptr = self.ptr()?;
        Some((ptr, self.cap()))
    }

    /// A large item's own mapping (freed, never pooled, once its item is gone).
    pub(super) fn is_large(&self) -> bool {
        self.mem.0.large.load(Ordering::Relaxed)
    }

    /// A mapping of a warm restart's snapshot file (see `remap`).
    pub(super) fn is_file(&self) -> bool {
        self.mem.0.file.load(Ordering::Relaxed)
    }

    /// Give the id the mapping `ptr` of `cap` bytes, nothing appended yet. The id must have
    /// no mapping (fresh from the pool).
    pub(super) fn install(&self, ptr: NonNull<u8>, cap: usize, large: bool, file: bool) {
        self.mem.0.cap.store(cap, Ordering::Relaxed);
        self.mem.0.large.store(large, Ordering::Relaxed);
        self.mem.0.file.store(file, Ordering::Relaxed);
        self.mem.0.used.store(0, Ordering::Relaxed);
        self.mem.0.ptr.store(ptr.as_ptr(), Ordering::Release);
    }

    /// Take the mapping away (the caller unmaps it, or it went with its lease holders):
    /// the id is left with none. Returns it, if there was one.
    pub(super) fn take_mapping(&self) -> Option<(NonNull<u8>, usize)> {
        let ptr = self.mem.0.ptr.swap(std::ptr::null_mut(), Ordering::AcqRel);
        let cap = self.mem.0.cap.swap(0, Ordering::Relaxed);
        self.mem.0.used.store(0, Ordering::Relaxed);
        self.mem.0.file.store(false, Ordering::Relaxed);
        NonNull::new(ptr).map(|p| (p, cap))
    }

    /// Replace the mapping with the fresh anonymous `ptr` of `cap` bytes (nothing appended
    /// yet); returns the old one, if any, for the caller to unmap.
    pub(super) fn replace_mapping(
        &self,
        ptr: NonNull<u8>,
        cap: usize,
    ) -> Option<(NonNull<u8>, usize)> {
        let old = self.mem.0.ptr.swap(ptr.as_ptr(), Ordering::AcqRel);
        let old_cap = self.mem.0.cap.swap(cap, Ordering::Relaxed);
        self.mem.0.file.store(false, Ordering::Relaxed);
        self.mem.0.used.store(0, Ordering::Relaxed);
        NonNull::new(old).map(|p| (p, old_cap))
    }

    /// The cell of the mapping's lease block (`lease.rs` owns what it points to).
    pub(super) fn lease_cell(&self) -> &AtomicPtr<Block> {
        &self.mem.0.lease
    }

    // --- publication ---

    /// Bytes appended so far (acquire: the records below are visible).
    pub(super) fn used(&self) -> usize {
        self.mem.0.used.load(Ordering::Acquire)
    }

    /// Whether the mapping was never appended to since it was installed (its pages are
    /// then fresh from the kernel).
    pub(super) fn is_fresh(&self) -> bool {
        self.mem.0.used.load(Ordering::Relaxed) == 0
    }

    /// Publish `used` bytes as appended (release: after writing them).
    pub(super) fn publish_used(&self, used: usize) {
        self.mem.0.used.store(used, Ordering::Release);
    }

    /// Sealed: [`Seg::used`] is final.
    pub(super) fn is_sealed(&self) -> bool {
        self.mem.0.sealed.load(Ordering::Acquire)
    }

    /// The sequence number while the segment is live, 0 otherwise.
    pub(super) fn seq(&self) -> u64 {
        self.mem.0.seq.load(Ordering::Acquire)
    }

    /// The segment was opened for appending as number `seq`, its header (`used` bytes)
    /// written.
    pub(super) fn open(&self, seq: u64, used: usize) {
        self.mem.0.used.store(used, Ordering::Release);
        self.mem.0.sealed.store(false, Ordering::Relaxed);
        self.mem.0.seq.store(seq, Ordering::Release);
    }

    /// Appending ended at `used` bytes.
    pub(super) fn seal(&self, used: usize) {
        self.mem.0.used.store(used, Ordering::Release);
        self.mem.0.sealed.store(true, Ordering::Release);
    }

    /// The segment became live as number `seq` already whole (`used` bytes, sealed): a
    /// large item's mapping, or a warm restart's image.
    pub(super) fn publish_sealed(&self, seq: u64, used: usize) {
        self.seal(used);
        self.mem.0.seq.store(seq, Ordering::Release);
    }

    /// The segment leaves the set a log reader may ship: clear its number, returning it
    /// (0 if it was not live).
    pub(super) fn take_seq(&self) -> u64 {
        self.mem.0.seq.swap(0, Ordering::AcqRel)
    }

    // --- accounting ---

    /// Items the index points to in the segment (acquire: whoever sees 0 and then reuses
    /// the segment also sees the slot changes that preceded the decrements).
    pub(super) fn live_items(&self) -> u64 {
        self.acct.0.live_items.load(Ordering::Acquire)
    }

    /// Record bytes of those items.
    pub(super) fn live_bytes(&self) -> u64 {
        self.acct.0.live_bytes.load(Ordering::Acquire)
    }

    /// The index gained `items` items of `bytes` record bytes in the segment.
    pub(super) fn add_live(&self, items: u64, bytes: u64) {
        self.acct.0.live_items.fetch_add(items, Ordering::Relaxed);
        self.acct.0.live_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The index lost an item of `bytes` record bytes in the segment (release: see
    /// [`Seg::live_items`]).
    pub(super) fn remove_live(&self, bytes: u64) {
        self.acct.0.live_items.fetch_sub(1, Ordering::Release);
        self.acct.0.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// The segment was given an item expiring at `exptime` (0: never).
    pub(super) fn note_expiry(&self, exptime: Time) {
        let acct = &self.acct.0;
        let latest = if exptime == 0 { Time::MAX } else { exptime };
        if acct.max_exp.load(Ordering::Relaxed) < latest {
            acct.max_exp.fetch_max(latest, Ordering::Relaxed);
        }
        if exptime != 0 {
            let mut cur = acct.min_exp.load(Ordering::Relaxed);
            while cur == 0 || exptime < cur {
                match acct.min_exp.compare_exchange_weak(
                    cur,
                    exptime,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(seen) => cur = seen,
                }
            }
        }
    }

    /// The latest expiry the segment was given may be `latest` (a loader that counted its
    /// items' expiries itself: 0 none, `Time::MAX` one never expires).
    pub(super) fn note_latest_expiry(&self, latest: Time) {
        self.acct.0.max_exp.fetch_max(latest, Ordering::Relaxed);
    }

    /// Whether an item of the segment may have expired by `now`.
    pub(super) fn may_have_expired(&self, now: Time) -> bool {
        let soonest = self.acct.0.min_exp.load(Ordering::Relaxed);
        soonest != 0 && soonest <= now
    }

    /// Every item the segment was given has a time to live, and the latest of them passed
    /// by `now`.
    pub(super) fn expired_whole(&self, now: Time) -> bool {
        let m = self.acct.0.max_exp.load(Ordering::Relaxed);
        m != 0 && m != Time::MAX && m <= now
    }

    /// A record was appended at `off` at `now` (see `written.rs`).
    pub(super) fn note_written(&self, off: usize, now: Time) {
        self.acct.0.written.note(off, now);
    }

    /// When the record at `off` was written, as far as the segment knows.
    pub(super) fn written_at(&self, off: usize) -> Option<Time> {
        self.acct.0.written.at(off)
    }

    /// Forget the accounting (the segment is freed, or opened for new records).
    pub(super) fn reset_accounting(&self) {
        let acct = &self.acct.0;
        acct.live_items.store(0, Ordering::Relaxed);
        acct.live_bytes.store(0, Ordering::Relaxed);
        acct.max_exp.store(0, Ordering::Relaxed);
        acct.min_exp.store(0, Ordering::Relaxed);
        acct.written.reset();
    }
}

/// Segment headers by id, allocated a chunk at a time and never moved or freed while the
/// engine lives.
pub(super) struct SegTable {
    chunks: Box<[OnceLock<Box<[Seg]>>]>,
}

impl SegTable {
    /// A table for ids below `max_segments`.
    pub(super) fn new(max_segments: usize) -> SegTable {
        SegTable {
            chunks: (0..max_segments.div_ceil(CHUNK))
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    /// The header of `id`, if its chunk exists.
    pub(super) fn get(&self, id: u32) -> Option<&Seg> {
        let id = id as usize;
        self.chunks.get(id / CHUNK)?.get()?.get(id % CHUNK)
    }

    /// The header of `id`, its chunk allocated if needed (None beyond the table).
    pub(super) fn get_or_create(&self, id: u32) -> Option<&Seg> {
        let id = id as usize;
        self.chunks
            .get(id / CHUNK)?
            .get_or_init(|| (0..CHUNK).map(|_| Seg::default()).collect())
            .get(id % CHUNK)
    }
}
