//! Unit tests of the log engine.

use super::*;
use std::sync::atomic::AtomicBool;

use crate::{
    ArithResult, Engine, EngineConfig, MetaArithResult, ReadOptions, StoreMode, StoreRequest,
    StoreResult,
};

pub(super) fn cfg(max_bytes: usize) -> EngineConfig {
    EngineConfig {
        max_bytes,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    }
}

pub(super) fn set(e: &LogEngine, key: &[u8], value: &[u8], now: Time) -> StoreResult {
    e.store(
        StoreRequest {
            mode: StoreMode::Set,
            key,
            value,
            flags: 0,
            exptime: 0,
        },
        now,
    )
}

fn req<'a>(mode: StoreMode, key: &'a [u8], value: &'a [u8]) -> StoreRequest<'a> {
    StoreRequest {
        mode,
        key,
        value,
        flags: 0,
        exptime: 0,
    }
}

fn get(e: &LogEngine, key: &[u8], now: Time) -> Option<(Vec<u8>, u32, Time, u64)> {
    let mut out = None;
    e.get(key, now, ReadOptions::default(), &mut |v| {
        out = Some((v.value.to_vec(), v.flags, v.exptime, v.cas));
    });
    out
}

fn val(e: &LogEngine, key: &[u8], now: Time) -> Option<Vec<u8>> {
    get(e, key, now).map(|g| g.0)
}

#[test]
fn set_get_overwrite_delete() {
    let e = LogEngine::new(cfg(64 << 20));
    assert!(get(&e, b"a", 10).is_none());
    let StoreResult::Stored(c1) = set(&e, b"a", b"1", 10) else {
        panic!()
    };
    assert_eq!(val(&e, b"a", 10).as_deref(), Some(&b"1"[..]));
    let StoreResult::Stored(c2) = e.store(
        StoreRequest {
            flags: 7,
            exptime: 100,
            ..req(StoreMode::Set, b"a", b"22")
        },
        10,
    ) else {
        panic!()
    };
    assert_ne!(c1, c2);
    assert_eq!(get(&e, b"a", 10), Some((b"22".to_vec(), 7, 100, c2)));
    assert_eq!(e.stats().curr_items, 1);
    assert!(e.delete(b"a", 10));
    assert!(!e.delete(b"a", 10));
    assert!(get(&e, b"a", 10).is_none());
    let s = e.stats();
    assert_eq!((s.curr_items, s.bytes, s.total_items), (0, 0, 2));
    let items: std::collections::HashMap<_, _> = e.stats_detail("items").into_iter().collect();
    assert_eq!(items["items:1:tombstones"], "1");
}

#[test]
fn modes() {
    let e = LogEngine::new(cfg(64 << 20));
    assert_eq!(
        e.store(req(StoreMode::Replace, b"k", b"x"), 1),
        StoreResult::NotStored
    );
    assert_eq!(
        e.store(req(StoreMode::Append, b"k", b"x"), 1),
        StoreResult::NotStored
    );
    assert_eq!(
        e.store(req(StoreMode::Cas(5), b"k", b"x"), 1),
        StoreResult::NotFound
    );
    assert!(matches!(
        e.store(req(StoreMode::Add, b"k", b"mid"), 1),
        StoreResult::Stored(_)
    ));
    assert_eq!(
        e.store(req(StoreMode::Add, b"k", b"x"), 1),
        StoreResult::NotStored
    );
    assert!(matches!(
        e.store(req(StoreMode::Append, b"k", b">>"), 1),
        StoreResult::Stored(_)
    ));
    assert!(matches!(
        e.store(req(StoreMode::Prepend, b"k", b"<<"), 1),
        StoreResult::Stored(_)
    ));
    assert_eq!(val(&e, b"k", 1).as_deref(), Some(&b"<<mid>>"[..]));
    let cas = get(&e, b"k", 1).map(|g| g.3).unwrap_or(0);
    assert_eq!(
        e.store(req(StoreMode::Cas(cas + 1), b"k", b"c"), 1),
        StoreResult::Exists
    );
    assert_eq!(
        e.store(req(StoreMode::Cas(0), b"k", b"c"), 1),
        StoreResult::Exists
    );
    assert!(matches!(
        e.store(req(StoreMode::Cas(cas), b"k", b"c"), 1),
        StoreResult::Stored(_)
    ));
    assert_eq!(
        e.store(req(StoreMode::Cas(cas), b"k", b"d"), 1),
        StoreResult::Exists
    );
    assert!(matches!(
        e.store(req(StoreMode::Replace, b"k", b"r"), 1),
        StoreResult::Stored(_)
    ));
    assert_eq!(val(&e, b"k", 1).as_deref(), Some(&b"r"[..]));
}

#[test]
fn append_keeps_flags_and_exptime() {
    let e = LogEngine::new(cfg(64 << 20));
    e.store(
        StoreRequest {
            flags: 3,
            exptime: 50,
            ..req(StoreMode::Set, b"k", b"a")
        },
        1,
    );
    e.store(
        StoreRequest {
            flags: 9,
            exptime: 99,
            ..req(StoreMode::Append, b"k", b"b")
        },
        1,
    );
    let g = get(&e, b"k", 1).map(|g| (g.0, g.1, g.2));
    assert_eq!(g, Some((b"ab".to_vec(), 3, 50)));
}

#[test]
fn expiry_and_touch() {
    let e = LogEngine::new(cfg(64 << 20));
    e.store(
        StoreRequest {
            exptime: 20,
            ..req(StoreMode::Set, b"k", b"v")
        },
        10,
    );
    assert!(get(&e, b"k", 19).is_some());
    let cas = get(&e, b"k", 19).map(|g| g.3);
    assert!(e.touch(b"k", 30, 19));
    assert_eq!(
        get(&e, b"k", 25).map(|g| (g.2, g.3)),
        Some((30, cas.unwrap_or(0)))
    );
    // gat returns the new expiry.
    let mut seen = None;
    assert!(
        e.get(b"k", 25, ReadOptions { touch: Some(40) }, &mut |v| seen =
            Some(v.exptime))
    );
    assert_eq!(seen, Some(40));
    assert!(get(&e, b"k", 39).is_some());
    assert!(get(&e, b"k", 40).is_none());
    assert_eq!(e.stats().get_expired, 1);
    assert!(!e.touch(b"k", 100, 40));
    assert_eq!(e.stats().curr_items, 0);
    // A past exptime stores an already-expired item that replaces the old one.
    set(&e, b"p", b"old", 50);
    e.store(
        StoreRequest {
            exptime: 10,
            ..req(StoreMode::Set, b"p", b"new")
        },
        50,
    );
    assert!(get(&e, b"p", 50).is_none());
    assert!(matches!(
        e.store(req(StoreMode::Add, b"p", b"x"), 50),
        StoreResult::Stored(_)
    ));
}

#[test]
fn arith() {
    let e = LogEngine::new(cfg(64 << 20));
    assert_eq!(e.arith(b"n", true, 1, 1), ArithResult::NotFound);
    set(&e, b"n", b"10", 1);
    assert_eq!(e.arith(b"n", true, 5, 1), ArithResult::Value(15));
    assert_eq!(e.arith(b"n", false, 6, 1), ArithResult::Value(9));
    assert_eq!(val(&e, b"n", 1).as_deref(), Some(&b"9 "[..]));
    assert_eq!(e.arith(b"n", false, 100, 1), ArithResult::Value(0));
    assert_eq!(
        e.arith(b"n", true, u64::MAX, 1),
        ArithResult::Value(u64::MAX)
    );
    assert_eq!(e.arith(b"n", true, 2, 1), ArithResult::Value(1));
    set(&e, b"t", b"abc", 1);
    assert_eq!(e.arith(b"t", true, 1, 1), ArithResult::NonNumeric);
    let total = e.stats().total_items;
    set(&e, b"m", b"99", 1);
    assert_eq!(e.arith(b"m", true, 1, 1), ArithResult::Value(100));
    assert_eq!(e.stats().total_items, total + 2);
}

#[test]
fn cas_off() {
    let e = LogEngine::new(EngineConfig {
        use_cas: false,
        ..cfg(64 << 20)
    });
    assert_eq!(set(&e, b"k", b"v", 1), StoreResult::Stored(0));
    assert_eq!(get(&e, b"k", 1).map(|g| g.3), Some(0));
    assert_eq!(
        e.store(req(StoreMode::Cas(0), b"k", b"x"), 1),
        StoreResult::Exists
    );
}

