//! The flash tier's engine side (issue 43, stage 2 of `docs/design/flash-tier.md`): cold
//! items leave RAM for a [`Tier`] instead of being dropped, and lookups read them back.
//!
//! [`Flash`] is this part's state, owned here: the tier, the writes it finished, how many
//! are under way, and the *bound* segments (written whole to a flash page, their RAM given
//! back) oldest first. The `impl LogEngine` block below is the path that combines it with
//! the index, the segments and eviction.
//!
//! # A segment's way to flash
//!
//! 1. Eviction pops a sealed segment as usual. With a tier it sends it to flash whole
//!    (`demote_segment`) instead of dropping its items: items read enough get their
//!    second chance in RAM (copied forward, as without a tier), dead ones are unlinked,
//!    those shorter than `ext_item_size` (`set_flash_item_size`) are evicted as without a
//!    tier, and the rest stay where they are, their slots unchanged, their reads counted
//!    from none. The segment keeps its id.
//! 2. Its image is queued to the tier (`ship`); it stays mapped and readable meanwhile.
//!    When an eighth or more of it is not those cold items (copied forward, evicted, dead
//!    before), the image is theirs alone, packed (`pack_cold`), so flash is not written
//!    with dead records; once written it is bound under a new id, their slots follow
//!    (`move_to`, as a compaction's) and the segment, empty, is freed (`settle`). A
//!    page comes from the tier's free list, which `reclaim` refills (ahead of need on the
//!    maintenance thread, `flash_make_room`; on the evicting thread itself when only the
//!    page kept for compaction is left): of the oldest bound segments, the emptiest (the oldest
//!    first among those about as full) are compacted (`compact`: their live records
//!    copied into one new page, their slots moved there) when two or more fit one page,
//!    else the emptiest is taken back, its items read on flash rescued to memory and the
//!    rest evicted (`drop_page`). Too many writes under way (an eighth of the segments),
//!    or a full write buffer, make eviction wait for them. A write the tier
//!    refuses or fails leaves the segment in RAM: it is evicted as without a tier.
//! 3. When the write has finished (`settle`, from eviction and `maintain`), the segment is
//!    *bound*: its page, generation, length and CAS base are recorded before its mapping
//!    is taken away; after a pin barrier the mapping goes back to the free pool under
//!    another id (or to the system, over budget). The bound id keeps its accounting (live
//!    items and bytes, expiry range, write times), and its slots keep pointing at it.
//!
//! # Reads
//!
//! A slot whose segment has no mapping but a binding names a flash record:
//! [`LogEngine::fetch_record`] reads it (blocking, on the calling thread, in this stage)
//! into a [`Fetch`], checked block by block by the tier (CRC, generation) and then by the
//! key. Lookups return it as they return a RAM record, so every command behaves as with
//! a RAM item, and writers replace a flash item's slot as they would a RAM one's (one slot
//! per key). A read that fails (an I/O error, a damaged block, a page reused meanwhile)
//! is a miss, counted. The maintenance sweep reads flash items too, to unlink dead ones.
//! A server defers the reads (`defer_flash`) and does them on its I/O threads
//! (`complete_flash_read`) or submits them itself, as io_uring reads whose bytes the engine
//! then checks (`flash_read_start`, `flash_read_end`).
//!
//! A get that reads a flash item read before since it went to flash copies it back to
//! memory (`recache` in `write.rs`: a touch that keeps the expiry, `Cond::Loc`), one in
//! `ext_recache_rate`.
//!
//! # Faults
//!
//! A write that fails leaves its segment to be evicted as without a tier; the tier goes
//! offline after several in a row and lets a probe write through now and then
//! (`Tier::accepts_writes`, asked by `demoting`).
//!
//! # Warm restart
//!
//! A snapshot names the bound segments' pages and live offsets (`pages_to_save`, after
//! the writes under way are bound and synced); a restart into a tier opened as it is takes
//! those pages back (`claim_saved`, `read_saved`, `bind_saved`, `order_saved`, driven by
//! `snapshot.rs`).
//!
//! # Replication
//!
//! A bound segment keeps its sequence number (`Binding::seq`), so a replica's full sync
//! ships its live items in the log's order, read from flash (`bound_segments`,
//! `read_bound`, used by `repl/serve.rs`). A segment a replica has not read yet is not
//! demoted: a tail reads segments from memory, so it is evicted and logged anew instead.
//! A full sync lists flash pages by sequence number, so while one is under way items do
//! not move between pages: `reclaim` takes the emptiest page back rather than compacting
//! (`ReplFlags::may_move_flash_items`).
//!
//! Not yet: large items. `walk.rs` (digests, `lru_crawler metadump`) sees RAM items only.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::format::{self, Rec, Spec, KIND_ITEM, SEG_HDR};
use super::index::{self, IndexLayout, Slot};
use super::repl::EvictionNotes;
use super::segments::Queue;
use super::sync::lock;
use super::{LogEngine, Vis};
use crate::flash::{AlignedBuf, Loc, Tier, TierError, TierStats};

/// Bytes a flash read asks for first (a small record's, whichever block it starts in); a
/// longer record is read again, sixteen times as much each time.
const FIRST_READ: usize = 2 << 10;

/// Where a bound segment's image is.
#[derive(Debug, Clone, Copy)]
struct Binding {
    loc: Loc,
    /// Bytes of the image (the segment's final length).
    used: usize,
    /// The segment's CAS base (records' versions follow from it and their place).
    base: u64,
    /// The sequence number it had in the log (a replica's full sync ships flash segments
    /// in the log's order, `serve_snapshot`).
    seq: u64,
}

/// A write the tier finished: the segment, its page, whether it succeeded.
struct Written {
    id: u32,
    loc: Loc,
    ok: bool,
}

#[derive(Default)]
struct Bound {
    by_id: HashMap<u32, Binding>,
    /// Oldest first: the order pages are taken back in.
    order: VecDeque<u32>,
}

#[derive(Default)]
struct Counters {
    objects_written: AtomicU64,
    bytes_demoted: AtomicU64,
    reads: AtomicU64,
    tag_misreads: AtomicU64,
    read_errors: AtomicU64,
    pages_dropped: AtomicU64,
    objects_evicted: AtomicU64,
    write_failures: AtomicU64,
    inline_reads: AtomicU64,
    recaches: AtomicU64,
    rescues: AtomicU64,
    cached_reads: AtomicU64,
    pages_compacted: AtomicU64,
}

/// What the engine's flash part counts, beside the tier's own counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlashStats {
    pub tier: TierStats,
    /// Items in segments written to flash (`extstore_objects_written`).
    pub objects_written: u64,
    /// Live record bytes in segments written to flash.
    pub bytes_demoted: u64,
    /// Flash records read (`get_extstore`).
    pub reads: u64,
    /// Flash records read whose key was another's (a tag false positive).
    pub tag_misreads: u64,
    /// Flash reads that failed: I/O errors, damaged blocks (`badcrc_from_extstore`), pages
    /// reused meanwhile (`miss_from_extstore`).
    pub read_errors: u64,
    /// Pages taken back to make room, their items evicted (`extstore_page_evictions`).
    pub pages_dropped: u64,
    /// Items evicted from flash (`extstore_objects_evicted`).
    pub objects_evicted: u64,
    /// Segments whose write failed or was refused (they stayed in RAM and were evicted).
    pub write_failures: u64,
    /// Flash reads a lookup did itself, on its own thread (not deferred to another: a
    /// server's maintenance sweep, or a request that could not wait).
    pub inline_reads: u64,
    /// Flash items read again and copied back to memory (`recache_from_extstore`).
    pub recaches: u64,
    /// Items kept when their page was taken back: copied by compaction into a new page,
    /// or, read while on flash, back to memory (`extstore_compact_rescues`).
    pub rescues: u64,
    /// Of `reads`, those a deferring lookup did itself because the page cache held the
    /// bytes (no wait for the device, no hand-off).
    pub cached_reads: u64,
    /// Pages written by compaction, each holding the live items of two or more pages it
    /// took back (kvcached's own).
    pub pages_compacted: u64,
    /// Items on flash now (`extstore_objects_used`).
    pub objects_used: u64,
    /// Record bytes on flash now (`extstore_bytes_used`).
    pub bytes_used: u64,
}

/// A flash read a lookup needed while flash I/O was deferred on its thread
/// ([`LogEngine::defer_flash`]): do it with [`LogEngine::complete_flash_read`] (on an I/O
/// thread), then run the request again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashRead {
    id: u32,
    off: u32,
    loc: Loc,
}

impl FlashRead {
    /// Its key among the records kept for re-runs.
    fn key(&self) -> (u32, u32, Loc) {
        (self.id, self.off, self.loc)
    }
}

