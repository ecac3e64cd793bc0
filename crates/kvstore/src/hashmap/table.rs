//! One shard's items: an open-addressing hash table (linear probing, backward-shift
//! deletion) whose slots hold the items themselves, plus the CLOCK hand that sweeps it.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering::Relaxed};

/// Item bit: accessed since the CLOCK hand last passed (second chance).
pub(crate) const ACCESSED: u8 = 1;
/// Item bit: fetched at least once (for `expired_unfetched` / `evicted_unfetched`).
pub(crate) const FETCHED: u8 = 2;
/// Item bit: marked stale by the meta protocol (`md ... I`).
pub(crate) const STALE: u8 = 4;
/// Item bit: a meta "win" token was handed out for the item.
pub(crate) const TOKEN_SENT: u8 = 8;
/// Item bit: stored with a binary (base64) key.
pub(crate) const BINARY_KEY: u8 = 16;
/// Item bit: the item has an explicit CAS unique (`E`), kept in the last 8 bytes of `data`
/// (after the value). Set only at construction, never changed afterwards.
pub(crate) const EXPLICIT_CAS: u8 = 32;

/// Bytes of the explicit-CAS trailer.
const TRAILER: usize = 8;

/// Smallest table, in slots.
pub(crate) const MIN_SLOTS: usize = 16;

/// Memory charged per item on top of its key and value bytes.
///
/// An item lives in a 48-byte table slot ([`SLOT_SIZE`]); the table doubles when it
/// reaches 3/4 full, so its load factor runs between 3/8 and 3/4, and a table spends on
/// average (8/3)·ln 2 ≈ 1.85 slots per item: ~89 bytes. The key and value share one heap
/// block, whose malloc header (8 bytes) and 16-byte rounding (~7.5 bytes on average) add
/// ~15. 89 + 15 = 104.
pub(crate) const ITEM_OVERHEAD: usize = 104;

/// Bytes of one table slot.
pub(crate) const SLOT_SIZE: usize = std::mem::size_of::<Option<Item>>();

// The accounting above assumes a 48-byte slot (on 64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(SLOT_SIZE == 48);

/// A stored item. Key and value share one allocation (`data`); the fields that reads
/// update under the shared lock are atomics.
pub(crate) struct Item {
    /// Key bytes followed by value bytes.
    data: Box<[u8]>,
    /// Version number from the engine's global counter: the CAS unique (when CAS is on)
    /// and the immediate-flush watermark.
    pub(crate) seq: u64,
    /// Low 32 bits of the key's hash.
    pub(crate) hash: u32,
    pub(crate) flags: u32,
    pub(crate) exptime: AtomicU32,
    /// Last time the item was stored or accessed.
    pub(crate) atime: AtomicU32,
    klen: u16,
    pub(crate) bits: AtomicU8,
}

impl Item {
    /// `data` holds the key (`klen` bytes) followed by the value.
    pub(crate) fn new(
        data: Box<[u8]>,
        klen: u16,
        hash: u32,
        seq: u64,
        flags: u32,
        exptime: u32,
        now: u32,
    ) -> Item {
        Item {
            data,
            seq,
            hash,
            flags,
            exptime: AtomicU32::new(exptime),
            atime: AtomicU32::new(now),
            klen,
            // New items start without a second chance, so that items never read go
            // first (scan resistance) and a cache filled with new items does not need
            // a whole turn of clearing before its first eviction.
            bits: AtomicU8::new(0),
        }
    }

    pub(crate) fn key(&self) -> &[u8] {
        self.data.get(..self.klen as usize).unwrap_or(&[])
    }

    /// End of the value in `data`.
    fn value_end(&self) -> usize {
        if self.has(EXPLICIT_CAS) {
            self.data.len().saturating_sub(TRAILER)
        } else {
            self.data.len()
        }
    }

    pub(crate) fn value(&self) -> &[u8] {
        self.data
            .get(self.klen as usize..self.value_end())
            .unwrap_or(&[])
    }

