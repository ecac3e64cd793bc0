//! Property tests of `LogEngine` against the reference model (`kvstore::model::Model`):
//! random operation sequences must get the same replies. With little memory the engine
//! may have evicted an item the model still has, but an item it returns is never wrong
//! or stale.

use kvstore::model::Model;
use kvstore::{
    ArithResult, Engine, EngineConfig, IndexLayout, LogEngine, ReadOptions, StoreMode,
    StoreRequest, StoreResult, Time,
};
use proptest::prelude::*;

#[path = "support/threads.rs"]
mod threads;
use threads::Threads;
#[path = "support/casmap.rs"]
mod casmap;

#[path = "support/tier.rs"]
mod tier;
use casmap::CasMap;

const START: Time = 1_000_000;

#[derive(Debug, Clone, Copy)]
enum Exp {
    Never,
    Past,
    In(u32),
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    CasRight,
    CasWrong,
    CasZero,
}

#[derive(Debug, Clone)]
enum Op {
    Get {
        key: usize,
        touch: Option<Exp>,
    },
    Store {
        mode: Mode,
        key: usize,
        value: Vec<u8>,
        flags: u32,
        exp: Exp,
    },
    Delete {
        key: usize,
    },
    Arith {
        key: usize,
        incr: bool,
        delta: u64,
    },
    Touch {
        key: usize,
        exp: Exp,
    },
    FlushNow,
    FlushIn(u32),
    Advance(u32),
    Maintain,
}

impl Op {
    fn key(&self) -> Option<usize> {
        match *self {
            Op::Get { key, .. }
            | Op::Store { key, .. }
            | Op::Delete { key }
            | Op::Arith { key, .. }
            | Op::Touch { key, .. } => Some(key),
            _ => None,
        }
    }
}

fn exp() -> impl Strategy<Value = Exp> {
    prop_oneof![4 => Just(Exp::Never), 1 => Just(Exp::Past), 3 => (1u32..5).prop_map(Exp::In)]
}

/// Values: numbers and near-numbers (for incr/decr), short text, and sometimes long values
/// (multi-KiB: in the small engines these fill segments or take the large-item path).
fn value(big: usize) -> impl Strategy<Value = Vec<u8>> {
    let special: Vec<&'static [u8]> = vec![
        b"0",
        b"1",
        b"99",
        b"100",
        b" 12",
        b"12 ",
        b"-0",
        b"-1",
        b"abc",
        b"",
        b"18446744073709551615",
        b"5\0x",
    ];
    prop_oneof![
        3 => prop::sample::select(special).prop_map(|v| v.to_vec()),
        3 => prop::collection::vec(any::<u8>(), 0..64),
        1 => (0..big.max(1)).prop_map(|n| (0..n).map(|i| (i % 251) as u8).collect()),
    ]
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        5 => Just(Mode::Set),
        1 => Just(Mode::Add),
        1 => Just(Mode::Replace),
        2 => Just(Mode::Append),
        1 => Just(Mode::Prepend),
        1 => Just(Mode::CasRight),
        1 => Just(Mode::CasWrong),
        1 => Just(Mode::CasZero),
    ]
}

fn op(keys: usize, big: usize) -> impl Strategy<Value = Op> {
    let k = 0..keys;
    prop_oneof![
        6 => (k.clone(), prop::option::weighted(0.2, exp())).prop_map(|(key, touch)| Op::Get { key, touch }),
        8 => (mode(), k.clone(), value(big), prop_oneof![Just(0u32), any::<u32>()], exp())
            .prop_map(|(mode, key, value, flags, exp)| Op::Store { mode, key, value, flags, exp }),
        2 => k.clone().prop_map(|key| Op::Delete { key }),
        3 => (k.clone(), any::<bool>(), prop_oneof![0u64..12, Just(u64::MAX), any::<u64>()])
            .prop_map(|(key, incr, delta)| Op::Arith { key, incr, delta }),
        2 => (k, exp()).prop_map(|(key, exp)| Op::Touch { key, exp }),
        1 => Just(Op::FlushNow),
        1 => (1u32..4).prop_map(Op::FlushIn),
        3 => (0u32..3).prop_map(Op::Advance),
        1 => Just(Op::Maintain),
    ]
}

fn key_name(k: usize) -> Vec<u8> {
    format!("key:{k}").into_bytes()
}

fn abs(e: Exp, now: Time) -> Time {
    match e {
        Exp::Never => 0,
        Exp::Past => now - 1,
        Exp::In(d) => now + d,
    }
}

type Got = Option<(Vec<u8>, u32, Time, u64)>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Get(bool, Got),
    Store(StoreResult),
    Bool(bool),
    Arith(ArithResult),
    Count(u64),
    None,
}

