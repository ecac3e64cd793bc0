//! Property tests: random operation sequences (classic and meta) applied to the engine
//! (`LogEngine`) and to the reference model (`kvstore::model::Model`) must agree.
//!
//! The operations and `apply` are in `support/ops.rs`. With plenty of memory every reply
//! must agree, and so must the counters both keep (`bytes` aside: the engine charges its
//! records, the model key and value). `tests/log_model.rs` adds the engine's own operation
//! mix with large values and little memory, where eviction happens.

use kvstore::model::Model;
use kvstore::{Engine, EngineConfig, LogEngine};
use proptest::prelude::*;

#[path = "support/ops.rs"]
mod ops;
use ops::*;
#[path = "support/casmap.rs"]
mod casmap;
use casmap::CasMap;

fn run_exact(ops: &[Op], use_cas: bool) -> Result<(), TestCaseError> {
    let cfg = EngineConfig {
        max_bytes: 4 << 20,
        ..config(0, false, use_cas)
    };
    let e = LogEngine::new(cfg.clone());
    let m = Model::new(cfg);
    let mut now = START;
    let mut cas = CasMap::default();
    for (n, op) in ops.iter().enumerate() {
        if let Op::Advance(d) = op {
            now += d;
        }
        // A "right" cas is each side's own unique of the key.
        let right_m = op.key().map_or(0, |k| m.cas_of(&key_name(k)));
        let right_e = op
            .key()
            .and_then(|k| e.peek_item(&key_name(k), now))
            .map_or(0, |it| it.3);
        let (want, want_cas) = apply(&m, op, now, right_m).without_cas();
        let (got, got_cas) = apply(&e, op, now, right_e).without_cas();
        prop_assert_eq!(got, want, "op #{} {:?} at {}", n, op, now);
        prop_assert!(
            cas.pair_all(&got_cas, &want_cas),
            "op #{} {:?} at {}: CAS {:?} where the model has {:?}",
            n,
            op,
            now,
            got_cas,
            want_cas
        );
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
    e.check_accounting()
        .map_err(|err| TestCaseError::fail(err.to_string()))?;
    Ok(())
}

fn cases() -> u32 {
    std::env::var("LOG_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// The classic operations.
    #[test]
    fn agrees_with_model(
        ops in prop::collection::vec(op(4), 1..120),
        use_cas in any::<bool>(),
    ) {
        run_exact(&ops, use_cas)?;
    }

    /// The meta operations (stale marks, win tokens, vivify, explicit CAS, ...) mixed with
    /// the classic ones.
    #[test]
    fn meta_agrees_with_model(
        ops in prop::collection::vec(meta_op(4), 1..120),
        use_cas in any::<bool>(),
    ) {
        run_exact(&ops, use_cas)?;
    }
}
