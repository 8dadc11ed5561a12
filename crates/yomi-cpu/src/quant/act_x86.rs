//! AVX-512 and AVX2 activation quantization of 32-block pairs ([`PairQ8`], [`PairQ8x2`]), bit
//! for bit the portable [`super::act`] code (which LLVM leaves scalar: its saturating `as i8`
//! casts do not vectorise, and a verify pass spent ~15% of its time there).
//!
//! Per 32-block, as in `act`: `amax = max |x|`, `d = amax / 127`, `id = 1 / d` (0 when d = 0),
//! `v = x · id`, `q = clamp(round_even(v), ±127)`; int8×2 adds `r = clamp(round_even((v − q) ·
//! 256), ±127)` and `d₂ = d / 256`. `round_even` is `vrndscaleps` (AVX2: `vroundps`) to nearest, which equals the
//! portable `(v + 1.5·2²³) − 1.5·2²³` for |v| < 2²², and both clamp to ±127 beyond. The sums are
//! exact integers. Shapes: one row of `cols` values (a multiple of 32) into
//! `cols.div_ceil(64)` pairs; a row with an odd number of blocks ends in a pair whose second
//! block is zero.

use std::arch::x86_64::*;

use super::act::{PairQ8, PairQ8x2, X2_RATIO};

/// Whether this CPU runs [`quantize_pairs`] (cached).
pub fn available() -> bool {
    static FLAG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FLAG.get_or_init(|| is_x86_feature_detected!("avx512f"))
}

/// Whether this CPU runs [`quantize_pairs_avx2`] (cached).
pub fn available_avx2() -> bool {
    static FLAG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FLAG.get_or_init(|| is_x86_feature_detected!("avx2"))
}

/// A pair kind the AVX-512 quantizer writes.
pub trait PairOut: Sized {
    /// Block `h` (0 or 1) of the pair from its integer planes `q` (and `r`), scale `d` (the
    /// int8 scale `amax / 127`) and integer sum.
    fn set_block(&mut self, h: usize, q: [__m128i; 2], r: Option<[__m128i; 2]>, d: f32, sum: i32);
    /// Whether the residual plane is kept.
    const X2: bool;
    fn zero(&mut self);
    /// The whole pair at once: the planes as 64-byte vectors in pair order (`A[0..16],
    /// B[0..16], A[16..32], B[16..32]`), each block's int8 scale `d` (`amax / 127`) and integer
    /// sum (a missing second block: zeros).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F.
    unsafe fn set_pair(&mut self, q: __m512i, r: __m512i, d: [f32; 2], sum: [i32; 2]);
}

fn store16(dst: &mut [i8], v: __m128i) {
    assert!(dst.len() >= 16);
    // SAFETY: `dst` has at least 16 writable bytes; unaligned store.
    unsafe { _mm_storeu_si128(dst.as_mut_ptr() as *mut __m128i, v) };
}

