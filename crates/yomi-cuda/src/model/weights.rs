//! The device copy of a model's weights, uploaded from the host [`Model`] once.

use anyhow::{Context, Result};
use cudarc::driver::CudaSlice;
use yomi_models::Model;
use yomi_models::model::{Layer, Mixer};
use yomi_weights::{Matrix, QuantType, Rope, WeightData};

use crate::device::CudaDevice;
use crate::ops::{DeviceMatrix, GateUpMatrix, WeightDtype};
use crate::quant::QuantFormat;

/// Projections of one input that run together: one matrix of their rows stacked when they are
/// stored alike (one GEMV launch reads them all; its output rows are side by side per row),
/// else one matrix each. Either way output row r of piece p is computed alike, so the results
/// do not depend on the fusion.
// A few per layer, built once: the variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Proj {
    Fused {
        w: DeviceMatrix,
        bias: Option<CudaSlice<f32>>,
        /// Output rows of each piece, in order.
        widths: Vec<usize>,
    },
    Split(Vec<(DeviceMatrix, Option<CudaSlice<f32>>)>),
}

impl Proj {
    fn bytes(&self) -> usize {
        match self {
            Proj::Fused { w, .. } => w.size_bytes(),
            Proj::Split(v) => v.iter().map(|(m, _)| m.size_bytes()).sum(),
        }
    }
}

/// The MLP's gate and up projections.
// One per layer, built once: the variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum GateUp {
    /// bf16, fused, rows interleaved: one launch writes silu(gate)·up
    /// ([`CudaDevice::linear_swiglu`], bit-identical to the stacked matrix and `swiglu_pair`).
    Swiglu(GateUpMatrix),
    /// Other formats, an intermediate size that is not a multiple of 8, or `CudaOptions::fuse` false:
    /// one stacked matrix then `swiglu_pair`, or two matrices then `swiglu`.
    Proj(Proj),
}

impl GateUp {
    fn bytes(&self) -> usize {
        match self {
            GateUp::Swiglu(m) => m.size_bytes(),
            GateUp::Proj(p) => p.bytes(),
        }
    }
}

pub(super) struct DevAttn {
    /// q (with the gate rows when gated), k, v.
    pub qkv: Proj,
    pub o: DeviceMatrix,
    pub o_bias: Option<CudaSlice<f32>>,
    pub q_norm: Option<CudaSlice<f32>>,
    pub k_norm: Option<CudaSlice<f32>>,
}

pub(super) struct DevGdn {
    /// qkv (conv input), z, b, a.
    pub in_proj: Proj,
    pub out: DeviceMatrix,
    /// [conv_dim, K]
    pub conv: CudaSlice<f32>,
    pub neg_exp_a: CudaSlice<f32>,
    pub dt_bias: CudaSlice<f32>,
    pub norm: CudaSlice<f32>,
}

pub(super) enum DevMixer {
    Attention(DevAttn),
    Gdn(DevGdn),
}

pub(super) struct DevLayer {
    pub input_norm: CudaSlice<f32>,
    pub post_norm: CudaSlice<f32>,
    pub mixer: DevMixer,
    pub gate_up: GateUp,
    pub down: DeviceMatrix,
}

pub(super) struct DevWeights {
    pub embed: DeviceMatrix,
    pub layers: Vec<DevLayer>,
    pub final_norm: CudaSlice<f32>,
    /// None: tied to the embedding.
    pub lm_head: Option<DeviceMatrix>,
    /// RoPE inverse frequencies [rotary_dim / 2] (llama3 / linear scaling already applied).
    pub inv_freq: CudaSlice<f32>,
}

/// Uploads one matrix in its own format: f32/bf16/f16 as they are, GGML blocks as blocks (the
/// quantized GEMV kernels read them; never dequantized whole).
fn upload_matrix(dev: &CudaDevice, m: &Matrix) -> Result<DeviceMatrix> {
    Ok(match &m.data {
        WeightData::F32(v) => DeviceMatrix::from_f32(dev, m.rows, m.cols, v)?,
        WeightData::Bf16(v) => {
            DeviceMatrix::from_half_bits(dev, m.rows, m.cols, WeightDtype::Bf16, v)?
        }
        WeightData::F16(v) => {
            DeviceMatrix::from_half_bits(dev, m.rows, m.cols, WeightDtype::F16, v)?
        }
        WeightData::Quant(q) => {
            let fmt = match q.ty {
                QuantType::Q8_0 => QuantFormat::Q8_0,
                QuantType::Q4_0 => QuantFormat::Q4_0,
                QuantType::Q4_1 => QuantFormat::Q4_1,
                QuantType::Q4_K => QuantFormat::Q4_K,
                QuantType::Q5_K => QuantFormat::Q5_K,
                QuantType::Q6_K => QuantFormat::Q6_K,
            };
            DeviceMatrix::from_ggml_blocks(dev, m.rows, m.cols, fmt, &q.bytes)?
        }
        // `attach` unpacks first; a repacked matrix reaching here is converted on the way.
        WeightData::Repacked(p) => upload_matrix(
            dev,
            &Matrix::new(m.rows, m.cols, WeightData::Quant(p.to_blocks())),
        )?,
    })
}

