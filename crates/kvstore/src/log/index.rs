//! The hash index: cache-line main buckets of ten compact slots, overflow buckets of four
//! (half a cache line), grown by linear hashing.
//!
//! # Slots
//!
//! A slot is two atomics side by side in its bucket: a 32-bit *location* (the low 12 bits
//! of the segment id and the 20-bit offset; 0 when the slot is empty) and a 16-bit *meta*
//! word: `MOVED | BUSY | win | fetched | freq(2) | tag(10 - ext) | seg_hi(ext)`. `ext`
//! (fixed per index, from the most segments the engine may have) lends the low bits of
//! the tag to the segment id: a cache of up to 4096 segments keeps a 10-bit tag, one of
//! 64 times as many a 4-bit tag (more records are read for nothing on a lookup, no more
//! memory is used). Six bytes a slot; a bucket's link to its overflow bucket shares its
//! cache line. The engine sees a slot as one [`Slot`] handle and one logical `u64` value
//! (`VALID | MOVED | win | fetched | freq | tag | segment | offset`, see [`pack`]): the
//! handle turns the two words into that value and back.
//!
//! That is the *compact* layout. The *wide* one ([`IndexLayout::Wide`], for a cache whose
//! items may live outside RAM) stores the logical value itself, one 64-bit word a slot,
//! seven to a main bucket and three to an overflow bucket: 2^22 segment ids, and a 16-bit
//! tag taken from hash bits `[base, base + 16)`, where `base` is the level the index
//! starts at (see below), so that a split reads a key's next address bit from its slot,
//! never from its record.
//!
//! # Who writes what
//!
//! Writers change a slot only while holding the lock stripe of its bucket, so writers
//! never race each other on a slot. Readers never lock: they load the location, then the
//! meta word (both acquire), and change only the access bits (`freq`, `fetched`), by a
//! compare-exchange of the meta word. A writer that replaces or clears an item first sets
//! `BUSY` in the meta word (a `fetch_or`, which also returns every access bit a reader set
//! before), then stores the location, then the final meta word (release). A reader's
//! compare-exchange expects a meta word without `BUSY`, so it fails during that window and
//! never lands on a value the writer is about to overwrite; a reader that loaded the new
//! location sees at least the `BUSY` word (it was stored before), and a reader that loaded
//! the old one reads the old record, which its pin keeps valid (the write is then not yet
//! visible to it, a linearizable outcome). A slot being filled for the first time gets its
//! meta word before its location, so a reader that sees the location sees the tag.
//!
//! A wide slot needs no `BUSY` window: readers and writers alike change it by
//! compare-exchange of the whole word, and a writer whose exchange fails (a reader set an
//! access bit) computes its value again from the one the reader left.
//!
//! An access mark that lands on the next item of a slot (a reader that loaded the old
//! item, raced with a replacement that left the meta word as it was) only misplaces one
//! access mark. The win mark of the meta protocol must not be misplaced: it is changed
//! only under the stripe lock ([`Slot::compare_exchange`] under the lock, after checking
//! that the slot still holds the item), by readers and writers alike.
//!
//! # Addressing and growth
//!
//! The table is sized to the items it holds, not to `-m`: it starts small and grows one
//! bucket at a time (linear hashing). The addressing state is a level `L` and a split
//! pointer `p`: `nmain = 2^L + p` main buckets; a key's bucket is `h mod 2^L`, or
//! `h mod 2^(L+1)` when that is below `p`. Splitting bucket `p` moves the items whose bit
//! `L` is set to the new bucket `p + 2^L`; buckets never move, so a slot's address stays
//! valid. An empty index that is about to be bulk loaded (a warm restart, which knows its
//! item count) is set to its final size at once instead (`presize`). Main and overflow
//! buckets each live in one mapping reserved up front for the most the memory limit could
//! need and touched only as the index grows. A wide index starts at its `base` level,
//! chosen so that at its largest size its tag still has 11 bits beyond the address. The
//! compact tag is the top bits of the hash, the bucket the low bits, the lock stripe the low bits too (`h mod nlocks`, with
//! `nlocks <= 2^L`), so a key's stripe never changes as the table grows and a split needs
//! one stripe lock.
//!
//! A split never lets a lock-free reader miss an item:
//! 1. Under the stripe lock, the chain is flagged as being worked on (`work`); each moving
//!    item's old slot is marked `MOVED` by an atomic `fetch_or` of its meta word, which
//!    returns the item with every access bit a reader set before (a reader's
//!    compare-exchange fails after it), and the item is then stored into the new bucket
//!    (not yet addressable). The state then advances, the work flag is cleared and the
//!    lock released.
//! 2. A reader skips `MOVED` slots. One that saw a `MOVED` slot with its tag and found
//!    nothing waits while its chain is flagged, then reloads the state: if its key's bucket
//!    changed it searches the new one; otherwise it rescans once (see 3).
//! 3. After a pin barrier (every reader that could still use the old addressing is gone)
//!    the `MOVED` slots are cleared and the chain compacted: items in overflow buckets move
//!    forward into free slots of the same chain by the same flag-mark-store steps (a reader
//!    that meets such a mark waits for the flag to clear and rescans the chain once).
//! 4. After a second barrier those marks are cleared and overflow buckets left empty are
//!    unlinked; after a third they may be reused (a reader inside an unlinked bucket still
//!    follows its intact `next` link back into the chain).
//!
//! Every key hashes to one main bucket; when its slots are taken the bucket chains to
//! overflow buckets from a pool (reused once unlinked, see above). When the pool is
//! exhausted, or the table has reached its largest size, an insert replaces a slot of the
//! chain (the index is lossy, as MICA's is: that item is evicted).
//!
//! Nothing here is `unsafe` but the reservation of the tables (all-zero bytes are valid
//! empty buckets).

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::mem::ZeroedSlice;

/// Slots of a main bucket.
pub(crate) const SLOTS: usize = 10;
/// Slots of an overflow bucket (half a cache line). Most chains that overflow do by a few
/// items (`bench/memory.sh`: BENCHMARKS.md).
pub(crate) const OVER_SLOTS: usize = 4;
/// Bytes one more main bucket adds to the index.
pub(crate) const BUCKET_BYTES: usize = std::mem::size_of::<Main>();
/// Bytes one more overflow bucket adds.
const OVER_BYTES: usize = std::mem::size_of::<Over>();

const OFF_BITS: u32 = 20;
const SEG_BITS: u32 = 22;
const TAG_SHIFT: u32 = OFF_BITS + SEG_BITS;
const FREQ_SHIFT: u32 = TAG_SHIFT + 16;
pub(crate) const FREQ_MAX: u64 = 3;
const FREQ_MASK: u64 = FREQ_MAX << FREQ_SHIFT;
pub(crate) const FETCHED: u64 = 1 << 60;
/// Meta protocol: a win token was handed out for this item.
pub(crate) const WIN: u64 = 1 << 61;
/// The item was copied elsewhere by a split or a compaction; this slot is only a marker
/// (never read through) until it is cleared after a pin barrier.
pub(crate) const MOVED: u64 = 1 << 62;
const VALID: u64 = 1 << 63;
/// The bits that name an item's location (everything but the access and win bits).
pub(crate) const IDENT_MASK: u64 = !(FREQ_MASK | FETCHED | WIN);
/// Largest in-segment offset + 1 a slot can name.
pub(crate) const MAX_OFFSET: usize = 1 << OFF_BITS;
/// Segment id bits a location word holds; the rest (`ext`) go into the meta word.
const LOC_SEG_BITS: u32 = 32 - OFF_BITS;
/// Bits of the meta word shared by the tag and the segment id's high bits.
const META_TAG_BITS: u32 = 10;
/// Most segment-id bits the meta word may take from the tag.
const MAX_EXT: u32 = 6;
/// Largest number of segments any index can name.
pub(crate) const MAX_SEGMENTS: usize = 1 << (LOC_SEG_BITS + MAX_EXT);
const _: () = assert!(LOC_SEG_BITS + MAX_EXT <= SEG_BITS);

/// Slots of a main bucket of the wide layout.
pub(crate) const WIDE_SLOTS: usize = 7;
/// Slots of an overflow bucket of the wide layout.
const WIDE_OVER_SLOTS: usize = 3;
/// Tag bits of a wide slot.
const WIDE_TAG_BITS: u32 = 16;
/// Tag bits a wide index keeps beyond a bucket's address at its largest size (a
/// tag false positive then costs about 12 / 2^11 reads per miss).
const WIDE_SPARE_TAG: u32 = 11;
/// The bits of a wide slot a lookup compares: valid, and the tag.
const WIDE_MATCH: u64 = VALID | (((1 << WIDE_TAG_BITS) - 1) << TAG_SHIFT);

