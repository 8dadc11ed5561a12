//! GPU parity tests and the GEMV timing. All `#[ignore]`d: they need a CUDA device and run only
//! when asked, e.g. on the lent H200:
//!
//! ```text
//! cargo test --release -p yomi-cuda --test gpu --no-run   # here; copy the binary over
//! ./gpu-<hash> --ignored --test-threads=1 --nocapture      # there
//! ```
//!
//! Each CUDA op is compared with its CPU twin from yomi-cpu (and, for GDN, also with the f64
//! reference recurrence) on fresh random inputs at real shapes (hidden 4096, FFN 12288, GDN
//! 16 key / 32 value heads of 128) for T = 1, 4, 16, 32. Outputs are poisoned with NaN before each
//! launch, so an unwritten element fails. Lines starting with `RESULT` are the numbers to keep.
//!
//! Tolerances (inputs of magnitude ≲ 1; both sides f32, only the summation order differs):
//! - GEMV: relative L2 error ‖gpu − cpu‖/‖cpu‖ ≤ 1e-5 and max |Δ| ≤ 1e-4·max|cpu| for every
//!   kernel variant (H200, 2026-11-30: SIMT about 3e-7, the tensor-core bf16 kernel, whose x is
//!   split into two bf16 parts, about 4e-6);
//! - RMSNorm, SwiGLU, RoPE: max |Δ| ≤ 1e-5·max(1, max|cpu|) (RoPE: sincosf vs Rust's sin/cos,
//!   each within 2 ulp);
//! - GDN decode and tree verify: max |Δ| ≤ 5e-5 against both the CPU twin and the f64
//!   recurrence (the CPU twin's own test allows 2e-5 against f64).

mod common;
use common::{Rng, dev, poisoned, time_ms};

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use yomi_core::TreeBatch;
use yomi_cpu::gdn::{self as cgdn, GdnRows};
use yomi_cpu::linear::linear as cpu_linear;
use yomi_cuda::{
    CudaDevice, DeviceMatrix, GdnDeviceRows, GdnShape, GemvKernel, WeightDtype, gemv_variant,
    linear_kernel,
};
use yomi_weights::{Matrix, WeightData};

struct Err {
    max_abs: f32,
    rel_l2: f64,
    max_ref: f32,
}

fn compare(gpu: &[f32], cpu: &[f32]) -> Err {
    assert_eq!(gpu.len(), cpu.len());
    let mut max_abs = 0.0f32;
    let (mut num, mut den) = (0.0f64, 0.0f64);
    let mut max_ref = 0.0f32;
    for (&g, &c) in gpu.iter().zip(cpu) {
        assert!(g.is_finite(), "non-finite GPU output (unwritten element?)");
        let d = (g - c).abs();
        max_abs = max_abs.max(d);
        num += (d as f64).powi(2);
        den += (c as f64).powi(2);
        max_ref = max_ref.max(c.abs());
    }
    Err {
        max_abs,
        rel_l2: (num / den.max(1e-300)).sqrt(),
        max_ref,
    }
}

