//! Property tests: random operation sequences applied to an engine and to the reference
//! model (`kvstore::model::Model`) must agree.
//!
//! The harness is generic over [`UnderTest`]: to check another engine, implement it for
//! that engine and add `proptest!` cases calling [`run_exact`] / [`run_evicting`].

use kvstore::model::Model;
use kvstore::{
    ArithResult, DebugItem, Engine, EngineConfig, HashMapEngine, MetaArith, MetaArithResult,
    MetaDelete, MetaDeleteResult, MetaGet, MetaRead, MetaStoreRequest, MetaStored, ReadOptions,
    StoreMode, StoreRequest, StoreResult, Time, Win,
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
                        (mi.value, mi.flags, mi.exptime, m.cas_of(&k)),
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The meta operations (stale marks, win tokens, vivify, explicit CAS, ...) mixed with
    /// the classic ones.
    #[test]
    fn meta_agrees_with_model(
        ops in prop::collection::vec(meta_op(4), 1..120),
        shards in prop::sample::select(vec![1usize, 4, 64]),
        use_cas in any::<bool>(),
    ) {
        run_exact::<HashMapEngine>(&ops, shards, use_cas)?;
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

/// An engine that implements only the classic methods (by delegating to the model), so the
/// meta methods run on the trait's default implementations.
struct DefaultsOnly(Model);

impl Engine for DefaultsOnly {
    fn get(
        &self,
        key: &[u8],
        now: Time,
        opts: ReadOptions,
        found: &mut dyn FnMut(kvstore::ItemView<'_>),
    ) -> bool {
        self.0.get(key, now, opts, found)
    }
    fn store(&self, req: StoreRequest<'_>, now: Time) -> StoreResult {
        self.0.store(req, now)
    }
    fn delete(&self, key: &[u8], now: Time) -> bool {
        self.0.delete(key, now)
    }
    fn arith(&self, key: &[u8], incr: bool, delta: u64, now: Time) -> ArithResult {
        self.0.arith(key, incr, delta, now)
    }
    fn touch(&self, key: &[u8], exptime: Time, now: Time) -> bool {
        self.0.touch(key, exptime, now)
    }
    fn flush_all(&self, at: Time, now: Time) {
        self.0.flush_all(at, now)
    }
    fn set_max_bytes(&self, max_bytes: usize, now: Time) {
        self.0.set_max_bytes(max_bytes, now)
    }
    fn stats(&self) -> kvstore::EngineStats {
        self.0.stats()
    }
    fn stats_detail(&self, group: &str) -> Vec<(String, String)> {
        self.0.stats_detail(group)
    }
    fn reset_stats(&self) {
        self.0.reset_stats()
    }
    fn maintain(&self, now: Time) -> u64 {
        self.0.maintain(now)
    }
}

/// The default meta methods do what they document, approximations included.
#[test]
fn default_meta_methods() {
    let e = DefaultsOnly(Model::new(config(1 << 30, false, true)));
    let now = START;
    let read = |e: &DefaultsOnly, key: &[u8], opts: MetaRead| {
        let mut seen = None;
        let r = e.meta_get(key, now, opts, &mut |mi| {
            seen = Some((mi.item.value.to_vec(), mi.item.exptime, mi.win))
        });
        (r, seen)
    };
    // Miss, then vivify (wins), then a plain hit.
    assert_eq!(read(&e, b"a", MetaRead::default()), (MetaGet::Miss, None));
    let viv = MetaRead {
        vivify: Some(now + 30),
        ..MetaRead::default()
    };
    assert_eq!(
        read(&e, b"a", viv),
        (MetaGet::Vivified, Some((vec![], now + 30, Win::Won)))
    );
    assert_eq!(read(&e, b"a", viv).0, MetaGet::Hit);
    // Recache wins whenever the TTL is below it (no token memory).
    let rc = MetaRead {
        recache: Some(now + 60),
        ..MetaRead::default()
    };
    assert_eq!(read(&e, b"a", rc).1.map(|s| s.2), Some(Win::Won));
    assert_eq!(read(&e, b"a", rc).1.map(|s| s.2), Some(Win::Won));
    // Append with vivify creates; append with a wrong CAS is Exists.
    let app = MetaStoreRequest {
        mode: StoreMode::Append,
        key: b"b",
        value: b"xy",
        flags: 0,
        exptime: 0,
        compare_cas: None,
        new_cas: None,
        invalidate: false,
        vivify: true,
        binary_key: false,
    };
    assert!(matches!(
        e.meta_store(app, now).result,
        StoreResult::Stored(_)
    ));
    let wrong = MetaStoreRequest {
        compare_cas: Some(12345),
        ..app
    };
    assert_eq!(e.meta_store(wrong, now).result, StoreResult::Exists);
    // Delete: compare, empty (x), invalidate (removes).
    let bad = MetaDelete {
        compare_cas: Some(12345),
        ..MetaDelete::default()
    };
    assert_eq!(e.meta_delete(b"b", now, bad), MetaDeleteResult::Exists);
    let empty = MetaDelete {
        remove_value: true,
        flags: 3,
        ..MetaDelete::default()
    };
    assert_eq!(e.meta_delete(b"b", now, empty), MetaDeleteResult::Deleted);
    assert_eq!(
        e.0.peek(b"b").map(|it| (it.value, it.flags)),
        Some((vec![], 3))
    );
    let inv = MetaDelete {
        invalidate: true,
        ..MetaDelete::default()
    };
    assert_eq!(e.meta_delete(b"b", now, inv), MetaDeleteResult::Deleted);
    assert_eq!(e.meta_delete(b"b", now, inv), MetaDeleteResult::NotFound);
    // Arith: vivify, then a change with touch, then a wrong CAS.
    let ma = MetaArith {
        incr: true,
        delta: 5,
        vivify: Some((now + 10, 40)),
        ..MetaArith::default()
    };
    assert!(matches!(
        e.meta_arith(b"n", now, ma),
        MetaArithResult::Value {
            value: 40,
            created: true,
            ..
        }
    ));
    let touch = MetaArith {
        touch: Some(now + 50),
        ..ma
    };
    assert!(matches!(
        e.meta_arith(b"n", now, touch),
        MetaArithResult::Value {
            value: 45,
            exptime_before,
            exptime,
            created: false,
            ..
        } if exptime_before == now + 10 && exptime == now + 50
    ));
    let cas = MetaArith {
        compare_cas: Some(12345),
        ..ma
    };
    assert_eq!(e.meta_arith(b"n", now, cas), MetaArithResult::Exists);
    assert_eq!(
        e.meta_arith(b"zz", now, MetaArith::default()),
        MetaArithResult::NotFound
    );
    // debug_item.
    assert_eq!(e.debug_item(b"n", now).map(|d| d.value_len), Some(2));
    assert_eq!(e.debug_item(b"zz", now), None);
}
