//! Server-side replication (issue 6): replicas started with `--replica-of HOST:PORT` or turned
//! into replicas at run time with `replicaof HOST PORT`, promoted with `replicaof no one`.
//!
//! Every test starts its own servers on free loopback ports and talks to them over sockets
//! only. Replication is asynchronous, so nothing sleeps to pass: every wait is a bounded poll
//! (a deadline, 10 ms between attempts) until the replica answers exactly as the master does.
//! Contents are compared through `gets` replies byte for byte (a replica keeps the master's
//! CAS uniques). Of `stats replication` the tests rely only on `role`, `master_link_status`,
//! `connected_replicas`, `full_syncs` and `replica0_lag_bytes`.

mod common;

use common::repl::{
    dump, fill, fill_expiring, poll_until, repl_num, repl_stat, show, ttl, wait_stat, Dump, SYNC,
};
use common::{Client, Kind, Server};
use std::collections::BTreeSet;

const READ_ONLY: &str = "SERVER_ERROR replica is read-only\r\n";
const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format\r\n";

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Start a master (a plain kvcached) with these extra arguments.
fn start_master(args: &[&str]) -> Server {
    Server::start_verified(Kind::Kvcached, args)
}

/// Start a replica of the kvcached listening on `master_port` (127.0.0.1), with these extra
/// arguments. `start_verified` retries when the replica's own port was taken meanwhile.
fn start_replica(master_port: u16, args: &[&str]) -> Server {
    let target = format!("127.0.0.1:{master_port}");
    let mut all = vec!["--replica-of", target.as_str()];
    all.extend_from_slice(args);
    Server::start_verified(Kind::Kvcached, &all)
}

/// SIGKILL the server and reap it, so its port is closed when this returns.
fn kill(server: &mut Server) {
    server.child.kill().expect("SIGKILL the server");
    server.child.wait().expect("reap the server");
}

/// The first key whose `gets` reply on `replica` differs from `want` (the master's dump), or
/// Ok if all of `keys` match (absent where the master has no item). With `only_present`, keys
/// the master lacks are not checked. Stops at the first differing chunk, so polling is cheap.
fn compare(
    want: &Dump,
    keys: &[String],
    replica: &mut Client,
    only_present: bool,
) -> Result<(), String> {
    let keys: Vec<String> = keys
        .iter()
        .filter(|k| !only_present || want.contains_key(*k))
        .cloned()
        .collect();
    for chunk in keys.chunks(500) {
        let got = dump(replica, chunk);
        for k in chunk {
            if want.get(k) != got.get(k) {
                return Err(format!(
                    "key {k}: master {}, replica {}",
                    show(want.get(k)),
                    show(got.get(k))
                ));
            }
        }
    }
    Ok(())
}

/// Poll until `replica` holds exactly `want` for `keys`.
fn wait_converged(who: &str, want: &Dump, keys: &[String], replica: &mut Client) {
    poll_until(&format!("{who} to converge"), SYNC, || {
        compare(want, keys, replica, false)
    });
}

/// `n` items `{prefix}{i}` with values that say where they came from.
fn items(prefix: &str, n: usize, tag: &str) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let v = format!("{tag}-{prefix}{i}-").repeat(1 + i % 7);
            (format!("{prefix}{i}"), v.into_bytes())
        })
        .collect()
}

fn keys_of(items: &[(String, Vec<u8>)]) -> Vec<String> {
    items.iter().map(|(k, _)| k.clone()).collect()
}

/// A deterministic pseudo-random sequence (xorshift64), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn step(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.step() % n
    }

    /// Lowercase letters, `1..=max` of them.
    fn word(&mut self, max: u64) -> String {
        let len = 1 + self.below(max);
        (0..len)
            .map(|_| (b'a' + self.below(26) as u8) as char)
            .collect()
    }

    /// A value: a number (for incr/decr), a short word, or now and then a few KB.
    fn value(&mut self) -> String {
        match self.below(20) {
            0..=6 => self.below(100_000).to_string(),
            7 => self.word(26).repeat(100 + self.below(60) as usize),
            _ => self.word(40),
        }
    }
}

