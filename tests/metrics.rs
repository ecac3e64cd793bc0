//! `-o metrics=HOST:PORT`: the Prometheus endpoint, scraped over HTTP and parsed with a real
//! Prometheus text-format parser (the `prometheus-parse` crate). The figures must be the
//! `stats` reply's, under memcached_exporter's names; bad requests get HTTP errors; a client
//! that stalls does not stop the next scrape.

mod common;

use common::{free_port, Kind, Server, TempDir};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One HTTP exchange; returns the status line, the headers and the body.
fn http(port: u16, request: &[u8]) -> (String, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics port");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    s.write_all(request).expect("send the request");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("read the reply");
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

fn scrape(port: u16) -> prometheus_parse::Scrape {
    let (status, headers, body) = http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("application/openmetrics-text"),
        "{headers}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("the Prometheus parser reads the page")
}

/// The value of the sample named `name` whose labels include `labels`.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

/// A kvcached serving metrics on a free port; returns it and that port.
fn start_with_metrics() -> (Server, u16) {
    let mport = free_port();
    let server = Server::start_verified(
        Kind::Kvcached,
        &["-o", &format!("metrics=127.0.0.1:{mport}")],
    );
    (server, mport)
}

#[test]
fn scrape_matches_stats_under_the_exporters_names() {
    let (server, mport) = start_with_metrics();
    let mut c = server.connect();
    assert_eq!(c.call("set a 0 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(c.call("set b 0 0 1\r\ny\r\n"), "STORED\r\n");
    assert_eq!(c.call("get a\r\n"), "VALUE a 0 1\r\n");
    c.until("END\r\n");
    assert_eq!(c.call("get nope\r\n"), "END\r\n");
    assert_eq!(c.call("delete b\r\n"), "DELETED\r\n");
    assert_eq!(c.call("incr nope 1\r\n"), "NOT_FOUND\r\n");
    assert_eq!(c.call("cas a 0 0 1 999\r\nz\r\n"), "EXISTS\r\n");

    let m = scrape(mport);
    let cmd = |command: &str, status: &str| {
        value(
            &m,
            "memcached_commands_total",
            &[("command", command), ("status", status)],
        )
    };
    assert_eq!(cmd("get", "hit"), Some(1.0));
    assert_eq!(cmd("get", "miss"), Some(1.0));
    assert_eq!(cmd("delete", "hit"), Some(1.0));
    assert_eq!(cmd("incr", "miss"), Some(1.0));
    assert_eq!(cmd("cas", "badval"), Some(1.0));
    // cmd_set counts the cas too; the exporter takes cas commands out of `set`.
    assert_eq!(cmd("set", "hit"), Some(2.0));
    assert_eq!(value(&m, "memcached_up", &[]), Some(1.0));
    assert_eq!(value(&m, "memcached_current_items", &[]), Some(1.0));
    let stat = |c: &mut common::Client, k: &str| -> f64 {
        c.stat(k).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
    };
    assert_eq!(
        value(&m, "memcached_limit_bytes", &[]),
        Some(stat(&mut c, "limit_maxbytes"))
    );
    assert_eq!(
        value(&m, "memcached_items_total", &[]),
        Some(stat(&mut c, "total_items"))
    );
    let version = c.stat("version").unwrap_or_default();
    assert_eq!(
        value(&m, "memcached_version", &[("version", &version)]),
        Some(1.0)
    );
    assert_eq!(value(&m, "memcached_max_connections", &[]), Some(1024.0));
    assert!(value(&m, "memcached_connections_total", &[]).is_some_and(|v| v >= 1.0));
    assert!(value(&m, "memcached_read_bytes_total", &[]).is_some_and(|v| v > 0.0));
    // kvcached's own.
    assert_eq!(
        value(&m, "kvcached_replication_role", &[("role", "master")]),
        Some(1.0)
    );
    assert!(value(&m, "kvcached_index_bytes", &[]).is_some_and(|v| v > 0.0));
    assert_eq!(
        value(&m, "kvcached_replication_held_segments", &[]),
        Some(0.0)
    );
    assert_eq!(
        value(&m, "kvcached_replication_held_segments_dropped_total", &[]),
        Some(0.0)
    );
    // Per slab class, as the exporter labels them: "a" (1-byte key and value, CAS: 61
    // bytes) is the one item, in class 1 (96-byte chunks).
    let slab = |name: &str| value(&m, name, &[("slab", "1")]);
    assert_eq!(slab("memcached_slab_current_items"), Some(1.0));
    assert_eq!(slab("memcached_slab_mem_requested_bytes"), Some(61.0));
    assert_eq!(slab("memcached_slab_chunk_size_bytes"), Some(96.0));
    assert_eq!(slab("memcached_slab_chunks_used"), Some(1.0));
    assert_eq!(slab("memcached_slab_items_evicted_total"), Some(0.0));
    assert_eq!(
        value(&m, "memcached_slab_current_items", &[("slab", "2")]),
        None
    );
}

#[test]
fn bad_requests_get_http_errors_and_a_stalled_client_does_not_stop_scrapes() {
    let (_server, mport) = start_with_metrics();
    let status = |req: &[u8]| http(mport, req).0;
    assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), "HTTP/1.1 404 Not Found");
    assert_eq!(
        status(b"POST /metrics HTTP/1.1\r\n\r\n"),
        "HTTP/1.1 405 Method Not Allowed"
    );
    let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 20_000));
    assert_eq!(
        status(&huge),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    // A client that connects and says nothing: the next scrape is still answered (after the
    // stalled one's time runs out).
    let stalled = TcpStream::connect(("127.0.0.1", mport)).expect("connect");
    assert_eq!(value(&scrape(mport), "memcached_up", &[]), Some(1.0));
    drop(stalled);
}

