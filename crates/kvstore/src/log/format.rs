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
pub(crate) const SEG_VERSION: u8 = 2;
pub(crate) const SEG_KIND_REGULAR: u8 = 1;
pub(crate) const SEG_KIND_LARGE: u8 = 2;

/// First record byte: set last, with release ordering, once the rest is written.
pub(crate) const PUBLISHED: u8 = 0x80;
/// State byte: the record is in the short form (see `FORMAT.md`).
const SHORT: u8 = 0x40;
/// State byte: client flags follow (both forms).
const HAS_FLAGS: u8 = 0x20;
/// State byte: an expiry follows (both forms).
const HAS_EXPTIME: u8 = 0x10;
/// State byte, long form: the extension byte follows.
const HAS_EXT: u8 = 0x08;
/// State byte, long form: a tombstone (else an item).
const TOMB: u8 = 0x01;
/// Short form: the low bits of the state byte hold the key length's high bits.
const SHORT_KEY_HIGH: u8 = 0x0f;
/// Longest key and value of a short-form record.
const SHORT_MAX_KEY: usize = 32;
const SHORT_MAX_VALUE: usize = 127;

pub(crate) const KIND_ITEM: u8 = 1;
pub(crate) const KIND_TOMBSTONE: u8 = 2;

/// Meta marks (in [`Rec::meta`] and the extension byte): the item is stale (`md ... I`,
/// `ms ... I` with an older CAS).
pub(crate) const META_STALE: u8 = 0x01;
/// The key is binary (the client sent it base64-encoded, `b`).
pub(crate) const META_BINARY_KEY: u8 = 0x02;
/// Extension byte: an explicit CAS unique follows (LEB128 varint, absolute): the CAS
/// clients see (`E`, or the one `md ... x` keeps). The record's version still orders
/// records and decides flushes.
const EXT_EXPLICIT_CAS: u8 = 0x04;
/// Extension byte: the record's version is not the one its place gives: a delta follows.
const EXT_CAS: u8 = 0x08;
/// Extension byte: a rewrite stamp follows (the record rewrites an item and kept its CAS:
/// touch, second-chance copy).
const EXT_STAMP: u8 = 0x10;

/// The largest record header: state, key length, value length (varint, 5), flags (varint,
/// 5), exptime (4), extension byte (1), CAS delta (varint, 10), rewrite stamp (varint, 10)
/// and explicit CAS (varint, 10).
pub(crate) const HDR_MAX: usize = 2 + 5 + 5 + 4 + 1 + 10 + 10 + 10;

/// What a writer puts into a record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec<'a> {
    pub kind: u8,
    pub key: &'a [u8],
    /// The value, as up to two parts written back to back (append/prepend).
    pub parts: [&'a [u8]; 2],
    pub flags: u32,
    pub exptime: u32,
    /// The record's version (CAS unique): stored only when it is not the one its place
    /// gives (see [`natural_cas`]).
    pub cas: u64,
    /// Rewrite stamp (0: an original write).
    pub stamp: u64,
    /// `META_STALE | META_BINARY_KEY`.
    pub meta: u8,
    /// The CAS unique clients see, when it is not `cas` (the version).
    pub explicit_cas: Option<u64>,
}

