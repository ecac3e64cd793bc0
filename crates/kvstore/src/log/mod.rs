//! The log-structured engine ([`LogEngine`]): items appended to fixed-size segments, a
//! lock-free-read hash index of tagged slots, and eviction of whole segments from two
//! FIFOs (a probation queue for new items, a main queue with CLOCK second chances).
//!
//! # Files
//!
//! This file holds the engine, its constants and the helpers every path uses (hashing,
//! pins and barriers, lookups, accounting). `LogEngine`'s fields are its parts and its
//! settings; each part is a type with private fields and narrow methods, and owns the
//! invariants it keeps (its `unsafe` blocks say which):
//! `index.rs` (the slot index, [`index::Index`]), `seg.rs` (segment headers and what they
//! promise readers, [`seg::Seg`]), `arena.rs` (the memory limit, the segment memory mapped
//! and leased, the free pool: [`arena::Arena`]), `order.rs` (the log's order: segments'
//! sequence numbers, the live and open segments in that order, [`order::LogOrder`]),
//! `open.rs` (the open segments writers append to, [`open::OpenSegs`], with `ttl.rs`'s
//! classes), `evict.rs` (the eviction policy's state, [`evict::Eviction`]: the FIFOs, the
//! evictor, the miss sketch of `sketch.rs`), `stats.rs` (per-thread counters,
//! [`stats::Stats`]), `sweep.rs` (the background sweep's place), `flush.rs`, `cas.rs`,
//! `grow.rs` (index growth's pending steps), `sync.rs` (pins), `mem.rs` (mappings),
//! `format.rs` (the record format), `lease.rs` (leased values), `tally.rs`.
//!
//! The paths that combine the parts are `impl LogEngine` blocks, one concern each:
//! `segments.rs` (taking, opening, sealing and freeing segments), `write.rs` (the write
//! path and the commands built on it), `evict.rs` (segment eviction and copy-forward),
//! `compact.rs` (`-M`), `meta.rs` (meta reads), `engine.rs` (the `Engine` trait's entry
//! points), `repl/` (log shipping), `snapshot.rs` (warm restart), `walk.rs` (`digest`,
//! `scan`).
//!
//! # Layout
//!
//! * **Segments** (`seg_size`, 1 MiB unless `-m` is small) are anonymous mappings. Records
//!   (see `FORMAT.md`) are appended back to back. Each place in a segment names a CAS
//!   unique (the segment reserves a block of them when it opens), so a fresh write stores
//!   no CAS: a 15-byte key with a 32-byte value takes a 2-byte header. A record whose
//!   version is not its place's (a touch, a copy, a replica's record) stores it as a delta.
//!   Items larger than a segment get a segment of their own (a "large" segment: one
//!   record, mapped to size).
//! * **Index**: buckets of ten 6-byte slots, one cache line each (see [`index`]).
//!   A slot names segment + offset and holds a tag (10 bits for up to 4096 segments), the
//!   CLOCK access bits and the meta protocol's "win token sent" bit. An item's last
//!   access time, which the meta protocol shows, is when its record was written: the
//!   segment keeps the offsets at which the clock changed (`written.rs`).
//! * **Append shards**: each thread appends to the open segment of its shard (threads
//!   are spread over shards round-robin), so writers of different shards never share an
//!   append lock.
//! * **TTL classes**: an item with a time to live goes instead to the open segment of its
//!   TTL class (`ttl.rs`: geometric classes from 1 s to 36 hours), so the
//!   items of a segment expire about together. A segment keeps the latest expiry it was
//!   given, and the earliest (`seg.rs`; `maintain`'s sweep
//!   of the index reads no record of a segment before it, see `sweep.rs`);
//!   `maintain` frees every sealed segment past the latest, anywhere in
//!   the FIFOs, without waiting for eviction (`expire_segments`), and seals a class's
//!   open segment once its first items have all expired (`seal_aged`), so a class written
//!   to slowly does not keep expired items in a segment that never fills. The open
//!   segments of the classes take at most an eighth of the segments (a small cache gets
//!   few, coarse classes); class segments play a shard's part in the lock order, and are
//!   shared by the threads, so a writer only tries their locks and writes to its shard's
//!   segment when they are busy (`ttl_class_busy`).
//! * **Two FIFOs** of sealed segments (S3-FIFO, by whole segments): segments of new
//!   writes join the small (probation) queue, segments of second-chance copies the main
//!   queue. The small queue's oldest segment is evicted while the small queue holds more
//!   than `SMALL_PERCENT` (10%) of the sealed segments, else the main queue's. Either way an
//!   item whose slot says it was read often enough since it was written (or last copied)
//!   is copied forward into the main queue, its counter decremented; the rest is dropped
//!   (expired, flushed, overwritten or deleted records just are not referenced). Often
//!   enough depends on size ([`LogEngine::set_size_factor`]): one read up to `factor` times
//!   the mean record, two up to twice that, else three. A count-min sketch of keys stored
//!   while absent (`sketch.rs`) plays S3-FIFO's ghost queue: a key stored again while the
//!   sketch remembers it starts with one read counted. Without a size factor every item
//!   needs one read, the small queue may hold `SMALL_PERCENT_BLIND` (40%) and the sketch is
//!   not used.
//!
//! # Concurrency
//!
//! Locks, in the only order they are ever taken: shard → compactor → bucket stripe → evictor →
//! pool / FIFO (shard locks of other threads are only ever `try_lock`ed). Readers take none
//! of them: a reader holds a *pin* while it loads slots and reads records, and memory is
//! reused only after every slot into it was unlinked and a barrier waited out the pins
//! taken before (`sync.rs`, [`sync::Pins`], owns that invariant). Records are never
//! modified once published, and a segment is never written below its append offset, so
//! the `&[u8]` a reader hands to its callback cannot change under it.
//!
//! Writers (store, delete, incr/decr, touch) reserve room under their shard lock, then
//! take the key's bucket stripe lock, check the mode's condition against the current
//! item, write the record, publish it (release store of its state byte) and only then
//! store the slot (release). Under a bucket stripe lock, items of that stripe cannot be
//! evicted (eviction needs the same lock to unlink them), so writers read the old item
//! there without a pin. Nobody waits for pins while holding a bucket lock, and nobody
//! takes the shard or evictor lock while holding a pin, so the pin barrier cannot
//! deadlock. Callbacks passed to [`Engine::get`] must not call back into the engine.
//!
//! # Meta protocol
//!
//! `mg`/`ms`/`md`/`ma`/`me` are implemented exactly (as the model in `model.rs` specifies
//! them), on the same write path (`apply`): the stale and binary-key marks and an explicit
//! CAS (`E`) live in the record (`FORMAT.md`, "Meta-protocol state"); the win mark and the
//! fetched bit live in the index slot because readers change them. The win mark changes
//! only under the key's stripe lock: a reader that wins takes the lock, checks that the
//! slot still holds the item it read and sets the mark in the exchange that also records
//! its access, so exactly one of concurrent readers wins; `mg ... T` and `mg ... N` set it
//! when they install the rewritten or created item; writers that keep it (touch, in-place
//! incr/decr, stale `ms ... I`, second-chance copies) carry it over from the value the
//! slot holds when it is replaced (`index::Slot::fetch_update`), never from a value loaded
//! earlier. Conditions on CAS (`C`) are
//! checked against a pinned read and made atomic by a location condition (`Cond::Loc`):
//! the write happens only if the item is still the one checked.
//!
//! Locks are held for short, bounded work. Eviction runs on the write path that needs a
//! segment (about once per segment's worth of writes): the thread walks the segment it
//! popped (other threads may be cleaning other segments), taking each live record's
//! stripe lock in turn, then waits for readers' pins.
//!
//! # Flush
//!
//! `flush.rs` ([`flush::Flush`]): watermarks of CAS uniques and a pending deadline that every
//! read consults.
//!
//! # Memory
//!
//! `-m` covers the index and the segments. The index is sized to the items, not to `-m`:
//! it starts at a few thousand buckets and grows by linear hashing (see [`index`]) while
//! the items exceed its main slots (load 1.0: a fifth of the items sit in overflow buckets), one batch of splits at a time by whichever
//! writer notices (the pin barriers a batch needs are tried, not waited for,
//! and a batch whose barrier is held up finishes on a later call; `maintain` waits). A
//! slot costs 6.4 bytes, about 8.3 per item with the overflow buckets (of four slots,
//! half a cache line: BENCHMARKS.md). Growth stops at half
//! the limit, or (with `no_evict`) at the memory no segment uses, and at one main slot
//! per 32 bytes of the starting limit (a mapping reserved up front and touched only as
//! the index grows); beyond that the index is lossy (a full chain replaces a slot,
//! counted as `evicted_index_full`). Segments get the limit minus the index, and are
//! evicted when the index grows into their room; segment memory is mapped on demand and
//! unmapped when the limit shrinks. The index never shrinks (memcached's hash table does
//! not either): if the limit later falls under it, segments keep a quarter of the limit.
//!
//! # Known gaps
//!
//! * `touch`/`gat` rewrite the item (same CAS, new expiry) at the log head, 8-12 bytes
//!   longer than a fresh record (it stores its version and a stamp); with `no_evict` and
//!   full memory they go into the compactor's segment, refilled by compaction
//!   (`compact.rs`), and miss only if no byte of the log is dead or free. For that,
//!   `no_evict` keeps back 12 bytes per item (at most an eighth of the memory, at least a
//!   thirty-second) from new writes.
//! * Delete appends a tombstone; with `no_evict` and full memory the delete happens
//!   without one (a log reader would miss it). Flushes are not logged.
//! * Flushes travel to replicas as watermarks in every batch, not as log records (see
//!   `repl/`); warm restart (`dump`/`restore`) writes the live items, not the log.
//! * A replica whose cursor still needs a segment that compaction (`no_evict`) took out of
//!   the log resynchronizes fully. The maintenance pass, which frees segments whose items
//!   all expired or died, keeps those a replica served with `repl_serve_as` has not read
//!   (up to the backlog, by default a sixteenth of the limit, `repl_hold`,
//!   `set_repl_backlog`); past the backlog, and whenever eviction (which does not wait)
//!   frees one, a tombstone for each record whose key has no current item elsewhere is
//!   logged anew first (`relog_for_skip`), and the replica skips the segment.
//! * The index never shrinks, and its largest size is fixed by the starting `-m` (one main
//!   slot per 32 bytes): raising the limit later (`cache_memlimit`) adds segments only.
//! * A reader that records an access on a slot while a split or compaction moves it may
//!   lose that access mark, and one that races with a writer replacing the item may
//!   record it on the new item; win marks are never lost or misplaced.
//! * Meta: `mg ... T` and `md ... I` rewrite the item like touch does (no room with
//!   `no_evict` and full memory: a miss, `NS`). `l`/`la` show the time since the item's
//!   record was written (a set, a touch, or a copy by eviction, which keeps only items
//!   read since they were written), not since it was last read: no per-item time is
//!   kept (docs/COMPATIBILITY.md).

