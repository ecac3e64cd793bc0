//! Executing classic text-protocol requests against the engine, with memcached's replies
//! and counters. Parsing is `kvproto`'s; storage is `kvstore`'s; this module only maps one
//! onto the other.

use std::sync::atomic::Ordering;

use kvproto::text::{self as proto, ErrorReply, Keys, Request, StoreMode};
use kvstore::{
    Engine, MetaArith, MetaArithResult, MetaDelete, MetaDeleteResult, MetaStoreRequest, StoreResult,
};

use crate::exec::ops::{self, Proto};
use crate::exec::session::{Ctx, Session, Step, OUTPUT_HIGH_WATER, RESPONSE_OBJECT_BYTES};
use crate::exec::{items, splice, stats_report};
use crate::state::replication::Access;

/// What `req` does to items, for replication's refusals.
fn access(req: &Request<'_>) -> Access {
    match req {
        Request::Gat { .. }
        | Request::Store { .. }
        | Request::Delete { .. }
        | Request::Arith { .. }
        | Request::Touch { .. }
        | Request::FlushAll { .. } => Access::Write,
        Request::Get { .. } => Access::Read,
        _ => Access::Other,
    }
}

/// Execute one request, appending its reply to `s.out`, with a get's replies framed by
/// `framing` (a stream's [`Stream`], or UDP's one message per key).
pub fn execute<F: GetFraming>(
    req: Request<'_>,
    ctx: &mut Ctx<'_>,
    s: &mut Session,
    framing: &mut F,
) -> Step {
    let shared = ctx.shared;
    let engine = &shared.engine;
    if let Some(refusal) = shared.repl.refusal(access(&req), &shared.config) {
        s.out.extend_from_slice(refusal);
        return Step::Next;
    }
    // A write over an item on flash: read it first, off the worker (`ops::flash_first`).
    if let Request::Store { key, .. }
    | Request::Delete { key, .. }
    | Request::Arith { key, .. }
    | Request::Touch { key, .. } = &req
    {
        if let Some(step) = ops::flash_first(ctx, s, key) {
            return step;
        }
    }
    match req {
        Request::ReplPull {
            replid,
            name,
            cursor,
        } => crate::exec::replication::serve(ctx, s, replid, name, cursor),
        Request::ReplicaOf { master } => {
            match master {
                None => crate::features::replication::promote(shared),
                Some((host, port)) => {
                    let host = String::from_utf8_lossy(host);
                    let master = if host.contains(':') {
                        format!("[{host}]:{port}")
                    } else {
                        format!("{host}:{port}")
                    };
                    crate::features::replication::follow(shared, master);
                }
            }
            s.out.extend_from_slice(proto::OK);
            Step::Next
        }
        Request::Get {
            with_cas,
            keys,
            rejected,
        } => get(ctx, s, keys, with_cas, None, rejected, framing),
        Request::Gat {
            with_cas,
            exptime,
            keys,
            rejected,
        } => {
            // A touch writes: the keys' items on flash are read first, off the worker.
            if let Some(step) = ops::flash_first_all(ctx, s, keys.skip(s.get_progress)) {
                return step;
            }
            let at = ctx.expiry(exptime);
            get(ctx, s, keys, with_cas, Some(at), rejected, framing)
        }
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            cas,
            data,
            noreply,
        } => {
            shared.detail.record_set(key);
            let req = MetaStoreRequest {
                mode: store_mode(mode, cas),
                key,
                value: data,
                flags,
                exptime: ctx.expiry(exptime),
                compare_cas: None,
                new_cas: None,
                invalidate: false,
                vivify: false,
                binary_key: false,
            };
            let reply: &[u8] = match ops::store(ctx, req, ctx.now).result {
                StoreResult::Stored(_) => proto::STORED,
                StoreResult::NotStored => proto::NOT_STORED,
                StoreResult::Exists => proto::EXISTS,
                StoreResult::NotFound => proto::NOT_FOUND,
                StoreResult::TooLarge => b"SERVER_ERROR object too large for cache\r\n",
                StoreResult::NoMemory => b"SERVER_ERROR out of memory storing object\r\n",
            };
            reply_unless(s, noreply, reply);
            Step::Next
        }
        Request::Delete { key, noreply } => {
            shared.detail.record_delete(key);
            let now = ctx.now;
            let reply = match ops::delete(ctx, key, now, MetaDelete::default(), Proto::Text) {
                MetaDeleteResult::Deleted => proto::DELETED,
                _ => proto::NOT_FOUND,
            };
            reply_unless(s, noreply, reply);
            Step::Next
        }
        Request::Arith {
            incr,
            key,
            delta,
            noreply,
        } => {
            let req = MetaArith {
                incr,
                delta,
                ..MetaArith::default()
            };
            match ops::arith(ctx, key, ctx.now, req, Proto::Text) {
                MetaArithResult::Value { value, .. } => {
                    if !noreply {
                        proto::write_number(&mut s.out, value);
                    }
                }
                MetaArithResult::NotFound | MetaArithResult::Exists => {
                    reply_unless(s, noreply, proto::NOT_FOUND);
                }
                // memcached counts neither a hit nor a miss here, and honours noreply.
                MetaArithResult::NonNumeric if !noreply => proto::write_error(
                    &mut s.out,
                    ErrorReply::Client("cannot increment or decrement non-numeric value"),
                ),
                MetaArithResult::NoMemory if !noreply => {
                    proto::write_error(&mut s.out, ErrorReply::Server("out of memory"));
                }
                MetaArithResult::NonNumeric | MetaArithResult::NoMemory => {}
            }
            Step::Next
        }
        Request::Touch {
            key,
            exptime,
            noreply,
        } => {
            let at = Some(ctx.expiry(exptime));
            let reply = if ops::read(ctx, key, ctx.now, at, &mut |_| {}) {
                proto::TOUCHED
            } else {
                proto::NOT_FOUND
            };
            reply_unless(s, noreply, reply);
            Step::Next
        }
        Request::FlushAll { delay, noreply } => {
            // The parser already refused flush_all when -F disabled it.
            let at = if delay > 0 {
                ctx.expiry(delay)
            } else {
                ctx.now
            };
            ops::flush_all(ctx, at);
            reply_unless(s, noreply, proto::OK);
            Step::Next
        }
        Request::Version => {
            proto::write_version(&mut s.out, crate::setup::VERSION);
            Step::Next
        }
        Request::Verbosity { level, noreply } => {
            crate::setup::logging::set_verbosity(level.min(u8::MAX as u32) as u8);
            reply_unless(s, noreply, proto::OK);
            Step::Next
        }
        Request::Quit => {
            // Replies to requests before `quit` are still sent, then the connection closes.
            s.close_after_write = true;
            Step::Next
        }
        Request::Shutdown { graceful: _ } => {
            // The parser already refused shutdown unless -A enabled it. Both modes stop the
            // server gracefully: workers finish their current events and exit.
            shared.request_shutdown();
            Step::Close
        }
        Request::Stats { args } => stats_report::write(ctx, s, args),
        Request::CacheMemlimit { megabytes, noreply } => {
            // memcached's replies: megabytes below 8 or above 10^9 are refused.
            let reply: &[u8] = if megabytes < 8 {
                b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n"
            } else if megabytes > 1_000_000_000 {
                b"MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\n"
            } else {
                let bytes = (megabytes as usize).saturating_mul(1 << 20);
                engine.set_max_bytes(bytes, ctx.now);
                if noreply {
                    return Step::Next;
                }
                proto::OK
            };
            s.out.extend_from_slice(reply);
            Step::Next
        }
        Request::DebugTime { seconds } => {
            if shared.config.debug_clock {
                shared.clock.advance(seconds);
                // The connection's next requests see the shifted time at once.
                ctx.now = shared.clock.now();
                s.out.extend_from_slice(proto::OK);
            } else {
                s.out.extend_from_slice(proto::ERROR);
            }
            Step::Next
        }
        Request::Meta(req) => crate::exec::meta::execute(req, ctx, s),
        Request::Admin {
            name: b"refresh_certs",
            args: _,
        } => {
            // Arguments are ignored, a last `noreply` too: memcached 1.6.45 answers
            // `refresh_certs noreply` (unlike the commands in `admin`).
            refresh_certs(shared, s, ctx.now);
            Step::Next
        }
        Request::Admin { name, args } => admin(ctx, s, name, args),
    }
}