/// Meta word bits.
const M_MOVED: u16 = 1 << 15;
const M_BUSY: u16 = 1 << 14;
const M_WIN: u16 = 1 << 13;
const M_FETCHED: u16 = 1 << 12;
const M_FREQ_SHIFT: u32 = 10;
const M_LOW: u16 = (1 << META_TAG_BITS) - 1;

const LEVEL_SHIFT: u32 = 32;

/// The full 10-bit tag of hash `h` (an index keeps its top `10 - ext` bits: [`Index::tag`]).
#[inline]
pub(crate) fn tag_of(h: u64) -> u64 {
    h >> (64 - META_TAG_BITS)
}

#[inline]
pub(crate) fn pack(tag: u64, seg: u32, off: u32, freq: u64, fetched: bool) -> u64 {
    VALID
        | if fetched { FETCHED } else { 0 }
        | (freq.min(FREQ_MAX) << FREQ_SHIFT)
        | ((tag & 0xffff) << TAG_SHIFT)
        | ((u64::from(seg) & ((1 << SEG_BITS) - 1)) << OFF_BITS)
        | (u64::from(off) & ((1 << OFF_BITS) - 1))
}

#[inline]
pub(crate) fn is_valid(v: u64) -> bool {
    v & VALID != 0
}
/// A slot that names a live record: valid and not a `MOVED` marker.
#[inline]
pub(crate) fn is_item(v: u64) -> bool {
    v & (VALID | MOVED) == VALID
}
#[inline]
pub(crate) fn slot_tag(v: u64) -> u64 {
    (v >> TAG_SHIFT) & 0xffff
}
#[inline]
pub(crate) fn slot_seg(v: u64) -> u32 {
    ((v >> OFF_BITS) & ((1 << SEG_BITS) - 1)) as u32
}
#[inline]
pub(crate) fn slot_off(v: u64) -> usize {
    (v & ((1 << OFF_BITS) - 1)) as usize
}
#[inline]
pub(crate) fn freq(v: u64) -> u64 {
    (v & FREQ_MASK) >> FREQ_SHIFT
}
#[inline]
pub(crate) fn fetched(v: u64) -> bool {
    v & FETCHED != 0
}
/// `v` with its access counter set to `f` (at most `FREQ_MAX`).
pub(crate) fn with_freq(v: u64, f: u64) -> u64 {
    (v & !FREQ_MASK) | (f.min(FREQ_MAX) << FREQ_SHIFT)
}

/// `v` with one more access recorded (saturating).
#[inline]
pub(crate) fn bumped(v: u64) -> u64 {
    let f = (freq(v) + 1).min(FREQ_MAX);
    (v & !FREQ_MASK) | (f << FREQ_SHIFT) | FETCHED
}

#[inline]
fn level(s: u64) -> u32 {
    (s >> LEVEL_SHIFT) as u32
}
#[inline]
fn split_ptr(s: u64) -> usize {
    (s & 0xffff_ffff) as usize
}
#[inline]
fn main_count(s: u64) -> usize {
    (1usize << level(s)) + split_ptr(s)
}
/// The main buckets under addressing `s` (from [`Index::addressing`]).
pub(crate) fn home_buckets(s: u64) -> usize {
    main_count(s)
}

/// For main bucket `b` under addressing `s`: the items it held then are, under any later
/// addressing, in the main buckets `b`, `b + stride`, `b + 2 * stride`, ... (splits only
/// move an item to a bucket that many above, and its bucket's low bits stay its hash's),
/// and every item in those buckets had `b` as its bucket under `s`.
pub(crate) fn home_stride(s: u64, b: usize) -> usize {
    let m = 1usize << level(s);
    if b < split_ptr(s) || b >= m {
        2 * m
    } else {
        m
    }
}

/// The main bucket of hash `h` under state `s`.
#[inline]
fn addr(h: u64, s: u64) -> usize {
    let m = 1u64 << level(s);
    let b = h & (m - 1);
    if (b as usize) < split_ptr(s) {
        (h & (2 * m - 1)) as usize
    } else {
        b as usize
    }
}

/// Where an insert went.
pub(crate) enum Insert<'a> {
    Stored,
    /// The chain is full and no overflow bucket is left: the caller evicts this slot's
    /// item and stores its value there.
    Victim(Slot<'a>),
    /// As `Victim`, but every candidate slot is a `MOVED` marker: nothing was stored.
    Full,
}

/// A main bucket of the compact layout: one cache line.
#[derive(Default)]
#[repr(C, align(64))]
struct Main {
    loc: [AtomicU32; SLOTS],
    meta: [AtomicU16; SLOTS],
    /// 1 + the overflow bucket that follows, or 0.
    next: AtomicU32,
}

/// An overflow bucket of the compact layout: half a cache line.
#[derive(Default)]
#[repr(C, align(32))]
struct Over {
    loc: [AtomicU32; OVER_SLOTS],
    meta: [AtomicU16; OVER_SLOTS],
    /// 1 + the overflow bucket that follows, or 0.
    next: AtomicU32,
}

/// A main bucket of the wide layout: one cache line.
#[derive(Default)]
#[repr(C, align(64))]
struct WideMain {
    slot: [AtomicU64; WIDE_SLOTS],
    /// 1 + the overflow bucket that follows, or 0.
    next: AtomicU32,
}

/// An overflow bucket of the wide layout: half a cache line.
#[derive(Default)]
#[repr(C, align(32))]
struct WideOver {
    slot: [AtomicU64; WIDE_OVER_SLOTS],
    /// 1 + the overflow bucket that follows, or 0.
    next: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Main>() == 64);
const _: () = assert!(std::mem::size_of::<Over>() == 32);
const _: () = assert!(std::mem::size_of::<WideMain>() == 64);
const _: () = assert!(std::mem::size_of::<WideOver>() == 32);

/// The logical value of a compact slot's location `loc` and meta word `m` (0: empty),
/// with `ext` segment-id bits in the meta word.
#[inline]
fn compact_value(loc: u32, m: u16, ext: u32) -> u64 {
    if loc == 0 {
        return 0;
    }
    let low = u64::from(m & M_LOW);
    let hi_mask = (1u64 << ext) - 1;
    let seg = ((low & hi_mask) << LOC_SEG_BITS) | u64::from(loc >> OFF_BITS);
    let tag = low & !hi_mask;
    let mut v = VALID
        | (tag << TAG_SHIFT)
        | (seg << OFF_BITS)
        | u64::from(loc & ((1 << OFF_BITS) - 1))
        | (u64::from((m >> M_FREQ_SHIFT) & 3) << FREQ_SHIFT);
    if m & M_MOVED != 0 {
        v |= MOVED;
    }
    if m & M_WIN != 0 {
        v |= WIN;
    }
    if m & M_FETCHED != 0 {
        v |= FETCHED;
    }
    v
}

/// The two words of a compact slot holding logical value `v` (a valid one).
#[inline]
fn compact_words(v: u64, ext: u32) -> (u32, u16) {
    let seg = u64::from(slot_seg(v));
    let loc = (((seg & ((1 << LOC_SEG_BITS) - 1)) << OFF_BITS) as u32) | slot_off(v) as u32;
    let hi_mask = (1u64 << ext) - 1;
    let low = (slot_tag(v) & !hi_mask & u64::from(M_LOW)) | ((seg >> LOC_SEG_BITS) & hi_mask);
    let mut m = low as u16 | ((freq(v) as u16) << M_FREQ_SHIFT);
    if v & MOVED != 0 {
        m |= M_MOVED;
    }
    if v & WIN != 0 {
        m |= M_WIN;
    }
    if v & FETCHED != 0 {
        m |= M_FETCHED;
    }
    (loc, m)
}

/// One slot of the index (see the module documentation): a handle on its words.
#[derive(Clone, Copy)]
pub(crate) struct Slot<'a>(Words<'a>);

#[derive(Clone, Copy)]
enum Words<'a> {
    /// A compact slot: its location and meta words, and the index's `ext`.
    Compact(&'a AtomicU32, &'a AtomicU16, u32),
    /// A wide slot: one word that is the logical value itself.
    Wide(&'a AtomicU64),
}

