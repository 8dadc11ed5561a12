//! The weights of a model, validated for name and shape when they are loaded.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use yomi_core::backend::Backend;
use yomi_cpu::backend::Cpu;
use yomi_cpu::quant::Pack;
use yomi_weights::{Matrix, Rope, WeightData};

use crate::config::{Arch, LayerKind, ModelConfig};
use crate::source::WeightSource;

// The layer weights are generic over the backend that holds them (`B::Linear` for a matrix in
// the backend's layout, `B::Vector` for small f32 vectors); the default is the host CPU model
// the loaders build.

pub struct AttnWeights<B: Backend = Cpu> {
    /// [n_heads·hd·(2 if gated else 1), H]; with the output gate each head's rows are
    /// [query (hd) | gate (hd)].
    pub q: B::Linear,
    pub k: B::Linear,
    pub v: B::Linear,
    pub o: B::Linear,
    pub q_bias: Option<B::Vector>,
    pub k_bias: Option<B::Vector>,
    pub v_bias: Option<B::Vector>,
    pub o_bias: Option<B::Vector>,
    /// Effective per-head norm weights (hd), `1 + w` already applied where the model uses it.
    pub q_norm: Option<B::Vector>,
    pub k_norm: Option<B::Vector>,
}

pub struct GdnWeights<B: Backend = Cpu> {
    /// [conv_dim, H]: rows are [q (Hk·dk) | k (Hk·dk) | v (Hv·dv)].
    pub qkv: B::Linear,
    /// [Hv·dv, H]
    pub z: B::Linear,
    /// [Hv, H]
    pub b: B::Linear,
    /// [Hv, H]
    pub a: B::Linear,
    /// [conv_dim, K]
    pub conv: B::Vector,
    /// −exp(A_log), [Hv], f32.
    pub neg_exp_a: B::Vector,
    /// [Hv]
    pub dt_bias: B::Vector,
    /// Plain gated-norm weight [dv].
    pub norm: B::Vector,
    /// [H, Hv·dv]
    pub out: B::Linear,
}

pub enum Mixer<B: Backend = Cpu> {
    Attention(AttnWeights<B>),
    Gdn(GdnWeights<B>),
}

pub struct Mlp<B: Backend = Cpu> {
    pub gate: B::Linear,
    pub up: B::Linear,
    pub down: B::Linear,
}

pub struct Layer<B: Backend = Cpu> {
    pub input_norm: B::Vector,
    pub post_norm: B::Vector,
    pub mixer: Mixer<B>,
    pub mlp: Mlp<B>,
}

pub struct Model {
    pub cfg: ModelConfig,
    /// Shared with drafters that read the target's embeddings (DFlash).
    pub embed: Arc<Matrix>,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    /// None when tied to the embedding.
    pub lm_head: Option<Arc<Matrix>>,
    pub rope: Rope,
    /// The device backend that runs the passes, if any (see [`crate::accel`]).
    pub accel: Option<std::sync::Arc<dyn crate::accel::Accelerator>>,
    /// The host copies of the matrices were dropped ([`Model::release_host_matrices`]).
    pub host_matrices_released: bool,
    /// Element type of the CPU attention caches of new states (f32 here: exact, for the
    /// fixture tests; the engine chooses f16 unless told otherwise). Device states keep their
    /// own.
    pub kv_dtype: crate::KvDtype,
}

/// Takes each part of a model as loading finishes it ([`Model::load_into`]): a device backend
/// uploads it there, and the loader then drops the part's host matrices before it reads the
/// next, so the host never holds the whole model. Calls come in order: `begin`, `embed`, every
/// `layer`, `head`.
pub trait WeightSink {
    /// Before any weight is read: refuse a model the device cannot run.
    fn begin(&mut self, cfg: &ModelConfig) -> Result<()>;
    /// The embedding matrix.
    fn embed(&mut self, embed: &Matrix) -> Result<()>;
    /// Layer `i`, complete.
    fn layer(&mut self, i: usize, layer: &Layer) -> Result<()>;
    /// The final norm, the LM head (None: tied to the embedding) and the rotary embedding.
    fn head(&mut self, final_norm: &[f32], lm_head: Option<&Matrix>, rope: &Rope) -> Result<()>;
}

/// The host copy of a matrix a sink took: dropped (shape kept).
fn drop_host(m: &mut Matrix) {
    m.data = WeightData::F32(Vec::new());
}

