//! Property tests: random operation sequences applied to an engine and to the reference
//! model (`kvstore::model::Model`) must agree.
//!
//! The operations and `apply` are in `support/ops.rs`, shared with `tests/log_model.rs`. The
//! harness here is generic over [`UnderTest`]: to check another engine, implement it for that
//! engine and add `proptest!` cases calling [`run_exact`] / [`run_evicting`].

use kvstore::model::Model;
use kvstore::{
    ArithResult, Engine, EngineConfig, HashMapEngine, MetaArith, MetaArithResult, MetaDelete,
    MetaDeleteResult, MetaGet, MetaRead, MetaStoreRequest, ReadOptions, StoreMode, StoreRequest,
    StoreResult, Time, Win,
};
use proptest::prelude::*;

const OH: usize = HashMapEngine::ITEM_OVERHEAD;

#[path = "support/ops.rs"]
mod ops;
use ops::*;

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
    fn maintain(&self, now: Time, sweep: bool) -> u64 {
        self.0.maintain(now, sweep)
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
