//! Linear layers over T rows: `out[t, o] = Σ_i x[t, i] · W[o, i] (+ bias[o])`.
//!
//! Shapes: x [T, in] row-major, W [out, in] (PyTorch layout), out [T, out]. Batch one is
//! memory-bound, so the kernel streams each weight row **once** for all T rows: the row is
//! converted to f32 (when stored as bf16/f16) into a per-thread buffer and dotted with every
//! input row while it sits in L1. Output rows are split across the rayon pool.
//!
//! GGML block-quantized weights ([`WeightData::Quant`], or packed by [`quant::Pack`]) take the
//! integer path of [`crate::quant`]: the T input rows are quantized once per call (at the
//! process-wide [`crate::quant::Precision`]: by default int8×2, ~16-bit activations held as two
//! int8 planes; int8 for one plane with [`crate::CpuOptions::quant_act`]) and each weight row is
//! dotted with all of them in integer arithmetic. A repacked layout of another backend
//! ([`WeightData::Repacked`] that is no [`PackedQuant`]) takes the f32 path, one dequantized row
//! at a time.

use std::cell::RefCell;

use yomi_weights::{Matrix, Rotation, WeightData};

use crate::quant::{self, PackedQuant, packed::packed_of};
use crate::simd;

thread_local! {
    static ROTATED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static ROW_BUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static OUT_T: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Output rows per rayon task: big enough to amortise scheduling, small enough to balance.
const ROWS_PER_TASK: usize = 16;

/// out[T, rows] = x[T, cols] · Wᵀ (+ bias); a matrix stored rotated ([`Matrix::rotation`])
/// multiplies the rotated input.
pub fn linear(x: &[f32], t: usize, w: &Matrix, bias: Option<&[f32]>, out: &mut [f32]) {
    match &w.rotation {
        Some(r) => with_rotated(x, r, |x| linear_plain(x, t, w, bias, out)),
        None => linear_plain(x, t, w, bias, out),
    }
}

/// Runs `f` on a copy of `x` ([T, width] rows) rotated by `r`. The copy lives in a per-thread
/// buffer taken out for the call, so a nested call would allocate rather than fail.
fn with_rotated<R>(x: &[f32], r: &Rotation, f: impl FnOnce(&[f32]) -> R) -> R {
    let mut buf = ROTATED.with(|b| std::mem::take(&mut *b.borrow_mut()));
    buf.clear();
    buf.extend_from_slice(x);
    r.apply(&mut buf);
    let result = f(&buf);
    ROTATED.with(|b| *b.borrow_mut() = buf);
    result
}

/// How the inputs of several matrices of one input are rotated.
enum SharedRotation<'a> {
    /// No matrix is rotated.
    None,
    /// Every matrix has this rotation: the input turns once for all.
    All(&'a Rotation),
    /// Some differ: each matrix rotates its own copy.
    Mixed,
}

fn shared_rotation<'a>(ws: &[&'a Matrix]) -> SharedRotation<'a> {
    match ws.first().and_then(|w| w.rotation.as_ref()) {
        None if ws.iter().all(|w| w.rotation.is_none()) => SharedRotation::None,
        Some(r)
            if ws
                .iter()
                .all(|w| w.rotation.as_ref().is_some_and(|o| o.same_as(r))) =>
        {
            SharedRotation::All(r)
        }
        _ => SharedRotation::Mixed,
    }
}

