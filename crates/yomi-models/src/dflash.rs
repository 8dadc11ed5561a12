//! A DFlash drafter (z-lab's block-diffusion drafter, `DFlashDraftModel`), written once over
//! the backend op set. It has no embedding or LM head of its own: it reads the target's.
//!
//! - **Context.** Each committed target row contributes the target's residual stream after
//!   the layers `target_layer_ids` (Hugging Face `hidden_states[id + 1]`, the stream entering
//!   layer id + 1), concatenated: `ctx = hidden_norm(fc([h₁ ; … ; h_k]))`. In every draft layer
//!   the context row's key is `rope(k_norm(k_proj(ctx)))` at the row's position and its value
//!   `v_proj(ctx)`; they are computed once per committed row and kept ([`DFlash::add_context`]).
//! - **Block.** A draft is one pass over a block `[anchor, mask × (B − 1)]` at positions
//!   `L .. L + B` (the anchor is the token the target chose last, at the committed length L):
//!   target embeddings, then Qwen3 decoder layers whose queries come from the block and see all
//!   context rows and all block rows (bidirectional inside the block), then `norm` and the
//!   target's LM head on rows 1 .. B: one distribution per drafted position
//!   ([`DFlash::draft`]). The block's own K/V are never kept.
//! - **Masks.** A `sliding_attention` layer (in `layer_types`, or from `max_window_layers` on
//!   when `use_sliding_window` is set, as Hugging Face's Qwen3 config reads them) is causal
//!   inside the block and sees only keys less than `sliding_window` positions back; a
//!   top-level `is_causal` makes every layer causal (or none). As z-lab's
//!   `Qwen3DFlashAttention` ([`BlockMask`] per layer).
//!
//! The checkpoint is a directory with `config.json` (`architectures: ["DFlashDraftModel"]`,
//! `block_size`, `dflash_config.{mask_token_id, target_layer_ids}` — older files put both at
//! the top level) and `model.safetensors` (`fc`, `hidden_norm`, `norm`, `layers.*`).

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use yomi_core::backend::{AttnHeads, Backend, BlockMask};
use yomi_cpu::backend::Cpu;
use yomi_weights::{Rope, RopeScaling};

use crate::model::{AttnWeights, Mlp};
use crate::safetensors_dir::SafetensorsDir;
use crate::source::WeightSource;

/// What a DFlash checkpoint's `config.json` says.
#[derive(Clone, Debug, PartialEq)]
pub struct DFlashConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub vocab_size: usize,
    pub attention_bias: bool,
    /// Rows per draft block B (the anchor and B − 1 drafted positions).
    pub block_size: usize,
    pub mask_token_id: u32,
    /// Target layers whose output the context reads (HF `hidden_states[id + 1]`).
    pub target_layer_ids: Vec<usize>,
    /// Scale on the target embeddings of the block (`input_embedding_scale`, default 1).
    pub input_embedding_scale: f32,
    /// What each layer's block rows see (all keys, bidirectional, unless the layer slides or
    /// the config says `is_causal`).
    pub layer_masks: Vec<BlockMask>,
}

fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get("dflash_config")
        .and_then(|d| d.get(key))
        .or_else(|| v.get(key))
}

fn usize_of(v: &Value, key: &str) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| anyhow!("DFlash config.json: `{key}` is missing or not a whole number"))
}

