//! The CPU's implementation of the backend op set (`yomi_core::backend`): host `Vec<f32>`
//! buffers, weights as loaded (packed for the kernels where [`crate::quant::pack`] applies) and
//! the K/V and gated-delta-rule storage of [`crate::layer_state`]. Each op calls the kernel of
//! its module; the fused forms (add + norm inside the next linears' loops, SwiGLU inside the
//! down projection's) are bitwise the composition the trait's defaults spell out.

use yomi_core::backend::{AttnCore, AttnHeads, Backend, BlockMask, GdnParams, RotaryFill};
use yomi_core::{GdnShape, TreeBatch};

use crate::activation::{sigmoid, softplus, swiglu};
use crate::attention::{AttnShape, attention_block, attention_tree};
use crate::conv::conv1d_tree;
use crate::gdn::{GdnRows, gdn_commit_replay, gdn_tree_forward};
use crate::kv_cache::{KvDtype, KvRows};
use crate::layer_state::{AttnCache, GdnState};
use crate::linear::{linear, linear_many_add_norm, linear_swiglu};
use crate::norm::{l2_norm_inplace, rms_norm, rms_norm_gated_inplace, rms_norm_inplace};
use crate::quant::AddNorm;
use crate::rope::rotate;
use yomi_weights::Matrix;

/// The CPU backend (its thread pool is process-wide, see [`crate::pool`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

/// The l2-norm epsilon of the gated delta rule's q and k (as in the reference's
/// `l2norm(x, eps=1e-6)`).
const L2_EPS: f32 = 1e-6;

/// The first `n` values of a buffer, growing it but never shrinking it: one buffer serves
/// several sizes per layer, and a resize down and up again would zero-fill the difference on
/// every layer. The values are stale either way: every op overwrites its output before reading.
pub fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

thread_local! {
    /// One dequantized embedding row (tables stored as bf16, f16 or blocks).
    static EMBED_ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`linear_many_add_norm`] over `N` weights with the outputs sized, without allocating.
fn many_add_norm<const N: usize>(
    input: AddNorm<'_>,
    t: usize,
    ws: &[&Matrix],
    biases: &[Option<&Vec<f32>>],
    outs: &mut [&mut Vec<f32>],
) {
    let bs: [Option<&[f32]>; N] = std::array::from_fn(|i| biases[i].map(|b| b.as_slice()));
    let mut it = outs.iter_mut().zip(ws);
    let mut os: [&mut [f32]; N] = std::array::from_fn(|_| {
        let (o, w) = it.next().expect("one output per weight");
        sized(o, t * w.rows)
    });
    linear_many_add_norm(input, t, ws, &bs, &mut os);
}

/// Which rows a pass's queries see after the committed ones.
#[derive(Clone, Copy)]
enum Seen<'a> {
    /// Each row its path in the tree.
    Tree(&'a TreeBatch),
    /// The whole block, as far as the mask shows it.
    Block(BlockMask),
}

/// Writes the pass's `k`, `v` after the `committed` rows of `cache` and runs the attention
/// kernel of `rows` on the cache's element type: `o` [t, n_heads, hd].
fn attend(
    cache: &mut AttnCache,
    committed: usize,
    t: usize,
    rows: Seen<'_>,
    heads: AttnHeads,
    [q, k, v]: [&Vec<f32>; 3],
    o: &mut Vec<f32>,
) {
    let AttnHeads {
        n_heads,
        n_kv,
        head_dim,
    } = heads;
    let kv = t * n_kv * head_dim;
    cache.write_rows(committed, &k[..kv], &v[..kv]);
    let layout = cache.layout();
    let q = &q[..t * n_heads * head_dim];
    let o = sized(o, t * n_heads * head_dim);
    let shape = AttnShape {
        n_heads,
        n_kv,
        head_dim,
    };
    let scale = 1.0 / (head_dim as f32).sqrt();
    macro_rules! run {
        ($k:expr, $v:expr) => {
            match rows {
                Seen::Tree(tree) => {
                    attention_tree(q, $k, $v, layout, committed, tree, shape, scale, o)
                }
                Seen::Block(mask) => {
                    attention_block(q, $k, $v, layout, committed, t, mask, shape, scale, o)
                }
            }
        };
    }
    match (&cache.k, &cache.v) {
        (KvRows::F32(k), KvRows::F32(v)) => run!(k, v),
        (KvRows::F16(k), KvRows::F16(v)) => run!(k, v),
        _ => unreachable!("AttnCache::new makes K and V caches of one element type"),
    }
}

