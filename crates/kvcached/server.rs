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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kvstore::{Engine, EngineConfig, LogEngine};

use crate::features::{replication, warm};
use crate::runtime::listener::Listener;
use crate::runtime::worker::Worker;
use crate::setup::config::{Config, IoChoice, MemoryLimit};
use crate::state::clock::Clock;
use crate::state::credentials::Auth;
use crate::state::registry::{ConnInfo, ConnKind};
use crate::state::shared::Shared;
use crate::state::stats::WorkerStats;

/// The memory limit in bytes for a configuration.
pub fn memory_bytes(limit: MemoryLimit) -> usize {
    match limit {
        MemoryLimit::Fixed(b) => b,
        MemoryLimit::Auto => crate::setup::memory::auto_limit(),
    }
}

/// Build the engine the configuration asks for (with its flash tier, made afresh: what
/// the files held is gone).
pub fn build_engine(config: &Config) -> Result<LogEngine, String> {
    let ec = EngineConfig {
        max_bytes: memory_bytes(config.memory_limit),
        max_item_size: config.item_size_max,
        no_evict: config.no_evict,
        use_cas: config.use_cas,
    };
    let engine = match &config.flash {
        None => LogEngine::new(ec),
        Some(f) => {
            let engine = LogEngine::with_layout(ec, kvstore::IndexLayout::Wide);
            let tc = kvstore::flash::TierConfig {
                files: f.files.clone(),
                page_bytes: engine.segment_size(),
                write_threads: f.threads,
                write_buffer: usize::try_from(f.wbuf_size).unwrap_or(usize::MAX),
                direct: f.direct,
            };
            // A warm restart's snapshot names pages of the files as they are: open them
            // (the snapshot's load takes back the pages it names). Else, or if they cannot
            // be opened as this configuration made them, they are made afresh.
            let snapshot = config.memory_file.as_ref().filter(|p| p.exists());
            let reopened = snapshot.and_then(|_| match kvstore::flash::Tier::open(&tc) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(
                        "-o ext_path: {e}; making the flash files afresh (the snapshot's \
                         flash items are lost)"
                    );
                    None
                }
            });
            let tier = match reopened {
                Some(t) => t,
                None => {
                    kvstore::flash::Tier::create(&tc).map_err(|e| format!("-o ext_path: {e}"))?
                }
            };
            engine
                .attach_flash(tier)
                .map_err(|e| format!("-o ext_path: {e}"))?;
            engine.set_flash_recache_rate(f.recache_rate);
            engine.set_flash_item_size(f.item_size);
            engine.set_flash_compact_under(f.compact_under);
            engine.set_flash_drop_unread(f.drop_unread);
            engine.set_flash_max_frag(f.max_frag);
            engine
        }
    };
    engine.set_size_factor(config.evict_size_factor);
    engine.set_repl_backlog(config.repl_backlog);
    // Per-class `stats items`/`stats slabs`, and `stats sizes` with -o track_sizes. Items
    // a warm restart loads later are counted as they are indexed.
    engine.tally_sizes(&config.slab_classes, config.track_sizes);
    Ok(engine)
}

/// Start `threads` threads doing the flash reads the workers' gets wait for
/// (`state/flash.rs`); they stop once the server is shutting down.
fn start_flash_io(shared: &Arc<Shared>, threads: usize) -> std::io::Result<()> {
    for i in 0..threads.max(1) {
        let shared = Arc::clone(shared);
        std::thread::Builder::new()
            .name(format!("flash-io-{i}"))
            .spawn(move || {
                let Some(io) = shared.flash_io.as_ref() else {
                    return;
                };
                while let Some(job) = io.next(|| shared.shutting_down()) {
                    for r in &job.reads {
                        shared.engine.complete_flash_read(r);
                    }
                    io.done(&job);
                    if let Some(w) = shared.worker_waker(job.worker) {
                        let _ = w.wake();
                    }
                }
            })?;
    }
    Ok(())
}

