//! The replication formats (`FORMAT.md`, "Replication"): the cursor a replica sends with
//! each pull, the batches a master answers with and their chunks, and the replica's
//! position ([`ReplicaState`]), which writes cursors and reads batches. Everything here
//! reads hostile bytes through [`Reader`], which checks every length.

use std::collections::BTreeMap;

use super::super::format::SEG_HDR;
use super::remembered::Remembered;
use super::ReplError;

/// A cursor's magic; format 1 (records that always store their version) had `KVRC`.
pub(in crate::log) const CURSOR_MAGIC: [u8; 4] = *b"KVR2";
const CURSOR_MAGIC_1: [u8; 4] = *b"KVRC";
pub(in crate::log) const BATCH_MAGIC: [u8; 4] = *b"KVRB";
/// The batch format: 2 since records store their version only when their place does not
/// give it (`format.rs`).
pub(in crate::log) const VERSION: u8 = 2;

/// Whether `cursor` comes from a replica of replication format 1 (an older kvcached, which
/// cannot read this format's batches).
pub(in crate::log) fn is_format_1_cursor(cursor: &[u8]) -> bool {
    cursor.get(..4) == Some(&CURSOR_MAGIC_1[..])
}
/// Most segment entries a cursor may carry.
pub(in crate::log) const MAX_ENTRIES: usize = 1 << 16;

pub(in crate::log) const KIND_TAIL: u8 = 0;
pub(in crate::log) const KIND_SNAPSHOT: u8 = 1;
pub(in crate::log) const KIND_RESET: u8 = 2;
pub(in crate::log) const KIND_SWITCH: u8 = 3;
/// Batch flag: nothing was left out for lack of budget.
pub(in crate::log) const FLAG_COMPLETE: u8 = 1;
/// Batch flag (snapshot): the snapshot is finished; follow the tail next.
pub(in crate::log) const FLAG_DONE: u8 = 2;
/// Chunk flag: the segment is sealed and shipped to its end.
pub(in crate::log) const CHUNK_COMPLETE: u8 = 1;

/// Offsets of fields in a batch header.
pub(in crate::log) const B_FLAGS: usize = 6;
pub(in crate::log) const BATCH_HDR: usize = 8 + 8 + 8 + 8 + 4 + 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::log) enum Phase {
    /// Nothing yet: the next pull asks for a full sync.
    Fresh,
    /// In the snapshot, at this segment and offset.
    Snapshot { seq: u64, off: u32 },
    /// Following the log.
    Tail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::log) struct Pos {
    pub(in crate::log) off: u32,
    pub(in crate::log) complete: bool,
}

