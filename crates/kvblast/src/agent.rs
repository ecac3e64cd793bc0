//! Distributed load: `kvblast agent --listen ADDR` runs jobs for a master; `kvblast run
//! --agent HOST:PORT ...` splits the load between itself and its agents and merges their
//! counters into one report (mutilate's master/agent arrangement).
//!
//! The master sends one line, the job's flags separated by tabs (`RUN\t--workload\tetc...`);
//! the agent runs it with [`engine::run`] and answers with its counters in a line-based text
//! form ([`encode_stats`]) ended by `END`, or with `ERR message`. The open-loop rate and any
//! request count are divided evenly between the master and the agents; each gets its own seed;
//! only the master runs the load phase, the latency probe and reads the servers' `stats`.
//! Agents start when their job arrives, so use a warm-up long enough to cover the skew.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::cli::Args;
use crate::engine::{self, LoadModel};
use crate::stats::{new_histogram, OpStats, Report, Stats};

/// The longest job line or reply an agent or master accepts.
const MAX_MESSAGE: u64 = 64 << 20;

fn encode_hist(out: &mut String, name: &str, h: &hdrhistogram::Histogram<u64>) {
    use std::fmt::Write as _;
    let _ = write!(out, "hist {name}");
    for v in h.iter_recorded() {
        let _ = write!(out, " {}:{}", v.value_iterated_to(), v.count_at_value());
    }
    out.push('\n');
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
            "op {i} {} {} {} {} {} {} {} {}\n",
            o.count, o.hits, o.misses, o.errors, o.late, o.total, o.total_keys, o.total_hits
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
                let (Some(o), [count, hits, misses, errors, late, total, keys, total_hits]) =
                    (st.ops.get_mut(i), vals.as_slice())
                else {
                    return Err(format!("bad line {line:?}"));
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
                for pair in f {
                    let (v, c) = pair
                        .split_once(':')
                        .ok_or_else(|| format!("bad pair {pair:?}"))?;
                    h.saturating_record_n(num(v)?, num(c)?);
                }
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
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("agent: {e}"))?;
    let reply = match run_job(line.trim_end_matches(['\r', '\n'])) {
        Ok(st) => encode_stats(&st) + "END\n",
        Err(e) => format!("ERR {}\n", e.replace('\n', " ")),
    };
    let mut conn = conn;
    conn.write_all(reply.as_bytes())
        .map_err(|e| format!("agent: {e}"))
}

fn run_job(line: &str) -> Result<Stats, String> {
    let mut fields = line.split('\t');
    if fields.next() != Some("RUN") {
        return Err("expected RUN".into());
    }
    let argv = std::iter::once("run".to_string()).chain(fields.map(String::from));
    let args = Args::parse(argv)?;
    let cfg = args.run_config()?;
    Ok(engine::run(&cfg)?.stats)
}

/// The job an agent gets: the master's flags with this participant's share.
fn agent_args(args: &Args, index: usize, participants: usize) -> Vec<String> {
    let mut a = args.clone();
    a.agents.clear();
    a.json = None;
    a.plot = None;
    a.load = false;
    a.probe_rate = None;
    a.quiet = true;
    a.no_server_stats = true;
    a.rate = args.rate.map(|r| r / participants as f64);
    a.requests = args.requests.map(|n| n / participants as u64);
    a.seed = Some(args.seed.unwrap_or(1).wrapping_add(1 + index as u64));
    a.to_argv()
}

/// Run `args` split between this process and `args.agents`, merging every participant's
/// counters into the master's report.
pub fn run_with_agents(args: &Args) -> Result<Report, String> {
    let participants = args.agents.len() + 1;
    let mut mine = args.clone();
    mine.agents.clear();
    mine.rate = args.rate.map(|r| r / participants as f64);
    // The master takes the remainder of an uneven request count.
    mine.requests = args
        .requests
        .map(|n| n - (n / participants as u64) * (participants as u64 - 1));
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
        s.set_read_timeout(Some(wait))
            .map_err(|e| format!("agent {agent}: {e}"))?;
        conns.push((agent.clone(), s));
    }
    let mut jobs = Vec::new();
    for i in 0..conns.len() {
        let job = agent_args(args, i, participants);
        if job.iter().any(|a| a.contains(['\t', '\n'])) {
            return Err("flags sent to agents may not contain tabs or newlines".into());
        }
        jobs.push(format!("RUN\t{}\n", job.join("\t")));
    }
    for ((agent, s), line) in conns.iter_mut().zip(&jobs) {
        s.write_all(line.as_bytes())
            .map_err(|e| format!("agent {agent}: {e}"))?;
    }
    let mut report = engine::run(&cfg)?;
    for (agent, s) in conns {
        let mut text = String::new();
        s.take(MAX_MESSAGE)
            .read_to_string(&mut text)
            .map_err(|e| format!("agent {agent}: {e}"))?;
        if let Some(e) = text.strip_prefix("ERR ") {
            return Err(format!("agent {agent}: {}", e.trim_end()));
        }
        let Some(body) = text.strip_suffix("END\n") else {
            return Err(format!("agent {agent}: truncated reply"));
        };
        report.stats.merge(&decode_stats(body)?);
    }
    if let (Some(rate), LoadModel::Open { .. }) = (args.rate, cfg.load) {
        report.target_rate = Some(rate);
    }
    report.settings.push((
        "agents".into(),
        format!(
            "{} (each participant sends 1/{participants} of the load)",
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
        st.send_lag.saturating_record(5000);
        let back = decode_stats(&encode_stats(&st)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.issued, 42);
        assert_eq!(back.dropped, 3);
        assert_eq!(back.window_ns, 7);
        let b = back.op(Op::Get);
        assert_eq!((b.count, b.hits, b.total_keys), (4, 3, 9));
        assert_eq!(b.hist.len(), 4);
        assert_eq!(b.hist.max(), g_max(&st));
        assert_eq!(back.send_lag.len(), 1);
    }

    fn g_max(st: &Stats) -> u64 {
        st.op(Op::Get).hist.max()
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
}
