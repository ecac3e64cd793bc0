//! Replication state: this server's role (master or replica), the replica's position and
//! link, and what a master knows of the replicas pulling from it; the write refusals and
//! `stats replication` that follow from them. The pull protocol is `exec::replication`
//! (master side) and `features::replication` (the replica's puller thread).

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvstore::ReplicaState;

/// A replica that has not pulled for this long is no longer counted as connected.
pub const REPLICA_TIMEOUT: Duration = Duration::from_secs(10);
/// A replica that has not pulled for this long is forgotten: the master stops keeping the
/// part of its log the replica has not read (`LogEngine::repl_hold`), and drops its
/// figures.
pub const REPLICA_FORGET: Duration = Duration::from_secs(60);

/// The error line a replica sends for writes.
pub const READ_ONLY: &[u8] = b"SERVER_ERROR replica is read-only\r\n";
/// The error line for reads on a replica that is not in sync, with
/// `--replica-serve-stale no`.
pub const NOT_IN_SYNC: &[u8] = b"SERVER_ERROR replica is not in sync with its master\r\n";
/// The error line for writes while fewer replicas than `--min-replicas` are in sync.
pub const NOT_ENOUGH_REPLICAS: &[u8] = b"SERVER_ERROR not enough good replicas\r\n";

/// What a request does to items, as far as replication's refusals are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads items (refused by a replica out of sync with `--replica-serve-stale no`).
    Read,
    /// Changes items (refused by a replica, and by a master short of `--min-replicas`).
    Write,
    /// Neither (stats, version, ...): never refused.
    Other,
}

/// What a master knows of one replica (from its pulls).
#[derive(Debug, Clone)]
pub struct Follower {
    pub lag_bytes: u64,
    /// How old the replica's view is: now minus when the master's log was where the
    /// replica now is (from `history`), as of the last pull.
    pub lag: Duration,
    pub last_pull: Instant,
    pub pulls: u64,
    pub snapshot: bool,
    /// (when, master log offset), at most one sample per `SAMPLE_EVERY`, for `lag`.
    pub history: VecDeque<(Instant, u64)>,
}

/// Spacing of the offset samples kept per replica for its lag in seconds.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Offset samples kept per replica (about a minute at `SAMPLE_EVERY`).
const SAMPLES: usize = 12_000;

impl Follower {
    /// Record a pull: the master's offset now, and the replica's (the master's minus what
    /// it has not received).
    pub fn pulled(&mut self, now: Instant, master_offset: u64, lag_bytes: u64) {
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
    pub replica: AtomicBool,
    /// Bumped whenever the master changes; a puller of an older generation stops.
    pub generation: AtomicU64,
    /// Held while a batch is applied and while the generation changes, so that once
    /// `promote` or `follow` returns no batch of the previous master is applied any more
    /// (a pull in flight when the link heals is dropped).
    /// Also holds the replica's position, which outlives a puller: after `replicaof` to
    /// another server, the new puller continues from it (a switch, when the new master
    /// followed the same upstream).
    pub state: Mutex<ReplicaState>,
    pub master: Mutex<Option<String>>,
    pub master_replid: Mutex<String>,
    pub link_up: AtomicBool,
    /// The replica follows the tail (not in a full sync) over a live link.
    pub in_sync: AtomicBool,
    pub full_syncs: AtomicU64,
    pub partial_syncs: AtomicU64,
    pub applied_bytes: AtomicU64,
    pub master_offset: AtomicU64,
    /// Milliseconds since start of the last batch applied.
    pub last_io_ms: AtomicU64,
    pub started: Instant,
    pub followers: Mutex<BTreeMap<String, Follower>>,
    /// `--min-replicas` is set and fewer replicas are in sync: writes are refused.
    pub too_few_replicas: AtomicBool,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
        }
    }

    /// Writes are refused (this server follows a master).
    pub fn read_only(&self) -> bool {
        self.replica.load(Ordering::Acquire)
    }

    /// Why a write must be refused now, as memcached-style error line, if it must: this
    /// server is a replica, or `--min-replicas` is not met.
    /// Whether replication refuses a request that does `access` now, and with which error
    /// line: the one place the protocols ask (each only classifies its requests).
    pub fn refusal(
        &self,
        access: Access,
        config: &crate::setup::config::Config,
    ) -> Option<&'static [u8]> {
        match access {
            Access::Write => self.write_refusal(),
            Access::Read => self.read_refusal(config),
            Access::Other => None,
        }
    }

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
    pub fn read_refusal(&self, config: &crate::setup::config::Config) -> Option<&'static [u8]> {
        (!config.replica_serve_stale
            && self.replica.load(Ordering::Acquire)
            && !self.in_sync.load(Ordering::Acquire))
        .then_some(NOT_IN_SYNC)
    }

    /// Forget the replicas that have not pulled for [`REPLICA_FORGET`], and stop keeping
    /// log segments for them (on every pull and maintenance tick).
    pub fn forget_followers(&self, engine: &kvstore::LogEngine) {
        let mut f = lock(&self.followers);
        f.retain(|_, x| x.last_pull.elapsed() < REPLICA_FORGET);
        // Under the followers' lock (the engine takes no lock of ours), so that no copy
        // of the names is made on every pull.
        engine.repl_hold(|name| f.contains_key(name));
    }

    /// Recount the replicas in sync for `--min-replicas` (on every pull and every
    /// maintenance tick, so that a replica that stops pulling counts out in time).
    pub fn check_min_replicas(&self, config: &crate::setup::config::Config) {
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
    /// `master_offset` is the engine's log offset (0 without the log engine).
    pub fn stats(&self, master_offset: u64) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = Vec::new();
        let mut put = |k: &str, val: String| v.push((k.to_string(), val));
        let replica = self.read_only();
        put("role", if replica { "replica" } else { "master" }.into());
        put("replid", self.replid.clone());
        put("master_offset", master_offset.to_string());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::config::Config;

    #[test]
    fn one_decision_for_every_protocol() {
        let r = Replication::new();
        let mut config = Config::default();
        for access in [Access::Read, Access::Write, Access::Other] {
            assert_eq!(r.refusal(access, &config), None, "a master refuses nothing");
        }
        r.replica.store(true, Ordering::Release);
        assert_eq!(r.refusal(Access::Write, &config), Some(READ_ONLY));
        assert_eq!(r.refusal(Access::Read, &config), None, "stale reads served");
        config.replica_serve_stale = false;
        assert_eq!(r.refusal(Access::Read, &config), Some(NOT_IN_SYNC));
        r.in_sync.store(true, Ordering::Release);
        assert_eq!(r.refusal(Access::Read, &config), None);
        assert_eq!(r.refusal(Access::Other, &config), None);
        r.replica.store(false, Ordering::Release);
        r.too_few_replicas.store(true, Ordering::Relaxed);
        assert_eq!(r.refusal(Access::Write, &config), Some(NOT_ENOUGH_REPLICAS));
    }
}
