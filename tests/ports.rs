//! Which ports the server listens on, against kvcached and Debian's memcached: `-p -1` and
//! `-U -1` (a port the kernel picks; `-U` alone moves the TCP port too), `-l HOST:0`, `-p 0`
//! (TCP off, even for an entry with a port of its own), and `MEMCACHED_PORT_FILENAME`, the
//! file memcached writes the ports it bound to (`TCP INET: 41234`, a line per socket,
//! written to `FILE.lck` and renamed when complete; none with a unix socket). memcached's
//! own `t/issue_67.t` tests the same through that file.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Kind, Server};

/// A file name of this test's own, removed first (and its `.lck`).
fn port_file(name: &str, kind: Kind) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "kvcached-ports-{}-{name}-{kind:?}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(lck(&path));
    path
}

fn lck(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".lck");
    PathBuf::from(s)
}

/// Start `kind` with exactly these arguments (plus `-u root` as root) and the port file
/// variable; wait for the port file and return the server (its `port` the first TCP port
/// in the file, else 0) and the file's lines.
fn start(kind: Kind, args: &[&str], file: &Path) -> (Server, Vec<String>) {
    let program = match kind {
        Kind::Kvcached => PathBuf::from(env!("CARGO_BIN_EXE_kvcached")),
        Kind::Memcached => common::memcached_path(),
    };
    let mut cmd = Command::new(program);
    if common::running_as_root() {
        cmd.args(["-u", "root"]);
    }
    cmd.args(args)
        .env("MEMCACHED_PORT_FILENAME", file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn server");
    let mut server = Server::new(kind, 0, child, None);
    common::poll_until("the port file", common::TIMEOUT, || {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("{kind:?} {args:?} exited: {status}: {}", server.stderr());
        }
        file.exists()
    });
    let text = std::fs::read_to_string(file).expect("read the port file");
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
    assert!(
        !lck(file).exists(),
        "{kind:?}: the .lck file was left behind"
    );
    server.port = port_of(&lines, "TCP INET").unwrap_or(0);
    let _ = std::fs::remove_file(file);
    (server, lines)
}

/// The port of the line `KIND FAMILY: PORT`.
fn port_of(lines: &[String], kind: &str) -> Option<u16> {
    lines.iter().find_map(|l| {
        let port = l.strip_prefix(kind)?.strip_prefix(": ")?;
        port.parse().ok()
    })
}

/// The kinds of the lines, in order (`TCP INET`, `UDP INET`, ...), each port checked.
fn kinds(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let (kind, port) = l.split_once(": ").unwrap_or_else(|| panic!("line {l:?}"));
            let port: u16 = port.parse().unwrap_or_else(|_| panic!("line {l:?}"));
            assert_ne!(port, 0, "line {l:?}");
            kind.to_string()
        })
        .collect()
}

