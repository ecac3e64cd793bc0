//! One flash file: made or opened, its header checked, pages written whole and ranges of
//! them read back and checked (`layout.rs` says what the bytes are). I/O bypasses the page
//! cache (`O_DIRECT`) where the file system allows it, so a flash tier cannot quietly use
//! RAM beyond `-m`; where it does not (tmpfs), the file is used buffered and
//! [`FlashFile::is_direct`] says so. Reads and writes are positioned (`pread`/`pwrite`), so
//! one file serves many threads without a lock.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use thiserror::Error;

use super::layout::{Header, LayoutError, BLOCK, BLOCK_DATA};

/// Why a flash file could not be made, opened, written or read.
#[derive(Debug, Error)]
pub enum FlashError {
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    #[error("{path}: {source}")]
    Layout { path: PathBuf, source: LayoutError },
    #[error("{path}: {size} bytes hold no page of {page} bytes beside the header")]
    TooSmall {
        path: PathBuf,
        size: u64,
        page: usize,
    },
    #[error("{path}: not a regular file")]
    NotAFile { path: PathBuf },
    #[error("{path}: the file is {got} bytes, its header says {want}")]
    Length { path: PathBuf, want: u64, got: u64 },
}

/// A flash file in use.
#[derive(Debug)]
pub struct FlashFile {
    file: File,
    path: PathBuf,
    header: Header,
    direct: bool,
}

impl FlashFile {
    /// Make a fresh flash file at `path` of at most `size` bytes, in pages that each hold a
    /// segment image of `page_bytes` bytes, with a new random tier id: whatever the file
    /// held before is gone. The space is allocated now (so that a full disk shows at
    /// start, not at the first write), where the file system can.
    pub fn create(path: &Path, size: u64, page_bytes: usize) -> Result<FlashFile, FlashError> {
        let Some((page_blocks, pages)) = geometry(size, page_bytes) else {
            return Err(FlashError::TooSmall {
                path: path.to_path_buf(),
                size,
                page: page_bytes,
            });
        };
        let header = Header {
            tier_id: new_tier_id(),
            page_blocks,
            pages,
        };
        let (file, direct) = open(path, true)?;
        file.set_len(0).map_err(io_err(path, "truncate"))?;
        allocate(&file, header.file_len()).map_err(io_err(path, "allocate"))?;
        let mut buf = AlignedBuf::new();
        let block = buf.get(BLOCK);
        block.copy_from_slice(&header.encode());
        file.write_all_at(block, 0)
            .map_err(io_err(path, "write header"))?;
        file.sync_all().map_err(io_err(path, "sync"))?;
        Ok(FlashFile {
            file,
            path: path.to_path_buf(),
            header,
            direct,
        })
    }

    /// Open the flash file at `path` as it is, checking its header and its length.
    pub fn open(path: &Path) -> Result<FlashFile, FlashError> {
        let (file, direct) = open(path, false)?;
        let mut buf = AlignedBuf::new();
        let block = buf.get(BLOCK);
        let got = file.metadata().map_err(io_err(path, "stat"))?.len();
        if got < BLOCK as u64 {
            return Err(FlashError::Length {
                path: path.to_path_buf(),
                want: BLOCK as u64,
                got,
            });
        }
        file.read_exact_at(block, 0)
            .map_err(io_err(path, "read header"))?;
        let header = Header::parse(block).map_err(|source| FlashError::Layout {
            path: path.to_path_buf(),
            source,
        })?;
        if got < header.file_len() {
            return Err(FlashError::Length {
                path: path.to_path_buf(),
                want: header.file_len(),
                got,
            });
        }
        Ok(FlashFile {
            file,
            path: path.to_path_buf(),
            header,
            direct,
        })
    }

    /// The file's header: its tier id and geometry.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Whether the file has the geometry [`FlashFile::create`] gives a file of `size`
    /// bytes in pages of `page_bytes` (a file reopened must match its configuration).
    pub fn made_for(&self, size: u64, page_bytes: usize) -> bool {
        geometry(size, page_bytes) == Some((self.header.page_blocks, self.header.pages))
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether I/O bypasses the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Go through the page cache from now on (clear `O_DIRECT`), as memcached's extstore
    /// does: reads of recently written or read pages then cost a copy, not a device read,
    /// while the system has memory to spare.
    pub fn use_page_cache(&mut self) -> Result<(), FlashError> {
        use std::os::fd::AsRawFd;
        if !self.direct {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own, reading and setting its status flags.
        let rc = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 {
                flags
            } else {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT)
            }
        };
        if rc < 0 {
            return Err(io_err(&self.path, "fcntl")(io::Error::last_os_error()));
        }
        self.direct = false;
        Ok(())
    }

