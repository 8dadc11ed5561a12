//! Activation quantization for the integer dot products.
//!
//! An activation row is cut into blocks and each block is stored as one or two int8 planes with
//! one f32 scale. Two precisions ([`super::Precision`]):
//!
//! - **int8** ([`PairQ8`], [`BlockQ8K`]): `d = max|x| / 127`, `q = round_ties_even(x · (1/d))`
//!   clamped to **[−127, 127]** (never −128: the AVX2 `sign_epi8` trick cannot negate −128, see
//!   crates.md §6). The per-element error is at most `d / 2`.
//! - **int8×2** ([`PairQ8x2`], [`BlockQ8Kx2`], the default): the same `q` plus a residual plane
//!   `r = round_ties_even((x·(1/d) − q) · 256)` clamped to [−127, 127], so that
//!   `x ≈ d₂ · (256·q + r)` with `d₂ = d / 256`. The block is in effect a 16-bit integer
//!   `Q = 256·q + r` (|Q| ≤ 32639) with scale `d₂`, stored as two int8 planes so the kernels keep
//!   their u8×i8 products: each weight vector is unpacked once and dotted with both planes, and
//!   `(S_q << 8) + S_r` is the integer sum against `Q`. The residual `x·(1/d) − q` is exact in
//!   f32 and lies in [−½, ½], so `r` before clamping is in [−128, 128]: the per-element error is
//!   at most `d₂ / 2 = d / 512`, except for the values whose residual rounds to ±128 (a
//!   residual beyond ±127.5/256, about 1 value in 256), which the clamp leaves within `d₂` (a
//!   ratio of 255 would avoid the clamp but costs the VNNI kernels a `(S << 8) − S` per weight
//!   vector, measured 5%). The f32 roundings of `x·(1/d)` add a relative ~2⁻²³ of x.
//!
//! Block kinds:
//! - 32-blocks for Q8_0, Q4_0 and Q4_1 weights, stored **in pairs** ([`PairQ8`], [`PairQ8x2`]):
//!   blocks 2k and 2k+1 of a row are interleaved by halves of 16 (`A[0..16], B[0..16],
//!   A[16..32], B[16..32]`), which is the order in which the kernels unpack two weight blocks into
//!   256-bit registers (for Q4_0/Q4_1 the low nibbles of two blocks are one register), so one
//!   integer dot, one conversion and one FMA serve two blocks. A row with an odd number of blocks
//!   ends in a pair whose second block is zero. Each block also keeps `sum = Σ q` (resp. `Σ Q`)
//!   and `s = d · sum` (the role of llama.cpp's Q8_1 `s`, but in f32): Q4_1's `+m` term is
//!   `m · s`, and Q4_0's `−8` offset is `−8 · d_w · s`.
//! - 256-blocks for the K-quants ([`BlockQ8K`], [`BlockQ8Kx2`]), with `bsums[j] = Σ q` over each
//!   16 values (and `rsums[j] = Σ r`): the K-quant mins and Q6_K's `−32` offset are dotted with
//!   these instead of with every element.
//!
//! Unlike llama.cpp the scale is kept in f32 (not f16), so no precision is lost there.

use super::ActRow;

/// The weight of the high plane in the int8×2 formats: `Q = X2_RATIO · q + r`.
pub const X2_RATIO: i32 = 256;

/// Position in a pair's 64-value plane of value `j` (0..32) of block `h` (0 = A, 1 = B).
#[inline(always)]
pub const fn pair_pos(h: usize, j: usize) -> usize {
    if j < 16 { 16 * h + j } else { 16 + 16 * h + j }
}