/// A flash read that a server submits itself, as an io_uring read
/// ([`LogEngine::flash_read_start`], [`LogEngine::flash_read_end`]): `span` says where, into
/// a buffer aligned as an [`AlignedBuf`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlashIo {
    read: FlashRead,
    /// The record's CAS base.
    base: u64,
    /// Image bytes from the record to the image's end.
    rest: usize,
    /// Image bytes this read takes.
    want: usize,
    pub span: crate::flash::ReadSpan,
}

/// Records read for deferred lookups, kept for their re-runs: keyed by segment, offset and
/// page generation (a page's bytes never change within a generation), oldest dropped
/// first beyond `FETCHED_MAX`.
#[derive(Default)]
struct Fetched {
    by_key: HashMap<(u32, u32, Loc), Fetch>,
    order: VecDeque<(u32, u32, Loc)>,
}

/// Bound pages, oldest first, among which a full tier picks the ones to compact or take
/// back.
const RECLAIM_WINDOW: usize = 8;

/// `reclaim` ranks pages by live bytes in steps of this fraction of a page.
const RECLAIM_STEPS: usize = 16;

/// Free pages kept for compaction's output: eviction makes room when no more are free.
const RESERVE: usize = 1;

/// Pages the maintenance keeps free beyond [`RESERVE`] on a tier of `pages` (one in 128, 2
/// to 16), so that eviction, on the thread of the write that made room in memory, seldom
/// has to make room on flash too (reading pages, waiting for a write).
fn ahead(pages: usize) -> usize {
    (pages / 128).clamp(2, 16)
}

/// How many free pages the maintenance keeps on a tier of `pages`: with `compact_under`
/// 0 the [`RESERVE`] and [`ahead`]'s margin beyond it and one more; else `compact_under`
/// (`ext_compact_under`), but no more than half the tier nor fewer than one beyond the
/// reserve.
fn free_target(pages: usize, compact_under: u32) -> usize {
    match compact_under {
        0 => RESERVE + ahead(pages) + 1,
        n => (n as usize).min(pages / 2).max(RESERVE + 1),
    }
}

/// A live record a compaction copies: its key's hash, where it was (segment, offset,
/// length), where it goes in the new image (offset, length), its size as memcached counts
/// it and its expiry.
struct Move {
    hash: u64,
    from: (u32, usize, usize),
    to: (usize, usize),
    size: usize,
    exptime: crate::Time,
}

/// A demoted segment's cold records packed into an image of their own (`pack_cold`):
/// the image to write, and where each record goes in it. Once written, the image is bound
/// under an id of its own and the records' slots follow (`move_to`), as a compaction's do.
struct Packed {
    image: Vec<u8>,
    moves: Moves,
}

/// Where a packed image's records go ([`Packed`]), kept from the write's queueing to its
/// end (`settle`).
struct Moves {
    moves: Vec<Move>,
    /// The image's length and CAS base.
    used: usize,
    base: u64,
}

/// A thread's deferral of flash reads ([`LogEngine::defer_flash`]).
struct Deferred {
    /// The reads its lookups need.
    reads: Vec<FlashRead>,
    /// Keep records read from the page cache for a write to come (`flash_reads_for`).
    keep_cached: bool,
}

/// Records kept for re-runs (a bound: a re-run that finds its record gone reads again).
const FETCHED_MAX: usize = 4096;

/// A bound segment as a snapshot keeps it (`snapshot.rs`): where its image is, in which
/// file (the tier id), and what its records need (length, CAS base).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SavedPage {
    pub(super) loc: Loc,
    pub(super) file_id: u64,
    pub(super) used: usize,
    pub(super) base: u64,
}

/// What a warm restart did with the flash pages its snapshot named.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlashRestore {
    /// Pages found in the tier and indexed again.
    pub pages: u64,
    /// Items they hold, indexed.
    pub items: u64,
    /// Pages whose items are gone: no tier now, another file (made afresh, or of another
    /// size), or a page that could not be read back whole.
    pub pages_lost: u64,
}

thread_local! {
    /// While set, lookups on this thread do no flash I/O that may wait: they note the
    /// reads they need (a read the page cache answers at once is done).
    static DEFERRED: std::cell::RefCell<Option<Deferred>> = const { std::cell::RefCell::new(None) };
    /// This thread's flash reads' blocks and the record bytes decoded from them.
    static READ_BUF: std::cell::RefCell<(AlignedBuf, Vec<u8>)> =
        std::cell::RefCell::new((AlignedBuf::new(), Vec::new()));
}

/// The flash part's state (see the module documentation).
pub(super) struct Flash {
    tier: Tier,
    done: Arc<Mutex<Vec<Written>>>,
    bound: Mutex<Bound>,
    /// Segments whose write under way is of their cold records only (`pack_cold`): where
    /// those go in the image, for their slots to follow once it is written.
    packed: Mutex<HashMap<u32, Moves>>,
    /// Segments whose write is queued or under way.
    in_flight: AtomicUsize,
    /// Records read for deferred lookups.
    fetched: Mutex<Fetched>,
    counters: Counters,
    /// Copy back one in this many flash items read again (`ext_recache_rate`); 0 never.
    recache_rate: AtomicU32,
    /// Flash items read again, the count the rate picks from.
    recache_asks: AtomicU64,
    /// Records shorter than this many bytes are evicted rather than sent to flash
    /// (`ext_item_size`); 0 sends every one.
    min_record: AtomicU32,
    /// The maintenance makes room while fewer pages than this are free
    /// (`ext_compact_under`); 0: [`RESERVE`] and [`ahead`]'s pages, and one more.
    compact_under: AtomicU32,
    /// Compaction moves only the items read while on flash, evicting the others
    /// (`ext_drop_unread`).
    drop_unread: AtomicBool,
    /// Only pages less full than this many thousandths of a page are compacted
    /// (`ext_max_frag`); 1000 (the default) any.
    max_frag: AtomicU32,
}

/// Why a tier could not be attached.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FlashAttachError {
    #[error("a flash tier needs the wide index layout")]
    Layout,
    #[error("a flash page holds {page} bytes, less than a segment ({seg})")]
    PageTooSmall { page: usize, seg: usize },
    #[error("a flash tier is attached already")]
    Attached,
}

/// A record read from flash: its bytes from its first (shared with the records kept for
/// re-runs, so a re-run copies nothing), and the CAS base that gives it its version at
/// offset 0. The default holds nothing and allocates nothing (every lookup makes one,
/// whether or not it reads flash); kept for a re-run, it stands for a failed read.
#[derive(Clone, Default)]
pub(super) struct Fetch {
    bytes: Option<Arc<[u8]>>,
    base: u64,
}

impl Fetch {
    /// The record.
    pub(super) fn rec(&self) -> Option<Rec<'_>> {
        let bytes = self.bytes.as_deref()?;
        // SAFETY: `bytes` is ours and initialized; `read` checks every length against its
        // end.
        unsafe { format::read(bytes.as_ptr(), bytes.len(), 0, self.base) }
    }
}

impl LogEngine {
    /// Move cold items to `tier` from now on instead of dropping them (see the module
    /// documentation). The engine must have the wide index
    /// ([`LogEngine::with_layout`]) and the tier pages of at least a segment.
    pub fn attach_flash(&self, tier: Tier) -> Result<(), FlashAttachError> {
        if self.index.layout() != IndexLayout::Wide {
            return Err(FlashAttachError::Layout);
        }
        if tier.page_capacity() < self.seg_size {
            return Err(FlashAttachError::PageTooSmall {
                page: tier.page_capacity(),
                seg: self.seg_size,
            });
        }
        let flash = Flash {
            tier,
            done: Arc::default(),
            bound: Mutex::default(),
            packed: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            fetched: Mutex::default(),
            counters: Counters::default(),
            recache_rate: AtomicU32::new(1),
            recache_asks: AtomicU64::new(0),
            compact_under: AtomicU32::new(0),
            drop_unread: AtomicBool::new(false),
            max_frag: AtomicU32::new(1000),
            min_record: AtomicU32::new(0),
        };
        self.flash
            .set(flash)
            .map_err(|_| FlashAttachError::Attached)
    }

    /// The flash part's counters, with a tier.
    pub fn flash_stats(&self) -> Option<FlashStats> {
        let f = self.flash.get()?;
        let c = &f.counters;
        let (mut objects_used, mut bytes_used) = (0, 0);
        for id in lock(&f.bound).by_id.keys() {
            if let Some(s) = self.segs.get(*id) {
                objects_used += s.live_items();
                bytes_used += s.live_bytes();
            }
        }
        Some(FlashStats {
            tier: f.tier.stats(),
            objects_written: c.objects_written.load(Ordering::Relaxed),
            bytes_demoted: c.bytes_demoted.load(Ordering::Relaxed),
            reads: c.reads.load(Ordering::Relaxed),
            tag_misreads: c.tag_misreads.load(Ordering::Relaxed),
            read_errors: c.read_errors.load(Ordering::Relaxed),
            pages_dropped: c.pages_dropped.load(Ordering::Relaxed),
            objects_evicted: c.objects_evicted.load(Ordering::Relaxed),
            write_failures: c.write_failures.load(Ordering::Relaxed),
            inline_reads: c.inline_reads.load(Ordering::Relaxed),
            recaches: c.recaches.load(Ordering::Relaxed),
            rescues: c.rescues.load(Ordering::Relaxed),
            cached_reads: c.cached_reads.load(Ordering::Relaxed),
            pages_compacted: c.pages_compacted.load(Ordering::Relaxed),
            objects_used,
            bytes_used,
        })
    }

