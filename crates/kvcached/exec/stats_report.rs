//! The `stats` command and its groups, in memcached's names, order and format. The groups
//! are collected once and written by the protocol that asked: `STAT name value` lines for the
//! text protocol, one packet per stat for the binary protocol.

use std::fmt::Display;
use std::sync::atomic::Ordering;

use kvproto::text::{self as proto, Tokens};
use kvstore::Engine;

use crate::exec::session::{Ctx, Resume, Session, Step, OUTPUT_HIGH_WATER};
use crate::setup::config::{MemoryLimit, ProtocolChoice};
use crate::state::registry::ConnKind;
use crate::state::shared::Shared;
use crate::state::stats;

/// Where stats go: called once per (name, value).
pub type Sink<'a> = dyn FnMut(&str, &dyn Display) + 'a;

fn emit(sink: &mut Sink<'_>, name: &str, value: impl Display) {
    sink(name, &value);
}

/// A `stats` group, as memcached names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    General,
    Settings,
    Conns,
    Items,
    Slabs,
    Sizes,
    Replication,
    /// `stats digest`: kvcached's own, a digest of the live items.
    Digest,
    /// `stats extstore`: the flash tier's pages, as memcached lists extstore's.
    Extstore,
    Reset,
    Detail,
    CacheDump,
    Unknown,
}

/// Which group a `stats` argument names. memcached matches `reset`, `detail`, `settings`,
/// `cachedump` and `conns` by prefix (`stats set` is `stats settings`), the others whole.
pub fn classify(group: Option<&[u8]>) -> Group {
    let Some(group) = group.filter(|g| !g.is_empty()) else {
        return Group::General;
    };
    let is = |name: &str| name.as_bytes().starts_with(group);
    if is("reset") {
        Group::Reset
    } else if is("detail") {
        Group::Detail
    } else if is("settings") {
        Group::Settings
    } else if is("cachedump") {
        Group::CacheDump
    } else if is("conns") {
        Group::Conns
    } else {
        match group {
            b"items" => Group::Items,
            b"slabs" => Group::Slabs,
            b"sizes" => Group::Sizes,
            b"replication" => Group::Replication,
            b"digest" => Group::Digest,
            b"extstore" => Group::Extstore,
            _ => Group::Unknown,
        }
    }
}

/// Which group a binary `stat` key names: memcached's `process_bin_stat` takes a key that
/// starts with `reset`, `settings` or `detail` as that group (`detail on`, `settings
/// please`), and the others (`items`, `slabs`, `conns`, ...) whole.
pub fn classify_binary(key: &[u8]) -> Group {
    if key.is_empty() {
        Group::General
    } else if key.starts_with(b"reset") {
        Group::Reset
    } else if key.starts_with(b"settings") {
        Group::Settings
    } else if key.starts_with(b"detail") {
        Group::Detail
    } else {
        match classify(Some(key)) {
            // Whole names only, as memcached's get_stats compares them; memcached's binary
            // protocol has no `extstore` group.
            Group::Reset | Group::Settings | Group::Detail | Group::CacheDump | Group::Extstore => {
                Group::Unknown
            }
            Group::Conns if key != b"conns" => Group::Unknown,
            g => g,
        }
    }
}

/// The binary protocol's `detail on`, `detail off` and `detail dump` (`rest` is what
/// follows `detail`): None where memcached answers "Not found" (dumps not allowed, another
/// subcommand); for a dump, the text memcached sends as the value of one `detailed` stat.
pub fn detail_binary(ctx: &Ctx<'_>, rest: &[u8]) -> Option<Option<Vec<u8>>> {
    let detail = &ctx.shared.detail;
    if !ctx.shared.config.dump_enabled {
        return None;
    }
    if rest.starts_with(b" dump") {
        let mut text = Vec::new();
        // At most 65,536 prefixes: one value, as memcached builds it.
        let _ = detail.dump(None, &mut text, usize::MAX);
        Some(Some(text))
    } else if rest.starts_with(b" on") {
        detail.set_enabled(true);
        Some(None)
    } else if rest.starts_with(b" off") {
        detail.set_enabled(false);
        Some(None)
    } else {
        None
    }
}

