//! The interim engine: a sharded hash map with CLOCK eviction.
//!
//! # Design
//!
//! * **Shards.** Keys are spread over a power-of-two number of shards by a seeded
//!   wyhash-style hash ([`hash`]); the high 32 bits pick the shard and the low 32 bits the
//!   slot, so the two are independent. Each shard is an `RwLock` around an
//!   open-addressing table ([`table::Table`]) whose slots hold the items inline; each
//!   shard sits on its own cache lines. Nothing on the request path takes a global lock.
//! * **Reads** (`get`, `gat`, `touch`) take the shard's read lock: the fields a read
//!   changes (last-access time, the CLOCK "accessed" bit, the "fetched" bit, the expiry
//!   for `gat`/`touch`) are atomics inside the item. A read that finds an expired or
//!   flushed item retakes the lock for writing to unlink it (and count it).
//! * **Writes** take the shard's write lock. One allocation per item: key and value share
//!   one exactly-sized boxed slice.
//! * **Memory.** Each item is charged `key + value + ITEM_OVERHEAD` bytes
//!   ([`HashMapEngine::ITEM_OVERHEAD`], documented there) against `max_bytes`, on one
//!   global `AtomicUsize` that is only ever raised by a compare-and-swap that keeps it
//!   within the limit, so the engine never holds more than `max_bytes` of charged items.
//! * **Eviction** is CLOCK: each shard's table has a hand that sweeps its slots; an item
//!   whose accessed bit is set (by a read since the hand last passed) has it cleared and
//!   is skipped once; expired or flushed items met on the way are reclaimed first. New
//!   items start without the bit, so items never read go first. A store that needs room
//!   first turns its own shard's hand (never evicting the key being written) if that
//!   shard holds at least [`LOCAL_MIN_ITEMS`] items; otherwise, or if that frees nothing,
//!   it follows a global hand (the shard where the last victim was found) through the
//!   shards round-robin, one turn of each shard's hand, and only then makes a second such
//!   round, so that together the shards behave like one CLOCK and a recently read item
//!   survives while unread items remain anywhere. Other shards are only `try_write`n (we
//!   hold our own lock); if that fails only because shards were busy, the write drops its
//!   lock, evicts waiting for locks one shard at a time, and retries (at most
//!   [`WRITE_ATTEMPTS`] times). Each visit is bounded (one turn of the table plus one step
//!   per item removed); with `no_evict` only expired or flushed items are reclaimed,
//!   within a small fixed budget over a few shards, and writes that still do not fit fail
//!   with `NoMemory` (append/prepend: `NotStored`, as memcached).
//! * **Maintenance** (`maintain`) scans a bounded number of slots per call (resuming
//!   where it stopped), reclaiming expired and flushed items (`crawler_reclaimed` in
//!   `stats items`), and halves tables that fell below 1/8 full.
//! * **CAS** uniques come from one global `AtomicU64` counter starting at 1, drawn once per
//!   successful mutation. The same counter versions items when CAS is off (items then
//!   report CAS 0), which gives `flush_all` a watermark: an immediate flush invalidates
//!   every item whose version is at most the last one drawn, including items written in
//!   the same second.

mod hash;
use crate::number;
mod table;

use std::sync::atomic::{
    AtomicU64, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed,
    Ordering::Release,
};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use crate::{
    ArithResult, DebugItem, Engine, EngineConfig, EngineStats, ItemView, MetaArith,
    MetaArithResult, MetaDelete, MetaDeleteResult, MetaGet, MetaItem, MetaRead, MetaStoreRequest,
    MetaStored, ReadOptions, StoreMode, StoreRequest, StoreResult, Time, Win,
};
use table::{Item, Table, FETCHED};

/// Longest key the engine stores (memcached's protocols stop at 250 bytes).
const MAX_KEY_LEN: usize = u16::MAX as usize;

/// Slots a `no_evict` store may examine for expired items before giving up, per shard.
const RECLAIM_BUDGET: usize = 256;

/// A shard holding fewer items than this does not evict on its own before the global
/// hand is consulted: its hand would turn too fast (a turn per store when it holds one
/// item) for "accessed since the hand last passed" to mean anything.
const LOCAL_MIN_ITEMS: usize = 32;

/// Other shards a `no_evict` store looks at for expired items before giving up.
const NO_EVICT_SHARDS: usize = 4;

/// Slots one `maintain` call examines at most.
const MAINTAIN_BUDGET: usize = 32768;

/// Slots examined under one lock acquisition by `maintain`.
const MAINTAIN_CHUNK: usize = 512;

/// Victims taken from one shard per turn when shrinking the memory limit.
const SHRINK_BATCH: usize = 64;

/// Counters kept per shard, updated under the shard's write lock.
#[derive(Default, Clone, Copy)]
struct Counters {
    total_items: u64,
    evictions: u64,
    reclaimed: u64,
    expired_unfetched: u64,
    evicted_unfetched: u64,
    evicted_nonzero: u64,
    get_expired: u64,
    get_flushed: u64,
    crawler_reclaimed: u64,
    outofmemory: u64,
}

struct ShardInner {
    table: Table,
    c: Counters,
}

#[repr(align(128))]
struct Shard {
    inner: RwLock<ShardInner>,
}

/// Whether an item may still be returned.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Liveness {
    Live,
    Expired,
    Flushed,
}

/// The outcome of [`HashMapEngine::make_room`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Room {
    Made,
    /// Nothing more could be freed.
    Full,
    /// Nothing freed, but some shards were skipped because they were busy: worth
    /// retrying after freeing memory without holding a lock.
    Busy,
}

/// Most attempts a write makes when other shards were too busy to evict from.
const WRITE_ATTEMPTS: usize = 3;

/// What one step of the CLOCK hand did.
enum Step {
    /// Nothing freed (empty slot, second chance, or the protected key).
    Passed,
    /// An item was removed and its memory released.
    Freed,
}

/// Position of the background expiry scan.
#[derive(Default)]
struct MaintCursor {
    shard: usize,
    slot: usize,
}

/// The interim engine: sharded hash map, CLOCK eviction. See the module documentation.
pub struct HashMapEngine {
    shards: Box<[Shard]>,
    shard_mask: usize,
    seed: u64,
    /// The configuration as given (its `max_bytes` is only the initial limit).
    config: EngineConfig,
    no_evict: bool,
    use_cas: bool,
    max_bytes: AtomicUsize,
    /// Charged bytes of all items held.
    used: Padded<AtomicUsize>,
    /// Next item version (CAS unique) to hand out.
    next_seq: Padded<AtomicU64>,
    /// Items with a version at most this are flushed.
    flush_seq: AtomicU64,
    /// Pending or active delayed flush: 0 for none, else `1 << 32 | oldest_live`.
    oldest_live: AtomicU64,
    /// The global hand: the shard where the last cross-shard victim was found, and so
    /// where the next cross-shard search starts.
    victim_cursor: Padded<AtomicUsize>,
    maint: Mutex<MaintCursor>,
}

