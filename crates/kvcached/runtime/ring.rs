//! The io_uring runtime (`-o io=uring`): a worker's connections read and write through one
//! ring instead of a `read` and a `write` system call each.
//!
//! The connection code (`conn.rs`) reads and writes a [`RingSock`] as it would a
//! non-blocking socket (its one addition for this runtime is lending its input buffer,
//! below), and the worker turns the ring's completions into the events that drive it:
//!
//! - **Receiving.** While a connection has nothing buffered, one receive is armed for it. It
//!   uses a buffer the kernel picks from this worker's provided-buffer ring when data
//!   arrives, so an idle connection holds no receive buffer. The completion's bytes are
//!   copied into the connection's small input queue, the buffer goes straight back to the
//!   ring, and the connection is driven. A read of an empty queue says `WouldBlock`.
//!   From kernel 6.0 the receive is *multishot*: armed once, it completes each time data
//!   comes, so a connection that reads request after request costs no new submission and
//!   no failed first attempt per request. A connection that stops reading (its replies wait
//!   for a client that does not read them) lets its queue pass [`RX_HOLD`] bytes; the
//!   multishot receive is then cancelled, so what waits is bounded by that plus what one
//!   turn's completions bring (at most the worker's provided buffers), and the next receive
//!   is armed once the queue is read. Before 6.0, or with `KVCACHED_RECV_MULTISHOT=0`, one
//!   single receive is armed at a time, after each drive that empties the queue.
//!   A connection that fills a whole provided buffer is sending something large
//!   (a big value, a long multiget line): its next receives go straight into a buffer of
//!   its own of [`DIRECT_BUF`] bytes, until one comes back less than half full, so a
//!   stream of large requests neither crowds the shared buffers nor goes through them
//!   4 KiB at a time.
//! - **Receiving into the connection's buffer.** Better still, a plain connection lends its
//!   own input buffer ([`RingSock::lend`]): for the rest of a request whose length its head
//!   told (a set's value), and, while it sends large requests, one of the worker's spare
//!   buffers for whatever comes next. One receive goes straight into the lent room, and
//!   the connection takes the buffer back ([`RingSock::reclaim`]) once it has completed:
//!   the value is not copied out of a provided buffer or the socket's own one, then again
//!   into the connection's. The buffer is the socket's meanwhile, parked with it if the
//!   connection closes. TLS connections read through rustls and do not lend.
//! - **Sending.** A plain connection hands its output buffer over as the send buffer (the
//!   two swap, nothing is copied), with the leased values spliced between its bytes
//!   (`exec/splice.rs`), which then go in one `sendmsg` whose iovecs point into the buffer
//!   and the log; TLS writes its records into it, up to [`STAGE_MAX`].
//!   Neither is a system call. After the drive, a send of everything in it is queued. The buffer
//!   is not touched again until the send completes, so meanwhile a write says `WouldBlock`
//!   and the output waits in the connection's own buffer, as it waits for writability under
//!   epoll; the send's completion drives a connection that was waiting to write. A
//!   connection holds at most one send buffer, and only while it has output in flight.
//! - **One system call per turn.** The queued receives and sends of all connections are
//!   submitted together, and the worker waits for completions, in one `io_uring_enter`.
//!   Listening sockets, UDP sockets and the worker's waker stay in the mio poller, whose
//!   descriptor is itself watched by the ring (a multishot poll). When it fires, the poller
//!   is polled without waiting and its events are handled as the epoll runtime handles
//!   them.
//! - **Closing.** A connection's descriptor and buffers must outlive the kernel's
//!   operations on them. A connection closed with operations in flight is shut down, which
//!   ends a pending receive or send, and its operations are cancelled. It is parked until
//!   their completions arrive, then dropped, which closes the descriptor. Completions are
//!   matched to connections by slot and generation, so a reused slot never gets another
//!   connection's completion.
//! - **Accepting.** With `maxconns_fast` (the default), each listener has one multishot
//!   accept in the ring: armed once, it completes with a new descriptor per connection, so
//!   accepting costs no readiness event and no `accept4` per connection. The descriptor
//!   comes blocking (what a [`RingSock`] wants) and, on Linux, with the listener's
//!   `TCP_NODELAY`. An accept that fails for want of descriptors ends; the worker pauses and
//!   arms it again, as it pauses `accept4` under epoll. With `-o no_maxconns_fast`, where a
//!   connection over `-c` must stay in the listen backlog until one closes, and with
//!   `KVCACHED_ACCEPT_MULTISHOT=0`, listeners stay in the mio poller and connections are
//!   accepted as under epoll.
//!
//! - **Flash reads.** A request that needs items on flash (`-o ext_path`) has its reads
//!   submitted to the ring ([`Reactor::read_at`]) into buffers the reactor holds until
//!   their completions, which the engine checks; the connection goes on once its last read
//!   is done (`Worker::start_flash_reads`).
//!
//! [`probe`] decides at start-up whether this runtime can run: kernel 5.19 or later
//! (provided-buffer rings), not disabled by `kernel.io_uring_disabled` or a seccomp filter.
//! If it cannot, the server uses epoll, and says why when io_uring was asked for by name.
//! From 6.1 the ring runs completions only when the worker waits for them
//! (`DEFER_TASKRUN`), so a worker is not interrupted to process them meanwhile.
//!
//! With `-o io_sqpoll`, a kernel thread per worker polls the ring's submission queue, so a
//! turn that only submits makes no system call; the worker still enters the kernel to wait
//! for completions. The thread spins for its idle time after the last submission, a CPU
//! while the server is busy: it pays where cores are spare, not on a small machine (see
//! BENCHMARKS.md). Completions then cannot wait for the worker (`DEFER_TASKRUN`).
//!
//! Large values are sent from the log without a copy in user space (spliced, above); the
//! kernel still copies them into the socket. Not done: `IORING_OP_SEND_ZC`, which would
//! spare that copy on a NIC but not on loopback or veth, where the receiver copies anyway.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use kvstore::flash::AlignedBuf;

use crate::exec::splice::{Splices, MAX_SLICES};

/// Bytes of one provided receive buffer: a request line, a pipelined batch or a small set
/// fits; a larger request switches the connection to a receive buffer of its own.
pub const RX_BUF: usize = 4 * 1024;
/// A connection's own receive buffer while it sends large requests.
pub const DIRECT_BUF: usize = 64 * 1024;
/// Unread input a connection may hold before its multishot receive is cancelled.
const RX_HOLD: usize = RX_BUF;
/// Provided receive buffers per worker (a power of two).
const RX_BUFS: u16 = 64;
/// The provided-buffer group of the worker's ring.
const GROUP: u16 = 0;
/// Submission queue entries per ring. The completion queue is twice as long, and the
/// kernel keeps completions that do not fit (`IORING_FEAT_NODROP`, required).
const ENTRIES: u32 = 1024;
/// Output a connection's send buffer takes before a write says `WouldBlock`.
pub const STAGE_MAX: usize = 256 * 1024;
/// An empty send buffer keeps at most this much capacity (as a connection's output buffer
/// does), and an empty input queue at most `KEEP_RX` (an idle connection holds little).
const KEEP: usize = 4 * 1024;
const KEEP_RX: usize = 512;

/// What a completion is for (the top three bits of its user data).
const OP_RECV: u64 = 1;
const OP_SEND: u64 = 2;
const OP_POLL: u64 = 3;
/// A multishot accept; its "slot" is the listener's index.
const OP_ACCEPT: u64 = 4;
/// A read of a flash file (`-o ext_path`); its "slot" is the read's number.
const OP_READ: u64 = 5;
/// Cancellations complete with this user data (nothing to do for them).
const OP_NONE: u64 = 0;
/// A connection's generation as its completions carry it (the 29 bits between the
/// operation and the slot). [`RingSock::new`] keeps only these bits, so that a worker's
/// generation counter may wrap without a connection missing its own completions.
pub const GEN_MASK: u32 = 0x1fff_ffff;

fn user_data(op: u64, gen: u32, slot: usize) -> u64 {
    (op << 61) | (u64::from(gen & GEN_MASK) << 32) | (slot as u64 & 0xffff_ffff)
}

/// A completion, copied out of the completion queue.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    pub op: Op,
    pub slot: usize,
    pub gen: u32,
    result: i32,
    flags: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Recv,
    Send,
    /// The mio poller has events.
    Poll,
    /// A listener's multishot accept: a new connection's descriptor, or an error.
    Accept,
    /// A flash read ([`Reactor::read_at`]): bytes read, or an error.
    Read,
    None,
}

impl Completion {
    fn from_entry(e: &cqueue::Entry) -> Completion {
        let ud = e.user_data();
        let op = match ud >> 61 {
            OP_RECV => Op::Recv,
            OP_SEND => Op::Send,
            OP_POLL => Op::Poll,
            OP_ACCEPT => Op::Accept,
            OP_READ => Op::Read,
            _ => Op::None,
        };
        Completion {
            op,
            slot: (ud & 0xffff_ffff) as usize,
            gen: (ud >> 32) as u32 & GEN_MASK,
            result: e.result(),
            flags: e.flags(),
        }
    }