/// Write the stats of a group that lists stats; false for the others.
pub fn emit_group(ctx: &Ctx<'_>, group: Group, sink: &mut Sink<'_>) -> bool {
    match group {
        Group::General => general(ctx, sink),
        Group::Settings => settings(ctx, sink),
        Group::Conns => conns(ctx, sink),
        Group::Items => items(ctx, sink),
        Group::Slabs => slabs(ctx, sink),
        Group::Sizes => match ctx.shared.engine.size_steps() {
            Some(steps) => {
                for (size, n) in steps {
                    emit(sink, &size.to_string(), n);
                }
            }
            None => emit(sink, "sizes_status", "disabled"),
        },
        Group::Replication => {
            let offset = ctx.shared.engine.log_offset();
            for (k, v) in ctx.shared.repl.stats(offset) {
                emit(sink, &k, v);
            }
            // kvcached's own: dead or expired segments kept for replicas that have not read
            // them, and the maintenance passes that could not keep them (LogEngine::repl_hold).
            let (held, dropped) = ctx.shared.engine.repl_hold_stats();
            emit(sink, "held_segments", held);
            emit(sink, "held_segments_dropped", dropped);
            // Segments freed anyway, whose records a replica would miss were logged anew so
            // that it skips them instead of resynchronizing fully.
            emit(
                sink,
                "relogged_segments",
                ctx.shared.engine.repl_relogged_segments(),
            );
            // The most they may take (`--repl-backlog`).
            emit(sink, "repl_backlog_bytes", ctx.shared.engine.repl_backlog());
        }
        Group::Digest => {
            let d = ctx.shared.engine.digest(ctx.shared.clock.now());
            emit(sink, "digest_items", d.items);
            emit(sink, "digest", d.hex());
        }
        Group::Extstore => {
            // memcached's four lines per page; kvcached has no page buckets (one FIFO of
            // segments), so `bucket` and `free_bucket` are 0. Nothing without a tier.
            for (i, (version, bytes)) in ctx.shared.engine.flash_pages().into_iter().enumerate() {
                emit(sink, &format!("{i}:version"), version);
                emit(sink, &format!("{i}:bytes"), bytes);
                emit(sink, &format!("{i}:bucket"), 0);
                emit(sink, &format!("{i}:free_bucket"), 0);
            }
        }
        Group::Reset | Group::Detail | Group::CacheDump | Group::Unknown => return false,
    }
    true
}

/// `stats items`: memcached's lines for every slab class holding items, from the engine's
/// tally of the live items by memcached's item size (classes from `-n`, `-f`,
/// `slab_chunk_max`, `slab_sizes`). Of memcached's per-class fields those with a meaning
/// here: `number`, `mem_requested` (the items' sizes, summed), `evicted`, `reclaimed`
/// (expired or flushed items taken out) and `crawler_reclaimed` (of those, the ones the
/// background sweep found); kvcached has no segmented LRU, so no `number_hot`/`_warm`/
/// `_cold`, ages or LRU moves.
fn items(ctx: &Ctx<'_>, sink: &mut Sink<'_>) {
    for (i, b) in ctx.shared.engine.size_bands().iter().enumerate() {
        if b.items == 0 {
            continue;
        }
        let n = i + 1;
        emit(sink, &format!("items:{n}:number"), b.items);
        emit(sink, &format!("items:{n}:mem_requested"), b.bytes);
        emit(sink, &format!("items:{n}:evicted"), b.evicted);
        emit(sink, &format!("items:{n}:reclaimed"), b.reclaimed);
        emit(
            sink,
            &format!("items:{n}:crawler_reclaimed"),
            b.crawler_reclaimed,
        );
    }
}

