//! The `kvblast` binary: parse flags, run, print the table, write the JSON report.

use std::process::ExitCode;
use std::time::Duration;

use kvblast::cli::{list_workloads, usage, Args};
use kvblast::engine;
use kvblast::stats::{server_delta, server_stats};
use kvblast::{agent, capacity, plot};

/// The binary's catch-all: every library error (each a typed one) and its own messages;
/// `main` prints its Display.
type Error = Box<dyn std::error::Error>;

fn read_server_stats(
    servers: &[String],
    tls: Option<&kvblast::transport::Tls>,
) -> Option<Vec<std::collections::BTreeMap<String, i64>>> {
    let mut out = Vec::new();
    for s in servers {
        match server_stats(s, Duration::from_secs(2), tls) {
            Ok(m) => out.push(m),
            Err(e) => {
                eprintln!("kvblast: could not read stats from {s}: {e}");
                return None;
            }
        }
    }
    Some(out)
}

/// Write to stdout; a reader that went away (`kvblast ... | head`) is not an error and
/// must not panic, as `print!` would.
fn say(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn write_json(path: &Option<String>, json: &str) -> Result<(), Error> {
    match path {
        Some(p) => write_file(p, json),
        None => Ok(()),
    }
}

fn write_file(path: &str, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| format!("{path}: {e}"))?;
    Ok(())
}

/// A run's plots, each as SVG and PNG.
fn write_run_plots(prefix: &str, r: &kvblast::stats::Report) -> Result<(), Error> {
    plot::write_both(prefix, "latency", &plot::latency(r))?;
    plot::write_both(prefix, "cdf", &plot::cdf(r))?;
    plot::write_both(prefix, "timeline", &plot::timeline(r))?;
    plot::write_both(prefix, "latency-timeline", &plot::latency_timeline(r))?;
    Ok(())
}

fn main_result() -> Result<(), Error> {
    let args = Args::parse(std::env::args().skip(1))?;
    match args.command.as_str() {
        "help" => {
            say(&args.help.unwrap_or_else(usage));
            Ok(())
        }
        "agent" => {
            let addr = args
                .listen
                .as_deref()
                .ok_or("agent needs --listen ADDR (e.g. 127.0.0.1:5555)")?;
            let l = std::net::TcpListener::bind(addr).map_err(|e| format!("{addr}: {e}"))?;
            eprintln!("kvblast agent listening on {addr}");
            agent::serve(l, args.jobs)?;
            Ok(())
        }
        "workloads" => {
            say(&list_workloads());
            Ok(())
        }
        "run" => {
            let cfg = args.run_config()?;
            let before = (!args.no_server_stats)
                .then(|| read_server_stats(&cfg.servers, cfg.tls.as_ref()))
                .flatten();
            let mut report = if args.agents.is_empty() {
                engine::run(&cfg)?
            } else {
                agent::run_with_agents(&args)?
            };
            if let Some(before) = before {
                if let Some(after) = read_server_stats(&cfg.servers, cfg.tls.as_ref()) {
                    report.server = Some(server_delta(&before, &after));
                }
            }
            say(&report.table());
            if let Some(prefix) = &args.plot {
                write_run_plots(prefix, &report)?;
            }
            if let Some(path) = &args.hdr_log {
                let log = report.hdr_log()?;
                std::fs::write(path, log).map_err(|e| format!("{path}: {e}"))?;
            }
            write_json(&args.json, &report.json())
        }
        "capacity" => {
            let cfg = capacity_config(&args)?;
            let result = search(&cfg, &args, args.slo()?, "")?;
            say(&result.table());
            if let Some(prefix) = &args.plot {
                plot::write_both(prefix, "capacity", &plot::capacity(&result))?;
                plot::write_both(prefix, "curve", &plot::capacity_curve(&result))?;
                if let Some(best) = &result.best {
                    write_run_plots(prefix, best)?;
                }
            }
            write_json(&args.json, &result.json())
        }
        "compare" => compare(&args),
        "plot" => plot_files(&args),
        other => Err(format!("unknown command {other:?}\n\n{}", usage()).into()),
    }
}

