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
use crate::stats::{late_send_ns, Report, Sample, Stats};
use crate::transport::{Endpoint, Stream};
use crate::workload::{Keyspace, Op, Workload};

/// Which commands carry the requests: the classic text commands; memcached 1.6's meta
/// commands for gets, sets and deletes (`mg`/`ms`/`md`; a multiget is quiet `mg`s closed by
/// `mn`; touch and incr stay classic, as a connection may mix both kinds); or the binary
/// protocol for all of them (a multiget is GetQs closed by a Noop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Text,
    Meta,
    Binary,
}

impl Protocol {
    pub fn parse(s: &str) -> Result<Protocol, String> {
        match s {
            "text" | "ascii" => Ok(Protocol::Text),
            "meta" => Ok(Protocol::Meta),
            "binary" => Ok(Protocol::Binary),
            _ => Err(format!("bad protocol {s:?}: text | meta | binary")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Text => "text",
            Protocol::Meta => "meta",
            Protocol::Binary => "binary",
        }
    }
}

/// The wire format of one request (a meta connection sends touch and incr as text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Text,
    Meta,
    Binary,
}

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadModel {
    /// Every connection keeps `depth` requests outstanding.
    Closed,
    /// Requests at `rate` per second overall, spaced by `arrival`.
    Open { rate: f64, arrival: Arrival },
}

/// A validated run configuration.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Servers as "host:port".
    pub servers: Vec<String>,
    pub routing: Routing,
    pub protocol: Protocol,
    pub workload: Workload,
    pub threads: usize,
    /// Connections per server per thread.
    pub conns: usize,
    /// Closed loop: requests outstanding per connection. Open loop: the most a connection
    /// may have outstanding before a due request is skipped (and counted).
    pub depth: usize,
    pub load: LoadModel,
    pub warmup: Duration,
    pub duration: Duration,
    /// Stop after this many measured requests (across threads), if set.
    pub requests: Option<u64>,
    /// Look-aside: a get that misses is followed by a set of the same key.
    pub look_aside: bool,
    /// Set every key once before the run.
    pub load_phase: bool,
    pub load_timeout: Duration,
    pub slo: Duration,
    pub seed: u64,
    /// Print a progress line to stderr once a second.
    pub progress: bool,
    /// How long to wait for outstanding replies after the window ends.
    pub drain: Duration,
    pub connect_timeout: Duration,
    /// UDP: how long to wait for a reply before counting the request as dropped.
    pub udp_timeout: Duration,
    /// A separate latency probe: one more connection per server, in a thread of its own,
    /// with one request at a time at this rate (mutilate's unloaded latency client).
    pub probe_rate: Option<f64>,
    /// Distributed load: this participant's number (0 = the controller) of `participants`.
    /// It changes the random streams (every participant draws its own requests from the same
    /// workload: `seed` still fixes the key space, e.g. the bucket shuffle).
    pub participant: u64,
    pub participants: u64,
    /// Distributed load: this participant draws (and its load phase sets) only the keys
    /// `k % participants == participant`.
    pub split_keys: bool,
}

impl RunConfig {
    /// Defaults for a workload against some servers: closed loop, 1 thread, 1 connection,
    /// depth 1, 10 s, no warm-up.
    pub fn new(workload: Workload, servers: Vec<String>) -> RunConfig {
        RunConfig {
            servers,
            routing: Routing::Ketama,
            protocol: Protocol::Text,
            workload,
            threads: 1,
            conns: 1,
            depth: 1,
            load: LoadModel::Closed,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(10),
            requests: None,
            look_aside: false,
            load_phase: false,
            load_timeout: Duration::from_secs(120),
            slo: Duration::from_millis(1),
            seed: 1,
            progress: false,
            drain: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(3),
            probe_rate: None,
            udp_timeout: Duration::from_secs(1),
            participant: 0,
            participants: 1,
            split_keys: false,
        }
    }

    /// Whether this run draws from a share of the key space only.
    pub fn key_share(&self) -> Option<(u64, u64)> {
        (self.split_keys && self.participants > 1).then_some((self.participant, self.participants))
    }

