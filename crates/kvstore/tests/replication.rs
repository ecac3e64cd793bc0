//! Replication of `LogEngine` (log shipping, `log/repl/`): a replica that pulls batches
//! from a master at random points of a random operation sequence, with random byte budgets,
//! ends with exactly the master's items (value, flags, expiry, CAS), whether it followed
//! from the start or joined late with a full sync.

use kvstore::{Engine, LogEngine, ReplicaState, Time};
use proptest::prelude::*;

#[path = "support/ops.rs"]
mod ops;
#[path = "support/threads.rs"]
mod threads;

use ops::{Op, START};
use threads::Threads;

const KEYS: usize = 24;

/// One pull: serve the replica's cursor on the master, apply the batch on the replica.
fn pull(
    master: &LogEngine,
    replica: &LogEngine,
    st: &mut ReplicaState,
    budget: usize,
    now: Time,
) -> (bool, u64) {
    pull_as(None, master, replica, st, budget, now)
}

/// [`pull`] by the replica the master knows as `name` (it keeps what that one has not
/// read: `repl_serve_as`).
fn pull_as(
    name: Option<&str>,
    master: &LogEngine,
    replica: &LogEngine,
    st: &mut ReplicaState,
    budget: usize,
    now: Time,
) -> (bool, u64) {
    let mut cursor = Vec::new();
    st.cursor(&mut cursor);
    let mut batch = Vec::new();
    let served = master.repl_serve_as(name, &cursor, false, false, budget, &mut batch);
    let applied = replica
        .repl_apply(st, &batch, now)
        .unwrap_or_else(|e| panic!("replica rejected a batch: {e}"));
    (applied.idle && !served.snapshot, served.lag_bytes)
}

/// Pull until the replica follows the tail with nothing left to fetch.
fn catch_up(master: &LogEngine, replica: &LogEngine, st: &mut ReplicaState, now: Time) {
    for _ in 0..10_000 {
        let (idle, lag) = pull(master, replica, st, 4096, now);
        if idle && lag == 0 {
            return;
        }
    }
    panic!("replica did not catch up");
}

fn assert_same(master: &LogEngine, replica: &LogEngine, now: Time) {
    for k in 0..KEYS {
        let key = ops::key_name(k);
        assert_eq!(
            master.peek_item(&key, now),
            replica.peek_item(&key, now),
            "key {k} differs between master and replica"
        );
    }
}

/// A second delayed `flush_all` replaces the first (memcached keeps one deadline), and
/// items the first one hid come back, except those the master already removed when a
/// read found them dead. Those removals are not logged, so a replica may keep such an
/// item: a documented difference, left out here.
fn comparable(ops_: &[Op]) -> bool {
    ops_.iter().filter(|o| matches!(o, Op::FlushIn(_))).count() <= 1
}

fn run(ops_: &[Op], pulls: &[(bool, usize)], join_at: usize, max_bytes: usize) {
    run_on(ops_, pulls, join_at, max_bytes, 1);
}

/// [`run`] with the master's operations on `threads` threads in turn.
fn run_on(ops_: &[Op], pulls: &[(bool, usize)], join_at: usize, max_bytes: usize, threads: usize) {
    let master = LogEngine::new(ops::config(max_bytes, false, true));
    let replica = LogEngine::new(ops::config(max_bytes, false, true));
    std::thread::scope(|s| {
        let workers = Threads::start(s, threads);
        follow(
            &master,
            &replica,
            ops_,
            pulls,
            join_at,
            |i, op, now, right| {
                let m = &master;
                workers.run(i, move || {
                    ops::apply(m, &op, now, right);
                });
            },
        );
    });
}

fn follow(
    master: &LogEngine,
    replica: &LogEngine,
    ops_: &[Op],
    pulls: &[(bool, usize)],
    join_at: usize,
    exec: impl Fn(usize, Op, Time, u64),
) {
    replica.set_replica(true);
    let mut st = ReplicaState::new();
    let mut now = START;
    for (i, op) in ops_.iter().enumerate() {
        if let Op::Advance(d) = op {
            now += d;
        }
        let cas_right = ops::apply(
            master,
            &Op::Debug {
                key: op.key().unwrap_or(0),
            },
            now,
            0,
        );
        let right = match cas_right {
            ops::Reply::Debug(Some(d)) => d.cas,
            _ => 0,
        };
        exec(i, op.clone(), now, right);
        let (p, budget) = pulls[i % pulls.len()];
        if p && i >= join_at {
            pull(master, replica, &mut st, budget, now);
        }
    }
    catch_up(master, replica, &mut st, now);
    assert_same(master, replica, now);
    // Promotion: the replica takes writes and draws versions above the master's.
    replica.set_replica(false);
    let req = kvstore::StoreRequest {
        mode: kvstore::StoreMode::Set,
        key: b"after-promotion",
        value: b"x",
        flags: 0,
        exptime: 0,
    };
    let kvstore::StoreResult::Stored(master_cas) = master.store(req, now) else {
        panic!("the master must take writes");
    };
    let kvstore::StoreResult::Stored(cas) = replica.store(req, now) else {
        panic!("a promoted replica must take writes");
    };
    assert!(
        cas >= master_cas,
        "promoted replica drew CAS {cas} < the master's next {master_cas}"
    );
}

/// Classic and meta operations on `KEYS` keys.
fn op_sequence() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![3 => ops::op(KEYS), 2 => ops::meta_op(KEYS)],
        1..160,
    )
}

/// Whether the replica pulls after each operation, and with what byte budget.
fn pull_plan() -> impl Strategy<Value = Vec<(bool, usize)>> {
    prop::collection::vec(
        (
            any::<bool>(),
            prop_oneof![Just(1usize), Just(60), Just(4096)],
        ),
        1..8,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// A replica following from the start, with pulls at random points and budgets.
    #[test]
    fn replica_follows(
        ops_ in op_sequence(),
        pulls in pull_plan(),
    ) {
        prop_assume!(comparable(&ops_));
        run(&ops_, &pulls, 0, 4 << 20);
    }

    /// A replica joining late: full sync (snapshot) while the master keeps writing.
    #[test]
    fn replica_joins_late(
        ops_ in op_sequence(),
        pulls in pull_plan(),
        join_at in 0usize..160,
    ) {
        prop_assume!(comparable(&ops_));
        run(&ops_, &pulls, join_at, 4 << 20);
    }

    /// The master's operations alternate between two threads, each with its own range of
    /// CAS uniques: a key's versions and tombstones still order as the replica needs.
    #[test]
    fn replica_follows_writers_on_two_threads(
        ops_ in op_sequence(),
        pulls in pull_plan(),
        threads in 2usize..4,
    ) {
        prop_assume!(comparable(&ops_));
        run_on(&ops_, &pulls, 0, 4 << 20, threads);
    }
}

/// Two threads store and delete the same keys at once. Every CAS unique they are given is
/// unique, a thread sees each key's uniques increase, and a replica that applies the log
/// (whose tombstones must order against stores from the other thread's range) ends equal.
#[test]
fn concurrent_writers_draw_unique_increasing_cas_and_replicate_exactly() {
    const N: usize = 20_000;
    let master = LogEngine::new(ops::config(16 << 20, false, true));
    let replica = LogEngine::new(ops::config(16 << 20, false, true));
    replica.set_replica(true);
    let now = START;
    let go = std::sync::Barrier::new(2);
    let drawn: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u64)
            .map(|t| {
                let (m, go) = (&master, &go);
                s.spawn(move || {
                    go.wait();
                    let mut got = Vec::new();
                    let mut last = [0u64; KEYS];
                    let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ t;
                    for i in 0..N {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = (x % KEYS as u64) as usize;
                        let key = ops::key_name(k);
                        if i % 5 == 4 {
                            m.delete(&key, now);
                            continue;
                        }
                        let req = kvstore::StoreRequest {
                            mode: kvstore::StoreMode::Set,
                            key: &key,
                            value: &i.to_le_bytes(),
                            flags: t as u32,
                            exptime: 0,
                        };
                        let kvstore::StoreResult::Stored(cas) = m.store(req, now) else {
                            panic!("set failed");
                        };
                        assert!(cas > last[k], "key {k}: CAS {cas} after {}", last[k]);
                        last[k] = cas;
                        got.push(cas);
                    }
                    got
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("writer panicked")))
            .collect()
    });
    let mut all: Vec<u64> = drawn.into_iter().flatten().collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "a CAS unique was given twice");
    let mut st = ReplicaState::new();
    catch_up(&master, &replica, &mut st, now);
    assert_same(&master, &replica, now);
}

