//! incr/decr number handling, as memcached does it; shared by every engine.
//!
//! memcached (`do_add_delta`) reads the stored value with `safe_strtoull` (util.c):
//! C `strtoull(value, &end, 10)` on the item data, which is followed by "\r\n" in the item
//! and so reads like a C string that ends at a NUL or at that "\r". It accepts leading
//! white space, an optional `+` or `-`, and any number of digits; it fails on no digits, on
//! overflow (`ERANGE`), when the character after the digits is neither white space nor
//! the end of the string, and when a `-` was given and the result, read as a signed
//! 64-bit number, is negative (so "-0" is 0 but "-1" is refused).

/// C `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// memcached stores an item whose total size is over its largest slab chunk (512 KiB by
/// default) in chunks, and `do_add_delta` calls every chunked item non-numeric, whatever
/// it holds, before it compares a CAS. The total, with CAS on: a 48-byte header, the key
/// and a NUL, 4 bytes of client flags unless they are 0, the value and "\r\n", 8 bytes of
/// CAS.
const CHUNKED_ITEM: usize = 512 * 1024;

/// Whether memcached would store an item of this key, value length and client flags in
/// chunks, and so call it non-numeric before anything else (see [`CHUNKED_ITEM`]).
pub(crate) fn chunked(key_len: usize, value_len: usize, flags: u32) -> bool {
    let suffix = if flags != 0 { 4 } else { 0 };
    48 + key_len + 1 + suffix + value_len + 2 + 8 > CHUNKED_ITEM
}

/// The number in the stored value of `key`, or `None` if memcached would call it
/// non-numeric (including a value so large that memcached stores it chunked).
pub(crate) fn parse_item(key: &[u8], value: &[u8], flags: u32) -> Option<u64> {
    if chunked(key.len(), value.len(), flags) {
        return None;
    }
    parse(value)
}

/// The number in a stored value, or `None` if memcached would call it non-numeric.
pub(crate) fn parse(value: &[u8]) -> Option<u64> {
    let mut i = 0;
    while value.get(i).is_some_and(|&b| is_c_space(b)) {
        i += 1;
    }
    let neg = match value.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let start = i;
    let mut acc: Option<u64> = Some(0);
    while let Some(&b) = value.get(i) {
        if !b.is_ascii_digit() {
            break;
        }
        acc = acc
            .and_then(|a| a.checked_mul(10))
            .and_then(|a| a.checked_add(u64::from(b - b'0')));
        i += 1;
    }
    if i == start {
        return None;
    }
    let n = acc?;
    match value.get(i) {
        // End of the value ("\r" follows in memcached's item), a NUL, or white space.
        None | Some(0) => {}
        Some(&b) if is_c_space(b) => {}
        Some(_) => return None,
    }
    let n = if neg { n.wrapping_neg() } else { n };
    if neg && (n as i64) < 0 {
        return None;
    }
    Some(n)
}

/// Decimal digits of `v` in `buf`; returns the used tail.
pub(crate) fn format(v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 || i == 0 {
            break;
        }
    }
    &buf[i..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_like_strtoull() {
        let ok: &[(&[u8], u64)] = &[
            (b"0", 0),
            (b"42", 42),
            (b"007", 7),
            (b"  12", 12),
            (b"\t\n12", 12),
            (b"12 ", 12),
            (b"12 abc", 12),
            (b"12\r\n", 12),
            (b"12\0zz", 12),
            (b"+5", 5),
            (b"-0", 0),
            (b"18446744073709551615", u64::MAX),
            (b"000000000000000000000000001", 1),
            (b"-9223372036854775809", 9223372036854775807),
        ];
        for (v, n) in ok {
            assert_eq!(parse(v), Some(*n), "{:?}", String::from_utf8_lossy(v));
        }
        let bad: &[&[u8]] = &[
            b"",
            b" ",
            b"abc",
            b"12abc",
            b"0x10",
            b"-1",
            b"-5",
            b"-9223372036854775808",
            b"18446744073709551616",
            b"99999999999999999999999",
            b"+",
            b"-",
            b"+-1",
            b"- 1",
            b"1.5",
            b"\x0012",
        ];
        for v in bad {
            assert_eq!(parse(v), None, "{:?}", String::from_utf8_lossy(v));
        }
    }

    #[test]
    fn format_digits() {
        let mut b = [0u8; 20];
        assert_eq!(format(0, &mut b), b"0");
        assert_eq!(format(1234, &mut b), b"1234");
        assert_eq!(format(u64::MAX, &mut b), b"18446744073709551615");
    }
}
