//! Meta reads (`mg`): win tokens, stale items, touch and vivify in one lookup.

use super::format::{Rec, META_BINARY_KEY, META_STALE};
use super::index::Slot;
use super::write::{Commit, Cond, Fail, MetaW, Outcome, Src};
use super::{index, LogEngine, Vis, IDENT_MASK};
use crate::{MetaGet, MetaItem, MetaRead, Time, Win};

/// One attempt of a meta read.
pub(super) enum Step {
    Done(MetaGet),
    /// Lost a race with a writer or another reader: look again.
    Retry,
    /// No live item.
    Missing,
}

/// Meta reads (`mg`).
impl LogEngine {
    /// The win a meta read gets from an item with slot value `x`, and `x` after the read
    /// (win mark set if it won, access recorded unless `no_bump`).
    pub(super) fn meta_win(x: u64, stale: bool, recache: bool, no_bump: bool) -> (Win, u64) {
        let win = if x & index::WIN != 0 {
            Win::AlreadySent
        } else if stale || recache {
            Win::Won
        } else {
            Win::None
        };
        let mut n = x;
        if win == Win::Won {
            n |= index::WIN;
        }
        if !no_bump {
            n = index::bumped(n);
        }
        (win, n)
    }

    /// `mg` without `T`: a pinned read; the win mark and the access bits change by one
    /// compare-exchange on the slot, so exactly one reader wins a token.
    /// With `touched`, the read stands for a touch to that expiry: an item whose expiry is
    /// not already that one is left to the touch (`Retry`).
    pub(super) fn meta_read(
        &self,
        key: &[u8],
        h: u64,
        now: Time,
        opts: &MetaRead,
        touched: Option<Time>,
        found: &mut dyn FnMut(MetaItem<'_>),
    ) -> Step {
        let dead = {
            let _pin = self.pin();
            let mut fetch = super::flash::Fetch::default();
            // SAFETY: pinned for as long as `r` is used (the callback included).
            let Some((slot, v, r)) = (unsafe { self.lookup(h, key, &mut fetch) }) else {
                return Step::Missing;
            };
            match self.vis(&r, now) {
                Vis::Live if touched.is_some_and(|t| t != r.exptime) => return Step::Retry,
                Vis::Live => {
                    let stale = r.meta & META_STALE != 0;
                    let recache = opts
                        .recache
                        .is_some_and(|t| r.exptime != 0 && r.exptime < t);
                    let (mut win, nv) = Self::meta_win(v, stale, recache, opts.no_bump);
                    if win == Win::Won {
                        // The win mark changes only under the stripe lock, on the item
                        // this read found (see `index`): exactly one reader wins it.
                        let _g = self.index.lock(h);
                        let cur = slot.load();
                        if cur & IDENT_MASK != v & IDENT_MASK {
                            return Step::Retry;
                        }
                        let (w, n) = Self::meta_win(cur, stale, recache, opts.no_bump);
                        win = w;
                        if n != cur && slot.compare_exchange(cur, n).is_err() {
                            // A reader's access mark came between: decide again.
                            return Step::Retry;
                        }
                    } else if nv != v {
                        // Losing the race only loses an access mark.
                        let _ = slot.compare_exchange(v, nv);
                    }
                    found(MetaItem {
                        item: self.view_leasable(key, &r, v),
                        exptime_before: r.exptime,
                        created: false,
                        last_access: self.written_at(v, now),
                        fetched: index::fetched(v),
                        stale,
                        win,
                        binary_key: r.meta & META_BINARY_KEY != 0,
                    });
                    return Step::Done(MetaGet::Hit);
                }
                vis => (v, vis),
            }
        };
        self.count_dead(dead.1);
        self.unlink_dead(h, dead.0);
        Step::Missing
    }

    /// `mg` with `T`: the touch rewrites the item (same CAS, marks and access state), and
    /// the same compare-exchange that installs the rewritten item sets the win mark when
    /// this request may win (see `apply`), so no reader sees the touched item without the
    /// mark of the win that came with it. Whether it won shows in the replaced slot value.
    pub(super) fn meta_touch(
        &self,
        key: &[u8],
        h: u64,
        exptime: Time,
        now: Time,
        opts: &MetaRead,
        found: &mut dyn FnMut(MetaItem<'_>),
    ) -> Step {
        let Some(p) = self.peek(h, key, now) else {
            return Step::Missing;
        };
        if p.exptime == exptime {
            // The expiry stays as it is: nothing the log holds changes, so this is a read
            // (win mark and access included), as for a classic touch (`touch_inner`).
            return self.meta_read(key, h, now, opts, Some(exptime), found);
        }
        let compared = if opts.recache_after_touch {
            exptime
        } else {
            p.exptime
        };
        let recache = opts.recache.is_some_and(|t| compared != 0 && compared < t);
        // `Loc` makes sure the rewritten item is the one peeked (stale mark included).
        let may_win = p.stale || recache;
        let c = Commit {
            key,
            h,
            cond: Cond::Loc(p.ident),
            src: Src::Old,
            old_len: p.value_len,
            flags: None,
            exptime: Some(exptime),
            keep_cas: true,
            keep_access: true,
            access: !opts.no_bump,
            meta: MetaW {
                stale: None,
                binary_key: None,
                win: may_win.then_some(true),
                ..MetaW::default()
            },
        };
        let mut show = |prev: Option<(Slot<'_>, u64)>, r: &Rec<'_>, v: u64| {
            // The item was just rewritten: its last access is now.
            let (mut win, mut fetched, last_access) = (Win::None, false, now);
            if let Some((_, x)) = prev {
                win = if x & index::WIN != 0 {
                    Win::AlreadySent
                } else if may_win {
                    Win::Won
                } else {
                    Win::None
                };
                fetched = index::fetched(x);
            }
            found(MetaItem {
                // Under the stripe lock of the item just written (see `lease`).
                item: self.view_leasable(key, r, v),
                exptime_before: p.exptime,
                created: false,
                last_access,
                fetched,
                stale: r.meta & META_STALE != 0,
                win,
                binary_key: r.meta & META_BINARY_KEY != 0,
            });
        };
        match self.commit(&c, now, Some(&mut show)) {
            Outcome::Stored(_) => Step::Done(MetaGet::Hit),
            Outcome::Failed(Fail::Moved) => Step::Retry,
            Outcome::Failed(_) => Step::Missing,
            // No room to rewrite it (no_evict, full): as a touch, a miss.
            Outcome::NoMemory | Outcome::TooLarge => Step::Done(MetaGet::Miss),
        }
    }
}
