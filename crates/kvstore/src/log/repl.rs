//! Log shipping: what a master serves from its log and how a replica applies it.
//!
//! A replica pulls; the master does no work per write for it (beyond logging a tombstone
//! for a delete of an absent key once a replica has pulled, see below). Each pull carries
//! the replica's *cursor* (where it is in the master's log) and is answered with one
//! *batch*; both are byte strings in this module's format (`FORMAT.md`, "Replication"),
//! carried opaquely by the server.
//!
//! * **Position.** Every segment gets a sequence number when it opens (`seg_seq`). The
//!   cursor is `below` (every segment numbered below it was consumed completely or is
//!   gone) and, for segments at or above it, how many bytes were consumed and whether
//!   the segment is complete (sealed and consumed to its end).
//! * **Tail.** The master ships, for each live segment at or above `below`, the
//!   published records after the replica's offset, verbatim, up to a byte budget. If a
//!   segment the replica had not finished is gone (evicted), the replica fell behind the
//!   retained log: the master answers with a reset and the replica resynchronizes. A
//!   segment the maintenance pass freed while a known replica still needed it (expired
//!   whole or dead, past the backlog) is the exception: the master logged anew what a
//!   replica skipping it would miss (`relog_for_skip`), and tells the replica it is
//!   complete (an empty chunk).
//! * **Full sync.** A new replica (or one after a reset) gets a *reset* batch holding a
//!   starting cursor (the open segments and their lengths, and `below` = the next
//!   sequence number), then a snapshot of the live items of every segment below that
//!   cursor, walked segment by segment (resumable), then follows the tail from the
//!   starting cursor. Items written meanwhile may arrive twice; versions decide. The
//!   starting cursor is not one instant of the whole log (each segment's length is read
//!   in turn), so a record just after it may be older than a tombstone just before it:
//!   that is why the snapshot also carries the tombstones of the segments that were open
//!   when the cursor was taken (all of them are in it), which the replica remembers as it
//!   does the tail's. A tombstone of a segment sealed before then needs no shipping: a
//!   key's records and tombstones are published under its stripe lock in version order,
//!   so every older record of its key is below the cursor, where only indexed items are
//!   shipped.
//! * **Switch.** A replica keeps checkpoints: after each tail batch it applies, its position
//!   in the upstream log and its own log's position. A fellow replica of the same upstream
//!   that asks it (after a promotion, or to chain) with a cursor it has all of gets a switch
//!   batch: its new cursor in this engine's log, from the latest checkpoint at or below its
//!   upstream position. Records it already has come again and lose on version. A replica
//!   ahead of this engine (writes it never got) gets a full sync instead.
//! * **Chains.** A replica's own log can be served to replicas of its own. When it
//!   resynchronizes, it drops its items without logging a tombstone for each, so every
//!   cursor into its log from before then is answered with a reset.
//! * **Versions.** A replica stores each item with the master's CAS and rewrite stamp and
//!   keeps the record with the highest (CAS, stamp), so records may be applied in any
//!   order. A tombstone has a version too and removes the key's item if the item's is
//!   lower (`Version`). Because the segments are read one after another, a tombstone can
//!   arrive before the older item it deletes (in another segment); the replica remembers
//!   tombstones until a batch that was not cut short by the budget has been applied after
//!   them (by then every record published before the tombstone has been shipped). It
//!   remembers in the same way the versions of items it removes on its own (expired, or
//!   evicted for lack of memory), so that an older copy arriving later does not bring
//!   them back.
//! * **Flush, expiry, eviction.** Every batch carries the master's flush watermarks;
//!   items keep their absolute expiry. The master decides evictions: once a replica has
//!   pulled, every eviction is noted and logged as a tombstone for the evicted record
//!   (its CAS and its stamp + 1, so a newer copy of the same item survives it; written
//!   outside eviction's locks, by `maintain` or before a pull is served), and every
//!   delete is logged, hit or miss. A replica with less memory than its master also
//!   evicts on its own, and logs those evictions in the same way for its own replicas.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::format::{
    self, Rec, HDR_MAX, KIND_ITEM, KIND_TOMBSTONE, META_BINARY_KEY, META_STALE, SEG_HDR,
};
use super::{index, lock, tid, Commit, Cond, LogEngine, MetaW, Src, Vis};
use crate::Time;

mod snapshot;
pub use snapshot::{
    join_snapshot_frames, split_snapshot_frames, SnapshotError, SnapshotInfo, SnapshotSettings,
    SNAPSHOT_VERSION,
};

const CURSOR_MAGIC: [u8; 4] = *b"KVRC";
const BATCH_MAGIC: [u8; 4] = *b"KVRB";
const VERSION: u8 = 1;
/// Most segment entries a cursor may carry.
const MAX_ENTRIES: usize = 1 << 16;
/// Tombstones a replica remembers at most. Beyond, those of earlier batches are forgotten
/// (the oldest), and the current batch's are kept; all of them only if the current batch
/// alone has this many. A tombstone is needed only until a complete batch has been
/// applied after it, so the map grows only during a catch-up of budget-limited batches.
/// One forgotten before then leaves a floor behind ([`Remembered`]): until that complete
/// batch, an arriving item at or below the highest version forgotten is dropped (a miss),
/// since it may be older than a forgotten tombstone of its key (a deleted item back).
const MAX_TOMBS: usize = if cfg!(test) { 8 } else { 1 << 20 };

const KIND_TAIL: u8 = 0;
const KIND_SNAPSHOT: u8 = 1;
const KIND_RESET: u8 = 2;
const KIND_SWITCH: u8 = 3;
/// Batch flag: nothing was left out for lack of budget.
const FLAG_COMPLETE: u8 = 1;
/// Batch flag (snapshot): the snapshot is finished; follow the tail next.
const FLAG_DONE: u8 = 2;
/// Chunk flag: the segment is sealed and shipped to its end.
const CHUNK_COMPLETE: u8 = 1;

/// Offsets of fields in a batch header.
const B_FLAGS: usize = 6;
const BATCH_HDR: usize = 8 + 8 + 8 + 8 + 4 + 8;

/// The engine's replication switches.
#[derive(Default)]
pub(super) struct ReplFlags {
    /// This engine follows a master (copies forward keep the master's stamps).
    pub(super) replica: AtomicBool,
    /// A replica has pulled from this engine: deletes of absent keys are logged too.
    pub(super) active: AtomicBool,
    /// While following (and after a promotion): where this engine's own log stood after
    /// each tail batch it applied, with its position in the upstream log then. Lets a
    /// replica of the same upstream switch to this engine without a full sync.
    checkpoints: std::sync::Mutex<std::collections::VecDeque<Checkpoint>>,
    /// Items evicted since replicas attached, (key, version), waiting to be logged as
    /// tombstones (eviction runs under locks a log append cannot take).
    evicted: std::sync::Mutex<EvictionNotes>,
    /// Per replica served with [`LogEngine::repl_serve_as`] (at most `MAX_HOLDS`), its
    /// position: the maintenance pass keeps the dead and expired segments it has not
    /// read instead of freeing them (see `held_segments`).
    pub(super) holds: std::sync::Mutex<Holds>,
    /// Segments kept for replicas at the last maintenance pass.
    pub(super) held: AtomicU64,
    /// The most bytes of segments kept for replicas (`set_repl_backlog`); 0: the default,
    /// `1 / HOLD_SHARE` of the memory limit.
    pub(super) backlog: std::sync::atomic::AtomicUsize,
    /// Maintenance passes that freed segments a replica still needed, because keeping
    /// them would have taken more than the backlog (`repl_backlog`).
    pub(super) hold_dropped: AtomicU64,
    /// Sequence numbers of segments the maintenance pass freed while a replica of `holds`
    /// still needed them, after logging anew what a replica could miss by skipping them
    /// (`relog_for_skip`): a cursor that still needs one is told it is complete instead of
    /// getting a reset. Kept while some replica of `holds` may still need them, at most
    /// `MAX_SKIPPABLE`.
    skippable: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    /// Segments added to `skippable` so far.
    pub(super) relogged: AtomicU64,
    /// Cursors whose `below` is under this number predate this engine's last full sync as
    /// a replica (`wipe`), which replaced its items without logging what it dropped: their
    /// replicas hold what this engine no longer has, so they get a reset, not the tail.
    wiped_below: AtomicU64,
    /// On a replica: the items it removed on its own (expired, flushed or evicted here,
    /// not by a tombstone of its master), key → (version, `epoch` when removed). Records
    /// arrive out of order, so an older version of such an item may still come; it must
    /// lose as it would have to the removed one. Kept as tombstones are: until a batch
    /// that was not cut short has been applied after the removal.
    removed: std::sync::Mutex<Remembered>,
    /// Entries in `removed`, plus one while it has a floor (read without its lock on every
    /// applied item: 0 when it can drop nothing).
    removed_len: std::sync::atomic::AtomicUsize,
    /// On a replica: this engine's own log position just after it applied the last tail
    /// batch that was not cut short (None before the first, and after a full sync
    /// starts). Every record below it came with that batch or an earlier one, so every
    /// older record of its key has arrived: removing it needs no entry in `removed`.
    settled: std::sync::Mutex<Option<Cursor>>,
    /// On a replica: the number of the batch being applied (or last applied).
    epoch: AtomicU64,
}

