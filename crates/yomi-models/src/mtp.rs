//! Qwen3.5's multi-token-prediction (MTP) block, written once over the backend op set: the
//! drafter a Qwen3.5/3.6 checkpoint carries beside its trunk (`mtp.*`,
//! `mtp_num_hidden_layers` in config.json). It shares the trunk's embedding and LM head.
//!
//! A row of the block at position t reads the next token x_{t+1} and a hidden state h, and
//! gives the distribution of x_{t+2}:
//!
//! ```text
//! u      = fc([ rms(E[x_{t+1}]) · (1 + w_e) ; rms(h) · (1 + w_h) ])   fc: [H, 2H], embedding first
//! u      = layer(u)          one gated full-attention Qwen3.5 decoder layer (q/k norms, partial
//!                            RoPE at position t, its own K/V cache, causal over the block's rows)
//! s      = rms(u) · (1 + w_n)                                          `mtp.norm`
//! logits = s · Eᵀ            the trunk's (tied or not) LM head
//! ```
//!
//! h is the trunk's final-normed hidden state h_t (the vector its LM head reads, `HiddenTaps`
//! point L) for a row whose token the trunk has committed; a drafting step k > 1 feeds the
//! block's own output s of the step before instead (the trunk has not run that row yet), as
//! vLLM's and SGLang's chains do. `fc` is kept as its two column halves (`fc_embed`,
//! `fc_hidden`), so the concatenation is two products and a sum.
//!
//! The block's cache holds **committed rows**: (x_{t+1}, h_t) with both from the trunk, each
//! computed once ([`Mtp::pass`] then [`Mtp::commit`]). A draft pass hangs rows as a tree after
//! them; its rows stay pending and the next pass overwrites them. Cache row r is at position
//! `base + r` (a request resumed from a cached prefix starts the block's cache at its first
//! computed row; the rows before it are absent, which costs drafts, not correctness).

use anyhow::{Result, bail};
use yomi_core::TreeBatch;
use yomi_core::backend::{AttnHeads, Backend, RotaryFill};
use yomi_cpu::backend::Cpu;
use yomi_weights::{Matrix, Rope, WeightData};

use crate::config::{Arch, LayerKind, ModelConfig};
use crate::model::{Layer, Mixer, Scratch};
use crate::model::{Pass, Stream, attention, mlp};
use crate::source::WeightSource;

/// A loaded MTP block.
pub struct Mtp<B: Backend = Cpu> {
    /// fc's columns of the embedding half [H, H] and of the hidden half [H, H].
    pub fc_embed: B::Linear,
    pub fc_hidden: B::Linear,
    /// Effective norm weights (1 + w).
    pub norm_embed: B::Vector,
    pub norm_hidden: B::Vector,
    /// Full-attention decoder layers (one in every published checkpoint).
    pub layers: Vec<Layer<B>>,
    pub norm: B::Vector,
    /// The trunk's config (with the block's layers): the layers' shapes, eps, RoPE.
    cfg: ModelConfig,
    /// The trunk's layers: its final-norm output is hidden-state point `trunk_layers`.
    trunk_layers: usize,
    rope: Rope,
}

/// One sequence's MTP state: the layers' K/V caches, the rows committed in them, and the
/// pass's buffers.
pub struct MtpState<B: Backend = Cpu> {
    caches: Vec<B::KvCache>,
    /// Committed cache rows; row r is at position `base + r`.
    rows: usize,
    base: usize,
    /// Cache rows: committed plus one pass.
    capacity: usize,
    /// Rows of the last pass (not committed yet).
    pending: usize,
    /// The rows a commit keeps (reused).
    accepted: Vec<usize>,
    pass_rows: B::Rows,
    sc: Scratch<B>,
    /// The rows' embeddings and hidden inputs, normed.
    e: B::Buf,
    hid: B::Buf,
    ehat: B::Buf,
    hhat: B::Buf,
}