/// The random mixed load of `replica_converges` against `c` (a master), checking each reply
/// against a model of which keys exist. Returns the keys that must exist at the end.
fn mixed_load(c: &mut Client, seed: u64, ops: usize, nkeys: u64) -> BTreeSet<String> {
    let mut rng = Rng::new(seed);
    let mut present = BTreeSet::new();
    for op in 0..ops {
        if op == ops / 2 {
            assert_eq!(c.call("flush_all\r\n"), "OK\r\n");
            present.clear();
            continue;
        }
        let key = format!("key{}", rng.below(nkeys));
        let flags = rng.below(1 << 16);
        let exp = if rng.below(4) == 0 { 3600 } else { 0 };
        let has = present.contains(&key);
        let ctx = format!("op {op} on {key} (exists: {has})");
        match rng.below(13) {
            // set / add / replace
            kind @ 0..=4 => {
                let cmd = ["set", "set", "set", "add", "replace"][kind as usize];
                let v = rng.value();
                let reply = c.call(&format!("{cmd} {key} {flags} {exp} {}\r\n{v}\r\n", v.len()));
                let stored = match cmd {
                    "set" => true,
                    "add" => !has,
                    _ => has,
                };
                let want = if stored {
                    "STORED\r\n"
                } else {
                    "NOT_STORED\r\n"
                };
                assert_eq!(reply, want, "{cmd}: {ctx}");
                if stored {
                    present.insert(key);
                }
            }
            // append / prepend
            kind @ 5..=6 => {
                let cmd = if kind == 5 { "append" } else { "prepend" };
                let v = if rng.below(2) == 0 {
                    rng.below(10).to_string()
                } else {
                    rng.word(10)
                };
                let reply = c.call(&format!("{cmd} {key} 0 0 {}\r\n{v}\r\n", v.len()));
                let want = if has { "STORED\r\n" } else { "NOT_STORED\r\n" };
                assert_eq!(reply, want, "{cmd}: {ctx}");
            }
            7 => {
                let reply = c.call(&format!("delete {key}\r\n"));
                let want = if has { "DELETED\r\n" } else { "NOT_FOUND\r\n" };
                assert_eq!(reply, want, "delete: {ctx}");
                present.remove(&key);
            }
            kind @ 8..=9 => {
                let cmd = if kind == 8 { "incr" } else { "decr" };
                let reply = c.call(&format!("{cmd} {key} {}\r\n", rng.below(1000)));
                if has {
                    assert!(
                        reply.trim_end().parse::<u64>().is_ok()
                            || reply.starts_with("CLIENT_ERROR "),
                        "{cmd}: {ctx}: {reply:?}"
                    );
                } else {
                    assert_eq!(reply, "NOT_FOUND\r\n", "{cmd}: {ctx}");
                }
            }
            10 => {
                let exp = [0, 3600, 7200][rng.below(3) as usize];
                let reply = c.call(&format!("touch {key} {exp}\r\n"));
                let want = if has { "TOUCHED\r\n" } else { "NOT_FOUND\r\n" };
                assert_eq!(reply, want, "touch: {ctx}");
            }
            _ => {
                // cas with the current unique (mostly) or a stale one.
                let mut one = dump(c, std::slice::from_ref(&key));
                let unique: u64 = match one.remove(&key) {
                    Some(block) => {
                        let head = String::from_utf8_lossy(&block).into_owned();
                        let head = head.lines().next().unwrap_or_default().to_string();
                        head.rsplit(' ')
                            .next()
                            .unwrap()
                            .parse()
                            .expect("cas unique")
                    }
                    None => 1 + rng.below(1000),
                };
                assert!(one.is_empty());
                let right = rng.below(4) != 0;
                let unique = if right { unique } else { unique + 1_000_000 };
                let v = rng.value();
                let reply = c.call(&format!(
                    "cas {key} {flags} {exp} {} {unique}\r\n{v}\r\n",
                    v.len()
                ));
                let want = match (has, right) {
                    (false, _) => "NOT_FOUND\r\n",
                    (true, true) => "STORED\r\n",
                    (true, false) => "EXISTS\r\n",
                };
                assert_eq!(reply, want, "cas: {ctx}");
            }
        }
    }
    present
}

// ---------------------------------------------------------------------------------------------
// Tests.

/// A random mix of every write command (and a `flush_all` halfway) on the master; the replica
/// ends up with the same items: same flags, data, CAS uniques, and TTLs.
#[test]
fn replica_converges() {
    let master = start_master(&[]);
    let replica = start_replica(master.port, &[]);
    let mut m = master.connect();
    let mut r = replica.connect();

    let present = mixed_load(&mut m, 6, 3000, 300);
    let keys: Vec<String> = (0..300).map(|i| format!("key{i}")).collect();
    let want = dump(&mut m, &keys);
    let have: BTreeSet<String> = want.keys().cloned().collect();
    assert_eq!(have, present, "the master's key set after the load");
    assert!(
        present.len() > 50,
        "the load left only {} keys",
        present.len()
    );

    wait_converged("the replica", &want, &keys, &mut r);

    // The TTLs replicated too (touch, exptimes): equal up to a clock tick or two.
    for k in &keys {
        let (tm, tr) = (ttl(&mut m, k), ttl(&mut r, k));
        let ok = match (tm, tr) {
            (Some(a), Some(b)) if a < 0 || b < 0 => a == b,
            (Some(a), Some(b)) => (a - b).abs() <= 2,
            (None, None) => true,
            _ => false,
        };
        assert!(ok, "TTL of {k}: master {tm:?}, replica {tr:?}");
    }

    assert_eq!(repl_stat(&mut m, "role").as_deref(), Some("master"));
    assert_eq!(repl_stat(&mut r, "role").as_deref(), Some("replica"));
    wait_stat(&mut r, "replica", "master_link_status", "up");
    wait_stat(&mut m, "master", "connected_replicas", "1");
    // Nothing is written any more: the replica's acknowledged position reaches the end.
    wait_stat(&mut m, "master", "replica0_lag_bytes", "0");
    // Their digests of the live data agree (`stats digest`, kvcached's own); polled, since an
    // item may expire between the two reads.
    wait_same_digest(&mut m, &mut r);
}

