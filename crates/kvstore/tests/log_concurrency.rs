//! Concurrency tests of `LogEngine`: many threads on overlapping keys, in small memory so
//! that segments are evicted and reused under the readers. Every value is made of
//! self-checking chunks that name their key, so a torn, stale-segment or wrong-key read
//! is caught. Operation counts are bounded; nothing sleeps.

#[path = "support/tier.rs"]
mod tier;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kvstore::{
    ArithResult, Engine, EngineConfig, IndexLayout, LogEngine, ReadOptions, StoreMode,
    StoreRequest, StoreResult,
};

/// Multiplies the operation counts (`LOG_STRESS=20 cargo test --release ...` for a soak).
fn scale() -> usize {
    std::env::var("LOG_STRESS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn checksum(b: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &x in b {
        h = (h ^ u32::from(x)).wrapping_mul(0x0100_0193);
    }
    h
}

/// A chunk: len u32 | key len u8 | key | filler | checksum u32 of everything before.
fn chunk(key: &[u8], len: usize, seed: u8) -> Vec<u8> {
    let len = len.max(4 + 1 + key.len() + 4);
    let mut c = Vec::with_capacity(len);
    c.extend_from_slice(&(len as u32).to_le_bytes());
    c.push(key.len() as u8);
    c.extend_from_slice(key);
    while c.len() < len - 4 {
        c.push(seed.wrapping_add(c.len() as u8));
    }
    let sum = checksum(&c);
    c.extend_from_slice(&sum.to_le_bytes());
    c
}

