//! Item storage for kvcached: the engines, behind one small interface ([`Engine`]).
//!
//! This crate owns items (key, value, client flags, expiry, CAS unique) and the memory they
//! live in. It knows nothing of protocols, sockets or threads that call it: callers give it
//! keys, values and absolute times, and it answers with plain result values. Every method
//! may be called from many threads at once.
//!
//! Times are whole unix seconds ([`Time`]) supplied by the caller, so that tests can drive
//! the clock. An item's `exptime` is absolute: 0 means "never expires", and an item with
//! `0 < exptime <= now` is expired and never returned.

pub mod flash;
mod log;
#[doc(hidden)]
pub mod model;
mod number;

pub use log::lease::{LeaseSite, ValueLease};
pub use log::repl::{
    Applied, ReplError, ReplicaState, Served, WHY_CURSOR, WHY_FRESH, WHY_IMPOSSIBLE,
    WHY_UNFINISHED_GONE, WHY_UNREAD_GONE, WHY_WIPED,
};
pub use log::snapshot::{
    join_snapshot_frames, split_snapshot_frames, SnapshotError, SnapshotInfo, SnapshotSettings,
    SNAPSHOT_VERSION,
};
pub use log::tally::Band as SizeBand;
pub use log::walk::Digest;
pub use log::{
    AccountingError, EvictionObserver, FlashAttachError, FlashIo, FlashRead, FlashRestore,
    FlashStats, IndexLayout, LogEngine, DEFAULT_SIZE_FACTOR,
};

/// Unix time in whole seconds.
pub type Time = u32;

/// Settings shared by the engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Bytes of item memory (memcached's `-m`).
    pub max_bytes: usize,
    /// Largest item in bytes as memcached counts it against `-I`, header, key and value
    /// together ([`EngineConfig::item_size`]): a store of a larger item is
    /// [`StoreResult::TooLarge`]; an append/prepend whose result would be larger is
    /// [`StoreResult::NotStored`] (memcached.c `do_store_item`).
    pub max_item_size: usize,
    /// When memory is full: evict (false), or refuse writes with [`StoreResult::NoMemory`]
    /// (true; memcached's `-M`).
    pub no_evict: bool,
    /// Assign CAS uniques (false: memcached's `-C`; every item then has CAS 0).
    pub use_cas: bool,
}

impl EngineConfig {
    /// The size memcached gives an item when it checks it against `-I` (items.c
    /// `item_make_header`, `do_item_alloc`): a 48-byte header, the key and a NUL, the value
    /// and "\r\n", 4 bytes of client flags when they are not 0, and 8 bytes of CAS unique
    /// when CAS is on. (So with `-I 1m` and a 1-byte key, values up to 2^20 - 60 fit.)
    pub fn item_size(&self, key_len: usize, value_len: usize, flags: u32) -> usize {
        let extra = 48 + 1 + 2 + if flags != 0 { 4 } else { 0 } + if self.use_cas { 8 } else { 0 };
        key_len.saturating_add(value_len).saturating_add(extra)
    }
}

/// A borrowed view of a stored item, valid for the duration of a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemView<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    /// Absolute expiry time, 0 for never.
    pub exptime: Time,
    pub cas: u64,
    /// Where the value lives, if it can be leased ([`ItemView::lease`]).
    pub site: Option<LeaseSite<'a>>,
}

impl ItemView<'_> {
    /// Hold the value past the callback, without copying it: its bytes stay readable and
    /// unchanged until the lease is dropped, whatever happens to the item meanwhile (a
    /// server sends a large value from the cache's memory this way). `None` when this view
    /// cannot be leased (the reference model, a write's view) or the memory leases may
    /// hold is taken (at most an eighth of the limit): copy the value instead.
    pub fn lease(&self) -> Option<ValueLease> {
        self.site.as_ref()?.lease(self.value)
    }
}

/// How a store request treats an existing item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// Store unconditionally.
    Set,
    /// Store only if the key is absent.
    Add,
    /// Store only if the key is present.
    Replace,
    /// Append the value to the present item (flags and exptime of the item are kept).
    Append,
    /// Prepend the value to the present item (flags and exptime of the item are kept).
    Prepend,
    /// Store only if the present item's CAS unique equals this one.
    Cas(u64),
}

/// A write request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreRequest<'a> {
    pub mode: StoreMode,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    /// Absolute expiry time, 0 for never. A time in the past stores an item that is
    /// immediately expired (it still replaces the old one, as in memcached).
    pub exptime: Time,
}

/// The outcome of a store request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreResult {
    /// Stored; carries the new item's CAS unique.
    Stored(u64),
    /// The mode's condition failed (add: present; replace/append/prepend: absent).
    NotStored,
    /// cas: the item's CAS unique differs.
    Exists,
    /// cas: no such item.
    NotFound,
    /// The item is larger than the engine can ever hold.
    TooLarge,
    /// No memory and eviction is off (or could free nothing).
    NoMemory,
}

