//! Property tests of `LogEngine` against the reference model (`kvstore::model::Model`):
//! random operation sequences must get the same replies. With little memory the engine
//! may have evicted an item the model still has, but an item it returns is never wrong
//! or stale.

use kvstore::model::Model;
use kvstore::{
    ArithResult, Engine, EngineConfig, LogEngine, ReadOptions, StoreMode, StoreRequest,
    StoreResult, Time,
};
use proptest::prelude::*;

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

#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Get(bool, Got),
    Store(StoreResult),
    Bool(bool),
    Arith(ArithResult),
    Count(u64),
    None,
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
        Op::Maintain => Reply::Count(e.maintain(now)),
    }
}

/// Plenty of memory: every reply and the counters both keep must agree.
fn run_exact(ops: &[Op], use_cas: bool) -> Result<(), TestCaseError> {
    let cfg = EngineConfig {
        max_bytes: 4 << 20,
        max_item_size: 4 << 20,
        no_evict: false,
        use_cas,
    };
    let e = LogEngine::new(cfg.clone());
    let m = Model::new(cfg);
    let mut now = START;
    for (n, op) in ops.iter().enumerate() {
        if let Op::Advance(d) = op {
            now += d;
        }
        let right = op.key().map_or(0, |k| m.cas_of(&key_name(k)));
        let want = apply(&m, op, now, right);
        let got = apply(&e, op, now, right);
        prop_assert_eq!(got, want, "op #{} {:?} at {}", n, op, now);
    }
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
    e.check_accounting().map_err(TestCaseError::fail)?;
    Ok(())
}