impl Reply {
    /// This reply with its CAS unique set to 0, and that unique (see `support/casmap.rs`).
    fn without_cas(mut self) -> (Reply, Vec<u64>) {
        let mut out = Vec::new();
        match &mut self {
            Reply::Get(_, Some(g)) => out.push(std::mem::take(&mut g.3)),
            Reply::Store(StoreResult::Stored(c)) => out.push(std::mem::take(c)),
            _ => {}
        }
        (self, out)
    }
}

/// Whether the engine's reply `got` is the model's `want`, CAS uniques paired through
/// `cas` (which keeps the pairs only if it is).
fn same(cas: &mut CasMap, got: &Reply, want: &Reply) -> bool {
    let (got, gc) = got.clone().without_cas();
    let (want, wc) = want.clone().without_cas();
    let mut tried = cas.clone();
    let ok = got == want && tried.pair_all(&gc, &wc);
    if ok {
        *cas = tried;
    }
    ok
}

/// The engine's own CAS unique of `op`'s key (what a "right" cas sends it), or 0.
fn engine_cas(e: &LogEngine, op: &Op, now: Time) -> u64 {
    op.key()
        .and_then(|k| e.peek_item(&key_name(k), now))
        .map_or(0, |it| it.3)
}

fn apply(e: &dyn Engine, op: &Op, now: Time, cas_right: u64) -> Reply {
    match op {
        Op::Get { key, touch } => {
            let k = key_name(*key);
            let mut got = None;
            let opts = ReadOptions {
                touch: touch.map(|t| abs(t, now)),
            };
            let hit = e.get(&k, now, opts, &mut |v| {
                assert_eq!(v.key, &k[..]);
                got = Some((v.value.to_vec(), v.flags, v.exptime, v.cas));
            });
            Reply::Get(hit, got)
        }
        Op::Store {
            mode,
            key,
            value,
            flags,
            exp,
        } => {
            let mode = match mode {
                Mode::Set => StoreMode::Set,
                Mode::Add => StoreMode::Add,
                Mode::Replace => StoreMode::Replace,
                Mode::Append => StoreMode::Append,
                Mode::Prepend => StoreMode::Prepend,
                Mode::CasRight => StoreMode::Cas(cas_right),
                Mode::CasWrong => StoreMode::Cas(cas_right.wrapping_add(1)),
                Mode::CasZero => StoreMode::Cas(0),
            };
            let k = key_name(*key);
            let req = StoreRequest {
                mode,
                key: &k,
                value,
                flags: *flags,
                exptime: abs(*exp, now),
            };
            Reply::Store(e.store(req, now))
        }
        Op::Delete { key } => Reply::Bool(e.delete(&key_name(*key), now)),
        Op::Arith { key, incr, delta } => {
            Reply::Arith(e.arith(&key_name(*key), *incr, *delta, now))
        }
        Op::Touch { key, exp } => Reply::Bool(e.touch(&key_name(*key), abs(*exp, now), now)),
        Op::FlushNow => {
            e.flush_all(now, now);
            Reply::None
        }
        Op::FlushIn(d) => {
            e.flush_all(now + d, now);
            Reply::None
        }
        Op::Advance(_) => Reply::None,
        Op::Maintain => Reply::Count(e.maintain(now, true)),
    }
}

/// Each property runs on both index layouts.
fn layout(wide: bool) -> IndexLayout {
    if wide {
        IndexLayout::Wide
    } else {
        IndexLayout::Compact
    }
}

/// Plenty of memory: every reply and the counters both keep must agree.
fn run_exact(ops: &[Op], use_cas: bool, layout: IndexLayout) -> Result<(), TestCaseError> {
    run_exact_on(ops, use_cas, 1, layout)
}

/// [`run_exact`] with the engine's operations on `threads` threads in turn. Their CAS
/// uniques come from ranges of their own and differ from the model's single counter, so
/// with more than one thread CAS must be off (replies then show 0); what is compared is
/// that versions still order stores, deletes and flushes.
fn run_exact_on(
    ops: &[Op],
    use_cas: bool,
    threads: usize,
    layout: IndexLayout,
) -> Result<(), TestCaseError> {
    assert!(threads == 1 || !use_cas);
    let cfg = EngineConfig {
        max_bytes: 4 << 20,
        max_item_size: 4 << 20,
        no_evict: false,
        use_cas,
    };
    let e = LogEngine::with_layout(cfg.clone(), layout);
    e.tally_sizes(&BANDS, true);
    let m = Model::new(cfg);
    let mut now = START;
    let mut cas = CasMap::default();
    std::thread::scope(|s| {
        let workers = Threads::start(s, threads);
        for (n, op) in ops.iter().enumerate() {
            if let Op::Advance(d) = op {
                now += d;
            }
            let right = op.key().map_or(0, |k| m.cas_of(&key_name(k)));
            let want = apply(&m, op, now, right);
            let right_e = engine_cas(&e, op, now);
            let e = &e;
            let got = workers.run(n, move || apply(e, op, now, right_e));
            prop_assert!(
                same(&mut cas, &got, &want),
                "op #{} {:?} at {}: {:?} where the model has {:?}",
                n,
                op,
                now,
                got,
                want
            );
        }
        Ok(())
    })?;
    let (es, ms) = (e.stats(), m.stats());
    prop_assert_eq!(
        (
            es.curr_items,
            es.total_items,
            es.get_expired,
            es.get_flushed,
            es.expired_unfetched
        ),
        (
            ms.curr_items,
            ms.total_items,
            ms.get_expired,
            ms.get_flushed,
            ms.expired_unfetched
        )
    );
    prop_assert_eq!(es.evictions, 0);
    e.check_accounting()
        .map_err(|err| TestCaseError::fail(err.to_string()))?;
    check_tally(&e)?;
    Ok(())
}