    pub(crate) fn value_mut(&mut self) -> &mut [u8] {
        let (k, end) = (self.klen as usize, self.value_end());
        self.data.get_mut(k..end).unwrap_or(&mut [])
    }

    /// The explicit CAS unique, if the item has one.
    pub(crate) fn explicit_cas(&self) -> Option<u64> {
        if !self.has(EXPLICIT_CAS) {
            return None;
        }
        let t = self.data.get(self.value_end()..)?;
        Some(u64::from_le_bytes(t.try_into().ok()?))
    }

    /// Overwrite the explicit CAS unique (no effect on an item without one).
    pub(crate) fn set_explicit_cas(&mut self, cas: u64) {
        let end = self.value_end();
        if self.has(EXPLICIT_CAS) {
            if let Some(t) = self.data.get_mut(end..) {
                t.copy_from_slice(&cas.to_le_bytes());
            }
        }
    }

    /// Add item bits (at construction).
    pub(crate) fn with_bits(self, bits: u8) -> Item {
        self.bits.fetch_or(bits, Relaxed);
        self
    }

    /// Bytes charged against the memory limit (key and value; an explicit-CAS trailer is not
    /// charged, so that the charge depends only on what the client stored).
    pub(crate) fn charge(&self) -> usize {
        charge(self.klen as usize + self.value().len())
    }

    pub(crate) fn data_len(&self) -> usize {
        self.data.len()
    }

    pub(crate) fn is(&self, hash: u32, key: &[u8]) -> bool {
        self.hash == hash && self.key() == key
    }

    pub(crate) fn has(&self, bit: u8) -> bool {
        self.bits.load(Relaxed) & bit != 0
    }

    /// Record an access at `now` (and a fetch if `fetched`), writing only what changes.
    pub(crate) fn mark_access(&self, now: u32, fetched: bool) {
        if self.atime.load(Relaxed) != now {
            self.atime.store(now, Relaxed);
        }
        let want = if fetched {
            ACCESSED | FETCHED
        } else {
            ACCESSED
        };
        if self.bits.load(Relaxed) & want != want {
            self.bits.fetch_or(want, Relaxed);
        }
    }
}

/// Bytes charged for an item whose key and value total `data_len` bytes.
pub(crate) fn charge(data_len: usize) -> usize {
    data_len.saturating_add(ITEM_OVERHEAD)
}

#[cfg(test)]
/// Key followed by the concatenation of `parts`, in one exactly-sized allocation;
/// `None` if the allocation fails.
pub(crate) fn make_data(key: &[u8], parts: &[&[u8]]) -> Option<Box<[u8]>> {
    make_data_cas(key, parts, None)
}

/// [`make_data`], followed by an explicit-CAS trailer when `cas` is given (the item must then
/// get [`EXPLICIT_CAS`]).
pub(crate) fn make_data_cas(key: &[u8], parts: &[&[u8]], cas: Option<u64>) -> Option<Box<[u8]>> {
    let mut len = key.len();
    for p in parts {
        len = len.checked_add(p.len())?;
    }
    if cas.is_some() {
        len = len.checked_add(TRAILER)?;
    }
    let mut v: Vec<u8> = Vec::new();
    v.try_reserve_exact(len).ok()?;
    v.extend_from_slice(key);
    for p in parts {
        v.extend_from_slice(p);
    }
    if let Some(c) = cas {
        v.extend_from_slice(&c.to_le_bytes());
    }
    Some(v.into_boxed_slice())
}

/// An open-addressing table of items.
pub(crate) struct Table {
    slots: Box<[Option<Item>]>,
    len: usize,
    /// Sum of the charges of the items in the table.
    charged: usize,
    /// Sum of `data_len` of the items in the table.
    data_bytes: usize,
    /// The CLOCK hand: next slot to look at when evicting.
    pub(crate) hand: usize,
}

fn alloc_slots(n: usize) -> Option<Box<[Option<Item>]>> {
    let mut v: Vec<Option<Item>> = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize_with(n, || None);
    Some(v.into_boxed_slice())
}