mod arena;
mod cas;
mod compact;
mod engine;
mod evict;
mod flash;
mod flush;
mod format;
mod grow;
mod index;
pub(crate) mod lease;
mod mem;
mod meta;
mod open;
mod order;
pub mod repl;
mod seg;
mod segments;
mod sketch;
pub mod snapshot;
mod stats;
mod sweep;
mod sync;
pub mod tally;
#[cfg(test)]
mod tests;
mod ttl;
pub mod walk;
mod write;
mod written;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::{EngineConfig, ItemView, Time};
use arena::Arena;
use evict::Eviction;
pub use evict::DEFAULT_SIZE_FACTOR;
pub use flash::{FlashAttachError, FlashIo, FlashRead, FlashRestore, FlashStats};
use flush::Flush;
use format::{Rec, Spec, KIND_ITEM, META_BINARY_KEY, META_STALE};
use grow::Grow;
pub use index::IndexLayout;
use index::{Index, Insert, Slot, IDENT_MASK};
use open::OpenSegs;
use order::LogOrder;
use seg::SegTable;
use segments::Queue;
use stats::Stats;
use sweep::Sweep;
use sync::{lock, Pins};
use write::{Commit, Cond, MetaW, Src};

/// Largest segment (offsets must fit the slot's offset field).
const MAX_SEG_SIZE: usize = 1 << 20;
const MIN_SEG_SIZE: usize = 4 << 10;
const _: () = assert!(MAX_SEG_SIZE <= index::MAX_OFFSET);
/// The index may grow to one main slot per this many bytes of `-m` (it is sized to the
/// items it holds; beyond this many items it becomes lossy).
const BYTES_PER_SLOT: usize = 32;
/// The same for the wide index, whose items may be on flash: it may take seven eighths
/// of `-m` ([`LogEngine::index_cap`]), at about 9 bytes a main slot.
const WIDE_BYTES_PER_SLOT: usize = 12;
/// The index grows while its items exceed this fraction of its main slots
/// (`LOAD_NUM / LOAD_DEN`): 1.2 (twelve items per ten-slot bucket on average, a sixth of
/// them in overflow buckets) measured 0.3 bytes per small item less than 1.0
/// (`bench/memory.sh`: 57.8 against 58.1 above the empty process; BENCHMARKS.md).
const LOAD_NUM: usize = 24;
const LOAD_DEN: usize = 20;
/// Buckets split per growth step (between pin barriers).
const GROW_BATCH: usize = 64;
/// Buckets a compaction sweep looks at per call (when the index need not grow).
const SWEEP_SCAN: usize = 1024;
/// A writer checks whether the index should grow once per this many stores of its shard.
const GROW_EVERY: u64 = 64;
const PAGE: usize = 4096;
/// Keys longer than this cannot be stored (memcached allows 250).
const MAX_KEY: usize = 255;
/// Attempts of an optimistic read-then-write (append, incr, touch) before giving up.
const RETRIES: usize = 64;