impl std::fmt::Debug for Slot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slot({:#x})", self.load())
    }
}

impl<'a> Slot<'a> {
    /// The slot's value (acquire): 0 when empty. A value being replaced reads as the old
    /// item or the new one.
    #[inline]
    pub(crate) fn load(&self) -> u64 {
        match self.0 {
            Words::Compact(loc, meta, ext) => {
                let l = loc.load(Ordering::Acquire);
                if l == 0 {
                    return 0;
                }
                compact_value(l, meta.load(Ordering::Acquire), ext)
            }
            Words::Wide(w) => w.load(Ordering::Acquire),
        }
    }

    /// Whether the slot is empty (no item, no marker). Writers, under the stripe lock.
    #[inline]
    fn is_empty(&self) -> bool {
        match self.0 {
            Words::Compact(loc, ..) => loc.load(Ordering::Relaxed) == 0,
            Words::Wide(w) => w.load(Ordering::Relaxed) == 0,
        }
    }

    /// Store `v` (0: clear the slot). Writers only, under the slot's stripe lock.
    pub(crate) fn store(&self, v: u64) {
        self.fetch_update(|_| v);
    }

    /// Replace the slot's value by `f(current)`; returns the value replaced. The current
    /// value includes every access bit a reader set before (compact: readers'
    /// compare-exchanges fail from the moment it is read until the new value is in; wide:
    /// a reader's change in between makes the writer's compare-exchange fail, and `f` is
    /// called again on the new value, so `f` must be a pure function of it). Writers only,
    /// under the slot's stripe lock.
    pub(crate) fn fetch_update(&self, mut f: impl FnMut(u64) -> u64) -> u64 {
        let (loc, meta, ext) = match self.0 {
            Words::Compact(loc, meta, ext) => (loc, meta, ext),
            Words::Wide(w) => {
                let mut cur = w.load(Ordering::Relaxed);
                loop {
                    let v = f(cur);
                    let new = if is_valid(v) { v } else { 0 };
                    match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                        Ok(_) => return cur,
                        Err(x) => cur = x,
                    }
                }
            }
        };
        let l = loc.load(Ordering::Relaxed);
        if l == 0 {
            let v = f(0);
            if is_valid(v) {
                // A fresh slot: the tag before the location, so that a reader that sees
                // the location sees the tag.
                let (l, m) = compact_words(v, ext);
                meta.store(m, Ordering::Relaxed);
                loc.store(l, Ordering::Release);
            }
            return 0;
        }
        let m = meta.fetch_or(M_BUSY, Ordering::Acquire);
        let prev = compact_value(l, m & !M_BUSY, ext);
        let v = f(prev);
        if is_valid(v) {
            let (l, m) = compact_words(v, ext);
            loc.store(l, Ordering::Release);
            meta.store(m, Ordering::Release);
        } else {
            loc.store(0, Ordering::Release);
            meta.store(0, Ordering::Release);
        }
        prev
    }

    /// Change the access bits (`freq`, `fetched`, win) of the item the slot holds from
    /// those of `cur` to those of `new` (which names the same item), if they still are
    /// `cur`'s and no writer is replacing the item; else the current value. Without the
    /// stripe lock the change may land on a item that replaced `cur` meanwhile with equal
    /// bits (compact slots compare only their meta word): fine for access marks, not for
    /// the win mark (whose callers hold the lock).
    #[inline]
    pub(crate) fn compare_exchange(&self, cur: u64, new: u64) -> Result<u64, u64> {
        debug_assert_eq!(cur & IDENT_MASK, new & IDENT_MASK);
        match self.0 {
            Words::Compact(loc, meta, ext) => {
                let (_, mc) = compact_words(cur, ext);
                let (_, mn) = compact_words(new, ext);
                match meta.compare_exchange(mc, mn, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => Ok(cur),
                    Err(m) => Err(compact_value(loc.load(Ordering::Acquire), m & !M_BUSY, ext)),
                }
            }
            Words::Wide(w) => w
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
                .map(|_| cur),
        }
    }

    /// Mark the slot `MOVED`; returns the item value it held (with every access bit a
    /// reader set before the mark: their compare-exchanges fail after it). Under the
    /// stripe lock.
    fn mark(&self) -> u64 {
        match self.0 {
            Words::Compact(loc, meta, ext) => {
                let l = loc.load(Ordering::Relaxed);
                let m = meta.fetch_or(M_MOVED, Ordering::AcqRel);
                compact_value(l, m, ext)
            }
            Words::Wide(w) => w.fetch_or(MOVED, Ordering::AcqRel),
        }
    }
}

/// One bucket of a chain, in either layout.
#[derive(Clone, Copy)]
enum Bucket<'a> {
    Compact(&'a [AtomicU32], &'a [AtomicU16], &'a AtomicU32, u32),
    Wide(&'a [AtomicU64], &'a AtomicU32),
}

impl<'a> Bucket<'a> {
    /// The link to the next bucket (1 + its index in the pool, or 0).
    #[inline]
    fn next(self) -> &'a AtomicU32 {
        match self {
            Bucket::Compact(_, _, next, _) | Bucket::Wide(_, next) => next,
        }
    }

    fn len(self) -> usize {
        match self {
            Bucket::Compact(locs, ..) => locs.len(),
            Bucket::Wide(words, _) => words.len(),
        }
    }

    /// Slot `i`, None past the end.
    #[inline]
    fn slot(self, i: usize) -> Option<Slot<'a>> {
        match self {
            Bucket::Compact(locs, metas, _, ext) => {
                Some(Slot(Words::Compact(locs.get(i)?, metas.get(i)?, ext)))
            }
            Bucket::Wide(words, _) => Some(Slot(Words::Wide(words.get(i)?))),
        }
    }

    /// Call `f` with each slot.
    #[inline]
    fn each(self, mut f: impl FnMut(Slot<'a>)) {
        match self {
            Bucket::Compact(locs, metas, _, ext) => {
                for (loc, meta) in locs.iter().zip(metas) {
                    f(Slot(Words::Compact(loc, meta, ext)));
                }
            }
            Bucket::Wide(words, _) => words.iter().for_each(|w| f(Slot(Words::Wide(w)))),
        }
    }
}

/// The index's tables, in one of its two layouts (see the module documentation).
enum Tables {
    Compact {
        main: ZeroedSlice<Main>,
        over: ZeroedSlice<Over>,
    },
    Wide {
        main: ZeroedSlice<WideMain>,
        over: ZeroedSlice<WideOver>,
    },
}

/// How an index stores its slots (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IndexLayout {
    /// Six bytes a slot, ten slots a cache line: the least memory per item, up to 2^18
    /// segments (a shorter tag past 4096).
    #[default]
    Compact,
    /// Eight bytes a slot, seven a cache line: 2^22 segments and 16-bit tags that growth
    /// splits by, so a split reads no record (what items outside RAM need).
    Wide,
}

/// A bucket of a chain: a main bucket (its index), or an overflow bucket (its index in
/// the pool).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Node {
    Main(usize),
    Over(usize),
}

pub(crate) struct Index {
    /// Main buckets `0 .. max_main` and the overflow pool.
    tables: Tables,
    max_main: usize,
    /// Compact layout: segment-id bits taken from the tag (see the module documentation).
    ext: u32,
    /// Wide layout: the lowest hash bit of the tag (the level it starts at).
    base: u32,
    /// `level << 32 | split pointer` (see the module documentation).
    state: AtomicU64,
    /// 1 + the main bucket whose chain is being split or compacted, or 0.
    work: AtomicUsize,
    /// Overflow buckets ever handed out (the pool's high-water mark).
    over_used: AtomicUsize,
    /// Overflow buckets unlinked and past their barriers: free to link again.
    over_free: Mutex<Vec<u32>>,
    /// Lock stripes. Each guards its keys' chains.
    locks: Box<[Mutex<()>]>,
    /// Per stripe, the CAS floor the engine keeps (see `cas.rs`): changed under the
    /// stripe's lock.
    floors: Box<[AtomicU64]>,
}

/// Slots of a main bucket in `layout`.
fn main_slots(layout: IndexLayout) -> usize {
    match layout {
        IndexLayout::Compact => SLOTS,
        IndexLayout::Wide => WIDE_SLOTS,
    }
}

