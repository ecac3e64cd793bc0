//! The classic text protocol, table-driven, proven against Debian's memcached 1.6.18 and run
//! against kvcached.
//!
//! Every behaviour table runs twice: `<test>::memcached` (the reference, which must pass) and
//! `<test>::kvcached`. Where the newest memcached (1.6.4x, kvcached's target) answers
//! differently from 1.6.18, the row carries both answers ([`by`]) and each server is held to
//! its own; the comment on such a row says what the newest source does.
//!
//! A table row is (request bytes, exact reply bytes). The runner sends the request followed by
//! a `version\r\n` sentinel and collects everything before the `VERSION ...` line, so a server
//! that answers too little, too much, or out of order fails the row without waiting for a
//! timeout. A closed connection shows up as `<EOF>` in the reply (and the runner reconnects).
//! All failing rows of a table are reported together.
//!
//! With `MEMCACHED=/path/to/a/newer/memcached` (any `-V` other than 1.6.18) the memcached runs
//! expect the newest answers instead; every two-answer row was checked that way against a
//! build of memcached's current source.

mod common;

use common::{poll_until, Client, Kind, Server, XorShift};
use std::io::{BufRead, ErrorKind, Read, Write};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// How long a table row waits for its reply before it is recorded as `<TIMEOUT>`. No row
/// expects one, so this is the harness's reply timeout, long enough for a loaded machine.
const ROW_TIMEOUT: Duration = common::TIMEOUT;

common::both!(
    storage_commands,
    retrieval_commands,
    delete_incr_decr_touch,
    flush_verbosity_misc,
    flush_disabled,
    malformed_requests,
    noreply_everywhere,
    noreply_error_paths,
    data_block_errors,
    cas_outcomes,
    version_reply,
    quit_closes,
    http_request_closes,
    long_line_without_newline_closes,
    long_get_line_is_fine,
    shutdown_not_enabled,
    shutdown_enabled_exits,
    stats_general,
    stats_counters,
    stats_counters_touch_expiry_errors,
    stats_subcommands,
    object_too_large,
    item_size_limit_includes_overhead,
    out_of_memory_no_evict,
    touch_with_full_memory_no_evict,
    pipelined_in_one_write,
    large_multiget,
    expiry_without_clock,
    cas_race_two_clients,
    concurrent_incr,
    append_beyond_item_size_max,
    binary_safe_values,
    get_with_ten_thousand_keys,
    cas_disabled,
    evicts_when_full,
    recently_read_items_survive_eviction,
    chunked_pipelines_from_many_clients,
);

// ---------------------------------------------------------------------------------------------
// The table runner.

type Row = (String, String);

/// A row: `req` must be answered with exactly `want`.
fn r(req: impl Into<String>, want: impl Into<String>) -> Row {
    (req.into(), want.into())
}

/// `mc18` for Debian's memcached 1.6.18, `newest` for kvcached (newest memcached's answer).
/// When `$MEMCACHED` points at a newer memcached build (anything whose `-V` is not 1.6.18),
/// the memcached run expects `newest` too, which is how these rows were checked.
fn by(kind: Kind, mc18: &str, newest: &str) -> String {
    if kind == Kind::Kvcached || !reference_is_1_6_18() {
        newest.to_string()
    } else {
        mc18.to_string()
    }
}

/// The reply to a get/gets of a 251-byte key. The newest memcached appends a stray empty line
/// (process_get_command_err copies the already-terminated error line, and out_string
/// terminates it again); kvcached is held to the clean reply, as 1.6.18 gives it.
fn too_long_get_reply(kind: Kind) -> String {
    if kind == Kind::Memcached && !reference_is_1_6_18() {
        "CLIENT_ERROR bad command line format\r\n\r\n".to_string()
    } else {
        "CLIENT_ERROR bad command line format\r\n".to_string()
    }
}

/// Whether the reference memcached binary is Debian's 1.6.18.
fn reference_is_1_6_18() -> bool {
    static IS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IS.get_or_init(|| {
        let out = std::process::Command::new(common::memcached_path())
            .arg("-V")
            .output()
            .expect("memcached -V");
        String::from_utf8_lossy(&out.stdout).trim() == "memcached 1.6.18"
    })
}

fn connect(server: &Server) -> Client {
    let c = server.connect();
    c.stream()
        .set_read_timeout(Some(ROW_TIMEOUT))
        .expect("read timeout");
    c
}

