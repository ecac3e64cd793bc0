//! Command-line handling in two stages: raw flags into [`Args`], then [`Args::run_config`]
//! builds a validated [`RunConfig`] (preset workload + overrides).

use std::time::Duration;

use crate::capacity::{Metric, Target};
use crate::dist::{Arrival, Dist, Popularity, SizeDist};
use crate::engine::{LoadModel, Protocol, RunConfig, MAX_VALUE};
use crate::route::Routing;
use crate::units::parse_duration;
use crate::workload::{Mix, Workload, PRESETS};

pub const USAGE: &str = "\
kvblast: a workload generator for memcache-protocol servers

USAGE:
  kvblast run [OPTIONS] SERVER...        one run; prints a table (and --json FILE)
  kvblast capacity [OPTIONS] SERVER...   bisect open-loop rates for the highest that meets --slo
  kvblast workloads                      list the built-in workloads
  kvblast plot -o OUT.png|OUT.svg [LABEL=]CAPACITY.json...
                                         capacity searches' p99 and mean latency against
                                         throughput, several servers on one plot (files
                                         with the same LABEL make one curve)
  kvblast agent --listen ADDR [--jobs N] serve load jobs for a master (run --agent ADDR)

SERVER is host[:port] (port 11211 when left out), unix:/path (or /path) for a unix socket,
or udp:host[:port] (text protocol; stats are read over TCP at the same address).

