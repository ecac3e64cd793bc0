//! memcached's introspection commands against the real binary: `lru_crawler metadump` and
//! `mgdump` (formats, classes, errors, streaming without stopping other clients) and
//! `stats detail` (per-prefix counters, `-D`, reset, streaming dump). The expected lines
//! are memcached 1.6.45's, read off a running 1.6.45 (its formats differ from Debian's
//! 1.6.18, so these are not differential tests). kvcached only.

mod common;

use std::collections::HashSet;

use common::{Client, Kind, Server};

fn kvcached(args: &[&str]) -> Server {
    Server::start_verified(Kind::Kvcached, args)
}

fn server_time(c: &mut Client) -> u64 {
    c.stat("time").expect("time").parse().expect("number")
}

/// A metadump line without its `la=` and `cas=` fields (which depend on when and in which
/// order the items were written).
fn without_la_cas(line: &str) -> String {
    line.split(' ')
        .filter(|f| !f.starts_with("la=") && !f.starts_with("cas="))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn metadump_lists_every_live_item_in_memcacheds_format() {
    let s = kvcached(&[]);
    let mut c = s.connect();
    assert_eq!(c.call("set foo 5 0 3\r\nbar\r\n"), "STORED\r\n");
    let before = server_time(&mut c);
    assert_eq!(c.call("set a:b 0 100 1\r\nx\r\n"), "STORED\r\n");
    let after = server_time(&mut c);
    assert_eq!(c.call("set sp%20c 0 0 1\r\ny\r\n"), "STORED\r\n");
    // A binary key (meta base64) and an item that is gone.
    assert_eq!(c.call("ms AAEC 1 b\r\nz\r\n"), "HD\r\n");
    assert_eq!(c.call("set gone 0 0 1\r\nq\r\n"), "STORED\r\n");
    assert_eq!(c.call("delete gone\r\n"), "DELETED\r\n");
    let _ = c.call("get foo\r\n");
    c.until("END\r\n");

    let out = {
        assert_eq!(c.call("lru_crawler metadump all\r\n"), "OK\r\n");
        c.until("END\r\n")
    };
    let lines: Vec<&str> = out.lines().filter(|l| *l != "END").collect();
    assert_eq!(lines.len(), 4, "{out}");
    let find = |key: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("key={key} ")))
            .unwrap_or_else(|| panic!("{key} missing from {out}"))
            .to_string()
    };
    // The sizes and classes are memcached 1.6.45's for the same items.
    assert_eq!(
        without_la_cas(&find("foo")),
        "key=foo exp=-1 fetch=yes cls=1 size=69 flags=5 "
    );
    assert_eq!(
        without_la_cas(&find("sp%2520c")),
        "key=sp%2520c exp=-1 fetch=no cls=1 size=66 flags=0 "
    );
    assert_eq!(
        without_la_cas(&find("%00%01%02")),
        "key=%00%01%02 exp=-1 fetch=no cls=1 size=63 flags=0 "
    );
    let ab = find("a%3Ab");
    let exp: u64 = ab
        .split(' ')
        .find_map(|f| f.strip_prefix("exp="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (before + 100..=after + 100).contains(&exp),
        "exp {exp} not 100 s after the set ({before}..={after})"
    );
    let la: u64 = ab
        .split(' ')
        .find_map(|f| f.strip_prefix("la="))
        .unwrap()
        .parse()
        .unwrap();
    assert!((before..=after).contains(&la), "la {la}");
    // Each line ends with a space and a bare newline, as memcached's.
    assert!(
        out.contains("flags=0 \nkey=") || out.contains("flags=5 \nkey="),
        "{out:?}"
    );

    // hash walks the same items; mgdump lists them as requests, a binary key in base64.
    assert_eq!(c.call("lru_crawler metadump hash\r\n"), "OK\r\n");
    assert_eq!(c.until("END\r\n").lines().count(), 5);
    assert_eq!(c.call("lru_crawler mgdump all\r\n"), "OK\r\n");
    let mg = c.until("EN\r\n");
    let mut mg: Vec<&str> = mg.lines().collect();
    mg.sort_unstable();
    assert_eq!(mg, ["EN", "mg AAEC b", "mg a:b", "mg foo", "mg sp%20c"]);
    // The requests work as they are.
    assert_eq!(c.call("mg AAEC b v\r\n"), "VA 1\r\n");
}

