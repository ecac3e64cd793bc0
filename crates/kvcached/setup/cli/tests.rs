use super::getopt::short_spec;
use super::*;
use crate::setup::config::{ListenAddr, ListenTls, MemoryLimit};
use std::path::Path;

fn parse_strs(args: &[&str]) -> Result<Action, String> {
    parse(args.iter().map(OsString::from))
}

fn run(args: &[&str]) -> Result<(Config, Vec<String>), String> {
    match parse_strs(args)? {
        Action::Run { config, notes } => Ok((*config, notes)),
        other => panic!("{args:?}: expected Run, got {other:?}"),
    }
}

fn cfg(args: &[&str]) -> Config {
    run(args)
        .unwrap_or_else(|e| panic!("{args:?} rejected: {e}"))
        .0
}

type Check = fn(&Config) -> bool;

#[test]
fn no_arguments_give_the_defaults() {
    let (c, notes) = run(&[]).unwrap();
    assert_eq!(c, Config::default());
    assert!(notes.is_empty());
    assert_eq!(c.listen, vec!["127.0.0.1"]);
    assert_eq!(c.listeners, vec![ListenAddr::host("127.0.0.1")]);
}

#[test]
fn accepted_command_lines() {
    let mb = |n: usize| MemoryLimit::Fixed(n << 20);
    let rows: &[(&[&str], Check)] = &[
        // -p: separate, attached, long with = and with a separate value, prefix.
        (&["-p", "11212"], |c| c.tcp_port == 11212),
        (&["-o", "engine=log"], |c| *c == Config::default()),
        (&["-p11212"], |c| c.tcp_port == 11212),
        (&["--port=11212"], |c| c.tcp_port == 11212),
        (&["--port", "11212"], |c| c.tcp_port == 11212),
        (&["--po=11212"], |c| c.tcp_port == 11212),
        (&["-p", " 11212"], |c| c.tcp_port == 11212),
        (&["-p", "+11212"], |c| c.tcp_port == 11212),
        (&["-p", "0"], |c| c.tcp_port == 0),
        (&["-p", "65535"], |c| c.tcp_port == 65535),
        (&["-p", "1", "-p", "2"], |c| c.tcp_port == 2),
        // kvcached's eviction size factor.
        (&["-o", "evict_size_factor=0"], |c| c.evict_size_factor == 0),
        (&["-o", "evict_size_factor=64"], |c| {
            c.evict_size_factor == 64
        }),
        (&[], |c| c.evict_size_factor == 4),
        // io_uring's submission-queue polling thread, with its idle time.
        (&["-o", "io_sqpoll"], |c| c.io_sqpoll == Some(10)),
        (&["-o", "io_sqpoll=250"], |c| c.io_sqpoll == Some(250)),
        (&["-o", "io_sqpoll_cpus=2:4-6"], |c| {
            c.io_sqpoll == Some(10) && c.io_sqpoll_cpus == [2, 4, 5, 6]
        }),
        (&["-o", "io_sqpoll=250,io_sqpoll_cpus=1"], |c| {
            c.io_sqpoll == Some(250) && c.io_sqpoll_cpus == [1]
        }),
        // -U, and -U alone moving the TCP port too.
        (&["-U", "11300"], |c| {
            c.udp_port == 11300 && c.tcp_port == 11300
        }),
        (&["-U", "11300", "-p", "11211"], |c| {
            c.udp_port == 11300 && c.tcp_port == 11211
        }),
        (&["-p", "11211", "-U", "11300"], |c| {
            c.udp_port == 11300 && c.tcp_port == 11211
        }),
        (&["-U", "0"], |c| c.udp_port == 0 && c.tcp_port == 11211),
        (&["--udp-port=5"], |c| c.udp_port == 5),
        // -1: a port the kernel picks, kept as -1 (stats settings shows it), and moved to
        // TCP by -U alone as memcached moves it.
        (&["-p", "-1"], |c| c.tcp_port == -1 && c.udp_port == 0),
        (&["-U", "-1"], |c| c.tcp_port == -1 && c.udp_port == -1),
        (&["-p", "0", "-U", "-1"], |c| {
            c.tcp_port == 0 && c.udp_port == -1
        }),
        (&["-p", "11212", "-U", "-1"], |c| {
            c.tcp_port == 11212 && c.udp_port == -1
        }),
        (&["-l", "127.0.0.1:0"], |c| c.listeners[0].port == Some(0)),
        (&["-l", "127.0.0.1:-1"], |c| c.listeners[0].port == Some(0)),
        // -s, -a.
        (&["-s", "/tmp/k.sock"], |c| {
            c.unix_socket.as_deref() == Some(std::path::Path::new("/tmp/k.sock"))
        }),
        (&["--unix-socket=/tmp/k.sock", "-a", "0755"], |c| {
            c.unix_socket.is_some() && c.unix_mask == 0o755
        }),
        (&["-a", "700"], |c| c.unix_mask == 0o700),
        (&["-a0"], |c| c.unix_mask == 0),
        (&["--unix-mask", "777"], |c| c.unix_mask == 0o777),
        // -A -M -C -F -X -W -k -r -d -S.
        (&["-A"], |c| c.enable_shutdown),
        (&["--enable-shutdown"], |c| c.enable_shutdown),
        (&["-M"], |c| c.no_evict),
        (&["--disable-evictions"], |c| c.no_evict),
        (&["-C"], |c| !c.use_cas),
        (&["--disable-cas"], |c| !c.use_cas),
        (&["-F"], |c| !c.flush_enabled),
        (&["--disable-flush-all"], |c| !c.flush_enabled),
        (&["-X"], |c| !c.dump_enabled),
        (&["--disable-dumping"], |c| !c.dump_enabled),
        (&["-W"], |c| !c.watch_enabled),
        (&["--disable-watch"], |c| !c.watch_enabled),
        (&["-k"], |c| c.lock_memory),
        (&["--lock-memory"], |c| c.lock_memory),
        (&["-r"], |c| c.max_core_file),
        (&["--enable-coredumps"], |c| c.max_core_file),
        (&["-d"], |c| c.daemonize),
        (&["--daemon"], |c| c.daemonize),
        (&["-S"], |c| c.sasl && c.protocol == ProtocolChoice::Binary),
        (&["-S", "-B", "binary"], |c| c.sasl),
        (&["--enable-sasl"], |c| c.sasl),
        // Bundles.
        (&["-dv"], |c| c.daemonize && c.verbose == 1),
        (&["-vd"], |c| c.daemonize && c.verbose == 1),
        (&["-vv"], |c| c.verbose == 2),
        (&["-vvv"], |c| c.verbose == 3),
        (&["-v", "-v"], |c| c.verbose == 2),
        (&["-vvp11212"], |c| c.verbose == 2 && c.tcp_port == 11212),
        (&["-vp", "11212"], |c| c.verbose == 1 && c.tcp_port == 11212),
        (&["-dP/run/k.pid"], |c| {
            c.daemonize && c.pid_file.as_deref() == Some(std::path::Path::new("/run/k.pid"))
        }),
        (&["-MCAFk"], |c| {
            c.no_evict && !c.use_cas && c.enable_shutdown && !c.flush_enabled && c.lock_memory
        }),
        (&["--verbose"], |c| c.verbose == 1),
        (&["--verbose=2"], |c| c.verbose == 1),
        (&["--verbose", "--verb"], |c| c.verbose == 2),
        // -m.
        (&["-m", "128"], |c| {
            c.memory_limit == MemoryLimit::Fixed(128 << 20)
        }),
        (&["-m128"], |c| {
            c.memory_limit == MemoryLimit::Fixed(128 << 20)
        }),
        (&["-m", "128m"], |c| {
            c.memory_limit == MemoryLimit::Fixed(128 << 20)
        }),
        (&["-m", "128M"], |c| {
            c.memory_limit == MemoryLimit::Fixed(128 << 20)
        }),
        (&["--memory-limit=4096"], |c| {
            c.memory_limit == MemoryLimit::Fixed(4096 << 20)
        }),
        (&["-m", "auto"], |c| c.memory_limit == MemoryLimit::Auto),
        (&["-m", "auto", "-I", "1g"], |c| c.item_size_max == 1 << 30),
        (&["-m", "2"], |c| {
            c.memory_limit == MemoryLimit::Fixed(2 << 20)
        }),
        // -I: bytes and suffixes; at most half of -m; 1k to 1g.
        (&["-I", "2m"], |c| c.item_size_max == 2 << 20),
        (&["-I", "2M"], |c| c.item_size_max == 2 << 20),
        (&["-I2m"], |c| c.item_size_max == 2 << 20),
        (&["-I", "512k"], |c| c.item_size_max == 512 << 10),
        (&["-I", "512K"], |c| c.item_size_max == 512 << 10),
        (&["-I", "1k"], |c| c.item_size_max == 1024),
        (&["-I", "1024"], |c| c.item_size_max == 1024),
        (&["-I", "5000"], |c| c.item_size_max == 5000),
        (&["--max-item-size=32m"], |c| c.item_size_max == 32 << 20),
        (&["-I", "1g", "-m", "2048"], |c| c.item_size_max == 1 << 30),
        (&["-I", "1G", "-m", "2048"], |c| c.item_size_max == 1 << 30),
        (&["-I", "1024m", "-m", "2048"], |c| {
            c.item_size_max == 1 << 30
        }),
        (&["-m", "2", "-I", "1m"], |c| c.item_size_max == 1 << 20),
        (&["-m", "1", "-I", "512k"], |c| c.item_size_max == 512 << 10),
        // -c -t -R -b -B.
        (&["-c", "4096"], |c| c.max_connections == 4096),
        (&["--conn-limit=1"], |c| c.max_connections == 1),
        (&["-t", "1"], |c| c.threads == 1),
        (&["-t", "64"], |c| c.threads == 64),
        (&["--threads", "8"], |c| c.threads == 8),
        (&["-R", "5"], |c| c.reqs_per_event == 5),
        (&["--max-reqs-per-event=100"], |c| c.reqs_per_event == 100),
        (&["-b", "0"], |c| c.backlog == 0),
        (&["-b", "4096"], |c| c.backlog == 4096),
        (&["--listen-backlog=16"], |c| c.backlog == 16),
        (&["-B", "ascii"], |c| c.protocol == ProtocolChoice::Ascii),
        (&["-B", "binary"], |c| c.protocol == ProtocolChoice::Binary),
        (&["-B", "auto"], |c| c.protocol == ProtocolChoice::Auto),
        (&["--protocol=ascii"], |c| {
            c.protocol == ProtocolChoice::Ascii
        }),
        // -u -P -Y -e.
        (&["-u", "memcache"], |c| {
            c.user.as_deref() == Some("memcache")
        }),
        (&["--user=nobody"], |c| c.user.as_deref() == Some("nobody")),
        (&["-unobody"], |c| c.user.as_deref() == Some("nobody")),
        (&["-P", "/run/k.pid"], |c| c.pid_file.is_some()),
        (&["--pidfile=/run/k.pid"], |c| c.pid_file.is_some()),
        (&["-Y", "/etc/kv.auth"], |c| {
            c.auth_file.is_some() && c.protocol == ProtocolChoice::Ascii
        }),
        (&["-Y", "/etc/kv.auth", "-B", "ascii"], |c| {
            c.auth_file.is_some()
        }),
        (&["--auth-file=/etc/kv.auth"], |c| c.auth_file.is_some()),
        // -S with -Y: ASCII with the -Y file, as memcached ends up.
        (&["-S", "-Y", "/etc/kv.auth"], |c| {
            c.sasl && c.auth_file.is_some() && c.protocol == ProtocolChoice::Ascii
        }),
        (&["-Y", "/etc/kv.auth", "-S"], |c| {
            c.sasl && c.auth_file.is_some() && c.protocol == ProtocolChoice::Ascii
        }),
        (&["-e", "/dev/shm/kv"], |c| {
            c.memory_file.as_deref() == Some(std::path::Path::new("/dev/shm/kv"))
        }),
        (&["--memory-file=/dev/shm/kv"], |c| c.memory_file.is_some()),
        (&["-e", "/x", "-o", "warm_restart_ignore_bad_file"], |c| {
            c.warm_ignore_bad_file
        }),
        (&["-e", "/x"], |c| !c.warm_ignore_bad_file),
        // -o: implemented ones, lists, repeats, trailing comma, empty list.
        (&["-o", "idle_timeout=30"], |c| {
            c.idle_timeout == Some(Duration::from_secs(30))
        }),
        (&["-o", "idle_timeout=0"], |c| c.idle_timeout.is_none()),
        (&["-oidle_timeout=7"], |c| {
            c.idle_timeout == Some(Duration::from_secs(7))
        }),
        (&["--extended=idle_timeout=7"], |c| {
            c.idle_timeout == Some(Duration::from_secs(7))
        }),
        (&["--extended", "idle_timeout=7,debug_clock"], |c| {
            c.idle_timeout == Some(Duration::from_secs(7)) && c.debug_clock
        }),
        (&["-o", "debug_clock"], |c| c.debug_clock),
        (&["-o", "no_maxconns_fast"], |c| !c.maxconns_fast),
        (&["-o", "no_maxconns_fast,maxconns_fast"], |c| {
            c.maxconns_fast
        }),
        (&["-o", "no_maxconns_fast", "-o", "maxconns_fast"], |c| {
            c.maxconns_fast
        }),
        (&["-o", "modern,"], |c| c.maxconns_fast),
        (&["-o", ""], |c| c.maxconns_fast),
        (&["-o", " modern"], |c| c.maxconns_fast),
        (&["-o", "modern=1"], |c| c.maxconns_fast),
        (&["-o", "hashpower=12", "-o", "hashpower=32"], |c| {
            c.maxconns_fast
        }),
        (&["-o", "hot_lru_pct=40,warm_lru_pct=40"], |c| {
            c.maxconns_fast
        }),
        (&["-o", "slab_chunk_max=16", "-I", "1m"], |c| {
            c.item_size_max == 1 << 20
        }),
        (&["-o", "slab_sizes=100-200-300"], |c| c.maxconns_fast),
        (&["-o", "temporary_ttl=10"], |c| c.maxconns_fast),
        (&["-o", "lru_maintainer,temporary_ttl=10"], |c| {
            c.maxconns_fast
        }),
        (
            &["-o", "ext_path=/mnt/ext:64g,ext_wbuf_size=8", "-I", "8m"],
            |c| c.item_size_max == 8 << 20,
        ),
        (&["-o", "ext_path=/mnt/ext:1T:compact"], |c| c.maxconns_fast),
        // -l: lists, repeats, ports, IPv6, wildcards, prefixes.
        (&["-l", "0.0.0.0"], |c| {
            c.listen == ["0.0.0.0"] && c.listeners == [ListenAddr::host("0.0.0.0")]
        }),
        (&["-l", "127.0.0.1,::1"], |c| {
            c.listen == ["127.0.0.1", "::1"] && c.listeners[1] == ListenAddr::host("::1")
        }),
        (&["-l", "127.0.0.1", "-l", "::1"], |c| {
            c.listen == ["127.0.0.1", "::1"]
        }),
        (&["-l", "10.0.0.1;10.0.0.2"], |c| {
            c.listen == ["10.0.0.1", "10.0.0.2"]
        }),
        (&["-l", "10.0.0.1,,10.0.0.2,"], |c| c.listen.len() == 2),
        (&["-l", "10.0.0.1", "-l", "10.0.0.1"], |c| {
            c.listen == ["10.0.0.1"]
        }),
        (&["-l10.0.0.1"], |c| c.listen == ["10.0.0.1"]),
        (&["--listen=10.0.0.1"], |c| c.listen == ["10.0.0.1"]),
        (&["-l", "127.0.0.1:11300"], |c| {
            c.listeners[0].host.as_deref() == Some("127.0.0.1")
                && c.listeners[0].port == Some(11300)
        }),
        (&["-l", "[::1]:11300"], |c| {
            c.listeners[0].host.as_deref() == Some("::1") && c.listeners[0].port == Some(11300)
        }),
        (&["-l", "[::1]"], |c| {
            c.listeners[0] == ListenAddr::host("::1")
        }),
        (&["-l", "fe80::1:2"], |c| {
            c.listeners[0] == ListenAddr::host("fe80::1:2")
        }),
        (&["-l", "*"], |c| c.listeners[0].host.is_none()),
        (&["-l", "*:11300"], |c| {
            c.listeners[0].host.is_none() && c.listeners[0].port == Some(11300)
        }),
        (&["-l", "localhost"], |c| {
            c.listeners[0] == ListenAddr::host("localhost")
        }),
        (&["-l", "proto[ascii]:127.0.0.1:11300"], |c| {
            c.listeners[0].protocol == Some(ProtocolChoice::Ascii)
                && c.listeners[0].port == Some(11300)
        }),
        (
            &[
                "-l",
                "proto[binary]:tag[svc]:127.0.0.1:1,proto[negotiating]:tag_tools_:[::1]:2",
            ],
            |c| {
                let (a, b) = (&c.listeners[0], &c.listeners[1]);
                a.protocol == Some(ProtocolChoice::Binary)
                    && a.tag.as_deref() == Some("svc")
                    && a.port == Some(1)
                    && b.protocol == Some(ProtocolChoice::Auto)
                    && b.tag.as_deref() == Some("tools")
                    && b.host.as_deref() == Some("::1")
                    && b.port == Some(2)
            },
        ),
        (&["-Y", "/a", "-l", "proto[negotiating]:127.0.0.1"], |c| {
            c.listeners[0].protocol == Some(ProtocolChoice::Ascii)
        }),
        // Options permuted past operands, and "--".
        (&["extra", "-p", "5"], |c| c.tcp_port == 5),
        (&["-p", "5", "--", "-p", "6"], |c| c.tcp_port == 5),
        (&["-"], |c| c.tcp_port == 11211),
        // A value that looks like an option is still the value.
        (&["-u", "-p"], |c| c.user.as_deref() == Some("-p")),
        (&["--user", "--port"], |c| {
            c.user.as_deref() == Some("--port")
        }),
    ];
    let _ = mb;
    for (args, check) in rows {
        let c = cfg(args);
        assert!(check(&c), "{args:?} gave {c:#?}");
    }
}

