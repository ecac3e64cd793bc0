//! The `-h` and `-i` texts.

use crate::setup::config::{Config, MemoryLimit};

/// The `-h` text.
pub fn help_text() -> String {
    let d = Config::default();
    let version = env!("CARGO_PKG_VERSION");
    let mb = match d.memory_limit {
        MemoryLimit::Fixed(b) => (b >> 20).to_string(),
        MemoryLimit::Auto => "auto".into(),
    };
    format!(
        "\
kvcached {version}: a memcached-compatible cache server.
Takes memcached 1.6's options. Usage: kvcached [options]

Network
  -p, --port=PORT             TCP port; 0 turns TCP off, -1 lets the kernel pick one
                              (default {tcp_port})
  -U, --udp-port=PORT         UDP port; 0 turns UDP off, -1 lets the kernel pick one
                              (default {udp_port}). Given without -p, TCP uses it too.
  -l, --listen=ADDR[,ADDR]    where to listen; repeatable (default {listen}).
                              ADDR is HOST, HOST:PORT, [IPv6]:PORT, or * for every
                              interface, optionally prefixed by proto[ascii|binary|
                              negotiating]: and tag[NAME]:
  -s, --unix-socket=FILE      listen on this unix socket instead of TCP and UDP
  -a, --unix-mask=MODE        permissions of the unix socket, octal (default {mask:o})
  -b, --listen-backlog=N      listen queue length (default {backlog})
  -c, --conn-limit=N          most simultaneous connections (default {conns})
  -B, --protocol=NAME         auto, ascii or binary (default auto)

TLS (as memcached's; rustls, no OpenSSL)
  -Z, --enable-ssl            serve TLS on every TCP listener; an -l entry prefixed
                              notls: stays plaintext, btls: never asks for a client
                              certificate, mtls: requires one
  -o ssl_chain_cert=FILE      the server's certificate chain (PEM)
  -o ssl_key=FILE             its private key (default: in the chain file)
  -o ssl_keyformat=N          1 PEM (default), 2 DER
  -o ssl_ca_cert=FILE         CAs (PEM) client certificates must chain to (without
                              it none can be verified: 2, 3 and mtls: serve no one)
  -o ssl_verify_mode=N        client certificates: 0 none (default), 1 request,
                              2 require, 3 once (as 2)
  -o ssl_min_version=N        2 TLS 1.2 (default), 3 TLS 1.3
  -o ssl_ciphers=LIST         OpenSSL cipher list restricting the TLS 1.2 suites
  -o ssl_session_cache        allow session resumption (server-side cache)
  -o ssl_wbuf_size=KB         most reply bytes encrypted per write (default 16)
  The refresh_certs command re-reads the files without a restart.

Memory and items
  -m, --memory-limit=MB       item memory in megabytes, or auto to size to the memory
                              the machine or container has (default {mb})
  -I, --max-item-size=SIZE    largest item, with k, m or g suffix; at least 1k, at most
                              1g and half of -m (default 1m)
  -M, --disable-evictions     answer writes with an error when memory is full instead
                              of evicting
  -C, --disable-cas           do not assign CAS values
  -e, --memory-file=FILE      memory file for restartable cache (as memcached's -e)

Commands
  -A, --enable-shutdown       allow the shutdown command
  -F, --disable-flush-all     refuse flush_all
  -X, --disable-dumping       refuse stats cachedump, stats detail and lru_crawler
                              metadump and mgdump
  -D CHAR                     count stats detail per key prefix from the start; a key's
                              prefix ends at its first CHAR (default :)
  -W, --disable-watch         refuse the watch command
  -S, --enable-sasl           require SASL authentication (binary protocol)
  -Y, --auth-file=FILE        require ASCII authentication; FILE holds user:password lines

Threads
  -t, --threads=N             worker threads (default: the number of CPUs the process
                              may run on)
  -R, --max-reqs-per-event=N  requests served on one connection before others get a
                              turn (default {reqs})

Process
  -d, --daemon                run in the background
  -P, --pidfile=FILE          write the process id to FILE
  -u, --user=USER             run as USER when started as root (required as root;
                              -u root keeps root)
  -k, --lock-memory           lock all memory into RAM (mlockall)
  -r, --enable-coredumps      raise the core file size limit as far as allowed
  -v, --verbose               log errors and warnings; -vv also commands, -vvv more
  -h, --help                  print this help and exit
  -i, --license               print the license and exit
  -V, --version               print the version and exit
      --config-file=FILE      read options from FILE, one per line, as Debian's
                              /etc/memcached.conf (# comments; -d and logfile lines
                              skipped); options after it override it (kvcached's own)

Replication (kvcached's own)
      --replica-of=HOST:PORT  follow that master as a read-only replica (at run time:
                              `replicaof HOST PORT`, `replicaof no one` to promote)
      --replica-auth=FILE     credentials for a master with -Y: the first line of FILE,
                              `user:password` (as in a -Y file)
      --replica-auth-mech=ascii|sasl
                              how to present them: ASCII auth (a -Y master, the default)
                              or SASL PLAIN, pulling over the binary protocol (a -S master)
      --min-replicas=N        refuse writes (SERVER_ERROR not enough good replicas) unless
                              N replicas are in sync (default 0: off)
      --min-replicas-max-lag=SECONDS
                              in sync: pulled within, and lagging at most, SECONDS
                              (default 10)
      --repl-backlog=MEGABYTES
                              the most memory (within -m) a master keeps in segments whose
                              items all expired or died, for replicas that have not read
                              them yet, so they continue without a full sync (default: a
                              sixteenth of -m)
      --replica-serve-stale=yes|no
                              a replica whose link is down or that is in a full sync
                              answers reads (yes, default) or refuses them (no)
      --replica-tls           connect to the master over TLS, checking its certificate
      --replica-tls-ca=FILE   the CA (PEM) the master's certificate chains to
      --replica-tls-cert=FILE, --replica-tls-key=FILE
                              a client certificate and key, for a master that requires
                              one (ssl_verify_mode 2 or 3, an mtls: listener)
      --replica-tls-name=NAME the name the master's certificate must carry (default:
                              the host in --replica-of)

Extended options: -o, --extended=OPT[,OPT=VALUE...]
  idle_timeout=SECONDS        close connections idle this long; 0 never (default 0)
  maxconns_fast               over -c, answer a new connection with an error and close
                              it (default); no_maxconns_fast (or no_modern) leaves it
                              queued instead
  read_buf_mem_limit=MB       memory all connections' read and reply buffers may hold
                              together; 0 no limit (default 0). Over it a connection that
                              needs more is closed (read_buf_oom, response_obj_oom) and a
                              get answers SERVER_ERROR out of memory writing get response
  watcher_logbuf_size=KB      bytes each watch connection's buffer holds (default 256)
  lru_crawler                 reclaim expired items in the background (default);
                              no_lru_crawler (or no_modern) leaves them until a request
                              finds them; `lru_crawler enable|disable` at run time
  evict_size_factor=N         eviction keeps an item up to N times the mean item's
                              size once it was read, a larger one only if read more
                              often: more items, more hits, fewer bytes hit (kvcached's
                              own; default 4; 0 treats all sizes alike)
  metrics=HOST:PORT           serve Prometheus metrics at http://HOST:PORT/metrics, in
                              memcached_exporter's names plus kvcached_* (off by default)
  engine=log                  the item store: the segmented log (the only one;
                              accepted so older command lines still work)
  log_format=text|json        log lines on stderr as text (default; no timestamps under
                              systemd, whose journal adds them) or as one JSON object per
                              line (kvcached's own). -v, -vv, -vvv add info, debug and
                              trace events, as memcached's -v levels
  ext_direct                  with ext_path: read and write the flash files with O_DIRECT,
                              bypassing the page cache (kvcached's own; memcached, and
                              kvcached by default, go through it)
  ext_ignore_bad_file         with ext_path: when a flash file cannot be made (no space,
                              a bad path), log why and serve from memory alone instead
                              of exiting (kvcached's own)
  warm_restart_ignore_bad_file
                              with -e: when the file cannot be used (damaged, cut short,
                              another format or other -C/-I), move it to FILE.bad and
                              start with an empty cache instead of exiting (kvcached's own)
  ssl_handshake_timeout=SECONDS
                              with -Z: close a connection whose TLS handshake has not
                              completed after SECONDS (kvcached's own; default 10; 0 never)
  reuseport                   a listening socket per worker thread (SO_REUSEPORT, each
                              with SO_INCOMING_CPU set to its worker's CPU) instead of
                              one socket all workers accept from (kvcached's own)
  cpu_affinity                pin worker N to the Nth CPU the process may run on
                              (kvcached's own)
  io=auto|uring|epoll         the I/O runtime of TCP and unix connections: io_uring
                              (one system call per turn of a worker's loop), epoll, or
                              io_uring where the kernel allows it (kvcached's own;
                              default auto, or $KVCACHED_IO)
  io_sqpoll[=MS]              under io_uring, a kernel thread per worker takes its
                              submissions (SQPOLL), sleeping after MS milliseconds
                              without any (default 10); it spends a CPU while busy, so
                              it pays only where cores are spare (kvcached's own;
                              default off, or $KVCACHED_IO_SQPOLL milliseconds)
  io_sqpoll_cpus=LIST         with io_sqpoll (on if not given): worker N's polling
                              thread on the (N mod len)-th CPU of LIST (2:3 or 4-7), e.g.
                              cores spare beside cpu_affinity's (kvcached's own)
  debug_clock                 TESTS ONLY: enable the debugtime command, which moves the
                              server clock. Never use in production.

Slab sizing (kvcached keeps items in a log, not in slabs; these set only the size
classes that stats items, stats slabs, me and lru_crawler metadump report):
  -f, --slab-growth-factor, -n, --slab-min-size, and the -o options slab_chunk_max,
  slab_sizes; -o track_sizes turns on stats sizes

Accepted for compatibility and ignored (logged at startup):
  -L, --enable-largepages,
  -N, --napi-ids, and the -o options hashpower,
  no_hashexpand, tail_repair_time, hash_algorithm, slab_reassign, slab_automove,
  slab_automove_ratio, slab_automove_window, slab_automove_freeratio,
  no_chunked_items, lru_crawler_sleep, lru_crawler_tocrawl,
  lru_maintainer, hot_lru_pct, warm_lru_pct, hot_max_factor, warm_max_factor,
  temporary_ttl, worker_logbuf_size, resp_obj_mem_limit, inline_ascii_resp, modern,
  drop_privileges, relaxed_privileges, sock_cookie_id, proxy_arg, proxy_uring,
  proxy_memprofile and ext_* (extstore settings); most have a no_ form. Their values
  are still checked as memcached checks them.

Refused: the option that starts memcached's proxy (no proxy mode), -o ssl_kernel_tls
  (TLS is in user space), ssl_min_version 0 and 1 (TLS 1.0 and 1.1), ssl_keyformat 3
  (OpenSSL engines).
",
        tcp_port = d.tcp_port,
        udp_port = d.udp_port,
        listen = d.listen.join(","),
        mask = d.unix_mask,
        backlog = d.backlog,
        conns = d.max_connections,
        reqs = d.reqs_per_event,
    )
}

/// The `-i` text.
pub fn license_text() -> String {
    format!(
        "kvcached {}\n\n\
         kvcached is distributed under the BSD 3-Clause license. It is a new program,\n\
         written in Rust, that follows memcached's protocols and command line; it\n\
         contains no memcached or libevent code.\n\
         memcached is Copyright (c) 2003, Danga Interactive, Inc., under a BSD license.\n",
        env!("CARGO_PKG_VERSION")
    )
}
