//! The blocks the architecture files are built from, written once over the backend op set
//! (`yomi_core::backend::Backend`): the residual stream with its taps, attention (optionally
//! gated, with q/k norms and biases), the SwiGLU MLP and the final norm with the LM head.
//!
//! The residual steps and RMSNorms are handed to the next block's input projections
//! (`add_norm_linears`), which a backend may fuse into their loops: the mixer's output `y` is
//! added to `h` by the MLP's gate/up projections, and the MLP's output `z` by the next layer's
//! first projections, so it stays pending across the layer boundary (`Stream::pending`).

use anyhow::Result;
use yomi_core::backend::{AttnCore, AttnHeads, Backend};
use yomi_weights::Rope;

use super::forward::{HiddenTaps, LogitRows};
use super::weights::{AttnWeights, Layer};
use crate::config::ModelConfig;

/// The weights a pass reads, borrowed from wherever the backend keeps them.
pub struct Net<'a, B: Backend> {
    pub embed: &'a B::Linear,
    pub layers: &'a [Layer<B>],
    pub final_norm: &'a B::Vector,
    /// None: tied to the embedding.
    pub lm_head: Option<&'a B::Linear>,
}

/// Per-pass activation buffers, reused across passes (no allocation once grown). The mixers
/// use `a` … `g` for their intermediates and the MLP `a`, `b` for gate and up.
pub struct Scratch<B: Backend> {
    /// The residual stream [t, H].
    pub h: B::Buf,
    /// The normed input of the current block [t, H].
    pub x: B::Buf,
    /// The mixer's output [t, H], added to `h` by the MLP's input projections.
    pub y: B::Buf,
    /// The MLP's output [t, H], added to `h` by the next layer's input projections.
    pub z: B::Buf,
    pub a: B::Buf,
    pub b: B::Buf,
    pub c: B::Buf,
    pub d: B::Buf,
    pub e: B::Buf,
    pub f: B::Buf,
    pub g: B::Buf,
    /// The final-normed rows that get logits (or all rows, when the last point is tapped).
    pub rows: B::Buf,
}

impl<B: Backend> Default for Scratch<B> {
    fn default() -> Self {
        Scratch {
            h: B::Buf::default(),
            x: B::Buf::default(),
            y: B::Buf::default(),
            z: B::Buf::default(),
            a: B::Buf::default(),
            b: B::Buf::default(),
            c: B::Buf::default(),
            d: B::Buf::default(),
            e: B::Buf::default(),
            f: B::Buf::default(),
            g: B::Buf::default(),
            rows: B::Buf::default(),
        }
    }
}

/// One pass's fixed inputs: the backend, the config and the pass's rows (ids, positions,
/// tree, committed length), set by [`set_pass_rows`] before the pass.
pub(crate) struct Pass<'a, B: Backend> {
    pub b: &'a B,
    pub cfg: &'a ModelConfig,
    pub rows: &'a B::Rows,
    /// Rows in the pass.
    pub t: usize,
}

impl<B: Backend> Pass<'_, B> {
    pub fn rows(&self) -> usize {
        self.t
    }
}

/// Sets a pass's per-row inputs on backend `b`, with the rotary table when the model has
/// attention layers.
pub fn set_pass_rows<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    rope: &Rope,
    rows: &mut B::Rows,
    tokens: &[u32],
    tree: &yomi_core::TreeBatch,
    committed: usize,
) {
    let cos_sin = |pos: usize, row: &mut [f32]| rope.cos_sin(pos, row);
    let rotary = cfg
        .layer_kinds
        .contains(&crate::LayerKind::Attention)
        .then_some(yomi_core::backend::RotaryFill {
            rot_dim: cfg.rotary_dim,
            offset: 0,
            cos_sin: &cos_sin,
        });
    b.set_rows(rows, tokens, tree, committed, rotary);
}

/// The residual stream between blocks: whether the last MLP's output `z` is still to be
/// added to `h`, and the taps that read it.
pub(crate) struct Stream<'t> {
    pub pending: bool,
    pub taps: Option<&'t mut HiddenTaps>,
}

impl Stream<'_> {
    /// Before layer `li`: a tapped layer reads the whole stream entering it, so the pending MLP
    /// output is added first (the same f32 sum the fused add would make).
    pub fn enter<B: Backend>(&mut self, p: &Pass<'_, B>, sc: &mut Scratch<B>, li: usize) {
        let Some(slot) = self.taps.as_deref_mut().and_then(|tp| tp.slot_mut(li)) else {
            return;
        };
        let (t, hs) = (p.rows(), p.cfg.hidden_size);
        if self.pending {
            p.b.add_inplace(&mut sc.h, &sc.z, t * hs);
            self.pending = false;
        }
        p.b.read_rows(&sc.h, 0, t, hs, slot);
    }
}