/// Every write command is refused on a replica (data blocks swallowed, noreply or not); reads
/// work; the refused writes change nothing, and the replica keeps following its master.
#[test]
fn replica_is_read_only() {
    let master = start_master(&[]);
    let replica = start_replica(master.port, &[]);
    let mut m = master.connect();
    let mut r = replica.connect();

    assert_eq!(m.call("set k1 5 0 5\r\nhello\r\n"), "STORED\r\n");
    assert_eq!(m.call("set n 0 0 2\r\n10\r\n"), "STORED\r\n");
    let keys: Vec<String> = ["k1", "n", "fresh"].map(String::from).to_vec();
    let want = dump(&mut m, &keys);
    wait_converged("the replica", &want, &keys, &mut r);

    // Reads.
    assert_eq!(
        r.call("get k1\r\n") + &r.until("END\r\n"),
        "VALUE k1 5 5\r\nhello\r\nEND\r\n"
    );
    assert_eq!(
        r.call("get k1 fresh n\r\n") + &r.until("END\r\n"),
        "VALUE k1 5 5\r\nhello\r\nVALUE n 0 2\r\n10\r\nEND\r\n"
    );
    assert_eq!(dump(&mut r, &keys), want, "gets on the replica");
    assert_eq!(r.call("mg k1 v f\r\n"), "VA 5 f5\r\n");
    assert_eq!(r.line(), "hello\r\n");
    assert_eq!(r.call("mg fresh v\r\n"), "EN\r\n");
    assert_eq!(repl_stat(&mut r, "role").as_deref(), Some("replica"));

    let cas = {
        let block = want.get("k1").expect("k1 on the master");
        let head = String::from_utf8_lossy(block).into_owned();
        head.lines()
            .next()
            .and_then(|l| l.rsplit(' ').next())
            .unwrap()
            .to_string()
    };
    let refused = [
        "set k1 0 0 5\r\nworld\r\n".to_string(),
        "set fresh 0 0 5\r\nworld\r\n".to_string(),
        "add fresh 0 0 5\r\nworld\r\n".to_string(),
        "add k1 0 0 5\r\nworld\r\n".to_string(),
        "replace k1 0 0 5\r\nworld\r\n".to_string(),
        "replace fresh 0 0 5\r\nworld\r\n".to_string(),
        "append k1 0 0 5\r\nworld\r\n".to_string(),
        "prepend k1 0 0 5\r\nworld\r\n".to_string(),
        format!("cas k1 0 0 5 {cas}\r\nworld\r\n"),
        "cas fresh 0 0 5 1\r\nworld\r\n".to_string(),
        "delete k1\r\n".to_string(),
        "delete fresh\r\n".to_string(),
        "incr n 1\r\n".to_string(),
        "decr n 1\r\n".to_string(),
        "touch k1 100\r\n".to_string(),
        "gat 100 k1\r\n".to_string(),
        "gats 100 k1\r\n".to_string(),
        "flush_all\r\n".to_string(),
        "flush_all 0\r\n".to_string(),
        "ms k1 5\r\nworld\r\n".to_string(),
        "ms fresh 5 T0 F3\r\nworld\r\n".to_string(),
        "md k1\r\n".to_string(),
        "ma n\r\n".to_string(),
        "ma n MD D3\r\n".to_string(),
        // noreply: the error is still sent.
        "set k1 0 0 5 noreply\r\nworld\r\n".to_string(),
        "append k1 0 0 5 noreply\r\nworld\r\n".to_string(),
        "delete k1 noreply\r\n".to_string(),
        "incr n 1 noreply\r\n".to_string(),
        "touch k1 100 noreply\r\n".to_string(),
        "flush_all noreply\r\n".to_string(),
    ];
    for req in &refused {
        // The `version` after it shows the data block (if any) was swallowed, not parsed.
        r.send(req.as_bytes());
        r.send(b"version\r\n");
        assert_eq!(r.line(), READ_ONLY, "replica answering {req:?}");
        let v = r.line();
        assert!(v.starts_with("VERSION "), "after {req:?}: {v:?}");
    }
    // A whole batch pipelined in one write: one error each, in order.
    let batch: String = refused.concat();
    r.send(batch.as_bytes());
    for req in &refused {
        assert_eq!(r.line(), READ_ONLY, "pipelined {req:?}");
    }
    assert!(r.call("version\r\n").starts_with("VERSION "));

    // Nothing changed, on either side.
    assert_eq!(
        dump(&mut r, &keys),
        want,
        "the replica after refused writes"
    );
    assert_eq!(dump(&mut m, &keys), want, "the master after refused writes");
    assert_eq!(ttl(&mut r, "k1"), Some(-1), "touch/gat must not apply");

    // The link still works.
    assert_eq!(m.call("set fresh 0 0 3\r\nnew\r\n"), "STORED\r\n");
    assert_eq!(m.call("incr n 5\r\n"), "15\r\n");
    assert_eq!(m.call("delete k1\r\n"), "DELETED\r\n");
    let want = dump(&mut m, &keys);
    wait_converged("the replica after more writes", &want, &keys, &mut r);
    assert_eq!(r.call("incr n 1\r\n"), READ_ONLY);
}