/// A value on cache lines of its own, so that writes to it do not slow reads of the
/// read-mostly fields next to it (`flush_seq`, `oldest_live`, ...).
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

fn read(s: &Shard) -> RwLockReadGuard<'_, ShardInner> {
    s.inner.read().unwrap_or_else(|e| e.into_inner())
}

fn write(s: &Shard) -> RwLockWriteGuard<'_, ShardInner> {
    s.inner.write().unwrap_or_else(|e| e.into_inner())
}

fn try_write(s: &Shard) -> Option<RwLockWriteGuard<'_, ShardInner>> {
    match s.inner.try_write() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl HashMapEngine {
    /// Bytes charged per item on top of its key and value: a 48-byte table slot at the
    /// table's average occupancy (load 3/8..3/4, ~1.85 slots per item) is ~89 bytes, plus
    /// ~15 bytes of malloc header and rounding for the key+value block.
    pub const ITEM_OVERHEAD: usize = table::ITEM_OVERHEAD;

    /// An engine with a shard count suited to this machine: 16 per hardware thread,
    /// rounded up to a power of two, at least 64.
    pub fn new(config: EngineConfig) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let shards = threads.saturating_mul(16).clamp(64, 4096);
        Self::with_shards(config, shards)
    }

    /// An engine with `shards` shards (rounded up to a power of two, at least 1).
    pub fn with_shards(config: EngineConfig, shards: usize) -> Self {
        let n = shards.clamp(1, 1 << 16).next_power_of_two();
        let shards: Vec<Shard> = (0..n)
            .map(|_| Shard {
                inner: RwLock::new(ShardInner {
                    table: Table::new(),
                    c: Counters::default(),
                }),
            })
            .collect();
        HashMapEngine {
            shards: shards.into_boxed_slice(),
            shard_mask: n - 1,
            seed: hash::random_seed(),
            no_evict: config.no_evict,
            use_cas: config.use_cas,
            max_bytes: AtomicUsize::new(config.max_bytes),
            used: Padded(AtomicUsize::new(0)),
            next_seq: Padded(AtomicU64::new(1)),
            flush_seq: AtomicU64::new(0),
            oldest_live: AtomicU64::new(0),
            victim_cursor: Padded(AtomicUsize::new(0)),
            maint: Mutex::new(MaintCursor::default()),
            config,
        }
    }

    /// The raw stored state of `key`, expired or flushed or not, without counting as an
    /// access: `(value, flags, exptime, cas)`. For tests.
    #[doc(hidden)]
    pub fn peek(&self, key: &[u8]) -> Option<(Vec<u8>, u32, Time, u64)> {
        let (h, si) = self.locate(key);
        let g = read(self.shard(si));
        let it = g.table.find(h, key).and_then(|i| g.table.slot(i))?;
        Some((
            it.value().to_vec(),
            it.flags,
            it.exptime.load(Relaxed),
            self.cas_of(it),
        ))
    }

    /// Check the memory accounting: the global charge equals the sum of the shards'
    /// charges and of their items' charges. For tests; call when no writer runs.
    #[doc(hidden)]
    pub fn check_accounting(&self) -> Result<(), String> {
        let mut sum = 0usize;
        for (n, s) in self.shards.iter().enumerate() {
            let g = read(s);
            let items: usize = g.table.iter().map(|it| it.charge()).sum();
            if items != g.table.charged() {
                return Err(format!(
                    "shard {n}: items charge {items} != table charge {}",
                    g.table.charged()
                ));
            }
            if g.table.iter().count() != g.table.len() {
                return Err(format!("shard {n}: item count mismatch"));
            }
            sum += items;
        }
        let used = self.used.load(Relaxed);
        if sum != used {
            return Err(format!("sum of items {sum} != used {used}"));
        }
        Ok(())
    }

    /// Larger than `-I` as memcached counts it ([`EngineConfig::item_size`]).
    fn too_large(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        self.config.item_size(key_len, value_len, flags) > self.config.max_item_size
    }

    fn locate(&self, key: &[u8]) -> (u32, usize) {
        let h = hash::hash(self.seed, key);
        (h as u32, (h >> 32) as usize & self.shard_mask)
    }

    fn shard(&self, si: usize) -> &Shard {
        // `si` is always masked to the shard count.
        &self.shards[si & self.shard_mask]
    }

    fn cas_of(&self, it: &Item) -> u64 {
        if self.use_cas {
            it.explicit_cas().unwrap_or(it.seq)
        } else {
            0
        }
    }

    fn view<'a>(&self, it: &'a Item) -> ItemView<'a> {
        ItemView {
            key: it.key(),
            value: it.value(),
            flags: it.flags,
            exptime: it.exptime.load(Relaxed),
            cas: self.cas_of(it),
        }
    }

    fn new_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Relaxed)
    }

    /// memcached's order: flushed first (`item_is_flushed`), then expired.
    fn liveness(&self, it: &Item, now: Time) -> Liveness {
        if it.seq <= self.flush_seq.load(Acquire) {
            return Liveness::Flushed;
        }
        let ol = self.oldest_live.load(Acquire);
        if ol != 0 {
            let oldest = ol as u32;
            if it.atime.load(Relaxed) <= oldest && oldest <= now {
                return Liveness::Flushed;
            }
        }
        let e = it.exptime.load(Relaxed);
        if e != 0 && e <= now {
            return Liveness::Expired;
        }
        Liveness::Live
    }

    /// Raise the global charge by `add - sub` if that stays within the limit (lowering it
    /// always succeeds).
    fn try_charge(&self, add: usize, sub: usize) -> bool {
        let max = self.max_bytes.load(Relaxed);
        self.used
            .fetch_update(Relaxed, Relaxed, |cur| {
                if add <= sub {
                    Some(cur.saturating_sub(sub - add))
                } else {
                    let next = cur.checked_add(add - sub)?;
                    (next <= max).then_some(next)
                }
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        let _ = self
            .used
            .fetch_update(Relaxed, Relaxed, |cur| Some(cur.saturating_sub(bytes)));
    }

    /// Remove slot `i`, releasing its charge.
    fn unlink(&self, t: &mut Table, i: usize) -> Option<Item> {
        let it = t.remove(i)?;
        self.release(it.charge());
        Some(it)
    }

    /// Find a live item for a write path: an expired or flushed item found is unlinked
    /// and counted (`get_expired` / `get_flushed`), as memcached's `do_item_get` does.
    fn lookup_mut(&self, inner: &mut ShardInner, h: u32, key: &[u8], now: Time) -> Option<usize> {
        let i = inner.table.find(h, key)?;
        let state = self.liveness(inner.table.slot(i)?, now);
        match state {
            Liveness::Live => Some(i),
            Liveness::Expired | Liveness::Flushed => {
                if state == Liveness::Expired {
                    inner.c.get_expired += 1;
                } else {
                    inner.c.get_flushed += 1;
                }
                self.unlink(&mut inner.table, i);
                None
            }
        }
    }

    /// One step of the CLOCK hand in `inner`. `protect` is a key that must not be evicted.
    fn clock_step(
        &self,
        inner: &mut ShardInner,
        protect: Option<(u32, &[u8])>,
        now: Time,
        evict: bool,
    ) -> Step {
        let i = inner.table.hand;
        let Some(it) = inner.table.slot(i) else {
            inner.table.advance_hand();
            return Step::Passed;
        };
        if protect.is_some_and(|(h, k)| it.is(h, k)) {
            inner.table.advance_hand();
            return Step::Passed;
        }
        if self.liveness(it, now) != Liveness::Live {
            let unfetched = !it.has(FETCHED);
            inner.c.reclaimed += 1;
            if unfetched {
                inner.c.expired_unfetched += 1;
            }
            // The slot now holds the next item of the cluster (if any): look at it next.
            self.unlink(&mut inner.table, i);
            return Step::Freed;
        }
        if it.has(table::ACCESSED) {
            it.bits.fetch_and(!table::ACCESSED, Relaxed);
            inner.table.advance_hand();
            return Step::Passed;
        }
        if !evict {
            inner.table.advance_hand();
            return Step::Passed;
        }
        let unfetched = !it.has(FETCHED);
        let nonzero = it.exptime.load(Relaxed) != 0;
        inner.c.evictions += 1;
        if unfetched {
            inner.c.evicted_unfetched += 1;
        }
        if nonzero {
            inner.c.evicted_nonzero += 1;
        }
        self.unlink(&mut inner.table, i);
        Step::Freed
    }

    /// Sweep `inner` until the charge `add - sub` fits, for at most `budget` steps; with
    /// `to_end`, stop when the hand wraps to the start of the table (the global hand
    /// then moves on to the next shard).
    #[allow(clippy::too_many_arguments)]
    fn sweep_for(
        &self,
        inner: &mut ShardInner,
        protect: Option<(u32, &[u8])>,
        add: usize,
        sub: usize,
        now: Time,
        budget: usize,
        to_end: bool,
    ) -> bool {
        let floor = usize::from(protect.is_some());
        let evict = !self.no_evict;
        let mut steps = 0;
        while steps < budget && inner.table.len() > floor {
            match self.clock_step(inner, protect, now, evict) {
                Step::Freed => {
                    if self.try_charge(add, sub) {
                        return true;
                    }
                }
                Step::Passed => {
                    if to_end && inner.table.hand == 0 {
                        break;
                    }
                }
            }
            steps += 1;
        }
        false
    }

    /// Steps for one visit of the hand to a shard: one turn of the table plus one step
    /// per item removed (a removal does not advance the hand). With `no_evict`, a small
    /// fixed budget (only expired items can be reclaimed).
    fn sweep_budget(&self, t: &Table) -> usize {
        if self.no_evict {
            RECLAIM_BUDGET
        } else {
            t.capacity().saturating_add(t.len()).saturating_add(1)
        }
    }

    /// Laps of the global hand a write makes at most: the first may only clear second
    /// chances (and starts mid-shard), so three make sure every item was passed twice.
    /// Without eviction one lap (reclaiming expired items) is all there is.
    fn rounds(&self) -> usize {
        if self.no_evict {
            1
        } else {
            3
        }
    }

    /// Charge `add - sub` bytes for a write to `key` in shard `si` (locked as `inner`),
    /// evicting or reclaiming as needed; with `need_slot`, also make table room for a new
    /// entry (the key is absent), else the key's present item is protected from eviction.
    /// `Full` or `Busy` if the room cannot be made.
    ///
    /// Victims are looked for like one global CLOCK: a turn of the own shard's hand, then
    /// a turn of each other shard's hand round-robin, and only then a second round, so an
    /// item read since its hand last passed is not evicted while unread items remain
    /// elsewhere (with few items per shard a shard's hand turns fast).
    #[allow(clippy::too_many_arguments)]
    fn make_room(
        &self,
        inner: &mut ShardInner,
        si: usize,
        h: u32,
        key: &[u8],
        add: usize,
        sub: usize,
        now: Time,
        need_slot: bool,
    ) -> Room {
        if need_slot && !inner.table.ensure_room() {
            return Room::Full;
        }
        if self.try_charge(add, sub) {
            return Room::Made;
        }
        // The key being written keeps its item: never evict it to make room for itself.
        let protect = (!need_slot).then_some((h, key));
        let n = self.shards.len();
        // Without eviction only expired items can be reclaimed: look at a few shards.
        let visits = if self.no_evict {
            NO_EVICT_SHARDS.min(n)
        } else {
            n
        };
        let start = self.victim_cursor.load(Relaxed);
        let mut busy = false;
        for round in 0..self.rounds() {
            // The own shard first, if its hand turns slowly enough to stand for the
            // global one.
            if round == 0 && inner.table.len() >= LOCAL_MIN_ITEMS {
                let budget = self.sweep_budget(&inner.table);
                if self.sweep_for(inner, protect, add, sub, now, budget, false) {
                    return Room::Made;
                }
            }
            // Then the global hand, never waiting for a lock (we hold our own).
            for k in 0..visits {
                let j = start.wrapping_add(k) & self.shard_mask;
                if j == si {
                    if round > 0 || inner.table.len() < LOCAL_MIN_ITEMS {
                        let budget = self.sweep_budget(&inner.table);
                        if self.sweep_for(inner, protect, add, sub, now, budget, true) {
                            self.victim_cursor.store(j, Relaxed);
                            return Room::Made;
                        }
                    }
                    continue;
                }
                let Some(mut g) = try_write(self.shard(j)) else {
                    busy = true;
                    continue;
                };
                if g.table.len() == 0 {
                    continue;
                }
                let budget = self.sweep_budget(&g.table);
                if self.sweep_for(&mut g, None, add, sub, now, budget, true) {
                    self.victim_cursor.store(j, Relaxed);
                    return Room::Made;
                }
            }
        }
        if self.no_evict {
            // Look at other shards for expired items next time.
            self.victim_cursor
                .store(start.wrapping_add(visits) & self.shard_mask, Relaxed);
        }
        if self.try_charge(add, sub) {
            Room::Made
        } else if busy && !self.no_evict {
            Room::Busy
        } else {
            Room::Full
        }
    }

    /// Evict (or reclaim) from any shards, waiting for their locks (the caller holds
    /// none), until `need` bytes are free under the limit or the rounds are done.
    fn free_memory(&self, need: usize, now: Time) {
        let start = self.victim_cursor.load(Relaxed);
        for _ in 0..self.rounds() {
            for k in 0..self.shards.len() {
                if self.try_charge(need, 0) {
                    // Hand the reservation straight back: the retried write takes it.
                    self.release(need);
                    return;
                }
                let j = start.wrapping_add(k) & self.shard_mask;
                let mut g = write(self.shard(j));
                if g.table.len() > 0 {
                    let budget = self.sweep_budget(&g.table);
                    if self.sweep_for(&mut g, None, need, 0, now, budget, true) {
                        self.victim_cursor.store(j, Relaxed);
                        self.release(need);
                        return;
                    }
                }
            }
        }
    }

    /// Store failure bookkeeping: a failed `set` drops the old item (memcached: "avoid
    /// stale data persisting in cache because we failed alloc").
    fn drop_on_failed_set(&self, inner: &mut ShardInner, mode: StoreMode, h: u32, key: &[u8]) {
        if mode == StoreMode::Set {
            if let Some(i) = inner.table.find(h, key) {
                self.unlink(&mut inner.table, i);
            }
        }
    }

    /// Evict (or, with `no_evict`, reclaim) until the charge is within the limit.
    fn shrink_to_limit(&self, now: Time) {
        let n = self.shards.len();
        let mut idle = 0;
        loop {
            let max = self.max_bytes.load(Relaxed);
            if self.used.load(Relaxed) <= max {
                return;
            }
            let mut progress = false;
            let start = self.victim_cursor.load(Relaxed);
            for k in 0..n {
                if self.used.load(Relaxed) <= max {
                    return;
                }
                let j = start.wrapping_add(k) & self.shard_mask;
                self.victim_cursor.store(j, Relaxed);
                let mut g = write(self.shard(j));
                let mut taken = 0;
                let mut steps = 0;
                let budget = self.sweep_budget(&g.table);
                while taken < SHRINK_BATCH
                    && steps < budget
                    && g.table.len() > 0
                    && self.used.load(Relaxed) > max
                {
                    match self.clock_step(&mut g, None, now, !self.no_evict) {
                        Step::Freed => {
                            taken += 1;
                            progress = true;
                        }
                        // The global hand moves on at the end of the table.
                        Step::Passed if g.table.hand == 0 => break,
                        Step::Passed => {}
                    }
                    steps += 1;
                }
            }
            // A round that only cleared second chances is followed by one that evicts.
            idle = if progress { 0 } else { idle + 1 };
            if idle >= self.rounds() {
                return;
            }
        }
    }

    /// One attempt at a store; `Err(bytes)` asks the caller to free that much memory
    /// without holding a lock and try again (only when not `last`). Classic stores pass a
    /// request built by [`classic`]; the meta options are documented on
    /// [`MetaStoreRequest`].
    fn store_once(
        &self,
        req: MetaStoreRequest<'_>,
        now: Time,
        last: bool,
    ) -> Result<MetaStored, usize> {
        let key = req.key;
        let (h, si) = self.locate(key);
        let concat = matches!(req.mode, StoreMode::Append | StoreMode::Prepend);
        let max_bytes = self.max_bytes.load(Relaxed);
        let item_charge = table::charge(key.len().saturating_add(req.value.len()));
        let done = |result: StoreResult, len: usize| Ok(MetaStored { result, len });
        let req_len = req.value.len();
        if self.too_large(key.len(), req.value.len(), req.flags)
            || key.len() > MAX_KEY_LEN
            || item_charge > max_bytes
        {
            if req.mode == StoreMode::Set {
                self.delete(key, now);
            }
            return done(StoreResult::TooLarge, req_len);
        }
        let mut g = write(self.shard(si));
        let inner = &mut *g;
        let old = self.lookup_mut(inner, h, key, now);
        let old_item = old.and_then(|i| inner.table.slot(i));
        // Bits the new item starts with (besides the binary-key mark).
        let mut bits = 0;
        let mut keep_exptime = None;
        match (req.mode, old_item) {
            (StoreMode::Add, Some(it)) => {
                // memcached bumps the existing item (do_item_update).
                it.mark_access(now, false);
                return done(StoreResult::NotStored, req_len);
            }
            (StoreMode::Append | StoreMode::Prepend, None) if req.vivify => {}
            (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
                return done(StoreResult::NotStored, req_len);
            }
            (StoreMode::Cas(_), None) => return done(StoreResult::NotFound, req_len),
            (StoreMode::Cas(c), Some(it)) => {
                let have = self.cas_of(it);
                if c != 0 && c == have {
                    // A plain match: the new item is fresh (not stale, no token sent).
                } else if req.invalidate && c != 0 && c < have {
                    // An older writer under invalidation: store, but keep the item stale.
                    bits = table::STALE | (it.bits.load(Relaxed) & table::TOKEN_SENT);
                    keep_exptime = Some(it.exptime.load(Relaxed));
                } else {
                    return done(StoreResult::Exists, req_len);
                }
            }
            (StoreMode::Append | StoreMode::Prepend, Some(it))
                if req
                    .compare_cas
                    .is_some_and(|c| c != 0 && c != self.cas_of(it)) =>
            {
                return done(StoreResult::Exists, req_len);
            }
            _ => {}
        }
        if req.binary_key {
            bits |= table::BINARY_KEY;
        }
        let cas_in = self.explicit(req.new_cas);
        if cas_in.is_some() {
            bits |= table::EXPLICIT_CAS;
        }
        let old_charge = old_item.map_or(0, |it| it.charge());
        let (data, flags, exptime, value_len) = match (req.mode, old_item) {
            (StoreMode::Append | StoreMode::Prepend, Some(it)) => {
                let total = it.value().len().saturating_add(req.value.len());
                // memcached: the combined item cannot be allocated → NOT_STORED.
                if self.too_large(key.len(), total, it.flags)
                    || table::charge(key.len().saturating_add(total)) > max_bytes
                {
                    return done(StoreResult::NotStored, req_len);
                }
                let data = if req.mode == StoreMode::Append {
                    table::make_data_cas(key, &[it.value(), req.value], cas_in)
                } else {
                    table::make_data_cas(key, &[req.value, it.value()], cas_in)
                };
                (data, it.flags, it.exptime.load(Relaxed), total)
            }
            _ => (
                table::make_data_cas(key, &[req.value], cas_in),
                req.flags,
                keep_exptime.unwrap_or(req.exptime),
                req.value.len(),
            ),
        };
        let fail = |inner: &mut ShardInner| {
            inner.c.outofmemory += 1;
            let result = if concat {
                StoreResult::NotStored
            } else {
                self.drop_on_failed_set(inner, req.mode, h, key);
                StoreResult::NoMemory
            };
            MetaStored {
                result,
                len: req_len,
            }
        };
        let Some(data) = data else {
            return Ok(fail(inner));
        };
        let new_charge = table::charge(key.len().saturating_add(value_len));
        let need = new_charge.saturating_sub(old_charge);
        match self.make_room(
            inner,
            si,
            h,
            key,
            new_charge,
            old_charge,
            now,
            old.is_none(),
        ) {
            Room::Made => {}
            Room::Busy if !last => return Err(need),
            Room::Busy | Room::Full => return Ok(fail(inner)),
        }
        let item = Item::new(
            data,
            key.len() as u16,
            h,
            self.new_seq(),
            flags,
            exptime,
            now,
        )
        .with_bits(bits);
        let cas = self.cas_of(&item);
        // Eviction may have moved the old item within the table: find it again.
        match inner.table.find(h, key) {
            Some(i) => {
                inner.table.replace(i, item);
            }
            None => {
                if !inner.table.insert(item) {
                    self.release(new_charge.saturating_sub(old_charge));
                    return Ok(fail(inner));
                }
            }
        }
        inner.c.total_items += 1;
        done(StoreResult::Stored(cas), value_len)
    }

    /// An explicit CAS unique to keep on an item: only when CAS is on.
    fn explicit(&self, new_cas: Option<u64>) -> Option<u64> {
        new_cas.filter(|_| self.use_cas)
    }

    /// One attempt at incr/decr; `Err(bytes)` as for [`HashMapEngine::store_once`].
    fn arith_once(
        &self,
        key: &[u8],
        req: &MetaArith,
        now: Time,
        last: bool,
    ) -> Result<MetaArithResult, usize> {
        let (h, si) = self.locate(key);
        let mut g = write(self.shard(si));
        let inner = &mut *g;
        let Some(i) = self.lookup_mut(inner, h, key, now) else {
            return match req.vivify {
                Some((exptime, initial)) => {
                    self.arith_create(inner, si, h, key, req, exptime, initial, now, last)
                }
                None => Ok(MetaArithResult::NotFound),
            };
        };
        let Some(it) = inner.table.slot(i) else {
            return Ok(MetaArithResult::NotFound);
        };
        // memcached's order: an empty value, then the CAS, then the number.
        if it.value().is_empty() {
            return Ok(MetaArithResult::NonNumeric);
        }
        if req
            .compare_cas
            .is_some_and(|c| c != 0 && c != self.cas_of(it))
        {
            return Ok(MetaArithResult::Exists);
        }
        let Some(cur) = number::parse_item(key, it.value()) else {
            return Ok(MetaArithResult::NonNumeric);
        };
        let new = if req.incr {
            cur.wrapping_add(req.delta)
        } else {
            cur.saturating_sub(req.delta)
        };
        let exptime_before = it.exptime.load(Relaxed);
        let exptime = req.touch.unwrap_or(exptime_before);
        let cas_in = self.explicit(req.new_cas);
        let mut buf = [0u8; 20];
        let digits = number::format(new, &mut buf);
        let fits = digits.len() <= it.value().len();
        let value = |cas: u64| MetaArithResult::Value {
            value: new,
            cas,
            exptime_before,
            exptime,
            created: false,
        };
        if fits && (cas_in.is_none() || it.has(table::EXPLICIT_CAS)) {
            // memcached rewrites the item in place when the number fits, padding the
            // rest of the old length with spaces ("10" decr 1 → "9 ").
            let seq = self.new_seq();
            let Some(it) = inner.table.slot_mut(i) else {
                return Ok(MetaArithResult::NotFound);
            };
            let v = it.value_mut();
            for (n, b) in v.iter_mut().enumerate() {
                *b = digits.get(n).copied().unwrap_or(b' ');
            }
            it.seq = seq;
            it.set_explicit_cas(cas_in.unwrap_or(seq));
            it.exptime.store(exptime, Relaxed);
            it.mark_access(now, false);
            return Ok(value(self.cas_of(it)));
        }
        // Longer (or an explicit CAS to add): a new item, keeping flags; when the number
        // fits it is padded as in place and the item keeps its marks, as memcached's
        // in-place rewrite would.
        let (flags, old_charge, old_len) = (it.flags, it.charge(), it.value().len());
        let mut bits = it.bits.load(Relaxed) & table::BINARY_KEY;
        if fits {
            bits = it.bits.load(Relaxed) & !table::EXPLICIT_CAS;
        }
        if cas_in.is_some() {
            bits |= table::EXPLICIT_CAS;
        }
        let text: std::borrow::Cow<'_, [u8]> = if fits {
            let mut v = digits.to_vec();
            v.resize(old_len, b' ');
            v.into()
        } else {
            digits.into()
        };
        let text = &*text;
        let Some(data) = table::make_data_cas(key, &[text], cas_in) else {
            inner.c.outofmemory += 1;
            return Ok(MetaArithResult::NoMemory);
        };
        let new_charge = table::charge(key.len().saturating_add(text.len()));
        match self.make_room(inner, si, h, key, new_charge, old_charge, now, false) {
            Room::Made => {}
            Room::Busy if !last => return Err(new_charge.saturating_sub(old_charge)),
            Room::Busy | Room::Full => {
                inner.c.outofmemory += 1;
                return Ok(MetaArithResult::NoMemory);
            }
        }
        let item = Item::new(
            data,
            key.len() as u16,
            h,
            self.new_seq(),
            flags,
            exptime,
            now,
        )
        .with_bits(bits);
        if fits {
            item.mark_access(now, false);
        }
        let cas = self.cas_of(&item);
        match inner.table.find(h, key) {
            Some(i) => {
                inner.table.replace(i, item);
            }
            None => {
                // Cannot happen: the key was protected from eviction.
                self.release(new_charge.saturating_sub(old_charge));
                return Ok(MetaArithResult::NotFound);
            }
        }
        if !fits {
            inner.c.total_items += 1;
        }
        Ok(value(cas))
    }

    /// `ma` with `N` on a miss: create the item holding `initial` (the shard is locked).
    #[allow(clippy::too_many_arguments)]
    fn arith_create(
        &self,
        inner: &mut ShardInner,
        si: usize,
        h: u32,
        key: &[u8],
        req: &MetaArith,
        exptime: Time,
        initial: u64,
        now: Time,
        last: bool,
    ) -> Result<MetaArithResult, usize> {
        let mut buf = [0u8; 20];
        let digits = number::format(initial, &mut buf);
        if key.len() > MAX_KEY_LEN || self.too_large(key.len(), digits.len(), 0) {
            return Ok(MetaArithResult::NoMemory);
        }
        let cas_in = self.explicit(req.new_cas);
        let Some(data) = table::make_data_cas(key, &[digits], cas_in) else {
            inner.c.outofmemory += 1;
            return Ok(MetaArithResult::NoMemory);
        };
        let charge = table::charge(key.len().saturating_add(digits.len()));
        match self.make_room(inner, si, h, key, charge, 0, now, true) {
            Room::Made => {}
            Room::Busy if !last => return Err(charge),
            Room::Busy | Room::Full => {
                inner.c.outofmemory += 1;
                return Ok(MetaArithResult::NoMemory);
            }
        }
        let mut bits = 0;
        if req.binary_key {
            bits |= table::BINARY_KEY;
        }
        if cas_in.is_some() {
            bits |= table::EXPLICIT_CAS;
        }
        let item =
            Item::new(data, key.len() as u16, h, self.new_seq(), 0, exptime, now).with_bits(bits);
        let cas = self.cas_of(&item);
        if !inner.table.insert(item) {
            self.release(charge);
            inner.c.outofmemory += 1;
            return Ok(MetaArithResult::NoMemory);
        }
        inner.c.total_items += 1;
        Ok(MetaArithResult::Value {
            value: initial,
            cas,
            exptime_before: 0,
            exptime,
            created: true,
        })
    }

    /// A meta read of a live item (under either lock; what it changes is atomic).
    fn meta_hit(&self, it: &Item, now: Time, opts: &MetaRead, found: &mut dyn FnMut(MetaItem<'_>)) {
        let exptime_before = it.exptime.load(Relaxed);
        let last_access = it.atime.load(Relaxed);
        let fetched = it.has(FETCHED);
        if let Some(e) = opts.touch {
            it.exptime.store(e, Relaxed);
        }
        let stale = it.has(table::STALE);
        let compared = if opts.recache_after_touch {
            opts.touch.unwrap_or(exptime_before)
        } else {
            exptime_before
        };
        let recache = opts.recache.is_some_and(|r| compared != 0 && compared < r);
        let win = if stale || recache {
            // Only the first request to ask gets the token.
            let before = it.bits.fetch_or(table::TOKEN_SENT, Relaxed);
            if before & table::TOKEN_SENT != 0 {
                Win::AlreadySent
            } else {
                Win::Won
            }
        } else if it.has(table::TOKEN_SENT) {
            Win::AlreadySent
        } else {
            Win::None
        };
        if !opts.no_bump {
            it.mark_access(now, true);
        }
        found(MetaItem {
            item: self.view(it),
            exptime_before,
            last_access,
            fetched,
            stale,
            win,
            binary_key: it.has(table::BINARY_KEY),
        });
    }

    /// `mg ... N` after a miss: under the write lock, create the empty item (or read the one
    /// another request created meanwhile). `Err(bytes)` as for `store_once`.
    fn vivify_once(
        &self,
        key: &[u8],
        now: Time,
        opts: &MetaRead,
        found: &mut dyn FnMut(MetaItem<'_>),
        last: bool,
    ) -> Result<MetaGet, usize> {
        let (h, si) = self.locate(key);
        let mut g = write(self.shard(si));
        let inner = &mut *g;
        if let Some(it) = self
            .lookup_mut(inner, h, key, now)
            .and_then(|i| inner.table.slot(i))
        {
            self.meta_hit(it, now, opts, found);
            return Ok(MetaGet::Hit);
        }
        if key.len() > MAX_KEY_LEN || self.too_large(key.len(), 0, 0) {
            return Ok(MetaGet::Miss);
        }
        let cas_in = self.explicit(opts.new_cas);
        let Some(data) = table::make_data_cas(key, &[], cas_in) else {
            inner.c.outofmemory += 1;
            return Ok(MetaGet::Miss);
        };
        let charge = table::charge(key.len());
        match self.make_room(inner, si, h, key, charge, 0, now, true) {
            Room::Made => {}
            Room::Busy if !last => return Err(charge),
            Room::Busy | Room::Full => {
                inner.c.outofmemory += 1;
                return Ok(MetaGet::Miss);
            }
        }
        let mut bits = table::TOKEN_SENT;
        if opts.binary_key {
            bits |= table::BINARY_KEY;
        }
        if cas_in.is_some() {
            bits |= table::EXPLICIT_CAS;
        }
        let exptime = opts.vivify.unwrap_or(0);
        let item =
            Item::new(data, key.len() as u16, h, self.new_seq(), 0, exptime, now).with_bits(bits);
        if !opts.no_bump {
            item.mark_access(now, true);
        }
        found(MetaItem {
            item: self.view(&item),
            exptime_before: 0,
            last_access: now,
            fetched: false,
            stale: false,
            win: Win::Won,
            binary_key: opts.binary_key,
        });
        if !inner.table.insert(item) {
            self.release(charge);
            inner.c.outofmemory += 1;
            return Ok(MetaGet::Miss);
        }
        inner.c.total_items += 1;
        Ok(MetaGet::Vivified)
    }

    fn counters(&self) -> Vec<(Counters, usize, usize, usize, usize)> {
        self.shards
            .iter()
            .map(|s| {
                let g = read(s);
                (
                    g.c,
                    g.table.len(),
                    g.table.capacity(),
                    g.table.charged(),
                    g.table.malloced(),
                )
            })
            .collect()
    }
}

impl Engine for HashMapEngine {
    fn get(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOptions,
        found: &mut dyn FnMut(ItemView<'_>),
    ) -> bool {
        let (h, si) = self.locate(key);
        let shard = self.shard(si);
        {
            let g = read(shard);
            let Some(it) = g.table.find(h, key).and_then(|i| g.table.slot(i)) else {
                return false;
            };
            if self.liveness(it, now) == Liveness::Live {
                if let Some(e) = opts.touch {
                    it.exptime.store(e, Relaxed);
                }
                it.mark_access(now, true);
                found(self.view(it));
                return true;
            }
        }
        // Expired or flushed: unlink it (and count it) under the write lock.
        // (If a live item replaced it in between, this read happened before that write.)
        let _ = self.lookup_mut(&mut write(shard), h, key, now);
        false
    }

    fn store(&self, req: StoreRequest<'_>, now: Time) -> StoreResult {
        self.meta_store(classic(req), now).result
    }

    fn delete(&self, key: &[u8], now: Time) -> bool {
        let (h, si) = self.locate(key);
        let mut g = write(self.shard(si));
        match self.lookup_mut(&mut g, h, key, now) {
            Some(i) => self.unlink(&mut g.table, i).is_some(),
            None => false,
        }
    }

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

    fn meta_get(
        &self,
        key: &[u8],
        now: Time,
        opts: MetaRead,
        found: &mut dyn FnMut(MetaItem<'_>),
    ) -> MetaGet {
        let (h, si) = self.locate(key);
        let shard = self.shard(si);
        {
            let g = read(shard);
            if let Some(it) = g.table.find(h, key).and_then(|i| g.table.slot(i)) {
                if self.liveness(it, now) == Liveness::Live {
                    self.meta_hit(it, now, &opts, found);
                    return MetaGet::Hit;
                }
            }
        }
        if opts.vivify.is_none() {
            // Expired or flushed (or absent): unlink it (and count it) under the write lock.
            let _ = self.lookup_mut(&mut write(shard), h, key, now);
            return MetaGet::Miss;
        }
        for n in 1..=WRITE_ATTEMPTS {
            match self.vivify_once(key, now, &opts, found, n == WRITE_ATTEMPTS) {
                Ok(r) => return r,
                Err(need) => self.free_memory(need, now),
            }
        }
        MetaGet::Miss
    }

    fn meta_store(&self, req: MetaStoreRequest<'_>, now: Time) -> MetaStored {
        for _ in 1..WRITE_ATTEMPTS {
            match self.store_once(req, now, false) {
                Ok(r) => return r,
                Err(need) => self.free_memory(need, now),
            }
        }
        self.store_once(req, now, true).unwrap_or(MetaStored {
            result: StoreResult::NoMemory,
            len: req.value.len(),
        })
    }

    fn meta_delete(&self, key: &[u8], now: Time, req: MetaDelete) -> MetaDeleteResult {
        let (h, si) = self.locate(key);
        let mut g = write(self.shard(si));
        let inner = &mut *g;
        let Some(i) = self.lookup_mut(inner, h, key, now) else {
            return MetaDeleteResult::NotFound;
        };
        let Some(it) = inner.table.slot(i) else {
            return MetaDeleteResult::NotFound;
        };
        if req.compare_cas.is_some_and(|c| c != self.cas_of(it)) {
            return MetaDeleteResult::Exists;
        }
        if !req.remove_value && !req.invalidate {
            self.unlink(&mut inner.table, i);
            return MetaDeleteResult::Deleted;
        }
        if !req.remove_value {
            let cas_in = self.explicit(req.new_cas);
            if cas_in.is_none() || it.has(table::EXPLICIT_CAS) {
                // Invalidate in place: new marks, expiry and CAS, same value.
                let seq = self.new_seq();
                let Some(it) = inner.table.slot_mut(i) else {
                    return MetaDeleteResult::NotFound;
                };
                if let Some(t) = req.ttl {
                    it.exptime.store(t, Relaxed);
                }
                it.bits.fetch_or(table::STALE, Relaxed);
                it.bits.fetch_and(!table::TOKEN_SENT, Relaxed);
                it.seq = seq;
                it.set_explicit_cas(cas_in.unwrap_or(seq));
                return MetaDeleteResult::Deleted;
            }
        }
        // Replace the item by one with the new value, expiry, CAS and marks (an emptied item,
        // or an invalidated one that needs room for an explicit CAS). The value only shrinks
        // (or stays), so the charge never grows.
        let old_cas = self.cas_of(it);
        let binary = it.bits.load(Relaxed) & table::BINARY_KEY;
        let (value, flags, mut exptime, mut bits) = if req.remove_value {
            (&[][..], req.flags, req.ttl.unwrap_or(0), binary)
        } else {
            (
                it.value(),
                it.flags,
                it.exptime.load(Relaxed),
                it.bits.load(Relaxed),
            )
        };
        let mut cas_in = if req.remove_value {
            self.explicit(Some(req.new_cas.unwrap_or(old_cas)))
        } else {
            None
        };
        if req.invalidate {
            if let Some(t) = req.ttl {
                exptime = t;
            }
            bits = (bits | table::STALE) & !table::TOKEN_SENT;
            cas_in = self.explicit(req.new_cas);
        }
        let atime = it.atime.load(Relaxed);
        let old_charge = it.charge();
        bits &= !table::EXPLICIT_CAS;
        if cas_in.is_some() {
            bits |= table::EXPLICIT_CAS;
        }
        let Some(data) = table::make_data_cas(key, &[value], cas_in) else {
            inner.c.outofmemory += 1;
            return MetaDeleteResult::NotStored;
        };
        let new_charge = table::charge(key.len().saturating_add(value.len()));
        if !self.try_charge(new_charge, old_charge) {
            return MetaDeleteResult::NotStored;
        }
        let item = Item::new(
            data,
            key.len() as u16,
            h,
            self.new_seq(),
            flags,
            exptime,
            now,
        )
        .with_bits(bits);
        if !req.remove_value {
            // Invalidation changes marks and CAS only: the access time stays.
            item.atime.store(atime, Relaxed);
        }
        inner.table.replace(i, item);
        if req.remove_value {
            inner.c.total_items += 1;
        }
        MetaDeleteResult::Deleted
    }

    fn meta_arith(&self, key: &[u8], now: Time, req: MetaArith) -> MetaArithResult {
        for _ in 1..WRITE_ATTEMPTS {
            match self.arith_once(key, &req, now, false) {
                Ok(r) => return r,
                Err(need) => self.free_memory(need, now),
            }
        }
        self.arith_once(key, &req, now, true)
            .unwrap_or(MetaArithResult::NoMemory)
    }

    fn debug_item(&self, key: &[u8], now: Time) -> Option<DebugItem> {
        let (h, si) = self.locate(key);
        let shard = self.shard(si);
        {
            let g = read(shard);
            let it = g.table.find(h, key).and_then(|i| g.table.slot(i))?;
            if self.liveness(it, now) == Liveness::Live {
                return Some(DebugItem {
                    exptime: it.exptime.load(Relaxed),
                    last_access: it.atime.load(Relaxed),
                    cas: self.cas_of(it),
                    fetched: it.has(FETCHED),
                    value_len: it.value().len(),
                    flags: it.flags,
                    binary_key: it.has(table::BINARY_KEY),
                });
            }
        }
        let _ = self.lookup_mut(&mut write(shard), h, key, now);
        None
    }

    fn touch(&self, key: &[u8], exptime: Time, now: Time) -> bool {
        let opts = ReadOptions {
            touch: Some(exptime),
        };
        self.get(key, now, opts, &mut |_| {})
    }

    fn flush_all(&self, at: Time, now: Time) {
        if at <= now {
            // memcached sets oldest_live = now - 1, replacing any pending delayed flush,
            // and unlinks the items of the current second; the version watermark covers
            // every item written so far, whatever its second.
            self.oldest_live.store(0, Release);
            // A read-modify-write sees the latest version handed out.
            let last = self.next_seq.fetch_add(0, AcqRel).saturating_sub(1);
            self.flush_seq.fetch_max(last, AcqRel);
        } else {
            let oldest = at - 1;
            self.oldest_live
                .store((1u64 << 32) | u64::from(oldest), Release);
        }
    }

    fn set_max_bytes(&self, max_bytes: usize, now: Time) {
        self.max_bytes.store(max_bytes, Relaxed);
        self.shrink_to_limit(now);
    }

    fn stats(&self) -> EngineStats {
        let mut s = EngineStats {
            bytes: self.used.load(Relaxed) as u64,
            limit_maxbytes: self.max_bytes.load(Relaxed) as u64,
            ..EngineStats::default()
        };
        for (c, len, _cap, _charged, malloced) in self.counters() {
            s.curr_items += len as u64;
            s.total_items += c.total_items;
            s.evictions += c.evictions;
            s.reclaimed += c.reclaimed;
            s.expired_unfetched += c.expired_unfetched;
            s.evicted_unfetched += c.evicted_unfetched;
            s.evicted_nonzero += c.evicted_nonzero;
            s.get_expired += c.get_expired;
            s.get_flushed += c.get_flushed;
            s.total_malloced += malloced as u64;
        }
        s
    }

    /// `items`: per shard (numbered from 1, only shards with items or evictions), in
    /// memcached's `items:<n>:<name>` form. `slabs`: per shard `<n>:<name>` table figures,
    /// then `active_slabs` and `total_malloced`.
    fn stats_detail(&self, group: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let rows = self.counters();
        match group {
            "items" => {
                for (n, (c, len, _, _, _)) in rows.iter().enumerate() {
                    if *len == 0 && c.evictions == 0 && c.reclaimed == 0 {
                        continue;
                    }
                    let id = n + 1;
                    let fields: [(&str, u64); 8] = [
                        ("number", *len as u64),
                        ("evicted", c.evictions),
                        ("evicted_nonzero", c.evicted_nonzero),
                        ("outofmemory", c.outofmemory),
                        ("reclaimed", c.reclaimed),
                        ("expired_unfetched", c.expired_unfetched),
                        ("evicted_unfetched", c.evicted_unfetched),
                        ("crawler_reclaimed", c.crawler_reclaimed),
                    ];
                    for (name, v) in fields {
                        out.push((format!("items:{id}:{name}"), v.to_string()));
                    }
                }
            }
            "slabs" => {
                let mut active = 0;
                let mut malloced = 0usize;
                for (n, (_, len, cap, charged, m)) in rows.iter().enumerate() {
                    malloced = malloced.saturating_add(*m);
                    if *len == 0 {
                        continue;
                    }
                    active += 1;
                    let id = n + 1;
                    let fields: [(&str, usize); 5] = [
                        ("chunk_size", table::SLOT_SIZE),
                        ("total_chunks", *cap),
                        ("used_chunks", *len),
                        ("free_chunks", cap.saturating_sub(*len)),
                        ("mem_requested", *charged),
                    ];
                    for (name, v) in fields {
                        out.push((format!("{id}:{name}"), v.to_string()));
                    }
                }
                out.push(("active_slabs".into(), active.to_string()));
                out.push(("total_malloced".into(), malloced.to_string()));
            }
            _ => {}
        }
        out
    }

    fn reset_stats(&self) {
        for s in self.shards.iter() {
            write(s).c = Counters::default();
        }
    }

    fn maintain(&self, now: Time, sweep: bool) -> u64 {
        if !sweep {
            return 0;
        }
        // One scanner at a time; a concurrent call just returns.
        let mut cur = match self.maint.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return 0,
        };
        let mut reclaimed = 0u64;
        let mut budget = MAINTAIN_BUDGET;
        let mut shards_done = 0;
        while budget > 0 && shards_done < self.shards.len() {
            let shard = self.shard(cur.shard);
            let start = cur.slot;
            let chunk = MAINTAIN_CHUNK.min(budget);
            // Look under the read lock first; most chunks have nothing to reclaim.
            let (cap, any, sparse) = {
                let g = read(shard);
                let cap = g.table.capacity();
                let end = start.saturating_add(chunk).min(cap);
                let any = (start..end).any(|i| {
                    g.table
                        .slot(i)
                        .is_some_and(|it| self.liveness(it, now) != Liveness::Live)
                });
                let sparse = cap > table::MIN_SLOTS && g.table.len().saturating_mul(8) < cap;
                (cap, any, sparse)
            };
            let end = start.saturating_add(chunk).min(cap);
            if any {
                let mut g = write(shard);
                let inner = &mut *g;
                let mut i = start;
                // The table may have been resized in between; stay within it.
                let end = end.min(inner.table.capacity());
                while i < end {
                    let dead = inner
                        .table
                        .slot(i)
                        .map(|it| (self.liveness(it, now) != Liveness::Live, it.has(FETCHED)));
                    match dead {
                        Some((true, fetched)) => {
                            inner.c.crawler_reclaimed += 1;
                            if !fetched {
                                inner.c.expired_unfetched += 1;
                            }
                            self.unlink(&mut inner.table, i);
                            reclaimed += 1;
                            // Look at slot i again: the cluster shifted back into it.
                        }
                        _ => i += 1,
                    }
                }
            }
            budget = budget.saturating_sub(end.saturating_sub(start).max(1));
            if end >= cap {
                if sparse || any {
                    write(shard).table.shrink_if_sparse();
                }
                cur.shard = (cur.shard + 1) & self.shard_mask;
                cur.slot = 0;
                shards_done += 1;
            } else {
                cur.slot = end;
            }
        }
        reclaimed
    }
}

#[cfg(test)]
mod tests;

/// A classic store as a meta store with no meta options.
fn classic(req: StoreRequest<'_>) -> MetaStoreRequest<'_> {
    MetaStoreRequest {
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
    }
}
