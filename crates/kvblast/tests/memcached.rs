//! End-to-end: kvblast against Debian's memcached 1.6 (`/usr/bin/memcached`, or $MEMCACHED)
//! on free loopback ports. Every run is short (at most a few seconds) and bounded in count and
//! time; traffic goes only to 127.0.0.1.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvblast::dist::Arrival;
use kvblast::engine::{self, LoadModel, Pipeline, Protocol, RunConfig};
use kvblast::stats::{server_delta, server_stats, Report};
use kvblast::workload::{Mix, Workload};

// The workspace's port allocator for test servers (std only).
#[path = "../../../tests/common/ports.rs"]
mod ports;
use ports::free_port;

/// How long a test waits for a server to listen, or for its reply (the workspace's tests use
/// the same 10 s): time a loaded machine stays within.
const TIMEOUT: Duration = Duration::from_secs(10);

struct Memcached {
    child: Child,
    addr: String,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn memcached_path() -> PathBuf {
    std::env::var_os("MEMCACHED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/memcached"))
}

fn start_memcached() -> Memcached {
    start_memcached_udp(false)
}

/// memcached on a free port; with `udp`, also on the same UDP port (memcached keeps UDP off
/// by default).
fn start_memcached_udp(udp: bool) -> Memcached {
    start_memcached_with(udp, &[], None)
}