#[test]
fn rejected_command_lines() {
    let rows: &[(&[&str], &str)] = &[
        // getopt errors.
        (&["-Q"], "unknown option '-Q'"),
        (&["-vQ"], "unknown option '-Q'"),
        (&["--bogus"], "unknown option '--bogus'"),
        (&["--napi_ids=1"], "unknown option"),
        (&["--mem=1"], "ambiguous"),
        (&["--dis"], "ambiguous"),
        (&["--ver"], "ambiguous"),
        (&["--daemon=1"], "does not take a value"),
        (&["--port"], "--port needs a value"),
        // The retired engine is named as such; an unknown one as unknown.
        (&["-o", "engine=hashmap"], "that engine was retired"),
        (&["-o", "engine=btree"], "unknown engine"),
        (&["-o", "io_sqpoll=0"], "1 to 60000"),
        (&["-o", "io_sqpoll=60001"], "1 to 60000"),
        (&["-o", "io_sqpoll_cpus=3-1"], "CPU numbers or ranges"),
        (&["-o", "io_sqpoll_cpus=4096"], "CPU numbers or ranges"),
        (&["-o", "io_sqpoll_cpus=0-4095"], "CPU numbers or ranges"),
        (&["-o", "io_sqpoll_cpus=a"], "CPU numbers or ranges"),
        (&["-p"], "-p needs a value"),
        (&["-vp"], "-p needs a value"),
        // Numbers.
        (&["-p", "abc"], "for -p"),
        (&["-p", ""], "for -p"),
        (&["-p", "70000"], "0-65535"),
        (&["-p", "-2"], "-1 lets the kernel pick one"),
        (&["-U", "-2"], "0 turns UDP off"),
        (&["-p", "12abc"], "for -p"),
        (&["--port=x"], "for --port"),
        (&["-U", "65536"], "for -U"),
        (&["-c", "0"], "greater than 0"),
        (&["-c", "abc"], "greater than 0"),
        (&["-c", "-5"], "greater than 0"),
        (&["-t", "0"], "greater than 0"),
        (&["-t", "abc"], "greater than 0"),
        (&["--threads=0"], "--threads"),
        (&["-R", "0"], "greater than 0"),
        (&["-b", "abc"], "backlog"),
        (&["-b", "-1"], "backlog"),
        (&["-a", "999"], "octal"),
        (&["-a", "abc"], "octal"),
        (&["-a", "1777"], "octal"),
        (&["-B", "foo"], "auto, ascii or binary"),
        (&["-B", "ASCII"], "auto, ascii or binary"),
        // -m and -I.
        (&["-m", "0"], "megabytes"),
        (&["-m", "abc"], "megabytes"),
        (&["-m", "-5"], "megabytes"),
        (&["-m", "1g"], "megabytes"),
        (&["-m", "64k"], "megabytes"),
        (&["-m", "99999999999999999999"], "for -m"),
        (&["-I", "1023"], "less than 1024"),
        (&["-I", "abc"], "size in bytes"),
        (&["-I", "1.5m"], "size in bytes"),
        (&["-I", "2t"], "size in bytes"),
        (&["-I", "k"], "size in bytes"),
        (&["-I", "5g"], "more than 1 gigabyte"),
        (&["-I", "2g", "-m", "auto"], "more than 1 gigabyte"),
        (&["-I", "1g"], "half the memory limit"),
        (&["-m", "1", "-I", "1m"], "half the memory limit"),
        (&["-I", "33m"], "half the memory limit"),
        // Flags that need something.
        (&["-D", ""], "delimiter"),
        (&["-u", ""], "user name"),
        (&["-s", ""], "file name"),
        (&["-P", ""], "file name"),
        (&["-l", ""], "needs an address"),
        (&["-l", ",,"], "needs an address"),
        (&["-f", "1.0"], "greater than 1"),
        (&["-f", "abc"], "greater than 1"),
        (&["-n", "0"], "greater than 0"),
        (&["-N", "0"], "greater than 0"),
        (&["-N", "3", "-t", "2"], "NAPI"),
        // -l entries.
        (&["-l", "127.0.0.1:abc"], "not a port"),
        (&["-l", "127.0.0.1:99999"], "not a port"),
        (&["-l", "127.0.0.1:-2"], "not a port"),
        (&["-l", "[::1"], "closing ]"),
        (&["-l", "[::1]x"], "after the ]"),
        (&["-l", ":11211"], "no host"),
        (&["-l", "notls:127.0.0.1"], "only when TLS is enabled"),
        (&["-l", "mtls:127.0.0.1"], "only when TLS is enabled"),
        (&["-l", "proto[foo]:127.0.0.1"], "unknown protocol"),
        (&["-l", "proto[proxy]:127.0.0.1"], "proxy"),
        (&["-l", "proto[ascii:127.0.0.1"], "closing ]"),
        (&["-l", "tag[toolongtag]:127.0.0.1"], "1 to 8"),
        (&["-l", "tag[]:127.0.0.1"], "1 to 8"),
        (&["-Y", "/a", "-l", "proto[binary]:127.0.0.1"], "-Y"),
        // TLS, proxy.
        (&["-Z"], "ssl_chain_cert"),
        (&["--enable-ssl"], "ssl_chain_cert"),
        (
            &["-Z", "-o", "ssl_chain_cert=/c", "-s", "/tmp/s"],
            "unix socket",
        ),
        (
            &["-Z", "-o", "ssl_chain_cert=/c", "-p", "0"],
            "without a TCP port",
        ),
        (&["-o", "ssl_min_version=1"], "TLS 1.2 and 1.3 only"),
        (&["-o", "ssl_min_version=4"], "0, 1, 2 or 3"),
        (&["-o", "ssl_keyformat=3"], "engines"),
        (
            &["-o", "ssl_kernel_tls"],
            "Kernel TLS offload is not available",
        ),
        (
            &["-o", "ssl_ciphers=RC4-MD5"],
            "Error setting the provided cipher(s)",
        ),
        (&["-o", "ssl_wbuf_size=0"], "KiB"),
        (&["-o", "proxy_config=/etc/proxy.lua"], "proxy"),
        // SASL and ASCII auth interplay.
        (&["-S", "-B", "ascii"], "SASL"),
        (&["-S", "-B", "auto"], "SASL"),
        (&["-S", "-U", "11211"], "UDP"),
        (&["-Y", "/a", "-B", "binary"], "-Y"),
        (&["-Y", "/a", "-U", "5"], "UDP"),
        (
            &["-S", "-Y", "/a", "-B", "binary"],
            "-Y: ASCII authentication needs -B ascii",
        ),
        (&["-S", "-Y", "/a", "-B", "ascii"], "-S: SASL"),
        (&["-S", "-Y", "/a", "-U", "5"], "-S: UDP"),
        // -o.
        (&["-o", "badopt"], "unknown -o suboption \"badopt\""),
        (&["-o", "MODERN"], "unknown -o suboption"),
        (&["-o", "modern,,hashpower=20"], "unknown -o suboption \"\""),
        (&["-o", ",modern"], "unknown -o suboption \"\""),
        (&["-o", "idle_timeout"], "needs a value"),
        (&["-o", "idle_timeout=abc"], "seconds"),
        (&["-o", "idle_timeout=-5"], "seconds"),
        (&["-o", "hashpower"], "needs a value"),
        (&["-o", "hashpower=5"], "12 to 32"),
        (&["-o", "hashpower=33"], "12 to 32"),
        (&["-o", "tail_repair_time=5"], "10 or more"),
        (&["-o", "hash_algorithm=md5"], "jenkins"),
        (&["-o", "slab_automove=3"], "0, 1 or 2"),
        (&["-o", "slab_automove_ratio=0"], "ratio"),
        (&["-o", "slab_automove_ratio=1.5"], "ratio"),
        (&["-o", "slab_automove_window=2"], "3 to 1800"),
        (&["-o", "slab_automove_window=1801"], "3 to 1800"),
        (&["-o", "lru_crawler_sleep=1000001"], "microseconds"),
        (&["-o", "lru_crawler_tocrawl=x"], "whole number"),
        (&["-o", "hot_lru_pct=0"], "1 to 79"),
        (&["-o", "warm_lru_pct=80"], "1 to 79"),
        (&["-o", "hot_lru_pct=50"], "cannot be more than 80"),
        (
            &["-o", "hot_lru_pct=41,warm_lru_pct=40"],
            "cannot be more than 80",
        ),
        (&["-o", "hot_max_factor=0"], "greater than 0"),
        (&["-o", "warm_max_factor=x"], "greater than 0"),
        (
            &["-o", "no_lru_maintainer,temporary_ttl=10"],
            "LRU maintainer",
        ),
        (&["-o", "temporary_ttl=10,no_modern"], "LRU maintainer"),
        (&["-o", "slab_chunk_max=0"], "1 to 1024"),
        (&["-o", "slab_chunk_max=x"], "1 to 1024"),
        (&["-o", "slab_chunk_max=2000"], "evenly"),
        (
            &["-o", "slab_chunk_max=1024", "-I", "512k"],
            "cannot be more than -I",
        ),
        (&["-o", "slab_chunk_max=3"], "evenly"),
        (&["-o", "slab_sizes"], "needs a value"),
        (&["-o", "slab_sizes=300-200"], "larger"),
        (&["-o", "slab_sizes=100-104"], "larger"),
        (&["-o", "slab_sizes=10"], "out of range"),
        (&["-o", "slab_sizes=a-b"], "slab_sizes"),
        (&["-o", "slab_sizes=-"], "list of sizes"),
        (&["-o", "watcher_logbuf_size=x"], "whole number"),
        (&["-o", "read_buf_mem_limit=-1"], "whole number"),
        (&["-o", "evict_size_factor=65"], "0 to 64"),
        (&["-o", "evict_size_factor"], "needs a value"),
        (&["-o", "ssl_verify_mode=4"], "0, 1, 2 or 3"),
        (&["-o", "ssl_key"], "needs a value"),
        (&["-o", "ext_path=/mnt/ext"], "no size"),
        (&["-o", "ext_path=/mnt/ext:64"], "suffix"),
        (&["-o", "ext_path=/mnt/ext:64g:nope"], "bucket"),
        (&["-o", "ext_threads=abc"], "number of threads"),
        (&["-o", "ext_threads=0"], "number of threads"),
        (
            &["-o", "ext_path=/mnt/a:1g,ext_path=/mnt/a:2g"],
            "given twice",
        ),
        (&["-o", "ext_path=/mnt/ext:1g", "-I", "8m"], "ext_wbuf_size"),
    ];
    for (args, want) in rows {
        match run(args) {
            Ok((c, _)) => panic!("{args:?} accepted: {c:#?}"),
            Err(e) => assert!(e.contains(want), "{args:?}: {e:?} lacks {want:?}"),
        }
    }
}