/// Check that `v` is a sequence of valid chunks of `key`.
fn validate(key: &[u8], v: &[u8]) -> Result<usize, String> {
    let mut at = 0;
    let mut n = 0;
    while at < v.len() {
        let rest = &v[at..];
        if rest.len() < 4 {
            return Err(format!("short chunk at {at}"));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len < 9 || len > rest.len() {
            return Err(format!("bad chunk length {len} at {at} of {}", v.len()));
        }
        let c = &rest[..len];
        let kl = c[4] as usize;
        if c.get(5..5 + kl) != Some(key) {
            return Err(format!("chunk of another key at {at}"));
        }
        let sum = u32::from_le_bytes([c[len - 4], c[len - 3], c[len - 2], c[len - 1]]);
        if checksum(&c[..len - 4]) != sum {
            return Err(format!("checksum mismatch at {at}"));
        }
        at += len;
        n += 1;
    }
    if n == 0 {
        return Err("empty value".into());
    }
    Ok(n)
}

fn store(e: &LogEngine, mode: StoreMode, key: &[u8], value: &[u8], exptime: u32) -> StoreResult {
    e.store(
        StoreRequest {
            mode,
            key,
            value,
            flags: 0,
            exptime,
        },
        100,
    )
}

fn worker(e: &LogEngine, seed: u64, ops: usize, keys: u64, big: bool) -> u64 {
    worker_with(e, seed, ops, keys, big, false)
}

/// [`worker`]; with `no_evict`, a store may also be refused for memory.
fn worker_with(e: &LogEngine, seed: u64, ops: usize, keys: u64, big: bool, no_evict: bool) -> u64 {
    let mut rng = Rng(seed | 1);
    let mut hits = 0;
    for _ in 0..ops {
        let k = format!("key:{}", rng.below(keys));
        let key = k.as_bytes();
        let op = rng.below(100);
        let size = match rng.below(100) {
            0 if big => 70_000 + rng.below(50_000) as usize,
            1..=10 => 500 + rng.below(3000) as usize,
            _ => 10 + rng.below(100) as usize,
        };
        let seedb = rng.next() as u8;
        match op {
            0..=49 => {
                let mut err = None;
                let hit = e.get(key, 100, ReadOptions::default(), &mut |v| {
                    if v.key != key {
                        err = Some("wrong key in view".to_string());
                    } else if let Err(x) = validate(key, v.value) {
                        err = Some(x);
                    }
                });
                if let Some(x) = err {
                    panic!("get {k}: {x}");
                }
                hits += u64::from(hit);
            }
            50..=69 => {
                let r = store(e, StoreMode::Set, key, &chunk(key, size, seedb), 0);
                let refused = no_evict && r == StoreResult::NoMemory;
                assert!(
                    matches!(r, StoreResult::Stored(_)) || refused,
                    "set {k}: {r:?}"
                );
            }
            70..=77 => {
                let r = store(
                    e,
                    StoreMode::Append,
                    key,
                    &chunk(key, size.min(400), seedb),
                    0,
                );
                let refused = no_evict && r == StoreResult::NoMemory;
                assert!(
                    matches!(r, StoreResult::Stored(_) | StoreResult::NotStored) || refused,
                    "append {k}: {r:?}"
                );
            }
            78..=81 => {
                let r = store(
                    e,
                    StoreMode::Prepend,
                    key,
                    &chunk(key, size.min(400), seedb),
                    0,
                );
                let refused = no_evict && r == StoreResult::NoMemory;
                assert!(
                    matches!(r, StoreResult::Stored(_) | StoreResult::NotStored) || refused,
                    "prepend {k}: {r:?}"
                );
            }
            82..=86 => {
                e.delete(key, 100);
            }
            87..=91 => {
                let mut err = None;
                e.get(key, 100, ReadOptions { touch: Some(0) }, &mut |v| {
                    if let Err(x) = validate(key, v.value) {
                        err = Some(x);
                    }
                });
                if let Some(x) = err {
                    panic!("gat {k}: {x}");
                }
            }
            92..=95 => {
                e.touch(key, 0, 100);
            }
            _ => {
                let mode = if op % 2 == 0 {
                    StoreMode::Add
                } else {
                    StoreMode::Replace
                };
                let r = store(e, mode, key, &chunk(key, size, seedb), 0);
                let refused = no_evict && r == StoreResult::NoMemory;
                assert!(
                    matches!(r, StoreResult::Stored(_) | StoreResult::NotStored) || refused,
                    "add/replace {k}: {r:?}"
                );
            }
        }
    }
    hits
}

fn config(max_bytes: usize) -> EngineConfig {
    EngineConfig {
        max_bytes,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    }
}

fn engine(max_bytes: usize) -> LogEngine {
    LogEngine::new(config(max_bytes))
}

#[test]
fn log_concurrent_mixed_ops_never_return_torn_values() {
    mixed_ops_never_return_torn_values(engine(2 << 20));
}

#[test]
fn log_wide_concurrent_mixed_ops_never_return_torn_values() {
    mixed_ops_never_return_torn_values(LogEngine::with_layout(config(2 << 20), IndexLayout::Wide));
}

/// The same with a flash tier: items on their way to flash, bound, read back and taken
/// back with their pages, under every operation at once.
#[test]
fn log_flash_concurrent_mixed_ops_never_return_torn_values() {
    let e = LogEngine::with_layout(config(2 << 20), IndexLayout::Wide);
    let dir = tier::attach(&e, 8 << 20, 2, 1 << 20);
    let e = mixed_ops_never_return_torn_values(e);
    e.flash_settle();
    e.check_accounting().unwrap();
    let s = e.flash_stats().expect("a tier");
    assert!(s.objects_written > 0 && s.reads > 0, "{s:?}");
    drop(e);
    drop(dir);
}

fn mixed_ops_never_return_torn_values(e: LogEngine) -> LogEngine {
    // 2 MiB: 64 KiB segments, constantly evicted and reused; some items are larger than
    // a segment (their own mapping, unmapped on eviction).
    let threads = 4;
    let hits: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let e = &e;
                s.spawn(move || worker(e, 0x9e37_79b9 * (t + 1), 40_000 * scale(), 3000, true))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(hits > 0);
    let s = e.stats();
    assert!(s.evictions > 0, "{s:?}");
    e.check_accounting().unwrap();
    assert!(e.memory_bytes() <= 2 << 20);
    e
}

#[test]
fn log_concurrent_no_evict_compacts_without_losing_items() {
    // -M in 2 MiB: the log fills with overwritten and deleted items, and compaction moves
    // live ones while readers, touches and writers run.
    let e = LogEngine::new(EngineConfig {
        max_bytes: 2 << 20,
        max_item_size: 1 << 20,
        no_evict: true,
        use_cas: true,
    });
    let hits: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let e = &e;
                s.spawn(move || {
                    worker_with(e, 0x51_7cc1 * (t + 1), 40_000 * scale(), 6000, false, true)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(hits > 0);
    assert_eq!(e.stats().evictions, 0);
    let compacted = e
        .stats_detail("items")
        .into_iter()
        .find(|(k, _)| k == "items:1:segments_compacted")
        .map(|(_, v)| v);
    assert_ne!(compacted.as_deref(), Some("0"));
    e.check_accounting().unwrap();
    assert!(e.memory_bytes() <= 2 << 20);
}

#[test]
fn log_concurrent_hot_keys() {
    // Few keys, many writers: contention on the same bucket stripes and slots.
    let e = engine(8 << 20);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let e = &e;
            s.spawn(move || worker(e, 77 + t, 30_000 * scale(), 8, false));
        }
    });
    e.check_accounting().unwrap();
}

