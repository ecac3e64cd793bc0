//! Comparing CAS uniques of the engine with the model's.
//!
//! The model draws its uniques from one counter (1, 2, 3, ...); the engine's come from the
//! places its records take in the log (`src/log/format.rs`, `natural_cas`), so the two
//! numbers of one store differ. What must agree is everything a client can tell from them:
//! one unique of the engine always stands for the same unique of the model and the other
//! way round (so an equal CAS is equal on both sides and a changed one changed on both).
//! Replies are compared with their CAS fields taken out, and the fields paired here.

use std::collections::HashMap;

#[derive(Debug, Default, Clone)]
pub(crate) struct CasMap {
    e2m: HashMap<u64, u64>,
    m2e: HashMap<u64, u64>,
}

impl CasMap {
    /// Pair the engine's unique `e` with the model's `m`: false if either already stands for
    /// another (0 stands for 0: CAS off, or no item).
    pub(crate) fn pair(&mut self, e: u64, m: u64) -> bool {
        if e == m {
            // CAS off, no item, or a unique the client chose (`E`): the same number on
            // both sides, which may also be another item's unique on one of them.
            return true;
        }
        if e == 0 || m == 0 {
            return false;
        }
        match (self.e2m.get(&e), self.m2e.get(&m)) {
            (Some(&x), Some(&y)) => x == m && y == e,
            (None, None) => {
                self.e2m.insert(e, m);
                self.m2e.insert(m, e);
                true
            }
            _ => false,
        }
    }

    /// Pair every field of `got` with the one of `want` at the same place: false if the
    /// counts differ or a pair does not hold.
    pub(crate) fn pair_all(&mut self, got: &[u64], want: &[u64]) -> bool {
        got.len() == want.len() && got.iter().zip(want).all(|(&e, &m)| self.pair(e, m))
    }
}
