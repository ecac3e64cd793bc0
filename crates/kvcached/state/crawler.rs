//! memcached's LRU crawler, as kvcached stands in for it: the engine's background expiry
//! sweep, which `-o no_lru_crawler` and `lru_crawler disable` turn off and `lru_crawler
//! enable` back on, and the whole sweeps `lru_crawler crawl` asks for, which the
//! maintenance thread runs (`server.rs`). Also the hash table level memcached would report
//! (`hash_power_level`), which kvcached's index, sized differently, does not have.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// The crawler's switch and the state of a requested crawl.
#[derive(Debug)]
pub struct Crawler {
    enabled: AtomicBool,
    /// A crawl was asked for and has not finished (`lru_crawler_running`).
    running: AtomicBool,
    /// Crawls started (`lru_crawler_starts`).
    starts: AtomicU64,
}

impl Crawler {
    pub fn new(enabled: bool) -> Crawler {
        Crawler {
            enabled: AtomicBool::new(enabled),
            running: AtomicBool::new(false),
            starts: AtomicU64::new(0),
        }
    }

    /// Whether the crawler is on (`stats settings` `lru_crawler`).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// `lru_crawler enable|disable`.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Ask for a whole sweep; false while one is still running (memcached's `BUSY`). The
    /// crawl counts as running from here, so a client that polls `lru_crawler_running`
    /// after the `OK` sees it until it is done.
    pub fn request(&self) -> bool {
        if self.running.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.starts.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Whether a crawl is asked for or running.
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// The crawl asked for is done.
    pub fn finish(&self) {
        self.running.store(false, Ordering::Release);
    }

    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }
}

/// The level memcached's hash table would have: it starts at `-o hashpower` (16) and
/// doubles whenever it holds more than one and a half items per bucket, and never shrinks
/// (a warm restart brings the level back too).
#[derive(Debug)]
pub struct HashPower(AtomicU32);

impl HashPower {
    pub fn new(initial: u32) -> HashPower {
        HashPower(AtomicU32::new(initial))
    }

    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    /// The cache holds `items`: expand as memcached would.
    pub fn note_items(&self, items: u64) {
        let mut level = self.get();
        while level < 63 && items > (1u64 << level) + (1u64 << level) / 2 {
            level += 1;
        }
        self.0.fetch_max(level, Ordering::Relaxed);
    }

    /// A level saved by a warm restart (or any other floor).
    pub fn raise_to(&self, level: u32) {
        self.0.fetch_max(level.min(63), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crawl_runs_once_at_a_time() {
        let c = Crawler::new(false);
        assert!(!c.enabled() && !c.running());
        assert!(c.request());
        assert!(c.running());
        assert!(!c.request(), "a second crawl while one runs is BUSY");
        c.finish();
        assert!(!c.running());
        assert!(c.request());
        assert_eq!(c.starts(), 2);
    }

    #[test]
    fn the_hash_level_grows_as_memcacheds_and_never_shrinks() {
        let h = HashPower::new(16);
        h.note_items(98_304); // 1.5 * 2^16: not over
        assert_eq!(h.get(), 16);
        h.note_items(98_305);
        assert_eq!(h.get(), 17);
        h.note_items(131_072 * 3 + 1); // over 1.5 * 2^18
        assert_eq!(h.get(), 19);
        h.note_items(0);
        assert_eq!(h.get(), 19);
        h.raise_to(12);
        assert_eq!(h.get(), 19);
        h.raise_to(20);
        assert_eq!(h.get(), 20);
    }
}
