//! The flash tier's page store: files on flash that hold segment images whole, one per
//! page, each block of a page checksummed with where and when it was written (see
//! `docs/design/flash-tier.md` for the tier this is the bottom of).
//!
//! - `layout.rs`: the bytes: the file header, a page's blocks, the span of blocks a range
//!   of an image needs, and the checks made on them. No I/O.
//! - `file.rs`: [`FlashFile`], one file: made or opened, pages written, ranges read back
//!   and checked; [`AlignedBuf`], the block-aligned memory its I/O uses.
//! - `tier.rs`: [`Tier`], the files of one server as one set of pages: free pages and
//!   their generations, writes queued to writer threads within a buffer bound, blocking
//!   reads, and memcached's extstore counters.
//!
//! This layer knows nothing of items or of the log: a page is bytes, its generation a
//! number the caller keeps (bumped each time it reuses the page, so that a read that
//! raced with the reuse is refused rather than served).

mod file;
mod layout;
mod tier;

pub use file::{AlignedBuf, FlashError, FlashFile};
pub use layout::{blocks_for, Header, LayoutError, BLOCK, BLOCK_DATA, FLASH_VERSION};
pub use tier::{Loc, ReadSpan, Tier, TierConfig, TierError, TierStats};

/// A fresh directory for one test's flash files, removed when dropped.
#[cfg(test)]
mod testdir {
    use std::path::PathBuf;

    pub(super) struct Dir(pub(super) PathBuf);

    impl Dir {
        pub(super) fn new(name: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("kvstore-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).expect("make a directory");
            Dir(d)
        }

        /// The usual flash file's path in it.
        pub(super) fn file(&self) -> PathBuf {
            self.0.join("flash")
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