/// The I/O runtime this kernel allows for the one asked for: io_uring only where a ring can
/// be set up (the kernel is new enough, `kernel.io_uring_disabled` and seccomp allow it);
/// else epoll, said on stderr when io_uring was asked for by name.
fn choose_io(asked: IoChoice) -> IoChoice {
    if asked == IoChoice::Epoll {
        return IoChoice::Epoll;
    }
    match crate::runtime::ring::probe() {
        Ok(()) => IoChoice::Uring,
        Err(e) => {
            if asked == IoChoice::Uring {
                tracing::warn!("-o io=uring: io_uring is not available ({e}); using epoll");
            } else {
                tracing::debug!("io_uring is not available ({e}); using epoll");
            }
            IoChoice::Epoll
        }
    }
}

/// Run the server until a signal or `shutdown` stops it.
pub fn run(
    mut config: Config,
    listeners: Vec<Listener>,
    mut udp: Vec<mio::net::UdpSocket>,
    tls: Option<kvtls::server::ServerTls>,
) -> Result<(), String> {
    let threads = config.threads.max(1);
    config.io = choose_io(config.io);
    tune_heap();
    // Like memcached, the auth file is read after dropping privileges and daemonizing.
    let auth = Auth::new(&config)?;
    let engine = match build_engine(&config) {
        Err(e) if config.flash.as_ref().is_some_and(|f| f.ignore_bad_file) => {
            tracing::error!("{e}; serving from memory alone (-o ext_ignore_bad_file)");
            config.flash = None;
            build_engine(&config)?
        }
        built => built?,
    };
    let restored = match &config.memory_file {
        Some(path) => warm::load(&engine, path, &Clock::new(), config.warm_ignore_bad_file)?,
        None => warm::Restored::default(),
    };
    // Bound at start (a port already taken failed it before anything was loaded), they
    // accept connections from now on, the cache ready.
    for l in &listeners {
        l.listen(config.backlog)?;
    }
    // memcached writes its port file as it listens: whoever reads it may connect.
    if config.unix_socket.is_none() {
        if let Some(path) = std::env::var_os("MEMCACHED_PORT_FILENAME") {
            crate::runtime::listener::write_port_file(path.as_ref(), &listeners, &udp);
        }
    }
    let worker_stats: Vec<Arc<WorkerStats>> = (0..threads)
        .map(|_| Arc::new(WorkerStats::default()))
        .collect();
    let shared = Arc::new(Shared::new(config, engine, auth, worker_stats.clone(), tls));
    watch_evictions(&shared);
    if let Some(level) = restored.hash_power {
        shared.hash_power.raise_to(level);
    }
    shared
        .cert_loaded_at
        .store(shared.clock.now(), Ordering::Relaxed);
    for l in &listeners {
        let info = Arc::new(ConnInfo::new(l.describe(), String::new()));
        info.last_cmd.store(shared.clock.now(), Ordering::Relaxed);
        shared.register(l.fd(), ConnKind::Listener, info);
        tracing::info!("listening on {}", l.describe());
    }

    if let Some(addr) = shared.config.metrics {
        let bound = crate::runtime::metrics::start(shared.clone(), addr)
            .map_err(|e| format!("-o metrics={addr}: {e}"))?;
        tracing::info!("metrics on http://{bound}/metrics");
    }

    let udp_addrs = udp
        .iter()
        .map(|s| s.local_addr())
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| format!("a UDP socket's address: {e}"))?;
    let mut workers = Vec::with_capacity(threads);
    let mut wakers = Vec::with_capacity(threads);
    let mut cpus = Vec::with_capacity(threads);
    for (i, stats) in worker_stats.into_iter().enumerate() {
        let cpu = crate::runtime::listener::worker_cpu(i);
        cpus.push(cpu.filter(|_| shared.config.cpu_affinity));
        let mine = crate::runtime::listener::worker_listeners(&shared.config, &listeners, i, cpu)?;
        if i > 0 && shared.config.reuseport {
            for l in mine.iter().filter(|l| matches!(l, Listener::Tcp(..))) {
                let info = Arc::new(ConnInfo::new(l.describe(), String::new()));
                info.last_cmd.store(shared.clock.now(), Ordering::Relaxed);
                shared.register(l.fd(), ConnKind::Listener, info);
            }
        }
        // Worker 0 takes the UDP sockets bound at startup; the others bind their own.
        let mine_udp = if i == 0 {
            std::mem::take(&mut udp)
        } else {
            crate::runtime::udp::bind_like(&udp_addrs)
                .map_err(|e| format!("failed to start worker {i}: UDP: {e}"))?
        };
        let worker = Worker::new(i, shared.clone(), stats, mine, mine_udp)
            .map_err(|e| format!("failed to start worker {i}: {e}"))?;
        wakers.push(worker.waker());
        workers.push(worker);
    }
    shared.set_wakers(wakers);
    shared.set_arc();
    if let Some(f) = &shared.config.flash {
        start_flash_io(&shared, f.threads).map_err(|e| format!("flash I/O threads: {e}"))?;
    }
    // --min-replicas: no replica yet, so writes start refused.
    shared.repl.check_min_replicas(&shared.config);
    if let Some(master) = shared.config.replica_of.clone() {
        replication::follow(&shared, master);
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
                            Ok(()) => tracing::info!("SIGHUP: auth file reloaded"),
                            Err(e) => tracing::error!("SIGHUP: {e}; keeping the old entries"),
                        }
                        continue;
                    }
                    // Like memcached, SIGUSR1 is a graceful stop that saves the cache for a
                    // warm restart when -e names a file. So is SIGTERM (unlike memcached),
                    // so that a service manager's stop keeps the cache warm; SIGINT (^C)
                    // saves nothing.
                    if sig == signal_hook::consts::SIGUSR1 || sig == signal_hook::consts::SIGTERM {
                        shared.request_save_on_exit();
                    }
                    tracing::info!("signal {sig}: shutting down");
                    shared.request_shutdown();
                    break;
                }
            })
            .map_err(|e| format!("failed to start the signal thread: {e}"))?
    };

    let mut handles = Vec::with_capacity(workers.len());
    let ready = Arc::new(std::sync::Barrier::new(workers.len()));
    for (i, w) in workers.into_iter().enumerate() {
        let cpu = cpus.get(i).copied().flatten();
        let ready = ready.clone();
        let h = std::thread::Builder::new()
            .name(format!("worker-{i}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    match crate::runtime::listener::pin_to(cpu) {
                        Ok(()) => tracing::debug!(worker = i, cpu, "worker pinned"),
                        Err(e) => tracing::warn!("-o cpu_affinity: worker {i}, CPU {cpu}: {e}"),
                    }
                }
                w.run(&ready)
            })
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
    if !failed && shared.save_on_exit() {
        if let Some(path) = &shared.config.memory_file {
            warm::save(&shared, path)?;
        }
    }
    if failed {
        return Err("a worker thread failed".into());
    }
    Ok(())
}