/// The level a wide index of at most `max_main` main buckets with `nlocks` stripes starts
/// at, which is also its tag's lowest hash bit: high enough that at the largest size the
/// tag still has `WIDE_SPARE_TAG` bits beyond the bucket's address.
fn wide_base(max_main: usize, nlocks: usize) -> u32 {
    let top = usize::BITS - 1 - max_main.leading_zeros();
    top.saturating_sub(WIDE_TAG_BITS - WIDE_SPARE_TAG - 1)
        .max(nlocks.trailing_zeros())
}

impl Index {
    /// The bytes [`Index::new`]`(max_slots, _, layout)` starts with.
    pub(crate) fn initial_bytes(max_slots: usize, layout: IndexLayout) -> usize {
        let (max_main, nlocks) = Self::start(max_slots, layout);
        let nmain = match layout {
            IndexLayout::Compact => nlocks,
            IndexLayout::Wide => 1 << wide_base(max_main, nlocks),
        };
        nmain * BUCKET_BYTES + nlocks * (std::mem::size_of::<Mutex<()>>() + 8)
    }

    /// The most main buckets for `max_slots`, and the lock stripes (also the main buckets
    /// a compact index starts with).
    fn start(max_slots: usize, layout: IndexLayout) -> (usize, usize) {
        let max_main = max_slots
            .div_ceil(main_slots(layout))
            .clamp(16, u32::MAX as usize / 2);
        let nlocks = (max_main / 4).clamp(16, 4096).next_power_of_two();
        (max_main, nlocks)
    }

    /// An index that can grow to about `max_slots` slots in main buckets (plus 40% more
    /// in overflow buckets), naming up to `max_segments` segments (compact; a wide index
    /// names 2^22). It starts small (a wide one at its base level); its pages become
    /// resident only as it grows.
    pub(crate) fn new(max_slots: usize, max_segments: usize, layout: IndexLayout) -> Index {
        let (mut max_main, nlocks) = Self::start(max_slots, layout);
        let mut ext = 0;
        while layout == IndexLayout::Compact
            && ext < MAX_EXT
            && max_segments > 1 << (LOC_SEG_BITS + ext)
        {
            ext += 1;
        }
        loop {
            let over = max_main + 8;
            let tables = match layout {
                // SAFETY: buckets are atomics, valid and empty as all-zero bytes (no item,
                // no link); none needs drop; alignment is at most 64.
                IndexLayout::Compact => unsafe {
                    match (ZeroedSlice::reserve(max_main), ZeroedSlice::reserve(over)) {
                        (Some(main), Some(over)) => Some(Tables::Compact { main, over }),
                        _ => None,
                    }
                },
                // SAFETY: as above.
                IndexLayout::Wide => unsafe {
                    match (ZeroedSlice::reserve(max_main), ZeroedSlice::reserve(over)) {
                        (Some(main), Some(over)) => Some(Tables::Wide { main, over }),
                        _ => None,
                    }
                },
            };
            let tables = match tables {
                Some(t) => t,
                None if max_main > 2 * nlocks => {
                    max_main /= 2;
                    continue;
                }
                // SAFETY: as above.
                None => unsafe {
                    match layout {
                        IndexLayout::Compact => Tables::Compact {
                            main: ZeroedSlice::new(max_main),
                            over: ZeroedSlice::new(over),
                        },
                        IndexLayout::Wide => Tables::Wide {
                            main: ZeroedSlice::new(max_main),
                            over: ZeroedSlice::new(over),
                        },
                    }
                },
            };
            let (base, level) = match layout {
                IndexLayout::Compact => (0, nlocks.trailing_zeros()),
                IndexLayout::Wide => {
                    let base = wide_base(max_main, nlocks);
                    (base, base)
                }
            };
            return Index {
                tables,
                max_main,
                ext,
                base,
                state: AtomicU64::new(u64::from(level) << LEVEL_SHIFT),
                work: AtomicUsize::new(0),
                over_used: AtomicUsize::new(0),
                over_free: Mutex::new(Vec::new()),
                locks: (0..nlocks).map(|_| Mutex::new(())).collect(),
                floors: (0..nlocks).map(|_| AtomicU64::new(0)).collect(),
            };
        }
    }

    /// The index's layout.
    pub(crate) fn layout(&self) -> IndexLayout {
        match self.tables {
            Tables::Compact { .. } => IndexLayout::Compact,
            Tables::Wide { .. } => IndexLayout::Wide,
        }
    }

    /// Slots of a main bucket.
    pub(crate) fn slots_per_main(&self) -> usize {
        main_slots(self.layout())
    }

    /// Bytes the index occupies (main buckets in use and every overflow bucket ever
    /// handed out).
    pub(crate) fn bytes(&self) -> usize {
        self.nmain() * BUCKET_BYTES
            + self.overflow_used() * OVER_BYTES
            + self.locks.len() * (std::mem::size_of::<Mutex<()>>() + 8)
    }

    /// The most segments a slot of this index can name.
    pub(crate) fn max_segments(&self) -> usize {
        match self.tables {
            Tables::Compact { .. } => 1 << (LOC_SEG_BITS + self.ext),
            Tables::Wide { .. } => 1 << SEG_BITS,
        }
    }

    /// The tag this index keeps for hash `h` (as [`slot_tag`] reads it back).
    #[inline]
    pub(crate) fn tag(&self, h: u64) -> u64 {
        match self.tables {
            Tables::Compact { .. } => tag_of(h) & !((1u64 << self.ext) - 1),
            Tables::Wide { .. } => (h >> self.base) & ((1 << WIDE_TAG_BITS) - 1),
        }
    }

    /// Main buckets in use now.
    pub(crate) fn nmain(&self) -> usize {
        main_count(self.state.load(Ordering::Acquire))
    }

    /// The addressing now (level and split pointer), for a walk that must follow splits:
    /// see [`home_buckets`] and [`home_stride`].
    pub(crate) fn addressing(&self) -> u64 {
        self.state.load(Ordering::Acquire)
    }

    /// The level `L` (`2^L <= nmain < 2^(L+1)`), memcached's `hash_power_level` analog.
    pub(crate) fn level(&self) -> u32 {
        level(self.state.load(Ordering::Acquire))
    }

    /// Main buckets the index may grow to.
    pub(crate) fn max_main(&self) -> usize {
        self.max_main
    }

    /// Overflow buckets in the pool.
    fn over_len(&self) -> usize {
        match &self.tables {
            Tables::Compact { over, .. } => over.len(),
            Tables::Wide { over, .. } => over.len(),
        }
    }

    /// Overflow buckets ever handed out.
    pub(crate) fn overflow_used(&self) -> usize {
        self.over_used.load(Ordering::Relaxed).min(self.over_len())
    }

