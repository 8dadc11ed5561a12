//! AVX2 + FMA attention kernels: the reference order of [`super::lanes`] with each 16-lane
//! vector held as two 256-bit halves (lanes 0..8 and 8..16), bit for bit.
//!
//! The first step of the reference tree (`l + 8`) is the sum of the two halves; the rest is a
//! horizontal sum of 8 lanes in the same pairing (`l + 4`: 128-bit halves, `l + 2`, `l + 1`).
//! Keys are reduced one at a time (AVX2 has no cheap 16-register transpose), values run in
//! groups of 32 floats (4 registers per parity, 8 independent FMA chains).
//!
//! Shapes: q and every key/value row are `hd` f32 (any hd; partial halves are masked).

use std::arch::x86_64::*;

use super::Keys;
use super::lanes::LANES;
use crate::exp::x86::exp8;

/// Mask of the valid lanes of half `h` of 16-lane chunk `c` of an `n`-vector (all-ones lanes).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn half_mask(n: usize, c: usize, h: usize) -> __m256i {
    let start = c * LANES + h * 8;
    let valid = n.saturating_sub(start).min(8) as i32;
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), idx)
}

/// Half `h` of chunk `c` of `row` (zeros past its end).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn load_half(row: &[f32], c: usize, h: usize) -> __m256 {
    let start = c * LANES + h * 8;
    if start + 8 <= row.len() {
        // SAFETY: 8 floats at `start` are inside `row`.
        unsafe { _mm256_loadu_ps(row.as_ptr().add(start)) }
    } else if start < row.len() {
        // SAFETY: the mask enables only lanes start + l < row.len().
        unsafe { _mm256_maskload_ps(row.as_ptr().add(start), half_mask(row.len(), c, h)) }
    } else {
        _mm256_setzero_ps()
    }
}

/// The reference tree of 16 lanes held as (lo, hi).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn reduce(lo: __m256, hi: __m256) -> f32 {
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
}

/// q · k in the reference order, before the scale.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn dot(q: &[f32], k: &[f32]) -> f32 {
    let mut lo = _mm256_mul_ps(load_half(q, 0, 0), load_half(k, 0, 0));
    let mut hi = _mm256_mul_ps(load_half(q, 0, 1), load_half(k, 0, 1));
    for c in 1..q.len().div_ceil(LANES) {
        lo = _mm256_fmadd_ps(load_half(q, c, 0), load_half(k, c, 0), lo);
        hi = _mm256_fmadd_ps(load_half(q, c, 1), load_half(k, c, 1), hi);
    }
    reduce(lo, hi)
}

/// `out[i·width + k] = (qs[i] · key(k)) · scale` for the committed keys `k0..k1` (multiples
/// of 16), [`scores16`] row by row.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores_rows(
    qs: &[&[f32]],
    keys: &Keys,
    k0: usize,
    k1: usize,
    scale: f32,
    width: usize,
    out: &mut [f32],
) {
    for (i, q) in qs.iter().enumerate() {
        for k in (k0..k1).step_by(LANES) {
            // SAFETY: AVX2 and FMA (this function's contract).
            unsafe { scores16(q, keys, k, scale, &mut out[i * width + k..]) };
        }
    }
}

/// `out[j] = (q · key(k0 + j)) · scale` for j < 16.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores16(q: &[f32], keys: &Keys, k0: usize, scale: f32, out: &mut [f32]) {
    for (j, o) in out[..LANES].iter_mut().enumerate() {
        *o = dot(q, keys.row(k0 + j)) * scale;
    }
}

/// `(q · k) · scale`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn score1(q: &[f32], k: &[f32], scale: f32) -> f32 {
    dot(q, k) * scale
}

/// The largest of `s` (−∞ when empty).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
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
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
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
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // v indexes the masks and both accumulator sets.
pub unsafe fn weighted_part(p: &[f32], keys: &Keys, k0: usize, k1: usize, acc: &mut [f32]) {
    const GROUP: usize = 4; // 8-float registers per parity
    let hd = keys.hd;
    assert!(acc.len() == 2 * hd && k1 <= p.len() && k1 <= keys.len());
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
        let step = |ch: &mut [__m256; GROUP], w: f32, r: &[f32]| {
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