/// The outcome of incr/decr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithResult {
    /// The new value.
    Value(u64),
    NotFound,
    /// The stored value is not a decimal unsigned 64-bit number.
    NonNumeric,
    NoMemory,
}

/// What happens on a read besides returning the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadOptions {
    /// Set the item's expiry to this absolute time as part of the read (`gat`, `touch`).
    pub touch: Option<Time>,
}

/// Counters an engine keeps, in memcached's names where one exists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Bytes used by live items (memcached's `bytes`).
    pub bytes: u64,
    pub curr_items: u64,
    pub total_items: u64,
    pub evictions: u64,
    /// Expired items whose memory was reused.
    pub reclaimed: u64,
    /// Of those, the ones the background sweep found (memcached's LRU crawler).
    pub crawler_reclaimed: u64,
    /// Items the background sweep looked at.
    pub crawler_items_checked: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    /// Items evicted while they had a non-zero expiry still in the future.
    pub evicted_nonzero: u64,
    /// Reads that found an expired item.
    pub get_expired: u64,
    /// Reads that found a flushed item.
    pub get_flushed: u64,
    /// Memory limit in bytes.
    pub limit_maxbytes: u64,
    /// Bytes of item memory held by the engine (allocated, live or not).
    pub total_malloced: u64,
    /// memcached's `hash_power_level`: log2 of the hash index's main buckets (0 for an
    /// engine without one).
    pub hash_power_level: u64,
    /// memcached's `hash_bytes`: bytes of the hash index.
    pub hash_bytes: u64,
    /// memcached's `hash_is_expanding`: the index is growing right now.
    pub hash_is_expanding: bool,
}

// ---------------------------------------------------------------------------------------------
// Meta protocol (`mg`, `ms`, `md`, `ma`, `me`): richer requests and answers.
//
// memcached's meta commands need more than the classic methods give: the state of an item
// before the request touched it (`h`, `l`, `t` in request order), a per-item "stale" mark and
// "win token sent" mark (stale-while-revalidate), creating items on a miss (vivify), explicit
// CAS values (`E`), and checks and changes made atomically with the lookup. The classic
// store and arith are the meta ones with no options ([`Engine::store`], [`Engine::arith`]), so
// an engine has one write path and one arithmetic path.

/// Whether a meta read handed out the item's "win" token (the right to recache it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Win {
    /// No token involved.
    #[default]
    None,
    /// This request won (`W`): it created the item, or `R` matched, or the item is stale;
    /// the item is now marked "token sent".
    Won,
    /// A token was already handed out for this item (`Z`); this request did not win.
    AlreadySent,
}

/// What [`Engine::meta_get`] does besides looking `key` up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaRead {
    /// `T`: set a found item's expiry to this (a created item takes [`MetaRead::vivify`]).
    pub touch: Option<Time>,
    /// `u`: neither mark the item fetched nor update its access time.
    pub no_bump: bool,
    /// `N`: on a miss, create an empty item (flags 0) expiring at this time; the request wins.
    pub vivify: Option<Time>,
    /// `R`: a found item whose expiry is non-zero and earlier than this wins, unless a token
    /// was already sent for it.
    pub recache: Option<Time>,
    /// Compare `recache` with the expiry after `touch` (the request had `T` before `R`),
    /// instead of the expiry before it.
    pub recache_after_touch: bool,
    /// `E`: the CAS unique of a created item (else the next one).
    pub new_cas: Option<u64>,
    /// `b`: a created item has a binary key (echoed in base64).
    pub binary_key: bool,
}

/// A found (or created) item as [`Engine::meta_get`] shows it, valid during the callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaItem<'a> {
    /// The item after this read (touch applied).
    pub item: ItemView<'a>,
    /// Its expiry before this read (0 for a created item).
    pub exptime_before: Time,
    /// `N` created it (an empty item).
    pub created: bool,
    /// When it was last stored or accessed, before this read.
    pub last_access: Time,
    /// Whether it had been fetched before this read.
    pub fetched: bool,
    /// Marked stale (`md ... I`, or `ms ... I` with an older CAS).
    pub stale: bool,
    pub win: Win,
    /// Stored with a binary (base64) key.
    pub binary_key: bool,
}

/// The outcome of [`Engine::meta_get`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaGet {
    Hit,
    Miss,
    /// Missed and created an empty item (`N`); the callback saw it.
    Vivified,
}

