//! `LogEngine` with a flash tier (issue 43, stage 2: `src/log/flash.rs`): cold items leave
//! RAM for flash instead of being dropped, every command sees a flash item as it would a
//! RAM one, nothing wrong is ever returned, and the engine's accounting stays exact while
//! pages are written, bound and taken back. Reads block here, or are done by the caller
//! (`flash_read_start`/`flash_read_end`, as a server's io_uring does them).

#[path = "support/tier.rs"]
mod tier;

use kvstore::{
    ArithResult, Engine, EngineConfig, FlashAttachError, FlashStats, IndexLayout, LogEngine,
    ReadOptions, StoreMode, StoreRequest, StoreResult, Time,
};

const NOW: Time = 1000;

fn config(max_bytes: usize) -> EngineConfig {
    EngineConfig {
        max_bytes,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    }
}

/// An engine of `max_bytes` with a tier of `flash` bytes (in a directory that lives as
/// long as the engine's test keeps the second value).
fn engine(max_bytes: usize, flash: u64) -> (LogEngine, tier::Dir) {
    let e = LogEngine::with_layout(config(max_bytes), IndexLayout::Wide);
    let dir = tier::attach(&e, flash, 1, 4 << 20);
    (e, dir)
}

fn value(i: u64, len: usize) -> Vec<u8> {
    let tag = format!("{i}:");
    tag.bytes()
        .chain(std::iter::repeat(b'x'))
        .take(len)
        .collect()
}

fn set(e: &LogEngine, key: &[u8], v: &[u8]) -> StoreResult {
    e.store(
        StoreRequest {
            mode: StoreMode::Set,
            key,
            value: v,
            flags: 7,
            exptime: 0,
        },
        NOW,
    )
}

fn get(e: &LogEngine, key: &[u8]) -> Option<(Vec<u8>, u32, u64)> {
    let mut out = None;
    e.get(key, NOW, ReadOptions::default(), &mut |v| {
        out = Some((v.value.to_vec(), v.flags, v.cas))
    });
    out
}

fn key(i: u64) -> Vec<u8> {
    format!("key:{i}").into_bytes()
}

#[test]
fn a_tier_needs_the_wide_index() {
    let dir = tier::Dir::new("flash-layout");
    let e = LogEngine::new(config(4 << 20));
    let tier = dir.tier(&e, 8 << 20, 1, 1 << 20);
    assert_eq!(e.attach_flash(tier), Err(FlashAttachError::Layout));
}

/// Ten times the memory written, a tier that holds it all: nearly every item is still
/// there, read from flash with its value, flags and CAS; the accounting is exact.
#[test]
fn items_beyond_memory_are_read_back_from_flash() {
    let (e, _dir) = engine(4 << 20, 96 << 20);
    let n = 40_000u64;
    let cas = load(&e, n, |_| 1);
    assert!(e.flash_stats().expect("a tier").tier.pages_used > 0);
    let hits = (0..n).filter(|&i| read_back(&e, i, &cas)).count() as u64;
    // 4 MiB of RAM holds about 3,500 of these items; flash the rest.
    eprintln!("{hits} of {n} read back; {:?}", e.flash_stats());
    assert!(hits > n * 9 / 10, "{hits} of {n} read back");
    let s = e.flash_stats().expect("a tier");
    assert!(s.reads > n / 2, "{s:?}");
    assert_eq!(s.read_errors, 0, "{s:?}");
    e.check_accounting().expect("accounting after the reads");
}

/// A segment leaving RAM with dead records in it (here every other item overwritten at
/// once) writes only its live records to flash, packed: flash is written with about the
/// live bytes it is given, not the whole log. Every item reads back with its value and
/// CAS; the accounting is exact.
#[test]
fn demoted_segments_write_only_their_live_records() {
    let (e, _dir) = engine(4 << 20, 96 << 20);
    let n = 30_000u64;
    let cas = load(&e, n, |i| if i % 2 == 0 { 2 } else { 1 });
    let s = e.flash_stats().expect("a tier");
    // A third of the log is dead; the images hold the live records (4 KiB blocks with
    // their checks, the last one of each image partly empty, come on top).
    assert!(
        s.tier.bytes_written < s.bytes_demoted + s.bytes_demoted / 20,
        "{} bytes written for {} live: {s:?}",
        s.tier.bytes_written,
        s.bytes_demoted
    );
    for i in 0..n {
        assert!(read_back(&e, i, &cas), "key {i} lost");
    }
    let s = e.flash_stats().expect("a tier");
    assert_eq!(s.read_errors, 0, "{s:?}");
    e.check_accounting().expect("accounting after the reads");
}

/// Store `n` items of 1000-byte values, key `i` written `writes(i)` times in a row; settle
/// the flash writes, check the accounting and that most went to flash. Each item's CAS.
fn load(e: &LogEngine, n: u64, writes: impl Fn(u64) -> u32) -> Vec<u64> {
    let mut cas = vec![0; n as usize];
    for i in 0..n {
        for _ in 0..writes(i) {
            match set(e, &key(i), &value(i, 1000)) {
                StoreResult::Stored(c) => cas[i as usize] = c,
                other => panic!("set {i}: {other:?}"),
            }
        }
    }
    e.flash_settle();
    e.check_accounting().expect("accounting after the load");
    let s = e.flash_stats().expect("a tier");
    assert!(s.objects_written > n / 2, "{s:?}");
    cas
}

/// Whether `load`'s item `i` is there; if it is, with its value, flags and CAS.
fn read_back(e: &LogEngine, i: u64, cas: &[u64]) -> bool {
    let Some((v, flags, c)) = get(e, &key(i)) else {
        return false;
    };
    assert_eq!(v, value(i, 1000), "key {i}: wrong value");
    assert_eq!(flags, 7);
    assert_eq!(
        c, cas[i as usize],
        "key {i}: CAS changed on its way to flash"
    );
    true
}

