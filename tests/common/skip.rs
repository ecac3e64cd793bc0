//! How a test says it checked nothing (or only part of what it checks) on this machine:
//! libtest has no run-time skip, so such a test passes, and this line is what tells it from
//! one that ran. Included by `tests/common/mod.rs` and, through `#[path]`, by kvblast's
//! `agents_netns`.

use std::io::Write;

/// Write `SKIP <test>: <what>` to stderr itself, which libtest does not capture (it captures
/// `eprintln!`), so the line shows in the test output even when the test passes;
/// `scripts/test.sh` counts these lines. `<test>` is the running test's name (libtest names
/// the thread it runs a test on after the test).
pub fn skip(what: impl std::fmt::Display) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let _ = std::io::stderr().write_all(format!("SKIP {test}: {what}\n").as_bytes());
}
