//! Helpers shared by the replication tests (`replication.rs`, `replication_netns.rs`):
//! `stats replication`, dumping and loading keys.

use std::collections::BTreeMap;
use std::time::Duration;

pub use super::poll_until;
use super::Client;

/// How long a replica gets to converge.
pub const SYNC: Duration = Duration::from_secs(30);

/// The raw `gets` reply block (`VALUE` line, data, `\r\n`) of every key present, by key.
pub type Dump = BTreeMap<String, Vec<u8>>;

/// One value of `stats replication`.
pub fn repl_stat(c: &mut Client, name: &str) -> Option<String> {
    c.stats("replication")
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// `stats replication` `name` as a number (fails if absent or not a number).
pub fn repl_num(c: &mut Client, name: &str) -> u64 {
    let v = repl_stat(c, name).unwrap_or_else(|| panic!("no STAT {name} in stats replication"));
    v.parse()
        .unwrap_or_else(|_| panic!("STAT {name} {v} is not a number"))
}

/// Poll until `stats replication` reports `name` as `want`.
pub fn wait_stat(c: &mut Client, who: &str, name: &str, want: &str) {
    poll_until(&format!("{who}: {name} {want}"), SYNC, || {
        match repl_stat(c, name) {
            Some(v) if v == want => Ok(()),
            other => Err(format!("{name} is {other:?}")),
        }
    });
}

/// `gets` every key (in chunks of 50 per request) and return the reply block of each hit.
pub fn dump(c: &mut Client, keys: &[String]) -> Dump {
    let mut out = Dump::new();
    for chunk in keys.chunks(50) {
        c.send(format!("gets {}\r\n", chunk.join(" ")).as_bytes());
        loop {
            let line = c.line();
            if line == "END\r\n" {
                break;
            }
            let fields: Vec<&str> = line.trim_end().split(' ').collect();
            assert!(
                fields.len() == 5 && fields[0] == "VALUE",
                "unexpected line in a gets reply: {line:?}"
            );
            let len: usize = fields[3]
                .parse()
                .unwrap_or_else(|_| panic!("bad length in {line:?}"));
            let mut block = line.as_bytes().to_vec();
            let data = c.exact(len + 2);
            assert!(data.ends_with(b"\r\n"), "data block of {line:?} not ended");
            block.extend_from_slice(&data);
            out.insert(fields[1].to_string(), block);
        }
    }
    out
}

pub fn show(block: Option<&Vec<u8>>) -> String {
    match block {
        None => "absent".to_string(),
        Some(b) if b.len() > 200 => format!("{:?}...", String::from_utf8_lossy(&b[..200])),
        Some(b) => format!("{:?}", String::from_utf8_lossy(b)),
    }
}

/// Store `(key, value)` pairs with plain `set`s, pipelined 100 at a time.
pub fn fill(c: &mut Client, items: &[(String, Vec<u8>)]) {
    fill_expiring(c, items, 0);
}

/// [`fill`] with the expiry `exptime` (memcached's: seconds from now up to 30 days).
pub fn fill_expiring(c: &mut Client, items: &[(String, Vec<u8>)], exptime: u32) {
    for batch in items.chunks(100) {
        let mut req = Vec::new();
        for (k, v) in batch {
            req.extend_from_slice(format!("set {k} 0 {exptime} {}\r\n", v.len()).as_bytes());
            req.extend_from_slice(v);
            req.extend_from_slice(b"\r\n");
        }
        c.send(&req);
        for (k, _) in batch {
            assert_eq!(c.line(), "STORED\r\n", "set {k}");
        }
    }
}

/// The remaining TTL `mg <key> t` reports (-1: never expires), or None on a miss.
pub fn ttl(c: &mut Client, key: &str) -> Option<i64> {
    let l = c.call(&format!("mg {key} t\r\n"));
    if l == "EN\r\n" {
        return None;
    }
    let t = l
        .trim_end()
        .split(' ')
        .find_map(|f| f.strip_prefix('t'))
        .unwrap_or_else(|| panic!("mg {key} t answered {l:?}"));
    Some(t.parse().unwrap_or_else(|_| panic!("mg {key} t: {l:?}")))
}
