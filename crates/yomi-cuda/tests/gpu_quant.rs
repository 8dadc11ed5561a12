//! GPU tests and timing of the quantized GEMV and row gather (`kernels/gemv_quant.cu`). All
//! `#[ignore]`d; on a machine with a CUDA device:
//!
//! ```text
//! cargo test --release -p yomi-cuda --test gpu_quant -- --ignored --test-threads=1 --nocapture
//! ```
//!
//! Without a device every test fails (they test nothing there). Lines starting with `RESULT` are the
//! numbers to keep.
//!
//! Weights are random values quantized by yomi-weights' quantizer (`quantize_row`), at real
//! shapes: SmolLM2-135M's 576×1536 / 1536×576 and its 49152×576 vocabulary, 4096², FFN
//! 12288×4096 and 4096×12288 (the K-quants need whole 256-blocks, so they skip the shapes with
//! 576 columns, where from_ggml_blocks must refuse them), plus a ragged 1001×512 with a bias.
//!
//! Tolerance, GEMV: relative L2 error ‖gpu − ref‖/‖ref‖ < 1e-5 and max|Δ| ≤ 1e-4·max|ref|
//! against the f64 product of `dequantize_row(W)` with x. The kernels dequantize exactly (each
//! weight is GGML's value bit for bit, see the .cu header and the host-model unit test), so the
//! only error is the f32 summation of K ≤ 12288 products (per-lane chains of K/32 terms, then a
//! 32-way shuffle tree): a few 1e-7 relative for random data, with margin for the 1e-5 bound.
//! Gather: bit-exact against `dequantize_row`.

mod common;
use common::{Rng, dev, time_ms};

use cudarc::driver::CudaSlice;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use yomi_cuda::{DeviceMatrix, QuantFormat, WeightDtype, gemv_variant};
use yomi_weights::quant::{QuantType, dequantize_row, quantize_row};