/// A master and its replica, each of `max_bytes`, and the replica's position.
fn master_and_replica(max_bytes: usize) -> (LogEngine, LogEngine, ReplicaState) {
    let cfg = ops::config(max_bytes, false, true);
    let master = LogEngine::new(cfg.clone());
    let replica = LogEngine::new(cfg);
    replica.set_replica(true);
    (master, replica, ReplicaState::new())
}

/// `set` `key` on `e` (the test engine's `-I` takes values of up to about 50 bytes).
fn set_item(
    e: &LogEngine,
    key: &str,
    value: &[u8],
    flags: u32,
    exptime: Time,
    now: Time,
) -> kvstore::StoreResult {
    e.store(
        kvstore::StoreRequest {
            mode: kvstore::StoreMode::Set,
            key: key.as_bytes(),
            value,
            flags,
            exptime,
        },
        now,
    )
}

/// A replica the master knows (served with `repl_serve_as`, as a server does) that stops
/// pulling while the master turns its whole memory over several times finds the segments
/// it had not read evicted, but skips them: before freeing each, eviction logged anew what
/// the replica would miss. It converges without a full sync, deletes made meanwhile
/// included.
#[test]
fn lagging_replica_skips_what_eviction_freed() {
    let (master, replica, mut st) = master_and_replica(4 << 20);
    let now = START;
    let set = |key: &str| {
        assert!(matches!(
            set_item(&master, key, &[7u8; 40], 0, 0, now),
            kvstore::StoreResult::Stored(_)
        ));
    };
    for i in 0..2000 {
        set(&format!("k{i}"));
    }
    catch_up_holding(&master, &replica, &mut st, now, true);
    assert_eq!(st.full_syncs, 1);
    for i in 0..200 {
        assert!(master.delete(format!("k{i}").as_bytes(), now));
    }
    for i in 0..200_000 {
        set(&format!("k{}", 2000 + i % 20_000));
    }
    assert!(master.repl_relogged_segments() > 0);
    catch_up_holding(&master, &replica, &mut st, now, true);
    assert_eq!(st.full_syncs, 1, "the replica resynchronized");
    assert_eq!(master.digest(now), replica.digest(now));
    for i in 0..200 {
        assert_eq!(
            replica.peek_item(format!("k{i}").as_bytes(), now),
            None,
            "k{i}"
        );
    }
}

/// A replica the master does not know (served with `repl_serve`) that stops pulling while
/// the master turns its whole memory over several times falls behind the retained log, gets
/// a full sync and converges.
#[test]
fn lagging_replica_resyncs() {
    let (master, replica, mut st) = master_and_replica(1 << 20);
    let now = START;
    let set = |i: usize| {
        set_item(
            &master,
            &format!("k{}", i % 5000),
            &[7u8; 40],
            i as u32,
            0,
            now,
        );
    };
    for i in 0..2000 {
        set(i);
    }
    catch_up(&master, &replica, &mut st, now);
    assert_eq!(st.full_syncs, 1);
    for i in 0..60_000 {
        set(i);
    }
    catch_up(&master, &replica, &mut st, now);
    assert_eq!(
        st.full_syncs, 2,
        "the replica should have resynchronized once"
    );
    for i in 0..5000 {
        let key = format!("k{i}");
        assert_eq!(
            master.peek_item(key.as_bytes(), now),
            replica.peek_item(key.as_bytes(), now),
            "{key}"
        );
    }
}

/// Pull until caught up, as a server does: with `hold`, the master keeps what the replica
/// has not read (`repl_serve_as`).
fn catch_up_holding(
    master: &LogEngine,
    replica: &LogEngine,
    st: &mut ReplicaState,
    now: Time,
    hold: bool,
) {
    for _ in 0..10_000 {
        let (idle, lag) = pull_as(hold.then_some("replica"), master, replica, st, 1 << 16, now);
        if idle && lag == 0 {
            return;
        }
    }
    panic!("replica did not catch up");
}

fn stat(e: &LogEngine, group: &str, name: &str) -> u64 {
    e.stats_detail(group)
        .into_iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no stat {name}"))
}

/// What a skipped segment held reaches the replica anyway (issue 42, item 3). While a replica
/// pauses, its master overwrites items the replica has with short-lived versions and
/// deletes others, then lets the log run past its backlog: the segments with the new
/// versions expire whole, those with the old versions and the delete tombstones die, and
/// the maintenance pass frees them all before the replica has read them. The replica skips
/// them without a full sync, and keeps none of the old versions or deleted items (the
/// master logged a tombstone for each expired current item and each tombstone again).
#[test]
fn a_replica_skips_freed_segments_and_keeps_nothing_the_master_lost() {
    let (master, replica, mut st) = master_and_replica(64 << 20);
    master.set_repl_backlog(1 << 20);
    let now = START;
    let store = |key: &str, value: &[u8], exptime: Time| {
        assert!(matches!(
            set_item(&master, key, value, 0, exptime, now),
            kvstore::StoreResult::Stored(_)
        ));
    };
    let n = 2000;
    for i in 0..n {
        store(&format!("old{i}"), b"first version", 0);
        store(&format!("del{i}"), b"to be deleted", 0);
    }
    catch_up_holding(&master, &replica, &mut st, now, true);
    assert_eq!(st.full_syncs, 1);
    assert!(replica.peek_item(b"old7", now).is_some() && replica.peek_item(b"del7", now).is_some());

    // The replica pauses.
    for i in 0..n {
        store(&format!("old{i}"), b"short-lived version", now + 2);
        assert!(master.delete(format!("del{i}").as_bytes(), now));
    }
    // Fillers seal the segments that hold the old versions and the tombstones, then are
    // overwritten so that their segments die too; short-lived items fill whole segments.
    for round in 0..2 {
        for j in 0..20_000 {
            store(&format!("fill{j}"), &[round as u8; 40], 0);
        }
    }
    for j in 0..60_000 {
        store(&format!("t{j}"), &[7u8; 40], now + 2);
    }
    let later = now + 100;
    for _ in 0..8 {
        master.maintain(later, true);
    }
    let (_, dropped) = master.repl_hold_stats();
    assert!(
        dropped > 0,
        "the backlog held everything: nothing was freed"
    );
    let relogged = master.repl_relogged_segments();
    assert!(relogged >= 4, "relogged {relogged}");

    catch_up_holding(&master, &replica, &mut st, later, true);
    assert_eq!(st.full_syncs, 1, "the replica resynchronized");
    for i in 0..n {
        for key in [format!("old{i}"), format!("del{i}")] {
            assert_eq!(
                master.peek_item(key.as_bytes(), later),
                None,
                "{key} on the master"
            );
            assert_eq!(
                replica.peek_item(key.as_bytes(), later),
                None,
                "{key} kept by the replica"
            );
        }
    }
    for j in (0..20_000).step_by(7) {
        let key = format!("fill{j}");
        assert_eq!(
            master.peek_item(key.as_bytes(), later),
            replica.peek_item(key.as_bytes(), later),
            "{key}"
        );
    }
    assert_eq!(master.digest(later), replica.digest(later));
    // It follows the tail afterwards, and the master forgets the skipped segments once no
    // replica needs them.
    store("after", b"x", 0);
    catch_up_holding(&master, &replica, &mut st, later, true);
    assert_eq!(
        replica.peek_item(b"after", later).map(|i| i.0),
        Some(b"x".to_vec())
    );
    assert_eq!(st.full_syncs, 1);
}

