//! `watch`: memcached's log watchers. A connection that sends `watch fetchers mutations ...`
//! becomes a watcher and receives a `key=value` line for every event of those kinds, in
//! memcached's formats (`ts=SEC.USEC gid=N type=item_get key=... status=found ...`).
//!
//! Cost: with no watcher the request path pays one relaxed load ([`Watchers::wants`]).
//! With watchers, an event is formatted once and appended to the buffer of each watcher
//! that asked for its kind, under that watcher's lock; the watcher's worker is woken only
//! when its buffer goes from empty to not empty, and copies the buffer into the
//! connection's output when it runs. A buffer holds at most [`BUF_CAP`] bytes (memcached's
//! 256 KiB; `-o watcher_logbuf_size` as in memcached): events that do not fit are dropped and counted, and the watcher later reads
//! `skipped=N` where they were, as memcached writes it. At most [`MAX_WATCHERS`] watchers
//! exist at once (memcached's limit). A watcher whose connection has closed is dropped from
//! the list by the next event.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// memcached's `LOGGER_WATCHER_BUF_SIZE`.
pub const BUF_CAP: usize = 256 * 1024;
/// memcached's `WATCHER_LIMIT`.
pub const MAX_WATCHERS: usize = 20;

/// Event kinds, as `watch` names them.
pub const FETCHERS: u32 = 1;
pub const MUTATIONS: u32 = 1 << 1;
pub const EVICTIONS: u32 = 1 << 2;
pub const CONNEVENTS: u32 = 1 << 3;
pub const DELETIONS: u32 = 1 << 4;

/// The kinds `watch`'s arguments name (memcached's `strncmp` prefixes, in its order), or
/// `None` for an argument it does not know. Kinds memcached has and kvcached never emits
/// (`rawcmds`, `sysevents`, `proxyreqs`, `proxyevents`, `proxyuser`) are accepted and
/// give no lines. No argument means `fetchers`.
pub fn parse_kinds(args: &[&[u8]]) -> Option<u32> {
    if args.is_empty() {
        return Some(FETCHERS);
    }
    let mut kinds = 0;
    for &t in args {
        let is = |word: &[u8]| !t.is_empty() && word.starts_with(t);
        kinds |= if is(b"rawcmds") {
            0
        } else if is(b"evictions") {
            EVICTIONS
        } else if is(b"fetchers") {
            FETCHERS
        } else if is(b"mutations") {
            MUTATIONS
        } else if is(b"sysevents") {
            0
        } else if is(b"connevents") {
            CONNEVENTS
        } else if is(b"proxyreqs") || is(b"proxyevents") || is(b"proxyuser") {
            0
        } else if is(b"deletions") {
            DELETIONS
        } else {
            return None;
        };
    }
    Some(kinds)
}

/// One watcher: its kinds, its buffer, and how to wake the worker that serves it.
pub struct Watcher {
    kinds: u32,
    buf: Mutex<Buf>,
    wake: Box<dyn Fn() + Send + Sync>,
    gone: AtomicBool,
}

#[derive(Default)]
struct Buf {
    bytes: Vec<u8>,
    skipped: u64,
}

impl Watcher {
    /// Move up to `max` bytes of whole lines into `out` (with a `skipped=N` line where
    /// events were dropped); returns whether more remain.
    pub fn drain(&self, out: &mut Vec<u8>, max: usize) -> bool {
        let mut buf = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        if buf.bytes.len() <= max {
            out.extend_from_slice(&buf.bytes);
            buf.bytes.clear();
            if buf.skipped > 0 {
                let _ = writeln!(out, "skipped={}", buf.skipped);
                buf.skipped = 0;
            }
            if buf.bytes.capacity() > 64 * 1024 {
                buf.bytes = Vec::new();
            }
            return false;
        }
        // Whole lines only.
        let cut = buf.bytes[..max]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        out.extend_from_slice(&buf.bytes[..cut]);
        buf.bytes.drain(..cut);
        true
    }

    /// The connection is closed: no more events.
    pub fn close(&self) {
        self.gone.store(true, Ordering::Relaxed);
    }
}

/// Every watcher, and the kinds any of them wants.
pub struct Watchers {
    /// Bytes a watcher's buffer holds at most (`-o watcher_logbuf_size`, [`BUF_CAP`] by
    /// default).
    cap: usize,
    mask: AtomicU32,
    /// Events written (`log_worker_written`), and the next event's `gid`.
    gid: AtomicU64,
    /// Lines appended to watchers' buffers (`log_watcher_sent`) and dropped because a
    /// buffer was full (`log_watcher_skipped`).
    sent: AtomicU64,
    skipped: AtomicU64,
    /// Read-locked by events (so workers emitting at once do not queue on it), written
    /// when a watcher comes or goes.
    list: RwLock<Vec<Arc<Watcher>>>,
}