/// `stats slabs`: per class that has held items (memcached lists a class from its first
/// slab page on, and keeps its pages), its `chunk_size` and `used_chunks` (the live items
/// whose size falls in it) and kvcached's `mem_requested`; then `active_slabs` (those
/// classes) and `total_malloced`, as memcached ends it; then the log engine's own figures
/// (segments, index, second chances, ...).
fn slabs(ctx: &Ctx<'_>, sink: &mut Sink<'_>) {
    let classes = &ctx.shared.config.slab_classes;
    let mut active = 0;
    for (i, b) in ctx.shared.engine.size_bands().iter().enumerate() {
        if b.items == 0 && !b.used {
            continue;
        }
        active += 1;
        let n = i + 1;
        emit(
            sink,
            &format!("{n}:chunk_size"),
            classes.get(i).copied().unwrap_or(0),
        );
        emit(sink, &format!("{n}:used_chunks"), b.items);
        emit(sink, &format!("{n}:mem_requested"), b.bytes);
    }
    emit(sink, "active_slabs", active);
    let engine = &ctx.shared.engine;
    emit(sink, "total_malloced", engine.stats().total_malloced);
    for (k, v) in engine.stats_detail("slabs") {
        if k != "active_slabs" && k != "total_malloced" {
            emit(sink, &k, v);
        }
    }
    // The log engine's eviction figures, once per server (they are not per class).
    for (k, v) in engine.stats_detail("items") {
        let name = k.strip_prefix("items:1:").unwrap_or(&k);
        if !matches!(name, "number" | "evicted") {
            emit(sink, name, v);
        }
    }
}

/// `stats reset`.
pub fn reset(shared: &Shared) {
    shared.stats.reset();
    shared.detail.clear();
    shared.engine.reset_stats();
    shared.reset_connection_stats();
}

/// `stats [group ...]` in the text protocol.
pub fn write(ctx: &mut Ctx<'_>, s: &mut Session, mut args: Tokens<'_>) -> Step {
    let group = classify(args.next());
    if group == Group::Detail {
        return detail(ctx, s, args.next());
    }
    let out = &mut s.out;
    match group {
        Group::Reset => {
            reset(ctx.shared);
            out.extend_from_slice(proto::RESET);
        }
        Group::CacheDump => return crate::exec::items::cachedump(ctx, s, args),
        Group::Unknown => out.extend_from_slice(proto::ERROR),
        _ => {
            emit_group(ctx, group, &mut |name, value| {
                proto::write_stat(out, name, value)
            });
            out.extend_from_slice(proto::END);
        }
    }
    Step::Next
}

/// `stats detail on|off|dump`, with memcached's replies. The subcommand may be abbreviated
/// (`stats detail d`), as memcached compares only the given length. A dump streams: it
/// pauses whenever the pending output passes the high-water mark and resumes after the
/// last prefix it wrote.
fn detail(ctx: &mut Ctx<'_>, s: &mut Session, sub: Option<&[u8]>) -> Step {
    let detail = &ctx.shared.detail;
    if !ctx.shared.config.dump_enabled {
        s.out
            .extend_from_slice(b"CLIENT_ERROR stats detail not allowed\r\n");
        return Step::Next;
    }
    let is = |word: &[u8]| sub.is_some_and(|t| !t.is_empty() && word.starts_with(t));
    if is(b"on") {
        detail.set_enabled(true);
        s.out.extend_from_slice(proto::OK);
    } else if is(b"off") {
        detail.set_enabled(false);
        s.out.extend_from_slice(proto::OK);
    } else if is(b"dump") {
        let after = match std::mem::take(&mut s.resume) {
            Resume::After(p) => Some(p),
            _ => None,
        };
        let limit = s.out_pos + OUTPUT_HIGH_WATER;
        if let Some(last) = detail.dump(after.as_deref(), &mut s.out, limit) {
            s.resume = Resume::After(last);
            return Step::Pause;
        }
    } else {
        s.out
            .extend_from_slice(b"CLIENT_ERROR usage: stats detail on|off|dump\r\n");
    }
    Step::Next
}

