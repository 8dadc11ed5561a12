//! Parity tests of the GGML block kernels.
//!
//! - SIMD vs scalar per-block integer sums, bit for bit (random bytes, extremes, proptest);
//! - integer dot vs the f64 dot of dequantized weights and the *original* activations, within
//!   the bound that activation rounding implies (derived in `act_bound`);
//! - `linear` on quantized weights vs `linear_reference` at real shapes;
//! - T rows in one call (multi-row tiles) vs T one-row calls, **bit for bit** (lossless
//!   speculative decoding verifies T rows and must reproduce plain decoding exactly).
//!
//! Every check that involves activations runs at both [`Precision`]s (int8 and int8×2).

use std::sync::Arc;

use super::*;
use crate::linear::{linear, linear_reference};
use proptest::prelude::*;
use yomi_weights::quant::{QuantData, QuantType, dequantize_row, quantize_row};
use yomi_weights::{Matrix, WeightData};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 16
    }
    /// Uniform in [−0.5, 0.5).
    fn f(&mut self) -> f32 {
        (self.next() >> 24) as f32 / (1u64 << 24) as f32 - 0.5
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn f16b(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// Random bytes for `nb` blocks of `ty`, with the f16 scale fields replaced by sane values (so
/// float results are finite) but every quant / sub-scale byte left random (all bit patterns,
/// including Q8_0 −128 and Q6_K scale −128).
fn random_blocks(ty: QuantType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    let ts = ty.type_size();
    let mut b = rng.bytes(nb * ts);
    for blk in b.chunks_exact_mut(ts) {
        let d = 0.001 + 0.01 * (rng.f() + 0.5);
        let m = 0.02 * rng.f();
        match ty {
            QuantType::Q8_0 | QuantType::Q4_0 => blk[0..2].copy_from_slice(&f16b(d)),
            QuantType::Q4_1 | QuantType::Q4_K | QuantType::Q5_K => {
                blk[0..2].copy_from_slice(&f16b(d));
                blk[2..4].copy_from_slice(&f16b(m.abs()));
            }
            QuantType::Q6_K => blk[208..210].copy_from_slice(&f16b(d)),
        }
    }
    b
}

/// Activation rows with a spread of magnitudes (and exact zeros) per block.
fn random_acts(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let scale = [1.0f32, 0.01, 30.0, 0.5][(i / 64) % 4];
            if rng.next().is_multiple_of(17) {
                0.0
            } else {
                rng.f() * scale
            }
        })
        .collect()
}

/// The activation step of `p`: `d = max|x_block| / step(p)`.
fn step(p: Precision) -> f64 {
    match p {
        Precision::Int8 => 127.0,
        Precision::Int8x2 => 127.0 * 256.0,
    }
}

/// Worst-case rounding error per element in units of the step: ½ (+ 1e-4 for the f32 rounding
/// of `x · (1/d)`), and for int8×2 a whole step where the residual rounds to ±128 and is
/// clamped to ±127 (see `act`).
fn err_steps(p: Precision) -> f64 {
    match p {
        Precision::Int8 => 0.5001,
        Precision::Int8x2 => 1.0001,
    }
}

/// Error bound of the integer dot against the f64 dot of the dequantized weights `w` with the
/// original activations `x`.
///
/// Each activation is replaced by `Q·d` with `d = max|x_block| / 127` for int8 and
/// `max|x_block| / (127·256)` for int8×2 (block = 32 or 256), and |x − Q·d| ≤ d/2 (+ a relative
/// 1e-4 of d for the rounding of `x · (1/d)` before the integer rounding; for int8×2 ≤ d where
/// the residual is clamped, and a few 2⁻²⁴ of |x| from the f32 steps that build the residual),
/// so the integer path is off by at most `Σ_i |w_i| · err_steps · d(block(i))` plus what the
/// next term covers. On top, f32 arithmetic (scale products, i32→f32 of sums up to 1.3e8, the
/// accumulation over ≤ 64 blocks) costs < 64·2⁻²³ relative to `Σ |w_i| (|x_i| + d)`, bounded
/// here by 2e-5 of it.
fn act_bound(w: &[f32], x: &[f32], block: usize, p: Precision) -> f64 {
    let mut bound = 0.0f64;
    for (wb, xb) in w.chunks(block).zip(x.chunks(block)) {
        let d = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / step(p);
        for (wi, xi) in wb.iter().zip(xb) {
            let aw = wi.abs() as f64;
            bound += aw * err_steps(p) * d + 2e-5 * aw * (xi.abs() as f64 + d);
        }
    }
    bound + 1e-30
}

/// Two [T, rows] outputs of the same product agree to 1e-5 of Σ|w·x| per output (+ 1e-6): the
/// bound for kernels that sum the same exact integers in another f32 order. `deq` is the
/// dequantized [rows, cols] matrix, `x` the [T, cols] activations.
fn assert_close_by_magnitude(
    a: &[f32],
    b: &[f32],
    deq: &[f32],
    x: &[f32],
    rows: usize,
    cols: usize,
    what: &str,
) {
    assert_eq!(a.len(), b.len(), "{what}: output lengths");
    for (i, (a, b)) in a.iter().zip(b).enumerate() {
        let (ti, r) = (i / rows, i % rows);
        let mag: f32 = deq[r * cols..(r + 1) * cols]
            .iter()
            .zip(&x[ti * cols..(ti + 1) * cols])
            .map(|(w, v)| (w * v).abs())
            .sum();
        assert!(
            (a - b).abs() <= 1e-5 * mag + 1e-6,
            "{what} out {i}: {a} vs {b}"
        );
    }
}

fn dequant(ty: QuantType, bytes: &[u8]) -> Vec<f32> {
    let mut y = vec![0.0; bytes.len() / ty.type_size() * ty.block_size()];
    dequantize_row(ty, bytes, &mut y);
    y
}

/// Scratch for the four activation kinds.
#[derive(Default)]
struct Acts {
    q8: Vec<PairQ8>,
    q8x2: Vec<PairQ8x2>,
    q8k: Vec<BlockQ8K>,
    q8kx2: Vec<BlockQ8Kx2>,
}

impl Acts {
    /// `x` quantized for weights of `ty` at precision `p`.
    fn row(&mut self, ty: QuantType, p: Precision, x: &[f32]) -> ActRow<'_> {
        fn q<'a, A: ActBlock>(x: &[f32], v: &'a mut Vec<A>) -> ActRow<'a> {
            quantize(x, v);
            A::row(v)
        }
        match (ty.uses_q8k(), p) {
            (false, Precision::Int8) => q(x, &mut self.q8),
            (false, Precision::Int8x2) => q(x, &mut self.q8x2),
            (true, Precision::Int8) => q(x, &mut self.q8k),
            (true, Precision::Int8x2) => q(x, &mut self.q8kx2),
        }
    }
}

fn kernel(isa: Isa, p: Precision) -> Kernel {
    Kernel::new(isa).expect("supported").with_precision(p)
}

/// For a test that build.rs let run (the build host has `isa`): fails, rather than passing
/// with nothing tested, where the build is reused on a CPU without it.
fn require(isa: Isa) {
    assert!(
        isa.is_supported(),
        "this CPU lacks {isa:?}, which the build host had: rebuild here (cargo clean -p yomi-cpu)"
    );
}

