//! The flash tier through the real binary (`-o ext_path=PATH:SIZE`, issue 43): a working
//! set many times `-m` stays readable, values come back exactly, multigets mixing memory
//! and flash items are one reply in order, commands on flash items behave as on memory
//! items, a client that leaves with reads under way costs nothing, and `stats` counts
//! under memcached's extstore names. The engine's side is tested in
//! `crates/kvstore/tests/log_flash.rs`.

mod common;

use common::{Client, Kind, Server, TempDir};
use kvproto::binary as bin;

/// A server with `-m 8` and a 256 MiB flash file in a fresh directory (and `extra`); the
/// directory goes when the second value is dropped. The file bypasses the page cache
/// (`ext_direct`), so that every flash read is submitted to the worker's ring (an I/O
/// thread's under epoll; through the page cache, most are done at once from it:
/// `flash_through_the_page_cache`).
fn start(name: &str, extra: &[&str]) -> (Server, TempDir) {
    let dir = TempDir::new(name);
    let ext = dir.ext_path("256m");
    let mut args = vec!["-m", "8", "-U", "0", "-o", &ext, "-o", "ext_direct"];
    args.extend_from_slice(extra);
    (Server::start_verified(Kind::Kvcached, &args), dir)
}

fn value(i: usize) -> String {
    format!("{i}:")
        .chars()
        .chain(std::iter::repeat('x'))
        .take(500)
        .collect()
}

/// `n` items of 500-byte values, written with noreply in batches, then a round trip.
fn load(c: &mut Client, n: usize) {
    load_keys(c, 0..n);
}

/// [`load`] of the keys `keys`.
fn load_keys(c: &mut Client, keys: std::ops::Range<usize>) {
    let mut batch = String::new();
    for i in keys {
        batch.push_str(&format!("set key:{i} 0 0 500 noreply\r\n{}\r\n", value(i)));
        if batch.len() > 1 << 20 {
            c.send(batch.as_bytes());
            batch.clear();
        }
    }
    c.send(batch.as_bytes());
    assert_eq!(c.call("version\r\n").split(' ').next(), Some("VERSION"));
}

/// The reply to a get-type command (up to its `END`).
fn get(c: &mut Client, cmd: &str) -> String {
    c.send(cmd.as_bytes());
    c.until("END\r\n")
}

