//! [`Tier`]: the flash files of one server as one set of pages (memcached's `ext_path`,
//! repeatable), which pages are free, each page's write generation, the writes queued to
//! the writer threads (`ext_threads`) within a bound of buffered bytes (`ext_wbuf_size`),
//! and the counters memcached's `stats` shows for extstore.
//!
//! # Pages and generations
//!
//! Pages are numbered across the files (the first file's, then the next's), and handed out
//! from a free list that alternates between the files, so consecutive writes go to
//! different devices. Each page has a generation, bumped when it is freed: a [`Loc`] names
//! a page at one generation. A read succeeds only if the page held that generation from
//! before the read began until after its bytes were checked (each block's CRC covers the
//! generation, and the generation is loaded again after the read), so a reader that raced
//! with a page's reuse gets [`TierError::Stale`], never another segment's bytes.
//!
//! # Writes
//!
//! [`Tier::write`] encodes the image on the caller's thread (a copy and a CRC: the caller
//! may reuse its memory as soon as the call returns) into a buffer counted against the
//! write buffer, and queues it; a writer thread writes it and calls the caller's `done`
//! with the outcome. When the buffer is full the write is refused at once
//! ([`TierError::Busy`]): callers (eviction) never wait for the device. After
//! `OFFLINE_AFTER` write errors in a row the tier goes offline: [`Tier::accepts_writes`]
//! says no, except once in `PROBE_EVERY` asks, when the next [`Tier::alloc`] hands out a
//! page for a probe write. The first write that succeeds brings the tier back online
//! (the device was replaced, space was freed); [`Tier::last_error`] keeps what failed.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use thiserror::Error;

use super::file::{AlignedBuf, FlashError, FlashFile};
use super::layout::{blocks_for, BLOCK};

/// Write errors in a row that take the tier offline.
const OFFLINE_AFTER: u32 = 8;

/// While offline, one ask in this many of [`Tier::accepts_writes`] is let through to try
/// a write (a count, not a clock: a tier nobody writes to needs no probe).
const PROBE_EVERY: u32 = 64;

/// A read that the caller submits itself ([`Tier::read_span`]): `len` bytes at offset `at`
/// of descriptor `fd`, into a buffer aligned as an [`AlignedBuf`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadSpan {
    pub fd: std::os::fd::RawFd,
    pub at: u64,
    pub len: usize,
}

/// What a tier is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierConfig {
    /// The flash files and the bytes each may take (`ext_path=PATH:SIZE`).
    pub files: Vec<(PathBuf, u64)>,
    /// Bytes of segment image a page holds (the engine's segment size).
    pub page_bytes: usize,
    /// Writer threads (`ext_threads`), at least one.
    pub write_threads: usize,
    /// Bytes of encoded pages that may wait for a writer (`ext_wbuf_size`); at least one
    /// page's worth is always allowed.
    pub write_buffer: usize,
    /// Bypass the page cache (`O_DIRECT`, where the file system allows it); else go
    /// through it, as memcached's extstore does.
    pub direct: bool,
}

/// A page at one write generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loc {
    pub page: u32,
    pub gen: u32,
}

/// Why the tier could not do what was asked.
#[derive(Debug, Error)]
pub enum TierError {
    #[error(transparent)]
    Flash(#[from] FlashError),
    #[error("the page was freed or reused while it was read")]
    Stale,
    #[error("the flash write buffer is full")]
    Busy,
    #[error("page {0} is not a page of this tier")]
    NoSuchPage(u32),
    #[error("no flash file given")]
    NoFiles,
    #[error("{0}: made for another size or page size than this configuration's")]
    Geometry(PathBuf),
}

/// The tier's counters, under memcached's extstore names where the meaning is the same.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Bytes of flash the pages cover (`extstore_limit_maxbytes`).
    pub limit_maxbytes: u64,
    pub pages_free: u64,
    pub pages_used: u64,
    /// Pages handed out, ever (`extstore_page_allocs`).
    pub page_allocs: u64,
    /// Pages freed, ever (`extstore_page_reclaims`).
    pub page_reclaims: u64,
    /// Bytes written to the files, whole blocks (`extstore_bytes_written`).
    pub bytes_written: u64,
    /// Bytes read from the files, whole blocks (`extstore_bytes_read`).
    pub bytes_read: u64,
    /// Writes waiting for a writer (`extstore_io_queue`).
    pub io_queue: u64,
    /// kvcached's own: writes refused because the buffer was full.
    pub writes_busy: u64,
    /// kvcached's own: failed writes and reads (I/O errors, damaged or short blocks).
    pub io_errors: u64,
    /// kvcached's own: whether the tier is offline after write errors.
    pub offline: bool,
    /// kvcached's own: times a probe write brought the tier back online.
    pub recoveries: u64,
}

type Done = Box<dyn FnOnce(Result<usize, TierError>) + Send>;

