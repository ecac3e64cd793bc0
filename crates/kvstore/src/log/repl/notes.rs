//! Tombstones a master logs for its replicas beyond its clients' deletes: for the items it
//! evicts (eviction runs under locks a log append cannot take, so they are noted and logged
//! later), for deletes of absent keys, and for what a segment held that the maintenance
//! pass frees before a replica read it (so that the replica can skip it).

use std::sync::atomic::Ordering;

use super::super::format::{Rec, HDR_MAX, KIND_ITEM, KIND_TOMBSTONE};
use super::super::sync::lock;
use super::super::{index, LogEngine};
use super::{held_for_replica, EvictionNotes, Holds, Version};

/// Evictions waiting to be logged at most; beyond, replicas keep those items (counted).
pub(in crate::log) const MAX_PENDING_EVICTIONS: usize = 1 << 20;
/// Freed segments a cursor may skip, remembered at most (beyond, a replica that needed a
/// segment freed then gets a full sync, as before there were skips).
pub(in crate::log) const MAX_SKIPPABLE: usize = 1 << 16;

/// The version of the tombstone that removes record version `ver` and older copies of its
/// item, but no later copy (a rewrite or copy forward has a higher stamp, a later version
/// of the key a higher CAS).
pub(in crate::log) fn eviction_tombstone((cas, stamp): Version) -> Version {
    match stamp.checked_add(1) {
        Some(s) => (cas, s),
        None => (cas.saturating_add(1), 0),
    }
}

/// Tombstones for replicas.
impl LogEngine {
    /// With replicas attached, remember an eviction so that it is logged as a tombstone
    /// (see `repl_log_evictions`): the master decides evictions, and its replicas drop the
    /// same items instead of keeping what it no longer has. Called under eviction's locks.
    pub(in crate::log) fn note_eviction(&self, key: &[u8], ver: Version) {
        let mut one = EvictionNotes::default();
        self.note_eviction_in(&mut one, key, ver);
        self.note_evictions(one);
    }

    /// [`LogEngine::note_eviction`] into a local batch, for [`LogEngine::note_evictions`]
    /// to hand over at once (eviction notes a whole segment's items).
    pub(in crate::log) fn note_eviction_in(
        &self,
        notes: &mut EvictionNotes,
        key: &[u8],
        ver: Version,
    ) {
        if self.repl.active.load(Ordering::Relaxed) && notes.len() < MAX_PENDING_EVICTIONS {
            notes.push((key.into(), eviction_tombstone(ver)));
        }
    }

    /// Hand a batch of noted evictions to the replication log (one lock for the batch).
    pub(in crate::log) fn note_evictions(&self, notes: EvictionNotes) {
        if notes.is_empty() {
            return;
        }
        let mut q = lock(&self.repl.evicted);
        let room = MAX_PENDING_EVICTIONS.saturating_sub(q.len());
        q.extend(notes.into_iter().take(room));
    }

    /// Log the tombstones noted since the last call: for an evicted record, one that
    /// removes it and older copies (`eviction_tombstone`); for a tombstone of a freed
    /// segment, the same tombstone again. Called by the maintenance tick and before
    /// serving a pull, never under the engine's locks.
    pub fn repl_log_evictions(&self) {
        let pending = std::mem::take(&mut *lock(&self.repl.evicted));
        for (key, ver) in pending {
            self.write_tombstone(&key, self.hash(&key), Some(ver));
        }
    }