/// A replica that stops pulling while whole segments of short-lived items expire on its
/// master continues from its cursor when the master keeps those segments for it
/// (`repl_hold`, as a server does for the replicas it expects back). When keeping them would
/// take more than the backlog (by default a sixteenth of the memory limit,
/// `set_repl_backlog`), the master frees them, but first logs anew what the replica would
/// miss by skipping them (`repl_relogged_segments`), and the replica skips them: still no
/// full sync. Only a replica the master does not know (no hold) needs a full sync. Either
/// way it ends with the master's items.
#[test]
fn expired_segments_are_kept_or_skipped_for_a_paused_replica() {
    // (hold, bytes of short-lived items written while the replica pauses, backlog (0: the
    // default, 4 MiB here), full syncs)
    for (hold, ttl_bytes, backlog, syncs) in [
        (true, 2 << 20, 0, 1),
        (false, 2 << 20, 0, 2),
        (true, 8 << 20, 0, 1),
        (true, 8 << 20, 16 << 20, 1),
        (true, 2 << 20, 1 << 20, 1),
    ] {
        let (master, replica, mut st) = master_and_replica(64 << 20);
        master.set_repl_backlog(backlog);
        assert_eq!(
            master.repl_backlog(),
            if backlog == 0 { 4 << 20 } else { backlog }
        );
        let now = START;
        let store = |key: &str, exptime: Time| {
            set_item(&master, key, &[3u8; 40], 0, exptime, now);
        };
        for i in 0..2000 {
            store(&format!("k{i}"), 0);
        }
        catch_up_holding(&master, &replica, &mut st, now, hold);
        assert_eq!(st.full_syncs, 1);
        // The replica pauses; short-lived items fill whole segments and expire.
        for i in 0..ttl_bytes / 60 {
            store(&format!("t{i}"), now + 2);
        }
        for i in 0..100 {
            store(&format!("k{i}"), 0);
        }
        let later = now + 100;
        for _ in 0..8 {
            master.maintain(later, true);
        }
        let expired_before = stat(&master, "items", "items:1:segments_expired");
        let (held, dropped) = master.repl_hold_stats();
        let relogged = master.repl_relogged_segments();
        let within = ttl_bytes < master.repl_backlog();
        match (hold, within) {
            (true, true) => {
                assert!(held >= 2, "held {held}");
                assert_eq!((dropped, relogged, expired_before), (0, 0, 0));
            }
            _ => {
                // Past the backlog the holds were dropped; a segment of the tombstones
                // logged anew (no item in it: dead) may be held again since.
                assert!(held <= 1, "held {held}");
                assert_eq!(dropped > 0, hold);
                assert!(expired_before >= 2, "expired {expired_before}");
                // Every segment freed while the replica needed it was logged anew.
                if hold {
                    assert!(relogged >= 2, "relogged {relogged}");
                } else {
                    assert_eq!(relogged, 0);
                }
            }
        }
        catch_up_holding(&master, &replica, &mut st, later, hold);
        assert_eq!(
            st.full_syncs, syncs,
            "hold {hold}, {ttl_bytes} bytes of short-lived items, backlog {backlog}"
        );
        // Once the replica has read them, they go.
        master.maintain(later, true);
        assert_eq!(master.repl_hold_stats().0, 0);
        assert!(stat(&master, "items", "items:1:segments_expired") >= 2);
        for i in 0..2000 {
            let key = format!("k{i}");
            assert_eq!(
                master.peek_item(key.as_bytes(), later),
                replica.peek_item(key.as_bytes(), later),
                "{key}"
            );
        }
        assert_eq!(replica.peek_item(b"t0", later), None);
    }
}

/// Hostile batches are refused with an error, never a panic, and leave the replica usable:
/// batches of the current format (magic and version right, any kind, random bytes after)
/// are refused nearly always (a few random ones happen to parse as empty batches), garbage
/// cursors get a reset, and the replica then syncs with a real master to its items.
#[test]
fn garbage_batches_are_refused() {
    let replica = LogEngine::new(ops::config(1 << 20, false, true));
    replica.set_replica(true);
    let mut st = ReplicaState::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut refused = 0;
    let n = 2000usize;
    for i in 0..n {
        let mut b = b"KVRB\x02".to_vec();
        b.push((i % 4) as u8);
        for _ in 0..(i % 97) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            b.push(seed as u8);
        }
        if replica.repl_apply(&mut st, &b, START).is_err() {
            refused += 1;
        }
    }
    assert!(
        refused * 100 >= n * 95,
        "{refused} of {n} garbage batches refused"
    );
    let mut out = Vec::new();
    for i in 0..500usize {
        let cursor: Vec<u8> = (0..i).map(|j| (j * 31 + i) as u8).collect();
        out.clear();
        let served = replica.repl_serve(&cursor, false, false, 1024, &mut out);
        assert!(
            served.reset,
            "garbage cursor {i} was not answered with a reset"
        );
    }
    // Still a working replica: a master's items arrive whole.
    let master = LogEngine::new(ops::config(1 << 20, false, true));
    for k in 0..KEYS {
        let key = ops::key_name(k);
        let req = kvstore::StoreRequest {
            mode: kvstore::StoreMode::Set,
            key: &key,
            value: b"v",
            flags: k as u32,
            exptime: 0,
        };
        assert!(matches!(
            master.store(req, START),
            kvstore::StoreResult::Stored(_)
        ));
    }
    let mut fresh = ReplicaState::new();
    catch_up(&master, &replica, &mut fresh, START);
    assert_same(&master, &replica, START);
}

/// Warm restart: a dump of a master loads into a fresh engine with every live item, CAS
/// included; a truncated dump is refused and leaves the engine empty.
#[test]
fn dump_and_restore() {
    let cfg = ops::config(4 << 20, false, true);
    let master = LogEngine::new(cfg.clone());
    let now = START;
    for i in 0..20_000u32 {
        let key = format!("k{}", i % 7000);
        let value = format!("value-{i}");
        let req = kvstore::StoreRequest {
            mode: kvstore::StoreMode::Set,
            key: key.as_bytes(),
            value: value.as_bytes(),
            flags: i,
            exptime: if i % 5 == 0 { now + 100 } else { 0 },
        };
        master.store(req, now);
        if i % 11 == 0 {
            master.delete(format!("k{}", i % 3000).as_bytes(), now);
        }
    }
    let mut file = Vec::new();
    master.dump(&mut file, 0).expect("dump to memory");
    let restored = LogEngine::new(cfg.clone());
    let bytes = restored
        .restore(&mut file.as_slice(), now)
        .expect("restore");
    assert!(bytes > 0);
    for i in 0..7000 {
        let key = format!("k{i}");
        assert_eq!(
            master.peek_item(key.as_bytes(), now),
            restored.peek_item(key.as_bytes(), now),
            "{key}"
        );
    }
    // New writes draw versions above the restored ones.
    let req = kvstore::StoreRequest {
        mode: kvstore::StoreMode::Set,
        key: b"new",
        value: b"x",
        flags: 0,
        exptime: 0,
    };
    let (kvstore::StoreResult::Stored(a), kvstore::StoreResult::Stored(b)) =
        (master.store(req, now), restored.store(req, now))
    else {
        panic!("stores failed");
    };
    assert!(b >= a);

    let truncated = LogEngine::new(cfg);
    let cut = &file[..file.len() / 2];
    assert!(truncated.restore(&mut &cut[..], now).is_err());
    for i in 0..7000 {
        assert_eq!(truncated.peek_item(format!("k{i}").as_bytes(), now), None);
    }
}

