//! The whole-model glue ops (kernels/glue.cu) against their CPU twins on random inputs at
//! Qwen3.5-9B shapes (hidden 4096, FFN 12288, attention 16/4 heads of 256 with the output gate,
//! GDN 16 key / 32 value heads of 128, conv dim 8192, vocabulary rows of 4096 values). All
//! `#[ignore]`d: they need a CUDA device. Outputs start as NaN, so an unwritten element fails.
//!
//! Tolerances: copies and gathers are exact; the element-wise and norm ops differ from the CPU
//! only in `expf`/`log1pf`/`sqrtf` rounding and the order of a row's sum of squares, so
//! max|Δ| ≤ 1e-5·max(1, max|cpu|).

mod common;
use common::{Rng, dev, poisoned};

use yomi_cpu::activation::{sigmoid, softplus, swiglu};
use yomi_cpu::norm::{l2_norm_inplace, rms_norm, rms_norm_gated_inplace};
use yomi_cuda::{
    DeviceMatrix, GateUpMatrix, GemvKernel, WeightDtype, bf16_tile_index, bf16_tiles_len,
    gemv_variant, tc_warps,
};

/// max|gpu − cpu| and max|cpu|, after checking every GPU value is finite.
fn diff(gpu: &[f32], cpu: &[f32]) -> (f32, f32) {
    assert_eq!(gpu.len(), cpu.len());
    let mut m = 0.0f32;
    let mut r = 0.0f32;
    for (g, c) in gpu.iter().zip(cpu) {
        assert!(g.is_finite(), "non-finite GPU output (unwritten element?)");
        m = m.max((g - c).abs());
        r = r.max(c.abs());
    }
    (m, r)
}

fn check(op: &str, gpu: &[f32], cpu: &[f32]) {
    let (m, r) = diff(gpu, cpu);
    println!("RESULT glue {op}: max|Δ| {m:.2e} max|cpu| {r:.2e}");
    assert!(m <= 1e-5 * r.max(1.0), "{op}: {m} (max|cpu| {r})");
}

fn exact(op: &str, gpu: &[f32], cpu: &[f32]) {
    assert_eq!(gpu, cpu, "{op}: not bit-exact");
    println!("RESULT glue {op}: bit-exact ({} values)", cpu.len());
}

const H: usize = 4096;
const T: [usize; 3] = [1, 16, 32];

