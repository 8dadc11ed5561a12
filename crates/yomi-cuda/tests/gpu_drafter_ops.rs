//! The backend ops only drafters use (a DFlash drafter's context K/V and bidirectional block,
//! its host-table rotary embedding and embedding scale), the CUDA op set against the CPU's,
//! through the `Backend` trait both implement, on random inputs at the drafters' shapes:
//! SmolLM2's drafter (9 query / 3 K/V heads of 64) and a Qwen3.5-9B drafter's (32 / 8 of 128),
//! a block of 16 rows over 300 context rows. `#[ignore]`d: they need a CUDA device.
//!
//! Tolerances: the scale is exact; the rotation differs by the GPU's fused multiply-adds
//! (≤ 2 ulp of the values, 1e-6 here); attention sums its softmax in another order and splits
//! the keys (the tree-attention kernels' tolerance, 2e-5 relative to max|o|).

mod common;
use std::sync::Arc;

use common::{Rng, dev};
use yomi_core::backend::{AttnHeads, Backend, BlockMask};
use yomi_cpu::backend::Cpu;
use yomi_cuda::backend::{Cuda, DevBuf};
use yomi_weights::{Rope, RopeScaling};

fn cuda() -> Cuda {
    let d = Arc::new(dev());
    // The model's frequencies are unused by these ops (a host table carries the angles).
    let inv_freq = Arc::new(d.upload(&[1.0f32]).unwrap());
    Cuda::new(d, inv_freq)
}

fn up(b: &Cuda, x: &[f32]) -> DevBuf {
    let mut buf = DevBuf::default();
    b.fill_from_host(&mut buf, x.len(), &mut |d| d.copy_from_slice(x));
    buf
}

fn down(b: &Cuda, x: &DevBuf, n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    b.read_rows(x, 0, 1, n, &mut out);
    if let Some(e) = b.take_error() {
        panic!("CUDA op failed: {e:#}");
    }
    out
}

fn max_diff(gpu: &[f32], cpu: &[f32]) -> (f32, f32) {
    assert_eq!(gpu.len(), cpu.len());
    let mut m = 0.0f32;
    let mut r = 0.0f32;
    for (g, c) in gpu.iter().zip(cpu) {
        assert!(g.is_finite(), "non-finite GPU output");
        m = m.max((g - c).abs());
        r = r.max(c.abs());
    }
    (m, r)
}

const SHAPES: [AttnHeads; 2] = [
    AttnHeads {
        n_heads: 9,
        n_kv: 3,
        head_dim: 64,
    },
    AttnHeads {
        n_heads: 32,
        n_kv: 8,
        head_dim: 128,
    },
];

#[test]
#[ignore = "needs a CUDA device"]
fn rope_from_a_host_table_and_scale_match_cpu() {
    let g = cuda();
    let mut r = Rng::new(3);
    for heads in SHAPES {
        let (t, hd) = (16, heads.head_dim);
        for rot in [hd, hd / 2] {
            let rope = Rope::new(1e6, rot, &RopeScaling::None);
            let mut cs = vec![0.0f32; t * rot];
            for (i, row) in cs.chunks_exact_mut(rot).enumerate() {
                rope.cos_sin(517 + i, row);
            }
            let x = r.vec(t * heads.n_heads * hd, 2.0);
            let mut want = x.clone();
            Cpu.rope_inplace(&mut want, t, heads.n_heads, hd, rot, &cs);
            let mut gx = up(&g, &x);
            let gcs = up(&g, &cs);
            g.rope_inplace(&mut gx, t, heads.n_heads, hd, rot, &gcs);
            let got = down(&g, &gx, x.len());
            let (m, mx) = max_diff(&got, &want);
            println!("RESULT rope table hd {hd} rot {rot}: max|Δ| {m:.2e} max|cpu| {mx:.2e}");
            assert!(m <= 1e-6 * mx.max(1.0), "rope: {m}");
        }
        let x = r.vec(t * 576, 1.0);
        let mut want = x.clone();
        Cpu.scale_inplace(&mut want, x.len(), 24.0);
        let mut gx = up(&g, &x);
        g.scale_inplace(&mut gx, x.len(), 24.0);
        assert_eq!(down(&g, &gx, x.len()), want, "scale: not bit-exact");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn context_rows_and_a_bidirectional_block_match_cpu() {
    let g = cuda();
    let mut r = Rng::new(5);
    for heads in SHAPES {
        let AttnHeads {
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
        } = heads;
        let (ctx, t) = (300, 16);
        let capacity = ctx + t;
        let mut cc = Cpu.new_kv_cache(heads, capacity);
        let mut gc = g.new_kv_cache(heads, capacity);
        // The context in two writes, as committed rows arrive.
        for (at, n) in [(0, 181), (181, ctx - 181)] {
            let k = r.vec(n * nkv * hd, 1.0);
            let v = r.vec(n * nkv * hd, 1.0);
            Cpu.write_kv(&mut cc, at, n, heads, &k, &v);
            let (gk, gv) = (up(&g, &k), up(&g, &v));
            g.write_kv(&mut gc, at, n, heads, &gk, &gv);
        }
        // Three blocks at the same context, each overwriting the last one's pending rows:
        // bidirectional twice, then causal (z-lab's `is_causal` drafter layers).
        for round in 0..3 {
            let mask = BlockMask {
                causal: round == 2,
                window: None,
            };
            let q = r.vec(t * nh * hd, 1.0);
            let k = r.vec(t * nkv * hd, 1.0);
            let v = r.vec(t * nkv * hd, 1.0);
            let mut want = Vec::new();
            Cpu.attention_block(&mut cc, ctx, t, heads, mask, &q, &k, &v, &mut want);
            let (gq, gk, gv) = (up(&g, &q), up(&g, &k), up(&g, &v));
            let mut go = DevBuf::default();
            g.attention_block(&mut gc, ctx, t, heads, mask, &gq, &gk, &gv, &mut go);
            let got = down(&g, &go, t * nh * hd);
            let (m, mx) = max_diff(&got, &want[..t * nh * hd]);
            println!(
                "RESULT attention_block {nh}/{nkv}x{hd} round {round}: max|Δ| {m:.2e} max|cpu| {mx:.2e}"
            );
            assert!(m <= 2e-5 * mx.max(1.0), "attention_block: {m}");
        }
    }
}