/// [`linear`] of an input already rotated as the matrix needs (or of a matrix without one).
fn linear_plain(x: &[f32], t: usize, w: &Matrix, bias: Option<&[f32]>, out: &mut [f32]) {
    let (n_out, n_in) = (w.rows, w.cols);
    assert_eq!(x.len(), t * n_in, "linear: input is not [T, in]");
    assert_eq!(out.len(), t * n_out, "linear: output is not [T, out]");
    if let WeightData::Quant(q) = &w.data {
        quant::linear_quant(x, t, n_out, n_in, q, out);
    } else if let Some(p) = packed_of(w) {
        quant::linear_packed(x, t, p, out);
    } else if t == 1 {
        crate::pool::for_each_chunk_mut(out, ROWS_PER_TASK, 1, |ci, chunk| {
            ROW_BUF.with(|b| {
                let mut b = b.borrow_mut();
                b.resize(n_in, 0.0);
                for (k, o) in chunk.iter_mut().enumerate() {
                    let r = ci * ROWS_PER_TASK + k;
                    *o = simd::dot(w.row_f32(r, &mut b), x);
                }
            })
        });
    } else {
        // Compute into [out, T] so each task writes a contiguous block, then transpose.
        OUT_T.with(|ot| {
            let mut ot = ot.borrow_mut();
            ot.resize(n_out * t, 0.0);
            crate::pool::for_each_chunk_mut(&mut ot[..], ROWS_PER_TASK * t, 1, |ci, chunk| {
                ROW_BUF.with(|b| {
                    let mut b = b.borrow_mut();
                    b.resize(n_in, 0.0);
                    for (k, orow) in chunk.chunks_mut(t).enumerate() {
                        let r = ci * ROWS_PER_TASK + k;
                        let wr = w.row_f32(r, &mut b);
                        for (ti, o) in orow.iter_mut().enumerate() {
                            *o = simd::dot(wr, &x[ti * n_in..(ti + 1) * n_in]);
                        }
                    }
                })
            });
            for r in 0..n_out {
                for ti in 0..t {
                    out[ti * n_out + r] = ot[r * t + ti];
                }
            }
        });
    }
    if let Some(b) = bias {
        add_bias(out, n_out, b);
    }
}

/// The MLP's down projection of SwiGLU: `gate ← silu(gate) · up` ([`crate::activation::swiglu`])
/// and then `out = gate · Wᵀ (+ bias)`, bitwise those two calls. For packed weights the
/// elementwise step runs inside the linear's loop, each participant on the rows it quantizes
/// ([`quant::linear_packed_swiglu_with`]); otherwise (or for one row, which the loop could
/// not spread) the two calls as they are.
pub fn linear_swiglu(
    gate: &mut [f32],
    up: &[f32],
    t: usize,
    w: &Matrix,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    // One row is one chunk of the shared quantizer: nothing to spread, so the plain steps;
    // likewise when the input must be rotated between the two steps.
    let (true, Some(p), None) = (t > 1, packed_of(w), &w.rotation) else {
        crate::activation::swiglu(gate, up);
        linear(gate, t, w, bias, out);
        return;
    };
    assert_eq!(gate.len(), t * w.cols, "linear: input is not [T, in]");
    assert_eq!(out.len(), t * w.rows, "linear: output is not [T, out]");
    quant::linear_packed_swiglu_with(quant::Kernel::best(), gate, up, t, p, out);
    if let Some(b) = bias {
        add_bias(out, w.rows, b);
    }
}

