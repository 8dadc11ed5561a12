//! The 16-lane arithmetic of CPU attention, defined once in plain Rust (the reference order
//! every instruction set reproduces bit for bit).
//!
//! Speculative decoding is lossless only if a query row's attention output does not depend on
//! how many other rows share the pass, so every value below is a fixed function of the row's
//! own inputs, in a fixed order:
//!
//! - **Score** of a query q and a key k (`hd` values): one chain `s ← fma(q[d], k[d], s)` over
//!   `d = 0..hd` from +0, times `scale` (the kernels run it for 16 keys at once on the key
//!   tiles of [`super::tiles`]).
//! - **Weights**: `p = exp(s − max)` with [`crate::exp::exp`] (a degree-6 polynomial after a
//!   Cody–Waite reduction, arguments clamped to [−87, 88]); their sum in 16 lane accumulators
//!   (key index k into lane `k mod 16`, in order) reduced by the same tree.
//! - **Output**: for each of the `hd` values two chains over the keys, even and odd key index
//!   (`fma(p_k, v_k[d], acc)` from zero, key after key), then `(even + odd) · (1 / sum)`.
//!
//! Keys are indexed by their place in the row's visible list (committed rows, then the row's
//! path in the tree by depth), which is the same list a plain decode of that path sees; so the
//! tree pass and the plain pass compute the same bits.

/// Lanes of the reference order (one 512-bit register of f32).
pub const LANES: usize = 16;

pub use crate::exp::exp;

use super::KvElem;

/// The tree sum of 16 lanes: `l + 8`, then `l + 4`, `l + 2`, `l + 1`.
#[inline(always)]
pub fn reduce16(p: &[f32; LANES]) -> f32 {
    let mut s8 = [0.0f32; 8];
    for l in 0..8 {
        s8[l] = p[l] + p[l + 8];
    }
    let mut s4 = [0.0f32; 4];
    for l in 0..4 {
        s4[l] = s8[l] + s8[l + 4];
    }
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// q · k in the reference order (see the module notes), before the scale (k widened to f32).
#[inline(always)]
pub fn dot<E: KvElem>(q: &[f32], k: &[E]) -> f32 {
    debug_assert_eq!(q.len(), k.len());
    q.iter()
        .zip(k)
        .fold(0.0f32, |s, (&a, &b)| a.mul_add(b.to_f32(), s))
}

/// The largest of `s` (max is exact, so any order gives the same value).
pub fn max_of(s: &[f32]) -> f32 {
    s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// `s[k] ← exp(s[k] − max)` and their sum, in the reference order.
pub fn exp_sum(s: &mut [f32], max: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    for chunk in s.chunks_mut(LANES) {
        for (l, a) in acc.iter_mut().enumerate() {
            let v = match chunk.get_mut(l) {
                Some(x) => {
                    *x = exp(*x - max);
                    *x
                }
                None => 0.0,
            };
            *a += v;
        }
    }
    reduce16(&acc)
}

/// Continues the two output chains of every value over keys `k0..k1`: `acc[0..hd]` (even key
/// index) and `acc[hd..2hd]` (odd) get `fma(p_k, v_k[d], ·)`, key after key. The chains start
/// at zero; a row's keys may come in several parts (shared committed blocks, then its path).
pub fn weighted_part<'a, E: KvElem>(
    p: &[f32],
    v: impl Fn(usize) -> &'a [E],
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) {
    let hd = acc.len() / 2;
    for (k, &w) in p.iter().enumerate().take(k1).skip(k0) {
        let row = v(k);
        for (a, &x) in acc[(k % 2) * hd..][..hd].iter_mut().zip(row) {
            *a = w.mul_add(x.to_f32(), *a);
        }
    }
}

/// `out[d] = (even[d] + odd[d]) · inv`, the end of [`weighted_part`]'s chains.
pub fn finish(acc: &[f32], inv: f32, out: &mut [f32]) {
    let hd = out.len();
    for (d, o) in out.iter_mut().enumerate() {
        *o = (acc[d] + acc[hd + d]) * inv;
    }
}
