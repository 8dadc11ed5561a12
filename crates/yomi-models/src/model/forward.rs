//! One forward pass over T rows (a prefill chunk, a decode step or a draft tree) and the
//! commit of its accepted rows. No committed state is written by `forward`.

use anyhow::{Result, bail};
use yomi_core::{TopRows, TreeBatch};

use yomi_cpu::activation::{sigmoid, softplus};
use yomi_cpu::attention::{AttnShape, attention_tree};
use yomi_cpu::conv::conv1d_tree;
use yomi_cpu::gdn::{GdnRows, GdnShape, gdn_commit_replay, gdn_tree_forward};
use yomi_cpu::linear::{linear, linear_many_add_norm, linear_swiglu};
use yomi_cpu::norm::{l2_norm_inplace, rms_norm, rms_norm_gated_inplace, rms_norm_inplace};
use yomi_cpu::quant::AddNorm;
use yomi_cpu::rope::RopeApply;

use super::weights::{AttnWeights, GdnWeights, Mixer, Model};
use crate::KvRows;
use crate::accel::{AccelState, Accelerator};
use crate::state::{AttnCache, GdnState, LayerState, State};

/// Which rows of the pass get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// Every row (tree verification, tracing).
    All,
    /// Only the last row (prefill, plain decode).
    Last,
    /// None (prefill chunks before the last).
    None,
}

impl LogitRows {
    /// How many rows of a pass of `t` rows get logits.
    pub fn count(self, t: usize) -> usize {
        match self {
            LogitRows::All => t,
            LogitRows::Last => usize::from(t > 0),
            LogitRows::None => 0,
        }
    }
}

/// The residual stream of a pass at chosen points, for drafters that read the target's hidden
/// states (DFlash, EAGLE-3, MTP) and for checks against references. Point i < L is the stream
/// entering layer i (point 0: the embeddings), point L the final norm's output (L = number of
/// layers): the convention of Hugging Face's `output_hidden_states` and of the fixtures'
/// `hidden_states.i`. A pass fills `hidden[j]` with [T, H] for `points[j]`, every row of the
/// pass in its order; every backend fills them alike.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HiddenTaps {
    points: Vec<usize>,
    /// [T, H] per point, in `points` order (filled by the pass).
    pub hidden: Vec<Vec<f32>>,
}

impl HiddenTaps {
    /// Taps at `points` (any order, duplicates dropped; kept sorted).
    pub fn new(points: impl IntoIterator<Item = usize>) -> Self {
        let mut points: Vec<usize> = points.into_iter().collect();
        points.sort_unstable();
        points.dedup();
        HiddenTaps {
            hidden: vec![Vec::new(); points.len()],
            points,
        }
    }

    /// Every point of a model of `num_layers` layers: 0 ..= L.
    pub fn all(num_layers: usize) -> Self {
        Self::new(0..=num_layers)
    }

    /// The tapped points, ascending.
    pub fn points(&self) -> &[usize] {
        &self.points
    }

    /// The captured rows of `point` ([T, H]), if it is tapped.
    pub fn get(&self, point: usize) -> Option<&[f32]> {
        let j = self.points.binary_search(&point).ok()?;
        Some(&self.hidden[j])
    }

    /// Where point `point`'s rows go, if it is tapped.
    pub fn slot_mut(&mut self, point: usize) -> Option<&mut Vec<f32>> {
        let j = self.points.binary_search(&point).ok()?;
        Some(&mut self.hidden[j])
    }

    /// Checks the points against a model of `num_layers` layers and sizes every slot for
    /// `rows` rows of width `hidden` (a backend calls this before its pass).
    pub fn prepare(&mut self, num_layers: usize, rows: usize, hidden: usize) -> Result<()> {
        if let Some(&p) = self.points.last()
            && p > num_layers
        {
            bail!("hidden-state tap {p}: the model has points 0..={num_layers}");
        }
        self.hidden.resize(self.points.len(), Vec::new());
        for h in &mut self.hidden {
            h.clear();
            h.resize(rows * hidden, 0.0);
        }
        Ok(())
    }
}