/// Main buckets `maintain` scans per call (each a cache line of 8 slots).
const MAINTAIN_BUCKETS: usize = 1 << 16;
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vis {
    Live,
    Expired,
    Flushed,
}

impl Default for MetaW {
    /// A plain new item: no explicit CAS, not stale, text key, no win mark.
    fn default() -> Self {
        MetaW {
            explicit_cas: None,
            stale: Some(false),
            binary_key: Some(false),
            win: None,
        }
    }
}

/// What the old item was, as seen by a pinned reader.
#[derive(Debug, Clone, Copy)]
struct Peek {
    ident: u64,
    value_len: usize,
    flags: u32,
    exptime: Time,
    /// The CAS clients see.
    cas: u64,
    stale: bool,
}

/// The log-structured storage engine. See the module documentation.
pub struct LogEngine {
    /// What the engine was made with (`-I`, `-M`, `-C`; the memory limit as it was then:
    /// the arena keeps the current one).
    config: EngineConfig,
    seg_size: usize,
    seed: u64,
    index: Index,
    segs: SegTable,
    /// The eviction policy: the FIFOs of sealed segments, the evictor, the miss sketch,
    /// the size factor and the eviction observer (`evict.rs`).
    eviction: Eviction,
    /// no_evict only: compaction's segment and spare (see `compact.rs`).
    compactor: Mutex<compact::Compactor>,
    /// The open segments writers append to: the append shards' and the TTL classes'
    /// (`open.rs`; their locks come first in the lock order).
    open: OpenSegs,
    /// Index growth, one thread at a time, and its pending steps.
    grow_lock: Mutex<Grow>,
    /// Readers' pins, and the barrier reclaiming memory waits on (`sync.rs`).
    pins: Pins,
    /// CAS uniques (see `cas`).
    cas: cas::CasClock,
    /// The memory limit, the segment memory mapped and leased, and the free segments
    /// (`arena.rs`).
    arena: Arena,
    /// Highest `now` seen (eviction's idea of the time).
    clock: AtomicU32,
    /// `flush_all`'s watermarks and pending deadline (`flush.rs`).
    flush: Flush,
    /// Where the background sweep is, and the flush watermarks it last saw (`sweep.rs`).
    sweep: Sweep,
    /// Rewrite stamps (see `rewrite_stamp`), drawn as CAS uniques are.
    stamps: cas::CasClock,
    /// The log's order: segments' sequence numbers, the live and open segments in that
    /// order, the bytes retired (`order.rs`).
    order: LogOrder,
    /// Replication state of this engine (see `repl`).
    repl: repl::ReplFlags,
    /// Live items by size, once the server asks (`tally_sizes`).
    tally: OnceLock<tally::Tally>,
    /// Live items, items stored and event counters, per thread (`stats.rs`).
    stats: Stats,
    /// The flash tier, once attached (`flash.rs`).
    flash: OnceLock<flash::Flash>,
    /// What the last warm restart did with the flash pages it named (`snapshot.rs`).
    restored: Mutex<flash::FlashRestore>,
}

