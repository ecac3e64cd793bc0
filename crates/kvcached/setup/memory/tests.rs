use super::*;

/// A simulated machine: a directory standing for `/`, removed on drop.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Tree {
        let dir =
            std::env::temp_dir().join(format!("kvcached-memory-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the simulated root");
        Tree(dir)
    }

    fn write(&self, path: &str, text: &str) {
        let p = self.0.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().expect("a parent")).expect("create dirs");
        std::fs::write(p, text).expect("write");
    }

    fn sys(&self) -> Sys {
        Sys::at(&self.0)
    }

    fn meminfo(&self, total_mib: usize, available_mib: usize) {
        self.write(
            "/proc/meminfo",
            &format!(
                "MemTotal: {} kB\nMemFree: 1 kB\nMemAvailable: {} kB\n",
                total_mib * 1024,
                available_mib * 1024
            ),
        );
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// This machine's layout (hybrid: v1 controllers, the unified hierarchy beside them), with
/// the process in a memory cgroup two levels down.
const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
const HYBRID_CGROUP: &str = "\
8:pids:/
4:memory:/jobs/cache
1:cpu:/
0::/
";
const V1_UNLIMITED: &str = "9223372036854771712\n";

#[test]
fn meminfo_field() {
    let info = "MemTotal: 100 kB\nMemAvailable:   2048 kB\n";
    assert_eq!(parse_meminfo(info, "MemAvailable:"), Some(2 << 20));
    assert_eq!(parse_meminfo(info, "Nope:"), None);
}

#[test]
fn mountinfo_and_membership_are_parsed_as_the_kernel_writes_them() {
    assert_eq!(
        find_mount(HYBRID_MOUNTINFO, Version::V1),
        Some(Mount {
            root: "/".into(),
            point: "/sys/fs/cgroup/memory".into()
        })
    );
    assert_eq!(
        find_mount(HYBRID_MOUNTINFO, Version::V2),
        Some(Mount {
            root: "/".into(),
            point: "/sys/fs/cgroup/unified".into()
        })
    );
    // Optional fields before the separator, and an escaped space in the mount point.
    let line = "40 31 0:37 /kube/pod1 /sys/fs/cgroup/my\\040mem rw shared:9 master:2 - cgroup cgroup rw,memory,hugetlb\n";
    assert_eq!(
        find_mount(line, Version::V1),
        Some(Mount {
            root: "/kube/pod1".into(),
            point: "/sys/fs/cgroup/my mem".into()
        })
    );
    assert_eq!(find_mount(line, Version::V2), None);
    assert_eq!(
        cgroup_path(HYBRID_CGROUP, Version::V1).as_deref(),
        Some("/jobs/cache")
    );
    assert_eq!(
        cgroup_path(HYBRID_CGROUP, Version::V2).as_deref(),
        Some("/")
    );
    // A v1 line naming several controllers; `name=` hierarchies are not controllers.
    let lines = "9:name=systemd:/x\n5:cpu,memory:/y\n";
    assert_eq!(cgroup_path(lines, Version::V1).as_deref(), Some("/y"));
    assert_eq!(cgroup_path(lines, Version::V2), None);
    assert_eq!(unescape("a\\040b\\134c\\"), "a b\\c\\");
}

#[test]
fn cgroup_v1_limit_of_the_process_and_of_a_parent() {
    let t = Tree::new("v1");
    t.meminfo(24 * 1024, 20 * 1024);
    t.write("/proc/self/mountinfo", HYBRID_MOUNTINFO);
    t.write("/proc/self/cgroup", HYBRID_CGROUP);
    let root = "/sys/fs/cgroup/memory";
    for dir in [root, "/sys/fs/cgroup/memory/jobs"] {
        t.write(&format!("{dir}/memory.limit_in_bytes"), V1_UNLIMITED);
        t.write(&format!("{dir}/memory.usage_in_bytes"), "0\n");
    }
    let me = "/sys/fs/cgroup/memory/jobs/cache";
    t.write(
        &format!("{me}/memory.limit_in_bytes"),
        &format!("{}\n", 768 << 20),
    );
    // 100 MiB charged, 40 of it inactive page cache.
    t.write(
        &format!("{me}/memory.usage_in_bytes"),
        &format!("{}\n", 100 << 20),
    );
    t.write(
        &format!("{me}/memory.stat"),
        &format!("cache 1\ntotal_inactive_file {}\n", 40 << 20),
    );
    let cg = t.sys().memory_cgroup().expect("the memory cgroup");
    assert_eq!(cg.version(), Version::V1);
    assert!(cg.dir().ends_with("memory/jobs/cache"), "{:?}", cg.dir());
    assert_eq!(
        cg.bounds(),
        Some(Bounds {
            limit: 768 << 20,
            headroom: (768 - 60) << 20
        })
    );
    // The 768 MiB cgroup bounds the cache, not the machine's 20 GiB: its 708 MiB of
    // headroom less an eighth of 768.
    let sizer = AutoSizer::new(t.sys());
    assert_eq!(sizer.initial(), 612 << 20);
    assert!(
        sizer.describe().contains("limit 768 MiB"),
        "{}",
        sizer.describe()
    );

    // A parent's smaller limit counts too.
    t.write(
        "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes",
        &format!("{}\n", 512 << 20),
    );
    assert_eq!(cg.bounds().map(|b| b.limit), Some(512 << 20));
    // As does one the container cannot see, through the kernel's hierarchical figure.
    t.write(
        &format!("{me}/memory.stat"),
        &format!(
            "hierarchical_memory_limit {}\ntotal_inactive_file 0\n",
            256 << 20
        ),
    );
    assert_eq!(cg.bounds().map(|b| b.limit), Some(256 << 20));
    // 256 less 100 MiB used, less an eighth of 256.
    assert_eq!(AutoSizer::new(t.sys()).initial(), 124 << 20);
}

#[test]
fn cgroup_v2_limits_up_the_tree_with_a_namespaced_path() {
    let t = Tree::new("v2");
    t.meminfo(8192, 6000);
    // A container with a cgroup namespace: the mount's root is the container's cgroup and
    // the process sees itself one level below it.
    t.write(
        "/proc/self/mountinfo",
        "30 20 0:26 /pod /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
    );
    t.write("/proc/self/cgroup", "0::/pod/app\n");
    let top = "/sys/fs/cgroup";
    t.write(&format!("{top}/memory.max"), &format!("{}\n", 1024 << 20));
    t.write(
        &format!("{top}/memory.current"),
        &format!("{}\n", 900 << 20),
    );
    t.write(
        &format!("{top}/memory.stat"),
        &format!("inactive_file {}\n", 100 << 20),
    );
    t.write(&format!("{top}/app/memory.max"), "max\n");
    t.write(
        &format!("{top}/app/memory.high"),
        &format!("{}\n", 2048usize << 20),
    );
    t.write(
        &format!("{top}/app/memory.current"),
        &format!("{}\n", 10 << 20),
    );
    let cg = t.sys().memory_cgroup().expect("the memory cgroup");
    assert_eq!(cg.version(), Version::V2);
    assert!(cg.dir().ends_with("cgroup/app"), "{:?}", cg.dir());
    // The parent's limit, and its headroom (1024 - 800), are the smallest.
    assert_eq!(
        cg.bounds(),
        Some(Bounds {
            limit: 1024 << 20,
            headroom: 224 << 20
        })
    );
    // 224 MiB free under the parent, less its reserve of 128 MiB.
    assert_eq!(AutoSizer::new(t.sys()).initial(), 96 << 20);

    // A path the mount does not show: the mount itself is read.
    t.write("/proc/self/cgroup", "0::/elsewhere\n");
    let cg = t.sys().memory_cgroup().expect("the memory cgroup");
    assert!(cg.dir().ends_with("sys/fs/cgroup"), "{:?}", cg.dir());
}

#[test]
fn no_cgroup_and_no_limit() {
    let t = Tree::new("none");
    t.meminfo(8192, 400);
    assert!(t.sys().memory_cgroup().is_none());
    // 400 MiB available less the machine's 256 MiB reserve.
    assert_eq!(AutoSizer::new(t.sys()).initial(), 144 << 20);
    // A v2 hierarchy without the memory controller is not a memory cgroup.
    t.write(
        "/proc/self/mountinfo",
        "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
    );
    t.write("/proc/self/cgroup", "0::/\n");
    t.write("/sys/fs/cgroup/cgroup.procs", "1\n");
    assert!(t.sys().memory_cgroup().is_none());
    // An unlimited v1 memory cgroup bounds nothing.
    t.write("/proc/self/mountinfo", HYBRID_MOUNTINFO);
    t.write("/proc/self/cgroup", "4:memory:/\n");
    t.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", V1_UNLIMITED);
    let cg = t.sys().memory_cgroup().expect("the memory cgroup");
    assert_eq!(cg.bounds(), None);
    assert_eq!(AutoSizer::new(t.sys()).initial(), 144 << 20);
    // Nothing readable at all: the floor.
    let empty = Tree::new("empty");
    assert_eq!(AutoSizer::new(empty.sys()).initial(), FLOOR);
}

#[test]
fn the_limit_follows_a_cgroup_limit_changed_at_run_time() {
    let t = Tree::new("follow");
    t.meminfo(24 * 1024, 20 * 1024);
    t.write(
        "/proc/self/mountinfo",
        "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
    );
    t.write("/proc/self/cgroup", "0::/\n");
    t.write("/sys/fs/cgroup/memory.current", "0\n");
    t.write("/sys/fs/cgroup/memory.max", &format!("{}\n", 768 << 20));
    let sizer = AutoSizer::new(t.sys());
    let limit = sizer.initial();
    assert_eq!(limit, 672 << 20);
    // Lowered to 512 MiB: the ceiling drops at once to 512 less an eighth.
    t.write("/sys/fs/cgroup/memory.max", &format!("{}\n", 512 << 20));
    assert_eq!(sizer.next(limit), 448 << 20);
    // Raised to 2 GiB with nothing used: grows by half the excess, up to the new ceiling.
    t.write(
        "/sys/fs/cgroup/memory.max",
        &format!("{}\n", 2048usize << 20),
    );
    let grown = sizer.next(448 << 20);
    assert_eq!(grown, (448 + (2048 - 512) / 2) << 20);
    assert_eq!(sizer.next(sizer.next(grown)), (2048 - 256) << 20);
    // Used up to 100 MiB short of the limit: give back what the reserve lacks.
    t.write(
        "/sys/fs/cgroup/memory.current",
        &format!("{}\n", 1948 << 20),
    );
    assert_eq!(sizer.next(1792 << 20), (1792 - 156) << 20);
}

#[test]
fn adjust_gives_back_under_pressure_and_takes_again_up_to_the_ceiling() {
    const MIB: usize = 1 << 20;
    let ceiling = 1024 * MIB;
    let c = |available: usize| Constraint {
        ceiling,
        available,
        reserve: RESERVE,
        floor: FLOOR,
    };
    // Plenty available: stays at (or grows back to) the ceiling.
    assert_eq!(adjust(ceiling, c(4096 * MIB)), ceiling);
    assert_eq!(adjust(512 * MIB, c(4096 * MIB)), ceiling);
    // Growth is half the excess over twice the reserve.
    assert_eq!(adjust(512 * MIB, c(2 * RESERVE + 100 * MIB)), 562 * MIB);
    // Between the reserve and twice it: no change.
    assert_eq!(adjust(700 * MIB, c(RESERVE + MIB)), 700 * MIB);
    // Short by 100 MiB: the limit drops by 100 MiB.
    assert_eq!(adjust(700 * MIB, c(RESERVE - 100 * MIB)), 600 * MIB);
    // Never below the floor.
    assert_eq!(adjust(80 * MIB, c(0)), FLOOR);
    assert_eq!(adjust(FLOOR, c(0)), FLOOR);
    // A ceiling below the limit wins at once, in whole MiB.
    let low = Constraint {
        ceiling: 300 * MIB + 5,
        ..c(4096 * MIB)
    };
    assert_eq!(adjust(ceiling, low), 300 * MIB);
}

#[test]
fn small_bounds_keep_proportionate_reserves() {
    assert_eq!(reserve(768 << 20), 96 << 20);
    assert_eq!(reserve(64 << 30), RESERVE);
    assert_eq!(floor(96 << 20), 48 << 20);
    assert_eq!(floor(8 << 30), FLOOR);
}
