//! The op set every backend implements, and that every architecture is written over once
//! (`yomi-models`' family files). A backend owns its buffers, its weight layout and its per-layer
//! sequence state; the model code names its activations and calls ops on them, never touching
//! values itself.
//!
//! Conventions:
//! - An activation buffer holds rows of f32 values, `[t, width]` row-major; an op sizes its
//!   outputs itself (growing a buffer, never shrinking it), so a model never allocates.
//! - `t` is the number of rows of the pass; a row's position is the committed length plus its
//!   depth in the pass's [`TreeBatch`].
//! - Fused variants (add + norm into the next linears, SwiGLU into the down projection) have a
//!   default that is the composition of the plain ops; a backend overrides the ones it fuses,
//!   and must give the same values as the composition (bit for bit on the CPU, where the fused
//!   forms are tested against it).
//! - A pass's per-row inputs (token ids, positions, tree, committed length, rotary values) are
//!   set once before it ([`Backend::set_rows`]) where the backend's row ops read them, so that
//!   a pass itself moves nothing between host and device (a GPU backend can capture and replay
//!   it).
//! - Ops cannot fail on the CPU; a device backend that meets an error keeps the first one and
//!   skips the ops after it, and its executor reports it when the pass ends.
//! - A pass leaves rows **pending**: attention writes K/V after the committed rows, the gated
//!   delta rule keeps what a commit needs; nothing committed changes until the commit ops.

use crate::{GdnShape, TreeBatch};

/// Attention sizes of one layer: `n_heads` query heads and `n_kv` K/V heads of `head_dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnHeads {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

/// Which keys a row of a drafter's block sees (a DFlash layer's attention mask). Keys are indexed
/// in cache order: the `committed` context rows, then the block's rows, so block row i is key
/// `committed + i`; positions are contiguous, so index distances are position distances.
/// The default, every key, is a DFlash layer's bidirectional block; `causal` hides the block
/// rows after a row; `window` W keeps only keys within W − 1 of the row on its side(s) (on both
/// sides without `causal`), as z-lab's sliding-window drafter layers do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockMask {
    pub causal: bool,
    pub window: Option<usize>,
}

impl BlockMask {
    /// Every key, both ways.
    pub const FULL: BlockMask = BlockMask {
        causal: false,
        window: None,
    };

    /// Whether the query at key index `query` sees the key at index `key`.
    pub fn sees(&self, query: usize, key: usize) -> bool {
        if self.causal && key > query {
            return false;
        }
        match self.window {
            None => true,
            Some(w) => query.abs_diff(key) < w,
        }
    }

    /// Whether every row sees every key.
    pub fn is_full(&self) -> bool {
        !self.causal && self.window.is_none()
    }
}

/// The per-layer parameters of a gated delta rule core (Qwen3.5's linear attention), borrowed
/// from the layer's weights.
pub struct GdnParams<'a, B: Backend + ?Sized> {
    pub shape: GdnShape,
    /// Causal conv1d kernel width K.
    pub conv_kernel: usize,
    /// Depthwise conv weights [conv_dim, K].
    pub conv: &'a B::Vector,
    /// −exp(A_log) [Hv].
    pub neg_exp_a: &'a B::Vector,
    /// [Hv]
    pub dt_bias: &'a B::Vector,
}

/// The rotary embedding of a pass's rows. Row i sits at position `offset + committed +
/// depth(i)`: `offset` is 0 for a model's own cache, whose row r is position r, and the first
/// row's position for a cache that starts mid-sequence (an MTP block resumed from a prefix).
/// A backend that takes rotary values from the host fills them with `cos_sin(pos, row)`, which
/// writes position `pos`'s `[cos (rot_dim/2) | sin (rot_dim/2)]` into `row`; one that computes
/// them on the device reads `offset` only.
pub struct RotaryFill<'a> {
    pub rot_dim: usize,
    pub offset: usize,
    pub cos_sin: &'a dyn Fn(usize, &mut [f32]),
}

