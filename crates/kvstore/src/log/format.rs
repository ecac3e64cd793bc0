//! The on-segment record format (see `FORMAT.md` next to this file).
//!
//! Everything here works on raw segment memory: writers own the bytes they write (their
//! segment is open and only they append to it), readers only read records that were
//! published before the index slot that leads to them.

use std::sync::atomic::{AtomicU8, Ordering};

/// Bytes at the start of every segment (magic, version, kind, sequence, CAS base).
pub(crate) const SEG_HDR: usize = 24;
/// Segment magic, "KVLG" little-endian.
pub(crate) const SEG_MAGIC: u32 = u32::from_le_bytes(*b"KVLG");
pub(crate) const SEG_VERSION: u8 = 1;
pub(crate) const SEG_KIND_REGULAR: u8 = 1;
pub(crate) const SEG_KIND_LARGE: u8 = 2;

/// First record byte: set last, with release ordering, once the rest is written.
pub(crate) const PUBLISHED: u8 = 0x80;
pub(crate) const KIND_MASK: u8 = 0x03;
pub(crate) const KIND_ITEM: u8 = 1;
pub(crate) const KIND_TOMBSTONE: u8 = 2;
pub(crate) const HAS_FLAGS: u8 = 0x04;
pub(crate) const HAS_EXPTIME: u8 = 0x08;
/// The record is a rewrite of an item that kept its CAS (touch, second-chance copy) and
/// carries a rewrite stamp that orders it among copies with the same CAS.
pub(crate) const HAS_STAMP: u8 = 0x10;
/// The record carries a meta byte (after the rewrite stamp): see `META_*`.
pub(crate) const HAS_META: u8 = 0x20;

/// Meta byte: the item is stale (`md ... I`, `ms ... I` with an older CAS).
pub(crate) const META_STALE: u8 = 0x01;
/// Meta byte: the key is binary (the client sent it base64-encoded, `b`).
pub(crate) const META_BINARY_KEY: u8 = 0x02;
/// Meta byte: an explicit CAS unique follows (LEB128 varint, absolute): the CAS clients
/// see (`E`, or the one `md ... x` keeps). The CAS delta field still holds the version
/// the engine drew, which orders records and decides flushes.
pub(crate) const META_EXPLICIT_CAS: u8 = 0x04;

/// The largest record header: state, key length, value length (varint, 5), CAS delta
/// (zigzag varint, 10), flags (varint, 5), exptime (4), rewrite stamp (varint, 10), meta
/// byte (1) and explicit CAS (varint, 10).
pub(crate) const HDR_MAX: usize = 2 + 5 + 10 + 5 + 4 + 10 + 1 + 10;

/// What a writer puts into a record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec<'a> {
    pub kind: u8,
    pub key: &'a [u8],
    /// The value, as up to two parts written back to back (append/prepend).
    pub parts: [&'a [u8]; 2],
    pub flags: u32,
    pub exptime: u32,
    pub cas: u64,
    /// Rewrite stamp (0: an original write).
    pub stamp: u64,
    /// `META_STALE | META_BINARY_KEY` (`META_EXPLICIT_CAS` is implied by `explicit_cas`).
    pub meta: u8,
    /// The CAS unique clients see, when it is not `cas` (the version).
    pub explicit_cas: Option<u64>,
}

/// A parsed record, borrowing segment memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rec<'a> {
    pub kind: u8,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    pub exptime: u32,
    pub cas: u64,
    /// Read by log replay (the tests now; warm restart later).
    #[cfg_attr(not(test), allow(dead_code))]
    pub stamp: u64,
    /// `META_STALE | META_BINARY_KEY` bits of the meta byte (0 without one).
    pub meta: u8,
    /// The explicit CAS unique, if the record has one.
    pub explicit_cas: Option<u64>,
    /// Bytes the whole record occupies.
    pub len: usize,
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

fn put_varint(buf: &mut [u8; HDR_MAX], at: &mut usize, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if let Some(slot) = buf.get_mut(*at) {
            *slot = if v == 0 { b } else { b | 0x80 };
        }
        *at += 1;
        if v == 0 {
            break;
        }
    }
}

