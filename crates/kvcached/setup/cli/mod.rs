//! memcached's command line, parsed into a [`Config`].
//!
//! kvcached takes every option memcached 1.6 takes, spelled the same way, so that it can
//! replace memcached in a unit file or a container command line. The options are a table
//! ([`OPTIONS`]: each [`Opt`] with its short letter, its long name and whether it takes a
//! value), and parsing has two stages:
//!
//! 1. [`getopt`] splits the arguments the way glibc's `getopt_long` does with that table.
//! 2. [`Builder`] applies each option in order, checking its value ([`values`]; `-o`'s
//!    suboptions are [`suboptions`]), then checks the options against each other the way
//!    memcached does after its option loop ([`validate`]), and yields the validated
//!    [`Config`].
//!
//! Options are handled in order, so `-h`, `-i` and `-V` win over anything after them and
//! an error before them wins over them, as with memcached. `-h`'s text is [`help`].

mod getopt;
mod help;
mod suboptions;
mod validate;
mod values;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::setup::config::{Config, ProtocolChoice};
use getopt::{Lexer, RawOpt};
pub use help::{help_text, license_text};
use values::{bad, float, int, int_in, item_size, listen_entry, memory_limit, port, text};

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run the server. `notes` are messages to log at startup (for example, memcached
    /// options that kvcached accepts and ignores).
    Run {
        config: Box<Config>,
        notes: Vec<String>,
    },
    /// Print this text to stdout and exit 0 (`-h` gives the help text, `-i` the license).
    Help(String),
    /// Print the version and exit 0 (`-V`).
    Version,
}

/// Parse the arguments after the program name. An `Err` is a message for stderr and a
/// non-zero exit.
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Action, String> {
    let args: Vec<OsString> = args.into_iter().collect();
    let mut lexer = Lexer::new(&args);
    let mut builder = Builder::new();
    while let Some(opt) = lexer.next_opt() {
        if let Some(action) = builder.apply(&opt?)? {
            return Ok(action);
        }
    }
    for operand in &lexer.operands {
        builder.note(format!(
            "ignoring extra argument '{}': kvcached, like memcached, takes only options",
            operand.to_string_lossy()
        ));
    }
    builder.finish()
}

/// Smallest `-I`.
pub const ITEM_SIZE_MIN: usize = 1024;
/// Largest `-I`.
pub const ITEM_SIZE_MAX: usize = 1 << 30;
/// Above this many worker threads, warn (as memcached does).
pub const THREADS_WARN: usize = 64;
/// `-o io_sqpoll` without a value: the polling thread sleeps after 10 ms without work.
const DEFAULT_SQPOLL_IDLE_MS: u32 = 10;

/// Whether an option takes a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HasArg {
    No,
    Required,
    /// Required, and a file name: kept as the bytes given, not read as UTF-8 text.
    Path,
    /// Only as `--name=value` (memcached's `--verbose`).
    Optional,
}

impl HasArg {
    /// Whether the option must have a value (the next argument, if not attached).
    fn required(self) -> bool {
        matches!(self, HasArg::Required | HasArg::Path)
    }
}

/// Every option: memcached 1.6's, then kvcached's own (long form only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opt {
    UnixMask,
    EnableShutdown,
    EnableSsl,
    Port,
    UnixSocket,
    UdpPort,
    MemoryLimit,
    DisableEvictions,
    ConnLimit,
    LockMemory,
    Help,
    License,
    Version,
    EnableCoredumps,
    Verbose,
    Daemon,
    Listen,
    User,
    PidFile,
    SlabGrowthFactor,
    SlabMinSize,
    Threads,
    PrefixDelimiter,
    EnableLargepages,
    MaxReqsPerEvent,
    DisableCas,
    ListenBacklog,
    Protocol,
    MaxItemSize,
    EnableSasl,
    DisableFlushAll,
    DisableDumping,
    DisableWatch,
    AuthFile,
    MemoryFile,
    Extended,
    NapiIds,
    ReplicaOf,
    ReplicaAuth,
    MinReplicas,
    MinReplicasMaxLag,
    ReplicaServeStale,
    ReplicaAuthMech,
    ReplicaTls,
    ReplicaTlsCa,
    ReplicaTlsCert,
    ReplicaTlsKey,
    ReplicaTlsName,
    ReplBacklog,
}

