//! Micro-benchmarks of `LogEngine`: gets, sets (without and with times to live, which go
//! to their TTL class's segment) and a 90/10 get/set mix on 1 and 2 threads over 200k
//! preloaded items (15-byte keys, 32-byte values). Each iteration runs a batch
//! of `BATCH` operations, so throughput per thread is `BATCH / time`; with `threads = 2`
//! divan runs the closure on both threads at once (total = 2 × per-thread throughput).
//!
//! Run with `cargo bench -p kvstore --bench log`.

use std::cell::Cell;
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
