//! Replication, server side: serving pulls (`replpull`) from the engine's log, and the
//! replica's puller thread that follows a master (`--replica-of`, `replicaof`).
//!
//! The log format, cursors and batches are the storage engine's (`kvstore::LogEngine`,
//! `repl_serve`/`repl_apply`); this module moves them over an ordinary client connection:
//!
//! ```text
//! replica → master   replpull <replid> <bytes>\r\n<cursor>\r\n
//! master → replica   REPL <replid> <bytes>\r\n<batch>\r\n
//! ```
//!
//! `replid` names the master's log (random at each start). A replica that sends another
//! one (or `-`) gets a full sync. A replica is read-only; `replicaof no one` promotes it.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use kvstore::{LogEngine, ReplicaState};

use crate::conn::{Ctx, Session, Step};
use crate::server::Shared;

/// Record bytes a master puts in one batch at most (plus one record): large enough that a
/// replica keeps up with tens of MB/s of writes in a few round trips per second.
const BATCH_BUDGET: usize = 4 << 20;
/// A replica that has not pulled for this long is no longer counted as connected.
const REPLICA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a replica waits for a master's reply before it reconnects.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest batch a replica accepts (a batch holds at most one record over the budget).
const MAX_BATCH: usize = 1 << 31;

/// The error line a replica sends for writes.
pub const READ_ONLY: &[u8] = b"SERVER_ERROR replica is read-only\r\n";
/// The error line for reads on a replica that is not in sync, with
/// `--replica-serve-stale no`.
pub const NOT_IN_SYNC: &[u8] = b"SERVER_ERROR replica is not in sync with its master\r\n";
/// The error line for writes while fewer replicas than `--min-replicas` are in sync.
pub const NOT_ENOUGH_REPLICAS: &[u8] = b"SERVER_ERROR not enough good replicas\r\n";

/// What a master knows of one replica (from its pulls).
#[derive(Debug, Clone)]
struct Follower {
    lag_bytes: u64,
    /// How old the replica's view is: now minus when the master's log was where the
    /// replica now is (from `history`), as of the last pull.
    lag: Duration,
    last_pull: Instant,
    pulls: u64,
    snapshot: bool,
    /// (when, master log offset), at most one sample per `SAMPLE_EVERY`, for `lag`.
    history: VecDeque<(Instant, u64)>,
}

/// Spacing of the offset samples kept per replica for its lag in seconds.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Offset samples kept per replica (about a minute at `SAMPLE_EVERY`).
const SAMPLES: usize = 12_000;

impl Follower {
    /// Record a pull: the master's offset now, and the replica's (the master's minus what
    /// it has not received).
    fn pulled(&mut self, now: Instant, master_offset: u64, lag_bytes: u64) {
        if self
            .history
            .back()
            .is_none_or(|&(t, _)| now.duration_since(t) >= SAMPLE_EVERY)
        {
            if self.history.len() >= SAMPLES {
                self.history.pop_front();
            }
            self.history.push_back((now, master_offset));
        }
        let acked = master_offset.saturating_sub(lag_bytes);
        // The oldest byte the replica lacks was written after the last sample at or below
        // its offset, i.e. no earlier than the first sample above it.
        self.lag = if lag_bytes == 0 {
            Duration::ZERO
        } else {
            self.history
                .iter()
                .find(|&&(_, off)| off > acked)
                .map_or(Duration::ZERO, |&(t, _)| now.duration_since(t))
        };
        while self
            .history
            .front()
            .is_some_and(|&(_, off)| off <= acked && self.history.len() > 1)
        {
            self.history.pop_front();
        }
    }
}