/// Two int8 32-blocks A, B: value `j` of block `h` is `ds[2h] · qs[pair_pos(h, j)]`.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct PairQ8 {
    /// `A[0..16], B[0..16], A[16..32], B[16..32]`.
    pub qs: [i8; 64],
    /// `[d_A, s_A, d_B, s_B]` with `s = d · sum` in f32 (one 128-bit load for both blocks).
    pub ds: [f32; 4],
    /// `[Σ q_A, Σ q_B]`.
    pub sum: [i32; 2],
    /// `[−32·Σ_A; 4] ++ [−32·Σ_B; 4]`: the start of the VNNI Q8_0 kernel's i32 lanes, which dot
    /// `w + 128` (see [`super::x86`]); spread over the four lanes of each block so that the
    /// lanes stay small before their conversion to f32.
    pub q8_off: [i32; 8],
    /// `[−128·Σ_A, −128·Σ_B]`: the start of the packed Q8_0 kernels' lanes (see
    /// [`super::packed`]); fits the struct's padding.
    pub off128: [i32; 2],
}

impl Default for PairQ8 {
    fn default() -> Self {
        PairQ8 {
            qs: [0; 64],
            ds: [0.0; 4],
            sum: [0; 2],
            q8_off: [0; 8],
            off128: [0; 2],
        }
    }
}

/// Two int8×2 32-blocks A, B: value `j` of block `h` is `ds[2h] · (256 · qs[p] + qr[p])` with
/// `p = pair_pos(h, j)`.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct PairQ8x2 {
    /// The high plane, `A[0..16], B[0..16], A[16..32], B[16..32]`.
    pub qs: [i8; 64],
    /// The residual plane, same order.
    pub qr: [i8; 64],
    /// `[d_A, s_A, d_B, s_B]`: `d` is the scale of `Q = 256·qs + qr` (the int8 scale
    /// `max|x| / 127` divided by 256) and `s = d · sum`.
    pub ds: [f32; 4],
    /// `[Σ Q_A, Σ Q_B]`.
    pub sum: [i32; 2],
    /// `[−32·Σ_A; 4] ++ [−32·Σ_B; 4]` (of `Q`), as in [`PairQ8`].
    pub q8_off: [i32; 8],
    /// `[−128·Σ_A, −128·Σ_B]` (of `Q`), as in [`PairQ8`].
    pub off128: [i32; 2],
}

impl Default for PairQ8x2 {
    fn default() -> Self {
        PairQ8x2 {
            qs: [0; 64],
            qr: [0; 64],
            ds: [0.0; 4],
            sum: [0; 2],
            q8_off: [0; 8],
            off128: [0; 2],
        }
    }
}

/// 256 int8 activations with their scale and per-16 sums: value `i` is `d · qs[i]`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        }
    }
}

/// 256 activations as two int8 planes: value `i` is `d · (256 · qs[i] + qr[i])`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8Kx2 {
    /// The scale of `Q = 256·qs + qr` (the int8 scale `max|x| / 127` divided by 256).
    pub d: f32,
    pub qs: [i8; 256],
    pub qr: [i8; 256],
    /// Per-16 sums of `qs`.
    pub bsums: [i16; 16],
    /// Per-16 sums of `qr`.
    pub rsums: [i16; 16],
}

impl Default for BlockQ8Kx2 {
    fn default() -> Self {
        BlockQ8Kx2 {
            d: 0.0,
            qs: [0; 256],
            qr: [0; 256],
            bsums: [0; 16],
            rsums: [0; 16],
        }
    }
}

/// A quantized activation unit of one of the four kinds (quantization, dequantization and the
/// [`ActRow`] wrapping, shared by [`quantize`] and the tests).
pub trait ActBlock: Copy + Default + Send + Sync + 'static {
    /// Values per unit (64 for the pairs, 256 for the K blocks).
    const N: usize;
    /// Values per quantization block (32 or 256): rows must be whole blocks.
    const BLOCK: usize;
    /// Quantize `x` (a multiple of [`ActBlock::BLOCK`] values, at most [`ActBlock::N`]; the
    /// rest of the unit is zero) into `self`.
    fn fill(&mut self, x: &[f32]);
    /// The values the integer kernels see, into `out` (at most [`ActBlock::N`] values).
    fn dequantize(&self, out: &mut [f32]);
    /// A row of these units as the kernels' activation argument.
    fn row(units: &[Self]) -> ActRow<'_>;
    /// Quantizes rows with a vector kernel of this CPU where this block kind has one (bit for
    /// bit [`ActBlock::fill`]); `false` when it has none.
    fn quantize_rows_fast(_x: &[f32], _cols: usize, _out: &mut [Self]) -> bool {
        false
    }
}