/// Encode the header of `spec` (relative to the segment's CAS base) into `buf`; returns
/// the header length.
fn encode_header(spec: &Spec<'_>, base: u64, buf: &mut [u8; HDR_MAX]) -> usize {
    let mut state = spec.kind & KIND_MASK;
    if spec.flags != 0 {
        state |= HAS_FLAGS;
    }
    if spec.exptime != 0 {
        state |= HAS_EXPTIME;
    }
    if spec.stamp != 0 {
        state |= HAS_STAMP;
    }
    let mut meta = spec.meta & (META_STALE | META_BINARY_KEY);
    if spec.explicit_cas.is_some() {
        meta |= META_EXPLICIT_CAS;
    }
    if meta != 0 {
        state |= HAS_META;
    }
    buf[0] = state;
    buf[1] = spec.key.len() as u8;
    let mut at = 2;
    let vlen = spec.parts[0].len() + spec.parts[1].len();
    put_varint(buf, &mut at, vlen as u64);
    put_varint(buf, &mut at, zigzag(spec.cas.wrapping_sub(base) as i64));
    if spec.flags != 0 {
        put_varint(buf, &mut at, u64::from(spec.flags));
    }
    if spec.exptime != 0 {
        for (i, b) in spec.exptime.to_le_bytes().into_iter().enumerate() {
            buf[at + i] = b;
        }
        at += 4;
    }
    if spec.stamp != 0 {
        put_varint(buf, &mut at, spec.stamp);
    }
    if meta != 0 {
        buf[at] = meta;
        at += 1;
        if let Some(c) = spec.explicit_cas {
            put_varint(buf, &mut at, c);
        }
    }
    at
}

/// Bytes the record for `spec` takes in a segment whose CAS base is `base`.
pub(crate) fn encoded_len(spec: &Spec<'_>, base: u64) -> usize {
    let mut buf = [0u8; HDR_MAX];
    encode_header(spec, base, &mut buf) + spec.key.len() + spec.parts[0].len() + spec.parts[1].len()
}

/// Write the record for `spec` at `dst` and publish it; returns its length. If `room`
/// leaves a byte after it, that byte is set to 0 before the record is published: the next
/// record's state byte, so that a scanner that goes by state bytes (rather than the
/// segment's published length) stops there, although a reused segment is not cleared.
///
/// # Safety
/// `dst` must be valid for writes of `room >= encoded_len(spec, base)` bytes, no other
/// thread may access those bytes during the call, and `spec.key.len()` must be at most 255.
pub(crate) unsafe fn write(dst: *mut u8, room: usize, spec: &Spec<'_>, base: u64) -> usize {
    let mut hdr = [0u8; HDR_MAX];
    let hlen = encode_header(spec, base, &mut hdr);
    let mut at = 1;
    // SAFETY (whole block): the caller guarantees `dst .. dst + encoded_len` is writable
    // and exclusively ours; every copy below stays inside that range (header, key and
    // value parts add up to exactly `encoded_len`), and the sources are caller slices
    // that cannot overlap the unpublished destination.
    unsafe {
        std::ptr::copy_nonoverlapping(hdr.as_ptr().add(1), dst.add(at), hlen - 1);
        at = hlen;
        std::ptr::copy_nonoverlapping(spec.key.as_ptr(), dst.add(at), spec.key.len());
        at += spec.key.len();
        for part in spec.parts {
            std::ptr::copy_nonoverlapping(part.as_ptr(), dst.add(at), part.len());
            at += part.len();
        }
        if at < room {
            dst.add(at).write(0);
        }
        // Publish: the state byte goes last, with release ordering, so that a log
        // scanner that sees PUBLISHED with acquire also sees the whole record.
        AtomicU8::from_ptr(dst).store(hdr[0] | PUBLISHED, Ordering::Release);
    }
    at
}