    /// Write `image` (at most a page's capacity) as page `page` at generation `gen`, using
    /// `buf` for the blocks. Returns the bytes written to the device (whole blocks: for
    /// write amplification).
    pub fn write_page(
        &self,
        page: u32,
        gen: u32,
        image: &[u8],
        buf: &mut AlignedBuf,
    ) -> Result<usize, FlashError> {
        let n = self.encode(page, gen, image, buf)?;
        self.write_blocks(page, buf.get(n))
    }

    /// Cut `image` (at most a page's capacity) into the blocks of page `page` at generation
    /// `gen`, at the start of `buf`, for [`FlashFile::write_blocks`]. Returns their length.
    pub fn encode(
        &self,
        page: u32,
        gen: u32,
        image: &[u8],
        buf: &mut AlignedBuf,
    ) -> Result<usize, FlashError> {
        if page >= self.header.pages {
            return Err(self.layout(LayoutError::Range {
                off: 0,
                end: image.len(),
                cap: self.header.page_capacity(),
            }));
        }
        let out = buf.get(self.header.page_blocks as usize * BLOCK);
        self.header
            .encode_page(page, gen, image, out)
            .map_err(|e| self.layout(e))
    }

    /// Write `blocks`, the first blocks of page `page` as [`Header::encode_page`] made
    /// them, from block-aligned memory. Returns the bytes written.
    pub fn write_blocks(&self, page: u32, blocks: &[u8]) -> Result<usize, FlashError> {
        let page_len = self.header.page_blocks as usize * BLOCK;
        if page >= self.header.pages || blocks.len() % BLOCK != 0 || blocks.len() > page_len {
            return Err(self.layout(LayoutError::Range {
                off: 0,
                end: blocks.len(),
                cap: page_len,
            }));
        }
        self.file
            .write_all_at(blocks, self.header.page_offset(page))
            .map_err(|source| self.io("write", source))?;
        Ok(blocks.len())
    }

    /// Read image bytes `[off, off + len)` of page `page`, written at generation `gen`,
    /// into the end of `out`, using `buf` for the blocks. A damaged, stale or missing
    /// block (a truncated file) is an error, and nothing is appended then. Returns the
    /// bytes read from the device (whole blocks).
    pub fn read(
        &self,
        page: u32,
        gen: u32,
        off: usize,
        len: usize,
        buf: &mut AlignedBuf,
        out: &mut Vec<u8>,
    ) -> Result<usize, FlashError> {
        Ok(self
            .read_in(page, gen, off, len, buf, out, false)?
            .unwrap_or(0))
    }

    /// [`FlashFile::read`] only if every block is in the page cache already, without
    /// waiting for the device (`preadv2` with `RWF_NOWAIT`): None when it is not (or the
    /// file bypasses the cache), so that the caller can hand the read to a thread that
    /// may wait.
    pub fn read_cached(
        &self,
        page: u32,
        gen: u32,
        off: usize,
        len: usize,
        buf: &mut AlignedBuf,
        out: &mut Vec<u8>,
    ) -> Result<Option<usize>, FlashError> {
        if self.direct {
            return Ok(None);
        }
        self.read_in(page, gen, off, len, buf, out, true)
    }

    /// The read of [`FlashFile::read`], or with `nowait` of [`FlashFile::read_cached`].
    #[allow(clippy::too_many_arguments)]
    fn read_in(
        &self,
        page: u32,
        gen: u32,
        off: usize,
        len: usize,
        buf: &mut AlignedBuf,
        out: &mut Vec<u8>,
        nowait: bool,
    ) -> Result<Option<usize>, FlashError> {
        use std::os::fd::AsRawFd;
        let (at, n) = self.span(page, off, len)?;
        let raw = buf.get(n);
        if nowait {
            let Ok(at_off) = libc::off_t::try_from(at) else {
                return Ok(None);
            };
            let iov = libc::iovec {
                iov_base: raw.as_mut_ptr().cast(),
                iov_len: raw.len(),
            };
            // SAFETY: one iovec over `raw`, which we hold mutably for the call; the
            // descriptor is ours.
            let got =
                unsafe { libc::preadv2(self.file.as_raw_fd(), &iov, 1, at_off, libc::RWF_NOWAIT) };
            // Not cached (EAGAIN), not supported, or only part of it cached: not now.
            if usize::try_from(got).ok() != Some(raw.len()) {
                return Ok(None);
            }
        } else {
            self.file
                .read_exact_at(raw, at)
                .map_err(|source| self.io("read", source))?;
        }
        self.decode(page, gen, off, len, raw, out)?;
        Ok(Some(n))
    }

