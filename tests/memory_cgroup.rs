//! `-m auto` inside a real memory cgroup, as a container runtime or systemd would set one up:
//! the test creates a child of its own memory cgroup (v1 `memory.limit_in_bytes`, or v2
//! `memory.max`) limited to 768 MiB, starts kvcached in it, and stores more than the cgroup
//! allows. The cache must size itself below the limit, evict instead of being OOM-killed, and
//! take more memory when the limit is raised at run time.
//!
//! The test needs to be able to create a cgroup (root, or a delegated v2 subtree); where it
//! cannot, it says so and passes without asserting anything. `tests/memory_auto.rs` covers
//! the same logic against a simulated tree everywhere.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Client, Kind, Server};

const MIB: u64 = 1 << 20;

/// A memory cgroup the test created; the test process leaves it and it is removed on drop.
struct TestCgroup {
    dir: PathBuf,
    parent: PathBuf,
    v1: bool,
}

impl TestCgroup {
    /// A child of this process's memory cgroup limited to `limit` bytes, or why not.
    fn create(limit: u64) -> Result<TestCgroup, String> {
        let membership = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let name = format!("kvcached-test-{}", std::process::id());
        let v1_path = membership.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        });
        let (parent, v1) = match v1_path {
            Some(p) => (
                Path::new("/sys/fs/cgroup/memory").join(p.trim_start_matches('/')),
                true,
            ),
            None => {
                let p = membership
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .ok_or("no memory cgroup")?;
                (
                    Path::new("/sys/fs/cgroup").join(p.trim_start_matches('/')),
                    false,
                )
            }
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = TestCgroup { dir, parent, v1 };
        cg.set_limit(limit)?;
        Ok(cg)
    }

    fn set_limit(&self, limit: u64) -> Result<(), String> {
        let file = if self.v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        std::fs::write(self.dir.join(file), limit.to_string())
            .map_err(|e| format!("set {file}: {e}"))
    }

    /// Move this process into `dir` (its children start there).
    fn move_to(dir: &Path) -> Result<(), String> {
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
            .map_err(|e| format!("enter {}: {e}", dir.display()))
    }

    /// The kernel's count of OOM kills in the cgroup, where it keeps one.
    fn oom_kills(&self) -> u64 {
        let (file, field) = if self.v1 {
            ("memory.oom_control", "oom_kill ")
        } else {
            ("memory.events", "oom_kill ")
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = TestCgroup::move_to(&self.parent);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn limit(c: &mut Client) -> u64 {
    c.stat("limit_maxbytes")
        .and_then(|v| v.parse().ok())
        .expect("limit_maxbytes")
}

#[test]
fn auto_limit_stays_inside_a_memory_cgroup() {
    let cg = match TestCgroup::create(768 * MIB) {
        Ok(cg) => cg,
        Err(why) => {
            common::skip(format_args!("cannot create a memory cgroup here ({why})"));
            return;
        }
    };
    // The only test in this file (its own process): the server starts inside the cgroup,
    // then the test process leaves it.
    TestCgroup::move_to(&cg.dir).expect("enter the cgroup");
    let mut server = Server::start_verified(Kind::Kvcached, &["-m", "auto"]);
    TestCgroup::move_to(&cg.parent).expect("leave the cgroup");

    let mut c = server.connect();
    let start = limit(&mut c);
    // 768 MiB less an eighth, less what was charged before the server sized itself.
    assert!(
        (600 * MIB..=672 * MIB).contains(&start),
        "limit {} MiB in a 768 MiB cgroup",
        start / MIB
    );

    // Store 1 GiB in 64 KiB values: more than the cgroup allows.
    let value = vec![b'v'; 64 << 10];
    for batch in 0..64 {
        let mut req = Vec::new();
        for i in 0..256 {
            req.extend_from_slice(format!("set k{batch}-{i} 0 0 {}\r\n", value.len()).as_bytes());
            req.extend_from_slice(&value);
            req.extend_from_slice(b"\r\n");
        }
        c.send(&req);
        for _ in 0..256 {
            assert_eq!(c.line(), "STORED\r\n");
        }
    }
    assert!(
        server.child.try_wait().expect("try_wait").is_none(),
        "the server died in its cgroup"
    );
    assert_eq!(cg.oom_kills(), 0, "OOM kills in the cgroup");
    let evictions: u64 = c
        .stat("evictions")
        .and_then(|v| v.parse().ok())
        .expect("evictions");
    assert!(evictions > 0, "1 GiB stored without evicting");
    assert!(
        server.rss_kib() < 768 * 1024,
        "RSS {} KiB",
        server.rss_kib()
    );
    c.send(b"get k63-255\r\n");
    assert!(c.until("END\r\n").starts_with("VALUE k63-255 0 65536\r\n"));

    // Raised to 1.5 GiB at run time: the cache takes more memory, within the new limit.
    cg.set_limit(1536 * MIB).expect("raise the limit");
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let now = limit(&mut c);
        if now > start {
            assert!(now <= 1344 * MIB, "limit {} MiB", now / MIB);
            break;
        }
        assert!(
            Instant::now() < end,
            "the limit stayed at {} MiB after the cgroup's was raised",
            now / MIB
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
