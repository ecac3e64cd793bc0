//! Automatic memory sizing (`-m auto`): how much memory the cache may use on this machine,
//! and, while it runs, giving memory back when the machine runs short and taking it again
//! when memory is free (OSv's idea: a cache should not make the rest of the system swap or
//! be killed for memory it holds only as an optimisation).
//!
//! What bounds the process is the smaller of the machine's `MemAvailable` and its memory
//! cgroup: cgroup v1 (`memory.limit_in_bytes`, and the kernel's `hierarchical_memory_limit`,
//! which includes the limits of parents a container cannot see) or v2 (`memory.max` and
//! `memory.high` of the cgroup and every parent up to the mount). The cgroup is found the way
//! the kernel describes it (`/proc/self/cgroup` and `/proc/self/mountinfo`), so it works
//! inside containers, with cgroup namespaces, and on hybrid v1/v2 hosts.
//!
//! The limit starts at what is available less a reserve (the *ceiling*). Every tick the
//! server looks at what is available now (the smallest headroom, limit less usage not counting
//! inactive page cache, over the cgroup and its limited parents, and `MemAvailable`): below
//! the reserve, the limit drops by the shortfall (the engine evicts and unmaps segments);
//! above twice the reserve, it grows by half the excess, up to the ceiling; in between nothing
//! changes (hysteresis). The ceiling follows the cgroup's limit when it is changed at run time.
//! Never below [`FLOOR`] (or half the cgroup's limit, if that is smaller).

use std::path::{Path, PathBuf};

/// Memory kept free for the rest of the system when sizing automatically (at most; under a
/// cgroup limit, an eighth of it).
const RESERVE: usize = 256 << 20;

/// The smallest automatic limit.
const FLOOR: usize = 64 << 20;

const MIB: usize = 1 << 20;

/// A directory that stands for `/` when reading `/proc` and `/sys` (a simulated machine, for
/// tests): kvcached reads `$KVCACHED_SYSROOT/proc/self/cgroup`, `.../proc/self/mountinfo`,
/// `.../proc/meminfo` and the cgroup files under the mount points the mountinfo names.
const SYSROOT_ENV: &str = "KVCACHED_SYSROOT";

/// Where this process's `/proc` and cgroup files are.
#[derive(Debug, Clone)]
pub struct Sys {
    root: PathBuf,
}

impl Sys {
    /// The running machine, or the simulated one `KVCACHED_SYSROOT` names.
    pub fn host() -> Sys {
        let root = std::env::var_os(SYSROOT_ENV).map_or_else(|| PathBuf::from("/"), Into::into);
        Sys { root }
    }

    #[cfg(test)]
    fn at(root: &Path) -> Sys {
        Sys {
            root: root.to_path_buf(),
        }
    }

    fn path(&self, absolute: &str) -> PathBuf {
        self.root.join(absolute.trim_start_matches('/'))
    }

    fn read(&self, absolute: &str) -> Option<String> {
        std::fs::read_to_string(self.path(absolute)).ok()
    }

    /// `MemAvailable` from /proc/meminfo.
    pub fn mem_available(&self) -> Option<usize> {
        parse_meminfo(&self.read("/proc/meminfo")?, "MemAvailable:")
    }

    /// `MemTotal` from /proc/meminfo.
    fn mem_total(&self) -> Option<usize> {
        parse_meminfo(&self.read("/proc/meminfo")?, "MemTotal:")
    }

    /// This process's memory cgroup, if it has one the process can read.
    pub fn memory_cgroup(&self) -> Option<Cgroup> {
        let mountinfo = self.read("/proc/self/mountinfo")?;
        let membership = self.read("/proc/self/cgroup")?;
        // On a hybrid host the memory controller is on its v1 hierarchy when one is mounted.
        let v1 = cgroup_path(&membership, Version::V1).and_then(|path| {
            let mount = find_mount(&mountinfo, Version::V1)?;
            Some(self.cgroup_at(mount, &path, Version::V1))
        });
        v1.or_else(|| {
            let path = cgroup_path(&membership, Version::V2)?;
            let mount = find_mount(&mountinfo, Version::V2)?;
            let cg = self.cgroup_at(mount, &path, Version::V2);
            // A v2 hierarchy without the memory controller enabled has no memory files.
            cg.dir.join("memory.current").exists().then_some(cg)
        })
    }