/// `-o ext_path` (repeatable) and the `ext_*` options that carry over make the flash
/// tier's settings.
#[test]
fn ext_path_configures_the_flash_tier() {
    let (c, notes) = run(&[
        "-o",
        "ext_path=/mnt/a:64m,ext_path=/mnt/b:2g:compact,ext_wbuf_size=8,ext_threads=3",
    ])
    .unwrap();
    let f = c.flash.expect("a flash tier");
    assert_eq!(
        f.files,
        vec![
            (std::path::PathBuf::from("/mnt/a"), 64 << 20),
            (std::path::PathBuf::from("/mnt/b"), 2 << 30),
        ]
    );
    assert_eq!((f.wbuf_size, f.threads), (8 << 20, 3));
    assert!(!f.ignore_bad_file);
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(f.recache_rate, 2000, "memcached's default");
    assert_eq!(f.item_size, 0, "small items go to flash too");
    assert!(!f.direct, "through the page cache, as memcached");
    assert_eq!(
        (f.compact_under, f.drop_unread, f.max_frag),
        (0, false, 1000)
    );
    let (c, notes) = run(&[
        "-o",
        "ext_path=/mnt/a:64m,ext_ignore_bad_file,ext_recache_rate=0,ext_direct,ext_item_size=512",
        "-o",
        "ext_compact_under=12,ext_drop_unread,ext_max_frag=0.8",
    ])
    .unwrap();
    let f = c.flash.expect("a flash tier");
    assert!(f.ignore_bad_file && f.direct);
    assert_eq!((f.recache_rate, f.item_size), (0, 512));
    assert_eq!(
        (f.compact_under, f.drop_unread, f.max_frag),
        (12, true, 800)
    );
    assert!(notes.is_empty(), "{notes:?}");
    let (c, _) = run(&[]).unwrap();
    assert!(c.flash.is_none());
    // memcached drops the warm restart with extstore (it starts empty); kvcached keeps both.
    let (c, notes) = run(&["-o", "ext_path=/mnt/a:64m", "-e", "/dev/shm/kv"]).unwrap();
    assert!(c.memory_file.is_some() && c.flash.is_some());
    assert!(notes.is_empty(), "{notes:?}");
    // memcached refuses UDP with extstore; kvcached serves flash items over UDP too.
    let (c, _) = run(&["-o", "ext_path=/mnt/a:64m", "-U", "5"]).unwrap();
    assert!(c.udp_port == 5 && c.flash.is_some());
}

