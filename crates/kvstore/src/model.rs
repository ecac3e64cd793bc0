//! A reference model of an engine, for tests of any engine.
//!
//! [`Model`] keeps items in a `BTreeMap` behind one mutex, never evicts, and spells out
//! memcached's semantics as plainly as possible, so that an engine's replies can be
//! compared with it operation by operation. It implements [`Engine`], so tests can drive
//! both through the same code.
//!
//! What it fixes, beyond the [`Engine`] documentation (memcached 1.6 facts):
//!
//! * Every lookup (get, touch, store, delete, incr/decr) that finds an expired or flushed
//!   item unlinks it and counts `get_expired` / `get_flushed` (items.c `do_item_get`);
//!   flushed is checked before expired; a set (classic or meta) whose key held such an
//!   item also counts it `reclaimed` (and `expired_unfetched` if it was never fetched), as
//!   memcached counts the expired item its allocation takes. Nothing else removes items, except
//!   [`Engine::maintain`], which removes every dead item.
//! * A version counter starting at 1 is drawn once per successful mutation (store, incr,
//!   decr); it is the CAS unique when CAS is on (else CAS is 0). An immediate flush
//!   invalidates every version drawn so far; a delayed flush at `at` invalidates items
//!   whose last write is at most `at - 1` once `now >= at - 1`
//!   (items.c `item_is_flushed`); an immediate flush cancels a pending delayed one
//!   (proto_text.c sets `oldest_live` either way).
//! * An item's last access (meta `l`, `me`'s `la`) is when it was last written: a store, a
//!   touch to a new expiry, `mg ... T` to a new expiry, `md ... I`, arithmetic; reads do
//!   not change it (memcached's moves on the second read after a write: a log engine keeps
//!   no per-item read time, docs/COMPATIBILITY.md). A failed or too-large `set` removes the
//!   old item (proto_parser.c `process_update_cmd_start`).
//! * `cas` on a missing item → NotFound; with unique 0 or a different unique → Exists.
//! * An item larger than `max_item_size` as memcached counts it
//!   ([`EngineConfig::item_size`]: header, key, value, flags, CAS) → TooLarge, as is one
//!   whose charge exceeds `max_bytes`.
//! * `append`/`prepend` keep flags and expiry, get a new version; if the joined item is
//!   too large (by the same rules, with the old item's flags) → NotStored (memcached.c
//!   `do_store_item`: the joined item cannot be allocated).
//! * incr/decr parse the value like `strtoull` (see `strtoull` below); the new number is
//!   written in place, padded with spaces to the old length, when it is no longer than
//!   the old value (memcached.c `do_add_delta`), else as a new item (counted in
//!   `total_items`); both get a new version and keep flags and expiry.
//! * `stats reset` zeroes `total_items` too (memcached keeps it in `struct stats`).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::{
    DebugItem, Engine, EngineConfig, EngineStats, ItemView, MetaArith, MetaArithResult, MetaDelete,
    MetaDeleteResult, MetaGet, MetaItem, MetaRead, MetaStoreRequest, MetaStored, ReadOptions,
    StoreMode, StoreResult, Time, Win,
};

/// One item of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelItem {
    pub value: Vec<u8>,
    pub flags: u32,
    pub exptime: Time,
    /// Version drawn when the item was last written (its CAS unique when CAS is on).
    pub version: u64,
    /// When the item was last written (stored, touched to a new expiry, rewritten): the
    /// engine keeps no per-item read time, so the meta protocol's last access is this.
    pub atime: Time,
    pub fetched: bool,
    /// Meta: marked stale (`md ... I`, or a stale `ms ... I`).
    pub stale: bool,
    /// Meta: a win token was handed out.
    pub token_sent: bool,
    /// Meta: stored with a binary (base64) key.
    pub binary_key: bool,
    /// Meta: an explicit CAS unique (`E`, or the old one kept by `md ... x`); only with CAS on.
    pub cas: Option<u64>,
}

#[derive(Debug, Clone, Default)]
struct State {
    items: BTreeMap<Vec<u8>, ModelItem>,
    next_version: u64,
    flush_version: u64,
    oldest_live: Option<Time>,
    max_bytes: usize,
    stats: EngineStats,
}

/// The reference model. See the module documentation.
#[derive(Debug)]
pub struct Model {
    config: EngineConfig,
    use_cas: bool,
    overhead: usize,
    state: Mutex<State>,
}