/// By default at most this share (1 / n) of the memory limit is kept in dead or expired
/// segments for replicas that have not read them yet (`set_repl_backlog` changes it).
pub(super) const HOLD_SHARE: usize = 16;
/// Replicas' names and positions, for [`held_for_replica`].
pub(super) type Holds = Vec<(Box<str>, Cursor)>;
/// Replicas whose positions are kept at most (others are served, not held for).
const MAX_HOLDS: usize = 64;

/// Evictions waiting to be logged at most; beyond, replicas keep those items (counted).
const MAX_PENDING_EVICTIONS: usize = 1 << 20;
/// Freed segments a cursor may skip, remembered at most (beyond, a replica that needed a
/// segment freed then gets a full sync, as before there were skips).
const MAX_SKIPPABLE: usize = 1 << 16;
/// Skipped segments one tail batch tells a replica of at most (the rest in the next).
const MAX_SKIPS_PER_BATCH: usize = 4096;

/// This engine's own log position (`own`) when its position in the upstream log was
/// `upstream`: every upstream record up to `upstream` is in the own log up to `own`.
struct Checkpoint {
    upstream: Cursor,
    own: Cursor,
}

/// Why a replica gets a full sync ([`Served::reset_why`]).
pub const WHY_FRESH: &str = "it asked for one (a new replica, or one of another log)";
pub const WHY_CURSOR: &str = "its position could not be read";
pub const WHY_WIPED: &str = "this server resynchronized since (its position predates that)";
pub const WHY_UNFINISHED_GONE: &str = "a segment it had not finished was freed or evicted";
pub const WHY_UNREAD_GONE: &str = "segments it had not read were freed or evicted";
pub const WHY_IMPOSSIBLE: &str = "its position is beyond this server's log";

/// Checkpoints kept (one per tail batch that brought records).
const CHECKPOINTS: usize = 4096;

/// What a master did for one pull.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Log bytes the replica has not received yet, after this batch (tail), or the bytes
    /// of the live segments (during a full sync).
    pub lag_bytes: u64,
    /// Bytes of records put into the batch.
    pub shipped: usize,
    /// The batch starts a full sync (new replica, or it fell behind the retained log).
    pub reset: bool,
    /// Why it does (with `reset`), for the server's log: one of the `WHY_` constants.
    pub reset_why: &'static str,
    /// The replica is in the snapshot of a full sync.
    pub snapshot: bool,
    /// The replica followed this engine's upstream and continues here without a full
    /// sync (a switch batch).
    pub switched: bool,
    /// This engine's log offset when the batch was made ([`LogEngine::log_offset`]).
    pub log_offset: u64,
}

/// What a replica did with one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Records applied (stored or found older than what the replica has).
    pub records: u64,
    /// Bytes of records received.
    pub bytes: u64,
    /// The batch started a full sync.
    pub reset: bool,
    /// The master had nothing new (a tail batch without records).
    pub idle: bool,
    /// The replica switched to the master's own log without a full sync.
    pub switched: bool,
    /// The master's log offset when it served the batch.
    pub master_offset: u64,
}

/// A batch or cursor that does not follow the format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplError(pub &'static str);

impl std::fmt::Display for ReplError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing yet: the next pull asks for a full sync.
    Fresh,
    /// In the snapshot, at this segment and offset.
    Snapshot { seq: u64, off: u32 },
    /// Following the log.
    Tail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pos {
    off: u32,
    complete: bool,
}

/// A replica's position in its master's log, and what it needs to apply batches in any
/// order. Owned by the thread that pulls.
#[derive(Debug, Clone)]
pub struct ReplicaState {
    phase: Phase,
    below: u64,
    entries: BTreeMap<u64, Pos>,
    /// Recent tombstones: key → (version, batch number it arrived in).
    tombs: Remembered,
    batches: u64,
    /// Record bytes received since the last full sync started.
    pub applied_bytes: u64,
    /// Full syncs started.
    pub full_syncs: u64,
}

impl Default for ReplicaState {
    fn default() -> Self {
        ReplicaState::new()
    }
}

impl ReplicaState {
    /// A replica that has nothing yet.
    pub fn new() -> ReplicaState {
        ReplicaState {
            phase: Phase::Fresh,
            below: 0,
            entries: BTreeMap::new(),
            tombs: Remembered::default(),
            batches: 0,
            applied_bytes: 0,
            full_syncs: 0,
        }
    }

    /// Forget the position: the next pull asks for a full sync.
    pub fn restart(&mut self) {
        self.phase = Phase::Fresh;
        self.below = 0;
        self.entries.clear();
        self.tombs.clear();
    }

    /// True until a full sync has started.
    pub fn is_fresh(&self) -> bool {
        self.phase == Phase::Fresh
    }

    /// `"none"`, `"snapshot"` or `"tail"`.
    pub fn phase(&self) -> &'static str {
        match self.phase {
            Phase::Fresh => "none",
            Phase::Snapshot { .. } => "snapshot",
            Phase::Tail => "tail",
        }
    }

    /// The cursor to send with the next pull.
    pub fn cursor(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&CURSOR_MAGIC);
        let (phase, seq, off) = match self.phase {
            Phase::Fresh => (0u8, 0, 0),
            Phase::Snapshot { seq, off } => (1, seq, off),
            Phase::Tail => (2, 0, 0),
        };
        out.push(phase);
        out.extend_from_slice(&self.below.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
        let n = self.entries.len().min(MAX_ENTRIES);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        for (seq, p) in self.entries.iter().take(n) {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&p.off.to_le_bytes());
            out.push(u8::from(p.complete));
        }
    }

    /// Forget complete segments below `below` and move `below` past complete ones.
    /// (Entries below `below` that are not complete are segments that were open when a
    /// full sync started: the tail continues them.)
    fn advance(&mut self) {
        let below = self.below;
        self.entries.retain(|&seq, p| !(p.complete && seq < below));
        while let Some(p) = self.entries.get(&self.below) {
            if !p.complete {
                return;
            }
            self.entries.remove(&self.below);
            self.below += 1;
        }
    }
}

/// A cursor as the master reads it.
#[derive(Debug, Clone)]
pub(super) struct Cursor {
    phase: Phase,
    below: u64,
    /// Sorted by sequence number (checked).
    entries: Vec<(u64, Pos)>,
}

impl Cursor {
    fn decode(b: &[u8]) -> Result<Cursor, ReplError> {
        let mut r = Reader(b);
        if r.take(4)? != CURSOR_MAGIC {
            return Err(ReplError("bad cursor magic"));
        }
        let phase = r.u8()?;
        let below = r.u64()?;
        let seq = r.u64()?;
        let off = r.u32()?;
        let phase = match phase {
            0 => Phase::Fresh,
            1 => Phase::Snapshot { seq, off },
            2 => Phase::Tail,
            _ => return Err(ReplError("bad cursor phase")),
        };
        let n = r.u32()? as usize;
        if n > MAX_ENTRIES || r.0.len() != n * 13 {
            return Err(ReplError("bad cursor length"));
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let seq = r.u64()?;
            let off = r.u32()?;
            let complete = r.u8()? != 0;
            if entries.last().is_some_and(|&(last, _)| last >= seq) {
                return Err(ReplError("cursor entries out of order"));
            }
            entries.push((seq, Pos { off, complete }));
        }
        Ok(Cursor {
            phase,
            below,
            entries,
        })
    }

    /// Bytes of segment `seq` the cursor covers (`u64::MAX`: all of it).
    fn consumed(&self, seq: u64) -> u64 {
        match self.get(seq) {
            Some(p) if p.complete => u64::MAX,
            Some(p) => u64::from(p.off),
            None if seq < self.below => u64::MAX,
            None => 0,
        }
    }

    /// Whether everything `self` covers, `other` covers too (same log). False when the
    /// comparison would be too long to make.
    fn within(&self, other: &Cursor) -> bool {
        let (lo, hi) = (self.below.min(other.below), self.below.max(other.below));
        if hi - lo > 1 << 20 {
            return false;
        }
        self.entries
            .iter()
            .chain(&other.entries)
            .map(|&(s, _)| s)
            .chain(lo..hi)
            .all(|seq| self.consumed(seq) <= other.consumed(seq))
    }

    fn from_state(st: &ReplicaState) -> Cursor {
        Cursor {
            phase: Phase::Tail,
            below: st.below,
            entries: st.entries.iter().map(|(&s, &p)| (s, p)).collect(),
        }
    }

    /// Whether the byte at `off` of segment `seq` is below this position (a tail
    /// position: every segment below `below` done, listed ones up to their offset).
    fn has(&self, seq: u64, off: usize) -> bool {
        seq < self.below && self.get(seq).is_none_or(|p| off < p.off as usize)
    }

    fn get(&self, seq: u64) -> Option<Pos> {
        self.entries
            .binary_search_by_key(&seq, |&(s, _)| s)
            .ok()
            .and_then(|i| self.entries.get(i))
            .map(|&(_, p)| p)
    }
}