/// Read the varint at `*at`, never reading at or past `end`.
///
/// # Safety
/// `p .. p + end` must be readable and not concurrently written.
unsafe fn get_varint(p: *const u8, at: &mut usize, end: usize, max_bytes: usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..max_bytes {
        if *at >= end {
            return None;
        }
        // SAFETY: `*at < end` and the caller guarantees `p .. p + end` is readable.
        let b = unsafe { p.add(*at).read() };
        *at += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Parse the record at `base_ptr + off`.
///
/// Returns `None` for an unwritten (zero) or unpublished state byte or a record that does
/// not fit below `end`.
///
/// # Safety
/// `base_ptr .. base_ptr + end` must be a live allocation for `'a`; the record at `off`, if
/// published, must not be written for `'a` (its segment is pinned, or its bucket locked, or
/// the segment is owned by the caller). Only bytes of that record are read.
pub(crate) unsafe fn read<'a>(
    base_ptr: *const u8,
    end: usize,
    off: usize,
    cas_base: u64,
) -> Option<Rec<'a>> {
    if off >= end {
        return None;
    }
    // SAFETY: `off < end`, inside the allocation; the state byte is read atomically, so
    // even a scanner racing with a writer of an unpublished record reads it without a
    // data race.
    let state = unsafe { AtomicU8::from_ptr(base_ptr.add(off).cast_mut()).load(Ordering::Acquire) };
    if state & PUBLISHED == 0 {
        return None;
    }
    let kind = state & KIND_MASK;
    let mut at = off + 1;
    if at >= end {
        return None;
    }
    // SAFETY: `at < end`; the byte belongs to a published record (its header).
    let klen = usize::from(unsafe { base_ptr.add(at).read() });
    at += 1;
    // SAFETY: varints stop at `end` and only read header bytes of this record.
    let vlen = unsafe { get_varint(base_ptr, &mut at, end, 5)? } as usize;
    // SAFETY: as above.
    let zz = unsafe { get_varint(base_ptr, &mut at, end, 10)? };
    let cas = cas_base.wrapping_add(unzigzag(zz) as u64);
    let flags = if state & HAS_FLAGS != 0 {
        // SAFETY: as above.
        unsafe { get_varint(base_ptr, &mut at, end, 5)? as u32 }
    } else {
        0
    };
    let exptime = if state & HAS_EXPTIME != 0 {
        if at + 4 > end {
            return None;
        }
        let mut b = [0u8; 4];
        // SAFETY: `at + 4 <= end`, header bytes of this record.
        unsafe { std::ptr::copy_nonoverlapping(base_ptr.add(at), b.as_mut_ptr(), 4) };
        at += 4;
        u32::from_le_bytes(b)
    } else {
        0
    };
    let stamp = if state & HAS_STAMP != 0 {
        // SAFETY: as for the other varints.
        unsafe { get_varint(base_ptr, &mut at, end, 10)? }
    } else {
        0
    };
    let (mut meta, mut explicit_cas) = (0, None);
    if state & HAS_META != 0 {
        if at >= end {
            return None;
        }
        // SAFETY: `at < end`; a header byte of this record.
        let m = unsafe { base_ptr.add(at).read() };
        at += 1;
        if m & META_EXPLICIT_CAS != 0 {
            // SAFETY: as for the other varints.
            explicit_cas = Some(unsafe { get_varint(base_ptr, &mut at, end, 10)? });
        }
        meta = m & (META_STALE | META_BINARY_KEY);
    }
    let total = at.checked_add(klen)?.checked_add(vlen)?;
    if total > end {
        return None;
    }
    // SAFETY: `at .. total` lies inside the allocation and belongs to this published
    // record, which the caller guarantees stays unmodified for `'a`.
    let (key, value) = unsafe {
        (
            std::slice::from_raw_parts(base_ptr.add(at), klen),
            std::slice::from_raw_parts(base_ptr.add(at + klen), vlen),
        )
    };
    Some(Rec {
        kind,
        key,
        value,
        flags,
        exptime,
        cas,
        stamp,
        meta,
        explicit_cas,
        len: total - off,
    })
}

/// Write a segment header.
///
/// # Safety
/// `dst` must be valid for `SEG_HDR` bytes of writes that no other thread accesses.
pub(crate) unsafe fn write_seg_header(dst: *mut u8, kind: u8, seq: u64, cas_base: u64) {
    let mut h = [0u8; SEG_HDR];
    h[0..4].copy_from_slice(&SEG_MAGIC.to_le_bytes());
    h[4] = SEG_VERSION;
    h[5] = kind;
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..24].copy_from_slice(&cas_base.to_le_bytes());
    // SAFETY: the caller guarantees `dst .. dst + SEG_HDR` is writable and exclusive.
    unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), dst, SEG_HDR) };
}