#[test]
fn metadump_classes_and_refusals_are_memcacheds() {
    let s = kvcached(&[]);
    let mut c = s.connect();
    assert_eq!(c.call("set small 0 0 1\r\nx\r\n"), "STORED\r\n");
    let big = "v".repeat(5000);
    assert_eq!(
        c.call(&format!("set big 0 0 {}\r\n{big}\r\n", big.len())),
        "STORED\r\n"
    );
    // `me` names the big item's class; metadump of that class lists only it.
    let me = c.call("me big\r\n");
    let cls = me
        .split(' ')
        .find_map(|f| f.strip_prefix("cls="))
        .expect("cls")
        .to_string();
    assert_ne!(cls, "1");
    assert_eq!(
        c.call(&format!("lru_crawler metadump 1,{cls}\r\n")),
        "OK\r\n"
    );
    assert_eq!(c.until("END\r\n").lines().count(), 3);
    assert_eq!(c.call(&format!("lru_crawler metadump {cls}\r\n")), "OK\r\n");
    let only = c.until("END\r\n");
    assert!(only.starts_with("key=big "), "{only}");
    assert_eq!(only.lines().count(), 2);
    assert_eq!(c.call("lru_crawler metadump 63\r\n"), "OK\r\n");
    assert_eq!(c.line(), "END\r\n");

    for bad in ["0", "64", "x", "1,x", "alL"] {
        assert_eq!(
            c.call(&format!("lru_crawler metadump {bad}\r\n")),
            "BADCLASS invalid class id\r\n",
            "{bad}"
        );
    }
    assert_eq!(
        c.call("lru_crawler metadump ,\r\n"),
        "NOTSTARTED no items to crawl\r\n"
    );
    assert_eq!(c.call("lru_crawler metadump\r\n"), "ERROR\r\n");
    // A reply still queued before the dump: memcached refuses to start it.
    c.send(b"version\r\nlru_crawler metadump all\r\n");
    assert!(c.line().starts_with("VERSION "));
    assert_eq!(
        c.line(),
        "ERROR cannot pipeline other commands before metadump\r\n"
    );
    // Requests after a dump are answered after it.
    c.send(b"lru_crawler mgdump all\r\nget small\r\n");
    assert_eq!(c.line(), "OK\r\n");
    assert_eq!(c.until("EN\r\n").lines().count(), 3);
    assert_eq!(c.until("END\r\n"), "VALUE small 0 1\r\nx\r\nEND\r\n");

    let s = kvcached(&["-X"]);
    let mut c = s.connect();
    assert_eq!(
        c.call("lru_crawler metadump all\r\n"),
        "ERROR metadump not allowed\r\n"
    );
    assert_eq!(
        c.call("lru_crawler mgdump all\r\n"),
        "ERROR key dump not allowed\r\n"
    );
    let s = kvcached(&["-o", "no_lru_crawler"]);
    let mut c = s.connect();
    assert_eq!(
        c.call("lru_crawler metadump all\r\n"),
        "CLIENT_ERROR lru crawler disabled\r\n"
    );
}

#[test]
fn a_large_dump_streams_while_other_clients_are_served() {
    const ITEMS: usize = 20_000;
    let s = kvcached(&["-m", "64"]);
    let mut w = s.connect();
    // 20,000 items with 150-byte keys: a dump of about 4 MB, 16 times the output a
    // connection may queue, so it must pause and resume many times.
    let key = |i: usize| format!("{i:0>150}");
    let mut batch = String::new();
    for i in 0..ITEMS {
        batch.push_str(&format!("set {} 0 0 1 noreply\r\nx\r\n", key(i)));
        if batch.len() > 64 * 1024 || i + 1 == ITEMS {
            w.send(batch.as_bytes());
            batch.clear();
        }
    }
    assert!(w.call("version\r\n").starts_with("VERSION"));
    assert_eq!(w.stat("curr_items").as_deref(), Some("20000"));

    let mut dumper = s.connect();
    dumper.send(b"lru_crawler metadump all\r\n");
    // While the dump waits for its client to read, the server keeps serving others.
    for i in 0..100 {
        assert_eq!(
            w.call(&format!("set other{i} 0 0 1\r\ny\r\n")),
            "STORED\r\n"
        );
    }
    assert_eq!(w.call("get other7\r\n"), "VALUE other7 0 1\r\n");
    w.until("END\r\n");

    assert_eq!(dumper.line(), "OK\r\n");
    let out = dumper.until("END\r\n");
    let mut seen = HashSet::new();
    for line in out.lines().filter(|l| *l != "END") {
        let k = line
            .strip_prefix("key=")
            .and_then(|l| l.split(' ').next())
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        seen.insert(k.to_string());
    }
    // Every item stored before the dump is listed (the 100 written during it may be or
    // not); nothing else is.
    for i in 0..ITEMS {
        assert!(seen.contains(&key(i)), "item {i} missing");
    }
    assert!(seen.len() <= ITEMS + 100, "{} keys", seen.len());

    // A client that starts a dump and goes away in the middle costs nothing afterwards:
    // its connection is closed and the server goes on.
    let before: u64 = w.stat("curr_connections").unwrap().parse().unwrap();
    let mut quitter = s.connect();
    quitter.send(b"lru_crawler metadump all\r\n");
    assert_eq!(quitter.line(), "OK\r\n");
    drop(quitter);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now: u64 = w.stat("curr_connections").unwrap().parse().unwrap();
        if now == before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned dump's connection is still open ({now} > {before})"
        );
        std::thread::yield_now();
    }
    assert_eq!(w.call("get other7\r\n"), "VALUE other7 0 1\r\n");
    w.until("END\r\n");
}

