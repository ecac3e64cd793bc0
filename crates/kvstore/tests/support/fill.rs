//! Filling a `LogEngine` with small items and measuring its memory per item, shared by the
//! accounting test (tests/log_perf.rs) and the measurements (benches/measure.rs).

use kvstore::{
    Engine, EngineConfig, IndexLayout, LogEngine, ReadOptions, StoreMode, StoreRequest, StoreResult,
};

pub fn key(i: u64) -> [u8; 15] {
    let mut k = *b"key:00000000000";
    let mut n = i;
    for b in k[4..].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
    k
}

pub fn set(e: &LogEngine, k: &[u8], v: &[u8]) -> StoreResult {
    e.store(
        StoreRequest {
            mode: StoreMode::Set,
            key: k,
            value: v,
            flags: 0,
            exptime: 0,
        },
        100,
    )
}

/// Resident set size of this process in bytes (Linux).
pub fn rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Fill `n` items (15-byte keys, 32-byte values) into an engine of `max_bytes` whose index
/// is in `layout`; returns
/// (engine-accounted bytes per item, RSS delta per item).
pub fn bytes_per_item(n: u64, max_bytes: usize, layout: IndexLayout) -> (f64, Option<f64>) {
    let before = rss();
    let e = LogEngine::with_layout(
        EngineConfig {
            max_bytes,
            max_item_size: 1 << 20,
            no_evict: true,
            use_cas: true,
        },
        layout,
    );
    let value = [b'v'; 32];
    for i in 0..n {
        assert!(
            matches!(set(&e, &key(i), &value), StoreResult::Stored(_)),
            "item {i}"
        );
    }
    let after = rss();
    let s = e.stats();
    assert_eq!(s.curr_items, n);
    assert_eq!(s.evictions, 0);
    let detail = e.stats_detail("slabs");
    eprintln!("{n} items, -m {max_bytes}: {s:?}\n{detail:?}");
    let acct = e.memory_bytes() as f64 / n as f64;
    let rss = before
        .zip(after)
        .map(|(b, a)| a.saturating_sub(b) as f64 / n as f64);
    // Spot-check a few values.
    for i in [0, n / 2, n - 1] {
        let mut ok = false;
        e.get(&key(i), 100, ReadOptions::default(), &mut |v| {
            ok = v.value == value
        });
        assert!(ok, "item {i}");
    }
    (acct, rss)
}
