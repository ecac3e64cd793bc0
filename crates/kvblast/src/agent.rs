//! Distributed load: `kvblast agent --listen ADDR` runs jobs for a controller; `kvblast run
//! --agent HOST:PORT ...` splits the load between itself and its agents, starts everyone
//! together, and merges their counters and histograms into one report (mutilate's
//! master/agent arrangement).
//!
//! The controller sends one line, the job's flags separated by tabs (`RUN\t--workload\tetc...`,
//! with `--participant I/N` and the participant's rate and request count); the agent connects,
//! runs its load phase and answers `READY`; once every participant is ready the controller
//! pings each agent and sends `GO <delay>` so that all start at one instant (see
//! [`run_with_agents`]); the agent runs with [`engine::run_synced`] and answers with
//! `DONE ...`, its counters in a line-based text form ([`encode_stats`]) and `END`, or with
//! `ERR message`. With `--agent-keys split` (the default) participant i of N draws only the
//! keys k with k mod N = i and sets only those in its load phase; the rate and the request
//! count are divided in proportion to each share's popularity mass, so the union of the
//! participants' requests has the workload's popularity. Every participant uses the same
//! `--seed` for the key space (sizes, bucket shuffle) and its own random streams. Only the
//! controller runs the latency probe and reads the servers' `stats`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::cli::{AgentKeys, Args};
use crate::dist::KeyChooser;
use crate::engine::{self, LoadModel};
use crate::stats::{new_histogram, OpStats, Participant, Report, Stats};

/// The longest job line or reply an agent or master accepts.
const MAX_MESSAGE: u64 = 64 << 20;

/// `hist NAME DATA`: the histogram in HdrHistogram's V2 format (the one its Java, C and Go
/// implementations read), base64-encoded. V2 without deflate, so that a receiver can check
/// the header's bounds before it allocates anything.
fn encode_hist(out: &mut String, name: &str, h: &hdrhistogram::Histogram<u64>) {
    use base64::Engine as _;
    use hdrhistogram::serialization::{Serializer as _, V2Serializer};
    let mut bytes = Vec::new();
    if V2Serializer::new().serialize(h, &mut bytes).is_err() {
        return; // only fails on a histogram it cannot represent; none here
    }
    out.push_str("hist ");
    out.push_str(name);
    out.push(' ');
    base64::engine::general_purpose::STANDARD.encode_string(&bytes, out);
    out.push('\n');
}

/// The inverse of [`encode_hist`]'s DATA, from a peer that may send anything: the V2 header
/// must describe a histogram no larger than kvblast's own (at most 3 significant figures,
/// values from 1 to [`crate::stats::HIST_MAX_NS`]) before it is decoded.
fn decode_hist(data: &str) -> Result<hdrhistogram::Histogram<u64>, String> {
    use base64::Engine as _;
    let bad = |why: &str| format!("bad histogram data: {why}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|_| bad("not base64"))?;
    let field = |at: usize, len: usize| -> Result<u64, String> {
        let b = bytes.get(at..at + len).ok_or_else(|| bad("short header"))?;
        Ok(b.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x)))
    };
    // V2 header: cookie, payload length, normalizing offset, significant figures, lowest
    // and highest trackable values, conversion ratio; all big-endian.
    let (digits, lowest, highest) = (field(12, 4)?, field(16, 8)?, field(24, 8)?);
    if digits > 3 || lowest < 1 || highest > crate::stats::HIST_MAX_NS {
        return Err(bad("bounds larger than kvblast's"));
    }
    hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| bad(&format!("{e:?}")))
}

