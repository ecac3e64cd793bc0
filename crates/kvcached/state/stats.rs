//! Server counters, in memcached's names.
//!
//! Each worker owns a [`WorkerStats`] that only it writes (a relaxed load and store, no
//! locked instruction on the request path); `stats` sums all workers' counters. `stats reset`
//! does not write other workers' counters: it records the current sums as a baseline that
//! later reports subtract.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A counter written by one thread and read by any.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Add `n`. Only the owning worker calls this, so load-then-store loses nothing.
    #[inline]
    pub fn add(&self, n: u64) {
        let v = self.0.load(Ordering::Relaxed);
        self.0.store(v.wrapping_add(n), Ordering::Relaxed);
    }

    #[inline]
    pub fn incr(&self) {
        self.add(1);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

macro_rules! worker_counters {
    ($($name:ident),* $(,)?) => {
        /// One worker's request counters, and the gauges of its connections' buffers.
        #[derive(Default)]
        #[repr(align(128))]
        pub struct WorkerStats {
            $(pub $name: Counter,)*
            pub buffers: BufferGauges,
        }

        /// Counters summed over workers.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct Totals {
            $(pub $name: u64,)*
        }

        impl WorkerStats {
            fn add_to(&self, t: &mut Totals) {
                $(t.$name = t.$name.wrapping_add(self.$name.get());)*
            }
        }

        impl Totals {
            fn since(self, base: &Totals) -> Totals {
                Totals { $($name: self.$name.wrapping_sub(base.$name),)* }
            }
        }
    };
}

worker_counters!(
    cmd_get,
    cmd_set,
    cmd_flush,
    cmd_touch,
    cmd_meta,
    get_hits,
    get_misses,
    delete_misses,
    delete_hits,
    incr_misses,
    incr_hits,
    decr_misses,
    decr_hits,
    cas_misses,
    cas_hits,
    cas_badval,
    touch_hits,
    touch_misses,
    store_too_large,
    store_no_memory,
    auth_cmds,
    auth_errors,
    bytes_read,
    bytes_written,
    conn_yields,
    idle_kicks,
    read_buf_oom,
    response_obj_oom,
);