/// A dump of several frames is restored by several threads with every item intact, in
/// any order of its frames; a file of the previous format loads the same.
#[test]
fn restore_of_many_frames_and_stray_batches() {
    let cfg = kvstore::EngineConfig {
        max_item_size: 1 << 20,
        ..ops::config(64 << 20, false, true)
    };
    let master = LogEngine::new(cfg.clone());
    let now = START;
    let n = 150_000u32;
    fill(&master, n, now, |i| vec![(i % 251) as u8; 100], |_| 0);
    assert_eq!(master.stats().curr_items, u64::from(n));
    let mut file = Vec::new();
    master.dump(&mut file, 0).expect("dump to memory");
    let (header, frames) = split_frames(&file);
    assert!(
        frames.len() >= 4,
        "{:?} frame lengths",
        frames.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let restored = LogEngine::new(cfg.clone());
    restored
        .restore(&mut file.as_slice(), now)
        .expect("restore");
    assert_eq!(restored.stats().curr_items, u64::from(n));
    assert_eq!(restored.digest(now), master.digest(now));
    restored.check_accounting().expect("accounting");
    // The index was sized from the header's count at once (no split during the load),
    // and no larger than the master's, which grew to the same items one split at a time.
    let splits = |e: &LogEngine| {
        e.stats_detail("slabs")
            .into_iter()
            .find(|(k, _)| k == "index_splits")
            .map(|(_, v)| v)
    };
    assert_ne!(splits(&master).as_deref(), Some("0"));
    assert_eq!(splits(&restored).as_deref(), Some("0"));
    assert!(
        restored.index_bytes() <= master.index_bytes() * 5 / 4,
        "index {} bytes restored, {} on the master",
        restored.index_bytes(),
        master.index_bytes()
    );
    // From the file in memory (as kvcached maps it): the same.
    let mapped = LogEngine::new(cfg.clone());
    mapped.restore_bytes(&file, now).expect("restore_bytes");
    assert_eq!(mapped.digest(now), master.digest(now));
    mapped.check_accounting().expect("accounting");
    // The header's count is a hint: a file that claims none or ten times too many
    // items loads every item all the same.
    for claim in [0u64, 10 * u64::from(n)] {
        let (mut header, frames) = split_frames(&file);
        header[10..18].copy_from_slice(&claim.to_le_bytes());
        let mut payloads = vec![header];
        payloads.extend(frames);
        let lying = kvstore::join_snapshot_frames(&file[..8], &payloads);
        let e = LogEngine::new(cfg.clone());
        e.restore_bytes(&lying, now).expect("restore");
        assert_eq!(e.digest(now), master.digest(now), "header claims {claim}");
        e.check_accounting().expect("accounting");
        // Growth carries on where the load left it.
        e.maintain(now, true);
        assert_eq!(e.digest(now), master.digest(now), "header claims {claim}");
    }
    for i in (0..n).step_by(7) {
        let key = format!("key:{i}");
        assert_eq!(
            master.peek_item(key.as_bytes(), now),
            restored.peek_item(key.as_bytes(), now),
            "{key}"
        );
    }
    // Files of the same frames, rearranged, with valid checksums and trailer: segment
    // images in any order, or one twice, load the same items (the newest version of a
    // key wins wherever it lies).
    let build = |order: &[usize]| {
        let mut payloads = vec![header.clone()];
        payloads.extend(order.iter().map(|&i| frames[i].clone()));
        kvstore::join_snapshot_frames(&file[..8], &payloads)
    };
    let all: Vec<usize> = (0..frames.len()).collect();
    let mut twice = all.clone();
    twice.push(0);
    let reversed: Vec<usize> = all.iter().rev().copied().collect();
    for (what, order) in [("an image twice", twice), ("in reverse", reversed)] {
        let e = LogEngine::new(cfg.clone());
        e.restore(&mut build(&order).as_slice(), now)
            .unwrap_or_else(|err| panic!("{what}: {err}"));
        assert_eq!(e.digest(now), master.digest(now), "{what}");
        e.check_accounting()
            .unwrap_or_else(|err| panic!("{what}: {err}"));
    }
}

/// Files of the formats written before this one (format 3: images of live records; format
/// 2: replication batches; both of record format 1), saved by kvcached at 963c6e5
/// (`tests/fixtures/README.md`), load with every item as it was (value, flags, expiry,
/// CAS), from a stream and from memory; new writes go above the versions they hold.
#[test]
fn files_of_earlier_formats_load() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let expect = std::fs::read_to_string(dir.join("snapshot-format3.expect")).expect("expect");
    let cfg = kvstore::EngineConfig {
        max_bytes: 1 << 20,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    };
    let now = 1_000_000;
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    };
    for (file, version) in [
        ("snapshot-format3.kvsnap", 3),
        ("snapshot-format2.kvsnap", 2),
    ] {
        let bytes = std::fs::read(dir.join(file)).expect("fixture");
        assert_eq!(bytes[7], version);
        let info = LogEngine::snapshot_info(&mut bytes.as_slice()).expect("info");
        assert_eq!(info.settings.record_format, 1);
        for way in ["stream", "memory"] {
            let e = LogEngine::new(cfg.clone());
            match way {
                "stream" => e.restore(&mut bytes.as_slice(), now),
                _ => e.restore_bytes(&bytes, now),
            }
            .unwrap_or_else(|err| panic!("{file} from {way}: {err}"));
            e.check_accounting().expect("accounting");
            let (mut items, mut highest) = (0u64, 0);
            for line in expect.lines() {
                let f: Vec<&str> = line.split(' ').collect();
                let key = hex(f[0]);
                let got = e.peek_item(&key, now);
                if f[1] == "-" {
                    assert_eq!(got, None, "{file}: {line}");
                    continue;
                }
                let (value, flags, exptime, cas) =
                    got.unwrap_or_else(|| panic!("{file} from {way}: {line} missing"));
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in &value {
                    h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
                }
                assert_eq!(
                    format!("{flags} {exptime} {cas} {}:{h:016x}", value.len()),
                    f[1..].join(" "),
                    "{file} from {way}: {}",
                    f[0]
                );
                items += 1;
                if key != b"explicit" {
                    // (That one's CAS the client chose: not a version.)
                    highest = highest.max(cas);
                }
            }
            assert_eq!(e.stats().curr_items, items, "{file} from {way}");
            let req = kvstore::StoreRequest {
                mode: kvstore::StoreMode::Set,
                key: b"new",
                value: b"x",
                flags: 0,
                exptime: 0,
            };
            let kvstore::StoreResult::Stored(c) = e.store(req, now) else {
                panic!("store");
            };
            assert!(c > highest, "{c} after {highest}");
        }
    }
}

/// A snapshot saved with more memory than the engine it is loaded into: the load keeps
/// within the memory limit, dropping the oldest segments, and the newest items are there.
/// From a file or its bytes (not a stream) the oldest images are not even loaded: what
/// the load took in is at most the smaller engine's memory.
#[test]
fn restore_into_less_memory_keeps_the_newest() {
    let big = kvstore::EngineConfig {
        max_item_size: 1 << 20,
        ..ops::config(64 << 20, false, true)
    };
    let master = LogEngine::new(big.clone());
    let now = START;
    let n = 200_000u32;
    fill(&master, n, now, |_| vec![b'v'; 150], |_| 0);
    assert_eq!(master.stats().curr_items, u64::from(n));
    let mut file = Vec::new();
    let saved = master.dump(&mut file, 0).expect("dump");
    let small_max = 16 << 20;
    let small = kvstore::EngineConfig {
        max_bytes: small_max,
        ..big
    };
    let path = std::env::temp_dir().join(format!("kvstore-restore-less-{}", std::process::id()));
    std::fs::write(&path, &file).expect("write the snapshot");
    for way in ["stream", "bytes", "file"] {
        let e = LogEngine::new(small.clone());
        let loaded = match way {
            "stream" => e.restore(&mut file.as_slice(), now),
            "bytes" => e.restore_bytes(&file, now),
            _ => {
                // Opened and then removed, so the load maps it.
                let f = std::fs::File::open(&path).expect("open");
                std::fs::remove_file(&path).expect("remove the snapshot");
                e.restore_file(&f, now)
            }
        }
        .expect("restore");
        e.check_accounting().expect("within the limit");
        let kept = e.stats().curr_items;
        assert!(kept > 0 && kept < u64::from(n), "{way}: {kept} items kept");
        let last = format!("key:{}", n - 1);
        assert_eq!(
            e.peek_item(last.as_bytes(), now),
            master.peek_item(last.as_bytes(), now),
            "{way}"
        );
        assert_eq!(e.peek_item(b"key:0", now), None, "{way}: the oldest went");
        if way == "stream" {
            assert_eq!(loaded, saved, "a stream loads every image, then shrinks");
        } else {
            assert!(
                loaded <= small_max as u64 && loaded > (small_max / 4) as u64,
                "{way}: loaded {loaded} bytes of {saved} into {small_max}"
            );
        }
    }
    // A flipped bit in the oldest image, which does not fit: not read, so the load goes
    // on; an engine with room for it refuses the file. One in the newest image is refused.
    let mut oldest = file.clone();
    oldest[4096 + 100] ^= 0x10;
    assert!(LogEngine::new(small.clone())
        .restore_bytes(&oldest, now)
        .is_ok());
    assert!(LogEngine::new(big.clone())
        .restore_bytes(&oldest, now)
        .is_err());
    let mut newest = file.clone();
    let at = newest.len() - 28 - 100;
    newest[at] ^= 0x10;
    assert!(LogEngine::new(small.clone())
        .restore_bytes(&newest, now)
        .is_err());
}