fn report(op: &str, case: &str, e: &Err) {
    println!(
        "RESULT parity {op:<16} {case:<34} max|Δ| {:.2e}  rel-L2 {:.2e}  max|ref| {:.2e}",
        e.max_abs, e.rel_l2, e.max_ref
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_device_info_and_kernel_cache() {
    let d = dev();
    let t0 = std::time::Instant::now();
    d.load_all().unwrap();
    println!(
        "RESULT device {} (cc {}.{}, {}), kernel cache {:?}, NVRTC {:?}",
        d.name(),
        d.compute_capability().0,
        d.compute_capability().1,
        d.arch(),
        d.cache_dir(),
        yomi_cuda::kernels::nvrtc_version().unwrap()
    );
    for m in d.loaded_modules() {
        println!(
            "RESULT module {:<5} {} {} from_cache={} {:.1} ms",
            m.module, m.hash, m.arch, m.from_cache, m.millis
        );
    }
    println!(
        "RESULT all modules ready in {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn rms_norm_matches_cpu() {
    let d = dev();
    let n = 4096;
    let mut r = Rng::new(1);
    for t in [1, 4, 16, 32] {
        let x = r.vec(t * n, 3.0);
        let w: Vec<f32> = r.vec(n, 0.5).iter().map(|v| 1.0 + v).collect();
        let mut want = vec![0.0; t * n];
        yomi_cpu::norm::rms_norm(&x, &w, 1e-6, &mut want);
        let (xd, wd) = (d.upload(&x).unwrap(), d.upload(&w).unwrap());
        let mut out = poisoned(&d, t * n);
        d.rms_norm(&xd, &wd, 1e-6, &mut out).unwrap();
        let e = compare(&d.download(&out).unwrap(), &want);
        report("rms_norm", &format!("T={t} n={n}"), &e);
        assert!(e.max_abs <= 1e-5 * e.max_ref.max(1.0));
        // In place gives the same.
        let mut xi = d.upload(&x).unwrap();
        d.rms_norm_inplace(&mut xi, &wd, 1e-6).unwrap();
        let e2 = compare(&d.download(&xi).unwrap(), &want);
        assert!(e2.max_abs <= 1e-5 * e2.max_ref.max(1.0));
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn swiglu_matches_cpu() {
    let d = dev();
    let i = 12288;
    let mut r = Rng::new(2);
    for t in [1, 4, 16, 32] {
        let g = r.vec(t * i, 8.0);
        let u = r.vec(t * i, 2.0);
        let mut want = g.clone();
        yomi_cpu::activation::swiglu(&mut want, &u);
        let mut gd = d.upload(&g).unwrap();
        let ud = d.upload(&u).unwrap();
        d.swiglu(&mut gd, &ud).unwrap();
        let e = compare(&d.download(&gd).unwrap(), &want);
        report("swiglu", &format!("T={t} I={i}"), &e);
        assert!(e.max_abs <= 1e-5 * e.max_ref.max(1.0));
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn rope_matches_cpu() {
    use yomi_cpu::rope::RopeApply;
    use yomi_weights::{Rope, RopeScaling};
    let d = dev();
    let mut r = Rng::new(3);
    // (heads, head_dim, rotary dims, theta): Qwen3.5 full attention (partial 0.25) and Llama-3.
    for (heads, hd, rot, theta) in [(16, 256, 64, 1.0e7), (32, 128, 128, 5.0e5)] {
        let rope = Rope::new(theta, rot, &RopeScaling::None);
        for t in [1, 4, 16, 32] {
            let x = r.vec(t * heads * hd, 1.0);
            // Tree-like positions: committed 7000 + depth (some rows share a depth).
            let pos: Vec<i32> = (0..t).map(|i| 7000 + (i as i32 * 2) / 3).collect();
            let mut want = x.clone();
            let mut cs = vec![0.0; rot];
            for (i, &p) in pos.iter().enumerate() {
                rope.cos_sin(p as usize, &mut cs);
                rope.apply(&mut want[i * heads * hd..(i + 1) * heads * hd], hd, &cs);
            }
            let mut xd = d.upload(&x).unwrap();
            let pd = d.upload(&pos).unwrap();
            let fd = d.upload(&rope.inv_freq).unwrap();
            d.rope_neox(&mut xd, t, heads, hd, rot, &pd, &fd).unwrap();
            let got = d.download(&xd).unwrap();
            let e = compare(&got, &want);
            report(
                "rope_neox",
                &format!("T={t} H={heads} D={hd} rot={rot}"),
                &e,
            );
            assert!(e.max_abs <= 1e-5 * e.max_ref.max(1.0));
            // The pass-through part is untouched, bit for bit.
            for i in 0..t * heads {
                assert_eq!(
                    &got[i * hd + rot..(i + 1) * hd],
                    &x[i * hd + rot..(i + 1) * hd]
                );
            }
        }
    }
}

fn to_bits(dtype: WeightDtype, w: &[f32]) -> Vec<u16> {
    match dtype {
        WeightDtype::Bf16 => w
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_bits())
            .collect(),
        WeightDtype::F16 => w
            .iter()
            .map(|v| half::f16::from_f32(*v).to_bits())
            .collect(),
        _ => unreachable!(),
    }
}

fn matrices(
    d: &CudaDevice,
    dtype: WeightDtype,
    rows: usize,
    cols: usize,
    w: &[f32],
) -> (Matrix, DeviceMatrix) {
    match dtype {
        WeightDtype::F32 => (
            Matrix::new(rows, cols, WeightData::F32(w.to_vec())),
            DeviceMatrix::from_f32(d, rows, cols, w).unwrap(),
        ),
        _ => {
            let bits = to_bits(dtype, w);
            let data = if dtype == WeightDtype::Bf16 {
                WeightData::Bf16(bits.clone())
            } else {
                WeightData::F16(bits.clone())
            };
            (
                Matrix::new(rows, cols, data),
                DeviceMatrix::from_half_bits(d, rows, cols, dtype, &bits).unwrap(),
            )
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn linear_matches_cpu() {
    let d = dev();
    let mut r = Rng::new(4);
    // (rows = out, cols = in, dtypes): q/o-like 4096², FFN gate/up 12288×4096, down 4096×12288,
    // and a ragged shape (rows not a multiple of the warp tiles) with a bias.
    let all = [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16];
    let cases: [(usize, usize, &[WeightDtype], bool); 4] = [
        (4096, 4096, &all, false),
        (12288, 4096, &[WeightDtype::Bf16], false),
        (4096, 12288, &[WeightDtype::Bf16], false),
        (1001, 4104, &all, true),
    ];
    let mut failures = Vec::new();
    for (rows, cols, dtypes, with_bias) in cases {
        let w = r.vec(rows * cols, 0.5);
        let bias = r.vec(rows, 1.0);
        for &dtype in dtypes {
            let (cm, dm) = matrices(&d, dtype, rows, cols, &w);
            let bd = d.upload(&bias).unwrap();
            for t in [1, 3, 4, 16, 32] {
                let x = r.vec(t * cols, 1.0);
                let mut want = vec![0.0; t * rows];
                cpu_linear(&x, t, &cm, with_bias.then_some(&bias[..]), &mut want);
                let xd = d.upload(&x).unwrap();
                for (ri, variant) in gemv_variant(dtype, t).into_iter().enumerate() {
                    let mut out = poisoned(&d, t * rows);
                    d.linear_variant(
                        &xd,
                        t,
                        &dm,
                        with_bias.then_some(&bd),
                        &mut out,
                        Some(variant),
                    )
                    .unwrap();
                    let e = compare(&d.download(&out).unwrap(), &want);
                    if ri == 0 || matches!(variant, GemvKernel::Mma { .. }) {
                        report(
                            "linear",
                            &format!(
                                "{dtype:?} {rows}x{cols} T={t}{}{}",
                                if with_bias { " +bias" } else { "" },
                                if ri == 0 { "" } else { " mma" }
                            ),
                            &e,
                        );
                    }
                    if !(e.rel_l2 <= 1e-5 && e.max_abs <= 1e-4 * e.max_ref) {
                        failures.push(format!(
                            "{dtype:?} {rows}x{cols} T={t} {variant:?}: max {} rel {}",
                            e.max_abs, e.rel_l2
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Bad shapes are errors, not crashes.
    let (_, dm) = matrices(&d, WeightDtype::Bf16, 8, 16, &[0.5; 128]);
    let xd = d.upload(&[1.0f32; 33 * 16]).unwrap();
    let mut out = d.alloc_zeros::<f32>(32 * 8).unwrap();
    assert!(d.linear(&xd, 33, &dm, None, &mut out).is_err());
    assert!(d.linear(&xd, 0, &dm, None, &mut out).is_err());
}

const GDN: GdnShape = GdnShape {
    hk: 16,
    hv: 32,
    dk: 128,
    dv: 128,
};

struct GdnIn {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    s0: Vec<f32>,
}

impl GdnIn {
    fn new(t: usize, s: GdnShape, seed: u64) -> Self {
        let mut r = Rng::new(seed);
        let l2 = |x: &mut [f32], n: usize| {
            for row in x.chunks_mut(n) {
                let nn: f32 = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                row.iter_mut().for_each(|v| *v /= nn);
            }
        };
        let mut q = r.vec(t * s.hk * s.dk, 1.0);
        let mut k = r.vec(t * s.hk * s.dk, 1.0);
        l2(&mut q, s.dk);
        l2(&mut k, s.dk);
        let qs = (s.dk as f32).powf(-0.5);
        q.iter_mut().for_each(|v| *v *= qs);
        GdnIn {
            q,
            k,
            v: r.vec(t * s.hv * s.dv, 1.0),
            // log-decays in (−2, 0), betas in (0.05, 0.95)
            g: (0..t * s.hv).map(|_| -2.0 * r.f() - 1e-3).collect(),
            beta: (0..t * s.hv).map(|_| 0.05 + 0.9 * r.f()).collect(),
            s0: r.vec(s.state_len(), 0.5),
        }
    }
    fn rows(&self) -> GdnRows<'_> {
        GdnRows {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
        }
    }
}

struct GdnDev {
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    g: CudaSlice<f32>,
    beta: CudaSlice<f32>,
}

impl GdnDev {
    /// Rows `r0..r1` of the inputs.
    fn upload(d: &CudaDevice, x: &GdnIn, s: GdnShape, r0: usize, r1: usize) -> Self {
        let (kq, v, h) = (s.hk * s.dk, s.hv * s.dv, s.hv);
        GdnDev {
            q: d.upload(&x.q[r0 * kq..r1 * kq]).unwrap(),
            k: d.upload(&x.k[r0 * kq..r1 * kq]).unwrap(),
            v: d.upload(&x.v[r0 * v..r1 * v]).unwrap(),
            g: d.upload(&x.g[r0 * h..r1 * h]).unwrap(),
            beta: d.upload(&x.beta[r0 * h..r1 * h]).unwrap(),
        }
    }
    fn rows(&self) -> GdnDeviceRows<'_> {
        GdnDeviceRows {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
        }
    }
}

/// CPU twin over a tree: (outputs, final state for chains) from the fast kernel.
fn cpu_tree(x: &GdnIn, tree: &TreeBatch, s: GdnShape) -> (Vec<f32>, Vec<f32>) {
    let t = tree.len();
    let mut hm = vec![0.0; t * s.hv * s.dv];
    let mut out = vec![0.0; t * s.hv * s.dv];
    let mut fs = vec![0.0; s.state_len()];
    cgdn::gdn_tree_forward(&x.rows(), &x.s0, tree, s, &mut hm, &mut out, Some(&mut fs));
    (out, fs)
}

#[test]
#[ignore = "needs a CUDA device"]
fn gdn_decode_steps_match_cpu() {
    let d = dev();
    let s = GDN;
    for steps in [1usize, 4, 16, 32] {
        let x = GdnIn::new(steps, s, 10 + steps as u64);
        let chain = TreeBatch::chain(steps);
        let (want_o, want_s) = cgdn::gdn_reference(&x.rows(), &x.s0, &chain, s);
        let (twin_o, twin_s) = cpu_tree(&x, &chain, s);
        let mut state = d.upload(&x.s0).unwrap();
        let mut got = Vec::with_capacity(steps * s.hv * s.dv);
        for i in 0..steps {
            let rows = GdnDev::upload(&d, &x, s, i, i + 1);
            let mut o = poisoned(&d, s.hv * s.dv);
            d.gdn_decode_step(s, &rows.rows(), &mut state, &mut o)
                .unwrap();
            got.extend(d.download(&o).unwrap());
        }
        let got_s = d.download(&state).unwrap();
        let (eo, es) = (compare(&got, &twin_o), compare(&got_s, &twin_s));
        report("gdn_decode", &format!("{steps} steps: o vs twin"), &eo);
        report("gdn_decode", &format!("{steps} steps: S vs twin"), &es);
        let (fo, fs) = (compare(&got, &want_o), compare(&got_s, &want_s));
        report("gdn_decode", &format!("{steps} steps: o vs f64"), &fo);
        report("gdn_decode", &format!("{steps} steps: S vs f64"), &fs);
        for e in [eo, es, fo, fs] {
            assert!(e.max_abs <= 5e-5, "max |Δ| {}", e.max_abs);
        }
    }
}

/// The out-of-place step (what a one-row pass runs) against a one-row tree verify with its final
/// state, the CPU twin and f64; S₀ must stay unchanged.
#[test]
#[ignore = "needs a CUDA device"]
fn gdn_step_matches_one_row_verify() {
    let d = dev();
    for (s, seed) in [
        (GDN, 5u64),
        (
            GdnShape {
                hk: 2,
                hv: 4,
                dk: 64,
                dv: 32,
            },
            6,
        ),
    ] {
        let x = GdnIn::new(1, s, seed);
        let chain = TreeBatch::chain(1);
        let (want_o, want_s) = cgdn::gdn_reference(&x.rows(), &x.s0, &chain, s);
        let (twin_o, twin_s) = cpu_tree(&x, &chain, s);
        let rows = GdnDev::upload(&d, &x, s, 0, 1);
        let s0 = d.upload(&x.s0).unwrap();
        let mut next = poisoned(&d, s.state_len());
        let mut o = poisoned(&d, s.hv * s.dv);
        d.gdn_step(s, &rows.rows(), &s0, &mut next, &mut o).unwrap();
        let (got_o, got_s) = (d.download(&o).unwrap(), d.download(&next).unwrap());
        assert_eq!(d.download(&s0).unwrap(), x.s0, "S₀ was written");
        let pd = d.upload(&[-1i32]).unwrap();
        let mut vo = poisoned(&d, s.hv * s.dv);
        let mut vfin = poisoned(&d, s.state_len());
        d.gdn_tree_verify(s, 1, &rows.rows(), &pd, &s0, &mut vo, Some(&mut vfin))
            .unwrap();
        let (ver_o, ver_s) = (d.download(&vo).unwrap(), d.download(&vfin).unwrap());
        for (what, got, want) in [
            ("o vs verify", &got_o, &ver_o),
            ("S vs verify", &got_s, &ver_s),
            ("o vs twin", &got_o, &twin_o),
            ("S vs twin", &got_s, &twin_s),
            ("o vs f64", &got_o, &want_o),
            ("S vs f64", &got_s, &want_s),
        ] {
            let e = compare(got, want);
            report("gdn_step", &format!("{s:?} {what}"), &e);
            assert!(e.max_abs <= 5e-6, "{what}: max |Δ| {}", e.max_abs);
        }
    }
}

fn random_tree(t: usize, seed: u64) -> Vec<i32> {
    let mut r = Rng::new(seed);
    (0..t)
        .map(|i| {
            if i == 0 {
                -1
            } else {
                // Mostly deep (parent i−1), sometimes a branch from an earlier row.
                if r.f() < 0.6 {
                    i as i32 - 1
                } else {
                    (r.f() * i as f32) as i32
                }
            }
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA device"]
fn gdn_tree_verify_matches_cpu() {
    let d = dev();
    let s = GDN;
    let mut cases: Vec<(String, Vec<i32>)> = [1usize, 4, 16, 32]
        .iter()
        .map(|&t| {
            (
                format!("chain T={t}"),
                (0..t as i32).map(|i| i - 1).collect(),
            )
        })
        .collect();
    let mut p24: Vec<i32> = (0..16).map(|i| i - 1).collect();
    p24.extend([0, 16, 17, 1, 19, 2, 21, 22]);
    cases.push(("tree T=24 (yomi-cpu's test tree)".into(), p24));
    cases.push(("random tree T=16".into(), random_tree(16, 5)));
    cases.push(("random tree T=32".into(), random_tree(32, 6)));
    for (ci, (name, parents)) in cases.into_iter().enumerate() {
        let t = parents.len();
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let x = GdnIn::new(t, s, 100 + ci as u64);
        let (want_o, want_s) = cgdn::gdn_reference(&x.rows(), &x.s0, &tree, s);
        let (twin_o, twin_s) = cpu_tree(&x, &tree, s);
        let rows = GdnDev::upload(&d, &x, s, 0, t);
        let s0 = d.upload(&x.s0).unwrap();
        let pd = d.upload(&parents).unwrap();
        let mut o = poisoned(&d, t * s.hv * s.dv);
        let mut fin = poisoned(&d, s.state_len());
        d.gdn_tree_verify(s, t, &rows.rows(), &pd, &s0, &mut o, Some(&mut fin))
            .unwrap();
        let got_o = d.download(&o).unwrap();
        let got_s = d.download(&fin).unwrap();
        assert_eq!(d.download(&s0).unwrap(), x.s0, "S₀ must not be written");
        let eo = compare(&got_o, &twin_o);
        report("gdn_tree_verify", &format!("{name}: o vs twin"), &eo);
        let fo = compare(&got_o, &want_o);
        report("gdn_tree_verify", &format!("{name}: o vs f64"), &fo);
        let fs = compare(&got_s, &want_s);
        report("gdn_tree_verify", &format!("{name}: final vs f64"), &fs);
        let mut errs = vec![eo, fo, fs];
        if tree.is_chain() {
            let es = compare(&got_s, &twin_s);
            report("gdn_tree_verify", &format!("{name}: final vs twin"), &es);
            errs.push(es);
        }
        for e in errs {
            assert!(e.max_abs <= 5e-5, "{name}: max |Δ| {}", e.max_abs);
        }
        // Without a final state the outputs are the same.
        let mut o2 = poisoned(&d, t * s.hv * s.dv);
        d.gdn_tree_verify(s, t, &rows.rows(), &pd, &s0, &mut o2, None)
            .unwrap();
        assert_eq!(d.download(&o2).unwrap(), got_o);
    }
}

// ------------------------------------------------------------------------------------------
// Timing

fn stream(d: &CudaDevice) -> &Arc<cudarc::driver::CudaStream> {
    d.stream()
}

#[test]
#[ignore = "needs a CUDA device"]
fn z_gemv_timing_vs_copy_bandwidth() {
    let d = dev();
    // Device-to-device copy of 1 GiB: bytes read + bytes written over the time.
    let n = 1usize << 28;
    let src = d.upload(&vec![1.0f32; n]).unwrap();
    let mut dst = d.alloc_zeros::<f32>(n).unwrap();
    let ms = time_ms(&d, 3, 20, || d.copy(&src, &mut dst).unwrap());
    let copy_gbs = 2.0 * (n * 4) as f64 / (ms * 1e-3) / 1e9;
    println!("RESULT copy d2d 1 GiB: {ms:.3} ms, {copy_gbs:.0} GB/s (read + write), median of 20");
    drop((src, dst));

    let mut r = Rng::new(9);
    // (rows = out, cols = in)
    for (rows, cols) in [(4096usize, 4096usize), (12288, 4096), (4096, 12288)] {
        let wbytes = rows * cols * 2;
        // Enough copies of the matrix that a round of launches streams ≥ 256 MB (L2 is 60 MB).
        let copies = (256usize << 20).div_ceil(wbytes).max(3);
        let vals = r.vec(rows * cols, 0.5);
        // bf16 (tensor cores, tile layout) at every T; f16 (SIMT, row-major, same bytes) at T = 1
        // as the reference of what a plain streaming GEMV reaches.
        for (dtype, ts) in [
            (WeightDtype::Bf16, &[1usize, 4, 16, 32][..]),
            (WeightDtype::F16, &[1usize][..]),
        ] {
            let w = to_bits(dtype, &vals);
            let mats: Vec<DeviceMatrix> = (0..copies)
                .map(|_| DeviceMatrix::from_half_bits(&d, rows, cols, dtype, &w).unwrap())
                .collect();
            for &t in ts {
                let xd = d.upload(&r.vec(t * cols, 1.0)).unwrap();
                let mut out = d.alloc_zeros::<f32>(t * rows).unwrap();
                let bytes = (wbytes + t * cols * 4 + t * rows * 4) as f64;
                for variant in gemv_variant(dtype, t) {
                    let mut round = || {
                        for m in &mats {
                            d.linear_variant(&xd, t, m, None, &mut out, Some(variant))
                                .unwrap();
                        }
                    };
                    let per = time_ms(&d, 3, 30, &mut round) / copies as f64;
                    // The same round captured as a CUDA graph (no launch gaps), if capture works.
                    let graph_per = (|| {
                        stream(&d)
                            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                            .ok()?;
                        round();
                        let g = stream(&d).end_capture(CUgraphInstantiate_flags(0)).ok()??;
                        g.upload().ok()?;
                        Some(time_ms(&d, 3, 30, || g.launch().unwrap()) / copies as f64)
                    })();
                    let gbs = bytes / (per * 1e-3) / 1e9;
                    let tflops = 2.0 * (t * rows * cols) as f64 / (per * 1e-3) / 1e12;
                    let graph = graph_per
                        .map(|g| {
                            format!(
                                "graph {:.2} µs {:.0} GB/s ({:.0}%)",
                                g * 1e3,
                                bytes / (g * 1e-3) / 1e9,
                                100.0 * bytes / (g * 1e-3) / 1e9 / copy_gbs
                            )
                        })
                        .unwrap_or_else(|| "graph capture failed".into());
                    println!(
                        "RESULT gemv {dtype:?} {rows}x{cols} T={t:<2} {:<18}{}: {:.2} µs {gbs:.0} GB/s = {:.0}% of copy, {tflops:.1} TFLOP/s | {graph}",
                        format!("{variant:?}"),
                        if variant == linear_kernel(dtype, t, rows) {
                            " (default)"
                        } else {
                            ""
                        },
                        per * 1e3,
                        100.0 * gbs / copy_gbs
                    );
                }
            }
        }
    }
}

/// GDN decode step and tree verify timings at the real head shapes, over 32 layers' states
/// (64 MB, more than the 60 MB L2) so each launch streams its state from memory.
#[test]
#[ignore = "needs a CUDA device"]
fn z_gdn_timing() {
    let d = dev();
    let s = GDN;
    let layers = 32;
    let x = GdnIn::new(32, s, 77);
    let mut states: Vec<CudaSlice<f32>> = (0..layers).map(|_| d.upload(&x.s0).unwrap()).collect();
    let sbytes = (s.state_len() * 4) as f64;
    let one = GdnDev::upload(&d, &x, s, 0, 1);
    let mut o = d.alloc_zeros::<f32>(s.hv * s.dv).unwrap();
    let per = time_ms(&d, 3, 30, || {
        for st in states.iter_mut() {
            d.gdn_decode_step(s, &one.rows(), st, &mut o).unwrap();
        }
    }) / layers as f64;
    println!(
        "RESULT gdn_decode 16/32 heads of 128: {:.2} µs per layer, {:.0} GB/s (state read + write)",
        per * 1e3,
        2.0 * sbytes / (per * 1e-3) / 1e9
    );
    let mut fins: Vec<CudaSlice<f32>> = (0..layers)
        .map(|_| d.alloc_zeros::<f32>(s.state_len()).unwrap())
        .collect();
    let per = time_ms(&d, 3, 30, || {
        for (st, fin) in states.iter().zip(fins.iter_mut()) {
            d.gdn_step(s, &one.rows(), st, fin, &mut o).unwrap();
        }
    }) / layers as f64;
    println!(
        "RESULT gdn_step (out of place) 16/32 heads of 128: {:.2} µs per layer, {:.0} GB/s (state read + write)",
        per * 1e3,
        2.0 * sbytes / (per * 1e-3) / 1e9
    );
    for t in [1usize, 4, 16, 32] {
        let rows = GdnDev::upload(&d, &x, s, 0, t);
        let parents: Vec<i32> = (0..t as i32).map(|i| i - 1).collect();
        let pd = d.upload(&parents).unwrap();
        let mut ot = d.alloc_zeros::<f32>(t * s.hv * s.dv).unwrap();
        for with_final in [false, true] {
            let per = time_ms(&d, 3, 30, || {
                for (st, fin) in states.iter().zip(fins.iter_mut()) {
                    d.gdn_tree_verify(
                        s,
                        t,
                        &rows.rows(),
                        &pd,
                        st,
                        &mut ot,
                        with_final.then_some(fin),
                    )
                    .unwrap();
                }
            }) / layers as f64;
            let bytes = sbytes * if with_final { 2.0 } else { 1.0 };
            println!(
                "RESULT gdn_tree_verify chain T={t:<2} final={with_final:<5}: {:.2} µs per layer, {:.0} GB/s (state bytes)",
                per * 1e3,
                bytes / (per * 1e-3) / 1e9
            );
        }
    }
}