fn general(ctx: &Ctx<'_>, sink: &mut Sink<'_>) {
    let shared = ctx.shared;
    let t = shared.stats.totals();
    let e = shared.engine.stats();
    let ((us, uus), (ss, sus)) = stats::rusage();
    let c = &shared.config;
    emit(sink, "pid", std::process::id());
    emit(sink, "uptime", shared.clock.uptime());
    emit(sink, "time", shared.clock.now());
    emit(sink, "version", crate::setup::VERSION);
    // memcached's libevent version: kvcached has no libevent.
    emit(sink, "libevent", "none");
    emit(sink, "pointer_size", usize::BITS);
    emit(sink, "rusage_user", format_args!("{us}.{uus:06}"));
    emit(sink, "rusage_system", format_args!("{ss}.{sus:06}"));
    emit(sink, "max_connections", c.max_connections);
    emit(
        sink,
        "curr_connections",
        shared.curr_conns.load(Ordering::Relaxed),
    );
    emit(
        sink,
        "total_connections",
        shared.total_conns.load(Ordering::Relaxed),
    );
    if c.maxconns_fast {
        emit(
            sink,
            "rejected_connections",
            shared.rejected_conns.load(Ordering::Relaxed),
        );
    }
    emit(
        sink,
        "connection_structures",
        shared.curr_conns.load(Ordering::Relaxed),
    );
    let b = shared.stats.buffers();
    emit(sink, "response_obj_oom", t.response_obj_oom);
    emit(sink, "response_obj_count", b.response_obj_count);
    emit(sink, "response_obj_bytes", b.response_obj_bytes);
    emit(sink, "read_buf_count", b.read_buf_count);
    emit(sink, "read_buf_bytes", b.read_buf_bytes);
    // The workers' spare input buffers (kept for the next large request).
    emit(sink, "read_buf_bytes_free", b.read_buf_bytes_free);
    emit(sink, "read_buf_oom", t.read_buf_oom);
    // Descriptors kept beyond -c for listeners and files.
    emit(sink, "reserved_fds", crate::setup::daemon::FD_RESERVE);
    emit(sink, "cmd_get", t.cmd_get);
    emit(sink, "cmd_set", t.cmd_set);
    emit(sink, "cmd_flush", t.cmd_flush);
    emit(sink, "cmd_touch", t.cmd_touch);
    emit(sink, "cmd_meta", t.cmd_meta);
    emit(sink, "get_hits", t.get_hits);
    emit(sink, "get_misses", t.get_misses);
    emit(sink, "get_expired", e.get_expired);
    emit(sink, "get_flushed", e.get_flushed);
    emit(sink, "delete_misses", t.delete_misses);
    emit(sink, "delete_hits", t.delete_hits);
    emit(sink, "incr_misses", t.incr_misses);
    emit(sink, "incr_hits", t.incr_hits);
    emit(sink, "decr_misses", t.decr_misses);
    emit(sink, "decr_hits", t.decr_hits);
    emit(sink, "cas_misses", t.cas_misses);
    emit(sink, "cas_hits", t.cas_hits);
    emit(sink, "cas_badval", t.cas_badval);
    emit(sink, "touch_hits", t.touch_hits);
    emit(sink, "touch_misses", t.touch_misses);
    emit(sink, "store_too_large", t.store_too_large);
    emit(sink, "store_no_memory", t.store_no_memory);
    emit(sink, "auth_cmds", t.auth_cmds);
    emit(sink, "auth_errors", t.auth_errors);
    if c.idle_timeout.is_some() {
        emit(sink, "idle_kicks", t.idle_kicks);
    }
    emit(sink, "bytes_read", t.bytes_read);
    emit(sink, "bytes_written", t.bytes_written);
    emit(sink, "limit_maxbytes", e.limit_maxbytes);
    emit(sink, "accepting_conns", u8::from(shared.accepting()));
    let (disabled_num, disabled_us) = shared.listen_disabled();
    emit(sink, "listen_disabled_num", disabled_num);
    emit(sink, "time_in_listen_disabled_us", disabled_us);
    emit(sink, "threads", c.threads);
    emit(sink, "conn_yields", t.conn_yields);
    // memcached's hash table, as it would be for these items (the index's own figures are
    // in `stats slabs`: `index_level`, `index_bytes`).
    shared.hash_power.note_items(e.curr_items);
    let level = shared.hash_power.get();
    emit(sink, "hash_power_level", level);
    emit(sink, "hash_bytes", 8u64 << level);
    emit(sink, "hash_is_expanding", u8::from(e.hash_is_expanding));
    // memcached's slab mover, LRU crawler and LRU maintainer, printed while memcached would
    // run them (kvcached has no mover and no maintainer: their counters stay 0).
    if c.slab_reassign {
        for name in [
            "slab_reassign_rescues",
            "slab_reassign_chunk_rescues",
            "slab_reassign_inline_reclaim",
            "slab_reassign_busy_items",
            "slab_reassign_busy_deletes",
            "slab_reassign_busy_nomem",
        ] {
            emit(sink, name, 0);
        }
        emit(sink, "slab_reassign_last_busy_status", "none");
        emit(sink, "slab_reassign_running", 0);
        emit(sink, "slabs_moved", 0);
    }
    if shared.crawler.enabled() {
        emit(
            sink,
            "lru_crawler_running",
            u8::from(shared.crawler.running()),
        );
        emit(sink, "lru_crawler_starts", shared.crawler.starts());
    }
    if c.lru_maintainer {
        emit(sink, "lru_maintainer_juggles", 0);
    }
    // An allocation that fails stops the process (Rust's allocator aborts): none is counted.
    emit(sink, "malloc_fails", 0);
    let (written, sent, skipped, watchers) = shared.watchers.counts();
    // Events go straight to the watchers' buffers: no per-worker buffer drops them.
    emit(sink, "log_worker_dropped", 0);
    emit(sink, "log_worker_written", written);
    emit(sink, "log_watcher_skipped", skipped);
    emit(sink, "log_watcher_sent", sent);
    emit(sink, "log_watchers", watchers);
    if let Some(tls) = &shared.tls {
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let k = &tls.counters;
        if tls.settings().session_cache {
            emit(sink, "ssl_new_sessions", n(&k.new_sessions));
        }
        emit(sink, "ssl_handshake_errors", n(&k.handshake_errors));
        emit(sink, "ssl_proto_errors", n(&k.proto_errors));
        let loaded = shared.cert_loaded_at.load(Ordering::Relaxed);
        emit(
            sink,
            "time_since_server_cert_refresh",
            shared.clock.now().saturating_sub(loaded),
        );
        // kvcached's own: handshakes closed by -o ssl_handshake_timeout.
        emit(sink, "ssl_handshake_timeouts", n(&k.handshake_timeouts));
    }
    // memcached's NAPI id checks and round-robin fallbacks (`-N`): none here.
    emit(sink, "unexpected_napi_ids", 0);
    emit(sink, "round_robin_fallback", 0);
    emit(sink, "bytes", e.bytes);
    emit(sink, "curr_items", e.curr_items);
    emit(sink, "total_items", e.total_items);
    // Free slab pages: kvcached's free segments are in `stats slabs` (`segments_free`).
    emit(sink, "slab_global_page_pool", 0);
    emit(sink, "expired_unfetched", e.expired_unfetched);
    emit(sink, "evicted_unfetched", e.evicted_unfetched);
    if c.lru_maintainer {
        emit(sink, "evicted_active", 0);
    }
    emit(sink, "evictions", e.evictions);
    emit(sink, "reclaimed", e.reclaimed);
    emit(sink, "crawler_reclaimed", e.crawler_reclaimed);
    emit(sink, "crawler_items_checked", e.crawler_items_checked);
    // Items memcached found referenced at its LRU tail: kvcached's eviction never waits on
    // a reader (a leased value keeps its own memory).
    emit(sink, "lrutail_reflocked", 0);
    if c.lru_maintainer {
        for name in [
            "moves_to_cold",
            "moves_to_warm",
            "moves_within_lru",
            "direct_reclaims",
            "lru_bumps_dropped",
        ] {
            emit(sink, name, 0);
        }
    }
    if let Some(f) = shared.engine.flash_stats() {
        flash(ctx, &f, sink);
    }
}