/// [`require`] for the AMX tests (build.rs's `cfg(yomi_host_amx)`): fails, rather than
/// checking the AMX-off kernel against itself, where this CPU or OS gives no AMX-INT8 tile
/// state although the build host's did.
fn require_amx() {
    require(Isa::Avx512Vnni);
    assert!(
        Kernel::new(Isa::Avx512Vnni).is_some_and(|k| k.with_amx(true).amx()),
        "this CPU or OS gives no AMX-INT8 tile state, which the build host had: rebuild here \
         (cargo clean -p yomi-cpu)"
    );
}

fn simd_isas() -> Vec<Isa> {
    [Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni]
        .into_iter()
        .filter(|i| i.is_supported())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Activation quantization.

/// Activation rows with the edge cases of the quantizers: values that round to exactly
/// ±127.5 · d before clamping, ties, and an all-zero block.
fn edge_acts() -> Vec<f32> {
    let mut rng = Rng(11);
    let mut x = random_acts(4096, &mut rng);
    x[0] = -1.0;
    x[1] = 1.0;
    x[2] = 0.5 / 127.0;
    x[3] = -1.5 / 127.0;
    // Residual ties and residuals that round to ±128 (clamped to ±127).
    x[4] = (10.0 + 0.5 / 256.0) / 127.0;
    x[5] = -(3.0 + 1.5 / 256.0) / 127.0;
    x[6] = (7.0 + 127.75 / 256.0) / 127.0;
    x[7] = -(7.0 + 127.5 / 256.0) / 127.0;
    for v in &mut x[256..512] {
        *v = 0.0;
    }
    x
}

/// The SIMD (AVX-512 for the pairs where the CPU has it, else AVX2) and portable builds give
/// identical blocks; no plane holds −128; the sums are the
/// sums of the planes; and every value is within its bound of the input.
fn check_act_kind<A: ActBlock + PartialEqBlock>(x: &[f32], p: Precision) {
    let (mut a, mut b) = (Vec::<A>::new(), Vec::<A>::new());
    quantize(x, &mut a);
    act::quantize_portable(x, &mut b);
    for (p, q) in a.iter().zip(&b) {
        assert!(p.same(q));
        p.check_invariants();
    }
    // Per element |x − Q·d| ≤ err_steps·d (+ ~2⁻²² of |x|, see `act_bound`); for int8×2 the
    // clamped residuals are rare (1 in 256 expected; `edge_acts` forces two).
    let y = act::dequantize_act(&a, x.len());
    let mut over_half = 0;
    for (blk, (xs, ys)) in x.chunks(A::BLOCK).zip(y.chunks(A::BLOCK)).enumerate() {
        let d = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / step(p);
        for (v, q) in xs.iter().zip(ys) {
            let err = (*v as f64 - *q as f64).abs();
            let slack = 3e-7 * v.abs() as f64 + 1e-30;
            assert!(
                err <= err_steps(p) * d + slack,
                "{p} block {blk}: {v} → {q} (d {d})"
            );
            over_half += (err > 0.5001 * d + slack) as usize;
        }
    }
    assert!(
        over_half <= 2 + x.len() / 64,
        "{p}: {over_half} values off by more than d/2"
    );
}

/// Field-wise equality and invariants of the activation blocks (tests only).
trait PartialEqBlock {
    fn same(&self, o: &Self) -> bool;
    fn check_invariants(&self);
}

fn no_m128(q: &[i8]) -> bool {
    q.iter().all(|&v| v != -128)
}

fn bits4(v: &[f32; 4]) -> [u32; 4] {
    v.map(f32::to_bits)
}

impl PartialEqBlock for PairQ8 {
    fn same(&self, o: &Self) -> bool {
        (bits4(&self.ds), self.sum, self.qs, self.q8_off, self.off128)
            == (bits4(&o.ds), o.sum, o.qs, o.q8_off, o.off128)
    }
    fn check_invariants(&self) {
        assert!(no_m128(&self.qs));
        for h in 0..2 {
            let q = act::gather_pair(h, &self.qs);
            assert_eq!(self.sum[h], q.iter().map(|&v| v as i32).sum::<i32>());
            assert_eq!(self.ds[2 * h + 1], self.ds[2 * h] * self.sum[h] as f32);
        }
    }
}

impl PartialEqBlock for PairQ8x2 {
    fn same(&self, o: &Self) -> bool {
        (
            bits4(&self.ds),
            self.sum,
            self.qs,
            self.qr,
            self.q8_off,
            self.off128,
        ) == (bits4(&o.ds), o.sum, o.qs, o.qr, o.q8_off, o.off128)
    }
    fn check_invariants(&self) {
        assert!(no_m128(&self.qs) && no_m128(&self.qr));
        for h in 0..2 {
            let (q, r) = (act::gather_pair(h, &self.qs), act::gather_pair(h, &self.qr));
            let sum: i32 = q
                .iter()
                .zip(&r)
                .map(|(&q, &r)| 256 * q as i32 + r as i32)
                .sum();
            assert_eq!(self.sum[h], sum);
            assert_eq!(self.ds[2 * h + 1], self.ds[2 * h] * self.sum[h] as f32);
        }
    }
}

fn sums16(q: &[i8]) -> Vec<i16> {
    q.chunks(16)
        .map(|c| c.iter().map(|&v| v as i16).sum())
        .collect()
}

impl PartialEqBlock for BlockQ8K {
    fn same(&self, o: &Self) -> bool {
        (self.d.to_bits(), self.qs, self.bsums) == (o.d.to_bits(), o.qs, o.bsums)
    }
    fn check_invariants(&self) {
        assert!(no_m128(&self.qs));
        assert_eq!(self.bsums.to_vec(), sums16(&self.qs));
    }
}

impl PartialEqBlock for BlockQ8Kx2 {
    fn same(&self, o: &Self) -> bool {
        (self.d.to_bits(), self.qs, self.qr, self.bsums, self.rsums)
            == (o.d.to_bits(), o.qs, o.qr, o.bsums, o.rsums)
    }
    fn check_invariants(&self) {
        assert!(no_m128(&self.qs) && no_m128(&self.qr));
        assert_eq!(self.bsums.to_vec(), sums16(&self.qs));
        assert_eq!(self.rsums.to_vec(), sums16(&self.qr));
    }
}

#[test]
fn activation_quantization_range_and_builds_agree() {
    let x = edge_acts();
    check_act_kind::<PairQ8>(&x, Precision::Int8);
    check_act_kind::<PairQ8x2>(&x, Precision::Int8x2);
    check_act_kind::<BlockQ8K>(&x, Precision::Int8);
    check_act_kind::<BlockQ8Kx2>(&x, Precision::Int8x2);
    // An odd number of 32-blocks: the last pair's second block is zero.
    let x = &x[..32 * 7];
    check_act_kind::<PairQ8>(x, Precision::Int8);
    check_act_kind::<PairQ8x2>(x, Precision::Int8x2);
    let mut a = Vec::<PairQ8x2>::new();
    quantize(x, &mut a);
    assert_eq!(a.len(), 4);
    let last = &a[3];
    assert!(act::gather_pair(1, &last.qs) == [0; 32] && act::gather_pair(1, &last.qr) == [0; 32]);
    assert_eq!((last.ds[2], last.ds[3], last.sum[1]), (0.0, 0.0, 0));
}

/// The AVX2 pair quantizer on its own (where AVX-512 is present the dispatcher picks that one
/// instead): bit for bit the portable blocks, also for an odd number of 32-blocks per row.
#[cfg(target_arch = "x86_64")]
#[test]
#[cfg_attr(
    not(yomi_host_avx2),
    ignore = "needs an AVX2+FMA+F16C CPU (the build host has none, see build.rs)"
)]
fn avx2_pair_quantizer_matches_portable() {
    require(Isa::Avx2);
    fn check<A: ActBlock + PartialEqBlock + super::act_x86::PairOut>(x: &[f32], cols: usize) {
        let mut a = vec![A::default(); x.len() / cols * cols.div_ceil(64)];
        // SAFETY: AVX2 checked by `require` (`Isa::Avx2` includes it).
        unsafe { super::act_x86::quantize_pairs_avx2(x, cols, &mut a) };
        for (r, xr) in x.chunks(cols).enumerate() {
            let mut b = Vec::<A>::new();
            act::quantize_portable(xr, &mut b);
            let per_row = cols.div_ceil(64);
            for (i, (p, q)) in a[r * per_row..(r + 1) * per_row].iter().zip(&b).enumerate() {
                assert!(p.same(q), "row {r} pair {i}");
            }
        }
    }
    let x = edge_acts();
    for cols in [x.len(), 32 * 7, 96] {
        let rows = x.len() / cols;
        check::<PairQ8>(&x[..rows * cols], cols);
        check::<PairQ8x2>(&x[..rows * cols], cols);
    }
}