/// A worker's counters as text: `stat NAME VALUE`, `op I count hits misses errors late total
/// total_keys total_hits`, `hist NAME VALUE:COUNT ...`.
pub fn encode_stats(st: &Stats) -> String {
    let mut out = String::new();
    for (name, v) in [
        ("late_sends", st.late_sends),
        ("skipped", st.skipped),
        ("timeouts", st.timeouts),
        ("lost", st.lost),
        ("conn_failures", st.conn_failures),
        ("dropped", st.dropped),
        ("misrouted", st.misrouted),
        ("issued", st.issued),
        ("loaded", st.loaded),
        ("load_retries", st.load_retries),
        ("reconnects", st.reconnects),
        ("unsent", st.unsent),
        ("window_ns", st.window_ns),
        ("interval_ns", st.interval_ns),
    ] {
        out.push_str(&format!("stat {name} {v}\n"));
    }
    for (i, o) in st.ops.iter().enumerate() {
        out.push_str(&format!(
            "op {i} {} {} {} {} {} {} {} {} {} {}\n",
            o.count,
            o.hits,
            o.misses,
            o.errors,
            o.late,
            o.total,
            o.total_keys,
            o.total_hits,
            o.hit_bytes,
            o.miss_bytes
        ));
        encode_hist(&mut out, &format!("op{i}"), &o.hist);
    }
    encode_hist(&mut out, "lag", &st.send_lag);
    for (i, h) in st.intervals.iter().enumerate() {
        encode_hist(&mut out, &format!("iv{i}"), h);
    }
    out
}

fn num(s: &str) -> Result<u64, String> {
    s.parse::<u64>().map_err(|_| format!("bad number {s:?}"))
}

/// The inverse of [`encode_stats`]. Malformed input is an error, never a panic.
pub fn decode_stats(text: &str) -> Result<Stats, String> {
    let mut st = Stats::default();
    for line in text.lines() {
        let mut f = line.split(' ');
        match f.next() {
            Some("stat") => {
                let (Some(name), Some(v)) = (f.next(), f.next()) else {
                    return Err(format!("bad line {line:?}"));
                };
                let v = num(v)?;
                let slot = match name {
                    "late_sends" => &mut st.late_sends,
                    "skipped" => &mut st.skipped,
                    "timeouts" => &mut st.timeouts,
                    "lost" => &mut st.lost,
                    "conn_failures" => &mut st.conn_failures,
                    "dropped" => &mut st.dropped,
                    "misrouted" => &mut st.misrouted,
                    "issued" => &mut st.issued,
                    "loaded" => &mut st.loaded,
                    "load_retries" => &mut st.load_retries,
                    "reconnects" => &mut st.reconnects,
                    "unsent" => &mut st.unsent,
                    "window_ns" => &mut st.window_ns,
                    "interval_ns" => &mut st.interval_ns,
                    _ => continue, // a newer agent's counter: ignore
                };
                *slot = v;
            }
            Some("op") => {
                let i = f.next().map(num).transpose()?.unwrap_or(u64::MAX) as usize;
                let vals: Vec<u64> = f.map(num).collect::<Result<_, _>>()?;
                // An older agent sends no byte counts.
                let (
                    Some(o),
                    [count, hits, misses, errors, late, total, keys, total_hits, rest @ ..],
                ) = (st.ops.get_mut(i), vals.as_slice())
                else {
                    return Err(format!("bad line {line:?}"));
                };
                let (hit_bytes, miss_bytes) = match rest {
                    [] => (0, 0),
                    [h, m] => (*h, *m),
                    _ => return Err(format!("bad line {line:?}")),
                };
                let hist = std::mem::replace(&mut o.hist, new_histogram());
                *o = OpStats {
                    hist,
                    count: *count,
                    hits: *hits,
                    misses: *misses,
                    errors: *errors,
                    late: *late,
                    total: *total,
                    total_keys: *keys,
                    total_hits: *total_hits,
                    hit_bytes,
                    miss_bytes,
                };
            }
            Some("hist") => {
                let name = f.next().unwrap_or("");
                let h = if name == "lag" {
                    &mut st.send_lag
                } else if let Some(i) = name.strip_prefix("iv") {
                    let i = i
                        .parse::<usize>()
                        .ok()
                        .filter(|&i| i < crate::stats::MAX_INTERVALS)
                        .ok_or_else(|| format!("bad histogram {name:?}"))?;
                    while st.intervals.len() <= i {
                        st.intervals.push(crate::stats::new_interval_histogram());
                    }
                    &mut st.intervals[i]
                } else {
                    let i = name
                        .strip_prefix("op")
                        .and_then(|i| i.parse::<usize>().ok())
                        .ok_or_else(|| format!("bad histogram {name:?}"))?;
                    match st.ops.get_mut(i) {
                        Some(o) => &mut o.hist,
                        None => return Err(format!("bad histogram {name:?}")),
                    }
                };
                let data = f
                    .next()
                    .ok_or_else(|| format!("histogram {name:?} without data"))?;
                h.add(decode_hist(data)?)
                    .map_err(|e| format!("histogram {name:?}: {e:?}"))?;
            }
            Some("") | None => {}
            Some(other) => return Err(format!("unknown line kind {other:?}")),
        }
    }
    Ok(st)
}