/// The 32-block pairs as seen by the Q8_0/Q4_0/Q4_1 kernels: value `j` of block `h` is
/// `d_h · (K · qs[p] + qr[p])` (`p = pair_pos(h, j)`) with `K = 256` and `qr` present for
/// [`PairQ8x2`], `K = 1` and no `qr` for [`PairQ8`].
pub trait Act32: ActBlock {
    /// `[d_A, s_A, d_B, s_B]`.
    fn ds(&self) -> &[f32; 4];
    /// `[Σ_A, Σ_B]` of the integers `K · qs + qr`.
    fn sum(&self) -> [i32; 2];
    /// `[−32·Σ_A; 4] ++ [−32·Σ_B; 4]`.
    fn q8_off(&self) -> &[i32; 8];
    /// `[−128·Σ_A, −128·Σ_B]`.
    fn off128(&self) -> &[i32; 2];
    fn qs(&self) -> &[i8; 64];
    fn qr(&self) -> Option<&[i8; 64]>;
}

/// The 256-value blocks as seen by the K-quant kernels (see [`Act32`]).
pub trait Act256: ActBlock {
    fn d(&self) -> f32;
    fn qs(&self) -> &[i8; 256];
    fn bsums(&self) -> &[i16; 16];
    /// The residual plane and its per-16 sums.
    fn qr(&self) -> Option<(&[i8; 256], &[i16; 16])>;
}

/// 1.5 · 2²³: adding and subtracting it rounds an f32 of magnitude < 2²² to the nearest
/// integer, ties to even, in the default rounding mode. Unlike `round_ties_even` it needs no
/// SSE4.1 `roundps` (baseline x86-64 would call libm per element), so it vectorises everywhere.
const ROUND_MAGIC: f32 = 12_582_912.0;

#[inline(always)]
fn round_magic(v: f32) -> f32 {
    (v + ROUND_MAGIC) - ROUND_MAGIC
}

/// `(d, 1/d)` of a block: `d = max|x| / 127` (`1/d = 0` for an all-zero block).
#[inline(always)]
fn block_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// The int8 plane of a block: returns d.
#[inline(always)]
fn quantize_block(x: &[f32], qs: &mut [i8]) -> f32 {
    let (d, id) = block_scale(x);
    for (q, v) in qs.iter_mut().zip(x) {
        // |v·id| ≤ 127 (+ rounding), far below 2²², so the magic rounding is exact. The clamp
        // keeps −128 out; a NaN (from an infinite input) becomes 0.
        *q = round_magic(v * id).clamp(-127.0, 127.0) as i8;
    }
    d
}

/// The int8 plane and the residual plane of a block: returns `d / 256`, the scale of
/// `256·qs + qr`.
#[inline(always)]
fn quantize_block_x2(x: &[f32], qs: &mut [i8], qr: &mut [i8]) -> f32 {
    let (d, id) = block_scale(x);
    for ((q, r), v) in qs.iter_mut().zip(qr.iter_mut()).zip(x) {
        let v = v * id;
        let hi = round_magic(v).clamp(-127.0, 127.0);
        // `v − hi` is exact (Sterbenz: |v − hi| ≤ ½ and hi is the integer nearest v) and in
        // [−½, ½]; `·256` is exact too, so `lo` is the residual rounded once, in [−128, 128]
        // before the clamp (see the module header). A NaN becomes 0 in both planes.
        let lo = round_magic((v - hi) * X2_RATIO as f32).clamp(-127.0, 127.0);
        *q = hi as i8;
        *r = lo as i8;
    }
    d / X2_RATIO as f32
}

/// Copies block `h` of a pair (32 values in value order) into its two halves of the plane.
#[inline(always)]
fn scatter_pair(h: usize, src: &[i8; 32], plane: &mut [i8; 64]) {
    plane[16 * h..16 * h + 16].copy_from_slice(&src[..16]);
    plane[32 + 16 * h..32 + 16 * h + 16].copy_from_slice(&src[16..]);
}