impl PairOut for PairQ8 {
    const X2: bool = false;
    fn zero(&mut self) {
        *self = PairQ8::default();
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn set_pair(&mut self, q: __m512i, _: __m512i, d: [f32; 2], sum: [i32; 2]) {
        // SAFETY: `qs` is 64 writable bytes; unaligned store (AVX-512 F: the caller's
        // contract).
        unsafe { _mm512_storeu_si512(self.qs.as_mut_ptr().cast(), q) };
        for h in 0..2 {
            self.ds[2 * h] = d[h];
            self.ds[2 * h + 1] = d[h] * sum[h] as f32;
            self.sum[h] = sum[h];
            self.q8_off[4 * h..4 * h + 4].fill(-32 * sum[h]);
            self.off128[h] = -128 * sum[h];
        }
    }
    fn set_block(&mut self, h: usize, q: [__m128i; 2], _: Option<[__m128i; 2]>, d: f32, sum: i32) {
        store16(&mut self.qs[16 * h..], q[0]);
        store16(&mut self.qs[32 + 16 * h..], q[1]);
        self.ds[2 * h] = d;
        self.ds[2 * h + 1] = d * sum as f32;
        self.sum[h] = sum;
        self.q8_off[4 * h..4 * h + 4].fill(-32 * sum);
        self.off128[h] = -128 * sum;
    }
}

impl PairOut for PairQ8x2 {
    const X2: bool = true;
    fn zero(&mut self) {
        *self = PairQ8x2::default();
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn set_pair(&mut self, q: __m512i, r: __m512i, d: [f32; 2], sum: [i32; 2]) {
        // SAFETY: `qs` and `qr` are 64 writable bytes each; unaligned stores (AVX-512 F: the
        // caller's contract).
        unsafe {
            _mm512_storeu_si512(self.qs.as_mut_ptr().cast(), q);
            _mm512_storeu_si512(self.qr.as_mut_ptr().cast(), r);
        }
        for h in 0..2 {
            let d = d[h] / X2_RATIO as f32;
            self.ds[2 * h] = d;
            self.ds[2 * h + 1] = d * sum[h] as f32;
            self.sum[h] = sum[h];
            self.q8_off[4 * h..4 * h + 4].fill(-32 * sum[h]);
            self.off128[h] = -128 * sum[h];
        }
    }
    fn set_block(&mut self, h: usize, q: [__m128i; 2], r: Option<[__m128i; 2]>, d: f32, sum: i32) {
        store16(&mut self.qs[16 * h..], q[0]);
        store16(&mut self.qs[32 + 16 * h..], q[1]);
        if let Some(r) = r {
            store16(&mut self.qr[16 * h..], r[0]);
            store16(&mut self.qr[32 + 16 * h..], r[1]);
        }
        let d = d / X2_RATIO as f32;
        self.ds[2 * h] = d;
        self.ds[2 * h + 1] = d * sum as f32;
        self.sum[h] = sum;
        self.q8_off[4 * h..4 * h + 4].fill(-32 * sum);
        self.off128[h] = -128 * sum;
    }
}

/// `clamp(round_even(v), ±127)`.
#[target_feature(enable = "avx512f")]
#[inline]
fn round_clamp(v: __m512) -> __m512 {
    let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
    _mm512_min_ps(
        _mm512_max_ps(r, _mm512_set1_ps(-127.0)),
        _mm512_set1_ps(127.0),
    )
}

/// Quantizes the rows of `x` (`cols` values each, a multiple of 32) into `out`
/// (`cols.div_ceil(64)` pairs per row).
///
/// # Safety
/// The CPU must have AVX-512 F ([`available`]).
#[target_feature(enable = "avx512f")]
pub unsafe fn quantize_pairs<P: PairOut>(x: &[f32], cols: usize, out: &mut [P]) {
    let per_row = cols.div_ceil(64);
    assert!(cols.is_multiple_of(32) && x.len() / cols * per_row == out.len());
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(per_row)) {
        for (pair, xs) in or.iter_mut().zip(xr.chunks(64)) {
            // The planes' 16-byte pieces in pair order (A[0..16], B[0..16], A[16..32],
            // B[16..32]), put together in registers and stored as one 64-byte vector per
            // plane. Stored one by one, LLVM folds each narrowing into a `vpmovdb` to memory,
            // which is slow on Zen 4: `perf` put over half of this function's samples in a
            // verify pass right after those stores, and the function went from 5.1 % to 3.4 %
            // of an 8-row pass without them.
            let mut qp = [_mm_setzero_si128(); 4];
            let mut rp = [_mm_setzero_si128(); 4];
            let mut d = [0.0f32; 2];
            let mut sums = [0i32; 2];
            for (h, blk) in xs.chunks_exact(32).enumerate() {
                // SAFETY: `blk` is 32 readable f32; unaligned loads.
                let (a, b) = unsafe {
                    (
                        _mm512_loadu_ps(blk.as_ptr()),
                        _mm512_loadu_ps(blk.as_ptr().add(16)),
                    )
                };
                let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
                d[h] = amax / 127.0;
                let id = if d[h] != 0.0 { 1.0 / d[h] } else { 0.0 };
                let vid = _mm512_set1_ps(id);
                let mut sum = _mm512_setzero_si512();
                for (half, x) in [a, b].into_iter().enumerate() {
                    let v = _mm512_mul_ps(x, vid);
                    let hi = round_clamp(v);
                    let q = _mm512_cvtps_epi32(hi);
                    qp[2 * half + h] = _mm512_cvtepi32_epi8(q);
                    if P::X2 {
                        let lo = round_clamp(_mm512_mul_ps(
                            _mm512_sub_ps(v, hi),
                            _mm512_set1_ps(X2_RATIO as f32),
                        ));
                        let r = _mm512_cvtps_epi32(lo);
                        rp[2 * half + h] = _mm512_cvtepi32_epi8(r);
                        sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_slli_epi32::<8>(q), r));
                    } else {
                        sum = _mm512_add_epi32(sum, q);
                    }
                }
                sums[h] = _mm512_reduce_add_epi32(sum);
            }
            let join = |p: [__m128i; 4]| {
                let z = _mm512_castsi128_si512(p[0]);
                let z = _mm512_inserti32x4::<1>(z, p[1]);
                let z = _mm512_inserti32x4::<2>(z, p[2]);
                _mm512_inserti32x4::<3>(z, p[3])
            };
            // SAFETY: the CPU has AVX-512 F (this function's contract).
            unsafe { pair.set_pair(join(qp), join(rp), d, sums) };
        }
    }
}