/// A snapshot file removed after it was opened is loaded by mapping its segment images: the
/// items are all there, and the mapped segments are evicted and their ids reused (with
/// fresh memory) as new writes fill the cache.
#[test]
fn restore_file_maps_segment_images() {
    let cfg = kvstore::EngineConfig {
        max_item_size: 1 << 20,
        ..ops::config(32 << 20, false, true)
    };
    let master = LogEngine::new(cfg.clone());
    let now = START;
    fill(
        &master,
        60_000,
        now,
        |i| vec![(i % 251) as u8; 100 + (i % 50) as usize],
        |i| if i % 7 == 0 { now + 1000 } else { 0 },
    );
    assert_eq!(master.stats().curr_items, 60_000);
    let path = std::env::temp_dir().join(format!("kvstore-restore-file-{}", std::process::id()));
    let mut file = Vec::new();
    master.dump(&mut file, 0).expect("dump");
    std::fs::write(&path, &file).expect("write the snapshot");
    let e = LogEngine::new(cfg.clone());
    let opened = std::fs::File::open(&path).expect("open the snapshot");
    std::fs::remove_file(&path).expect("remove the snapshot");
    e.restore_file(&opened, now).expect("restore_file");
    drop(opened);
    assert_eq!(e.digest(now), master.digest(now));
    e.check_accounting().expect("accounting");
    // The loaded segments know their earliest expiry: the background sweep finds the items
    // with a time to live once it comes (and reads nothing before).
    use kvstore::Engine as _;
    let expiring = (0..60_000u32).filter(|i| i % 7 == 0).count() as u64;
    assert_eq!((0..4).map(|_| e.maintain(now + 999, true)).sum::<u64>(), 0);
    assert_eq!(e.stats().crawler_items_checked, 0);
    assert_eq!(
        (0..4).map(|_| e.maintain(now + 1000, true)).sum::<u64>(),
        expiring
    );
    assert_eq!(e.stats().curr_items, 60_000 - expiring);
    e.check_accounting().expect("accounting after the sweep");
    // Fill the cache twice over: every loaded segment is evicted or reused.
    for i in 0..400_000u32 {
        let key = format!("new:{i}");
        let req = kvstore::StoreRequest {
            mode: kvstore::StoreMode::Set,
            key: key.as_bytes(),
            value: &[b'n'; 120],
            flags: 0,
            exptime: 0,
        };
        let r = e.store(req, now);
        assert!(
            matches!(r, kvstore::StoreResult::Stored(_)),
            "{i}: {r:?} {:?}",
            e.stats()
        );
    }
    e.check_accounting().expect("accounting after eviction");
    assert_eq!(
        e.peek_item(b"new:399999", now).map(|(v, ..)| v),
        Some(vec![b'n'; 120])
    );
    assert_eq!(
        e.peek_item(b"key:1", now),
        None,
        "the old items were evicted"
    );
    // A file cut short or damaged is refused as from memory, and the engine left empty.
    for (what, bytes) in [
        ("truncated", file[..file.len() / 2].to_vec()),
        ("empty", Vec::new()),
    ] {
        std::fs::write(&path, &bytes).expect("write");
        let e = LogEngine::new(cfg.clone());
        let f = std::fs::File::open(&path).expect("open");
        std::fs::remove_file(&path).expect("remove");
        let err = e.restore_file(&f, now).expect_err(what);
        assert_eq!(
            err,
            LogEngine::new(cfg.clone())
                .restore_bytes(&bytes, now)
                .expect_err(what),
            "{what}"
        );
        assert_eq!(e.stats().curr_items, 0, "{what}");
    }
    let mut flipped = file.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x10;
    std::fs::write(&path, &flipped).expect("write");
    let e = LogEngine::new(cfg);
    let f = std::fs::File::open(&path).expect("open");
    std::fs::remove_file(&path).expect("remove");
    assert!(e.restore_file(&f, now).is_err(), "a flipped bit loaded");
    assert_eq!(e.stats().curr_items, 0);
}

/// A snapshot file that still has a name is copied, not mapped: another process may
/// truncate it, which would make mapped pages unreadable (SIGBUS). Truncated right after
/// the load, the items are all still there.
#[test]
fn restore_file_copies_a_named_file() {
    let cfg = kvstore::EngineConfig {
        max_item_size: 1 << 20,
        ..ops::config(32 << 20, false, true)
    };
    let master = LogEngine::new(cfg.clone());
    let now = START;
    fill(&master, 20_000, now, |i| vec![(i % 251) as u8; 100], |_| 0);
    let path = std::env::temp_dir().join(format!("kvstore-restore-named-{}", std::process::id()));
    let mut file = Vec::new();
    master.dump(&mut file, 0).expect("dump");
    std::fs::write(&path, &file).expect("write the snapshot");
    let e = LogEngine::new(cfg);
    let opened = std::fs::File::open(&path).expect("open the snapshot");
    e.restore_file(&opened, now).expect("restore_file");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(0))
        .expect("truncate the snapshot");
    // Every item is read (a mapped page past the file's end would be a SIGBUS here).
    assert_eq!(e.digest(now), master.digest(now));
    drop(opened);
    std::fs::remove_file(&path).expect("remove the snapshot");
}

/// Store `n` items `key:0 ..`, item `i` with value `value(i)`, flags `i` and expiry
/// `exptime(i)`; every store must succeed.
fn fill(
    e: &LogEngine,
    n: u32,
    now: u32,
    value: impl Fn(u32) -> Vec<u8>,
    exptime: impl Fn(u32) -> u32,
) {
    for i in 0..n {
        let key = format!("key:{i}");
        let req = kvstore::StoreRequest {
            mode: kvstore::StoreMode::Set,
            key: key.as_bytes(),
            value: &value(i),
            flags: i,
            exptime: exptime(i),
        };
        let r = e.store(req, now);
        assert!(matches!(r, kvstore::StoreResult::Stored(_)), "{key}: {r:?}");
    }
}

/// A snapshot file's frames' payloads: the header, then the segment images.
fn split_frames(file: &[u8]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let (_, mut frames) = kvstore::split_snapshot_frames(file).expect("a whole snapshot");
    let header = frames.remove(0);
    (header, frames)
}

