//! Warm restart (`-e FILE`): SIGUSR1 (and SIGTERM) save the cache, the next start with the
//! same file loads it (once), SIGINT saves nothing, and a damaged file means an empty start,
//! never a crash.

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

#[test]
fn a_damaged_snapshot_means_an_empty_start() {
    let file = snapshot_path("damaged");
    let f = file.to_str().expect("utf-8 temp path");
    let mut first = Server::start_verified(Kind::Kvcached, &["-e", f]);
    load(&first, 1000);
    stop_with_usr1(&mut first);
    let bytes = std::fs::read(&file).expect("snapshot written");
    for cut in [0, 7, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&file, &bytes[..cut]).expect("write damaged snapshot");
        let mut s = Server::start_verified(Kind::Kvcached, &["-e", f]);
        let mut c = s.connect();
        assert_eq!(c.call("get k1\r\n"), "END\r\n", "cut at {cut}");
        assert_eq!(c.call("set a 0 0 1\r\nb\r\n"), "STORED\r\n");
        assert!(!file.exists());
        assert!(s.terminate().is_some_and(|st| st.success()));
        assert!(
            s.stderr().contains("starting with an empty cache"),
            "cut at {cut}"
        );
    }
}
