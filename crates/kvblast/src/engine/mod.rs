//! The load engine: worker threads, each with its own mio event loop over its own
//! connections, driving a closed loop (connections × pipeline depth) or an open loop (requests
//! at scheduled times, latency measured from each request's intended send time).
//!
//! Thread model: `run` spawns `threads` workers and keeps the main thread for the progress
//! line. Each worker connects `conns` connections to every server, runs the load phase on its
//! share of the keys, meets the others at a barrier, then runs warm-up + measured window +
//! drain against one shared start instant. Workers share only read-only data (key space,
//! routing table, popularity table, value bytes) and a few relaxed progress counters.
//!
//! Every loop is bounded: the measured window ends by the clock (and optionally a request
//! count), the drain by `drain`, the load phase by `load_timeout`; a server that stops
//! answering cannot hold a run past those deadlines.
//!
//! **Architecture Invariant:** nothing a server sends can panic a worker: replies go through
//! `kvproto::client::parse_reply`, and a reply that does not fit the request it answers closes
//! that connection and is counted.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use kvproto::client::{self as proto, binary, MetaReply, ParseMetaReply, ParseReply, Reply};
use mio::{Events, Interest, Poll, Token};
use rand::rngs::Xoshiro256PlusPlus;
use rand::SeedableRng;

use crate::dist::{self, Arrival, Dist, KeyChooser};
use crate::route::{Ring, Routing};
pub use crate::stats::Pipeline;
use crate::stats::{late_send_ns, Report, Sample, Stats};
use crate::transport::{Endpoint, Stream};
use crate::workload::{Keyspace, Op, Workload};

mod config;
mod conn;
mod replies;
mod worker;