impl<B: Backend> MtpState<B> {
    /// Committed rows in the block's cache.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The position of the next committed row.
    pub fn next_position(&self) -> usize {
        self.base + self.rows
    }

    /// Forgets every row; the next committed row will be at position `base`.
    pub fn reset(&mut self, base: usize) {
        self.rows = 0;
        self.base = base;
        self.pending = 0;
    }
}

/// Where a block's tensors are: `mtp.*` in Hugging Face files; in a GGUF file (llama.cpp's
/// converter) block j is layer L + j of the trunk's numbering, with `fc` and the three norms
/// as `nextn.*` of layer L, asked for here under the names the converter gives them before
/// its tensor map (`model.layers.{L}.eh_proj.weight`, …), which the GGUF source maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtpNames {
    HuggingFace,
    Gguf,
}

impl MtpNames {
    fn layer(self, cfg: &ModelConfig, j: usize) -> String {
        match self {
            MtpNames::HuggingFace => format!("mtp.layers.{j}"),
            MtpNames::Gguf => format!("model.layers.{}", cfg.num_layers + j),
        }
    }

    /// `fc`, `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `norm`.
    fn parts(self, cfg: &ModelConfig) -> [String; 4] {
        match self {
            MtpNames::HuggingFace => [
                "mtp.fc.weight".into(),
                "mtp.pre_fc_norm_embedding.weight".into(),
                "mtp.pre_fc_norm_hidden.weight".into(),
                "mtp.norm.weight".into(),
            ],
            MtpNames::Gguf => {
                let p = format!("model.layers.{}", cfg.num_layers);
                [
                    format!("{p}.eh_proj.weight"),
                    format!("{p}.enorm.weight"),
                    format!("{p}.hnorm.weight"),
                    format!("{p}.shared_head.norm.weight"),
                ]
            }
        }
    }
}

