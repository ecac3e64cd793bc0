//! The contract between the runtime and the request executors: a connection's protocol state
//! ([`Session`]), the worker's context ([`Ctx`]) and what executing a request asks of the
//! connection ([`Step`]). The executors (text, meta, binary, stats, auth gates) and the
//! runtime (TCP, unix and UDP connections) both build on it; it imports neither.

use std::sync::Arc;

use crate::exec::splice::Splices;
use crate::state::credentials::ConnAuth;
use crate::state::shared::Shared;
use crate::state::stats::WorkerStats;
use crate::state::watch::Watcher;

/// Output beyond which a connection stops executing requests until the client reads.
pub const OUTPUT_HIGH_WATER: usize = 256 * 1024;

/// An idle connection keeps an output buffer up to this size (small replies), no more.
const IDLE_KEEP: usize = 4 * 1024;

/// Per-connection protocol state that request execution reads and writes.
pub struct Session {
    /// Replies not yet written; `out[out_pos..]` is pending, with the values in `spliced`
    /// written between its bytes.
    pub out: Vec<u8>,
    pub out_pos: usize,
    /// Large values to write from the log rather than copies in `out` ([`Splices`]).
    pub spliced: Splices,
    /// Whether this connection's replies may splice values: a plain TCP or unix stream
    /// (not TLS, which copies into its records anyway, and not UDP).
    pub splice_ok: bool,
    /// Bytes of an oversize data block still to discard.
    pub swallow: usize,
    /// Keys of the multiget at the front of the input that were already answered.
    pub get_progress: usize,
    /// Where a dump at the front of the input that paused for output to drain goes on.
    pub resume: Resume,
    /// Close once the pending output is written (`quit`, fatal errors).
    pub close_after_write: bool,
    /// The protocol this connection speaks, decided by its first byte.
    pub protocol: Option<Protocol>,
    /// Authentication state (`-Y`, `-S`).
    pub auth: ConnAuth,
    /// Set by `watch`: the connection now only receives log lines.
    pub watch: Option<Arc<Watcher>>,
    /// A long request may stop part way and go on at a later turn ([`Session::yield_turn`]):
    /// true on TCP and unix connections, false for a UDP datagram's requests.
    pub may_yield: bool,
    /// Set with a [`Step::Pause`]: let the worker's other connections run before this
    /// request goes on (from `resume`), instead of only when the output is full.
    pub yield_now: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        // A watcher's connection is gone: its watcher gets no more lines.
        if let Some(w) = &self.watch {
            w.close();
        }
    }
}

/// Where a long listing (`stats detail dump`, `lru_crawler metadump`) resumes when the
/// request runs again after a [`Step::Pause`]; `Start` when it is not under way.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Resume {
    #[default]
    Start,
    /// At this point of a walk of the item index.
    Bucket(kvstore::ScanCursor),
    /// After this prefix.
    After(Vec<u8>),
    /// `stats cachedump`: at this bucket, with `shown` items and `written` bytes so far.
    CacheDump {
        bucket: kvstore::ScanCursor,
        shown: u32,
        written: usize,
    },
}

/// The protocols a TCP or unix connection can speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Classic text and meta commands.
    Text,
    Binary,
}

impl Session {
    pub fn new() -> Session {
        Session {
            out: Vec::new(),
            out_pos: 0,
            spliced: Splices::default(),
            splice_ok: false,
            swallow: 0,
            get_progress: 0,
            resume: Resume::Start,
            close_after_write: false,
            protocol: None,
            auth: ConnAuth::default(),
            watch: None,
            may_yield: false,
            yield_now: false,
        }
    }

    /// A TCP or unix connection's session: long requests may yield ([`Session::may_yield`]).
    pub fn for_stream() -> Session {
        let mut s = Session::new();
        s.may_yield = true;
        s
    }

    /// Whether a long request (an index walk) that has done a turn's share of work should
    /// stop here and go on at a later turn: then it sets `resume` and returns
    /// [`Step::Pause`].
    pub fn yield_turn(&mut self) -> bool {
        self.yield_now = self.may_yield;
        self.yield_now
    }

    /// Bytes of output waiting to be written (spliced values included).
    pub fn pending(&self) -> usize {
        self.out.len() - self.out_pos + self.spliced.bytes()
    }

