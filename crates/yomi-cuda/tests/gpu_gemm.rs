//! The tensor-core GEMM of prefill chunks (`kernels/gemm.cu`) against the CPU twin, the GEMV
//! and cuBLAS. `#[ignore]`d: they need a CUDA device (see `tests/gpu.rs` for how to run them).
//!
//! Tolerances (weights bf16, inputs of magnitude ≲ 1, the CPU twin sums f32 in its own order):
//! - with x's low bf16 plane (the default): relative L2 ≤ 5e-5 and max |Δ| ≤ 1e-4·max|cpu|
//!   (about 16 significant bits of x are kept; each output is one f32 accumulator chain over K,
//!   so the error grows with K: H200, 2026-12-01, 9e-6 at K = 4096, 2.8e-5 at K = 12288,
//!   against the GEMV's 4e-6, whose warps split K);
//! - without it (bf16 activations): relative L2 ≤ 5e-3 (x rounded to 8 significant bits:
//!   2⁻⁹ relative per product, random signs, ≈ 1.5e-3 expected).

mod common;
use common::{Rng, dev, poisoned, time_ms};

use yomi_cpu::linear::linear as cpu_linear;
use yomi_cuda::{CudaDevice, DeviceMatrix, GEMM_MIN_ROWS, GateUpMatrix, GemmRoute, WeightDtype};
use yomi_weights::{Matrix, WeightData};

const ROUTES: [GemmRoute; 2] = [GemmRoute::Cublas, GemmRoute::Kernel];

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|x| half::bf16::from_f32(*x).to_bits())
        .collect()
}

fn rel_l2(got: &[f32], want: &[f32]) -> (f64, f32, f32) {
    let (mut num, mut den, mut max_abs, mut max_ref) = (0.0f64, 0.0f64, 0.0f32, 0.0f32);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite GPU output (unwritten element?)");
        num += ((g - w) as f64).powi(2);
        den += (w as f64).powi(2);
        max_abs = max_abs.max((g - w).abs());
        max_ref = max_ref.max(w.abs());
    }
    ((num / den.max(1e-300)).sqrt(), max_abs, max_ref)
}

