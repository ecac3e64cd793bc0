//! The executors driven through a session without a socket ([`TestSession`]): request bytes
//! in, reply bytes out, one row per case, for what a client controls (good requests, bad
//! command lines, oversized values, bad data chunks, `noreply`, quiet meta commands, binary
//! protocol errors, authentication).

use std::ffi::OsString;

use kvproto::binary::{self as bin, opcode, Status};
use kvproto::client::binary as cbin;

use super::{request, stream, Dispatch, Kind};
use crate::exec::session::{BufferLimit, Ctx, Protocol, Session, Step};
use crate::exec::text;
use crate::setup::cli::{self, Action};
use crate::state::credentials::Auth;
use crate::state::shared::Shared;
use crate::state::stats::WorkerStats;

/// A server's shared state and one client's session, with no socket: what a client sends
/// goes through [`stream`] as a TCP connection's input would, and what it would read comes
/// back.
pub(crate) struct TestSession {
    pub shared: Shared,
    pub stats: WorkerStats,
    pub session: Session,
    /// Bytes sent and not yet consumed (an unfinished request).
    input: Vec<u8>,
    /// The session asked to close the connection.
    pub closed: bool,
}

impl TestSession {
    /// A server started with `args` (memcached's command line), and a client of it.
    pub fn new(args: &[&str]) -> TestSession {
        let config = match cli::parse(args.iter().map(OsString::from)) {
            Ok(Action::Run { config, .. }) => *config,
            other => panic!("{args:?} does not run a server: {other:?}"),
        };
        let auth = Auth::new(&config).expect("credentials");
        let engine = crate::server::build_engine(&config).expect("the engine");
        TestSession {
            shared: Shared::new(config, engine, auth, Vec::new(), None),
            stats: WorkerStats::default(),
            session: Session::for_stream(),
            input: Vec::new(),
            closed: false,
        }
    }

    /// Run `f` with this session's executor context.
    pub fn with_ctx<R>(&mut self, f: impl FnOnce(&mut Ctx<'_>, &mut Session) -> R) -> R {
        let mut scratch = Vec::new();
        let mut ctx = Ctx {
            shared: &self.shared,
            stats: &self.stats,
            scratch: &mut scratch,
            now: self.shared.clock.now(),
            buffers: BufferLimit::default(),
            worker: 0,
            cfd: -1,
        };
        f(&mut ctx, &mut self.session)
    }

    /// Send `bytes` as the client; the replies it reads back, once every whole request
    /// sent so far has run (the client reads as the replies come, so a multiget that
    /// pauses at the high-water mark goes on).
    pub fn send(&mut self, bytes: &[u8]) -> Vec<u8> {
        assert!(!self.closed, "sent on a closed connection");
        self.input.extend_from_slice(bytes);
        let mut replies = Vec::new();
        loop {
            let input = std::mem::take(&mut self.input);
            let mut budget = usize::MAX;
            let batch = self.with_ctx(|ctx, s| stream(ctx, s, &input, &mut budget));
            self.input = input;
            self.input.drain(..batch.used);
            let s = &mut self.session;
            replies.extend_from_slice(&s.out[s.out_pos..]);
            s.out.clear();
            s.out_pos = 0;
            if batch.step == Step::Close || s.close_after_write {
                self.closed = true;
                return replies;
            }
            if batch.step != Step::Pause && (batch.used == 0 || self.input.is_empty()) {
                return replies;
            }
        }
    }
}

/// One case: the server's command line, what the client sends, what it reads back, and
/// whether the server closes the connection after it.
struct Row {
    name: &'static str,
    args: &'static [&'static str],
    send: Vec<u8>,
    reply: Vec<u8>,
    closes: bool,
}

fn row(name: &'static str, send: &[u8], reply: &[u8]) -> Row {
    Row {
        name,
        args: &[],
        send: send.to_vec(),
        reply: reply.to_vec(),
        closes: false,
    }
}

impl Row {
    fn args(mut self, args: &'static [&'static str]) -> Row {
        self.args = args;
        self
    }

    fn closes(mut self) -> Row {
        self.closes = true;
        self
    }
}