/// `refresh_certs` (any arguments are ignored, as memcached ignores them): re-read the TLS
/// certificate, key and CA files. `OK`, or memcached's error line; on an error the
/// certificates in use stay.
fn refresh_certs(shared: &crate::state::shared::Shared, s: &mut Session, now: u32) {
    let Some(tls) = &shared.tls else {
        s.out.extend_from_slice(b"Error TLS not enabled\r\n");
        return;
    };
    match tls.refresh() {
        Ok(()) => {
            shared.cert_loaded_at.store(now, Ordering::Relaxed);
            tracing::info!("refresh_certs: certificates reloaded");
            s.out.extend_from_slice(proto::OK);
        }
        Err(msg) => {
            tracing::warn!("refresh_certs: {msg}");
            // One line: the message never holds a line break of its own.
            let line: String = msg
                .to_string()
                .chars()
                .filter(|c| *c != '\r' && *c != '\n')
                .collect();
            s.out.extend_from_slice(line.as_bytes());
            s.out.extend_from_slice(b"\r\n");
        }
    }
}

/// memcached commands about its slab allocator, LRU crawler and log watchers. Arguments
/// memcached would refuse get its reply first; `lru_crawler metadump|mgdump` list the
/// items ([`items::dump`]); the others have no counterpart here.
fn admin(ctx: &mut Ctx<'_>, s: &mut Session, name: &[u8], args: proto::Tokens<'_>) -> Step {
    // memcached 1.6.45 silences every reply of a command its request parser does not know
    // (all of these but `watch`) whose last token is `noreply`: `slabs automove 0
    // noreply` and `lru_crawler metadump all noreply` get no answer (1.6.18 answered most
    // of them `ERROR`). None of them but `extstore` changes anything here, and a dump
    // nobody reads is not made.
    let noreply = args.ends_with_noreply();
    // The line is bounded by the parser's line limit, so is the token list.
    let toks: Vec<&[u8]> = args.collect();
    if name == b"extstore" {
        // It changes settings: done, its reply silenced as the others' are.
        let reply = extstore(ctx, &toks);
        if !noreply {
            s.out.extend_from_slice(reply);
        }
        return Step::Next;
    }
    if name != b"watch" && noreply {
        return Step::Next;
    }
    if let Some(refused) = kvproto::admin::refusal(name, &toks) {
        s.out.extend_from_slice(refused);
        return Step::Next;
    }
    if name == b"watch" {
        return watch(ctx, s, &toks);
    }
    if name == b"lru_crawler" {
        return lru_crawler(ctx, s, &toks);
    }
    let reply: &[u8] = match name {
        b"slabs" => b"CLIENT_ERROR slab reassignment disabled\r\n",
        b"lru" => b"CLIENT_ERROR lru tuning not supported\r\n",
        _ => proto::ERROR,
    };
    s.out.extend_from_slice(reply);
    Step::Next
}