/// A function told of each evicted item and the engine's time, under the eviction's locks:
/// it must be quick and must not call back into the engine.
pub type EvictionObserver = Box<dyn Fn(crate::ScanItem<'_>, Time) + Send + Sync>;

impl std::fmt::Debug for LogEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogEngine")
            .field("seg_size", &self.seg_size)
            .field("max_bytes", &self.arena.limit())
            .field("allocated", &self.arena.allocated())
            .finish_non_exhaustive()
    }
}

impl LogEngine {
    /// An engine bounded by `config.max_bytes` (index included), with the compact index.
    pub fn new(config: EngineConfig) -> LogEngine {
        Self::with_layout(config, IndexLayout::Compact)
    }

    /// An engine bounded by `config.max_bytes` (index included), its index in `layout`.
    pub fn with_layout(config: EngineConfig, layout: IndexLayout) -> LogEngine {
        let max_bytes = config.max_bytes;
        let max_slots = max_bytes
            / match layout {
                IndexLayout::Compact => BYTES_PER_SLOT,
                IndexLayout::Wide => WIDE_BYTES_PER_SLOT,
            };
        let budget = max_bytes.saturating_sub(Index::initial_bytes(max_slots, layout));
        let mut seg_size = MAX_SEG_SIZE;
        while seg_size > MIN_SEG_SIZE && seg_size * 32 > budget {
            seg_size /= 2;
        }
        // Segment ids for twice the limit's segments (large items, a limit raised later).
        let index = Index::new(
            max_slots,
            (max_bytes / seg_size).saturating_mul(2) + 64,
            layout,
        );
        let segs = SegTable::new(index.max_segments().max(index::MAX_SEGMENTS));
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let nshards = (cpus * 2).clamp(2, 16).min((budget / seg_size / 8).max(1));
        LogEngine {
            config: config.clone(),
            seg_size,
            seed: std::collections::hash_map::RandomState::new()
                .hash_one(0x006b_7663_6163_6865_u64),
            index,
            segs,
            eviction: Eviction::new(max_bytes),
            compactor: Mutex::new(compact::Compactor::default()),
            open: OpenSegs::new(nshards, budget / seg_size),
            grow_lock: Mutex::new(Grow::default()),
            pins: Pins::new(),
            cas: cas::CasClock::new(),
            arena: Arena::new(max_bytes),
            clock: AtomicU32::new(0),
            flush: Flush::default(),
            sweep: Sweep::default(),
            stamps: cas::CasClock::new(),
            order: LogOrder::new(),
            repl: repl::ReplFlags::default(),
            tally: OnceLock::new(),
            stats: Stats::new(nshards),
            flash: OnceLock::new(),
            restored: Mutex::default(),
        }
    }

    /// Make eviction favour small items (`factor` > 0, the default
    /// [`DEFAULT_SIZE_FACTOR`]) or not (0). With a factor, an item whose record is up to
    /// `factor` times the mean record is kept by eviction once it was read since it was
    /// written or last kept; one up to twice that needs two reads, a larger one three (the
    /// access counter's most). New items then wait in a small probation queue (10% of the
    /// segments), and a key stored again soon after it was evicted unread counts as read
    /// once (its miss is remembered by a count-min sketch). Without a factor every item
    /// needs one read, the probation queue is 40%, and the sketch is not used: the best
    /// measured for a size-blind policy. A factor trades bytes for items: fewer large items
    /// stay, so more gets hit but a smaller share of the bytes asked for (BENCHMARKS.md).
    pub fn set_size_factor(&self, factor: u32) {
        self.eviction.set_size_factor(factor);
    }

    /// The eviction size factor ([`LogEngine::set_size_factor`]).
    pub fn size_factor(&self) -> u32 {
        self.eviction.size_factor()
    }

    /// Mean bytes of segment memory per live item (free and dead bytes included: eviction
    /// runs when there are few of either).
    fn mean_record(&self) -> usize {
        self.arena.allocated() / self.stats.live_items().max(1)
    }

    /// The slot value `v` of a key stored while absent: with one read counted if the
    /// eviction policy readmits it ([`Eviction::readmits`], which counts this store).
    #[inline]
    fn admit(&self, h: u64, v: u64) -> u64 {
        if self.eviction.readmits(h) {
            self.st().readmitted.fetch_add(1, Ordering::Relaxed);
            index::with_freq(v, 1)
        } else {
            v
        }
    }

    /// Have `f` told of every item evicted from now on (once; a second call is ignored).
    /// Items that expired or were flushed are reclaimed, not evicted, and are not told.
    pub fn observe_evictions(&self, f: EvictionObserver) {
        self.eviction.observe(f);
    }

    /// Segment size chosen for this engine's memory limit.
    pub fn segment_size(&self) -> usize {
        self.seg_size
    }

    /// Bytes of the hash index (counted against the memory limit).
    pub fn index_bytes(&self) -> usize {
        self.index.bytes()
    }

