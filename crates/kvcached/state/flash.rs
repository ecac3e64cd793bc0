//! Flash reads for the workers (`-o ext_path`): a worker never waits for flash. A get
//! that meets an item on flash stops (`Step::Wait`); under io_uring its worker submits the
//! reads it needs to its own ring (`Worker::start_flash_reads`), else it hands them to
//! [`FlashIo`]'s threads (`ext_threads`), which do them (`LogEngine::complete_flash_read`
//! keeps each checked record for the re-run) and tell the worker, by its waker, which
//! connection can go on (the threads are started by `server.rs`). Jobs are bounded by the
//! connections: each has at most one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use kvstore::FlashRead;

/// The reads one connection waits for.
pub struct Job {
    pub reads: Vec<FlashRead>,
    pub worker: usize,
    pub slot: usize,
    /// The connection's ticket: a completion for a connection closed meanwhile (its slot
    /// reused) is recognized and dropped.
    pub ticket: u64,
}

/// The flash reads queued for the I/O threads, and per worker the connections whose reads
/// are done.
pub struct FlashIo {
    queue: Mutex<VecDeque<Job>>,
    work: Condvar,
    done: Vec<Mutex<Vec<(usize, u64)>>>,
    /// Reads done for connections that had closed (memcached's `get_aborted_extstore`).
    aborted: AtomicU64,
    /// Reads the workers submitted to their io_uring instead (kvcached's own).
    ring_reads: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FlashIo {
    pub fn new(workers: usize) -> FlashIo {
        FlashIo {
            queue: Mutex::new(VecDeque::new()),
            work: Condvar::new(),
            done: (0..workers).map(|_| Mutex::new(Vec::new())).collect(),
            aborted: AtomicU64::new(0),
            ring_reads: AtomicU64::new(0),
        }
    }

    /// A connection's reads were done after it closed.
    pub fn note_aborted(&self) {
        self.aborted.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads done for connections that had closed.
    pub fn aborted(&self) -> u64 {
        self.aborted.load(Ordering::Relaxed)
    }

    /// A worker submitted a read to its io_uring.
    pub fn note_ring_read(&self) {
        self.ring_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads the workers submitted to their io_uring.
    pub fn ring_reads(&self) -> u64 {
        self.ring_reads.load(Ordering::Relaxed)
    }

    /// Jobs waiting for an I/O thread.
    pub fn queued(&self) -> usize {
        lock(&self.queue).len()
    }

    /// Queue `job` for the I/O threads.
    pub fn submit(&self, job: Job) {
        lock(&self.queue).push_back(job);
        self.work.notify_one();
    }

    /// The connections (slot, ticket) of worker `worker` whose reads are done.
    pub fn take_done(&self, worker: usize) -> Vec<(usize, u64)> {
        self.done
            .get(worker)
            .map(|d| std::mem::take(&mut *lock(d)))
            .unwrap_or_default()
    }

    /// The next job for an I/O thread, waiting for one; None once `stopping` says so
    /// (checked at least every 200 ms).
    pub fn next(&self, stopping: impl Fn() -> bool) -> Option<Job> {
        let mut q = lock(&self.queue);
        loop {
            if stopping() {
                return None;
            }
            if let Some(job) = q.pop_front() {
                return Some(job);
            }
            q = self
                .work
                .wait_timeout(q, Duration::from_millis(200))
                .map(|(q, _)| q)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// An I/O thread did `job`'s reads: its worker learns which connection may go on (and
    /// is to be woken by the caller).
    pub fn done(&self, job: &Job) {
        if let Some(d) = self.done.get(job.worker) {
            lock(d).push((job.slot, job.ticket));
        }
    }
}