    /// Whether a multishot operation goes on after this completion.
    pub fn more(&self) -> bool {
        cqueue::more(self.flags)
    }

    /// The operation's result: bytes, a new descriptor (accepts), or a negated errno.
    pub fn result(&self) -> i32 {
        self.result
    }
}

/// Whether listeners accept through the ring (a multishot accept each), unless
/// `KVCACHED_ACCEPT_MULTISHOT` is `0` (for comparing the two). Every kernel this runtime
/// runs on (5.19 and later) has multishot accepts.
pub fn multishot_accepts() -> bool {
    std::env::var_os("KVCACHED_ACCEPT_MULTISHOT").is_none_or(|v| v != "0")
}

/// Whether flash reads go through the ring, unless `KVCACHED_FLASH_RING` is `0` (then the
/// I/O threads do them, as under epoll: for comparing the two).
pub fn flash_reads() -> bool {
    std::env::var_os("KVCACHED_FLASH_RING").is_none_or(|v| v != "0")
}

/// Whether receives may be multishot: kernel 6.0 or later, unless `KVCACHED_RECV_MULTISHOT`
/// is `0` (for comparing the two, and for testing the single receives older kernels get).
fn multishot_receives() -> bool {
    if std::env::var_os("KVCACHED_RECV_MULTISHOT").is_some_and(|v| v == "0") {
        return false;
    }
    kernel_at_least(6, 0)
}

/// Whether the running kernel's release is `major.minor` or later.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: `uname` fills the struct it is given; all-zero bytes are a valid `utsname`.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&mut u) } != 0 {
        return false;
    }
    let release: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let mut parts = release.split(|&c| c == b'.' || c == b'-').map(|p| {
        std::str::from_utf8(p)
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
    });
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Whether this runtime can run here: an error saying why not.
pub fn probe() -> io::Result<()> {
    let mut ring = Reactor::new(None, None)?;
    // A submission with a timeout (IORING_FEAT_EXT_ARG) is what the worker's wait uses.
    ring.wait(Some(Duration::ZERO))?;
    Ok(())
}

/// The provided-buffer ring: `RX_BUFS` buffers the kernel picks from as data arrives.
struct BufRing {
    /// The ring of buffer descriptors, one page-aligned mapping.
    entries: *mut types::BufRingEntry,
    entries_len: usize,
    /// The buffers themselves, `RX_BUFS * RX_BUF` bytes.
    bufs: *mut u8,
    bufs_len: usize,
    /// The next tail to publish (buffers handed back but not yet visible to the kernel).
    tail: u16,
    /// The kernel may still write into the buffers: never unmap them ([`Reactor::leak`]).
    leaked: bool,
}

// SAFETY: the mappings belong to this value alone (the kernel's use of them is tied to the
// ring, which moves with it); nothing else points into them.
unsafe impl Send for BufRing {}

