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
//! - `qwen35` (Qwen3.5 hybrid): llama.cpp's converter stores every `(1 + w)` norm with the 1
//!   added (so [`WeightSource::norm_plus_one`] returns it as stored; the GDN gated norm
//!   `ssm_norm` is plain and stored raw), stores `ssm_a` = −exp(A_log) instead of `A_log`,
//!   squeezes the conv weight to [conv_dim, K], and, when the GDN has fewer key heads (Hk) than
//!   value heads (Hv), moves the value heads from HF's grouped order (head g·r + j, r = Hv/Hk)
//!   to a tiled order (head j·Hk + g) so ggml can broadcast key heads with a plain repeat. The
//!   model follows HF's grouping (value head h reads key head h / r), so the loader moves every
//!   value-head-indexed row, channel, entry and column back (see [`GdnHeads`]).

use anyhow::{Context, Result, anyhow, bail};
use std::collections::HashMap;
use yomi_weights::{Matrix, QuantData, QuantType, RopeScaling, WeightData};

use crate::config::{Arch, GdnConfig, LayerKind, ModelConfig};
use crate::gguf::{GgufArray, GgufFile, GgufValue, TensorInfo, TensorType, q5};
use crate::source::WeightSource;

/// The GGUF architectures yomi maps onto its model code.
pub const SUPPORTED_GGUF_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "qwen35"];

pub struct GgufSource<'a> {
    file: &'a GgufFile,
    arch: Arch,
    n_heads: usize,
    n_kv_heads: usize,
    /// Qwen3.5 GDN value-head layout to undo; `None` for other architectures.
    gdn_heads: Option<GdnHeads>,
    by_name: HashMap<&'a str, &'a TensorInfo>,
}

/// The GDN sizes the value-head reorder needs.
#[derive(Clone, Copy, Debug)]
struct GdnHeads {
    key_heads: usize,
    value_heads: usize,
    /// Rows of `attn_qkv` (and channels of `ssm_conv1d`) before the value part: q and k.
    qk_rows: usize,
    value_head_dim: usize,
}

impl GdnHeads {
    fn from_config(g: &GdnConfig) -> Self {
        GdnHeads {
            key_heads: g.num_key_heads,
            value_heads: g.num_value_heads,
            qk_rows: 2 * g.key_dim(),
            value_head_dim: g.value_head_dim,
        }
    }

    /// For each value head in HF order, the GGUF head that holds it. The converter put HF head
    /// g·r + j (key group g, member j) at j·Hk + g; with Hk = Hv this is the identity.
    fn gguf_head_of(&self) -> Vec<usize> {
        let r = self.value_heads / self.key_heads.max(1);
        (0..self.value_heads)
            .map(|h| (h % r.max(1)) * self.key_heads + h / r.max(1))
            .collect()
    }

    fn is_identity(&self) -> bool {
        self.key_heads == self.value_heads
    }

    /// Source row for each HF row of a tensor whose first `skip` rows are untouched and whose
    /// remaining rows are Hv heads of `head_len` rows each.
    fn row_order(&self, skip: usize, head_len: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..skip).collect();
        for g in self.gguf_head_of() {
            order.extend((0..head_len).map(|d| skip + g * head_len + d));
        }
        order
    }
}

/// HF tensor name → GGUF tensor name.
fn gguf_name(arch: Arch, hf: &str) -> Option<String> {
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
        // Qwen3.5's converter names this norm after its role in the hybrid block.
        "post_attention_layernorm.weight" if arch == Arch::Qwen35 => "post_attention_norm.weight",
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
        "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
        "linear_attn.in_proj_z.weight" => "attn_gate.weight",
        "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
        "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
        "linear_attn.conv1d.weight" => "ssm_conv1d.weight",
        "linear_attn.dt_bias" => "ssm_dt.bias",
        "linear_attn.norm.weight" => "ssm_norm.weight",
        "linear_attn.out_proj.weight" => "ssm_out.weight",
        // An MTP block beside the trunk, under the names llama.cpp's converter gives it before
        // its tensor map (`mtp.fc` → `model.layers.{L}.eh_proj`, the norms likewise; the
        // block's decoder layer is layer L itself).
        "eh_proj.weight" => "nextn.eh_proj.weight",
        "enorm.weight" => "nextn.enorm.weight",
        "hnorm.weight" => "nextn.hnorm.weight",
        "shared_head.norm.weight" => "nextn.shared_head_norm.weight",
        // `A_log` has no counterpart: GGUF stores −exp(A_log) as `ssm_a`, read through
        // `gdn_neg_exp_a`, never as if it were A_log.
        _ => return None,
    };
    Some(format!("blk.{n}.{mapped}"))
}