#[test]
fn d_sets_the_prefix_delimiter_and_starts_detail_stats() {
    let (c, notes) = run(&["-D/"]).unwrap();
    assert_eq!((c.prefix_delimiter, c.detail_enabled), (b'/', true));
    assert!(notes.is_empty(), "{notes:?}");
    let (c, _) = run(&["-D", "::x"]).unwrap();
    assert_eq!(c.prefix_delimiter, b':', "the first byte, as memcached");
    let (c, _) = run(&[]).unwrap();
    assert_eq!((c.prefix_delimiter, c.detail_enabled), (b':', false));
}

#[test]
fn ignored_options_are_noted() {
    let rows: &[(&[&str], &str)] = &[
        (&["-f", "1.25"], "-f"),
        (&["--slab-growth-factor=1.08"], "--slab-growth-factor"),
        (&["-n", "48"], "-n"),
        (&["--slab-min-size", "96"], "--slab-min-size"),
        (&["-L"], "-L"),
        (&["--enable-largepages"], "--enable-largepages"),
        (&["-N", "1", "-t", "2"], "-N"),
        (&["--napi-ids=1", "-t", "2"], "--napi-ids"),
        (&["-o", "hashpower=20"], "-o hashpower"),
        (&["-o", "slab_reassign,slab_automove=1"], "-o slab_automove"),
        (&["-o", "modern"], "-o modern"),
        (&["-o", "relaxed_privileges"], "-o relaxed_privileges"),
        (&["-o", "resp_obj_mem_limit=5"], "deprecated"),
        (
            &["-o", "ext_path=/mnt/ext:64g,ext_item_age=64"],
            "-o ext_item_age",
        ),
        (
            &["-o", "ext_path=/mnt/ext:64g,ext_page_size=8"],
            "one segment",
        ),
        (&["-t", "65"], "not recommended"),
        (&["stray"], "ignoring extra argument 'stray'"),
    ];
    for (args, want) in rows {
        let (_, notes) = run(args).unwrap_or_else(|e| panic!("{args:?} rejected: {e}"));
        assert!(
            notes.iter().any(|n| n.contains(want)),
            "{args:?}: notes {notes:?} lack {want:?}"
        );
    }
    // The same ignored option twice gives one note; implemented ones give none.
    let (_, notes) = run(&["-o", "modern", "-o", "modern", "-p", "1"]).unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    let (_, notes) = run(&["-o", "idle_timeout=5,debug_clock", "-t", "64"]).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
}

