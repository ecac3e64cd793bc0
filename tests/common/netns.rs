//! Network-namespace helpers shared by the tests that build their own namespaces
//! (`tests/replication_netns.rs`, and `crates/kvblast/tests/agents_netns.rs` through a
//! `#[path]` include).
#![allow(dead_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

/// Run `program args`, returning its stdout, or its stderr (or spawn error) on failure.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Like [`run`], failing the test on error.
pub fn must(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// Run `f` on a thread that first enters network namespace `ns`: sockets (and TUN devices)
/// it creates belong to that namespace, whichever thread uses them afterwards.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let handle = File::open(&path)?;
        // SAFETY: setns(2) on an fd we own; it affects only this (short-lived) thread.
        if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        f()
    })
    .join()
    .expect("the thread in the namespace panicked")
}