/// `out[t][r] += bias[r]` for every row t of `out` ([T, n_out]).
fn add_bias(out: &mut [f32], n_out: usize, bias: &[f32]) {
    for row in out.chunks_mut(n_out) {
        for (o, b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
}

/// Several linears of one input, `outs[m] = x · ws[m]ᵀ (+ biases[m])` (e.g. q, k and v of an
/// attention layer, gate and up of an MLP): when every matrix is packed
/// ([`quant::Pack`]), the input is quantized once and all the matrices run in one
/// parallel loop ([`quant::linear_packed_many_with`]); otherwise one [`linear`] per matrix.
/// Either way each output is bitwise what [`linear`] gives for its matrix alone.
pub fn linear_many(
    x: &[f32],
    t: usize,
    ws: &[&Matrix],
    biases: &[Option<&[f32]>],
    outs: &mut [&mut [f32]],
) {
    check_many(x.len(), t, ws, biases, outs);
    match shared_rotation(ws) {
        SharedRotation::None => linear_many_plain(x, t, ws, biases, outs),
        SharedRotation::All(r) => with_rotated(x, r, |x| linear_many_plain(x, t, ws, biases, outs)),
        SharedRotation::Mixed => {
            for ((w, b), o) in ws.iter().zip(biases).zip(outs.iter_mut()) {
                linear(x, t, w, *b, o);
            }
        }
    }
}

/// [`linear_many`] of an input already rotated as every matrix needs.
fn linear_many_plain(
    x: &[f32],
    t: usize,
    ws: &[&Matrix],
    biases: &[Option<&[f32]>],
    outs: &mut [&mut [f32]],
) {
    let Some(packed) = packed_set(ws) else {
        for ((w, b), o) in ws.iter().zip(biases).zip(outs.iter_mut()) {
            linear_plain(x, t, w, *b, o);
        }
        return;
    };
    quant::linear_packed_many_with(quant::Kernel::best(), x, t, &packed[..ws.len()], outs);
    add_biases(ws, biases, outs);
}

/// [`linear_many`] of `x = rms_norm(h + add) · weight` ([`quant::AddNorm`]: a layer's residual
/// step and RMSNorm), leaving `h + add` in `h` and the normed rows in `x`, bitwise the serial
/// steps followed by [`linear_many`]. When every matrix is packed the two steps run inside the
/// linears' loop, each participant on the rows it quantizes (on the submitting thread they
/// cost ~30 µs per verify row and pass of SmolLM2-135M on the 2-vCPU dev VM while the pool
/// waited); otherwise (or for one row, which the loop could not spread) they run first, on
/// this thread.
pub fn linear_many_add_norm(
    input: quant::AddNorm<'_>,
    t: usize,
    ws: &[&Matrix],
    biases: &[Option<&[f32]>],
    outs: &mut [&mut [f32]],
) {
    check_many(input.x.len(), t, ws, biases, outs);
    // One row is one chunk of the shared quantizer: nothing to spread, so the serial steps;
    // likewise when the normed rows must be rotated before the products.
    let rotated = ws.iter().any(|w| w.rotation.is_some());
    let (true, Some(packed), false) = (t > 1, packed_set(ws), rotated) else {
        let mut input = input;
        input.run_serial();
        linear_many(input.x, t, ws, biases, outs);
        return;
    };
    let kernel = quant::Kernel::best();
    quant::linear_packed_many_add_norm_with(kernel, input, t, &packed[..ws.len()], outs);
    add_biases(ws, biases, outs);
}

/// One bias slot and one output per matrix, an input of `input_len = t · cols` values and
/// `t · rows` outputs per matrix.
fn check_many(
    input_len: usize,
    t: usize,
    ws: &[&Matrix],
    biases: &[Option<&[f32]>],
    outs: &[&mut [f32]],
) {
    assert!(
        ws.len() == outs.len() && ws.len() == biases.len(),
        "linear_many: {} matrices, {} biases, {} outputs",
        ws.len(),
        biases.len(),
        outs.len()
    );
    for (w, o) in ws.iter().zip(outs.iter()) {
        assert_eq!(input_len, t * w.cols, "linear: input is not [T, in]");
        assert_eq!(o.len(), t * w.rows, "linear: output is not [T, out]");
    }
}

/// The matrices as packed data when every one is packed, of one width and at most
/// [`quant::MAX_MANY`] (the slots past `ws.len()` repeat the first).
fn packed_set<'a>(ws: &[&'a Matrix]) -> Option<[&'a PackedQuant; quant::MAX_MANY]> {
    let fused = !ws.is_empty()
        && ws.len() <= quant::MAX_MANY
        && ws
            .iter()
            .all(|w| packed_of(w).is_some() && w.cols == ws[0].cols);
    if !fused {
        return None;
    }
    let first = packed_of(ws[0])?;
    Some(std::array::from_fn(|m| {
        ws.get(m).and_then(|w| packed_of(w)).unwrap_or(first)
    }))
}