impl Clone for Model {
    fn clone(&self) -> Self {
        Model {
            config: self.config.clone(),
            use_cas: self.use_cas,
            overhead: self.overhead,
            state: Mutex::new(self.lock().clone()),
        }
    }
}

/// `strtoull(value, &end, 10)` as memcached's `safe_strtoull` judges it: the value reads
/// as a C string (it ends at a NUL, or at the "\r\n" that follows it in the item).
fn strtoull(value: &[u8]) -> Option<u64> {
    let is_space = |b: &u8| b" \t\n\x0b\x0c\r".contains(b);
    let s = value.split(|&b| b == 0).next().unwrap_or(&[]);
    let s = &s[s.iter().take_while(|b| is_space(b)).count()..];
    let (neg, s) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if n == 0 {
        return None;
    }
    if let Some(next) = s.get(n) {
        if !is_space(next) {
            return None;
        }
    }
    let digits = std::str::from_utf8(&s[..n]).ok()?.trim_start_matches('0');
    let v: u64 = if digits.is_empty() {
        0
    } else if digits.len() > 20 {
        return None;
    } else {
        digits.parse().ok()?
    };
    if neg {
        let v = 0u64.wrapping_sub(v);
        if (v as i64) < 0 {
            return None;
        }
        return Some(v);
    }
    Some(v)
}

impl Model {
    /// A model with `config`'s item size limit and CAS setting; it never runs out of
    /// memory (only values larger than `max_bytes` are refused).
    pub fn new(config: EngineConfig) -> Self {
        Self::with_overhead(config, 0)
    }