impl BufRing {
    fn new() -> io::Result<BufRing> {
        let entries_len = usize::from(RX_BUFS) * std::mem::size_of::<types::BufRingEntry>();
        let bufs_len = usize::from(RX_BUFS) * RX_BUF;
        let entries = map(entries_len)?.cast::<types::BufRingEntry>();
        let bufs = match map(bufs_len) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: mapped just above, and nothing has seen it yet.
                unsafe { unmap(entries.cast(), entries_len) };
                return Err(e);
            }
        };
        let mut ring = BufRing {
            entries,
            entries_len,
            bufs,
            bufs_len,
            tail: 0,
            leaked: false,
        };
        for bid in 0..RX_BUFS {
            ring.give_back(bid);
        }
        ring.publish();
        Ok(ring)
    }

    /// Hand buffer `bid` back to the kernel (visible after [`BufRing::publish`]).
    fn give_back(&mut self, bid: u16) {
        let index = usize::from(self.tail & (RX_BUFS - 1));
        // SAFETY: `index < RX_BUFS`, the number of entries the mapping holds; the kernel
        // reads an entry only after the tail covering it is published.
        let entry = unsafe { &mut *self.entries.add(index) };
        // SAFETY: `bid < RX_BUFS`, so the buffer lies inside the mapping.
        entry.set_addr(unsafe { self.bufs.add(usize::from(bid) * RX_BUF) } as u64);
        entry.set_len(RX_BUF as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Make the buffers handed back visible to the kernel.
    fn publish(&self) {
        // SAFETY: the tail field lies in the first entry of the mapping, which lives as long
        // as `self`; the kernel reads it, so it is written atomically with release ordering
        // after the entries it covers.
        let tail = unsafe { &*types::BufRingEntry::tail(self.entries).cast::<AtomicU16>() };
        tail.store(self.tail, Ordering::Release);
    }

    /// The first `len` bytes of buffer `bid`, which the kernel filled and handed over.
    fn data(&self, bid: u16, len: usize) -> &[u8] {
        if bid >= RX_BUFS {
            return &[];
        }
        // SAFETY: `bid < RX_BUFS` and `len` is clamped to the buffer's size; the kernel no
        // longer writes a buffer it has reported in a completion until it is handed back.
        unsafe {
            std::slice::from_raw_parts(self.bufs.add(usize::from(bid) * RX_BUF), len.min(RX_BUF))
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        if self.leaked {
            return;
        }
        // SAFETY: both are mappings made by `map` in `new`, unmapped only here; the reactor
        // drops its buffers after its ring has stopped using them (`Reactor::drop`), or
        // leaks them.
        unsafe {
            unmap(self.entries.cast(), self.entries_len);
            unmap(self.bufs, self.bufs_len);
        }
    }
}

fn map(len: usize) -> io::Result<*mut u8> {
    // SAFETY: an anonymous private mapping of `len` bytes; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// Unmap a mapping made by [`map`].
///
/// # Safety
///
/// `p` and `len` must be exactly a mapping that [`map`] returned and that was not unmapped
/// yet, and nothing may use it afterwards: no reference into it may outlive this call, and
/// the kernel must have no operation in flight that reads or writes it (a provided buffer is
/// written by a receive until its completion has been seen).
unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: the caller's contract above.
    unsafe {
        libc::munmap(p.cast(), len);
    }
}

/// A worker's ring, its provided buffers, and the connections closed with operations still
/// in flight.
pub struct Reactor {
    ring: IoUring,
    bufs: BufRing,
    /// Connections closed while the kernel still had operations on them, by (slot,
    /// generation), until their last completion.
    parked: HashMap<(usize, u32), RingSock>,
    /// The multishot poll on the mio poller's descriptor is armed.
    poll_armed: bool,
    /// Completions of the last wait.
    done: Vec<Completion>,
    /// Receives that found no free buffer (`ENOBUFS`) and must be armed again.
    pub starved: u64,
    /// Receives into provided buffers are multishot (kernel 6.0).
    multishot: bool,
    /// A kernel thread polls the submission queue (`-o io_sqpoll`).
    sqpoll: bool,
    /// Flash reads in flight, by number: the buffer each reads into (the kernel's until
    /// its completion), and the numbers free.
    reads: Vec<Option<AlignedBuf>>,
    free_reads: Vec<usize>,
    /// Buffers of finished reads, kept for the next ones (at most [`SPARE_READS`]).
    spare_reads: Vec<AlignedBuf>,
}

/// Buffers of finished flash reads a reactor keeps.
const SPARE_READS: usize = 16;

/// How long dropping a reactor waits for its parked connections' operations to end before
/// it leaks what they use instead ([`Reactor::leak`]).
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

impl Drop for Reactor {
    fn drop(&mut self) {
        // Connections closed with operations in flight (at shutdown, all of them) were shut
        // down and their operations cancelled, which ends them; until each one's completion
        // is seen the kernel may still write into its receive buffer (a provided buffer, the
        // connection's own or its lent input buffer) or read its send buffer. Wait for those
        // completions; should the kernel not deliver them all, free none of that memory.
        if !self.drain(DRAIN_LIMIT) {
            self.leak();
        }
        // Before the ring closes and the buffers are unmapped.
        let _ = self.ring.submitter().unregister_buf_ring(GROUP);
    }
}

impl Reactor {
    /// A reactor; with `sqpoll`, whose submission queue a kernel thread polls, sleeping
    /// after that many milliseconds without work, on CPU `sq_cpu` if given (where the
    /// kernel refuses, the ring is built without, and [`Reactor::sqpoll`] says so).
    pub fn new(sqpoll: Option<u32>, sq_cpu: Option<u32>) -> io::Result<Reactor> {
        let (ring, sqpoll) = match sqpoll.and_then(|ms| Self::build_sqpoll(ms, sq_cpu)) {
            Some(ring) => (ring, true),
            None => (Self::build()?, false),
        };
        if !ring.params().is_feature_nodrop() || !ring.params().is_feature_ext_arg() {
            return Err(io::Error::other(
                "the kernel's io_uring lacks NODROP or EXT_ARG (kernel 5.11 or later needed)",
            ));
        }
        let bufs = BufRing::new()?;
        // SAFETY: the entries live in `bufs`, which the reactor drops only after the ring
        // (and unregisters first, in `Drop`).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.entries as u64,
                RX_BUFS,
                GROUP,
                0,
            )?;
        }
        Ok(Reactor {
            ring,
            bufs,
            parked: HashMap::new(),
            poll_armed: false,
            done: Vec::with_capacity(256),
            starved: 0,
            multishot: multishot_receives(),
            sqpoll,
            reads: Vec::new(),
            free_reads: Vec::new(),
            spare_reads: Vec::new(),
        })
    }

    /// Whether a kernel thread polls this ring's submission queue.
    pub fn sqpoll(&self) -> bool {
        self.sqpoll
    }

    /// A ring whose submissions a kernel thread takes (SQPOLL), sleeping after `idle_ms`
    /// without any; for one thread where the kernel allows (`SINGLE_ISSUER`). Completions
    /// cannot be deferred to the worker's wait here (`DEFER_TASKRUN` excludes SQPOLL).
    fn build_sqpoll(idle_ms: u32, cpu: Option<u32>) -> Option<IoUring> {
        let ring = |single: bool| {
            let mut b = IoUring::builder();
            b.setup_sqpoll(idle_ms).setup_cqsize(ENTRIES * 2);
            if let Some(cpu) = cpu {
                b.setup_sqpoll_cpu(cpu);
            }
            if single {
                b.setup_single_issuer();
            }
            b.build(ENTRIES)
        };
        ring(true).or_else(|_| ring(false)).ok()
    }

    /// A ring with the cheapest completion delivery the kernel has: completions run when the
    /// worker waits for them (`DEFER_TASKRUN`, 6.1), for one thread (`SINGLE_ISSUER`, 6.0).
    fn build() -> io::Result<IoUring> {
        match IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(ENTRIES * 2)
            .build(ENTRIES)
        {
            Ok(r) => Ok(r),
            Err(_) => IoUring::builder()
                .setup_coop_taskrun()
                .setup_cqsize(ENTRIES * 2)
                .build(ENTRIES),
        }
    }

    fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every entry pushed points at memory that outlives the operation: a
            // connection's send buffer (kept until its completion, parked if it closes), a
            // flash read's buffer (the reactor's until its completion, leaked if none
            // comes) or nothing (receives use provided buffers, polls and cancellations
            // no buffer).
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            // The queue is full: hand what it holds to the kernel and try again (with
            // SQPOLL, wake its thread if it sleeps and wait until it has taken some).
            self.ring.submit()?;
            if self.sqpoll {
                self.ring.submitter().squeue_wait()?;
            }
        }
    }

    /// Watch the mio poller's descriptor (once; again after a completion without `more`).
    pub fn arm_poll(&mut self, fd: RawFd) -> io::Result<()> {
        if self.poll_armed {
            return Ok(());
        }
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(user_data(OP_POLL, 0, 0));
        self.push(&e)?;
        self.poll_armed = true;
        Ok(())
    }

    pub fn poll_disarmed(&mut self) {
        self.poll_armed = false;
    }

    /// Accept connections on listener `index` (descriptor `fd`) until the accept is
    /// cancelled or fails: a completion per connection, its result the new descriptor
    /// (blocking, close-on-exec; a TCP listener's `TCP_NODELAY` carries over to it).
    pub fn arm_accept(&mut self, fd: RawFd, index: usize) -> io::Result<()> {
        let e = opcode::AcceptMulti::new(types::Fd(fd))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(OP_ACCEPT, 0, index));
        self.push(&e)
    }

    /// Ask the kernel to end listener `index`'s accept (a last completion without `more`
    /// still comes).
    pub fn cancel_accept(&mut self, index: usize) {
        self.cancel(OP_ACCEPT, 0, index);
    }

    /// Queue a read of `len` bytes at offset `at` of file `fd` (a flash file, open as long as
    /// the server runs) into a buffer of the reactor's, aligned for `O_DIRECT`. Returns the
    /// read's number, which its completion ([`Op::Read`]) carries as its slot; the bytes
    /// are then taken with [`Reactor::read_done`].
    pub fn read_at(&mut self, fd: RawFd, at: u64, len: usize) -> io::Result<usize> {
        let len32 = u32::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut buf = self.spare_reads.pop().unwrap_or_default();
        let ptr = buf.get(len).as_mut_ptr();
        let id = match self.free_reads.pop() {
            Some(id) => id,
            None => {
                self.reads.push(None);
                self.reads.len() - 1
            }
        };
        let e = opcode::Read::new(types::Fd(fd), ptr, len32)
            .offset(at)
            .build()
            .user_data(user_data(OP_READ, 0, id));
        // The buffer is the kernel's from the push on (should a later push submit it).
        if let Some(r) = self.reads.get_mut(id) {
            *r = Some(buf);
        }
        if let Err(e) = self.push(&e) {
            // Not queued: the buffer is not the kernel's.
            if let Some(buf) = self.reads.get_mut(id).and_then(Option::take) {
                self.spare_reads.push(buf);
            }
            self.free_reads.push(id);
            return Err(e);
        }
        Ok(id)
    }

    /// The buffer of a read that completed ([`Op::Read`]), its number free again; give it
    /// back with [`Reactor::spare_read`] once its bytes are used. None for a completion
    /// that is not a read's, or one seen already.
    pub fn read_done(&mut self, c: &Completion) -> Option<AlignedBuf> {
        if c.op != Op::Read {
            return None;
        }
        let buf = self.reads.get_mut(c.slot)?.take()?;
        self.free_reads.push(c.slot);
        Some(buf)
    }

    /// A finished read's buffer, kept for another read.
    pub fn spare_read(&mut self, buf: AlignedBuf) {
        if self.spare_reads.len() < SPARE_READS {
            self.spare_reads.push(buf);
        }
    }

    /// Flash reads in flight.
    fn reads_in_flight(&self) -> usize {
        self.reads.len() - self.free_reads.len()
    }

    /// Queue what connection `slot` needs from the kernel: a receive when its input is empty,
    /// a send when it has staged output and none in flight.
    pub fn arm(&mut self, sock: &mut RingSock, slot: usize) -> io::Result<()> {
        // A lent buffer takes one receive; then it waits to be reclaimed.
        let lent_done = sock.lent.as_ref().is_some_and(|l| l.received.is_some());
        if sock.wants_recv() && !lent_done {
            let fd = types::Fd(sock.fd.as_raw_fd());
            let e = if let Some(l) = sock.lent.as_mut() {
                // The lent buffer is the socket's until the completion (`reclaim` refuses it
                // meanwhile, and a closed connection's socket is parked with it), and its
                // heap memory does not move with the socket.
                let room = &mut l.buf[l.from..l.to];
                opcode::Recv::new(fd, room.as_mut_ptr(), room.len() as u32).build()
            } else if sock.direct {
                // The input queue is empty (`wants_recv`); it is not touched again until the
                // completion, so its spare room stays where the kernel writes.
                sock.rx.clear();
                sock.rx_pos = 0;
                sock.rx.reserve(DIRECT_BUF);
                let spare = sock.rx.spare_capacity_mut();
                opcode::Recv::new(fd, spare.as_mut_ptr().cast(), spare.len() as u32).build()
            } else if self.multishot {
                opcode::RecvMulti::new(fd, GROUP).build()
            } else {
                opcode::Recv::new(fd, std::ptr::null_mut(), 0)
                    .buf_group(GROUP)
                    .build()
                    .flags(squeue::Flags::BUFFER_SELECT)
            };
            self.push(&e.user_data(user_data(OP_RECV, sock.gen, slot)))?;
            sock.recv_inflight = true;
            sock.recv_lent = sock.lent.is_some();
            sock.recv_direct = sock.direct && !sock.recv_lent;
            sock.recv_cancelled = false;
        }
        if !sock.send_inflight && sock.unsent() && sock.err.is_none() {
            self.push_send(sock, slot)?;
        }
        Ok(())
    }

    fn push_send(&mut self, sock: &mut RingSock, slot: usize) -> io::Result<()> {
        let e = if sock.spliced.is_empty() {
            let rest = &sock.sending[sock.sent..];
            opcode::Send::new(
                types::Fd(sock.fd.as_raw_fd()),
                rest.as_ptr(),
                rest.len().min(u32::MAX as usize) as u32,
            )
            .flags(libc::MSG_NOSIGNAL)
            .build()
        } else {
            // The buffer's bytes and the spliced values between them, in one sendmsg. The
            // slices point into `sending` and the leases, which stay put until the send
            // completes (neither is touched while `send_inflight`); the iovecs and the
            // header are the socket's, on the heap, so they do not move either.
            let g = &mut *sock.gather;
            g.iov.clear();
            let mut slices = [io::IoSlice::new(&[]); MAX_SLICES];
            let n = sock.spliced.gather(&sock.sending, sock.sent, &mut slices);
            for slice in &slices[..n] {
                g.iov.push(libc::iovec {
                    iov_base: slice.as_ptr() as *mut libc::c_void,
                    iov_len: slice.len(),
                });
            }
            g.hdr.msg_iov = g.iov.as_mut_ptr();
            g.hdr.msg_iovlen = g.iov.len() as _;
            opcode::SendMsg::new(types::Fd(sock.fd.as_raw_fd()), &g.hdr)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
        }
        .user_data(user_data(OP_SEND, sock.gen, slot));
        self.push(&e)?;
        sock.send_inflight = true;
        Ok(())
    }

    /// Submit what is queued and wait up to `timeout` (`None`: without limit) for at least one
    /// completion; then collect the completions.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<&[Completion]> {
        self.done.clear();
        let result = match timeout {
            // Not `submit_and_wait(0)`: an enter without GETEVENTS does not run the ring's
            // deferred completions (`DEFER_TASKRUN`), so a worker that polls because some
            // connection yielded would never see the other connections' new requests until
            // it waited for real. Asking for one completion with a zero timeout runs them
            // and returns at once (`ETIME` when none came).
            Some(t) if t.is_zero() => {
                let ts = types::Timespec::new();
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            None => self.ring.submit_and_wait(1),
        };
        match result {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) => return Err(e),
        }
        let mut cq = self.ring.completion();
        cq.sync();
        self.done.extend(cq.map(|e| Completion::from_entry(&e)));
        Ok(&self.done)
    }

    /// The bytes a receive completion brought in a provided buffer, before
    /// [`Reactor::complete`] takes them (None for anything else).
    pub fn received(&self, c: &Completion) -> Option<&[u8]> {
        if c.op != Op::Recv || c.result <= 0 {
            return None;
        }
        let bid = cqueue::buffer_select(c.flags)?;
        Some(self.bufs.data(bid, c.result as usize))
    }

    /// Apply a receive's or a send's completion to its connection, live (`sock`) or parked.
    /// Returns whether `sock` should be driven.
    pub fn complete(&mut self, c: &Completion, sock: Option<&mut RingSock>) -> bool {
        match sock {
            Some(sock) => self.apply(c, sock),
            None => {
                if let Some(sock) = self.parked.get_mut(&(c.slot, c.gen)) {
                    // A parked connection only waits for its operations to end.
                    let bid = (c.op == Op::Recv && c.result > 0)
                        .then(|| cqueue::buffer_select(c.flags))
                        .flatten();
                    match c.op {
                        // A multishot receive goes on until a completion without `more`.
                        Op::Recv if !c.more() => sock.recv_inflight = false,
                        Op::Send => sock.send_inflight = false,
                        _ => {}
                    }
                    let done = !sock.recv_inflight && !sock.send_inflight;
                    if done {
                        self.parked.remove(&(c.slot, c.gen));
                    }
                    if let Some(bid) = bid {
                        self.bufs.give_back(bid);
                        self.bufs.publish();
                    }
                }
                false
            }
        }
    }

    fn apply(&mut self, c: &Completion, sock: &mut RingSock) -> bool {
        match c.op {
            Op::Recv => {
                let more = c.more();
                if !more {
                    sock.recv_inflight = false;
                    if sock.recv_lent {
                        if let Some(l) = sock.lent.as_mut() {
                            // A lent buffer's one receive: what came (nothing after an end
                            // of file, an error or a cancellation).
                            let n = usize::try_from(c.result).unwrap_or(0);
                            l.received = Some(n.min(l.to - l.from));
                        }
                    }
                }
                // The kernel says whether the socket held more after this receive (where it
                // can tell: it never does on kernels that cannot).
                sock.nonempty = c.result > 0 && cqueue::sock_nonempty(c.flags);
                if c.result > 0 {
                    let n = c.result as usize;
                    if let Some(bid) = cqueue::buffer_select(c.flags) {
                        let data = self.bufs.data(bid, n);
                        sock.rx.extend_from_slice(data);
                        self.bufs.give_back(bid);
                        self.bufs.publish();
                        // A full buffer: the next receive goes to the connection's own. Once a
                        // multishot receive is cancelled for that, the smaller pieces still
                        // on their way do not undo it.
                        if n >= RX_BUF {
                            sock.direct = true;
                        } else if !sock.recv_cancelled {
                            sock.direct = false;
                        }
                        // A multishot receive stops when the input is not being read, or
                        // when the next receive should go to a buffer of the connection's
                        // own (a large request).
                        if more
                            && !sock.recv_cancelled
                            && (sock.direct || sock.rx.len() - sock.rx_pos > RX_HOLD)
                        {
                            self.cancel(OP_RECV, sock.gen, c.slot);
                            sock.recv_cancelled = true;
                        }
                    } else if sock.recv_direct {
                        let room = sock.rx.capacity() - sock.rx.len();
                        // SAFETY: the kernel wrote `n` bytes into the spare room the receive
                        // was given (it never writes more than it was given).
                        unsafe { sock.rx.set_len(sock.rx.len() + n.min(room)) };
                        sock.direct = n >= DIRECT_BUF / 2;
                    }
                } else if c.result == 0 {
                    sock.eof = true;
                } else if -c.result == libc::ENOBUFS {
                    // Every buffer is taken: armed again after this turn.
                    self.starved += 1;
                    return false;
                } else if -c.result != libc::ECANCELED {
                    sock.err = Some(-c.result);
                }
                true
            }
            Op::Send => {
                sock.send_inflight = false;
                if c.result < 0 {
                    sock.err = Some(-c.result);
                    return true;
                }
                sock.sent = sock
                    .spliced
                    .advance(sock.sending.len(), sock.sent, c.result as usize);
                if sock.unsent() {
                    // A short send: the rest goes next turn, from the same buffer.
                    if self.push_send(sock, c.slot).is_err() {
                        sock.err = Some(libc::EIO);
                    }
                    return false;
                }
                sock.sending.clear();
                sock.sent = 0;
                if sock.sending.capacity() > KEEP {
                    sock.sending = Vec::new();
                }
                true
            }
            Op::Poll | Op::Accept | Op::Read | Op::None => false,
        }
    }

    /// A connection is closing: end its operations and keep it until they have completed.
    pub fn retire(&mut self, slot: usize, mut sock: RingSock) {
        sock.send_staged_now();
        if !sock.recv_inflight && !sock.send_inflight {
            return; // dropped here: the descriptor closes
        }
        // SAFETY: shutdown on a descriptor this connection owns; it ends a pending receive
        // (with 0) and a pending send (with an error) and tells the peer at once.
        unsafe {
            libc::shutdown(sock.fd.as_raw_fd(), libc::SHUT_RDWR);
        }
        let recv = sock.recv_inflight && !sock.recv_cancelled;
        for (op, inflight) in [(OP_RECV, recv), (OP_SEND, sock.send_inflight)] {
            if inflight {
                self.cancel(op, sock.gen, slot);
            }
        }
        self.parked.insert((slot, sock.gen), sock);
    }

    /// Wait until every parked connection's operations have completed, for `limit` at most;
    /// whether they all did.
    fn drain(&mut self, limit: Duration) -> bool {
        let until = std::time::Instant::now() + limit;
        while !self.parked.is_empty() || self.reads_in_flight() > 0 {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let Ok(done) = self.wait(Some(left.min(Duration::from_millis(50)))) else {
                return false;
            };
            let done = done.to_vec();
            for c in &done {
                if let Some(buf) = self.read_done(c) {
                    self.spare_read(buf);
                } else {
                    self.complete(c, None);
                }
            }
        }
        true
    }

    /// Give up, for good, the memory the kernel may still use: the parked connections (their
    /// buffers and descriptors are never freed or closed) and the provided buffers (never
    /// unmapped). For a reactor whose operations did not all end when it was dropped: what
    /// the kernel writes or reads later then lands in memory nothing else will ever be given,
    /// at the cost of a leak when a worker ends, which is when the server stops.
    fn leak(&mut self) {
        for (_, sock) in self.parked.drain() {
            std::mem::forget(sock);
        }
        for buf in self.reads.drain(..).flatten() {
            std::mem::forget(buf);
        }
        self.bufs.leaked = true;
    }

    /// Ask the kernel to end connection `slot`'s operation `op` (its completion still comes).
    fn cancel(&mut self, op: u64, gen: u32, slot: usize) {
        let e = opcode::AsyncCancel::new(user_data(op, gen, slot))
            .build()
            .user_data(user_data(OP_NONE, 0, 0));
        let _ = self.push(&e);
    }
}

