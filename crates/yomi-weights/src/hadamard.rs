//! The block-32 randomized Hadamard rotation of yomi's quantized formats.
//!
//! A linear layer `y = W x` is unchanged when both sides turn by the same orthogonal `R`:
//! `y = (W Rᵀ)(R x)`. yomi's `R` is block diagonal over the input features: for each block of
//! 32 columns, `R = H · D` with `D = diag(s)` a stored vector of random signs `s ∈ {−1, +1}`
//! and `H` the 32 × 32 Walsh–Hadamard matrix scaled by 1/√32 (orthogonal and symmetric). The
//! quantizer stores the rows of `W Rᵀ` (row `w` becomes `R w`, the same map as an activation
//! row), whose values are spread evenly across each block: an outlier column of `W` turns
//! into 32 values of 1/√32 its size, which a 4-bit grid rounds far better. At run time the
//! backend rotates the activations (`x ← R x`) before the quantized product.
//!
//! The signs come from a seed (SplitMix64, one bit per column, in column order) and are stored
//! with the weights, so a file never depends on this generator; every matrix of one model uses
//! a prefix of the same sign stream, so matrices that share an input (q, k, v; gate, up) share
//! its rotation and the backend rotates that input once.

use std::sync::Arc;

/// Columns per rotation block.
pub const ROTATION_BLOCK: usize = 32;

/// 1/√32, the scale that makes the 32-point Walsh–Hadamard transform orthogonal.
const INV_SQRT_32: f32 = 0.176_776_7;

/// The rotation of one matrix's input side: one sign per input column (a multiple of 32).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rotation {
    signs: Arc<[i8]>,
}

impl Rotation {
    /// Signs as stored (each −1 or +1); `None` unless the length is a positive multiple of 32
    /// and every value is ±1.
    pub fn from_signs(signs: &[i8]) -> Option<Rotation> {
        let ok = !signs.is_empty()
            && signs.len().is_multiple_of(ROTATION_BLOCK)
            && signs.iter().all(|&s| s == 1 || s == -1);
        ok.then(|| Rotation {
            signs: signs.into(),
        })
    }

    /// The first `width` signs of the stream of `seed` (SplitMix64 outputs, low bit first: a
    /// set bit is −1). `width` must be a positive multiple of 32.
    pub fn from_seed(seed: u64, width: usize) -> Rotation {
        assert!(
            width > 0 && width.is_multiple_of(ROTATION_BLOCK),
            "rotation width {width} is not a positive multiple of {ROTATION_BLOCK}"
        );
        let mut state = seed;
        let mut signs = Vec::with_capacity(width);
        while signs.len() < width {
            let bits = splitmix64(&mut state);
            for b in 0..64.min(width - signs.len()) {
                signs.push(if bits >> b & 1 == 1 { -1 } else { 1 });
            }
        }
        Rotation {
            signs: signs.into(),
        }
    }

    /// Input columns this rotation covers.
    pub fn width(&self) -> usize {
        self.signs.len()
    }

    pub fn signs(&self) -> &[i8] {
        &self.signs
    }

    /// Whether two rotations are the same map (the same shared signs, or equal ones).
    pub fn same_as(&self, other: &Rotation) -> bool {
        Arc::ptr_eq(&self.signs, &other.signs) || self.signs == other.signs
    }

    /// `x ← R x` for every row of `x` ([rows, width] row-major).
    pub fn apply(&self, x: &mut [f32]) {
        let w = self.width();
        assert!(
            x.len().is_multiple_of(w),
            "rotation of width {w}: input length {} is not whole rows",
            x.len()
        );
        for row in x.chunks_exact_mut(w) {
            for (block, signs) in row
                .chunks_exact_mut(ROTATION_BLOCK)
                .zip(self.signs.chunks_exact(ROTATION_BLOCK))
            {
                let block: &mut [f32; ROTATION_BLOCK] = block.try_into().expect("block of 32");
                for (v, &s) in block.iter_mut().zip(signs) {
                    *v *= s as f32;
                }
                hadamard32(block);
            }
        }
    }

