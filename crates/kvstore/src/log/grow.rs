//! Index growth: linear hashing, a batch of bucket splits between pin barriers, then a sweep
//! that compacts chains and releases overflow buckets.

use std::sync::atomic::Ordering;

use super::index::Slot;
use super::sync::lock;
use super::{index, LogEngine, GROW_BATCH, LOAD_DEN, LOAD_NUM, SWEEP_SCAN};

/// Where index growth stands (see [`LogEngine::grow`]).
#[derive(Default)]
pub(super) struct Grow {
    pub(super) step: GrowStep,
    /// Buckets split in the current batch.
    pub(super) buckets: Vec<usize>,
    /// Overflow buckets unlinked, waiting for a barrier before reuse.
    pub(super) spare: Vec<u32>,
    /// Where the next sweep for chains to compact starts.
    pub(super) cursor: usize,
    /// The pending steps finish a batch of splits (not a compaction sweep).
    pub(super) expanding: bool,
    /// A bulk load (warm restart) is under way: chains are not compacted meanwhile (they
    /// are only filling up); splits still happen if the load outgrows the presized index.
    pub(super) loading: bool,
}

/// While it lives, the index is not compacted (see [`LogEngine::bulk_load`]).
pub(super) struct BulkLoad<'a>(&'a LogEngine);

impl Drop for BulkLoad<'_> {
    fn drop(&mut self) {
        lock(&self.0.grow_lock).loading = false;
    }
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum GrowStep {
    /// No batch under way.
    #[default]
    Idle,
    /// Split; a barrier is due before compaction.
    Split,
    /// Compacted (items moved); a barrier is due before unlinking.
    Compacted,
    /// Unlinked (`spare`); a barrier is due before reuse.
    Released,
}

impl LogEngine {
    /// Grow the index while its items exceed `LOAD_NUM / LOAD_DEN` of its main slots: up
    /// to `GROW_BATCH` splits, then, each after a pin barrier, the compaction of the split
    /// chains, the unlinking of their empty overflow buckets and the reuse of those (see
    /// `index`). One thread at a time; others skip. With `block` false a barrier that
    /// readers still hold up is left for a later call instead of waited for; no new split
    /// starts until the pending steps are done. (Giving segment memory back when the index
    /// grew into it evicts, and eviction waits for readers as it always does.) Called with
    /// no lock and no pin held.
    pub(super) fn grow(&self, block: bool) {
        let Ok(mut g) = self.grow_lock.try_lock() else {
            return;
        };
        loop {
            match g.step {
                GrowStep::Idle => {
                    let live = self.stats.live_items();
                    let mut split = Vec::new();
                    // The index takes at most half the limit (the segments the rest;
                    // seven eighths with a flash tier: `index_cap`).
                    // With no_evict it grows only into memory no segment uses.
                    let max = self.arena.limit();
                    let room = |extra: usize| {
                        let index = self.index_bytes() + extra;
                        index <= self.index_cap(max)
                            && (!self.config.no_evict || self.arena.allocated() + index <= max)
                    };
                    while split.len() < GROW_BATCH
                        && live * LOAD_DEN
                            > self.index.nmain() * self.index.slots_per_main() * LOAD_NUM
                        && room(index::BUCKET_BYTES)
                    {
                        let Some((b, l)) = self.index.next_split() else {
                            break;
                        };
                        let _s = self.index.lock_bucket(b);
                        self.index.split(
                            b,
                            l,
                            // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
                            |v| unsafe { self.rec(v) }.map(|r| self.hash(r.key)),
                            |slot, x| self.evict_index_slot(slot, x, 0),
                        );
                        split.push(b);
                    }
                    if split.is_empty() {
                        if g.loading {
                            return;
                        }
                        // Nothing to split: compact a slice of chains instead, so that
                        // overflow buckets linked while a bucket was briefly full go
                        // back to the pool (a full cache churns every bucket).
                        self.sweep(&mut g);
                        if g.step == GrowStep::Idle {
                            return;
                        }
                        continue;
                    }
                    self.st()
                        .index_splits
                        .fetch_add(split.len() as u64, Ordering::Relaxed);
                    g.buckets = split;
                    g.step = GrowStep::Split;
                    g.expanding = true;
                    // The index is counted against the limit: give back what it took.
                    if !self.config.no_evict && self.arena.allocated() > self.budget() {
                        self.shrink();
                    }
                }
                GrowStep::Split => {
                    if !self.try_barrier(block) {
                        return;
                    }
                    let mut moved = false;
                    for &b in &g.buckets {
                        let _s = self.index.lock_bucket(b);
                        moved |= self.index.compact(b);
                    }
                    g.step = GrowStep::Compacted;
                    if moved {
                        continue;
                    }
                    // Nothing marked: no barrier needed before unlinking.
                    g.step = GrowStep::Released;
                    g.spare = self.release_chains(&g.buckets);
                }
                GrowStep::Compacted => {
                    if !self.try_barrier(block) {
                        return;
                    }
                    g.spare = self.release_chains(&g.buckets);
                    g.step = GrowStep::Released;
                }
                GrowStep::Released => {
                    if !g.spare.is_empty() && !self.try_barrier(block) {
                        return;
                    }
                    let spare = std::mem::take(&mut g.spare);
                    self.index.recycle(spare);
                    g.buckets.clear();
                    g.step = GrowStep::Idle;
                    g.expanding = false;
                    return;
                }
            }
        }
    }