/// A pass's per-row inputs on the CPU: the host values the row ops read.
#[derive(Clone, Debug)]
pub struct PassRows {
    pub tokens: Vec<u32>,
    pub tree: TreeBatch,
    pub committed: usize,
    /// The rows' rotary `[cos | sin]` [t, rot_dim] (empty without attention).
    pub cos_sin: Vec<f32>,
}

impl Default for PassRows {
    fn default() -> Self {
        PassRows {
            tokens: Vec::new(),
            tree: TreeBatch::chain(0),
            committed: 0,
            cos_sin: Vec::new(),
        }
    }
}

impl Backend for Cpu {
    type Buf = Vec<f32>;
    type Linear = Matrix;
    type Vector = Vec<f32>;
    type KvCache = AttnCache;
    type GdnState = GdnState;
    type Rows = PassRows;

    fn linear_dims(&self, w: &Matrix) -> (usize, usize) {
        (w.rows, w.cols)
    }

    fn vector_len(&self, v: &Vec<f32>) -> usize {
        v.len()
    }

    fn set_rows(
        &self,
        rows: &mut PassRows,
        tokens: &[u32],
        tree: &TreeBatch,
        committed: usize,
        rotary: Option<RotaryFill<'_>>,
    ) {
        rows.tokens.clear();
        rows.tokens.extend_from_slice(tokens);
        rows.tree.copy_from(tree);
        rows.committed = committed;
        rows.cos_sin.clear();
        if let Some(r) = rotary {
            rows.cos_sin.resize(tokens.len() * r.rot_dim, 0.0);
            for (i, row) in rows.cos_sin.chunks_exact_mut(r.rot_dim).enumerate() {
                (r.cos_sin)(r.offset + committed + tree.depth(i) as usize, row);
            }
        }
    }

    fn embed_rows(&self, table: &Matrix, rows: &PassRows, out: &mut Vec<f32>) {
        self.embed(table, &rows.tokens, out);
    }

    fn embed(&self, table: &Matrix, tokens: &[u32], out: &mut Vec<f32>) {
        let h = table.cols;
        let out = sized(out, tokens.len() * h);
        EMBED_ROW.with(|tmp| {
            let tmp = &mut *tmp.borrow_mut();
            let tmp = sized(tmp, h);
            for (row, &tok) in out.chunks_exact_mut(h).zip(tokens) {
                row.copy_from_slice(table.row_f32(tok as usize, tmp));
            }
        });
    }

    fn fill_from_host(&self, out: &mut Vec<f32>, n: usize, fill: &mut dyn FnMut(&mut [f32])) {
        fill(sized(out, n));
    }

    fn read_rows(&self, buf: &Vec<f32>, row0: usize, n: usize, width: usize, out: &mut [f32]) {
        out[..n * width].copy_from_slice(&buf[row0 * width..(row0 + n) * width]);
    }

    fn add_inplace(&self, h: &mut Vec<f32>, add: &Vec<f32>, n: usize) {
        for (hv, av) in h[..n].iter_mut().zip(&add[..n]) {
            *hv += av;
        }
    }

    fn rms_norm_rows(
        &self,
        x: &Vec<f32>,
        row0: usize,
        n: usize,
        w: &Vec<f32>,
        eps: f32,
        out: &mut Vec<f32>,
    ) {
        let h = w.len();
        rms_norm(&x[row0 * h..(row0 + n) * h], w, eps, sized(out, n * h));
    }

    fn rms_norm_groups_inplace(&self, x: &mut Vec<f32>, n: usize, w: &Vec<f32>, eps: f32) {
        rms_norm_inplace(&mut x[..n], w, eps);
    }

    fn linear_at(
        &self,
        x: &Vec<f32>,
        row0: usize,
        t: usize,
        w: &Matrix,
        bias: Option<&Vec<f32>>,
        y: &mut Vec<f32>,
    ) {
        let x = &x[row0 * w.cols..(row0 + t) * w.cols];
        linear(x, t, w, bias.map(|b| b.as_slice()), sized(y, t * w.rows));
    }

    fn add_norm(
        &self,
        h: &mut Vec<f32>,
        add: Option<&Vec<f32>>,
        norm: &Vec<f32>,
        eps: f32,
        t: usize,
        x: &mut Vec<f32>,
    ) {
        let n = t * norm.len();
        AddNorm {
            h: &mut h[..n],
            add: add.map(|a| &a[..n]),
            weight: norm,
            eps,
            x: sized(x, n),
        }
        .run_serial();
    }

