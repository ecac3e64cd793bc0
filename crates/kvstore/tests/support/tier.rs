//! A flash tier for a test's engine, in a fresh directory removed when the test is done
//! (tests/log_flash.rs, log_model.rs, log_concurrency.rs).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use kvstore::flash::{Tier, TierConfig};
use kvstore::LogEngine;

/// A fresh directory, removed when dropped; unique per process and call.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("kvstore-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("make a directory");
        Dir(d)
    }

    /// A tier of one file of `bytes` in this directory, with pages of `e`'s segments.
    pub fn tier(&self, e: &LogEngine, bytes: u64, threads: usize, write_buffer: usize) -> Tier {
        Tier::create(&self.config(e, bytes, threads, write_buffer)).expect("make the tier")
    }

    /// The tier [`Dir::tier`] made, opened again with what it holds (a warm restart's).
    #[allow(dead_code)]
    pub fn reopen(&self, e: &LogEngine, bytes: u64, threads: usize, write_buffer: usize) -> Tier {
        Tier::open(&self.config(e, bytes, threads, write_buffer)).expect("reopen the tier")
    }

    fn config(&self, e: &LogEngine, bytes: u64, threads: usize, write_buffer: usize) -> TierConfig {
        TierConfig {
            files: vec![(self.0.join("flash"), bytes)],
            page_bytes: e.segment_size(),
            write_threads: threads,
            write_buffer,
            direct: true,
        }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `e` with a tier of `bytes` in a fresh directory (kept as long as the result lives).
pub fn attach(e: &LogEngine, bytes: u64, threads: usize, write_buffer: usize) -> Dir {
    let dir = Dir::new("tier");
    let tier = dir.tier(e, bytes, threads, write_buffer);
    e.attach_flash(tier).expect("attach the tier");
    dir
}