    /// Segment memory plus index: everything the engine holds for items.
    pub fn memory_bytes(&self) -> usize {
        self.arena.allocated() + self.index_bytes()
    }

    /// The item stored under `key` if a get at `now` would return it, without counting
    /// an access or changing anything (for tests and debugging).
    #[doc(hidden)]
    pub fn peek_item(&self, key: &[u8], now: Time) -> Option<(Vec<u8>, u32, Time, u64)> {
        let h = self.hash(key);
        let _pin = self.pin();
        let mut fetch = flash::Fetch::default();
        // SAFETY: pinned while `r` is used.
        let (_, _, r) = unsafe { self.lookup(h, key, &mut fetch) }?;
        (self.vis(&r, now) == Vis::Live)
            .then(|| (r.value.to_vec(), r.flags, r.exptime, self.rec_cas(&r)))
    }

    /// Whether the index still holds a record for `key`, live or not (for tests).
    #[doc(hidden)]
    pub fn holds_record(&self, key: &[u8]) -> bool {
        let h = self.hash(key);
        let _pin = self.pin();
        let mut fetch = flash::Fetch::default();
        // SAFETY: pinned while the record is looked at.
        unsafe { self.lookup(h, key, &mut fetch) }.is_some()
    }

    /// Check the engine's bookkeeping against a full walk of the index: every slot points
    /// at a published record of its key's hash in an allocated segment, per-segment live
    /// counts match the slots, and memory is within the limit.
    #[doc(hidden)]
    pub fn check_accounting(&self) -> Result<(), AccountingError> {
        let _cp = lock(&self.compactor);
        let _ev = self.eviction.evictor();
        let _grow = lock(&self.grow_lock);
        let mut items = std::collections::HashMap::<u32, (u64, u64)>::new();
        for b in 0..self.index.nmain() {
            let _g = self.index.lock_bucket(b);
            let mut err = None;
            self.index.for_each_in_chain(b, |_, v| {
                let mut fetch = flash::Fetch::default();
                // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
                match unsafe { self.rec_any(v, &mut fetch) } {
                    Some(r) if r.kind == KIND_ITEM => {
                        if self.index.tag(self.hash(r.key)) != index::slot_tag(v) {
                            err = Some(format!("slot {v:#x}: tag does not match its key"));
                        }
                        let e = items.entry(index::slot_seg(v)).or_default();
                        e.0 += 1;
                        e.1 += r.len as u64;
                    }
                    _ => err = Some(format!("slot {v:#x} points at no item")),
                }
            });
            if let Some(e) = err {
                return Err(AccountingError(e));
            }
        }
        for id in 0..self.seg_ids() {
            let Some(s) = self.segs.get(id) else { continue };
            let want = items.get(&id).copied().unwrap_or_default();
            let have = (s.live_items(), s.live_bytes());
            if want != have {
                return Err(AccountingError(format!(
                    "segment {id}: slots say {want:?}, counters {have:?}"
                )));
            }
        }
        // The list of live segments log readers use is what the headers say.
        let mut scanned: Vec<(u64, u32)> = (0..self.seg_ids())
            .filter_map(|id| {
                let seq = self.segs.get(id)?.seq();
                (seq != 0).then_some((seq, id))
            })
            .collect();
        scanned.sort_unstable();
        let listed = self.order.live();
        if scanned != listed {
            return Err(AccountingError(format!(
                "live segments: headers say {scanned:?}, the list {listed:?}"
            )));
        }
        if self.arena.allocated() > self.budget().max(self.seg_size * 2) {
            return Err(AccountingError(format!(
                "segment memory {} over budget {}",
                self.arena.allocated(),
                self.budget()
            )));
        }
        Ok(())
    }

    /// The most bytes the index may grow to, of a memory limit of `max`: half, or with a
    /// flash tier seven eighths (its items are mostly on flash, their slots in RAM).
    fn index_cap(&self, max: usize) -> usize {
        if self.flash.get().is_some() {
            max / 8 * 7
        } else {
            max / 2
        }
    }

    /// Bytes segments may use: the limit minus the index and the miss sketch
    /// ([`Arena::budget`]). The index grows with the items (to at most half the limit by
    /// splits; overflow buckets may add a little) and does not shrink; if the limit later
    /// shrinks under it, segments still get a quarter of the new limit (memory then exceeds
    /// the limit by up to the index) rather than nothing.
    fn budget(&self) -> usize {
        self.arena
            .budget(self.index_bytes() + self.eviction.sketch_bytes())
    }

    #[inline]
    fn hash(&self, key: &[u8]) -> u64 {
        key_hash(self.seed, key)
    }

    /// memcached's -I rule: the item as memcached would size it exceeds the limit.
    fn too_large(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        self.config.item_size(key_len, value_len, flags) > self.config.max_item_size
    }

    /// This thread's event counters ([`Stats::mine`]).
    #[inline]
    fn st(&self) -> &stats::Counters {
        self.stats.mine()
    }

    /// A rewrite stamp for a copy of an item whose record has stamp `old` (stamps order
    /// copies of one item that share a CAS). Drawn under the item's stripe lock, above
    /// `old`: the current record is the key's newest, so per key stamps follow the order of
    /// the rewrites. From per-thread ranges, as CAS uniques are (`cas.rs`).
    fn rewrite_stamp(&self, old: u64) -> u64 {
        self.stamps.draw(old.saturating_add(1))
    }