/// One entry of the option table: the option, its short letter, its long name (empty:
/// none) and its value.
struct OptSpec {
    opt: Opt,
    short: Option<u8>,
    long: &'static str,
    arg: HasArg,
}

const fn spec(opt: Opt, short: u8, long: &'static str, arg: HasArg) -> OptSpec {
    OptSpec {
        opt,
        short: Some(short),
        long,
        arg,
    }
}

/// A kvcached option with no short letter.
const fn long(opt: Opt, long: &'static str, arg: HasArg) -> OptSpec {
    OptSpec {
        opt,
        short: None,
        long,
        arg,
    }
}

/// memcached 1.6's options (its getopt string and long-option table), in its order, then
/// kvcached's own.
const OPTIONS: &[OptSpec] = &[
    spec(Opt::UnixMask, b'a', "unix-mask", HasArg::Required),
    spec(Opt::EnableShutdown, b'A', "enable-shutdown", HasArg::No),
    spec(Opt::EnableSsl, b'Z', "enable-ssl", HasArg::No),
    spec(Opt::Port, b'p', "port", HasArg::Required),
    spec(Opt::UnixSocket, b's', "unix-socket", HasArg::Path),
    spec(Opt::UdpPort, b'U', "udp-port", HasArg::Required),
    spec(Opt::MemoryLimit, b'm', "memory-limit", HasArg::Required),
    spec(Opt::DisableEvictions, b'M', "disable-evictions", HasArg::No),
    spec(Opt::ConnLimit, b'c', "conn-limit", HasArg::Required),
    spec(Opt::LockMemory, b'k', "lock-memory", HasArg::No),
    spec(Opt::Help, b'h', "help", HasArg::No),
    spec(Opt::License, b'i', "license", HasArg::No),
    spec(Opt::Version, b'V', "version", HasArg::No),
    spec(Opt::EnableCoredumps, b'r', "enable-coredumps", HasArg::No),
    spec(Opt::Verbose, b'v', "verbose", HasArg::Optional),
    spec(Opt::Daemon, b'd', "daemon", HasArg::No),
    spec(Opt::Listen, b'l', "listen", HasArg::Required),
    spec(Opt::User, b'u', "user", HasArg::Required),
    spec(Opt::PidFile, b'P', "pidfile", HasArg::Path),
    spec(
        Opt::SlabGrowthFactor,
        b'f',
        "slab-growth-factor",
        HasArg::Required,
    ),
    spec(Opt::SlabMinSize, b'n', "slab-min-size", HasArg::Required),
    spec(Opt::Threads, b't', "threads", HasArg::Required),
    spec(Opt::PrefixDelimiter, b'D', "", HasArg::Required),
    spec(Opt::EnableLargepages, b'L', "enable-largepages", HasArg::No),
    spec(
        Opt::MaxReqsPerEvent,
        b'R',
        "max-reqs-per-event",
        HasArg::Required,
    ),
    spec(Opt::DisableCas, b'C', "disable-cas", HasArg::No),
    spec(Opt::ListenBacklog, b'b', "listen-backlog", HasArg::Required),
    spec(Opt::Protocol, b'B', "protocol", HasArg::Required),
    spec(Opt::MaxItemSize, b'I', "max-item-size", HasArg::Required),
    spec(Opt::EnableSasl, b'S', "enable-sasl", HasArg::No),
    spec(Opt::DisableFlushAll, b'F', "disable-flush-all", HasArg::No),
    spec(Opt::DisableDumping, b'X', "disable-dumping", HasArg::No),
    spec(Opt::DisableWatch, b'W', "disable-watch", HasArg::No),
    spec(Opt::AuthFile, b'Y', "auth-file", HasArg::Path),
    spec(Opt::MemoryFile, b'e', "memory-file", HasArg::Path),
    spec(Opt::Extended, b'o', "extended", HasArg::Required),
    spec(Opt::NapiIds, b'N', "napi-ids", HasArg::Required),
    // kvcached's own (no short letter).
    long(Opt::ReplicaOf, "replica-of", HasArg::Required),
    long(Opt::ReplicaAuth, "replica-auth", HasArg::Required),
    long(Opt::MinReplicas, "min-replicas", HasArg::Required),
    long(
        Opt::MinReplicasMaxLag,
        "min-replicas-max-lag",
        HasArg::Required,
    ),
    long(
        Opt::ReplicaServeStale,
        "replica-serve-stale",
        HasArg::Required,
    ),
    long(Opt::ReplicaAuthMech, "replica-auth-mech", HasArg::Required),
    long(Opt::ReplicaTls, "replica-tls", HasArg::No),
    long(Opt::ReplicaTlsCa, "replica-tls-ca", HasArg::Required),
    long(Opt::ReplicaTlsCert, "replica-tls-cert", HasArg::Required),
    long(Opt::ReplicaTlsKey, "replica-tls-key", HasArg::Required),
    long(Opt::ReplicaTlsName, "replica-tls-name", HasArg::Required),
    long(Opt::ReplBacklog, "repl-backlog", HasArg::Required),
];