    /// Where image bytes `[off, off + len)` of page `page` are: the offset in the file of
    /// the whole blocks that hold them and their length (for a read that the caller does,
    /// into an [`AlignedBuf`], then checks with [`FlashFile::decode`]).
    pub fn span(&self, page: u32, off: usize, len: usize) -> Result<(u64, usize), FlashError> {
        self.header.span(page, off, len).map_err(|e| self.layout(e))
    }

    /// Check the blocks `raw` holds, read from [`FlashFile::span`]`(page, off, len)`,
    /// against page `page` written at generation `gen`, and append image bytes
    /// `[off, off + len)` to `out`; nothing is appended unless every block is sound. Fewer
    /// bytes than the span (a file truncated meanwhile) are an error.
    pub fn decode(
        &self,
        page: u32,
        gen: u32,
        off: usize,
        len: usize,
        raw: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), FlashError> {
        self.header
            .decode(page, gen, off, len, raw, out)
            .map_err(|e| self.layout(e))
    }

    /// The file's descriptor, for reads submitted elsewhere (an io_uring); valid as long
    /// as the file is.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.file.as_raw_fd()
    }

    /// Make what was written durable (a warm restart's stop).
    pub fn sync(&self) -> Result<(), FlashError> {
        self.file
            .sync_data()
            .map_err(|source| self.io("sync", source))
    }

    fn io(&self, op: &'static str, source: io::Error) -> FlashError {
        io_err(&self.path, op)(source)
    }

    fn layout(&self, source: LayoutError) -> FlashError {
        FlashError::Layout {
            path: self.path.clone(),
            source,
        }
    }
}

/// The error of I/O operation `op` on the flash file at `path`.
/// Blocks per page and pages of a file of at most `size` bytes whose pages hold
/// `page_bytes` bytes of image each; None if not even one page fits beside the header.
fn geometry(size: u64, page_bytes: usize) -> Option<(u32, u32)> {
    let page_blocks = page_bytes.div_ceil(BLOCK_DATA).max(1);
    let per_page = (page_blocks * BLOCK) as u64;
    let pages = size.saturating_sub(BLOCK as u64) / per_page;
    let pages = u32::try_from(pages).ok().filter(|&p| p > 0)?;
    Some((u32::try_from(page_blocks).ok()?, pages))
}

fn io_err(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> FlashError {
    let path = path.to_path_buf();
    move |source| FlashError::Io { path, op, source }
}

/// Open `path` read-write (made if `create`), with `O_DIRECT` unless the file system
/// refuses it. Only a regular file is used.
fn open(path: &Path, create: bool) -> Result<(File, bool), FlashError> {
    if let Ok(m) = std::fs::metadata(path) {
        if !m.file_type().is_file() {
            return Err(FlashError::NotAFile {
                path: path.to_path_buf(),
            });
        }
    }
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(create);
    match opts.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => opts
            .open(path)
            .map(|f| (f, false))
            .map_err(io_err(path, "open")),
        Err(e) => Err(io_err(path, "open")(e)),
    }
}

/// Allocate `len` bytes of the file's space, or only set its length where the file
/// system cannot allocate ahead.
fn allocate(file: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let Ok(n) = libc::off_t::try_from(len) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: fallocate on a descriptor we own, with plain integer arguments.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, n) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => file.set_len(len),
        _ => Err(e),
    }
}

/// A tier id: random and never 0.
fn new_tier_id() -> u64 {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let id = std::collections::hash_map::RandomState::new().hash_one((now, std::process::id()));
    id.max(1)
}

