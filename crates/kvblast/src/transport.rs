//! Where servers are and how to reach them: TCP ("host[:port]", port 11211 when left out), a
//! unix socket ("unix:/path", or any name starting with '/'), or UDP ("udp:host[:port]"; one
//! request per datagram, memcached's 8-byte frame header, see [`UDP_HEADER`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use mio::event::Source;
use mio::{Interest, Registry, Token};

/// A server that cannot be reached as given, or TLS settings that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{server}: UDP needs host[:port]")]
    UdpNeedsHost { server: String },
    #[error("{server}: {source}")]
    Resolve { server: String, source: io::Error },
    #[error("{server}: no address")]
    NoAddress { server: String },
    #[error(transparent)]
    Tls(#[from] kvtls::Error),
}

/// A server's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
    Udp(SocketAddr),
}

/// Bytes of memcached's UDP frame header: request id, sequence number, datagram count,
/// reserved (big-endian u16 each).
pub const UDP_HEADER: usize = 8;

/// The largest request kvblast sends in one UDP datagram (loopback allows 65507 bytes of
/// payload; memcached reads requests into a 64 KiB buffer).
pub const UDP_MAX_REQUEST: usize = 65_000;

impl Endpoint {
    /// Parse and resolve a server as given on the command line.
    pub fn parse(server: &str) -> Result<Endpoint, TransportError> {
        if let Some(path) = server.strip_prefix("unix:") {
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        if server.starts_with('/') {
            return Ok(Endpoint::Unix(PathBuf::from(server)));
        }
        if let Some(rest) = server.strip_prefix("udp:") {
            return match Endpoint::parse(rest)? {
                Endpoint::Tcp(a) => Ok(Endpoint::Udp(a)),
                _ => Err(TransportError::UdpNeedsHost {
                    server: server.into(),
                }),
            };
        }
        let with_port = if server
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            server.to_string()
        } else {
            format!("{server}:11211")
        };
        with_port
            .to_socket_addrs()
            .map_err(|source| TransportError::Resolve {
                server: server.into(),
                source,
            })?
            .next()
            .map(Endpoint::Tcp)
            .ok_or_else(|| TransportError::NoAddress {
                server: server.into(),
            })
    }

    /// The name ketama hashes for this server (libmemcached leaves ":11211" out).
    pub fn ring_name(&self, given: &str) -> String {
        let given = given.strip_prefix("udp:").unwrap_or(given);
        match self {
            Endpoint::Tcp(_) | Endpoint::Udp(_) => match given.rsplit_once(':') {
                Some((h, p)) => match p.parse::<u16>() {
                    Ok(port) => crate::route::point_name(h, port),
                    Err(_) => given.to_string(),
                },
                None => given.to_string(),
            },
            Endpoint::Unix(p) => p.display().to_string(),
        }
    }

    /// A blocking connection with read and write timeouts (for `stats`; a UDP server's stats
    /// are read over TCP at the same address, where memcached also listens).
    pub fn connect_blocking(
        &self,
        timeout: Duration,
        tls: Option<&Tls>,
    ) -> io::Result<Box<dyn ReadWrite>> {
        match self {
            Endpoint::Tcp(a) | Endpoint::Udp(a) => {
                let s = std::net::TcpStream::connect_timeout(a, timeout)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                match (tls, self) {
                    (Some(tls), Endpoint::Tcp(_)) => {
                        let mut t = tls.wrap(s, a)?;
                        t.handshake_blocking()?;
                        Ok(Box::new(t))
                    }
                    _ => Ok(Box::new(s)),
                }
            }
            Endpoint::Unix(p) => {
                let s = std::os::unix::net::UnixStream::connect(p)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                Ok(Box::new(s))
            }
        }
    }

    /// A non-blocking connection for an event loop (TCP_NODELAY on); over TLS to a TCP
    /// server when `tls` is given (the handshake runs with the first reads and writes).
    pub fn connect(&self, timeout: Duration, tls: Option<&Tls>) -> io::Result<Stream> {
        match self {
            Endpoint::Tcp(a) => {
                let s = std::net::TcpStream::connect_timeout(a, timeout)?;
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                Stream::tcp(mio::net::TcpStream::from_std(s), tls, a)
            }
            Endpoint::Unix(p) => {
                let s = std::os::unix::net::UnixStream::connect(p)?;
                s.set_nonblocking(true)?;
                Ok(Stream::Unix(mio::net::UnixStream::from_std(s)))
            }
            Endpoint::Udp(a) => {
                let local: SocketAddr = if a.is_ipv4() {
                    (std::net::Ipv4Addr::LOCALHOST, 0).into()
                } else {
                    (std::net::Ipv6Addr::LOCALHOST, 0).into()
                };
                let local = if a.ip().is_loopback() {
                    local
                } else if a.is_ipv4() {
                    (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
                } else {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                };
                let s = std::net::UdpSocket::bind(local)?;
                // A bigger receive buffer loses fewer replies in bursts (the kernel caps it
                // at net.core.rmem_max; failure to raise it is harmless).
                let size: libc::c_int = 4 << 20;
                // SAFETY: setsockopt on a socket this function owns, with a valid c_int.
                unsafe {
                    libc::setsockopt(
                        std::os::fd::AsRawFd::as_raw_fd(&s),
                        libc::SOL_SOCKET,
                        libc::SO_RCVBUF,
                        (&size as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    );
                }
                s.connect(a)?;
                s.set_nonblocking(true)?;
                Ok(Stream::Udp(mio::net::UdpSocket::from_std(s)))
            }
        }
    }

    pub fn is_udp(&self) -> bool {
        matches!(self, Endpoint::Udp(_))
    }

    /// A connection opened without waiting, to reconnect from inside an event loop: a TCP
    /// connect completes (or fails) later, reported as writability (or an error event).
    pub fn connect_nonblocking(&self, tls: Option<&Tls>) -> io::Result<Stream> {
        match self {
            Endpoint::Tcp(a) => {
                let s = mio::net::TcpStream::connect(*a)?;
                s.set_nodelay(true)?;
                Stream::tcp(s, tls, a)
            }
            Endpoint::Unix(p) => Ok(Stream::Unix(mio::net::UnixStream::connect(p)?)),
            // Nothing to wait for.
            Endpoint::Udp(_) => self.connect(Duration::ZERO, None),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Udp(a) => write!(f, "udp:{a}"),
        }
    }
}

/// Read + Write, for boxed blocking streams.
pub trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// TLS to the servers (`--tls`): the client configuration, built once, and its settings.
#[derive(Clone)]
pub struct Tls {
    pub config: std::sync::Arc<kvtls::rustls::ClientConfig>,
    pub settings: kvtls::client::Settings,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("settings", &self.settings)
            .finish()
    }
}

impl Tls {
    /// Read the files the settings name.
    pub fn new(settings: kvtls::client::Settings) -> Result<Tls, TransportError> {
        Ok(Tls {
            config: settings.config()?,
            settings,
        })
    }

