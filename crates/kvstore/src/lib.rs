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

mod hashmap;
mod log;
#[doc(hidden)]
pub mod model;

pub use hashmap::HashMapEngine;
pub use log::LogEngine;

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
}

/// The interface every storage engine implements: one method per kind of command.
///
/// Implementations must be safe to call from many threads at once, must never panic on
/// any key or value they are given, and must never return an expired or flushed item.
pub trait Engine: Send + Sync + 'static {
    /// Look up `key`; on a hit call `found` with the item (after applying `opts`) and
    /// return true. A hit counts as an access for eviction.
    fn get(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOptions,
        found: &mut dyn FnMut(ItemView<'_>),
    ) -> bool;

    /// Store an item.
    fn store(&self, req: StoreRequest<'_>, now: Time) -> StoreResult;

    /// Remove `key`; true if a live item was removed.
    fn delete(&self, key: &[u8], now: Time) -> bool;

    /// Add (`incr`) or subtract (`decr`) `delta` to the decimal number stored under `key`.
    /// Incr wraps at 2^64; decr stops at 0. The result is stored as decimal text; the item
    /// gets a new CAS unique and keeps its flags and expiry.
    fn arith(&self, key: &[u8], incr: bool, delta: u64, now: Time) -> ArithResult;

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

    /// Reclaim expired items in the background; called periodically by the server.
    /// Returns how many items were reclaimed.
    fn maintain(&self, now: Time) -> u64;
}
