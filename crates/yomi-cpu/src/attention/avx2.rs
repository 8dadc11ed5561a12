//! AVX2 + FMA attention kernels: the reference order of [`super::lanes`] with each 16-lane
//! vector held as two 256-bit halves (lanes 0..8 and 8..16), bit for bit (scores are in
//! [`super::tiles`]).
//!
//! The exp sum's reduction tree starts with the sum of the two halves (`l + 8`); the rest is a
//! horizontal sum of 8 lanes in the same pairing (`l + 4`: 128-bit halves, `l + 2`, `l + 1`).
//! Values run in groups of 32 floats (4 registers per parity, 8 independent FMA chains;
//! [`weighted32`] when `hd` is a multiple of 32). Other head sizes take the general masked
//! loops.
//!
//! Shapes: q is `hd` f32, every key/value row `hd` cache elements (f32, or f16 widened by
//! F16C as it is loaded); any hd (partial halves are masked).

use std::arch::x86_64::*;

use super::lanes::LANES;
use super::{Keys, KvElem};
use crate::exp::x86::exp8;

/// Mask of the valid lanes of half `h` of 16-lane chunk `c` of an `n`-vector (all-ones lanes).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn half_mask(n: usize, c: usize, h: usize) -> __m256i {
    let start = c * LANES + h * 8;
    let valid = n.saturating_sub(start).min(8) as i32;
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), idx)
}

/// 8 elements at `p`, as f32.
///
/// # Safety
/// AVX2, FMA and F16C; `p` readable for 8 elements.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn load8<E: KvElem>(p: *const E) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        if E::IS_F16 {
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
        } else {
            _mm256_loadu_ps(p.cast())
        }
    }
}

/// Half `h` of chunk `c` of `row` as f32 (zeros past its end).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load_half<E: KvElem>(row: &[E], c: usize, h: usize) -> __m256 {
    let start = c * LANES + h * 8;
    if start + 8 <= row.len() {
        // SAFETY: 8 elements at `start` are inside `row`.
        unsafe { load8(row.as_ptr().add(start)) }
    } else if start < row.len() {
        if E::IS_F16 {
            let mut part = [E::default(); 8];
            part[..row.len() - start].copy_from_slice(&row[start..]);
            // SAFETY: `part` is 8 elements.
            unsafe { load8(part.as_ptr()) }
        } else {
            // SAFETY: the mask enables only lanes start + l < row.len() (f32 elements).
            unsafe {
                _mm256_maskload_ps(row.as_ptr().add(start).cast(), half_mask(row.len(), c, h))
            }
        }
    } else {
        _mm256_setzero_ps()
    }
}

/// The reference tree of 16 lanes held as (lo, hi).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn reduce(lo: __m256, hi: __m256) -> f32 {
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
}

