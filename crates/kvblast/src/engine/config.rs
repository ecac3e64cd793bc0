//! What a run is asked to do: the protocol, the load model and the validated `RunConfig`.

use super::*;

/// A run configuration that [`RunConfig::validate`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no servers given")]
    NoServers,
    #[error("too many servers")]
    TooManyServers,
    #[error("threads must be in 1..=1024")]
    Threads,
    #[error("connections and depth must be at least 1")]
    ConnsOrDepth,
    #[error("keys must be in 1..=2^31")]
    Keys,
    #[error("multiget must be in 1..=10000")]
    Multiget,
    #[error("rate must be positive")]
    Rate,
    #[error("give a duration or a request count")]
    NoEnd,
    #[error("--reconnect-interval must be at least 1")]
    ReconnectInterval,
    #[error("--reconnect-interval applies to TCP servers (UDP has no connections)")]
    ReconnectUdp,
    #[error("UDP servers take the text protocol only (for now)")]
    UdpProtocol,
    #[error("UDP requests must fit one datagram: use --value-max {max} or less")]
    UdpValueSize { max: usize },
    #[error(
        "--pipeline batch is a closed-loop schedule (send --depth requests, wait for every \
         reply): an open loop (--rate) sends each request at its own time; drop --rate or \
         --pipeline batch"
    )]
    BatchOpenLoop,
    #[error("probe rate must be positive")]
    ProbeRate,
    #[error("value sizes are limited to {MAX_VALUE} bytes")]
    ValueSize,
    #[error("participant must be I/N with I < N")]
    Participant,
    #[error(
        "splitting {keys} keys between {participants} participants leaves one without keys \
         (use more keys or --agent-keys shared)"
    )]
    SplitKeys { keys: u64, participants: u64 },
}

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
    pub fn parse(s: &str) -> Result<Protocol, crate::units::BadChoice> {
        match s {
            "text" | "ascii" => Ok(Protocol::Text),
            "meta" => Ok(Protocol::Meta),
            "binary" => Ok(Protocol::Binary),
            _ => Err(crate::units::BadChoice {
                setting: "protocol",
                given: s.to_string(),
                choices: "text | meta | binary",
            }),
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
pub(super) enum Wire {
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
    /// Closed loop: a refilling window of `depth`, or batches of `depth` (`--pipeline`).
    pub pipeline: Pipeline,
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
    /// TLS to every TCP server (`--tls`).
    pub tls: Option<crate::transport::Tls>,
    /// Close a connection after this many requests (load-phase sets not counted) and open a
    /// new one (`--reconnect-interval`).
    pub reconnect_interval: Option<u64>,
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
            pipeline: Pipeline::Window,
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
            tls: None,
            reconnect_interval: None,
        }
    }

    /// Whether this run draws from a share of the key space only.
    pub fn key_share(&self) -> Option<(u64, u64)> {
        (self.split_keys && self.participants > 1).then_some((self.participant, self.participants))
    }

    /// The seed of this participant's random streams (the controller's is `seed` itself, so a
    /// run without agents is unchanged).
    pub(super) fn stream_seed(&self) -> u64 {
        self.seed
            .wrapping_add(self.participant.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        use ConfigError as E;
        if self.servers.is_empty() {
            return Err(E::NoServers);
        }
        if self.servers.len() > 65_536 {
            return Err(E::TooManyServers);
        }
        if self.threads == 0 || self.threads > 1024 {
            return Err(E::Threads);
        }
        if self.conns == 0 || self.depth == 0 {
            return Err(E::ConnsOrDepth);
        }
        if self.workload.keys == 0 || self.workload.keys > 1 << 31 {
            // The popularity tables and per-key sizes take a few bytes per key.
            return Err(E::Keys);
        }
        if self.workload.multiget == 0 || self.workload.multiget > 10_000 {
            return Err(E::Multiget);
        }
        if let LoadModel::Open { rate, .. } = self.load {
            if !(rate > 0.0 && rate.is_finite()) {
                return Err(E::Rate);
            }
        }
        if self.pipeline == Pipeline::Batch && self.load != LoadModel::Closed {
            return Err(E::BatchOpenLoop);
        }
        if self.duration.is_zero() && self.requests.is_none() {
            return Err(E::NoEnd);
        }
        if self.reconnect_interval == Some(0) {
            return Err(E::ReconnectInterval);
        }
        if self.reconnect_interval.is_some() && self.servers.iter().any(|s| s.starts_with("udp:")) {
            return Err(E::ReconnectUdp);
        }
        if self.servers.iter().any(|s| s.starts_with("udp:")) {
            if self.protocol != Protocol::Text {
                return Err(E::UdpProtocol);
            }
            if self.workload.value_size.max > crate::transport::UDP_MAX_REQUEST - 1024 {
                return Err(E::UdpValueSize {
                    max: crate::transport::UDP_MAX_REQUEST - 1024,
                });
            }
        }
        if let Some(r) = self.probe_rate {
            if !(r > 0.0 && r.is_finite()) {
                return Err(E::ProbeRate);
            }
        }
        if self.workload.value_size.max > MAX_VALUE {
            return Err(E::ValueSize);
        }
        if self.participants == 0 || self.participant >= self.participants {
            return Err(E::Participant);
        }
        if self.key_share().is_some() && self.workload.keys < self.participants {
            return Err(E::SplitKeys {
                keys: self.workload.keys,
                participants: self.participants,
            });
        }
        Ok(())
    }

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
                    "closed loop, {} thread(s) x {} conn(s)/server x {}",
                    self.threads,
                    self.conns,
                    match self.pipeline {
                        Pipeline::Window => format!("depth {} (pipeline window)", self.depth),
                        Pipeline::Batch => format!(
                            "batches of {} (pipeline batch: the next once all are answered)",
                            self.depth
                        ),
                    }
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
    pub(super) fn probe_config(&self) -> Option<RunConfig> {
        let rate = self.probe_rate?;
        let mut p = self.clone();
        p.threads = 1;
        p.conns = 1;
        p.depth = 1;
        p.pipeline = Pipeline::Window;
        p.load = LoadModel::Open {
            rate,
            arrival: Arrival::Poisson,
        };
        p.requests = None;
        p.load_phase = false;
        p.look_aside = false;
        p.seed = self.seed ^ 0x9E0B_E000;
        p.probe_rate = None;
        p.reconnect_interval = None;
        // The probe is not part of the load: it samples the whole key space.
        p.split_keys = false;
        Some(p)
    }
}
