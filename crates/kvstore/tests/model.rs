//! Property tests: random operation sequences applied to an engine and to the reference
//! model (`kvstore::model::Model`) must agree.
//!
//! The harness is generic over [`UnderTest`]: to check another engine, implement it for
//! that engine and add `proptest!` cases calling [`run_exact`] / [`run_evicting`].

use kvstore::model::Model;
use kvstore::{
    ArithResult, Engine, EngineConfig, HashMapEngine, ReadOptions, StoreMode, StoreRequest,
    StoreResult, Time,
};
use proptest::prelude::*;

const START: Time = 1_000_000;
const OH: usize = HashMapEngine::ITEM_OVERHEAD;

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

/// What the harness needs from an engine besides [`Engine`].
trait UnderTest: Engine {
    /// Bytes the engine charges per item beyond key and value (the model charges the
    /// same, so `bytes` and the too-large rules agree).
    const OVERHEAD: usize;
    fn make(config: EngineConfig, shards: usize) -> Self;
    /// The stored `(value, flags, exptime, cas)` of `key`, live or not, without side
    /// effects.
    fn peek_raw(&self, key: &[u8]) -> Got;
    /// Internal consistency (memory accounting).
    fn check(&self) -> Result<(), String>;
}

impl UnderTest for HashMapEngine {
    const OVERHEAD: usize = HashMapEngine::ITEM_OVERHEAD;
    fn make(config: EngineConfig, shards: usize) -> Self {
        HashMapEngine::with_shards(config, shards)
    }
    fn peek_raw(&self, key: &[u8]) -> Got {
        self.peek(key)
    }
    fn check(&self) -> Result<(), String> {
        self.check_accounting()
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Get(bool, Got),
    Store(StoreResult),
    Bool(bool),
    Arith(ArithResult),
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
            let mode = match mode {
                Mode::Set => StoreMode::Set,
                Mode::Add => StoreMode::Add,
                Mode::Replace => StoreMode::Replace,
                Mode::Append => StoreMode::Append,
                Mode::Prepend => StoreMode::Prepend,
                Mode::Cas(CasPick::Right) => StoreMode::Cas(cas_right),
                Mode::Cas(CasPick::Wrong) => StoreMode::Cas(cas_right.wrapping_add(1)),
                Mode::Cas(CasPick::Zero) => StoreMode::Cas(0),
            };
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

/// With plenty of memory the engine must agree with the model on every reply and on
/// the counters both keep.
fn run_exact<E: UnderTest>(ops: &[Op], shards: usize, use_cas: bool) -> Result<(), TestCaseError> {
    let cfg = config(1 << 30, false, use_cas);
    let e = E::make(cfg.clone(), shards);
    let m = Model::with_overhead(cfg, E::OVERHEAD);
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
            es.bytes,
            es.get_expired,
            es.get_flushed
        ),
        (
            ms.curr_items,
            ms.total_items,
            ms.bytes,
            ms.get_expired,
            ms.get_flushed
        )
    );
    prop_assert_eq!(es.evictions, 0);
    e.check().map_err(TestCaseError::fail)?;
    Ok(())
}

/// With little memory the engine may miss items the model has (evicted), but any item
/// it has must equal the model's, and with the model trimmed to what the engine holds
/// every reply must agree (CAS, NOT_FOUND, EXISTS included). With `no_evict` a write may
/// also fail for memory where the model succeeds.
fn run_evicting<E: UnderTest>(
    ops: &[Op],
    shards: usize,
    items: usize,
    no_evict: bool,
) -> Result<(), TestCaseError> {
    let max = items * (E::OVERHEAD + 30);
    let cfg = config(max, no_evict, true);
    let e = E::make(cfg.clone(), shards);
    let mut m = Model::with_overhead(cfg, E::OVERHEAD);
    let mut now = START;
    for (n, op) in ops.iter().enumerate() {
        if let Op::Advance(d) = op {
            now += d;
        }
        let right = if let Some(k) = op.key() {
            let k = key_name(k);
            match e.peek_raw(&k) {
                None => m.forget(&k),
                Some((value, flags, exptime, cas)) => {
                    let mi = m.peek(&k);
                    prop_assert!(mi.is_some(), "engine has {:?}, model not", k);
                    let mi = mi.unwrap_or_else(|| unreachable!());
                    prop_assert_eq!(
                        (value, flags, exptime, cas),
                        (mi.value, mi.flags, mi.exptime, mi.version),
                        "op #{} key {:?}",
                        n,
                        k
                    );
                }
            }
            m.cas_of(&k)
        } else {
            0
        };
        let before = m.clone();
        let want = apply(&m, op, now, right);
        let got = apply(&e, op, now, right);
        let mem_failure = matches!(
            (&got, &want, op),
            (
                Reply::Store(StoreResult::NoMemory),
                Reply::Store(StoreResult::Stored(_)),
                _
            ) | (
                Reply::Arith(ArithResult::NoMemory),
                Reply::Arith(ArithResult::Value(_)),
                _
            ) | (
                Reply::Store(StoreResult::NotStored),
                Reply::Store(StoreResult::Stored(_)),
                Op::Store {
                    mode: Mode::Append | Mode::Prepend,
                    ..
                }
            )
        );
        if no_evict && mem_failure {
            // Undo the model's write; a failed set drops the old item.
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
        let s = e.stats();
        prop_assert!(s.bytes <= max as u64, "bytes {} > max {}", s.bytes, max);
    }
    e.check().map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn agrees_with_model(
        ops in prop::collection::vec(op(4), 1..120),
        shards in prop::sample::select(vec![1usize, 4, 64]),
        use_cas in any::<bool>(),
    ) {
        run_exact::<HashMapEngine>(&ops, shards, use_cas)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn agrees_with_model_under_eviction(
        ops in prop::collection::vec(op(12), 1..160),
        shards in prop::sample::select(vec![1usize, 2, 8]),
        items in 2usize..6,
    ) {
        run_evicting::<HashMapEngine>(&ops, shards, items, false)?;
    }

    #[test]
    fn agrees_with_model_without_eviction(
        ops in prop::collection::vec(op(12), 1..160),
        shards in prop::sample::select(vec![1usize, 8]),
        items in 2usize..6,
    ) {
        run_evicting::<HashMapEngine>(&ops, shards, items, true)?;
    }
}

/// Eviction actually happens in the eviction property's setting.
#[test]
fn eviction_setting_evicts() {
    let cfg = config(3 * (OH + 30), false, true);
    let e = HashMapEngine::with_shards(cfg, 2);
    for k in 0..12 {
        let key = key_name(k);
        let r = StoreRequest {
            mode: StoreMode::Set,
            key: &key,
            value: b"0123456789",
            flags: 0,
            exptime: 0,
        };
        assert!(matches!(e.store(r, START), StoreResult::Stored(_)));
    }
    assert!(e.stats().evictions >= 8);
}
