//! The contract between the runtime and the request executors: a connection's protocol state
//! ([`Session`]), the worker's context ([`Ctx`]) and what executing a request asks of the
//! connection ([`Step`]). The executors (text, meta, binary, stats, auth gates) and the
//! runtime (TCP, unix and UDP connections) both build on it; it imports neither. The
//! runtime's own buffers (its spare input buffers, `runtime/spares.rs`) are not here.

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
    /// The read that brought the input may have left more in the socket (it filled its
    /// buffer). memcached judges an unfinished text line (over 2 KiB without its end, and
    /// not a `get`: the connection is closed) only after reading what was there, up to its
    /// 16 KiB read buffer; a connection whose reads come in smaller pieces (io_uring's 4 KiB
    /// buffers) waits for the rest before judging (`exec::dispatch`).
    pub more_input: bool,
    /// Flash reads the request at the front of the input needs, for the worker to start
    /// (`Worker::start_flash_reads`).
    pub flash_reads: Vec<kvstore::FlashRead>,
    /// Waiting for flash reads: nothing runs until they are done. The ticket names this
    /// wait (a completion with another ticket is not this connection's).
    pub flash_wait: Option<u64>,
    /// Times the request at the front waited for flash reads: after three, its reads are
    /// done on the worker (a read whose record was dropped again before its re-run).
    pub flash_rounds: u8,
}

impl Session {
    /// Whether the request at the front may wait for flash reads: `flash` (the engine has
    /// a tier), on a stream, not yet waited for three times (then its reads are done on
    /// the worker).
    #[inline]
    pub fn may_wait_for_flash(&self, flash: bool) -> bool {
        flash && self.may_yield && self.flash_rounds < 3
    }

    /// The request at the front needs `reads` from flash: the worker hands them to the I/O
    /// threads and the request runs again once they are done.
    pub fn wait_for_flash(&mut self, reads: Vec<kvstore::FlashRead>) -> Step {
        self.flash_reads = reads;
        self.flash_rounds += 1;
        Step::Wait
    }
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
            flash_reads: Vec::new(),
            flash_wait: None,
            flash_rounds: 0,
            resume: Resume::Start,
            close_after_write: false,
            protocol: None,
            auth: ConnAuth::default(),
            watch: None,
            may_yield: false,
            yield_now: false,
            more_input: false,
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
    /// The request needs flash reads (`Session::flash_reads`): keep its bytes, send what
    /// is owed, and run it again once the reads are done (`state/flash.rs`).
    Wait,
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

/// Worker-owned context for driving connections.
pub struct Ctx<'a> {
    pub shared: &'a Shared,
    pub stats: &'a WorkerStats,
    /// The worker's read buffer, shared by all its connections.
    pub scratch: &'a mut Vec<u8>,
    /// Server time (unix seconds), read once per turn of the worker's loop: every request
    /// of the turn uses it, as memcached's requests use its once-a-second `current_time`
    /// (a clock read per request was 3.6% of the worker's CPU at 16 GETs in flight).
    pub now: u32,
    /// Buffer memory the connection being driven may hold.
    pub buffers: BufferLimit,
    /// The worker's index (which waker serves its connections).
    pub worker: usize,
    /// The socket of the connection being served (`cfd` in `watch` lines); -1 for none.
    pub cfd: i32,
}

impl Ctx<'_> {
    /// A protocol exptime as an absolute expiry time, at this turn's time ([`Ctx::now`]).
    pub fn expiry(&self, exptime: i64) -> kvstore::Time {
        self.shared.clock.expiry_at(exptime, self.now)
    }
}