/// The rows of `parts` stacked, when all are stored alike with the same width.
fn stacked(parts: &[&Matrix]) -> Option<Matrix> {
    let cols = parts[0].cols;
    if parts.iter().any(|m| m.cols != cols) {
        return None;
    }
    let rows = parts.iter().map(|m| m.rows).sum();
    let data = match &parts[0].data {
        WeightData::F32(_) => WeightData::F32(
            parts
                .iter()
                .map(|m| match &m.data {
                    WeightData::F32(v) => Some(v.as_slice()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?
                .concat(),
        ),
        WeightData::Bf16(_) | WeightData::F16(_) => {
            let bf = matches!(parts[0].data, WeightData::Bf16(_));
            let v = parts
                .iter()
                .map(|m| match &m.data {
                    WeightData::Bf16(v) if bf => Some(v.as_slice()),
                    WeightData::F16(v) if !bf => Some(v.as_slice()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?
                .concat();
            if bf {
                WeightData::Bf16(v)
            } else {
                WeightData::F16(v)
            }
        }
        WeightData::Quant(q0) => {
            let bytes = parts
                .iter()
                .map(|m| match &m.data {
                    WeightData::Quant(q) if q.ty == q0.ty => Some(q.bytes.as_slice()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?
                .concat();
            return Matrix::quantized(rows, cols, q0.ty, bytes).ok();
        }
        WeightData::Repacked(_) => return None,
    };
    Some(Matrix::new(rows, cols, data))
}

/// Uploads projections of one input, stacked into one matrix when `fuse` and their storage
/// allows (`CudaOptions::fuse` false keeps them apart, for comparisons).
fn upload_proj(
    dev: &CudaDevice,
    parts: &[(&Matrix, Option<&Vec<f32>>)],
    fuse: bool,
) -> Result<Proj> {
    let mats: Vec<&Matrix> = parts.iter().map(|p| p.0).collect();
    if fuse
        && parts.len() > 1
        && let Some(m) = stacked(&mats)
    {
        let bias = if parts.iter().any(|p| p.1.is_some()) {
            let mut b = Vec::with_capacity(m.rows);
            for (w, bias) in parts {
                match bias {
                    Some(v) => b.extend_from_slice(v),
                    None => b.extend(std::iter::repeat_n(0.0, w.rows)),
                }
            }
            Some(upload_vec(dev, &b)?)
        } else {
            None
        };
        return Ok(Proj::Fused {
            w: upload_matrix(dev, &m)?,
            bias,
            widths: mats.iter().map(|m| m.rows).collect(),
        });
    }
    let mut v = Vec::with_capacity(parts.len());
    for (m, b) in parts {
        v.push((
            upload_matrix(dev, m)?,
            b.map(|b| upload_vec(dev, b)).transpose()?,
        ));
    }
    Ok(Proj::Split(v))
}

/// The MLP's gate and up: interleaved for the SwiGLU epilogue when `fuse` and both are bf16
/// [I, K] with I and K multiples of 8, else as [`upload_proj`] uploads them.
fn upload_gate_up(dev: &CudaDevice, gate: &Matrix, up: &Matrix, fuse: bool) -> Result<GateUp> {
    if fuse
        && (gate.rows, gate.cols) == (up.rows, up.cols)
        && gate.rows.is_multiple_of(8)
        && gate.cols.is_multiple_of(8)
        && let (WeightData::Bf16(g), WeightData::Bf16(u)) = (&gate.data, &up.data)
    {
        return Ok(GateUp::Swiglu(GateUpMatrix::from_bf16_bits(
            dev, gate.rows, gate.cols, g, u,
        )?));
    }
    Ok(GateUp::Proj(upload_proj(
        dev,
        &[(gate, None), (up, None)],
        fuse,
    )?))
}

fn upload_vec(dev: &CudaDevice, v: &[f32]) -> Result<CudaSlice<f32>> {
    Ok(dev.upload(v)?)
}

fn upload_opt(dev: &CudaDevice, v: &Option<Vec<f32>>) -> Result<Option<CudaSlice<f32>>> {
    v.as_deref().map(|x| upload_vec(dev, x)).transpose()
}

/// One layer's weights on the device (projections fused per `fuse`, see [`Proj`]).
pub(super) fn upload_layer(dev: &CudaDevice, l: &Layer, fuse: bool) -> Result<DevLayer> {
    let mixer = match &l.mixer {
        Mixer::Attention(w) => DevMixer::Attention(DevAttn {
            qkv: upload_proj(
                dev,
                &[
                    (&w.q, w.q_bias.as_ref()),
                    (&w.k, w.k_bias.as_ref()),
                    (&w.v, w.v_bias.as_ref()),
                ],
                fuse,
            )?,
            o: upload_matrix(dev, &w.o)?,
            o_bias: upload_opt(dev, &w.o_bias)?,
            q_norm: upload_opt(dev, &w.q_norm)?,
            k_norm: upload_opt(dev, &w.k_norm)?,
        }),
        Mixer::Gdn(w) => DevMixer::Gdn(DevGdn {
            in_proj: upload_proj(
                dev,
                &[(&w.qkv, None), (&w.z, None), (&w.b, None), (&w.a, None)],
                fuse,
            )?,
            out: upload_matrix(dev, &w.out)?,
            conv: upload_vec(dev, &w.conv)?,
            neg_exp_a: upload_vec(dev, &w.neg_exp_a)?,
            dt_bias: upload_vec(dev, &w.dt_bias)?,
            norm: upload_vec(dev, &w.norm)?,
        }),
    };
    Ok(DevLayer {
        input_norm: upload_vec(dev, &l.input_norm)?,
        post_norm: upload_vec(dev, &l.post_norm)?,
        mixer,
        gate_up: upload_gate_up(dev, &l.mlp.gate, &l.mlp.up, fuse)?,
        down: upload_matrix(dev, &l.mlp.down)?,
    })
}

/// The embedding on the device.
pub(super) fn upload_embed(dev: &CudaDevice, embed: &Matrix) -> Result<DeviceMatrix> {
    upload_matrix(dev, embed).context("uploading the embedding")
}

impl DevWeights {
    /// Uploads every weight of a host model; `progress(done, total)` per layer.
    pub fn upload(
        dev: &CudaDevice,
        model: &Model,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let total = model.layers.len() + 2;
        let fuse = dev.options().fuse;
        let embed = upload_embed(dev, &model.embed)?;
        progress(1, total);
        let mut layers = Vec::with_capacity(model.layers.len());
        for (i, l) in model.layers.iter().enumerate() {
            layers.push(upload_layer(dev, l, fuse)?);
            progress(i + 2, total);
        }
        let w = Self::from_parts(
            dev,
            embed,
            layers,
            &model.final_norm,
            model.lm_head.as_deref(),
            &model.rope,
        )?;
        progress(total, total);
        Ok(w)
    }

    /// The weights from an uploaded embedding and layers, with the final norm, the LM head
    /// (None: tied) and the rotary frequencies uploaded now.
    pub(super) fn from_parts(
        dev: &CudaDevice,
        embed: DeviceMatrix,
        layers: Vec<DevLayer>,
        final_norm: &[f32],
        lm_head: Option<&Matrix>,
        rope: &Rope,
    ) -> Result<Self> {
        let lm_head = lm_head
            .map(|m| upload_matrix(dev, m))
            .transpose()
            .context("uploading the LM head")?;
        Ok(DevWeights {
            embed,
            layers,
            final_norm: upload_vec(dev, final_norm)?,
            lm_head,
            inv_freq: upload_vec(dev, &rope.inv_freq)?,
        })
    }

    /// Device bytes of all matrices.
    pub fn matrix_bytes(&self) -> usize {
        let mut n = self.embed.size_bytes() + self.lm_head.as_ref().map_or(0, |m| m.size_bytes());
        for l in &self.layers {
            n += l.gate_up.bytes() + l.down.size_bytes();
            n += match &l.mixer {
                DevMixer::Attention(a) => a.qkv.bytes() + a.o.size_bytes(),
                DevMixer::Gdn(g) => g.in_proj.bytes() + g.out.size_bytes(),
            };
        }
        n
    }
}
