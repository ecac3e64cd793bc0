//! Random operations on an engine and on the reference model, shared by the property tests
//! of every engine (`tests/model.rs`, `tests/log_model.rs`): the operations (classic and
//! meta), their proptest strategies, and `apply`, which runs one on anything that implements
//! `Engine` and returns a comparable reply.
#![allow(dead_code)]

use kvstore::{
    ArithResult, DebugItem, Engine, EngineConfig, MetaArith, MetaArithResult, MetaDelete,
    MetaDeleteResult, MetaGet, MetaRead, MetaStoreRequest, MetaStored, ReadOptions, StoreMode,
    StoreRequest, StoreResult, Time, Win,
};
use proptest::prelude::*;

pub(crate) const START: Time = 1_000_000;

/// An expiry relative to the current clock.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Exp {
    Never,
    Past,
    In(u32),
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum CasPick {
    Right,
    Wrong,
    Zero,
    /// One below the right one (an older writer, for `ms ... I`).
    Lower,
}

impl CasPick {
    pub(crate) fn pick(self, right: u64) -> u64 {
        match self {
            CasPick::Right => right,
            CasPick::Wrong => right.wrapping_add(1),
            CasPick::Zero => 0,
            CasPick::Lower => right.saturating_sub(1),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas(CasPick),
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
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
    pub(crate) fn key(&self) -> Option<usize> {
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

pub(crate) fn exp() -> impl Strategy<Value = Exp> {
    prop_oneof![
        4 => Just(Exp::Never),
        1 => Just(Exp::Past),
        3 => (1u32..5).prop_map(Exp::In),
    ]
}

pub(crate) fn value() -> impl Strategy<Value = Vec<u8>> {
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

pub(crate) fn mode() -> impl Strategy<Value = Mode> {
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

pub(crate) fn cas_pick() -> impl Strategy<Value = CasPick> {
    prop_oneof![
        Just(CasPick::Right),
        Just(CasPick::Wrong),
        Just(CasPick::Zero),
        Just(CasPick::Lower),
    ]
}

pub(crate) fn new_cas() -> impl Strategy<Value = Option<u64>> {
    prop::option::weighted(0.25, prop_oneof![Just(1u64), Just(7), Just(1 << 40)])
}

/// The classic operations and the meta ones.
pub(crate) fn meta_op(keys: usize) -> impl Strategy<Value = Op> {
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

pub(crate) fn op(keys: usize) -> impl Strategy<Value = Op> {
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

pub(crate) fn key_name(k: usize) -> Vec<u8> {
    format!("key:{k}").into_bytes()
}

pub(crate) fn abs(e: Exp, now: Time) -> Time {
    match e {
        Exp::Never => 0,
        Exp::Past => now - 1,
        Exp::In(d) => now + d,
    }
}

pub(crate) type Got = Option<(Vec<u8>, u32, Time, u64)>;

/// What a meta read saw: the item, its expiry/access/fetched state before the read, the
/// stale mark, the win, the binary-key mark.
pub(crate) type MetaSeen = (Got, Time, Time, bool, bool, Win, bool);

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
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

impl Reply {
    /// This reply with its CAS uniques set to 0, and those uniques in order (compared
    /// through a `CasMap`, `support/casmap.rs`: the engine's differ from the model's).
    pub(crate) fn without_cas(mut self) -> (Reply, Vec<u64>) {
        let mut out = Vec::new();
        let mut take = |c: &mut u64| out.push(std::mem::take(c));
        match &mut self {
            Reply::Get(_, Some(g)) => take(&mut g.3),
            Reply::Store(StoreResult::Stored(c)) => take(c),
            Reply::MetaGet(_, Some(seen)) => {
                if let Some(g) = &mut seen.0 {
                    take(&mut g.3);
                }
            }
            Reply::MetaStore(m) => {
                if let StoreResult::Stored(c) = &mut m.result {
                    take(c);
                }
            }
            Reply::MetaArith(MetaArithResult::Value { cas, .. }) => take(cas),
            Reply::Debug(Some(d)) => take(&mut d.cas),
            _ => {}
        }
        (self, out)
    }
}

/// Apply `op` to `e` at time `now`; `cas_right` is the unique a "right" cas uses.
pub(crate) fn apply(e: &dyn Engine, op: &Op, now: Time, cas_right: u64) -> Reply {
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

pub(crate) fn store_mode(mode: Mode, cas_right: u64) -> StoreMode {
    match mode {
        Mode::Set => StoreMode::Set,
        Mode::Add => StoreMode::Add,
        Mode::Replace => StoreMode::Replace,
        Mode::Append => StoreMode::Append,
        Mode::Prepend => StoreMode::Prepend,
        Mode::Cas(c) => StoreMode::Cas(c.pick(cas_right)),
    }
}

pub(crate) fn config(max_bytes: usize, no_evict: bool, use_cas: bool) -> EngineConfig {
    EngineConfig {
        max_bytes,
        // Values of about 50 bytes fit (less with flags or CAS): appends hit the limit.
        max_item_size: 120,
        no_evict,
        use_cas,
    }
}