/// Many rows (enough to be split over the pool, into items of several rows with a shorter last
/// one) give every row exactly the units it gets alone, for both pair kinds.
#[test]
fn quantize_rows_over_the_pool_is_per_row() {
    fn check<A: ActBlock + PartialEqBlock>(x: &[f32], cols: usize) {
        let t = x.len() / cols;
        let mut all = Vec::<A>::new();
        quantize_rows(x, cols, &mut all);
        let per = all.len() / t;
        for (ti, xr) in x.chunks(cols).enumerate() {
            let mut one = Vec::<A>::new();
            act::quantize_portable(xr, &mut one);
            assert_eq!(one.len(), per);
            for (p, q) in all[ti * per..(ti + 1) * per].iter().zip(&one) {
                assert!(p.same(q), "cols {cols}, row {ti} of {t}");
            }
        }
    }
    let mut rng = Rng(29);
    for (cols, t) in [(576, 16), (1536, 7), (96, 40), (32, 130)] {
        let x = random_acts(cols * t, &mut rng);
        assert!(t >= 2 && x.len() >= 2 * act::PARALLEL_MIN_VALUES);
        check::<PairQ8x2>(&x, cols);
        check::<PairQ8>(&x, cols);
    }
}

/// Rows are quantized separately: a row with an odd block count does not share its last pair
/// with the next row.
#[test]
fn quantize_rows_keeps_rows_apart() {
    let x = edge_acts();
    let (cols, t) = (96, 5);
    let mut all = Vec::<PairQ8x2>::new();
    quantize_rows(&x[..cols * t], cols, &mut all);
    assert_eq!(all.len(), t * 2);
    for (ti, xr) in x[..cols * t].chunks(cols).enumerate() {
        let mut one = Vec::<PairQ8x2>::new();
        quantize(xr, &mut one);
        for (p, q) in all[2 * ti..2 * ti + 2].iter().zip(&one) {
            assert!(p.same(q), "row {ti}");
        }
    }
}

/// The int8×2 planes and the pair layout by hand: `x = d·(q + r/256)` with `d = 1/127` for
/// block A (values 0..32) and `d = 2/127` for block B (values 32..64).
#[test]
fn int8x2_planes_by_hand() {
    let mut x = vec![0.0f32; 64];
    x[0] = 1.0; // amax of A: q = 127, r = 0
    x[1] = (5.0 + 7.0 / 256.0) / 127.0; // q = 5, r = 7
    x[2] = (-2.0 - 100.0 / 256.0) / 127.0; // q = −2, r = −100
    x[3] = 125.0 / 256.0 / 127.0; // q = 0, r = 125
    x[4] = -(3.0 + 0.4 / 256.0) / 127.0; // q = −3, r = 0 (0.4 of a residual step)
    x[5] = (4.0 + 127.75 / 256.0) / 127.0; // q = 4 (4.499), r = 128 clamped to 127
    x[17] = 9.0 / 127.0; // value 17 of A: q = 9, in the third quarter of the plane
    x[32] = 2.0; // amax of B
    x[32 + 17] = (-6.0 - 64.0 / 256.0) * 2.0 / 127.0; // value 17 of B: q = −6, r = −64
    let mut a = Vec::<PairQ8x2>::new();
    quantize(&x, &mut a);
    assert_eq!(a.len(), 1);
    let p = &a[0];
    assert_eq!(&p.qs[..6], &[127, 5, -2, 0, -3, 4]);
    assert_eq!(&p.qr[..6], &[0, 7, -100, 125, 0, 127]);
    assert_eq!((p.qs[32 + 1], p.qr[32 + 1]), (9, 0)); // A[17]
    assert_eq!((p.qs[16], p.qr[16]), (127, 0)); // B[0]
    assert_eq!((p.qs[48 + 1], p.qr[48 + 1]), (-6, -64)); // B[17]
    assert_eq!(p.ds[0], (1.0f32 / 127.0) / 256.0);
    assert_eq!(p.ds[2], (2.0f32 / 127.0) / 256.0);
    let sum_a = 256 * (127 + 5 - 2 - 3 + 4 + 9) + 7 - 100 + 125 + 127;
    assert_eq!(p.sum, [sum_a, 256 * (127 - 6) - 64]);
    assert_eq!(p.ds[1], p.ds[0] * sum_a as f32);
}

// ---------------------------------------------------------------------------------------------
// SIMD vs scalar: the same integer sums.

fn check_isums_equal(ty: QuantType, w: &[u8], x: &[f32], isa: Isa) {
    let mut acts = Acts::default();
    for p in Precision::ALL {
        let a = acts.row(ty, p, x);
        let want = kernel(Isa::Scalar, p).block_isums(ty, w, a);
        let got = kernel(isa, p).block_isums(ty, w, a);
        assert_eq!(want.len(), w.len() / ty.type_size());
        assert_eq!(got.len(), want.len());
        for (i, (g, s)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g,
                s,
                "{ty} {p} {isa:?} block {i} (values {}..)",
                i * ty.block_size()
            );
        }
    }
}

