//! GPU parity tests (and a timing) of the tree-aware ops: attention over the KV cache with the tree
//! mask and the tree conv1d. All `#[ignore]`d: they need a CUDA device. Without one each test
//! prints why and returns. On the lent H200:
//!
//! ```text
//! cargo test --release -p yomi-cuda --test gpu_attn -- --ignored --test-threads=1 --nocapture
//! ```
//!
//! Each op is compared with its yomi-cpu twin on random inputs at real shapes; outputs are
//! poisoned with NaN before each launch (an unwritten element fails) and the cache rows after the
//! live ones are NaN too (a read past committed + T fails). Lines starting with `RESULT` are the
//! numbers to keep.
//!
//! Tolerances:
//! - attention: max |Δ| ≤ 1e-4 · max|cpu| (the output scale of the case). Both sides are f32 and
//!   differ only in summation order (dot products in 32 lane-strided parts, keys in split chunks
//!   merged by rescaling) and in expf vs Rust's exp (≤ 2 ulp); the expected error is ~1e-6 of the
//!   output scale. The scale is the output's, not V's, because at long contexts the output (an
//!   average of thousands of random V rows) is ~30× smaller than V and a V-relative bound would
//!   hide errors;
//! - conv: max |Δ| ≤ 1e-5 · max(1, max|cpu|): the GPU sums the K products in the CPU's order with
//!   separately rounded products and adds, so only expf and the division in silu can differ;
//!   the windows are copies and must be bit-identical.

mod common;
use common::{Rng, dev, poisoned, time_ms};

use cudarc::driver::CudaSlice;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use yomi_core::TreeBatch;
use yomi_cpu::attention::{AttnShape, KvLayout, attention_tree as cpu_attention};
use yomi_cpu::conv::conv1d_tree as cpu_conv;
use yomi_cuda::{AttnDims, AttnScratch, CudaDevice, ancestor_bits};

/// A random tree in topological order: mostly deep (parent i−1), sometimes a branch.
fn random_tree(t: usize, seed: u64) -> Vec<i32> {
    let mut r = Rng::new(seed);
    (0..t)
        .map(|i| match i {
            0 => -1,
            _ if r.f() < 0.6 => i as i32 - 1,
            _ => (r.f() * i as f32) as i32,
        })
        .collect()
}

fn chain(t: usize) -> Vec<i32> {
    (0..t as i32).map(|i| i - 1).collect()
}

/// Chains for every T, random trees for T > 1.
fn tree_cases(ts: &[usize], seed: u64) -> Vec<(String, Vec<i32>)> {
    let mut v = Vec::new();
    for &t in ts {
        v.push((format!("chain T={t}"), chain(t)));
        if t > 1 {
            v.push((format!("tree T={t}"), random_tree(t, seed + t as u64)));
        }
    }
    v
}

struct Err {
    max_abs: f32,
    max_ref: f32,
}

fn compare(gpu: &[f32], cpu: &[f32]) -> Err {
    assert_eq!(gpu.len(), cpu.len());
    let mut e = Err {
        max_abs: 0.0,
        max_ref: 0.0,
    };
    for (&g, &c) in gpu.iter().zip(cpu) {
        assert!(g.is_finite(), "non-finite GPU output (unwritten element?)");
        e.max_abs = e.max_abs.max((g - c).abs());
        e.max_ref = e.max_ref.max(c.abs());
    }
    e
}

const QWEN: AttnDims = AttnDims {
    n_heads: 16,
    n_kv: 4,
    head_dim: 256,
};
const LLAMA: AttnDims = AttnDims {
    n_heads: 32,
    n_kv: 8,
    head_dim: 128,
};
const SMOL: AttnDims = AttnDims {
    n_heads: 9,
    n_kv: 3,
    head_dim: 64,
};
const CAP: usize = 8192 + 64;

fn cpu_shape(d: AttnDims) -> AttnShape {
    AttnShape {
        n_heads: d.n_heads,
        n_kv: d.n_kv,
        head_dim: d.head_dim,
    }
}

