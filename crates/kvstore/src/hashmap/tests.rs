use super::*;

const NOW: Time = 1_000_000;
const OH: usize = HashMapEngine::ITEM_OVERHEAD;

fn cfg() -> EngineConfig {
    EngineConfig {
        max_bytes: 64 << 20,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    }
}

fn engine() -> HashMapEngine {
    HashMapEngine::with_shards(cfg(), 8)
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

fn set(e: &HashMapEngine, key: &[u8], value: &[u8]) -> u64 {
    match e.store(req(StoreMode::Set, key, value), NOW) {
        StoreResult::Stored(c) => c,
        r => panic!("set failed: {r:?}"),
    }
}

type Got = (Vec<u8>, u32, Time, u64);

fn get_at(e: &HashMapEngine, key: &[u8], now: Time) -> Option<Got> {
    let mut out = None;
    e.get(key, now, ReadOptions::default(), &mut |v| {
        assert_eq!(v.key, key);
        out = Some((v.value.to_vec(), v.flags, v.exptime, v.cas));
    });
    out
}

fn get(e: &HashMapEngine, key: &[u8]) -> Option<Vec<u8>> {
    get_at(e, key, NOW).map(|g| g.0)
}

#[test]
fn set_get_delete() {
    let e = engine();
    assert_eq!(get(&e, b"a"), None);
    let c1 = set(&e, b"a", b"one");
    assert_eq!(c1, 1, "CAS uniques start at 1");
    let r = StoreRequest {
        flags: 7,
        exptime: NOW + 10,
        ..req(StoreMode::Set, b"a", b"two")
    };
    assert_eq!(e.store(r, NOW), StoreResult::Stored(2));
    assert_eq!(
        get_at(&e, b"a", NOW),
        Some((b"two".to_vec(), 7, NOW + 10, 2))
    );
    assert!(e.delete(b"a", NOW));
    assert!(!e.delete(b"a", NOW));
    assert_eq!(get(&e, b"a"), None);
    // Empty values and binary keys are fine.
    set(&e, b"\0\xff", b"");
    assert_eq!(get(&e, b"\0\xff"), Some(vec![]));
    let s = e.stats();
    assert_eq!((s.curr_items, s.total_items), (1, 3));
    assert_eq!(s.bytes, (2 + OH) as u64);
    e.check_accounting().unwrap();
}

#[test]
fn add_replace() {
    let e = engine();
    assert_eq!(
        e.store(req(StoreMode::Replace, b"k", b"x"), NOW),
        StoreResult::NotStored
    );
    assert!(matches!(
        e.store(req(StoreMode::Add, b"k", b"x"), NOW),
        StoreResult::Stored(_)
    ));
    assert_eq!(
        e.store(req(StoreMode::Add, b"k", b"y"), NOW),
        StoreResult::NotStored
    );
    assert!(matches!(
        e.store(req(StoreMode::Replace, b"k", b"z"), NOW),
        StoreResult::Stored(_)
    ));
    assert_eq!(get(&e, b"k"), Some(b"z".to_vec()));
    // add succeeds over an expired item
    let r = StoreRequest {
        exptime: NOW + 1,
        ..req(StoreMode::Set, b"e", b"old")
    };
    e.store(r, NOW);
    assert!(matches!(
        e.store(req(StoreMode::Add, b"e", b"new"), NOW + 1),
        StoreResult::Stored(_)
    ));
    assert_eq!(get_at(&e, b"e", NOW + 1).unwrap().0, b"new");
    assert_eq!(e.stats().get_expired, 1);
}

#[test]
fn cas_semantics() {
    let e = engine();
    assert_eq!(
        e.store(req(StoreMode::Cas(1), b"k", b"x"), NOW),
        StoreResult::NotFound
    );
    let c = set(&e, b"k", b"x");
    assert_eq!(
        e.store(req(StoreMode::Cas(c + 1), b"k", b"y"), NOW),
        StoreResult::Exists
    );
    assert_eq!(
        e.store(req(StoreMode::Cas(0), b"k", b"y"), NOW),
        StoreResult::Exists
    );
    let c2 = match e.store(req(StoreMode::Cas(c), b"k", b"y"), NOW) {
        StoreResult::Stored(c2) => c2,
        r => panic!("{r:?}"),
    };
    assert!(c2 > c);
    assert_eq!(get_at(&e, b"k", NOW).unwrap().3, c2);
    assert_eq!(
        e.store(req(StoreMode::Cas(c), b"k", b"z"), NOW),
        StoreResult::Exists
    );
    assert_eq!(get(&e, b"k"), Some(b"y".to_vec()));
}

#[test]
fn cas_off_reports_zero() {
    let e = HashMapEngine::with_shards(
        EngineConfig {
            use_cas: false,
            ..cfg()
        },
        4,
    );
    assert_eq!(
        e.store(req(StoreMode::Set, b"k", b"x"), NOW),
        StoreResult::Stored(0)
    );
    assert_eq!(get_at(&e, b"k", NOW).unwrap().3, 0);
    assert_eq!(
        e.store(req(StoreMode::Cas(0), b"k", b"y"), NOW),
        StoreResult::Exists
    );
    assert_eq!(
        e.store(req(StoreMode::Cas(1), b"k", b"y"), NOW),
        StoreResult::Exists
    );
    // Immediate flush still works (it uses the hidden versions).
    e.flush_all(NOW, NOW);
    assert_eq!(get(&e, b"k"), None);
}

#[test]
fn append_prepend() {
    let e = engine();
    assert_eq!(
        e.store(req(StoreMode::Append, b"k", b"x"), NOW),
        StoreResult::NotStored
    );
    assert_eq!(
        e.store(req(StoreMode::Prepend, b"k", b"x"), NOW),
        StoreResult::NotStored
    );
    let r = StoreRequest {
        flags: 5,
        exptime: NOW + 100,
        ..req(StoreMode::Set, b"k", b"mid")
    };
    let c = match e.store(r, NOW) {
        StoreResult::Stored(c) => c,
        r => panic!("{r:?}"),
    };
    let r = StoreRequest {
        flags: 9,
        exptime: NOW + 5,
        ..req(StoreMode::Append, b"k", b">")
    };
    let c2 = match e.store(r, NOW) {
        StoreResult::Stored(c2) => c2,
        r => panic!("{r:?}"),
    };
    assert!(c2 > c);
    e.store(req(StoreMode::Prepend, b"k", b"<"), NOW);
    let (v, flags, exp, _) = get_at(&e, b"k", NOW).unwrap();
    assert_eq!((v.as_slice(), flags, exp), (&b"<mid>"[..], 5, NOW + 100));
    e.check_accounting().unwrap();
}

#[test]
fn item_size_counts_like_memcached() {
    // -I 1m, a 1-byte key, no flags, CAS on: values up to 2^20 - 60 fit.
    let c = cfg();
    assert_eq!(c.item_size(1, (1 << 20) - 60, 0), 1 << 20);
    assert_eq!(c.item_size(1, 0, 1), 64);
    let no_cas = EngineConfig {
        use_cas: false,
        ..cfg()
    };
    assert_eq!(no_cas.item_size(1, 0, 0), 52);
    let e = HashMapEngine::with_shards(
        EngineConfig {
            max_item_size: 1 << 20,
            ..cfg()
        },
        4,
    );
    let v = vec![b'x'; (1 << 20) - 60];
    assert!(matches!(
        e.store(req(StoreMode::Set, b"k", &v), NOW),
        StoreResult::Stored(_)
    ));
    let v = vec![b'x'; (1 << 20) - 59];
    assert_eq!(
        e.store(req(StoreMode::Set, b"k", &v), NOW),
        StoreResult::TooLarge
    );
    // Non-zero flags take 4 bytes more.
    let v = vec![b'x'; (1 << 20) - 60];
    let r = StoreRequest {
        flags: 1,
        ..req(StoreMode::Set, b"k", &v)
    };
    assert_eq!(e.store(r, NOW), StoreResult::TooLarge);
}

#[test]
fn too_large() {
    // Room for a 10-byte value under a 1-byte key.
    let max_item_size = cfg().item_size(1, 10, 0);
    let e = HashMapEngine::with_shards(
        EngineConfig {
            max_item_size,
            ..cfg()
        },
        4,
    );
    set(&e, b"k", b"0123456789");
    // A too-large set drops the old item (memcached: no stale data after a failed set).
    assert_eq!(
        e.store(req(StoreMode::Set, b"k", b"0123456789A"), NOW),
        StoreResult::TooLarge
    );
    assert_eq!(get(&e, b"k"), None);
    set(&e, b"k", b"01234");
    // Other modes keep it.
    assert_eq!(
        e.store(req(StoreMode::Replace, b"k", b"0123456789A"), NOW),
        StoreResult::TooLarge
    );
    assert_eq!(
        e.store(req(StoreMode::Append, b"k", b"0123456789A"), NOW),
        StoreResult::TooLarge
    );
    // An append whose result is too large: NOT_STORED (memcached do_store_item).
    assert_eq!(
        e.store(req(StoreMode::Append, b"k", b"abcdef"), NOW),
        StoreResult::NotStored
    );
    assert!(matches!(
        e.store(req(StoreMode::Append, b"k", b"abcde"), NOW),
        StoreResult::Stored(_)
    ));
    assert_eq!(get(&e, b"k"), Some(b"01234abcde".to_vec()));
    // Larger than the whole memory: TooLarge too.
    let small = HashMapEngine::with_shards(
        EngineConfig {
            max_bytes: OH + 10,
            ..cfg()
        },
        4,
    );
    assert!(matches!(
        small.store(req(StoreMode::Set, b"k", b"01234567"), NOW),
        StoreResult::Stored(_)
    ));
    assert_eq!(
        small.store(req(StoreMode::Set, b"k", b"0123456789"), NOW),
        StoreResult::TooLarge
    );
    assert_eq!(get(&small, b"k"), None);
    // Keys longer than the engine's limit are refused, not a panic.
    let long = vec![b'k'; 70_000];
    assert_eq!(
        e.store(req(StoreMode::Set, &long, b"v"), NOW),
        StoreResult::TooLarge
    );
    assert_eq!(get(&e, &long), None);
}

#[test]
fn expiry() {
    let e = engine();
    let r = StoreRequest {
        exptime: NOW + 2,
        ..req(StoreMode::Set, b"k", b"v")
    };
    e.store(r, NOW);
    assert!(get_at(&e, b"k", NOW + 1).is_some());
    assert!(get_at(&e, b"k", NOW + 2).is_none());
    assert!(get_at(&e, b"k", NOW + 2).is_none());
    let s = e.stats();
    assert_eq!((s.get_expired, s.curr_items, s.bytes), (1, 0, 0));
    // A past exptime replaces the old item and is invisible at once.
    set(&e, b"p", b"old");
    let r = StoreRequest {
        exptime: NOW - 1,
        ..req(StoreMode::Set, b"p", b"new")
    };
    assert!(matches!(e.store(r, NOW), StoreResult::Stored(_)));
    assert_eq!(get(&e, b"p"), None);
    // Expired items are not found by the write paths either.
    let r = StoreRequest {
        exptime: NOW - 1,
        ..req(StoreMode::Set, b"q", b"1")
    };
    e.store(r, NOW);
    assert_eq!(e.arith(b"q", true, 1, NOW), ArithResult::NotFound);
    assert_eq!(
        e.store(req(StoreMode::Cas(1), b"q", b"x"), NOW),
        StoreResult::NotFound
    );
    assert!(!e.touch(b"q", 0, NOW));
    assert!(!e.delete(b"q", NOW));
}

#[test]
fn touch_and_gat() {
    let e = engine();
    set(&e, b"k", b"v");
    assert!(e.touch(b"k", NOW + 5, NOW));
    assert_eq!(get_at(&e, b"k", NOW).unwrap().2, NOW + 5);
    assert!(get_at(&e, b"k", NOW + 5).is_none());
    assert!(!e.touch(b"k", 0, NOW));
    set(&e, b"k", b"v");
    let mut seen = None;
    let hit = e.get(
        b"k",
        NOW,
        ReadOptions {
            touch: Some(NOW + 9),
        },
        &mut |v| seen = Some(v.exptime),
    );
    assert!(hit);
    assert_eq!(seen, Some(NOW + 9));
    // Touching into the past expires it.
    assert!(e.touch(b"k", NOW - 1, NOW));
    assert_eq!(get(&e, b"k"), None);
}

#[test]
fn incr_decr() {
    let e = engine();
    assert_eq!(e.arith(b"n", true, 1, NOW), ArithResult::NotFound);
    set(&e, b"n", b"10");
    assert_eq!(e.arith(b"n", true, 5, NOW), ArithResult::Value(15));
    assert_eq!(get(&e, b"n"), Some(b"15".to_vec()));
    // Shorter result: rewritten in place, padded with spaces (memcached do_add_delta).
    assert_eq!(e.arith(b"n", false, 6, NOW), ArithResult::Value(9));
    assert_eq!(get(&e, b"n"), Some(b"9 ".to_vec()));
    assert_eq!(e.arith(b"n", true, 1, NOW), ArithResult::Value(10));
    assert_eq!(get(&e, b"n"), Some(b"10".to_vec()));
    // Longer result: a new item with the exact digits.
    assert_eq!(e.arith(b"n", true, 90, NOW), ArithResult::Value(100));
    assert_eq!(get(&e, b"n"), Some(b"100".to_vec()));
    // decr floors at 0, incr wraps.
    assert_eq!(e.arith(b"n", false, 1000, NOW), ArithResult::Value(0));
    assert_eq!(get(&e, b"n"), Some(b"0  ".to_vec()));
    set(&e, b"n", b"18446744073709551615");
    assert_eq!(e.arith(b"n", true, 2, NOW), ArithResult::Value(1));
    assert_eq!(get(&e, b"n"), Some(b"1                   ".to_vec()));
    // Each arith gets a new CAS; flags and expiry stay.
    let r = StoreRequest {
        flags: 3,
        exptime: NOW + 50,
        ..req(StoreMode::Set, b"m", b"1")
    };
    let c = match e.store(r, NOW) {
        StoreResult::Stored(c) => c,
        r => panic!("{r:?}"),
    };
    assert_eq!(e.arith(b"m", true, 1, NOW), ArithResult::Value(2));
    let (_, flags, exp, c2) = get_at(&e, b"m", NOW).unwrap();
    assert_eq!((flags, exp), (3, NOW + 50));
    assert!(c2 > c);
    assert_eq!(e.arith(b"m", true, 100, NOW), ArithResult::Value(102));
    let (_, flags, exp, c3) = get_at(&e, b"m", NOW).unwrap();
    assert_eq!((flags, exp), (3, NOW + 50));
    assert!(c3 > c2);
    // Non-numeric values.
    for v in [
        &b""[..],
        b"abc",
        b"12abc",
        b"-1",
        b" ",
        b"18446744073709551616",
    ] {
        set(&e, b"x", v);
        assert_eq!(
            e.arith(b"x", true, 1, NOW),
            ArithResult::NonNumeric,
            "{v:?}"
        );
        assert_eq!(get(&e, b"x"), Some(v.to_vec()));
    }
    // Accepted like strtoull: leading space, sign, trailing space.
    set(&e, b"x", b" +7 tail");
    assert_eq!(e.arith(b"x", true, 1, NOW), ArithResult::Value(8));
    assert_eq!(get(&e, b"x"), Some(b"8       ".to_vec()));
    e.check_accounting().unwrap();
}

#[test]
fn incr_total_items_and_memory() {
    let e = engine();
    set(&e, b"n", b"9");
    let before = e.stats();
    e.arith(b"n", true, 1, NOW); // grows: new item
    let after = e.stats();
    assert_eq!(after.total_items, before.total_items + 1);
    assert_eq!(after.bytes, before.bytes + 1);
    e.arith(b"n", false, 1, NOW); // in place
    assert_eq!(e.stats().total_items, after.total_items);
    assert_eq!(e.stats().bytes, after.bytes);
}

#[test]
fn flush_immediate_includes_same_second() {
    let e = engine();
    set(&e, b"a", b"1");
    set(&e, b"b", b"2");
    e.flush_all(0, NOW);
    assert_eq!(get(&e, b"a"), None);
    assert_eq!(e.arith(b"b", true, 1, NOW), ArithResult::NotFound);
    // Writes after the flush, in the same second, are live.
    set(&e, b"a", b"3");
    assert_eq!(get(&e, b"a"), Some(b"3".to_vec()));
    assert_eq!(e.stats().get_flushed, 2);
    // at == now is immediate too.
    e.flush_all(NOW, NOW);
    assert_eq!(get(&e, b"a"), None);
}

#[test]
fn flush_delayed() {
    let e = engine();
    set(&e, b"a", b"1"); // atime NOW
    e.flush_all(NOW + 10, NOW); // oldest_live = NOW + 9
    assert!(get_at(&e, b"a", NOW + 8).is_some()); // atime now NOW + 8
    assert!(get_at(&e, b"a", NOW + 9).is_none());
    // Items stored at or before NOW + 9 are invalid from NOW + 9 on; later ones live.
    let r = req(StoreMode::Set, b"b", b"2");
    e.store(r, NOW + 9);
    assert!(get_at(&e, b"b", NOW + 9).is_none());
    e.store(r, NOW + 10);
    assert!(get_at(&e, b"b", NOW + 10).is_some());
    // An immediate flush replaces a pending delayed one.
    e.flush_all(NOW + 100, NOW + 10);
    e.flush_all(0, NOW + 10);
    e.store(r, NOW + 11);
    assert!(get_at(&e, b"b", NOW + 200).is_some());
}

fn small_engine(items: usize, no_evict: bool, shards: usize) -> HashMapEngine {
    HashMapEngine::with_shards(
        EngineConfig {
            max_bytes: items * (OH + 10),
            max_item_size: 1024,
            no_evict,
            use_cas: true,
        },
        shards,
    )
}

fn key(i: usize) -> Vec<u8> {
    format!("key{i:05}").into_bytes() // 8 bytes
}

#[test]
fn evicts_to_stay_within_limit() {
    for shards in [1, 4, 64] {
        let e = small_engine(10, false, shards);
        for i in 0..100 {
            assert!(matches!(
                e.store(req(StoreMode::Set, &key(i), b"xy"), NOW),
                StoreResult::Stored(_)
            ));
            assert!(e.stats().bytes <= e.stats().limit_maxbytes);
        }
        let s = e.stats();
        assert_eq!(s.curr_items, 10, "shards {shards}");
        assert_eq!(s.evictions, 90);
        assert_eq!(s.evicted_unfetched, 90);
        assert_eq!(s.evicted_nonzero, 0);
        // The most recent item is always present.
        assert!(get(&e, &key(99)).is_some());
        e.check_accounting().unwrap();
    }
}

#[test]
fn clock_gives_second_chance() {
    let e = small_engine(4, false, 1);
    for i in 0..4 {
        set(&e, &key(i), b"xy");
    }
    // Read key 0 and 1: the next two stores evict two of the unread items (2, 3 and the
    // new, unread key 10), never 0 or 1.
    assert!(get(&e, &key(0)).is_some());
    assert!(get(&e, &key(1)).is_some());
    set(&e, &key(10), b"xy");
    set(&e, &key(11), b"xy");
    for k in [0, 1, 11] {
        assert!(e.peek(&key(k)).is_some(), "{k}");
    }
    let unread = [2, 3, 10]
        .iter()
        .filter(|&&k| e.peek(&key(k)).is_some())
        .count();
    assert_eq!(unread, 1);
    let s = e.stats();
    assert_eq!((s.evictions, s.evicted_unfetched), (2, 2));
    // With every item read, the hand clears them all and then evicts.
    for k in [0, 1, 2, 3, 10, 11] {
        get(&e, &key(k));
    }
    set(&e, &key(12), b"xy");
    assert_eq!(e.stats().evictions, 3);
}

#[test]
fn expired_items_are_reclaimed_first() {
    let e = small_engine(4, false, 1);
    let k0 = key(0);
    let r = StoreRequest {
        exptime: NOW + 1,
        ..req(StoreMode::Set, &k0, b"xy")
    };
    e.store(r, NOW);
    for i in 1..4 {
        set(&e, &key(i), b"xy");
        // Accessed: the hand passes them over and meets the expired one.
        assert!(get(&e, &key(i)).is_some());
    }
    let k9 = key(9);
    let r = StoreRequest {
        exptime: NOW + 100,
        ..req(StoreMode::Set, &k9, b"xy")
    };
    e.store(r, NOW + 1);
    let s = e.stats();
    assert_eq!((s.reclaimed, s.expired_unfetched, s.evictions), (1, 1, 0));
    for i in 1..4 {
        assert!(get_at(&e, &key(i), NOW + 1).is_some());
    }
    // Evicting an item with a future exptime counts evicted_nonzero.
    for i in 1..4 {
        assert!(get_at(&e, &key(i), NOW + 1).is_some());
    }
    set(&e, &key(20), b"xy");
    let s = e.stats();
    let k9_gone = u64::from(e.peek(&k9).is_none());
    assert_eq!(
        (s.evictions, s.evicted_nonzero, s.evicted_unfetched),
        (1, k9_gone, k9_gone)
    );
}

#[test]
fn no_evict_refuses() {
    let e = small_engine(3, true, 4);
    for i in 0..3 {
        set(&e, &key(i), b"xy");
    }
    assert_eq!(
        e.store(req(StoreMode::Set, &key(3), b"xy"), NOW),
        StoreResult::NoMemory
    );
    assert_eq!(
        e.store(req(StoreMode::Add, &key(3), b"xy"), NOW),
        StoreResult::NoMemory
    );
    // Replacing with the same size fits; growing does not, and a failed set drops the
    // old item; a failed append is NOT_STORED and keeps it.
    set(&e, &key(0), b"ab");
    assert_eq!(
        e.store(req(StoreMode::Append, &key(0), b"c"), NOW),
        StoreResult::NotStored
    );
    assert_eq!(get(&e, &key(0)), Some(b"ab".to_vec()));
    assert_eq!(
        e.store(req(StoreMode::Set, &key(0), b"abc"), NOW),
        StoreResult::NoMemory
    );
    assert_eq!(get(&e, &key(0)), None);
    set(&e, &key(0), b"99");
    assert_eq!(e.arith(&key(0), true, 1, NOW), ArithResult::NoMemory);
    assert_eq!(get(&e, &key(0)), Some(b"99".to_vec()));
    assert_eq!(e.stats().evictions, 0);
    // Expired items are still reclaimed.
    assert!(e.touch(&key(1), NOW, NOW));
    set(&e, &key(5), b"xy");
    assert_eq!(e.stats().reclaimed, 1);
    e.check_accounting().unwrap();
}

#[test]
fn set_max_bytes_shrinks() {
    let e = small_engine(100, false, 8);
    for i in 0..100 {
        set(&e, &key(i), b"xy");
    }
    assert_eq!(e.stats().curr_items, 100);
    e.set_max_bytes(10 * (OH + 10), NOW);
    let s = e.stats();
    assert!(s.bytes <= s.limit_maxbytes);
    assert_eq!(s.curr_items, 10);
    assert_eq!(s.evictions, 90);
    // Growing again lets it fill.
    e.set_max_bytes(100 * (OH + 10), NOW);
    for i in 0..100 {
        set(&e, &key(i), b"xy");
    }
    assert_eq!(e.stats().curr_items, 100);
    e.check_accounting().unwrap();
}

#[test]
fn maintain_reclaims_expired_in_bounded_steps() {
    let e = engine();
    for i in 0..40_000 {
        let k = key(i);
        let r = StoreRequest {
            exptime: if i % 2 == 0 { NOW + 1 } else { 0 },
            ..req(StoreMode::Set, &k, b"v")
        };
        e.store(r, NOW);
    }
    assert_eq!(e.maintain(NOW, true), 0);
    let first = e.maintain(NOW + 1, true);
    assert!(first > 0 && first < 20_000, "{first}");
    let mut total = first;
    for _ in 0..100 {
        total += e.maintain(NOW + 1, true);
    }
    assert_eq!(total, 20_000);
    let s = e.stats();
    assert_eq!(s.curr_items, 20_000);
    assert_eq!(s.expired_unfetched, 20_000);
    assert_eq!(s.reclaimed, 0, "the crawler counts separately");
    e.check_accounting().unwrap();
    // Flushed items too; sparse tables shrink.
    e.flush_all(0, NOW + 1);
    for _ in 0..100 {
        e.maintain(NOW + 1, true);
    }
    let s = e.stats();
    assert_eq!((s.curr_items, s.bytes), (0, 0));
    assert!(s.total_malloced < 8 * 64 * 48, "{}", s.total_malloced);
}

#[test]
fn stats_reset_and_detail() {
    let e = small_engine(2, false, 1);
    for i in 0..5 {
        set(&e, &key(i), b"xy");
    }
    let s = e.stats();
    assert_eq!((s.evictions, s.total_items, s.curr_items), (3, 5, 2));
    let items = e.stats_detail("items");
    assert!(items.contains(&("items:1:number".to_string(), "2".to_string())));
    assert!(items.contains(&("items:1:evicted".to_string(), "3".to_string())));
    let slabs = e.stats_detail("slabs");
    assert!(slabs.contains(&("active_slabs".to_string(), "1".to_string())));
    assert!(slabs.iter().any(|(k, _)| k == "total_malloced"));
    assert!(slabs.contains(&("1:used_chunks".to_string(), "2".to_string())));
    assert!(e.stats_detail("nonsense").is_empty());
    e.reset_stats();
    let r = e.stats();
    assert_eq!((r.evictions, r.total_items), (0, 0));
    assert_eq!((r.curr_items, r.bytes), (s.curr_items, s.bytes));
}

#[test]
fn zero_memory_never_panics() {
    let e = HashMapEngine::with_shards(
        EngineConfig {
            max_bytes: 0,
            max_item_size: 0,
            no_evict: false,
            use_cas: true,
        },
        1,
    );
    assert_eq!(
        e.store(req(StoreMode::Set, b"k", b""), NOW),
        StoreResult::TooLarge
    );
    assert_eq!(e.arith(b"k", true, 1, NOW), ArithResult::NotFound);
    e.set_max_bytes(0, NOW);
    e.maintain(NOW, true);
    e.flush_all(u32::MAX, 0);
    e.flush_all(0, u32::MAX);
    assert_eq!(get(&e, b"k"), None);
}

#[test]
fn recently_read_items_survive_eviction() {
    // 20 MB of 50 KB sets through a 4 MB cache with 64 shards (about one item per shard),
    // reading key0 and key1 every 5 sets: they stay, key2 (never read) goes.
    for _ in 0..5 {
        let e = HashMapEngine::with_shards(
            EngineConfig {
                max_bytes: 4 << 20,
                ..cfg()
            },
            64,
        );
        let v = vec![b'v'; 50_000];
        for i in 0..400 {
            set(&e, format!("key{i}").as_bytes(), &v);
            if i % 5 == 0 {
                get(&e, b"key0");
                get(&e, b"key1");
            }
        }
        let present = |k: &str| e.peek(k.as_bytes()).is_some();
        assert!(
            present("key0") && present("key1") && !present("key2"),
            "{} {} {}",
            present("key0"),
            present("key1"),
            present("key2")
        );
        assert!(present("key399"));
    }
}

/// Many readers of a stale (or vivifying) item at once: exactly one wins the token.
#[test]
fn one_winner_among_concurrent_meta_readers() {
    use std::sync::atomic::AtomicUsize;
    let e = std::sync::Arc::new(engine());
    set(&e, b"k", b"v");
    let inv = MetaDelete {
        invalidate: true,
        ..MetaDelete::default()
    };
    for round in 0..20u32 {
        assert_eq!(e.meta_delete(b"k", NOW, inv), MetaDeleteResult::Deleted);
        let fresh = format!("viv{round}");
        let won = std::sync::Arc::new(AtomicUsize::new(0));
        let vivified = std::sync::Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let (e, won, vivified, fresh) = (&e, &won, &vivified, &fresh);
                s.spawn(move || {
                    for key in [&b"k"[..], fresh.as_bytes()] {
                        let opts = MetaRead {
                            vivify: Some(NOW + 100),
                            ..MetaRead::default()
                        };
                        let r = e.meta_get(key, NOW, opts, &mut |mi| {
                            if mi.win == Win::Won {
                                won.fetch_add(1, Relaxed);
                            }
                        });
                        if r == MetaGet::Vivified {
                            vivified.fetch_add(1, Relaxed);
                        }
                    }
                });
            }
        });
        // One win for the stale item, one for the created one.
        assert_eq!(won.load(Relaxed), 2, "round {round}");
        assert_eq!(vivified.load(Relaxed), 1, "round {round}");
    }
    e.check_accounting().unwrap();
}