fn isa_parity(isa: Isa) {
    let mut rng = Rng(23 + isa as u64);
    for ty in QuantType::ALL {
        let nb = 64 / (ty.block_size() / 32);
        let w = random_blocks(ty, nb, &mut rng);
        let x = random_acts(nb * ty.block_size(), &mut rng);
        check_isums_equal(ty, &w, &x, isa);
        // Extremes: all-ones bytes (max nibbles, Q8_0 −1, Q6_K scale −1) against ±127 and all
        // −128 weight bytes against −127.
        for (fill, xv) in [
            (0xFFu8, 1.0f32),
            (0xFF, -1.0),
            (0x80, -1.0),
            (0x80, 1.0),
            (0x00, 1.0),
        ] {
            let mut w = vec![fill; ty.type_size() * 2];
            for blk in w.chunks_exact_mut(ty.type_size()) {
                let off = if ty == QuantType::Q6_K { 208 } else { 0 };
                blk[off..off + 2].copy_from_slice(&f16b(0.01));
            }
            let x = vec![xv; 2 * ty.block_size()];
            check_isums_equal(ty, &w, &x, isa);
        }
        // Row dots: same integers, so only f32 summation order differs (relative 1e-5 of the
        // sum of |block contributions|, which is what 64 reordered f32 additions can move).
        let wf = dequant(ty, &w);
        let mag: f32 = wf.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
        for pr in Precision::ALL {
            let p = vec_dot_f32(kernel(Isa::Scalar, pr), ty, &w, &x);
            let q = vec_dot_f32(kernel(isa, pr), ty, &w, &x);
            assert!(
                (p - q).abs() <= 1e-5 * mag + 1e-6,
                "{ty} {pr} {isa:?}: {p} vs {q}"
            );
        }
    }
}

#[test]
#[cfg_attr(
    not(yomi_host_avx2),
    ignore = "needs an AVX2+FMA+F16C CPU (the build host has none, see build.rs)"
)]
fn avx2_matches_scalar_integer_sums() {
    require(Isa::Avx2);
    isa_parity(Isa::Avx2);
}

#[test]
#[cfg_attr(
    not(yomi_host_avxvnni),
    ignore = "needs an AVX-VNNI CPU (the build host has none, see build.rs)"
)]
fn avxvnni_matches_scalar_integer_sums() {
    require(Isa::AvxVnni);
    isa_parity(Isa::AvxVnni);
    linear_isa_parity(Isa::AvxVnni);
    rows_bitwise(Isa::AvxVnni);
}