/// The CAS base of the segment at `p`.
///
/// # Safety
/// `p .. p + SEG_HDR` must be readable and hold a header written before the caller's
/// acquire of a slot pointing into the segment (or by the caller itself).
pub(crate) unsafe fn seg_cas_base(p: *const u8) -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: per the contract, the 8 bytes at 16..24 are readable and immutable now.
    unsafe { std::ptr::copy_nonoverlapping(p.add(16), b.as_mut_ptr(), 8) };
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(spec: Spec<'_>, base: u64) {
        let len = encoded_len(&spec, base);
        // Old bytes, as in a reused segment.
        let mut buf = vec![0xffu8; len + 8];
        // SAFETY: `buf` holds `len + 8` writable bytes that only this test touches.
        let n = unsafe { write(buf.as_mut_ptr(), buf.len(), &spec, base) };
        assert_eq!(n, len);
        // The next state byte is cleared: a scan by state bytes stops after the record.
        assert_eq!(buf[len], 0);
        assert!(buf[len + 1..].iter().all(|&b| b == 0xff));
        // SAFETY: as below.
        assert!(unsafe { read(buf.as_ptr(), buf.len(), len, base) }.is_none());
        // SAFETY: `buf` is alive and unmodified while `r` is used.
        let r = unsafe { read(buf.as_ptr(), buf.len(), 0, base) }.expect("parses");
        assert_eq!(r.kind, spec.kind);
        assert_eq!(r.key, spec.key);
        let v: Vec<u8> = [spec.parts[0], spec.parts[1]].concat();
        assert_eq!(r.value, &v[..]);
        assert_eq!(r.flags, spec.flags);
        assert_eq!(r.exptime, spec.exptime);
        assert_eq!(r.cas, spec.cas);
        assert_eq!(r.stamp, spec.stamp);
        assert_eq!(r.meta, spec.meta);
        assert_eq!(r.explicit_cas, spec.explicit_cas);
        assert_eq!(r.len, len);
        // The byte after the record is still unwritten: parsing there finds nothing.
        // SAFETY: as above.
        assert!(unsafe { read(buf.as_ptr(), buf.len(), len, base) }.is_none());
    }

    #[test]
    fn records_roundtrip() {
        let key = [7u8; 255];
        let big = vec![1u8; 70_000];
        for (flags, exptime, cas, base, stamp) in [
            (0, 0, 5, 1, 0),
            (1, 1_700_000_000, 1, 1000, 1),
            (u32::MAX, u32::MAX, u64::MAX, 0, u64::MAX),
            (12345, 7, 3, u64::MAX, 300),
        ] {
            for (k, p0, p1) in [
                (&b"k"[..], &b""[..], &b""[..]),
                (&key[..], &b"ab"[..], &b"cd"[..]),
                (&b""[..], &big[..], &b"x"[..]),
            ] {
                for kind in [KIND_ITEM, KIND_TOMBSTONE] {
                    for (meta, explicit_cas) in [
                        (0, None),
                        (META_STALE, None),
                        (META_BINARY_KEY, Some(u64::MAX)),
                        (0, Some(7)),
                    ] {
                        roundtrip(
                            Spec {
                                kind,
                                key: k,
                                parts: [p0, p1],
                                flags,
                                exptime,
                                cas,
                                stamp,
                                meta,
                                explicit_cas,
                            },
                            base,
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn compact_header() {
        // 15-byte key, 32-byte value, no flags/exptime, CAS close to the segment base.
        let spec = Spec {
            kind: KIND_ITEM,
            key: &[b'k'; 15],
            parts: [&[b'v'; 32], &[]],
            flags: 0,
            exptime: 0,
            cas: 1_000,
            stamp: 0,
            meta: 0,
            explicit_cas: None,
        };
        assert_eq!(encoded_len(&spec, 990) - 47, 4);
        assert!(encoded_len(&spec, 0) - 47 <= 5);
    }

    #[test]
    fn truncated_records_are_rejected() {
        let spec = Spec {
            kind: KIND_ITEM,
            key: b"key",
            parts: [b"value", b""],
            flags: 9,
            exptime: 99,
            cas: 77,
            stamp: 5,
            meta: META_STALE | META_BINARY_KEY,
            explicit_cas: Some(1 << 40),
        };
        let len = encoded_len(&spec, 0);
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` holds exactly `len` writable bytes (no room for the next state
        // byte: none is written).
        unsafe { write(buf.as_mut_ptr(), buf.len(), &spec, 0) };
        for end in 0..len {
            // SAFETY: `buf` outlives the call; `end <= buf.len()`.
            assert!(
                unsafe { read(buf.as_ptr(), end, 0, 0) }.is_none(),
                "end {end}"
            );
        }
        buf[0] &= !PUBLISHED;
        // SAFETY: as above.
        assert!(unsafe { read(buf.as_ptr(), len, 0, 0) }.is_none());
    }

    #[test]
    fn zigzag_roundtrip() {
        for d in [0i64, 1, -1, i64::MAX, i64::MIN, 12345, -98765] {
            assert_eq!(unzigzag(zigzag(d)), d);
        }
    }
}
