//! `stats detail`: memcached's per-prefix counters. A key's prefix is what comes before the
//! first `-D` delimiter (`:` by default); keys without one are not counted, as in memcached.
//! `stats detail on|off` switches counting at run time (`-D` switches it on at start);
//! `stats detail dump` lists `PREFIX <prefix> get <n> hit <n> set <n> del <n>` lines.
//!
//! Off, the request path pays one relaxed load. On, every counted request takes one lock,
//! as memcached's `STATS_LOCK` does: the feature is for diagnosis, not for always-on use.
//! Like memcached, at most [`MAX_PREFIXES`] prefixes are tracked (a client choosing keys
//! must not be able to grow the table without bound); keys with other prefixes are not
//! counted once the table is full. `stats reset` empties it.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// memcached's `MAX_PREFIX_COUNT`.
pub const MAX_PREFIXES: usize = 1 << 16;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub get: u64,
    pub hit: u64,
    pub set: u64,
    pub del: u64,
}

pub struct PrefixStats {
    enabled: AtomicBool,
    delimiter: u8,
    /// Ordered, so that a dump can resume after the last prefix it wrote.
    table: Mutex<BTreeMap<Box<[u8]>, Counts>>,
}

impl PrefixStats {
    pub fn new(delimiter: u8, enabled: bool) -> PrefixStats {
        PrefixStats {
            enabled: AtomicBool::new(enabled),
            delimiter,
            table: Mutex::new(BTreeMap::new()),
        }
    }

    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub fn delimiter(&self) -> u8 {
        self.delimiter
    }

    /// A get of `key` (one per key of a multiget), a hit or a miss.
    #[inline]
    pub fn record_get(&self, key: &[u8], hit: bool) {
        if self.enabled() {
            self.record(key, &|c| {
                c.get += 1;
                c.hit += u64::from(hit);
            });
        }
    }

    /// A storage command for `key`, whatever its outcome (memcached counts before storing).
    #[inline]
    pub fn record_set(&self, key: &[u8]) {
        if self.enabled() {
            self.record(key, &|c| c.set += 1);
        }
    }

    /// A delete of `key`, hit or miss.
    #[inline]
    pub fn record_delete(&self, key: &[u8]) {
        if self.enabled() {
            self.record(key, &|c| c.del += 1);
        }
    }

    #[cold]
    #[inline(never)]
    fn record(&self, key: &[u8], f: &dyn Fn(&mut Counts)) {
        let Some(prefix) = prefix(key, self.delimiter) else {
            return;
        };
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = table.get_mut(prefix) {
            f(c);
        } else if table.len() < MAX_PREFIXES {
            let mut c = Counts::default();
            f(&mut c);
            table.insert(prefix.into(), c);
        }
    }

    /// Append dump lines for the prefixes after `after` (from the first with `None`) until
    /// `out` reaches `limit` bytes (at least one line is written); returns the last prefix
    /// written if more remain, `None` when the dump is complete (then `END` is written too).
    pub fn dump(&self, after: Option<&[u8]>, out: &mut Vec<u8>, limit: usize) -> Option<Vec<u8>> {
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let range = match after {
            Some(p) => table.range::<[u8], _>((Bound::Excluded(p), Bound::Unbounded)),
            None => table.range::<[u8], _>(..),
        };
        let mut written: Option<&[u8]> = None;
        for (prefix, c) in range {
            if let Some(last) = written.filter(|_| out.len() >= limit) {
                return Some(last.to_vec());
            }
            written = Some(prefix);
            out.extend_from_slice(b"PREFIX ");
            out.extend_from_slice(prefix);
            // Writing to a Vec cannot fail.
            let _ = write!(
                out,
                " get {} hit {} set {} del {}\r\n",
                c.get, c.hit, c.set, c.del
            );
        }
        out.extend_from_slice(b"END\r\n");
        None
    }

    /// `stats reset`: forget every prefix.
    pub fn clear(&self) {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    #[cfg(test)]
    fn get(&self, prefix: &[u8]) -> Option<Counts> {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(prefix)
            .copied()
    }
}

/// `key` up to its first `delimiter`, or `None` when there is none before the end or a NUL
/// byte (memcached reads keys as C strings here).
fn prefix(key: &[u8], delimiter: u8) -> Option<&[u8]> {
    let end = key.iter().position(|&b| b == delimiter || b == 0)?;
    (key[end] == delimiter).then(|| &key[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_prefix_only_when_enabled() {
        let p = PrefixStats::new(b':', false);
        p.record_get(b"user:1", true);
        assert_eq!(p.get(b"user"), None, "off counts nothing");
        p.set_enabled(true);
        p.record_get(b"user:1", true);
        p.record_get(b"user:2", false);
        p.record_set(b"user:3");
        p.record_delete(b"user:1");
        p.record_set(b"nodelimiter");
        p.record_set(b"a\0b:c");
        p.record_set(b":empty");
        assert_eq!(
            p.get(b"user"),
            Some(Counts {
                get: 2,
                hit: 1,
                set: 1,
                del: 1
            })
        );
        assert_eq!(p.get(b"").map(|c| c.set), Some(1), "an empty prefix counts");
        let mut out = Vec::new();
        assert_eq!(p.dump(None, &mut out, usize::MAX), None);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "PREFIX  get 0 hit 0 set 1 del 0\r\nPREFIX user get 2 hit 1 set 1 del 1\r\nEND\r\n"
        );
        p.clear();
        let mut out = Vec::new();
        p.dump(None, &mut out, usize::MAX);
        assert_eq!(out, b"END\r\n");
    }

    #[test]
    fn the_table_is_bounded() {
        let p = PrefixStats::new(b'/', true);
        for i in 0..MAX_PREFIXES + 10 {
            p.record_set(format!("{i}/k").as_bytes());
        }
        assert_eq!(p.table.lock().unwrap().len(), MAX_PREFIXES);
        // Known prefixes still count.
        p.record_set(b"0/x");
        assert_eq!(p.get(b"0").unwrap().set, 2);
    }

    #[test]
    fn a_dump_resumes_where_it_stopped() {
        let p = PrefixStats::new(b':', true);
        for i in 0..100 {
            p.record_set(format!("p{i:03}:k").as_bytes());
        }
        let mut whole = Vec::new();
        p.dump(None, &mut whole, usize::MAX);
        let mut pieces = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        let mut turns = 0;
        loop {
            let mut out = Vec::new();
            after = p.dump(after.as_deref(), &mut out, 0);
            pieces.extend_from_slice(&out);
            turns += 1;
            if after.is_none() {
                break;
            }
        }
        assert_eq!(turns, 100, "one line per turn with a limit of 0");
        assert_eq!(pieces, whole);
    }
}