/// Per-pass scratch buffers, reused across passes (no allocation once grown).
#[derive(Default)]
pub(crate) struct Scratch {
    h: Vec<f32>,
    x: Vec<f32>,
    y: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    d: Vec<f32>,
    e: Vec<f32>,
    f: Vec<f32>,
    /// The rotary cos/sin of every row of the pass ([T, rotary_dim]), computed once per pass:
    /// a row's position (committed length + tree depth) is the same in every layer, and
    /// computing it per layer cost ~30 µs per row and pass in `sin`/`cos` on the submitting
    /// thread (SmolLM2-135M, 30 layers) while the pool waited.
    cs: Vec<f32>,
    rows: Vec<f32>,
    /// The MLP's output of the layer before, not yet added to `h`: the next layer's first
    /// linears add it (see the layer loop).
    z: Vec<f32>,
}

/// The first `n` values of a scratch vector, growing it but never shrinking it: the scratch
/// vectors serve several sizes per layer (e.g. `a` holds q, then the MLP's gate), and a
/// resize down and up again zero-filled the difference on every layer (~1 % of a verify pass,
/// on the submitting thread while the pool waits). The values are stale either way: every
/// user overwrites its slice before reading it.
fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

const L2_EPS: f32 = 1e-6;

impl Model {
    /// Runs T rows through the model from the committed state and leaves them pending.
    /// `logits` receives [rows, V] for the rows `which` selects.
    pub fn forward(
        &self,
        st: &mut State,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        self.forward_with(st, tokens, tree, which, logits, None)
    }

