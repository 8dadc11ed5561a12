//! Gated DeltaNet core: tree/chunk verify from the committed state, and commit.
//!
//! Per value head h (key head h / (Hv/Hk)), state S ∈ R^{dk×dv} in f32, the recurrence is
//!   S ← e^{g_t} S;  u_t = β_t (v_t − Sᵀ k_t);  S ← S + k_t u_tᵀ;  o_t = Sᵀ q_t.
//! One pass over T rows (a chain or a DFS-preorder tree) never writes the committed S₀. With
//! Γ_i = Σ_{j ∈ anc*(i)} g_j (log-decay along the root path) it solves, in row order,
//!   u_i = β_i (v_i − e^{Γ_i} S₀ᵀ k_i) − Σ_{j ∈ anc(i)} β_i (k_i·k_j) e^{Γ_i − Γ_j} u_j
//!   o_i = e^{Γ_i} S₀ᵀ q_i + Σ_{j ∈ anc*(i)} (q_i·k_j) e^{Γ_i − Γ_j} u_j
//! which is the WY / UT form of `qwen35.md` §3 with an ancestor mask (a chain is the ordinary
//! chunked form). Chains longer than [`CHUNK`] rows are cut into chunks of that size whose
//! boundary states live in scratch, and the state after the last row is written to
//! `final_state` so a commit of the whole chain is a buffer swap. Any other commit replays the
//! accepted rows' (k, v, g, β) with the recurrence ([`gdn_commit_replay`]).
//!
//! Shapes: q, k [T, Hk, dk] (l2-normed; q also scaled by dk^−½), v [T, Hv, dv], g, β [T, Hv],
//! S₀ and final_state [Hv, dk, dv], out [T, Hv, dv], head_major scratch [Hv, T, dv].
//! All exponents are differences Γ_i − Γ_j ≤ 0 along a path, so nothing overflows.

use std::cell::RefCell;
use yomi_core::TreeBatch;

use crate::simd;

/// Rows per chunk of a long chain (HF, FLA and llama.cpp use 64).
pub const CHUNK: usize = 64;

pub use yomi_core::GdnShape;

/// Per-row inputs of one pass.
pub struct GdnRows<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

#[derive(Default)]
struct HeadScratch {
    u: Vec<f32>,
    gam: Vec<f32>,
    s: Vec<f32>,
    sk: Vec<f32>,
    sq: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<HeadScratch> = RefCell::new(HeadScratch::default());
}

/// Verify pass: outputs for every row, reading S₀ only. `final_state` must be given for chains
/// (it receives the state after all rows) and is ignored for trees.
pub fn gdn_tree_forward(
    rows: &GdnRows,
    s0: &[f32],
    tree: &TreeBatch,
    shape: GdnShape,
    head_major: &mut [f32],
    out: &mut [f32],
    final_state: Option<&mut [f32]>,
) {
    let t = tree.len();
    let GdnShape { hv, dk, dv, .. } = shape;
    let sl = dk * dv;
    assert_eq!(s0.len(), hv * sl);
    assert_eq!(out.len(), t * hv * dv);
    assert_eq!(head_major.len(), t * hv * dv);
    match final_state {
        Some(fs) if tree.is_chain() => {
            assert_eq!(fs.len(), hv * sl);
            crate::pool::for_each_chunk_pair_mut(head_major, t * dv, fs, sl, |h, oh, fh| {
                head_forward(
                    h,
                    rows,
                    &s0[h * sl..(h + 1) * sl],
                    tree,
                    shape,
                    oh,
                    Some(fh),
                )
            });
        }
        _ => {
            crate::pool::for_each_chunk_mut(head_major, t * dv, 1, |h, oh| {
                head_forward(h, rows, &s0[h * sl..(h + 1) * sl], tree, shape, oh, None)
            });
        }
    }
    for h in 0..hv {
        for i in 0..t {
            out[(i * hv + h) * dv..(i * hv + h + 1) * dv]
                .copy_from_slice(&head_major[(h * t + i) * dv..(h * t + i + 1) * dv]);
        }
    }
}