    fn cgroup_at(&self, mount: Mount, path: &str, version: Version) -> Cgroup {
        let top = self.path(&mount.point);
        // With a cgroup namespace (or a container's bind mount) the mount's root is the
        // process's own cgroup or one of its parents; the path is relative to it.
        let relative = path
            .strip_prefix(mount.root.trim_end_matches('/'))
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .unwrap_or(path);
        let dir = top.join(relative.trim_start_matches('/'));
        // A path that does not exist under the mount (a namespace the mountinfo does not
        // show): the mount itself is the closest cgroup we can read.
        let dir = if dir.is_dir() { dir } else { top.clone() };
        Cgroup { dir, top, version }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// A memory cgroup: the process's directory and the mount it sits in.
#[derive(Debug, Clone)]
pub struct Cgroup {
    dir: PathBuf,
    top: PathBuf,
    version: Version,
}

/// What a memory cgroup allows now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The smallest limit on the cgroup and its parents.
    pub limit: usize,
    /// The smallest headroom (limit less usage that cannot simply be dropped) over the
    /// limited levels.
    pub headroom: usize,
}

impl Cgroup {
    pub fn version(&self) -> Version {
        self.version
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The limit and headroom over this cgroup and its parents up to the mount, or `None`
    /// when nothing limits it.
    pub fn bounds(&self) -> Option<Bounds> {
        let mut best: Option<Bounds> = None;
        let mut fold = |limit: usize, usage: Option<usize>| {
            let headroom = usage.map_or(limit, |u| limit.saturating_sub(u));
            let b = best.get_or_insert(Bounds { limit, headroom });
            b.limit = b.limit.min(limit);
            b.headroom = b.headroom.min(headroom);
        };
        if self.version == Version::V1 {
            // The kernel's own view of every limit above us, visible or not.
            if let Some(limit) = stat_field(&self.dir, "hierarchical_memory_limit").and_then(v1) {
                fold(limit, self.usage(&self.dir));
            }
        }
        let mut dir = Some(self.dir.as_path());
        while let Some(d) = dir {
            // v2 writes `max` for no limit, which reads as none.
            let limit = match self.version {
                Version::V1 => read_number(&d.join("memory.limit_in_bytes")).and_then(v1),
                Version::V2 => [
                    read_number(&d.join("memory.max")),
                    read_number(&d.join("memory.high")),
                ]
                .into_iter()
                .flatten()
                .min(),
            };
            if let Some(limit) = limit {
                fold(limit, self.usage(d));
            }
            if d == self.top {
                break;
            }
            dir = d.parent().filter(|p| p.starts_with(&self.top));
        }
        best
    }

    /// Memory charged to the cgroup at `dir` less its inactive page cache (the kernel drops
    /// that before it reclaims anything else; the same "working set" container runtimes show).
    fn usage(&self, dir: &Path) -> Option<usize> {
        let (usage, inactive) = match self.version {
            Version::V1 => ("memory.usage_in_bytes", "total_inactive_file"),
            Version::V2 => ("memory.current", "inactive_file"),
        };
        let usage = read_number(&dir.join(usage))?;
        Some(usage.saturating_sub(stat_field(dir, inactive).unwrap_or(0)))
    }
}

/// The reserve kept free below a bound: [`RESERVE`], or an eighth of a smaller bound.
fn reserve(bound: usize) -> usize {
    RESERVE.min(bound / 8)
}

/// The floor below a bound: [`FLOOR`], or half of a smaller bound.
fn floor(bound: usize) -> usize {
    FLOOR.min(bound / 2)
}

/// How `-m auto` sizes the cache: what bounds it at start, and how that moves.
#[derive(Debug, Clone)]
pub struct AutoSizer {
    sys: Sys,
    /// The machine's bound at start (`MemAvailable` less the reserve); the cgroup's bound is
    /// read afresh every tick.
    machine_ceiling: Option<usize>,
    /// The reserve for the machine's memory.
    machine_reserve: usize,
}

/// One bound on the cache (the machine's, or the cgroup's), as read now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Constraint {
    /// The largest limit this bound allows.
    pub ceiling: usize,
    /// What is available under it now.
    pub available: usize,
    /// What to keep free under it.
    pub reserve: usize,
    /// The smallest limit it asks for.
    pub floor: usize,
}

impl AutoSizer {
    pub fn new(sys: Sys) -> AutoSizer {
        let total = sys.mem_total().unwrap_or(usize::MAX);
        let machine_reserve = reserve(total);
        let machine_ceiling = sys
            .mem_available()
            .map(|a| a.saturating_sub(machine_reserve));
        AutoSizer {
            sys,
            machine_ceiling,
            machine_reserve,
        }
    }

    /// What bounds the cache now: the machine's memory and the cgroup's, where readable.
    pub fn read(&self) -> Vec<Constraint> {
        let machine =
            self.machine_ceiling
                .zip(self.sys.mem_available())
                .map(|(ceiling, available)| Constraint {
                    ceiling,
                    available,
                    reserve: self.machine_reserve,
                    floor: FLOOR,
                });
        let cgroup = self
            .sys
            .memory_cgroup()
            .and_then(|c| c.bounds())
            .map(|b| Constraint {
                ceiling: b.limit.saturating_sub(reserve(b.limit)),
                available: b.headroom,
                reserve: reserve(b.limit),
                floor: floor(b.limit),
            });
        machine.into_iter().chain(cgroup).collect()
    }