/// `kvblast plot -o OUT FILE...`: capacity reports (JSON) drawn as one latency-against-
/// throughput chart, a server per label; or HdrHistogram interval logs drawn as one
/// percentile plot, a line per file and tag.
fn plot_files(args: &Args) -> Result<(), Error> {
    let out = args
        .output
        .as_deref()
        .ok_or("plot needs -o OUT.png (or OUT.svg)")?;
    if args.servers.is_empty() {
        return Err("plot needs capacity reports or HdrHistogram logs: [LABEL=]FILE ...".into());
    }
    let mut curves: Vec<plot::Curve> = Vec::new();
    let mut hists: Vec<(String, hdrhistogram::Histogram<u64>)> = Vec::new();
    for arg in &args.servers {
        let (label, path) = match arg.split_once('=') {
            Some((l, p)) => (l.to_string(), p),
            None => (
                std::path::Path::new(arg)
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| arg.clone()),
                arg.as_str(),
            ),
        };
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        if bytes.trim_ascii_start().starts_with(b"{") {
            let text = String::from_utf8_lossy(&bytes);
            let i = match curves.iter().position(|c| c.label == label) {
                Some(i) => i,
                None => {
                    curves.push(plot::Curve {
                        label,
                        ..Default::default()
                    });
                    curves.len() - 1
                }
            };
            plot::add_capacity_json(&mut curves[i], &text).map_err(|e| format!("{path}: {e}"))?;
        } else {
            let logged = plot::read_hdr_log(&bytes).map_err(|e| {
                format!("{path}: neither a capacity report nor an HdrHistogram interval log: {e}")
            })?;
            for (tag, h) in logged {
                hists.push((format!("{label} {tag}"), h));
            }
        }
    }
    if !curves.is_empty() && !hists.is_empty() {
        return Err("plot draws capacity reports or HdrHistogram logs, not both at once".into());
    }
    if curves.is_empty() {
        let refs: Vec<(String, &hdrhistogram::Histogram<u64>)> =
            hists.iter().map(|(l, h)| (l.clone(), h)).collect();
        let slo = match &args.slo {
            Some(_) => Some(args.slo()?.limit.as_secs_f64() * 1e6),
            None => None,
        };
        plot::write_one(out, &plot::percentiles("Latency by percentile", &refs, slo))?;
    } else {
        plot::write_one(out, &plot::compare(&curves))?;
    }
    Ok(())
}

/// A capacity search's run configuration: `args`' with 3 s runs unless `-D` says otherwise.
fn capacity_config(args: &Args) -> Result<engine::RunConfig, Error> {
    let mut cfg = args.run_config()?;
    if args.duration.is_none() {
        cfg.duration = Duration::from_secs(3);
    }
    Ok(cfg)
}

/// A capacity search with `args`' bracket and steps; each step on stderr (after `indent`)
/// unless `-q`.
fn search(
    cfg: &engine::RunConfig,
    args: &Args,
    target: capacity::Target,
    indent: &str,
) -> Result<capacity::Capacity, Error> {
    let quiet = args.quiet;
    let found = capacity::search(
        cfg,
        target,
        args.low,
        args.high,
        args.steps.unwrap_or(8),
        |s| {
            if !quiet {
                eprintln!(
                    "{indent}rate {:>10.0}/s: achieved {:>10.0}/s, {:>9.1} µs  {}",
                    s.rate,
                    s.achieved,
                    s.metric_us,
                    if s.pass { "pass" } else { s.why.as_str() }
                );
            }
        },
    )?;
    Ok(found)
}