/// A meta store (`ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaStoreRequest<'a> {
    /// The classic mode; `Cas(c)` for `ms` in set or replace mode with `C`.
    pub mode: StoreMode,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    /// Absolute expiry (for append/prepend only used when `vivify` creates the item).
    pub exptime: Time,
    /// `C` with append/prepend: a non-zero value that differs from the item's CAS is
    /// [`StoreResult::Exists`]. Ignored by the other modes (`Cas` carries its own).
    pub compare_cas: Option<u64>,
    /// `E`: the stored item's CAS unique (else the next one).
    pub new_cas: Option<u64>,
    /// `I` with `Cas(c)`: a non-zero `c` *lower* than the item's CAS also stores, and the
    /// new item is stale, keeping the old expiry and "token sent" mark.
    pub invalidate: bool,
    /// `N` with append/prepend: on a miss, store the value as a new item.
    pub vivify: bool,
    /// `b`: the key is binary (echoed in base64).
    pub binary_key: bool,
}

/// The outcome of [`Engine::meta_store`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaStored {
    pub result: StoreResult,
    /// Length of the stored value (after append/prepend); the request's when not stored.
    pub len: usize,
}

/// A meta delete (`md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaDelete {
    /// `C`: act only if the item's CAS equals this, else [`MetaDeleteResult::Exists`].
    pub compare_cas: Option<u64>,
    /// `E`: the CAS unique of an invalidated or emptied item.
    pub new_cas: Option<u64>,
    /// `I`: instead of removing, mark the item stale, clear its "token sent" mark and give it
    /// a new CAS (`new_cas`, else the next one); with `ttl`, also set its expiry.
    pub invalidate: bool,
    /// `x`: replace the item by an empty one with `flags`, expiry `ttl` (else never) and the
    /// CAS `new_cas` (else the old item's), instead of removing it.
    pub remove_value: bool,
    /// `T`, for `invalidate` and `remove_value`.
    pub ttl: Option<Time>,
    /// `F`, for `remove_value`.
    pub flags: u32,
}

/// The outcome of [`Engine::meta_delete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaDeleteResult {
    /// Removed, invalidated or emptied.
    Deleted,
    NotFound,
    /// `compare_cas` differs.
    Exists,
    /// `remove_value` could not store the empty item.
    NotStored,
}

/// A meta arithmetic request (`ma`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaArith {
    pub incr: bool,
    pub delta: u64,
    /// `C`: a non-zero value that differs from the item's CAS is [`MetaArithResult::Exists`]
    /// (checked after an empty value, or one memcached would store in chunks, is found
    /// non-numeric, before the number is parsed).
    pub compare_cas: Option<u64>,
    /// `E`: the CAS unique of the changed or created item.
    pub new_cas: Option<u64>,
    /// `N`/`J`: on a miss, create the item with this expiry and this number (no delta applied).
    pub vivify: Option<(Time, u64)>,
    /// `T`: set a found item's expiry.
    pub touch: Option<Time>,
    /// `b`: a created item has a binary key.
    pub binary_key: bool,
}

/// The outcome of [`Engine::meta_arith`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaArithResult {
    Value {
        /// The new number (or the initial one when created).
        value: u64,
        /// The item's CAS unique now.
        cas: u64,
        /// Its expiry before the request (0 when created), and now.
        exptime_before: Time,
        exptime: Time,
        created: bool,
    },
    NotFound,
    /// `compare_cas` differs.
    Exists,
    NonNumeric,
    NoMemory,
}

/// What `me` shows of an item ([`Engine::debug_item`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugItem {
    pub exptime: Time,
    /// Last store or access time.
    pub last_access: Time,
    pub cas: u64,
    pub fetched: bool,
    pub value_len: usize,
    pub flags: u32,
    pub binary_key: bool,
}

/// One live item as [`LogEngine::scan`] and the eviction observer see it: its key and what
/// `me` shows of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanItem<'a> {
    pub key: &'a [u8],
    pub meta: DebugItem,
}

/// Where a [`LogEngine::scan`] of many calls continues. It keeps the index's addressing as
/// the scan found it, so that items a split moves while the scan runs are neither seen
/// twice nor missed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanCursor {
    /// The next bucket to visit, under `addressing`.
    pub(crate) bucket: usize,
    /// The index's addressing when the scan started; None before its first call.
    pub(crate) addressing: Option<u64>,
}

