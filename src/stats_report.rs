//! The `stats` command and its groups, in memcached's names, order and format.

use std::fmt::Display;
use std::sync::atomic::Ordering;

use kvproto::text::{self as proto, Tokens};

use crate::config::{MemoryLimit, ProtocolChoice};
use crate::conn::{Ctx, Session};
use crate::stats;

/// `stats [group ...]`.
pub fn write(ctx: &mut Ctx<'_>, s: &mut Session, mut args: Tokens<'_>) {
    let Some(group) = args.next() else {
        general(ctx, &mut s.out);
        s.out.extend_from_slice(proto::END);
        return;
    };
    // memcached matches these subcommands by prefix (`stats set` is `stats settings`).
    let is = |name: &str| name.as_bytes().starts_with(group);
    let shared = ctx.shared;
    let out = &mut s.out;
    if is("reset") {
        shared.stats.reset();
        shared.engine.reset_stats();
        shared.reset_connection_stats();
        out.extend_from_slice(b"RESET\r\n");
        return;
    }
    if is("detail") {
        out.extend_from_slice(b"CLIENT_ERROR usage: stats detail on|off|dump\r\n");
        return;
    }
    if is("settings") {
        settings(ctx, out);
    } else if is("cachedump") {
        out.extend_from_slice(b"CLIENT_ERROR stats cachedump not allowed\r\n");
        return;
    } else if is("conns") {
        conns(ctx, out);
    } else {
        match group {
            b"items" | b"slabs" => {
                let name = if group == b"items" { "items" } else { "slabs" };
                for (k, v) in shared.engine.stats_detail(name) {
                    stat(out, &k, v);
                }
            }
            b"sizes" => stat(out, "sizes_status", "disabled"),
            _ => {
                out.extend_from_slice(proto::ERROR);
                return;
            }
        }
    }
    out.extend_from_slice(proto::END);
}

fn stat(out: &mut Vec<u8>, name: &str, value: impl Display) {
    proto::write_stat(out, name, value);
}

fn general(ctx: &mut Ctx<'_>, out: &mut Vec<u8>) {
    let shared = ctx.shared;
    let t = shared.stats.totals();
    let e = shared.engine.stats();
    let ((us, uus), (ss, sus)) = stats::rusage();
    let c = &shared.config;
    stat(out, "pid", std::process::id());
    stat(out, "uptime", shared.clock.uptime());
    stat(out, "time", shared.clock.now());
    stat(out, "version", crate::VERSION);
    stat(out, "pointer_size", usize::BITS);
    stat(out, "rusage_user", format_args!("{us}.{uus:06}"));
    stat(out, "rusage_system", format_args!("{ss}.{sus:06}"));
    stat(out, "max_connections", c.max_connections);
    stat(
        out,
        "curr_connections",
        shared.curr_conns.load(Ordering::Relaxed),
    );
    stat(
        out,
        "total_connections",
        shared.total_conns.load(Ordering::Relaxed),
    );
    stat(
        out,
        "rejected_connections",
        shared.rejected_conns.load(Ordering::Relaxed),
    );
    stat(
        out,
        "connection_structures",
        shared.curr_conns.load(Ordering::Relaxed),
    );
    stat(out, "cmd_get", t.cmd_get);
    stat(out, "cmd_set", t.cmd_set);
    stat(out, "cmd_flush", t.cmd_flush);
    stat(out, "cmd_touch", t.cmd_touch);
    stat(out, "cmd_meta", t.cmd_meta);
    stat(out, "get_hits", t.get_hits);
    stat(out, "get_misses", t.get_misses);
    stat(out, "get_expired", e.get_expired);
    stat(out, "get_flushed", e.get_flushed);
    stat(out, "delete_misses", t.delete_misses);
    stat(out, "delete_hits", t.delete_hits);
    stat(out, "incr_misses", t.incr_misses);
    stat(out, "incr_hits", t.incr_hits);
    stat(out, "decr_misses", t.decr_misses);
    stat(out, "decr_hits", t.decr_hits);
    stat(out, "cas_misses", t.cas_misses);
    stat(out, "cas_hits", t.cas_hits);
    stat(out, "cas_badval", t.cas_badval);
    stat(out, "touch_hits", t.touch_hits);
    stat(out, "touch_misses", t.touch_misses);
    stat(out, "store_too_large", t.store_too_large);
    stat(out, "store_no_memory", t.store_no_memory);
    stat(out, "auth_cmds", t.auth_cmds);
    stat(out, "auth_errors", t.auth_errors);
    stat(out, "bytes_read", t.bytes_read);
    stat(out, "bytes_written", t.bytes_written);
    stat(out, "limit_maxbytes", e.limit_maxbytes);
    stat(out, "accepting_conns", 1);
    stat(out, "threads", c.threads);
    stat(out, "conn_yields", t.conn_yields);
    stat(out, "bytes", e.bytes);
    stat(out, "curr_items", e.curr_items);
    stat(out, "total_items", e.total_items);
    stat(out, "expired_unfetched", e.expired_unfetched);
    stat(out, "evicted_unfetched", e.evicted_unfetched);
    stat(out, "evictions", e.evictions);
    stat(out, "reclaimed", e.reclaimed);
    stat(out, "total_malloced", e.total_malloced);
}