/// Replication state shared by the workers and the puller thread.
pub struct Replication {
    /// This server's log id (what its replicas follow).
    pub replid: String,
    replica: AtomicBool,
    /// Bumped whenever the master changes; a puller of an older generation stops.
    generation: AtomicU64,
    /// Held while a batch is applied and while the generation changes, so that once
    /// `promote` or `follow` returns no batch of the previous master is applied any more
    /// (a pull in flight when the link heals is dropped).
    /// Also holds the replica's position, which outlives a puller: after `replicaof` to
    /// another server, the new puller continues from it (a switch, when the new master
    /// followed the same upstream).
    state: Mutex<ReplicaState>,
    master: Mutex<Option<String>>,
    master_replid: Mutex<String>,
    link_up: AtomicBool,
    /// The replica follows the tail (not in a full sync) over a live link.
    in_sync: AtomicBool,
    full_syncs: AtomicU64,
    partial_syncs: AtomicU64,
    applied_bytes: AtomicU64,
    master_offset: AtomicU64,
    /// Milliseconds since start of the last batch applied.
    last_io_ms: AtomicU64,
    started: Instant,
    followers: Mutex<BTreeMap<String, Follower>>,
    /// `--min-replicas` is set and fewer replicas are in sync: writes are refused.
    too_few_replicas: AtomicBool,
    /// The server, for starting a puller from a worker (`replicaof`).
    pub server: OnceLock<Weak<Shared>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Default for Replication {
    fn default() -> Self {
        Replication::new()
    }
}

impl Replication {
    pub fn new() -> Replication {
        Replication {
            replid: new_replid(),
            replica: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            state: Mutex::new(ReplicaState::new()),
            master: Mutex::new(None),
            master_replid: Mutex::new("-".into()),
            link_up: AtomicBool::new(false),
            in_sync: AtomicBool::new(false),
            full_syncs: AtomicU64::new(0),
            partial_syncs: AtomicU64::new(0),
            applied_bytes: AtomicU64::new(0),
            master_offset: AtomicU64::new(0),
            last_io_ms: AtomicU64::new(0),
            started: Instant::now(),
            followers: Mutex::new(BTreeMap::new()),
            too_few_replicas: AtomicBool::new(false),
            server: OnceLock::new(),
        }
    }

    /// Writes are refused (this server follows a master).
    pub fn read_only(&self) -> bool {
        self.replica.load(Ordering::Acquire)
    }

    /// Why a write must be refused now, as memcached-style error line, if it must: this
    /// server is a replica, or `--min-replicas` is not met.
    pub fn write_refusal(&self) -> Option<&'static [u8]> {
        if self.replica.load(Ordering::Acquire) {
            Some(READ_ONLY)
        } else if self.too_few_replicas.load(Ordering::Relaxed) {
            Some(NOT_ENOUGH_REPLICAS)
        } else {
            None
        }
    }

    /// Why a read must be refused now, if it must: a replica with
    /// `--replica-serve-stale no` whose link is down or that is in a full sync.
    pub fn read_refusal(&self, config: &crate::config::Config) -> Option<&'static [u8]> {
        (!config.replica_serve_stale
            && self.replica.load(Ordering::Acquire)
            && !self.in_sync.load(Ordering::Acquire))
        .then_some(NOT_IN_SYNC)
    }

    /// Recount the replicas in sync for `--min-replicas` (on every pull and every
    /// maintenance tick, so that a replica that stops pulling counts out in time).
    pub fn check_min_replicas(&self, config: &crate::config::Config) {
        if config.min_replicas == 0 {
            return;
        }
        let good = lock(&self.followers)
            .values()
            .filter(|f| {
                !f.snapshot
                    && f.last_pull.elapsed() <= config.min_replicas_max_lag
                    && f.lag <= config.min_replicas_max_lag
            })
            .count();
        self.too_few_replicas
            .store(good < config.min_replicas, Ordering::Relaxed);
    }

    /// `stats replication`.
    pub fn stats(&self, shared: &Shared) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = Vec::new();
        let mut put = |k: &str, val: String| v.push((k.to_string(), val));
        let replica = self.read_only();
        put("role", if replica { "replica" } else { "master" }.into());
        put("replid", self.replid.clone());
        let offset = shared.engine.log_engine().map_or(0, LogEngine::log_offset);
        put("master_offset", offset.to_string());
        if replica {
            put(
                "master_host",
                lock(&self.master).clone().unwrap_or_default(),
            );
            put("master_replid", lock(&self.master_replid).clone());
            let up = self.link_up.load(Ordering::Relaxed);
            put("master_link_status", if up { "up" } else { "down" }.into());
            let now_ms = self.started.elapsed().as_millis() as u64;
            let last = self.last_io_ms.load(Ordering::Relaxed);
            put(
                "master_last_io_seconds_ago",
                (now_ms.saturating_sub(last) / 1000).to_string(),
            );
            put(
                "master_repl_offset",
                self.master_offset.load(Ordering::Relaxed).to_string(),
            );
            put(
                "replica_applied_bytes",
                self.applied_bytes.load(Ordering::Relaxed).to_string(),
            );
        }
        put(
            "full_syncs",
            self.full_syncs.load(Ordering::Relaxed).to_string(),
        );
        put(
            "partial_syncs",
            self.partial_syncs.load(Ordering::Relaxed).to_string(),
        );
        let followers = lock(&self.followers);
        let live: Vec<(&String, &Follower)> = followers
            .iter()
            .filter(|(_, f)| f.last_pull.elapsed() < REPLICA_TIMEOUT)
            .collect();
        v.push(("connected_replicas".into(), live.len().to_string()));
        for (i, (addr, f)) in live.iter().enumerate() {
            v.push((format!("replica{i}_id"), (*addr).clone()));
            let state = if f.snapshot { "sync" } else { "online" };
            v.push((format!("replica{i}_state"), state.into()));
            v.push((format!("replica{i}_lag_bytes"), f.lag_bytes.to_string()));
            let lag_s = f.lag.as_secs_f64();
            v.push((format!("replica{i}_lag_seconds"), format!("{lag_s:.3}")));
            v.push((format!("replica{i}_pulls"), f.pulls.to_string()));
        }
        v
    }
}

