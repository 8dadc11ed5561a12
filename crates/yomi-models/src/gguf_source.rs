//! GGUF files as a [`WeightSource`] and a [`ModelConfig`]: llama.cpp names and metadata mapped
//! onto the Hugging Face names the model code asks for.
//!
//! - Names: `token_embd` → `model.embed_tokens`, `blk.N.attn_q` → `model.layers.N.self_attn.q_proj`,
//!   `ffn_norm` → `post_attention_layernorm`, `output` → `lm_head` (absent = tied), ….
//! - Llama's Q and K rows are stored permuted by llama.cpp's converter (its RoPE pairs
//!   interleaved dims; HF and yomi rotate halves). Within each head of hd rows, GGUF row 2i + j
//!   holds HF row j·hd/2 + i; the loader moves whole rows back, which works on quantized rows
//!   too since blocks never cross rows.
//! - Matrices keep their GGUF block format (the quantized kernels read them directly); vectors
//!   become f32.

use anyhow::{Context, Result, anyhow, bail};
use std::collections::HashMap;
use yomi_cpu::quant::QuantType;
use yomi_cpu::rope::RopeScaling;
use yomi_cpu::{Matrix, WeightData};

use crate::config::{Arch, LayerKind, ModelConfig};
use crate::gguf::{GgufFile, TensorInfo, TensorType};
use crate::source::WeightSource;

/// The GGUF architectures yomi maps onto its model code.
pub const SUPPORTED_GGUF_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3"];

pub struct GgufSource<'a> {
    file: &'a GgufFile,
    arch: Arch,
    n_heads: usize,
    n_kv_heads: usize,
    by_name: HashMap<&'a str, &'a TensorInfo>,
}

/// HF tensor name → GGUF tensor name.
fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (n, tail) = rest.split_once('.')?;
    let mapped = match tail {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.bias" => "attn_output.bias",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        _ => return None,
    };
    Some(format!("blk.{n}.{mapped}"))
}

fn quant_type(t: TensorType) -> Option<QuantType> {
    Some(match t {
        TensorType::Q4_0 => QuantType::Q4_0,
        TensorType::Q4_1 => QuantType::Q4_1,
        TensorType::Q8_0 => QuantType::Q8_0,
        TensorType::Q4_K => QuantType::Q4_K,
        TensorType::Q5_K => QuantType::Q5_K,
        TensorType::Q6_K => QuantType::Q6_K,
        _ => return None,
    })
}

/// Row order that undoes llama.cpp's Q/K permutation: HF row (h, j, i) ← GGUF row (h, i, j).
fn unpermute_order(rows: usize, n_heads: usize) -> Vec<usize> {
    let hd = rows / n_heads;
    let half = hd / 2;
    let mut order = Vec::with_capacity(rows);
    for h in 0..n_heads {
        for j in 0..2 {
            for i in 0..half {
                order.push(h * hd + 2 * i + j);
            }
        }
    }
    order
}

fn reorder_rows<T: Copy>(data: &[T], row_len: usize, order: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(data.len());
    for &r in order {
        out.extend_from_slice(&data[r * row_len..(r + 1) * row_len]);
    }
    out
}

impl<'a> GgufSource<'a> {
    pub fn new(file: &'a GgufFile, cfg: &ModelConfig) -> Self {
        let by_name = file
            .tensors()
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        GgufSource {
            file,
            arch: cfg.arch,
            n_heads: cfg.num_heads,
            n_kv_heads: cfg.num_kv_heads,
            by_name,
        }
    }

    fn info(&self, hf: &str) -> Result<(&'a TensorInfo, String)> {
        let g = gguf_name(hf).ok_or_else(|| anyhow!("weight `{hf}` has no GGUF counterpart"))?;
        let t = self
            .by_name
            .get(g.as_str())
            .ok_or_else(|| anyhow!("GGUF tensor `{g}` (for `{hf}`) is missing"))?;
        Ok((t, g))
    }