    /// Cut the output back to `len` bytes (a reply being built is replaced by an error).
    pub fn truncate_out(&mut self, len: usize) {
        self.out.truncate(len);
        self.spliced.truncate(len);
    }

    /// Give the output buffer back when nothing is pending and it is larger than
    /// [`IDLE_KEEP`]: thousands of idle connections that once fetched a large item must not
    /// keep that much memory each, while a connection of small replies keeps its small
    /// buffer instead of allocating one per request.
    pub fn release_idle(&mut self) {
        if self.pending() == 0 && self.out.capacity() > IDLE_KEEP {
            self.out = Vec::new();
            self.out_pos = 0;
        }
    }
}

/// What executing one request asks of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Carry on with the next request.
    Next,
    /// The request is not finished (a multiget paused for output to drain): keep its bytes,
    /// flush, and run it again later.
    Pause,
    /// Close the connection now, without writing what is pending.
    Close,
}

/// What a queued reply counts against `-o read_buf_mem_limit` at least, whatever its
/// bytes: memcached holds every request's reply, and every key's of a multiget, in a
/// response object, 13 of which fill one of the 16 KiB buffers the limit counts; so a
/// multiget of many keys or a long pipeline runs out of that memory even where the
/// replies are short (t/conn-limits.t).
pub const RESPONSE_OBJECT_BYTES: usize = 16 * 1024 / 13;

/// The share of `-o read_buf_mem_limit` a worker's connections may hold, and what the
/// worker's other connections hold now: the limit a connection checks before it grows a
/// buffer or starts a reply.
#[derive(Debug, Clone, Copy, Default)]
pub struct BufferLimit {
    /// Bytes for all of the worker's connection buffers; 0: no limit.
    pub limit: usize,
    /// Bytes held by the worker's other connections.
    pub others: usize,
}

impl BufferLimit {
    /// Whether a connection may hold `mine` bytes of buffers.
    #[inline]
    pub fn allows(&self, mine: usize) -> bool {
        self.limit == 0 || self.others.saturating_add(mine) <= self.limit
    }
}

/// Input buffers that connections gave back after a large request, kept by their worker for
/// the next one: a stream of large sets then reads each value into a buffer already of its
/// size, rather than growing a new one by doubling (a copy of what arrived at each step) and
/// clearing it. memcached keeps its read buffers per thread likewise.
///
/// At most [`Spares::MAX_BUFS`] buffers and [`Spares::MAX_BYTES`] bytes per worker (a
/// quarter of the worker's share of `-o read_buf_mem_limit`, if that is less); they count
/// in `read_buf_count` and `read_buf_bytes`, and in `read_buf_bytes_free`. A spare keeps
/// its initialized length, so that refilling it clears nothing.
///
/// They also serve a connection whose last request did not fit one receive buffer: it reads
/// its next request straight into one ([`Spares::for_next`]; a new buffer of
/// [`Spares::MIN_BYTES`] when none is kept). Under io_uring the buffer is lent to the
/// kernel while the connection waits; at most [`Spares::MAX_BUFS`] connections of a worker
/// wait so ([`Spares::lend`]), so idle connections hold a bounded number of buffers.
#[derive(Debug)]
pub struct Spares {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
    max_bytes: usize,
    /// Buffers lent to connections waiting for their next request.
    lent: usize,
}

impl Default for Spares {
    fn default() -> Spares {
        Spares::new(0)
    }
}

impl Spares {
    pub const MAX_BUFS: usize = 16;
    pub const MAX_BYTES: usize = 4 << 20;
    /// Smaller buffers are not worth keeping: growing one costs little.
    pub const MIN_BYTES: usize = 16 * 1024;

    /// Spares for a worker whose connections may hold `buffer_limit` bytes (0: no limit).
    pub fn new(buffer_limit: usize) -> Spares {
        let max_bytes = match buffer_limit {
            0 => Self::MAX_BYTES,
            limit => Self::MAX_BYTES.min(limit / 4),
        };
        Spares {
            bufs: Vec::new(),
            bytes: 0,
            max_bytes,
            lent: 0,
        }
    }

