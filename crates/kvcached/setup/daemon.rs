//! Process setup around the server: daemonizing, the pid file, dropping privileges,
//! locking memory, and the core-file and file-descriptor limits.
//!
//! memcached's order, which kvcached should keep: raise the core limit (`-r`), raise the
//! descriptor limit (`-c`), drop privileges (`-u`), daemonize (`-d`), lock memory (`-k`),
//! then, once listening, write the pid file (`-P`), and remove it at exit when
//! daemonized. [`daemonize_with`] forks, so it is `unsafe`: call it before any thread is
//! started.

use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Descriptors kept beyond `-c` for listeners, the poller, files and the like.
pub const FD_RESERVE: u64 = 64;

/// Become a background process the way memcached's `daemonize()` does: fork (the parent
/// exits 0), start a new session, `chdir /` unless `keep_cwd` (memcached keeps the directory
/// with `-r`, so cores land there), and point stdin, stdout and stderr at `/dev/null` unless
/// `keep_stdio` (memcached keeps them with `-v`).
///
/// # Safety
///
/// The calling thread must be the process's only thread. Only it survives `fork`: a lock
/// another thread held (the allocator's, stdio's, a `Mutex`) would stay locked in the child
/// for ever, and whatever that thread was doing would be left half done.
pub unsafe fn daemonize_with(keep_cwd: bool, keep_stdio: bool) -> io::Result<()> {
    // SAFETY: fork has no preconditions of its own; by the caller's contract no other thread
    // exists, so the child is a faithful copy of this single-threaded process.
    match unsafe { libc::fork() } {
        -1 => return Err(io::Error::last_os_error()),
        0 => {}
        // SAFETY: _exit ends the parent at once without running destructors or atexit
        // handlers, which belong to the child now.
        _ => unsafe { libc::_exit(0) },
    }
    // SAFETY: setsid has no preconditions; the child of a fork is never a group leader.
    if unsafe { libc::setsid() } == -1 {
        return Err(io::Error::last_os_error());
    }
    if !keep_cwd {
        std::env::set_current_dir("/")?;
    }
    if !keep_stdio {
        redirect_stdio_to_null()?;
    }
    Ok(())
}