fn setting(server: &Server, name: &str) -> Option<String> {
    let mut c = server.connect();
    c.stats("settings")
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// One `version` request over UDP to `port`: the reply's payload.
fn udp_version(port: u16) -> String {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    sock.set_read_timeout(Some(common::TIMEOUT))
        .expect("timeout");
    let mut d = vec![0, 7, 0, 0, 0, 1, 0, 0];
    d.extend_from_slice(b"version\r\n");
    sock.send_to(&d, (Ipv4Addr::LOCALHOST, port)).expect("send");
    let mut buf = [0u8; 1500];
    let n = sock.recv(&mut buf).expect("a UDP reply");
    assert!(n >= 8 && buf[..2] == [0, 7], "{:?}", &buf[..n]);
    String::from_utf8_lossy(&buf[8..n]).into_owned()
}

fn ephemeral_tcp_port(kind: Kind) {
    let file = port_file("p", kind);
    let (server, lines) = start(kind, &["-l", "127.0.0.1", "-p", "-1"], &file);
    assert_eq!(kinds(&lines), ["TCP INET"], "{lines:?}");
    assert_ne!(server.port, 11211);
    assert!(common::listens(server.child.id(), server.port));
    // stats settings keeps -1, as memcached's settings.port does.
    assert_eq!(setting(&server, "tcpport").as_deref(), Some("-1"));
    assert_eq!(setting(&server, "udpport").as_deref(), Some("0"));
}

fn ephemeral_udp_port_moves_tcp_too(kind: Kind) {
    let file = port_file("u", kind);
    let args = ["-l", "127.0.0.1", "-U", "-1", "-t", "2"];
    let (server, lines) = start(kind, &args, &file);
    assert_eq!(kinds(&lines), ["TCP INET", "UDP INET"], "{lines:?}");
    let udp = port_of(&lines, "UDP INET").expect("a UDP port");
    assert_eq!(setting(&server, "tcpport").as_deref(), Some("-1"));
    assert_eq!(setting(&server, "udpport").as_deref(), Some("-1"));
    // Every worker's UDP socket is on that one port (`stats conns` lists each), and
    // requests to it are answered.
    let mut c = server.connect();
    let udp_addrs: Vec<String> = c
        .stats("conns")
        .into_iter()
        .filter(|(k, v)| k.ends_with(":addr") && v.starts_with("udp:"))
        .map(|(_, v)| v)
        .collect();
    let want = format!("udp:127.0.0.1:{udp}");
    assert_eq!(udp_addrs, [want.clone(), want]);
    assert!(udp_version(udp).starts_with("VERSION "));
}

fn ephemeral_tcp_and_udp_ports(kind: Kind) {
    // Each socket gets a port of its own.
    let file = port_file("pu", kind);
    let (server, lines) = start(kind, &["-l", "127.0.0.1", "-p", "-1", "-U", "-1"], &file);
    assert_eq!(kinds(&lines), ["TCP INET", "UDP INET"], "{lines:?}");
    assert!(common::listens(server.child.id(), server.port));
    let udp = port_of(&lines, "UDP INET").expect("a UDP port");
    assert!(udp_version(udp).starts_with("VERSION "));
}

fn listen_entry_port_zero_is_ephemeral(kind: Kind) {
    let file = port_file("l0", kind);
    let (server, lines) = start(kind, &["-l", "127.0.0.1:0"], &file);
    assert_eq!(kinds(&lines), ["TCP INET"], "{lines:?}");
    assert!(common::listens(server.child.id(), server.port));
    let mut c = server.connect();
    assert_eq!(c.call("set k 0 0 1\r\nv\r\n"), "STORED\r\n");
}

fn port_zero_turns_tcp_off(kind: Kind) {
    // -p 0 turns TCP off, even for an entry with a port of its own; the server starts
    // anyway (memcached runs with nothing to listen on) and writes an empty port file.
    let file = port_file("p0", kind);
    let own = common::free_port();
    let entry = format!("127.0.0.1:{own}");
    let (mut server, lines) = start(kind, &["-l", &entry, "-p", "0"], &file);
    assert!(lines.is_empty(), "{lines:?}");
    assert!(!common::listens(server.child.id(), own));
    assert!(
        server.child.try_wait().expect("wait").is_none(),
        "{kind:?} exited: {}",
        server.stderr()
    );
    // With UDP on, only UDP is listed.
    let file = port_file("p0u", kind);
    let (_server, lines) = start(kind, &["-l", "127.0.0.1", "-p", "0", "-U", "-1"], &file);
    assert_eq!(kinds(&lines), ["UDP INET"], "{lines:?}");
    let udp = port_of(&lines, "UDP INET").expect("a UDP port");
    assert!(udp_version(udp).starts_with("VERSION "));
}

fn no_port_file_with_a_unix_socket(kind: Kind) {
    let file = port_file("s", kind);
    let sock = std::env::temp_dir().join(format!(
        "kvcached-ports-{}-{kind:?}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&sock);
    let program = match kind {
        Kind::Kvcached => PathBuf::from(env!("CARGO_BIN_EXE_kvcached")),
        Kind::Memcached => common::memcached_path(),
    };
    let mut cmd = Command::new(program);
    if common::running_as_root() {
        cmd.args(["-u", "root"]);
    }
    cmd.arg("-s")
        .arg(&sock)
        .args(["-p", "-1"])
        .env("MEMCACHED_PORT_FILENAME", &file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn server");
    let _server = Server::new(kind, 0, child, Some(sock.clone()));
    // Once it answers on the socket, it has done all its binding.
    let mut answered = String::new();
    common::poll_until("the unix socket", common::TIMEOUT, || {
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(&sock) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let mut buf = [0u8; 64];
        let n = s
            .write_all(b"version\r\n")
            .and_then(|_| s.read(&mut buf))
            .unwrap_or(0);
        answered = String::from_utf8_lossy(&buf[..n]).into_owned();
        n > 0
    });
    assert!(answered.starts_with("VERSION "), "{answered:?}");
    assert!(!file.exists() && !lck(&file).exists());
    let _ = std::fs::remove_file(&sock);
}

common::both!(
    ephemeral_tcp_port,
    ephemeral_udp_port_moves_tcp_too,
    ephemeral_tcp_and_udp_ports,
    listen_entry_port_zero_is_ephemeral,
    port_zero_turns_tcp_off,
    no_port_file_with_a_unix_socket,
);

#[test]
fn other_negative_ports_are_refused() {
    // memcached takes any number and fails to bind -2 (exit 71, "failed to listen on TCP
    // port -2"); kvcached refuses it on the command line with a message.
    for opt in ["-p", "-U"] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvcached"))
            .args([opt, "-2"])
            .stdin(Stdio::null())
            .output()
            .expect("run kvcached");
        assert_eq!(out.status.code(), Some(64), "{opt} -2");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("-1 lets the kernel pick one"), "{err}");
    }
}