/// A snapshot file that was cut, extended, has any bit flipped, or comes from another
/// format or other settings is refused with what is wrong, and the engine stays empty.
#[test]
fn damaged_snapshots_are_refused() {
    use kvstore::SnapshotError;
    let cfg = kvstore::EngineConfig {
        max_item_size: 1 << 20,
        ..ops::config(16 << 20, false, true)
    };
    let master = LogEngine::new(cfg.clone());
    let now = START;
    fill(
        &master,
        3000,
        now,
        |i| vec![(i % 251) as u8; 20 + (i % 200) as usize],
        |i| if i % 4 == 0 { now + 1000 } else { 0 },
    );
    let mut file = Vec::new();
    master
        .dump(&mut file, 1_700_000_000)
        .expect("dump to memory");
    let info = LogEngine::snapshot_info(&mut file.as_slice()).expect("info");
    assert_eq!(info.items, 3000);
    assert_eq!(info.saved_at, 1_700_000_000);
    assert_eq!(info.settings, master.snapshot_settings());
    // Read as a stream and from memory: the same error, and the engine left empty.
    let refused = |bytes: &[u8], cfg: &kvstore::EngineConfig| -> SnapshotError {
        let e = LogEngine::new(cfg.clone());
        let err = e
            .restore(&mut &bytes[..], now)
            .expect_err("a damaged snapshot loaded");
        assert_eq!(e.stats().curr_items, 0, "{err}: not left empty");
        let m = LogEngine::new(cfg.clone());
        let err_m = m
            .restore_bytes(bytes, now)
            .expect_err("a damaged snapshot loaded from memory");
        assert_eq!(m.stats().curr_items, 0, "{err_m}: not left empty");
        assert_eq!(err, err_m, "stream and memory disagree");
        err
    };
    assert_eq!(refused(&[], &cfg), SnapshotError::Empty);
    assert_eq!(refused(b"hello, world", &cfg), SnapshotError::NotSnapshot);
    // Cut anywhere: truncated (or, inside the magic, not a snapshot).
    let step = file.len() / 97;
    for cut in (1..file.len()).step_by(step).chain([file.len() - 1]) {
        match refused(&file[..cut], &cfg) {
            SnapshotError::Truncated { offset } => assert_eq!(offset, cut as u64),
            SnapshotError::NotSnapshot if cut < 8 => {}
            other => panic!("cut at {cut}: {other}"),
        }
    }
    // One bit flipped anywhere: refused, never loaded.
    let step = file.len() / 211;
    for at in (0..file.len())
        .step_by(step)
        .chain([8, 9, 20, file.len() - 1])
    {
        let mut bad = file.clone();
        bad[at] ^= 1 << (at % 8);
        let err = refused(&bad, &cfg);
        assert!(
            matches!(
                err,
                SnapshotError::Checksum { .. }
                    | SnapshotError::NotSnapshot
                    | SnapshotError::Version { .. }
                    | SnapshotError::Truncated { .. }
                    | SnapshotError::Invalid { .. }
            ),
            "bit flipped at {at}: {err}"
        );
    }
    // Data after the end.
    let mut longer = file.clone();
    longer.push(0);
    assert!(matches!(
        refused(&longer, &cfg),
        SnapshotError::Invalid { .. }
    ));
    // Another format version.
    let mut v1 = file.clone();
    v1[7] = 1;
    assert_eq!(refused(&v1, &cfg), SnapshotError::Version { found: 1 });
    let mut v6 = file.clone();
    v6[7] = 6;
    assert_eq!(refused(&v6, &cfg), SnapshotError::Version { found: 6 });
    // Other item-layout settings: -C, another -I.
    for other in [
        kvstore::EngineConfig {
            use_cas: false,
            ..cfg.clone()
        },
        kvstore::EngineConfig {
            max_item_size: cfg.max_item_size * 2,
            ..cfg.clone()
        },
    ] {
        let err = refused(&file, &other);
        assert!(matches!(err, SnapshotError::Settings { .. }), "{err}");
        assert!(
            err.to_string().contains("saved with other item settings"),
            "{err}"
        );
    }
    // A frame dropped from the middle, checksums intact: the trailer's count says so.
    let (header, frames) = split_frames(&file);
    let mut payloads = vec![header];
    payloads.extend(frames.iter().cloned());
    let whole = kvstore::join_snapshot_frames(&file[..8], &payloads);
    assert_eq!(whole, file, "split and join give the file back");
    if payloads.len() > 3 {
        // Take one image's frame out but keep the old end frame (its last 28 bytes).
        let mut fewer = payloads.clone();
        fewer.remove(2);
        let mut dropped = kvstore::join_snapshot_frames(&file[..8], &fewer);
        let n = dropped.len();
        dropped[n - 28..].copy_from_slice(&file[file.len() - 28..]);
        assert!(matches!(
            refused(&dropped, &cfg),
            SnapshotError::Invalid { .. }
        ));
    }
    // Every segment image cut short inside, with good checksums: whichever restore thread
    // meets which, the error is always the first bad frame's (found by fuzzing: the verdict
    // depended on thread scheduling).
    let big = kvstore::EngineConfig {
        max_item_size: 1 << 20,
        ..ops::config(64 << 20, false, true)
    };
    let master = LogEngine::new(big.clone());
    fill(&master, 24_000, now, |_| vec![b'v'; 1000], |_| 0);
    let mut file = Vec::new();
    master.dump(&mut file, now.into()).expect("dump to memory");
    let cfg = big;
    let (header, frames) = split_frames(&file);
    let mut payloads = vec![header];
    payloads.extend(frames);
    assert!(payloads.len() > 4, "{} frames", payloads.len());
    let mut garbled = payloads.clone();
    for image in &mut garbled[1..] {
        // Cut inside a record: the image's checksum is recomputed, its records end badly.
        image.truncate(image.len() / 2 + 3);
    }
    let bad = kvstore::join_snapshot_frames(&file[..8], &garbled);
    // Where the first image's frame starts: its payload is on a page boundary.
    let first = (8 + 12 + garbled[0].len() + 12).next_multiple_of(4096) - 12;
    for _ in 0..20 {
        match refused(&bad, &cfg) {
            SnapshotError::Invalid { offset, .. } => assert_eq!(offset, first as u64),
            other => panic!("{other}"),
        }
    }
    // A gap before a frame that is not zero.
    let mut gap = file.clone();
    gap[8 + 12 + payloads[0].len()] = 1;
    assert!(matches!(refused(&gap, &cfg), SnapshotError::Invalid { .. }));
}