impl<'a> Spec<'a> {
    /// Record `r` again, as it is: its version, stamp and marks (a copy: compaction's, a
    /// replica's snapshot, a warm restart's image of an old format).
    pub(crate) fn copy_of(r: &Rec<'a>) -> Spec<'a> {
        Spec {
            kind: r.kind,
            key: r.key,
            parts: [r.value, &[]],
            flags: r.flags,
            exptime: r.exptime,
            cas: r.cas,
            stamp: r.stamp,
            meta: r.meta,
            explicit_cas: r.explicit_cas,
        }
    }
}

/// Append the record for `spec` to `out`, at a place that gives version `natural`;
/// returns its length. (For buffers that ship or save records; nothing follows it.)
pub(crate) fn encode_into(out: &mut Vec<u8>, spec: &Spec<'_>, natural: u64) -> usize {
    let len = encoded_len(spec, natural);
    let at = out.len();
    out.resize(at + len, 0);
    // SAFETY: `out[at .. at + len]` was just made, is ours alone, and holds exactly the
    // record's length; `write` writes nothing past `room = len`.
    unsafe { write(out.as_mut_ptr().add(at), len, spec, natural) }
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
    /// `META_STALE | META_BINARY_KEY` bits (0 without).
    pub meta: u8,
    /// The explicit CAS unique, if the record has one.
    pub explicit_cas: Option<u64>,
    /// Bytes the whole record occupies.
    pub len: usize,
}

/// The version a record at offset `off` of a segment whose CAS base is `base` has unless it
/// says otherwise: every place in a segment names one unique (the engine reserves a
/// segment's worth of uniques when it opens one), so a fresh write stores no CAS at all.
#[inline]
pub(crate) fn natural_cas(base: u64, off: usize) -> u64 {
    base.wrapping_add(off as u64)
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

/// Encode the header of `spec` for a record whose place gives version `natural` into
/// `buf`; returns the header length.
fn encode_header(spec: &Spec<'_>, natural: u64, buf: &mut [u8; HDR_MAX]) -> usize {
    let klen = spec.key.len();
    let vlen = spec.parts[0].len() + spec.parts[1].len();
    let delta = spec.cas.wrapping_sub(natural);
    let mut ext = spec.meta & (META_STALE | META_BINARY_KEY);
    if spec.explicit_cas.is_some() {
        ext |= EXT_EXPLICIT_CAS;
    }
    if delta != 0 {
        ext |= EXT_CAS;
    }
    if spec.stamp != 0 {
        ext |= EXT_STAMP;
    }
    let mut state = 0;
    if spec.flags != 0 {
        state |= HAS_FLAGS;
    }
    if spec.exptime != 0 {
        state |= HAS_EXPTIME;
    }
    let mut at;
    if spec.kind == KIND_ITEM
        && ext == 0
        && (1..=SHORT_MAX_KEY).contains(&klen)
        && vlen <= SHORT_MAX_VALUE
    {
        let k = (klen - 1) as u8;
        buf[0] = state | SHORT | (k >> 1);
        buf[1] = ((k & 1) << 7) | vlen as u8;
        at = 2;
    } else {
        if spec.kind != KIND_ITEM {
            state |= TOMB;
        }
        if ext != 0 {
            state |= HAS_EXT;
        }
        buf[0] = state;
        buf[1] = klen as u8;
        at = 2;
        put_varint(buf, &mut at, vlen as u64);
    }
    if spec.flags != 0 {
        put_varint(buf, &mut at, u64::from(spec.flags));
    }
    if spec.exptime != 0 {
        for (i, b) in spec.exptime.to_le_bytes().into_iter().enumerate() {
            buf[at + i] = b;
        }
        at += 4;
    }
    if ext != 0 {
        buf[at] = ext;
        at += 1;
        if delta != 0 {
            put_varint(buf, &mut at, zigzag(delta as i64));
        }
        if spec.stamp != 0 {
            put_varint(buf, &mut at, spec.stamp);
        }
        if let Some(c) = spec.explicit_cas {
            put_varint(buf, &mut at, c);
        }
    }
    at
}

/// Bytes the record for `spec` takes at a place that gives version `natural`.
pub(crate) fn encoded_len(spec: &Spec<'_>, natural: u64) -> usize {
    let mut buf = [0u8; HDR_MAX];
    encode_header(spec, natural, &mut buf)
        + spec.key.len()
        + spec.parts[0].len()
        + spec.parts[1].len()
}

/// Write the record for `spec` at `dst`, a place that gives version `natural`, and publish
/// it; returns its length. If `room` leaves a byte after it, that byte is set to 0 before
/// the record is published: the next record's state byte, so that a scanner that goes by
/// state bytes (rather than the segment's published length) stops there, although a reused
/// segment is not cleared.
///
/// # Safety
/// `dst` must be valid for writes of `room >= encoded_len(spec, natural)` bytes, no other
/// thread may access those bytes during the call, and `spec.key.len()` must be at most 255.
pub(crate) unsafe fn write(dst: *mut u8, room: usize, spec: &Spec<'_>, natural: u64) -> usize {
    let mut hdr = [0u8; HDR_MAX];
    let hlen = encode_header(spec, natural, &mut hdr);
    let mut at = 1;
    // SAFETY: (the whole block) the caller guarantees `dst .. dst + encoded_len` is writable
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

/// The byte at `at`, if before `end`.
///
/// # Safety
/// As for [`get_varint`].
unsafe fn get_byte(p: *const u8, at: &mut usize, end: usize) -> Option<u8> {
    if *at >= end {
        return None;
    }
    // SAFETY: `*at < end`, inside the readable range.
    let b = unsafe { p.add(*at).read() };
    *at += 1;
    Some(b)
}

/// The u32 at `at` (little-endian), if it ends by `end`.
///
/// # Safety
/// As for [`get_varint`].
unsafe fn get_u32(p: *const u8, at: &mut usize, end: usize) -> Option<u32> {
    if *at + 4 > end {
        return None;
    }
    let mut b = [0u8; 4];
    // SAFETY: `at + 4 <= end`, inside the readable range.
    unsafe { std::ptr::copy_nonoverlapping(p.add(*at), b.as_mut_ptr(), 4) };
    *at += 4;
    Some(u32::from_le_bytes(b))
}

/// The client flags (varint) and expiry (u32) at `at`, each 0 when its field is absent.
///
/// # Safety
/// As for [`get_varint`].
unsafe fn flags_and_exptime(
    p: *const u8,
    at: &mut usize,
    end: usize,
    has_flags: bool,
    has_exptime: bool,
) -> Option<(u32, u32)> {
    // SAFETY: forwarded; both helpers stop at `end`.
    unsafe {
        let flags = if has_flags {
            get_varint(p, at, end, 5)? as u32
        } else {
            0
        };
        let exptime = if has_exptime { get_u32(p, at, end)? } else { 0 };
        Some((flags, exptime))
    }
}

/// The published state byte at `off`, if any.
///
/// # Safety
/// `p .. p + end` must be a live allocation.
unsafe fn state_at(p: *const u8, end: usize, off: usize) -> Option<u8> {
    if off >= end {
        return None;
    }
    // SAFETY: `off < end`, inside the allocation; the state byte is read atomically, so
    // even a scanner racing with a writer of an unpublished record reads it without a
    // data race.
    let state = unsafe { AtomicU8::from_ptr(p.add(off).cast_mut()).load(Ordering::Acquire) };
    (state & PUBLISHED != 0).then_some(state)
}

/// The key and value of a record whose header ends at `at`, and its length from `off`.
///
/// # Safety
/// As for [`read`]: `p .. p + end` live, the record's bytes unmodified for `'a`.
unsafe fn body<'a>(
    p: *const u8,
    end: usize,
    off: usize,
    at: usize,
    klen: usize,
    vlen: usize,
) -> Option<(&'a [u8], &'a [u8], usize)> {
    let total = at.checked_add(klen)?.checked_add(vlen)?;
    if total > end {
        return None;
    }
    // SAFETY: `at .. total` lies inside the allocation and belongs to this published
    // record, which the caller guarantees stays unmodified for `'a`.
    unsafe {
        Some((
            std::slice::from_raw_parts(p.add(at), klen),
            std::slice::from_raw_parts(p.add(at + klen), vlen),
            total - off,
        ))
    }
}

/// Parse the record at `base_ptr + off`; `cas_base` is its segment's CAS base (a record
/// that stores no version has [`natural_cas`]`(cas_base, off)`).
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
    let p = base_ptr;
    // SAFETY: (the whole function) every read below goes through the bounded helpers, which
    // stop at `end`, on bytes of this published record (the caller's contract).
    unsafe {
        let state = state_at(p, end, off)?;
        let mut at = off + 1;
        let (kind, klen, vlen, long) = if state & SHORT != 0 {
            let b = get_byte(p, &mut at, end)?;
            let k = ((state & SHORT_KEY_HIGH) << 1) | (b >> 7);
            (KIND_ITEM, usize::from(k) + 1, usize::from(b & 0x7f), false)
        } else {
            let klen = usize::from(get_byte(p, &mut at, end)?);
            let vlen = get_varint(p, &mut at, end, 5)? as usize;
            let kind = if state & TOMB != 0 {
                KIND_TOMBSTONE
            } else {
                KIND_ITEM
            };
            (kind, klen, vlen, true)
        };
        let (flags, exptime) = flags_and_exptime(
            p,
            &mut at,
            end,
            state & HAS_FLAGS != 0,
            state & HAS_EXPTIME != 0,
        )?;
        let mut cas = natural_cas(cas_base, off);
        let (mut stamp, mut meta, mut explicit_cas) = (0, 0, None);
        if long && state & HAS_EXT != 0 {
            let ext = get_byte(p, &mut at, end)?;
            if ext & EXT_CAS != 0 {
                let zz = get_varint(p, &mut at, end, 10)?;
                cas = cas.wrapping_add(unzigzag(zz) as u64);
            }
            if ext & EXT_STAMP != 0 {
                stamp = get_varint(p, &mut at, end, 10)?;
            }
            if ext & EXT_EXPLICIT_CAS != 0 {
                explicit_cas = Some(get_varint(p, &mut at, end, 10)?);
            }
            meta = ext & (META_STALE | META_BINARY_KEY);
        }
        let (key, value, len) = body(p, end, off, at, klen, vlen)?;
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
            len,
        })
    }
}

