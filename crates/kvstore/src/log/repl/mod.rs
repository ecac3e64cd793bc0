//! Log shipping: what a master serves from its log and how a replica applies it.
//!
//! A replica pulls; the master does no work per write for it (beyond logging a tombstone
//! for a delete of an absent key once a replica has pulled, see below). Each pull carries
//! the replica's *cursor* (where it is in the master's log) and is answered with one
//! *batch*; both are byte strings in this module's format (`FORMAT.md`, "Replication"),
//! carried opaquely by the server.
//!
//! * **Position.** Every segment gets a sequence number when it opens (`order.rs`). The
//!   cursor is `below` (every segment numbered below it was consumed completely or is
//!   gone) and, for segments at or above it, how many bytes were consumed and whether
//!   the segment is complete (sealed and consumed to its end).
//! * **Tail.** The master ships, for each live segment at or above `below`, the
//!   published records after the replica's offset, verbatim, up to a byte budget. If a
//!   segment the replica had not finished is gone (evicted), the replica fell behind the
//!   retained log: the master answers with a reset and the replica resynchronizes. A
//!   segment the maintenance pass or eviction freed while a known replica still needed it
//!   is the exception: the master logged anew what a replica skipping it would miss
//!   (`relog_for_skip`), and tells the replica it is complete (an empty chunk).
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
//!
//! # Files
//!
//! `wire.rs` (the cursor and batch formats, and the replica's position), `serve.rs` (the
//! master's side: tail, snapshot, reset and switch batches, and the positions it keeps),
//! `apply.rs` (the replica's side), `notes.rs` (tombstones logged for replicas: evictions,
//! deletes of absent keys, and what a freed segment held).

pub(super) mod apply;
mod notes;
mod remembered;
mod serve;
#[cfg(test)]
mod tests;
pub(super) mod wire;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};

use super::sync::lock;

use remembered::Remembered;
pub(super) use wire::Cursor;
pub use wire::ReplicaState;

/// The engine's replication switches.
#[derive(Default)]
pub(in crate::log) struct ReplFlags {
    /// This engine follows a master (copies forward keep the master's stamps).
    replica: AtomicBool,
    /// A replica has pulled from this engine: deletes of absent keys are logged too.
    active: AtomicBool,
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
    holds: std::sync::Mutex<Holds>,
    /// Segments kept for replicas at the last maintenance pass.
    held: AtomicU64,
    /// The most bytes of segments kept for replicas (`set_repl_backlog`); 0: the default,
    /// `1 / HOLD_SHARE` of the memory limit.
    backlog: std::sync::atomic::AtomicUsize,
    /// Maintenance passes that freed segments a replica still needed, because keeping
    /// them would have taken more than the backlog (`repl_backlog`).
    hold_dropped: AtomicU64,
    /// Sequence numbers of segments the maintenance pass freed while a replica of `holds`
    /// still needed them, after logging anew what a replica could miss by skipping them
    /// (`relog_for_skip`): a cursor that still needs one is told it is complete instead of
    /// getting a reset. Kept while some replica of `holds` may still need them, at most
    /// `MAX_SKIPPABLE`.
    skippable: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    /// Segments added to `skippable` so far.
    relogged: AtomicU64,
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
    /// Held while a full sync's batch is composed and its replica's position recorded.
    /// A full sync lists flash pages by sequence number, so items must not move between
    /// pages while one is under way: flash compaction runs only when it can take this
    /// and no replica is in a full sync (`may_move_flash_items`).
    syncing: std::sync::Mutex<()>,
}

/// By default at most this share (1 / n) of the memory limit is kept in dead or expired
/// segments for replicas that have not read them yet (`set_repl_backlog` changes it).
pub(in crate::log) const HOLD_SHARE: usize = 16;
/// Replicas' names and positions, for [`held_for_replica`].
pub(in crate::log) type Holds = Vec<(Box<str>, Cursor)>;

impl ReplFlags {
    /// This engine follows a master.
    pub(in crate::log) fn is_replica(&self) -> bool {
        self.replica.load(Ordering::Relaxed)
    }

    /// A replica has pulled from this engine.
    pub(in crate::log) fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Every replica's position, kept or not (see `holds`).
    pub(in crate::log) fn holds(&self) -> Holds {
        lock(&self.holds).clone()
    }

    /// Whether items may move from one flash page to another now (flash compaction): no
    /// replica of `holds` is in a full sync (or about to start one), and no full-sync
    /// batch is being composed (the guard returned, held while they move, keeps one from
    /// starting). None when they may not.
    pub(in crate::log) fn may_move_flash_items(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        let gate = self.syncing.try_lock().ok()?;
        let syncing = lock(&self.holds)
            .iter()
            .any(|(_, c)| c.phase != wire::Phase::Tail);
        (!syncing).then_some(gate)
    }