/// A layer's attention core after its input projections: Qwen3-style q/k norms (per head),
/// NeoX RoPE on the first `rot_dim` values of each head, tree attention over the cache and,
/// with `gated`, Qwen3.5's per-head sigmoid output gate (its query projection then holds each
/// head's query and gate side by side).
pub struct AttnCore<'a, B: Backend + ?Sized> {
    pub heads: AttnHeads,
    pub rot_dim: usize,
    pub eps: f32,
    pub q_norm: Option<&'a B::Vector>,
    pub k_norm: Option<&'a B::Vector>,
    pub gated: bool,
}

/// The backend op set. See the module header for the conventions.
pub trait Backend {
    /// Rows of f32 activations.
    type Buf: Default;
    /// A weight matrix [out, in] in whatever format and layout the backend keeps it.
    type Linear;
    /// A small f32 vector: a norm weight, a bias, per-head parameters.
    type Vector;
    /// One attention layer's K/V cache.
    type KvCache;
    /// One gated-delta-rule layer's recurrent state, conv state and pending rows.
    type GdnState;
    /// A pass's per-row inputs, where the row ops read them.
    type Rows: Default;

    /// A weight matrix's (out, in) sizes.
    fn linear_dims(&self, w: &Self::Linear) -> (usize, usize);

    /// A vector's length.
    fn vector_len(&self, v: &Self::Vector) -> usize;

    /// Sets the per-row inputs of a pass of `tokens` hung as `tree` after `committed` rows: the
    /// ids, each row's cache row (committed + depth) and path, and, when the model has
    /// attention, its rows' positions and what their rotary embedding reads (`rotary`, see
    /// [`RotaryFill`]).
    fn set_rows(
        &self,
        rows: &mut Self::Rows,
        tokens: &[u32],
        tree: &TreeBatch,
        committed: usize,
        rotary: Option<RotaryFill<'_>>,
    );

    /// `out[i] = table[id of row i]`, [t, cols], for the rows [`Backend::set_rows`] set.
    fn embed_rows(&self, table: &Self::Linear, rows: &Self::Rows, out: &mut Self::Buf);

    /// `out[i] = table[tokens[i]]`, [t, cols].
    fn embed(&self, table: &Self::Linear, tokens: &[u32], out: &mut Self::Buf);

    /// Sizes `out` to `n` values and lets `fill` write them on the host (small per-pass tables,
    /// e.g. the rows' rotary cos/sin).
    fn fill_from_host(&self, out: &mut Self::Buf, n: usize, fill: &mut dyn FnMut(&mut [f32]));

    /// Copies rows `row0 .. row0 + n` of width `width` to the host (hidden-state taps).
    fn read_rows(&self, buf: &Self::Buf, row0: usize, n: usize, width: usize, out: &mut [f32]);

    /// `h += add` over the first `n` values.
    fn add_inplace(&self, h: &mut Self::Buf, add: &Self::Buf, n: usize);

    /// `out[r] = rms_norm(x[row0 + r]) · w` for `n` rows of `w`'s width.
    fn rms_norm_rows(
        &self,
        x: &Self::Buf,
        row0: usize,
        n: usize,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Buf,
    );

    /// In place over `n` values: every group of `w`'s width (a head) is RMS-normed and scaled
    /// by `w` (Qwen3's q/k norms).
    fn rms_norm_groups_inplace(&self, x: &mut Self::Buf, n: usize, w: &Self::Vector, eps: f32);

    /// `y = x[row0 .. row0 + t] · Wᵀ (+ bias)`, [t, out].
    fn linear_at(
        &self,
        x: &Self::Buf,
        row0: usize,
        t: usize,
        w: &Self::Linear,
        bias: Option<&Self::Vector>,
        y: &mut Self::Buf,
    );

    /// `y = x · Wᵀ (+ bias)` over all `t` rows.
    fn linear(
        &self,
        x: &Self::Buf,
        t: usize,
        w: &Self::Linear,
        bias: Option<&Self::Vector>,
        y: &mut Self::Buf,
    ) {
        self.linear_at(x, 0, t, w, bias, y)
    }

    /// The residual step and norm before a block: `h += add` (when given), then
    /// `x = rms_norm(h) · norm`, over `t` rows of the norm's width.
    fn add_norm(
        &self,
        h: &mut Self::Buf,
        add: Option<&Self::Buf>,
        norm: &Self::Vector,
        eps: f32,
        t: usize,
        x: &mut Self::Buf,
    ) {
        if let Some(a) = add {
            self.add_inplace(h, a, t * self.vector_len(norm));
        }
        self.rms_norm_rows(h, 0, t, norm, eps, x);
    }

