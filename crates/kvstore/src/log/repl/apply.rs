//! The replica's side: applying a master's batches in any order, with the versions that
//! decide between copies, and what it remembers meanwhile (tombstones, its own removals).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::super::format::{
    self, Rec, KIND_ITEM, KIND_TOMBSTONE, META_BINARY_KEY, META_STALE, SEG_HDR,
};
use super::super::sync::lock;
use super::super::{index, Commit, Cond, LogEngine, MetaW, Src};
use super::remembered::{forget_before, remember_tombstone};
use super::wire::{
    chunk, Cursor, Phase, Pos, Reader, ReplicaState, BATCH_HDR, BATCH_MAGIC, CHUNK_COMPLETE,
    FLAG_COMPLETE, FLAG_DONE, KIND_RESET, KIND_SNAPSHOT, KIND_SWITCH, KIND_TAIL, MAX_ENTRIES,
    VERSION,
};
use super::{Applied, Checkpoint, Holds, ReplError, Version, CHECKPOINTS};
use crate::Time;

/// Records of a replicated chunk whose index buckets are loaded ahead of their turn.
pub(in crate::log) const PREFETCH: usize = 8;

/// Replica side.
/// The record format of a batch's chunks.
#[derive(Clone, Copy)]
pub(in crate::log) enum RecordReader {
    /// Record format 2 (`format::read`).
    Current,
    /// Record format 1 (`format::v1::read`), of snapshot files of format 2.
    Format1,
}

impl RecordReader {
    /// # Safety
    /// As for [`format::read`].
    unsafe fn read<'a>(self, p: *const u8, end: usize, off: usize, base: u64) -> Option<Rec<'a>> {
        // SAFETY: forwarded.
        unsafe {
            match self {
                RecordReader::Current => format::read(p, end, off, base),
                RecordReader::Format1 => format::v1::read(p, end, off, base),
            }
        }
    }
}

impl LogEngine {
    /// Follow a master (true) or stop (false: promotion). A replica keeps the master's
    /// versions; after promotion new writes draw versions above every one it holds.
    pub fn set_replica(&self, on: bool) {
        self.repl.replica.store(on, Ordering::SeqCst);
    }

    /// Apply one batch from the master to this engine and advance `st`.
    pub fn repl_apply(
        &self,
        st: &mut ReplicaState,
        batch: &[u8],
        now: Time,
    ) -> Result<Applied, ReplError> {
        self.apply_batch(st, batch, now, false)
    }