/// Send `req` then the `version` sentinel; everything the server wrote before the sentinel's
/// `VERSION ...\r\n` line. `<EOF>` / `<TIMEOUT>` are appended when the connection closed or
/// went quiet instead.
fn exchange(c: &mut Client, req: &[u8]) -> String {
    let s = c.reader.get_mut();
    let _ = s.write_all(req);
    let _ = s.write_all(b"version\r\n");
    let mut out = Vec::new();
    loop {
        let mut line = Vec::new();
        match c.reader.read_until(b'\n', &mut line) {
            Ok(0) => {
                out.extend_from_slice(b"<EOF>");
                break;
            }
            Ok(_) if line.starts_with(b"VERSION ") && line.ends_with(b"\r\n") => break,
            Ok(_) if !line.ends_with(b"\n") => {
                out.extend_from_slice(&line);
                out.extend_from_slice(b"<EOF>");
                break;
            }
            Ok(_) => out.extend_from_slice(&line),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                out.extend_from_slice(&line);
                out.extend_from_slice(b"<EOF>");
                break;
            }
            Err(_) => {
                out.extend_from_slice(&line);
                out.extend_from_slice(b"<TIMEOUT>");
                break;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Run `rows` in order on one connection to a fresh `kind` server started with `args`.
fn run_table(kind: Kind, args: &[&str], rows: &[Row]) {
    let server = Server::start_verified(kind, args);
    run_rows(&server, rows);
}

/// Run `rows` in order on one connection to `server`; report every failing row.
fn run_rows(server: &Server, rows: &[Row]) {
    let mut c = connect(server);
    let mut failures = Vec::new();
    for (i, (req, want)) in rows.iter().enumerate() {
        let got = exchange(&mut c, req.as_bytes());
        if &got != want {
            failures.push(format!(
                "row {i}: request {req:?}\n        want {want:?}\n         got {got:?}"
            ));
        }
        if got.ends_with("<EOF>") || got.ends_with("<TIMEOUT>") {
            c = connect(server);
        }
    }
    assert!(
        failures.is_empty(),
        "{:?}: {} of {} rows failed:\n{}",
        server.kind,
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

fn key(len: usize) -> String {
    "k".repeat(len)
}

// ---------------------------------------------------------------------------------------------
// Command tables.

fn storage_commands(kind: Kind) {
    let rows = vec![
        // set: new, overwrite, flags, empty value, binary-safe value.
        r("set a 0 0 1\r\nx\r\n", "STORED\r\n"),
        r("get a\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"),
        r("set a 42 0 3\r\nxyz\r\n", "STORED\r\n"),
        r("get a\r\n", "VALUE a 42 3\r\nxyz\r\nEND\r\n"),
        r("set maxflags 4294967295 0 1\r\nf\r\n", "STORED\r\n"),
        r(
            "get maxflags\r\n",
            "VALUE maxflags 4294967295 1\r\nf\r\nEND\r\n",
        ),
        r("set empty 0 0 0\r\n\r\n", "STORED\r\n"),
        r("get empty\r\n", "VALUE empty 0 0\r\n\r\nEND\r\n"),
        r("set crlf 0 0 6\r\na\r\nb\r\n\r\n", "STORED\r\n"),
        r("get crlf\r\n", "VALUE crlf 0 6\r\na\r\nb\r\n\r\nEND\r\n"),
        // Extra blanks between tokens and a bare \n terminator are tolerated.
        r("set  sp  1  0  2 \r\nab\r\n", "STORED\r\n"),
        r("get  sp \r\n", "VALUE sp 1 2\r\nab\r\nEND\r\n"),
        r(
            "set lf 0 0 1\nx\r\nget lf\n",
            "STORED\r\nVALUE lf 0 1\r\nx\r\nEND\r\n",
        ),
        // add: only when absent.
        r("add a 0 0 1\r\nn\r\n", "NOT_STORED\r\n"),
        r("get a\r\n", "VALUE a 42 3\r\nxyz\r\nEND\r\n"),
        r("add b 7 0 2\r\nbb\r\n", "STORED\r\n"),
        r("get b\r\n", "VALUE b 7 2\r\nbb\r\nEND\r\n"),
        // replace: only when present.
        r("replace nokey 0 0 1\r\nx\r\n", "NOT_STORED\r\n"),
        r("get nokey\r\n", "END\r\n"),
        r("replace b 3 0 3\r\nBBB\r\n", "STORED\r\n"),
        r("get b\r\n", "VALUE b 3 3\r\nBBB\r\nEND\r\n"),
        // append/prepend: only when present; flags are kept.
        r("append nokey 0 0 1\r\nx\r\n", "NOT_STORED\r\n"),
        r("prepend nokey 0 0 1\r\nx\r\n", "NOT_STORED\r\n"),
        r("get nokey\r\n", "END\r\n"),
        r("append b 99 0 2\r\n>>\r\n", "STORED\r\n"),
        r("prepend b 99 0 2\r\n<<\r\n", "STORED\r\n"),
        r("get b\r\n", "VALUE b 3 7\r\n<<BBB>>\r\nEND\r\n"),
        r("append empty 0 0 0\r\n\r\n", "STORED\r\n"),
        r("get empty\r\n", "VALUE empty 0 0\r\n\r\nEND\r\n"),
        // A key of 250 bytes is fine.
        r(format!("set {} 5 0 2\r\nok\r\n", key(250)), "STORED\r\n"),
        r(
            format!("get {}\r\n", key(250)),
            format!("VALUE {} 5 2\r\nok\r\nEND\r\n", key(250)),
        ),
        // 251 bytes is not (on every keyed command).
        r(format!("get {}\r\n", key(251)), too_long_get_reply(kind)),
        // 1.6.18 does not swallow the data block after a rejected storage line ("x" then
        // reads as an unknown command); the newest swallows it (process_update_command sets
        // conn_swallow with sbytes = vlen).
        r(
            format!("set {} 0 0 1\r\nx\r\n", key(251)),
            by(
                kind,
                "CLIENT_ERROR bad command line format\r\nERROR\r\n",
                "CLIENT_ERROR bad command line format\r\n",
            ),
        ),
    ];
    run_table(kind, &[], &rows);
}

fn retrieval_commands(kind: Kind) {
    let k250 = key(250);
    let rows = vec![
        r("get a\r\n", "END\r\n"),
        r("get a b c d e f g h\r\n", "END\r\n"),
        r("set a 1 0 1\r\nA\r\n", "STORED\r\n"),
        r("set c 3 0 3\r\nCCC\r\n", "STORED\r\n"),
        // Many keys, some missing, one repeated: hits in request order.
        r(
            "get a b c nope a\r\n",
            "VALUE a 1 1\r\nA\r\nVALUE c 3 3\r\nCCC\r\nVALUE a 1 1\r\nA\r\nEND\r\n",
        ),
        r("get x y z a\r\n", "VALUE a 1 1\r\nA\r\nEND\r\n"),
        // gets adds the CAS unique; the test for its value is in cas_outcomes.
        r("gets nope\r\n", "END\r\n"),
        // gat/gats: touch and return.
        r(
            "gat 0 a nope c\r\n",
            "VALUE a 1 1\r\nA\r\nVALUE c 3 3\r\nCCC\r\nEND\r\n",
        ),
        r("gat 100 nope\r\n", "END\r\n"),
        r("gat abc a\r\n", "CLIENT_ERROR invalid exptime argument\r\n"),
        // Negative exptime in gat expires the item at once.
        r("gat -1 c\r\n", "VALUE c 3 3\r\nCCC\r\nEND\r\n"),
        r("get c\r\n", "END\r\n"),
        r(format!("set {k250} 0 0 1\r\nL\r\n"), "STORED\r\n"),
        r(
            format!("get {k250} a\r\n"),
            format!("VALUE {k250} 0 1\r\nL\r\nVALUE a 1 1\r\nA\r\nEND\r\n"),
        ),
        r(format!("get {}\r\n", key(251)), too_long_get_reply(kind)),
        r(format!("gets {}\r\n", key(251)), too_long_get_reply(kind)),
        // get/gets with no key: 1.6.18 says ERROR; the newest parser rejects the line as a
        // bad format (_process_request_simple: fewer than 2 tokens).
        r(
            "get\r\n",
            by(
                kind,
                "ERROR\r\n",
                "CLIENT_ERROR bad command line format\r\n",
            ),
        ),
        r(
            "gets\r\n",
            by(
                kind,
                "ERROR\r\n",
                "CLIENT_ERROR bad command line format\r\n",
            ),
        ),
        // gat with no key: 1.6.18 ERROR / invalid exptime; newest: fewer than 3 tokens is a
        // bad format (_process_request_gat).
        r(
            "gat\r\n",
            by(
                kind,
                "ERROR\r\n",
                "CLIENT_ERROR bad command line format\r\n",
            ),
        ),
        r(
            "gat a\r\n",
            by(
                kind,
                "CLIENT_ERROR invalid exptime argument\r\n",
                "CLIENT_ERROR bad command line format\r\n",
            ),
        ),
    ];
    run_table(kind, &[], &rows);

    // gets/gats: the unique is a number, the same for gets and gats of an unchanged item,
    // and gats returns the item.
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    assert_eq!(c.call("set g 9 0 2\r\ngg\r\n"), "STORED\r\n");
    c.send(b"gets g\r\n");
    let head = c.line();
    let unique = parse_gets_header(&head, "g", 9, 2);
    assert_eq!(c.line(), "gg\r\n");
    assert_eq!(c.line(), "END\r\n");
    c.send(b"gats 100 g nope\r\n");
    assert_eq!(
        c.until("END\r\n"),
        format!("VALUE g 9 2 {unique}\r\ngg\r\nEND\r\n")
    );
}

/// Parse `VALUE <key> <flags> <bytes> <cas>\r\n`, checking the first three; returns the cas.
fn parse_gets_header(line: &str, key: &str, flags: u32, bytes: usize) -> u64 {
    let parts: Vec<&str> = line.trim_end_matches("\r\n").split(' ').collect();
    assert!(
        line.ends_with("\r\n") && parts.len() == 5 && parts[0] == "VALUE",
        "bad gets header {line:?}"
    );
    assert_eq!(parts[1], key, "{line:?}");
    assert_eq!(parts[2], flags.to_string(), "{line:?}");
    assert_eq!(parts[3], bytes.to_string(), "{line:?}");
    parts[4]
        .parse()
        .unwrap_or_else(|_| panic!("cas unique not a u64 in {line:?}"))
}

fn delete_incr_decr_touch(kind: Kind) {
    let bad = "CLIENT_ERROR bad command line format\r\n";
    let rows = vec![
        // delete
        r("delete nokey\r\n", "NOT_FOUND\r\n"),
        r("set d 0 0 1\r\nx\r\n", "STORED\r\n"),
        r("delete d\r\n", "DELETED\r\n"),
        r("get d\r\n", "END\r\n"),
        r("delete d\r\n", "NOT_FOUND\r\n"),
        // The ancient "delete <key> 0" form is still accepted by both.
        r("set d 0 0 1\r\nx\r\n", "STORED\r\n"),
        r("delete d 0\r\n", "DELETED\r\n"),
        r(format!("delete {}\r\n", key(251)), bad),
        // Newest ignores extra tokens after the key (process_delete_cmd no longer checks the
        // token count); 1.6.18 rejects them.
        r("set d 0 0 1\r\nx\r\n", "STORED\r\n"),
        r(
            "delete d extra\r\n",
            by(
                kind,
                "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
                "DELETED\r\n",
            ),
        ),
        r("delete\r\n", by(kind, "ERROR\r\n", bad)),
        // incr / decr
        r("incr nokey 1\r\n", "NOT_FOUND\r\n"),
        r("decr nokey 1\r\n", "NOT_FOUND\r\n"),
        r("set n 5 0 1\r\n9\r\n", "STORED\r\n"),
        r("incr n 1\r\n", "10\r\n"),
        r("get n\r\n", "VALUE n 5 2\r\n10\r\nEND\r\n"),
        r("incr n 0\r\n", "10\r\n"),
        r("decr n 3\r\n", "7\r\n"),
        // decr keeps the length, padding with spaces.
        r("get n\r\n", "VALUE n 5 2\r\n7 \r\nEND\r\n"),
        r("decr n 100\r\n", "0\r\n"),
        r("decr n 1\r\n", "0\r\n"),
        r("set n 0 0 20\r\n18446744073709551615\r\n", "STORED\r\n"),
        r("incr n 1\r\n", "0\r\n"),
        r("set n 0 0 2\r\n10\r\n", "STORED\r\n"),
        r("incr n 18446744073709551615\r\n", "9\r\n"),
        r(
            "incr n 18446744073709551616\r\n",
            "CLIENT_ERROR invalid numeric delta argument\r\n",
        ),
        r(
            "incr n abc\r\n",
            "CLIENT_ERROR invalid numeric delta argument\r\n",
        ),
        r(
            "incr n -1\r\n",
            "CLIENT_ERROR invalid numeric delta argument\r\n",
        ),
        r(
            "decr n abc\r\n",
            "CLIENT_ERROR invalid numeric delta argument\r\n",
        ),
        // 10 + (2^64 - 1) wraps to 9, written in place over "10".
        r("get n\r\n", "VALUE n 0 2\r\n9 \r\nEND\r\n"),
        r("set s 0 0 3\r\nabc\r\n", "STORED\r\n"),
        r(
            "incr s 1\r\n",
            "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        ),
        r(
            "decr s 1\r\n",
            "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        ),
        r("set s 0 0 3\r\n12a\r\n", "STORED\r\n"),
        r(
            "incr s 1\r\n",
            "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        ),
        r(format!("incr {} 1\r\n", key(251)), bad),
        // Missing delta: 1.6.18 ERROR; newest: fewer than 3 tokens is a bad format.
        r("incr n\r\n", by(kind, "ERROR\r\n", bad)),
        r("decr n\r\n", by(kind, "ERROR\r\n", bad)),
        // touch
        r("touch nokey 10\r\n", "NOT_FOUND\r\n"),
        r("touch n 10\r\n", "TOUCHED\r\n"),
        r(
            "touch n abc\r\n",
            "CLIENT_ERROR invalid exptime argument\r\n",
        ),
        r(format!("touch {} 1\r\n", key(251)), bad),
        r("touch n\r\n", by(kind, "ERROR\r\n", bad)),
        // touch with a negative exptime expires the item.
        r("touch n -1\r\n", "TOUCHED\r\n"),
        r("get n\r\n", "END\r\n"),
    ];
    run_table(kind, &[], &rows);
}

fn flush_verbosity_misc(kind: Kind) {
    let rows = vec![
        r(
            "set a 0 0 1\r\nx\r\nset b 0 0 1\r\ny\r\n",
            "STORED\r\nSTORED\r\n",
        ),
        r("flush_all\r\n", "OK\r\n"),
        r("get a b\r\n", "END\r\n"),
        r("set a 0 0 1\r\nx\r\n", "STORED\r\n"),
        r("get a\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"),
        r("flush_all 0\r\n", "OK\r\n"),
        r("get a\r\n", "END\r\n"),
        r("set a 0 0 1\r\nx\r\n", "STORED\r\n"),
        r("flush_all -1\r\n", "OK\r\n"),
        r("get a\r\n", "END\r\n"),
        r(
            "flush_all abc\r\n",
            "CLIENT_ERROR invalid exptime argument\r\n",
        ),
        // Items stored after a flush survive it.
        r("set a 0 0 1\r\nz\r\n", "STORED\r\n"),
        r("get a\r\n", "VALUE a 0 1\r\nz\r\nEND\r\n"),
        r("verbosity 1\r\n", "OK\r\n"),
        r("verbosity 0\r\n", "OK\r\n"),
        r(
            "verbosity abc\r\n",
            "CLIENT_ERROR bad command line format\r\n",
        ),
        // No level: 1.6.18 ERROR; newest: the u32 token is missing → bad format.
        r(
            "verbosity\r\n",
            by(
                kind,
                "ERROR\r\n",
                "CLIENT_ERROR bad command line format\r\n",
            ),
        ),
    ];
    run_table(kind, &[], &rows);
}

fn flush_disabled(kind: Kind) {
    let rows = vec![
        r("set a 0 0 1\r\nx\r\n", "STORED\r\n"),
        r("flush_all\r\n", "CLIENT_ERROR flush_all not allowed\r\n"),
        r("flush_all 10\r\n", "CLIENT_ERROR flush_all not allowed\r\n"),
        r("flush_all noreply\r\n", ""),
        r("get a\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"),
    ];
    run_table(kind, &["-F"], &rows);
}

fn malformed_requests(kind: Kind) {
    let bad = "CLIENT_ERROR bad command line format\r\n";
    let rows = vec![
        r("bogus\r\n", "ERROR\r\n"),
        r("bogus with args\r\n", "ERROR\r\n"),
        r("ab\r\n", "ERROR\r\n"),
        r("SET a 0 0 1\r\n", "ERROR\r\n"),
        // Empty line: 1.6.18 ERROR; newest: lines shorter than 4 bytes are a bad format
        // (process_request: cmdlen < 4).
        r("\r\n", by(kind, "ERROR\r\n", bad)),
        r("\n", by(kind, "ERROR\r\n", bad)),
        // Storage lines with too few tokens: 1.6.18 ERROR, newest bad format.
        r("set\r\n", by(kind, "ERROR\r\n", bad)),
        r("set a\r\n", by(kind, "ERROR\r\n", bad)),
        r("set a 0 0\r\n", by(kind, "ERROR\r\n", bad)),
        // A bad length: the data block cannot be known, nothing is swallowed.
        r("set a 0 0 -1\r\n", bad),
        r("set a 0 0 abc\r\n", bad),
        // Bad flags/exptime with a good length: newest swallows the data block; 1.6.18 then
        // reads it as a command.
        r(
            "set a abc 0 1\r\nx\r\n",
            by(
                kind,
                "CLIENT_ERROR bad command line format\r\nERROR\r\n",
                bad,
            ),
        ),
        r(
            "set a -1 0 1\r\nx\r\n",
            by(
                kind,
                "CLIENT_ERROR bad command line format\r\nERROR\r\n",
                bad,
            ),
        ),
        r(
            "set a 0 abc 1\r\nx\r\n",
            by(
                kind,
                "CLIENT_ERROR bad command line format\r\nERROR\r\n",
                bad,
            ),
        ),
        r("get a\r\n", "END\r\n"),
        // cas without / with a bad unique.
        r(
            "cas a 0 0 1 abc\r\nx\r\n",
            by(
                kind,
                "CLIENT_ERROR bad command line format\r\nERROR\r\n",
                bad,
            ),
        ),
        r("cas a 0 0 1\r\nx\r\n", by(kind, "ERROR\r\nERROR\r\n", bad)),
        r("get a\r\n", "END\r\n"),
        // Tokenizer edges.
        r(
            "set a 0 1.5 1\r\nx\r\n",
            by(
                kind,
                "CLIENT_ERROR bad command line format\r\nERROR\r\n",
                bad,
            ),
        ),
        // "+1" as a length: 1.6.18's strtol takes it; the newest rejects it (and then reads
        // "x" as a too-short line).
        r(
            "set a 0 0 +1\r\nx\r\n",
            by(kind, "STORED\r\n", &format!("{bad}{bad}")),
        ),
        r("set a -0 0 01\r\ny\r\n", "STORED\r\n"),
        r(
            "get a a\r\n",
            "VALUE a 0 1\r\ny\r\nVALUE a 0 1\r\ny\r\nEND\r\n",
        ),
        // Leading blanks: 1.6.18 skips them; the newest takes "" as the command.
        r(
            " get a\r\n",
            by(kind, "VALUE a 0 1\r\ny\r\nEND\r\n", "ERROR\r\n"),
        ),
        r("get \r\n", by(kind, "ERROR\r\n", bad)),
        r("gat 10\r\n", by(kind, "END\r\n", bad)),
        // Extra tokens: ignored by incr and storage commands; "noreply" only counts last.
        r("incr nokey 1 2\r\n", "NOT_FOUND\r\n"),
        r("set b 0 0 1 2\r\nx\r\n", "STORED\r\n"),
        r(
            "touch nokey 10 noreply extra\r\n",
            by(kind, "ERROR\r\n", "NOT_FOUND\r\n"),
        ),
        r(
            "delete nokey noreply extra\r\n",
            by(
                kind,
                "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
                "NOT_FOUND\r\n",
            ),
        ),
        r("flush_all 0 0\r\n", "OK\r\n"),
        r("verbosity 1 2\r\n", "OK\r\n"),
        // The connection still works.
        r(
            "set a 0 0 1\r\nx\r\nget a\r\n",
            "STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
        ),
    ];
    run_table(kind, &[], &rows);
}

fn noreply_everywhere(kind: Kind) {
    let rows = vec![
        r("set a 1 0 1 noreply\r\nx\r\n", ""),
        r("get a\r\n", "VALUE a 1 1\r\nx\r\nEND\r\n"),
        r("add a 0 0 1 noreply\r\ny\r\n", ""),
        r("add b 2 0 1 noreply\r\nb\r\n", ""),
        r("replace a 3 0 1 noreply\r\nz\r\n", ""),
        r("replace nokey 0 0 1 noreply\r\nz\r\n", ""),
        r("append a 0 0 1 noreply\r\n>\r\n", ""),
        r("prepend a 0 0 1 noreply\r\n<\r\n", ""),
        r("append nokey 0 0 1 noreply\r\n>\r\n", ""),
        r(
            "get a b nokey\r\n",
            "VALUE a 3 3\r\n<z>\r\nVALUE b 2 1\r\nb\r\nEND\r\n",
        ),
        r("cas a 0 0 1 1 noreply\r\nq\r\n", ""),
        r("cas nokey 0 0 1 1 noreply\r\nq\r\n", ""),
        r("get a\r\n", "VALUE a 3 3\r\n<z>\r\nEND\r\n"),
        r("set n 0 0 1 noreply\r\n5\r\n", ""),
        r("incr n 10 noreply\r\n", ""),
        r("decr n 2 noreply\r\n", ""),
        r("incr nokey 1 noreply\r\n", ""),
        r("get n\r\n", "VALUE n 0 2\r\n13\r\nEND\r\n"),
        r("touch n 100 noreply\r\n", ""),
        r("touch nokey 100 noreply\r\n", ""),
        r("delete b noreply\r\n", ""),
        r("delete nokey noreply\r\n", ""),
        r("get b\r\n", "END\r\n"),
        r("verbosity 1 noreply\r\n", ""),
        r("flush_all noreply\r\n", ""),
        r("get a n\r\n", "END\r\n"),
        r("set a 0 0 1\r\nx\r\n", "STORED\r\n"),
        r("flush_all 0 noreply\r\n", ""),
        r("get a\r\n", "END\r\n"),
        // Errors on the data block are silenced too.
        r(
            "set a 0 0 1 noreply\r\nxyz\r\n",
            by(
                kind,
                // 1.6.18: the bad chunk answer is silenced, then "\r\n" is an empty line.
                "ERROR\r\n",
                "CLIENT_ERROR bad command line format\r\n",
            ),
        ),
        r("get a\r\n", "END\r\n"),
    ];
    run_table(kind, &[], &rows);
}

fn noreply_error_paths(kind: Kind) {
    let bad = "CLIENT_ERROR bad command line format\r\n";
    let rows = vec![
        // Errors of commands that honour noreply are silenced too.
        r("set s 0 0 1\r\nx\r\n", "STORED\r\n"),
        r("incr s 1 noreply\r\n", ""),
        r("decr s 1 noreply\r\n", ""),
        r("incr s abc noreply\r\n", ""),
        r("touch s abc noreply\r\n", ""),
        r("flush_all abc noreply\r\n", ""),
        r("verbosity noreply\r\n", ""),
        r("incr s noreply\r\n", ""),
        r("get s\r\n", "VALUE s 0 1\r\nx\r\nEND\r\n"),
        // 1.6.18 only looks for noreply on known commands; the newest tokenizer marks any
        // line ending in "noreply" (so even ERROR is silenced).
        r("bogus noreply\r\n", by(kind, "ERROR\r\n", "")),
        r(
            "shutdown noreply\r\n",
            by(kind, "ERROR: shutdown not enabled\r\n", ""),
        ),
        // A bad storage line with noreply: newest silences it and swallows the data block;
        // 1.6.18 reads the block as a command.
        r("set a 0 abc 1 noreply\r\nx\r\n", by(kind, "ERROR\r\n", "")),
        r("cas a 0 0 1 noreply\r\nx\r\n", by(kind, "ERROR\r\n", "")),
        // Too few tokens is rejected before noreply is seen (newest).
        r("set a 0 0 noreply\r\n", by(kind, "", bad)),
        // So are the slab, LRU and crawler commands, whatever their arguments (newest);
        // 1.6.18 silenced only some of them.
        r("slabs automove 0 noreply\r\n", ""),
        r("slabs automove 9 noreply\r\n", ""),
        r("lru mode flat noreply\r\n", ""),
        r(
            "lru_crawler sleep 100 noreply\r\n",
            by(kind, "ERROR\r\n", ""),
        ),
        r(
            "lru_crawler metadump all noreply\r\n",
            by(kind, "ERROR\r\n", ""),
        ),
        r("slabs reassign 1 2 noreply\r\n", by(kind, "ERROR\r\n", "")),
        r("misbehave noreply\r\n", by(kind, "ERROR\r\n", "")),
        r("extstore noreply\r\n", ""),
        // ... but not refresh_certs (here without TLS).
        r("refresh_certs noreply\r\n", "Error TLS not enabled\r\n"),
        // stats has no noreply: "noreply" is an unknown group.
        r("stats noreply\r\n", "ERROR\r\n"),
        r("get a\r\n", "END\r\n"),
    ];
    run_table(kind, &[], &rows);
}

fn data_block_errors(kind: Kind) {
    // After a bad data chunk both read the rest of the line ("\r\n" or "\n") as a command:
    // an empty line, which 1.6.18 answers ERROR and the newest as a bad format.
    let tail = by(
        kind,
        "ERROR\r\n",
        "CLIENT_ERROR bad command line format\r\n",
    );
    let rows = vec![
        r("set a 0 0 1\r\nx\r\n", "STORED\r\n"),
        r(
            "set a 0 0 1\r\nxyz\r\n",
            format!("CLIENT_ERROR bad data chunk\r\n{tail}"),
        ),
        // The old value is untouched.
        r("get a\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"),
        r(
            "set a 0 0 2\r\nxyz\r\n",
            format!("CLIENT_ERROR bad data chunk\r\n{tail}"),
        ),
        r(
            "add new 0 0 1\r\nxy\r\n",
            format!("CLIENT_ERROR bad data chunk\r\n{tail}"),
        ),
        r("get new a\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"),
        r(
            "append a 0 0 1\r\nxy\r\n",
            format!("CLIENT_ERROR bad data chunk\r\n{tail}"),
        ),
        r("get a\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n"),
    ];
    run_table(kind, &[], &rows);
}

fn cas_outcomes(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    assert_eq!(c.call("cas nokey 0 0 1 1\r\nx\r\n"), "NOT_FOUND\r\n");
    assert_eq!(c.call("set k 4 0 2\r\nv1\r\n"), "STORED\r\n");
    c.send(b"gets k\r\n");
    let u1 = parse_gets_header(&c.line(), "k", 4, 2);
    assert_eq!(c.line(), "v1\r\n");
    assert_eq!(c.line(), "END\r\n");
    // A wrong unique: EXISTS, value unchanged.
    assert_eq!(
        c.call(&format!("cas k 5 0 2 {}\r\nv2\r\n", u1.wrapping_add(1000))),
        "EXISTS\r\n"
    );
    assert_eq!(c.call("get k\r\n"), "VALUE k 4 2\r\n");
    assert_eq!(c.until("END\r\n"), "v1\r\nEND\r\n");
    // The right unique: STORED, and the unique changes.
    assert_eq!(c.call(&format!("cas k 5 0 2 {u1}\r\nv2\r\n")), "STORED\r\n");
    c.send(b"gets k\r\n");
    let u2 = parse_gets_header(&c.line(), "k", 5, 2);
    assert_eq!(c.until("END\r\n"), "v2\r\nEND\r\n");
    assert_ne!(u1, u2, "cas unique must change on a store");
    // The old unique no longer matches.
    assert_eq!(c.call(&format!("cas k 0 0 2 {u1}\r\nv3\r\n")), "EXISTS\r\n");
    // Every mutation changes the unique: set, append, incr, touch does not.
    for (cmd, reply) in [
        ("set k 0 0 1\r\n7\r\n", "STORED\r\n"),
        ("append k 0 0 1\r\n0\r\n", "STORED\r\n"),
        ("incr k 1\r\n", "71\r\n"),
    ] {
        c.send(b"gets k\r\n");
        let head = c.line();
        let before: u64 = head.trim_end().rsplit(' ').next().unwrap().parse().unwrap();
        c.until("END\r\n");
        assert_eq!(c.call(cmd), reply, "{cmd:?}");
        c.send(b"gets k\r\n");
        let head = c.line();
        let after: u64 = head.trim_end().rsplit(' ').next().unwrap().parse().unwrap();
        c.until("END\r\n");
        assert_ne!(before, after, "{cmd:?} must change the cas unique");
    }
    // cas on a deleted item: NOT_FOUND.
    c.send(b"gets k\r\n");
    let u = parse_gets_header(&c.line(), "k", 0, 2);
    c.until("END\r\n");
    assert_eq!(c.call("delete k\r\n"), "DELETED\r\n");
    assert_eq!(
        c.call(&format!("cas k 0 0 1 {u}\r\nz\r\n")),
        "NOT_FOUND\r\n"
    );
    // Uniques of different items differ.
    assert_eq!(c.call("set x 0 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(c.call("set y 0 0 1\r\ny\r\n"), "STORED\r\n");
    c.send(b"gets x y\r\n");
    let ux = parse_gets_header(&c.line(), "x", 0, 1);
    assert_eq!(c.line(), "x\r\n");
    let uy = parse_gets_header(&c.line(), "y", 0, 1);
    assert_eq!(c.until("END\r\n"), "y\r\nEND\r\n");
    assert_ne!(ux, uy);
}

fn version_reply(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    let v = c.call("version\r\n");
    let rest = v
        .strip_prefix("VERSION ")
        .and_then(|s| s.strip_suffix("\r\n"))
        .unwrap_or_else(|| panic!("bad version reply {v:?}"));
    // Three numbers and nothing else, as a memcached release writes it: clients parse it
    // (Perl's `version->parse`, which Cache::Memcached::Fast's tests use, refused kvcached's
    // earlier `1.6.40-kvcached-0.1.0`, and so would Python's `packaging`).
    let parts: Vec<&str> = rest.split('.').collect();
    assert!(
        parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())),
        "version {rest:?} is not three numbers"
    );
    if kind == Kind::Memcached && reference_is_1_6_18() {
        assert_eq!(v, "VERSION 1.6.18\r\n");
    }
    // The same version in stats, and over the binary protocol (opcode 0x0b).
    assert_eq!(c.stat("version").as_deref(), Some(rest));
    let mut b = server.connect();
    let mut req = vec![0x80, 0x0b];
    req.extend([0u8; 22]);
    b.send(&req);
    let head = b.exact(24);
    assert_eq!(&head[..2], &[0x81, 0x0b]);
    let body_len = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
    assert_eq!(b.exact(body_len), rest.as_bytes());
}

fn quit_closes(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    // Replies before quit are delivered, nothing after it.
    c.send(b"set a 0 0 1\r\nx\r\nget a\r\nquit\r\nget a\r\n");
    assert_eq!(c.line(), "STORED\r\n");
    assert_eq!(c.until("END\r\n"), "VALUE a 0 1\r\nx\r\nEND\r\n");
    let mut rest = Vec::new();
    let n = c.reader.read_to_end(&mut rest).unwrap_or(0);
    assert_eq!(
        n,
        0,
        "data after quit: {:?}",
        String::from_utf8_lossy(&rest)
    );
    // Other connections are unaffected.
    let mut d = server.connect();
    assert_eq!(d.call("get a\r\n"), "VALUE a 0 1\r\n");
}

fn http_request_closes(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    for req in [
        "GET / HTTP/1.1\r\n",
        "GET / HTTP/1.0\r\nHost: x\r\n\r\n",
        "foo bar HTTP/1.1\r\n",
    ] {
        let mut c = server.connect();
        c.send(req.as_bytes());
        assert!(c.closed(), "{req:?} must close the connection");
    }
    // A get of a key named "/" with a key named HTTP/1.1 is fine: the last token must
    // start with HTTP/ and the command must be unknown.
    let mut c = server.connect();
    assert_eq!(c.call("get / HTTP/1.1\r\n"), "END\r\n");
}

fn long_line_without_newline_closes(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    // 4 KiB of junk with no newline.
    let junk = vec![b'x'; 4096];
    let _ = c.reader.get_mut().write_all(&junk);
    assert!(c.closed(), "a >2048-byte line without newline must close");
    // Also for a storage command line (only get/gets may be long).
    let mut c = server.connect();
    let mut line = b"set ".to_vec();
    line.extend(std::iter::repeat_n(b'k', 3000));
    let _ = c.reader.get_mut().write_all(&line);
    assert!(c.closed(), "a long set line must close");
    // The server is fine.
    let mut d = server.connect();
    assert!(d.call("version\r\n").starts_with("VERSION "));
}

fn long_get_line_is_fine(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    assert_eq!(c.call("set key7 0 0 2\r\nhi\r\n"), "STORED\r\n");
    // ~12 KB of keys on one line, sent in pieces without the newline first.
    let keys: Vec<String> = (0..2000).map(|i| format!("key{i}")).collect();
    let line = format!("get {}", keys.join(" "));
    assert!(line.len() > 2048 * 4);
    c.send(&line.as_bytes()[..5000]);
    c.send(&line.as_bytes()[5000..]);
    c.send(b"\r\n");
    assert_eq!(c.until("END\r\n"), "VALUE key7 0 2\r\nhi\r\nEND\r\n");
    let line = format!("gets {} key7\r\n", keys.join(" "));
    c.send(line.as_bytes());
    let out = c.until("END\r\n");
    assert_eq!(out.matches("VALUE key7 0 2 ").count(), 2, "{out:?}");
}

fn shutdown_not_enabled(kind: Kind) {
    // 1.6.18 "ERROR: shutdown not enabled"; newest "SERVER_ERROR: shutdown not enabled".
    let rows = vec![
        r(
            "shutdown\r\n",
            by(
                kind,
                "ERROR: shutdown not enabled\r\n",
                "SERVER_ERROR: shutdown not enabled\r\n",
            ),
        ),
        r("set a 0 0 1\r\nx\r\n", "STORED\r\n"),
    ];
    run_table(kind, &[], &rows);
}

fn shutdown_enabled_exits(kind: Kind) {
    let mut server = Server::start_verified(kind, &["-A"]);
    let mut other = server.connect();
    let mut c = server.connect();
    assert_eq!(c.call("set a 0 0 1\r\nx\r\n"), "STORED\r\n");
    c.send(b"shutdown\r\n");
    assert!(c.closed(), "shutdown must close the connection");
    assert!(other.closed(), "shutdown must close other connections");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            // memcached raises SIGINT on itself and exits 0 through its handler.
            assert!(
                status.success(),
                "{kind:?}: exit status {status:?} after shutdown"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server did not exit after shutdown"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The process is gone, and its listening socket with it. The port is not probed: a
    // test running beside this one may already have been given it (that made this test
    // fail once), and a connect to a free ephemeral port can even reach itself.
}

// ---------------------------------------------------------------------------------------------
// stats

fn stats_general(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    let stats = c.stats("");
    let get = |name: &str| {
        stats
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{kind:?}: stats lacks {name}"))
    };
    for name in [
        "pid",
        "uptime",
        "time",
        "version",
        "pointer_size",
        "rusage_user",
        "rusage_system",
        "max_connections",
        "curr_connections",
        "total_connections",
        "rejected_connections",
        "connection_structures",
        "cmd_get",
        "cmd_set",
        "cmd_flush",
        "cmd_touch",
        "get_hits",
        "get_misses",
        "get_expired",
        "get_flushed",
        "delete_misses",
        "delete_hits",
        "incr_misses",
        "incr_hits",
        "decr_misses",
        "decr_hits",
        "cas_misses",
        "cas_hits",
        "cas_badval",
        "touch_hits",
        "touch_misses",
        "store_too_large",
        "store_no_memory",
        "bytes_read",
        "bytes_written",
        "limit_maxbytes",
        "accepting_conns",
        "threads",
        "conn_yields",
        "hash_power_level",
        "hash_bytes",
        "hash_is_expanding",
        "bytes",
        "curr_items",
        "total_items",
        "evictions",
        "reclaimed",
    ] {
        let _ = get(name);
    }
    assert_eq!(get("pid"), server.child.id().to_string());
    assert_eq!(get("pointer_size"), "64");
    assert_eq!(get("limit_maxbytes"), (64u64 << 20).to_string());
    assert_eq!(get("max_connections"), "1024");
    assert_eq!(get("curr_items"), "0");
    // Both report memcached's hash table as it would be for no items: 2^16 buckets of 8
    // bytes (kvcached's own index is in `stats slabs`).
    let level: u32 = get("hash_power_level").parse().expect("a number");
    let hash_bytes: u64 = get("hash_bytes").parse().expect("a number");
    assert_eq!(get("hash_is_expanding"), "0");
    assert_eq!((level, hash_bytes), (16, 8 << 16));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let t: i64 = get("time").parse().expect("time is a number");
    assert!((t - now).abs() <= 5, "stats time {t} vs now {now}");
    let up: u64 = get("uptime").parse().expect("uptime is a number");
    assert!(up < 60, "uptime {up}");
    for name in ["rusage_user", "rusage_system"] {
        let v = get(name);
        let (s, us) = v
            .split_once('.')
            .unwrap_or_else(|| panic!("{name} {v:?} is not seconds.micros"));
        assert!(s.parse::<u64>().is_ok() && us.len() == 6 && us.parse::<u64>().is_ok());
    }
    // Named limits come from the command line.
    drop(c);
    let server = Server::start_verified(kind, &["-m", "32", "-c", "500"]);
    let mut c = server.connect();
    assert_eq!(c.stat("limit_maxbytes").as_deref(), Some("33554432"));
    assert_eq!(c.stat("max_connections").as_deref(), Some("500"));
}

fn stats_counters(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    let snapshot = |c: &mut Client| -> std::collections::HashMap<String, i64> {
        c.stats("")
            .into_iter()
            .filter_map(|(k, v)| v.parse::<i64>().ok().map(|v| (k, v)))
            .collect()
    };
    // Wait until the harness's probe connections are gone: only this one is left.
    poll_until("curr_connections == 1", common::TIMEOUT, || {
        c.stat("curr_connections").as_deref() == Some("1")
    });
    let before = snapshot(&mut c);
    let script = "set a 0 0 1\r\n1\r\nset b 0 0 3\r\nabc\r\nadd a 0 0 1\r\nx\r\n\
                  get a b nope\r\ngets a\r\nincr a 5\r\nincr nope 1\r\ndecr a 1\r\n\
                  decr nope 1\r\ndelete b\r\ndelete b\r\ntouch a 100\r\ntouch nope 1\r\n\
                  cas nope 0 0 1 1\r\nx\r\ncas a 0 0 1 1\r\nx\r\nflush_all\r\nget a\r\n";
    c.send(script.as_bytes());
    // 17 replies, the multi-line ones ending in END.
    let mut ends = 0;
    let mut lines = 0;
    while ends < 3 {
        let l = c.line();
        assert!(!l.is_empty(), "connection closed");
        lines += 1;
        if l == "END\r\n" {
            ends += 1;
        }
        assert!(lines < 40, "too many reply lines");
    }
    let after = snapshot(&mut c);
    let delta = |name: &str| {
        after.get(name).unwrap_or_else(|| panic!("no {name}"))
            - before.get(name).unwrap_or_else(|| panic!("no {name}"))
    };
    let want = [
        // set, set, add (refused), 2 cas: every storage command counts.
        ("cmd_set", 5),
        // get a b nope + gets a + get a: one per key.
        ("cmd_get", 5),
        ("get_hits", 3),
        ("get_misses", 2),
        ("incr_hits", 1),
        ("incr_misses", 1),
        ("decr_hits", 1),
        ("decr_misses", 1),
        ("delete_hits", 1),
        ("delete_misses", 1),
        ("touch_hits", 1),
        ("touch_misses", 1),
        ("cmd_touch", 2),
        ("cas_misses", 1),
        ("cas_badval", 1),
        ("cas_hits", 0),
        ("cmd_flush", 1),
        ("curr_items", 0),
    ];
    let mut bad = Vec::new();
    for (name, d) in want {
        if delta(name) != d {
            bad.push(format!("{name}: want +{d}, got +{}", delta(name)));
        }
    }
    assert!(bad.is_empty(), "{kind:?} counters: {}", bad.join(", "));
    // The last get finds a's item invalidated by the flush: 1.6.18 counts it in get_flushed,
    // the newest has already unlinked it at flush time (item_flush_expired), so 0 or 1.
    assert!(
        (0..=1).contains(&delta("get_flushed")),
        "get_flushed +{}",
        delta("get_flushed")
    );
    // set a, set b; incr/decr may rewrite in place or link a new item (memcached does the
    // latter when someone else holds a reference), so 2..=4.
    assert!(
        (2..=4).contains(&delta("total_items")),
        "total_items +{}",
        delta("total_items")
    );
    assert!(delta("bytes_read") >= script.len() as i64);
    assert!(delta("bytes_written") > 0);

    // Connections counted.
    let total0 = after["total_connections"];
    let curr0 = after["curr_connections"];
    let mut d1 = server.connect();
    let mut d2 = server.connect();
    // A round trip on each, so the server has registered both.
    assert!(d1.call("version\r\n").starts_with("VERSION"));
    assert!(d2.call("version\r\n").starts_with("VERSION"));
    let s = snapshot(&mut c);
    assert_eq!(s["curr_connections"], curr0 + 2);
    assert_eq!(s["total_connections"], total0 + 2);
    drop(d1);
    drop(d2);
    poll_until("curr_connections to drop", common::TIMEOUT, || {
        snapshot(&mut c)["curr_connections"] == curr0
    });

    // stats reset zeroes the counters (not curr_items, not the connection gauges).
    assert_eq!(c.call("set z 0 0 1\r\nz\r\n"), "STORED\r\n");
    assert_eq!(c.call("stats reset\r\n"), "RESET\r\n");
    let s = snapshot(&mut c);
    for name in [
        "cmd_get",
        "cmd_set",
        "get_hits",
        "get_misses",
        "incr_hits",
        "delete_hits",
    ] {
        assert_eq!(s[name], 0, "{name} after stats reset");
    }
    assert_eq!(s["curr_items"], 1);
    assert_eq!(s["curr_connections"], curr0);
}

fn stats_counters_touch_expiry_errors(kind: Kind) {
    // A background sweep (memcached's LRU crawler, kvcached's expiry sweep) may reclaim the
    // expired item before the get sees it, which would make get_expired 0 now and then:
    // keep it off so the counters are deterministic.
    let args: &[&str] = match kind {
        Kind::Memcached => &["-o", "no_lru_crawler,no_lru_maintainer"],
        Kind::Kvcached => &["-o", "no_lru_crawler"],
    };
    let server = Server::start_verified(kind, args);
    let mut c = server.connect();
    let script = "set neg 0 -1 1\r\nx\r\nget neg\r\nset c 0 0 1\r\nx\r\ngets c\r\n\
                  cas c 0 0 1 999999\r\ny\r\ngat 0 nope c\r\ntouch c 0\r\ntouch nope 0\r\n\
                  gats 0 c\r\nincr c 1\r\ndecr c 1\r\nversion\r\n";
    c.send(script.as_bytes());
    let mut out = String::new();
    loop {
        let l = c.line();
        assert!(!l.is_empty(), "closed");
        if l.starts_with("VERSION ") {
            break;
        }
        out.push_str(&l);
    }
    let nonnum = "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("CLIENT_ERROR"))
            .count(),
        2,
        "{out:?} should end with two {nonnum:?}"
    );
    let stats: std::collections::HashMap<String, String> = c.stats("").into_iter().collect();
    let want = [
        // get neg (expired), gets c: gat/gats count as touches, not gets.
        ("cmd_get", "2"),
        ("get_hits", "1"),
        ("get_misses", "1"),
        ("get_expired", "1"),
        ("cmd_set", "3"),
        ("cas_badval", "1"),
        ("cas_hits", "0"),
        ("cas_misses", "0"),
        // gat (2 keys), touch x2, gats.
        ("cmd_touch", "5"),
        ("touch_hits", "3"),
        ("touch_misses", "2"),
        // A non-numeric value is neither a hit nor a miss.
        ("incr_hits", "0"),
        ("incr_misses", "0"),
        ("decr_hits", "0"),
        ("decr_misses", "0"),
    ];
    let bad: Vec<String> = want
        .iter()
        .filter(|(k, v)| stats.get(*k).map(String::as_str) != Some(*v))
        .map(|(k, v)| format!("{k}: want {v}, got {:?}", stats.get(*k)))
        .collect();
    assert!(bad.is_empty(), "{kind:?}: {}", bad.join(", "));
}

fn stats_subcommands(kind: Kind) {
    let server = Server::start_verified(kind, &["-c", "100", "-I", "2m"]);
    let mut c = server.connect();
    let settings = c.stats("settings");
    let find = |v: &[(String, String)], k: &str| {
        v.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{kind:?}: no {k}"))
    };
    assert_eq!(find(&settings, "maxbytes"), (64u64 << 20).to_string());
    assert_eq!(find(&settings, "maxconns"), "100");
    assert_eq!(find(&settings, "tcpport"), server.port.to_string());
    assert_eq!(find(&settings, "item_size_max"), (2u64 << 20).to_string());
    assert_eq!(find(&settings, "cas_enabled"), "yes");
    assert_eq!(find(&settings, "evictions"), "on");
    assert_eq!(find(&settings, "flush_enabled"), "yes");
    assert_eq!(find(&settings, "idle_timeout"), "0");

    // stats items / slabs: present and non-empty once there is an item.
    assert_eq!(c.call("set a 0 0 5\r\nhello\r\n"), "STORED\r\n");
    let items = c.stats("items");
    assert!(
        items
            .iter()
            .any(|(k, v)| k.starts_with("items:") && k.ends_with(":number") && v == "1"),
        "{kind:?}: stats items {items:?}"
    );
    let slabs = c.stats("slabs");
    assert!(
        slabs.iter().any(|(k, _)| k == "active_slabs"),
        "{kind:?}: stats slabs {slabs:?}"
    );
    assert!(slabs.iter().any(|(k, _)| k == "total_malloced"));
    // stats conns: one entry per connection, with its state.
    let _d = server.connect();
    let conns = c.stats("conns");
    let addrs = conns.iter().filter(|(k, _)| k.ends_with(":addr")).count();
    assert!(addrs >= 2, "{kind:?}: stats conns {conns:?}");
    assert!(conns.iter().any(|(k, _)| k.ends_with(":state")));
    // Unknown group and reset.
    let rows = vec![
        r("stats bogus\r\n", "ERROR\r\n"),
        r("stats reset\r\n", "RESET\r\n"),
    ];
    run_rows(&server, &rows);
}

// ---------------------------------------------------------------------------------------------
// Limits

fn object_too_large(kind: Kind) {
    let server = Server::start_verified(kind, &["-I", "1m"]);
    let mut c = server.connect();
    let big = 1_100_000;
    let data = vec![b'd'; big];
    assert_eq!(c.call("set a 0 0 1\r\nx\r\n"), "STORED\r\n");
    for cmd in ["set", "add", "replace", "append", "prepend"] {
        let mut req = format!("{cmd} a 0 0 {big}\r\n").into_bytes();
        req.extend_from_slice(&data);
        req.extend_from_slice(b"\r\nget b\r\n");
        c.send(&req);
        assert_eq!(
            c.line(),
            "SERVER_ERROR object too large for cache\r\n",
            "{kind:?} {cmd}"
        );
        // The data block was swallowed: the next command is answered.
        assert_eq!(c.line(), "END\r\n", "{kind:?} {cmd}: data not swallowed");
        if cmd == "set" {
            // A failed set removes the old value (no stale data).
            assert_eq!(
                c.call("get a\r\n"),
                "END\r\n",
                "{kind:?}: set left the old value"
            );
            assert_eq!(c.call("set a 0 0 1\r\nx\r\n"), "STORED\r\n");
        }
    }
    // Only set removes it.
    assert_eq!(c.call("get a\r\n"), "VALUE a 0 1\r\n");
    c.until("END\r\n");
    assert_eq!(c.stat("store_too_large").as_deref(), Some("5"));
    // memcached counts a set when its item is allocated: the too-large ones are not.
    assert_eq!(c.stat("cmd_set").as_deref(), Some("2"), "{kind:?}");
    // Just under the limit is fine.
    let ok = 1_000_000;
    let mut req = format!("set ok 0 0 {ok}\r\n").into_bytes();
    req.extend(std::iter::repeat_n(b'o', ok));
    req.extend_from_slice(b"\r\n");
    c.send(&req);
    assert_eq!(c.line(), "STORED\r\n");
    // A declared size far beyond the limit: refused, the data swallowed. (memcached sends
    // the error only after swallowing, so send everything before reading.)
    let mut req = b"set huge 0 0 5000000\r\n".to_vec();
    req.extend(std::iter::repeat_n(b'h', 5_000_000));
    req.extend_from_slice(b"\r\nget ok\r\n");
    c.send(&req);
    assert_eq!(c.line(), "SERVER_ERROR object too large for cache\r\n");
    assert_eq!(c.line(), format!("VALUE ok 0 {ok}\r\n"));
}

fn item_size_limit_includes_overhead(kind: Kind) {
    // -I bounds the whole item (header, key, value), not just the value: memcached refuses a
    // value of exactly -I bytes (with a 1-byte key it accepts up to -I minus about 60).
    let server = Server::start_verified(kind, &["-I", "1m"]);
    let mut c = server.connect();
    for (len, want) in [
        ((1 << 20) - 100, "STORED\r\n"),
        (1 << 20, "SERVER_ERROR object too large for cache\r\n"),
        ((1 << 20) - 8, "SERVER_ERROR object too large for cache\r\n"),
    ] {
        let mut req = format!("set k 0 0 {len}\r\n").into_bytes();
        req.extend(std::iter::repeat_n(b'x', len));
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        assert_eq!(c.line(), want, "{kind:?}: a {len}-byte value with -I 1m");
    }
}

fn out_of_memory_no_evict(kind: Kind) {
    let server = Server::start_verified(kind, &["-M", "-m", "2"]);
    let mut c = server.connect();
    let size = 50_000;
    let value = vec![b'v'; size];
    let mut stored = 0;
    let mut last = String::new();
    for i in 0..400 {
        let mut req = format!("set key{i} 0 0 {size}\r\n").into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        last = c.line();
        if last != "STORED\r\n" {
            break;
        }
        stored += 1;
    }
    assert_eq!(
        last, "SERVER_ERROR out of memory storing object\r\n",
        "{kind:?}: 400 x 50 KB into -m 2 -M"
    );
    assert!(stored >= 5, "{kind:?}: only {stored} items fit in 2 MB");
    // Nothing was evicted: the first item is still there, and the server still answers.
    c.send(b"get key0\r\n");
    assert_eq!(c.line(), format!("VALUE key0 0 {size}\r\n"));
    c.exact(size + 2);
    assert_eq!(c.line(), "END\r\n");
    assert_eq!(c.stat("evictions").as_deref(), Some("0"));
    // Deleting makes room again.
    for i in 0..stored {
        assert_eq!(c.call(&format!("delete key{i}\r\n")), "DELETED\r\n");
    }
    let mut req = format!("set again 0 0 {size}\r\n").into_bytes();
    req.extend_from_slice(&value);
    req.extend_from_slice(b"\r\n");
    c.send(&req);
    assert_eq!(c.line(), "STORED\r\n");
}

/// memcached changes a touched item's expiry in place, so touch and gat work in a full
/// `-M` cache; kvcached rewrites the item, into memory compaction frees.
fn touch_with_full_memory_no_evict(kind: Kind) {
    let server = Server::start_verified(kind, &["-M", "-m", "2"]);
    let mut c = server.connect();
    let value = vec![b'v'; 100];
    let mut stored = 0;
    'fill: for batch in 0..200 {
        let mut req = Vec::new();
        for i in 0..500 {
            req.extend_from_slice(format!("set k{batch}-{i} 0 1000 100\r\n").as_bytes());
            req.extend_from_slice(&value);
            req.extend_from_slice(b"\r\n");
        }
        c.send(&req);
        let mut full = false;
        for _ in 0..500 {
            match c.line().as_str() {
                "STORED\r\n" if !full => stored += 1,
                "SERVER_ERROR out of memory storing object\r\n" => full = true,
                "STORED\r\n" => {}
                other => panic!("{kind:?}: {other:?}"),
            }
        }
        if full {
            break 'fill;
        }
    }
    assert!(stored > 5_000, "{kind:?}: {stored} items in 2 MB");
    // Full: every item touched twice, then read with gat, in pipelined batches.
    let keys: Vec<String> = (0..stored)
        .map(|n| format!("k{}-{}", n / 500, n % 500))
        .collect();
    for (round, verb) in ["touch", "touch", "gat"].iter().enumerate() {
        for chunk in keys.chunks(500) {
            let mut req = String::new();
            for k in chunk {
                match *verb {
                    "gat" => req.push_str(&format!("gat {} {k}\r\n", 2000 + round)),
                    _ => req.push_str(&format!("touch {k} {}\r\n", 2000 + round)),
                }
            }
            c.send(req.as_bytes());
            for k in chunk {
                if *verb == "gat" {
                    assert_eq!(
                        c.line(),
                        format!("VALUE {k} 0 100\r\n"),
                        "{kind:?}: gat {k}"
                    );
                    c.exact(102);
                    assert_eq!(c.line(), "END\r\n");
                } else {
                    assert_eq!(c.line(), "TOUCHED\r\n", "{kind:?}: touch {k} round {round}");
                }
            }
        }
    }
    assert_eq!(c.stat("evictions").as_deref(), Some("0"), "{kind:?}");
    assert_eq!(c.stat("curr_items"), Some(stored.to_string()), "{kind:?}");
}

// ---------------------------------------------------------------------------------------------
// Pipelining and large replies

fn pipelined_in_one_write(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    let n = 500;
    let mut req = String::new();
    let mut want = String::new();
    for i in 0..n {
        req.push_str(&format!(
            "set p{i} {i} 0 {}\r\n{i}\r\n",
            i.to_string().len()
        ));
        want.push_str("STORED\r\n");
        req.push_str(&format!("get p{i} p{}\r\n", i + 1));
        want.push_str(&format!(
            "VALUE p{i} {i} {}\r\n{i}\r\nEND\r\n",
            i.to_string().len()
        ));
        req.push_str(&format!("incr p{i} 1\r\n"));
        want.push_str(&format!("{}\r\n", i + 1));
        if i % 7 == 0 {
            req.push_str(&format!("delete p{i} noreply\r\nbogus\r\n"));
            want.push_str("ERROR\r\n");
        }
    }
    req.push_str("version\r\n");
    // Read concurrently: the request is bigger than socket buffers may hold.
    let mut w = c.stream().try_clone().expect("clone");
    let writer = std::thread::spawn(move || w.write_all(req.as_bytes()));
    let mut got = String::new();
    loop {
        let l = c.line();
        assert!(!l.is_empty(), "closed after {} bytes", got.len());
        if l.starts_with("VERSION ") {
            break;
        }
        got.push_str(&l);
    }
    writer.join().unwrap().expect("write");
    if got != want {
        let at = got
            .bytes()
            .zip(want.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{kind:?}: pipelined replies differ at byte {at}: want {:?} got {:?}",
            &want[at.saturating_sub(40)..(at + 80).min(want.len())],
            &got[at.saturating_sub(40)..(at + 80).min(got.len())]
        );
    }
}

fn large_multiget(kind: Kind) {
    let server = Server::start_verified(kind, &["-I", "1m", "-m", "64"]);
    let mut c = server.connect();
    let n = 100;
    let size = 100_000;
    let value_of =
        |i: usize| -> Vec<u8> { (0..size).map(|j| b'a' + ((i * 7 + j) % 26) as u8).collect() };
    for i in 0..n {
        let mut req = format!("set big{i} {i} 0 {size}\r\n").into_bytes();
        req.extend_from_slice(&value_of(i));
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        assert_eq!(c.line(), "STORED\r\n");
    }
    let keys: Vec<String> = (0..n).map(|i| format!("big{i}")).collect();
    // Twice on one connection, with a missing key in the middle, and a command after it.
    c.send(
        format!(
            "get {} missing {}\r\nget big0\r\n",
            keys.join(" "),
            keys.join(" ")
        )
        .as_bytes(),
    );
    for pass in 0..2 {
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(c.line(), format!("VALUE {k} {i} {size}\r\n"), "pass {pass}");
            let data = c.exact(size + 2);
            assert!(
                data[..size] == value_of(i)[..],
                "{kind:?}: value {k} corrupted"
            );
            assert_eq!(&data[size..], b"\r\n");
        }
    }
    assert_eq!(c.line(), "END\r\n");
    assert_eq!(c.line(), format!("VALUE big0 0 {size}\r\n"));
    c.exact(size + 2);
    assert_eq!(c.line(), "END\r\n");
}

// ---------------------------------------------------------------------------------------------
// Expiry

fn expiry_without_clock(kind: Kind) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let past = now - 3600;
    let future = now + 3600;
    let rows = vec![
        // Negative exptime: stored, but immediately expired.
        r("set neg 0 -1 1\r\nx\r\n", "STORED\r\n"),
        r("get neg\r\n", "END\r\n"),
        r("add neg 0 0 1\r\ny\r\n", "STORED\r\n"),
        r("get neg\r\n", "VALUE neg 0 1\r\ny\r\nEND\r\n"),
        // An absolute time (more than 30 days) in the past.
        r(format!("set past 0 {past} 1\r\nx\r\n"), "STORED\r\n"),
        r("get past\r\n", "END\r\n"),
        r("replace past 0 0 1\r\nx\r\n", "NOT_STORED\r\n"),
        // An absolute time in the future, and a long relative one.
        r(format!("set fut 0 {future} 1\r\nf\r\n"), "STORED\r\n"),
        r("get fut\r\n", "VALUE fut 0 1\r\nf\r\nEND\r\n"),
        r("set rel 0 2592000 1\r\nr\r\n", "STORED\r\n"),
        r("get rel\r\n", "VALUE rel 0 1\r\nr\r\nEND\r\n"),
        // touch / gat into the past expires.
        r(format!("touch fut {past}\r\n"), "TOUCHED\r\n"),
        r("get fut\r\n", "END\r\n"),
        r(
            format!("gat {past} rel\r\n"),
            "VALUE rel 0 1\r\nr\r\nEND\r\n",
        ),
        r("get rel\r\n", "END\r\n"),
        // Expired items are misses for incr/append/touch/delete too.
        r("set n 0 -1 1\r\n1\r\n", "STORED\r\n"),
        r("incr n 1\r\n", "NOT_FOUND\r\n"),
        r("append n 0 0 1\r\n1\r\n", "NOT_STORED\r\n"),
        r("touch n 10\r\n", "NOT_FOUND\r\n"),
        r("delete n\r\n", "NOT_FOUND\r\n"),
    ];
    run_table(kind, &[], &rows);
}

/// kvcached only: positive TTLs with the test clock (`-o debug_clock` + `debugtime <secs>`).
#[test]
fn expiry_with_debug_clock_kvcached() {
    let rows = vec![
        r("set t10 0 10 1\r\na\r\n", "STORED\r\n"),
        r("set t100 0 100 1\r\nb\r\n", "STORED\r\n"),
        r("set forever 0 0 1\r\nc\r\n", "STORED\r\n"),
        r("set touched 0 10 1\r\nd\r\n", "STORED\r\n"),
        r("set gatted 0 10 1\r\ne\r\n", "STORED\r\n"),
        r("set persist 0 10 1\r\nf\r\n", "STORED\r\n"),
        r("get t10\r\n", "VALUE t10 0 1\r\na\r\nEND\r\n"),
        r("debugtime 5\r\n", "OK\r\n"),
        r("get t10\r\n", "VALUE t10 0 1\r\na\r\nEND\r\n"),
        r("touch touched 100\r\n", "TOUCHED\r\n"),
        r("gat 100 gatted\r\n", "VALUE gatted 0 1\r\ne\r\nEND\r\n"),
        // touch 0 makes it permanent.
        r("touch persist 0\r\n", "TOUCHED\r\n"),
        r("debugtime 6\r\n", "OK\r\n"),
        // t = 11
        r("get t10\r\n", "END\r\n"),
        r("add t10 0 0 1\r\nz\r\n", "STORED\r\n"),
        r(
            "get t100 forever touched gatted persist\r\n",
            "VALUE t100 0 1\r\nb\r\nVALUE forever 0 1\r\nc\r\nVALUE touched 0 1\r\nd\r\n\
             VALUE gatted 0 1\r\ne\r\nVALUE persist 0 1\r\nf\r\nEND\r\n",
        ),
        r("debugtime 100\r\n", "OK\r\n"),
        // t = 111
        r(
            "get t100 forever touched gatted persist t10\r\n",
            "VALUE forever 0 1\r\nc\r\nVALUE persist 0 1\r\nf\r\nVALUE t10 0 1\r\nz\r\nEND\r\n",
        ),
        // An incr keeps the TTL.
        r("set n 0 10 1\r\n1\r\n", "STORED\r\n"),
        r("incr n 1\r\n", "2\r\n"),
        r("debugtime 11\r\n", "OK\r\n"),
        r("get n\r\n", "END\r\n"),
    ];
    run_table(Kind::Kvcached, &["-o", "debug_clock"], &rows);
}

/// kvcached only: `flush_all <delay>` with the test clock.
#[test]
fn delayed_flush_with_debug_clock_kvcached() {
    let rows = vec![
        r("set a 0 0 1\r\na\r\n", "STORED\r\n"),
        r("flush_all 10\r\n", "OK\r\n"),
        r("set b 0 0 1\r\nb\r\n", "STORED\r\n"),
        r(
            "get a b\r\n",
            "VALUE a 0 1\r\na\r\nVALUE b 0 1\r\nb\r\nEND\r\n",
        ),
        r("debugtime 5\r\n", "OK\r\n"),
        r("get a\r\n", "VALUE a 0 1\r\na\r\nEND\r\n"),
        r("debugtime 6\r\n", "OK\r\n"),
        // Past the deadline: everything stored before it is gone.
        r("get a b\r\n", "END\r\n"),
        r("set c 0 0 1\r\nc\r\n", "STORED\r\n"),
        r("debugtime 1\r\n", "OK\r\n"),
        r("get c\r\n", "VALUE c 0 1\r\nc\r\nEND\r\n"),
        r("flush_all 5 noreply\r\n", ""),
        r("debugtime 6\r\n", "OK\r\n"),
        r("get c\r\n", "END\r\n"),
    ];
    run_table(Kind::Kvcached, &["-o", "debug_clock"], &rows);
}

/// `debugtime` is not a command without `-o debug_clock`.
#[test]
fn debugtime_needs_debug_clock_kvcached() {
    let bad = "ERROR\r\n";
    run_table(Kind::Kvcached, &[], &[r("debugtime 100\r\n", bad)]);
}

// ---------------------------------------------------------------------------------------------
// Concurrency

fn cas_race_two_clients(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut setup = server.connect();
    for round in 0..20 {
        assert_eq!(setup.call("set race 0 0 1\r\n0\r\n"), "STORED\r\n");
        let barrier = Arc::new(Barrier::new(2));
        let handles: Vec<_> = (0..2)
            .map(|who| {
                let mut c = server.connect();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    c.send(b"gets race\r\n");
                    let head = c.line();
                    let unique = parse_gets_header(&head, "race", 0, 1);
                    c.until("END\r\n");
                    barrier.wait();
                    c.call(&format!("cas race 0 0 1 {unique}\r\n{who}\r\n"))
                })
            })
            .collect();
        let mut replies: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        replies.sort();
        assert_eq!(
            replies,
            vec!["EXISTS\r\n".to_string(), "STORED\r\n".to_string()],
            "{kind:?} round {round}"
        );
    }
}

fn concurrent_incr(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    assert_eq!(c.call("set ctr 0 0 1\r\n0\r\n"), "STORED\r\n");
    let threads = 4;
    let per = 500;
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let mut c = server.connect();
            std::thread::spawn(move || {
                // In batches of 50 pipelined increments.
                let mut last = 0u64;
                for _ in 0..per / 50 {
                    c.send("incr ctr 1\r\n".repeat(50).as_bytes());
                    for _ in 0..50 {
                        let v: u64 = c.line().trim_end().parse().expect("incr reply");
                        assert!(v > last, "values seen by one client must increase");
                        last = v;
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        c.call("get ctr\r\n"),
        format!("VALUE ctr 0 {}\r\n", (threads * per).to_string().len())
    );
    assert_eq!(c.line(), format!("{}\r\n", threads * per));
}

// ---------------------------------------------------------------------------------------------
// More edges

fn append_beyond_item_size_max(kind: Kind) {
    // append/prepend whose result would exceed -I: NOT_STORED, the old value kept (not a
    // SERVER_ERROR, and not counted as store_too_large).
    let server = Server::start_verified(kind, &["-I", "1m"]);
    let mut c = server.connect();
    let size = 700_000;
    let value = vec![b'a'; size];
    let mut set = format!("set a 3 0 {size}\r\n").into_bytes();
    set.extend_from_slice(&value);
    set.extend_from_slice(b"\r\n");
    c.send(&set);
    assert_eq!(c.line(), "STORED\r\n");
    for cmd in ["append", "prepend"] {
        let mut req = format!("{cmd} a 0 0 {size}\r\n").into_bytes();
        req.extend(std::iter::repeat_n(b'z', size));
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        assert_eq!(c.line(), "NOT_STORED\r\n", "{kind:?}: {cmd} beyond -I");
    }
    c.send(b"get a\r\n");
    assert_eq!(c.line(), format!("VALUE a 3 {size}\r\n"));
    let data = c.exact(size + 2);
    assert!(data[..size].iter().all(|&b| b == b'a'), "old value changed");
    assert_eq!(c.line(), "END\r\n");
    assert_eq!(c.stat("store_too_large").as_deref(), Some("0"));
}

fn binary_safe_values(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    // Every byte value, including NUL, CR, LF and "\r\nEND\r\n" inside the value.
    let mut value: Vec<u8> = (0..=255u8).collect();
    value.extend_from_slice(b"\r\nEND\r\nVALUE x 0 1\r\n\r\n");
    value.extend((0..=255u8).rev());
    let mut req = format!("set bin 65535 0 {}\r\n", value.len()).into_bytes();
    req.extend_from_slice(&value);
    req.extend_from_slice(b"\r\nget bin\r\n");
    c.send(&req);
    assert_eq!(c.line(), "STORED\r\n");
    assert_eq!(c.line(), format!("VALUE bin 65535 {}\r\n", value.len()));
    assert_eq!(c.exact(value.len() + 2), [&value[..], b"\r\n"].concat());
    assert_eq!(c.line(), "END\r\n");
    // append/prepend keep it binary.
    c.send(b"append bin 0 0 3\r\n\x00\r\n\r\nprepend bin 0 0 1\r\n\xff\r\ngets bin\r\n");
    assert_eq!(c.line(), "STORED\r\n");
    assert_eq!(c.line(), "STORED\r\n");
    let n = value.len() + 4;
    let head = c.line();
    parse_gets_header(&head, "bin", 65535, n);
    let want = [&b"\xff"[..], &value[..], b"\x00\r\n", b"\r\n"].concat();
    assert_eq!(c.exact(n + 2), want);
    assert_eq!(c.line(), "END\r\n");
}

fn get_with_ten_thousand_keys(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let mut c = server.connect();
    for i in (0..10_000).step_by(1000) {
        assert_eq!(
            c.call(&format!(
                "set key{i} {i} 0 {}\r\n{i}\r\n",
                i.to_string().len()
            )),
            "STORED\r\n"
        );
    }
    let keys: Vec<String> = (0..10_000).map(|i| format!("key{i}")).collect();
    c.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    let mut want = String::new();
    for i in (0..10_000).step_by(1000) {
        want.push_str(&format!(
            "VALUE key{i} {i} {}\r\n{i}\r\n",
            i.to_string().len()
        ));
    }
    want.push_str("END\r\n");
    assert_eq!(c.until("END\r\n"), want);
    assert_eq!(c.stat("get_misses").as_deref(), Some("9990"));
}

fn cas_disabled(kind: Kind) {
    // -C: no CAS uniques; gets reports 0.
    let server = Server::start_verified(kind, &["-C"]);
    let mut c = server.connect();
    assert_eq!(c.call("set a 0 0 1\r\nx\r\n"), "STORED\r\n");
    c.send(b"gets a\r\n");
    assert_eq!(c.until("END\r\n"), "VALUE a 0 1 0\r\nx\r\nEND\r\n");
    let settings = c.stats("settings");
    assert!(settings
        .iter()
        .any(|(k, v)| k == "cas_enabled" && v == "no"));
}

fn evicts_when_full(kind: Kind) {
    // Without -M a full cache evicts: every set succeeds, old items go, memory stays bounded.
    let server = Server::start_verified(kind, &["-m", "4"]);
    let mut c = server.connect();
    let size = 50_000;
    let value = vec![b'v'; size];
    let n = 400; // 20 MB through a 4 MB cache
    for i in 0..n {
        let mut req = format!("set key{i} 0 0 {size}\r\n").into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        assert_eq!(
            c.line(),
            "STORED\r\n",
            "{kind:?}: set {i} into a full cache"
        );
    }
    let evictions: u64 = c.stat("evictions").unwrap().parse().unwrap();
    assert!(evictions > 0, "{kind:?}: no evictions");
    let items: u64 = c.stat("curr_items").unwrap().parse().unwrap();
    assert!(
        items < 100 && items + evictions >= n,
        "{kind:?}: {items} items and {evictions} evictions after {n} sets"
    );
    let bytes: u64 = c.stat("bytes").unwrap().parse().unwrap();
    assert!(bytes <= 4 << 20, "{kind:?}: {bytes} bytes in a 4 MB cache");
    // The newest item is there, the oldest is gone.
    c.send(format!("get key{} key0\r\n", n - 1).as_bytes());
    assert_eq!(c.line(), format!("VALUE key{} 0 {size}\r\n", n - 1));
    c.exact(size + 2);
    assert_eq!(c.line(), "END\r\n");
    assert!(
        server.rss_kib() < 64 * 1024,
        "{kind:?}: RSS for a 4 MB cache"
    );
}

fn recently_read_items_survive_eviction(kind: Kind) {
    // An LRU cache: 20 MB of sets through a 4 MB cache, reading key0 and key1 every other
    // set. They stay; key2, never read, is evicted. memcached moves an item read in its cold
    // LRU out of it in its LRU maintainer thread, after the read has been answered: whether
    // key0 survives there depends on that thread keeping up with the sets (it lost key0 on a
    // loaded machine, twice, reading every fifth and every other set), which a test must not
    // depend on. So memcached is held only to what does not: the key never read is evicted
    // and the newest is there. kvcached marks a read before answering it.
    let server = Server::start_verified(kind, &["-m", "4"]);
    let mut c = server.connect();
    let size = 50_000;
    let value = vec![b'v'; size];
    let get = |c: &mut Client, k: &str| -> bool {
        c.send(format!("get {k}\r\n").as_bytes());
        let l = c.line();
        if l == "END\r\n" {
            return false;
        }
        assert_eq!(l, format!("VALUE {k} 0 {size}\r\n"));
        c.exact(size + 2);
        assert_eq!(c.line(), "END\r\n");
        true
    };
    for i in 0..400 {
        let mut req = format!("set key{i} 0 0 {size}\r\n").into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        assert_eq!(c.line(), "STORED\r\n");
        if i % 2 == 0 {
            get(&mut c, "key0");
            get(&mut c, "key1");
        }
    }
    let (k0, k1, k2) = (
        get(&mut c, "key0"),
        get(&mut c, "key1"),
        get(&mut c, "key2"),
    );
    let kept = k0 && k1 || kind == Kind::Memcached;
    assert!(
        kept && !k2,
        "{kind:?}: after 400 sets into -m 4: key0 (read often) present={k0}, key1 (read often) \
         present={k1}, key2 (never read) present={k2}"
    );
    assert!(get(&mut c, "key399"));
}

/// Several clients, each with its own keys, send long pipelines of mixed commands cut into
/// random-sized writes (splitting lines and data blocks anywhere); each checks every reply
/// against a model of its own keys.
fn chunked_pipelines_from_many_clients(kind: Kind) {
    let server = Server::start_verified(kind, &[]);
    let handles: Vec<_> = (0..4u64)
        .map(|client| {
            let mut c = server.connect();
            std::thread::spawn(move || {
                let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (client + 1));
                let mut model: std::collections::HashMap<String, (u32, Vec<u8>)> =
                    Default::default();
                for round in 0..10 {
                    let mut req = Vec::new();
                    let mut want = Vec::new();
                    for _ in 0..200 {
                        let key = format!("c{client}k{}", rng.below(20));
                        let op = rng.below(9);
                        let flags = rng.below(1000) as u32;
                        let len = rng.below(3000) as usize;
                        let data: Vec<u8> = (0..len).map(|_| b'a' + rng.below(26) as u8).collect();
                        let line = |cmd: &str| format!("{cmd} {key} {flags} 0 {len}\r\n");
                        match op {
                            0 | 1 => {
                                req.extend(line("set").bytes());
                                model.insert(key.clone(), (flags, data.clone()));
                                want.extend(b"STORED\r\n");
                            }
                            2 => {
                                req.extend(line("add").bytes());
                                if model.contains_key(&key) {
                                    want.extend(b"NOT_STORED\r\n");
                                } else {
                                    model.insert(key.clone(), (flags, data.clone()));
                                    want.extend(b"STORED\r\n");
                                }
                            }
                            3 => {
                                req.extend(line("append").bytes());
                                match model.get_mut(&key) {
                                    Some((_, v)) => {
                                        v.extend_from_slice(&data);
                                        want.extend(b"STORED\r\n");
                                    }
                                    None => want.extend(b"NOT_STORED\r\n"),
                                }
                            }
                            4 => {
                                req.extend(format!("delete {key}\r\n").bytes());
                                if model.remove(&key).is_some() {
                                    want.extend(b"DELETED\r\n");
                                } else {
                                    want.extend(b"NOT_FOUND\r\n");
                                }
                                continue;
                            }
                            5 => {
                                let n = rng.below(1000);
                                req.extend(format!("set {key} 0 0 {}\r\n{n}\r\n", n.to_string().len()).bytes());
                                req.extend(format!("incr {key} 7\r\n").bytes());
                                want.extend(format!("STORED\r\n{}\r\n", n + 7).bytes());
                                // The value's length is that of n; "n+7" may be longer.
                                let v = (n + 7).to_string();
                                let stored_len = n.to_string().len().max(v.len());
                                let mut padded = v.into_bytes();
                                padded.resize(stored_len, b' ');
                                model.insert(key.clone(), (0, padded));
                                continue;
                            }
                            _ => {
                                let other = format!("c{client}k{}", rng.below(20));
                                req.extend(format!("get {key} {other}\r\n").bytes());
                                for k in [&key, &other] {
                                    if let Some((f, v)) = model.get(k) {
                                        want.extend(format!("VALUE {k} {f} {}\r\n", v.len()).bytes());
                                        want.extend_from_slice(v);
                                        want.extend(b"\r\n");
                                    }
                                }
                                want.extend(b"END\r\n");
                                continue;
                            }
                        }
                        req.extend_from_slice(&data);
                        req.extend(b"\r\n");
                    }
                    // Write in random pieces from a second thread while reading here.
                    let mut w = c.stream().try_clone().unwrap();
                    let seed = rng.next();
                    let writer = std::thread::spawn(move || {
                        let mut rng = XorShift(seed);
                        let mut at = 0;
                        while at < req.len() {
                            let n = (1 + rng.below(4000) as usize).min(req.len() - at);
                            w.write_all(&req[at..at + n]).expect("write");
                            at += n;
                        }
                    });
                    let got = c.exact(want.len());
                    writer.join().unwrap();
                    if got != want {
                        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
                        panic!(
                            "client {client} round {round}: replies differ at byte {at}:\n want {:?}\n  got {:?}",
                            String::from_utf8_lossy(&want[at.saturating_sub(60)..(at + 60).min(want.len())]),
                            String::from_utf8_lossy(&got[at.saturating_sub(60)..(at + 60).min(got.len())])
                        );
                    }
                }
                // Nothing extra was sent.
                assert!(c.call("version\r\n").starts_with("VERSION "));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// memcached stores items over 512 KiB in chunks and calls every chunked item non-numeric
/// for incr/decr, whatever it holds (found by the meta differential against the newest
/// memcached; 1.6.18 does the same).
#[test]
fn incr_on_a_chunked_size_value_is_non_numeric() {
    for kind in [Kind::Kvcached, Kind::Memcached] {
        let server = Server::start_verified(kind, &[]);
        let mut c = server.connect();
        let big = format!("54 {}", "x".repeat(600_000));
        let mut req = format!("set k 0 0 {}\r\n", big.len()).into_bytes();
        req.extend_from_slice(big.as_bytes());
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        assert_eq!(c.line(), "STORED\r\n", "{kind:?}");
        assert_eq!(
            c.call("incr k 5\r\n"),
            "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
            "{kind:?}"
        );
        assert_eq!(c.call("set j 0 0 5\r\n54 xx\r\n"), "STORED\r\n");
        assert_eq!(c.call("incr j 5\r\n"), "59\r\n", "{kind:?}");
    }
}
