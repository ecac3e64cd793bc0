//! `kvblast capacity`: the highest open-loop rate whose run meets a latency objective, by
//! bisection over short runs.
//!
//! A rate passes when the run's metric (over all request kinds) is within the limit, the
//! generator kept its schedule (did not fall behind), at least 99% of the requests sent in the
//! window were answered in it or the drain, and nothing timed out, failed or errored. KV-Cache's Cap_avg is `avg=1ms`,
//! its Cap_max is `max=1ms`; IX reports p95/p99 capacities (`p99=1ms`). With
//! `--probe-rate`, the metric is taken from the latency probe's requests (IX's method: an
//! unloaded client measures latency while the others make the load); otherwise from all
//! requests.

use std::fmt::Write as _;
use std::time::Duration;

use crate::engine::{self, LoadModel, RunConfig};
use serde::{Deserialize, Serialize};

use crate::stats::{to_json, Num, Num1, OpStats, Pipeline, Report, RunReport, Summary};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Metric {
    Avg,
    Max,
    /// A percentile in (0, 100).
    Percentile(f64),
}

impl Metric {
    pub fn name(&self) -> String {
        match self {
            Metric::Avg => "avg".into(),
            Metric::Max => "max".into(),
            Metric::Percentile(p) => format!("p{p}"),
        }
    }

    /// The metric's value in µs over some requests.
    pub fn of(&self, o: &OpStats) -> f64 {
        let h = &o.hist;
        if h.is_empty() {
            return 0.0;
        }
        match self {
            Metric::Avg => h.mean() / 1000.0,
            Metric::Max => h.max() as f64 / 1000.0,
            Metric::Percentile(p) => h.value_at_quantile(p / 100.0) as f64 / 1000.0,
        }
    }
}

/// A latency objective (`--slo`) that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("bad SLO metric {0:?}: avg, max, p50, p99, p99.9")]
    Metric(String),
    #[error("bad percentile {0:?}")]
    Percentile(String),
    #[error(transparent)]
    Time(#[from] crate::units::DurationError),
}

/// Why a capacity search could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error(transparent)]
    Run(#[from] engine::EngineError),
    #[error("bad bracket: low {low} >= high {high}")]
    Bracket { low: f64, high: f64 },
    #[error(
        "a capacity search runs open-loop rates, and --pipeline batch is closed-loop only \
         (here --depth is each connection's cap): drop --pipeline batch"
    )]
    Batch,
}

/// A latency objective, e.g. `p99=1ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub metric: Metric,
    pub limit: Duration,
}

impl Target {
    /// Parse `[METRIC=]TIME` with METRIC avg, max, or pNN (p99, p99.9, ...); default avg.
    pub fn parse(s: &str) -> Result<Target, TargetError> {
        let (m, t) = match s.split_once('=') {
            Some((m, t)) => (m.trim(), t),
            None => ("avg", s),
        };
        let metric = match m {
            "avg" | "mean" => Metric::Avg,
            "max" => Metric::Max,
            _ => {
                let p: f64 = m
                    .strip_prefix('p')
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| TargetError::Metric(m.into()))?;
                if !(p > 0.0 && p < 100.0) {
                    return Err(TargetError::Percentile(m.into()));
                }
                Metric::Percentile(p)
            }
        };
        Ok(Target {
            metric,
            limit: crate::units::parse_duration(t)?,
        })
    }

    pub fn describe(&self) -> String {
        format!("{}<={:?}", self.metric.name(), self.limit)
    }
}

/// One bisection step.
#[derive(Debug, Clone)]
pub struct Step {
    pub rate: f64,
    pub achieved: f64,
    pub metric_us: f64,
    pub pass: bool,
    pub why: String,
    /// The step's latencies (the probe's with `--probe-rate`, else all requests'), for the
    /// latency-against-throughput curve.
    pub latency: Latencies,
}