/// The flash tier's counters (`-o ext_path`), under memcached's extstore names where the
/// meaning is the same; `flash_*` are kvcached's own (docs/METRICS.md).
fn flash(ctx: &Ctx<'_>, f: &kvstore::FlashStats, sink: &mut Sink<'_>) {
    let aborted = ctx.shared.flash_io.as_ref().map_or(0, |io| io.aborted());
    let queued = ctx.shared.flash_io.as_ref().map_or(0, |io| io.queued());
    emit(sink, "get_extstore", f.reads);
    emit(sink, "get_aborted_extstore", aborted);
    // Reads are not limited by a memory budget of their own (memcached's `get_oom`).
    emit(sink, "get_oom_extstore", 0);
    emit(sink, "recache_from_extstore", f.recaches);
    emit(sink, "extstore_compact_rescues", f.rescues);
    emit(sink, "miss_from_extstore", f.read_errors);
    emit(sink, "badcrc_from_extstore", f.tier.io_errors);
    emit(sink, "extstore_limit_maxbytes", f.tier.limit_maxbytes);
    emit(sink, "extstore_io_queue", f.tier.io_queue + queued as u64);
    emit(sink, "extstore_pages_free", f.tier.pages_free);
    emit(sink, "extstore_pages_used", f.tier.pages_used);
    emit(sink, "extstore_page_allocs", f.tier.page_allocs);
    emit(sink, "extstore_page_evictions", f.pages_dropped);
    emit(sink, "extstore_page_reclaims", f.tier.page_reclaims);
    emit(sink, "extstore_objects_written", f.objects_written);
    emit(sink, "extstore_objects_used", f.objects_used);
    emit(sink, "extstore_objects_evicted", f.objects_evicted);
    emit(sink, "extstore_bytes_written", f.tier.bytes_written);
    emit(sink, "extstore_bytes_read", f.tier.bytes_read);
    emit(sink, "extstore_bytes_used", f.bytes_used);
    emit(sink, "flash_tag_misreads", f.tag_misreads);
    emit(sink, "flash_write_failures", f.write_failures);
    emit(sink, "flash_writes_busy", f.tier.writes_busy);
    emit(sink, "flash_inline_reads", f.inline_reads);
    emit(sink, "flash_cached_reads", f.cached_reads);
    let ring = ctx.shared.flash_io.as_ref().map_or(0, |io| io.ring_reads());
    emit(sink, "flash_ring_reads", ring);
    emit(sink, "flash_offline", u8::from(f.tier.offline));
    emit(sink, "flash_recoveries", f.tier.recoveries);
    emit(sink, "flash_pages_compacted", f.pages_compacted);
}

