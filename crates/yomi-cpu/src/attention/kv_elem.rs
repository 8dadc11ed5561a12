//! The element type of a KV cache: f32, or f16 for half the bytes per cached token.
//!
//! At batch one a decode step reads every cached K/V row of every attention layer once; past a
//! few hundred tokens of context that is a large share of the bytes a step streams (SmolLM2-135M
//! at 4k tokens: 189 MB of f32 K/V against 98 MB of Q4_1 weights). An f16 cache halves it.
//!
//! The kernels widen f16 to f32 as they load (exact: every f16 value is an f32 value) and then
//! run the f32 arithmetic of [`super::lanes`] unchanged, so attention over an f16 cache computes
//! bit for bit what it computes over an f32 cache holding the widened values. The only loss is
//! the write, [`KvElem::from_f32`]: round to nearest even, a relative error ≤ 2⁻¹¹ per value
//! (normal range), the same rounding in software and in the F16C instructions.

use half::f16;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// A KV cache element (f32 or f16).
pub trait KvElem:
    Copy + Default + Send + Sync + std::fmt::Debug + 'static + sealed::Sealed
{
    /// f16 (the kernels choose their loads on it at compile time).
    const IS_F16: bool;
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
    /// The nearest element to `x` (round to nearest even).
    fn from_f32(x: f32) -> Self;
    /// `dst[i] = from_f32(src[i])`.
    fn store_f32(src: &[f32], dst: &mut [Self]);
    /// `dst[i] = src[i].to_f32()`.
    fn load_f32(src: &[Self], dst: &mut [f32]);
}

impl KvElem for f32 {
    const IS_F16: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    fn store_f32(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
    fn load_f32(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl KvElem for f16 {
    const IS_F16: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn store_f32(src: &[f32], dst: &mut [Self]) {
        // `half` converts with F16C where the CPU has it, else in software: the same bits.
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
    }
    fn load_f32(src: &[Self], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_conversions_equal_the_scalar_ones() {
        // Normal, subnormal, overflowing, tie-breaking and special values.
        let xs: Vec<f32> = [
            0.0, -0.0, 1.0, -1.5, 0.1, 2.71, 65504.0, 65520.0, 1e6, 6e-8, 1e-5, 2049.0, 2051.0,
        ]
        .into_iter()
        .chain((0..1000).map(|i| ((i * 7919) % 2000) as f32 / 37.0 - 27.0))
        .chain([f32::INFINITY, f32::NEG_INFINITY])
        .collect();
        let mut h = vec![f16::ZERO; xs.len()];
        f16::store_f32(&xs, &mut h);
        let mut back = vec![0.0f32; xs.len()];
        f16::load_f32(&h, &mut back);
        for ((x, h), b) in xs.iter().zip(&h).zip(&back) {
            assert_eq!(h.to_bits(), f16::from_f32(*x).to_bits(), "{x}");
            assert_eq!(b.to_bits(), KvElem::to_f32(*h).to_bits(), "{x}");
            // Round to nearest: within half an f16 ulp (2^-11 relative) in the normal range.
            if x.abs() < 65504.0 && x.abs() > 6.2e-5 {
                assert!((b - x).abs() <= x.abs() * 2f32.powi(-11), "{x} → {b}");
            }
        }
    }
}
