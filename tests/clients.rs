//! Real client libraries against the real binary: pymemcache (text protocol) and pylibmc
//! (libmemcached, text and binary protocols), Debian's packages, driven by
//! `tests/clients/roundtrip.py`. The same script runs against Debian's memcached first, so a
//! failure on kvcached is a difference from memcached, not a quirk of the script.

mod common;

use std::process::Command;

use common::{Kind, Server};

/// Debian's interpreter: the python3-pymemcache and python3-pylibmc packages install for it.
const PYTHON: &str = "/usr/bin/python3";

fn round_trip(server: &Server) -> (bool, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/roundtrip.py");
    let out = Command::new(PYTHON)
        .arg(script)
        .arg(server.port.to_string())
        .output()
        .expect("run /usr/bin/python3 (scripts/install-deps.sh installs the client packages)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn client_libraries_round_trip() {
    let memcached = Server::start_verified(Kind::Memcached, &[]);
    let (ok, text) = round_trip(&memcached);
    assert!(ok, "the script fails against memcached itself:\n{text}");

    let kvcached = Server::start_verified(Kind::Kvcached, &[]);
    let (ok, text) = round_trip(&kvcached);
    assert!(ok, "kvcached:\n{text}");
    for library in ["pymemcache: ok", "pylibmc text: ok", "pylibmc binary: ok"] {
        assert!(text.contains(library), "missing {library:?} in:\n{text}");
    }
}