/// Latency summary of one step, in µs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latencies {
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Latencies {
    /// The latencies of the requests the objective is judged on.
    pub fn of(r: &Report) -> Latencies {
        let o = match &r.probe {
            Some(p) if p.all().count > 0 => p.all(),
            _ => r.stats.all(),
        };
        let m = |metric: Metric| metric.of(&o);
        Latencies {
            mean_us: m(Metric::Avg),
            p50_us: m(Metric::Percentile(50.0)),
            p99_us: m(Metric::Percentile(99.0)),
            p999_us: m(Metric::Percentile(99.9)),
            max_us: m(Metric::Max),
        }
    }
}

/// The outcome of a capacity search.
#[derive(Debug, Clone)]
pub struct Capacity {
    pub target: Target,
    /// The steps' pipelining (always a window: they are open-loop runs) and cap of
    /// requests outstanding per connection.
    pub pipeline: Pipeline,
    pub depth: usize,
    pub steps: Vec<Step>,
    /// The highest passing rate (0 if none passed).
    pub capacity: f64,
    /// The report of the run at that rate.
    pub best: Option<Report>,
}

/// Judge one run against the target.
pub fn judge(r: &Report, target: &Target) -> (bool, f64, String) {
    let all = Summary::of("all", &r.stats.all(), r.seconds);
    // With a latency probe, latency is the probe's (IX's method); without, all requests'.
    let m = match &r.probe {
        Some(p) if p.all().count > 0 => target.metric.of(&p.all()),
        _ => target.metric.of(&r.stats.all()),
    };
    let limit_us = target.limit.as_secs_f64() * 1e6;
    let st = &r.stats;
    let why = if st.timeouts + st.lost + st.conn_failures + st.dropped > 0 {
        format!(
            "timeouts {} lost {} failures {} dropped {}",
            st.timeouts, st.lost, st.conn_failures, st.dropped
        )
    } else if all.errors > 0 {
        format!("{} error replies", all.errors)
    } else if r.fell_behind() {
        "generator fell behind".into()
    } else if (all.count as f64) < 0.99 * st.issued as f64 {
        format!("only {} of {} requests answered", all.count, st.issued)
    } else if m > limit_us {
        format!("{} {m:.1}µs > {limit_us:.1}µs", target.metric.name())
    } else {
        String::new()
    };
    (why.is_empty(), m, why)
}

/// Bisect between `low` and `high` (requests/s) for `steps` steps; `high` defaults to 1.2 ×
/// the throughput of a closed-loop probe with the same connections.
pub fn search(
    base: &RunConfig,
    target: Target,
    low: Option<f64>,
    high: Option<f64>,
    steps: u32,
    mut on_step: impl FnMut(&Step),
) -> Result<Capacity, CapacityError> {
    if base.pipeline == Pipeline::Batch {
        return Err(CapacityError::Batch);
    }
    let arrival = match base.load {
        LoadModel::Open { arrival, .. } => arrival,
        LoadModel::Closed => crate::dist::Arrival::Poisson,
    };
    let mut lo = low.unwrap_or(0.0).max(0.0);
    let mut hi = match high {
        Some(h) => h,
        None => {
            let mut probe = base.clone();
            probe.load = LoadModel::Closed;
            probe.depth = 4;
            probe.progress = false;
            probe.duration = base.duration.min(Duration::from_secs(2));
            probe.warmup = Duration::ZERO;
            let r = engine::run(&probe)?;
            let x = r.stats.all().count as f64 / r.seconds.max(1e-9);
            1.2 * x.max(1.0)
        }
    };
    if hi <= lo {
        return Err(CapacityError::Bracket { low: lo, high: hi });
    }
    let mut out = Capacity {
        target,
        pipeline: Pipeline::Window,
        depth: base.depth.max(1000),
        steps: Vec::new(),
        capacity: 0.0,
        best: None,
    };
    let mut loaded = false;
    for _ in 0..steps.max(1) {
        let rate = if out.steps.is_empty() && low.is_some() {
            lo.max(1.0)
        } else {
            (lo + hi) / 2.0
        };
        let mut cfg = base.clone();
        cfg.load = LoadModel::Open { rate, arrival };
        cfg.depth = out.depth;
        cfg.progress = false;
        cfg.slo = target.limit;
        // The load phase needs doing once.
        cfg.load_phase = base.load_phase && !loaded;
        loaded = true;
        let r = engine::run(&cfg)?;
        let (pass, m, why) = judge(&r, &target);
        let achieved = r.stats.all().count as f64 / r.seconds.max(1e-9);
        let step = Step {
            rate,
            achieved,
            metric_us: m,
            pass,
            why,
            latency: Latencies::of(&r),
        };
        on_step(&step);
        out.steps.push(step);
        if pass {
            lo = rate;
            if rate >= out.capacity {
                out.capacity = rate;
                out.best = Some(r);
            }
        } else {
            hi = rate;
        }
        if (hi - lo) / hi.max(1.0) < 0.01 {
            break;
        }
    }
    Ok(out)
}