impl Mtp<Cpu> {
    /// Loads the MTP block of a Qwen3.5/3.6 model from its weights (`names`: where the file
    /// format keeps them). Errors name what is missing: a model without one, or a tensor of
    /// the wrong shape. The norms are (1 + w) as the trunk's: GGUF files store them with the
    /// 1 added, as they do the trunk's.
    pub fn load(cfg: &ModelConfig, src: &dyn WeightSource, names: MtpNames) -> Result<Self> {
        if cfg.arch != Arch::Qwen35 {
            bail!(
                "MTP drafting needs a Qwen3.5/3.6 model; this one is {:?}",
                cfg.arch
            );
        }
        if cfg.mtp_layers == 0 {
            bail!("the model has no MTP block (config: mtp_num_hidden_layers is 0 or absent)");
        }
        let [fc_name, ne, nh, nn] = names.parts(cfg);
        if !src.has(&fc_name) {
            bail!(
                "the model's config declares an MTP block but its weights lack `{fc_name}` \
                 (saved or converted without it?)"
            );
        }
        let h = cfg.hidden_size;
        let fc = src.matrix(&fc_name, h, 2 * h)?;
        let (fc_embed, fc_hidden) = split_columns(&fc);
        let layers = (0..cfg.mtp_layers)
            .map(|j| {
                let p = names.layer(cfg, j);
                crate::model::load_layer(cfg, src, &p, LayerKind::Attention)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut block_cfg = cfg.clone();
        block_cfg.layer_kinds = vec![LayerKind::Attention; cfg.mtp_layers];
        block_cfg.num_layers = cfg.mtp_layers;
        Ok(Mtp {
            fc_embed,
            fc_hidden,
            norm_embed: src.norm_plus_one(&ne, h)?,
            norm_hidden: src.norm_plus_one(&nh, h)?,
            layers,
            norm: src.norm_plus_one(&nn, h)?,
            rope: Rope::new(cfg.rope_theta, cfg.rotary_dim, &cfg.rope_scaling),
            trunk_layers: cfg.num_layers,
            cfg: block_cfg,
        })
    }

    /// The block on another backend: every matrix through `linear`, every vector through
    /// `vector`, the decoder layers through `layer` (a device upload); shapes and settings
    /// as they are.
    #[allow(clippy::type_complexity)]
    pub fn to_backend<C: Backend>(
        &self,
        linear: &dyn Fn(&Matrix) -> Result<C::Linear>,
        vector: &dyn Fn(&[f32]) -> Result<C::Vector>,
        layer: &dyn Fn(&Layer) -> Result<Layer<C>>,
    ) -> Result<Mtp<C>> {
        Ok(Mtp {
            fc_embed: linear(&self.fc_embed)?,
            fc_hidden: linear(&self.fc_hidden)?,
            norm_embed: vector(&self.norm_embed)?,
            norm_hidden: vector(&self.norm_hidden)?,
            layers: self.layers.iter().map(layer).collect::<Result<_>>()?,
            norm: vector(&self.norm)?,
            cfg: self.cfg.clone(),
            trunk_layers: self.trunk_layers,
            rope: self.rope.clone(),
        })
    }

    /// Every weight matrix, mutably (format conversions: the engine requantizes the block for
    /// the CPU's int8 kernels, as it does a DFlash drafter).
    pub fn matrices_mut(&mut self) -> Vec<&mut Matrix> {
        let mut v = vec![&mut self.fc_embed, &mut self.fc_hidden];
        for l in &mut self.layers {
            v.extend(l.matrices_mut());
        }
        v
    }
}

/// [H, 2H] → its column halves [H, H] and [H, H], as f32.
fn split_columns(fc: &Matrix) -> (Matrix, Matrix) {
    let (rows, h) = (fc.rows, fc.cols / 2);
    let (mut a, mut b) = (vec![0.0f32; rows * h], vec![0.0f32; rows * h]);
    let mut buf = vec![0.0f32; fc.cols];
    for r in 0..rows {
        let row = fc.row_f32(r, &mut buf);
        a[r * h..(r + 1) * h].copy_from_slice(&row[..h]);
        b[r * h..(r + 1) * h].copy_from_slice(&row[h..]);
    }
    (
        Matrix::new(rows, h, WeightData::F32(a)),
        Matrix::new(rows, h, WeightData::F32(b)),
    )
}

/// The rows of one [`Mtp::pass`]: each row's next token and hidden input, hung as a tree.
pub struct MtpRows<'a> {
    /// x_{t+1} of each row.
    pub tokens: &'a [u32],
    /// Each row's hidden input h [rows, H] (host).
    pub hidden: &'a [f32],
    pub tree: &'a TreeBatch,
}

impl<B: Backend> Mtp<B> {
    pub fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    /// The trunk's hidden-state point the block reads (`HiddenTaps` numbering: the final
    /// norm's output, point L).
    pub fn trunk_layers(&self) -> usize {
        self.trunk_layers
    }

    /// A state for up to `context` committed rows and passes of up to `pass_rows` rows.
    pub fn new_state(&self, b: &B, context: usize, pass_rows: usize) -> MtpState<B> {
        let heads = AttnHeads {
            n_heads: self.cfg.num_heads,
            n_kv: self.cfg.num_kv_heads,
            head_dim: self.cfg.head_dim,
        };
        let capacity = context + pass_rows;
        MtpState {
            caches: self
                .layers
                .iter()
                .map(|_| b.new_kv_cache(heads, capacity))
                .collect(),
            rows: 0,
            base: 0,
            capacity,
            pending: 0,
            accepted: Vec::new(),
            pass_rows: B::Rows::default(),
            sc: Scratch::default(),
            e: B::Buf::default(),
            hid: B::Buf::default(),
            ehat: B::Buf::default(),
            hhat: B::Buf::default(),
        }
    }