fn cpu_type(f: QuantFormat) -> QuantType {
    QuantType::from_ggml_id(f.ggml_type()).expect("yomi-weights knows every QuantFormat")
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// GGUF bytes of a [rows, cols] matrix of random values (quantized on all cores, row chunks in
/// order, so the bytes are those of `QuantData::quantize`).
fn random_blocks(f: QuantFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let ty = cpu_type(f);
    let chunk = rows.div_ceil(threads());
    let parts: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..rows)
            .step_by(chunk)
            .map(|r0| {
                s.spawn(move || {
                    let r1 = (r0 + chunk).min(rows);
                    let mut rng = Rng::new(seed ^ (r0 as u64 + 1));
                    // Rows of different magnitudes, like real weights.
                    let mut out = Vec::new();
                    for _ in r0..r1 {
                        let scale = 0.05 + rng.f();
                        quantize_row(ty, &rng.vec(cols, scale), &mut out);
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    parts.concat()
}

/// `dequantize_row` of every row, on all cores.
fn dequantize_all(f: QuantFormat, rows: usize, cols: usize, bytes: &[u8]) -> Vec<f32> {
    let ty = cpu_type(f);
    let rb = bytes.len() / rows;
    let mut w = vec![0.0f32; rows * cols];
    let chunk = rows.div_ceil(threads());
    std::thread::scope(|s| {
        for (i, wc) in w.chunks_mut(chunk * cols).enumerate() {
            let b = &bytes[i * chunk * rb..];
            s.spawn(move || {
                for (j, row) in wc.chunks_mut(cols).enumerate() {
                    dequantize_row(ty, &b[j * rb..(j + 1) * rb], row);
                }
            });
        }
    });
    w
}

/// f64 reference out[t, o] = Σ_i x[t, i]·w[o, i] (+ bias), t < tmax, on all cores.
fn reference(w: &[f32], rows: usize, cols: usize, x: &[f32], tmax: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; rows * tmax]; // [o][t] while computing
    let chunk = rows.div_ceil(threads());
    std::thread::scope(|s| {
        for (i, oc) in out.chunks_mut(chunk * tmax).enumerate() {
            s.spawn(move || {
                for (j, o) in oc.chunks_mut(tmax).enumerate() {
                    let wr = &w[(i * chunk + j) * cols..(i * chunk + j + 1) * cols];
                    for (t, ot) in o.iter_mut().enumerate() {
                        let xr = &x[t * cols..(t + 1) * cols];
                        *ot = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    }
                }
            });
        }
    });
    out
}

struct Err {
    rel_l2: f64,
    max_abs: f64,
    max_ref: f64,
}

fn compare(gpu: &[f32], want: impl Fn(usize) -> f64) -> Err {
    let (mut num, mut den, mut max_abs, mut max_ref) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (i, &g) in gpu.iter().enumerate() {
        assert!(g.is_finite(), "non-finite GPU output at {i} (unwritten?)");
        let c = want(i);
        let d = (g as f64 - c).abs();
        num += d * d;
        den += c * c;
        max_abs = max_abs.max(d);
        max_ref = max_ref.max(c.abs());
    }
    Err {
        rel_l2: (num / den.max(1e-300)).sqrt(),
        max_abs,
        max_ref,
    }
}

const SHAPES: [(usize, usize); 7] = [
    (576, 1536),
    (1536, 576),
    (4096, 4096),
    (12288, 4096),
    (4096, 12288),
    (49152, 576),
    (1001, 512),
];

/// Past 32 rows `linear` takes the prefill GEMM (cuBLAS on bf16 planes W = hi + lo and
/// x = hi + lo; see src/gemm.rs): every format at SmolLM2's and 9B's shapes and a ragged one
/// with a bias, T = 100, against the same f64 reference. Tolerance: relative L2 ≤ 5e-5 and
/// max|Δ| ≤ 1e-4·max|ref| (both factors kept to about 16 significant bits; the bf16 GEMM with
/// exact weights measured 5e-6).
#[test]
#[ignore = "needs a CUDA device"]
fn quant_gemm_matches_f64_reference() {
    let d = dev();
    assert_eq!(
        d.gemm_route(),
        yomi_cuda::GemmRoute::Cublas,
        "this test is about the cuBLAS route (libcublas must load)"
    );
    let t = 100;
    let mut failures = Vec::new();
    for (si, &(rows, cols)) in [(576usize, 1536usize), (4096, 4096), (1001, 512)]
        .iter()
        .enumerate()
    {
        let mut r = Rng::new(300 + si as u64);
        let x = r.vec(t * cols, 1.0);
        let xd = d.upload(&x).unwrap();
        let with_bias = rows == 1001;
        let bias = r.vec(rows, 1.0);
        let bd = d.upload(&bias).unwrap();
        for f in QuantFormat::ALL {
            if !cols.is_multiple_of(f.block_size()) {
                continue;
            }
            let bytes = random_blocks(f, rows, cols, 17 + si as u64);
            let dm = DeviceMatrix::from_ggml_blocks(&d, rows, cols, f, &bytes).unwrap();
            let w = dequantize_all(f, rows, cols, &bytes);
            let want = reference(&w, rows, cols, &x, t);
            let mut out = d.upload(&vec![f32::NAN; t * rows]).unwrap();
            d.linear(&xd, t, &dm, with_bias.then_some(&bd), &mut out)
                .unwrap();
            let got = d.download(&out).unwrap();
            let e = compare(&got, |i| {
                let (tt, o) = (i / rows, i % rows);
                want[o * t + tt] + if with_bias { bias[o] as f64 } else { 0.0 }
            });
            println!(
                "RESULT parity quant-gemm {f} {rows}x{cols}{} T={t}: rel-L2 {:.2e} max|Δ| {:.2e} max|ref| {:.2e}",
                if with_bias { " +bias" } else { "" },
                e.rel_l2,
                e.max_abs,
                e.max_ref
            );
            if !(e.rel_l2 <= 5e-5 && e.max_abs <= 1e-4 * e.max_ref) {
                failures.push(format!("{f} {rows}x{cols}: rel {:.2e}", e.rel_l2));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn quant_linear_matches_f64_reference() {
    let d = dev();
    let ts = [1usize, 2, 3, 8, 16, 32];
    let mut failures = Vec::new();
    let mut worst = 0.0f64;
    for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
        let mut r = Rng::new(100 + si as u64);
        let x = r.vec(32 * cols, 1.0);
        let xd: Vec<CudaSlice<f32>> = ts
            .iter()
            .map(|&t| d.upload(&x[..t * cols]).unwrap())
            .collect();
        let with_bias = rows == 1001;
        let bias = r.vec(rows, 1.0);
        let bd = d.upload(&bias).unwrap();
        for f in QuantFormat::ALL {
            if !cols.is_multiple_of(f.block_size()) {
                let e = DeviceMatrix::from_ggml_blocks(&d, rows, cols, f, &[0u8; 16])
                    .err()
                    .expect("cols not whole blocks must be refused");
                assert!(e.to_string().contains("block size"), "{e}");
                println!(
                    "RESULT quant {f} {rows}x{cols}: refused (cols not whole blocks), as it must"
                );
                continue;
            }
            let bytes = random_blocks(f, rows, cols, 7 + si as u64);
            let dm = DeviceMatrix::from_ggml_blocks(&d, rows, cols, f, &bytes).unwrap();
            assert_eq!(dm.dtype, WeightDtype::Quant(f));
            assert_eq!(dm.size_bytes(), bytes.len(), "device bytes = GGUF bytes");
            let w = dequantize_all(f, rows, cols, &bytes);
            let want = reference(&w, rows, cols, &x, 32);
            for (ti, &t) in ts.iter().enumerate() {
                for (vi, variant) in gemv_variant(dm.dtype, t).into_iter().enumerate() {
                    let mut out = d.upload(&vec![f32::NAN; t * rows]).unwrap();
                    d.linear_variant(
                        &xd[ti],
                        t,
                        &dm,
                        with_bias.then_some(&bd),
                        &mut out,
                        Some(variant),
                    )
                    .unwrap();
                    let got = d.download(&out).unwrap();
                    let e = compare(&got, |i| {
                        let (tt, o) = (i / rows, i % rows);
                        want[o * 32 + tt] + if with_bias { bias[o] as f64 } else { 0.0 }
                    });
                    worst = worst.max(e.rel_l2);
                    if vi == 0 {
                        println!(
                            "RESULT parity quant {f} {rows}x{cols}{} T={t:<2} {variant:?}: rel-L2 {:.2e} max|Δ| {:.2e} max|ref| {:.2e}",
                            if with_bias { " +bias" } else { "" },
                            e.rel_l2,
                            e.max_abs,
                            e.max_ref
                        );
                    }
                    if !(e.rel_l2 < 1e-5 && e.max_abs <= 1e-4 * e.max_ref) {
                        failures.push(format!(
                            "{f} {rows}x{cols} T={t} {variant:?}: rel {:.2e} max {:.2e}",
                            e.rel_l2, e.max_abs
                        ));
                    }
                }
            }
            // `linear` (the default kernel) is what callers use: same result as variant 0.
            let mut a = d.alloc_zeros::<f32>(3 * rows).unwrap();
            let mut b = d.alloc_zeros::<f32>(3 * rows).unwrap();
            d.linear(&xd[2], 3, &dm, None, &mut a).unwrap();
            let v0 = gemv_variant(dm.dtype, 3)[0];
            d.linear_variant(&xd[2], 3, &dm, None, &mut b, Some(v0))
                .unwrap();
            assert_eq!(d.download(&a).unwrap(), d.download(&b).unwrap());
        }
    }
    println!("RESULT parity quant worst rel-L2 {worst:.2e} (bound 1e-5)");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn quant_bad_shapes_are_errors() {
    let d = dev();
    for f in QuantFormat::ALL {
        let (rows, cols) = (4, 2 * f.block_size());
        let n = f.tensor_bytes(rows, cols).unwrap();
        assert!(DeviceMatrix::from_ggml_blocks(&d, rows, cols, f, &vec![0; n - 2]).is_err());
        assert!(DeviceMatrix::from_ggml_blocks(&d, rows, cols + 8, f, &vec![0; n]).is_err());
        let dm = DeviceMatrix::from_ggml_blocks(&d, rows, cols, f, &vec![0; n]).unwrap();
        // Any T runs (more than 32 rows as a GEMM), but not into a short output.
        let x = d.upload(&vec![1.0f32; 33 * cols]).unwrap();
        let mut short_out = d.alloc_zeros::<f32>(33 * rows - 1).unwrap();
        assert!(
            d.linear(&x, 33, &dm, None, &mut short_out).is_err(),
            "T = 33, short output"
        );
        let x1 = d.upload(&vec![1.0f32; cols - 1]).unwrap();
        let mut o1 = d.alloc_zeros::<f32>(rows).unwrap();
        assert!(d.linear(&x1, 1, &dm, None, &mut o1).is_err(), "short x");
        let ids = d.upload(&[0i32, 1]).unwrap();
        let mut short = d.alloc_zeros::<f32>(cols).unwrap();
        assert!(
            d.dequantize_rows(&dm, &ids, &mut short).is_err(),
            "short out"
        );
    }
    // A dense matrix has nothing to dequantize.
    let dense = DeviceMatrix::from_f32(&d, 2, 4, &[0.0; 8]).unwrap();
    let ids = d.upload(&[0i32]).unwrap();
    let mut o = d.alloc_zeros::<f32>(4).unwrap();
    assert!(d.dequantize_rows(&dense, &ids, &mut o).is_err());
}

#[test]
#[ignore = "needs a CUDA device"]
fn quant_gather_is_exact() {
    let d = dev();
    for (si, &(rows, cols)) in [(49152usize, 576usize), (4096, 4096), (1001, 512)]
        .iter()
        .enumerate()
    {
        let mut r = Rng::new(500 + si as u64);
        let mut ids: Vec<i32> = (0..37).map(|_| (r.f() * rows as f32) as i32).collect();
        ids.extend([0, rows as i32 - 1, 5, 5]);
        let idd = d.upload(&ids).unwrap();
        for f in QuantFormat::ALL {
            if !cols.is_multiple_of(f.block_size()) {
                continue;
            }
            let bytes = random_blocks(f, rows, cols, 900 + si as u64);
            let dm = DeviceMatrix::from_ggml_blocks(&d, rows, cols, f, &bytes).unwrap();
            let mut out = d.upload(&vec![f32::NAN; ids.len() * cols]).unwrap();
            d.dequantize_rows(&dm, &idd, &mut out).unwrap();
            let got = d.download(&out).unwrap();
            let rb = bytes.len() / rows;
            let mut want = vec![0.0f32; cols];
            for (j, &id) in ids.iter().enumerate() {
                let id = id as usize;
                dequantize_row(cpu_type(f), &bytes[id * rb..(id + 1) * rb], &mut want);
                let g = &got[j * cols..(j + 1) * cols];
                for (i, (a, b)) in g.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{f} {rows}x{cols} id {id} col {i}: {a} vs {b}"
                    );
                }
            }
            // Ids outside the table give NaN rows, not out-of-bounds reads.
            let bad = d.upload(&[-1i32, rows as i32, 0]).unwrap();
            let mut o3 = d.alloc_zeros::<f32>(3 * cols).unwrap();
            d.dequantize_rows(&dm, &bad, &mut o3).unwrap();
            let g3 = d.download(&o3).unwrap();
            assert!(g3[..2 * cols].iter().all(|v| v.is_nan()));
            assert!(g3[2 * cols..].iter().all(|v| v.is_finite()));
            println!(
                "RESULT gather quant {f} {rows}x{cols}: {} rows bit-exact",
                ids.len()
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// Timing

/// Time per call and effective bandwidth of every quantized GEMV kernel at T = 1..32 on
/// 4096×4096 and 12288×4096 (and 4096×12288), against a device-to-device copy. Each round
/// launches on ≥ 3 copies of the matrix, ≥ 256 MB in all, so the 60 MB L2 cannot serve them.
/// GB/s counts the weight bytes (GGUF size) + x (f32) + out (f32). `YOMI_QUANT_BENCH=Q4_K,Q8_0`
/// limits the formats.
#[test]
#[ignore = "needs a CUDA device"]
fn z_quant_gemv_timing() {
    let d = dev();
    let n = 1usize << 28;
    let src = d.upload(&vec![1.0f32; n]).unwrap();
    let mut dst = d.alloc_zeros::<f32>(n).unwrap();
    let ms = time_ms(&d, 3, 20, || d.copy(&src, &mut dst).unwrap());
    let copy_gbs = 2.0 * (n * 4) as f64 / (ms * 1e-3) / 1e9;
    println!("RESULT copy d2d 1 GiB: {ms:.3} ms, {copy_gbs:.0} GB/s (read + write), median of 20");
    drop((src, dst));

    let only = std::env::var("YOMI_QUANT_BENCH").ok();
    let mut r = Rng::new(77);
    for f in QuantFormat::ALL {
        if let Some(o) = &only
            && !o.split(',').any(|s| s.eq_ignore_ascii_case(f.name()))
        {
            continue;
        }
        // `YOMI_QUANT_SHAPES=576x1536,1536x576` times other shapes (e.g. SmolLM2's).
        let shapes: Vec<(usize, usize)> = match std::env::var("YOMI_QUANT_SHAPES") {
            Ok(v) => v
                .split(',')
                .filter_map(|s| {
                    let (a, b) = s.split_once('x')?;
                    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
                })
                .collect(),
            Err(_) => vec![(4096, 4096), (12288, 4096), (4096, 12288)],
        };
        for (rows, cols) in shapes {
            let bytes = random_blocks(f, rows, cols, 3);
            let wbytes = bytes.len();
            let copies = (256usize << 20).div_ceil(wbytes).max(3);
            let mats: Vec<DeviceMatrix> = (0..copies)
                .map(|_| DeviceMatrix::from_ggml_blocks(&d, rows, cols, f, &bytes).unwrap())
                .collect();
            for t in [1usize, 2, 4, 8, 16, 32] {
                let xd = d.upload(&r.vec(t * cols, 1.0)).unwrap();
                let mut out = d.alloc_zeros::<f32>(t * rows).unwrap();
                let total = (wbytes + t * cols * 4 + t * rows * 4) as f64;
                for (vi, variant) in gemv_variant(WeightDtype::Quant(f), t)
                    .into_iter()
                    .enumerate()
                {
                    // The launches are captured in a CUDA graph, as the model's passes are, so
                    // a kernel of a few µs is timed rather than the host's launch rate.
                    d.linear_variant(&xd, t, &mats[0], None, &mut out, Some(variant))
                        .unwrap();
                    let stream = d.stream().clone();
                    stream
                        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                        .unwrap();
                    for m in &mats {
                        d.linear_variant(&xd, t, m, None, &mut out, Some(variant))
                            .unwrap();
                    }
                    let g = stream
                        .end_capture(CUgraphInstantiate_flags(0))
                        .unwrap()
                        .expect("a graph");
                    let per = time_ms(&d, 3, 30, || g.launch().unwrap()) / copies as f64;
                    let gbs = total / (per * 1e-3) / 1e9;
                    let tflops = 2.0 * (t * rows * cols) as f64 / (per * 1e-3) / 1e12;
                    println!(
                        "RESULT gemv {f} {rows}x{cols} T={t:<2} {:<18}{}: {:.2} µs {gbs:.0} GB/s = {:.0}% of copy, {tflops:.2} TFLOP/s",
                        format!("{variant:?}"),
                        if vi == 0 { " (default)" } else { "" },
                        per * 1e3,
                        100.0 * gbs / copy_gbs
                    );
                }
            }
        }
    }
}

/// The prefill GEMM on quantized weights (dequantize into bf16 planes + cuBLAS) against the
/// consecutive 32-row GEMV launches it replaces: 9B's gate|up shape, T = 512, per format.
#[test]
#[ignore = "needs a CUDA device"]
fn z_quant_gemm_timing() {
    let d = dev();
    let (rows, cols, t) = (12288usize, 4096usize, 512usize);
    let mut r = Rng::new(400);
    let xd = d.upload(&r.vec(t * cols, 1.0)).unwrap();
    let mut out = d.alloc_zeros::<f32>(t * rows).unwrap();
    let flop = 2.0 * (t * rows * cols) as f64;
    for f in QuantFormat::ALL {
        let bytes = random_blocks(f, rows, cols, 23);
        let dm = DeviceMatrix::from_ggml_blocks(&d, rows, cols, f, &bytes).unwrap();
        let gemm = time_ms(&d, 2, 10, || {
            d.linear(&xd, t, &dm, None, &mut out).unwrap();
        });
        let pieces = time_ms(&d, 2, 10, || {
            for off in (0..t).step_by(32) {
                d.linear(
                    &xd.slice(off * cols..(off + 32) * cols),
                    32,
                    &dm,
                    None,
                    &mut out.slice_mut(off * rows..(off + 32) * rows),
                )
                .unwrap();
            }
        });
        println!(
            "RESULT quant-gemm {f} {rows}x{cols} T={t}: GEMM {:.1} µs ({:.0} TFLOP/s) | 32-row GEMVs {:.1} µs ({:.0} TFLOP/s)",
            gemm * 1e3,
            flop / (gemm * 1e-3) / 1e12,
            pieces * 1e3,
            flop / (pieces * 1e-3) / 1e12
        );
    }
}
