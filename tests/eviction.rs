//! Eviction's size factor through the real binary (`-o evict_size_factor`, kvcached's own;
//! the policy itself is tested in `crates/kvstore/src/log/tests.rs`): the option reaches
//! the engine, `stats settings` shows it and `stats slabs` counts readmissions.

mod common;

use common::{Client, Kind, Server};

/// The value of `name` in `stats GROUP`.
fn stat_in(c: &mut Client, group: &str, name: &str) -> Option<String> {
    c.stats(group)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// Whether `key` is held, by a get.
fn held(c: &mut Client, key: &str) -> bool {
    c.send(format!("get {key}\r\n").as_bytes());
    let reply = c.until("END\r\n");
    reply.starts_with("VALUE ")
}

/// A server with `-m 8` and `extra` options: a small and a large item written and read
/// once, then twice the memory in small items nobody reads. Whether each of the two is
/// still held, and the server's `evict_size_factor` setting.
fn after_a_flood(extra: &[&str]) -> (bool, bool, String) {
    let mut args = vec!["-m", "8"];
    args.extend_from_slice(extra);
    let server = Server::start_verified(Kind::Kvcached, &args);
    let mut c = server.connect();
    let small = "s".repeat(100);
    let big = "b".repeat(8000);
    assert_eq!(
        c.call(&format!("set small 0 0 100\r\n{small}\r\n")),
        "STORED\r\n"
    );
    assert_eq!(
        c.call(&format!("set big 0 0 8000\r\n{big}\r\n")),
        "STORED\r\n"
    );
    assert!(held(&mut c, "small"));
    assert!(held(&mut c, "big"));
    // 16 MiB of 100-byte values, in batches without replies, then a round trip.
    let mut batch = Vec::new();
    for b in 0..160 {
        batch.clear();
        for i in 0..1000 {
            batch.extend_from_slice(format!("set cold:{b}:{i} 0 0 100 noreply\r\n").as_bytes());
            batch.extend_from_slice(small.as_bytes());
            batch.extend_from_slice(b"\r\n");
        }
        c.send(&batch);
    }
    assert!(c.call("version\r\n").starts_with("VERSION "));
    let evicted: u64 = stat_in(&mut c, "", "evictions")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(evicted > 50_000, "{evicted} evictions");
    assert!(stat_in(&mut c, "slabs", "readmitted").is_some());
    let factor = stat_in(&mut c, "settings", "evict_size_factor").unwrap_or_default();
    (held(&mut c, "small"), held(&mut c, "big"), factor)
}

#[test]
fn size_factor_keeps_small_items_and_can_be_turned_off() {
    // The default factor (4): the 8000-byte item (about 60 times the mean) needed three
    // reads to be kept; the 100-byte one needed one.
    assert_eq!(after_a_flood(&[]), (true, false, "4".to_string()));
    // Size-blind: one read keeps either.
    assert_eq!(
        after_a_flood(&["-o", "evict_size_factor=0"]),
        (true, true, "0".to_string())
    );
}
