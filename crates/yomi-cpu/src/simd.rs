//! Small SIMD building blocks with runtime dispatch: f32 dot products and bf16 → f32 rows.
//! The AVX2+FMA paths are chosen once per process from CPU feature detection (and
//! [`crate::isa_cap`]).

use std::sync::OnceLock;

fn has_avx2_fma() -> bool {
    static FLAG: OnceLock<bool> = OnceLock::new();
    *FLAG.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && crate::isa_cap::allows(crate::isa_cap::IsaLevel::Avx2)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Σ a[i]·b[i] in f32 with several independent accumulators.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

/// Portable twin of [`dot`]: 8 lanes of partial sums, which LLVM vectorises for SSE2.
pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut acc2 = _mm256_setzero_ps();
    let mut acc3 = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: every load reads 8 floats at i + c with i + c + 8 ≤ n.
    unsafe {
        while i + 32 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                acc1,
            );
            acc2 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 16)),
                _mm256_loadu_ps(pb.add(i + 16)),
                acc2,
            );
            acc3 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 24)),
                _mm256_loadu_ps(pb.add(i + 24)),
                acc3,
            );
            i += 32;
        }
        while i + 8 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            i += 8;
        }
    }
    let acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    let hi = _mm256_extractf128_ps(acc, 1);
    let lo = _mm256_castps256_ps128(acc);
    let s4 = _mm_add_ps(hi, lo);
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    let mut s = _mm_cvtss_f32(s1);
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

/// y[i] += a · x[i].
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// bf16 bit patterns → f32 (exact: bf16 is the top half of an f32).
#[inline]
pub fn bf16_to_f32(src: &[u16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits((s as u32) << 16);
    }
}

/// f16 bit patterns → f32 (F16C when the CPU has it, through `half`).
#[inline]
pub fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let src: &[half::f16] = bytemuck_cast_u16_f16(src);
    src.convert_to_f32_slice(dst);
}

fn bytemuck_cast_u16_f16(s: &[u16]) -> &[half::f16] {
    // SAFETY: half::f16 is a repr(transparent) u16.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const half::f16, s.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_reference() {
        for n in [0usize, 1, 7, 8, 31, 32, 33, 100, 4096, 4099] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let b: Vec<f32> = (0..n)
                .map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5)
                .collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let tol = 1e-5 * (n as f64).sqrt().max(1.0);
            assert!((dot(&a, &b) as f64 - want).abs() < tol, "n={n}");
            assert!((dot_portable(&a, &b) as f64 - want).abs() < tol, "n={n}");
        }
    }

    #[test]
    fn half_conversions_are_exact() {
        let vals = [0.0f32, 1.0, -2.5, 3.140625, 65504.0, 1e-3];
        let bf: Vec<u16> = vals
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_bits())
            .collect();
        let hf: Vec<u16> = vals
            .iter()
            .map(|v| half::f16::from_f32(*v).to_bits())
            .collect();
        let mut o = vec![0.0; vals.len()];
        bf16_to_f32(&bf, &mut o);
        for (x, v) in o.iter().zip(&vals) {
            assert_eq!(*x, half::bf16::from_f32(*v).to_f32());
        }
        f16_to_f32(&hf, &mut o);
        for (x, v) in o.iter().zip(&vals) {
            assert_eq!(*x, half::f16::from_f32(*v).to_f32());
        }
    }
}