/// One attention case on the device and the CPU; returns (gpu, cpu) outputs.
#[allow(clippy::too_many_arguments)]
fn run_attention(
    d: &CudaDevice,
    dims: AttnDims,
    k: &[f32],
    v: &[f32],
    q: &[f32],
    committed: usize,
    tree: &TreeBatch,
    scale: f32,
    scratch: &mut AttnScratch,
) -> (Vec<f32>, Vec<f32>) {
    let t = tree.len();
    let row = dims.n_kv * dims.head_dim;
    let mut want = vec![0.0; q.len()];
    cpu_attention(
        q,
        k,
        v,
        KvLayout::RowMajor,
        committed,
        tree,
        cpu_shape(dims),
        scale,
        &mut want,
    );
    // Rows past the live ones are NaN on the device: reading one would show in the output.
    let live = (committed + t) * row;
    let poison_tail = |x: &[f32]| {
        let mut y = x.to_vec();
        y[live..].fill(f32::NAN);
        d.upload(&y).unwrap()
    };
    let (kd, vd) = (poison_tail(k), poison_tail(v));
    let mut bits = Vec::new();
    let words = ancestor_bits(tree, &mut bits);
    let ad = d.upload(&bits).unwrap();
    let cd = d.upload(&[committed as i32]).unwrap();
    let qd = d.upload(q).unwrap();
    let mut out = poisoned(d, q.len());
    d.attention_tree(
        &qd, &kd, &vd, &cd, t, &ad, words, dims, scale, CAP, scratch, &mut out,
    )
    .unwrap();
    (d.download(&out).unwrap(), want)
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_tree_matches_cpu() {
    let d = dev();
    // Each shape with the SIMT kernel only, then with the tensor-core kernel from one row on.
    let cases = [QWEN, LLAMA, SMOL]
        .into_iter()
        .flat_map(|dims| [(dims, None), (dims, Some(1))]);
    for (di, (dims, tc)) in cases.enumerate() {
        let mut r = Rng::new(10 + di as u64);
        let row = dims.n_kv * dims.head_dim;
        let (k, v) = (r.vec(CAP * row, 1.0), r.vec(CAP * row, 1.0));
        let mut scratch = AttnScratch::with_kernels(&d, 32, dims, CAP, tc).unwrap();
        assert_eq!(
            scratch.shape().mma_from,
            tc,
            "{dims:?}: tensor cores unavailable"
        );
        let scale = 1.0 / (dims.head_dim as f32).sqrt();
        let mut worst = 0.0f32;
        for committed in [0usize, 1, 100, 1000, 8000] {
            for (ci, (name, parents)) in tree_cases(&[1, 4, 16, 32], 40).into_iter().enumerate() {
                let tree = TreeBatch::from_parents(&parents).unwrap();
                let t = tree.len();
                let q = r.vec(t * dims.n_heads * dims.head_dim, 2.0);
                let (got, want) =
                    run_attention(&d, dims, &k, &v, &q, committed, &tree, scale, &mut scratch);
                let e = compare(&got, &want);
                let rel = e.max_abs / e.max_ref;
                worst = worst.max(rel);
                let p = scratch.plan(t);
                let case = format!(
                    "{}/{} heads of {} committed={committed} {name} ({}, splits {}, tiles {}, {}x{} warps)",
                    dims.n_heads,
                    dims.n_kv,
                    dims.head_dim,
                    if p.tensor_cores { "mma" } else { "simt" },
                    p.splits,
                    p.row_tiles,
                    p.q_groups,
                    p.k_groups
                );
                if ci == 0 || rel > 1e-5 {
                    println!(
                        "RESULT parity attention {case}: max|Δ| {:.2e} max|ref| {:.2e} rel {rel:.2e}",
                        e.max_abs, e.max_ref
                    );
                }
                assert!(
                    e.max_abs <= 1e-4 * e.max_ref,
                    "{case}: max |Δ| {} vs max |ref| {}",
                    e.max_abs,
                    e.max_ref
                );
            }
        }
        println!(
            "RESULT parity attention {}/{} heads of {} (tensor cores from rows {tc:?}): worst max|Δ|/max|ref| {worst:.2e} over all cases",
            dims.n_heads, dims.n_kv, dims.head_dim
        );
    }
}

/// Peaked softmax (scores of tens): the running max and the rescaling across splits matter.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_tree_matches_cpu_with_peaked_scores() {
    let d = dev();
    let dims = QWEN;
    let mut r = Rng::new(3);
    let row = dims.n_kv * dims.head_dim;
    let (k, v) = (r.vec(CAP * row, 1.0), r.vec(CAP * row, 1.0));
    let scale = 8.0 / (dims.head_dim as f32).sqrt();
    for (tc, committed) in [None, Some(1)]
        .into_iter()
        .flat_map(|tc| [0usize, 1000, 8000].map(|c| (tc, c)))
    {
        let mut scratch = AttnScratch::with_kernels(&d, 32, dims, CAP, tc).unwrap();
        assert_eq!(scratch.shape().mma_from, tc, "tensor cores unavailable");
        for (name, parents) in tree_cases(&[1, 16], 50) {
            let tree = TreeBatch::from_parents(&parents).unwrap();
            let q = r.vec(tree.len() * dims.n_heads * dims.head_dim, 2.0);
            let (got, want) =
                run_attention(&d, dims, &k, &v, &q, committed, &tree, scale, &mut scratch);
            let e = compare(&got, &want);
            println!(
                "RESULT parity attention peaked (tensor cores from rows {tc:?}) committed={committed} {name}: max|Δ| {:.2e} max|ref| {:.2e}",
                e.max_abs, e.max_ref
            );
            assert!(
                e.max_abs <= 1e-4 * e.max_ref,
                "{name} committed={committed}"
            );
        }
    }
}

