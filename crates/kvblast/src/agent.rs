//! Distributed load: `kvblast agent --listen ADDR` runs jobs for a controller; `kvblast run
//! --agent HOST:PORT ...` splits the load between itself and its agents, starts everyone
//! together, and merges their counters and histograms into one report (mutilate's
//! master/agent arrangement).
//!
//! Controller and agent exchange [`Message`]s, one JSON object a line (see
//! [`run_with_agents`] for the order). The controller sends `run` with the job's flags
//! (`--participant I/N`, the participant's rate and request count among them); the agent
//! connects, runs its load phase and answers `ready`; once every participant is ready the
//! controller pings each agent and sends `go` with a delay so that all start at one instant;
//! the agent runs with [`engine::run_synced`] and answers `done`, with its counters and
//! histograms ([`Stats`] in its serde form), or `err`. With `--agent-keys split` (the
//! default) participant i of N draws only the keys k with k mod N = i and sets only those in
//! its load phase; the rate and the request count are divided in proportion to each share's
//! popularity mass, so the union of the participants' requests has the workload's
//! popularity. Every participant uses the same `--seed` for the key space (sizes, bucket
//! shuffle) and its own random streams. Only the controller runs the latency probe and reads
//! the servers' `stats`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cli::{AgentKeys, Args, CliError};
use crate::dist::{DistError, KeyChooser};
use crate::engine::{self, ConfigError, EngineError, LoadModel};
use crate::stats::{Participant, Report, Stats};
use crate::units::BadChoice;

/// The longest job line or reply an agent or master accepts.
const MAX_MESSAGE: u64 = 64 << 20;

/// One message between a controller and an agent; on the wire, one line of JSON tagged by
/// `type` (`{"type":"go","delay_ns":1500000}`). Both ends are the same kvblast version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// Controller → agent: run a job with these flags (as `kvblast run` takes them).
    Run { args: Vec<String> },
    /// Agent → controller: connected and loaded, waiting for `go`.
    Ready,
    /// Controller → agent, answered by `pong`.
    Ping,
    /// Agent → controller: the agent's wall clock (ns since the Unix epoch) when it read
    /// the ping.
    Pong { unix_ns: u64 },
    /// Controller → agent: start this long after reading this line.
    Go { delay_ns: u64 },
    /// Agent → controller: the job's result.
    Done(Box<Done>),
    /// Agent → controller: the job failed, and why.
    Err { message: String },
}

/// What an agent sends back when its job is done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    /// When its measured window started (wall clock, ns since the Unix epoch).
    pub start_unix_ns: u64,
    /// The measured window's length.
    pub seconds: f64,
    /// Distinct keys its main phase asked for, when tracked.
    pub distinct_keys: Option<u64>,
    pub stats: Stats,
}

/// Why distributed load failed, on the controller or on an agent. `peer` names the other
/// end: `agent HOST:PORT` on the controller, `agent` on an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The flags (the controller's, or the job an agent was sent) give no run.
    #[error(transparent)]
    Cli(#[from] CliError),
    #[error(transparent)]
    Choice(#[from] BadChoice),
    #[error(transparent)]
    Dist(#[from] DistError),
    /// This participant's run failed.
    #[error(transparent)]
    Run(#[from] EngineError),
    #[error("agent {agent}: {source}")]
    Resolve {
        agent: String,
        source: std::io::Error,
    },
    #[error("agent {agent}: no address")]
    NoAddress { agent: String },
    #[error("agent {agent}: cannot connect to {addr}: {source}")]
    Connect {
        agent: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{peer}: {source}")]
    Io {
        peer: String,
        source: std::io::Error,
    },
    #[error("{peer}: connection closed")]
    Closed { peer: String },
    #[error("{peer}: {source}")]
    Protocol { peer: String, source: ProtocolError },
    /// An agent's own error (its `err` message).
    #[error("{peer}: {message}")]
    Remote { peer: String, message: String },
}

impl From<ConfigError> for AgentError {
    fn from(e: ConfigError) -> Self {
        AgentError::Run(e.into())
    }
}

/// A line that is not the message expected.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("malformed message: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error("cannot encode a message: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("expected {expected}, got {got}")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
}

impl Message {
    /// The message as a line of JSON, `\n`-terminated (JSON strings escape their newlines).
    pub fn to_line(&self) -> Result<String, ProtocolError> {
        let mut line = serde_json::to_string(self).map_err(ProtocolError::Encode)?;
        line.push('\n');
        Ok(line)
    }

    /// Read a message from a line (without its end). Malformed input is an error, never a
    /// panic.
    pub fn parse(line: &str) -> Result<Message, ProtocolError> {
        serde_json::from_str(line).map_err(ProtocolError::Malformed)
    }

    /// The message's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Run { .. } => "run",
            Message::Ready => "ready",
            Message::Ping => "ping",
            Message::Pong { .. } => "pong",
            Message::Go { .. } => "go",
            Message::Done(_) => "done",
            Message::Err { .. } => "err",
        }
    }

    /// An error saying that this message is not the one expected.
    fn unexpected(&self, expected: &'static str) -> ProtocolError {
        ProtocolError::Unexpected {
            expected,
            got: self.kind(),
        }
    }
}

/// Serve jobs on `listener`, one connection at a time; stop after `jobs` jobs if given. A
/// job's failure is the controller's to report (the agent sends it an `err`); the agent
/// goes on to the next.
pub fn serve(listener: TcpListener, jobs: Option<u64>) -> Result<(), AgentError> {
    let mut done = 0;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let _ = serve_one(conn);
        done += 1;
        if jobs.is_some_and(|j| done >= j) {
            break;
        }
    }
    Ok(())
}