#[test]
fn log_concurrent_incr_and_cas_are_atomic() {
    let e = engine(8 << 20);
    store(&e, StoreMode::Set, b"n", b"0", 0);
    store(&e, StoreMode::Set, b"c", b"0", 0);
    let threads = 4u64;
    let per = 3000 * scale() as u64;
    let cas_ok = AtomicU64::new(0);
    let seen: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let e = &e;
                let cas_ok = &cas_ok;
                s.spawn(move || {
                    let mut got = Vec::with_capacity(per as usize);
                    for _ in 0..per {
                        match e.arith(b"n", true, 1, 100) {
                            ArithResult::Value(v) => got.push(v),
                            r => panic!("incr: {r:?}"),
                        }
                        // A gets/cas increment of "c".
                        let mut cur = None;
                        e.get(b"c", 100, ReadOptions::default(), &mut |v| {
                            let n: u64 = std::str::from_utf8(v.value)
                                .unwrap()
                                .trim()
                                .parse()
                                .unwrap();
                            cur = Some((n, v.cas));
                        });
                        let (n, cas) = cur.unwrap();
                        let next = (n + 1).to_string();
                        if let StoreResult::Stored(_) =
                            store(e, StoreMode::Cas(cas), b"c", next.as_bytes(), 0)
                        {
                            cas_ok.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    got
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<u64> = seen.into_iter().flatten().collect();
    all.sort_unstable();
    let want: Vec<u64> = (1..=threads * per).collect();
    assert_eq!(all, want, "every incr saw a distinct value");
    let mut c = None;
    e.get(b"c", 100, ReadOptions::default(), &mut |v| {
        c = Some(
            std::str::from_utf8(v.value)
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap(),
        )
    });
    assert_eq!(c, Some(cas_ok.load(Ordering::Relaxed)));
    e.check_accounting().unwrap();
}

#[test]
fn log_concurrent_resize_and_maintain() {
    let e = engine(16 << 20);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for t in 0..3u64 {
            let e = &e;
            hs.push(s.spawn(move || worker(e, 1234 + t, 30_000 * scale(), 5000, true)));
        }
        let e2 = &e;
        let stop2 = &stop;
        s.spawn(move || {
            let mut i = 0u64;
            while !stop2.load(Ordering::Relaxed) && i < 100 {
                let mb = [16usize, 4, 8, 2, 12][(i % 5) as usize];
                e2.set_max_bytes(mb << 20, 100);
                if i % 10 == 0 {
                    e2.maintain(100, true);
                }
                i += 1;
            }
        });
        for h in hs {
            h.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    e.set_max_bytes(2 << 20, 100);
    // The index does not shrink: segments get what it leaves, at least a quarter.
    let budget = (2usize << 20)
        .saturating_sub(e.index_bytes())
        .max(512 << 10);
    assert!(
        e.stats().total_malloced as usize <= budget,
        "{:?}, index {}",
        e.stats(),
        e.index_bytes()
    );
    e.check_accounting().unwrap();
}

/// Stale-while-revalidate under races: for each invalidated item, exactly one of many
/// concurrent `mg` requests (some with `T`, which rewrites the item, some without, one
/// racing touch and in-place incr keeping the marks) gets the win token; the others see
/// it already sent. The same for recache (`R`) and for vivify (`N`) of a missing key.
#[test]
fn log_concurrent_meta_win_token_is_unique() {
    use kvstore::{MetaArith, MetaDelete, MetaDeleteResult, MetaGet, MetaRead, Win};
    let e = engine(4 << 20);
    let threads = 4;
    let rounds = 200 * scale();
    for round in 0..rounds {
        let key = format!("swr:{}", round % 7);
        let k = key.as_bytes();
        let now = 100 + round as u32;
        // 0: stale (md I); 1: recache (R, item expiring soon); 2: vivify (N, missing).
        let kind = round % 3;
        match kind {
            0 => {
                assert!(matches!(
                    store(&e, StoreMode::Set, k, b"10", 0),
                    StoreResult::Stored(_)
                ));
                let md = MetaDelete {
                    invalidate: true,
                    ..MetaDelete::default()
                };
                assert_eq!(e.meta_delete(k, now, md), MetaDeleteResult::Deleted);
            }
            1 => {
                assert!(matches!(
                    store(&e, StoreMode::Set, k, b"10", now + 5),
                    StoreResult::Stored(_)
                ));
            }
            _ => {
                e.delete(k, now);
            }
        }
        let won = AtomicU64::new(0);
        let seen = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (e, won, seen) = (&e, &won, &seen);
                s.spawn(move || {
                    for i in 0..8 {
                        let touch = (t + i) % 3 == 0;
                        let opts = MetaRead {
                            touch: touch.then_some(now + 100),
                            recache: (kind == 1).then_some(now + 30),
                            vivify: (kind == 2).then_some(now + 50),
                            ..MetaRead::default()
                        };
                        let r = e.meta_get(k, now, opts, &mut |mi| {
                            match mi.win {
                                Win::Won => won.fetch_add(1, Ordering::Relaxed),
                                Win::AlreadySent => seen.fetch_add(1, Ordering::Relaxed),
                                Win::None => 0,
                            };
                        });
                        assert_ne!(r, MetaGet::Miss);
                        if t == 0 && i % 2 == 0 {
                            // Rewrites that keep the marks race with the readers.
                            e.touch(k, now + 200, now);
                            let ma = MetaArith {
                                incr: true,
                                delta: 1,
                                ..MetaArith::default()
                            };
                            let _ = e.meta_arith(k, now, ma);
                        }
                    }
                });
            }
        });
        // Every rewrite in the race keeps the win mark (touch, in-place incr: at most four
        // increments of "10"), so exactly one request wins and every later one sees the
        // token sent.
        assert_eq!(won.load(Ordering::Relaxed), 1, "round {round} kind {kind}");
        assert_eq!(
            seen.load(Ordering::Relaxed),
            threads as u64 * 8 - 1,
            "round {round} kind {kind}"
        );
    }
    e.check_accounting().unwrap();
}

/// The index grows (linear hashing: splits move items to new buckets, then chains are
/// compacted and overflow buckets reused) while readers look up keys that are present all
/// along: no lookup may miss one, see another key's value, or lose a win token.
#[test]
fn log_index_growth_never_hides_a_present_key() {
    growth_never_hides_a_present_key(engine(512 << 20));
}

/// The same with the wide index, whose splits take each key's next address bit from its
/// slot's tag. It starts at a larger size (its base level), so a smaller limit makes it
/// grow as far.
#[test]
fn log_wide_index_growth_never_hides_a_present_key() {
    growth_never_hides_a_present_key(LogEngine::with_layout(config(32 << 20), IndexLayout::Wide));
}

fn growth_never_hides_a_present_key(e: LogEngine) {
    let stable = 20_000u64;
    for i in 0..stable {
        let k = format!("stable:{i}");
        assert!(matches!(
            store(&e, StoreMode::Set, k.as_bytes(), k.as_bytes(), 0),
            StoreResult::Stored(_)
        ));
    }
    let splits_before = splits(&e);
    let writers_done = AtomicU64::new(0);
    let lookups = AtomicU64::new(0);
    let fresh = 150_000 * scale() as u64;
    // Writers and readers start together, so that the lookups overlap the growth.
    let go = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (e, done, go) = (&e, &writers_done, &go);
            s.spawn(move || {
                go.wait();
                for i in 0..fresh / 2 {
                    let k = format!("fresh:{t}:{i}");
                    store(e, StoreMode::Set, k.as_bytes(), b"x", 0);
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        for r in 0..2u64 {
            let (e, done, lookups, go) = (&e, &writers_done, &lookups, &go);
            s.spawn(move || {
                let mut rng = Rng(0x5eed + r);
                go.wait();
                // Bounded: until both writers are done, and at most 20 million lookups; the
                // first 1024 in any case (fast writers may be done before a reader's first).
                for n in 0..20_000_000u64 {
                    if n > 0 && n % 1024 == 0 && done.load(Ordering::SeqCst) == 2 {
                        break;
                    }
                    let i = rng.below(stable);
                    let k = format!("stable:{i}");
                    let mut got = None;
                    let hit = e.get(k.as_bytes(), 100, ReadOptions::default(), &mut |v| {
                        got = Some(v.value.to_vec());
                    });
                    assert!(hit, "{k} missed during growth");
                    assert_eq!(got.as_deref(), Some(k.as_bytes()), "{k}: wrong value");
                    lookups.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    // Writers grow the index as they go (whoever gets the growth lock, when no reader's pin
    // stands in the way of the barrier), so it grew while the readers looked keys up; how
    // far it got by the time the writers stopped depends on scheduling, so the total is
    // checked once growth has caught up. Each maintenance pass takes growth one step (a
    // batch of splits, or the barrier-and-compaction steps after one, which split nothing):
    // pass until three passes in a row split nothing more (bounded).
    let splits_during = splits(&e) - splits_before;
    assert!(
        splits_during > 0,
        "the index did not grow during the lookups"
    );
    let mut still = 0;
    for _ in 0..100_000 {
        let before = splits(&e);
        e.maintain(100, false);
        still = if splits(&e) == before { still + 1 } else { 0 };
        if still == 3 {
            break;
        }
    }
    assert!(
        splits(&e) > splits_before + 1000,
        "the index grew: {} splits ({splits_during} during the lookups)",
        splits(&e) - splits_before
    );
    assert!(lookups.load(Ordering::Relaxed) > 0);
    for i in 0..stable {
        let k = format!("stable:{i}");
        assert!(e.get(k.as_bytes(), 100, ReadOptions::default(), &mut |_| {}));
    }
    assert_eq!(e.stats().evictions, 0);
    e.check_accounting().unwrap();
}

fn splits(e: &LogEngine) -> u64 {
    e.stats_detail("slabs")
        .into_iter()
        .find(|(k, _)| k == "index_splits")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}
