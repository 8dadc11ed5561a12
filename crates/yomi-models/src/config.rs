//! Model configuration from a Hugging Face `config.json` (and, via the GGUF loader, from GGUF
//! metadata): one [`ModelConfig`] for every supported architecture.

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use std::path::Path;
use yomi_weights::rope::{Llama3Scaling, RopeScaling};

/// The architectures yomi runs, as Hugging Face names them.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Qwen3.5 / Qwen3.6 hybrid: Gated DeltaNet + gated full attention.
    Qwen35,
    Llama,
    Qwen2,
    Qwen3,
}

/// What an architecture fixes about its layers, whatever file it comes from: both loaders (HF
/// config.json and GGUF metadata) take these from here, so they cannot disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchTraits {
    /// RMSNorm over each query and key head before RoPE.
    pub qk_norm: bool,
    /// Attention's q projection carries a per-head output gate ([query | gate] rows).
    pub attn_output_gate: bool,
    /// RMSNorm weights are zero-centred: the effective weight is 1 + w.
    pub norm_plus_one: bool,
}

impl Arch {
    pub const fn traits(self) -> ArchTraits {
        match self {
            Arch::Qwen35 => ArchTraits {
                qk_norm: true,
                attn_output_gate: true,
                norm_plus_one: true,
            },
            Arch::Qwen3 => ArchTraits {
                qk_norm: true,
                attn_output_gate: false,
                norm_plus_one: false,
            },
            Arch::Llama | Arch::Qwen2 => ArchTraits {
                qk_norm: false,
                attn_output_gate: false,
                norm_plus_one: false,
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Attention,
    GatedDeltaNet,
}

/// Gated DeltaNet sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnConfig {
    pub num_key_heads: usize,
    pub num_value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub conv_kernel: usize,
}

impl GdnConfig {
    pub fn key_dim(&self) -> usize {
        self.num_key_heads * self.key_head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.num_value_heads * self.value_head_dim
    }
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    /// Rotary width per head (head_dim × partial_rotary_factor).
    pub rotary_dim: usize,
    pub rope_scaling: RopeScaling,
    /// q/k/v projections carry biases (Qwen2; Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// o projection carries a bias (Llama with `attention_bias`).
    pub o_bias: bool,
    /// Per-head RMSNorm on q and k (Qwen3, Qwen3.5).
    pub qk_norm: bool,
    /// Qwen3.5: q_proj yields [query | gate] per head and the output is gated by sigmoid(gate).
    pub attn_output_gate: bool,
    /// Qwen3.5's zero-centred norms: the effective weight is 1 + w.
    pub norm_plus_one: bool,
    pub layer_kinds: Vec<LayerKind>,
    pub gdn: Option<GdnConfig>,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// eos ids named in the config itself (generation_config.json may add more).
    pub eos_token_ids: Vec<u32>,
    /// Multi-token-prediction blocks beside the trunk (Qwen3.5's `mtp_num_hidden_layers`,
    /// GGUF `nextn_predict_layers`; 0 when the model has none): what `--draft mtp` reads.
    pub mtp_layers: usize,
}

fn get_usize(v: &Value, key: &str) -> Result<Option<usize>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| anyhow!("config field `{key}` must be a non-negative integer, got {x}")),
    }
}

fn need_usize(v: &Value, key: &str) -> Result<usize> {
    get_usize(v, key)?.ok_or_else(|| anyhow!("config.json is missing `{key}`"))
}

fn get_f64(v: &Value, key: &str) -> Result<Option<f64>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| anyhow!("config field `{key}` must be a number, got {x}")),
    }
}

fn get_bool(v: &Value, key: &str) -> Result<Option<bool>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_bool()
            .map(Some)
            .ok_or_else(|| anyhow!("config field `{key}` must be true or false, got {x}")),
    }
}