/// The configuration being built, and what memcached's later checks need to know.
pub(super) struct Builder {
    cfg: Config,
    notes: Vec<String>,
    tcp_specified: bool,
    udp_specified: bool,
    protocol_specified: bool,
    /// The first `-l` replaces the default listener; later ones add to it.
    listen_given: bool,
    /// `-N`.
    napi_ids: Option<u32>,
    /// `-n` (memcached's default 48): the smallest `slab_sizes` entry.
    slab_min_size: u32,
    /// `-o slab_chunk_max`, in bytes, when given.
    slab_chunk_max: Option<usize>,
    /// `-o slab_sizes`, checked at the end against `-n` and `slab_chunk_max`.
    slab_sizes: Option<String>,
    /// `-f` (memcached's default 1.25).
    slab_growth_factor: f64,
    hot_lru_pct: u32,
    warm_lru_pct: u32,
    temporary_ttl: bool,
    /// `-o ext_path` files and sizes, in the order given.
    ext_files: Vec<(std::path::PathBuf, u64)>,
    /// `-o ext_wbuf_size`, in bytes (memcached's default 4 MiB).
    ext_wbuf_size: u64,
    /// `-o ext_threads` (memcached's default 1).
    ext_threads: usize,
    /// `-o ext_ignore_bad_file` (kvcached's own).
    ext_ignore_bad_file: bool,
    /// `-o ext_recache_rate` (memcached's default 2000).
    ext_recache_rate: u32,
    /// `-o ext_item_size` (kvcached's default 0; memcached's 512).
    ext_item_size: u32,
    /// `-o ext_direct` (kvcached's own).
    ext_direct: bool,
    /// `-o ext_compact_under` (0: kvcached's own margin; memcached's 0 is 1% of pages).
    ext_compact_under: u32,
    /// `-o ext_drop_unread`.
    ext_drop_unread: bool,
    /// `-o ext_max_frag`, in thousandths (kvcached's default 1000, any page; memcached's
    /// 0.80).
    ext_max_frag: u32,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            cfg: Config::default(),
            notes: Vec::new(),
            tcp_specified: false,
            udp_specified: false,
            protocol_specified: false,
            listen_given: false,
            napi_ids: None,
            slab_min_size: 48,
            slab_chunk_max: None,
            slab_sizes: None,
            slab_growth_factor: 1.25,
            hot_lru_pct: 20,
            warm_lru_pct: 40,
            temporary_ttl: false,
            ext_files: Vec::new(),
            ext_wbuf_size: 4 << 20,
            ext_threads: 1,
            ext_ignore_bad_file: false,
            ext_recache_rate: 2000,
            ext_item_size: 0,
            ext_direct: false,
            ext_compact_under: 0,
            ext_drop_unread: false,
            ext_max_frag: 1000,
        }
    }

    pub(super) fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// An option that sizes memcached's slabs: kvcached has none, but the option still
    /// sets the size classes its stats report.
    pub(super) fn classes_only(&mut self, what: &str) {
        self.note(format!(
            "memcached option {what}: kvcached has no slabs; it sets only the size classes \
             that stats items and stats slabs report"
        ));
    }

    pub(super) fn ignored(&mut self, what: &str) {
        self.note(format!(
            "ignoring memcached option {what}: no meaning in kvcached"
        ));
    }

    /// Apply one option. `Ok(Some(action))` ends parsing (`-h`, `-i`, `-V`).
    fn apply(&mut self, opt: &RawOpt) -> Result<Option<Action>, String> {
        let sp = opt.spelling.as_str();
        // The value as text (options whose value is a path use `opt.value` directly).
        let value = match &opt.value {
            Some(v) if opt.arg != HasArg::Path => text(sp, v)?,
            _ => "",
        };
        let path = || -> Result<PathBuf, String> {
            match &opt.value {
                Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
                _ => Err(format!("option {sp} needs a file name")),
            }
        };
        match opt.opt {
            Opt::UnixMask => {
                let ok = !value.is_empty() && value.bytes().all(|b| (b'0'..=b'7').contains(&b));
                match u32::from_str_radix(value, 8) {
                    Ok(mask) if ok && mask <= 0o777 => self.cfg.unix_mask = mask,
                    _ => return Err(bad(sp, value, "octal permission bits such as 0700")),
                }
            }
            Opt::EnableShutdown => self.cfg.enable_shutdown = true,
            Opt::EnableSsl => self.cfg.ssl.enabled = true,
            Opt::Port => {
                self.cfg.tcp_port = port(sp, value, "TCP")?;
                self.tcp_specified = true;
            }
            Opt::UnixSocket => self.cfg.unix_socket = Some(path()?),
            Opt::UdpPort => {
                self.cfg.udp_port = port(sp, value, "UDP")?;
                self.udp_specified = true;
            }
            Opt::MemoryLimit => self.cfg.memory_limit = memory_limit(sp, value)?,
            Opt::DisableEvictions => self.cfg.no_evict = true,
            Opt::ConnLimit => {
                self.cfg.max_connections = int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as usize,
                    "a number of connections greater than 0",
                )?
            }
            Opt::LockMemory => self.cfg.lock_memory = true,
            Opt::Help => return Ok(Some(Action::Help(help_text()))),
            Opt::License => return Ok(Some(Action::Help(license_text()))),
            Opt::Version => return Ok(Some(Action::Version)),
            Opt::EnableCoredumps => self.cfg.max_core_file = true,
            Opt::Verbose => self.cfg.verbose = self.cfg.verbose.saturating_add(1),
            Opt::Daemon => self.cfg.daemonize = true,
            Opt::Listen => {
                let auth_file = self.cfg.auth_file.is_some();
                let entries: Vec<&str> = value
                    .split([',', ';'])
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .collect();
                if entries.is_empty() {
                    return Err(format!(
                        "option {sp} needs an address (use * for every interface)"
                    ));
                }
                if !self.listen_given {
                    self.listen_given = true;
                    self.cfg.listen.clear();
                    self.cfg.listeners.clear();
                }
                for entry in entries {
                    let parsed = listen_entry(entry, auth_file)?;
                    if !self.cfg.listen.iter().any(|l| l == entry) {
                        self.cfg.listen.push(entry.to_string());
                        self.cfg.listeners.push(parsed);
                    }
                }
            }
            Opt::User => {
                if value.is_empty() {
                    return Err(format!("option {sp} needs a user name"));
                }
                self.cfg.user = Some(value.to_string());
            }
            Opt::PidFile => self.cfg.pid_file = Some(path()?),
            Opt::SlabGrowthFactor => {
                let f = float(sp, value, "a growth factor greater than 1")?;
                if f <= 1.0 {
                    return Err(bad(sp, value, "a growth factor greater than 1"));
                }
                self.slab_growth_factor = f;
                self.classes_only(sp);
            }
            Opt::SlabMinSize => {
                self.slab_min_size = int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as u32,
                    "a size in bytes greater than 0",
                )?;
                self.classes_only(sp);
            }
            Opt::Threads => {
                let n: usize = int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as usize,
                    "a number of threads greater than 0",
                )?;
                self.cfg.threads = n;
                if n > THREADS_WARN {
                    self.note(format!(
                        "warning: {n} worker threads is a lot; more threads than cores \
                         (or more than {THREADS_WARN}) is not recommended"
                    ));
                }
            }
            Opt::PrefixDelimiter => {
                // memcached takes the first byte and switches prefix stats on.
                let Some(&d) = value.as_bytes().first() else {
                    return Err(format!("option {sp} needs a delimiter character"));
                };
                self.cfg.prefix_delimiter = d;
                self.cfg.detail_enabled = true;
            }
            Opt::EnableLargepages => self.ignored(sp),
            Opt::MaxReqsPerEvent => {
                self.cfg.reqs_per_event = int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as usize,
                    "a number of requests greater than 0",
                )?
            }
            Opt::DisableCas => self.cfg.use_cas = false,
            Opt::ListenBacklog => self.cfg.backlog = int(sp, value, "a backlog length 0 or more")?,
            Opt::Protocol => {
                self.cfg.protocol = match value {
                    "auto" => ProtocolChoice::Auto,
                    "ascii" => ProtocolChoice::Ascii,
                    "binary" => ProtocolChoice::Binary,
                    _ => return Err(bad(sp, value, "auto, ascii or binary")),
                };
                self.protocol_specified = true;
            }
            Opt::MaxItemSize => self.cfg.item_size_max = item_size(sp, value)?,
            Opt::EnableSasl => self.cfg.sasl = true,
            Opt::DisableFlushAll => self.cfg.flush_enabled = false,
            Opt::DisableDumping => self.cfg.dump_enabled = false,
            Opt::DisableWatch => self.cfg.watch_enabled = false,
            Opt::AuthFile => self.cfg.auth_file = Some(path()?),
            Opt::MemoryFile => self.cfg.memory_file = Some(path()?),
            Opt::ReplicaOf => {
                let ok = value
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
                if !ok {
                    return Err(bad(sp, value, "HOST:PORT of the master"));
                }
                self.cfg.replica_of = Some(value.to_string());
            }
            Opt::ReplicaAuth => self.cfg.replica_auth = Some(path()?),
            Opt::ReplicaTls => {
                self.cfg.replica_tls.get_or_insert_with(Default::default);
            }
            Opt::ReplicaTlsCa => {
                self.cfg.replica_tls.get_or_insert_with(Default::default).ca = Some(path()?)
            }
            Opt::ReplicaTlsCert => {
                self.cfg
                    .replica_tls
                    .get_or_insert_with(Default::default)
                    .cert = Some(path()?)
            }
            Opt::ReplicaTlsKey => {
                self.cfg
                    .replica_tls
                    .get_or_insert_with(Default::default)
                    .key = Some(path()?)
            }
            Opt::ReplicaTlsName => {
                if value.is_empty() {
                    return Err(bad(sp, value, "the name in the master's certificate"));
                }
                self.cfg
                    .replica_tls
                    .get_or_insert_with(Default::default)
                    .server_name = Some(value.to_string())
            }
            Opt::MinReplicas => {
                self.cfg.min_replicas = int_in(sp, value, 0, 1000, "a number of replicas 0-1000")?
            }
            Opt::ReplicaAuthMech => {
                self.cfg.replica_auth_sasl = match value {
                    "ascii" => false,
                    "sasl" => true,
                    _ => return Err(bad(sp, value, "ascii or sasl")),
                }
            }
            Opt::ReplicaServeStale => {
                self.cfg.replica_serve_stale = match value {
                    "yes" => true,
                    "no" => false,
                    _ => return Err(bad(sp, value, "yes or no")),
                }
            }
            Opt::ReplBacklog => {
                let mb: usize = int_in(sp, value, 1, 1 << 24, "a number of megabytes 1-16777216")?;
                self.cfg.repl_backlog = mb << 20;
            }
            Opt::MinReplicasMaxLag => {
                let secs: u64 = int_in(sp, value, 1, 86_400, "a number of seconds 1-86400")?;
                self.cfg.min_replicas_max_lag = Duration::from_secs(secs);
            }
            Opt::NapiIds => {
                self.napi_ids = Some(int_in(
                    sp,
                    value,
                    1,
                    i32::MAX as u32,
                    "a number of NAPI ids greater than 0",
                )?);
                self.ignored(sp);
            }
            Opt::Extended => self.suboptions(value)?,
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests;