    fn add_norm_linears(
        &self,
        h: &mut Vec<f32>,
        add: Option<&Vec<f32>>,
        norm: &Vec<f32>,
        eps: f32,
        t: usize,
        x: &mut Vec<f32>,
        ws: &[&Matrix],
        biases: &[Option<&Vec<f32>>],
        outs: &mut [&mut Vec<f32>],
    ) {
        let n = t * norm.len();
        let input = AddNorm {
            h: &mut h[..n],
            add: add.map(|a| &a[..n]),
            weight: norm,
            eps,
            x: sized(x, n),
        };
        match ws.len() {
            2 => many_add_norm::<2>(input, t, ws, biases, outs),
            3 => many_add_norm::<3>(input, t, ws, biases, outs),
            4 => many_add_norm::<4>(input, t, ws, biases, outs),
            n => panic!("add_norm_linears: {n} weights (a block has 2 to 4 input projections)"),
        }
    }

    fn swiglu_inplace(&self, gate: &mut Vec<f32>, up: &Vec<f32>, n: usize) {
        swiglu(&mut gate[..n], &up[..n]);
    }

    fn swiglu_linear(
        &self,
        gate: &mut Vec<f32>,
        up: &Vec<f32>,
        t: usize,
        down: &Matrix,
        y: &mut Vec<f32>,
    ) {
        let n = t * down.cols;
        linear_swiglu(
            &mut gate[..n],
            &up[..n],
            t,
            down,
            None,
            sized(y, t * down.rows),
        );
    }

    fn split_query_gate(
        &self,
        qg: &Vec<f32>,
        rows: usize,
        hd: usize,
        q: &mut Vec<f32>,
        gate: &mut Vec<f32>,
    ) {
        let (q, gate) = (sized(q, rows * hd), sized(gate, rows * hd));
        for i in 0..rows {
            q[i * hd..(i + 1) * hd].copy_from_slice(&qg[i * 2 * hd..i * 2 * hd + hd]);
            gate[i * hd..(i + 1) * hd].copy_from_slice(&qg[i * 2 * hd + hd..(i + 1) * 2 * hd]);
        }
    }

    fn copy(&self, src: &Vec<f32>, n: usize, dst: &mut Vec<f32>) {
        sized(dst, n).copy_from_slice(&src[..n]);
    }

    fn rope_inplace(
        &self,
        x: &mut Vec<f32>,
        t: usize,
        heads: usize,
        head_dim: usize,
        rot_dim: usize,
        cos_sin: &Vec<f32>,
    ) {
        let row = heads * head_dim;
        for (xr, cs) in x[..t * row]
            .chunks_exact_mut(row)
            .zip(cos_sin.chunks_exact(rot_dim))
        {
            rotate(xr, head_dim, rot_dim, cs);
        }
    }

    fn attention(
        &self,
        cache: &mut AttnCache,
        committed: usize,
        tree: &TreeBatch,
        heads: AttnHeads,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        o: &mut Vec<f32>,
    ) {
        let rows = Seen::Tree(tree);
        attend(cache, committed, tree.len(), rows, heads, [q, k, v], o);
    }

    fn attention_core(
        &self,
        cache: &mut AttnCache,
        rows: &PassRows,
        c: AttnCore<'_, Self>,
        qg: &mut Vec<f32>,
        k: &mut Vec<f32>,
        v: &Vec<f32>,
        q: &mut Vec<f32>,
        gate: &mut Vec<f32>,
        o: &mut Vec<f32>,
    ) {
        let t = rows.tokens.len();
        let AttnHeads {
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
        } = c.heads;
        let q = if c.gated {
            self.split_query_gate(qg, t * nh, hd, q, gate);
            q
        } else {
            qg
        };
        if let Some(qn) = c.q_norm {
            self.rms_norm_groups_inplace(q, t * nh * hd, qn, c.eps);
        }
        if let Some(kn) = c.k_norm {
            self.rms_norm_groups_inplace(k, t * nkv * hd, kn, c.eps);
        }
        self.rope_inplace(q, t, nh, hd, c.rot_dim, &rows.cos_sin);
        self.rope_inplace(k, t, nkv, hd, c.rot_dim, &rows.cos_sin);
        self.attention(cache, rows.committed, &rows.tree, c.heads, q, k, v, o);
        if c.gated {
            self.sigmoid_gate_inplace(o, gate, t * nh * hd);
        }
    }

    fn new_kv_cache(&self, heads: AttnHeads, capacity: usize) -> AttnCache {
        // f32: a drafter's caches are small, and exact K/V keeps its reference tests tight.
        AttnCache::new(KvDtype::F32, heads.n_kv, heads.head_dim, capacity)
    }

    fn write_kv(
        &self,
        cache: &mut AttnCache,
        at: usize,
        t: usize,
        heads: AttnHeads,
        k: &Vec<f32>,
        v: &Vec<f32>,
    ) {
        let n = t * heads.n_kv * heads.head_dim;
        cache.write_rows(at, &k[..n], &v[..n]);
    }