    fn f32_values(&self, t: &TensorInfo, g: &str) -> Result<Vec<f32>> {
        let b = self.file.tensor_bytes(t);
        Ok(match t.ty {
            TensorType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            TensorType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            TensorType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                let cols = *t.shape.last().unwrap_or(&0);
                let rows = t.n_elements() / cols.max(1);
                let q = quant_type(other)
                    .ok_or_else(|| anyhow!("GGUF tensor `{g}` has unsupported type {other:?}"))?;
                let m = Matrix::quantized(rows, cols, q, b.to_vec())
                    .map_err(|e| anyhow!("GGUF tensor `{g}`: {e}"))?;
                let mut out = vec![0.0; rows * cols];
                for r in 0..rows {
                    let src = m.row_f32(r, &mut out[r * cols..(r + 1) * cols]).to_vec();
                    out[r * cols..(r + 1) * cols].copy_from_slice(&src);
                }
                out
            }
        })
    }

    fn check_shape(&self, t: &TensorInfo, g: &str, want: &[usize]) -> Result<()> {
        if t.shape != want {
            bail!(
                "GGUF tensor `{g}` has shape {:?}, expected {:?}",
                t.shape,
                want
            );
        }
        Ok(())
    }
}

impl WeightSource for GgufSource<'_> {
    fn has(&self, name: &str) -> bool {
        gguf_name(name).is_some_and(|g| self.by_name.contains_key(g.as_str()))
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let (t, g) = self.info(name)?;
        self.check_shape(t, &g, &[rows, cols])?;
        let bytes = self.file.tensor_bytes(t);
        let permute_heads = if self.arch == Arch::Llama {
            if g.ends_with("attn_q.weight") {
                Some(self.n_heads)
            } else if g.ends_with("attn_k.weight") {
                Some(self.n_kv_heads)
            } else {
                None
            }
        } else {
            None
        };
        let order = permute_heads.map(|h| unpermute_order(rows, h));
        let row_bytes = bytes.len() / rows.max(1);
        let bytes: Vec<u8> = match &order {
            Some(o) => reorder_rows(bytes, row_bytes, o),
            None => bytes.to_vec(),
        };
        let u16s = |b: &[u8]| {
            b.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect::<Vec<u16>>()
        };
        let data = match t.ty {
            TensorType::F32 => WeightData::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            TensorType::F16 => WeightData::F16(u16s(&bytes)),
            TensorType::BF16 => WeightData::Bf16(u16s(&bytes)),
            other => {
                let q = quant_type(other)
                    .ok_or_else(|| anyhow!("GGUF tensor `{g}` has unsupported type {other:?}"))?;
                return Matrix::quantized(rows, cols, q, bytes)
                    .map_err(|e| anyhow!("GGUF tensor `{g}`: {e}"));
            }
        };
        Ok(Matrix::new(rows, cols, data))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let (t, g) = self.info(name)?;
        self.check_shape(t, &g, &[len])?;
        let v = self.f32_values(t, &g)?;
        // Llama's q/k biases would need the same un-permutation as their rows.
        if self.arch == Arch::Llama && (g.ends_with("attn_q.bias") || g.ends_with("attn_k.bias")) {
            let heads = if g.ends_with("attn_q.bias") {
                self.n_heads
            } else {
                self.n_kv_heads
            };
            return Ok(reorder_rows(&v, 1, &unpermute_order(len, heads)));
        }
        Ok(v)
    }

    fn tensor_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (t, g) = self.info(name)?;
        if t.n_elements() != shape.iter().product::<usize>() {
            bail!(
                "GGUF tensor `{g}` has shape {:?}, expected {:?}",
                t.shape,
                shape
            );
        }
        self.f32_values(t, &g)
    }

    fn norm_plus_one(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        // GGUF stores zero-centred norms with the 1 already added.
        self.vector(name, len)
    }
}

