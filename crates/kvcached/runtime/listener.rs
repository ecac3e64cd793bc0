//! The listening sockets: binding what the configuration asks for (TCP addresses or one unix
//! socket), and the handle each worker polls a duplicate of.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;

use socket2::{Domain, Socket, Type};

use kvtls::server::Peer;

use crate::setup::config::{Config, ListenTls};

/// A listening socket. A TCP listener carries its TLS policy (`None`: plaintext).
pub enum Listener {
    Tcp(std::net::TcpListener, Option<Peer>),
    Unix(std::os::unix::net::UnixListener),
}

impl Listener {
    pub fn try_clone(&self) -> io::Result<Listener> {
        Ok(match self {
            Listener::Tcp(l, tls) => Listener::Tcp(l.try_clone()?, *tls),
            Listener::Unix(l) => Listener::Unix(l.try_clone()?),
        })
    }

    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l, _) => match l.local_addr() {
                Ok(a) => format!("tcp:{a}"),
                Err(_) => "tcp:?".into(),
            },
            Listener::Unix(l) => match l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
            {
                Some(p) => format!("unix:{p}"),
                None => "unix:?".into(),
            },
        }
    }

    /// Start accepting connections on a socket [`bind_listeners`] bound (the server does
    /// once its cache is ready, as memcached listens last: a start that fails on its
    /// flash files or its snapshot never accepted a connection, while a port already taken
    /// fails the start before anything is loaded).
    pub fn listen(&self, backlog: i32) -> Result<(), String> {
        let r = match self {
            Listener::Tcp(l, _) => socket2::SockRef::from(l).listen(backlog),
            Listener::Unix(l) => socket2::SockRef::from(l).listen(backlog),
        };
        r.map_err(|e| format!("failed to listen on {}: {e}", self.describe()))
    }

    pub fn fd(&self) -> i32 {
        match self {
            Listener::Tcp(l, _) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        }
    }
}

/// Bind every listening socket the configuration asks for: the unix socket, or a TCP socket
/// per address of each `-l` entry. As in memcached, `-p 0` turns TCP off whatever ports the
/// entries name, and a port of 0 (`-p -1`, `-l HOST:0`) is one the kernel picks. That may
/// leave nothing to listen on, which memcached also starts with. The sockets are bound, not
/// yet listening ([`Listener::listen`]).
pub fn bind_listeners(config: &Config) -> Result<Vec<Listener>, String> {
    let mut out = Vec::new();
    if let Some(path) = &config.unix_socket {
        out.push(bind_unix(path, config.unix_mask)?);
        return Ok(out);
    }
    if config.tcp_port == 0 {
        return Ok(out);
    }
    for entry in &config.listeners {
        let addrs = entry
            .socket_addrs(config.tcp_port)
            .map_err(|e| format!("failed to resolve {:?}: {e}", entry.host))?;
        if addrs.is_empty() {
            return Err(format!("{:?} resolves to no address", entry.host));
        }
        let tls = match (config.ssl.enabled, entry.tls) {
            (false, _) | (true, ListenTls::Plain) => None,
            (true, ListenTls::Default) => Some(Peer::Default),
            (true, ListenTls::NoPeer) => Some(Peer::Never),
            (true, ListenTls::Peer) => Some(Peer::Require),
        };
        for addr in addrs {
            out.push(bind_tcp(addr, None, tls, config.reuseport)?);
        }
    }
    Ok(out)
}

/// The listening sockets worker `worker` polls. Without `-o reuseport`, duplicates of the
/// shared ones (`first`); with it, worker 0 takes `first` and every other worker binds a
/// socket of its own to each TCP address (the address `first` got, so port 0 works too),
/// in the same SO_REUSEPORT group, and the kernel spreads new connections over them. With
/// `cpu`, each of the worker's TCP sockets asks, by SO_INCOMING_CPU, for the connections
/// whose packets that CPU handles (a preference the kernel may not honour).
pub fn worker_listeners(
    config: &Config,
    first: &[Listener],
    worker: usize,
    cpu: Option<usize>,
) -> Result<Vec<Listener>, String> {
    let mut out = Vec::with_capacity(first.len());
    for l in first {
        let mine = match l {
            Listener::Tcp(shared, tls) if config.reuseport && worker > 0 => {
                let addr = shared
                    .local_addr()
                    .map_err(|e| format!("a listening socket's address: {e}"))?;
                bind_tcp(addr, Some(config.backlog), *tls, true)?
            }
            _ => l
                .try_clone()
                .map_err(|e| format!("failed to share a listening socket: {e}"))?,
        };
        if let (Listener::Tcp(s, _), Some(cpu), true) = (&mine, cpu, config.reuseport) {
            socket2::SockRef::from(s)
                .set_cpu_affinity(cpu)
                .map_err(|e| format!("SO_INCOMING_CPU {cpu}: {e}"))?;
        }
        out.push(mine);
    }
    Ok(out)
}