impl Layer {
    /// Every weight matrix of the layer.
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut v: Vec<&Matrix> = match &self.mixer {
            Mixer::Attention(a) => vec![&a.q, &a.k, &a.v, &a.o],
            Mixer::Gdn(g) => vec![&g.qkv, &g.z, &g.b, &g.a, &g.out],
        };
        v.extend([&self.mlp.gate, &self.mlp.up, &self.mlp.down]);
        v
    }

    /// Every weight matrix of the layer, mutably.
    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Matrix> {
        let mut v: Vec<&mut Matrix> = match &mut self.mixer {
            Mixer::Attention(a) => vec![&mut a.q, &mut a.k, &mut a.v, &mut a.o],
            Mixer::Gdn(g) => vec![&mut g.qkv, &mut g.z, &mut g.b, &mut g.a, &mut g.out],
        };
        v.extend([&mut self.mlp.gate, &mut self.mlp.up, &mut self.mlp.down]);
        v
    }
}

impl Model {
    /// Builds the model from any weight source, checking every tensor the architecture needs.
    /// `progress` is called with (tensors loaded so far, total layers + 2) as loading proceeds.
    pub fn load(
        cfg: ModelConfig,
        src: &dyn WeightSource,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        Self::load_into(cfg, src, progress, None)
    }