/// A value written by one thread (set, not added) and read by any.
#[derive(Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    #[inline]
    fn adjust(&self, old: usize, new: usize) {
        let v = self.0.load(Ordering::Relaxed);
        let v = v.wrapping_sub(old as u64).wrapping_add(new as u64);
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a connection's buffers were last counted as in its worker's [`BufferGauges`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Gauged {
    input: usize,
    output: usize,
}

/// A worker's connection buffers, for memcached's `read_buf_*` and `response_obj_*` stats:
/// read buffers are the worker's scratch buffer and each connection's buffer of unfinished
/// input; response buffers are each connection's output buffer.
#[derive(Default)]
pub struct BufferGauges {
    pub read_buf_count: Gauge,
    pub read_buf_bytes: Gauge,
    pub response_obj_count: Gauge,
    pub response_obj_bytes: Gauge,
    /// Of the read buffers, the worker's spare input buffers (`read_buf_bytes_free`).
    pub read_buf_bytes_free: Gauge,
}

impl BufferGauges {
    /// A spare input buffer of `bytes` is kept (`true`) or taken back (`false`).
    pub fn spare(&self, bytes: usize, kept: bool) {
        let (old, new) = if kept { (0, bytes) } else { (bytes, 0) };
        self.read_buf_count
            .adjust(usize::from(old > 0), usize::from(new > 0));
        self.read_buf_bytes.adjust(old, new);
        self.read_buf_bytes_free.adjust(old, new);
    }

    /// Count the worker's scratch buffer (once, when the worker starts).
    pub fn set_scratch(&self, bytes: usize) {
        self.read_buf_count.adjust(0, 1);
        self.read_buf_bytes.adjust(0, bytes);
    }

    /// A connection's buffers are now `input` and `output` bytes (0, 0 when it closes).
    #[inline]
    pub fn update(&self, was: &mut Gauged, input: usize, output: usize) {
        let now = Gauged { input, output };
        if now == *was {
            return;
        }
        self.read_buf_count
            .adjust(usize::from(was.input > 0), usize::from(input > 0));
        self.read_buf_bytes.adjust(was.input, input);
        self.response_obj_count
            .adjust(usize::from(was.output > 0), usize::from(output > 0));
        self.response_obj_bytes.adjust(was.output, output);
        *was = now;
    }
}

impl WorkerStats {
    /// Count one key of a get (`cmd_get`, `get_hits`/`get_misses`) or of a get-and-touch
    /// (memcached counts those as `cmd_touch`, `touch_hits`/`touch_misses`).
    pub fn count_read(&self, touch: bool, hit: bool) {
        let (cmd, hits, misses) = if touch {
            (&self.cmd_touch, &self.touch_hits, &self.touch_misses)
        } else {
            (&self.cmd_get, &self.get_hits, &self.get_misses)
        };
        cmd.incr();
        if hit {
            hits.incr();
        } else {
            misses.incr();
        }
    }
}

/// All workers' counters, and the `stats reset` baseline.
pub struct ServerStats {
    workers: Vec<std::sync::Arc<WorkerStats>>,
    baseline: Mutex<Totals>,
}

/// The buffer gauges summed over workers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BufferTotals {
    pub read_buf_count: u64,
    pub read_buf_bytes: u64,
    pub response_obj_count: u64,
    pub response_obj_bytes: u64,
    pub read_buf_bytes_free: u64,
}

impl ServerStats {
    /// The workers' connection buffers now (gauges: `stats reset` leaves them).
    pub fn buffers(&self) -> BufferTotals {
        let mut t = BufferTotals::default();
        for w in &self.workers {
            let b = &w.buffers;
            t.read_buf_count += b.read_buf_count.get();
            t.read_buf_bytes += b.read_buf_bytes.get();
            t.response_obj_count += b.response_obj_count.get();
            t.response_obj_bytes += b.response_obj_bytes.get();
            t.read_buf_bytes_free += b.read_buf_bytes_free.get();
        }
        t
    }

    pub fn new(workers: Vec<std::sync::Arc<WorkerStats>>) -> ServerStats {
        ServerStats {
            workers,
            baseline: Mutex::new(Totals::default()),
        }
    }

    fn raw(&self) -> Totals {
        let mut t = Totals::default();
        for w in &self.workers {
            w.add_to(&mut t);
        }
        t
    }

    /// The counters since the last reset.
    pub fn totals(&self) -> Totals {
        let base = *self.baseline.lock().unwrap_or_else(|e| e.into_inner());
        self.raw().since(&base)
    }

    /// `stats reset`.
    pub fn reset(&self) {
        let now = self.raw();
        *self.baseline.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }
}

/// User and system CPU time of this process, in seconds and microseconds.
pub fn rusage() -> ((i64, i64), (i64, i64)) {
    // SAFETY: getrusage writes into the zeroed struct we pass; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return ((0, 0), (0, 0));
    }
    (
        (ru.ru_utime.tv_sec, ru.ru_utime.tv_usec),
        (ru.ru_stime.tv_sec, ru.ru_stime.tv_usec),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn totals_sum_workers_and_reset_subtracts() {
        let a = Arc::new(WorkerStats::default());
        let b = Arc::new(WorkerStats::default());
        let s = ServerStats::new(vec![a.clone(), b.clone()]);
        a.cmd_get.add(3);
        b.cmd_get.add(4);
        assert_eq!(s.totals().cmd_get, 7);
        s.reset();
        assert_eq!(s.totals().cmd_get, 0);
        b.cmd_get.incr();
        assert_eq!(s.totals().cmd_get, 1);
    }
}