#[test]
fn a_metrics_address_that_cannot_be_bound_is_an_error_at_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvcached"))
        .args(["-p", &free_port().to_string(), "-U", "0"])
        .args(["-o", &format!("metrics=127.0.0.1:{port}")])
        .args(if common_root() {
            &["-u", "root"][..]
        } else {
            &[][..]
        })
        .output()
        .expect("run kvcached");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("-o metrics=127.0.0.1:"), "{err}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_kvcached"))
        .args(["-o", "metrics=nowhere"])
        .output()
        .expect("run kvcached");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not HOST:PORT"));
}

fn common_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// With a flash tier (`-o ext_path`), the exporter's extstore series are there, and agree
/// with `stats`; without one they are absent (as the exporter's without extstore).
#[test]
fn flash_tier_series_follow_the_exporter() {
    let dir = TempDir::new("metrics-flash");
    let mport = free_port();
    let ext = dir.ext_path("64m");
    let server = Server::start_verified(
        Kind::Kvcached,
        &[
            "-m",
            "4",
            "-U",
            "0",
            "-o",
            &ext,
            "-o",
            &format!("metrics=127.0.0.1:{mport}"),
        ],
    );
    let mut c = server.connect();
    let value_of = "v".repeat(500);
    for i in 0..20_000 {
        c.send(format!("set k{i} 0 0 500 noreply\r\n{value_of}\r\n").as_bytes());
    }
    assert!(c.call("version\r\n").starts_with("VERSION"));
    let s = scrape(mport);
    let limit = value(&s, "memcached_extstore_bytes_limit", &[]).expect("the limit");
    assert!(limit >= f64::from(60u32 << 20), "{limit}");
    let written = value(&s, "memcached_extstore_objects_written_total", &[]).expect("written");
    assert!(written > 0.0, "{written}");
    let (_plain, mport2) = start_with_metrics();
    assert_eq!(
        value(&scrape(mport2), "memcached_extstore_bytes_limit", &[]),
        None
    );
    drop(server);
}