/// The values of Q5_0 or Q5_1 blocks.
fn q5_values(ty: TensorType, bytes: &[u8]) -> Vec<f32> {
    let block_bytes = match ty {
        TensorType::Q5_0 => q5::Q5_0_BYTES,
        _ => q5::Q5_1_BYTES,
    };
    let mut out = vec![0.0; bytes.len() / block_bytes * q5::BLOCK];
    match ty {
        TensorType::Q5_0 => q5::dequantize_q5_0(bytes, &mut out),
        _ => q5::dequantize_q5_1(bytes, &mut out),
    }
    out
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
        let gdn_heads = match (cfg.arch, &cfg.gdn) {
            (Arch::Qwen35, Some(g)) => Some(GdnHeads::from_config(g)),
            _ => None,
        };
        GgufSource {
            file,
            arch: cfg.arch,
            n_heads: cfg.num_heads,
            n_kv_heads: cfg.num_kv_heads,
            gdn_heads,
            by_name,
        }
    }

    fn info(&self, hf: &str) -> Result<(&'a TensorInfo, String)> {
        let g = gguf_name(self.arch, hf)
            .ok_or_else(|| anyhow!("weight `{hf}` has no GGUF counterpart"))?;
        self.info_gguf(&g, hf)
    }

    fn info_gguf(&self, g: &str, hf: &str) -> Result<(&'a TensorInfo, String)> {
        let t = self
            .by_name
            .get(g)
            .ok_or_else(|| anyhow!("GGUF tensor `{g}` (for `{hf}`) is missing"))?;
        Ok((t, g.to_string()))
    }

    /// The GDN value-head layout to undo, when there is one to undo.
    fn reordered_heads(&self) -> Option<&GdnHeads> {
        self.gdn_heads.as_ref().filter(|h| !h.is_identity())
    }

    /// Row order that puts a Qwen3.5 GDN tensor's value-head-indexed rows back in HF order.
    fn gdn_row_order(&self, g: &str) -> Option<Vec<usize>> {
        let h = self.reordered_heads()?;
        let dv = h.value_head_dim;
        if g.ends_with(".attn_qkv.weight") || g.ends_with(".ssm_conv1d.weight") {
            // [q | k | v]: only the v rows (channels) were moved.
            Some(h.row_order(h.qk_rows, dv))
        } else if g.ends_with(".attn_gate.weight") {
            Some(h.row_order(0, dv))
        } else if g.ends_with(".ssm_beta.weight")
            || g.ends_with(".ssm_alpha.weight")
            || g.ends_with(".ssm_dt.bias")
            || g.ends_with(".ssm_a")
        {
            Some(h.row_order(0, 1))
        } else {
            None
        }
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
            TensorType::Q5_0 | TensorType::Q5_1 => q5_values(t.ty, b),
            other => {
                let cols = *t.shape.last().unwrap_or(&0);
                let rows = t.n_elements() / cols.max(1);
                let q = quant_type(other)
                    .ok_or_else(|| anyhow!("GGUF tensor `{g}` has unsupported type {other:?}"))?;
                let m = Matrix::quantized(rows, cols, q, b.to_vec())
                    .map_err(|e| anyhow!("GGUF tensor `{g}`: {e}"))?;
                dequantize(&m)
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

/// Puts the columns of Qwen3.5's `ssm_out` (its input is the Hv value heads) back in HF
/// head order. Float and block formats whose blocks tile a head move whole head slices
/// of each row (bit-exact, no requantization); a block format whose blocks straddle heads
/// (K-quants, 256 values, with heads of 128) cannot be cut per head, so that one matrix is
/// dequantized to f32: the same values, more memory.
fn undo_gdn_cols(m: Matrix, h: &GdnHeads, g: &str) -> Result<Matrix> {
    let (rows, cols) = (m.rows, m.cols);
    let dv = h.value_head_dim;
    if cols != h.value_heads * dv {
        bail!(
            "GGUF tensor `{g}` has {cols} columns, expected Hv·dv = {}",
            h.value_heads * dv
        );
    }
    let heads = h.gguf_head_of();
    // Within each row (of `row_len` units), HF head i ← GGUF head heads[i], `unit` units each.
    fn permute<T: Copy>(data: &[T], unit: usize, heads: &[usize]) -> Vec<T> {
        let row_len = unit * heads.len();
        let mut out = Vec::with_capacity(data.len());
        for row in data.chunks_exact(row_len) {
            for &src in heads {
                out.extend_from_slice(&row[src * unit..(src + 1) * unit]);
            }
        }
        out
    }
    let data = match m.data {
        WeightData::F32(v) => WeightData::F32(permute(&v, dv, &heads)),
        WeightData::F16(v) => WeightData::F16(permute(&v, dv, &heads)),
        WeightData::Bf16(v) => WeightData::Bf16(permute(&v, dv, &heads)),
        WeightData::Quant(q) => match q.ty.row_bytes(dv) {
            Some(head_bytes) => {
                return Matrix::quantized(rows, cols, q.ty, permute(&q.bytes, head_bytes, &heads))
                    .map_err(|e| anyhow!("GGUF tensor `{g}`: {e}"));
            }
            None => {
                let whole = Matrix {
                    rows,
                    cols,
                    data: WeightData::Quant(q),
                    rotation: None,
                };
                WeightData::F32(permute(&dequantize(&whole), dv, &heads))
            }
        },
        // Sources hand out GGML blocks; a backend repacks them after loading.
        WeightData::Repacked(_) => {
            return Err(anyhow!(
                "GGUF tensor `{g}`: already in a backend's repacked layout (internal error)"
            ));
        }
    };
    Ok(Matrix::new(rows, cols, data))
}

/// Every value of a matrix as f32, row after row.
fn dequantize(m: &Matrix) -> Vec<f32> {
    let cols = m.cols;
    let mut out = vec![0.0; m.rows * cols];
    let mut buf = vec![0.0; cols];
    for r in 0..m.rows {
        out[r * cols..(r + 1) * cols].copy_from_slice(m.row_f32(r, &mut buf));
    }
    out
}

impl WeightSource for GgufSource<'_> {
    fn drop_read_pages(&self) {
        self.file.drop_resident_pages();
    }

    fn has(&self, name: &str) -> bool {
        gguf_name(self.arch, name).is_some_and(|g| self.by_name.contains_key(g.as_str()))
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let (t, g) = self.info(name)?;
        self.check_shape(t, &g, &[rows, cols])?;
        let bytes = self.file.tensor_bytes(t);
        let order = match self.arch {
            Arch::Llama if g.ends_with("attn_q.weight") => {
                Some(unpermute_order(rows, self.n_heads))
            }
            Arch::Llama if g.ends_with("attn_k.weight") => {
                Some(unpermute_order(rows, self.n_kv_heads))
            }
            Arch::Qwen35 => self.gdn_row_order(&g),
            _ => None,
        };
        if let Some(o) = &order
            && o.len() != rows
        {
            bail!(
                "GGUF tensor `{g}` has {rows} rows, but its head layout implies {}",
                o.len()
            );
        }
        // Rows are independent in every format (blocks never cross rows), so moving whole
        // rows is exact for quantized tensors too.
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
        let m = match t.ty {
            TensorType::F32 => Matrix::new(
                rows,
                cols,
                WeightData::F32(
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                ),
            ),
            TensorType::F16 => Matrix::new(rows, cols, WeightData::F16(u16s(&bytes))),
            TensorType::BF16 => Matrix::new(rows, cols, WeightData::Bf16(u16s(&bytes))),
            // See `gguf::q5`: Q8_0 holds Q5_0's values exactly, Q5_1's within half a Q8_0 step.
            TensorType::Q5_0 => {
                Matrix::quantized(rows, cols, QuantType::Q8_0, q5::q5_0_to_q8_0(&bytes))
                    .map_err(|e| anyhow!("GGUF tensor `{g}`: {e}"))?
            }
            TensorType::Q5_1 => {
                let values = q5_values(t.ty, &bytes);
                let q8 = QuantData::quantize(QuantType::Q8_0, rows, cols, &values);
                Matrix::new(rows, cols, WeightData::Quant(q8))
            }
            other => {
                let q = quant_type(other)
                    .ok_or_else(|| anyhow!("GGUF tensor `{g}` has unsupported type {other:?}"))?;
                Matrix::quantized(rows, cols, q, bytes)
                    .map_err(|e| anyhow!("GGUF tensor `{g}`: {e}"))?
            }
        };
        match self.reordered_heads() {
            Some(h) if g.ends_with(".ssm_out.weight") => undo_gdn_cols(m, h, &g),
            _ => Ok(m),
        }
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
        if self.arch == Arch::Qwen35
            && let Some(o) = self.gdn_row_order(&g)
        {
            return Ok(reorder_rows(&v, 1, &o));
        }
        Ok(v)
    }

    fn tensor_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (t, g) = self.info(name)?;
        let n = shape.iter().product::<usize>();
        if t.n_elements() != n {
            bail!(
                "GGUF tensor `{g}` has shape {:?}, expected {:?}",
                t.shape,
                shape
            );
        }
        let v = self.f32_values(t, &g)?;
        if self.arch == Arch::Qwen35
            && let Some(o) = self.gdn_row_order(&g)
        {
            // ssm_conv1d: [conv_dim, K] (the converter squeezed HF's [conv_dim, 1, K]).
            let k = *t.shape.last().unwrap_or(&1);
            if t.shape.len() != 2 || t.shape[0] != o.len() {
                bail!(
                    "GGUF tensor `{g}` has shape {:?}, expected [{}, K]",
                    t.shape,
                    o.len()
                );
            }
            return Ok(reorder_rows(&v, k, &o));
        }
        Ok(v)
    }

    fn norm_plus_one(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        // GGUF stores zero-centred norms with the 1 already added.
        self.vector(name, len)
    }

    fn gdn_neg_exp_a(&self, a_log: &str, len: usize) -> Result<Vec<f32>> {
        // GGUF has no A_log: the converter stored −exp(A_log) as `blk.N.ssm_a`.
        let layer = a_log
            .strip_prefix("model.layers.")
            .and_then(|r| r.strip_suffix(".linear_attn.A_log"))
            .ok_or_else(|| anyhow!("weight `{a_log}` has no GGUF counterpart"))?;
        let (t, g) = self.info_gguf(&format!("blk.{layer}.ssm_a"), a_log)?;
        self.check_shape(t, &g, &[len])?;
        let v = self.f32_values(t, &g)?;
        match self.gdn_row_order(&g) {
            Some(o) => Ok(reorder_rows(&v, 1, &o)),
            None => Ok(v),
        }
    }
}

