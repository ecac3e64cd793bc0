//! The `kvblast` binary: parse flags, run, print the table, write the JSON report.

use std::process::ExitCode;
use std::time::Duration;

use kvblast::cli::{list_workloads, usage, Args};
use kvblast::engine;
use kvblast::stats::{server_delta, server_stats};
use kvblast::{agent, capacity, plot};

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

fn write_json(path: &Option<String>, json: &str) -> Result<(), String> {
    match path {
        Some(p) => write_file(p, json),
        None => Ok(()),
    }
}

fn write_file(path: &str, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{path}: {e}"))
}

/// A run's plots, each as SVG and PNG.
fn write_run_plots(prefix: &str, r: &kvblast::stats::Report) -> Result<(), String> {
    plot::write_both(prefix, "latency", &plot::latency(r))?;
    plot::write_both(prefix, "cdf", &plot::cdf(r))?;
    plot::write_both(prefix, "timeline", &plot::timeline(r))?;
    plot::write_both(prefix, "latency-timeline", &plot::latency_timeline(r))?;
    Ok(())
}

fn main_result() -> Result<(), String> {
    let args = Args::parse(std::env::args().skip(1))?;
    match args.command.as_str() {
        "help" => {
            print!("{}", args.help.unwrap_or_else(usage));
            Ok(())
        }
        "agent" => {
            let addr = args
                .listen
                .as_deref()
                .ok_or("agent needs --listen ADDR (e.g. 127.0.0.1:5555)")?;
            let l = std::net::TcpListener::bind(addr).map_err(|e| format!("{addr}: {e}"))?;
            eprintln!("kvblast agent listening on {addr}");
            agent::serve(l, args.jobs)
        }
        "workloads" => {
            print!("{}", list_workloads());
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
            print!("{}", report.table());
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
            let mut cfg = args.run_config()?;
            if args.duration.is_none() {
                cfg.duration = Duration::from_secs(3);
            }
            let target = args.slo()?;
            let quiet = args.quiet;
            let result = capacity::search(
                &cfg,
                target,
                args.low,
                args.high,
                args.steps.unwrap_or(8),
                |s| {
                    if !quiet {
                        eprintln!(
                            "rate {:>10.0}/s: achieved {:>10.0}/s, {:>9.1} µs  {}",
                            s.rate,
                            s.achieved,
                            s.metric_us,
                            if s.pass { "pass" } else { s.why.as_str() }
                        );
                    }
                },
            )?;
            print!("{}", result.table());
            if let Some(prefix) = &args.plot {
                plot::write_both(prefix, "capacity", &plot::capacity(&result))?;
                plot::write_both(prefix, "curve", &plot::capacity_curve(&result))?;
                if let Some(best) = &result.best {
                    write_run_plots(prefix, best)?;
                }
            }
            write_json(&args.json, &result.json())
        }
        "plot" => {
            let out = args
                .output
                .as_deref()
                .ok_or("plot needs -o OUT.png (or OUT.svg)")?;
            if args.servers.is_empty() {
                return Err("plot needs capacity reports: [LABEL=]FILE.json ...".into());
            }
            let mut curves: Vec<plot::Curve> = Vec::new();
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
                let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
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
                plot::add_capacity_json(&mut curves[i], &text)
                    .map_err(|e| format!("{path}: {e}"))?;
            }
            plot::write_one(out, &plot::compare(&curves))
        }
        other => Err(format!("unknown command {other:?}\n\n{}", usage())),
    }
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