/// A connection's socket under the io_uring runtime: reads take what receives delivered,
/// writes stage output for the next send (see the module's documentation).
pub struct RingSock {
    fd: OwnedFd,
    /// Tells this connection's completions from those of an earlier one in the same slot.
    pub gen: u32,
    rx: Vec<u8>,
    rx_pos: usize,
    eof: bool,
    /// A receive or a send failed with this errno: reads and writes fail from now on.
    err: Option<i32>,
    recv_inflight: bool,
    /// The last receive's completion said the socket held more ([`RingSock::may_have_more`]).
    nonempty: bool,
    /// The multishot receive in flight was asked to end.
    recv_cancelled: bool,
    /// Receive into `rx` itself rather than a provided buffer (large requests), and
    /// whether the receive in flight does.
    direct: bool,
    recv_direct: bool,
    /// The connection's own input buffer, lent for a receive straight into it (the rest of a
    /// request whose length is known), and whether the receive in flight goes there.
    lent: Option<Lent>,
    recv_lent: bool,
    /// Output to send, and how much of it went; while a send is in flight the kernel reads
    /// it, so it is not touched until the completion.
    sending: Vec<u8>,
    sent: usize,
    /// Values sent from the log between the bytes of `sending` (`exec/splice.rs`).
    spliced: Splices,
    /// The `sendmsg` of a send with spliced values: its iovecs and header.
    gather: Box<Gather>,
    send_inflight: bool,
}