/// Writes over flash items replace them (one slot per key): overwrite, delete, add,
/// append, incr and touch behave as on RAM items.
#[test]
fn commands_on_flash_items_behave_as_on_ram_items() {
    let (e, _dir) = engine(4 << 20, 96 << 20);
    let n = 20_000u64;
    for i in 0..n {
        let v = if i % 10 == 3 {
            i.to_string().into_bytes()
        } else {
            value(i, 1000)
        };
        assert!(matches!(set(&e, &key(i), &v), StoreResult::Stored(_)));
    }
    e.flash_settle();
    // The first keys are long gone from RAM (a few may have been evicted, not demoted:
    // the commands run on those still present).
    let mut absent = 0;
    for i in 0..200u64 {
        let k = key(i);
        if e.peek_item(&k, NOW).is_none() {
            absent += 1;
            continue;
        }
        match i % 10 {
            0 => {
                assert!(matches!(set(&e, &k, b"new"), StoreResult::Stored(_)));
                assert_eq!(get(&e, &k).map(|x| x.0), Some(b"new".to_vec()));
            }
            1 => {
                assert!(e.delete(&k, NOW));
                assert!(get(&e, &k).is_none(), "key {i} deleted");
                assert!(!e.delete(&k, NOW));
            }
            2 => {
                let add = e.store(
                    StoreRequest {
                        mode: StoreMode::Add,
                        key: &k,
                        value: b"added",
                        flags: 0,
                        exptime: 0,
                    },
                    NOW,
                );
                assert!(matches!(add, StoreResult::NotStored), "key {i}: {add:?}");
                assert_eq!(get(&e, &k).map(|x| x.0), Some(value(i, 1000)));
            }
            3 => {
                let r = e.arith(&k, true, 5, NOW);
                assert!(matches!(r, ArithResult::Value(x) if x == i + 5), "{r:?}");
                assert_eq!(
                    get(&e, &k).map(|x| x.0),
                    Some((i + 5).to_string().into_bytes())
                );
            }
            4 => {
                let r = e.store(
                    StoreRequest {
                        mode: StoreMode::Append,
                        key: &k,
                        value: b"!",
                        flags: 0,
                        exptime: 0,
                    },
                    NOW,
                );
                assert!(matches!(r, StoreResult::Stored(_)), "{r:?}");
                let mut want = value(i, 1000);
                want.push(b'!');
                assert_eq!(get(&e, &k).map(|x| x.0), Some(want));
            }
            5 => {
                assert!(e.touch(&k, NOW + 100, NOW));
                assert_eq!(get(&e, &k).map(|x| x.0), Some(value(i, 1000)));
            }
            6 => {
                let (_, _, c) = get(&e, &k).expect("present");
                let stale = e.store(
                    StoreRequest {
                        mode: StoreMode::Cas(c + 1),
                        key: &k,
                        value: b"cas",
                        flags: 0,
                        exptime: 0,
                    },
                    NOW,
                );
                assert!(matches!(stale, StoreResult::Exists), "{stale:?}");
                let ok = e.store(
                    StoreRequest {
                        mode: StoreMode::Cas(c),
                        key: &k,
                        value: b"cas",
                        flags: 0,
                        exptime: 0,
                    },
                    NOW,
                );
                assert!(matches!(ok, StoreResult::Stored(_)), "{ok:?}");
                assert_eq!(get(&e, &k).map(|x| x.0), Some(b"cas".to_vec()));
            }
            _ => {}
        }
    }
    assert!(absent < 20, "{absent} of the first 200 keys absent");
    e.check_accounting().expect("accounting after the commands");
    e.flush_all(0, NOW);
    for i in (0..n).step_by(97) {
        assert!(get(&e, &key(i)).is_none(), "key {i} after flush_all");
    }
}

/// A tier smaller than what is written: its oldest pages are taken back and their items
/// evicted, counted; nothing wrong is returned and the accounting stays exact.
#[test]
fn a_full_tier_gives_back_its_oldest_pages() {
    let (e, _dir) = engine(4 << 20, 16 << 20);
    // Evictions from flash are told to the observer (`watch evictions`) as from RAM.
    let observed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = std::sync::Arc::clone(&observed);
    e.observe_evictions(Box::new(move |item, _| {
        assert!(item.key.starts_with(b"key:"));
        seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }));
    let n = 60_000u64;
    for i in 0..n {
        assert!(matches!(
            set(&e, &key(i), &value(i, 1000)),
            StoreResult::Stored(_)
        ));
    }
    e.flash_settle();
    e.check_accounting().expect("accounting");
    let s = e.flash_stats().expect("a tier");
    assert!(s.pages_dropped > 0, "{s:?}");
    assert!(s.objects_evicted > 0, "{s:?}");
    let (mut hits, mut newest) = (0, 0);
    for i in 0..n {
        if let Some((v, _, _)) = get(&e, &key(i)) {
            assert_eq!(v, value(i, 1000), "key {i}");
            hits += 1;
            if i >= n - 10_000 {
                newest += 1;
            }
        }
    }
    // About 20 MiB fit in RAM and flash together: the newest items are kept.
    assert!(hits > 10_000 && hits < n, "{hits}");
    assert!(newest > 9_000, "{newest} of the newest 10,000");
    let st = e.stats();
    assert!(st.evictions > 0);
    // Every eviction is observed and, never read, counted as unfetched.
    assert_eq!(
        observed.load(std::sync::atomic::Ordering::Relaxed),
        st.evictions
    );
    assert_eq!(st.evicted_unfetched, st.evictions, "{st:?}");
}