fn add_biases(ws: &[&Matrix], biases: &[Option<&[f32]>], outs: &mut [&mut [f32]]) {
    for ((w, b), o) in ws.iter().zip(biases).zip(outs.iter_mut()) {
        if let Some(b) = b {
            add_bias(o, w.rows, b);
        }
    }
}

/// Reference twin of [`linear`]: plain loops, f64 accumulation (the input rotated first when
/// the matrix is stored rotated).
pub fn linear_reference(x: &[f32], t: usize, w: &Matrix, bias: Option<&[f32]>, out: &mut [f32]) {
    let (n_out, n_in) = (w.rows, w.cols);
    let mut rotated = x.to_vec();
    if let Some(r) = &w.rotation {
        r.apply(&mut rotated);
    }
    let x = &rotated[..];
    let mut buf = vec![0.0f32; n_in];
    for r in 0..n_out {
        let wr = w.row_f32(r, &mut buf).to_vec();
        for ti in 0..t {
            let mut s = 0.0f64;
            for i in 0..n_in {
                s += wr[i] as f64 * x[ti * n_in + i] as f64;
            }
            if let Some(b) = bias {
                s += b[r] as f64;
            }
            out[ti * n_out + r] = s as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Pack;
    use proptest::prelude::*;
    use yomi_weights::quant::{QuantData, QuantType, quantize_row};

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    fn check(rows: usize, cols: usize, t: usize, kind: u8, seed: u64) {
        let wf = rand_vec(rows * cols, seed);
        let data = match kind {
            0 => WeightData::F32(wf),
            1 => WeightData::Bf16(
                wf.iter()
                    .map(|v| half::bf16::from_f32(*v).to_bits())
                    .collect(),
            ),
            _ => WeightData::F16(
                wf.iter()
                    .map(|v| half::f16::from_f32(*v).to_bits())
                    .collect(),
            ),
        };
        let w = Matrix::new(rows, cols, data);
        let x = rand_vec(t * cols, seed + 1);
        let bias = rand_vec(rows, seed + 2);
        let mut a = vec![0.0; t * rows];
        let mut b = vec![0.0; t * rows];
        linear(&x, t, &w, Some(&bias), &mut a);
        linear_reference(&x, t, &w, Some(&bias), &mut b);
        // f32 accumulation of `cols` products of magnitude ≤ 0.25: error ~ 1e-7·sqrt(cols)·scale.
        let tol = 2e-6 * (cols as f32).sqrt();
        for (p, q) in a.iter().zip(&b) {
            assert!(
                (p - q).abs() <= tol,
                "{p} vs {q} (rows {rows} cols {cols} t {t})"
            );
        }
    }

    #[test]
    fn real_shapes() {
        // Qwen3.5-9B-like hidden 4096 → a slice of the 12288 FFN, T = 1 and a tree of 16.
        check(256, 4096, 1, 0, 1);
        check(256, 4096, 16, 1, 2);
        check(100, 576, 3, 2, 3);
    }

    /// A packed [rows, cols] matrix of type `ty` from random values.
    fn packed(ty: QuantType, rows: usize, cols: usize, seed: u64) -> Matrix {
        let wf = rand_vec(rows * cols, seed);
        let mut bytes = Vec::new();
        for r in wf.chunks(cols) {
            let mut row = Vec::new();
            quantize_row(ty, r, &mut row);
            bytes.extend_from_slice(&row);
        }
        let mut m = Matrix::new(rows, cols, WeightData::Quant(QuantData { ty, bytes }));
        m.pack();
        assert!(packed_of(&m).is_some(), "{ty:?} packs");
        m
    }

    /// Fused linears of one input give bitwise each matrix's own [`linear`]: SmolLM2's q/k/v
    /// (576, 192, 192 rows) and gate/up shapes, rows past the last whole group (a tail of 5),
    /// mixed types, biases, T = 1 (outputs written directly) and T > 1 (slab and transpose);
    /// and a set with an unpacked matrix falls back to one call per matrix.
    #[test]
    fn linear_many_is_bitwise_each_linear() {
        let cases: [(&[(QuantType, usize)], usize); 3] = [
            (
                &[
                    (QuantType::Q4_1, 576),
                    (QuantType::Q4_1, 192),
                    (QuantType::Q4_1, 192),
                ],
                576,
            ),
            (&[(QuantType::Q4_1, 1536), (QuantType::Q8_0, 1536)], 576),
            (
                &[
                    (QuantType::Q4_0, 69),
                    (QuantType::Q8_0, 16),
                    (QuantType::Q4_1, 5),
                ],
                128,
            ),
        ];
        for (ci, (mats, cols)) in cases.iter().enumerate() {
            let ws: Vec<Matrix> = mats
                .iter()
                .enumerate()
                .map(|(m, &(ty, rows))| packed(ty, rows, *cols, 10 * ci as u64 + m as u64))
                .collect();
            let biases: Vec<Vec<f32>> = ws.iter().map(|w| rand_vec(w.rows, 7)).collect();
            for t in [1, 3, 17] {
                let x = rand_vec(t * cols, 99 + t as u64);
                let mut want: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; t * w.rows]).collect();
                for ((w, b), o) in ws.iter().zip(&biases).zip(&mut want) {
                    linear(&x, t, w, Some(b), o);
                }
                let mut got: Vec<Vec<f32>> =
                    ws.iter().map(|w| vec![f32::NAN; t * w.rows]).collect();
                let refs: Vec<&Matrix> = ws.iter().collect();
                let bs: Vec<Option<&[f32]>> = biases.iter().map(|b| Some(&b[..])).collect();
                let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|o| &mut o[..]).collect();
                linear_many(&x, t, &refs, &bs, &mut outs);
                for (m, (g, w)) in got.iter().zip(&want).enumerate() {
                    let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "case {ci} matrix {m} T {t}: fused differs from its linear"
                    );
                }
            }
        }
        // An f32 matrix among them: one linear per matrix, same results.
        let (t, cols) = (2, 64);
        let q = packed(QuantType::Q4_1, 32, cols, 1);
        let f = Matrix::new(8, cols, WeightData::F32(rand_vec(8 * cols, 2)));
        let x = rand_vec(t * cols, 3);
        let (mut a, mut b) = (vec![0.0; t * 32], vec![0.0; t * 8]);
        linear_many(&x, t, &[&q, &f], &[None, None], &mut [&mut a, &mut b]);
        let (mut a2, mut b2) = (vec![0.0; t * 32], vec![0.0; t * 8]);
        linear(&x, t, &q, None, &mut a2);
        linear(&x, t, &f, None, &mut b2);
        assert!(a == a2 && b == b2);
    }

    /// The fused SwiGLU down projection gives bitwise `swiglu` then [`linear`], and leaves the
    /// gate as `swiglu` does: SmolLM2's down shape (576 × 1536) and a tail of rows past the last
    /// whole group, Q4_1 and Q8_0, T = 1, 3, 8 and 17, with a bias; and unpacked weights.
    #[test]
    fn linear_swiglu_is_bitwise_swiglu_then_linear() {
        let mats = [
            packed(QuantType::Q4_1, 576, 1536, 5),
            packed(QuantType::Q8_0, 21, 256, 6),
            Matrix::new(8, 64, WeightData::F32(rand_vec(8 * 64, 7))),
        ];
        for (mi, w) in mats.iter().enumerate() {
            let bias = rand_vec(w.rows, 8);
            for t in [1, 3, 8, 17] {
                let gate: Vec<f32> = rand_vec(t * w.cols, 50 + t as u64)
                    .iter()
                    .map(|v| v * 12.0)
                    .collect();
                let up = rand_vec(t * w.cols, 60 + t as u64);
                let mut want_gate = gate.clone();
                crate::activation::swiglu(&mut want_gate, &up);
                let mut want = vec![0.0; t * w.rows];
                linear(&want_gate, t, w, Some(&bias), &mut want);
                let mut got_gate = gate.clone();
                let mut got = vec![f32::NAN; t * w.rows];
                linear_swiglu(&mut got_gate, &up, t, w, Some(&bias), &mut got);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "matrix {mi} T {t}: outputs");
                assert_eq!(bits(&got_gate), bits(&want_gate), "matrix {mi} T {t}: gate");
            }
        }
    }

    /// The residual step and RMSNorm inside the linears' loop give bitwise the serial steps
    /// then [`linear_many`], and leave `h` and `x` as those do: SmolLM2's q/k/v and gate/up
    /// shapes at T = 1, 2, 8 and 17, with and without the added rows, and a set with an
    /// unpacked matrix (the serial fallback).
    #[test]
    fn linear_many_add_norm_is_bitwise_the_serial_steps() {
        let cols = 576;
        let sets: [Vec<Matrix>; 3] = [
            vec![
                packed(QuantType::Q4_1, 576, cols, 21),
                packed(QuantType::Q4_1, 192, cols, 22),
                packed(QuantType::Q4_1, 192, cols, 23),
            ],
            vec![
                packed(QuantType::Q4_1, 1536, cols, 24),
                packed(QuantType::Q8_0, 1536, cols, 25),
            ],
            vec![
                packed(QuantType::Q4_1, 40, cols, 26),
                Matrix::new(8, cols, WeightData::F32(rand_vec(8 * cols, 27))),
            ],
        ];
        let weight: Vec<f32> = rand_vec(cols, 28).iter().map(|v| 1.0 + v).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (si, ws) in sets.iter().enumerate() {
            let refs: Vec<&Matrix> = ws.iter().collect();
            let biases: Vec<Option<&[f32]>> = vec![None; ws.len()];
            for t in [1, 2, 8, 17] {
                for with_add in [false, true] {
                    let h0: Vec<f32> = rand_vec(t * cols, 30 + t as u64)
                        .iter()
                        .map(|v| v * 8.0)
                        .collect();
                    let add = rand_vec(t * cols, 40 + t as u64);
                    let add = with_add.then_some(&add[..]);
                    // Serial: h += add, x = rms_norm(h), then the linears.
                    let mut h_want = h0.clone();
                    if let Some(a) = add {
                        for (hv, av) in h_want.iter_mut().zip(a) {
                            *hv += av;
                        }
                    }
                    let mut x_want = vec![0.0; t * cols];
                    crate::norm::rms_norm(&h_want, &weight, 1e-5, &mut x_want);
                    let mut want: Vec<Vec<f32>> =
                        ws.iter().map(|w| vec![0.0; t * w.rows]).collect();
                    {
                        let mut outs: Vec<&mut [f32]> =
                            want.iter_mut().map(|o| &mut o[..]).collect();
                        linear_many(&x_want, t, &refs, &biases, &mut outs);
                    }
                    let mut h = h0.clone();
                    let mut x = vec![f32::NAN; t * cols];
                    let mut got: Vec<Vec<f32>> =
                        ws.iter().map(|w| vec![f32::NAN; t * w.rows]).collect();
                    {
                        let mut outs: Vec<&mut [f32]> =
                            got.iter_mut().map(|o| &mut o[..]).collect();
                        let input = quant::AddNorm {
                            h: &mut h,
                            add,
                            weight: &weight,
                            eps: 1e-5,
                            x: &mut x,
                        };
                        linear_many_add_norm(input, t, &refs, &biases, &mut outs);
                    }
                    let what = format!("set {si} T {t} add {with_add}");
                    assert_eq!(bits(&h), bits(&h_want), "{what}: h");
                    assert_eq!(bits(&x), bits(&x_want), "{what}: x");
                    for (m, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(bits(g), bits(w), "{what}: matrix {m}");
                    }
                }
            }
        }
    }

    /// Rotated matrices (yomi's formats) through the fused entry points: q/k/v sharing one
    /// rotation, a set with an unrotated or a differently rotated matrix, the SwiGLU down
    /// projection and the add+norm variant each give bitwise their plain [`linear`]s (which
    /// rotate the input themselves), at T = 1 and T = 9.
    #[test]
    fn rotated_matrices_through_every_entry_point() {
        use yomi_weights::Rotation;
        let cols = 576;
        let rot = Rotation::from_seed(1, cols);
        let rotated =
            |rows, seed| packed(QuantType::Q4_1, rows, cols, seed).with_rotation(rot.clone());
        let qkv = [rotated(576, 1), rotated(192, 2), rotated(192, 3)];
        let mixed = [
            rotated(64, 4),
            packed(QuantType::Q4_1, 32, cols, 5),
            packed(QuantType::Q8_0, 32, cols, 6).with_rotation(Rotation::from_seed(2, cols)),
        ];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for t in [1, 9] {
            let x = rand_vec(t * cols, 40 + t as u64);
            for set in [&qkv[..], &mixed[..]] {
                let refs: Vec<&Matrix> = set.iter().collect();
                let biases = vec![None; set.len()];
                let want: Vec<Vec<f32>> = set
                    .iter()
                    .map(|w| {
                        let mut o = vec![0.0; t * w.rows];
                        linear(&x, t, w, None, &mut o);
                        o
                    })
                    .collect();
                let mut got: Vec<Vec<f32>> =
                    set.iter().map(|w| vec![f32::NAN; t * w.rows]).collect();
                let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|o| &mut o[..]).collect();
                linear_many(&x, t, &refs, &biases, &mut outs);
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(bits(g), bits(w), "linear_many T {t}");
                }
                // The add+norm variant: serial steps, then the rotated products.
                let weight: Vec<f32> = rand_vec(cols, 9).iter().map(|v| 1.0 + v).collect();
                let mut h = x.clone();
                let mut xn = vec![f32::NAN; t * cols];
                let mut got: Vec<Vec<f32>> =
                    set.iter().map(|w| vec![f32::NAN; t * w.rows]).collect();
                let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|o| &mut o[..]).collect();
                let input = quant::AddNorm {
                    h: &mut h,
                    add: None,
                    weight: &weight,
                    eps: 1e-5,
                    x: &mut xn,
                };
                linear_many_add_norm(input, t, &refs, &biases, &mut outs);
                let mut normed = vec![0.0; t * cols];
                crate::norm::rms_norm(&x, &weight, 1e-5, &mut normed);
                assert_eq!(bits(&xn), bits(&normed), "add+norm rows T {t}");
                for (g, w) in got.iter().zip(set) {
                    let mut o = vec![0.0; t * w.rows];
                    linear(&normed, t, w, None, &mut o);
                    assert_eq!(bits(g), bits(&o), "linear_many_add_norm T {t}");
                }
            }
            // SwiGLU down projection of a rotated matrix.
            let down =
                packed(QuantType::Q4_1, 576, 1536, 7).with_rotation(Rotation::from_seed(1, 1536));
            let gate = rand_vec(t * 1536, 11);
            let up = rand_vec(t * 1536, 12);
            let mut want_gate = gate.clone();
            crate::activation::swiglu(&mut want_gate, &up);
            let mut want = vec![0.0; t * 576];
            linear(&want_gate, t, &down, None, &mut want);
            let mut got_gate = gate.clone();
            let mut got = vec![f32::NAN; t * 576];
            linear_swiglu(&mut got_gate, &up, t, &down, None, &mut got);
            assert_eq!(bits(&got), bits(&want), "linear_swiglu T {t}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn parity_random(rows in 1usize..70, cols in 1usize..300, t in 1usize..9, kind in 0u8..3, seed in 0u64..1000) {
            check(rows, cols, t, kind, seed);
        }
    }
}