fn stat(c: &mut Client, name: &str) -> u64 {
    c.stat(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no stat {name}"))
}

/// `get_extstore` and `flash_tag_misreads`: flash reads, and those of these that were of
/// another key's record whose index tag matched (the index's per-process random hash seed
/// makes that happen now and then, to any key).
fn flash_reads(c: &mut Client) -> (u64, u64) {
    (stat(c, "get_extstore"), stat(c, "flash_tag_misreads"))
}

/// Flash reads between two `flash_reads` that found the key they were done for.
fn found_on_flash(before: (u64, u64), after: (u64, u64)) -> u64 {
    let (reads, misreads) = (after.0 - before.0, after.1 - before.1);
    assert!(misreads <= reads, "{before:?} -> {after:?}");
    reads - misreads
}

/// Ten times the memory written: every item is still there, read back exactly, one key
/// at a time and in multigets that mix memory and flash; `stats` says where they are.
#[test]
fn a_working_set_beyond_memory_is_read_back_from_flash() {
    beyond_memory("flash-beyond", &[]);
}

/// The same under the epoll runtime (the default is io_uring where the kernel allows it).
#[test]
fn a_working_set_beyond_memory_is_read_back_from_flash_under_epoll() {
    beyond_memory("flash-beyond-epoll", &["-o", "io=epoll"]);
}

fn beyond_memory(name: &str, extra: &[&str]) {
    let (server, _dir) = start(name, extra);
    let mut c = server.connect();
    let n = 160_000; // 80 MB of values
    load(&mut c, n);
    assert_eq!(stat(&mut c, "curr_items"), n as u64);
    assert_eq!(stat(&mut c, "evictions"), 0);
    assert!(stat(&mut c, "extstore_objects_used") > n as u64 / 2);
    for i in (0..n).step_by(37) {
        let reply = get(&mut c, &format!("get key:{i}\r\n"));
        assert_eq!(
            reply,
            format!("VALUE key:{i} 0 500\r\n{}\r\nEND\r\n", value(i)),
            "key {i}"
        );
    }
    // A multiget over old (flash) and new (memory) keys, answered in order.
    let keys: Vec<usize> = (0..n).step_by(n / 40).chain([n - 1, n - 2, 3]).collect();
    let line: Vec<String> = keys.iter().map(|i| format!("key:{i}")).collect();
    c.send(format!("get {}\r\n", line.join(" ")).as_bytes());
    let reply = c.until("END\r\n");
    let want: String = keys
        .iter()
        .map(|&i| format!("VALUE key:{i} 0 500\r\n{}\r\n", value(i)))
        .chain(["END\r\n".to_string()])
        .collect();
    assert_eq!(reply, want);
    assert!(stat(&mut c, "get_extstore") > 0);
    assert_eq!(stat(&mut c, "get_misses"), 0);
    assert_eq!(stat(&mut c, "miss_from_extstore"), 0);
    // Under io_uring the worker reads through its ring, under epoll through the I/O
    // threads (reads the page cache answered at once need neither).
    let handed = stat(&mut c, "get_extstore") - stat(&mut c, "flash_cached_reads");
    let ring = stat(&mut c, "flash_ring_reads");
    let io = c.stats("settings").into_iter().find(|(k, _)| k == "io");
    match io.map(|(_, v)| v).as_deref() {
        Some("uring") if handed > 0 => assert!(ring > 0, "{handed} reads, none in the ring"),
        Some("epoll") => assert_eq!(ring, 0),
        _ => {}
    }
}

/// gets, delete, overwrite, append, incr, touch and flush_all on items that are on flash.
#[test]
fn commands_on_flash_items() {
    let (server, _dir) = start("flash-commands", &[]);
    let mut c = server.connect();
    load(&mut c, 100_000);
    assert!(stat(&mut c, "extstore_objects_used") > 50_000);
    // The first keys are on flash by now.
    let gets = get(&mut c, "gets key:1\r\n");
    let cas: u64 = gets
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(4))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{gets}"));
    assert_eq!(
        c.call(&format!("cas key:1 0 0 3 {}\r\nnew\r\n", cas + 1)),
        "EXISTS\r\n"
    );
    assert_eq!(
        c.call(&format!("cas key:1 0 0 3 {cas}\r\nnew\r\n")),
        "STORED\r\n"
    );
    assert_eq!(
        get(&mut c, "get key:1\r\n"),
        "VALUE key:1 0 3\r\nnew\r\nEND\r\n"
    );
    assert_eq!(c.call("delete key:2\r\n"), "DELETED\r\n");
    assert_eq!(get(&mut c, "get key:2\r\n"), "END\r\n");
    assert_eq!(c.call("set key:3 5 0 2\r\nhi\r\n"), "STORED\r\n");
    assert_eq!(
        get(&mut c, "get key:3\r\n"),
        "VALUE key:3 5 2\r\nhi\r\nEND\r\n"
    );
    assert_eq!(c.call("append key:4 0 0 1\r\n!\r\n"), "STORED\r\n");
    assert_eq!(
        get(&mut c, "get key:4\r\n"),
        format!("VALUE key:4 0 501\r\n{}!\r\nEND\r\n", value(4))
    );
    assert_eq!(c.call("add key:5 0 0 1\r\n?\r\n"), "NOT_STORED\r\n");
    assert_eq!(c.call("touch key:6 1000\r\n"), "TOUCHED\r\n");
    assert_eq!(
        get(&mut c, "get key:6\r\n"),
        format!("VALUE key:6 0 500\r\n{}\r\nEND\r\n", value(6))
    );
    assert_eq!(c.call("set num 0 0 2\r\n41\r\n"), "STORED\r\n");
    assert!(c.call("incr key:7 1\r\n").starts_with("CLIENT_ERROR"));
    assert_eq!(c.call("flush_all\r\n"), "OK\r\n");
    for i in [8, 9, 50_000, 99_999] {
        assert_eq!(
            get(&mut c, &format!("get key:{i}\r\n")),
            "END\r\n",
            "key {i}"
        );
    }
}

/// Clients that send gets for flash items and leave at once (or leave half a pipeline):
/// the reads finish for nobody, counted, and the server goes on serving others.
#[test]
fn clients_leaving_with_reads_under_way_cost_nothing() {
    let (server, _dir) = start("flash-leave", &[]);
    let mut c = server.connect();
    load(&mut c, 100_000);
    for round in 0..20usize {
        let mut gone = server.connect();
        let keys: Vec<String> = (0..50).map(|k| format!("key:{}", round * 50 + k)).collect();
        gone.send(format!("get {}\r\nget key:1", keys.join(" ")).as_bytes());
        drop(gone);
    }
    // The others are served, with every value exact.
    for i in (0..2000).step_by(97) {
        assert_eq!(
            get(&mut c, &format!("get key:{i}\r\n")),
            format!("VALUE key:{i} 0 500\r\n{}\r\nEND\r\n", value(i)),
            "key {i}"
        );
    }
    // And counts what it read for nobody (how many depends on when each close was seen).
    c.stat("get_aborted_extstore").expect("counted");
}

