//! Logs (issue 14, item 2): `-v`/`-vv` levels as memcached's, the `verbosity` command at run
//! time, `-o log_format=json` (every line a JSON object with a timestamp, a level and the
//! event's fields), and nothing secret written at the most verbose level.
//!
//! Each test starts its own kvcached on a free loopback port and reads what it wrote to
//! stderr after it exited.

mod common;

use common::{Kind, Server};

/// Stop the server (SIGTERM) and return what it logged.
fn logs(mut server: Server) -> String {
    assert!(server.terminate().is_some(), "the server did not exit");
    server.stderr()
}

/// Open a connection, store one item and close it; returns after the server answered.
fn one_connection(server: &Server, value: &str) {
    let mut c = server.connect();
    let reply = c.call(&format!("set k 0 0 {}\r\n{value}\r\n", value.len()));
    assert_eq!(reply, "STORED\r\n");
}

/// An auth file for `-Y` in a fresh directory (removed by the caller).
fn auth_file(tag: &str, line: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("kvcached-logging-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("auth");
    std::fs::write(&file, line).expect("auth file");
    (dir, file)
}

/// A failed ASCII authentication as `user` (logged at -v, with the user name).
fn failed_auth(server: &Server, user: &str) {
    let mut c = server.connect();
    let creds = format!("{user} not-the-password");
    assert_eq!(
        c.call(&format!("set a 0 0 {}\r\n{creds}\r\n", creds.len())),
        "CLIENT_ERROR authentication failure\r\n"
    );
}

#[test]
fn json_lines_with_levels_fields_and_runtime_verbosity() {
    let (dir, file) = auth_file("json", "admin:Adm1n-pw\n");
    let path = file.to_str().expect("utf-8 path");
    let server = Server::start(
        Kind::Kvcached,
        &["-vv", "-o", "log_format=json", "-Y", path],
    );
    let mut admin = server.connect();
    let creds = "admin Adm1n-pw";
    assert_eq!(
        admin.call(&format!("set a 0 0 {}\r\n{creds}\r\n", creds.len())),
        "STORED\r\n"
    );
    failed_auth(&server, "phase-one");
    // Down to warnings only: failed authentications (info) are no longer logged.
    assert_eq!(admin.call("verbosity 0\r\n"), "OK\r\n");
    admin.send(b"stats settings\r\n");
    assert!(admin.until("END\r\n").contains("STAT verbosity 0\r\n"));
    failed_auth(&server, "phase-two");
    assert_eq!(admin.call("verbosity 1\r\n"), "OK\r\n");
    failed_auth(&server, "phase-three");
    drop(admin);
    let text = logs(server);
    let _ = std::fs::remove_dir_all(&dir);

    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    assert!(!lines.is_empty(), "nothing logged at -vv");
    for l in &lines {
        for field in ["timestamp", "level", "message", "target"] {
            assert!(l.get(field).is_some(), "no {field} in {l}");
        }
    }
    let has = |level: &str, part: &str| {
        lines
            .iter()
            .any(|l| l["level"] == level && l["message"].as_str().is_some_and(|m| m.contains(part)))
    };
    assert!(
        has("INFO", "listening on"),
        "no listener line at -vv: {text}"
    );
    assert!(has("INFO", "phase-one"), "{text}");
    assert!(!has("INFO", "phase-two"), "logged at verbosity 0: {text}");
    assert!(has("INFO", "phase-three"), "{text}");
    // Connection events (-vv) carry the descriptor as a field.
    let opened: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| {
            l["level"] == "DEBUG"
                && l["message"]
                    .as_str()
                    .is_some_and(|m| m.ends_with("new client connection"))
        })
        .collect();
    assert!(!opened.is_empty(), "no connection events at -vv: {text}");
    assert!(
        opened.iter().all(|l| l["fd"].as_i64().is_some()),
        "{opened:?}"
    );
}

#[test]
fn text_levels_follow_v_flags() {
    // No -v: warnings only (none here), so nothing at all.
    let quiet = Server::start(Kind::Kvcached, &[]);
    one_connection(&quiet, "x");
    let text = logs(quiet);
    assert!(text.trim().is_empty(), "logged without -v: {text:?}");

    // -v: info (the listener), no connection events; a timestamp, the level, the module.
    let info = Server::start(Kind::Kvcached, &["-v"]);
    one_connection(&info, "x");
    let text = logs(info);
    let listening = text
        .lines()
        .find(|l| l.contains("listening on"))
        .unwrap_or_else(|| panic!("no listener line at -v: {text:?}"));
    let mut words = listening.split_whitespace();
    let stamp = words.next().unwrap_or_default();
    assert!(stamp.ends_with('Z') && stamp.contains('T'), "{listening:?}");
    assert_eq!(words.next(), Some("INFO"), "{listening:?}");
    assert!(!text.contains("new client connection"), "{text:?}");

    // -vv: connection events, as memcached's -vv.
    let debug = Server::start(Kind::Kvcached, &["-vv"]);
    one_connection(&debug, "x");
    let text = logs(debug);
    assert!(text.contains("DEBUG"), "{text:?}");
    assert!(text.contains("new client connection"), "{text:?}");
    assert!(text.contains("connection closed."), "{text:?}");
}

/// At -vvv nothing secret is logged: not a value, not a password (ASCII auth, right or
/// wrong), though the failure itself is.
#[test]
fn nothing_secret_at_the_most_verbose_level() {
    let (dir, file) = auth_file("secret", "alice:Open-S3same\n");
    let server = Server::start(
        Kind::Kvcached,
        &["-vvv", "-Y", file.to_str().expect("utf-8 path")],
    );
    let mut c = server.connect();
    let wrong = "alice Wrong-Pa55word";
    assert_eq!(
        c.call(&format!("set a 0 0 {}\r\n{wrong}\r\n", wrong.len())),
        "CLIENT_ERROR authentication failure\r\n"
    );
    let mut c = server.connect();
    let right = "alice Open-S3same";
    assert_eq!(
        c.call(&format!("set a 0 0 {}\r\n{right}\r\n", right.len())),
        "STORED\r\n"
    );
    assert_eq!(c.call("set k 0 0 13\r\nTop-Secret-42\r\n"), "STORED\r\n");
    c.send(b"get k\r\n");
    assert!(c.until("END\r\n").contains("Top-Secret-42"));
    drop(c);
    let text = logs(server);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(text.contains("authentication failed"), "{text:?}");
    for secret in ["Wrong-Pa55word", "Open-S3same", "Top-Secret-42"] {
        assert!(!text.contains(secret), "{secret} in the log: {text:?}");
    }
}