impl DFlashConfig {
    /// Parses a DFlash `config.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text).context("DFlash config.json is not JSON")?;
        let archs = v.get("architectures").and_then(Value::as_array);
        if !archs.is_some_and(|a| a.iter().any(|x| x.as_str() == Some("DFlashDraftModel"))) {
            bail!("not a DFlash drafter: config.json's `architectures` lacks DFlashDraftModel");
        }
        let hidden_size = usize_of(&v, "hidden_size")?;
        let num_heads = usize_of(&v, "num_attention_heads")?;
        let head_dim = match v.get("head_dim").and_then(Value::as_u64) {
            Some(d) => d as usize,
            None => hidden_size / num_heads.max(1),
        };
        let target_layer_ids: Vec<usize> = field(&v, "target_layer_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("DFlash config.json: no `target_layer_ids`"))?
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| anyhow!("DFlash config.json: a target layer id is not a number"))
            })
            .collect::<Result<_>>()?;
        let mask_token_id = field(&v, "mask_token_id")
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("DFlash config.json: no `mask_token_id`"))?;
        let block_size = field(&v, "block_size")
            .and_then(Value::as_u64)
            .unwrap_or(16) as usize;
        let num_layers = usize_of(&v, "num_hidden_layers")?;
        let cfg = DFlashConfig {
            layer_masks: layer_masks(&v, num_layers)?,
            hidden_size,
            intermediate_size: usize_of(&v, "intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads: usize_of(&v, "num_key_value_heads")?,
            head_dim,
            rms_norm_eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            rope_theta: v
                .get("rope_theta")
                .and_then(Value::as_f64)
                .unwrap_or(1_000_000.0),
            vocab_size: usize_of(&v, "vocab_size")?,
            attention_bias: v
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            block_size,
            mask_token_id: u32::try_from(mask_token_id)
                .map_err(|_| anyhow!("DFlash config.json: `mask_token_id` is out of range"))?,
            target_layer_ids,
            input_embedding_scale: field(&v, "input_embedding_scale")
                .and_then(Value::as_f64)
                .unwrap_or(1.0) as f32,
        };
        for (key, set) in [("output_multiplier", 1.0), ("final_logit_softcapping", 0.0)] {
            if let Some(x) = field(&v, key).and_then(Value::as_f64)
                && x != set
            {
                bail!("DFlash config.json: `{key}` = {x} is not supported yet");
            }
        }
        if cfg.num_layers == 0 || cfg.target_layer_ids.is_empty() {
            bail!("DFlash config.json: no layers or no target layers");
        }
        if cfg.block_size < 2 {
            bail!(
                "DFlash config.json: a block of {} rows drafts nothing",
                cfg.block_size
            );
        }
        if cfg.num_kv_heads == 0 || !cfg.num_heads.is_multiple_of(cfg.num_kv_heads) {
            bail!("DFlash config.json: query heads must be a multiple of the K/V heads");
        }
        Ok(cfg)
    }

    /// The target's hidden-state points the context reads (`HiddenTaps` numbering: point i is
    /// the stream entering layer i, so HF's `hidden_states[id + 1]` is point id + 1).
    pub fn hidden_points(&self) -> Vec<usize> {
        self.target_layer_ids.iter().map(|&i| i + 1).collect()
    }

    /// Whether a layer sees only a window of the keys.
    pub fn windowed(&self) -> bool {
        self.layer_masks.iter().any(|m| m.window.is_some())
    }

    fn heads(&self) -> AttnHeads {
        AttnHeads {
            n_heads: self.num_heads,
            n_kv: self.num_kv_heads,
            head_dim: self.head_dim,
        }
    }
}

/// Each layer's mask, read as Hugging Face's `Qwen3Config` and z-lab's attention read the
/// config: `sliding_window` counts only under `use_sliding_window` (default 4096 there);
/// without `layer_types`, layers from `max_window_layers` (default 28) on slide when a window
/// is set; a sliding layer is causal with that window (none when the window is unset), a full
/// one bidirectional; a top-level `is_causal` overrides causality for every layer.
fn layer_masks(v: &Value, num_layers: usize) -> Result<Vec<BlockMask>> {
    let window = if v.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
        match v.get("sliding_window") {
            None => Some(4096),
            Some(Value::Null) => None,
            Some(w) => match w.as_u64() {
                Some(w) if w >= 1 => Some(w as usize),
                _ => bail!("DFlash config.json: `sliding_window` must be a positive whole number"),
            },
        }
    } else {
        None
    };
    let sliding: Vec<bool> = match v.get("layer_types") {
        Some(Value::Array(types)) => {
            if types.len() != num_layers {
                bail!(
                    "DFlash config.json: `layer_types` has {} entries for {num_layers} layers",
                    types.len()
                );
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(false),
                    Some("sliding_attention") => Ok(true),
                    _ => Err(anyhow!("DFlash config.json: unknown layer type {t}")),
                })
                .collect::<Result<_>>()?
        }
        Some(Value::Null) | None => {
            let from = v
                .get("max_window_layers")
                .and_then(Value::as_u64)
                .unwrap_or(28) as usize;
            (0..num_layers)
                .map(|i| window.is_some() && i >= from)
                .collect()
        }
        Some(other) => bail!("DFlash config.json: `layer_types` is not a list: {other}"),
    };
    let is_causal = match v.get("is_causal") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => bail!("DFlash config.json: `is_causal` is not true or false: {other}"),
    };
    Ok(sliding
        .into_iter()
        .map(|slides| BlockMask {
            causal: is_causal.unwrap_or(slides),
            window: if slides { window } else { None },
        })
        .collect())
}

