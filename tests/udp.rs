//! The UDP path (`-U`) against kvcached and Debian's memcached: framed requests, replies
//! split into 1400-byte datagrams, text and binary, malformed frames dropped. Each server's
//! datagrams are compared with memcached's byte for byte (CAS bytes aside).

mod common;

use std::net::{Ipv4Addr, UdpSocket};

use common::{Kind, Server};

/// A UDP port on 127.0.0.1 that was free a moment ago.
fn free_udp_port() -> u16 {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind udp");
    s.local_addr().expect("addr").port()
}

fn start(kind: Kind) -> (Server, u16) {
    for _ in 0..5 {
        let port = free_udp_port();
        let p = port.to_string();
        let server = Server::start_verified(kind, &["-U", &p]);
        // The harness picked the TCP port; -U may have failed to bind if the UDP port was
        // taken meanwhile, in which case the server exited.
        let mut s = server;
        if s.child.try_wait().map(|st| st.is_none()).unwrap_or(false) {
            return (s, port);
        }
        let _ = s.terminate();
    }
    panic!("{kind:?}: could not start with UDP");
}

fn client() -> UdpSocket {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind client");
    s.set_read_timeout(Some(common::TIMEOUT)).expect("timeout");
    s
}

fn frame(id: u16, seq: u16, count: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    for v in [id, seq, count, 0] {
        d.extend_from_slice(&v.to_be_bytes());
    }
    d.extend_from_slice(payload);
    d
}

/// Send one framed request; collect the reply's datagrams (all of one message).
fn request(sock: &UdpSocket, port: u16, id: u16, payload: &[u8]) -> Vec<Vec<u8>> {
    sock.send_to(&frame(id, 0, 1, payload), (Ipv4Addr::LOCALHOST, port))
        .expect("send");
    receive(sock, id)
}

fn receive(sock: &UdpSocket, id: u16) -> Vec<Vec<u8>> {
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = sock.recv(&mut buf).expect("reply datagram");
        let d = buf[..n].to_vec();
        assert!((8..=1400).contains(&n), "datagram of {n} bytes");
        let rid = u16::from_be_bytes([d[0], d[1]]);
        assert_eq!(rid, id, "reply to another request");
        let seq = u16::from_be_bytes([d[2], d[3]]);
        let count = u16::from_be_bytes([d[4], d[5]]);
        assert_eq!(
            usize::from(seq),
            got.len(),
            "datagrams in order on loopback"
        );
        got.push(d);
        if got.len() == usize::from(count) {
            return got;
        }
    }
}

fn payload(datagrams: &[Vec<u8>]) -> Vec<u8> {
    datagrams.iter().flat_map(|d| d[8..].to_vec()).collect()
}

/// Everything a test compares, for one server.
fn session(kind: Kind) -> Vec<Vec<Vec<u8>>> {
    let (server, port) = start(kind);
    let mut tcp = server.connect();
    tcp.send(b"set a 1 0 2\r\nhi\r\n");
    assert_eq!(tcp.line(), "STORED\r\n");
    let big = vec![b'x'; 5000];
    let mut set = b"set big 0 0 5000\r\n".to_vec();
    set.extend_from_slice(&big);
    set.extend_from_slice(b"\r\n");
    tcp.send(&set);
    assert_eq!(tcp.line(), "STORED\r\n");

    let sock = client();
    let mut out = Vec::new();
    out.push(request(&sock, port, 1, b"get nope\r\n"));
    out.push(request(&sock, port, 2, b"get a\r\n"));
    let big_reply = request(&sock, port, 3, b"get big\r\n");
    assert_eq!(big_reply.len(), 4, "{kind:?}: 5000 bytes take 4 datagrams");
    let mut want = b"VALUE big 0 5000\r\n".to_vec();
    want.extend_from_slice(&big);
    want.extend_from_slice(b"\r\nEND\r\n");
    assert_eq!(payload(&big_reply), want);
    out.push(big_reply);
    out.push(request(&sock, port, 4, b"set u 0 0 3\r\nudp\r\n"));
    out.push(request(&sock, port, 5, b"get u\r\n"));
    // Binary get of "a" (opaque 5); CAS bytes vary between servers.
    let mut bin = vec![0x80, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5];
    bin.extend_from_slice(&[0; 8]);
    bin.push(b'a');
    let mut reply = request(&sock, port, 6, &bin);
    for d in reply.iter_mut() {
        for b in d.iter_mut().skip(8 + 16).take(8) {
            *b = 0;
        }
    }
    out.push(reply);
    // A request that claims two datagrams is dropped; the next request's reply is the
    // first thing to come back.
    sock.send_to(&frame(7, 0, 2, b"get a\r\n"), (Ipv4Addr::LOCALHOST, port))
        .expect("send");
    sock.send_to(&frame(8, 0, 1, b"get a\r\n"), (Ipv4Addr::LOCALHOST, port))
        .expect("send");
    out.push(receive(&sock, 8));
    // A datagram shorter than a header is dropped too.
    sock.send_to(&[0, 9, 0], (Ipv4Addr::LOCALHOST, port))
        .expect("send");
    out.push(request(&sock, port, 10, b"get nope\r\n"));
    out
}

#[test]
fn udp_matches_memcached() {
    let want = session(Kind::Memcached);
    let got = session(Kind::Kvcached);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "exchange {i}");
    }
}
