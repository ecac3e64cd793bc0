//! End-to-end: kvblast against Debian's memcached 1.6 (`/usr/bin/memcached`, or $MEMCACHED)
//! on free loopback ports. Every run is short (at most a few seconds) and bounded in count and
//! time; traffic goes only to 127.0.0.1.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvblast::dist::Arrival;
use kvblast::engine::{self, LoadModel, Protocol, RunConfig};
use kvblast::stats::{server_delta, server_stats, Report};
use kvblast::workload::{Mix, Workload};

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

fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

fn start_memcached() -> Memcached {
    start_memcached_udp(false)
}

/// memcached on a free port; with `udp`, also on the same UDP port (memcached keeps UDP off
/// by default).
fn start_memcached_udp(udp: bool) -> Memcached {
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
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn memcached");
        let mut mc = Memcached {
            child,
            addr: format!("127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if TcpStream::connect(&mc.addr).is_ok() {
                // Parallel tests can pick the same free port: then ours failed to bind and
                // exited, and what answered is another test's server. Keep it only if it is ours.
                let pid = server_stats(&mc.addr, Duration::from_secs(5))
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
        .map(|m| server_stats(&m.addr, Duration::from_secs(5)).expect("stats"))
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
    w.mix = Mix::parse("get=0.7,set=0.2,delete=0.05,touch=0.05").expect("mix");
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
    cfg.duration = Duration::from_secs(3);
    cfg.conns = 2;
    cfg.depth = 2;
    let r = run_against(&cfg, &[&mc]);
    assert_counts_match(&r);
    assert_eq!(r.stats.all().count, 3000);
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
    for plot in ["plot-latency.svg", "plot-timeline.svg"] {
        let svg = std::fs::read_to_string(dir.join(plot)).expect("plot written");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn capacity_search_finds_a_rate() {
    let mc = start_memcached();
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
                w.mix = Mix::parse("get=0.6,set=0.2,delete=0.1,touch=0.05,incr=0.05").expect("mix");
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
    let deadline = Instant::now() + Duration::from_secs(5);
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
/// Stops when `stop` is set, or after 1.5 s at the latest.
fn hostile(
    reply: &'static [u8],
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    l.set_nonblocking(true).expect("nonblocking");
    let h = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_millis(1500);
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
    let args = kvblast::cli::Args::parse(argv.iter().map(|s| s.to_string())).expect("args");
    let before = stats_of(&[&mc]);
    let mut r = kvblast::agent::run_with_agents(&args).expect("distributed run");
    r.server = Some(server_delta(&before, &stats_of(&[&mc])));
    assert_counts_match(&r);
    assert_eq!(r.target_rate, Some(4000.0));
    let offered = r.offered_rate();
    assert!((offered - 4000.0).abs() / 4000.0 < 0.01, "{}", r.table());
    assert_eq!(r.stats.all().count, r.stats.issued, "{}", r.table());
    assert!(r.table().contains("agents"));
    agent.join().expect("agent thread").expect("agent");
}