/// The name an agent gives its controller in errors.
const CONTROLLER: &str = "agent";

fn serve_one(conn: TcpStream) -> Result<(), AgentError> {
    let mut reader = BufReader::new(
        conn.try_clone()
            .map_err(|source| AgentError::Io {
                peer: CONTROLLER.into(),
                source,
            })?
            .take(MAX_MESSAGE),
    );
    let mut writer = conn;
    let reply = match run_job(&mut reader, &mut writer) {
        Ok(done) => Message::Done(Box::new(done)),
        Err(e) => Message::Err {
            message: e.to_string(),
        },
    };
    send(&mut writer, &reply, CONTROLLER)
}

/// Wall-clock nanoseconds since the Unix epoch, now.
fn unix_ns() -> u64 {
    engine::unix_ns_at(Instant::now())
}

/// Write one message; `peer` names the other end in errors.
fn send(writer: &mut impl Write, m: &Message, peer: &str) -> Result<(), AgentError> {
    let line = m.to_line().map_err(|source| AgentError::Protocol {
        peer: peer.into(),
        source,
    })?;
    writer
        .write_all(line.as_bytes())
        .map_err(|source| AgentError::Io {
            peer: peer.into(),
            source,
        })
}

/// Read one message; an error at the end of the stream. `peer` names the other end in
/// errors.
fn receive(reader: &mut impl BufRead, peer: &str) -> Result<Message, AgentError> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => Err(AgentError::Closed { peer: peer.into() }),
        Ok(_) => Message::parse(line.trim_end_matches(['\r', '\n'])).map_err(|source| {
            AgentError::Protocol {
                peer: peer.into(),
                source,
            }
        }),
        Err(source) => Err(AgentError::Io {
            peer: peer.into(),
            source,
        }),
    }
}

/// An error saying that `m` is not the message expected.
fn unexpected(peer: &str, m: &Message, expected: &'static str) -> AgentError {
    AgentError::Protocol {
        peer: peer.into(),
        source: m.unexpected(expected),
    }
}

/// Run one job: read it, connect and load, say `ready`, answer `ping`s, start when `go`
/// says, and return the result.
fn run_job(reader: &mut impl BufRead, writer: &mut TcpStream) -> Result<Done, AgentError> {
    let args = match receive(reader, CONTROLLER)? {
        Message::Run { args } => args,
        other => return Err(unexpected(CONTROLLER, &other, "run")),
    };
    let args = Args::parse(std::iter::once("run".to_string()).chain(args))?;
    let cfg = args.run_config()?;
    // The controller may take its own load phase, and wait for the other agents', before
    // saying go; a controller that goes away closes the connection.
    let _ = writer.set_read_timeout(Some(cfg.load_timeout * 2 + Duration::from_secs(60)));
    let mut sync = || -> Result<Instant, AgentError> {
        send(writer, &Message::Ready, CONTROLLER)?;
        loop {
            let m = receive(reader, "agent: waiting for go")?;
            let received = Instant::now();
            match m {
                Message::Ping => send(writer, &Message::Pong { unix_ns: unix_ns() }, CONTROLLER)?,
                Message::Go { delay_ns } => return Ok(received + Duration::from_nanos(delay_ns)),
                other => return Err(unexpected(CONTROLLER, &other, "ping or go")),
            }
        }
    };
    let r = engine::run_synced(&cfg, &mut sync)?;
    Ok(Done {
        start_unix_ns: r.start_unix_ns,
        seconds: r.seconds,
        distinct_keys: r.distinct_keys,
        stats: r.stats,
    })
}