/// A bounds-checked little-endian reader over hostile bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ReplError> {
        if self.0.len() < n {
            return Err(ReplError("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, ReplError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, ReplError> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, ReplError> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

fn put_chunk_header(out: &mut Vec<u8>, seq: u64, base: u64, start: u32, end: u32, flags: u8) {
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&base.to_le_bytes());
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&end.to_le_bytes());
    out.push(flags);
    // Data length, patched when the chunk is finished.
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// Chunk header: seq, base, start, end, flags, data length.
const CHUNK_HDR: usize = 8 + 8 + 4 + 4 + 1 + 4;

/// An empty chunk that completes segment `seq` where a replica at `pos` in it stands: the
/// segment was freed, and what the replica could miss by skipping it was logged anew.
fn skip_chunk(out: &mut Vec<u8>, seq: u64, pos: Option<Pos>) {
    let at = pos.map_or(SEG_HDR as u32, |p| p.off.max(SEG_HDR as u32));
    let chunk = out.len();
    put_chunk_header(out, seq, 0, at, at, CHUNK_COMPLETE);
    finish_chunk(out, chunk);
}

fn finish_chunk(out: &mut [u8], at: usize) {
    let len = (out.len() - at - CHUNK_HDR) as u32;
    if let Some(d) = out.get_mut(at + CHUNK_HDR - 4..at + CHUNK_HDR) {
        d.copy_from_slice(&len.to_le_bytes());
    }
}

/// Master side.
impl LogEngine {
    /// Whether the index points `key` at the record at `off` in segment `id` (the record
    /// is the key's current one, not an overwritten copy).
    fn indexed_at(&self, key: &[u8], id: u32, off: usize) -> bool {
        self.index
            .find(self.hash(key), |v| {
                index::slot_seg(v) == id && index::slot_off(v) == off
            })
            .is_some()
    }

    /// Live segments as (sequence number, id), in sequence order.
    fn live_segments(&self) -> Vec<(u64, u32)> {
        lock(&self.seq_lock).clone()
    }

    /// The next segment number and the live segments, read together under `seq_lock`:
    /// every number below the first is live (in the list) or retired.
    fn numbered_segments(&self) -> (u64, Vec<(u64, u32)>) {
        let live = lock(&self.seq_lock);
        (self.seg_seq.load(Ordering::SeqCst), live.clone())
    }

    /// A digest of the live items at `now`: their count and the sum (mod 2^128) of each
    /// item's MD5 over its key, client flags, expiry, CAS unique and value. The sum does not
    /// depend on the order items are visited or where they live, so two engines holding the
    /// same items give the same digest whatever their segments, index size or history. Index
    /// growth waits while it runs; concurrent writes may or may not be seen (take it when
    /// writes have stopped, as a consistency check).
    pub fn digest(&self, now: Time) -> Digest {
        use md5::Digest as _;
        let _grow = lock(&self.grow_lock);
        let mut d = Digest::default();
        for b in 0..self.index.nmain() {
            let _g = self.index.lock_bucket(b);
            self.index.for_each_in_chain(b, |_, v| {
                // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
                let Some(r) = (unsafe { self.rec(v) }) else {
                    return;
                };
                if r.kind != KIND_ITEM || self.vis(&r, now) != Vis::Live {
                    return;
                }
                let mut h = md5::Md5::new();
                h.update((r.key.len() as u32).to_le_bytes());
                h.update(r.key);
                h.update(r.flags.to_le_bytes());
                h.update(r.exptime.to_le_bytes());
                h.update(self.rec_cas(&r).to_le_bytes());
                h.update((r.value.len() as u64).to_le_bytes());
                h.update(r.value);
                let sum: [u8; 16] = h.finalize().into();
                d.items += 1;
                d.sum = d.sum.wrapping_add(u128::from_le_bytes(sum));
            });
        }
        d
    }

    /// Call `f` for each live item in up to `buckets` index buckets starting at bucket
    /// `from`; returns the bucket to continue from, or `None` once every bucket has been
    /// visited. Each call holds one bucket's lock at a time, and keeps the index from
    /// growing until it returns, so a scan in many short calls does not stop the server.
    ///
    /// An item that stays live and in place throughout a scan of many calls is seen once.
    /// If the index grows between calls, items of buckets already visited can move to
    /// buckets not yet visited and be seen again; an item in a bucket not yet visited only
    /// moves to another such bucket, so none is missed.
    pub fn scan(
        &self,
        from: usize,
        buckets: usize,
        now: Time,
        f: &mut dyn FnMut(crate::ScanItem<'_>),
    ) -> Option<usize> {
        let _grow = lock(&self.grow_lock);
        let nmain = self.index.nmain();
        let end = from.saturating_add(buckets.max(1)).min(nmain);
        for b in from..end {
            let _g = self.index.lock_bucket(b);
            self.index.for_each_in_chain(b, |slot, v| {
                // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
                let Some(r) = (unsafe { self.rec(v) }) else {
                    return;
                };
                if r.kind != KIND_ITEM || self.vis(&r, now) != Vis::Live {
                    return;
                }
                f(crate::ScanItem {
                    key: r.key,
                    meta: self.describe(slot, &r, v, now),
                });
            });
        }
        (end < nmain).then_some(end)
    }

    /// Bytes written to the log so far: a replication offset that only grows.
    pub fn log_offset(&self) -> u64 {
        let live: u64 = (0..self.seg_ids())
            .filter_map(|id| self.segs.get(id))
            .filter(|s| s.mem.0.seq.load(Ordering::Acquire) != 0)
            .map(|s| s.mem.0.used.load(Ordering::Acquire) as u64)
            .sum();
        self.retired_bytes.load(Ordering::Relaxed) + live
    }

    /// Write a batch header; returns where it starts and the log offset it carries.
    fn batch_header(&self, kind: u8, out: &mut Vec<u8>) -> (usize, u64) {
        let at = out.len();
        out.extend_from_slice(&BATCH_MAGIC);
        out.push(VERSION);
        out.push(kind);
        out.push(0);
        out.push(0);
        out.extend_from_slice(&self.seg_seq.load(Ordering::SeqCst).to_le_bytes());
        out.extend_from_slice(&self.flush_mark.load(Ordering::SeqCst).to_le_bytes());
        out.extend_from_slice(&self.delayed_mark.load(Ordering::SeqCst).to_le_bytes());
        out.extend_from_slice(&self.cas.reserved().to_le_bytes());
        out.extend_from_slice(&self.flush_deadline.load(Ordering::Acquire).to_le_bytes());
        let offset = self.log_offset();
        out.extend_from_slice(&offset.to_le_bytes());
        (at, offset)
    }

    /// Serve one pull: append a batch for `cursor` to `out`, with about `budget` bytes
    /// of records at most (one record more than the budget may go in, so that progress
    /// is always made). `fresh` forces a full sync (the replica followed another log),
    /// unless `upstream` says that other log is the one this engine follows (or followed
    /// before it was promoted) and this engine has everything the replica has: then the
    /// replica switches to this engine's log without a full sync.
    pub fn repl_serve(
        &self,
        cursor: &[u8],
        fresh: bool,
        upstream: bool,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> Served {
        self.repl_serve_as(None, cursor, fresh, upstream, budget, out)
    }

    /// [`LogEngine::repl_serve`] for the replica a server knows as `replica`: what it has
    /// not read yet is kept from the maintenance pass until it has (see
    /// [`LogEngine::repl_hold`]).
    pub fn repl_serve_as(
        &self,
        replica: Option<&str>,
        cursor: &[u8],
        fresh: bool,
        upstream: bool,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> Served {
        self.repl.active.store(true, Ordering::SeqCst);
        self.repl_log_evictions();
        let (served, needs) = self.serve_for(cursor, fresh, upstream, budget, out);
        if let Some(name) = replica {
            let mut holds = lock(&self.repl.holds);
            if let Some(h) = holds.iter_mut().find(|h| &*h.0 == name) {
                h.1 = needs;
            } else if holds.len() < MAX_HOLDS {
                holds.push((name.into(), needs));
            }
        }
        served
    }

    /// The batch for one pull, and the position whose unread segments the replica needs
    /// next (where it was, or where a reset or switch batch moves it).
    fn serve_for(
        &self,
        cursor: &[u8],
        fresh: bool,
        upstream: bool,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> (Served, Cursor) {
        if fresh && upstream {
            if let Some(switched) = Cursor::decode(cursor)
                .ok()
                .filter(|c| c.phase == Phase::Tail)
                .and_then(|c| self.serve_switch(&c, out))
            {
                return switched;
            }
        }
        let cur = if fresh {
            Err(WHY_FRESH)
        } else {
            Cursor::decode(cursor).map_err(|_| WHY_CURSOR)
        };
        let why = match cur {
            Ok(c) if c.phase == Phase::Tail => {
                let mark = out.len();
                match self.serve_tail(&c, budget, out) {
                    Ok(s) => return (s, c),
                    Err(why) => {
                        out.truncate(mark);
                        why
                    }
                }
            }
            Ok(c) if matches!(c.phase, Phase::Snapshot { .. }) => {
                if self.before_wipe(&c) {
                    WHY_WIPED
                } else {
                    return (self.serve_snapshot(&c, budget, out).0, c);
                }
            }
            Ok(_) => WHY_FRESH,
            Err(why) => why,
        };
        let (mut served, c) = self.serve_reset_cursor(out);
        served.reset_why = why;
        (served, c)
    }

    /// Keep holding what the replicas `keep` chooses have not read (those a server still
    /// expects back), and stop for the others. Served with [`LogEngine::repl_serve_as`], a
    /// replica's unread segments are kept from the maintenance pass, which would free
    /// them once all their items are dead or expired. A replica that stops pulling for a
    /// while (a pause, a brief network cut) then continues from its cursor instead of a
    /// full sync, even where items with short times to live expired meanwhile and took
    /// whole segments with them. Only the maintenance pass waits: eviction and
    /// compaction, which free memory a write needs, do not; and at most the backlog
    /// ([`LogEngine::set_repl_backlog`]) is kept so.
    pub fn repl_hold(&self, keep: impl Fn(&str) -> bool) {
        lock(&self.repl.holds).retain(|h| keep(&h.0));
    }

    /// The most memory the maintenance pass keeps in dead or expired segments for
    /// replicas that have not read them ([`LogEngine::repl_hold`]), in bytes; 0 restores
    /// the default, a sixteenth of the memory limit. Held segments are part of the memory
    /// limit, so a larger backlog leaves less for items while a replica lags; eviction
    /// never waits for it.
    pub fn set_repl_backlog(&self, bytes: usize) {
        self.repl.backlog.store(bytes, Ordering::Relaxed);
    }

    /// The backlog in force (see [`LogEngine::set_repl_backlog`]).
    pub fn repl_backlog(&self) -> usize {
        match self.repl.backlog.load(Ordering::Relaxed) {
            0 => self.max_bytes.load(Ordering::Relaxed) / HOLD_SHARE,
            b => b,
        }
    }

    /// Segments kept for replicas at the last maintenance pass, and how many passes had to
    /// free segments a replica still needed (see [`LogEngine::repl_hold`]).
    pub fn repl_hold_stats(&self) -> (u64, u64) {
        (
            self.repl.held.load(Ordering::Relaxed),
            self.repl.hold_dropped.load(Ordering::Relaxed),
        )
    }

    /// Segments the maintenance pass freed before a replica had read them, after logging
    /// anew what it would miss by skipping them, so that it skipped them instead of
    /// resynchronizing fully (`relog_for_skip`), since the engine started.
    pub fn repl_relogged_segments(&self) -> u64 {
        self.repl.relogged.load(Ordering::Relaxed)
    }

    /// A switch batch for a replica at `c` in this engine's upstream log, or None if this
    /// engine lacks some of what the replica has (it must resynchronize).
    fn serve_switch(&self, c: &Cursor, out: &mut Vec<u8>) -> Option<(Served, Cursor)> {
        let own = {
            let cps = lock(&self.repl.checkpoints);
            if !c.within(&cps.back()?.upstream) {
                return None;
            }
            cps.iter()
                .rev()
                .find(|cp| cp.upstream.within(c))?
                .own
                .clone()
        };
        let (at, log_offset) = self.batch_header(KIND_SWITCH, out);
        out.extend_from_slice(&own.below.to_le_bytes());
        out.extend_from_slice(&(own.entries.len() as u32).to_le_bytes());
        for &(seq, p) in &own.entries {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&p.off.to_le_bytes());
        }
        if let Some(f) = out.get_mut(at + B_FLAGS) {
            *f = FLAG_COMPLETE;
        }
        let served = Served {
            switched: true,
            log_offset,
            ..Served::default()
        };
        Some((served, own))
    }

    /// Where this engine's own log stands: every segment below the next number done,
    /// open ones at their length. Only the open segments are looked at (`open_segs`), not
    /// every live one: a replica takes this after each batch it applies.
    pub(super) fn own_position(&self) -> Cursor {
        let (next, open) = {
            let _live = lock(&self.seq_lock);
            let next = self.seg_seq.load(Ordering::SeqCst);
            (next, lock(&self.open_segs).clone())
        };
        let mut entries = Vec::new();
        for &(seq, id) in &open {
            let Some(seg) = self.segs.get(id) else {
                continue;
            };
            let sealed = seg.mem.0.sealed.load(Ordering::Acquire);
            let used = seg.mem.0.used.load(Ordering::Acquire);
            if !sealed && seg.mem.0.seq.load(Ordering::Acquire) == seq {
                entries.push((
                    seq,
                    Pos {
                        off: used as u32,
                        complete: false,
                    },
                ));
            }
        }
        Cursor {
            phase: Phase::Tail,
            below: next,
            entries,
        }
    }

    /// A reset batch, and the snapshot cursor it announces.
    fn serve_reset_cursor(&self, out: &mut Vec<u8>) -> (Served, Cursor) {
        let (next, live) = self.numbered_segments();
        let (at, log_offset) = self.batch_header(KIND_RESET, out);
        // First which segments are open, then (a second pass) their lengths. Every segment
        // open when the first length is read is then in the cursor, even one sealed before
        // its own length is read; the snapshot ships tombstones of these segments only
        // (see `serve_snapshot`).
        let unsealed: Vec<bool> = live
            .iter()
            .map(|&(_, id)| {
                self.segs
                    .get(id)
                    .is_some_and(|seg| !seg.mem.0.sealed.load(Ordering::Acquire))
            })
            .collect();
        let mut open = Vec::new();
        let mut lag = 0;
        for (&(seq, id), &unsealed) in live.iter().zip(&unsealed) {
            let Some(seg) = self.segs.get(id) else {
                continue;
            };
            let used = seg.mem.0.used.load(Ordering::Acquire);
            if seg.mem.0.seq.load(Ordering::Acquire) != seq {
                continue;
            }
            lag += used as u64;
            if unsealed {
                open.push((seq, used as u32));
            }
        }
        out.extend_from_slice(&next.to_le_bytes());
        out.extend_from_slice(&(open.len() as u32).to_le_bytes());
        for &(seq, used) in &open {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&used.to_le_bytes());
        }
        if let Some(f) = out.get_mut(at + B_FLAGS) {
            *f = FLAG_COMPLETE;
        }
        let served = Served {
            lag_bytes: lag,
            shipped: 0,
            reset: true,
            reset_why: WHY_FRESH,
            snapshot: true,
            switched: false,
            log_offset,
        };
        let cursor = Cursor {
            phase: Phase::Snapshot { seq: 0, off: 0 },
            below: next,
            entries: open
                .into_iter()
                .map(|(seq, off)| {
                    (
                        seq,
                        Pos {
                            off,
                            complete: false,
                        },
                    )
                })
                .collect(),
        };
        (served, cursor)
    }

    /// A snapshot batch for `c`, and the position after it (None: the snapshot is done).
    fn serve_snapshot(
        &self,
        c: &Cursor,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> (Served, Option<(u64, u32)>) {
        let Phase::Snapshot {
            seq: from_seq,
            off: from_off,
        } = c.phase
        else {
            let mut served = self.serve_reset_cursor(out).0;
            served.reset_why = WHY_CURSOR;
            return (served, None);
        };
        let live = self.live_segments();
        let (at, log_offset) = self.batch_header(KIND_SNAPSHOT, out);
        let pos_at = out.len();
        out.extend_from_slice(&from_seq.to_le_bytes());
        out.extend_from_slice(&from_off.to_le_bytes());
        let now = self.clock.load(Ordering::Relaxed);
        let mut shipped = 0;
        let mut lag = 0u64;
        let mut next_pos = None;
        let _pin = self.pin();
        for &(seq, id) in live.iter().filter(|&&(s, _)| s >= from_seq && s < c.below) {
            let Some(seg) = self.segs.get(id) else {
                continue;
            };
            if seg.mem.0.seq.load(Ordering::Acquire) != seq {
                continue;
            }
            let used = seg.mem.0.used.load(Ordering::Acquire);
            let at_start = c.get(seq);
            let in_cursor = at_start.is_some();
            let limit = at_start.map_or(used, |p| (p.off as usize).min(used));
            let start = if seq == from_seq {
                (from_off as usize).max(SEG_HDR)
            } else {
                SEG_HDR
            };
            lag += limit.saturating_sub(start) as u64;
            if next_pos.is_some() || start >= limit {
                continue;
            }
            let Some(ptr) = std::ptr::NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire)) else {
                continue;
            };
            // SAFETY: pinned, and the segment is still live (its number did not change
            // since the pin was taken), so it is not reused before we unpin.
            let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
            let chunk = out.len();
            put_chunk_header(out, seq, base, start as u32, 0, 0);
            let mut off = start;
            while off < limit {
                if shipped >= budget {
                    next_pos = Some((seq, off as u32));
                    break;
                }
                // SAFETY: as above; `limit <= used`, the published length.
                let Some(r) = (unsafe { format::read(ptr.as_ptr(), limit, off, base) }) else {
                    break;
                };
                let here = off;
                off += r.len;
                // Live items, and the tombstones of the segments open when the starting
                // cursor was taken. That cursor is not one instant of every segment (each
                // length is read in turn), so a record after it in the tail may be older
                // than a tombstone before it; such a tombstone was published after the
                // first length was read, so in a segment open then, which the cursor lists
                // (`serve_reset_cursor`). A key's records and tombstones are published
                // under its stripe lock in version order, so a tombstone in a segment
                // sealed before that has every older record of its key below the cursor,
                // where the snapshot ships only what is still indexed. The replica
                // remembers the tombstones shipped until it has applied a tail batch that
                // was not cut short (by then every such record has arrived), as it does
                // tail tombstones.
                let ship = match r.kind {
                    KIND_TOMBSTONE => in_cursor,
                    KIND_ITEM => self.vis(&r, now) == Vis::Live && self.indexed_at(r.key, id, here),
                    _ => false,
                };
                if ship {
                    // SAFETY: `here .. here + r.len` is the published record just read.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(ptr.as_ptr().add(here), r.len) };
                    out.extend_from_slice(bytes);
                    shipped += r.len;
                }
            }
            let end = next_pos.map_or(limit, |(_, o)| o as usize);
            if let Some(e) = out.get_mut(chunk + 20..chunk + 24) {
                e.copy_from_slice(&(end as u32).to_le_bytes());
            }
            finish_chunk(out, chunk);
        }
        let (flags, (pseq, poff)) = match next_pos {
            Some(p) => (0, p),
            None => (FLAG_COMPLETE | FLAG_DONE, (c.below, 0)),
        };
        if let Some(f) = out.get_mut(at + B_FLAGS) {
            *f = flags;
        }
        if let Some(p) = out.get_mut(pos_at..pos_at + 12) {
            p[..8].copy_from_slice(&pseq.to_le_bytes());
            p[8..].copy_from_slice(&poff.to_le_bytes());
        }
        let served = Served {
            lag_bytes: lag,
            shipped,
            reset: false,
            reset_why: "",
            snapshot: true,
            switched: false,
            log_offset,
        };
        (served, next_pos)
    }

    /// The tail for `c`, or None if the replica fell behind the retained log, its cursor
    /// predates this engine's last full sync (`wiped_below`), or it sent an impossible
    /// cursor: it must resynchronize.
    fn serve_tail(
        &self,
        c: &Cursor,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> Result<Served, &'static str> {
        if self.before_wipe(c) {
            return Err(WHY_WIPED);
        }
        let (next, live) = self.numbered_segments();
        // Segments freed before the replica read them, whose records that it could miss
        // were logged anew (`relog_for_skip`): it may skip them. Read after the live list:
        // a segment retired in between was remembered here before it was retired.
        let skippable: Vec<u64> = {
            let low = c.entries.first().map_or(c.below, |&(s, _)| s.min(c.below));
            lock(&self.repl.skippable)
                .range(low..next)
                .copied()
                .collect()
        };
        let can_skip = |seq: u64| skippable.binary_search(&seq).is_ok();
        // Every segment numbered from `below` up to `next` must be live here, complete
        // there, or skippable; a partly consumed one must be live or skippable.
        let span = next.checked_sub(c.below).ok_or(WHY_IMPOSSIBLE)?;
        if span > (live.len() + c.entries.len() + skippable.len()) as u64 {
            return Err(WHY_UNREAD_GONE);
        }
        let is_live = |seq: u64| live.binary_search_by_key(&seq, |&(s, _)| s).is_ok();
        if c.entries
            .iter()
            .any(|&(seq, p)| !p.complete && !is_live(seq) && !can_skip(seq))
        {
            return Err(WHY_UNFINISHED_GONE);
        }
        let mut li = live.iter().peekable();
        for seq in c.below..next {
            while li.peek().is_some_and(|&&(s, _)| s < seq) {
                li.next();
            }
            let is_live = li.peek().is_some_and(|&&(s, _)| s == seq);
            let complete = c.get(seq).is_some_and(|p| p.complete);
            if !is_live && !complete && !can_skip(seq) {
                return Err(WHY_UNREAD_GONE);
            }
        }
        let (at, log_offset) = self.batch_header(KIND_TAIL, out);
        let mut shipped = 0;
        let mut lag = 0u64;
        let mut complete = true;
        // The skipped segments first: each as an empty chunk that completes it where the
        // replica stands in it.
        let mut skips = 0;
        for &seq in &skippable {
            let pos = c.get(seq);
            if is_live(seq) || pos.is_some_and(|p| p.complete) || (pos.is_none() && seq < c.below) {
                continue;
            }
            if skips == MAX_SKIPS_PER_BATCH {
                complete = false;
                break;
            }
            skip_chunk(out, seq, pos);
            skips += 1;
        }
        let _pin = self.pin();
        let wanted = live
            .iter()
            .filter(|&&(s, _)| s >= c.below || c.get(s).is_some_and(|p| !p.complete));
        for &(seq, id) in wanted {
            let pos = c.get(seq);
            if pos.is_some_and(|p| p.complete) {
                continue;
            }
            let seg = self.segs.get(id).ok_or(WHY_UNREAD_GONE)?;
            let sealed = seg.mem.0.sealed.load(Ordering::Acquire);
            let used = seg.mem.0.used.load(Ordering::Acquire);
            if seg.mem.0.seq.load(Ordering::Acquire) != seq {
                // Retired since the check: unless it was new to the replica, part of it
                // is lost, unless it may be skipped (remembered before it was retired).
                if lock(&self.repl.skippable).contains(&seq) {
                    skip_chunk(out, seq, pos);
                } else if pos.is_some() {
                    return Err(WHY_UNFINISHED_GONE);
                }
                continue;
            }
            let start = pos.map_or(SEG_HDR, |p| (p.off as usize).max(SEG_HDR));
            if start > used {
                return Err(WHY_IMPOSSIBLE);
            }
            if start == used && !sealed {
                continue;
            }
            let ptr = std::ptr::NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire))
                .ok_or(WHY_UNREAD_GONE)?;
            // SAFETY: pinned and still live, as in `serve_snapshot`.
            let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
            let mut end = start;
            if used - start <= budget.saturating_sub(shipped) {
                // All of it fits: `used` is published at a record's end, so no record
                // need be read to find where to cut.
                end = used;
                shipped += used - start;
            }
            while end < used && shipped < budget {
                // SAFETY: as above; `used` is the published length.
                let Some(r) = (unsafe { format::read(ptr.as_ptr(), used, end, base) }) else {
                    break;
                };
                end += r.len;
                shipped += r.len;
            }
            lag += (used - end) as u64;
            if end < used {
                complete = false;
            }
            if end == start && !(sealed && end == used) {
                continue;
            }
            let flags = if sealed && end == used {
                CHUNK_COMPLETE
            } else {
                0
            };
            let chunk = out.len();
            put_chunk_header(out, seq, base, start as u32, end as u32, flags);
            // SAFETY: `start .. end` are published records of the pinned segment.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(ptr.as_ptr().add(start), end - start)
            });
            finish_chunk(out, chunk);
        }
        if let Some(f) = out.get_mut(at + B_FLAGS) {
            *f = if complete { FLAG_COMPLETE } else { 0 };
        }
        Ok(Served {
            lag_bytes: lag,
            shipped,
            reset: false,
            reset_why: "",
            snapshot: false,
            switched: false,
            log_offset,
        })
    }
}