impl Default for Watchers {
    fn default() -> Watchers {
        Watchers::with_capacity(BUF_CAP)
    }
}

impl Watchers {
    /// No watcher yet; each will buffer at most `cap` bytes.
    pub fn with_capacity(cap: usize) -> Watchers {
        Watchers {
            cap,
            mask: AtomicU32::new(0),
            gid: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            list: RwLock::new(Vec::new()),
        }
    }

    /// Whether any watcher wants events of `kind`: the request path's only cost when none
    /// does.
    #[inline]
    pub fn wants(&self, kind: u32) -> bool {
        self.mask.load(Ordering::Relaxed) & kind != 0
    }

    /// A new watcher of `kinds`, woken by `wake`; `None` at the limit.
    pub fn add(&self, kinds: u32, wake: Box<dyn Fn() + Send + Sync>) -> Option<Arc<Watcher>> {
        let mut list = self.list.write().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| !w.gone.load(Ordering::Relaxed));
        if list.len() >= MAX_WATCHERS {
            return None;
        }
        let w = Arc::new(Watcher {
            kinds,
            buf: Mutex::new(Buf::default()),
            wake,
            gone: AtomicBool::new(false),
        });
        list.push(w.clone());
        self.mask.fetch_or(kinds, Ordering::Relaxed);
        Some(w)
    }

    /// Send an event of `kind` to the watchers that want it: `body` writes the line's text
    /// after `ts=... gid=... ` (no newline).
    pub fn emit(&self, kind: u32, body: impl FnOnce(&mut Vec<u8>)) {
        if !self.wants(kind) {
            return;
        }
        let list = self.list.read().unwrap_or_else(|e| e.into_inner());
        if list.iter().any(|w| w.gone.load(Ordering::Relaxed)) {
            drop(list);
            self.prune();
            return self.emit(kind, body);
        }
        if !list.iter().any(|w| w.kinds & kind != 0) {
            return;
        }
        let (sec, usec) = timestamp();
        let gid = self.gid.fetch_add(1, Ordering::Relaxed);
        let mut line = Vec::with_capacity(160);
        let _ = write!(line, "ts={sec}.{usec} gid={gid} ");
        body(&mut line);
        line.push(b'\n');
        for w in list.iter().filter(|w| w.kinds & kind != 0) {
            let mut buf = w.buf.lock().unwrap_or_else(|e| e.into_inner());
            if buf.bytes.len() + line.len() > self.cap {
                buf.skipped += 1;
                self.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.sent.fetch_add(1, Ordering::Relaxed);
            let was_empty = buf.bytes.is_empty();
            if buf.skipped > 0 {
                // Where events were dropped, as memcached marks it.
                let skipped = std::mem::take(&mut buf.skipped);
                let _ = writeln!(buf.bytes, "skipped={skipped}");
            }
            buf.bytes.extend_from_slice(&line);
            drop(buf);
            if was_empty {
                (w.wake)();
            }
        }
    }
}

impl Watchers {
    /// `stats`: (`log_worker_written`, `log_watcher_sent`, `log_watcher_skipped`,
    /// `log_watchers`).
    pub fn counts(&self) -> (u64, u64, u64, usize) {
        let list = self.list.read().unwrap_or_else(|e| e.into_inner());
        let live = list
            .iter()
            .filter(|w| !w.gone.load(Ordering::Relaxed))
            .count();
        (
            self.gid.load(Ordering::Relaxed),
            self.sent.load(Ordering::Relaxed),
            self.skipped.load(Ordering::Relaxed),
            live,
        )
    }

    /// Drop the watchers whose connections have closed, and recompute the mask.
    #[cold]
    fn prune(&self) {
        let mut list = self.list.write().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| !w.gone.load(Ordering::Relaxed));
        let mask = list.iter().fold(0, |m, w| m | w.kinds);
        self.mask.store(mask, Ordering::Relaxed);
    }
}