    /// While the returned guard lives, flash items do not move between pages (see
    /// `syncing`).
    pub(in crate::log) fn full_sync_gate(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.syncing)
    }

    /// Whether a replica of `holds` has not read segment `seq` yet.
    pub(in crate::log) fn is_held(&self, seq: u64) -> bool {
        held_for_replica(&lock(&self.holds), seq)
    }

    /// The maintenance pass kept `n` segments for replicas (None: it kept none because
    /// keeping them would have taken more than the backlog; counted).
    pub(in crate::log) fn note_held(&self, n: Option<u64>) {
        self.held.store(n.unwrap_or(0), Ordering::Relaxed);
        if n.is_none() {
            self.hold_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
/// Replicas whose positions are kept at most (others are served, not held for).
pub(in crate::log) const MAX_HOLDS: usize = 64;

/// This engine's own log position (`own`) when its position in the upstream log was
/// `upstream`: every upstream record up to `upstream` is in the own log up to `own`.
pub(in crate::log) struct Checkpoint {
    upstream: Cursor,
    own: Cursor,
}

/// Why a replica gets a full sync ([`Served::reset_why`]).
pub const WHY_FRESH: &str = "it asked for one (a new replica, or one of another log)";
pub const WHY_CURSOR: &str = "its position could not be read";
pub const WHY_FORMAT_1: &str = "it speaks replication format 1 (an older kvcached) and cannot \
    read this server's batches (format 2): upgrade it to this release";
pub const WHY_WIPED: &str = "this server resynchronized since (its position predates that)";
pub const WHY_UNFINISHED_GONE: &str = "a segment it had not finished was freed or evicted";
pub const WHY_UNREAD_GONE: &str = "segments it had not read were freed or evicted";
pub const WHY_IMPOSSIBLE: &str = "its position is beyond this server's log";

/// Checkpoints kept (one per tail batch that brought records).
pub(in crate::log) const CHECKPOINTS: usize = 4096;

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
    /// This engine's log offset when the batch was made ([`super::LogEngine::log_offset`]).
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

/// A batch or cursor that does not follow the format: what a replica reports and the
/// snapshot loader wraps (the text is what a log line shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplError {
    /// A field runs past the end of the bytes.
    #[error("truncated")]
    Truncated,
    #[error("bad cursor magic")]
    CursorMagic,
    #[error("bad cursor phase")]
    CursorPhase,
    #[error("bad cursor length")]
    CursorLength,
    #[error("cursor entries out of order")]
    CursorOrder,
    #[error("bad batch magic")]
    BatchMagic,
    /// The master is older: it speaks replication format 1.
    #[error(
        "the master speaks replication format 1 (an older kvcached); this replica reads \
         format 2: upgrade the master to this release"
    )]
    Format1,
    #[error("unknown batch version")]
    BatchVersion,
    #[error("unknown batch kind")]
    BatchKind,
    #[error("bad reset length")]
    ResetLength,
    #[error("reset entry beyond its cursor")]
    ResetBeyondCursor,
    #[error("snapshot batch outside a full sync")]
    SnapshotOutsideSync,
    #[error("snapshot chunk beyond its cursor")]
    SnapshotBeyondCursor,
    #[error("tail batch before the full sync finished")]
    TailBeforeSync,
    #[error("tail chunk does not continue the cursor")]
    TailDiscontinuous,
    #[error("tail chunk length")]
    TailLength,
    #[error("switch batch outside the tail")]
    SwitchOutsideTail,
    #[error("bad switch length")]
    SwitchLength,
    #[error("bad record")]
    Record,
    #[error("unknown record kind")]
    RecordKind,
}

/// A record's version: (CAS, rewrite stamp), compared in that order. A tombstone removes
/// the versions of its key below its own: a delete's has the stamp 0 and a CAS above the
/// deleted item's, so it removes every copy of that item; an eviction's has the evicted
/// record's CAS and a stamp one above its stamp, so it removes that record and older
/// copies of the item, but not a newer copy (a rewrite or a copy forward on the master)
/// that a replica which evicted on its own may receive later.
pub(in crate::log) type Version = (u64, u64);

/// Whether segment `seq`, sealed with all its items dead or expired, must stay for a
/// replica (`holds` from [`LogEngine::repl_serve_as`]): one of them has not read it whole.
pub(in crate::log) fn held_for_replica(holds: &Holds, seq: u64) -> bool {
    holds.iter().any(|(_, c)| match c.get(seq) {
        Some(p) => !p.complete,
        None => seq >= c.below,
    })
}

/// Tombstones waiting to be logged for replicas, (key, the tombstone's version): for
/// evicted items, and for what a segment freed before a replica read it held
/// (`relog_for_skip`).
pub(in crate::log) type EvictionNotes = Vec<(Box<[u8]>, Version)>;