/// What a participant is given: its share of the workload, its rate and request count.
struct Share {
    share: f64,
    rate: Option<f64>,
    requests: Option<u64>,
}

/// Each participant's share of the workload (the controller first). With split keys,
/// participant i's share is the popularity mass of its keys (k mod N = i), so that every key
/// is asked for at the workload's rate for it; with shared keys, 1/N each. A request count is
/// divided in the same proportions, the controller taking the rounding remainder.
fn shares(args: &Args, participants: usize) -> Result<Vec<Share>, AgentError> {
    let n = participants as u64;
    let fractions = match args.agent_keys()? {
        AgentKeys::Split => {
            let w = args.workload()?;
            if w.keys < n {
                return Err(ConfigError::SplitKeys {
                    keys: w.keys,
                    participants: n,
                }
                .into());
            }
            KeyChooser::new(w.keys, &w.popularity, args.seed.unwrap_or(1))?.partition_mass(n)
        }
        AgentKeys::Shared => vec![1.0 / n as f64; participants],
    };
    let mut out: Vec<Share> = fractions
        .iter()
        .map(|&f| Share {
            share: f,
            rate: args.rate.map(|r| r * f),
            requests: args.requests.map(|q| (q as f64 * f).floor() as u64),
        })
        .collect();
    if let Some(q) = args.requests {
        let agents: u64 = out.iter().skip(1).filter_map(|s| s.requests).sum();
        out[0].requests = Some(q.saturating_sub(agents));
    }
    Ok(out)
}

/// The job an agent gets: the controller's flags with this participant's number and share.
fn agent_args(args: &Args, participant: usize, participants: usize, share: &Share) -> Vec<String> {
    let split = args.agent_keys().ok() != Some(AgentKeys::Shared);
    let mut a = args.clone();
    a.agents.clear();
    a.json = None;
    a.plot = None;
    // With split keys each participant loads its own keys; shared, the controller all.
    a.load = args.load && split;
    a.probe_rate = None;
    a.quiet = true;
    a.no_server_stats = true;
    a.rate = share.rate;
    a.requests = share.requests;
    a.participant = Some((participant as u64, participants as u64));
    a.agent_keys = Some(if split { "split" } else { "shared" }.into());
    a.to_argv()
}

/// A connected agent, as the controller sees it.
struct AgentConn {
    name: String,
    reader: BufReader<std::io::Take<TcpStream>>,
    writer: TcpStream,
    /// The fastest ping's round trip, and the agent's clock minus ours it gave (ns).
    rtt: Duration,
    offset_ns: i64,
}

impl AgentConn {
    /// How errors name this agent.
    fn peer(&self) -> String {
        format!("agent {}", self.name)
    }

    fn send(&mut self, m: &Message) -> Result<(), AgentError> {
        let peer = self.peer();
        send(&mut self.writer, m, &peer)
    }

    /// The next message, waiting at most `timeout`; an agent's `err` is an error.
    fn receive(&mut self, timeout: Duration) -> Result<Message, AgentError> {
        let _ = self.writer.set_read_timeout(Some(timeout));
        let peer = self.peer();
        match receive(&mut self.reader, &peer)? {
            Message::Err { message } => Err(AgentError::Remote { peer, message }),
            m => Ok(m),
        }
    }

    /// Wait for `ready` (the agent has connected and run its load phase).
    fn ready(&mut self, timeout: Duration) -> Result<(), AgentError> {
        match self.receive(timeout)? {
            Message::Ready => Ok(()),
            other => Err(unexpected(&self.peer(), &other, "ready")),
        }
    }

