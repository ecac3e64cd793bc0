//! libmemcached's protocol checker, `memccapable` (Debian's libmemcached-tools), against the
//! real kvcached binary: its ASCII suite and its binary-protocol suite.
//!
//! Its two ASCII `delete` tests expect an error for `delete <key> <junk>...`; the newest
//! memcached (1.6.4x), which kvcached follows, ignores the extra tokens and fails those two
//! tests in exactly the same way (see docs/COMPATIBILITY.md). Everything else must pass.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::{Kind, Server};

/// Tests that fail against the newest memcached too, for the reason above.
const EXPECTED_FAILURES: &[&str] = &["ascii delete", "ascii delete noreply"];

fn run(server: &Server, args: &[&str]) -> (BTreeSet<String>, BTreeSet<String>) {
    // memccapable prints test names on stdout (buffered) and [FAIL] on stderr: unbuffer and
    // merge them so that each verdict follows its name.
    let cmd = format!(
        "exec stdbuf -o0 memccapable -h 127.0.0.1 -p {} -t 10 {} 2>&1",
        server.port,
        args.join(" ")
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("run memccapable (scripts/install-deps.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut passed, mut failed) = (BTreeSet::new(), BTreeSet::new());
    for line in text.lines() {
        let name = line.split('[').next().unwrap_or("").trim().to_string();
        if line.contains("[pass]") {
            passed.insert(name);
        } else if line.contains("[FAIL]") {
            failed.insert(name);
        }
    }
    (passed, failed)
}

#[test]
fn ascii_protocol_matches_memcached() {
    // The reference: Debian's memcached passes every ASCII test.
    let memcached = Server::start_verified(Kind::Memcached, &[]);
    let (mc_passed, mc_failed) = run(&memcached, &["-a"]);
    assert!(mc_failed.is_empty(), "memcached failed {mc_failed:?}");
    assert!(
        mc_passed.len() >= 20,
        "memccapable ran too few tests: {mc_passed:?}"
    );

    let kvcached = Server::start_verified(Kind::Kvcached, &[]);
    let (passed, failed) = run(&kvcached, &["-a"]);
    let expected: BTreeSet<String> = EXPECTED_FAILURES.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        failed, expected,
        "unexpected memccapable results; passed: {passed:?}"
    );
    let all: BTreeSet<String> = mc_passed;
    let ran: BTreeSet<String> = passed.union(&failed).cloned().collect();
    assert_eq!(ran, all, "kvcached and memcached ran different tests");
}

#[test]
fn binary_protocol_matches_memcached() {
    let memcached = Server::start_verified(Kind::Memcached, &[]);
    let (mc_passed, mc_failed) = run(&memcached, &["-b"]);
    assert!(mc_failed.is_empty(), "memcached failed {mc_failed:?}");
    assert!(
        mc_passed.len() >= 20,
        "memccapable ran too few tests: {mc_passed:?}"
    );

    let kvcached = Server::start_verified(Kind::Kvcached, &[]);
    let (passed, failed) = run(&kvcached, &["-b"]);
    assert!(failed.is_empty(), "kvcached failed {failed:?}");
    assert_eq!(
        passed, mc_passed,
        "kvcached and memcached ran different tests"
    );
}
