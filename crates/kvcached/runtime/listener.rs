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

    pub fn fd(&self) -> i32 {
        match self {
            Listener::Tcp(l, _) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        }
    }
}

/// Bind every listening socket the configuration asks for.
pub fn bind_listeners(config: &Config) -> Result<Vec<Listener>, String> {
    let mut out = Vec::new();
    if let Some(path) = &config.unix_socket {
        out.push(bind_unix(path, config.unix_mask, config.backlog)?);
        return Ok(out);
    }
    for entry in &config.listeners {
        if entry.port_or(config.tcp_port) == 0 {
            continue;
        }
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
            out.push(bind_tcp(addr, config.backlog, tls)?);
        }
    }
    if out.is_empty() {
        return Err("nothing to listen on: set -p, -l or -s".into());
    }
    Ok(out)
}

fn bind_tcp(addr: SocketAddr, backlog: i32, tls: Option<Peer>) -> Result<Listener, String> {
    let fail = |e: io::Error| format!("failed to listen on TCP {addr}: {e}");
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(fail)?;
    socket.set_reuse_address(true).map_err(fail)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true).map_err(fail)?;
    }
    socket.bind(&addr.into()).map_err(fail)?;
    socket.listen(backlog).map_err(fail)?;
    socket.set_nonblocking(true).map_err(fail)?;
    Ok(Listener::Tcp(socket.into(), tls))
}

fn bind_unix(path: &Path, mask: u32, backlog: i32) -> Result<Listener, String> {
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
    socket.listen(backlog).map_err(fail)?;
    socket.set_nonblocking(true).map_err(fail)?;
    Ok(Listener::Unix(socket.into()))
}
