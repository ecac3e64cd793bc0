//! Command-line handling in two stages: raw flags into [`Args`], then [`Args::run_config`]
//! builds a validated [`RunConfig`] (preset workload + overrides).

use std::time::Duration;

use crate::capacity::{Metric, Target, TargetError};
use crate::dist::{Arrival, Dist, DistError, Popularity, SizeDist};
use crate::engine::{ConfigError, LoadModel, Protocol, RunConfig, MAX_VALUE};
use crate::route::Routing;
use crate::stats::Pipeline;
use crate::transport::TransportError;
use crate::units::{parse_duration, BadChoice};
use crate::workload::{Mix, Workload, WorkloadError, PRESETS};

/// A command line (or config file) that does not give a run.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// clap's own message (an unknown flag, a missing value, a value parser's error).
    #[error("{}", clap_message(.0))]
    Flags(#[source] clap::Error),
    #[error("bad number {0:?}")]
    Number(String),
    #[error("--participant: expected I/N with I < N, got {0:?}")]
    Participant(String),
    #[error("--config needs a file")]
    ConfigPath,
    #[error("{path}: {source}")]
    ConfigRead {
        path: String,
        source: std::io::Error,
    },
    /// What is wrong in a config file, after its path.
    #[error("{path}: {source}")]
    ConfigFile { path: String, source: Box<CliError> },
    #[error("config: {0}")]
    ConfigSyntax(#[source] toml::de::Error),
    #[error("config: bad value for {key}: {value}")]
    ConfigValue { key: String, value: toml::Value },
    #[error("give at least one SERVER (host[:port])")]
    NoServer,
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// `--key-size` or `--value-size`.
    #[error("{flag}: {source}")]
    Sizes {
        flag: &'static str,
        source: DistError,
    },
    #[error("{flag}: {spec:?} is not a histogram")]
    NotHistogram { flag: &'static str, spec: String },
    #[error("--exptime-max {max} is below --exptime {exptime}")]
    ExptimeMax { max: i64, exptime: i64 },
    #[error("values are limited to {MAX_VALUE} bytes")]
    ValueSize,
    #[error(transparent)]
    Dist(#[from] DistError),
    #[error(transparent)]
    Choice(#[from] BadChoice),
    #[error(transparent)]
    Slo(#[from] TargetError),
    #[error(transparent)]
    Tls(#[from] TransportError),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// clap's message without its `error: ` prefix and final newline.
fn clap_message(e: &clap::Error) -> String {
    let msg = e.render().to_string();
    let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
    msg.trim_end().to_string()
}

/// What `kvblast` and `kvblast --help` print about servers, after the commands.
const SERVERS_HELP: &str = "\
SERVER is host[:port] (port 11211 when left out), unix:/path (or /path) for a unix socket,
or udp:host[:port] (text protocol; stats are read over TCP at the same address).";

/// kvblast: a workload generator for memcache-protocol servers.
#[derive(Debug, clap::Parser)]
#[command(name = "kvblast", version, after_help = SERVERS_HELP, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: CliCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CliCommand {
    /// One run; prints a table (and --json FILE, --plot PREFIX, --hdr-log FILE)
    #[command(after_help = SERVERS_HELP, args_override_self = true)]
    Run(Args),
    /// Bisect open-loop rates for the highest that meets --slo
    #[command(after_help = SERVERS_HELP, args_override_self = true)]
    Capacity(Args),
    /// List the built-in workloads
    #[command(args_override_self = true)]
    Workloads(Args),
    /// Draw saved results: capacity reports (--json) as p99 and mean latency against
    /// throughput, several servers on one chart (files with the same LABEL are one server's
    /// rounds), or HdrHistogram logs (--hdr-log) as one percentile plot:
    /// kvblast plot -o OUT.png|OUT.svg [--slo S] [LABEL=]FILE...
    #[command(args_override_self = true)]
    Plot(Args),
    /// Capacity of two or more servers with the same workload, in alternating rounds:
    /// medians, ratios to the first, one chart of all (-o OUT.png|OUT.svg; --plot PREFIX
    /// adds PREFIX-percentiles, each server's best run of its median round):
    /// kvblast compare [options] [LABEL=]SERVER [LABEL=]SERVER...
    #[command(after_help = SERVERS_HELP, args_override_self = true)]
    Compare(Args),
    /// Serve load jobs for a controller (run --agent ADDR): kvblast agent --listen ADDR
    #[command(args_override_self = true)]
    Agent(Args),
}

/// Parse a number, allowing `_` between digits (`50_000`).
fn number<T: std::str::FromStr>(v: &str) -> Result<T, CliError> {
    v.trim()
        .replace('_', "")
        .parse::<T>()
        .map_err(|_| CliError::Number(v.into()))
}

fn pipeline(v: &str) -> Result<String, BadChoice> {
    Pipeline::parse(v).map(|_| v.to_string())
}

fn agent_keys(v: &str) -> Result<String, BadChoice> {
    AgentKeys::parse(v).map(|_| v.to_string())
}

/// kvblast's help (`kvblast --help`), as clap renders it.
pub fn usage() -> String {
    use clap::CommandFactory;
    Cli::command().render_help().to_string()
}

/// The command line: every command's flags (each command uses the ones that concern it),
/// parsed by clap; `command` and `help` come from the subcommand. (`config` is read and
/// removed before parsing; it is here for `--help`.)
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Args {
    /// The command (`run`, `capacity`, ...), or `help` when help was asked for.
    #[arg(skip)]
    pub command: String,
    /// The help text asked for (`--help`, `run --help`): print it and stop.
    #[arg(skip)]
    pub help: Option<String>,
    /// Servers (see below); for plot, [LABEL=]CAPACITY.json files
    #[arg(value_name = "SERVER")]
    pub servers: Vec<String>,

    /// Workload preset: etc (default), usr, kvcache-a, kvcache-b, kvcache-c, memaslap,
    /// fixedsize, microblog, wiki, imgpreview, friendfeed
    #[arg(
        short = 'w',
        long,
        value_name = "NAME",
        help_heading = "Workload (a preset, then overrides)"
    )]
    pub workload: Option<String>,
    /// Number of distinct keys
    #[arg(long, value_name = "N", value_parser = number::<u64>, help_heading = "Workload (a preset, then overrides)")]
    pub keys: Option<u64>,
    /// Key sizes, e.g. 19, uniform:10,40, gev:30.8,8.2,0.079, etc-key, hist:FILE
    #[arg(
        long,
        value_name = "DIST",
        help_heading = "Workload (a preset, then overrides)"
    )]
    pub key_size: Option<String>,
    /// Value sizes, e.g. 64, normal:1024,266, gpareto:15,214.476,0.348238, etc-value,
    /// hist:FILE (lines `SIZE WEIGHT`, # comments; key sizes 1..=250),
    /// hist-inline:SIZE:WEIGHT,SIZE:WEIGHT,...
    #[arg(
        long,
        value_name = "DIST",
        help_heading = "Workload (a preset, then overrides)"
    )]
    pub value_size: Option<String>,
    /// Give each key one value size, drawn once from --value-size by the key (as a real
    /// key's value keeps its size), instead of a fresh size at every set
    #[arg(long, help_heading = "Workload (a preset, then overrides)")]
    pub value_size_per_key: bool,
    /// Clamp value sizes to at most N bytes
    #[arg(long, value_name = "N", value_parser = number::<usize>, help_heading = "Workload (a preset, then overrides)")]
    pub value_max: Option<usize>,
    /// Expiry time sets and touches give (memcached's exptime: seconds up to 30 days, else
    /// a unix time; negative: already expired); default 0, never
    #[arg(long, value_name = "SECONDS", value_parser = number::<i64>, allow_hyphen_values = true, help_heading = "Workload (a preset, then overrides)")]
    pub exptime: Option<i64>,
    /// With --exptime, draw each set's and touch's expiry time uniformly from --exptime to
    /// this many seconds (times to live of mixed lengths, e.g. `--exptime 1 --exptime-max 60`)
    #[arg(long, value_name = "SECONDS", value_parser = number::<i64>, requires = "exptime", help_heading = "Workload (a preset, then overrides)")]
    pub exptime_max: Option<i64>,
    /// Key popularity: uniform | zipf:ALPHA | buckets[:SIZE,ALPHA,XMIN] | sequential
    #[arg(
        long,
        value_name = "P",
        help_heading = "Workload (a preset, then overrides)"
    )]
    pub popularity: Option<String>,
    /// Request mix, e.g. get=0.9,set=0.1 (kinds: get set delete touch incr gat)
    #[arg(
        long,
        value_name = "SPEC",
        help_heading = "Workload (a preset, then overrides)"
    )]
    pub mix: Option<String>,
    /// Keys per get
    #[arg(long, value_name = "N", value_parser = number::<usize>, help_heading = "Workload (a preset, then overrides)")]
    pub multiget: Option<usize>,
    /// A get that misses is followed by a set of the key
    #[arg(long, help_heading = "Workload (a preset, then overrides)")]
    pub look_aside: bool,
    /// Set every key once before the run (not measured)
    #[arg(long, help_heading = "Workload (a preset, then overrides)")]
    pub load: bool,

    /// Open loop at R requests/s (default: closed loop)
    #[arg(long, value_name = "R", value_parser = number::<f64>, help_heading = "Load")]
    pub rate: Option<f64>,
    /// Arrivals: poisson (default) | fixed | etc
    #[arg(long, value_name = "A", help_heading = "Load")]
    pub arrival: Option<String>,
    /// Worker threads, each with its own event loop (default 1)
    #[arg(short = 't', long, value_name = "N", value_parser = number::<usize>, help_heading = "Load")]
    pub threads: Option<usize>,
    /// Connections per server per thread (default 1)
    #[arg(short = 'c', long, alias = "connections", value_name = "N", value_parser = number::<usize>, help_heading = "Load")]
    pub conns: Option<usize>,
    /// Closed loop: requests outstanding per connection (default 1); open loop: cap per
    /// connection before a request is skipped (default 1000)
    #[arg(short = 'd', long, value_name = "N", value_parser = number::<usize>, help_heading = "Load")]
    pub depth: Option<usize>,
    /// How a closed loop keeps --depth requests outstanding on a connection: window
    /// (default: a new request as soon as a reply arrives) | batch (send --depth requests,
    /// wait for all their replies, then send the next --depth: memtier_benchmark's
    /// --pipeline; latency from the batch's send). Closed loop only
    #[arg(long, value_name = "MODE", value_parser = pipeline, help_heading = "Load")]
    pub pipeline: Option<String>,
    /// Measured time (default 10s), e.g. 30s, 500ms, 1.5s, 2m, 1m30s
    #[arg(short = 'D', long, value_name = "TIME", value_parser = parse_duration, help_heading = "Load")]
    pub duration: Option<Duration>,
    /// Not measured, before the window (default 0)
    #[arg(long, value_name = "TIME", value_parser = parse_duration, help_heading = "Load")]
    pub warmup: Option<Duration>,
    /// Stop after N measured requests
    #[arg(short = 'n', long, value_name = "N", value_parser = number::<u64>, help_heading = "Load")]
    pub requests: Option<u64>,
    /// Close each connection after N requests and open a new one (memtier_benchmark's
    /// --reconnect-interval): clients that connect per request or per page (default: never)
    #[arg(long, value_name = "N", value_parser = number::<u64>, help_heading = "Load")]
    pub reconnect_interval: Option<u64>,
    /// Wait this long for outstanding replies at the end (default 1s)
    #[arg(long, value_name = "TIME", value_parser = parse_duration, help_heading = "Load")]
    pub drain: Option<Duration>,
    /// Latency objective; run: counts replies over TIME as late (default 1ms); capacity: M is
    /// avg, max, p50, p90, p95, p99, p99.9 (default avg, KV-Cache's Cap_avg; max gives
    /// Cap_max)
    #[arg(long, value_name = "[M=]TIME", help_heading = "Load")]
    pub slo: Option<String>,
    /// Also measure with a separate latency probe: one more connection per server, one
    /// request at a time, R requests/s (rows probe-*)
    #[arg(long, value_name = "R", value_parser = number::<f64>, help_heading = "Load")]
    pub probe_rate: Option<f64>,
    /// Key-to-server map for several servers: ketama (default) | modulo
    #[arg(long, value_name = "R", help_heading = "Load")]
    pub routing: Option<String>,
    /// text (default) | meta (mg/ms/md; multigets as quiet mg + mn) | binary (multigets as
    /// GetQ + Noop)
    #[arg(long, value_name = "P", help_heading = "Load")]
    pub protocol: Option<String>,

    /// Connect to every TCP server over TLS, checking its certificate against --tls-ca
    #[arg(long, help_heading = "TLS")]
    pub tls: bool,
    /// The CA (PEM) the servers' certificates chain to (implies --tls)
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM), for servers that require one (implies --tls)
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The client certificate's key (default: in the --tls-cert file)
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The name the servers' certificates must carry (default: the address connected to)
    #[arg(long, value_name = "NAME", help_heading = "TLS")]
    pub tls_name: Option<String>,
    /// Accept any server certificate (benchmarks against a test server only; implies --tls)
    #[arg(long, help_heading = "TLS")]
    pub tls_insecure: bool,
    /// Random seed (default 1)
    #[arg(long, value_name = "N", value_parser = number::<u64>, help_heading = "Load")]
    pub seed: Option<u64>,
    /// Read flags from a TOML file (keys named like the long flags, servers = ["host:port",
    /// ...]); the command line overrides it
    #[arg(long, value_name = "FILE", help_heading = "Load")]
    pub config: Option<String>,

    /// Write the JSON report
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub json: Option<String>,
    /// Write each request kind's latency histogram (nanoseconds, whole run) as an
    /// HdrHistogram interval log, which HdrHistogram's HistogramLogProcessor and plotters
    /// read
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub hdr_log: Option<String>,
    /// Write plots, each as PREFIX-NAME.svg and PREFIX-NAME.png: latency (by percentile),
    /// cdf, timeline (throughput), latency-timeline (p50/p99 over time); capacity adds
    /// capacity (metric against offered load) and curve (percentiles against throughput)
    #[arg(long, value_name = "PREFIX", help_heading = "Output")]
    pub plot: Option<String>,
    /// plot: the output file (.png or .svg)
    #[arg(short = 'o', long, value_name = "FILE", help_heading = "Output")]
    pub output: Option<String>,
    /// No progress line
    #[arg(short = 'q', long, help_heading = "Output")]
    pub quiet: bool,
    /// Do not read the servers' stats before and after
    #[arg(long, help_heading = "Output")]
    pub no_server_stats: bool,

    /// (run; repeatable) split the load with an agent. All participants (this controller and
    /// its agents) start together; the controller alone runs --probe-rate and reads the
    /// servers' stats
    #[arg(long = "agent", value_name = "HOST:PORT", help_heading = "Distributed")]
    pub agents: Vec<String>,
    /// split (default): participant i of N draws only keys k with k mod N = i (popularity
    /// conditioned on them) at the share of the rate and requests that those keys'
    /// popularity carries, and its --load sets only them; shared: every participant draws
    /// from the whole key space at 1/N of the rate, the controller alone loads
    #[arg(long, value_name = "M", value_parser = agent_keys, help_heading = "Distributed")]
    pub agent_keys: Option<String>,
    /// (set by the controller in an agent's job) this participant's number
    #[arg(long, value_name = "I/N", value_parser = parse_participant, help_heading = "Distributed")]
    pub participant: Option<(u64, u64)>,
    /// agent: the address to listen on
    #[arg(long, value_name = "ADDR", help_heading = "Distributed")]
    pub listen: Option<String>,
    /// agent: exit after N jobs
    #[arg(long, value_name = "N", value_parser = number::<u64>, help_heading = "Distributed")]
    pub jobs: Option<u64>,

    /// capacity: initial bracket, low end (default 0)
    #[arg(long, value_name = "R", value_parser = number::<f64>, help_heading = "Capacity")]
    pub low: Option<f64>,
    /// capacity: initial bracket, high end (default 1.2 x a closed-loop probe)
    #[arg(long, value_name = "R", value_parser = number::<f64>, help_heading = "Capacity")]
    pub high: Option<f64>,
    /// capacity: bisection steps (default 8)
    #[arg(long, value_name = "N", value_parser = number::<u32>, help_heading = "Capacity")]
    pub steps: Option<u32>,
    /// compare: rounds, each server once per round, the order reversed every other round
    /// (default 3)
    #[arg(long, value_name = "N", value_parser = number::<u32>, help_heading = "Capacity")]
    pub rounds: Option<u32>,
}