/// Run each row on a new server; the failing rows are named, with both replies.
fn check(rows: Vec<Row>) {
    let mut failed = Vec::new();
    for r in rows {
        let mut t = TestSession::new(r.args);
        let got = t.send(&r.send);
        if got != r.reply || t.closed != r.closes {
            failed.push(format!(
                "{}:\n   got {:?} (closed: {})\n  want {:?} (closed: {})",
                r.name,
                got.escape_ascii().to_string(),
                t.closed,
                r.reply.escape_ascii().to_string(),
                r.closes
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn text_requests_and_the_errors_a_client_causes() {
    let big = vec![b'x'; 2048];
    let mut oversized = b"set big 0 0 2048\r\n".to_vec();
    oversized.extend_from_slice(&big);
    oversized.extend_from_slice(b"\r\nget big\r\nversion\r\n");
    let version = format!("VERSION {}\r\n", crate::setup::VERSION);
    let mut after_oversized = b"SERVER_ERROR object too large for cache\r\nEND\r\n".to_vec();
    after_oversized.extend_from_slice(version.as_bytes());
    check(vec![
        row(
            "set then get",
            b"set k 5 0 5\r\nhello\r\nget k\r\ngets nope\r\n",
            b"STORED\r\nVALUE k 5 5\r\nhello\r\nEND\r\nEND\r\n",
        ),
        row("an unknown command", b"bogus\r\n", b"ERROR\r\n"),
        row(
            "a storage line without its length",
            b"set k 0 0\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        row(
            "a bad length",
            b"set k 0 0 abc\r\nget k\r\n",
            b"CLIENT_ERROR bad command line format\r\nEND\r\n",
        ),
        row(
            "a data block longer than announced",
            b"set k 0 0 3\r\nabcde\r\nget k\r\n",
            b"CLIENT_ERROR bad data chunk\r\nCLIENT_ERROR bad command line format\r\nEND\r\n",
        ),
        row(
            "a value over -I: the error, its data swallowed",
            &oversized,
            &after_oversized,
        )
        .args(&["-I", "1k"]),
        row(
            "a key over 250 bytes",
            format!("get {}\r\n", "k".repeat(251)).as_bytes(),
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        row(
            "noreply silences replies, errors included, not the effect",
            b"set k 0 0 1 noreply\r\na\r\nincr k 1 noreply\r\nget k\r\n",
            b"VALUE k 0 1\r\na\r\nEND\r\n",
        ),
        row(
            "noreply on a parse error is still an error",
            b"set k 0 0 x noreply\r\nversion\r\n",
            format!("CLIENT_ERROR bad command line format\r\n{version}").as_bytes(),
        ),
        row(
            "incr of a non-number",
            b"set k 0 0 1\r\na\r\nincr k 1\r\n",
            b"STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        ),
        row(
            "flush_all refused by -F",
            b"flush_all\r\n",
            b"CLIENT_ERROR flush_all not allowed\r\n",
        )
        .args(&["-F"]),
        row(
            "shutdown refused without -A",
            b"shutdown\r\n",
            b"SERVER_ERROR: shutdown not enabled\r\n",
        ),
        row(
            "quit: earlier replies are written, then it closes",
            b"set k 0 0 1\r\na\r\nquit\r\nget k\r\n",
            b"STORED\r\n",
        )
        .closes(),
        row("an unfinished request waits", b"set k 0 0 5\r\nhel", b""),
    ]);
}

#[test]
fn meta_requests_quiet_mode_and_errors() {
    check(vec![
        row(
            "quiet meta: only hits and the no-op answer",
            b"ms k 1 q\r\na\r\nmg k v q\r\nmg miss v q\r\nmd miss q\r\nmn\r\n",
            b"VA 1\r\na\r\nNF\r\nMN\r\n",
        ),
        row(
            "meta set and get with flags",
            b"ms k 2 F7 T0\r\nhi\r\nmg k v f\r\n",
            b"HD\r\nVA 2 f7\r\nhi\r\n",
        ),
        row("a meta miss", b"mg nope v\r\n", b"EN\r\n"),
        row(
            "a bad meta flag",
            b"mg k !\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        row(
            "a meta set with a bad data chunk",
            b"ms k 2\r\nabcd\r\nmn\r\n",
            b"CLIENT_ERROR bad data chunk\r\nCLIENT_ERROR bad command line format\r\nMN\r\n",
        ),
    ]);
}

/// A binary request.
fn breq(op: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    let mut b = Vec::new();
    cbin::request(&mut b, op, key, extras, value, opaque);
    b
}

/// A binary error response as memcached writes it.
fn berr(op: u8, opaque: u32, status: Status) -> Vec<u8> {
    let mut b = Vec::new();
    bin::write_error(&mut b, op, opaque, status);
    b
}

#[test]
fn binary_requests_and_protocol_errors() {
    let mut set = Vec::new();
    cbin::set(&mut set, b"k", 3, 0, b"v", 1);
    let mut get_quiet_miss_then_noop = Vec::new();
    cbin::get(&mut get_quiet_miss_then_noop, b"nope", true, 2);
    cbin::noop(&mut get_quiet_miss_then_noop, 3);
    let mut noop_reply = Vec::new();
    bin::write_ok(&mut noop_reply, opcode::NOOP, 3, 0);
    let mut bad_magic = breq(opcode::NOOP, b"", &[], &[], 4);
    bad_magic.extend_from_slice(&[0x42; 24]);
    let mut bad_magic_reply = Vec::new();
    bin::write_ok(&mut bad_magic_reply, opcode::NOOP, 4, 0);
    check(vec![
        row(
            "a get miss",
            &breq(opcode::GET, b"nope", &[], &[], 7),
            &berr(opcode::GET, 7, Status::KeyNotFound),
        ),
        row(
            "a quiet miss is silent; noop answers",
            &get_quiet_miss_then_noop,
            &noop_reply,
        ),
        row(
            "an unknown opcode",
            &breq(0x7f, b"", &[], &[], 9),
            &berr(0x7f, 9, Status::UnknownCommand),
        ),
        row(
            "a get with extras it must not have",
            &breq(opcode::GET, b"k", &[0; 4], &[], 5),
            &berr(opcode::GET, 5, Status::InvalidArguments),
        )
        .closes(),
        row(
            "a set without its extras",
            &breq(opcode::SET, b"k", &[], b"v", 6),
            &berr(opcode::SET, 6, Status::InvalidArguments),
        )
        .closes(),
        row(
            "a request that is not binary after a binary one: closed",
            &bad_magic,
            &bad_magic_reply,
        )
        .closes(),
        row(
            "a value over -I",
            &breq(opcode::SET, b"k", &[0; 8], &[b'x'; 2048], 8),
            &berr(opcode::SET, 8, Status::TooLarge),
        )
        .args(&["-I", "1k"]),
        row(
            "-S: a request before authenticating is refused and closed",
            &set,
            &berr(opcode::SET, 1, Status::AuthError),
        )
        .args(&["-S"])
        .closes(),
    ]);
}

#[test]
fn the_protocol_is_chosen_by_b_and_the_first_byte() {
    let mut t = TestSession::new(&[]);
    t.send(b"version\r\n");
    assert_eq!(t.session.protocol, Some(Protocol::Text));
    let mut t = TestSession::new(&[]);
    t.send(&breq(opcode::NOOP, b"", &[], &[], 0));
    assert_eq!(t.session.protocol, Some(Protocol::Binary));
    // -B ascii: a binary request is text like any other (a noop's opcode is a line end).
    let mut t = TestSession::new(&["-B", "ascii"]);
    let reply = t.send(&breq(opcode::NOOP, b"", &[], &[], 0));
    assert_eq!(reply, b"CLIENT_ERROR bad command line format\r\n");
    assert_eq!(t.session.protocol, Some(Protocol::Text));
}

#[test]
fn one_dispatch_says_what_it_did() {
    let mut t = TestSession::new(&[]);
    let go = |t: &mut TestSession, data: &[u8]| {
        t.with_ctx(|ctx, s| request(ctx, s, Protocol::Text, data, &mut text::Stream))
    };
    assert_eq!(
        go(&mut t, b"get k"),
        Dispatch::Incomplete { line: true },
        "a line without its end"
    );
    assert_eq!(
        go(&mut t, b"set k 0 0 5\r\nab"),
        Dispatch::Incomplete { line: false },
        "a data block still arriving"
    );
    assert_eq!(
        go(&mut t, b"mn\r\nmn\r\n"),
        Dispatch::Done {
            used: 4,
            step: Step::Next,
            kind: Kind::MetaNoop
        }
    );
    assert!(matches!(
        go(&mut t, b"set k 0 0 1\r\nabc\r\n"),
        Dispatch::Done {
            kind: Kind::Refused,
            ..
        }
    ));
    let mut t = TestSession::new(&["-I", "1k"]);
    let mut big = b"set k 0 0 4096\r\n".to_vec();
    big.resize(big.len() + 100, b'x');
    let done = t.with_ctx(|ctx, s| request(ctx, s, Protocol::Text, &big, &mut text::Stream));
    assert!(
        matches!(
            done,
            Dispatch::Done {
                kind: Kind::TooLarge,
                ..
            }
        ),
        "{done:?}"
    );
    assert!(t.session.swallow > 0, "the value's bytes are swallowed");
}

#[test]
fn a_multiget_over_the_high_water_mark_pauses_and_goes_on() {
    let mut t = TestSession::new(&[]);
    let value = vec![b'v'; 200 * 1024];
    let mut sets = Vec::new();
    for key in ["a", "b", "c"] {
        sets.extend_from_slice(format!("set {key} 0 0 {}\r\n", value.len()).as_bytes());
        sets.extend_from_slice(&value);
        sets.extend_from_slice(b"\r\n");
    }
    assert_eq!(t.send(&sets), b"STORED\r\nSTORED\r\nSTORED\r\n");
    let got = t.send(b"get a b c\r\n");
    let mut want = Vec::new();
    for key in ["a", "b", "c"] {
        want.extend_from_slice(format!("VALUE {key} 0 {}\r\n", value.len()).as_bytes());
        want.extend_from_slice(&value);
        want.extend_from_slice(b"\r\n");
    }
    want.extend_from_slice(b"END\r\n");
    assert!(got == want, "the three values and END, in order");
}

#[test]
fn requests_per_event_bound_a_batch() {
    let mut t = TestSession::new(&[]);
    let data = b"mn\r\nmn\r\nmn\r\n";
    let mut budget = 2;
    let batch = t.with_ctx(|ctx, s| stream(ctx, s, data, &mut budget));
    assert_eq!((batch.used, batch.step, budget), (8, Step::Next, 0));
    assert_eq!(t.session.out, b"MN\r\nMN\r\n");
}