/// Block `h` of a pair's plane in value order.
#[inline(always)]
pub fn gather_pair(h: usize, plane: &[i8; 64]) -> [i8; 32] {
    let mut out = [0i8; 32];
    out[..16].copy_from_slice(&plane[16 * h..16 * h + 16]);
    out[16..].copy_from_slice(&plane[32 + 16 * h..32 + 16 * h + 16]);
    out
}

impl ActBlock for PairQ8 {
    const N: usize = 64;
    const BLOCK: usize = 32;
    #[inline(always)]
    fn fill(&mut self, x: &[f32]) {
        *self = PairQ8::default();
        for (h, xs) in x.chunks_exact(32).enumerate() {
            let mut q = [0i8; 32];
            let d = quantize_block(xs, &mut q);
            let sum: i32 = q.iter().map(|&v| v as i32).sum();
            scatter_pair(h, &q, &mut self.qs);
            self.ds[2 * h] = d;
            self.ds[2 * h + 1] = d * sum as f32;
            self.sum[h] = sum;
            self.q8_off[4 * h..4 * h + 4].fill(-32 * sum);
            self.off128[h] = -128 * sum;
        }
    }
    fn dequantize(&self, out: &mut [f32]) {
        for (h, o) in out.chunks_mut(32).enumerate() {
            for (o, q) in o.iter_mut().zip(gather_pair(h, &self.qs)) {
                *o = self.ds[2 * h] * q as f32;
            }
        }
    }
    fn row(units: &[Self]) -> ActRow<'_> {
        ActRow::Q8(units)
    }
    fn quantize_rows_fast(x: &[f32], cols: usize, out: &mut [Self]) -> bool {
        quantize_pairs_fast(x, cols, out)
    }
}

impl ActBlock for PairQ8x2 {
    const N: usize = 64;
    const BLOCK: usize = 32;
    #[inline(always)]
    fn fill(&mut self, x: &[f32]) {
        *self = PairQ8x2::default();
        for (h, xs) in x.chunks_exact(32).enumerate() {
            let (mut q, mut r) = ([0i8; 32], [0i8; 32]);
            let d = quantize_block_x2(xs, &mut q, &mut r);
            let sum: i32 = q
                .iter()
                .zip(&r)
                .map(|(&q, &r)| X2_RATIO * q as i32 + r as i32)
                .sum();
            scatter_pair(h, &q, &mut self.qs);
            scatter_pair(h, &r, &mut self.qr);
            self.ds[2 * h] = d;
            self.ds[2 * h + 1] = d * sum as f32;
            self.sum[h] = sum;
            self.q8_off[4 * h..4 * h + 4].fill(-32 * sum);
            self.off128[h] = -128 * sum;
        }
    }
    fn dequantize(&self, out: &mut [f32]) {
        for (h, o) in out.chunks_mut(32).enumerate() {
            let (q, r) = (gather_pair(h, &self.qs), gather_pair(h, &self.qr));
            for (o, (q, r)) in o.iter_mut().zip(q.into_iter().zip(r)) {
                *o = self.ds[2 * h] * (X2_RATIO * q as i32 + r as i32) as f32;
            }
        }
    }
    fn row(units: &[Self]) -> ActRow<'_> {
        ActRow::Q8x2(units)
    }
    fn quantize_rows_fast(x: &[f32], cols: usize, out: &mut [Self]) -> bool {
        quantize_pairs_fast(x, cols, out)
    }
}

#[inline(always)]
fn sums16(q: &[i8; 256], out: &mut [i16; 16]) {
    for (s, q) in out.iter_mut().zip(q.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i16).sum();
    }
}

impl ActBlock for BlockQ8K {
    const N: usize = 256;
    const BLOCK: usize = 256;
    #[inline(always)]
    fn fill(&mut self, x: &[f32]) {
        self.d = quantize_block(x, &mut self.qs);
        sums16(&self.qs, &mut self.bsums);
    }
    fn dequantize(&self, out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = self.d * q as f32;
        }
    }
    fn row(units: &[Self]) -> ActRow<'_> {
        ActRow::Q8K(units)
    }
}

