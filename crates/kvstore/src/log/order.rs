//! The log's order ([`LogOrder`]): the sequence numbers segments are given when they enter
//! the log, the list of live segments in that order that log readers (a replica's pull, a
//! warm restart's dump) walk, the segments still open for appending, and the bytes of the
//! segments retired so far. It writes no segment header itself: the paths that number a
//! segment (`segments.rs` opening one, the large-item path in `write.rs`, a warm restart's
//! `snapshot.rs`) publish the number in the segment under the order lock ([`Numbering`]),
//! and those that take one out of the log (`segments.rs`'s `retire`) clear it there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::sync::lock;

/// The log's order and the replication position it gives. It owns:
///
/// * the next sequence number (numbers only grow; the first segment gets 1);
/// * the live segments, (sequence number, id) in increasing order, behind the order lock:
///   a log reader walks this list rather than every segment's header;
/// * the regular segments opened for appending and not sealed yet, in the same order, behind
///   a lock taken after the order lock: a handful (a few per writer thread) where the live
///   ones may be many thousands; a replica reads it for its own log position after each
///   batch;
/// * the log bytes of the segments retired so far (for the replication offset).
///
/// Its invariants: a number is drawn and listed under the order lock ([`LogOrder::lock`],
/// [`Numbering::number`]), and the caller publishes it in the segment before letting go of
/// the lock, so that a reader holding the lock sees every number below the next one either
/// live (listed, its segment carrying it) or retired (unlisted, its segment's number
/// cleared under the lock, [`Numbering::unlist`]); a segment id is listed at most once in
/// each list. The order lock is held for short, bounded work: under it only the open list's
/// lock and a segment's own locks are taken.
pub(super) struct LogOrder {
    next: AtomicU64,
    live: Mutex<Vec<(u64, u32)>>,
    open: Mutex<Vec<(u64, u32)>>,
    retired_bytes: AtomicU64,
}

impl LogOrder {
    /// An empty log: no segment numbered yet.
    pub(super) fn new() -> LogOrder {
        LogOrder {
            next: AtomicU64::new(1),
            live: Mutex::new(Vec::new()),
            open: Mutex::new(Vec::new()),
            retired_bytes: AtomicU64::new(0),
        }
    }

    /// The order lock, to number segments or take them out of the log.
    pub(super) fn lock(&self) -> Numbering<'_> {
        Numbering {
            order: self,
            live: lock(&self.live),
        }
    }

    /// The next sequence number, read without the lock (what a batch header carries).
    pub(super) fn next(&self) -> u64 {
        self.next.load(Ordering::SeqCst)
    }

    /// Live segments as (sequence number, id), in sequence order.
    pub(super) fn live(&self) -> Vec<(u64, u32)> {
        lock(&self.live).clone()
    }

    /// The next sequence number and the live segments, read together under the order
    /// lock: every number below the first is live (in the list) or retired.
    pub(super) fn numbered(&self) -> (u64, Vec<(u64, u32)>) {
        let live = lock(&self.live);
        (self.next.load(Ordering::SeqCst), live.clone())
    }

    /// The next sequence number and the open segments, read together under the order lock
    /// (see `own_position`).
    pub(super) fn open(&self) -> (u64, Vec<(u64, u32)>) {
        let _live = lock(&self.live);
        let next = self.next.load(Ordering::SeqCst);
        (next, lock(&self.open).clone())
    }

    /// Open segment `id` was sealed: it is appended to no more.
    pub(super) fn sealed(&self, id: u32) {
        lock(&self.open).retain(|&(_, i)| i != id);
    }

    /// A segment that held `used` bytes of the log was retired ([`Numbering::unlist`]).
    pub(super) fn retired(&self, used: usize) {
        self.retired_bytes.fetch_add(used as u64, Ordering::Relaxed);
    }

    /// Log bytes of the segments retired so far.
    pub(super) fn retired_bytes(&self) -> u64 {
        self.retired_bytes.load(Ordering::Relaxed)
    }
}

/// The order lock, held ([`LogOrder::lock`]): the numbers drawn under it and the segments
/// taken out of the log under it are seen by log readers all at once.
pub(super) struct Numbering<'a> {
    order: &'a LogOrder,
    live: MutexGuard<'a, Vec<(u64, u32)>>,
}

impl Numbering<'_> {
    /// Segment `id` enters the log: it gets the next sequence number (the largest so far),
    /// returned, and is listed live, and, if `open` (a regular segment opened for
    /// appending), open too; any entry the id still had is dropped. The caller publishes
    /// the number in the segment before letting go of the lock.
    pub(super) fn number(&mut self, id: u32, open: bool) -> u64 {
        let seq = self.order.next.fetch_add(1, Ordering::Relaxed);
        publish(&mut self.live, seq, id);
        if open {
            publish(&mut lock(&self.order.open), seq, id);
        }
        seq
    }

    /// Skip a number: every cursor made from here on starts above every number given so
    /// far (returned: the new next number).
    pub(super) fn skip(&mut self) -> u64 {
        self.order.next.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Segment `id`, which had the number `seq` (0: none), leaves the log: it is no longer
    /// listed, live or open. The caller cleared its number in the segment under the lock,
    /// and then counts its bytes ([`LogOrder::retired`]).
    pub(super) fn unlist(&mut self, seq: u64, id: u32) {
        if let Ok(i) = self.live.binary_search(&(seq, id)) {
            self.live.remove(i);
        }
        lock(&self.order.open).retain(|&(_, i)| i != id);
    }
}

/// Add segment `id`, just given the number `seq` (the largest so far), to `list`, dropping
/// any entry the id still had.
fn publish(list: &mut Vec<(u64, u32)>, seq: u64, id: u32) {
    list.retain(|&(_, i)| i != id);
    list.push((seq, id));
}
