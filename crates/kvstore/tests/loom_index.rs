//! Loom models of the index's slot and growth protocols (`src/log/index.rs`): every
//! interleaving of a lock-free reader with a split (copy to the new bucket after marking
//! the old slot `MOVED`, publish the new addressing, end the work), with a compaction (the
//! same steps inside one chain), and with a writer replacing the item of a slot (`BUSY`,
//! location, final meta word), under the C11 memory model as loom explores it.
//!
//! The models restate the protocol on loom's atomics with two buckets of two slots (each
//! a 32-bit location and a 16-bit meta word), rather than running `Index` itself: `Index`
//! lives in an mmap'd table of std atomics. Each model mirrors, step for step and ordering
//! for ordering, `Index::find`, `Index::split`, `Index::compact`, `Slot::fetch_update`,
//! `Slot::compare_exchange` and the win mark's compare-exchange under the stripe lock
//! (`LogEngine::meta_read`); a change to those must be made here too. The `wide` models do
//! the same for the wide layout's one-word slots.

use loom::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

const MOVED: u16 = 1 << 15;
const BUSY: u16 = 1 << 14;
const WIN: u16 = 1 << 13;
const FETCHED: u16 = 1 << 12;
/// Our key's tag (low bits of the meta word).
const TAG: u16 = 7;
/// Our item's location, and the location of its next version.
const ITEM: u32 = 0x10_0018;
const NEXT: u32 = 0x20_0018;

struct Table {
    /// Bucket 0 is slots 0-1, bucket 1 (the split image) slots 2-3.
    loc: [AtomicU32; 4],
    meta: [AtomicU16; 4],
    /// The key's bucket under the current addressing (0 before the split, 1 after).
    addr: AtomicU64,
    /// 1 + the bucket being split or compacted, or 0.
    work: AtomicUsize,
    /// The key's stripe lock.
    lock: Mutex<()>,
}

impl Table {
    fn new(at: usize, addr: u64) -> Arc<Table> {
        let t = Table {
            loc: Default::default(),
            meta: Default::default(),
            addr: AtomicU64::new(addr),
            work: AtomicUsize::new(0),
            lock: Mutex::new(()),
        };
        t.meta[at].store(TAG, Ordering::Relaxed);
        t.loc[at].store(ITEM, Ordering::Relaxed);
        Arc::new(t)
    }

    /// `Slot::load`: (location, meta word), or None when empty.
    fn load(&self, i: usize) -> Option<(u32, u16)> {
        let loc = self.loc[i].load(Ordering::Acquire);
        if loc == 0 {
            return None;
        }
        Some((loc, self.meta[i].load(Ordering::Acquire)))
    }

    /// `Index::find` for our key: its slot, location and meta word.
    fn find(&self) -> Option<(usize, u32, u16)> {
        let mut b = self.addr.load(Ordering::Acquire) as usize;
        let mut rescanned = false;
        loop {
            let mut moved = false;
            for i in b * 2..b * 2 + 2 {
                if let Some((loc, m)) = self.load(i) {
                    if m & 0x3ff == TAG {
                        if m & MOVED != 0 {
                            moved = true;
                        } else {
                            return Some((i, loc, m & !BUSY));
                        }
                    }
                }
            }
            if !moved {
                return None;
            }
            while self.work.load(Ordering::Acquire) == b + 1 {
                thread::yield_now();
            }
            let nb = self.addr.load(Ordering::Acquire) as usize;
            if nb != b {
                b = nb;
            } else if rescanned {
                return None;
            } else {
                rescanned = true;
            }
        }
    }

    /// A fresh slot: the meta word before the location (`Slot::fetch_update` on an empty
    /// slot).
    fn fill(&self, i: usize, loc: u32, m: u16) {
        self.meta[i].store(m, Ordering::Relaxed);
        self.loc[i].store(loc, Ordering::Release);
    }

    /// `Index::split` of bucket 0 (under the stripe lock): our item moves to bucket 1.
    fn split(&self) {
        let _g = self.lock.lock().unwrap();
        self.work.store(1, Ordering::Release);
        let loc = self.loc[0].load(Ordering::Relaxed);
        let m = self.meta[0].fetch_or(MOVED, Ordering::AcqRel);
        self.fill(2, loc, m);
        self.addr.store(1, Ordering::Release);
        self.work.store(0, Ordering::Release);
    }

    /// `Index::compact` of bucket 0: our item moves from slot 1 (standing for an overflow
    /// bucket) to the free slot 0.
    fn compact(&self) {
        let _g = self.lock.lock().unwrap();
        self.work.store(1, Ordering::Release);
        let loc = self.loc[1].load(Ordering::Relaxed);
        let m = self.meta[1].fetch_or(MOVED, Ordering::AcqRel);
        self.fill(0, loc, m);
        self.work.store(0, Ordering::Release);
    }

