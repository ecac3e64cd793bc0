//! The UDP path (`-U`) against kvcached and Debian's memcached: framed requests, replies
//! split into 1400-byte datagrams, text and binary, malformed frames dropped. Each server's
//! datagrams are compared with memcached's byte for byte (CAS bytes aside).

mod common;

use std::net::{Ipv4Addr, UdpSocket};

use common::{Kind, Server};

fn start(kind: Kind) -> (Server, u16) {
    Server::start_udp(kind, &[])
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

/// Send one framed request and collect every datagram answering it, whatever the number of
/// messages: a sentinel request (`mn`, id `id | 0x8000`) follows, and datagrams are read
/// until its reply. Replies come back in order on loopback when one thread serves them:
/// start the server with `-t 1` (memcached's threads share one UDP socket).
fn exchange(sock: &UdpSocket, port: u16, id: u16, payload: &[u8]) -> Vec<Vec<u8>> {
    let sentinel = id | 0x8000;
    for (i, p) in [(id, payload), (sentinel, &b"mn\r\n"[..])] {
        sock.send_to(&frame(i, 0, 1, p), (Ipv4Addr::LOCALHOST, port))
            .expect("send");
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = sock.recv(&mut buf).expect("reply datagram");
        assert!((8..=1400).contains(&n), "datagram of {n} bytes");
        let rid = u16::from_be_bytes([buf[0], buf[1]]);
        if rid == sentinel {
            return got;
        }
        assert_eq!(rid, id, "reply to another request");
        got.push(buf[..n].to_vec());
    }
}

fn bin_get(opcode: u8, key: &[u8], opaque: u32) -> Vec<u8> {
    let mut p = vec![0x80, opcode];
    p.extend_from_slice(&(key.len() as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0]);
    p.extend_from_slice(&(key.len() as u32).to_be_bytes());
    p.extend_from_slice(&opaque.to_be_bytes());
    p.extend_from_slice(&[0; 8]);
    p.extend_from_slice(key);
    p
}

/// Requests whose replies are several messages: a multi-key get is one message per key
/// (`END` with the last; a missed key an empty message, sent as a bare header only when
/// nothing was sent before it), and each request of a datagram is its own message.
fn multi_session(kind: Kind) -> Vec<Vec<Vec<u8>>> {
    let (server, port) = Server::start_udp(kind, &["-t", "1"]);
    let mut tcp = server.connect();
    let big = vec![b'x'; 3000];
    let mut sets = b"set a 1 0 2\r\nhi\r\nset b 2 0 3\r\nbee\r\nset big 0 0 3000\r\n".to_vec();
    sets.extend_from_slice(&big);
    sets.extend_from_slice(b"\r\n");
    tcp.send(&sets);
    for _ in 0..3 {
        assert_eq!(tcp.line(), "STORED\r\n");
    }
    let sock = client();
    let mut out = Vec::new();
    let text: &[&[u8]] = &[
        b"get a b\r\n",
        b"get nope a nope2 b nope3\r\n",
        b"get a nope\r\n",
        b"get nope1 nope2 nope3\r\n",
        b"get big a\r\n",
        b"get a big\r\n",
        b"gets a nope b\r\n",
        b"gat 0 nope a b\r\n",
        b"set c 0 0 1\r\nc\r\nget c\r\n",
        b"mg a v\r\nmg nope v\r\nmn\r\n",
        b"delete nope noreply\r\nget nope a\r\n",
        b"mg nope v q\r\nget nope a\r\n",
        b"bogus\r\nget a\r\n",
        b"get a x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x\r\n",
    ];
    for (i, payload) in text.iter().enumerate() {
        out.push(exchange(&sock, port, 100 + i as u16, payload));
    }
    let mut bin = bin_get(0x0c, b"a", 1); // getk hit, getk hit, noop
    bin.extend(bin_get(0x0c, b"b", 2));
    bin.extend(bin_get(0x0a, b"", 3));
    out.push(exchange(&sock, port, 200, &bin));
    let mut bin = bin_get(0x0d, b"nope", 1); // getkq miss (silent), getk miss, noop
    bin.extend(bin_get(0x0c, b"nope", 2));
    bin.extend(bin_get(0x0a, b"", 3));
    out.push(exchange(&sock, port, 201, &bin));
    // CAS bytes (gets, binary) vary between servers.
    for d in out.iter_mut().flatten() {
        if d.get(8) == Some(&0x81) {
            for b in d.iter_mut().skip(8 + 16).take(8) {
                *b = 0;
            }
        } else if d[8..].starts_with(b"VALUE ") {
            // A `gets` line has a fifth token, the CAS unique: make it 0.
            let Some(eol) = d.windows(2).position(|w| w == b"\r\n") else {
                continue;
            };
            let line = String::from_utf8_lossy(&d[8..eol]).to_string();
            let mut tokens: Vec<&str> = line.split(' ').collect();
            if tokens.len() == 5 {
                tokens[4] = "0";
                let mut fixed = d[..8].to_vec();
                fixed.extend_from_slice(tokens.join(" ").as_bytes());
                fixed.extend_from_slice(&d[eol..]);
                *d = fixed;
            }
        }
    }
    out
}

#[test]
fn udp_multi_message_replies_match_memcached() {
    let want = multi_session(Kind::Memcached);
    let got = multi_session(Kind::Kvcached);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "exchange {i}");
    }
}

