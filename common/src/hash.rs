//! Keyed 64-bit mixing: the one source of pseudo-randomness for samplers (and, later,
//! placement). Pure functions, so every index is reproducible from (seed, epoch, position).

/// SplitMix64's finalizer: a bijective avalanche mix of one word.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Mixes two words into one; not symmetric.
#[inline]
pub fn mix2(a: u64, b: u64) -> u64 {
    mix64(mix64(a) ^ b.rotate_left(29) ^ 0x2545_f491_4f6c_dd1d)
}

/// Maps a uniform 64-bit value onto `[0, n)` without division (Lemire's multiply-shift); the
/// bias is below n / 2^64.
#[inline]
pub fn reduce(x: u64, n: u64) -> u64 {
    ((x as u128 * n as u128) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_stays_in_range() {
        for n in [1u64, 2, 3, 1000, u64::MAX] {
            for x in [0u64, 1, u64::MAX, mix64(5)] {
                assert!(reduce(x, n) < n);
            }
        }
        assert_ne!(mix2(1, 2), mix2(2, 1));
    }
}