    /// Wait for every queued flash write and bind what was written (tests, and a stop).
    pub fn flash_settle(&self) {
        if let Some(f) = self.flash.get() {
            f.tier.drain();
            self.settle();
        }
    }

    /// Copy back to memory one in `rate` flash items read again since they went to flash
    /// (memcached's `ext_recache_rate`; 0 never). The default is 1: every one.
    pub fn set_flash_recache_rate(&self, rate: u32) {
        if let Some(f) = self.flash.get() {
            f.recache_rate.store(rate, Ordering::Relaxed);
        }
    }

    /// Make room on flash while fewer than `pages` pages are free (memcached's
    /// `ext_compact_under`), at most half the tier's; 0, the default, keeps the
    /// maintenance's own margin (one page in 128 of the tier, 2 to 16, beyond the one kept
    /// for compaction).
    pub fn set_flash_compact_under(&self, pages: u32) {
        if let Some(f) = self.flash.get() {
            f.compact_under.store(pages, Ordering::Relaxed);
        }
    }

    /// With `on`, a compaction moves only the items read since they went to flash and
    /// evicts the others (memcached's `ext_drop_unread`); off, the default, it keeps every
    /// live item.
    pub fn set_flash_drop_unread(&self, on: bool) {
        if let Some(f) = self.flash.get() {
            f.drop_unread.store(on, Ordering::Relaxed);
        }
    }

    /// Compact only pages whose live bytes are under `thousandths`/1000 of a page
    /// (memcached's `ext_max_frag`, there a fraction; at most 1000); the others are taken
    /// back whole when room is needed. 1000, the default, compacts any pages whose items
    /// fit in fewer pages.
    pub fn set_flash_max_frag(&self, thousandths: u32) {
        if let Some(f) = self.flash.get() {
            f.max_frag.store(thousandths.min(1000), Ordering::Relaxed);
        }
    }

    /// The flash tier's `ext_compact_under`, `ext_drop_unread` and `ext_max_frag` (in
    /// thousandths) now (see their setters); None without a tier.
    pub fn flash_compaction(&self) -> Option<(u32, bool, u32)> {
        self.flash.get().map(|f| {
            (
                f.compact_under.load(Ordering::Relaxed),
                f.drop_unread.load(Ordering::Relaxed),
                f.max_frag.load(Ordering::Relaxed),
            )
        })
    }

    /// The flash tier's `ext_recache_rate` and `ext_item_size` now (see their setters);
    /// None without a tier.
    pub fn flash_tuning(&self) -> Option<(u32, u32)> {
        self.flash.get().map(|f| {
            (
                f.recache_rate.load(Ordering::Relaxed),
                f.min_record.load(Ordering::Relaxed),
            )
        })
    }

    /// Evict, rather than send to flash, items whose record (key, value and record header)
    /// is shorter than `bytes` (memcached's `ext_item_size`, there the item's size class;
    /// 0, the default, sends every one: kvcached keeps only an index slot in memory for a
    /// flash item, however small).
    pub fn set_flash_item_size(&self, bytes: u32) {
        if let Some(f) = self.flash.get() {
            f.min_record.store(bytes, Ordering::Relaxed);
        }
    }

    /// Whether a get that just read the live item slot value `v` should copy it back to
    /// memory: it is on flash, it was read before since it went there (its access count,
    /// zeroed on the way, is not), the rate picks it, and this is no replica (whose log is
    /// its master's).
    pub(super) fn wants_recache(&self, v: u64) -> bool {
        let Some(f) = self.flash.get() else {
            return false;
        };
        let rate = u64::from(f.recache_rate.load(Ordering::Relaxed));
        rate != 0
            && index::freq(v) >= 1
            && self
                .segs
                .get(index::slot_seg(v))
                .is_some_and(|s| s.ptr().is_none())
            && !self.repl.is_replica()
            && f.recache_asks.fetch_add(1, Ordering::Relaxed) % rate == rate - 1
    }

    /// Keep `fetch`, the record slot value `v` names on flash, for a write that is about
    /// to look it up again (`recache`, in `write.rs`), so that it reads nothing again.
    pub(super) fn keep_for_write(&self, v: u64, fetch: Fetch) {
        let Some(f) = self.flash.get() else {
            return;
        };
        let id = index::slot_seg(v);
        if let Some(b) = self.binding(id) {
            let off = index::slot_off(v) as u32;
            keep_fetched(&mut lock(&f.fetched), (id, off, b.loc), fetch);
        }
    }

