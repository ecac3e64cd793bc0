//! Wiring: the state all workers share, the listening sockets, the worker threads and the
//! signals that stop them.
//!
//! ```text
//!            signals (main thread) ──shutdown──┐
//!                                              ▼
//!  listeners ─┬─ worker 0: mio poll ─ conns ─┐
//!  (shared)   ├─ worker 1: mio poll ─ conns ─┼─▶ engine (kvstore, shared, internally sharded)
//!             └─ worker N: mio poll ─ conns ─┘
//! ```
//! Every worker polls every listener (a duplicate of the same socket), accepts what it can and
//! keeps the connections it accepted for their whole life: a request is parsed, executed and
//! answered on one thread (a column), and workers share nothing but the engine and counters.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use kvproto::text::{Limits, MAX_GET_LINE_LEN, MAX_LINE_LEN};
use kvstore::{Engine, EngineConfig, HashMapEngine, LogEngine};
use socket2::{Domain, Socket, Type};

use crate::clock::Clock;
use crate::config::{Config, EngineChoice, MemoryLimit};
use crate::conn::ConnInfo;
use crate::stats::{ServerStats, WorkerStats};
use crate::worker::Worker;

/// A listening socket.
pub enum Listener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl Listener {
    pub fn try_clone(&self) -> io::Result<Listener> {
        Ok(match self {
            Listener::Tcp(l) => Listener::Tcp(l.try_clone()?),
            Listener::Unix(l) => Listener::Unix(l.try_clone()?),
        })
    }

    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("tcp:{a}"),
                Err(_) => "tcp:?".into(),
            },
            Listener::Unix(l) => match l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
            {
                Some(p) => format!("unix:{p}"),
                None => "unix:?".into(),
            },
        }
    }

    fn fd(&self) -> i32 {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        }
    }
}

/// Whether a registered socket is a listener or a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    Listener,
    Client,
}

/// State shared by all workers.
pub struct Shared {
    pub config: Config,
    pub engine: Box<dyn Engine>,
    pub engine_name: &'static str,
    pub clock: Clock,
    pub stats: ServerStats,
    pub limits: Limits,
    /// Credentials for `-Y` and `-S`.
    pub auth: crate::auth::Auth,
    /// Replication (role, the puller, the replicas pulling from here).
    pub repl: crate::replication::Replication,
    /// SIGUSR1 asked for a graceful stop: with `-e`, save a snapshot for a warm restart.
    save_on_exit: AtomicBool,
    pub verbosity: AtomicU8,
    pub curr_conns: AtomicUsize,
    pub total_conns: AtomicU64,
    pub rejected_conns: AtomicU64,
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
}

impl Shared {
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

    pub fn log(&self, level: u8, msg: impl FnOnce() -> String) {
        if self.verbosity.load(Ordering::Relaxed) >= level {
            eprintln!("{}", msg());
        }
    }
}

/// The memory limit in bytes for a configuration.
pub fn memory_bytes(limit: MemoryLimit) -> usize {
    match limit {
        MemoryLimit::Fixed(b) => b,
        MemoryLimit::Auto => crate::memory::auto_limit(),
    }
}

/// Bind every listening socket the configuration asks for.
pub fn bind_listeners(config: &Config) -> Result<Vec<Listener>, String> {
    let mut out = Vec::new();
    if let Some(path) = &config.unix_socket {
        out.push(bind_unix(path, config.unix_mask, config.backlog)?);
        return Ok(out);
    }
    for entry in &config.listeners {
        if entry.port_or(config.tcp_port) == 0 {
            continue;
        }
        let addrs = entry
            .socket_addrs(config.tcp_port)
            .map_err(|e| format!("failed to resolve {:?}: {e}", entry.host))?;
        if addrs.is_empty() {
            return Err(format!("{:?} resolves to no address", entry.host));
        }
        for addr in addrs {
            out.push(bind_tcp(addr, config.backlog)?);
        }
    }
    if out.is_empty() {
        return Err("nothing to listen on: set -p, -l or -s".into());
    }
    Ok(out)
}

fn bind_tcp(addr: SocketAddr, backlog: i32) -> Result<Listener, String> {
    let fail = |e: io::Error| format!("failed to listen on TCP {addr}: {e}");
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(fail)?;
    socket.set_reuse_address(true).map_err(fail)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true).map_err(fail)?;
    }
    socket.bind(&addr.into()).map_err(fail)?;
    socket.listen(backlog).map_err(fail)?;
    socket.set_nonblocking(true).map_err(fail)?;
    Ok(Listener::Tcp(socket.into()))
}

