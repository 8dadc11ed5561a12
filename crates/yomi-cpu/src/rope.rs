//! Rotary position embedding on host rows, NeoX ("rotate half") layout, optionally partial,
//! with the tables of [`yomi_weights::rope`].
//!
//! For a head x of `head_dim` values and rotary width `rot` (even, ≤ head_dim), with
//! a = x[0 .. rot/2], b = x[rot/2 .. rot] and angle_i = pos · inv_freq[i]:
//! a' = a·cos − b·sin, b' = b·cos + a·sin; x[rot ..] passes through.

use yomi_weights::Rope;

/// Rotates every head (of `head_dim` values) in `x` with the table from [`Rope::cos_sin`].
#[inline]
pub fn apply(rope: &Rope, x: &mut [f32], head_dim: usize, cs: &[f32]) {
    rotate(x, head_dim, rope.rot_dim, cs);
}

/// Rotates the first `rot_dim` values of every head (of `head_dim` values) in `x` by the
/// row's table `cs` = [cos (rot_dim/2) | sin (rot_dim/2)].
#[inline]
pub fn rotate(x: &mut [f32], head_dim: usize, rot_dim: usize, cs: &[f32]) {
    let half = rot_dim / 2;
    let (cos, sin) = cs.split_at(half);
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let a = head[i];
            let b = head[half + i];
            head[i] = a * cos[i] - b * sin[i];
            head[half + i] = b * cos[i] + a * sin[i];
        }
    }
}

/// [`apply`] as a method of the table, `rope.apply(x, head_dim, cs)`.
pub trait RopeApply {
    fn apply(&self, x: &mut [f32], head_dim: usize, cs: &[f32]);
}

impl RopeApply for Rope {
    #[inline]
    fn apply(&self, x: &mut [f32], head_dim: usize, cs: &[f32]) {
        apply(self, x, head_dim, cs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yomi_weights::RopeScaling;

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let r = Rope::new(10000.0, 16, &RopeScaling::None);
        let mut cs = vec![0.0; 16];
        let x0: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut x = x0.clone();
        r.cos_sin(0, &mut cs);
        r.apply(&mut x, 64, &cs);
        assert_eq!(x, x0);
        r.cos_sin(1234, &mut cs);
        r.apply(&mut x, 64, &cs);
        let n0: f32 = x0.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        assert_eq!(&x[16..], &x0[16..]);
    }
}