/// `kvblast compare`: a capacity search per server per round, rounds alternating the
/// order (a machine that slows down during the run then weighs on every server alike),
/// then the medians, their ratios to the first server's, and one plot of every search.
fn compare(args: &Args) -> Result<(), Error> {
    if args.servers.len() < 2 {
        return Err("compare needs two or more servers: [LABEL=]SERVER [LABEL=]SERVER ...".into());
    }
    let target = args.slo()?;
    let rounds = args.rounds.unwrap_or(3).max(1) as usize;
    let mut entries: Vec<(String, Args)> = Vec::new();
    for (i, spec) in args.servers.iter().enumerate() {
        // A label may not contain ':' or '/', so `unix:/path` and `host:port` stay servers.
        let (label, server) = match spec.split_once('=') {
            Some((l, s)) if !l.is_empty() && !l.contains([':', '/']) => (l.to_string(), s),
            _ => (format!("server{}", i + 1), spec.as_str()),
        };
        if entries.iter().any(|(l, _)| *l == label) {
            return Err(format!("compare: label {label:?} given twice").into());
        }
        let mut one = args.clone();
        one.servers = vec![server.to_string()];
        entries.push((label, one));
    }
    let mut curves: Vec<plot::Curve> = entries
        .iter()
        .map(|(label, _)| plot::Curve {
            label: label.clone(),
            ..Default::default()
        })
        .collect();
    let mut capacities: Vec<Vec<f64>> = vec![Vec::new(); entries.len()];
    // Each search's best run, for the percentile plot of --plot.
    let mut bests: Vec<Vec<Option<kvblast::stats::Report>>> = vec![Vec::new(); entries.len()];
    // The searches' pipelining and cap per connection (the same for every search).
    let mut mode = (kvblast::stats::Pipeline::Window, 0);
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..entries.len()).collect()
        } else {
            (0..entries.len()).rev().collect()
        };
        for i in order {
            let (label, one) = &entries[i];
            let cfg = capacity_config(one)?;
            if !args.quiet {
                eprintln!("round {}/{rounds}: {label}", round + 1);
            }
            let result = search(&cfg, args, target, "  ")?;
            mode = (result.pipeline, result.depth);
            capacities[i].push(result.capacity);
            plot::add_capacity(&mut curves[i], &result.report());
            bests[i].push(result.best);
        }
    }
    let medians: Vec<f64> = capacities.iter().map(|c| plot::median(c)).collect();
    say(&compare_table(
        &entries,
        &capacities,
        &medians,
        &target,
        mode,
    ));
    let chart = plot::compare(&curves);
    if let Some(out) = &args.output {
        plot::write_one(out, &chart)?;
    }
    if let Some(prefix) = &args.plot {
        plot::write_both(prefix, "curve", &chart)?;
        // Each server's median search (the one drawn bold), and in it the run at the
        // capacity found: all requests' latencies, or the probe's when there is one.
        let runs: Vec<(String, hdrhistogram::Histogram<u64>)> = entries
            .iter()
            .enumerate()
            .filter_map(|(i, (label, _))| {
                let r = bests[i].get(curves[i].median_search()?)?.as_ref()?;
                let all = match &r.probe {
                    Some(p) if p.all().count > 0 => p.all().hist,
                    _ => r.stats.all().hist,
                };
                let rate = r.target_rate.unwrap_or(0.0);
                Some((
                    format!("{label} at {}/s", plot::count_label(rate.round())),
                    all,
                ))
            })
            .collect();
        let refs: Vec<(String, &hdrhistogram::Histogram<u64>)> =
            runs.iter().map(|(l, h)| (l.clone(), h)).collect();
        let title = format!("Latency by percentile at capacity ({})", target.describe());
        let slo = target.limit.as_secs_f64() * 1e6;
        plot::write_both(
            prefix,
            "percentiles",
            &plot::percentiles(&title, &refs, Some(slo)),
        )?;
    }
    let report = CompareReport {
        slo: target.describe(),
        pipeline: mode.0,
        depth: mode.1,
        rounds,
        servers: entries
            .iter()
            .enumerate()
            .map(|(i, (label, one))| CompareServer {
                label,
                server: one.servers.first().map_or("", String::as_str),
                capacities: &capacities[i],
                median: medians[i],
                ratio: if medians[0] > 0.0 {
                    medians[i] / medians[0]
                } else {
                    0.0
                },
            })
            .collect(),
    };
    write_json(
        &args.json,
        &serde_json::to_string(&report).unwrap_or_default(),
    )
}

/// `kvblast compare --json`: each server's capacity by round, their median, and its ratio
/// to the first server's.
#[derive(serde::Serialize)]
struct CompareReport<'a> {
    slo: String,
    /// The searches' pipelining (`window`: their steps are open-loop runs) and cap of
    /// requests outstanding per connection.
    pipeline: kvblast::stats::Pipeline,
    depth: usize,
    rounds: usize,
    servers: Vec<CompareServer<'a>>,
}

#[derive(serde::Serialize)]
struct CompareServer<'a> {
    label: &'a str,
    server: &'a str,
    capacities: &'a [f64],
    median: f64,
    ratio: f64,
}

fn compare_table(
    entries: &[(String, Args)],
    capacities: &[Vec<f64>],
    medians: &[f64],
    target: &capacity::Target,
    (pipeline, depth): (kvblast::stats::Pipeline, usize),
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "capacity ({}), req/s, by round (open loop, pipeline {}, cap {depth} per connection)",
        target.describe(),
        pipeline.name()
    );
    let width = entries
        .iter()
        .map(|(l, _)| l.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = write!(s, "{:<width$}", "server");
    for r in 0..capacities.first().map_or(0, Vec::len) {
        let _ = write!(s, "{:>12}", format!("round {}", r + 1));
    }
    let _ = writeln!(s, "{:>12}{:>10}", "median", "ratio");
    for (i, (label, _)) in entries.iter().enumerate() {
        let _ = write!(s, "{label:<width$}");
        for c in &capacities[i] {
            let _ = write!(s, "{c:>12.0}");
        }
        let ratio = if medians[0] > 0.0 {
            format!("{:.2}", medians[i] / medians[0])
        } else {
            "-".to_string()
        };
        let _ = writeln!(s, "{:>12.0}{ratio:>10}", medians[i]);
    }
    s
}

fn main() -> ExitCode {
    if std::env::args().len() < 2 {
        eprint!("{}", usage());
        return ExitCode::from(2);
    }
    match main_result() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvblast: {e}");
            ExitCode::FAILURE
        }
    }
}
