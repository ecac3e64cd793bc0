//! The handshake-then-protocol boundary of a TLS connection: bytes from a hostile peer go
//! through kvtls's `TlsStream` (as the server reads them) and whatever plaintext comes out is
//! parsed as the server parses it.
//!
//! The first input byte picks the case:
//! - even: the rest is raw bytes on the wire to a fresh server session (a peer that is not a
//!   TLS client, or a broken one), delivered in chunks whose sizes the input also picks. The
//!   session must fail or wait; it must never hand out plaintext before a handshake.
//! - odd: a real client completes the handshake in memory, then sends the rest as its
//!   plaintext, in chunks; the server must read back exactly those bytes, which then go to
//!   the text protocol parser. With bit 1 set, one byte of the client's records is flipped on
//!   the way: no altered plaintext may come out (the session fails as a protocol error, or
//!   waits for the rest of a record whose length changed).
#![no_main]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use kvtls::rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};
use kvtls::{Failure, TlsStream};
use libfuzzer_sys::fuzz_target;

/// One direction of an in-memory connection.
type Pipe = Rc<RefCell<VecDeque<u8>>>;

struct Sock {
    rx: Pipe,
    tx: Pipe,
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rx = self.rx.borrow_mut();
        if rx.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(rx.len());
        for (i, b) in rx.drain(..n).enumerate() {
            buf[i] = b;
        }
        Ok(n)
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tx.borrow_mut().extend(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn configs() -> &'static (Arc<ServerConfig>, Arc<ClientConfig>) {
    static CONFIGS: OnceLock<(Arc<ServerConfig>, Arc<ClientConfig>)> = OnceLock::new();
    CONFIGS.get_or_init(|| kvtls::testpair::configs("localhost"))
}

/// Read everything the server can now; `None` once it failed or ended.
fn drain(server: &mut TlsStream<Sock>, out: &mut Vec<u8>) -> Option<()> {
    let mut buf = [0u8; 4096];
    loop {
        match server.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(()),
            Err(_) => return None,
        }
    }
}

/// Parse plaintext as the server does (the parser's own promises are fuzzed elsewhere).
fn parse(mut rest: &[u8]) {
    let limits = kvproto::text::Limits {
        max_value: 1 << 20,
        flush_enabled: true,
        shutdown_enabled: false,
    };
    while !rest.is_empty() {
        let used = match kvproto::text::parse(rest, &limits) {
            kvproto::text::Parse::Incomplete | kvproto::text::Parse::Close => return,
            kvproto::text::Parse::Request(_, n) => n,
            kvproto::text::Parse::Error { consumed, .. } => consumed.max(1),
            kvproto::text::Parse::TooLarge { consumed, .. } => consumed.max(1),
        };
        rest = rest.get(used..).unwrap_or_default();
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let (server_cfg, client_cfg) = configs();
    let to_server: Pipe = Rc::default();
    let to_client: Pipe = Rc::default();
    let session = match ServerConnection::new(server_cfg.clone()) {
        Ok(s) => s,
        Err(_) => return,
    };
    let mut server = TlsStream::new(
        session,
        Sock {
            rx: to_server.clone(),
            tx: to_client.clone(),
        },
    );
    let mut plain = Vec::new();

    if mode & 1 == 0 {
        // Raw bytes, in chunks of 1 to 256 bytes picked by the input itself.
        let mut at = 0;
        while at < rest.len() {
            let n = 1 + rest[at] as usize;
            let end = (at + 1 + n).min(rest.len());
            to_server.borrow_mut().extend(&rest[(at + 1).min(end)..end]);
            at = end;
            if drain(&mut server, &mut plain).is_none() {
                break;
            }
        }
        assert!(
            plain.is_empty() || server.established(),
            "plaintext before a handshake"
        );
        return;
    }

    let name = match kvtls::rustls::pki_types::ServerName::try_from("localhost") {
        Ok(n) => n,
        Err(_) => return,
    };
    let Ok(session) = ClientConnection::new(client_cfg.clone(), name) else {
        return;
    };
    let mut client = TlsStream::new(
        session,
        Sock {
            rx: to_client.clone(),
            tx: to_server.clone(),
        },
    );
    // The handshake, in memory: a few rounds are enough.
    let mut ignored = Vec::new();
    for _ in 0..8 {
        let _ = client.flush_records();
        if drain(&mut server, &mut plain).is_none() {
            panic!("the handshake failed: {:?}", server.failure());
        }
        let mut buf = [0u8; 64];
        let _ = client
            .read(&mut buf)
            .map(|n| ignored.extend_from_slice(&buf[..n]));
    }
    assert!(server.established() && client.established(), "no handshake");
    // The client's plaintext, in chunks.
    let flip = mode & 2 != 0;
    let mut sent = 0;
    for chunk in rest.chunks(1 + (mode as usize >> 2)) {
        let mut at = 0;
        while at < chunk.len() {
            match client.write(&chunk[at..]) {
                Ok(n) => at += n,
                Err(_) => break,
            }
        }
        sent += at;
    }
    let _ = client.flush_records();
    if flip && !to_server.borrow().is_empty() {
        let mut wire = to_server.borrow_mut();
        let i = (mode as usize * 7919) % wire.len();
        if let Some(b) = wire.get_mut(i) {
            *b ^= 0x40;
        }
    }
    let ok = drain(&mut server, &mut plain).is_some();
    if flip && sent > 0 {
        // A flipped payload or tag fails the record; a flipped length leaves it unfinished.
        // Either way no altered byte comes out.
        assert!(
            rest[..sent].starts_with(&plain),
            "an altered record was accepted"
        );
        if !ok {
            assert_eq!(server.failure(), Some(Failure::Protocol));
        }
        return;
    }
    assert!(ok, "a clean session failed: {:?}", server.failure());
    assert_eq!(plain, &rest[..sent], "plaintext changed on the way");
    parse(&plain);
});