fn bind_unix(path: &Path, mask: u32, backlog: i32) -> Result<Listener, String> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let fail = |e: io::Error| format!("failed to listen on unix socket {}: {e}", path.display());
    // Like memcached, replace a stale socket file, but never another kind of file.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            std::fs::remove_file(path).map_err(fail)?;
        }
    }
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(fail)?;
    let addr = socket2::SockAddr::unix(path).map_err(fail)?;
    socket.bind(&addr).map_err(fail)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mask & 0o777)).map_err(fail)?;
    socket.listen(backlog).map_err(fail)?;
    socket.set_nonblocking(true).map_err(fail)?;
    Ok(Listener::Unix(socket.into()))
}

/// Build the engine the configuration asks for.
pub fn build_engine(config: &Config) -> (Box<dyn Engine>, &'static str) {
    let ec = EngineConfig {
        max_bytes: memory_bytes(config.memory_limit),
        max_item_size: config.item_size_max,
        no_evict: config.no_evict,
        use_cas: config.use_cas,
    };
    match config.engine {
        EngineChoice::Log => (Box::new(LogEngine::new(ec)), "log"),
        EngineChoice::HashMap => (Box::new(HashMapEngine::new(ec)), "hashmap"),
    }
}

/// Run the server until a signal or `shutdown` stops it.
pub fn run(config: Config, listeners: Vec<Listener>) -> Result<(), String> {
    let threads = config.threads.max(1);
    // Like memcached, the auth file is read after dropping privileges and daemonizing.
    let auth = crate::auth::Auth::new(&config)?;
    let (engine, engine_name) = build_engine(&config);
    if let Some(path) = &config.memory_file {
        crate::warm::load(&*engine, path, &Clock::new());
    }
    let worker_stats: Vec<Arc<WorkerStats>> = (0..threads)
        .map(|_| Arc::new(WorkerStats::default()))
        .collect();
    let shared = Arc::new(Shared {
        limits: Limits {
            max_value: config.item_size_max,
            flush_enabled: config.flush_enabled,
            shutdown_enabled: config.enable_shutdown,
        },
        auth,
        repl: crate::replication::Replication::new(),
        save_on_exit: AtomicBool::new(false),
        verbosity: AtomicU8::new(config.verbose),
        engine,
        engine_name,
        clock: Clock::new(),
        stats: ServerStats::new(worker_stats.clone()),
        curr_conns: AtomicUsize::new(0),
        total_conns: AtomicU64::new(0),
        rejected_conns: AtomicU64::new(0),
        accepting: AtomicBool::new(true),
        listen_disabled_num: AtomicU64::new(0),
        listen_disabled_since_us: AtomicU64::new(0),
        time_in_listen_disabled_us: AtomicU64::new(0),
        shutdown: AtomicBool::new(false),
        registry: Mutex::new(BTreeMap::new()),
        wakers: OnceLock::new(),
        config,
    });
    for l in &listeners {
        let info = Arc::new(ConnInfo::new(l.describe(), String::new()));
        info.last_cmd.store(shared.clock.now(), Ordering::Relaxed);
        shared.register(l.fd(), ConnKind::Listener, info);
        shared.log(1, || format!("listening on {}", l.describe()));
    }

    let udp_addrs = crate::udp::addresses(&shared.config)?;
    let mut workers = Vec::with_capacity(threads);
    let mut wakers = Vec::with_capacity(threads);
    for (i, stats) in worker_stats.into_iter().enumerate() {
        let mine = listeners
            .iter()
            .map(|l| l.try_clone())
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| format!("failed to share a listening socket: {e}"))?;
        let worker = Worker::new(i, shared.clone(), stats, mine, &udp_addrs)
            .map_err(|e| format!("failed to start worker {i}: {e}"))?;
        wakers.push(worker.waker());
        workers.push(worker);
    }
    let _ = shared.wakers.set(wakers);
    let _ = shared.repl.server.set(Arc::downgrade(&shared));
    // --min-replicas: no replica yet, so writes start refused.
    shared.repl.check_min_replicas(&shared.config);
    if let Some(master) = shared.config.replica_of.clone() {
        crate::replication::follow(&shared, master);
    }

    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGUSR1,
    ])
    .map_err(|e| format!("failed to install signal handlers: {e}"))?;
    let handle = signals.handle();
    let watcher = {
        let shared = shared.clone();
        let mut signals = signals;
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    // Like memcached, SIGHUP reloads the -Y auth file and nothing else.
                    if sig == signal_hook::consts::SIGHUP {
                        match shared.auth.reload() {
                            Ok(()) => shared.log(1, || "SIGHUP: auth file reloaded".into()),
                            Err(e) => eprintln!("kvcached: SIGHUP: {e}; keeping the old entries"),
                        }
                        continue;
                    }
                    // Like memcached, SIGUSR1 is a graceful stop that saves the cache for a
                    // warm restart when -e names a file. So is SIGTERM (unlike memcached),
                    // so that a service manager's stop keeps the cache warm; SIGINT (^C)
                    // saves nothing.
                    if sig == signal_hook::consts::SIGUSR1 || sig == signal_hook::consts::SIGTERM {
                        shared.save_on_exit.store(true, Ordering::Release);
                    }
                    shared.log(1, || format!("signal {sig}: shutting down"));
                    shared.request_shutdown();
                    break;
                }
            })
            .map_err(|e| format!("failed to start the signal thread: {e}"))?
    };

    let mut handles = Vec::with_capacity(workers.len());
    for (i, w) in workers.into_iter().enumerate() {
        let h = std::thread::Builder::new()
            .name(format!("worker-{i}"))
            .spawn(move || w.run())
            .map_err(|e| format!("failed to spawn worker {i}: {e}"))?;
        handles.push(h);
    }
    let maintenance = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("maintenance".into())
            .spawn(move || maintenance_loop(&shared))
            .map_err(|e| format!("failed to spawn maintenance thread: {e}"))?
    };

    let mut failed = false;
    for h in handles {
        if h.join().is_err() {
            failed = true;
            shared.request_shutdown();
        }
    }
    handle.close();
    let _ = watcher.join();
    let _ = maintenance.join();
    if let Some(path) = &shared.config.unix_socket {
        let _ = std::fs::remove_file(path);
    }
    if !failed && shared.save_on_exit.load(Ordering::Acquire) {
        if let Some(path) = &shared.config.memory_file {
            crate::warm::save(&shared, path)?;
        }
    }
    if failed {
        return Err("a worker thread failed".into());
    }
    Ok(())
}