/// memcached's default slab class sizes up to 6000 bytes, and one for all larger items.
const BANDS: [u32; 19] = [
    96, 120, 152, 192, 240, 304, 384, 480, 600, 752, 944, 1184, 1480, 1856, 2320, 2904, 3632, 4544,
    524_288,
];

/// The size tally agrees with the engine's own counters.
fn check_tally(e: &LogEngine) -> Result<(), TestCaseError> {
    let s = e.stats();
    let bands = e.size_bands();
    prop_assert_eq!(bands.iter().map(|b| b.items).sum::<u64>(), s.curr_items);
    prop_assert_eq!(bands.iter().map(|b| b.evicted).sum::<u64>(), s.evictions);
    let steps = e.size_steps().unwrap_or_default();
    prop_assert_eq!(steps.iter().map(|(_, n)| n).sum::<u64>(), s.curr_items);
    Ok(())
}

/// The model after `op` if the op's key had been evicted just before it, when that
/// explains the engine's reply `got`.
fn evicted_during(
    before: &Model,
    op: &Op,
    now: Time,
    right: u64,
    got: &Reply,
    cas: &mut CasMap,
) -> Option<Model> {
    let k = op.key()?;
    let alt = before.clone();
    alt.forget(&key_name(k));
    same(cas, got, &apply(&alt, op, now, right)).then_some(alt)
}

fn mem_failure(got: &Reply) -> bool {
    matches!(
        got,
        Reply::Store(StoreResult::NoMemory)
            | Reply::Arith(ArithResult::NoMemory)
            | Reply::Bool(false)
            | Reply::Get(false, None)
    )
}

/// Little memory: before each keyed op, an item the engine would return must equal the
/// model's; an item the engine no longer has is dropped from the model too, after which
/// every reply must agree. With `no_evict`, a write may fail for memory instead.
fn run_small(
    ops: &[Op],
    max_bytes: usize,
    no_evict: bool,
    layout: IndexLayout,
) -> Result<(), TestCaseError> {
    run_small_with(ops, max_bytes, no_evict, layout, None)
}

/// [`run_small`], with a flash tier of `flash` pages if given.
fn run_small_with(
    ops: &[Op],
    max_bytes: usize,
    no_evict: bool,
    layout: IndexLayout,
    flash: Option<u64>,
) -> Result<(), TestCaseError> {
    let cfg = EngineConfig {
        max_bytes,
        max_item_size: 6000,
        no_evict,
        use_cas: true,
    };
    let e = LogEngine::with_layout(cfg.clone(), layout);
    // A tier of a few pages, so that they are taken back too.
    let page = e.segment_size() as u64 + 4096;
    let _dir = flash.map(|pages| tier::attach(&e, (pages + 1) * page, 1, 1 << 20));

    e.tally_sizes(&BANDS, true);
    let mut m = Model::new(EngineConfig {
        max_bytes: 1 << 30,
        ..cfg
    });
    let mut now = START;
    let mut cas = CasMap::default();
    for (n, op) in ops.iter().enumerate() {
        if let Op::Advance(d) = op {
            now += d;
        }
        let right = match op.key() {
            Some(k) => {
                let k = key_name(k);
                match e.peek_item(&k, now) {
                    // Evicted (a dead record still in the index is not: a later delayed
                    // flush can make it visible again, in memcached and the model too).
                    None if !e.holds_record(&k) => m.forget(&k),
                    None => {}
                    Some(got) => {
                        let mi = m.peek(&k);
                        prop_assert!(mi.is_some(), "op #{}: engine has {:?}, model not", n, k);
                        let mi = mi.unwrap_or_else(|| unreachable!());
                        prop_assert_eq!(
                            (&got.0, got.1, got.2),
                            (&mi.value, mi.flags, mi.exptime),
                            "op #{} key {:?}",
                            n,
                            k
                        );
                        prop_assert!(
                            cas.pair(got.3, mi.version),
                            "op #{} key {:?}: CAS {} where the model has {}",
                            n,
                            k,
                            got.3,
                            mi.version
                        );
                    }
                }
                m.cas_of(&k)
            }
            None => 0,
        };
        let before = m.clone();
        let want = apply(&m, op, now, right);
        let got = apply(&e, op, now, engine_cas(&e, op, now));

        if same(&mut cas, &got, &want) || matches!(op, Op::Maintain) {
            // (Maintain counts are not comparable here: the model counts items the engine
            // evicted, the engine dead items the harness made the model forget.)
        } else if let Some(alt) = op
            .key()
            .filter(|&k| !e.holds_record(&key_name(k)))
            .and_then(|_| evicted_during(&before, op, now, right, &got, &mut cas))
        {
            // Making room for this write evicted the key itself first (memcached's
            // allocation can do the same): as if it had been evicted just before.
            m = alt;
        } else if no_evict && mem_failure(&got) {
            // No memory (memcached allocates before it checks the mode's condition):
            // nothing is written, and a refused set drops the old item.
            m = before;
            if let Op::Store {
                mode: Mode::Set,
                key,
                ..
            } = op
            {
                m.forget(&key_name(*key));
            }
        } else {
            prop_assert!(
                false,
                "op #{} {:?} at {}: {:?} where the model has {:?}",
                n,
                op,
                now,
                got,
                want
            );
        }
        e.check_accounting()
            .map_err(|s| TestCaseError::fail(format!("op #{n}: {s}")))?;
        check_tally(&e)?;
        prop_assert!(
            e.memory_bytes() <= max_bytes,
            "op #{}: {} > {}",
            n,
            e.memory_bytes(),
            max_bytes
        );
    }
    Ok(())
}

