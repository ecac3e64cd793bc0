//! Replication, replica side: the puller thread that follows a master (`--replica-of`,
//! `replicaof`), and promotion (`replicaof no one`). Serving pulls is `exec::replication`;
//! the state both use is `state::replication`.
//!
//! The log format, cursors and batches are the storage engine's (`kvstore::LogEngine`,
//! `repl_serve`/`repl_apply`); this module moves them over an ordinary client connection:
//!
//! ```text
//! replica → master   replpull <replid> <bytes>\r\n<cursor>\r\n
//! master → replica   REPL <replid> <bytes>\r\n<batch>\r\n
//! ```
//!
//! `replid` names the master's log (random at each start). A replica that sends another
//! one (or `-`) gets a full sync. A replica is read-only; `replicaof no one` promotes it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kvstore::LogEngine;

use crate::state::replication::lock;
use crate::state::shared::Shared;

/// How long a replica waits for a master's reply before it reconnects.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// A replica whose last batch carried fewer bytes than this waits [`GATHER_WAIT`] before
/// it pulls again, so that under a steady trickle of writes each pull carries a
/// millisecond's worth of them instead of the few records written during one round trip.
/// Every pull costs the master a request, a batch and a wakeup of the replica whatever it
/// carries; pulling back to back, two replicas of a master under a 90/10 get/set load of
/// 1 KiB values cost it 12% of its capacity (BENCHMARKS.md, issue 11). A replica that is
/// behind, or a master taking writes fast, fills batches past this and is pulled at once.
const GATHER_BELOW: usize = 64 << 10;
/// See [`GATHER_BELOW`]: at most this much is added to the replication lag.
const GATHER_WAIT: Duration = Duration::from_millis(1);
/// Largest batch a replica accepts (a batch holds at most one record over the budget).
const MAX_BATCH: usize = 1 << 31;