/// A record's version: (CAS, rewrite stamp), compared in that order. A tombstone removes
/// the versions of its key below its own: a delete's has the stamp 0 and a CAS above the
/// deleted item's, so it removes every copy of that item; an eviction's has the evicted
/// record's CAS and a stamp one above its stamp, so it removes that record and older
/// copies of the item, but not a newer copy (a rewrite or a copy forward on the master)
/// that a replica which evicted on its own may receive later.
pub(super) type Version = (u64, u64);

/// Versions a replica remembers by key, with the number of the batch each came with, and
/// what it had to forget too early.
#[derive(Debug, Clone, Default)]
pub(super) struct Remembered {
    map: HashMap<Box<[u8]>, (Version, u64)>,
    /// The highest version forgotten before a complete batch came after it (the memory was
    /// full), and the latest batch such a version came with. Until a complete batch after
    /// that one, an item at or below it is taken as outdated: a tombstone of its key may
    /// have been among those forgotten, and a cache may miss but must not bring a deleted
    /// item back.
    floor: Option<(Version, u64)>,
}

impl Remembered {
    /// Whether an arriving item of `key` at version `ver` is outdated: below (or, with
    /// `or_equal`, at) the version remembered for its key, or at or below the floor.
    fn outdated(&self, key: &[u8], ver: Version, or_equal: bool) -> bool {
        self.floor.is_some_and(|(f, _)| ver <= f)
            || self
                .map
                .get(key)
                .is_some_and(|&(v, _)| ver < v || or_equal && ver == v)
    }