fn head_forward(
    h: usize,
    rows: &GdnRows,
    s0: &[f32],
    tree: &TreeBatch,
    shape: GdnShape,
    out_h: &mut [f32],
    mut final_h: Option<&mut [f32]>,
) {
    let GdnShape { hk, hv, dk, dv } = shape;
    let t = tree.len();
    let kh = h / (hv / hk);
    let krow = |i: usize| &rows.k[(i * hk + kh) * dk..(i * hk + kh + 1) * dk];
    let qrow = |i: usize| &rows.q[(i * hk + kh) * dk..(i * hk + kh + 1) * dk];
    let vrow = |i: usize| &rows.v[(i * hv + h) * dv..(i * hv + h + 1) * dv];
    SCRATCH.with(|sc| {
        let mut sc = sc.borrow_mut();
        let HeadScratch { u, gam, s, sk, sq } = &mut *sc;
        u.resize(t * dv, 0.0);
        gam.resize(t, 0.0);
        sk.resize(dv, 0.0);
        sq.resize(dv, 0.0);
        let sub = if tree.is_chain() { CHUNK } else { t.max(1) };
        let mut use_scratch_state = false;
        let mut c0 = 0;
        while c0 < t {
            let c1 = (c0 + sub).min(t);
            {
                let st: &[f32] = if use_scratch_state { s } else { s0 };
                for i in c0..c1 {
                    let p = tree.parent(i);
                    let gi = rows.g[i * hv + h];
                    gam[i] = gi + if p >= c0 as i32 { gam[p as usize] } else { 0.0 };
                }
                for i in c0..c1 {
                    let (ki, qi, vi) = (krow(i), qrow(i), vrow(i));
                    let bi = rows.beta[i * hv + h];
                    sk.fill(0.0);
                    sq.fill(0.0);
                    for a in 0..dk {
                        let srow = &st[a * dv..(a + 1) * dv];
                        simd::axpy(ki[a], srow, sk);
                        simd::axpy(qi[a], srow, sq);
                    }
                    let eg = gam[i].exp();
                    let (done, rest) = u.split_at_mut(i * dv);
                    let ui = &mut rest[..dv];
                    let oi = &mut out_h[i * dv..(i + 1) * dv];
                    for d in 0..dv {
                        ui[d] = bi * (vi[d] - eg * sk[d]);
                        oi[d] = eg * sq[d];
                    }
                    let mut j = tree.parent(i);
                    while j >= c0 as i32 {
                        let ju = j as usize;
                        let kj = krow(ju);
                        let decay = (gam[i] - gam[ju]).exp();
                        let kk = simd::dot(ki, kj);
                        let qk = simd::dot(qi, kj);
                        let uj = &done[ju * dv..(ju + 1) * dv];
                        simd::axpy(-bi * kk * decay, uj, ui);
                        simd::axpy(qk * decay, uj, oi);
                        j = tree.parent(ju);
                    }
                    simd::axpy(simd::dot(qi, ki), ui, oi);
                }
            }
            // Carry the state past this chunk when another chunk follows or the caller wants it.
            let last = c1 == t;
            if tree.is_chain() && (!last || final_h.is_some()) {
                let glast = gam[c1 - 1];
                let e = glast.exp();
                s.resize(dk * dv, 0.0);
                let dst: &mut [f32] = if last {
                    let fh = final_h.as_deref_mut().expect("checked above");
                    let src: &[f32] = if use_scratch_state { s } else { s0 };
                    for (d, x) in fh.iter_mut().zip(src) {
                        *d = e * x;
                    }
                    fh
                } else {
                    if use_scratch_state {
                        s.iter_mut().for_each(|x| *x *= e);
                    } else {
                        for (d, x) in s.iter_mut().zip(s0) {
                            *d = e * x;
                        }
                    }
                    s
                };
                for j in c0..c1 {
                    let w = (glast - gam[j]).exp();
                    let kj = krow(j);
                    let uj = &u[j * dv..(j + 1) * dv];
                    for a in 0..dk {
                        simd::axpy(w * kj[a], uj, &mut dst[a * dv..(a + 1) * dv]);
                    }
                }
                use_scratch_state = true;
            }
            c0 = c1;
        }
    });
}

