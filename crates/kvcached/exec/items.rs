//! memcached's view of an item (its size with memcached's header, and the slab class that
//! size falls in) and the listings built from it: `lru_crawler metadump` and `mgdump`.
//!
//! A dump walks the item index a few buckets at a time and streams: whenever the pending
//! output passes the high-water mark it pauses ([`Step::Pause`]) and, once the client has
//! read, resumes at the next bucket ([`Resume::Bucket`]). It holds no lock between turns,
//! so the server keeps serving (memcached's "does not lock the cache"), and it costs the
//! connection no more buffer than a large multiget. An item that stays live throughout is
//! listed once; one written or removed meanwhile may or may not be, and if the index grows
//! during the dump an item may be listed twice (never missed).

use std::io::Write as _;

use kvproto::admin::{CrawlerClasses, DumpKind};
use kvproto::text as proto;
use kvstore::{EngineConfig, ScanItem};

use crate::exec::session::{Ctx, Resume, Session, Step, OUTPUT_HIGH_WATER};
use crate::setup::config::Config;

/// Index buckets visited per engine call (the bucket locks are held only during a call).
const BUCKETS_PER_SCAN: usize = 64;

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
    (size, slab_class(size))
}

/// The slab class memcached would put an item of `size` bytes in, with its default slab
/// sizes (`-n 48 -f 1.25`, 1 MiB pages): classes from 96 bytes growing by 1.25 (rounded up
/// to 8) while below 512 KiB / 1.25, then one class of 512 KiB (larger items are chunked into
/// it).
pub fn slab_class(size: usize) -> u32 {
    const MAX_CHUNK: usize = 512 * 1024;
    let mut chunk = 96usize;
    let mut class = 1u32;
    loop {
        if size <= chunk {
            return class;
        }
        class += 1;
        let next = chunk + chunk / 4;
        if next as f64 >= MAX_CHUNK as f64 / 1.25 {
            return class;
        }
        chunk = next.div_ceil(8) * 8;
    }
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
        if !config.lru_crawler {
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
            0
        }
    };
    s.resume = Resume::Start;
    let shared = ctx.shared;
    let now = shared.clock.now();
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
        if s.pending() >= OUTPUT_HIGH_WATER {
            s.resume = Resume::Bucket(bucket);
            return Step::Pause;
        }
    }
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
        assert_eq!(slab_class(1), 1);
        assert_eq!(slab_class(96), 1);
        assert_eq!(slab_class(97), 2);
        assert_eq!(slab_class(120), 2);
        assert_eq!(slab_class(121), 3);
        assert_eq!(slab_class(152), 3);
        assert_eq!(slab_class(394_840), 38);
        assert_eq!(slab_class(394_841), 39);
        assert_eq!(slab_class(1 << 20), 39);
    }
}
