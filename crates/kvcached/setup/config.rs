//! The validated server configuration: what the command line (see `cli`) builds, and what
//! the server reads. Every field here has been checked; nothing downstream re-validates.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// How much memory items may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryLimit {
    /// A fixed number of bytes (`-m N`, megabytes on the command line).
    Fixed(usize),
    /// Size to the memory available to the process, and give memory back under pressure
    /// (`-m auto`).
    Auto,
}

/// Which protocols a connection may speak (`-B`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolChoice {
    Auto,
    Ascii,
    Binary,
}

/// One listener from `-l`: `[proto[NAME]:][tag[NAME]:]HOST[:PORT]`, where HOST is a name,
/// an IPv4 address, an IPv6 address (bare, or in brackets when a port follows:
/// `[::1]:11211`), or `*` for every interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    /// The host to bind; `None` for `*` (every interface, IPv4 and IPv6).
    pub host: Option<String>,
    /// The entry's own port; `None` means the `-p` (TCP) or `-U` (UDP) port. `Some(0)`
    /// (written `:0` or `:-1`) is a port the kernel picks, as in memcached.
    pub port: Option<u16>,
    /// A `proto[ascii|binary|negotiating]:` prefix forcing this listener's protocol;
    /// `None` means `-B`.
    pub protocol: Option<ProtocolChoice>,
    /// A `tag[NAME]:` (or `tag_NAME_:`) prefix: 1 to 8 bytes naming the listener.
    pub tag: Option<String>,
    /// A `notls:`, `btls:` or `mtls:` prefix (with `-Z`).
    pub tls: ListenTls,
}

/// What a TCP listener does about TLS when `-Z` is given (memcached's `-l` prefixes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListenTls {
    /// TLS with `ssl_verify_mode`'s client-certificate policy (no prefix).
    #[default]
    Default,
    /// `notls:`: plaintext on this listener.
    Plain,
    /// `btls:`: TLS, never asking for a client certificate.
    NoPeer,
    /// `mtls:`: TLS, requiring a client certificate.
    Peer,
}

/// TLS settings (`-Z` and `-o ssl_*`), kept whether or not `-Z` is given, as memcached
/// keeps them (and prints them in `stats settings`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SslConfig {
    /// `-Z`/`--enable-ssl`.
    pub enabled: bool,
    /// Files, verification, versions, ciphers, session cache.
    pub settings: kvtls::server::Settings,
    /// `ssl_wbuf_size` (given in KiB): the most plaintext handed to TLS per write.
    pub wbuf_size: usize,
    /// Close a connection whose TLS handshake has not completed after this long
    /// (`-o ssl_handshake_timeout=SECONDS`, kvcached's own; 0: never).
    pub handshake_timeout: Option<Duration>,
}

impl Default for SslConfig {
    fn default() -> Self {
        SslConfig {
            enabled: false,
            settings: kvtls::server::Settings::default(),
            wbuf_size: 16 * 1024,
            handshake_timeout: Some(Duration::from_secs(10)),
        }
    }
}

impl ListenAddr {
    /// A plain listener on `host` with no prefixes and no port of its own.
    pub fn host(host: &str) -> ListenAddr {
        ListenAddr {
            host: Some(host.to_string()),
            port: None,
            protocol: None,
            tag: None,
            tls: ListenTls::Default,
        }
    }

    /// The port this listener binds: its own, or `default_port` (the `-p`/`-U` port, where
    /// -1 asks for an ephemeral port). 0 is a port the kernel picks.
    pub fn port_or(&self, default_port: i32) -> u16 {
        self.port
            .unwrap_or_else(|| u16::try_from(default_port).unwrap_or(0))
    }

    /// Resolve to the socket addresses to bind (a host name can give several; `*` gives
    /// `0.0.0.0` and `[::]`). Blocks on name resolution, so call it at startup only.
    pub fn socket_addrs(&self, default_port: i32) -> io::Result<Vec<SocketAddr>> {
        let port = self.port_or(default_port);
        match &self.host {
            None => Ok(vec![
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)),
                SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)),
            ]),
            Some(h) => Ok((h.as_str(), port).to_socket_addrs()?.collect()),
        }
    }
}