use config::Wire;
pub use config::{ConfigError, LoadModel, Protocol, RunConfig};
use conn::{Conn, Pending, UdpState, READ_CHUNK};
use worker::{mark, Worker, WorkerResult, GIVE_UP, RECONNECT_MAX, RECONNECT_MIN, UDP_LOAD_WINDOW};

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Server(#[from] crate::transport::TransportError),
    #[error(transparent)]
    Dist(#[from] dist::DistError),
    #[error("spawn: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("poll: {0}")]
    Poll(#[source] std::io::Error),
    #[error("register: {0}")]
    Register(#[source] std::io::Error),
    #[error("connect {server}: {source}")]
    Connect {
        server: String,
        source: std::io::Error,
    },
    /// This worker gave up because another could not connect (that one says why).
    #[error("aborted: another worker could not connect")]
    Aborted,
    #[error("a worker thread panicked")]
    Panicked,
}

/// The largest value a workload may set, and (with a margin) the largest reply accepted.
pub const MAX_VALUE: usize = 64 << 20;

/// Read-only data the workers share.
struct Shared {
    keyspace: Keyspace,
    /// Server of each key, precomputed when there are several servers.
    routes: Option<Vec<u16>>,
    chooser: KeyChooser,
    value: Vec<u8>,
    start: OnceLock<Instant>,
    abort: AtomicBool,
    progress: Vec<Progress>,
}

/// Per-thread progress counters, each on its own cache line.
#[repr(align(64))]
#[derive(Default)]
struct Progress {
    completed: AtomicU64,
    errors: AtomicU64,
}

impl Shared {
    fn server_of(&self, key: u64) -> usize {
        match &self.routes {
            Some(r) => r.get(key as usize).copied().unwrap_or(0) as usize,
            None => 0,
        }
    }
}

/// Run a whole benchmark and return its report (server counters are the caller's business).
pub fn run(cfg: &RunConfig) -> Result<Report, EngineError> {
    run_synced(cfg, &mut || Ok(Instant::now() + Duration::from_millis(5)))
}

/// [`run`], with the start instant given by `sync`, which is called once every worker has
/// connected and finished the load phase (and not at all if a worker failed). Distributed
/// load uses it to start every participant together; an error from it aborts the run (the
/// workers send nothing) and is the run's error. The run's own errors are [`EngineError`]s,
/// given as the caller's error type `E`.
pub fn run_synced<E: From<EngineError>>(
    cfg: &RunConfig,
    sync: &mut dyn FnMut() -> Result<Instant, E>,
) -> Result<Report, E> {
    cfg.validate().map_err(EngineError::from)?;
    let addrs: Vec<Endpoint> = cfg
        .servers
        .iter()
        .map(|s| Endpoint::parse(s))
        .collect::<Result<_, _>>()
        .map_err(EngineError::from)?;
    let names: Vec<String> = addrs
        .iter()
        .zip(&cfg.servers)
        .map(|(e, s)| e.ring_name(s))
        .collect();
    let ring = Ring::new(cfg.routing, &names);
    let keyspace = Keyspace::new(cfg.workload.keys, &cfg.workload.key_size);
    let routes = if addrs.len() > 1 {
        let mut buf = Vec::with_capacity(256);
        Some(
            (0..cfg.workload.keys)
                .map(|k| {
                    buf.clear();
                    keyspace.write_key(k, &mut buf);
                    ring.server_for(&buf) as u16
                })
                .collect(),
        )
    } else {
        None
    };
    let chooser = KeyChooser::new(cfg.workload.keys, &cfg.workload.popularity, cfg.seed)
        .map_err(EngineError::from)?;
    if let Some((i, n)) = cfg.key_share() {
        // Checked here so that a bad share is an error before any connection is made.
        chooser
            .clone()
            .set_partition(i, n)
            .map_err(EngineError::from)?;
    }
    let shared = Arc::new(Shared {
        keyspace,
        routes,
        chooser,
        value: vec![b'x'; cfg.workload.value_size.max.max(1)],
        start: OnceLock::new(),
        abort: AtomicBool::new(false),
        progress: (0..=cfg.threads).map(|_| Progress::default()).collect(),
    });
    let probe_cfg = cfg.probe_config();
    let workers = cfg.threads + usize::from(probe_cfg.is_some());
    let barrier = Arc::new(Barrier::new(workers + 1));
    let failed = Arc::new(AtomicBool::new(false));
    let load_started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..workers {
        // The probe is the last worker, with a configuration of its own.
        let probe = t == cfg.threads;
        let cfg = match (&probe_cfg, probe) {
            (Some(p), true) => p.clone(),
            _ => cfg.clone(),
        };
        let shared = Arc::clone(&shared);
        let barrier = Arc::clone(&barrier);
        let failed = Arc::clone(&failed);
        let addrs = addrs.clone();
        let h = std::thread::Builder::new()
            .name(format!("kvblast-{t}"))
            .spawn(move || {
                let worker = Worker::connect(t, &cfg, Arc::clone(&shared), &addrs);
                let worker = match worker {
                    Ok(mut w) => {
                        if cfg.load_phase {
                            w.load_phase();
                        }
                        Ok(w)
                    }
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        Err(e)
                    }
                };
                barrier.wait();
                barrier.wait();
                let mut w = worker?;
                if shared.abort.load(Ordering::Relaxed) {
                    return Err(EngineError::Aborted);
                }
                w.main_phase();
                Ok((probe, w.stats, std::mem::take(&mut w.touched)))
            })
            .map_err(EngineError::Spawn)?;
        handles.push(h);
    }
    barrier.wait();
    let load_seconds = cfg.load_phase.then(|| load_started.elapsed().as_secs_f64());
    let mut sync_err = None;
    let start = if failed.load(Ordering::Relaxed) {
        shared.abort.store(true, Ordering::Relaxed);
        Instant::now()
    } else {
        // By default a short lead time, so that every worker sees the start in the future.
        match sync() {
            Ok(s) => s,
            Err(e) => {
                shared.abort.store(true, Ordering::Relaxed);
                sync_err = Some(e);
                Instant::now()
            }
        }
    };
    let start_unix_ns = unix_ns_at(start);
    let _ = shared.start.set(start);
    barrier.wait();
    let timeline = if shared.abort.load(Ordering::Relaxed) {
        Vec::new()
    } else {
        progress_loop(cfg, &shared, start, &handles)
    };
    let mut stats = Stats::default();
    let mut probe_stats = None;
    let mut worker_err: Option<EngineError> = None;
    let mut touched: Vec<u64> = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok((true, s, _))) => probe_stats = Some(s),
            Ok(Ok((false, s, t))) => {
                stats.merge(&s);
                if touched.is_empty() {
                    touched = t;
                } else {
                    for (a, b) in touched.iter_mut().zip(&t) {
                        *a |= b;
                    }
                }
            }
            // A worker that failed to connect says why; the others only say "aborted".
            Ok(Err(e)) => {
                if matches!(worker_err, None | Some(EngineError::Aborted)) {
                    worker_err = Some(e);
                }
            }
            Err(_) => {
                worker_err.get_or_insert(EngineError::Panicked);
            }
        }
    }
    // The sync's error comes first: it aborted the run.
    if let Some(e) = sync_err {
        return Err(e);
    }
    if let Some(e) = worker_err {
        return Err(e.into());
    }
    let seconds = measured_seconds(cfg, &stats);
    Ok(Report {
        settings: cfg.settings(),
        pipeline: cfg.pipeline,
        depth: cfg.depth,
        seconds,
        target_rate: match cfg.load {
            LoadModel::Open { rate, .. } => Some(rate),
            LoadModel::Closed => None,
        },
        slo_us: cfg.slo.as_secs_f64() * 1e6,
        stats,
        probe: probe_stats,
        timeline,
        load_seconds,
        server: None,
        start_unix_ns,
        distinct_keys: (!touched.is_empty())
            .then(|| touched.iter().map(|w| u64::from(w.count_ones())).sum()),
        participants: Vec::new(),
    })
}