/// Throughput of shipping and applying 4 KB items in process (no network); run with
/// `cargo test --release -p kvstore --test replication -- --ignored --nocapture`.
#[test]
#[ignore]
fn ship_and_apply_throughput() {
    let cfg = kvstore::EngineConfig {
        max_bytes: 1 << 30,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    };
    let master = LogEngine::new(cfg.clone());
    let replica = LogEngine::new(cfg);
    replica.set_replica(true);
    let mut st = ReplicaState::new();
    catch_up(&master, &replica, &mut st, START);
    let value = vec![7u8; 4096];
    let n = 100_000;
    for i in 0..n {
        let key = format!("key:{i}");
        let req = kvstore::StoreRequest {
            mode: kvstore::StoreMode::Set,
            key: key.as_bytes(),
            value: &value,
            flags: 0,
            exptime: 0,
        };
        master.store(req, START);
    }
    let t = std::time::Instant::now();
    let (mut serve_t, mut apply_t) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    let mut batch = Vec::new();
    let mut cursor = Vec::new();
    loop {
        cursor.clear();
        st.cursor(&mut cursor);
        batch.clear();
        let t0 = std::time::Instant::now();
        let served = master.repl_serve(&cursor, false, false, 4 << 20, &mut batch);
        let t1 = std::time::Instant::now();
        let a = replica.repl_apply(&mut st, &batch, START).expect("apply");
        apply_t += t1.elapsed();
        serve_t += t1 - t0;
        if a.idle && served.lag_bytes == 0 {
            break;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{n} items of 4 KB: {secs:.3} s ({:.0} items/s, {:.0} MB/s); serve {:?}, apply {:?}",
        n as f64 / secs,
        n as f64 * 4096.0 / secs / 1e6,
        serve_t,
        apply_t
    );
}

/// Two replicas of one master; the master goes away and one replica is promoted. The other
/// continues from the promoted one without a full sync when it has no more than the
/// promoted one has, and resynchronizes fully when it is ahead of it.
#[test]
fn fellow_replica_switches_to_the_promoted_one() {
    let cfg = ops::config(4 << 20, false, true);
    let now = START;
    for b_ahead in [false, true] {
        let m = LogEngine::new(cfg.clone());
        let a = LogEngine::new(cfg.clone());
        let b = LogEngine::new(cfg.clone());
        a.set_replica(true);
        b.set_replica(true);
        let (mut sa, mut sb) = (ReplicaState::new(), ReplicaState::new());
        let set = |e: &LogEngine, i: u32, tag: &str| {
            let key = format!("k{}", i % 500);
            let value = format!("{tag}{i}");
            let req = kvstore::StoreRequest {
                mode: kvstore::StoreMode::Set,
                key: key.as_bytes(),
                value: value.as_bytes(),
                flags: i,
                exptime: 0,
            };
            e.store(req, now);
        };
        for i in 0..1000 {
            set(&m, i, "m");
            if i % 7 == 0 {
                m.delete(format!("k{}", i % 300).as_bytes(), now);
            }
            if i % 50 == 0 {
                pull(&m, &a, &mut sa, 777, now);
                pull(&m, &b, &mut sb, 777, now);
            }
        }
        catch_up(&m, &a, &mut sa, now);
        catch_up(&m, &b, &mut sb, now);
        // More writes that only one of them gets before the master dies.
        for i in 1000..1200 {
            set(&m, i, "late");
        }
        if b_ahead {
            catch_up(&m, &b, &mut sb, now);
        } else {
            catch_up(&m, &a, &mut sa, now);
        }
        // The master is gone: promote A; B asks A, sending its cursor in M's log.
        a.set_replica(false);
        for i in 2000..2100 {
            set(&a, i, "a");
        }
        let mut cursor = Vec::new();
        sb.cursor(&mut cursor);
        let mut batch = Vec::new();
        let served = a.repl_serve(&cursor, true, true, 4096, &mut batch);
        assert_eq!(served.switched, !b_ahead, "b_ahead {b_ahead}");
        assert_eq!(served.reset, b_ahead, "b_ahead {b_ahead}");
        let applied = b.repl_apply(&mut sb, &batch, now).expect("apply");
        assert_eq!(applied.switched, !b_ahead);
        catch_up(&a, &b, &mut sb, now);
        for i in 0..600 {
            let key = format!("k{i}");
            assert_eq!(
                a.peek_item(key.as_bytes(), now),
                b.peek_item(key.as_bytes(), now),
                "{key} (b_ahead {b_ahead})"
            );
        }
        for i in 2000..2100 {
            let key = format!("k{}", i % 500);
            assert!(b.peek_item(key.as_bytes(), now).is_some());
        }
    }
}

/// The master decides evictions: a replica with more memory than its master ends with
/// exactly the master's items, not also the ones the master evicted.
#[test]
fn replica_drops_what_the_master_evicts() {
    let master = LogEngine::new(ops::config(1 << 20, false, true));
    let replica = LogEngine::new(ops::config(16 << 20, false, true));
    replica.set_replica(true);
    let mut st = ReplicaState::new();
    let now = START;
    catch_up(&master, &replica, &mut st, now);
    let value = [9u8; 40];
    for i in 0..30_000u32 {
        let key = format!("k{i}");
        let req = kvstore::StoreRequest {
            mode: kvstore::StoreMode::Set,
            key: key.as_bytes(),
            value: &value,
            flags: i,
            exptime: 0,
        };
        master.store(req, now);
        if i % 1000 == 0 {
            pull(&master, &replica, &mut st, 1 << 20, now);
        }
    }
    catch_up(&master, &replica, &mut st, now);
    let (mut kept, mut evicted) = (0, 0);
    for i in 0..30_000 {
        let key = format!("k{i}");
        let m = master.peek_item(key.as_bytes(), now);
        if m.is_some() {
            kept += 1;
        } else {
            evicted += 1;
        }
        assert_eq!(m, replica.peek_item(key.as_bytes(), now), "{key}");
    }
    assert!(
        kept > 1000 && evicted > 1000,
        "kept {kept}, evicted {evicted}"
    );
}

/// Touches of one item from two threads in turn: each rewrite keeps the CAS and draws a
/// rewrite stamp from its thread's range, and the replica must still take the last touch.
#[test]
fn touches_on_two_threads_replicate_in_order() {
    let master = LogEngine::new(ops::config(4 << 20, false, true));
    let replica = LogEngine::new(ops::config(4 << 20, false, true));
    replica.set_replica(true);
    let now = START;
    let key = ops::key_name(0);
    // Attached before the writes, the replica gets them as log records, not a snapshot.
    let mut st = ReplicaState::new();
    catch_up(&master, &replica, &mut st, now);
    std::thread::scope(|s| {
        let workers = Threads::start(s, 2);
        let m = &master;
        let k = &key;
        // Each thread takes a range first (a set of another key), so their ranges differ.
        for t in 0..2 {
            workers.run(t, move || {
                let other = ops::key_name(1 + t);
                let req = kvstore::StoreRequest {
                    mode: kvstore::StoreMode::Set,
                    key: &other,
                    value: b"x",
                    flags: 0,
                    exptime: 0,
                };
                m.store(req, now);
            });
        }
        workers.run(0, move || {
            let req = kvstore::StoreRequest {
                mode: kvstore::StoreMode::Set,
                key: k,
                value: b"v",
                flags: 0,
                exptime: 0,
            };
            m.store(req, now);
        });
        for (i, exp) in [now + 100, now + 200, now + 300].into_iter().enumerate() {
            assert!(workers.run(i, move || m.touch(k, exp, now)));
        }
    });
    catch_up(&master, &replica, &mut st, now);
    assert_same(&master, &replica, now);
    let got = replica.peek_item(&key, now);
    assert_eq!(got.map(|i| i.2), Some(now + 300), "the last touch wins");
}

/// A chained replica (C pulls from B, B from M) when B resynchronizes: B's full sync
/// replaces its items without logging a tombstone for what it dropped, so C must
/// resynchronize too, from B's new contents. Here B fell behind M's retained log while
/// M deleted some keys and evicted others. C either caught up with B before that (its
/// cursor into B's log is still valid, and only a resync can tell it what B no longer
/// holds) or was in the middle of its own full sync from B.
#[test]
fn chained_replica_resyncs_when_its_upstream_does() {
    for c_in_snapshot in [false, true] {
        let m = LogEngine::new(ops::config(1 << 20, false, true));
        let b = LogEngine::new(ops::config(16 << 20, false, true));
        let c = LogEngine::new(ops::config(16 << 20, false, true));
        b.set_replica(true);
        c.set_replica(true);
        let (mut sb, mut sc) = (ReplicaState::new(), ReplicaState::new());
        let now = START;
        let value = [5u8; 40];
        let set = |key: &str, flags: u32| {
            let req = kvstore::StoreRequest {
                mode: kvstore::StoreMode::Set,
                key: key.as_bytes(),
                value: &value,
                flags,
                exptime: 0,
            };
            m.store(req, now);
        };
        let keys: Vec<String> = (0..200)
            .map(|i| format!("d{i}"))
            .chain((0..5000).map(|i| format!("f{i}")))
            .collect();
        for i in 0..200u32 {
            set(&format!("d{i}"), i);
        }
        catch_up(&m, &b, &mut sb, now);
        if c_in_snapshot {
            // The reset, then one snapshot batch of a few records.
            pull(&b, &c, &mut sc, 200, now);
            pull(&b, &c, &mut sc, 200, now);
            assert!(c.peek_item(b"d0", now).is_some() && c.peek_item(b"d199", now).is_none());
        } else {
            catch_up(&b, &c, &mut sc, now);
        }
        assert_eq!((sb.full_syncs, sc.full_syncs), (1, 1));
        // B stops pulling; M deletes the d keys and writes far more than it retains.
        for i in 0..200 {
            m.delete(format!("d{i}").as_bytes(), now);
        }
        for i in 0..60_000u32 {
            set(&format!("f{}", i % 5000), i);
        }
        catch_up(&m, &b, &mut sb, now);
        assert_eq!(sb.full_syncs, 2, "B should have resynchronized");
        catch_up(&b, &c, &mut sc, now);
        assert_eq!(
            sc.full_syncs, 2,
            "C should have resynchronized after B did (in snapshot: {c_in_snapshot})"
        );
        for key in &keys {
            let want = m.peek_item(key.as_bytes(), now);
            assert_eq!(want, b.peek_item(key.as_bytes(), now), "{key} on B");
            assert_eq!(
                want,
                c.peek_item(key.as_bytes(), now),
                "{key} on C (in snapshot: {c_in_snapshot})"
            );
        }
    }
}

/// A small deterministic generator (xorshift64*) for the chaos runs below.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// One random operation of the chaos runs on `e`: sets (no expiry, or a few seconds),
/// appends, deletes, touches, increments and reads of `nkeys` keys.
fn chaos_write(e: &LogEngine, rng: &mut Rng, nkeys: u64, now: Time) {
    let key = format!("c{}", rng.below(nkeys));
    let exp = [0, now + 2, now + 3600][rng.below(3) as usize];
    match rng.below(14) {
        10..=13 => {
            // Reads, so that eviction gives items second chances (copies them forward).
            e.get(
                key.as_bytes(),
                now,
                kvstore::ReadOptions::default(),
                &mut |_| {},
            );
        }
        0..=4 => {
            // Mostly small values, some of a few KB, a few large (a segment of their own).
            let len = match rng.below(100) {
                0 => 100_000 + rng.below(200_000),
                1..=20 => rng.below(4096),
                _ => 1 + rng.below(60),
            } as usize;
            let value = format!("{}", rng.below(1 << 40)).repeat(len / 10 + 1);
            let req = kvstore::StoreRequest {
                mode: kvstore::StoreMode::Set,
                key: key.as_bytes(),
                value: value.as_bytes(),
                flags: rng.below(1 << 16) as u32,
                exptime: exp,
            };
            e.store(req, now);
        }
        5 | 6 => {
            e.delete(key.as_bytes(), now);
        }
        7 => {
            e.touch(key.as_bytes(), exp, now);
        }
        8 => {
            e.arith(key.as_bytes(), true, rng.below(1000), now);
        }
        _ => {
            let req = kvstore::StoreRequest {
                mode: kvstore::StoreMode::Append,
                key: key.as_bytes(),
                value: b"7",
                flags: 0,
                exptime: 0,
            };
            e.store(req, now);
        }
    }
}

/// The chaos test's topology at engine level, with real threads: M with writers, P its
/// replica, R2 chained behind P; then P promoted and written to, and O (the old master,
/// empty) following P with full syncs forced at random points. Memory is small, so
/// segments are evicted and items copied forward throughout. Every replica must end with
/// P's items.
fn chaos_engines(seed: u64) {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    const NKEYS: u64 = 3000;
    let cfg = kvstore::EngineConfig {
        max_bytes: 8 << 20,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    };
    // Replicas with more memory than their masters: they evict nothing on their own (an
    // item a replica evicts is not an error), so every difference is one.
    let big = kvstore::EngineConfig {
        max_bytes: 64 << 20,
        ..cfg.clone()
    };
    let m = LogEngine::new(cfg.clone());
    let p = LogEngine::new(cfg);
    let r2 = LogEngine::new(big.clone());
    let o = LogEngine::new(big);
    for e in [&p, &r2, &o] {
        e.set_replica(true);
    }
    let (mut sp, mut s2, mut so) = (
        ReplicaState::new(),
        ReplicaState::new(),
        ReplicaState::new(),
    );
    let clock = AtomicU32::new(START);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let budgets = [64usize, 700, 4096, 1 << 16];
    let run = |writes_to: &LogEngine,
               phase: u64,
               rng: &mut Rng,
               pulls: &mut dyn FnMut(&mut Rng, Time)| {
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (stop, clock) = (&stop, &clock);
                s.spawn(move || {
                    let mut rng =
                        Rng((seed ^ (phase << 8) ^ t).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
                    for _ in 0..200_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        chaos_write(writes_to, &mut rng, NKEYS, clock.load(Ordering::Relaxed));
                    }
                });
            }
            {
                let (stop, clock) = (&stop, &clock);
                let all = [&m, &p, &r2, &o];
                s.spawn(move || {
                    // As the server's maintenance thread does, much more often.
                    for _ in 0..1_000_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        for e in all {
                            e.maintain(clock.load(Ordering::Relaxed), true);
                        }
                        std::thread::yield_now();
                    }
                });
            }
            for i in 0..400u32 {
                if i % 50 == 49 {
                    clock.fetch_add(1, Ordering::Relaxed);
                }
                pulls(rng, clock.load(Ordering::Relaxed));
            }
            stop.store(true, Ordering::Relaxed);
        });
    };
    // Phase 1: M written to; P follows M, R2 follows P.
    run(&m, 1, &mut rng, &mut |rng, now| {
        let b = budgets[rng.below(4) as usize];
        pull(&m, &p, &mut sp, b, now);
        let b = budgets[rng.below(4) as usize];
        pull(&p, &r2, &mut s2, b, now);
    });
    let now = clock.load(Ordering::Relaxed);
    catch_up(&m, &p, &mut sp, now);
    // Phase 2: M is gone; P promoted and written to; R2 follows P; O syncs from P and
    // now and then starts over (a full sync forced, as after a lost segment).
    p.set_replica(false);
    run(&p, 2, &mut rng, &mut |rng, now| {
        let b = budgets[rng.below(4) as usize];
        pull(&p, &r2, &mut s2, b, now);
        let mut cursor = Vec::new();
        so.cursor(&mut cursor);
        let fresh = rng.below(40) == 0;
        let mut batch = Vec::new();
        p.repl_serve(
            &cursor,
            fresh,
            false,
            budgets[rng.below(4) as usize],
            &mut batch,
        );
        o.repl_apply(&mut so, &batch, now)
            .unwrap_or_else(|e| panic!("O rejected a batch: {e}"));
    });
    let now = clock.load(Ordering::Relaxed);
    catch_up(&p, &r2, &mut s2, now);
    catch_up(&p, &o, &mut so, now);
    let mut bad = Vec::new();
    for k in 0..NKEYS {
        let key = format!("c{k}");
        let want = p.peek_item(key.as_bytes(), now);
        for (who, e) in [("R2", &r2), ("O", &o)] {
            let got = e.peek_item(key.as_bytes(), now);
            if got != want {
                bad.push(format!("{key} on {who}: P {want:?}, {who} {got:?}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "seed {seed}: {} differences (O full syncs {}, R2 {}; evictions P {} R2 {} O {}):\n{}",
        bad.len(),
        so.full_syncs,
        s2.full_syncs,
        p.stats().evictions,
        r2.stats().evictions,
        o.stats().evictions,
        bad[..bad.len().min(10)].join("\n")
    );
}

/// A few seeds of [`chaos_engines`] in every run (each found a difference in about one in
/// fifty seeds before the fixes it came with); `chaos_engines_many_seeds` runs more.
#[test]
fn chaos_engines_end_equal() {
    for seed in 0..3 {
        chaos_engines(seed);
    }
}

#[test]
#[ignore = "a stress run: KVSTORE_CHAOS_SEEDS=N or A..B (release build advised)"]
fn chaos_engines_many_seeds() {
    // `N` (seeds 0 to N - 1) or `A..B`.
    let spec = std::env::var("KVSTORE_CHAOS_SEEDS").unwrap_or_else(|_| "20".into());
    let (a, b) = match spec.split_once("..") {
        Some((a, b)) => (a.parse().unwrap_or(0), b.parse().unwrap_or(0)),
        None => (0, spec.parse().unwrap_or(20)),
    };
    for seed in a..b {
        chaos_engines(seed);
    }
}