/// The record format of version 1 (segments of snapshot files of format 3 and earlier):
/// read only, by the loaders of such files, which write each record anew.
pub(crate) mod v1 {
    use super::{body, flags_and_exptime, get_byte, get_varint, state_at, unzigzag, Rec};
    use super::{KIND_ITEM, KIND_TOMBSTONE, META_BINARY_KEY, META_STALE};

    /// The segment header's version of this format.
    pub(crate) const SEG_VERSION: u8 = 1;
    const KIND_MASK: u8 = 0x03;
    const HAS_FLAGS: u8 = 0x04;
    const HAS_EXPTIME: u8 = 0x08;
    const HAS_STAMP: u8 = 0x10;
    const HAS_META: u8 = 0x20;
    const META_EXPLICIT_CAS: u8 = 0x04;

    /// Parse the version-1 record at `base_ptr + off` (its CAS a zigzag delta from
    /// `cas_base`, always present).
    ///
    /// # Safety
    /// As for [`super::read`].
    pub(crate) unsafe fn read<'a>(
        base_ptr: *const u8,
        end: usize,
        off: usize,
        cas_base: u64,
    ) -> Option<Rec<'a>> {
        let p = base_ptr;
        // SAFETY: (the whole function) as in `super::read`.
        unsafe {
            let state = state_at(p, end, off)?;
            let kind = match state & KIND_MASK {
                KIND_ITEM => KIND_ITEM,
                KIND_TOMBSTONE => KIND_TOMBSTONE,
                _ => return None,
            };
            let mut at = off + 1;
            let klen = usize::from(get_byte(p, &mut at, end)?);
            let vlen = get_varint(p, &mut at, end, 5)? as usize;
            let zz = get_varint(p, &mut at, end, 10)?;
            let cas = cas_base.wrapping_add(unzigzag(zz) as u64);
            let (flags, exptime) = flags_and_exptime(
                p,
                &mut at,
                end,
                state & HAS_FLAGS != 0,
                state & HAS_EXPTIME != 0,
            )?;
            let stamp = if state & HAS_STAMP != 0 {
                get_varint(p, &mut at, end, 10)?
            } else {
                0
            };
            let (mut meta, mut explicit_cas) = (0, None);
            if state & HAS_META != 0 {
                let m = get_byte(p, &mut at, end)?;
                if m & META_EXPLICIT_CAS != 0 {
                    explicit_cas = Some(get_varint(p, &mut at, end, 10)?);
                }
                meta = m & (META_STALE | META_BINARY_KEY);
            }
            let (key, value, len) = body(p, end, off, at, klen, vlen)?;
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
                len,
            })
        }
    }
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

    /// Write `spec` at offset `off` of a buffer standing for a segment with CAS base
    /// `base`, read it back, and return its length.
    fn roundtrip(spec: Spec<'_>, base: u64, off: usize) -> usize {
        let natural = natural_cas(base, off);
        let len = encoded_len(&spec, natural);
        // Old bytes, as in a reused segment.
        let mut buf = vec![0xffu8; off + len + 8];
        // SAFETY: `buf` holds `len + 8` writable bytes from `off` that only this test touches.
        let n = unsafe { write(buf.as_mut_ptr().add(off), len + 8, &spec, natural) };
        assert_eq!(n, len);
        // The next state byte is cleared: a scan by state bytes stops after the record.
        assert_eq!(buf[off + len], 0);
        assert!(buf[off + len + 1..].iter().all(|&b| b == 0xff));
        // SAFETY: `buf` is alive and unmodified while `r` is used.
        let r = unsafe { read(buf.as_ptr(), buf.len(), off, base) }.expect("parses");
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
        assert!(unsafe { read(buf.as_ptr(), buf.len(), off + len, base) }.is_none());
        len
    }

    #[test]
    fn records_roundtrip() {
        let key = [7u8; 255];
        let big = vec![1u8; 70_000];
        for (flags, exptime, base, stamp) in [
            (0, 0, 1, 0),
            (1, 1_700_000_000, 1000, 1),
            (u32::MAX, u32::MAX, u64::MAX - 10, u64::MAX),
            (12345, 7, 3, 300),
        ] {
            for off in [24, 1000] {
                for cas in [natural_cas(base, off), 5, u64::MAX, 0] {
                    for (k, p0, p1) in [
                        (&b"k"[..], &b""[..], &b""[..]),
                        (&key[..32], &[3u8; 100][..], &[4u8; 27][..]),
                        (&key[..33], &b"ab"[..], &b""[..]),
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
                                let spec = Spec {
                                    kind,
                                    key: k,
                                    parts: [p0, p1],
                                    flags,
                                    exptime,
                                    cas,
                                    stamp,
                                    meta,
                                    explicit_cas,
                                };
                                roundtrip(spec, base, off);
                            }
                        }
                    }
                }
            }
        }
    }

    /// A small fresh item (key of 1-32 bytes, value of at most 127, its version the one
    /// its place gives) takes a 2-byte header; anything else takes the long form.
    #[test]
    fn compact_headers() {
        let spec = |key: &'static [u8], value: &'static [u8], cas: u64| Spec {
            kind: KIND_ITEM,
            key,
            parts: [value, &[]],
            flags: 0,
            exptime: 0,
            cas,
            stamp: 0,
            meta: 0,
            explicit_cas: None,
        };
        let base = 1 << 40;
        let at = |off: usize| natural_cas(base, off);
        // 15-byte key, 32-byte value.
        assert_eq!(
            roundtrip(spec(&[b'k'; 15], &[b'v'; 32], at(100)), base, 100),
            49
        );
        assert_eq!(
            roundtrip(spec(&[b'k'; 32], &[b'v'; 127], at(9)), base, 9),
            161
        );
        // A longer key or value: state, key length, value length.
        assert_eq!(
            roundtrip(spec(&[b'k'; 33], &[b'v'; 32], at(9)), base, 9),
            33 + 32 + 3
        );
        assert_eq!(
            roundtrip(spec(&[b'k'; 15], &[b'v'; 128], at(9)), base, 9),
            143 + 4
        );
        // Another version (a copy that kept its CAS): the long form and a delta.
        assert_eq!(
            roundtrip(spec(&[b'k'; 15], &[b'v'; 32], at(9) - 100), base, 100),
            47 + 3 + 1 + 2
        );
        // Flags and an expiry add their fields to the short form.
        let mut s = spec(&[b'k'; 15], &[b'v'; 32], at(24));
        s.flags = 5;
        s.exptime = 1_800_000_000;
        assert_eq!(roundtrip(s, base, 24), 47 + 2 + 1 + 4);
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
        for cas in [77, 0] {
            let spec = Spec { cas, ..spec };
            let len = encoded_len(&spec, 0);
            let mut buf = vec![0u8; len];
            // SAFETY: `buf` holds exactly `len` writable bytes (no room for the next state
            // byte: none is written).
            unsafe { write(buf.as_mut_ptr(), buf.len(), &spec, 0) };
            for end in 0..len {
                // SAFETY: `buf` outlives the call; `end <= buf.len()`.
                let rec = unsafe { read(buf.as_ptr(), end, 0, 0) };
                assert!(rec.is_none(), "end {end}");
            }
            buf[0] &= !PUBLISHED;
            // SAFETY: as above.
            assert!(unsafe { read(buf.as_ptr(), len, 0, 0) }.is_none());
        }
    }

    /// Records of format 1 (which snapshot files of format 3 hold) still parse.
    #[test]
    fn version_1_records_parse() {
        // state (item, flags, exptime, stamp, meta), key length 3, value length 2, CAS delta
        // -2 (zigzag 3) from base 100, flags 9, exptime 99, stamp 5, meta stale +
        // explicit CAS 7, key, value.
        let rec = [
            0x80 | 0x01 | 0x04 | 0x08 | 0x10 | 0x20,
            3,
            2,
            3,
            9,
            99,
            0,
            0,
            0,
            5,
            0x01 | 0x04,
            7,
            b'k',
            b'e',
            b'y',
            b'v',
            b'w',
        ];
        // SAFETY: `rec` is alive and unmodified while `r` is used.
        let r = unsafe { v1::read(rec.as_ptr(), rec.len(), 0, 100) }.expect("parses");
        assert_eq!(
            (r.kind, r.key, r.value),
            (KIND_ITEM, &b"key"[..], &b"vw"[..])
        );
        assert_eq!((r.cas, r.flags, r.exptime, r.stamp), (98, 9, 99, 5));
        assert_eq!(
            (r.meta, r.explicit_cas, r.len),
            (META_STALE, Some(7), rec.len())
        );
        // A tombstone: kind 2, no value.
        let tomb = [0x80 | 0x02, 1, 0, 0, b'k'];
        // SAFETY: as above.
        let t = unsafe { v1::read(tomb.as_ptr(), tomb.len(), 0, 100) }.expect("parses");
        assert_eq!((t.kind, t.cas), (KIND_TOMBSTONE, 100));
    }

    #[test]
    fn zigzag_roundtrip() {
        for d in [0i64, 1, -1, i64::MAX, i64::MIN, 12345, -98765] {
            assert_eq!(unzigzag(zigzag(d)), d);
        }
    }
}
