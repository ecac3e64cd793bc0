//! kvcached's command line (memcached's flags): informational flags, rejected arguments,
//! accepted memcached-only tuning options, root without `-u`, SIGTERM, and daemonizing.
//! kvcached only.

mod common;

use common::{Kind, Server};
use std::io::Read;
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(10);

fn kvcached() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvcached"))
}

struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Run to completion; panic (after killing it) if it has not exited within DEADLINE.
fn run(mut cmd: Command) -> Ran {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvcached");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let end = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not exit within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ran {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

fn euid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

#[test]
fn version_flag_prints_a_version_and_exits_0() {
    let mut cmd = kvcached();
    cmd.arg("-V");
    let r = run(cmd);
    assert!(r.status.success(), "-V: {:?} {:?}", r.status, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "-V stdout: {:?}", r.stdout);
    assert!(
        lines[0].chars().any(|c| c.is_ascii_digit()) && lines[0].contains('.'),
        "-V: no version number in {:?}",
        lines[0]
    );
}

#[test]
fn help_flag_lists_options_and_exits_0() {
    let mut cmd = kvcached();
    cmd.arg("-h");
    let r = run(cmd);
    assert!(r.status.success(), "-h: {:?} {:?}", r.status, r.stderr);
    for flag in ["-p", "-m", "-I", "-c", "-l", "-U", "-s", "-d", "-u"] {
        assert!(
            r.stdout.contains(flag),
            "-h does not mention {flag}:\n{}",
            r.stdout
        );
    }
}

#[test]
fn bad_arguments_exit_nonzero_with_a_message() {
    // Each of these memcached 1.6.18 rejects too (it accepts "-p notaport" and "-m -5" via
    // atoi, so those are not listed).
    for args in [
        &["--no-such-flag"][..],
        &["-9"],
        &["-I", "2g"],
        &["-I", "abc"],
        &["-I", "100"],
        &["-p", "70000"],
        &["-c", "0"],
        &["-t", "0"],
        &["-o", "no_such_option"],
        &["-p"],
    ] {
        let mut cmd = kvcached();
        // Never let a wrongly accepted command line start a server on the default port.
        cmd.args([
            "-l",
            "127.0.0.1",
            "-p",
            &common::free_port().to_string(),
            "-u",
            "root",
        ]);
        cmd.args(args);
        let r = run(cmd);
        assert!(
            !r.status.success(),
            "{args:?} must be rejected; exited {:?}",
            r.status
        );
        assert!(
            !r.stderr.trim().is_empty(),
            "{args:?}: rejected without a message on stderr"
        );
    }
}

#[test]
fn memcached_tuning_options_are_accepted() {
    for opts in [
        "modern,hashpower=20,slab_reassign,lru_crawler",
        "slab_chunk_max=524288,lru_maintainer,temporary_ttl=61,hash_algorithm=murmur3",
        "no_lru_crawler,no_maxconns_fast,watcher_logbuf_size=256",
    ] {
        let s = Server::start_verified(Kind::Kvcached, &["-o", opts]);
        let mut c = s.connect();
        assert_eq!(c.call("set a 0 0 1\r\nx\r\n"), "STORED\r\n", "-o {opts}");
    }
    // Other memcached flags that only tune memcached's internals.
    let s = Server::start_verified(
        Kind::Kvcached,
        &[
            "-t", "2", "-R", "10", "-b", "64", "-f", "1.25", "-n", "48", "-v",
        ],
    );
    let mut c = s.connect();
    assert_eq!(c.call("set a 0 0 1\r\nx\r\n"), "STORED\r\n");
}

#[test]
fn root_without_u_is_refused() {
    if !euid_is_root() {
        eprintln!("not root: nothing to test");
        return;
    }
    let port = common::free_port();
    let mut cmd = kvcached();
    cmd.args(["-l", "127.0.0.1", "-p", &port.to_string()]);
    let r = run(cmd);
    assert!(
        !r.status.success(),
        "running as root without -u must be refused"
    );
    assert!(
        r.stderr.contains("root") && r.stderr.contains("-u"),
        "the refusal should say why (root, -u): {:?}",
        r.stderr
    );
    assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err());
    // With -u root it runs.
    let s = Server::start_verified(Kind::Kvcached, &["-u", "root"]);
    assert!(s.connect().call("version\r\n").starts_with("VERSION "));
}

#[test]
fn sigterm_exits_0_promptly() {
    let mut s = Server::start_verified(Kind::Kvcached, &[]);
    let mut c = s.connect();
    assert_eq!(c.call("set a 0 0 1\r\nx\r\n"), "STORED\r\n");
    let t0 = Instant::now();
    let status = s.terminate().expect("still running 10 s after SIGTERM");
    assert!(status.success(), "SIGTERM: exit status {status:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "SIGTERM took {:?}",
        t0.elapsed()
    );
    assert!(c.closed(), "connections are closed on exit");
}