    /// [`Model::load`] that hands each part to `sink` as it is read (a streaming upload to a
    /// device) and then drops its host matrices and lets the source drop the file pages read
    /// for it: the model comes back with its host matrices released.
    pub fn load_into(
        cfg: ModelConfig,
        src: &dyn WeightSource,
        progress: &mut dyn FnMut(usize, usize),
        mut sink: Option<&mut dyn WeightSink>,
    ) -> Result<Self> {
        if let Some(s) = sink.as_deref_mut() {
            s.begin(&cfg)?;
        }
        let h = cfg.hidden_size;
        let total = cfg.num_layers + 2;
        let norm = |name: &str, len: usize| -> Result<Vec<f32>> {
            if cfg.norm_plus_one {
                src.norm_plus_one(name, len)
            } else {
                src.vector(name, len)
            }
        };
        let mut embed = src.matrix("model.embed_tokens.weight", cfg.vocab_size, h)?;
        // The embedding is read by rows, not multiplied: a rotation of its (input) columns
        // would change every row it gives. yomi quantize never writes one.
        if embed.rotation.is_some() {
            bail!("model.embed_tokens.weight is stored rotated; embeddings must not be");
        }
        if let Some(s) = sink.as_deref_mut() {
            s.embed(&embed)?;
            // A tied LM head is the embedding: its host copy goes once the head is up too.
            if !cfg.tie_word_embeddings {
                drop_host(&mut embed);
                src.drop_read_pages();
            }
        }
        progress(1, total);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for (i, kind) in cfg.layer_kinds.iter().enumerate() {
            let mut layer = load_layer(&cfg, src, &format!("model.layers.{i}"), *kind)?;
            if let Some(s) = sink.as_deref_mut() {
                s.layer(i, &layer)?;
                layer.matrices_mut().into_iter().for_each(drop_host);
                src.drop_read_pages();
            }
            layers.push(layer);
            progress(i + 2, total);
        }
        let final_norm = norm("model.norm.weight", h)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(src.matrix("lm_head.weight", cfg.vocab_size, h).context(
                "the config says the LM head is not tied to the embedding (tie_word_embeddings: false)",
            )?)
        };
        let rope = Rope::new(cfg.rope_theta, cfg.rotary_dim, &cfg.rope_scaling);
        let streamed = sink.is_some();
        let mut lm_head = lm_head;
        if let Some(s) = sink {
            s.head(&final_norm, lm_head.as_ref(), &rope)?;
            lm_head.iter_mut().for_each(drop_host);
            drop_host(&mut embed);
            src.drop_read_pages();
        }
        progress(total, total);
        Ok(Model {
            cfg,
            embed: Arc::new(embed),
            layers,
            final_norm,
            lm_head: lm_head.map(Arc::new),
            rope,
            accel: None,
            host_matrices_released: streamed,
            kv_dtype: crate::KvDtype::F32,
        })
    }

    /// The most rows of a draft tree one pass verifies (unbounded on the CPU).
    pub fn max_tree_rows(&self) -> usize {
        self.accel
            .as_ref()
            .map_or(usize::MAX, |a| a.max_tree_rows())
    }

    /// Device memory in use (None on the CPU; see [`crate::Accelerator::memory_in_use`]).
    pub fn device_memory_in_use(&self) -> Option<u64> {
        self.accel.as_ref().and_then(|a| a.memory_in_use())
    }

    /// Rows per prefill pass the accelerator prefers (None on the CPU: the engine's default).
    pub fn prefill_rows(&self) -> Option<usize> {
        self.accel.as_ref().and_then(|a| a.prefill_rows())
    }

    /// A fresh state for up to `capacity` tokens; with an accelerator its passes run there (the
    /// device state is made on the first pass).
    pub fn new_state(&self, capacity: usize) -> crate::State {
        // A device state's host caches are never written (their pages are never touched); they
        // say the element type of the device's K/V, which is f32.
        let kv = if self.accel.is_some() {
            crate::KvDtype::F32
        } else {
            self.kv_dtype
        };
        let mut st = crate::State::new(&self.cfg, capacity, kv);
        st.on_device = self.accel.is_some();
        st.device = self.accel.clone();
        st
    }

    /// Every weight matrix, mutably (for format conversions).
    pub fn matrices_mut(&mut self) -> Vec<&mut Matrix> {
        // Before a drafter shares them (load-time conversions), `make_mut` borrows in place.
        let mut v: Vec<&mut Matrix> = vec![Arc::make_mut(&mut self.embed)];
        if let Some(h) = self.lm_head.as_mut() {
            v.push(Arc::make_mut(h));
        }
        for l in &mut self.layers {
            v.extend(l.matrices_mut());
        }
        v
    }

    /// Regroups the Q8_0/Q4_0/Q4_1 matrices into the packed layout of the CPU kernels
    /// (`yomi_cpu::quant::packed`: same bytes, faster verify passes). Idempotent. (The engine
    /// does it unless its options keep GGML row order, to measure against.)
    pub fn pack_for_cpu(&mut self) {
        for m in self.matrices_mut() {
            m.pack();
        }
    }

    /// Undoes [`Model::pack_for_cpu`]: GGML blocks row after row again (for an accelerator
    /// upload, which reads the file layout).
    pub fn unpack(&mut self) {
        for m in self.matrices_mut() {
            m.unpack();
        }
    }

    /// Drops the host copies of the weight matrices once an accelerator holds them, so a model
    /// on the GPU does not also keep its weights in RAM. The CPU path cannot run afterwards
    /// (`forward` says so); norms, RoPE tables and the config stay.
    pub fn release_host_matrices(&mut self) {
        self.matrices_mut().into_iter().for_each(drop_host);
        self.host_matrices_released = true;
    }

    /// Converts every weight to f32 (the reference path for quantized models: the same
    /// dequantized values, multiplied in f32 instead of through int8 activations).
    pub fn dequantize_to_f32(&mut self) {
        for m in self.matrices_mut() {
            if matches!(m.data, WeightData::F32(_)) {
                continue;
            }
            let (rows, cols) = (m.rows, m.cols);
            let mut out = vec![0.0f32; rows * cols];
            let mut buf = vec![0.0f32; cols];
            for r in 0..rows {
                out[r * cols..(r + 1) * cols].copy_from_slice(m.row_f32(r, &mut buf));
            }
            // The stored rows stay those of a rotated matrix: its input is still turned.
            let rotation = m.rotation.take();
            *m = Matrix::new(rows, cols, WeightData::F32(out));
            m.rotation = rotation;
        }
    }

    /// Bytes of weights held in memory.
    pub fn weight_bytes(&self) -> usize {
        let mut n = self.embed.size_bytes() + self.lm_head.as_ref().map_or(0, |m| m.size_bytes());
        for l in &self.layers {
            n += l.mlp.gate.size_bytes() + l.mlp.up.size_bytes() + l.mlp.down.size_bytes();
            n += match &l.mixer {
                Mixer::Attention(a) => {
                    a.q.size_bytes() + a.k.size_bytes() + a.v.size_bytes() + a.o.size_bytes()
                }
                Mixer::Gdn(g) => {
                    g.qkv.size_bytes()
                        + g.z.size_bytes()
                        + g.b.size_bytes()
                        + g.a.size_bytes()
                        + g.out.size_bytes()
                }
            };
        }
        n
    }
}