/// Model configuration from GGUF metadata (`{arch}.*` keys).
pub fn config_from_gguf(f: &GgufFile) -> Result<ModelConfig> {
    let arch_name = f.architecture().map_err(|e| anyhow!("{e}"))?;
    let arch = match arch_name {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        "qwen35" => Arch::Qwen35,
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
    // Absent → None; present but not a non-negative integer (e.g. a per-layer array) → error,
    // rather than silently falling back to a default.
    let opt_u = |k: &str| -> Result<Option<usize>> {
        match f.get(&key(k)) {
            None => Ok(None),
            Some(_) => u(k).map(Some),
        }
    };
    let hidden = u("embedding_length")?;
    let n_heads = u("attention.head_count")?;
    let n_kv = opt_u("attention.head_count_kv")?.unwrap_or(n_heads);
    let block_count = u("block_count")?;
    // Qwen3.5 GGUFs count their MTP block(s) in block_count; the text model is the rest.
    let n_mtp = opt_u("nextn_predict_layers")?.unwrap_or(0);
    let n_layers = block_count.checked_sub(n_mtp).ok_or_else(|| {
        anyhow!("GGUF metadata: {arch_name}.nextn_predict_layers ({n_mtp}) exceeds block_count ({block_count})")
    })?;
    let head_dim = opt_u("attention.key_length")?.unwrap_or(hidden / n_heads.max(1));
    let rotary_dim = opt_u("rope.dimension_count")?.unwrap_or(head_dim);
    let vocab = match opt_u("vocab_size")? {
        Some(v) => v,
        None => f
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .map_err(|e| anyhow!("GGUF metadata: {e}"))?,
    };
    let rope_theta = f
        .get_f32(&key("rope.freq_base"))
        .map(|v| v as f64)
        .unwrap_or(if arch == Arch::Qwen35 { 1e7 } else { 10000.0 });
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
        .or(opt_u("feed_forward_length")?)
        .context("GGUF metadata has no feed_forward_length")?;
    let eos = f
        .get_u64("tokenizer.ggml.eos_token_id")
        .map(|v| vec![v as u32])
        .unwrap_or_default();
    let (layer_kinds, gdn) = if arch == Arch::Qwen35 {
        qwen35_layers(f, arch_name, n_layers)?
    } else {
        (vec![LayerKind::Attention; n_layers], None)
    };
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
        qk_norm: arch.traits().qk_norm,
        // Qwen3.5's attention q rows are [query | gate] per head, as in HF (the converter
        // leaves attn_q as it is).
        attn_output_gate: arch.traits().attn_output_gate,
        norm_plus_one: arch.traits().norm_plus_one,
        layer_kinds,
        gdn,
        tie_word_embeddings: !by_name.contains_key("output.weight"),
        max_position_embeddings: opt_u("context_length")?.unwrap_or(4096),
        eos_token_ids: eos,
        mtp_layers: n_mtp,
    };
    cfg.validate()?;
    check_special_tokens(f, vocab)?;
    Ok(cfg)
}