    /// [`Model::forward`] that also captures the residual stream at `taps`' points (see
    /// [`HiddenTaps`]), on whichever backend runs the model.
    pub fn forward_with(
        &self,
        st: &mut State,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: &mut Vec<f32>,
        mut taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        self.check_pass(st, tokens, tree)?;
        let cfg = &self.cfg;
        let t = tokens.len();
        if let Some(tp) = taps.as_deref_mut() {
            tp.prepare(self.layers.len(), t, cfg.hidden_size)?;
        }
        if let Some(acc) = &self.accel {
            return self.accel_pass(acc.as_ref(), st, tokens, tree, |acc, ds, committed| {
                acc.forward(ds, committed, tokens, tree, which, logits, taps)
            });
        }
        if self.host_matrices_released {
            bail!("this model's weights live on its device only; the CPU path cannot run it");
        }
        let h_sz = cfg.hidden_size;
        let mut sc = std::mem::take(&mut st.scratch);
        {
            let Scratch { h, e, .. } = &mut sc;
            let h = sized(h, t * h_sz);
            let tmp = sized(e, h_sz);
            for (i, &tok) in tokens.iter().enumerate() {
                let src = self.embed.row_f32(tok as usize, tmp);
                h[i * h_sz..(i + 1) * h_sz].copy_from_slice(src);
            }
        }
        let committed = st.committed;
        if self
            .layers
            .iter()
            .any(|l| matches!(l.mixer, Mixer::Attention(_)))
        {
            let rd = cfg.rotary_dim;
            let cs = sized(&mut sc.cs, t * rd);
            for (i, row) in cs.chunks_exact_mut(rd).enumerate() {
                self.rope.cos_sin(committed + tree.depth(i) as usize, row);
            }
        }
        // The residual steps and RMSNorms run inside the next linears' loops, each thread on
        // the rows it quantizes (`linear_many_add_norm`): the mixer's output `y` is added to
        // `h` by the gate/up projections, and the MLP's output `z` by the next layer's first
        // projections (so it stays pending across the layer boundary). A tapped layer's start
        // adds it at once (the tap reads `h`).
        let eps = cfg.rms_norm_eps;
        let mut pending = false;
        for (li, layer) in self.layers.iter().enumerate() {
            if let Some(slot) = taps.as_deref_mut().and_then(|tp| tp.slot_mut(li)) {
                // A tap reads the whole stream entering the layer: add the MLP output still
                // pending from the layer before (the same f32 sum the fused add would make).
                let h = &mut sc.h[..t * h_sz];
                if pending {
                    for (hv, zv) in h.iter_mut().zip(sc.z[..t * h_sz].iter()) {
                        *hv += zv;
                    }
                    pending = false;
                }
                slot.copy_from_slice(h);
            }
            let Scratch {
                h,
                x,
                y,
                z,
                a,
                b,
                c,
                d,
                e,
                f,
                cs,
                ..
            } = &mut sc;
            let h = &mut h[..t * h_sz];
            let x = sized(x, t * h_sz);
            let y = sized(y, t * h_sz);
            let z = sized(z, t * h_sz);
            let mut norm1 = AddNorm {
                h: &mut *h,
                add: pending.then_some(&*z),
                weight: &layer.input_norm,
                eps,
                x: &mut *x,
            };
            match (&layer.mixer, &mut st.layers[li]) {
                (Mixer::Attention(w), LayerState::Attention(cache)) => {
                    self.attention(w, cache, committed, tree, norm1, y, [a, b, c, d, e, f], cs)
                }
                (Mixer::Gdn(w), LayerState::Gdn(gs)) => {
                    norm1.run_serial();
                    self.gdn(w, gs, tree, x, y, [a, b, c, d, e, f])
                }
                _ => bail!("layer {li}: state kind does not match the weights"),
            }
            let i_sz = cfg.intermediate_size;
            let g = sized(a, t * i_sz);
            let u = sized(b, t * i_sz);
            let norm2 = AddNorm {
                h: &mut *h,
                add: Some(&*y),
                weight: &layer.post_norm,
                eps,
                x,
            };
            linear_many_add_norm(
                norm2,
                t,
                &[&layer.mlp.gate, &layer.mlp.up],
                &[None, None],
                &mut [&mut *g, &mut *u],
            );
            // SwiGLU runs inside the down projection's loop (see `linear_swiglu`).
            linear_swiglu(g, u, t, &layer.mlp.down, None, z);
            pending = true;
        }
        if pending {
            let h = &mut sc.h[..t * h_sz];
            for (hv, zv) in h.iter_mut().zip(sc.z[..t * h_sz].iter()) {
                *hv += zv;
            }
        }
        // Final norm and LM head on the selected rows.
        let (first, n) = match which {
            LogitRows::All => (0, t),
            LogitRows::Last => (t - 1, 1),
            LogitRows::None => (t, 0),
        };
        let final_tap = taps.and_then(|tp| tp.slot_mut(self.layers.len()));
        let (r0, rn) = if final_tap.is_some() {
            (0, t)
        } else {
            (first, n)
        };
        let rows = sized(&mut sc.rows, rn * h_sz);
        rms_norm(
            &sc.h[r0 * h_sz..(r0 + rn) * h_sz],
            &self.final_norm,
            cfg.rms_norm_eps,
            rows,
        );
        if let Some(slot) = final_tap {
            slot.copy_from_slice(rows);
        }
        let v = cfg.vocab_size;
        logits.resize(n * v, 0.0);
        if n > 0 {
            let sel = &rows[(first - r0) * h_sz..(first - r0 + n) * h_sz];
            let head = self.lm_head.as_ref().unwrap_or(&self.embed);
            linear(sel, n, head, None, logits);
        }
        st.scratch = sc;
        st.pending.tree.copy_from(tree);
        st.pending.tokens.clear();
        st.pending.tokens.extend_from_slice(tokens);
        st.pending.active = true;
        Ok(())
    }

    /// Whether [`Model::forward_top`] runs (an accelerator that ranks logits on its device).
    pub fn ranks_on_device(&self) -> bool {
        self.accel.as_ref().is_some_and(|a| a.supports_top())
    }