/// Over UDP (which memcached refuses with extstore), gets of flash items are answered
/// exactly, one key and several per datagram, text and binary, mixing memory and flash
/// items; the datagram waits for its reads off the worker (none done inline) under either
/// runtime.
#[test]
fn udp_gets_read_flash_items() {
    for io in ["auto", "epoll"] {
        let dir = TempDir::new(&format!("flash-udp-{io}"));
        let ext = dir.ext_path("256m");
        let io_opt = format!("io={io}");
        let args = ["-m", "8", "-o", &ext, "-o", "ext_direct", "-o", &io_opt];
        let (server, port) = Server::start_udp(Kind::Kvcached, &args);
        let mut c = server.connect();
        let n = 100_000;
        load(&mut c, n);
        assert!(stat(&mut c, "extstore_objects_used") > n as u64 / 2);
        let sock = std::net::UdpSocket::bind((std::net::Ipv4Addr::LOCALHOST, 0)).expect("bind");
        sock.set_read_timeout(Some(common::TIMEOUT))
            .expect("timeout");
        let ask = |id: u16, keys: &[usize]| -> String {
            let line: Vec<String> = keys.iter().map(|i| format!("key:{i}")).collect();
            let mut d = Vec::new();
            for v in [id, 0, 1, 0u16] {
                d.extend_from_slice(&v.to_be_bytes());
            }
            d.extend_from_slice(format!("get {}\r\n", line.join(" ")).as_bytes());
            sock.send_to(&d, (std::net::Ipv4Addr::LOCALHOST, port))
                .expect("send");
            // One message per key, END with the last; each split into datagrams.
            let mut reply = Vec::new();
            let mut buf = [0u8; 2048];
            while !reply.ends_with(b"END\r\n") {
                let got = sock.recv(&mut buf).expect("a reply datagram");
                assert_eq!(buf[..2], id.to_be_bytes(), "a reply to another request");
                reply.extend_from_slice(&buf[8..got]);
            }
            String::from_utf8(reply).expect("text")
        };
        let want = |keys: &[usize]| -> String {
            keys.iter()
                .map(|&i| format!("VALUE key:{i} 0 500\r\n{}\r\n", value(i)))
                .chain(["END\r\n".to_string()])
                .collect()
        };
        for (id, i) in (0..n).step_by(211).enumerate() {
            assert_eq!(ask(id as u16, &[i]), want(&[i]), "{io}: key {i}");
        }
        let keys = [7, n - 1, 1_000, 20_000, n - 2, 33_333];
        assert_eq!(ask(9_999, &keys), want(&keys), "{io}: a multiget");
        // Binary: a GETKQ per key and a NOOP, in one datagram; the hits' values, in order.
        let mut d = Vec::new();
        for v in [7_777u16, 0, 1, 0] {
            d.extend_from_slice(&v.to_be_bytes());
        }
        let bin_keys = [11, n - 3, 40_001, 5_555];
        for (opaque, i) in bin_keys.iter().enumerate() {
            let key = format!("key:{i}");
            bin::write_request(&mut d, 0x0d, opaque as u32, 0, &[], key.as_bytes(), &[]);
        }
        bin::write_request(&mut d, 0x0a, 99, 0, &[], &[], &[]);
        sock.send_to(&d, (std::net::Ipv4Addr::LOCALHOST, port))
            .expect("send");
        let mut reply = Vec::new();
        let mut buf = [0u8; 2048];
        let values = loop {
            let got = sock.recv(&mut buf).expect("a reply datagram");
            assert_eq!(
                buf[..2],
                7_777u16.to_be_bytes(),
                "a reply to another request"
            );
            reply.extend_from_slice(&buf[8..got]);
            let mut rest = &reply[..];
            let mut values = Vec::new();
            while let bin::ResponseParse::Response(r, used) = bin::parse_response(rest) {
                values.push((r.opcode, r.value.to_vec()));
                rest = &rest[used..];
            }
            if values.last().is_some_and(|(op, _)| *op == 0x0a) {
                break values;
            }
        };
        let want_bin: Vec<(u8, Vec<u8>)> = bin_keys
            .iter()
            .map(|&i| (0x0d, value(i).into_bytes()))
            .chain([(0x0a, Vec::new())])
            .collect();
        assert_eq!(values, want_bin, "{io}: binary gets");
        assert!(stat(&mut c, "get_extstore") > 0, "{io}");
        assert_eq!(
            stat(&mut c, "flash_inline_reads"),
            0,
            "{io}: reads on the worker"
        );
        assert_eq!(stat(&mut c, "miss_from_extstore"), 0, "{io}");
        assert_eq!(stat(&mut c, "get_misses"), 0, "{io}");
    }
}

/// A flash file that cannot be made stops the start with a clear message.
#[test]
fn a_flash_path_that_cannot_be_made_is_refused_at_start() {
    let err = Server::try_start(
        Kind::Kvcached,
        &[
            "-U",
            "0",
            "-o",
            "ext_path=/nonexistent-dir/kvcached/ext:64m",
        ],
        &[],
    )
    .err()
    .unwrap_or_default();
    assert!(err.contains("ext_path"), "{err}");
}