/// The flash tier's settings (memcached's extstore options, where the meaning carries
/// over: docs/CONFIGURATION.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlashSettings {
    /// The flash files and the bytes each may take (`ext_path=PATH:SIZE`, repeatable).
    pub files: Vec<(PathBuf, u64)>,
    /// Bytes of segment images that may wait for the writers (`ext_wbuf_size`).
    pub wbuf_size: u64,
    /// Writer threads, and threads reading flash for the workers (`ext_threads`).
    pub threads: usize,
    /// Serve from memory alone when the files cannot be made (no space, a bad path)
    /// instead of refusing to start (`-o ext_ignore_bad_file`; kvcached's own).
    pub ignore_bad_file: bool,
    /// Copy back to memory one in this many flash items read again
    /// (`ext_recache_rate`; 0 never).
    pub recache_rate: u32,
    /// Items whose record is shorter than this many bytes are evicted rather than sent
    /// to flash (`ext_item_size`; 0, the default, sends every one).
    pub item_size: u32,
    /// Bypass the page cache (`O_DIRECT`; `-o ext_direct`, kvcached's own); memcached
    /// reads and writes extstore through it.
    pub direct: bool,
    /// Make room on flash while fewer pages than this are free (`ext_compact_under`; 0:
    /// kvcached's own margin).
    pub compact_under: u32,
    /// Compaction keeps only the items read while on flash (`ext_drop_unread`).
    pub drop_unread: bool,
    /// Only pages less full than this many thousandths of a page are compacted
    /// (`ext_max_frag`, memcached's fraction; 1000: any).
    pub max_frag: u32,
}

