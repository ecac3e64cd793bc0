//! Measurements of `LogEngine` that print figures and decide nothing: memory per item at
//! 2M items (engine accounting and RSS), multi-thread throughput, and warm-restart load
//! speed. Run them one at a time (they are built in release by `cargo bench`):
//!
//! ```text
//! cargo bench -p kvstore --bench measure -- memory
//! cargo bench -p kvstore --bench measure -- throughput
//! cargo bench -p kvstore --bench measure -- restore
//! KVSTORE_FLASH_DIR=/some/dir cargo bench -p kvstore --bench measure -- flash
//! ```
//!
//! With no name, all of them run in turn (`flash` only with `KVSTORE_FLASH_DIR`).

use std::time::Instant;

use kvstore::{Engine, EngineConfig, IndexLayout, LogEngine, ReadOptions, StoreResult};

#[path = "../tests/support/fill.rs"]
mod fill;

use fill::{bytes_per_item, key, set};

fn main() {
    // `cargo bench` passes `--bench`; any other argument names a measurement.
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let all: [(&str, fn()); 4] = [
        ("memory", memory),
        ("throughput", throughput_scaling),
        ("restore", restore_speed),
        ("flash", flash_memory),
    ];
    for name in &wanted {
        if !all.iter().any(|(n, _)| n == name) {
            eprintln!("unknown measurement {name:?}: memory, throughput, restore or flash");
            std::process::exit(2);
        }
    }
    for (name, run) in all {
        if wanted.is_empty() || wanted.iter().any(|w| w == name) {
            eprintln!("== {name}");
            run();
        }
    }
}

fn memory() {
    for layout in [IndexLayout::Compact, IndexLayout::Wide] {
        let (acct, rss) = bytes_per_item(2_000_000, 136 << 20, layout);
        eprintln!("2M items, 15-byte keys, 32-byte values, -m 136 MiB, {layout:?} index:");
        eprintln!("  engine accounting (segment mappings + index): {acct:.1} bytes/item");
        if let Some(r) = rss {
            eprintln!("  RSS delta: {r:.1} bytes/item");
        }
    }
}

/// CPU time of the calling thread, in seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// `threads` threads doing `ops` operations each (a get/set mix: a set every `set_every`
/// ops, 0 for none) over `keys` preloaded items. Returns (total ops per wall-clock second,
/// ops per CPU second per thread, averaged): on a machine shared with other work the
/// second shows whether threads slow each other down inside the engine.
fn throughput(e: &LogEngine, threads: usize, ops: u64, keys: u64, set_every: u64) -> (f64, f64) {
    let start = Instant::now();
    let cpu: f64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let c0 = thread_cpu();
                    let mut x = 0x9e37_79b9_7f4a_7c15u64
                        ^ (t as u64 + 1).wrapping_mul(0xff51_afd7_ed55_8ccd);
                    let mut hits = 0u64;
                    for i in 0..ops {
                        x ^= x >> 12;
                        x ^= x << 25;
                        x ^= x >> 27;
                        let k = key(x.wrapping_mul(0x2545_f491_4f6c_dd1d) % keys);
                        if set_every != 0 && i % set_every == 0 {
                            set(e, &k, &[b'w'; 32]);
                        } else {
                            e.get(&k, 100, ReadOptions::default(), &mut |v| {
                                hits += v.value.len() as u64
                            });
                        }
                    }
                    std::hint::black_box(hits);
                    ops as f64 / (thread_cpu() - c0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    });
    let wall = (threads as u64 * ops) as f64 / start.elapsed().as_secs_f64();
    (wall, cpu / threads as f64)
}

fn throughput_scaling() {
    let keys = 200_000;
    let e = LogEngine::new(EngineConfig {
        max_bytes: 64 << 20,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    });
    for i in 0..keys {
        set(&e, &key(i), &[b'v'; 32]);
    }
    for (name, set_every) in [("90/10 get/set", 10), ("gets only", 0), ("sets only", 1)] {
        throughput(&e, 2, 200_000, keys, set_every); // warm up
        let (one, one_cpu) = throughput(&e, 1, 2_000_000, keys, set_every);
        let (two, two_cpu) = throughput(&e, 2, 2_000_000, keys, set_every);
        eprintln!(
            "{name}: wall clock: 1 thread {:.2} Mops/s, 2 threads {:.2} Mops/s (x{:.2}); \
             per CPU-second per thread: {:.2} vs {:.2} Mops (2-thread total x{:.2})",
            one / 1e6,
            two / 1e6,
            two / one,
            one_cpu / 1e6,
            two_cpu / 1e6,
            2.0 * two_cpu / one_cpu
        );
    }
}