    /// Like [`Model::new`], charging `overhead` bytes per item on top of key and value
    /// (for `bytes` and for the "larger than `max_bytes`" rule).
    pub fn with_overhead(config: EngineConfig, overhead: usize) -> Self {
        Model {
            use_cas: config.use_cas,
            overhead,
            state: Mutex::new(State {
                next_version: 1,
                max_bytes: config.max_bytes,
                ..State::default()
            }),
            config,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stored item under `key`, live or not, without touching it.
    pub fn peek(&self, key: &[u8]) -> Option<ModelItem> {
        self.lock().items.get(key).cloned()
    }

    /// The CAS unique `key` would show now (0 if absent or CAS is off).
    pub fn cas_of(&self, key: &[u8]) -> u64 {
        match self.peek(key) {
            Some(it) => self.cas(&it),
            None => 0,
        }
    }

    /// Drop `key` without counting anything (an engine under test evicted it).
    pub fn forget(&self, key: &[u8]) {
        self.lock().items.remove(key);
    }

    fn cas(&self, it: &ModelItem) -> u64 {
        if self.use_cas {
            it.cas.unwrap_or(it.version)
        } else {
            0
        }
    }

    /// An explicit CAS unique to keep: only when CAS is on.
    fn explicit(&self, cas: Option<u64>) -> Option<u64> {
        cas.filter(|_| self.use_cas)
    }

    fn too_large(&self, key: &[u8], value_len: usize, flags: u32, max_bytes: usize) -> bool {
        self.config.item_size(key.len(), value_len, flags) > self.config.max_item_size
            || self.charge(key, value_len) > max_bytes
    }

    fn charge(&self, key: &[u8], value_len: usize) -> usize {
        key.len() + value_len + self.overhead
    }
}

impl State {
    fn is_flushed(&self, it: &ModelItem, now: Time) -> bool {
        it.version <= self.flush_version
            || self.oldest_live.is_some_and(|t| it.atime <= t && t <= now)
    }

    fn is_expired(it: &ModelItem, now: Time) -> bool {
        it.exptime != 0 && it.exptime <= now
    }

    /// The live item under `key`; a dead one is removed and counted.
    fn live(&mut self, key: &[u8], now: Time) -> Option<&mut ModelItem> {
        let it = self.items.get(key)?;
        if self.is_flushed(it, now) {
            self.items.remove(key);
            self.stats.get_flushed += 1;
            return None;
        }
        if Self::is_expired(it, now) {
            self.items.remove(key);
            self.stats.get_expired += 1;
            return None;
        }
        self.items.get_mut(key)
    }

    fn version(&mut self) -> u64 {
        let v = self.next_version;
        self.next_version += 1;
        v
    }
}

impl Engine for Model {
    fn get(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOptions,
        found: &mut dyn FnMut(ItemView<'_>),
    ) -> bool {
        let mut st = self.lock();
        let Some(it) = st.live(key, now) else {
            return false;
        };
        if let Some(e) = opts.touch {
            // A new expiry rewrites the item; the same one is only a read.
            if e != it.exptime {
                it.atime = now;
            }
            it.exptime = e;
        }
        it.fetched = true;
        found(ItemView {
            key,
            value: &it.value,
            flags: it.flags,
            exptime: it.exptime,
            cas: self.cas(it),
            site: None,
        });
        true
    }

    fn delete(&self, key: &[u8], now: Time) -> bool {
        let mut st = self.lock();
        st.live(key, now).is_some() && st.items.remove(key).is_some()
    }

    fn meta_get(
        &self,
        key: &[u8],
        now: Time,
        opts: MetaRead,
        found: &mut dyn FnMut(MetaItem<'_>),
    ) -> MetaGet {
        let mut st = self.lock();
        if let Some(it) = st.live(key, now) {
            let exptime_before = it.exptime;
            if let Some(t) = opts.touch {
                if t != it.exptime {
                    it.atime = now;
                }
                it.exptime = t;
            }
            let (last_access, fetched) = (it.atime, it.fetched);
            let compared = if opts.recache_after_touch {
                opts.touch.unwrap_or(exptime_before)
            } else {
                exptime_before
            };
            let recache = opts.recache.is_some_and(|r| compared != 0 && compared < r);
            let win = if it.token_sent {
                Win::AlreadySent
            } else if it.stale || recache {
                it.token_sent = true;
                Win::Won
            } else {
                Win::None
            };
            if !opts.no_bump {
                it.fetched = true;
            }
            let stale = it.stale;
            let binary_key = it.binary_key;
            found(MetaItem {
                item: ItemView {
                    key,
                    value: &it.value,
                    flags: it.flags,
                    exptime: it.exptime,
                    cas: self.cas(it),
                    site: None,
                },
                exptime_before,
                created: false,
                last_access,
                fetched,
                stale,
                win,
                binary_key,
            });
            return MetaGet::Hit;
        }
        let Some(exptime) = opts.vivify else {
            return MetaGet::Miss;
        };
        if self.too_large(key, 0, 0, st.max_bytes) {
            return MetaGet::Miss;
        }
        let version = st.version();
        let it = ModelItem {
            value: Vec::new(),
            flags: 0,
            exptime,
            version,
            atime: now,
            fetched: !opts.no_bump,
            stale: false,
            token_sent: true,
            binary_key: opts.binary_key,
            cas: self.explicit(opts.new_cas),
        };
        found(MetaItem {
            item: ItemView {
                key,
                value: &[],
                flags: 0,
                exptime,
                cas: self.cas(&it),
                site: None,
            },
            exptime_before: 0,
            created: true,
            last_access: now,
            fetched: false,
            stale: false,
            win: Win::Won,
            binary_key: opts.binary_key,
        });
        st.items.insert(key.to_vec(), it);
        st.stats.total_items += 1;
        MetaGet::Vivified
    }

    fn meta_store(&self, req: MetaStoreRequest<'_>, now: Time) -> MetaStored {
        let mut st = self.lock();
        let key = req.key;
        let len = req.value.len();
        let done = |result| MetaStored { result, len };
        if self.too_large(key, req.value.len(), req.flags, st.max_bytes) {
            if req.mode == StoreMode::Set && st.live(key, now).is_some() {
                st.items.remove(key);
            }
            return done(StoreResult::TooLarge);
        }
        // A set whose key holds an expired or flushed item reclaims it (memcached counts
        // the item its allocation takes from the LRU tail; kvcached a set's own key's).
        let dead = st
            .items
            .get(key)
            .filter(|it| st.is_flushed(it, now) || State::is_expired(it, now))
            .map(|it| it.fetched)
            .filter(|_| req.mode == StoreMode::Set);
        let old = st.live(key, now).map(|it| it.clone());
        let (mut stale, mut token_sent) = (false, false);
        let (value, flags, exptime) = match (req.mode, old) {
            (StoreMode::Add, Some(_)) => return done(StoreResult::NotStored),
            (StoreMode::Append | StoreMode::Prepend, None) if req.vivify => {
                (req.value.to_vec(), req.flags, req.exptime)
            }
            (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
                return done(StoreResult::NotStored)
            }
            (StoreMode::Cas(_), None) => return done(StoreResult::NotFound),
            (StoreMode::Cas(c), Some(old)) => {
                let have = self.cas(&old);
                if c != 0 && c == have {
                    (req.value.to_vec(), req.flags, req.exptime)
                } else if req.invalidate && c != 0 && c < have {
                    stale = true;
                    token_sent = old.token_sent;
                    (req.value.to_vec(), req.flags, old.exptime)
                } else {
                    return done(StoreResult::Exists);
                }
            }
            (StoreMode::Append | StoreMode::Prepend, Some(old))
                if req
                    .compare_cas
                    .is_some_and(|c| c != 0 && c != self.cas(&old)) =>
            {
                return done(StoreResult::Exists)
            }
            (StoreMode::Append, Some(old)) => {
                let mut v = old.value.clone();
                v.extend_from_slice(req.value);
                (v, old.flags, old.exptime)
            }
            (StoreMode::Prepend, Some(old)) => {
                let mut v = req.value.to_vec();
                v.extend_from_slice(&old.value);
                (v, old.flags, old.exptime)
            }
            _ => (req.value.to_vec(), req.flags, req.exptime),
        };
        if self.too_large(key, value.len(), flags, st.max_bytes) {
            return done(StoreResult::NotStored);
        }
        let version = st.version();
        let len = value.len();
        let it = ModelItem {
            value,
            flags,
            exptime,
            version,
            atime: now,
            fetched: false,
            stale,
            token_sent,
            binary_key: req.binary_key,
            cas: self.explicit(req.new_cas),
        };
        let cas = self.cas(&it);
        st.items.insert(key.to_vec(), it);
        st.stats.total_items += 1;
        if let Some(fetched) = dead {
            st.stats.reclaimed += 1;
            if !fetched {
                st.stats.expired_unfetched += 1;
            }
        }
        MetaStored {
            result: StoreResult::Stored(cas),
            len,
        }
    }

    fn meta_delete(&self, key: &[u8], now: Time, req: MetaDelete) -> MetaDeleteResult {
        let mut st = self.lock();
        let version = st.next_version;
        let Some(it) = st.live(key, now) else {
            return MetaDeleteResult::NotFound;
        };
        let old_cas = self.cas(it);
        if req.compare_cas.is_some_and(|c| c != old_cas) {
            return MetaDeleteResult::Exists;
        }
        if !req.remove_value && !req.invalidate {
            st.items.remove(key);
            return MetaDeleteResult::Deleted;
        }
        if req.remove_value {
            *it = ModelItem {
                value: Vec::new(),
                flags: req.flags,
                exptime: req.ttl.unwrap_or(0),
                version,
                atime: now,
                fetched: false,
                stale: false,
                token_sent: false,
                binary_key: it.binary_key,
                cas: self.explicit(Some(req.new_cas.unwrap_or(old_cas))),
            };
        }
        if req.invalidate {
            if let Some(t) = req.ttl {
                it.exptime = t;
            }
            it.stale = true;
            it.token_sent = false;
            it.cas = self.explicit(req.new_cas);
            it.atime = now;
        }
        it.version = version;
        st.next_version += 1;
        if req.remove_value {
            st.stats.total_items += 1;
        }
        MetaDeleteResult::Deleted
    }

    fn meta_arith(&self, key: &[u8], now: Time, req: MetaArith) -> MetaArithResult {
        let mut st = self.lock();
        let version = st.next_version;
        let max_bytes = st.max_bytes;
        let Some(it) = st.live(key, now) else {
            let Some((exptime, initial)) = req.vivify else {
                return MetaArithResult::NotFound;
            };
            let value = initial.to_string().into_bytes();
            if self.too_large(key, value.len(), 0, max_bytes) {
                return MetaArithResult::NoMemory;
            }
            let it = ModelItem {
                value,
                flags: 0,
                exptime,
                version,
                atime: now,
                fetched: false,
                stale: false,
                token_sent: false,
                binary_key: req.binary_key,
                cas: self.explicit(req.new_cas),
            };
            let cas = self.cas(&it);
            st.items.insert(key.to_vec(), it);
            st.next_version += 1;
            st.stats.total_items += 1;
            return MetaArithResult::Value {
                value: initial,
                cas,
                exptime_before: 0,
                exptime,
                created: true,
            };
        };
        // memcached calls an empty value, and an item it stores in chunks (over 512 KiB),
        // non-numeric before it compares the CAS.
        if it.value.is_empty() || crate::number::chunked(key.len(), it.value.len(), it.flags) {
            return MetaArithResult::NonNumeric;
        }
        if req.compare_cas.is_some_and(|c| c != 0 && c != self.cas(it)) {
            return MetaArithResult::Exists;
        }
        let Some(cur) = strtoull(&it.value) else {
            return MetaArithResult::NonNumeric;
        };
        let new = if req.incr {
            cur.wrapping_add(req.delta)
        } else {
            cur.saturating_sub(req.delta)
        };
        let mut text = new.to_string().into_bytes();
        let in_place = text.len() <= it.value.len();
        if in_place {
            text.resize(it.value.len(), b' ');
        } else {
            // A new item: no marks but the binary key.
            it.fetched = false;
            it.stale = false;
            it.token_sent = false;
        }
        let exptime_before = it.exptime;
        it.exptime = req.touch.unwrap_or(exptime_before);
        it.value = text;
        it.version = version;
        it.cas = self.explicit(req.new_cas);
        it.atime = now;
        let (cas, exptime) = (self.cas(it), it.exptime);
        st.next_version += 1;
        if !in_place {
            st.stats.total_items += 1;
        }
        MetaArithResult::Value {
            value: new,
            cas,
            exptime_before,
            exptime,
            created: false,
        }
    }

    fn debug_item(&self, key: &[u8], now: Time) -> Option<DebugItem> {
        let mut st = self.lock();
        let it = st.live(key, now)?;
        Some(DebugItem {
            exptime: it.exptime,
            last_access: it.atime,
            cas: self.cas(it),
            fetched: it.fetched,
            value_len: it.value.len(),
            flags: it.flags,
            binary_key: it.binary_key,
        })
    }

    fn touch(&self, key: &[u8], exptime: Time, now: Time) -> bool {
        let opts = ReadOptions {
            touch: Some(exptime),
        };
        self.get(key, now, opts, &mut |_| {})
    }

    fn flush_all(&self, at: Time, now: Time) {
        let mut st = self.lock();
        if at <= now {
            st.oldest_live = None;
            st.flush_version = st.next_version - 1;
        } else {
            st.oldest_live = Some(at - 1);
        }
    }

    fn set_max_bytes(&self, max_bytes: usize, _now: Time) {
        self.lock().max_bytes = max_bytes;
    }

    fn stats(&self) -> EngineStats {
        let st = self.lock();
        let mut s = st.stats.clone();
        s.curr_items = st.items.len() as u64;
        s.bytes = st
            .items
            .iter()
            .map(|(k, it)| self.charge(k, it.value.len()) as u64)
            .sum();
        s.total_malloced = s.bytes;
        s.limit_maxbytes = st.max_bytes as u64;
        s
    }

    fn stats_detail(&self, _group: &str) -> Vec<(String, String)> {
        Vec::new()
    }

    fn reset_stats(&self) {
        self.lock().stats = EngineStats::default();
    }

    fn maintain(&self, now: Time, sweep: bool) -> u64 {
        if !sweep {
            return 0;
        }
        let mut st = self.lock();
        let dead: Vec<Vec<u8>> = st
            .items
            .iter()
            .filter(|(_, it)| st.is_flushed(it, now) || State::is_expired(it, now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &dead {
            if let Some(it) = st.items.remove(k) {
                if !it.fetched {
                    st.stats.expired_unfetched += 1;
                }
            }
        }
        dead.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strtoull_cases() {
        assert_eq!(strtoull(b" 12 x"), Some(12));
        assert_eq!(strtoull(b"-0"), Some(0));
        assert_eq!(strtoull(b"-1"), None);
        assert_eq!(strtoull(b"12x"), None);
        assert_eq!(strtoull(b"0000000000000000000000000042"), Some(42));
        assert_eq!(strtoull(b"18446744073709551616"), None);
        assert_eq!(strtoull(b"-9223372036854775809"), Some(9223372036854775807));
        assert_eq!(strtoull(b"5\0x"), Some(5));
        assert_eq!(strtoull(b""), None);
    }
}
