//! The log-structured engine ([`LogEngine`]): items appended to fixed-size segments, a
//! lock-free-read hash index of tagged slots, and eviction of whole segments from two
//! FIFOs (a probation queue for new items, a main queue with CLOCK second chances).
//!
//! # Layout
//!
//! * **Segments** (`seg_size`, 1 MiB unless `-m` is small) are anonymous mappings. Records
//!   (see `FORMAT.md`) are appended back to back with a 2-byte fixed header and varints;
//!   the CAS unique is stored as a zigzag varint relative to the segment's CAS base, so a
//!   15-byte key with a 32-byte value costs 4-5 header bytes. Items larger than a segment
//!   get a segment of their own (a "large" segment: one record, mapped to size).
//! * **Index**: buckets of eight `AtomicU64` slots, one cache line each (see [`index`]).
//!   A slot names segment + offset and holds a 16-bit tag, the CLOCK access bits and the
//!   meta protocol's "win token sent" bit; a parallel table keeps each slot's last access
//!   time (16 bits).
//! * **Append shards**: each thread appends to the open segment of its shard (threads
//!   are spread over shards round-robin), so writers of different shards never share an
//!   append lock.
//! * **Two FIFOs** of sealed segments (S3-FIFO, by whole segments): segments of new
//!   writes join the small (probation) queue, segments of second-chance copies the main
//!   queue. The small queue's oldest segment is evicted while the small queue holds more
//!   than `SMALL_PERCENT` (40%) of the sealed segments, else the main queue's. Either way an
//!   item whose slot says it was read since it was written (or last copied) is copied
//!   forward into the main queue, its counter decremented; the rest is dropped (expired,
//!   flushed, overwritten or deleted records just are not referenced). So an item nobody
//!   reads leaves after a trip through the small queue, not the whole cache. (A ghost
//!   queue, S3-FIFO's third part, measured worse here and is left out.)
//!
//! # Concurrency
//!
//! Locks, in the only order they are ever taken: shard → bucket stripe → evictor →
//! pool / FIFO (shard locks of other threads are only ever `try_lock`ed). Readers take none of them: a reader holds a *pin* (the read side of one
//! of `NPINS` reader-writer locks, picked by thread) while it loads slots and reads
//! records. Memory is reused only after eviction has (1) unlinked every slot into the
//! segment, each under its bucket stripe lock, and then (2) taken and released the write
//! side of every pin lock. A reader that loaded a slot into the segment did so under a
//! pin taken before (1) finished, so (2) waits for it; a reader that pins after (2)
//! passed its lock synchronizes with the release and sees the unlinked slot. Records are
//! never modified once published, and a segment is never written below its append
//! offset, so the `&[u8]` a reader hands to its callback cannot change under it.
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
//! CAS (`E`) live in the record (`FORMAT.md`, "Meta-protocol state"); the win mark, the
//! fetched bit and the last access time live next to the index slot because readers change
//! them. The win mark changes only by compare-exchange on the slot: a reader that wins
//! sets it in the exchange that also records its access, so exactly one of concurrent
//! readers wins; `mg ... T` and `mg ... N` set it in the exchange that installs the
//! rewritten or created item; writers that keep it (touch, in-place incr/decr, stale
//! `ms ... I`, second-chance copies) carry it over with a compare-exchange loop under the
//! stripe lock instead of storing a value loaded earlier. Conditions on CAS (`C`) are
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
//! An immediate `flush_all` records a CAS watermark (every item with a smaller CAS is
//! dead, for good). A delayed one records its deadline `at - 1`; while the clock is at the
//! deadline every item is dead, and the first operation after it turns the deadline into
//! a second watermark, which a later delayed flush replaces (memcached keeps a single
//! `oldest_live`, so items not yet removed come back until the new deadline; the model
//! does the same). With a non-decreasing clock this is exactly "stored or accessed at or
//! before `at - 1`": an item stored before the deadline cannot be accessed after it.
//!
//! # Memory
//!
//! `-m` covers the index and the segments. The index is sized to the items, not to `-m`:
//! it starts at a few thousand buckets and grows by linear hashing (see [`index`]) while
//! the items exceed its main slots (load 1.0: a fifth of the items sit in overflow buckets), one batch of splits at a time by whichever
//! writer notices (the pin barriers a batch needs are tried, not waited for,
//! and a batch whose barrier is held up finishes on a later call; `maintain` waits). A
//! slot costs 10 bytes (8, plus 2 for the item's last access time, which the meta
//! protocol shows), about 15 bytes per item with overflow buckets. Growth stops at half
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
//! * `touch`/`gat` rewrite the item (same CAS, new expiry) at the log head; with
//!   `no_evict` and full memory they cannot, and report a miss.
//! * Delete appends a tombstone; with `no_evict` and full memory the delete happens
//!   without one (a log reader would miss it). Flushes are not logged.
//! * Flushes travel to replicas as watermarks in every batch, not as log records (see
//!   `repl.rs`); warm restart (`dump`/`restore`) writes the live items, not the log.
//! * The index never shrinks, and its largest size is fixed by the starting `-m` (one main
//!   slot per 32 bytes): raising the limit later (`cache_memlimit`) adds segments only.
//! * A reader that records an access (or a last-access time) on a slot while a split or
//!   compaction moves it may lose that access mark; win marks are never lost.
//! * Meta: `mg ... T` and `md ... I` rewrite the item like touch does (no room with
//!   `no_evict` and full memory: a miss, `NS`). The last access time is kept in 16 bits:
//!   `l`/`la` are exact for items accessed within the last 18 hours, the age modulo
//!   65536 s beyond. A reader that races with a writer of the same slot may record its
//!   access time on the new item (the same `now`, or one second off).

mod format;
mod index;
mod mem;
pub mod repl;
use crate::number;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard};

use crate::{
    DebugItem, Engine, EngineConfig, EngineStats, ItemView, MetaArith, MetaArithResult, MetaDelete,
    MetaDeleteResult, MetaGet, MetaItem, MetaRead, MetaStoreRequest, MetaStored, ReadOptions,
    StoreMode, StoreResult, Time, Win,
};
use format::{Rec, Spec, HDR_MAX, KIND_ITEM, KIND_TOMBSTONE, META_BINARY_KEY, META_STALE, SEG_HDR};
use index::{Index, Insert, IDENT_MASK};
use repl::EvictionNotes;

/// Largest segment (offsets must fit the slot's offset field).
const MAX_SEG_SIZE: usize = 1 << 20;
const MIN_SEG_SIZE: usize = 4 << 10;
const _: () = assert!(MAX_SEG_SIZE <= index::MAX_OFFSET);
/// Reader pin locks (threads share them round-robin beyond this).
const NPINS: usize = 64;
/// The index may grow to one main slot per this many bytes of `-m` (it is sized to the
/// items it holds; beyond this many items it becomes lossy).
const BYTES_PER_SLOT: usize = 32;
/// The index grows while its items exceed this fraction of its main slots
/// (`LOAD_NUM / LOAD_DEN`). 1.0 measured 0.5 bytes per small item less than 0.9 (fewer,
/// fuller buckets; about a fifth of the items in overflow buckets) at no throughput cost
/// on `log_perf`.
const LOAD_NUM: usize = 20;
const LOAD_DEN: usize = 20;
/// Buckets split per growth step (between pin barriers).
const GROW_BATCH: usize = 64;
/// The small (probation) FIFO is evicted first while it holds more than this percentage of
/// the sealed segments.
const SMALL_PERCENT: usize = 40;
/// Buckets a compaction sweep looks at per call (when the index need not grow).
const SWEEP_SCAN: usize = 1024;
/// A writer checks whether the index should grow once per this many stores of its shard.
const GROW_EVERY: u64 = 64;
const PAGE: usize = 4096;
/// Keys longer than this cannot be stored (memcached allows 250).
const MAX_KEY: usize = 255;
/// Segment headers are allocated in chunks of this many.
const CHUNK: usize = 1024;
/// Attempts of an optimistic read-then-write (append, incr, touch) before giving up.
const RETRIES: usize = 64;
/// Main buckets `maintain` scans per call (each a cache line of 8 slots).
const MAINTAIN_BUCKETS: usize = 1 << 16;

#[derive(Default)]
#[repr(align(64))]
struct Padded<T>(T);

#[derive(Default)]
struct SegMem {
    /// The mapping, or null when the segment id has no memory.
    ptr: AtomicPtr<u8>,
    cap: AtomicUsize,
    /// Bytes appended so far (published length, release-stored after each append).
    used: AtomicUsize,
    large: AtomicBool,
    /// The segment's sequence number while it is live (open or sealed, holding records a
    /// log reader may ship), 0 otherwise. Set after the header is written; cleared when
    /// the segment leaves the FIFO to be freed, before the pin barrier that precedes its
    /// reuse (so a pinned reader that still sees the number may read the segment).
    seq: AtomicU64,
    /// Sealed: `used` is final (release-stored before this flag).
    sealed: AtomicBool,
}

#[derive(Default)]
struct SegAcct {
    live_items: AtomicU64,
    live_bytes: AtomicU64,
}

#[derive(Default)]
struct Seg {
    mem: Padded<SegMem>,
    acct: Padded<SegAcct>,
}

/// Segment headers by id, allocated a chunk at a time and never moved or freed while the
/// engine lives.
struct SegTable {
    chunks: Box<[OnceLock<Box<[Seg]>>]>,
}