/// Model configuration from GGUF metadata (`{arch}.*` keys).
pub fn config_from_gguf(f: &GgufFile) -> Result<ModelConfig> {
    let arch_name = f.architecture().map_err(|e| anyhow!("{e}"))?;
    let arch = match arch_name {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        other => bail!(
            "unsupported GGUF architecture `{other}`; supported: {}",
            SUPPORTED_GGUF_ARCHITECTURES.join(", ")
        ),
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let u = |k: &str| -> Result<usize> {
        f.get_u64(&key(k))
            .map(|v| v as usize)
            .map_err(|e| anyhow!("GGUF metadata: {e}"))
    };
    let opt_u = |k: &str| f.get(&key(k)).and_then(|v| v.as_i128()).map(|v| v as usize);
    let hidden = u("embedding_length")?;
    let n_heads = u("attention.head_count")?;
    let n_kv = opt_u("attention.head_count_kv").unwrap_or(n_heads);
    let n_layers = u("block_count")?;
    let head_dim = opt_u("attention.key_length").unwrap_or(hidden / n_heads.max(1));
    let rotary_dim = opt_u("rope.dimension_count").unwrap_or(head_dim);
    let vocab = match opt_u("vocab_size") {
        Some(v) => v,
        None => f
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .map_err(|e| anyhow!("GGUF metadata: {e}"))?,
    };
    let rope_theta = f
        .get_f32(&key("rope.freq_base"))
        .map(|v| v as f64)
        .unwrap_or(10000.0);
    let scaling = match f.get_str(&key("rope.scaling.type")) {
        Ok("linear") => {
            RopeScaling::Linear(f.get_f32(&key("rope.scaling.factor")).unwrap_or(1.0) as f64)
        }
        Ok("none") | Err(_) => RopeScaling::None,
        Ok(other) => bail!("unsupported GGUF RoPE scaling `{other}` (supported: none, linear)"),
    };
    let by_name: HashMap<&str, &TensorInfo> =
        f.tensors().iter().map(|t| (t.name.as_str(), t)).collect();
    let ffn = by_name
        .get("blk.0.ffn_gate.weight")
        .map(|t| t.shape[0])
        .or_else(|| opt_u("feed_forward_length"))
        .context("GGUF metadata has no feed_forward_length")?;
    let eos = f
        .get_u64("tokenizer.ggml.eos_token_id")
        .map(|v| vec![v as u32])
        .unwrap_or_default();
    let cfg = ModelConfig {
        arch,
        hidden_size: hidden,
        intermediate_size: ffn,
        num_layers: n_layers,
        vocab_size: vocab,
        rms_norm_eps: f
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-6),
        num_heads: n_heads,
        num_kv_heads: n_kv,
        head_dim,
        rope_theta,
        rotary_dim,
        rope_scaling: scaling,
        qkv_bias: by_name.contains_key("blk.0.attn_q.bias"),
        o_bias: by_name.contains_key("blk.0.attn_output.bias"),
        qk_norm: arch == Arch::Qwen3,
        attn_output_gate: false,
        norm_plus_one: false,
        layer_kinds: vec![LayerKind::Attention; n_layers],
        gdn: None,
        tie_word_embeddings: !by_name.contains_key("output.weight"),
        max_position_embeddings: opt_u("context_length").unwrap_or(4096),
        eos_token_ids: eos,
    };
    cfg.validate()?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_the_converter_permutation() {
        // llama.cpp: w.reshape(h, 2, hd/2, …).swapaxes(1, 2) — GGUF row (h, i, j) = HF row (h, j, i).
        let (heads, hd) = (3, 8);
        let hf: Vec<usize> = (0..heads * hd).collect();
        let mut gguf = vec![0; heads * hd];
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..hd / 2 {
                    gguf[h * hd + 2 * i + j] = hf[h * hd + j * hd / 2 + i];
                }
            }
        }
        assert_eq!(
            reorder_rows(&gguf, 1, &unpermute_order(heads * hd, heads)),
            hf
        );
    }

    #[test]
    fn names_map_to_llama_cpp() {
        assert_eq!(
            gguf_name("model.layers.12.mlp.down_proj.weight").as_deref(),
            Some("blk.12.ffn_down.weight")
        );
        assert_eq!(
            gguf_name("lm_head.weight").as_deref(),
            Some("output.weight")
        );
        assert_eq!(gguf_name("model.layers.0.linear_attn.A_log"), None);
    }
}