/// A zeroed buffer aligned to [`BLOCK`], as `O_DIRECT` asks of the memory it reads into
/// and writes from; it grows to the largest length asked of it and is reused. Its memory is
/// a mapping of its own (not the allocator's heap), so a buffer dropped gives its memory
/// back to the system at once: page images are a segment each, and a heap may keep what is
/// freed into it (`tune_heap` lets glibc keep up to 8 MiB free per heap).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: the buffer owns its memory exclusively (as a `Vec<u8>` would).
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// An empty buffer (it allocates on first use).
    pub fn new() -> AlignedBuf {
        AlignedBuf {
            ptr: NonNull::dangling(),
            cap: 0,
        }
    }

    /// The first `len` bytes (rounded up to whole blocks in memory), grown if needed.
    pub fn get(&mut self, len: usize) -> &mut [u8] {
        if len > self.cap {
            let cap = len.max(1).div_ceil(BLOCK) * BLOCK;
            // SAFETY: a fresh private anonymous mapping (zeroed, page-aligned: a page is a
            // multiple of BLOCK on every platform kvcached runs on); no existing memory is
            // touched.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    cap,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            let ptr = NonNull::new(ptr.cast::<u8>()).filter(|_| ptr != libc::MAP_FAILED);
            let Some(ptr) = ptr.filter(|p| p.as_ptr() as usize % BLOCK == 0) else {
                let layout = std::alloc::Layout::from_size_align(cap, BLOCK)
                    .unwrap_or(std::alloc::Layout::new::<[u8; BLOCK]>());
                std::alloc::handle_alloc_error(layout);
            };
            self.release();
            self.ptr = ptr;
            self.cap = cap;
        }
        // SAFETY: `ptr` holds `cap >= len` initialized (zeroed, then only written through
        // this slice) bytes that we own, borrowed mutably for as long as `self` is.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len) }
    }

    fn release(&mut self) {
        if self.cap == 0 {
            return;
        }
        // SAFETY: mapped by `get` with this very length, and not used after.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.cap) };
        self.ptr = NonNull::dangling();
        self.cap = 0;
    }
}

impl Default for AlignedBuf {
    fn default() -> AlignedBuf {
        AlignedBuf::new()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.release();
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("cap", &self.cap)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdir::Dir;
    use super::*;

    fn image(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(13) ^ seed)
            .collect()
    }

    const PAGE: usize = 64 << 10;

    /// Through the page cache (memcached's way) pages read back the same.
    #[test]
    fn pages_read_back_through_the_page_cache() {
        let d = Dir::new("file-cached");
        let mut f = FlashFile::create(&d.file(), 1 << 20, PAGE).expect("create");
        f.use_page_cache().expect("clear O_DIRECT");
        assert!(!f.is_direct());
        let mut buf = AlignedBuf::new();
        let a = image(PAGE, 3);
        f.write_page(2, 5, &a, &mut buf).expect("write");
        let mut out = Vec::new();
        f.read(2, 5, 777, 3000, &mut buf, &mut out).expect("read");
        assert_eq!(out, a[777..3777]);
        assert!(f.read(2, 6, 0, 10, &mut buf, &mut out).is_err(), "stale");
    }

    #[test]
    fn pages_written_read_back_after_reopening() {
        let d = Dir::new("file-reopen");
        let f = FlashFile::create(&d.file(), 1 << 20, PAGE).expect("create");
        let h = *f.header();
        assert!(h.pages >= 14, "{h:?}");
        assert_eq!(
            std::fs::metadata(d.file()).expect("stat").len(),
            h.file_len()
        );
        let mut buf = AlignedBuf::new();
        let a = image(PAGE, 1);
        let b = image(1000, 2);
        assert_eq!(f.write_page(0, 1, &a, &mut buf).expect("write"), 17 * BLOCK);
        assert_eq!(
            f.write_page(h.pages - 1, 7, &b, &mut buf).expect("write"),
            BLOCK
        );
        drop(f);
        let f = FlashFile::open(&d.file()).expect("open");
        assert_eq!(*f.header(), h);
        let mut out = Vec::new();
        f.read(0, 1, 5000, 20000, &mut buf, &mut out).expect("read");
        assert_eq!(out, a[5000..25000]);
        out.clear();
        f.read(h.pages - 1, 7, 0, 1000, &mut buf, &mut out)
            .expect("read");
        assert_eq!(out, b);
        // A stale generation, and a page never written.
        assert!(matches!(
            f.read(0, 2, 0, 10, &mut buf, &mut out),
            Err(FlashError::Layout {
                source: LayoutError::Block { page: 0, block: 0 },
                ..
            })
        ));
        assert!(f.read(1, 0, 0, 10, &mut buf, &mut out).is_err());
        assert!(f.write_page(h.pages, 0, &b, &mut buf).is_err());
        assert!(f
            .write_page(0, 0, &image(h.page_capacity() + 1, 0), &mut buf)
            .is_err());
        assert_eq!(out, b, "nothing appended by a refused read");
    }