/// The special tokens yomi uses (`tokenizer.ggml.{bos,eos,eot}_token_id`) must name a token of
/// the vocabulary: the model's and, when the file lists its tokens, the tokenizer's. Ids yomi
/// never reads (padding, unknown, sep, …) are left alone: converters write placeholders such as
/// −1 there, and llama.cpp loads such files.
fn check_special_tokens(f: &GgufFile, vocab: usize) -> Result<()> {
    const USED: [&str; 3] = [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
    ];
    let n = match f.get_array("tokenizer.ggml.tokens") {
        Ok(a) => vocab.min(a.len()),
        Err(_) => vocab,
    };
    for (key, v) in f.metadata() {
        if !USED.contains(&key.as_str()) {
            continue;
        }
        let Some(id) = v.as_i128() else {
            bail!(
                "GGUF metadata: `{key}` must be an integer, found {}",
                v.type_name()
            );
        };
        if id < 0 || id >= n as i128 {
            bail!("GGUF metadata: `{key}` = {id} is outside the vocabulary of {n} tokens");
        }
    }
    Ok(())
}

/// Qwen3.5's layer kinds and Gated DeltaNet sizes from `qwen35.*` metadata. The M-RoPE
/// sections (`rope.dimension_sections`) are not read: for text all three position streams are
/// the token position, where M-RoPE equals plain RoPE.
fn qwen35_layers(
    f: &GgufFile,
    arch_name: &str,
    n_layers: usize,
) -> Result<(Vec<LayerKind>, Option<GdnConfig>)> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let u = |k: &str| -> Result<usize> {
        f.get_u64(&key(k))
            .map(|v| v as usize)
            .map_err(|e| anyhow!("GGUF metadata: {e}"))
    };
    let recurrent = key("attention.recurrent_layers");
    let kinds: Vec<LayerKind> = match f.get(&recurrent) {
        // Written by the converter when the HF config lists `layer_types`.
        Some(GgufValue::Array(GgufArray::Bool(list))) => {
            if list.len() < n_layers {
                bail!(
                    "GGUF metadata: `{recurrent}` has {} entries, fewer than the {n_layers} layers",
                    list.len()
                );
            }
            list[..n_layers]
                .iter()
                .map(|&r| {
                    if r {
                        LayerKind::GatedDeltaNet
                    } else {
                        LayerKind::Attention
                    }
                })
                .collect()
        }
        Some(v) => bail!(
            "GGUF metadata: `{recurrent}` must be an array of bools, found {}",
            v.type_name()
        ),
        None => {
            let every = match f.get(&key("full_attention_interval")) {
                Some(_) => u("full_attention_interval")?,
                None => 4,
            };
            if every == 0 {
                bail!("GGUF metadata: `{arch_name}.full_attention_interval` is 0");
            }
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
    let num_key_heads = u("ssm.group_count")?;
    let num_value_heads = u("ssm.time_step_rank")?;
    let inner = u("ssm.inner_size")?;
    if num_value_heads == 0 || !inner.is_multiple_of(num_value_heads) {
        bail!(
            "GGUF metadata: `{arch_name}.ssm.inner_size` ({inner}) is not a multiple of \
             `{arch_name}.ssm.time_step_rank` ({num_value_heads})"
        );
    }
    let gdn = GdnConfig {
        num_key_heads,
        num_value_heads,
        key_head_dim: u("ssm.state_size")?,
        value_head_dim: inner / num_value_heads,
        conv_kernel: u("ssm.conv_kernel")?,
    };
    Ok((kinds, Some(gdn)))
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
            gguf_name(Arch::Llama, "model.layers.12.mlp.down_proj.weight").as_deref(),
            Some("blk.12.ffn_down.weight")
        );
        assert_eq!(
            gguf_name(Arch::Llama, "lm_head.weight").as_deref(),
            Some("output.weight")
        );
        assert_eq!(
            gguf_name(Arch::Qwen35, "model.layers.0.linear_attn.A_log"),
            None
        );
        assert_eq!(
            gguf_name(
                Arch::Qwen35,
                "model.layers.2.post_attention_layernorm.weight"
            )
            .as_deref(),
            Some("blk.2.post_attention_norm.weight")
        );
        // An MTP block after 8 trunk layers, as llama.cpp's converter names it (seen in a
        // file it wrote from models/yomi-code-hybrid: `blk.8.nextn.eh_proj.weight`, …).
        for (hf, gg) in [
            (
                "model.layers.8.eh_proj.weight",
                "blk.8.nextn.eh_proj.weight",
            ),
            ("model.layers.8.enorm.weight", "blk.8.nextn.enorm.weight"),
            ("model.layers.8.hnorm.weight", "blk.8.nextn.hnorm.weight"),
            (
                "model.layers.8.shared_head.norm.weight",
                "blk.8.nextn.shared_head_norm.weight",
            ),
            (
                "model.layers.8.self_attn.q_proj.weight",
                "blk.8.attn_q.weight",
            ),
        ] {
            assert_eq!(gguf_name(Arch::Qwen35, hf).as_deref(), Some(gg), "{hf}");
        }
    }

    /// The converter's forward transform, written from its description (qwen35.md §4.2):
    /// view the Hv heads as [Hk, r] (grouped by key head), swap to [r, Hk], flatten.
    fn grouped_to_tiled<T: Copy>(hf: &[T], hk: usize, hv: usize, head_len: usize) -> Vec<T> {
        let r = hv / hk;
        let mut out = Vec::with_capacity(hf.len());
        for j in 0..r {
            for g in 0..hk {
                let h = g * r + j;
                out.extend_from_slice(&hf[h * head_len..(h + 1) * head_len]);
            }
        }
        out
    }

    fn heads(hk: usize, hv: usize, dv: usize, qk_rows: usize) -> GdnHeads {
        GdnHeads {
            key_heads: hk,
            value_heads: hv,
            qk_rows,
            value_head_dim: dv,
        }
    }

    #[test]
    fn value_head_order_inverts_the_converter() {
        for (hk, hv) in [(2, 4), (2, 6), (16, 48), (3, 3)] {
            let h = heads(hk, hv, 5, 7);
            // Rows of attn_qkv / channels of ssm_conv1d: 7 untouched q/k rows, then v.
            let hf: Vec<usize> = (0..7 + hv * 5).collect();
            let mut gguf = hf[..7].to_vec();
            gguf.extend(grouped_to_tiled(&hf[7..], hk, hv, 5));
            assert_eq!(reorder_rows(&gguf, 1, &h.row_order(7, 5)), hf, "{hk}/{hv}");
            // Per-head scalars (ssm_a, ssm_dt, rows of ssm_alpha / ssm_beta).
            let hf: Vec<usize> = (0..hv).collect();
            let gguf = grouped_to_tiled(&hf, hk, hv, 1);
            assert_eq!(reorder_rows(&gguf, 1, &h.row_order(0, 1)), hf);
        }
    }

    /// ssm_out's columns: float data, Q8_0 (blocks of 32 tile heads of 32 → blocks move, bytes
    /// stay) and Q4_K (256-blocks straddle heads of 128 → f32 fallback) all land in HF order.
    #[test]
    fn ssm_out_columns_are_restored_in_every_format() {
        use yomi_weights::QuantData;
        let (hk, hv, rows) = (2, 4, 3);
        for (dv, ty) in [
            (32, None),
            (32, Some(QuantType::Q8_0)),
            (128, Some(QuantType::Q4_K)),
        ] {
            let h = heads(hk, hv, dv, 0);
            let cols = hv * dv;
            let hf: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919) % 211) as f32 / 50.0 - 2.0)
                .collect();
            let gguf: Vec<f32> = hf
                .chunks(cols)
                .flat_map(|row| grouped_to_tiled(row, hk, hv, dv))
                .collect();
            let (m, want) = match ty {
                None => (Matrix::new(rows, cols, WeightData::F32(gguf)), hf.clone()),
                Some(q) => {
                    let qg = QuantData::quantize(q, rows, cols, &gguf);
                    let m = Matrix::quantized(rows, cols, q, qg.bytes).unwrap();
                    // What the quantized values are, back in HF order.
                    let deq = dequantize(&m);
                    let want = deq
                        .chunks(cols)
                        .flat_map(|row| {
                            let mut out = vec![0.0; cols];
                            let tiled: Vec<usize> =
                                grouped_to_tiled(&(0..hv).collect::<Vec<_>>(), hk, hv, 1);
                            for (pos, &hf_head) in tiled.iter().enumerate() {
                                out[hf_head * dv..(hf_head + 1) * dv]
                                    .copy_from_slice(&row[pos * dv..(pos + 1) * dv]);
                            }
                            out
                        })
                        .collect();
                    (m, want)
                }
            };
            let out = undo_gdn_cols(m, &h, "blk.0.ssm_out.weight").unwrap();
            match (ty, &out.data) {
                (Some(QuantType::Q8_0), WeightData::Quant(_)) | (None, WeightData::F32(_)) => {}
                (Some(QuantType::Q4_K), WeightData::F32(_)) => {}
                (t, d) => panic!("{t:?}: unexpected result format {}", d.size_bytes()),
            }
            assert_eq!(dequantize(&out), want, "{ty:?}");
        }
        let bad = Matrix::new(1, 3, WeightData::F32(vec![0.0; 3]));
        let e = undo_gdn_cols(bad, &heads(2, 4, 32, 0), "blk.0.ssm_out.weight").unwrap_err();
        assert!(e.to_string().contains("blk.0.ssm_out.weight"), "{e}");
    }

    /// An edit of a file's metadata list.
    type Edit<'a> = &'a dyn Fn(&mut Vec<(String, GgufValue)>);

    /// The committed f32 qwen35 GGUF with some metadata replaced or removed.
    fn qwen35_with(edit: Edit) -> GgufFile {
        use crate::gguf::tests::{Spec, build};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/qwen35-tiny-gguf/qwen35-tiny-f32.gguf");
        let f = GgufFile::open(&path).unwrap();
        let mut kvs: Vec<(String, GgufValue)> = f
            .metadata()
            .iter()
            .filter(|(k, _)| !k.starts_with("GGUF."))
            .cloned()
            .collect();
        edit(&mut kvs);
        let kv_refs: Vec<(&str, GgufValue)> =
            kvs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let tensors: Vec<Spec> = f
            .tensors()
            .iter()
            .map(|t| Spec {
                name: t.name.clone(),
                ne: t.ne().iter().map(|&d| d as u64).collect(),
                type_id: t.ty.id(),
                data: f.tensor_bytes(t).to_vec(),
                offset: None,
            })
            .collect();
        GgufFile::from_bytes(build(3, &kv_refs, &tensors, f.alignment())).unwrap()
    }

    #[test]
    fn qwen35_metadata_is_read_and_bad_metadata_is_named() {
        let ok = config_from_gguf(&qwen35_with(&|_| {})).unwrap();
        assert_eq!(ok.arch, Arch::Qwen35);
        assert_eq!(ok.rotary_dim, 16);
        let err = |edit: Edit| format!("{:#}", config_from_gguf(&qwen35_with(edit)).unwrap_err());
        let set = |key: &'static str, v: GgufValue| {
            move |kvs: &mut Vec<(String, GgufValue)>| {
                for kv in kvs.iter_mut() {
                    if kv.0 == key {
                        kv.1 = v.clone();
                    }
                }
            }
        };
        let e = err(&|kvs| kvs.retain(|(k, _)| k != "qwen35.ssm.group_count"));
        assert!(e.contains("qwen35.ssm.group_count"), "{e}");
        let e = err(&set("qwen35.ssm.inner_size", GgufValue::U32(130)));
        assert!(e.contains("qwen35.ssm.inner_size"), "{e}");
        let e = err(&set("qwen35.ssm.group_count", GgufValue::U32(3)));
        assert!(e.contains("ssm.group_count"), "{e}");
        let e = err(&set(
            "qwen35.attention.head_count_kv",
            GgufValue::Array(GgufArray::U32(vec![2; 4])),
        ));
        assert!(e.contains("qwen35.attention.head_count_kv"), "{e}");
        let e = err(&set(
            "qwen35.attention.recurrent_layers",
            GgufValue::Array(GgufArray::Bool(vec![true; 2])),
        ));
        assert!(e.contains("recurrent_layers"), "{e}");
        let e = err(&|kvs| {
            kvs.push(("qwen35.nextn_predict_layers".into(), GgufValue::U32(9)));
        });
        assert!(e.contains("nextn_predict_layers"), "{e}");
        // Without recurrent_layers, full_attention_interval decides (every 4th is attention).
        let c = config_from_gguf(&qwen35_with(&|kvs| {
            kvs.retain(|(k, _)| k != "qwen35.attention.recurrent_layers")
        }))
        .unwrap();
        assert_eq!(c.layer_kinds, ok.layer_kinds);
    }

    /// Numbers that would load and then panic or give NaNs, and token ids outside the
    /// vocabulary, are refused at load with the key named.
    #[test]
    fn bad_rope_norm_and_token_metadata_are_refused() {
        let err = |key: &'static str, v: GgufValue| {
            let f = qwen35_with(&move |kvs| {
                kvs.retain(|(k, _)| k != key);
                kvs.push((key.to_string(), v.clone()));
            });
            format!("{:#}", config_from_gguf(&f).unwrap_err())
        };
        for (key, v, needle) in [
            (
                "qwen35.rope.dimension_count",
                GgufValue::U32(0),
                "rope.dimension_count",
            ),
            (
                "qwen35.rope.dimension_count",
                GgufValue::U32(15),
                "rope.dimension_count",
            ),
            (
                "qwen35.rope.dimension_count",
                GgufValue::U32(4096),
                "rope.dimension_count",
            ),
            (
                "qwen35.rope.freq_base",
                GgufValue::F32(f32::NAN),
                "rope.freq_base",
            ),
            (
                "qwen35.rope.freq_base",
                GgufValue::F32(-1.0),
                "rope.freq_base",
            ),
            (
                "qwen35.rope.freq_base",
                GgufValue::F32(f32::INFINITY),
                "rope.freq_base",
            ),
            (
                "qwen35.attention.layer_norm_rms_epsilon",
                GgufValue::F32(-1e-6),
                "layer_norm_rms_epsilon",
            ),
            (
                "qwen35.attention.layer_norm_rms_epsilon",
                GgufValue::F32(f32::NAN),
                "layer_norm_rms_epsilon",
            ),
            (
                "qwen35.attention.head_count",
                GgufValue::U32(0),
                "attention.head_count",
            ),
            (
                "qwen35.attention.head_count_kv",
                GgufValue::U32(3),
                "head_count_kv",
            ),
            (
                "tokenizer.ggml.eos_token_id",
                GgufValue::U32(512),
                "eos_token_id",
            ),
            (
                "tokenizer.ggml.bos_token_id",
                GgufValue::U32(100_000),
                "tokenizer.ggml.bos_token_id",
            ),
            (
                "tokenizer.ggml.eot_token_id",
                GgufValue::String("2".into()),
                "tokenizer.ggml.eot_token_id",
            ),
        ] {
            let e = err(key, v.clone());
            assert!(e.contains(needle), "{key} = {v:?}: {e}");
        }
        // The largest valid id loads, and so does a placeholder in an id yomi never reads.
        let f = qwen35_with(&|kvs| {
            kvs.push(("tokenizer.ggml.bos_token_id".into(), GgufValue::U32(511)));
            kvs.retain(|(k, _)| k != "tokenizer.ggml.padding_token_id");
            kvs.push(("tokenizer.ggml.padding_token_id".into(), GgufValue::I32(-1)));
        });
        assert!(config_from_gguf(&f).is_ok());
    }
}
