//! `-o metrics=HOST:PORT` (kvcached's own option): Prometheus metrics over HTTP.
//!
//! The metrics are the `stats` reply, read at each scrape the way a client reads it (so the two
//! never disagree), named and labelled as prometheus/memcached_exporter names them
//! (`memcached_commands_total{command="get",status="hit"}`, `memcached_current_items`, ...),
//! so its dashboards and alerts work unchanged, plus kvcached's own `kvcached_*` metrics
//! (replication, index). The `prometheus-client` crate encodes them in the OpenMetrics text
//! format, which Prometheus scrapes.
//!
//! The HTTP side is a few lines on purpose: one thread of its own (never a worker), one
//! connection at a time, `GET /metrics` only, a request of at most 8 KiB read within 2
//! seconds, `Connection: close`. A client that stalls costs one scrape's delay at most.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::exec::session::{BufferLimit, Ctx};
use crate::exec::stats_report::{emit_group, Group};
use crate::state::shared::Shared;
use crate::state::stats::WorkerStats;

/// The largest request read.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request or read the reply.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bind `addr` and serve metrics on a thread of its own for as long as the process runs.
pub fn start(shared: Arc<Shared>, addr: SocketAddr) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if shared.shutting_down() {
                    return;
                }
                // A failed accept or exchange concerns one client only.
                if let Ok(stream) = conn {
                    let _ = exchange(&shared, stream);
                }
            }
        })?;
    Ok(local)
}

/// Read one request and answer it.
fn exchange(shared: &Shared, mut stream: TcpStream) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut buf = [0u8; MAX_REQUEST];
    let mut len = 0;
    let head_end = loop {
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(());
        }
        len += n;
        if let Some(i) = buf[..len].windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if len == buf.len() {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "",
            );
        }
    };
    let line = buf[..head_end]
        .split(|&b| b == b'\r')
        .next()
        .unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET", b"/metrics") => {
            let body = render(shared);
            respond(&mut stream, "200 OK", CONTENT_TYPE, &body)
        }
        (b"GET", _) => respond(&mut stream, "404 Not Found", "text/plain", "see /metrics\n"),
        _ => respond(&mut stream, "405 Method Not Allowed", "text/plain", ""),
    }
}

fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()?;
    // Close gracefully: a socket closed with unread input resets the connection, and the
    // client could lose the reply (a request over the limit leaves input unread). Discard
    // what is left, within the client's time and at most 64 KiB.
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut sink = [0u8; 4096];
    let mut left: usize = 64 * 1024;
    while left > 0 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
    Ok(())
}

/// A `stats` group as the text protocol would print it.
fn stats_of(shared: &Shared, group: Group) -> BTreeMap<String, String> {
    let worker = WorkerStats::default();
    let mut scratch = Vec::new();
    let ctx = Ctx {
        shared,
        stats: &worker,
        scratch: &mut scratch,
        now: shared.clock.now(),
        buffers: BufferLimit::default(),
        worker: 0,
        cfd: -1,
    };
    let mut out = BTreeMap::new();
    emit_group(&ctx, group, &mut |name, value| {
        out.insert(name.to_string(), value.to_string());
    });
    out
}

/// The metrics text for one scrape.
pub fn render(shared: &Shared) -> String {
    let mut general = stats_of(shared, Group::General);
    let settings = stats_of(shared, Group::Settings);
    let repl = stats_of(shared, Group::Replication);
    let slabs = stats_of(shared, Group::Slabs);
    // What memcached reports in `stats slabs` (`total_malloced`), and the index's own
    // figures (the general group's `hash_*` are memcached's hash table's).
    for k in ["total_malloced", "index_bytes", "index_level"] {
        if let Some(v) = slabs.get(k) {
            general.insert(k.to_string(), v.clone());
        }
    }
    let mut r = registry(&general, &settings, &repl);
    slab_metrics(&mut r, &stats_of(shared, Group::Items), &slabs);
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &r);
    sort_samples(&text)
}