struct Job {
    loc: Loc,
    blocks: AlignedBuf,
    len: usize,
    done: Done,
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Writes taken by a writer and not finished yet.
    running: usize,
    stop: bool,
}

struct Inner {
    files: Vec<FlashFile>,
    /// The first global page number of each file, and one past the last.
    starts: Vec<u32>,
    gens: Box<[AtomicU32]>,
    free: Mutex<VecDeque<u32>>,
    queue: Mutex<Queue>,
    /// Signalled when a job is queued or stop is asked (writers wait on it).
    work: Condvar,
    /// Signalled when a job finishes (`drain` waits on it).
    idle: Condvar,
    buffered: AtomicUsize,
    write_buffer: usize,
    errors_in_row: AtomicU32,
    offline: AtomicBool,
    /// Asks of `accepts_writes` while offline, and whether a probe's page may be handed out.
    offline_asks: AtomicU32,
    probe: AtomicBool,
    /// The last write error, as text (for the server's log and `stats`).
    last_error: Mutex<Option<String>>,
    /// Times the tier came back online after a probe write succeeded.
    recoveries: AtomicU64,
    /// An encoded-page buffer kept for reuse (at most one).
    spare: Mutex<Vec<AlignedBuf>>,
    page_allocs: AtomicU64,
    page_reclaims: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    writes_busy: AtomicU64,
    io_errors: AtomicU64,
    #[cfg(test)]
    hold: Mutex<()>,
    #[cfg(test)]
    fail_writes: AtomicBool,
}