/// The whole configuration of a kvcached process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// TCP port (`-p`), as memcached keeps it: 0 turns TCP off (every listener, even one
    /// with a port of its own), -1 asks the kernel for an ephemeral port, else 1-65535.
    pub tcp_port: i32,
    /// UDP port (`-U`), the same way; 0 (the default) turns UDP off.
    pub udp_port: i32,
    /// Interfaces to listen on (`-l`, repeatable and comma-separated; an entry may carry its
    /// own `:port`). Default: `127.0.0.1`.
    pub listen: Vec<String>,
    /// `listen` parsed: one entry per element of `listen`, in the same order.
    pub listeners: Vec<ListenAddr>,
    /// Unix socket path (`-s`); when set, TCP and UDP are off, as in memcached.
    pub unix_socket: Option<PathBuf>,
    /// Permission bits of the unix socket (`-a`, octal, default 0700).
    pub unix_mask: u32,
    /// Item memory (`-m`, default 64 MiB).
    pub memory_limit: MemoryLimit,
    /// Largest item (`-I`, default 1 MiB).
    pub item_size_max: usize,
    /// Refuse writes instead of evicting when memory is full (`-M`).
    pub no_evict: bool,
    /// Assign CAS uniques (`-C` turns this off).
    pub use_cas: bool,
    /// Most simultaneous connections (`-c`, default 1024).
    pub max_connections: usize,
    /// Worker threads (`-t`, default: the number of cores).
    pub threads: usize,
    /// Listen backlog (`-b`, default 1024).
    pub backlog: i32,
    /// Most requests handled for one connection before the worker turns to others (`-R`).
    pub reqs_per_event: usize,
    /// Verbosity (`-v` counts).
    pub verbose: u8,
    /// Allow the `shutdown` command (`-A`).
    pub enable_shutdown: bool,
    /// Allow `flush_all` (`-F` turns it off).
    pub flush_enabled: bool,
    /// memcached's slab class chunk sizes, from `-n`, `-f`, `-o slab_chunk_max` and
    /// `-o slab_sizes` ([`slab_classes`]): kvcached keeps items in a log, not in slabs,
    /// but reports live items per class in `stats items` and `stats slabs` and gives
    /// each item its class in `lru_crawler metadump`.
    pub slab_classes: Vec<u32>,
    /// Count live items per 32 bytes of size for `stats sizes` (`-o track_sizes`).
    pub track_sizes: bool,
    /// A listening socket per worker (SO_REUSEPORT, SO_INCOMING_CPU) instead of one shared
    /// socket (`-o reuseport`; kvcached's own).
    pub reuseport: bool,
    /// Pin each worker thread to one CPU (`-o cpu_affinity`; kvcached's own).
    pub cpu_affinity: bool,
    /// The I/O runtime of TCP and unix connections (`-o io=`; kvcached's own).
    pub io: IoChoice,
    /// Under io_uring, a kernel thread per worker polls its submission queue, and sleeps
    /// after this many milliseconds without work (`-o io_sqpoll[=MS]`; kvcached's own).
    pub io_sqpoll: Option<u32>,
    /// CPUs for the submission-queue polling threads: worker N's on the (N mod len)-th
    /// (`-o io_sqpoll_cpus=LIST`; kvcached's own). Empty: wherever the worker may run.
    pub io_sqpoll_cpus: Vec<u32>,
    /// Allow the commands that dump keys: `stats cachedump`, `stats detail dump`,
    /// `lru_crawler metadump` (`-X` turns them off).
    pub dump_enabled: bool,
    /// The delimiter ending a key's prefix for `stats detail` (`-D`, default `:`).
    pub prefix_delimiter: u8,
    /// Count per-prefix stats from the start (`-D` turns this on, as in memcached;
    /// `stats detail on|off` at run time).
    pub detail_enabled: bool,
    /// Allow the `watch` command (`-W` turns it off).
    pub watch_enabled: bool,
    /// Over the connection limit, accept a new connection, send it
    /// `ERROR Too many open connections` and close it, rather than leave it waiting in the
    /// listen backlog (memcached's default; `-o no_maxconns_fast` turns it off).
    pub maxconns_fast: bool,
    /// Close connections idle for this long (`-o idle_timeout=SECONDS`; 0 or absent: never).
    pub idle_timeout: Option<Duration>,
    /// Serve Prometheus metrics here (`-o metrics=HOST:PORT`; kvcached's own option).
    pub metrics: Option<std::net::SocketAddr>,
    /// Bytes all connections' buffers may hold together (memcached's
    /// `-o read_buf_mem_limit`, given in megabytes); 0: no limit.
    pub read_buf_mem_limit: usize,
    /// Reclaim expired items in the background (`-o lru_crawler`, the default;
    /// `-o no_lru_crawler` leaves them until a request finds them or eviction takes them).
    pub lru_crawler: bool,
    /// memcached's LRU maintainer thread is on (`-o lru_maintainer`, the default;
    /// `-o no_lru_maintainer` and `no_modern` turn it off). kvcached has none; like memcached
    /// it reports the maintainer's `stats` fields only while it would run.
    pub lru_maintainer: bool,
    /// memcached's slab mover is on (`-o slab_reassign`, the default; `no_slab_reassign` and
    /// `no_modern` turn it off). kvcached has none; like memcached it reports the mover's
    /// `stats` fields only while it would run.
    pub slab_reassign: bool,
    /// The level memcached's hash table would start at (`-o hashpower`, default 16), from
    /// which `stats` reports `hash_power_level` as memcached's table would grow.
    pub hashpower: u32,
    /// Bytes each `watch` connection's buffer holds at most (`-o watcher_logbuf_size`, in
    /// kilobytes, as memcached's).
    pub watcher_buf: usize,
    /// Eviction's size bias (`-o evict_size_factor`, kvcached's own; 0: none): see
    /// `kvstore::LogEngine::set_size_factor`.
    pub evict_size_factor: u32,
    /// Run in the background (`-d`).
    pub daemonize: bool,
    /// Write the process id here (`-P`).
    pub pid_file: Option<PathBuf>,
    /// Drop privileges to this user (`-u`).
    pub user: Option<String>,
    /// Lock item memory into RAM (`-k`).
    pub lock_memory: bool,
    /// Raise the core file size limit as far as allowed (`-r`).
    pub max_core_file: bool,
    /// `-B`.
    pub protocol: ProtocolChoice,
    /// SASL authentication over the binary protocol (`-S`).
    pub sasl: bool,
    /// ASCII authentication file (`-Y`).
    pub auth_file: Option<PathBuf>,
    /// Warm-restart memory file (`-e`).
    pub memory_file: Option<PathBuf>,
    /// The flash tier (`-o ext_path=...` and the `ext_*` options that carry over), if any.
    pub flash: Option<FlashSettings>,
    /// Start with an empty cache when the `-e` file cannot be used, moving it to
    /// `FILE.bad`, instead of refusing to start (`-o warm_restart_ignore_bad_file`;
    /// kvcached's own).
    pub warm_ignore_bad_file: bool,
    /// How log lines are written to stderr (`-o log_format=text|json`; kvcached's own).
    pub log_format: crate::setup::logging::Format,
    /// Enable the `debugtime` command, which shifts the server clock (`-o debug_clock`;
    /// for tests, never for production).
    pub debug_clock: bool,
    /// Follow this master ("host:port") as a read-only replica (`--replica-of`;
    /// kvcached's own option).
    pub replica_of: Option<String>,
    /// `user:password` file for authenticating to a master that has `-Y` (`--replica-auth`).
    pub replica_auth: Option<PathBuf>,
    /// Authenticate to the master with SASL PLAIN and pull over the binary protocol (a
    /// master with `-S`) instead of ASCII auth and text (`--replica-auth-mech=sasl`).
    pub replica_auth_sasl: bool,
    /// Refuse writes unless this many replicas are in sync (`--min-replicas`; 0: off).
    pub min_replicas: usize,
    /// In sync: pulled and lagging at most this long (`--min-replicas-max-lag`, seconds).
    pub min_replicas_max_lag: Duration,
    /// The most bytes of dead or expired segments a master keeps for replicas that have
    /// not read them (`--repl-backlog`, megabytes; 0: a sixteenth of the memory limit).
    pub repl_backlog: usize,
    /// A replica answers reads while its link is down or it is in a full sync
    /// (`--replica-serve-stale yes|no`, default yes).
    pub replica_serve_stale: bool,
    /// TLS (`-Z`, `-o ssl_*`).
    pub ssl: SslConfig,
    /// Connect to the master over TLS (`--replica-tls`, `--replica-tls-ca`, ...).
    pub replica_tls: Option<kvtls::client::Settings>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tcp_port: 11211,
            udp_port: 0,
            listen: vec!["127.0.0.1".to_string()],
            listeners: vec![ListenAddr::host("127.0.0.1")],
            unix_socket: None,
            unix_mask: 0o700,
            memory_limit: MemoryLimit::Fixed(64 << 20),
            item_size_max: 1 << 20,
            slab_classes: slab_classes(48, 1.25, 512 << 10, None),
            track_sizes: false,
            reuseport: false,
            cpu_affinity: false,
            io: IoChoice::default_from_env(),
            io_sqpoll: sqpoll_from_env(),
            io_sqpoll_cpus: Vec::new(),
            no_evict: false,
            use_cas: true,
            max_connections: 1024,
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(4),
            backlog: 1024,
            reqs_per_event: 20,
            verbose: 0,
            enable_shutdown: false,
            flush_enabled: true,
            dump_enabled: true,
            prefix_delimiter: b':',
            detail_enabled: false,
            watch_enabled: true,
            maxconns_fast: true,
            idle_timeout: None,
            metrics: None,
            read_buf_mem_limit: 0,
            lru_crawler: true,
            lru_maintainer: true,
            slab_reassign: true,
            hashpower: 16,
            // memcached's LOGGER_WATCHER_BUF_SIZE.
            watcher_buf: 256 * 1024,
            evict_size_factor: kvstore::DEFAULT_SIZE_FACTOR,
            daemonize: false,
            pid_file: None,
            user: None,
            lock_memory: false,
            max_core_file: false,
            protocol: ProtocolChoice::Auto,
            sasl: false,
            auth_file: None,
            memory_file: None,
            flash: None,
            warm_ignore_bad_file: false,
            log_format: crate::setup::logging::Format::Text,
            debug_clock: false,
            replica_of: None,
            replica_auth: None,
            replica_auth_sasl: false,
            min_replicas: 0,
            min_replicas_max_lag: Duration::from_secs(10),
            repl_backlog: 0,
            replica_serve_stale: true,
            ssl: SslConfig::default(),
            replica_tls: None,
        }
    }
}

