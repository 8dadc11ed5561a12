//! Device-side candidate selection (kernels/topk.cu) against its CPU twin
//! (`yomi_core::sampling::top_candidates`) at Qwen3.5's vocabulary (248 320) and a 49 152 one,
//! for 1, 16 and 32 rows, on random rows with exact ties (also across blocks), −inf, ±0 and
//! rows with fewer finite values than K. All `#[ignore]`d: they need a CUDA device.
//!
//! Tolerances: the candidates (value bits and ids) are exact: the selection is a total order on
//! (value, id) and s = fl32(l · scale) is rounded alike on both sides. The normaliser differs
//! only by the f64 summation order and the two exp implementations (each within 1 ulp), so
//! |Δz| / z ≤ `top_p_tolerance(V)` / 2 (≈ 5.5e-11 at V = 248 320; see its derivation).

mod common;
use common::{Rng, dev};

use yomi_core::sampling::{top_candidates, top_p_tolerance};
use yomi_core::{Sampler, SamplerParams, TOP_CANDIDATES, TopRows};
use yomi_cuda::{CudaDevice, TOPK_ROW_WORDS, TopkScratch, unpack_top};

/// Row r of a test batch: four kinds, so every batch size sees ties, −inf and zeros.
fn make_row(rng: &mut Rng, v: usize, r: usize) -> Vec<f32> {
    let mut row = rng.vec(v, 20.0);
    match r % 4 {
        // Random, 2% −inf, 10% on a coarse grid (many exact ties below the top).
        0 => {
            for x in row.iter_mut() {
                let u = rng.f();
                if u < 0.02 {
                    *x = f32::NEG_INFINITY;
                } else if u < 0.12 {
                    *x = (*x * 2.0).round() / 2.0;
                }
            }
        }
        // 100 tokens share the maximum, spread over the whole row (every stage-1 block): the
        // candidates are the 64 lowest ids among them.
        1 => {
            for _ in 0..100 {
                let i = (rng.f() * v as f32) as usize % v;
                row[i] = 25.0;
            }
        }
        // Fewer finite values than K: the rest of the candidates are −inf, by id.
        2 => {
            row.fill(f32::NEG_INFINITY);
            for k in 0..10 {
                let i = (rng.f() * v as f32) as usize % v;
                row[i] = k as f32 - 3.0;
            }
        }
        // The maximum is zero, of both signs (totalOrder ranks +0 above −0).
        _ => {
            for x in row.iter_mut() {
                *x = -x.abs() - 1.0;
            }
            for k in 0..80 {
                let i = (rng.f() * v as f32) as usize % v;
                row[i] = if k % 2 == 0 { 0.0 } else { -0.0 };
            }
        }
    }
    row
}

/// Ranks `rows` on the device and returns the packed words and the unpacked rows.
fn rank(d: &CudaDevice, logits: &[f32], rows: usize, v: usize, scale: f32) -> (Vec<u32>, TopRows) {
    let buf = d.upload(logits).unwrap();
    let mut scratch = TopkScratch::new(d, 32, v).unwrap();
    d.topk_rows(&buf, rows, scale, &mut scratch).unwrap();
    let words = d
        .download(&scratch.out.slice(0..rows * TOPK_ROW_WORDS))
        .unwrap();
    let mut top = TopRows::default();
    top.clear(v, scale);
    unpack_top(&words, &mut top);
    (words, top)
}

#[test]
#[ignore = "needs a CUDA device"]
fn topk_kernel_matches_the_cpu_twin() {
    let d = dev();
    for v in [248_320usize, 49_152] {
        for rows in [1usize, 16, 32] {
            let mut rng = Rng::new((v + rows) as u64);
            let logits: Vec<f32> = (0..rows).flat_map(|r| make_row(&mut rng, v, r)).collect();
            for scale in [1.0f32, 1.0 / 0.7] {
                let (words, top) = rank(&d, &logits, rows, v, scale);
                assert_eq!(top.rows(), rows);
                let mut worst = 0.0f64;
                let mut want = Vec::new();
                for r in 0..rows {
                    let row = &logits[r * v..(r + 1) * v];
                    let z = top_candidates(row, scale, TOP_CANDIDATES, &mut want);
                    let got = top.row(r);
                    let bits = |c: &[(f32, u32)]| -> Vec<(u32, u32)> {
                        c.iter().map(|&(s, i)| (s.to_bits(), i)).collect()
                    };
                    assert_eq!(
                        bits(got.cands),
                        bits(&want),
                        "V {v} rows {rows} scale {scale} row {r}: candidates"
                    );
                    let rel = (got.sum_exp - z).abs() / z;
                    worst = worst.max(rel);
                    assert!(
                        rel <= top_p_tolerance(v) / 2.0,
                        "V {v} rows {rows} row {r}: normaliser {} vs {z} (rel {rel:.2e})",
                        got.sum_exp
                    );
                }
                // Deterministic: the same input gives the same words.
                let (again, _) = rank(&d, &logits, rows, v, scale);
                assert_eq!(words, again, "V {v} rows {rows}: a second run differs");
                println!(
                    "RESULT topk V {v} rows {rows} scale {scale:.3}: candidates exact, normaliser max rel Δ {worst:.2e}, deterministic"
                );
            }
        }
    }
}

/// Sampling from the device's candidates equals sampling the full rows, and decides what it
/// should (greedy and top-k always on these rows; plain temperature never).
#[test]
#[ignore = "needs a CUDA device"]
fn sampling_from_gpu_candidates_equals_full_rows() {
    let d = dev();
    let v = 248_320;
    let rows = 32;
    let mut rng = Rng::new(7);
    // Peaked rows (a softmax that puts most mass on a few tokens, as LLM rows do).
    let logits: Vec<f32> = (0..rows * v)
        .map(|i| {
            let x = rng.f();
            let j = i % v;
            if j % 4099 == (i / v) % 7 {
                12.0 + 4.0 * x
            } else {
                8.0 * x - 4.0
            }
        })
        .collect();
    let params = [
        ("greedy", SamplerParams::greedy(), Some(rows)),
        (
            "t0.7 top-p 0.9",
            SamplerParams {
                temperature: 0.7,
                top_p: 0.9,
                seed: 1,
                ..Default::default()
            },
            None,
        ),
        (
            "t0.8 top-k 40",
            SamplerParams {
                temperature: 0.8,
                top_k: 40,
                seed: 2,
                ..Default::default()
            },
            Some(rows),
        ),
        (
            "t1.0",
            SamplerParams {
                temperature: 1.0,
                seed: 3,
                ..Default::default()
            },
            Some(0),
        ),
    ];
    for (name, p, want_decided) in params {
        let (_, top) = rank(&d, &logits, rows, v, p.logit_scale());
        let mut s = Sampler::new(p);
        let mut decided = 0;
        for r in 0..rows {
            let pos = 1000 + r as u64;
            if let Some(t) = s.sample_from_top(&top.row(r), pos) {
                assert_eq!(
                    t,
                    s.sample(&logits[r * v..(r + 1) * v], pos),
                    "{name} row {r}"
                );
                decided += 1;
            }
        }
        println!("RESULT topk sampling {name}: {decided}/{rows} rows decided by candidates");
        if let Some(w) = want_decided {
            assert_eq!(decided, w, "{name}");
        }
    }
}