impl SegTable {
    fn new() -> SegTable {
        SegTable {
            chunks: (0..index::MAX_SEGMENTS / CHUNK)
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    fn get(&self, id: u32) -> Option<&Seg> {
        let id = id as usize;
        self.chunks.get(id / CHUNK)?.get()?.get(id % CHUNK)
    }

    fn get_or_create(&self, id: u32) -> Option<&Seg> {
        let id = id as usize;
        self.chunks
            .get(id / CHUNK)?
            .get_or_init(|| (0..CHUNK).map(|_| Seg::default()).collect())
            .get(id % CHUNK)
    }
}

/// A segment being appended to, owned by a shard or by the evictor.
#[derive(Debug, Clone, Copy)]
struct Open {
    id: u32,
    cap: usize,
    used: usize,
    base: u64,
}

#[derive(Default)]
struct Pool {
    /// Regular segments with memory, empty, ready to open.
    free: Vec<u32>,
    /// Ids without memory.
    ids: Vec<u32>,
    next_id: u32,
}

#[derive(Default)]
struct Evictor {
    /// Where second-chance items are copied.
    dest: Option<Open>,
    /// A free segment kept for the next `dest`: when eviction runs the free list is empty,
    /// and the segment being cleaned is not free until it is done.
    spare: Option<u32>,
}

#[derive(Default)]
struct Counters {
    evictions: AtomicU64,
    evicted_index: AtomicU64,
    reclaimed: AtomicU64,
    expired_unfetched: AtomicU64,
    evicted_unfetched: AtomicU64,
    evicted_nonzero: AtomicU64,
    get_expired: AtomicU64,
    get_flushed: AtomicU64,
    copied_forward: AtomicU64,
    segments_evicted: AtomicU64,
    tombstones: AtomicU64,
    index_splits: AtomicU64,
}

/// Where index growth stands (see [`LogEngine::grow`]).
#[derive(Default)]
struct Grow {
    step: GrowStep,
    /// Buckets split in the current batch.
    buckets: Vec<usize>,
    /// Overflow buckets unlinked, waiting for a barrier before reuse.
    spare: Vec<u32>,
    /// Where the next sweep for chains to compact starts.
    cursor: usize,
    /// The pending steps finish a batch of splits (not a compaction sweep).
    expanding: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum GrowStep {
    /// No batch under way.
    #[default]
    Idle,
    /// Split; a barrier is due before compaction.
    Split,
    /// Compacted (items moved); a barrier is due before unlinking.
    Compacted,
    /// Unlinked (`spare`); a barrier is due before reuse.
    Released,
}

/// Which FIFO a sealed segment joins.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    /// Segments of new writes: a probation queue (S3-FIFO's small queue).
    Small,
    /// Segments of second-chance copies: items read while on probation or since.
    Main,
}

/// The sealed segments in two FIFOs, oldest first (S3-FIFO, by segment): new items wait
/// in `small`, which is evicted first while it holds more than `SMALL_PERCENT` of the
/// sealed segments, so an item nobody reads leaves after a short probation instead of a
/// trip through the whole cache; items read meanwhile are copied into `main`, evicted
/// with CLOCK second chances.
#[derive(Default)]
struct Fifo {
    small: VecDeque<u32>,
    main: VecDeque<u32>,
}

impl Fifo {
    fn push(&mut self, id: u32, queue: Queue) {
        match queue {
            Queue::Small => self.small.push_back(id),
            Queue::Main => self.main.push_back(id),
        }
    }

    /// The next segment to evict.
    fn pop(&mut self) -> Option<u32> {
        let total = self.small.len() + self.main.len();
        if self.small.len() * 100 > total * SMALL_PERCENT || self.main.is_empty() {
            self.small.pop_front().or_else(|| self.main.pop_front())
        } else {
            self.main.pop_front()
        }
    }

    fn len(&self) -> usize {
        self.small.len() + self.main.len()
    }

    fn remove_first(&mut self, mut f: impl FnMut(u32) -> bool) -> Option<u32> {
        for q in [&mut self.small, &mut self.main] {
            if let Some(i) = q.iter().position(|&id| f(id)) {
                return q.remove(i);
            }
        }
        None
    }

    fn retain(&mut self, mut f: impl FnMut(u32) -> bool) {
        self.small.retain(|&id| f(id));
        self.main.retain(|&id| f(id));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vis {
    Live,
    Expired,
    Flushed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cond {
    Any,
    Absent,
    Present,
    Cas(u64),
    /// `ms ... I`: like `Cas`, but a non-zero CAS lower than the item's also stores, and
    /// then the new item is stale and keeps the old expiry and win mark.
    CasStale(u64),
    /// The live item must still be at this location (slot identity bits).
    Loc(u64),
    /// A replicated record (replica): stores with this version (CAS, rewrite stamp) if
    /// the key's current record, live or not, has a lower one.
    Newer(u64, u64),
}

#[derive(Debug, Clone, Copy)]
enum Src<'a> {
    Bytes(&'a [u8]),
    OldThen(&'a [u8]),
    ThenOld(&'a [u8]),
    Old,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fail {
    Present,
    Absent,
    CasMismatch,
    Moved,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Stored(u64),
    Failed(Fail),
    NoMemory,
    TooLarge,
}

/// One write: what to check and what to append.
#[derive(Clone, Copy)]
struct Commit<'a> {
    key: &'a [u8],
    h: u64,
    cond: Cond,
    src: Src<'a>,
    /// Length of the old value where `src` uses it (as read before locking; `Loc`
    /// guarantees it is unchanged).
    old_len: usize,
    /// None: keep the old item's.
    flags: Option<u32>,
    exptime: Option<Time>,
    /// Keep the old item's CAS (touch) instead of drawing a new one.
    keep_cas: bool,
    /// Keep the old slot's access bits (the same item rewritten), and with `access` count
    /// this write as an access too.
    keep_access: bool,
    access: bool,
    meta: MetaW,
}

/// The meta-protocol state a write gives the new item.
#[derive(Debug, Clone, Copy)]
struct MetaW {
    /// The CAS clients see (`E`), when not the drawn version; ignored with `keep_cas`
    /// (the old item's is kept) and when CAS is off.
    explicit_cas: Option<u64>,
    /// The stale mark; None keeps the old item's.
    stale: Option<bool>,
    /// The binary-key mark; None keeps the old item's.
    binary_key: Option<bool>,
    /// Set or clear the win mark; None keeps the old slot's with `keep_access`, else
    /// clears it.
    win: Option<bool>,
    /// Keep the old item's last access time (the write is not an access).
    keep_atime: bool,
}

impl Default for MetaW {
    /// A plain new item: no explicit CAS, not stale, text key, no win mark.
    fn default() -> Self {
        MetaW {
            explicit_cas: None,
            stale: Some(false),
            binary_key: Some(false),
            win: None,
            keep_atime: false,
        }
    }
}

/// The callback of a write that shows its result (gat, mg with T, mg with N): the slot and
/// the value it held before (when the write replaced a live item in place) and the new
/// record, all under the key's stripe lock.
type ShowFn<'s> = &'s mut dyn FnMut(Option<(&AtomicU64, u64)>, &Rec<'_>);

/// A stripe lock still held after a write, with the slot value written.
struct Held<'a> {
    _g: MutexGuard<'a, ()>,
    /// The slot and its value before the write, when a live item was replaced.
    prev: Option<(&'a AtomicU64, u64)>,
    v: u64,
}

/// One attempt of a meta read.
enum Step {
    Done(MetaGet),
    /// Lost a race with a writer or another reader: look again.
    Retry,
    /// No live item.
    Missing,
}

/// Where a record goes: an open segment at `off`.
struct Dest {
    id: u32,
    ptr: NonNull<u8>,
    off: usize,
    base: u64,
    /// Bytes writable from `off`.
    room: usize,
}

/// What the old item was, as seen by a pinned reader.
#[derive(Debug, Clone, Copy)]
struct Peek<'a> {
    slot: &'a AtomicU64,
    ident: u64,
    value_len: usize,
    flags: u32,
    exptime: Time,
    /// The CAS clients see.
    cas: u64,
    stale: bool,
}

static NEXT_TID: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static TID: usize = NEXT_TID.fetch_add(1, Ordering::Relaxed);
}

fn tid() -> usize {
    TID.try_with(|t| *t).unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The log-structured storage engine. See the module documentation.
pub struct LogEngine {
    max_item_size: usize,
    /// For [`EngineConfig::item_size`] (the -I rule).
    config: EngineConfig,
    no_evict: bool,
    use_cas: bool,
    seg_size: usize,
    seed: u64,
    index: Index,
    segs: SegTable,
    pool: Mutex<Pool>,
    fifo: Mutex<Fifo>,
    evictor: Mutex<Evictor>,
    shards: Box<[Padded<Mutex<Option<Open>>>]>,
    shard_items: Box<[Padded<AtomicU64>]>,
    /// Items the index points at, summed over cells (a cell may go negative).
    live: Box<[Padded<AtomicI64>]>,
    /// Index growth, one thread at a time, and its pending steps.
    grow_lock: Mutex<Grow>,
    pins: Box<[Padded<RwLock<()>>]>,
    next_cas: AtomicU64,
    seg_seq: AtomicU64,
    max_bytes: AtomicUsize,
    /// Bytes of segment memory mapped.
    allocated: AtomicUsize,
    /// Highest `now` seen (eviction's idea of the time).
    clock: AtomicU32,
    flush_deadline: AtomicU32,
    /// Items with a smaller CAS were flushed by an immediate flush (for good).
    flush_mark: AtomicU64,
    /// Items with a smaller CAS were flushed by the last delayed flush once it passed;
    /// a newer delayed flush replaces it (memcached keeps one `oldest_live`).
    delayed_mark: AtomicU64,
    /// Serializes flush_all and the turning of a passed deadline into `delayed_mark`.
    flush_lock: Mutex<()>,
    maint_cursor: AtomicUsize,
    rewrites: AtomicU64,
    /// Held while a segment sequence number is drawn and published (see `open_segment`).
    seq_lock: Mutex<()>,
    /// Log bytes of segments retired so far (for the replication offset).
    retired_bytes: AtomicU64,
    /// Replication state of this engine (see `repl`).
    repl: repl::ReplFlags,
    st: Padded<Counters>,
}

impl std::fmt::Debug for LogEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogEngine")
            .field("seg_size", &self.seg_size)
            .field("max_bytes", &self.max_bytes.load(Ordering::Relaxed))
            .field("allocated", &self.allocated.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl LogEngine {
    /// An engine bounded by `config.max_bytes` (index included).
    pub fn new(config: EngineConfig) -> LogEngine {
        let max_bytes = config.max_bytes;
        let index = Index::new(max_bytes / BYTES_PER_SLOT);
        let budget = max_bytes.saturating_sub(index.bytes());
        let mut seg_size = MAX_SEG_SIZE;
        while seg_size > MIN_SEG_SIZE && seg_size * 32 > budget {
            seg_size /= 2;
        }
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let nshards = (cpus * 2).clamp(2, 16).min((budget / seg_size / 8).max(1));
        LogEngine {
            max_item_size: config.max_item_size,
            config: config.clone(),
            no_evict: config.no_evict,
            use_cas: config.use_cas,
            seg_size,
            seed: std::collections::hash_map::RandomState::new()
                .hash_one(0x006b_7663_6163_6865_u64),
            index,
            segs: SegTable::new(),
            pool: Mutex::new(Pool::default()),
            fifo: Mutex::new(Fifo::default()),
            evictor: Mutex::new(Evictor::default()),
            shards: (0..nshards).map(|_| Padded::default()).collect(),
            shard_items: (0..nshards).map(|_| Padded::default()).collect(),
            live: (0..nshards).map(|_| Padded::default()).collect(),
            grow_lock: Mutex::new(Grow::default()),
            pins: (0..NPINS).map(|_| Padded::default()).collect(),
            next_cas: AtomicU64::new(1),
            seg_seq: AtomicU64::new(1),
            max_bytes: AtomicUsize::new(max_bytes),
            allocated: AtomicUsize::new(0),
            clock: AtomicU32::new(0),
            flush_deadline: AtomicU32::new(0),
            flush_mark: AtomicU64::new(0),
            delayed_mark: AtomicU64::new(0),
            flush_lock: Mutex::new(()),
            maint_cursor: AtomicUsize::new(0),
            rewrites: AtomicU64::new(0),
            seq_lock: Mutex::new(()),
            retired_bytes: AtomicU64::new(0),
            repl: repl::ReplFlags::default(),
            st: Padded::default(),
        }
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
        self.allocated.load(Ordering::Relaxed) + self.index_bytes()
    }

    /// The item stored under `key` if a get at `now` would return it, without counting
    /// an access or changing anything (for tests and debugging).
    #[doc(hidden)]
    pub fn peek_item(&self, key: &[u8], now: Time) -> Option<(Vec<u8>, u32, Time, u64)> {
        let h = self.hash(key);
        let _pin = self.pin();
        // SAFETY: pinned while `r` is used.
        let (_, _, r) = unsafe { self.lookup(h, key) }?;
        (self.vis(&r, now) == Vis::Live)
            .then(|| (r.value.to_vec(), r.flags, r.exptime, self.rec_cas(&r)))
    }

    /// Whether the index still holds a record for `key`, live or not (for tests).
    #[doc(hidden)]
    pub fn holds_record(&self, key: &[u8]) -> bool {
        let h = self.hash(key);
        let _pin = self.pin();
        // SAFETY: pinned while the record is looked at.
        unsafe { self.lookup(h, key) }.is_some()
    }

    /// Check the engine's bookkeeping against a full walk of the index: every slot points
    /// at a published record of its key's hash in an allocated segment, per-segment live
    /// counts match the slots, and memory is within the limit.
    #[doc(hidden)]
    pub fn check_accounting(&self) -> Result<(), String> {
        let _ev = lock(&self.evictor);
        let _grow = lock(&self.grow_lock);
        let mut items = std::collections::HashMap::<u32, (u64, u64)>::new();
        for b in 0..self.index.nmain() {
            let _g = self.index.lock_bucket(b);
            let mut err = None;
            self.index.for_each_in_chain(b, |_, v| {
                // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
                match unsafe { self.rec(v) } {
                    Some(r) if r.kind == KIND_ITEM => {
                        if index::tag_of(self.hash(r.key)) != index::slot_tag(v) {
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
                return Err(e);
            }
        }
        for id in 0..self.seg_ids() {
            let Some(s) = self.segs.get(id) else { continue };
            let want = items.get(&id).copied().unwrap_or_default();
            let have = (
                s.acct.0.live_items.load(Ordering::Relaxed),
                s.acct.0.live_bytes.load(Ordering::Relaxed),
            );
            if want != have {
                return Err(format!(
                    "segment {id}: slots say {want:?}, counters {have:?}"
                ));
            }
        }
        if self.allocated.load(Ordering::Relaxed) > self.budget().max(self.seg_size * 2) {
            return Err(format!(
                "segment memory {} over budget {}",
                self.allocated.load(Ordering::Relaxed),
                self.budget()
            ));
        }
        Ok(())
    }

    /// Bytes segments may use: the limit minus the index. The index grows with the items
    /// (to at most half the limit by splits; overflow buckets may add a little) and does
    /// not shrink; if the limit later shrinks under it, segments still get a quarter of
    /// the new limit (memory then exceeds the limit by up to the index) rather than
    /// nothing.
    fn budget(&self) -> usize {
        let max = self.max_bytes.load(Ordering::Relaxed);
        max.saturating_sub(self.index_bytes()).max(max / 4)
    }

    #[inline]
    fn hash(&self, key: &[u8]) -> u64 {
        const K0: u64 = 0x9e37_79b9_7f4a_7c15;
        const K1: u64 = 0xd6e8_feb8_6659_fd93;
        #[inline]
        fn mix(a: u64, b: u64) -> u64 {
            let r = u128::from(a) * u128::from(b);
            (r as u64) ^ ((r >> 64) as u64)
        }
        let mut h = self.seed ^ (key.len() as u64).wrapping_mul(K0);
        let mut chunks = key.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = mix(h ^ u64::from_le_bytes(w), K1);
        }
        let rem = chunks.remainder();
        let mut w = [0u8; 8];
        w[..rem.len()].copy_from_slice(rem);
        h = mix(h ^ u64::from_le_bytes(w), K0);
        mix(h, K1 ^ h.rotate_left(29))
    }

    /// memcached's -I rule: the item as memcached would size it exceeds the limit.
    fn too_large(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        self.config.item_size(key_len, value_len, flags) > self.max_item_size
    }

    /// The next rewrite stamp (orders copies of one item that share a CAS). Drawn under
    /// the item's stripe lock, so per key it follows the order of the rewrites.
    fn rewrite_stamp(&self) -> u64 {
        self.rewrites.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The CAS unique clients see for a record: its explicit one, else its version
    /// (0 with CAS off).
    fn rec_cas(&self, r: &Rec<'_>) -> u64 {
        if self.use_cas {
            r.explicit_cas.unwrap_or(r.cas)
        } else {
            0
        }
    }

    /// Advance the clock and turn a passed delayed flush into a watermark.
    #[inline]
    fn tick(&self, now: Time) {
        let d = self.flush_deadline.load(Ordering::Acquire);
        if d != 0 && now > d {
            let _f = lock(&self.flush_lock);
            if self.flush_deadline.load(Ordering::Acquire) == d {
                // Every item stored so far was stored or accessed at or before `d`.
                self.delayed_mark
                    .store(self.next_cas.load(Ordering::SeqCst), Ordering::SeqCst);
                self.flush_deadline.store(0, Ordering::Release);
            }
        }
        if now > self.clock.load(Ordering::Relaxed) {
            self.clock.fetch_max(now, Ordering::Relaxed);
        }
    }

    fn vis(&self, r: &Rec<'_>, now: Time) -> Vis {
        if r.cas < self.flush_mark.load(Ordering::Acquire)
            || r.cas < self.delayed_mark.load(Ordering::Acquire)
        {
            return Vis::Flushed;
        }
        let d = self.flush_deadline.load(Ordering::Acquire);
        if d != 0 && now >= d {
            return Vis::Flushed;
        }
        if r.exptime != 0 && r.exptime <= now {
            return Vis::Expired;
        }
        Vis::Live
    }

    fn pin(&self) -> RwLockReadGuard<'_, ()> {
        let p = &self.pins[tid() % NPINS].0;
        p.read().unwrap_or_else(|e| e.into_inner())
    }

    /// [`LogEngine::barrier`], or (unless `block`) false at once if a reader still holds
    /// a pin lock (the caller tries again later: every lock taken once still counts).
    fn try_barrier(&self, block: bool) -> bool {
        if block {
            self.barrier();
            return true;
        }
        for p in self.pins.iter() {
            match p.0.try_write() {
                Ok(g) => drop(g),
                Err(std::sync::TryLockError::Poisoned(e)) => drop(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => return false,
            }
        }
        true
    }

    /// Wait until every reader that pinned before this call has unpinned.
    fn barrier(&self) {
        for p in self.pins.iter() {
            drop(p.0.write().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// The record a slot value points at.
    ///
    /// # Safety
    /// The segment must stay mapped and the record unmodified for `'a`: the caller holds
    /// a pin taken before `v` was loaded, or the bucket stripe lock under which `v` was
    /// loaded from a slot that still holds it, or owns the segment (evictor).
    unsafe fn rec<'a>(&'a self, v: u64) -> Option<Rec<'a>> {
        let seg = self.segs.get(index::slot_seg(v))?;
        let p = seg.mem.0.ptr.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        let cap = seg.mem.0.cap.load(Ordering::Relaxed);
        // SAFETY: per the contract the mapping `p .. p + cap` lives for `'a`; its header
        // was written before any slot pointing into it was published.
        unsafe {
            let base = format::seg_cas_base(p);
            format::read(p, cap, index::slot_off(v), base)
        }
    }

    /// The slot holding `key`'s current record, if any.
    ///
    /// # Safety
    /// The caller holds a pin, or `h`'s bucket stripe lock; the returned record is valid
    /// as long as that protection is held.
    unsafe fn lookup<'a>(&'a self, h: u64, key: &[u8]) -> Option<(&'a AtomicU64, u64, Rec<'a>)> {
        let mut out = None;
        let found = self.index.find(h, |v| {
            // SAFETY: forwarded from the caller: pinned or holding the stripe lock.
            match unsafe { self.rec(v) } {
                Some(r) if r.kind == KIND_ITEM && r.key == key => {
                    out = Some(r);
                    true
                }
                _ => false,
            }
        });
        let (slot, v) = found?;
        Some((slot, v, out?))
    }

    fn view<'a>(&self, key: &'a [u8], r: &Rec<'a>) -> ItemView<'a> {
        ItemView {
            key,
            value: r.value,
            flags: r.flags,
            exptime: r.exptime,
            cas: self.rec_cas(r),
        }
    }

    fn account_add(&self, id: u32, len: usize) {
        self.live[tid() % self.live.len()]
            .0
            .fetch_add(1, Ordering::Relaxed);
        if let Some(seg) = self.segs.get(id) {
            seg.acct.0.live_items.fetch_add(1, Ordering::Relaxed);
            seg.acct
                .0
                .live_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
        }
    }

    fn account_remove(&self, v: u64, len: usize) {
        self.live[tid() % self.live.len()]
            .0
            .fetch_sub(1, Ordering::Relaxed);
        if let Some(seg) = self.segs.get(index::slot_seg(v)) {
            // Release: whoever sees the count reach 0 (acquire) and then reuses the
            // segment also sees the slot change that preceded this decrement.
            seg.acct.0.live_items.fetch_sub(1, Ordering::Release);
            seg.acct
                .0
                .live_bytes
                .fetch_sub(len as u64, Ordering::Relaxed);
        }
    }

    fn count_dead(&self, vis: Vis) {
        match vis {
            Vis::Expired => self.st.0.get_expired.fetch_add(1, Ordering::Relaxed),
            Vis::Flushed => self.st.0.get_flushed.fetch_add(1, Ordering::Relaxed),
            Vis::Live => 0,
        };
    }

    /// Unlink the slot still holding `v` (same identity), for a dead item found by a
    /// reader. May be called while pinned.
    fn unlink_dead(&self, h: u64, v: u64) {
        let _g = self.index.lock(h);
        let found = self.index.find(h, |x| x & IDENT_MASK == v & IDENT_MASK);
        if let Some((slot, cur)) = found {
            // SAFETY: we hold the stripe lock and `cur` is still in its slot.
            let len = unsafe { self.rec(cur) }.map_or(0, |r| r.len);
            slot.store(0, Ordering::Release);
            self.account_remove(cur, len);
        }
    }

    /// Look `key` up under a pin: its location and value length if live. A dead item is
    /// unlinked and counted, as memcached's lookups do.
    fn peek(&self, h: u64, key: &[u8], now: Time) -> Option<Peek<'_>> {
        let dead = {
            let _pin = self.pin();
            // SAFETY: pinned.
            let (slot, v, r) = unsafe { self.lookup(h, key) }?;
            match self.vis(&r, now) {
                Vis::Live => {
                    return Some(Peek {
                        slot,
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

    // ---- segments -------------------------------------------------------------------

    fn new_segment(&self, p: &mut Pool, len: usize, large: bool) -> Option<(u32, NonNull<u8>)> {
        let id = match p.ids.pop() {
            Some(id) => id,
            None => {
                if p.next_id as usize >= index::MAX_SEGMENTS {
                    return None;
                }
                p.next_id += 1;
                p.next_id - 1
            }
        };
        let (Some(seg), Some(ptr)) = (self.segs.get_or_create(id), mem::map(len)) else {
            p.ids.push(id);
            return None;
        };
        seg.mem.0.cap.store(len, Ordering::Relaxed);
        seg.mem.0.large.store(large, Ordering::Relaxed);
        seg.mem.0.used.store(0, Ordering::Relaxed);
        seg.mem.0.ptr.store(ptr.as_ptr(), Ordering::Release);
        self.allocated.fetch_add(len, Ordering::Relaxed);
        Some((id, ptr))
    }

    /// Give a segment's memory back to the OS. No slot may point into it and no reader
    /// may hold a pin from before its last slot was unlinked (or it was never visible).
    fn release(&self, p: &mut Pool, id: u32) {
        if let Some(seg) = self.segs.get(id) {
            let ptr = seg.mem.0.ptr.swap(std::ptr::null_mut(), Ordering::AcqRel);
            let cap = seg.mem.0.cap.swap(0, Ordering::Relaxed);
            if let Some(ptr) = NonNull::new(ptr) {
                // SAFETY: the mapping came from `mem::map(cap)`; per this function's
                // contract nothing can reach it any more.
                unsafe { mem::unmap(ptr, cap) };
                self.allocated.fetch_sub(cap, Ordering::Relaxed);
            }
            seg.acct.0.live_items.store(0, Ordering::Relaxed);
            seg.acct.0.live_bytes.store(0, Ordering::Relaxed);
        }
        p.ids.push(id);
    }

    /// A free regular segment, evicting if needed (and allowed).
    fn take_segment(&self) -> Option<u32> {
        if !self.no_evict {
            // Give the evictor a segment to copy second-chance items into before memory
            // runs out (when it runs out, nothing is free until an eviction finishes).
            let mut ev = lock(&self.evictor);
            if ev.spare.is_none() && ev.dest.is_none() {
                ev.spare = self.take_segment_no_evict();
            }
        }
        let attempts = 4 * (self.allocated.load(Ordering::Relaxed) / self.seg_size) + 16;
        for _ in 0..attempts {
            {
                let mut p = lock(&self.pool);
                if let Some(id) = p.free.pop() {
                    return Some(id);
                }
                if self.allocated.load(Ordering::Relaxed) + self.seg_size <= self.budget() {
                    if let Some((id, _)) = self.new_segment(&mut p, self.seg_size, false) {
                        return Some(id);
                    }
                }
            }
            if self.no_evict {
                if self.reclaim_dead() || self.unstick() && self.reclaim_dead() {
                    continue;
                }
                return None;
            }
            if self.evict_one(false) == Evicted::Nothing && !self.unstick() {
                return None;
            }
        }
        None
    }

    /// Free one sealed segment that holds no live item (everything in it was deleted,
    /// overwritten or expired and unlinked). This is not eviction, so it also runs with
    /// `no_evict` (memcached's `-M`), where deleting items must make room again.
    fn reclaim_dead(&self) -> bool {
        let id = {
            let dead = lock(&self.fifo).remove_first(|id| {
                self.segs
                    .get(id)
                    .is_some_and(|s| s.acct.0.live_items.load(Ordering::Acquire) == 0)
            });
            match dead {
                Some(id) => id,
                None => return false,
            }
        };
        let large = self
            .segs
            .get(id)
            .is_some_and(|s| s.mem.0.large.load(Ordering::Relaxed));
        self.retire(id);
        // Readers that found a slot into it before it emptied must be done before reuse.
        self.barrier();
        let mut p = lock(&self.pool);
        if large || self.allocated.load(Ordering::Relaxed) > self.budget() {
            self.release(&mut p, id);
        } else {
            p.free.push(id);
        }
        true
    }

    /// Nothing is sealed, so nothing can be evicted: all memory sits in open segments
    /// (small limits, or a shrunk one). Hand the evictor's spare back, and seal open
    /// segments of the evictor and of shards whose lock is free (try_lock: the caller
    /// holds its own shard lock, and shards never wait for each other). True if anything
    /// became free or evictable.
    fn unstick(&self) -> bool {
        let mut changed = false;
        {
            let mut ev = lock(&self.evictor);
            if let Some(id) = ev.spare.take() {
                lock(&self.pool).free.push(id);
                changed = true;
            }
            if let Some(o) = ev.dest.take() {
                self.seal(o, Queue::Main);
                changed = true;
            }
        }
        for shard in self.shards.iter() {
            if let Ok(mut sh) = shard.0.try_lock() {
                if let Some(o) = sh.take() {
                    self.seal(o, Queue::Small);
                    changed = true;
                }
            }
        }
        changed
    }

    /// Take a free segment without evicting (for the evictor's copies).
    fn take_segment_no_evict(&self) -> Option<u32> {
        let mut p = lock(&self.pool);
        if let Some(id) = p.free.pop() {
            return Some(id);
        }
        if self.allocated.load(Ordering::Relaxed) + self.seg_size <= self.budget() {
            return self
                .new_segment(&mut p, self.seg_size, false)
                .map(|(id, _)| id);
        }
        None
    }

    /// Prepare a free segment for appending.
    fn open_segment(&self, id: u32) -> Option<Open> {
        let seg = self.segs.get(id)?;
        let ptr = NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire))?;
        let cap = seg.mem.0.cap.load(Ordering::Relaxed);
        // SAFETY: a free segment is unreachable (no slot points into it, readers from
        // before it was freed are gone, see `release`/`evict_one`) and owned by us now,
        // so we may write all `cap` bytes of its mapping.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, cap) };
        seg.acct.0.live_items.store(0, Ordering::Relaxed);
        seg.acct.0.live_bytes.store(0, Ordering::Relaxed);
        // The number is drawn and published under `seq_lock`, so that a log reader that
        // holds it sees every number below `seg_seq` either live or retired.
        let _s = lock(&self.seq_lock);
        let base = self.next_cas.load(Ordering::SeqCst);
        let seq = self.seg_seq.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { format::write_seg_header(ptr.as_ptr(), format::SEG_KIND_REGULAR, seq, base) };
        seg.mem.0.used.store(SEG_HDR, Ordering::Release);
        seg.mem.0.sealed.store(false, Ordering::Relaxed);
        seg.mem.0.seq.store(seq, Ordering::Release);
        Some(Open {
            id,
            cap,
            used: SEG_HDR,
            base,
        })
    }

    fn seal(&self, open: Open, queue: Queue) {
        if let Some(seg) = self.segs.get(open.id) {
            seg.mem.0.used.store(open.used, Ordering::Release);
            seg.mem.0.sealed.store(true, Ordering::Release);
        }
        lock(&self.fifo).push(open.id, queue);
    }

    /// Make sure `slot` holds an open segment with `need` free bytes.
    fn room(&self, slot: &mut Option<Open>, need: usize) -> Option<Open> {
        if let Some(o) = *slot {
            if o.used + need <= o.cap {
                return Some(o);
            }
            *slot = None;
            self.seal(o, Queue::Small);
        }
        let id = self.take_segment()?;
        let o = self.open_segment(id)?;
        *slot = Some(o);
        Some(o)
    }

    fn dest(&self, o: &Open) -> Option<Dest> {
        let seg = self.segs.get(o.id)?;
        let ptr = NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire))?;
        Some(Dest {
            id: o.id,
            ptr,
            off: o.used,
            base: o.base,
            room: o.cap.saturating_sub(o.used),
        })
    }

    // ---- writes ---------------------------------------------------------------------

    /// Check `c.cond` under the bucket lock and, if it holds, append the record at `dest`
    /// and point the index at it. Returns the outcome and the bytes appended.
    ///
    /// On success the stripe lock is handed back with the new slot value, so that the
    /// caller can finish its bookkeeping (advance its append offset, queue a large
    /// segment) before a `gat` callback runs under the same lock: a panicking callback
    /// then cannot leave a published record inside the free part of a segment.
    fn apply(&self, c: &Commit<'_>, dest: &Dest, now: Time) -> (Outcome, usize, Option<Held<'_>>) {
        let g = self.index.lock(c.h);
        // SAFETY: we hold `c.h`'s stripe lock.
        let cur = unsafe { self.lookup(c.h, c.key) };
        let mut live = None;
        if let Some((_, v, r)) = &cur {
            match self.vis(r, now) {
                Vis::Live => live = Some((*v, *r)),
                vis => self.count_dead(vis),
            }
        }
        let mut stale_store = false;
        let failed = match (c.cond, &live) {
            (Cond::Any, _) => None,
            (Cond::Absent, Some(_)) => Some(Fail::Present),
            (Cond::Absent, None) => None,
            (Cond::Present, None) => Some(Fail::Absent),
            (Cond::Present, Some(_)) => None,
            (Cond::Cas(_) | Cond::CasStale(_), None) => Some(Fail::Absent),
            (Cond::Cas(want), Some((_, r))) => {
                (want == 0 || want != self.rec_cas(r)).then_some(Fail::CasMismatch)
            }
            (Cond::CasStale(want), Some((_, r))) => {
                let have = self.rec_cas(r);
                if want != 0 && want == have {
                    None
                } else if want != 0 && want < have {
                    stale_store = true;
                    None
                } else {
                    Some(Fail::CasMismatch)
                }
            }
            (Cond::Loc(ident), Some((v, _))) => (v & IDENT_MASK != ident).then_some(Fail::Moved),
            (Cond::Loc(_), None) => Some(Fail::Moved),
            (Cond::Newer(cas, stamp), _) => cur
                .as_ref()
                .is_some_and(|(_, _, r)| (r.cas, r.stamp) >= (cas, stamp))
                .then_some(Fail::Present),
        };
        if let Some(f) = failed {
            return (Outcome::Failed(f), 0, None);
        }
        let old = live.map(|(_, r)| r);
        let old_value: &[u8] = old.map_or(&[], |r| r.value);
        let parts: [&[u8]; 2] = match c.src {
            Src::Bytes(b) => [b, &[]],
            Src::OldThen(b) => [old_value, b],
            Src::ThenOld(b) => [b, old_value],
            Src::Old => [old_value, &[]],
        };
        if HDR_MAX + c.key.len() + parts[0].len() + parts[1].len() > dest.room {
            // The old value is not the length the reservation was made for: the slot
            // went away and came back at the same place with another record (ABA).
            // Never write past the reservation; the caller retries.
            return (Outcome::Failed(Fail::Moved), 0, None);
        }
        let (cas, stamp, explicit_cas) = match (c.cond, c.keep_cas, old) {
            (Cond::Newer(cas, stamp), _, _) => (cas, stamp, c.meta.explicit_cas),
            (_, true, Some(r)) => (r.cas, self.rewrite_stamp(), r.explicit_cas),
            _ => (
                self.next_cas.fetch_add(1, Ordering::SeqCst),
                0,
                c.meta.explicit_cas.filter(|_| self.use_cas),
            ),
        };
        let old_meta = old.map_or(0, |r| r.meta);
        let stale = stale_store || c.meta.stale.unwrap_or(old_meta & META_STALE != 0);
        let binary = c.meta.binary_key.unwrap_or(old_meta & META_BINARY_KEY != 0);
        let exptime = match (stale_store, old) {
            (true, Some(r)) => r.exptime,
            _ => c.exptime.or(old.map(|r| r.exptime)).unwrap_or(0),
        };
        let spec = Spec {
            kind: KIND_ITEM,
            key: c.key,
            parts,
            flags: c.flags.or(old.map(|r| r.flags)).unwrap_or(0),
            exptime,
            cas,
            stamp,
            meta: if stale { META_STALE } else { 0 } | if binary { META_BINARY_KEY } else { 0 },
            explicit_cas,
        };
        // SAFETY: `dest` is in a segment the caller owns for appending (its shard's open
        // segment under the shard lock, or a fresh large segment) and `dest.room` bytes
        // from `dest.off` are unwritten and inside the mapping; the record takes at most
        // `HDR_MAX + key + value <= dest.room` bytes (checked above). The parts borrow
        // the old record, which the stripe lock keeps in place, and cannot overlap the
        // unpublished destination.
        let len = unsafe { format::write(dest.ptr.as_ptr().add(dest.off), &spec, dest.base) };
        let fresh = index::pack(index::tag_of(c.h), dest.id, dest.off as u32, 0, false);
        // The new slot value, from the value the slot holds when it is replaced: readers
        // may set access or win bits until then (by compare-exchange), and a write that
        // keeps them must not lose one.
        let next = |cur: Option<u64>| {
            let mut n = fresh;
            if let Some(x) = cur {
                if c.keep_access {
                    n |= x & !IDENT_MASK;
                } else if stale_store {
                    n |= x & index::WIN;
                }
            }
            match c.meta.win {
                Some(true) => n |= index::WIN,
                Some(false) => n &= !index::WIN,
                None => {}
            }
            if c.access {
                n = index::bumped(n);
            }
            n
        };
        let mut new_v = next(None);
        let mut held_prev = None;
        let mut indexed = true;
        match &cur {
            Some((slot, v, r)) => {
                // A dead item's time and bits are not kept (`Loc` writes, the only ones
                // that keep them, need a live item).
                let keep = live.is_some();
                if !(keep && c.meta.keep_atime) {
                    self.index.set_atime(slot, now);
                }
                let prev = slot
                    .fetch_update(Ordering::Release, Ordering::Relaxed, |x| {
                        Some(next(keep.then_some(x)))
                    })
                    .unwrap_or(*v);
                new_v = next(keep.then_some(prev));
                held_prev = keep.then_some((*slot, prev));
                self.account_remove(*v, r.len);
            }
            None => {
                let ins = self.index.insert(c.h, new_v, now);
                if let Insert::Full = ins {
                    // No slot to take (only markers of a split in the chain): the new
                    // record stays unreferenced, as if evicted at once.
                    self.st.0.evictions.fetch_add(1, Ordering::Relaxed);
                    self.st.0.evicted_index.fetch_add(1, Ordering::Relaxed);
                    indexed = false;
                }
                if let Insert::Victim(slot) = ins {
                    // The chain is full: this slot's item is evicted to make room.
                    self.index.set_atime(slot, now);
                    self.evict_index_slot(slot, slot.load(Ordering::Acquire), new_v);
                }
            }
        }
        let shown = if self.use_cas {
            explicit_cas.unwrap_or(cas)
        } else {
            0
        };
        if !indexed {
            return (Outcome::Stored(shown), len, None);
        }
        self.account_add(dest.id, len);
        (
            Outcome::Stored(shown),
            len,
            Some(Held {
                _g: g,
                prev: held_prev,
                v: new_v,
            }),
        )
    }

    /// Grow the index while its items exceed `LOAD_NUM / LOAD_DEN` of its main slots: up
    /// to `GROW_BATCH` splits, then, each after a pin barrier, the compaction of the split
    /// chains, the unlinking of their empty overflow buckets and the reuse of those (see
    /// `index`). One thread at a time; others skip. With `block` false a barrier that
    /// readers still hold up is left for a later call instead of waited for; no new split
    /// starts until the pending steps are done. (Giving segment memory back when the index
    /// grew into it evicts, and eviction waits for readers as it always does.) Called with
    /// no lock and no pin held.
    fn grow(&self, block: bool) {
        let Ok(mut g) = self.grow_lock.try_lock() else {
            return;
        };
        loop {
            match g.step {
                GrowStep::Idle => {
                    let live: i64 = self.live.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
                    let live = usize::try_from(live).unwrap_or(0);
                    let mut split = Vec::new();
                    // The index takes at most half the limit (the segments the rest).
                    // With no_evict it grows only into memory no segment uses.
                    let max = self.max_bytes.load(Ordering::Relaxed);
                    let room = |extra: usize| {
                        let index = self.index_bytes() + extra;
                        index <= max / 2
                            && (!self.no_evict
                                || self.allocated.load(Ordering::Relaxed) + index <= max)
                    };
                    while split.len() < GROW_BATCH
                        && live * LOAD_DEN > self.index.nmain() * index::SLOTS * LOAD_NUM
                        && room(index::BUCKET_BYTES)
                    {
                        let Some((b, l)) = self.index.next_split() else {
                            break;
                        };
                        let _s = self.index.lock_bucket(b);
                        self.index.split(
                            b,
                            l,
                            // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
                            |v| unsafe { self.rec(v) }.map(|r| self.hash(r.key)),
                            |slot, x| self.evict_index_slot(slot, x, 0),
                        );
                        split.push(b);
                    }
                    if split.is_empty() {
                        // Nothing to split: compact a slice of chains instead, so that
                        // overflow buckets linked while a bucket was briefly full go
                        // back to the pool (a full cache churns every bucket).
                        self.sweep(&mut g);
                        if g.step == GrowStep::Idle {
                            return;
                        }
                        continue;
                    }
                    self.st
                        .0
                        .index_splits
                        .fetch_add(split.len() as u64, Ordering::Relaxed);
                    g.buckets = split;
                    g.step = GrowStep::Split;
                    g.expanding = true;
                    // The index is counted against the limit: give back what it took.
                    if !self.no_evict && self.allocated.load(Ordering::Relaxed) > self.budget() {
                        self.shrink();
                    }
                }
                GrowStep::Split => {
                    if !self.try_barrier(block) {
                        return;
                    }
                    let mut moved = false;
                    for &b in &g.buckets {
                        let _s = self.index.lock_bucket(b);
                        moved |= self.index.compact(b);
                    }
                    g.step = GrowStep::Compacted;
                    if moved {
                        continue;
                    }
                    // Nothing marked: no barrier needed before unlinking.
                    g.step = GrowStep::Released;
                    g.spare = self.release_chains(&g.buckets);
                }
                GrowStep::Compacted => {
                    if !self.try_barrier(block) {
                        return;
                    }
                    g.spare = self.release_chains(&g.buckets);
                    g.step = GrowStep::Released;
                }
                GrowStep::Released => {
                    if !g.spare.is_empty() && !self.try_barrier(block) {
                        return;
                    }
                    let spare = std::mem::take(&mut g.spare);
                    self.index.recycle(spare);
                    g.buckets.clear();
                    g.step = GrowStep::Idle;
                    g.expanding = false;
                    return;
                }
            }
        }
    }

    /// Start compacting the next chains that have overflow buckets (up to `GROW_BATCH`
    /// of them, looking at no more than `SWEEP_SCAN` buckets).
    fn sweep(&self, g: &mut Grow) {
        let nmain = self.index.nmain();
        let mut picked = Vec::new();
        for _ in 0..SWEEP_SCAN.min(nmain) {
            let b = g.cursor % nmain;
            g.cursor = g.cursor.wrapping_add(1);
            if self.index.has_overflow(b) {
                picked.push(b);
                if picked.len() == GROW_BATCH {
                    break;
                }
            }
        }
        if picked.is_empty() {
            return;
        }
        // No marker is left from an earlier batch (Idle), so no barrier is due first.
        let mut moved = false;
        for &b in &picked {
            let _s = self.index.lock_bucket(b);
            moved |= self.index.compact(b);
        }
        if moved {
            g.step = GrowStep::Compacted;
        } else {
            g.spare = self.release_chains(&picked);
            g.step = GrowStep::Released;
        }
        g.buckets = picked;
    }

    fn release_chains(&self, buckets: &[usize]) -> Vec<u32> {
        let mut spare = Vec::new();
        for &b in buckets {
            let _s = self.index.lock_bucket(b);
            spare.extend(self.index.release_chain(b));
        }
        spare
    }

    /// Evict the item `v` of `slot` because the index has no room for it (a full chain,
    /// or a split's new bucket), putting `replacement` (a new item, or 0) in the slot.
    /// The caller holds the slot's stripe lock and `slot` still holds `v` (as an item or
    /// as a marker), so its record is live.
    fn evict_index_slot(&self, slot: &AtomicU64, v: u64, replacement: u64) {
        // SAFETY: per the contract; the length is read before the slot is overwritten.
        let len = unsafe { self.rec(v) }.map_or(0, |r| {
            self.note_eviction(r.key, r.cas);
            r.len
        });
        slot.store(replacement, Ordering::Release);
        self.account_remove(v, len);
        self.st.0.evictions.fetch_add(1, Ordering::Relaxed);
        self.st.0.evicted_index.fetch_add(1, Ordering::Relaxed);
    }

    /// Show the item just written to a callback, still under its stripe lock.
    fn show(&self, held: Option<Held<'_>>, view: Option<ShowFn<'_>>) {
        if let (Some(held), Some(cb)) = (held, view) {
            // SAFETY: `held.v` is in its slot and we hold the stripe lock (`held._g`).
            if let Some(r) = unsafe { self.rec(held.v) } {
                cb(held.prev, &r);
            }
        }
    }

    fn commit(&self, c: &Commit<'_>, now: Time, view: Option<ShowFn<'_>>) -> Outcome {
        let extra = match c.src {
            Src::Bytes(b) | Src::OldThen(b) | Src::ThenOld(b) => b.len(),
            Src::Old => 0,
        };
        let vlen = match c.src {
            Src::Bytes(_) => extra,
            _ => extra + c.old_len,
        };
        if c.key.len() > MAX_KEY || vlen > self.max_item_size {
            return Outcome::TooLarge;
        }
        let need = HDR_MAX + c.key.len() + vlen;
        if SEG_HDR + need > self.seg_size {
            return self.commit_large(c, need, now, view);
        }
        let shard = &self.shards[tid() % self.shards.len()];
        let mut sh = lock(&shard.0);
        let Some(open) = self.room(&mut sh, need) else {
            return Outcome::NoMemory;
        };
        let Some(dest) = self.dest(&open) else {
            return Outcome::NoMemory;
        };
        let (out, len, held) = self.apply(c, &dest, now);
        let mut grow = false;
        if len > 0 {
            let used = open.used + len;
            *sh = Some(Open { used, ..open });
            if let Some(seg) = self.segs.get(open.id) {
                seg.mem.0.used.store(used, Ordering::Release);
            }
            if !c.keep_cas && !c.keep_access {
                let n = self.shard_items[tid() % self.shard_items.len()]
                    .0
                    .fetch_add(1, Ordering::Relaxed);
                grow = n % GROW_EVERY == GROW_EVERY - 1;
            }
        }
        self.show(held, view);
        drop(sh);
        if grow {
            self.grow(false);
        }
        out
    }

    fn commit_large(
        &self,
        c: &Commit<'_>,
        need: usize,
        now: Time,
        view: Option<ShowFn<'_>>,
    ) -> Outcome {
        let total = (SEG_HDR + need).div_ceil(PAGE) * PAGE;
        if total > self.budget() {
            return Outcome::TooLarge;
        }
        let Some((id, ptr)) = self.reserve_large(total) else {
            return Outcome::NoMemory;
        };
        let base = self.next_cas.load(Ordering::SeqCst);
        // The sequence number is drawn once the record is in (a failed write never
        // becomes visible, and log readers expect every number to name a segment).
        // SAFETY: the mapping is fresh, `total >= SEG_HDR`, and nothing else knows it.
        unsafe { format::write_seg_header(ptr.as_ptr(), format::SEG_KIND_LARGE, 0, base) };
        let dest = Dest {
            id,
            ptr,
            off: SEG_HDR,
            base,
            room: total - SEG_HDR,
        };
        let (out, len, held) = self.apply(c, &dest, now);
        if len == 0 {
            // Never visible: free it at once.
            let mut p = lock(&self.pool);
            self.release(&mut p, id);
            return out;
        }
        if let Some(seg) = self.segs.get(id) {
            let _s = lock(&self.seq_lock);
            let seq = self.seg_seq.fetch_add(1, Ordering::Relaxed);
            // SAFETY: bytes 8..16 of the header (the sequence number) are read by no one
            // (readers of the record read the CAS base, bytes 16..24).
            unsafe {
                std::ptr::copy_nonoverlapping(seq.to_le_bytes().as_ptr(), ptr.as_ptr().add(8), 8)
            };
            seg.mem.0.used.store(SEG_HDR + len, Ordering::Release);
            seg.mem.0.sealed.store(true, Ordering::Release);
            seg.mem.0.seq.store(seq, Ordering::Release);
        }
        if !c.keep_cas && !c.keep_access {
            self.shard_items[tid() % self.shard_items.len()]
                .0
                .fetch_add(1, Ordering::Relaxed);
        }
        // Queued only now that its slot is installed (the evictor frees large segments
        // that no slot points at).
        lock(&self.fifo).push(id, Queue::Small);
        self.show(held, view);
        out
    }

    /// Map a large segment of `total` bytes within the budget, evicting if allowed.
    fn reserve_large(&self, total: usize) -> Option<(u32, NonNull<u8>)> {
        let attempts = 4 * (self.allocated.load(Ordering::Relaxed) / self.seg_size) + 16;
        for _ in 0..attempts {
            {
                let mut p = lock(&self.pool);
                if self.allocated.load(Ordering::Relaxed) + total <= self.budget() {
                    return self.new_segment(&mut p, total, true);
                }
                if let Some(id) = p.free.pop() {
                    self.release(&mut p, id);
                    continue;
                }
            }
            if self.no_evict {
                if self.reclaim_dead() || self.unstick() && self.reclaim_dead() {
                    continue;
                }
                return None;
            }
            if self.evict_one(true) == Evicted::Nothing && !self.unstick() {
                return None;
            }
        }
        None
    }

    /// A store with the meta options (the classic store is one without them); returns the
    /// result and the stored value's length (the request's when nothing was stored).
    fn store_inner(&self, req: &MetaStoreRequest<'_>, h: u64, now: Time) -> (StoreResult, usize) {
        let len = req.value.len();
        let base = Commit {
            key: req.key,
            h,
            cond: Cond::Any,
            src: Src::Bytes(req.value),
            old_len: 0,
            flags: Some(req.flags),
            exptime: Some(req.exptime),
            keep_cas: false,
            keep_access: false,
            access: false,
            meta: MetaW {
                explicit_cas: req.new_cas,
                binary_key: Some(req.binary_key),
                ..MetaW::default()
            },
        };
        let c = match req.mode {
            StoreMode::Set => base,
            StoreMode::Add => {
                if let Some(p) = self.peek(h, req.key, now) {
                    // memcached's add bumps the access time of the item it finds.
                    if p.slot.load(Ordering::Relaxed) & IDENT_MASK == p.ident {
                        self.index.set_atime(p.slot, now);
                    }
                    return (StoreResult::NotStored, len);
                }
                Commit {
                    cond: Cond::Absent,
                    ..base
                }
            }
            StoreMode::Replace => {
                if self.peek(h, req.key, now).is_none() {
                    return (StoreResult::NotStored, len);
                }
                Commit {
                    cond: Cond::Present,
                    ..base
                }
            }
            StoreMode::Cas(want) => {
                if self.peek(h, req.key, now).is_none() {
                    return (StoreResult::NotFound, len);
                }
                let cond = if req.invalidate {
                    Cond::CasStale(want)
                } else {
                    Cond::Cas(want)
                };
                Commit { cond, ..base }
            }
            StoreMode::Append | StoreMode::Prepend => {
                for _ in 0..RETRIES {
                    let Some(p) = self.peek(h, req.key, now) else {
                        if !req.vivify {
                            return (StoreResult::NotStored, len);
                        }
                        let c = Commit {
                            cond: Cond::Absent,
                            ..base
                        };
                        match self.commit(&c, now, None) {
                            // Created meanwhile: append to it.
                            Outcome::Failed(Fail::Present) => continue,
                            o => return (self.result(o, false), len),
                        }
                    };
                    if req.compare_cas.is_some_and(|c| c != 0 && c != p.cas) {
                        return (StoreResult::Exists, len);
                    }
                    if self.too_large(req.key.len(), p.value_len + req.value.len(), p.flags) {
                        return (StoreResult::NotStored, len);
                    }
                    let src = if req.mode == StoreMode::Append {
                        Src::OldThen(req.value)
                    } else {
                        Src::ThenOld(req.value)
                    };
                    let c = Commit {
                        cond: Cond::Loc(p.ident),
                        src,
                        old_len: p.value_len,
                        flags: None,
                        exptime: None,
                        ..base
                    };
                    match self.commit(&c, now, None) {
                        Outcome::Failed(Fail::Moved) => continue,
                        Outcome::TooLarge => return (StoreResult::NotStored, len),
                        o @ Outcome::Stored(_) => {
                            return (self.result(o, false), p.value_len + req.value.len())
                        }
                        o => return (self.result(o, false), len),
                    }
                }
                return (StoreResult::NotStored, len);
            }
        };
        let out = self.commit(&c, now, None);
        (self.result(out, matches!(req.mode, StoreMode::Cas(_))), len)
    }

    fn result(&self, o: Outcome, cas_mode: bool) -> StoreResult {
        match o {
            Outcome::Stored(c) => StoreResult::Stored(c),
            Outcome::Failed(Fail::CasMismatch) => StoreResult::Exists,
            Outcome::Failed(Fail::Absent | Fail::Moved) if cas_mode => StoreResult::NotFound,
            Outcome::Failed(_) => StoreResult::NotStored,
            Outcome::NoMemory => StoreResult::NoMemory,
            Outcome::TooLarge => StoreResult::TooLarge,
        }
    }

    /// Rewrite the live item with a new expiry (same CAS); `found` sees the result.
    fn touch_inner(
        &self,
        key: &[u8],
        h: u64,
        exptime: Time,
        now: Time,
        mut found: Option<&mut dyn FnMut(ItemView<'_>)>,
    ) -> bool {
        for _ in 0..RETRIES {
            let Some(p) = self.peek(h, key, now) else {
                return false;
            };
            let c = Commit {
                key,
                h,
                cond: Cond::Loc(p.ident),
                src: Src::Old,
                old_len: p.value_len,
                flags: None,
                exptime: Some(exptime),
                keep_cas: true,
                keep_access: true,
                access: true,
                meta: MetaW {
                    stale: None,
                    binary_key: None,
                    ..MetaW::default()
                },
            };
            let mut show = |_: Option<(&AtomicU64, u64)>, r: &Rec<'_>| {
                if let Some(f) = found.as_mut() {
                    f(self.view(key, r));
                }
            };
            match self.commit(&c, now, Some(&mut show)) {
                Outcome::Stored(_) => return true,
                Outcome::Failed(Fail::Moved) => continue,
                _ => return false,
            }
        }
        false
    }

    fn delete_inner(&self, key: &[u8], h: u64, now: Time) -> bool {
        if key.len() > MAX_KEY {
            return false;
        }
        if self.peek(h, key, now).is_none() {
            self.tombstone_for_replicas(key, h);
            return false;
        }
        self.delete_at(key, h, now, None).unwrap_or(false)
    }

    /// Delete the live item of `key` (only if it still has identity `want`, when given);
    /// None if it moved.
    fn delete_at(&self, key: &[u8], h: u64, now: Time, want: Option<u64>) -> Option<bool> {
        let need = HDR_MAX + key.len();
        let shard = &self.shards[tid() % self.shards.len()];
        let mut sh = lock(&shard.0);
        // Without room for a tombstone (no_evict and full) the delete still happens; only
        // a log reader would miss it.
        let open = self.room(&mut sh, need);
        let dest = open.as_ref().and_then(|o| self.dest(o));
        let _g = self.index.lock(h);
        // SAFETY: we hold `h`'s stripe lock.
        let Some((slot, v, r)) = (unsafe { self.lookup(h, key) }) else {
            return want.map_or(Some(false), |_| None);
        };
        let vis = self.vis(&r, now);
        if vis != Vis::Live {
            self.count_dead(vis);
            slot.store(0, Ordering::Release);
            self.account_remove(v, r.len);
            return Some(false);
        }
        if want.is_some_and(|w| w != v & IDENT_MASK) {
            return None;
        }
        if let (Some(o), Some(d)) = (open, dest) {
            // Not a new version: a tombstone removes versions below this one (the next set
            // of the key draws this value or a later one).
            let cas = self.next_cas.load(Ordering::SeqCst);
            self.append_tombstone(&mut sh, o, &d, key, cas);
        }
        slot.store(0, Ordering::Release);
        self.account_remove(v, r.len);
        Some(true)
    }

    /// Append a tombstone for `key` with version `cas` at `d`, the shard's open segment
    /// `o`, whose room for `HDR_MAX + key` bytes the caller reserved under the shard lock
    /// it holds (`sh`).
    fn append_tombstone(&self, sh: &mut Option<Open>, o: Open, d: &Dest, key: &[u8], cas: u64) {
        let spec = Spec {
            kind: KIND_TOMBSTONE,
            key,
            parts: [&[], &[]],
            flags: 0,
            exptime: 0,
            stamp: 0,
            cas,
            meta: 0,
            explicit_cas: None,
        };
        // SAFETY: per this function's contract `HDR_MAX + key` bytes at `d.off` are
        // reserved in the open segment only the caller appends to.
        let len = unsafe { format::write(d.ptr.as_ptr().add(d.off), &spec, d.base) };
        let used = o.used + len;
        *sh = Some(Open { used, ..o });
        if let Some(seg) = self.segs.get(o.id) {
            seg.mem.0.used.store(used, Ordering::Release);
        }
        self.st.0.tombstones.fetch_add(1, Ordering::Relaxed);
    }

    /// incr/decr with the meta options (the classic arith is one without them).
    fn arith_inner(&self, key: &[u8], h: u64, now: Time, req: &MetaArith) -> MetaArithResult {
        for _ in 0..RETRIES {
            let read = {
                let _pin = self.pin();
                // SAFETY: pinned.
                match unsafe { self.lookup(h, key) } {
                    Some((_, v, r)) if self.vis(&r, now) == Vis::Live => Some((
                        v & IDENT_MASK,
                        r.value.len(),
                        number::parse_item(key, r.value),
                        self.rec_cas(&r),
                        r.exptime,
                    )),
                    _ => None,
                }
            };
            let Some((ident, old_len, n, cas, exptime_before)) = read else {
                // Count and unlink a dead item as a lookup would.
                if self.peek(h, key, now).is_some() {
                    continue;
                }
                let Some((exptime, initial)) = req.vivify else {
                    return MetaArithResult::NotFound;
                };
                let mut digits = [0u8; 20];
                let text = number::format(initial, &mut digits);
                if self.too_large(key.len(), text.len(), 0) {
                    return MetaArithResult::NoMemory;
                }
                let c = Commit {
                    key,
                    h,
                    cond: Cond::Absent,
                    src: Src::Bytes(text),
                    old_len: 0,
                    flags: Some(0),
                    exptime: Some(exptime),
                    keep_cas: false,
                    keep_access: false,
                    access: false,
                    meta: MetaW {
                        explicit_cas: req.new_cas,
                        binary_key: Some(req.binary_key),
                        ..MetaW::default()
                    },
                };
                match self.commit(&c, now, None) {
                    Outcome::Stored(cas) => {
                        return MetaArithResult::Value {
                            value: initial,
                            cas,
                            exptime_before: 0,
                            exptime,
                            created: true,
                        }
                    }
                    // Created meanwhile: change that one.
                    Outcome::Failed(_) => continue,
                    Outcome::NoMemory | Outcome::TooLarge => return MetaArithResult::NoMemory,
                }
            };
            if old_len == 0 {
                return MetaArithResult::NonNumeric;
            }
            if req.compare_cas.is_some_and(|c| c != 0 && c != cas) {
                return MetaArithResult::Exists;
            }
            let Some(cur) = n else {
                return MetaArithResult::NonNumeric;
            };
            let new = if req.incr {
                cur.wrapping_add(req.delta)
            } else {
                cur.saturating_sub(req.delta)
            };
            let mut text = new.to_string().into_bytes();
            let in_place = text.len() <= old_len;
            if in_place {
                text.resize(old_len, b' ');
            }
            let c = Commit {
                key,
                h,
                cond: Cond::Loc(ident),
                src: Src::Bytes(&text),
                old_len,
                flags: None,
                exptime: req.touch,
                keep_cas: false,
                // In memcached an in-place update keeps the item (its fetched bit, stale
                // and win marks); a longer number is a new item, counted in total_items,
                // with none of them.
                keep_access: in_place,
                access: false,
                meta: MetaW {
                    explicit_cas: req.new_cas,
                    stale: if in_place { None } else { Some(false) },
                    binary_key: None,
                    ..MetaW::default()
                },
            };
            match self.commit(&c, now, None) {
                Outcome::Stored(cas) => {
                    return MetaArithResult::Value {
                        value: new,
                        cas,
                        exptime_before,
                        exptime: req.touch.unwrap_or(exptime_before),
                        created: false,
                    }
                }
                Outcome::Failed(Fail::Moved) => continue,
                Outcome::Failed(_) => return MetaArithResult::NotFound,
                Outcome::NoMemory | Outcome::TooLarge => return MetaArithResult::NoMemory,
            }
        }
        MetaArithResult::NotFound
    }

    // ---- eviction -------------------------------------------------------------------

    /// Evict the oldest sealed segment. With `release`, or when over budget, its memory
    /// goes back to the OS, else to the free list.
    fn evict_one(&self, release: bool) -> Evicted {
        // Popping the segment makes it ours: several threads may clean different
        // segments at once (they share only the evictor's copy destination).
        let Some(id) = lock(&self.fifo).pop() else {
            return Evicted::Nothing;
        };
        let Some(seg) = self.segs.get(id) else {
            return Evicted::Nothing;
        };
        let large = seg.mem.0.large.load(Ordering::Relaxed);
        let empty = seg.acct.0.live_items.load(Ordering::Acquire) == 0;
        if empty {
            // Nothing in it is referenced (everything was overwritten, deleted or
            // unlinked already): no need to look at its records.
        } else if large {
            if self.clean_large(id) {
                lock(&self.fifo).push(id, Queue::Main);
                return Evicted::Kept;
            }
        } else {
            self.clean(id);
        }
        self.st.0.segments_evicted.fetch_add(1, Ordering::Relaxed);
        self.retire(id);
        self.barrier();
        let over = self.allocated.load(Ordering::Relaxed) > self.budget();
        if !(release || large || over) {
            let mut ev = lock(&self.evictor);
            if ev.spare.is_none() {
                ev.spare = Some(id);
                return Evicted::Kept;
            }
        }
        let mut p = lock(&self.pool);
        if release || large || over {
            self.release(&mut p, id);
        } else {
            p.free.push(id);
        }
        Evicted::Freed
    }

    /// Decide the fate of one live slot `v` of a segment being evicted: count it and
    /// return whether to give it a second chance.
    fn evict_item(&self, r: &Rec<'_>, v: u64, now: Time, notes: &mut EvictionNotes) -> bool {
        match self.vis(r, now) {
            Vis::Live => {
                if index::freq(v) > 0 {
                    return true;
                }
                self.note_eviction_in(notes, r.key, r.cas);
                self.st.0.evictions.fetch_add(1, Ordering::Relaxed);
                if !index::fetched(v) {
                    self.st.0.evicted_unfetched.fetch_add(1, Ordering::Relaxed);
                }
                if r.exptime != 0 {
                    self.st.0.evicted_nonzero.fetch_add(1, Ordering::Relaxed);
                }
            }
            Vis::Expired | Vis::Flushed => {
                self.st.0.reclaimed.fetch_add(1, Ordering::Relaxed);
                if !index::fetched(v) {
                    self.st.0.expired_unfetched.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        false
    }

    /// Process every record of sealed segment `id` (popped from the FIFO, so ours). The
    /// evictor lock is taken per second-chance copy, inside the record's stripe lock.
    fn clean(&self, id: u32) {
        let now = self.clock.load(Ordering::Relaxed);
        let Some(seg) = self.segs.get(id) else { return };
        let Some(ptr) = NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire)) else {
            return;
        };
        let used = seg.mem.0.used.load(Ordering::Acquire);
        // SAFETY: the segment is sealed and owned by the evictor until it is freed below
        // our caller: nobody appends to it and it stays mapped.
        let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
        // Evictions are noted for replicas once per segment, not under each stripe lock.
        let mut notes = EvictionNotes::default();
        let mut off = SEG_HDR;
        while off < used {
            // SAFETY: as above; `used` is the published length.
            let Some(r) = (unsafe { format::read(ptr.as_ptr(), used, off, base) }) else {
                break;
            };
            let here = off;
            off += r.len;
            if r.kind != KIND_ITEM {
                continue;
            }
            let h = self.hash(r.key);
            let _g = self.index.lock(h);
            let Some((slot, v)) = self.index.find(h, |v| {
                index::slot_seg(v) == id && index::slot_off(v) == here
            }) else {
                continue;
            };
            if self.evict_item(&r, v, now, &mut notes) {
                let copied = self.copy_forward(&mut lock(&self.evictor), &r, v);
                if let Some(new_v) = copied {
                    self.relocate(slot, new_v);
                    self.account_remove(v, r.len);
                    self.st.0.copied_forward.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                self.note_eviction_in(&mut notes, r.key, r.cas);
                self.st.0.evictions.fetch_add(1, Ordering::Relaxed);
            }
            slot.store(0, Ordering::Release);
            self.account_remove(v, r.len);
        }
        self.note_evictions(notes);
    }

    /// Copy a second-chance item into the evictor's segment; its new slot value (access
    /// counter decremented), or None when there is no room without evicting.
    fn copy_forward(&self, ev: &mut Evictor, r: &Rec<'_>, v: u64) -> Option<u64> {
        let need = HDR_MAX + r.key.len() + r.value.len();
        let fits = ev.dest.is_some_and(|o| o.used + need <= o.cap);
        if !fits {
            if let Some(o) = ev.dest.take() {
                self.seal(o, Queue::Main);
            }
            let id = match ev.spare.take() {
                Some(id) => id,
                None => self.take_segment_no_evict()?,
            };
            ev.dest = Some(self.open_segment(id)?);
        }
        let o = ev.dest?;
        let d = self.dest(&o)?;
        if need > d.room {
            return None;
        }
        let spec = Spec {
            kind: KIND_ITEM,
            key: r.key,
            parts: [r.value, &[]],
            flags: r.flags,
            exptime: r.exptime,
            cas: r.cas,
            // A replica keeps the master's stamp: its copies must not outrank a later
            // rewrite of the same item on the master.
            stamp: if self.repl.replica.load(Ordering::Relaxed) {
                r.stamp
            } else {
                self.rewrite_stamp()
            },
            meta: r.meta,
            explicit_cas: r.explicit_cas,
        };
        // SAFETY: `need` bytes are free at `d.off` in the evictor's own open segment (we
        // hold the evictor lock); the source record lives in the segment being evicted.
        let len = unsafe { format::write(d.ptr.as_ptr().add(d.off), &spec, d.base) };
        ev.dest = Some(Open {
            used: o.used + len,
            ..o
        });
        if let Some(seg) = self.segs.get(o.id) {
            seg.mem.0.used.store(o.used + len, Ordering::Release);
        }
        self.account_add(o.id, len);
        let new_v = index::pack(
            index::slot_tag(v),
            o.id,
            d.off as u32,
            index::freq(v) - 1,
            index::fetched(v),
        ) | (v & index::WIN);
        Some(new_v)
    }

    /// A large segment reached the FIFO head: true if its item gets a second chance (it
    /// stays where it is and goes to the back of the FIFO).
    fn clean_large(&self, id: u32) -> bool {
        let now = self.clock.load(Ordering::Relaxed);
        let Some(seg) = self.segs.get(id) else {
            return false;
        };
        let Some(ptr) = NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire)) else {
            return false;
        };
        let used = seg.mem.0.used.load(Ordering::Acquire);
        // SAFETY: sealed large segment popped from the FIFO under the evictor lock: ours.
        let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
        // SAFETY: as above.
        let Some(r) = (unsafe { format::read(ptr.as_ptr(), used, SEG_HDR, base) }) else {
            return false;
        };
        let h = self.hash(r.key);
        let _g = self.index.lock(h);
        let Some((slot, v)) = self.index.find(h, |v| {
            index::slot_seg(v) == id && index::slot_off(v) == SEG_HDR
        }) else {
            return false;
        };
        let mut notes = EvictionNotes::default();
        let again = self.evict_item(&r, v, now, &mut notes);
        self.note_evictions(notes);
        if again {
            let f = index::freq(v) - 1;
            let nv = index::pack(index::slot_tag(v), id, SEG_HDR as u32, f, index::fetched(v))
                | (v & index::WIN);
            self.relocate(slot, nv);
            self.st.0.copied_forward.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        slot.store(0, Ordering::Release);
        self.account_remove(v, r.len);
        false
    }

    /// Point `slot` at the second-chance copy `new_v` of its item (under the key's stripe
    /// lock). `new_v` was computed from a value loaded earlier; readers may since have set
    /// the fetched or win bit by compare-exchange, and those must survive (a lost win mark
    /// would let a second reader win the same token).
    fn relocate(&self, slot: &AtomicU64, new_v: u64) {
        let keep = index::FETCHED | index::WIN;
        let _ = slot.fetch_update(Ordering::Release, Ordering::Relaxed, |x| {
            Some(new_v | (x & keep))
        });
    }

    /// Evict and release until the segment memory fits the budget.
    fn shrink(&self) {
        if self.allocated.load(Ordering::Relaxed) > self.budget() {
            let mut ev = lock(&self.evictor);
            if let Some(id) = ev.spare.take() {
                self.release(&mut lock(&self.pool), id);
            }
        }
        loop {
            if self.allocated.load(Ordering::Relaxed) <= self.budget() {
                return;
            }
            {
                let mut p = lock(&self.pool);
                if let Some(id) = p.free.pop() {
                    self.release(&mut p, id);
                    continue;
                }
            }
            if self.evict_one(true) == Evicted::Nothing && !self.unstick() {
                return;
            }
        }
    }

    /// Free sealed segments that hold no live item any more.
    fn free_dead_segments(&self) -> usize {
        let dead: Vec<u32> = {
            let mut fifo = lock(&self.fifo);
            let mut dead = Vec::new();
            fifo.retain(|id| {
                let empty = self
                    .segs
                    .get(id)
                    .is_some_and(|s| s.acct.0.live_items.load(Ordering::Acquire) == 0);
                if empty {
                    dead.push(id);
                }
                !empty
            });
            dead
        };
        if dead.is_empty() {
            return 0;
        }
        for &id in &dead {
            self.retire(id);
        }
        self.barrier();
        let mut p = lock(&self.pool);
        for &id in &dead {
            let large = self
                .segs
                .get(id)
                .is_some_and(|s| s.mem.0.large.load(Ordering::Relaxed));
            if large || self.allocated.load(Ordering::Relaxed) > self.budget() {
                self.release(&mut p, id);
            } else {
                p.free.push(id);
            }
        }
        dead.len()
    }

    /// A segment leaves the set a log reader may ship (before the barrier that precedes
    /// its reuse); its bytes count towards the log offset already shipped or lost.
    fn retire(&self, id: u32) {
        if let Some(seg) = self.segs.get(id) {
            if seg.mem.0.seq.swap(0, Ordering::AcqRel) != 0 {
                let used = seg.mem.0.used.load(Ordering::Acquire);
                self.retired_bytes.fetch_add(used as u64, Ordering::Relaxed);
            }
        }
    }

    fn seg_ids(&self) -> u32 {
        lock(&self.pool).next_id
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evicted {
    Nothing,
    Kept,
    Freed,
}

impl Drop for LogEngine {
    fn drop(&mut self) {
        let mut p = lock(&self.pool);
        for id in 0..p.next_id {
            self.release(&mut p, id);
        }
    }
}

impl Engine for LogEngine {
    fn get(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOptions,
        found: &mut dyn FnMut(ItemView<'_>),
    ) -> bool {
        self.tick(now);
        let h = self.hash(key);
        if let Some(exptime) = opts.touch {
            return self.touch_inner(key, h, exptime, now, Some(found));
        }
        let dead = {
            let _pin = self.pin();
            // SAFETY: pinned for as long as `r` is used (the callback included).
            let Some((slot, v, r)) = (unsafe { self.lookup(h, key) }) else {
                return false;
            };
            match self.vis(&r, now) {
                Vis::Live => {
                    if index::freq(v) < index::FREQ_MAX || !index::fetched(v) {
                        // Losing this race to a writer only loses one access mark.
                        let _ = slot.compare_exchange(
                            v,
                            index::bumped(v),
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                    }
                    self.index.set_atime(slot, now);
                    found(self.view(key, &r));
                    return true;
                }
                vis => (v, vis),
            }
        };
        self.count_dead(dead.1);
        self.unlink_dead(h, dead.0);
        false
    }

    fn delete(&self, key: &[u8], now: Time) -> bool {
        self.tick(now);
        self.delete_inner(key, self.hash(key), now)
    }

    fn touch(&self, key: &[u8], exptime: Time, now: Time) -> bool {
        self.tick(now);
        self.touch_inner(key, self.hash(key), exptime, now, None)
    }

    fn flush_all(&self, at: Time, now: Time) {
        self.tick(now);
        let _f = lock(&self.flush_lock);
        self.delayed_mark.store(0, Ordering::SeqCst);
        if at <= now || at == 1 {
            self.flush_deadline.store(0, Ordering::Release);
            self.flush_mark
                .fetch_max(self.next_cas.load(Ordering::SeqCst), Ordering::SeqCst);
        } else {
            self.flush_deadline.store(at - 1, Ordering::Release);
        }
    }

    fn set_max_bytes(&self, max_bytes: usize, now: Time) {
        self.tick(now);
        self.max_bytes.store(max_bytes, Ordering::Relaxed);
        self.shrink();
    }

    fn stats(&self) -> EngineStats {
        let mut items = 0;
        let mut bytes = 0;
        for id in 0..self.seg_ids() {
            if let Some(s) = self.segs.get(id) {
                items += s.acct.0.live_items.load(Ordering::Relaxed);
                bytes += s.acct.0.live_bytes.load(Ordering::Relaxed);
            }
        }
        let st = &self.st.0;
        EngineStats {
            bytes,
            curr_items: items,
            total_items: self
                .shard_items
                .iter()
                .map(|c| c.0.load(Ordering::Relaxed))
                .sum(),
            evictions: st.evictions.load(Ordering::Relaxed),
            reclaimed: st.reclaimed.load(Ordering::Relaxed),
            expired_unfetched: st.expired_unfetched.load(Ordering::Relaxed),
            evicted_unfetched: st.evicted_unfetched.load(Ordering::Relaxed),
            evicted_nonzero: st.evicted_nonzero.load(Ordering::Relaxed),
            get_expired: st.get_expired.load(Ordering::Relaxed),
            get_flushed: st.get_flushed.load(Ordering::Relaxed),
            limit_maxbytes: self.max_bytes.load(Ordering::Relaxed) as u64,
            total_malloced: self.allocated.load(Ordering::Relaxed) as u64,
            hash_power_level: u64::from(self.index.level()),
            hash_bytes: self.index.bytes() as u64,
            // A batch is under way while its steps are pending (or running right now).
            hash_is_expanding: self.grow_lock.try_lock().is_ok_and(|g| g.expanding),
        }
    }

    fn stats_detail(&self, group: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut put = |k: &str, v: u64| out.push((k.to_string(), v.to_string()));
        let st = &self.st.0;
        match group {
            "slabs" => {
                let (mut regular, mut large, mut large_bytes, mut used, mut live) = (0, 0, 0, 0, 0);
                for id in 0..self.seg_ids() {
                    let Some(s) = self.segs.get(id) else { continue };
                    if s.mem.0.ptr.load(Ordering::Relaxed).is_null() {
                        continue;
                    }
                    if s.mem.0.large.load(Ordering::Relaxed) {
                        large += 1;
                        large_bytes += s.mem.0.cap.load(Ordering::Relaxed) as u64;
                    } else {
                        regular += 1;
                    }
                    used += s.mem.0.used.load(Ordering::Relaxed).saturating_sub(SEG_HDR) as u64;
                    live += s.acct.0.live_bytes.load(Ordering::Relaxed);
                }
                let free = lock(&self.pool).free.len() as u64;
                let sealed = lock(&self.fifo).len() as u64;
                // memcached's summary names first: the log is one "slab class".
                put("active_slabs", 1);
                put("segment_size", self.seg_size as u64);
                put("segments_total", regular);
                put("segments_free", free);
                put("segments_sealed", sealed);
                put("large_items_segments", large);
                put("large_items_bytes", large_bytes);
                put("live_bytes", live);
                put("dead_bytes", used.saturating_sub(live));
                put("index_bytes", self.index.bytes() as u64);
                put("index_buckets", self.index.nmain() as u64);
                put("index_max_buckets", self.index.max_main() as u64);
                put("index_level", u64::from(self.index.level()));
                put("index_splits", st.index_splits.load(Ordering::Relaxed));
                put(
                    "index_overflow_buckets_used",
                    self.index.overflow_used() as u64,
                );
                put(
                    "total_malloced",
                    self.allocated.load(Ordering::Relaxed) as u64,
                );
            }
            "items" => {
                // memcached's names, per slab class; the log has one "class" (1).
                let ld = |c: &AtomicU64| c.load(Ordering::Relaxed);
                let evictions = ld(&st.evictions);
                let rows: [(&str, u64); 12] = [
                    ("number", self.stats().curr_items),
                    ("evicted", evictions),
                    ("evicted_nonzero", ld(&st.evicted_nonzero)),
                    ("evicted_unfetched", ld(&st.evicted_unfetched)),
                    ("reclaimed", ld(&st.reclaimed)),
                    ("expired_unfetched", ld(&st.expired_unfetched)),
                    ("outofmemory", 0),
                    ("evicted_clock", evictions - ld(&st.evicted_index)),
                    ("evicted_index_full", ld(&st.evicted_index)),
                    ("copied_forward", ld(&st.copied_forward)),
                    ("segments_evicted", ld(&st.segments_evicted)),
                    ("tombstones", ld(&st.tombstones)),
                ];
                for (name, value) in rows {
                    put(&format!("items:1:{name}"), value);
                }
            }
            _ => {}
        }
        out
    }

    fn reset_stats(&self) {
        let st = &self.st.0;
        for c in [
            &st.evictions,
            &st.evicted_index,
            &st.reclaimed,
            &st.expired_unfetched,
            &st.evicted_unfetched,
            &st.evicted_nonzero,
            &st.get_expired,
            &st.get_flushed,
            &st.copied_forward,
            &st.segments_evicted,
            &st.tombstones,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        for c in self.shard_items.iter() {
            c.0.store(0, Ordering::Relaxed);
        }
    }

    fn meta_get(
        &self,
        key: &[u8],
        now: Time,
        opts: MetaRead,
        found: &mut dyn FnMut(MetaItem<'_>),
    ) -> MetaGet {
        self.tick(now);
        if key.len() > MAX_KEY {
            return MetaGet::Miss;
        }
        let h = self.hash(key);
        for _ in 0..RETRIES {
            let step = match opts.touch {
                Some(t) => self.meta_touch(key, h, t, now, &opts, found),
                None => self.meta_read(key, h, now, &opts, found),
            };
            match step {
                Step::Done(r) => return r,
                Step::Retry => continue,
                Step::Missing => {}
            }
            let Some(exptime) = opts.vivify else {
                return MetaGet::Miss;
            };
            if self.too_large(key.len(), 0, 0) {
                return MetaGet::Miss;
            }
            // Create an empty item; this request holds its win token.
            let c = Commit {
                key,
                h,
                cond: Cond::Absent,
                src: Src::Bytes(&[]),
                old_len: 0,
                flags: Some(0),
                exptime: Some(exptime),
                keep_cas: false,
                keep_access: false,
                access: !opts.no_bump,
                meta: MetaW {
                    explicit_cas: opts.new_cas,
                    binary_key: Some(opts.binary_key),
                    win: Some(true),
                    ..MetaW::default()
                },
            };
            let mut show = |_: Option<(&AtomicU64, u64)>, r: &Rec<'_>| {
                found(MetaItem {
                    item: self.view(key, r),
                    exptime_before: 0,
                    last_access: now,
                    fetched: false,
                    stale: false,
                    win: Win::Won,
                    binary_key: opts.binary_key,
                })
            };
            match self.commit(&c, now, Some(&mut show)) {
                Outcome::Stored(_) => return MetaGet::Vivified,
                // Created meanwhile: read that one.
                Outcome::Failed(_) => continue,
                Outcome::NoMemory | Outcome::TooLarge => return MetaGet::Miss,
            }
        }
        MetaGet::Miss
    }

    fn meta_store(&self, req: MetaStoreRequest<'_>, now: Time) -> MetaStored {
        self.tick(now);
        let h = self.hash(req.key);
        let (result, len) = if req.key.len() > MAX_KEY
            || self.too_large(req.key.len(), req.value.len(), req.flags)
        {
            (StoreResult::TooLarge, req.value.len())
        } else {
            self.store_inner(&req, h, now)
        };
        if matches!(result, StoreResult::TooLarge | StoreResult::NoMemory)
            && req.mode == StoreMode::Set
            && req.key.len() <= MAX_KEY
        {
            // memcached drops the old item when a set is refused (no stale data).
            self.delete_inner(req.key, h, now);
        }
        MetaStored { result, len }
    }

    fn meta_delete(&self, key: &[u8], now: Time, req: MetaDelete) -> MetaDeleteResult {
        self.tick(now);
        if key.len() > MAX_KEY {
            return MetaDeleteResult::NotFound;
        }
        let h = self.hash(key);
        for _ in 0..RETRIES {
            let Some(p) = self.peek(h, key, now) else {
                self.tombstone_for_replicas(key, h);
                return MetaDeleteResult::NotFound;
            };
            if req.compare_cas.is_some_and(|c| c != p.cas) {
                return MetaDeleteResult::Exists;
            }
            if !req.remove_value && !req.invalidate {
                match self.delete_at(key, h, now, Some(p.ident)) {
                    Some(true) => return MetaDeleteResult::Deleted,
                    Some(false) => return MetaDeleteResult::NotFound,
                    None => continue,
                }
            }
            // `x` replaces the item by an empty one (a new item, keeping its CAS unless
            // `E` gives one); `I` rewrites it stale with a new CAS, keeping its value,
            // access bits and time. Both draw a new version and clear the win mark.
            let explicit_cas = if req.invalidate {
                req.new_cas
            } else {
                Some(req.new_cas.unwrap_or(p.cas))
            };
            let exptime = match (req.ttl, req.remove_value) {
                (Some(t), _) => Some(t),
                (None, true) => Some(0),
                (None, false) => None,
            };
            let c = Commit {
                key,
                h,
                cond: Cond::Loc(p.ident),
                src: if req.remove_value {
                    Src::Bytes(&[])
                } else {
                    Src::Old
                },
                old_len: p.value_len,
                flags: req.remove_value.then_some(req.flags),
                exptime,
                keep_cas: false,
                keep_access: !req.remove_value,
                access: false,
                meta: MetaW {
                    explicit_cas,
                    stale: Some(req.invalidate),
                    binary_key: None,
                    win: Some(false),
                    keep_atime: !req.remove_value,
                },
            };
            match self.commit(&c, now, None) {
                Outcome::Stored(_) => return MetaDeleteResult::Deleted,
                Outcome::Failed(Fail::Moved) => continue,
                Outcome::Failed(_) => return MetaDeleteResult::NotFound,
                Outcome::NoMemory | Outcome::TooLarge => return MetaDeleteResult::NotStored,
            }
        }
        MetaDeleteResult::NotFound
    }

    fn meta_arith(&self, key: &[u8], now: Time, req: MetaArith) -> MetaArithResult {
        self.tick(now);
        if key.len() > MAX_KEY {
            return MetaArithResult::NotFound;
        }
        self.arith_inner(key, self.hash(key), now, &req)
    }

    fn debug_item(&self, key: &[u8], now: Time) -> Option<DebugItem> {
        self.tick(now);
        if key.len() > MAX_KEY {
            return None;
        }
        let h = self.hash(key);
        let dead = {
            let _pin = self.pin();
            // SAFETY: pinned while `r` is used.
            let (slot, v, r) = unsafe { self.lookup(h, key) }?;
            match self.vis(&r, now) {
                Vis::Live => {
                    return Some(DebugItem {
                        exptime: r.exptime,
                        last_access: self.index.atime(slot, now),
                        cas: self.rec_cas(&r),
                        fetched: index::fetched(v),
                        value_len: r.value.len(),
                        flags: r.flags,
                        binary_key: r.meta & META_BINARY_KEY != 0,
                    })
                }
                vis => (v, vis),
            }
        };
        self.count_dead(dead.1);
        self.unlink_dead(h, dead.0);
        None
    }

    fn maintain(&self, now: Time, sweep: bool) -> u64 {
        self.tick(now);
        self.repl_log_evictions();
        let mut n = 0;
        // A bounded slice of the index per call, continuing where the last call stopped.
        let nmain = self.index.nmain();
        let chunk = if sweep {
            nmain.min(MAINTAIN_BUCKETS)
        } else {
            0
        };
        let start = self.maint_cursor.fetch_add(chunk, Ordering::Relaxed) % nmain;
        for i in 0..chunk {
            let b = (start + i) % nmain;
            let _g = self.index.lock_bucket(b);
            self.index.for_each_in_chain(b, |slot, v| {
                // SAFETY: we hold the stripe lock of this chain and `v` is in its slot.
                let Some(r) = (unsafe { self.rec(v) }) else {
                    return;
                };
                if self.vis(&r, now) != Vis::Live {
                    slot.store(0, Ordering::Release);
                    self.account_remove(v, r.len);
                    self.st.0.reclaimed.fetch_add(1, Ordering::Relaxed);
                    if !index::fetched(v) {
                        self.st.0.expired_unfetched.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                }
            });
        }
        self.free_dead_segments();
        self.grow(true);
        n
    }
}

/// Meta reads (`mg`).
impl LogEngine {
    /// The win a meta read gets from an item with slot value `x`, and `x` after the read
    /// (win mark set if it won, access recorded unless `no_bump`).
    fn meta_win(x: u64, stale: bool, recache: bool, no_bump: bool) -> (Win, u64) {
        let win = if x & index::WIN != 0 {
            Win::AlreadySent
        } else if stale || recache {
            Win::Won
        } else {
            Win::None
        };
        let mut n = x;
        if win == Win::Won {
            n |= index::WIN;
        }
        if !no_bump {
            n = index::bumped(n);
        }
        (win, n)
    }

    /// `mg` without `T`: a pinned read; the win mark and the access bits change by one
    /// compare-exchange on the slot, so exactly one reader wins a token.
    fn meta_read(
        &self,
        key: &[u8],
        h: u64,
        now: Time,
        opts: &MetaRead,
        found: &mut dyn FnMut(MetaItem<'_>),
    ) -> Step {
        let dead = {
            let _pin = self.pin();
            // SAFETY: pinned for as long as `r` is used (the callback included).
            let Some((slot, v, r)) = (unsafe { self.lookup(h, key) }) else {
                return Step::Missing;
            };
            match self.vis(&r, now) {
                Vis::Live => {
                    let stale = r.meta & META_STALE != 0;
                    let recache = opts
                        .recache
                        .is_some_and(|t| r.exptime != 0 && r.exptime < t);
                    let (win, nv) = Self::meta_win(v, stale, recache, opts.no_bump);
                    if nv != v {
                        let swapped = slot
                            .compare_exchange(v, nv, Ordering::Relaxed, Ordering::Relaxed)
                            .is_ok();
                        // Losing the race only loses an access mark, unless the win mark
                        // was at stake: then decide again on the current value.
                        if !swapped && win == Win::Won {
                            return Step::Retry;
                        }
                    }
                    let last_access = self.index.atime(slot, now);
                    if !opts.no_bump {
                        self.index.set_atime(slot, now);
                    }
                    found(MetaItem {
                        item: self.view(key, &r),
                        exptime_before: r.exptime,
                        last_access,
                        fetched: index::fetched(v),
                        stale,
                        win,
                        binary_key: r.meta & META_BINARY_KEY != 0,
                    });
                    return Step::Done(MetaGet::Hit);
                }
                vis => (v, vis),
            }
        };
        self.count_dead(dead.1);
        self.unlink_dead(h, dead.0);
        Step::Missing
    }

    /// `mg` with `T`: the touch rewrites the item (same CAS, marks and access state), and
    /// the same compare-exchange that installs the rewritten item sets the win mark when
    /// this request may win (see `apply`), so no reader sees the touched item without the
    /// mark of the win that came with it. Whether it won shows in the replaced slot value.
    fn meta_touch(
        &self,
        key: &[u8],
        h: u64,
        exptime: Time,
        now: Time,
        opts: &MetaRead,
        found: &mut dyn FnMut(MetaItem<'_>),
    ) -> Step {
        let Some(p) = self.peek(h, key, now) else {
            return Step::Missing;
        };
        let compared = if opts.recache_after_touch {
            exptime
        } else {
            p.exptime
        };
        let recache = opts.recache.is_some_and(|t| compared != 0 && compared < t);
        // `Loc` makes sure the rewritten item is the one peeked (stale mark included).
        let may_win = p.stale || recache;
        let c = Commit {
            key,
            h,
            cond: Cond::Loc(p.ident),
            src: Src::Old,
            old_len: p.value_len,
            flags: None,
            exptime: Some(exptime),
            keep_cas: true,
            keep_access: true,
            access: !opts.no_bump,
            meta: MetaW {
                stale: None,
                binary_key: None,
                win: may_win.then_some(true),
                keep_atime: true,
                ..MetaW::default()
            },
        };
        let mut show = |prev: Option<(&AtomicU64, u64)>, r: &Rec<'_>| {
            let (mut win, mut fetched, mut last_access) = (Win::None, false, now);
            if let Some((slot, x)) = prev {
                win = if x & index::WIN != 0 {
                    Win::AlreadySent
                } else if may_win {
                    Win::Won
                } else {
                    Win::None
                };
                fetched = index::fetched(x);
                last_access = self.index.atime(slot, now);
                if !opts.no_bump {
                    self.index.set_atime(slot, now);
                }
            }
            found(MetaItem {
                item: self.view(key, r),
                exptime_before: p.exptime,
                last_access,
                fetched,
                stale: r.meta & META_STALE != 0,
                win,
                binary_key: r.meta & META_BINARY_KEY != 0,
            });
        };
        match self.commit(&c, now, Some(&mut show)) {
            Outcome::Stored(_) => Step::Done(MetaGet::Hit),
            Outcome::Failed(Fail::Moved) => Step::Retry,
            Outcome::Failed(_) => Step::Missing,
            // No room to rewrite it (no_evict, full): as a touch, a miss.
            Outcome::NoMemory | Outcome::TooLarge => Step::Done(MetaGet::Miss),
        }
    }
}