/// Serve jobs on `listener`, one connection at a time; stop after `jobs` jobs if given.
pub fn serve(listener: TcpListener, jobs: Option<u64>) -> Result<(), String> {
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

fn serve_one(conn: TcpStream) -> Result<(), String> {
    let mut reader = BufReader::new(
        conn.try_clone()
            .map_err(|e| format!("agent: {e}"))?
            .take(MAX_MESSAGE),
    );
    let mut writer = conn;
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("agent: {e}"))?;
    let reply = match run_job(
        line.trim_end_matches(['\r', '\n']),
        &mut reader,
        &mut writer,
    ) {
        Ok(text) => text,
        Err(e) => format!("ERR {}\n", e.replace('\n', " ")),
    };
    writer
        .write_all(reply.as_bytes())
        .map_err(|e| format!("agent: {e}"))
}

/// Wall-clock nanoseconds since the Unix epoch, now.
fn unix_ns() -> u64 {
    engine::unix_ns_at(Instant::now())
}

/// Read one line (without its end); an error at the end of the stream.
fn read_line(reader: &mut impl BufRead, what: &str) -> Result<String, String> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => Err(format!("{what}: connection closed")),
        Ok(_) => Ok(line.trim_end_matches(['\r', '\n']).to_string()),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Run one job: connect and load, say `READY`, answer `PING`s, start when `GO` says, and