#[test]
fn too_large() {
    let e = LogEngine::new(EngineConfig {
        max_item_size: 1000,
        ..cfg(64 << 20)
    });
    set(&e, b"k", b"v", 1);
    // memcached's sizing: 48-byte header + key + NUL + value + CRLF + CAS (8) = 1000.
    let fits = 1000 - 48 - 1 - 1 - 2 - 8;
    assert!(matches!(
        set(&e, b"k", &vec![0u8; fits], 1),
        StoreResult::Stored(_)
    ));
    assert_eq!(
        set(&e, b"k", &vec![0u8; fits + 1], 1),
        StoreResult::TooLarge
    );
    assert!(
        get(&e, b"k", 1).is_none(),
        "a refused set drops the old item"
    );
    assert_eq!(set(&e, &[b'k'; 256], b"v", 1), StoreResult::TooLarge);
    assert!(get(&e, &[b'k'; 256], 1).is_none());
    set(&e, b"a", &[1u8; 600], 1);
    assert_eq!(
        e.store(req(StoreMode::Append, b"a", &[2u8; 600]), 1),
        StoreResult::NotStored
    );
}

#[test]
fn large_items() {
    let e = LogEngine::new(EngineConfig {
        max_item_size: 4 << 20,
        ..cfg(64 << 20)
    });
    let big: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
    assert!(matches!(set(&e, b"big", &big, 1), StoreResult::Stored(_)));
    assert_eq!(val(&e, b"big", 1), Some(big.clone()));
    assert!(e.stats().total_malloced >= 3_000_000);
    assert!(matches!(
        e.store(req(StoreMode::Append, b"big", b"tail"), 1),
        StoreResult::Stored(_)
    ));
    assert_eq!(val(&e, b"big", 1).map(|v| v.len()), Some(big.len() + 4));
    assert!(e.touch(b"big", 100, 1));
    assert!(e.delete(b"big", 1));
    assert!(get(&e, b"big", 1).is_none());
    // Dead large segments are freed by maintenance.
    e.maintain(1, true);
    let slabs: std::collections::HashMap<_, _> = e.stats_detail("slabs").into_iter().collect();
    assert_eq!(slabs["large_items_segments"], "0");
    // Larger than all memory: too large.
    let e = LogEngine::new(EngineConfig {
        max_item_size: 16 << 20,
        ..cfg(8 << 20)
    });
    assert_eq!(
        set(&e, b"huge", &vec![0u8; 12 << 20], 1),
        StoreResult::TooLarge
    );
}

#[test]
fn flush_immediate_and_delayed() {
    let e = LogEngine::new(cfg(64 << 20));
    set(&e, b"a", b"1", 100);
    e.flush_all(0, 100);
    assert!(get(&e, b"a", 100).is_none());
    set(&e, b"b", b"2", 100);
    assert!(get(&e, b"b", 100).is_some(), "stored after the flush");
    // Delayed: at 110 invalidates items stored up to 109, from time 109 on.
    e.flush_all(110, 100);
    set(&e, b"c", b"3", 105);
    assert!(get(&e, b"b", 108).is_some());
    assert!(get(&e, b"b", 109).is_none());
    set(&e, b"d", b"4", 109);
    assert!(get(&e, b"d", 109).is_none());
    set(&e, b"e", b"5", 110);
    assert!(get(&e, b"e", 110).is_some());
    assert!(get(&e, b"c", 110).is_none());
    assert!(get(&e, b"d", 111).is_none());
    assert!(e.stats().get_flushed >= 3);
}

#[test]
fn maintain_reclaims_expired() {
    let e = LogEngine::new(cfg(64 << 20));
    for i in 0..100u32 {
        let k = format!("k{i}");
        e.store(
            StoreRequest {
                exptime: if i % 2 == 0 { 10 } else { 0 },
                ..req(StoreMode::Set, k.as_bytes(), b"v")
            },
            1,
        );
    }
    // Enough calls to cover the index (65536 buckets per call).
    let calls = e.index.nmain().div_ceil(MAINTAIN_BUCKETS);
    assert_eq!((0..calls).map(|_| e.maintain(5, true)).sum::<u64>(), 0);
    // Nothing can have expired yet: no segment's earliest expiry has come, so no record
    // is read.
    assert_eq!(
        e.stats().crawler_items_checked,
        0,
        "a pass before any expiry"
    );
    // Without the sweep (-o no_lru_crawler) expired items stay until found.
    assert_eq!((0..calls).map(|_| e.maintain(10, false)).sum::<u64>(), 0);
    assert_eq!(e.stats().curr_items, 100);
    assert_eq!(
        e.stats().crawler_items_checked,
        0,
        "no sweep, nothing checked"
    );
    assert_eq!((0..calls).map(|_| e.maintain(10, true)).sum::<u64>(), 50);
    assert_eq!(e.stats().curr_items, 50);
    assert_eq!(e.stats().expired_unfetched, 50);
    assert_eq!(e.stats().crawler_reclaimed, 50);
    // Only the items with a time to live were read: the others cannot expire.
    assert_eq!(e.stats().crawler_items_checked, 50);
}

#[test]
fn the_sweep_reads_items_without_expiry_only_after_a_flush() {
    let e = LogEngine::new(cfg(64 << 20));
    for i in 0..100u32 {
        let k = format!("k{i}");
        e.store(req(StoreMode::Set, k.as_bytes(), b"v"), 1);
    }
    let calls = e.index.nmain().div_ceil(MAINTAIN_BUCKETS);
    let pass = |now| (0..calls).map(|_| e.maintain(now, true)).sum::<u64>();
    assert_eq!(pass(5), 0);
    assert_eq!(e.stats().crawler_items_checked, 0, "nothing can be dead");
    // A flush: the next pass reads every item and reclaims them all.
    e.flush_all(0, 6);
    for i in 100..110u32 {
        let k = format!("k{i}");
        e.store(req(StoreMode::Set, k.as_bytes(), b"v"), 6);
    }
    assert_eq!(pass(6), 100, "the flushed items");
    assert_eq!(e.stats().crawler_items_checked, 110);
    assert_eq!(e.stats().curr_items, 10);
    // A whole pass has gone by under this flush: back to reading nothing.
    assert_eq!(pass(7), 0);
    assert_eq!(e.stats().crawler_items_checked, 110);
    // A delayed flush whose time has come makes every item dead again.
    e.flush_all(8, 7);
    assert_eq!(pass(9), 10, "flushed by the delayed flush");
    assert_eq!(e.stats().curr_items, 0);
}

fn fill(e: &LogEngine, n: usize, vlen: usize, now: Time) {
    for i in 0..n {
        let k = format!("key:{i}");
        let v = vec![(i % 251) as u8; vlen];
        assert!(
            matches!(set(e, k.as_bytes(), &v, now), StoreResult::Stored(_)),
            "set {i}"
        );
    }
}

#[test]
fn eviction_keeps_memory_bounded_and_values_right() {
    let e = LogEngine::new(cfg(4 << 20));
    let n = 60_000;
    fill(&e, n, 100, 1);
    let s = e.stats();
    assert!(s.evictions > 0);
    assert!(e.memory_bytes() <= 4 << 20, "{} > limit", e.memory_bytes());
    let mut present = 0;
    for i in 0..n {
        let k = format!("key:{i}");
        if let Some(v) = val(&e, k.as_bytes(), 1) {
            assert_eq!(v, vec![(i % 251) as u8; 100]);
            present += 1;
        }
    }
    assert_eq!(present as u64, e.stats().curr_items);
    // The newest items survive FIFO eviction.
    assert!(val(&e, format!("key:{}", n - 1).as_bytes(), 1).is_some());
}

#[test]
fn second_chance_keeps_hot_items() {
    let e = LogEngine::new(cfg(4 << 20));
    // Hot keys written first, then read between waves of cold writes.
    for i in 0..100 {
        set(&e, format!("hot:{i}").as_bytes(), &[7u8; 100], 1);
    }
    for wave in 0..20 {
        for i in 0..100 {
            assert!(
                get(&e, format!("hot:{i}").as_bytes(), 1).is_some(),
                "hot:{i} lost in wave {wave}: {:?} {:?} {:?}",
                e.stats(),
                e.stats_detail("items"),
                e.stats_detail("slabs")
            );
        }
        for i in 0..5_000 {
            set(&e, format!("cold:{wave}:{i}").as_bytes(), &[1u8; 100], 1);
        }
    }
    assert!(e.stats().evictions > 0);
    let items: std::collections::HashMap<_, _> = e.stats_detail("items").into_iter().collect();
    assert_ne!(items["items:1:copied_forward"], "0");
}