/// The embeddings of the pass's tokens into `h`.
pub(crate) fn embed<B: Backend>(p: &Pass<'_, B>, net: &Net<'_, B>, sc: &mut Scratch<B>) {
    p.b.embed_rows(net.embed, p.rows, &mut sc.h);
}

/// Self-attention over the cache and the pass's tree (Llama/Qwen2/Qwen3 attention; with
/// `attn_output_gate`, Qwen3.5's gated attention): `y` = the block's output.
pub(crate) fn attention<B: Backend>(
    p: &Pass<'_, B>,
    w: &AttnWeights<B>,
    cache: &mut B::KvCache,
    input_norm: &B::Vector,
    stream: &Stream<'_>,
    sc: &mut Scratch<B>,
) {
    let (b, cfg, t) = (p.b, p.cfg, p.rows());
    let heads = AttnHeads {
        n_heads: cfg.num_heads,
        n_kv: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
    };
    let Scratch {
        h,
        x,
        y,
        z,
        a: qg,
        b: q,
        c: gate,
        d: k,
        e: v,
        f: o,
        ..
    } = sc;
    b.add_norm_linears(
        h,
        stream.pending.then_some(&*z),
        input_norm,
        cfg.rms_norm_eps,
        t,
        x,
        &[&w.q, &w.k, &w.v],
        &[w.q_bias.as_ref(), w.k_bias.as_ref(), w.v_bias.as_ref()],
        &mut [&mut *qg, &mut *k, &mut *v],
    );
    let core = AttnCore {
        heads,
        rot_dim: cfg.rotary_dim,
        eps: cfg.rms_norm_eps,
        q_norm: w.q_norm.as_ref(),
        k_norm: w.k_norm.as_ref(),
        gated: cfg.attn_output_gate,
    };
    b.attention_core(cache, p.rows, core, qg, k, v, q, gate, o);
    b.linear(o, t, &w.o, w.o_bias.as_ref(), y);
}

/// The SwiGLU MLP after the mixer: `h += y`, then `z = down(silu(gate(x)) · up(x))` with
/// `x = rms_norm(h)`. `z` is left pending (see the module header).
pub(crate) fn mlp<B: Backend>(p: &Pass<'_, B>, layer: &Layer<B>, sc: &mut Scratch<B>) {
    let (b, t) = (p.b, p.rows());
    let Scratch {
        h,
        x,
        y,
        z,
        a: g,
        b: u,
        ..
    } = sc;
    b.add_norm_mlp(
        h,
        Some(&*y),
        &layer.post_norm,
        p.cfg.rms_norm_eps,
        t,
        x,
        [&layer.mlp.gate, &layer.mlp.up, &layer.mlp.down],
        g,
        u,
        z,
    );
}

/// After the last layer: the pending MLP output, the final norm (tapped as point L) and the LM
/// head on the rows `which` selects, into `logits` [rows, V].
pub(crate) fn head<B: Backend>(
    p: &Pass<'_, B>,
    net: &Net<'_, B>,
    sc: &mut Scratch<B>,
    mut stream: Stream<'_>,
    which: LogitRows,
    logits: &mut B::Buf,
) -> Result<()> {
    let (b, t, hs) = (p.b, p.rows(), p.cfg.hidden_size);
    if stream.pending {
        b.add_inplace(&mut sc.h, &sc.z, t * hs);
    }
    let (first, n) = match which {
        LogitRows::All => (0, t),
        LogitRows::Last => (t - 1, 1),
        LogitRows::None => (t, 0),
    };
    let final_tap = stream
        .taps
        .as_deref_mut()
        .and_then(|tp| tp.slot_mut(net.layers.len()));
    let (r0, rn) = if final_tap.is_some() {
        (0, t)
    } else {
        (first, n)
    };
    b.rms_norm_rows(
        &sc.h,
        r0,
        rn,
        net.final_norm,
        p.cfg.rms_norm_eps,
        &mut sc.rows,
    );
    if let Some(slot) = final_tap {
        b.read_rows(&sc.rows, 0, t, hs, slot);
    }
    if n > 0 {
        let head = net.lm_head.unwrap_or(net.embed);
        b.linear_at(&sc.rows, first - r0, n, head, None, logits);
    }
    Ok(())
}