/// 40 hex digits from the OS's randomness (the clock and pid if it is unavailable).
fn new_replid() -> String {
    let mut b = [0u8; 20];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if ok.is_err() {
        let seed = Instant::now().elapsed().as_nanos() as u64
            ^ u64::from(std::process::id()).rotate_left(32)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (seed.rotate_left(i as u32 * 7) >> 8) as u8 ^ i as u8;
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Serve a `replpull` on a client connection.
pub fn serve(
    ctx: &mut Ctx<'_>,
    s: &mut Session,
    replid: &[u8],
    name: &[u8],
    cursor: &[u8],
) -> Step {
    let shared = ctx.shared;
    if shared.engine.log_engine().is_none() {
        s.out
            .extend_from_slice(b"SERVER_ERROR replication needs the log engine\r\n");
        return Step::Next;
    }
    // The batch goes straight into the output after a header whose length field is
    // patched once the batch is written (fixed width: the replica parses leading zeros).
    s.out.extend_from_slice(b"REPL ");
    s.out.extend_from_slice(shared.repl.replid.as_bytes());
    s.out.extend_from_slice(b" ");
    let len_at = s.out.len();
    s.out.extend_from_slice(b"0000000000\r\n");
    let start = s.out.len();
    serve_batch(shared, replid, name, cursor, &mut s.out);
    let len = s.out.len() - start;
    if let Some(field) = s.out.get_mut(len_at..len_at + 10) {
        field.copy_from_slice(format!("{len:010}").as_bytes());
    }
    s.out.extend_from_slice(b"\r\n");
    Step::Next
}

/// Serve a binary-protocol pull ([`kvproto::binary::opcode::REPL_PULL`], for masters with
/// `-S`): key `<replid> <name>`, value the cursor; the reply's key is this server's replid
/// and its value the batch.
pub fn serve_binary(ctx: &mut Ctx<'_>, out: &mut Vec<u8>, req: &kvproto::binary::Request<'_>) {
    use kvproto::binary as bin;
    let shared = ctx.shared;
    if shared.engine.log_engine().is_none() {
        bin::write_error_message(
            out,
            req.opcode,
            req.opaque,
            bin::Status::UnknownCommand,
            "replication needs the log engine",
        );
        return;
    }
    let mut parts = req.key.splitn(2, |&b| b == b' ');
    let replid = parts.next().unwrap_or_default();
    let name = parts.next().unwrap_or(b"-");
    // As in the text reply, the batch goes straight into the output; the header's body
    // length is patched once it is written.
    let key = shared.repl.replid.as_bytes();
    let at = out.len();
    bin::write_header(
        out,
        req.opcode,
        bin::Status::Success,
        req.opaque,
        0,
        0,
        key.len() as u16,
        0,
    );
    out.extend_from_slice(key);
    serve_batch(shared, replid, name, req.value, out);
    let body = (out.len() - at - bin::HEADER_LEN) as u32;
    if let Some(field) = out.get_mut(at + 8..at + 12) {
        field.copy_from_slice(&body.to_be_bytes());
    }
}

/// Append the batch for one pull to `out` and record the replica's progress.
fn serve_batch(shared: &Shared, replid: &[u8], name: &[u8], cursor: &[u8], out: &mut Vec<u8>) {
    let Some(log) = shared.engine.log_engine() else {
        return;
    };
    let peer = String::from_utf8_lossy(name);
    let repl = &shared.repl;
    let fresh = replid != repl.replid.as_bytes();
    // A replica of the master this server follows (or followed before its promotion) may
    // continue here without a full sync.
    let upstream = replid != b"-" && replid == lock(&repl.master_replid).as_bytes();
    let served = log.repl_serve(cursor, fresh, upstream, BATCH_BUDGET, out);
    {
        let now = Instant::now();
        let mut f = lock(&repl.followers);
        f.retain(|_, x| x.last_pull.elapsed() < REPLICA_TIMEOUT * 6);
        let e = f.entry(peer.into_owned()).or_insert(Follower {
            lag_bytes: 0,
            lag: Duration::ZERO,
            last_pull: now,
            pulls: 0,
            snapshot: true,
            history: VecDeque::new(),
        });
        e.lag_bytes = served.lag_bytes;
        e.last_pull = now;
        e.pulls += 1;
        e.snapshot = served.snapshot;
        e.pulled(now, served.log_offset, served.lag_bytes);
    }
    repl.check_min_replicas(&shared.config);
}

/// Start following `master` ("host:port"), replacing any master followed before.
pub fn follow(shared: &Shared, master: String) {
    let repl = &shared.repl;
    let Some(shared) = repl.server.get().and_then(Weak::upgrade) else {
        return;
    };
    if let Some(log) = shared.engine.log_engine() {
        log.set_replica(true);
    }
    repl.replica.store(true, Ordering::Release);
    *lock(&repl.master) = Some(master.clone());
    let generation = {
        let _a = lock(&repl.state);
        repl.generation.fetch_add(1, Ordering::AcqRel) + 1
    };
    repl.link_up.store(false, Ordering::Relaxed);
    repl.in_sync.store(false, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("kvcached-replica".into())
        .spawn(move || puller(&shared, &master, generation));
    if let Err(e) = spawned {
        eprintln!("kvcached: cannot start the replication thread: {e}");
    }
}

/// Stop following: this server becomes a master with the data it has.
pub fn promote(shared: &Shared) {
    let repl = &shared.repl;
    {
        let _a = lock(&repl.state);
        repl.generation.fetch_add(1, Ordering::AcqRel);
    }
    *lock(&repl.master) = None;
    repl.link_up.store(false, Ordering::Relaxed);
    repl.in_sync.store(false, Ordering::Release);
    if let Some(log) = shared.engine.log_engine() {
        log.set_replica(false);
    }
    repl.replica.store(false, Ordering::Release);
}

/// The puller: connect, pull, apply, until the generation changes or the server stops.
fn puller(shared: &Shared, master: &str, generation: u64) {
    let repl = &shared.repl;
    let Some(log) = shared.engine.log_engine() else {
        eprintln!("kvcached: replication needs the log engine (-o engine=log)");
        return;
    };
    let current =
        || repl.generation.load(Ordering::Acquire) == generation && !shared.shutting_down();
    let mut backoff = Duration::from_millis(20);
    while current() {
        match connect(master) {
            Ok(stream) => {
                backoff = Duration::from_millis(20);
                let r = follow_link(shared, log, stream, &current);
                repl.link_up.store(false, Ordering::Relaxed);
                repl.in_sync.store(false, Ordering::Release);
                if let Err(e) = r {
                    if current() && shared.config.verbose > 0 {
                        eprintln!("kvcached: replication link to {master}: {e}");
                    }
                }
            }
            Err(_) => {
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
        // Wait before reconnecting, checking for a new master or shutdown meanwhile.
        let until = Instant::now() + backoff;
        while current() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn connect(master: &str) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::other("no address");
    for addr in master.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, IO_TIMEOUT) {
            Ok(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(IO_TIMEOUT))?;
                s.set_write_timeout(Some(IO_TIMEOUT))?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The credentials of `--replica-auth` (first line, `user:password`), read at each connect
/// so that a changed file takes effect on the next reconnect.
fn credentials(shared: &Shared) -> std::io::Result<Option<(String, String)>> {
    let Some(path) = &shared.config.replica_auth else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)?;
    let line = text.lines().next().unwrap_or_default();
    let (user, pass) = line
        .split_once(':')
        .ok_or_else(|| std::io::Error::other("--replica-auth: expected user:password"))?;
    Ok(Some((user.to_string(), pass.to_string())))
}

/// memcached's ASCII authentication (`-Y` on the master): a `set` whose data is
/// `user password`.
fn authenticate(
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
    user: &str,
    pass: &str,
) -> std::io::Result<()> {
    let token = format!("{user} {pass}");
    let mut req = format!("set replica 0 0 {}\r\n", token.len()).into_bytes();
    req.extend_from_slice(token.as_bytes());
    req.extend_from_slice(b"\r\n");
    writer.write_all(&req)?;
    let mut line = String::new();
    (&mut *reader).take(512).read_line(&mut line)?;
    if line != "STORED\r\n" {
        // Never echo the token; the master's reply says why.
        return Err(std::io::Error::other(format!(
            "authentication refused: {}",
            line.trim_end()
        )));
    }
    Ok(())
}

/// One text-protocol pull: send `replpull`, read `REPL <replid> <n>` and the batch into
/// `batch`; returns the master's replid.
fn pull_text(
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
    replid: &str,
    name: &str,
    cursor: &[u8],
    line: &mut String,
    batch: &mut Vec<u8>,
) -> std::io::Result<String> {
    let mut req = format!("replpull {replid} {} {name}\r\n", cursor.len()).into_bytes();
    req.extend_from_slice(cursor);
    req.extend_from_slice(b"\r\n");
    writer.write_all(&req)?;
    line.clear();
    // Bounded: a reply line longer than this is not a REPL header.
    (&mut *reader).take(512).read_line(line)?;
    let mut parts = line.trim_end().split(' ');
    let (Some("REPL"), Some(their), Some(n), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(std::io::Error::other(format!(
            "unexpected reply {:?}",
            line.trim_end()
        )));
    };
    let n: usize = n
        .parse()
        .ok()
        .filter(|&n| n <= MAX_BATCH)
        .ok_or_else(|| std::io::Error::other("bad batch length"))?;
    batch.clear();
    batch.resize(n + 2, 0);
    reader.read_exact(batch)?;
    if batch.get(n..) != Some(b"\r\n".as_slice()) {
        return Err(std::io::Error::other("bad batch terminator"));
    }
    batch.truncate(n);
    Ok(their.to_string())
}

/// Read one binary response into `buf` and parse it with the protocol crate: (status,
/// key, where the value lies in `buf`).
fn read_binary(
    reader: &mut BufReader<TcpStream>,
    buf: &mut Vec<u8>,
) -> std::io::Result<(u16, Vec<u8>, std::ops::Range<usize>)> {
    use kvproto::binary::{parse_response, ResponseParse, HEADER_LEN};
    buf.clear();
    buf.resize(HEADER_LEN, 0);
    reader.read_exact(buf)?;
    let body = buf
        .get(8..12)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, u32::from_be_bytes) as usize;
    if body > MAX_BATCH {
        return Err(std::io::Error::other("binary response too long"));
    }
    buf.resize(HEADER_LEN + body, 0);
    reader.read_exact(&mut buf[HEADER_LEN..])?;
    match parse_response(buf) {
        // The value ends the packet.
        ResponseParse::Response(r, _) => Ok((
            r.status,
            r.key.to_vec(),
            buf.len() - r.value.len()..buf.len(),
        )),
        _ => Err(std::io::Error::other("not a binary response")),
    }
}

/// One binary-protocol pull ([`kvproto::binary::opcode::REPL_PULL`]); returns the master's
/// replid, with the batch in `batch`.
fn pull_binary(
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
    replid: &str,
    name: &str,
    cursor: &[u8],
    batch: &mut Vec<u8>,
) -> std::io::Result<String> {
    let mut req = Vec::new();
    let key = format!("{replid} {name}");
    kvproto::binary::write_request(
        &mut req,
        kvproto::binary::opcode::REPL_PULL,
        0,
        0,
        &[],
        key.as_bytes(),
        cursor,
    );
    writer.write_all(&req)?;
    let (status, their, value) = read_binary(reader, batch)?;
    if status != 0 {
        return Err(std::io::Error::other(format!(
            "pull refused: status {status:#x} {}",
            String::from_utf8_lossy(batch.get(value).unwrap_or_default())
        )));
    }
    // Keep only the batch (the value).
    batch.drain(..value.start);
    String::from_utf8(their).map_err(|_| std::io::Error::other("bad replid"))
}

/// SASL PLAIN over the binary protocol (a master with `-S`).
fn authenticate_sasl(
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
    user: &str,
    pass: &str,
) -> std::io::Result<()> {
    let mut data = Vec::with_capacity(user.len() + pass.len() + 2);
    data.push(0);
    data.extend_from_slice(user.as_bytes());
    data.push(0);
    data.extend_from_slice(pass.as_bytes());
    let mut req = Vec::new();
    kvproto::binary::write_request(
        &mut req,
        kvproto::binary::opcode::SASL_AUTH,
        0,
        0,
        &[],
        b"PLAIN",
        &data,
    );
    writer.write_all(&req)?;
    let mut body = Vec::new();
    let (status, _, _) = read_binary(reader, &mut body)?;
    if status != 0 {
        // Never echo the credentials; the master's status says why.
        return Err(std::io::Error::other(format!(
            "SASL authentication refused: status {status:#x}"
        )));
    }
    Ok(())
}

/// Pull over one connection until it fails or the puller must stop.
fn follow_link(
    shared: &Shared,
    log: &LogEngine,
    stream: TcpStream,
    current: &dyn Fn() -> bool,
) -> std::io::Result<()> {
    let repl = &shared.repl;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let binary = shared.config.replica_auth_sasl;
    if let Some((user, pass)) = credentials(shared)? {
        if binary {
            authenticate_sasl(&mut reader, &mut writer, &user, &pass)?;
        } else {
            authenticate(&mut reader, &mut writer, &user, &pass)?;
        }
    }
    let mut first = true;
    let mut cursor = Vec::new();
    let mut line = String::new();
    let mut batch = Vec::new();
    let mut idle = Duration::ZERO;
    while current() {
        cursor.clear();
        lock(&repl.state).cursor(&mut cursor);
        let replid = lock(&repl.master_replid).clone();
        let their = if binary {
            pull_binary(
                &mut reader,
                &mut writer,
                &replid,
                &repl.replid,
                &cursor,
                &mut batch,
            )?
        } else {
            pull_text(
                &mut reader,
                &mut writer,
                &replid,
                &repl.replid,
                &cursor,
                &mut line,
                &mut batch,
            )?
        };
        let their = their.as_str();
        if their != replid {
            // Another log (a new master, or it restarted): this batch starts a full sync
            // (a reset) or continues this replica in the new log (a switch).
            *lock(&repl.master_replid) = their.to_string();
        }
        // Apply only while this puller is still the current one (checked under the lock
        // that promotion and a new master take).
        let (applied, applied_bytes) = {
            let mut st = lock(&repl.state);
            if !current() {
                return Ok(());
            }
            let a = log.repl_apply(&mut st, &batch, shared.clock.now());
            if a.is_err() {
                // A batch we cannot apply: start over with a full sync.
                st.restart();
            }
            repl.in_sync
                .store(a.is_ok() && st.phase() == "tail", Ordering::Release);
            (a, st.applied_bytes)
        };
        repl.link_up.store(true, Ordering::Relaxed);
        match applied {
            Ok(a) => {
                if a.reset {
                    repl.full_syncs.fetch_add(1, Ordering::Relaxed);
                } else if first {
                    repl.partial_syncs.fetch_add(1, Ordering::Relaxed);
                }
                first = false;
                repl.applied_bytes.store(applied_bytes, Ordering::Relaxed);
                repl.master_offset.store(a.master_offset, Ordering::Relaxed);
                repl.last_io_ms
                    .store(repl.started.elapsed().as_millis() as u64, Ordering::Relaxed);
                if a.idle {
                    // Nothing new: poll again soon, backing off while it stays idle (1 ms
                    // doubling to 10 ms: an idle link costs both ends well under 1% of a
                    // core, and a write waits at most 10 ms for the next pull).
                    idle = (idle * 2)
                        .max(Duration::from_millis(1))
                        .min(Duration::from_millis(10));
                    std::thread::sleep(idle);
                } else {
                    idle = Duration::ZERO;
                }
            }
            Err(e) => {
                return Err(std::io::Error::other(format!("bad batch: {e}")));
            }
        }
    }
    Ok(())
}