    /// A TLS session over `sock`, connected to `server` (its address is the name checked
    /// unless the settings name another).
    fn wrap<S: Read + Write>(
        &self,
        sock: S,
        server: &SocketAddr,
    ) -> io::Result<kvtls::TlsStream<S>> {
        let session = self
            .settings
            .connect(&self.config, &server.ip().to_string())
            .map_err(io::Error::other)?;
        Ok(kvtls::TlsStream::new(session, sock))
    }
}

/// A non-blocking stream registered with an event loop. For UDP, one `write` sends one
/// datagram and one `read` receives one.
#[derive(Debug)]
pub enum Stream {
    Tcp(mio::net::TcpStream),
    Unix(mio::net::UnixStream),
    Udp(mio::net::UdpSocket),
    /// TLS over TCP; the handshake runs with the first reads and writes.
    Tls(Box<kvtls::TlsStream<mio::net::TcpStream>>),
}

impl Stream {
    pub fn is_udp(&self) -> bool {
        matches!(self, Stream::Udp(_))
    }

    /// A short read from TLS says nothing of the socket: read until it would block.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// A TCP connection to `server`, in a TLS session when `tls` is given.
    fn tcp(s: mio::net::TcpStream, tls: Option<&Tls>, server: &SocketAddr) -> io::Result<Stream> {
        match tls {
            None => Ok(Stream::Tcp(s)),
            Some(tls) => Ok(Stream::Tls(Box::new(tls.wrap(s, server)?))),
        }
    }

    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Udp(_) => Ok(()),
            Stream::Tls(s) => s.socket().shutdown(std::net::Shutdown::Both),
        };
    }

    fn source(&mut self) -> &mut dyn Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
            Stream::Udp(s) => s,
            Stream::Tls(s) => s.socket_mut(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Udp(s) => s.recv(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Udp(s) => s.send(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    /// TLS: send the records still waiting (what the socket does not take goes with the
    /// next writability event).
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tls(s) => s.flush(),
            _ => Ok(()),
        }
    }
}

impl Source for Stream {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        self.source().register(r, t, i)
    }

    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        self.source().reregister(r, t, i)
    }

    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        self.source().deregister(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        let parse = |s: &str| Endpoint::parse(s).ok();
        assert_eq!(
            parse("127.0.0.1:5000"),
            Some(Endpoint::Tcp(
                "127.0.0.1:5000".parse().unwrap_or_else(|_| unreachable!())
            ))
        );
        assert_eq!(
            parse("127.0.0.1"),
            Some(Endpoint::Tcp(
                "127.0.0.1:11211".parse().unwrap_or_else(|_| unreachable!())
            ))
        );
        assert_eq!(
            parse("unix:/tmp/mc.sock"),
            Some(Endpoint::Unix("/tmp/mc.sock".into()))
        );
        assert_eq!(
            parse("/tmp/mc.sock"),
            Some(Endpoint::Unix("/tmp/mc.sock".into()))
        );
        assert_eq!(
            parse("udp:127.0.0.1:7"),
            Some(Endpoint::Udp(
                "127.0.0.1:7".parse().unwrap_or_else(|_| unreachable!())
            ))
        );
        let e = Endpoint::parse("udp:/tmp/x").map(|_| ());
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("udp:/tmp/x: UDP needs host[:port]".to_string())
        );
        assert!(matches!(
            Endpoint::parse("no-such-host.invalid"),
            Err(TransportError::Resolve { .. })
        ));
        let u = Endpoint::parse("udp:127.0.0.1:11212").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.ring_name("udp:127.0.0.1:11212"), "127.0.0.1:11212");
        let e = Endpoint::parse("127.0.0.1:11211").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.ring_name("127.0.0.1:11211"), "127.0.0.1");
        assert_eq!(e.ring_name("127.0.0.1:11212"), "127.0.0.1:11212");
    }
}
