//! RMSNorm variants.
//!
//! Qwen3.5's zero-centred `(1 + w)` norms are turned into plain weights at load time (the 1 is
//! added once, in f32, exactly as HF computes `1.0 + w.float()`), so one kernel serves both.

use crate::activation::silu;

/// y = x / sqrt(mean(x²) + eps) · w, for each row of length w.len().
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    debug_assert_eq!(x.len(), out.len());
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss: f32 = sum_squares(xr) / n as f32;
        let r = 1.0 / (ss + eps).sqrt();
        for ((o, xv), wv) in or.iter_mut().zip(xr).zip(w) {
            *o = xv * r * wv;
        }
    }
}

/// Σ x² in 16 interleaved partial sums (lane i adds `x[i]`, `x[i + 16]`, …, each in order),
/// then the lanes and the tail in a fixed order. One running sum was a chain of dependent
/// adds (~4 cycles per value: 0.6 µs for a 576-wide row, ~1.3 % of a verify pass on the
/// submitting thread); 16 independent lanes vectorise on any x86-64 and give the same bits on
/// every instruction set (each lane's additions are spelled out, and Rust never fuses a
/// multiply and an add).
pub fn sum_squares(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    // Pairwise: lanes i and i + 8, then i and i + 4, …
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    tail.iter().fold(acc[0], |s, v| s + v * v)
}

/// In-place variant of [`rms_norm`].
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for xr in x.chunks_exact_mut(n) {
        let ss = sum_squares(xr) / n as f32;
        let r = 1.0 / (ss + eps).sqrt();
        for (xv, wv) in xr.iter_mut().zip(w) {
            *xv = *xv * r * wv;
        }
    }
}

/// Gated RMSNorm of the GDN output, per head of w.len() values:
/// ô = o / sqrt(mean(o²) + eps) · w · silu(z).
pub fn rms_norm_gated_inplace(o: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let n = w.len();
    for (or, zr) in o.chunks_exact_mut(n).zip(z.chunks_exact(n)) {
        let ss = sum_squares(or) / n as f32;
        let r = 1.0 / (ss + eps).sqrt();
        for ((ov, zv), wv) in or.iter_mut().zip(zr).zip(w) {
            *ov = *ov * r * wv * silu(*zv);
        }
    }
}

/// x ← x / sqrt(Σx² + eps) per row of length n (the GDN q/k l2-norm, eps inside the root).
pub fn l2_norm_inplace(x: &mut [f32], n: usize, eps: f32) {
    for xr in x.chunks_exact_mut(n) {
        let ss = sum_squares(xr);
        let r = 1.0 / (ss + eps).sqrt();
        for v in xr.iter_mut() {
            *v *= r;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random row with a few large values (like a residual stream's
    /// outlier channels).
    fn row(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if i % 97 == 5 { 40.0 * u } else { u }
            })
            .collect()
    }

    /// The lane sums against an f64 sum: within the f32 summation bound, n·2⁻²⁴·Σx² (each
    /// value passes through at most n/16 + 4 + tail additions; n bounds that).
    #[test]
    fn sum_squares_is_within_the_summation_bound() {
        for n in [0, 1, 5, 15, 16, 17, 33, 64, 576, 1000, 1536, 4096] {
            let x = row(n, n as u64 + 1);
            let exact: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            let got = sum_squares(&x) as f64;
            let tol = (n.max(1) as f64) * 2f64.powi(-24) * exact + f64::MIN_POSITIVE;
            assert!(
                (got - exact).abs() <= tol,
                "n {n}: {got} vs {exact} (tol {tol})"
            );
        }
        // The tail (n mod 16) counts: a row of ones sums to n exactly.
        for n in [1, 7, 16, 23, 577] {
            assert_eq!(sum_squares(&vec![1.0; n]), n as f32, "ones, n {n}");
        }
    }

    /// RMSNorm against an f64 reference at model widths, and the in-place variant equal to it
    /// bit for bit.
    #[test]
    fn rms_norm_matches_an_f64_reference() {
        for (n, rows) in [(576, 5), (1024, 3), (64, 9)] {
            let x = row(n * rows, 7 + n as u64);
            let w = row(n, 99);
            let mut out = vec![0.0; n * rows];
            rms_norm(&x, &w, 1e-5, &mut out);
            let mut inplace = x.clone();
            rms_norm_inplace(&mut inplace, &w, 1e-5);
            assert_eq!(
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                inplace.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            for (xr, or) in x.chunks(n).zip(out.chunks(n)) {
                let ms: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
                let r = 1.0 / (ms + 1e-5).sqrt();
                for ((&xv, &wv), &o) in xr.iter().zip(&w).zip(or) {
                    let want = xv as f64 * r * wv as f64;
                    // The f32 roundings of the products and the scale, and the sum's (its worst
                    // case is n·2⁻²⁴, its typical error a random walk ~√(n/16)·2⁻²⁴): 1e-6.
                    assert!(
                        (o as f64 - want).abs() <= 1e-6 * want.abs() + 1e-30,
                        "n {n}: {o} vs {want}"
                    );
                }
            }
        }
    }
}