impl ActBlock for BlockQ8Kx2 {
    const N: usize = 256;
    const BLOCK: usize = 256;
    #[inline(always)]
    fn fill(&mut self, x: &[f32]) {
        self.d = quantize_block_x2(x, &mut self.qs, &mut self.qr);
        sums16(&self.qs, &mut self.bsums);
        sums16(&self.qr, &mut self.rsums);
    }
    fn dequantize(&self, out: &mut [f32]) {
        for (o, (&q, &r)) in out.iter_mut().zip(self.qs.iter().zip(&self.qr)) {
            *o = self.d * (X2_RATIO * q as i32 + r as i32) as f32;
        }
    }
    fn row(units: &[Self]) -> ActRow<'_> {
        ActRow::Q8Kx2(units)
    }
}

impl Act32 for PairQ8 {
    #[inline(always)]
    fn ds(&self) -> &[f32; 4] {
        &self.ds
    }
    #[inline(always)]
    fn sum(&self) -> [i32; 2] {
        self.sum
    }
    #[inline(always)]
    fn q8_off(&self) -> &[i32; 8] {
        &self.q8_off
    }
    #[inline(always)]
    fn off128(&self) -> &[i32; 2] {
        &self.off128
    }
    #[inline(always)]
    fn qs(&self) -> &[i8; 64] {
        &self.qs
    }
    #[inline(always)]
    fn qr(&self) -> Option<&[i8; 64]> {
        None
    }
}

impl Act32 for PairQ8x2 {
    #[inline(always)]
    fn ds(&self) -> &[f32; 4] {
        &self.ds
    }
    #[inline(always)]
    fn sum(&self) -> [i32; 2] {
        self.sum
    }
    #[inline(always)]
    fn q8_off(&self) -> &[i32; 8] {
        &self.q8_off
    }
    #[inline(always)]
    fn off128(&self) -> &[i32; 2] {
        &self.off128
    }
    #[inline(always)]
    fn qs(&self) -> &[i8; 64] {
        &self.qs
    }
    #[inline(always)]
    fn qr(&self) -> Option<&[i8; 64]> {
        Some(&self.qr)
    }
}

impl Act256 for BlockQ8K {
    #[inline(always)]
    fn d(&self) -> f32 {
        self.d
    }
    #[inline(always)]
    fn qs(&self) -> &[i8; 256] {
        &self.qs
    }
    #[inline(always)]
    fn bsums(&self) -> &[i16; 16] {
        &self.bsums
    }
    #[inline(always)]
    fn qr(&self) -> Option<(&[i8; 256], &[i16; 16])> {
        None
    }
}

impl Act256 for BlockQ8Kx2 {
    #[inline(always)]
    fn d(&self) -> f32 {
        self.d
    }
    #[inline(always)]
    fn qs(&self) -> &[i8; 256] {
        &self.qs
    }
    #[inline(always)]
    fn bsums(&self) -> &[i16; 16] {
        &self.bsums
    }
    #[inline(always)]
    fn qr(&self) -> Option<(&[i8; 256], &[i16; 16])> {
        Some((&self.qr, &self.rsums))
    }
}

/// The AVX-512 pair quantizer where the CPU has it ([`ActBlock::quantize_rows_fast`] of both
/// pair kinds); `false` elsewhere.
#[cfg(target_arch = "x86_64")]
fn quantize_pairs_fast<P: super::act_x86::PairOut>(x: &[f32], cols: usize, out: &mut [P]) -> bool {
    use crate::isa_cap::{IsaLevel, allows};
    if super::act_x86::available() && allows(IsaLevel::Avx512) {
        // SAFETY: the CPU has AVX-512 F (checked above).
        unsafe { super::act_x86::quantize_pairs(x, cols, out) };
        return true;
    }
    if super::act_x86::available_avx2() && allows(IsaLevel::Avx2) {
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { super::act_x86::quantize_pairs_avx2(x, cols, out) };
        return true;
    }
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn quantize_pairs_fast<P>(_: &[f32], _: usize, _: &mut [P]) -> bool {
    false
}

/// Units per row of `cols` values.
#[inline]
pub const fn units_per_row<A: ActBlock>(cols: usize) -> usize {
    cols.div_ceil(A::N)
}

#[inline(always)]
fn quantize_body<A: ActBlock>(x: &[f32], cols: usize, out: &mut [A]) {
    let per_row = units_per_row::<A>(cols);
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(per_row)) {
        for (b, xs) in or.iter_mut().zip(xr.chunks(A::N)) {
            b.fill(xs);
        }
    }
}