/// Meta `mg` and binary gets find flash items too (read by the I/O threads, the request
/// run again), in pipelines that mix memory and flash items.
#[test]
fn meta_and_binary_gets_read_flash_items() {
    let (server, _dir) = start("flash-meta-binary", &[]);
    let mut c = server.connect();
    let n = 100_000;
    load(&mut c, n);
    // A pipeline of mg: flash, memory, absent, flash; then mn.
    c.send(b"mg key:10 v f k\r\nmg key:99999 v\r\nmg nokey v\r\nmg key:11 s\r\nmn\r\n");
    let reply = c.until("MN\r\n");
    let want = format!(
        "VA 500 f0 kkey:10\r\n{}\r\nVA 500\r\n{}\r\nEN\r\nHD s500\r\nMN\r\n",
        value(10),
        value(99_999)
    );
    assert_eq!(reply, want);
    // Binary GETK for a flash item and a memory item, then NOOP (on a connection of its
    // own: a connection's first byte decides its protocol).
    let mut c = server.connect();
    let request = |opcode: u8, key: &[u8], opaque: u32| {
        let mut r = vec![0x80, opcode];
        r.extend_from_slice(&(key.len() as u16).to_be_bytes());
        r.extend_from_slice(&[0, 0, 0, 0]);
        r.extend_from_slice(&(key.len() as u32).to_be_bytes());
        r.extend_from_slice(&opaque.to_be_bytes());
        r.extend_from_slice(&[0; 8]);
        r.extend_from_slice(key);
        r
    };
    let mut batch = request(0x0c, b"key:12", 1);
    batch.extend(request(0x0c, b"key:99998", 2));
    batch.extend(request(0x0a, b"", 3));
    c.send(&batch);
    for (key, i, opaque) in [("key:12", 12usize, 1u32), ("key:99998", 99_998, 2)] {
        let head = c.exact(24);
        assert_eq!((head[0], head[1]), (0x81, 0x0c), "{head:?}");
        assert_eq!(&head[6..8], &[0, 0], "status of {key}");
        let body = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
        assert_eq!(
            u32::from_be_bytes([head[12], head[13], head[14], head[15]]),
            opaque
        );
        let body = c.exact(body);
        assert_eq!(&body[4..4 + key.len()], key.as_bytes());
        assert_eq!(&body[4 + key.len()..], value(i).as_bytes(), "{key}");
    }
    let noop = c.exact(24);
    assert_eq!((noop[0], noop[1]), (0x81, 0x0a));
    // Each of the three flash records was read from flash once at least (a record read
    // earlier for another key's lookup, whose tag matched, may have been kept and served
    // without a new read: so the count in all, not the count since the load).
    let mut t = server.connect();
    assert!(stat(&mut t, "get_extstore") >= 3);
}

/// A `watch fetchers` watcher sees one `item_get` line for a get of a flash item (the
/// lookup that waits for the read logs nothing; the one that answers does).
#[test]
fn a_watcher_sees_one_line_per_get_of_a_flash_item() {
    let (server, _dir) = start("flash-watch", &[]);
    let mut c = server.connect();
    load(&mut c, 100_000);
    let mut w = server.connect();
    assert_eq!(w.call("watch fetchers\r\n"), "OK\r\n");
    assert_eq!(
        get(&mut c, "get key:13\r\n"),
        format!("VALUE key:13 0 500\r\n{}\r\nEND\r\n", value(13))
    );
    assert_eq!(
        get(&mut c, "get key:14 key:99999\r\n")
            .matches("VALUE")
            .count(),
        2
    );
    let first = w.line();
    assert!(
        first.contains("key=key%3A13") && first.contains("status=found"),
        "{first}"
    );
    let second = w.line();
    assert!(
        second.contains("key=key%3A14") && second.contains("status=found"),
        "{second}"
    );
    let third = w.line();
    assert!(third.contains("key=key%3A99999"), "{third}");
}

/// Writes over items on flash (text, meta and binary) wait for an I/O thread to read the
/// old item instead of reading it on the worker: with the background sweep off (it reads
/// flash on its own thread), no lookup reads flash itself.
#[test]
fn writes_over_flash_items_do_not_read_on_the_worker() {
    let (server, _dir) = start("flash-writes", &["-o", "no_lru_crawler"]);
    let mut c = server.connect();
    load(&mut c, 100_000);
    assert_eq!(c.call("set key:20 0 0 3\r\nnew\r\n"), "STORED\r\n");
    assert_eq!(c.call("append key:21 0 0 1\r\n!\r\n"), "STORED\r\n");
    assert_eq!(c.call("delete key:22\r\n"), "DELETED\r\n");
    assert!(c.call("incr key:23 1\r\n").starts_with("CLIENT_ERROR"));
    assert_eq!(c.call("touch key:24 100\r\n"), "TOUCHED\r\n");
    assert_eq!(c.call("ms key:25 2\r\nhi\r\n"), "HD\r\n");
    assert_eq!(c.call("md key:26\r\n"), "HD\r\n");
    assert_eq!(c.call("mg key:27 T100 s\r\n"), "HD s500\r\n");
    assert_eq!(
        get(&mut c, "get key:20 key:21 key:22\r\n")
            .matches("VALUE")
            .count(),
        2
    );
    assert_eq!(
        get(&mut c, "get key:25\r\n"),
        "VALUE key:25 0 2\r\nhi\r\nEND\r\n"
    );
    assert_eq!(
        get(&mut c, "gat 100 key:28 key:29 key:99990\r\n")
            .matches("VALUE")
            .count(),
        3
    );
    assert_eq!(stat(&mut c, "flash_inline_reads"), 0);
    assert!(stat(&mut c, "get_extstore") >= 8);
}