/// What the drafter reads of its target: the embedding table that embeds the block and the LM
/// head that turns its output into logits.
pub struct TargetIo<'a, B: Backend = Cpu> {
    pub embed: &'a B::Linear,
    pub head: &'a B::Linear,
}

/// One Qwen3 decoder layer of the drafter.
pub struct DFlashLayer<B: Backend = Cpu> {
    pub input_norm: B::Vector,
    pub post_norm: B::Vector,
    pub attn: AttnWeights<B>,
    pub mlp: Mlp<B>,
}

/// A loaded DFlash drafter.
pub struct DFlash<B: Backend = Cpu> {
    pub cfg: DFlashConfig,
    /// [H, k·H]: the concatenated target features to the drafter's width.
    pub fc: B::Linear,
    pub hidden_norm: B::Vector,
    pub norm: B::Vector,
    pub layers: Vec<DFlashLayer<B>>,
    pub rope: Rope,
}

/// One sequence's drafter state: every layer's context K/V, the context rows kept, and the
/// pass's buffers.
pub struct DFlashState<B: Backend = Cpu> {
    caches: Vec<B::KvCache>,
    /// Context rows in the caches (cache row r holds the r-th context row reported).
    rows: usize,
    /// The position after the last context row.
    end: usize,
    /// Cache rows: context rows plus one block.
    capacity: usize,
    /// `sc.out` holds the drafted positions of a block over the current context.
    drafted: bool,
    sc: DScratch<B>,
}

impl<B: Backend> DFlashState<B> {
    /// Context rows kept.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Forgets the context (a new sequence).
    pub fn reset(&mut self) {
        self.rows = 0;
        self.drafted = false;
    }
}

struct DScratch<B: Backend> {
    h: B::Buf,
    x: B::Buf,
    y: B::Buf,
    z: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    o: B::Buf,
    g: B::Buf,
    u: B::Buf,
    cs: B::Buf,
    feat: B::Buf,
    /// The block's tokens, and the normed output of its drafted positions (the LM head's
    /// input).
    block: Vec<u32>,
    out: B::Buf,
}

impl<B: Backend> Default for DScratch<B> {
    fn default() -> Self {
        DScratch {
            h: B::Buf::default(),
            x: B::Buf::default(),
            y: B::Buf::default(),
            z: B::Buf::default(),
            q: B::Buf::default(),
            k: B::Buf::default(),
            v: B::Buf::default(),
            o: B::Buf::default(),
            g: B::Buf::default(),
            u: B::Buf::default(),
            cs: B::Buf::default(),
            feat: B::Buf::default(),
            block: Vec::new(),
            out: B::Buf::default(),
        }
    }
}