/// `extstore SETTING VALUE`, with memcached 1.6.45's replies (`OK`, or `ERROR` for what
/// memcached refuses). `item_size`, `recache_rate`, `compact_under`, `drop_unread` and
/// `max_frag` change the flash tier's settings as
/// their `-o ext_*` forms do (shown by `stats settings`); the others are accepted without
/// effect, as their `-o` forms are. Without a tier, as memcached without `ext_path`, the
/// reply is the same and nothing changes.
fn extstore(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> &'static [u8] {
    use kvproto::admin::{extstore_command, ExtstoreCommand};
    let engine = &ctx.shared.engine;
    match extstore_command(args) {
        Some(ExtstoreCommand::ItemSize(n)) => engine.set_flash_item_size(n),
        Some(ExtstoreCommand::RecacheRate(n)) => engine.set_flash_recache_rate(n),
        Some(ExtstoreCommand::CompactUnder(n)) => engine.set_flash_compact_under(n),
        Some(ExtstoreCommand::DropUnread(on)) => engine.set_flash_drop_unread(on),
        Some(ExtstoreCommand::MaxFrag(t)) => engine.set_flash_max_frag(t),
        Some(ExtstoreCommand::Unused) => {}
        None => return proto::ERROR,
    }
    proto::OK
}

/// `lru_crawler ...` (well-formed), with memcached 1.6.45's replies. `enable` and `disable`
/// switch the background expiry sweep; `crawl` asks the maintenance thread for a whole pass
/// of it (every class: the sweep does not go by class), `lru_crawler_running` until done;
/// `tocrawl` and `sleep` pace memcached's crawler and are accepted without effect, as their
/// `-o` forms are.
fn lru_crawler(ctx: &mut Ctx<'_>, s: &mut Session, args: &[&[u8]]) -> Step {
    use kvproto::admin::{crawler_classes, CrawlerClasses, CrawlerCommand};
    let crawler = &ctx.shared.crawler;
    let reply: &[u8] = match kvproto::admin::crawler_command(args) {
        Some(CrawlerCommand::Dump(kind, classes)) => return items::dump(ctx, s, kind, classes),
        Some(CrawlerCommand::Crawl(_)) if !crawler.enabled() => {
            b"CLIENT_ERROR lru crawler disabled\r\n"
        }
        Some(CrawlerCommand::Crawl(classes)) => match crawler_classes(classes) {
            CrawlerClasses::Bad => b"BADCLASS invalid class id\r\n",
            CrawlerClasses::None => b"NOTSTARTED no items to crawl\r\n",
            CrawlerClasses::All | CrawlerClasses::Some(_) => {
                if crawler.request() {
                    ctx.shared.wake_maintenance();
                    proto::OK
                } else {
                    b"BUSY currently processing crawler request\r\n"
                }
            }
        },
        Some(CrawlerCommand::Enable) => {
            crawler.set_enabled(true);
            proto::OK
        }
        Some(CrawlerCommand::Disable) => {
            crawler.set_enabled(false);
            proto::OK
        }
        Some(CrawlerCommand::Tune) => proto::OK,
        None => proto::ERROR,
    };
    s.out.extend_from_slice(reply);
    Step::Next
}