/// Commit by replay: runs the recurrence over the accepted rows into S (in place, f32).
pub fn gdn_commit_replay(rows: &GdnRows, accepted: &[usize], shape: GdnShape, s: &mut [f32]) {
    let GdnShape { hk, hv, dk, dv } = shape;
    let sl = dk * dv;
    crate::pool::for_each_chunk_mut(s, sl, 1, |h, sh| {
        SCRATCH.with(|sc| {
            let kh = h / (hv / hk);
            let sk = &mut sc.borrow_mut().sk;
            sk.resize(dv, 0.0);
            for &i in accepted {
                let ki = &rows.k[(i * hk + kh) * dk..(i * hk + kh + 1) * dk];
                let vi = &rows.v[(i * hv + h) * dv..(i * hv + h + 1) * dv];
                let e = rows.g[i * hv + h].exp();
                let b = rows.beta[i * hv + h];
                sk.fill(0.0);
                for a in 0..dk {
                    let srow = &mut sh[a * dv..(a + 1) * dv];
                    srow.iter_mut().for_each(|x| *x *= e);
                    simd::axpy(ki[a], srow, sk);
                }
                for d in 0..dv {
                    sk[d] = b * (vi[d] - sk[d]);
                }
                for a in 0..dk {
                    simd::axpy(ki[a], sk, &mut sh[a * dv..(a + 1) * dv]);
                }
            }
        })
    });
}