    /// Ping a few times; keep the fastest round trip and the clock offset it gives
    /// (Cristian's method: the agent read its clock half a round trip after we sent).
    fn ping(&mut self) -> Result<(), AgentError> {
        self.rtt = Duration::MAX;
        for _ in 0..PINGS {
            let (sent, sent_ns) = (Instant::now(), unix_ns());
            self.send(&Message::Ping)?;
            let m = self.receive(Duration::from_secs(5))?;
            let rtt = sent.elapsed();
            let Message::Pong { unix_ns: theirs } = m else {
                return Err(unexpected(&self.peer(), &m, "pong"));
            };
            if rtt < self.rtt {
                self.rtt = rtt;
                self.offset_ns = theirs as i64 - (sent_ns + rtt.as_nanos() as u64 / 2) as i64;
            }
        }
        Ok(())
    }

    /// Wait for the job's result.
    fn done(&mut self, timeout: Duration) -> Result<Done, AgentError> {
        match self.receive(timeout)? {
            Message::Done(done) => Ok(*done),
            other => Err(unexpected(&self.peer(), &other, "done")),
        }
    }
}

/// Pings per agent before the start.
const PINGS: usize = 3;

/// The start is this long after the controller decides it (plus two of the slowest round
/// trips): time to send every agent its `go`.
const START_LEAD: Duration = Duration::from_millis(20);