    /// A writer that rewrites our item in slot `i` (a touch: same key, new location,
    /// access and win bits carried over): `Slot::fetch_update` under the stripe lock.
    /// Returns the meta word it replaced.
    fn replace(&self, i: usize) -> u16 {
        let _g = self.lock.lock().unwrap();
        let m = self.meta[i].fetch_or(BUSY, Ordering::Acquire);
        self.loc[i].store(NEXT, Ordering::Release);
        self.meta[i].store(m & !BUSY, Ordering::Release);
        m
    }

    /// A reader's access mark: `Slot::compare_exchange` of the meta word it loaded.
    fn mark(&self) -> Option<bool> {
        let (i, _, m) = self.find()?;
        Some(
            self.meta[i]
                .compare_exchange(m, m | FETCHED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
        )
    }

    /// A meta read that wants the win token: true if it won. Under the stripe lock, on the
    /// item it found (`LogEngine::meta_read`).
    fn try_win(&self) -> bool {
        loop {
            let Some((_, loc, _)) = self.find() else {
                panic!("the item was missed");
            };
            let _g = self.lock.lock().unwrap();
            // The slot may have moved before the lock: find it again under the lock.
            let Some((i, now_loc, m)) = self.find() else {
                panic!("the item was missed");
            };
            if now_loc != loc {
                continue;
            }
            if m & WIN != 0 {
                return false;
            }
            if self.meta[i]
                .compare_exchange(m, m | WIN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
        }
    }
}

/// Loom with a preemption bound (the readers spin while a split of their bucket is under
/// way, which unbounded exploration cannot finish).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 10_000;
    b.check(f);
}

#[test]
fn a_reader_never_misses_an_item_being_split() {
    model(|| {
        let t = Table::new(0, 0);
        let r = {
            let t = t.clone();
            thread::spawn(move || t.find().map(|(_, loc, _)| loc))
        };
        t.split();
        assert_eq!(r.join().unwrap(), Some(ITEM));
        assert_eq!(t.find().map(|(i, _, _)| i), Some(2));
    });
}

#[test]
fn a_reader_never_misses_an_item_being_compacted() {
    model(|| {
        let t = Table::new(1, 0);
        let r = {
            let t = t.clone();
            thread::spawn(move || t.find().map(|(_, loc, _)| loc))
        };
        t.compact();
        assert_eq!(r.join().unwrap(), Some(ITEM));
        assert_eq!(t.find().map(|(i, _, _)| i), Some(0));
    });
}

/// A win mark a reader sets while its item moves is never lost: the copy carries it, so a
/// later reader cannot win the same token (two racing readers plus the mover exceed what
/// loom can explore here; the two readers' own race is serialized by the stripe lock).
#[test]
fn a_win_is_never_lost_across_a_split() {
    model(|| {
        let t = Table::new(0, 0);
        let r = {
            let t = t.clone();
            thread::spawn(move || t.try_win())
        };
        t.split();
        assert!(r.join().unwrap(), "the only reader wins");
        assert_eq!(t.meta[2].load(Ordering::Relaxed) & WIN, WIN);
        assert!(!t.try_win(), "a second reader sees the token sent");
    });
}

#[test]
fn a_win_is_never_lost_across_a_compaction() {
    model(|| {
        let t = Table::new(1, 0);
        let r = {
            let t = t.clone();
            thread::spawn(move || t.try_win())
        };
        t.compact();
        assert!(r.join().unwrap(), "the only reader wins");
        assert_eq!(t.meta[0].load(Ordering::Relaxed) & WIN, WIN);
        assert!(!t.try_win(), "a second reader sees the token sent");
    });
}

/// A reader that marks an access while a writer replaces the item either has its mark
/// carried into the new item (its exchange came before the writer's `BUSY`) or sees its
/// exchange fail: a mark is never written over by the writer's final store. And the reader
/// sees the old item or the new one, whole (never an empty or untagged slot).
#[test]
fn a_replacement_carries_a_readers_mark_or_fences_it_out() {
    model(|| {
        let t = Table::new(0, 0);
        let r = {
            let t = t.clone();
            thread::spawn(move || {
                let seen = t.find().map(|(_, loc, _)| loc);
                (seen, t.mark())
            })
        };
        let replaced = t.replace(0);
        let (seen, marked) = r.join().unwrap();
        assert!(seen == Some(ITEM) || seen == Some(NEXT), "{seen:?}");
        let fin = t.meta[0].load(Ordering::Relaxed);
        assert_eq!(fin & BUSY, 0);
        if marked == Some(true) {
            assert_eq!(fin & FETCHED, FETCHED, "a mark that succeeded was lost");
        }
        if replaced & FETCHED == 0 {
            // The reader's mark, if any, landed after the replacement.
            assert_eq!(t.loc[0].load(Ordering::Relaxed), NEXT);
        }
    });
}

/// The wide layout's slot: one word holding the whole value (`Slot`'s `Wide` words).
mod wide {
    use super::{model, thread};
    use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use loom::sync::{Arc, Mutex};