impl DFlash<Cpu> {
    /// Loads a drafter directory for a target of hidden size `target_hidden` and vocabulary
    /// `target_vocab` (the drafter reads the target's embeddings and LM head, so both must
    /// match).
    pub fn load(dir: &Path, target_hidden: usize, target_vocab: usize) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path)
            .with_context(|| format!("cannot read {}", cfg_path.display()))?;
        let cfg =
            DFlashConfig::from_json(&text).with_context(|| format!("in {}", cfg_path.display()))?;
        if cfg.hidden_size != target_hidden {
            bail!(
                "the DFlash drafter is {} wide but the target's hidden size is {target_hidden}",
                cfg.hidden_size
            );
        }
        if cfg.vocab_size != target_vocab {
            bail!(
                "the DFlash drafter's vocabulary ({}) is not the target's ({target_vocab})",
                cfg.vocab_size
            );
        }
        if cfg.mask_token_id as usize >= target_vocab {
            bail!(
                "the DFlash mask token {} is outside the vocabulary",
                cfg.mask_token_id
            );
        }
        let src = SafetensorsDir::open(dir)?;
        Self::from_source(cfg, &src)
    }

    /// Requantizes every weight matrix to Q8_0 in the CPU's packed layout, so that the block
    /// pass runs on the int8 kernels (AMX tiles from 5 rows) instead of f32 dot products: the
    /// drafts change by what 8-bit weights and ~16-bit activations change in the logits, never
    /// the output (the target verifies). Every width of a DFlash layer is a multiple of 32.
    pub fn quantize_q8_0(&mut self) {
        let mut ms: Vec<&mut yomi_weights::Matrix> = vec![&mut self.fc];
        for l in &mut self.layers {
            let (a, m) = (&mut l.attn, &mut l.mlp);
            ms.extend([&mut a.q, &mut a.k, &mut a.v, &mut a.o]);
            ms.extend([&mut m.gate, &mut m.up, &mut m.down]);
        }
        ms.into_iter().for_each(requantize_q8_0);
    }

    /// Builds the drafter from any weight source, checking every tensor's name and shape.
    pub fn from_source(cfg: DFlashConfig, src: &dyn WeightSource) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
        let k = cfg.target_layer_ids.len();
        let bias = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
            if cfg.attention_bias {
                Ok(Some(src.vector(name, len)?))
            } else {
                Ok(None)
            }
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("layers.{i}");
            let a = format!("{p}.self_attn");
            layers.push(DFlashLayer {
                input_norm: src.vector(&format!("{p}.input_layernorm.weight"), h)?,
                post_norm: src.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                attn: AttnWeights {
                    q: src.matrix(&format!("{a}.q_proj.weight"), nq, h)?,
                    k: src.matrix(&format!("{a}.k_proj.weight"), nkv, h)?,
                    v: src.matrix(&format!("{a}.v_proj.weight"), nkv, h)?,
                    o: src.matrix(&format!("{a}.o_proj.weight"), h, nq)?,
                    q_bias: bias(&format!("{a}.q_proj.bias"), nq)?,
                    k_bias: bias(&format!("{a}.k_proj.bias"), nkv)?,
                    v_bias: bias(&format!("{a}.v_proj.bias"), nkv)?,
                    o_bias: bias(&format!("{a}.o_proj.bias"), h)?,
                    q_norm: Some(src.vector(&format!("{a}.q_norm.weight"), hd)?),
                    k_norm: Some(src.vector(&format!("{a}.k_norm.weight"), hd)?),
                },
                mlp: Mlp {
                    gate: src.matrix(
                        &format!("{p}.mlp.gate_proj.weight"),
                        cfg.intermediate_size,
                        h,
                    )?,
                    up: src.matrix(&format!("{p}.mlp.up_proj.weight"), cfg.intermediate_size, h)?,
                    down: src.matrix(
                        &format!("{p}.mlp.down_proj.weight"),
                        h,
                        cfg.intermediate_size,
                    )?,
                },
            });
        }
        Ok(DFlash {
            fc: src.matrix("fc.weight", h, k * h)?,
            hidden_norm: src.vector("hidden_norm.weight", h)?,
            norm: src.vector("norm.weight", h)?,
            layers,
            rope: Rope::new(cfg.rope_theta, hd, &RopeScaling::None),
            cfg,
        })
    }
}

impl<B: Backend> DFlash<B> {
    /// A state for up to `context` context rows.
    pub fn new_state(&self, b: &B, context: usize) -> DFlashState<B> {
        let capacity = context + self.cfg.block_size;
        DFlashState {
            caches: (0..self.cfg.num_layers)
                .map(|_| b.new_kv_cache(self.cfg.heads(), capacity))
                .collect(),
            rows: 0,
            end: 0,
            capacity,
            drafted: false,
            sc: DScratch::default(),
        }
    }