/// The model after `op` if the op's key had been evicted just before it, when that
/// explains the engine's reply `got`.
fn evicted_during(before: &Model, op: &Op, now: Time, right: u64, got: &Reply) -> Option<Model> {
    let k = op.key()?;
    let alt = before.clone();
    alt.forget(&key_name(k));
    (apply(&alt, op, now, right) == *got).then_some(alt)
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
fn run_small(ops: &[Op], max_bytes: usize, no_evict: bool) -> Result<(), TestCaseError> {
    let cfg = EngineConfig {
        max_bytes,
        max_item_size: 6000,
        no_evict,
        use_cas: true,
    };
    let e = LogEngine::new(cfg.clone());
    let mut m = Model::new(EngineConfig {
        max_bytes: 1 << 30,
        ..cfg
    });
    let mut now = START;
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
                            got,
                            (mi.value, mi.flags, mi.exptime, mi.version),
                            "op #{} key {:?}",
                            n,
                            k
                        );
                    }
                }
                m.cas_of(&k)
            }
            None => 0,
        };
        let before = m.clone();
        let want = apply(&m, op, now, right);
        let got = apply(&e, op, now, right);
        if got == want || matches!(op, Op::Maintain) {
            // (Maintain counts are not comparable here: the model counts items the engine
            // evicted, the engine dead items the harness made the model forget.)
        } else if let Some(alt) = op
            .key()
            .filter(|&k| !e.holds_record(&key_name(k)))
            .and_then(|_| evicted_during(&before, op, now, right, &got))
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
            prop_assert_eq!(got, want, "op #{} {:?} at {}", n, op, now);
        }
        e.check_accounting()
            .map_err(|s| TestCaseError::fail(format!("op #{n}: {s}")))?;
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
    fn log_agrees_with_model(ops in prop::collection::vec(op(4, 3000), 1..150), use_cas in any::<bool>()) {
        run_exact(&ops, use_cas)?;
    }

    #[test]
    fn log_agrees_with_model_under_eviction(
        ops in prop::collection::vec(op(24, 9000), 1..300),
        kib in prop::sample::select(vec![24usize, 32, 64]),
    ) {
        run_small(&ops, kib << 10, false)?;
    }

    #[test]
    fn log_agrees_with_model_without_eviction(
        ops in prop::collection::vec(op(24, 9000), 1..300),
        kib in prop::sample::select(vec![24usize, 32]),
    ) {
        run_small(&ops, kib << 10, true)?;
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

/// The meta operations (`mg`/`ms`/`md`/`ma`/`me`) mixed with the classic ones, against the
/// model: the same operation generator and harness as `tests/model.rs` (which checks
/// `HashMapEngine`), run on `LogEngine` with plenty of memory.
mod meta {
    use kvstore::model::Model;
    use kvstore::{
        ArithResult, DebugItem, Engine, EngineConfig, LogEngine, MetaArith, MetaArithResult,
        MetaDelete, MetaDeleteResult, MetaGet, MetaRead, MetaStoreRequest, MetaStored, ReadOptions,
        StoreMode, StoreRequest, StoreResult, Time, Win,
    };
    use proptest::prelude::*;

    use super::START;

    /// An expiry relative to the current clock.
    #[derive(Debug, Clone, Copy)]
    enum Exp {
        Never,
        Past,
        In(u32),
    }

    #[derive(Debug, Clone, Copy)]
    enum CasPick {
        Right,
        Wrong,
        Zero,
        /// One below the right one (an older writer, for `ms ... I`).
        Lower,
    }

    impl CasPick {
        fn pick(self, right: u64) -> u64 {
            match self {
                CasPick::Right => right,
                CasPick::Wrong => right.wrapping_add(1),
                CasPick::Zero => 0,
                CasPick::Lower => right.saturating_sub(1),
            }
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Mode {
        Set,
        Add,
        Replace,
        Append,
        Prepend,
        Cas(CasPick),
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
        MetaGet {
            key: usize,
            touch: Option<Exp>,
            no_bump: bool,
            vivify: Option<Exp>,
            recache: Option<Exp>,
            recache_after_touch: bool,
            new_cas: Option<u64>,
            binary_key: bool,
        },
        MetaStore {
            mode: Mode,
            key: usize,
            value: Vec<u8>,
            flags: u32,
            exp: Exp,
            compare: Option<CasPick>,
            new_cas: Option<u64>,
            invalidate: bool,
            vivify: bool,
            binary_key: bool,
        },
        MetaDelete {
            key: usize,
            compare: Option<CasPick>,
            new_cas: Option<u64>,
            invalidate: bool,
            remove_value: bool,
            ttl: Option<Exp>,
            flags: u32,
        },
        MetaArith {
            key: usize,
            incr: bool,
            delta: u64,
            compare: Option<CasPick>,
            new_cas: Option<u64>,
            vivify: Option<(Exp, u64)>,
            touch: Option<Exp>,
        },
        Debug {
            key: usize,
        },
    }

    impl Op {
        fn key(&self) -> Option<usize> {
            match *self {
                Op::Get { key, .. }
                | Op::Store { key, .. }
                | Op::Delete { key }
                | Op::Arith { key, .. }
                | Op::Touch { key, .. }
                | Op::MetaGet { key, .. }
                | Op::MetaStore { key, .. }
                | Op::MetaDelete { key, .. }
                | Op::MetaArith { key, .. }
                | Op::Debug { key } => Some(key),
                _ => None,
            }
        }
    }

    fn exp() -> impl Strategy<Value = Exp> {
        prop_oneof![
            4 => Just(Exp::Never),
            1 => Just(Exp::Past),
            3 => (1u32..5).prop_map(Exp::In),
        ]
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        let special: Vec<&'static [u8]> = vec![
            b"0",
            b"1",
            b"9",
            b"10",
            b"99",
            b"100",
            b" 12",
            b"12 ",
            b"+5",
            b"-0",
            b"-1",
            b"007",
            b"abc",
            b"12abc",
            b"",
            b" ",
            b"18446744073709551615",
            b"18446744073709551616",
            b"9223372036854775808",
            b"5\0x",
        ];
        prop_oneof![
            3 => prop::sample::select(special).prop_map(|v| v.to_vec()),
            2 => prop::collection::vec(prop::sample::select(b"ab 1\r\n".to_vec()), 0..8),
            1 => prop::collection::vec(any::<u8>(), 20..40),
        ]
    }

    fn mode() -> impl Strategy<Value = Mode> {
        prop_oneof![
            4 => Just(Mode::Set),
            1 => Just(Mode::Add),
            1 => Just(Mode::Replace),
            2 => Just(Mode::Append),
            1 => Just(Mode::Prepend),
            1 => Just(Mode::Cas(CasPick::Right)),
            1 => Just(Mode::Cas(CasPick::Wrong)),
            1 => Just(Mode::Cas(CasPick::Zero)),
        ]
    }

    fn cas_pick() -> impl Strategy<Value = CasPick> {
        prop_oneof![
            Just(CasPick::Right),
            Just(CasPick::Wrong),
            Just(CasPick::Zero),
            Just(CasPick::Lower),
        ]
    }

    fn new_cas() -> impl Strategy<Value = Option<u64>> {
        prop::option::weighted(0.25, prop_oneof![Just(1u64), Just(7), Just(1 << 40)])
    }

    /// The classic operations and the meta ones.
    fn meta_op(keys: usize) -> impl Strategy<Value = Op> {
        let k = 0..keys;
        let ms_mode = prop_oneof![
            3 => Just(Mode::Set),
            1 => Just(Mode::Add),
            1 => Just(Mode::Replace),
            2 => Just(Mode::Append),
            1 => Just(Mode::Prepend),
            3 => cas_pick().prop_map(Mode::Cas),
        ];
        prop_oneof![
            6 => op(keys),
            4 => (
                k.clone(),
                prop::option::weighted(0.3, exp()),
                any::<bool>(),
                prop::option::weighted(0.4, exp()),
                prop::option::weighted(0.3, exp()),
                any::<bool>(),
                new_cas(),
                any::<bool>(),
            )
                .prop_map(
                    |(key, touch, no_bump, vivify, recache, recache_after_touch, new_cas, binary_key)| {
                        Op::MetaGet {
                            key,
                            touch,
                            no_bump,
                            vivify,
                            recache,
                            recache_after_touch,
                            new_cas,
                            binary_key,
                        }
                    }
                ),
            4 => (
                (ms_mode, k.clone(), value(), prop_oneof![Just(0u32), Just(7)], exp()),
                (
                    prop::option::weighted(0.4, cas_pick()),
                    new_cas(),
                    any::<bool>(),
                    any::<bool>(),
                    any::<bool>(),
                ),
            )
                .prop_map(
                    |((mode, key, value, flags, exp), (compare, new_cas, invalidate, vivify, binary_key))| {
                        Op::MetaStore {
                            mode,
                            key,
                            value,
                            flags,
                            exp,
                            compare,
                            new_cas,
                            invalidate,
                            vivify,
                            binary_key,
                        }
                    }
                ),
            3 => (
                k.clone(),
                prop::option::weighted(0.3, cas_pick()),
                new_cas(),
                any::<bool>(),
                prop::bool::weighted(0.3),
                prop::option::weighted(0.4, exp()),
                prop_oneof![Just(0u32), Just(9)],
            )
                .prop_map(
                    |(key, compare, new_cas, invalidate, remove_value, ttl, flags)| Op::MetaDelete {
                        key,
                        compare,
                        new_cas,
                        invalidate,
                        remove_value,
                        ttl,
                        flags,
                    }
                ),
            3 => (
                k.clone(),
                any::<bool>(),
                prop_oneof![0u64..12, Just(u64::MAX)],
                prop::option::weighted(0.3, cas_pick()),
                new_cas(),
                prop::option::weighted(0.4, (exp(), prop_oneof![Just(0u64), Just(42), Just(u64::MAX)])),
                prop::option::weighted(0.3, exp()),
            )
                .prop_map(|(key, incr, delta, compare, new_cas, vivify, touch)| Op::MetaArith {
                    key,
                    incr,
                    delta,
                    compare,
                    new_cas,
                    vivify,
                    touch,
                }),
            1 => k.prop_map(|key| Op::Debug { key }),
        ]
    }

    fn op(keys: usize) -> impl Strategy<Value = Op> {
        let k = 0..keys;
        prop_oneof![
            6 => (k.clone(), prop::option::weighted(0.2, exp()))
                .prop_map(|(key, touch)| Op::Get { key, touch }),
            8 => (mode(), k.clone(), value(), prop_oneof![Just(0u32), Just(7), any::<u32>()], exp())
                .prop_map(|(mode, key, value, flags, exp)| Op::Store { mode, key, value, flags, exp }),
            2 => k.clone().prop_map(|key| Op::Delete { key }),
            4 => (
                k.clone(),
                any::<bool>(),
                prop_oneof![0u64..12, Just(u64::MAX), Just(u64::MAX - 1), any::<u64>()]
            )
                .prop_map(|(key, incr, delta)| Op::Arith { key, incr, delta }),
            2 => (k, exp()).prop_map(|(key, exp)| Op::Touch { key, exp }),
            1 => Just(Op::FlushNow),
            1 => (1u32..4).prop_map(Op::FlushIn),
            3 => (0u32..3).prop_map(Op::Advance),
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

    /// What a meta read saw: the item, its expiry/access/fetched state before the read, the
    /// stale mark, the win, the binary-key mark.
    type MetaSeen = (Got, Time, Time, bool, bool, Win, bool);

    #[derive(Debug, PartialEq, Eq)]
    enum Reply {
        Get(bool, Got),
        Store(StoreResult),
        Bool(bool),
        Arith(ArithResult),
        MetaGet(MetaGet, Option<MetaSeen>),
        MetaStore(MetaStored),
        MetaDelete(MetaDeleteResult),
        MetaArith(MetaArithResult),
        Debug(Option<DebugItem>),
        None,
    }

    /// Apply `op` to `e` at time `now`; `cas_right` is the unique a "right" cas uses.
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
                let k = key_name(*key);
                let mode = store_mode(*mode, cas_right);
                Reply::Store(e.store(
                    StoreRequest {
                        mode,
                        key: &k,
                        value,
                        flags: *flags,
                        exptime: abs(*exp, now),
                    },
                    now,
                ))
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
            Op::MetaGet {
                key,
                touch,
                no_bump,
                vivify,
                recache,
                recache_after_touch,
                new_cas,
                binary_key,
            } => {
                let k = key_name(*key);
                let opts = MetaRead {
                    touch: touch.map(|t| abs(t, now)),
                    no_bump: *no_bump,
                    vivify: vivify.map(|t| abs(t, now)),
                    recache: recache.map(|t| abs(t, now)),
                    recache_after_touch: *recache_after_touch,
                    new_cas: *new_cas,
                    binary_key: *binary_key,
                };
                let mut seen = None;
                let r = e.meta_get(&k, now, opts, &mut |mi| {
                    assert_eq!(mi.item.key, &k[..]);
                    let it = mi.item;
                    let got = Some((it.value.to_vec(), it.flags, it.exptime, it.cas));
                    seen = Some((
                        got,
                        mi.exptime_before,
                        mi.last_access,
                        mi.fetched,
                        mi.stale,
                        mi.win,
                        mi.binary_key,
                    ));
                });
                Reply::MetaGet(r, seen)
            }
            Op::MetaStore {
                mode,
                key,
                value,
                flags,
                exp,
                compare,
                new_cas,
                invalidate,
                vivify,
                binary_key,
            } => {
                let k = key_name(*key);
                Reply::MetaStore(e.meta_store(
                    MetaStoreRequest {
                        mode: store_mode(*mode, cas_right),
                        key: &k,
                        value,
                        flags: *flags,
                        exptime: abs(*exp, now),
                        compare_cas: compare.map(|c| c.pick(cas_right)),
                        new_cas: *new_cas,
                        invalidate: *invalidate,
                        vivify: *vivify,
                        binary_key: *binary_key,
                    },
                    now,
                ))
            }
            Op::MetaDelete {
                key,
                compare,
                new_cas,
                invalidate,
                remove_value,
                ttl,
                flags,
            } => {
                let req = MetaDelete {
                    compare_cas: compare.map(|c| c.pick(cas_right)),
                    new_cas: *new_cas,
                    invalidate: *invalidate,
                    remove_value: *remove_value,
                    ttl: ttl.map(|t| abs(t, now)),
                    flags: *flags,
                };
                Reply::MetaDelete(e.meta_delete(&key_name(*key), now, req))
            }
            Op::MetaArith {
                key,
                incr,
                delta,
                compare,
                new_cas,
                vivify,
                touch,
            } => {
                let req = MetaArith {
                    incr: *incr,
                    delta: *delta,
                    compare_cas: compare.map(|c| c.pick(cas_right)),
                    new_cas: *new_cas,
                    vivify: vivify.map(|(t, j)| (abs(t, now), j)),
                    touch: touch.map(|t| abs(t, now)),
                    binary_key: false,
                };
                Reply::MetaArith(e.meta_arith(&key_name(*key), now, req))
            }
            Op::Debug { key } => Reply::Debug(e.debug_item(&key_name(*key), now)),
        }
    }

    fn store_mode(mode: Mode, cas_right: u64) -> StoreMode {
        match mode {
            Mode::Set => StoreMode::Set,
            Mode::Add => StoreMode::Add,
            Mode::Replace => StoreMode::Replace,
            Mode::Append => StoreMode::Append,
            Mode::Prepend => StoreMode::Prepend,
            Mode::Cas(c) => StoreMode::Cas(c.pick(cas_right)),
        }
    }

    fn config(max_bytes: usize, no_evict: bool, use_cas: bool) -> EngineConfig {
        EngineConfig {
            max_bytes,
            // Values of about 50 bytes fit (less with flags or CAS): appends hit the limit.
            max_item_size: 120,
            no_evict,
            use_cas,
        }
    }

    /// Every reply must agree, and the counters both keep (`bytes` aside: the engine
    /// charges its records, the model key and value).
    fn run_exact(ops: &[Op], use_cas: bool) -> Result<(), TestCaseError> {
        let cfg = EngineConfig {
            max_bytes: 4 << 20,
            ..config(0, false, use_cas)
        };
        let e = LogEngine::new(cfg.clone());
        let m = Model::new(cfg);
        let mut now = START;
        for (n, op) in ops.iter().enumerate() {
            if let Op::Advance(d) = op {
                now += d;
            }
            let right = op.key().map_or(0, |k| m.cas_of(&key_name(k)));
            let want = apply(&m, op, now, right);
            let got = apply(&e, op, now, right);
            prop_assert_eq!(got, want, "op #{} {:?} at {}", n, op, now);
        }
        let (es, ms) = (e.stats(), m.stats());
        prop_assert_eq!(
            (
                es.curr_items,
                es.total_items,
                es.get_expired,
                es.get_flushed
            ),
            (
                ms.curr_items,
                ms.total_items,
                ms.get_expired,
                ms.get_flushed
            )
        );
        prop_assert_eq!(es.evictions, 0);
        e.check_accounting().map_err(TestCaseError::fail)?;
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("LOG_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(256),
            ..ProptestConfig::default()
        })]

        /// The meta operations (stale marks, win tokens, vivify, explicit CAS, ...) mixed
        /// with the classic ones.
        #[test]
        fn log_meta_agrees_with_model(
            ops in prop::collection::vec(meta_op(4), 1..120),
            use_cas in any::<bool>(),
        ) {
            run_exact(&ops, use_cas)?;
        }
    }
}