/// A replica's position in its master's log, and what it needs to apply batches in any
/// order. Owned by the thread that pulls.
#[derive(Debug, Clone)]
pub struct ReplicaState {
    pub(in crate::log) phase: Phase,
    pub(in crate::log) below: u64,
    pub(in crate::log) entries: BTreeMap<u64, Pos>,
    /// Recent tombstones: key → (version, batch number it arrived in).
    pub(in crate::log) tombs: Remembered,
    pub(in crate::log) batches: u64,
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
    pub(in crate::log) fn advance(&mut self) {
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
pub(in crate::log) struct Cursor {
    pub(in crate::log) phase: Phase,
    pub(in crate::log) below: u64,
    /// Sorted by sequence number (checked).
    pub(in crate::log) entries: Vec<(u64, Pos)>,
}

impl Cursor {
    pub(in crate::log) fn decode(b: &[u8]) -> Result<Cursor, ReplError> {
        let mut r = Reader(b);
        if r.take(4)? != CURSOR_MAGIC {
            return Err(ReplError::CursorMagic);
        }
        let phase = r.u8()?;
        let below = r.u64()?;
        let seq = r.u64()?;
        let off = r.u32()?;
        let phase = match phase {
            0 => Phase::Fresh,
            1 => Phase::Snapshot { seq, off },
            2 => Phase::Tail,
            _ => return Err(ReplError::CursorPhase),
        };
        let n = r.u32()? as usize;
        if n > MAX_ENTRIES || r.0.len() != n * 13 {
            return Err(ReplError::CursorLength);
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let seq = r.u64()?;
            let off = r.u32()?;
            let complete = r.u8()? != 0;
            if entries.last().is_some_and(|&(last, _)| last >= seq) {
                return Err(ReplError::CursorOrder);
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
    pub(in crate::log) fn consumed(&self, seq: u64) -> u64 {
        match self.get(seq) {
            Some(p) if p.complete => u64::MAX,
            Some(p) => u64::from(p.off),
            None if seq < self.below => u64::MAX,
            None => 0,
        }
    }

    /// Whether everything `self` covers, `other` covers too (same log). False when the
    /// comparison would be too long to make.
    pub(in crate::log) fn within(&self, other: &Cursor) -> bool {
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

    pub(in crate::log) fn from_state(st: &ReplicaState) -> Cursor {
        Cursor {
            phase: Phase::Tail,
            below: st.below,
            entries: st.entries.iter().map(|(&s, &p)| (s, p)).collect(),
        }
    }

    /// Whether the byte at `off` of segment `seq` is below this position (a tail
    /// position: every segment below `below` done, listed ones up to their offset).
    pub(in crate::log) fn has(&self, seq: u64, off: usize) -> bool {
        seq < self.below && self.get(seq).is_none_or(|p| off < p.off as usize)
    }

    pub(in crate::log) fn get(&self, seq: u64) -> Option<Pos> {
        self.entries
            .binary_search_by_key(&seq, |&(s, _)| s)
            .ok()
            .and_then(|i| self.entries.get(i))
            .map(|&(_, p)| p)
    }
}

/// A bounds-checked little-endian reader over hostile bytes.
pub(in crate::log) struct Reader<'a>(pub(in crate::log) &'a [u8]);

impl<'a> Reader<'a> {
    pub(in crate::log) fn take(&mut self, n: usize) -> Result<&'a [u8], ReplError> {
        if self.0.len() < n {
            return Err(ReplError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(in crate::log) fn u8(&mut self) -> Result<u8, ReplError> {
        Ok(self.take(1)?[0])
    }
    pub(in crate::log) fn u32(&mut self) -> Result<u32, ReplError> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    pub(in crate::log) fn u64(&mut self) -> Result<u64, ReplError> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

pub(in crate::log) fn put_chunk_header(
    out: &mut Vec<u8>,
    seq: u64,
    base: u64,
    start: u32,
    end: u32,
    flags: u8,
) {
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&base.to_le_bytes());
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&end.to_le_bytes());
    out.push(flags);
    // Data length, patched when the chunk is finished.
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// Chunk header: seq, base, start, end, flags, data length.
pub(in crate::log) const CHUNK_HDR: usize = 8 + 8 + 4 + 4 + 1 + 4;

/// An empty chunk that completes segment `seq` where a replica at `pos` in it stands: the
/// segment was freed, and what the replica could miss by skipping it was logged anew.
pub(in crate::log) fn skip_chunk(out: &mut Vec<u8>, seq: u64, pos: Option<Pos>) {
    let at = pos.map_or(SEG_HDR as u32, |p| p.off.max(SEG_HDR as u32));
    let chunk = out.len();
    put_chunk_header(out, seq, 0, at, at, CHUNK_COMPLETE);
    finish_chunk(out, chunk);
}

pub(in crate::log) fn finish_chunk(out: &mut [u8], at: usize) {
    let len = (out.len() - at - CHUNK_HDR) as u32;
    if let Some(d) = out.get_mut(at + CHUNK_HDR - 4..at + CHUNK_HDR) {
        d.copy_from_slice(&len.to_le_bytes());
    }
}

pub(in crate::log) type ChunkParts<'a> = (u64, u64, u32, u32, u8, &'a [u8]);

pub(in crate::log) fn chunk<'a>(r: &mut Reader<'a>) -> Result<ChunkParts<'a>, ReplError> {
    let seq = r.u64()?;
    let base = r.u64()?;
    let start = r.u32()?;
    let end = r.u32()?;
    let flags = r.u8()?;
    let len = r.u32()? as usize;
    let data = r.take(len)?;
    Ok((seq, base, start, end, flags, data))
}