/// memcached on a free port with `extra` arguments; `tls`: how to read its stats (a `-Z`
/// server).
fn start_memcached_with(
    udp: bool,
    extra: &[String],
    tls: Option<&kvblast::transport::Tls>,
) -> Memcached {
    let program = memcached_path();
    assert!(
        program.exists(),
        "{} not found: install Debian's memcached",
        program.display()
    );
    for _ in 0..5 {
        let port = free_port();
        let child = Command::new(&program)
            .args([
                "-u",
                "root",
                "-l",
                "127.0.0.1",
                "-t",
                "1",
                "-m",
                "256",
                "-p",
            ])
            .arg(port.to_string())
            .args(if udp {
                vec!["-U".to_string(), port.to_string()]
            } else {
                vec![]
            })
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn memcached");
        let mut mc = Memcached {
            child,
            addr: format!("127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if TcpStream::connect(&mc.addr).is_ok() {
                // Parallel tests can pick the same free port: then ours failed to bind and
                // exited, and what answered is another test's server. Keep it only if it is ours.
                let pid = server_stats(&mc.addr, TIMEOUT, tls)
                    .ok()
                    .and_then(|s| s.get("pid").copied());
                if pid == Some(i64::from(mc.child.id())) {
                    return mc;
                }
                break;
            }
            if mc.child.try_wait().map(|s| s.is_some()).unwrap_or(true) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Not ours (or never up): drop kills it; try another port.
    }
    panic!("memcached did not start");
}

fn stats_of(servers: &[&Memcached]) -> Vec<std::collections::BTreeMap<String, i64>> {
    servers
        .iter()
        .map(|m| server_stats(&m.addr, TIMEOUT, None).expect("stats"))
        .collect()
}

/// Run and return the report with the server counter deltas filled in.
fn run_against(cfg: &RunConfig, servers: &[&Memcached]) -> Report {
    let before = stats_of(servers);
    let mut report = engine::run(cfg).expect("run");
    let after = stats_of(servers);
    report.server = Some(server_delta(&before, &after));
    report
}

fn assert_counts_match(report: &Report) {
    let server = report.server.as_ref().expect("server counters");
    for (name, ours) in report.reconcile() {
        assert_eq!(
            server.get(name).copied().unwrap_or(0),
            ours,
            "{name}: server vs kvblast\n{}",
            report.table()
        );
    }
}

#[test]
fn closed_loop_counts_match_memcached_stats() {
    let mc = start_memcached();
    let mut w = Workload::preset("etc").expect("etc");
    w.keys = 2000;
    w.value_size.max = 4000;
    w.mix = Mix::parse("get=0.65,set=0.2,delete=0.05,touch=0.05,gat=0.05").expect("mix");
    let mut cfg = RunConfig::new(w, vec![mc.addr.clone()]);
    cfg.threads = 2;
    cfg.conns = 2;
    cfg.depth = 4;
    cfg.warmup = Duration::from_millis(200);
    cfg.duration = Duration::from_secs(1);
    cfg.load_phase = true;
    cfg.probe_rate = Some(200.0);
    let r = run_against(&cfg, &[&mc]);
    assert_counts_match(&r);
    // The probe ran beside the load, one request at a time, and is counted apart.
    let probe = r.probe.as_ref().expect("probe counters");
    let probed = probe.all().count;
    assert!((50..=400).contains(&probed), "probe sent {probed}");
    assert!(r.table().contains("probe-get"));
    let st = &r.stats;
    assert_eq!(st.loaded, 1000 + 1000, "every key loaded once");
    assert_eq!(st.timeouts + st.lost + st.conn_failures, 0);
    let all = st.all();
    assert!(all.count > 500, "too few requests: {}", all.count);
    assert_eq!(all.errors, 0);
    // After the load phase most gets hit (deletes remove a few keys).
    let get = st.op(kvblast::workload::Op::Get);
    assert!(
        get.hits * 2 > get.count,
        "hits {} of {}",
        get.hits,
        get.count
    );
    assert!(!get.hist.is_empty());
    // gat: a get's reply, counted by memcached as a touch (cmd_touch, reconciled above).
    let gat = st.op(kvblast::workload::Op::Gat);
    assert!(gat.count > 0 && gat.hits > 0, "{}", r.table());
    assert_eq!(gat.errors, 0);
}

#[test]
fn open_loop_keeps_the_rate() {
    let mc = start_memcached();
    let mut w = Workload::preset("usr").expect("usr");
    w.keys = 1000;
    for (arrival, rate, tolerance) in [
        (Arrival::Fixed, 2000.0, 0.01),
        (Arrival::Poisson, 5000.0, 0.02),
    ] {
        let mut cfg = RunConfig::new(w.clone(), vec![mc.addr.clone()]);
        cfg.conns = 2;
        cfg.depth = 1000;
        cfg.load = LoadModel::Open { rate, arrival };
        cfg.warmup = Duration::from_millis(200);
        cfg.duration = Duration::from_secs(2);
        let started = Instant::now();
        let r = run_against(&cfg, &[&mc]);
        let elapsed = started.elapsed();
        assert_counts_match(&r);
        let offered = r.offered_rate();
        assert!(
            (offered - rate).abs() / rate < tolerance,
            "{arrival:?}: offered {offered} vs {rate}\n{}",
            r.table()
        );
        let all = r.stats.all();
        assert_eq!(all.count, r.stats.issued, "every measured request answered");
        assert!(
            (all.count as f64 / r.seconds - rate).abs() / rate < tolerance,
            "{arrival:?}: achieved {}\n{}",
            all.count as f64 / r.seconds,
            r.table()
        );
        // The schedule was kept: sends went out close to their intended times, and the run
        // took about warm-up + duration.
        assert!(
            r.stats.send_lag.value_at_quantile(0.5) < 1_000_000,
            "median send lag {} ns",
            r.stats.send_lag.value_at_quantile(0.5)
        );
        assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
        assert_eq!(r.stats.skipped, 0);
    }
}

#[test]
fn two_servers_multiget_and_look_aside() {
    let a = start_memcached();
    let b = start_memcached();
    let mut w = Workload::preset("friendfeed").expect("friendfeed");
    w.keys = 3000;
    let mut cfg = RunConfig::new(w, vec![a.addr.clone(), b.addr.clone()]);
    cfg.conns = 2;
    cfg.depth = 2;
    cfg.duration = Duration::from_millis(800);
    cfg.look_aside = true;
    let r = run_against(&cfg, &[&a, &b]);
    assert_counts_match(&r);
    let get = r.stats.op(kvblast::workload::Op::Get);
    // Multigets ask for several keys each.
    assert!(
        get.total_keys > 3 * get.total,
        "{} keys in {} gets",
        get.total_keys,
        get.total
    );
    // Both servers got traffic.
    let per: Vec<i64> = stats_of(&[&a, &b])
        .iter()
        .map(|m| m.get("cmd_get").copied().unwrap_or(0))
        .collect();
    assert!(per.iter().all(|&g| g > 0), "{per:?}");
}

#[test]
fn request_count_limit_stops_the_run() {
    let mc = start_memcached();
    let mut w = Workload::preset("kvcache-b").expect("kvcache-b");
    w.keys = 10_000;
    let mut cfg = RunConfig::new(w, vec![mc.addr.clone()]);
    cfg.requests = Some(3000);
    // Far more time than 3000 requests take on any machine, so that only the count can end
    // the run (a slow machine reached a 3 s bound first); a count that failed to stop the
    // run would still show, as more than 3000 requests.
    cfg.duration = Duration::from_secs(20);
    cfg.conns = 2;
    cfg.depth = 2;
    let r = run_against(&cfg, &[&mc]);
    assert_counts_match(&r);
    assert_eq!(r.stats.all().count, 3000);
}

/// `--reconnect-interval 3`: every connection closes after three requests and a new one
/// takes its place, as clients that connect per page do; nothing is lost or counted as a
/// failure, and the server sees a connection per three requests.
#[test]
fn reconnect_interval_opens_a_connection_per_n_requests() {
    let mc = start_memcached();
    let mut w = Workload::preset("kvcache-b").expect("kvcache-b");
    w.keys = 1000;
    let mut cfg = RunConfig::new(w, vec![mc.addr.clone()]);
    cfg.requests = Some(600);
    cfg.duration = Duration::from_secs(20);
    cfg.conns = 2;
    cfg.depth = 2;
    cfg.reconnect_interval = Some(3);
    let r = run_against(&cfg, &[&mc]);
    assert_counts_match(&r);
    let st = &r.stats;
    assert_eq!(st.all().count, 600);
    assert_eq!(st.timeouts + st.lost + st.conn_failures, 0);
    // 200 connections of three requests: the first two were opened at the start.
    assert!(
        (198..=202).contains(&st.reconnects),
        "{} reconnects",
        st.reconnects
    );
    let opened = r.server.as_ref().expect("server")["total_connections"];
    assert!(
        (i64::try_from(st.reconnects).unwrap_or(0)..=i64::try_from(st.reconnects).unwrap_or(0) + 3)
            .contains(&opened),
        "server saw {opened} connections, kvblast reconnected {}",
        st.reconnects
    );
    // A zero interval, or one with UDP, is refused.
    let mut bad = cfg.clone();
    bad.reconnect_interval = Some(0);
    assert!(bad.validate().is_err());
    bad.reconnect_interval = Some(1);
    bad.servers = vec![format!("udp:{}", mc.addr)];
    assert!(bad.validate().is_err());
}

#[test]
fn binary_writes_json_report() {
    let mc = start_memcached();
    let dir = std::env::temp_dir().join(format!("kvblast-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let json = dir.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_kvblast"))
        .args([
            "run", "-w", "usr", "--keys", "500", "--rate", "3000", "-D", "1s", "-q",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(dir.join("plot"))
        .arg("--hdr-log")
        .arg(dir.join("run.hlog"))
        .arg(&mc.addr)
        .output()
        .expect("run kvblast");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("p99.9"), "{stdout}");
    assert!(stdout.contains("cmd_get"), "{stdout}");
    assert!(!stdout.contains("(differs)"), "{stdout}");
    let text = std::fs::read_to_string(&json).expect("json written");
    for field in [
        "\"ops\"",
        "\"get\"",
        "\"p99_us\"",
        "\"server\"",
        "\"offered_rate\"",
        "\"timeline\"",
    ] {
        assert!(text.contains(field), "{field} missing in {text}");
    }
    assert!(text.contains("\"latency_timeline\""), "{text}");
    for plot in ["latency", "cdf", "timeline", "latency-timeline"] {
        let svg = std::fs::read_to_string(dir.join(format!("plot-{plot}.svg"))).expect("svg");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_png(&dir.join(format!("plot-{plot}.png")));
    }
    // The HdrHistogram log drawn back as a percentile plot, a line per file and tag.
    let o = Command::new(env!("CARGO_BIN_EXE_kvblast"))
        .args(["plot", "--slo", "p99=1ms", "-o"])
        .arg(dir.join("hdr.svg"))
        .arg(format!("a={}", dir.join("run.hlog").display()))
        .arg(format!("b={}", dir.join("run.hlog").display()))
        .output()
        .expect("run kvblast plot");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(dir.join("hdr.svg")).expect("svg");
    for text in ["\na get\n", "\nb get\n", "\nSLO 1 ms\n", "\n99%\n"] {
        assert!(svg.contains(text), "{text:?} missing in {svg}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A valid 800×480 PNG: the signature, then the whole image decodes, and it is not blank.
fn assert_png(path: &std::path::Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.len() > 1000,
        "{}: {} bytes",
        path.display(),
        bytes.len()
    );
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&bytes[bytes.len() - 8..bytes.len() - 4], b"IEND");
    let mut reader = png::Decoder::new(std::io::Cursor::new(&bytes))
        .read_info()
        .expect("png header");
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("png data");
    assert_eq!((info.width, info.height), (800, 480));
    let pixels = &buf[..info.buffer_size()];
    let dark = pixels
        .chunks(3)
        .filter(|p| p.iter().all(|&c| c < 100))
        .count();
    assert!(dark > 1000, "{}: only {dark} dark pixels", path.display());
}

#[test]
fn capacity_search_finds_a_rate() {
    let mc = start_memcached();
    let dir = std::env::temp_dir().join(format!("kvblast-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let json = dir.join("cap.json");
    let out = Command::new(env!("CARGO_BIN_EXE_kvblast"))
        .args([
            "capacity",
            "-w",
            "usr",
            "--keys",
            "500",
            "-D",
            "400ms",
            "--low",
            "1000",
            "--high",
            "4000",
            "--steps",
            "3",
            "--slo",
            "p99=200ms",
            "-q",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(dir.join("cap"))
        .arg(&mc.addr)
        .output()
        .expect("run kvblast");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 1000/s passes with a 200 ms p99 objective even on a busy 2-core machine.
    assert!(stdout.contains("capacity (p99<=200ms)"), "{stdout}");
    assert!(
        !stdout.contains("capacity (p99<=200ms): 0 req/s"),
        "{stdout}"
    );
    for plot in ["capacity", "curve", "latency", "cdf"] {
        assert_png(&dir.join(format!("cap-{plot}.png")));
    }
    // Two reports side by side on one plot, PNG and SVG.
    for out in ["cmp.png", "cmp.svg"] {
        let o = Command::new(env!("CARGO_BIN_EXE_kvblast"))
            .args(["plot", "-o"])
            .arg(dir.join(out))
            .arg(format!("one={}", json.display()))
            .arg(format!("two={}", json.display()))
            .output()
            .expect("run kvblast plot");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_png(&dir.join("cmp.png"));
    let svg = std::fs::read_to_string(dir.join("cmp.svg")).expect("svg");
    // A legend line per server: its label and capacity.
    assert!(svg.contains("\none: ") && svg.contains("\ntwo: "), "{svg}");
    // Not a capacity report: an error, not a panic.
    let o = Command::new(env!("CARGO_BIN_EXE_kvblast"))
        .args(["plot", "-o"])
        .arg(dir.join("bad.png"))
        .arg(dir.join("cap-curve.svg"))
        .output()
        .expect("run kvblast plot");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("neither a capacity report nor an HdrHistogram"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_two_servers_in_alternating_rounds() {
    let (a, b) = (start_memcached(), start_memcached());
    let dir = std::env::temp_dir().join(format!("kvblast-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let json = dir.join("cmp.json");
    let png = dir.join("cmp.png");
    let out = Command::new(env!("CARGO_BIN_EXE_kvblast"))
        .args([
            "compare",
            "-w",
            "usr",
            "--keys",
            "500",
            "-D",
            "300ms",
            "--low",
            "1000",
            "--high",
            "4000",
            "--steps",
            "2",
            "--rounds",
            "2",
            "--slo",
            "p99=200ms",
            "-q",
        ])
        .arg("--json")
        .arg(&json)
        .arg("-o")
        .arg(&png)
        .arg("--plot")
        .arg(dir.join("c"))
        .arg(format!("first={}", a.addr))
        .arg(format!("second={}", b.addr))
        .output()
        .expect("run kvblast compare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "capacity (p99<=200ms), req/s, by round (open loop, pipeline window, cap 1000 per \
         connection)",
        "{stdout}"
    );
    assert!(
        lines[1].contains("round 1") && lines[1].contains("round 2"),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("first ") && lines[2].ends_with("1.00"),
        "{stdout}"
    );
    assert!(lines[3].starts_with("second "), "{stdout}");
    assert_png(&png);
    for plot in ["curve", "percentiles"] {
        assert_png(&dir.join(format!("c-{plot}.png")));
    }
    let svg = std::fs::read_to_string(dir.join("c-percentiles.svg")).expect("svg");
    assert!(
        svg.contains("\nfirst at ") && svg.contains("\nsecond at "),
        "{svg}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("JSON");
    // The searches' pipelining and cap per connection are named.
    assert_eq!(report["pipeline"], "window", "{report}");
    assert_eq!(report["depth"], 1000, "{report}");
    let servers = report["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 2);
    for s in servers {
        assert_eq!(s["capacities"].as_array().map(Vec::len), Some(2), "{s}");
        // 1000/s passes a 200 ms p99 objective even on a busy machine.
        assert!(s["median"].as_f64().unwrap_or(0.0) >= 1000.0, "{s}");
    }
    assert_eq!(servers[0]["ratio"].as_f64(), Some(1.0));

    // One server, or a label twice: an error, not a run.
    for args in [
        vec![format!("x={}", a.addr)],
        vec![format!("x={}", a.addr), format!("x={}", b.addr)],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_kvblast"))
            .arg("compare")
            .args(&args)
            .output()
            .expect("run kvblast compare");
        assert!(!o.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("compare"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn meta_and_binary_protocol_counts_match() {
    let mc = start_memcached();
    for protocol in [Protocol::Meta, Protocol::Binary] {
        for (preset, multiget) in [("kvcache-c", 1), ("friendfeed", 10)] {
            let mut w = Workload::preset(preset).expect("preset");
            w.keys = 2000;
            w.multiget = multiget;
            if preset == "kvcache-c" {
                w.mix = Mix::parse("get=0.55,set=0.2,delete=0.1,touch=0.05,incr=0.05,gat=0.05")
                    .expect("mix");
            }
            let mut cfg = RunConfig::new(w, vec![mc.addr.clone()]);
            cfg.protocol = protocol;
            cfg.conns = 2;
            cfg.depth = 3;
            cfg.duration = Duration::from_millis(500);
            cfg.load_phase = true;
            let r = run_against(&cfg, &[&mc]);
            let what = format!("{protocol:?} {preset}");
            assert_counts_match(&r);
            let get = r.stats.op(kvblast::workload::Op::Get);
            assert!(get.count > 50, "{what}: {}", r.table());
            assert!(
                get.hits > 0 && get.hits <= get.total_keys,
                "{what}: {}",
                r.table()
            );
            assert_eq!(r.stats.conn_failures, 0, "{what}: {}", r.table());
            if preset == "kvcache-c" {
                let gat = r.stats.op(kvblast::workload::Op::Gat);
                assert!(gat.count > 0 && gat.hits > 0, "{what}: {}", r.table());
            }
            // Only incr on the non-numeric values errs.
            let errors = r.stats.all().errors - r.stats.op(kvblast::workload::Op::Incr).errors;
            assert_eq!(errors, 0, "{what}: {}", r.table());
        }
    }
}

#[test]
fn udp_counts_match() {
    let mc = start_memcached_udp(true);
    let udp = format!("udp:{}", mc.addr);
    for (preset, load) in [
        ("kvcache-c", LoadModel::Closed),
        (
            "friendfeed",
            LoadModel::Open {
                rate: 2000.0,
                arrival: Arrival::Poisson,
            },
        ),
    ] {
        let mut w = Workload::preset(preset).expect("preset");
        w.keys = 2000;
        let mut cfg = RunConfig::new(w, vec![udp.clone()]);
        cfg.conns = 2;
        cfg.depth = if load == LoadModel::Closed { 2 } else { 1000 };
        cfg.load = load;
        cfg.duration = Duration::from_millis(700);
        cfg.load_phase = true;
        cfg.look_aside = true;
        let r = run_against(&cfg, &[&mc]);
        // Loopback UDP with a 4 MiB receive buffer at this load loses nothing; if it ever
        // does, the dropped requests are counted and the server's counts run ahead.
        assert_eq!(r.stats.dropped, 0, "{preset}: {}", r.table());
        assert_counts_match(&r);
        let get = r.stats.op(kvblast::workload::Op::Get);
        assert!(get.count > 50 && get.hits > 0, "{preset}: {}", r.table());
        assert_eq!(
            r.stats.conn_failures + r.stats.timeouts,
            0,
            "{preset}: {}",
            r.table()
        );
    }
}

#[test]
fn unix_socket_server() {
    let path = std::env::temp_dir().join(format!("kvblast-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let child = Command::new(memcached_path())
        .args(["-u", "root", "-t", "1", "-s"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn memcached");
    let mc = Memcached {
        child,
        addr: format!("unix:{}", path.display()),
    };
    let deadline = Instant::now() + TIMEOUT;
    while std::os::unix::net::UnixStream::connect(&path).is_err() {
        assert!(
            Instant::now() < deadline,
            "memcached did not listen on {path:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut w = Workload::preset("memaslap").expect("memaslap");
    w.keys = 1000;
    let mut cfg = RunConfig::new(w, vec![mc.addr.clone()]);
    cfg.conns = 2;
    cfg.depth = 2;
    cfg.duration = Duration::from_millis(500);
    let r = run_against(&cfg, &[&mc]);
    assert_counts_match(&r);
    assert!(r.stats.all().count > 100);
    drop(mc);
    let _ = std::fs::remove_file(&path);
}

/// A fake server that answers every request with `reply`, then keeps the connection open.
/// Stops when `stop` is set, or after [`TIMEOUT`] at the latest (a backstop should the test
/// fail before it sets `stop`: a bound near the run's length would end the server while
/// kvblast still connects to it, on a slow machine).
fn hostile(
    reply: &'static [u8],
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    l.set_nonblocking(true).expect("nonblocking");
    let h = std::thread::spawn(move || {
        let deadline = Instant::now() + TIMEOUT;
        let mut conns = Vec::new();
        while Instant::now() < deadline && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((s, _)) = l.accept() {
                let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
                conns.push(s);
            }
            for s in conns.iter_mut() {
                let mut buf = [0u8; 4096];
                if let Ok(n) = s.read(&mut buf) {
                    if n > 0 {
                        let _ = s.write_all(reply);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    (addr, h)
}

#[test]
fn hostile_replies_do_not_crash_the_client() {
    let replies: [&'static [u8]; 5] = [
        b"HELLO\r\n",
        b"VALUE k 0 99999999999\r\n",
        b"VALUE k 0 3\r\nabcdef\r\n",
        b"STORED\r\nSTORED\r\nSTORED\r\nSTORED\r\nSTORED\r\nSTORED\r\n",
        b"VALUE k 0 1\r\nx\r\nVALUE k 0 1\r\nx\r\nEND\r\n",
    ];
    for reply in replies {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (addr, h) = hostile(reply, std::sync::Arc::clone(&stop));
        let mut w = Workload::preset("usr").expect("usr");
        w.keys = 100;
        let mut cfg = RunConfig::new(w, vec![addr]);
        cfg.duration = Duration::from_millis(300);
        cfg.drain = Duration::from_millis(200);
        let started = Instant::now();
        let r = engine::run(&cfg).expect("a run against a bad server still reports");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(
            r.stats.conn_failures > 0,
            "{:?}: {}",
            String::from_utf8_lossy(reply),
            r.table()
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = h.join();
    }
}

#[test]
fn hostile_udp_replies_are_dropped_not_fatal() {
    let sock = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = sock.local_addr().expect("addr");
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let h = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_millis(1500);
        let mut buf = [0u8; 2048];
        let mut n = 0u32;
        while Instant::now() < deadline {
            let Ok((len, peer)) = sock.recv_from(&mut buf) else {
                continue;
            };
            if len < 8 {
                continue;
            }
            let id = [buf[0], buf[1]];
            n += 1;
            let reply: Vec<u8> = match n % 5 {
                0 => vec![1, 2, 3],                                                  // runt
                1 => [&[id[0], id[1], 0, 5, 0, 1, 0, 0][..], b"END\r\n"].concat(),   // bad seq
                2 => [&[id[0], id[1], 0, 0, 0, 1, 0, 0][..], b"HELLO\r\n"].concat(), // garbage
                3 => [&[0xff, 0xff, 0, 0, 0, 1, 0, 0][..], b"END\r\n"].concat(),     // other id
                _ => [
                    &[id[0], id[1], 0, 0, 0, 1, 0, 0][..],
                    b"VALUE k 0 99\r\nx\r\n",
                ]
                .concat(),
            };
            let _ = sock.send_to(&reply, peer);
        }
    });
    let mut w = Workload::preset("usr").expect("usr");
    w.keys = 100;
    let mut cfg = RunConfig::new(w, vec![format!("udp:{addr}")]);
    cfg.duration = Duration::from_millis(400);
    cfg.drain = Duration::from_millis(200);
    cfg.udp_timeout = Duration::from_millis(50);
    let started = Instant::now();
    let r = engine::run(&cfg).expect("a run against a bad UDP server still reports");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(r.stats.dropped > 0, "{}", r.table());
    assert_eq!(r.stats.all().count, 0, "{}", r.table());
    let _ = h.join();
}

#[test]
fn master_and_agent_split_the_load() {
    let mc = start_memcached();
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind agent");
    let agent_addr = l.local_addr().expect("addr").to_string();
    let agent = std::thread::spawn(move || kvblast::agent::serve(l, Some(1)));
    let argv = [
        "run",
        "-w",
        "usr",
        "--keys",
        "1000",
        "--load",
        "--rate",
        "4000",
        "--arrival",
        "fixed",
        "-D",
        "1s",
        "--warmup",
        "200ms",
        "-c",
        "2",
        "-q",
        "--agent",
        &agent_addr,
        &mc.addr,
    ];
    let args = parse_args(&argv);
    let before = stats_of(&[&mc]);
    let mut r = kvblast::agent::run_with_agents(&args).expect("distributed run");
    r.server = Some(server_delta(&before, &stats_of(&[&mc])));
    assert_counts_match(&r);
    assert_eq!(r.target_rate, Some(4000.0));
    let offered = r.offered_rate();
    assert!((offered - 4000.0).abs() / 4000.0 < 0.01, "{}", r.table());
    assert_eq!(r.stats.all().count, r.stats.issued, "{}", r.table());
    let table = r.table();
    assert!(table.contains("agents"));
    // The load phase is split too: each participant set its own half, every key once.
    assert_eq!(r.stats.loaded, 1000, "{table}");
    // One line per participant, in the table and in the JSON, summing to the totals.
    let json: serde_json::Value = serde_json::from_str(&r.json()).expect("JSON");
    let ps = json["participants"].as_array().expect("participants");
    assert_eq!(ps.len(), 2, "{json}");
    assert_eq!(ps[0]["name"], "controller");
    assert_eq!(ps[1]["name"].as_str(), Some(agent_addr.as_str()));
    let sum = |k: &str| ps.iter().map(|p| p[k].as_u64().expect(k)).sum::<u64>();
    assert_eq!(sum("requests"), r.stats.all().count, "{table}");
    assert_eq!(sum("issued"), r.stats.issued, "{table}");
    assert_eq!(sum("errors"), 0, "{table}");
    let share: f64 = ps.iter().map(|p| p["share"].as_f64().expect("share")).sum();
    assert!((share - 1.0).abs() < 1e-6, "{json}");
    for p in ps {
        let name = p["name"].as_str().unwrap_or_default();
        assert!(table.contains(name), "{table}");
        // Uniform popularity over 1000 keys: half the rate each, and it was achieved.
        assert_eq!(p["target_rate"].as_f64(), Some(2000.0), "{p}");
        let rate = p["rate"].as_f64().expect("rate");
        assert!((rate - 2000.0).abs() / 2000.0 < 0.02, "{p}");
        // Started together (one machine: one clock).
        let skew = p["start_ms"].as_f64().expect("start_ms");
        assert!(
            skew.abs() < 50.0,
            "{name} started {skew} ms after the controller"
        );
        // Each drew from its own half of the keys (500 of them).
        let keys = p["distinct_keys"].as_u64().expect("distinct_keys");
        assert!(keys > 400 && keys <= 500, "{p}");
    }
    eprintln!("{table}");
    agent.join().expect("agent thread").expect("agent");
}

/// The flags of the `run` message a (fake) agent read, tab-separated and between tabs.
fn job_flags(line: &[u8]) -> String {
    match kvblast::agent::Message::parse(&String::from_utf8_lossy(line)) {
        Ok(kvblast::agent::Message::Run { args }) => format!("\t{}\t", args.join("\t")),
        other => panic!("the agent was sent {other:?}"),
    }
}

/// `kvblast ARGV...` parsed.
fn parse_args(argv: &[&str]) -> kvblast::cli::Args {
    kvblast::cli::Args::parse(argv.iter().map(|s| s.to_string())).expect("args")
}

/// A short open-loop run against `server` with one agent at `agent`, for the fake agents.
fn short_agent_run(agent: &str, server: &str) -> kvblast::cli::Args {
    parse_args(&[
        "run", "-w", "usr", "--keys", "100", "--rate", "1000", "-D", "300ms", "-q", "--agent",
        agent, server,
    ])
}

/// An agent that fails before the start (here: a fake one that answers its job with `err`
/// instead of `ready`) fails the run, naming it, and nobody sends measured load.
#[test]
fn agent_failing_before_the_start_fails_the_run() {
    let mc = start_memcached();
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind agent");
    let agent_addr = l.local_addr().expect("addr").to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while s.read(&mut b).map(|n| n == 1).unwrap_or(false) && b[0] != b'\n' {
            line.push(b[0]);
        }
        let err = kvblast::agent::Message::Err {
            message: "cannot connect to the server".into(),
        };
        let _ = s.write_all(err.to_line().expect("encode").as_bytes());
        job_flags(&line)
    });
    let args = short_agent_run(&agent_addr, &mc.addr);
    let before = stats_of(&[&mc]);
    let err = kvblast::agent::run_with_agents(&args).expect_err("the agent failed");
    let after = stats_of(&[&mc]);
    assert!(
        matches!(&err, kvblast::agent::AgentError::Remote { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("agent {agent_addr}: cannot connect to the server")
    );
    let job = fake.join().expect("fake agent");
    assert!(job.contains("\t--participant\t1/2\t"), "{job}");
    let d = server_delta(&before, &after);
    assert_eq!(d["cmd_get"] + d["cmd_set"], 0, "load was sent: {d:?}");
}

/// An agent that answers with something that is no message fails the run with an error
/// that names the agent and says what was wrong; nobody sends measured load.
#[test]
fn agent_sending_garbage_fails_the_run() {
    let mc = start_memcached();
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind agent");
    let agent_addr = l.local_addr().expect("addr").to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut b = [0u8; 1];
        while s.read(&mut b).map(|n| n == 1).unwrap_or(false) && b[0] != b'\n' {}
        let _ = s.write_all(b"READY\n");
    });
    let args = short_agent_run(&agent_addr, &mc.addr);
    let before = stats_of(&[&mc]);
    let err = kvblast::agent::run_with_agents(&args).expect_err("the agent sent garbage");
    let after = stats_of(&[&mc]);
    fake.join().expect("fake agent");
    assert!(
        matches!(&err, kvblast::agent::AgentError::Protocol { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("agent {agent_addr}: malformed message: ")),
        "{msg}"
    );
    let d = server_delta(&before, &after);
    assert_eq!(d["cmd_get"] + d["cmd_set"], 0, "load was sent: {d:?}");
}

/// With `--agent-keys split` (the default) the participants' keys are disjoint: a set-only
/// run over a small key space leaves memcached with exactly as many items as the sum of the
/// participants' distinct keys. With `shared` they overlap (the check can fail).
#[test]
fn agents_split_the_key_space() {
    for mode in ["split", "shared"] {
        let mc = start_memcached();
        let mut agents = Vec::new();
        let mut addrs = Vec::new();
        for _ in 0..2 {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind agent");
            addrs.push(l.local_addr().expect("addr").to_string());
            agents.push(std::thread::spawn(move || {
                kvblast::agent::serve(l, Some(1))
            }));
        }
        let argv = [
            "run",
            "-w",
            "usr",
            "--keys",
            "300",
            "--popularity",
            "zipf:0.9",
            "--mix",
            "set=1",
            "--rate",
            "6000",
            "-D",
            "500ms",
            "--drain",
            "300ms",
            "-q",
            "--agent-keys",
            mode,
            "--agent",
            &addrs[0],
            "--agent",
            &addrs[1],
            &mc.addr,
        ];
        let args = parse_args(&argv);
        let r = kvblast::agent::run_with_agents(&args).expect("distributed run");
        for a in agents {
            a.join().expect("agent thread").expect("agent");
        }
        let table = r.table();
        eprintln!("{mode}:\n{table}");
        let items = server_stats(&mc.addr, TIMEOUT, None).expect("stats")["curr_items"];
        let keys: Vec<u64> = r
            .participants
            .iter()
            .map(|p| p.distinct_keys.expect("distinct keys tracked"))
            .collect();
        assert_eq!(keys.len(), 3);
        let sum: u64 = keys.iter().sum();
        assert_eq!(
            r.participants.iter().map(|p| p.requests).sum::<u64>(),
            r.stats.all().count
        );
        for p in &r.participants {
            assert!(p.start_ms.abs() < 50.0, "{mode}: {p:?}");
            assert!(p.requests > 0, "{mode}: {p:?}");
        }
        if mode == "split" {
            assert_eq!(
                sum as i64, items,
                "{mode}: keys {keys:?}, memcached has {items}"
            );
            // Each share is 100 keys; the zipf shares' rates follow their popularity mass.
            assert!(keys.iter().all(|&k| k <= 100), "{keys:?}");
            let target: f64 = r.participants.iter().filter_map(|p| p.target_rate).sum();
            assert!((target - 6000.0).abs() < 1e-6, "{table}");
        } else {
            assert!(
                sum as i64 > items,
                "{mode}: keys {keys:?}, memcached has {items}"
            );
            assert!(keys.iter().all(|&k| k > 100), "{keys:?}");
        }
    }
}

/// The load phase over UDP finishes and stores every key, even with enough sockets and sets
/// in flight that the server's receive buffer overflows (lost sets are sent again).
#[test]
fn udp_load_phase_finishes_and_loads_every_key() {
    let mc = start_memcached_udp(true);
    let mut w = Workload::preset("usr").expect("usr");
    w.keys = 20_000;
    let mut cfg = RunConfig::new(w, vec![format!("udp:{}", mc.addr)]);
    cfg.threads = 2;
    cfg.conns = 50;
    cfg.duration = Duration::from_millis(300);
    cfg.drain = Duration::from_millis(300);
    cfg.load_phase = true;
    cfg.load_timeout = Duration::from_secs(20);
    let started = Instant::now();
    let r = engine::run(&cfg).expect("run");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}\n{}",
        r.table()
    );
    assert_eq!(r.stats.loaded, 20_000, "{}", r.table());
    let items = server_stats(&mc.addr, TIMEOUT, None).expect("stats");
    assert_eq!(items.get("curr_items").copied(), Some(20_000));
    assert!(
        r.stats.op(kvblast::workload::Op::Get).hits > 0,
        "{}",
        r.table()
    );
}

/// A UDP server that ignores every third datagram: the load phase sends each lost set again
/// and still sets every key once, quickly.
#[test]
fn udp_load_phase_sends_lost_sets_again() {
    let sock = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = sock.local_addr().expect("addr");
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = std::sync::Arc::clone(&stop);
    let h = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(8);
        let mut buf = [0u8; 2048];
        let mut n = 0u32;
        let mut keys = std::collections::HashSet::new();
        while Instant::now() < deadline && !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((len, peer)) = sock.recv_from(&mut buf) else {
                continue;
            };
            n += 1;
            if len < 8 || n % 3 == 0 {
                continue; // "lost"
            }
            let body = &buf[8..len];
            let reply: &[u8] = if let Some(rest) = body.strip_prefix(b"set ") {
                let key = rest.split(|&b| b == b' ').next().unwrap_or_default();
                keys.insert(key.to_vec());
                b"STORED\r\n"
            } else {
                b"END\r\n"
            };
            let _ = sock.send_to(
                &[&[buf[0], buf[1], 0, 0, 0, 1, 0, 0][..], reply].concat(),
                peer,
            );
        }
        keys
    });
    let mut w = Workload::preset("usr").expect("usr");
    w.keys = 500;
    w.mix = Mix::parse("get=1").expect("mix");
    let mut cfg = RunConfig::new(w, vec![format!("udp:{addr}")]);
    cfg.conns = 2;
    cfg.duration = Duration::from_millis(200);
    cfg.drain = Duration::from_millis(200);
    cfg.udp_timeout = Duration::from_millis(50);
    cfg.load_phase = true;
    cfg.load_timeout = Duration::from_secs(5);
    let started = Instant::now();
    let r = engine::run(&cfg).expect("run");
    assert!(started.elapsed() < Duration::from_secs(4), "{}", r.table());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let keys = h.join().expect("server thread");
    assert_eq!(r.stats.loaded, 500, "{}", r.table());
    assert!(r.stats.load_retries > 0, "{}", r.table());
    assert_eq!(keys.len(), 500, "every key reached the server");
}

/// A TCP proxy on loopback in front of `upstream`. At `cut_after` after the first connection
/// it accepts (not after it starts: kvblast's own start would eat into the time before the
/// cut on a slow machine) it closes every connection it carries; afterwards it accepts new
/// ones if `reopen`, else it closes its listener too.
/// Everything stops when `stop` is set, or after 8 s at the latest. The thread returns the
/// bytes it passed from the server to clients over connections accepted after the cut.
fn cutting_proxy(
    upstream: String,
    cut_after: Duration,
    reopen: bool,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (String, std::thread::JoinHandle<u64>) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind proxy");
    let addr = l.local_addr().expect("addr").to_string();
    l.set_nonblocking(true).expect("nonblocking");
    let h = std::thread::spawn(move || {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(8);
        let after_cut = Arc::new(AtomicU64::new(0));
        let mut listener = Some(l);
        let mut open: Vec<TcpStream> = Vec::new();
        let mut pumps = Vec::new();
        let mut cut = false;
        let mut first_accept: Option<Instant> = None;
        // Copy one direction until EOF, an error, the stop flag or the deadline.
        let pump = |mut from: TcpStream,
                    mut to: TcpStream,
                    count: Option<Arc<AtomicU64>>,
                    stop: Arc<AtomicBool>| {
            std::thread::spawn(move || {
                let mut buf = [0u8; 16384];
                while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    match from.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                            if let Some(c) = &count {
                                c.fetch_add(n as u64, Ordering::Relaxed);
                            }
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        Err(_) => break,
                    }
                }
                let _ = from.shutdown(std::net::Shutdown::Both);
                let _ = to.shutdown(std::net::Shutdown::Both);
            })
        };
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            if !cut && first_accept.is_some_and(|t| t.elapsed() >= cut_after) {
                cut = true;
                for s in open.drain(..) {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
                if !reopen {
                    listener = None;
                }
            }
            if let Some(Ok((client, _))) = listener.as_ref().map(|l| l.accept()) {
                if first_accept.is_none() {
                    first_accept = Some(Instant::now());
                }
                let Ok(up) = TcpStream::connect(&upstream) else {
                    continue;
                };
                for s in [&client, &up] {
                    s.set_read_timeout(Some(Duration::from_millis(50)))
                        .expect("timeout");
                }
                let (Ok(c2), Ok(u2), Ok(c3), Ok(u3)) = (
                    client.try_clone(),
                    up.try_clone(),
                    client.try_clone(),
                    up.try_clone(),
                ) else {
                    continue;
                };
                let count = cut.then(|| Arc::clone(&after_cut));
                pumps.push(pump(client, up, None, Arc::clone(&stop)));
                pumps.push(pump(u2, c2, count, Arc::clone(&stop)));
                open.push(c3);
                open.push(u3);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        for s in &open {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for p in pumps {
            let _ = p.join();
        }
        after_cut.load(Ordering::Relaxed)
    });
    (addr, h)
}

/// The server drops every connection mid-run: kvblast counts the failures, reconnects, and
/// requests succeed again over the new connections, in the closed and the open loop.
#[test]
fn reconnects_after_the_server_drops_connections() {
    let mc = start_memcached();
    for load in [
        LoadModel::Closed,
        LoadModel::Open {
            rate: 3000.0,
            arrival: Arrival::Poisson,
        },
    ] {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (addr, proxy) = cutting_proxy(
            mc.addr.clone(),
            Duration::from_millis(400),
            true,
            std::sync::Arc::clone(&stop),
        );
        let mut w = Workload::preset("usr").expect("usr");
        w.keys = 1000;
        let mut cfg = RunConfig::new(w, vec![addr]);
        cfg.conns = 3;
        cfg.depth = if load == LoadModel::Closed { 2 } else { 100 };
        cfg.load = load;
        cfg.duration = Duration::from_millis(1200);
        cfg.drain = Duration::from_millis(300);
        let started = Instant::now();
        let r = engine::run(&cfg).expect("run");
        let took = started.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let after_cut = proxy.join().expect("proxy");
        let what = format!("{load:?}: {}", r.table());
        assert!(took < Duration::from_secs(3), "took {took:?}; {what}");
        assert!(r.stats.conn_failures >= 3, "{what}");
        assert!(r.stats.reconnects >= 3, "{what}");
        // Replies came back over the connections made after the cut.
        assert!(after_cut > 100, "{after_cut} bytes after the cut; {what}");
        assert!(r.stats.all().count > 500, "{what}");
    }
}

/// The server goes away for good mid-run: kvblast keeps trying (with backoff) and still stops
/// at the run's deadline.
#[test]
fn run_ends_at_its_deadline_when_the_server_is_gone() {
    let mc = start_memcached();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (addr, proxy) = cutting_proxy(
        mc.addr.clone(),
        Duration::from_millis(300),
        false,
        std::sync::Arc::clone(&stop),
    );
    let mut w = Workload::preset("usr").expect("usr");
    w.keys = 1000;
    let mut cfg = RunConfig::new(w, vec![addr]);
    cfg.conns = 2;
    cfg.load = LoadModel::Open {
        rate: 2000.0,
        arrival: Arrival::Fixed,
    };
    cfg.depth = 100;
    cfg.duration = Duration::from_millis(1000);
    cfg.drain = Duration::from_millis(300);
    let started = Instant::now();
    let r = engine::run(&cfg).expect("run");
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = proxy.join();
    assert!(took < Duration::from_millis(2500), "took {took:?}");
    assert_eq!(r.stats.reconnects, 0, "{}", r.table());
    // The two failures, then refused attempts with backoff (10, 20, 40, ... ms).
    assert!(r.stats.conn_failures > 4, "{}", r.table());
    assert!(r.stats.unsent > 500, "{}", r.table());
    assert!(r.stats.all().count > 300, "{}", r.table());
}

/// The value lengths memcached holds for `keys` (one multiget; missing keys are left out).
fn value_lengths(addr: &str, keys: &[String]) -> Vec<usize> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    s.write_all(format!("get {}\r\n", keys.join(" ")).as_bytes())
        .expect("send get");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    while !(buf.ends_with(b"END\r\n") && (buf.len() == 5 || buf.ends_with(b"\r\nEND\r\n"))) {
        let n = s.read(&mut chunk).expect("read get reply");
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut lens = Vec::new();
    let mut at = 0;
    while buf[at..].starts_with(b"VALUE ") {
        let eol = at
            + buf[at..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("line");
        let header = std::str::from_utf8(&buf[at..eol]).expect("header");
        let len: usize = header
            .rsplit(' ')
            .next()
            .and_then(|l| l.parse().ok())
            .expect("length");
        lens.push(len);
        at = eol + 2 + len + 2;
    }
    assert_eq!(&buf[at..], b"END\r\n");
    lens
}

/// `--value-size hist:FILE`: a load phase with a histogram of only 100- and 300-byte values
/// (weights 3:1) leaves memcached with every key, each value 100 or 300 bytes long, about
/// three quarters of them 100.
#[test]
fn histogram_value_sizes_reach_memcached() {
    let mc = start_memcached();
    let dir = std::env::temp_dir().join(format!("kvblast-hist-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let file = dir.join("values.hist");
    std::fs::write(&file, "# size weight\n100 3\n300 1\n").expect("write histogram");
    let keys = 400;
    let out = Command::new(env!("CARGO_BIN_EXE_kvblast"))
        .args(["run", "-w", "usr", "--keys", &keys.to_string(), "--load"])
        .args(["--mix", "get=1", "-n", "200", "-q", "--no-server-stats"])
        .arg("--value-size")
        .arg(format!("hist:{}", file.display()))
        .arg(&mc.addr)
        .output()
        .expect("run kvblast");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = (0..keys).map(|i| format!("{i:019}")).collect();
    let lens = value_lengths(&mc.addr, &names);
    assert_eq!(lens.len(), keys, "every key loaded");
    assert!(lens.iter().all(|l| *l == 100 || *l == 300), "{lens:?}");
    let small = lens.iter().filter(|l| **l == 100).count() as f64 / keys as f64;
    // 5 standard deviations of a binomial proportion around 0.75 (n = 400): ±0.11.
    assert!(
        (small - 0.75).abs() < 0.11,
        "{small} of the values are 100 bytes"
    );
    // A bad histogram fails the run with the file and line, before any load.
    std::fs::write(&file, "100 3\n300 -1\n").expect("write histogram");
    let out = Command::new(env!("CARGO_BIN_EXE_kvblast"))
        .args(["run", "-w", "usr", "-n", "10", "-q", "--value-size"])
        .arg(format!("hist:{}", file.display()))
        .arg(&mc.addr)
        .output()
        .expect("run kvblast");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("{}:2: weight -1 is negative", file.display())),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job sent to an agent carries a histogram's contents, not its path (remote agents have
/// no copy of the file): a fake agent records the job line.
#[test]
fn agents_get_histograms_inline() {
    let mc = start_memcached();
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind agent");
    let agent_addr = l.local_addr().expect("addr").to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while s.read(&mut b).map(|n| n == 1).unwrap_or(false) && b[0] != b'\n' {
            line.push(b[0]);
        }
        let err = kvblast::agent::Message::Err {
            message: "fake agent".into(),
        };
        let _ = s.write_all(err.to_line().expect("encode").as_bytes());
        job_flags(&line)
    });
    let dir = std::env::temp_dir().join(format!("kvblast-hist-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let (values, keys) = (dir.join("v.hist"), dir.join("k.hist"));
    std::fs::write(&values, "100 3\n300 1\n").expect("write");
    std::fs::write(&keys, "20 1\n").expect("write");
    let vspec = format!("hist:{}", values.display());
    let kspec = format!("hist:{}", keys.display());
    let argv = [
        "run",
        "-w",
        "usr",
        "--keys",
        "100",
        "--rate",
        "1000",
        "-D",
        "300ms",
        "-q",
        "--value-size",
        &vspec,
        "--key-size",
        &kspec,
        "--agent",
        &agent_addr,
        &mc.addr,
    ];
    let args = parse_args(&argv);
    let err = kvblast::agent::run_with_agents(&args).expect_err("the fake agent failed");
    assert_eq!(err.to_string(), format!("agent {agent_addr}: fake agent"));
    let job = fake.join().expect("fake agent");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        job.contains("--value-size\thist-inline:100:3.0,300:1.0\t"),
        "{job}"
    );
    assert!(job.contains("--key-size\thist-inline:20:1.0\t"), "{job}");
    assert!(!job.contains("hist:"), "a path was sent: {job}");
}

/// kvblast over TLS against memcached with `-Z` (Debian's is built with TLS): every request
/// answered, server stats read over TLS too; with an untrusted CA nothing gets through.
#[test]
fn tls_runs_against_memcached_with_tls() {
    let dir = std::env::temp_dir().join(format!("kvblast-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ca = kvtls::testcert::Ca::new("kvblast test CA");
    let server = ca.issue("localhost", false, false);
    let (cert, key, ca_file) = (dir.join("s.pem"), dir.join("s.key"), dir.join("ca.pem"));
    std::fs::write(&cert, server.cert_pem()).expect("write");
    std::fs::write(&key, server.key_pem()).expect("write");
    std::fs::write(&ca_file, ca.cert_pem()).expect("write");
    let settings = kvtls::client::Settings {
        ca: Some(ca_file.clone()),
        server_name: Some("localhost".into()),
        ..Default::default()
    };
    let tls = kvblast::transport::Tls::new(settings).expect("client config");
    let opts = format!(
        "ssl_chain_cert={},ssl_key={}",
        cert.display(),
        key.display()
    );
    let mc = start_memcached_with(false, &["-Z".into(), "-o".into(), opts], Some(&tls));
    let mut w = Workload::preset("etc").expect("etc");
    w.keys = 500;
    w.value_size.max = 40_000;
    let mut cfg = RunConfig::new(w, vec![mc.addr.clone()]);
    cfg.conns = 4;
    cfg.depth = 4;
    cfg.requests = Some(3000);
    cfg.duration = Duration::ZERO;
    cfg.look_aside = true;
    cfg.tls = Some(tls.clone());
    let r = kvblast::engine::run(&cfg).expect("run");
    let st = &r.stats;
    assert_eq!(st.timeouts + st.lost + st.conn_failures, 0);
    assert!(st.all().count >= 3000);
    assert_eq!(st.all().errors, 0);
    let stats = server_stats(&mc.addr, TIMEOUT, Some(&tls)).expect("stats");
    assert!(stats["cmd_get"] >= st.op(kvblast::workload::Op::Get).count as i64);

    // A client that trusts another CA never gets a request through.
    let stranger = kvtls::testcert::Ca::new("another CA");
    std::fs::write(&ca_file, stranger.cert_pem()).expect("write");
    let bad = kvblast::transport::Tls::new(kvtls::client::Settings {
        ca: Some(ca_file),
        server_name: Some("localhost".into()),
        ..Default::default()
    })
    .expect("client config");
    assert!(server_stats(&mc.addr, Duration::from_secs(5), Some(&bad)).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--pipeline batch` against memcached, over every protocol and transport kvblast speaks:
/// a run bounded by a request count sends exactly that many, one bounded by time sends
/// whole batches only (the measured requests are a multiple of the depth), the server counts
/// what kvblast counts, and the reports name the mode.
#[test]
fn batch_pipeline_runs_against_memcached() {
    let mc = start_memcached_udp(true);
    let udp = format!("udp:{}", mc.addr);
    for (protocol, server) in [
        (Protocol::Text, &mc.addr),
        (Protocol::Meta, &mc.addr),
        (Protocol::Binary, &mc.addr),
        (Protocol::Text, &udp),
    ] {
        let what = format!("{protocol:?} {server}");
        let mut w = Workload::preset("usr").expect("usr");
        w.keys = 1000;
        w.mix = Mix::parse("get=0.9,set=0.1").expect("mix");
        let mut cfg = RunConfig::new(w, vec![server.clone()]);
        cfg.protocol = protocol;
        cfg.conns = 2;
        cfg.depth = 8;
        cfg.pipeline = Pipeline::Batch;
        cfg.requests = Some(500);
        cfg.duration = Duration::from_secs(20);
        let r = run_against(&cfg, &[&mc]);
        assert_counts_match(&r);
        assert_eq!(r.stats.all().count, 500, "{what}: {}", r.table());
        assert_eq!(r.stats.issued, 500, "{what}");
        assert_eq!((r.pipeline, r.depth), (Pipeline::Batch, 8), "{what}");
        // Bounded by time: whole batches of 8, at least a few per connection.
        cfg.requests = None;
        cfg.duration = Duration::from_millis(400);
        cfg.look_aside = true;
        let r = run_against(&cfg, &[&mc]);
        assert_counts_match(&r);
        let st = &r.stats;
        // A look-aside set takes a slot of the next batch: whole batches are in the count of
        // measured requests (drawn ones and sets), all answered.
        let sent = st.all().count;
        assert_eq!(sent % 8, 0, "{what}: {sent} requests\n{}", r.table());
        assert!(st.issued >= 2 * 8 * 4, "{what}: {}", r.table());
        assert_eq!(
            st.timeouts + st.lost + st.conn_failures + st.dropped,
            0,
            "{what}"
        );
        assert!(r.table().contains("batches of 8"), "{}", r.table());
        assert!(r.json().contains("\"pipeline\": \"batch\""), "{what}");
    }
    // The binary: --pipeline in the help, the text report and the JSON report.
    let dir = std::env::temp_dir().join(format!("kvblast-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let json = dir.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_kvblast"))
        .args(["run", "-w", "usr", "--keys", "500", "-c", "2", "-d", "4"])
        .args(["--pipeline", "batch", "-n", "400", "-q", "--json"])
        .arg(&json)
        .arg(&mc.addr)
        .output()
        .expect("run kvblast");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("batches of 4"), "{stdout}");
    let text = std::fs::read_to_string(&json).expect("json written");
    assert!(
        text.contains("\"pipeline\": \"batch\",\n  \"depth\": 4,"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    // An open loop, and a capacity search (open-loop steps), refuse batches before any load.
    for args in [
        &["run", "--rate", "1000"][..],
        &["capacity", "--low", "100", "--high", "200"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvblast"))
            .args(args)
            .args(["--pipeline", "batch", "-q", "--no-server-stats", &mc.addr])
            .output()
            .expect("run kvblast");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(stderr.contains("--pipeline batch"), "{args:?}: {stderr}");
    }
}

/// A server that answers one request at a time (`END`, a miss), and records each arrival of
/// requests: how many were outstanding just before it, and how many it brought. Bytes that
/// arrive within 5 ms of each other are one arrival (a batch is one write on loopback).
fn pacing_server(
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (String, std::thread::JoinHandle<Vec<(usize, usize)>>) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let h = std::thread::spawn(move || {
        let mut arrivals = Vec::new();
        let Ok((mut s, _)) = l.accept() else {
            return arrivals;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(5)));
        let deadline = Instant::now() + TIMEOUT;
        let (mut received, mut answered, mut partial) = (0usize, 0usize, Vec::new());
        while Instant::now() < deadline && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let before = received - answered;
            let mut got = 0;
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => return arrivals,
                    Ok(n) => {
                        partial.extend_from_slice(&buf[..n]);
                        while let Some(i) = partial.windows(2).position(|w| w == b"\r\n") {
                            partial.drain(..i + 2);
                            got += 1;
                        }
                    }
                    Err(_) => break,
                }
            }
            if got > 0 {
                arrivals.push((before, got));
                received += got;
            }
            if received > answered {
                if s.write_all(b"END\r\n").is_err() {
                    return arrivals;
                }
                answered += 1;
            }
        }
        arrivals
    });
    (addr, h)
}

/// On the wire: a batch of `depth` goes out only once every reply of the last is in, and
/// never more than `depth` are outstanding; a window sends into each freed slot.
#[test]
fn batches_wait_for_all_replies_on_the_wire() {
    for pipeline in [Pipeline::Batch, Pipeline::Window] {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (addr, server) = pacing_server(stop.clone());
        let mut w = Workload::preset("usr").expect("usr");
        w.keys = 100;
        w.mix = Mix::parse("get=1").expect("mix");
        let mut cfg = RunConfig::new(w, vec![addr]);
        cfg.depth = 4;
        cfg.pipeline = pipeline;
        cfg.duration = Duration::from_millis(500);
        cfg.drain = Duration::from_millis(300);
        let r = engine::run(&cfg).expect("run");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let arrivals = server.join().expect("server");
        assert!(
            arrivals.len() >= 5,
            "{pipeline:?}: {arrivals:?}\n{}",
            r.table()
        );
        assert!(
            arrivals.iter().all(|(before, got)| before + got <= 4),
            "{pipeline:?}: more than 4 outstanding: {arrivals:?}"
        );
        match pipeline {
            Pipeline::Batch => assert!(
                arrivals.iter().all(|a| *a == (0, 4)),
                "a batch came before the last was answered, or not whole: {arrivals:?}"
            ),
            // (3, 1) each time, unless the machine is slow enough that the server answers
            // again before a refill arrives: only "while others are outstanding" is certain.
            Pipeline::Window => assert!(
                arrivals.iter().skip(1).any(|(before, _)| *before > 0),
                "a window refills each slot: {arrivals:?}"
            ),
        }
    }
}