    /// Runs `rows` hung after the committed rows (row i at position `next_position() + depth`),
    /// leaving them pending. The last `out` rows (the pass's newest, in its order) give
    /// their normed output s into `normed` ([out, H], host) and, with `head`, their logits into
    /// `logits` ([out, V]). Errors when the cache cannot take the rows.
    #[allow(clippy::too_many_arguments)]
    pub fn pass(
        &self,
        b: &B,
        st: &mut MtpState<B>,
        embed: &B::Linear,
        rows: MtpRows<'_>,
        out: usize,
        normed: &mut Vec<f32>,
        head: Option<&B::Linear>,
        logits: &mut B::Buf,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (t, hs, eps) = (rows.tokens.len(), cfg.hidden_size, cfg.rms_norm_eps);
        if t == 0 || rows.tree.len() != t || rows.hidden.len() != t * hs || out > t {
            bail!(
                "MTP pass: {t} tokens, a tree of {}, {} hidden values, {out} output rows",
                rows.tree.len(),
                rows.hidden.len()
            );
        }
        if st.rows + t > st.capacity {
            bail!(
                "MTP cache full: {} + {t} rows exceed its {} rows",
                st.rows,
                st.capacity
            );
        }
        st.pending = 0;
        let cos_sin = |pos: usize, row: &mut [f32]| self.rope.cos_sin(pos, row);
        b.set_rows(
            &mut st.pass_rows,
            rows.tokens,
            rows.tree,
            st.rows,
            Some(RotaryFill {
                rot_dim: cfg.rotary_dim,
                offset: st.base,
                cos_sin: &cos_sin,
            }),
        );
        let sc = &mut st.sc;
        // u = fc_e · rms(E[x]) + fc_h · rms(h)
        b.embed_rows(embed, &st.pass_rows, &mut st.e);
        b.rms_norm_rows(&st.e, 0, t, &self.norm_embed, eps, &mut st.ehat);
        b.fill_from_host(&mut st.hid, t * hs, &mut |dst| {
            dst.copy_from_slice(rows.hidden)
        });
        b.rms_norm_rows(&st.hid, 0, t, &self.norm_hidden, eps, &mut st.hhat);
        b.linear(&st.ehat, t, &self.fc_embed, None, &mut sc.h);
        b.linear(&st.hhat, t, &self.fc_hidden, None, &mut sc.y);
        b.add_inplace(&mut sc.h, &sc.y, t * hs);
        let p = Pass {
            b,
            cfg,
            rows: &st.pass_rows,
            t,
        };
        let mut stream = Stream {
            pending: false,
            taps: None,
        };
        for (layer, cache) in self.layers.iter().zip(st.caches.iter_mut()) {
            let Mixer::Attention(w) = &layer.mixer else {
                bail!("an MTP layer is full attention");
            };
            attention(&p, w, cache, &layer.input_norm, &stream, sc);
            mlp(&p, layer, sc);
            stream.pending = true;
        }
        if stream.pending {
            b.add_inplace(&mut sc.h, &sc.z, t * hs);
        }
        if out > 0 {
            b.rms_norm_rows(&sc.h, t - out, out, &self.norm, eps, &mut sc.rows);
            normed.resize(out * hs, 0.0);
            b.read_rows(&sc.rows, 0, out, hs, normed);
            if let Some(head) = head {
                b.linear(&sc.rows, out, head, None, logits);
            }
        }
        st.pending = t;
        Ok(())
    }

    /// Commits the first `n` rows of the last pass (a chain from its first row): their K/V
    /// stay in the cache.
    pub fn commit(&self, b: &B, st: &mut MtpState<B>, n: usize) -> Result<()> {
        if n > st.pending {
            bail!("MTP commit: {n} rows of a pass of {}", st.pending);
        }
        st.accepted.clear();
        st.accepted.extend(0..n);
        for cache in &mut st.caches {
            b.commit_kv(cache, st.rows, &st.accepted);
        }
        st.rows += n;
        st.pending = 0;
        Ok(())
    }
}