/// The committed length is read from device memory: a launch captured in a CUDA graph at one
/// length and replayed after the device scalar changed gives the attention at the new length.
#[test]
#[ignore = "needs a CUDA device"]
fn attention_graph_replay_follows_the_device_committed_length() {
    let d = dev();
    let dims = QWEN;
    let mut r = Rng::new(4);
    let row = dims.n_kv * dims.head_dim;
    let (k, v) = (r.vec(CAP * row, 1.0), r.vec(CAP * row, 1.0));
    let (kd, vd) = (d.upload(&k).unwrap(), d.upload(&v).unwrap());
    let mut scratch = AttnScratch::new(&d, 16, dims, CAP).unwrap();
    let scale = 1.0 / 16.0;
    let parents = random_tree(16, 60);
    let tree = TreeBatch::from_parents(&parents).unwrap();
    let t = tree.len();
    let mut bits = Vec::new();
    let words = ancestor_bits(&tree, &mut bits);
    let ad = d.upload(&bits).unwrap();
    let q = r.vec(t * dims.n_heads * dims.head_dim, 2.0);
    let qd = d.upload(&q).unwrap();
    let mut cd = d.upload(&[100i32]).unwrap();
    let mut out = poisoned(&d, q.len());
    // One eager launch first: it loads the module, which must not happen during a capture.
    d.attention_tree(
        &qd,
        &kd,
        &vd,
        &cd,
        t,
        &ad,
        words,
        dims,
        scale,
        CAP,
        &mut scratch,
        &mut out,
    )
    .unwrap();
    d.synchronize().unwrap();
    d.stream()
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    d.attention_tree(
        &qd,
        &kd,
        &vd,
        &cd,
        t,
        &ad,
        words,
        dims,
        scale,
        CAP,
        &mut scratch,
        &mut out,
    )
    .unwrap();
    let g = d
        .stream()
        .end_capture(CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("captured graph");
    for committed in [100usize, 5000, 0, 8000] {
        d.upload_into(&[committed as i32], &mut cd).unwrap();
        g.launch().unwrap();
        let got = d.download(&out).unwrap();
        let mut want = vec![0.0; q.len()];
        cpu_attention(
            &q,
            &k,
            &v,
            KvLayout::RowMajor,
            committed,
            &tree,
            cpu_shape(dims),
            scale,
            &mut want,
        );
        let e = compare(&got, &want);
        println!(
            "RESULT attention graph replay committed={committed}: max|Δ| {:.2e} max|ref| {:.2e}",
            e.max_abs, e.max_ref
        );
        assert!(e.max_abs <= 1e-4 * e.max_ref, "committed={committed}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn conv1d_tree_matches_cpu() {
    let d = dev();
    let mut r = Rng::new(20);
    let mut cases = Vec::new();
    for c in [8192usize, 64] {
        for (name, parents) in tree_cases(&[1, 7, 32], 70) {
            cases.push((c, 4, name, parents));
        }
    }
    // Other kernel widths on the small shape.
    for k in [2usize, 8] {
        cases.push((64, k, "tree T=7".into(), random_tree(7, 80)));
        cases.push((64, k, "chain T=7".into(), chain(7)));
    }
    for (c, k, name, parents) in cases {
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let t = tree.len();
        let m = r.vec(t * c, 2.0);
        let state = r.vec((k - 1) * c, 2.0);
        let w = r.vec(c * k, 0.5);
        let mut want = vec![0.0; t * c];
        let mut want_win = vec![0.0; t * (k - 1) * c];
        cpu_conv(&m, c, k, &state, &w, &tree, &mut want, &mut want_win);
        let (md, sd, wd) = (
            d.upload(&m).unwrap(),
            d.upload(&state).unwrap(),
            d.upload(&w).unwrap(),
        );
        let pd = d.upload(&parents).unwrap();
        let mut out = poisoned(&d, t * c);
        let mut win = poisoned(&d, t * (k - 1) * c);
        d.conv1d_tree(&md, c, k, &sd, &wd, &pd, t, &mut out, &mut win)
            .unwrap();
        let e = compare(&d.download(&out).unwrap(), &want);
        println!(
            "RESULT parity conv1d C={c} K={k} {name}: max|Δ| {:.2e} max|ref| {:.2e}",
            e.max_abs, e.max_ref
        );
        assert!(e.max_abs <= 1e-5 * e.max_ref.max(1.0), "C={c} K={k} {name}");
        assert_eq!(
            d.download(&win).unwrap(),
            want_win,
            "C={c} K={k} {name}: windows"
        );
        assert_eq!(
            d.download(&sd).unwrap(),
            state,
            "the state must not be written"
        );
    }
}

// ------------------------------------------------------------------------------------------
// Timing

/// Attention time for the Qwen3.5 shape (16/4 heads of 256, cache of 8192 + 64 rows) at T = 1 and
/// 16, committed 1k and 8k, over 8 layers' caches (so a round reads more than the 50 MB L2 even at
/// 1k), eager and replayed from a CUDA graph. GB/s counts the live K and V rows read once.
#[test]
#[ignore = "needs a CUDA device"]
fn z_attention_timing() {
    let d = dev();
    let dims = QWEN;
    let layers = 8;
    let mut r = Rng::new(5);
    let row = dims.n_kv * dims.head_dim;
    let kv = r.vec(CAP * row, 1.0);
    let caches: Vec<(CudaSlice<f32>, CudaSlice<f32>)> = (0..layers)
        .map(|_| (d.upload(&kv).unwrap(), d.upload(&kv).unwrap()))
        .collect();
    for (t, tc) in [
        (1usize, false),
        (1, true),
        (2, false),
        (2, true),
        (4, false),
        (4, true),
        (8, true),
        (16, false),
        (16, true),
        (32, true),
    ] {
        let tree = TreeBatch::chain(t);
        let mut bits = Vec::new();
        let words = ancestor_bits(&tree, &mut bits);
        let ad = d.upload(&bits).unwrap();
        let qd = d
            .upload(&r.vec(t * dims.n_heads * dims.head_dim, 2.0))
            .unwrap();
        let mut scratch = AttnScratch::with_kernels(&d, t, dims, CAP, tc.then_some(1)).unwrap();
        if let Some((regs, local)) = scratch.tensor_core_kernel_resources(&d, t).unwrap() {
            println!(
                "RESULT attn_mma_hd256 T={t}: {regs} registers per thread, {local} local bytes"
            );
        }
        let mut out = d
            .alloc_zeros::<f32>(t * dims.n_heads * dims.head_dim)
            .unwrap();
        let p = scratch.plan(t);
        for committed in [1000usize, 8000] {
            let cd = d.upload(&[committed as i32]).unwrap();
            let mut round = || {
                for (kd, vd) in &caches {
                    d.attention_tree(
                        &qd,
                        kd,
                        vd,
                        &cd,
                        t,
                        &ad,
                        words,
                        dims,
                        1.0 / 16.0,
                        CAP,
                        &mut scratch,
                        &mut out,
                    )
                    .unwrap();
                }
            };
            let per = time_ms(&d, 3, 30, &mut round) / layers as f64;
            let graph_per = (|| {
                d.stream()
                    .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .ok()?;
                round();
                let g = d.stream().end_capture(CUgraphInstantiate_flags(0)).ok()??;
                g.upload().ok()?;
                Some(time_ms(&d, 3, 30, || g.launch().unwrap()) / layers as f64)
            })();
            let bytes = (2 * (committed + t) * row * 4) as f64;
            let gbs = |ms: f64| bytes / (ms * 1e-3) / 1e9;
            let graph = graph_per
                .map(|g| format!("graph {:.2} µs {:.0} GB/s", g * 1e3, gbs(g)))
                .unwrap_or_else(|| "graph capture failed".into());
            println!(
                "RESULT attention 16/4x256 T={t:<2} committed={committed:<5} ({}, splits {}, tiles {}, {}x{} warps): {:.2} µs {:.0} GB/s | {graph}",
                if p.tensor_cores { "mma" } else { "simt" },
                p.splits,
                p.row_tiles,
                p.q_groups,
                p.k_groups,
                per * 1e3,
                gbs(per)
            );
        }
    }
}

/// The output gate applied in the combine (gated attention) is bit for bit the attention
/// followed by `sigmoid_mul`, the launch it replaces.
#[test]
#[ignore = "needs a CUDA device"]
fn gated_combine_equals_attention_then_sigmoid_mul() {
    let d = dev();
    let dims = QWEN;
    let mut r = Rng::new(8);
    let row = dims.n_kv * dims.head_dim;
    let (kd, vd) = (
        d.upload(&r.vec(CAP * row, 1.0)).unwrap(),
        d.upload(&r.vec(CAP * row, 1.0)).unwrap(),
    );
    let mut scratch = AttnScratch::new(&d, 16, dims, CAP).unwrap();
    let tree = TreeBatch::from_parents(&random_tree(16, 61)).unwrap();
    let t = tree.len();
    let mut bits = Vec::new();
    let words = ancestor_bits(&tree, &mut bits);
    let ad = d.upload(&bits).unwrap();
    let n = t * dims.n_heads * dims.head_dim;
    let qd = d.upload(&r.vec(n, 2.0)).unwrap();
    let gd = d.upload(&r.vec(n, 3.0)).unwrap();
    let cd = d.upload(&[1000i32]).unwrap();
    let mut plain = poisoned(&d, n);
    d.attention_tree(
        &qd,
        &kd,
        &vd,
        &cd,
        t,
        &ad,
        words,
        dims,
        0.0625,
        CAP,
        &mut scratch,
        &mut plain,
    )
    .unwrap();
    d.sigmoid_mul(&mut plain, &gd).unwrap();
    let mut gated = poisoned(&d, n);
    d.attention_tree_gated(
        &qd,
        &kd,
        &vd,
        &cd,
        t,
        &ad,
        words,
        dims,
        0.0625,
        CAP,
        &mut scratch,
        Some(&gd),
        &mut gated,
    )
    .unwrap();
    let (a, b) = (d.download(&plain).unwrap(), d.download(&gated).unwrap());
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "gated combine differs from attention + sigmoid_mul"
    );
    println!("RESULT attention gated combine T={t}: bit-identical to attention + sigmoid_mul");
}