/// An explicit CAS (`E`) is kept in a trailer after the value: the value, its charge and the
/// CAS read back right through every change.
#[test]
fn explicit_cas_trailer() {
    let e = engine();
    let ms = |value: &'static [u8], new_cas| MetaStoreRequest {
        mode: StoreMode::Set,
        key: b"n",
        value,
        flags: 0,
        exptime: 0,
        compare_cas: None,
        new_cas,
        invalidate: false,
        vivify: false,
        binary_key: false,
    };
    assert_eq!(
        e.meta_store(ms(b"10", Some(77)), NOW).result,
        StoreResult::Stored(77)
    );
    assert_eq!(get_at(&e, b"n", NOW), Some((b"10".to_vec(), 0, 0, 77)));
    // In place (fits), with and without a new explicit CAS.
    let ma = MetaArith {
        incr: false,
        delta: 1,
        ..MetaArith::default()
    };
    let cas = match e.meta_arith(b"n", NOW, ma) {
        MetaArithResult::Value { value: 9, cas, .. } => cas,
        r => panic!("{r:?}"),
    };
    assert_ne!(cas, 77);
    assert_eq!(get_at(&e, b"n", NOW), Some((b"9 ".to_vec(), 0, 0, cas)));
    let ma_e = MetaArith {
        incr: true,
        delta: 1,
        new_cas: Some(5),
        ..MetaArith::default()
    };
    assert!(matches!(
        e.meta_arith(b"n", NOW, ma_e),
        MetaArithResult::Value {
            value: 10,
            cas: 5,
            ..
        }
    ));
    assert_eq!(get_at(&e, b"n", NOW), Some((b"10".to_vec(), 0, 0, 5)));
    // Growing: a new item.
    let ma_big = MetaArith {
        incr: true,
        delta: 1000,
        new_cas: Some(6),
        ..MetaArith::default()
    };
    assert!(matches!(
        e.meta_arith(b"n", NOW, ma_big),
        MetaArithResult::Value {
            value: 1010,
            cas: 6,
            ..
        }
    ));
    assert_eq!(get_at(&e, b"n", NOW), Some((b"1010".to_vec(), 0, 0, 6)));
    // Append keeps the value whole; invalidate in place keeps it too.
    let app = MetaStoreRequest {
        mode: StoreMode::Append,
        value: b"x",
        ..ms(b"", None)
    };
    assert!(matches!(
        e.meta_store(app, NOW),
        MetaStored {
            result: StoreResult::Stored(_),
            len: 5
        }
    ));
    let inv = MetaDelete {
        invalidate: true,
        new_cas: Some(9),
        ..MetaDelete::default()
    };
    assert_eq!(e.meta_delete(b"n", NOW, inv), MetaDeleteResult::Deleted);
    assert_eq!(get_at(&e, b"n", NOW), Some((b"1010x".to_vec(), 0, 0, 9)));
    assert_eq!(e.stats().bytes, (1 + 5 + OH) as u64);
    e.check_accounting().unwrap();
}