/// `clamp(round_even(v), ±127)` on 8 lanes (the same operations as [`round_clamp`]).
#[target_feature(enable = "avx2")]
#[inline]
fn round_clamp8(v: __m256) -> __m256 {
    let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
    _mm256_min_ps(
        _mm256_max_ps(r, _mm256_set1_ps(-127.0)),
        _mm256_set1_ps(127.0),
    )
}

/// Four vectors of 8 i32 in [−127, 127] (values 0..32 of a block, in order) as two 16-byte
/// halves of i8.
#[target_feature(enable = "avx2")]
#[inline]
fn narrow32(v: [__m256i; 4]) -> [__m128i; 2] {
    // The packs work per 128-bit lane: bytes end up as 4-value runs [v0 v1 v2 v3 | v0 v1 v2
    // v3] (low then high halves of each vector); the dword permutation puts them in order.
    let w = _mm256_packs_epi16(
        _mm256_packs_epi32(v[0], v[1]),
        _mm256_packs_epi32(v[2], v[3]),
    );
    let o = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    [_mm256_castsi256_si128(o), _mm256_extracti128_si256::<1>(o)]
}

/// The sum of 8 i32 lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn hsum8(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// [`quantize_pairs`] on 8 lanes (for CPUs with AVX2 but not AVX-512), bit for bit.
///
/// # Safety
/// The CPU must have AVX2 ([`available_avx2`]).
#[target_feature(enable = "avx2")]
pub unsafe fn quantize_pairs_avx2<P: PairOut>(x: &[f32], cols: usize, out: &mut [P]) {
    let per_row = cols.div_ceil(64);
    assert!(cols.is_multiple_of(32) && x.len() / cols * per_row == out.len());
    let sign = _mm256_set1_ps(-0.0);
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(per_row)) {
        for (pair, xs) in or.iter_mut().zip(xr.chunks(64)) {
            pair.zero();
            for (h, blk) in xs.chunks_exact(32).enumerate() {
                // SAFETY: `blk` is 32 readable f32; unaligned loads.
                let v: [__m256; 4] =
                    std::array::from_fn(|i| unsafe { _mm256_loadu_ps(blk.as_ptr().add(8 * i)) });
                let m = v
                    .iter()
                    .map(|&x| _mm256_andnot_ps(sign, x))
                    .reduce(|a, b| _mm256_max_ps(a, b))
                    .unwrap_or(_mm256_setzero_ps());
                let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                let m = _mm_max_ss(m, _mm_movehdup_ps(m));
                let amax = _mm_cvtss_f32(m);
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let vid = _mm256_set1_ps(id);
                let mut q = [_mm256_setzero_si256(); 4];
                let mut r = [_mm256_setzero_si256(); 4];
                let mut sum = _mm256_setzero_si256();
                for i in 0..4 {
                    let v = _mm256_mul_ps(v[i], vid);
                    let hi = round_clamp8(v);
                    q[i] = _mm256_cvtps_epi32(hi);
                    if P::X2 {
                        let lo = round_clamp8(_mm256_mul_ps(
                            _mm256_sub_ps(v, hi),
                            _mm256_set1_ps(X2_RATIO as f32),
                        ));
                        r[i] = _mm256_cvtps_epi32(lo);
                        sum = _mm256_add_epi32(
                            sum,
                            _mm256_add_epi32(_mm256_slli_epi32::<8>(q[i]), r[i]),
                        );
                    } else {
                        sum = _mm256_add_epi32(sum, q[i]);
                    }
                }
                let rb = P::X2.then(|| narrow32(r));
                pair.set_block(h, narrow32(q), rb, d, hsum8(sum));
            }
        }
    }
}