/// Items read once after they were written, then pushed out by a flood of unread ones:
/// how many of `small` (100 bytes) and `big` (4000 bytes) keys are left.
fn survivors(factor: u32) -> (usize, usize) {
    let e = LogEngine::new(cfg(4 << 20));
    e.set_size_factor(factor);
    for i in 0..20 {
        set(&e, format!("small:{i}").as_bytes(), &[1u8; 100], 1);
        set(&e, format!("big:{i}").as_bytes(), &[2u8; 4000], 1);
    }
    for i in 0..20 {
        assert!(get(&e, format!("small:{i}").as_bytes(), 1).is_some());
        assert!(get(&e, format!("big:{i}").as_bytes(), 1).is_some());
    }
    for i in 0..40_000 {
        set(&e, format!("cold:{i}").as_bytes(), &[3u8; 100], 1);
    }
    // Every segment the hot items were written to was evicted.
    assert!(e.peek_item(b"cold:0", 1).is_none());
    let left = |p: &str| {
        (0..20)
            .filter(|i| e.peek_item(format!("{p}:{i}").as_bytes(), 1).is_some())
            .count()
    };
    (left("small"), left("big"))
}

#[test]
fn size_factor_keeps_small_items_read_once_and_large_ones_read_more() {
    // With the default factor a 4000-byte item (about 35 times the mean) needs three
    // reads to be kept; a 100-byte one needs one.
    assert_eq!(survivors(DEFAULT_SIZE_FACTOR), (20, 0));
    // Without a size factor one read keeps either.
    assert_eq!(survivors(0), (20, 20));
}

/// Whether a key stored, evicted unread and stored again survives the next flood; and the
/// engine's `readmitted` count.
fn readmitted(factor: u32) -> (bool, u64) {
    let mut e = LogEngine::new(cfg(4 << 20));
    // A fixed hash seed: whether an unrelated key shares both of a key's sketch counters
    // (a false positive) must not change from run to run.
    e.seed = 0x5eed_0000_0000_0001;
    e.set_size_factor(factor);
    // Few keys (the sketch forgets after a quarter of its counters' additions), large
    // enough to fill the 4 MiB twice.
    let flood = |wave: u32| {
        for i in 0..8_000 {
            set(&e, format!("cold:{wave}:{i}").as_bytes(), &[3u8; 1000], 1);
        }
    };
    // The sketch counts only once eviction has begun.
    flood(0);
    set(&e, b"again", &[1u8; 100], 1);
    flood(1);
    assert!(e.peek_item(b"again", 1).is_none());
    set(&e, b"again", &[1u8; 100], 1);
    flood(2);
    let items: std::collections::HashMap<_, _> = e.stats_detail("items").into_iter().collect();
    (
        e.peek_item(b"again", 1).is_some(),
        items["items:1:readmitted"].parse().unwrap_or(0),
    )
}

#[test]
fn a_key_stored_again_after_eviction_counts_as_read() {
    let (kept, n) = readmitted(DEFAULT_SIZE_FACTOR);
    assert!(kept);
    assert!(n >= 1, "{n}");
    // Without a size factor the sketch is not used.
    assert_eq!(readmitted(0), (false, 0));
}

#[test]
fn no_evict_refuses_writes() {
    let e = LogEngine::new(EngineConfig {
        no_evict: true,
        ..cfg(2 << 20)
    });
    let mut refused = false;
    for i in 0..100_000 {
        match set(&e, format!("key:{i}").as_bytes(), &[1u8; 100], 1) {
            StoreResult::Stored(_) => {}
            StoreResult::NoMemory => {
                refused = true;
                break;
            }
            r => panic!("{r:?}"),
        }
    }
    assert!(refused);
    assert_eq!(e.stats().evictions, 0);
    assert!(val(&e, b"key:0", 1).is_some());
    // Deleting still works without room for a tombstone.
    assert!(e.delete(b"key:0", 1));
}

/// Fill a no_evict engine with `value_len`-byte items expiring at `exptime` until it
/// refuses one; the keys stored.
fn fill_no_evict(e: &LogEngine, value_len: usize, exptime: Time) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    for i in 0..1_000_000 {
        let key = format!("key:{i}").into_bytes();
        let value = value_of(&key, value_len);
        match e.store(
            StoreRequest {
                exptime,
                ..req(StoreMode::Set, &key, &value)
            },
            1,
        ) {
            StoreResult::Stored(_) => keys.push(key),
            StoreResult::NoMemory => return keys,
            r => panic!("{r:?}"),
        }
    }
    panic!("never full");
}

fn value_of(key: &[u8], value_len: usize) -> Vec<u8> {
    let n: usize = key
        .iter()
        .filter(|c| c.is_ascii_digit())
        .fold(0, |n, c| n * 10 + usize::from(c - b'0'));
    vec![(n % 251) as u8; value_len]
}

#[test]
fn no_evict_touch_succeeds_with_full_memory() {
    // memcached's touch changes the expiry in place; here it rewrites the item, which
    // with -M and a full log goes into the compactor's segment, refilled by compaction.
    let e = LogEngine::new(EngineConfig {
        no_evict: true,
        ..cfg(4 << 20)
    });
    let keys = fill_no_evict(&e, 100, 500);
    assert!(keys.len() > 10_000, "{} items", keys.len());
    // Every item, three times over: far more than any reserve holds, so compaction must
    // keep reclaiming the bytes the earlier touches left dead.
    for round in 0..3u32 {
        for k in &keys {
            assert!(e.touch(k, 1000 + round, 2), "touch {k:?} round {round}");
        }
    }
    assert_ne!(stat_item(&e, "segments_compacted"), "0");
    for k in &keys {
        let (v, _, exp, _) = get(&e, k, 2).expect("item kept");
        assert_eq!(v, value_of(k, 100));
        assert_eq!(exp, 1002);
    }
    assert_eq!(e.stats().evictions, 0);
    assert_eq!(e.stats().curr_items, keys.len() as u64);
    e.check_accounting().unwrap();
    // New items take what compaction freed, then find no room: -M refuses them rather
    // than evict.
    let refused = (0..keys.len())
        .find(|i| set(&e, format!("new:{i}").as_bytes(), &[0u8; 100], 2) == StoreResult::NoMemory);
    assert!(refused.is_some_and(|n| n < keys.len() / 10), "{refused:?}");
    assert_eq!(e.stats().evictions, 0);
    for k in &keys {
        assert!(get(&e, k, 2).is_some(), "{k:?} kept");
    }
}

#[test]
fn no_evict_touch_that_adds_an_expiry_fits_in_the_reserve() {
    // An item without an expiry grows by its expiry field when touched: the memory kept
    // for rewrites takes a share of such touches.
    let e = LogEngine::new(EngineConfig {
        no_evict: true,
        ..cfg(4 << 20)
    });
    let keys = fill_no_evict(&e, 100, 0);
    let some: Vec<_> = keys.iter().step_by(10).collect();
    for k in &some {
        assert!(e.touch(k, 1000, 2), "touch {k:?}");
    }
    for k in &some {
        assert_eq!(get(&e, k, 2).map(|g| g.2), Some(1000));
    }
    assert_eq!(e.stats().curr_items, keys.len() as u64);
    e.check_accounting().unwrap();
}

#[test]
fn no_evict_reuses_the_bytes_of_deleted_items() {
    let e = LogEngine::new(EngineConfig {
        no_evict: true,
        ..cfg(4 << 20)
    });
    let keys = fill_no_evict(&e, 200, 0);
    // Every other item deleted: no segment is left without a live item.
    for k in keys.iter().step_by(2) {
        assert!(e.delete(k, 1));
    }
    // Most of the room they held takes new items.
    let mut stored = 0;
    for i in 0..keys.len() {
        let key = format!("new:{i}");
        match set(&e, key.as_bytes(), &[7u8; 200], 1) {
            StoreResult::Stored(_) => stored += 1,
            StoreResult::NoMemory => break,
            r => panic!("{r:?}"),
        }
    }
    assert!(
        stored * 10 >= keys.len() / 2 * 7,
        "{stored} new items in the room of {} deleted",
        keys.len() / 2
    );
    for k in keys.iter().skip(1).step_by(2) {
        assert_eq!(val(&e, k, 1), Some(value_of(k, 200)), "{:?}", k);
    }
    assert_eq!(e.stats().evictions, 0);
    e.check_accounting().unwrap();
}

fn stat_item(e: &LogEngine, name: &str) -> String {
    let want = format!("items:1:{name}");
    e.stats_detail("items")
        .into_iter()
        .find(|(k, _)| *k == want)
        .map(|(_, v)| v)
        .unwrap_or_default()
}

#[test]
fn shrink_and_grow() {
    let e = LogEngine::new(cfg(32 << 20));
    fill(&e, 100_000, 200, 1);
    let before = e.stats().total_malloced;
    e.set_max_bytes(16 << 20, 1);
    let after = e.stats().total_malloced;
    assert!(after < before);
    assert!(e.memory_bytes() <= 16 << 20, "{}", e.memory_bytes());
    assert_eq!(e.stats().limit_maxbytes, 16 << 20);
    // The index stays as it grew (for 100,000 items); segments get the rest.
    e.set_max_bytes(4 << 20, 1);
    assert!(e.memory_bytes() <= 4 << 20, "{}", e.memory_bytes());
    assert!(val(&e, b"key:99999", 1).is_some());
    e.set_max_bytes(16 << 20, 1);
    // Still works, and values are right.
    fill(&e, 10_000, 200, 1);
    assert_eq!(val(&e, b"key:9999", 1), Some(vec![(9999 % 251) as u8; 200]));
    e.set_max_bytes(32 << 20, 1);
    fill(&e, 50_000, 200, 1);
    assert!(e.stats().total_malloced > after);
}