/// The CPU worker `worker` runs on with `-o cpu_affinity`: the worker-th of the CPUs this
/// process may run on (wrapping around). None if the allowed set cannot be read.
pub fn worker_cpu(worker: usize) -> Option<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills at most
    // its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a live cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return None;
    }
    let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, inside `set`.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect();
    (!allowed.is_empty()).then(|| allowed[worker % allowed.len()])
}

/// Pin the calling thread to `cpu`.
pub fn pin_to(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; `cpu` is checked against its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::other(format!("CPU {cpu} is out of range")));
    }
    // SAFETY: `cpu` is inside `set` (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a live cpu_set_t of `size` bytes; 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, size, &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A TCP socket bound to `addr`, listening with `backlog` if given (else see
/// [`Listener::listen`]).
fn bind_tcp(
    addr: SocketAddr,
    backlog: Option<i32>,
    tls: Option<Peer>,
    reuseport: bool,
) -> Result<Listener, String> {
    let fail = |e: io::Error| format!("failed to listen on TCP {addr}: {e}");
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(fail)?;
    socket.set_reuse_address(true).map_err(fail)?;
    if reuseport {
        socket.set_reuse_port(true).map_err(fail)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(true).map_err(fail)?;
    }
    // Accepted connections take TCP_NODELAY from the listener (Linux), so the ring's
    // accepts need no `setsockopt` per connection.
    socket.set_tcp_nodelay(true).map_err(fail)?;
    socket.bind(&addr.into()).map_err(fail)?;
    if let Some(backlog) = backlog {
        socket.listen(backlog).map_err(fail)?;
    }
    socket.set_nonblocking(true).map_err(fail)?;
    Ok(Listener::Tcp(socket.into(), tls))
}

/// A unix socket bound at `path` with permissions `mask` (see [`Listener::listen`]).
fn bind_unix(path: &Path, mask: u32) -> Result<Listener, String> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let fail = |e: io::Error| format!("failed to listen on unix socket {}: {e}", path.display());
    // Like memcached, replace a stale socket file, but never another kind of file.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            std::fs::remove_file(path).map_err(fail)?;
        }
    }
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(fail)?;
    let addr = socket2::SockAddr::unix(path).map_err(fail)?;
    socket.bind(&addr).map_err(fail)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mask & 0o777)).map_err(fail)?;
    socket.set_nonblocking(true).map_err(fail)?;
    Ok(Listener::Unix(socket.into()))
}

/// memcached's `MEMCACHED_PORT_FILENAME`: with that variable set and no unix socket, the
/// ports of the sockets bound (`tcp`, then `udp`) are appended to `PATH.lck`, a line each
/// (`TCP INET: 11211`, `UDP INET6: 41234`), and the file is then renamed to `PATH`, so a
/// reader that sees `PATH` sees every line. Tests give `-p -1` and read the port from it.
/// A file that cannot be written is reported and the server starts anyway, as memcached.
pub fn write_port_file(path: &Path, tcp: &[Listener], udp: &[mio::net::UdpSocket]) {
    use std::io::Write;
    let mut lck = path.as_os_str().to_owned();
    lck.push(".lck");
    let lck = std::path::PathBuf::from(lck);
    let mut lines = String::new();
    let addrs = tcp
        .iter()
        .filter_map(|l| match l {
            Listener::Tcp(l, _) => Some(("TCP", l.local_addr())),
            Listener::Unix(_) => None,
        })
        .chain(udp.iter().map(|s| ("UDP", s.local_addr())));
    for (kind, addr) in addrs {
        if let Ok(addr) = addr {
            let family = if addr.is_ipv4() { "INET" } else { "INET6" };
            lines.push_str(&format!("{kind} {family}: {}\n", addr.port()));
        }
    }
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&lck)
        .and_then(|mut f| f.write_all(lines.as_bytes()));
    match written {
        Ok(()) => {
            if let Err(e) = std::fs::rename(&lck, path) {
                tracing::warn!("MEMCACHED_PORT_FILENAME: renaming {}: {e}", lck.display());
            }
        }
        Err(e) => eprintln!("Failed to open \"{}\": {e}", lck.display()),
    }
}
