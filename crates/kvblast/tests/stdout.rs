//! kvblast's output to a reader that went away (`kvblast workloads | head -1` once head has
//! exited): the write fails with EPIPE, and kvblast must end normally, not panic.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

#[test]
fn a_closed_stdout_is_not_a_panic() {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: both descriptors were just created and are owned here, once each.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // No reader: every write to the pipe fails with EPIPE (Rust ignores SIGPIPE).
    drop(read);
    for args in [&["workloads"][..], &["help"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvblast"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(write.try_clone().expect("dup the pipe")))
            .stderr(Stdio::piped())
            .output()
            .expect("run kvblast");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "kvblast {args:?}: {err}");
        assert!(
            out.status.success(),
            "kvblast {args:?}: {:?} {err}",
            out.status
        );
    }
}