/// Keep the memory of freed connection buffers in the heap (glibc). By default glibc gives
/// the free top of a thread's heap back once more than 128 KiB of it is free (a threshold
/// it raises only as blocks it had mapped on their own are freed), so a worker whose
/// connections receive and send large values gave 64-330 KiB back and faulted it in
/// again request after request: 1,600 `madvise` calls a second at 20,000 sets of 4 KiB,
/// and 1.2x the CPU per set (`bench/compare.sh`, BENCHMARKS.md). Fixed thresholds (what
/// setting either one means to glibc): blocks under 4 MiB come from the heap, and a heap
/// keeps up to 8 MiB free at its top. Memory freed when connections close is still given
/// back by `trim_heap`. A user's own `GLIBC_TUNABLES` or `MALLOC_*_` settings win.
fn tune_heap() {
    #[cfg(target_env = "gnu")]
    {
        let user = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."))
            || std::env::vars_os().any(|(k, _)| {
                let k = k.to_string_lossy();
                k.starts_with("MALLOC_") && k.ends_with('_')
            });
        if user {
            return;
        }
        // SAFETY: mallopt only changes the allocator's parameters; it has no preconditions
        // (it runs before the worker threads start).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 8 << 20);
        }
    }
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

/// Say that the flash tier went offline (and why) or came back online.
fn log_flash_state(shared: &Shared, offline: bool) {
    let why = shared.engine.flash_write_error().unwrap_or_default();
    if offline {
        tracing::error!(
            "flash tier offline after write errors ({why}): cold items are evicted as \
             without -o ext_path, items on flash are still read; a probe write every 64 \
             evictions brings the tier back"
        );
    } else {
        tracing::warn!("flash tier back online: a probe write succeeded (last error: {why})");
    }
}

