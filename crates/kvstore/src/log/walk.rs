//! Walks of the whole index: [`LogEngine::digest`] (`stats digest`, a consistency check of
//! replicas) and [`LogEngine::scan`] (resumable, a few buckets per call: what
//! `lru_crawler metadump` streams from).

use super::format::KIND_ITEM;
use super::sync::lock;
use super::{index, LogEngine, Vis};
use crate::{ScanCursor, Time};

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

    /// Call `f` for each live item of up to `buckets` index buckets, starting where `from`
    /// says ([`ScanCursor::default`] for the first call); returns where to continue, or
    /// `None` once every bucket has been visited. Each call holds one bucket's lock at a
    /// time, and keeps the index from growing until it returns, so a scan in many short
    /// calls does not stop the server.
    ///
    /// The scan goes by the buckets the index had at its first call; for each, it visits
    /// the buckets its items may have moved to since (splits only move items up, by a
    /// stride: [`index::home_stride`]). So an item that stays live and in place (in the
    /// index) throughout the scan is seen exactly once, however the index grows meanwhile.
    pub fn scan(
        &self,
        from: ScanCursor,
        buckets: usize,
        now: Time,
        f: &mut dyn FnMut(crate::ScanItem<'_>),
    ) -> Option<ScanCursor> {
        let _grow = lock(&self.grow_lock);
        let nmain = self.index.nmain();
        let addressing = from.addressing.unwrap_or_else(|| self.index.addressing());
        let homes = index::home_buckets(addressing);
        let end = from.bucket.saturating_add(buckets.max(1)).min(homes);
        for home in from.bucket..end {
            let stride = index::home_stride(addressing, home);
            for b in (home..nmain).step_by(stride) {
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
        }
        (end < homes).then_some(ScanCursor {
            bucket: end,
            addressing: Some(addressing),
        })
    }
}