    /// The seed of this participant's random streams (the controller's is `seed` itself, so a
    /// run without agents is unchanged).
    fn stream_seed(&self) -> u64 {
        self.seed
            .wrapping_add(self.participant.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.servers.is_empty() {
            return Err("no servers given".into());
        }
        if self.servers.len() > 65_536 {
            return Err("too many servers".into());
        }
        if self.threads == 0 || self.threads > 1024 {
            return Err("threads must be in 1..=1024".into());
        }
        if self.conns == 0 || self.depth == 0 {
            return Err("connections and depth must be at least 1".into());
        }
        if self.workload.keys == 0 || self.workload.keys > 1 << 31 {
            // The popularity tables and per-key sizes take a few bytes per key.
            return Err("keys must be in 1..=2^31".into());
        }
        if self.workload.multiget == 0 || self.workload.multiget > 10_000 {
            return Err("multiget must be in 1..=10000".into());
        }
        if let LoadModel::Open { rate, .. } = self.load {
            if !(rate > 0.0 && rate.is_finite()) {
                return Err("rate must be positive".into());
            }
        }
        if self.duration.is_zero() && self.requests.is_none() {
            return Err("give a duration or a request count".into());
        }
        if self.servers.iter().any(|s| s.starts_with("udp:")) {
            if self.protocol != Protocol::Text {
                return Err("UDP servers take the text protocol only (for now)".into());
            }
            if self.workload.value_size.max > crate::transport::UDP_MAX_REQUEST - 1024 {
                return Err(format!(
                    "UDP requests must fit one datagram: use --value-max {} or less",
                    crate::transport::UDP_MAX_REQUEST - 1024
                ));
            }
        }
        if let Some(r) = self.probe_rate {
            if !(r > 0.0 && r.is_finite()) {
                return Err("probe rate must be positive".into());
            }
        }
        if self.workload.value_size.max > MAX_VALUE {
            return Err(format!("value sizes are limited to {MAX_VALUE} bytes"));
        }
        if self.participants == 0 || self.participant >= self.participants {
            return Err("participant must be I/N with I < N".into());
        }
        if self.key_share().is_some() && self.workload.keys < self.participants {
            return Err(format!(
                "splitting {} keys between {} participants leaves one without keys \
                 (use more keys or --agent-keys shared)",
                self.workload.keys, self.participants
            ));
        }
        Ok(())
    }

    /// The settings worth printing in a report.
    pub fn settings(&self) -> Vec<(String, String)> {
        let mut v = vec![
            ("workload".into(), self.workload.describe()),
            ("servers".into(), self.servers.join(" ")),
            ("routing".into(), self.routing.name().into()),
            ("protocol".into(), self.protocol.name().into()),
        ];
        v.push((
            "load".into(),
            match self.load {
                LoadModel::Closed => format!(
                    "closed loop, {} thread(s) x {} conn(s)/server x depth {}",
                    self.threads, self.conns, self.depth
                ),
                LoadModel::Open { rate, arrival } => format!(
                    "open loop, {rate:.0} req/s {} arrivals, {} thread(s) x {} conn(s)/server, cap {}/conn",
                    arrival.name(),
                    self.threads,
                    self.conns,
                    self.depth
                ),
            },
        ));
        v.push((
            "limits".into(),
            format!(
                "warm-up {:?}, duration {:?}{}{}{}",
                self.warmup,
                self.duration,
                self.requests
                    .map(|r| format!(", {r} requests"))
                    .unwrap_or_default(),
                if self.look_aside { ", look-aside" } else { "" },
                if self.load_phase { ", load phase" } else { "" }
            ),
        ));
        if let Some(r) = self.probe_rate {
            v.push((
                "probe".into(),
                format!("1 connection/server, one request at a time, {r:.0} req/s"),
            ));
        }
        v.push(("seed".into(), self.seed.to_string()));
        if let Some((i, n)) = self.key_share() {
            v.push(("keys share".into(), format!("keys k with k mod {n} = {i}")));
        }
        v
    }

    /// The configuration of the latency probe worker, if there is one.
    fn probe_config(&self) -> Option<RunConfig> {
        let rate = self.probe_rate?;
        let mut p = self.clone();
        p.threads = 1;
        p.conns = 1;
        p.depth = 1;
        p.load = LoadModel::Open {
            rate,
            arrival: Arrival::Poisson,
        };
        p.requests = None;
        p.load_phase = false;
        p.look_aside = false;
        p.seed = self.seed ^ 0x9E0B_E000;
        p.probe_rate = None;
        // The probe is not part of the load: it samples the whole key space.
        p.split_keys = false;
        Some(p)
    }
}

const ABORTED: &str = "aborted: another worker could not connect";

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
pub fn run(cfg: &RunConfig) -> Result<Report, String> {
    run_synced(cfg, &mut || Ok(Instant::now() + Duration::from_millis(5)))
}

/// [`run`], with the start instant given by `sync`, which is called once every worker has
/// connected and finished the load phase (and not at all if a worker failed). Distributed
/// load uses it to start every participant together; an error from it aborts the run (the
/// workers send nothing) and is the run's error.
pub fn run_synced(
    cfg: &RunConfig,
    sync: &mut dyn FnMut() -> Result<Instant, String>,
) -> Result<Report, String> {
    cfg.validate()?;
    let addrs: Vec<Endpoint> = cfg
        .servers
        .iter()
        .map(|s| Endpoint::parse(s))
        .collect::<Result<_, _>>()?;
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
    let chooser = KeyChooser::new(cfg.workload.keys, &cfg.workload.popularity, cfg.seed)?;
    if let Some((i, n)) = cfg.key_share() {
        // Checked here so that a bad share is an error before any connection is made.
        chooser.clone().set_partition(i, n)?;
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
                    return Err(ABORTED.to_string());
                }
                w.main_phase();
                Ok((probe, w.stats, std::mem::take(&mut w.touched)))
            })
            .map_err(|e| format!("spawn: {e}"))?;
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
    let mut first_err = sync_err;
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
                if first_err.as_deref().is_none_or(|f| f == ABORTED) {
                    first_err = Some(e);
                }
            }
            Err(_) => {
                first_err.get_or_insert_with(|| "a worker thread panicked".to_string());
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let seconds = measured_seconds(cfg, &stats);
    Ok(Report {
        settings: cfg.settings(),
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

// ---------------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------------

const TIMER: Token = Token(usize::MAX);

/// The first wait before reconnecting a failed connection; each failure in a row doubles it,
/// up to [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(10);
const RECONNECT_MAX: Duration = Duration::from_millis(500);

/// The main loops stop when no connection has been up for this long.
const GIVE_UP: Duration = Duration::from_secs(10);

/// Load-phase sets outstanding per UDP socket: a burst of datagrams larger than the server's
/// receive buffer is dropped by the kernel, so UDP keeps a smaller window than streams.
const UDP_LOAD_WINDOW: usize = 8;

/// The load phase gives up when no set has been answered for this long (or five UDP
/// timeouts, if longer): a server that stops answering cannot hold it until `load_timeout`.
const LOAD_STALL: Duration = Duration::from_secs(5);

/// What a worker thread returns: whether it was the probe, its counters, and the keys its
/// main phase sent requests for (a bit per key; empty when not tracked).
type WorkerResult = Result<(bool, Stats, Vec<u64>), String>;
const READ_CHUNK: usize = 64 * 1024;

/// A request sent and not yet answered.
#[derive(Debug, Clone, Copy)]
struct Pending {
    op: Op,
    key: u64,
    nkeys: u32,
    /// Latency is measured from here: the intended send time (open loop) or the time the
    /// request was written (closed loop).
    t0: Instant,
    measured: bool,
    load: bool,
    /// How it was sent, so which parser reads its reply.
    wire: Wire,
    /// UDP request id (0 on streams).
    id: u16,
}

struct Conn {
    sock: Stream,
    server: usize,
    wbuf: Vec<u8>,
    wpos: usize,
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
    inflight: VecDeque<Pending>,
    /// `VALUE` items seen so far for the get at the front of `inflight`.
    values: u32,
    alive: bool,
    /// A dead connection's next reconnection attempt.
    retry_at: Option<Instant>,
    /// The wait before the next attempt after a failure: [`RECONNECT_MIN`], doubled by each
    /// failure up to [`RECONNECT_MAX`], back to the minimum after a reply.
    backoff: Duration,
    /// A reconnection in progress (a non-blocking TCP connect): when it began.
    connecting_since: Option<Instant>,
    /// Datagram state, for a UDP "connection" (a connected UDP socket).
    udp: Option<Box<UdpState>>,
}

/// UDP framing: each request is one datagram with an 8-byte header; a reply may come in
/// several messages (memcached 1.6 sends each `VALUE` of a get, and the `END`, as separate
/// messages, each numbered from sequence 0 under the request's id). Replies come back in
/// request order on loopback, so the reply bytes of the request at the front of `inflight`
/// are gathered in the connection's read buffer; a datagram for a later request means the
/// front one's reply was lost.
struct UdpState {
    /// End offset in `wbuf` of each datagram not yet sent.
    ends: VecDeque<usize>,
    next_id: u16,
    /// The request id whose reply bytes are in the read buffer, and the last sequence number.
    cur: Option<(u16, u16)>,
    scratch: Vec<u8>,
}

impl Conn {
    /// Up, and not still connecting.
    fn usable(&self) -> bool {
        self.alive && self.connecting_since.is_none()
    }
}

impl UdpState {
    fn new() -> Box<UdpState> {
        Box::new(UdpState {
            ends: VecDeque::new(),
            next_id: 0,
            cur: None,
            scratch: vec![0; 65_536],
        })
    }
}

/// The reply reduced to what the engine needs (so the read buffer's borrow ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Got {
    Value,
    End,
    Stored,
    NotStored,
    Exists,
    Deleted,
    NotFound,
    Touched,
    Number,
    Error,
    Other,
    // Meta replies that have no text counterpart.
    Hd,
    En,
    Mn,
}

impl Got {
    fn of(r: &Reply<'_>) -> Got {
        match r {
            Reply::Value { .. } => Got::Value,
            Reply::End => Got::End,
            Reply::Stored => Got::Stored,
            Reply::NotStored => Got::NotStored,
            Reply::Exists => Got::Exists,
            Reply::Deleted => Got::Deleted,
            Reply::NotFound => Got::NotFound,
            Reply::Touched => Got::Touched,
            Reply::Number(_) => Got::Number,
            Reply::Error | Reply::ClientError(_) | Reply::ServerError(_) => Got::Error,
            _ => Got::Other,
        }
    }

    fn of_binary(r: &binary::Response<'_>) -> Got {
        use binary::{opcode, status};
        match (r.opcode, r.status) {
            (opcode::GET | opcode::GETQ, status::SUCCESS) => Got::Value,
            (opcode::GET, status::KEY_NOT_FOUND) => Got::En,
            (opcode::NOOP, status::SUCCESS) => Got::Mn,
            (opcode::INCREMENT, status::SUCCESS) => Got::Number,
            (opcode::SET | opcode::DELETE | opcode::TOUCH, status::SUCCESS) => Got::Hd,
            (_, status::KEY_NOT_FOUND) => Got::NotFound,
            (_, status::NOT_STORED) => Got::NotStored,
            (_, status::KEY_EXISTS) => Got::Exists,
            _ => Got::Error,
        }
    }

    fn of_meta(r: &MetaReply<'_>) -> Got {
        match r {
            MetaReply::Value { .. } => Got::Value,
            MetaReply::Hd { .. } => Got::Hd,
            MetaReply::En => Got::En,
            MetaReply::Nf => Got::NotFound,
            MetaReply::Ns => Got::NotStored,
            MetaReply::Ex => Got::Exists,
            MetaReply::Mn => Got::Mn,
            MetaReply::Error | MetaReply::ClientError(_) | MetaReply::ServerError(_) => Got::Error,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    hits: u32,
    misses: u32,
    error: bool,
}

/// A one-shot relative timer (timerfd), so the open loop can sleep with microsecond
/// precision (epoll's own timeout is in milliseconds).
struct Timer {
    fd: OwnedFd,
}

impl Timer {
    fn new() -> Result<Timer, String> {
        // SAFETY: timerfd_create takes no pointers; a negative return is an error.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(format!(
                "timerfd_create: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        Ok(Timer {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn arm(&self, after: Duration) {
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: spec is a valid itimerspec; the old-value pointer may be null.
        unsafe {
            libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut());
        }
    }

    fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reading 8 bytes into an 8-byte buffer; EAGAIN is fine (non-blocking).
        unsafe {
            libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8);
        }
    }
}

struct Worker {
    /// Thread number; the probe's is `threads` of the main configuration (its progress slot).
    t: usize,
    cfg: RunConfig,
    shared: Arc<Shared>,
    poll: Poll,
    conns: Vec<Conn>,
    by_server: Vec<Vec<usize>>,
    rr: Vec<usize>,
    rng: Xoshiro256PlusPlus,
    chooser: KeyChooser,
    stats: Stats,
    keybuf: Vec<u8>,
    keyends: Vec<usize>,
    flagbuf: Vec<u8>,
    /// Connections with bytes waiting to be written.
    dirty: Vec<usize>,
    is_dirty: Vec<bool>,
    max_reply: usize,
    has_udp: bool,
    /// The servers, for reconnecting.
    addrs: Vec<Endpoint>,
    /// Some connection is dead (waiting to reconnect) or still connecting.
    unsettled: bool,
    /// The last time some connection was up.
    last_up: Instant,
    // Window, set when the main phase starts.
    run_start: Instant,
    measure_start: Instant,
    end: Instant,
    quota: Option<u64>,
    stopping: bool,
    // Load phase.
    load_next: u64,
    /// The load phase's step between this thread's keys.
    load_stride: u64,
    load_deadline: Option<Instant>,
    /// A bit per key the main phase sent a request for (empty when not tracked).
    touched: Vec<u64>,
}

impl Worker {
    fn connect(
        t: usize,
        cfg: &RunConfig,
        shared: Arc<Shared>,
        addrs: &[Endpoint],
    ) -> Result<Worker, String> {
        let poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
        let mut conns = Vec::new();
        let mut by_server = vec![Vec::new(); addrs.len()];
        for (s, addr) in addrs.iter().enumerate() {
            for _ in 0..cfg.conns {
                let mut sock = addr
                    .connect(cfg.connect_timeout)
                    .map_err(|e| format!("connect {addr}: {e}"))?;
                let idx = conns.len();
                poll.registry()
                    .register(
                        &mut sock,
                        Token(idx),
                        Interest::READABLE | Interest::WRITABLE,
                    )
                    .map_err(|e| format!("register: {e}"))?;
                by_server[s].push(idx);
                conns.push(Conn {
                    sock,
                    server: s,
                    wbuf: Vec::with_capacity(READ_CHUNK),
                    wpos: 0,
                    rbuf: vec![0; READ_CHUNK],
                    rpos: 0,
                    rlen: 0,
                    inflight: VecDeque::with_capacity(cfg.depth.min(4096)),
                    values: 0,
                    alive: true,
                    retry_at: None,
                    backoff: RECONNECT_MIN,
                    connecting_since: None,
                    udp: addr.is_udp().then(UdpState::new),
                });
            }
        }
        let mut chooser = shared.chooser.clone();
        chooser
            .set_sequence_start((cfg.workload.keys / cfg.threads as u64).saturating_mul(t as u64));
        // The load phase: thread t of T sets keys t, t + T, ...; with a share i of N of the
        // key space, keys i + N·t, i + N·(t + T), ...
        let (mut load_next, mut load_stride) = (t as u64, cfg.threads as u64);
        if let Some((i, parts)) = cfg.key_share() {
            chooser.set_partition(i, parts)?;
            load_next = i + parts * t as u64;
            load_stride = parts * cfg.threads as u64;
        }
        let probe = t >= cfg.threads;
        let keys = cfg.workload.keys;
        let touched = if !probe
            && keys <= TRACK_KEYS_MAX
            && keys.saturating_mul(cfg.threads as u64) <= TRACK_BITS_TOTAL
        {
            vec![0u64; keys.div_ceil(64) as usize]
        } else {
            Vec::new()
        };
        let n = conns.len();
        let now = Instant::now();
        Ok(Worker {
            t,
            cfg: cfg.clone(),
            poll,
            conns,
            rr: vec![0; by_server.len()],
            by_server,
            rng: Xoshiro256PlusPlus::seed_from_u64(dist::mix64(cfg.stream_seed() ^ (t as u64 + 1))),
            chooser,
            stats: Stats::default(),
            keybuf: Vec::with_capacity(256),
            keyends: Vec::new(),
            flagbuf: Vec::with_capacity(32),
            dirty: Vec::with_capacity(n),
            is_dirty: vec![false; n],
            max_reply: cfg.workload.value_size.max.max(2 << 20) + 4096,
            has_udp: addrs.iter().any(Endpoint::is_udp),
            addrs: addrs.to_vec(),
            unsettled: false,
            last_up: now,
            measure_start: now,
            run_start: now,
            end: now,
            quota: None,
            stopping: false,
            load_next,
            load_stride,
            load_deadline: None,
            touched,
            shared,
        })
    }

    fn inflight(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| c.alive)
            .map(|c| c.inflight.len())
            .sum()
    }

    // ----- composing ------------------------------------------------------------------------

    /// Write one request for `key` (and, for a multiget, more keys of the same server) on
    /// connection `c`.
    fn send(&mut self, c: usize, op: Op, key: u64, t0: Instant, measured: bool, load: bool) {
        let shared = Arc::clone(&self.shared);
        let w = &self.cfg.workload;
        if !load {
            mark(&mut self.touched, key);
        }
        let conn = &mut self.conns[c];
        self.keybuf.clear();
        shared.keyspace.write_key(key, &mut self.keybuf);
        let mut nkeys = 1u32;
        let wire = match self.cfg.protocol {
            Protocol::Text => Wire::Text,
            Protocol::Binary => Wire::Binary,
            // Meta has no touch or plain incr of its own here: those stay classic.
            Protocol::Meta if matches!(op, Op::Get | Op::Set | Op::Delete) => Wire::Meta,
            Protocol::Meta => Wire::Text,
        };
        // Binary expiration times are unsigned 32-bit; negative means "already expired".
        let bin_exptime = u32::try_from(w.exptime.max(0)).unwrap_or(u32::MAX);
        // UDP: this request's datagram starts with the frame header (request id, sequence 0,
        // one datagram, reserved).
        let dgram_start = conn.wbuf.len();
        let id = match &mut conn.udp {
            Some(u) => {
                let id = u.next_id;
                u.next_id = id.wrapping_add(1);
                conn.wbuf.extend_from_slice(&id.to_be_bytes());
                conn.wbuf.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
                id
            }
            None => 0,
        };
        let wb = &mut conn.wbuf;
        let kb = &self.keybuf;
        match op {
            Op::Get if w.multiget > 1 && !load => {
                self.keyends.clear();
                self.keyends.push(self.keybuf.len());
                let server = conn.server;
                let tries = 8 * self.by_server.len();
                for _ in 1..w.multiget {
                    // Keys of one multiget must live on one server.
                    let mut found = None;
                    for _ in 0..tries.max(1) {
                        let k = self.chooser.next(&mut self.rng);
                        if shared.server_of(k) == server {
                            found = Some(k);
                            break;
                        }
                    }
                    if let Some(k) = found {
                        mark(&mut self.touched, k);
                        self.keybuf.push(b' ');
                        shared.keyspace.write_key(k, &mut self.keybuf);
                        self.keyends.push(self.keybuf.len());
                        nkeys += 1;
                    }
                }
                let wb = &mut conn.wbuf;
                let keys = self.keyends.iter().scan(0usize, |start, &end| {
                    let k = &self.keybuf[*start..end];
                    *start = end + 1;
                    Some(k)
                });
                match wire {
                    // Quiet gets (misses say nothing), then a no-op that ends the batch.
                    Wire::Meta => {
                        for k in keys {
                            proto::meta_get(wb, k, b"v q");
                        }
                        proto::meta_noop(wb);
                    }
                    Wire::Binary => {
                        for k in keys {
                            proto::binary::get(wb, k, true, 0);
                        }
                        proto::binary::noop(wb, 0);
                    }
                    // The keys are already space-separated: one slice is the whole list.
                    Wire::Text => {
                        proto::multiget(wb, false, [&self.keybuf[..]]);
                    }
                }
            }
            Op::Get => match wire {
                Wire::Text => proto::get(wb, kb),
                Wire::Meta => proto::meta_get(wb, kb, b"v"),
                Wire::Binary => proto::binary::get(wb, kb, false, 0),
            },
            Op::Set => {
                let len = if load {
                    w.value_size.quantile(dist::unit_open0(&mut self.rng))
                } else {
                    w.value_size.sample(&mut self.rng)
                };
                let data = &shared.value[..len.min(shared.value.len())];
                match wire {
                    Wire::Text => proto::set(wb, kb, 0, w.exptime, data, false),
                    Wire::Meta => {
                        self.flagbuf.clear();
                        let _ = write!(self.flagbuf, "T{}", w.exptime);
                        proto::meta_set(wb, kb, data, &self.flagbuf);
                    }
                    Wire::Binary => proto::binary::set(wb, kb, 0, bin_exptime, data, 0),
                }
            }
            Op::Delete => match wire {
                Wire::Text => proto::delete(wb, kb, false),
                Wire::Meta => proto::meta_delete(wb, kb, b""),
                Wire::Binary => proto::binary::delete(wb, kb, 0),
            },
            Op::Touch => match wire {
                Wire::Binary => proto::binary::touch(wb, kb, bin_exptime, 0),
                _ => proto::touch(wb, kb, w.exptime, false),
            },
            Op::Incr => match wire {
                Wire::Binary => proto::binary::increment(wb, kb, 1, false, 0),
                _ => proto::arith(wb, true, kb, 1, false),
            },
        }
        if let Some(u) = &mut conn.udp {
            if conn.wbuf.len() - dgram_start > crate::transport::UDP_MAX_REQUEST {
                // Too big for one datagram: not sent (validation keeps values small enough).
                conn.wbuf.truncate(dgram_start);
                self.stats.skipped += 1;
                return;
            }
            u.ends.push_back(conn.wbuf.len());
        }
        conn.inflight.push_back(Pending {
            op,
            key,
            nkeys,
            t0,
            measured,
            load,
            wire,
            id,
        });
        if !self.is_dirty[c] {
            self.is_dirty[c] = true;
            self.dirty.push(c);
        }
    }

    /// Draw the next request: (kind, key).
    fn draw(&mut self) -> (Op, u64) {
        let op = self.cfg.workload.mix.pick(dist::unit(&mut self.rng));
        let key = self.chooser.next(&mut self.rng);
        (op, key)
    }

    /// Draw a request whose key lives on `server` (bounded search; counted if it fails).
    fn draw_for(&mut self, server: usize) -> (Op, u64) {
        let (op, mut key) = self.draw();
        if self.by_server.len() > 1 {
            let tries = 16 * self.by_server.len();
            let mut n = 0;
            while self.shared.server_of(key) != server && n < tries {
                key = self.chooser.next(&mut self.rng);
                n += 1;
            }
            if self.shared.server_of(key) != server {
                self.stats.misrouted += 1;
            }
        }
        (op, key)
    }

    fn in_window(&self, t: Instant) -> bool {
        t >= self.measure_start && t < self.end
    }

    fn quota_left(&self) -> bool {
        self.quota.is_none_or(|q| self.stats.issued < q)
    }

    // ----- I/O ------------------------------------------------------------------------------

    fn flush(&mut self) {
        while let Some(c) = self.dirty.pop() {
            self.is_dirty[c] = false;
            self.flush_conn(c);
        }
    }

    fn flush_conn(&mut self, c: usize) {
        let conn = &mut self.conns[c];
        if !conn.alive {
            return;
        }
        while conn.wpos < conn.wbuf.len() {
            // One datagram per write on UDP; as much as the socket takes on a stream.
            let end = match &conn.udp {
                Some(u) => u.ends.front().copied().unwrap_or(conn.wbuf.len()),
                None => conn.wbuf.len(),
            };
            match conn.sock.write(&conn.wbuf[conn.wpos..end]) {
                // A datagram goes whole or not at all.
                Ok(_) if conn.udp.is_some() => {
                    conn.wpos = end;
                    if let Some(u) = &mut conn.udp {
                        u.ends.pop_front();
                    }
                }
                Ok(0) => {
                    self.fail(c);
                    return;
                }
                Ok(n) => conn.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.fail(c);
                    return;
                }
            }
        }
        conn.wbuf.clear();
        conn.wpos = 0;
    }

    /// Close a connection that failed or misbehaved; its outstanding requests are lost. It is
    /// opened again after its backoff by [`Worker::reconnect_due`].
    fn fail(&mut self, c: usize) {
        let conn = &mut self.conns[c];
        if !conn.alive {
            return;
        }
        conn.alive = false;
        let _ = self.poll.registry().deregister(&mut conn.sock);
        conn.sock.shutdown();
        let now = Instant::now();
        conn.retry_at = Some(now + conn.backoff);
        conn.backoff = (conn.backoff * 2).min(RECONNECT_MAX);
        conn.connecting_since = None;
        self.unsettled = true;
        self.stats.conn_failures += 1;
        self.stats.lost += conn.inflight.len() as u64;
        self.shared.progress[self.t]
            .errors
            .fetch_add(conn.inflight.len() as u64 + 1, Ordering::Relaxed);
        conn.inflight.clear();
        conn.wbuf = Vec::new();
        conn.rbuf = Vec::new();
    }

    /// Read everything available on `c` and handle every complete reply.
    fn on_readable(&mut self, c: usize) {
        if self.conns[c].udp.is_some() {
            self.on_readable_udp(c);
            return;
        }
        loop {
            let conn = &mut self.conns[c];
            if !conn.alive {
                return;
            }
            if conn.rpos == conn.rlen {
                conn.rpos = 0;
                conn.rlen = 0;
            }
            if conn.rlen == conn.rbuf.len() {
                if conn.rpos > 0 {
                    conn.rbuf.copy_within(conn.rpos..conn.rlen, 0);
                    conn.rlen -= conn.rpos;
                    conn.rpos = 0;
                } else if conn.rbuf.len() < self.max_reply {
                    let new = (conn.rbuf.len() * 2).min(self.max_reply);
                    conn.rbuf.resize(new, 0);
                } else {
                    // parse_reply bounds values by max_reply, so this is unreachable with a
                    // sane server; a hostile one just loses its connection.
                    self.fail(c);
                    return;
                }
            }
            let rlen = conn.rlen;
            let space = conn.rbuf.len() - rlen;
            match conn.sock.read(&mut conn.rbuf[rlen..]) {
                Ok(0) => {
                    self.fail(c);
                    return;
                }
                Ok(n) => {
                    conn.rlen += n;
                    let now = Instant::now();
                    if !self.parse_replies(c, now) {
                        return;
                    }
                    // A short read emptied the socket; with edge-triggered readiness, bytes
                    // that arrive later raise a new event. Skipping the read that would
                    // return WouldBlock saves a system call per reply.
                    if n < space {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.fail(c);
                    return;
                }
            }
        }
    }

    /// Receive every waiting datagram on UDP connection `c`.
    fn on_readable_udp(&mut self, c: usize) {
        loop {
            let conn = &mut self.conns[c];
            if !conn.alive {
                return;
            }
            let Some(u) = conn.udp.as_mut() else {
                return;
            };
            let n = match conn.sock.read(&mut u.scratch) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // ECONNREFUSED and the like: nothing listens; the requests time out.
                Err(_) => return,
            };
            if n < crate::transport::UDP_HEADER {
                continue;
            }
            let id = u16::from_be_bytes([u.scratch[0], u.scratch[1]]);
            let seq = u16::from_be_bytes([u.scratch[2], u.scratch[3]]);
            let now = Instant::now();
            self.on_datagram(c, id, seq, n, now);
        }
    }

    /// One reply datagram of `n` bytes (header included) in the connection's scratch buffer.
    fn on_datagram(&mut self, c: usize, id: u16, seq: u16, n: usize, now: Instant) {
        // Requests before the one this datagram answers lost their replies.
        loop {
            let Some(front) = self.conns[c].inflight.front().copied() else {
                return; // a stale or unsolicited datagram
            };
            let ahead = id.wrapping_sub(front.id);
            if ahead == 0 {
                break;
            }
            if ahead >= 0x8000 {
                return; // a late datagram for a request already given up
            }
            self.drop_front(c, now);
        }
        let max_reply = self.max_reply;
        let conn = &mut self.conns[c];
        let Some(u) = conn.udp.as_mut() else {
            return;
        };
        let payload = n - crate::transport::UDP_HEADER;
        let in_order = match u.cur {
            Some((cur, last)) if cur == id => seq == 0 || seq == last.wrapping_add(1),
            _ => seq == 0,
        };
        let same = u.cur.map(|(cur, _)| cur) == Some(id);
        if !in_order || (same && conn.rlen + payload > max_reply) {
            self.drop_front(c, now);
            return;
        }
        if !same {
            conn.rpos = 0;
            conn.rlen = 0;
            conn.values = 0;
        }
        u.cur = Some((id, seq));
        if conn.rbuf.len() < conn.rlen + payload {
            conn.rbuf.resize(conn.rlen + payload, 0);
        }
        conn.rbuf[conn.rlen..conn.rlen + payload]
            .copy_from_slice(&u.scratch[crate::transport::UDP_HEADER..n]);
        conn.rlen += payload;
        if !self.parse_replies(c, now) {
            return;
        }
        // Once the request is answered, its leftover bytes (there should be none) go.
        let conn = &mut self.conns[c];
        if conn.inflight.front().map(|p| p.id) != Some(id) {
            conn.rpos = 0;
            conn.rlen = 0;
            if let Some(u) = conn.udp.as_mut() {
                u.cur = None;
            }
        }
    }

    /// Give up on the request at the front of UDP connection `c` (its reply was lost): count
    /// it and, in the closed loop, free its slot.
    fn drop_front(&mut self, c: usize, now: Instant) {
        let conn = &mut self.conns[c];
        let Some(p) = conn.inflight.pop_front() else {
            return;
        };
        conn.rpos = 0;
        conn.rlen = 0;
        conn.values = 0;
        if let Some(u) = conn.udp.as_mut() {
            u.cur = None;
        }
        self.stats.dropped += 1;
        self.shared.progress[self.t]
            .errors
            .fetch_add(1, Ordering::Relaxed);
        if p.load {
            // The load phase sets every key: send a lost one again (the load phase's deadline
            // bounds the retries). Once the load phase is over, a late load request is only
            // forgotten; it held no slot of the main loop.
            if self.load_deadline.is_some() {
                self.stats.load_retries += 1;
                self.send(c, Op::Set, p.key, now, false, true);
            }
        } else if self.cfg.load == LoadModel::Closed {
            self.refill_closed(c, now);
        }
    }

    /// UDP: give up on requests at the front of a connection that waited longer than
    /// `udp_timeout` (the reply of the last request sent can be lost with nothing after it).
    fn sweep_udp(&mut self, now: Instant) {
        let timeout = self.cfg.udp_timeout;
        for c in 0..self.conns.len() {
            while self.conns[c].alive
                && self.conns[c].udp.is_some()
                && self.conns[c]
                    .inflight
                    .front()
                    .is_some_and(|p| now.saturating_duration_since(p.t0) > timeout)
            {
                self.drop_front(c, now);
            }
        }
    }

    /// A reply that does not parse or does not fit its request. On a stream the connection
    /// cannot be trusted any more and is closed; on UDP it is a damaged or partly lost reply,
    /// so only its request is given up. Either way, the caller stops parsing this buffer.
    fn bad_reply(&mut self, c: usize, now: Instant) {
        if self.conns[c].udp.is_some() {
            self.drop_front(c, now);
        } else {
            self.fail(c);
        }
    }

    /// Handle the complete replies in `c`'s buffer. False if the connection was closed (or,
    /// on UDP, the reply was given up).
    fn parse_replies(&mut self, c: usize, now: Instant) -> bool {
        loop {
            let conn = &mut self.conns[c];
            let pending = &conn.rbuf[conn.rpos..conn.rlen];
            let parsed = match conn.inflight.front().map(|p| p.wire) {
                Some(Wire::Meta) => match proto::parse_meta_reply(pending, self.max_reply) {
                    ParseMetaReply::Reply(r, n) => Some((Got::of_meta(&r), n)),
                    ParseMetaReply::Incomplete => return true,
                    ParseMetaReply::Invalid(_) => None,
                },
                Some(Wire::Binary) => match binary::parse_response(pending, self.max_reply) {
                    binary::ParseResponse::Response(r, n) => Some((Got::of_binary(&r), n)),
                    binary::ParseResponse::Incomplete => return true,
                    binary::ParseResponse::Invalid(_) => None,
                },
                _ => match proto::parse_reply(pending, self.max_reply) {
                    ParseReply::Reply(r, n) => Some((Got::of(&r), n)),
                    ParseReply::Incomplete => return true,
                    ParseReply::Invalid(_) => None,
                },
            };
            let Some((got, n)) = parsed else {
                self.bad_reply(c, now);
                return false;
            };
            conn.rpos += n;
            let Some(front) = conn.inflight.front().copied() else {
                // A reply to nothing.
                self.bad_reply(c, now);
                return false;
            };
            let outcome = match (front.op, got) {
                // A single meta or binary get: a value is the hit, EN / not found the miss.
                (Op::Get, Got::Value) if front.wire != Wire::Text && front.nkeys == 1 => hit(),
                (Op::Get, Got::En) if front.wire != Wire::Text && front.nkeys == 1 => miss(),
                (Op::Get, Got::Value) => {
                    conn.values += 1;
                    if conn.values > front.nkeys {
                        self.bad_reply(c, now);
                        return false;
                    }
                    continue;
                }
                (Op::Get, Got::End) | (Op::Get, Got::Mn) => {
                    if (got == Got::Mn) != (front.wire != Wire::Text && front.nkeys > 1) {
                        self.bad_reply(c, now);
                        return false;
                    }
                    let hits = conn.values;
                    conn.values = 0;
                    Outcome {
                        hits,
                        misses: front.nkeys - hits,
                        error: false,
                    }
                }
                (_, Got::Error) => {
                    conn.values = 0;
                    Outcome {
                        hits: 0,
                        misses: 0,
                        error: true,
                    }
                }
                (Op::Set, Got::Stored) => hit(),
                (Op::Set | Op::Delete, Got::Hd) if front.wire != Wire::Text => hit(),
                (Op::Touch, Got::Hd) if front.wire == Wire::Binary => hit(),
                (Op::Set, Got::NotStored | Got::Exists) => miss(),
                (Op::Delete, Got::Deleted) => hit(),
                (Op::Touch, Got::Touched) => hit(),
                (Op::Incr, Got::Number) => hit(),
                (Op::Delete | Op::Touch | Op::Incr, Got::NotFound) => miss(),
                _ => {
                    self.bad_reply(c, now);
                    return false;
                }
            };
            conn.inflight.pop_front();
            self.complete(c, front, outcome, now);
        }
    }

    fn complete(&mut self, c: usize, p: Pending, o: Outcome, now: Instant) {
        // A reply: the connection works, so its next failure starts the backoff afresh.
        self.conns[c].backoff = RECONNECT_MIN;
        self.shared.progress[self.t]
            .completed
            .fetch_add(1, Ordering::Relaxed);
        if o.error {
            self.shared.progress[self.t]
                .errors
                .fetch_add(1, Ordering::Relaxed);
        }
        if p.load {
            self.stats.loaded += 1;
            if self.load_deadline.is_some() && self.load_next < self.cfg.workload.keys {
                self.send_load(c, now);
            }
            return;
        }
        if self.stats.interval_ns > 0 {
            let i = (now.saturating_duration_since(self.run_start).as_nanos()
                / u128::from(self.stats.interval_ns)) as usize;
            if i < crate::stats::MAX_INTERVALS {
                while self.stats.intervals.len() <= i {
                    self.stats
                        .intervals
                        .push(crate::stats::new_interval_histogram());
                }
                let us = now.saturating_duration_since(p.t0).as_micros() as u64;
                self.stats.intervals[i].saturating_record(us.max(1));
            }
        }
        let st = &mut self.stats.ops[p.op.index()];
        st.total += 1;
        st.total_keys += u64::from(p.nkeys);
        st.total_hits += u64::from(o.hits);
        if p.measured {
            let ns = now.saturating_duration_since(p.t0).as_nanos() as u64;
            st.hist.saturating_record(ns.max(1));
            st.count += 1;
            st.hits += u64::from(o.hits);
            st.misses += u64::from(o.misses);
            st.errors += u64::from(o.error);
            if ns > self.cfg.slo.as_nanos() as u64 {
                st.late += 1;
            }
        }
        // Look-aside: fill the cache after a single-key get misses.
        let refill = self.cfg.look_aside && p.op == Op::Get && p.nkeys == 1 && o.misses == 1;
        match self.cfg.load {
            LoadModel::Closed => {
                if refill && !self.stopping {
                    let m = self.in_window(now);
                    self.send(c, Op::Set, p.key, now, m, false);
                } else {
                    self.refill_closed(c, now);
                }
            }
            LoadModel::Open { .. } => {
                if refill && !self.stopping {
                    let m = self.in_window(now);
                    self.send(c, Op::Set, p.key, now, m, false);
                }
            }
        }
    }

    /// Closed loop: one completion frees one slot on `c`.
    fn refill_closed(&mut self, c: usize, now: Instant) {
        if self.stopping || now >= self.end || !self.quota_left() {
            return;
        }
        let measured = self.in_window(now);
        let (op, key) = self.draw_for(self.conns[c].server);
        if measured {
            self.stats.issued += 1;
        }
        self.send(c, op, key, now, measured, false);
    }

    // ----- phases ---------------------------------------------------------------------------

    fn send_load(&mut self, c: usize, _now: Instant) {
        // This thread's keys are t, t + threads, t + 2·threads, ...; each goes to its server's
        // connection, so the load phase walks its keys and sends each where it belongs.
        let key = self.load_next;
        self.load_next += self.load_stride;
        let s = self.shared.server_of(key);
        let target = if self.conns[c].server == s && self.conns[c].usable() {
            c
        } else {
            match self.pick_conn(s, usize::MAX) {
                Some(x) => x,
                None => return,
            }
        };
        self.send(target, Op::Set, key, Instant::now(), false, true);
    }

    /// Set every key of this thread's share once (closed loop, 32 outstanding per stream
    /// connection, [`UDP_LOAD_WINDOW`] per UDP socket). A UDP set whose reply is lost is sent
    /// again. Bounded by `load_timeout`, and by [`LOAD_STALL`] without any reply.
    fn load_phase(&mut self) {
        let deadline = Instant::now() + self.cfg.load_timeout;
        self.load_deadline = Some(deadline);
        let now = Instant::now();
        for c in 0..self.conns.len() {
            self.prime(c, now);
        }
        self.flush();
        let mut events = Events::with_capacity(1024);
        let stall = LOAD_STALL.max(self.cfg.udp_timeout * 5);
        let mut last_loaded = (self.stats.loaded, Instant::now());
        loop {
            let now = Instant::now();
            self.reconnect_due(now);
            // Done when nothing is outstanding, unless keys remain and a connection that
            // failed is about to come back for them.
            let waiting = self.unsettled && self.load_next < self.cfg.workload.keys;
            if now >= deadline || (self.inflight() == 0 && !waiting) {
                break;
            }
            if self.stats.loaded != last_loaded.0 {
                last_loaded = (self.stats.loaded, now);
            } else if now.saturating_duration_since(last_loaded.1) >= stall {
                break;
            }
            let timeout =
                self.reconnect_wait(now, (deadline - now).min(Duration::from_millis(100)));
            if self.poll.poll(&mut events, Some(timeout)).is_err() {
                // EINTR (a debugger attaching, a signal) is not a reason to stop loading.
                continue;
            }
            self.handle_events(&events);
            if self.has_udp {
                // A lost reply to the last sets sent has no later reply to reveal it.
                self.sweep_udp(Instant::now());
            }
            self.flush();
        }
        // Anything still outstanding is abandoned with its connection state intact: the
        // replies will be read (and ignored as load replies) in the main phase.
        self.load_deadline = None;
    }

    fn handle_events(&mut self, events: &Events) {
        for ev in events.iter() {
            let tok = ev.token();
            if tok == TIMER {
                continue;
            }
            let c = tok.0;
            if c >= self.conns.len() {
                continue;
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                self.on_readable(c);
            }
            if ev.is_writable() && self.conns[c].alive && self.conns[c].connecting_since.is_some() {
                // A reconnection that completed: now it gets its work.
                self.conns[c].connecting_since = None;
                self.stats.reconnects += 1;
                self.prime(c, Instant::now());
            }
            if ev.is_writable() && !self.is_dirty[c] {
                self.is_dirty[c] = true;
                self.dirty.push(c);
            }
        }
    }

    /// Reopen the dead connections whose backoff has passed (non-blocking), and fail those
    /// whose reconnection has taken longer than the connect timeout. A reopened connection
    /// gets its share of work once it is established: its load-phase window, or its
    /// closed-loop depth.
    fn reconnect_due(&mut self, now: Instant) {
        if !self.unsettled {
            return;
        }
        let mut unsettled = false;
        for c in 0..self.conns.len() {
            let conn = &self.conns[c];
            if conn.alive {
                if conn
                    .connecting_since
                    .is_some_and(|t| now.saturating_duration_since(t) > self.cfg.connect_timeout)
                {
                    self.fail(c);
                }
                unsettled |= self.conns[c].connecting_since.is_some() || !self.conns[c].alive;
                continue;
            }
            if conn.retry_at.is_none_or(|t| t > now) {
                unsettled = true;
                continue;
            }
            let server = conn.server;
            let opened = self.addrs[server]
                .connect_nonblocking()
                .and_then(|mut sock| {
                    self.poll
                        .registry()
                        .register(&mut sock, Token(c), Interest::READABLE | Interest::WRITABLE)
                        .map(|()| sock)
                });
            let conn = &mut self.conns[c];
            match opened {
                Ok(sock) => {
                    conn.sock = sock;
                    conn.alive = true;
                    conn.retry_at = None;
                    conn.connecting_since = (!conn.sock.is_udp()).then_some(now);
                    conn.wbuf = Vec::with_capacity(READ_CHUNK);
                    conn.wpos = 0;
                    conn.rbuf = vec![0; READ_CHUNK];
                    conn.rpos = 0;
                    conn.rlen = 0;
                    conn.values = 0;
                    if conn.udp.is_some() {
                        conn.udp = Some(UdpState::new());
                    }
                    if conn.connecting_since.is_some() {
                        // Work waits for the connection (see `handle_events`).
                        unsettled = true;
                    } else {
                        self.stats.reconnects += 1;
                        self.prime(c, now);
                    }
                }
                Err(_) => {
                    conn.retry_at = Some(now + conn.backoff);
                    conn.backoff = (conn.backoff * 2).min(RECONNECT_MAX);
                    unsettled = true;
                    self.stats.conn_failures += 1;
                    self.shared.progress[self.t]
                        .errors
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.unsettled = unsettled;
        self.flush();
    }

    /// Give a freshly reopened connection its work: the load phase's window, or the closed
    /// loop's `depth` requests (the open loop picks connections as requests fall due).
    fn prime(&mut self, c: usize, now: Instant) {
        if self.load_deadline.is_some() {
            for _ in 0..self.load_window(c) {
                if self.load_next >= self.cfg.workload.keys {
                    break;
                }
                self.send_load(c, now);
            }
        } else if self.cfg.load == LoadModel::Closed {
            for _ in 0..self.cfg.depth {
                self.refill_closed(c, now);
            }
        }
    }

    fn load_window(&self, c: usize) -> usize {
        if self.conns[c].udp.is_some() {
            UDP_LOAD_WINDOW
        } else {
            32
        }
    }

    /// Whether every connection has been down for [`GIVE_UP`] (a run limited only by a
    /// request count would otherwise keep reconnecting to a dead server for its hour).
    fn all_down_too_long(&mut self, now: Instant) -> bool {
        if self.conns.iter().any(|c| c.alive) {
            self.last_up = now;
            false
        } else {
            now.saturating_duration_since(self.last_up) >= GIVE_UP
        }
    }

    /// Whether no connection to `server` is up (its requests cannot be sent at all).
    fn server_down(&self, server: usize) -> bool {
        !self.by_server[server]
            .iter()
            .any(|&i| self.conns[i].usable())
    }

    /// How long an event loop may sleep before the next reconnection attempt is due.
    fn reconnect_wait(&self, now: Instant, max: Duration) -> Duration {
        if !self.unsettled {
            return max;
        }
        self.conns
            .iter()
            .filter_map(|c| c.retry_at)
            .map(|t| t.saturating_duration_since(now))
            .fold(max, Duration::min)
    }

    /// A live connection to `server` with fewer than `cap` outstanding, round robin.
    fn pick_conn(&mut self, server: usize, cap: usize) -> Option<usize> {
        let list = &self.by_server[server];
        let n = list.len();
        for i in 0..n {
            let idx = list[(self.rr[server] + i) % n];
            let conn = &self.conns[idx];
            if conn.usable() && conn.inflight.len() < cap {
                self.rr[server] = (self.rr[server] + i + 1) % n;
                return Some(idx);
            }
        }
        None
    }

    fn main_phase(&mut self) {
        let start = self
            .shared
            .start
            .get()
            .copied()
            .unwrap_or_else(Instant::now);
        self.measure_start = start + self.cfg.warmup;
        self.run_start = start;
        // Timeline intervals: 1 s, or longer so that a long run keeps at most MAX_INTERVALS.
        let span = self.cfg.warmup + self.cfg.duration + self.cfg.drain;
        let secs = span.as_secs_f64() / crate::stats::MAX_INTERVALS as f64;
        self.stats.interval_ns = (secs.ceil().max(1.0) * 1e9) as u64;
        self.end = if self.cfg.duration.is_zero() {
            // A request count with no duration: bound the run at an hour all the same.
            self.measure_start + Duration::from_secs(3600)
        } else {
            self.measure_start + self.cfg.duration
        };
        self.quota = self.cfg.requests.map(|n| {
            let per = n / self.cfg.threads as u64;
            per + u64::from((self.t as u64) < n % self.cfg.threads as u64)
        });
        // Sleep until just before the start, then spin: a long spin by every worker would
        // starve other threads of the machine (an agent's thread reading its GO, say).
        let before = start
            .saturating_duration_since(Instant::now())
            .saturating_sub(Duration::from_millis(1));
        if !before.is_zero() {
            std::thread::sleep(before);
        }
        while Instant::now() < start {
            std::hint::spin_loop();
        }
        match self.cfg.load {
            LoadModel::Closed => self.closed_loop(),
            LoadModel::Open { rate, arrival } => self.open_loop(rate, arrival),
        }
    }

    fn closed_loop(&mut self) {
        let now = Instant::now();
        for c in 0..self.conns.len() {
            for _ in 0..self.cfg.depth {
                self.refill_closed(c, now);
            }
        }
        self.flush();
        let mut events = Events::with_capacity(1024);
        let mut stopped_at = None;
        loop {
            let now = Instant::now();
            if !self.stopping && (now >= self.end || !self.quota_left()) {
                self.stopping = true;
                stopped_at = Some(now);
            }
            if self.stopping && self.inflight() == 0 {
                break;
            }
            if !self.stopping {
                self.reconnect_due(now);
            }
            if self.all_down_too_long(now) {
                break;
            }
            let limit = if self.stopping {
                stopped_at.unwrap_or(now) + self.cfg.drain
            } else {
                self.end
            };
            if now >= limit {
                break;
            }
            let timeout = self.reconnect_wait(now, (limit - now).min(Duration::from_millis(100)));
            if self.poll.poll(&mut events, Some(timeout)).is_err() {
                break;
            }
            self.handle_events(&events);
            if self.has_udp {
                self.sweep_udp(Instant::now());
            }
            self.flush();
        }
        let stop = stopped_at.unwrap_or_else(Instant::now);
        self.stats.window_ns = stop
            .saturating_duration_since(self.measure_start)
            .as_nanos() as u64;
        self.stats.timeouts += self.inflight() as u64;
    }

    fn open_loop(&mut self, rate: f64, arrival: Arrival) {
        let timer = match Timer::new() {
            Ok(t) => t,
            Err(_) => {
                self.stats.conn_failures += 1;
                return;
            }
        };
        if self
            .poll
            .registry()
            .register(
                &mut mio::unix::SourceFd(&timer.fd.as_raw_fd()),
                TIMER,
                Interest::READABLE,
            )
            .is_err()
        {
            return;
        }
        // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer; it only affects this thread.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
        }
        let start = self
            .shared
            .start
            .get()
            .copied()
            .unwrap_or_else(Instant::now);
        let gaps: Dist = arrival.gaps(rate / self.cfg.threads as f64);
        // Threads start at random phases so that fixed arrivals do not all coincide.
        let mut next_ns: f64 = gaps.sample(&mut self.rng) * dist::unit(&mut self.rng);
        let cap = self.cfg.depth;
        let late_ns = late_send_ns(self.cfg.slo);
        let mut events = Events::with_capacity(1024);
        let mut stopped_at: Option<Instant> = None;
        loop {
            let now = Instant::now();
            // Send everything that is due.
            if stopped_at.is_none() {
                loop {
                    let intended = start + Duration::from_nanos(next_ns as u64);
                    if intended >= self.end || !self.quota_left() {
                        self.stopping = true;
                        stopped_at = Some(now);
                        break;
                    }
                    if intended > now {
                        break;
                    }
                    next_ns += gaps.sample(&mut self.rng);
                    let measured = self.in_window(intended);
                    let (op, key) = self.draw();
                    let server = self.shared.server_of(key);
                    if measured {
                        self.stats.issued += 1;
                        let lag = now.saturating_duration_since(intended).as_nanos() as u64;
                        self.stats.send_lag.saturating_record(lag.max(1));
                        if lag > late_ns {
                            self.stats.late_sends += 1;
                        }
                    }
                    match self.pick_conn(server, cap) {
                        Some(c) => self.send(c, op, key, intended, measured, false),
                        None if self.server_down(server) => self.stats.unsent += 1,
                        None => self.stats.skipped += 1,
                    }
                }
            }
            self.flush();
            if stopped_at.is_none() {
                self.reconnect_due(now);
            }
            if self.all_down_too_long(now) {
                break;
            }
            let timeout = match stopped_at {
                Some(s) => {
                    if self.inflight() == 0 {
                        break;
                    }
                    let limit = s + self.cfg.drain;
                    if now >= limit {
                        break;
                    }
                    (limit - now).min(Duration::from_millis(100))
                }
                None => {
                    let intended = start + Duration::from_nanos(next_ns as u64);
                    let wait = intended.saturating_duration_since(Instant::now());
                    if wait < Duration::from_micros(20) {
                        Duration::ZERO
                    } else {
                        timer.arm(wait);
                        self.reconnect_wait(now, Duration::from_millis(100))
                    }
                }
            };
            if self.poll.poll(&mut events, Some(timeout)).is_err() {
                break;
            }
            for ev in events.iter() {
                if ev.token() == TIMER {
                    timer.clear();
                }
            }
            self.handle_events(&events);
            if self.has_udp {
                self.sweep_udp(Instant::now());
            }
        }
        self.stats.timeouts += self.inflight() as u64;
        let _ = self
            .poll
            .registry()
            .deregister(&mut mio::unix::SourceFd(&timer.fd.as_raw_fd()));
    }
}

/// Set key `k`'s bit (no-op when keys are not tracked).
fn mark(touched: &mut [u64], k: u64) {
    if let Some(w) = touched.get_mut((k / 64) as usize) {
        *w |= 1 << (k % 64);
    }
}

fn hit() -> Outcome {
    Outcome {
        hits: 1,
        misses: 0,
        error: false,
    }
}

fn miss() -> Outcome {
    Outcome {
        hits: 0,
        misses: 1,
        error: false,
    }
}