/// The flash file removed under a running server: the open descriptor keeps it, every item
/// is still read back. Then truncated to nothing: what was on flash can no longer be read,
/// and is a miss, counted, never wrong bytes; the server goes on serving and writing.
#[test]
fn a_flash_file_removed_or_truncated_under_the_server_serves_nothing_wrong() {
    let (server, dir) = start("flash-faults", &[]);
    let mut c = server.connect();
    let n = 100_000;
    load(&mut c, n);
    let file = dir.0.join("ext");
    // Keep a handle to truncate it through after the name is gone.
    let handle = std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open the flash file");
    std::fs::remove_file(&file).expect("remove the flash file");
    for i in (0..n / 2).step_by(101) {
        assert_eq!(
            get(&mut c, &format!("get key:{i}\r\n")),
            format!("VALUE key:{i} 0 500\r\n{}\r\nEND\r\n", value(i)),
            "key {i} after the file was removed"
        );
    }
    handle.set_len(0).expect("truncate the flash file");
    let mut misses = 0;
    // Other keys than above (records read lately are kept for re-runs).
    for i in (50..n / 2).step_by(101) {
        let reply = get(&mut c, &format!("get key:{i}\r\n"));
        if reply == "END\r\n" {
            misses += 1;
        } else {
            assert_eq!(
                reply,
                format!("VALUE key:{i} 0 500\r\n{}\r\nEND\r\n", value(i)),
                "key {i} after the file was truncated"
            );
        }
    }
    assert!(misses > 0, "the truncated items read as misses");
    assert!(stat(&mut c, "miss_from_extstore") > 0);
    // Writing and reading go on.
    load(&mut c, 20_000);
    assert_eq!(
        get(&mut c, "get key:19999\r\n"),
        format!("VALUE key:19999 0 500\r\n{}\r\nEND\r\n", value(19_999))
    );
}

/// A flash file that cannot be allocated (no room: here the file size limit, as a full
/// disk would) stops the start with a message naming it; with `-o ext_ignore_bad_file`
/// the server starts and serves from memory alone, and says so.
#[test]
fn a_flash_file_without_room_stops_the_start_or_is_done_without() {
    let dir = TempDir::new("flash-no-room");
    let ext = dir.ext_path("64m");
    let args = ["-m", "8", "-U", "0", "-o", &ext];
    let err = Server::try_start_with_file_limit(Kind::Kvcached, &args, 1 << 20)
        .err()
        .unwrap_or_default();
    assert!(
        err.contains("ext_path") && err.contains("allocate"),
        "{err}"
    );

    let args = [
        "-m",
        "8",
        "-U",
        "0",
        "-o",
        &ext,
        "-o",
        "ext_ignore_bad_file",
    ];
    let server = Server::try_start_with_file_limit(Kind::Kvcached, &args, 1 << 20)
        .unwrap_or_else(|e| panic!("did not start: {e}"));
    assert!(server.wait_stderr("serving from memory alone", 1));
    let mut c = server.connect();
    load(&mut c, 40_000);
    assert!(c.stat("extstore_objects_used").is_none(), "no tier");
    assert!(stat(&mut c, "evictions") > 0, "evicted as without a tier");
    assert_eq!(
        get(&mut c, "get key:39999\r\n"),
        format!("VALUE key:39999 0 500\r\n{}\r\nEND\r\n", value(39_999))
    );
    let settings = get(&mut c, "stats settings\r\n");
    assert!(!settings.contains("ext_"), "{settings}");
}

/// Flash writes that fail under a running server (past the file size limit, as on a full
/// or failing device): every write is still stored, nothing wrong is read, the tier goes
/// offline with a message; once writes work again a probe brings it back, said too, and
/// items go to flash again.
#[test]
fn flash_write_errors_under_the_server_and_a_probe_brings_the_tier_back() {
    let (server, _dir) = start("flash-write-errors", &[]);
    let mut c = server.connect();
    load_keys(&mut c, 0..40_000);
    let before = stat(&mut c, "extstore_objects_used");
    assert!(before > 20_000, "{before} on flash");

    server.set_file_limit(4096);
    let mut end = 40_000;
    while stat(&mut c, "flash_offline") == 0 && end < 400_000 {
        load_keys(&mut c, end..end + 20_000);
        end += 20_000;
    }
    assert_eq!(stat(&mut c, "flash_offline"), 1, "offline after {end} keys");
    assert!(stat(&mut c, "flash_write_failures") > 0);
    assert!(server.wait_stderr("flash tier offline", 1));
    load_keys(&mut c, end..end + 20_000);
    end += 20_000;
    let mut hits = 0;
    for i in (0..end).step_by(97) {
        let reply = get(&mut c, &format!("get key:{i}\r\n"));
        if reply != "END\r\n" {
            assert_eq!(
                reply,
                format!("VALUE key:{i} 0 500\r\n{}\r\nEND\r\n", value(i)),
                "key {i} while flash writes fail"
            );
            hits += 1;
        }
    }
    assert!(hits > 0);
    assert_eq!(
        get(&mut c, &format!("get key:{}\r\n", end - 1)),
        format!(
            "VALUE key:{0} 0 500\r\n{1}\r\nEND\r\n",
            end - 1,
            value(end - 1)
        ),
        "the newest item is in memory"
    );
    assert!(stat(&mut c, "evictions") > 0, "evicted as without a tier");

    // The device works again: within a bounded number of writes a probe succeeds.
    server.set_file_limit(libc::RLIM_INFINITY);
    let resumed = end;
    while stat(&mut c, "flash_offline") == 1 && end < resumed + 800_000 {
        load_keys(&mut c, end..end + 20_000);
        end += 20_000;
    }
    assert_eq!(
        stat(&mut c, "flash_offline"),
        0,
        "still offline at {end} keys"
    );
    assert_eq!(stat(&mut c, "flash_recoveries"), 1);
    assert!(server.wait_stderr("flash tier back online", 1));
    let written = stat(&mut c, "extstore_objects_written");
    load_keys(&mut c, end..end + 40_000);
    assert!(stat(&mut c, "extstore_objects_written") > written);
    assert_eq!(
        get(&mut c, &format!("get key:{end}\r\n")),
        format!("VALUE key:{end} 0 500\r\n{}\r\nEND\r\n", value(end)),
        "read back from flash"
    );
}