/// memcached's slab class chunk sizes (slabs.c `slabs_init`), class 1 first: from a 48-byte
/// item header plus `min_size` (`-n`), each the one before times `factor` (`-f`,
/// truncated) and rounded up to 8 bytes, while below `chunk_max / factor`; or the sizes of
/// `-o slab_sizes`, rounded up to 8; then a last class of `chunk_max` (`-o
/// slab_chunk_max`), where larger items are counted. At most 63 classes.
pub fn slab_classes(min_size: u32, factor: f64, chunk_max: u32, sizes: Option<&[u32]>) -> Vec<u32> {
    const MAX_CLASSES: usize = 63;
    let align = |s: u64| s.div_ceil(8) * 8;
    let mut out: Vec<u32> = Vec::new();
    let mut size = 48 + u64::from(min_size);
    while out.len() < MAX_CLASSES - 1 {
        match sizes {
            Some(list) => match list.get(out.len()) {
                Some(s) => size = u64::from(*s),
                None => break,
            },
            None if size as f64 >= f64::from(chunk_max) / factor => break,
            None => {}
        }
        let s = align(size);
        out.push(u32::try_from(s).unwrap_or(u32::MAX));
        if sizes.is_none() {
            size = (s as f64 * factor) as u64;
        }
    }
    out.push(chunk_max);
    out
}