/// Settings memcached accepts that do less than they seem to start with a warning.
#[test]
fn surprising_combinations_are_noted() {
    let rows: &[(&[&str], &str)] = &[
        (&["-S", "-Y", "/a"], "-S with -Y"),
        (
            &["-Z", "-o", "ssl_chain_cert=/c,ssl_verify_mode=1"],
            "ssl_verify_mode=1 without ssl_ca_cert",
        ),
        (
            &["-Z", "-o", "ssl_chain_cert=/c,ssl_verify_mode=2"],
            "ssl_verify_mode=2 without ssl_ca_cert: a client certificate is required",
        ),
        (
            &["-Z", "-o", "ssl_chain_cert=/c,ssl_verify_mode=3"],
            "ssl_verify_mode=3 without ssl_ca_cert: a client certificate is required",
        ),
        (
            &["-Z", "-o", "ssl_chain_cert=/c", "-l", "mtls:127.0.0.1:1"],
            "-l mtls: without ssl_ca_cert",
        ),
    ];
    for (args, want) in rows {
        let (_, notes) = run(args).unwrap_or_else(|e| panic!("{args:?} rejected: {e}"));
        assert!(
            notes.iter().any(|n| n.contains(want)),
            "{args:?}: notes {notes:?} lack {want:?}"
        );
    }
    for args in [
        &["-Y", "/a"][..],
        &["-S"],
        &[
            "-Z",
            "-o",
            "ssl_chain_cert=/c,ssl_verify_mode=1,ssl_ca_cert=/ca",
        ],
        &[
            "-Z",
            "-o",
            "ssl_chain_cert=/c,ssl_verify_mode=2,ssl_ca_cert=/ca",
            "-l",
            "mtls:127.0.0.1:1",
        ],
        &["-Z", "-o", "ssl_chain_cert=/c", "-l", "btls:127.0.0.1:1"],
    ] {
        let (_, notes) = run(args).unwrap_or_else(|e| panic!("{args:?} rejected: {e}"));
        assert!(notes.is_empty(), "{args:?}: {notes:?}");
    }
}