/// Run `args` split between this process and `args.agents`, merging every participant's
/// counters into the controller's report.
///
/// Protocol, per agent ([`Message`]s): `run` →; ← `ready` once the agent has connected and
/// run its load phase (or `err`); when every agent and the controller are ready, `ping` → ←
/// `pong` (the agent's wall clock) a few times, then `go` (a delay) →, and the agent starts
/// that long after it read the line: the delay is the common start instant less the time
/// already passed and half the agent's round trip, so every participant starts at the same
/// moment (to within the asymmetry of the network's delays). ← `done` (when it started, for
/// how long, its counters and histograms) or `err`.
pub fn run_with_agents(args: &Args) -> Result<Report, AgentError> {
    // Agents get histograms' contents, not their paths: they need no files of their own
    // (and the file is read once).
    let mut resolved = args.clone();
    resolved.inline_histograms()?;
    let args = &resolved;
    let participants = args.agents.len() + 1;
    let shares = shares(args, participants)?;
    let mut mine = args.clone();
    mine.agents.clear();
    mine.rate = shares[0].rate;
    mine.requests = shares[0].requests;
    mine.participant = Some((0, participants as u64));
    let cfg = mine.run_config()?;
    let wait = cfg.warmup
        + if cfg.duration.is_zero() {
            Duration::from_secs(3600)
        } else {
            cfg.duration
        }
        + cfg.drain
        + Duration::from_secs(60);
    // Connect to every agent first, so that an unreachable one fails the run before any
    // agent has a job (and none is left sending load for a run that already failed); then
    // send every agent its job, back to back, and run the master's share.
    let mut conns = Vec::new();
    for agent in &args.agents {
        let addr = agent
            .to_socket_addrs()
            .map_err(|source| AgentError::Resolve {
                agent: agent.clone(),
                source,
            })?
            .next()
            .ok_or_else(|| AgentError::NoAddress {
                agent: agent.clone(),
            })?;
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|source| {
            AgentError::Connect {
                agent: agent.clone(),
                addr,
                source,
            }
        })?;
        let _ = s.set_nodelay(true);
        let r = s.try_clone().map_err(|source| AgentError::Io {
            peer: format!("agent {agent}"),
            source,
        })?;
        conns.push(AgentConn {
            name: agent.clone(),
            reader: BufReader::new(r.take(MAX_MESSAGE)),
            writer: s,
            rtt: Duration::ZERO,
            offset_ns: 0,
        });
    }
    for (i, (a, share)) in conns.iter_mut().zip(shares.iter().skip(1)).enumerate() {
        let args = agent_args(args, i + 1, participants, share);
        a.send(&Message::Run { args })?;
    }
    // Called once this process has connected and loaded: wait for every agent to be ready
    // too, then start everyone together.
    let ready_wait = cfg.load_timeout + Duration::from_secs(60);
    let mut sync = || -> Result<Instant, AgentError> {
        for a in conns.iter_mut() {
            a.ready(ready_wait)?;
        }
        for a in conns.iter_mut() {
            a.ping()?;
        }
        let slowest = conns.iter().map(|a| a.rtt).max().unwrap_or_default();
        let start = Instant::now() + START_LEAD + slowest * 2;
        for a in conns.iter_mut() {
            let delay = start
                .saturating_duration_since(Instant::now())
                .saturating_sub(a.rtt / 2);
            let delay_ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
            a.send(&Message::Go { delay_ns })?;
        }
        Ok(start)
    };
    let mut report = engine::run_synced(&cfg, &mut sync)?;
    let mut me = Participant::of(
        "controller",
        shares[0].share,
        shares[0].rate,
        &report.stats,
        report.seconds,
    );
    me.distinct_keys = report.distinct_keys;
    let mut list = vec![me];
    for (i, mut a) in conns.into_iter().enumerate() {
        let Done {
            start_unix_ns: start_ns,
            seconds,
            distinct_keys: keys,
            stats: st,
        } = a.done(wait)?;
        let share = &shares[i + 1];
        let mut p = Participant::of(&a.name, share.share, share.rate, &st, seconds);
        p.distinct_keys = keys;
        p.rtt_ms = a.rtt.as_secs_f64() * 1e3;
        p.clock_offset_ms = a.offset_ns as f64 / 1e6;
        p.start_ms = (start_ns as i64 - a.offset_ns - report.start_unix_ns as i64) as f64 / 1e6;
        list.push(p);
        report.stats.merge(&st);
    }
    // The union's distinct keys are not known (only each participant's).
    report.distinct_keys = None;
    report.participants = list;
    if let (Some(rate), LoadModel::Open { .. }) = (args.rate, cfg.load) {
        report.target_rate = Some(rate);
    }
    let how = match args.agent_keys()? {
        AgentKeys::Split => "keys split (k mod N), each participant's rate and requests in proportion to its keys' popularity",
        AgentKeys::Shared => "keys shared, each participant sends 1/N of the rate and requests",
    };
    report.settings.push((
        "agents".into(),
        format!(
            "{} (N = {participants} participants started together; {how})",
            args.agents.join(" ")
        ),
    ));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{hist_v2, new_histogram, HistogramDataError};
    use crate::workload::Op;

    /// Counters and histograms of every kind, as a worker would leave them.
    fn sample_stats() -> Stats {
        let mut st = Stats {
            issued: 42,
            dropped: 3,
            window_ns: 7,
            interval_ns: 1_000_000_000,
            ..Default::default()
        };
        let g = &mut st.ops[Op::Get.index()];
        for v in [1000u64, 2000, 2000, 1_000_000, crate::stats::HIST_MAX_NS] {
            g.hist.saturating_record(v);
        }
        g.count = 5;
        g.hits = 3;
        g.total_keys = 9;
        g.hit_bytes = 300;
        g.miss_bytes = 20;
        st.ops[Op::Set.index()].hist.saturating_record(1);
        st.ops[Op::Set.index()].errors = 2;
        st.send_lag.saturating_record(5000);
        for i in 0..3u64 {
            let mut h = crate::stats::new_interval_histogram();
            h.saturating_record(10 + i * 1000);
            st.intervals.push(h);
        }
        st
    }

    /// Stats with histograms → `done` message → line → message → the same Stats.
    #[test]
    fn stats_round_trip_through_a_done_message() {
        let st = sample_stats();
        let done = Message::Done(Box::new(Done {
            start_unix_ns: 1_700_000_000_123_456_789,
            seconds: 1.25,
            distinct_keys: Some(17),
            stats: st.clone(),
        }));
        let line = done.to_line().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line}"
        );
        let back = Message::parse(line.trim_end()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, done);
        let Message::Done(back) = back else {
            panic!("{back:?}")
        };
        assert_eq!(back.stats, st);
        let b = back.stats.op(Op::Get);
        assert_eq!((b.count, b.hits, b.total_keys), (5, 3, 9));
        assert_eq!((b.hit_bytes, b.miss_bytes), (300, 20));
        assert_eq!(b.hist.len(), 5);
        assert_eq!(b.hist.max(), st.op(Op::Get).hist.max());
        assert_eq!(back.stats.intervals.len(), 3);
        assert_eq!(back.distinct_keys, Some(17));
        // Every other message, and one line each (a flag may hold a newline or a tab).
        for m in [
            Message::Run {
                args: vec!["--mix".into(), "get=1\n\t".into()],
            },
            Message::Ready,
            Message::Ping,
            Message::Pong { unix_ns: u64::MAX },
            Message::Go {
                delay_ns: 1_500_000,
            },
            Message::Err {
                message: "two\nlines".into(),
            },
        ] {
            let line = m.to_line().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(line.matches('\n').count(), 1, "{line}");
            assert_eq!(Message::parse(line.trim_end()).ok(), Some(m), "{line}");
        }
    }

    #[test]
    fn shares_follow_the_popularity_mass_and_add_up() {
        let parse = |s: &str| {
            Args::parse(s.split_whitespace().map(String::from)).unwrap_or_else(|e| panic!("{e}"))
        };
        let a = parse("run --keys 1000 --popularity zipf:1.2 --rate 9000 -n 1001 h");
        let sh = shares(&a, 3).unwrap_or_else(|e| panic!("{e}"));
        let total: f64 = sh.iter().map(|s| s.share).sum();
        assert!((total - 1.0).abs() < 1e-9);
        let rate: f64 = sh.iter().filter_map(|s| s.rate).sum();
        assert!((rate - 9000.0).abs() < 1e-6);
        assert_eq!(sh.iter().filter_map(|s| s.requests).sum::<u64>(), 1001);
        assert!(
            sh.iter().any(|s| (s.share - 1.0 / 3.0).abs() > 0.01),
            "zipf is uneven"
        );
        let a = parse("run --keys 1000 --popularity zipf:1.2 --rate 9000 --agent-keys shared h");
        let sh = shares(&a, 3).unwrap_or_else(|e| panic!("{e}"));
        assert!(sh.iter().all(|s| s.rate == Some(3000.0)));
        assert!(
            shares(&parse("run --keys 2 h"), 3).is_err(),
            "a share without keys"
        );
        // The job carries the participant number, the share and the key mode.
        let job = agent_args(&a, 2, 3, &sh[2]).join(" ");
        assert!(
            job.contains("--participant 2/3") && job.contains("--agent-keys shared"),
            "{job}"
        );
    }

    /// Malformed messages are errors that say what is wrong, never panics.
    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let good = Message::Done(Box::new(Done {
            start_unix_ns: 1,
            seconds: 1.0,
            distinct_keys: None,
            stats: sample_stats(),
        }))
        .to_line()
        .unwrap_or_else(|e| panic!("{e}"));
        let hist = hist_v2::encode(&new_histogram()).unwrap_or_else(|e| panic!("{e}"));
        let truncated = &good[..good.len() / 2];
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "EOF"),
            ("what".into(), "expected"),
            ("RUN\t--keys\t10".into(), "expected"),
            ("{\"type\":\"launch\"}".into(), "unknown variant"),
            ("{\"type\":\"go\"}".into(), "missing field `delay_ns`"),
            ("{\"type\":\"go\",\"delay_ns\":-1}".into(), "invalid value"),
            (
                "{\"type\":\"pong\",\"unix_ns\":\"now\"}".into(),
                "invalid type",
            ),
            (truncated.to_string(), "EOF"),
            (
                good.replacen("\"issued\":42", "\"issued\":-42", 1),
                "invalid value",
            ),
            (good.replacen("\"ops\":[{", "\"ops\":[", 1), "expected"),
            (
                good.replacen(
                    &format!("\"send_lag\":\"{}", &hist[..4]),
                    "\"send_lag\":\"!!!!",
                    1,
                ),
                "not base64",
            ),
            (
                good.replacen(
                    "\"intervals\":[",
                    &format!("\"intervals\":[{}", format!("\"{hist}\",").repeat(300)),
                    1,
                ),
                "more than the 300",
            ),
        ];
        for (line, want) in &cases {
            match Message::parse(line) {
                Err(e @ ProtocolError::Malformed(_)) => {
                    let text = e.to_string();
                    assert!(
                        text.starts_with("malformed message: ") && text.contains(want),
                        "{line:.200}: {text}"
                    );
                }
                other => panic!("{line:.200}: {other:?}"),
            }
        }
        // A message of the wrong kind at the wrong time names both.
        let e = Message::Ping.unexpected("ready");
        assert_eq!(e.to_string(), "expected ready, got ping");
    }

    /// An agent sent garbage, or a job whose flags do not parse, answers with an `err`
    /// that says so (and serves the next connection).
    #[test]
    fn an_agent_answers_garbage_with_an_error() {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let agent = std::thread::spawn(move || serve(l, Some(3)));
        let ask = |line: &str| {
            let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
            s.write_all(line.as_bytes())
                .unwrap_or_else(|e| panic!("{e}"));
            let mut reply = String::new();
            BufReader::new(s)
                .read_line(&mut reply)
                .unwrap_or_else(|e| panic!("{e}"));
            Message::parse(reply.trim_end()).unwrap_or_else(|e| panic!("{reply:?}: {e}"))
        };
        let err = |m: Message| match m {
            Message::Err { message } => message,
            other => panic!("{other:?}"),
        };
        let garbage = err(ask("RUN\t--keys\t10\n"));
        assert!(
            garbage.starts_with("agent: malformed message: "),
            "{garbage}"
        );
        assert_eq!(
            err(ask("{\"type\":\"ping\"}\n")),
            "agent: expected run, got ping"
        );
        let run = Message::Run {
            args: vec!["--keys".into(), "ten".into(), "127.0.0.1:1".into()],
        };
        let bad_flags = err(ask(&run.to_line().unwrap_or_else(|e| panic!("{e}"))));
        assert!(bad_flags.contains("bad number \"ten\""), "{bad_flags}");
        assert!(agent.join().is_ok_and(|r| r.is_ok()));
    }

    /// Histograms travel in HdrHistogram's V2 format; a header asking for a histogram larger
    /// than kvblast's own is refused before anything is allocated, in a message too.
    #[test]
    fn histograms_travel_as_v2_and_hostile_headers_are_refused() {
        use base64::Engine as _;
        use hdrhistogram::serialization::{Serializer as _, V2Serializer};
        let mut h = new_histogram();
        for v in [1, 1000, 123_456, 99_000_000_000] {
            h.saturating_record(v);
        }
        let data = hist_v2::encode(&h).unwrap_or_else(|e| panic!("{e}"));
        let back = hist_v2::decode(&data, new_histogram()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, h);
        // A histogram of 5 significant figures up to u64::MAX: refused.
        let big = hdrhistogram::Histogram::<u64>::new_with_bounds(1, u64::MAX, 5)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let mut bytes = Vec::new();
        V2Serializer::new()
            .serialize(&big, &mut bytes)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
        assert!(matches!(
            hist_v2::decode(&b64, new_histogram()),
            Err(HistogramDataError::TooLarge { digits: 5, .. })
        ));
        let line = Message::Done(Box::new(Done {
            start_unix_ns: 1,
            seconds: 1.0,
            distinct_keys: None,
            stats: Stats::default(),
        }))
        .to_line()
        .unwrap_or_else(|e| panic!("{e}"));
        let empty = hist_v2::encode(&new_histogram()).unwrap_or_else(|e| panic!("{e}"));
        let hostile = line.replacen(&empty, &b64, 1);
        assert_ne!(hostile, line);
        let e = Message::parse(hostile.trim_end()).map(|_| ());
        assert!(
            matches!(&e, Err(ProtocolError::Malformed(m)) if m.to_string().contains("bounds larger than kvblast's")),
            "{e:?}"
        );
        // A payload length the data does not hold (found by fuzzing: the decoder allocated
        // the length announced, up to 4 GiB), and a compressed or foreign cookie: refused
        // before decoding.
        let mut good = Vec::new();
        V2Serializer::new()
            .serialize(&h, &mut good)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let mut long = good.clone();
        long[4..8].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
        let b64 = base64::engine::general_purpose::STANDARD.encode(&long);
        assert!(matches!(
            hist_v2::decode(&b64, new_histogram()),
            Err(HistogramDataError::PayloadLength {
                declared: 0xffff_fff0,
                ..
            })
        ));
        let mut deflated = good.clone();
        deflated[3] = 0x14;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&deflated);
        assert!(matches!(
            hist_v2::decode(&b64, new_histogram()),
            Err(HistogramDataError::Cookie(0x1c84_9314))
        ));
        // Truncated, empty, not base64.
        let short = base64::engine::general_purpose::STANDARD.encode(&bytes[..10]);
        for bad in [short.as_str(), "", "!!!!"] {
            assert!(hist_v2::decode(bad, new_histogram()).is_err(), "{bad:?}");
        }
    }
}
