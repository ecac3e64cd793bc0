//! The interim engine: a sharded hash map with CLOCK eviction (placeholder; being written).

use crate::{ArithResult, Engine, EngineConfig, EngineStats, ReadOptions, StoreRequest, StoreResult, Time, ItemView};

/// Interim engine.
pub struct HashMapEngine {
    _config: EngineConfig,
}

impl HashMapEngine {
    pub fn new(config: EngineConfig) -> Self {
        HashMapEngine { _config: config }
    }
}

impl Engine for HashMapEngine {
    fn get(&self, _key: &[u8], _now: Time, _opts: ReadOptions, _found: &mut dyn FnMut(ItemView<'_>)) -> bool { false }
    fn store(&self, _req: StoreRequest<'_>, _now: Time) -> StoreResult { StoreResult::NoMemory }
    fn delete(&self, _key: &[u8], _now: Time) -> bool { false }
    fn arith(&self, _key: &[u8], _incr: bool, _delta: u64, _now: Time) -> ArithResult { ArithResult::NotFound }
    fn touch(&self, _key: &[u8], _exptime: Time, _now: Time) -> bool { false }
    fn flush_all(&self, _at: Time, _now: Time) {}
    fn set_max_bytes(&self, _max_bytes: usize, _now: Time) {}
    fn stats(&self) -> EngineStats { EngineStats::default() }
    fn stats_detail(&self, _group: &str) -> Vec<(String, String)> { Vec::new() }
    fn reset_stats(&self) {}
    fn maintain(&self, _now: Time) -> u64 { 0 }
}
