//! Segment memory: anonymous mappings, so that freeing a segment gives its pages back to
//! the operating system (malloc may keep large freed blocks), and untouched pages of a
//! fresh segment cost no resident memory.

use std::ptr::NonNull;

/// Map `len` bytes of zeroed, private, read-write memory.
pub(crate) fn map(len: usize) -> Option<NonNull<u8>> {
    if len == 0 {
        return None;
    }
    // SAFETY: an anonymous private mapping with a null hint touches no existing memory;
    // the result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(p.cast::<u8>())
}

/// Unmap memory from [`map`].
///
/// # Safety
/// `p` and `len` must come from one successful `map(len)` call, and no reference into the
/// mapping may be used after this call.
pub(crate) unsafe fn unmap(p: NonNull<u8>, len: usize) {
    // SAFETY: per the contract the range is exactly one mapping of ours that nobody uses.
    // munmap of a valid mapping cannot fail in a way we could act on.
    unsafe {
        libc::munmap(p.as_ptr().cast(), len);
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
}
