//! What a replica remembers between batches, by key: the tombstones it applied and the
//! versions of items it removed on its own, until a complete batch makes them unneeded
//! (see [`Remembered`]).

use std::collections::HashMap;

use super::Version;

/// Tombstones a replica remembers at most. Beyond, those of earlier batches are forgotten
/// (the oldest), and the current batch's are kept; all of them only if the current batch
/// alone has this many. A tombstone is needed only until a complete batch has been
/// applied after it, so the map grows only during a catch-up of budget-limited batches.
/// One forgotten before then leaves a floor behind ([`Remembered`]): until that complete
/// batch, an arriving item at or below the highest version forgotten is dropped (a miss),
/// since it may be older than a forgotten tombstone of its key (a deleted item back).
pub(in crate::log) const MAX_TOMBS: usize = if cfg!(test) { 8 } else { 1 << 20 };

/// Versions a replica remembers by key, with the number of the batch each came with, and
/// what it had to forget too early.
#[derive(Debug, Clone, Default)]
pub(in crate::log) struct Remembered {
    pub(super) map: HashMap<Box<[u8]>, (Version, u64)>,
    /// The highest version forgotten before a complete batch came after it (the memory was
    /// full), and the latest batch such a version came with. Until a complete batch after
    /// that one, an item at or below it is taken as outdated: a tombstone of its key may
    /// have been among those forgotten, and a cache may miss but must not bring a deleted
    /// item back.
    pub(super) floor: Option<(Version, u64)>,
}

impl Remembered {
    /// Whether an arriving item of `key` at version `ver` is outdated: below (or, with
    /// `or_equal`, at) the version remembered for its key, or at or below the floor.
    pub(in crate::log) fn outdated(&self, key: &[u8], ver: Version, or_equal: bool) -> bool {
        self.floor.is_some_and(|(f, _)| ver <= f)
            || self
                .map
                .get(key)
                .is_some_and(|&(v, _)| ver < v || or_equal && ver == v)
    }

    /// Entries, plus one for a floor: 0 when nothing can be taken as outdated.
    pub(in crate::log) fn weight(&self) -> usize {
        self.map.len() + usize::from(self.floor.is_some())
    }

    pub(in crate::log) fn clear(&mut self) {
        self.map.clear();
        self.floor = None;
    }

    /// Forget the entries `drop` picks before their time, raising the floor to them.
    pub(in crate::log) fn forget_early(&mut self, mut drop: impl FnMut(u64) -> bool) {
        let mut floor = self.floor;
        self.map.retain(|_, &mut (v, n)| {
            if !drop(n) {
                return true;
            }
            floor = Some(match floor {
                Some((f, b)) => (f.max(v), b.max(n)),
                None => (v, n),
            });
            false
        });
        self.floor = floor;
    }
}

/// Remember version `ver` of `key` (a tombstone applied, or an item removed) in batch
/// `batch_no`, the latest so far, so that an older item of the key arriving later loses
/// to it; see [`MAX_TOMBS`] for what is forgotten when the memory is full.
pub(in crate::log) fn remember_tombstone(
    tombs: &mut Remembered,
    key: &[u8],
    ver: Version,
    batch_no: u64,
) {
    if tombs.map.len() >= MAX_TOMBS && !tombs.map.contains_key(key) {
        tombs.forget_early(|n| n < batch_no);
        if tombs.map.len() >= MAX_TOMBS {
            tombs.forget_early(|_| true);
        }
    }
    // An older tombstone of the key can arrive after a newer one (from a segment shipped
    // later): the newest is what later items must beat.
    let t = tombs.map.entry(key.into()).or_insert((ver, batch_no));
    *t = (t.0.max(ver), batch_no);
}

/// A batch numbered `batch_no` that was not cut short has been applied: forget what was
/// remembered before it (every record older than those has arrived), and the floor if
/// everything under it came before it too.
pub(in crate::log) fn forget_before(tombs: &mut Remembered, batch_no: u64) {
    tombs.map.retain(|_, &mut (_, n)| n >= batch_no);
    if tombs.floor.is_some_and(|(_, n)| n < batch_no) {
        tombs.floor = None;
    }
}