impl Capacity {
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "capacity search, SLO {} (open loop, pipeline {}, cap {} per connection)",
            self.target.describe(),
            self.pipeline.name(),
            self.depth
        );
        let _ = writeln!(
            s,
            "{:>4}{:>12}{:>12}{:>12}  result",
            "step", "target/s", "achieved/s", "metric µs"
        );
        for (i, st) in self.steps.iter().enumerate() {
            let _ = writeln!(
                s,
                "{:>4}{:>12.0}{:>12.0}{:>12.1}  {}",
                i + 1,
                st.rate,
                st.achieved,
                st.metric_us,
                if st.pass {
                    "pass".to_string()
                } else {
                    format!("FAIL: {}", st.why)
                }
            );
        }
        let _ = writeln!(
            s,
            "capacity ({}): {:.0} req/s",
            self.target.describe(),
            self.capacity
        );
        if let Some(b) = &self.best {
            s.push_str("\nrun at capacity:\n");
            s.push_str(&b.table());
        }
        s
    }

    /// The JSON report's contents ([`CapacityReport`]).
    pub fn report(&self) -> CapacityReport {
        CapacityReport {
            slo: self.target.describe(),
            pipeline: self.pipeline,
            depth: self.depth as u64,
            capacity: Num1::of(self.capacity),
            steps: self
                .steps
                .iter()
                .map(|st| StepReport {
                    rate: Num1::of(st.rate),
                    achieved: Num1::of(st.achieved),
                    metric_us: Num::of(st.metric_us),
                    pass: st.pass,
                    why: st.why.clone(),
                    mean_us: Num::of(st.latency.mean_us),
                    p50_us: Num::of(st.latency.p50_us),
                    p99_us: Num::of(st.latency.p99_us),
                    p999_us: Num::of(st.latency.p999_us),
                    max_us: Num::of(st.latency.max_us),
                })
                .collect(),
            best: self.best.as_ref().map(Report::report),
        }
    }

    /// The JSON report (`capacity --json`): [`Capacity::report`], pretty-printed.
    pub fn json(&self) -> String {
        to_json(&self.report())
    }
}

/// A capacity search's JSON report (`kvblast capacity --json`), which `kvblast plot` reads
/// back (all but `best`; fields an older report lacks take their defaults, but a step's
/// throughput and latencies are required).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CapacityReport {
    /// The objective (`p99<=1ms`).
    #[serde(default = "unknown_slo")]
    pub slo: String,
    /// The steps' pipelining: `window` (open-loop steps; older reports lack it).
    #[serde(default)]
    pub pipeline: Pipeline,
    /// The steps' cap of requests outstanding per connection (0: not recorded).
    #[serde(default)]
    pub depth: u64,
    /// The highest passing rate.
    #[serde(default)]
    pub capacity: Num1,
    pub steps: Vec<StepReport>,
    /// The run at capacity.
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub best: Option<RunReport>,
}

fn unknown_slo() -> String {
    "?".into()
}

