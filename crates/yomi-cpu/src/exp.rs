//! e^x in f32 by a fixed polynomial, defined once in plain Rust and reproduced bit for bit on
//! 8 AVX2 and 16 AVX-512 lanes, so vector kernels (attention's softmax, SwiGLU) have a scalar twin with
//! the same bits and libm's scalar `expf` stays out of the hot loops.
//!
//! `x` is clamped to [−87, 88] (f32's normal range), `n = round_even(x · log2 e)`, `r = x − n·ln2`
//! in two steps (Cody–Waite: `LN2_HI` has few enough bits that `n · LN2_HI` is exact), then the
//! degree-6 Taylor polynomial of e^r on |r| ≤ ln2/2 (truncation ~1.2e-7) by Horner with FMAs,
//! times 2ⁿ built from the exponent bits. Relative error < 5e-7 (tested against f64).

/// Clamp of the argument: below, the result would leave f32's normal range.
pub const EXP_LO: f32 = -87.0;
/// Clamp of the argument: above, the result would overflow.
pub const EXP_HI: f32 = 88.0;
pub const LOG2E: f32 = std::f32::consts::LOG2_E;
pub const LN2_HI: f32 = 0.693_359_4;
pub const LN2_LO: f32 = -2.121_944_4e-4;
/// Taylor coefficients of e^r, highest first (Horner).
pub const EXP_POLY: [f32; 7] = [
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// e^x (see the module notes).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(EXP_LO, EXP_HI);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// [`exp`] on 8 lanes, bit for bit.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA (callers without those target features need `unsafe`).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
            _mm256_set1_ps(EXP_HI),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_POLY[0]);
        for &k in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k));
        }
        let pow = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(p, _mm256_castsi256_ps(pow))
    }

    /// [`exp`] on 16 lanes, bit for bit.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F (callers without that target feature need `unsafe`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub fn exp16(x: __m512) -> __m512 {
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(EXP_LO)),
            _mm512_set1_ps(EXP_HI),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_POLY[0]);
        for &k in &EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k));
        }
        let pow = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        _mm512_mul_ps(p, _mm512_castsi512_ps(pow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_close_to_f64() {
        let mut worst = 0.0f64;
        for i in 0..200_000 {
            let x = EXP_LO + (EXP_HI - EXP_LO) * i as f32 / 200_000.0;
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
        }
        // Degree-6 Taylor on |r| ≤ ln2/2 (truncation ~1.2e-7) plus a few f32 roundings.
        assert!(worst < 5e-7, "exp relative error {worst:e}");
        assert_eq!(exp(f32::NEG_INFINITY), exp(EXP_LO));
        assert_eq!(exp(0.0), 1.0);
    }

    /// For a test that build.rs let run (the build host had `what`): fails, rather than passing
    /// with nothing tested, where the build is reused on a CPU without it.
    #[cfg(target_arch = "x86_64")]
    fn require(what: &str, present: bool) {
        assert!(
            present,
            "this CPU lacks {what}, which the build host had: rebuild here (cargo clean -p yomi-cpu)"
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(
        not(yomi_host_avx2),
        ignore = "needs an AVX2+FMA+F16C CPU (the build host has none, see build.rs)"
    )]
    fn exp8_is_bitwise_exp() {
        require(
            "AVX2+FMA",
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
        );
        use std::arch::x86_64::*;
        let xs: Vec<f32> = (0..4096)
            .map(|i| -100.0 + 200.0 * i as f32 / 4096.0)
            .chain([0.0, -0.0, f32::NEG_INFINITY, 1e-30, -1e-30])
            .collect();
        for c in xs.chunks(8) {
            let mut v = [0.0f32; 8];
            v[..c.len()].copy_from_slice(c);
            let mut o = [0.0f32; 8];
            // SAFETY: AVX2 and FMA checked above; 8-float arrays.
            unsafe {
                _mm256_storeu_ps(o.as_mut_ptr(), x86::exp8(_mm256_loadu_ps(v.as_ptr())));
            }
            for (x, y) in v.iter().zip(&o) {
                assert_eq!(exp(*x).to_bits(), y.to_bits(), "exp8({x})");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(
        not(yomi_host_avx512f),
        ignore = "needs an AVX-512 F CPU (the build host has none, see build.rs)"
    )]
    fn exp16_is_bitwise_exp() {
        require("AVX-512 F", is_x86_feature_detected!("avx512f"));
        use std::arch::x86_64::*;
        let xs: Vec<f32> = (0..4096)
            .map(|i| -100.0 + 200.0 * i as f32 / 4096.0)
            .chain([0.0, -0.0, f32::NEG_INFINITY, 1e-30, -1e-30])
            .collect();
        for c in xs.chunks(16) {
            let mut v = [0.0f32; 16];
            v[..c.len()].copy_from_slice(c);
            let mut o = [0.0f32; 16];
            // SAFETY: AVX-512 F checked above; 16-float arrays.
            unsafe {
                _mm512_storeu_ps(o.as_mut_ptr(), x86::exp16(_mm512_loadu_ps(v.as_ptr())));
            }
            for (x, y) in v.iter().zip(&o) {
                assert_eq!(exp(*x).to_bits(), y.to_bits(), "exp16({x})");
            }
        }
    }
}