/// With flash I/O deferred (a server's worker), a lookup of a flash item finds nothing and
/// names the read it needs; once that read is done elsewhere, the lookup run again finds
/// the item without I/O. RAM items need no read.
#[test]
fn deferred_lookups_name_their_reads_and_find_the_item_once_done() {
    let (e, _dir) = engine(4 << 20, 96 << 20);
    let n = 20_000u64;
    load(&e, n, |_| 1);
    let (newest, reads) = e.defer_flash(|| get(&e, &key(n - 1)));
    assert!(reads.is_empty(), "a RAM item needs no read");
    assert_eq!(newest.map(|x| x.0), Some(value(n - 1, 1000)));
    let (mut checked, mut single) = (0, 0u64);
    for i in (0..n / 2).step_by(101) {
        let k = key(i);
        let (first, reads) = e.defer_flash(|| get(&e, &k));
        if reads.is_empty() {
            // Not on flash (a second chance kept it in RAM), or evicted.
            continue;
        }
        assert!(first.is_none(), "key {i}: found without its read");
        // One read for the key's record, and one more for each other flash record whose
        // tag matches in the key's bucket chain (the index keeps tags, not keys, and its
        // hash is seeded at random per engine, so a run meets such a match now and then).
        for (j, r) in reads.iter().enumerate() {
            assert!(
                !reads[..j].contains(r),
                "key {i}: a read named twice: {reads:?}"
            );
        }
        let reads_before = e.flash_stats().map(|s| s.reads);
        for r in &reads {
            e.complete_flash_read(r);
        }
        let (again, more) = e.defer_flash(|| get(&e, &k));
        assert!(more.is_empty(), "key {i}: read again");
        assert_eq!(again.map(|x| x.0), Some(value(i, 1000)), "key {i}");
        assert_eq!(
            e.flash_stats().map(|s| s.reads),
            reads_before.map(|r| r + reads.len() as u64),
            "each named read done once for the two lookups"
        );
        single += u64::from(reads.len() == 1);
        checked += 1;
    }
    assert!(checked > 50, "{checked} flash items looked up");
    // A tag match with another key is rare (one lookup in hundreds), never the rule.
    assert!(
        single * 10 >= checked * 9,
        "{single} of {checked} needed one read"
    );
}

/// A write of a new key whose index tag matches another key's flash record reads that
/// record once (a server's look ahead, `flash_reads_for`, then the write itself), stores
/// the new key, and counts the record as one tag misread, however many lookups compared it.
#[test]
fn a_tag_matching_another_keys_flash_record_is_one_misread() {
    let (e, _dir) = engine(4 << 20, 96 << 20);
    let n = 20_000u64;
    load(&e, n, |_| 1);
    let stats = || e.flash_stats().expect("a tier");
    // A key never stored whose look ahead names a read: its tag matched a flash record.
    let (mut other, mut reads) = (Vec::new(), Vec::new());
    for j in 0..400_000u64 {
        other = format!("other:{j}").into_bytes();
        reads = e.flash_reads_for(&other);
        if !reads.is_empty() {
            break;
        }
    }
    assert!(!reads.is_empty(), "no tag match in 400,000 keys");
    let before = stats();
    for r in &reads {
        e.complete_flash_read(r);
    }
    // The look ahead again, then the write: both compare the kept record.
    assert!(e.flash_reads_for(&other).is_empty(), "read again");
    assert!(matches!(set(&e, &other, b"new"), StoreResult::Stored(_)));
    let after = stats();
    assert_eq!(after.reads - before.reads, reads.len() as u64, "{after:?}");
    assert_eq!(
        after.tag_misreads - before.tag_misreads,
        reads.len() as u64,
        "{before:?} -> {after:?}"
    );
    assert_eq!(get(&e, &other).map(|x| x.0), Some(b"new".to_vec()));
}

/// A read its caller submits itself (a server's io_uring) is checked as the engine's own:
/// the span it names holds the record, a record longer than the first read asks for a
/// longer one, and damaged bytes or a failed read are a miss, counted, never wrong data.
#[test]
fn reads_submitted_by_the_caller_are_checked_as_the_engines_own() {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;
    let (e, _dir) = engine(4 << 20, 96 << 20);
    let n = 12_000u64;
    let len = |i: u64| if i % 2 == 0 { 1000 } else { 5000 };
    for i in 0..n {
        assert!(matches!(
            set(&e, &key(i), &value(i, len(i))),
            StoreResult::Stored(_)
        ));
    }
    e.flash_settle();
    let errors = || e.flash_stats().map_or(0, |s| s.read_errors);
    let (mut sound, mut long, mut spoiled) = (0, 0, 0u64);
    for i in (0..n / 2).step_by(23) {
        let k = key(i);
        let (_, reads) = e.defer_flash(|| get(&e, &k));
        let [r] = reads[..] else {
            continue;
        };
        // Every third read damaged, every third one failing; the rest as read.
        let fault = (sound + spoiled) % 3;
        let errors_before = errors();
        let mut io = e.flash_read_start(&r).expect("a read to submit");
        let mut rounds = 0;
        loop {
            rounds += 1;
            let mut buf = kvstore::flash::AlignedBuf::new();
            let raw = buf.get(io.span.len);
            // SAFETY: the tier's descriptor, open while the engine is; ManuallyDrop
            // leaves it open.
            let file =
                std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(io.span.fd) });
            file.read_exact_at(raw, io.span.at).expect("read the span");
            let got = match fault {
                1 => {
                    raw[10] ^= 1;
                    Ok(&raw[..])
                }
                2 => Err(std::io::Error::other("an injected read error")),
                _ => Ok(&raw[..]),
            };
            match e.flash_read_end(&io, got) {
                Some(next) => io = next,
                None => break,
            }
        }
        let (again, more) = e.defer_flash(|| get(&e, &k));
        assert!(more.is_empty(), "key {i}: read again");
        if fault == 0 {
            assert_eq!(again.map(|x| x.0), Some(value(i, len(i))), "key {i}");
            assert_eq!(errors(), errors_before);
            sound += 1;
            if len(i) > 2048 {
                assert!(rounds > 1, "key {i}: a long record in one short read");
                long += 1;
            }
        } else {
            assert_eq!(again, None, "key {i}: served from a bad read");
            assert_eq!(errors(), errors_before + 1, "key {i}: not counted");
            spoiled += 1;
        }
    }
    assert!(
        long > 10 && spoiled > 10,
        "{sound} sound ({long} long), {spoiled} bad"
    );
}

