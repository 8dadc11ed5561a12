//! AVX-512 attention kernels: the reference order of [`super::lanes`] with one 512-bit
//! register per 16 lanes, bit for bit (scores are in [`super::tiles`]).
//!
//! - [`exp_sum`]: the polynomial `exp` on 16 lanes, the sum in 16 lane accumulators.
//! - [`weighted_part`]: `hd` in groups of 64 values (4 registers), even and odd keys in two
//!   accumulator sets (8 independent FMA chains), continued from and stored back to memory so
//!   that several query rows can take turns over one block of values while it is in L1.
//! - [`weighted_rows`]: the same chains for up to four query rows at once over a block of
//!   committed values, one chain at a time, each value row loaded once for all of them (a lone
//!   row is load-bound).
//!
//! Shapes: q is `hd` f32, every key/value row `hd` cache elements (f32, or f16 widened as it
//! is loaded); any hd (the last 16-lane chunk is masked).

use std::arch::x86_64::*;

use super::lanes::{LANES, reduce16};
use super::{Keys, KvElem};
use crate::exp::x86::exp16;

/// Mask of the valid lanes of 16-lane chunk `c` of an `hd`-vector.
#[inline(always)]
fn chunk_mask(hd: usize, c: usize) -> __mmask16 {
    let valid = (hd - c * LANES).min(LANES);
    if valid == LANES {
        0xffff
    } else {
        ((1u32 << valid) - 1) as __mmask16
    }
}

/// The 16 elements at `p` that `m` selects, as f32 (zeros elsewhere).
///
/// # Safety
/// AVX-512 F, BW and VL; the selected elements readable (masked-off lanes are not read).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
pub(super) unsafe fn ld<E: KvElem>(m: __mmask16, p: *const E) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        if E::IS_F16 {
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast()))
        } else {
            _mm512_maskz_loadu_ps(m, p.cast())
        }
    }
}

/// Lanes `c·16..` of `row` as f32 (zeros past its end).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn load_chunk<E: KvElem>(row: &[E], c: usize) -> __m512 {
    let m = chunk_mask(row.len(), c);
    // SAFETY: the mask covers only lanes c·16 + l < row.len(); masked-off lanes are not read.
    unsafe { ld(m, row.as_ptr().add(c * LANES)) }
}

/// The largest of `s` (−∞ when empty).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn max_of(s: &[f32]) -> f32 {
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    for c in 0..s.len().div_ceil(LANES) {
        let mask = chunk_mask(s.len(), c);
        // SAFETY: masked to the lanes inside `s`; masked-off lanes keep −∞.
        let x = unsafe {
            _mm512_mask_loadu_ps(
                _mm512_set1_ps(f32::NEG_INFINITY),
                mask,
                s.as_ptr().add(c * LANES),
            )
        };
        m = _mm512_max_ps(m, x);
    }
    _mm512_reduce_max_ps(m)
}

/// `s[k] ← exp(s[k] − max)`, returning their sum (reference order).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn exp_sum(s: &mut [f32], max: f32) -> f32 {
    let vmax = _mm512_set1_ps(max);
    let mut acc = _mm512_setzero_ps();
    for c in 0..s.len().div_ceil(LANES) {
        let m = chunk_mask(s.len(), c);
        // SAFETY: masked to the lanes inside `s`.
        let x = unsafe { _mm512_maskz_loadu_ps(m, s.as_ptr().add(c * LANES)) };
        let e = exp16(_mm512_sub_ps(x, vmax));
        // SAFETY: masked to the lanes inside `s`.
        unsafe { _mm512_mask_storeu_ps(s.as_mut_ptr().add(c * LANES), m, e) };
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
    }
    let mut lanes = [0.0f32; LANES];
    // SAFETY: `lanes` is 16 writable f32.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
    reduce16(&lanes)
}