fn redirect_stdio_to_null() -> io::Result<()> {
    let null = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    use std::os::fd::AsRawFd;
    for fd in [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: both descriptors are open (`null` lives until the end of this function);
        // dup2 atomically replaces the standard descriptor.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Write this process's id and a newline to `path`. Like memcached, write `PATH.tmp`
/// first and rename it over `path`, so a reader never sees an empty file.
pub fn write_pid_file(path: &Path) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        writeln!(f, "{}", std::process::id())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Remove the pid file (memcached does so at exit only when it daemonized).
pub fn remove_pid_file(path: &Path) -> io::Result<()> {
    fs::remove_file(path)
}

/// The pid in an existing pid file, when that process is still running and is not this
/// one: memcached warns about it before overwriting the file.
pub fn running_pid_in(path: &Path) -> Option<u32> {
    let text = fs::read_to_string(path).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    if pid == 0 || pid == std::process::id() || pid > i32::MAX as u32 {
        return None;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
        || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    alive.then_some(pid)
}

fn euid_is_root() -> bool {
    // SAFETY: getuid and geteuid have no preconditions and cannot fail.
    unsafe { libc::getuid() == 0 || libc::geteuid() == 0 }
}

/// `-u`: when running as root, become `user` (no supplementary groups, the user's group,
/// then the user), as memcached does. As root without a user this is an error, as in
/// memcached: give `-u root` to run as root on purpose. When not root, `user` is ignored.
pub fn drop_privileges(user: Option<&str>) -> Result<(), String> {
    if !euid_is_root() {
        return Ok(());
    }
    let user = match user {
        Some(u) if !u.is_empty() => u,
        _ => {
            return Err("can't run as root without the -u switch \
                        (add '-u root' to run as root anyway)"
                .into())
        }
    };
    let (uid, gid) = lookup_user(user)?;
    // SAFETY: setgroups with a zero count does not read the list pointer.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        let err = io::Error::last_os_error();
        // EPERM: already without the capability (a container); carry on, as memcached.
        if err.raw_os_error() != Some(libc::EPERM) {
            return Err(format!("failed to drop supplementary groups: {err}"));
        }
    }
    // SAFETY: setgid and setuid have no memory-safety preconditions; the group goes
    // first, while we still may change it.
    if unsafe { libc::setgid(gid) } != 0 || unsafe { libc::setuid(uid) } != 0 {
        return Err(format!(
            "failed to assume identity of user {user}: {}",
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The uid and gid of `user`, from the password database.
fn lookup_user(user: &str) -> Result<(libc::uid_t, libc::gid_t), String> {
    let name = CString::new(user).map_err(|_| format!("invalid user name {user:?}"))?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: passwd is plain data; an all-zero value is valid and is overwritten.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call: `name` is NUL-terminated, `pw` and
        // `result` are live locals, and `buf` is writable for `buf.len()` bytes.
        let rc = unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                &mut pw,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(format!(
                "can't look up the user {user}: {}",
                io::Error::from_raw_os_error(rc)
            ));
        }
        if result.is_null() {
            return Err(format!("can't find the user {user} to switch to"));
        }
        return Ok((pw.pw_uid, pw.pw_gid));
    }
}

/// `-k`: lock all current and future memory into RAM. memcached only warns when this
/// fails; so should the caller.
///
/// Pages are locked as they are first touched (`MCL_ONFAULT`, Linux 4.4), not populated at
/// once: the engine reserves address space for the largest index it may grow to and maps
/// segments lazily, and locking all of that up front would make it resident. Kernels
/// without `MCL_ONFAULT` get the plain lock.
pub fn lock_memory() -> Result<(), String> {
    let all = libc::MCL_CURRENT | libc::MCL_FUTURE;
    // SAFETY: mlockall takes only flags.
    if unsafe { libc::mlockall(all | libc::MCL_ONFAULT) } == 0 {
        return Ok(());
    }
    // SAFETY: as above.
    if unsafe { libc::mlockall(all) } != 0 {
        return Err(format!(
            "-k: mlockall() failed: {}",
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The type of getrlimit's resource argument (glibc uses its own enum type).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
type Resource = libc::__rlimit_resource_t;
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
type Resource = libc::c_int;

/// The soft open-file limit now (`None` if it cannot be read).
pub fn open_file_limit() -> Option<u64> {
    get_rlimit(libc::RLIMIT_NOFILE).ok().map(|l| l.rlim_cur)
}

fn get_rlimit(resource: Resource) -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(resource, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim)
}

fn set_rlimit(resource: Resource, lim: libc::rlimit) -> io::Result<()> {
    // SAFETY: `lim` is a valid rlimit, read only.
    if unsafe { libc::setrlimit(resource, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `-c`: make sure the open-file limit allows `max_conns` connections plus
/// [`FD_RESERVE`]. Only ever raises the limit: the soft limit up to what is needed,
/// and the hard limit too when privileged. Fails, as memcached does, when the limit
/// cannot be raised far enough.
pub fn raise_fd_limit(max_conns: usize) -> Result<(), String> {
    let needed = (max_conns as u64).saturating_add(FD_RESERVE);
    let cur = get_rlimit(libc::RLIMIT_NOFILE)
        .map_err(|e| format!("failed to read the open-file limit: {e}"))?;
    let infinite = libc::RLIM_INFINITY;
    if cur.rlim_cur == infinite || cur.rlim_cur >= needed {
        return Ok(());
    }
    let hard_ok = cur.rlim_max == infinite || cur.rlim_max >= needed;
    let want = libc::rlimit {
        rlim_cur: needed,
        rlim_max: if hard_ok { cur.rlim_max } else { needed },
    };
    if set_rlimit(libc::RLIMIT_NOFILE, want).is_ok() {
        return Ok(());
    }
    Err(format!(
        "failed to set the open-file limit (RLIMIT_NOFILE) to {needed} for -c {max_conns} \
         ({FD_RESERVE} kept for listeners and files; hard limit {}): start as root, raise \
         the hard limit (ulimit -Hn, LimitNOFILE= in a unit file) or ask for fewer \
         connections with -c",
        cur.rlim_max
    ))
}

/// `-r`: raise the core file size limit to unlimited, or else to the hard limit. Fails,
/// as memcached does, if the limit ends up 0 (no core files at all).
pub fn set_core_limit() -> Result<(), String> {
    let fail = || "failed to ensure core file creation (-r)".to_string();
    let cur = get_rlimit(libc::RLIMIT_CORE).map_err(|_| fail())?;
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    if set_rlimit(libc::RLIMIT_CORE, unlimited).is_err() {
        let to_hard = libc::rlimit {
            rlim_cur: cur.rlim_max,
            rlim_max: cur.rlim_max,
        };
        let _ = set_rlimit(libc::RLIMIT_CORE, to_hard);
    }
    match get_rlimit(libc::RLIMIT_CORE) {
        Ok(lim) if lim.rlim_cur != 0 => Ok(()),
        _ => Err(fail()),
    }
}

/// Take a write past the file size limit (`RLIMIT_FSIZE`) as an error (`EFBIG`) instead
/// of the signal that would kill the server: the flash tier and `-e`'s memory file then
/// report it, and the server goes on from memory.
pub fn ignore_file_size_signal() {
    // SAFETY: setting a standard signal's disposition to SIG_IGN; no handler runs.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kvcached-daemon-test-{}-{name}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn pid_file_round_trip() {
        let dir = scratch("pid");
        let path = dir.join("kvcached.pid");
        write_pid_file(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{}\n", std::process::id()));
        assert!(!dir.join("kvcached.pid.tmp").exists());
        // Our own pid does not count as "another running instance".
        assert_eq!(running_pid_in(&path), None);
        // Overwrite works.
        write_pid_file(&path).unwrap();
        remove_pid_file(&path).unwrap();
        assert!(!path.exists());
        assert!(remove_pid_file(&path).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pid_file_in_missing_directory_fails() {
        let dir = scratch("missing");
        let path = dir.join("no/such/dir/kvcached.pid");
        assert!(write_pid_file(&path).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn running_pid_detection() {
        let dir = scratch("running");
        let path = dir.join("p.pid");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        fs::write(&path, format!("{}\n", child.id())).unwrap();
        assert_eq!(running_pid_in(&path), Some(child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(running_pid_in(&path), None);
        fs::write(&path, "not a pid\n").unwrap();
        assert_eq!(running_pid_in(&path), None);
        assert_eq!(running_pid_in(&dir.join("absent")), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fd_limit_already_high_enough() {
        // Asking for no more than the current soft limit changes nothing and succeeds.
        let lim = get_rlimit(libc::RLIMIT_NOFILE).unwrap();
        if lim.rlim_cur > FD_RESERVE + 1 {
            let conns = (lim.rlim_cur - FD_RESERVE).min(1 << 20) as usize;
            raise_fd_limit(conns).unwrap();
            assert_eq!(
                get_rlimit(libc::RLIMIT_NOFILE).unwrap().rlim_cur,
                lim.rlim_cur
            );
        }
    }

    #[test]
    fn lookup_known_and_unknown_users() {
        assert_eq!(lookup_user("root").unwrap(), (0, 0));
        let err = lookup_user("no-such-user-kvcached").unwrap_err();
        assert!(err.contains("can't find the user"), "{err}");
        assert!(lookup_user("nul\0byte").is_err());
    }

    #[test]
    fn drop_privileges_without_user() {
        if euid_is_root() {
            let err = drop_privileges(None).unwrap_err();
            assert!(err.contains("-u"), "{err}");
            assert!(drop_privileges(Some("")).is_err());
        } else {
            // Not root: -u is ignored, as in memcached.
            drop_privileges(None).unwrap();
            drop_privileges(Some("nobody")).unwrap();
        }
    }
}