/// A flash item read again is copied back to memory (memcached's recache) with its value,
/// flags and CAS: the next reads need no flash read. Read once, it stays on flash; with
/// the rate at 0, nothing is copied back.
#[test]
fn flash_items_read_again_are_copied_back_to_memory() {
    let (e, _dir) = engine(4 << 20, 96 << 20);
    let n = 20_000u64;
    let mut cas = Vec::new();
    for i in 0..n {
        match set(&e, &key(i), &value(i, 1000)) {
            StoreResult::Stored(c) => cas.push(c),
            other => panic!("set {i}: {other:?}"),
        }
    }
    e.flash_settle();
    let reads = |e: &LogEngine| e.flash_stats().expect("a tier").reads;
    let recaches = |e: &LogEngine| e.flash_stats().expect("a tier").recaches;
    // Once: read from flash, not copied.
    let before = reads(&e);
    assert_eq!(get(&e, &key(1)), Some((value(1, 1000), 7, cas[1])));
    assert_eq!(reads(&e), before + 1);
    assert_eq!(recaches(&e), 0);
    // Twice: read from flash again and copied back.
    assert_eq!(get(&e, &key(1)), Some((value(1, 1000), 7, cas[1])));
    assert_eq!(reads(&e), before + 2);
    assert_eq!(recaches(&e), 1);
    // From memory now.
    for _ in 0..3 {
        assert_eq!(get(&e, &key(1)), Some((value(1, 1000), 7, cas[1])));
    }
    assert_eq!(
        reads(&e),
        before + 2,
        "no flash read for a copied-back item"
    );
    assert_eq!(recaches(&e), 1);
    e.check_accounting().expect("accounting after the copy");
    // A write over it behaves as over any item.
    assert!(matches!(set(&e, &key(1), b"new"), StoreResult::Stored(_)));
    assert_eq!(get(&e, &key(1)).map(|g| g.0), Some(b"new".to_vec()));

    e.set_flash_recache_rate(0);
    let before = reads(&e);
    for _ in 0..3 {
        assert_eq!(get(&e, &key(2)), Some((value(2, 1000), 7, cas[2])));
    }
    assert_eq!(reads(&e), before + 3, "rate 0: every read from flash");
    assert_eq!(recaches(&e), 1);
    e.check_accounting().expect("accounting");
}

/// With `ext_item_size`, items whose record is shorter are evicted when their segment
/// leaves memory, as without a tier; longer ones go to flash with it.
#[test]
fn items_under_the_flash_item_size_are_evicted_instead() {
    let (e, _dir) = engine(4 << 20, 16 << 20);
    e.set_flash_item_size(512);
    let len = |i: u64| if i % 2 == 0 { 100 } else { 1000 };
    let n = 10_000;
    for i in 0..n {
        assert!(matches!(
            set(&e, &key(i), &value(i, len(i))),
            StoreResult::Stored(_)
        ));
    }
    e.flash_settle();
    let s = e.flash_stats().expect("a tier");
    assert_eq!(s.pages_dropped, 0, "the tier had room: {s:?}");
    // The oldest keys left memory long ago: the long ones on flash, the short ones gone.
    let old = 0..2_000;
    for i in old.clone() {
        let got = get(&e, &key(i)).map(|g| g.0);
        if len(i) == 100 {
            assert_eq!(got, None, "short key {i} kept");
        } else {
            assert_eq!(got, Some(value(i, 1000)), "long key {i} lost");
        }
    }
    assert!(e.stats().evictions >= old.count() as u64 / 2);
    e.check_accounting().expect("accounting");

    // Back to 0: short items go to flash too.
    e.set_flash_item_size(0);
    for i in n..3 * n {
        assert!(matches!(
            set(&e, &key(i), &value(i, 100)),
            StoreResult::Stored(_)
        ));
    }
    e.flash_settle();
    for i in n..n + 2_000 {
        assert_eq!(
            get(&e, &key(i)).map(|g| g.0),
            Some(value(i, 100)),
            "key {i}"
        );
    }
    e.check_accounting().expect("accounting");
}

/// Write items until the tier has no free page but the one it keeps for compaction; the
/// next key.
fn fill_tier(e: &LogEngine, from: u64) -> u64 {
    let full = |e: &LogEngine| e.flash_stats().expect("a tier").tier.pages_free <= 1;
    write_keys(
        e,
        from,
        (200_000, "the tier never filled"),
        500,
        full,
        || {},
    )
}

/// Write items (1000-byte values) from key `from` on until `done` says so (failing,
/// saying `what`, after `most` items), settling flash writes and calling `every` each
/// `settle` items; the next key.
fn write_keys(
    e: &LogEngine,
    from: u64,
    (most, what): (u64, &str),
    settle: u64,
    done: impl Fn(&LogEngine) -> bool,
    mut every: impl FnMut(),
) -> u64 {
    let mut i = from;
    while !done(e) {
        assert!(i < from + most, "{what}");
        assert!(matches!(
            set(e, &key(i), &value(i, 1000)),
            StoreResult::Stored(_)
        ));
        i += 1;
        if i % settle == 0 {
            e.flash_settle();
            every();
        }
    }
    i
}

/// Write items from key `from` on until `pages` more pages were freed (taken back whole or
/// emptied by a compaction; settling writes every 50 items; at most 20 pages' worth of
/// items).
fn take_back(e: &LogEngine, from: u64, pages: u64) {
    let freed = |e: &LogEngine| e.flash_stats().expect("a tier").tier.page_reclaims;
    let target = freed(e) + pages;
    let most = (20 * per_segment(e), "no page taken back");
    write_keys(e, from, most, 50, |e| freed(e) >= target, || {});
}

/// A 4 MiB engine whose 16 MiB tier was filled with keys written in order (1000-byte
/// values): the engine, its tier, about how many keys a page holds (`p`), the next key,
/// and the first key of the oldest page left (pages were taken back oldest first, all
/// about as full; where keys are shorter a page holds a few more than `p`).
fn full_tier() -> (LogEngine, tier::Dir, u64, u64, u64) {
    let (e, dir) = engine(4 << 20, 16 << 20);
    let p = per_segment(&e);
    let end = fill_tier(&e, 0);
    e.flash_settle();
    let oldest = e.flash_stats().expect("a tier").pages_dropped * p;
    (e, dir, p, end, oldest)
}

/// Items per segment, about (1000-byte values).
fn per_segment(e: &LogEngine) -> u64 {
    e.segment_size() as u64 / 1040
}