/// A decoder layer of `kind` whose tensors are named `{p}.…` as in the Hugging Face files
/// (`p` = `model.layers.N` for the trunk; an MTP block's layers have their own prefix).
pub(crate) fn load_layer(
    cfg: &ModelConfig,
    src: &dyn WeightSource,
    p: &str,
    kind: LayerKind,
) -> Result<Layer> {
    let h = cfg.hidden_size;
    let norm = |name: &str, len: usize| -> Result<Vec<f32>> {
        if cfg.norm_plus_one {
            src.norm_plus_one(name, len)
        } else {
            src.vector(name, len)
        }
    };
    let mixer = match kind {
        LayerKind::Attention => Mixer::Attention(load_attention(cfg, src, p, &norm)?),
        LayerKind::GatedDeltaNet => Mixer::Gdn(load_gdn(cfg, src, p)?),
    };
    let i_sz = cfg.intermediate_size;
    Ok(Layer {
        input_norm: norm(&format!("{p}.input_layernorm.weight"), h)?,
        post_norm: norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
        mixer,
        mlp: Mlp {
            gate: src.matrix(&format!("{p}.mlp.gate_proj.weight"), i_sz, h)?,
            up: src.matrix(&format!("{p}.mlp.up_proj.weight"), i_sz, h)?,
            down: src.matrix(&format!("{p}.mlp.down_proj.weight"), h, i_sz)?,
        },
    })
}

fn load_attention(
    cfg: &ModelConfig,
    src: &dyn WeightSource,
    p: &str,
    norm: &dyn Fn(&str, usize) -> Result<Vec<f32>>,
) -> Result<AttnWeights> {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let q_rows = cfg.num_heads * hd * if cfg.attn_output_gate { 2 } else { 1 };
    let kv_rows = cfg.num_kv_heads * hd;
    let bias = |name: &str, len: usize, on: bool| -> Result<Option<Vec<f32>>> {
        if on {
            Ok(Some(
                src.vector(&format!("{p}.self_attn.{name}.bias"), len)?,
            ))
        } else {
            Ok(None)
        }
    };
    let qk_norm = |name: &str| -> Result<Option<Vec<f32>>> {
        if !cfg.qk_norm {
            return Ok(None);
        }
        let full = format!("{p}.self_attn.{name}.weight");
        // Qwen3.5's q/k norms are (1 + w); Qwen3's are plain.
        Ok(Some(if cfg.arch == Arch::Qwen35 {
            norm(&full, hd)?
        } else {
            src.vector(&full, hd)?
        }))
    };
    Ok(AttnWeights {
        q: src.matrix(&format!("{p}.self_attn.q_proj.weight"), q_rows, h)?,
        k: src.matrix(&format!("{p}.self_attn.k_proj.weight"), kv_rows, h)?,
        v: src.matrix(&format!("{p}.self_attn.v_proj.weight"), kv_rows, h)?,
        o: src.matrix(
            &format!("{p}.self_attn.o_proj.weight"),
            h,
            cfg.num_heads * hd,
        )?,
        q_bias: bias("q_proj", q_rows, cfg.qkv_bias)?,
        k_bias: bias("k_proj", kv_rows, cfg.qkv_bias)?,
        v_bias: bias("v_proj", kv_rows, cfg.qkv_bias)?,
        o_bias: bias("o_proj", h, cfg.o_bias)?,
        q_norm: qk_norm("q_norm")?,
        k_norm: qk_norm("k_norm")?,
    })
}

fn load_gdn(cfg: &ModelConfig, src: &dyn WeightSource, p: &str) -> Result<GdnWeights> {
    let g = cfg
        .gdn
        .context("a Gated DeltaNet layer needs the linear_* config fields")?;
    let h = cfg.hidden_size;
    let (c, hv, k) = (g.conv_dim(), g.num_value_heads, g.conv_kernel);
    Ok(GdnWeights {
        qkv: src.matrix(&format!("{p}.linear_attn.in_proj_qkv.weight"), c, h)?,
        z: src.matrix(
            &format!("{p}.linear_attn.in_proj_z.weight"),
            g.value_dim(),
            h,
        )?,
        b: src.matrix(&format!("{p}.linear_attn.in_proj_b.weight"), hv, h)?,
        a: src.matrix(&format!("{p}.linear_attn.in_proj_a.weight"), hv, h)?,
        conv: src.tensor_f32(&format!("{p}.linear_attn.conv1d.weight"), &[c, 1, k])?,
        neg_exp_a: src.gdn_neg_exp_a(&format!("{p}.linear_attn.A_log"), hv)?,
        dt_bias: src.vector(&format!("{p}.linear_attn.dt_bias"), hv)?,
        norm: src.vector(&format!("{p}.linear_attn.norm.weight"), g.value_head_dim)?,
        out: src.matrix(
            &format!("{p}.linear_attn.out_proj.weight"),
            h,
            g.value_dim(),
        )?,
    })
}
