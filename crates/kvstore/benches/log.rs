//! Micro-benchmarks of `LogEngine`: gets, sets (without and with times to live, which go
//! to their TTL class's segment) and a 90/10 get/set mix on 1 and 2 threads over 200k
//! preloaded items (15-byte keys, 32-byte values); and sets of keys a full engine does not
//! hold, with and without eviction's size factor (whose miss sketch counts each); and
//! hits of large values, copied or leased (`large_gets`). Each iteration runs a batch
//! of `BATCH` operations, so throughput per thread is `BATCH / time`; with `threads = 2`
//! divan runs the closure on both threads at once (total = 2 × per-thread throughput).
//!
//! Run with `cargo bench -p kvstore --bench log`.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use divan::counter::ItemsCount;
use divan::{black_box, Bencher};
use kvstore::{Engine, EngineConfig, LogEngine, ReadOptions, StoreMode, StoreRequest};

fn main() {
    divan::main();
}

const KEYS: u64 = 200_000;
const BATCH: usize = 1000;

fn key(i: u64) -> [u8; 15] {
    let mut k = *b"key:00000000000";
    let mut n = i;
    for b in k[4..].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
    k
}

fn engine() -> &'static LogEngine {
    static E: OnceLock<LogEngine> = OnceLock::new();
    E.get_or_init(|| {
        let e = LogEngine::new(EngineConfig {
            max_bytes: 256 << 20,
            max_item_size: 1 << 20,
            no_evict: false,
            use_cas: true,
        });
        for i in 0..KEYS {
            e.store(set_req(&key(i), &[b'v'; 32]), 100);
        }
        e
    })
}

fn set_req<'a>(key: &'a [u8], value: &'a [u8]) -> StoreRequest<'a> {
    StoreRequest {
        mode: StoreMode::Set,
        key,
        value,
        flags: 0,
        exptime: 0,
    }
}

thread_local! {
    static RNG: Cell<u64> = Cell::new(0x9e37_79b9_7f4a_7c15 ^ (std::ptr::from_ref(&KEYS) as u64));
}

fn next_key() -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) % KEYS
    })
}

fn get(e: &LogEngine, k: &[u8]) -> usize {
    let mut n = 0;
    e.get(k, 100, ReadOptions::default(), &mut |v| n = v.value.len());
    n
}

#[divan::bench(threads = [1, 2])]
fn gets(b: Bencher) {
    let e = engine();
    b.counter(ItemsCount::new(BATCH)).bench(|| {
        let mut n = 0;
        for _ in 0..BATCH {
            n += get(e, &key(next_key()));
        }
        black_box(n)
    });
}

#[divan::bench(threads = [1, 2])]
fn sets(b: Bencher) {
    let e = engine();
    b.counter(ItemsCount::new(BATCH)).bench(|| {
        for _ in 0..BATCH {
            black_box(e.store(set_req(&key(next_key()), &[b'w'; 32]), 100));
        }
    });
}

#[divan::bench(threads = [1, 2])]
fn sets_with_ttl(b: Bencher) {
    let e = engine();
    b.counter(ItemsCount::new(BATCH)).bench(|| {
        for _ in 0..BATCH {
            let k = next_key();
            let kb = key(k);
            // Times to live from 1 s to about 2 h: a dozen TTL classes.
            let req = StoreRequest {
                exptime: 101 + (k % 7200) as u32,
                ..set_req(&kb, &[b'w'; 32])
            };
            black_box(e.store(req, 100));
        }
    });
}

#[divan::bench(threads = [1, 2])]
fn mixed_90_get_10_set(b: Bencher) {
    let e = engine();
    b.counter(ItemsCount::new(BATCH)).bench(|| {
        let mut n = 0;
        for i in 0..BATCH {
            let k = key(next_key());
            if i % 10 == 0 {
                black_box(e.store(set_req(&k, &[b'x'; 32]), 100));
            } else {
                n += get(e, &k);
            }
        }
        black_box(n)
    });
}

/// A 32 MiB engine filled (and evicting) with 1M distinct keys, with eviction's size factor
/// `factor` (0 or 4).
fn evicting(factor: u32) -> &'static LogEngine {
    static E: [OnceLock<LogEngine>; 2] = [OnceLock::new(), OnceLock::new()];
    E[usize::from(factor != 0)].get_or_init(|| {
        let e = LogEngine::new(EngineConfig {
            max_bytes: 32 << 20,
            max_item_size: 1 << 20,
            no_evict: false,
            use_cas: true,
        });
        e.set_size_factor(factor);
        for i in 0..1_000_000 {
            e.store(set_req(&key(i), &[b'v'; 32]), 100);
        }
        e
    })
}

/// Sets of keys the engine does not hold (a look-aside cache's sets after misses) into a
/// full engine: each is a new index entry, most evict, and with a size factor each is
/// looked up in and added to the miss sketch.
#[divan::bench(args = [0, 4])]
fn sets_of_absent_keys(b: Bencher, factor: u32) {
    static NEXT: AtomicU64 = AtomicU64::new(1_000_000);
    let e = evicting(factor);
    b.counter(ItemsCount::new(BATCH)).bench(|| {
        for _ in 0..BATCH {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            black_box(e.store(set_req(&key(n), &[b'w'; 32]), 100));
        }
    });
}

/// An engine holding `LARGE_KEYS` values of each size `large_gets` measures.
fn large(size: usize) -> &'static LogEngine {
    static E: OnceLock<LogEngine> = OnceLock::new();
    let e = E.get_or_init(|| {
        LogEngine::new(EngineConfig {
            max_bytes: 512 << 20,
            max_item_size: 1 << 20,
            no_evict: false,
            use_cas: true,
        })
    });
    let probe = format!("{size}:0");
    if get(e, probe.as_bytes()) != size {
        let value = vec![b'l'; size];
        for i in 0..LARGE_KEYS {
            e.store(set_req(format!("{size}:{i}").as_bytes(), &value), 100);
        }
    }
    e
}

const LARGE_KEYS: u64 = 64;
const LARGE_SIZES: [usize; 4] = [4 << 10, 16 << 10, 64 << 10, 256 << 10];

/// What a server does with a large value on a hit: copy it into an output buffer (`copy`),
/// or lease it and keep the lease until the reply is written (`lease`, what the server does
/// from 16 KiB: crates/kvcached/exec/splice.rs). The crossover sets that threshold.
#[divan::bench(args = LARGE_SIZES, consts = [false, true])]
fn large_gets<const LEASE: bool>(b: Bencher, size: usize) {
    let e = large(size);
    let keys: Vec<Vec<u8>> = (0..LARGE_KEYS)
        .map(|i| format!("{size}:{i}").into_bytes())
        .collect();
    let mut out: Vec<u8> = Vec::with_capacity(size * 2);
    let mut held = Vec::with_capacity(keys.len());
    let mut i = 0;
    b.counter(ItemsCount::new(1usize)).bench_local(|| {
        i = (i + 1) % keys.len();
        out.clear();
        held.clear();
        e.get(&keys[i], 100, ReadOptions::default(), &mut |v| {
            if LEASE {
                held.extend(v.lease());
            } else {
                out.extend_from_slice(v.value);
            }
        });
        black_box((out.len(), held.len()))
    });
}