#[test]
#[ignore = "needs a CUDA device"]
fn embed_add_and_fused_norm_match_cpu() {
    let d = dev();
    let mut r = Rng::new(11);
    let vocab = 1000;
    let table = r.vec(vocab * H, 1.0);
    let bits: Vec<u16> = table
        .iter()
        .map(|v| half::bf16::from_f32(*v).to_bits())
        .collect();
    let wbf = DeviceMatrix::from_half_bits(&d, vocab, H, WeightDtype::Bf16, &bits).unwrap();
    let wf = DeviceMatrix::from_f32(&d, vocab, H, &table).unwrap();
    for t in T {
        let ids: Vec<i32> = (0..t).map(|i| ((i * 379 + 7) % vocab) as i32).collect();
        let idd = d.upload(&ids).unwrap();
        let mut out = poisoned(&d, t * H);
        d.embed(&wf, &idd, &mut out).unwrap();
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| table[i as usize * H..(i as usize + 1) * H].iter().copied())
            .collect();
        exact(
            &format!("embed f32 T={t}"),
            &d.download(&out).unwrap(),
            &want,
        );
        let mut out = poisoned(&d, t * H);
        d.embed(&wbf, &idd, &mut out).unwrap();
        let want_bf: Vec<f32> = ids
            .iter()
            .flat_map(|&i| {
                bits[i as usize * H..(i as usize + 1) * H]
                    .iter()
                    .map(|b| half::bf16::from_bits(*b).to_f32())
            })
            .collect();
        exact(
            &format!("embed bf16 T={t}"),
            &d.download(&out).unwrap(),
            &want_bf,
        );

        // h += y, then x = rms_norm(h) · w, fused; then the plain add.
        let (h, y, sum) = check_add_rms_norm(&d, &mut r, H, t);
        let yd = d.upload(&y).unwrap();
        let mut hd2 = d.upload(&h).unwrap();
        d.add_inplace(&mut hd2, &yd).unwrap();
        exact(&format!("add T={t}"), &d.download(&hd2).unwrap(), &sum);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn attention_glue_matches_cpu() {
    let d = dev();
    let mut r = Rng::new(12);
    let (nh, nkv, hd) = (16, 4, 256);
    for t in T {
        // q|gate split per head.
        let qf = r.vec(t * nh * 2 * hd, 2.0);
        let (mut q_want, mut g_want) = (vec![0.0; t * nh * hd], vec![0.0; t * nh * hd]);
        for i in 0..t * nh {
            q_want[i * hd..(i + 1) * hd].copy_from_slice(&qf[i * 2 * hd..i * 2 * hd + hd]);
            g_want[i * hd..(i + 1) * hd].copy_from_slice(&qf[i * 2 * hd + hd..(i + 1) * 2 * hd]);
        }
        let qfd = d.upload(&qf).unwrap();
        let (mut qd, mut gd) = (poisoned(&d, t * nh * hd), poisoned(&d, t * nh * hd));
        d.split_q_gate(&qfd, hd, &mut qd, &mut gd).unwrap();
        exact(
            &format!("split_q_gate q T={t}"),
            &d.download(&qd).unwrap(),
            &q_want,
        );
        exact(
            &format!("split_q_gate gate T={t}"),
            &d.download(&gd).unwrap(),
            &g_want,
        );
        // Output gate.
        let o = r.vec(t * nh * hd, 2.0);
        let want: Vec<f32> = o
            .iter()
            .zip(&g_want)
            .map(|(a, g)| a * sigmoid(*g))
            .collect();
        let mut od = d.upload(&o).unwrap();
        d.sigmoid_mul(&mut od, &gd).unwrap();
        check(
            &format!("sigmoid_mul T={t}"),
            &d.download(&od).unwrap(),
            &want,
        );
        // K/V store after `committed` rows of a cache of 8192 + 64.
        let stride = nkv * hd;
        let cap = 8192 + 64;
        for committed in [0usize, 5000, cap - t] {
            let rows = r.vec(t * stride, 1.0);
            let mut cache = d.upload(&vec![0.5f32; cap * stride]).unwrap();
            let cd = d.upload(&[committed as i32]).unwrap();
            d.kv_store(&d.upload(&rows).unwrap(), stride, &cd, &mut cache)
                .unwrap();
            let got = d.download(&cache).unwrap();
            let mut want = vec![0.5f32; cap * stride];
            want[committed * stride..(committed + t) * stride].copy_from_slice(&rows);
            assert_eq!(got, want, "kv_store T={t} committed={committed}");
        }
        println!("RESULT glue kv_store T={t}: bit-exact at committed 0, 5000, capacity − T");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gdn_glue_matches_cpu() {
    let d = dev();
    let mut r = Rng::new(13);
    let (hk, hv, dk, dv) = (16usize, 32usize, 128usize, 128usize);
    let (kd, vd) = (hk * dk, hv * dv);
    let c = 2 * kd + vd;
    for t in T {
        let mc = r.vec(t * c, 2.0);
        let (mut q, mut k, mut v) = (vec![0.0; t * kd], vec![0.0; t * kd], vec![0.0; t * vd]);
        for i in 0..t {
            let row = &mc[i * c..(i + 1) * c];
            q[i * kd..(i + 1) * kd].copy_from_slice(&row[..kd]);
            k[i * kd..(i + 1) * kd].copy_from_slice(&row[kd..2 * kd]);
            v[i * vd..(i + 1) * vd].copy_from_slice(&row[2 * kd..]);
        }
        l2_norm_inplace(&mut q, dk, 1e-6);
        l2_norm_inplace(&mut k, dk, 1e-6);
        let qs = 1.0 / (dk as f32).sqrt();
        q.iter_mut().for_each(|x| *x *= qs);
        let mcd = d.upload(&mc).unwrap();
        let (mut qd, mut kd_, mut vd_) = (
            poisoned(&d, t * kd),
            poisoned(&d, t * kd),
            poisoned(&d, t * vd),
        );
        d.gdn_split_qkv(&mcd, t, hk, dk, vd, qs, 1e-6, &mut qd, &mut kd_, &mut vd_)
            .unwrap();
        check(
            &format!("gdn_split_qkv q T={t}"),
            &d.download(&qd).unwrap(),
            &q,
        );
        check(
            &format!("gdn_split_qkv k T={t}"),
            &d.download(&kd_).unwrap(),
            &k,
        );
        exact(
            &format!("gdn_split_qkv v T={t}"),
            &d.download(&vd_).unwrap(),
            &v,
        );

        // Decay and write strength, including a_raw past softplus's linear cut-off (20).
        let braw = r.vec(t * hv, 6.0);
        let araw: Vec<f32> = r.vec(t * hv, 30.0);
        let neg_exp_a: Vec<f32> = r.vec(hv, 1.0).iter().map(|x| -(x.exp())).collect();
        let dt_bias = r.vec(hv, 1.0);
        let mut g_want = vec![0.0; t * hv];
        let mut b_want = vec![0.0; t * hv];
        for j in 0..t * hv {
            let h = j % hv;
            b_want[j] = sigmoid(braw[j]);
            g_want[j] = neg_exp_a[h] * softplus(araw[j] + dt_bias[h]);
        }
        let (mut gd, mut bd) = (poisoned(&d, t * hv), poisoned(&d, t * hv));
        d.gdn_gate_beta(
            &d.upload(&braw).unwrap(),
            &d.upload(&araw).unwrap(),
            &d.upload(&neg_exp_a).unwrap(),
            &d.upload(&dt_bias).unwrap(),
            &mut gd,
            &mut bd,
        )
        .unwrap();
        check(
            &format!("gdn_gate_beta g T={t}"),
            &d.download(&gd).unwrap(),
            &g_want,
        );
        check(
            &format!("gdn_gate_beta beta T={t}"),
            &d.download(&bd).unwrap(),
            &b_want,
        );

        // Gated RMSNorm per value head.
        let o = r.vec(t * vd, 2.0);
        let z = r.vec(t * vd, 4.0);
        let w: Vec<f32> = r.vec(dv, 0.3).iter().map(|x| 1.0 + x).collect();
        let mut want = o.clone();
        rms_norm_gated_inplace(&mut want, &z, &w, 1e-6);
        let mut od = d.upload(&o).unwrap();
        d.rms_norm_gated(
            &mut od,
            &d.upload(&z).unwrap(),
            &d.upload(&w).unwrap(),
            1e-6,
        )
        .unwrap();
        check(
            &format!("rms_norm_gated T={t}"),
            &d.download(&od).unwrap(),
            &want,
        );

        // Row gather of accepted rows (the commit replay's compaction).
        let src = r.vec(t * kd, 1.0);
        let idx: Vec<i32> = (0..t as i32).filter(|i| i % 3 != 1).collect();
        let want: Vec<f32> = idx
            .iter()
            .flat_map(|&i| src[i as usize * kd..(i as usize + 1) * kd].iter().copied())
            .collect();
        let mut out = poisoned(&d, idx.len() * kd);
        d.gather_rows(
            &d.upload(&src).unwrap(),
            &d.upload(&idx).unwrap(),
            kd,
            &mut out,
        )
        .unwrap();
        exact(
            &format!("gather_rows T={t}"),
            &d.download(&out).unwrap(),
            &want,
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn fused_projection_glue_matches_cpu() {
    let d = dev();
    let mut r = Rng::new(14);
    let inter = 12288;
    // GDN in_proj pieces: conv input, z, b, a.
    let widths = [8192usize, 4096, 32, 32];
    let total: usize = widths.iter().sum();
    for t in T {
        let src = r.vec(t * total, 1.0);
        let sd = d.upload(&src).unwrap();
        let mut outs: Vec<_> = widths.iter().map(|w| poisoned(&d, t * w)).collect();
        {
            let offsets = [0, widths[0], widths[0] + widths[1], total - widths[3]];
            let mut dests: Vec<&mut dyn cudarc::driver::DevicePtrMut<f32>> = outs
                .iter_mut()
                .map(|o| o as &mut dyn cudarc::driver::DevicePtrMut<f32>)
                .collect();
            d.split_cols(&sd, t, &offsets, &mut dests).unwrap();
        }
        let mut off = 0;
        for (o, w) in outs.iter().zip(widths) {
            let want: Vec<f32> = (0..t)
                .flat_map(|i| src[i * total + off..i * total + off + w].iter().copied())
                .collect();
            assert_eq!(
                d.download(o).unwrap(),
                want,
                "split_cols T={t} piece at {off}"
            );
            off += w;
        }
        println!("RESULT glue split_cols T={t}: 4 pieces bit-exact");

        // SwiGLU over a fused gate|up row.
        let gu = r.vec(t * 2 * inter, 6.0);
        let mut want = vec![0.0; t * inter];
        for i in 0..t {
            let (g, u) = gu[i * 2 * inter..(i + 1) * 2 * inter].split_at(inter);
            let mut gg = g.to_vec();
            swiglu(&mut gg, u);
            want[i * inter..(i + 1) * inter].copy_from_slice(&gg);
        }
        let mut out = poisoned(&d, t * inter);
        d.swiglu_pair(&d.upload(&gu).unwrap(), t, inter, &mut out)
            .unwrap();
        check(
            &format!("swiglu_pair T={t}"),
            &d.download(&out).unwrap(),
            &want,
        );
    }
}

/// Batch invariance of `linear`: does a row's output depend on how many rows share the call?
/// Plain decoding runs T = 1 passes and verification T > 1 passes, so speculative output equals
/// plain output bit for bit only where the two agree exactly. For every weight format at
/// 4096×4096 this compares each of T = 1, 2, 4, 8 rows against the same rows inside one T = 16
/// call with the default kernels: they must be bit-identical (the default kernels are chosen so
/// that a row's arithmetic does not depend on T; see `default_kernel` in src/ops.rs and
/// QUANT_UNIT_SCALES in kernels/gemv_quant.cu).
/// bf16 matrices are rearranged on the device into the tensor-core tile layout: every value at
/// the place the host twin `bf16_tile_index` names, the padding zero.
#[test]
#[ignore = "needs a CUDA device"]
fn bf16_tile_packing_matches_the_host_layout() {
    let d = dev();
    for (rows, cols) in [(1001usize, 4104usize), (64, 32), (4096, 4096)] {
        let bits: Vec<u16> = (0..rows * cols).map(|i| (i % 65521) as u16 | 1).collect();
        let m = DeviceMatrix::from_half_bits(&d, rows, cols, WeightDtype::Bf16, &bits).unwrap();
        let got = m.stored_half_bits(&d).unwrap();
        assert_eq!(got.len(), bf16_tiles_len(rows, cols));
        let mut want = vec![0u16; got.len()];
        for r in 0..rows {
            for c in 0..cols {
                want[bf16_tile_index(r, c, cols)] = bits[r * cols + c];
            }
        }
        assert!(
            got == want,
            "{rows}x{cols}: device tile layout differs from the host's"
        );
        println!("RESULT bf16 tile packing {rows}x{cols}: identical to the host layout");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn linear_batch_invariance() {
    use yomi_cuda::QuantFormat;
    use yomi_weights::quant::{QuantType, quantize_row};
    let d = dev();
    let (rows, cols) = (4096usize, 4096usize);
    let mut r = Rng::new(15);
    let w = r.vec(rows * cols, 0.05);
    let x = r.vec(16 * cols, 1.0);
    let mut mats: Vec<(String, DeviceMatrix)> = vec![
        (
            "f32".into(),
            DeviceMatrix::from_f32(&d, rows, cols, &w).unwrap(),
        ),
        (
            "bf16".into(),
            DeviceMatrix::from_half_bits(
                &d,
                rows,
                cols,
                WeightDtype::Bf16,
                &w.iter()
                    .map(|v| half::bf16::from_f32(*v).to_bits())
                    .collect::<Vec<_>>(),
            )
            .unwrap(),
        ),
        (
            "f16".into(),
            DeviceMatrix::from_half_bits(
                &d,
                rows,
                cols,
                WeightDtype::F16,
                &w.iter()
                    .map(|v| half::f16::from_f32(*v).to_bits())
                    .collect::<Vec<_>>(),
            )
            .unwrap(),
        ),
    ];
    for (ty, f) in [
        (QuantType::Q8_0, QuantFormat::Q8_0),
        (QuantType::Q4_1, QuantFormat::Q4_1),
        (QuantType::Q4_K, QuantFormat::Q4_K),
        (QuantType::Q6_K, QuantFormat::Q6_K),
    ] {
        let mut bytes = Vec::new();
        for row in w.chunks_exact(cols) {
            quantize_row(ty, row, &mut bytes);
        }
        mats.push((
            format!("{f:?}"),
            DeviceMatrix::from_ggml_blocks(&d, rows, cols, f, &bytes).unwrap(),
        ));
    }
    for (name, m) in &mats {
        let xd = d.upload(&x).unwrap();
        let mut all = poisoned(&d, 16 * rows);
        d.linear(&xd, 16, m, None, &mut all).unwrap();
        let all = d.download(&all).unwrap();
        let mut line = format!("RESULT batch invariance {name}:");
        for t in [1usize, 2, 4, 8] {
            let xt = d.upload(&x[..t * cols]).unwrap();
            let mut out = poisoned(&d, t * rows);
            d.linear(&xt, t, m, None, &mut out).unwrap();
            let got = d.download(&out).unwrap();
            let want = &all[..t * rows];
            let same = got
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            let (num, den) = got
                .iter()
                .zip(want)
                .fold((0.0f64, 0.0f64), |(n, dd), (a, b)| {
                    (n + ((a - b) as f64).powi(2), dd + (*b as f64).powi(2))
                });
            let rel = (num / den.max(1e-30)).sqrt();
            assert!(
                same,
                "{name} T={t}: not bit-identical to the T = 16 call (rel-L2 {rel:.1e})"
            );
            line += &if same {
                format!(" T={t} bit-identical;")
            } else {
                format!(" T={t} differs (rel-L2 {rel:.1e});")
            };
        }
        // A row's result must not depend on where it sits in the pass either: in a verify pass
        // the row that plain decoding would run alone can be any of the T rows.
        let x32 = r.vec(32 * cols, 1.0);
        let xd = d.upload(&x32).unwrap();
        let mut all = poisoned(&d, 32 * rows);
        d.linear(&xd, 32, m, None, &mut all).unwrap();
        let all = d.download(&all).unwrap();
        for j in [0usize, 5, 8, 13, 17, 31] {
            let xj = d.upload(&x32[j * cols..(j + 1) * cols]).unwrap();
            let mut out = poisoned(&d, rows);
            d.linear(&xj, 1, m, None, &mut out).unwrap();
            let got = d.download(&out).unwrap();
            let want = &all[j * rows..(j + 1) * rows];
            assert!(
                got.iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: row {j} of a T = 32 call differs from the same row alone"
            );
        }
        line += " rows 0..32 of a T = 32 call = each row alone;";
        // Every tensor-core variant (rows per block, slabs per stage) with this shape's warp
        // count sums in the same order.
        if name == "bf16" {
            for t in [1usize, 16, 32] {
                let xt = d.upload(&x32[..t * cols]).unwrap();
                let mut base: Option<Vec<f32>> = None;
                for v in gemv_variant(WeightDtype::Bf16, t) {
                    if !matches!(v, GemvKernel::Mma { w, .. } if w == tc_warps(rows)) {
                        continue;
                    }
                    let mut out = poisoned(&d, t * rows);
                    d.linear_variant(&xt, t, m, None, &mut out, Some(v))
                        .unwrap();
                    let got = d.download(&out).unwrap();
                    match &base {
                        None => base = Some(got),
                        Some(b) => assert!(
                            got.iter().zip(b).all(|(a, c)| a.to_bits() == c.to_bits()),
                            "bf16 T={t}: tensor-core variant {v:?} differs from the first"
                        ),
                    }
                }
            }
            line += " every tensor-core variant bit-identical;";
        }
        println!("{line}");
    }
}

/// The fused attention-input kernel against the ops it replaces (column split, q/gate split,
/// per-head RMS norms, two RoPEs, two K/V stores), run one after the other: bit-identical, at
/// Qwen3.5-9B's attention shape (gated, q/k norms, partial RoPE) and SmolLM2's (plain), with a
/// committed length that pushes the last rows past the cache (dropped by both).
#[test]
#[ignore = "needs a CUDA device"]
fn attn_prep_matches_the_unfused_ops() {
    use yomi_cuda::AttnPrepSources;
    use yomi_cuda::attention::AttnDims;
    let d = dev();
    let mut r = Rng::new(77);
    // (heads, kv heads, head_dim, rot, gated, norms)
    for (nh, nkv, hd, rot, gated, norms) in [
        (16usize, 4usize, 256usize, 64usize, true, true),
        (9, 3, 64, 64, false, false),
    ] {
        let dims = AttnDims {
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
        };
        let qw = nh * hd * if gated { 2 } else { 1 };
        let kvw = nkv * hd;
        let total = qw + 2 * kvw;
        let capacity = 40usize;
        let inv_freq: Vec<f32> = (0..rot / 2)
            .map(|i| 1.0 / 1e7f32.powf(2.0 * i as f32 / rot as f32))
            .collect();
        let inv_freq = d.upload(&inv_freq).unwrap();
        let qn_w = d.upload(&r.vec(hd, 1.0)).unwrap();
        let kn_w = d.upload(&r.vec(hd, 1.0)).unwrap();
        for (t, committed) in [(1usize, 0i32), (5, 17), (32, 30)] {
            let src = d.upload(&r.vec(t * total, 2.0)).unwrap();
            let pos: Vec<i32> = (0..t as i32).map(|i| 5000 + committed + i / 2).collect();
            let pos = d.upload(&pos).unwrap();
            let com = d.upload(&[committed]).unwrap();
            // Unfused.
            let mut qf = d.alloc_zeros::<f32>(t * qw).unwrap();
            let mut kb = d.alloc_zeros::<f32>(t * kvw).unwrap();
            let mut vb = d.alloc_zeros::<f32>(t * kvw).unwrap();
            d.split_cols(
                &src,
                t,
                &[0, qw, qw + kvw],
                &mut [&mut qf, &mut kb, &mut vb],
            )
            .unwrap();
            let mut q_old = poisoned(&d, t * nh * hd);
            let mut g_old = poisoned(&d, t * nh * hd);
            if gated {
                d.split_q_gate(&qf, hd, &mut q_old, &mut g_old).unwrap();
            } else {
                d.copy(&qf, &mut q_old).unwrap();
            }
            if norms {
                d.rms_norm_inplace(&mut q_old, &qn_w, 1e-6).unwrap();
                d.rms_norm_inplace(&mut kb, &kn_w, 1e-6).unwrap();
            }
            d.rope_neox(&mut q_old, t, nh, hd, rot, &pos, &inv_freq)
                .unwrap();
            d.rope_neox(&mut kb, t, nkv, hd, rot, &pos, &inv_freq)
                .unwrap();
            let mut kc_old = poisoned(&d, capacity * kvw);
            let mut vc_old = poisoned(&d, capacity * kvw);
            d.kv_store(&kb, kvw, &com, &mut kc_old).unwrap();
            d.kv_store(&vb, kvw, &com, &mut vc_old).unwrap();
            // Fused, reading the fused projection's output in place.
            let (qv, kv, vv) = (
                src.slice(0..(t - 1) * total + qw),
                src.slice(qw..qw + (t - 1) * total + kvw),
                src.slice(qw + kvw..t * total),
            );
            let sources = AttnPrepSources {
                q: (&qv, total),
                k: (&kv, total),
                v: (&vv, total),
                q_norm: norms.then_some(&qn_w),
                k_norm: norms.then_some(&kn_w),
                pos: &pos,
                inv_freq: &inv_freq,
                committed: &com,
            };
            let mut q_new = poisoned(&d, t * nh * hd);
            let mut g_new = poisoned(&d, t * nh * hd);
            let mut kc_new = poisoned(&d, capacity * kvw);
            let mut vc_new = poisoned(&d, capacity * kvw);
            d.attn_prep(
                t,
                dims,
                rot,
                1e-6,
                &sources,
                &mut q_new,
                if gated {
                    Some(&mut g_new as &mut dyn cudarc::driver::DevicePtrMut<f32>)
                } else {
                    None
                },
                &mut kc_new,
                &mut vc_new,
            )
            .unwrap();
            let bits = |v: &cudarc::driver::CudaSlice<f32>| -> Vec<u32> {
                d.download(v).unwrap().iter().map(|x| x.to_bits()).collect()
            };
            assert!(bits(&q_new) == bits(&q_old), "q differs ({nh}x{hd}, T={t})");
            if gated {
                assert!(
                    bits(&g_new) == bits(&g_old),
                    "gate differs ({nh}x{hd}, T={t})"
                );
            }
            assert!(
                bits(&kc_new) == bits(&kc_old),
                "K cache differs ({nh}x{hd}, T={t})"
            );
            assert!(
                bits(&vc_new) == bits(&vc_old),
                "V cache differs ({nh}x{hd}, T={t})"
            );
            println!(
                "RESULT glue attn_prep {nh}/{nkv}x{hd} rot {rot} gated {gated} norms {norms} T={t} committed {committed}: bit-identical to the unfused ops"
            );
        }
    }
    // Bad shapes are errors.
    let z = d.alloc_zeros::<f32>(8).unwrap();
    let zi = d.alloc_zeros::<i32>(1).unwrap();
    let bad = AttnPrepSources {
        q: (&z, 8),
        k: (&z, 8),
        v: (&z, 8),
        q_norm: None,
        k_norm: None,
        pos: &zi,
        inv_freq: &z,
        committed: &zi,
    };
    let dims = AttnDims {
        n_heads: 1,
        n_kv: 1,
        head_dim: 512,
    };
    let (mut a, mut b, mut c) = (
        d.alloc_zeros::<f32>(512).unwrap(),
        d.alloc_zeros::<f32>(512).unwrap(),
        d.alloc_zeros::<f32>(512).unwrap(),
    );
    assert!(
        d.attn_prep(1, dims, 2, 1e-6, &bad, &mut a, None, &mut b, &mut c)
            .is_err()
    );
}

/// The GDN input kernels reading a fused projection's output in place (row-strided views) give
/// exactly what they give on the packed pieces that the column split used to make.
#[test]
#[ignore = "needs a CUDA device"]
fn gdn_inputs_read_in_place_match_the_packed_pieces() {
    let d = dev();
    let mut r = Rng::new(91);
    // Qwen3.5-9B: conv dim 8192, 32 value heads of 128, K = 4.
    let (c, hv, dv, kc) = (8192usize, 32usize, 128usize, 4usize);
    let vd = hv * dv;
    let total = c + vd + 2 * hv;
    for t in [1usize, 7, 32] {
        let proj = d.upload(&r.vec(t * total, 1.5)).unwrap();
        let mut pieces: Vec<cudarc::driver::CudaSlice<f32>> = [c, vd, hv, hv]
            .iter()
            .map(|&w| d.alloc_zeros::<f32>(t * w).unwrap())
            .collect();
        {
            let [m, z, bb, aa] = &mut pieces[..] else {
                unreachable!()
            };
            d.split_cols(&proj, t, &[0, c, c + vd, c + vd + hv], &mut [m, z, bb, aa])
                .unwrap();
        }
        let span = |off: usize, w: usize| off..off + (t - 1) * total + w;
        let bits = |v: &cudarc::driver::CudaSlice<f32>| -> Vec<u32> {
            d.download(v).unwrap().iter().map(|x| x.to_bits()).collect()
        };
        // conv1d over a chain.
        let state = d.upload(&r.vec((kc - 1) * c, 1.0)).unwrap();
        let w = d.upload(&r.vec(c * kc, 0.5)).unwrap();
        let parents: Vec<i32> = (0..t as i32).map(|i| i - 1).collect();
        let parents = d.upload(&parents).unwrap();
        let (mut o1, mut w1) = (poisoned(&d, t * c), poisoned(&d, t * (kc - 1) * c));
        let (mut o2, mut w2) = (poisoned(&d, t * c), poisoned(&d, t * (kc - 1) * c));
        d.conv1d_tree(&pieces[0], c, kc, &state, &w, &parents, t, &mut o1, &mut w1)
            .unwrap();
        d.conv1d_tree_strided(
            &proj.slice(span(0, c)),
            c,
            total,
            kc,
            &state,
            &w,
            &parents,
            t,
            &mut o2,
            &mut w2,
        )
        .unwrap();
        assert!(
            bits(&o1) == bits(&o2) && bits(&w1) == bits(&w2),
            "conv T={t}"
        );
        // g and β.
        let nea = d.upload(&r.vec(hv, 1.0)).unwrap();
        let dtb = d.upload(&r.vec(hv, 1.0)).unwrap();
        let (mut g1, mut b1) = (poisoned(&d, t * hv), poisoned(&d, t * hv));
        let (mut g2, mut b2) = (poisoned(&d, t * hv), poisoned(&d, t * hv));
        d.gdn_gate_beta(&pieces[2], &pieces[3], &nea, &dtb, &mut g1, &mut b1)
            .unwrap();
        d.gdn_gate_beta_strided(
            &proj.slice(span(c + vd, hv)),
            &proj.slice(span(c + vd + hv, hv)),
            total,
            &nea,
            &dtb,
            &mut g2,
            &mut b2,
        )
        .unwrap();
        assert!(
            bits(&g1) == bits(&g2) && bits(&b1) == bits(&b2),
            "g/β T={t}"
        );
        // Gated RMSNorm with z read in place.
        let o = r.vec(t * vd, 1.0);
        let nw = d.upload(&r.vec(dv, 1.0)).unwrap();
        let mut n1 = d.upload(&o).unwrap();
        let mut n2 = d.upload(&o).unwrap();
        d.rms_norm_gated(&mut n1, &pieces[1], &nw, 1e-6).unwrap();
        d.rms_norm_gated_strided(&mut n2, &proj.slice(span(c, vd)), hv, total, &nw, 1e-6)
            .unwrap();
        assert!(bits(&n1) == bits(&n2), "gated norm T={t}");
        println!("RESULT glue GDN inputs in place T={t}: conv, g/β, gated norm bit-identical");
    }
}

/// The fused residual add + RMSNorm at other row widths: SmolLM2's 576 (16-byte chunks, one per
/// thread), 8192 (two chunks per thread) and 1001 (not whole chunks: the scalar loop).
#[test]
#[ignore = "needs a CUDA device"]
fn add_rms_norm_other_widths() {
    let d = dev();
    let mut r = Rng::new(33);
    for n in [576usize, 8192, 1001] {
        for t in [1usize, 3] {
            check_add_rms_norm(&d, &mut r, n, t);
        }
    }
}

/// `add_rms_norm` on T random rows of width n: the sum written into h bit-exact, the normed
/// rows against the CPU. Returns (h, y, h + y).
fn check_add_rms_norm(
    d: &yomi_cuda::CudaDevice,
    r: &mut Rng,
    n: usize,
    t: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let h = r.vec(t * n, 3.0);
    let y = r.vec(t * n, 3.0);
    let w: Vec<f32> = r.vec(n, 0.5).iter().map(|v| 1.0 + v).collect();
    let sum: Vec<f32> = h.iter().zip(&y).map(|(a, b)| a + b).collect();
    let mut want = vec![0.0; t * n];
    rms_norm(&sum, &w, 1e-6, &mut want);
    let (mut hd, yd, wd) = (
        d.upload(&h).unwrap(),
        d.upload(&y).unwrap(),
        d.upload(&w).unwrap(),
    );
    let mut xd = poisoned(d, t * n);
    d.add_rms_norm(&mut hd, &yd, &wd, 1e-6, &mut xd).unwrap();
    exact(
        &format!("add_rms_norm sum n={n} T={t}"),
        &d.download(&hd).unwrap(),
        &sum,
    );
    check(
        &format!("add_rms_norm n={n} T={t}"),
        &d.download(&xd).unwrap(),
        &want,
    );
    (h, y, sum)
}

/// q/k/v split with g/β in the same launch gives exactly what the two launches give.
#[test]
#[ignore = "needs a CUDA device"]
fn gdn_split_with_gate_matches_the_two_launches() {
    use yomi_cuda::GdnGateArgs;
    let d = dev();
    let mut r = Rng::new(57);
    let (hk, dk, hv, dv) = (16usize, 128usize, 32usize, 128usize);
    let (kd, vd) = (hk * dk, hv * dv);
    let stride = 8192 + vd + 2 * hv;
    for t in [1usize, 9, 32] {
        let mc = d.upload(&r.vec(t * (2 * kd + vd), 1.0)).unwrap();
        let ab = d.upload(&r.vec(t * stride, 2.0)).unwrap();
        let bv = ab.slice(0..(t - 1) * stride + hv);
        let av = ab.slice(hv..hv + (t - 1) * stride + hv);
        let nea = d.upload(&r.vec(hv, 1.0)).unwrap();
        let dtb = d.upload(&r.vec(hv, 1.0)).unwrap();
        let outs = |d: &yomi_cuda::CudaDevice| {
            (
                poisoned(d, t * kd),
                poisoned(d, t * kd),
                poisoned(d, t * vd),
                poisoned(d, t * hv),
                poisoned(d, t * hv),
            )
        };
        let (mut q1, mut k1, mut v1, mut g1, mut b1) = outs(&d);
        d.gdn_split_qkv(&mc, t, hk, dk, vd, 0.088, 1e-6, &mut q1, &mut k1, &mut v1)
            .unwrap();
        d.gdn_gate_beta_strided(&bv, &av, stride, &nea, &dtb, &mut g1, &mut b1)
            .unwrap();
        let (mut q2, mut k2, mut v2, mut g2, mut b2) = outs(&d);
        d.gdn_split_qkv_gate(
            &mc,
            t,
            hk,
            dk,
            vd,
            0.088,
            1e-6,
            &mut q2,
            &mut k2,
            &mut v2,
            Some(GdnGateArgs {
                braw: &bv,
                araw: &av,
                stride,
                neg_exp_a: &nea,
                dt_bias: &dtb,
                g: &mut g2,
                beta: &mut b2,
            }),
        )
        .unwrap();
        let bits = |v: &cudarc::driver::CudaSlice<f32>| -> Vec<u32> {
            d.download(v).unwrap().iter().map(|x| x.to_bits()).collect()
        };
        for (name, a, b) in [
            ("q", &q1, &q2),
            ("k", &k1, &k2),
            ("v", &v1, &v2),
            ("g", &g1, &g2),
            ("beta", &b1, &b2),
        ] {
            assert!(bits(a) == bits(b), "{name} differs at T={t}");
        }
        println!("RESULT glue gdn_split_qkv + g/β in one launch T={t}: bit-identical");
    }
}

/// The tensor-core GEMV with the SwiGLU epilogue over the interleaved gate|up matrix gives
/// exactly what `linear` over the stacked [gate; up] matrix followed by `swiglu_pair` gives: at
/// Qwen3.5-9B's MLP (I = 12288, K = 4096) and at a small odd shape with a bias (I = 40: five
/// tiles, so a block of two m-tiles ends in a padding tile; K = 72: not whole 32-wide slabs),
/// T = 1, 4, 16, 32 (every n-tile count).
#[test]
#[ignore = "needs a CUDA device"]
fn linear_swiglu_matches_linear_then_swiglu_pair() {
    let d = dev();
    let mut r = Rng::new(71);
    let to_bf16 = |v: &[f32]| -> Vec<u16> {
        v.iter()
            .map(|x| half::bf16::from_f32(*x).to_bits())
            .collect()
    };
    for (inter, k, with_bias) in [(12288usize, 4096usize, false), (40, 72, true)] {
        let gate = to_bf16(&r.vec(inter * k, 0.05));
        let up = to_bf16(&r.vec(inter * k, 0.05));
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
        for t in [1usize, 4, 16, 32] {
            let x = d.upload(&r.vec(t * k, 1.0)).unwrap();
            let mut proj = poisoned(&d, t * 2 * inter);
            let mut want = poisoned(&d, t * inter);
            d.linear(&x, t, &stacked, bias.as_ref(), &mut proj).unwrap();
            d.swiglu_pair(&proj, t, inter, &mut want).unwrap();
            let mut got = poisoned(&d, t * inter);
            d.linear_swiglu(&x, t, &gu, bias.as_ref(), &mut got)
                .unwrap();
            let (got, want) = (d.download(&got).unwrap(), d.download(&want).unwrap());
            assert!(
                got.iter().all(|v| v.is_finite()),
                "I={inter} T={t}: unwritten output"
            );
            let bad = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert!(
                bad.is_none(),
                "I={inter} K={k} T={t}: first difference at {:?} ({} vs {})",
                bad.map(|i| (i / inter, i % inter)),
                got[bad.unwrap()],
                want[bad.unwrap()]
            );
            println!(
                "RESULT glue linear_swiglu I={inter} K={k} bias {with_bias} T={t}: bit-identical to linear + swiglu_pair"
            );
        }
    }
    // The interleaved matrix only goes through linear_swiglu: a bias of the wrong length and
    // an intermediate size that is not a multiple of 8 are errors.
    let gu = GateUpMatrix::from_bf16_bits(&d, 8, 8, &[0; 64], &[0; 64]).unwrap();
    let (x, mut out) = (poisoned(&d, 8), poisoned(&d, 8));
    let short = d.upload(&[0.0f32; 8]).unwrap();
    assert!(d.linear_swiglu(&x, 1, &gu, Some(&short), &mut out).is_err());
    assert!(GateUpMatrix::from_bf16_bits(&d, 12, 8, &[0; 96], &[0; 96]).is_err());
}

/// The causal conv folded into the q/k/v split (+ g/β) gives exactly what the two launches it
/// replaces give (conv1d_tree_strided into a [T, C] buffer, then gdn_split_qkv_gate on it): q,
/// k, v, g, β and every row's conv window, bit for bit. Qwen3.5-9B's GDN (16 key heads × 128,
/// 32 value heads × 128, conv width 4), the pre-conv rows read in place from a fused
/// projection's output: T = 1 and a 16-row chain from the committed window; a 16-row tree whose
/// rows leave the pass at different depths (so their windows mix pass rows and state rows);
/// and T = 1 and 16 as a later sub-pass of a chain, from the window carried out of a 32-row
/// sub-pass.
#[test]
#[ignore = "needs a CUDA device"]
fn gdn_conv_folded_into_split_matches_the_two_launches() {
    use yomi_cuda::{GdnConvArgs, GdnGateArgs};
    let d = dev();
    let mut r = Rng::new(83);
    let (hk, dk, hv, dv, kc) = (16usize, 128usize, 32usize, 128usize, 4usize);
    let (kd, vd) = (hk * dk, hv * dv);
    let c = 2 * kd + vd;
    let total = c + vd + 2 * hv;
    let wl = (kc - 1) * c;
    let state0 = d.upload(&r.vec(wl, 1.0)).unwrap();
    let cw = d.upload(&r.vec(c * kc, 0.5)).unwrap();
    let nea = d.upload(&r.vec(hv, 1.0)).unwrap();
    let dtb = d.upload(&r.vec(hv, 1.0)).unwrap();
    let bits = |v: &cudarc::driver::CudaSlice<f32>| -> Vec<u32> {
        let x = d.download(v).unwrap();
        assert!(x.iter().all(|v| v.is_finite()), "unwritten output");
        x.iter().map(|x| x.to_bits()).collect()
    };
    // One pass both ways from `state`; returns the reference's windows (for a carry).
    let run = |what: &str,
               parents: &[i32],
               state: &cudarc::driver::CudaSlice<f32>,
               r: &mut Rng|
     -> cudarc::driver::CudaSlice<f32> {
        let t = parents.len();
        let proj = d.upload(&r.vec(t * total, 1.5)).unwrap();
        let span = |off: usize, w: usize| off..off + (t - 1) * total + w;
        let (mv, bv, av) = (
            proj.slice(span(0, c)),
            proj.slice(span(c + vd, hv)),
            proj.slice(span(c + vd + hv, hv)),
        );
        let pd = d.upload(parents).unwrap();
        let outs = || {
            (
                poisoned(&d, t * kd),
                poisoned(&d, t * kd),
                poisoned(&d, t * vd),
                poisoned(&d, t * hv),
                poisoned(&d, t * hv),
                poisoned(&d, t * wl),
            )
        };
        let (mut q1, mut k1, mut v1, mut g1, mut b1, mut w1) = outs();
        let mut mc = poisoned(&d, t * c);
        d.conv1d_tree_strided(&mv, c, total, kc, state, &cw, &pd, t, &mut mc, &mut w1)
            .unwrap();
        d.gdn_split_qkv_gate(
            &mc,
            t,
            hk,
            dk,
            vd,
            0.088,
            1e-6,
            &mut q1,
            &mut k1,
            &mut v1,
            Some(GdnGateArgs {
                braw: &bv,
                araw: &av,
                stride: total,
                neg_exp_a: &nea,
                dt_bias: &dtb,
                g: &mut g1,
                beta: &mut b1,
            }),
        )
        .unwrap();
        let (mut q2, mut k2, mut v2, mut g2, mut b2, mut w2) = outs();
        d.gdn_conv_split_qkv_gate(
            GdnConvArgs {
                m: &mv,
                m_stride: total,
                kernel: kc,
                state,
                w: &cw,
                parents: &pd,
                windows: &mut w2,
            },
            t,
            hk,
            dk,
            vd,
            0.088,
            1e-6,
            &mut q2,
            &mut k2,
            &mut v2,
            Some(GdnGateArgs {
                braw: &bv,
                araw: &av,
                stride: total,
                neg_exp_a: &nea,
                dt_bias: &dtb,
                g: &mut g2,
                beta: &mut b2,
            }),
        )
        .unwrap();
        for (name, a, b) in [
            ("q", &q1, &q2),
            ("k", &k1, &k2),
            ("v", &v1, &v2),
            ("g", &g1, &g2),
            ("beta", &b1, &b2),
            ("windows", &w1, &w2),
        ] {
            assert!(bits(a) == bits(b), "{what}: {name} differs");
        }
        println!("RESULT glue gdn conv folded into the split, {what}: bit-identical");
        w1
    };
    let chain = |t: usize| -> Vec<i32> { (0..t as i32).map(|i| i - 1).collect() };
    run("T=1 from the committed window", &chain(1), &state0, &mut r);
    run("T=16 chain", &chain(16), &state0, &mut r);
    // Depths 0..5: row 0's window holds one pass row and two state rows, row 1's two and one,
    // row 6's (6 → 4 → 3 → 0) only pass rows.
    let tree = [-1, 0, 1, 0, 3, 2, 4, 6, 0, 8, 5, 10, 7, 1, 13, 9];
    run("T=16 tree", &tree, &state0, &mut r);
    // A 32-row first sub-pass, then later sub-passes from its last row's window, as forward.rs
    // carries it.
    let wins = run("T=32 chain", &chain(32), &state0, &mut r);
    let mut carry = d.alloc_zeros::<f32>(wl).unwrap();
    d.copy(&wins.slice(31 * wl..32 * wl), &mut carry).unwrap();
    run("T=1 from a carried window", &chain(1), &carry, &mut r);
    run("T=16 from a carried window", &chain(16), &carry, &mut r);
}