/// [`super::lanes::weighted_part`]: the even/odd chains `acc` ([2, hd]) continued over keys
/// `k0..k1`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::needless_range_loop)] // c indexes the masks and both accumulator sets.
pub unsafe fn weighted_part<E: KvElem>(
    p: &[f32],
    keys: &Keys<E>,
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) {
    const GROUP: usize = 4;
    let (hd, stride) = (keys.hd, keys.stride);
    assert!(acc.len() == 2 * hd && k1 <= p.len() && k1 <= keys.len());
    // Committed keys of the range: direct strided rows.
    let c1 = keys.committed.min(k1).max(k0);
    if c1 > k0 {
        assert!((c1 - 1) * stride + keys.off + hd <= keys.cache.len());
    }
    let nc = hd.div_ceil(LANES);
    let (even_acc, odd_acc) = acc.split_at_mut(hd);
    for c0 in (0..nc).step_by(GROUP) {
        let g = (nc - c0).min(GROUP);
        let mut mask = [0 as __mmask16; GROUP];
        for (c, m) in mask.iter_mut().enumerate().take(g) {
            *m = chunk_mask(hd, c0 + c);
        }
        let mut ch = [[_mm512_setzero_ps(); GROUP]; 2];
        for c in 0..g {
            ch[0][c] = load_chunk(even_acc, c0 + c);
            ch[1][c] = load_chunk(odd_acc, c0 + c);
        }
        // SAFETY: committed key k < c1 is `hd` floats at `off + k·stride` inside the cache
        // (asserted for the last one); masked loads read only lanes < hd.
        let row = |k: usize| unsafe { keys.cache.as_ptr().add(keys.off + k * stride) };
        let mut k = k0;
        if k % 2 == 1 && k < c1 {
            let (r, w) = (row(k), _mm512_set1_ps(p[k]));
            for c in 0..g {
                // SAFETY: see `row`.
                let v = unsafe { ld(mask[c], r.add((c0 + c) * LANES)) };
                ch[1][c] = _mm512_fmadd_ps(w, v, ch[1][c]);
            }
            k += 1;
        }
        while k + 2 <= c1 {
            if c0 == 0 {
                keys.prefetch_ahead(k);
                keys.prefetch_ahead(k + 1);
            }
            let (r0, r1) = (row(k), row(k + 1));
            let (w0, w1) = (_mm512_set1_ps(p[k]), _mm512_set1_ps(p[k + 1]));
            for c in 0..g {
                let o = (c0 + c) * LANES;
                // SAFETY: see `row`.
                let (v0, v1) = unsafe { (ld(mask[c], r0.add(o)), ld(mask[c], r1.add(o))) };
                ch[0][c] = _mm512_fmadd_ps(w0, v0, ch[0][c]);
                ch[1][c] = _mm512_fmadd_ps(w1, v1, ch[1][c]);
            }
            k += 2;
        }
        // The rest (an odd last committed key, path keys): same chains by key parity.
        for (k, &w) in p.iter().enumerate().take(k1).skip(k) {
            let (r, w) = (keys.row(k), _mm512_set1_ps(w));
            for c in 0..g {
                ch[k % 2][c] = _mm512_fmadd_ps(w, load_chunk(r, c0 + c), ch[k % 2][c]);
            }
        }
        for c in 0..g {
            let o = (c0 + c) * LANES;
            // SAFETY: masked to the lanes inside the two halves of `acc`.
            unsafe {
                _mm512_mask_storeu_ps(even_acc.as_mut_ptr().add(o), mask[c], ch[0][c]);
                _mm512_mask_storeu_ps(odd_acc.as_mut_ptr().add(o), mask[c], ch[1][c]);
            }
        }
    }
}

/// [`weighted_part`] for several query rows over committed keys `k0..k1` (`k0` even): row i's
/// weights are `scores[i·width..]`, its chains `acc[i·2hd..(i + 1)·2hd]`. Rows go in fours and
/// each chain is run on its own (the even keys into the even chain, then the odd keys into
/// the odd one): four rows' chunks of one chain fill 16 registers, a value row's four chunks
/// 4 more, and every value row loaded serves four rows. (Both chains of three rows at once
/// took 24 accumulators and 6 broadcast weights, so the compiler spilled and shuffled
/// registers in the loop: the values ran at ~57 % of the FMA rate on Zen 4.) Every row's
/// chains are exactly [`weighted_part`]'s: each chain takes its keys in the same order.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn weighted_rows<E: KvElem>(
    scores: &[f32],
    width: usize,
    keys: &Keys<E>,
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) {
    let hd = keys.hd;
    let rows = acc.len() / (2 * hd);
    assert!(acc.len() == rows * 2 * hd && k0.is_multiple_of(2) && k0 <= k1 && k1 <= keys.committed);
    assert!(rows == 0 || (rows - 1) * width + k1 <= scores.len());
    // Groups of nearly equal size (6 rows: 3 + 3, not 4 + 2: a value row loaded for two rows
    // only pays its loads twice as often).
    let groups = rows.div_ceil(ROWS_PER_GROUP);
    let mut i = 0;
    for gi in 0..groups {
        let n = (rows - i) / (groups - gi);
        let (s, a) = (&scores[i * width..], &mut acc[i * 2 * hd..]);
        // SAFETY: the CPU has AVX-512 F (this function's contract); rows i..i + n exist.
        unsafe {
            match n {
                4 => weighted_group::<4, E>(s, width, keys, k0, k1, a),
                3 => weighted_group::<3, E>(s, width, keys, k0, k1, a),
                2 => weighted_group::<2, E>(s, width, keys, k0, k1, a),
                _ => weighted_group::<1, E>(s, width, keys, k0, k1, a),
            }
        }
        i += n;
    }
}