/// The wall-clock time (ns since the Unix epoch) of a monotonic instant near now.
pub fn unix_ns_at(t: Instant) -> u64 {
    let (wall, now) = (std::time::SystemTime::now(), Instant::now());
    let wall = if t >= now {
        wall + (t - now)
    } else {
        wall - (now - t)
    };
    wall.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Keys a worker tracks as touched (a bit each) when there are at most this many, and
/// threads × keys is at most [`TRACK_BITS_TOTAL`].
const TRACK_KEYS_MAX: u64 = 1 << 24;
const TRACK_BITS_TOTAL: u64 = 1 << 30;

/// The measured window's length: the configured duration, or shorter when a request count
/// ended the run first (then the issue rate tells the time: count / rate for an open loop;
/// for a closed loop the workers record when they stopped).
fn measured_seconds(cfg: &RunConfig, stats: &Stats) -> f64 {
    let full = cfg.duration.as_secs_f64();
    match (cfg.requests, cfg.load) {
        (Some(n), LoadModel::Open { rate, .. }) if stats.issued >= n => {
            (n as f64 / rate).min(full.max(f64::MIN_POSITIVE))
        }
        (Some(_), LoadModel::Closed) if stats.window_ns > 0 => {
            (stats.window_ns as f64 / 1e9).min(if full > 0.0 { full } else { f64::MAX })
        }
        _ => full,
    }
}

/// Sample the workers' counters once a second until they finish (printing a progress line
/// when asked) and return the samples.
fn progress_loop(
    cfg: &RunConfig,
    shared: &Shared,
    start: Instant,
    handles: &[std::thread::JoinHandle<WorkerResult>],
) -> Vec<Sample> {
    let totals = || {
        shared.progress.iter().fold((0, 0), |(d, e), p| {
            (
                d + p.completed.load(Ordering::Relaxed),
                e + p.errors.load(Ordering::Relaxed),
            )
        })
    };
    // The load phase's completions came before the start.
    let (mut last, mut last_errs) = totals();
    let mut samples = Vec::new();
    let mut tick = start + Duration::from_secs(1);
    let duration = if cfg.duration.is_zero() {
        Duration::from_secs(3600)
    } else {
        cfg.duration
    };
    let hard_end = start + cfg.warmup + duration + cfg.drain + Duration::from_secs(5);
    loop {
        while Instant::now() < tick {
            if handles.iter().all(|h| h.is_finished()) {
                return samples;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (done, errs) = totals();
        let t = tick.duration_since(start);
        samples.push(Sample {
            t: t.as_secs_f64(),
            completed: done - last,
            errors: errs - last_errs,
        });
        let phase = if t <= cfg.warmup {
            "warm-up"
        } else if t <= cfg.warmup + cfg.duration {
            "run"
        } else {
            "drain"
        };
        if cfg.progress {
            eprintln!(
                "[{:>6.1}s {phase:>7}] {:>10} req/s  errors {}",
                t.as_secs_f64(),
                done - last,
                errs - last_errs
            );
        }
        last = done;
        last_errs = errs;
        tick += Duration::from_secs(1);
        if Instant::now() > hard_end {
            return samples;
        }
    }
}