/// Return free heap memory to the system (glibc's `malloc_trim`).
fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator's own heaps; it has no
    // preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Reclaim expired items in the background, a bounded amount each tick, until shutdown;
/// with `-m auto`, follow the memory available once a second (`memory::adjust`).
fn maintenance_loop(shared: &Shared) {
    // Sleep in short slices so that shutdown is noticed promptly.
    let slice = std::time::Duration::from_millis(50);
    let mut n = 0u32;
    let auto = shared.config.memory_limit == MemoryLimit::Auto;
    let mut trimmed_at = 0u64;
    let ceiling = shared.engine.stats().limit_maxbytes as usize;
    while !shared.shutting_down() {
        if n % 4 == 0 {
            shared.engine.maintain(shared.clock.now());
        }
        shared.repl.check_min_replicas(&shared.config);
        if n % 20 == 0 {
            // Connections closed since the last look: give the memory their buffers held
            // back to the system (glibc keeps freed memory below the top of its heaps).
            let closed = shared
                .total_conns
                .load(Ordering::Relaxed)
                .saturating_sub(shared.curr_conns.load(Ordering::Relaxed) as u64);
            if closed != trimmed_at {
                trimmed_at = closed;
                trim_heap();
            }
        }
        if auto && n % 20 == 0 {
            if let Some(available) = crate::memory::available_now() {
                let limit = shared.engine.stats().limit_maxbytes as usize;
                let next = crate::memory::adjust(limit, available, ceiling);
                if next != limit {
                    shared.log(1, || {
                        format!(
                            "-m auto: {} MiB available; memory limit {} -> {} MiB",
                            available >> 20,
                            limit >> 20,
                            next >> 20
                        )
                    });
                    shared.engine.set_max_bytes(next, shared.clock.now());
                }
            }
        }
        n = n.wrapping_add(1);
        std::thread::sleep(slice);
    }
}