/// Where Debian's memcached 1.6.18 differs from the newest (1.6.35 and later): 1.6.18 sends
/// a `get`'s replies at once, the newest queues them with the requests that follow in the
/// datagram (up to `-R`, 20, plus one), so a missed first key after another reply of the
/// queue is no datagram at all. kvcached follows the newest; checked against kvcached alone.
#[test]
fn udp_gets_queue_like_newest_memcached() {
    let (_server, port) = Server::start_udp(Kind::Kvcached, &["-t", "1"]);
    let sock = client();
    let hit = b"VALUE a 1 2\r\nhi\r\nEND\r\n";
    let set = frame(1, 0, 1, b"set a 1 0 2\r\nhi\r\n");
    sock.send_to(&set, (Ipv4Addr::LOCALHOST, port))
        .expect("send");
    assert_eq!(payload(&receive(&sock, 1)), b"STORED\r\n");
    let bodies = |ds: Vec<Vec<u8>>| ds.iter().map(|d| d[8..].to_vec()).collect::<Vec<_>>();
    // The miss of "x" is consumed with the first get's reply.
    let got = bodies(exchange(&sock, port, 2, b"get a\r\nget x a\r\n"));
    assert_eq!(got, vec![hit.to_vec(), hit.to_vec()]);
    // The 22nd request starts memcached's second queue: its miss is a bare header.
    let mut many = b"get a\r\n".repeat(21);
    many.extend_from_slice(b"get x a\r\n");
    let got = bodies(exchange(&sock, port, 3, &many));
    let mut want = vec![hit.to_vec(); 21];
    want.push(Vec::new());
    want.push(hit.to_vec());
    assert_eq!(got, want);
    // A get rejected for a long key drops the unsent replies of its queue.
    let mut long = b"get a\r\nget a ".to_vec();
    long.extend_from_slice(&[b'k'; 251]);
    long.extend_from_slice(b"\r\n");
    let got = bodies(exchange(&sock, port, 4, &long));
    assert_eq!(
        got,
        vec![b"CLIENT_ERROR bad command line format\r\n".to_vec()]
    );
}