#[test]
fn daemonize_writes_the_pid_file() {
    let dir = std::env::temp_dir().join(format!("kvcache-itest-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pidfile: PathBuf = dir.join("kvcached.pid");
    let port = common::free_port();
    let mut cmd = kvcached();
    cmd.args(["-d", "-P"])
        .arg(&pidfile)
        .args(["-l", "127.0.0.1", "-p", &port.to_string()]);
    if euid_is_root() {
        cmd.args(["-u", "root"]);
    }
    let r = run(cmd);
    assert!(r.status.success(), "-d: the parent exits 0; {:?}", r.stderr);
    let end = Instant::now() + DEADLINE;
    let pid: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break p;
        }
        assert!(Instant::now() < end, "no pid file at {pidfile:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    // Kill the daemon whatever happens below.
    struct Reap(i32);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .arg("-9")
                .arg(self.0.to_string())
                .status();
        }
    }
    let _reap = Reap(pid);
    assert!(
        PathBuf::from(format!("/proc/{pid}")).exists(),
        "pid {pid} from the pid file is not running"
    );
    // The daemon serves, and reports the pid from the file.
    let end = Instant::now() + DEADLINE;
    let stream = loop {
        if let Ok(s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
            break s;
        }
        assert!(Instant::now() < end, "the daemon does not listen on {port}");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut c = common::Client::new(stream);
    assert_eq!(c.stat("pid"), Some(pid.to_string()));
    // It is detached: not our child, and in a session other than ours (setsid).
    let stat_fields = |pid: &str| -> Vec<String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = stat.rsplit_once(')').unwrap().1.to_string();
        after.split_whitespace().map(str::to_string).collect()
    };
    let theirs = stat_fields(&pid.to_string());
    let ours = stat_fields("self");
    // Fields after the command: state, ppid, pgrp, session.
    assert_ne!(
        theirs[1],
        std::process::id().to_string(),
        "the daemon is still our child"
    );
    assert_ne!(theirs[3], ours[3], "the daemon did not leave our session");
    // SIGTERM stops it and (like memcached) removes the pid file.
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let end = Instant::now() + DEADLINE;
    while PathBuf::from(format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    {
        assert!(Instant::now() < end, "daemon ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    }
    let end = Instant::now() + DEADLINE;
    while pidfile.exists() {
        assert!(Instant::now() < end, "pid file not removed on exit");
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A private scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvcached-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn config_file_is_read_like_debians_memcached_conf() {
    let dir = scratch("conf");
    let conf = dir.join("kvcached.conf");
    // A memcached.conf as Debian ships it: -d and logfile are skipped (the server must stay
    // in the foreground, as our child), the rest applies.
    std::fs::write(
        &conf,
        "# comment\n-d\nlogfile /var/log/memcached.log\n\n-m 12   # megabytes\n-c 77\n-o modern\n",
    )
    .unwrap();
    let conf_arg = conf.to_str().unwrap();
    let s = Server::start_verified(Kind::Kvcached, &["--config-file", conf_arg, "-c", "88"]);
    let mut c = s.connect();
    assert_eq!(c.call("set a 0 0 1\r\nx\r\n"), "STORED\r\n");
    let settings = c.stats("settings");
    let get = |name: &str| {
        settings
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        get("maxbytes"),
        (12u64 << 20).to_string(),
        "-m from the file"
    );
    assert_eq!(
        get("maxconns"),
        "88",
        "the command line after the file wins"
    );
    drop(s);

    // A line that is not an option is refused, naming the file and the line.
    std::fs::write(&conf, "-m 12\nport 11211\n").unwrap();
    let mut cmd = kvcached();
    cmd.args(["-l", "127.0.0.1", "-p", &common::free_port().to_string()]);
    cmd.args(["-u", "root", "--config-file", conf_arg]);
    let r = run(cmd);
    assert_eq!(r.status.code(), Some(64), "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("{conf_arg}: line 2: 'port'")),
        "{}",
        r.stderr
    );
    // So is a file that cannot be read.
    let mut cmd = kvcached();
    cmd.args(["--config-file", dir.join("missing").to_str().unwrap()]);
    let r = run(cmd);
    assert_eq!(r.status.code(), Some(64), "{}", r.stderr);
    assert!(r.stderr.contains("cannot read"), "{}", r.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The harness's ports (tests/common/ports.rs): distinct within a process, free for TCP and
/// UDP when handed out, and outside the kernel's ephemeral range, from which a test's own
/// outgoing connections could otherwise take a port between its check and a server's bind.
#[test]
fn harness_ports_are_distinct_and_outside_the_ephemeral_range() {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let low: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        let port = common::free_port();
        assert!(seen.insert(port), "port {port} handed out twice");
        if low >= 22_000 {
            assert!(
                (20_000..low).contains(&port),
                "{port} in the ephemeral range"
            );
        }
    }
}
