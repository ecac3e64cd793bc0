//! Concurrency tests: many threads on overlapping keys; invariants checked during and
//! after.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use kvstore::{
    ArithResult, Engine, EngineConfig, LogEngine, ReadOptions, StoreMode, StoreRequest,
    StoreResult, Time,
};

const NOW: Time = 1_000_000;
const THREADS: usize = 8;
/// Roughly what an item costs beyond its key and value (memcached's item header).
const OH: usize = 48;

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

fn store(e: &LogEngine, mode: StoreMode, key: &[u8], value: &[u8], flags: u32) -> StoreResult {
    e.store(
        StoreRequest {
            mode,
            key,
            value,
            flags,
            exptime: 0,
        },
        NOW,
    )
}

/// A value that checks itself: `c` repeated `c % 23 + 1` times, stored with flags `c`.
fn checked_value(c: u8) -> Vec<u8> {
    vec![c; c as usize % 23 + 1]
}

#[test]
fn hammer_overlapping_keys() {
    let e = Arc::new(LogEngine::new(EngineConfig {
        max_bytes: 64 << 20,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    }));
    e.tally_sizes(&[96, 120, 152, 192, 1 << 20], true);
    assert!(matches!(
        store(&e, StoreMode::Set, b"ctr", b"0", 0),
        StoreResult::Stored(_)
    ));
    assert!(matches!(
        store(&e, StoreMode::Set, b"log", b"", 0),
        StoreResult::Stored(_)
    ));
    let incrs = Arc::new(AtomicU64::new(0));
    let appends = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (e, incrs, appends, barrier) =
                (e.clone(), incrs.clone(), appends.clone(), barrier.clone());
            thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                barrier.wait();
                for _ in 0..6000 {
                    let r = rng.below(100);
                    let k = rng.below(16);
                    let skey = format!("s{k}").into_bytes();
                    let akey = format!("a{k}").into_bytes();
                    match r {
                        0..=9 => {
                            assert!(matches!(
                                e.arith(b"ctr", true, 1, NOW),
                                ArithResult::Value(_)
                            ));
                            incrs.fetch_add(1, Ordering::Relaxed);
                        }
                        10..=19 => {
                            let s = store(&e, StoreMode::Append, b"log", &[b'a' + t as u8], 0);
                            assert!(matches!(s, StoreResult::Stored(_)));
                            appends.fetch_add(1, Ordering::Relaxed);
                        }
                        20..=39 => {
                            let c = rng.below(256) as u8;
                            let s = store(&e, StoreMode::Set, &skey, &checked_value(c), c.into());
                            assert!(matches!(s, StoreResult::Stored(_)));
                        }
                        40..=64 => {
                            e.get(&skey, NOW, ReadOptions::default(), &mut |v| {
                                let c = v.flags as u8;
                                assert_eq!(v.value, &checked_value(c)[..], "torn item");
                            });
                        }
                        65..=69 => {
                            e.delete(&skey, NOW);
                        }
                        70..=79 => {
                            let v = rng.below(1000).to_string();
                            store(&e, StoreMode::Set, &akey, v.as_bytes(), 0);
                        }
                        80..=84 => {
                            store(&e, StoreMode::Append, &akey, b"7", 0);
                        }
                        85..=89 => {
                            store(&e, StoreMode::Prepend, &akey, b"1", 0);
                        }
                        90..=94 => {
                            let _ = e.arith(&akey, rng.below(2) == 0, rng.below(50), NOW);
                        }
                        _ => {
                            let mut cas = 0;
                            e.get(&akey, NOW, ReadOptions::default(), &mut |v| cas = v.cas);
                            let _ = store(&e, StoreMode::Cas(cas), &akey, b"42", 0);
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut ctr = None;
    e.get(b"ctr", NOW, ReadOptions::default(), &mut |v| {
        ctr = std::str::from_utf8(v.value)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    });
    assert_eq!(ctr, Some(incrs.load(Ordering::Relaxed)));
    let mut log_len = 0;
    e.get(b"log", NOW, ReadOptions::default(), &mut |v| {
        log_len = v.value.len()
    });
    assert_eq!(log_len as u64, appends.load(Ordering::Relaxed));
    e.check_accounting().unwrap();
    // Deleting everything brings the accounting back to zero.
    for k in 0..16 {
        e.delete(format!("s{k}").as_bytes(), NOW);
        e.delete(format!("a{k}").as_bytes(), NOW);
    }
    e.delete(b"ctr", NOW);
    e.delete(b"log", NOW);
    let s = e.stats();
    assert_eq!((s.curr_items, s.bytes), (0, 0));
    e.check_accounting().unwrap();
    // The size tally, kept in per-thread cells, sums back to nothing too.
    let bands = e.size_bands();
    assert!(!bands.is_empty());
    assert!(
        bands.iter().all(|b| (b.items, b.bytes) == (0, 0)),
        "{bands:?}"
    );
    assert_eq!(e.size_steps(), Some(Vec::new()));
}

#[test]
fn hammer_under_eviction_stays_within_memory() {
    let max = 300 * (OH + 64);
    let e = Arc::new(LogEngine::new(EngineConfig {
        max_bytes: max,
        max_item_size: 300,
        no_evict: false,
        use_cas: true,
    }));
    let stop = Arc::new(AtomicBool::new(false));
    // The monitor starts with the workers (at their barrier) and samples at least once, also
    // when they are done before it is first scheduled: `samples` counts what it checked, not
    // how the threads happened to interleave.
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let monitor = {
        let (e, stop, barrier) = (e.clone(), stop.clone(), barrier.clone());
        thread::spawn(move || {
            let mut samples = 0u64;
            barrier.wait();
            loop {
                let done = stop.load(Ordering::Relaxed);
                let b = e.stats().bytes;
                assert!(b <= max as u64, "bytes {b} > max {max}");
                samples += 1;
                if done {
                    break;
                }
                thread::yield_now();
            }
            samples
        })
    };
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (e, barrier) = (e.clone(), barrier.clone());
            thread::spawn(move || {
                let mut rng = Rng(0x1234_5678 ^ ((t as u64 + 1) << 20));
                let mut misses = 0u64;
                barrier.wait();
                for i in 0..6000u64 {
                    let k = rng.below(1500);
                    let key = format!("key:{k}").into_bytes();
                    match rng.below(10) {
                        0..=4 => {
                            let len = rng.below(150) as usize;
                            let c = (k % 251) as u8;
                            let r = store(&e, StoreMode::Set, &key, &vec![c; len], 0);
                            assert!(matches!(r, StoreResult::Stored(_)), "{r:?}");
                        }
                        5..=7 => {
                            let hit = e.get(&key, NOW, ReadOptions::default(), &mut |v| {
                                // Values are only ever the key's byte repeated (appends
                                // and incr on these keys are of the same form).
                                let c = (k % 251) as u8;
                                assert!(v.value.iter().all(|&b| b == c), "wrong value");
                            });
                            misses += u64::from(!hit);
                        }
                        8 => {
                            let c = (k % 251) as u8;
                            let _ = store(&e, StoreMode::Append, &key, &[c; 10], 0);
                        }
                        _ => {
                            if i % 500 == 0 {
                                e.maintain(NOW, true);
                            } else {
                                e.delete(&key, NOW);
                            }
                        }
                    }
                }
                misses
            })
        })
        .collect();
    let misses: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    assert!(monitor.join().unwrap() > 0);
    let s = e.stats();
    assert!(s.evictions > 0, "no eviction happened");
    assert!(misses > 0);
    assert!(s.bytes <= max as u64);
    e.check_accounting().unwrap();
}

#[test]
fn concurrent_flush_shrink_and_maintenance_keep_accounting() {
    let e = Arc::new(LogEngine::new(EngineConfig {
        max_bytes: 1000 * (OH + 16),
        max_item_size: 128,
        no_evict: false,
        use_cas: true,
    }));
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (e, barrier) = (e.clone(), barrier.clone());
            thread::spawn(move || {
                let mut rng = Rng(0xabcdef ^ ((t as u64 + 7) << 32));
                barrier.wait();
                for i in 0..4000u32 {
                    let now = NOW + i / 100;
                    let key = format!("k{}", rng.below(3000)).into_bytes();
                    match rng.below(100) {
                        0 if t == 0 => e.flush_all(0, now),
                        1 if t == 1 => e.flush_all(now + 2, now),
                        2 if t == 2 => {
                            e.set_max_bytes((200 + rng.below(1000) as usize) * (OH + 16), now)
                        }
                        3..=5 => {
                            e.maintain(now, true);
                        }
                        6..=60 => {
                            let r = StoreRequest {
                                mode: StoreMode::Set,
                                key: &key,
                                value: b"12",
                                flags: 0,
                                exptime: if rng.below(2) == 0 { 0 } else { now + 1 },
                            };
                            e.store(r, now);
                        }
                        61..=70 => {
                            let _ = e.arith(&key, true, 1000, now);
                        }
                        71..=75 => {
                            e.touch(&key, now + 3, now);
                        }
                        _ => {
                            e.get(&key, now, ReadOptions::default(), &mut |_| {});
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    e.check_accounting().unwrap();
    let s = e.stats();
    assert!(s.bytes <= s.limit_maxbytes);
}