fn settings(ctx: &Ctx<'_>, sink: &mut Sink<'_>) {
    let shared = ctx.shared;
    let c = &shared.config;
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let maxbytes = shared.engine.stats().limit_maxbytes;
    emit(sink, "maxbytes", maxbytes);
    emit(sink, "maxconns", c.max_connections);
    emit(sink, "tcpport", c.tcp_port);
    emit(sink, "udpport", c.udp_port);
    emit(sink, "inter", c.listen.join(","));
    emit(sink, "verbosity", crate::setup::logging::verbosity());
    emit(sink, "oldest", 0);
    emit(sink, "evictions", if c.no_evict { "off" } else { "on" });
    match &c.unix_socket {
        Some(p) => emit(sink, "domain_socket", p.display()),
        None => emit(sink, "domain_socket", "NULL"),
    }
    emit(sink, "umask", format_args!("{:o}", c.unix_mask));
    emit(sink, "shutdown_command", yes_no(c.enable_shutdown));
    emit(sink, "num_threads", c.threads);
    emit(sink, "stat_key_prefix", shared.detail.delimiter() as char);
    emit(sink, "detail_enabled", yes_no(shared.detail.enabled()));
    emit(sink, "reqs_per_event", c.reqs_per_event);
    emit(sink, "cas_enabled", yes_no(c.use_cas));
    emit(sink, "tcp_backlog", c.backlog);
    let proto_name = match c.protocol {
        ProtocolChoice::Auto => "auto-negotiate",
        ProtocolChoice::Ascii => "ascii",
        ProtocolChoice::Binary => "binary",
    };
    emit(sink, "binding_protocol", proto_name);
    emit(sink, "auth_enabled_sasl", yes_no(c.sasl));
    // memcached shows the auth file's path.
    match &c.auth_file {
        Some(p) => emit(sink, "auth_enabled_ascii", p.display()),
        None => emit(sink, "auth_enabled_ascii", "no"),
    }
    emit(sink, "item_size_max", c.item_size_max);
    emit(sink, "maxconns_fast", yes_no(c.maxconns_fast));
    emit(sink, "lru_crawler", yes_no(shared.crawler.enabled()));
    emit(sink, "flush_enabled", yes_no(c.flush_enabled));
    emit(sink, "dump_enabled", yes_no(c.dump_enabled));
    emit(
        sink,
        "idle_timeout",
        c.idle_timeout.map(|d| d.as_secs()).unwrap_or(0),
    );
    emit(sink, "read_buf_mem_limit", c.read_buf_mem_limit);
    match &c.memory_file {
        Some(p) => emit(sink, "memory_file", p.display()),
        None => emit(sink, "memory_file", "(null)"),
    }
    // With a flash tier, memcached's extstore settings that mean something here (the
    // others are accepted and unused, so not shown); ext_threads and ext_ignore_bad_file
    // are kvcached's own lines.
    if let Some(f) = &c.flash {
        // As `extstore recache_rate|item_size` left them (the tier's own, while it runs).
        let (rate, size) = shared
            .engine
            .flash_tuning()
            .unwrap_or((f.recache_rate, f.item_size));
        emit(sink, "ext_recache_rate", rate);
        emit(sink, "ext_item_size", size);
        emit(sink, "ext_wbuf_size", f.wbuf_size);
        let (under, unread, frag) = shared.engine.flash_compaction().unwrap_or((
            f.compact_under,
            f.drop_unread,
            f.max_frag,
        ));
        emit(sink, "ext_compact_under", under);
        emit(sink, "ext_drop_unread", yes_no(unread));
        emit(
            sink,
            "ext_max_frag",
            format_args!("{:.2}", f64::from(frag) / 1000.0),
        );
        emit(sink, "ext_threads", f.threads);
        emit(sink, "ext_ignore_bad_file", yes_no(f.ignore_bad_file));
        emit(sink, "ext_direct", yes_no(f.direct));
    }
    let ssl = &c.ssl;
    let path = |p: &Option<std::path::PathBuf>, none: &'static str| match p {
        Some(p) => p.display().to_string(),
        None => none.to_string(),
    };
    emit(sink, "ssl_enabled", yes_no(ssl.enabled));
    emit(
        sink,
        "ssl_chain_cert",
        path(&ssl.settings.chain_cert, "(null)"),
    );
    emit(sink, "ssl_key", path(&ssl.settings.key, "(null)"));
    emit(
        sink,
        "ssl_verify_mode",
        ssl.settings.verify_mode.openssl_flags(),
    );
    let keyformat = match ssl.settings.key_format {
        kvtls::server::KeyFormat::Pem => 1,
        kvtls::server::KeyFormat::Der => 2,
    };
    emit(sink, "ssl_keyformat", keyformat);
    emit(
        sink,
        "ssl_ciphers",
        ssl.settings.ciphers.as_deref().unwrap_or("NULL"),
    );
    emit(sink, "ssl_ca_cert", path(&ssl.settings.ca_cert, "NULL"));
    emit(sink, "ssl_wbuf_size", ssl.wbuf_size);
    emit(
        sink,
        "ssl_session_cache",
        yes_no(ssl.settings.session_cache),
    );
    emit(sink, "ssl_kernel_tls", "no");
    emit(sink, "ssl_min_version", ssl.settings.min_version.name());
    emit(
        sink,
        "memory_auto",
        yes_no(matches!(c.memory_limit, MemoryLimit::Auto)),
    );
    emit(sink, "engine", "log");
    let fallbacks = ctx.shared.epoll_fallbacks.load(Ordering::Relaxed);
    emit(sink, "io", io_in_use(c.io, fallbacks, c.threads));
    match c.io_sqpoll {
        Some(ms) => emit(sink, "io_sqpoll", ms),
        None => emit(sink, "io_sqpoll", "no"),
    }
    if !c.io_sqpoll_cpus.is_empty() {
        let cpus: Vec<String> = c.io_sqpoll_cpus.iter().map(u32::to_string).collect();
        emit(sink, "io_sqpoll_cpus", cpus.join(":"));
    }
    emit(sink, "evict_size_factor", c.evict_size_factor);
}