    /// The rows' rotary tables for positions `pos0 ..`.
    fn rope_rows(&self, b: &B, pos0: usize, n: usize, cs: &mut B::Buf) {
        let (rd, rope) = (self.cfg.head_dim, &self.rope);
        b.fill_from_host(cs, n * rd, &mut |cs| {
            for (i, row) in cs.chunks_exact_mut(rd).enumerate() {
                rope.cos_sin(pos0 + i, row);
            }
        });
    }

    /// Appends `n` committed target rows at positions `pos0 ..` to the context: `features`
    /// holds, per row, the target's hidden states at [`DFlashConfig::hidden_points`]
    /// concatenated ([n, k·H], on the host). Errors when the context is full.
    pub fn add_context(
        &self,
        b: &B,
        st: &mut DFlashState<B>,
        pos0: usize,
        n: usize,
        features: &[f32],
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (h, k) = (cfg.hidden_size, cfg.target_layer_ids.len());
        if features.len() != n * k * h {
            bail!(
                "DFlash context: {} feature values for {n} rows of {} ",
                features.len(),
                k * h
            );
        }
        if st.rows + n + cfg.block_size > st.capacity {
            bail!(
                "DFlash context full: {} + {n} rows exceed its {} rows",
                st.rows,
                st.capacity - cfg.block_size
            );
        }
        if n == 0 {
            return Ok(());
        }
        // A window counts keys by their place in the cache, which is their position only if
        // the context has no gaps.
        if cfg.windowed() && st.rows > 0 && pos0 != st.end {
            bail!(
                "DFlash context: rows at {pos0} do not follow the context, which ends at {}",
                st.end
            );
        }
        let heads = cfg.heads();
        let DScratch {
            feat,
            x,
            y,
            k: kb,
            v: vb,
            cs,
            ..
        } = &mut st.sc;
        b.fill_from_host(feat, n * k * h, &mut |dst| dst.copy_from_slice(features));
        b.linear(feat, n, &self.fc, None, x);
        b.rms_norm_rows(x, 0, n, &self.hidden_norm, cfg.rms_norm_eps, y);
        self.rope_rows(b, pos0, n, cs);
        for (layer, cache) in self.layers.iter().zip(st.caches.iter_mut()) {
            let w = &layer.attn;
            b.linear(y, n, &w.k, w.k_bias.as_ref(), kb);
            if let Some(kn) = &w.k_norm {
                b.rms_norm_groups_inplace(
                    kb,
                    n * heads.n_kv * heads.head_dim,
                    kn,
                    cfg.rms_norm_eps,
                );
            }
            b.rope_inplace(kb, n, heads.n_kv, heads.head_dim, heads.head_dim, cs);
            b.linear(y, n, &w.v, w.v_bias.as_ref(), vb);
            b.write_kv(cache, st.rows, n, heads, kb, vb);
        }
        st.rows += n;
        st.end = pos0 + n;
        st.drafted = false;
        Ok(())
    }

    /// One draft pass: the block `[anchor, mask × (B − 1)]` at positions `pos ..` (the anchor's
    /// position, the target's committed length) over the context; `logits` receives
    /// [B − 1, V] through the target's LM head. [`draft_block`](Self::draft_block) and then
    /// [`draft_logits`](Self::draft_logits) of every drafted position.
    pub fn draft(
        &self,
        b: &B,
        st: &mut DFlashState<B>,
        target: TargetIo<'_, B>,
        anchor: u32,
        pos: usize,
        logits: &mut B::Buf,
    ) -> Result<()> {
        self.draft_block(b, st, target.embed, anchor, pos)?;
        self.draft_logits(b, st, target.head, self.cfg.block_size - 1, logits)
    }