#[test]
#[cfg_attr(
    not(yomi_host_avx512vnni),
    ignore = "needs an AVX-512-VNNI CPU (the build host has none, see build.rs)"
)]
fn avx512vnni_matches_scalar_integer_sums() {
    require(Isa::Avx512Vnni);
    isa_parity(Isa::Avx512Vnni);
    linear_isa_parity(Isa::Avx512Vnni);
    rows_bitwise(Isa::Avx512Vnni);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Every SIMD kernel set of this CPU (none without AVX2, hence ignored there).
    #[test]
    #[cfg_attr(
        not(yomi_host_avx2),
        ignore = "needs an AVX2+FMA+F16C CPU (the build host has none, see build.rs)"
    )]
    fn simd_isums_match_scalar_prop(
        ty_i in 0usize..6,
        seed in any::<u64>(),
        nb in 1usize..5,
        big in any::<bool>(),
    ) {
        require(Isa::Avx2);
        let ty = QuantType::ALL[ty_i];
        let mut rng = Rng(seed);
        let w = rng.bytes(nb * ty.type_size());
        let mut x = random_acts(nb * ty.block_size(), &mut rng);
        if big {
            for v in &mut x {
                *v = if *v >= 0.0 { 1.0 } else { -1.0 };
            }
        }
        for isa in simd_isas() {
            check_isums_equal(ty, &w, &x, isa);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Integer dot vs f64 dot of dequantized weights and original activations.

#[test]
fn int8_dot_within_activation_bound() {
    let mut rng = Rng(99);
    for ty in QuantType::ALL {
        for nb in [1usize, 3, 8] {
            let n = nb * ty.block_size();
            // Valid blocks from the quantizer and random-byte blocks.
            let mut wq = Vec::new();
            quantize_row(ty, &rng.vec(n), &mut wq);
            for w in [wq, random_blocks(ty, nb, &mut rng)] {
                let x = random_acts(n, &mut rng);
                let wf = dequant(ty, &w);
                let exact: f64 = wf.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                for p in Precision::ALL {
                    let bound = act_bound(&wf, &x, if ty.uses_q8k() { 256 } else { 32 }, p);
                    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
                        let got = vec_dot_f32(kernel(isa, p), ty, &w, &x) as f64;
                        assert!(
                            (got - exact).abs() <= bound,
                            "{ty} {p} {isa:?} nb {nb}: {got} vs {exact} (bound {bound})"
                        );
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// linear on quantized weights.

/// `linear` (at [`Precision::current`]) and `linear_quant_with` at `p` + the bias, against
/// `linear_reference`.
fn check_linear(ty: QuantType, rows: usize, cols: usize, t: usize, seed: u64, p: Precision) {
    let mut rng = Rng(seed);
    let wf = rng.vec(rows * cols);
    let q = QuantData::quantize(ty, rows, cols, &wf);
    let x = random_acts(t * cols, &mut rng);
    let bias = rng.vec(rows);
    let mut got = vec![0.0; t * rows];
    let mut want = vec![0.0; t * rows];
    linear_quant_with(
        Kernel::best().with_precision(p),
        &x,
        t,
        rows,
        cols,
        &q,
        &mut got,
    );
    for row in got.chunks_mut(rows) {
        for (o, b) in row.iter_mut().zip(&bias) {
            *o += b;
        }
    }
    let w = Matrix::new(rows, cols, WeightData::Quant(q));
    if p == Precision::current() {
        let mut lin = vec![0.0; t * rows];
        linear(&x, t, &w, Some(&bias), &mut lin);
        assert_eq!(
            lin, got,
            "linear vs linear_quant_with at the current precision"
        );
    }
    linear_reference(&x, t, &w, Some(&bias), &mut want);
    let block = if ty.uses_q8k() { 256 } else { 32 };
    let mut buf = vec![0.0; cols];
    for r in 0..rows {
        let wr = w.row_f32(r, &mut buf).to_vec();
        for ti in 0..t {
            let xr = &x[ti * cols..(ti + 1) * cols];
            // `act_bound` (int8 activations + f32 arithmetic) plus the bias addition, one f32
            // rounding of a value ≤ |want| + bound.
            let i = ti * rows + r;
            let tol = act_bound(&wr, xr, block, p) + 1.2e-7 * (want[i].abs() as f64 + 1.0);
            assert!(
                ((got[i] - want[i]) as f64).abs() <= tol,
                "{ty} {p} [{rows}x{cols}] t {t}: row {r} step {ti}: {} vs {} (tol {tol})",
                got[i],
                want[i]
            );
        }
    }
}

#[test]
fn linear_quant_real_shapes() {
    // SmolLM2-135M: hidden 576, FFN 1536 (q/o/gate/up are [576|1536, 576], down [576, 1536]).
    for p in Precision::ALL {
        for ty in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1] {
            for t in [1, 5, 8] {
                check_linear(ty, 576, 1536, t, 1 + t as u64, p);
                check_linear(ty, 1536, 576, t, 3 + t as u64, p);
                // 17 blocks per row: each row ends in a half-zero pair.
                check_linear(ty, 100, 544, t, 9 + t as u64, p);
            }
        }
    }
    // K-quants need cols % 256 == 0, so 576 columns are impossible for them (llama.cpp falls
    // back to other types there); use 1536 and 512 columns.
    for p in Precision::ALL {
        for ty in [QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K] {
            for t in [1, 5, 8] {
                check_linear(ty, 576, 1536, t, 5 + t as u64, p);
                check_linear(ty, 1536, 512, t, 7 + t as u64, p);
            }
        }
    }
    // A 7B-class square projection, T = 5 (a full register tile of 4 and a single row).
    for ty in [QuantType::Q4_K, QuantType::Q6_K] {
        check_linear(ty, 4096, 4096, 5, 13, Precision::Int8x2);
    }
}

/// The same integer sums in every kernel set ⇒ `linear` with any ISA agrees with the scalar one
/// up to f32 summation order (relative 1e-5 of Σ|w·x| per output).
fn linear_isa_parity(isa: Isa) {
    let mut rng = Rng(5);
    for (ty, p) in QuantType::ALL
        .into_iter()
        .flat_map(|ty| Precision::ALL.map(|p| (ty, p)))
    {
        // 33 blocks of 32 (an odd count: the last pair is half zero) or 4 of 256.
        let (rows, t) = (40, 9);
        let cols = if ty.uses_q8k() { 1024 } else { 1056 };
        let wf = rng.vec(rows * cols);
        let q = QuantData::quantize(ty, rows, cols, &wf);
        let x = random_acts(t * cols, &mut rng);
        let (mut a, mut b) = (vec![0.0; t * rows], vec![0.0; t * rows]);
        linear_quant_with(kernel(Isa::Scalar, p), &x, t, rows, cols, &q, &mut a);
        linear_quant_with(kernel(isa, p), &x, t, rows, cols, &q, &mut b);
        let deq = dequant(ty, &q.bytes);
        assert_close_by_magnitude(&a, &b, &deq, &x, rows, cols, &format!("{ty} {p} {isa:?}"));
    }
}

// ---------------------------------------------------------------------------------------------
// T rows at once vs one row at a time: the same bits.

/// Bit patterns (so that −0.0 ≠ 0.0 and NaNs compare).
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `linear_quant_with` on T rows (row tiling on and off) against T one-row calls, bit for bit,
/// for every type and precision and T ∈ {1, 2, 3, 5, 8, 16, 17, 32, 64, 256}; the rows sharing
/// a call differ with T (and with the window start), yet every output must keep its bits.
fn rows_bitwise(isa: Isa) {
    const TS: [usize; 10] = [1, 2, 3, 5, 8, 16, 17, 32, 64, 256];
    let mut rng = Rng(77 + isa as u64);
    for ty in QuantType::ALL {
        // 17 blocks of 32 (odd: the last pair is half zero) or 3 of 256; 37 rows (not whole
        // tasks of 16).
        let (rows, cols) = (37, if ty.uses_q8k() { 768 } else { 544 });
        let q = QuantData {
            ty,
            bytes: random_blocks(ty, rows * cols / ty.block_size(), &mut rng),
        };
        let tmax = 256 + 3;
        let x = random_acts(tmax * cols, &mut rng);
        for p in Precision::ALL {
            let k = kernel(isa, p);
            let mut one = vec![0.0; tmax * rows];
            for (xr, o) in x.chunks(cols).zip(one.chunks_mut(rows)) {
                linear_quant_with(k, xr, 1, rows, cols, &q, o);
            }
            for t in TS {
                for start in [0, 3] {
                    let xs = &x[start * cols..(start + t) * cols];
                    let want = bits(&one[start * rows..(start + t) * rows]);
                    for tiling in [true, false] {
                        let mut got = vec![0.0; t * rows];
                        linear_quant_with(
                            k.with_row_tiling(tiling),
                            xs,
                            t,
                            rows,
                            cols,
                            &q,
                            &mut got,
                        );
                        assert!(
                            bits(&got) == want,
                            "{ty} {p} {isa:?} T {t} start {start} tiling {tiling}: not the one-row bits"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn rows_bitwise_scalar() {
    rows_bitwise(Isa::Scalar);
}

#[test]
#[cfg_attr(
    not(yomi_host_avx2),
    ignore = "needs an AVX2+FMA+F16C CPU (the build host has none, see build.rs)"
)]
fn rows_bitwise_avx2() {
    require(Isa::Avx2);
    rows_bitwise(Isa::Avx2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// `Kernel::dot_block` of m weight rows of random bytes (all quant / scale bit patterns)
    /// with n activation rows (optionally all ±1: the largest integers), into a strided
    /// output, is bitwise `Kernel::dot` per (weight row, activation row) and leaves the gaps
    /// alone, on every kernel set of this CPU; `dot_rows` is its one-weight-row case.
    #[test]
    fn dot_block_bitwise_prop(
        ty_i in 0usize..6,
        seed in any::<u64>(),
        nb in 1usize..6,
        m in 1usize..4,
        n in 1usize..11,
        big in any::<bool>(),
    ) {
        let ty = QuantType::ALL[ty_i];
        let mut rng = Rng(seed);
        let w = random_blocks(ty, m * nb, &mut rng);
        let cols = nb * ty.block_size();
        let mut x = random_acts(n * cols, &mut rng);
        if big {
            for v in &mut x {
                *v = if *v >= 0.0 { 1.0 } else { -1.0 };
            }
        }
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            for p in Precision::ALL {
                let k = kernel(isa, p);
                fn go<A: ActBlock>(
                    k: Kernel,
                    ty: QuantType,
                    (w, m): (&[u8], usize),
                    x: &[f32],
                    cols: usize,
                ) -> (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) {
                    let mut all: Vec<A> = Vec::new();
                    quantize_rows(x, cols, &mut all);
                    let n = x.len() / cols;
                    let per = all.len() / n;
                    let stride = n + 2;
                    let mut got = vec![-7.0f32; m * stride];
                    k.dot_block(ty, w, m, A::row(&all), n, &mut got, stride);
                    let mut want = vec![-7.0f32; m * stride];
                    for (r, wr) in w.chunks(w.len() / m).enumerate() {
                        for (i, ar) in all.chunks(per).enumerate() {
                            want[r * stride + i] = k.dot(ty, wr, A::row(ar));
                        }
                    }
                    let mut one = vec![0.0f32; n];
                    k.dot_rows(ty, &w[..w.len() / m], A::row(&all), &mut one);
                    (bits(&got), bits(&want), bits(&one), bits(&want[..n]))
                }
                let (got, want, one, want0) = match (ty.uses_q8k(), p) {
                    (false, Precision::Int8) => go::<PairQ8>(k, ty, (&w, m), &x, cols),
                    (false, Precision::Int8x2) => go::<PairQ8x2>(k, ty, (&w, m), &x, cols),
                    (true, Precision::Int8) => go::<BlockQ8K>(k, ty, (&w, m), &x, cols),
                    (true, Precision::Int8x2) => go::<BlockQ8Kx2>(k, ty, (&w, m), &x, cols),
                };
                prop_assert_eq!(got, want, "{} {} {:?} nb {} m {} n {}", ty, p, isa, nb, m, n);
                prop_assert_eq!(one, want0, "dot_rows {} {} {:?} nb {} n {}", ty, p, isa, nb, n);
            }
        }
    }
}

#[test]
#[cfg_attr(
    not(yomi_host_avx2),
    ignore = "needs an AVX2+FMA+F16C CPU (the build host has none, see build.rs)"
)]
fn linear_avx2_matches_scalar() {
    require(Isa::Avx2);
    linear_isa_parity(Isa::Avx2);
}

/// A linear inside a rayon task of another linear (same thread may run both): the scratch is
/// then borrowed and the inner call must fall back to a fresh buffer, not panic.
#[test]
fn nested_linear_does_not_panic() {
    use rayon::prelude::*;
    let mut rng = Rng(1);
    let (rows, cols) = (64, 256);
    let q = QuantData::quantize(QuantType::Q4_K, rows, cols, &rng.vec(rows * cols));
    let w = Matrix::new(rows, cols, WeightData::Quant(q));
    let x = rng.vec(2 * cols);
    let mut want = vec![0.0; 2 * rows];
    linear(&x, 2, &w, None, &mut want);
    let outs: Vec<Vec<f32>> = (0..8)
        .into_par_iter()
        .map(|_| {
            let mut o = vec![0.0; 2 * rows];
            linear(&x, 2, &w, None, &mut o);
            o
        })
        .collect();
    for o in outs {
        assert_eq!(o, want);
    }
}

// ---------------------------------------------------------------------------------------------
// Packed (interleaved) Q8_0 / Q4_0 / Q4_1.

const PACKED_TYPES: [QuantType; 3] = [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1];

fn supported_isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

/// The packed kernel variants of `isa` at `p`: AMX off, and AMX on where this CPU and OS allow
/// it (AVX-512-VNNI only). Says once per test binary whether the AMX path is covered, so a run
/// on a CPU without AMX does not pass it silently.
fn packed_kernels(isa: Isa, p: Precision) -> Vec<Kernel> {
    static SAID: std::sync::Once = std::sync::Once::new();
    let k = kernel(isa, p);
    let amx = k.with_amx(true);
    SAID.call_once(|| {
        let on = Kernel::new(Isa::Avx512Vnni).is_some_and(|k| k.with_amx(true).amx());
        eprintln!(
            "packed tests: AMX path {}",
            if on {
                "covered (AMX-INT8 available)"
            } else {
                "NOT covered (no AMX on this CPU/OS)"
            }
        );
    });
    let mut v = vec![k.with_amx(false)];
    if amx.amx() {
        v.push(amx);
    }
    v
}

#[test]
fn packed_round_trip() {
    let mut rng = Rng(11);
    for ty in PACKED_TYPES {
        for (rows, cols) in [(16, 32), (37, 544), (5, 64), (48, 1056)] {
            let q = QuantData {
                ty,
                bytes: random_blocks(ty, rows * cols / 32, &mut rng),
            };
            let p = PackedQuant::from_ggml(&q, rows, cols).expect("packable");
            assert_eq!(p.size_bytes(), q.bytes.len());
            assert_eq!(p.to_ggml().bytes, q.bytes, "{ty} {rows}x{cols}");
            let (mut a, mut b) = (vec![0.0; cols], vec![0.0; cols]);
            for r in 0..rows {
                p.dequantize_row(r, &mut a);
                dequantize_row(ty, q.row(cols, r), &mut b);
                assert_eq!(bits(&a), bits(&b), "{ty} row {r}");
            }
            if rows >= 16 {
                assert_ne!(p.group_bytes(0, 1), &q.bytes[..16 * q.bytes.len() / rows]);
            }
        }
    }
    let q = QuantData::quantize(QuantType::Q4_K, 16, 256, &rng.vec(16 * 256));
    assert!(PackedQuant::from_ggml(&q, 16, 256).is_none());
}

/// Packed `linear_packed_with` on T rows against T one-row calls, bit for bit, on every kernel
/// set of this CPU; the group rows also agree bit for bit across kernel sets (scalar included)
/// and against the packed-free row kernels within the f32 summation tolerance.
#[test]
fn packed_rows_bitwise() {
    const TS: [usize; 9] = [1, 2, 3, 5, 8, 9, 16, 17, 64];
    let mut rng = Rng(91);
    for ty in PACKED_TYPES {
        // 17 blocks (odd: the last pair is half zero); 2 groups + 5 tail rows.
        let (rows, cols) = (37, 544);
        let q = QuantData {
            ty,
            bytes: random_blocks(ty, rows * cols / 32, &mut rng),
        };
        let p = PackedQuant::from_ggml(&q, rows, cols).expect("packable");
        let tmax = 64 + 3;
        let x = random_acts(tmax * cols, &mut rng);
        for prec in Precision::ALL {
            let mut first: Option<Vec<u32>> = None;
            for k in supported_isas()
                .into_iter()
                .flat_map(|i| packed_kernels(i, prec))
            {
                let (isa, amx) = (k.isa(), k.amx());
                let mut one = vec![0.0; tmax * rows];
                for (xr, o) in x.chunks(cols).zip(one.chunks_mut(rows)) {
                    linear_packed_with(k, xr, 1, &p, o);
                }
                for t in TS {
                    for start in [0, 3] {
                        let xs = &x[start * cols..(start + t) * cols];
                        let mut got = vec![0.0; t * rows];
                        linear_packed_with(k, xs, t, &p, &mut got);
                        assert!(
                            bits(&got) == bits(&one[start * rows..(start + t) * rows]),
                            "{ty} {prec} {isa:?} amx {amx} T {t} start {start}: not the one-row bits"
                        );
                    }
                }
                // Group rows: the same bits on every kernel set.
                let groups: Vec<u32> = one.chunks(rows).flat_map(|r| bits(&r[..32])).collect();
                match &first {
                    None => first = Some(groups),
                    Some(f) => {
                        assert!(
                            *f == groups,
                            "{ty} {prec} {isa:?} amx {amx}: not the scalar bits"
                        )
                    }
                }
                // Against the GGML row kernels (another f32 order).
                let mut rowk = vec![0.0; tmax * rows];
                linear_quant_with(k, &x, tmax, rows, cols, &q, &mut rowk);
                let deq = dequant(ty, &q.bytes);
                let what = format!("{ty} {prec} {isa:?} amx {amx}");
                assert_close_by_magnitude(&one, &rowk, &deq, &x, rows, cols, &what);
            }
        }
    }
}

/// Several matrices in one call (`linear_packed_many_with`: one run of groups over all of
/// them per thread, pieces that span matrices, tails stolen) give every matrix bitwise what
/// its own call gives, at any T and thread count (4 runs on fewer workers: stealing), and in
/// bands of rows (forced here: only machines of 8 threads or more split a pass by itself).
#[test]
fn packed_many_bitwise_per_matrix() {
    let cols = 544; // 17 blocks: the last pair half zero
    let shapes = [
        (QuantType::Q4_1, 37), // 2 groups + 5 tail rows
        (QuantType::Q8_0, 64),
        (QuantType::Q8_0, 5), // no group: tail rows only
        (QuantType::Q4_0, 16),
        (QuantType::Q4_1, 300),
    ];
    let mut rng = Rng(4242);
    let mats: Vec<PackedQuant> = shapes
        .iter()
        .map(|&(ty, rows)| {
            let q = QuantData {
                ty,
                bytes: random_blocks(ty, rows * cols / 32, &mut rng),
            };
            PackedQuant::from_ggml(&q, rows, cols).expect("packable")
        })
        .collect();
    let x = random_acts(40 * cols, &mut rng);
    for threads in [1, 2, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a rayon pool");
        pool.install(|| {
            for prec in Precision::ALL {
                let k = Kernel::best().with_precision(prec);
                for t in [1, 2, 5, 8, 17, 40] {
                    let xs = &x[..t * cols];
                    for n in 1..=MAX_MANY.min(mats.len()) {
                        let ps: Vec<&PackedQuant> = mats[mats.len() - n..].iter().collect();
                        let mut got: Vec<Vec<f32>> =
                            ps.iter().map(|p| vec![0.0; t * p.rows()]).collect();
                        let mut outs: Vec<&mut [f32]> =
                            got.iter_mut().map(|v| v.as_mut_slice()).collect();
                        linear_packed_many_with(k, xs, t, &ps, &mut outs);
                        for (p, g) in ps.iter().zip(&got) {
                            let mut want = vec![0.0; t * p.rows()];
                            linear_packed_with(k, xs, t, p, &mut want);
                            assert!(
                                bits(g) == bits(&want),
                                "{prec} T {t}, {threads} threads, {n} matrices: {} × {} differs",
                                p.ty(),
                                p.rows()
                            );
                            // The same bits in bands of rows (the last band may be short).
                            for bands in [2, 3] {
                                let mut banded = vec![0.0; t * p.rows()];
                                super::matvec::with_forced_bands(bands, || {
                                    linear_packed_with(k, xs, t, p, &mut banded)
                                });
                                assert!(
                                    bits(&banded) == bits(&want),
                                    "{prec} T {t}, {threads} threads, {bands} bands: {} × {} \
                                     differs",
                                    p.ty(),
                                    p.rows()
                                );
                            }
                        }
                    }
                }
            }
        });
    }
}

/// Packed linear against `linear_reference` at real shapes (SmolLM2-135M: q/o 576×576, k/v
/// 192×576, gate/up 1536×576, down 576×1536, the tied Q8_0 LM head 49152×576; a 4096×4096
/// projection), within the activation-rounding bound.
#[test]
fn packed_real_shapes() {
    let cases: &[(QuantType, usize, usize, &[usize])] = &[
        (QuantType::Q4_1, 576, 576, &[1, 5, 16]),
        (QuantType::Q4_1, 192, 576, &[1, 16]),
        (QuantType::Q4_1, 1536, 576, &[1, 5, 16]),
        (QuantType::Q4_1, 576, 1536, &[1, 5, 16]),
        (QuantType::Q8_0, 576, 576, &[1, 9]),
        (QuantType::Q4_0, 1536, 576, &[1, 9]),
        (QuantType::Q8_0, 49152, 576, &[1, 3]),
        (QuantType::Q4_1, 4096, 4096, &[2]),
        (QuantType::Q8_0, 4096, 4096, &[1]),
    ];
    for (ci, &(ty, rows, cols, ts)) in cases.iter().enumerate() {
        let mut rng = Rng(500 + ci as u64);
        let q = QuantData::quantize(ty, rows, cols, &rng.vec(rows * cols));
        let p = PackedQuant::from_ggml(&q, rows, cols).expect("packable");
        let w = Matrix::new(rows, cols, WeightData::Quant(q));
        let wp = Matrix::new(rows, cols, WeightData::Repacked(Arc::new(p.clone())));
        for &t in ts {
            let x = random_acts(t * cols, &mut rng);
            let mut want = vec![0.0; t * rows];
            linear_reference(&x, t, &w, None, &mut want);
            for prec in Precision::ALL {
                let mut got = vec![0.0; t * rows];
                linear_packed_with(Kernel::best().with_precision(prec), &x, t, &p, &mut got);
                if prec == Precision::current() {
                    let mut lin = vec![0.0; t * rows];
                    linear(&x, t, &wp, None, &mut lin);
                    assert_eq!(bits(&lin), bits(&got), "linear on a packed matrix");
                }
                let mut buf = vec![0.0; cols];
                for r in 0..rows {
                    let wr = w.row_f32(r, &mut buf).to_vec();
                    for ti in 0..t {
                        let i = ti * rows + r;
                        let xr = &x[ti * cols..(ti + 1) * cols];
                        let tol = act_bound(&wr, xr, 32, prec) + 1.2e-7 * want[i].abs() as f64;
                        assert!(
                            ((got[i] - want[i]) as f64).abs() <= tol,
                            "{ty} {prec} [{rows}x{cols}] t {t}: row {r} step {ti}: {} vs {} \
                             (tol {tol})",
                            got[i],
                            want[i]
                        );
                    }
                }
            }
        }
    }
}

/// The AMX packed kernel at real shapes (SmolLM2-135M: q/o 576×576, k/v 192×576, gate/up
/// 1536×576, down 576×1536, the tied Q8_0 LM head 49152×576) and T around its tile of 16:
/// every output bitwise the one-row result of the AVX-512-VNNI kernel, at both precisions.
/// Ignored where the build host has no AMX (it would check the AMX-off kernel against itself);
/// fails where the build host had AMX and the machine running it has none (rebuild there).
#[test]
#[cfg_attr(
    not(yomi_host_amx),
    ignore = "needs AMX-INT8 with Linux's permission (the build host has none, see build.rs)"
)]
fn packed_amx_real_shapes() {
    const TS: [usize; 12] = [1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33];
    let cases: &[(QuantType, usize, usize)] = &[
        (QuantType::Q4_1, 576, 576),
        (QuantType::Q4_1, 192, 576),
        (QuantType::Q4_1, 1536, 576),
        (QuantType::Q4_1, 576, 1536),
        (QuantType::Q8_0, 576, 576),
        (QuantType::Q8_0, 1536, 576),
        (QuantType::Q8_0, 576, 1536),
        (QuantType::Q4_0, 1536, 576),
        (QuantType::Q8_0, 49152, 576),
    ];
    require_amx();
    let base = Kernel::new(Isa::Avx512Vnni).expect("checked by require_amx");
    let tmax = *TS.last().expect("T values");
    for (ci, &(ty, rows, cols)) in cases.iter().enumerate() {
        let mut rng = Rng(700 + ci as u64);
        let q = QuantData::quantize(ty, rows, cols, &rng.vec(rows * cols));
        let p = PackedQuant::from_ggml(&q, rows, cols).expect("packable");
        let x = random_acts(tmax * cols, &mut rng);
        for prec in Precision::ALL {
            let ks = packed_kernels(Isa::Avx512Vnni, prec);
            let plain = base.with_precision(prec).with_amx(false);
            let mut one = vec![0.0; tmax * rows];
            for (xr, o) in x.chunks(cols).zip(one.chunks_mut(rows)) {
                linear_packed_with(plain, xr, 1, &p, o);
            }
            for k in &ks {
                for t in TS {
                    let mut got = vec![0.0; t * rows];
                    linear_packed_with(*k, &x[..t * cols], t, &p, &mut got);
                    assert!(
                        bits(&got) == bits(&one[..t * rows]),
                        "{ty} {prec} [{rows}x{cols}] amx {} T {t}: not the one-row bits",
                        k.amx()
                    );
                }
            }
        }
    }
}

/// The AMX kernel keeps a thread's repacked activations between its pieces of one loop
/// (`amx::Scratch::a_key`): consecutive linears whose activations sit at the same address with
/// the same shape but other values (the quantized input buffer is reused from call to call)
/// must not see the previous loop's tiles. Each call is checked bitwise against the one-row
/// AVX-512-VNNI results of its own input, at T = 5, 8 and 16 (one tile, several pieces per
/// thread). Ignored where the build host has no AMX (it would check the AMX-off kernel against
/// itself).
#[test]
#[cfg_attr(
    not(yomi_host_amx),
    ignore = "needs AMX-INT8 with Linux's permission (the build host has none, see build.rs)"
)]
fn amx_tiles_are_not_reused_across_loops() {
    require_amx();
    let base = Kernel::new(Isa::Avx512Vnni).expect("checked by require_amx");
    let (rows, cols) = (1536, 576);
    let mut rng = Rng(901);
    let q = QuantData::quantize(QuantType::Q4_1, rows, cols, &rng.vec(rows * cols));
    let p = PackedQuant::from_ggml(&q, rows, cols).expect("packable");
    for prec in Precision::ALL {
        let plain = base.with_precision(prec).with_amx(false);
        for k in packed_kernels(Isa::Avx512Vnni, prec) {
            for t in [5, 8, 16] {
                for round in 0..3 {
                    let x = random_acts(t * cols, &mut rng);
                    let mut want = vec![0.0; t * rows];
                    for (xr, o) in x.chunks(cols).zip(want.chunks_mut(rows)) {
                        linear_packed_with(plain, xr, 1, &p, o);
                    }
                    let mut got = vec![0.0; t * rows];
                    linear_packed_with(k, &x, t, &p, &mut got);
                    assert!(
                        bits(&got) == bits(&want),
                        "{prec} amx {} T {t} round {round}: not this input's one-row bits",
                        k.amx()
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// `Kernel::packed_group` of random bytes (every quant pattern) with n activation rows
    /// (optionally all ±1: the largest integers) is bitwise the scalar twin per activation row,
    /// on every kernel set of this CPU and whatever n.
    #[test]
    fn packed_group_bitwise_prop(
        ty_i in 0usize..3,
        seed in any::<u64>(),
        nb in 1usize..6,
        n in 1usize..36,
        big in any::<bool>(),
    ) {
        let ty = PACKED_TYPES[ty_i];
        let mut rng = Rng(seed);
        let cols = nb * 32;
        let q = QuantData { ty, bytes: random_blocks(ty, 16 * nb, &mut rng) };
        let p = PackedQuant::from_ggml(&q, 16, cols).expect("packable");
        let w = p.group_bytes(0, 1);
        let mut x = random_acts(n * cols, &mut rng);
        if big {
            for v in &mut x {
                *v = if *v >= 0.0 { 1.0 } else { -1.0 };
            }
        }
        for prec in Precision::ALL {
            fn go<A: Act32>(ty: QuantType, prec: Precision, w: &[u8], x: &[f32], cols: usize)
                -> Result<(), TestCaseError> {
                let mut all: Vec<A> = Vec::new();
                quantize_rows(x, cols, &mut all);
                let n = x.len() / cols;
                let per = all.len() / n;
                let mut want = vec![0.0f32; n * 16];
                for (ar, o) in all.chunks(per).zip(want.chunks_mut(16)) {
                    packed::group_scalar(ty, w, ar, o);
                }
                for k in supported_isas().into_iter().flat_map(|i| packed_kernels(i, prec)) {
                    let mut got = vec![-7.0f32; n * 16];
                    k.packed_group(ty, w, A::row(&all), n, &mut got);
                    prop_assert_eq!(
                        bits(&got), bits(&want), "{} {} {:?} amx {} n {}", ty, prec, k.isa(),
                        k.amx(), n
                    );
                    for (i, ar) in all.chunks(per).enumerate() {
                        let mut one = vec![0.0f32; 16];
                        k.packed_group(ty, w, A::row(ar), 1, &mut one);
                        prop_assert_eq!(bits(&one), bits(&want[i * 16..(i + 1) * 16]));
                    }
                }
                Ok(())
            }
            match prec {
                Precision::Int8 => go::<PairQ8>(ty, prec, w, &x, cols)?,
                Precision::Int8x2 => go::<PairQ8x2>(ty, prec, w, &x, cols)?,
            }
        }
    }
}

/// Matrices stored rotated (yomi's M and L formats with the block-32 Hadamard rotation, run as
/// Q4_1 and Q8_0 blocks): [`linear`] on the packed matrix rotates the input and multiplies,
/// against the reference twin (which rotates its own copy and accumulates in f64), within the
/// activation-rounding bound of the *rotated* input, at SmolLM2's shapes and a 4096-wide one.
#[test]
fn rotated_matrices_at_real_shapes() {
    use yomi_weights::{Rotation, YomiFormat, YomiMatrix};
    let cases: &[(YomiFormat, usize, usize, usize, &[usize])] = &[
        (YomiFormat::M, 32, 576, 576, &[1, 5, 16]),
        (YomiFormat::M, 64, 576, 1536, &[1, 16]),
        (YomiFormat::M, 128, 576, 1536, &[1, 3]),
        (YomiFormat::L, 32, 1536, 576, &[1, 9]),
        (YomiFormat::M, 64, 256, 4096, &[1, 2]),
    ];
    for (ci, &(fmt, group, rows, cols, ts)) in cases.iter().enumerate() {
        let mut rng = Rng(700 + ci as u64);
        let rot = Rotation::from_seed(ci as u64, cols);
        let mut wf = rng.vec(rows * cols);
        rot.apply(&mut wf);
        let q = YomiMatrix::quantize(fmt, group, rows, cols, &wf).to_ggml();
        let w = Matrix::new(rows, cols, WeightData::Quant(q.clone())).with_rotation(rot.clone());
        let p = PackedQuant::from_ggml(&q, rows, cols).expect("packable");
        let wp =
            Matrix::new(rows, cols, WeightData::Repacked(Arc::new(p))).with_rotation(rot.clone());
        for &t in ts {
            let x = random_acts(t * cols, &mut rng);
            let mut xr = x.clone();
            rot.apply(&mut xr);
            let mut want = vec![0.0; t * rows];
            linear_reference(&x, t, &w, None, &mut want);
            for m in [&w, &wp] {
                let mut got = vec![0.0; t * rows];
                linear(&x, t, m, None, &mut got);
                let mut buf = vec![0.0; cols];
                for r in 0..rows {
                    let wr = w.row_f32(r, &mut buf).to_vec();
                    for ti in 0..t {
                        let i = ti * rows + r;
                        let xrow = &xr[ti * cols..(ti + 1) * cols];
                        // The bound of the activation rounding, plus the f32 rounding of the
                        // rotation itself (five butterfly stages: ~1e-6 of |x|·|w|).
                        let norm: f64 =
                            wr.iter().zip(xrow).map(|(a, b)| (a * b).abs() as f64).sum();
                        let tol = act_bound(&wr, xrow, 32, Precision::current())
                            + 1.2e-7 * want[i].abs() as f64
                            + 2e-6 * norm;
                        assert!(
                            ((got[i] - want[i]) as f64).abs() <= tol,
                            "{fmt} g{group} [{rows}x{cols}] t {t}: row {r} step {ti}: {} vs {} (tol {tol})",
                            got[i],
                            want[i]
                        );
                    }
                }
            }
        }
    }
}