    /// Chain bucket `n`.
    #[inline]
    fn bucket(&self, n: Node) -> Option<Bucket<'_>> {
        match (&self.tables, n) {
            (Tables::Compact { main, .. }, Node::Main(b)) => main
                .get(b)
                .map(|m| Bucket::Compact(&m.loc, &m.meta, &m.next, self.ext)),
            (Tables::Compact { over, .. }, Node::Over(o)) => over
                .get(o)
                .map(|m| Bucket::Compact(&m.loc, &m.meta, &m.next, self.ext)),
            (Tables::Wide { main, .. }, Node::Main(b)) => {
                main.get(b).map(|m| Bucket::Wide(&m.slot, &m.next))
            }
            (Tables::Wide { over, .. }, Node::Over(o)) => {
                over.get(o).map(|m| Bucket::Wide(&m.slot, &m.next))
            }
        }
    }

    /// Call `f` with each slot of chain bucket `n`; returns its link.
    #[inline]
    fn slots_of<'a>(&'a self, n: Node, f: impl FnMut(Slot<'a>)) -> Option<&'a AtomicU32> {
        let bucket = self.bucket(n)?;
        bucket.each(f);
        Some(bucket.next())
    }

    /// The chain bucket after `n`, if any.
    #[inline]
    fn follow(&self, link: &AtomicU32) -> Option<Node> {
        let v = link.load(Ordering::Acquire);
        (v != 0).then(|| Node::Over(v as usize - 1))
    }

    /// Lock the stripe that guards `h`'s bucket chain.
    pub(crate) fn lock(&self, h: u64) -> MutexGuard<'_, ()> {
        self.lock_bucket(h as usize)
    }

    /// Lock the stripe of main bucket `b` (for scans that walk buckets, not keys): the
    /// same stripe as every key whose bucket is `b`.
    pub(crate) fn lock_bucket(&self, b: usize) -> MutexGuard<'_, ()> {
        let i = b & (self.locks.len() - 1);
        match self.locks.get(i) {
            Some(m) => m.lock().unwrap_or_else(|e| e.into_inner()),
            // Unreachable: the mask keeps `i` in range.
            None => self.locks[0].lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// The CAS floor of `h`'s stripe: a version no new record of its keys may go below
    /// (see `cas.rs`). Read under the stripe lock.
    pub(crate) fn floor(&self, h: u64) -> u64 {
        let i = h as usize & (self.locks.len() - 1);
        self.floors.get(i).map_or(0, |f| f.load(Ordering::Relaxed))
    }

    /// Raise the CAS floor of `h`'s stripe to at least `v`. Under the stripe lock.
    pub(crate) fn raise_floor(&self, h: u64, v: u64) {
        let i = h as usize & (self.locks.len() - 1);
        if let Some(f) = self.floors.get(i) {
            f.fetch_max(v, Ordering::Relaxed);
        }
    }

    /// Call `f` on every item slot of `h`'s chain whose tag matches, until it returns
    /// true; returns that slot and the value `f` saw. Lock-free (see the module
    /// documentation for how a concurrent split or compaction is followed).
    #[inline]
    pub(crate) fn find(&self, h: u64, f: impl FnMut(u64) -> bool) -> Option<(Slot<'_>, u64)> {
        // One dispatch on the layout per lookup, none per bucket or slot.
        match &self.tables {
            Tables::Compact { main, over } => self.find_compact(main, over, h, f),
            Tables::Wide { main, over } => self.find_wide(main, over, h, f),
        }
    }

    #[inline]
    fn find_compact<'a>(
        &'a self,
        main: &'a ZeroedSlice<Main>,
        over: &'a ZeroedSlice<Over>,
        h: u64,
        mut f: impl FnMut(u64) -> bool,
    ) -> Option<(Slot<'a>, u64)> {
        let tag = tag_of(h) & !((1u64 << self.ext) - 1);
        let (want, mask) = self.meta_tag(tag);
        let mut b = addr(h, self.state.load(Ordering::Acquire));
        let mut rescanned = false;
        loop {
            let mut moved = false;
            let m = main.get(b)?;
            let ext = self.ext;
            if let Some(hit) =
                scan_compact(&m.loc, &m.meta, ext, (tag, want, mask), &mut moved, &mut f)
            {
                return Some(hit);
            }
            let mut next = &m.next;
            while let Some(Node::Over(o)) = self.follow(next) {
                let ob = over.get(o)?;
                let found = scan_compact(
                    &ob.loc,
                    &ob.meta,
                    ext,
                    (tag, want, mask),
                    &mut moved,
                    &mut f,
                );
                if found.is_some() {
                    return found;
                }
                next = &ob.next;
            }
            if !moved {
                return None;
            }
            b = self.after_moved(h, b, &mut rescanned)?;
        }
    }

    #[inline]
    fn find_wide<'a>(
        &'a self,
        main: &'a ZeroedSlice<WideMain>,
        over: &'a ZeroedSlice<WideOver>,
        h: u64,
        mut f: impl FnMut(u64) -> bool,
    ) -> Option<(Slot<'a>, u64)> {
        let want = VALID | (self.tag(h) << TAG_SHIFT);
        let mut b = addr(h, self.state.load(Ordering::Acquire));
        let mut rescanned = false;
        loop {
            let mut moved = false;
            let m = main.get(b)?;
            if let Some(hit) = scan_wide(&m.slot, want, &mut moved, &mut f) {
                return Some(hit);
            }
            let mut next = &m.next;
            while let Some(Node::Over(o)) = self.follow(next) {
                let ob = over.get(o)?;
                if let Some(hit) = scan_wide(&ob.slot, want, &mut moved, &mut f) {
                    return Some(hit);
                }
                next = &ob.next;
            }
            if !moved {
                return None;
            }
            b = self.after_moved(h, b, &mut rescanned)?;
        }
    }

    /// A lookup of `h` in main bucket `b`'s chain met a `MOVED` slot with its tag and
    /// found nothing: maybe its item, whose copy is in place once the work on this chain
    /// is over. The bucket to search again, or None when it was searched again already.
    #[cold]
    fn after_moved(&self, h: u64, b: usize, rescanned: &mut bool) -> Option<usize> {
        let mut spins = 0u32;
        while self.work.load(Ordering::Acquire) == b + 1 {
            // Bounded work by a thread that holds this chain's stripe lock.
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let nb = addr(h, self.state.load(Ordering::Acquire));
        if nb != b {
            Some(nb)
        } else if *rescanned {
            None
        } else {
            // Moved within the chain (compaction), or another key's marker.
            *rescanned = true;
            Some(b)
        }
    }

    /// A fresh overflow bucket (all slots empty, no next link), or None.
    fn take_overflow(&self) -> Option<usize> {
        let reused = self
            .over_free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        if let Some(o) = reused {
            let o = o as usize;
            self.bucket(Node::Over(o))?
                .next()
                .store(0, Ordering::Relaxed);
            return Some(o);
        }
        let o = self.over_used.fetch_add(1, Ordering::Relaxed);
        (o < self.over_len()).then_some(o)
    }

    /// Put `v` into the first free slot of the chain of main bucket `b`; link an overflow
    /// bucket if the chain is full. When none is left, returns a slot of the chain's last
    /// bucket to replace, looking from slot `start` (modulo the bucket's slots) on.
    fn insert_at(&self, b: usize, start: usize, v: u64) -> Insert<'_> {
        let mut c = Node::Main(b);
        loop {
            let Some(bucket) = self.bucket(c) else {
                return Insert::Full;
            };
            let n = bucket.len();
            for i in 0..n {
                if let Some(slot) = bucket.slot(i).filter(Slot::is_empty) {
                    slot.store(v);
                    return Insert::Stored;
                }
            }
            if let Some(n) = self.follow(bucket.next()) {
                c = n;
                continue;
            }
            // End of the chain: link a fresh overflow bucket, or replace a slot here.
            if let Some(o) = self.take_overflow() {
                // The new bucket is empty and unreachable: fill its first slot before
                // linking it so readers find the item as soon as they see the bucket.
                if let Some(first) = self.bucket(Node::Over(o)).and_then(|f| f.slot(0)) {
                    first.store(v);
                    bucket.next().store(o as u32 + 1, Ordering::Release);
                    return Insert::Stored;
                }
            }
            for i in 0..n {
                if let Some(slot) = bucket.slot((start + i) % n) {
                    if is_item(slot.load()) {
                        return Insert::Victim(slot);
                    }
                }
            }
            return Insert::Full;
        }
    }

    /// Put `v` into a free slot of `h`'s chain.
    ///
    /// The caller holds `h`'s stripe lock (which keeps `h`'s bucket fixed).
    pub(crate) fn insert(&self, h: u64, v: u64) -> Insert<'_> {
        let b = addr(h, self.state.load(Ordering::Acquire));
        self.insert_at(b, (h >> 32) as usize, v)
    }

    /// Visit every item slot of the main bucket `b` and its chain.
    pub(crate) fn for_each_in_chain<'a>(&'a self, b: usize, mut f: impl FnMut(Slot<'a>, u64)) {
        self.walk(b, |_, slot| {
            let v = slot.load();
            if is_item(v) {
                f(slot, v);
            }
        });
    }

    /// Visit every slot of `b`'s chain, saying whether it is in an overflow bucket.
    fn walk<'a>(&'a self, b: usize, mut f: impl FnMut(bool, Slot<'a>)) {
        let mut c = Node::Main(b);
        loop {
            let over = matches!(c, Node::Over(_));
            let Some(next) = self.slots_of(c, |s| f(over, s)) else {
                return;
            };
            match self.follow(next) {
                Some(n) => c = n,
                None => return,
            }
        }
    }

    // ---- growth (one thread at a time: the engine's grow lock) ----------------------

    /// The bucket the next split would split and its level, or None at the largest size.
    pub(crate) fn next_split(&self) -> Option<(usize, u32)> {
        let s = self.state.load(Ordering::Acquire);
        (main_count(s) < self.max_main).then(|| (split_ptr(s), level(s)))
    }

    /// Split bucket `b` at level `l` (from [`Index::next_split`]): `hash` gives the hash of
    /// an item slot's key (it may read the record: the caller holds `b`'s stripe lock; a
    /// wide index takes bit `l` from the slot's tag and never calls it).
    /// Items whose bit `l` is set move to bucket `b + 2^l`, leaving `MOVED` markers here;
    /// `evict` is called with a slot (already a marker) and the item it held when the
    /// new bucket has no room, and must clear the slot. Then the state advances.
    ///
    /// The caller holds the grow lock and `b`'s stripe lock.
    pub(crate) fn split(
        &self,
        b: usize,
        l: u32,
        mut hash: impl FnMut(u64) -> Option<u64>,
        mut evict: impl FnMut(Slot<'_>, u64),
    ) {
        let s = self.state.load(Ordering::Acquire);
        if split_ptr(s) != b || level(s) != l {
            return;
        }
        let to = b + (1usize << l);
        let from_tag =
            self.layout() == IndexLayout::Wide && l >= self.base && l < self.base + WIDE_TAG_BITS;
        self.work.store(b + 1, Ordering::Release);
        self.walk(b, |_, slot| {
            let v = slot.load();
            if !is_item(v) {
                return;
            }
            let (bit, start) = if from_tag {
                (slot_tag(v) >> (l - self.base) & 1, slot_off(v))
            } else {
                let Some(h) = hash(v) else { return };
                (h >> l & 1, (h >> 32) as usize)
            };
            if bit == 0 {
                return;
            }
            let x = slot.mark();
            if !matches!(self.insert_at(to, start, x & !MOVED), Insert::Stored) {
                evict(slot, x);
            }
        });
        let n = if b + 1 == 1usize << l {
            u64::from(l + 1) << LEVEL_SHIFT
        } else {
            (u64::from(l) << LEVEL_SHIFT) | (b as u64 + 1)
        };
        self.state.store(n, Ordering::Release);
        self.work.store(0, Ordering::Release);
    }

    /// Whether main bucket `b`'s chain has an overflow bucket.
    pub(crate) fn has_overflow(&self, b: usize) -> bool {
        self.bucket(Node::Main(b))
            .is_some_and(|m| m.next().load(Ordering::Relaxed) != 0)
    }

    /// Compact `b`'s chain after a barrier: clear its `MOVED` markers, then move items
    /// from overflow buckets forward into free slots (marking the old slots `MOVED`).
    /// Returns whether any item moved (another barrier is then due before
    /// [`Index::release_chain`]).
    ///
    /// The caller holds the grow lock and `b`'s stripe lock, and every reader that could
    /// have seen this chain's markers has unpinned since they were set.
    pub(crate) fn compact(&self, b: usize) -> bool {
        self.clear_markers(b);
        self.work.store(b + 1, Ordering::Release);
        let mut moved = false;
        let mut free: Vec<Slot<'_>> = Vec::new();
        self.walk(b, |over, slot| {
            let v = slot.load();
            if v == 0 {
                free.push(slot);
            } else if over && is_item(v) {
                // In an overflow bucket: the first free slot before it, if any.
                if !free.is_empty() {
                    let to = free.remove(0);
                    let x = slot.mark();
                    to.store(x & !MOVED);
                    moved = true;
                }
            }
        });
        self.work.store(0, Ordering::Release);
        moved
    }

    /// Clear `b`'s markers and unlink the overflow buckets of its chain left empty;
    /// returns them (to [`Index::recycle`] after one more barrier).
    ///
    /// The caller holds the grow lock and `b`'s stripe lock, and every reader that could
    /// have seen this chain's markers has unpinned since they were set.
    pub(crate) fn release_chain(&self, b: usize) -> Vec<u32> {
        self.clear_markers(b);
        let mut out = Vec::new();
        let Some(mut link) = self.bucket(Node::Main(b)).map(Bucket::next) else {
            return out;
        };
        loop {
            let n = link.load(Ordering::Acquire);
            if n == 0 {
                return out;
            }
            let Some(cur) = self.bucket(Node::Over(n as usize - 1)) else {
                return out;
            };
            let mut empty = true;
            cur.each(|s| empty &= s.is_empty());
            if empty {
                // Readers inside `cur` still follow its own link back into the chain;
                // it is reused only after another barrier.
                link.store(cur.next().load(Ordering::Acquire), Ordering::Release);
                out.push(n - 1);
            } else {
                link = cur.next();
            }
        }
    }

    /// Overflow buckets unlinked by [`Index::release_chain`] before a barrier that no
    /// reader inside them can have survived: free to link again.
    pub(crate) fn recycle(&self, ids: Vec<u32>) {
        if !ids.is_empty() {
            self.over_free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(ids);
        }
    }

    /// Grow an index that holds no item to `nmain` main buckets at once (at most
    /// [`Index::max_main`]; never shrinks): a warm restart knows how many items are coming
    /// and skips the splits. Nothing moves, so no barrier is due; but a key's bucket
    /// changes, so the caller must be the only thread using the index (the engine checks
    /// that it is empty and holds the grow lock).
    pub(crate) fn presize(&self, nmain: usize) {
        let s = self.state.load(Ordering::Acquire);
        let n = nmain.min(self.max_main);
        if n <= main_count(s) {
            return;
        }
        let l = usize::BITS - 1 - n.leading_zeros();
        let p = n - (1usize << l);
        self.state
            .store((u64::from(l) << LEVEL_SHIFT) | p as u64, Ordering::Release);
        // The whole table is about to be written: fault it in at once.
        match &self.tables {
            Tables::Compact { main, .. } => main.populate(n),
            Tables::Wide { main, .. } => main.populate(n),
        }
    }

    /// Start loading the cache line of `h`'s main bucket (its slots and link), for a caller
    /// that will look it up a few keys from now.
    #[inline]
    pub(crate) fn prefetch(&self, h: u64) {
        let b = addr(h, self.state.load(Ordering::Relaxed));
        let line = match &self.tables {
            Tables::Compact { main, .. } => main.get(b).map(|m| std::ptr::from_ref(m).cast()),
            Tables::Wide { main, .. } => main.get(b).map(|m| std::ptr::from_ref(m).cast()),
        };
        if let Some(p) = line {
            prefetch(p);
        }
    }

    /// The slot values in `h`'s main bucket with its tag (for prefetching records: no
    /// chain walk, no moved-slot handling, a hint may miss). Also starts loading the
    /// chain's first overflow bucket, whose link is in the main bucket's line: at the
    /// index's load (more items than main slots) a lookup often walks into it, and
    /// nothing else loads it ahead.
    #[inline]
    pub(crate) fn tagged_in_main(&self, h: u64, mut f: impl FnMut(u64)) {
        let tag = self.tag(h);
        let (want, mask) = self.meta_tag(tag);
        let b = addr(h, self.state.load(Ordering::Relaxed));
        match &self.tables {
            Tables::Compact { main, over } => {
                let Some(m) = main.get(b) else { return };
                self.prefetch_linked(&m.next, over);
                for (loc, meta) in m.loc.iter().zip(&m.meta) {
                    if meta.load(Ordering::Relaxed) & mask == want {
                        let v = Slot(Words::Compact(loc, meta, self.ext)).load();
                        if is_item(v) && slot_tag(v) == tag {
                            f(v);
                        }
                    }
                }
            }
            Tables::Wide { main, over } => {
                let Some(m) = main.get(b) else { return };
                self.prefetch_linked(&m.next, over);
                for w in &m.slot {
                    let v = w.load(Ordering::Relaxed);
                    if v & (WIDE_MATCH | MOVED) == VALID | (tag << TAG_SHIFT) {
                        f(v);
                    }
                }
            }
        }
    }

    /// Start loading the overflow bucket `next` links to, if any.
    #[inline]
    fn prefetch_linked<T>(&self, next: &AtomicU32, over: &[T]) {
        if let Some(Node::Over(o)) = self.follow(next) {
            if let Some(ob) = over.get(o) {
                prefetch(std::ptr::from_ref(ob).cast());
            }
        }
    }

    /// The meta word's bits that hold a tag, and tag `tag` (from [`Index::tag`]) in them
    /// (compact layout).
    #[inline]
    fn meta_tag(&self, tag: u64) -> (u16, u16) {
        let mask = M_LOW & !(((1u32 << self.ext) - 1) as u16);
        (tag as u16 & mask, mask)
    }

    fn clear_markers(&self, b: usize) {
        self.walk(b, |_, slot| {
            if slot.load() & MOVED != 0 {
                slot.store(0);
            }
        });
    }
}