/// How distributed load divides the key space (`--agent-keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKeys {
    Split,
    Shared,
}

impl AgentKeys {
    pub fn parse(s: &str) -> Result<AgentKeys, BadChoice> {
        match s {
            "split" => Ok(AgentKeys::Split),
            "shared" => Ok(AgentKeys::Shared),
            _ => Err(BadChoice {
                setting: "--agent-keys",
                given: s.to_string(),
                choices: "split | shared",
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AgentKeys::Split => "split",
            AgentKeys::Shared => "shared",
        }
    }
}

fn parse_participant(v: &str) -> Result<(u64, u64), CliError> {
    let bad = || CliError::Participant(v.into());
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
pub fn config_flags(text: &str) -> Result<Vec<String>, CliError> {
    let table: toml::Table = text.parse().map_err(CliError::ConfigSyntax)?;
    let mut out = Vec::new();
    let mut add = |key: &str, v: &toml::Value| -> Result<(), CliError> {
        let key = key.replace('_', "-");
        let bad = || CliError::ConfigValue {
            key: key.clone(),
            value: v.clone(),
        };
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

impl Args {
    pub fn parse<I: IntoIterator<Item = String>>(argv: I) -> Result<Args, CliError> {
        let mut argv: Vec<String> = argv.into_iter().collect();
        // A config file's flags go right after the command, before the command line's own.
        if let Some(i) = argv
            .iter()
            .position(|a| a == "--config" || a.starts_with("--config="))
        {
            let path = match argv[i].split_once('=') {
                Some((_, p)) => p.to_string(),
                None => argv.get(i + 1).cloned().ok_or(CliError::ConfigPath)?,
            };
            let end = if argv[i].contains('=') { i + 1 } else { i + 2 };
            argv.drain(i..end);
            let text = std::fs::read_to_string(&path).map_err(|source| CliError::ConfigRead {
                path: path.clone(),
                source,
            })?;
            let flags = config_flags(&text).map_err(|e| CliError::ConfigFile {
                path: path.clone(),
                source: Box::new(e),
            })?;
            let at = 1.min(argv.len());
            argv.splice(at..at, flags);
        }
        use clap::Parser as _;
        let cli = match Cli::try_parse_from(std::iter::once("kvblast".to_string()).chain(argv)) {
            Ok(cli) => cli,
            Err(e) => {
                use clap::error::ErrorKind;
                return match e.kind() {
                    ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Ok(Args {
                        command: "help".into(),
                        help: Some(e.render().to_string()),
                        ..Args::default()
                    }),
                    _ => Err(CliError::Flags(e)),
                };
            }
        };
        let (command, mut a) = match cli.command {
            CliCommand::Run(a) => ("run", a),
            CliCommand::Capacity(a) => ("capacity", a),
            CliCommand::Workloads(a) => ("workloads", a),
            CliCommand::Plot(a) => ("plot", a),
            CliCommand::Compare(a) => ("compare", a),
            CliCommand::Agent(a) => ("agent", a),
        };
        a.command = command.to_string();
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
        opt("--exptime", self.exptime.map(|x| x.to_string()));
        opt("--exptime-max", self.exptime_max.map(|x| x.to_string()));
        opt("--popularity", self.popularity.clone());
        opt("--mix", self.mix.clone());
        opt("--multiget", self.multiget.map(|x| x.to_string()));
        opt("--rate", self.rate.map(|x| x.to_string()));
        opt("--arrival", self.arrival.clone());
        opt("--threads", self.threads.map(|x| x.to_string()));
        opt("--conns", self.conns.map(|x| x.to_string()));
        opt("--depth", self.depth.map(|x| x.to_string()));
        opt("--pipeline", self.pipeline.clone());
        opt("--duration", secs(&self.duration));
        opt("--warmup", secs(&self.warmup));
        opt("--requests", self.requests.map(|x| x.to_string()));
        opt("--drain", secs(&self.drain));
        opt(
            "--reconnect-interval",
            self.reconnect_interval.map(|x| x.to_string()),
        );
        opt("--slo", self.slo.clone());
        opt("--routing", self.routing.clone());
        opt("--protocol", self.protocol.clone());
        let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
        opt("--tls-ca", path(&self.tls_ca));
        opt("--tls-cert", path(&self.tls_cert));
        opt("--tls-key", path(&self.tls_key));
        opt("--tls-name", self.tls_name.clone());
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
            ("--value-size-per-key", self.value_size_per_key),
            ("--load", self.load),
            ("--quiet", self.quiet),
            ("--no-server-stats", self.no_server_stats),
            ("--tls", self.tls),
            ("--tls-insecure", self.tls_insecure),
        ] {
            if on {
                v.push(flag.to_string());
            }
        }
        v.extend(self.servers.iter().cloned());
        v
    }

    /// The workload: the preset, then each override.
    pub fn workload(&self) -> Result<Workload, CliError> {
        let mut w = Workload::preset(self.workload.as_deref().unwrap_or("etc"))?;
        if let Some(k) = self.keys {
            w.keys = k;
        }
        if let Some(s) = &self.key_size {
            let d = Dist::parse_sizes(s, 1, kvproto::MAX_KEY_LEN as u64).map_err(|source| {
                CliError::Sizes {
                    flag: "--key-size",
                    source,
                }
            })?;
            w.key_size = match d {
                Dist::Fixed(v) => SizeDist::fixed(v.max(1.0) as usize),
                Dist::Hist(h) => hist_sizes(h),
                d => SizeDist::new(d, 1, kvproto::MAX_KEY_LEN),
            };
        }
        if let Some(s) = &self.value_size {
            let d =
                Dist::parse_sizes(s, 0, MAX_VALUE as u64).map_err(|source| CliError::Sizes {
                    flag: "--value-size",
                    source,
                })?;
            w.value_size = match d {
                Dist::Fixed(v) => SizeDist::fixed(v.max(0.0) as usize),
                Dist::Hist(h) => hist_sizes(h),
                d => SizeDist::new(d, 0, 1 << 20),
            };
        }
        if self.value_size_per_key {
            w.value_per_key = true;
        }
        if let Some(m) = self.value_max {
            w.value_size.max = m;
            w.value_size.min = w.value_size.min.min(m);
        }
        if let Some(e) = self.exptime {
            w.exptime = e;
            w.exptime_max = e;
        }
        if let Some(m) = self.exptime_max {
            if m < w.exptime {
                return Err(CliError::ExptimeMax {
                    max: m,
                    exptime: w.exptime,
                });
            }
            w.exptime_max = m;
        }
        if w.value_size.max > MAX_VALUE {
            return Err(CliError::ValueSize);
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
    pub fn inline_histograms(&mut self) -> Result<(), CliError> {
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
            match Dist::parse_sizes(s, lo, hi).map_err(|source| CliError::Sizes { flag, source })? {
                Dist::Hist(h) => *spec = Some(format!("hist-inline:{}", h.to_inline())),
                _ => {
                    return Err(CliError::NotHistogram {
                        flag,
                        spec: s.into(),
                    })
                }
            }
        }
        Ok(())
    }

    /// The latency objective: (metric, threshold). Run uses only the threshold.
    pub fn slo(&self) -> Result<Target, TargetError> {
        match &self.slo {
            None => Ok(Target {
                metric: Metric::Avg,
                limit: Duration::from_millis(1),
            }),
            Some(s) => Target::parse(s),
        }
    }

    /// The TLS settings, when any `--tls*` option is given.
    pub fn tls_settings(&self) -> Option<kvtls::client::Settings> {
        let any = self.tls
            || self.tls_insecure
            || self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_key.is_some()
            || self.tls_name.is_some();
        any.then(|| kvtls::client::Settings {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            server_name: self.tls_name.clone(),
            insecure: self.tls_insecure,
        })
    }

    /// `--pipeline`, window by default.
    pub fn pipeline(&self) -> Result<Pipeline, BadChoice> {
        Pipeline::parse(self.pipeline.as_deref().unwrap_or("window"))
    }

    /// `--agent-keys`, split by default.
    pub fn agent_keys(&self) -> Result<AgentKeys, BadChoice> {
        AgentKeys::parse(self.agent_keys.as_deref().unwrap_or("split"))
    }

    pub fn run_config(&self) -> Result<RunConfig, CliError> {
        if self.servers.is_empty() {
            return Err(CliError::NoServer);
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
        c.pipeline = self.pipeline()?;
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
        c.reconnect_interval = self.reconnect_interval;
        c.split_keys = self.agent_keys()? == AgentKeys::Split;
        c.tls = self
            .tls_settings()
            .map(crate::transport::Tls::new)
            .transpose()?;
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
                s.push_str(&e.to_string());
                s.push('\n');
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, CliError> {
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
        // A repeated flag: the last wins; --agent adds up.
        let a = args("run --rate 1 --rate 2 --agent a:1 --agent b:2 h").unwrap_or_default();
        assert_eq!((a.rate, a.agents.len()), (Some(2.0), 2));
        // Help is an answer, not an error.
        let h = args("run --help").unwrap_or_default();
        assert_eq!(h.command, "help");
        assert!(h.help.unwrap_or_default().contains("--look-aside"));
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
             --mix get=1 --protocol meta --exptime 60 --agent 127.0.0.1:1 h1 h2",
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
        assert_eq!(c2.workload.exptime, 60);
        assert!(back.agents.is_empty(), "agents are not passed on");
        let mixed = args("run --exptime 1 --exptime-max 60 h").unwrap_or_default();
        let w = mixed.run_config().map(|c| c.workload).ok();
        assert_eq!(w.map(|w| (w.exptime, w.exptime_max)), Some((1, 60)));
        let bad = args("run --exptime 10 --exptime-max 5 h").unwrap_or_default();
        assert!(bad.run_config().is_err());
        assert!(args("run --exptime-max 5 h").is_err(), "needs --exptime");
        let past = args("run --exptime -1 h").unwrap_or_default();
        assert_eq!(past.run_config().map(|c| c.workload.exptime).ok(), Some(-1));
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
        assert_eq!(
            c.workload().map(|w| w.value_size).ok(),
            Some(w.value_size.clone())
        );
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
        assert_eq!(back.workload().ok(), Some(w));
        // Errors name the flag, the file and the line; keys must be 1..=250.
        let _ = std::fs::write(&keys, "20 1\n251 1\n");
        let e = args(&format!("run --key-size hist:{kp} h"))
            .unwrap_or_default()
            .run_config()
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err(format!("--key-size: {kp}:2: size 251 is outside 1..=250"))
        );
        let _ = std::fs::write(&values, "100 -1\n");
        let mut bad = args(&format!("run --value-size hist:{vp} h")).unwrap_or_default();
        assert!(matches!(bad.workload(), Err(m) if m.to_string().contains(&format!("{vp}:1:"))));
        assert!(bad.inline_histograms().is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What the user reads: clap's message without its prefix, the config file's path,
    /// the flag a size distribution came from.
    #[test]
    fn errors_say_what_is_wrong() {
        let msg = |s: &str| match args(s).and_then(|a| a.run_config()) {
            Ok(_) => panic!("{s} accepted"),
            Err(e) => e.to_string(),
        };
        let unknown = msg("run --bogus x h");
        assert!(
            unknown.starts_with("unexpected argument '--bogus'"),
            "{unknown}"
        );
        assert!(msg("run --keys ten h").contains("bad number \"ten\""));
        assert_eq!(msg("run"), "give at least one SERVER (host[:port])");
        assert_eq!(
            msg("run --routing ring h"),
            "bad routing \"ring\": ketama | modulo"
        );
        assert_eq!(
            msg("run --protocol udp h"),
            "bad protocol \"udp\": text | meta | binary"
        );
        assert_eq!(
            msg("run --value-size nope h"),
            "--value-size: unknown distribution \"nope\""
        );
        assert_eq!(msg("run --rate 0 h"), "rate must be positive");
        assert_eq!(
            msg("run --exptime 10 --exptime-max 5 h"),
            "--exptime-max 5 is below --exptime 10"
        );
        let missing = msg("run --config /nonexistent/kvblast.toml h");
        assert!(
            missing.starts_with("/nonexistent/kvblast.toml: "),
            "{missing}"
        );
        assert!(matches!(
            args("run --config /nonexistent/kvblast.toml h"),
            Err(CliError::ConfigRead { .. })
        ));
        assert_eq!(
            config_flags("servers = 1").map_err(|e| e.to_string()),
            Err("config: bad value for servers: 1".into())
        );
    }

    /// `--pipeline`: window by default, batch for a closed loop (depth is the batch), and
    /// refused with an open loop; it travels to agents.
    #[test]
    fn pipeline_mode_flag() {
        let c = |s: &str| args(s).and_then(|a| a.run_config());
        let w = c("run -d 8 h").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((w.pipeline, w.depth), (Pipeline::Window, 8));
        let b = c("run -d 8 --pipeline batch h").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((b.pipeline, b.depth), (Pipeline::Batch, 8));
        assert!(b.settings().iter().any(|(_, v)| v.contains("batches of 8")));
        let udp =
            c("run -w usr -d 4 --pipeline batch udp:127.0.0.1:1").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(udp.pipeline, Pipeline::Batch);
        let open = c("run --rate 100 --pipeline batch h").map(|_| ());
        assert!(
            matches!(open, Err(CliError::Config(ConfigError::BatchOpenLoop))),
            "{open:?}"
        );
        let bad = args("run --pipeline burst h")
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            bad.as_ref()
                .is_err_and(|e| e.contains("bad --pipeline \"burst\": window | batch")),
            "{bad:?}"
        );
        let a = args("run -d 3 --pipeline batch --agent 127.0.0.1:1 h").unwrap_or_default();
        let argv = a.to_argv();
        assert!(
            argv.windows(2).any(|w| w == ["--pipeline", "batch"]),
            "{argv:?}"
        );
        let back = Args::parse(std::iter::once("run".to_string()).chain(argv))
            .and_then(|a| a.run_config())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((back.pipeline, back.depth), (Pipeline::Batch, 3));
    }

    #[test]
    fn value_size_override_and_clamp() {
        let a = args("run --value-size etc-value --value-max 1000 h").unwrap_or_default();
        let w = a.workload().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.value_size.max, 1000);
        assert_eq!(w.value_size.dist, Dist::EtcValue);
    }
}