#[test]
fn lossy_index_overflow_is_counted() {
    // Many small items in an engine whose index is tiny relative to the items.
    let e = LogEngine::new(cfg(1 << 20));
    fill(&e, 50_000, 1, 1);
    let s = e.stats();
    let present = (0..50_000)
        .filter(|i| get(&e, format!("key:{i}").as_bytes(), 1).is_some())
        .count();
    assert_eq!(present as u64, s.curr_items);
    assert!(
        e.memory_bytes() <= 1 << 20,
        "{} = {} + {} (budget {}, seg {})",
        e.memory_bytes(),
        e.arena.allocated(),
        e.index_bytes(),
        e.budget(),
        e.segment_size()
    );
}

#[test]
fn pins_block_reuse_until_readers_leave() {
    // A reader holding a pin keeps the barrier waiting; the barrier finishes once it
    // unpins. (Checks the mechanism eviction relies on, without sleeping.)
    let e = LogEngine::new(cfg(4 << 20));
    let pin = e.pin();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            e.barrier();
            done.store(true, Ordering::SeqCst);
        });
        // The barrier cannot pass our pin (same pin lock or not, the barrier takes all).
        for _ in 0..1000 {
            std::thread::yield_now();
        }
        assert!(!done.load(Ordering::SeqCst));
        drop(pin);
        let _ = t.join();
    });
    assert!(done.load(Ordering::SeqCst));
}

#[test]
fn stats_detail_groups() {
    let e = LogEngine::new(cfg(16 << 20));
    fill(&e, 1000, 10, 1);
    let slabs: std::collections::HashMap<_, _> = e.stats_detail("slabs").into_iter().collect();
    for k in [
        "segment_size",
        "segments_total",
        "segments_free",
        "live_bytes",
        "dead_bytes",
        "index_bytes",
    ] {
        assert!(slabs.contains_key(k), "{k}");
    }
    let items: std::collections::HashMap<_, _> = e.stats_detail("items").into_iter().collect();
    assert!(items.contains_key("items:1:evicted"));
    assert!(e.stats_detail("nope").is_empty());
    e.reset_stats();
    assert_eq!(e.stats().total_items, 0);
    assert_eq!(e.stats().curr_items, 1000);
}

#[test]
fn a_view_stays_valid_while_its_segment_is_evicted() {
    // A reader inside its get callback holds a view into the oldest segment while a writer
    // fills memory: eviction cleans that segment (unlinks it), then must wait for the
    // reader before the memory is reused. The view must not change meanwhile.
    let e = LogEngine::new(cfg(2 << 20));
    let pattern: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    set(&e, b"victim", &pattern, 1);
    // Fill (and so seal) this thread's open segment, so that the victim's segment is the
    // oldest in the FIFO.
    let fillers = e.segment_size() / 1000 + 2;
    for i in 0..fillers {
        set(&e, format!("filler:{i}").as_bytes(), &[0u8; 1000], 1);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            // What `get` does around its callback, minus the access bit (so that the
            // victim is not copied forward and its segment goes straight to reuse).
            let pin = e.pin();
            let h = e.hash(b"victim");
            let mut fetch = super::flash::Fetch::default();
            // SAFETY: pinned for as long as `r` is used.
            let (_, _, r) = unsafe { e.lookup(h, b"victim", &mut fetch) }.expect("victim present");
            let _ = tx.send(());
            // Wait (without sleeping) until an eviction has cleaned a segment: the first
            // one is the victim's, and its evictor is now held up by our pin.
            while e.stats.totals().segments_evicted == 0 {
                std::thread::yield_now();
            }
            // While we hold the pin, that evictor cannot finish; if it could (a broken
            // barrier), the writer would go on evicting and reusing segments, the
            // victim's first, and the value would change under us. Held for 200,000
            // yields to the writer, or half a second where each yield gives the CPU away
            // for long (one CPU shared with a busy neighbour: 200,000 yields took minutes).
            let held = std::time::Instant::now();
            for _ in 0..200_000 {
                std::thread::yield_now();
                assert!(
                    r.value == &pattern[..],
                    "the value changed under a pinned reader"
                );
                if e.stats.totals().segments_evicted > 64
                    || held.elapsed() > std::time::Duration::from_millis(500)
                {
                    break;
                }
            }
            drop(pin);
        });
        rx.recv().expect("reader holds its view");
        let writer = s.spawn(|| fill(&e, 20_000, 100, 1));
        reader.join().expect("reader");
        writer.join().expect("writer");
    });
    assert!(e.stats().evictions > 0);
    e.check_accounting().expect("accounting");
}

#[test]
fn a_panicking_gat_callback_leaves_the_engine_consistent() {
    let e = LogEngine::new(cfg(16 << 20));
    set(&e, b"k", b"value", 1);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        e.get(b"k", 1, ReadOptions { touch: Some(100) }, &mut |_| {
            panic!("callback failure")
        })
    }));
    assert!(r.is_err());
    // Later appends by this thread go after the touched record, not over it.
    for i in 0..100 {
        set(&e, format!("other:{i}").as_bytes(), b"xxxxxxxxxxxxxxxx", 1);
    }
    assert_eq!(
        get(&e, b"k", 1).map(|g| (g.0, g.2)),
        Some((b"value".to_vec(), 100))
    );
    e.check_accounting().expect("accounting");
}

type Item = (Vec<u8>, u32, u32, u64);

/// Replay the log as `FORMAT.md` describes: per key, the record with the highest
/// (CAS, rewrite stamp) wins, unless a tombstone with a higher CAS exists.
fn replay(e: &LogEngine, now: Time) -> std::collections::HashMap<Vec<u8>, Item> {
    use std::collections::HashMap;
    let mut best: HashMap<Vec<u8>, ((u64, u64), Item)> = HashMap::new();
    let mut tombs: HashMap<Vec<u8>, u64> = HashMap::new();
    for id in 0..e.seg_ids() {
        let Some(seg) = e.segs.get(id) else { continue };
        let Some((p, cap)) = seg.mapping() else {
            continue;
        };
        let p = p.as_ptr();
        // SAFETY: the test is single-threaded here; the mapping is live and unmodified.
        let hdr = unsafe { std::slice::from_raw_parts(p, format::SEG_HDR) };
        if &hdr[0..4] != b"KVLG" {
            continue; // never opened (the evictor's spare)
        }
        let base = u64::from_le_bytes(hdr[16..24].try_into().unwrap());
        let mut off = format::SEG_HDR;
        // Scan until the first unpublished (zero) state byte, ignoring `used`.
        // SAFETY: as above.
        while let Some(r) = unsafe { format::read(p, cap, off, base) } {
            off += r.len;
            if r.kind == format::KIND_TOMBSTONE {
                let t = tombs.entry(r.key.to_vec()).or_default();
                *t = (*t).max(r.cas);
                continue;
            }
            let order = (r.cas, r.stamp);
            let item = (r.value.to_vec(), r.flags, r.exptime, r.cas);
            let e = best.entry(r.key.to_vec()).or_insert((order, item.clone()));
            if order > e.0 {
                *e = (order, item);
            }
        }
    }
    best.into_iter()
        .filter(|(k, (_, it))| tombs.get(k).is_none_or(|&t| it.3 >= t))
        .filter(|(_, (_, it))| it.2 == 0 || it.2 > now)
        .map(|(k, (_, it))| (k, it))
        .collect()
}