/// Start following `master` ("host:port"), replacing any master followed before.
pub fn follow(shared: &Shared, master: String) {
    let repl = &shared.repl;
    let Some(shared) = shared.arc() else {
        return;
    };
    shared.engine.set_replica(true);
    repl.replica.store(true, Ordering::Release);
    *lock(&repl.master) = Some(master.clone());
    let generation = {
        let _a = lock(&repl.state);
        repl.generation.fetch_add(1, Ordering::AcqRel) + 1
    };
    repl.link_up.store(false, Ordering::Relaxed);
    repl.in_sync.store(false, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("kvcached-replica".into())
        .spawn(move || puller(&shared, &master, generation));
    if let Err(e) = spawned {
        tracing::error!("cannot start the replication thread: {e}");
    }
}

/// Stop following: this server becomes a master with the data it has.
pub fn promote(shared: &Shared) {
    let repl = &shared.repl;
    {
        let _a = lock(&repl.state);
        repl.generation.fetch_add(1, Ordering::AcqRel);
    }
    *lock(&repl.master) = None;
    repl.link_up.store(false, Ordering::Relaxed);
    repl.in_sync.store(false, Ordering::Release);
    shared.engine.set_replica(false);
    repl.replica.store(false, Ordering::Release);
}

/// The puller: connect, pull, apply, until the generation changes or the server stops.
fn puller(shared: &Shared, master: &str, generation: u64) {
    let repl = &shared.repl;
    let log = &shared.engine;
    let current =
        || repl.generation.load(Ordering::Acquire) == generation && !shared.shutting_down();
    let mut backoff = Duration::from_millis(20);
    while current() {
        match connect(shared, master) {
            Ok(stream) => {
                backoff = Duration::from_millis(20);
                let r = follow_link(shared, log, stream, &current);
                repl.link_up.store(false, Ordering::Relaxed);
                repl.in_sync.store(false, Ordering::Release);
                if let Err(e) = r {
                    if current() {
                        tracing::info!(master, "replication link to {master}: {e}");
                    }
                }
            }
            Err(e) => {
                if current() {
                    tracing::info!(master, "replication: cannot connect to {master}: {e}");
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
        // Wait before reconnecting, checking for a new master or shutdown meanwhile.
        let until = Instant::now() + backoff;
        while current() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The connection to the master: plain TCP, or TLS over it (`--replica-tls`).
enum LinkStream {
    Plain(TcpStream),
    Tls(Box<kvtls::TlsStream<TcpStream>>),
}

impl Read for LinkStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            LinkStream::Plain(s) => s.read(buf),
            LinkStream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for LinkStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            LinkStream::Plain(s) => s.write(buf),
            LinkStream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            LinkStream::Plain(s) => s.flush(),
            LinkStream::Tls(s) => s.flush(),
        }
    }
}

/// Replies are read through a buffer; requests are written to the stream underneath
/// (`get_mut`), which the buffer does not hold back.
type Link = BufReader<LinkStream>;

fn connect(shared: &Shared, master: &str) -> std::io::Result<LinkStream> {
    let mut last = std::io::Error::other("no address");
    for addr in master.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, IO_TIMEOUT) {
            Ok(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(IO_TIMEOUT))?;
                s.set_write_timeout(Some(IO_TIMEOUT))?;
                let Some(settings) = &shared.config.replica_tls else {
                    return Ok(LinkStream::Plain(s));
                };
                // The files are read at each connect, so renewed certificates are used
                // from the next reconnect on.
                let config = settings.config().map_err(std::io::Error::other)?;
                let session = settings
                    .connect(&config, master_host(master))
                    .map_err(std::io::Error::other)?;
                let mut tls = kvtls::TlsStream::new(session, s);
                tls.handshake_blocking()?;
                return Ok(LinkStream::Tls(Box::new(tls)));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The host of "host:port" ("[::1]:11211" gives "::1"), the name the master's certificate
/// is checked against unless `--replica-tls-name` says otherwise.
fn master_host(master: &str) -> &str {
    let host = master.rsplit_once(':').map_or(master, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// The credentials of `--replica-auth` (first line, `user:password`), read at each connect
/// so that a changed file takes effect on the next reconnect.
fn credentials(shared: &Shared) -> std::io::Result<Option<(String, String)>> {
    let Some(path) = &shared.config.replica_auth else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)?;
    let line = text.lines().next().unwrap_or_default();
    let (user, pass) = line
        .split_once(':')
        .ok_or_else(|| std::io::Error::other("--replica-auth: expected user:password"))?;
    Ok(Some((user.to_string(), pass.to_string())))
}

/// memcached's ASCII authentication (`-Y` on the master): a `set` whose data is
/// `user password`.
fn authenticate(link: &mut Link, user: &str, pass: &str) -> std::io::Result<()> {
    let token = format!("{user} {pass}");
    let mut req = format!("set replica 0 0 {}\r\n", token.len()).into_bytes();
    req.extend_from_slice(token.as_bytes());
    req.extend_from_slice(b"\r\n");
    link.get_mut().write_all(&req)?;
    let mut line = String::new();
    (&mut *link).take(512).read_line(&mut line)?;
    if line != "STORED\r\n" {
        // Never echo the token; the master's reply says why.
        return Err(std::io::Error::other(format!(
            "authentication refused: {}",
            line.trim_end()
        )));
    }
    Ok(())
}

/// One text-protocol pull: send `replpull`, read `REPL <replid> <n>` and the batch into
/// `batch`; returns the master's replid.
fn pull_text(
    link: &mut Link,
    replid: &str,
    name: &str,
    cursor: &[u8],
    line: &mut String,
    batch: &mut Vec<u8>,
) -> std::io::Result<String> {
    let mut req = format!("replpull {replid} {} {name}\r\n", cursor.len()).into_bytes();
    req.extend_from_slice(cursor);
    req.extend_from_slice(b"\r\n");
    link.get_mut().write_all(&req)?;
    line.clear();
    // Bounded: a reply line longer than this is not a REPL header.
    (&mut *link).take(512).read_line(line)?;
    let mut parts = line.trim_end().split(' ');
    let (Some("REPL"), Some(their), Some(n), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(std::io::Error::other(format!(
            "unexpected reply {:?}",
            line.trim_end()
        )));
    };
    let n: usize = n
        .parse()
        .ok()
        .filter(|&n| n <= MAX_BATCH)
        .ok_or_else(|| std::io::Error::other("bad batch length"))?;
    batch.clear();
    batch.resize(n + 2, 0);
    link.read_exact(batch)?;
    if batch.get(n..) != Some(b"\r\n".as_slice()) {
        return Err(std::io::Error::other("bad batch terminator"));
    }
    batch.truncate(n);
    Ok(their.to_string())
}

/// Read one binary response into `buf` and parse it with the protocol crate: (status,
/// key, where the value lies in `buf`).
fn read_binary(
    link: &mut Link,
    buf: &mut Vec<u8>,
) -> std::io::Result<(u16, Vec<u8>, std::ops::Range<usize>)> {
    use kvproto::binary::{parse_response, ResponseParse, HEADER_LEN};
    buf.clear();
    buf.resize(HEADER_LEN, 0);
    link.read_exact(buf)?;
    let body = buf
        .get(8..12)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, u32::from_be_bytes) as usize;
    if body > MAX_BATCH {
        return Err(std::io::Error::other("binary response too long"));
    }
    buf.resize(HEADER_LEN + body, 0);
    link.read_exact(&mut buf[HEADER_LEN..])?;
    match parse_response(buf) {
        // The value ends the packet.
        ResponseParse::Response(r, _) => Ok((
            r.status,
            r.key.to_vec(),
            buf.len() - r.value.len()..buf.len(),
        )),
        _ => Err(std::io::Error::other("not a binary response")),
    }
}

/// One binary-protocol pull ([`kvproto::binary::opcode::REPL_PULL`]); returns the master's
/// replid, with the batch in `batch`.
fn pull_binary(
    link: &mut Link,
    replid: &str,
    name: &str,
    cursor: &[u8],
    batch: &mut Vec<u8>,
) -> std::io::Result<String> {
    let mut req = Vec::new();
    let key = format!("{replid} {name}");
    kvproto::binary::write_request(
        &mut req,
        kvproto::binary::opcode::REPL_PULL,
        0,
        0,
        &[],
        key.as_bytes(),
        cursor,
    );
    link.get_mut().write_all(&req)?;
    let (status, their, value) = read_binary(link, batch)?;
    if status != 0 {
        return Err(std::io::Error::other(format!(
            "pull refused: status {status:#x} {}",
            String::from_utf8_lossy(batch.get(value).unwrap_or_default())
        )));
    }
    // Keep only the batch (the value).
    batch.drain(..value.start);
    String::from_utf8(their).map_err(|_| std::io::Error::other("bad replid"))
}

/// SASL PLAIN over the binary protocol (a master with `-S`).
fn authenticate_sasl(link: &mut Link, user: &str, pass: &str) -> std::io::Result<()> {
    let mut data = Vec::with_capacity(user.len() + pass.len() + 2);
    data.push(0);
    data.extend_from_slice(user.as_bytes());
    data.push(0);
    data.extend_from_slice(pass.as_bytes());
    let mut req = Vec::new();
    kvproto::binary::write_request(
        &mut req,
        kvproto::binary::opcode::SASL_AUTH,
        0,
        0,
        &[],
        b"PLAIN",
        &data,
    );
    link.get_mut().write_all(&req)?;
    let mut body = Vec::new();
    let (status, _, _) = read_binary(link, &mut body)?;
    if status != 0 {
        // Never echo the credentials; the master's status says why.
        return Err(std::io::Error::other(format!(
            "SASL authentication refused: status {status:#x}"
        )));
    }
    Ok(())
}

/// How long a replica waits before its next pull, given the wait before its last one and
/// what the last batch brought (`idle`: nothing new; `len`: its bytes).
/// - Nothing new: poll again soon, backing off while it stays idle (1 ms doubling to
///   10 ms): an idle link costs both ends well under 1% of a core, and a write waits at
///   most 10 ms for the next pull.
/// - A small batch: [`GATHER_WAIT`] (see [`GATHER_BELOW`]).
/// - A batch of `GATHER_BELOW` or more: at once.
fn pull_pause(last: Duration, idle: bool, len: usize) -> Duration {
    if idle {
        (last * 2)
            .max(Duration::from_millis(1))
            .min(Duration::from_millis(10))
    } else if len < GATHER_BELOW {
        GATHER_WAIT
    } else {
        Duration::ZERO
    }
}

/// Pull over one connection until it fails or the puller must stop.
fn follow_link(
    shared: &Shared,
    log: &LogEngine,
    stream: LinkStream,
    current: &dyn Fn() -> bool,
) -> std::io::Result<()> {
    let repl = &shared.repl;
    let mut link = BufReader::new(stream);
    let binary = shared.config.replica_auth_sasl;
    if let Some((user, pass)) = credentials(shared)? {
        if binary {
            authenticate_sasl(&mut link, &user, &pass)?;
        } else {
            authenticate(&mut link, &user, &pass)?;
        }
    }
    let mut first = true;
    let mut cursor = Vec::new();
    let mut line = String::new();
    let mut batch = Vec::new();
    let mut idle = Duration::ZERO;
    while current() {
        cursor.clear();
        lock(&repl.state).cursor(&mut cursor);
        let replid = lock(&repl.master_replid).clone();
        let their = if binary {
            pull_binary(&mut link, &replid, &repl.replid, &cursor, &mut batch)?
        } else {
            pull_text(
                &mut link,
                &replid,
                &repl.replid,
                &cursor,
                &mut line,
                &mut batch,
            )?
        };
        let their = their.as_str();
        if their != replid {
            // Another log (a new master, or it restarted): this batch starts a full sync
            // (a reset) or continues this replica in the new log (a switch).
            *lock(&repl.master_replid) = their.to_string();
        }
        // Apply only while this puller is still the current one (checked under the lock
        // that promotion and a new master take).
        let (applied, applied_bytes) = {
            let mut st = lock(&repl.state);
            if !current() {
                return Ok(());
            }
            let a = log.repl_apply(&mut st, &batch, shared.clock.now());
            if a.is_err() {
                // A batch we cannot apply: start over with a full sync.
                st.restart();
            }
            repl.in_sync
                .store(a.is_ok() && st.phase() == "tail", Ordering::Release);
            (a, st.applied_bytes)
        };
        repl.link_up.store(true, Ordering::Relaxed);
        match applied {
            Ok(a) => {
                if a.reset {
                    let n = repl.full_syncs.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::info!("replication: full sync {n} from the master begins");
                } else if first {
                    repl.partial_syncs.fetch_add(1, Ordering::Relaxed);
                }
                first = false;
                repl.applied_bytes.store(applied_bytes, Ordering::Relaxed);
                repl.master_offset.store(a.master_offset, Ordering::Relaxed);
                repl.last_io_ms
                    .store(repl.started.elapsed().as_millis() as u64, Ordering::Relaxed);
                idle = pull_pause(idle, a.idle, batch.len());
                if !idle.is_zero() {
                    std::thread::sleep(idle);
                }
            }
            Err(e) => {
                return Err(std::io::Error::other(format!("bad batch: {e}")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulls_back_off_while_idle_and_gather_a_trickle() {
        let ms = Duration::from_millis;
        // Idle: 1 ms, doubling, at most 10 ms.
        let mut w = Duration::ZERO;
        let mut seen = Vec::new();
        for _ in 0..6 {
            w = pull_pause(w, true, 0);
            seen.push(w);
        }
        assert_eq!(seen, [ms(1), ms(2), ms(4), ms(8), ms(10), ms(10)]);
        // A small batch waits for more to gather, whatever the backoff was.
        assert_eq!(pull_pause(ms(10), false, 100), GATHER_WAIT);
        assert_eq!(
            pull_pause(Duration::ZERO, false, GATHER_BELOW - 1),
            GATHER_WAIT
        );
        // A full batch (a replica behind, or writes fast) pulls again at once.
        assert_eq!(pull_pause(ms(10), false, GATHER_BELOW), Duration::ZERO);
        assert_eq!(pull_pause(Duration::ZERO, false, 4 << 20), Duration::ZERO);
    }
}
