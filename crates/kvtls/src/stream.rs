//! A TLS connection over a non-blocking socket, read and written like the socket itself.
//!
//! [`TlsStream`] is what a connection's `Read`/`Write` go through when its listener speaks TLS:
//! `read` gives plaintext and returns `WouldBlock` only once the socket has nothing more *and*
//! rustls holds no decrypted bytes, so an edge-triggered poller never misses input that
//! rustls already took off the socket. `write` hands plaintext to rustls and pushes the
//! records out; it refuses more (`WouldBlock`) while records from an earlier write still wait
//! for the socket, so rustls never buffers more than one write's worth. [`TlsStream::wants_write`]
//! tells the owner to wait for writability even when its own output buffer is empty (the
//! handshake's flights, the tail of a record).
//!
//! Failures are classified for memcached's counters as memcached counts them: an error in the
//! peer's first flight, before this side has sent anything, is a handshake error
//! (`ssl_handshake_errors`: what memcached's `SSL_accept` at accept time fails on), any later
//! one a protocol error (`ssl_proto_errors`: what its `SSL_read` fails on, a refused client
//! certificate included). Either way the alert rustls wants to send is written (best effort)
//! and the read fails, which closes the connection.

use std::io::{self, Read, Write};

use rustls::Connection;

/// The largest plaintext one `write` hands to rustls: memcached's default `ssl_wbuf_size`
/// (16 KiB, one full TLS record).
pub const DEFAULT_WRITE_CHUNK: usize = 16 * 1024;

/// How a TLS connection failed, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// In the peer's first flight, before this side sent anything: plaintext on a TLS port,
    /// no protocol version or cipher in common.
    Handshake,
    /// After it: a client certificate refused or missing, an alert from the peer, a record
    /// that does not decrypt, an unexpected message.
    Protocol,
}

/// A TLS session over a socket `S` (client or server side).
pub struct TlsStream<S> {
    conn: Connection,
    sock: S,
    /// Plaintext bytes one `write` takes at most.
    chunk: usize,
    failure: Option<Failure>,
    /// The handshake completed at some point (for [`TlsStream::established`]).
    established: bool,
    /// Records went to the socket: the peer's first flight was answered (a server's), or
    /// this side spoke first (a client's).
    spoke: bool,
}

impl<S: std::fmt::Debug> std::fmt::Debug for TlsStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("sock", &self.sock)
            .field("handshaking", &self.conn.is_handshaking())
            .field("failure", &self.failure)
            .finish()
    }
}

impl<S: Read + Write> TlsStream<S> {
    /// Wrap a fresh rustls connection around a connected socket.
    pub fn new(conn: impl Into<Connection>, sock: S) -> TlsStream<S> {
        let mut conn = conn.into();
        // rustls buffers at most this much of plaintext written during the handshake and of
        // records waiting for the socket (the default is 64 KiB).
        conn.set_buffer_limit(Some(2 * DEFAULT_WRITE_CHUNK + 1024));
        TlsStream {
            conn,
            sock,
            chunk: DEFAULT_WRITE_CHUNK,
            failure: None,
            established: false,
            spoke: false,
        }
    }

    /// Set the largest plaintext one `write` takes (memcached's `ssl_wbuf_size`).
    pub fn set_write_chunk(&mut self, bytes: usize) {
        self.chunk = bytes.max(1);
        self.conn
            .set_buffer_limit(Some(2 * self.chunk.max(DEFAULT_WRITE_CHUNK) + 1024));
    }

    /// The socket underneath.
    pub fn socket(&self) -> &S {
        &self.sock
    }

    /// The socket underneath, for registering with a poller.
    pub fn socket_mut(&mut self) -> &mut S {
        &mut self.sock
    }

    /// The socket underneath, the session dropped (a connection being closed).
    pub fn into_socket(self) -> S {
        self.sock
    }

    /// The rustls connection (peer certificates, negotiated version, ...).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Whether the handshake is still under way.
    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Whether the handshake completed at some point.
    pub fn established(&self) -> bool {
        self.established || !self.conn.is_handshaking()
    }

    /// How the session failed, once it has.
    pub fn failure(&self) -> Option<Failure> {
        self.failure
    }

    /// Whether records wait for the socket to take them: wait for writability.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Write waiting records until done or the socket would block (`Ok(true)`: all written).
    pub fn flush_records(&mut self) -> io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(_) => self.spoke = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Queue a `close_notify` alert and try to send it (best effort; for an orderly close).
    pub fn close_notify(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush_records();
    }