/// A full tier takes back, of its oldest pages, the one with the fewest live bytes: pages
/// emptied by deletes go before the oldest page, whose items stay.
#[test]
fn a_full_tier_takes_back_its_emptiest_old_page_first() {
    let (e, _dir, p, end, oldest) = full_tier();
    // The twelve pages written after it: all dead. One write may ship several segments
    // (as many as are in flight before one of their writes finishes, which depends on the
    // writer thread's speed), so it may take back pages beyond the two the loop below
    // waits for: enough dead pages that every reclaim finds two or more to compact.
    for i in oldest + p + p / 4..oldest + 13 * p {
        assert!(e.delete(&key(i), NOW), "key {i}");
    }
    take_back(&e, end, 2);
    let middle = oldest + p / 4..oldest + p * 3 / 4;
    let kept = middle
        .clone()
        .filter(|&k| get(&e, &key(k)).is_some())
        .count();
    assert_eq!(kept, middle.count(), "the oldest page's items are kept");
    e.check_accounting().expect("accounting");
}

/// The maintenance makes room on a full tier before eviction needs it (a few pages beyond
/// the one kept for compaction), so that writes seldom take pages back themselves; what it
/// took back is accounted for, and the newest items are all still there.
#[test]
fn the_maintenance_frees_pages_ahead_of_eviction() {
    let (e, _dir, end, before) = full_then_maintained(0);
    let taken = |e: &LogEngine| e.flash_stats().expect("a tier").tier.page_reclaims;
    assert!(
        pages_free(&e) > 3,
        "{} pages free after the maintenance",
        pages_free(&e)
    );
    assert!(taken(&e) > before);
    // A second call with room enough does nothing more.
    let after = taken(&e);
    e.maintain(NOW, false);
    assert_eq!(taken(&e), after);
    newest_intact(&e, end);
}

/// `ext_compact_under`: the maintenance makes room until that many pages are free (here
/// 8, where its own margin would stop at 4).
#[test]
fn compact_under_sets_the_pages_the_maintenance_keeps_free() {
    let (e, _dir, end, _) = full_then_maintained(8);
    assert!(
        pages_free(&e) >= 8,
        "{} pages free after the maintenance",
        pages_free(&e)
    );
    newest_intact(&e, end);
}

fn pages_free(e: &LogEngine) -> u64 {
    e.flash_stats().expect("a tier").tier.pages_free
}

/// A full tier (`full_tier`) with `ext_compact_under` set (0: the default), once through
/// the maintenance: the engine, its tier, the next key, and the pages taken back before.
fn full_then_maintained(compact_under: u32) -> (LogEngine, tier::Dir, u64, u64) {
    let (e, dir, _p, end, _oldest) = full_tier();
    assert!(pages_free(&e) <= 1, "not full: {} free", pages_free(&e));
    e.set_flash_compact_under(compact_under);
    let before = e.flash_stats().expect("a tier").tier.page_reclaims;
    e.maintain(NOW, false);
    (e, dir, end, before)
}

/// The 500 items written last before `end` read back whole, and the accounting holds.
fn newest_intact(e: &LogEngine, end: u64) {
    let newest: Vec<u64> = (end - 500..end).collect();
    assert_eq!(intact(e, &newest), newest.len(), "newest items lost");
    e.check_accounting().expect("accounting");
}

/// When a page is taken back, its items read while on flash go back to memory
/// (`extstore_compact_rescues`); the unread ones are evicted.
#[test]
fn items_read_on_a_page_taken_back_are_rescued() {
    let (e, _dir, p, end, oldest) = full_tier();
    // The oldest page left: read every fifth item of its middle half once.
    let middle: Vec<u64> = (oldest + p / 4..oldest + p * 3 / 4).collect();
    let read: Vec<u64> = middle.iter().copied().filter(|k| k % 5 == 0).collect();
    for &k in &read {
        assert_eq!(
            get(&e, &key(k)).map(|g| g.0),
            Some(value(k, 1000)),
            "key {k}"
        );
    }
    take_back(&e, end, 3);
    let s = e.flash_stats().expect("a tier");
    assert!(s.rescues >= read.len() as u64 * 9 / 10, "{s:?}");
    let kept = read.iter().filter(|&&k| get(&e, &key(k)).is_some()).count();
    assert!(
        kept >= read.len() * 9 / 10,
        "{kept} of {} read items kept",
        read.len()
    );
    let unread: Vec<u64> = middle.iter().copied().filter(|k| k % 5 != 0).collect();
    let gone = unread
        .iter()
        .filter(|&&k| get(&e, &key(k)).is_none())
        .count();
    assert!(
        gone > unread.len() * 9 / 10,
        "{gone} of {} unread items evicted",
        unread.len()
    );
    e.check_accounting().expect("accounting");
}

/// What a get returns for a key (value, flags, CAS), or None.
type Got = Option<(Vec<u8>, u32, u64)>;

/// Every key of `0..n` with what a get returns for it.
fn contents(e: &LogEngine, n: u64) -> Vec<Got> {
    (0..n).map(|i| get(e, &key(i))).collect()
}

/// An engine whose tier holds most of `n` items of 1000 bytes, some of them deleted and
/// some overwritten since they went to flash; its snapshot (`dump`), taken the way a
/// server stops, and what every key read before the snapshot.
fn saved_with_flash(e: &LogEngine, n: u64) -> (Vec<u8>, Vec<Got>) {
    for i in 0..n {
        assert!(matches!(
            set(e, &key(i), &value(i, 1000)),
            StoreResult::Stored(_)
        ));
    }
    e.flash_settle();
    // Old keys are on flash: delete some, write others anew (in memory, newer).
    for i in (0..n / 2).step_by(7) {
        assert!(e.delete(&key(i), NOW), "key {i}");
    }
    for i in (3..n / 2).step_by(11) {
        assert!(matches!(
            set(e, &key(i), &value(i + 1, 1000)),
            StoreResult::Stored(_)
        ));
    }
    let before = contents(e, n);
    let mut file = Vec::new();
    e.dump(&mut file, 1).expect("dump");
    (file, before)
}