    /// Entries, plus one for a floor: 0 when nothing can be taken as outdated.
    fn weight(&self) -> usize {
        self.map.len() + usize::from(self.floor.is_some())
    }

    fn clear(&mut self) {
        self.map.clear();
        self.floor = None;
    }

    /// Forget the entries `drop` picks before their time, raising the floor to them.
    fn forget_early(&mut self, mut drop: impl FnMut(u64) -> bool) {
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
fn remember_tombstone(tombs: &mut Remembered, key: &[u8], ver: Version, batch_no: u64) {
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
fn forget_before(tombs: &mut Remembered, batch_no: u64) {
    tombs.map.retain(|_, &mut (_, n)| n >= batch_no);
    if tombs.floor.is_some_and(|(_, n)| n < batch_no) {
        tombs.floor = None;
    }
}

/// Whether segment `seq`, sealed with all its items dead or expired, must stay for a
/// replica (`holds` from [`LogEngine::repl_serve_as`]): one of them has not read it whole.
pub(super) fn held_for_replica(holds: &Holds, seq: u64) -> bool {
    holds.iter().any(|(_, c)| match c.get(seq) {
        Some(p) => !p.complete,
        None => seq >= c.below,
    })
}

/// Tombstones waiting to be logged for replicas, (key, the tombstone's version): for
/// evicted items, and for what a segment freed before a replica read it held
/// (`relog_for_skip`).
pub(super) type EvictionNotes = Vec<(Box<[u8]>, Version)>;

/// The version of the tombstone that removes record version `ver` and older copies of its
/// item, but no later copy (a rewrite or copy forward has a higher stamp, a later version
/// of the key a higher CAS).
fn eviction_tombstone((cas, stamp): Version) -> Version {
    match stamp.checked_add(1) {
        Some(s) => (cas, s),
        None => (cas.saturating_add(1), 0),
    }
}

/// Replica side.
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
        self.tick(now);
        let mut r = Reader(batch);
        if r.take(4)? != BATCH_MAGIC {
            return Err(ReplError("bad batch magic"));
        }
        if r.u8()? != VERSION {
            return Err(ReplError("unknown batch version"));
        }
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
                    return Err(ReplError("bad reset length"));
                }
                let mut entries = BTreeMap::new();
                for _ in 0..n {
                    let seq = r.u64()?;
                    let off = r.u32()?;
                    if seq >= below {
                        return Err(ReplError("reset entry beyond its cursor"));
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
                    return Err(ReplError("snapshot batch outside a full sync"));
                }
                let pseq = r.u64()?;
                let poff = r.u32()?;
                while !r.0.is_empty() {
                    let (seq, base, _start, _end, _f, data) = chunk(&mut r)?;
                    if seq >= st.below {
                        return Err(ReplError("snapshot chunk beyond its cursor"));
                    }
                    self.apply_records(st, base, data, batch_no, now, &mut applied)?;
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
                    return Err(ReplError("tail batch before the full sync finished"));
                }
                applied.idle = r.0.is_empty();
                while !r.0.is_empty() {
                    let (seq, base, start, end, f, data) = chunk(&mut r)?;
                    let have = st.entries.get(&seq).copied();
                    let expect = have.map_or(SEG_HDR as u32, |p| p.off.max(SEG_HDR as u32));
                    let known = seq >= st.below || have.is_some();
                    if !known || have.is_some_and(|p| p.complete) || start != expect {
                        return Err(ReplError("tail chunk does not continue the cursor"));
                    }
                    if end as usize != start as usize + data.len() {
                        return Err(ReplError("tail chunk length"));
                    }
                    self.apply_records(st, base, data, batch_no, now, &mut applied)?;
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
                    return Err(ReplError("switch batch outside the tail"));
                }
                let below = r.u64()?;
                let n = r.u32()? as usize;
                if n > MAX_ENTRIES || r.0.len() != n * 12 {
                    return Err(ReplError("bad switch length"));
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
            _ => return Err(ReplError("unknown batch kind")),
        }
        // The master's flush state and version counter (items carry its versions).
        {
            let _f = lock(&self.flush_lock);
            self.flush_mark.store(flush_mark, Ordering::SeqCst);
            self.delayed_mark.store(delayed_mark, Ordering::SeqCst);
            self.flush_deadline.store(deadline, Ordering::Release);
        }
        self.cas.observe(next_cas);
        Ok(applied)
    }

    fn apply_records(
        &self,
        st: &mut ReplicaState,
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
                let Some(r) = (unsafe { format::read(data.as_ptr(), data.len(), ahead, base) })
                else {
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
            let rec = unsafe { format::read(data.as_ptr(), data.len(), off, base) };
            let Some(rec) = rec else {
                return Err(ReplError("bad record"));
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
                _ => return Err(ReplError("unknown record kind")),
            }
        }
        self.cas.observe(cas);
        self.stamps.observe(stamp.saturating_add(1));
        Ok(())
    }

    /// Store replicated item `r`, whose key hashes to `h`.
    fn apply_item(&self, st: &ReplicaState, r: &Rec<'_>, h: u64, now: Time) {
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
                keep_atime: false,
            },
        };
        self.commit(&c, now, None);
    }

    /// On a replica, remember the version of record `r`, which slot value `v` points at,
    /// whose item this engine removes on its own (see `ReplFlags::removed`), unless it is
    /// below the `settled` position (an older record of its key can no longer arrive).
    /// The caller holds the key's stripe lock, so a batch that brought the item was
    /// numbered before this reads `epoch`, and the record's segment is live.
    pub(super) fn note_removed(&self, r: &Rec<'_>, v: u64) {
        if !self.repl.replica.load(Ordering::Relaxed) {
            return;
        }
        let seq = self
            .segs
            .get(index::slot_seg(v))
            .map(|s| s.mem.0.seq.load(Ordering::Acquire))
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
    fn forget_removed(&self, batch_no: u64) {
        if self.repl.removed_len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut m = lock(&self.repl.removed);
        forget_before(&mut m, batch_no);
        self.repl.removed_len.store(m.weight(), Ordering::Release);
    }

    /// Remove `key`'s item if it is older than the tombstone (version `ver`), and log the
    /// tombstone (for this engine's own replicas).
    fn apply_tombstone(&self, key: &[u8], ver: Version) {
        self.cas.observe(ver.0);
        self.write_tombstone(key, self.hash(key), Some(ver));
    }

    /// With replicas attached, remember an eviction so that it is logged as a tombstone
    /// (see `repl_log_evictions`): the master decides evictions, and its replicas drop the
    /// same items instead of keeping what it no longer has. Called under eviction's locks.
    pub(super) fn note_eviction(&self, key: &[u8], ver: Version) {
        let mut one = EvictionNotes::default();
        self.note_eviction_in(&mut one, key, ver);
        self.note_evictions(one);
    }

    /// [`LogEngine::note_eviction`] into a local batch, for [`LogEngine::note_evictions`]
    /// to hand over at once (eviction notes a whole segment's items).
    pub(super) fn note_eviction_in(&self, notes: &mut EvictionNotes, key: &[u8], ver: Version) {
        if self.repl.active.load(Ordering::Relaxed) && notes.len() < MAX_PENDING_EVICTIONS {
            notes.push((key.into(), eviction_tombstone(ver)));
        }
    }

    /// Hand a batch of noted evictions to the replication log (one lock for the batch).
    pub(super) fn note_evictions(&self, notes: EvictionNotes) {
        if notes.is_empty() {
            return;
        }
        let mut q = lock(&self.repl.evicted);
        let room = MAX_PENDING_EVICTIONS.saturating_sub(q.len());
        q.extend(notes.into_iter().take(room));
    }

    /// Log the tombstones noted since the last call: for an evicted record, one that
    /// removes it and older copies ([`eviction_tombstone`]); for a tombstone of a freed
    /// segment, the same tombstone again. Called by the maintenance tick and before
    /// serving a pull, never under the engine's locks.
    pub fn repl_log_evictions(&self) {
        let pending = std::mem::take(&mut *lock(&self.repl.evicted));
        for (key, ver) in pending {
            self.write_tombstone(&key, self.hash(&key), Some(ver));
        }
    }

    /// Sealed segment `id` (ours, out of the FIFO, not yet cleaned) is about to be freed
    /// by the maintenance pass while a replica still needs it: log anew what a replica
    /// that skips it would miss, so that it can skip it instead of resynchronizing fully.
    /// That is a tombstone for each item of the segment whose key has no newer item now
    /// (it expired, was flushed, or is the one the index still points at: the replica may
    /// hold an older version of its key, which the master no longer has; one unlinked
    /// already by the sweep or a read counts too), and each tombstone of the segment (the
    /// replica may hold the item it deleted). An item whose key has a newer one needs
    /// nothing: the replica reads the newer one where it is. Then `seq` is remembered as
    /// skippable. Nothing is remembered if the tombstones do not all fit the queue (the
    /// replica then resynchronizes, as before).
    pub(super) fn relog_for_skip(&self, id: u32, seq: u64) {
        let Some(seg) = self.segs.get(id) else {
            return;
        };
        let Some(ptr) = std::ptr::NonNull::new(seg.mem.0.ptr.load(Ordering::Acquire)) else {
            return;
        };
        let used = seg.mem.0.used.load(Ordering::Acquire);
        let mut notes = EvictionNotes::default();
        let mut note = |r: &Rec<'_>| {
            if notes.len() >= MAX_PENDING_EVICTIONS {
                return false;
            }
            if r.kind != KIND_TOMBSTONE && r.kind != KIND_ITEM {
                return true;
            }
            let h = self.hash(r.key);
            let newer = {
                let _g = self.index.lock(h);
                // SAFETY: we hold `h`'s stripe lock while the record is used.
                unsafe { self.lookup(h, r.key) }
                    .is_some_and(|(_, _, cur)| (cur.cas, cur.stamp) > (r.cas, r.stamp))
            };
            if !newer {
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
        let whole = unsafe { super::compact::for_records(ptr, used, |_, r| note(r)) };
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
    pub(super) fn prune_skippable(&self, wanted: &Holds) {
        let mut skippable = lock(&self.repl.skippable);
        if !skippable.is_empty() {
            skippable.retain(|&seq| held_for_replica(wanted, seq));
        }
    }

    /// With replicas attached, a delete of an absent key is logged too (the key may live
    /// on a replica that did not see the master evict it).
    pub(super) fn tombstone_for_replicas(&self, key: &[u8], h: u64) {
        if self.repl.active.load(Ordering::Relaxed) && key.len() <= super::MAX_KEY {
            self.write_tombstone(key, h, None);
        }
    }

    /// Append a tombstone for `key` (CAS `cas`, else the next unique) and remove an older
    /// item of the key. Without room for it (no_evict and full) only the removal happens.
    fn write_tombstone(&self, key: &[u8], h: u64, ver: Option<Version>) {
        let need = HDR_MAX + key.len();
        let shard = &self.shards[tid() % self.shards.len()];
        let mut sh = lock(&shard.0);
        let open = self.room(&mut sh, need);
        let dest = open.as_ref().and_then(|o| self.dest(o));
        let mut g = self.index.lock(h);
        // Without a version: above everything reserved, so every version a replica may
        // hold goes. The stripe's floor keeps the key's next version at or above it.
        let (cas, stamp) = ver.unwrap_or_else(|| (self.cas.reserved(), 0));
        *g = (*g).max(cas);
        // SAFETY: we hold `h`'s stripe lock.
        if let Some((slot, v, r)) = unsafe { self.lookup(h, key) } {
            if (r.cas, r.stamp) < (cas, stamp) {
                slot.store(0, Ordering::Release);
                self.account_remove(v, r.len, self.rec_size(&r));
            }
        }
        if let (Some(o), Some(d)) = (open, dest) {
            self.append_tombstone(&mut sh, o, &d, key, (cas, stamp));
        }
    }

    /// Drop every item (a full sync starts from nothing).
    fn wipe(&self) {
        self.for_each_indexed(|slot, v| {
            // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
            let (len, size) = unsafe { self.rec(v) }.map_or((0, 0), |r| (r.len, self.rec_size(&r)));
            slot.store(0, Ordering::Release);
            self.account_remove(v, len, size);
        });
        // Nothing is kept for replicas of this engine: what it dropped must not be
        // shipped to them any more (they resynchronize).
        self.free_dead_segments(&Holds::new(), &Holds::new());
        // Replicas of this engine resynchronize too: the drops above are in no log, so
        // a replica whose cursor is still valid here (segments still open) would keep
        // them. Every cursor made so far has `below` at most `seg_seq`; skipping a
        // number makes every cursor made from here on start above it.
        let _live = lock(&self.seq_lock);
        let floor = self.seg_seq.fetch_add(1, Ordering::SeqCst) + 1;
        self.repl.wiped_below.store(floor, Ordering::SeqCst);
    }

    /// Whether cursor `c` was made before this engine's last wipe (see `wiped_below`).
    fn before_wipe(&self, c: &Cursor) -> bool {
        c.below < self.repl.wiped_below.load(Ordering::SeqCst)
    }
}

/// Records of a replicated chunk whose index buckets are loaded ahead of their turn.
const PREFETCH: usize = 8;

/// What [`LogEngine::digest`] returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digest {
    /// Live items.
    pub items: u64,
    /// The sum of the items' MD5s, mod 2^128.
    pub sum: u128,
}

impl Digest {
    /// The sum as 32 hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.sum)
    }
}

