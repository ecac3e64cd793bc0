//! The state all workers share: configuration, the engine, the clock, server-wide counters,
//! credentials, replication state and the connection registry (`stats conns`). Everything
//! above (execution, features, the runtime) reads it; it imports none of them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use kvproto::text::{Limits, MAX_GET_LINE_LEN, MAX_LINE_LEN};
use kvstore::LogEngine;

use crate::setup::config::Config;
use crate::state::clock::Clock;
use crate::state::crawler::{Crawler, HashPower};
use crate::state::credentials::Auth;
use crate::state::detail::PrefixStats;
use crate::state::registry::{ConnInfo, ConnKind};
use crate::state::replication::Replication;
use crate::state::stats::{ServerStats, WorkerStats};
use crate::state::watch::Watchers;

/// State shared by all workers.
pub struct Shared {
    pub config: Config,
    pub engine: LogEngine,
    pub clock: Clock,
    pub stats: ServerStats,
    pub limits: Limits,
    /// Credentials for `-Y` and `-S`.
    pub auth: Auth,
    /// `stats detail`: per-prefix counters.
    pub detail: PrefixStats,
    /// `watch`: the log watchers (also held by the engine's eviction observer).
    pub watchers: Arc<Watchers>,
    /// `lru_crawler enable|disable|crawl`: the background expiry sweep's switch and the
    /// whole sweeps asked for.
    pub crawler: Crawler,
    /// The level memcached's hash table would have (`hash_power_level`).
    pub hash_power: HashPower,
    /// Replication (role, the puller, the replicas pulling from here).
    pub repl: Replication,
    /// TLS (`-Z`): the configurations connections are accepted with, and the counters.
    pub tls: Option<kvtls::server::ServerTls>,
    /// Server time of the last successful certificate load (`time_since_server_cert_refresh`).
    pub cert_loaded_at: std::sync::atomic::AtomicU32,
    /// SIGUSR1 asked for a graceful stop: with `-e`, save a snapshot for a warm restart.
    save_on_exit: AtomicBool,
    pub curr_conns: AtomicUsize,
    pub total_conns: AtomicU64,
    pub rejected_conns: AtomicU64,
    /// Workers that were to run io_uring and fell back to epoll (their ring could not be
    /// set up), for `stats settings`' `io`.
    pub epoll_fallbacks: AtomicUsize,
    /// Whether the workers accept connections (memcached's `accepting_conns`).
    accepting: AtomicBool,
    /// Times accepting stopped (`listen_disabled_num`), when it last stopped (microseconds
    /// on the server clock) and for how long in all (`time_in_listen_disabled_us`).
    listen_disabled_num: AtomicU64,
    listen_disabled_since_us: AtomicU64,
    time_in_listen_disabled_us: AtomicU64,
    shutdown: AtomicBool,
    /// Sockets by file descriptor, for `stats conns`; written on accept and close only.
    registry: Mutex<BTreeMap<i32, (ConnKind, Arc<ConnInfo>)>>,
    wakers: OnceLock<Vec<Arc<mio::Waker>>>,
    /// The flash tier's reads for the workers (`-o ext_path`).
    pub flash_io: Option<crate::state::flash::FlashIo>,
    /// The maintenance thread, which a shutdown unparks (it sleeps between its ticks).
    maintenance: OnceLock<std::thread::Thread>,
    /// The `Arc` this state lives in, for threads started from a request (`replicaof`).
    me: OnceLock<Weak<Shared>>,
}

impl Shared {
    /// The state for a server about to start: no connection yet, accepting, not stopping.
    pub fn new(
        config: Config,
        engine: LogEngine,
        auth: Auth,
        worker_stats: Vec<Arc<WorkerStats>>,
        tls: Option<kvtls::server::ServerTls>,
    ) -> Shared {
        let flash_io = engine
            .has_flash()
            .then(|| crate::state::flash::FlashIo::new(worker_stats.len().max(1)));
        Shared {
            limits: Limits {
                max_value: config.item_size_max,
                flush_enabled: config.flush_enabled,
                shutdown_enabled: config.enable_shutdown,
            },
            auth,
            detail: PrefixStats::new(config.prefix_delimiter, config.detail_enabled),
            watchers: Arc::new(Watchers::with_capacity(config.watcher_buf)),
            crawler: Crawler::new(config.lru_crawler),
            hash_power: HashPower::new(config.hashpower),
            repl: Replication::new(),
            tls,
            cert_loaded_at: std::sync::atomic::AtomicU32::new(0),
            save_on_exit: AtomicBool::new(false),
            engine,
            clock: Clock::new(),
            stats: ServerStats::new(worker_stats),
            curr_conns: AtomicUsize::new(0),
            total_conns: AtomicU64::new(0),
            rejected_conns: AtomicU64::new(0),
            epoll_fallbacks: AtomicUsize::new(0),
            accepting: AtomicBool::new(true),
            listen_disabled_num: AtomicU64::new(0),
            listen_disabled_since_us: AtomicU64::new(0),
            time_in_listen_disabled_us: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            registry: Mutex::new(BTreeMap::new()),
            wakers: OnceLock::new(),
            flash_io,
            maintenance: OnceLock::new(),
            me: OnceLock::new(),
            config,
        }
    }