/// The largest of `s` (−∞ when empty).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn max_of(s: &[f32]) -> f32 {
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut m = ninf;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        // SAFETY: `c` is 8 readable f32.
        m = _mm256_max_ps(m, unsafe { _mm256_loadu_ps(c.as_ptr()) });
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` is 8 writable f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    lanes
        .iter()
        .chain(chunks.remainder())
        .fold(f32::NEG_INFINITY, |a, &x| a.max(x))
}

/// `s[k] ← exp(s[k] − max)`, returning their sum (reference order).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn exp_sum(s: &mut [f32], max: f32) -> f32 {
    let vmax = _mm256_set1_ps(max);
    let mut acc = [_mm256_setzero_ps(); 2];
    let n = s.len();
    for c in 0..n.div_ceil(LANES) {
        for (h, a) in acc.iter_mut().enumerate() {
            let start = c * LANES + h * 8;
            if start >= n {
                continue;
            }
            let m = half_mask(n, c, h);
            let e = exp8(_mm256_sub_ps(load_half(s, c, h), vmax));
            // SAFETY: the mask enables only lanes start + l < n.
            unsafe { _mm256_maskstore_ps(s.as_mut_ptr().add(start), m, e) };
            *a = _mm256_add_ps(*a, _mm256_and_ps(e, _mm256_castsi256_ps(m)));
        }
    }
    reduce(acc[0], acc[1])
}

/// [`super::lanes::weighted_part`]: the even/odd chains `acc` ([2, hd]) continued over keys
/// `k0..k1`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // v indexes the masks and both accumulator sets.
pub unsafe fn weighted_part<E: KvElem>(
    p: &[f32],
    keys: &Keys<E>,
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) {
    const GROUP: usize = 4; // 8-float registers per parity
    let hd = keys.hd;
    assert!(acc.len() == 2 * hd && k1 <= p.len() && k1 <= keys.len());
    if hd.is_multiple_of(8 * GROUP) {
        // SAFETY: AVX2 and FMA (this function's contract); the shapes were just checked.
        return unsafe { weighted32(p, keys, k0, k1, acc) };
    }
    let (even, odd) = acc.split_at_mut(hd);
    let nv = hd.div_ceil(8);
    for v0 in (0..nv).step_by(GROUP) {
        let g = (nv - v0).min(GROUP);
        // Register v covers floats 8(v0 + v)..; as (chunk, half) of the 16-lane order.
        let at = |v: usize| ((v0 + v) / 2, (v0 + v) % 2);
        let mut ch = [[_mm256_setzero_ps(); GROUP]; 2];
        for v in 0..g {
            let (c, h) = at(v);
            ch[0][v] = load_half(even, c, h);
            ch[1][v] = load_half(odd, c, h);
        }
        let step = |ch: &mut [__m256; GROUP], w: f32, r: &[E]| {
            let w = _mm256_set1_ps(w);
            for v in 0..g {
                let (c, h) = at(v);
                ch[v] = _mm256_fmadd_ps(w, load_half(r, c, h), ch[v]);
            }
        };
        let [ev, od] = &mut ch;
        let mut k = k0;
        if k % 2 == 1 && k < k1 {
            step(od, p[k], keys.row(k));
            k += 1;
        }
        while k + 2 <= k1 {
            step(ev, p[k], keys.row(k));
            step(od, p[k + 1], keys.row(k + 1));
            k += 2;
        }
        if k < k1 {
            step(ev, p[k], keys.row(k));
        }
        for v in 0..g {
            let (c, h) = at(v);
            let start = c * LANES + h * 8;
            let m = half_mask(hd, c, h);
            // SAFETY: the mask enables only lanes start + l < hd of each half of `acc`.
            unsafe {
                _mm256_maskstore_ps(even.as_mut_ptr().add(start), m, ch[0][v]);
                _mm256_maskstore_ps(odd.as_mut_ptr().add(start), m, ch[1][v]);
            }
        }
    }
}

/// `ch[v] += w · r[8v..8v + 8]` for v < 4.
///
/// # Safety
/// AVX2, FMA and F16C; `r` readable for 32 elements.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn step32<E: KvElem>(ch: &mut [__m256; 4], w: f32, r: *const E) {
    let w = _mm256_set1_ps(w);
    for (v, c) in ch.iter_mut().enumerate() {
        // SAFETY: the caller's contract.
        *c = _mm256_fmadd_ps(w, unsafe { load8(r.add(8 * v)) }, *c);
    }
}

/// [`weighted_part`] for `hd` a multiple of 32: 32 floats at a time (4 registers per parity, 8
/// independent FMA chains), committed values read straight from the cache rows, the loops of
/// fixed length so that the chains stay in registers (the general loop spilled them and
/// branched per register). Every chain adds its keys in order, as the reference does.
///
/// # Safety
/// AVX2, FMA and F16C; `acc.len() == 2·hd`, `k1 ≤ p.len()`, `k1 ≤ keys.len()`, `hd % 32 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted32<E: KvElem>(p: &[f32], keys: &Keys<E>, k0: usize, k1: usize, acc: &mut [f32]) {
    let (hd, stride) = (keys.hd, keys.stride);
    assert!(hd.is_multiple_of(32) && acc.len() == 2 * hd && k1 <= p.len() && k1 <= keys.len());
    let c1 = keys.committed.clamp(k0, k1);
    if c1 > k0 {
        assert!((c1 - 1) * stride + keys.off + hd <= keys.cache.len());
    }
    let (even, odd) = acc.split_at_mut(hd);
    for f0 in (0..hd).step_by(32) {
        // SAFETY: floats f0..f0 + 32 of each half of `acc` (f0 + 32 ≤ hd).
        let mut ch: [[__m256; 4]; 2] = unsafe {
            [
                std::array::from_fn(|v| _mm256_loadu_ps(even.as_ptr().add(f0 + 8 * v))),
                std::array::from_fn(|v| _mm256_loadu_ps(odd.as_ptr().add(f0 + 8 * v))),
            ]
        };
        // SAFETY: committed key k < c1 is `hd` floats at `off + k·stride` inside the cache
        // (asserted for the last one), so floats f0..f0 + 32 of it are readable.
        let row = |k: usize| unsafe { keys.cache.as_ptr().add(keys.off + k * stride + f0) };
        let [ev, od] = &mut ch;
        let mut k = k0;
        // SAFETY (every step32): `row(k)` for committed k, else the path key's own row.
        unsafe {
            if k % 2 == 1 && k < c1 {
                step32(od, p[k], row(k));
                k += 1;
            }
            while k + 2 <= c1 {
                if f0 == 0 {
                    keys.prefetch_ahead(k);
                    keys.prefetch_ahead(k + 1);
                }
                step32(ev, p[k], row(k));
                step32(od, p[k + 1], row(k + 1));
                k += 2;
            }
            for (k, &w) in p.iter().enumerate().take(k1).skip(k) {
                let r = if k < c1 {
                    row(k)
                } else {
                    keys.row(k)[f0..f0 + 32].as_ptr()
                };
                step32(if k % 2 == 0 { &mut *ev } else { &mut *od }, w, r);
            }
        }
        for (v, (e, o)) in ch[0].iter().zip(&ch[1]).enumerate() {
            // SAFETY: floats f0 + 8v.. of each half of `acc`, inside it.
            unsafe {
                _mm256_storeu_ps(even.as_mut_ptr().add(f0 + 8 * v), *e);
                _mm256_storeu_ps(odd.as_mut_ptr().add(f0 + 8 * v), *o);
            }
        }
    }
}