/// A file at the flash path holding something else (an old tier, garbage) is made
/// afresh: the server starts and serves; `stats extstore` lists the pages as memcached
/// lists extstore's, and `stats settings` the ext_* settings that apply.
#[test]
fn a_damaged_file_at_start_is_made_afresh_and_stats_extstore_lists_pages() {
    let dir = TempDir::new("flash-damaged");
    std::fs::write(dir.0.join("ext"), vec![0xa5u8; 3 << 20]).expect("write garbage");
    let ext = dir.ext_path("64m");
    let server = Server::start_verified(Kind::Kvcached, &["-m", "8", "-U", "0", "-o", &ext]);
    let mut c = server.connect();
    load(&mut c, 60_000);
    assert_eq!(
        get(&mut c, "get key:3\r\n"),
        format!("VALUE key:3 0 500\r\n{}\r\nEND\r\n", value(3))
    );
    let pages = get(&mut c, "stats extstore\r\n");
    let lines: Vec<&str> = pages.lines().collect();
    assert_eq!(lines.last(), Some(&"END"));
    assert_eq!((lines.len() - 1) % 4, 0, "four lines a page");
    assert!(lines.len() > 4, "{pages}");
    for (i, page) in lines[..lines.len() - 1].chunks(4).enumerate() {
        let names: Vec<&str> = page.iter().filter_map(|l| l.split(' ').nth(1)).collect();
        assert_eq!(
            names,
            [
                format!("{i}:version"),
                format!("{i}:bytes"),
                format!("{i}:bucket"),
                format!("{i}:free_bucket")
            ]
        );
    }
    let used: u64 = lines
        .iter()
        .filter(|l| l.contains(":bytes "))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    // (Writes still finishing may bind more pages between this and `stats`: no equality.)
    assert!(
        used > 0 && used <= stat(&mut c, "extstore_limit_maxbytes"),
        "{used}"
    );
    let settings = get(&mut c, "stats settings\r\n");
    assert!(
        settings.contains("STAT ext_wbuf_size 4194304\r\n"),
        "{settings}"
    );
    assert!(settings.contains("STAT ext_threads 1\r\n"), "{settings}");
    assert!(settings.contains("STAT ext_item_size 0\r\n"), "{settings}");
    assert!(
        settings.contains(
            "STAT ext_compact_under 0\r\nSTAT ext_drop_unread no\r\nSTAT ext_max_frag 1.00\r\n"
        ),
        "{settings}"
    );
}

/// `ext_item_size=N`: items shorter than N bytes are evicted when memory is full, as
/// without a tier (memcached keeps items under its `ext_item_size` in RAM); the default,
/// 0, sends them to flash.
#[test]
fn items_under_ext_item_size_stay_off_flash() {
    let (server, _dir) = start("flash-item-size", &["-o", "ext_item_size=1024"]);
    let mut c = server.connect();
    load(&mut c, 60_000);
    assert_eq!(get(&mut c, "get key:5\r\n"), "END\r\n", "evicted");
    assert!(stat(&mut c, "evictions") > 0);
    assert_eq!(stat(&mut c, "extstore_objects_written"), 0);
    let settings = get(&mut c, "stats settings\r\n");
    assert!(
        settings.contains("STAT ext_item_size 1024\r\n"),
        "{settings}"
    );

    // memcached's `extstore item_size N` changes it while the server runs: back to 0,
    // items of every size go to flash.
    assert_eq!(c.call("extstore item_size 0\r\n"), "OK\r\n");
    assert_eq!(c.call("extstore recache_rate 7\r\n"), "OK\r\n");
    assert_eq!(c.call("extstore compact_under 6\r\n"), "OK\r\n");
    assert_eq!(c.call("extstore drop_unread 1\r\n"), "OK\r\n");
    assert_eq!(c.call("extstore max_frag 0.75\r\n"), "OK\r\n");
    assert_eq!(
        c.call("extstore item_age 10\r\n"),
        "OK\r\n",
        "accepted, unused"
    );
    assert_eq!(c.call("extstore item_size x\r\n"), "ERROR\r\n");
    assert_eq!(c.call("extstore page_size 1\r\n"), "ERROR\r\n");
    c.send(b"extstore item_size 4096 noreply\r\nextstore item_size 0 noreply\r\n");
    let settings = get(&mut c, "stats settings\r\n");
    for line in [
        "STAT ext_item_size 0\r\n",
        "STAT ext_recache_rate 7\r\n",
        "STAT ext_compact_under 6\r\n",
        "STAT ext_drop_unread yes\r\n",
        "STAT ext_max_frag 0.75\r\n",
    ] {
        assert!(settings.contains(line), "{line}: {settings}");
    }
    // Garbage values get memcached's ERROR and change nothing.
    for bad in [
        "extstore compact_under -1\r\n",
        "extstore drop_unread x\r\n",
        "extstore max_frag 0.5x\r\n",
        "extstore compact_under\r\n",
    ] {
        assert_eq!(c.call(bad), "ERROR\r\n", "{bad:?}");
    }
    let after = get(&mut c, "stats settings\r\n");
    for line in [
        "STAT ext_compact_under 6\r\n",
        "STAT ext_drop_unread yes\r\n",
        "STAT ext_max_frag 0.75\r\n",
    ] {
        assert!(after.contains(line), "{line}: {after}");
    }
    load_keys(&mut c, 60_000..120_000);
    assert!(stat(&mut c, "extstore_objects_written") > 0);
    assert!(get(&mut c, "get key:60005\r\n").starts_with("VALUE key:60005 "));
}