    /// [`Backend::add_norm`] followed by one linear per weight on `x` (`outs[i] = x · wsᵢᵀ +
    /// biasesᵢ`): a block's input projections.
    #[allow(clippy::too_many_arguments)]
    fn add_norm_linears(
        &self,
        h: &mut Self::Buf,
        add: Option<&Self::Buf>,
        norm: &Self::Vector,
        eps: f32,
        t: usize,
        x: &mut Self::Buf,
        ws: &[&Self::Linear],
        biases: &[Option<&Self::Vector>],
        outs: &mut [&mut Self::Buf],
    ) {
        self.add_norm(h, add, norm, eps, t, x);
        for ((w, b), o) in ws.iter().zip(biases).zip(outs.iter_mut()) {
            self.linear(x, t, w, *b, o);
        }
    }

    /// `gate = silu(gate) · up` in place over `n` values.
    fn swiglu_inplace(&self, gate: &mut Self::Buf, up: &Self::Buf, n: usize);

    /// SwiGLU then the down projection: `y = (silu(gate) · up) · downᵀ`, [t, down.out].
    /// `gate` is left holding the product.
    fn swiglu_linear(
        &self,
        gate: &mut Self::Buf,
        up: &Self::Buf,
        t: usize,
        down: &Self::Linear,
        y: &mut Self::Buf,
    ) {
        self.swiglu_inplace(gate, up, t * self.linear_dims(down).1);
        self.linear(gate, t, down, None, y);
    }

    /// The SwiGLU MLP with its residual step and norm: [`Backend::add_norm_linears`] into
    /// `g`, `u` by `gate`, `up`, then [`Backend::swiglu_linear`] by `down` into `z`.
    #[allow(clippy::too_many_arguments)]
    fn add_norm_mlp(
        &self,
        h: &mut Self::Buf,
        add: Option<&Self::Buf>,
        norm: &Self::Vector,
        eps: f32,
        t: usize,
        x: &mut Self::Buf,
        [gate, up, down]: [&Self::Linear; 3],
        g: &mut Self::Buf,
        u: &mut Self::Buf,
        z: &mut Self::Buf,
    ) {
        self.add_norm_linears(
            h,
            add,
            norm,
            eps,
            t,
            x,
            &[gate, up],
            &[None, None],
            &mut [&mut *g, &mut *u],
        );
        self.swiglu_linear(g, u, t, down, z);
    }

    /// Splits `rows` head rows of `[query (hd) | gate (hd)]` into `q` and `gate`, each [rows, hd]
    /// (Qwen3.5's gated attention stores each head's query and output gate side by side).
    fn split_query_gate(
        &self,
        qg: &Self::Buf,
        rows: usize,
        hd: usize,
        q: &mut Self::Buf,
        gate: &mut Self::Buf,
    );

    /// Copies the first `n` values of `src` into `dst` (sized to `n`).
    fn copy(&self, src: &Self::Buf, n: usize, dst: &mut Self::Buf);

    /// Rotary embedding in place on `t` rows of `heads` heads of `head_dim` values, the first
    /// `rot_dim` of each head rotated NeoX-style by the row's `[cos (rot/2) | sin (rot/2)]`
    /// from `cos_sin` [t, rot_dim].
    fn rope_inplace(
        &self,
        x: &mut Self::Buf,
        t: usize,
        heads: usize,
        head_dim: usize,
        rot_dim: usize,
        cos_sin: &Self::Buf,
    );

