//! Warm restart (`-e FILE`): SIGUSR1 (and SIGTERM) save the cache, the next start with the
//! same file loads it (once), SIGINT saves nothing; a file that cannot be used stops the
//! start and is kept (or, when asked, is moved aside for an empty start); a save killed
//! midway leaves the previous file whole.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Kind, Server};

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

const SIGINT: i32 = 2;
const SIGUSR1: i32 = 10;

fn snapshot_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("kvcached-warm-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// Send SIGUSR1 and wait (bounded) for a clean exit.
fn stop_with_usr1(server: &mut Server) {
    stop_with(server, SIGUSR1);
}

/// Send `sig` and wait (bounded) for a clean exit.
fn stop_with(server: &mut Server, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { kill(server.child.id() as i32, sig) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = server.child.try_wait() {
            assert!(
                status.success(),
                "exit status {status}: {}",
                server.stderr()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "server did not exit after signal {sig}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Load `n` keys (some with an expiry far ahead, one already deleted) and return the `gets`
/// replies of all of them, as the test will expect them after a restart.
fn load(server: &Server, n: usize) -> Vec<String> {
    let mut c = server.connect();
    let mut batch = String::new();
    for i in 0..n {
        let value = format!("value-{i}-{}", "x".repeat(i % 50));
        let exptime = if i % 3 == 0 { 100_000 } else { 0 };
        batch.push_str(&format!(
            "set k{i} {i} {exptime} {}\r\n{value}\r\n",
            value.len()
        ));
        if i % 200 == 199 {
            c.send(batch.as_bytes());
            batch.clear();
            for _ in 0..200 {
                assert_eq!(c.line(), "STORED\r\n");
            }
        }
    }
    assert_eq!(c.call("delete k5\r\n"), "DELETED\r\n");
    assert_eq!(
        c.call("incr k7 0\r\n"),
        "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
    );
    dump(server, n)
}

fn dump(server: &Server, n: usize) -> Vec<String> {
    let mut c = server.connect();
    (0..n)
        .map(|i| {
            c.send(format!("gets k{i}\r\n").as_bytes());
            c.until("END\r\n")
        })
        .collect()
}

#[test]
fn sigusr1_and_sigterm_save_and_the_next_start_loads_once() {
    let file = snapshot_path("once");
    let f = file.to_str().expect("utf-8 temp path");
    let mut first = Server::start_verified(Kind::Kvcached, &["-e", f]);
    let before = load(&first, 3000);
    assert_eq!(before[5], "END\r\n");
    stop_with_usr1(&mut first);
    assert!(file.exists(), "SIGUSR1 must save the snapshot");

    let mut second = Server::start_verified(Kind::Kvcached, &["-e", f]);
    assert!(!file.exists(), "the snapshot is used once");
    let after = dump(&second, 3000);
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        assert_eq!(a, b, "k{i} differs after the warm restart");
    }
    // Writes after the restart get CAS uniques above the restored ones.
    let mut c = second.connect();
    assert_eq!(c.call("set fresh 0 0 1\r\nz\r\n"), "STORED\r\n");
    c.send(b"gets fresh\r\n");
    let fresh_cas: u64 = c
        .line()
        .trim_end()
        .rsplit(' ')
        .next()
        .and_then(|x| x.parse().ok())
        .expect("cas");
    let max_cas = before
        .iter()
        .filter_map(|r| r.lines().next()?.rsplit(' ').next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    assert!(
        fresh_cas > max_cas,
        "new CAS {fresh_cas} <= restored {max_cas}"
    );
    // SIGTERM (a service manager's stop) saves too.
    assert!(second.terminate().is_some_and(|s| s.success()));
    assert!(file.exists(), "SIGTERM must save");
    let mut third = Server::start_verified(Kind::Kvcached, &["-e", f]);
    assert!(!file.exists(), "the snapshot is used once");
    assert_eq!(dump(&third, 3000), before, "after a SIGTERM restart");
    let mut c = third.connect();
    c.send(b"get fresh\r\n");
    assert_eq!(c.until("END\r\n"), "VALUE fresh 0 1\r\nz\r\nEND\r\n");
    // SIGINT saves nothing.
    stop_with(&mut third, SIGINT);
    assert!(!file.exists(), "SIGINT must not save");
    let fourth = Server::start_verified(Kind::Kvcached, &["-e", f]);
    assert_eq!(fourth.connect().call("get k1\r\n"), "END\r\n");
}

/// Run kvcached with `args` expecting it to refuse to start: its exit status and stderr.
fn refused_start(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kvcached"));
    let port = common::free_port().to_string();
    cmd.args(["-l", "127.0.0.1", "-p", &port, "-U", "0"]);
    if common::running_as_root() {
        cmd.args(["-u", "root"]);
    }
    let mut child = cmd
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn kvcached");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kvcached {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (status, err)
}

/// A saved snapshot of 1000 items: its bytes.
fn saved_snapshot(file: &std::path::Path, extra: &[&str]) -> Vec<u8> {
    let f = file.to_str().expect("utf-8 temp path");
    let mut args = vec!["-e", f];
    args.extend_from_slice(extra);
    let mut first = Server::start_verified(Kind::Kvcached, &args);
    load(&first, 1000);
    stop_with_usr1(&mut first);
    std::fs::read(file).expect("snapshot written")
}

#[test]
fn a_file_that_cannot_be_used_stops_the_start_and_is_kept() {
    let file = snapshot_path("damaged");
    let f = file.to_str().expect("utf-8 temp path");
    let bytes = saved_snapshot(&file, &[]);
    let mid = bytes.len() / 2;
    let mut flipped = bytes.clone();
    flipped[mid] ^= 0x10;
    let mut other_version = bytes.clone();
    other_version[7] = 1;
    let mut longer = bytes.clone();
    longer.extend_from_slice(b"\n");
    let cases: [(&str, Vec<u8>, &str); 7] = [
        ("empty", Vec::new(), "the file is empty"),
        (
            "cut in the magic",
            bytes[..5].to_vec(),
            "not a kvcached snapshot",
        ),
        ("cut in half", bytes[..mid].to_vec(), "truncated"),
        (
            "cut by one byte",
            bytes[..bytes.len() - 1].to_vec(),
            "truncated",
        ),
        ("one bit flipped in the middle", flipped, "checksum"),
        ("another format", other_version, "snapshot format 1"),
        ("data after the end", longer, "after the end frame"),
    ];
    for (what, content, says) in cases {
        std::fs::write(&file, &content).expect("write the damaged snapshot");
        let (status, err) = refused_start(&["-e", f]);
        assert!(!status.success(), "{what}: started ({err})");
        assert!(err.contains(f), "{what}: the message names the file: {err}");
        assert!(err.contains(says), "{what}: says {says:?}: {err}");
        assert_eq!(
            std::fs::read(&file).ok(),
            Some(content),
            "{what}: the file is left as it was"
        );
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn other_item_settings_are_refused() {
    let file = snapshot_path("settings");
    let f = file.to_str().expect("utf-8 temp path");
    let bytes = saved_snapshot(&file, &[]);
    for (args, says) in [
        (vec!["-C"], "CAS on (now off (-C))"),
        (vec!["-I", "2m"], "item size max 1048576 (now 2097152)"),
    ] {
        std::fs::write(&file, &bytes).expect("write snapshot");
        let mut all = vec!["-e", f];
        all.extend(args.iter().copied());
        let (status, err) = refused_start(&all);
        assert!(!status.success(), "{args:?}: started ({err})");
        assert!(err.contains(says), "{args:?}: says {says:?}: {err}");
    }
    // The same settings load it.
    let s = Server::start_verified(Kind::Kvcached, &["-e", f]);
    assert_ne!(s.connect().call("get k1\r\n"), "END\r\n");
}

#[test]
fn ignore_bad_file_starts_empty_and_keeps_the_evidence() {
    let file = snapshot_path("ignored");
    let f = file.to_str().expect("utf-8 temp path");
    let bad = std::path::PathBuf::from(format!("{f}.bad"));
    let _ = std::fs::remove_file(&bad);
    let bytes = saved_snapshot(&file, &[]);
    let cut = bytes[..bytes.len() / 3].to_vec();
    std::fs::write(&file, &cut).expect("write cut snapshot");
    let mut s = Server::start_verified(
        Kind::Kvcached,
        &["-e", f, "-o", "warm_restart_ignore_bad_file"],
    );
    let mut c = s.connect();
    assert_eq!(c.call("get k1\r\n"), "END\r\n");
    assert_eq!(c.call("set a 0 0 1\r\nb\r\n"), "STORED\r\n");
    assert!(!file.exists());
    assert_eq!(std::fs::read(&bad).ok(), Some(cut), "moved aside as it was");
    // The next save writes a good file and leaves the bad one alone.
    assert!(s.terminate().is_some_and(|st| st.success()));
    let err = s.stderr();
    assert!(err.contains("truncated") && err.contains(".bad"), "{err}");
    assert!(file.exists() && bad.exists());
    let s = Server::start_verified(Kind::Kvcached, &["-e", f]);
    let mut c = s.connect();
    c.send(b"get a\r\n");
    assert_eq!(c.until("END\r\n"), "VALUE a 0 1\r\nb\r\nEND\r\n");
    let _ = std::fs::remove_file(&bad);
}

/// A save killed part way leaves the file that was there before whole: whatever moment
/// the kill lands, the file at FILE is a complete snapshot (the old one or the new one).
#[test]
fn a_save_killed_midway_leaves_the_previous_file_whole() {
    let file = snapshot_path("killed");
    let f = file.to_str().expect("utf-8 temp path");
    let tmp = std::path::PathBuf::from(format!("{f}.tmp"));
    // The previous file: 1000 items.
    let old = saved_snapshot(&file, &[]);
    std::fs::remove_file(&file).expect("remove");
    // A server with more to save (it starts empty: no file yet).
    let mut big = Server::start_verified(Kind::Kvcached, &["-e", f, "-m", "256"]);
    let mut c = big.connect();
    let value = vec![b'x'; 2000];
    for batch in 0..50 {
        let mut req = Vec::new();
        for i in 0..1000 {
            req.extend_from_slice(format!("set big{batch}-{i} 0 0 2000\r\n").as_bytes());
            req.extend_from_slice(&value);
            req.extend_from_slice(b"\r\n");
        }
        c.send(&req);
        for _ in 0..1000 {
            assert_eq!(c.line(), "STORED\r\n");
        }
    }
    // The previous snapshot is put back, then the server is told to save and killed as
    // soon as its temporary file appears (or once it has exited, if the save was quicker).
    std::fs::write(&file, &old).expect("restore the previous file");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { kill(big.child.id() as i32, SIGUSR1) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !tmp.exists() && big.child.try_wait().ok().flatten().is_none() {
        assert!(Instant::now() < deadline, "no save started");
        std::thread::yield_now();
    }
    let _ = big.child.kill();
    let _ = big.child.wait();
    let now = std::fs::read(&file).expect("a file is there");
    // Old or new, it loads (and a leftover temporary file is cleaned up).
    let s = Server::start_verified(Kind::Kvcached, &["-e", f, "-m", "256"]);
    assert!(!tmp.exists(), "the temporary file is removed at start");
    let mut c = s.connect();
    if now == old {
        assert_ne!(c.call("get k1\r\n"), "END\r\n", "the previous items");
    } else {
        c.send(b"get big49-999\r\n");
        assert!(c.until("END\r\n").starts_with("VALUE big49-999 0 2000\r\n"));
    }
}

/// `FILE.meta`, as memcached's restart metadata: a save writes it with memcached's hash
/// table level, the next start reads it (the level comes back even though the items that
/// raised it are gone) and removes it; an empty one stops the start, as memcached's
/// "corrupt metadata file" does, even without a snapshot.
#[test]
fn the_metadata_file_brings_back_the_hash_level_and_an_empty_one_stops_the_start() {
    let file = snapshot_path("meta");
    let f = file.to_str().expect("utf-8 temp path");
    let meta = std::path::PathBuf::from(format!("{f}.meta"));
    let _ = std::fs::remove_file(&meta);
    let mut first = Server::start_verified(Kind::Kvcached, &["-e", f]);
    let mut c = first.connect();
    assert_eq!(c.stat("hash_power_level").as_deref(), Some("16"));
    // 1.5 * 2^16 items and one more: memcached's table doubles.
    let mut batch = String::new();
    for i in 0..98_305 {
        batch.push_str(&format!("set z{i} 0 0 0 noreply\r\n\r\n"));
    }
    c.send(batch.as_bytes());
    assert!(c.call("version\r\n").starts_with("VERSION "));
    assert_eq!(c.stat("hash_power_level").as_deref(), Some("17"));
    assert_eq!(c.call("flush_all\r\n"), "OK\r\n");
    drop(c);
    stop_with_usr1(&mut first);
    let text = std::fs::read_to_string(&meta).expect("FILE.meta written");
    assert_eq!(text, "T kvcached\nK hash_power_level 17\n");
    let second = Server::start_verified(Kind::Kvcached, &["-e", f]);
    assert_eq!(
        second.connect().stat("hash_power_level").as_deref(),
        Some("17")
    );
    assert!(!meta.exists(), "FILE.meta is used once");
    drop(second);

    let _ = std::fs::remove_file(&file);
    std::fs::write(&meta, b"").expect("write an empty FILE.meta");
    let (status, err) = refused_start(&["-e", f]);
    assert!(!status.success(), "{err}");
    assert!(err.contains("corrupt metadata file"), "{err}");
    assert!(meta.exists(), "the evidence is kept");
    let _ = std::fs::remove_file(&meta);
}