/// `text` with each family's samples in a fixed order (the encoder writes a labelled
/// family's series in hash order, which changes from one scrape to the next): runs of
/// sample lines are sorted, numbers in them by value (`slab="2"` before `slab="10"`).
fn sort_samples(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run: Vec<&str> = Vec::new();
    let flush = |run: &mut Vec<&str>, out: &mut String| {
        run.sort_by_cached_key(|line| natural_key(line));
        for line in run.drain(..) {
            out.push_str(line);
            out.push('\n');
        }
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut run, &mut out);
            out.push_str(line);
            out.push('\n');
        } else {
            run.push(line);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// A sort key that compares runs of digits by their value.
fn natural_key(line: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut n = u64::from(c as u8 - b'0');
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n.saturating_mul(10).saturating_add(u64::from(d));
                chars.next();
            }
            key.push((std::mem::take(&mut text), n));
        } else {
            text.push(c);
        }
    }
    key.push((text, 0));
    key
}

/// `(class, value)` of every `[PREFIX]CLASS:FIELD` line of a stats group.
fn per_class(stats: &BTreeMap<String, String>, prefix: &str, field: &str) -> Vec<(String, i64)> {
    stats
        .iter()
        .filter_map(|(k, v)| {
            let (class, f) = k.strip_prefix(prefix)?.split_once(':')?;
            let numeric = !class.is_empty() && class.bytes().all(|b| b.is_ascii_digit());
            (numeric && f == field).then_some((class.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The exporter's per-slab-class metrics that kvcached's per-class `stats items` and
/// `stats slabs` lines carry, labelled `slab` as the exporter labels them.
fn slab_metrics(
    r: &mut Registry,
    items: &BTreeMap<String, String>,
    slabs: &BTreeMap<String, String>,
) {
    let gauges = [
        (
            "memcached_slab_current_items",
            "Number of items currently stored in this slab class",
            per_class(items, "items:", "number"),
        ),
        (
            "memcached_slab_mem_requested_bytes",
            "Number of bytes of memory actual items take up within a slab",
            per_class(items, "items:", "mem_requested"),
        ),
        (
            "memcached_slab_chunk_size_bytes",
            "Number of bytes allocated to each chunk within this slab class",
            per_class(slabs, "", "chunk_size"),
        ),
        (
            "memcached_slab_chunks_used",
            "Number of chunks allocated to an item",
            per_class(slabs, "", "used_chunks"),
        ),
    ];
    for (name, help, rows) in gauges {
        let fam = Family::<Vec<(String, String)>, Gauge>::default();
        for (class, v) in rows {
            fam.get_or_create(&vec![("slab".to_string(), class)]).set(v);
        }
        r.register(name, help, fam);
    }
    let evicted = Family::<Vec<(String, String)>, Counter>::default();
    for (class, v) in per_class(items, "items:", "evicted") {
        evicted
            .get_or_create(&vec![("slab".to_string(), class)])
            .inc_by(v.max(0) as u64);
    }
    r.register(
        "memcached_slab_items_evicted",
        "Total number of times an item had to be evicted from the LRU before it expired",
        evicted,
    );
}

fn num(stats: &BTreeMap<String, String>, key: &str) -> Option<f64> {
    stats.get(key)?.parse().ok()
}

/// 1 when `key` is `yes` (or whatever means yes for it), 0 otherwise; None when absent.
fn flag(stats: &BTreeMap<String, String>, key: &str, yes: &str) -> Option<f64> {
    stats.get(key).map(|v| if v == yes { 1.0 } else { 0.0 })
}

fn int(stats: &BTreeMap<String, String>, key: &str) -> Option<u64> {
    stats.get(key)?.parse().ok()
}

/// The registry of one scrape, built from the `stats` groups.
fn registry(
    s: &BTreeMap<String, String>,
    settings: &BTreeMap<String, String>,
    repl: &BTreeMap<String, String>,
) -> Registry {
    let mut r = Registry::default();
    let gauge = |r: &mut Registry, name: &str, help: &str, v: Option<f64>| {
        if let Some(v) = v {
            r.register(name, help, ConstGauge::new(v));
        }
    };
    gauge(
        &mut r,
        "memcached_up",
        "Could the memcached server be reached",
        Some(1.0),
    );
    // memcached_exporter's names, in its units.
    gauge(
        &mut r,
        "memcached_uptime_seconds",
        "Number of seconds since the server started",
        num(s, "uptime"),
    );
    gauge(
        &mut r,
        "memcached_time_seconds",
        "current UNIX time according to the server",
        num(s, "time"),
    );
    gauge(
        &mut r,
        "memcached_current_bytes",
        "Current number of bytes used to store items",
        num(s, "bytes"),
    );
    gauge(
        &mut r,
        "memcached_limit_bytes",
        "Number of bytes this server is allowed to use for storage",
        num(s, "limit_maxbytes"),
    );
    gauge(
        &mut r,
        "memcached_current_items",
        "Current number of items stored by this instance",
        num(s, "curr_items"),
    );
    gauge(
        &mut r,
        "memcached_current_connections",
        "Current number of open connections",
        num(s, "curr_connections"),
    );
    gauge(
        &mut r,
        "memcached_max_connections",
        "Maximum number of clients allowed",
        num(settings, "maxconns"),
    );
    gauge(
        &mut r,
        "memcached_malloced_bytes",
        "Number of bytes of memory allocated to item storage",
        num(s, "total_malloced"),
    );
    gauge(
        &mut r,
        "memcached_accepting_connections",
        "The server is currently accepting connections",
        num(s, "accepting_conns"),
    );
    let crawler = flag(settings, "lru_crawler", "yes");
    gauge(
        &mut r,
        "memcached_lru_crawler_enabled",
        "Whether the LRU crawler is enabled",
        crawler,
    );
    if let Some(v) = s.get("version") {
        let fam = Family::<Vec<(String, String)>, Gauge>::default();
        fam.get_or_create(&vec![("version".to_string(), v.clone())])
            .set(1);
        r.register(
            "memcached_version",
            "The version of this memcached server",
            fam,
        );
    }

    let counter = |r: &mut Registry, name: &str, help: &str, v: Option<f64>| {
        if let Some(v) = v {
            // Encoded with the `_total` suffix.
            r.register(name, help, ConstCounter::new(v));
        }
    };
    let timeval = |key: &str| num(s, key);
    counter(
        &mut r,
        "memcached_process_user_cpu_seconds",
        "Accumulated user time for this process",
        timeval("rusage_user"),
    );
    counter(
        &mut r,
        "memcached_process_system_cpu_seconds",
        "Accumulated system time for this process",
        timeval("rusage_system"),
    );
    counter(
        &mut r,
        "memcached_read_bytes",
        "Total number of bytes read by this server from network",
        num(s, "bytes_read"),
    );
    counter(
        &mut r,
        "memcached_written_bytes",
        "Total number of bytes sent by this server to network",
        num(s, "bytes_written"),
    );
    counter(
        &mut r,
        "memcached_connections",
        "Total number of connections opened since the server started running",
        num(s, "total_connections"),
    );
    counter(
        &mut r,
        "memcached_connections_rejected",
        "Total number of connections rejected due to hitting the -c limit in maxconns_fast mode",
        num(s, "rejected_connections"),
    );
    counter(
        &mut r,
        "memcached_connections_yielded",
        "Total number of connections yielded running due to hitting the -R limit",
        num(s, "conn_yields"),
    );
    counter(
        &mut r,
        "memcached_connections_listener_disabled",
        "Number of times the server hit its connections limit and disabled its listener",
        num(s, "listen_disabled_num"),
    );
    counter(
        &mut r,
        "memcached_items",
        "Total number of items stored during the life of this instance",
        num(s, "total_items"),
    );
    counter(
        &mut r,
        "memcached_items_evicted",
        "Total number of valid items removed from cache to free memory for new items",
        num(s, "evictions"),
    );
    counter(
        &mut r,
        "memcached_items_reclaimed",
        "Total number of times an entry was stored using memory from an expired entry",
        num(s, "reclaimed"),
    );
    counter(
        &mut r,
        "memcached_item_too_large",
        "The number of times an item exceeded the max-item-size when being stored",
        num(s, "store_too_large"),
    );
    counter(
        &mut r,
        "memcached_item_no_memory",
        "The number of times an item could not be stored due to no more memory",
        num(s, "store_no_memory"),
    );

    // The flash tier (`-o ext_path`), as the exporter names extstore's series; absent
    // without a tier, as the exporter's are without extstore.
    for (name, help, key) in [
        (
            "memcached_extstore_bytes_limit",
            "Bytes of flash the tier may use",
            "extstore_limit_maxbytes",
        ),
        (
            "memcached_extstore_objects_used",
            "Items on flash",
            "extstore_objects_used",
        ),
        (
            "memcached_extstore_pages_used",
            "Flash pages in use",
            "extstore_pages_used",
        ),
        (
            "memcached_extstore_pages_free",
            "Flash pages free",
            "extstore_pages_free",
        ),
        (
            "memcached_extstore_io_queue_depth",
            "Flash reads and writes waiting",
            "extstore_io_queue",
        ),
    ] {
        gauge(&mut r, name, help, num(s, key));
    }
    for (name, help, key) in [
        (
            "memcached_extstore_bytes_used",
            "Bytes of items on flash",
            "extstore_bytes_used",
        ),
        (
            "memcached_extstore_bytes_written",
            "Bytes written to flash",
            "extstore_bytes_written",
        ),
        (
            "memcached_extstore_bytes_read",
            "Bytes read from flash",
            "extstore_bytes_read",
        ),
        (
            "memcached_extstore_objects_written",
            "Items written to flash",
            "extstore_objects_written",
        ),
        (
            "memcached_extstore_objects_read",
            "Items read from flash",
            "get_extstore",
        ),
        (
            "memcached_extstore_objects_evicted",
            "Items evicted from flash",
            "extstore_objects_evicted",
        ),
        (
            "memcached_extstore_pages_allocated",
            "Flash pages allocated",
            "extstore_page_allocs",
        ),
        (
            "memcached_extstore_pages_evicted",
            "Flash pages taken back with their items",
            "extstore_page_evictions",
        ),
        (
            "memcached_extstore_pages_reclaimed",
            "Flash pages freed",
            "extstore_page_reclaims",
        ),
    ] {
        counter(&mut r, name, help, num(s, key));
    }

    // memcached_commands_total{command,status}, as the exporter derives it from `stats`.
    let commands = Family::<Vec<(String, String)>, Counter>::default();
    let command = |cmd: &str, status: &str, v: Option<u64>| {
        if let Some(v) = v {
            let labels = vec![
                ("command".to_string(), cmd.to_string()),
                ("status".to_string(), status.to_string()),
            ];
            commands.get_or_create(&labels).inc_by(v);
        }
    };
    for op in ["get", "delete", "incr", "decr", "cas", "touch"] {
        command(op, "hit", int(s, &format!("{op}_hits")));
        command(op, "miss", int(s, &format!("{op}_misses")));
    }
    command("cas", "badval", int(s, "cas_badval"));
    command("flush", "hit", int(s, "cmd_flush"));
    // memcached counts cas commands in cmd_set too; the exporter takes them out.
    let cas: u64 = ["cas_hits", "cas_misses", "cas_badval"]
        .iter()
        .filter_map(|k| int(s, k))
        .sum();
    command(
        "set",
        "hit",
        int(s, "cmd_set").map(|v| v.saturating_sub(cas)),
    );
    r.register(
        "memcached_commands",
        "Total number of all requests broken down by command (get, set, etc.) and status",
        commands,
    );

    // kvcached's own.
    gauge(
        &mut r,
        "kvcached_index_bytes",
        "Bytes of the hash index (kvcached's own)",
        num(s, "index_bytes"),
    );
    gauge(
        &mut r,
        "kvcached_hash_power_level",
        "log2 of the hash index's main buckets (kvcached's own)",
        num(s, "index_level"),
    );
    gauge(
        &mut r,
        "kvcached_hash_is_expanding",
        "1 while the index grows (kvcached's own)",
        num(s, "hash_is_expanding"),
    );
    if let Some(role) = repl.get("role") {
        let fam = Family::<Vec<(String, String)>, Gauge>::default();
        fam.get_or_create(&vec![("role".to_string(), role.clone())])
            .set(1);
        r.register(
            "kvcached_replication_role",
            "This server's replication role: master or replica (kvcached's own)",
            fam,
        );
    }
    gauge(
        &mut r,
        "kvcached_replication_master_offset",
        "The log offset this server has written (kvcached's own)",
        num(repl, "master_offset"),
    );
    gauge(
        &mut r,
        "kvcached_replication_connected_replicas",
        "Replicas pulling from this server (kvcached's own)",
        num(repl, "connected_replicas"),
    );
    let link = flag(repl, "master_link_status", "up");
    gauge(
        &mut r,
        "kvcached_replication_link_up",
        "A replica's link to its master is up (kvcached's own)",
        link,
    );
    gauge(
        &mut r,
        "kvcached_replication_master_last_io_seconds",
        "Seconds since a replica last heard from its master (kvcached's own)",
        num(repl, "master_last_io_seconds_ago"),
    );
    counter(
        &mut r,
        "kvcached_replication_full_syncs",
        "Full resynchronisations (kvcached's own)",
        num(repl, "full_syncs"),
    );
    counter(
        &mut r,
        "kvcached_replication_partial_syncs",
        "Partial resynchronisations (kvcached's own)",
        num(repl, "partial_syncs"),
    );
    gauge(
        &mut r,
        "kvcached_replication_held_segments",
        "Dead or expired segments kept for a replica that has not read them (kvcached's own)",
        num(repl, "held_segments"),
    );
    counter(
        &mut r,
        "kvcached_replication_held_segments_dropped",
        "Maintenance passes that freed segments a replica still needed, at the cap (kvcached's own)",
        num(repl, "held_segments_dropped"),
    );
    counter(
        &mut r,
        "kvcached_replication_relogged_segments",
        "Segments freed before a replica read them, logged anew so that it skips them (kvcached's own)",
        num(repl, "relogged_segments"),
    );
    gauge(
        &mut r,
        "kvcached_replication_backlog_bytes",
        "The most memory dead or expired segments may take for replicas, --repl-backlog (kvcached's own)",
        num(repl, "repl_backlog_bytes"),
    );
    let lag_bytes = Family::<Vec<(String, String)>, Gauge>::default();
    let lag_seconds = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    for i in 0..int(repl, "connected_replicas").unwrap_or(0) {
        let Some(id) = repl.get(&format!("replica{i}_id")) else {
            continue;
        };
        let labels = vec![("replica".to_string(), id.clone())];
        if let Some(b) = num(repl, &format!("replica{i}_lag_bytes")) {
            lag_bytes.get_or_create(&labels).set(b as i64);
        }
        if let Some(t) = num(repl, &format!("replica{i}_lag_seconds")) {
            lag_seconds.get_or_create(&labels).set(t);
        }
    }
    r.register(
        "kvcached_replication_lag_bytes",
        "How far each replica is behind, in bytes of log (kvcached's own)",
        lag_bytes,
    );
    r.register(
        "kvcached_replication_lag_seconds",
        "How far each replica is behind, in seconds (kvcached's own)",
        lag_seconds,
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_sorted_within_families_numbers_by_value() {
        let text = "# HELP a A.\n# TYPE a gauge\na{class=\"10\"} 1\na{class=\"2\"} 2\n\
                    a{class=\"1\"} 3\n# HELP b B.\n# TYPE b counter\nb_total{op=\"touch\"} 1\n\
                    b_total{op=\"get\"} 2\n# EOF\n";
        assert_eq!(
            sort_samples(text),
            "# HELP a A.\n# TYPE a gauge\na{class=\"1\"} 3\na{class=\"2\"} 2\n\
             a{class=\"10\"} 1\n# HELP b B.\n# TYPE b counter\nb_total{op=\"get\"} 2\n\
             b_total{op=\"touch\"} 1\n# EOF\n"
        );
    }
}
