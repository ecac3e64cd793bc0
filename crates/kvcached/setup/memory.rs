//! Automatic memory sizing (`-m auto`): how much memory the cache may use on this machine,
//! and, while it runs, giving memory back when the machine runs short and taking it again
//! when memory is free (OSv's idea: a cache should not make the rest of the system swap or
//! be killed for memory it holds only as an optimisation).
//!
//! The limit starts at what is available less a reserve (the *ceiling*). Every tick the
//! server looks at what is available now (the smaller of the cgroup's headroom and
//! `MemAvailable`): below the reserve, the limit drops by the shortfall (the engine evicts
//! and unmaps segments); above twice the reserve, it grows by half the excess, up to the
//! ceiling; in between nothing changes (hysteresis). Never below [`FLOOR`].

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

/// A meminfo file to read instead of /proc/meminfo (and no cgroup), for tests.
const MEMINFO_ENV: &str = "KVCACHED_MEMINFO";

fn meminfo_override() -> Option<std::path::PathBuf> {
    std::env::var_os(MEMINFO_ENV).map(Into::into)
}

/// This process's cgroup (v2) directory.
fn cgroup_dir() -> Option<String> {
    if meminfo_override().is_some() {
        return None;
    }
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(format!("/sys/fs/cgroup{path}"))
}

fn cgroup_value(name: &str) -> Option<usize> {
    let v = std::fs::read_to_string(format!("{}/{name}", cgroup_dir()?)).ok()?;
    v.trim().parse().ok()
}

/// `memory.max` of this process's cgroup (v2), if set.
fn cgroup_limit() -> Option<usize> {
    cgroup_value("memory.max")
}

/// What the cgroup still allows (`memory.max - memory.current`), if it has a limit.
fn cgroup_headroom() -> Option<usize> {
    Some(cgroup_limit()?.saturating_sub(cgroup_value("memory.current")?))
}

/// `MemAvailable` from /proc/meminfo.
pub fn mem_available() -> Option<usize> {
    let path = meminfo_override().unwrap_or_else(|| "/proc/meminfo".into());
    let info = std::fs::read_to_string(path).ok()?;
    parse_meminfo(&info, "MemAvailable:")
}

/// Memory available to this process now.
pub fn available_now() -> Option<usize> {
    cgroup_headroom().into_iter().chain(mem_available()).min()
}

/// The limit after one tick, from the current one, what is available now and the ceiling
/// (the limit `-m auto` started with). Moves in whole MiB.
pub fn adjust(limit: usize, available: usize, ceiling: usize) -> usize {
    const MIB: usize = 1 << 20;
    let floor = FLOOR.min(ceiling);
    let next = if available < RESERVE {
        let short = (RESERVE - available).div_ceil(MIB) * MIB;
        limit.saturating_sub(short)
    } else if available > 2 * RESERVE {
        let grow = ((available - 2 * RESERVE) / 2) / MIB * MIB;
        limit.saturating_add(grow).min(ceiling)
    } else {
        limit
    };
    next.clamp(floor, ceiling.max(floor))
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
    fn adjust_gives_back_under_pressure_and_takes_again_up_to_the_ceiling() {
        const MIB: usize = 1 << 20;
        let ceiling = 1024 * MIB;
        // Plenty available: stays at (or grows back to) the ceiling.
        assert_eq!(adjust(ceiling, 4096 * MIB, ceiling), ceiling);
        assert_eq!(adjust(512 * MIB, 4096 * MIB, ceiling), ceiling);
        // Growth is half the excess over twice the reserve.
        assert_eq!(
            adjust(512 * MIB, 2 * RESERVE + 100 * MIB, ceiling),
            562 * MIB
        );
        // Between the reserve and twice it: no change.
        assert_eq!(adjust(700 * MIB, RESERVE + MIB, ceiling), 700 * MIB);
        // Short by 100 MiB: the limit drops by 100 MiB.
        assert_eq!(adjust(700 * MIB, RESERVE - 100 * MIB, ceiling), 600 * MIB);
        // Never below the floor.
        assert_eq!(adjust(80 * MIB, 0, ceiling), FLOOR);
        assert_eq!(adjust(FLOOR, 0, ceiling), FLOOR);
    }

    #[test]
    fn auto_limit_is_at_least_the_floor() {
        assert!(auto_limit() >= FLOOR);
    }
}
