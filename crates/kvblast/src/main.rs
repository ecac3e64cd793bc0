//! The `kvblast` binary: parse flags, run, print the table, write the JSON report.

use std::process::ExitCode;
use std::time::Duration;

use kvblast::cli::{list_workloads, Args, USAGE};
use kvblast::engine;
use kvblast::stats::{server_delta, server_stats};
use kvblast::{agent, capacity, plot};

fn read_server_stats(servers: &[String]) -> Option<Vec<std::collections::BTreeMap<String, i64>>> {
    let mut out = Vec::new();
    for s in servers {
        match server_stats(s, Duration::from_secs(2)) {
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

fn main_result() -> Result<(), String> {
    let args = Args::parse(std::env::args().skip(1))?;
    match args.command.as_str() {
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
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
                .then(|| read_server_stats(&cfg.servers))
                .flatten();
            let mut report = if args.agents.is_empty() {
                engine::run(&cfg)?
            } else {
                agent::run_with_agents(&args)?
            };
            if let Some(before) = before {
                if let Some(after) = read_server_stats(&cfg.servers) {
                    report.server = Some(server_delta(&before, &after));
                }
            }
            print!("{}", report.table());
            if let Some(prefix) = &args.plot {
                write_file(
                    &format!("{prefix}-latency.svg"),
                    &plot::latency_svg(&report),
                )?;
                write_file(
                    &format!("{prefix}-timeline.svg"),
                    &plot::timeline_svg(&report),
                )?;
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
                write_file(
                    &format!("{prefix}-capacity.svg"),
                    &plot::capacity_svg(&result),
                )?;
                if let Some(best) = &result.best {
                    write_file(&format!("{prefix}-latency.svg"), &plot::latency_svg(best))?;
                }
            }
            write_json(&args.json, &result.json())
        }
        other => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    if std::env::args().len() < 2 {
        eprint!("{USAGE}");
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