    /// Keep `buf` (its contents are dead) if it is worth it and there is room; when full, a
    /// larger buffer replaces the smallest.
    pub fn put(&mut self, buf: Vec<u8>, stats: &WorkerStats) {
        let cap = buf.capacity();
        if !(Self::MIN_BYTES..=self.max_bytes).contains(&cap) {
            return;
        }
        if self.bufs.len() == Self::MAX_BUFS || self.bytes + cap > self.max_bytes {
            let Some((i, smallest)) = self
                .bufs
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, b)| (i, b.capacity()))
            else {
                return;
            };
            if smallest >= cap || self.bytes - smallest + cap > self.max_bytes {
                return;
            }
            let old = self.bufs.swap_remove(i);
            self.bytes -= smallest;
            stats.buffers.spare(old.capacity(), false);
        }
        self.bytes += cap;
        stats.buffers.spare(cap, true);
        self.bufs.push(buf);
    }

    /// A spare for a request of `need` bytes, for a connection whose buffer has `cap` bytes:
    /// the smallest that holds the request, else the largest if it is larger than `cap`.
    /// `allows` says whether the connection may hold a buffer of so many bytes.
    pub fn take(
        &mut self,
        need: usize,
        cap: usize,
        allows: impl Fn(usize) -> bool,
        stats: &WorkerStats,
    ) -> Option<Vec<u8>> {
        let fits = self
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= need)
            .min_by_key(|(_, b)| b.capacity());
        let pick = match fits {
            Some((i, _)) => i,
            None => {
                self.bufs
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, b)| b.capacity())
                    .filter(|(_, b)| b.capacity() > cap)?
                    .0
            }
        };
        if !allows(self.bufs[pick].capacity()) {
            return None;
        }
        let buf = self.bufs.swap_remove(pick);
        self.bytes -= buf.capacity();
        stats.buffers.spare(buf.capacity(), false);
        Some(buf)
    }

    /// A buffer to read a connection's next request into, when its last did not fit a
    /// receive buffer: a spare (the smallest that holds `need` bytes, else the largest), or
    /// a new buffer of [`Spares::MIN_BYTES`] (zeroed) when none is kept. Given back with
    /// [`Spares::put`] like any input buffer, it then serves the next such request.
    pub fn for_next(
        &mut self,
        need: usize,
        allows: impl Fn(usize) -> bool,
        stats: &WorkerStats,
    ) -> Option<Vec<u8>> {
        if let Some(buf) = self.take(need, 0, &allows, stats) {
            return Some(buf);
        }
        allows(Self::MIN_BYTES).then(|| vec![0; Self::MIN_BYTES])
    }

    /// Whether one more connection may wait for its next request with a buffer lent to the
    /// kernel (counted until [`Spares::lend_end`]).
    pub fn lend(&mut self) -> bool {
        if self.lent >= Self::MAX_BUFS {
            return false;
        }
        self.lent += 1;
        true
    }

    /// A connection that waited with a lent buffer ([`Spares::lend`]) has it back, or closed.
    pub fn lend_end(&mut self) {
        self.lent = self.lent.saturating_sub(1);
    }

    /// Connections waiting with a lent buffer.
    #[cfg(test)]
    pub fn lent(&self) -> usize {
        self.lent
    }

    /// Bytes kept.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Worker-owned context for driving connections.
