//! incr/decr parsing, as memcached's `safe_strtoull` judges a stored value.

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The number in a stored value, or `None` if memcached would call it non-numeric: leading
/// white space, an optional sign, at least one digit, no overflow, then the end, a NUL or
/// white space; a `-` is accepted only when the negated result is non-negative as i64.
pub(crate) fn parse(value: &[u8]) -> Option<u64> {
    let mut i = value.iter().take_while(|&&b| is_c_space(b)).count();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_cases() {
        assert_eq!(parse(b" 12 x"), Some(12));
        assert_eq!(parse(b"-0"), Some(0));
        assert_eq!(parse(b"-1"), None);
        assert_eq!(parse(b"12x"), None);
        assert_eq!(parse(b"0000000000000000000000000042"), Some(42));
        assert_eq!(parse(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse(b"18446744073709551616"), None);
        assert_eq!(parse(b"-9223372036854775809"), Some(9223372036854775807));
        assert_eq!(parse(b"5\0x"), Some(5));
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"+"), None);
    }
}
