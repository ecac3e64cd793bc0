//! A small, fast, seeded key hash in the style of wyhash: 8-byte words folded in with a
//! 64×64→128-bit multiply. The seed is random per engine, so colliding key sets cannot
//! be prepared offline.

const P0: u64 = 0xa076_1d64_78bd_642f;
const P1: u64 = 0xe703_7ed1_a0b4_28db;
const P2: u64 = 0x8ebc_6af0_9c88_c6e3;

#[inline]
fn mum(a: u64, b: u64) -> u64 {
    let r = (a as u128).wrapping_mul(b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

#[inline]
fn word(c: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = c.len().min(8);
    b[..n].copy_from_slice(&c[..n]);
    u64::from_le_bytes(b)
}

/// Hash `key` with `seed`.
#[inline]
pub(crate) fn hash(seed: u64, key: &[u8]) -> u64 {
    let mut h = seed ^ mum(key.len() as u64 ^ P0, P1);
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        h = mum(h ^ word(c), P1);
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        h = mum(h ^ word(rem), P2);
    }
    mum(h ^ P0, seed ^ P2)
}

/// A random seed for one engine.
pub(crate) fn random_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0x6b76_6361_6368_6521u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinguishes_lengths_and_spreads_bits() {
        let s = 12345;
        assert_ne!(hash(s, b""), hash(s, b"\0"));
        assert_ne!(hash(s, b"ab"), hash(s, b"ab\0"));
        assert_ne!(hash(s, b"12345678"), hash(s, b"12345678\0"));
        assert_ne!(hash(s, b"k"), hash(s + 1, b"k"));
        // Sequential keys spread evenly over 64 buckets by the top bits and the low bits.
        let mut hi = [0u32; 64];
        let mut lo = [0u32; 64];
        for i in 0..64_000u32 {
            let h = hash(s, format!("key:{i}").as_bytes());
            hi[(h >> 58) as usize] += 1;
            lo[(h & 63) as usize] += 1;
        }
        for b in hi.iter().chain(lo.iter()) {
            assert!((800..1200).contains(b), "{b}");
        }
    }
}
