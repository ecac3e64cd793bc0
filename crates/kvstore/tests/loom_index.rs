//! Loom models of the index's growth protocol (`src/log/index.rs`): every interleaving of a
//! lock-free reader with a split (copy to the new bucket after marking the old slot
//! `MOVED`, publish the new addressing, end the work) or with a compaction (the same
//! steps inside one chain), under the C11 memory model as loom explores it.
//!
//! The models restate the protocol on loom's atomics with two buckets of two slots, rather
//! than running `Index` itself: `Index` lives in an mmap'd table of std atomics. Each model
//! mirrors, step for step and ordering for ordering, `Index::find`, `Index::split`,
//! `Index::compact` and the readers' win-mark compare-exchange; a change to those must be
//! made here too.

use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

const VALID: u64 = 1 << 63;
const MOVED: u64 = 1 << 62;
const WIN: u64 = 1 << 61;
/// The item of our key (the low byte stands for its tag and location).
const ITEM: u64 = VALID | 7;

struct Table {
    /// Bucket 0 is slots 0-1, bucket 1 (the split image) slots 2-3.
    slots: [AtomicU64; 4],
    /// The key's bucket under the current addressing (0 before the split, 1 after).
    addr: AtomicU64,
    /// 1 + the bucket being split or compacted, or 0.
    work: AtomicUsize,
}

impl Table {
    fn new(at: usize, addr: u64) -> Arc<Table> {
        let t = Table {
            slots: Default::default(),
            addr: AtomicU64::new(addr),
            work: AtomicUsize::new(0),
        };
        t.slots[at].store(ITEM, Ordering::Relaxed);
        Arc::new(t)
    }

    /// `Index::find` for our key: its slot and value.
    fn find(&self) -> Option<(usize, u64)> {
        let mut b = self.addr.load(Ordering::Acquire) as usize;
        let mut rescanned = false;
        loop {
            let mut moved = false;
            for i in b * 2..b * 2 + 2 {
                let v = self.slots[i].load(Ordering::Acquire);
                if v & VALID != 0 && v & 0xff == ITEM & 0xff {
                    if v & MOVED != 0 {
                        moved = true;
                    } else {
                        return Some((i, v));
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

    /// `Index::split` of bucket 0: our item moves to bucket 1.
    fn split(&self) {
        self.work.store(1, Ordering::Release);
        let x = self.slots[0].fetch_or(MOVED, Ordering::AcqRel);
        self.slots[2].store(x, Ordering::Release);
        self.addr.store(1, Ordering::Release);
        self.work.store(0, Ordering::Release);
    }

    /// `Index::compact` of bucket 0: our item moves from slot 1 (standing for an overflow
    /// bucket) to the free slot 0.
    fn compact(&self) {
        self.work.store(1, Ordering::Release);
        let x = self.slots[1].fetch_or(MOVED, Ordering::AcqRel);
        self.slots[0].store(x, Ordering::Release);
        self.work.store(0, Ordering::Release);
    }

    /// A meta read that wants the win token: true if it won (set the mark itself).
    fn try_win(&self) -> bool {
        loop {
            let Some((i, v)) = self.find() else {
                panic!("the item was missed");
            };
            if v & WIN != 0 {
                return false;
            }
            if self.slots[i]
                .compare_exchange(v, v | WIN, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return true;
            }
            // Lost the exchange (a mark or another winner): decide again.
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
            thread::spawn(move || t.find().map(|(_, v)| v))
        };
        t.split();
        assert_eq!(r.join().unwrap(), Some(ITEM));
        assert_eq!(t.find().map(|(i, _)| i), Some(2));
    });
}

#[test]
fn a_reader_never_misses_an_item_being_compacted() {
    model(|| {
        let t = Table::new(1, 0);
        let r = {
            let t = t.clone();
            thread::spawn(move || t.find().map(|(_, v)| v))
        };
        t.compact();
        assert_eq!(r.join().unwrap(), Some(ITEM));
        assert_eq!(t.find().map(|(i, _)| i), Some(0));
    });
}

/// A win mark a reader sets while its item moves is never lost: the copy carries it, so a
/// later reader cannot win the same token (two racing readers plus the mover exceed what
/// loom can explore here; the two readers' own race is a plain compare-exchange on one
/// slot).
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
        assert_eq!(t.slots[2].load(Ordering::Relaxed) & WIN, WIN);
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
        assert_eq!(t.slots[0].load(Ordering::Relaxed) & WIN, WIN);
        assert!(!t.try_win(), "a second reader sees the token sent");
    });
}