    /// Count a flash item copied back to memory (`recache_from_extstore`).
    pub(super) fn note_recache(&self) {
        if let Some(f) = self.flash.get() {
            f.counters.recaches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The tier's last write error, as text, if a write ever failed (the tier goes
    /// offline after several in a row and back online when a probe write succeeds).
    pub fn flash_write_error(&self) -> Option<String> {
        self.flash.get()?.tier.last_error()
    }

    /// Every page of the tier in order, as memcached's `stats extstore` lists them: the
    /// write generation of the segment it holds and that segment's live record bytes, or
    /// (0, 0) for a page holding none (free, or its write not finished). Empty without a
    /// tier.
    pub fn flash_pages(&self) -> Vec<(u32, u64)> {
        let Some(f) = self.flash.get() else {
            return Vec::new();
        };
        let mut pages = vec![(0, 0); f.tier.pages() as usize];
        for (id, b) in &lock(&f.bound).by_id {
            if let (Some(p), Some(s)) = (pages.get_mut(b.loc.page as usize), self.segs.get(*id)) {
                *p = (b.loc.gen, s.live_bytes());
            }
        }
        pages
    }

    /// Whether write errors took the tier offline (false without a tier).
    pub fn flash_offline(&self) -> bool {
        self.flash.get().is_some_and(|f| f.tier.is_offline())
    }

    /// Whether a flash tier is attached.
    #[inline]
    pub fn has_flash(&self) -> bool {
        self.flash.get().is_some()
    }

    /// Run `f` with the flash reads its lookups need deferred instead of done on this
    /// thread: a lookup that would read a flash record finds nothing, and the read is
    /// returned. With reads returned, what `f` did is to be discarded and done again once
    /// they are complete ([`LogEngine::complete_flash_read`]), so `f` must be a read
    /// without effects on what it did not find (a get, not a store). Records read before
    /// for deferred lookups are found without I/O.
    pub fn defer_flash<T>(&self, f: impl FnOnce() -> T) -> (T, Vec<FlashRead>) {
        self.defer_flash_keeping(false, f)
    }

    /// [`LogEngine::defer_flash`], keeping the records read from the page cache too
    /// (`keep_cached`) for a write to come.
    fn defer_flash_keeping<T>(
        &self,
        keep_cached: bool,
        f: impl FnOnce() -> T,
    ) -> (T, Vec<FlashRead>) {
        if self.flash.get().is_none() {
            return (f(), Vec::new());
        }
        let mine = Deferred {
            reads: Vec::new(),
            keep_cached,
        };
        let outer = DEFERRED.with(|d| d.borrow_mut().replace(mine));
        let out = f();
        let mine = DEFERRED.with(|d| std::mem::replace(&mut *d.borrow_mut(), outer));
        (out, mine.map(|d| d.reads).unwrap_or_default())
    }

    /// The flash reads a lookup of `key` needs now: none when its item is in memory, not
    /// there, or read already. A server reads them on other threads before it runs a
    /// command on `key` (a write then finds the old item without I/O of its own).
    pub fn flash_reads_for(&self, key: &[u8]) -> Vec<FlashRead> {
        if self.flash.get().is_none() {
            return Vec::new();
        }
        let (found, reads) = self.defer_flash_keeping(true, || self.holds_record(key));
        if found {
            // Another key's record matched the tag: nothing to wait for.
            return Vec::new();
        }
        reads
    }

    /// Do a read a deferred lookup needed (blocking: an I/O thread's work) and keep the
    /// record for the lookup's re-run. A page taken back meanwhile reads nothing (the
    /// re-run then finds the item's new place, or nothing).
    pub fn complete_flash_read(&self, r: &FlashRead) {
        let Some(f) = self.flash.get() else {
            return;
        };
        let Some(b) = self.binding(r.id).filter(|b| b.loc == r.loc) else {
            return;
        };
        // A failed read is kept too (no bytes): the re-run then finds no record there (a
        // miss, counted as a read error) instead of waiting for the same read again.
        let fetch = self.read_record(f, b, r.off as usize).unwrap_or_default();
        keep_fetched(&mut lock(&f.fetched), (r.id, r.off, r.loc), fetch);
    }

    /// Start `r` as a read its caller submits itself (an io_uring, instead of an I/O
    /// thread's [`LogEngine::complete_flash_read`]): where to read, or None when there is
    /// nothing to read (the page was taken back: the re-run finds the item's new place or
    /// nothing; or the read cannot be made: kept as a failed read, counted).
    pub fn flash_read_start(&self, r: &FlashRead) -> Option<FlashIo> {
        let f = self.flash.get()?;
        let b = self.binding(r.id).filter(|b| b.loc == r.loc)?;
        let off = r.off as usize;
        let rest = b.used.saturating_sub(off);
        let io = FlashIo {
            read: *r,
            base: b.base.wrapping_add(off as u64),
            rest,
            want: rest.min(FIRST_READ),
            span: crate::flash::ReadSpan {
                fd: -1,
                at: 0,
                len: 0,
            },
        };
        self.flash_read_at(f, io)
    }

    /// What a read [`LogEngine::flash_read_start`] (or this) described brought: `raw`, the
    /// bytes read at its span, or the error it ended with. The record is kept for the
    /// lookup's re-run (a failed read too, counted, as [`LogEngine::complete_flash_read`]
    /// keeps it), or, when the record is longer than what was read, the longer read to
    /// submit next is returned.
    pub fn flash_read_end(&self, io: &FlashIo, raw: std::io::Result<&[u8]>) -> Option<FlashIo> {
        let f = self.flash.get()?;
        let off = io.read.off as usize;
        let mut out = Vec::new();
        let record = match f.tier.read_finish(io.read.loc, off, io.want, raw, &mut out) {
            Ok(()) => record_in(&out, io.base),
            Err(_) => return self.flash_read_failed(f, io),
        };
        if let Some(fetch) = record {
            f.counters.reads.fetch_add(1, Ordering::Relaxed);
            keep_fetched(&mut lock(&f.fetched), io.read.key(), fetch);
            return None;
        }
        if io.want >= io.rest {
            // The whole rest of the image and still no record: damaged.
            return self.flash_read_failed(f, io);
        }
        let next = FlashIo {
            want: io.rest.min(io.want.saturating_mul(16)),
            ..*io
        };
        self.flash_read_at(f, next)
    }

    /// `io` with the span of its `want` bytes, or None with a failed read kept.
    fn flash_read_at(&self, f: &Flash, mut io: FlashIo) -> Option<FlashIo> {
        let off = io.read.off as usize;
        match f.tier.read_span(io.read.loc, off, io.want) {
            Ok(span) if io.want > 0 => {
                io.span = span;
                Some(io)
            }
            _ => self.flash_read_failed(f, &io),
        }
    }

    /// Keep `io`'s read as failed (its re-run is a miss, not another wait), counted.
    fn flash_read_failed(&self, f: &Flash, io: &FlashIo) -> Option<FlashIo> {
        f.counters.read_errors.fetch_add(1, Ordering::Relaxed);
        keep_fetched(&mut lock(&f.fetched), io.read.key(), Fetch::default());
        None
    }

    /// The bound segments, oldest first, for a snapshot, once every write under way is
    /// bound and the files are synced (what the snapshot names is then on the device).
    pub(super) fn pages_to_save(&self) -> std::io::Result<Vec<(u32, SavedPage)>> {
        let Some(f) = self.flash.get() else {
            return Ok(Vec::new());
        };
        f.tier.drain();
        self.settle();
        f.tier.sync().map_err(std::io::Error::other)?;
        let bound = lock(&f.bound);
        Ok(bound
            .order
            .iter()
            .filter_map(|&id| {
                let b = bound.by_id.get(&id)?;
                let saved = SavedPage {
                    loc: b.loc,
                    file_id: f.tier.file_id(b.loc.page)?,
                    used: b.used,
                    base: b.base,
                };
                Some((id, saved))
            })
            .collect())
    }

    /// Take back, in the tier just opened, the pages a snapshot names: for each, whether
    /// its items can be loaded (the same file's page, of a segment's size at most, taken
    /// at its generation). Without a tier, none.
    pub(super) fn claim_saved(&self, saved: &[SavedPage]) -> Vec<bool> {
        let Some(f) = self.flash.get() else {
            return vec![false; saved.len()];
        };
        let fits = |p: &SavedPage| {
            f.tier.file_id(p.loc.page) == Some(p.file_id)
                && p.used > SEG_HDR
                && p.used <= self.seg_size.min(f.tier.page_capacity())
        };
        let wanted: Vec<Loc> = saved.iter().filter(|p| fits(p)).map(|p| p.loc).collect();
        let mut taken = f.tier.claim(&wanted).into_iter();
        saved
            .iter()
            .map(|p| fits(p) && taken.next().unwrap_or(false))
            .collect()
    }

    /// The image of a claimed page, read whole and checked; None if it cannot be (the page
    /// is freed again: its items are lost, counted as a failed read).
    pub(super) fn read_saved(&self, p: &SavedPage) -> Option<Vec<u8>> {
        let f = self.flash.get()?;
        let mut image = Vec::with_capacity(p.used);
        match f
            .tier
            .read(p.loc, 0, p.used, &mut AlignedBuf::new(), &mut image)
        {
            Ok(()) => Some(image),
            Err(_) => {
                f.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                f.tier.free(p.loc);
                None
            }
        }
    }

    /// Make the claimed page `p` a bound segment under a fresh id, without memory (not yet
    /// in the reclaim order: `order_saved`). None, the page freed again, when no id is left.
    pub(super) fn bind_saved(&self, p: &SavedPage) -> Option<u32> {
        let f = self.flash.get()?;
        // A number of its own below every cursor made from now on (it was numbered by the
        // engine that saved it).
        let seq = self.order.lock().skip() - 1;
        let b = Binding {
            loc: p.loc,
            used: p.used,
            base: p.base,
            seq,
        };
        let id = self.bound_id(b);
        if id.is_none() {
            f.tier.free(p.loc);
        }
        id
    }

    /// A fresh segment id without memory, bound to `b` (not yet in the reclaim order).
    fn bound_id(&self, b: Binding) -> Option<u32> {
        let f = self.flash.get()?;
        let id = {
            let mut pool = self.arena.pool();
            let id = pool.draw_id(self.index.max_segments())?;
            if self.segs.get_or_create(id).is_none() {
                pool.return_id(id);
                return None;
            }
            id
        };
        lock(&f.bound).by_id.insert(id, b);
        Some(id)
    }

    /// Put the segments `bind_saved` made, oldest first, in the order pages are taken back.
    pub(super) fn order_saved(&self, ids: impl IntoIterator<Item = u32>) {
        if let Some(f) = self.flash.get() {
            lock(&f.bound).order.extend(ids);
        }
    }

    /// The binding of segment `id`, if it is on flash.
    fn binding(&self, id: u32) -> Option<Binding> {
        let f = self.flash.get()?;
        lock(&f.bound).by_id.get(&id).copied()
    }

    /// Read the flash record slot value `v` names, if its segment is bound; None for a RAM
    /// slot, without a tier, or when the read fails (counted).
    pub(super) fn fetch_record(&self, v: u64) -> Option<Fetch> {
        let f = self.flash.get()?;
        let id = index::slot_seg(v);
        let b = self.binding(id)?;
        let off = index::slot_off(v);
        let key = (id, off as u32, b.loc);
        if let Some(hit) = lock(&f.fetched).by_key.get(&key) {
            // Empty: the read failed (see `flash_read_failed`).
            return hit.bytes.is_some().then(|| hit.clone());
        }
        let Some(keep_cached) = DEFERRED.with(|d| d.borrow().as_ref().map(|d| d.keep_cached))
        else {
            f.counters.inline_reads.fetch_add(1, Ordering::Relaxed);
            return self.read_record(f, b, off);
        };
        // A read the page cache can answer at once costs less than a hand-off. For a
        // write's look first (`flash_reads_for`) it is kept, as a handed-off read's is, so
        // that the write finds it without reading again.
        if let Some(fetch) = self.read_cached_record(f, b, off) {
            if keep_cached {
                keep_fetched(&mut lock(&f.fetched), key, fetch.clone());
            }
            return Some(fetch);
        }
        DEFERRED.with(|d| {
            if let Some(d) = d.borrow_mut().as_mut() {
                let r = FlashRead {
                    id,
                    off: off as u32,
                    loc: b.loc,
                };
                if !d.reads.contains(&r) {
                    d.reads.push(r);
                }
            }
        });
        None
    }

    /// Read the record at `off` of bound image `b` (blocking).
    fn read_record(&self, f: &Flash, b: Binding, off: usize) -> Option<Fetch> {
        self.read_record_in(f, b, off, false)
    }

    /// [`LogEngine::read_record`] if the page cache holds the bytes (no wait for the
    /// device), else None (and nothing counted: the read is then handed to a thread that
    /// may wait, which counts what goes wrong).
    fn read_cached_record(&self, f: &Flash, b: Binding, off: usize) -> Option<Fetch> {
        self.read_record_in(f, b, off, true)
    }

    fn read_record_in(&self, f: &Flash, b: Binding, off: usize, cached: bool) -> Option<Fetch> {
        let rest = b.used.checked_sub(off).filter(|&n| n > 0)?;
        let failed = || {
            if !cached {
                f.counters.read_errors.fetch_add(1, Ordering::Relaxed);
            }
            None
        };
        let mut want = rest.min(FIRST_READ);
        READ_BUF.with(|scratch| {
            let (buf, out) = &mut *scratch.borrow_mut();
            loop {
                out.clear();
                let read = if cached {
                    f.tier.read_cached(b.loc, off, want, buf, out)
                } else {
                    f.tier.read(b.loc, off, want, buf, out).map(|()| true)
                };
                if !matches!(read, Ok(true)) {
                    return failed();
                }
                if let Some(fetch) = record_in(out, b.base.wrapping_add(off as u64)) {
                    f.counters.reads.fetch_add(1, Ordering::Relaxed);
                    if cached {
                        f.counters.cached_reads.fetch_add(1, Ordering::Relaxed);
                    }
                    return Some(fetch);
                }
                if want == rest {
                    // The whole rest of the image and still no record: damaged (the
                    // blocks' checks passed, so this is not expected).
                    return failed();
                }
                // A longer record: read more, up to the rest of the image.
                want = rest.min(want.saturating_mul(16));
            }
        })
    }

    /// A flash record read for a lookup of another key (its tag matched). A write's look
    /// ahead (`flash_reads_for`) does not count it: the write's own lookup, which finds the
    /// same record kept, does, so that the record counts once.
    pub(super) fn note_tag_misread(&self) {
        if DEFERRED.with(|d| d.borrow().as_ref().is_some_and(|d| d.keep_cached)) {
            return;
        }
        if let Some(f) = self.flash.get() {
            f.counters.tag_misreads.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The record slot value `v` points at, in RAM or (read into `fetch`) on flash.
    ///
    /// # Safety
    /// As [`LogEngine::rec`].
    pub(super) unsafe fn rec_any<'a>(&'a self, v: u64, fetch: &'a mut Fetch) -> Option<Rec<'a>> {
        // SAFETY: forwarded.
        if let Some(r) = unsafe { self.rec(v) } {
            return Some(r);
        }
        *fetch = self.fetch_record(v)?;
        fetch.rec()
    }

    /// Whether eviction sends cold items to flash now.
    pub(super) fn demoting(&self) -> bool {
        self.flash.get().is_some_and(|f| f.tier.accepts_writes())
    }

    /// The segments on flash, as (sequence number, id), in the log's order.
    pub(super) fn bound_segments(&self) -> Vec<(u64, u32)> {
        let Some(f) = self.flash.get() else {
            return Vec::new();
        };
        let mut all: Vec<(u64, u32)> = lock(&f.bound)
            .by_id
            .iter()
            .map(|(&id, b)| (b.seq, id))
            .collect();
        all.sort_unstable();
        all
    }

    /// The image length of flash segment `id`, if it is still the one numbered `seq`.
    pub(super) fn bound_len(&self, id: u32, seq: u64) -> Option<usize> {
        self.binding(id).filter(|b| b.seq == seq).map(|b| b.used)
    }

    /// The first `len` bytes of flash segment `id`'s image (numbered `seq`) and its CAS
    /// base, read on this thread (blocking); None if it left flash or the read failed
    /// (counted).
    pub(super) fn read_bound(&self, id: u32, seq: u64, len: usize) -> Option<(Vec<u8>, u64)> {
        let f = self.flash.get()?;
        let b = self.binding(id).filter(|b| b.seq == seq && len <= b.used)?;
        let mut image = Vec::with_capacity(len);
        match f
            .tier
            .read(b.loc, 0, len, &mut AlignedBuf::new(), &mut image)
        {
            Ok(()) => {
                f.counters.inline_reads.fetch_add(1, Ordering::Relaxed);
                Some((image, b.base))
            }
            Err(_) => {
                f.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Send sealed segment `id` (popped from the FIFO, so ours) to flash whole instead of
    /// evicting it: items read enough get their second chance in RAM, dead ones are
    /// unlinked, and the rest stay where they are, their reads counted from none, while the
    /// segment's image is written. False when nothing is left to write or the tier took no
    /// write (the caller evicts the segment as usual). No stripe lock may be held.
    pub(super) fn demote_segment(&self, id: u32) -> bool {
        // A segment a replica has not read yet is evicted instead (and logged anew for it:
        // `relog_if_unread`): a tail reads segments from memory.
        let seq = self.segs.get(id).map_or(0, |s| s.seq());
        if self.repl.is_active() && self.repl.is_held(seq) {
            return false;
        }
        let now = self.clock.load(Ordering::Relaxed);
        let unit = self.mean_record();
        let min_record = self
            .flash
            .get()
            .map_or(0, |f| f.min_record.load(Ordering::Relaxed) as usize);
        let mut notes = EvictionNotes::default();
        let (mut cold, mut cold_bytes) = (Vec::new(), 0);
        self.for_live_at(id, |slot, r, v, here, h| {
            match self.vis(r, now) {
                Vis::Live => {
                    if index::freq(v) >= self.eviction.keep_need(r.len, unit)
                        && self
                            .copy_forward(&mut self.eviction.evictor(), r, v, slot)
                            .is_some()
                    {
                        self.account_remove(v, r.len, self.rec_size(r));
                        self.st().copied_forward.fetch_add(1, Ordering::Relaxed);
                        return true;
                    }
                    if r.len < min_record {
                        // Under `ext_item_size`: evicted as without a tier.
                        self.count_evicted(r, v, now, &mut notes);
                        self.unlink(slot, r, v);
                        return true;
                    }
                    self.relocate(slot, index::with_freq(v, 0));
                    cold.push((here, h));
                    cold_bytes += r.len;
                }
                Vis::Expired | Vis::Flushed => {
                    self.unlink(slot, r, v);
                    self.count_reclaimed(v, self.rec_size(r), false);
                }
            }
            true
        });
        self.note_evictions(notes);
        if cold.is_empty() {
            return false;
        }
        // Packed records move to another id once written, which a full sync under way
        // must not see (as flash compaction's moves).
        let may_move = !self.repl.is_active() || self.repl.may_move_flash_items().is_some();
        let packed = may_move
            .then(|| self.pack_cold(id, &cold, cold_bytes))
            .flatten();
        self.ship(id, cold.len() as u64, packed)
    }

    /// The cold records of sealed segment `id` (ours, being demoted), listed by offset
    /// and key hash, packed into an image of their own, when leaving the rest out (items
    /// copied forward or evicted, records dead before) saves an eighth of the segment or
    /// more: what flash is written with and holds is then live records, not the whole log.
    /// None: write the segment whole.
    fn pack_cold(&self, id: u32, cold: &[(usize, u64)], cold_bytes: usize) -> Option<Packed> {
        let f = self.flash.get()?;
        let seg = self.segs.get(id)?;
        let ptr = seg.ptr()?;
        let used = seg.used();
        if (SEG_HDR + cold_bytes) * 8 > used * 7 {
            return None;
        }
        // SAFETY: sealed and ours (the caller's contract), mapped; its header was written
        // when it was opened.
        let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
        let cap = f.tier.page_capacity().min(self.seg_size);
        let mut image = vec![0u8; SEG_HDR];
        image.reserve(cold_bytes + cold.len() * 4);
        // SAFETY: `image` holds SEG_HDR bytes that only we touch.
        unsafe { format::write_seg_header(image.as_mut_ptr(), format::SEG_KIND_REGULAR, 0, base) };
        let mut moves = Vec::with_capacity(cold.len());
        for &(here, hash) in cold {
            // SAFETY: as above; `read` checks every length against `used`.
            let r = unsafe { format::read(ptr.as_ptr(), used, here, base) }?;
            let spec = Spec::copy_of(&r);
            let at = image.len();
            let natural = format::natural_cas(base, at);
            if at + format::encoded_len(&spec, natural) > cap {
                return None;
            }
            format::encode_into(&mut image, &spec, natural);
            moves.push(Move {
                hash,
                from: (id, here, r.len),
                to: (at, image.len() - at),
                size: self.rec_size(&r),
                exptime: r.exptime,
            });
        }
        let used = image.len();
        Some(Packed {
            image,
            moves: Moves { moves, used, base },
        })
    }

    /// Queue sealed segment `id`'s image (or, `packed`, its cold records' image) to the
    /// tier, taking a page back if none is free and waiting for the writes under way when
    /// too many are (or the tier's buffer is full). False when no write was queued.
    fn ship(&self, id: u32, items: u64, packed: Option<Packed>) -> bool {
        let Some(f) = self.flash.get() else {
            return false;
        };
        let Some(seg) = self.segs.get(id) else {
            return false;
        };
        let Some(ptr) = seg.ptr() else {
            return false;
        };
        let most = (self.budget() / self.seg_size / 8).max(1);
        let image = packed.map(|p| {
            // Before the write can finish: `settle` looks for it.
            lock(&f.packed).insert(id, p.moves);
            p.image
        });
        for _ in 0..2 {
            if f.in_flight.load(Ordering::Relaxed) >= most {
                f.tier.drain();
                self.settle();
            }
            // Make room first, keeping a page free for compaction's output. Offline (a
            // probe's page already taken), nothing is worth dropping a page for.
            if !f.tier.is_offline() && f.tier.free_pages() <= RESERVE {
                self.reclaim();
            }
            let Some(loc) = f.tier.alloc() else {
                lock(&f.packed).remove(&id);
                return false;
            };
            let image = match &image {
                Some(image) => &image[..],
                // SAFETY: the segment is sealed (`used` final) and ours until it is bound
                // or handed back to the FIFO; `used` bytes of it are written.
                None => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), seg.used()) },
            };
            let done = Arc::clone(&f.done);
            let sent = f.tier.write(
                loc,
                image,
                Box::new(move |res| {
                    lock(&done).push(Written {
                        id,
                        loc,
                        ok: res.is_ok(),
                    })
                }),
            );
            match sent {
                Ok(()) => {
                    f.in_flight.fetch_add(1, Ordering::Relaxed);
                    f.counters
                        .objects_written
                        .fetch_add(items, Ordering::Relaxed);
                    f.counters
                        .bytes_demoted
                        .fetch_add(seg.live_bytes(), Ordering::Relaxed);
                    return true;
                }
                Err(TierError::Busy) => {
                    f.tier.free(loc);
                    f.tier.drain();
                    self.settle();
                }
                Err(_) => {
                    f.tier.free(loc);
                    break;
                }
            }
        }
        lock(&f.packed).remove(&id);
        f.counters.write_failures.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Bind the segments whose writes finished; give those that failed to the FIFO.
    pub(super) fn settle(&self) {
        let Some(f) = self.flash.get() else {
            return;
        };
        let written = std::mem::take(&mut *lock(&f.done));
        if written.is_empty() {
            return;
        }
        f.in_flight.fetch_sub(written.len(), Ordering::Relaxed);
        let mut moved = Vec::new();
        let mut emptied = Vec::new();
        // A segment whose write failed (or, `failed` false, cannot be bound yet) goes
        // back to the FIFO, to be demoted again or evicted as without a tier.
        let unbound = |w: &Written, failed: bool| {
            f.tier.free(w.loc);
            if failed {
                f.counters.write_failures.fetch_add(1, Ordering::Relaxed);
            }
            self.eviction.push(w.id, Queue::Small);
        };
        for w in written {
            let packed = lock(&f.packed).remove(&w.id);
            let Some(seg) = self.segs.get(w.id) else {
                continue;
            };
            let (Some(ptr), true) = (seg.ptr(), w.ok) else {
                unbound(&w, true);
                continue;
            };
            if let Some(m) = packed {
                // Its cold records, packed, now under an id of their own: the segment is
                // empty, freed below.
                match self.bind_packed(f, w.loc, seg.seq(), m) {
                    Ok(()) => {
                        self.retire(w.id);
                        emptied.push(w.id);
                    }
                    Err(failed) => unbound(&w, failed),
                }
                continue;
            }
            // SAFETY: the segment is sealed and ours (out of every queue); its header was
            // written when it was opened.
            let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
            let b = Binding {
                loc: w.loc,
                used: seg.used(),
                base,
                seq: seg.seq(),
            };
            {
                let mut bound = lock(&f.bound);
                bound.by_id.insert(w.id, b);
                bound.order.push_back(w.id);
            }
            // Readers that load a slot from now on and find no mapping find the binding.
            self.retire(w.id);
            if !self.detach_leases(seg) {
                if let Some(m) = seg.take_mapping() {
                    moved.push(m);
                }
            }
        }
        if moved.is_empty() && emptied.is_empty() {
            return;
        }
        // Readers that found the mapping before it was taken, or a slot value naming an
        // emptied segment before it moved, are gone after this.
        self.barrier();
        let mut p = self.arena.pool();
        for id in emptied {
            // As eviction frees a segment it emptied (`evict_one`).
            let over = self.arena.allocated() > self.budget();
            if over || self.gives_back(id) {
                self.release(&mut p, id);
            } else {
                p.push_free(id);
            }
        }
        for (ptr, cap) in moved {
            // Over budget (the index grew with the items flash holds): give it back.
            let keep = self.arena.allocated() <= self.budget();
            let id = keep.then(|| p.draw_id(self.index.max_segments())).flatten();
            let seg = id.map(|id| (id, self.segs.get_or_create(id)));
            match seg {
                Some((id, Some(seg))) => {
                    seg.install(ptr, cap, false, false);
                    p.push_free(id);
                }
                other => {
                    if let Some((id, None)) = other {
                        p.return_id(id);
                    }
                    // SAFETY: unreachable now (barrier above); it came from `mem::map`.
                    unsafe { super::mem::unmap(ptr, cap) };
                    self.arena.unmapped(cap);
                }
            }
        }
    }

    /// Bind the packed image written at `loc` (`m`: where its records go; `seq`: its
    /// segment's) under a new id and move its records' slots there. `Err(false)` while a
    /// replica's full sync is under way (it lists flash pages by sequence number, so
    /// nothing moves), `Err(true)` when no id is left.
    fn bind_packed(&self, f: &Flash, loc: Loc, seq: u64, m: Moves) -> Result<(), bool> {
        let _gate = if self.repl.is_active() {
            Some(self.repl.may_move_flash_items().ok_or(false)?)
        } else {
            None
        };
        let b = Binding {
            loc,
            used: m.used,
            base: m.base,
            seq,
        };
        let new = self.bound_id(b).ok_or(true)?;
        lock(&f.bound).order.push_back(new);
        self.move_to(new, &m.moves);
        Ok(())
    }

    /// Make room on a tier that is about full before eviction needs it: reclaim (below)
    /// until [`free_target`] pages are free, at most twice that many times per call (the
    /// maintenance thread's, every tick). No stripe lock may be held.
    pub(super) fn flash_make_room(&self) {
        let Some(f) = self.flash.get() else {
            return;
        };
        if f.tier.is_offline() {
            return;
        }
        let want = free_target(
            f.tier.pages() as usize,
            f.compact_under.load(Ordering::Relaxed),
        );
        for _ in 0..2 * want {
            let free = f.tier.free_pages();
            if free >= want {
                break;
            }
            self.reclaim();
            if f.tier.free_pages() <= free {
                // Nothing to take back (no bound page yet), or writes took what was freed.
                break;
            }
        }
    }

    /// Make room on a full tier (see the module documentation): of the oldest
    /// `RECLAIM_WINDOW` pages, the emptiest (by `RECLAIM_STEPS`ths of a page, the oldest
    /// first among equals) whose live records together fit one page are
    /// compacted into a free page when there are at least two of them (every live item
    /// kept); else the emptiest page is taken back, its items read while on flash rescued
    /// and the rest evicted. No stripe lock may be held.
    fn reclaim(&self) {
        let Some(f) = self.flash.get() else {
            return;
        };
        let room = f.tier.page_capacity().min(self.seg_size) - SEG_HDR;
        // While a replica is in a full sync (which lists flash pages by sequence number),
        // items do not move between pages: the emptiest page is taken back instead.
        let gate = if self.repl.is_active() {
            self.repl.may_move_flash_items().map(Some)
        } else {
            Some(None)
        };
        // Picked and taken out of the reclaim order under one lock: no other thread
        // reclaims the same pages.
        let victims: Vec<(u32, Binding)> = {
            let mut bound = lock(&f.bound);
            let mut window: Vec<(u64, usize, u32)> = bound
                .order
                .iter()
                .take(RECLAIM_WINDOW)
                .enumerate()
                .filter_map(|(i, &id)| {
                    let s = self.segs.get(id)?;
                    // Room for a record's CAS written out where its place no longer gives it.
                    Some((s.live_bytes() + s.live_items() * 16, i, id))
                })
                .collect();
            // Emptiest first in steps of `RECLAIM_STEPS`ths of a page, oldest first within
            // a step: of pages about as full, the oldest goes (a few bytes less in a
            // younger page are no reason to keep an older one).
            let step = (room / RECLAIM_STEPS).max(1) as u64;
            window.sort_unstable_by_key(|&(need, i, _)| (need / step, i));
            // `ext_max_frag` below 1000: pages as full as that or fuller are not compacted.
            let max_frag = f.max_frag.load(Ordering::Relaxed);
            let frag = (max_frag < 1000).then(|| room as u64 * u64::from(max_frag) / 1000);
            let mut total = 0u64;
            let fit = window
                .iter()
                .take_while(|&&(need, ..)| {
                    total += need;
                    total <= room as u64 && frag.is_none_or(|frag| need < frag)
                })
                .count();
            let take = if fit >= 2 && gate.is_some() { fit } else { 1 };
            let ids: Vec<u32> = window.iter().take(take).map(|&(.., id)| id).collect();
            bound.order.retain(|id| !ids.contains(id));
            ids.iter()
                .filter_map(|&id| Some((id, bound.by_id.get(&id).copied()?)))
                .collect()
        };
        match victims.as_slice() {
            [] => {}
            [(id, b)] => self.drop_page(*id, *b, None, true),
            _ => self.compact(&victims),
        }
        drop(gate);
    }

    /// Write the live items of the bound segments `victims` (taken out of the reclaim
    /// order) into one new page, point their slots there, and take the victims' pages
    /// back. Without a free page, or when the write fails, the victims are taken back as
    /// `reclaim` takes back one (their read items rescued, the rest evicted).
    fn compact(&self, victims: &[(u32, Binding)]) {
        let Some(f) = self.flash.get() else {
            return;
        };
        let now = self.clock.load(Ordering::Relaxed);
        let mut buf = AlignedBuf::new();
        let mut images: Vec<Option<Vec<u8>>> = Vec::with_capacity(victims.len());
        // The new image: a regular segment's header, then each live record copied.
        let base = victims.iter().map(|(_, b)| b.base).min().unwrap_or(0);
        let mut out = vec![0u8; SEG_HDR];
        // SAFETY: `out` holds SEG_HDR bytes that only we touch.
        unsafe { format::write_seg_header(out.as_mut_ptr(), format::SEG_KIND_REGULAR, 0, base) };
        let cap = f.tier.page_capacity().min(self.seg_size);
        let mut moves: Vec<Move> = Vec::new();
        let mut has_live = false;
        let drop_unread = f.drop_unread.load(Ordering::Relaxed);
        for &(id, b) in victims {
            let mut image = Vec::with_capacity(b.used);
            if f.tier.read(b.loc, 0, b.used, &mut buf, &mut image).is_err() {
                // Taken back below as an unreadable page (counted there).
                images.push(None);
                continue;
            }
            let mut off = SEG_HDR;
            while off < b.used {
                // SAFETY: `image` is ours; `read` checks every length against its end.
                let Some(r) = (unsafe { format::read(image.as_ptr(), image.len(), off, b.base) })
                else {
                    break;
                };
                let here = off;
                off += r.len.max(1);
                if r.kind != KIND_ITEM || self.vis(&r, now) != Vis::Live {
                    continue;
                }
                let h = self.hash(r.key);
                let indexed = {
                    let _g = self.index.lock(h);
                    self.index
                        .find(h, |x| {
                            index::slot_seg(x) == id && index::slot_off(x) == here
                        })
                        .map(|(_, v)| v)
                };
                // Not moved: evicted with the victim's page (`ext_drop_unread`: unless read
                // since it went to flash, as a page taken back rescues only those).
                match indexed {
                    None => continue,
                    Some(v) if drop_unread && index::freq(v) == 0 => continue,
                    Some(_) => {}
                }
                let spec = Spec::copy_of(&r);
                let at = out.len();
                let natural = format::natural_cas(base, at);
                if at + format::encoded_len(&spec, natural) > cap {
                    // Cannot happen with the room `reclaim` keeps; the item is evicted with
                    // its page if it does.
                    continue;
                }
                format::encode_into(&mut out, &spec, natural);
                moves.push(Move {
                    hash: h,
                    from: (id, here, r.len),
                    to: (at, out.len() - at),
                    size: self.rec_size(&r),
                    exptime: r.exptime,
                });
                has_live = true;
            }
            images.push(Some(image));
        }
        let written = has_live
            && f.tier.alloc().is_some_and(|loc| {
                let ok = Arc::new(AtomicBool::new(false));
                let done = Arc::clone(&ok);
                let sent = f.tier.write(
                    loc,
                    &out,
                    Box::new(move |res| done.store(res.is_ok(), Ordering::Release)),
                );
                if sent.is_ok() {
                    f.tier.drain();
                }
                if sent.is_err() || !ok.load(Ordering::Acquire) {
                    f.tier.free(loc);
                    return false;
                }
                let seq = victims.iter().map(|(_, b)| b.seq).max().unwrap_or(0);
                let binding = Binding {
                    loc,
                    used: out.len(),
                    base,
                    seq,
                };
                match self.bound_id(binding) {
                    Some(new) => {
                        let moved = self.move_to(new, &moves);
                        f.counters.rescues.fetch_add(moved, Ordering::Relaxed);
                        lock(&f.bound).order.push_back(new);
                        f.counters.pages_compacted.fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    None => {
                        f.tier.free(loc);
                        false
                    }
                }
            });
        if has_live && !written {
            f.counters.write_failures.fetch_add(1, Ordering::Relaxed);
        }
        // What was not moved (dead, or the write failed) goes with the victims' pages.
        for (&(id, b), image) in victims.iter().zip(images) {
            self.drop_page(id, b, Some(image), !written);
        }
    }

    /// Point the slots that still name the records `moves` lists at their copies in the
    /// new bound segment `new` (a page's compaction, a demoted segment's packed cold
    /// records), moving their accounting with them. Returns how many moved.
    fn move_to(&self, new: u32, moves: &[Move]) -> u64 {
        let now = self.clock.load(Ordering::Relaxed);
        let mut moved = 0;
        for m in moves {
            let (id, off, old_len) = m.from;
            let _g = self.index.lock(m.hash);
            let Some((slot, v)) = self.index.find(m.hash, |x| {
                index::slot_seg(x) == id && index::slot_off(x) == off
            }) else {
                // Written or deleted meanwhile: the copy is dead bytes.
                continue;
            };
            let new_v = index::pack(
                index::slot_tag(v),
                new,
                m.to.0 as u32,
                index::freq(v),
                index::fetched(v),
            ) | (v & index::WIN);
            self.account_add(new, m.to.1, m.size, m.exptime);
            self.relocate(slot, new_v);
            self.account_remove(v, old_len, m.size);
            moved += 1;
        }
        if let Some(seg) = self.segs.get(new) {
            seg.note_written(SEG_HDR, now);
        }
        moved
    }

    /// Take bound segment `id`'s page back (`b`, out of the reclaim order; `image`: its
    /// bytes if read already, None if the read failed): items read while on flash go back
    /// to memory if there is room, the rest are evicted; then the page and the id are
    /// freed. Counted as a page eviction (`extstore_page_evictions`) if `evicting` (not
    /// the remains of a compaction). No stripe lock may be held.
    fn drop_page(&self, id: u32, b: Binding, image: Option<Option<Vec<u8>>>, evicting: bool) {
        let Some(f) = self.flash.get() else {
            return;
        };
        let live = self.segs.get(id).map_or(0, |s| s.live_items());
        let read = match image {
            Some(Some(image)) => Ok(image),
            Some(None) => Err(()),
            // An empty page's records need not be read.
            None if live == 0 => Ok(Vec::new()),
            None => {
                let mut image = Vec::with_capacity(b.used);
                f.tier
                    .read(b.loc, 0, b.used, &mut AlignedBuf::new(), &mut image)
                    .map(|()| image)
                    .map_err(drop)
            }
        };
        let now = self.clock.load(Ordering::Relaxed);
        let mut notes = EvictionNotes::default();
        let mut evict = |slot: Slot<'_>, cur: u64, r: &Rec<'_>| {
            // Read since it went to flash, and live: back to memory if there is room
            // without evicting (memcached's compaction rescues).
            if index::freq(cur) >= 1
                && self.vis(r, now) == Vis::Live
                && self
                    .copy_forward(&mut self.eviction.evictor(), r, cur, slot)
                    .is_some()
            {
                self.account_remove(cur, r.len, self.rec_size(r));
                f.counters.rescues.fetch_add(1, Ordering::Relaxed);
                return;
            }
            self.count_flash_eviction(r, cur, now, &mut notes);
            slot.store(0);
            self.account_remove(cur, r.len, self.rec_size(r));
        };
        if let Ok(image) = &read {
            let mut off = SEG_HDR;
            while off < image.len() {
                // SAFETY: `image` is ours; `read` checks every length against its end.
                let Some(r) = (unsafe { format::read(image.as_ptr(), image.len(), off, b.base) })
                else {
                    break;
                };
                let here = off;
                off += r.len.max(1);
                if r.kind != KIND_ITEM {
                    continue;
                }
                let h = self.hash(r.key);
                let _g = self.index.lock(h);
                if let Some((slot, cur)) = self.index.find(h, |x| {
                    index::slot_seg(x) == id && index::slot_off(x) == here
                }) {
                    evict(slot, cur, &r);
                }
            }
        } else {
            f.counters.read_errors.fetch_add(1, Ordering::Relaxed);
        }
        // Whatever a damaged or unreadable image did not name: find it by the index.
        if self.segs.get(id).is_some_and(|s| s.live_items() > 0) {
            self.for_each_indexed(|slot, cur| {
                if index::slot_seg(cur) == id {
                    let mut fetch = Fetch::default();
                    // SAFETY: we hold the chain's stripe lock and `cur` is in its slot.
                    match unsafe { self.rec_any(cur, &mut fetch) } {
                        Some(r) => evict(slot, cur, &r),
                        None => {
                            slot.store(0);
                            self.stats.add_live(-1);
                        }
                    }
                }
            });
        }
        self.note_evictions(notes);
        lock(&f.bound).by_id.remove(&id);
        {
            let mut kept = lock(&f.fetched);
            kept.by_key.retain(|k, _| k.0 != id);
            kept.order.retain(|k| k.0 != id);
        }
        // Readers that loaded a slot of it may still read the page: freeing it moves its
        // generation on, so their reads fail (a miss) rather than see the next image.
        f.tier.free(b.loc);
        self.barrier();
        if evicting {
            f.counters.pages_dropped.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(seg) = self.segs.get(id) {
            seg.reset_accounting();
        }
        self.arena.pool().return_id(id);
    }

    /// Count the eviction of the flash item `r` (slot value `v`).
    fn count_flash_eviction(
        &self,
        r: &Rec<'_>,
        v: u64,
        now: crate::Time,
        notes: &mut EvictionNotes,
    ) {
        if let Some(f) = self.flash.get() {
            f.counters.objects_evicted.fetch_add(1, Ordering::Relaxed);
        }
        self.note_removed(r, v);
        if self.vis(r, now) == Vis::Live {
            self.count_evicted(r, v, now, notes);
        } else {
            self.count_reclaimed(v, self.rec_size(r), false);
        }
    }
}

/// Keep `fetch` as the record at `key` (segment, offset, page generation) for lookups to
/// come, dropping the oldest beyond `FETCHED_MAX`.
/// The record at the start of `out` (image bytes from the image offset whose CAS base is
/// `base`), if `out` holds all of it. One allocation per record, of the record alone (not
/// the rest of the read: records kept for re-runs held 2 KiB each, 8 MB in all).
fn record_in(out: &[u8], base: u64) -> Option<Fetch> {
    // SAFETY: `out` is initialized; `read` checks every length against its end.
    let len = unsafe { format::read(out.as_ptr(), out.len(), 0, base) }.map(|r| r.len)?;
    Some(Fetch {
        bytes: Some(Arc::from(out.get(..len)?)),
        base,
    })
}

fn keep_fetched(kept: &mut Fetched, key: (u32, u32, Loc), fetch: Fetch) {
    if kept.by_key.insert(key, fetch).is_none() {
        kept.order.push_back(key);
    }
    while kept.order.len() > FETCHED_MAX {
        if let Some(old) = kept.order.pop_front() {
            kept.by_key.remove(&old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ahead, free_target, RESERVE};
    use crate::flash::{Tier, TierConfig};
    use crate::{Engine, EngineConfig, IndexLayout, LogEngine, ReadOptions, StoreMode};
    use crate::{StoreRequest, StoreResult, Time};

    const NOW: Time = 1000;

    #[test]
    fn the_free_page_target_is_ext_compact_under_within_bounds() {
        for pages in [4, 16, 256, 4096, 100_000] {
            // 0: kvcached's own margin.
            assert_eq!(free_target(pages, 0), RESERVE + ahead(pages) + 1);
            // Never fewer than one beyond the reserve, nor more than half the tier.
            assert_eq!(free_target(pages, 1), RESERVE + 1);
            assert_eq!(free_target(pages, u32::MAX), (pages / 2).max(RESERVE + 1));
        }
        assert_eq!(free_target(256, 40), 40);
        assert_eq!(free_target(256, 200), 128);
    }

    fn set(e: &LogEngine, i: u64) -> bool {
        let (k, v) = (format!("key:{i}"), value(i));
        let req = StoreRequest {
            mode: StoreMode::Set,
            key: k.as_bytes(),
            value: &v,
            flags: 0,
            exptime: 0,
        };
        matches!(e.store(req, NOW), StoreResult::Stored(_))
    }

    fn value(i: u64) -> Vec<u8> {
        let tag = format!("{i}:");
        tag.bytes()
            .chain(std::iter::repeat(b'v'))
            .take(1000)
            .collect()
    }

    /// Keys read back among `keys`, each checked byte for byte.
    fn read_back(e: &LogEngine, keys: std::ops::Range<u64>) -> u64 {
        let mut hits = 0;
        for i in keys {
            let mut got = None;
            e.get(
                format!("key:{i}").as_bytes(),
                NOW,
                ReadOptions::default(),
                &mut |v| got = Some(v.value.to_vec()),
            );
            if let Some(v) = got {
                assert_eq!(v, value(i), "key {i}: wrong bytes");
                hits += 1;
            }
        }
        hits
    }

    /// A device whose writes fail: segments are evicted as without a tier (nothing wrong
    /// is read, the accounting stays exact), the tier goes offline with the error kept,
    /// and once the device works again a probe write brings it back and items go to
    /// flash again.
    #[test]
    fn write_errors_evict_as_without_a_tier_and_a_probe_recovers() {
        let dir = std::env::temp_dir().join(format!("kvstore-flash-fail-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let e = LogEngine::with_layout(
            EngineConfig {
                max_bytes: 4 << 20,
                max_item_size: 1 << 20,
                no_evict: false,
                use_cas: true,
            },
            IndexLayout::Wide,
        );
        let made = Tier::create(&TierConfig {
            files: vec![(dir.join("flash"), 96 << 20)],
            page_bytes: e.segment_size(),
            write_threads: 1,
            write_buffer: 4 << 20,
            direct: true,
        })
        .expect("tier");
        e.attach_flash(made).expect("attach");
        fn tier(e: &LogEngine) -> &Tier {
            &e.flash.get().expect("a tier").tier
        }

        // Working: beyond memory goes to flash.
        let first = 10_000;
        for i in 0..first {
            assert!(set(&e, i));
        }
        e.flash_settle();
        let on_flash = e.flash_stats().expect("stats").objects_used;
        assert!(on_flash > first / 2, "{on_flash} on flash");

        // Failing: writes go on, segments are evicted, the tier goes offline.
        tier(&e).fail_writes(true);
        let failing = first..first + 20_000;
        for i in failing.clone() {
            assert!(set(&e, i), "a set while flash fails");
        }
        e.flash_settle();
        let s = e.flash_stats().expect("stats");
        assert!(s.tier.offline, "{s:?}");
        assert!(s.write_failures > 0, "{s:?}");
        assert!(e.flash_write_error().is_some());
        e.check_accounting().expect("accounting while failing");
        let hits = read_back(&e, 0..failing.end);
        assert!(
            hits >= on_flash,
            "{hits} read back, {on_flash} were on flash"
        );

        // Working again: a probe brings the tier back (bounded: a probe comes every 64
        // segments evicted).
        tier(&e).fail_writes(false);
        let mut next = failing.end;
        while e.flash_stats().expect("stats").tier.offline && next < failing.end + 200_000 {
            assert!(set(&e, next));
            next += 1;
            if next % 1000 == 0 {
                e.flash_settle();
            }
        }
        let s = e.flash_stats().expect("stats");
        assert!(
            !s.tier.offline,
            "still offline after {} sets: {s:?}",
            next - failing.end
        );
        assert_eq!(s.tier.recoveries, 1);
        let after = next;
        for i in after..after + 20_000 {
            assert!(set(&e, i));
        }
        e.flash_settle();
        e.check_accounting().expect("accounting after recovery");
        let hits = read_back(&e, after..after + 20_000);
        assert!(hits > 18_000, "{hits} of 20,000 read back after recovery");
        drop(e);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