/// [`Index::find`] in one compact bucket (a fixed-size array, so the loop is unrolled):
/// `f` on each item slot whose tag (`tag`, in the meta word's `mask` as `want`) matches,
/// until it returns true; `moved` is set when a marker with the tag was passed.
#[inline(always)]
fn scan_compact<'a, const N: usize>(
    locs: &'a [AtomicU32; N],
    metas: &'a [AtomicU16; N],
    ext: u32,
    (tag, want, mask): (u64, u16, u16),
    moved: &mut bool,
    f: &mut impl FnMut(u64) -> bool,
) -> Option<(Slot<'a>, u64)> {
    for i in 0..N {
        let (loc, meta) = (&locs[i], &metas[i]);
        // The tag alone first, from the meta word (another key's slot costs one load); a
        // slot whose item changes meanwhile was being written, which a lookup may see
        // before or after. A split or compaction leaves the tag of the slot it marks as it
        // was.
        if meta.load(Ordering::Relaxed) & mask != want {
            continue;
        }
        let slot = Slot(Words::Compact(loc, meta, ext));
        let v = slot.load();
        if is_valid(v) && slot_tag(v) == tag {
            if v & MOVED != 0 {
                *moved = true;
            } else if f(v) {
                return Some((slot, v));
            }
        }
    }
    None
}

