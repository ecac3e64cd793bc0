//! `-m auto` follows the memory available: the limit starts at what is available less a
//! reserve, drops (and the server's resident memory with it) when the machine runs short,
//! and grows back when memory is free again; a memory cgroup's limit changed at run time is
//! followed too. The machine is simulated with a directory standing for `/`
//! (`KVCACHED_SYSROOT`: its `proc/meminfo`, `proc/self/cgroup`, `proc/self/mountinfo` and
//! cgroup files), so the test is exact and harmless. With a flash tier the memory given back
//! moves items to flash. `tests/memory_cgroup.rs` runs a server in a real cgroup.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Client, Kind, Server};

const MIB: u64 = 1 << 20;

fn set_available(root: &Path, mib: u64) {
    let text = format!(
        "MemTotal: {} kB\nMemAvailable: {} kB\n",
        8192 * 1024,
        mib * 1024
    );
    // Written beside and renamed, so the server never reads a half-written file.
    write(root, "proc/meminfo", &text);
}

fn write(root: &Path, path: &str, text: &str) {
    let p = root.join(path);
    std::fs::create_dir_all(p.parent().expect("a parent")).expect("create dirs");
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, &p).expect("rename");
}

fn limit(c: &mut Client) -> u64 {
    c.stat("limit_maxbytes")
        .and_then(|v| v.parse().ok())
        .expect("limit_maxbytes")
}

fn poll(what: &str, mut f: impl FnMut() -> Result<(), String>) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match f() {
            Ok(()) => return,
            Err(why) => assert!(Instant::now() < end, "timed out waiting for {what}: {why}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn auto_limit_gives_memory_back_under_pressure_and_takes_it_again() {
    let root = std::env::temp_dir().join(format!("kvcached-sysroot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    set_available(&root, 400);
    // A cgroup v2 hierarchy with no limit yet.
    write(
        &root,
        "proc/self/mountinfo",
        "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
    );
    write(&root, "proc/self/cgroup", "0::/cache\n");
    write(&root, "sys/fs/cgroup/cache/memory.max", "max\n");
    write(&root, "sys/fs/cgroup/cache/memory.current", "0\n");
    // The only test in this file (its own process): no other thread reads the environment.
    std::env::set_var("KVCACHED_SYSROOT", &root);
    let server = Server::start_verified(Kind::Kvcached, &["-m", "auto"]);
    let mut c = server.connect();
    // 400 MiB available less the 256 MiB reserve.
    assert_eq!(limit(&mut c), 144 * MIB);

    // Fill about 110 MB.
    let value = vec![b'v'; 1000];
    fill(&mut c, &value);
    let full = server.rss_kib();
    assert!(full > 100 * 1024, "RSS {full} KiB after storing 110 MB");

    // The machine runs short: the limit drops to the floor and the memory goes back.
    run_short(&root, &server, &mut c);
    // The newest items are still there, the server still works.
    c.send(b"get k109-999\r\n");
    let reply = c.until("END\r\n");
    assert!(
        reply.starts_with("VALUE k109-999 0 1000\r\n"),
        "{reply:.60}"
    );

    // Between the reserve and twice it: no change.
    set_available(&root, 300);
    for _ in 0..3 {
        assert_eq!(limit(&mut c), 64 * MIB);
    }
    // Memory is free again: back up to the starting limit, not beyond.
    set_available(&root, 4096);
    poll("the limit to grow back", || match limit(&mut c) {
        l if l == 144 * MIB => Ok(()),
        l => Err(format!("limit {} MiB", l / MIB)),
    });

    // The cgroup gets a 160 MiB limit while the server runs: the limit follows at once to
    // 160 MiB less an eighth.
    write(
        &root,
        "sys/fs/cgroup/cache/memory.max",
        &format!("{}\n", 160 * MIB),
    );
    poll("the limit to follow the cgroup", || match limit(&mut c) {
        l if l == 140 * MIB => Ok(()),
        l => Err(format!("limit {} MiB", l / MIB)),
    });
    drop(c);
    drop(server);

    // With a flash tier, the memory given back moves items to flash instead of dropping
    // them (memcached's extstore has no automatic sizing).
    write(&root, "sys/fs/cgroup/cache/memory.max", "max\n");
    set_available(&root, 400);
    let dir = common::TempDir::new("auto-flash");
    let ext = dir.ext_path("512m");
    let server = Server::start_verified(Kind::Kvcached, &["-m", "auto", "-U", "0", "-o", &ext]);
    let mut c = server.connect();
    assert_eq!(limit(&mut c), 144 * MIB);
    fill(&mut c, &value);
    run_short(&root, &server, &mut c);
    let stat = |c: &mut Client, name: &str| -> u64 {
        c.stat(name).and_then(|v| v.parse().ok()).expect(name)
    };
    // At 64 MiB of about 1 KiB items, at most about 62,000 stay in memory.
    poll("items to move to flash", || {
        match stat(&mut c, "extstore_objects_used") {
            n if n > 40_000 => Ok(()),
            n => Err(format!(
                "{n} on flash, {} bytes in memory",
                stat(&mut c, "bytes")
            )),
        }
    });
    assert_eq!(stat(&mut c, "curr_items"), 110_000);
    assert_eq!(stat(&mut c, "evictions"), 0);
    for key in ["k0-0", "k50-500", "k109-999"] {
        c.send(format!("get {key}\r\n").as_bytes());
        let reply = c.until("END\r\n");
        let want = format!("VALUE {key} 0 1000\r\n{}\r\nEND\r\n", "v".repeat(1000));
        assert_eq!(reply, want, "{key}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// The machine runs short (50 MiB available): wait until the limit drops to its floor
/// (64 MiB) and the server's resident memory under 96 MiB.
fn run_short(root: &Path, server: &Server, c: &mut Client) {
    set_available(root, 50);
    poll("the limit to drop", || match limit(c) {
        l if l == 64 * MIB => Ok(()),
        l => Err(format!("limit {} MiB", l / MIB)),
    });
    poll("resident memory to shrink", || match server.rss_kib() {
        r if r < 96 * 1024 => Ok(()),
        r => Err(format!("RSS {r} KiB")),
    });
}

/// Store 110,000 items of `value` (about 110 MB), `k{batch}-{i}`.
fn fill(c: &mut Client, value: &[u8]) {
    for batch in 0..110 {
        let mut req = Vec::new();
        for i in 0..1000 {
            req.extend_from_slice(format!("set k{batch}-{i} 0 0 {}\r\n", value.len()).as_bytes());
            req.extend_from_slice(value);
            req.extend_from_slice(b"\r\n");
        }
        c.send(&req);
        for _ in 0..1000 {
            assert_eq!(c.line(), "STORED\r\n");
        }
    }
}