/// A flash item read again is copied back to memory (`recache_from_extstore`): later gets
/// need no flash read. `ext_recache_rate=0` turns it off.
#[test]
fn flash_items_read_again_are_copied_back_to_memory() {
    for (rate, copied) in [("1", true), ("0", false)] {
        let recache = format!("ext_recache_rate={rate}");
        let (server, _dir) = start("flash-recache", &["-o", &recache]);
        let mut c = server.connect();
        load(&mut c, 60_000);
        let want = format!("VALUE key:5 0 500\r\n{}\r\nEND\r\n", value(5));
        let before = flash_reads(&mut c);
        assert_eq!(get(&mut c, "get key:5\r\n"), want);
        assert_eq!(found_on_flash(before, flash_reads(&mut c)), 1, "on flash");
        for _ in 0..3 {
            assert_eq!(get(&mut c, "get key:5\r\n"), want);
        }
        assert_eq!(stat(&mut c, "recache_from_extstore"), u64::from(copied));
        // Read 4,200 other flash items, so that the records read lately are no longer kept
        // for re-runs (at most 4,096 are).
        // One key a request: a request that waited three times reads on the worker, and
        // keeps nothing.
        for first in (100..4_300).step_by(100) {
            let gets: String = (first..first + 100)
                .map(|i| format!("get key:{i}\r\n"))
                .collect();
            c.send(gets.as_bytes());
            for _ in 0..100 {
                assert!(c.until("END\r\n").starts_with("VALUE "));
            }
        }
        let before = flash_reads(&mut c);
        assert_eq!(get(&mut c, "get key:5\r\n"), want);
        let read_again = found_on_flash(before, flash_reads(&mut c)) > 0;
        assert_eq!(read_again, !copied, "rate {rate}");
    }
}

/// Through the page cache (the default, as memcached's extstore), a get whose flash bytes
/// the cache holds reads them at once on the worker (`flash_cached_reads`), without a
/// hand-off; values come back exactly, and writes over such items still read nothing on
/// the worker by themselves.
#[test]
fn flash_through_the_page_cache() {
    let dir = TempDir::new("flash-page-cache");
    let ext = dir.ext_path("256m");
    let server = Server::start_verified(Kind::Kvcached, &["-m", "8", "-U", "0", "-o", &ext]);
    let mut c = server.connect();
    load(&mut c, 60_000);
    for i in (0..30_000).step_by(53) {
        assert_eq!(
            get(&mut c, &format!("get key:{i}\r\n")),
            format!("VALUE key:{i} 0 500\r\n{}\r\nEND\r\n", value(i)),
            "key {i}"
        );
    }
    let cached = stat(&mut c, "flash_cached_reads");
    assert!(cached > 0, "pages just written are in the page cache");
    assert!(stat(&mut c, "get_extstore") >= cached);
    for i in (1..30_000).step_by(101) {
        assert_eq!(
            c.call(&format!("set key:{i} 0 0 3\r\nnew\r\n")),
            "STORED\r\n"
        );
    }
    assert_eq!(stat(&mut c, "flash_inline_reads"), 0);
    let settings = get(&mut c, "stats settings\r\n");
    assert!(settings.contains("STAT ext_direct no\r\n"), "{settings}");
}