#[test]
fn the_log_replays_to_the_same_items() {
    let e = LogEngine::new(EngineConfig {
        max_item_size: 1 << 20,
        ..cfg(64 << 20)
    });
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut now = 1000;
    for i in 0..20_000u32 {
        let k = format!("key:{}", rnd(300));
        let k = k.as_bytes();
        let v = vec![
            b'a' + (i % 26) as u8;
            rnd(40) as usize + if rnd(100) == 0 { 1_200_000 } else { 0 }
        ];
        match rnd(10) {
            0..=3 => {
                e.store(
                    StoreRequest {
                        flags: i % 3,
                        exptime: if rnd(5) == 0 { now + 3 } else { 0 },
                        ..req(StoreMode::Set, k, &v)
                    },
                    now,
                );
            }
            4 => {
                e.store(req(StoreMode::Append, k, b"+"), now);
            }
            5 => {
                e.store(req(StoreMode::Prepend, k, b"-"), now);
            }
            6 => {
                e.delete(k, now);
            }
            7 => {
                e.touch(k, if rnd(2) == 0 { 0 } else { now + 5 }, now);
            }
            8 => {
                e.store(req(StoreMode::Set, k, b"7"), now);
                e.arith(k, true, rnd(1000), now);
            }
            _ => {
                e.get(k, now, ReadOptions::default(), &mut |_| {});
            }
        }
        if i % 1000 == 0 {
            now += 1;
        }
    }
    assert_eq!(e.stats().evictions, 0);
    let replayed = replay(&e, now);
    let mut live = 0;
    for i in 0..300 {
        let k = format!("key:{i}").into_bytes();
        let got = e.peek_item(&k, now);
        assert_eq!(replayed.get(&k).cloned(), got, "key {i}");
        live += usize::from(got.is_some());
    }
    assert!(live > 50);
    let items: std::collections::HashMap<_, _> = e.stats_detail("items").into_iter().collect();
    assert_ne!(items["items:1:tombstones"], "0");
}

#[test]
fn the_index_grows_with_the_items_and_reports_it() {
    let e = LogEngine::new(cfg(256 << 20));
    let start = e.stats();
    assert!(!start.hash_is_expanding);
    fill(&e, 200_000, 10, 1);
    let grown = e.stats();
    // 200,000 items in 8-slot main buckets at load 1.0: 25,000 buckets, level 14.
    assert!(
        grown.hash_power_level >= 14 && grown.hash_power_level > start.hash_power_level,
        "{} -> {}",
        start.hash_power_level,
        grown.hash_power_level
    );
    assert!(grown.hash_bytes > start.hash_bytes);
    assert_eq!(grown.hash_bytes as usize, e.index_bytes());
    // Sized to the items, not to -m: well under a tenth of the limit here.
    assert!(grown.hash_bytes < (256 << 20) / 10, "{}", grown.hash_bytes);
    // Every item is still found through the grown index.
    for i in (0..200_000).step_by(13) {
        assert!(
            get(&e, format!("key:{i}").as_bytes(), 1).is_some(),
            "key:{i}"
        );
    }
    e.maintain(1, true);
    assert!(
        !e.stats().hash_is_expanding,
        "maintain finishes a pending batch"
    );
    e.check_accounting().unwrap();
}

/// The digest depends on the live items only: the same items stored in another order (with
/// the same CAS uniques) into an engine of another size give the same digest; a changed
/// value, flag, expiry or CAS changes it; expired and deleted items do not count.
#[test]
fn digest_depends_on_the_items_only() {
    let now: Time = 1_000_000;
    let store = |e: &LogEngine, k: usize, flags: u32, exptime: Time, value: &[u8]| {
        let key = format!("key:{k}");
        let r = e.meta_store(
            crate::MetaStoreRequest {
                mode: StoreMode::Set,
                key: key.as_bytes(),
                value,
                flags,
                exptime,
                compare_cas: None,
                new_cas: Some(1000 + k as u64),
                invalidate: false,
                vivify: false,
                binary_key: false,
            },
            now,
        );
        assert!(matches!(r.result, StoreResult::Stored(_)), "{r:?}");
    };
    let (a, b) = (LogEngine::new(cfg(64 << 20)), LogEngine::new(cfg(8 << 20)));
    let n = 5000;
    for k in 0..n {
        store(&a, k, k as u32 % 3, 0, format!("v{k}").as_bytes());
    }
    for k in (0..n).rev() {
        store(&b, k, k as u32 % 3, 0, format!("v{k}").as_bytes());
    }
    let da = a.digest(now);
    assert_eq!(da.items, n as u64);
    assert_eq!(da, b.digest(now), "same items, other order and engine size");
    assert_eq!(da.hex().len(), 32);
    // Any field of one item changes it.
    store(&b, 7, 0, 0, b"other");
    let changed = b.digest(now);
    assert_ne!(changed, da);
    store(&b, 7, 7 % 3, 0, b"v7");
    assert_eq!(b.digest(now), da, "put back");
    store(&b, 7, 9, 0, b"v7");
    assert_ne!(b.digest(now), da, "flags");
    store(&b, 7, 7 % 3, now + 100, b"v7");
    assert_ne!(b.digest(now), da, "expiry");
    // Expired and deleted items do not count.
    store(&b, 7, 7 % 3, now + 1, b"v7");
    let later = b.digest(now + 5);
    assert_eq!(later.items, n as u64 - 1);
    b.delete(b"key:8", now + 5);
    assert_eq!(b.digest(now + 5).items, n as u64 - 2);
}

#[test]
fn size_tally_follows_the_index() {
    let c = cfg(16 << 20);
    let e = LogEngine::new(c.clone());
    assert!(e.size_bands().is_empty() && e.size_steps().is_none());
    // Stored before the tally starts: counted by its first scan.
    assert!(matches!(
        set(&e, b"early", &[1; 10], 1),
        StoreResult::Stored(_)
    ));
    let bounds = [96, 120, 152, 192, 1 << 20];
    e.tally_sizes(&bounds, true);
    let mut model: std::collections::BTreeMap<Vec<u8>, usize> = std::collections::BTreeMap::new();
    model.insert(b"early".to_vec(), 10);
    for (i, vlen) in [10usize, 40, 60, 200, 5000].iter().enumerate() {
        let key = format!("k{i}").into_bytes();
        assert!(matches!(
            set(&e, &key, &vec![2; *vlen], 1),
            StoreResult::Stored(_)
        ));
        model.insert(key, *vlen);
    }
    // An overwrite moves the item to another band; a delete takes it out.
    assert!(matches!(
        set(&e, b"k0", &[3; 70], 1),
        StoreResult::Stored(_)
    ));
    model.insert(b"k0".to_vec(), 70);
    assert!(e.delete(b"k1", 1));
    model.remove(&b"k1"[..]);
    let mut want = vec![crate::SizeBand::default(); bounds.len()];
    let band = |key: &[u8], vlen: usize| {
        let size = c.item_size(key.len(), vlen, 0);
        (bounds.partition_point(|x| (*x as usize) < size), size)
    };
    // Every band an item was ever in stays `used` (k0's first value, deleted k1's).
    for (key, vlen) in [(&b"k0"[..], 10), (b"k1", 40)] {
        want[band(key, vlen).0].used = true;
    }
    let mut steps = std::collections::BTreeMap::new();
    for (k, vlen) in &model {
        let (b, size) = band(k, *vlen);
        want[b].items += 1;
        want[b].bytes += size as u64;
        want[b].used = true;
        *steps.entry(size.div_ceil(32) * 32).or_insert(0u64) += 1;
    }
    assert_eq!(e.size_bands(), want);
    assert_eq!(e.size_steps(), Some(steps.into_iter().collect::<Vec<_>>()));
}

#[test]
fn size_tally_counts_evictions_and_matches_curr_items() {
    let e = LogEngine::new(cfg(2 << 20));
    e.tally_sizes(&[96, 192, 384, 1 << 20], false);
    fill(&e, 20_000, 100, 1);
    let bands = e.size_bands();
    let st = e.stats();
    assert!(st.evictions > 0, "the fill must evict");
    assert_eq!(bands.iter().map(|b| b.items).sum::<u64>(), st.curr_items);
    assert_eq!(bands.iter().map(|b| b.evicted).sum::<u64>(), st.evictions);
    // 100-byte values with keys "key:N": every item is 150-160 bytes, band 2.
    assert_eq!(bands[1].items, st.curr_items);
    e.reset_stats();
    assert!(e.size_bands().iter().all(|b| b.evicted == 0));
}

#[test]
fn ttl_classes_fit_the_memory() {
    // A very small cache has no classes; a larger one more, finer ones.
    assert!(super::ttl::ttl_classes(15, 2).0.is_empty());
    let (small, ways) = super::ttl::ttl_classes(56, 4);
    assert_eq!((small.len(), ways), (7, 1));
    let (large, ways) = super::ttl::ttl_classes(2048, 4);
    assert_eq!((large.len(), ways), (super::ttl::MAX_TTL_CLASSES, 2));
    // From a ratio of 2 at the short end to under 1.1 at the long end.
    assert!(large[large.len() - 1] as f64 / (large[large.len() - 2] as f64) < 1.1);
    for b in [&small, &large] {
        assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        assert!(b[0] >= 2);
        assert_eq!(b.last(), Some(&super::ttl::TTL_SPAN));
    }
    // The open segments of the classes take at most an eighth of the segments.
    for segs in [16, 56, 100, 1000, 100_000] {
        let (b, w) = super::ttl::ttl_classes(segs, 16);
        assert!(b.len() * w <= segs / 8, "{segs}: {} x {w}", b.len());
    }
}