/// Every suboption memcached 1.6 knows (1.6.18 and the newest release), with a value
/// it accepts, is accepted.
#[test]
fn every_memcached_suboption_is_accepted() {
    let all = [
        "maxconns_fast",
        "no_maxconns_fast",
        "hashpower=16",
        "no_hashexpand",
        "slab_reassign",
        "no_slab_reassign",
        "slab_automove",
        "slab_automove=2",
        "no_slab_automove",
        "slab_automove_ratio=0.8",
        "slab_automove_window=30",
        "slab_automove_freeratio=0.01",
        "tail_repair_time=60",
        "hash_algorithm=xxh3",
        "lru_crawler",
        "no_lru_crawler",
        "lru_crawler_sleep=100",
        "lru_crawler_tocrawl=0",
        "lru_maintainer",
        "no_lru_maintainer",
        "lru_maintainer",
        "hot_lru_pct=20",
        "warm_lru_pct=40",
        "hot_max_factor=0.2",
        "warm_max_factor=2.0",
        "temporary_ttl=61",
        "idle_timeout=0",
        "watcher_logbuf_size=256",
        "worker_logbuf_size=64",
        "slab_sizes=96-192-384",
        "slab_chunk_max=512",
        "track_sizes",
        "inline_ascii_resp",
        "no_inline_ascii_resp",
        "modern",
        "no_chunked_items",
        "drop_privileges",
        "no_drop_privileges",
        "resp_obj_mem_limit=1",
        "read_buf_mem_limit=0",
        "relaxed_privileges",
        "sock_cookie_id=1",
        "ssl_chain_cert=/c",
        "ssl_key=/k",
        "ssl_verify_mode=0",
        "ssl_keyformat=1",
        "ssl_ciphers=ALL",
        "ssl_ca_cert=/ca",
        "ssl_wbuf_size=16",
        "ssl_session_cache",
        "ssl_min_version=2",
        "ssl_min_version=3",
        "ssl_handshake_timeout=5",
        "proxy_arg=/x",
        "proxy_uring",
        "proxy_memprofile",
        "ext_page_size=64",
        "ext_wbuf_size=4",
        "ext_threads=1",
        "ext_io_depth=1",
        "ext_path=/e:1g",
        "ext_item_size=512",
        "ext_item_age=0",
        "ext_low_ttl=0",
        "ext_drop_unread",
        "ext_recache_rate=2000",
        "ext_compact_under=1",
        "ext_drop_under=1",
        "ext_max_sleep=1000000",
        "ext_max_frag=0.8",
        "debug_clock",
    ];
    for sub in all {
        run(&["-o", sub]).unwrap_or_else(|e| panic!("-o {sub} rejected: {e}"));
    }
    run(&["-o", &all.join(",")]).unwrap_or_else(|e| panic!("all at once rejected: {e}"));
    // no_modern turns the LRU maintainer off, which temporary_ttl needs.
    run(&["-o", "no_modern"]).unwrap();
}