fn settings(ctx: &mut Ctx<'_>, out: &mut Vec<u8>) {
    let shared = ctx.shared;
    let c = &shared.config;
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let maxbytes = shared.engine.stats().limit_maxbytes;
    stat(out, "maxbytes", maxbytes);
    stat(out, "maxconns", c.max_connections);
    stat(out, "tcpport", c.tcp_port);
    stat(out, "udpport", c.udp_port);
    stat(out, "inter", c.listen.join(","));
    stat(out, "verbosity", shared.verbosity.load(Ordering::Relaxed));
    stat(out, "oldest", 0);
    stat(out, "evictions", if c.no_evict { "off" } else { "on" });
    match &c.unix_socket {
        Some(p) => stat(out, "domain_socket", p.display()),
        None => stat(out, "domain_socket", "NULL"),
    }
    stat(out, "umask", format_args!("{:o}", c.unix_mask));
    stat(out, "shutdown_command", yes_no(c.enable_shutdown));
    stat(out, "num_threads", c.threads);
    stat(out, "reqs_per_event", c.reqs_per_event);
    stat(out, "cas_enabled", yes_no(c.use_cas));
    stat(out, "tcp_backlog", c.backlog);
    let proto_name = match c.protocol {
        ProtocolChoice::Auto => "auto-negotiate",
        ProtocolChoice::Ascii => "ascii",
        ProtocolChoice::Binary => "binary",
    };
    stat(out, "binding_protocol", proto_name);
    stat(out, "auth_enabled_sasl", yes_no(c.sasl));
    stat(out, "auth_enabled_ascii", yes_no(c.auth_file.is_some()));
    stat(out, "item_size_max", c.item_size_max);
    stat(out, "flush_enabled", yes_no(c.flush_enabled));
    stat(
        out,
        "idle_timeout",
        c.idle_timeout.map(|d| d.as_secs()).unwrap_or(0),
    );
    match &c.memory_file {
        Some(p) => stat(out, "memory_file", p.display()),
        None => stat(out, "memory_file", "(null)"),
    }
    stat(
        out,
        "memory_auto",
        yes_no(matches!(c.memory_limit, MemoryLimit::Auto)),
    );
    stat(out, "engine", shared.engine_name);
}

fn conns(ctx: &mut Ctx<'_>, out: &mut Vec<u8>) {
    let shared = ctx.shared;
    let now = shared.clock.now();
    for (fd, kind, info) in shared.connection_list() {
        let last = info.last_cmd.load(Ordering::Relaxed);
        let key = |k: &str| format!("{fd}:{k}");
        match kind {
            crate::server::ConnKind::Listener => {
                stat(out, &key("addr"), &info.addr);
                stat(out, &key("state"), "conn_listening");
            }
            crate::server::ConnKind::Client => {
                stat(out, &key("addr"), &info.addr);
                stat(out, &key("listen_addr"), &info.listen_addr);
                stat(out, &key("state"), info.state_name());
                stat(out, &key("secs_since_last_cmd"), now.saturating_sub(last));
            }
        }
    }
}