#[test]
fn expired_segments_are_freed_whole() {
    let e = LogEngine::new(cfg(64 << 20));
    assert!(!e.open.ttl().bounds().is_empty());
    // Items that live 5 s fill a few segments of their class; items that never expire
    // and items that live an hour go elsewhere.
    let value = [7u8; 1000];
    let n = 3 * e.seg_size / 1000;
    for i in 0..n {
        let k = format!("short:{i}");
        let r = e.store(
            StoreRequest {
                exptime: 105,
                ..req(StoreMode::Set, k.as_bytes(), &value)
            },
            100,
        );
        assert!(matches!(r, StoreResult::Stored(_)), "{r:?}");
    }
    set(&e, b"forever", b"v", 100);
    e.store(
        StoreRequest {
            exptime: 3700,
            ..req(StoreMode::Set, b"hour", b"v")
        },
        100,
    );
    let held = e.stats().total_malloced;
    assert_eq!(e.stats().curr_items, n as u64 + 2);
    // Before the expiry nothing goes.
    e.maintain(104, true);
    assert_eq!(e.stats.totals().segments_expired, 0);
    assert_eq!(e.stats().curr_items, n as u64 + 2);
    // After it the full segments of the class go at once; the open one is sealed once
    // its first items have all expired (the class's longest time to live, 6 s, after it
    // was opened), and goes too.
    assert_eq!(e.open.ttl().bounds()[0], 6);
    e.maintain(106, true);
    let expired = e.stats.totals().segments_expired;
    assert!(expired >= 3, "{expired} segments expired");
    assert_eq!(e.stats().curr_items, 2);
    assert_eq!(e.stats().reclaimed, n as u64);
    assert!(e.stats().bytes < 100);
    assert_eq!(val(&e, b"forever", 106).as_deref(), Some(&b"v"[..]));
    assert_eq!(val(&e, b"hour", 106).as_deref(), Some(&b"v"[..]));
    assert!(val(&e, b"short:0", 106).is_none());
    // The segments are free for new writes (kept mapped, within the limit).
    assert!(e.arena.pool().free_len() as u64 >= expired);
    assert_eq!(e.stats().total_malloced, held);
    // -o no_lru_crawler: no sweep, nothing expires ahead of eviction.
    let e2 = LogEngine::new(cfg(64 << 20));
    for i in 0..n {
        let k = format!("short:{i}");
        e2.store(
            StoreRequest {
                exptime: 105,
                ..req(StoreMode::Set, k.as_bytes(), &value)
            },
            100,
        );
    }
    e2.maintain(200, false);
    assert_eq!(e2.stats.totals().segments_expired, 0);
}

/// Bytes of expired item records in every mapped segment at `now` (a quiescent engine).
fn expired_bytes(e: &LogEngine, now: Time) -> usize {
    let mut total = 0;
    for id in 0..e.seg_ids() {
        let Some(seg) = e.segs.get(id) else { continue };
        let Some(ptr) = seg.ptr() else {
            continue;
        };
        if seg.seq() == 0 {
            continue; // free
        }
        let used = seg.used();
        // SAFETY: a live segment of a quiescent engine; `used` is its published length.
        unsafe {
            compact::for_records(ptr, used, |_, r| {
                if r.kind == KIND_ITEM && r.exptime != 0 && r.exptime <= now {
                    total += r.len;
                }
                true
            })
        };
    }
    total
}

/// A cache full of items with times to live of 1-60 s, written at a steady rate with a
/// simulated clock (maintain runs every second, as the server runs it every 200 ms): the
/// largest share of the memory limit held by expired items once the cache is full, and
/// the mean number of live items (both looked at every `sample` seconds).
fn ttl_workload(e: &LogEngine, secs: u32, per_sec: u32, sample: u32) -> (f64, f64) {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let limit = e.config.max_bytes as f64;
    let value = [3u8; 200];
    let (mut worst, mut live, mut samples) = (0f64, 0f64, 0f64);
    let mut key = 0u64;
    for s in 0..secs {
        let now = 1000 + s;
        for _ in 0..per_sec {
            key += 1;
            let k = format!("k:{key}");
            let ttl = 1 + (next() % 60) as u32;
            let vlen = 50 + (next() % 150) as usize;
            e.store(
                StoreRequest {
                    exptime: now + ttl,
                    ..req(StoreMode::Set, k.as_bytes(), &value[..vlen])
                },
                now,
            );
        }
        let calls = e.index.nmain().div_ceil(MAINTAIN_BUCKETS).max(1);
        for _ in 0..calls {
            e.maintain(now, true);
        }
        if s >= 90 && s % sample == 0 {
            worst = worst.max(expired_bytes(e, now) as f64 / limit);
            let mut n = 0u64;
            e.for_each_indexed(|_, v| {
                // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
                if let Some(r) = unsafe { e.rec(v) } {
                    n += u64::from(r.exptime > now);
                }
            });
            live += n as f64;
            samples += 1.0;
        }
    }
    (worst, live / samples)
}

#[test]
fn expired_items_hold_little_memory() {
    // 3,000 items of ~200 bytes a second for 60 s is about 35 MB: a full 16 MiB cache.
    let e = LogEngine::new(cfg(16 << 20));
    let (worst, live) = ttl_workload(&e, 150, 3000, 2);
    let mut plain = LogEngine::new(cfg(16 << 20));
    plain.open.set_ttl(super::ttl::TtlClasses::none());
    let (plain_worst, plain_live) = ttl_workload(&plain, 150, 3000, 2);
    println!(
        "TTL classes {:?}: expired bytes at most {:.1}% of the limit, {live:.0} live items; \
         without: {:.1}%, {plain_live:.0}",
        e.open.ttl().bounds(),
        worst * 100.0,
        plain_worst * 100.0
    );
    // At 16 MiB there are only 7 classes (their open segments take an eighth of the
    // memory at most), yet expired items hold a good deal less of it and more items live.
    // The issue's bound (under 5%) holds where the classes are fine: `ttl_workload_1g`.
    assert!(
        worst < 0.75 * plain_worst,
        "expired items held {:.1}%, {:.1}% without classes",
        worst * 100.0,
        plain_worst * 100.0
    );
    assert!(
        live > plain_live,
        "{live} live items, {plain_live} without classes"
    );
}

/// [`expired_items_hold_little_memory`] at 1 GiB, where the classes are fine (a ratio of
/// 1.1): run by hand, `cargo test --release -p kvstore --lib ttl_workload_1g -- --ignored
/// --nocapture`.
#[test]
#[ignore = "a minute of work in release mode; run by hand"]
fn ttl_workload_1g() {
    let mut runs = Vec::new();
    for classes in [true, false] {
        let mut e = LogEngine::new(cfg(1 << 30));
        if !classes {
            e.open.set_ttl(super::ttl::TtlClasses::none());
        }
        let (worst, live) = ttl_workload(&e, 150, 200_000, 5);
        println!(
            "1 GiB, {} TTL classes: expired bytes at most {:.2}% of the limit, {live:.0} live items",
            e.open.ttl().bounds().len(),
            worst * 100.0
        );
        runs.push((worst, live));
    }
    // The simulated clock makes this exact: with the classes, expired records never hold
    // 5% of the limit, and more items live than without them.
    let [(worst, live), (plain_worst, plain_live)] = runs[..] else {
        unreachable!("two runs")
    };
    assert!(worst < 0.05, "expired items held {:.2}%", worst * 100.0);
    assert!(worst < plain_worst && live > plain_live);
}

#[test]
fn busy_ttl_class_falls_back_to_the_shard() {
    let e = LogEngine::new(cfg(64 << 20));
    fn ttl(k: &[u8]) -> StoreRequest<'_> {
        StoreRequest {
            exptime: 110,
            ..req(StoreMode::Set, k, b"v")
        }
    }
    assert!(matches!(e.store(ttl(b"a"), 100), StoreResult::Stored(_)));
    assert_eq!(e.stats.totals().ttl_class_busy, 0);
    // Another writer holds every open segment of the class (10 s lives in class 1).
    assert_eq!(e.open.ttl().bounds().partition_point(|&b| b <= 10), 1);
    let held = e.open.ttl().lock_class(1);
    assert!(matches!(e.store(ttl(b"b"), 100), StoreResult::Stored(_)));
    assert_eq!(e.stats.totals().ttl_class_busy, 1);
    drop(held);
    assert_eq!(val(&e, b"a", 100).as_deref(), Some(&b"v"[..]));
    assert_eq!(val(&e, b"b", 100).as_deref(), Some(&b"v"[..]));
    // Both expire and go with their segments, wherever they were written.
    for _ in 0..2 {
        e.maintain(200, true);
    }
    assert_eq!(e.stats().curr_items, 0);
}