/// A flash tier: its files, pages and writer threads. Dropping it finishes the queued
/// writes and stops the threads.
pub struct Tier {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier")
            .field("files", &self.inner.files.len())
            .field("pages", &self.inner.gens.len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Tier {
    /// Make the files afresh (what they held is gone) and start the writers.
    pub fn create(config: &TierConfig) -> Result<Tier, TierError> {
        if config.files.is_empty() {
            return Err(TierError::NoFiles);
        }
        let mut files = Vec::with_capacity(config.files.len());
        for (path, size) in &config.files {
            let mut file = FlashFile::create(path, *size, config.page_bytes)?;
            if !config.direct {
                file.use_page_cache()?;
            }
            files.push(file);
        }
        Ok(Tier::start(files, config))
    }

    /// Open the files as they are, with what they hold (a warm restart's): each must have
    /// the geometry [`Tier::create`] would give it under `config` (`Geometry` if not).
    /// Every page starts free, at generation 1; [`Tier::claim`] takes the pages that hold
    /// what the caller still points at.
    pub fn open(config: &TierConfig) -> Result<Tier, TierError> {
        if config.files.is_empty() {
            return Err(TierError::NoFiles);
        }
        let mut files = Vec::with_capacity(config.files.len());
        for (path, size) in &config.files {
            let mut file = FlashFile::open(path)?;
            if !file.made_for(*size, config.page_bytes) {
                return Err(TierError::Geometry(path.clone()));
            }
            if !config.direct {
                file.use_page_cache()?;
            }
            files.push(file);
        }
        Ok(Tier::start(files, config))
    }

    fn start(files: Vec<FlashFile>, config: &TierConfig) -> Tier {
        let mut starts = vec![0u32];
        for f in &files {
            let last = starts.last().copied().unwrap_or(0);
            starts.push(last.saturating_add(f.header().pages));
        }
        let total = starts.last().copied().unwrap_or(0);
        // Free pages alternate between the files.
        let mut free = VecDeque::with_capacity(total as usize);
        let most = files.iter().map(|f| f.header().pages).max().unwrap_or(0);
        for i in 0..most {
            for (f, file) in files.iter().enumerate() {
                if i < file.header().pages {
                    free.push_back(starts.get(f).copied().unwrap_or(0) + i);
                }
            }
        }
        let page_len = files
            .iter()
            .map(|f| f.header().page_blocks as usize * BLOCK)
            .max()
            .unwrap_or(BLOCK);
        let inner = Arc::new(Inner {
            files,
            starts,
            gens: (0..total).map(|_| AtomicU32::new(1)).collect(),
            free: Mutex::new(free),
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                running: 0,
                stop: false,
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
            buffered: AtomicUsize::new(0),
            write_buffer: config.write_buffer.max(page_len),
            errors_in_row: AtomicU32::new(0),
            offline: AtomicBool::new(false),
            offline_asks: AtomicU32::new(0),
            probe: AtomicBool::new(false),
            last_error: Mutex::new(None),
            recoveries: AtomicU64::new(0),
            spare: Mutex::new(Vec::new()),
            page_allocs: AtomicU64::new(0),
            page_reclaims: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            writes_busy: AtomicU64::new(0),
            io_errors: AtomicU64::new(0),
            #[cfg(test)]
            hold: Mutex::new(()),
            #[cfg(test)]
            fail_writes: AtomicBool::new(false),
        });
        let threads = (0..config.write_threads.max(1))
            .filter_map(|i| {
                let inner = Arc::clone(&inner);
                std::thread::Builder::new()
                    .name(format!("flash-write-{i}"))
                    .spawn(move || writer(&inner))
                    .ok()
            })
            .collect();
        Tier { inner, threads }
    }

    /// Bytes of segment image a page holds (the smallest of the files').
    pub fn page_capacity(&self) -> usize {
        self.inner
            .files
            .iter()
            .map(|f| f.header().page_capacity())
            .min()
            .unwrap_or(0)
    }

    /// Pages free now.
    pub fn free_pages(&self) -> usize {
        lock(&self.inner.free).len()
    }

    /// Pages in the tier.
    pub fn pages(&self) -> u32 {
        self.inner.gens.len() as u32
    }

    /// A free page, at its current generation; None when every page is in use, or when
    /// the tier is offline and no probe was let through by [`Tier::accepts_writes`].
    pub fn alloc(&self) -> Option<Loc> {
        if self.is_offline() && !self.inner.probe.swap(false, Ordering::Relaxed) {
            return None;
        }
        let page = lock(&self.inner.free).pop_front()?;
        self.inner.page_allocs.fetch_add(1, Ordering::Relaxed);
        let gen = self.inner.gen(page)?.load(Ordering::Acquire);
        Some(Loc { page, gen })
    }

    /// Take the free pages `locs` name, each at the generation it names (pages a snapshot
    /// says were written at those generations, in a tier just opened): for each, whether
    /// it was taken (no: not a page of this tier, not free, or named twice). A page taken
    /// is freed as an allocated one is.
    pub fn claim(&self, locs: &[Loc]) -> Vec<bool> {
        let inner = &*self.inner;
        let mut free = lock(&inner.free);
        let mut is_free = vec![false; inner.gens.len()];
        for &p in free.iter() {
            if let Some(f) = is_free.get_mut(p as usize) {
                *f = true;
            }
        }
        let taken = locs
            .iter()
            .map(
                |l| match (is_free.get_mut(l.page as usize), inner.gen(l.page)) {
                    (Some(f @ true), Some(g)) => {
                        *f = false;
                        g.store(l.gen, Ordering::Release);
                        inner.page_allocs.fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    _ => false,
                },
            )
            .collect();
        free.retain(|&p| is_free.get(p as usize).copied().unwrap_or(false));
        taken
    }

    /// The tier id of the file holding page `page` (written into every block's CRC: a
    /// snapshot keeps it, so that a page it names is only claimed in the same file).
    pub fn file_id(&self, page: u32) -> Option<u64> {
        self.inner
            .file_of(page)
            .ok()
            .map(|(f, _)| f.header().tier_id)
    }

    /// Give `loc`'s page back: its generation moves on (reads of `loc` from now on fail)
    /// and it may be handed out again. A page must be freed once per allocation.
    pub fn free(&self, loc: Loc) {
        let Some(g) = self.inner.gen(loc.page) else {
            return;
        };
        if g.compare_exchange(
            loc.gen,
            loc.gen.wrapping_add(1),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
        {
            self.inner.page_reclaims.fetch_add(1, Ordering::Relaxed);
            lock(&self.inner.free).push_back(loc.page);
        }
    }

    /// Whether `loc` is still its page's generation (not freed since it was handed out).
    pub fn is_current(&self, loc: Loc) -> bool {
        self.inner
            .gen(loc.page)
            .is_some_and(|g| g.load(Ordering::Acquire) == loc.gen)
    }

    /// Queue `image` (at most [`Tier::page_capacity`] bytes) to be written as `loc`'s page.
    /// It is encoded before this returns; `done` is called on a writer thread with the
    /// bytes written, or the error. Refused at once, without calling `done`, when the
    /// write buffer is full (`Busy`) or the image does not fit.
    pub fn write(&self, loc: Loc, image: &[u8], done: Done) -> Result<(), TierError> {
        let inner = &*self.inner;
        let (file, page) = inner.file_of(loc.page)?;
        let len = blocks_for(image.len()) * BLOCK;
        if inner.buffered.fetch_add(len, Ordering::AcqRel) + len > inner.write_buffer {
            inner.buffered.fetch_sub(len, Ordering::AcqRel);
            inner.writes_busy.fetch_add(1, Ordering::Relaxed);
            return Err(TierError::Busy);
        }
        let mut blocks = lock(&inner.spare).pop().unwrap_or_default();
        if let Err(e) = file.encode(page, loc.gen, image, &mut blocks) {
            inner.buffered.fetch_sub(len, Ordering::AcqRel);
            return Err(e.into());
        }
        let mut q = lock(&inner.queue);
        q.jobs.push_back(Job {
            loc,
            blocks,
            len,
            done,
        });
        drop(q);
        inner.work.notify_one();
        Ok(())
    }

    /// Read image bytes `[off, off + len)` of `loc`'s page into the end of `out`, on this
    /// thread, using `buf` for the blocks. Nothing is appended unless the bytes are
    /// sound and `loc` was current throughout.
    pub fn read(
        &self,
        loc: Loc,
        off: usize,
        len: usize,
        buf: &mut AlignedBuf,
        out: &mut Vec<u8>,
    ) -> Result<(), TierError> {
        self.read_in(loc, off, len, buf, out, false).map(drop)
    }

    /// [`Tier::read`] only if the bytes are in the page cache (no wait for the device):
    /// `Ok(false)` when they are not, nothing appended.
    pub fn read_cached(
        &self,
        loc: Loc,
        off: usize,
        len: usize,
        buf: &mut AlignedBuf,
        out: &mut Vec<u8>,
    ) -> Result<bool, TierError> {
        self.read_in(loc, off, len, buf, out, true)
    }

    /// The read of [`Tier::read`] (`cached_only`: of [`Tier::read_cached`]); false when
    /// only the page cache was to be read and it did not hold the bytes.
    fn read_in(
        &self,
        loc: Loc,
        off: usize,
        len: usize,
        buf: &mut AlignedBuf,
        out: &mut Vec<u8>,
        cached_only: bool,
    ) -> Result<bool, TierError> {
        let inner = &*self.inner;
        let (file, page) = inner.file_of(loc.page)?;
        if !self.is_current(loc) {
            return Err(TierError::Stale);
        }
        let start = out.len();
        let read = if cached_only {
            file.read_cached(page, loc.gen, off, len, buf, out)
        } else {
            file.read(page, loc.gen, off, len, buf, out).map(Some)
        };
        match read {
            Ok(None) => Ok(false),
            read => {
                let read = read.map(|n| n.unwrap_or(0));
                self.read_outcome(loc, read, out, start).map(|()| true)
            }
        }
    }

    /// The outcome of a read of `loc` that appended to `out` from `start` (`read`: the bytes
    /// read from the device, or what failed): counted, and a stale read (the page reused
    /// before its bytes were checked) or a failed one leaves nothing appended.
    fn read_outcome(
        &self,
        loc: Loc,
        read: Result<usize, FlashError>,
        out: &mut Vec<u8>,
        start: usize,
    ) -> Result<(), TierError> {
        let inner = &*self.inner;
        let n = match read {
            Ok(n) => n,
            Err(e) => {
                out.truncate(start);
                if !self.is_current(loc) {
                    return Err(TierError::Stale);
                }
                inner.io_errors.fetch_add(1, Ordering::Relaxed);
                return Err(e.into());
            }
        };
        inner.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        if !self.is_current(loc) {
            out.truncate(start);
            return Err(TierError::Stale);
        }
        Ok(())
    }

    /// Where to read image bytes `[off, off + len)` of `loc`'s page, for a read that the
    /// caller does itself (an io_uring): the file's descriptor (valid while the tier is),
    /// the offset and the length, in whole blocks, of the read. Its bytes are then checked
    /// by [`Tier::read_finish`].
    pub fn read_span(&self, loc: Loc, off: usize, len: usize) -> Result<ReadSpan, TierError> {
        let (file, page) = self.inner.file_of(loc.page)?;
        if !self.is_current(loc) {
            return Err(TierError::Stale);
        }
        let (at, len) = file.span(page, off, len)?;
        Ok(ReadSpan {
            fd: file.raw_fd(),
            at,
            len,
        })
    }

    /// Check what a read of [`Tier::read_span`]`(loc, off, len)` brought (`raw`, or the
    /// error it ended with) as [`Tier::read`] checks its own, appending the image bytes to
    /// `out` if they are sound and `loc` was current throughout.
    pub fn read_finish(
        &self,
        loc: Loc,
        off: usize,
        len: usize,
        raw: std::io::Result<&[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<(), TierError> {
        let inner = &*self.inner;
        let (file, page) = inner.file_of(loc.page)?;
        let start = out.len();
        let checked = match raw {
            Ok(raw) => file
                .decode(page, loc.gen, off, len, raw, out)
                .map(|()| raw.len()),
            Err(source) => Err(FlashError::Io {
                path: file.path().to_path_buf(),
                op: "read",
                source,
            }),
        };
        self.read_outcome(loc, checked, out, start)
    }

    /// Wait until every queued write has finished.
    pub fn drain(&self) {
        let mut q = lock(&self.inner.queue);
        while !q.jobs.is_empty() || q.running > 0 {
            q = self.inner.idle.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Make what was written durable.
    pub fn sync(&self) -> Result<(), TierError> {
        self.drain();
        for f in &self.inner.files {
            f.sync()?;
        }
        Ok(())
    }

    /// Whether write errors took the tier offline (it hands out no page).
    pub fn is_offline(&self) -> bool {
        self.inner.offline.load(Ordering::Relaxed)
    }

    /// Whether a caller should try to write now: yes while online; while offline, once in
    /// `PROBE_EVERY` asks (the next [`Tier::alloc`] then hands out a page for the probe).
    pub fn accepts_writes(&self) -> bool {
        let inner = &*self.inner;
        if !self.is_offline() {
            return true;
        }
        if inner.offline_asks.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == PROBE_EVERY - 1 {
            inner.probe.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Hand out pages again after write errors took the tier offline.
    pub fn set_online(&self) {
        self.inner.errors_in_row.store(0, Ordering::Relaxed);
        self.inner.offline.store(false, Ordering::Relaxed);
    }

    /// The last write error, as text, if a write ever failed.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.inner.last_error).clone()
    }

    /// The counters.
    pub fn stats(&self) -> TierStats {
        let i = &*self.inner;
        let free = lock(&i.free).len() as u64;
        let limit = i.files.iter().map(|f| f.header().file_len()).sum();
        TierStats {
            limit_maxbytes: limit,
            pages_free: free,
            pages_used: i.gens.len() as u64 - free,
            page_allocs: i.page_allocs.load(Ordering::Relaxed),
            page_reclaims: i.page_reclaims.load(Ordering::Relaxed),
            bytes_written: i.bytes_written.load(Ordering::Relaxed),
            bytes_read: i.bytes_read.load(Ordering::Relaxed),
            io_queue: lock(&i.queue).jobs.len() as u64,
            writes_busy: i.writes_busy.load(Ordering::Relaxed),
            io_errors: i.io_errors.load(Ordering::Relaxed),
            offline: i.offline.load(Ordering::Relaxed),
            recoveries: i.recoveries.load(Ordering::Relaxed),
        }
    }

    /// Make every write fail with an I/O error (`on`), or work again (a test's device).
    #[cfg(test)]
    pub(crate) fn fail_writes(&self, on: bool) {
        self.inner.fail_writes.store(on, Ordering::Relaxed);
    }

    /// Hold the writers before their next write while the guard lives (a test's full
    /// buffer).
    #[cfg(test)]
    fn hold_writers(&self) -> MutexGuard<'_, ()> {
        lock(&self.inner.hold)
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        lock(&self.inner.queue).stop = true;
        self.inner.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Inner {
    fn gen(&self, page: u32) -> Option<&AtomicU32> {
        self.gens.get(page as usize)
    }

    /// The file of global page `page`, and the page's number in it.
    fn file_of(&self, page: u32) -> Result<(&FlashFile, u32), TierError> {
        let f = self.starts.partition_point(|&s| s <= page);
        let file = f
            .checked_sub(1)
            .and_then(|f| Some((self.files.get(f)?, self.starts.get(f)?)));
        match file {
            Some((file, &start)) if page - start < file.header().pages => Ok((file, page - start)),
            _ => Err(TierError::NoSuchPage(page)),
        }
    }

    fn finish(&self, job: Job, outcome: Result<usize, TierError>) {
        match &outcome {
            Ok(n) => {
                self.errors_in_row.store(0, Ordering::Relaxed);
                self.bytes_written.fetch_add(*n as u64, Ordering::Relaxed);
                if self.offline.swap(false, Ordering::Relaxed) {
                    self.recoveries.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                *lock(&self.last_error) = Some(e.to_string());
                self.io_errors.fetch_add(1, Ordering::Relaxed);
                if self.errors_in_row.fetch_add(1, Ordering::Relaxed) + 1 >= OFFLINE_AFTER {
                    self.offline.store(true, Ordering::Relaxed);
                }
            }
        }
        self.buffered.fetch_sub(job.len, Ordering::AcqRel);
        {
            // One kept for the next write (a page's worth of memory, touched already); the
            // rest go back to the system.
            let mut spare = lock(&self.spare);
            if spare.is_empty() {
                spare.push(job.blocks);
            }
        }
        (job.done)(outcome);
    }
}

/// A writer thread: take queued writes until stopped with nothing left.
fn writer(inner: &Inner) {
    loop {
        let job = {
            let mut q = lock(&inner.queue);
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    q.running += 1;
                    break Some(job);
                }
                if q.stop {
                    break None;
                }
                q = inner.work.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Some(mut job) = job else {
            return;
        };
        #[cfg(test)]
        drop(lock(&inner.hold));
        let outcome = write_job(inner, &mut job);
        inner.finish(job, outcome);
        lock(&inner.queue).running -= 1;
        inner.idle.notify_all();
    }
}

fn write_job(inner: &Inner, job: &mut Job) -> Result<usize, TierError> {
    #[cfg(test)]
    if inner.fail_writes.load(Ordering::Relaxed) {
        return Err(TierError::Flash(FlashError::Io {
            path: PathBuf::from("test"),
            op: "write",
            source: std::io::Error::from_raw_os_error(libc::EIO),
        }));
    }
    let (file, page) = inner.file_of(job.loc.page)?;
    let blocks = job.blocks.get(job.len);
    Ok(file.write_blocks(page, blocks)?)
}

#[cfg(test)]
mod tests {
    use super::super::testdir::Dir;
    use super::*;
    use crate::flash::BLOCK_DATA;
    use std::sync::mpsc;

    const PAGE: usize = 32 << 10;

    fn config(d: &Dir, sizes: &[u64], write_buffer: usize) -> TierConfig {
        TierConfig {
            files: sizes
                .iter()
                .enumerate()
                .map(|(i, &s)| (d.0.join(format!("f{i}")), s))
                .collect(),
            page_bytes: PAGE,
            write_threads: 2,
            write_buffer,
            direct: true,
        }
    }

    fn image(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
    }

    /// Write and wait for the outcome.
    fn write(t: &Tier, loc: Loc, img: &[u8]) -> Result<usize, TierError> {
        let (tx, rx) = mpsc::channel();
        t.write(loc, img, Box::new(move |r| drop(tx.send(r))))?;
        rx.recv().expect("done is called")
    }

    /// Through the page cache, a page just written reads back at once (`read_cached`);
    /// past it (`O_DIRECT`), `read_cached` never reads; a freed page is stale either way.
    #[test]
    fn cached_reads_through_the_page_cache_only() {
        let d = Dir::new("tier-cached");
        let mut c = config(&d, &[1 << 20], 1 << 20);
        c.direct = false;
        let t = Tier::create(&c).expect("tier");
        let loc = t.alloc().expect("a page");
        let img = image(PAGE, 9);
        write(&t, loc, &img).expect("written");
        let (mut buf, mut out) = (AlignedBuf::new(), Vec::new());
        assert!(t
            .read_cached(loc, 100, 5000, &mut buf, &mut out)
            .expect("read"));
        assert_eq!(out, img[100..5100]);
        t.free(loc);
        assert!(matches!(
            t.read_cached(loc, 0, 10, &mut buf, &mut out),
            Err(TierError::Stale)
        ));
        drop(t);

        let d = Dir::new("tier-direct");
        let t = Tier::create(&config(&d, &[1 << 20], 1 << 20)).expect("tier");
        let loc = t.alloc().expect("a page");
        write(&t, loc, &img).expect("written");
        let mut out = Vec::new();
        let cached = t
            .read_cached(loc, 0, 10, &mut buf, &mut out)
            .expect("no error");
        // O_DIRECT where the file system allows it: then nothing is read this way.
        if t.inner.files.iter().all(|f| f.is_direct()) {
            assert!(!cached && out.is_empty());
        }
    }

    #[test]
    fn pages_alternate_between_files_and_read_back() {
        let d = Dir::new("tier-alternate");
        let t = Tier::create(&config(&d, &[(1 << 20) + 4096, 300 << 10], 1 << 20)).expect("tier");
        let s = t.stats();
        assert_eq!(s.pages_free, u64::from(t.pages()));
        assert!(t.pages() >= 30, "{}", t.pages());
        let a = t.alloc().expect("a page");
        let b = t.alloc().expect("a page");
        let first = t.inner.starts[1];
        assert!(
            (a.page < first) != (b.page < first),
            "{a:?} {b:?}: one from each file"
        );
        let (ia, ib) = (image(PAGE, 1), image(5000, 2));
        assert_eq!(write(&t, a, &ia).expect("write"), 9 * BLOCK);
        assert_eq!(write(&t, b, &ib).expect("write"), 2 * BLOCK);
        let mut buf = AlignedBuf::new();
        let mut out = Vec::new();
        t.read(a, 100, 9000, &mut buf, &mut out).expect("read");
        assert_eq!(out, ia[100..9100]);
        out.clear();
        t.read(b, 0, 5000, &mut buf, &mut out).expect("read");
        assert_eq!(out, ib);
        let s = t.stats();
        assert_eq!((s.page_allocs, s.pages_used), (2, 2));
        assert_eq!(s.bytes_written, 11 * BLOCK as u64);
        assert_eq!(s.bytes_read, (3 + 2) * BLOCK as u64);
    }

    #[test]
    fn a_freed_page_is_stale_for_its_old_readers() {
        let d = Dir::new("tier-stale");
        let t = Tier::create(&config(&d, &[1 << 20], 1 << 20)).expect("tier");
        let a = t.alloc().expect("a page");
        write(&t, a, &image(1000, 3)).expect("write");
        t.free(a);
        t.free(a); // a second free of the same allocation changes nothing
        assert!(!t.is_current(a));
        let mut buf = AlignedBuf::new();
        let mut out = vec![9];
        assert!(matches!(
            t.read(a, 0, 10, &mut buf, &mut out),
            Err(TierError::Stale)
        ));
        assert_eq!(out, [9]);
        // Every page is handed out once before a freed one comes back.
        let mut seen = Vec::new();
        while let Some(l) = t.alloc() {
            seen.push(l);
        }
        assert_eq!(seen.len() as u32, t.pages());
        let again = seen.last().copied().expect("pages");
        assert_eq!((again.page, again.gen), (a.page, a.gen + 1));
        // The old generation's blocks fail against the new one, before it is written too.
        assert!(t.read(again, 0, 10, &mut buf, &mut out).is_err());
        assert_eq!(t.stats().page_reclaims, 1);
        assert_eq!(t.stats().pages_free, 0);
    }

    #[test]
    fn a_full_write_buffer_refuses_at_once() {
        let d = Dir::new("tier-busy");
        // Room for one page of blocks.
        let t = Tier::create(&config(&d, &[1 << 20], 1)).expect("tier");
        let held = t.hold_writers();
        let (a, b) = (t.alloc().expect("page"), t.alloc().expect("page"));
        let (tx, rx) = mpsc::channel();
        t.write(a, &image(PAGE, 0), Box::new(move |r| drop(tx.send(r))))
            .expect("queued");
        assert!(matches!(
            t.write(
                b,
                &image(PAGE, 1),
                Box::new(|_| panic!("refused writes are not done"))
            ),
            Err(TierError::Busy)
        ));
        assert_eq!(t.stats().writes_busy, 1);
        drop(held);
        rx.recv().expect("done").expect("written");
        t.drain();
        write(&t, b, &image(PAGE, 1)).expect("room again");
    }

    #[test]
    fn write_errors_take_the_tier_offline_and_a_probe_brings_it_back() {
        let d = Dir::new("tier-errors");
        let t = Tier::create(&config(&d, &[1 << 20], 1 << 20)).expect("tier");
        t.fail_writes(true);
        for _ in 0..OFFLINE_AFTER {
            assert!(t.accepts_writes());
            let loc = t.alloc().expect("online");
            assert!(write(&t, loc, &image(100, 0)).is_err());
            t.free(loc);
        }
        let s = t.stats();
        assert!(s.offline);
        assert_eq!(s.io_errors, u64::from(OFFLINE_AFTER));
        assert!(t.last_error().is_some_and(|e| e.contains("write")));
        assert_eq!(t.alloc(), None, "offline: no page");
        // Offline, one ask in PROBE_EVERY lets a write through; a failed probe keeps the
        // tier offline.
        let probe = |t: &Tier| {
            for _ in 1..PROBE_EVERY {
                assert!(!t.accepts_writes());
                assert_eq!(t.alloc(), None);
            }
            assert!(t.accepts_writes(), "the probe's turn");
            t.alloc().expect("the probe's page")
        };
        let loc = probe(&t);
        assert!(write(&t, loc, &image(100, 0)).is_err());
        t.free(loc);
        assert!(t.stats().offline, "a failed probe");
        // The device works again: the next probe's write brings the tier back.
        t.fail_writes(false);
        let loc = probe(&t);
        write(&t, loc, &image(100, 0)).expect("the probe is written");
        let s = t.stats();
        assert!(!s.offline);
        assert_eq!(s.recoveries, 1);
        assert!(t.accepts_writes());
        let loc = t.alloc().expect("online again");
        write(&t, loc, &image(100, 0)).expect("write");
        // set_online does the same by hand.
        t.fail_writes(true);
        for _ in 0..OFFLINE_AFTER {
            let loc = t.alloc().expect("online");
            assert!(write(&t, loc, &image(100, 0)).is_err());
            t.free(loc);
        }
        assert!(t.is_offline());
        t.fail_writes(false);
        t.set_online();
        assert!(t.alloc().is_some());
    }

    #[test]
    fn drop_finishes_queued_writes() {
        let d = Dir::new("tier-drop");
        let t = Tier::create(&config(&d, &[1 << 20], 1 << 20)).expect("tier");
        let (tx, rx) = mpsc::channel();
        for i in 0..8 {
            let loc = t.alloc().expect("page");
            let tx = tx.clone();
            t.write(
                loc,
                &image(PAGE, i),
                Box::new(move |r| {
                    let _ = tx.send(r.is_ok());
                }),
            )
            .expect("queued");
        }
        drop(tx);
        drop(t);
        assert_eq!(rx.iter().filter(|&ok| ok).count(), 8);
    }

    /// Readers racing with pages being freed and rewritten get the bytes of the generation
    /// they asked for, or an error: never another generation's bytes.
    #[test]
    fn racing_readers_never_get_another_generations_bytes() {
        let d = Dir::new("tier-race");
        let t =
            Tier::create(&config(&d, &[(4 * 9 * BLOCK + BLOCK) as u64], 1 << 20)).expect("tier");
        let content = |l: Loc| image(3 * BLOCK_DATA, (l.page * 31 + l.gen) as u8);
        let current = Mutex::new(Vec::<Loc>::new());
        let stop = AtomicBool::new(false);
        let mut freed = Vec::new();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut buf = AlignedBuf::new();
                    let mut out = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let locs = lock(&current).clone();
                        for l in locs {
                            out.clear();
                            match t.read(l, BLOCK_DATA - 10, 20, &mut buf, &mut out) {
                                Ok(()) => {
                                    assert_eq!(out, content(l)[BLOCK_DATA - 10..BLOCK_DATA + 10]);
                                }
                                Err(_) => assert!(!t.is_current(l), "{l:?} failed while current"),
                            }
                        }
                    }
                });
            }
            for _ in 0..300 {
                let l = match t.alloc() {
                    Some(l) => l,
                    None => {
                        let old = lock(&current).remove(0);
                        t.free(old);
                        freed.push(old);
                        continue;
                    }
                };
                write(&t, l, &content(l)).expect("write");
                lock(&current).push(l);
            }
            stop.store(true, Ordering::Relaxed);
        });
        // Whatever the interleaving above, the ends are certain: the pages in use read
        // back as written, and every freed generation is refused.
        let (mut buf, mut out) = (AlignedBuf::new(), Vec::new());
        for l in lock(&current).iter() {
            out.clear();
            t.read(*l, 0, 3 * BLOCK_DATA, &mut buf, &mut out)
                .expect("current");
            assert_eq!(out, content(*l));
        }
        assert!(freed.len() > 100, "{} pages reused", freed.len());
        for l in freed {
            assert!(t.read(l, 0, 10, &mut buf, &mut out).is_err(), "{l:?}");
        }
    }

    /// A tier reopened finds what was written, once its pages are claimed at their
    /// generations; a claim of a page twice, of another generation's bytes or of a page
    /// beyond the tier gets nothing; a file of another geometry is refused.
    #[test]
    fn reopened_pages_read_back_once_claimed() {
        let d = Dir::new("tier-reopen");
        let c = config(&d, &[1 << 20, 1 << 20], 1 << 20);
        let t = Tier::create(&c).expect("tier");
        let (a, b) = (t.alloc().expect("a"), t.alloc().expect("b"));
        write(&t, a, &image(PAGE, 1)).expect("write a");
        write(&t, b, &image(PAGE, 2)).expect("write b");
        t.free(b);
        // b's page again, at its next generation (freed pages come back last).
        let b2 = std::iter::from_fn(|| t.alloc())
            .find(|l| l.page == b.page)
            .expect("b's page again");
        assert_ne!(b2.gen, b.gen);
        write(&t, b2, &image(100, 3)).expect("write b2");
        let ids = (t.file_id(a.page), t.file_id(b2.page));
        t.sync().expect("sync");
        drop(t);

        let t = Tier::open(&c).expect("reopen");
        assert_eq!((t.file_id(a.page), t.file_id(b2.page)), ids);
        assert_eq!(t.stats().pages_free, u64::from(t.pages()));
        let past = Loc {
            page: t.pages(),
            gen: 1,
        };
        assert_eq!(t.claim(&[a, b2, a, past]), vec![true, true, false, false]);
        assert_eq!(t.stats().pages_free, u64::from(t.pages()) - 2);
        let (mut buf, mut out) = (AlignedBuf::new(), Vec::new());
        t.read(a, 0, PAGE, &mut buf, &mut out).expect("read a");
        assert_eq!(out, image(PAGE, 1));
        out.clear();
        t.read(b2, 0, 100, &mut buf, &mut out).expect("read b2");
        assert_eq!(out, image(100, 3));
        // The free list holds neither: every page handed out is another.
        let mut handed = Vec::new();
        while let Some(l) = t.alloc() {
            handed.push(l.page);
        }
        assert_eq!(handed.len() as u32, t.pages() - 2);
        assert!(!handed.contains(&a.page) && !handed.contains(&b2.page));
        drop(t);

        // A page claimed at a generation its bytes were not written at reads nothing.
        let t = Tier::open(&c).expect("reopen");
        let old_b = Loc { gen: b.gen, ..b2 };
        assert_eq!(t.claim(&[old_b]), vec![true]);
        assert!(t.read(old_b, 0, 100, &mut buf, &mut out).is_err());
        drop(t);

        let mut other = c.clone();
        other.files[1].1 = 2 << 20;
        assert!(matches!(Tier::open(&other), Err(TierError::Geometry(_))));
        other = c.clone();
        other.page_bytes = PAGE * 2;
        assert!(matches!(Tier::open(&other), Err(TierError::Geometry(_))));
    }

    #[test]
    fn bad_configurations_are_refused() {
        let d = Dir::new("tier-bad");
        assert!(matches!(
            Tier::create(&config(&d, &[], 1)),
            Err(TierError::NoFiles)
        ));
        assert!(matches!(
            Tier::create(&config(&d, &[1 << 20, 1000], 1)),
            Err(TierError::Flash(FlashError::TooSmall { .. }))
        ));
        let t = Tier::create(&config(&d, &[1 << 20], 1 << 20)).expect("tier");
        let past = Loc {
            page: t.pages(),
            gen: 1,
        };
        assert!(matches!(
            t.write(past, &[1], Box::new(|_| {})),
            Err(TierError::NoSuchPage(_))
        ));
        let loc = t.alloc().expect("page");
        assert!(t
            .write(loc, &image(PAGE + BLOCK, 0), Box::new(|_| {}))
            .is_err());
        assert_eq!(t.stats().io_queue, 0);
    }
}
