//! A keyed pseudo-random permutation of `[0, n)` for any `n ≥ 1`, in O(1) memory and O(1)
//! expected time per index: a Feistel network over the smallest power-of-two domain that
//! holds `n`, with cycle-walking to stay inside `[0, n)`.
//!
//! The domain has `b = ⌈log2 n⌉` bits, so it is less than `2n` and cycle-walking takes fewer
//! than two rounds of the network on average. When `b` is odd the two halves differ by one
//! bit; each round maps `(hi, lo)` to `(lo, hi ⊕ F(lo))`, which swaps the halves' widths and
//! is a bijection whatever they are. Every round permutes the domain, so walking the cycle
//! from a point in `[0, n)` until it lands in `[0, n)` again is a bijection of `[0, n)`.

use crate::hash::mix2;

/// Rounds of the network: four make a pseudo-random permutation (Luby–Rackoff); more mix
/// small domains better, at a few nanoseconds each.
const ROUNDS: usize = 6;

/// A permutation of `[0, n)` chosen by a key.
#[derive(Clone, Debug)]
pub struct Feistel {
    n: u64,
    bits: u32,
    keys: [u64; ROUNDS],
}

impl Feistel {
    /// The permutation of `[0, n)` for `key`. `n` must be at least 1.
    pub fn new(n: u64, key: u64) -> Feistel {
        assert!(n >= 1, "a permutation needs a non-empty domain");
        let bits = 64 - (n - 1).leading_zeros();
        let mut keys = [0u64; ROUNDS];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = mix2(key, i as u64 + 1);
        }
        Feistel { n, bits, keys }
    }

    /// Domain size.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Always false: the domain has at least one element.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The image of `x` (`x < n`).
    #[inline]
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = x;
        loop {
            y = self.network(y);
            if y < self.n {
                return y;
            }
        }
    }

    #[inline]
    fn network(&self, mut x: u64) -> u64 {
        let mut hi_bits = self.bits / 2;
        let mut lo_bits = self.bits - hi_bits;
        for key in &self.keys {
            let hi = x >> lo_bits;
            let lo = x & mask(lo_bits);
            let f = round_function(lo, *key, hi_bits);
            x = (lo << hi_bits) | (hi ^ f);
            std::mem::swap(&mut hi_bits, &mut lo_bits);
        }
        x
    }
}

/// `bits` pseudo-random bits from `lo` and the round key: the top bits of one multiply,
/// which depend on every bit of `lo ^ key`. Cheap, because the rounds form a serial chain.
#[inline]
fn round_function(lo: u64, key: u64, bits: u32) -> u64 {
    if bits == 0 {
        return 0;
    }
    (lo ^ key).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)
}

#[inline]
fn mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_bijection(n: u64, key: u64) {
        let p = Feistel::new(n, key);
        let mut seen = vec![false; n as usize];
        for x in 0..n {
            let y = p.apply(x);
            assert!(y < n, "n={n} key={key}: {x} -> {y} out of range");
            assert!(!seen[y as usize], "n={n} key={key}: {y} hit twice");
            seen[y as usize] = true;
        }
    }

    #[test]
    fn bijection_for_many_sizes() {
        let mut sizes = vec![
            1u64, 2, 3, 4, 5, 7, 8, 9, 31, 100, 1000, 65_521, 65_537, 1_000_003,
        ];
        for k in [4u32, 10, 16, 20] {
            sizes.extend([(1 << k) - 1, 1 << k, (1 << k) + 1]);
        }
        for n in sizes {
            for key in [0u64, 1, 0xdead_beef] {
                assert_bijection(n, key);
            }
        }
    }

    #[test]
    fn keys_give_different_permutations() {
        let a: Vec<u64> = (0..1000).map(|x| Feistel::new(1000, 1).apply(x)).collect();
        let b: Vec<u64> = (0..1000).map(|x| Feistel::new(1000, 2).apply(x)).collect();
        assert_ne!(a, b);
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
    }
}