/// `prefetch` is a hint: for present, absent, deleted and evicted keys, and more keys than
/// it looks at, it changes nothing the reads that follow see.
#[test]
fn prefetch_is_only_a_hint() {
    let e = LogEngine::new(cfg(1 << 20));
    for i in 0..2000u32 {
        set(&e, format!("k{i}").as_bytes(), &[b'v'; 100], 10);
    }
    assert!(e.delete(b"k5", 10));
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    e.prefetch(keys.iter().map(|k| k.as_bytes()));
    e.prefetch([&b""[..], b"absent", &[0xff; 250]]);
    e.prefetch(std::iter::empty());
    e.prefetch([&b"k7"[..]]);
    for i in 0..2000u32 {
        let want = (i != 5).then(|| vec![b'v'; 100]);
        let got = val(&e, format!("k{i}").as_bytes(), 10);
        // A 1 MiB engine evicted the oldest keys: those read as misses, never as garbage.
        assert!(got.is_none() || got == want, "k{i}");
    }
    assert!(val(&e, b"k1999", 10).is_some());
}

#[test]
fn the_miss_sketch_follows_the_memory_limit() {
    let e = LogEngine::new(cfg(64 << 20));
    assert_eq!(
        e.eviction.sketch_counters(),
        (64 << 20) / evict::BYTES_PER_COUNTER as u64
    );
    e.set_max_bytes(256 << 20, 10);
    assert_eq!(
        e.eviction.sketch_counters(),
        (256 << 20) / evict::BYTES_PER_COUNTER as u64
    );
    e.set_max_bytes(16 << 20, 10);
    assert_eq!(
        e.eviction.sketch_counters(),
        (16 << 20) / evict::BYTES_PER_COUNTER as u64
    );
}

/// A fresh write stores no version (its place in its segment gives it) and a small item
/// takes a 2-byte header: 100,000 items of a 15-byte key and a 32-byte value written by one
/// thread take 49 bytes each; overwriting them from two threads (segments opened at other
/// times, so some places' versions are below the key's last) keeps most of them that way.
#[test]
fn fresh_writes_store_no_version() {
    let e = LogEngine::new(cfg(256 << 20));
    let now = 1_000_000;
    let value = [b'v'; 32];
    let n = 100_000;
    for i in 0..n {
        let key = format!("key:{i:011}");
        assert!(matches!(
            set(&e, key.as_bytes(), &value, now),
            StoreResult::Stored(_)
        ));
    }
    let live: u64 = e
        .stats_detail("slabs")
        .into_iter()
        .find(|(k, _)| k == "live_bytes")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    assert_eq!(live, 49 * n as u64, "bytes of records");
    // Each key once more, half from another thread, in turns.
    std::thread::scope(|s| {
        for t in 0..2 {
            let e = &e;
            s.spawn(move || {
                for i in (t..n).step_by(2) {
                    let key = format!("key:{i:011}");
                    assert!(matches!(
                        set(e, key.as_bytes(), &value, now),
                        StoreResult::Stored(_)
                    ));
                }
            });
        }
    });
    let live: u64 = e
        .stats_detail("slabs")
        .into_iter()
        .find(|(k, _)| k == "live_bytes")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let per_item = live as f64 / n as f64;
    assert!(per_item <= 50.0, "{per_item:.2} bytes per record");
}

/// A touch or gat that leaves the expiry as it is rewrites nothing (it is an access, as a
/// get is); one that changes it rewrites the item at the log's head, same CAS.
#[test]
fn a_touch_that_keeps_the_expiry_rewrites_nothing() {
    let e = LogEngine::new(cfg(16 << 20));
    let now = 1_000;
    // Where the item's record is.
    let written = |e: &LogEngine| -> u64 { e.peek(e.hash(b"k"), b"k", now).map_or(0, |p| p.ident) };
    assert!(matches!(
        set(&e, b"k", b"value", now),
        StoreResult::Stored(_)
    ));
    let (_, _, _, cas) = get(&e, b"k", now).expect("stored");
    let before = written(&e);
    let gat = |e: &LogEngine, exptime: Time| {
        let mut out = None;
        let opts = ReadOptions {
            touch: Some(exptime),
        };
        e.get(b"k", now, opts, &mut |v| {
            out = Some((v.value.to_vec(), v.exptime, v.cas))
        });
        out
    };
    for _ in 0..3 {
        assert_eq!(gat(&e, 0), Some((b"value".to_vec(), 0, cas)));
        assert!(e.touch(b"k", 0, now));
    }
    assert_eq!(written(&e), before, "an unchanged expiry was rewritten");
    assert_ne!(before, 0);
    // Counted as an access: the item was fetched.
    let mut fetched = None;
    e.meta_get(b"k", now, crate::MetaRead::default(), &mut |m| {
        fetched = Some(m.fetched)
    });
    assert_eq!(fetched, Some(true));
    // Nor does `mg ... T` with the item's own expiry; its win token still goes to one reader.
    assert!(e.touch(b"k", now + 100, now));
    let before = written(&e);
    let mg = |e: &LogEngine, recache: Option<Time>| {
        let opts = crate::MetaRead {
            touch: Some(now + 100),
            recache,
            ..Default::default()
        };
        let mut out = None;
        e.meta_get(b"k", now, opts, &mut |m| {
            out = Some((m.item.exptime, m.item.cas, m.win))
        });
        out
    };
    assert_eq!(mg(&e, None), Some((now + 100, cas, crate::Win::None)));
    assert_eq!(
        mg(&e, Some(now + 200)),
        Some((now + 100, cas, crate::Win::Won))
    );
    assert_eq!(
        mg(&e, Some(now + 200)),
        Some((now + 100, cas, crate::Win::AlreadySent))
    );
    assert_eq!(
        written(&e),
        before,
        "mg T with an unchanged expiry rewrote the item"
    );
    // A new expiry is written.
    assert_eq!(gat(&e, now + 60), Some((b"value".to_vec(), now + 60, cas)));
    assert_ne!(written(&e), before, "a new expiry was not written");
    assert_eq!(
        get(&e, b"k", now).map(|g| (g.2, g.3)),
        Some((now + 60, cas))
    );
}

/// `ma` with a wrong CAS: memcached calls an empty value, and one it stores in chunks (an
/// item over 512 KiB with its header, key, client flags and CAS), non-numeric before it
/// compares the CAS; any other value fails the comparison first. The model agrees.
#[test]
fn arith_calls_chunked_values_non_numeric_before_comparing_cas() {
    let now: Time = 1_000_000;
    let model = crate::model::Model::new(cfg(64 << 20));
    let engine = LogEngine::new(cfg(64 << 20));
    let engines: [&dyn Engine; 2] = [&engine, &model];
    // Keys of 7 bytes ("x524222"): 48 + 8 + 524222 + 2 + 8 = 524288 bytes, the most that
    // is not chunked; with client flags 4 bytes more count.
    let cases: [(usize, u32, MetaArithResult); 6] = [
        (0, 0, MetaArithResult::NonNumeric),
        (3, 0, MetaArithResult::Exists),
        (524_222, 0, MetaArithResult::Exists),
        (524_223, 0, MetaArithResult::NonNumeric),
        (524_218, 5, MetaArithResult::Exists),
        (524_219, 5, MetaArithResult::NonNumeric),
    ];
    for e in engines {
        for (len, flags, want) in cases {
            let key = format!("x{len:06}");
            let value = vec![b'7'; len];
            let stored = e.store(
                StoreRequest {
                    mode: StoreMode::Set,
                    key: key.as_bytes(),
                    value: &value,
                    flags,
                    exptime: 0,
                },
                now,
            );
            assert!(matches!(stored, StoreResult::Stored(_)), "{stored:?}");
            let req = crate::MetaArith {
                incr: true,
                delta: 1,
                compare_cas: Some(999_999),
                ..crate::MetaArith::default()
            };
            assert_eq!(
                e.meta_arith(key.as_bytes(), now, req),
                want,
                "{len} bytes, flags {flags}"
            );
        }
    }
}

/// Keys a client could choose to crowd one bucket, `n` per family: sequential numbers,
/// numbers after a long shared prefix, equal lengths (15 bytes, as memtier's and kvblast's
/// keys), and binary keys that differ only in the high bits of their second 8-byte word
/// (what a multiply-based hash mixes least), or only in single bytes spread over the key.
fn adversarial_keys(n: usize) -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let prefix = "tenant:0001:user:profile:settings:".repeat(3);
    vec![
        (
            "sequential",
            (0..n).map(|i| i.to_string().into_bytes()).collect(),
        ),
        (
            "shared prefix",
            (0..n)
                .map(|i| format!("{prefix}{i}").into_bytes())
                .collect(),
        ),
        (
            "equal lengths",
            (0..n)
                .map(|i| format!("key:{i:011}").into_bytes())
                .collect(),
        ),
        (
            "high bits of one word",
            (0..n)
                .map(|i| {
                    let mut k = vec![0u8; 16];
                    k[8..].copy_from_slice(&((i as u64) << 40).to_le_bytes());
                    k
                })
                .collect(),
        ),
        (
            "single bytes",
            (0..n)
                .map(|i| {
                    // Three bytes of the index, at positions 3, 11 and 19 of a 24-byte key.
                    let mut k = vec![b'x'; 24];
                    k[3] = i as u8;
                    k[11] = (i >> 8) as u8;
                    k[19] = (i >> 16) as u8;
                    k
                })
                .collect(),
        ),
    ]
}