    /// Worker `index`'s waker (to wake it when a watcher it serves has lines to send).
    pub fn worker_waker(&self, index: usize) -> Option<Arc<mio::Waker>> {
        self.wakers.get().and_then(|w| w.get(index)).cloned()
    }

    /// The maintenance thread (set by itself when it starts), which a shutdown wakes.
    pub fn set_maintenance(&self, thread: std::thread::Thread) {
        let _ = self.maintenance.set(thread);
    }

    /// The workers' wakers, which a shutdown wakes; set once, when the workers exist.
    pub fn set_wakers(&self, wakers: Vec<Arc<mio::Waker>>) {
        let _ = self.wakers.set(wakers);
    }

    /// Remember the `Arc` this state lives in (once, at startup).
    pub fn set_arc(self: &Arc<Self>) {
        let _ = self.me.set(Arc::downgrade(self));
    }

    /// The `Arc` this state lives in, while the server runs.
    pub fn arc(&self) -> Option<Arc<Shared>> {
        self.me.get().and_then(Weak::upgrade)
    }

    /// A graceful stop (SIGUSR1, SIGTERM): with `-e`, save a snapshot at exit.
    pub fn request_save_on_exit(&self) {
        self.save_on_exit.store(true, Ordering::Release);
    }

    /// Whether a graceful stop asked for a snapshot.
    pub fn save_on_exit(&self) -> bool {
        self.save_on_exit.load(Ordering::Acquire)
    }

    /// The largest request a connection may buffer: a full item with its command line, or
    /// a long multiget line.
    pub fn max_request_len(&self) -> usize {
        (self.config.item_size_max + MAX_LINE_LEN + 2).max(MAX_GET_LINE_LEN)
    }

    pub fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Stop the server: workers finish their current events and exit.
    pub fn request_shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
        if let Some(wakers) = self.wakers.get() {
            for w in wakers {
                let _ = w.wake();
            }
        }
        if let Some(t) = self.maintenance.get() {
            t.unpark();
        }
    }

    /// Wake the maintenance thread before its next tick (a crawl was asked for).
    pub fn wake_maintenance(&self) {
        if let Some(t) = self.maintenance.get() {
            t.unpark();
        }
    }

    pub fn register(&self, fd: i32, kind: ConnKind, info: Arc<ConnInfo>) {
        self.lock_registry().insert(fd, (kind, info));
    }

    pub fn unregister(&self, fd: i32) {
        self.lock_registry().remove(&fd);
    }

    pub fn connection_list(&self) -> Vec<(i32, ConnKind, Arc<ConnInfo>)> {
        self.lock_registry()
            .iter()
            .map(|(fd, (k, i))| (*fd, *k, i.clone()))
            .collect()
    }

    pub fn reset_connection_stats(&self) {
        self.total_conns.store(0, Ordering::Relaxed);
        self.rejected_conns.store(0, Ordering::Relaxed);
        self.listen_disabled_num.store(0, Ordering::Relaxed);
        self.time_in_listen_disabled_us.store(0, Ordering::Relaxed);
    }

    /// Whether the workers accept new connections now.
    pub fn accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    /// Accepting stops (false) or resumes (true); a stop counts in `listen_disabled_num`
    /// and its length in `time_in_listen_disabled_us`. Only a change does anything, so
    /// workers may report the same state at once.
    pub fn set_accepting(&self, on: bool) {
        if self.accepting.load(Ordering::Relaxed) == on
            || self
                .accepting
                .compare_exchange(!on, on, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let now = self.clock.micros();
        if on {
            let since = self.listen_disabled_since_us.load(Ordering::Acquire);
            self.time_in_listen_disabled_us
                .fetch_add(now.saturating_sub(since), Ordering::Relaxed);
        } else {
            self.listen_disabled_since_us.store(now, Ordering::Release);
            self.listen_disabled_num.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `listen_disabled_num` and `time_in_listen_disabled_us`, counting a stop in progress.
    pub fn listen_disabled(&self) -> (u64, u64) {
        let mut time = self.time_in_listen_disabled_us.load(Ordering::Relaxed);
        if !self.accepting() {
            let since = self.listen_disabled_since_us.load(Ordering::Acquire);
            time += self.clock.micros().saturating_sub(since);
        }
        (self.listen_disabled_num.load(Ordering::Relaxed), time)
    }

    fn lock_registry(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, (ConnKind, Arc<ConnInfo>)>> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}