    /// [`Model::forward`] on an accelerator that ranks logits on its device: `top` receives, for
    /// the rows `which` selects, each row's best candidates of fl32(logit · `scale`) and its
    /// normaliser instead of the logits (see [`Accelerator::forward_top`]), and the residual
    /// stream at `taps`' points. Errors when [`Model::ranks_on_device`] is false.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_top(
        &self,
        st: &mut State,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        scale: f32,
        top: &mut TopRows,
        mut taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let acc = match &self.accel {
            Some(a) if a.supports_top() => a,
            _ => bail!("this model does not rank logits on a device"),
        };
        self.check_pass(st, tokens, tree)?;
        if let Some(tp) = taps.as_deref_mut() {
            tp.prepare(self.layers.len(), tokens.len(), self.cfg.hidden_size)?;
        }
        self.accel_pass(acc.as_ref(), st, tokens, tree, |acc, ds, committed| {
            acc.forward_top(ds, committed, tokens, tree, which, scale, top, taps)
        })
    }

    /// The full logits of row `row` of the rows the device's last pass selected (after
    /// [`Model::forward_top`], for a row its candidates cannot decide; a commit leaves them).
    pub fn last_logits(&self, st: &mut State, row: usize, out: &mut Vec<f32>) -> Result<()> {
        let (Some(acc), Some(ds)) = (&self.accel, st.accel.as_deref_mut()) else {
            bail!("no device pass has run on this state");
        };
        acc.last_logits(ds, row, out)?;
        if out.len() != self.cfg.vocab_size {
            bail!(
                "the device returned {} logits for a vocabulary of {}",
                out.len(),
                self.cfg.vocab_size
            );
        }
        Ok(())
    }

    /// What every pass is checked for before it runs: tokens, tree and context size.
    fn check_pass(&self, st: &State, tokens: &[u32], tree: &TreeBatch) -> Result<()> {
        let cfg = &self.cfg;
        let t = tokens.len();
        if t == 0 {
            bail!("a forward pass needs at least one token");
        }
        if tree.len() != t {
            bail!("{} tokens but the tree has {} rows", t, tree.len());
        }
        let depth = (0..t).map(|i| tree.depth(i) as usize).max().unwrap_or(0);
        if st.committed + depth + 1 > st.capacity || st.committed + t > st.capacity {
            bail!(
                "context full: {} committed tokens + {} new rows exceed the context size of {}",
                st.committed,
                t,
                st.capacity
            );
        }
        if let Some(&bad) = tokens.iter().find(|&&x| x as usize >= cfg.vocab_size) {
            bail!(
                "token id {bad} is outside the vocabulary of {} tokens",
                cfg.vocab_size
            );
        }
        Ok(())
    }

    /// Runs a checked pass on the accelerator: makes (or lazily resets) the device state,
    /// calls `run(acc, device state, committed)` and records the rows as pending.
    fn accel_pass(
        &self,
        acc: &dyn Accelerator,
        st: &mut State,
        tokens: &[u32],
        tree: &TreeBatch,
        run: impl FnOnce(&dyn Accelerator, &mut dyn AccelState, usize) -> Result<()>,
    ) -> Result<()> {
        let t = tokens.len();
        if !tree.is_chain() && t > acc.max_tree_rows() {
            bail!(
                "a tree of {t} rows exceeds the {} rows one {} pass verifies",
                acc.max_tree_rows(),
                acc.describe()
            );
        }
        if st.accel.is_none() {
            st.accel = Some(acc.new_state(st.capacity)?);
            st.accel_reset = false;
        }
        let ds = st.accel.as_deref_mut().expect("made above");
        if st.accel_reset {
            acc.reset(ds)?;
            st.accel_reset = false;
        }
        // Nothing is pending if the pass fails half-way.
        st.pending.active = false;
        run(acc, ds, st.committed)?;
        st.pending.tree.copy_from(tree);
        st.pending.tokens.clear();
        st.pending.tokens.extend_from_slice(tokens);
        st.pending.active = true;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        w: &AttnWeights,
        cache: &mut AttnCache,
        committed: usize,
        tree: &TreeBatch,
        input: AddNorm<'_>,
        y: &mut [f32],
        bufs: [&mut Vec<f32>; 6],
        cs: &[f32],
    ) {
        let cfg = &self.cfg;
        let t = tree.len();
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let [qf, q, gate, kb, vb, o] = bufs;
        let qf = sized(qf, t * w.q.rows);
        let kb = sized(kb, t * nkv * hd);
        let vb = sized(vb, t * nkv * hd);
        // The layer's residual step and input norm run inside the q/k/v loop.
        linear_many_add_norm(
            input,
            t,
            &[&w.q, &w.k, &w.v],
            &[
                w.q_bias.as_deref(),
                w.k_bias.as_deref(),
                w.v_bias.as_deref(),
            ],
            &mut [&mut *qf, &mut *kb, &mut *vb],
        );
        let q = sized(q, t * nh * hd);
        let gate = sized(gate, if cfg.attn_output_gate { t * nh * hd } else { 0 });
        if cfg.attn_output_gate {
            for i in 0..t * nh {
                q[i * hd..(i + 1) * hd].copy_from_slice(&qf[i * 2 * hd..i * 2 * hd + hd]);
                gate[i * hd..(i + 1) * hd].copy_from_slice(&qf[i * 2 * hd + hd..(i + 1) * 2 * hd]);
            }
        } else {
            q.copy_from_slice(qf);
        }
        if let Some(qn) = &w.q_norm {
            rms_norm_inplace(q, qn, cfg.rms_norm_eps);
        }
        if let Some(kn) = &w.k_norm {
            rms_norm_inplace(kb, kn, cfg.rms_norm_eps);
        }
        // The rows' cos/sin, computed once per pass (see `Scratch::cs`).
        let rd = cfg.rotary_dim;
        for i in 0..t {
            let cs = &cs[i * rd..(i + 1) * rd];
            self.rope
                .apply(&mut q[i * nh * hd..(i + 1) * nh * hd], hd, cs);
            self.rope
                .apply(&mut kb[i * nkv * hd..(i + 1) * nkv * hd], hd, cs);
        }
        cache.write_rows(committed, kb, vb);
        let layout = cache.layout();
        let o = sized(o, t * nh * hd);
        let shape = AttnShape {
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
        };
        let scale = 1.0 / (hd as f32).sqrt();
        match (&cache.k, &cache.v) {
            (KvRows::F32(k), KvRows::F32(v)) => {
                attention_tree(q, k, v, layout, committed, tree, shape, scale, o)
            }
            (KvRows::F16(k), KvRows::F16(v)) => {
                attention_tree(q, k, v, layout, committed, tree, shape, scale, o)
            }
            _ => unreachable!("State::new makes K and V caches of one element type"),
        }
        if cfg.attn_output_gate {
            for (ov, gv) in o.iter_mut().zip(gate.iter()) {
                *ov *= sigmoid(*gv);
            }
        }
        linear(o, t, &w.o, w.o_bias.as_deref(), y);
    }

    fn gdn(
        &self,
        w: &GdnWeights,
        gs: &mut GdnState,
        tree: &TreeBatch,
        x: &[f32],
        y: &mut [f32],
        bufs: [&mut Vec<f32>; 6],
    ) {
        let cfg = &self.cfg;
        let g = cfg.gdn.expect("GDN layer has a GdnConfig");
        let t = tree.len();
        let (hk, hv, dk, dv, kc) = (
            g.num_key_heads,
            g.num_value_heads,
            g.key_head_dim,
            g.value_head_dim,
            g.conv_kernel,
        );
        let (c, kd, vd) = (g.conv_dim(), g.key_dim(), g.value_dim());
        let [m, mc, z, ab, q, o] = bufs;
        let m = sized(m, t * c);
        linear(x, t, &w.qkv, None, m);
        let z = sized(z, t * vd);
        linear(x, t, &w.z, None, z);
        let ab = sized(ab, 2 * t * hv);
        let (braw, araw) = ab.split_at_mut(t * hv);
        linear(x, t, &w.b, None, braw);
        linear(x, t, &w.a, None, araw);
        let mc = sized(mc, t * c);
        let win = sized(&mut gs.pend_windows, t * (kc - 1) * c);
        conv1d_tree(m, c, kc, &gs.conv, &w.conv, tree, mc, win);
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
                pb[j] = sigmoid(braw[j]);
                pg[j] = w.neg_exp_a[h] * softplus(araw[j] + w.dt_bias[h]);
            }
        }
        let rows = GdnRows {
            q,
            k: pk,
            v: pv,
            g: pg,
            beta: pb,
        };
        let shape = GdnShape { hk, hv, dk, dv };
        let o = sized(o, t * vd);
        // The head-major scratch reuses `m` (conv_dim > value_dim), no longer needed.
        let hm = &mut m[..t * vd];
        let fin = if tree.is_chain() {
            Some(&mut gs.pend_final[..])
        } else {
            None
        };
        gdn_tree_forward(&rows, &gs.s, tree, shape, hm, o, fin);
        rms_norm_gated_inplace(o, z, &w.norm, cfg.rms_norm_eps);
        linear(o, t, &w.out, None, y);
    }

    /// Makes the accepted rows of the pending pass permanent. `accepted` must be a root-anchored
    /// parent chain of the pending tree (plain decode and prefill accept every row).
    pub fn commit(&self, st: &mut State, accepted: &[usize]) -> Result<()> {
        if !st.pending.active {
            bail!("nothing to commit: no forward pass is pending");
        }
        st.pending.active = false;
        let pend = &st.pending;
        pend.tree.check_accepted(accepted)?;
        let n = accepted.len();
        let p = st.committed;
        if let Some(acc) = &self.accel {
            let ds = st
                .accel
                .as_deref_mut()
                .ok_or_else(|| anyhow::anyhow!("a pending pass without a device state"))?;
            acc.commit(ds, p, &pend.tree, accepted)?;
            st.committed += n;
            st.tokens.extend(accepted.iter().map(|&a| pend.tokens[a]));
            return Ok(());
        }
        let full_chain = pend.tree.is_chain() && n == pend.tree.len();
        let cfg = &self.cfg;
        for ls in st.layers.iter_mut() {
            match ls {
                LayerState::Attention(cache) => {
                    for (k, &a) in accepted.iter().enumerate() {
                        if a != k {
                            // Sources increase and a ≥ k, so in-place copying never clobbers a later source.
                            cache.copy_row(p + a, p + k);
                        }
                    }
                }
                LayerState::Gdn(gs) => {
                    if n == 0 {
                        continue;
                    }
                    let g = cfg.gdn.expect("GDN layer has a GdnConfig");
                    if full_chain {
                        std::mem::swap(&mut gs.s, &mut gs.pend_final);
                    } else {
                        let rows = GdnRows {
                            q: &[],
                            k: &gs.pend_k,
                            v: &gs.pend_v,
                            g: &gs.pend_g,
                            beta: &gs.pend_beta,
                        };
                        let shape = GdnShape {
                            hk: g.num_key_heads,
                            hv: g.num_value_heads,
                            dk: g.key_head_dim,
                            dv: g.value_head_dim,
                        };
                        gdn_commit_replay(&rows, accepted, shape, &mut gs.s);
                    }
                    let wl = (g.conv_kernel - 1) * g.conv_dim();
                    let last = accepted[n - 1];
                    gs.conv
                        .copy_from_slice(&gs.pend_windows[last * wl..(last + 1) * wl]);
                }
            }
        }
        st.committed += n;
        st.tokens.extend(accepted.iter().map(|&a| pend.tokens[a]));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::LogitRows;

    #[test]
    fn logit_row_counts() {
        assert_eq!(LogitRows::All.count(5), 5);
        assert_eq!(LogitRows::Last.count(5), 1);
        assert_eq!(LogitRows::None.count(5), 0);
        assert_eq!(LogitRows::Last.count(0), 0);
    }
}
