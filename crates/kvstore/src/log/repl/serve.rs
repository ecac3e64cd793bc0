//! The master's side: a pull's batch for a replica's cursor (tail, snapshot of a full
//! sync, reset, switch), and the positions of the replicas it keeps segments for.

use std::sync::atomic::Ordering;

use super::super::format::{self, Spec, KIND_ITEM, KIND_TOMBSTONE, SEG_HDR};
use super::super::sync::lock;
use super::super::{index, LogEngine, Vis};
use super::wire::{
    finish_chunk, is_format_1_cursor, put_chunk_header, skip_chunk, Cursor, Phase, Pos,
    BATCH_MAGIC, B_FLAGS, CHUNK_COMPLETE, FLAG_COMPLETE, FLAG_DONE, KIND_RESET, KIND_SNAPSHOT,
    KIND_SWITCH, KIND_TAIL, VERSION,
};
use super::{
    Served, HOLD_SHARE, MAX_HOLDS, WHY_CURSOR, WHY_FORMAT_1, WHY_FRESH, WHY_IMPOSSIBLE,
    WHY_UNFINISHED_GONE, WHY_UNREAD_GONE, WHY_WIPED,
};

/// Skipped segments one tail batch tells a replica of at most (the rest in the next).
pub(in crate::log) const MAX_SKIPS_PER_BATCH: usize = 4096;

/// Master side.
impl LogEngine {
    /// Whether the index points `key` at the record at `off` in segment `id` (the record
    /// is the key's current one, not an overwritten copy).
    pub(in crate::log) fn indexed_at(&self, key: &[u8], id: u32, off: usize) -> bool {
        self.index
            .find(self.hash(key), |v| {
                index::slot_seg(v) == id && index::slot_off(v) == off
            })
            .is_some()
    }

    /// Bytes written to the log so far: a replication offset that only grows.
    pub fn log_offset(&self) -> u64 {
        let live: u64 = (0..self.seg_ids())
            .filter_map(|id| self.segs.get(id))
            .filter(|s| s.seq() != 0)
            .map(|s| s.used() as u64)
            .sum();
        self.order.retired_bytes() + live
    }