    /// Writes this pass's `k`, `v` ([t, n_kv, hd]) after the `committed` rows of `cache` and
    /// computes tree attention for `q` [t, n_heads, hd] over the committed rows plus each row's
    /// path in `tree` (softmax scale 1/√hd): `o` [t, n_heads, hd].
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        cache: &mut Self::KvCache,
        committed: usize,
        tree: &TreeBatch,
        heads: AttnHeads,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        o: &mut Self::Buf,
    );

    /// The attention core of a pass over the rows [`Backend::set_rows`] set (see [`AttnCore`]):
    /// from the projected `qg` [t, n_heads, hd] (gated: [t, n_heads, 2·hd], each head's query
    /// then its gate), `k`, `v` [t, n_kv, hd], writes K/V after the committed rows and leaves
    /// the (gated) attention output in `o` [t, n_heads, hd]. `qg`, `k`, `q` and `gate` may be
    /// overwritten (q/k normed and rotated in place, or the split query and gate).
    #[allow(clippy::too_many_arguments)]
    fn attention_core(
        &self,
        cache: &mut Self::KvCache,
        rows: &Self::Rows,
        c: AttnCore<'_, Self>,
        qg: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        q: &mut Self::Buf,
        gate: &mut Self::Buf,
        o: &mut Self::Buf,
    );

    /// A K/V cache of `capacity` rows for `heads`' K/V heads (a drafter's own layers; the
    /// target's caches are made with its sequence state).
    fn new_kv_cache(&self, heads: AttnHeads, capacity: usize) -> Self::KvCache;

    /// Writes `t` rows of `k`, `v` ([t, n_kv, hd]) at rows `at ..` of `cache`, committed at
    /// once (a drafter's context rows).
    fn write_kv(
        &self,
        cache: &mut Self::KvCache,
        at: usize,
        t: usize,
        heads: AttnHeads,
        k: &Self::Buf,
        v: &Self::Buf,
    );

    /// Attention for a block (a DFlash drafter's): writes the block's `k`, `v` ([t, n_kv, hd])
    /// after the `committed` rows of `cache`, and each query row of `q` [t, n_heads, hd] sees
    /// the committed rows and the `t` block rows that `mask` lets it see (all of them:
    /// bidirectional; softmax scale 1/√hd): `o` [t, n_heads, hd]. The block rows are left
    /// pending (never committed).
    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        cache: &mut Self::KvCache,
        committed: usize,
        t: usize,
        heads: AttnHeads,
        mask: BlockMask,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        o: &mut Self::Buf,
    );

    /// `x *= s` over `n` values.
    fn scale_inplace(&self, x: &mut Self::Buf, n: usize, s: f32);

    /// `o *= sigmoid(gate)` over `n` values (gated attention's output gate).
    fn sigmoid_gate_inplace(&self, o: &mut Self::Buf, gate: &Self::Buf, n: usize);

    /// The gated delta rule's core over a pass: the causal conv1d of the projected q|k|v rows
    /// `qkv` [t, conv_dim] along each row's tree path (SiLU), the split into q, k, v with l2
    /// norms and q scaled by 1/√dk, the decay `g = −exp(A_log) · softplus(a + dt_bias)` and
    /// `β = sigmoid(b)` from `b`, `a` [t, Hv], and the delta rule from the committed state:
    /// `o` [t, Hv·dv]. The rows ([`Backend::set_rows`]) stay pending in `state`; `scratch` is
    /// backend working space.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_rule(
        &self,
        state: &mut Self::GdnState,
        p: GdnParams<'_, Self>,
        rows: &Self::Rows,
        qkv: &mut Self::Buf,
        b: &Self::Buf,
        a: &Self::Buf,
        scratch: [&mut Self::Buf; 2],
        o: &mut Self::Buf,
    );

    /// `o = rms_norm(o) · w · silu(z)` per group of `w`'s width, over `n` values.
    fn gated_rms_norm_inplace(
        &self,
        o: &mut Self::Buf,
        z: &Self::Buf,
        n: usize,
        w: &Self::Vector,
        eps: f32,
    );

    /// Commit: the K/V rows of the `accepted` pending rows (a root-anchored path, indices into
    /// the pass) move to `committed ..`.
    fn commit_kv(&self, cache: &mut Self::KvCache, committed: usize, accepted: &[usize]);

    /// Commit: the recurrent state advances over the `accepted` pending rows (taking the pass's
    /// final state when it was a chain accepted whole) and the conv state takes the last
    /// accepted row's window.
    fn commit_gdn(
        &self,
        state: &mut Self::GdnState,
        shape: GdnShape,
        accepted: &[usize],
        whole_chain: bool,
    );
}