    /// `x ← Rᵀ x` (undoes [`Rotation::apply`]: `H` is symmetric, so `Rᵀ = D H`).
    pub fn apply_inverse(&self, x: &mut [f32]) {
        let w = self.width();
        assert!(
            x.len().is_multiple_of(w),
            "rotation: input is not whole rows"
        );
        for row in x.chunks_exact_mut(w) {
            for (block, signs) in row
                .chunks_exact_mut(ROTATION_BLOCK)
                .zip(self.signs.chunks_exact(ROTATION_BLOCK))
            {
                let block: &mut [f32; ROTATION_BLOCK] = block.try_into().expect("block of 32");
                hadamard32(block);
                for (v, &s) in block.iter_mut().zip(signs) {
                    *v *= s as f32;
                }
            }
        }
    }
}

/// The orthogonal 32-point Walsh–Hadamard transform in place: five butterfly stages
/// (`a, b ← a + b, a − b` at distances 1, 2, 4, 8, 16), then the scale 1/√32. Natural
/// (Sylvester) order: `H[i][j] = (−1)^popcount(i & j) / √32`.
#[inline]
pub fn hadamard32(v: &mut [f32; ROTATION_BLOCK]) {
    let mut h = 1;
    while h < ROTATION_BLOCK {
        for i in (0..ROTATION_BLOCK).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (v[j], v[j + h]);
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
        h *= 2;
    }
    for x in v.iter_mut() {
        *x *= INV_SQRT_32;
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transform against the matrix it stands for, entry by entry (f64 reference).
    #[test]
    fn hadamard32_is_the_sylvester_matrix() {
        let x: Vec<f32> = (0..32)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let mut v: [f32; 32] = x.clone().try_into().unwrap();
        hadamard32(&mut v);
        for (i, &got) in v.iter().enumerate() {
            let want: f64 = (0..32)
                .map(|j| {
                    let sign = if (i & j).count_ones() % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    };
                    sign * x[j] as f64
                })
                .sum::<f64>()
                / 32f64.sqrt();
            // Five f32 additions of values ≤ 1.5 in size, then one scale: a few ulps of 10.
            assert!((got as f64 - want).abs() < 2e-6, "row {i}: {got} vs {want}");
        }
    }

    /// Orthogonality where it matters: a rotated weight row dotted with a rotated input equals
    /// the plain dot product, and the inverse gives the input back.
    #[test]
    fn rotation_preserves_dot_products_and_inverts() {
        let r = Rotation::from_seed(7, 96);
        assert_eq!(r.width(), 96);
        assert!(r.signs().contains(&-1) && r.signs().contains(&1));
        let w: Vec<f32> = (0..96)
            .map(|i| ((i * 29 % 17) as f32 - 8.0) / 7.0)
            .collect();
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 13 % 23) as f32 - 11.0) / 5.0)
            .collect();
        let plain: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        let (mut rw, mut rx) = (w.clone(), x.clone());
        r.apply(&mut rw);
        r.apply(&mut rx);
        let rotated: f64 = rw.iter().zip(&rx).map(|(a, b)| *a as f64 * *b as f64).sum();
        // |plain| ~ 10; rounding of the two 96-value transforms adds ~1e-6 relative.
        assert!((plain - rotated).abs() < 1e-4, "{plain} vs {rotated}");
        r.apply_inverse(&mut rx);
        for (a, b) in rx.iter().zip(&x) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    /// A prefix of the sign stream is the shorter rotation: matrices of different widths cut
    /// from one seed agree where they overlap. Signs are balanced (a stream of 4096 has close
    /// to half of each).
    #[test]
    fn seeded_signs_are_a_shared_stream() {
        let long = Rotation::from_seed(3, 4096);
        let short = Rotation::from_seed(3, 96);
        assert_eq!(&long.signs()[..96], short.signs());
        let neg = long.signs().iter().filter(|&&s| s == -1).count();
        assert!((1800..2300).contains(&neg), "{neg} of 4096 signs are −1");
        assert_ne!(Rotation::from_seed(4, 96), short);
    }

    #[test]
    fn stored_signs_are_checked() {
        assert!(Rotation::from_signs(&[1; 32]).is_some());
        assert!(Rotation::from_signs(&[1; 31]).is_none());
        assert!(Rotation::from_signs(&[]).is_none());
        let mut bad = [1i8; 32];
        bad[5] = 0;
        assert!(Rotation::from_signs(&bad).is_none());
    }
}