/// `watch [kinds...]`: make this connection a log watcher ([`crate::state::watch`]), with
/// memcached 1.6.45's replies.
fn watch(ctx: &mut Ctx<'_>, s: &mut Session, args: &[&[u8]]) -> Step {
    let shared = ctx.shared;
    if !shared.config.watch_enabled {
        s.out
            .extend_from_slice(b"CLIENT_ERROR watch commands not allowed\r\n");
        return Step::Next;
    }
    if s.pending() > 0 {
        s.out
            .extend_from_slice(b"ERROR cannot pipeline other commands before watch\r\n");
        return Step::Next;
    }
    let Some(kinds) = crate::state::watch::parse_kinds(args) else {
        s.out.extend_from_slice(proto::ERROR);
        return Step::Next;
    };
    let waker = shared.worker_waker(ctx.worker);
    let wake = Box::new(move || {
        if let Some(w) = &waker {
            let _ = w.wake();
        }
    });
    match shared.watchers.add(kinds, wake) {
        Some(w) => {
            s.watch = Some(w);
            s.out.extend_from_slice(proto::OK);
        }
        None => s
            .out
            .extend_from_slice(b"WATCHER_TOO_MANY log watcher limit reached\r\n"),
    }
    Step::Next
}

fn reply_unless(s: &mut Session, noreply: bool, reply: &[u8]) {
    if !noreply {
        s.out.extend_from_slice(reply);
    }
}

fn store_mode(mode: StoreMode, cas: u64) -> kvstore::StoreMode {
    match mode {
        StoreMode::Set => kvstore::StoreMode::Set,
        StoreMode::Add => kvstore::StoreMode::Add,
        StoreMode::Replace => kvstore::StoreMode::Replace,
        StoreMode::Append => kvstore::StoreMode::Append,
        StoreMode::Prepend => kvstore::StoreMode::Prepend,
        StoreMode::Cas => kvstore::StoreMode::Cas(cas),
    }
}