    fn fail(&mut self, e: rustls::Error) -> io::Error {
        let kind = if self.spoke || self.established() {
            Failure::Protocol
        } else {
            Failure::Handshake
        };
        self.failure = Some(kind);
        // rustls queued an alert telling the peer why; it is all that is left to say.
        let _ = self.flush_records();
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    /// Drive a blocking socket until the handshake completes (clients with blocking sockets:
    /// the replica's link, kvblast's stats connection).
    pub fn handshake_blocking(&mut self) -> io::Result<()> {
        while self.conn.is_handshaking() {
            if self.conn.wants_write() {
                self.flush_records()?;
                continue;
            }
            match self.conn.read_tls(&mut self.sock) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during the TLS handshake",
                    ))
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if let Err(e) = self.conn.process_new_packets() {
                return Err(self.fail(e));
            }
        }
        self.established = true;
        self.flush_records()?;
        Ok(())
    }
}

impl<S: Read + Write> Read for TlsStream<S> {
    /// Plaintext from the peer: `Ok(0)` at the end of the session (`close_notify` or the
    /// socket's end), `WouldBlock` when neither rustls nor the socket has more now.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(f) = self.failure {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("TLS session failed ({f:?})"),
            ));
        }
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The socket ended without a close_notify: to the owner, the end.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            let got = loop {
                match self.conn.read_tls(&mut self.sock) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            match got {
                // The end of the socket: the reader reports it (UnexpectedEof) once the
                // records already read are processed.
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Handshake flights owed to the peer go out now; what the socket does not
                    // take waits for writability (`wants_write`).
                    self.flush_records()?;
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            if let Err(e) = self.conn.process_new_packets() {
                return Err(self.fail(e));
            }
            if !self.conn.is_handshaking() {
                self.established = true;
            }
            if self.conn.wants_write() {
                self.flush_records()?;
            }
        }
    }
}

impl<S: Read + Write> Write for TlsStream<S> {
    /// Hand up to one chunk of plaintext to rustls and send its records. `WouldBlock` while
    /// records of an earlier write still wait for the socket.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if !self.flush_records()? {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        let take = buf.len().min(self.chunk);
        let n = self.conn.writer().write(&buf[..take])?;
        if n == 0 {
            // rustls's buffer is full (plaintext written before the handshake completed):
            // the handshake's progress, which comes with the peer's input, frees it.
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        self.flush_records()?;
        Ok(n)
    }

    /// Send waiting records; what the socket does not take waits for writability.
    fn flush(&mut self) -> io::Result<()> {
        self.flush_records().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    /// One direction of an in-memory socket pair, which can be made to block.
    #[derive(Default)]
    struct Pipe {
        data: VecDeque<u8>,
        closed: bool,
    }

    /// A non-blocking in-memory socket: reads from one pipe, writes to another, taking at
    /// most `room` bytes per write (0: would block).
    struct Sock {
        rx: Arc<Mutex<Pipe>>,
        tx: Arc<Mutex<Pipe>>,
        room: usize,
    }

    impl Read for Sock {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let mut p = self.rx.lock().map_err(|_| io::Error::other("poisoned"))?;
            if p.data.is_empty() {
                return if p.closed {
                    Ok(0)
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                };
            }
            let n = buf.len().min(p.data.len());
            for (i, b) in p.data.drain(..n).enumerate() {
                buf[i] = b;
            }
            Ok(n)
        }
    }