impl Table {
    pub(crate) fn new() -> Table {
        Table {
            slots: alloc_slots(MIN_SLOTS).unwrap_or_default(),
            len: 0,
            charged: 0,
            data_bytes: 0,
            hand: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn charged(&self) -> usize {
        self.charged
    }

    /// Heap bytes held: the slot array plus the items' key+value blocks.
    pub(crate) fn malloced(&self) -> usize {
        self.slots
            .len()
            .saturating_mul(SLOT_SIZE)
            .saturating_add(self.data_bytes)
    }

    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    pub(crate) fn slot(&self, i: usize) -> Option<&Item> {
        self.slots.get(i).and_then(|s| s.as_ref())
    }

    pub(crate) fn slot_mut(&mut self, i: usize) -> Option<&mut Item> {
        self.slots.get_mut(i).and_then(|s| s.as_mut())
    }

    /// The slot holding `key`.
    pub(crate) fn find(&self, hash: u32, key: &[u8]) -> Option<usize> {
        let mask = self.mask();
        let mut i = hash as usize & mask;
        // The table is never full, so an empty slot ends every probe; the bound is a
        // belt-and-braces guarantee of termination.
        for _ in 0..self.slots.len() {
            match self.slots.get(i)? {
                None => return None,
                Some(it) if it.is(hash, key) => return Some(i),
                Some(_) => i = (i + 1) & mask,
            }
        }
        None
    }

    /// Make sure one more item fits under the 3/4 load limit, growing if needed.
    /// False if the table is at its limit and cannot grow.
    pub(crate) fn ensure_room(&mut self) -> bool {
        let cap = self.slots.len();
        if (self.len + 1).saturating_mul(4) <= cap.saturating_mul(3) {
            return true;
        }
        match cap.checked_mul(2) {
            Some(n) if self.resize(n) => true,
            // Growth failed: accept a fuller table as long as a slot stays free.
            _ => self.len + 1 < cap,
        }
    }

    /// Rebuild with `new_cap` slots (a power of two above `len`). False if the
    /// allocation fails (the table is unchanged).
    pub(crate) fn resize(&mut self, new_cap: usize) -> bool {
        if !new_cap.is_power_of_two() || new_cap <= self.len || new_cap < MIN_SLOTS {
            return false;
        }
        let Some(new_slots) = alloc_slots(new_cap) else {
            return false;
        };
        let old = std::mem::replace(&mut self.slots, new_slots);
        self.hand = 0;
        for it in old.into_vec().into_iter().flatten() {
            self.place(it);
        }
        true
    }

    /// Halve the table while it is less than 1/8 full (called from maintenance).
    pub(crate) fn shrink_if_sparse(&mut self) {
        let cap = self.slots.len();
        if cap > MIN_SLOTS && self.len.saturating_mul(8) < cap {
            let target = (self.len.saturating_mul(3))
                .next_power_of_two()
                .max(MIN_SLOTS);
            if target < cap {
                self.resize(target);
            }
        }
    }

    /// Put an item into the first free slot of its probe sequence.
    fn place(&mut self, it: Item) -> usize {
        let mask = self.mask();
        let mut i = it.hash as usize & mask;
        for _ in 0..self.slots.len() {
            if let Some(slot) = self.slots.get_mut(i) {
                if slot.is_none() {
                    *slot = Some(it);
                    return i;
                }
            }
            i = (i + 1) & mask;
        }
        // Unreachable while the table keeps a free slot (ensure_room); dropping the
        // item here keeps the accounting consistent because the callers count only
        // what `insert` reports.
        usize::MAX
    }

    /// Insert an item whose key is absent. The caller has called [`Table::ensure_room`].
    /// False if there was no free slot (the item is dropped).
    pub(crate) fn insert(&mut self, it: Item) -> bool {
        let (c, d) = (it.charge(), it.data_len());
        if self.len + 1 >= self.slots.len() || self.place(it) == usize::MAX {
            return false;
        }
        self.len += 1;
        self.charged += c;
        self.data_bytes += d;
        true
    }

    /// Replace the item in slot `i` (same key); returns the old one.
    pub(crate) fn replace(&mut self, i: usize, it: Item) -> Option<Item> {
        let (c, d) = (it.charge(), it.data_len());
        let slot = self.slots.get_mut(i)?;
        let old = slot.take()?;
        *slot = Some(it);
        self.charged = self.charged - old.charge() + c;
        self.data_bytes = self.data_bytes - old.data_len() + d;
        Some(old)
    }

    /// Remove the item in slot `i`, shifting later items of its cluster back.
    pub(crate) fn remove(&mut self, i: usize) -> Option<Item> {
        let mask = self.mask();
        let out = self.slots.get_mut(i)?.take()?;
        self.len -= 1;
        self.charged -= out.charge();
        self.data_bytes -= out.data_len();
        let mut hole = i;
        let mut j = i;
        for _ in 0..self.slots.len() {
            j = (j + 1) & mask;
            let ideal = match self.slots.get(j) {
                Some(Some(it)) => it.hash as usize & mask,
                _ => break,
            };
            // Move j into the hole unless its ideal slot lies cyclically in (hole, j].
            if (j.wrapping_sub(ideal) & mask) >= (j.wrapping_sub(hole) & mask) {
                let moved = self.slots.get_mut(j).and_then(|s| s.take());
                if let Some(h) = self.slots.get_mut(hole) {
                    *h = moved;
                }
                hole = j;
            }
        }
        Some(out)
    }

    /// Iterate over the occupied slots.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Item> {
        self.slots.iter().flatten()
    }

    /// Advance the CLOCK hand by one slot.
    pub(crate) fn advance_hand(&mut self) {
        self.hand = (self.hand + 1) & self.mask();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &[u8], hash: u32) -> Item {
        let data = make_data(key, &[b"v"]).unwrap();
        Item::new(data, key.len() as u16, hash, 1, 0, 0, 0)
    }

    #[test]
    fn insert_find_remove_with_collisions() {
        let mut t = Table::new();
        // Everything hashes to a cluster around slot 14, wrapping round the end.
        let keys: Vec<Vec<u8>> = (0..10u8).map(|i| vec![b'k', i]).collect();
        for (n, k) in keys.iter().enumerate() {
            assert!(t.ensure_room());
            assert!(t.insert(item(k, 14 + (n as u32 % 3))));
        }
        assert_eq!(t.len(), 10);
        for (n, k) in keys.iter().enumerate() {
            assert!(t.find(14 + (n as u32 % 3), k).is_some(), "{n}");
        }
        for (n, k) in keys.iter().enumerate().step_by(2) {
            let i = t.find(14 + (n as u32 % 3), k).unwrap();
            assert_eq!(t.remove(i).unwrap().key(), &k[..]);
        }
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(t.find(14 + (n as u32 % 3), k).is_some(), n % 2 == 1, "{n}");
        }
        assert_eq!(t.len(), 5);
        assert_eq!(t.charged(), 5 * charge(3));
    }

    #[test]
    fn grows_and_shrinks() {
        let mut t = Table::new();
        for i in 0..1000u32 {
            assert!(t.ensure_room());
            assert!(t.insert(item(&i.to_le_bytes(), i.wrapping_mul(2654435761))));
        }
        assert!(t.capacity() >= 1334);
        for i in 0..1000u32 {
            let h = i.wrapping_mul(2654435761);
            let idx = t.find(h, &i.to_le_bytes()).unwrap();
            if i >= 10 {
                t.remove(idx).unwrap();
            }
        }
        t.shrink_if_sparse();
        assert_eq!(t.capacity(), 32);
        for i in 0..10u32 {
            assert!(t
                .find(i.wrapping_mul(2654435761), &i.to_le_bytes())
                .is_some());
        }
    }
}