/// An input buffer lent by its connection: the kernel receives into `buf[from..to]`, and
/// once that receive has completed, `received` says how many bytes came.
struct Lent {
    buf: Vec<u8>,
    from: usize,
    to: usize,
    received: Option<usize>,
}

/// A `sendmsg` header (no address, no control data) and the iovecs it points at, filled
/// when a send with spliced values is queued.
struct Gather {
    iov: Vec<libc::iovec>,
    hdr: libc::msghdr,
}

impl Default for Gather {
    fn default() -> Gather {
        Gather {
            iov: Vec::new(),
            // SAFETY: all-zero is a valid msghdr (null pointers, zero lengths).
            hdr: unsafe { std::mem::zeroed() },
        }
    }
}

// SAFETY: the pointers lead into the socket's own send buffer and leases, and to these
// iovecs, which all travel with the socket; the kernel reads them only while its send is in
// flight.
unsafe impl Send for Gather {}

impl std::fmt::Debug for RingSock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingSock")
            .field("fd", &self.fd.as_raw_fd())
            .field("gen", &self.gen)
            .finish()
    }
}

impl RingSock {
    pub fn new(fd: OwnedFd, gen: u32) -> RingSock {
        RingSock {
            fd,
            gen: gen & GEN_MASK,
            rx: Vec::new(),
            rx_pos: 0,
            eof: false,
            err: None,
            recv_inflight: false,
            nonempty: false,
            recv_cancelled: false,
            direct: false,
            recv_direct: false,
            lent: None,
            recv_lent: false,
            sending: Vec::new(),
            sent: 0,
            spliced: Splices::default(),
            gather: Box::default(),
            send_inflight: false,
        }
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether every byte received so far has been taken.
    pub fn rx_empty(&self) -> bool {
        self.rx_pos == self.rx.len()
    }

    fn wants_recv(&self) -> bool {
        !self.recv_inflight && self.rx_pos == self.rx.len() && !self.eof && self.err.is_none()
    }

    /// Whether the socket held more than the last receive took (its completion said so:
    /// `IORING_CQE_F_SOCK_NONEMPTY`), so that more of what the peer sent is on its way.
    pub fn may_have_more(&self) -> bool {
        self.nonempty
    }

    /// Whether the connection's next bytes may go straight into a buffer of its own: nothing
    /// is queued or on its way to a provided buffer, and no buffer is lent already.
    pub fn can_lend(&self) -> bool {
        self.wants_recv() && self.lent.is_none()
    }

    /// Lend `buf` to receive the connection's next bytes into `buf[from..to]` (the receive is
    /// queued with the connection's others). Bytes already in `buf` stay; `buf` comes back
    /// with [`RingSock::reclaim`] once the receive has completed.
    pub fn lend(&mut self, buf: Vec<u8>, from: usize, to: usize) {
        let to = to.min(buf.len());
        let from = from.min(to);
        self.lent = Some(Lent {
            buf,
            from,
            to,
            received: None,
        });
    }

    /// The lent buffer and how many bytes were received into it, once its receive has
    /// completed (`None`: it is still the kernel's). With 0 bytes, the connection reads as
    /// usual next: the receive ended with end of file or an error.
    pub fn reclaim(&mut self) -> Option<(Vec<u8>, usize)> {
        if self.recv_inflight && self.recv_lent {
            return None;
        }
        self.lent.take().map(|l| (l.buf, l.received.unwrap_or(0)))
    }

    /// Bytes of a buffer lent by the connection (its input buffer, counted as such).
    pub fn lent_capacity(&self) -> usize {
        self.lent.as_ref().map_or(0, |l| l.buf.capacity())
    }

    /// A receive or a send failed: the connection must be driven to close.
    pub fn failed(&self) -> bool {
        self.err.is_some()
    }

    /// Output the kernel has not taken yet.
    pub fn owes(&self) -> bool {
        self.err.is_none() && (self.unsent() || self.send_inflight)
    }

    /// The error a receive or send failed with, if one did (reads and writes fail with it).
    pub fn error(&self) -> io::Result<()> {
        match self.err {
            Some(e) => Err(io::Error::from_raw_os_error(e)),
            None => Ok(()),
        }
    }

    /// Bytes of buffer memory it holds (for `-o read_buf_mem_limit` and the gauges).
    pub fn held(&self) -> usize {
        self.rx.capacity() + self.sending.capacity()
    }
}

impl std::os::fd::AsFd for RingSock {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl RingSock {
    /// Take `out[from..]` to send, by swapping buffers, when no output waits here: `out`
    /// gets back an empty buffer. Returns the bytes taken (`None`: output still waits; the
    /// caller keeps its own, as a socket that would block).
    /// `spliced`, the values to send between `out`'s bytes, come along (`spliced` is left
    /// empty).
    pub fn hand_over(
        &mut self,
        out: &mut Vec<u8>,
        from: usize,
        spliced: &mut Splices,
    ) -> Option<usize> {
        if self.send_inflight || self.unsent() || self.err.is_some() {
            return None;
        }
        let n = out.len().saturating_sub(from) + spliced.bytes();
        std::mem::swap(&mut self.sending, out);
        std::mem::swap(&mut self.spliced, spliced);
        self.sent = from.min(self.sending.len());
        out.clear();
        Some(n)
    }

    /// Output is queued here that the kernel has not taken yet.
    fn unsent(&self) -> bool {
        self.sent < self.sending.len() || !self.spliced.is_empty()
    }

    /// The connection closes with bytes staged that no send has taken (the alert a TLS
    /// session wrote as it failed): give them to the socket now, without waiting, as the
    /// epoll runtime's last write does. Best effort: what the socket does not take at once is
    /// dropped, and nothing is sent behind a send still in flight or with values spliced in.
    fn send_staged_now(&mut self) {
        if self.send_inflight || self.err.is_some() || !self.spliced.is_empty() {
            return;
        }
        let Some(rest) = self.sending.get(self.sent..) else {
            return;
        };
        if rest.is_empty() {
            return;
        }
        // SAFETY: `rest` is valid for its length; the descriptor is this socket's own, open,
        // and no operation of the kernel's uses the buffer (no send is in flight).
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            self.sent += n as usize;
        }
    }
}

impl Read for RingSock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let have = self.rx.len() - self.rx_pos;
        if have > 0 {
            let n = have.min(buf.len());
            buf[..n].copy_from_slice(&self.rx[self.rx_pos..self.rx_pos + n]);
            self.rx_pos += n;
            if self.rx_pos == self.rx.len() {
                self.rx.clear();
                self.rx_pos = 0;
                if self.rx.capacity() > KEEP_RX && !self.direct {
                    self.rx = Vec::new();
                }
            }
            return Ok(n);
        }
        if let Some(e) = self.err {
            return Err(io::Error::from_raw_os_error(e));
        }
        if self.eof {
            return Ok(0);
        }
        Err(io::ErrorKind::WouldBlock.into())
    }
}

