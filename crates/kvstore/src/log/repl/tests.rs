use std::collections::BTreeMap;

use std::sync::atomic::Ordering;

use super::super::sync::lock;
use super::super::LogEngine;
use super::remembered::*;
use super::wire::{Cursor, Phase, Pos, ReplicaState};
use super::{held_for_replica, Holds, Served, MAX_HOLDS};
use crate::Time;

#[test]
fn a_full_tombstone_memory_forgets_the_oldest_batches_first_and_leaves_a_floor() {
    let mut tombs = Remembered::default();
    let key = |i: usize| format!("k{i}").into_bytes();
    for i in 0..5 {
        remember_tombstone(&mut tombs, &key(i), (10 + i as u64, 0), 1);
    }
    assert!(tombs.floor.is_none());
    // A newer tombstone of a remembered key replaces it without forgetting others.
    remember_tombstone(&mut tombs, &key(0), (20, 0), 2);
    remember_tombstone(&mut tombs, &key(0), (15, 0), 2);
    assert_eq!(tombs.map.get(key(0).as_slice()), Some(&((20, 0), 2)));
    for i in 5..12 {
        remember_tombstone(&mut tombs, &key(i), (30, 0), 2);
        assert!(tombs.map.len() <= MAX_TOMBS);
    }
    // The memory filled during batch 2: batch 1's tombstones went, all of batch 2's stay.
    for i in 1..5 {
        assert!(
            !tombs.map.contains_key(key(i).as_slice()),
            "k{i} of batch 1 kept"
        );
    }
    for i in std::iter::once(0).chain(5..12) {
        assert!(
            tombs.map.contains_key(key(i).as_slice()),
            "k{i} of batch 2 forgotten"
        );
    }
    // What went leaves a floor: the highest version forgotten (k4's 14) and its batch.
    assert_eq!(tombs.floor, Some(((14, 0), 1)));
    // An item of a forgotten key below its tombstone is still outdated, through the
    // floor (so is any item that old); one above the floor is not.
    assert!(tombs.outdated(&key(3), (12, 0), false));
    assert!(tombs.outdated(b"other", (14, 0), false));
    assert!(!tombs.outdated(&key(3), (15, 0), false));
    assert!(!tombs.outdated(b"other", (15, 0), false));
    // The remembered keys are compared as before.
    assert!(tombs.outdated(&key(5), (29, 0), false));
    assert!(!tombs.outdated(&key(5), (30, 0), false));
    assert!(tombs.outdated(&key(5), (30, 0), true));
    // A complete batch 2: batch 1's records have all arrived, the floor goes; batch
    // 2's tombstones stay.
    forget_before(&mut tombs, 2);
    assert!(tombs.floor.is_none());
    assert!(!tombs.outdated(b"other", (14, 0), false));
    assert!(tombs.outdated(&key(5), (29, 0), false));
    // One batch with more tombstones than fit: the memory stays bounded, and every
    // one forgotten is under the floor until a complete batch after it.
    for i in 100..100 + 3 * MAX_TOMBS {
        remember_tombstone(&mut tombs, &key(i), (100 + i as u64, 0), 3);
        assert!(tombs.map.len() <= MAX_TOMBS);
    }
    for i in 100..100 + 3 * MAX_TOMBS {
        assert!(tombs.outdated(&key(i), (99 + i as u64, 0), false), "k{i}");
    }
    forget_before(&mut tombs, 3);
    assert!(tombs.floor.is_some(), "batch 3's own went: the floor stays");
    forget_before(&mut tombs, 4);
    assert_eq!(tombs.weight(), 0);
}

/// One pull in a unit test: serve `st`'s cursor on `m`, apply the batch on `r`.
fn pull_once(m: &LogEngine, r: &LogEngine, st: &mut ReplicaState, now: Time) -> Served {
    pull_budget(m, r, st, now, 1 << 20)
}