    const VALID: u64 = 1 << 63;
    const MOVED: u64 = 1 << 62;
    const WIN: u64 = 1 << 61;
    const FETCHED: u64 = 1 << 60;
    /// The tag and valid bits a lookup compares (`WIDE_MATCH`).
    const MATCH: u64 = VALID | (0xffff << 42);
    const ITEM: u64 = VALID | (7 << 42) | 0x10_0018;
    const NEXT: u64 = VALID | (7 << 42) | 0x20_0018;

    struct Table {
        /// Bucket 0 is slots 0-1, bucket 1 (the split image) slots 2-3.
        slot: [AtomicU64; 4],
        addr: AtomicU64,
        work: AtomicUsize,
        lock: Mutex<()>,
    }

    impl Table {
        fn new(at: usize) -> Arc<Table> {
            let t = Table {
                slot: Default::default(),
                addr: AtomicU64::new(0),
                work: AtomicUsize::new(0),
                lock: Mutex::new(()),
            };
            t.slot[at].store(ITEM, Ordering::Relaxed);
            Arc::new(t)
        }

        /// `Index::find`'s wide arm for our key: its slot and value.
        fn find(&self) -> Option<(usize, u64)> {
            let mut b = self.addr.load(Ordering::Acquire) as usize;
            let mut rescanned = false;
            loop {
                let mut moved = false;
                for i in b * 2..b * 2 + 2 {
                    let v = self.slot[i].load(Ordering::Acquire);
                    if v & MATCH != ITEM & MATCH {
                        continue;
                    }
                    if v & MOVED != 0 {
                        moved = true;
                    } else {
                        return Some((i, v));
                    }
                }
                if !moved {
                    return None;
                }
                while self.work.load(Ordering::Acquire) == b + 1 {
                    thread::yield_now();
                }
                let nb = self.addr.load(Ordering::Acquire) as usize;
                if nb != b {
                    b = nb;
                } else if rescanned {
                    return None;
                } else {
                    rescanned = true;
                }
            }
        }

        /// `Slot::fetch_update` on a wide slot: a compare-exchange loop.
        fn update(&self, i: usize, f: impl Fn(u64) -> u64) -> u64 {
            let mut cur = self.slot[i].load(Ordering::Relaxed);
            loop {
                match self.slot[i].compare_exchange_weak(
                    cur,
                    f(cur),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return cur,
                    Err(x) => cur = x,
                }
            }
        }

        /// `Index::split` of bucket 0: mark, copy into the new bucket, publish.
        fn split(&self) {
            let _g = self.lock.lock().unwrap();
            self.work.store(1, Ordering::Release);
            let x = self.slot[0].fetch_or(MOVED, Ordering::AcqRel);
            self.update(2, |_| x);
            self.addr.store(1, Ordering::Release);
            self.work.store(0, Ordering::Release);
        }

        /// A touch: the item's new location, access and win bits carried over.
        fn replace(&self, i: usize) -> u64 {
            let _g = self.lock.lock().unwrap();
            self.update(i, |x| NEXT | (x & (WIN | FETCHED)))
        }

        fn mark(&self) -> Option<bool> {
            let (i, v) = self.find()?;
            Some(
                self.slot[i]
                    .compare_exchange(v, v | FETCHED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok(),
            )
        }

        /// `LogEngine::meta_read`'s win under the stripe lock.
        fn try_win(&self) -> bool {
            let _g = self.lock.lock().unwrap();
            let Some((i, v)) = self.find() else {
                panic!("the item was missed");
            };
            v & WIN == 0
                && self.slot[i]
                    .compare_exchange(v, v | WIN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
        }
    }

    #[test]
    fn a_reader_never_misses_a_wide_item_being_split() {
        model(|| {
            let t = Table::new(0);
            let r = {
                let t = t.clone();
                thread::spawn(move || t.find().map(|(_, v)| v & !MOVED))
            };
            t.split();
            assert_eq!(r.join().unwrap(), Some(ITEM));
            assert_eq!(t.find().map(|(i, _)| i), Some(2));
        });
    }

    #[test]
    fn a_wide_win_is_never_lost_across_a_split() {
        model(|| {
            let t = Table::new(0);
            let r = {
                let t = t.clone();
                thread::spawn(move || t.try_win())
            };
            t.split();
            assert!(r.join().unwrap(), "the only reader wins");
            assert_eq!(t.slot[2].load(Ordering::Relaxed) & WIN, WIN);
            assert!(!t.try_win(), "a second reader sees the token sent");
        });
    }

    /// A reader's access mark on a wide slot is carried into the replacement or lands on
    /// the new item: the writer's exchange never overwrites it.
    #[test]
    fn a_wide_replacement_never_loses_a_readers_mark() {
        model(|| {
            let t = Table::new(0);
            let r = {
                let t = t.clone();
                thread::spawn(move || t.mark())
            };
            t.replace(0);
            let marked = r.join().unwrap();
            let fin = t.slot[0].load(Ordering::Relaxed);
            assert_eq!(fin & !(FETCHED | WIN), NEXT);
            if marked == Some(true) {
                assert_eq!(fin & FETCHED, FETCHED, "a mark that succeeded was lost");
            }
        });
    }
}