    /// Write a batch header; returns where it starts and the log offset it carries.
    pub(in crate::log) fn batch_header(&self, kind: u8, out: &mut Vec<u8>) -> (usize, u64) {
        let at = out.len();
        out.extend_from_slice(&BATCH_MAGIC);
        out.push(VERSION);
        out.push(kind);
        out.push(0);
        out.push(0);
        out.extend_from_slice(&self.order.next().to_le_bytes());
        let (mark, delayed) = self.flush.shipped_marks();
        out.extend_from_slice(&mark.to_le_bytes());
        out.extend_from_slice(&delayed.to_le_bytes());
        out.extend_from_slice(&self.cas.reserved().to_le_bytes());
        out.extend_from_slice(&self.flush.deadline().to_le_bytes());
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
        // A full sync's batch, and the position recorded after it, keep flash compaction
        // from moving items meanwhile (`ReplFlags::may_move_flash_items`).
        let full_sync = fresh || Cursor::decode(cursor).map_or(true, |c| c.phase != Phase::Tail);
        let _gate = full_sync.then(|| self.repl.full_sync_gate());
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
    pub(in crate::log) fn serve_for(
        &self,
        cursor: &[u8],
        fresh: bool,
        upstream: bool,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> (Served, Cursor) {
        if is_format_1_cursor(cursor) {
            // It cannot read what follows; the reset says why in this server's log.
            let (mut served, c) = self.serve_reset_cursor(out);
            served.reset_why = WHY_FORMAT_1;
            return (served, c);
        }
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
            0 => self.arena.limit() / HOLD_SHARE,
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
    pub(in crate::log) fn serve_switch(
        &self,
        c: &Cursor,
        out: &mut Vec<u8>,
    ) -> Option<(Served, Cursor)> {
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
    /// open ones at their length. Only the open segments are looked at
    /// (`LogOrder::open`), not every live one: a replica takes this after each batch it
    /// applies.
    pub(in crate::log) fn own_position(&self) -> Cursor {
        let (next, open) = self.order.open();
        let mut entries = Vec::new();
        for &(seq, id) in &open {
            let Some(seg) = self.segs.get(id) else {
                continue;
            };
            let sealed = seg.is_sealed();
            let used = seg.used();
            if !sealed && seg.seq() == seq {
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
    pub(in crate::log) fn serve_reset_cursor(&self, out: &mut Vec<u8>) -> (Served, Cursor) {
        let (next, live) = self.order.numbered();
        let (at, log_offset) = self.batch_header(KIND_RESET, out);
        // First which segments are open, then (a second pass) their lengths. Every segment
        // open when the first length is read is then in the cursor, even one sealed before
        // its own length is read; the snapshot ships tombstones of these segments only
        // (see `serve_snapshot`).
        let unsealed: Vec<bool> = live
            .iter()
            .map(|&(_, id)| self.segs.get(id).is_some_and(|seg| !seg.is_sealed()))
            .collect();
        let mut open = Vec::new();
        let mut lag = 0;
        for (&(seq, id), &unsealed) in live.iter().zip(&unsealed) {
            let Some(seg) = self.segs.get(id) else {
                continue;
            };
            let used = seg.used();
            if seg.seq() != seq {
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
    pub(in crate::log) fn serve_snapshot(
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
        // The segments in memory and those on flash, in the log's order.
        let mut live = self.order.live();
        live.extend(self.bound_segments());
        live.sort_unstable();
        let (at, log_offset) = self.batch_header(KIND_SNAPSHOT, out);
        let pos_at = out.len();
        out.extend_from_slice(&from_seq.to_le_bytes());
        out.extend_from_slice(&from_off.to_le_bytes());
        let now = self.clock.load(Ordering::Relaxed);
        let mut shipped = 0;
        let mut lag = 0u64;
        let mut next_pos = None;
        for &(seq, id) in live.iter().filter(|&&(s, _)| s >= from_seq && s < c.below) {
            let Some(seg) = self.segs.get(id) else {
                continue;
            };
            // A segment in memory is read pinned; a flash segment's image, read into our
            // own buffer, is not: a pin held across its device read would hold back every
            // other thread's barrier (eviction) meanwhile.
            let pin = self.pin();
            let in_memory = seg.seq() == seq;
            let _pin = in_memory.then_some(pin);
            let used = match (in_memory, self.bound_len(id, seq)) {
                (true, _) => seg.used(),
                (false, Some(used)) => used,
                (false, None) => continue,
            };
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
            // A flash segment's image is read here, on this thread (a full sync is rare;
            // one page at a time), unpinned.
            let image;
            let (ptr, base) = if in_memory {
                let Some(ptr) = seg.ptr() else {
                    continue;
                };
                // SAFETY: pinned, and the segment is still live (its number did not change
                // since the pin was taken), so it is not reused before we unpin.
                (ptr.as_ptr().cast_const(), unsafe {
                    format::seg_cas_base(ptr.as_ptr())
                })
            } else {
                let Some((bytes, base)) = self.read_bound(id, seq, limit) else {
                    continue;
                };
                image = bytes;
                (image.as_ptr(), base)
            };
            let chunk = out.len();
            // The chunk's records are the live ones, not all of them: each is written
            // anew at its place in the chunk, with its version (`format::natural_cas` of
            // the chunk's base and its offset in the data, else stored).
            let wire_base = base.wrapping_add(start as u64);
            put_chunk_header(out, seq, wire_base, start as u32, 0, 0);
            let data = out.len();
            let mut off = start;
            while off < limit {
                if shipped >= budget {
                    next_pos = Some((seq, off as u32));
                    break;
                }
                // SAFETY: as above (or our image of `limit` bytes); `limit <= used`, the
                // published length.
                let Some(r) = (unsafe { format::read(ptr, limit, off, base) }) else {
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
                    let natural = format::natural_cas(wire_base, out.len() - data);
                    shipped += format::encode_into(out, &Spec::copy_of(&r), natural);
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
    pub(in crate::log) fn serve_tail(
        &self,
        c: &Cursor,
        budget: usize,
        out: &mut Vec<u8>,
    ) -> Result<Served, &'static str> {
        if self.before_wipe(c) {
            return Err(WHY_WIPED);
        }
        let (next, live) = self.order.numbered();
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
            let sealed = seg.is_sealed();
            let used = seg.used();
            if seg.seq() != seq {
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
            let ptr = seg.ptr().ok_or(WHY_UNREAD_GONE)?;
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
            // A record at offset `d` of the data lies at `start + d` in the segment: the
            // chunk's base makes its version the same (`format::natural_cas`).
            put_chunk_header(
                out,
                seq,
                base.wrapping_add(start as u64),
                start as u32,
                end as u32,
                flags,
            );
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