fn pull_budget(
    m: &LogEngine,
    r: &LogEngine,
    st: &mut ReplicaState,
    now: Time,
    budget: usize,
) -> Served {
    let mut cursor = Vec::new();
    st.cursor(&mut cursor);
    let mut batch = Vec::new();
    let served = m.repl_serve_as(None, &cursor, false, false, budget, &mut batch);
    let applied = r.repl_apply(st, &batch, now);
    assert!(applied.is_ok(), "replica rejected a batch: {applied:?}");
    served
}

fn open_lengths(e: &LogEngine) -> BTreeMap<u64, u32> {
    e.own_position()
        .entries
        .iter()
        .map(|&(s, p)| (s, p.off))
        .collect()
}

/// A full sync ships the tombstones of the segments open when its starting cursor was
/// taken, not those of sealed segments (whose older records are all below the cursor
/// and no longer indexed), so a master with more tombstones in its log than a replica
/// remembers (`MAX_TOMBS`) does not make it forget the ones it needs. The needed case
/// is staged: an item published into one open segment just after the cursor read that
/// segment's length, deleted at once by a tombstone in another open segment that the
/// cursor read later. The item arrives with the tail, after the tombstone.
#[test]
fn a_full_sync_ships_the_tombstones_of_open_segments_only() {
    use crate::Engine as _;
    let cfg = super::super::tests::cfg(64 << 20);
    let (m, r) = (LogEngine::new(cfg.clone()), LogEngine::new(cfg));
    let now = 1_000;
    let set = |key: &[u8], value: &[u8], exptime: Time| {
        m.store(
            crate::StoreRequest {
                mode: crate::StoreMode::Set,
                key,
                value,
                flags: 0,
                exptime,
            },
            now,
        )
    };
    let old = |i: usize| format!("old{i}").into_bytes();
    for i in 0..4 * MAX_TOMBS + 3 {
        set(&old(i), b"v", 0);
        assert!(m.delete(&old(i), now));
    }
    // Seal the segment that holds those tombstones.
    let fill = vec![b'f'; 1000];
    let first = open_lengths(&m);
    for i in 0.. {
        set(format!("fill{i}").as_bytes(), &fill, 0);
        let open = open_lengths(&m);
        if first.keys().all(|s| !open.contains_key(s)) {
            break;
        }
        assert!(i < 100_000, "the first segment never sealed");
    }
    // The race: `k` goes to its TTL class's open segment, its tombstone to the
    // shard's; the cursor will say the class segment was read before `k` was in.
    set(b"z", b"opens the class segment", now + 100);
    let before = open_lengths(&m);
    set(b"k", b"deleted", now + 100);
    let after = open_lengths(&m);
    let grew: Vec<u64> = after
        .iter()
        .filter(|&(s, &off)| before.get(s).is_some_and(|&b| b != off))
        .map(|(&s, _)| s)
        .collect();
    let [class_seg] = grew[..] else {
        panic!("k did not go to exactly one open segment: {before:?} -> {after:?}");
    };
    assert!(m.delete(b"k", now));
    let shard_seg = open_lengths(&m)
        .iter()
        .find(|&(s, &off)| after.get(s).is_some_and(|&a| a != off))
        .map(|(&s, _)| s);
    assert!(
        shard_seg.is_some_and(|s| s != class_seg),
        "k's tombstone is not in another open segment"
    );

    let mut st = ReplicaState::new();
    assert!(pull_once(&m, &r, &mut st, now).reset);
    let Some(p) = st.entries.get_mut(&class_seg) else {
        panic!("the class segment is not in the starting cursor");
    };
    p.off = before[&class_seg];
    while st.phase() == "snapshot" {
        pull_once(&m, &r, &mut st, now);
    }
    assert!(
        st.tombs.map.contains_key(b"k".as_slice()),
        "k's tombstone not shipped"
    );
    for i in 0..4 * MAX_TOMBS + 3 {
        assert!(
            !st.tombs.map.contains_key(old(i).as_slice()),
            "a tombstone of a sealed segment was shipped"
        );
    }
    for _ in 0..100 {
        if pull_once(&m, &r, &mut st, now).lag_bytes == 0 {
            break;
        }
    }
    let has = |key: &[u8]| r.get(key, now, crate::ReadOptions::default(), &mut |_| {});
    assert!(!has(b"k"), "k came back");
    assert!(has(b"z"));
    assert_eq!(r.digest(now), m.digest(now));
}

