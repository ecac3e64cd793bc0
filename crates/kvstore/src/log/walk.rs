//! Walks of the whole index: [`LogEngine::digest`] (`stats digest`, a consistency check of
//! replicas) and [`LogEngine::scan`] (resumable, a few buckets per call: what
//! `lru_crawler metadump` streams from).

use super::format::KIND_ITEM;
use super::sync::lock;
use super::{LogEngine, Vis};
use crate::Time;

/// What [`LogEngine::digest`] returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digest {
    /// Live items.
    pub items: u64,
    /// The sum of the items' MD5s, mod 2^128.
    pub sum: u128,
}

impl Digest {
    /// The sum as 32 hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.sum)
    }
}

/// Walks.
impl LogEngine {
    /// A digest of the live items at `now`: their count and the sum (mod 2^128) of each
    /// item's MD5 over its key, client flags, expiry, CAS unique and value. The sum does not
    /// depend on the order items are visited or where they live, so two engines holding the
    /// same items give the same digest whatever their segments, index size or history. Index
    /// growth waits while it runs; concurrent writes may or may not be seen (take it when
    /// writes have stopped, as a consistency check).
    pub fn digest(&self, now: Time) -> Digest {
        use md5::Digest as _;
        let _grow = lock(&self.grow_lock);
        let mut d = Digest::default();
        for b in 0..self.index.nmain() {
            let _g = self.index.lock_bucket(b);
            self.index.for_each_in_chain(b, |_, v| {
                // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
                let Some(r) = (unsafe { self.rec(v) }) else {
                    return;
                };
                if r.kind != KIND_ITEM || self.vis(&r, now) != Vis::Live {
                    return;
                }
                let mut h = md5::Md5::new();
                h.update((r.key.len() as u32).to_le_bytes());
                h.update(r.key);
                h.update(r.flags.to_le_bytes());
                h.update(r.exptime.to_le_bytes());
                h.update(self.rec_cas(&r).to_le_bytes());
                h.update((r.value.len() as u64).to_le_bytes());
                h.update(r.value);
                let sum: [u8; 16] = h.finalize().into();
                d.items += 1;
                d.sum = d.sum.wrapping_add(u128::from_le_bytes(sum));
            });
        }
        d
    }

    /// Call `f` for each live item in up to `buckets` index buckets starting at bucket
    /// `from`; returns the bucket to continue from, or `None` once every bucket has been
    /// visited. Each call holds one bucket's lock at a time, and keeps the index from
    /// growing until it returns, so a scan in many short calls does not stop the server.
    ///
    /// An item that stays live and in place throughout a scan of many calls is seen once.
    /// If the index grows between calls, items of buckets already visited can move to
    /// buckets not yet visited and be seen again; an item in a bucket not yet visited only
    /// moves to another such bucket, so none is missed.
    pub fn scan(
        &self,
        from: usize,
        buckets: usize,
        now: Time,
        f: &mut dyn FnMut(crate::ScanItem<'_>),
    ) -> Option<usize> {
        let _grow = lock(&self.grow_lock);
        let nmain = self.index.nmain();
        let end = from.saturating_add(buckets.max(1)).min(nmain);
        for b in from..end {
            let _g = self.index.lock_bucket(b);
            self.index.for_each_in_chain(b, |_, v| {
                // SAFETY: we hold the chain's stripe lock and `v` is in its slot.
                let Some(r) = (unsafe { self.rec(v) }) else {
                    return;
                };
                if r.kind != KIND_ITEM || self.vis(&r, now) != Vis::Live {
                    return;
                }
                f(crate::ScanItem {
                    key: r.key,
                    meta: self.describe(&r, v, now),
                });
            });
        }
        (end < nmain).then_some(end)
    }
}