/// How a transport frames a get's replies: the parts of [`get`] that differ between a
/// stream and UDP datagrams. The lookups, the replies' bytes and the counters are [`get`]'s
/// alone.
pub trait GetFraming {
    /// Before each key; `start` is where this get's replies began (None if an earlier turn
    /// already sent some). `Some(step)` ends the get.
    fn before_key(&mut self, ctx: &Ctx<'_>, s: &mut Session, start: Option<usize>) -> Option<Step>;
    /// After the reply to one key, written at `s.out[key_start..]`; `more` keys follow;
    /// `rejected` as for [`GetFraming::finish`]. `Some(step)` ends the get (the key counts
    /// as answered).
    fn after_key(
        &mut self,
        s: &mut Session,
        key_start: usize,
        more: bool,
        rejected: bool,
    ) -> Option<Step>;
    /// The get's end: `END`, or with `rejected` (an over-long key) only the error. `last` is
    /// where the last key's reply starts.
    fn finish(&mut self, s: &mut Session, rejected: bool, last: usize);
}

/// A stream's framing: replies back to back; a large multiget pauses at the high-water
/// mark so that it streams out instead of being built in memory, and one that would take
/// the connection over its buffer memory is answered with memcached's error instead.
pub struct Stream;

impl GetFraming for Stream {
    fn before_key(&mut self, ctx: &Ctx<'_>, s: &mut Session, start: Option<usize>) -> Option<Step> {
        // Each key's reply counts as memcached's response object at least.
        let held = s.out.len() + (s.get_progress + 1) * RESPONSE_OBJECT_BYTES;
        if ctx.buffers.allows(held) {
            return None;
        }
        // memcached drops the replies it built for this get and sends only the error.
        ctx.stats.response_obj_oom.incr();
        if let Some(start) = start {
            s.truncate_out(start);
        }
        s.get_progress = 0;
        s.out
            .extend_from_slice(b"SERVER_ERROR out of memory writing get response\r\n");
        Some(Step::Next)
    }

    fn after_key(&mut self, s: &mut Session, _: usize, more: bool, _: bool) -> Option<Step> {
        (more && s.pending() >= OUTPUT_HIGH_WATER).then_some(Step::Pause)
    }

    fn finish(&mut self, s: &mut Session, rejected: bool, _last: usize) {
        if rejected {
            proto::write_error(&mut s.out, proto::BAD_FORMAT);
        } else {
            s.out.extend_from_slice(proto::END);
        }
    }
}

/// get/gets/gat/gats: answer key by key, framed by `framing`.
///
/// `rejected`: an over-long key followed `keys`. Like memcached, look the keys up (touching
/// them for gat, counting hits and misses) but send only the error.
fn get<F: GetFraming>(
    ctx: &mut Ctx<'_>,
    s: &mut Session,
    keys: Keys<'_>,
    with_cas: bool,
    touch: Option<kvstore::Time>,
    rejected: bool,
    framing: &mut F,
) -> Step {
    let now = ctx.now;
    // Where this get's replies start, unless an earlier turn already sent some of them.
    let start = (s.get_progress == 0).then_some(s.out.len());
    let mut last = s.out.len();
    let mut keys = keys.skip(s.get_progress).peekable();
    while let Some(key) = keys.next() {
        if let Some(step) = framing.before_key(ctx, s, start) {
            return step;
        }
        last = s.out.len();
        // A get (not gat) on a connection that can wait does not read flash on the worker.
        let may_wait = touch.is_none() && s.may_wait_for_flash(ctx.shared.engine.has_flash());
        let out = &mut s.out;
        let mut spliced = s.splice_ok.then_some(&mut s.spliced);
        let mut emit = |item: kvstore::ItemView<'_>| {
            if !rejected {
                let cas = if with_cas { Some(item.cas) } else { None };
                match splice::lease_into(spliced.as_deref_mut(), &item) {
                    Some((q, value)) => {
                        proto::write_value_header(out, item.key, item.flags, value.len(), cas);
                        q.push(out.len(), value);
                        out.extend_from_slice(b"\r\n");
                    }
                    None => proto::write_value(out, item.key, item.flags, item.value, cas),
                }
            }
        };
        let hit = if may_wait {
            match ops::read_or_wait(ctx, key, now, &mut emit) {
                Ok(hit) => hit,
                // Run again from this key once the reads are done.
                Err(reads) => return s.wait_for_flash(reads),
            }
        } else {
            ops::read(ctx, key, now, touch, &mut emit)
        };
        ctx.shared.detail.record_get(key, hit);
        s.get_progress += 1;
        if let Some(step) = framing.after_key(s, last, keys.peek().is_some(), rejected) {
            return step;
        }
    }
    s.get_progress = 0;
    s.flash_rounds = 0;
    framing.finish(s, rejected, last);
    Step::Next
}

/// A storage command whose data block exceeds `-I`: memcached answers an error (unless
/// `noreply`), and a `set` also removes the old item so that a reader cannot see stale data.
pub fn too_large(ctx: &mut Ctx<'_>, s: &mut Session, mode: StoreMode, key: &[u8], noreply: bool) {
    ctx.shared.detail.record_set(key);
    ops::store_too_large(ctx, key, mode == StoreMode::Set);
    if !noreply {
        proto::write_error(&mut s.out, proto::TOO_LARGE);
    }
}