/// A replica remembers an item it removes on its own (here: expired) only while an
/// older record of its key may still arrive: not once a tail batch that was not cut
/// short has been applied after the item's. A million items expiring at once on a
/// caught-up replica used to cost a map entry each (about 80 MB).
#[test]
fn a_replica_remembers_its_own_removals_only_while_older_records_may_come() {
    use crate::Engine as _;
    let cfg = super::super::tests::cfg(16 << 20);
    let (m, r) = (LogEngine::new(cfg.clone()), LogEngine::new(cfg));
    r.set_replica(true);
    let now = 1_000;
    let set = |key: &[u8], exptime: Time| {
        m.store(
            crate::StoreRequest {
                mode: crate::StoreMode::Set,
                key,
                value: &[b'v'; 100],
                flags: 0,
                exptime,
            },
            now,
        )
    };
    let get = |key: &[u8], at: Time| r.get(key, at, crate::ReadOptions::default(), &mut |_| {});
    let removed = || r.repl.removed_len.load(Ordering::Acquire);
    let mut st = ReplicaState::new();
    // Settled: a full sync, then the tail caught up (its last batch complete).
    for i in 0..100 {
        set(format!("a{i}").as_bytes(), now + 10);
    }
    for _ in 0..100 {
        let served = pull_once(&m, &r, &mut st, now);
        if st.phase() == "tail" && served.lag_bytes == 0 {
            break;
        }
    }
    for i in 0..100 {
        set(format!("b{i}").as_bytes(), now + 10);
    }
    let served = pull_once(&m, &r, &mut st, now);
    assert_eq!(served.lag_bytes, 0);
    for i in 0..100 {
        assert!(!get(format!("a{i}").as_bytes(), now + 20));
        assert!(!get(format!("b{i}").as_bytes(), now + 20));
    }
    assert_eq!(
        removed(),
        0,
        "removals below the settled position were remembered"
    );

    // Items of a batch cut short by the budget: remembered when removed, forgotten
    // after the next complete batch.
    for i in 0..100 {
        set(format!("c{i}").as_bytes(), now + 10);
    }
    let served = pull_budget(&m, &r, &mut st, now, 1000);
    assert!(served.lag_bytes > 0);
    for i in 0..100 {
        assert!(!get(format!("c{i}").as_bytes(), now + 20));
    }
    assert!(
        removed() > 0,
        "a removal that an older record may follow was forgotten"
    );
    pull_once(&m, &r, &mut st, now);
    assert_eq!(removed(), 0);
}

/// `own_position` reads only the open segments; it must give what a scan of every
/// live segment gives (open ones at their length), after writes from several threads
/// that open, seal, evict and retire segments, large items among them.
#[test]
fn own_position_lists_exactly_the_open_live_segments() {
    let scan = |e: &LogEngine| {
        let (next, live) = e.order.numbered();
        let mut entries = Vec::new();
        for &(seq, id) in &live {
            let Some(seg) = e.segs.get(id) else {
                continue;
            };
            if !seg.is_sealed() && seg.seq() == seq {
                let off = seg.used() as u32;
                entries.push((seq, off));
            }
        }
        (next, entries)
    };
    let own = |e: &LogEngine| {
        let c = e.own_position();
        assert_eq!(c.phase, Phase::Tail);
        let entries: Vec<(u64, u32)> = c.entries.iter().map(|&(s, p)| (s, p.off)).collect();
        assert!(c.entries.iter().all(|(_, p)| !p.complete));
        (c.below, entries)
    };
    let e = LogEngine::new(crate::EngineConfig {
        max_bytes: 16 << 20,
        max_item_size: 4 << 20,
        no_evict: false,
        use_cas: true,
    });
    assert_eq!(own(&e), scan(&e));
    for round in 0..4u32 {
        std::thread::scope(|s| {
            for t in 0..3u32 {
                let e = &e;
                s.spawn(move || {
                    for i in 0..3000u32 {
                        let key = format!("r{round}t{t}k{i}");
                        // Mostly small values, every 500th larger than a segment.
                        let len = if i % 500 == 499 {
                            1_200_000
                        } else {
                            200 + (i % 7) as usize * 300
                        };
                        let value = vec![b'v'; len];
                        crate::Engine::store(
                            e,
                            crate::StoreRequest {
                                mode: crate::StoreMode::Set,
                                key: key.as_bytes(),
                                value: &value,
                                flags: 0,
                                exptime: 0,
                            },
                            1_000 + round,
                        );
                    }
                });
            }
        });
        let (next, entries) = own(&e);
        assert!(!entries.is_empty(), "round {round}: no open segment");
        assert_eq!((next, entries.clone()), scan(&e), "round {round}");
        // Only open segments are listed (a sealed or retired one left in the list would
        // grow it without bound), however many live ones there are.
        assert_eq!(e.order.open().1.len(), entries.len(), "round {round}");
        assert!(e.order.live().len() > entries.len());
    }
}

