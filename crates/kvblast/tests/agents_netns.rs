//! Distributed load across network namespaces (issue 5): a controller and two agents, each in
//! its own namespace, load one memcached in a fourth; the controller's merged report must
//! account for every request the server saw. And an unreachable agent is a clear, prompt
//! error.
//!
//! Layout of one test (`n` is unique per test in this process, names carry the pid too):
//!
//! ```text
//!   namespace kvb<pid>-<n>s: memcached -l 10.78.<n>.1 -p 11211, on bridge br0 10.78.<n>.1/24
//!        br0 ports: veth kb<pid>x<n>{c,1,2}
//!                     |            |             |
//!   kvb<pid>-<n>c     kvb<pid>-<n>1     kvb<pid>-<n>2    (veth peers kb<pid>y<n>{c,1,2})
//!   controller        agent             agent
//!   10.78.<n>.2       10.78.<n>.3:5555  10.78.<n>.4:5555
//! ```
//!
//! Every process runs under `ip netns exec` (which execs, so the child *is* the program). The
//! test reads memcached's `stats` from a thread that entered the server's namespace with
//! `setns(2)`, so all traffic stays in the namespaces the test creates. The approach (and the
//! helpers below) come from the workspace's `tests/replication_netns.rs`.
//!
//! Without root or iproute2 (creating a namespace fails) every test says so on stderr
//! (`skip`) and passes; without /usr/bin/memcached likewise. Every wait is a deadline poll. A guard kills
//! the processes and deletes the namespaces even when a test fails (and then prints the tail
//! of each process's log).

#[path = "../../../tests/common/netns.rs"]
mod netns;
#[path = "../../../tests/common/skip.rs"]
mod skip;

use netns::{in_netns, must, run};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MEMCACHED: &str = "/usr/bin/memcached";
const MC_PORT: u16 = 11211;
const AGENT_PORT: u16 = 5555;
/// Startup waits (a server or agent listening).
const TIMEOUT: Duration = Duration::from_secs(10);
/// Per-process counter that makes each test's names and subnet unique.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The namespaces, by index: the server's (holding the bridge), the controller's, two agents'.
const S: usize = 0;
const C: usize = 1;
const A1: usize = 2;
const A2: usize = 3;
const ROLES: [&str; 4] = ["server", "controller", "agent1", "agent2"];
/// Each namespace's letter in names.
const TAG: [&str; 4] = ["s", "c", "1", "2"];

/// A process running in one of the namespaces, with its stderr in a log file.
struct NsProc {
    name: String,
    child: Child,
    log: PathBuf,
}

/// Four namespaces joined by a bridge in the server's, and the processes in them. Dropping it
/// kills the processes and deletes the namespaces.
struct Net {
    test: &'static str,
    /// This test's number: its subnet is 10.78.<n>.0/24.
    n: u32,
    ns: [String; 4],
    ip: [String; 4],
    procs: Vec<NsProc>,
}

impl Net {
    /// Create the namespaces, the bridge and the veth pairs, or say why not (`skip`) and return
    /// None when this machine cannot (not root, no `ip`, no memcached).
    fn new(test: &'static str) -> Option<Net> {
        if !Path::new(MEMCACHED).exists() {
            skip::skip(format_args!("no {MEMCACHED}"));
            return None;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed) + 1;
        let pid = std::process::id();
        let ns = TAG.map(|t| format!("kvb{pid}-{n}{t}"));
        let ip = [1, 2, 3, 4].map(|h| format!("10.78.{n}.{h}"));
        // Leftovers of an earlier run whose pid was the same (its guard never ran).
        for name in &ns {
            let _ = run("ip", &["netns", "del", name]);
        }
        if let Err(e) = run("ip", &["netns", "add", &ns[S]]) {
            skip::skip(format_args!(
                "cannot create a network namespace ({e}); these tests need root and iproute2"
            ));
            return None;
        }
        // From here on the guard deletes whatever was created.
        let net = Net {
            test,
            n,
            ns,
            ip,
            procs: Vec::new(),
        };
        for i in [C, A1, A2] {
            must("ip", &["netns", "add", &net.ns[i]]);
        }
        let s = net.ns[S].as_str();
        must("ip", &["-n", s, "link", "add", "br0", "type", "bridge"]);
        let cidr = format!("{}/24", net.ip[S]);
        must("ip", &["-n", s, "addr", "add", &cidr, "dev", "br0"]);
        must("ip", &["-n", s, "link", "set", "br0", "up"]);
        for i in [C, A1, A2] {
            // At most 15 characters (IFNAMSIZ - 1): "kb" + 7-digit pid + "x" + n + tag.
            let port = format!("kb{pid}x{n}{}", TAG[i]);
            let dev = format!("kb{pid}y{n}{}", TAG[i]);
            let other = net.ns[i].as_str();
            must(
                "ip",
                &[
                    "link", "add", &port, "netns", s, "type", "veth", "peer", "name", &dev,
                    "netns", other,
                ],
            );
            must("ip", &["-n", s, "link", "set", &port, "master", "br0"]);
            must("ip", &["-n", s, "link", "set", &port, "up"]);
            let cidr = format!("{}/24", net.ip[i]);
            must("ip", &["-n", other, "addr", "add", &cidr, "dev", &dev]);
            must("ip", &["-n", other, "link", "set", &dev, "up"]);
        }
        for name in &net.ns {
            must("ip", &["-n", name, "link", "set", "lo", "up"]);
        }
        Some(net)
    }