/// The slab class (1-based) memcached gives an item of `size` bytes (slabs.c
/// `slabs_clsid`): the first class whose chunks hold it, the last for larger ones.
pub fn slab_class_of(classes: &[u32], size: usize) -> u32 {
    let i = classes.partition_point(|c| (*c as usize) < size);
    (i.min(classes.len().saturating_sub(1)) + 1) as u32
}

/// The I/O runtime of TCP and unix connections (`-o io=uring|epoll|auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoChoice {
    /// io_uring where the kernel allows it, else epoll.
    Auto,
    /// io_uring; if the kernel refuses it, epoll, with a line on stderr.
    Uring,
    /// epoll (through mio).
    Epoll,
}

impl IoChoice {
    pub fn parse(s: &str) -> Option<IoChoice> {
        match s {
            "auto" => Some(IoChoice::Auto),
            "uring" | "io_uring" => Some(IoChoice::Uring),
            "epoll" => Some(IoChoice::Epoll),
            _ => None,
        }
    }

    /// The default: `KVCACHED_IO` when it names a runtime (so that a test suite can run
    /// against either without changing every command line), else `auto`.
    pub fn default_from_env() -> IoChoice {
        std::env::var("KVCACHED_IO")
            .ok()
            .and_then(|v| IoChoice::parse(&v))
            .unwrap_or(IoChoice::Auto)
    }
}

/// `-o io_sqpoll`'s default: `$KVCACHED_IO_SQPOLL` milliseconds (1 to 60000), as
/// `$KVCACHED_IO` sets `-o io`'s (the test suite runs under either this way).
fn sqpoll_from_env() -> Option<u32> {
    std::env::var("KVCACHED_IO_SQPOLL")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|ms| (1..=60_000).contains(ms))
}