/// return the reply (`DONE` line, counters, `END`).
fn run_job(
    line: &str,
    reader: &mut impl BufRead,
    writer: &mut TcpStream,
) -> Result<String, String> {
    let mut fields = line.split('\t');
    if fields.next() != Some("RUN") {
        return Err("expected RUN".into());
    }
    let argv = std::iter::once("run".to_string()).chain(fields.map(String::from));
    let args = Args::parse(argv)?;
    let cfg = args.run_config()?;
    // The controller may take its own load phase, and wait for the other agents', before
    // saying GO; a controller that goes away closes the connection.
    let _ = writer.set_read_timeout(Some(cfg.load_timeout * 2 + Duration::from_secs(60)));
    let mut sync = || -> Result<Instant, String> {
        writer
            .write_all(b"READY\n")
            .map_err(|e| format!("agent: {e}"))?;
        loop {
            let l = read_line(reader, "agent: waiting for GO")?;
            let received = Instant::now();
            match l.split_once(' ') {
                None if l == "PING" => writer
                    .write_all(format!("PONG {}\n", unix_ns()).as_bytes())
                    .map_err(|e| format!("agent: {e}"))?,
                Some(("GO", ns)) => return Ok(received + Duration::from_nanos(num(ns)?)),
                _ => return Err(format!("agent: expected PING or GO, got {l:?}")),
            }
        }
    };
    let r = engine::run_synced(&cfg, &mut sync)?;
    Ok(format!(
        "DONE {} {} {}\n{}END\n",
        r.start_unix_ns,
        r.seconds,
        r.distinct_keys
            .map(|k| k.to_string())
            .unwrap_or_else(|| "-".into()),
        encode_stats(&r.stats)
    ))
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
fn shares(args: &Args, participants: usize) -> Result<Vec<Share>, String> {
    let n = participants as u64;
    let fractions = match args.agent_keys()? {
        AgentKeys::Split => {
            let w = args.workload()?;
            if w.keys < n {
                return Err(format!(
                    "splitting {} keys between {n} participants leaves one without keys \
                     (use more keys or --agent-keys shared)",
                    w.keys
                ));
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
    fn err(&self, e: impl std::fmt::Display) -> String {
        format!("agent {}: {e}", self.name)
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| self.err(e))
    }

    fn line(&mut self, timeout: Duration) -> Result<String, String> {
        let _ = self.writer.set_read_timeout(Some(timeout));
        read_line(&mut self.reader, &format!("agent {}", self.name))
    }

    /// Wait for `READY` (the agent has connected and run its load phase).
    fn ready(&mut self, timeout: Duration) -> Result<(), String> {
        let l = self.line(timeout)?;
        match l.strip_prefix("ERR ") {
            Some(e) => Err(self.err(e)),
            None if l == "READY" => Ok(()),
            None => Err(self.err(format!("expected READY, got {l:?}"))),
        }
    }

    /// Ping a few times; keep the fastest round trip and the clock offset it gives
    /// (Cristian's method: the agent read its clock half a round trip after we sent).
    fn ping(&mut self) -> Result<(), String> {
        self.rtt = Duration::MAX;
        for _ in 0..PINGS {
            let (sent, sent_ns) = (Instant::now(), unix_ns());
            self.send("PING\n")?;
            let l = self.line(Duration::from_secs(5))?;
            let rtt = sent.elapsed();
            let theirs = l
                .strip_prefix("PONG ")
                .ok_or_else(|| self.err(format!("expected PONG, got {l:?}")))
                .and_then(|t| num(t).map_err(|e| self.err(e)))?;
            if rtt < self.rtt {
                self.rtt = rtt;
                self.offset_ns = theirs as i64 - (sent_ns + rtt.as_nanos() as u64 / 2) as i64;
            }
        }
        Ok(())
    }
}

/// Pings per agent before the start.
const PINGS: usize = 3;

/// The start is this long after the controller decides it (plus two of the slowest round
/// trips): time to send every agent its `GO`.
const START_LEAD: Duration = Duration::from_millis(20);

/// Run `args` split between this process and `args.agents`, merging every participant's
/// counters into the controller's report.
///
/// Protocol, per agent: `RUN\t<flags>` →; ← `READY` once the agent has connected and run its
/// load phase (or `ERR ...`); when every agent and the controller are ready, `PING` → ←
/// `PONG <wall ns>` a few times, then `GO <delay ns>` →, and the agent starts that long
/// after it read the line: the delay is the common start instant less the time already
/// passed and half the agent's round trip, so every participant starts at the same moment
/// (to within the asymmetry of the network's delays). ← `DONE <start wall ns> <seconds>
/// <distinct keys>`, the counters, `END`.
pub fn run_with_agents(args: &Args) -> Result<Report, String> {
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
            .map_err(|e| format!("agent {agent}: {e}"))?
            .next()
            .ok_or_else(|| format!("agent {agent}: no address"))?;
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| format!("agent {agent}: cannot connect to {addr}: {e}"))?;
        let _ = s.set_nodelay(true);
        let r = s.try_clone().map_err(|e| format!("agent {agent}: {e}"))?;
        conns.push(AgentConn {
            name: agent.clone(),
            reader: BufReader::new(r.take(MAX_MESSAGE)),
            writer: s,
            rtt: Duration::ZERO,
            offset_ns: 0,
        });
    }
    let mut jobs = Vec::new();
    for (i, share) in shares.iter().enumerate().skip(1) {
        let job = agent_args(args, i, participants, share);
        if job.iter().any(|a| a.contains(['\t', '\n'])) {
            return Err("flags sent to agents may not contain tabs or newlines".into());
        }
        jobs.push(format!("RUN\t{}\n", job.join("\t")));
    }
    for (a, line) in conns.iter_mut().zip(&jobs) {
        a.send(line)?;
    }
    // Called once this process has connected and loaded: wait for every agent to be ready
    // too, then start everyone together.
    let ready_wait = cfg.load_timeout + Duration::from_secs(60);
    let mut sync = || -> Result<Instant, String> {
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
            a.send(&format!("GO {}\n", delay.as_nanos()))?;
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
        let head = a.line(wait)?;
        if let Some(e) = head.strip_prefix("ERR ") {
            return Err(a.err(e));
        }
        let done: Vec<&str> = head.split(' ').collect();
        let ["DONE", start_ns, seconds, keys] = done.as_slice() else {
            return Err(a.err(format!("expected DONE, got {head:?}")));
        };
        let start_ns = num(start_ns).map_err(|e| a.err(e))?;
        let seconds: f64 = seconds
            .parse()
            .map_err(|_| a.err(format!("bad seconds {seconds:?}")))?;
        let keys = match *keys {
            "-" => None,
            k => Some(num(k).map_err(|e| a.err(e))?),
        };
        let mut text = String::new();
        a.reader.read_to_string(&mut text).map_err(|e| a.err(e))?;
        let Some(body) = text.strip_suffix("END\n") else {
            return Err(a.err("truncated reply"));
        };
        let st = decode_stats(body).map_err(|e| a.err(e))?;
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
    use crate::workload::Op;

    #[test]
    fn stats_round_trip() {
        let mut st = Stats {
            issued: 42,
            dropped: 3,
            window_ns: 7,
            ..Default::default()
        };
        let g = &mut st.ops[Op::Get.index()];
        for v in [1000u64, 2000, 2000, 1_000_000] {
            g.hist.saturating_record(v);
        }
        g.count = 4;
        g.hits = 3;
        g.total_keys = 9;
        g.hit_bytes = 300;
        g.miss_bytes = 20;
        st.send_lag.saturating_record(5000);
        let back = decode_stats(&encode_stats(&st)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.issued, 42);
        assert_eq!(back.dropped, 3);
        assert_eq!(back.window_ns, 7);
        let b = back.op(Op::Get);
        assert_eq!((b.count, b.hits, b.total_keys), (4, 3, 9));
        assert_eq!((b.hit_bytes, b.miss_bytes), (300, 20));
        assert_eq!(b.hist.len(), 4);
        assert_eq!(b.hist.max(), g_max(&st));
        assert_eq!(back.send_lag.len(), 1);
    }

    fn g_max(st: &Stats) -> u64 {
        st.op(Op::Get).hist.max()
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

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            "stat issued x",
            "op 9 1 2 3 4 5 6 7 8",
            "op 0 1 2",
            "hist op7 1:1",
            "hist op0 1-1",
            "hist op0 1:x",
            "what",
        ] {
            assert!(decode_stats(bad).is_err(), "{bad}");
        }
        assert!(decode_stats("stat future_counter 5\n").is_ok());
    }

    /// Histograms travel in HdrHistogram's V2 format; a header asking for a histogram larger
    /// than kvblast's own is refused before anything is allocated.
    #[test]
    fn histograms_travel_as_v2_and_hostile_headers_are_refused() {
        use base64::Engine as _;
        use hdrhistogram::serialization::{Serializer as _, V2Serializer};
        let mut h = new_histogram();
        for v in [1, 1000, 123_456, 99_000_000_000] {
            h.saturating_record(v);
        }
        let mut line = String::new();
        encode_hist(&mut line, "op0", &h);
        let data = line.trim_end().rsplit(' ').next().unwrap_or("");
        let back = decode_hist(data).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, h);
        // A histogram of 5 significant figures up to u64::MAX: refused.
        let big = hdrhistogram::Histogram::<u64>::new_with_bounds(1, u64::MAX, 5)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let mut bytes = Vec::new();
        V2Serializer::new()
            .serialize(&big, &mut bytes)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
        assert!(decode_hist(&b64).is_err());
        // Truncated, empty, not base64.
        let short = base64::engine::general_purpose::STANDARD.encode(&bytes[..10]);
        for bad in [short.as_str(), "", "!!!!"] {
            assert!(decode_hist(bad).is_err(), "{bad:?}");
        }
    }
}
