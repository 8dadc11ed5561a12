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
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let r = 1.0 / (ss + eps).sqrt();
        for ((o, xv), wv) in or.iter_mut().zip(xr).zip(w) {
            *o = xv * r * wv;
        }
    }
}

/// In-place variant of [`rms_norm`].
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for xr in x.chunks_exact_mut(n) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
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
        let ss: f32 = or.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let r = 1.0 / (ss + eps).sqrt();
        for ((ov, zv), wv) in or.iter_mut().zip(zr).zip(w) {
            *ov = *ov * r * wv * silu(*zv);
        }
    }
}

/// x ← x / sqrt(Σx² + eps) per row of length n (the GDN q/k l2-norm, eps inside the root).
pub fn l2_norm_inplace(x: &mut [f32], n: usize, eps: f32) {
    for xr in x.chunks_exact_mut(n) {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let r = 1.0 / (ss + eps).sqrt();
        for v in xr.iter_mut() {
            *v *= r;
        }
    }
}