/// `replicaof HOST PORT` at run time turns a master into a replica (its own data replaced by
/// the master's); after the master is SIGKILLed, `replicaof no one` promotes it with all the
/// replicated data, and it takes writes.
#[test]
fn runtime_replicaof_and_promotion() {
    let mut a = start_master(&[]);
    let b = start_master(&[]);
    let mut ca = a.connect();
    let mut cb = b.connect();

    // Bad arguments change nothing.
    for bad in [
        "replicaof 127.0.0.1\r\n",
        "replicaof 127.0.0.1 notaport\r\n",
        "replicaof 127.0.0.1 99999\r\n",
        "replicaof no\r\n",
    ] {
        assert_eq!(cb.call(bad), BAD_FORMAT, "{bad:?}");
    }
    assert_eq!(repl_stat(&mut cb, "role").as_deref(), Some("master"));

    let data = items("a", 500, "from-a");
    fill(&mut ca, &data);
    assert_eq!(ca.call("delete a7\r\n"), "DELETED\r\n");
    assert_eq!(ca.call("append a8 0 0 4\r\n+end\r\n"), "STORED\r\n");
    assert_eq!(ca.call("set num 0 0 3\r\n100\r\n"), "STORED\r\n");
    assert_eq!(ca.call("incr num 23\r\n"), "123\r\n");
    // B's own item, which A does not have: gone once B follows A.
    assert_eq!(cb.call("set bonly 0 0 1\r\nb\r\n"), "STORED\r\n");
    let mut keys = keys_of(&data);
    keys.push("num".into());
    keys.push("bonly".into());
    let want = dump(&mut ca, &keys);
    assert!(!want.contains_key("a7") && !want.contains_key("bonly"));

    assert_eq!(
        cb.call(&format!("replicaof 127.0.0.1 {}\r\n", a.port)),
        "OK\r\n"
    );
    wait_converged("B to follow A", &want, &keys, &mut cb);
    assert_eq!(repl_stat(&mut cb, "role").as_deref(), Some("replica"));
    wait_stat(&mut cb, "B", "master_link_status", "up");
    wait_stat(&mut ca, "A", "connected_replicas", "1");
    assert_eq!(cb.call("set x 0 0 1\r\nx\r\n"), READ_ONLY);

    // A dies; B is promoted and keeps everything that had replicated.
    kill(&mut a);
    assert_eq!(cb.call("replicaof no one\r\n"), "OK\r\n");
    assert_eq!(repl_stat(&mut cb, "role").as_deref(), Some("master"));
    assert_eq!(
        compare(&want, &keys, &mut cb, false),
        Ok(()),
        "B after promotion"
    );
    assert_eq!(cb.call("set x 0 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(cb.call("incr num 1\r\n"), "124\r\n");
    assert_eq!(cb.call("append a8 0 0 2\r\n!!\r\n"), "STORED\r\n");
    assert_eq!(cb.call("delete a9\r\n"), "DELETED\r\n");
    assert_eq!(cb.call("add a7 0 0 1\r\n7\r\n"), "STORED\r\n");
    assert_eq!(
        cb.call("get a8 a9 a7 x\r\n") + &cb.until("END\r\n"),
        format!(
            "VALUE a8 0 {n}\r\nfrom-a-a8-from-a-a8-+end!!\r\nVALUE a7 0 1\r\n7\r\n\
             VALUE x 0 1\r\nx\r\nEND\r\n",
            n = "from-a-a8-from-a-a8-+end!!".len()
        )
    );
    // Still a master after a moment: no link to A comes back.
    assert_eq!(repl_stat(&mut cb, "role").as_deref(), Some("master"));
    assert_eq!(cb.call("set y 0 0 1\r\ny\r\n"), "STORED\r\n");
}

/// A <- B <- C: C converges to A through B, including a delete and an overwrite made later.
#[test]
fn chained_replicas() {
    let a = start_master(&[]);
    let b = start_replica(a.port, &[]);
    let c = start_replica(b.port, &[]);
    let (mut ca, mut cb, mut cc) = (a.connect(), b.connect(), c.connect());

    let data = items("c", 1000, "chain");
    fill(&mut ca, &data);
    let keys = keys_of(&data);
    let want = dump(&mut ca, &keys);
    wait_converged("C (through B)", &want, &keys, &mut cc);
    wait_converged("B", &want, &keys, &mut cb);

    assert_eq!(ca.call("delete c10\r\n"), "DELETED\r\n");
    assert_eq!(ca.call("set c11 9 0 4\r\nnew!\r\n"), "STORED\r\n");
    assert_eq!(ca.call("prepend c12 0 0 3\r\npre\r\n"), "STORED\r\n");
    let want = dump(&mut ca, &keys);
    assert!(!want.contains_key("c10"));
    wait_converged("C after a delete on A", &want, &keys, &mut cc);
    assert_eq!(compare(&want, &keys, &mut cb, false), Ok(()), "B");

    for (who, cl) in [("B", &mut cb), ("C", &mut cc)] {
        assert_eq!(repl_stat(cl, "role").as_deref(), Some("replica"), "{who}");
        assert_eq!(cl.call("set c1 0 0 1\r\nx\r\n"), READ_ONLY, "{who}");
    }
}

/// The master dies: the replica notices (link down), keeps serving what it had, and follows a
/// new master (a full sync) when told to, ending up with exactly the new master's data.
#[test]
fn replica_reconnects() {
    let mut m = start_master(&[]);
    let r = start_replica(m.port, &[]);
    let mut cm = m.connect();
    let mut cr = r.connect();

    let old = items("k", 300, "old");
    fill(&mut cm, &old);
    let mut keys = keys_of(&old);
    keys.extend((0..50).map(|i| format!("nonly{i}")));
    let old_want = dump(&mut cm, &keys);
    wait_converged("R to follow M", &old_want, &keys, &mut cr);
    poll_until("R to count its first full sync", SYNC, || {
        match repl_num(&mut cr, "full_syncs") {
            n if n >= 1 => Ok(()),
            n => Err(format!("full_syncs {n}")),
        }
    });
    let syncs_before = repl_num(&mut cr, "full_syncs");

    kill(&mut m);
    drop(cm);
    wait_stat(&mut cr, "R", "master_link_status", "down");
    // Stale reads are served while the link is down.
    assert_eq!(
        compare(&old_want, &keys, &mut cr, false),
        Ok(()),
        "R's data with its master gone"
    );
    assert_eq!(repl_stat(&mut cr, "role").as_deref(), Some("replica"));
    assert_eq!(cr.call("set k1 0 0 1\r\nx\r\n"), READ_ONLY);

    // A new master with other data: overlapping keys with new values, fewer of them, and
    // keys R never saw.
    let n = start_master(&[]);
    let mut cn = n.connect();
    let new = items("k", 200, "new");
    fill(&mut cn, &new);
    fill(&mut cn, &items("nonly", 50, "new"));
    let new_want = dump(&mut cn, &keys);
    assert_eq!(new_want.len(), 250);

    assert_eq!(
        cr.call(&format!("replicaof 127.0.0.1 {}\r\n", n.port)),
        "OK\r\n"
    );
    wait_converged("R to follow N", &new_want, &keys, &mut cr);
    wait_stat(&mut cr, "R", "master_link_status", "up");
    poll_until("R to count another full sync", SYNC, || {
        match repl_num(&mut cr, "full_syncs") {
            n if n > syncs_before => Ok(()),
            n => Err(format!("full_syncs {n}, was {syncs_before}")),
        }
    });
    wait_stat(&mut cn, "N", "connected_replicas", "1");

    // And it follows N's later writes.
    assert_eq!(cn.call("delete k0\r\n"), "DELETED\r\n");
    assert_eq!(cn.call("set k250 0 0 2\r\nhi\r\n"), "STORED\r\n");
    keys.push("k250".into());
    let new_want = dump(&mut cn, &keys);
    wait_converged("R to follow N's later writes", &new_want, &keys, &mut cr);
}

/// A replica started after the master holds 20,000 items gets them all (a full sync).
#[test]
fn late_replica_full_sync() {
    let master = start_master(&[]);
    let mut m = master.connect();
    let data: Vec<(String, Vec<u8>)> = (0..20_000)
        .map(|i| {
            let v = format!("v{i}:").repeat(1 + i % 40);
            (format!("late{i}"), v.into_bytes())
        })
        .collect();
    fill(&mut m, &data);
    let keys = keys_of(&data);
    let want = dump(&mut m, &keys);
    assert_eq!(want.len(), 20_000, "the master lost items at -m 64");

    let replica = start_replica(master.port, &[]);
    let mut r = replica.connect();
    wait_converged("the late replica", &want, &keys, &mut r);
    poll_until("a full sync to be counted", SYNC, || {
        match repl_num(&mut r, "full_syncs") {
            n if n >= 1 => Ok(()),
            n => Err(format!("full_syncs {n}")),
        }
    });
    wait_stat(&mut r, "replica", "master_link_status", "up");
    wait_stat(&mut m, "master", "connected_replicas", "1");
    wait_stat(&mut m, "master", "replica0_lag_bytes", "0");
}

/// Master and replica at `-m 8`; the master takes ~40 MB of writes as fast as a pipelining
/// client can send them, far more than its log retains, while the replica follows (and may
/// fall behind past the retained log and resync). In the end the replica agrees with the
/// master on every recent key the master still holds.
#[test]
fn replica_survives_lagging_past_the_log() {
    let master = start_master(&["-m", "8"]);
    let replica = start_replica(master.port, &["-m", "8"]);
    let mut m = master.connect();
    let mut r = replica.connect();
    wait_stat(&mut r, "replica", "master_link_status", "up");

    let mut rng = Rng::new(7);
    let mut written = Vec::with_capacity(40_000);
    let batch = 100;
    for start in (0..40_000usize).step_by(batch) {
        let mut req = Vec::with_capacity(batch * 1100);
        for i in start..start + batch {
            let key = format!("lag{}", rng.below(60_000));
            let mut v = format!("{i}:{key}:").into_bytes();
            v.resize(1024, b'a' + (i % 26) as u8);
            req.extend_from_slice(format!("set {key} {} 0 {}\r\n", i % 1000, v.len()).as_bytes());
            req.extend_from_slice(&v);
            req.extend_from_slice(b"\r\n");
            written.push(key);
        }
        m.send(&req);
        for i in start..start + batch {
            assert_eq!(m.line(), "STORED\r\n", "set number {i}");
        }
    }
    let markers: Vec<(String, Vec<u8>)> = (0..200)
        .map(|j| (format!("marker{j}"), format!("the end {j}").into_bytes()))
        .collect();
    fill(&mut m, &markers);

    // The last 2,000 distinct keys written, then the markers.
    let mut recent = Vec::new();
    let mut seen = BTreeSet::new();
    for k in written.iter().rev() {
        if recent.len() == 2000 {
            break;
        }
        if seen.insert(k.clone()) {
            recent.push(k.clone());
        }
    }
    let marker_keys = keys_of(&markers);
    let want_markers = dump(&mut m, &marker_keys);
    assert_eq!(
        want_markers.len(),
        200,
        "the master evicted markers it just stored"
    );
    let want_recent = dump(&mut m, &recent);
    eprintln!(
        "master holds {} of the last {} keys written",
        want_recent.len(),
        recent.len()
    );

    wait_converged("the replica's markers", &want_markers, &marker_keys, &mut r);
    // Keys the master evicted may be missing on the replica too; the ones it holds must match.
    poll_until("the replica's recent keys", SYNC, || {
        compare(&want_recent, &recent, &mut r, true)
    });
    assert_eq!(repl_stat(&mut r, "role").as_deref(), Some("replica"));
    wait_stat(&mut r, "replica", "master_link_status", "up");
    // Both still serve.
    assert!(m.call("version\r\n").starts_with("VERSION "));
    assert!(r.call("version\r\n").starts_with("VERSION "));
}

/// Send `sig` (`"STOP"`, `"CONT"`) to a server process.
fn signal(server: &Server, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([format!("-{sig}"), server.child.id().to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} failed");
}

/// Poll until the master counts `n` connected replicas, each past its full sync (`online`
/// in `stats replication`, not `sync`).
fn wait_replicas_online(m: &mut Client, n: usize) {
    let want = n.to_string();
    poll_until(&format!("{n} replicas online"), SYNC, || {
        let st = m.stats("replication");
        let connected = st
            .iter()
            .find(|(k, _)| k == "connected_replicas")
            .map(|(_, v)| v.as_str());
        let online = st
            .iter()
            .filter(|(k, v)| k.ends_with("_state") && v.as_str() == "online")
            .count();
        if connected == Some(want.as_str()) && online == n {
            Ok(())
        } else {
            Err(format!("{st:?}"))
        }
    });
}

/// Poll until the replica's `stats digest` (kvcached's own: the live items' count and
/// digest) equals the master's, with the master holding items.
fn wait_same_digest(m: &mut Client, r: &mut Client) {
    poll_until("the digests to agree", SYNC, || {
        let (dm, dr) = (m.stats("digest"), r.stats("digest"));
        let items = dm
            .iter()
            .find(|(k, _)| k == "digest_items")
            .map(|(_, v)| v.clone());
        match items {
            Some(n) if n != "0" && dm == dr => Ok(()),
            _ => Err(format!("master {dm:?}, replica {dr:?}")),
        }
    });
}

/// A master started with `master_args` and a replica of it with `-m replica_mem`, past the
/// replica's first full sync with `data` on both and nothing left for the master to ship.
fn synced_pair(
    master_args: &[&str],
    replica_mem: &str,
    data: &[(String, Vec<u8>)],
) -> (Server, Server, Client, Client) {
    let master = start_master(master_args);
    let replica = start_replica(master.port, &["-m", replica_mem]);
    let mut m = master.connect();
    let mut r = replica.connect();
    fill(&mut m, data);
    wait_same_digest(&mut m, &mut r);
    assert_eq!(repl_num(&mut r, "full_syncs"), 1);
    wait_stat(&mut m, "master", "replica0_lag_bytes", "0");
    (master, replica, m, r)
}

/// `n` items of 1,000 bytes (`short0`, `short1`, ...), for `fill_expiring`.
fn short_lived(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| (format!("short{i}"), vec![b'e'; 1000]))
        .collect()
}

/// A replica paused (SIGSTOP) while its master writes three times what its log holds finds,
/// when it resumes, that the segments it had not read were evicted. Before issue 42 that cost
/// a full resync (issue 11, item 3); now the master logs anew, before it frees such a
/// segment, what the replica would miss by skipping it (`relogged_segments`), and the replica
/// continues from its position without a full sync and ends with the master's digest. Items
/// the master deleted meanwhile (their tombstones among the evicted segments) are gone from
/// the replica too. Nothing here depends on timing: the pause lasts exactly as long as the
/// writes, and every wait is a bounded poll.
#[test]
fn replica_paused_past_the_log_continues_without_full_sync() {
    let first: Vec<(String, Vec<u8>)> = items("before", 2000, "b");
    // The replica gets room to spare: its records store their master's versions (a few
    // bytes each), and re-logged copies of items leave dead records in its log, so near the
    // master's -m it could evict items of its own (how many depends on when the master's
    // maintenance re-logs), and the digests would differ by those (CI saw 18 at -m 9).
    let (_master, replica, mut m, mut r) = synced_pair(&["-m", "8"], "32", &first);
    let evicted_before = m.stat("evictions").and_then(|v| v.parse::<u64>().ok());

    signal(&replica, "STOP");
    for (k, _) in &first[..200] {
        assert_eq!(m.call(&format!("delete {k}\r\n")), "DELETED\r\n");
    }
    // 24 MiB of 1 KiB values into an 8 MiB log: every segment the replica had seen is
    // evicted before it pulls again.
    let big: Vec<(String, Vec<u8>)> = (0..24_000)
        .map(|i| (format!("during{i}"), vec![b'a' + (i % 26) as u8; 1024]))
        .collect();
    fill(&mut m, &big);
    let evicted = m.stat("evictions").and_then(|v| v.parse::<u64>().ok());
    assert!(
        evicted.unwrap_or(0) > evicted_before.unwrap_or(0) + 2000,
        "the master's log did not wrap: evictions {evicted_before:?} -> {evicted:?}"
    );
    assert!(repl_num(&mut m, "relogged_segments") > 0);
    signal(&replica, "CONT");

    wait_same_digest(&mut m, &mut r);
    wait_stat(&mut r, "replica", "master_link_status", "up");
    wait_stat(&mut m, "master", "replica0_lag_bytes", "0");
    assert_eq!(
        repl_num(&mut r, "full_syncs"),
        1,
        "a full resync after the pause"
    );
    assert_eq!(
        dump(&mut r, &keys_of(&first[..200])).len(),
        0,
        "the replica kept deleted items"
    );
    // It follows the tail afterwards.
    let after = items("after", 500, "c");
    fill(&mut m, &after);
    wait_same_digest(&mut m, &mut r);
    assert_eq!(repl_num(&mut r, "full_syncs"), 1, "a later full sync");
}

/// A <- B <- C, and B resynchronizes: told to follow another master A2 (`replicaof`), which
/// lacks some of A's items, B replaces its items on its full sync without logging what it
/// dropped. C had caught up with B, so its position in B's log could still be valid; B must
/// send it a reset, and C ends with A2's items, not also the ones only A had.
#[test]
fn chained_replica_resyncs_when_its_upstream_does() {
    let master = start_master(&["-m", "8"]);
    let b = start_replica(master.port, &["-m", "8"]);
    let mut m = master.connect();
    // B past its own first full sync before C follows it: that sync wipes B, and a cursor
    // C took from B before then would cost C a second full sync (B slow to start).
    wait_replicas_online(&mut m, 1);
    let c = start_replica(b.port, &["-m", "64"]);
    let (mut cb, mut cc) = (b.connect(), c.connect());
    let kept = items("kept", 1000, "k");
    let gone = items("gone", 500, "g");
    fill(&mut m, &kept);
    fill(&mut m, &gone);
    wait_same_digest(&mut m, &mut cc);
    assert_eq!(repl_num(&mut cb, "full_syncs"), 1);
    assert_eq!(repl_num(&mut cc, "full_syncs"), 1);

    let a2 = start_master(&["-m", "8"]);
    let mut m2 = a2.connect();
    fill(&mut m2, &kept);
    assert_eq!(
        cb.call(&format!("replicaof 127.0.0.1 {}\r\n", a2.port)),
        "OK\r\n"
    );

    wait_same_digest(&mut m2, &mut cb);
    assert!(repl_num(&mut cb, "full_syncs") >= 2, "B did not resync");
    wait_same_digest(&mut m2, &mut cc);
    assert!(repl_num(&mut cc, "full_syncs") >= 2, "C did not resync");
    let keys = keys_of(&gone);
    assert_eq!(dump(&mut cc, &keys).len(), 0, "C kept items only A had");
}

/// A replica paused (SIGSTOP) while whole segments of short-lived items expire on its
/// master continues from its cursor when it resumes: the master keeps the segments it has
/// not read (`held_segments`, kvcached's own) instead of freeing them, and frees them once
/// it has. Before, the gap they left in the log cost a full sync. Every wait is a bounded
/// poll: the pause lasts until the master reports segments kept.
#[test]
fn replica_paused_while_items_expire_continues_without_full_sync() {
    // About 4 MiB of items living one second: several whole 1 MiB segments, within the
    // default backlog (a sixteenth of -m).
    paused_replica_continues(&[], 4000, 4 << 20);
}

/// The same with ten times as many short-lived items, which the default backlog (4 MiB at
/// `-m 64`) could not keep, and `--repl-backlog=24` (engine-level, the default's drop is
/// `expired_segments_are_kept_for_a_paused_replica` in crates/kvstore/tests/replication.rs).
#[test]
fn a_larger_repl_backlog_keeps_more_for_a_paused_replica() {
    paused_replica_continues(&["--repl-backlog", "24"], 10_000, 24 << 20);
}

/// Issue 42, item 3: past the backlog too. With `--repl-backlog=1` the master cannot keep
/// the 10 MB of short-lived items a paused replica has not read; when they expire it frees
/// their segments anyway (`held_segments_dropped`), but first logs anew what the replica
/// would miss by skipping them (`relogged_segments`), and the replica skips them instead of
/// resynchronizing fully. Items it had that the master overwrote with short-lived versions,
/// or deleted, while it was paused are gone from it too.
#[test]
fn a_replica_paused_past_the_backlog_skips_what_expired_without_full_sync() {
    let kept = items("kept", 500, "k");
    let (_master, replica, mut m, mut r) =
        synced_pair(&["-m", "64", "--repl-backlog", "1"], "64", &kept);

    signal(&replica, "STOP");
    // A fifth of the replica's items get short-lived versions, a fifth are deleted.
    let renewed: Vec<(String, Vec<u8>)> = kept[..100]
        .iter()
        .map(|(k, _)| (k.clone(), b"short-lived".to_vec()))
        .collect();
    fill_expiring(&mut m, &renewed, 1);
    for (k, _) in &kept[100..200] {
        assert_eq!(m.call(&format!("delete {k}\r\n")), "DELETED\r\n");
    }
    fill_expiring(&mut m, &short_lived(10_000), 1);
    poll_until(
        "the master to free expired segments the replica needs, logged anew",
        SYNC,
        || match repl_num(&mut m, "relogged_segments") {
            0 => Err("none yet".into()),
            _ => Ok(()),
        },
    );
    assert!(repl_num(&mut m, "held_segments_dropped") > 0);
    fill(&mut m, &items("later", 200, "l"));
    signal(&replica, "CONT");

    wait_same_digest(&mut m, &mut r);
    wait_stat(&mut m, "master", "replica0_lag_bytes", "0");
    assert_eq!(
        repl_num(&mut r, "full_syncs"),
        1,
        "the replica resynchronized fully after the pause"
    );
    let gone = keys_of(&kept[..200]);
    assert_eq!(dump(&mut m, &gone).len(), 0);
    assert_eq!(
        dump(&mut r, &gone).len(),
        0,
        "the replica kept what the master lost"
    );
}

fn paused_replica_continues(master_args: &[&str], short_items: usize, backlog: u64) {
    let mut args = vec!["-m", "64"];
    args.extend_from_slice(master_args);
    let (_master, replica, mut m, mut r) = synced_pair(&args, "64", &items("kept", 500, "k"));

    assert_eq!(repl_num(&mut m, "repl_backlog_bytes"), backlog);
    signal(&replica, "STOP");
    fill_expiring(&mut m, &short_lived(short_items), 1);
    poll_until(
        "the master to keep expired segments",
        SYNC,
        || match repl_num(&mut m, "held_segments") {
            0 => Err("none kept yet".into()),
            _ => Ok(()),
        },
    );
    assert_eq!(repl_num(&mut m, "held_segments_dropped"), 0);
    fill(&mut m, &items("later", 200, "l"));
    signal(&replica, "CONT");

    wait_same_digest(&mut m, &mut r);
    wait_stat(&mut m, "master", "replica0_lag_bytes", "0");
    assert_eq!(
        repl_num(&mut r, "full_syncs"),
        1,
        "the replica resynchronized fully after the pause"
    );
    poll_until(
        "the master to free what the replica read",
        SYNC,
        || match repl_num(&mut m, "held_segments") {
            0 => Ok(()),
            n => Err(format!("{n} still kept")),
        },
    );
}

/// A master with `-Y`: a replica with the right `--replica-auth` follows it; one with a
/// wrong password is refused (the master counts the failure) and gets nothing.
#[test]
fn replica_authenticates_to_a_master_with_ascii_auth() {
    let dir = std::env::temp_dir();
    let tag = std::process::id();
    let auth = dir.join(format!("kvcached-repl-auth-{tag}"));
    let good = dir.join(format!("kvcached-repl-cred-{tag}"));
    let bad = dir.join(format!("kvcached-repl-bad-{tag}"));
    std::fs::write(&auth, "repl:s3cret\n").expect("write auth file");
    std::fs::write(&good, "repl:s3cret\n").expect("write credentials");
    std::fs::write(&bad, "repl:wrong\n").expect("write credentials");
    let master = Server::start(Kind::Kvcached, &["-Y", auth.to_str().expect("utf-8 path")]);
    let mut mc = master.connect();
    assert_eq!(mc.call("set x 0 0 11\r\nrepl s3cret\r\n"), "STORED\r\n");
    let data = items("auth", 300, "a");
    fill(&mut mc, &data);
    let keys = keys_of(&data);
    let want = dump(&mut mc, &keys);

    let replica = start_replica(
        master.port,
        &["--replica-auth", good.to_str().expect("path")],
    );
    let mut rc = replica.connect();
    wait_converged("authenticated replica", &want, &keys, &mut rc);

    let errors_before: u64 = mc
        .stat("auth_errors")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let refused = start_replica(
        master.port,
        &["--replica-auth", bad.to_str().expect("path")],
    );
    poll_until("the master to refuse the wrong password", SYNC, || {
        let n: u64 = mc
            .stat("auth_errors")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if n > errors_before {
            Ok(())
        } else {
            Err(format!("auth_errors {n}"))
        }
    });
    let mut xc = refused.connect();
    assert_eq!(
        repl_stat(&mut xc, "master_link_status").as_deref(),
        Some("down")
    );
    assert_eq!(xc.call("get auth1\r\n"), "END\r\n");
    for p in [auth, good, bad] {
        let _ = std::fs::remove_file(p);
    }
}

/// Two replicas of one master; the master dies, one replica is promoted, and the other is
/// pointed at it: it continues without a full sync and follows the new master's writes.
#[test]
fn fellow_replica_follows_the_promoted_one_without_full_sync() {
    let mut master = start_master(&[]);
    let a = start_replica(master.port, &[]);
    let b = start_replica(master.port, &[]);
    let mut mc = master.connect();
    // Both past their first (empty) full sync before the writes, so that the writes reach
    // them in tail batches: a replica keeps checkpoints only of those, and b's switch to a
    // needs one. A replica slow to start could otherwise get them all in its snapshot.
    wait_replicas_online(&mut mc, 2);
    let data = items("fell", 800, "m");
    fill(&mut mc, &data);
    let keys = keys_of(&data);
    let want = dump(&mut mc, &keys);
    let (mut ac, mut bc) = (a.connect(), b.connect());
    wait_converged("replica a", &want, &keys, &mut ac);
    wait_converged("replica b", &want, &keys, &mut bc);
    let full_before = repl_num(&mut bc, "full_syncs");
    let partial_before = repl_num(&mut bc, "partial_syncs");
    kill(&mut master);
    assert_eq!(ac.call("replicaof no one\r\n"), "OK\r\n");
    let more = items("after", 200, "a");
    fill(&mut ac, &more);
    assert_eq!(
        bc.call(&format!("replicaof 127.0.0.1 {}\r\n", a.port)),
        "OK\r\n"
    );
    let all: Vec<String> = keys.iter().chain(&keys_of(&more)).cloned().collect();
    let want = dump(&mut ac, &all);
    wait_converged("replica b following a", &want, &all, &mut bc);
    assert_eq!(
        repl_num(&mut bc, "full_syncs"),
        full_before,
        "b did a full sync"
    );
    assert!(repl_num(&mut bc, "partial_syncs") > partial_before);
}

/// `--min-replicas 1`: a master refuses writes until a replica is in sync, and again once
/// its only replica is gone; reads always work.
#[test]
fn min_replicas_refuses_writes_without_a_replica_in_sync() {
    const REFUSED: &str = "SERVER_ERROR not enough good replicas\r\n";
    let master = start_master(&["--min-replicas", "1", "--min-replicas-max-lag", "1"]);
    let mut mc = master.connect();
    assert_eq!(mc.call("set a 0 0 1\r\nx\r\n"), REFUSED);
    assert_eq!(mc.call("delete a\r\n"), REFUSED);
    assert_eq!(mc.call("get a\r\n"), "END\r\n");
    let mut replica = start_replica(master.port, &[]);
    poll_until("writes to be accepted", SYNC, || {
        match mc.call("set a 0 0 1\r\nx\r\n").as_str() {
            "STORED\r\n" => Ok(()),
            other => Err(other.to_string()),
        }
    });
    kill(&mut replica);
    poll_until("writes to be refused again", SYNC, || {
        match mc.call("set b 0 0 1\r\ny\r\n").as_str() {
            REFUSED => Ok(()),
            other => Err(other.to_string()),
        }
    });
    mc.send(b"get a\r\n");
    assert_eq!(mc.until("END\r\n"), "VALUE a 0 1\r\nx\r\nEND\r\n");
}

/// `--replica-serve-stale no`: a replica answers reads while in sync and refuses them once
/// its master is gone (the default, tested in `replica_reconnects`, keeps serving).
#[test]
fn replica_refuses_stale_reads_when_asked_to() {
    const NOT_IN_SYNC: &str = "SERVER_ERROR replica is not in sync with its master\r\n";
    let mut master = start_master(&[]);
    let replica = start_replica(master.port, &["--replica-serve-stale", "no"]);
    let mut mc = master.connect();
    let data = items("stale", 50, "m");
    fill(&mut mc, &data);
    let keys = keys_of(&data);
    let want = dump(&mut mc, &keys);
    let mut rc = replica.connect();
    // Reads are refused until the full sync is done.
    poll_until("the replica to be in sync", SYNC, || {
        rc.send(b"get stale49\r\n");
        let first = rc.line();
        if first.starts_with("VALUE") {
            rc.until("END\r\n");
            return Ok(());
        }
        if first != "END\r\n" && first != NOT_IN_SYNC {
            return Err(format!("unexpected {first:?}"));
        }
        Err(first)
    });
    wait_converged("replica", &want, &keys, &mut rc);
    kill(&mut master);
    poll_until("reads to be refused", SYNC, || {
        rc.send(b"get stale1\r\n");
        let first = rc.line();
        if first == NOT_IN_SYNC {
            return Ok(());
        }
        rc.until("END\r\n");
        Err(first)
    });
    assert_eq!(rc.call("mg stale1 v\r\n"), NOT_IN_SYNC);
    assert_eq!(rc.call("set x 0 0 1\r\ny\r\n"), READ_ONLY);
    // Promoted, it serves its data again.
    assert_eq!(rc.call("replicaof no one\r\n"), "OK\r\n");
    rc.send(b"get stale1\r\n");
    assert!(rc.until("END\r\n").starts_with("VALUE stale1 0 "));
}