/// Compare what keys read `after` (a restart) with `before`: every item found is what it
/// was (asserted); the items found, and those lost.
fn compare_kept(before: &[Got], after: &[Got]) -> (u64, u64) {
    let (mut hits, mut lost) = (0, 0);
    for (i, (b, a)) in before.iter().zip(after).enumerate() {
        match a {
            Some(_) => {
                assert_eq!(a, b, "key {i}");
                hits += 1;
            }
            None if b.is_some() => lost += 1,
            None => {}
        }
    }
    (hits, lost)
}

/// A warm restart keeps the flash tier: the snapshot names the pages, the files are
/// opened as they are, and every item comes back from where it was, flash ones included,
/// with its value, flags and CAS; deleted and overwritten items stay so; the accounting is
/// exact, and the engine goes on writing to flash and taking pages back.
#[test]
fn a_warm_restart_keeps_the_flash_tier() {
    let n = 20_000;
    let (file, before, on_flash, dir) = {
        let (e, dir) = engine(4 << 20, 32 << 20);
        let (file, before) = saved_with_flash(&e, n);
        let on_flash = e.flash_stats().expect("a tier").objects_used;
        assert!(on_flash > n / 2, "{on_flash} items on flash");
        (file, before, on_flash, dir)
    };
    assert_eq!(file.get(7), Some(&kvstore::SNAPSHOT_VERSION));

    let e = LogEngine::with_layout(config(4 << 20), IndexLayout::Wide);
    e.attach_flash(dir.reopen(&e, 32 << 20, 1, 4 << 20))
        .expect("attach");
    e.restore_bytes(&file, NOW).expect("restore");
    let r = e.flash_restore();
    assert_eq!(r.pages_lost, 0, "{r:?}");
    assert_eq!(r.items, on_flash, "{r:?}");
    let s = e.flash_stats().expect("a tier");
    assert_eq!(s.objects_used, on_flash, "{s:?}");
    assert_eq!(s.tier.pages_used, r.pages, "{s:?}");
    e.check_accounting().expect("accounting after the restore");
    let after = contents(&e, n);
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(a, b, "key {i}");
    }
    assert!(e.flash_stats().expect("a tier").reads >= on_flash);

    // It goes on: new items push old ones to flash, pages are taken back.
    let more = n..n + 60_000;
    for i in more.clone() {
        assert!(matches!(
            set(&e, &key(i), &value(i, 1000)),
            StoreResult::Stored(_)
        ));
    }
    e.flash_settle();
    let s = e.flash_stats().expect("a tier");
    assert!(s.pages_dropped > 0, "{s:?}");
    e.check_accounting().expect("accounting after more writes");
    for i in 0..more.end {
        if let Some((v, ..)) = get(&e, &key(i)) {
            let want = before
                .get(i as usize)
                .and_then(|b| b.as_ref().map(|b| b.0.clone()))
                .unwrap_or_else(|| value(i, 1000));
            assert_eq!(v, want, "key {i}");
        }
    }
}

/// A snapshot whose flash files are gone (made afresh), or restored with no tier: its
/// flash pages are lost, counted, and what was in memory still loads, exactly.
#[test]
fn a_warm_restart_without_its_flash_files_keeps_what_was_in_memory() {
    let n = 20_000;
    let (e, _dir) = engine(4 << 20, 96 << 20);
    let (file, before) = saved_with_flash(&e, n);
    let saved = e.flash_stats().expect("a tier");
    let in_memory = e.stats().curr_items - saved.objects_used;
    drop(e);

    for fresh in [true, false] {
        let e = LogEngine::with_layout(config(4 << 20), IndexLayout::Wide);
        let _other = fresh.then(|| tier::attach(&e, 96 << 20, 1, 4 << 20));
        e.restore_bytes(&file, NOW).expect("restore");
        let r = e.flash_restore();
        assert_eq!((r.pages, r.items), (0, 0), "fresh {fresh}: {r:?}");
        assert_eq!(r.pages_lost, saved.tier.pages_used, "fresh {fresh}: {r:?}");
        assert_eq!(e.stats().curr_items, in_memory, "fresh {fresh}");
        e.check_accounting().expect("accounting");
        let (hits, _) = compare_kept(&before, &contents(&e, n));
        assert_eq!(hits, in_memory, "fresh {fresh}");
    }
}

/// A flash page damaged while the server was down: its items are lost (the blocks' checks
/// refuse it), nothing wrong is read, and every other page's items come back.
#[test]
fn a_damaged_flash_page_loses_its_items_on_a_warm_restart() {
    use std::os::unix::fs::FileExt;
    let n = 20_000;
    let (e, dir) = engine(4 << 20, 96 << 20);
    let (file, before) = saved_with_flash(&e, n);
    let pages = e.flash_stats().expect("a tier").tier.pages_used;
    let seg = e.segment_size() as u64;
    drop(e);
    // Page 0 is written first (pages are handed out in order): flip a byte in its middle.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.0.join("flash"))
        .expect("open the flash file");
    let at = 4096 + seg / 2;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    f.write_all_at(&[b[0] ^ 0x5a], at).expect("write");
    f.sync_all().expect("sync");

    let e = LogEngine::with_layout(config(4 << 20), IndexLayout::Wide);
    e.attach_flash(dir.reopen(&e, 96 << 20, 1, 4 << 20))
        .expect("attach");
    e.restore_bytes(&file, NOW).expect("restore");
    let r = e.flash_restore();
    assert_eq!(r.pages_lost, 1, "{r:?}");
    assert_eq!(r.pages, pages - 1, "{r:?}");
    e.check_accounting().expect("accounting");
    let (_, lost) = compare_kept(&before, &contents(&e, n));
    assert!(lost > 0 && lost < n / 10, "{lost} items lost");
}

/// Pull from `master` into `replica` until it follows the tail with nothing left (at most
/// 10,000 pulls of `budget` bytes).
fn replicate(master: &LogEngine, replica: &LogEngine, st: &mut kvstore::ReplicaState) {
    for _ in 0..10_000 {
        let mut cursor = Vec::new();
        st.cursor(&mut cursor);
        let mut batch = Vec::new();
        let served = master.repl_serve(&cursor, false, false, 256 << 10, &mut batch);
        let applied = replica
            .repl_apply(st, &batch, NOW)
            .unwrap_or_else(|e| panic!("replica rejected a batch: {e}"));
        if applied.idle && !served.snapshot && served.lag_bytes == 0 {
            return;
        }
    }
    panic!("the replica did not catch up");
}