    /// What `me` shows of the live record `r` in `slot` (slot value `v`).
    fn describe(&self, r: &Rec<'_>, v: u64, now: Time) -> crate::DebugItem {
        crate::DebugItem {
            exptime: r.exptime,
            last_access: self.written_at(v, now),
            cas: self.rec_cas(r),
            fetched: index::fetched(v),
            value_len: r.value.len(),
            flags: r.flags,
            binary_key: r.meta & META_BINARY_KEY != 0,
        }
    }

    /// The CAS unique clients see for a record: its explicit one, else its version
    /// (0 with CAS off).
    fn rec_cas(&self, r: &Rec<'_>) -> u64 {
        if self.config.use_cas {
            r.explicit_cas.unwrap_or(r.cas)
        } else {
            0
        }
    }

    /// Advance the clock and turn a passed delayed flush into a watermark.
    #[inline]
    fn tick(&self, now: Time) {
        self.flush.tick(now, || self.cas.reserved());
        if now > self.clock.load(Ordering::Relaxed) {
            self.clock.fetch_max(now, Ordering::Relaxed);
        }
    }

    fn vis(&self, r: &Rec<'_>, now: Time) -> Vis {
        if self.flush.flushed(r.cas, now) {
            return Vis::Flushed;
        }
        if r.exptime != 0 && r.exptime <= now {
            return Vis::Expired;
        }
        Vis::Live
    }