/// The interface of the storage engine ([`LogEngine`]; the reference model
/// [`model::Model`] implements it too, for the property tests).
///
/// Implementations must be safe to call from many threads at once, must never panic on
/// any key or value they are given, and must never return an expired or flushed item.
pub trait Engine: Send + Sync + 'static {
    /// Look up `key`; on a hit call `found` with the item (after applying `opts`) and
    /// return true. A hit counts as an access for eviction. (The classic read has its own
    /// method because it is the hot path: it needs none of [`Engine::meta_get`]'s state.)
    fn get(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOptions,
        found: &mut dyn FnMut(ItemView<'_>),
    ) -> bool;

    /// Store an item: [`Engine::meta_store`] with no meta options.
    fn store(&self, req: StoreRequest<'_>, now: Time) -> StoreResult {
        let req = MetaStoreRequest {
            mode: req.mode,
            key: req.key,
            value: req.value,
            flags: req.flags,
            exptime: req.exptime,
            compare_cas: None,
            new_cas: None,
            invalidate: false,
            vivify: false,
            binary_key: false,
        };
        self.meta_store(req, now).result
    }

    /// Remove `key`; true if a live item was removed.
    fn delete(&self, key: &[u8], now: Time) -> bool;

    /// Add (`incr`) or subtract (`decr`) `delta` to the decimal number stored under `key`.
    /// Incr wraps at 2^64; decr stops at 0. The result is stored as decimal text; the item
    /// gets a new CAS unique and keeps its flags and expiry. [`Engine::meta_arith`] with no
    /// meta options.
    fn arith(&self, key: &[u8], incr: bool, delta: u64, now: Time) -> ArithResult {
        let req = MetaArith {
            incr,
            delta,
            ..MetaArith::default()
        };
        match self.meta_arith(key, now, req) {
            MetaArithResult::Value { value, .. } => ArithResult::Value(value),
            MetaArithResult::NotFound | MetaArithResult::Exists => ArithResult::NotFound,
            MetaArithResult::NonNumeric => ArithResult::NonNumeric,
            MetaArithResult::NoMemory => ArithResult::NoMemory,
        }
    }

    /// Set the expiry of `key`; true if the item exists.
    fn touch(&self, key: &[u8], exptime: Time, now: Time) -> bool;

    /// Invalidate items: with `at <= now`, every item stored or accessed up to now
    /// immediately; with a future `at`, every item last stored or accessed at or before
    /// `at - 1` once the clock reaches `at - 1` (memcached's delayed `flush_all`).
    fn flush_all(&self, at: Time, now: Time);

    /// Change the memory limit at run time (`cache_memlimit`); shrinking evicts.
    fn set_max_bytes(&self, max_bytes: usize, now: Time);

    /// A snapshot of the engine's counters.
    fn stats(&self) -> EngineStats;

    /// Engine-specific statistics as (name, value) pairs, for `stats slabs` / `stats items`.
    fn stats_detail(&self, group: &str) -> Vec<(String, String)>;

    /// Reset the counters that `stats reset` resets (not item counts or memory).
    fn reset_stats(&self);

    /// From now on, tally live items by their size as memcached counts it
    /// ([`EngineConfig::item_size`]): per band, the bands' upper bounds (inclusive,
    /// ascending, at most 64; a larger item counts in the last) being `bounds`, and with
    /// `steps` per 32 bytes of size too. Items already stored are counted once, so call it
    /// before serving. An engine that cannot tally ignores it.
    fn tally_sizes(&self, bounds: &[u32], steps: bool) {
        let _ = (bounds, steps);
    }

    /// The tally's bands, in order (empty without [`Engine::tally_sizes`]).
    fn size_bands(&self) -> Vec<SizeBand> {
        Vec::new()
    }

    /// (size rounded up to 32, live items) for every 32-byte step that holds items; `None`
    /// unless [`Engine::tally_sizes`] asked for steps.
    fn size_steps(&self) -> Option<Vec<(usize, u64)>> {
        None
    }

    /// `mg`: look `key` up with the meta options; on a hit (or a creation by `vivify`) call
    /// `found`. A hit counts as an access unless `no_bump`.
    fn meta_get(
        &self,
        key: &[u8],
        now: Time,
        opts: MetaRead,
        found: &mut dyn FnMut(MetaItem<'_>),
    ) -> MetaGet;

    /// `ms`: store with the meta options.
    fn meta_store(&self, req: MetaStoreRequest<'_>, now: Time) -> MetaStored;

    /// `md`: delete, invalidate or empty `key`.
    fn meta_delete(&self, key: &[u8], now: Time, req: MetaDelete) -> MetaDeleteResult;

    /// `ma`: incr/decr with the meta options.
    fn meta_arith(&self, key: &[u8], now: Time, req: MetaArith) -> MetaArithResult;

    /// `me`: what is known of `key`'s item, without counting an access.
    fn debug_item(&self, key: &[u8], now: Time) -> Option<DebugItem>;

    /// Background upkeep, called periodically by the server. With `sweep`, also reclaim
    /// expired items (a bounded slice per call; memcached's LRU crawler, which
    /// `-o no_lru_crawler` turns off). Returns how many items were reclaimed.
    fn maintain(&self, now: Time, sweep: bool) -> u64;
}