WORKLOAD (a preset, then overrides):
  -w, --workload NAME      etc (default), usr, kvcache-a, kvcache-b, kvcache-c, memaslap,
                           fixedsize, microblog, wiki, imgpreview, friendfeed
      --keys N             number of distinct keys
      --key-size DIST      e.g. 19, uniform:10,40, gev:30.8,8.2,0.079, etc-key, hist:FILE
      --value-size DIST    e.g. 64, normal:1024,266, gpareto:15,214.476,0.348238, etc-value,
                           hist:FILE (lines `SIZE WEIGHT`, # comments; key sizes 1..=250),
                           hist-inline:SIZE:WEIGHT,SIZE:WEIGHT,...
      --value-max N        clamp value sizes to at most N bytes
      --popularity P       uniform | zipf:ALPHA | buckets[:SIZE,ALPHA,XMIN] | sequential
      --mix SPEC           e.g. get=0.9,set=0.1 (kinds: get set delete touch incr)
      --multiget N         keys per get
      --look-aside         a get that misses is followed by a set of the key
      --load               set every key once before the run (not measured)

LOAD:
      --rate R             open loop at R requests/s (default: closed loop)
      --arrival A          poisson (default) | fixed | etc
  -t, --threads N          worker threads, each with its own event loop (default 1)
  -c, --conns N            connections per server per thread (default 1)
  -d, --depth N            closed loop: requests outstanding per connection (default 1);
                           open loop: cap per connection before a request is skipped
                           (default 1000)
  -D, --duration TIME      measured time (default 10s), e.g. 30s, 500ms, 2m
      --warmup TIME        not measured, before the window (default 0)
  -n, --requests N         stop after N measured requests
      --drain TIME         wait this long for outstanding replies at the end (default 1s)
      --slo [M=]TIME       latency objective; run: counts replies over TIME as late
                           (default 1ms); capacity: M is avg, max, p50, p90, p95, p99, p99.9
                           (default avg, KV-Cache's Cap_avg; max gives Cap_max)
      --probe-rate R       also measure with a separate latency probe: one more connection
                           per server, one request at a time, R requests/s (rows probe-*)
      --routing R          ketama (default) | modulo, for several servers
      --protocol P         text (default) | meta (mg/ms/md; multigets as quiet mg + mn) |
                           binary (multigets as GetQ + Noop)
      --seed N             random seed (default 1)

      --config FILE        read flags from a TOML file (keys named like the long flags,
                           servers = [\"host:port\", ...]); the command line
                           overrides it

OUTPUT:
      --json FILE          write the JSON report
      --hdr-log FILE       write each request kind's latency histogram (nanoseconds,
                           whole run) as an HdrHistogram interval log, which
                           HdrHistogram's HistogramLogProcessor and plotters read
      --plot PREFIX        write plots, each as PREFIX-NAME.svg and PREFIX-NAME.png: latency
                           (by percentile), cdf, timeline (throughput), latency-timeline
                           (p50/p99 over time); capacity adds capacity (metric against
                           offered load) and curve (percentiles against throughput)
  -q, --quiet              no progress line
      --no-server-stats    do not read the servers' stats before and after

DISTRIBUTED:
      --agent HOST:PORT    (run; repeatable) split the load with an agent. All participants
                           (this controller and its agents) start together; the controller
                           alone runs --probe-rate and reads the servers' stats
      --agent-keys M       split (default): participant i of N draws only keys k with
                           k mod N = i (popularity conditioned on them) at the share of the
                           rate and requests that those keys' popularity carries, and its
                           --load sets only them; shared: every participant draws from the
                           whole key space at 1/N of the rate, the controller alone loads
      --participant I/N    (set by the controller in an agent's job) this participant's number

CAPACITY:
      --low R --high R     initial bracket (default: 0 and 1.2 x a closed-loop probe)
      --steps N            bisection steps (default 8)
";

/// Raw command-line flags.
#[derive(Debug, Clone, Default)]
pub struct Args {
    pub command: String,
    pub servers: Vec<String>,
    pub workload: Option<String>,
    pub keys: Option<u64>,
    pub key_size: Option<String>,
    pub value_size: Option<String>,
    pub value_max: Option<usize>,
    pub popularity: Option<String>,
    pub mix: Option<String>,
    pub multiget: Option<usize>,
    pub look_aside: bool,
    pub load: bool,
    pub rate: Option<f64>,
    pub arrival: Option<String>,
    pub threads: Option<usize>,
    pub conns: Option<usize>,
    pub depth: Option<usize>,
    pub duration: Option<Duration>,
    pub warmup: Option<Duration>,
    pub requests: Option<u64>,
    pub drain: Option<Duration>,
    pub slo: Option<String>,
    pub routing: Option<String>,
    pub protocol: Option<String>,
    pub seed: Option<u64>,
    pub json: Option<String>,
    /// `--hdr-log FILE`: the latency histograms as an HdrHistogram interval log.
    pub hdr_log: Option<String>,
    pub quiet: bool,
    pub no_server_stats: bool,
    pub low: Option<f64>,
    pub high: Option<f64>,
    pub steps: Option<u32>,
    pub probe_rate: Option<f64>,
    pub plot: Option<String>,
    /// `plot -o FILE`.
    pub output: Option<String>,
    /// `run --agent HOST:PORT` (repeatable): agents that take a share of the load.
    pub agents: Vec<String>,
    /// `agent --listen ADDR`.
    pub listen: Option<String>,
    /// `agent --jobs N`: exit after N jobs.
    pub jobs: Option<u64>,
    /// `run --agent-keys split|shared`.
    pub agent_keys: Option<String>,
    /// `--participant I/N` (in an agent's job): this participant's number and the count.
    pub participant: Option<(u64, u64)>,
}

/// How distributed load divides the key space (`--agent-keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKeys {
    Split,
    Shared,
}

impl AgentKeys {
    pub fn parse(s: &str) -> Result<AgentKeys, String> {
        match s {
            "split" => Ok(AgentKeys::Split),
            "shared" => Ok(AgentKeys::Shared),
            _ => Err(format!("bad --agent-keys {s:?}: split | shared")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AgentKeys::Split => "split",
            AgentKeys::Shared => "shared",
        }
    }
}

fn parse_participant(v: &str) -> Result<(u64, u64), String> {
    let bad = || format!("--participant: expected I/N with I < N, got {v:?}");
    let (i, n) = v.split_once('/').ok_or_else(bad)?;
    let (i, n) = (
        i.trim().parse::<u64>().map_err(|_| bad())?,
        n.trim().parse::<u64>().map_err(|_| bad())?,
    );
    if i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// Turn a config file into flags. The file is TOML (the `toml` crate reads it): keys named
/// like the long flags (`rate = 50000`, `duration = "30s"`, `look-aside = true`; `_` may
/// stand for `-`), with strings, numbers or booleans (`true` gives the flag, `false` leaves
/// it out); `servers = ["host:port", ...]` gives servers. Keys inside `[section]` tables
/// count as if at the top. Flags come in the file's order; the command line's come after,
/// so they win.
pub fn config_flags(text: &str) -> Result<Vec<String>, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("config: {e}"))?;
    let mut out = Vec::new();
    let mut add = |key: &str, v: &toml::Value| -> Result<(), String> {
        let key = key.replace('_', "-");
        let bad = || format!("config: bad value for {key}: {v}");
        match (key.as_str(), v) {
            ("servers", toml::Value::Array(items)) => {
                for item in items {
                    out.push(item.as_str().ok_or_else(bad)?.to_string());
                }
            }
            ("servers", _) => return Err(bad()),
            (_, toml::Value::Boolean(true)) => out.push(format!("--{key}")),
            (_, toml::Value::Boolean(false)) => {}
            (_, toml::Value::String(s)) => out.extend([format!("--{key}"), s.clone()]),
            (_, toml::Value::Integer(n)) => out.extend([format!("--{key}"), n.to_string()]),
            (_, toml::Value::Float(x)) => out.extend([format!("--{key}"), x.to_string()]),
            _ => return Err(bad()),
        }
        Ok(())
    };
    for (key, v) in &table {
        match v {
            toml::Value::Table(section) => {
                for (key, v) in section {
                    add(key, v)?;
                }
            }
            v => add(key, v)?,
        }
    }
    Ok(out)
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.trim()
        .replace('_', "")
        .parse::<T>()
        .map_err(|_| format!("{flag}: bad number {v:?}"))
}

impl Args {
    pub fn parse<I: IntoIterator<Item = String>>(argv: I) -> Result<Args, String> {
        let mut argv: Vec<String> = argv.into_iter().collect();
        // A config file's flags go right after the command, before the command line's own.
        if let Some(i) = argv
            .iter()
            .position(|a| a == "--config" || a.starts_with("--config="))
        {
            let path = match argv[i].split_once('=') {
                Some((_, p)) => p.to_string(),
                None => argv
                    .get(i + 1)
                    .cloned()
                    .ok_or_else(|| "--config needs a file".to_string())?,
            };
            let end = if argv[i].contains('=') { i + 1 } else { i + 2 };
            argv.drain(i..end);
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
            let flags = config_flags(&text).map_err(|e| format!("{path}: {e}"))?;
            let at = 1.min(argv.len());
            argv.splice(at..at, flags);
        }
        let mut it = argv.into_iter().peekable();
        let mut a = Args::default();
        let Some(cmd) = it.next() else {
            return Err("no command".into());
        };
        a.command = cmd;
        while let Some(arg) = it.next() {
            if !arg.starts_with('-') || arg == "-" {
                a.servers.push(arg);
                continue;
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = |name: &str| -> Result<String, String> {
                match &inline {
                    Some(v) => Ok(v.clone()),
                    None => it.next().ok_or_else(|| format!("{name} needs a value")),
                }
            };
            match flag.as_str() {
                "-h" | "--help" => a.command = "help".into(),
                "-w" | "--workload" => a.workload = Some(value(&flag)?),
                "--keys" => a.keys = Some(num(&flag, &value(&flag)?)?),
                "--key-size" => a.key_size = Some(value(&flag)?),
                "--value-size" => a.value_size = Some(value(&flag)?),
                "--value-max" => a.value_max = Some(num(&flag, &value(&flag)?)?),
                "--popularity" => a.popularity = Some(value(&flag)?),
                "--mix" => a.mix = Some(value(&flag)?),
                "--multiget" => a.multiget = Some(num(&flag, &value(&flag)?)?),
                "--look-aside" => a.look_aside = true,
                "--load" => a.load = true,
                "--rate" => a.rate = Some(num(&flag, &value(&flag)?)?),
                "--arrival" => a.arrival = Some(value(&flag)?),
                "-t" | "--threads" => a.threads = Some(num(&flag, &value(&flag)?)?),
                "-c" | "--conns" | "--connections" => a.conns = Some(num(&flag, &value(&flag)?)?),
                "-d" | "--depth" => a.depth = Some(num(&flag, &value(&flag)?)?),
                "-D" | "--duration" => a.duration = Some(parse_duration(&value(&flag)?)?),
                "--warmup" => a.warmup = Some(parse_duration(&value(&flag)?)?),
                "-n" | "--requests" => a.requests = Some(num(&flag, &value(&flag)?)?),
                "--drain" => a.drain = Some(parse_duration(&value(&flag)?)?),
                "--slo" => a.slo = Some(value(&flag)?),
                "--routing" => a.routing = Some(value(&flag)?),
                "--protocol" => a.protocol = Some(value(&flag)?),
                "--seed" => a.seed = Some(num(&flag, &value(&flag)?)?),
                "--json" => a.json = Some(value(&flag)?),
                "--hdr-log" => a.hdr_log = Some(value(&flag)?),
                "-o" | "--output" => a.output = Some(value(&flag)?),
                "--plot" => a.plot = Some(value(&flag)?),
                "--agent" => a.agents.push(value(&flag)?),
                "--listen" => a.listen = Some(value(&flag)?),
                "--jobs" => a.jobs = Some(num(&flag, &value(&flag)?)?),
                "--agent-keys" => {
                    let v = value(&flag)?;
                    AgentKeys::parse(&v)?;
                    a.agent_keys = Some(v);
                }
                "--participant" => a.participant = Some(parse_participant(&value(&flag)?)?),
                "-q" | "--quiet" => a.quiet = true,
                "--no-server-stats" => a.no_server_stats = true,
                "--low" => a.low = Some(num(&flag, &value(&flag)?)?),
                "--high" => a.high = Some(num(&flag, &value(&flag)?)?),
                "--steps" => a.steps = Some(num(&flag, &value(&flag)?)?),
                "--probe-rate" => a.probe_rate = Some(num(&flag, &value(&flag)?)?),
                _ => return Err(format!("unknown option {flag}; see kvblast --help")),
            }
        }
        Ok(a)
    }

    /// The flags that give these arguments back (command, config file and agent-only flags
    /// left out), for sending a job to an agent.
    pub fn to_argv(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        let mut opt = |flag: &str, value: Option<String>| {
            if let Some(x) = value {
                v.push(flag.to_string());
                v.push(x);
            }
        };
        let secs = |d: &Option<Duration>| d.map(|d| format!("{}s", d.as_secs_f64()));
        opt("--workload", self.workload.clone());
        opt("--keys", self.keys.map(|x| x.to_string()));
        opt("--key-size", self.key_size.clone());
        opt("--value-size", self.value_size.clone());
        opt("--value-max", self.value_max.map(|x| x.to_string()));
        opt("--popularity", self.popularity.clone());
        opt("--mix", self.mix.clone());
        opt("--multiget", self.multiget.map(|x| x.to_string()));
        opt("--rate", self.rate.map(|x| x.to_string()));
        opt("--arrival", self.arrival.clone());
        opt("--threads", self.threads.map(|x| x.to_string()));
        opt("--conns", self.conns.map(|x| x.to_string()));
        opt("--depth", self.depth.map(|x| x.to_string()));
        opt("--duration", secs(&self.duration));
        opt("--warmup", secs(&self.warmup));
        opt("--requests", self.requests.map(|x| x.to_string()));
        opt("--drain", secs(&self.drain));
        opt("--slo", self.slo.clone());
        opt("--routing", self.routing.clone());
        opt("--protocol", self.protocol.clone());
        opt("--seed", self.seed.map(|x| x.to_string()));
        opt("--json", self.json.clone());
        opt("--hdr-log", self.hdr_log.clone());
        opt("--plot", self.plot.clone());
        opt("--probe-rate", self.probe_rate.map(|x| x.to_string()));
        opt("--agent-keys", self.agent_keys.clone());
        opt(
            "--participant",
            self.participant.map(|(i, n)| format!("{i}/{n}")),
        );
        for (flag, on) in [
            ("--look-aside", self.look_aside),
            ("--load", self.load),
            ("--quiet", self.quiet),
            ("--no-server-stats", self.no_server_stats),
        ] {
            if on {
                v.push(flag.to_string());
            }
        }
        v.extend(self.servers.iter().cloned());
        v
    }

    /// The workload: the preset, then each override.
    pub fn workload(&self) -> Result<Workload, String> {
        let mut w = Workload::preset(self.workload.as_deref().unwrap_or("etc"))?;
        if let Some(k) = self.keys {
            w.keys = k;
        }
        if let Some(s) = &self.key_size {
            let d = Dist::parse_sizes(s, 1, kvproto::MAX_KEY_LEN as u64)
                .map_err(|e| format!("--key-size: {e}"))?;
            w.key_size = match d {
                Dist::Fixed(v) => SizeDist::fixed(v.max(1.0) as usize),
                Dist::Hist(h) => hist_sizes(h),
                d => SizeDist::new(d, 1, kvproto::MAX_KEY_LEN),
            };
        }
        if let Some(s) = &self.value_size {
            let d = Dist::parse_sizes(s, 0, MAX_VALUE as u64)
                .map_err(|e| format!("--value-size: {e}"))?;
            w.value_size = match d {
                Dist::Fixed(v) => SizeDist::fixed(v.max(0.0) as usize),
                Dist::Hist(h) => hist_sizes(h),
                d => SizeDist::new(d, 0, 1 << 20),
            };
        }
        if let Some(m) = self.value_max {
            w.value_size.max = m;
            w.value_size.min = w.value_size.min.min(m);
        }
        if w.value_size.max > MAX_VALUE {
            return Err(format!("values are limited to {MAX_VALUE} bytes"));
        }
        if let Some(p) = &self.popularity {
            w.popularity = Popularity::parse(p)?;
        }
        if let Some(m) = &self.mix {
            w.mix = Mix::parse(m)?;
        }
        if let Some(m) = self.multiget {
            w.multiget = m;
        }
        Ok(w)
    }

    /// Replace `hist:PATH` size distributions by their contents (`hist-inline:SIZE:W,...`),
    /// so that a job sent to an agent carries the histogram and the agent needs no file.
    pub fn inline_histograms(&mut self) -> Result<(), String> {
        for (flag, spec, lo, hi) in [
            (
                "--key-size",
                &mut self.key_size,
                1,
                kvproto::MAX_KEY_LEN as u64,
            ),
            ("--value-size", &mut self.value_size, 0, MAX_VALUE as u64),
        ] {
            let Some(s) = spec.as_deref() else { continue };
            if !s.trim().starts_with("hist:") {
                continue;
            }
            match Dist::parse_sizes(s, lo, hi).map_err(|e| format!("{flag}: {e}"))? {
                Dist::Hist(h) => *spec = Some(format!("hist-inline:{}", h.to_inline())),
                _ => return Err(format!("{flag}: {s:?} is not a histogram")),
            }
        }
        Ok(())
    }

    /// The latency objective: (metric, threshold). Run uses only the threshold.
    pub fn slo(&self) -> Result<Target, String> {
        match &self.slo {
            None => Ok(Target {
                metric: Metric::Avg,
                limit: Duration::from_millis(1),
            }),
            Some(s) => Target::parse(s),
        }
    }

    /// `--agent-keys`, split by default.
    pub fn agent_keys(&self) -> Result<AgentKeys, String> {
        AgentKeys::parse(self.agent_keys.as_deref().unwrap_or("split"))
    }

    pub fn run_config(&self) -> Result<RunConfig, String> {
        if self.servers.is_empty() {
            return Err("give at least one SERVER (host[:port])".into());
        }
        let mut c = RunConfig::new(self.workload()?, self.servers.clone());
        if let Some(r) = &self.routing {
            c.routing = Routing::parse(r)?;
        }
        if let Some(p) = &self.protocol {
            c.protocol = Protocol::parse(p)?;
        }
        c.threads = self.threads.unwrap_or(1);
        c.conns = self.conns.unwrap_or(1);
        let arrival = Arrival::parse(self.arrival.as_deref().unwrap_or("poisson"))?;
        c.load = match self.rate {
            Some(rate) => LoadModel::Open { rate, arrival },
            None => LoadModel::Closed,
        };
        c.depth = self.depth.unwrap_or(match c.load {
            LoadModel::Closed => 1,
            LoadModel::Open { .. } => 1000,
        });
        if let Some(d) = self.duration {
            c.duration = d;
        } else if self.requests.is_some() {
            c.duration = Duration::ZERO;
        }
        c.warmup = self.warmup.unwrap_or(Duration::ZERO);
        c.requests = self.requests;
        if let Some(d) = self.drain {
            c.drain = d;
        }
        c.slo = self.slo()?.limit;
        c.seed = self.seed.unwrap_or(1);
        c.look_aside = self.look_aside;
        c.load_phase = self.load;
        c.progress = !self.quiet;
        c.probe_rate = self.probe_rate;
        c.split_keys = self.agent_keys()? == AgentKeys::Split;
        if let Some((i, n)) = self.participant {
            c.participant = i;
            c.participants = n;
        }
        c.validate()?;
        Ok(c)
    }
}

/// A histogram's sizes, bounded by its smallest and largest size.
fn hist_sizes(h: std::sync::Arc<crate::dist::SizeHistogram>) -> SizeDist {
    let (min, max) = (h.min_size() as usize, h.max_size() as usize);
    SizeDist::new(Dist::Hist(h), min, max)
}

pub fn list_workloads() -> String {
    let mut s = String::new();
    for name in PRESETS {
        match Workload::preset(name) {
            Ok(w) => {
                s.push_str(&w.describe());
                s.push('\n');
            }
            Err(e) => {
                s.push_str(&e);
                s.push('\n');
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        Args::parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn run_flags_build_a_config() {
        let a = args(
            "run --workload usr --keys 1000 --rate 50000 --arrival fixed -t 2 -c 3 \
             --duration=3s --warmup 1s --slo 500us --mix get=0.5,set=0.5 --look-aside \
             127.0.0.1:11311 127.0.0.1:11312",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let c = a.run_config().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.workload.keys, 1000);
        assert_eq!(c.workload.key_size, SizeDist::fixed(19));
        assert_eq!(
            c.load,
            LoadModel::Open {
                rate: 50000.0,
                arrival: Arrival::Fixed
            }
        );
        assert_eq!((c.threads, c.conns, c.depth), (2, 3, 1000));
        assert_eq!(c.duration, Duration::from_secs(3));
        assert_eq!(c.warmup, Duration::from_secs(1));
        assert_eq!(c.slo, Duration::from_micros(500));
        assert!(c.look_aside);
        assert_eq!(c.servers.len(), 2);
    }

    #[test]
    fn bad_flags_are_errors() {
        assert!(args("run --bogus x").is_err());
        assert!(args("run --keys").is_err());
        assert!(args("run --keys ten").is_err());
        let no_server = args("run").unwrap_or_default();
        assert!(no_server.run_config().is_err());
        let bad_workload = args("run -w nope 127.0.0.1").unwrap_or_default();
        assert!(bad_workload.run_config().is_err());
        let zero_rate = args("run --rate 0 127.0.0.1").unwrap_or_default();
        assert!(zero_rate.run_config().is_err());
    }

    #[test]
    fn config_file_becomes_flags() {
        let text = "# a run\n[run]\nworkload = \"usr\"\nrate = 50_000\nduration = \"3s\" # short\n\
                    look_aside = true\nload = false\nservers = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n";
        let flags = config_flags(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            flags,
            [
                "--workload",
                "usr",
                "--rate",
                "50000",
                "--duration",
                "3s",
                "--look-aside",
                "127.0.0.1:1",
                "127.0.0.1:2"
            ]
        );
        assert!(config_flags("rate = fast").is_err());
        assert!(config_flags("just words").is_err());
        assert!(config_flags("servers = 1").is_err());
        assert!(config_flags("servers = [1]").is_err());
        assert!(config_flags("rate = [1, 2]").is_err());
        assert!(config_flags("rate = 1\nrate = 2").is_err(), "a key twice");
        // The command line wins over the file.
        let dir = std::env::temp_dir().join(format!("kvblast-cli-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("c.toml");
        let _ = std::fs::write(&path, text);
        let a = Args::parse(
            [
                "run",
                "--config",
                path.to_str().unwrap_or(""),
                "--rate",
                "100",
            ]
            .iter()
            .map(|s| s.to_string()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(a.rate, Some(100.0));
        assert_eq!(a.workload.as_deref(), Some("usr"));
        assert!(a.look_aside);
        assert_eq!(a.servers.len(), 2);
    }

    #[test]
    fn to_argv_round_trips() {
        let a = args(
            "run -w usr --keys 10 --rate 100.5 -D 1.5s --warmup 250ms --look-aside \
             --mix get=1 --protocol meta --agent 127.0.0.1:1 h1 h2",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let back = Args::parse(std::iter::once("run".to_string()).chain(a.to_argv()))
            .unwrap_or_else(|e| panic!("{e}"));
        let (c1, c2) = (
            a.run_config().unwrap_or_else(|e| panic!("{e}")),
            back.run_config().unwrap_or_else(|e| panic!("{e}")),
        );
        assert_eq!(c1.workload, c2.workload);
        assert_eq!(c1.load, c2.load);
        assert_eq!((c1.duration, c1.warmup), (c2.duration, c2.warmup));
        assert_eq!(c1.protocol, c2.protocol);
        assert_eq!(c1.servers, c2.servers);
        assert!(c2.look_aside);
        assert!(back.agents.is_empty(), "agents are not passed on");
        let a = args("run --agent-keys shared --participant 2/3 h").unwrap_or_default();
        let back = Args::parse(std::iter::once("run".to_string()).chain(a.to_argv()))
            .unwrap_or_else(|e| panic!("{e}"));
        let c = back.run_config().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((c.participant, c.participants, c.split_keys), (2, 3, false));
        assert!(args("run --participant 3/3 h").is_err());
        assert!(args("run --participant x h").is_err());
        assert!(args("run --agent-keys some h").is_err());
        let few = args("run --keys 2 --participant 0/3 h").unwrap_or_default();
        assert!(few.run_config().is_err(), "a share without keys");
    }

    #[test]
    fn histogram_sizes_from_flags_config_and_inline() {
        let dir = std::env::temp_dir().join(format!("kvblast-cli-hist-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let values = dir.join("values.txt");
        let keys = dir.join("keys.txt");
        let _ = std::fs::write(&values, "# value sizes\n100 3\n300 1\n");
        let _ = std::fs::write(&keys, "20 1\n40 1\n");
        let (vp, kp) = (values.display().to_string(), keys.display().to_string());
        let a = args(&format!(
            "run --value-size hist:{vp} --key-size hist:{kp} h"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let w = a.workload().unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(w.value_size.dist, Dist::Hist(_)), "{w:?}");
        assert_eq!((w.value_size.min, w.value_size.max), (100, 300));
        assert_eq!((w.key_size.min, w.key_size.max), (20, 40));
        assert!(
            w.describe().contains("hist(2 sizes in 100..=300"),
            "{}",
            w.describe()
        );
        // The same through a config file.
        let cfg = dir.join("c.toml");
        let _ = std::fs::write(
            &cfg,
            format!("value_size = \"hist:{vp}\"\nservers = [\"h\"]\n"),
        );
        let c = Args::parse(
            ["run", "--config", &cfg.display().to_string()]
                .iter()
                .map(|s| s.to_string()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.workload().map(|w| w.value_size), Ok(w.value_size.clone()));
        // Resolved to the inline form for agents: no path left, the same workload.
        let mut inl = a.clone();
        inl.inline_histograms().unwrap_or_else(|e| panic!("{e}"));
        let argv = inl.to_argv();
        assert!(
            argv.contains(&"hist-inline:100:3.0,300:1.0".to_string()),
            "{argv:?}"
        );
        assert!(
            !argv.iter().any(|x| x.contains(&vp) || x.contains(&kp)),
            "{argv:?}"
        );
        let back = Args::parse(std::iter::once("run".to_string()).chain(argv))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.workload(), Ok(w));
        // Errors name the flag, the file and the line; keys must be 1..=250.
        let _ = std::fs::write(&keys, "20 1\n251 1\n");
        let e = args(&format!("run --key-size hist:{kp} h"))
            .unwrap_or_default()
            .run_config()
            .map(|_| ());
        assert_eq!(
            e,
            Err(format!("--key-size: {kp}:2: size 251 is outside 1..=250"))
        );
        let _ = std::fs::write(&values, "100 -1\n");
        let mut bad = args(&format!("run --value-size hist:{vp} h")).unwrap_or_default();
        assert!(matches!(bad.workload(), Err(m) if m.contains(&format!("{vp}:1:"))));
        assert!(bad.inline_histograms().is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn value_size_override_and_clamp() {
        let a = args("run --value-size etc-value --value-max 1000 h").unwrap_or_default();
        let w = a.workload().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.value_size.max, 1000);
        assert_eq!(w.value_size.dist, Dist::EtcValue);
    }
}