    /// Pin this thread's reader lock (see [`Pins`]).
    #[inline]
    fn pin(&self) -> sync::Pin<'_> {
        self.pins.pin()
    }

    /// [`Pins::try_barrier`].
    fn try_barrier(&self, block: bool) -> bool {
        self.pins.try_barrier(block)
    }

    /// [`Pins::barrier`].
    fn barrier(&self) {
        self.pins.barrier();
    }

    /// The record a slot value points at.
    ///
    /// # Safety
    /// The segment must stay mapped and the record unmodified for `'a`: the caller holds
    /// a pin taken before `v` was loaded, or the bucket stripe lock under which `v` was
    /// loaded from a slot that still holds it, or owns the segment (evictor).
    unsafe fn rec<'a>(&'a self, v: u64) -> Option<Rec<'a>> {
        let seg = self.segs.get(index::slot_seg(v))?;
        let (p, cap) = seg.mapping()?;
        let p = p.as_ptr();
        // SAFETY: per the contract the mapping `p .. p + cap` lives for `'a`; its header
        // was written before any slot pointing into it was published.
        unsafe {
            let base = format::seg_cas_base(p);
            format::read(p, cap, index::slot_off(v), base)
        }
    }

    /// A hint that `keys` are about to be read (a batch of pipelined gets): start loading
    /// their index buckets, then, once those have had the time the other keys' hashing
    /// took to arrive, the first two cache lines of the records their slots point to. The
    /// lookups that follow then find in cache what would have been two misses each, and
    /// the misses of the batch overlap instead of following one another (MICA's batched
    /// prefetch). Only hints: nothing is read through a prefetch, so no pin is needed and
    /// a stale slot costs a wasted load. At most 32 keys are looked at; a lone key is not
    /// (its lookup follows at once: nothing would overlap), so a caller need not count
    /// the keys first.
    pub fn prefetch<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        let mut keys = keys.into_iter();
        let (Some(first), Some(second)) = (keys.next(), keys.next()) else {
            return;
        };
        let mut hashes = [0u64; 32];
        let mut n = 0;
        for (slot, key) in hashes
            .iter_mut()
            .zip([first, second].into_iter().chain(keys))
        {
            *slot = self.hash(key);
            self.index.prefetch(*slot);
            n += 1;
        }
        for &h in &hashes[..n] {
            self.prefetch_record_lines(h);
        }
    }

    /// A hint that `key` is about to be read, a few keys from now: start loading the cache
    /// line of its index bucket's slots (the rest waits for [`LogEngine::prefetch_records`],
    /// so that a batch keeps fewer loads in flight). Returns the key's hash.
    #[inline]
    pub fn prefetch_bucket(&self, key: &[u8]) -> u64 {
        let h = self.hash(key);
        self.index.prefetch(h);
        h
    }

    /// A hint that the key of hash `h` is about to be read: start loading the first two
    /// cache lines of the records its bucket's slots with its tag point to. Reads the
    /// bucket's slots (a miss unless [`LogEngine::prefetch_bucket`] loaded them a while
    /// ago), nothing through the prefetches.
    pub fn prefetch_records(&self, h: u64) {
        self.prefetch_record_lines(h);
    }

    /// Start loading the first two cache lines of the records `h`'s main bucket's slots with
    /// its tag point to.
    fn prefetch_record_lines(&self, h: u64) {
        self.index.tagged_in_main(h, |v| {
            if let Some(seg) = self.segs.get(index::slot_seg(v)) {
                let off = index::slot_off(v);
                if let Some((p, _)) = seg.mapping().filter(|&(_, cap)| off < cap) {
                    let p = p.as_ptr();
                    // Address arithmetic only (a prefetch reads nothing observable):
                    // `off < cap` keeps it inside the mapping.
                    let at = p.wrapping_add(off);
                    index::prefetch(at.cast());
                    index::prefetch(at.wrapping_add(64).cast());
                }
            }
        });
    }

    /// The slot holding `key`'s current record, if any. A record on flash is read into
    /// `fetch` (blocking, `flash.rs`) and returned from there.
    ///
    /// # Safety
    /// The caller holds a pin, or `h`'s bucket stripe lock; the returned record is valid
    /// as long as that protection is held.
    unsafe fn lookup<'a: 'f, 'f>(
        &'a self,
        h: u64,
        key: &[u8],
        fetch: &'f mut flash::Fetch,
    ) -> Option<(Slot<'a>, u64, Rec<'f>)> {
        let mut out = None;
        let mut fetched = None;
        let found = self.index.find(h, |v| {
            // SAFETY: forwarded from the caller: pinned or holding the stripe lock.
            match unsafe { self.rec(v) } {
                Some(r) => {
                    if r.kind == KIND_ITEM && r.key == key {
                        out = Some(r);
                        return true;
                    }
                    false
                }
                // No mapping: on flash, or being reused.
                None => self.flash_match(v, key, &mut fetched),
            }
        });
        let (slot, v) = found?;
        if let Some(r) = out {
            return Some((slot, v, r));
        }
        *fetch = fetched?;
        Some((slot, v, fetch.rec()?))
    }

    /// Whether slot value `v` names a flash record of `key` (read into `fetched`).
    #[cold]
    fn flash_match(&self, v: u64, key: &[u8], fetched: &mut Option<flash::Fetch>) -> bool {
        let Some(f) = self.fetch_record(v) else {
            return false;
        };
        if !f.rec().is_some_and(|r| r.kind == KIND_ITEM && r.key == key) {
            self.note_tag_misread();
            return false;
        }
        *fetched = Some(f);
        true
    }

    /// Record a read of the live item slot `slot` holds as `v`: its access counter and
    /// fetched bit (unless already at their most).
    #[inline]
    fn mark_access(&self, slot: Slot<'_>, v: u64) {
        if index::freq(v) < index::FREQ_MAX || !index::fetched(v) {
            // Losing this race to a writer only loses one access mark.
            let _ = slot.compare_exchange(v, index::bumped(v));
        }
    }

    fn view<'a>(&self, key: &'a [u8], r: &Rec<'a>) -> ItemView<'a> {
        ItemView {
            key,
            value: r.value,
            flags: r.flags,
            exptime: r.exptime,
            cas: self.rec_cas(r),
            site: None,
        }
    }

    /// [`LogEngine::view`] of the record slot value `v` points at, which the caller may
    /// lease ([`ItemView::lease`]): only under the pin taken before `v` was loaded, or
    /// under the key's stripe lock with `v` in its slot (touch and gat, which show the
    /// item they rewrote).
    fn view_leasable<'a>(&'a self, key: &'a [u8], r: &Rec<'a>, v: u64) -> ItemView<'a> {
        ItemView {
            site: Some(lease::LeaseSite {
                engine: self,
                seg: index::slot_seg(v),
            }),
            ..self.view(key, r)
        }
    }

    /// Call `f` with every index slot that holds an item and its value, one chain at a time
    /// under the chain's stripe lock. The bound is read again every step: a split moves
    /// items only to new buckets past every old one, so none is skipped.
    fn for_each_indexed<'a>(&'a self, mut f: impl FnMut(Slot<'a>, u64)) {
        let mut b = 0;
        while b < self.index.nmain() {
            let _g = self.index.lock_bucket(b);
            self.index.for_each_in_chain(b, &mut f);
            b += 1;
        }
    }

    /// memcached's size of the item in record `r` ([`EngineConfig::item_size`]).
    fn rec_size(&self, r: &Rec<'_>) -> usize {
        self.config.item_size(r.key.len(), r.value.len(), r.flags)
    }

    /// memcached's size of the item `spec` writes.
    fn spec_size(&self, spec: &Spec<'_>) -> usize {
        let value = spec.parts[0].len() + spec.parts[1].len();
        self.config.item_size(spec.key.len(), value, spec.flags)
    }

    /// When the record slot value `v` points at was written (the item's last access time
    /// the meta protocol shows, see `written.rs`), at most `now`.
    fn written_at(&self, v: u64, now: Time) -> Time {
        self.segs
            .get(index::slot_seg(v))
            .and_then(|s| s.written_at(index::slot_off(v)))
            .map_or(now, |t| t.min(now))
    }

    /// An expired or flushed item (slot value `v`, `size` bytes as memcached counts it)
    /// left the index: a store replaced it, eviction or compaction met it, or the sweep
    /// (`crawler`) found it. memcached's `reclaimed` and `expired_unfetched`, per class too.
    fn count_reclaimed(&self, v: u64, size: usize, crawler: bool) {
        self.st().reclaimed.fetch_add(1, Ordering::Relaxed);
        if !index::fetched(v) {
            self.st().expired_unfetched.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = self.tally.get() {
            t.reclaimed(size, crawler);
        }
    }

    /// An item of `size` bytes (memcached's) was evicted.
    fn tally_evicted(&self, size: usize) {
        if let Some(t) = self.tally.get() {
            t.evicted(size);
        }
    }

    /// The index gained an item: `len` bytes of record in segment `id`, `size` bytes as
    /// memcached counts it, expiring at `exptime` (0: never).
    fn account_add(&self, id: u32, len: usize, size: usize, exptime: Time) {
        if let Some(t) = self.tally.get() {
            t.count(size, 1);
        }
        self.stats.add_live(1);
        if let Some(seg) = self.segs.get(id) {
            seg.add_live(1, len as u64);
            seg.note_expiry(exptime);
        }
    }

    /// The index lost the item `v` (`len` bytes of record, `size` as memcached counts it).
    fn account_remove(&self, v: u64, len: usize, size: usize) {
        if let Some(t) = self.tally.get() {
            t.count(size, -1);
        }
        self.stats.add_live(-1);
        if let Some(seg) = self.segs.get(index::slot_seg(v)) {
            // Release: whoever sees the count reach 0 (acquire) and then reuses the
            // segment also sees the slot change that preceded this decrement.
            seg.remove_live(len as u64);
        }
    }

    /// An item left the cache because its index chain had no slot for it.
    fn count_index_eviction(&self) {
        let st = self.st();
        st.evictions.fetch_add(1, Ordering::Relaxed);
        st.evicted_index.fetch_add(1, Ordering::Relaxed);
    }

    fn count_dead(&self, vis: Vis) {
        match vis {
            Vis::Expired => self.st().get_expired.fetch_add(1, Ordering::Relaxed),
            Vis::Flushed => self.st().get_flushed.fetch_add(1, Ordering::Relaxed),
            Vis::Live => 0,
        };
    }

    /// Unlink the slot still holding `v` (same identity), for a dead item found by a
    /// reader. May be called while pinned.
    fn unlink_dead(&self, h: u64, v: u64) {
        let _g = self.index.lock(h);
        let found = self.index.find(h, |x| x & IDENT_MASK == v & IDENT_MASK);
        if let Some((slot, cur)) = found {
            let mut fetch = flash::Fetch::default();
            // SAFETY: we hold the stripe lock and `cur` is still in its slot.
            let (len, size) = unsafe { self.rec_any(cur, &mut fetch) }.map_or((0, 0), |r| {
                self.note_removed(&r, cur);
                (r.len, self.rec_size(&r))
            });
            slot.store(0);
            self.account_remove(cur, len, size);
        }
    }

    /// Look `key` up under a pin: its location and value length if live. A dead item is
    /// unlinked and counted, as memcached's lookups do.
    fn peek(&self, h: u64, key: &[u8], now: Time) -> Option<Peek> {
        let dead = {
            let _pin = self.pin();
            let mut fetch = flash::Fetch::default();
            // SAFETY: pinned.
            let (_, v, r) = unsafe { self.lookup(h, key, &mut fetch) }?;
            match self.vis(&r, now) {
                Vis::Live => {
                    return Some(Peek {
                        ident: v & IDENT_MASK,
                        value_len: r.value.len(),
                        flags: r.flags,
                        exptime: r.exptime,
                        cas: self.rec_cas(&r),
                        stale: r.meta & META_STALE != 0,
                    })
                }
                vis => (v, vis),
            }
        };
        self.count_dead(dead.1);
        self.unlink_dead(h, dead.0);
        None
    }
}