pub struct Ctx<'a> {
    pub shared: &'a Shared,
    pub stats: &'a WorkerStats,
    /// The worker's read buffer, shared by all its connections.
    pub scratch: &'a mut Vec<u8>,
    /// Server time (unix seconds), read once per turn of the worker's loop.
    pub now: u32,
    /// Buffer memory the connection being driven may hold.
    pub buffers: BufferLimit,
    /// The worker's index (which waker serves its connections).
    pub worker: usize,
    /// The socket of the connection being served (`cfd` in `watch` lines); -1 for none.
    pub cfd: i32,
    /// The worker's spare input buffers.
    pub spares: &'a mut Spares,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(cap: usize) -> Vec<u8> {
        Vec::with_capacity(cap)
    }

    #[test]
    fn spares_keep_large_buffers_within_their_bounds_and_count_them() {
        let stats = WorkerStats::default();
        let mut spares = Spares::new(0);
        spares.put(buf(Spares::MIN_BYTES - 1), &stats);
        assert_eq!(spares.bytes(), 0, "too small to keep");
        spares.put(buf(Spares::MAX_BYTES + 1), &stats);
        assert_eq!(spares.bytes(), 0, "too large to keep");
        for _ in 0..Spares::MAX_BUFS + 2 {
            spares.put(buf(64 * 1024), &stats);
        }
        let kept = Spares::MAX_BUFS * 64 * 1024;
        assert!(spares.bytes() >= kept);
        assert_eq!(spares.bufs.len(), Spares::MAX_BUFS);
        // When full, a larger buffer replaces the smallest; a smaller one is dropped.
        spares.put(buf(128 * 1024), &stats);
        assert_eq!(spares.bufs.len(), Spares::MAX_BUFS);
        assert_eq!(
            spares.bytes(),
            spares.bufs.iter().map(Vec::capacity).sum::<usize>()
        );
        let b = stats.buffers.read_buf_bytes_free.get() as usize;
        assert_eq!(b, spares.bytes(), "read_buf_bytes_free");
        assert_eq!(stats.buffers.read_buf_bytes.get() as usize, spares.bytes());
        assert_eq!(
            stats.buffers.read_buf_count.get() as usize,
            Spares::MAX_BUFS
        );
    }

    #[test]
    fn a_spare_is_the_smallest_that_holds_the_request_else_the_largest() {
        let stats = WorkerStats::default();
        let mut spares = Spares::new(0);
        for cap in [32 * 1024, 300 * 1024, 1 << 20] {
            spares.put(buf(cap), &stats);
        }
        let yes = |_| true;
        let got = spares.take(200 * 1024, 0, yes, &stats).unwrap();
        assert!(got.capacity() >= 300 * 1024 && got.capacity() < 1 << 20);
        let got = spares.take(2 << 20, 0, yes, &stats).unwrap();
        assert!(got.capacity() >= 1 << 20);
        // Nothing larger than the connection's own buffer: nothing.
        assert!(spares.take(2 << 20, 64 * 1024, yes, &stats).is_none());
        // A spare the buffer limit does not allow stays.
        assert!(spares.take(1024, 0, |_| false, &stats).is_none());
        assert!(spares.take(1024, 0, yes, &stats).is_some());
        assert_eq!(spares.bytes(), 0);
        assert_eq!(stats.buffers.read_buf_bytes_free.get(), 0);
        assert_eq!(stats.buffers.read_buf_count.get(), 0);
    }

    #[test]
    fn a_buffer_for_the_next_request_is_a_spare_or_a_new_one_and_lends_are_bounded() {
        let stats = WorkerStats::default();
        let mut spares = Spares::new(0);
        let yes = |_| true;
        // None kept: a new, zeroed buffer of the smallest size kept, not counted as a spare.
        let fresh = spares.for_next(64 * 1024, yes, &stats).unwrap();
        assert_eq!(fresh.len(), Spares::MIN_BYTES);
        assert!(fresh.iter().all(|&b| b == 0));
        assert_eq!(stats.buffers.read_buf_count.get(), 0);
        // Not even that when the buffer limit refuses it.
        assert!(spares.for_next(64 * 1024, |_| false, &stats).is_none());
        // Given back, it is the next one's.
        let ptr = fresh.as_ptr();
        spares.put(fresh, &stats);
        let again = spares.for_next(64 * 1024, yes, &stats).unwrap();
        assert_eq!(again.as_ptr(), ptr);
        assert_eq!(spares.bytes(), 0);
        // At most MAX_BUFS connections wait with a lent buffer; one that ends makes room.
        for _ in 0..Spares::MAX_BUFS {
            assert!(spares.lend());
        }
        assert!(!spares.lend());
        spares.lend_end();
        assert_eq!(spares.lent(), Spares::MAX_BUFS - 1);
        assert!(spares.lend());
        for _ in 0..Spares::MAX_BUFS + 3 {
            spares.lend_end();
        }
        assert_eq!(spares.lent(), 0);
    }

    #[test]
    fn spares_take_at_most_a_quarter_of_the_buffer_limit() {
        let stats = WorkerStats::default();
        let mut spares = Spares::new(256 * 1024);
        spares.put(buf(64 * 1024), &stats);
        spares.put(buf(64 * 1024), &stats);
        assert!(
            spares.bytes() <= 64 * 1024 + 1024,
            "kept {}",
            spares.bytes()
        );
    }
}