/// `eos_token_id` may be an integer or a list of integers.
pub fn parse_eos(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// RoPE θ and scaling, read like HF does: `rope_parameters` (transformers ≥ 5) or the older
/// top-level `rope_theta` + `rope_scaling`.
fn parse_rope(text: &Value, default_theta: f64) -> Result<(f64, RopeScaling, Option<f64>)> {
    let params = text.get("rope_parameters").filter(|p| p.is_object());
    let scaling = text.get("rope_scaling").filter(|p| p.is_object());
    let theta = params
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
        .or(get_f64(text, "rope_theta")?)
        .unwrap_or(default_theta);
    let partial = params
        .and_then(|p| p.get("partial_rotary_factor"))
        .and_then(Value::as_f64);
    let spec = scaling.or(params);
    let kind = spec
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let s = match kind {
        "default" => RopeScaling::None,
        "linear" => {
            let f = spec
                .and_then(|p| p.get("factor"))
                .and_then(Value::as_f64)
                .unwrap_or(1.0);
            RopeScaling::Linear(f)
        }
        "llama3" => {
            let p = spec.ok_or_else(|| anyhow!("llama3 rope scaling without parameters"))?;
            let f = |k: &str| -> Result<f64> {
                p.get(k)
                    .and_then(Value::as_f64)
                    .ok_or_else(|| anyhow!("llama3 rope scaling is missing `{k}`"))
            };
            RopeScaling::Llama3(Llama3Scaling {
                factor: f("factor")?,
                low_freq_factor: f("low_freq_factor")?,
                high_freq_factor: f("high_freq_factor")?,
                original_max_position_embeddings: f("original_max_position_embeddings")?,
            })
        }
        other => {
            bail!("unsupported RoPE scaling type `{other}` (supported: default, linear, llama3)")
        }
    };
    Ok((theta, s, partial))
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        Self::from_hf_json(&v).with_context(|| format!("in {}", path.display()))
    }

    pub fn from_hf_json(v: &Value) -> Result<Self> {
        if let Some(q) = v.get("quantization_config") {
            let method = q
                .get("quant_method")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            if method != crate::quantize::QUANT_METHOD {
                bail!(
                    "the weights are quantized with `{method}`, which yomi does not read; use \
                     the unquantized checkpoint (or `yomi quantize` it), or a GGUF file"
                );
            }
        }
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch_name = archs.first().copied().unwrap_or(match model_type {
            "qwen3_5" => "Qwen3_5ForConditionalGeneration",
            "qwen3_5_text" => "Qwen3_5ForCausalLM",
            "llama" => "LlamaForCausalLM",
            "qwen2" => "Qwen2ForCausalLM",
            "qwen3" => "Qwen3ForCausalLM",
            _ => "",
        });
        let (arch, text) = match arch_name {
            "Qwen3_5ForCausalLM" => (Arch::Qwen35, v),
            "Qwen3_5ForConditionalGeneration" => (
                Arch::Qwen35,
                v.get("text_config")
                    .filter(|t| t.is_object())
                    .ok_or_else(|| {
                        anyhow!("Qwen3_5ForConditionalGeneration config has no `text_config`")
                    })?,
            ),
            "LlamaForCausalLM" => (Arch::Llama, v),
            "Qwen2ForCausalLM" => (Arch::Qwen2, v),
            "Qwen3ForCausalLM" => (Arch::Qwen3, v),
            "" => bail!(
                "config.json names no architecture; supported: {}",
                SUPPORTED_ARCHITECTURES.join(", ")
            ),
            other => bail!(
                "unsupported architecture `{other}`; supported: {}",
                SUPPORTED_ARCHITECTURES.join(", ")
            ),
        };
        let hidden = need_usize(text, "hidden_size")?;
        let n_heads = need_usize(text, "num_attention_heads")?;
        let n_kv = get_usize(text, "num_key_value_heads")?.unwrap_or(n_heads);
        let n_layers = need_usize(text, "num_hidden_layers")?;
        let default_theta = if arch == Arch::Qwen35 { 1e7 } else { 10000.0 };
        let (rope_theta, rope_scaling, partial_in_params) = parse_rope(text, default_theta)?;
        let head_dim = match get_usize(text, "head_dim")? {
            Some(h) => h,
            None if arch == Arch::Qwen35 => 256,
            None => hidden / n_heads.max(1),
        };
        let partial = partial_in_params
            .or(get_f64(text, "partial_rotary_factor")?)
            .unwrap_or(if arch == Arch::Qwen35 { 0.25 } else { 1.0 });
        let rotary_dim = (head_dim as f64 * partial) as usize;
        let attention_bias = get_bool(text, "attention_bias")?.unwrap_or(false);
        if get_bool(text, "mlp_bias")?.unwrap_or(false) {
            bail!("`mlp_bias: true` is not supported");
        }
        if let Some(act) = text.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            bail!("unsupported hidden_act `{act}` (only silu)");
        }
        let (layer_kinds, gdn) = if arch == Arch::Qwen35 {
            let kinds = match text.get("layer_types").and_then(Value::as_array) {
                Some(list) => list
                    .iter()
                    .map(|k| match k.as_str() {
                        Some("full_attention") => Ok(LayerKind::Attention),
                        Some("linear_attention") => Ok(LayerKind::GatedDeltaNet),
                        other => Err(anyhow!("unknown layer type {other:?} in `layer_types`")),
                    })
                    .collect::<Result<Vec<_>>>()?,
                None => {
                    let every = get_usize(text, "full_attention_interval")?
                        .unwrap_or(4)
                        .max(1);
                    (0..n_layers)
                        .map(|i| {
                            if (i + 1) % every == 0 {
                                LayerKind::Attention
                            } else {
                                LayerKind::GatedDeltaNet
                            }
                        })
                        .collect()
                }
            };
            if kinds.len() != n_layers {
                bail!(
                    "`layer_types` has {} entries but num_hidden_layers is {n_layers}",
                    kinds.len()
                );
            }
            let gdn = GdnConfig {
                num_key_heads: get_usize(text, "linear_num_key_heads")?.unwrap_or(16),
                num_value_heads: get_usize(text, "linear_num_value_heads")?.unwrap_or(32),
                key_head_dim: get_usize(text, "linear_key_head_dim")?.unwrap_or(128),
                value_head_dim: get_usize(text, "linear_value_head_dim")?.unwrap_or(128),
                conv_kernel: get_usize(text, "linear_conv_kernel_dim")?.unwrap_or(4),
            };
            (kinds, Some(gdn))
        } else {
            (vec![LayerKind::Attention; n_layers], None)
        };
        let mut eos = parse_eos(text.get("eos_token_id"));
        if eos.is_empty() {
            eos = parse_eos(v.get("eos_token_id"));
        }
        let cfg = ModelConfig {
            arch,
            hidden_size: hidden,
            intermediate_size: need_usize(text, "intermediate_size")?,
            num_layers: n_layers,
            vocab_size: need_usize(text, "vocab_size")?,
            rms_norm_eps: get_f64(text, "rms_norm_eps")?.unwrap_or(1e-6) as f32,
            num_heads: n_heads,
            num_kv_heads: n_kv,
            head_dim,
            rope_theta,
            rotary_dim,
            rope_scaling,
            qkv_bias: arch == Arch::Qwen2 || attention_bias,
            o_bias: arch == Arch::Llama && attention_bias,
            qk_norm: arch.traits().qk_norm,
            attn_output_gate: arch.traits().attn_output_gate,
            norm_plus_one: arch.traits().norm_plus_one,
            layer_kinds,
            gdn,
            tie_word_embeddings: get_bool(text, "tie_word_embeddings")?
                .or(get_bool(v, "tie_word_embeddings")?)
                .unwrap_or(false),
            max_position_embeddings: get_usize(text, "max_position_embeddings")?.unwrap_or(4096),
            eos_token_ids: eos,
            mtp_layers: get_usize(text, "mtp_num_hidden_layers")?.unwrap_or(0),
        };
        cfg.validate()?;
        // Ids not in the vocabulary would never match (pad) or be looked up out of range.
        for key in ["bos_token_id", "pad_token_id"] {
            let id = text
                .get(key)
                .filter(|x| !x.is_null())
                .or_else(|| v.get(key))
                .and_then(Value::as_u64);
            if let Some(id) = id
                && id >= cfg.vocab_size as u64
            {
                bail!(
                    "`{key}` {id} is outside the vocabulary of {} tokens",
                    cfg.vocab_size
                );
            }
        }
        Ok(cfg)
    }

    /// A Hugging Face `config.json` that [`from_hf_json`](Self::from_hf_json) reads back as
    /// this config (a GGUF file's config, for `yomi quantize` of a GGUF file): the
    /// transformers-v4 field names, which v5 reads too.
    pub fn to_hf_json(&self) -> Value {
        let (archs, model_type) = match self.arch {
            Arch::Qwen35 => ("Qwen3_5ForCausalLM", "qwen3_5_text"),
            Arch::Llama => ("LlamaForCausalLM", "llama"),
            Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
            Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        };
        let mut v = serde_json::json!({
            "architectures": [archs],
            "model_type": model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps as f64,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "partial_rotary_factor": self.rotary_dim as f64 / self.head_dim as f64,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
        });
        // Qwen2 always has q/k/v biases; elsewhere `attention_bias` gives them (and Llama's
        // output bias).
        if self.arch != Arch::Qwen2 {
            v["attention_bias"] = Value::Bool(self.qkv_bias);
        }
        match &self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear(f) => {
                v["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": f});
            }
            RopeScaling::Llama3(l) => {
                v["rope_scaling"] = serde_json::json!({
                    "rope_type": "llama3",
                    "factor": l.factor,
                    "low_freq_factor": l.low_freq_factor,
                    "high_freq_factor": l.high_freq_factor,
                    "original_max_position_embeddings": l.original_max_position_embeddings,
                });
            }
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => v["eos_token_id"] = serde_json::json!(one),
            many => v["eos_token_id"] = serde_json::json!(many),
        }
        if let Some(g) = &self.gdn {
            let kinds: Vec<&str> = self
                .layer_kinds
                .iter()
                .map(|k| match k {
                    LayerKind::Attention => "full_attention",
                    LayerKind::GatedDeltaNet => "linear_attention",
                })
                .collect();
            v["layer_types"] = serde_json::json!(kinds);
            v["linear_num_key_heads"] = serde_json::json!(g.num_key_heads);
            v["linear_num_value_heads"] = serde_json::json!(g.num_value_heads);
            v["linear_key_head_dim"] = serde_json::json!(g.key_head_dim);
            v["linear_value_head_dim"] = serde_json::json!(g.value_head_dim);
            v["linear_conv_kernel_dim"] = serde_json::json!(g.conv_kernel);
            v["mtp_num_hidden_layers"] = serde_json::json!(self.mtp_layers);
        }
        v
    }

    /// Structural checks shared by every source of a config.
    pub fn validate(&self) -> Result<()> {
        let nz = |x: usize, n: &str| {
            if x == 0 {
                Err(anyhow!("`{n}` must be > 0"))
            } else {
                Ok(())
            }
        };
        // Config.json and GGUF names of each field, for the messages.
        nz(self.hidden_size, "hidden_size / embedding_length")?;
        nz(self.num_layers, "num_hidden_layers / block_count")?;
        nz(self.vocab_size, "vocab_size")?;
        nz(self.num_heads, "num_attention_heads / attention.head_count")?;
        nz(
            self.num_kv_heads,
            "num_key_value_heads / attention.head_count_kv",
        )?;
        nz(self.head_dim, "head_dim / attention.key_length")?;
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            bail!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({}) \
                 (attention.head_count / attention.head_count_kv)",
                self.num_heads,
                self.num_kv_heads
            );
        }
        if let Some(gdn) = &self.gdn {
            // Shared by config.json and GGUF metadata (ssm.group_count / ssm.time_step_rank /
            // ssm.conv_kernel), hence both names.
            if gdn.num_key_heads == 0
                || gdn.num_value_heads == 0
                || !gdn.num_value_heads.is_multiple_of(gdn.num_key_heads)
            {
                bail!(
                    "GDN value heads ({}; linear_num_value_heads / ssm.time_step_rank) must be a \
                     positive multiple of the key heads ({}; linear_num_key_heads / ssm.group_count)",
                    gdn.num_value_heads,
                    gdn.num_key_heads
                );
            }
            if !(2..=8).contains(&gdn.conv_kernel) {
                bail!(
                    "GDN conv kernel {} (linear_conv_kernel_dim / ssm.conv_kernel) is outside 2..=8",
                    gdn.conv_kernel
                );
            }
            if gdn.key_head_dim == 0 || gdn.value_head_dim == 0 {
                bail!("GDN key and value head dims must be > 0");
            }
        }
        if self.layer_kinds.len() != self.num_layers {
            bail!(
                "{} layer kinds for {} layers",
                self.layer_kinds.len(),
                self.num_layers
            );
        }
        if self.layer_kinds.contains(&LayerKind::GatedDeltaNet) && self.gdn.is_none() {
            bail!("Gated DeltaNet layers need GDN sizes");
        }
        if self.rotary_dim == 0
            || !self.rotary_dim.is_multiple_of(2)
            || self.rotary_dim > self.head_dim
        {
            bail!(
                "rotary dim {} (head_dim × partial_rotary_factor / rope.dimension_count) must be \
                 even, > 0 and ≤ head_dim {}",
                self.rotary_dim,
                self.head_dim
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            bail!(
                "RoPE theta (rope_theta / rope.freq_base) must be a finite number > 0, got {}",
                self.rope_theta
            );
        }
        let factor = match &self.rope_scaling {
            RopeScaling::None => None,
            RopeScaling::Linear(f) => Some(*f),
            RopeScaling::Llama3(s) => Some(s.factor),
        };
        if let Some(f) = factor
            && !(f.is_finite() && f > 0.0)
        {
            bail!("the RoPE scaling factor must be a finite number > 0, got {f}");
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            bail!(
                "RMSNorm epsilon (rms_norm_eps / attention.layer_norm_rms_epsilon) must be a \
                 finite number > 0, got {}",
                self.rms_norm_eps
            );
        }
        if let Some(&id) = self
            .eos_token_ids
            .iter()
            .find(|&&id| id as usize >= self.vocab_size)
        {
            bail!(
                "eos_token_id {id} is outside the vocabulary of {} tokens",
                self.vocab_size
            );
        }
        Ok(())
    }

    /// Number of bytes of KV cache per token (f32).
    pub fn kv_bytes_per_token(&self) -> usize {
        let attn = self
            .layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::Attention)
            .count();
        attn * 2 * self.num_kv_heads * self.head_dim * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qwen35_multimodal_reads_text_config_and_rope_parameters() {
        let v = json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "eos_token_id": 248046,
            "text_config": {
                "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 8,
                "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 248320,
                "linear_num_key_heads": 16, "linear_num_value_heads": 32, "eos_token_id": 248044,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                    "mrope_section": [11, 11, 10], "mrope_interleaved": true}
            }
        });
        let c = ModelConfig::from_hf_json(&v).unwrap();
        assert_eq!(c.arch, Arch::Qwen35);
        assert_eq!(c.head_dim, 256);
        assert_eq!(c.rotary_dim, 64);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.eos_token_ids, vec![248044]);
        assert_eq!(c.layer_kinds[3], LayerKind::Attention);
        assert_eq!(c.layer_kinds[2], LayerKind::GatedDeltaNet);
        assert_eq!(c.gdn.unwrap().conv_dim(), 2 * 2048 + 4096);
    }

    #[test]
    fn llama3_rope_scaling_and_unsupported_arch() {
        let v = json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 10,
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        });
        let c = ModelConfig::from_hf_json(&v).unwrap();
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3(_)));
        assert_eq!(c.head_dim, 16);
        let bad = json!({"architectures": ["MistralForCausalLM"]});
        let e = ModelConfig::from_hf_json(&bad).unwrap_err().to_string();
        assert!(
            e.contains("MistralForCausalLM") && e.contains("LlamaForCausalLM"),
            "{e}"
        );
        let yarn = json!({
            "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0}
        });
        assert!(
            ModelConfig::from_hf_json(&yarn)
                .unwrap_err()
                .to_string()
                .contains("yarn")
        );
    }

    /// Values that would load and then fail (a panic, NaNs) are refused with the field named.
    #[test]
    fn bad_values_are_named() {
        let base = json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 10, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0
        });
        assert!(ModelConfig::from_hf_json(&base).is_ok());
        for (key, value, needle) in [
            ("rms_norm_eps", json!(-1), "rms_norm_eps"),
            ("rms_norm_eps", json!(0), "rms_norm_eps"),
            ("rms_norm_eps", json!(1e300), "rms_norm_eps"),
            ("rope_theta", json!(0), "rope_theta"),
            ("rope_theta", json!(-10000.0), "rope_theta"),
            ("partial_rotary_factor", json!(0), "partial_rotary_factor"),
            ("partial_rotary_factor", json!(2), "partial_rotary_factor"),
            ("head_dim", json!(15), "partial_rotary_factor"),
            ("num_attention_heads", json!(0), "num_attention_heads"),
            ("num_key_value_heads", json!(0), "num_key_value_heads"),
            ("num_key_value_heads", json!(3), "num_key_value_heads"),
            ("eos_token_id", json!(10), "eos_token_id"),
            ("eos_token_id", json!([2, 11]), "eos_token_id"),
            ("bos_token_id", json!(10), "bos_token_id"),
            ("pad_token_id", json!(99), "pad_token_id"),
        ] {
            let mut v = base.clone();
            v[key] = value.clone();
            let e = format!("{:#}", ModelConfig::from_hf_json(&v).unwrap_err());
            assert!(e.contains(needle), "{key} = {value}: {e}");
        }
        let mut v = base.clone();
        v["rope_scaling"] = json!({"rope_type": "linear", "factor": 0});
        let e = format!("{:#}", ModelConfig::from_hf_json(&v).unwrap_err());
        assert!(e.contains("scaling factor"), "{e}");
        // A config that loads can still be broken by hand; validate catches it too.
        let mut c = ModelConfig::from_hf_json(&base).unwrap();
        c.rope_theta = f64::NAN;
        assert!(c.validate().unwrap_err().to_string().contains("rope_theta"));
    }
}