/// What a replica's cursor leaves unread is held: listed and incomplete, or unlisted
/// at or above `below`; a listed complete one and anything else below `below` is not.
/// Pulls under ever new names (a client making them up, replicas restarting) keep
/// at most `MAX_HOLDS` positions, and a hostile cursor costs no more than a real one.
#[test]
fn holds_follow_cursors_and_stay_bounded() {
    let pos = |off, complete| Pos { off, complete };
    let c = Cursor {
        phase: Phase::Tail,
        below: 10,
        entries: vec![
            (7, pos(100, false)),
            (8, pos(200, true)),
            (12, pos(5, true)),
        ],
    };
    let holds: Holds = vec![("r".into(), c)];
    for (seq, held) in [(6, false), (7, true), (8, false), (9, false), (10, true)] {
        assert_eq!(held_for_replica(&holds, seq), held, "segment {seq}");
    }
    assert!(!held_for_replica(&holds, 12));
    assert!(held_for_replica(&holds, 13));
    assert!(!held_for_replica(&Holds::new(), 13));

    let e = LogEngine::new(crate::EngineConfig {
        max_bytes: 16 << 20,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    });
    let mut out = Vec::new();
    for i in 0..3 * MAX_HOLDS {
        out.clear();
        let name = format!("r{i}");
        e.repl_serve_as(Some(&name), b"garbage", false, false, 1 << 16, &mut out);
    }
    assert_eq!(lock(&e.repl.holds).len(), MAX_HOLDS);
    e.repl_hold(|name| name == "r0");
    assert_eq!(lock(&e.repl.holds).len(), 1);
    e.repl_hold(|_| false);
    assert!(lock(&e.repl.holds).is_empty());
}

/// Replication format 2 against an engine of format 1: a batch of version 1 is refused
/// with what to do, and a replica whose cursor is of format 1 gets a reset whose reason,
/// which the master logs, says it must be upgraded.
#[test]
fn format_1_peers_are_refused_with_a_reason() {
    let cfg = crate::EngineConfig {
        max_bytes: 4 << 20,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    };
    let (m, r) = (LogEngine::new(cfg.clone()), LogEngine::new(cfg));
    let now = 1_000_000;
    let mut st = ReplicaState::new();
    pull_once(&m, &r, &mut st, now);
    let mut cursor = Vec::new();
    st.cursor(&mut cursor);
    let mut batch = Vec::new();
    m.repl_serve_as(None, &cursor, false, false, 1 << 20, &mut batch);
    // The same batch, as a master of format 1 would mark it.
    batch[4] = 1;
    let err = r.repl_apply(&mut st, &batch, now).expect_err("refused");
    assert!(
        err == super::ReplError::Format1
            && err.to_string().contains("format 1")
            && err.to_string().contains("upgrade the master"),
        "{err}"
    );
    // A replica of format 1 sends the old magic.
    cursor[..4].copy_from_slice(b"KVRC");
    let mut out = Vec::new();
    let served = m.repl_serve_as(None, &cursor, false, false, 1 << 20, &mut out);
    assert!(served.reset);
    assert_eq!(served.reset_why, super::WHY_FORMAT_1);
    assert!(served.reset_why.contains("upgrade it"));
}