#[test]
fn stats_detail_counts_per_prefix_as_memcached() {
    let s = kvcached(&[]);
    let mut c = s.connect();
    assert_eq!(c.call("set a:b 0 100 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(c.call("stats detail on\r\n"), "OK\r\n");
    c.send(b"get a:b a:c nodelim\r\nset q:1 0 0 1\r\n1\r\ndelete a:z\r\ntouch a:b 10\r\n");
    assert_eq!(c.until("END\r\n"), "VALUE a:b 0 1\r\nx\r\nEND\r\n");
    assert_eq!(c.line(), "STORED\r\n");
    assert_eq!(c.line(), "NOT_FOUND\r\n");
    assert_eq!(c.line(), "TOUCHED\r\n");
    // The same sequence against memcached 1.6.45 gives these lines (touch is not counted,
    // and neither are keys without the delimiter).
    assert_eq!(
        c.call("stats detail dump\r\n"),
        "PREFIX a get 2 hit 1 set 0 del 1\r\n"
    );
    assert_eq!(
        c.until("END\r\n"),
        "PREFIX q get 0 hit 0 set 1 del 0\r\nEND\r\n"
    );
    let settings = c.stats("settings");
    let setting = |name: &str| {
        settings
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(setting("detail_enabled").as_deref(), Some("yes"));
    assert_eq!(setting("stat_key_prefix").as_deref(), Some(":"));
    assert_eq!(setting("dump_enabled").as_deref(), Some("yes"));

    for bad in ["stats detail", "stats detail x", "stats detail onx"] {
        assert_eq!(
            c.call(&format!("{bad}\r\n")),
            "CLIENT_ERROR usage: stats detail on|off|dump\r\n",
            "{bad}"
        );
    }
    // Abbreviated as memcached allows; off stops counting but keeps the table.
    assert_eq!(c.call("stats detail of\r\n"), "OK\r\n");
    assert_eq!(c.call("get a:b\r\n"), "VALUE a:b 0 1\r\n");
    c.until("END\r\n");
    assert_eq!(
        c.call("stats detail d\r\n"),
        "PREFIX a get 2 hit 1 set 0 del 1\r\n"
    );
    c.until("END\r\n");
    // stats reset empties it.
    assert_eq!(c.call("stats reset\r\n"), "RESET\r\n");
    assert_eq!(c.call("stats detail dump\r\n"), "END\r\n");

    // -D sets the delimiter and starts counting; -X refuses the command.
    let s = kvcached(&["-D", "/"]);
    let mut c = s.connect();
    assert_eq!(c.call("set x/1 0 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(c.call("set y:1 0 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(
        c.call("stats detail dump\r\n"),
        "PREFIX x get 0 hit 0 set 1 del 0\r\n"
    );
    assert_eq!(c.line(), "END\r\n");
    let s = kvcached(&["-X"]);
    let mut c = s.connect();
    assert_eq!(
        c.call("stats detail on\r\n"),
        "CLIENT_ERROR stats detail not allowed\r\n"
    );
}

#[test]
fn stats_detail_counts_binary_requests_and_streams_a_long_dump() {
    const PREFIXES: usize = 8_000;
    let s = kvcached(&["-D", ":"]);
    let mut c = s.connect();
    // A binary get (miss) for prefix "bin".
    let key = b"bin:k";
    let mut get = vec![0x80, 0x00, 0, key.len() as u8, 0, 0, 0, 0];
    get.extend_from_slice(&(key.len() as u32).to_be_bytes());
    get.extend_from_slice(&[0; 12]);
    get.extend_from_slice(key);
    let mut bin = s.connect();
    bin.send(&get);
    let reply = bin.exact(24);
    assert_eq!(&reply[6..8], &[0, 1], "key not found");
    let skip = u32::from_be_bytes([reply[8], reply[9], reply[10], reply[11]]) as usize;
    bin.exact(skip);

    // 8,000 prefixes: a dump of about 300 KB, more than a connection queues at once.
    let mut batch = String::new();
    for i in 0..PREFIXES {
        batch.push_str(&format!("set p{i:05}:k 0 0 1 noreply\r\nx\r\n"));
    }
    c.send(batch.as_bytes());
    assert!(c.call("version\r\n").starts_with("VERSION"));
    c.send(b"stats detail dump\r\n");
    let out = c.until("END\r\n");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), PREFIXES + 2, "every prefix once, bin:, END");
    assert_eq!(lines[0], "PREFIX bin get 1 hit 0 set 0 del 0");
    for (i, l) in lines[1..=PREFIXES].iter().enumerate() {
        assert_eq!(*l, format!("PREFIX p{i:05} get 0 hit 0 set 1 del 0"));
    }
}

/// The fields of a watch line other than `ts=` and `gid=`, and its gid.
fn watch_fields(line: &str) -> (u64, String) {
    let mut gid = 0;
    let rest: Vec<&str> = line
        .trim_end()
        .split(' ')
        .filter(|f| {
            if let Some(g) = f.strip_prefix("gid=") {
                gid = g.parse().expect("gid");
                return false;
            }
            !f.starts_with("ts=")
        })
        .collect();
    (gid, rest.join(" "))
}

#[test]
fn watch_streams_memcacheds_log_lines() {
    let s = kvcached(&[]);
    let mut w = s.connect();
    assert_eq!(
        w.call("watch fetchers mutations deletions connevents\r\n"),
        "OK\r\n"
    );
    let mut c = s.connect();
    let port = c.stream().local_addr().unwrap().port();
    assert_eq!(c.call("set foo 5 0 3\r\nbar\r\n"), "STORED\r\n");
    assert_eq!(c.call("get foo\r\n"), "VALUE foo 5 3\r\n");
    c.until("END\r\n");
    assert_eq!(c.call("get no%20pe\r\n"), "END\r\n");
    assert_eq!(c.call("add x 0 10 1\r\n1\r\n"), "STORED\r\n");
    assert_eq!(c.call("delete foo\r\n"), "DELETED\r\n");
    c.send(b"quit\r\n");
    assert!(c.closed());

    // The lines arrive as they are written; read until this client's close, within the
    // timeout. (Connection lines of other clients, such as the harness's start-up probe,
    // are left out.)
    let mut seen = Vec::new();
    let me = format!(" rport={port} ");
    loop {
        let line = w.line();
        assert!(!line.is_empty(), "watcher closed after {seen:?}");
        if line.contains("type=conn_") && !line.contains(&me) {
            continue;
        }
        let done = line.contains("type=conn_close");
        seen.push(line);
        if done {
            break;
        }
    }
    let (gids, fields): (Vec<u64>, Vec<String>) = seen.iter().map(|l| watch_fields(l)).unzip();
    assert!(gids.windows(2).all(|p| p[0] < p[1]), "gids {gids:?}");
    assert!(seen.iter().all(|l| l.starts_with("ts=")), "{seen:?}");
    // cfd is the client's socket, the same in every line.
    let cfd = fields[0]
        .split(' ')
        .find_map(|f| f.strip_prefix("cfd="))
        .expect("cfd")
        .to_string();
    let want = [
        format!("type=conn_new rip=127.0.0.1 rport={port} transport=tcp cfd={cfd}"),
        // A store and a delete look the key up first, and memcached logs that lookup.
        format!("type=item_get key=foo status=not_found clsid=0 cfd={cfd} size=0"),
        format!("type=item_store key=foo status=stored cmd=set ttl=0 clsid=1 cfd={cfd} size=3"),
        format!("type=item_get key=foo status=found clsid=1 cfd={cfd} size=3"),
        format!("type=item_get key=no%2520pe status=not_found clsid=0 cfd={cfd} size=0"),
        format!("type=item_get key=x status=not_found clsid=0 cfd={cfd} size=0"),
        format!("type=item_store key=x status=stored cmd=add ttl=10 clsid=1 cfd={cfd} size=1"),
        format!("type=item_get key=foo status=found clsid=1 cfd={cfd} size=3"),
        "type=deleted key=foo cmd=delete clsid=1 size=3".to_string(),
        format!("type=conn_close rip=127.0.0.1 rport={port} transport=tcp reason=normal cfd={cfd}"),
    ];
    assert_eq!(fields, want);
    // memcached's log counters in `stats`.
    let mut other = s.connect();
    let stats = other.stats("");
    let num = |name: &str| -> u64 {
        stats
            .iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .1
            .parse()
            .unwrap()
    };
    assert_eq!(num("log_watchers"), 1);
    assert!(num("log_watcher_sent") >= want.len() as u64);
    assert!(num("log_worker_written") >= want.len() as u64);
    assert_eq!(num("log_watcher_skipped"), 0);
    drop(other);
    // What the watcher sends is ignored; it stays a watcher.
    w.send(b"get foo\r\n");
    let mut c = s.connect();
    assert_eq!(c.call("get foo\r\n"), "END\r\n");
    loop {
        let line = w.line();
        if line.contains("type=item_get") {
            assert!(line.contains("key=foo status=not_found"), "{line}");
            break;
        }
    }
}

#[test]
fn watch_refusals_and_the_watcher_limit_are_memcacheds() {
    let s = kvcached(&["-W"]);
    let mut c = s.connect();
    assert_eq!(
        c.call("watch\r\n"),
        "CLIENT_ERROR watch commands not allowed\r\n"
    );

    let s = kvcached(&[]);
    let mut c = s.connect();
    assert_eq!(c.call("watch bogus\r\n"), "ERROR\r\n");
    assert_eq!(c.call("watch fetchers bogus\r\n"), "ERROR\r\n");
    c.send(b"version\r\nwatch\r\n");
    assert!(c.line().starts_with("VERSION "));
    assert_eq!(
        c.line(),
        "ERROR cannot pipeline other commands before watch\r\n"
    );
    // memcached's limit: 20 watchers.
    let mut watchers: Vec<Client> = (0..20)
        .map(|i| {
            let mut w = s.connect();
            assert_eq!(w.call("watch\r\n"), "OK\r\n", "watcher {i}");
            w
        })
        .collect();
    assert_eq!(
        c.call("watch\r\n"),
        "WATCHER_TOO_MANY log watcher limit reached\r\n"
    );
    // A watcher that goes away frees its place (once the server has seen the close).
    drop(watchers.pop());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut w = s.connect();
        let reply = w.call("watch\r\n");
        if reply == "OK\r\n" {
            break;
        }
        assert_eq!(reply, "WATCHER_TOO_MANY log watcher limit reached\r\n");
        assert!(
            std::time::Instant::now() < deadline,
            "the closed watcher's place was not freed"
        );
        std::thread::yield_now();
    }
    // Watchers cost a client nothing when they watch other kinds.
    assert_eq!(c.call("set k 0 0 1\r\nv\r\n"), "STORED\r\n");
}

#[test]
fn watch_evictions_reports_evicted_items() {
    let s = kvcached(&["-m", "8"]);
    let mut w = s.connect();
    assert_eq!(w.call("watch evictions\r\n"), "OK\r\n");
    let mut c = s.connect();
    // 24 MiB of 1 KiB values into 8 MiB: thousands of evictions.
    let value = "v".repeat(1024);
    let mut batch = String::new();
    for i in 0..24 * 1024 {
        batch.push_str(&format!("set key{i} 7 0 1024 noreply\r\n{value}\r\n"));
        if batch.len() > 256 * 1024 {
            c.send(batch.as_bytes());
            batch.clear();
        }
    }
    c.send(batch.as_bytes());
    assert!(c.call("version\r\n").starts_with("VERSION"));
    let evictions: u64 = c.stat("evictions").unwrap().parse().unwrap();
    assert!(evictions > 1000, "{evictions} evictions");
    // The first line: an item written above, never fetched, no expiry, 1 KiB.
    let line = w.line();
    let (_, fields) = watch_fields(&line);
    let f: Vec<&str> = fields.split(' ').collect();
    assert_eq!(f[0], "type=eviction", "{line}");
    assert!(f[1].starts_with("key=key"), "{line}");
    assert_eq!(&f[2..4], ["fetch=no", "ttl=-1"], "{line}");
    assert!(f[4].starts_with("la="), "{line}");
    assert!(f[5].starts_with("clsid=") && f[5] != "clsid=0", "{line}");
    assert_eq!(f[6], "size=1024", "{line}");
}

/// Rows of a stats group whose names start with `prefix`, in order.
fn rows(c: &mut Client, group: &str, keep: &dyn Fn(&str) -> bool) -> Vec<(String, String)> {
    c.stats(group)
        .into_iter()
        .filter(|(k, _)| keep(k))
        .collect()
}

/// Items of many sizes (some with flags, one overwritten, one deleted), the same on both.
fn store_sized_items(c: &mut Client) {
    for (i, len) in [1usize, 10, 40, 47, 48, 100, 150, 300, 1000, 5000, 70_000]
        .iter()
        .enumerate()
    {
        let v = "x".repeat(*len);
        let flags = if i % 2 == 0 { 0 } else { 7 };
        let req = format!("set k{i} {flags} 0 {len}\r\n{v}\r\n");
        assert_eq!(c.call(&req), "STORED\r\n");
    }
    assert_eq!(c.call("set k2 0 0 3\r\nabc\r\n"), "STORED\r\n");
    assert_eq!(c.call("delete k5\r\n"), "DELETED\r\n");
}

/// `stats items` per class (`number`, `mem_requested`), `stats slabs` per class
/// (`chunk_size`, `used_chunks`) and `stats sizes` with `-o track_sizes` are memcached's,
/// for the default classes and for `-n 100 -f 2`: the same items give the same figures.
#[test]
fn per_class_stats_and_sizes_are_memcacheds() {
    for extra in [&[][..], &["-n", "100", "-f", "2"][..]] {
        let mut figures = Vec::new();
        for kind in [Kind::Memcached, Kind::Kvcached] {
            let mut args = vec!["-o", "track_sizes"];
            args.extend_from_slice(extra);
            let s = Server::start_verified(kind, &args);
            let mut c = s.connect();
            store_sized_items(&mut c);
            let items = rows(&mut c, "items", &|k| {
                k.ends_with(":number") || k.ends_with(":mem_requested")
            });
            let slabs = rows(&mut c, "slabs", &|k| {
                k.ends_with(":chunk_size") || k.ends_with(":used_chunks")
            });
            let sizes = c.stats("sizes");
            figures.push((items, slabs, sizes));
        }
        let (mc, kv) = (&figures[0], &figures[1]);
        assert!(mc.0.len() >= 10, "{extra:?}: memcached {:?}", mc.0);
        assert_eq!(kv.0, mc.0, "{extra:?}: stats items");
        // Both list every class that has held items (memcached: has slab pages), the ones
        // emptied since included.
        assert_eq!(kv.1, mc.1, "{extra:?}: stats slabs");
        assert_eq!(kv.2, mc.2, "{extra:?}: stats sizes");
    }
    // Without -o track_sizes: disabled, as in memcached.
    let s = kvcached(&[]);
    let mut c = s.connect();
    assert_eq!(c.call("stats sizes\r\n"), "STAT sizes_status disabled\r\n");
    assert_eq!(c.line(), "END\r\n");
}

/// `stats cachedump` and `lru_crawler metadump` of a class with few items walk the whole
/// index, listing almost nothing: they stop after a turn's share of the walk and go on at
/// the next turn (`conn_yields` counts each stop), so that the worker's other connections
/// are served meanwhile; a request pipelined behind one runs once it is done.
#[test]
fn dumps_of_a_sparse_class_let_the_worker_serve_others() {
    let s = kvcached(&["-t", "1"]);
    let mut c = s.connect();
    assert_eq!(c.call("set a 0 0 10\r\n0123456789\r\n"), "STORED\r\n");
    let buckets: u64 = c
        .stats("slabs")
        .into_iter()
        .find(|(k, _)| k == "index_buckets")
        .and_then(|(_, v)| v.parse().ok())
        .expect("index_buckets");
    let yields = |c: &mut Client| -> u64 {
        c.stat("conn_yields")
            .and_then(|v| v.parse().ok())
            .expect("conn_yields")
    };
    // 64 buckets per engine call, 8 calls per turn.
    let stops = (buckets / 64 / 8).saturating_sub(1).max(1);
    let before = yields(&mut c);
    c.send(b"stats cachedump 40 0\r\nversion\r\n");
    assert_eq!(c.line(), "END\r\n");
    assert!(c.line().starts_with("VERSION "));
    let after = yields(&mut c);
    assert!(
        after >= before + stops,
        "conn_yields {before} -> {after} over {buckets} buckets"
    );
    c.send(b"lru_crawler metadump 40\r\n");
    assert_eq!(c.line(), "OK\r\n");
    assert_eq!(c.line(), "END\r\n");
    assert!(yields(&mut c) >= after + stops);
    // Clients that go away in the middle of a dump leave nothing behind.
    for _ in 0..20 {
        let mut gone = s.connect();
        gone.send(b"stats cachedump 40 0\r\nlru_crawler metadump 40\r\n");
    }
    common::repl::poll_until(
        "the dumping clients to be gone",
        common::repl::SYNC,
        || match c.stat("curr_connections").as_deref() {
            Some("1") => Ok(()),
            other => Err(format!("curr_connections {other:?}")),
        },
    );
    assert_eq!(c.call("get a\r\n"), "VALUE a 0 10\r\n");
    assert_eq!(c.line(), "0123456789\r\n");
    assert_eq!(c.line(), "END\r\n");
}

#[test]
fn cachedump_lists_a_class_and_refuses_as_memcached() {
    let s = kvcached(&[]);
    let mut c = s.connect();
    assert_eq!(c.call("set a 0 0 10\r\n0123456789\r\n"), "STORED\r\n");
    assert_eq!(c.call("set b 0 0 9\r\n012345678\r\n"), "STORED\r\n");
    let v = "y".repeat(100);
    let earliest = server_time(&mut c) + 100;
    assert_eq!(
        c.call(&format!("set bb 5 100 100\r\n{v}\r\n")),
        "STORED\r\n"
    );
    let latest = server_time(&mut c) + 100;
    // a and b are class 1 (70 and 69 bytes), bb class 4 (165 bytes).
    c.send(b"stats cachedump 1 0\r\n");
    let one = c.until("END\r\n");
    let mut lines: Vec<&str> = one.lines().collect();
    assert_eq!(lines.pop(), Some("END"), "{one}");
    lines.sort_unstable();
    assert_eq!(lines, ["ITEM a [10 b; 0 s]", "ITEM b [9 b; 0 s]"]);
    c.send(b"stats cachedump 1 1\r\n");
    assert_eq!(c.until("END\r\n").lines().count(), 2);
    let four = c.call("stats cachedump 4 0\r\n");
    assert_eq!(c.line(), "END\r\n");
    // The expiry is a unix time: 100 s after the set, by the server's clock read just
    // before and just after it (it may tick in between, more than once on a busy machine).
    let t: u64 = four
        .strip_prefix("ITEM bb [100 b; ")
        .and_then(|r| r.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{four}"));
    assert!(
        (earliest..=latest).contains(&t),
        "{t} not in {earliest}..={latest}"
    );
    assert_eq!(c.call("stats cachedump 2 0\r\n"), "END\r\n");
    for (req, want) in [
        ("stats cachedump 1\r\n", "CLIENT_ERROR bad command line\r\n"),
        (
            "stats cachedump x 0\r\n",
            "CLIENT_ERROR bad command line format\r\n",
        ),
        (
            "stats cachedump 1 -1\r\n",
            "CLIENT_ERROR bad command line format\r\n",
        ),
        (
            "stats cachedump 64 0\r\n",
            "CLIENT_ERROR Illegal slab id\r\n",
        ),
        ("stats cachedump 63 0\r\n", "END\r\n"),
    ] {
        assert_eq!(c.call(req), want, "{req:?}");
    }
    // A client that asks for many dumps, never reads them and goes away costs nothing
    // after: the server still answers, and still holds every item.
    {
        let mut greedy = s.connect();
        for _ in 0..200 {
            greedy.send(b"stats cachedump 1 0\r\nstats cachedump 4 0\r\n");
        }
    }
    assert_eq!(c.call("stats cachedump 2 0\r\n"), "END\r\n");
    assert_eq!(c.call("get a\r\n"), "VALUE a 0 10\r\n");
    c.until("END\r\n");
    // -X: not allowed, as in memcached.
    let s = kvcached(&["-X"]);
    let mut c = s.connect();
    assert_eq!(
        c.call("stats cachedump 1 0\r\n"),
        "CLIENT_ERROR stats cachedump not allowed\r\n"
    );
}

/// memcached 1.6.45's general `stats` fields, in its order, for its default settings
/// (read off a running 1.6.45): those of its slab mover, LRU crawler and LRU maintainer
/// included, which kvcached prints with the values an idle mover or maintainer has.
const MEMCACHED_GENERAL_STATS: &str = "pid uptime time version libevent pointer_size \
    rusage_user rusage_system max_connections curr_connections total_connections \
    rejected_connections connection_structures response_obj_oom response_obj_count \
    response_obj_bytes read_buf_count read_buf_bytes read_buf_bytes_free read_buf_oom \
    reserved_fds cmd_get cmd_set cmd_flush cmd_touch cmd_meta get_hits get_misses \
    get_expired get_flushed delete_misses delete_hits incr_misses incr_hits decr_misses \
    decr_hits cas_misses cas_hits cas_badval touch_hits touch_misses store_too_large \
    store_no_memory auth_cmds auth_errors bytes_read bytes_written limit_maxbytes \
    accepting_conns listen_disabled_num time_in_listen_disabled_us threads conn_yields \
    hash_power_level hash_bytes hash_is_expanding slab_reassign_rescues \
    slab_reassign_chunk_rescues slab_reassign_inline_reclaim slab_reassign_busy_items \
    slab_reassign_busy_deletes slab_reassign_busy_nomem slab_reassign_last_busy_status \
    slab_reassign_running slabs_moved lru_crawler_running lru_crawler_starts \
    lru_maintainer_juggles malloc_fails log_worker_dropped log_worker_written \
    log_watcher_skipped log_watcher_sent log_watchers unexpected_napi_ids \
    round_robin_fallback bytes curr_items total_items slab_global_page_pool \
    expired_unfetched evicted_unfetched evicted_active evictions reclaimed \
    crawler_reclaimed crawler_items_checked lrutail_reflocked moves_to_cold moves_to_warm \
    moves_within_lru direct_reclaims lru_bumps_dropped";

#[test]
fn general_stats_are_memcacheds_fields_in_its_order() {
    let names = |args: &[&str]| -> Vec<String> {
        let s = kvcached(args);
        let mut c = s.connect();
        c.stats("").into_iter().map(|(k, _)| k).collect()
    };
    let want: Vec<&str> = MEMCACHED_GENERAL_STATS.split_whitespace().collect();
    assert_eq!(names(&[]), want);
    // As memcached: no mover, maintainer or crawler fields without them (`no_modern`
    // turns all three off, and maxconns_fast: no rejected_connections), and `-o
    // lru_crawler` after it turns the crawler back on.
    let gone = [
        "rejected_connections",
        "slab_reassign_running",
        "slabs_moved",
        "lru_crawler_running",
        "lru_maintainer_juggles",
        "evicted_active",
        "moves_to_cold",
    ];
    let modern_off = names(&["-o", "no_modern"]);
    assert!(gone.iter().all(|g| !modern_off.iter().any(|n| n == g)));
    assert_eq!(modern_off.len(), want.len() - 19);
    let crawler_on = names(&["-o", "no_modern,lru_crawler"]);
    assert!(crawler_on.iter().any(|n| n == "lru_crawler_running"));
    // memcached's hash table as it would be: 2^16 buckets of 8 bytes for a small cache.
    let s = kvcached(&[]);
    let mut c = s.connect();
    assert_eq!(c.stat("hash_power_level").as_deref(), Some("16"));
    assert_eq!(c.stat("hash_bytes").as_deref(), Some("524288"));
}

/// Wait (bounded) until `lru_crawler_running` is 0 again.
fn crawl_done(c: &mut Client) {
    for _ in 0..500 {
        if c.stat("lru_crawler_running").as_deref() == Some("0") {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("the crawl never finished");
}

#[test]
fn lru_crawler_enable_disable_and_crawl_are_memcacheds() {
    let s = kvcached(&["-o", "no_modern,debug_clock"]);
    let mut c = s.connect();
    let setting = |c: &mut Client| {
        c.stats("settings")
            .into_iter()
            .find(|(k, _)| k == "lru_crawler")
            .map(|(_, v)| v)
    };
    assert_eq!(setting(&mut c).as_deref(), Some("no"));
    assert_eq!(
        c.call("lru_crawler crawl 1\r\n"),
        "CLIENT_ERROR lru crawler disabled\r\n"
    );
    for i in 0..10 {
        assert_eq!(c.call(&format!("set t{i} 0 1 2\r\nok\r\n")), "STORED\r\n");
        assert_eq!(c.call(&format!("set i{i} 0 0 2\r\nok\r\n")), "STORED\r\n");
    }
    assert_eq!(c.call("debugtime 5\r\n"), "OK\r\n");
    // Off: nothing reclaims the expired items in the background.
    assert_eq!(c.stat("crawler_reclaimed").as_deref(), Some("0"));
    assert_eq!(c.call("lru_crawler enable\r\n"), "OK\r\n");
    assert_eq!(setting(&mut c).as_deref(), Some("yes"));
    assert_eq!(
        c.call("lru_crawler crawl 0\r\n"),
        "BADCLASS invalid class id\r\n"
    );
    assert_eq!(
        c.call("lru_crawler crawl ,\r\n"),
        "NOTSTARTED no items to crawl\r\n"
    );
    assert_eq!(c.call("lru_crawler crawl 1\r\n"), "OK\r\n");
    crawl_done(&mut c);
    let stat = |stats: &[(String, String)], name: &str| {
        stats
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in {stats:?}"))
    };
    let items = c.stats("items");
    assert_eq!(stat(&items, "items:1:number"), "10");
    assert_eq!(stat(&items, "items:1:crawler_reclaimed"), "10");
    assert_eq!(stat(&items, "items:1:reclaimed"), "10");
    let general = c.stats("");
    assert_eq!(stat(&general, "crawler_reclaimed"), "10");
    assert_eq!(stat(&general, "lru_crawler_starts"), "1");
    // A class that held items stays listed in `stats slabs`, as memcached keeps its pages.
    for i in 0..10 {
        assert_eq!(c.call(&format!("delete i{i}\r\n")), "DELETED\r\n");
    }
    assert_eq!(stat(&c.stats("slabs"), "1:used_chunks"), "0");
    // Pacing is accepted; disable turns it off again.
    assert_eq!(c.call("lru_crawler sleep 100\r\n"), "OK\r\n");
    assert_eq!(c.call("lru_crawler tocrawl 5\r\n"), "OK\r\n");
    assert_eq!(c.call("lru_crawler disable\r\n"), "OK\r\n");
    assert_eq!(setting(&mut c).as_deref(), Some("no"));
    assert_eq!(
        c.call("lru_crawler metadump all\r\n"),
        "CLIENT_ERROR lru crawler disabled\r\n"
    );
}

#[test]
fn a_store_over_an_expired_or_flushed_item_reclaims_it() {
    let s = kvcached(&["-o", "no_lru_crawler,debug_clock"]);
    let mut c = s.connect();
    assert_eq!(c.call("set k 0 1 1\r\na\r\n"), "STORED\r\n");
    assert_eq!(c.call("set f 0 0 1\r\nb\r\n"), "STORED\r\n");
    assert_eq!(c.call("debugtime 3\r\n"), "OK\r\n");
    assert_eq!(c.call("flush_all\r\n"), "OK\r\n");
    assert_eq!(c.stat("reclaimed").as_deref(), Some("0"));
    assert_eq!(c.call("set k 0 0 1\r\nc\r\n"), "STORED\r\n");
    assert_eq!(c.call("set f 0 0 1\r\nd\r\n"), "STORED\r\n");
    assert_eq!(c.stat("reclaimed").as_deref(), Some("2"));
    let items = c.stats("items");
    assert!(
        items.contains(&("items:1:reclaimed".into(), "2".into())),
        "{items:?}"
    );
}

/// One binary request of `opcode` with `key` (no extras, no value).
fn binary_packet(opcode: u8, key: &[u8]) -> Vec<u8> {
    let mut p = vec![0x80, opcode, 0, key.len() as u8, 0, 0, 0, 0];
    p.extend_from_slice(&(key.len() as u32).to_be_bytes());
    p.extend_from_slice(&[0; 12]);
    p.extend_from_slice(key);
    p
}

/// Binary replies up to the one with an empty key and no error (a stat group's end) or an
/// error: (status, key, value) each.
fn binary_stats(c: &mut Client, key: &[u8]) -> Vec<(u16, Vec<u8>, Vec<u8>)> {
    c.send(&binary_packet(0x10, key));
    let mut out = Vec::new();
    loop {
        let h = c.exact(24);
        let klen = u16::from_be_bytes([h[2], h[3]]) as usize;
        let status = u16::from_be_bytes([h[6], h[7]]);
        let total = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let body = c.exact(total);
        let (k, v) = body.split_at(klen.min(total));
        out.push((status, k.to_vec(), v.to_vec()));
        if status != 0 || klen == 0 {
            return out;
        }
    }
}

/// The binary protocol's stat subcommands as memcached 1.6.45's `process_bin_stat` reads
/// them: `detail on|off|dump` (a dump is one `detailed` stat), keys that start with
/// `settings` or `reset`, and "Not found" (status 1) for anything else.
#[test]
fn binary_stat_subcommands_are_memcacheds() {
    let s = kvcached(&[]);
    let mut c = s.connect();
    let end = (0u16, Vec::new(), Vec::new());
    assert_eq!(binary_stats(&mut c, b"detail on"), vec![end.clone()]);
    let mut text = s.connect();
    assert_eq!(text.call("get a:1\r\n"), "END\r\n");
    let dump = binary_stats(&mut c, b"detail dump");
    assert_eq!(
        dump,
        vec![
            (
                0,
                b"detailed".to_vec(),
                b"PREFIX a get 1 hit 0 set 0 del 0\r\nEND\r\n".to_vec()
            ),
            end.clone()
        ]
    );
    assert_eq!(binary_stats(&mut c, b"detail off"), vec![end.clone()]);
    assert_eq!(text.call("get b:1\r\n"), "END\r\n");
    assert_eq!(binary_stats(&mut c, b"detail bogus")[0].0, 1);
    let settings = binary_stats(&mut c, b"settings please");
    assert!(settings.iter().any(|(_, k, _)| k == b"detail_enabled"));
    assert_eq!(binary_stats(&mut c, b"resetting"), vec![end]);
    assert_eq!(binary_stats(&mut c, b"itemsx")[0].0, 1);
    assert_eq!(binary_stats(&mut c, b"det")[0].0, 1);
    let s = kvcached(&["-X"]);
    assert_eq!(binary_stats(&mut s.connect(), b"detail on")[0].0, 1);
}