/// A warm restart keeps the flash tier (memcached starts empty with `-e` and `ext_path`): stopped
/// with SIGTERM, the server saves a snapshot naming its flash pages; started again with the
/// same options, it serves every item from where it was, flash items included, with
/// deletes and overwrites kept, and says so on stderr (`-v`).
#[test]
fn a_warm_restart_keeps_the_flash_tier() {
    let dir = TempDir::new("flash-warm");
    let ext = dir.ext_path("256m");
    let snapshot = dir.0.join("snapshot");
    let snapshot_arg = snapshot.display().to_string();
    let args = ["-m", "8", "-U", "0", "-v", "-o", &ext, "-e", &snapshot_arg];
    let mut first = Server::start_verified(Kind::Kvcached, &args);
    let mut c = first.connect();
    let n = 100_000;
    load(&mut c, n);
    assert_eq!(c.call("delete key:5\r\n"), "DELETED\r\n");
    assert_eq!(c.call("set key:6 3 0 3\r\nnew\r\n"), "STORED\r\n");
    let on_flash = stat(&mut c, "extstore_objects_used");
    assert!(on_flash > n as u64 / 2, "{on_flash} on flash");
    let items = stat(&mut c, "curr_items");
    let gets = get(&mut c, "gets key:1\r\n");
    drop(c);
    let status = first.terminate().expect("the server exits");
    assert!(status.success(), "{status}: {}", first.stderr());
    assert!(snapshot.exists(), "no snapshot: {}", first.stderr());

    let second = Server::start_verified(Kind::Kvcached, &args);
    assert!(
        second.wait_stderr("flash pages, kept", 1),
        "{}",
        second.stderr_so_far()
    );
    let mut c = second.connect();
    assert_eq!(stat(&mut c, "curr_items"), items);
    // At least: writes under way when it was asked were bound before the save.
    assert!(stat(&mut c, "extstore_objects_used") >= on_flash);
    assert_eq!(get(&mut c, "gets key:1\r\n"), gets, "value, flags and CAS");
    assert_eq!(get(&mut c, "get key:5\r\n"), "END\r\n");
    assert_eq!(
        get(&mut c, "get key:6\r\n"),
        "VALUE key:6 3 3\r\nnew\r\nEND\r\n"
    );
    for i in (7..n).step_by(31) {
        assert_eq!(
            get(&mut c, &format!("get key:{i}\r\n")),
            format!("VALUE key:{i} 0 500\r\n{}\r\nEND\r\n", value(i)),
            "key {i}"
        );
    }
    assert!(stat(&mut c, "get_extstore") > 0);
    assert_eq!(stat(&mut c, "miss_from_extstore"), 0);
    assert!(!snapshot.exists(), "the snapshot is used once");

    // Saved again, and started with a flash file of another size: made afresh, its items
    // lost (said on stderr), what was in memory served exactly.
    drop(c);
    let mut second = second;
    let status = second.terminate().expect("the server exits");
    assert!(status.success(), "{status}: {}", second.stderr());
    let other = dir.ext_path("128m");
    let mut args = args.to_vec();
    args[6] = &other;
    let third = Server::start_verified(Kind::Kvcached, &args);
    assert!(
        third.wait_stderr("flash pages are lost", 1),
        "{}",
        third.stderr_so_far()
    );
    let mut c = third.connect();
    let left = stat(&mut c, "curr_items");
    assert!(left > 0 && left < items - on_flash / 2, "{left} of {items}");
    assert_eq!(stat(&mut c, "extstore_objects_used"), 0);
    let mut hits = 0;
    for i in (7..n).step_by(4) {
        let reply = get(&mut c, &format!("get key:{i}\r\n"));
        if reply != "END\r\n" {
            assert_eq!(
                reply,
                format!("VALUE key:{i} 0 500\r\n{}\r\nEND\r\n", value(i)),
                "key {i}"
            );
            hits += 1;
        }
    }
    assert!(hits > 0 && hits <= left, "{hits} hits, {left} items");
}

/// A replica of a master with a flash tier gets its flash items in the full sync (memcached
/// has no replication), and the master keeps sending cold items to flash while the
/// replica follows.
#[test]
fn a_replica_gets_the_flash_items_and_the_master_keeps_its_tier() {
    use common::repl::{dump, poll_until, SYNC};
    let (master, _dir) = start("flash-replica", &[]);
    let mut m = master.connect();
    let n = 100_000;
    load(&mut m, n);
    assert!(stat(&mut m, "extstore_objects_used") > n as u64 / 2);
    let sample = |keys: std::ops::Range<usize>| -> Vec<String> {
        keys.step_by(9).map(|i| format!("key:{i}")).collect()
    };
    let old = sample(0..n);
    let want = dump(&mut m, &old);
    assert_eq!(want.len(), old.len(), "the master lost items");

    let target = format!("127.0.0.1:{}", master.port);
    let replica = Server::start_verified(
        Kind::Kvcached,
        &["-m", "200", "-U", "0", "--replica-of", &target],
    );
    let mut r = replica.connect();
    poll_until("the replica to hold the flash items", SYNC, || {
        let got = dump(&mut r, &old);
        if got == want {
            Ok(())
        } else {
            Err(format!("{} of {} keys alike", got.len(), want.len()))
        }
    });

    // Attached, the master still writes cold items to flash.
    let written = stat(&mut m, "extstore_objects_written");
    load_keys(&mut m, n..2 * n);
    assert!(
        stat(&mut m, "extstore_objects_written") > written + n as u64 / 2,
        "the master stopped writing to flash with a replica attached"
    );
    let new = sample(n..2 * n);
    let want = dump(&mut m, &new);
    poll_until("the replica to follow", SYNC, || {
        let got = dump(&mut r, &new);
        if got == want {
            Ok(())
        } else {
            Err(format!("{} of {} keys alike", got.len(), want.len()))
        }
    });
}