    /// Spawn `program args` in namespace `i`, stderr (and stdout) to log files; returns its
    /// index in `procs`.
    fn spawn(&mut self, i: usize, name: &str, program: &str, args: &[&str]) -> usize {
        let log = std::env::temp_dir().join(format!("{}-{name}.log", self.ns[i]));
        let out = std::env::temp_dir().join(format!("{}-{name}.out", self.ns[i]));
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns[i], program])
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(&out).expect("create a stdout file"))
            .stderr(File::create(&log).expect("create a log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("{}: spawn {name}: {e}", self.test));
        self.procs.push(NsProc {
            name: name.to_string(),
            child,
            log,
        });
        self.procs.len() - 1
    }

    /// Start memcached in the server's namespace and wait until every other namespace reaches
    /// it over the bridge.
    fn start_memcached(&mut self) {
        let port = MC_PORT.to_string();
        let ip = self.ip[S].clone();
        self.spawn(
            S,
            "memcached",
            MEMCACHED,
            &["-u", "root", "-l", &ip, "-p", &port, "-t", "1"],
        );
        for i in [S, C, A1, A2] {
            let deadline = Instant::now() + TIMEOUT;
            while let Err(e) = self.connect(i, S, MC_PORT) {
                assert!(
                    Instant::now() < deadline,
                    "{}: memcached not reachable from the {} namespace within {TIMEOUT:?}: {e}",
                    self.test,
                    ROLES[i]
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Start `kvblast agent` in namespace `i`, listening on its address, and wait until it
    /// says it listens.
    fn start_agent(&mut self, i: usize) -> String {
        let addr = format!("{}:{AGENT_PORT}", self.ip[i]);
        let p = self.spawn(
            i,
            ROLES[i],
            env!("CARGO_BIN_EXE_kvblast"),
            &["agent", "--listen", &addr],
        );
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let log = std::fs::read_to_string(&self.procs[p].log).unwrap_or_default();
            if log.contains("listening on") {
                break;
            }
            if let Ok(Some(status)) = self.procs[p].child.try_wait() {
                panic!(
                    "{}: {} exited at start ({status}): {log}",
                    self.test, ROLES[i]
                );
            }
            assert!(
                Instant::now() < deadline,
                "{}: {} did not listen within {TIMEOUT:?}",
                self.test,
                ROLES[i]
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        addr
    }

    /// A TCP connection from namespace `from` to namespace `to`'s address, port `port`.
    fn connect(&self, from: usize, to: usize, port: u16) -> io::Result<TcpStream> {
        let addr = SocketAddr::from((self.ip[to].parse::<Ipv4Addr>().unwrap(), port));
        in_netns(&self.ns[from], move || {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.set_write_timeout(Some(Duration::from_secs(5)))?;
            Ok(s)
        })
    }

    /// memcached's numeric `stats`, read from inside the server's namespace.
    fn stats(&self) -> BTreeMap<String, i64> {
        let s = self
            .connect(S, S, MC_PORT)
            .unwrap_or_else(|e| panic!("{}: connect for stats: {e}", self.test));
        let mut out = BTreeMap::new();
        for line in command(&s, "stats") {
            let mut f = line.split(' ');
            if let (Some("STAT"), Some(k), Some(v)) = (f.next(), f.next(), f.next()) {
                if let Ok(v) = v.parse() {
                    out.insert(k.to_string(), v);
                }
            }
        }
        out
    }

    /// Run the kvblast controller in its namespace with `args`; wait at most `limit` for it to
    /// exit (kill it and fail otherwise). Returns its status, stdout, stderr and run time.
    fn controller(&mut self, args: &[&str], limit: Duration) -> (ExitStatus, String, String) {
        let p = self.spawn(C, "controller", env!("CARGO_BIN_EXE_kvblast"), args);
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.procs[p].child.try_wait().expect("wait") {
                break status;
            }
            if started.elapsed() > limit {
                let _ = self.procs[p].child.kill();
                let _ = self.procs[p].child.wait();
                panic!(
                    "{}: `kvblast {}` did not finish within {limit:?}",
                    self.test,
                    args.join(" ")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let log = self.procs[p].log.clone();
        let stderr = std::fs::read_to_string(&log).unwrap_or_default();
        let stdout = std::fs::read_to_string(log.with_extension("out")).unwrap_or_default();
        eprintln!(
            "{}: `kvblast {}` exited ({status}) after {:?}",
            self.test,
            args.join(" "),
            started.elapsed()
        );
        (status, stdout, stderr)
    }

    /// Whether process `name` is still running.
    fn alive(&mut self, name: &str) -> bool {
        let p = self.procs.iter_mut().find(|p| p.name == name).expect(name);
        matches!(p.child.try_wait(), Ok(None))
    }

    /// Packets sent from namespace `i` (not the server's) over its link to the bridge.
    fn tx_packets(&self, i: usize) -> u64 {
        let dev = format!("kb{}y{}{}", std::process::id(), self.n, TAG[i]);
        // /proc/thread-self/net/dev lists the devices of the reading thread's namespace.
        let text = in_netns(&self.ns[i], || {
            std::fs::read_to_string("/proc/thread-self/net/dev")
        })
        .unwrap_or_else(|e| panic!("{}: read the counters of {dev}: {e}", self.test));
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(name, _)| name.trim() == dev)
            .and_then(|(_, f)| f.split_whitespace().nth(9)?.parse().ok())
            .unwrap_or_else(|| panic!("{}: no counters for {dev} in\n{text}", self.test))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
            let out = p.log.with_extension("out");
            if failed {
                let log = std::fs::read_to_string(&p.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                eprintln!(
                    "{}: {} log (kept in {}), last lines:\n{}",
                    self.test,
                    p.name,
                    p.log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            } else {
                let _ = std::fs::remove_file(&p.log);
                let _ = std::fs::remove_file(out);
            }
        }
        for ns in &self.ns {
            let _ = run("ip", &["netns", "del", ns]);
        }
    }
}

/// Send a text command on `s` and return the reply's lines up to (not including) `END`.
fn command(s: &TcpStream, cmd: &str) -> Vec<String> {
    let mut w = s;
    w.write_all(format!("{cmd}\r\n").as_bytes())
        .expect("send a command to memcached");
    let mut r = BufReader::new(s);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).expect("read memcached's reply");
        assert!(n > 0, "memcached closed the connection during `{cmd}`");
        let line = line.trim_end().to_string();
        if line == "END" {
            return lines;
        }
        lines.push(line);
    }
}

/// Watch memcached's `stats conns` from the server's namespace every 20 ms until stopped,
/// collecting the peer address (`ip:port`) of every TCP connection seen.
struct ConnWatcher {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<BTreeSet<String>>,
}

impl ConnWatcher {
    fn start(net: &Net) -> ConnWatcher {
        let s = net.connect(S, S, MC_PORT).expect("connect the watcher");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = BTreeSet::new();
            while !flag.load(Ordering::Relaxed) {
                for line in command(&s, "stats conns") {
                    // STAT <fd>:addr tcp:10.78.1.3:40000
                    if let Some(addr) = line.split(":addr tcp:").nth(1) {
                        seen.insert(addr.to_string());
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        });
        ConnWatcher { stop, thread }
    }

    /// The peers seen, by IP: how many distinct connections (ports) from each.
    fn finish(self) -> BTreeMap<String, usize> {
        self.stop.store(true, Ordering::Relaxed);
        let seen = self.thread.join().expect("the watcher thread");
        let mut by_ip = BTreeMap::new();
        for addr in seen {
            if let Some((ip, _port)) = addr.rsplit_once(':') {
                *by_ip.entry(ip.to_string()).or_insert(0) += 1;
            }
        }
        by_ip
    }
}

fn f64_at(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("report field {} is not a number: {x}", path.join(".")))
}

/// A controller and two agents in three namespaces load memcached in a fourth at 3,000/s
/// (1,000/s each). The merged report's counts equal memcached's own counter deltas (so every
/// agent's counters were merged), the achieved rate is within 10% of the target, the
/// percentiles are there, and memcached saw connections from each of the three addresses,
/// each namespace sending a fair share of the packets.
#[test]
fn agents_in_namespaces_share_the_load_and_merge_exactly() {
    let test = "agents_in_namespaces_share_the_load_and_merge_exactly";
    let Some(mut net) = Net::new(test) else {
        return;
    };
    net.start_memcached();
    let a1 = net.start_agent(A1);
    let a2 = net.start_agent(A2);
    let server = format!("{}:{MC_PORT}", net.ip[S]);
    let json = std::env::temp_dir().join(format!("{}-report.json", net.ns[C]));
    let json_arg = json.to_string_lossy().into_owned();

    let before = net.stats();
    let tx_before = [C, A1, A2].map(|i| net.tx_packets(i));
    let watcher = ConnWatcher::start(&net);
    let rate = 3000.0;
    let seconds = 3.0;
    let (status, stdout, stderr) = net.controller(
        &[
            "run", "-w", "usr", "--keys", "1000", "--rate", "3000", "-D", "3s", "--warmup",
            "500ms", "--drain", "500ms", "-t", "1", "-c", "2", "-q", "--agent", &a1, "--agent",
            &a2, &server, "--json", &json_arg,
        ],
        Duration::from_secs(20),
    );
    let conns = watcher.finish();
    let after = net.stats();
    let tx: Vec<u64> = [C, A1, A2]
        .iter()
        .zip(tx_before)
        .map(|(&i, b)| net.tx_packets(i) - b)
        .collect();
    assert!(
        status.success(),
        "{test}: controller failed:\n{stderr}\n{stdout}"
    );
    let text = std::fs::read_to_string(&json).expect("the JSON report");
    let _ = std::fs::remove_file(&json);
    let r: serde_json::Value = serde_json::from_str(&text).expect("the report is JSON");
    eprintln!("{test}: table:\n{stdout}");
    eprintln!("{test}: connections seen by memcached, by peer: {conns:?}");
    eprintln!("{test}: packets sent (controller, agent1, agent2): {tx:?}");

    // The agents are named in the report, and are still serving.
    let agents = r["settings"]["agents"].as_str().unwrap_or_default();
    assert!(
        agents.contains(&a1) && agents.contains(&a2),
        "{test}: the report's agents: {agents:?}"
    );
    assert!(net.alive("agent1") && net.alive("agent2"));

    // One entry per participant, the controller first: the counts add up to the merged
    // totals, the keys are split (1000 keys, k mod 3: 334 + 333 + 333 at most), and everyone
    // started together (the namespaces share the machine's clock).
    let ps = r["participants"].as_array().expect("participants");
    let names: Vec<&str> = ps
        .iter()
        .map(|p| p["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["controller", a1.as_str(), a2.as_str()], "{test}");
    let sum = |k: &str| {
        ps.iter()
            .map(|p| p[k].as_f64().unwrap_or(-1.0))
            .sum::<f64>()
    };
    assert_eq!(
        sum("requests"),
        f64_at(&r, &["ops", "all", "count"]),
        "{test}"
    );
    assert_eq!(sum("issued"), f64_at(&r, &["totals", "issued"]), "{test}");
    for (p, most) in ps.iter().zip([334.0, 333.0, 333.0]) {
        let keys = p["distinct_keys"].as_f64().unwrap_or(-1.0);
        assert!(keys > 0.0 && keys <= most, "{test}: {p}");
        let skew = p["start_ms"].as_f64().unwrap_or(f64::NAN);
        assert!(skew.abs() < 50.0, "{test}: start skew {skew} ms: {p}");
    }

    // Exact merge: kvblast's totals (all participants, warm-up and drain included) are
    // memcached's counter deltas, in the report and read independently here.
    let delta = |k: &str| after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0);
    let ours = |k: &str| {
        r["ours"][k]
            .as_i64()
            .unwrap_or_else(|| panic!("{test}: no ours.{k}"))
    };
    for k in ["cmd_get", "get_hits", "get_misses", "cmd_set"] {
        assert_eq!(
            ours(k),
            delta(k),
            "{test}: kvblast's merged {k} vs memcached's delta\n{text}"
        );
        assert_eq!(
            r["server"][k].as_i64(),
            Some(delta(k)),
            "{test}: the report's server.{k}"
        );
    }
    let total = ours("cmd_get") + ours("cmd_set");
    let expected = rate * (seconds + 0.5 + 0.5);
    assert!(
        (total as f64) > 0.8 * rate * seconds && (total as f64) < 1.1 * expected,
        "{test}: {total} requests in all, for {rate}/s over {seconds} s (+ warm-up)"
    );

    // The measured window: the merged histogram holds every measured request, at the rate
    // asked for (the master alone would give a third of it).
    assert_eq!(r["target_rate"].as_f64(), Some(rate));
    let offered = f64_at(&r, &["offered_rate"]);
    let achieved = f64_at(&r, &["ops", "all", "rate"]);
    let count = f64_at(&r, &["ops", "all", "count"]);
    let issued = f64_at(&r, &["totals", "issued"]);
    for (what, v) in [("offered", offered), ("achieved", achieved)] {
        assert!(
            (v - rate).abs() / rate < 0.10,
            "{test}: {what} rate {v}/s, target {rate}/s\n{stdout}"
        );
    }
    assert!(
        count <= issued && count >= 0.99 * issued,
        "{test}: {count} measured replies of {issued} issued"
    );
    assert_eq!(f64_at(&r, &["totals", "conn_failures"]), 0.0);
    let p = |q: &str| f64_at(&r, &["ops", "all", q]);
    let (min, p50, p99, p999, max) = (
        p("min_us"),
        p("p50_us"),
        p("p99_us"),
        p("p999_us"),
        p("max_us"),
    );
    assert!(
        0.0 < min && min <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
        "{test}: percentiles min {min} p50 {p50} p99 {p99} p99.9 {p999} max {max}"
    );
    assert!(p("mean_us") > 0.0 && r["ops"]["get"]["p99_us"].as_f64().is_some());

    // Each participant sent load: memcached saw at least -c 2 connections from each address,
    // and each namespace sent a fair share of the packets (a third each, give or take).
    for i in [C, A1, A2] {
        let n = conns.get(&net.ip[i]).copied().unwrap_or(0);
        assert!(
            n >= 2,
            "{test}: memcached saw {n} connections from the {} ({}): {conns:?}",
            ROLES[i],
            net.ip[i]
        );
    }
    let mean = tx.iter().sum::<u64>() as f64 / 3.0;
    for (j, &t) in tx.iter().enumerate() {
        assert!(
            (t as f64) > 0.5 * mean && (t as f64) < 1.5 * mean,
            "{test}: {} sent {t} packets, the mean is {mean}: {tx:?}",
            ROLES[j + 1]
        );
    }
}

/// An agent nobody answers for (connection refused, or a host that does not exist) fails the
/// run promptly, names the agent, exits non-zero, and leaves no other agent sending load.
#[test]
fn unreachable_agent_is_a_clear_error() {
    let test = "unreachable_agent_is_a_clear_error";
    let Some(mut net) = Net::new(test) else {
        return;
    };
    net.start_memcached();
    let a1 = net.start_agent(A1);
    let server = format!("{}:{MC_PORT}", net.ip[S]);
    let before = net.stats();

    // Refused: agent2's namespace is up but runs no agent. A missing host: nothing answers
    // ARP for .9, so the connection attempt times out.
    let refused = format!("{}:{AGENT_PORT}", net.ip[A2]);
    let missing = format!("10.78.{}.9:{AGENT_PORT}", net.n);
    for (bad, limit) in [(&refused, 3), (&missing, 10)] {
        let started = Instant::now();
        let (status, stdout, stderr) = net.controller(
            &[
                "run", "-w", "usr", "--keys", "100", "--rate", "1000", "-D", "1s", "--drain",
                "200ms", "-q", "--agent", &a1, "--agent", bad, &server,
            ],
            Duration::from_secs(20),
        );
        let took = started.elapsed();
        assert!(
            !status.success(),
            "{test}: a run with agent {bad} succeeded:\n{stdout}"
        );
        assert!(
            took < Duration::from_secs(limit),
            "{test}: a run with agent {bad} took {took:?} to fail"
        );
        let msg = stderr.trim();
        assert!(
            msg.starts_with("kvblast: agent ")
                && msg.contains(bad.as_str())
                && msg.lines().count() == 1,
            "{test}: the error for agent {bad}: {msg:?}"
        );
        eprintln!("{test}: {bad}: {msg:?} after {took:?}");
    }

    // No load reached memcached: neither the master nor agent1 (which would have been sent
    // its job before the bad agent was tried) ran; agent1 still serves.
    std::thread::sleep(Duration::from_millis(300));
    let after = net.stats();
    for k in ["cmd_get", "cmd_set"] {
        assert_eq!(
            after.get(k),
            before.get(k),
            "{test}: memcached's {k} changed, so load was sent for a failed run"
        );
    }
    assert!(net.alive("agent1"));
}
