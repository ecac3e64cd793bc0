//! Ports for test servers: free on 127.0.0.1 for both TCP and UDP, outside the kernel's
//! ephemeral range, and never handed out twice in one test process.
//!
//! Asking the kernel for an ephemeral port (`bind(0)`) and releasing it does not reserve it:
//! the next outgoing connection of any test thread may be given that same port, and a server
//! started on it then fails to listen (`Address already in use`). Ports below the ephemeral
//! range are never chosen for outgoing connections, and a process-wide cursor keeps two
//! tests of one binary from being handed the same port. Shared with kvblast's tests through
//! `#[path]`, so it needs nothing but std.

use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The lowest port handed out; below it lie well-known and registered services.
const FIRST: u32 = 20_000;

/// How many ports one process walks before it wraps (each starts at its own offset).
const STRIDE: u32 = 1_000;

/// The ports handed out: `[FIRST, end)`, or `None` when the ephemeral range leaves no room
/// below it (then the kernel's choice is used, as before).
fn range_end() -> Option<u32> {
    static END: OnceLock<Option<u32>> = OnceLock::new();
    *END.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
        let low: u32 = text.split_whitespace().next()?.parse().ok()?;
        (low >= FIRST + 2 * STRIDE).then_some(low)
    })
}

/// A port on 127.0.0.1 that is free for TCP and UDP now and that this process has not
/// handed out before.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let Some(end) = range_end() else {
        return kernel_port();
    };
    let span = end - FIRST;
    // Test binaries that run at the same time (two `cargo test`s) start far apart.
    let offset = (std::process::id().wrapping_mul(STRIDE)) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = FIRST + (offset + n) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
            && UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        {
            return port;
        }
    }
    kernel_port()
}

/// A port the kernel picked from its ephemeral range (free a moment ago).
fn kernel_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}