/// [`Index::find`] in one wide bucket: one load a slot, the word being the whole value.
#[inline(always)]
fn scan_wide<'a, const N: usize>(
    words: &'a [AtomicU64; N],
    want: u64,
    moved: &mut bool,
    f: &mut impl FnMut(u64) -> bool,
) -> Option<(Slot<'a>, u64)> {
    for w in words {
        let v = w.load(Ordering::Acquire);
        if v & WIDE_MATCH != want {
            continue;
        }
        if v & MOVED != 0 {
            *moved = true;
        } else if f(v) {
            return Some((Slot(Words::Wide(w)), v));
        }
    }
    None
}

/// A hint to load the cache line at `p` (no effect on other architectures).
#[inline(always)]
pub(crate) fn prefetch(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and reads nothing observable,
    // whatever the address; SSE is part of x86_64's baseline.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot's value survives the trip through its two words for every segment-id split,
    /// at the extremes of each field.
    #[test]
    fn slot_packing() {
        for ext in 0..=MAX_EXT {
            let idx = Index {
                ext,
                ..Index::new(64, 1, IndexLayout::Compact)
            };
            let (loc, meta) = (AtomicU32::new(0), AtomicU16::new(0));
            let slot = Slot(Words::Compact(&loc, &meta, ext));
            let max_seg = (idx.max_segments() - 1) as u32;
            for (tag, seg, off) in [
                (0x3ff, max_seg, (MAX_OFFSET - 1) as u32),
                (0, 0, 24),
                (0x155, max_seg / 3, 12_345),
            ] {
                let tag = tag & !((1 << ext) - 1);
                let v = pack(tag, seg, off, 2, true);
                slot.store(v);
                assert_eq!(slot.load(), v, "ext {ext}");
                assert_eq!(slot_tag(v), tag);
                assert_eq!(slot_seg(slot.load()), seg);
                assert_eq!(slot_off(slot.load()), off as usize);
                let w = v | WIN;
                assert_eq!(slot.compare_exchange(v, w), Ok(v));
                assert_eq!(slot.load(), w);
                assert_eq!(slot.compare_exchange(v, bumped(v)), Err(w));
                assert_eq!(slot.fetch_update(|_| 0), w);
                assert_eq!(slot.load(), 0);
            }
        }
        let v = pack(0x3ff, 5, 7, 2, true);
        assert!(is_valid(v) && is_item(v) && !is_item(v | MOVED));
        assert_eq!(freq(v), 2);
        assert!(fetched(v));
        let b = bumped(bumped(v));
        assert_eq!(freq(b), FREQ_MAX);
        assert_eq!(b & IDENT_MASK, v & IDENT_MASK);
        assert_eq!((v | WIN) & IDENT_MASK, v & IDENT_MASK);
        assert_ne!((v | MOVED) & IDENT_MASK, v & IDENT_MASK);
        let z = pack(0, 0, 0, 0, false);
        assert!(is_valid(z) && z != 0 && !fetched(z) && freq(z) == 0);
    }

    /// A wide slot holds every field at full width: 16-bit tags, 22-bit segment ids.
    #[test]
    fn wide_slot_packing() {
        let idx = Index::new(64, 1, IndexLayout::Wide);
        assert_eq!(idx.max_segments(), 1 << SEG_BITS);
        let w = AtomicU64::new(0);
        let slot = Slot(Words::Wide(&w));
        for (tag, seg, off) in [
            (0xffff, (1 << SEG_BITS) - 1, (MAX_OFFSET - 1) as u32),
            (0, 0, 24),
            (0x8001, 1 << 21, 12_345),
        ] {
            let v = pack(tag, seg, off, 2, true);
            slot.store(v);
            assert_eq!(slot.load(), v);
            assert_eq!(
                (slot_tag(v), slot_seg(v), slot_off(v)),
                (tag, seg, off as usize)
            );
            let x = v | WIN;
            assert_eq!(slot.compare_exchange(v, x), Ok(v));
            assert_eq!(slot.compare_exchange(v, bumped(v)), Err(x));
            assert_eq!(slot.mark(), x);
            assert_eq!(slot.load(), x | MOVED);
            assert_eq!(slot.fetch_update(|_| 0), x | MOVED);
            assert!(slot.is_empty());
        }
        // The tag is the hash's bits from the base level up.
        let h = 0xabcd_u64 << idx.base | 0x5;
        assert_eq!(idx.tag(h), 0xabcd);
    }

    /// The segment-id split follows the segments asked for, and the tag keeps the rest.
    #[test]
    fn tag_bits_make_room_for_segments() {
        let compact = |n| Index::new(64, n, IndexLayout::Compact);
        assert_eq!(compact(1).max_segments(), 1 << 12);
        assert_eq!(compact(4096).max_segments(), 1 << 12);
        assert_eq!(compact(4097).max_segments(), 1 << 13);
        assert_eq!(compact(1 << 30).max_segments(), MAX_SEGMENTS);
        let idx = compact(5000);
        assert_eq!(idx.tag(u64::MAX), 0x3fe);
    }

    /// A reader's compare-exchange fails while a writer has the slot busy, and the
    /// writer's replacement sees the access bits set before it.
    #[test]
    fn writers_keep_readers_bits_and_fence_them_out() {
        let (loc, meta) = (AtomicU32::new(0), AtomicU16::new(0));
        let slot = Slot(Words::Compact(&loc, &meta, 0));
        let v = pack(0x100, 3, 100, 0, false);
        slot.store(v);
        assert_eq!(slot.compare_exchange(v, bumped(v)), Ok(v));
        let mut during = None;
        let prev = slot.fetch_update(|x| {
            // Inside the writer's window: a reader's exchange fails.
            during = Some(slot.compare_exchange(x, x | WIN));
            pack(0x100, 4, 200, 0, false) | (x & !IDENT_MASK)
        });
        assert_eq!(prev, bumped(v));
        assert!(matches!(during, Some(Err(_))));
        assert_eq!(slot_seg(slot.load()), 4);
        assert_eq!(freq(slot.load()), 1);
        assert_eq!(slot.load() & WIN, 0);
    }

    /// A wide slot's writer that loses its exchange to a reader computes its value again
    /// from the reader's, so the replaced value carries the reader's bits.
    #[test]
    fn wide_writers_keep_readers_bits() {
        let w = AtomicU64::new(0);
        let slot = Slot(Words::Wide(&w));
        let v = pack(0x100, 3, 100, 0, false);
        slot.store(v);
        let mut calls = 0;
        let prev = slot.fetch_update(|x| {
            calls += 1;
            if calls == 1 {
                // A reader marks the item between the writer's load and its exchange.
                assert_eq!(slot.compare_exchange(x, bumped(x) | WIN), Ok(x));
            }
            pack(0x100, 4, 200, 0, false) | (x & !IDENT_MASK)
        });
        assert_eq!(calls, 2);
        assert_eq!(prev, bumped(v) | WIN);
        assert_eq!(slot.load(), pack(0x100, 4, 200, 1, true) | WIN);
    }

    #[test]
    fn addressing_follows_the_split_pointer() {
        // Level 2, split pointer 1: buckets 0..5; bucket 0 was split into 0 and 4.
        let s = (2u64 << LEVEL_SHIFT) | 1;
        assert_eq!(main_count(s), 5);
        assert_eq!(addr(0b000, s), 0);
        assert_eq!(addr(0b100, s), 4);
        assert_eq!(addr(0b101, s), 1);
        assert_eq!(addr(0b111, s), 3);
        // Splitting the last bucket of a level starts the next one.
        assert_eq!(main_count(3u64 << LEVEL_SHIFT), 8);
    }

    /// An item value naming item `i` (its id in the segment field, offset past 0).
    fn item(idx: &Index, h: u64, i: u64) -> u64 {
        pack(idx.tag(h), i as u32, 24, 0, false)
    }

    /// Slots of an overflow bucket of `idx`.
    fn over_slots(idx: &Index) -> usize {
        match idx.layout() {
            IndexLayout::Compact => OVER_SLOTS,
            IndexLayout::Wide => WIDE_OVER_SLOTS,
        }
    }

    const LAYOUTS: [IndexLayout; 2] = [IndexLayout::Compact, IndexLayout::Wide];

    #[test]
    fn chains_and_lossy_overflow() {
        for layout in LAYOUTS {
            chains_and_lossy_overflow_in(layout);
        }
    }

    fn chains_and_lossy_overflow_in(layout: IndexLayout) {
        let idx = Index::new(16, 1 << 18, layout);
        // Every key in bucket 0 (low bits zero), different tags.
        let shift = match layout {
            IndexLayout::Compact => 30,
            IndexLayout::Wide => idx.base,
        };
        let h = |i: u64| i << shift;
        let (slots, over) = (idx.slots_per_main(), over_slots(&idx));
        let mut victims = 0;
        let n = (slots + over * (idx.over_len() + 4)) as u64;
        for i in 0..n {
            let _g = idx.lock(h(i));
            let v = item(&idx, h(i), i);
            match idx.insert(h(i), v) {
                Insert::Stored => {}
                Insert::Victim(slot) => {
                    assert!(is_item(slot.load()));
                    slot.store(v);
                    victims += 1;
                }
                Insert::Full => panic!("no markers here"),
            }
        }
        // The chain consumed the whole overflow pool before any slot was replaced.
        let chain_slots = slots + over * idx.over_len();
        assert_eq!(victims as usize, n as usize - chain_slots);
        let mut seen = 0;
        idx.for_each_in_chain(0, |_, _| seen += 1);
        assert_eq!(seen, chain_slots);
        let found = idx.find(h(n - 1), |v| slot_seg(v) == (n - 1) as u32);
        assert!(found.is_some());
    }

    /// Hash of item `i` in the split tests: spread over buckets, tags distinct.
    fn test_hash(i: u64) -> u64 {
        // splitmix64's finalizer.
        let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Split the next bucket of an index of `test_hash` items (ids in the segment field);
    /// the bucket split, or None at the largest size.
    fn split_next(idx: &Index) -> Option<usize> {
        let (b, l) = idx.next_split()?;
        let _g = idx.lock_bucket(b);
        let wide = idx.layout() == IndexLayout::Wide;
        idx.split(
            b,
            l,
            |v| {
                assert!(!wide, "a wide index splits by its tags");
                Some(test_hash(u64::from(slot_seg(v))))
            },
            |_, _| panic!("room for every moved item"),
        );
        Some(b)
    }

    /// A presized index addresses every bucket it was sized to, keeps items where they
    /// were inserted, splits on from there, never shrinks and stops at its largest size.
    #[test]
    fn presize_then_split() {
        for layout in LAYOUTS {
            presize_then_split_in(layout);
        }
    }

    fn presize_then_split_in(layout: IndexLayout) {
        let idx = Index::new(1 << 18, 1 << 18, layout);
        let start = idx.nmain();
        idx.presize(start - 1);
        assert_eq!(idx.nmain(), start, "never shrinks");
        for n in [start + 1, 3 * start + 5, 4 * start] {
            idx.presize(n);
            assert_eq!(idx.nmain(), n);
            assert!(idx.level() == usize::BITS - 1 - n.leading_zeros());
        }
        // Keys land in the buckets up to nmain (about 5 per bucket: nearly all of them
        // used) and in no other.
        let n = 5 * idx.nmain() as u64;
        let mut used = vec![false; idx.max_main()];
        for i in 0..n {
            let h = test_hash(i);
            let b = addr(h, idx.state.load(Ordering::Relaxed));
            assert!(b < idx.nmain());
            used[b] = true;
            let _g = idx.lock(h);
            assert!(
                matches!(idx.insert(h, item(&idx, h, i)), Insert::Stored),
                "item {i}"
            );
        }
        let hit = used.iter().filter(|&&u| u).count();
        assert!(
            hit > idx.nmain() * 9 / 10,
            "{hit} of {} buckets used",
            idx.nmain()
        );
        assert!(
            used[idx.nmain() - 8..].iter().any(|&u| u),
            "the last buckets are used"
        );
        // Growth continues from the presized state without losing an item.
        for _ in 0..100 {
            if split_next(&idx).is_none() {
                break;
            }
        }
        assert_eq!(idx.nmain(), 4 * start + 100);
        for i in 0..n {
            let h = test_hash(i);
            assert!(
                idx.find(h, |v| slot_seg(v) == i as u32).is_some(),
                "item {i}"
            );
        }
        idx.presize(usize::MAX);
        assert_eq!(idx.nmain(), idx.max_main(), "capped at the largest size");
        assert!(idx.next_split().is_none());
    }

    #[test]
    fn splits_compaction_and_reuse_keep_every_item() {
        for layout in LAYOUTS {
            splits_compaction_and_reuse_in(layout);
        }
    }

    fn splits_compaction_and_reuse_in(layout: IndexLayout) {
        let idx = Index::new(1 << 16, 1 << 18, layout);
        let (slots, over) = (idx.slots_per_main(), over_slots(&idx));
        let n = 40_000u64;
        let put = |i: u64| {
            let h = test_hash(i);
            let _g = idx.lock(h);
            assert!(
                matches!(idx.insert(h, item(&idx, h, i)), Insert::Stored),
                "item {i}"
            );
        };
        let check = |upto: u64| {
            for i in 0..upto {
                let h = test_hash(i);
                let got = idx.find(h, |v| slot_seg(v) == i as u32);
                assert!(got.is_some(), "item {i} lost at {} buckets", idx.nmain());
            }
        };
        let start = idx.nmain();
        let mut inserted = 0;
        let mut overflow_high = 0;
        let mut recycled = 0;
        while inserted < n {
            for i in inserted..inserted + 1000 {
                put(i);
            }
            inserted += 1000;
            let mut split = Vec::new();
            while inserted as usize > idx.nmain() * slots {
                let Some(b) = split_next(&idx) else {
                    break;
                };
                split.push(b);
            }
            // Markers are skipped, items found (through the new addressing).
            check(inserted);
            for &b in &split {
                let _g = idx.lock_bucket(b);
                idx.compact(b);
            }
            check(inserted);
            let mut spare = Vec::new();
            for &b in &split {
                let _g = idx.lock_bucket(b);
                spare.extend(idx.release_chain(b));
            }
            recycled += spare.len();
            idx.recycle(spare);
            check(inserted);
            overflow_high = overflow_high.max(idx.overflow_used());
        }
        assert!(
            idx.nmain() > start && idx.nmain() * slots >= n as usize,
            "grew from {start} to {}",
            idx.nmain()
        );
        // Every item exactly once in the chain of its bucket, no marker left.
        let mut count = 0;
        for b in 0..idx.nmain() {
            idx.walk(b, |_, slot| {
                let v = slot.load();
                assert_eq!(v & MOVED, 0, "marker left in bucket {b}");
                if is_item(v) {
                    let h = test_hash(u64::from(slot_seg(v)));
                    assert_eq!(addr(h, idx.state.load(Ordering::Relaxed)), b);
                    count += 1;
                }
            });
        }
        assert_eq!(count, n);
        // Overflow buckets emptied by splits are unlinked and linked again, so their slots
        // stay fewer than half the main buckets'.
        assert!(recycled > 0);
        assert!(
            overflow_high * over < idx.nmain() * slots / 2,
            "{overflow_high} overflow buckets"
        );
    }
}