    #[test]
    fn damage_on_disk_is_found() {
        let d = Dir::new("file-damage");
        let f = FlashFile::create(&d.file(), 1 << 20, PAGE).expect("create");
        let mut buf = AlignedBuf::new();
        let a = image(PAGE, 3);
        f.write_page(2, 4, &a, &mut buf).expect("write");
        // Flip one byte of page 2's fourth block behind the file's back.
        let at = f.header().page_offset(2) + 3 * BLOCK as u64 + 100;
        let raw = OpenOptions::new()
            .read(true)
            .write(true)
            .open(d.file())
            .expect("open");
        let mut byte = [0u8];
        raw.read_exact_at(&mut byte, at).expect("read");
        raw.write_all_at(&[byte[0] ^ 0x40], at).expect("write");
        drop(raw);
        let mut out = Vec::new();
        f.read(2, 4, 0, 3 * BLOCK_DATA, &mut buf, &mut out)
            .expect("blocks 0-2 are sound");
        out.clear();
        let err = f
            .read(2, 4, 3 * BLOCK_DATA - 1, 2, &mut buf, &mut out)
            .expect_err("damaged");
        assert!(
            matches!(
                err,
                FlashError::Layout {
                    source: LayoutError::Block { page: 2, block: 3 },
                    ..
                }
            ),
            "{err}"
        );
        assert!(out.is_empty());
    }

    #[test]
    fn a_truncated_file_fails_reads_and_refuses_to_open() {
        let d = Dir::new("file-truncated");
        let f = FlashFile::create(&d.file(), 1 << 20, PAGE).expect("create");
        let mut buf = AlignedBuf::new();
        let last = f.header().pages - 1;
        f.write_page(last, 1, &image(PAGE, 5), &mut buf)
            .expect("write");
        let cut = f.header().page_offset(last) + BLOCK as u64;
        std::fs::OpenOptions::new()
            .write(true)
            .open(d.file())
            .and_then(|t| t.set_len(cut))
            .expect("truncate");
        let mut out = Vec::new();
        f.read(last, 1, 0, 100, &mut buf, &mut out)
            .expect("the first block is still there");
        out.clear();
        let err = f
            .read(last, 1, 0, PAGE, &mut buf, &mut out)
            .expect_err("cut");
        assert!(matches!(err, FlashError::Io { op: "read", .. }), "{err}");
        assert!(out.is_empty());
        let err = FlashFile::open(&d.file()).expect_err("shorter than its header says");
        assert!(matches!(err, FlashError::Length { .. }), "{err}");
    }

    #[test]
    fn bad_files_and_sizes_are_refused_with_their_reason() {
        let d = Dir::new("file-bad");
        let err = FlashFile::create(&d.file(), 64 << 10, PAGE).expect_err("too small");
        assert!(matches!(err, FlashError::TooSmall { .. }), "{err}");
        let err = FlashFile::create(&d.0, 1 << 20, PAGE).expect_err("a directory");
        assert!(matches!(err, FlashError::NotAFile { .. }), "{err}");
        std::fs::write(d.file(), vec![7u8; 3 * BLOCK]).expect("write");
        let err = FlashFile::open(&d.file()).expect_err("not ours");
        assert!(
            matches!(
                err,
                FlashError::Layout {
                    source: LayoutError::Magic,
                    ..
                }
            ),
            "{err}"
        );
        std::fs::write(d.file(), b"short").expect("write");
        assert!(matches!(
            FlashFile::open(&d.file()),
            Err(FlashError::Length { .. })
        ));
        let err = FlashFile::open(&d.0.join("absent")).expect_err("absent");
        assert!(matches!(err, FlashError::Io { op: "open", .. }), "{err}");
        // A file made again gets a new tier id: the old one's blocks no longer pass.
        let f = FlashFile::create(&d.file(), 1 << 20, PAGE).expect("create");
        let mut buf = AlignedBuf::new();
        f.write_page(0, 1, &image(100, 0), &mut buf).expect("write");
        let old = *f.header();
        drop(f);
        let f = FlashFile::create(&d.file(), 1 << 20, PAGE).expect("create again");
        assert_ne!(f.header().tier_id, old.tier_id);
        assert!(f.read(0, 1, 0, 100, &mut buf, &mut Vec::new()).is_err());
    }

    #[test]
    fn aligned_buffers_are_aligned_and_grow() {
        let mut b = AlignedBuf::new();
        let p = b.get(10);
        assert_eq!(p.len(), 10);
        assert_eq!(p.as_ptr() as usize % BLOCK, 0);
        p.fill(9);
        let p = b.get(3 * BLOCK + 1);
        assert_eq!(p.as_ptr() as usize % BLOCK, 0);
        assert_eq!(p.len(), 3 * BLOCK + 1);
    }
}