    /// Prepare for a bulk load of about `items` items (a warm restart) into an engine that
    /// holds none: size the index for them at once instead of splitting buckets while they
    /// arrive (up to the size growth would reach for them, within the same cap: half the
    /// limit; with `no_evict`, memory no segment uses), and compact no chain until the
    /// returned guard is dropped. `items` is only a hint: more or fewer may come, and the
    /// index still grows if it must. The index is resized only while the engine holds no
    /// item and no other thread uses it (the restore, before the server starts).
    pub(super) fn bulk_load(&self, items: u64) -> BulkLoad<'_> {
        let mut g = lock(&self.grow_lock);
        g.loading = true;
        let live = self.stats.live_sum();
        if g.step != GrowStep::Idle || live != 0 || self.index.overflow_used() != 0 {
            return BulkLoad(self);
        }
        let max = self.arena.limit();
        let index = self.index_bytes();
        let mut spare = self.index_cap(max).saturating_sub(index);
        if self.config.no_evict {
            spare = spare.min(max.saturating_sub(self.arena.allocated() + index));
        }
        let cap = self.index.nmain() + spare / index::BUCKET_BYTES;
        let slots = usize::try_from(items)
            .unwrap_or(usize::MAX)
            .saturating_mul(LOAD_DEN)
            / LOAD_NUM;
        self.index
            .presize(slots.div_ceil(self.index.slots_per_main()).min(cap));
        BulkLoad(self)
    }

    /// Start compacting the next chains that have overflow buckets (up to `GROW_BATCH`
    /// of them, looking at no more than `SWEEP_SCAN` buckets).
    pub(super) fn sweep(&self, g: &mut Grow) {
        let nmain = self.index.nmain();
        let mut picked = Vec::new();
        for _ in 0..SWEEP_SCAN.min(nmain) {
            let b = g.cursor % nmain;
            g.cursor = g.cursor.wrapping_add(1);
            if self.index.has_overflow(b) {
                picked.push(b);
                if picked.len() == GROW_BATCH {
                    break;
                }
            }
        }
        if picked.is_empty() {
            return;
        }
        // No marker is left from an earlier batch (Idle), so no barrier is due first.
        let mut moved = false;
        for &b in &picked {
            let _s = self.index.lock_bucket(b);
            moved |= self.index.compact(b);
        }
        if moved {
            g.step = GrowStep::Compacted;
        } else {
            g.spare = self.release_chains(&picked);
            g.step = GrowStep::Released;
        }
        g.buckets = picked;
    }

    pub(super) fn release_chains(&self, buckets: &[usize]) -> Vec<u32> {
        let mut spare = Vec::new();
        for &b in buckets {
            let _s = self.index.lock_bucket(b);
            spare.extend(self.index.release_chain(b));
        }
        spare
    }

    /// Evict the item `v` of `slot` because the index has no room for it (a full chain,
    /// or a split's new bucket), putting `replacement` (a new item, or 0) in the slot.
    /// The caller holds the slot's stripe lock and `slot` still holds `v` (as an item or
    /// as a marker), so its record is live.
    pub(super) fn evict_index_slot(&self, slot: Slot<'_>, v: u64, replacement: u64) {
        let mut fetch = super::flash::Fetch::default();
        // SAFETY: per the contract; the length is read before the slot is overwritten.
        let (len, size) = unsafe { self.rec_any(v, &mut fetch) }.map_or((0, 0), |r| {
            self.note_eviction(r.key, (r.cas, r.stamp));
            self.note_removed(&r, v);
            (r.len, self.rec_size(&r))
        });
        slot.store(replacement);
        self.account_remove(v, len, size);
        self.tally_evicted(size);
        self.count_index_eviction();
    }
}