/// One step of a capacity search.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepReport {
    #[serde(default)]
    pub rate: Num1,
    pub achieved: Num1,
    #[serde(default)]
    pub metric_us: Num,
    #[serde(default)]
    pub pass: bool,
    #[serde(default)]
    pub why: String,
    pub mean_us: Num,
    pub p50_us: Num,
    pub p99_us: Num,
    pub p999_us: Num,
    pub max_us: Num,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats_with(latency_us: u64, n: u64) -> crate::stats::Stats {
        let mut st = crate::stats::Stats::default();
        let g = &mut st.ops[crate::workload::Op::Get.index()];
        for _ in 0..n {
            g.hist.saturating_record(latency_us * 1000);
        }
        g.count = n;
        g.total = n;
        st.issued = n;
        st
    }

    #[test]
    fn judge_uses_the_probe_when_there_is_one() {
        let target = Target::parse("p99=1ms").unwrap_or_else(|e| panic!("{e}"));
        let mut r = Report {
            settings: vec![],
            pipeline: Pipeline::Window,
            depth: 1,
            seconds: 1.0,
            target_rate: Some(1000.0),
            slo_us: 1000.0,
            stats: stats_with(100, 1000),
            probe: None,
            timeline: vec![],
            load_seconds: None,
            server: None,
            start_unix_ns: 0,
            distinct_keys: None,
            participants: Vec::new(),
        };
        let (pass, m, _) = judge(&r, &target);
        assert!(pass && (m - 100.0).abs() < 1.0, "{m}");
        r.probe = Some(stats_with(2000, 100));
        let (pass, m, why) = judge(&r, &target);
        assert!(!pass && (m - 2000.0).abs() < 5.0, "{m} {why}");
        // Unanswered requests fail a step whatever the latency.
        r.probe = None;
        r.stats.issued = 2000;
        assert!(!judge(&r, &target).0);
    }

    #[test]
    fn the_json_report_is_what_it_was() {
        let target = Target::parse("p99=1ms").unwrap_or_else(|e| panic!("{e}"));
        let step = |rate: f64, pass| Step {
            rate,
            achieved: rate * 0.987_65,
            metric_us: 812.345_6,
            pass,
            why: if pass {
                String::new()
            } else {
                "p99 over".into()
            },
            latency: Latencies {
                mean_us: 100.0,
                p50_us: 90.5,
                p99_us: 812.345_6,
                p999_us: f64::INFINITY,
                max_us: 2000.0,
            },
        };
        let c = Capacity {
            target,
            pipeline: Pipeline::Window,
            depth: 1000,
            steps: vec![step(1000.0, true), step(2000.55, false)],
            capacity: 1000.0,
            best: Some(crate::stats::tests::full_report()),
        };
        let none = Capacity {
            best: None,
            ..c.clone()
        };
        assert_eq!(c.json(), include_str!("../tests/data/capacity.json"));
        assert_eq!(
            none.json(),
            include_str!("../tests/data/capacity-no-best.json")
        );
    }

    #[test]
    fn targets_parse() {
        let t = Target::parse("p99=1ms").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.metric, Metric::Percentile(99.0));
        assert_eq!(t.limit, Duration::from_millis(1));
        assert_eq!(
            Target::parse("max=500us").map(|t| t.metric),
            Ok(Metric::Max)
        );
        assert_eq!(Target::parse("2ms").map(|t| t.metric), Ok(Metric::Avg));
        assert_eq!(
            Target::parse("p99.9=1ms").map(|t| t.metric),
            Ok(Metric::Percentile(99.9))
        );
        let err = |s: &str| Target::parse(s).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(err("p100=1ms"), Err("bad percentile \"p100\"".into()));
        assert_eq!(
            err("median=1ms"),
            Err("bad SLO metric \"median\": avg, max, p50, p99, p99.9".into())
        );
        assert_eq!(
            err("p99=soon"),
            Err("bad time \"soon\" (e.g. 30s, 500ms, 250us, 1.5s, 2m)".into())
        );
    }
}