#[test]
fn tls_options_and_listener_prefixes() {
    let c = cfg(&[
        "-Z",
        "-o",
        "ssl_chain_cert=/c.pem,ssl_key=/k.pem,ssl_ca_cert=/ca.pem,ssl_verify_mode=3",
        "-o",
        "ssl_min_version=3,ssl_session_cache,ssl_wbuf_size=8,ssl_keyformat=2",
        "-o",
        "ssl_ciphers=ECDHE-RSA-AES128-GCM-SHA256,ssl_handshake_timeout=0",
        "-l",
        "notls:127.0.0.1:1,btls:127.0.0.1:2,mtls:127.0.0.1:3,127.0.0.1",
        "--replica-tls-ca",
        "/ca.pem",
        "--replica-tls-name",
        "master.example",
    ]);
    let s = &c.ssl;
    assert!(s.enabled);
    assert_eq!(s.settings.chain_cert.as_deref(), Some(Path::new("/c.pem")));
    assert_eq!(s.settings.key.as_deref(), Some(Path::new("/k.pem")));
    assert_eq!(s.settings.ca_cert.as_deref(), Some(Path::new("/ca.pem")));
    assert_eq!(s.settings.verify_mode, kvtls::server::VerifyMode::Once);
    assert_eq!(s.settings.min_version, kvtls::server::MinVersion::Tls13);
    assert_eq!(s.settings.key_format, kvtls::server::KeyFormat::Der);
    assert!(s.settings.session_cache);
    assert_eq!(s.wbuf_size, 8 * 1024);
    assert_eq!(s.handshake_timeout, None);
    let tls: Vec<_> = c.listeners.iter().map(|l| (l.port, l.tls)).collect();
    assert_eq!(
        tls,
        [
            (Some(1), ListenTls::Plain),
            (Some(2), ListenTls::NoPeer),
            (Some(3), ListenTls::Peer),
            (None, ListenTls::Default)
        ]
    );
    let r = c.replica_tls.expect("replica TLS");
    assert_eq!(r.ca.as_deref(), Some(Path::new("/ca.pem")));
    assert_eq!(r.server_name.as_deref(), Some("master.example"));
    assert!(cfg(&[]).replica_tls.is_none());
}