type ChunkParts<'a> = (u64, u64, u32, u32, u8, &'a [u8]);

fn chunk<'a>(r: &mut Reader<'a>) -> Result<ChunkParts<'a>, ReplError> {
    let seq = r.u64()?;
    let base = r.u64()?;
    let start = r.u32()?;
    let end = r.u32()?;
    let flags = r.u8()?;
    let len = r.u32()? as usize;
    let data = r.take(len)?;
    Ok((seq, base, start, end, flags, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_tombstone_memory_forgets_the_oldest_batches_first_and_leaves_a_floor() {
        let mut tombs = Remembered::default();
        let key = |i: usize| format!("k{i}").into_bytes();
        for i in 0..5 {
            remember_tombstone(&mut tombs, &key(i), (10 + i as u64, 0), 1);
        }
        assert!(tombs.floor.is_none());
        // A newer tombstone of a remembered key replaces it without forgetting others.
        remember_tombstone(&mut tombs, &key(0), (20, 0), 2);
        remember_tombstone(&mut tombs, &key(0), (15, 0), 2);
        assert_eq!(tombs.map.get(key(0).as_slice()), Some(&((20, 0), 2)));
        for i in 5..12 {
            remember_tombstone(&mut tombs, &key(i), (30, 0), 2);
            assert!(tombs.map.len() <= MAX_TOMBS);
        }
        // The memory filled during batch 2: batch 1's tombstones went, all of batch 2's stay.
        for i in 1..5 {
            assert!(
                !tombs.map.contains_key(key(i).as_slice()),
                "k{i} of batch 1 kept"
            );
        }
        for i in std::iter::once(0).chain(5..12) {
            assert!(
                tombs.map.contains_key(key(i).as_slice()),
                "k{i} of batch 2 forgotten"
            );
        }
        // What went leaves a floor: the highest version forgotten (k4's 14) and its batch.
        assert_eq!(tombs.floor, Some(((14, 0), 1)));
        // An item of a forgotten key below its tombstone is still outdated, through the
        // floor (so is any item that old); one above the floor is not.
        assert!(tombs.outdated(&key(3), (12, 0), false));
        assert!(tombs.outdated(b"other", (14, 0), false));
        assert!(!tombs.outdated(&key(3), (15, 0), false));
        assert!(!tombs.outdated(b"other", (15, 0), false));
        // The remembered keys are compared as before.
        assert!(tombs.outdated(&key(5), (29, 0), false));
        assert!(!tombs.outdated(&key(5), (30, 0), false));
        assert!(tombs.outdated(&key(5), (30, 0), true));
        // A complete batch 2: batch 1's records have all arrived, the floor goes; batch
        // 2's tombstones stay.
        forget_before(&mut tombs, 2);
        assert!(tombs.floor.is_none());
        assert!(!tombs.outdated(b"other", (14, 0), false));
        assert!(tombs.outdated(&key(5), (29, 0), false));
        // One batch with more tombstones than fit: the memory stays bounded, and every
        // one forgotten is under the floor until a complete batch after it.
        for i in 100..100 + 3 * MAX_TOMBS {
            remember_tombstone(&mut tombs, &key(i), (100 + i as u64, 0), 3);
            assert!(tombs.map.len() <= MAX_TOMBS);
        }
        for i in 100..100 + 3 * MAX_TOMBS {
            assert!(tombs.outdated(&key(i), (99 + i as u64, 0), false), "k{i}");
        }
        forget_before(&mut tombs, 3);
        assert!(tombs.floor.is_some(), "batch 3's own went: the floor stays");
        forget_before(&mut tombs, 4);
        assert_eq!(tombs.weight(), 0);
    }

    /// One pull in a unit test: serve `st`'s cursor on `m`, apply the batch on `r`.
    fn pull_once(m: &LogEngine, r: &LogEngine, st: &mut ReplicaState, now: Time) -> Served {
        pull_budget(m, r, st, now, 1 << 20)
    }

    fn pull_budget(
        m: &LogEngine,
        r: &LogEngine,
        st: &mut ReplicaState,
        now: Time,
        budget: usize,
    ) -> Served {
        let mut cursor = Vec::new();
        st.cursor(&mut cursor);
        let mut batch = Vec::new();
        let served = m.repl_serve_as(None, &cursor, false, false, budget, &mut batch);
        let applied = r.repl_apply(st, &batch, now);
        assert!(applied.is_ok(), "replica rejected a batch: {applied:?}");
        served
    }

    fn open_lengths(e: &LogEngine) -> BTreeMap<u64, u32> {
        e.own_position()
            .entries
            .iter()
            .map(|&(s, p)| (s, p.off))
            .collect()
    }

    /// A full sync ships the tombstones of the segments open when its starting cursor was
    /// taken, not those of sealed segments (whose older records are all below the cursor
    /// and no longer indexed), so a master with more tombstones in its log than a replica
    /// remembers (`MAX_TOMBS`) does not make it forget the ones it needs. The needed case
    /// is staged: an item published into one open segment just after the cursor read that
    /// segment's length, deleted at once by a tombstone in another open segment that the
    /// cursor read later. The item arrives with the tail, after the tombstone.
    #[test]
    fn a_full_sync_ships_the_tombstones_of_open_segments_only() {
        use crate::Engine as _;
        let cfg = super::super::tests::cfg(64 << 20);
        let (m, r) = (LogEngine::new(cfg.clone()), LogEngine::new(cfg));
        let now = 1_000;
        let set = |key: &[u8], value: &[u8], exptime: Time| {
            m.store(
                crate::StoreRequest {
                    mode: crate::StoreMode::Set,
                    key,
                    value,
                    flags: 0,
                    exptime,
                },
                now,
            )
        };
        let old = |i: usize| format!("old{i}").into_bytes();
        for i in 0..4 * MAX_TOMBS + 3 {
            set(&old(i), b"v", 0);
            assert!(m.delete(&old(i), now));
        }
        // Seal the segment that holds those tombstones.
        let fill = vec![b'f'; 1000];
        let first = open_lengths(&m);
        for i in 0.. {
            set(format!("fill{i}").as_bytes(), &fill, 0);
            let open = open_lengths(&m);
            if first.keys().all(|s| !open.contains_key(s)) {
                break;
            }
            assert!(i < 100_000, "the first segment never sealed");
        }
        // The race: `k` goes to its TTL class's open segment, its tombstone to the
        // shard's; the cursor will say the class segment was read before `k` was in.
        set(b"z", b"opens the class segment", now + 100);
        let before = open_lengths(&m);
        set(b"k", b"deleted", now + 100);
        let after = open_lengths(&m);
        let grew: Vec<u64> = after
            .iter()
            .filter(|&(s, &off)| before.get(s).is_some_and(|&b| b != off))
            .map(|(&s, _)| s)
            .collect();
        let [class_seg] = grew[..] else {
            panic!("k did not go to exactly one open segment: {before:?} -> {after:?}");
        };
        assert!(m.delete(b"k", now));
        let shard_seg = open_lengths(&m)
            .iter()
            .find(|&(s, &off)| after.get(s).is_some_and(|&a| a != off))
            .map(|(&s, _)| s);
        assert!(
            shard_seg.is_some_and(|s| s != class_seg),
            "k's tombstone is not in another open segment"
        );

        let mut st = ReplicaState::new();
        assert!(pull_once(&m, &r, &mut st, now).reset);
        let Some(p) = st.entries.get_mut(&class_seg) else {
            panic!("the class segment is not in the starting cursor");
        };
        p.off = before[&class_seg];
        while st.phase() == "snapshot" {
            pull_once(&m, &r, &mut st, now);
        }
        assert!(
            st.tombs.map.contains_key(b"k".as_slice()),
            "k's tombstone not shipped"
        );
        for i in 0..4 * MAX_TOMBS + 3 {
            assert!(
                !st.tombs.map.contains_key(old(i).as_slice()),
                "a tombstone of a sealed segment was shipped"
            );
        }
        for _ in 0..100 {
            if pull_once(&m, &r, &mut st, now).lag_bytes == 0 {
                break;
            }
        }
        let has = |key: &[u8]| r.get(key, now, crate::ReadOptions::default(), &mut |_| {});
        assert!(!has(b"k"), "k came back");
        assert!(has(b"z"));
        assert_eq!(r.digest(now), m.digest(now));
    }

    /// A replica remembers an item it removes on its own (here: expired) only while an
    /// older record of its key may still arrive: not once a tail batch that was not cut
    /// short has been applied after the item's. A million items expiring at once on a
    /// caught-up replica used to cost a map entry each (about 80 MB).
    #[test]
    fn a_replica_remembers_its_own_removals_only_while_older_records_may_come() {
        use crate::Engine as _;
        let cfg = super::super::tests::cfg(16 << 20);
        let (m, r) = (LogEngine::new(cfg.clone()), LogEngine::new(cfg));
        r.set_replica(true);
        let now = 1_000;
        let set = |key: &[u8], exptime: Time| {
            m.store(
                crate::StoreRequest {
                    mode: crate::StoreMode::Set,
                    key,
                    value: &[b'v'; 100],
                    flags: 0,
                    exptime,
                },
                now,
            )
        };
        let get = |key: &[u8], at: Time| r.get(key, at, crate::ReadOptions::default(), &mut |_| {});
        let removed = || r.repl.removed_len.load(Ordering::Acquire);
        let mut st = ReplicaState::new();
        // Settled: a full sync, then the tail caught up (its last batch complete).
        for i in 0..100 {
            set(format!("a{i}").as_bytes(), now + 10);
        }
        for _ in 0..100 {
            let served = pull_once(&m, &r, &mut st, now);
            if st.phase() == "tail" && served.lag_bytes == 0 {
                break;
            }
        }
        for i in 0..100 {
            set(format!("b{i}").as_bytes(), now + 10);
        }
        let served = pull_once(&m, &r, &mut st, now);
        assert_eq!(served.lag_bytes, 0);
        for i in 0..100 {
            assert!(!get(format!("a{i}").as_bytes(), now + 20));
            assert!(!get(format!("b{i}").as_bytes(), now + 20));
        }
        assert_eq!(
            removed(),
            0,
            "removals below the settled position were remembered"
        );

        // Items of a batch cut short by the budget: remembered when removed, forgotten
        // after the next complete batch.
        for i in 0..100 {
            set(format!("c{i}").as_bytes(), now + 10);
        }
        let served = pull_budget(&m, &r, &mut st, now, 1000);
        assert!(served.lag_bytes > 0);
        for i in 0..100 {
            assert!(!get(format!("c{i}").as_bytes(), now + 20));
        }
        assert!(
            removed() > 0,
            "a removal that an older record may follow was forgotten"
        );
        pull_once(&m, &r, &mut st, now);
        assert_eq!(removed(), 0);
    }

    /// `own_position` reads only the open segments; it must give what a scan of every
    /// live segment gives (open ones at their length), after writes from several threads
    /// that open, seal, evict and retire segments, large items among them.
    #[test]
    fn own_position_lists_exactly_the_open_live_segments() {
        let scan = |e: &LogEngine| {
            let (next, live) = e.numbered_segments();
            let mut entries = Vec::new();
            for &(seq, id) in &live {
                let Some(seg) = e.segs.get(id) else {
                    continue;
                };
                if !seg.mem.0.sealed.load(Ordering::Acquire)
                    && seg.mem.0.seq.load(Ordering::Acquire) == seq
                {
                    let off = seg.mem.0.used.load(Ordering::Acquire) as u32;
                    entries.push((seq, off));
                }
            }
            (next, entries)
        };
        let own = |e: &LogEngine| {
            let c = e.own_position();
            assert_eq!(c.phase, Phase::Tail);
            let entries: Vec<(u64, u32)> = c.entries.iter().map(|&(s, p)| (s, p.off)).collect();
            assert!(c.entries.iter().all(|(_, p)| !p.complete));
            (c.below, entries)
        };
        let e = LogEngine::new(crate::EngineConfig {
            max_bytes: 16 << 20,
            max_item_size: 4 << 20,
            no_evict: false,
            use_cas: true,
        });
        assert_eq!(own(&e), scan(&e));
        for round in 0..4u32 {
            std::thread::scope(|s| {
                for t in 0..3u32 {
                    let e = &e;
                    s.spawn(move || {
                        for i in 0..3000u32 {
                            let key = format!("r{round}t{t}k{i}");
                            // Mostly small values, every 500th larger than a segment.
                            let len = if i % 500 == 499 {
                                1_200_000
                            } else {
                                200 + (i % 7) as usize * 300
                            };
                            let value = vec![b'v'; len];
                            crate::Engine::store(
                                e,
                                crate::StoreRequest {
                                    mode: crate::StoreMode::Set,
                                    key: key.as_bytes(),
                                    value: &value,
                                    flags: 0,
                                    exptime: 0,
                                },
                                1_000 + round,
                            );
                        }
                    });
                }
            });
            let (next, entries) = own(&e);
            assert!(!entries.is_empty(), "round {round}: no open segment");
            assert_eq!((next, entries.clone()), scan(&e), "round {round}");
            // Only open segments are listed (a sealed or retired one left in the list would
            // grow it without bound), however many live ones there are.
            assert_eq!(lock(&e.open_segs).len(), entries.len(), "round {round}");
            assert!(e.live_segments().len() > entries.len());
        }
    }

    /// What a replica's cursor leaves unread is held: listed and incomplete, or unlisted
    /// at or above `below`; a listed complete one and anything else below `below` is not.
    /// Pulls under ever new names (a client making them up, replicas restarting) keep
    /// at most `MAX_HOLDS` positions, and a hostile cursor costs no more than a real one.
    #[test]
    fn holds_follow_cursors_and_stay_bounded() {
        let pos = |off, complete| Pos { off, complete };
        let c = Cursor {
            phase: Phase::Tail,
            below: 10,
            entries: vec![
                (7, pos(100, false)),
                (8, pos(200, true)),
                (12, pos(5, true)),
            ],
        };
        let holds: Holds = vec![("r".into(), c)];
        for (seq, held) in [(6, false), (7, true), (8, false), (9, false), (10, true)] {
            assert_eq!(held_for_replica(&holds, seq), held, "segment {seq}");
        }
        assert!(!held_for_replica(&holds, 12));
        assert!(held_for_replica(&holds, 13));
        assert!(!held_for_replica(&Holds::new(), 13));

        let e = LogEngine::new(crate::EngineConfig {
            max_bytes: 16 << 20,
            max_item_size: 1 << 20,
            no_evict: false,
            use_cas: true,
        });
        let mut out = Vec::new();
        for i in 0..3 * MAX_HOLDS {
            out.clear();
            let name = format!("r{i}");
            e.repl_serve_as(Some(&name), b"garbage", false, false, 1 << 16, &mut out);
        }
        assert_eq!(lock(&e.repl.holds).len(), MAX_HOLDS);
        e.repl_hold(|name| name == "r0");
        assert_eq!(lock(&e.repl.holds).len(), 1);
        e.repl_hold(|_| false);
        assert!(lock(&e.repl.holds).is_empty());
    }
}