/// Reclaim expired items in the background, a bounded amount each tick, until shutdown;
/// with `-m auto`, follow the memory available once a second (`memory::adjust`).
fn maintenance_loop(shared: &Shared) {
    // One tick every 200 ms (the expiry sweep's pace); the once-a-second tasks every fifth.
    // Between ticks the thread is parked, and a shutdown unparks it: an idle server's
    // maintenance wakes 5 times a second, not more.
    let tick = std::time::Duration::from_millis(200);
    shared.set_maintenance(std::thread::current());
    let mut n = 0u32;
    let auto = shared.config.memory_limit == MemoryLimit::Auto;
    let mut trimmed_at = 0u64;
    let sizer =
        auto.then(|| crate::setup::memory::AutoSizer::new(crate::setup::memory::Sys::host()));
    if let Some(sizer) = &sizer {
        tracing::info!(
            "-m auto: memory limit {} MiB ({})",
            shared.engine.stats().limit_maxbytes >> 20,
            sizer.describe()
        );
    }
    let mut flash_offline = false;
    while !shared.shutting_down() {
        let now = shared.clock.now();
        if shared.engine.flash_offline() != flash_offline {
            flash_offline = !flash_offline;
            log_flash_state(shared, flash_offline);
        }
        if shared.crawler.running() {
            // `lru_crawler crawl`: a whole pass of the sweep now, then the crawl is done.
            for _ in 0..shared.engine.sweep_calls() {
                shared.engine.maintain(now, true);
            }
            shared.crawler.finish();
        } else {
            shared.engine.maintain(now, shared.crawler.enabled());
        }
        shared
            .hash_power
            .note_items(shared.engine.stats().curr_items);
        shared.repl.check_min_replicas(&shared.config);
        shared.repl.forget_followers(&shared.engine);
        if n % 5 == 0 {
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
        if let Some(sizer) = sizer.as_ref().filter(|_| n % 5 == 0) {
            let limit = shared.engine.stats().limit_maxbytes as usize;
            let next = sizer.next(limit);
            if next != limit {
                tracing::info!(
                    "-m auto: memory limit {} -> {} MiB ({})",
                    limit >> 20,
                    next >> 20,
                    sizer.describe()
                );
                shared.engine.set_max_bytes(next, shared.clock.now());
            }
        }
        n = n.wrapping_add(1);
        // Parked until the next tick (a spurious or early wake parks again).
        let next = std::time::Instant::now() + tick;
        while !shared.shutting_down() {
            let left = next.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::park_timeout(left);
        }
    }
}

/// `watch evictions`: the engine tells of each evicted item, and while a watcher wants
/// evictions it gets memcached's `type=eviction` line (`ttl` seconds left or -1, `la`
/// seconds since the last access). With no such watcher an eviction costs one relaxed load.
fn watch_evictions(shared: &Shared) {
    use crate::state::watch::EVICTIONS;
    use std::io::Write as _;
    let watchers = shared.watchers.clone();
    let config = shared.config.clone();
    shared
        .engine
        .observe_evictions(Box::new(move |evicted, now| {
            if !watchers.wants(EVICTIONS) {
                return;
            }
            let (key, item) = (evicted.key, evicted.meta);
            let now = i64::from(now);
            let ttl = if item.exptime == 0 {
                -1
            } else {
                i64::from(item.exptime) - now
            };
            let la = (now - i64::from(item.last_access)).max(0);
            let (_, class) =
                crate::exec::items::size_and_class(&config, key.len(), item.value_len, item.flags);
            let fetch = if item.fetched { "yes" } else { "no" };
            watchers.emit(EVICTIONS, |line| {
                line.extend_from_slice(b"type=eviction key=");
                kvproto::admin::uri_encode(line, key);
                let _ = write!(
                    line,
                    " fetch={fetch} ttl={ttl} la={la} clsid={class} size={}",
                    item.value_len
                );
            });
        }));
}
