//! Shared by the randomized differential tests (`differential.rs`, `meta_differential.rs`):
//! which server is compared with memcached, starting it, and printing protocol bytes.

use super::{memcached_path, Kind, Server, TIMEOUT};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the compared-against side is.
pub fn target() -> (Kind, PathBuf, &'static str) {
    if let Some(p) = std::env::var_os("KVCACHED_DIFF_TARGET") {
        (Kind::Memcached, PathBuf::from(p), "target")
    } else if std::env::var_os("KVCACHED_DIFF_SELF").is_some_and(|v| v != "0") {
        (Kind::Memcached, memcached_path(), "memcached (self)")
    } else {
        (
            Kind::Kvcached,
            PathBuf::from(env!("CARGO_BIN_EXE_kvcached")),
            "kvcached",
        )
    }
}

/// Start `program` on a free loopback port; its stderr goes to a file (a `verbosity`
/// command can make a server log every request, which must never block it).
pub fn spawn(kind: Kind, program: &Path, args: &[&str]) -> Server {
    assert!(
        program.exists(),
        "{} not found: run scripts/install-deps.sh",
        program.display()
    );
    let mut last_err = String::new();
    for _ in 0..5 {
        let port = super::free_port();
        let log = std::env::temp_dir().join(format!(
            "kvcached-differential-{}-{port}.log",
            std::process::id()
        ));
        let stderr = std::fs::File::create(&log).expect("create server log");
        let mut cmd = Command::new(program);
        cmd.arg("-l")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(port.to_string());
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            cmd.arg("-u").arg("root");
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let mut child = cmd.spawn().expect("spawn server");
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Ok(stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
                // Another process may hold the port (the harness only checked it was free
                // a moment ago): make sure the one answering is ours (its `stats` pid),
                // else try another port. A failed exchange retries too, never leaving the
                // child running.
                match super::stats_pid(stream)
                    .map(|p| p.is_none_or(|p| p == child.id().to_string()))
                {
                    Ok(true) => {
                        let _ = std::fs::remove_file(&log);
                        return Server::new(kind, port, child, None);
                    }
                    Ok(false) => last_err = "another process answered on its port".into(),
                    Err(e) => {
                        let status = child.try_wait().ok().flatten();
                        let err = std::fs::read_to_string(&log).unwrap_or_default();
                        last_err = format!(
                            "port {port}: the first exchange failed ({e}); server status \
                             {status:?}, its stderr: {err}"
                        );
                        eprintln!("{}: {last_err}", program.display());
                    }
                }
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let err = std::fs::read_to_string(&log).unwrap_or_default();
                last_err = format!("exited with {status}: {err}");
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                last_err = "timed out waiting for the port".into();
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_file(&log);
    }
    panic!("{} did not start: {last_err}", program.display());
}

/// The seeds to run: the environment variable `var` (`N` or a range `A..B`), else `default`.
pub fn seeds(var: &str, default: std::ops::Range<u64>) -> Vec<u64> {
    let Ok(s) = std::env::var(var) else {
        return default.collect();
    };
    match s.split_once("..") {
        Some((a, b)) => {
            let a: u64 = a.parse().unwrap_or_else(|_| panic!("{var}=A..B"));
            let b: u64 = b.parse().unwrap_or_else(|_| panic!("{var}=A..B"));
            (a..b).collect()
        }
        None => vec![s
            .parse()
            .unwrap_or_else(|_| panic!("{var} is a number or A..B"))],
    }
}

/// Printable form of protocol bytes, shortened in the middle when long.
pub fn show(bytes: &[u8]) -> String {
    const MAX: usize = 600;
    let mut s = String::new();
    let emit = |b: u8, s: &mut String| match b {
        b'\r' => s.push_str("\\r"),
        b'\n' => s.push_str("\\n"),
        b'\\' => s.push_str("\\\\"),
        0x20..=0x7e => s.push(b as char),
        _ => {
            let _ = write!(s, "\\x{b:02x}");
        }
    };
    if bytes.len() <= MAX {
        bytes.iter().for_each(|&b| emit(b, &mut s));
    } else {
        bytes[..MAX / 2].iter().for_each(|&b| emit(b, &mut s));
        let _ = write!(s, "…<{} bytes>…", bytes.len() - MAX);
        bytes[bytes.len() - MAX / 2..]
            .iter()
            .for_each(|&b| emit(b, &mut s));
    }
    format!("\"{s}\"")
}

/// What a run counted.
#[derive(Default)]
pub struct Totals {
    pub sequences: usize,
    pub commands: usize,
    pub batches: usize,
    /// Per expected difference: generated requests skipped.
    pub avoided: Vec<usize>,
    pub mismatches: Vec<String>,
}