/// Every long option of memcached's table is spelled the same way.
#[test]
fn every_long_option_is_known() {
    for o in OPTIONS.iter().filter(|o| !o.long.is_empty()) {
        let flag = format!("--{}", o.long);
        let value = match o.opt {
            Opt::UnixMask => "700",
            Opt::MemoryLimit => "64",
            Opt::ConnLimit
            | Opt::Threads
            | Opt::MaxReqsPerEvent
            | Opt::ListenBacklog
            | Opt::Port
            | Opt::UdpPort => "4",
            Opt::SlabGrowthFactor => "1.25",
            Opt::SlabMinSize => "48",
            Opt::NapiIds => "1",
            Opt::Protocol => "ascii",
            Opt::MaxItemSize => "1m",
            Opt::Extended => "modern",
            Opt::Listen => "127.0.0.1",
            Opt::ReplicaOf => "127.0.0.1:11211",
            Opt::ReplicaAuth => "/etc/kvcached/replica-auth",
            Opt::MinReplicas | Opt::MinReplicasMaxLag | Opt::ReplBacklog => "1",
            Opt::ReplicaServeStale => "no",
            Opt::ReplicaAuthMech => "sasl",
            Opt::ReplicaTlsCa | Opt::ReplicaTlsCert | Opt::ReplicaTlsKey => "/etc/kvcached/x.pem",
            _ => "x",
        };
        let mut args = vec![flag.clone()];
        if o.arg.required() {
            args.push(value.to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match (o.opt, parse_strs(&args)) {
            // -Z alone: no certificate to serve.
            (Opt::EnableSsl, Err(e)) => assert!(e.contains("ssl_chain_cert"), "{e}"),
            (Opt::Help | Opt::License, Ok(Action::Help(_)))
            | (Opt::Version, Ok(Action::Version)) => {}
            (_, Ok(Action::Run { .. })) => {}
            (_, other) => panic!("{flag}: {other:?}"),
        }
        if let Some(c) = o.short {
            assert_eq!(short_spec(c).unwrap().long, o.long);
        }
    }
}

#[test]
fn repl_backlog_is_megabytes() {
    assert_eq!(cfg(&[]).repl_backlog, 0);
    assert_eq!(cfg(&["--repl-backlog=32"]).repl_backlog, 32 << 20);
    assert_eq!(cfg(&["--repl-backlog", "1"]).repl_backlog, 1 << 20);
    for bad in ["0", "-1", "x", "16777217"] {
        let e = parse_strs(&["--repl-backlog", bad]).unwrap_err();
        assert!(e.contains("megabytes"), "{bad}: {e}");
    }
}

#[test]
fn help_license_and_version_stop_parsing_in_order() {
    match parse_strs(&["-h"]).unwrap() {
        Action::Help(t) => {
            assert!(t.contains("--port"));
            assert!(t.contains("idle_timeout"));
            assert!(t.contains("debug_clock"));
            assert!(t.contains("ignored"));
            assert!(t.contains("--replica-of"));
            // Tools (memcached's own test suite among them) learn whether the proxy is
            // built in by looking for its option's name in -h.
            assert!(!t.contains("proxy_config"));
            for c in OPTIONS.iter().filter_map(|o| o.short) {
                assert!(
                    t.contains(&format!("-{},", c as char))
                        || t.contains(&format!("-{} ", c as char))
                        || t.contains(&format!("-{}\n", c as char)),
                    "help lacks -{}",
                    c as char
                );
            }
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(parse_strs(&["--help"]).unwrap(), Action::Help(_)));
    assert!(matches!(parse_strs(&["-V"]).unwrap(), Action::Version));
    assert!(matches!(
        parse_strs(&["--version"]).unwrap(),
        Action::Version
    ));
    match parse_strs(&["-i"]).unwrap() {
        Action::Help(t) => assert!(t.contains("BSD")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        parse_strs(&["--license"]).unwrap(),
        Action::Help(_)
    ));
    // Bundled, and after other options.
    assert!(matches!(parse_strs(&["-vh"]).unwrap(), Action::Help(_)));
    assert!(matches!(
        parse_strs(&["-p", "1", "-V"]).unwrap(),
        Action::Version
    ));
    // First one wins; what follows is not looked at; what precedes is.
    assert!(matches!(
        parse_strs(&["-V", "-h"]).unwrap(),
        Action::Version
    ));
    assert!(matches!(
        parse_strs(&["-h", "-t", "0"]).unwrap(),
        Action::Help(_)
    ));
    assert!(matches!(
        parse_strs(&["-h", "-Q"]).unwrap(),
        Action::Help(_)
    ));
    // Checks that memcached makes after the option loop do not apply to -h.
    assert!(matches!(
        parse_strs(&["-I", "5g", "-h"]).unwrap(),
        Action::Help(_)
    ));
    assert!(parse_strs(&["-t", "0", "-h"]).is_err());
    assert!(parse_strs(&["-Q", "-V"]).is_err());
}

#[test]
fn paths_need_not_be_utf8() {
    use std::os::unix::ffi::OsStringExt;
    let raw = OsString::from_vec(b"/tmp/k\xff.sock".to_vec());
    let args = vec![
        OsString::from("-s"),
        raw.clone(),
        OsString::from("-P"),
        raw.clone(),
    ];
    match parse(args).unwrap() {
        Action::Run { config, .. } => {
            assert_eq!(
                config.unix_socket.as_deref().map(|p| p.as_os_str()),
                Some(raw.as_os_str())
            );
            assert!(config.pid_file.is_some());
        }
        other => panic!("{other:?}"),
    }
    let bad = vec![OsString::from("-u"), OsString::from_vec(b"\xff".to_vec())];
    assert!(parse(bad).unwrap_err().contains("UTF-8"));
    let bad = vec![OsString::from_vec(b"-\xff".to_vec())];
    assert!(parse(bad).unwrap_err().contains("unknown option"));
}

#[test]
fn listen_addr_resolution() {
    let c = cfg(&["-l", "127.0.0.1,[::1]:7,*:8", "-p", "9"]);
    let a = c.listeners[0].socket_addrs(c.tcp_port).unwrap();
    assert_eq!(a, vec!["127.0.0.1:9".parse().unwrap()]);
    let a = c.listeners[1].socket_addrs(c.tcp_port).unwrap();
    assert_eq!(a, vec!["[::1]:7".parse().unwrap()]);
    let a = c.listeners[2].socket_addrs(c.tcp_port).unwrap();
    assert_eq!(
        a,
        vec!["0.0.0.0:8".parse().unwrap(), "[::]:8".parse().unwrap()]
    );
    assert_eq!(c.listeners[0].port_or(11211), 11211);
}