    /// [`LogEngine::repl_apply`]; with `format_1`, a batch of replication format 1 (records
    /// of record format 1) is read too: a warm-restart file of snapshot format 2 holds
    /// such batches.
    pub(in crate::log) fn apply_batch(
        &self,
        st: &mut ReplicaState,
        batch: &[u8],
        now: Time,
        format_1: bool,
    ) -> Result<Applied, ReplError> {
        self.tick(now);
        let mut r = Reader(batch);
        if r.take(4)? != BATCH_MAGIC {
            return Err(ReplError::BatchMagic);
        }
        let read: RecordReader = match r.u8()? {
            VERSION => RecordReader::Current,
            1 if format_1 => RecordReader::Format1,
            1 => return Err(ReplError::Format1),
            _ => return Err(ReplError::BatchVersion),
        };
        let kind = r.u8()?;
        let flags = r.u8()?;
        r.u8()?;
        let _next_seq = r.u64()?;
        let flush_mark = r.u64()?;
        let delayed_mark = r.u64()?;
        let next_cas = r.u64()?;
        let deadline = r.u32()?;
        let master_offset = r.u64()?;
        debug_assert_eq!(batch.len() - r.0.len(), BATCH_HDR + 8);
        let mut applied = Applied {
            master_offset,
            ..Applied::default()
        };
        st.batches += 1;
        let batch_no = st.batches;
        self.repl.epoch.store(batch_no, Ordering::SeqCst);
        match kind {
            KIND_RESET => {
                let below = r.u64()?;
                let n = r.u32()? as usize;
                if n > MAX_ENTRIES || r.0.len() != n * 12 {
                    return Err(ReplError::ResetLength);
                }
                let mut entries = BTreeMap::new();
                for _ in 0..n {
                    let seq = r.u64()?;
                    let off = r.u32()?;
                    if seq >= below {
                        return Err(ReplError::ResetBeyondCursor);
                    }
                    entries.insert(
                        seq,
                        Pos {
                            off,
                            complete: false,
                        },
                    );
                }
                self.wipe();
                lock(&self.repl.checkpoints).clear();
                *lock(&self.repl.settled) = None;
                self.forget_removed(u64::MAX);
                st.restart();
                st.phase = Phase::Snapshot { seq: 0, off: 0 };
                st.below = below;
                st.entries = entries;
                st.applied_bytes = 0;
                st.full_syncs += 1;
                applied.reset = true;
            }
            KIND_SNAPSHOT => {
                if !matches!(st.phase, Phase::Snapshot { .. }) {
                    return Err(ReplError::SnapshotOutsideSync);
                }
                let pseq = r.u64()?;
                let poff = r.u32()?;
                while !r.0.is_empty() {
                    let (seq, base, _start, _end, _f, data) = chunk(&mut r)?;
                    if seq >= st.below {
                        return Err(ReplError::SnapshotBeyondCursor);
                    }
                    self.apply_records(st, read, base, data, batch_no, now, &mut applied)?;
                }
                st.phase = if flags & FLAG_DONE != 0 {
                    Phase::Tail
                } else {
                    Phase::Snapshot {
                        seq: pseq,
                        off: poff,
                    }
                };
            }
            KIND_TAIL => {
                if st.phase != Phase::Tail {
                    return Err(ReplError::TailBeforeSync);
                }
                applied.idle = r.0.is_empty();
                while !r.0.is_empty() {
                    let (seq, base, start, end, f, data) = chunk(&mut r)?;
                    let have = st.entries.get(&seq).copied();
                    let expect = have.map_or(SEG_HDR as u32, |p| p.off.max(SEG_HDR as u32));
                    let known = seq >= st.below || have.is_some();
                    if !known || have.is_some_and(|p| p.complete) || start != expect {
                        return Err(ReplError::TailDiscontinuous);
                    }
                    if end as usize != start as usize + data.len() {
                        return Err(ReplError::TailLength);
                    }
                    self.apply_records(st, read, base, data, batch_no, now, &mut applied)?;
                    st.entries.insert(
                        seq,
                        Pos {
                            off: end,
                            complete: f & CHUNK_COMPLETE != 0,
                        },
                    );
                }
                st.advance();
                let own = self.own_position();
                if flags & FLAG_COMPLETE != 0 {
                    forget_before(&mut st.tombs, batch_no);
                    *lock(&self.repl.settled) = Some(own.clone());
                    self.forget_removed(batch_no);
                }
                if !applied.idle {
                    let cp = Checkpoint {
                        upstream: Cursor::from_state(st),
                        own,
                    };
                    let mut cps = lock(&self.repl.checkpoints);
                    if cps.len() >= CHECKPOINTS {
                        cps.pop_front();
                    }
                    cps.push_back(cp);
                }
            }
            KIND_SWITCH => {
                if st.phase != Phase::Tail {
                    return Err(ReplError::SwitchOutsideTail);
                }
                let below = r.u64()?;
                let n = r.u32()? as usize;
                if n > MAX_ENTRIES || r.0.len() != n * 12 {
                    return Err(ReplError::SwitchLength);
                }
                let mut entries = BTreeMap::new();
                for _ in 0..n {
                    let seq = r.u64()?;
                    let off = r.u32()?;
                    entries.insert(
                        seq,
                        Pos {
                            off,
                            complete: false,
                        },
                    );
                }
                // The new master's log from here on holds everything this replica lacks;
                // checkpoints of the old upstream no longer describe what it follows.
                lock(&self.repl.checkpoints).clear();
                st.below = below;
                st.entries = entries;
                applied.switched = true;
            }
            _ => return Err(ReplError::BatchKind),
        }
        // The master's flush state and version counter (items carry its versions).
        self.flush.adopt(flush_mark, delayed_mark, deadline);
        self.cas.observe(next_cas);
        Ok(applied)
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::log) fn apply_records(
        &self,
        st: &mut ReplicaState,
        read: RecordReader,
        base: u64,
        data: &[u8],
        batch_no: u64,
        now: Time,
        applied: &mut Applied,
    ) -> Result<(), ReplError> {
        let mut off = 0;
        // The highest version seen, published once per chunk rather than per record (two
        // restore threads would fight over the counter's cache line).
        let (mut cas, mut stamp) = (0, 0);
        // The keys of the next PREFETCH records are hashed ahead and their buckets loaded
        // while this one is applied: an index lookup is a cache miss otherwise (most of a
        // warm restart's time). `hashes` holds them in record order.
        let mut hashes = [0u64; PREFETCH];
        let (mut ahead, mut queued, mut done) = (0, 0, 0usize);
        while off < data.len() {
            while queued < PREFETCH && ahead < data.len() {
                // SAFETY: as below.
                let Some(r) = (unsafe { read.read(data.as_ptr(), data.len(), ahead, base) }) else {
                    // Reported when the main loop gets there.
                    ahead = data.len();
                    break;
                };
                ahead += r.len;
                let h = self.hash(r.key);
                self.index.prefetch(h);
                hashes[(done + queued) % PREFETCH] = h;
                queued += 1;
            }
            // SAFETY: `data` is a live slice of `data.len()` bytes that nobody writes;
            // `read` checks every length against it.
            let rec = unsafe { read.read(data.as_ptr(), data.len(), off, base) };
            let Some(rec) = rec else {
                return Err(ReplError::Record);
            };
            let h = if queued > 0 {
                queued -= 1;
                hashes[done % PREFETCH]
            } else {
                self.hash(rec.key)
            };
            done += 1;
            off += rec.len;
            applied.records += 1;
            applied.bytes += rec.len as u64;
            st.applied_bytes += rec.len as u64;
            match rec.kind {
                KIND_ITEM => {
                    self.apply_item(st, &rec, h, now);
                    cas = cas.max(rec.cas.saturating_add(1));
                    stamp = stamp.max(rec.stamp);
                }
                KIND_TOMBSTONE => {
                    let ver = (rec.cas, rec.stamp);
                    self.apply_tombstone(rec.key, ver);
                    remember_tombstone(&mut st.tombs, rec.key, ver, batch_no);
                }
                _ => return Err(ReplError::RecordKind),
            }
        }
        self.cas.observe(cas);
        self.stamps.observe(stamp.saturating_add(1));
        Ok(())
    }