/// Every shape class: 9B's q/o-like 4096², gate/up 12288×4096, down 4096×12288, and a ragged
/// one (rows not a multiple of the 128-row block, K not of the 64-wide stage) with a bias; T
/// from one row past the GEMV's 32 to a 512-row chunk, ragged counts included.
#[test]
#[ignore = "needs a CUDA device"]
fn gemm_matches_cpu() {
    let d = dev();
    let mut r = Rng::new(12);
    let mut failures = Vec::new();
    for (rows, cols, with_bias) in [
        (4096usize, 4096usize, false),
        (12288, 4096, false),
        (4096, 12288, false),
        (1001, 4104, true),
        (72, 40, true),
    ] {
        let w = r.vec(rows * cols, 0.5);
        let bits = bf16_bits(&w);
        let cm = Matrix::new(rows, cols, WeightData::Bf16(bits.clone()));
        let dm = DeviceMatrix::from_half_bits(&d, rows, cols, WeightDtype::Bf16, &bits).unwrap();
        let bias = r.vec(rows, 1.0);
        let bd = d.upload(&bias).unwrap();
        let b = with_bias.then_some(&bd);
        for t in [33usize, 64, 100, 512] {
            let x = r.vec(t * cols, 1.0);
            let mut want = vec![0.0; t * rows];
            cpu_linear(&x, t, &cm, with_bias.then_some(&bias[..]), &mut want);
            let xd = d.upload(&x).unwrap();
            for route in ROUTES {
                for lo in [true, false] {
                    let mut out = poisoned(&d, t * rows);
                    d.gemm_bf16(&xd, t, &dm, b, &mut out, lo, route).unwrap();
                    let (rel, max_abs, max_ref) = rel_l2(&d.download(&out).unwrap(), &want);
                    println!(
                        "RESULT parity gemm {route:?} {rows}x{cols} T={t:<3} {} {}: max|Δ| {max_abs:.2e} rel-L2 {rel:.2e} max|ref| {max_ref:.2e}",
                        if lo { "hi+lo" } else { "hi   " },
                        if with_bias { "+bias" } else { "     " }
                    );
                    let ok = if lo {
                        rel <= 5e-5 && max_abs <= 1e-4 * max_ref
                    } else {
                        rel <= 5e-3
                    };
                    if !ok {
                        failures.push(format!(
                            "{route:?} {rows}x{cols} T={t} lo={lo}: rel {rel} max {max_abs}"
                        ));
                    }
                }
            }
            // `linear`: the GEMM from GEMM_MIN_ROWS rows on (with the default planes), 32-row
            // GEMVs below; either within the GEMM's bound.
            let mut out = poisoned(&d, t * rows);
            d.linear(&xd, t, &dm, b, &mut out).unwrap();
            let (rel, _, _) = rel_l2(&d.download(&out).unwrap(), &want);
            if rel > 5e-5 {
                failures.push(format!("linear {rows}x{cols} T={t}: rel {rel}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Bad shapes are errors, not crashes.
    let dm = DeviceMatrix::from_half_bits(&d, 8, 16, WeightDtype::Bf16, &[0; 128]).unwrap();
    let xd = d.upload(&[1.0f32; 40 * 16]).unwrap();
    let mut out = d.alloc_zeros::<f32>(41 * 8).unwrap();
    assert!(
        d.gemm_bf16(&xd, 40, &dm, None, &mut out, true, GemmRoute::Kernel)
            .is_err()
    );
    assert!(d.linear(&xd, 40, &dm, None, &mut out).is_err());
}

/// On both routes, the GEMM's SwiGLU over the interleaved gate|up matrix gives exactly what the
/// GEMM over the stacked [gate; up] matrix followed by `swiglu_pair` gives (every row is
/// summed alike wherever it sits): 9B's MLP and a small odd shape with a bias, T = 33, 100,
/// 512; and `linear_swiglu` from GEMM_MIN_ROWS rows on is one of them (its 32-row GEMVs below
/// agree within the GEMM's bound).
#[test]
#[ignore = "needs a CUDA device"]
fn gemm_swiglu_matches_gemm_then_swiglu_pair() {
    let d = dev();
    let mut r = Rng::new(13);
    for (inter, k, with_bias) in [(12288usize, 4096usize, false), (40, 72, true)] {
        let gate = bf16_bits(&r.vec(inter * k, 0.05));
        let up = bf16_bits(&r.vec(inter * k, 0.05));
        let stacked = DeviceMatrix::from_half_bits(
            &d,
            2 * inter,
            k,
            WeightDtype::Bf16,
            &[gate.as_slice(), up.as_slice()].concat(),
        )
        .unwrap();
        let gu = GateUpMatrix::from_bf16_bits(&d, inter, k, &gate, &up).unwrap();
        let bias = with_bias.then(|| d.upload(&r.vec(2 * inter, 0.5)).unwrap());
        for t in [33usize, 100, 512] {
            let x = d.upload(&r.vec(t * k, 1.0)).unwrap();
            let mut outs = Vec::new();
            for route in ROUTES {
                let mut proj = poisoned(&d, t * 2 * inter);
                let mut want = poisoned(&d, t * inter);
                d.gemm_bf16(&x, t, &stacked, bias.as_ref(), &mut proj, true, route)
                    .unwrap();
                d.swiglu_pair(&proj, t, inter, &mut want).unwrap();
                let mut got = poisoned(&d, t * inter);
                d.gemm_bf16_swiglu(&x, t, &gu, bias.as_ref(), &mut got, true, route)
                    .unwrap();
                let (got, want) = (d.download(&got).unwrap(), d.download(&want).unwrap());
                assert!(got.iter().all(|v| v.is_finite()), "unwritten output");
                let bad = got
                    .iter()
                    .zip(&want)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(
                    bad.is_none(),
                    "{route:?} I={inter} T={t}: first difference at {bad:?}"
                );
                println!(
                    "RESULT gemm swiglu {route:?} I={inter} K={k} bias {with_bias} T={t}: bit-identical to gemm + swiglu_pair"
                );
                outs.push((route, got));
            }
            let mut lin = poisoned(&d, t * inter);
            d.linear_swiglu(&x, t, &gu, bias.as_ref(), &mut lin)
                .unwrap();
            let lin = d.download(&lin).unwrap();
            let route = d.gemm_route();
            let gemm_out = &outs.iter().find(|(r, _)| *r == route).expect("route ran").1;
            if t >= GEMM_MIN_ROWS {
                let same = gemm_out
                    .iter()
                    .zip(&lin)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "linear_swiglu T={t} is not the {route:?} route's result"
                );
            } else {
                // 32-row GEMV launches: the same values within the GEMM's hi+lo bound.
                let (rel, _, _) = rel_l2(&lin, gemm_out);
                assert!(
                    rel <= 5e-5,
                    "linear_swiglu T={t} (GEMVs) against the GEMM: rel {rel}"
                );
            }
        }
    }
}

fn time_round(d: &CudaDevice, f: &mut dyn FnMut()) -> f64 {
    time_ms(d, 3, 15, f)
}

/// The GEMM's time per matrix at 9B shapes and chunk sizes 128…2048, as TFLOP/s (useful
/// products: 2·N·K·T), both routes with and without the lo plane (the cuBLAS route's time
/// includes the unpack of the weights and the split of x), beside the consecutive 32-row GEMV
/// launches it replaces and a bare `cublasGemmEx` (bf16 in and out, f32 compute) on a resident
/// row-major copy of the same weights, in the same process.
#[test]
#[ignore = "needs a CUDA device"]
fn z_gemm_timing() {
    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
    let d = dev();
    let blas = CudaBlas::new(d.stream().clone()).unwrap();
    let mut r = Rng::new(14);
    for (rows, cols) in [(4096usize, 4096usize), (12288, 4096), (4096, 12288)] {
        let w = r.vec(rows * cols, 0.5);
        let bits = bf16_bits(&w);
        let dm = DeviceMatrix::from_half_bits(&d, rows, cols, WeightDtype::Bf16, &bits).unwrap();
        let wb: Vec<half::bf16> = bits.iter().map(|&b| half::bf16::from_bits(b)).collect();
        let wrow = d.upload(&wb).unwrap();
        for t in [128usize, 512, 2048] {
            let x = r.vec(t * cols, 1.0);
            let xd = d.upload(&x).unwrap();
            let xb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let xbd = d.upload(&xb).unwrap();
            let mut out = d.alloc_zeros::<f32>(t * rows).unwrap();
            let mut outb = d.alloc_zeros::<half::bf16>(t * rows).unwrap();
            let flop = 2.0 * (t * rows * cols) as f64;
            let tf = |ms: f64| flop / (ms * 1e-3) / 1e12;
            let mut run = |lo: bool, route: GemmRoute| {
                time_round(&d, &mut || {
                    d.gemm_bf16(&xd, t, &dm, None, &mut out, lo, route).unwrap()
                })
            };
            let (khl, kh) = (run(true, GemmRoute::Kernel), run(false, GemmRoute::Kernel));
            let (chl, ch) = (run(true, GemmRoute::Cublas), run(false, GemmRoute::Cublas));
            let gemv = time_round(&d, &mut || {
                for off in (0..t).step_by(32) {
                    let n = (t - off).min(32);
                    d.linear(
                        &xd.slice(off * cols..(off + n) * cols),
                        n,
                        &dm,
                        None,
                        &mut out.slice_mut(off * rows..(off + n) * rows),
                    )
                    .unwrap()
                }
            });
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_T,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: rows as i32,
                n: t as i32,
                k: cols as i32,
                alpha: half::bf16::ONE,
                lda: cols as i32,
                ldb: cols as i32,
                beta: half::bf16::ZERO,
                ldc: rows as i32,
            };
            let cublas = time_round(&d, &mut || {
                // SAFETY: W [rows, cols] and x [t, cols] row-major bf16, out [t, rows].
                unsafe { blas.gemm(cfg, &wrow, &xbd, &mut outb) }.unwrap()
            });
            let f = |ms: f64| format!("{:.1} µs {:.0} TFLOP/s", ms * 1e3, tf(ms));
            println!(
                "RESULT gemm {rows}x{cols} T={t:<4}: cuBLAS route hi+lo {} | hi {} || kernel hi+lo {} | hi {} || 32-row GEMVs {} || bare cublasGemmEx bf16 {}",
                f(chl),
                f(ch),
                f(khl),
                f(kh),
                f(gemv),
                f(cublas)
            );
        }
    }
}
