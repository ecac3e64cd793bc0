//! Segment memory: anonymous mappings, so that freeing a segment gives its pages back to
//! the operating system (malloc may keep large freed blocks), and untouched pages of a
//! fresh segment cost no resident memory.

use std::ptr::NonNull;

/// Map `len` bytes of zeroed, private, read-write memory.
pub(crate) fn map(len: usize) -> Option<NonNull<u8>> {
    map_anon(len, 0)
}

/// Reserve `len` bytes of zeroed, private, read-write address space that is not charged
/// against the commit limit up front (`MAP_NORESERVE`): pages cost memory only once
/// touched. For tables sized for the most they could ever need.
fn map_reserve(len: usize) -> Option<NonNull<u8>> {
    map_anon(len, libc::MAP_NORESERVE)
}

fn map_anon(len: usize, extra_flags: libc::c_int) -> Option<NonNull<u8>> {
    mmap(
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
        -1,
        0,
    )
}

/// A new mapping (never over an existing one: the address is the kernel's choice).
fn mmap(
    len: usize,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: std::os::fd::RawFd,
    offset: libc::off_t,
) -> Option<NonNull<u8>> {
    if len == 0 {
        return None;
    }
    // SAFETY: a mapping with a null hint touches no existing memory; the result is checked
    // against MAP_FAILED before use. A file mapping's callers map only ranges inside the
    // file (pages wholly past its end would fault).
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, offset) };
    if p == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(p.cast::<u8>())
}

/// Make `len` bytes from `p` (page-aligned, inside one mapping of ours) resident and
/// writable in one system call (`MADV_POPULATE_WRITE`), instead of a page fault per page
/// as they are first written. Best effort: kernels before 5.14 refuse it.
pub(crate) fn populate(p: NonNull<u8>, len: usize) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // SAFETY: per the contract the range is inside a mapping of ours; populating pages
    // changes no byte of them.
    unsafe {
        libc::madvise(p.as_ptr().cast(), len, libc::MADV_POPULATE_WRITE);
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = (p, len);
}

/// Map `len` bytes of the file `fd` from `offset` (page-aligned) private and read-write:
/// reads see the file's pages (page cache, no copy); a write copies the page it lands on
/// for this mapping alone and never reaches the file. A warm restart maps segment images
/// of its snapshot file this way, and only a file no name reaches (so nobody can truncate
/// it under the mapping: a page past a file's end cannot be read).
pub(crate) fn map_file(fd: std::os::fd::RawFd, offset: u64, len: usize) -> Option<NonNull<u8>> {
    let off = libc::off_t::try_from(offset).ok()?;
    mmap(
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE,
        fd,
        off,
    )
}

/// Map the first `len` bytes of the file `fd` private and read-only (a file no name
/// reaches, as for [`map_file`]).
pub(crate) fn map_file_read(fd: std::os::fd::RawFd, len: usize) -> Option<NonNull<u8>> {
    mmap(len, libc::PROT_READ, libc::MAP_PRIVATE, fd, 0)
}

/// Unmap memory from [`map`], [`map_file`] or [`map_file_read`].
///
/// # Safety
/// `p` and `len` must come from one successful `map(len)`, `map_file(_, _, len)` or
/// `map_file_read(_, len)` call,
/// and no reference into the mapping may be used after this call.
pub(crate) unsafe fn unmap(p: NonNull<u8>, len: usize) {
    // SAFETY: per the contract the range is exactly one mapping of ours that nobody uses.
    // munmap of a valid mapping cannot fail in a way we could act on.
    unsafe {
        libc::munmap(p.as_ptr().cast(), len);
    }
}

/// A slice of `T` in its own anonymous mapping: zero-filled on first touch, so the untouched
/// part of a large table costs no resident memory (an aligned `alloc_zeroed` writes zeros
/// over all of it), and given back to the system on drop.
pub(crate) struct ZeroedSlice<T> {
    ptr: NonNull<T>,
    len: usize,
    bytes: usize,
    /// Where the elements live instead when the mapping failed.
    heap: Option<Box<[T]>>,
}

// SAFETY: the slice owns its elements like a Box<[T]>; sharing or sending it is as safe as
// sharing or sending the elements.
unsafe impl<T: Send> Send for ZeroedSlice<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for ZeroedSlice<T> {}

