//! Automatic memory sizing (`-m auto`): how much memory the cache may use on this machine.

/// Memory kept free for the rest of the system when sizing automatically.
const RESERVE: usize = 256 << 20;

/// The smallest automatic limit.
const FLOOR: usize = 64 << 20;

/// Bytes the cache may use: what is available to this process (the cgroup limit, else the
/// system's available memory), less a reserve.
pub fn auto_limit() -> usize {
    let available = cgroup_limit()
        .into_iter()
        .chain(mem_available())
        .min()
        .unwrap_or(FLOOR + RESERVE);
    available.saturating_sub(RESERVE).max(FLOOR)
}

/// `memory.max` of this process's cgroup (v2), if set.
fn cgroup_limit() -> Option<usize> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let max = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/memory.max")).ok()?;
    max.trim().parse().ok()
}

/// `MemAvailable` from /proc/meminfo.
pub fn mem_available() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&info, "MemAvailable:")
}

fn parse_meminfo(info: &str, field: &str) -> Option<usize> {
    let line = info.lines().find(|l| l.starts_with(field))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_field() {
        let info = "MemTotal: 100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_meminfo(info, "MemAvailable:"), Some(2 << 20));
        assert_eq!(parse_meminfo(info, "Nope:"), None);
    }

    #[test]
    fn auto_limit_is_at_least_the_floor() {
        assert!(auto_limit() >= FLOOR);
    }
}
