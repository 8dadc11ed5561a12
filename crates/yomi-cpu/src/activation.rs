//! Element-wise activations (f32).
//!
//! SwiGLU, on every hidden value of every MLP, uses [`crate::exp::exp`] (16 AVX-512 or 8 AVX2
//! lanes where the CPU has them, the same bits in scalar code otherwise) rather than libm's scalar `expf`,
//! which cost a verify pass ~0.3 ms per row at SmolLM2-135M.

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// softplus with torch's linear cut-off above 20.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// One SwiGLU value: `silu(g) · u` with `silu(g) = g · 1 / (1 + exp(−g))` and the polynomial exp.
#[inline(always)]
pub fn swiglu_one(g: f32, u: f32) -> f32 {
    g * (1.0 / (1.0 + crate::exp::exp(-g))) * u
}

/// SwiGLU in place: gate[i] ← silu(gate[i]) · up[i].
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    use crate::isa_cap::{IsaLevel, allows};
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") && allows(IsaLevel::Avx512) {
        // SAFETY: the CPU has AVX-512 F (checked above).
        return unsafe { swiglu_avx512(gate, up) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && allows(IsaLevel::Avx2)
    {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { swiglu_avx2(gate, up) };
    }
    swiglu_portable(gate, up)
}

/// The scalar twin of [`swiglu`] (bit for bit).
pub fn swiglu_portable(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = swiglu_one(*g, *u);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn swiglu_avx512(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let n = gate.len().min(up.len());
    let one = _mm512_set1_ps(1.0);
    for c in 0..n.div_ceil(16) {
        let valid = (n - 16 * c).min(16);
        let m = if valid == 16 {
            0xffff
        } else {
            ((1u32 << valid) - 1) as __mmask16
        };
        // SAFETY: the mask keeps every access inside both slices (lanes 16c + l < n).
        unsafe {
            let g = _mm512_maskz_loadu_ps(m, gate.as_ptr().add(16 * c));
            let u = _mm512_maskz_loadu_ps(m, up.as_ptr().add(16 * c));
            let e = crate::exp::x86::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
            let s = _mm512_div_ps(one, _mm512_add_ps(one, e));
            let y = _mm512_mul_ps(_mm512_mul_ps(g, s), u);
            _mm512_mask_storeu_ps(gate.as_mut_ptr().add(16 * c), m, y);
        }
    }
}

/// [`swiglu`] on 8 lanes: without it an AVX2 build ran the scalar twin, whose `mul_add`s and
/// rounding became libm calls (`fmaf`, `rintf`): ~13% of a SmolLM2 verify pass on Zen 3.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let n = gate.len().min(up.len());
    let one = _mm256_set1_ps(1.0);
    let whole = n / 8 * 8;
    for c in (0..whole).step_by(8) {
        // SAFETY: lanes c..c + 8 ≤ n are inside both slices.
        unsafe {
            let g = _mm256_loadu_ps(gate.as_ptr().add(c));
            let u = _mm256_loadu_ps(up.as_ptr().add(c));
            let e = crate::exp::x86::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            let s = _mm256_div_ps(one, _mm256_add_ps(one, e));
            let y = _mm256_mul_ps(_mm256_mul_ps(g, s), u);
            _mm256_storeu_ps(gate.as_mut_ptr().add(c), y);
        }
    }
    swiglu_portable(&mut gate[whole..n], &up[whole..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_matches_f64_and_its_twin() {
        let n = 1536 * 3 + 5;
        let gate: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 2001) as f32 / 50.0 - 20.0)
            .collect();
        let up: Vec<f32> = (0..n)
            .map(|i| ((i * 104729) % 997) as f32 / 200.0 - 2.5)
            .collect();
        let (mut a, mut b) = (gate.clone(), gate.clone());
        swiglu(&mut a, &up);
        swiglu_portable(&mut b, &up);
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // The AVX2 build on its own, also where AVX-512 is what `swiglu` picks.
            let mut c = gate.clone();
            // SAFETY: AVX2 and FMA checked above.
            unsafe { swiglu_avx2(&mut c, &up) };
            for i in 0..n {
                assert_eq!(
                    c[i].to_bits(),
                    b[i].to_bits(),
                    "AVX2 and scalar differ at {i}"
                );
            }
        }
        for i in 0..n {
            assert_eq!(
                a[i].to_bits(),
                b[i].to_bits(),
                "vector and scalar differ at {i}"
            );
            let (g, u) = (gate[i] as f64, up[i] as f64);
            let want = g / (1.0 + (-g).exp()) * u;
            // A few f32 roundings plus exp's < 5e-7 relative error.
            assert!(
                (a[i] as f64 - want).abs() <= 2e-6 * want.abs() + 1e-30,
                "{i}: {} vs {want}",
                a[i]
            );
        }
    }
}