    fn attention_block(
        &self,
        cache: &mut AttnCache,
        committed: usize,
        t: usize,
        heads: AttnHeads,
        mask: BlockMask,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        o: &mut Vec<f32>,
    ) {
        attend(cache, committed, t, Seen::Block(mask), heads, [q, k, v], o);
    }

    fn scale_inplace(&self, x: &mut Vec<f32>, n: usize, s: f32) {
        x[..n].iter_mut().for_each(|v| *v *= s);
    }

    fn sigmoid_gate_inplace(&self, o: &mut Vec<f32>, gate: &Vec<f32>, n: usize) {
        for (ov, gv) in o[..n].iter_mut().zip(&gate[..n]) {
            *ov *= sigmoid(*gv);
        }
    }

    fn gated_delta_rule(
        &self,
        gs: &mut GdnState,
        p: GdnParams<'_, Self>,
        rows: &PassRows,
        qkv: &mut Vec<f32>,
        b: &Vec<f32>,
        a: &Vec<f32>,
        scratch: [&mut Vec<f32>; 2],
        o: &mut Vec<f32>,
    ) {
        let tree = &rows.tree;
        let t = tree.len();
        let GdnShape { hk, hv, dk, dv } = p.shape;
        let (kd, vd) = (hk * dk, hv * dv);
        let c = 2 * kd + vd;
        let kc = p.conv_kernel;
        let [mc, q] = scratch;
        let mc = sized(mc, t * c);
        let win = sized(&mut gs.pend_windows, t * (kc - 1) * c);
        conv1d_tree(&qkv[..t * c], c, kc, &gs.conv, p.conv, tree, mc, win);
        let q = sized(q, t * kd);
        let pk = sized(&mut gs.pend_k, t * kd);
        let pv = sized(&mut gs.pend_v, t * vd);
        for i in 0..t {
            let row = &mc[i * c..(i + 1) * c];
            q[i * kd..(i + 1) * kd].copy_from_slice(&row[..kd]);
            pk[i * kd..(i + 1) * kd].copy_from_slice(&row[kd..2 * kd]);
            pv[i * vd..(i + 1) * vd].copy_from_slice(&row[2 * kd..]);
        }
        l2_norm_inplace(q, dk, L2_EPS);
        l2_norm_inplace(pk, dk, L2_EPS);
        let qs = 1.0 / (dk as f32).sqrt();
        q.iter_mut().for_each(|v| *v *= qs);
        let pg = sized(&mut gs.pend_g, t * hv);
        let pb = sized(&mut gs.pend_beta, t * hv);
        for i in 0..t {
            for h in 0..hv {
                let j = i * hv + h;
                pb[j] = sigmoid(b[j]);
                pg[j] = p.neg_exp_a[h] * softplus(a[j] + p.dt_bias[h]);
            }
        }
        let gdn_rows = GdnRows {
            q,
            k: pk,
            v: pv,
            g: pg,
            beta: pb,
        };
        let o = sized(o, t * vd);
        // The head-major scratch reuses the projected rows (conv_dim > value_dim), no longer
        // needed once the conv has read them.
        let hm = &mut qkv[..t * vd];
        let fin = if tree.is_chain() {
            Some(&mut gs.pend_final[..])
        } else {
            None
        };
        gdn_tree_forward(&gdn_rows, &gs.s, tree, p.shape, hm, o, fin);
    }

    fn gated_rms_norm_inplace(
        &self,
        o: &mut Vec<f32>,
        z: &Vec<f32>,
        n: usize,
        w: &Vec<f32>,
        eps: f32,
    ) {
        rms_norm_gated_inplace(&mut o[..n], &z[..n], w, eps);
    }

    fn commit_kv(&self, cache: &mut AttnCache, committed: usize, accepted: &[usize]) {
        for (k, &a) in accepted.iter().enumerate() {
            if a != k {
                // Sources increase and a ≥ k, so in-place copying never clobbers a later
                // source.
                cache.copy_row(committed + a, committed + k);
            }
        }
    }

    fn commit_gdn(&self, gs: &mut GdnState, shape: GdnShape, accepted: &[usize], whole: bool) {
        let Some(&last) = accepted.last() else {
            return;
        };
        if whole {
            std::mem::swap(&mut gs.s, &mut gs.pend_final);
        } else {
            let rows = GdnRows {
                q: &[],
                k: &gs.pend_k,
                v: &gs.pend_v,
                g: &gs.pend_g,
                beta: &gs.pend_beta,
            };
            gdn_commit_replay(&rows, accepted, shape, &mut gs.s);
        }
        let wl = gs.conv.len();
        gs.conv
            .copy_from_slice(&gs.pend_windows[last * wl..(last + 1) * wl]);
    }
}