/// Every key of `0..n` reads the same on both engines (value, flags, expiry, CAS); the
/// keys the master holds.
fn same_items(master: &LogEngine, replica: &LogEngine, n: u64) -> u64 {
    let mut held = 0;
    for i in 0..n {
        let m = master.peek_item(&key(i), NOW);
        held += u64::from(m.is_some());
        assert_eq!(m, replica.peek_item(&key(i), NOW), "key {i}");
    }
    held
}

/// A replica's full sync ships the master's flash items too (read from flash, in the log's
/// order), and the master keeps sending cold items to flash while the replica follows:
/// what it drops from flash the replica drops too.
#[test]
fn a_replica_gets_flash_items_and_the_master_keeps_using_its_tier() {
    let n = 20_000;
    let (master, _dir) = engine(4 << 20, 32 << 20);
    for i in 0..n {
        assert!(matches!(
            set(&master, &key(i), &value(i, 1000)),
            StoreResult::Stored(_)
        ));
    }
    master.flash_settle();
    let on_flash = master.flash_stats().expect("a tier").objects_used;
    assert!(on_flash > n / 2, "{on_flash} on flash");

    // Room for every item the master holds, in memory.
    let replica = LogEngine::new(config(160 << 20));
    replica.set_replica(true);
    let mut st = kvstore::ReplicaState::new();
    replicate(&master, &replica, &mut st);
    assert_eq!(same_items(&master, &replica, n), n);
    assert_eq!(replica.stats().curr_items, n);

    // With the replica attached, cold items still go to flash, and pages are taken back.
    let written = master.flash_stats().expect("a tier").objects_written;
    let more = n..n + 60_000;
    for i in more.clone() {
        assert!(matches!(
            set(&master, &key(i), &value(i, 1000)),
            StoreResult::Stored(_)
        ));
        if i % 2000 == 0 {
            replicate(&master, &replica, &mut st);
        }
    }
    master.flash_settle();
    replicate(&master, &replica, &mut st);
    let s = master.flash_stats().expect("a tier");
    assert!(s.objects_written > written + 30_000, "{s:?}");
    assert!(s.pages_dropped > 0, "{s:?}");
    let held = same_items(&master, &replica, more.end);
    assert!(held > 20_000 && held < more.end, "{held} held");
    master.check_accounting().expect("master's accounting");
}

/// Pull batches of at most `budget` bytes for the replica named `name` until it has caught
/// up, or `most` batches were applied; whether it caught up.
fn pull(
    master: &LogEngine,
    replica: &LogEngine,
    st: &mut kvstore::ReplicaState,
    budget: usize,
    most: usize,
) -> bool {
    for _ in 0..most {
        let mut cursor = Vec::new();
        st.cursor(&mut cursor);
        let mut batch = Vec::new();
        let served = master.repl_serve_as(Some("r"), &cursor, false, false, budget, &mut batch);
        let applied = replica
            .repl_apply(st, &batch, NOW)
            .unwrap_or_else(|e| panic!("replica rejected a batch: {e}"));
        if applied.idle && !served.snapshot && served.lag_bytes == 0 {
            return true;
        }
    }
    false
}

/// Delete two thirds of the keys of `range` (the others kept); the pages holding them are
/// then worth compacting.
fn thin_out(e: &LogEngine, range: std::ops::Range<u64>) {
    for i in range.filter(|i| i % 3 != 0) {
        assert!(e.delete(&key(i), NOW), "key {i}");
    }
}

/// Write items from key `end` on until a page was compacted, settle the writes and check
/// the accounting: the tier's stats before and after.
fn until_compacted(e: &LogEngine, end: u64) -> (FlashStats, FlashStats) {
    let before = e.flash_stats().expect("a tier");
    write_until(
        e,
        end,
        |e| e.flash_stats().expect("a tier").pages_compacted > before.pages_compacted,
        || {},
    );
    e.flash_settle();
    e.check_accounting()
        .expect("accounting after the compaction");
    (before, e.flash_stats().expect("a tier"))
}

/// How many of `keys` read back with their values.
fn intact(e: &LogEngine, keys: &[u64]) -> usize {
    keys.iter()
        .filter(|&&k| get(e, &key(k)).map(|g| g.0) == Some(value(k, 1000)))
        .count()
}

/// Write items from key `from` on until `done` says so (at most 40 pages' worth),
/// settling flash writes and calling `every` each 50 items; the next key.
fn write_until(
    e: &LogEngine,
    from: u64,
    done: impl Fn(&LogEngine) -> bool,
    every: impl FnMut(),
) -> u64 {
    write_keys(
        e,
        from,
        (40 * per_segment(e), "never done"),
        50,
        done,
        every,
    )
}