    /// The logits of the first `n` drafted positions of the last
    /// [`draft_block`](Self::draft_block) through the target's LM head `head`, [n, V] in the
    /// first n·V values of `logits` (a buffer that held more keeps its length): the
    /// rows of [`draft`](Self::draft)'s logits, for a draft that uses only the first `n`
    /// positions (a chain of depth n, a tree no deeper) and need not pay the head's
    /// vocabulary-wide product for the others. Errors when no block was drafted since the
    /// last context change or `n` exceeds the block's B − 1 positions.
    pub fn draft_logits(
        &self,
        b: &B,
        st: &mut DFlashState<B>,
        head: &B::Linear,
        n: usize,
        logits: &mut B::Buf,
    ) -> Result<()> {
        if !st.drafted {
            bail!("DFlash: no block drafted at the current context");
        }
        if n >= self.cfg.block_size {
            bail!(
                "DFlash: {n} positions asked of a block that drafts {}",
                self.cfg.block_size - 1
            );
        }
        b.linear_at(&st.sc.out, 0, n, head, None, logits);
        Ok(())
    }

    /// The drafter's layers over the block `[anchor, mask × (B − 1)]` at positions `pos ..`
    /// (see [`draft`](Self::draft)): the normed output of the drafted positions is kept for
    /// [`draft_logits`](Self::draft_logits).
    pub fn draft_block(
        &self,
        b: &B,
        st: &mut DFlashState<B>,
        embed: &B::Linear,
        anchor: u32,
        pos: usize,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (t, hs, eps) = (cfg.block_size, cfg.hidden_size, cfg.rms_norm_eps);
        if st.rows + t > st.capacity {
            bail!("DFlash context full");
        }
        if cfg.windowed() && st.rows > 0 && pos != st.end {
            bail!(
                "DFlash block at {pos} does not follow the context, which ends at {}",
                st.end
            );
        }
        let heads = cfg.heads();
        let (nh, nkv, hd) = (heads.n_heads, heads.n_kv, heads.head_dim);
        st.drafted = false;
        let DScratch {
            h,
            x,
            y,
            z,
            q,
            k,
            v,
            o,
            g,
            u,
            cs,
            block,
            out,
            ..
        } = &mut st.sc;
        block.clear();
        block.push(anchor);
        block.resize(t, cfg.mask_token_id);
        b.embed(embed, block, h);
        if cfg.input_embedding_scale != 1.0 {
            b.scale_inplace(h, t * hs, cfg.input_embedding_scale);
        }
        self.rope_rows(b, pos, t, cs);
        let mut pending = false;
        for ((layer, cache), &mask) in self.layers.iter().zip(&mut st.caches).zip(&cfg.layer_masks)
        {
            let w = &layer.attn;
            b.add_norm_linears(
                h,
                pending.then_some(&*z),
                &layer.input_norm,
                eps,
                t,
                x,
                &[&w.q, &w.k, &w.v],
                &[w.q_bias.as_ref(), w.k_bias.as_ref(), w.v_bias.as_ref()],
                &mut [&mut *q, &mut *k, &mut *v],
            );
            if let Some(qn) = &w.q_norm {
                b.rms_norm_groups_inplace(q, t * nh * hd, qn, eps);
            }
            if let Some(kn) = &w.k_norm {
                b.rms_norm_groups_inplace(k, t * nkv * hd, kn, eps);
            }
            b.rope_inplace(q, t, nh, hd, hd, cs);
            b.rope_inplace(k, t, nkv, hd, hd, cs);
            b.attention_block(cache, st.rows, t, heads, mask, q, k, v, o);
            b.linear(o, t, &w.o, w.o_bias.as_ref(), y);
            b.add_norm_linears(
                h,
                Some(&*y),
                &layer.post_norm,
                eps,
                t,
                x,
                &[&layer.mlp.gate, &layer.mlp.up],
                &[None, None],
                &mut [&mut *g, &mut *u],
            );
            b.swiglu_linear(g, u, t, &layer.mlp.down, z);
            pending = true;
        }
        if pending {
            b.add_inplace(h, z, t * hs);
        }
        b.rms_norm_rows(h, 1, t - 1, &self.norm, eps, out);
        st.drafted = true;
        Ok(())
    }
}