    /// Store replicated item `r`, whose key hashes to `h`.
    pub(in crate::log) fn apply_item(&self, st: &ReplicaState, r: &Rec<'_>, h: u64, now: Time) {
        let ver = (r.cas, r.stamp);
        if st.tombs.outdated(r.key, ver, false) {
            return;
        }
        if self.repl.removed_len.load(Ordering::Acquire) != 0
            && lock(&self.repl.removed).outdated(r.key, ver, true)
        {
            return;
        }
        let c = Commit {
            key: r.key,
            h,
            cond: Cond::Newer(r.cas, r.stamp),
            src: Src::Bytes(r.value),
            old_len: 0,
            flags: Some(r.flags),
            exptime: Some(r.exptime),
            keep_cas: false,
            keep_access: false,
            access: false,
            meta: MetaW {
                explicit_cas: r.explicit_cas,
                stale: Some(r.meta & META_STALE != 0),
                binary_key: Some(r.meta & META_BINARY_KEY != 0),
                win: Some(false),
            },
        };
        self.commit(&c, now, None);
    }

    /// The item of record `r`, which slot value `v` points at, leaves the index on its own
    /// (expired, flushed, evicted): raise its stripe's floor past its version, and on a
    /// replica remember that version (see `ReplFlags::removed`), unless it is
    /// below the `settled` position (an older record of its key can no longer arrive).
    /// The caller holds the key's stripe lock, so a batch that brought the item was
    /// numbered before this reads `epoch`, and the record's segment is live.
    pub(in crate::log) fn note_removed(&self, r: &Rec<'_>, v: u64) {
        // The key's next version goes above this one, as above its tombstone's (see
        // `cas.rs`): a replica may still hold it.
        self.index
            .raise_floor(self.hash(r.key), r.cas.saturating_add(1));
        if !self.repl.replica.load(Ordering::Relaxed) {
            return;
        }
        let seq = self
            .segs
            .get(index::slot_seg(v))
            .map(|s| s.seq())
            // 0: retired (numbers start at 1); where it was is no longer known.
            .filter(|&seq| seq != 0);
        if let (Some(seq), Some(settled)) = (seq, &*lock(&self.repl.settled)) {
            if settled.has(seq, index::slot_off(v)) {
                return;
            }
        }
        let epoch = self.repl.epoch.load(Ordering::SeqCst);
        let mut m = lock(&self.repl.removed);
        remember_tombstone(&mut m, r.key, (r.cas, r.stamp), epoch);
        self.repl.removed_len.store(m.weight(), Ordering::Release);
    }

    /// Forget the removals noted before batch `batch_no` (all with `u64::MAX`): a batch
    /// that was not cut short has been applied since, so every older record of them has
    /// arrived.
    pub(in crate::log) fn forget_removed(&self, batch_no: u64) {
        if self.repl.removed_len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut m = lock(&self.repl.removed);
        forget_before(&mut m, batch_no);
        self.repl.removed_len.store(m.weight(), Ordering::Release);
    }

    /// Remove `key`'s item if it is older than the tombstone (version `ver`), and log the
    /// tombstone (for this engine's own replicas).
    pub(in crate::log) fn apply_tombstone(&self, key: &[u8], ver: Version) {
        self.cas.observe(ver.0);
        self.write_tombstone(key, self.hash(key), Some(ver));
    }

    /// Drop every item (a full sync starts from nothing).
    pub(in crate::log) fn wipe(&self) {
        self.for_each_indexed(|slot, v| {
            let mut fetch = crate::log::flash::Fetch::default();
            // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
            let (len, size) = unsafe { self.rec_any(v, &mut fetch) }
                .map_or((0, 0), |r| (r.len, self.rec_size(&r)));
            slot.store(0);
            self.account_remove(v, len, size);
        });
        // Nothing is kept for replicas of this engine: what it dropped must not be
        // shipped to them any more (they resynchronize).
        self.free_dead_segments(&Holds::new(), &Holds::new());
        // Replicas of this engine resynchronize too: the drops above are in no log, so
        // a replica whose cursor is still valid here (segments still open) would keep
        // them. Every cursor made so far has `below` at most the next sequence number;
        // skipping a number makes every cursor made from here on start above it.
        let mut order = self.order.lock();
        let floor = order.skip();
        self.repl.wiped_below.store(floor, Ordering::SeqCst);
    }

    /// Whether cursor `c` was made before this engine's last wipe (see `wiped_below`).
    pub(in crate::log) fn before_wipe(&self, c: &Cursor) -> bool {
        c.below < self.repl.wiped_below.load(Ordering::SeqCst)
    }
}