/// Query rows per [`weighted_group`] call.
const ROWS_PER_GROUP: usize = 4;

/// [`weighted_rows`] for exactly `R` rows (R ≤ 4: 4·R accumulators, four value chunks and a
/// weight in the 32 registers).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
#[allow(clippy::needless_range_loop)] // c indexes the masks, offsets and accumulators.
unsafe fn weighted_group<const R: usize, E: KvElem>(
    scores: &[f32],
    width: usize,
    keys: &Keys<E>,
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) {
    const GROUP: usize = 4;
    let (hd, stride) = (keys.hd, keys.stride);
    assert!(acc.len() >= R * 2 * hd && (R - 1) * width + k1 <= scores.len());
    if k1 == k0 {
        return;
    }
    assert!((k1 - 1) * stride + keys.off + hd <= keys.cache.len());
    // SAFETY: committed key k < k1 is `hd` floats at `off + k·stride` inside the cache
    // (asserted for the last one); loads are masked to lanes < hd.
    let row = |k: usize| unsafe { keys.cache.as_ptr().add(keys.off + k * stride) };
    // SAFETY: r < R and k < k1, so r·width + k < scores.len() (asserted above).
    let weight = |r: usize, k: usize| unsafe { *scores.get_unchecked(r * width + k) };
    let nc = hd.div_ceil(LANES);
    for c0 in (0..nc).step_by(GROUP) {
        let g = (nc - c0).min(GROUP);
        // Chunks past hd: mask 0 at an in-row offset (nothing read, nothing stored).
        let mut mask = [0 as __mmask16; GROUP];
        let mut off = [c0 * LANES; GROUP];
        for c in 0..g {
            mask[c] = chunk_mask(hd, c0 + c);
            off[c] = (c0 + c) * LANES;
        }
        // Chain 0 takes the even keys, chain 1 the odd ones, each in key order.
        for chain in 0..2 {
            let mut ch = [[_mm512_setzero_ps(); GROUP]; R];
            for r in 0..R {
                let part = &acc[r * 2 * hd + chain * hd..][..hd];
                for c in 0..g {
                    ch[r][c] = load_chunk(part, c0 + c);
                }
            }
            let mut k = k0 + chain;
            while k < k1 {
                if c0 == 0 && chain == 0 {
                    // The odd chain reads key k + 1 right after this pass.
                    keys.prefetch_ahead(k);
                    keys.prefetch_ahead(k + 1);
                }
                let r0 = row(k);
                // SAFETY: see `row`; `off[c]` is inside the row and the mask covers lanes < hd.
                let v: [__m512; GROUP] =
                    std::array::from_fn(|c| unsafe { ld(mask[c], r0.add(off[c])) });
                for r in 0..R {
                    let w = _mm512_set1_ps(weight(r, k));
                    for c in 0..GROUP {
                        ch[r][c] = _mm512_fmadd_ps(w, v[c], ch[r][c]);
                    }
                }
                k += 2;
            }
            for r in 0..R {
                let part = &mut acc[r * 2 * hd + chain * hd..][..hd];
                for c in 0..g {
                    let o = (c0 + c) * LANES;
                    // SAFETY: masked to the lanes inside this row's chain.
                    unsafe { _mm512_mask_storeu_ps(part.as_mut_ptr().add(o), mask[c], ch[r][c]) };
                }
            }
        }
    }
}