/// Requantizes a matrix to Q8_0 in the CPU's packed layout (a drafter's weights, for the int8
/// kernels: its drafts change by what 8-bit weights change, never the output). A matrix whose
/// rows are not whole blocks of 32 is left as it is.
pub fn requantize_q8_0(m: &mut yomi_weights::Matrix) {
    use yomi_cpu::quant::Pack;
    use yomi_weights::{QuantData, QuantType, WeightData};
    if !m.cols.is_multiple_of(QuantType::Q8_0.block_size()) {
        return;
    }
    let mut data = vec![0.0f32; m.rows * m.cols];
    let mut buf = vec![0.0f32; m.cols];
    for (r, row) in data.chunks_exact_mut(m.cols).enumerate() {
        row.copy_from_slice(m.row_f32(r, &mut buf));
    }
    m.data = WeightData::Quant(QuantData::quantize(QuantType::Q8_0, m.rows, m.cols, &data));
    m.pack();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// dflash-tiny's config with `extra`'s keys set (a `null` stays in the JSON as null).
    fn config(extra: serde_json::Value) -> Result<DFlashConfig> {
        let mut v = serde_json::json!({
            "architectures": ["DFlashDraftModel"],
            "block_size": 8,
            "dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 2]},
            "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "vocab_size": 512,
        });
        for (k, x) in extra.as_object().expect("an object") {
            v[k] = x.clone();
        }
        DFlashConfig::from_json(&v.to_string())
    }

    const FULL: BlockMask = BlockMask::FULL;

    fn causal(window: Option<usize>) -> BlockMask {
        BlockMask {
            causal: true,
            window,
        }
    }

    /// The masks as transformers' `Qwen3Config` and z-lab's attention read these configs
    /// (`Qwen3DFlashAttention.__init__`: a sliding layer is causal unless `is_causal` says
    /// otherwise; `sliding_window` is None without `use_sliding_window`).
    #[test]
    fn layer_masks_follow_the_qwen3_config() {
        let masks = |extra| config(extra).unwrap().layer_masks;
        assert_eq!(masks(serde_json::json!({})), [FULL; 3]);
        let types = serde_json::json!(["full_attention", "sliding_attention", "full_attention"]);
        // Listed sliding layers without `use_sliding_window`: causal, no window.
        assert_eq!(
            masks(serde_json::json!({"layer_types": types, "sliding_window": 12})),
            [FULL, causal(None), FULL]
        );
        assert_eq!(
            masks(serde_json::json!({
                "layer_types": types, "use_sliding_window": true, "sliding_window": 12
            })),
            [FULL, causal(Some(12)), FULL]
        );
        // No `layer_types`: layers from `max_window_layers` on slide, 4096 by default.
        assert_eq!(
            masks(serde_json::json!({"use_sliding_window": true, "max_window_layers": 1})),
            [FULL, causal(Some(4096)), causal(Some(4096))]
        );
        assert_eq!(
            masks(serde_json::json!({"use_sliding_window": true})),
            [FULL; 3],
            "max_window_layers defaults to 28"
        );
        // `is_causal` for every layer, either way.
        assert_eq!(
            masks(serde_json::json!({"is_causal": true})),
            [causal(None); 3]
        );
        let open = BlockMask {
            causal: false,
            window: Some(12),
        };
        assert_eq!(
            masks(serde_json::json!({
                "layer_types": types, "use_sliding_window": true, "sliding_window": 12,
                "is_causal": false
            })),
            [FULL, open, FULL]
        );
    }

    #[test]
    fn bad_layer_settings_are_refused() {
        let types = serde_json::json!(["full_attention", "sliding_attention", "full_attention"]);
        for (extra, want) in [
            (
                serde_json::json!({"layer_types": ["full_attention"]}),
                "1 entries for 3",
            ),
            (
                serde_json::json!({"layer_types": ["full_attention", "chunked", "full_attention"]}),
                "unknown layer type",
            ),
            (
                serde_json::json!({"layer_types": types, "use_sliding_window": true, "sliding_window": 0}),
                "positive",
            ),
            (serde_json::json!({"is_causal": "yes"}), "is_causal"),
            (
                serde_json::json!({"layer_types": "full_attention"}),
                "not a list",
            ),
        ] {
            let e = config(extra).expect_err("refused");
            assert!(e.to_string().contains(want), "{e}");
        }
    }
}