impl Drop for LogEngine {
    fn drop(&mut self) {
        let mut p = self.arena.pool();
        for id in 0..p.ids_used() {
            self.release(&mut p, id);
        }
    }
}

/// The index's key hash: a seeded multiply-fold (each 8-byte word folded into the state by a
/// 64×64→128-bit multiply whose halves are xored), finished by one more fold that mixes the
/// high bits into the low ones. The index takes its bucket from the low bits and its tag from
/// the top 16.
///
/// Written by hand rather than taken from a crate because it sits on every request's path and
/// must inline into the lookup. It resists flooding because `seed` is drawn at random per
/// engine (from the standard library's `RandomState`) and never leaves the process: keys a
/// client chooses without knowing it spread over the buckets as random keys do. The test
/// `adversarial_keys_spread_over_the_buckets` (in `tests.rs`) holds it to that for families
/// of keys a client could choose: sequential, sharing long prefixes, of equal lengths, and
/// differing only in single bytes or in the high bits of one word.
#[inline]
fn key_hash(seed: u64, key: &[u8]) -> u64 {
    const K0: u64 = 0x9e37_79b9_7f4a_7c15;
    const K1: u64 = 0xd6e8_feb8_6659_fd93;
    #[inline]
    fn mix(a: u64, b: u64) -> u64 {
        let r = u128::from(a) * u128::from(b);
        (r as u64) ^ ((r >> 64) as u64)
    }
    let mut h = seed ^ (key.len() as u64).wrapping_mul(K0);
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = mix(h ^ u64::from_le_bytes(w), K1);
    }
    h = mix(h ^ tail_word(chunks.remainder()), K0);
    mix(h, K1 ^ h.rotate_left(29))
}

/// `rem` (under 8 bytes) as a little-endian word padded with zeros, read with at most two
/// loads. (Copying it into a zeroed `[u8; 8]` compiled to a call to `memcpy` whose byte
/// stores the word's load then waited for: a fifth of `Conn::execute`'s own samples at 16
/// GETs in flight.)
#[inline]
fn tail_word(rem: &[u8]) -> u64 {
    let n = rem.len();
    if let (Some(lo), Some(hi)) = (rem.first_chunk::<4>(), rem.last_chunk::<4>()) {
        // 4 to 7 bytes: the first four and the last four (they overlap; both put the same
        // byte in the same place).
        u64::from(u32::from_le_bytes(*lo)) | u64::from(u32::from_le_bytes(*hi)) << (8 * (n - 4))
    } else if let (Some(&a), Some(&b), Some(&c)) = (rem.first(), rem.get(n / 2), rem.last()) {
        // 1 to 3 bytes: the first, the middle and the last.
        u64::from(a) | u64::from(b) << (8 * (n / 2)) | u64::from(c) << (8 * (n - 1))
    } else {
        0
    }
}

/// What [`LogEngine::check_accounting`] found wrong with the engine's bookkeeping.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AccountingError(String);