// The same scalar code compiled with AVX2 enabled, so LLVM vectorises it 8 wide. Every step is
// a single IEEE operation (no FMA contraction in Rust), so both builds give identical blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_avx2<A: ActBlock>(x: &[f32], cols: usize, out: &mut [A]) {
    quantize_body(x, cols, out)
}

pub(crate) fn check_rows<A: ActBlock>(x: &[f32], cols: usize) {
    assert!(
        cols.is_multiple_of(A::BLOCK) && cols > 0 && x.len().is_multiple_of(cols),
        "quantize: {} values are not rows of {cols} (a positive multiple of {})",
        x.len(),
        A::BLOCK
    );
}

/// Quantize the rows of `x` (each `cols` values, a multiple of `A::BLOCK`) into `out`, resized
/// to [`units_per_row`] units per row (a row never shares a unit with the next).
///
/// Several rows go over the pool, [`PARALLEL_MIN_VALUES`] or more values at a time (rows are
/// independent, so the bits are the same); on one thread the other threads wait meanwhile.
/// Measured on a Zen 4 VM (2 threads, ~17 ns per 32-value block): 16-row passes −1.5 %,
/// 2–8-row passes unchanged.
pub fn quantize_rows<A: ActBlock>(x: &[f32], cols: usize, out: &mut Vec<A>) {
    check_rows::<A>(x, cols);
    let rows = x.len() / cols;
    let per_row = units_per_row::<A>(cols);
    out.resize(rows * per_row, A::default());
    if rows < 2 || x.len() < 2 * PARALLEL_MIN_VALUES {
        return quantize_into(x, cols, out);
    }
    let rows_per_item = PARALLEL_MIN_VALUES.div_ceil(cols);
    crate::pool::for_each_chunk_mut(out, per_row * rows_per_item, 1, |c, o| {
        let r0 = c * rows_per_item;
        quantize_into(&x[r0 * cols..(r0 + o.len() / per_row) * cols], cols, o)
    });
}

/// Values of one pool item of [`quantize_rows`] at least (about half a µs of work, on the
/// order of a fork and join of the spinning pool).
pub const PARALLEL_MIN_VALUES: usize = 1024;

/// [`quantize_rows`] into units already sized, on this thread.
pub(crate) fn quantize_into<A: ActBlock>(x: &[f32], cols: usize, out: &mut [A]) {
    if A::quantize_rows_fast(x, cols, out) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked above).
        return unsafe { quantize_avx2(x, cols, out) };
    }
    quantize_body(x, cols, out)
}

/// [`quantize_rows`] of one row.
pub fn quantize<A: ActBlock>(x: &[f32], out: &mut Vec<A>) {
    quantize_rows(x, x.len().max(1), out)
}

/// Portable build of [`quantize`] (tests compare the two).
pub fn quantize_portable<A: ActBlock>(x: &[f32], out: &mut Vec<A>) {
    let cols = x.len().max(1);
    check_rows::<A>(x, cols);
    out.resize(units_per_row::<A>(cols), A::default());
    quantize_body(x, cols, out)
}

/// Dequantized values of a row of units (tests: the activations the integer path really sees);
/// `cols` values.
pub fn dequantize_act<A: ActBlock>(a: &[A], cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; cols];
    for (b, o) in a.iter().zip(out.chunks_mut(A::N)) {
        b.dequantize(o);
    }
    out
}

// The pair layouts keep their sizes (the `off128` field fills padding): one cache-line multiple.
const _: () = assert!(std::mem::size_of::<PairQ8>() == 128);
const _: () = assert!(std::mem::size_of::<PairQ8x2>() == 192);