/// Wall-clock seconds and microseconds (memcached's `gettimeofday`).
fn timestamp() -> (u64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs(), d.subsec_micros())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn kinds_parse_as_memcached() {
        assert_eq!(parse_kinds(&[]), Some(FETCHERS));
        assert_eq!(
            parse_kinds(&[b"fetchers", b"mutations", b"ev", b"conn", b"del"]),
            Some(FETCHERS | MUTATIONS | EVICTIONS | CONNEVENTS | DELETIONS)
        );
        assert_eq!(parse_kinds(&[b"proxyreqs"]), Some(0));
        assert_eq!(parse_kinds(&[b"fetchers", b"bogus"]), None);
        assert_eq!(parse_kinds(&[b"fetchersx"]), None);
    }

    #[test]
    fn events_reach_only_watchers_of_their_kind_and_wake_once() {
        let ws = Watchers::default();
        assert!(!ws.wants(FETCHERS));
        let wakes = Arc::new(AtomicUsize::new(0));
        let w2 = wakes.clone();
        let a = ws
            .add(
                FETCHERS,
                Box::new(move || {
                    w2.fetch_add(1, Ordering::Relaxed);
                }),
            )
            .unwrap();
        let b = ws.add(MUTATIONS, Box::new(|| {})).unwrap();
        ws.emit(FETCHERS, |l| l.extend_from_slice(b"type=item_get key=a"));
        ws.emit(FETCHERS, |l| l.extend_from_slice(b"type=item_get key=b"));
        ws.emit(DELETIONS, |_| panic!("nobody wants deletions"));
        assert_eq!(
            wakes.load(Ordering::Relaxed),
            1,
            "woken when the buffer filled"
        );
        let mut out = Vec::new();
        assert!(!a.drain(&mut out, usize::MAX));
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("ts=") && lines[0].contains(" gid=0 type=item_get key=a"));
        assert!(lines[1].contains(" gid=1 type=item_get key=b"));
        let mut out = Vec::new();
        b.drain(&mut out, usize::MAX);
        assert!(out.is_empty());
        // A closed watcher is dropped by the next event, and the mask follows.
        a.close();
        ws.emit(FETCHERS, |_| {});
        assert!(!ws.wants(FETCHERS));
        assert!(ws.wants(MUTATIONS));
    }

    #[test]
    fn watcher_logbuf_size_bounds_each_buffer() {
        // -o watcher_logbuf_size=8: 8 KiB, so about eight lines of 1000 bytes fit.
        let ws = Watchers::with_capacity(8 * 1024);
        let w = ws.add(FETCHERS, Box::new(|| {})).unwrap();
        let body = "x".repeat(1000);
        for _ in 0..20 {
            ws.emit(FETCHERS, |l| l.extend_from_slice(body.as_bytes()));
        }
        let mut out = Vec::new();
        while w.drain(&mut out, usize::MAX) {}
        let kept = out
            .split(|&b| b == b'\n')
            .filter(|l| l.starts_with(b"ts="))
            .count();
        assert!((7..=8).contains(&kept), "{kept}");
        assert_eq!(ws.counts().2, 20 - kept as u64);
    }

    #[test]
    fn a_full_buffer_drops_and_counts() {
        let ws = Watchers::default();
        let w = ws.add(FETCHERS, Box::new(|| {})).unwrap();
        let body = "x".repeat(1000);
        for _ in 0..300 {
            ws.emit(FETCHERS, |l| l.extend_from_slice(body.as_bytes()));
        }
        let mut out = Vec::new();
        // Drained in pieces of whole lines.
        assert!(w.drain(&mut out, 10_000));
        assert!(out.ends_with(b"\n") && out.len() <= 10_000);
        while w.drain(&mut out, 10_000) {}
        let text = String::from_utf8(out).unwrap();
        let kept = text.lines().filter(|l| l.starts_with("ts=")).count();
        let skipped: usize = text
            .lines()
            .last()
            .and_then(|l| l.strip_prefix("skipped="))
            .expect("skipped= after the kept lines")
            .parse()
            .unwrap();
        assert!(kept < 300 && kept > 200, "{kept}");
        assert_eq!(kept + skipped, 300);
        // Drops between events are marked where they happened.
        for _ in 0..300 {
            ws.emit(FETCHERS, |l| l.extend_from_slice(body.as_bytes()));
        }
        let mut first = Vec::new();
        w.drain(&mut first, 100_000);
        ws.emit(FETCHERS, |l| l.extend_from_slice(b"after"));
        let mut out = Vec::new();
        while w.drain(&mut out, usize::MAX) {}
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("skipped="))
            .unwrap();
        assert!(lines[at + 1].ends_with("after"), "{:?}", &lines[at..]);
    }

    #[test]
    fn the_number_of_watchers_is_bounded() {
        let ws = Watchers::default();
        let all: Vec<_> = (0..MAX_WATCHERS)
            .map(|_| ws.add(FETCHERS, Box::new(|| {})).unwrap())
            .collect();
        assert!(ws.add(FETCHERS, Box::new(|| {})).is_none());
        all[0].close();
        assert!(ws.add(FETCHERS, Box::new(|| {})).is_some());
    }
}
