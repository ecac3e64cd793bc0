//! memcached's view of an item (its size with memcached's header, and the slab class that
//! size falls in) and the listings built from it: `lru_crawler metadump` and `mgdump`.
//!
//! A dump walks the item index a few buckets at a time and streams: whenever the pending
//! output passes the high-water mark it pauses ([`Step::Pause`]) and, once the client has
//! read, resumes at the next bucket ([`Resume::Bucket`]). It holds no lock between turns,
//! so the server keeps serving (memcached's "does not lock the cache"), and it costs the
//! connection no more buffer than a large multiget. It also stops after a turn's share of
//! the walk ([`Session::yield_turn`]), so that the worker's other connections are served
//! while it walks an index whose items are mostly not listed. An item that stays live throughout is
//! listed once; one written or removed meanwhile may or may not be, and if the index grows
//! during the dump an item may be listed twice (never missed).

use std::io::Write as _;

use kvproto::admin::{CrawlerClasses, DumpKind};
use kvproto::text as proto;
use kvstore::{EngineConfig, ScanItem};

use crate::exec::session::{Ctx, Resume, Session, Step, OUTPUT_HIGH_WATER};
use crate::setup::config::{slab_class_of, Config};

/// Index buckets visited per engine call (the bucket locks are held only during a call).
const BUCKETS_PER_SCAN: usize = 64;
/// Engine calls a dump makes per turn of its worker's loop before it lets the worker's
/// other connections run (about 1 ms of reading records at 2,000,000 items): a dump of a
/// class with few items would otherwise walk the whole index in one go, and every other
/// connection of the worker would wait for it (380 ms at 2,000,000 items).
const SCANS_PER_TURN: usize = 8;

/// The size memcached would give the item (header, CAS, key, value, flags) and its slab
/// class with memcached's default slab sizes.
pub fn size_and_class(
    config: &Config,
    key_len: usize,
    value_len: usize,
    flags: u32,
) -> (usize, u32) {
    let sizing = EngineConfig {
        max_bytes: 0,
        max_item_size: config.item_size_max,
        no_evict: false,
        use_cas: config.use_cas,
    };
    let size = sizing.item_size(key_len, value_len, flags);
    (size, slab_class_of(&config.slab_classes, size))
}

/// `lru_crawler metadump|mgdump CLASSES`, with memcached 1.6.45's replies: `OK`, then a line
/// per live item in the classes asked for, then `END` (metadump) or `EN` (mgdump).
pub fn dump(ctx: &mut Ctx<'_>, s: &mut Session, kind: DumpKind, classes: &[u8]) -> Step {
    let config = &ctx.shared.config;
    let resumed = match s.resume {
        Resume::Bucket(b) => Some(b),
        _ => None,
    };
    if resumed.is_none() {
        if !ctx.shared.crawler.enabled() {
            s.out
                .extend_from_slice(b"CLIENT_ERROR lru crawler disabled\r\n");
            return Step::Next;
        }
        if !config.dump_enabled {
            s.out.extend_from_slice(match kind {
                DumpKind::Meta => b"ERROR metadump not allowed\r\n",
                DumpKind::Keys => b"ERROR key dump not allowed\r\n",
            });
            return Step::Next;
        }
        // memcached streams a dump from another thread, so it refuses to start one while
        // replies to earlier pipelined requests are still queued.
        if s.pending() > 0 {
            s.out.extend_from_slice(match kind {
                DumpKind::Meta => b"ERROR cannot pipeline other commands before metadump\r\n",
                DumpKind::Keys => b"ERROR cannot pipeline other commands before mgdump\r\n",
            });
            return Step::Next;
        }
    }
    let wanted = match kvproto::admin::crawler_classes(classes) {
        CrawlerClasses::Bad => {
            s.out.extend_from_slice(b"BADCLASS invalid class id\r\n");
            return Step::Next;
        }
        CrawlerClasses::None => {
            s.out.extend_from_slice(b"NOTSTARTED no items to crawl\r\n");
            return Step::Next;
        }
        CrawlerClasses::All => u64::MAX,
        CrawlerClasses::Some(mask) => mask,
    };
    let mut bucket = match resumed {
        Some(b) => b,
        None => {
            s.out.extend_from_slice(proto::OK);
            kvstore::ScanCursor::default()
        }
    };
    s.resume = Resume::Start;
    let shared = ctx.shared;
    let now = shared.clock.now();
    let mut scans = 0;
    loop {
        let out = &mut s.out;
        let next = shared
            .engine
            .scan(bucket, BUCKETS_PER_SCAN, now, &mut |item| {
                let (size, class) = size_and_class(
                    &shared.config,
                    item.key.len(),
                    item.meta.value_len,
                    item.meta.flags,
                );
                if class < 64 && wanted & (1u64 << class) == 0 {
                    return;
                }
                match kind {
                    DumpKind::Meta => metadump_line(out, &item, size, class),
                    DumpKind::Keys => mgdump_line(out, &item),
                }
            });
        match next {
            None => {
                s.out.extend_from_slice(match kind {
                    DumpKind::Meta => proto::END,
                    DumpKind::Keys => kvproto::meta::EN,
                });
                return Step::Next;
            }
            Some(b) => bucket = b,
        }
        scans += 1;
        if s.pending() >= OUTPUT_HIGH_WATER || scans >= SCANS_PER_TURN && s.yield_turn() {
            s.resume = Resume::Bucket(bucket);
            return Step::Pause;
        }
    }
}