/// Warm restart without the server: 1,000,000 items (15-byte keys, 100-byte values) saved
/// with `dump`, then loaded into a fresh engine 5 times with `restore_bytes` (the file in
/// memory, as kvcached maps it) and with `restore` (as a stream); prints every time and the
/// medians. The engine side of `bench/warm_restart.sh`.
fn restore_speed() {
    let config = EngineConfig {
        max_bytes: 1 << 30,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    };
    let e = LogEngine::new(config.clone());
    let value = [b'v'; 100];
    let n = 1_000_000;
    for i in 0..n {
        assert!(matches!(set(&e, &key(i), &value), StoreResult::Stored(_)));
    }
    let mut file = Vec::new();
    e.dump(&mut file, 0).expect("dump");
    drop(e);
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..5 {
        for (way, t) in times.iter_mut().enumerate() {
            let fresh = LogEngine::new(config.clone());
            let start = Instant::now();
            if way == 0 {
                fresh.restore_bytes(&file, 100).expect("restore");
            } else {
                fresh.restore(&mut file.as_slice(), 100).expect("restore");
            }
            let ms = start.elapsed().as_secs_f64() * 1e3;
            assert_eq!(fresh.stats().curr_items, n);
            println!(
                "round {round}: {} {ms:.0} ms",
                ["restore_bytes", "restore"][way]
            );
            t.push(ms);
        }
    }
    for (way, t) in times.iter_mut().enumerate() {
        t.sort_by(f64::total_cmp);
        println!(
            "median {}: {:.0} ms for {n} items ({} MiB file)",
            ["restore_bytes", "restore"][way],
            t[2],
            file.len() >> 20
        );
    }
}

/// RAM per item with a flash tier (issue 43's target: at most 16 bytes per flash-resident
/// item): 10,000,000 items of 15-byte keys and 32-byte values into an engine of `-m 192`
/// (`KVSTORE_FLASH_M` MiB) with a 2 GiB tier file in `KVSTORE_FLASH_DIR` (skipped without
/// it). Prints where the items are, the index's bytes per item, and RSS growth per item.
fn flash_memory() {
    let Some(dir) = std::env::var_os("KVSTORE_FLASH_DIR") else {
        eprintln!("  (skipped: set KVSTORE_FLASH_DIR to a directory for the tier's file)");
        return;
    };
    let path = std::path::Path::new(&dir).join("kvstore-measure-flash");
    let n = 10_000_000u64;
    let max_bytes = std::env::var("KVSTORE_FLASH_M")
        .ok()
        .and_then(|m| m.parse::<usize>().ok())
        .unwrap_or(192)
        << 20;
    let before = fill::rss();
    let e = LogEngine::with_layout(
        EngineConfig {
            max_bytes,
            max_item_size: 1 << 20,
            no_evict: false,
            use_cas: true,
        },
        IndexLayout::Wide,
    );
    let tier = kvstore::flash::Tier::create(&kvstore::flash::TierConfig {
        files: vec![(path.clone(), 2 << 30)],
        page_bytes: e.segment_size(),
        write_threads: 1,
        write_buffer: 8 << 20,
        direct: true,
    })
    .expect("make the tier");
    e.attach_flash(tier).expect("attach the tier");
    let start = Instant::now();
    let value = [b'v'; 32];
    for i in 0..n {
        set(&e, &key(i), &value);
    }
    e.flash_settle();
    let load = start.elapsed();
    let after = fill::rss();
    let s = e.stats();
    let f = e.flash_stats().expect("a tier");
    let mut hits = 0u64;
    for i in (0..n).step_by(1000) {
        let mut ok = false;
        e.get(&key(i), 100, ReadOptions::default(), &mut |v| {
            ok = v.value == value
        });
        hits += u64::from(ok);
    }
    eprintln!(
        "{n} items (15-byte keys, 32-byte values), -m {} MiB, 2 GiB tier, loaded in {:.1} s:",
        max_bytes >> 20,
        load.as_secs_f64()
    );
    eprintln!(
        "  items: {} in all, {} on flash ({} flash pages, {} evicted); {} of {} sampled gets hit",
        s.curr_items,
        f.objects_used,
        f.tier.pages_used,
        s.evictions,
        hits,
        n / 1000
    );
    eprintln!(
        "  index: {} bytes, {:.1} per item; engine memory {:.1} MiB",
        e.index_bytes(),
        e.index_bytes() as f64 / s.curr_items.max(1) as f64,
        e.memory_bytes() as f64 / f64::from(1 << 20)
    );
    if let (Some(b), Some(a)) = (before, after) {
        eprintln!(
            "  RSS growth: {:.1} MiB, {:.1} bytes per item",
            a.saturating_sub(b) as f64 / f64::from(1 << 20),
            a.saturating_sub(b) as f64 / s.curr_items.max(1) as f64
        );
    }
    drop(e);
    let _ = std::fs::remove_file(&path);
}