impl<T> ZeroedSlice<T> {
    /// `len` zeroed elements: mapped, or (if the mapping fails) default values on the heap.
    ///
    /// # Safety
    /// All-zero bytes must be a valid `T` equal to `T::default()`, and `T` must need no drop
    /// (the mapping is released without dropping elements) and no alignment above a page.
    pub(crate) unsafe fn new(len: usize) -> ZeroedSlice<T>
    where
        T: Default,
    {
        let bytes = std::mem::size_of::<T>().saturating_mul(len).max(1);
        match map(bytes) {
            Some(p) => ZeroedSlice {
                ptr: p.cast::<T>(),
                len,
                bytes,
                heap: None,
            },
            None => ZeroedSlice {
                ptr: NonNull::dangling(),
                len: 0,
                bytes: 0,
                heap: Some((0..len).map(|_| T::default()).collect()),
            },
        }
    }
}

impl<T> ZeroedSlice<T> {
    /// `len` zeroed elements in a mapping reserved without committing memory, or None
    /// when the address space cannot be had (no heap fallback: `len` may be far more than
    /// will ever be touched).
    ///
    /// # Safety
    /// As for [`ZeroedSlice::new`].
    pub(crate) unsafe fn reserve(len: usize) -> Option<ZeroedSlice<T>> {
        let bytes = std::mem::size_of::<T>().checked_mul(len)?.max(1);
        let p = map_reserve(bytes)?;
        Some(ZeroedSlice {
            ptr: p.cast::<T>(),
            len,
            bytes,
            heap: None,
        })
    }
}

impl<T> ZeroedSlice<T> {
    /// Make the pages of the first `n` elements resident and writable now, in one system
    /// call (`MADV_POPULATE_WRITE`), instead of a read fault and a copy-on-write fault per
    /// page later. Best effort: kernels before 5.14 refuse it and pages fault in as before.
    pub(crate) fn populate(&self, n: usize) {
        if self.heap.is_some() {
            return;
        }
        let bytes = std::mem::size_of::<T>().saturating_mul(n.min(self.len));
        let len = bytes.div_ceil(4096) * 4096;
        if len == 0 || len > self.bytes.div_ceil(4096) * 4096 {
            return;
        }
        // `ptr .. ptr + len` lies within our mapping (page-rounded, at most its size).
        populate(self.ptr.cast(), len);
    }
}

impl<T> std::ops::Deref for ZeroedSlice<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if let Some(heap) = &self.heap {
            return heap;
        }
        // SAFETY: `ptr` maps `len` zero-initialized `T`s (valid per `new`'s contract),
        // page-aligned, and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for ZeroedSlice<T> {
    fn drop(&mut self) {
        if self.heap.is_none() {
            // SAFETY: the mapping came from `map(self.bytes)` and no borrow of `self`
            // outlives it.
            unsafe { unmap(self.ptr.cast(), self.bytes) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_write_unmap() {
        let len = 1 << 20;
        let p = map(len).expect("mmap");
        // SAFETY: `p .. p + len` is our fresh mapping; nothing else references it.
        unsafe {
            assert_eq!(p.as_ptr().add(len - 1).read(), 0);
            p.as_ptr().write(42);
            assert_eq!(p.as_ptr().read(), 42);
            unmap(p, len);
        }
        assert!(map(0).is_none());
    }

    #[test]
    fn zeroed_slice_is_zero_and_writable() {
        use std::sync::atomic::{AtomicU64, Ordering};
        // SAFETY: AtomicU64 is valid and default as zero bytes, and needs no drop.
        let s: ZeroedSlice<AtomicU64> = unsafe { ZeroedSlice::new(100_000) };
        assert_eq!(s.len(), 100_000);
        assert!(s.iter().all(|a| a.load(Ordering::Relaxed) == 0));
        s[99_999].store(7, Ordering::Relaxed);
        assert_eq!(s[99_999].load(Ordering::Relaxed), 7);
        // SAFETY: as above.
        let empty: ZeroedSlice<AtomicU64> = unsafe { ZeroedSlice::new(0) };
        assert!(empty.is_empty());
    }
}