/// A burst of datagrams sent before the server reads any, so that one receive takes many of
/// them: reads of keys present and absent, several keys at once, garbage, binary, frames
/// too short or announcing several datagrams (dropped), and a set. kvcached looks at a
/// batch's keys before it runs any of its requests (to prefetch them); whatever a datagram
/// holds, every request must get memcached's reply. Replies by request id, until a sentinel.
fn burst(kind: Kind) -> Vec<(u16, Vec<u8>)> {
    let (_server, port) = Server::start_udp(kind, &["-t", "1"]);
    let sock = client();
    for i in 0..8u16 {
        let set = format!("set k{i} {i} 0 3\r\nv{i:02}\r\n");
        assert_eq!(
            payload(&request(&sock, port, i, set.as_bytes())),
            b"STORED\r\n"
        );
    }
    let mut frames: Vec<Vec<u8>> = Vec::new();
    for i in 0..96u16 {
        let id = 100 + i;
        let body: Vec<u8> = match i % 12 {
            0 => format!("get k{}\r\n", i % 8).into_bytes(),
            1 => format!("get absent{i}\r\n").into_bytes(),
            2 => b"get k1 k2 absent k3\r\n".to_vec(),
            3 => vec![0xff, 0x00, b'g', b'e', b't', b' ', 0x80, b'\r', b'\n'],
            4 => bin_get(0x00, b"k4", u32::from(i)),
            5 => b"get".to_vec(),
            6 => format!("mg k{} v f c\r\n", i % 8).into_bytes(),
            7 => b"delete absent\r\nget k1 \r\n".to_vec(),
            8 => format!("gets k{} k{}\r\n", i % 8, (i + 3) % 8).into_bytes(),
            9 => b"get k5\r\nget k6\r\nget k7\r\n".to_vec(),
            10 => format!("set k{} 0 0 2\r\nzz\r\n", i % 8).into_bytes(),
            _ => format!("touch k{} 0\r\nincr absent 1\r\n", i % 8).into_bytes(),
        };
        frames.push(frame(id, 0, 1, &body));
        if i % 24 == 5 {
            frames.push(frame(id + 1000, 0, 2, b"get k1\r\n")); // two-datagram request
            frames.push(id.to_be_bytes().to_vec()); // shorter than a header
        }
    }
    frames.push(frame(0x7fff, 0, 1, b"mn\r\n"));
    for f in &frames {
        sock.send_to(f, (Ipv4Addr::LOCALHOST, port)).expect("send");
    }
    let mut got: Vec<(u16, Vec<u8>)> = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = sock.recv(&mut buf).expect("reply datagram");
        assert!((8..=1400).contains(&n), "datagram of {n} bytes");
        let rid = u16::from_be_bytes([buf[0], buf[1]]);
        if rid == 0x7fff {
            break;
        }
        let mut d = buf[8..n].to_vec();
        blank_cas(&mut d);
        got.push((rid, d));
    }
    got.sort();
    got
}

/// CAS uniques differ between servers: zero a binary reply's, and replace the CAS field of
/// each `VALUE key flags bytes cas` line and each meta `c` flag with `C`.
fn blank_cas(d: &mut Vec<u8>) {
    if d.first() == Some(&0x81) {
        for b in d.iter_mut().skip(16).take(8) {
            *b = 0;
        }
        return;
    }
    let text = String::from_utf8_lossy(d).into_owned();
    let mut out = String::new();
    for line in text.split_inclusive("\r\n") {
        let fields: Vec<&str> = line.trim_end_matches("\r\n").split(' ').collect();
        if fields.len() == 5 && fields[0] == "VALUE" {
            out.push_str(&format!(
                "VALUE {} {} {} C\r\n",
                fields[1], fields[2], fields[3]
            ));
        } else if fields[0] == "VA" || fields[0] == "HD" {
            let kept: Vec<&str> = fields
                .iter()
                .map(|f| if f.starts_with('c') { "cC" } else { f })
                .collect();
            out.push_str(&kept.join(" "));
            out.push_str("\r\n");
        } else {
            out.push_str(line);
        }
    }
    *d = out.into_bytes();
}

#[test]
fn udp_burst_of_mixed_datagrams_matches_memcached() {
    let want = burst(Kind::Memcached);
    let got = burst(Kind::Kvcached);
    assert!(
        want.len() > 80,
        "memcached answered {} requests",
        want.len()
    );
    let show = |r: &[(u16, Vec<u8>)]| -> Vec<String> {
        r.iter()
            .map(|(id, d)| format!("{id}: {}", String::from_utf8_lossy(d).escape_debug()))
            .collect()
    };
    let (got, want) = (show(&got), show(&want));
    let first = got.iter().zip(&want).position(|(g, w)| g != w);
    assert_eq!(got, want, "first difference at reply {first:?}");
}