/// The I/O runtime in use (kvcached's own `io` setting): what `-o io` asked for, as the
/// kernel allowed at start, less the workers whose own ring then failed: `mixed` when some
/// of `workers` did and some did not.
fn io_in_use(
    choice: crate::setup::config::IoChoice,
    fallbacks: usize,
    workers: usize,
) -> &'static str {
    match choice {
        crate::setup::config::IoChoice::Uring if fallbacks == 0 => "uring",
        crate::setup::config::IoChoice::Uring if fallbacks < workers => "mixed",
        _ => "epoll",
    }
}

fn conns(ctx: &Ctx<'_>, sink: &mut Sink<'_>) {
    let shared = ctx.shared;
    let now = shared.clock.now();
    for (fd, kind, info) in shared.connection_list() {
        let last = info.last_cmd.load(Ordering::Relaxed);
        let key = |k: &str| format!("{fd}:{k}");
        match kind {
            ConnKind::Listener => {
                emit(sink, &key("addr"), &info.addr);
                emit(sink, &key("state"), "conn_listening");
            }
            ConnKind::Client => {
                emit(sink, &key("addr"), &info.addr);
                emit(sink, &key("listen_addr"), &info.listen_addr);
                emit(sink, &key("state"), info.state().name());
            }
            ConnKind::Udp => {
                emit(sink, &key("UDP"), "UDP");
                emit(sink, &key("addr"), &info.addr);
                emit(sink, &key("state"), "conn_read");
            }
        }
        emit(sink, &key("secs_since_last_cmd"), now.saturating_sub(last));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::config::IoChoice;

    #[test]
    fn io_setting_counts_workers_that_fell_back() {
        assert_eq!(io_in_use(IoChoice::Uring, 0, 4), "uring");
        assert_eq!(io_in_use(IoChoice::Uring, 1, 4), "mixed");
        assert_eq!(io_in_use(IoChoice::Uring, 4, 4), "epoll");
        assert_eq!(io_in_use(IoChoice::Epoll, 0, 4), "epoll");
    }
}