    impl Write for Sock {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.room);
            let mut p = self.tx.lock().map_err(|_| io::Error::other("poisoned"))?;
            p.data.extend(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A connected pair of in-memory sockets: (the server's end, the client's end).
    fn pair() -> (Sock, Sock) {
        let a = Arc::new(Mutex::new(Pipe::default()));
        let b = Arc::new(Mutex::new(Pipe::default()));
        let server = Sock {
            rx: a.clone(),
            tx: b.clone(),
            room: usize::MAX,
        };
        let client = Sock {
            rx: b,
            tx: a,
            room: usize::MAX,
        };
        (server, client)
    }

    /// Move records both ways until both sides are quiet (in memory: a fixed number of rounds
    /// is plenty and needs no clock).
    fn pump<A: Read + Write, B: Read + Write>(
        s: &mut TlsStream<A>,
        c: &mut TlsStream<B>,
        sbuf: &mut Vec<u8>,
        cbuf: &mut Vec<u8>,
    ) {
        let mut tmp = [0u8; 4096];
        for _ in 0..64 {
            let _ = s.flush_records();
            let _ = c.flush_records();
            while let Ok(n) = s.read(&mut tmp) {
                if n == 0 {
                    break;
                }
                sbuf.extend_from_slice(&tmp[..n]);
            }
            while let Ok(n) = c.read(&mut tmp) {
                if n == 0 {
                    break;
                }
                cbuf.extend_from_slice(&tmp[..n]);
            }
        }
    }

    /// A server and a client session over an in-memory socket pair.
    fn sessions() -> (TlsStream<Sock>, TlsStream<Sock>) {
        let (server_cfg, client_cfg) = crate::testpair::configs("localhost");
        let (ss, cs) = pair();
        let server = TlsStream::new(
            rustls::ServerConnection::new(server_cfg).expect("server conn"),
            ss,
        );
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let client = TlsStream::new(
            rustls::ClientConnection::new(client_cfg, name).expect("client conn"),
            cs,
        );
        (server, client)
    }

    #[test]
    fn handshake_then_data_both_ways() {
        let (mut server, mut client) = sessions();
        assert_eq!(
            client.write(b"get foo\r\n").map_err(|e| e.kind()),
            Ok(9),
            "plaintext before the handshake is queued"
        );
        let (mut sgot, mut cgot) = (Vec::new(), Vec::new());
        pump(&mut server, &mut client, &mut sgot, &mut cgot);
        assert!(server.established() && client.established());
        assert_eq!(sgot, b"get foo\r\n");
        // A reply larger than one chunk goes out in several writes.
        let reply = vec![b'x'; 3 * DEFAULT_WRITE_CHUNK + 5];
        let mut at = 0;
        while at < reply.len() {
            at += server.write(&reply[at..]).expect("write");
        }
        pump(&mut server, &mut client, &mut sgot, &mut cgot);
        assert_eq!(cgot.len(), reply.len());
        assert!(server.failure().is_none());
    }

    #[test]
    fn a_blocked_socket_holds_back_further_writes() {
        let (mut server, mut client) = sessions();
        let (mut sgot, mut cgot) = (Vec::new(), Vec::new());
        let _ = client.flush_records();
        pump(&mut server, &mut client, &mut sgot, &mut cgot);
        assert!(server.established());
        server.sock.room = 0;
        let big = vec![b'y'; 100_000];
        let first = server.write(&big).expect("the first write is taken");
        assert!(first <= DEFAULT_WRITE_CHUNK);
        assert!(server.wants_write());
        assert_eq!(
            server.write(&big[first..]).map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock),
            "nothing more while records wait"
        );
        server.sock.room = usize::MAX;
        assert_eq!(server.flush_records().ok(), Some(true));
    }

    #[test]
    fn plaintext_on_a_tls_port_is_a_handshake_failure() {
        let (mut server, _client) = sessions();
        let to_server = server.sock.rx.clone();
        to_server
            .lock()
            .expect("lock")
            .data
            .extend(b"get foo\r\n".iter());
        let mut buf = [0u8; 64];
        let err = server.read(&mut buf).expect_err("not TLS");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(server.failure(), Some(Failure::Handshake));
    }

    /// A failure after the server's first flight (here the client's alert: it does not trust
    /// the server's certificate) is a protocol error, as memcached counts it.
    #[test]
    fn a_failure_after_the_servers_first_flight_is_a_protocol_failure() {
        let (server_cfg, _) = crate::testpair::configs("localhost");
        let stranger = crate::testcert::Ca::new("another CA").cert();
        let client_cfg =
            crate::client::config_from_roots(&[stranger], None).expect("client config");
        let (ss, cs) = pair();
        let mut server = TlsStream::new(
            rustls::ServerConnection::new(server_cfg).expect("server conn"),
            ss,
        );
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut client = TlsStream::new(
            rustls::ClientConnection::new(client_cfg, name).expect("client conn"),
            cs,
        );
        pump(&mut server, &mut client, &mut Vec::new(), &mut Vec::new());
        assert_eq!(client.failure(), Some(Failure::Protocol));
        assert_eq!(server.failure(), Some(Failure::Protocol));
    }

    #[test]
    fn the_end_of_the_socket_reads_as_the_end() {
        let (mut server, _client) = sessions();
        let to_server = server.sock.rx.clone();
        let mut buf = [0u8; 64];
        assert_eq!(
            server.read(&mut buf).map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock)
        );
        to_server.lock().expect("lock").closed = true;
        assert_eq!(server.read(&mut buf).ok(), Some(0));
    }
}