/// Most bytes a `stats cachedump` reply holds, `END` included (memcached's 2 MB buffer).
const CACHEDUMP_MAX: usize = 2 * 1024 * 1024;

/// A `stats cachedump` argument as memcached reads it: decimal digits that fit 32 bits.
fn dump_arg(t: &[u8]) -> Option<u32> {
    if t.is_empty() || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// `stats cachedump CLASS LIMIT`, with memcached 1.6.45's replies: an `ITEM KEY [N b; T s]`
/// line per item of slab class CLASS (N the value's length, T its expiry as a unix time, 0
/// for none), at most LIMIT of them (0: no limit) and 2 MB in all, then `END`; binary keys
/// are left out. memcached lists the class's cold LRU only (recently written items are in
/// its hot LRU and not shown); kvcached has no LRU segments and lists the class's live
/// items in index order. The reply is bounded; the index is walked a turn's share at a
/// time (the worker's other connections run in between) until the limit is met.
pub fn cachedump(ctx: &mut Ctx<'_>, s: &mut Session, mut args: proto::Tokens<'_>) -> Step {
    let shared = ctx.shared;
    if !shared.config.dump_enabled {
        s.out
            .extend_from_slice(b"CLIENT_ERROR stats cachedump not allowed\r\n");
        return Step::Next;
    }
    let (Some(id), Some(limit)) = (args.next(), args.next()) else {
        s.out
            .extend_from_slice(b"CLIENT_ERROR bad command line\r\n");
        return Step::Next;
    };
    let (Some(id), Some(limit)) = (dump_arg(id), dump_arg(limit)) else {
        s.out
            .extend_from_slice(b"CLIENT_ERROR bad command line format\r\n");
        return Step::Next;
    };
    if id >= 64 {
        s.out.extend_from_slice(b"CLIENT_ERROR Illegal slab id\r\n");
        return Step::Next;
    }
    let now = shared.clock.now();
    let (mut bucket, mut shown, mut written) = match std::mem::take(&mut s.resume) {
        Resume::CacheDump {
            bucket,
            shown,
            written,
        } => (bucket, shown, written),
        _ => (kvstore::ScanCursor::default(), 0u32, 0),
    };
    let mut full = false;
    let mut line = Vec::with_capacity(300);
    let mut scans = 0;
    while !full && (limit == 0 || shown < limit) {
        let out = &mut s.out;
        let next = shared
            .engine
            .scan(bucket, BUCKETS_PER_SCAN, now, &mut |item| {
                if full || (limit != 0 && shown >= limit) || item.meta.binary_key {
                    return;
                }
                let (_, class) = size_and_class(
                    &shared.config,
                    item.key.len(),
                    item.meta.value_len,
                    item.meta.flags,
                );
                if class != id {
                    return;
                }
                line.clear();
                line.extend_from_slice(b"ITEM ");
                line.extend_from_slice(item.key);
                // Writing to a Vec cannot fail.
                let _ = write!(
                    line,
                    " [{} b; {} s]\r\n",
                    item.meta.value_len, item.meta.exptime
                );
                if written + line.len() + proto::END.len() > CACHEDUMP_MAX {
                    full = true;
                    return;
                }
                out.extend_from_slice(&line);
                written += line.len();
                shown += 1;
            });
        match next {
            Some(b) => bucket = b,
            None => break,
        }
        scans += 1;
        if !full && (limit == 0 || shown < limit) && scans >= SCANS_PER_TURN && s.yield_turn() {
            s.resume = Resume::CacheDump {
                bucket,
                shown,
                written,
            };
            return Step::Pause;
        }
    }
    s.out.extend_from_slice(proto::END);
    Step::Next
}

/// `key=... exp=... la=... cas=... fetch=... cls=... size=... flags=... ` and a newline, as
/// memcached 1.6.45 writes it (the key URI-encoded, expiry and last access as unix times,
/// `exp=-1` for no expiry).
fn metadump_line(out: &mut Vec<u8>, scanned: &ScanItem<'_>, size: usize, class: u32) {
    out.extend_from_slice(b"key=");
    kvproto::admin::uri_encode(out, scanned.key);
    let item = &scanned.meta;
    let exp = if item.exptime == 0 {
        -1
    } else {
        i64::from(item.exptime)
    };
    let fetch = if item.fetched { "yes" } else { "no" };
    // Writing to a Vec cannot fail.
    let _ = writeln!(
        out,
        " exp={exp} la={} cas={} fetch={fetch} cls={class} size={size} flags={} ",
        item.last_access, item.cas, item.flags
    );
}

/// `mg KEY` (a binary key as `mg BASE64 b`), a request the client can add flags to.
fn mgdump_line(out: &mut Vec<u8>, item: &ScanItem<'_>) {
    out.extend_from_slice(b"mg ");
    if item.meta.binary_key {
        kvproto::meta::encode_base64(out, item.key);
        out.extend_from_slice(b" b\r\n");
    } else {
        out.extend_from_slice(item.key);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_classes_match_memcached_defaults() {
        // memcached -vv: class 1 is 96 bytes, 2 is 120, 3 is 152, ... 38 is 394,840,
        // 39 (the last) is 524,288.
        let classes = Config::default().slab_classes;
        assert_eq!(classes.len(), 39);
        assert_eq!(&classes[..4], &[96, 120, 152, 192]);
        assert_eq!(classes[37], 394_840);
        assert_eq!(classes[38], 524_288);
        for (size, class) in [
            (1, 1),
            (96, 1),
            (97, 2),
            (120, 2),
            (121, 3),
            (152, 3),
            (394_840, 38),
            (394_841, 39),
            (1 << 20, 39),
        ] {
            assert_eq!(slab_class_of(&classes, size), class, "{size}");
        }
    }

    #[test]
    fn slab_classes_follow_n_f_and_slab_sizes() {
        use crate::setup::config::slab_classes;
        // memcached -n 100 -f 2 -vv: 152, 304, 608, ..., then 524,288.
        let c = slab_classes(100, 2.0, 512 << 10, None);
        assert_eq!(&c[..3], &[152, 304, 608]);
        assert_eq!(c.last(), Some(&524_288));
        assert!(c.windows(2).all(|w| w[0] < w[1]), "{c:?}");
        // -o slab_sizes: the list (rounded up to 8), then slab_chunk_max.
        assert_eq!(
            slab_classes(48, 1.25, 16384, Some(&[100, 200, 1001])),
            vec![104, 200, 1008, 16384]
        );
        // -f 1.01: at most 63 classes.
        assert_eq!(slab_classes(48, 1.01, 512 << 10, None).len(), 63);
    }
}