    /// The limit to start with: at start the process holds almost nothing, so what is
    /// available less the reserve, within the ceiling, under every bound; in whole MiB.
    pub fn initial(&self) -> usize {
        let bytes = self
            .read()
            .iter()
            .map(|c| {
                c.available
                    .saturating_sub(c.reserve)
                    .min(c.ceiling)
                    .max(c.floor.min(c.ceiling))
            })
            .min()
            // Nothing readable bounds us: the smallest limit, safe anywhere.
            .unwrap_or(FLOOR);
        bytes / MIB * MIB
    }

    /// The limit after one tick from the current one (unchanged when nothing is readable).
    pub fn next(&self, limit: usize) -> usize {
        self.read()
            .iter()
            .map(|c| adjust(limit, *c))
            .min()
            .unwrap_or(limit)
    }

    /// A line for `-v` describing what bounds the cache.
    pub fn describe(&self) -> String {
        let machine = match self.sys.mem_available() {
            Some(a) => format!("{} MiB available", a / MIB),
            None => "MemAvailable unreadable".to_string(),
        };
        let cgroup = match self.sys.memory_cgroup() {
            Some(cg) => {
                let v = match cg.version() {
                    Version::V1 => "v1",
                    Version::V2 => "v2",
                };
                match cg.bounds() {
                    Some(b) => format!(
                        "memory cgroup {v} {}: limit {} MiB, headroom {} MiB",
                        cg.dir().display(),
                        b.limit / MIB,
                        b.headroom / MIB
                    ),
                    None => format!("memory cgroup {v} {}: no limit", cg.dir().display()),
                }
            }
            None => "no memory cgroup".to_string(),
        };
        format!("{machine}; {cgroup}")
    }
}

/// Bytes the cache may use at start on this machine.
pub fn auto_limit() -> usize {
    AutoSizer::new(Sys::host()).initial()
}

/// The limit after one tick under one bound, from the current limit. Moves in whole MiB.
pub fn adjust(limit: usize, c: Constraint) -> usize {
    let next = if c.available < c.reserve {
        let short = (c.reserve - c.available).div_ceil(MIB) * MIB;
        limit.saturating_sub(short)
    } else if c.available > 2 * c.reserve {
        let grow = ((c.available - 2 * c.reserve) / 2) / MIB * MIB;
        limit.saturating_add(grow)
    } else {
        limit
    };
    // Rounded down to whole MiB when the ceiling moved under the limit.
    let ceiling = c.ceiling / MIB * MIB;
    next.min(ceiling).max(c.floor.min(ceiling))
}

fn parse_meminfo(info: &str, field: &str) -> Option<usize> {
    let line = info.lines().find(|l| l.starts_with(field))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// A mount of a cgroup hierarchy: the cgroup its root shows and where it is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    root: String,
    point: String,
}

/// The cgroup mount holding the memory controller (v1) or the unified hierarchy (v2), from
/// `/proc/self/mountinfo` (proc(5): fields up to a lone `-`, then type, source, options).
fn find_mount(mountinfo: &str, version: Version) -> Option<Mount> {
    mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        let pre: Vec<&str> = pre.split(' ').collect();
        let mut post = post.split(' ');
        let fstype = post.next()?;
        let options = post.nth(1).unwrap_or("");
        let wanted = match version {
            Version::V1 => fstype == "cgroup" && options.split(',').any(|o| o == "memory"),
            Version::V2 => fstype == "cgroup2",
        };
        (wanted && pre.len() >= 5).then(|| Mount {
            root: unescape(pre[3]),
            point: unescape(pre[4]),
        })
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The process's cgroup path in the memory hierarchy (v1: the line naming the `memory`
/// controller; v2: the `0::` line), from `/proc/self/cgroup`.
fn cgroup_path(membership: &str, version: Version) -> Option<String> {
    membership.lines().find_map(|line| {
        let mut f = line.splitn(3, ':');
        let id = f.next()?;
        let controllers = f.next()?;
        let path = f.next()?;
        let wanted = match version {
            Version::V1 => controllers.split(',').any(|c| c == "memory"),
            Version::V2 => id == "0" && controllers.is_empty(),
        };
        wanted.then(|| path.to_string())
    })
}

fn read_number(path: &Path) -> Option<usize> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A v1 limit: the kernel writes "unlimited" as the largest page-aligned counter
/// (0x7FFFFFFFFFFFF000 on 64-bit, less on others); anything from 2^62 up means no limit.
fn v1(limit: usize) -> Option<usize> {
    (u64::try_from(limit).unwrap_or(u64::MAX) < (1 << 62)).then_some(limit)
}

/// A field of `memory.stat` in `dir`.
fn stat_field(dir: &Path, field: &str) -> Option<usize> {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    stat.lines().find_map(|l| {
        let (name, value) = l.split_once(' ')?;
        (name == field).then(|| value.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests;