proptest! {
    // LOG_PROPTEST_CASES=5000 cargo test --release ... for a longer search.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("LOG_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(200),
        ..ProptestConfig::default()
    })]

    #[test]
    fn log_agrees_with_model(ops in prop::collection::vec(op(4, 3000), 1..150), use_cas in any::<bool>(), wide in any::<bool>()) {
        run_exact(&ops, use_cas, layout(wide))?;
    }

    /// The same with the operations on two or three threads in turn (each with its own
    /// range of CAS uniques): a store after a flush or a delete made on another thread
    /// still counts.
    #[test]
    fn log_agrees_with_model_on_several_threads(ops in prop::collection::vec(op(4, 3000), 1..150), threads in 2usize..4, wide in any::<bool>()) {
        run_exact_on(&ops, false, threads, layout(wide))?;
    }

    #[test]
    fn log_agrees_with_model_under_eviction(
        ops in prop::collection::vec(op(24, 9000), 1..300),
        kib in prop::sample::select(vec![24usize, 32, 64]),
        wide in any::<bool>(),
    ) {
        run_small(&ops, kib << 10, false, layout(wide))?;
    }

    #[test]
    fn log_agrees_with_model_without_eviction(
        ops in prop::collection::vec(op(24, 9000), 1..300),
        kib in prop::sample::select(vec![24usize, 32]),
        wide in any::<bool>(),
    ) {
        run_small(&ops, kib << 10, true, layout(wide))?;
    }

    /// With a flash tier (a few pages, so that they are taken back too): items eviction
    /// sends to flash come back as they were, and every command agrees with the model.
    #[test]
    fn log_agrees_with_model_with_a_flash_tier(
        ops in prop::collection::vec(op(24, 9000), 1..300),
        kib in prop::sample::select(vec![24usize, 32, 64]),
        pages in 2u64..12,
    ) {
        run_small_with(&ops, kib << 10, false, IndexLayout::Wide, Some(pages))?;
    }
}

/// The small settings above really evict (and copy items forward).
#[test]
fn log_small_engine_evicts() {
    let e = LogEngine::new(EngineConfig {
        max_bytes: 32 << 10,
        max_item_size: 6000,
        no_evict: false,
        use_cas: true,
    });
    let mut now = START;
    for i in 0..3000u32 {
        let k = format!("key:{}", i % 200);
        let v = vec![i as u8; (i as usize * 7) % 700];
        assert!(matches!(
            e.store(
                StoreRequest {
                    mode: StoreMode::Set,
                    key: k.as_bytes(),
                    value: &v,
                    flags: 0,
                    exptime: 0
                },
                now
            ),
            StoreResult::Stored(_)
        ));
        e.get(b"key:0", now, ReadOptions::default(), &mut |_| {});
        if i % 100 == 0 {
            now += 1;
        }
        e.check_accounting().unwrap();
    }
    assert!(e.stats().evictions > 0);
    let items: std::collections::HashMap<_, _> = e.stats_detail("items").into_iter().collect();
    assert_ne!(items["items:1:copied_forward"], "0");
}