/// Flood resistance of the index's key hash (issue 42): whatever keys a client picks without
/// knowing the engine's seed, they spread over the buckets as random keys do, so no chain
/// grows long. For each family of [`adversarial_keys`] and several seeds, 250,000 keys go into
/// 2^15 buckets (7.6 per bucket on average, as the index's load): the fullest holds at most
/// 32 (random keys: about 20; a count of 32 or more has odds under 1e-9 per bucket), the top
/// 10 bits (the tag) are spread too, and no two keys share their whole hash.
#[test]
fn adversarial_keys_spread_over_the_buckets() {
    const LEVEL: u32 = 15;
    let n = 250_000;
    let random = std::collections::hash_map::RandomState::new().hash_one(1u64);
    for (family, keys) in adversarial_keys(n) {
        for seed in [0, 1, 0x0123_4567_89ab_cdef, random] {
            let mut buckets = vec![0u32; 1 << LEVEL];
            let mut tags = vec![0u32; 1 << 10];
            let mut hashes: Vec<u64> = keys.iter().map(|k| key_hash(seed, k)).collect();
            for &h in &hashes {
                buckets[(h & ((1 << LEVEL) - 1)) as usize] += 1;
                tags[index::tag_of(h) as usize] += 1;
            }
            let fullest = buckets.iter().copied().max().unwrap_or(0);
            assert!(
                fullest <= 32,
                "{family}, seed {seed:#x}: a bucket of {fullest} (mean {:.1})",
                n as f64 / f64::from(1u32 << LEVEL)
            );
            // 244 keys per tag on average (a standard deviation of 16): the most common tag
            // is far from a pile-up (random keys: about 295).
            let top_tag = tags.iter().copied().max().unwrap_or(0);
            assert!(
                top_tag <= 330,
                "{family}, seed {seed:#x}: a tag {top_tag} times"
            );
            hashes.sort_unstable();
            hashes.dedup();
            assert_eq!(hashes.len(), n, "{family}, seed {seed:#x}: equal hashes");
        }
    }
}

/// The same through the engine: 1,000,000 adversarial keys (200,000 of each family) stored,
/// the index grown to them, and its longest chain no longer than random keys give (the main
/// buckets hold 10 at the load the index grows at, buckets not yet split up to twice that);
/// every key is still found, and none was dropped because a chain was full.
#[test]
fn a_million_adversarial_keys_make_no_long_chain() {
    let e = LogEngine::new(cfg(512 << 20));
    let families = adversarial_keys(200_000);
    for (_, keys) in &families {
        for k in keys {
            assert!(matches!(set(&e, k, b"v", 1), StoreResult::Stored(_)));
        }
    }
    e.maintain(1, true);
    let mut longest = 0;
    let mut items = 0;
    for b in 0..e.index.nmain() {
        let mut chain = 0;
        e.index
            .for_each_in_chain(b, |_, v| chain += usize::from(index::is_item(v)));
        longest = longest.max(chain);
        items += chain;
    }
    eprintln!(
        "1,000,000 adversarial keys: {} main buckets, longest chain {longest}",
        e.index.nmain()
    );
    assert_eq!(items, 1_000_000);
    assert!(longest <= 48, "longest chain {longest}");
    let st: std::collections::HashMap<_, _> = e.stats_detail("items").into_iter().collect();
    assert_eq!(st["items:1:evicted_index_full"], "0");
    assert_eq!(st["items:1:evicted"], "0");
    for (family, keys) in &families {
        for k in keys.iter().step_by(97) {
            assert!(get(&e, k, 1).is_some(), "{family}: {k:?} lost");
        }
    }
}

/// A scan in many calls sees each item that stays in place once, while the index grows
/// between its calls (splits move items of buckets already visited to buckets not yet
/// visited); items stored meanwhile are seen at most once.
#[test]
fn a_scan_sees_each_item_once_while_the_index_grows() {
    let e = LogEngine::new(cfg(256 << 20));
    let first: Vec<String> = (0..2000).map(|i| format!("a{i}")).collect();
    for k in &first {
        set(&e, k.as_bytes(), b"v", 1);
    }
    let nmain_before = e.index.nmain();
    let mut seen: std::collections::HashMap<Vec<u8>, u32> = Default::default();
    let mut cursor = crate::ScanCursor::default();
    let mut n = 0;
    loop {
        let next = e.scan(cursor, 4, 1, &mut |item| {
            *seen.entry(item.key.to_vec()).or_default() += 1;
        });
        // Between calls, items enough to split buckets on both sides of the cursor.
        for i in 0..400 {
            set(&e, format!("b{n}-{i}").as_bytes(), b"v", 1);
        }
        e.maintain(1, false);
        n += 1;
        match next {
            Some(c) => cursor = c,
            None => break,
        }
    }
    assert!(
        e.index.nmain() > nmain_before * 2,
        "the index grew during the scan ({nmain_before} -> {})",
        e.index.nmain()
    );
    for k in &first {
        assert_eq!(seen.get(k.as_bytes()), Some(&1), "{k}");
    }
    assert!(seen.values().all(|&c| c == 1), "an item seen twice");
}

/// memcached's `reclaimed` per class: a store that replaces its key's expired or flushed
/// item reuses its memory; the sweep's finds count as `crawler_reclaimed` too.
#[test]
fn reclaimed_items_are_counted_per_band() {
    let e = LogEngine::new(cfg(16 << 20));
    e.tally_sizes(&[96, 1 << 20], false);
    let ttl = |key: &'static [u8]| StoreRequest {
        exptime: 5,
        ..req(StoreMode::Set, key, b"v")
    };
    e.store(ttl(b"a"), 1);
    e.store(ttl(b"b"), 1);
    // `a` expired at 5: the store at 6 replaces it.
    assert!(matches!(set(&e, b"a", b"w", 6), StoreResult::Stored(_)));
    let (st, band) = (e.stats(), e.size_bands()[0]);
    assert_eq!(
        (st.reclaimed, band.reclaimed, band.crawler_reclaimed),
        (1, 1, 0)
    );
    // `b` is found by the sweep.
    for _ in 0..e.sweep_calls() {
        e.maintain(6, true);
    }
    let (st, band) = (e.stats(), e.size_bands()[0]);
    assert_eq!((st.reclaimed, st.crawler_reclaimed), (2, 1));
    assert_eq!(
        (band.reclaimed, band.crawler_reclaimed, band.items),
        (2, 1, 1)
    );
    e.reset_stats();
    assert_eq!(e.size_bands()[0].reclaimed, 0);
}

/// `-M` (memcached's `t/dash-M.t`): once a store is refused for memory, the next one is
/// refused too, and no item is lost: a refused store does not make room that was not
/// there (it may compact, but only to free a segment for itself).
#[test]
fn no_evict_refuses_consistently_once_full() {
    for (mb, size) in [(2usize, 8192usize), (4, 8192), (2, 3000), (4, 100)] {
        let e = LogEngine::new(EngineConfig {
            no_evict: true,
            max_item_size: 1 << 20,
            ..cfg(mb << 20)
        });
        let value = vec![b'B'; size];
        let mut stored = 0;
        while stored < 1_000_000 {
            match set(&e, format!("dash{stored}").as_bytes(), &value, 1) {
                StoreResult::Stored(_) => stored += 1,
                StoreResult::NoMemory => break,
                r => panic!("{r:?}"),
            }
        }
        for again in 0..4 {
            assert_eq!(
                set(&e, format!("dash{}", stored + again).as_bytes(), &value, 1),
                StoreResult::NoMemory,
                "-m {mb}, {size}-byte values: store {again} after the first refusal"
            );
        }
        for i in 0..stored {
            assert!(
                get(&e, format!("dash{i}").as_bytes(), 1).is_some(),
                "dash{i}"
            );
        }
        assert_eq!(e.stats().curr_items, stored as u64);
    }
}

#[test]
fn tail_word_is_the_zero_padded_little_endian_word() {
    let bytes = [0x81u8, 0x02, 0xf3, 0x44, 0x05, 0xa6, 0x77];
    for n in 0..8 {
        let rem = &bytes[..n];
        let mut w = [0u8; 8];
        w[..n].copy_from_slice(rem);
        assert_eq!(super::tail_word(rem), u64::from_le_bytes(w), "{n} bytes");
    }
}