/// While a replica is in a full sync (which lists flash pages by sequence number), flash
/// items do not move between pages: a full tier takes its emptiest page back instead of
/// compacting, and the replica ends up with exactly the master's items. Once the replica
/// follows the log, pages are compacted again.
#[test]
fn a_full_sync_under_way_holds_flash_compaction_back() {
    let (master, _dir, p, end, oldest) = full_tier();
    thin_out(&master, oldest + p / 2..oldest + 24 * p);

    // A full sync, a few batches in.
    let replica = LogEngine::new(config(160 << 20));
    replica.set_replica(true);
    let mut st = kvstore::ReplicaState::new();
    assert!(
        !pull(&master, &replica, &mut st, 64 << 10, 3),
        "in the snapshot still"
    );
    let before = master.flash_stats().expect("a tier");
    // The newest segments, still in memory, mostly dead (some of their items may be gone
    // already): they go to flash whole, not packed (packed records would move to another
    // segment id under the sync).
    let thin_newest = |end: u64| {
        for i in (end - 3 * p..end).filter(|i| i % 3 != 0) {
            master.delete(&key(i), NOW);
        }
    };
    thin_newest(end);
    // Segments in memory when it started go to flash, and pages are taken back whole.
    let end = write_until(
        &master,
        end,
        |m| m.flash_stats().expect("a tier").pages_dropped > before.pages_dropped,
        || {},
    );
    let s = master.flash_stats().expect("a tier");
    assert_eq!(s.pages_compacted, before.pages_compacted, "{s:?}");

    assert!(
        pull(&master, &replica, &mut st, 256 << 10, 10_000),
        "caught up"
    );
    assert_eq!(
        same_items(&master, &replica, end),
        master.stats().curr_items
    );

    // Following the log (pulled as it grows, so that segments it read may go to flash):
    // partly dead pages are compacted again (the oldest flash pages now: about as many
    // pages as were taken back went since the thinning).
    let oldest = master.flash_stats().expect("a tier").pages_dropped * p;
    thin_out(&master, oldest + 24 * p..oldest + 48 * p);
    // And mostly dead segments in memory go to flash packed, their records moving.
    thin_newest(end);
    let end = write_until(
        &master,
        end,
        |m| m.flash_stats().expect("a tier").pages_compacted > s.pages_compacted,
        || {
            pull(&master, &replica, &mut st, 256 << 10, 10_000);
        },
    );
    master.flash_settle();
    assert!(
        pull(&master, &replica, &mut st, 256 << 10, 10_000),
        "caught up"
    );
    assert_eq!(
        same_items(&master, &replica, end),
        master.stats().curr_items
    );
    master.check_accounting().expect("master's accounting");
}

/// A lower memory limit (what `-m auto` sets under memory pressure) sends segments to
/// flash instead of dropping their items: memory falls to the limit, every item is still
/// there, read back exactly.
#[test]
fn a_lower_memory_limit_moves_items_to_flash() {
    let (e, _dir) = engine(16 << 20, 64 << 20);
    let n = 10_000;
    for i in 0..n {
        assert!(matches!(
            set(&e, &key(i), &value(i, 1000)),
            StoreResult::Stored(_)
        ));
    }
    e.flash_settle();
    let before = contents(&e, n);
    let s = e.flash_stats().expect("a tier");
    assert!(s.objects_used < n / 10, "{s:?}");
    assert!(e.memory_bytes() > 8 << 20, "{}", e.memory_bytes());

    e.set_max_bytes(4 << 20, NOW);
    e.flash_settle();
    assert!(e.memory_bytes() <= 4 << 20, "{}", e.memory_bytes());
    let s = e.flash_stats().expect("a tier");
    assert!(s.objects_used > n / 2, "{s:?}");
    assert_eq!(e.stats().curr_items, n);
    assert_eq!(e.stats().evictions, 0);
    e.check_accounting().expect("accounting");
    assert_eq!(contents(&e, n), before);
}

/// `ext_drop_unread`: a compaction moves only the items read since they went to flash;
/// the unread live items of the pages it compacts are evicted with them (without it every
/// live item is kept: the test below).
#[test]
fn a_compaction_with_drop_unread_keeps_only_the_items_read_on_flash() {
    let (e, _dir, p, end, oldest) = full_tier();
    e.set_flash_drop_unread(true);
    let range = oldest + p / 2..oldest + 24 * p;
    thin_out(&e, range.clone());
    // Of the live items left, every second one read once while on flash.
    let read: Vec<u64> = range.clone().filter(|i| i % 6 == 0).collect();
    for &k in &read {
        assert_eq!(
            get(&e, &key(k)).map(|g| g.0),
            Some(value(k, 1000)),
            "key {k}"
        );
    }
    let unread: Vec<u64> = range.clone().filter(|i| i % 6 == 3).collect();
    let (before, s) = until_compacted(&e, end);
    assert_eq!(
        s.pages_dropped, before.pages_dropped,
        "a page taken back: {s:?}"
    );
    assert_eq!(intact(&e, &read), read.len(), "items read on flash lost");
    let gone = unread
        .iter()
        .filter(|&&k| get(&e, &key(k)).is_none())
        .count();
    assert!(
        gone > 0,
        "no unread item of a compacted page was dropped: {s:?}"
    );
}

/// `ext_max_frag`: pages at least that full are not compacted; a full tier whose oldest
/// pages are a third live (which it compacts by default: the test below) takes them back
/// whole under a limit of a tenth.
#[test]
fn pages_fuller_than_max_frag_are_taken_back_not_compacted() {
    let (e, _dir, p, end, oldest) = full_tier();
    e.set_flash_max_frag(100);
    thin_out(&e, oldest + p / 2..oldest + 24 * p);
    let before = e.flash_stats().expect("a tier");
    write_until(
        &e,
        end,
        |e| e.flash_stats().expect("a tier").pages_dropped > before.pages_dropped + 2,
        || {},
    );
    e.flash_settle();
    let s = e.flash_stats().expect("a tier");
    assert_eq!(s.pages_compacted, before.pages_compacted, "{s:?}");
    e.check_accounting().expect("accounting");
}

/// A full tier compacts its oldest pages once deletes left them partly dead: the live
/// records of several pages are written into one new page, so every live item on them is
/// kept, read or not (memcached's compaction), instead of being evicted with its page.
#[test]
fn a_full_tier_compacts_partly_dead_pages_and_keeps_their_items() {
    let (e, _dir, p, end, oldest) = full_tier();
    // The oldest pages left (half a page of margin): two thirds of their items deleted,
    // the rest never read. One write may ship several segments (as many as are in flight
    // before one of their writes finishes), each making room: enough such pages that
    // every reclaim finds two or more to compact, and none is taken back.
    let range = oldest + p / 2..oldest + 24 * p;
    thin_out(&e, range.clone());
    let kept: Vec<u64> = range.clone().filter(|i| i % 3 == 0).collect();
    let (before, s) = until_compacted(&e, end);
    assert!(s.rescues > before.rescues, "{s:?}");
    // The pages it compacted were among those: their unread live items are all there.
    assert_eq!(
        intact(&e, &kept),
        kept.len(),
        "live items of compacted pages evicted"
    );
    for k in range.filter(|i| i % 3 != 0) {
        assert_eq!(get(&e, &key(k)), None, "deleted key {k} came back");
    }
    e.check_accounting().expect("accounting after the reads");
}