impl Write for RingSock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(e) = self.err {
            return Err(io::Error::from_raw_os_error(e));
        }
        let room = STAGE_MAX.saturating_sub(self.sending.len());
        if self.send_inflight || room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = room.min(buf.len());
        self.sending.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// Say in the test output that the running test checked nothing here, and why: a line
    /// `SKIP <test>: <why>` written to stderr itself, which the test harness does not
    /// capture (as it does `eprintln!`), so it shows even when the test passes;
    /// `scripts/test.sh` counts these lines.
    fn skip(why: impl std::fmt::Display) {
        let thread = std::thread::current();
        let test = thread.name().unwrap_or("ring test");
        let _ = io::stderr().write_all(format!("SKIP {test}: {why}\n").as_bytes());
    }

    /// A reactor and a connected pair: the server side as a `RingSock`, the peer as a plain
    /// blocking socket. `None` where this kernel has no io_uring (the test then has nothing
    /// to check, and says so: [`skip`]).
    fn setup() -> Option<(Reactor, RingSock, UnixStream)> {
        setup_with(None)
    }

    /// [`setup`] with the reactor's `sqpoll` setting.
    fn setup_with(sqpoll: Option<u32>) -> Option<(Reactor, RingSock, UnixStream)> {
        let reactor = match Reactor::new(sqpoll, None) {
            Ok(r) => r,
            Err(e) => {
                skip(format_args!("io_uring unavailable here ({e})"));
                return None;
            }
        };
        let (a, b) = UnixStream::pair().ok()?;
        Some((reactor, RingSock::new(OwnedFd::from(a), 7), b))
    }

    /// [`setup`] where receives are multishot; `None` where this kernel has none.
    fn setup_multishot() -> Option<(Reactor, RingSock, UnixStream)> {
        let (r, sock, peer) = setup()?;
        if !r.multishot {
            skip("no multishot receives on this kernel");
            return None;
        }
        Some((r, sock, peer))
    }

    /// Bytes waiting to be read on the socket `fd` (`FIONREAD`).
    fn queued(fd: RawFd) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int through the pointer, which points at `n`.
        let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
        assert_eq!(r, 0, "FIONREAD: {}", io::Error::last_os_error());
        usize::try_from(n).unwrap_or(0)
    }

    /// [`setup`] with single receives (what kernels before 6.0 get) or multishot ones.
    fn setup_mode(multishot: bool) -> Option<(Reactor, RingSock, UnixStream)> {
        let (mut r, sock, peer) = setup()?;
        r.multishot &= multishot;
        Some((r, sock, peer))
    }

    /// Wait for completions until `f` has seen one it accepts (at most 100 waits of 1 s).
    fn until(r: &mut Reactor, sock: &mut RingSock, mut f: impl FnMut(&Completion) -> bool) {
        for _ in 0..100 {
            let done: Vec<Completion> = r.wait(Some(Duration::from_secs(1))).unwrap().to_vec();
            let mut hit = false;
            for c in &done {
                if c.op == Op::Recv || c.op == Op::Send {
                    assert_eq!((c.slot, c.gen), (3, 7), "completion for another connection");
                    r.complete(c, Some(sock));
                    hit |= f(c);
                }
            }
            if hit {
                return;
            }
        }
        panic!("no completion came");
    }

    /// How long a test lets [`Reactor::drain`] wait: far longer than the kernel needs to end
    /// operations that were cancelled, on any machine.
    const GENEROUS: Duration = Duration::from_secs(100);

    fn read_all(sock: &mut RingSock) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 1000];
        loop {
            match sock.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                    return out;
                }
            }
        }
    }

    #[test]
    fn receives_and_sends_through_the_ring() {
        for multishot in [false, true] {
            let Some((mut r, sock, peer)) = setup() else {
                return;
            };
            r.multishot &= multishot;
            receives_and_sends_through_the_ring_in(r, sock, peer);
        }
    }

    /// Output with spliced values goes out as one stream, in order, through `sendmsg`, also
    /// when the socket takes it a part at a time (a unix socket's buffer is far smaller than
    /// the values); the leases are dropped once sent.
    #[test]
    fn sends_spliced_values_in_order() {
        use kvstore::Engine;
        let Some((mut r, mut sock, mut peer)) = setup() else {
            return;
        };
        let values: Vec<Vec<u8>> = (0..3u8)
            .map(|i| {
                (0..300_000 + i as usize * 1000)
                    .map(|j| (j % 251) as u8 ^ i)
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let (e, leases) = crate::exec::splice::test_leases(&refs);
        let mut spliced = Splices::default();
        let mut out = Vec::new();
        let mut expect = Vec::new();
        for (i, (v, lease)) in values.iter().zip(leases).enumerate() {
            let head = format!("VALUE k{i} 0 {}\r\n", v.len());
            out.extend_from_slice(head.as_bytes());
            expect.extend_from_slice(head.as_bytes());
            spliced.push(out.len(), lease);
            out.extend_from_slice(b"\r\n");
            expect.extend_from_slice(v);
            expect.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"END\r\n");
        expect.extend_from_slice(b"END\r\n");
        assert_eq!(
            e.stats_detail("slabs")
                .iter()
                .find(|(k, _)| k == "leased_bytes")
                .map(|(_, v)| v != "0"),
            Some(true)
        );
        let n = expect.len();
        assert_eq!(sock.hand_over(&mut out, 0, &mut spliced), Some(n));
        assert!(spliced.is_empty() && out.is_empty());
        r.arm(&mut sock, 3).unwrap();
        // The first send goes before the peer reads, so it stops at what the socket buffer
        // holds: a short send however quickly a reader would have drained the socket.
        until(&mut r, &mut sock, |c| c.op == Op::Send);
        let mut sends = 1;
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; n];
            peer.read_exact(&mut got).map(|_| got)
        });
        while sock.owes() {
            until(&mut r, &mut sock, |c| c.op == Op::Send);
            sends += 1;
        }
        let got = reader.join().unwrap().unwrap();
        assert!(got == expect, "the stream differs");
        assert!(sends > 1, "one send took it all: no short send was tested");
        let leased = e
            .stats_detail("slabs")
            .into_iter()
            .find(|(k, _)| k == "leased_bytes");
        assert_eq!(leased.map(|(_, v)| v), Some("0".to_string()));
    }

    /// The same with a kernel thread polling the submission queue (`-o io_sqpoll`), where
    /// the kernel allows one; and with a full submission queue, which then waits for the
    /// thread to take entries rather than submitting them itself.
    #[test]
    fn receives_and_sends_through_an_sqpoll_ring() {
        let Some((mut r, sock, peer)) = setup_with(Some(5)) else {
            return;
        };
        if !r.sqpoll() {
            skip("no SQPOLL here");
            return;
        }
        let nop = opcode::Nop::new().build().user_data(u64::MAX);
        for _ in 0..ENTRIES + ENTRIES / 2 {
            r.push(&nop).unwrap();
        }
        receives_and_sends_through_the_ring_in(r, sock, peer);
    }

    fn receives_and_sends_through_the_ring_in(
        mut r: Reactor,
        mut sock: RingSock,
        mut peer: UnixStream,
    ) {
        // Nothing has arrived: a read would block, and a receive is armed.
        assert_eq!(
            sock.read(&mut [0u8; 16]).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        r.arm(&mut sock, 3).unwrap();
        peer.write_all(b"get a\r\n").unwrap();
        until(&mut r, &mut sock, |c| c.op == Op::Recv);
        assert_eq!(read_all(&mut sock), b"get a\r\n");

        // A reply handed over is sent by the next turn; meanwhile writes wait.
        let mut out = b"VALUE a 0 1\r\nx\r\nEND\r\n".to_vec();
        assert_eq!(
            sock.hand_over(&mut out, 0, &mut Splices::default()),
            Some(21)
        );
        assert!(out.is_empty());
        assert!(sock.owes());
        r.arm(&mut sock, 3).unwrap();
        assert_eq!(
            sock.write(b"more").unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(
            sock.hand_over(&mut b"more".to_vec(), 0, &mut Splices::default()),
            None
        );
        until(&mut r, &mut sock, |c| c.op == Op::Send);
        assert!(!sock.owes());
        let mut got = [0u8; 21];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"VALUE a 0 1\r\nx\r\nEND\r\n");

        // The peer finishes: the next receive reports the end.
        drop(peer);
        until(&mut r, &mut sock, |c| c.op == Op::Recv);
        assert_eq!(sock.read(&mut [0u8; 16]).unwrap(), 0);
    }

    /// Reads of a file through the ring (a flash tier's): each completion carries its
    /// read's number, its buffer holds the bytes at the offset asked, numbers and buffers
    /// are used again, and a read past the end completes short; a reactor dropped with a
    /// read in flight waits for it.
    #[test]
    fn reads_of_a_file_complete_with_their_bytes() {
        let Some((mut r, _sock, _peer)) = setup() else {
            return;
        };
        let path = std::env::temp_dir().join(format!("ring-read-{}", std::process::id()));
        let bytes: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).expect("write the file");
        let file = std::fs::File::open(&path).expect("open the file");
        let _ = std::fs::remove_file(&path);
        for round in 0..3 {
            let a = r
                .read_at(file.as_raw_fd(), 4096, 4096)
                .expect("queue a read");
            let b = r
                .read_at(file.as_raw_fd(), 2 * 4096, 2 * 4096)
                .expect("queue a read");
            assert_ne!(a, b);
            let mut seen = Vec::new();
            while seen.len() < 2 {
                let done = r.wait(Some(Duration::from_secs(5))).expect("wait").to_vec();
                for c in done.iter().filter(|c| c.op == Op::Read) {
                    let mut buf = r.read_done(c).expect("a read's buffer");
                    let n = usize::try_from(c.result()).expect("a read's length");
                    let at = if c.slot == a { 4096 } else { 2 * 4096 };
                    // The second read stops at the file's end, 4096 bytes in.
                    assert_eq!(n, 4096, "round {round}");
                    assert_eq!(&buf.get(n)[..], &bytes[at..at + n], "round {round}");
                    assert!(r.read_done(c).is_none(), "a completion taken twice");
                    r.spare_read(buf);
                    seen.push(c.slot);
                }
            }
            seen.sort_unstable();
            assert_eq!(seen, [a.min(b), a.max(b)]);
        }
        assert_eq!(r.reads_in_flight(), 0);
        assert!(r.reads.len() <= 2, "read numbers not used again");
        r.read_at(file.as_raw_fd(), 0, 4096).expect("queue a read");
        assert_eq!(r.reads_in_flight(), 1);
        drop(r);
    }

    /// A wait that must not block (a connection yielded, so the worker polls) still
    /// delivers a receive that completed meanwhile: with `DEFER_TASKRUN` it is deferred
    /// work that only an enter with GETEVENTS runs. Without that, a connection that yields
    /// turn after turn (a long dump, a deep pipeline) kept the worker from ever seeing its
    /// other connections' requests until it stopped.
    #[test]
    fn a_wait_without_blocking_delivers_what_completed() {
        for multishot in [false, true] {
            let Some((mut r, mut sock, mut peer)) = setup_mode(multishot) else {
                return;
            };
            r.arm(&mut sock, 3).unwrap();
            // Submitted, nothing arrived yet.
            assert!(r.wait(Some(Duration::ZERO)).unwrap().is_empty());
            peer.write_all(b"get a\r\n").unwrap();
            let done = r.wait(Some(Duration::ZERO)).unwrap().to_vec();
            assert!(
                done.iter().any(|c| c.op == Op::Recv && c.result > 0),
                "no receive completion in {done:?}"
            );
        }
    }

    #[test]
    fn one_multishot_receive_takes_request_after_request() {
        let Some((mut r, mut sock, mut peer)) = setup_multishot() else {
            return;
        };
        r.arm(&mut sock, 3).unwrap();
        for i in 0..5 {
            let line = format!("get k{i}\r\n");
            peer.write_all(line.as_bytes()).unwrap();
            until(&mut r, &mut sock, |c| c.op == Op::Recv);
            assert_eq!(read_all(&mut sock), line.as_bytes());
            assert!(sock.recv_inflight, "the receive goes on after request {i}");
            // Arming again queues nothing: the one receive is still in flight.
            let queued = r.ring.submission().len();
            r.arm(&mut sock, 3).unwrap();
            assert_eq!(r.ring.submission().len(), queued);
        }
    }

    #[test]
    fn unread_input_ends_the_multishot_receive_and_nothing_is_lost() {
        let Some((mut r, mut sock, mut peer)) = setup_multishot() else {
            return;
        };
        r.arm(&mut sock, 3).unwrap();
        // The connection reads nothing while the peer sends piece after piece.
        let mut sent = Vec::new();
        for i in 0..100u32 {
            let piece: Vec<u8> = (0..1000u32).map(|j| ((i * 7 + j) % 251) as u8).collect();
            peer.write_all(&piece).unwrap();
            sent.extend_from_slice(&piece);
            until(&mut r, &mut sock, |c| c.op == Op::Recv);
            if !sock.recv_inflight {
                break;
            }
        }
        assert!(
            !sock.recv_inflight,
            "the receive went on with the input unread"
        );
        let held = sock.rx.len() - sock.rx_pos;
        assert!(
            held > RX_HOLD && held <= RX_HOLD + usize::from(RX_BUFS) * RX_BUF,
            "held {held}"
        );
        // Once the input is read, receiving resumes, and every byte arrives in order.
        let mut got = read_all(&mut sock);
        for _ in 0..100 {
            if got.len() == sent.len() {
                break;
            }
            r.arm(&mut sock, 3).unwrap();
            assert!(sock.recv_inflight);
            until(&mut r, &mut sock, |c| c.op == Op::Recv);
            got.extend(read_all(&mut sock));
        }
        assert_eq!(got, sent, "bytes lost or reordered");
    }

    #[test]
    fn kernel_versions_compare() {
        assert!(kernel_at_least(2, 6));
        assert!(!kernel_at_least(999, 0));
    }

    #[test]
    fn a_large_request_switches_to_a_buffer_of_its_own() {
        for multishot in [false, true] {
            a_large_request_switches_to_a_buffer_of_its_own_in(multishot);
        }
    }

    fn a_large_request_switches_to_a_buffer_of_its_own_in(multishot: bool) {
        let Some((mut r, mut sock, mut peer)) = setup_mode(multishot) else {
            return;
        };
        // Four times what the ring's provided buffers hold: a multishot receive cannot take
        // it all before it is cancelled for the switch, so receives of the connection's own
        // follow.
        let len = 4 * RX_BUF * usize::from(RX_BUFS);
        let big: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let writer = {
            let big = big.clone();
            let mut peer = peer.try_clone().unwrap();
            std::thread::spawn(move || peer.write_all(&big).unwrap())
        };
        // A receive switches to the connection's own buffer after a full provided buffer.
        // Wait until a full one's worth is queued before the first receive is armed: on a
        // busy machine the writer may have sent only a little by then, and a multishot
        // receive would take each piece as it came.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while queued(sock.fd()) < RX_BUF {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer sent {} bytes in 10 s",
                queued(sock.fd())
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut got = Vec::new();
        let mut direct_seen = false;
        while got.len() < big.len() {
            r.arm(&mut sock, 3).unwrap();
            direct_seen |= sock.recv_direct;
            until(&mut r, &mut sock, |c| c.op == Op::Recv);
            got.extend(read_all(&mut sock));
        }
        writer.join().unwrap();
        assert_eq!(got, big, "bytes lost or reordered");
        assert!(direct_seen, "a stream of full buffers never went direct");
        // Small requests again: back to the shared buffers, and the input queue shrinks.
        peer.write_all(b"version\r\n").unwrap();
        r.arm(&mut sock, 3).unwrap();
        until(&mut r, &mut sock, |c| c.op == Op::Recv);
        assert_eq!(read_all(&mut sock), b"version\r\n");
        assert!(!sock.direct);
        assert!(sock.held() <= KEEP_RX + KEEP, "held {}", sock.held());
    }

    #[test]
    fn a_lent_buffer_takes_the_bytes_after_those_it_holds() {
        for multishot in [false, true] {
            let Some((mut r, mut sock, mut peer)) = setup_mode(multishot) else {
                return;
            };
            assert!(sock.can_lend());
            let mut buf = b"set k 0 0 8\r\n".to_vec();
            let have = buf.len();
            buf.resize(have + 64, 0);
            sock.lend(buf, have, have + 10);
            assert!(!sock.can_lend(), "one buffer at a time");
            r.arm(&mut sock, 3).unwrap();
            assert!(sock.recv_inflight && sock.recv_lent);
            assert!(
                sock.reclaim().is_none(),
                "the kernel's until the receive completes"
            );
            // More than the room lent: the rest waits in the socket for the next receive.
            peer.write_all(b"12345678\r\nget k\r\n").unwrap();
            until(&mut r, &mut sock, |c| c.op == Op::Recv);
            // Arming again queues nothing for a buffer that waits to be reclaimed.
            let queued = r.ring.submission().len();
            r.arm(&mut sock, 3).unwrap();
            assert_eq!(r.ring.submission().len(), queued);
            let (buf, got) = sock.reclaim().unwrap();
            assert_eq!(got, 10);
            assert_eq!(&buf[..have + got], b"set k 0 0 8\r\n12345678\r\n");
            assert!(sock.reclaim().is_none());
            // A lent buffer's receive leaves the socket's own input empty; the rest comes
            // through the usual receive.
            assert_eq!(sock.rx.len(), 0);
            r.arm(&mut sock, 3).unwrap();
            until(&mut r, &mut sock, |c| c.op == Op::Recv);
            assert_eq!(read_all(&mut sock), b"get k\r\n");
        }
    }

    #[test]
    fn a_connection_closed_with_a_lent_buffer_is_kept_until_its_receive_ends() {
        let Some((mut r, mut sock, _peer)) = setup() else {
            return;
        };
        sock.lend(vec![0; 4096], 0, 4096);
        r.arm(&mut sock, 3).unwrap();
        assert!(sock.recv_inflight);
        r.retire(3, sock);
        assert_eq!(
            r.parked.len(),
            1,
            "the buffer is the kernel's: parked with it"
        );
        assert!(r.drain(GENEROUS), "the receive never ended");
        assert!(r.parked.is_empty());
    }

    /// Output staged when the connection closes, before any send took it (the alert of a
    /// failed TLS session), still reaches the peer, then the end: closed at once, and closed
    /// with a receive in flight.
    #[test]
    fn output_staged_at_close_is_sent() {
        for armed in [false, true] {
            let Some((mut r, mut sock, mut peer)) = setup() else {
                return;
            };
            if armed {
                r.arm(&mut sock, 3).unwrap();
                assert!(sock.recv_inflight);
            }
            assert_eq!(sock.write(b"last words").unwrap(), 10);
            assert!(sock.owes() && !sock.send_inflight);
            r.retire(3, sock);
            assert!(r.drain(GENEROUS), "the closed connection was never let go");
            let mut got = Vec::new();
            peer.set_read_timeout(Some(GENEROUS)).unwrap();
            peer.read_to_end(&mut got).unwrap();
            assert_eq!(got, b"last words", "armed: {armed}");
        }
    }

    #[test]
    fn a_reactor_whose_operations_do_not_end_frees_nothing_they_use() {
        let Some((mut r, mut sock, mut peer)) = setup() else {
            return;
        };
        sock.lend(vec![0; 4096], 0, 4096);
        r.arm(&mut sock, 3).unwrap();
        // Submitted, then parked without the shutdown and cancellation `retire` makes: the
        // receive stays in flight, its buffer the kernel's.
        assert!(r.wait(Some(Duration::ZERO)).unwrap().is_empty());
        assert!(sock.recv_inflight);
        r.parked.insert((3, sock.gen), sock);
        assert!(!r.drain(Duration::ZERO), "drained with a receive in flight");
        assert_eq!(r.parked.len(), 1, "let go with a receive in flight");
        // What a drop does when its wait runs out: the buffers are given up, not freed.
        r.leak();
        assert!(r.parked.is_empty() && r.bufs.leaked);
        drop(r);
        peer.write_all(b"late").unwrap();
    }

    #[test]
    fn a_connection_closed_with_operations_in_flight_is_kept_until_they_end() {
        for multishot in [false, true] {
            a_connection_closed_with_operations_in_flight_is_kept_until_they_end_in(multishot);
        }
    }

    fn a_connection_closed_with_operations_in_flight_is_kept_until_they_end_in(multishot: bool) {
        let Some((mut r, mut sock, peer)) = setup_mode(multishot) else {
            return;
        };
        // A receive that will not complete by itself, and a send to a peer that does not
        // read, larger than the socket buffers take.
        r.arm(&mut sock, 3).unwrap();
        let mut out = vec![b'x'; 8 << 20];
        assert!(sock
            .hand_over(&mut out, 0, &mut Splices::default())
            .is_some());
        r.arm(&mut sock, 3).unwrap();
        // Let the send go as far as it can (short sends go on from where they stopped).
        for _ in 0..10 {
            let done: Vec<Completion> = r.wait(Some(Duration::from_millis(50))).unwrap().to_vec();
            for c in &done {
                r.complete(c, Some(&mut sock));
            }
        }
        assert!(sock.recv_inflight && sock.send_inflight);
        r.retire(3, sock);
        assert_eq!(r.parked.len(), 1);
        assert!(r.drain(GENEROUS), "the closed connection was never let go");
        assert!(r.parked.is_empty());
        // Its descriptor is closed: the peer sees the end.
        let mut peer = peer;
        let mut buf = [0u8; 1 << 16];
        let mut total = 0;
        loop {
            match peer.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("peer read: {e}"),
            }
        }
        assert!(
            total < 8 << 20,
            "the whole send went through a shut-down socket"
        );
    }

    #[test]
    fn a_failed_send_fails_the_connection_and_owes_nothing() {
        for multishot in [false, true] {
            a_failed_send_fails_the_connection_and_owes_nothing_in(multishot);
        }
    }

    fn a_failed_send_fails_the_connection_and_owes_nothing_in(multishot: bool) {
        let Some((mut r, mut sock, peer)) = setup_mode(multishot) else {
            return;
        };
        drop(peer);
        let mut out = b"END\r\n".to_vec();
        assert!(sock
            .hand_over(&mut out, 0, &mut Splices::default())
            .is_some());
        r.arm(&mut sock, 3).unwrap();
        until(&mut r, &mut sock, |c| c.op == Op::Send);
        assert!(sock.failed());
        assert!(!sock.owes(), "a failed connection must be able to close");
        assert!(sock.write(b"x").is_err());
    }

    #[test]
    fn a_generation_past_the_mask_still_matches_its_completions() {
        // A worker's counter wraps at u32; completions carry 29 bits of it. A connection
        // whose generation had more bits never saw its own completions.
        let Some((mut r, _, _)) = setup() else {
            return;
        };
        let (a, mut peer) = UnixStream::pair().unwrap();
        let mut sock = RingSock::new(OwnedFd::from(a), 0xffff_fff7);
        r.arm(&mut sock, 3).unwrap();
        peer.write_all(b"version\r\n").unwrap();
        let mut matched = false;
        for _ in 0..100 {
            let done: Vec<Completion> = r.wait(Some(Duration::from_secs(1))).unwrap().to_vec();
            for c in done.iter().filter(|c| c.op == Op::Recv) {
                assert_eq!(
                    (c.slot, c.gen),
                    (3, sock.gen),
                    "completion for another connection"
                );
                matched = true;
            }
            if matched {
                break;
            }
        }
        assert!(matched, "no receive completed");
    }

    #[test]
    fn a_multishot_accept_takes_each_connection_until_cancelled() {
        use std::net::{TcpListener, TcpStream};
        let Some((mut r, _, _)) = setup() else {
            return;
        };
        // As the server binds: non-blocking, with TCP_NODELAY.
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.set_tcp_nodelay(true).unwrap();
        socket
            .bind(
                &"127.0.0.1:0"
                    .parse::<std::net::SocketAddr>()
                    .unwrap()
                    .into(),
            )
            .unwrap();
        socket.listen(16).unwrap();
        socket.set_nonblocking(true).unwrap();
        let listener: TcpListener = socket.into();
        let addr = listener.local_addr().unwrap();
        r.arm_accept(listener.as_raw_fd(), 5).unwrap();
        let clients: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut fds = Vec::new();
        for _ in 0..100 {
            let done: Vec<Completion> = r.wait(Some(Duration::from_secs(1))).unwrap().to_vec();
            for c in done.iter().filter(|c| c.op == Op::Accept) {
                assert_eq!(c.slot, 5, "the listener's index");
                assert!(c.result() >= 0, "accept failed: {}", c.result());
                assert!(c.more(), "the accept ended after one connection");
                // SAFETY: the kernel made this descriptor for the test's accept.
                fds.push(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(c.result()) });
            }
            if fds.len() == clients.len() {
                break;
            }
        }
        assert_eq!(fds.len(), clients.len(), "connections accepted");
        let mut peers: Vec<_> = fds
            .iter()
            .map(|fd| {
                let s = socket2::SockRef::from(fd);
                // What a RingSock needs (blocking) and what the server wants (no Nagle).
                assert!(
                    !s.nonblocking().unwrap(),
                    "an accepted descriptor is non-blocking"
                );
                assert!(s.tcp_nodelay().unwrap(), "TCP_NODELAY did not carry over");
                s.peer_addr().unwrap().as_socket().unwrap()
            })
            .collect();
        let mut locals: Vec<_> = clients.iter().map(|c| c.local_addr().unwrap()).collect();
        peers.sort();
        locals.sort();
        assert_eq!(peers, locals, "each client accepted once");
        r.cancel_accept(5);
        let mut ended = false;
        for _ in 0..100 {
            let done: Vec<Completion> = r.wait(Some(Duration::from_secs(1))).unwrap().to_vec();
            for c in done.iter().filter(|c| c.op == Op::Accept) {
                assert!(!c.more(), "a cancelled accept goes on");
                assert_eq!(c.result(), -libc::ECANCELED);
                ended = true;
            }
            if ended {
                break;
            }
        }
        assert!(ended, "the cancelled accept never completed");
        // Nothing accepts now: a new connection waits in the backlog.
        let _late = TcpStream::connect(addr).unwrap();
        let done: Vec<Completion> = r.wait(Some(Duration::from_millis(50))).unwrap().to_vec();
        assert!(
            done.iter().all(|c| c.op != Op::Accept),
            "accepted after the cancel"
        );
        assert!(
            listener.accept().is_ok(),
            "the late connection is in the backlog"
        );
    }
}