/// Reference twin: for every row, the plain f64 recurrence over its root→row path from S₀.
/// Returns (outputs [T, Hv, dv], state after the path to the last row).
pub fn gdn_reference(
    rows: &GdnRows,
    s0: &[f32],
    tree: &TreeBatch,
    shape: GdnShape,
) -> (Vec<f32>, Vec<f32>) {
    let GdnShape { hk, hv, dk, dv } = shape;
    let t = tree.len();
    let mut out = vec![0.0f32; t * hv * dv];
    let mut last_state = vec![0.0f32; hv * dk * dv];
    for i in 0..t {
        let path = tree.path_to(i);
        for h in 0..hv {
            let kh = h / (hv / hk);
            let mut s: Vec<f64> = s0[h * dk * dv..(h + 1) * dk * dv]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let mut o = vec![0.0f64; dv];
            for &r in &path {
                let k = &rows.k[(r * hk + kh) * dk..][..dk];
                let q = &rows.q[(r * hk + kh) * dk..][..dk];
                let v = &rows.v[(r * hv + h) * dv..][..dv];
                let e = (rows.g[r * hv + h] as f64).exp();
                let b = rows.beta[r * hv + h] as f64;
                s.iter_mut().for_each(|x| *x *= e);
                for d in 0..dv {
                    let sk: f64 = (0..dk).map(|a| s[a * dv + d] * k[a] as f64).sum();
                    let u = b * (v[d] as f64 - sk);
                    for a in 0..dk {
                        s[a * dv + d] += k[a] as f64 * u;
                    }
                }
                for d in 0..dv {
                    o[d] = (0..dk).map(|a| s[a * dv + d] * q[a] as f64).sum();
                }
            }
            for d in 0..dv {
                out[(i * hv + h) * dv + d] = o[d] as f32;
            }
            if i == t - 1 {
                for (dst, x) in last_state[h * dk * dv..(h + 1) * dk * dv]
                    .iter_mut()
                    .zip(&s)
                {
                    *dst = *x as f32;
                }
            }
        }
    }
    (out, last_state)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Inputs {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
        s0: Vec<f32>,
    }

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f32 / (1u64 << 53) as f32
        }
    }

    fn l2(x: &mut [f32], n: usize) {
        for r in x.chunks_mut(n) {
            let s: f32 = r.iter().map(|v| v * v).sum::<f32>().sqrt();
            r.iter_mut().for_each(|v| *v /= s);
        }
    }

    fn inputs(t: usize, sh: GdnShape, seed: u64) -> Inputs {
        let mut r = rng(seed);
        let mut n = |len: usize, scale: f32| -> Vec<f32> {
            (0..len).map(|_| (r() - 0.5) * 2.0 * scale).collect()
        };
        let mut q = n(t * sh.hk * sh.dk, 1.0);
        let mut k = n(t * sh.hk * sh.dk, 1.0);
        l2(&mut q, sh.dk);
        l2(&mut k, sh.dk);
        let qs = (sh.dk as f32).powf(-0.5);
        q.iter_mut().for_each(|x| *x *= qs);
        let v = n(t * sh.hv * sh.dv, 1.0);
        // log-decays in [−2, 0), betas in (0, 1)
        let g: Vec<f32> = n(t * sh.hv, 1.0)
            .iter()
            .map(|x| -(x.abs() * 2.0) - 1e-3)
            .collect();
        let beta: Vec<f32> = n(t * sh.hv, 1.0).iter().map(|x| 0.5 + 0.45 * x).collect();
        let s0 = n(sh.hv * sh.dk * sh.dv, 0.5);
        Inputs {
            q,
            k,
            v,
            g,
            beta,
            s0,
        }
    }

    fn max_err(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    fn run(tree: &TreeBatch, sh: GdnShape, seed: u64) -> (Vec<f32>, Vec<f32>, Inputs) {
        let t = tree.len();
        let x = inputs(t, sh, seed);
        let rows = GdnRows {
            q: &x.q,
            k: &x.k,
            v: &x.v,
            g: &x.g,
            beta: &x.beta,
        };
        let mut hm = vec![0.0; t * sh.hv * sh.dv];
        let mut out = vec![0.0; t * sh.hv * sh.dv];
        let mut fs = vec![0.0; sh.state_len()];
        gdn_tree_forward(&rows, &x.s0, tree, sh, &mut hm, &mut out, Some(&mut fs));
        (out, fs, x)
    }

    /// Real Qwen3.5-9B GDN head shapes (16 key / 32 value heads of 128) over a 24-node tree.
    #[test]
    fn tree_matches_per_path_recurrence_at_real_shapes() {
        let sh = GdnShape {
            hk: 16,
            hv: 32,
            dk: 128,
            dv: 128,
        };
        let mut parents: Vec<i32> = (0..16).map(|i| i - 1).collect();
        parents.extend([0, 16, 17, 1, 19, 2, 21, 22]);
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let (out, _, x) = run(&tree, sh, 7);
        let rows = GdnRows {
            q: &x.q,
            k: &x.k,
            v: &x.v,
            g: &x.g,
            beta: &x.beta,
        };
        let (want, _) = gdn_reference(&rows, &x.s0, &tree, sh);
        let e = max_err(&out, &want);
        assert!(e < 2e-5, "max abs err {e}");
    }

    /// A long chain crosses chunk boundaries (3 chunks of 64 + a remainder); outputs and the
    /// final state equal the recurrence.
    #[test]
    fn long_chain_matches_recurrence_and_final_state() {
        let sh = GdnShape {
            hk: 2,
            hv: 4,
            dk: 32,
            dv: 16,
        };
        let tree = TreeBatch::chain(3 * CHUNK + 11);
        let (out, fs, x) = run(&tree, sh, 11);
        let rows = GdnRows {
            q: &x.q,
            k: &x.k,
            v: &x.v,
            g: &x.g,
            beta: &x.beta,
        };
        let (want, want_state) = gdn_reference(&rows, &x.s0, &tree, sh);
        assert!(
            max_err(&out, &want) < 2e-5,
            "out err {}",
            max_err(&out, &want)
        );
        assert!(
            max_err(&fs, &want_state) < 2e-5,
            "state err {}",
            max_err(&fs, &want_state)
        );
    }

    /// Commit by replay of any accepted path equals the recurrence along that path.
    #[test]
    fn replay_commit_matches_path_state() {
        let sh = GdnShape {
            hk: 2,
            hv: 6,
            dk: 32,
            dv: 32,
        };
        let parents = [-1, 0, 1, 1, 3, 0, 5, 6];
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let (_, _, x) = run(&tree, sh, 5);
        let rows = GdnRows {
            q: &x.q,
            k: &x.k,
            v: &x.v,
            g: &x.g,
            beta: &x.beta,
        };
        for leaf in [2usize, 4, 7] {
            let path = tree.path_to(leaf);
            let mut s = x.s0.clone();
            gdn_commit_replay(&rows, &path, sh, &mut s);
            let chain = TreeBatch::chain(path.len());
            let pick = |src: &[f32], w: usize| -> Vec<f32> {
                path.iter()
                    .flat_map(|&i| src[i * w..(i + 1) * w].to_vec())
                    .collect()
            };
            let (q, k, v) = (
                pick(&x.q, sh.hk * sh.dk),
                pick(&x.k, sh.hk * sh.dk),
                pick(&x.v, sh.hv * sh.dv),
            );
            let (g, b) = (pick(&x.g, sh.hv), pick(&x.beta, sh.hv));
            let prow = GdnRows {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &b,
            };
            let (_, want) = gdn_reference(&prow, &x.s0, &chain, sh);
            assert!(
                max_err(&s, &want) < 1e-5,
                "leaf {leaf}: {}",
                max_err(&s, &want)
            );
        }
    }
}