    /// Sealed segment `id` (ours, out of the FIFO) is about to be freed, by the maintenance
    /// pass (before it unlinks the segment's expired items) or by eviction (after it copied
    /// forward what it keeps), while a replica still needs it: log anew what a replica that
    /// skips it would miss, so that it can skip it instead of resynchronizing fully. That is
    /// a tombstone for each record of the segment whose key has no current item elsewhere:
    /// for an item (expired, flushed, evicted, or the one the index still points at here),
    /// one that removes it and older versions (the replica may hold an older version, which
    /// the master no longer has); for a tombstone, the same tombstone (the replica may hold
    /// the item it deleted). A key whose current item lies elsewhere needs nothing: the
    /// replica reads that item where it is. Then `seq` is remembered as skippable. Nothing
    /// is remembered if the tombstones do not all fit the queue (the replica then
    /// resynchronizes, as before).
    pub(in crate::log) fn relog_for_skip(&self, id: u32, seq: u64) {
        let Some(seg) = self.segs.get(id) else {
            return;
        };
        let Some(ptr) = seg.ptr() else {
            return;
        };
        let used = seg.used();
        let mut notes = EvictionNotes::default();
        let mut note = |here: usize, r: &Rec<'_>| {
            if notes.len() >= MAX_PENDING_EVICTIONS {
                return false;
            }
            if r.kind != KIND_TOMBSTONE && r.kind != KIND_ITEM {
                return true;
            }
            let h = self.hash(r.key);
            let elsewhere = {
                let _g = self.index.lock(h);
                let mut fetch = crate::log::flash::Fetch::default();
                // SAFETY: we hold `h`'s stripe lock while the record is used.
                unsafe { self.lookup(h, r.key, &mut fetch) }
                    .is_some_and(|(_, v, _)| index::slot_seg(v) != id || index::slot_off(v) != here)
            };
            // The key's current item lies elsewhere (a later version, or a copy forward of
            // this one, with an equal version on a replica): the replica reads it there.
            if !elsewhere {
                let ver = if r.kind == KIND_TOMBSTONE {
                    (r.cas, r.stamp)
                } else {
                    eviction_tombstone((r.cas, r.stamp))
                };
                notes.push((r.key.into(), ver));
            }
            true
        };
        // SAFETY: a sealed segment taken out of the FIFO (the caller's contract): ours,
        // mapped and not reused until we free it; `used` is its published length.
        let whole = unsafe { super::super::compact::for_records(ptr, used, &mut note) };
        if !whole {
            return;
        }
        {
            let mut q = lock(&self.repl.evicted);
            if q.len() + notes.len() > MAX_PENDING_EVICTIONS {
                return;
            }
            q.extend(notes);
        }
        let mut skippable = lock(&self.repl.skippable);
        if skippable.len() < MAX_SKIPPABLE {
            skippable.insert(seq);
            self.repl.relogged.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forget the skippable segments no replica of `wanted` needs any more.
    pub(in crate::log) fn prune_skippable(&self, wanted: &Holds) {
        let mut skippable = lock(&self.repl.skippable);
        if !skippable.is_empty() {
            skippable.retain(|&seq| held_for_replica(wanted, seq));
        }
    }

    /// With replicas attached, a delete of an absent key is logged too (the key may live
    /// on a replica that did not see the master evict it).
    pub(in crate::log) fn tombstone_for_replicas(&self, key: &[u8], h: u64) {
        if self.repl.active.load(Ordering::Relaxed) && key.len() <= super::super::MAX_KEY {
            self.write_tombstone(key, h, None);
        }
    }

    /// Append a tombstone for `key` (CAS `cas`, else the next unique) and remove an older
    /// item of the key. Without room for it (no_evict and full) only the removal happens.
    pub(in crate::log) fn write_tombstone(&self, key: &[u8], h: u64, ver: Option<Version>) {
        let need = HDR_MAX + key.len();
        let mut sh = self.open.shard();
        let open = self.room(&mut sh, need);
        let dest = open.as_ref().and_then(|o| self.dest(o));
        let _g = self.index.lock(h);
        // Without a version: above everything reserved, so every version a replica may
        // hold goes. The stripe's floor keeps the key's next version at or above it.
        let (cas, stamp) = ver.unwrap_or_else(|| (self.cas.reserved(), 0));
        self.index.raise_floor(h, cas);
        let mut fetch = crate::log::flash::Fetch::default();
        // SAFETY: we hold `h`'s stripe lock.
        if let Some((slot, v, r)) = unsafe { self.lookup(h, key, &mut fetch) } {
            if (r.cas, r.stamp) < (cas, stamp) {
                slot.store(0);
                self.account_remove(v, r.len, self.rec_size(&r));
            }
        }
        if let (Some(o), Some(d)) = (open, dest) {
            self.append_tombstone(&mut sh, o, &d, key, (cas, stamp));
        }
    }
}
